/* Server wiring: the model and the service, event loops and their threads, listeners, signals, the sweep, shutdown. */
#include "daemon/server.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/auth.h"
#include "daemon/backend.h"
#include "daemon/clock.h"
#include "daemon/conn.h"
#include "daemon/groups.h"
#include "daemon/http.h"
#include "daemon/listen.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/plans.h"
#include "daemon/readahead.h"
#include "daemon/registry.h"
#include "daemon/service.h"
#include "daemon/session.h"
#include "daemon/sigmask.h"

#define PD_SWEEP_MS 500
#define PD_AUTO_LOOPS_MAX 4 /* loops: 0 picks min(CPUs, this): the worker pool wants the other cores */

/* A connection accepted on the primary loop, on its way to another. */
typedef struct pd_handoff {
    int fd;
    int is_tcp;
    int admitted; /* pd_session_admit counted it */
} pd_handoff;

/* One event loop: the service's share (pd_loop), the transport's (pd_conns), and its thread and
 * inbox when it is not the primary. */
typedef struct pd_server_loop {
    pd_server *srv;
    unsigned index;
    uv_loop_t *uv;
    uv_loop_t own;              /* a secondary loop's libuv loop */
    pd_loop sl;                 /* its counters, inline budget and readahead queue */
    pd_conns *conns;
    uv_timer_t timer;           /* sweeps lingering connections and expired deadlines */
    uv_timer_t stop_timer;      /* bounds the shutdown */
    int handles_on;
    int stopping;
    pthread_t thread;
    int thread_on;
    uv_async_t inbox_async;     /* a secondary: connections handed over, or stop */
    pthread_mutex_t inbox_lock; /* guards the four below */
    pd_handoff *inbox;
    size_t inbox_len, inbox_cap;
    int stop_asked;
    int inbox_closed;           /* the loop is ending: nothing more may be posted */
} pd_server_loop;

/* Every access snapshot the server made (SIGHUP makes more); freed with the server, since another
 * loop may still read an older one. */
typedef struct pd_access_node {
    struct pd_access_node *next;
    pd_access access;
} pd_access_node;

enum { PD_SIGTERM, PD_SIGINT, PD_SIGHUP, PD_SIGUSR1, PD_SIGUSR2, PD_NSIGNALS };
static const int pd_signal_nums[PD_NSIGNALS] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};

struct pd_server {
    const pd_config *cfg;
    pd_service svc;
    pd_registry *reg;
    pd_plans *plans;
    pd_backend *backend;
    pd_groups *groups;
    pd_access_node *accesses;   /* the newest first */
    pd_reload_fn reload;        /* SIGHUP: where a fresh configuration comes from */
    void *reload_ctx;
    pd_listener *unix_listener, *tcp_listener;
    char socket_path[4096];
    pd_http *http;
    pthread_mutex_t http_lock; /* a Stats on another loop reads http's counters while loop 0 may close it */
    uv_signal_t signals[PD_NSIGNALS];
    int signals_on;
    sigset_t caller_mask;  /* pd_server_create's caller's, given back by pd_server_free */
    uv_work_t warm;        /* starts libuv's worker threads while the handled signals are blocked */
    int stopping;
    pd_server_loop **loops; /* loops[0] is the primary */
    unsigned nloops, next_loop;
};

static void pd_loop_maybe_finish(void *ctx);
static void pd_server_close_signals(pd_server *s);

/* ---- Counters ------------------------------------------------------------------------------ */

static void pd_server_config_number(void *ctx, const char *key, uint64_t value)
{
    pd_stats_view *v = ctx;
    if (v->nconfig < PD_STATS_CONFIG_MAX) {
        v->config[v->nconfig].key = key;
        v->config[v->nconfig++].value = value;
    }
}

