/* Connections: accept, incremental reads into the frame reader, batched writes, backpressure, orderly close. */
#include "daemon/conn.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/groups.h"
#include "daemon/auth.h"
#include "daemon/handlers.h"
#include "daemon/log.h"
#include "daemon/readahead.h"
#include "daemon/metrics.h"
#include "daemon/stream.h"

#define PD_READ_BASE (16u << 10)    /* per-connection input buffer while frames are small */
#define PD_ARENA_SIZE (16u << 10)   /* unpacked requests; larger ones spill to malloc */
#define PD_OUT_MIN (16u << 10)      /* first output buffer */
#define PD_OUT_KEEP (256u << 10)    /* larger output buffers are freed once written */
#define PD_LINGER_MS 2000u          /* wait this long for the peer's EOF after an error */

/* A queued write; base is freed (or kept as the spare) when it completes. */
typedef struct pd_write {
    uv_write_t req;
    void *base;
    size_t cap; /* nonzero: an output buffer that may be recycled */
} pd_write;

static void pd_conn_update_reading(pd_conn *c);
static void pd_conn_finish_drain(pd_conn *c);

/* Bytes queued in the kernel-bound write queue, buffered, or promised by jobs. */
static size_t pd_conn_pending(const pd_conn *c)
{
    return c->h.stream.write_queue_size + c->out_len + c->job_bytes;
}

int pd_conn_congested(const pd_conn *c)
{
    return pd_conn_pending(c) > c->srv->cfg->output_cap;
}

int pd_conn_open(const pd_conn *c)
{
    return !c->closing && !c->draining;
}

void pd_conn_ref(pd_conn *c)
{
    c->refs++;
}

static void pd_conn_free(pd_conn *c)
{
    pd_server *s = c->srv;
    pd_stream_free_all(c);
    pd_upload_free(c->upload);
    pd_frame_reader_free(&c->in);
    pd_arena_free(&c->arena);
    free(c->out);
    free(c->spare);
    free(c);
    pd_server_maybe_finish(s);
}

void pd_conn_unref(pd_conn *c)
{
    if (--c->refs == 0)
        pd_conn_free(c);
}

static void pd_on_close(uv_handle_t *h)
{
    pd_conn_unref(h->data);
}

void pd_conn_close(pd_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    atomic_store_explicit(&c->cancel, 1, memory_order_relaxed);
    pd_stream_discard_all(c);
    pd_readahead_drop(c);
    pd_groups_conn_gone(c->srv->groups, c);
    if (c->prev)
        c->prev->next = c->next;
    else
        c->srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    c->srv->stats.connections--;
    atomic_fetch_sub(&c->srv->primary->conns_open, 1);
    pd_log_debug("conn_close", "conn=%llu", (unsigned long long)c->serial);
    uv_close(&c->h.handle, pd_on_close);
}

/* ---- Output ------------------------------------------------------------------ */

/* Room for n more bytes after the buffered output. */
static uint8_t *pd_conn_reserve(pd_conn *c, size_t n)
{
    size_t used = c->out_start + c->out_len;
    if (!c->out) {
        size_t cap = used + n > PD_OUT_MIN ? used + n : PD_OUT_MIN;
        if (c->spare && c->spare_cap >= cap) {
            c->out = c->spare;
            c->out_cap = c->spare_cap;
            c->spare = NULL;
            c->spare_cap = 0;
        } else if (!(c->out = malloc(cap))) {
            return NULL;
        } else {
            c->out_cap = cap;
        }
    } else if (c->out_cap - used < n) {
        size_t cap = c->out_cap * 2 > used + n ? c->out_cap * 2 : used + n;
        uint8_t *p = realloc(c->out, cap);
        if (!p)
            return NULL;
        c->out = p;
        c->out_cap = cap;
    }
    return c->out + used;
}

int pd_conn_send(pd_conn *c, const pd_envelope *env)
{
    if (c->closing)
        return PD_ECLOSED;
    size_t n = pd_frame_size(env);
    uint8_t *p = pd_conn_reserve(c, n);
    if (!p)
        return PD_ENOMEM;
    pd_frame_pack(env, p);
    c->out_len += n;
    return 0;
}

static void pd_conn_queue(pd_conn *c, void *base, size_t cap, const uint8_t *data, size_t len);

