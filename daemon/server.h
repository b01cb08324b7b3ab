/* The daemon's shared state: event loop, configuration, registry, listeners, connections and counters. */
#ifndef PD_SERVER_H
#define PD_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/config.h"
#include "daemon/metrics.h"
#include "daemon/registry.h"

struct pd_conn;

typedef struct pd_stats {
    uint64_t connections_total;
    uint64_t requests_total;
    uint64_t errors_total;
    uint64_t ids_served_total;
    uint64_t bytes_out_total;
    uint64_t streams_total;
    uint64_t backpressure_pauses;
    uint64_t readahead_hits; /* Fetches answered from a readahead (daemon/readahead.c) */
    uint32_t connections;
    uint32_t streams_active;
} pd_stats;

typedef struct pd_server {
    uv_loop_t *loop;
    const pd_config *cfg;
    pd_registry *reg;
    struct pd_plans *plans;     /* sharded epoch plans in use */
    struct pd_groups *groups;   /* NCCL delivery groups */
    struct pd_backend *backend; /* where ids come from (CPU SIMD, GPU) */

    uv_pipe_t unix_listener;
    uv_tcp_t tcp_listener;
    int unix_on, tcp_on;
    char socket_path[4096]; /* unlinked at shutdown */

    char *token; /* TCP auth secret, NULL when TCP clients need none */
    size_t token_len;

    struct pd_conn *conns; /* every open connection (doubly linked) */
    pd_stats stats;
    pd_metrics metrics;  /* by request type; daemon/metrics.h */
    struct pd_http *http; /* the metrics endpoint, NULL when off */
    uint64_t started_ms;
    unsigned jobs; /* worker-pool jobs in flight */
    unsigned workers;
    uint64_t inline_left; /* ids the loop may still generate itself this iteration */
    uv_check_t budget;    /* refills inline_left once per loop iteration */
    uv_idle_t readahead_idle;         /* generates the queued predictions before the loop blocks */
    struct pd_conn *readahead_queue;  /* connections with a prediction to generate */

    uv_signal_t sigterm, sigint;
    uv_timer_t stop_timer; /* sweeps lingering connections; bounds the shutdown once stopping */
    int handles_on;        /* the signal and timer handles are open */
    int stopping;
} pd_server;

/* Open the registry, declare config datasets, bind the listeners. Logs and
 * returns a PD_E* on failure (the caller exits non-zero). */
int pd_server_init(pd_server *s, uv_loop_t *loop, const pd_config *cfg, unsigned workers);
/* Run until a graceful shutdown completes. */
int pd_server_run(pd_server *s);
/* Stop accepting, end streams, let in-flight replies flush, then close. Idempotent. */
void pd_server_stop(pd_server *s);
/* Release what init acquired (after run returns or after a failed init). */
void pd_server_close(pd_server *s);

/* Called whenever a connection or job goes away during shutdown: closes the
 * remaining handles once nothing is left in flight. */
void pd_server_maybe_finish(pd_server *s);

/* Whether count ids may be generated on the loop now (and take them from
 * this iteration's budget): at most inline_ids per iteration, so one busy
 * client cannot hold the loop. A worker-pool hop costs the loop more than
 * generating tens of thousands of ids with SIMD (bench/results/serve.md), so
 * only what exceeds the budget goes to the pool. */
int pd_server_take_inline(pd_server *s, uint64_t count);

uint64_t pd_now_ms(void);

#endif
