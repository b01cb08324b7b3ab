/* Operational counters by request type (requests, errors by code, latency histogram) and their exports: Prometheus text and StatsReply. */
#ifndef PD_METRICS_H
#define PD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "proto/arena.h"
#include "proto/frame.h"

struct pd_server;

/* Request types are slots: one per Envelope body field of the request range
 * (10-29, named by the protobuf descriptor, so a new request type is counted
 * without touching this module), then three of no body. */
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
    PD_REJECT_NREASONS,
} pd_reject_reason;

/* A counter one serving loop writes and any thread may read (Stats and /metrics add up every loop's):
 * atomic, so those reads are defined; uncontended, so an increment costs a few nanoseconds. */
typedef _Atomic uint64_t pd_counter;

typedef struct pd_metrics {
    pd_counter requests[PD_REQ_NTYPES];
    pd_counter errors[PD_REQ_NTYPES][PD_METRICS_CODES];
    pd_counter latency[PD_REQ_NTYPES][PD_LATENCY_NBOUNDS + 1];
    pd_counter latency_sum_ns[PD_REQ_NTYPES];
    pd_counter bytes_in;
    pd_counter rejected[PD_REJECT_NREASONS];
} pd_metrics;

/* into += what (a snapshot of another loop's counters). */
void pd_metrics_add(pd_metrics *into, const pd_metrics *what);

/* The bucket bounds in microseconds (PD_LATENCY_NBOUNDS of them). */
extern const uint64_t pd_latency_bounds_us[PD_LATENCY_NBOUNDS];

/* The slot of an Envelope body (its field number or PERMD__V1__ENVELOPE__BODY__NOT_SET). */
int pd_metrics_slot(int body_case);
/* "fetch", "put_dataset", …, "unknown", "invalid", "connection"; NULL for a
 * request field the protocol does not define. */
const char *pd_metrics_slot_name(int slot);
const char *pd_metrics_reject_name(pd_reject_reason r);

void pd_metrics_request(pd_metrics *m, int slot);
void pd_metrics_error(pd_metrics *m, int slot, Permd__V1__ErrorCode code);
void pd_metrics_latency(pd_metrics *m, int slot, uint64_t ns);

/* The Prometheus text exposition (format 0.0.4) of everything the server
 * counts, in a malloc'd buffer. PD_ENOMEM. */
int pd_metrics_render(struct pd_server *s, char **out, size_t *len);

/* Fill the StatsReply fields: the flat counters (every serving loop's, added
 * up) and the by-type tables, whose arrays are allocated in the arena. PD_ENOMEM. */
int pd_metrics_fill_stats(struct pd_server *s, Permd__V1__StatsReply *r, pd_arena *arena);

#endif