int pd_conn_send_fd(pd_conn *c, const pd_envelope *env, int fd)
{
    if (c->is_tcp)
        return PD_EUNSUPPORTED;
    if (c->closing)
        return PD_ECLOSED;
    if (c->out_len || c->h.stream.write_queue_size)
        return PD_EBUSY;
    uv_os_fd_t sock;
    if (uv_fileno(&c->h.handle, &sock))
        return PD_EUNSUPPORTED;
    size_t len = pd_frame_size(env);
    uint8_t *frame = malloc(len);
    if (!frame)
        return PD_ENOMEM;
    pd_frame_pack(env, frame);
    union { /* aligned for cmsghdr */
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = frame, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    ssize_t n;
    do /* libuv made the socket non-blocking; its write queue is empty, so the bytes go in order */
        n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        free(frame);
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return PD_EBUSY;
        /* The peer is gone: the connection's next read or write finds out and closes it. */
        pd_log_debug("conn_write", "conn=%llu err=%s", (unsigned long long)c->serial, strerror(errno));
        return PD_EIO;
    }
    c->srv->stats.bytes_out_total += len;
    if ((size_t)n == len) {
        free(frame);
        return 0;
    }
    pd_conn_queue(c, frame, 0, frame + n, len - (size_t)n); /* the descriptor went with the first byte */
    return 0;
}

void pd_conn_send_error(pd_conn *c, uint64_t id, int err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    Permd__V1__Error e = PERMD__V1__ERROR__INIT;
    e.code = pd_wire_error_code(err);
    e.message = msg;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_ERROR;
    env.error = &e;
    c->srv->stats.errors_total++;
    pd_metrics_error(&c->srv->metrics, c->req_slot, e.code);
    pd_log_debug("request_error", "conn=%llu id=%llu code=%s msg=\"%s\"", (unsigned long long)c->serial,
                 (unsigned long long)id, pd_wire_error_name(e.code), msg);
    pd_conn_send(c, &env);
}

uint8_t *pd_conn_bulk_begin(pd_conn *c, const uint8_t *hdr, size_t hdr_len, size_t len, unsigned align)
{
    if (c->out_len == 0) /* a fresh buffer: start it so the payload lands aligned */
        c->out_start = (align - hdr_len % align) % align;
    uint8_t *p = pd_conn_reserve(c, hdr_len + len + align);
    if (!p)
        return NULL;
    memcpy(p, hdr, hdr_len);
    c->bulk_at = p + hdr_len;
    c->bulk_len = hdr_len + len;
    uintptr_t a = ((uintptr_t)c->bulk_at + align - 1) & ~(uintptr_t)(align - 1);
    return (uint8_t *)a;
}

void pd_conn_bulk_end(pd_conn *c, const uint8_t *payload)
{
    size_t hdr_len = (size_t)(c->bulk_at - (c->out + c->out_start + c->out_len));
    if (payload != c->bulk_at) /* generated at the next aligned address: slide it down */
        memmove(c->bulk_at, payload, c->bulk_len - hdr_len);
    c->out_len += c->bulk_len;
    c->bulk_at = NULL;
}

static void pd_on_write(uv_write_t *req, int status)
{
    pd_write *w = (pd_write *)req;
    pd_conn *c = req->handle->data;
    if (w->cap && w->cap <= PD_OUT_KEEP && !c->spare) {
        c->spare = w->base;
        c->spare_cap = w->cap;
    } else {
        free(w->base);
    }
    free(w);
    if (c->closing)
        return;
    if (status < 0) {
        pd_log_debug("conn_write", "conn=%llu err=%s", (unsigned long long)c->serial, uv_err_name(status));
        pd_conn_close(c);
        return;
    }
    if (c->draining) {
        pd_conn_finish_drain(c);
        return;
    }
    pd_conn_maybe_resume(c);
}

void pd_conn_maybe_resume(pd_conn *c)
{
    /* Resume below half the cap, so a slow reader does not flap on every write. */
    if (!pd_conn_open(c) || pd_conn_pending(c) > c->srv->cfg->output_cap / 2)
        return;
    /* Requests first: a Cancel or Credit waiting behind the pause should
     * count before the streams produce again. */
    if (c->paused || c->eof || c->srv->stopping) {
        c->paused = 0;
        pd_conn_process(c);
    }
    if (c->nstreams && pd_conn_open(c)) {
        pd_stream_pump(c);
        pd_conn_flush(c); /* a batch generated inline waits in the output buffer */
    }
}

