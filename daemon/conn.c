/* Connections: accept, incremental reads into the frame reader, batched writes, backpressure, orderly close. */
#include "daemon/conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/clock.h"
#include "daemon/log.h"
#include "proto/frame.h"

#define PD_READ_BASE (16u << 10)    /* per-connection input buffer while frames are small */
#define PD_OUT_MIN (16u << 10)      /* first output buffer */
#define PD_OUT_KEEP (256u << 10)    /* larger output buffers are freed once written */

struct pd_conns {
    uv_loop_t *loop;
    pd_conn_limits lim;
    pd_stats *stats;
    pd_metrics *metrics;
    void (*idle)(void *ctx);
    void *idle_ctx;
    pd_conn *head;     /* every open connection (doubly linked) */
    unsigned jobs;     /* worker-pool jobs in flight */
    int stopping;
};

struct pd_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_pipe_t pipe;
        uv_tcp_t tcp;
        uv_check_t check; /* a memory connection: a handle only for uv_close's deferred free */
    } h;
    pd_conns *set;
    const pd_conn_ops *ops;
    void *session;
    pd_conn *prev, *next;
    uint64_t serial; /* for logs */

    /* A memory connection (pd_conn_open_memory): output goes here, input comes from pd_conn_input. */
    void (*sink)(void *ctx, const uint8_t *data, size_t len);
    void *sink_ctx;

    pd_frame_reader in;

    /* Replies accumulate in out[out_start, out_start + out_len) and leave in
     * one write per batch of requests. When the kernel takes only part, the
     * buffer itself is handed to a queued uv_write (no copy) and a new one
     * is started. */
    uint8_t *out;
    size_t out_start, out_len, out_cap;
    uint8_t *spare; /* a written-out buffer kept for reuse */
    size_t spare_cap;
    /* A large written-out block (a stream batch's, a big Fetch reply's) kept for the next one: blocks above
     * glibc's mmap threshold (1 MiB, daemon/main.c) would each be mapped and faulted in anew. Dropped by
     * the sweep when no reply took it since the last one, so idle connections keep none. */
    uint8_t *block;
    size_t block_cap;
    uint8_t *bulk_at; /* pd_conn_bulk_begin's target, when it had to realign */
    size_t bulk_len;

    size_t job_bytes;  /* reply bytes that in-flight jobs will add */
    size_t counted;    /* pd_conn_pending as last added to *lim.output_total (pd_conn_count) */
    atomic_int cancel; /* closed, or permd is stopping: long jobs give up */
    unsigned refs;     /* the handle, plus one per job in flight */
    uint64_t linger_until; /* after an error: when to give up waiting for the peer's EOF */
    uint64_t deadline;     /* pd_conn_set_deadline's; 0: none */
    uint64_t alarm;        /* pd_conn_set_alarm's; 0: none */
    uint64_t partial_since; /* when the first byte of the frame being read arrived; 0: none pending */
    uv_shutdown_t shutdown_req;

    /* The request being handled, for metrics and the request log line. */
    uint64_t req_id;
    uint64_t req_t0; /* uv_hrtime() when its frame was complete */
    int req_slot;    /* pd_metrics slot (daemon/metrics.h) */
    const char *req_name; /* its type's name, for the request log line */

    char peer[64];   /* pd_conn_peer's text, once asked */

    unsigned is_tcp : 1;
    unsigned reading : 1;  /* uv_read_start is in effect */
    unsigned busy : 1;     /* a request's job is in flight: later requests wait (replies stay in order) */
    unsigned draining : 1; /* closing once queued output is written */
    unsigned closing : 1;  /* uv_close called */
    unsigned paused : 1;   /* stopped reading, or its streams stopped producing, because of the output cap */
    unsigned resuming : 1; /* pd_conn_maybe_resume is running (an inner call leaves it to the outer one) */
    unsigned eof : 1;      /* the peer will send nothing more */
    unsigned shut : 1;     /* uv_shutdown sent: discarding input until EOF or linger_until */
    unsigned started : 1;  /* pd_conn_start ran: ops are set */
    unsigned quiet : 1;    /* stopping, and the peer has nothing in flight: no need to wait for its EOF */
    unsigned block_used : 1; /* block was taken since the last sweep */
};

/* A queued write; base is freed (or kept as the spare) when it completes. */
typedef struct pd_write {
    uv_write_t req;
    void *base;
    size_t cap; /* nonzero: an output buffer that may be recycled */
} pd_write;

