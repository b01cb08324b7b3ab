/* Operational counters: per-loop totals (pd_stats) and per-request-type tables (pd_metrics); no I/O, no protocol. */
#ifndef PD_METRICS_H
#define PD_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* Request types are slots: one per Envelope body field of the request range (10-29; daemon/reqtype.h
 * names them), then three of no body. */
enum {
    PD_REQ_FIELD_FIRST = 10,
    PD_REQ_FIELD_LAST = 29,
    PD_REQ_UNKNOWN = PD_REQ_FIELD_LAST - PD_REQ_FIELD_FIRST + 1, /* an empty, unknown or server-only body */
    PD_REQ_INVALID,    /* not an Envelope, or above max_frame */
    PD_REQ_CONNECTION, /* errors about the connection itself (refused at accept) */
    PD_REQ_NTYPES,
};

#define PD_METRICS_CODES 16       /* wire ErrorCode values counted (higher ones land in the last) */
#define PD_LATENCY_NBOUNDS 19     /* finite bucket bounds; one more bucket is +Inf */

typedef enum pd_reject_reason {
    PD_REJECT_MAX_CONNECTIONS,
    PD_REJECT_PEER_UID,
    PD_REJECT_MAX_TCP_CONNECTIONS,
    PD_REJECT_NREASONS,
} pd_reject_reason;

/* Connections closed because a deadline passed. */
typedef enum pd_expire_reason {
    PD_EXPIRE_HELLO,  /* no good Hello within hello_timeout_ms */
    PD_EXPIRE_FRAME,  /* a frame not whole within frame_timeout_ms */
    PD_EXPIRE_NREASONS,
} pd_expire_reason;

/* Why a stream that asked for a shared-memory ring got none (its ids then go through the socket). */
typedef enum pd_ring_decline {
    PD_RING_DECLINE_TCP,         /* descriptors do not cross TCP */
    PD_RING_DECLINE_OFF,         /* stream_ring_max is 0 */
    PD_RING_DECLINE_MAX,         /* larger than stream_ring_max */
    PD_RING_DECLINE_TOTAL,       /* past stream_ring_total */
    PD_RING_DECLINE_DESCRIPTORS, /* past the descriptors left to rings */
    PD_RING_DECLINE_MEMORY,      /* the memfd could not be made */
    PD_RING_DECLINE_SOCKET_BUSY, /* output already queued: the descriptor cannot go with the frame */
    PD_RING_DECLINE_NREASONS,
} pd_ring_decline;

/* A counter one serving loop writes and any thread may read (Stats and /metrics add up every loop's):
 * atomic, so those reads are defined; uncontended, so an increment costs a few nanoseconds. */
typedef _Atomic uint64_t pd_counter;

/* One serving loop's totals. */
typedef struct pd_stats {
    pd_counter connections_total;
    pd_counter requests_total;
    pd_counter errors_total;
    pd_counter ids_served_total;
    pd_counter bytes_out_total;
    pd_counter streams_total;
    pd_counter backpressure_pauses;
    pd_counter output_memory_pauses; /* those of connections within output_cap: every connection's output past output_memory */
    pd_counter mix_orders_built;   /* sharded component orders mixtures' cursors built, O(S_j) each (daemon/target.c) */
    pd_counter readahead_hits;     /* Fetches answered from a readahead (daemon/readahead.c) */
    pd_counter inline_deferred;    /* loop work handed to a worker, which would have blocked (daemon/target.h) */
    pd_counter stream_rings_total; /* streams delivered through a shared-memory ring (daemon/ring.c) */
    pd_counter uploads_expired;    /* sharded uploads dropped at upload_timeout_ms (daemon/datasets.c) */
    pd_counter jobs_total;         /* worker-pool jobs queued, each turn of a long one (daemon/conn.c) */
    pd_counter accept_errors;      /* connections that could not be accepted: descriptors, memory */
    pd_counter connections;
    pd_counter streams_active;
    pd_counter request_memory;     /* gauge: heap the connections' request arenas hold (proto/arena.h) */
    pd_counter readahead_bytes;    /* gauge: the connections' readahead buffers (readahead_bytes each) */
    pd_counter blocks_reused;      /* large reply blocks (stream batches, big Fetches) taken again (daemon/conn.c) */
    pd_counter block_bytes;        /* gauge: the large reply blocks connections keep for their next reply */
} pd_stats;

/* One serving loop's counters by request type. */
typedef struct pd_metrics {
    pd_counter requests[PD_REQ_NTYPES];
    pd_counter errors[PD_REQ_NTYPES][PD_METRICS_CODES];
    pd_counter latency[PD_REQ_NTYPES][PD_LATENCY_NBOUNDS + 1];
    pd_counter latency_sum_ns[PD_REQ_NTYPES];
    pd_counter bytes_in;
    pd_counter rejected[PD_REJECT_NREASONS];
    pd_counter expired[PD_EXPIRE_NREASONS];
    pd_counter rings_declined[PD_RING_DECLINE_NREASONS];
} pd_metrics;

/* into += what (a snapshot of another loop's counters). */
void pd_stats_add(pd_stats *into, const pd_stats *what);
void pd_metrics_add(pd_metrics *into, const pd_metrics *what);

/* The bucket bounds in microseconds (PD_LATENCY_NBOUNDS of them). */
extern const uint64_t pd_latency_bounds_us[PD_LATENCY_NBOUNDS];

/* "max_connections", "peer_uid", "max_tcp_connections". */
const char *pd_metrics_reject_name(pd_reject_reason r);
/* "hello_timeout", "frame_timeout". */
const char *pd_metrics_expire_name(pd_expire_reason r);
/* "tcp", "off", "stream_ring_max", "stream_ring_total", "descriptors", "memory", "socket_busy". */
const char *pd_metrics_ring_decline_name(pd_ring_decline r);

void pd_metrics_request(pd_metrics *m, int slot);
/* code: the wire ErrorCode of the reply. */
void pd_metrics_error(pd_metrics *m, int slot, unsigned code);
void pd_metrics_latency(pd_metrics *m, int slot, uint64_t ns);
/* Errors of every code for one slot. */
uint64_t pd_metrics_slot_errors(const pd_metrics *m, int slot);

#endif
