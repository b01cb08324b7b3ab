/* Transport: one client connection (frames in, a batched output buffer, backpressure, lifetime), knowing nothing of requests. */
#ifndef PD_CONN_H
#define PD_CONN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/metrics.h"

/*
 * A connection reads length-prefixed frames and hands each complete one up through the ops table
 * its owner registered (pd_conn_start), like libuv hands reads to uv_read_start's callbacks. Above
 * it, the session layer (daemon/session.c) decodes requests; below, libuv moves the bytes. Replies
 * are appended to an output buffer that leaves in one write per batch of requests; a connection
 * whose unread output passes output_cap stops reading until it drains (backpressure).
 *
 * A request is handled while its frame is current; if the handler hands work to the pool with a
 * request job (daemon/job.h), the connection is busy: later frames wait, so replies stay in order.
 *
 * Connections of one event loop form a pd_conns set (shutdown, sweeps, counters, limits).
 */

typedef struct pd_conn pd_conn;
typedef struct pd_conns pd_conns;

/* The owner's entry points, each given the session pointer passed to pd_conn_start. */
typedef struct pd_conn_ops {
    /* One complete frame (its payload, prefix removed; valid until the call returns). */
    void (*frame)(void *session, const uint8_t *payload, uint32_t len);
    /* A frame announced larger than the connection's frame limit: reply; the connection then
     * drains and closes. */
    void (*oversize)(void *session, uint32_t announced, uint32_t limit);
    /* Output fell below half the cap (or a job finished): produce more (stream batches). */
    void (*writable)(void *session);
    /* Every request is answered and none will come (EOF; or permd is stopping: shutdown = 1):
     * send any last messages (StreamEnd). The connection then drains and closes. Returns nonzero
     * when the peer may still be sending (it had streams: credits in flight), so that a stopping
     * permd waits for its EOF rather than reset it; 0 lets an idle peer's connection close at once. */
    int (*end)(void *session, int shutdown);
    /* Stop producing: the connection is draining after an error (closing = 0) or closing now (1). */
    void (*stop)(void *session, int closing);
    /* The connection is freed and no job refers to it any more: free the session. */
    void (*free)(void *session);
    /* A deadline passed (why: PD_CONN_DEADLINE, set with pd_conn_set_deadline, or PD_CONN_FRAME, a
     * frame not complete within frame_timeout_ms): reply; the connection then drains and closes. */
    void (*expired)(void *session, int why);
    /* The alarm set with pd_conn_set_alarm went off (once); the connection stays open. May be NULL. */
    void (*alarm)(void *session);
} pd_conn_ops;

enum { PD_CONN_DEADLINE = 1, PD_CONN_FRAME = 2 };

/* ---- A loop's set of connections ---------------------------------------------------------- */

typedef struct pd_conn_limits {
    uint64_t output_cap;       /* unread output beyond this pauses reading and producing */
    /* Output of every connection together, the sets of all loops sharing *output_total (the caller's, NULL:
     * not counted): past output_memory (0: no bound), a connection that has output of its own queued pauses
     * as at output_cap, while one with none may still produce its next reply, so that clients that do not
     * read hold up at most this much and cannot starve the ones that do. */
    uint64_t output_memory;
    _Atomic unsigned long long *output_total;
    uint32_t max_frame;        /* the largest frame read */
    uint64_t frame_timeout_ms; /* a frame must arrive whole within this of its first byte; 0: no limit */
    uint64_t linger_ms;        /* after a closing error: input discarded this long, waiting for the peer's EOF;
                                  0: closed once the error is written */
    uint64_t stop_linger_ms;   /* the same while permd stops, for a peer that may still send (credits): it
                                  must not lose its last messages to a reset (shutdown_timeout_ms) */
} pd_conn_limits;

/* A set on loop; counters go to stats and metrics (the loop's, owned by the caller). idle(ctx) is
 * called whenever a connection or job goes away while the set is stopping and none is left. */
int pd_conns_create(uv_loop_t *loop, const pd_conn_limits *lim, pd_stats *stats, pd_metrics *metrics,
                    void (*idle)(void *ctx), void *ctx, pd_conns **out);
