/* Service state, by scope: what every loop shares (pd_service), one event loop's (pd_loop), one connection's (pd_session). */
#ifndef PD_SERVICE_H
#define PD_SERVICE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/config.h"
#include "daemon/conn.h"
#include "daemon/job.h"
#include "daemon/metrics.h"
#include "proto/arena.h"

/*
 * Handlers (daemon/hello.c, datasets.c, fetch.c, stream.c, groups.c) see the daemon through these
 * three structs and nothing else: the session of the request's connection, its loop, the service.
 * The wiring (daemon/server.c) fills the service and the loops; daemon/session.c creates sessions.
 */

struct pd_registry;
struct pd_plans;
struct pd_backend;
struct pd_groups;
struct pd_stats_view;
struct pd_streams;   /* daemon/stream.c */
struct pd_upload;    /* daemon/datasets.c */
struct pd_readahead; /* daemon/readahead.c */
struct pd_ra_queue;  /* daemon/readahead.c */

/* Who may connect and authenticate. Replaced whole on SIGHUP, never changed in place, so any loop
 * may read the one it loads; old ones are freed with the server. */
typedef struct pd_access {
    pd_uid_list allow_uids;    /* empty: whoever socket_mode admits */
    char *token;               /* TCP auth secret; NULL when TCP clients need none */
    size_t token_len;
} pd_access;

/* Shared by every loop; each member safe to use from any of them. */
typedef struct pd_service {
    const pd_config *cfg;
    struct pd_registry *reg;
    struct pd_plans *plans;     /* sharded epoch plans in use */
    struct pd_backend *backend; /* where ids come from (CPU SIMD, GPU) */
    struct pd_groups *groups;   /* NCCL delivery groups */
    _Atomic(const pd_access *) access; /* allow_uids and the token (SIGHUP replaces it) */
    unsigned workers;
    uint64_t started_ms;        /* pd_clock_ms() at startup */
    _Atomic unsigned long long ring_bytes; /* stream rings alive on every loop (stream_ring_total) */
    _Atomic unsigned long long ring_fds;   /* their descriptors, which permd keeps (a spare is sent again) */
    unsigned long long ring_fds_max;       /* past it new rings are declined: RLIMIT_NOFILE less the rest */
    _Atomic unsigned conns_open[2];        /* admitted connections on every loop: Unix, TCP (their caps) */
    _Atomic unsigned long long upload_bytes; /* shard sizes held by unfinished uploads (upload_memory) */
    _Atomic unsigned long long output_bytes; /* output every connection has queued (output_memory; conn.c counts) */
    _Atomic int registry_writer;             /* a registry write holds the turn (pd_service_write_turn) */
    /* From the wiring, for Stats: every loop's counters added up. */
    void (*totals)(void *ctx, struct pd_stats_view *v);
    void *totals_ctx;
} pd_service;

/* One event loop's share: its counters, the ids it may still generate itself this iteration, its
 * readahead queue. Touched only by its loop's thread (counters are read by others). */
typedef struct pd_loop {
    pd_service *svc;
    uv_loop_t *uv;
    unsigned index;          /* for logs (0: the loop that listens) */
    pd_stats stats;
    pd_metrics metrics;
    uint64_t inline_left;    /* ids the loop may still generate itself this iteration */
    uv_check_t budget;       /* refills inline_left once per loop iteration */
    struct pd_ra_queue *ra;  /* connections with a readahead to generate */
    int stopping;
} pd_loop;

/* One connection's requests: who it is, what it has open. */
typedef struct pd_session {
    pd_conn *conn;
    pd_loop *loop;
    pd_service *svc;               /* loop->svc */
    pd_arena arena;                /* the current request is unpacked here */
    unsigned authed : 1;           /* may send requests other than Hello */
    unsigned admitted : 1;         /* counted in svc->conns_open[is_tcp] */
    struct pd_streams *streams;    /* open streams and the kept ring (daemon/stream.c) */
    struct pd_upload *upload;      /* a sharded PutDataset arriving in parts (daemon/datasets.c) */
    struct pd_readahead *ra;       /* its predicted next Fetch (daemon/readahead.c) */
} pd_session;

/* Start the loop's inline budget (a check handle on uv). */
void pd_loop_init(pd_loop *l, pd_service *svc, uv_loop_t *uv, unsigned index);
/* Close its handle (the loop then runs it down). */
void pd_loop_close(pd_loop *l);

/* Whether count ids may be generated on the loop now (and take them from this iteration's budget):
 * at most inline_ids per iteration, so one busy client cannot hold the loop. A worker-pool hop costs
 * the loop more than generating tens of thousands of ids with SIMD (bench/results/serve.md), so
 * only what exceeds the budget goes to the pool. */
int pd_loop_take_inline(pd_loop *l, uint64_t count);

/* The session's peer proved who it is (a good Hello): full frames, no deadline. */
void pd_session_authenticate(pd_session *s);

/* Registry writes (puts, deletes) take turns on the worker pool: the registry commits one at a time, and a write
 * waiting for its write lock, or for another process's lock up to registry_busy_ms, or a slow fsync, held a
 * worker meanwhile, so a few puts starved every Fetch, Stream and Digest of the pool. On a worker: 1 when this
 * write has the turn (end it with pd_service_write_done); 0 when another has it, after a pause (200 µs) that
 * keeps the retries cheap: the job then gives its worker back and queues again (pd_job_continue). */
int pd_service_write_turn(pd_service *svc);
void pd_service_write_done(pd_service *svc);
/* From the done callback of a write that did not get the turn: 1 when it is queued again (done must return at
 * once), else 0 with *rc the error it ends with (PD_ECLOSED: its peer left; PD_EINTERNAL: libuv refused) and why. */
int pd_service_write_again(pd_job *job, int *rc, char *why, size_t len);

#endif