/* Hand data inside the block base to libuv; base is released when written. */
static void pd_conn_queue(pd_conn *c, void *base, size_t cap, const uint8_t *data, size_t len)
{
    pd_write *w = malloc(sizeof *w);
    if (!w) {
        free(base);
        pd_conn_close(c);
        return;
    }
    w->base = base;
    w->cap = cap;
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
    if (uv_write(&w->req, &c->h.stream, &b, 1, pd_on_write)) {
        free(base);
        free(w);
        pd_conn_close(c);
    }
}

/* Write what the kernel takes now; 0..len, or a negative libuv error. */
static int pd_conn_try_write(pd_conn *c, const uint8_t *data, size_t len)
{
    if (c->h.stream.write_queue_size) /* keep order behind queued writes */
        return 0;
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
    int n = uv_try_write(&c->h.stream, &b, 1);
    return n == UV_EAGAIN || n == UV_ENOSYS ? 0 : n;
}

void pd_conn_flush(pd_conn *c)
{
    if (c->closing || c->out_len == 0)
        return;
    c->srv->stats.bytes_out_total += c->out_len;
    int n = pd_conn_try_write(c, c->out + c->out_start, c->out_len);
    if (n < 0) {
        pd_log_debug("conn_write", "conn=%llu err=%s", (unsigned long long)c->serial, uv_err_name(n));
        pd_conn_close(c);
        return;
    }
    if ((size_t)n == c->out_len) {
        c->out_start = c->out_len = 0;
        if (c->out_cap > PD_OUT_KEEP) { /* do not keep a burst's buffer per idle connection */
            free(c->out);
            c->out = NULL;
            c->out_cap = 0;
        }
        return;
    }
    /* The rest leaves with the buffer itself; the next reply starts a new one. */
    uint8_t *base = c->out;
    size_t cap = c->out_cap, at = c->out_start + (size_t)n, len = c->out_len - (size_t)n;
    c->out = NULL;
    c->out_cap = c->out_start = c->out_len = 0;
    pd_conn_queue(c, base, cap, base + at, len);
}

void pd_conn_write_owned(pd_conn *c, void *base, const uint8_t *data, size_t len)
{
    if (c->closing) {
        free(base);
        return;
    }
    pd_conn_flush(c);
    if (c->closing) {
        free(base);
        return;
    }
    c->srv->stats.bytes_out_total += len;
    int n = pd_conn_try_write(c, data, len);
    if (n < 0) {
        free(base);
        pd_conn_close(c);
        return;
    }
    if ((size_t)n == len) {
        free(base);
        return;
    }
    pd_conn_queue(c, base, 0, data + n, len - (size_t)n);
}

/* ---- Input ------------------------------------------------------------------- */

static void pd_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    pd_conn *c = h->data;
    uint8_t *p;
    size_t len;
    (void)suggested;
    if (pd_frame_reader_space(&c->in, &p, &len)) {
        *buf = uv_buf_init(NULL, 0); /* read_cb gets UV_ENOBUFS */
        return;
    }
    if (len > (1u << 30))
        len = 1u << 30;
    *buf = uv_buf_init((char *)p, (unsigned)len);
}

static void pd_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    pd_conn *c = st->data;
    (void)buf;
    if (c->closing)
        return;
    if (nread > 0) {
        pd_frame_reader_commit(&c->in, (size_t)nread);
        c->srv->metrics.bytes_in += (uint64_t)nread;
        if (c->draining) { /* closing after an error: input is ignored */
            pd_frame_reader_discard(&c->in);
            return;
        }
        pd_conn_process(c);
        return;
    }
    if (nread == 0)
        return;
    if (nread != UV_EOF || c->draining) {
        if (nread != UV_EOF)
            pd_log_debug("conn_read", "conn=%llu err=%s", (unsigned long long)c->serial, uv_err_name((int)nread));
        pd_conn_close(c);
        return;
    }
    /* EOF: answer what was already sent, then close. */
    c->eof = 1;
    pd_conn_process(c);
}

int pd_conn_note_congestion(pd_conn *c)
{
    int congested = pd_conn_congested(c);
    if (congested && !c->paused) { /* pd_on_write resumes it once the queue drains */
        c->paused = 1;
        c->srv->stats.backpressure_pauses++;
    }
    return congested;
}

static void pd_conn_update_reading(pd_conn *c)
{
    if (c->closing)
        return;
    int want;
    if (c->draining) {
        want = c->shut; /* after shutdown, read only to see EOF */
    } else {
        int congested = pd_conn_note_congestion(c);
        want = !c->eof && !c->busy && !congested;
    }
    if (want && !c->reading) {
        if (uv_read_start(&c->h.stream, pd_on_alloc, pd_on_read) == 0)
            c->reading = 1;
    } else if (!want && c->reading) {
        uv_read_stop(&c->h.stream);
        c->reading = 0;
    }
}