/* Free the set (after every connection is gone). NULL is a no-op. */
void pd_conns_free(pd_conns *set);
uv_loop_t *pd_conns_loop(const pd_conns *set);
/* Whether nothing is left: no connection, no job. */
int pd_conns_empty(const pd_conns *set);
/* Permd is stopping: each connection ends its streams, answers what it was asked, and closes. */
void pd_conns_shutdown(pd_conns *set);
int pd_conns_stopping(const pd_conns *set);
/* Close every connection now. */
void pd_conns_close_all(pd_conns *set);
/* Close connections whose linger after an error has passed, and expire those past a deadline or
 * holding a partial frame too long (call periodically). */
void pd_conns_sweep(pd_conns *set, uint64_t now_ms);
/* Worker-pool jobs in flight for this set's connections. */
unsigned pd_conns_jobs(const pd_conns *set);

/* ---- Opening --------------------------------------------------------------------------------- */

/* A connection from a listener of the set's loop, or from a descriptor accepted elsewhere (the
 * connection owns fd from now on, even on failure). It does nothing until pd_conn_start. */
int pd_conn_accept(pd_conns *set, uv_stream_t *listener, int is_tcp, pd_conn **out);
int pd_conn_adopt(pd_conns *set, int fd, int is_tcp, pd_conn **out);

/* A connection with no socket: what it sends goes to sink(ctx, bytes, len) at once, and its input
 * is given with pd_conn_input; is_tcp: it passes for a TCP peer (token authentication applies).
 * For tests of the layers above. */
int pd_conn_open_memory(pd_conns *set, int is_tcp, void (*sink)(void *ctx, const uint8_t *data, size_t len),
                        void *ctx, pd_conn **out);
/* Bytes for a memory connection, as if read from a socket (len 0: EOF). */
void pd_conn_input(pd_conn *c, const uint8_t *data, size_t len);

/* Register the owner and start reading. */
void pd_conn_start(pd_conn *c, const pd_conn_ops *ops, void *session);

/* ---- Facts ------------------------------------------------------------------------------------- */

int pd_conn_is_tcp(const pd_conn *c);
uint64_t pd_conn_serial(const pd_conn *c); /* for logs; unique in the process */
/* The socket's descriptor (SO_PEERCRED, sendmsg); PD_EUNSUPPORTED for a memory connection. */
int pd_conn_fd(const pd_conn *c, int *fd);
/* The peer's address as text ("127.0.0.1:5555", "unix"), for logs. */
const char *pd_conn_peer(pd_conn *c);
/* Whether replies may still be sent (not closing or draining). */
int pd_conn_open(const pd_conn *c);
/* Closed, or permd is stopping: long jobs give up (any thread). */
int pd_conn_cancelled(const pd_conn *c);

/* Whether the peer is gone, looked at now: it closed both directions (a Unix peer that closed its socket
 * or exited) or the connection failed (a TCP reset). A connection busy with a long request reads nothing
 * meanwhile, so its EOF would wait for the request to end; a job that runs in turns asks between them
 * (pd_job_continue). A half-close (the peer shut down its writing half) is not gone: it still reads its
 * answer. 0 for memory connections, for a TCP peer that closed with a FIN (indistinguishable from a
 * half-close until permd writes), and while unsure. */
int pd_conn_peer_gone(pd_conn *c);
/* Change the frame limit (e.g. while the peer is not authenticated). */
void pd_conn_set_max_frame(pd_conn *c, uint32_t max_frame);
/* Expire the connection at at_ms (pd_clock_ms; 0: never), e.g. until it authenticates. */
void pd_conn_set_deadline(pd_conn *c, uint64_t at_ms);
/* Call ops->alarm once at at_ms (pd_clock_ms; 0: never), as pd_conns_sweep finds it passed (within its
 * period); unlike a deadline it closes nothing. One alarm a connection: a new one replaces it. */
void pd_conn_set_alarm(pd_conn *c, uint64_t at_ms);

/* ---- Requests --------------------------------------------------------------------------------- */

/* The current frame decoded as request `id` of metrics slot `slot` (its type's name: a static
 * string): it is timed under that slot (until then a frame is PD_REQ_INVALID, "invalid"). */