static _Atomic unsigned long long pd_serials; /* connection numbers for logs, unique across loops */

static void pd_conn_update_reading(pd_conn *c);
static void pd_conn_finish_drain(pd_conn *c);
static void pd_conn_process(pd_conn *c);

/* ---- The set ------------------------------------------------------------------------------- */

int pd_conns_create(uv_loop_t *loop, const pd_conn_limits *lim, pd_stats *stats, pd_metrics *metrics,
                    void (*idle)(void *ctx), void *ctx, pd_conns **out)
{
    pd_conns *set = calloc(1, sizeof *set);
    if (!set)
        return PD_ENOMEM;
    set->loop = loop;
    set->lim = *lim;
    set->stats = stats;
    set->metrics = metrics;
    set->idle = idle;
    set->idle_ctx = ctx;
    *out = set;
    return 0;
}

void pd_conns_free(pd_conns *set)
{
    free(set);
}

uv_loop_t *pd_conns_loop(const pd_conns *set)
{
    return set->loop;
}

int pd_conns_empty(const pd_conns *set)
{
    return !set->head && !set->jobs;
}

int pd_conns_stopping(const pd_conns *set)
{
    return set->stopping;
}

unsigned pd_conns_jobs(const pd_conns *set)
{
    return set->jobs;
}

/* Something went away: when stopping and nothing is left, tell the owner. */
static void pd_conns_check_idle(pd_conns *set)
{
    if (set->stopping && pd_conns_empty(set) && set->idle)
        set->idle(set->idle_ctx);
}

/* ---- Facts ---------------------------------------------------------------------------------- */

int pd_conn_is_tcp(const pd_conn *c)
{
    return c->is_tcp;
}

uint64_t pd_conn_serial(const pd_conn *c)
{
    return c->serial;
}

int pd_conn_fd(const pd_conn *c, int *fd)
{
    uv_os_fd_t f;
    if (c->sink || uv_fileno(&c->h.handle, &f))
        return PD_EUNSUPPORTED;
    *fd = f;
    return 0;
}

const char *pd_conn_peer(pd_conn *c)
{
    if (c->peer[0])
        return c->peer;
    struct sockaddr_storage sa;
    int len = sizeof sa;
    char host[INET6_ADDRSTRLEN] = "";
    if (c->sink || !c->is_tcp || uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&sa, &len)) {
        snprintf(c->peer, sizeof c->peer, "%s", c->sink ? "memory" : c->is_tcp ? "tcp:?" : "unix");
    } else if (sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&sa;
        uv_ip6_name(a, host, sizeof host);
        snprintf(c->peer, sizeof c->peer, "[%s]:%u", host, ntohs(a->sin6_port));
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&sa;
        uv_ip4_name(a, host, sizeof host);
        snprintf(c->peer, sizeof c->peer, "%s:%u", host, ntohs(a->sin_port));
    }
    return c->peer;
}

/* Bytes queued in the kernel-bound write queue, buffered, or promised by jobs. */
static size_t pd_conn_pending(const pd_conn *c)
{
    size_t queued = c->sink ? 0 : c->h.stream.write_queue_size;
    return queued + c->out_len + c->job_bytes;
}

/* Bring this connection's share of the shared output total up to date: after each change to what it has
 * queued (a flush, a completed write, a job's promise). Between two calls the total may be off by what was
 * appended and not yet flushed; the connection's own test (pending) never is. */
static void pd_conn_count(pd_conn *c)
{
    _Atomic unsigned long long *total = c->set->lim.output_total;
    if (!total)
        return;
    const size_t now = c->closing ? 0 : pd_conn_pending(c);
    if (now > c->counted)
        atomic_fetch_add_explicit(total, now - c->counted, memory_order_relaxed);
    else if (now < c->counted)
        atomic_fetch_sub_explicit(total, c->counted - now, memory_order_relaxed);
    c->counted = now;
}

/* Whether this connection, holding `pending` bytes, must wait for all connections' output to shrink: it
 * holds some, and the total is past output_memory. One holding none may always produce its next reply. */
static int pd_conn_over_budget(const pd_conn *c, size_t pending)
{
    const pd_conn_limits *l = &c->set->lim;
    return pending && l->output_memory && l->output_total &&
           atomic_load_explicit(l->output_total, memory_order_relaxed) > l->output_memory;
}

