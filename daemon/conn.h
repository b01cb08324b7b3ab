/* One client connection: incremental frame input, a batched output buffer, backpressure and lifetime. */
#ifndef PD_CONN_H
#define PD_CONN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/ring.h"
#include "daemon/server.h"
#include "proto/arena.h"
#include "proto/frame.h"

struct pd_stream;

typedef struct pd_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_pipe_t pipe;
        uv_tcp_t tcp;
    } h;
    pd_server *srv;
    struct pd_conn *prev, *next;
    uint64_t serial; /* for logs */

    pd_frame_reader in;
    pd_arena arena; /* requests are unpacked here; reset per frame */

    /* Replies accumulate in out[out_start, out_start + out_len) and leave in
     * one write per batch of requests. When the kernel takes only part, the
     * buffer itself is handed to a queued uv_write (no copy) and a new one
     * is started. */
    uint8_t *out;
    size_t out_start, out_len, out_cap;
    uint8_t *spare; /* a written-out buffer kept for reuse */
    size_t spare_cap;
    uint8_t *bulk_at; /* pd_conn_bulk_begin's target, when it had to realign */
    size_t bulk_len;

    size_t job_bytes; /* reply bytes that in-flight jobs will add */
    atomic_int cancel; /* closed, or permd is stopping: long jobs give up (pd_job_cancelled) */
    struct pd_stream *streams;
    unsigned nstreams;
    struct pd_upload *upload; /* a sharded PutDataset arriving in parts */
    struct pd_readahead *ra;  /* its predicted next Fetch (daemon/readahead.c), once it fetched */
    pd_ring spare_ring;       /* its last ring stream's ring, for the next one (daemon/stream.c) */
    unsigned refs; /* the handle, plus one per job in flight */
    uint64_t linger_until; /* after an error: when to give up waiting for the peer's EOF */
    uv_shutdown_t shutdown_req;

    /* The request being handled, for metrics and the request log line. */
    uint64_t req_id;
    uint64_t req_t0; /* uv_hrtime() when its frame was complete */
    int req_slot;    /* pd_metrics slot (daemon/metrics.h) */

    unsigned is_tcp : 1;
    unsigned authed : 1;
    unsigned reading : 1;  /* uv_read_start is in effect */
    unsigned busy : 1;     /* a request's job is in flight: later requests wait (replies stay in order) */
    unsigned draining : 1; /* closing once queued output is written */
    unsigned closing : 1;  /* uv_close called */
    unsigned paused : 1;   /* stopped reading because of the output cap */
    unsigned eof : 1;      /* the peer will send nothing more */
    unsigned shut : 1;     /* uv_shutdown sent: discarding input until EOF or linger_until */
    unsigned req_typed : 1; /* the request's Envelope decoded (pd_conn_request_begin ran) */
} pd_conn;

/* Accept a pending connection on a listener. */
void pd_conn_accept(pd_server *srv, uv_stream_t *listener, int is_tcp);
/* Serve a socket another loop accepted (pd_server_dispatch); srv's loop owns it from now on. */
void pd_conn_adopt(pd_server *srv, int fd, int is_tcp);

/* Whether replies may still be sent (not closing or draining). */
int pd_conn_open(const pd_conn *c);
void pd_conn_ref(pd_conn *c);
void pd_conn_unref(pd_conn *c);

/* Output queued or promised beyond output_cap: stop producing for it. */
int pd_conn_congested(const pd_conn *c);
/* The same, and a congested connection counts as paused (one backpressure
 * pause per episode; pd_conn_maybe_resume ends it). */
int pd_conn_note_congestion(pd_conn *c);

/* Output dropped below half the cap (a write completed, a job finished):
 * resume reading requests and producing stream batches. Output written
 * synchronously completes no write request, so job completions call this too. */
void pd_conn_maybe_resume(pd_conn *c);

/* Handle the complete frames buffered so far, as far as busy/congestion
 * allow, then flush and set reading on or off. Call after anything that
 * may unblock the connection. */
void pd_conn_process(pd_conn *c);

/* A request's job finished (its reply, if any, is queued): clear busy and
 * go on with the next buffered request, or finish closing. */
void pd_conn_job_done(pd_conn *c);

/* The handler decoded a request (Envelope id and body): count it by type. */
void pd_conn_request_begin(pd_conn *c, uint64_t id, int body_case);

/* ---- Output ---------------------------------------------------------------- */

/* Append a packed envelope. PD_ENOMEM. */
int pd_conn_send(pd_conn *c, const pd_envelope *env);
/* Send a packed envelope with a file descriptor in its first byte
 * (SCM_RIGHTS; Unix sockets only). The kernel holds its own reference once
 * this returns 0. Only when no output is buffered or queued (else the frame
 * would overtake it): PD_EBUSY then, or when the socket is full;
 * PD_EUNSUPPORTED on TCP, PD_EIO when the peer is gone (left for the
 * connection's next read or write to find). Like every write it may close
 * the connection (libuv refusing the rest of a partial send). */
int pd_conn_send_fd(pd_conn *c, const pd_envelope *env, int fd);
/* Append an Error reply and count it. */
void pd_conn_send_error(pd_conn *c, uint64_t id, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Append a bulk frame: copy its header (pd_frame_bulk_header) and return
 * where len payload bytes go, aligned to `align` (a power of two ≤ 16);
 * fill them, then call pd_conn_bulk_end. NULL on PD_ENOMEM. */
uint8_t *pd_conn_bulk_begin(pd_conn *c, const uint8_t *hdr, size_t hdr_len, size_t len, unsigned align);
void pd_conn_bulk_end(pd_conn *c, const uint8_t *payload);

/* Queue data that lives in a malloc'd block `base`; the connection frees it
 * once written. Flushes the output buffer first, so order is kept. */
void pd_conn_write_owned(pd_conn *c, void *base, const uint8_t *data, size_t len);

/* Write the output buffer: uv_try_write, the rest queued. */
void pd_conn_flush(pd_conn *c);

/* Close now (queued output is dropped). */
void pd_conn_close(pd_conn *c);
/* Stop reading, close once queued output is written (after an error reply). */
void pd_conn_drain_close(pd_conn *c);

/* Server shutdown: stop reading, end streams, close when idle. */
void pd_conn_shutdown(pd_conn *c);

/* Close a connection whose linger time has passed (the server's sweep timer). */
void pd_conn_sweep(pd_conn *c, uint64_t now_ms);

#endif