void pd_server_totals(pd_server *s, pd_stats_view *v)
{
    memset(v, 0, sizeof *v);
    for (unsigned i = 0; i < s->nloops; i++) {
        pd_server_loop *l = s->loops[i];
        pd_stats_add(&v->stats, &l->sl.stats);
        pd_metrics_add(&v->metrics, &l->sl.metrics);
        if (l->conns)
            v->jobs += pd_conns_jobs(l->conns);
    }
    v->workers = s->svc.workers;
    v->uptime_ms = pd_clock_ms() - s->svc.started_ms;
    if (s->backend) {
        pd_backend_counts(s->backend, &v->cpu_ids, &v->gpu_ids);
        pd_backend_gpu_health(s->backend, &v->gpu_fallbacks, &v->gpu_off);
        pd_backend_pool_counts(s->backend, &v->pool_caught, &v->pool_slept);
    }
    v->ring_bytes = atomic_load(&s->svc.ring_bytes);
    v->ring_fds = atomic_load(&s->svc.ring_fds);
    v->upload_bytes = atomic_load(&s->svc.upload_bytes);
    v->output_bytes = atomic_load(&s->svc.output_bytes);
    if (s->groups)
        pd_groups_counts(s->groups, &v->groups, &v->group_sends);
    v->datasets = s->reg ? pd_registry_count(s->reg) : 0;
    if (s->reg)
        pd_registry_mixture_totals(s->reg, &v->mixtures, &v->mixture_bytes);
    v->layout_bytes = s->reg ? pd_registry_layout_bytes(s->reg) : 0;
    v->registry_checkpoint_failures = s->reg ? pd_registry_checkpoint_failures(s->reg) : 0;
    v->plan_bytes = pd_plans_bytes(s->plans);
    v->plan_cursor_bytes = pd_plans_cursor_bytes(s->plans);
    pthread_mutex_lock(&s->http_lock);
    v->http_evicted = pd_http_evicted(s->http);
    v->http_expired = pd_http_expired(s->http);
    v->http_cache_hits = pd_http_cache_hits(s->http);
    pthread_mutex_unlock(&s->http_lock);
    v->nlog_suppressed = pd_log_peer_suppressed(v->log_suppressed, PD_LOG_PEER_EVENTS);
    pd_config_each_number(s->svc.cfg, pd_server_config_number, v);
}

pd_registry *pd_server_registry(pd_server *s)
{
    return s->reg;
}

static void pd_server_totals_cb(void *ctx, pd_stats_view *v)
{
    pd_server_totals(ctx, v);
}

static int pd_server_metrics_cb(void *ctx, char **body, size_t *len)
{
    pd_stats_view v;
    pd_server_totals(ctx, &v);
    return pd_stats_render(&v, body, len);
}

static int pd_server_stopping_cb(void *ctx)
{
    return ((pd_server *)ctx)->stopping;
}

/* ---- One loop ------------------------------------------------------------------------------- */

/* Connections that sent an error and wait for the peer's EOF are closed when their time is up. */
static void pd_on_sweep(uv_timer_t *t)
{
    pd_server_loop *l = t->data;
    pd_conns_sweep(l->conns, pd_clock_ms());
    if (l->index == 0) /* the count of a flood of peer-caused warnings that stopped is said within a second or so */
        pd_log_peer_flush();
}

static void pd_on_stop_timeout(uv_timer_t *t)
{
    pd_server_loop *l = t->data;
    pd_log_warn("shutdown_timeout", "shard=%u connections=%llu jobs=%u", l->index,
                (unsigned long long)l->sl.stats.connections, pd_conns_jobs(l->conns));
    pd_conns_close_all(l->conns);
    pd_loop_maybe_finish(l);
}

/* The handles every loop has: the service's (inline budget, readahead), the sweep/stop timer. */
static int pd_loop_start(pd_server *s, pd_server_loop *l)
{
    pd_conn_limits lim = {.output_cap = s->cfg->output_cap, .output_memory = s->cfg->output_memory,
                          .output_total = &s->svc.output_bytes, .max_frame = (uint32_t)s->cfg->max_frame,
                          .frame_timeout_ms = s->cfg->frame_timeout_ms, .linger_ms = s->cfg->error_linger_ms,
                          .stop_linger_ms = s->cfg->shutdown_timeout_ms};
    if (pd_conns_create(l->uv, &lim, &l->sl.stats, &l->sl.metrics, pd_loop_maybe_finish, l, &l->conns))
        return PD_ENOMEM;
    pd_loop_init(&l->sl, &s->svc, l->uv, l->index);
    if (pd_readahead_loop_open(&l->sl)) {
        pd_loop_close(&l->sl);
        return PD_ENOMEM;
    }
    uv_timer_init(l->uv, &l->timer);
    uv_timer_init(l->uv, &l->stop_timer);
    l->timer.data = l->stop_timer.data = l;
    uv_timer_start(&l->timer, pd_on_sweep, PD_SWEEP_MS, PD_SWEEP_MS);
    l->handles_on = 1;
    return 0;
}