int pd_conn_congested(const pd_conn *c)
{
    const size_t pending = pd_conn_pending(c);
    return pending > c->set->lim.output_cap || pd_conn_over_budget(c, pending);
}

/* Whether a paused connection may go on: below half its cap (so a slow reader does not flap on every
 * write), and not waiting for the shared budget. */
static int pd_conn_resumable(const pd_conn *c)
{
    const size_t pending = pd_conn_pending(c);
    return pending <= c->set->lim.output_cap / 2 && !pd_conn_over_budget(c, pending);
}

int pd_conn_open(const pd_conn *c)
{
    return !c->closing && !c->draining;
}

int pd_conn_cancelled(const pd_conn *c)
{
    return atomic_load_explicit(&c->cancel, memory_order_relaxed);
}

int pd_conn_peer_gone(pd_conn *c)
{
    int fd;
    if (pd_conn_fd(c, &fd))
        return 0;
    /* POLLHUP: both directions are shut (a Unix peer that closed or exited; a TCP reset); POLLERR: the socket
     * failed. Not EOF alone: a peer that shut down only its writing half still reads its answer (conn.c answers
     * what was sent before an EOF), and a TCP peer's close looks the same until permd writes to it. */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

void pd_conn_set_max_frame(pd_conn *c, uint32_t max_frame)
{
    c->in.max_frame = max_frame;
}

void pd_conn_set_deadline(pd_conn *c, uint64_t at_ms)
{
    c->deadline = at_ms;
}

void pd_conn_set_alarm(pd_conn *c, uint64_t at_ms)
{
    c->alarm = at_ms;
}

uv_loop_t *pd_conn_loop(const pd_conn *c)
{
    return c->set->loop;
}

/* ---- Lifetime ------------------------------------------------------------------------------ */

void pd_conn_ref(pd_conn *c)
{
    c->refs++;
}

static void pd_conn_drop_block(pd_conn *c);

static void pd_conn_free(pd_conn *c)
{
    pd_conns *set = c->set;
    if (c->started)
        c->ops->free(c->session);
    pd_frame_reader_free(&c->in);
    free(c->out);
    free(c->spare);
    if (c->block)
        pd_conn_drop_block(c);
    free(c);
    pd_conns_check_idle(set);
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
    pd_conn_count(c); /* its output leaves the shared total (the writes libuv cancels are freed) */
    atomic_store_explicit(&c->cancel, 1, memory_order_relaxed);
    if (c->started)
        c->ops->stop(c->session, 1);
    pd_conns *set = c->set;
    if (c->prev)
        c->prev->next = c->next;
    else
        set->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    set->stats->connections--;
    pd_log_debug("conn_close", "conn=%llu", (unsigned long long)c->serial);
    uv_close(&c->h.handle, pd_on_close);
}

/* ---- Output ------------------------------------------------------------------------------ */

uint8_t *pd_conn_reserve(pd_conn *c, size_t n)
{
    if (c->closing)
        return NULL;
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

void pd_conn_commit(pd_conn *c, size_t n)
{
    c->out_len += n;
    pd_conn_count(c);
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
    pd_conn_count(c);
}

/* A written-out block of cap bytes: kept as the connection's block when it is large and none is kept,
 * else freed. */
static void pd_conn_keep_block(pd_conn *c, void *base, size_t cap)
{
    if (cap > PD_OUT_KEEP && !c->block && !c->closing) {
        c->block = base;
        c->block_cap = cap;
        c->set->stats->block_bytes += cap;
        return;
    }
    free(base);
}

/* The kept block, no longer kept: the caller owns it (cap bytes). */
static void *pd_conn_unkeep_block(pd_conn *c, size_t *cap)
{
    void *b = c->block;
    *cap = c->block_cap;
    c->set->stats->block_bytes -= c->block_cap;
    c->block = NULL;
    c->block_cap = 0;
    return b;
}

/* Free the kept block (unused since the last sweep, or the connection is going). */
static void pd_conn_drop_block(pd_conn *c)
{
    size_t cap;
    free(pd_conn_unkeep_block(c, &cap));
}

void *pd_conn_take_block(pd_conn *c, size_t need, size_t *cap)
{
    if (need <= PD_OUT_KEEP) /* a small reply: no block is kept for those, and they must not pin one */
        return NULL;
    c->block_used = 1; /* a connection making large replies keeps the next one's block */
    /* One that does not fit, or would hold more than twice this reply, goes: this reply's block is kept
     * after it instead, so the kept block follows the replies' size (a smaller one kept first never keeps
     * a larger one out; a large one is not pinned by much smaller replies). */
    if (c->block && (c->block_cap < need || c->block_cap / 2 > need))
        pd_conn_drop_block(c);
    if (!c->block)
        return NULL;
    c->set->stats->blocks_reused++;
    return pd_conn_unkeep_block(c, cap);
}

static void pd_on_write(uv_write_t *req, int status)
{
    pd_write *w = (pd_write *)req;
    pd_conn *c = req->handle->data;
    if (w->cap && w->cap <= PD_OUT_KEEP && !c->spare) {
        c->spare = w->base;
        c->spare_cap = w->cap;
    } else {
        pd_conn_keep_block(c, w->base, w->cap);
    }
    free(w);
    if (c->closing)
        return;
    pd_conn_count(c);
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
    if (c->resuming)
        return;
    c->resuming = 1;
    while (pd_conn_open(c) && pd_conn_resumable(c)) {
        /* Requests first: a Cancel or Credit waiting behind the pause should
         * count before the streams produce again. */
        if (c->paused || c->eof || c->set->stopping) {
            c->paused = 0;
            pd_conn_process(c);
        }
        if (!c->started || !pd_conn_open(c))
            break;
        c->ops->writable(c->session);
        pd_conn_flush(c); /* a batch generated inline waits in the output buffer */
        /* Streams that filled the cap again (paused) have no write completion to wake them if the kernel
         * took everything at once (the loop's test): go on here. A stream stopped by its credits, its
         * batches ahead or the inline budget's jobs waits for a request or a job instead. */
        if (!c->paused)
            break;
    }
    c->resuming = 0;
}

/* A uv_buf_t's length is an unsigned int: longer writes go as several buffers of at most this. */
#define PD_CONN_BUF_MAX ((size_t)1 << 30)

/* Hand data inside the block base to libuv; base is released when written. */
static void pd_conn_queue(pd_conn *c, void *base, size_t cap, const uint8_t *data, size_t len)
{
    uv_buf_t bufs[64]; /* 64 GiB: far above output_cap and any one reply */
    unsigned nb = 0;
    for (size_t at = 0; at < len && nb < sizeof bufs / sizeof bufs[0]; at += PD_CONN_BUF_MAX, nb++)
        bufs[nb] = uv_buf_init((char *)data + at, (unsigned)(len - at < PD_CONN_BUF_MAX ? len - at : PD_CONN_BUF_MAX));
    pd_write *w = len <= (size_t)nb * PD_CONN_BUF_MAX ? malloc(sizeof *w) : NULL;
    if (!w) {
        free(base);
        pd_conn_close(c);
        return;
    }
    w->base = base;
    w->cap = cap;
    if (uv_write(&w->req, &c->h.stream, bufs, nb, pd_on_write)) {
        free(base);
        free(w);
        pd_conn_close(c);
        return;
    }
    pd_conn_count(c);
}

/* Write what the socket takes now, its bytes (0..len) in *written: 0, or a negative libuv error. A memory
 * connection takes all. */
static int pd_conn_try_write(pd_conn *c, const uint8_t *data, size_t len, size_t *written)
{
    *written = 0;
    if (c->sink) {
        c->sink(c->sink_ctx, data, len);
        *written = len;
        return 0;
    }
    if (c->h.stream.write_queue_size) /* keep order behind queued writes */
        return 0;
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)(len < PD_CONN_BUF_MAX ? len : PD_CONN_BUF_MAX));
    int n = uv_try_write(&c->h.stream, &b, 1);
    if (n == UV_EAGAIN || n == UV_ENOSYS)
        return 0;
    if (n < 0)
        return n;
    *written = (size_t)n;
    return 0;
}