/* ---- Request accounting ------------------------------------------------------ */

/* A complete frame is about to be handled: until its Envelope decodes, it is "invalid". */
static void pd_conn_request_start(pd_conn *c)
{
    c->req_id = 0;
    c->req_slot = PD_REQ_INVALID;
    c->req_typed = 0;
    c->req_t0 = uv_hrtime();
}

void pd_conn_request_begin(pd_conn *c, uint64_t id, int body_case)
{
    c->req_id = id;
    c->req_slot = pd_metrics_slot(body_case);
    c->req_typed = 1;
    pd_metrics_request(&c->srv->metrics, c->req_slot);
}

/* Its reply is queued (or it needs none): observe the latency. */
static void pd_conn_request_end(pd_conn *c)
{
    uint64_t ns = uv_hrtime() - c->req_t0;
    pd_metrics_latency(&c->srv->metrics, c->req_slot, ns);
    pd_log_debug("request", "conn=%llu id=%llu type=%s us=%llu", (unsigned long long)c->serial,
                 (unsigned long long)c->req_id, pd_metrics_slot_name(c->req_slot), (unsigned long long)(ns / 1000));
}

void pd_conn_process(pd_conn *c)
{
again:
    while (pd_conn_open(c) && !c->busy && !pd_conn_congested(c)) {
        const uint8_t *payload;
        uint32_t len;
        int rc = pd_frame_reader_next(&c->in, &payload, &len);
        if (rc == 0)
            break;
        pd_conn_request_start(c);
        if (rc < 0) {
            uint32_t announced = pd_load_le32(c->in.buf + c->in.start);
            c->srv->stats.requests_total++;
            pd_metrics_request(&c->srv->metrics, PD_REQ_INVALID);
            pd_conn_send_error(c, 0, PD_ETOOBIG, "frame of %u bytes exceeds max_frame (%u bytes)", announced,
                               c->in.max_frame);
            pd_conn_request_end(c);
            pd_conn_drain_close(c);
            return;
        }
        pd_handle_frame(c, payload, len);
        if (!c->req_typed)
            pd_metrics_request(&c->srv->metrics, PD_REQ_INVALID);
        if (!c->busy)
            pd_conn_request_end(c);
    }
    if (pd_conn_open(c) && !c->busy && (c->eof || c->srv->stopping) && !pd_conn_congested(c)) {
        /* Nothing more will be asked (or permd is stopping): close after the replies. */
        pd_stream_end_all(c, c->srv->stopping ? PERMD__V1__END_REASON__END_REASON_SHUTDOWN
                                              : PERMD__V1__END_REASON__END_REASON_CANCELLED);
        pd_conn_drain_close(c);
        return;
    }
    int congested = pd_conn_congested(c);
    pd_conn_flush(c);
    /* Replies built inline wait in the output buffer, which counts toward the
     * cap until flushed. If the flush relieved the congestion, frames already
     * read must be handled now: no read event will come for them, and no
     * write completion either when the kernel took everything. */
    if (congested && pd_conn_open(c) && !c->busy && !pd_conn_congested(c))
        goto again;
    pd_conn_update_reading(c);
}

/* ---- Closing ----------------------------------------------------------------- */

static void pd_on_shutdown(uv_shutdown_t *req, int status)
{
    pd_conn *c = req->handle->data;
    if (status < 0 && !c->closing)
        pd_conn_close(c);
}

/* Once every reply is written: send FIN and wait (bounded) for the peer's
 * EOF, discarding its input, so an error reply is not lost to a TCP reset. */
static void pd_conn_finish_drain(pd_conn *c)
{
    if (!c->draining || c->closing || c->shut || c->busy || c->out_len || c->h.stream.write_queue_size)
        return;
    if (c->eof) {
        pd_conn_close(c);
        return;
    }
    c->shut = 1;
    if (uv_shutdown(&c->shutdown_req, &c->h.stream, pd_on_shutdown)) {
        pd_conn_close(c);
        return;
    }
    c->linger_until = pd_now_ms() + PD_LINGER_MS;
    pd_frame_reader_discard(&c->in);
    pd_conn_update_reading(c);
}

void pd_conn_job_done(pd_conn *c)
{
    c->busy = 0;
    pd_conn_request_end(c);
    if (c->closing)
        return;
    if (c->draining)
        pd_conn_finish_drain(c);
    else
        pd_conn_process(c);
}

