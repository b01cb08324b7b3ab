/* The daemon's shared state: event loop, configuration, registry, listeners, connections and counters. */
#ifndef PD_SERVER_H
#define PD_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/config.h"
#include "daemon/metrics.h"
#include "daemon/registry.h"

struct pd_conn;

/* One serving loop's counters (Stats and /metrics add up every loop's). */
typedef struct pd_stats {
    pd_counter connections_total;
    pd_counter requests_total;
    pd_counter errors_total;
    pd_counter ids_served_total;
    pd_counter bytes_out_total;
    pd_counter streams_total;
    pd_counter backpressure_pauses;
    pd_counter readahead_hits; /* Fetches answered from a readahead (daemon/readahead.c) */
    pd_counter stream_rings_total; /* streams delivered through a shared-memory ring (daemon/ring.c) */
    pd_counter connections;
    pd_counter streams_active;
} pd_stats;

typedef struct pd_handoff {
    int fd;
    int is_tcp;
} pd_handoff;

/*
 * permd serves connections on several event loops ("shards", config key loops): one loop of one
 * thread saturates long before the machine does. The primary shard (the one pd_server_init makes)
 * binds the listeners, handles signals and /metrics, and hands each accepted connection to the
 * shards in turn; each shard has its own loop and thread, connections, counters, inline budget and
 * readahead queue, and shares the config, registry, plans, delivery groups and backend (each safe
 * to use from several threads). A connection lives on one shard for its whole life.
 */
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
    _Atomic unsigned jobs; /* worker-pool jobs in flight (read by other shards' Stats) */
    unsigned workers;
    uint64_t inline_left; /* ids the loop may still generate itself this iteration */
    uv_check_t budget;    /* refills inline_left once per loop iteration */
    uv_idle_t readahead_idle;         /* generates the queued predictions before the loop blocks */
    struct pd_conn *readahead_queue;  /* connections with a prediction to generate */

    uv_signal_t sigterm, sigint;
    uv_timer_t stop_timer; /* sweeps lingering connections; bounds the shutdown once stopping */
    int handles_on;        /* the signal and timer handles are open */
    int stopping;

    /* Shards. */
    struct pd_server *primary;  /* the shard that listens (itself on the primary) */
    struct pd_server **shards;  /* primary: every shard, shards[0] itself; NULL with one loop */
    unsigned nshards, next_shard; /* primary: how many, and who gets the next connection */
    unsigned index;             /* this shard's number (0: the primary), for logs */
    _Atomic unsigned conns_open;         /* primary: connections on every shard, for max_connections */
    _Atomic unsigned long long serials;  /* primary: connection numbers for logs, unique across shards */
    _Atomic unsigned long long ring_bytes; /* primary: stream rings alive on every shard (stream_ring_total) */
    uv_loop_t shard_loop;       /* a secondary shard's own loop and thread */
    pthread_t thread;
    int thread_on;
    uv_async_t inbox_async;     /* a secondary shard: connections handed over, or stop */
    pthread_mutex_t inbox_lock; /* guards the three below */
    pd_handoff *inbox;
    size_t inbox_len, inbox_cap;
    int stop_asked;
    int inbox_closed;           /* the shard's loop is ending: nothing more may be posted */
} pd_server;

/* Open the registry, declare config datasets, bind the listeners. Logs and
 * returns a PD_E* on failure (the caller exits non-zero). */
int pd_server_init(pd_server *s, uv_loop_t *loop, const pd_config *cfg, unsigned workers);
/* Hand a connection accepted on the primary to the next shard in turn (itself included). */
void pd_server_dispatch(pd_server *s, uv_stream_t *listener, int is_tcp);
/* Every shard's counters added up (any shard's thread). */
void pd_server_totals(pd_server *s, pd_stats *stats, pd_metrics *metrics, unsigned *jobs);

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
