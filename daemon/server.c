/* Server lifecycle: startup (registry, config datasets, listeners, signals), the sweep timer, graceful shutdown. */
#include "daemon/server.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "daemon/conn.h"
#include "daemon/backend.h"
#include "daemon/groups.h"
#include "daemon/plans.h"
#include "daemon/http.h"
#include "daemon/listen.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/readahead.h"

#define PD_SWEEP_MS 500
#define PD_AUTO_LOOPS_MAX 4 /* loops: 0 picks min(CPUs, this): the worker pool wants the other cores */

static void pd_server_init_handles(pd_server *s);
static int pd_shard_start(pd_server *p, pd_server *s, unsigned index);

uint64_t pd_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void pd_on_signal(uv_signal_t *h, int signum)
{
    pd_server *s = h->data;
    pd_log_info("signal", "name=%s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    pd_server_stop(s);
}

/* Connections that sent an error and wait for the peer's EOF are closed when their time is up. */
static void pd_on_sweep(uv_timer_t *t)
{
    pd_server *s = t->data;
    uint64_t now = pd_now_ms();
    pd_conn *c = s->conns;
    while (c) {
        pd_conn *next = c->next;
        pd_conn_sweep(c, now);
        c = next;
    }
}

static void pd_on_budget(uv_check_t *h)
{
    pd_server *s = h->data;
    s->inline_left = s->cfg->inline_ids;
}

int pd_server_take_inline(pd_server *s, uint64_t count)
{
    if (count > s->inline_left)
        return 0;
    s->inline_left -= count;
    return 1;
}

static void pd_on_stop_timeout(uv_timer_t *t)
{
    pd_server *s = t->data;
    pd_log_warn("shutdown_timeout", "connections=%llu jobs=%u", (unsigned long long)s->stats.connections, s->jobs);
    while (s->conns)
        pd_conn_close(s->conns);
    pd_server_maybe_finish(s);
}

int pd_server_init(pd_server *s, uv_loop_t *loop, const pd_config *cfg, unsigned workers)
{
    char path[4096], err[512] = "";
    int rc;
    memset(s, 0, sizeof *s);
    s->loop = loop;
    s->primary = s;
    s->nshards = 1;
    s->cfg = cfg;
    s->workers = workers;
    s->started_ms = pd_now_ms();

    pd_backend_opts bo = {.cpu_isa = cfg->cpu_isa, .cpu_threads = (unsigned)cfg->cpu_threads, .gpu = cfg->gpu,
                          .gpu_device = (unsigned)cfg->gpu_device, .gpu_min_ids = cfg->gpu_min_ids,
                          .gpu_library = cfg->gpu_library};
    if ((rc = pd_backend_open(&bo, &s->backend))) {
        pd_log_error("startup", "msg=\"cannot start the generation backend: %s\" cpu_isa=%s", pd_strerror(rc),
                     cfg->cpu_isa);
        return rc;
    }
    if ((rc = pd_plans_open((unsigned)cfg->plan_cache, &s->plans)) || (rc = pd_groups_open(s, &s->groups))) {
        pd_log_error("startup", "msg=\"out of memory\"");
        return rc;
    }
    if ((rc = pd_config_state_dir(cfg, path, sizeof path))) {
        pd_log_error("startup", "msg=\"cannot choose a state directory; set state_dir\"");
        return rc;
    }
    if ((rc = pd_registry_open(path, &s->reg, err, sizeof err))) {
        pd_log_error("startup", "msg=\"%s\"", err);
        return rc;
    }
    pd_log_info("registry", "path=%s/registry.db datasets=%zu", path, pd_registry_count(s->reg));
    for (size_t i = 0; i < cfg->ndatasets; i++) {
        if ((rc = pd_registry_declare(s->reg, cfg->datasets[i].name, cfg->datasets[i].size))) {
            pd_log_error("startup",
                         "dataset=%s msg=\"the config declares size %llu but the registry stores another\"",
                         cfg->datasets[i].name, (unsigned long long)cfg->datasets[i].size);
            return rc;
        }
    }
    if (cfg->token_file[0] && (rc = pd_listen_load_token(s, cfg->token_file)))
        return rc;

    uv_signal_init(loop, &s->sigterm);
    uv_signal_init(loop, &s->sigint);
    s->sigterm.data = s->sigint.data = s;
    uv_signal_start(&s->sigterm, pd_on_signal, SIGTERM);
    uv_signal_start(&s->sigint, pd_on_signal, SIGINT);
    pd_server_init_handles(s);
    s->handles_on = 1;

    if ((rc = pd_config_socket_path(cfg, path, sizeof path))) {
        pd_log_error("startup", "msg=\"socket path too long\"");
        return rc;
    }
    if ((rc = pd_listen_unix(s, path, (unsigned)cfg->socket_mode, cfg->socket[0] == '\0')))
        return rc;
    if (cfg->tcp[0] && (rc = pd_listen_tcp(s, cfg->tcp)))
        return rc;
    if (cfg->metrics[0] && (rc = pd_http_listen(s, cfg->metrics, pd_config_metrics_is_default(cfg))))
        return rc;
    unsigned loops = cfg->loops ? (unsigned)cfg->loops : uv_available_parallelism();
    if (!cfg->loops && loops > PD_AUTO_LOOPS_MAX)
        loops = PD_AUTO_LOOPS_MAX;
    if (loops > 1) {
        if (!(s->shards = calloc(loops, sizeof *s->shards))) {
            pd_log_error("startup", "msg=\"out of memory\"");
            return PD_ENOMEM;
        }
        s->shards[0] = s;
        while (s->nshards < loops) {
            pd_server *x = calloc(1, sizeof *x);
            if (!x || pd_shard_start(s, x, s->nshards)) {
                free(x);
                pd_log_error("startup", "msg=\"cannot start event loop %u\"", s->nshards);
                return PD_EINTERNAL;
            }
            s->shards[s->nshards++] = x;
        }
    }
    pd_log_info("ready", "version=%s loops=%u workers=%u %s max_connections=%llu output_cap=%llu", PERMD_VERSION,
                s->nshards, workers, pd_backend_describe(s->backend), (unsigned long long)cfg->max_connections,
                (unsigned long long)cfg->output_cap);
    char status[512];
    snprintf(status, sizeof status, "serving %zu datasets on %.400s", pd_registry_count(s->reg), s->socket_path);
    pd_notify_ready(loop, status);
    return 0;
}

int pd_server_run(pd_server *s)
{
    return uv_run(s->loop, UV_RUN_DEFAULT);
}

/* ---- Shards --------------------------------------------------------------------------- */

/* Close the handles a shard opened; the loop then ends (a secondary's thread returns). */
static void pd_server_close_handles(pd_server *s)
{
    if (!s->handles_on)
        return;
    s->handles_on = 0;
    if (s->primary == s) {
        uv_close((uv_handle_t *)&s->sigterm, NULL);
        uv_close((uv_handle_t *)&s->sigint, NULL);
    } else {
        pthread_mutex_lock(&s->inbox_lock);
        s->inbox_closed = 1;
        pthread_mutex_unlock(&s->inbox_lock);
        uv_close((uv_handle_t *)&s->inbox_async, NULL);
    }
    uv_close((uv_handle_t *)&s->stop_timer, NULL);
    uv_close((uv_handle_t *)&s->budget, NULL);
    pd_readahead_close(s);
}

/* Refuse a connection handed over but not adopted: close it and stop counting it. */
static void pd_handoff_drop(pd_server *s, int fd)
{
    close(fd);
    atomic_fetch_sub(&s->primary->conns_open, 1);
}

/* On a secondary shard's loop: adopt the connections handed over; stop when asked. */
static void pd_on_inbox(uv_async_t *a)
{
    pd_server *s = a->data;
    pthread_mutex_lock(&s->inbox_lock);
    pd_handoff *items = s->inbox;
    size_t n = s->inbox_len;
    int stop = s->stop_asked;
    s->inbox = NULL;
    s->inbox_len = s->inbox_cap = 0;
    pthread_mutex_unlock(&s->inbox_lock);
    for (size_t i = 0; i < n; i++) {
        if (s->stopping || stop)
            pd_handoff_drop(s, items[i].fd);
        else
            pd_conn_adopt(s, items[i].fd, items[i].is_tcp);
    }
    free(items);
    if (stop)
        pd_server_stop(s);
}

static void pd_server_post(pd_server *to, const pd_handoff *h, int stop)
{
    pthread_mutex_lock(&to->inbox_lock);
    if (to->inbox_closed) { /* stopped already: a connection handed over now is refused */
        pthread_mutex_unlock(&to->inbox_lock);
        if (h)
            pd_handoff_drop(to, h->fd);
        return;
    }
    if (h) {
        if (to->inbox_len == to->inbox_cap) {
            size_t cap = to->inbox_cap ? 2 * to->inbox_cap : 16;
            pd_handoff *p = realloc(to->inbox, cap * sizeof *p);
            if (!p) {
                pthread_mutex_unlock(&to->inbox_lock);
                pd_log_error("accept", "err=ENOMEM");
                pd_handoff_drop(to, h->fd);
                return;
            }
            to->inbox = p;
            to->inbox_cap = cap;
        }
        to->inbox[to->inbox_len++] = *h;
    }
    if (stop)
        to->stop_asked = 1;
    uv_async_send(&to->inbox_async); /* under the lock: the handle cannot be closing yet */
    pthread_mutex_unlock(&to->inbox_lock);
}

static void pd_on_handoff_closed(uv_handle_t *h)
{
    free(h);
}

void pd_server_dispatch(pd_server *s, uv_stream_t *listener, int is_tcp)
{
    pd_server *to = s->nshards > 1 ? s->shards[s->next_shard++ % s->nshards] : s;
    if (to == s) {
        pd_conn_accept(s, listener, is_tcp);
        return;
    }
    /* Accept here, then give the socket to the other loop: libuv handles belong to one loop, so
     * the descriptor travels (duplicated, as closing this handle closes the original). */
    uv_stream_t *tmp = malloc(is_tcp ? sizeof(uv_tcp_t) : sizeof(uv_pipe_t));
    uv_os_fd_t fd;
    int dup_fd = -1;
    if (!tmp) {
        pd_log_error("accept", "err=ENOMEM");
        return;
    }
    if (is_tcp)
        uv_tcp_init(s->loop, (uv_tcp_t *)tmp);
    else
        uv_pipe_init(s->loop, (uv_pipe_t *)tmp, 0);
    int rc = uv_accept(listener, tmp);
    if (rc == 0 && uv_fileno((uv_handle_t *)tmp, &fd) == 0)
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    uv_close((uv_handle_t *)tmp, pd_on_handoff_closed);
    if (dup_fd < 0) {
        pd_log_warn("accept", "err=%s", rc ? uv_err_name(rc) : "EMFILE");
        return;
    }
    atomic_fetch_add(&s->conns_open, 1); /* counted from now, so a flood cannot outrun max_connections */
    pd_handoff h = {dup_fd, is_tcp};
    pd_server_post(to, &h, 0);
}

static void *pd_shard_main(void *arg)
{
    pd_server *s = arg;
    uv_run(s->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* The handles every shard has: the inline budget, readahead, the sweep (later: shutdown) timer. */
static void pd_server_init_handles(pd_server *s)
{
    uv_timer_init(s->loop, &s->stop_timer);
    uv_check_init(s->loop, &s->budget);
    s->stop_timer.data = s->budget.data = s;
    s->inline_left = s->cfg->inline_ids;
    uv_check_start(&s->budget, pd_on_budget);
    uv_unref((uv_handle_t *)&s->budget); /* never what keeps the loop alive */
    pd_readahead_init(s);
    uv_timer_start(&s->stop_timer, pd_on_sweep, PD_SWEEP_MS, PD_SWEEP_MS);
}

/* A secondary shard sharing p's state, with a loop and thread of its own. */
static int pd_shard_start(pd_server *p, pd_server *s, unsigned index)
{
    s->loop = &s->shard_loop;
    if (uv_loop_init(s->loop))
        return PD_EINTERNAL;
    s->cfg = p->cfg;
    s->reg = p->reg;
    s->plans = p->plans;
    s->groups = p->groups;
    s->backend = p->backend;
    s->token = p->token;
    s->token_len = p->token_len;
    s->started_ms = p->started_ms;
    s->workers = p->workers;
    s->primary = p;
    s->index = index;
    pthread_mutex_init(&s->inbox_lock, NULL);
    uv_async_init(s->loop, &s->inbox_async, pd_on_inbox);
    s->inbox_async.data = s;
    pd_server_init_handles(s);
    s->handles_on = 1;
    if (pthread_create(&s->thread, NULL, pd_shard_main, s)) {
        pd_server_close_handles(s);
        uv_run(s->loop, UV_RUN_DEFAULT);
        uv_loop_close(s->loop);
        pthread_mutex_destroy(&s->inbox_lock);
        return PD_EINTERNAL;
    }
    s->thread_on = 1;
    return 0;
}

/* Ask every secondary shard to stop, wait for their threads, release them. */
static void pd_shards_end(pd_server *p)
{
    for (unsigned i = 1; i < p->nshards; i++) {
        pd_server *s = p->shards[i];
        if (s->thread_on) {
            pd_server_post(s, NULL, 1);
            pthread_join(s->thread, NULL);
            if (uv_loop_close(s->loop))
                pd_log_warn("loop_close", "shard=%u msg=\"handles still open\"", i);
            pthread_mutex_destroy(&s->inbox_lock);
            for (size_t k = 0; k < s->inbox_len; k++)
                close(s->inbox[k].fd);
            free(s->inbox);
        }
        free(s);
    }
    free(p->shards);
    p->shards = NULL;
    p->nshards = 1;
}

void pd_server_totals(pd_server *s, pd_stats *stats, pd_metrics *metrics, unsigned *jobs)
{
    pd_server *p = s->primary ? s->primary : s;
    unsigned n = p->nshards > 1 ? p->nshards : 1;
    memset(stats, 0, sizeof *stats);
    if (metrics)
        memset(metrics, 0, sizeof *metrics);
    *jobs = 0;
    for (unsigned i = 0; i < n; i++) {
        pd_server *x = n > 1 ? p->shards[i] : p;
        stats->connections_total += x->stats.connections_total;
        stats->requests_total += x->stats.requests_total;
        stats->errors_total += x->stats.errors_total;
        stats->ids_served_total += x->stats.ids_served_total;
        stats->bytes_out_total += x->stats.bytes_out_total;
        stats->streams_total += x->stats.streams_total;
        stats->backpressure_pauses += x->stats.backpressure_pauses;
        stats->readahead_hits += x->stats.readahead_hits;
        stats->stream_rings_total += x->stats.stream_rings_total;
        stats->connections += x->stats.connections;
        stats->streams_active += x->stats.streams_active;
        if (metrics)
            pd_metrics_add(metrics, &x->metrics);
        *jobs += x->jobs;
    }
}

/* ---- Shutdown ----------------------------------------------------------------------------- */

void pd_server_stop(pd_server *s)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    int primary = s->primary == s;
    pd_log_info("shutdown", "shard=%u connections=%llu jobs=%u", s->index,
                (unsigned long long)s->stats.connections, s->jobs);
    if (primary) {
        pd_notify_stopping();
        pd_listen_close(s);
        pd_groups_stop(s->groups);
        pd_http_close(s);
        for (unsigned i = 1; i < s->nshards; i++)
            pd_server_post(s->shards[i], NULL, 1);
    }
    pd_conn *c = s->conns;
    while (c) {
        pd_conn *next = c->next;
        pd_conn_shutdown(c);
        c = next;
    }
    /* The same timer now bounds the shutdown instead of sweeping. */
    uv_timer_stop(&s->stop_timer);
    uv_timer_start(&s->stop_timer, pd_on_stop_timeout, s->cfg->shutdown_timeout_ms, 0);
    pd_server_maybe_finish(s);
}

void pd_server_maybe_finish(pd_server *s)
{
    if (!s->stopping || s->conns || s->jobs || !s->handles_on)
        return;
    pd_server_close_handles(s);
}

void pd_server_close(pd_server *s)
{
    /* After run returns, or a failed start: the other shards end first (they use what is closed below). */
    pd_shards_end(s);
    pd_listen_close(s);
    pd_http_close(s);
    while (s->conns)
        pd_conn_close(s->conns);
    pd_server_close_handles(s);
    uv_run(s->loop, UV_RUN_DEFAULT);
    pd_registry_close(s->reg);
    s->reg = NULL;
    pd_backend_close(s->backend);
    s->backend = NULL;
    pd_plans_close(s->plans);
    s->plans = NULL;
    pd_groups_close(s->groups);
    s->groups = NULL;
    free(s->token);
    s->token = NULL;
}