void pd_conn_drain_close(pd_conn *c)
{
    if (!pd_conn_open(c))
        return;
    c->draining = 1;
    pd_stream_discard_all(c);
    pd_conn_flush(c);
    if (c->closing)
        return;
    pd_conn_update_reading(c);
    pd_conn_finish_drain(c);
}

void pd_conn_shutdown(pd_conn *c)
{
    if (!pd_conn_open(c))
        return;
    atomic_store_explicit(&c->cancel, 1, memory_order_relaxed);
    pd_stream_end_all(c, PERMD__V1__END_REASON__END_REASON_SHUTDOWN);
    if (c->busy) { /* the job's completion runs pd_conn_process, which closes */
        pd_conn_flush(c);
        pd_conn_update_reading(c);
        return;
    }
    pd_conn_drain_close(c);
}

void pd_conn_sweep(pd_conn *c, uint64_t now_ms)
{
    if (c->shut && !c->closing && now_ms >= c->linger_until)
        pd_conn_close(c);
}

/* ---- Accept ------------------------------------------------------------------ */

static void pd_on_reject_close(uv_handle_t *h)
{
    free(h);
}

/* A connection on s's loop: from a listener of this loop (listener), or a descriptor another loop
 * accepted (fd, already counted in conns_open). */
static void pd_conn_open_on(pd_server *s, uv_stream_t *listener, int fd, int is_tcp)
{
    pd_server *p = s->primary;
    if (listener)
        atomic_fetch_add(&p->conns_open, 1);
    pd_conn *c = calloc(1, sizeof *c);
    if (!c) {
        pd_log_error("accept", "err=ENOMEM");
        if (fd >= 0)
            close(fd);
        atomic_fetch_sub(&p->conns_open, 1);
        return;
    }
    atomic_init(&c->cancel, 0);
    c->spare_ring = PD_RING_NONE;
    if (is_tcp)
        uv_tcp_init(s->loop, &c->h.tcp);
    else
        uv_pipe_init(s->loop, &c->h.pipe, 0);
    c->h.handle.data = c;
    int rc = listener ? uv_accept(listener, &c->h.stream)
                      : is_tcp ? uv_tcp_open(&c->h.tcp, fd) : uv_pipe_open(&c->h.pipe, fd);
    if (rc || pd_frame_reader_init(&c->in, PD_READ_BASE, (uint32_t)s->cfg->max_frame) ||
        pd_arena_init(&c->arena, PD_ARENA_SIZE)) {
        pd_log_warn("accept", "err=%s", rc ? uv_err_name(rc) : "ENOMEM");
        if (rc && fd >= 0)
            close(fd); /* the handle did not take it */
        pd_frame_reader_free(&c->in);
        pd_arena_free(&c->arena);
        uv_close(&c->h.handle, pd_on_reject_close);
        atomic_fetch_sub(&p->conns_open, 1);
        return;
    }
    c->srv = s;
    c->refs = 1;
    c->req_slot = PD_REQ_CONNECTION;
    c->is_tcp = (unsigned)is_tcp;
    c->authed = !(is_tcp && s->token);
    c->serial = atomic_fetch_add(&p->serials, 1) + 1;
    s->stats.connections_total++;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->stats.connections++;
    if (is_tcp)
        uv_tcp_nodelay(&c->h.tcp, 1);
    pd_log_debug("conn_open", "conn=%llu transport=%s", (unsigned long long)c->serial, is_tcp ? "tcp" : "unix");

    if (atomic_load(&p->conns_open) > s->cfg->max_connections) {
        s->metrics.rejected[PD_REJECT_MAX_CONNECTIONS]++;
        pd_log_warn("conn_reject", "conn=%llu reason=max_connections limit=%llu", (unsigned long long)c->serial,
                    (unsigned long long)s->cfg->max_connections);
        pd_conn_send_error(c, 0, PD_EBUSY, "too many connections (max_connections = %llu); retry later",
                           (unsigned long long)s->cfg->max_connections);
        pd_conn_drain_close(c);
        return;
    }
    if (!is_tcp && pd_auth_peer_refused(c))
        return;
    pd_conn_update_reading(c);
}

void pd_conn_accept(pd_server *s, uv_stream_t *listener, int is_tcp)
{
    pd_conn_open_on(s, listener, -1, is_tcp);
}

void pd_conn_adopt(pd_server *s, int fd, int is_tcp)
{
    pd_conn_open_on(s, NULL, fd, is_tcp);
}
