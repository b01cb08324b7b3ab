/* Server lifecycle: startup (registry, config datasets, listeners, signals), the sweep timer, graceful shutdown. */
#include "daemon/server.h"

#include <signal.h>
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
    pd_log_warn("shutdown_timeout", "connections=%u jobs=%u", s->stats.connections, s->jobs);
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
    uv_timer_init(loop, &s->stop_timer);
    uv_check_init(loop, &s->budget);
    s->sigterm.data = s->sigint.data = s->stop_timer.data = s->budget.data = s;
    s->inline_left = cfg->inline_ids;
    uv_check_start(&s->budget, pd_on_budget);
    pd_readahead_init(s);
    uv_unref((uv_handle_t *)&s->budget); /* never what keeps the loop alive */
    uv_signal_start(&s->sigterm, pd_on_signal, SIGTERM);
    uv_signal_start(&s->sigint, pd_on_signal, SIGINT);
    uv_timer_start(&s->stop_timer, pd_on_sweep, PD_SWEEP_MS, PD_SWEEP_MS);
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
    pd_log_info("ready", "version=%s workers=%u %s max_connections=%llu output_cap=%llu", PERMD_VERSION,
                workers, pd_backend_describe(s->backend), (unsigned long long)cfg->max_connections,
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

void pd_server_stop(pd_server *s)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    pd_log_info("shutdown", "connections=%u jobs=%u", s->stats.connections, s->jobs);
    pd_notify_stopping();
    pd_listen_close(s);
    pd_groups_stop(s->groups);
    pd_http_close(s);
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
    s->handles_on = 0;
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->stop_timer, NULL);
    uv_close((uv_handle_t *)&s->budget, NULL);
    pd_readahead_close(s);
}

void pd_server_close(pd_server *s)
{
    /* After a failed start: close what was opened and let the loop run their callbacks. */
    pd_listen_close(s);
    pd_http_close(s);
    while (s->conns)
        pd_conn_close(s->conns);
    if (s->handles_on) {
        s->handles_on = 0;
        uv_close((uv_handle_t *)&s->sigterm, NULL);
        uv_close((uv_handle_t *)&s->sigint, NULL);
        uv_close((uv_handle_t *)&s->stop_timer, NULL);
        uv_close((uv_handle_t *)&s->budget, NULL);
    pd_readahead_close(s);
    }
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