void pd_conn_flush(pd_conn *c)
{
    if (c->closing || c->out_len == 0)
        return;
    c->set->stats->bytes_out_total += c->out_len;
    size_t n;
    int rc = pd_conn_try_write(c, c->out + c->out_start, c->out_len, &n);
    if (rc < 0) {
        pd_log_debug("conn_write", "conn=%llu err=%s", (unsigned long long)c->serial, uv_err_name(rc));
        pd_conn_close(c);
        return;
    }
    if (n == c->out_len) {
        c->out_start = c->out_len = 0;
        if (c->out_cap > PD_OUT_KEEP) { /* do not keep a burst's buffer per idle connection */
            free(c->out);
            c->out = NULL;
            c->out_cap = 0;
        }
        pd_conn_count(c);
        return;
    }
    /* The rest leaves with the buffer itself; the next reply starts a new one. */
    uint8_t *base = c->out;
    size_t cap = c->out_cap, at = c->out_start + n, len = c->out_len - n;
    c->out = NULL;
    c->out_cap = c->out_start = c->out_len = 0;
    pd_conn_queue(c, base, cap, base + at, len);
}

void pd_conn_write_owned(pd_conn *c, void *base, size_t cap, const uint8_t *data, size_t len)
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
    c->set->stats->bytes_out_total += len;
    size_t n;
    if (pd_conn_try_write(c, data, len, &n) < 0) {
        free(base);
        pd_conn_close(c);
        return;
    }
    if (n == len) {
        pd_conn_keep_block(c, base, cap);
        return;
    }
    pd_conn_queue(c, base, cap, data + n, len - n);
}