void pd_conn_request_begin(pd_conn *c, uint64_t id, int slot, const char *name);
/* The current request's metrics slot. */
int pd_conn_request_slot(const pd_conn *c);

/* ---- Output --------------------------------------------------------------------------------- */

/* Room for n bytes after the buffered output: fill them and pd_conn_commit(n). NULL on PD_ENOMEM
 * or when the connection is closing. */
uint8_t *pd_conn_reserve(pd_conn *c, size_t n);
void pd_conn_commit(pd_conn *c, size_t n);

/* Append a bulk frame: copy its header and return where len payload bytes go, aligned to `align`
 * (a power of two ≤ 16); fill them, then call pd_conn_bulk_end. NULL on PD_ENOMEM. */
uint8_t *pd_conn_bulk_begin(pd_conn *c, const uint8_t *hdr, size_t hdr_len, size_t len, unsigned align);
void pd_conn_bulk_end(pd_conn *c, const uint8_t *payload);

/* Send bytes with a file descriptor riding on the first (SCM_RIGHTS; Unix sockets only). The
 * kernel holds its own reference once this returns 0. Only when no output is buffered or queued
 * (else the bytes would overtake it): PD_EBUSY then, or when the socket is full; PD_EUNSUPPORTED on
 * TCP and memory connections, PD_EIO when the peer is gone (left for the connection's next read or
 * write to find). Like every write it may close the connection. */
int pd_conn_send_fd(pd_conn *c, const uint8_t *data, size_t len, int fd);

/* Queue data that lives in a malloc'd block `base` of cap bytes; the connection frees it once written, or
 * keeps it for pd_conn_take_block when it is large (cap 0: never kept). Flushes the output buffer first,
 * so order is kept. */
void pd_conn_write_owned(pd_conn *c, void *base, size_t cap, const uint8_t *data, size_t len);
/* The connection's kept block (a large one written out before; see pd_conn_write_owned) for a reply of need
 * bytes, when need is large (above 256 KiB) and the block holds it but not twice over: the caller owns it,
 * *cap gets its size. Else NULL (malloc one); a kept block that did not fit is freed. On the loop's thread.
 * A block no large reply asked for since the last pd_conns_sweep is freed by the next. */
void *pd_conn_take_block(pd_conn *c, size_t need, size_t *cap);

/* Write the output buffer: what the socket takes now, the rest queued. */
void pd_conn_flush(pd_conn *c);

/* ---- Backpressure --------------------------------------------------------------------------- */

/* Output queued or promised beyond output_cap, or any while all connections' output is past output_memory:
 * stop producing for it. */
int pd_conn_congested(const pd_conn *c);
/* The same, and a congested connection counts as paused (one backpressure pause per episode). */
int pd_conn_note_congestion(pd_conn *c);
/* Output dropped below half the cap, and none is queued or all connections' output is within output_memory
 * (a write completed, a job finished): resume reading requests and call ops.writable. */
void pd_conn_maybe_resume(pd_conn *c);

/* ---- Lifetime ------------------------------------------------------------------------------- */

void pd_conn_ref(pd_conn *c);
void pd_conn_unref(pd_conn *c);
/* Close now (queued output is dropped). */
void pd_conn_close(pd_conn *c);
/* Stop reading, close once queued output is written (after an error reply). */
void pd_conn_drain_close(pd_conn *c);

/* ---- For daemon/job.c: work in flight on a connection's behalf ---------------------------- */

/* A job starts: out_bytes of reply are promised (they count toward the cap); request = 1 when it
 * finishes the current request (the connection is busy until pd_conn_job_end). */
void pd_conn_job_begin(pd_conn *c, size_t out_bytes, int request);
/* The job ran: its output is no longer promised (before its done callback replies). */
void pd_conn_job_settle(pd_conn *c, size_t out_bytes);
/* It was queued again to run once more (pd_job_continue): promised and counted again. */
void pd_conn_job_hold(pd_conn *c, size_t out_bytes);
/* Its done callback returned: a request job's connection goes on with the next request. */
void pd_conn_job_end(pd_conn *c, int request);
uv_loop_t *pd_conn_loop(const pd_conn *c);

#endif