/* Close what pd_loop_start opened; the loop then ends (a secondary's thread returns). */
static void pd_loop_close_handles(pd_server_loop *l)
{
    if (!l->handles_on)
        return;
    l->handles_on = 0;
    if (l->index == 0) {
        pd_server_close_signals(l->srv);
    } else {
        pthread_mutex_lock(&l->inbox_lock);
        l->inbox_closed = 1;
        pthread_mutex_unlock(&l->inbox_lock);
        uv_close((uv_handle_t *)&l->inbox_async, NULL);
    }
    uv_close((uv_handle_t *)&l->timer, NULL);
    uv_close((uv_handle_t *)&l->stop_timer, NULL);
    pd_loop_close(&l->sl);
    pd_readahead_loop_close(&l->sl);
}

/* Called whenever a connection or job goes away: once stopping and nothing is left, close. */
static void pd_loop_maybe_finish(void *ctx)
{
    pd_server_loop *l = ctx;
    if (l->stopping && pd_conns_empty(l->conns))
        pd_loop_close_handles(l);
}

static void pd_loop_stop(pd_server_loop *l)
{
    if (l->stopping)
        return;
    l->stopping = 1;
    l->sl.stopping = 1;
    pd_log_info("shutdown", "shard=%u connections=%llu jobs=%u", l->index, (unsigned long long)l->sl.stats.connections,
                pd_conns_jobs(l->conns));
    /* The sweep goes on (lingering connections close on time); this one bounds the shutdown. */
    uv_timer_start(&l->stop_timer, pd_on_stop_timeout, l->srv->cfg->shutdown_timeout_ms, 0);
    pd_conns_shutdown(l->conns); /* may finish at once */
    pd_loop_maybe_finish(l);
}

/* Serve a connection on l: from a listener of l's loop (listener), or a descriptor another loop accepted. */
static void pd_loop_serve(pd_server_loop *l, uv_stream_t *listener, int fd, int is_tcp, int admitted)
{
    pd_conn *c;
    int rc = listener ? pd_conn_accept(l->conns, listener, is_tcp, &c) : pd_conn_adopt(l->conns, fd, is_tcp, &c);
    if (rc) {
        l->sl.stats.accept_errors++;
        if (admitted)
            pd_session_release(&l->srv->svc, is_tcp);
        return;
    }
    pd_session_open(&l->sl, c, admitted);
}

/* ---- Handing connections to other loops --------------------------------------------------- */

/* Refuse a connection handed over but not served: close it and stop counting it. */
static void pd_handoff_drop(pd_server_loop *l, const pd_handoff *h)
{
    close(h->fd);
    if (h->admitted)
        pd_session_release(&l->srv->svc, h->is_tcp);
}

/* On a secondary loop: serve the connections handed over; stop when asked. */
static void pd_on_inbox(uv_async_t *a)
{
    pd_server_loop *l = a->data;
    pthread_mutex_lock(&l->inbox_lock);
    pd_handoff *items = l->inbox;
    size_t n = l->inbox_len;
    int stop = l->stop_asked;
    l->inbox = NULL;
    l->inbox_len = l->inbox_cap = 0;
    pthread_mutex_unlock(&l->inbox_lock);
    for (size_t i = 0; i < n; i++) {
        if (l->stopping || stop)
            pd_handoff_drop(l, &items[i]);
        else
            pd_loop_serve(l, NULL, items[i].fd, items[i].is_tcp, items[i].admitted);
    }
    free(items);
    if (stop)
        pd_loop_stop(l);
}