int pd_conn_send_fd(pd_conn *c, const uint8_t *data, size_t len, int fd)
{
    int sock;
    if (c->is_tcp || pd_conn_fd(c, &sock))
        return PD_EUNSUPPORTED;
    if (c->closing)
        return PD_ECLOSED;
    if (c->out_len || c->h.stream.write_queue_size)
        return PD_EBUSY;
    union { /* aligned for cmsghdr */
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
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
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return PD_EBUSY;
        /* The peer is gone: the connection's next read or write finds out and closes it. */
        pd_log_debug("conn_write", "conn=%llu err=%s", (unsigned long long)c->serial, strerror(errno));
        return PD_EIO;
    }
    c->set->stats->bytes_out_total += len;
    if ((size_t)n == len)
        return 0;
    uint8_t *rest = malloc(len - (size_t)n); /* the descriptor went with the first byte */
    if (!rest) {
        pd_conn_close(c);
        return 0;
    }
    memcpy(rest, data + n, len - (size_t)n);
    pd_conn_queue(c, rest, 0, rest, len - (size_t)n);
    return 0;
}

/* ---- Input --------------------------------------------------------------------------------- */

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

/* nread bytes were read into the frame reader's space (or EOF / an error). */
static void pd_conn_on_input(pd_conn *c, ssize_t nread)
{
    if (c->closing)
        return;
    if (nread > 0) {
        pd_frame_reader_commit(&c->in, (size_t)nread);
        c->set->metrics->bytes_in += (uint64_t)nread;
        if (!c->partial_since)
            c->partial_since = pd_clock_ms();
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

static void pd_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    pd_conn_on_input(st->data, nread);
}

void pd_conn_input(pd_conn *c, const uint8_t *data, size_t len)
{
    if (len == 0) {
        pd_conn_on_input(c, UV_EOF);
        return;
    }
    while (len && !c->closing) {
        uint8_t *p;
        size_t room;
        if (pd_frame_reader_space(&c->in, &p, &room)) {
            pd_conn_close(c);
            return;
        }
        size_t n = len < room ? len : room;
        memcpy(p, data, n);
        data += n;
        len -= n;
        pd_conn_on_input(c, (ssize_t)n);
    }
}

int pd_conn_note_congestion(pd_conn *c)
{
    int congested = pd_conn_congested(c);
    if (congested && !c->paused) { /* pd_on_write resumes it once the queue drains */
        c->paused = 1;
        c->set->stats->backpressure_pauses++;
        if (pd_conn_pending(c) <= c->set->lim.output_cap) /* within its own cap: the shared budget paused it */
            c->set->stats->output_memory_pauses++;
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
    if (want && !c->reading && c->partial_since)
        c->partial_since = pd_clock_ms(); /* permd paused reading: the frame's time starts again */
    if (c->sink) { /* a memory connection's input is pushed, not read */
        c->reading = (unsigned)want;
        return;
    }
    if (want && !c->reading) {
        if (uv_read_start(&c->h.stream, pd_on_alloc, pd_on_read) == 0)
            c->reading = 1;
    } else if (!want && c->reading) {
        uv_read_stop(&c->h.stream);
        c->reading = 0;
    }
}

/* ---- Requests ------------------------------------------------------------------------------- */

/* A complete frame is about to be handled: until it decodes as a request, it is "invalid". */
static void pd_conn_request_start(pd_conn *c)
{
    c->req_id = 0;
    c->req_slot = PD_REQ_INVALID;
    c->req_name = "invalid";
    c->req_t0 = uv_hrtime();
}

void pd_conn_request_begin(pd_conn *c, uint64_t id, int slot, const char *name)
{
    c->req_id = id;
    c->req_slot = slot;
    c->req_name = name;
}

int pd_conn_request_slot(const pd_conn *c)
{
    return c->req_slot;
}

/* Its reply is queued (or it needs none): observe the latency. */
static void pd_conn_request_end(pd_conn *c)
{
    uint64_t ns = uv_hrtime() - c->req_t0;
    pd_metrics_latency(c->set->metrics, c->req_slot, ns);
    pd_log_debug("request", "conn=%llu id=%llu type=%s us=%llu", (unsigned long long)c->serial,
                 (unsigned long long)c->req_id, c->req_name, (unsigned long long)(ns / 1000));
}

/* The owner says its last words; whether the peer may still be sending decides the linger. */
static void pd_conn_end(pd_conn *c, int shutdown)
{
    int active = c->ops->end(c->session, shutdown);
    c->quiet = !active && !pd_frame_reader_pending(&c->in);
}

static void pd_conn_process(pd_conn *c)
{
    int stalled; /* stopped for congestion: a whole frame may still wait in the reader */
again:
    stalled = 0;
    while (pd_conn_open(c) && !c->busy) {
        /* Judged once, and a stop always pauses: the shared total moves under other loops, so a later
         * look may already say "not congested", and an unpaused connection's buffered frames would wait
         * for bytes its peer may never send (pd_conn_maybe_resume processes a paused one). */
        if (pd_conn_note_congestion(c)) {
            stalled = 1;
            break;
        }
        const uint8_t *payload;
        uint32_t len;
        int rc = pd_frame_reader_next(&c->in, &payload, &len);
        if (rc == 0)
            break;
        c->partial_since = 0; /* a frame arrived whole: the clock starts again with the next byte */
        pd_conn_request_start(c);
        if (rc < 0) {
            c->ops->oversize(c->session, pd_load_le32(c->in.buf + c->in.start), c->in.max_frame);
            pd_conn_request_end(c);
            pd_conn_drain_close(c);
            return;
        }
        c->ops->frame(c->session, payload, len);
        if (!c->busy)
            pd_conn_request_end(c);
    }
    if (pd_conn_open(c) && !c->busy && !stalled && (c->eof || c->set->stopping) && !pd_conn_congested(c)) {
        /* Nothing more will be asked (or permd is stopping): close after the replies. */
        pd_conn_end(c, c->set->stopping);
        pd_conn_drain_close(c);
        return;
    }
    if (stalled) /* what waits may be whole frames: permd holds them up, not the peer; the clock starts anew */
        c->partial_since = 0;
    else if (!c->partial_since && pd_frame_reader_pending(&c->in))
        c->partial_since = pd_clock_ms(); /* the next frame's first bytes came with the last one */
    int congested = stalled || pd_conn_congested(c);
    pd_conn_flush(c);
    /* Replies built inline wait in the output buffer, which counts toward the
     * cap until flushed. If the flush relieved the congestion, frames already
     * read must be handled now: no read event will come for them, and no
     * write completion either when the kernel took everything. */
    if (congested && pd_conn_open(c) && !c->busy && !pd_conn_congested(c))
        goto again;
    pd_conn_update_reading(c);
    /* Streams stopped at the cap by what this pass generated: if the flush took it all, no write
     * completion will come to resume them. */
    if (c->paused && pd_conn_open(c) && pd_conn_resumable(c))
        pd_conn_maybe_resume(c);
}

/* ---- Jobs ----------------------------------------------------------------------------------- */

void pd_conn_job_begin(pd_conn *c, size_t out_bytes, int request)
{
    c->set->jobs++;
    c->set->stats->jobs_total++;
    c->job_bytes += out_bytes;
    pd_conn_count(c);
    c->refs++;
    if (request)
        c->busy = 1;
}

void pd_conn_job_settle(pd_conn *c, size_t out_bytes)
{
    c->set->jobs--;
    c->job_bytes -= out_bytes;
    pd_conn_count(c);
}

void pd_conn_job_hold(pd_conn *c, size_t out_bytes)
{
    c->set->jobs++;
    c->set->stats->jobs_total++;
    c->job_bytes += out_bytes;
    pd_conn_count(c);
}

void pd_conn_job_end(pd_conn *c, int request)
{
    pd_conns *set = c->set;
    if (request) {
        c->busy = 0;
        pd_conn_request_end(c);
        if (!c->closing) {
            if (c->draining)
                pd_conn_finish_drain(c);
            else
                pd_conn_process(c);
        }
    } else if (!c->closing) {
        /* Its promised output is no longer counted: a connection paused by the cap may read again
         * (a cancelled stream's last batch replies nothing, so nothing else would resume it). */
        pd_conn_maybe_resume(c);
    }
    pd_conn_unref(c);
    pd_conns_check_idle(set);
}

/* ---- Closing ------------------------------------------------------------------------------- */

static void pd_on_shutdown(uv_shutdown_t *req, int status)
{
    pd_conn *c = req->handle->data;
    /* Stopping, and the peer had nothing in flight: waiting for its EOF would only hold the
     * shutdown up (an idle client never sends one). A peer with streams may still be sending
     * credits: closing now could reset the connection before it reads its StreamEnd. */
    if ((status < 0 || (c->set->stopping && c->quiet)) && !c->closing)
        pd_conn_close(c);
}

/* Once every reply is written: send FIN and wait (bounded) for the peer's
 * EOF, discarding its input, so an error reply is not lost to a TCP reset. */
static void pd_conn_finish_drain(pd_conn *c)
{
    if (!c->draining || c->closing || c->shut || c->busy || c->out_len ||
        (!c->sink && c->h.stream.write_queue_size))
        return;
    const uint64_t linger = c->set->stopping ? c->set->lim.stop_linger_ms : c->set->lim.linger_ms;
    if (c->eof || c->sink || !linger) {
        pd_conn_close(c);
        return;
    }
    c->shut = 1;
    if (uv_shutdown(&c->shutdown_req, &c->h.stream, pd_on_shutdown)) {
        pd_conn_close(c);
        return;
    }
    c->linger_until = pd_clock_ms() + linger;
    pd_frame_reader_discard(&c->in);
    pd_conn_update_reading(c);
}

void pd_conn_drain_close(pd_conn *c)
{
    if (!pd_conn_open(c))
        return;
    c->draining = 1;
    if (c->started)
        c->ops->stop(c->session, 0);
    pd_conn_flush(c);
    if (c->closing)
        return;
    pd_conn_update_reading(c);
    pd_conn_finish_drain(c);
}

/* Server shutdown: stop reading, end streams, close when idle. */
static void pd_conn_shutdown(pd_conn *c)
{
    if (!pd_conn_open(c))
        return;
    atomic_store_explicit(&c->cancel, 1, memory_order_relaxed);
    if (c->started)
        pd_conn_end(c, 1);
    if (c->busy) { /* the job's completion runs pd_conn_process, which closes */
        pd_conn_flush(c);
        pd_conn_update_reading(c);
        return;
    }
    pd_conn_drain_close(c);
}

void pd_conns_shutdown(pd_conns *set)
{
    set->stopping = 1;
    pd_conn *c = set->head;
    while (c) {
        pd_conn *next = c->next;
        pd_conn_shutdown(c);
        c = next;
    }
    pd_conns_check_idle(set);
}

void pd_conns_close_all(pd_conns *set)
{
    while (set->head)
        pd_conn_close(set->head);
}

/* A deadline passed: the owner replies, then the connection drains and closes. */
static void pd_conn_expire(pd_conn *c, int why)
{
    c->deadline = 0;
    c->partial_since = 0;
    /* The error answers no request: count it as the connection's, not as the last request's type
     * (the slot still names the request before). A request in flight keeps its slot for its end. */
    int slot = c->req_slot;
    const char *name = c->req_name;
    c->req_slot = PD_REQ_CONNECTION;
    c->req_name = "connection";
    if (c->started)
        c->ops->expired(c->session, why);
    c->req_slot = slot;
    c->req_name = name;
    pd_conn_drain_close(c);
}

void pd_conns_sweep(pd_conns *set, uint64_t now_ms)
{
    uint64_t frame_ms = set->lim.frame_timeout_ms;
    pd_conn *c = set->head;
    while (c) {
        pd_conn *next = c->next;
        if (c->block && !c->block_used) /* no reply took it since the last sweep */
            pd_conn_drop_block(c);
        c->block_used = 0;
        if (c->shut && !c->closing && now_ms >= c->linger_until)
            pd_conn_close(c);
        else if (!pd_conn_open(c))
            ;
        else if (c->deadline && now_ms >= c->deadline)
            pd_conn_expire(c, PD_CONN_DEADLINE);
        else if (frame_ms && c->reading && c->partial_since && now_ms - c->partial_since >= frame_ms &&
                 pd_frame_reader_pending(&c->in))
            pd_conn_expire(c, PD_CONN_FRAME);
        else if (c->alarm && now_ms >= c->alarm) {
            c->alarm = 0;
            if (c->started && c->ops->alarm)
                c->ops->alarm(c->session);
        }
        c = next;
    }
}

/* ---- Opening ------------------------------------------------------------------------------- */

static void pd_on_reject_close(uv_handle_t *h)
{
    free(h);
}

/* A new connection object on set's loop around a handle the caller initialized (kind: how). */
static int pd_conn_new(pd_conns *set, uv_stream_t *listener, int fd, int is_tcp, int memory, pd_conn **out)
{
    pd_conn *c = calloc(1, sizeof *c);
    if (!c) {
        pd_log_error("accept", "err=ENOMEM");
        if (fd >= 0)
            close(fd);
        return PD_ENOMEM;
    }
    atomic_init(&c->cancel, 0);
    int rc = 0;
    if (memory) {
        uv_check_init(set->loop, &c->h.check);
    } else if (is_tcp) {
        uv_tcp_init(set->loop, &c->h.tcp);
    } else {
        uv_pipe_init(set->loop, &c->h.pipe, 0);
    }
    c->h.handle.data = c;
    if (!memory)
        rc = listener ? uv_accept(listener, &c->h.stream) : is_tcp ? uv_tcp_open(&c->h.tcp, fd) : uv_pipe_open(&c->h.pipe, fd);
    if (rc || pd_frame_reader_init(&c->in, PD_READ_BASE, set->lim.max_frame)) {
        pd_log_warn_peer("accept", "err=%s", rc ? uv_err_name(rc) : "ENOMEM");
        if (rc && fd >= 0)
            close(fd); /* the handle did not take it */
        pd_frame_reader_free(&c->in);
        uv_close(&c->h.handle, pd_on_reject_close);
        return rc ? PD_EIO : PD_ENOMEM;
    }
    c->set = set;
    c->refs = 1;
    c->req_slot = PD_REQ_CONNECTION;
    c->req_name = "connection";
    c->is_tcp = (unsigned)is_tcp;
    c->serial = atomic_fetch_add(&pd_serials, 1) + 1;
    set->stats->connections_total++;
    c->next = set->head;
    if (set->head)
        set->head->prev = c;
    set->head = c;
    set->stats->connections++;
    if (is_tcp && !memory)
        uv_tcp_nodelay(&c->h.tcp, 1);
    pd_log_debug("conn_open", "conn=%llu transport=%s", (unsigned long long)c->serial,
                 memory ? "memory" : is_tcp ? "tcp" : "unix");
    *out = c;
    return 0;
}

int pd_conn_accept(pd_conns *set, uv_stream_t *listener, int is_tcp, pd_conn **out)
{
    return pd_conn_new(set, listener, -1, is_tcp, 0, out);
}

int pd_conn_adopt(pd_conns *set, int fd, int is_tcp, pd_conn **out)
{
    return pd_conn_new(set, NULL, fd, is_tcp, 0, out);
}

int pd_conn_open_memory(pd_conns *set, int is_tcp, void (*sink)(void *ctx, const uint8_t *data, size_t len),
                        void *ctx, pd_conn **out)
{
    int rc = pd_conn_new(set, NULL, -1, is_tcp, 1, out);
    if (rc == 0) {
        (*out)->sink = sink;
        (*out)->sink_ctx = ctx;
    }
    return rc;
}

void pd_conn_start(pd_conn *c, const pd_conn_ops *ops, void *session)
{
    c->ops = ops;
    c->session = session;
    c->started = 1;
    pd_conn_update_reading(c);
}