static void pd_loop_post(pd_server_loop *to, const pd_handoff *h, int stop)
{
    pthread_mutex_lock(&to->inbox_lock);
    if (to->inbox_closed) { /* stopped already: a connection handed over now is refused */
        pthread_mutex_unlock(&to->inbox_lock);
        if (h)
            pd_handoff_drop(to, h);
        return;
    }
    if (h) {
        if (to->inbox_len == to->inbox_cap) {
            size_t cap = to->inbox_cap ? 2 * to->inbox_cap : 16;
            pd_handoff *p = realloc(to->inbox, cap * sizeof *p);
            if (!p) {
                pthread_mutex_unlock(&to->inbox_lock);
                pd_log_error("accept", "err=ENOMEM");
                pd_handoff_drop(to, h);
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

/* A listener of the primary has a connection: admit it (or not) here, where every accept passes,
 * so the count is exact; then serve it on the next loop in turn. */
static void pd_server_on_accept(void *ctx, uv_stream_t *listener, int is_tcp, int status)
{
    pd_server *s = ctx;
    if (status < 0) { /* logged by the listener */
        s->loops[0]->sl.stats.accept_errors++; /* this is loop 0's thread */
        return;
    }
    if (s->stopping)
        return;
    int admitted = pd_session_admit(&s->svc, is_tcp);
    pd_server_loop *to = s->loops[s->next_loop++ % s->nloops];
    if (to->index == 0) {
        pd_loop_serve(to, listener, -1, is_tcp, admitted);
        return;
    }
    /* Accept here, then give the socket to the other loop: libuv handles belong to one loop, so the
     * descriptor travels (duplicated, as closing this handle closes the original). */
    uv_stream_t *tmp = malloc(is_tcp ? sizeof(uv_tcp_t) : sizeof(uv_pipe_t));
    uv_os_fd_t fd;
    int dup_fd = -1;
    if (!tmp) {
        pd_log_error("accept", "err=ENOMEM");
        if (admitted)
            pd_session_release(&s->svc, is_tcp);
        return;
    }
    if (is_tcp)
        uv_tcp_init(s->loops[0]->uv, (uv_tcp_t *)tmp);
    else
        uv_pipe_init(s->loops[0]->uv, (uv_pipe_t *)tmp, 0);
    int rc = uv_accept(listener, tmp);
    if (rc == 0 && uv_fileno((uv_handle_t *)tmp, &fd) == 0)
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    uv_close((uv_handle_t *)tmp, pd_on_handoff_closed);
    if (dup_fd < 0) { /* out of descriptors: a flood of connections can make it so, once per connection */
        pd_log_warn_peer("accept", "err=%s", rc ? uv_err_name(rc) : "EMFILE");
        s->loops[0]->sl.stats.accept_errors++; /* this is loop 0's thread */
        if (admitted)
            pd_session_release(&s->svc, is_tcp);
        return;
    }
    pd_handoff h = {dup_fd, is_tcp, admitted};
    pd_loop_post(to, &h, 0);
}

static void *pd_loop_main(void *arg)
{
    pd_server_loop *l = arg;
    uv_run(l->uv, UV_RUN_DEFAULT);
    return NULL;
}

/* A secondary loop with a thread of its own. */
static int pd_loop_spawn(pd_server *s, pd_server_loop *l)
{
    l->uv = &l->own;
    if (uv_loop_init(l->uv))
        return PD_EINTERNAL;
    pthread_mutex_init(&l->inbox_lock, NULL);
    uv_async_init(l->uv, &l->inbox_async, pd_on_inbox);
    l->inbox_async.data = l;
    int rc = pd_loop_start(s, l);
    if (rc == 0 && pd_sigmask_thread(&l->thread, pd_loop_main, l) == 0) {
        l->thread_on = 1;
        return 0;
    }
    if (rc == 0)
        pd_loop_close_handles(l);
    else
        uv_close((uv_handle_t *)&l->inbox_async, NULL);
    uv_run(l->uv, UV_RUN_DEFAULT);
    uv_loop_close(l->uv);
    pthread_mutex_destroy(&l->inbox_lock);
    pd_conns_free(l->conns);
    l->conns = NULL;
    return PD_EINTERNAL;
}

/* ---- Signals and shutdown ------------------------------------------------------------------- */

/* ---- Access (allow_uids, the token) and SIGHUP ---------------------------------------------- */

/* A new access snapshot from cfg (the token file read now), published for every loop. The token must fit
 * preauth_frame, the max_preauth_frame the sessions use: the running one on a reload (a new value takes
 * effect on restart), or a rotated token longer than it would let no TCP client in. */
static int pd_server_publish_access(pd_server *s, const pd_config *cfg, uint64_t preauth_frame)
{
    pd_access_node *n = calloc(1, sizeof *n);
    if (!n)
        return PD_ENOMEM;
    int rc = 0;
    if (cfg->allow_uids.n && !(n->access.allow_uids.uids = malloc(cfg->allow_uids.n * sizeof(uint32_t))))
        rc = PD_ENOMEM;
    else if (cfg->token_file[0])
        rc = pd_auth_load_token(cfg->token_file, &n->access.token, &n->access.token_len);
    /* A client's Hello carries the token, its name and a few bytes of framing before it may send more than
     * max_preauth_frame: a token without that room would start permd and let no client in. */
    char why[256];
    if (!rc && n->access.token && (rc = pd_auth_token_fits(n->access.token_len, preauth_frame, why, sizeof why)))
        pd_log_error("token", "path=%s msg=\"%s%s\"", cfg->token_file, why,
                     preauth_frame != cfg->max_preauth_frame ? " (the running max_preauth_frame: a new one takes effect "
                                                              "on restart)" : "");
    if (rc) {
        free(n->access.token);
        free(n->access.allow_uids.uids);
        free(n);
        return rc;
    }
    if (cfg->allow_uids.n)
        memcpy(n->access.allow_uids.uids, cfg->allow_uids.uids, cfg->allow_uids.n * sizeof(uint32_t));
    n->access.allow_uids.n = cfg->allow_uids.n;
    n->next = s->accesses;
    s->accesses = n;
    atomic_store(&s->svc.access, &n->access);
    return 0;
}

void pd_server_on_reload(pd_server *s, pd_reload_fn fn, void *ctx)
{
    s->reload = fn;
    s->reload_ctx = ctx;
}

/* SIGHUP: read the configuration again and apply what can change safely while serving: log_level,
 * allow_uids and the token file (read again even if its path is the same: a rotated token). Other
 * changed keys are named in a warning; they take effect on restart. */
static void pd_server_reload(pd_server *s)
{
    static const char *const live[] = {"log_level", "peer_log_rate", "allow_uids", "token_file"};
    char err[512] = "";
    const char *keys[128];
    pd_config fresh;
    if (!s->reload) {
        pd_log_info("reload", "msg=\"ignored: this permd has no configuration source to read again\"");
        return;
    }
    if (pd_config_init(&fresh)) {
        pd_log_error("reload", "msg=\"out of memory\"");
        return;
    }
    if (s->reload(s->reload_ctx, &fresh, err, sizeof err) || pd_config_validate(&fresh, err, sizeof err)) {
        pd_log_error("reload", "msg=\"the configuration was not applied: %s\"", err);
        pd_config_free(&fresh);
        return;
    }
    size_t n = pd_config_diff(s->cfg, &fresh, keys, sizeof keys / sizeof keys[0]);
    for (size_t i = 0; i < n; i++) {
        int applies = 0;
        for (size_t k = 0; k < sizeof live / sizeof live[0]; k++)
            applies |= !strcmp(keys[i], live[k]);
        if (!applies)
            pd_log_warn("reload", "key=%s msg=\"changed; restart permd to apply it\"", keys[i]);
    }
    int rc = pd_server_publish_access(s, &fresh, s->cfg->max_preauth_frame);
    if (rc) {
        pd_log_error("reload", "msg=\"allow_uids and the token were not applied: %s\"", pd_strerror(rc));
    } else {
        pd_log_set_level((pd_log_level)fresh.log_level);
        pd_log_set_peer_rate(fresh.peer_log_rate);
        pd_log_info("reload", "log_level=%s peer_log_rate=%llu allow_uids=%zu token=%s",
                    pd_log_level_name((pd_log_level)fresh.log_level), (unsigned long long)fresh.peer_log_rate,
                    fresh.allow_uids.n, fresh.token_file[0] ? "set" : "none");
    }
    pd_config_free(&fresh);
}

static void pd_on_signal(uv_signal_t *h, int signum)
{
    pd_server *s = h->data;
    switch (signum) {
    case SIGHUP:
        pd_log_info("signal", "name=SIGHUP action=reload");
        pd_server_reload(s);
        break;
    case SIGUSR1:
    case SIGUSR2:
        /* The default action would kill permd (no StreamEnd, a stale socket file): logged, ignored. */
        pd_log_info("signal", "name=%s action=ignore", signum == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
        break;
    default:
        pd_log_info("signal", "name=%s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
        pd_server_stop(s);
    }
}

static void pd_server_open_signals(pd_server *s, uv_loop_t *loop)
{
    for (int i = 0; i < PD_NSIGNALS; i++) {
        uv_signal_init(loop, &s->signals[i]);
        s->signals[i].data = s;
        uv_signal_start(&s->signals[i], pd_on_signal, pd_signal_nums[i]);
    }
    s->signals_on = 1;
}

static void pd_server_close_signals(pd_server *s)
{
    if (!s->signals_on)
        return;
    s->signals_on = 0;
    /* Closing the last watcher of a signal gives it back its default action. permd is stopping
     * already (jobs may still be finishing): a second SIGTERM or SIGINT (systemd, a supervisor's
     * retry, Ctrl-C twice) must not turn the clean exit into death by signal. Every other thread
     * blocks these signals (sigmask.h); this one blocks them before the close, and ignoring them
     * then discards any that arrived in between. */
    pd_sigmask_block(NULL);
    for (int i = 0; i < PD_NSIGNALS; i++) {
        uv_close((uv_handle_t *)&s->signals[i], NULL);
        signal(pd_signal_nums[i], SIG_IGN);
    }
}

void pd_server_stop(pd_server *s)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    pd_notify_stopping();
    pd_listener_close(s->unix_listener);
    pd_listener_close(s->tcp_listener);
    s->unix_listener = s->tcp_listener = NULL;
    pd_groups_stop(s->groups);
    pthread_mutex_lock(&s->http_lock); /* freed later on this loop: no other loop may still hold it */
    pd_http_close(s->http);
    s->http = NULL;
    pthread_mutex_unlock(&s->http_lock);
    for (unsigned i = 1; i < s->nloops; i++)
        pd_loop_post(s->loops[i], NULL, 1);
    pd_loop_stop(s->loops[0]);
}

int pd_server_run(pd_server *s)
{
    if (s->signals_on)
        pd_sigmask_unblock(); /* this thread alone takes them, until pd_server_close_signals */
    return uv_run(s->loops[0]->uv, UV_RUN_DEFAULT);
}

/* Ask every secondary loop to stop, wait for their threads, release them. */
static void pd_loops_end(pd_server *s)
{
    for (unsigned i = 1; i < s->nloops; i++) {
        pd_server_loop *l = s->loops[i];
        if (l->thread_on) {
            pd_loop_post(l, NULL, 1);
            pthread_join(l->thread, NULL);
            if (uv_loop_close(l->uv))
                pd_log_warn("loop_close", "shard=%u msg=\"handles still open\"", i);
            pthread_mutex_destroy(&l->inbox_lock);
            for (size_t k = 0; k < l->inbox_len; k++)
                pd_handoff_drop(l, &l->inbox[k]);
            free(l->inbox);
        }
        pd_conns_free(l->conns);
        free(l);
    }
    if (s->nloops > 1)
        s->nloops = 1;
}

void pd_server_free(pd_server *s)
{
    if (!s)
        return;
    /* The other loops end first (they use what is closed below). */
    pd_loops_end(s);
    pd_listener_close(s->unix_listener);
    pd_listener_close(s->tcp_listener);
    pd_http_close(s->http);
    if (s->nloops) {
        pd_server_loop *p = s->loops[0];
        if (p->conns)
            pd_conns_close_all(p->conns);
        pd_loop_close_handles(p);
        pd_server_close_signals(s); /* a failed start: the loop's handles never opened */
        uv_run(p->uv, UV_RUN_DEFAULT);
        pd_conns_free(p->conns);
        free(p);
    }
    free(s->loops);
    pd_registry_close(s->reg);
    pd_backend_close(s->backend);
    pd_plans_close(s->plans);
    pd_groups_close(s->groups);
    while (s->accesses) {
        pd_access_node *n = s->accesses;
        s->accesses = n->next;
        free(n->access.allow_uids.uids);
        free(n->access.token);
        free(n);
    }
    sigset_t mask = s->caller_mask;
    pthread_mutex_destroy(&s->http_lock);
    free(s);
    pd_sigmask_restore(&mask);
}

/* ---- Startup -------------------------------------------------------------------------------- */

/* The descriptors stream rings may hold (each ring keeps its own): RLIMIT_NOFILE less what connections
 * (max_connections, max_tcp_connections, metrics_connections) and permd itself may need: listeners, the
 * registry, libuv's own (PD_FDS_OWN), and each loop's epoll and wake-up descriptors (PD_FDS_LOOP), so
 * that rings never stop permd accepting. */
#define PD_FDS_OWN 64
#define PD_FDS_LOOP 4
static unsigned long long pd_ring_fds_max(const pd_config *cfg, unsigned nloops)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) || r.rlim_cur == RLIM_INFINITY)
        return ULLONG_MAX;
    const unsigned long long others = cfg->max_connections + cfg->max_tcp_connections + cfg->metrics_connections +
                                      PD_FDS_OWN + (unsigned long long)PD_FDS_LOOP * nloops;
    const unsigned long long left = r.rlim_cur > others ? r.rlim_cur - others : 0;
    if (left < cfg->max_connections)
        pd_log_warn("startup", "msg=\"few descriptors: stream rings limited to %llu, past which streams send ids through "
                    "the socket; raise RLIMIT_NOFILE (LimitNOFILE) above %llu\" nofile=%llu",
                    left, others + cfg->max_connections * (cfg->max_streams + 1), (unsigned long long)r.rlim_cur);
    return left;
}

static void pd_warm_work(uv_work_t *w)
{
    (void)w;
}

static int pd_server_start(pd_server *s, uv_loop_t *loop, unsigned workers)
{
    const pd_config *cfg = s->cfg;
    char path[4096], err[512] = "";
    int rc;
    pd_service *svc = &s->svc;

    pd_log_set_peer_rate(cfg->peer_log_rate);

    pd_backend_opts bo = {.cpu_isa = cfg->cpu_isa, .cpu_threads = (unsigned)cfg->cpu_threads,
                          .cpu_spin_ns = cfg->cpu_spin_us * 1000, .gpu = cfg->gpu,
                          .gpu_device = (unsigned)cfg->gpu_device, .gpu_min_ids = cfg->gpu_min_ids,
                          .gpu_library = cfg->gpu_library};
    if ((rc = pd_backend_open(&bo, &s->backend))) {
        pd_log_error("startup", "msg=\"cannot start the generation backend: %s\" cpu_isa=%s", pd_strerror(rc),
                     cfg->cpu_isa);
        return rc;
    }
    if ((rc = pd_plans_open((unsigned)cfg->plan_cache, cfg->plan_cache_bytes, pd_backend_gen(s->backend),
                            &s->plans)) ||
        (rc = pd_groups_open(cfg, &s->groups))) {
        pd_log_error("startup", "msg=\"out of memory\"");
        return rc;
    }
    if ((rc = pd_config_state_dir(cfg, path, sizeof path))) {
        if (rc == PD_ETOOBIG)
            pd_log_error("startup", "msg=\"state_dir: the path is longer than %zu bytes\"", sizeof path - 1);
        else
            pd_log_error("startup", "msg=\"cannot choose a state directory: set state_dir (HOME is not set either)\"");
        return rc;
    }
    /* Only a damaged registry is moved aside (fresh_registry), under the registry's lock: one that is locked,
     * read-only or unreadable for permissions may be intact, and is refused with its cause instead. */
    rc = pd_registry_open_with(path, (int)cfg->fresh_registry, (unsigned)cfg->registry_busy_ms, &s->reg, err,
                               sizeof err);
    if (rc) {
        pd_log_error("startup", "msg=\"%s%s\"", err,
                     rc == PD_ECORRUPT && !cfg->fresh_registry
                         ? "; to start with an empty registry and keep the damaged files aside, "
                           "set fresh_registry: 1 (--fresh-registry 1)"
                         : "");
        return rc;
    }
    pd_registry_set_layout_limit(s->reg, cfg->layout_memory);
    pd_registry_set_mixture_limit(s->reg, cfg->mixture_memory);
    if (pd_registry_skipped(s->reg))
        pd_log_error("registry", "skipped=%zu msg=\"rows that could not be read are not served (logged above)\"",
                     pd_registry_skipped(s->reg));
    pd_log_info("registry", "path=%s/registry.db datasets=%zu", path, pd_registry_count(s->reg));
    for (size_t i = 0; i < cfg->ndatasets; i++) {
        char why[160] = "";
        if ((rc = pd_registry_declare(s->reg, cfg->datasets[i].name, cfg->datasets[i].size, why, sizeof why))) {
            pd_log_error("startup", "dataset=%s msg=\"the config declares a dataset of size %llu, but %s\"",
                         cfg->datasets[i].name, (unsigned long long)cfg->datasets[i].size,
                         why[0] ? why : "its name or size is invalid");
            return rc;
        }
    }
    pd_registry_check_mixtures(s->reg);
    if ((rc = pd_server_publish_access(s, cfg, cfg->max_preauth_frame)))
        return rc;

    svc->cfg = cfg;
    svc->reg = s->reg;
    svc->plans = s->plans;
    svc->backend = s->backend;
    svc->groups = s->groups;
    svc->workers = workers;
    svc->started_ms = pd_clock_ms();
    svc->totals = pd_server_totals_cb;
    svc->totals_ctx = s;

    unsigned nloops = cfg->loops ? (unsigned)cfg->loops : uv_available_parallelism();
    if (!cfg->loops && nloops > PD_AUTO_LOOPS_MAX)
        nloops = PD_AUTO_LOOPS_MAX;
    if (nloops < 1)
        nloops = 1;
    svc->ring_fds_max = pd_ring_fds_max(cfg, nloops);
    if (!(s->loops = calloc(nloops, sizeof *s->loops)) || !(s->loops[0] = calloc(1, sizeof *s->loops[0]))) {
        pd_log_error("startup", "msg=\"out of memory\"");
        return PD_ENOMEM;
    }
    s->nloops = 1;
    pd_server_loop *p = s->loops[0];
    p->srv = s;
    p->uv = loop;
    pd_server_open_signals(s, loop);
    if ((rc = pd_loop_start(s, p))) {
        pd_log_error("startup", "msg=\"out of memory\"");
        return rc;
    }

    if ((rc = pd_config_socket_path(cfg, path, sizeof path))) {
        pd_log_error("startup", "msg=\"socket path too long\"");
        return rc;
    }
    if ((rc = pd_listen_unix(loop, path, (unsigned)cfg->socket_mode, cfg->socket[0] == '\0', pd_server_on_accept, s,
                             &s->unix_listener)))
        return rc;
    snprintf(s->socket_path, sizeof s->socket_path, "%s", path);
    if (cfg->tcp[0] && (rc = pd_listen_tcp(loop, cfg->tcp, cfg->token_file[0] != '\0', pd_server_on_accept, s,
                                           &s->tcp_listener)))
        return rc;
    pd_http_routes routes = {.metrics = pd_server_metrics_cb, .stopping = pd_server_stopping_cb, .ctx = s};
    pd_http_limits hl = {.max_conns = (unsigned)cfg->metrics_connections, .timeout_ms = cfg->metrics_timeout_ms,
                         .cache_ms = cfg->metrics_cache_ms, .max_head = (size_t)cfg->metrics_max_head};
    if (cfg->metrics[0] &&
        (rc = pd_http_listen(loop, cfg->metrics, pd_config_metrics_is_default(cfg), &routes, &hl, &s->http)))
        return rc;
    while (s->nloops < nloops) {
        pd_server_loop *l = calloc(1, sizeof *l);
        if (!l) {
            pd_log_error("startup", "msg=\"out of memory\"");
            return PD_ENOMEM;
        }
        l->srv = s;
        l->index = s->nloops;
        if (pd_loop_spawn(s, l)) {
            free(l);
            pd_log_error("startup", "msg=\"cannot start event loop %u\"", s->nloops);
            return PD_EINTERNAL;
        }
        s->loops[s->nloops++] = l;
    }
    /* libuv starts its worker threads at the first job. Start them now, while this thread blocks the
     * handled signals (pd_server_create), so they inherit the block; a request's job would start
     * them from loop 0 while it takes signals. */
    uv_queue_work(loop, &s->warm, pd_warm_work, NULL); /* libuv takes no after-callback */
    pd_log_info("ready", "version=%s loops=%u workers=%u %s max_connections=%llu output_cap=%llu", PERMD_VERSION,
                s->nloops, workers, pd_backend_describe(s->backend), (unsigned long long)cfg->max_connections,
                (unsigned long long)cfg->output_cap);
    char status[512];
    snprintf(status, sizeof status, "serving %zu datasets on %.400s", pd_registry_count(s->reg), s->socket_path);
    pd_notify_ready(loop, status);
    return 0;
}

int pd_server_create(uv_loop_t *loop, const pd_config *cfg, unsigned workers, pd_server **out)
{
    *out = NULL;
    pd_server *s = calloc(1, sizeof *s);
    if (!s)
        return PD_ENOMEM;
    s->cfg = cfg;
    pthread_mutex_init(&s->http_lock, NULL);
    /* Every thread started from here on (loops, the CPU pool, libuv's workers, the GPU library's)
     * inherits the block; pd_server_run lifts it on this thread alone. */
    pd_sigmask_block(&s->caller_mask);
    int rc = pd_server_start(s, loop, workers);
    if (rc) {
        pd_server_free(s);
        return rc;
    }
    *out = s;
    return 0;
}
