/* libpermd: blocking client connections to permd, one request at a time, with credit-managed streams. */
#include "client/permd.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/error.h"
#include "core/rank.h"
#include "proto/arena.h"
#include "proto/endpoint.h"
#include "proto/frame.h"

/* The public header repeats core's numbers so that it stands alone. */
#define PD_SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(PD_SAME(PERMD_EINVAL, PD_EINVAL) && PD_SAME(PERMD_EIO, PD_EIO) && PD_SAME(PERMD_EAUTH, PD_EAUTH) &&
                   PD_SAME(PERMD_ETOOBIG, PD_ETOOBIG) && PD_SAME(PERMD_EINTERNAL, PD_EINTERNAL),
               "permd.h error codes must equal core/error.h");
_Static_assert(PD_SAME(PERMD_MODE_PAD, PD_MODE_PAD) && PD_SAME(PERMD_MODE_DROP, PD_MODE_DROP) &&
                   PD_SAME(PERMD_MODE_EXACT, PD_MODE_EXACT),
               "permd.h modes must equal core/rank.h");

#define PD_CL_HELLO_FRAME (1u << 20)   /* the largest frame accepted before Hello says more */
#define PD_CL_READ_BASE (64u << 10)
#define PD_CL_ARENA (16u << 10)
#define PD_CL_STREAM_BYTES (4u << 20)  /* how far a stream may run ahead of the reader */
#define PD_CL_RING_BYTES (16u << 20)   /* the same for a ring stream: no socket buffer fills, more batches in flight */
#define PD_CL_MAX_WINDOW 16u
#define PD_CL_HELLO_TIMEOUT_MS 10000u  /* a server that accepts but never answers fails connect */

/* A stream frame that arrived while the client waited for another reply. */
typedef struct pd_qframe {
    struct pd_qframe *next;
    uint32_t len;
    uint8_t data[];
} pd_qframe;

struct permd_stream {
    permd_client *c;
    uint64_t id;
    uint32_t window;  /* credits granted ahead */
    uint32_t unacked; /* batches consumed since the last Credit */
    uint64_t offset;
    uint64_t batch, max_count; /* as asked: a batch above batch ids, or a stream above max_count (0: none), is refused */
    uint64_t seq, received;    /* the next batch's seq; ids received */
    uint32_t queued;           /* frames in head..tail: at most the window and the stream's end */
    int locations;             /* asked for locations (16-byte items) */
    int cancelled;             /* Cancel was sent: StreamEnd may say CANCELLED */
    int done, rc;
    pd_qframe *head, *tail;
    pd_qframe *held; /* the frame whose ids the caller holds */
    int want_ring;   /* asked for a shared-memory ring */
    const uint8_t *ring; /* the ring (read-only), once StreamRing mapped it */
    size_t ring_size;
    uint64_t slot_bytes;
};

struct permd_client {
    int fd;
    int broken; /* after an I/O failure or timeout nothing more is sent */
    int is_unix;
    int server_ring; /* the server offers stream rings (Hello feature stream_ring) */
    int pending_fd;  /* a descriptor that arrived with the frame being read (a StreamRing's); -1 */
    int fds_dropped; /* a descriptor permd sent was lost (MSG_CTRUNC) */
    uint32_t timeout_ms;
    uint64_t deadline; /* when the reply being waited for is late (pd_cl_arm); 0: never */
    uint64_t next_id;
    pd_frame_reader in;
    pd_arena arena;
    uint8_t *wbuf;
    size_t wcap;
    permd_server_info info;
    permd_stream *stream;
    char err[512];
};

static __thread char pd_cl_tls_err[512]; /* permd_last_error(NULL): why a connect failed */

const char *permd_strerror(int err)
{
    return pd_strerror(err);
}

const char *permd_version(void)
{
    return PERMD_VERSION;
}

unsigned permd_abi_version(void)
{
    return PERMD_ABI_VERSION;
}

const char *permd_last_error(const permd_client *c)
{
    return c ? c->err : pd_cl_tls_err;
}

int permd_usable(const permd_client *c)
{
    return c && !c->broken;
}

/* The message permd_last_error(c) returns from now on. */
static void pd_cl_vsay(permd_client *c, const char *fmt, va_list ap)
{
    _Static_assert(sizeof pd_cl_tls_err == sizeof ((permd_client *)0)->err, "one size for both messages");
    vsnprintf(c ? c->err : pd_cl_tls_err, sizeof pd_cl_tls_err, fmt, ap);
}

static int pd_cl_fail(permd_client *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pd_cl_fail(permd_client *c, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pd_cl_vsay(c, fmt, ap);
    va_end(ap);
    if (c && (err == PD_EIO || err == PD_ECLOSED || err == PD_ETIMEDOUT || err == PD_EPROTO))
        c->broken = 1;
    return err;
}

int permd_set_error(permd_client *c, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pd_cl_vsay(c, fmt, ap);
    va_end(ap);
    return err;
}

/* ---- Socket I/O -------------------------------------------------------------- */

/* Start the clock on one reply (a call's, a stream batch's, a close's drain): every read and write until it comes
 * shares one deadline, so a server that trickles bytes, or sends frames for other ids, is still late in time. */
static void pd_cl_arm(permd_client *c)
{
    c->deadline = c->timeout_ms ? pd_endpoint_now_ms() + c->timeout_ms : 0;
}

/* Wait for the socket to be ready for events, until the armed deadline (a signal does not restart it). */
static int pd_cl_poll(permd_client *c, short events)
{
    if (!c->deadline)
        return 0;
    if (pd_endpoint_wait(c->fd, events, c->deadline) == 0)
        return 0;
    if (errno == ETIMEDOUT)
        return pd_cl_fail(c, PD_ETIMEDOUT, "no answer from permd within %u ms", c->timeout_ms);
    return pd_cl_fail(c, PD_EIO, "poll: %s", strerror(errno));
}


/* Keep the latest descriptor received; close any other (never leak one the
 * protocol did not announce). */
static void pd_cl_take_fds(permd_client *c, struct msghdr *msg)
{
    if (msg->msg_flags & MSG_CTRUNC)
        c->fds_dropped = 1; /* the kernel closed what did not fit, or what this process could not open */
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof fd, sizeof fd);
            if (c->pending_fd >= 0)
                close(c->pending_fd);
            c->pending_fd = fd;
        }
    }
}

/* The next whole frame from the socket; the payload is valid until the next read. */
static int pd_cl_read_frame(permd_client *c, const uint8_t **payload, uint32_t *len)
{
    if (c->broken)
        return pd_cl_fail(c, PD_ECLOSED, "the connection is no longer usable");
    for (;;) {
        int rc = pd_frame_reader_next(&c->in, payload, len);
        if (rc == 1)
            return 0;
        if (rc < 0)
            return pd_cl_fail(c, PD_EPROTO, "permd sent a frame above %u bytes", c->in.max_frame);
        uint8_t *p;
        size_t room;
        if (pd_frame_reader_space(&c->in, &p, &room))
            return pd_cl_fail(c, PD_ENOMEM, "out of memory");
        if ((rc = pd_cl_poll(c, POLLIN)))
            return rc;
        /* recvmsg, not recv: a StreamRing's descriptor rides on its first byte. */
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(4 * sizeof(int))];
        } ctl;
        struct iovec iov = {.iov_base = p, .iov_len = room};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
        ssize_t n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n > 0 && (msg.msg_controllen || (msg.msg_flags & MSG_CTRUNC)))
            pd_cl_take_fds(c, &msg);
        if (n == 0)
            return pd_cl_fail(c, PD_ECLOSED, "permd closed the connection");
        if (n < 0 && errno == ECONNRESET) /* permd killed with replies unread, or closed on an error */
            return pd_cl_fail(c, PD_ECLOSED, "permd closed the connection (reading: %s)", strerror(errno));
        if (n < 0)
            return pd_cl_fail(c, PD_EIO, "reading from permd: %s", strerror(errno));
        pd_frame_reader_commit(&c->in, (size_t)n);
    }
}

/* Keep a stream frame for permd_stream_next. The server sends a batch only for a credit, and the client has at
 * most `window` out: more frames than those and the stream's end would be a server filling this process's
 * memory. */
static int pd_cl_queue_stream_frame(permd_stream *st, const uint8_t *payload, uint32_t len)
{
    if (st->queued >= st->window + 2)
        return pd_cl_fail(st->c, PD_EPROTO, "permd sent more stream batches than the %u credits granted", st->window);
    pd_qframe *q = malloc(sizeof *q + len);
    if (!q)
        return pd_cl_fail(st->c, PD_ENOMEM, "out of memory");
    q->next = NULL;
    q->len = len;
    memcpy(q->data, payload, len);
    if (st->tail)
        st->tail->next = q;
    else
        st->head = q;
    st->tail = q;
    st->queued++;
    return 0;
}

/* Whether a scanned frame is the connection's Error (id 0): the reason permd is about to close it. */
static int pd_cl_is_closing_error(const pd_bulk_view *v)
{
    return v->id == 0 && v->body_field == PERMD__V1__ENVELOPE__BODY_ERROR;
}

/* A frame that does not answer request id (0: none awaited, one is being sent): the open stream's is queued for
 * it; any other is the server's mistake. */
static int pd_cl_aside(permd_client *c, const uint8_t *payload, uint32_t len, const pd_bulk_view *v, uint64_t id)
{
    if (v->id == 0)
        return pd_cl_fail(c, PD_EPROTO, "permd sent a reply (message %u) for request id 0", v->body_field);
    if (!c->stream || v->id != c->stream->id)
        return pd_cl_fail(c, PD_EPROTO, "permd answered request %llu while request %llu waited",
                          (unsigned long long)v->id, (unsigned long long)id);
    return pd_cl_queue_stream_frame(c->stream, payload, len);
}

/* Read until the frame answering id (or a connection-level error, id 0);
 * the open stream's frames are queued for it on the way. Replies come in order and a request is abandoned only
 * with its connection, so a frame for any other id is the server's mistake. */
static int pd_cl_wait(permd_client *c, uint64_t id, const uint8_t **payload, uint32_t *len)
{
    for (;;) {
        pd_bulk_view v;
        int rc = pd_cl_read_frame(c, payload, len);
        if (rc)
            return rc;
        if (pd_frame_scan_bulk(*payload, *len, 0, &v) < 0)
            return pd_cl_fail(c, PD_EPROTO, "permd sent a malformed frame");
        if (v.id == id || pd_cl_is_closing_error(&v))
            return 0;
        if ((rc = pd_cl_aside(c, *payload, *len, &v, id)))
            return rc;
    }
}

/* Unpack a reply; an Error becomes its code with the server's message. */
static int pd_cl_unpack(permd_client *c, const uint8_t *payload, uint32_t len, int want, pd_envelope **env)
{
    pd_arena_reset(&c->arena);
    if (pd_frame_unpack(payload, len, &c->arena.pb, env))
        return pd_cl_fail(c, PD_EPROTO, "permd sent a malformed reply");
    if ((*env)->body_case == PERMD__V1__ENVELOPE__BODY_ERROR) {
        const Permd__V1__Error *e = (*env)->error;
        int err = pd_wire_error_to_pd(e->code);
        const char *name = pd_wire_error_name(e->code);
        if (e->code && !strcmp(name, "UNSPECIFIED")) /* a newer server's code: say which */
            pd_cl_fail(c, err, "error code %d (unknown to this client): %s", (int)e->code, e->message);
        else
            pd_cl_fail(c, err, "%s: %s", name, e->message);
        if ((*env)->id == 0 && err != PD_EPROTO)
            c->broken = 1; /* connection-level errors come before a close */
        return err;
    }
    if ((int)(*env)->body_case != want)
        return pd_cl_fail(c, PD_EPROTO, "unexpected reply (message %d)", (int)(*env)->body_case);
    return 0;
}

/* Wait until the socket takes bytes or holds some to read (*revents), until the armed deadline (none: as long as
 * it takes). */
static int pd_cl_poll_io(permd_client *c, short *revents)
{
    for (;;) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLOUT};
        int ms = -1;
        if (c->deadline && !(ms = pd_endpoint_ms_left(c->deadline)))
            return pd_cl_fail(c, PD_ETIMEDOUT, "no answer from permd within %u ms", c->timeout_ms);
        const int n = poll(&p, 1, ms);
        if (n > 0) {
            *revents = p.revents;
            return 0;
        }
        if (n < 0 && errno != EINTR)
            return pd_cl_fail(c, PD_EIO, "poll: %s", strerror(errno));
    }
}

/* Read one frame that came while a request was being sent: an open stream's batch or end (queued for it), or the
 * Error permd sends before it closes the connection. */
static int pd_cl_read_aside(permd_client *c)
{
    const uint8_t *payload;
    uint32_t len;
    pd_bulk_view v;
    int rc = pd_cl_read_frame(c, &payload, &len);
    if (rc)
        return rc;
    if (pd_frame_scan_bulk(payload, len, 0, &v) < 0)
        return pd_cl_fail(c, PD_EPROTO, "permd sent a malformed frame");
    if (pd_cl_is_closing_error(&v)) {
        pd_envelope *env;
        rc = pd_cl_unpack(c, payload, len, 0, &env);
        return rc ? rc : pd_cl_fail(c, PD_EPROTO, "permd sent an Error without a code");
    }
    return pd_cl_aside(c, payload, len, &v, 0);
}

/* After a send found the connection closed: the Error permd sent before it closed (TOO_LARGE, a frame it
 * refused), when that is already here, as its code with its message; else 0. Reads without waiting; any other
 * frame is dropped with the connection. */
static int pd_cl_closing_error(permd_client *c)
{
    for (;;) {
        const uint8_t *payload;
        uint32_t len;
        const int got = pd_frame_reader_next(&c->in, &payload, &len);
        if (got < 0)
            return 0;
        if (got == 1) {
            pd_bulk_view v;
            pd_envelope *env;
            if (pd_frame_scan_bulk(payload, len, 0, &v) == 0 && pd_cl_is_closing_error(&v))
                return pd_cl_unpack(c, payload, len, 0, &env);
            continue;
        }
        uint8_t *p;
        size_t room;
        if (pd_frame_reader_space(&c->in, &p, &room))
            return 0;
        const ssize_t n = recv(c->fd, p, room, MSG_DONTWAIT);
        if (n <= 0)
            return 0;
        pd_frame_reader_commit(&c->in, (size_t)n);
    }
}

/* Send all of p. The socket is never written blocking: the armed deadline holds while a request larger than the
 * socket's buffer goes out, and what permd sends meanwhile is read (protocol.md: "read while you write").
 * A client with a stream open used to block in send() on a large request while permd, its output for the
 * connection past output_cap, had stopped reading it: neither moved again. Any failure ends the connection:
 * part of the request may be out, or a frame read aside lost. */
static int pd_cl_write_all(permd_client *c, const uint8_t *p, size_t len)
{
    int rc = 0;
    if (c->broken)
        return pd_cl_fail(c, PD_ECLOSED, "the connection is no longer usable");
    while (len && rc == 0) {
        short ev = 0;
        if ((rc = pd_cl_poll_io(c, &ev)))
            break;
        if ((ev & POLLIN) && !(ev & POLLOUT)) { /* full: read what holds permd up (POLLHUP too: send says why) */
            rc = pd_cl_read_aside(c);
            continue;
        }
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) { /* what "Broken pipe" means here */
            const int e = errno;
            if (!(rc = pd_cl_closing_error(c)))
                rc = pd_cl_fail(c, PD_ECLOSED, "permd closed the connection (sending: %s)", strerror(e));
        } else if (n < 0) {
            rc = pd_cl_fail(c, PD_EIO, "sending to permd: %s", strerror(errno));
        } else {
            p += n;
            len -= (size_t)n;
        }
    }
    if (rc)
        c->broken = 1;
    return rc;
}

/* Pack and send one envelope, giving it the next request id. */
static int pd_cl_send(permd_client *c, pd_envelope *env)
{
    size_t n = pd_frame_size(env);
    if (n > c->wcap) {
        uint8_t *p = realloc(c->wbuf, n);
        if (!p)
            return pd_cl_fail(c, PD_ENOMEM, "out of memory");
        c->wbuf = p;
        c->wcap = n;
    }
    pd_frame_pack(env, c->wbuf);
    return pd_cl_write_all(c, c->wbuf, n);
}

/* Send a request and unpack its reply of type want. */
static int pd_cl_call(permd_client *c, pd_envelope *req, int want, pd_envelope **reply)
{
    const uint8_t *payload;
    uint32_t len;
    req->id = ++c->next_id;
    pd_cl_arm(c);
    int rc = pd_cl_send(c, req);
    if (rc == 0)
        rc = pd_cl_wait(c, req->id, &payload, &len);
    if (rc == 0)
        rc = pd_cl_unpack(c, payload, len, want, reply);
    return rc;
}

/* ---- Connecting ------------------------------------------------------------------ */

static int pd_cl_hello(permd_client *c, const char *token)
{
    Permd__V1__Hello h = PERMD__V1__HELLO__INIT;
    h.protocol_version = PD_PROTOCOL_VERSION;
    h.client_name = "libpermd " PERMD_VERSION;
    h.token = (char *)(token ? token : "");
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_HELLO;
    req.hello = &h;
    int rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_HELLO_REPLY, &rep);
    if (rc)
        return rc;
    const Permd__V1__HelloReply *r = rep->hello_reply;
    snprintf(c->info.server, sizeof c->info.server, "%s", r->server);
    c->info.protocol_version = r->protocol_version;
    c->info.spec_version = r->spec_version;
    if (r->limits) {
        c->info.max_frame = r->limits->max_frame;
        c->info.max_count = r->limits->max_count;
        c->info.max_streams = r->limits->max_streams;
        c->info.max_credits = r->limits->max_credits;
        c->info.output_cap = r->limits->output_cap;
        c->info.max_digest = r->limits->max_digest;
    }
    for (size_t i = 0; i < r->n_features; i++)
        if (!strcmp(r->features[i], "stream_ring"))
            c->server_ring = 1;
    if (r->spec_version != 1)
        return pd_cl_fail(c, PD_EUNSUPPORTED, "permd computes permutation spec v%u; this client knows v1",
                          r->spec_version);
    /* Callers size buffers by max_count (Python's fetch by default): no reply could carry more 4-byte ids. */
    if (c->info.max_count > PD_FRAME_MAX_LIMIT / 4)
        return pd_cl_fail(c, PD_EPROTO, "permd announced max_count %llu, more ids than a frame can carry",
                          (unsigned long long)c->info.max_count);
    /* Replies may now be as large as docs/protocol.md §2 says: max_count items of up to 24 bytes (16 a
     * location; a mixture Inverse's 8-byte position, 4-byte rank and epoch varint of up to 10), and a
     * reply that repeats what a request of max_frame brought (GetMixture) with a little per component. */
    uint64_t max = c->info.max_count * 24 + c->info.max_frame + (1u << 20);
    c->in.max_frame = max < PD_FRAME_MAX_LIMIT ? (uint32_t)max : PD_FRAME_MAX_LIMIT;
    return 0;
}

/* Wrap a connected socket and say Hello; closes fd on failure. */
/* The Hello on a connected fd, waiting at most ms (0: PD_CL_HELLO_TIMEOUT_MS); the client then keeps ms as its
 * timeout (permd_set_timeout), 0 keeping none. */
static int pd_cl_start(int fd, const char *token, uint32_t ms, permd_client **out)
{
    permd_client *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return pd_cl_fail(NULL, PD_ENOMEM, "out of memory");
    }
    c->fd = fd;
    c->pending_fd = -1;
    if (pd_frame_reader_init(&c->in, PD_CL_READ_BASE, PD_CL_HELLO_FRAME) || pd_arena_init(&c->arena, PD_CL_ARENA)) {
        permd_close(c);
        return pd_cl_fail(NULL, PD_ENOMEM, "out of memory");
    }
    c->timeout_ms = ms ? ms : PD_CL_HELLO_TIMEOUT_MS;
    int rc = pd_cl_hello(c, token);
    c->timeout_ms = ms;
    if (rc) {
        pd_cl_fail(NULL, rc, "%s", c->err);
        permd_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

static int pd_cl_connect_unix(const char *path, uint32_t ms, permd_client **out)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char def[sizeof sa.sun_path];
    if (!out)
        return pd_cl_fail(NULL, PD_EINVAL, "permd_connect: out is required");
    if (!path || !*path) {
        char why[160];
        if (pd_endpoint_default_socket(def, sizeof def))
            return pd_cl_fail(NULL, PD_EINVAL, "the default socket path is too long");
        path = def;
        /* /tmp/permd-<uid> may have been made by another user, who could then put a socket of their
         * own there: connect through it only when it is ours alone, as permd binds in it. */
        if (pd_endpoint_in_private_dir(path)) {
            char dir[sizeof def];
            snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(path, '/') - path), path);
            int rc = pd_endpoint_check_dir(dir, why, sizeof why);
            if (rc == PD_EAUTH)
                return pd_cl_fail(NULL, rc, "refusing the default socket directory %s: %s (remove it, or give "
                                  "the socket's path)", dir, why);
        }
    }
    if (strlen(path) >= sizeof sa.sun_path)
        return pd_cl_fail(NULL, PD_EINVAL, "socket path too long: %s", path);
    char why[160];
    int fd, rc = pd_endpoint_connect_unix(path, ms ? ms : PD_CL_HELLO_TIMEOUT_MS, 0, &fd, why, sizeof why);
    if (rc) {
        const int absent = rc == PD_EIO && (errno == ENOENT || errno == ECONNREFUSED);
        struct stat st;
        if (absent && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) /* a directory or a file: refused the same */
            return pd_cl_fail(NULL, rc, "cannot connect to %s: it is not a socket (see --socket / PERMD_SOCKET)",
                              path);
        return pd_cl_fail(NULL, rc, "cannot connect to %s: %s%s", path, why,
                          absent ? " (is permd running? see --socket / PERMD_SOCKET)" : "");
    }
    rc = pd_cl_start(fd, NULL, ms, out);
    if (rc == 0)
        (*out)->is_unix = 1;
    return rc;
}

int permd_connect_unix(const char *path, permd_client **out)
{
    return pd_cl_connect_unix(path, 0, out);
}

static int pd_cl_connect_tcp(const char *host_port, const char *token, uint32_t ms, permd_client **out)
{
    char host[256];
    uint16_t p;
    if (!out)
        return pd_cl_fail(NULL, PD_EINVAL, "permd_connect: out is required");
    if (pd_endpoint_parse_hostport(host_port, host, sizeof host, &p))
        return pd_cl_fail(NULL, PD_EINVAL, "'%s' is not HOST:PORT", host_port ? host_port : "(null)");
    char why[320];
    int fd, rc = pd_endpoint_connect_tcp(host, p, ms ? ms : PD_CL_HELLO_TIMEOUT_MS, 0, &fd, why, sizeof why);
    if (rc) { /* without a port the default was tried: say which, as "127.0.0.1" alone hides it */
        int given = strchr(host_port, ']') ? strstr(host_port, "]:") != NULL : strchr(host_port, ':') != NULL;
        return given ? pd_cl_fail(NULL, rc, "cannot connect to %s: %s", host_port, why)
                     : pd_cl_fail(NULL, rc, "cannot connect to %s (port %u, permd's default): %s", host_port,
                                  (unsigned)p, why);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* requests are small and latency-bound */
    return pd_cl_start(fd, token, ms, out);
}

int permd_connect_tcp(const char *host_port, const char *token, permd_client **out)
{
    return pd_cl_connect_tcp(host_port, token, 0, out);
}

int permd_connect_timeout(const char *endpoint, const char *token, uint32_t ms, permd_client **out)
{
    if (!endpoint || !*endpoint)
        return pd_cl_connect_unix(NULL, ms, out);
    if (!strncmp(endpoint, "unix:", 5))
        return pd_cl_connect_unix(endpoint + 5, ms, out);
    if (!strncmp(endpoint, "tcp:", 4))
        return pd_cl_connect_tcp(endpoint + 4, token, ms, out);
    if (strchr(endpoint, '/'))
        return pd_cl_connect_unix(endpoint, ms, out);
    return pd_cl_connect_tcp(endpoint, token, ms, out);
}

int permd_connect(const char *endpoint, const char *token, permd_client **out)
{
    return permd_connect_timeout(endpoint, token, 0, out);
}

/* What a stream holds besides its handle: queued frames, the held batch, the ring's mapping. */
static void pd_stream_release(permd_stream *st)
{
    while (st->head) {
        pd_qframe *q = st->head;
        st->head = q->next;
        free(q);
    }
    st->tail = NULL;
    free(st->held);
    st->held = NULL;
    if (st->ring)
        munmap((void *)st->ring, st->ring_size);
    st->ring = NULL;
}

static void pd_stream_free(permd_stream *st)
{
    pd_stream_release(st);
    if (st->c)
        st->c->stream = NULL;
    free(st);
}

void permd_close(permd_client *c)
{
    if (!c)
        return;
    if (c->stream) { /* still open: its memory goes now; the handle stays valid for permd_stream_close */
        pd_stream_release(c->stream);
        c->stream->c = NULL;
    }
    close(c->fd);
    if (c->pending_fd >= 0)
        close(c->pending_fd);
    pd_frame_reader_free(&c->in);
    pd_arena_free(&c->arena);
    free(c->wbuf);
    free(c);
}

int permd_set_timeout(permd_client *c, uint32_t ms)
{
    if (!c)
        return PD_EINVAL;
    c->timeout_ms = ms;
    return 0;
}

int permd_server_info_get(const permd_client *c, permd_server_info *out)
{
    if (!c || !out)
        return PD_EINVAL;
    *out = c->info;
    return 0;
}

/* ---- Datasets ---------------------------------------------------------------------- */

/* A Dataset message into out: PD_EPROTO for none, or for an id width other than 4 and 8 (callers size buffers
 * by it). */
static int pd_cl_dataset(permd_client *c, const Permd__V1__Dataset *m, permd_dataset *out)
{
    memset(out, 0, sizeof *out);
    if (!m)
        return pd_cl_fail(c, PD_EPROTO, "permd sent a DatasetReply without its dataset");
    if (m->id_width != 4 && m->id_width != 8)
        return pd_cl_fail(c, PD_EPROTO, "permd sent dataset '%s' of id width %u", m->name, m->id_width);
    snprintf(out->name, sizeof out->name, "%s", m->name);
    out->size = m->size;
    out->id_width = m->id_width;
    out->from_config = m->source == PERMD__V1__DATASET_SOURCE__DATASET_SOURCE_CONFIG;
    out->created_unix_ms = m->created_unix_ms;
    out->shards = m->shards;
    out->window = m->window;
    out->lanes = m->lanes;
    out->layout_hash = m->layout_hash;
    out->definition = m->definition;
    return 0;
}

static int pd_cl_check_name(permd_client *c, const char *name)
{
    if (!c)
        return PD_EINVAL;
    if (!name || !*name || strlen(name) > PERMD_NAME_MAX)
        return pd_cl_fail(c, PD_EINVAL, "a name (of a dataset, mixture or group) of 1-%d characters is required", PERMD_NAME_MAX);
    return 0;
}

int permd_put_dataset(permd_client *c, const char *name, uint64_t size, permd_dataset *out, int32_t *created)
{
    int rc = pd_cl_check_name(c, name);
    if (rc)
        return rc;
    Permd__V1__PutDataset m = PERMD__V1__PUT_DATASET__INIT;
    m.name = (char *)name;
    m.size = size;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_PUT_DATASET;
    req.put_dataset = &m;
    if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY, &rep)))
        return rc;
    permd_dataset d;
    if ((rc = pd_cl_dataset(c, rep->dataset_reply->dataset, out ? out : &d)))
        return rc;
    if (created)
        *created = rep->dataset_reply->created;
    return 0;
}

int permd_put_dataset_sharded(permd_client *c, const char *name, const uint64_t *sizes, uint64_t nshards,
                              uint64_t window, uint32_t lanes, permd_dataset *out, int32_t *created)
{
    int rc = pd_cl_check_name(c, name);
    if (rc)
        return rc;
    if (!sizes || nshards == 0)
        return pd_cl_fail(c, PD_EINVAL, "a sharded dataset needs at least one shard size");
    /* A varint takes at most 10 bytes; leave room for the name and the other fields. */
    uint64_t per = c->info.max_frame > 2048 ? (c->info.max_frame - 1024) / 10 : 100;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep = NULL;
    Permd__V1__PutDataset m = PERMD__V1__PUT_DATASET__INIT;
    m.name = (char *)name;
    m.shards_total = nshards;
    m.window = window;
    m.lanes = lanes;
    req.body_case = PERMD__V1__ENVELOPE__BODY_PUT_DATASET;
    req.put_dataset = &m;
    for (uint64_t first = 0; first < nshards; first += per) {
        m.shards_first = first;
        m.shard_sizes = (uint64_t *)sizes + first;
        m.n_shard_sizes = (size_t)(nshards - first < per ? nshards - first : per);
        if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY, &rep)))
            return rc;
        if (first + m.n_shard_sizes < nshards && rep->dataset_reply->shards_received != first + m.n_shard_sizes)
            return pd_cl_fail(c, PD_EPROTO, "permd acknowledged %llu shard sizes, not %llu",
                              (unsigned long long)rep->dataset_reply->shards_received,
                              (unsigned long long)(first + m.n_shard_sizes));
    }
    if (!rep->dataset_reply->dataset)
        return pd_cl_fail(c, PD_EPROTO, "permd did not confirm the dataset after its last shard sizes");
    permd_dataset d;
    if ((rc = pd_cl_dataset(c, rep->dataset_reply->dataset, out ? out : &d)))
        return rc;
    if (created)
        *created = rep->dataset_reply->created;
    return 0;
}

int permd_get_dataset(permd_client *c, const char *name, permd_dataset *out)
{
    int rc = pd_cl_check_name(c, name);
    if (rc)
        return rc;
    if (!out)
        return pd_cl_fail(c, PD_EINVAL, "out is NULL");
    Permd__V1__GetDataset m = PERMD__V1__GET_DATASET__INIT;
    m.name = (char *)name;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_GET_DATASET;
    req.get_dataset = &m;
    if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY, &rep)))
        return rc;
    return pd_cl_dataset(c, rep->dataset_reply->dataset, out);
}

/* ---- Lists, page by page (docs/protocol.md §5) ---------------------------------------- */

/* Where one List call stands. A list longer than one reply comes in pages (after = the previous reply's next);
 * names are checked as they come, so whatever is put or deleted between pages, the caller gets each name at
 * most once and in the daemon's order, and a daemon that does not advance ends in an error, not a loop. */
typedef struct pd_cl_pager {
    const char *what;               /* "dataset" or "mixture", for messages */
    char after[PERMD_NAME_MAX + 1]; /* the page asked for starts after this name ("": the first page) */
    char last[PERMD_NAME_MAX + 1];  /* the last name taken ("": none yet) */
    size_t n;                       /* names taken so far */
} pd_cl_pager;

/* Take one listed name. */
static int pd_cl_page_take(permd_client *c, pd_cl_pager *pg, const char *name)
{
    if (!name || !*name || strlen(name) > PERMD_NAME_MAX)
        return pd_cl_fail(c, PD_EPROTO, "permd listed a %s without a name of 1-%d characters", pg->what,
                          PERMD_NAME_MAX);
    const char *floor = strcmp(pg->last, pg->after) > 0 ? pg->last : pg->after; /* names come after both */
    if (strcmp(name, floor) <= 0)
        return pd_cl_fail(c, PD_EPROTO, "permd listed %s '%s' after '%s': a list is sorted by name, each once",
                          pg->what, name, floor);
    /* Each name is new and the caller's array holds what it counts: this only stops a daemon that lists
     * without end (its names may grow for ever while each page stays within a frame). */
    if (pg->n >= PERMD_LIST_MAX)
        return pd_cl_fail(c, PD_ETOOBIG, "permd lists more than %d %ss (PERMD_LIST_MAX)", PERMD_LIST_MAX, pg->what);
    memcpy(pg->last, name, strlen(name) + 1);
    pg->n++;
    return 0;
}

/* After a page of got names that ended with next: *more is 1 when another page is to be asked for (pg->after
 * is then its `after`). An older daemon ignores `paged` and sends the whole list with no next: one page. */
static int pd_cl_page_end(permd_client *c, pd_cl_pager *pg, size_t got, const char *next, int *more)
{
    *more = 0;
    if (!next || !*next)
        return 0;
    if (strlen(next) > PERMD_NAME_MAX)
        return pd_cl_fail(c, PD_EPROTO, "permd's next %s is longer than %d characters", pg->what, PERMD_NAME_MAX);
    /* A page names the last entry it holds; one that holds none, or whose next is not past the page asked
     * for, would be asked for again for ever. */
    if (got == 0 || strcmp(next, pg->after) <= 0)
        return pd_cl_fail(c, PD_EPROTO, "permd's page of %ss after '%s' did not advance (%zu entries, next '%s')",
                          pg->what, pg->after, got, next);
    memcpy(pg->after, next, strlen(next) + 1);
    *more = 1;
    return 0;
}

int permd_list_datasets(permd_client *c, permd_dataset *out, size_t cap, size_t *total)
{
    if (!c || !total || (cap && !out))
        return c ? pd_cl_fail(c, PD_EINVAL, "permd_list_datasets: total, and out for a cap, are required") : PD_EINVAL;
    pd_cl_pager pg = {.what = "dataset"};
    Permd__V1__ListDatasets m = PERMD__V1__LIST_DATASETS__INIT;
    m.paged = 1;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_LIST_DATASETS;
    req.list_datasets = &m;
    int rc, more;
    do {
        m.after = pg.after; /* the reply (in c's arena) is gone after the next call: pg holds its own copy */
        if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_LIST_DATASETS_REPLY, &rep)))
            return rc;
        const Permd__V1__ListDatasetsReply *r = rep->list_datasets_reply;
        for (size_t i = 0; i < r->n_datasets; i++) {
            size_t at = pg.n;
            if ((rc = pd_cl_page_take(c, &pg, r->datasets[i] ? r->datasets[i]->name : NULL)))
                return rc;
            if (at < cap && (rc = pd_cl_dataset(c, r->datasets[i], &out[at])))
                return rc;
        }
        if ((rc = pd_cl_page_end(c, &pg, r->n_datasets, r->next, &more)))
            return rc;
    } while (more);
    *total = pg.n;
    return 0;
}

int permd_delete_dataset(permd_client *c, const char *name)
{
    int rc = pd_cl_check_name(c, name);
    if (rc)
        return rc;
    Permd__V1__DeleteDataset m = PERMD__V1__DELETE_DATASET__INIT;
    m.name = (char *)name;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_DELETE_DATASET;
    req.delete_dataset = &m;
    return pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_DELETE_DATASET_REPLY, &rep);
}

/* ---- Fetch ---------------------------------------------------------------------------- */

static int pd_cl_slice(permd_client *c, const permd_slice *s, Permd__V1__Slice *m)
{
    if (!s || !s->dataset)
        return pd_cl_fail(c, PD_EINVAL, "a slice with a dataset name is required");
    if (s->mode > PERMD_MODE_EXACT)
        return pd_cl_fail(c, PD_EINVAL, "mode %u is not PERMD_MODE_PAD, _DROP or _EXACT", s->mode);
    permd__v1__slice__init(m);
    m->dataset = (char *)s->dataset;
    m->seed = s->seed;
    m->epoch = s->epoch;
    m->world = s->world;
    m->rank = s->rank;
    m->mode = pd_wire_mode_from_pd((int)s->mode);
    m->offset = s->offset;
    m->window = s->window;
    m->lanes = s->lanes;
    m->definition = s->definition;
    return 0;
}

/* Wire ids (little-endian, src_width bytes) into a host array of dst_width. */
static void pd_cl_copy_ids(void *dst, unsigned dst_width, const uint8_t *src, unsigned src_width, uint64_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (dst_width == src_width) {
        if (n) /* dst may be NULL when nothing was asked for */
            memcpy(dst, src, (size_t)n * src_width);
        return;
    }
#endif
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = src_width == 4 ? pd_load_le32(src + 4 * i) : pd_load_le64(src + 8 * i);
        if (dst_width == 4)
            ((uint32_t *)dst)[i] = (uint32_t)v;
        else
            ((uint64_t *)dst)[i] = v;
    }
}

/* One Fetch. out_width 4 or 8 fills out with ids; out_width 16 asks for
 * locations and fills out (shards) and out2 (offsets). */
static int pd_cl_fetch(permd_client *c, const permd_slice *s, uint64_t count, void *out, void *out2,
                       unsigned out_width, uint64_t *got, uint64_t *next_offset)
{
    Permd__V1__Slice sm;
    int rc;
    if (!c || !got || (count && (!out || (out_width == 16 && !out2))))
        return c ? pd_cl_fail(c, PD_EINVAL, "out and got are required") : PD_EINVAL;
    if ((rc = pd_cl_slice(c, s, &sm)))
        return rc;
    Permd__V1__Fetch m = PERMD__V1__FETCH__INIT;
    m.slice = &sm;
    m.count = count;
    m.locations = out_width == 16;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.id = ++c->next_id;
    req.body_case = PERMD__V1__ENVELOPE__BODY_FETCH;
    req.fetch = &m;
    const uint8_t *payload;
    uint32_t len;
    pd_bulk_view v;
    pd_cl_arm(c);
    if ((rc = pd_cl_send(c, &req)) || (rc = pd_cl_wait(c, req.id, &payload, &len)))
        return rc;
    rc = pd_frame_scan_bulk(payload, len, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, &v);
    if (rc < 0)
        return pd_cl_fail(c, PD_EPROTO, "permd sent a malformed reply");
    if (rc == 0) { /* another body: an Error's code, or (any other) not what was asked */
        rc = pd_cl_unpack(c, payload, len, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, &rep);
        return rc ? rc : pd_cl_fail(c, PD_EPROTO, "permd sent a FetchReply its scan did not find");
    }
    uint64_t width = v.f[1], n = v.f[2];
    if ((width != 4 && width != 8 && width != 16) || (width == 16) != (out_width == 16) || n > count ||
        v.ids_len % width || v.ids_len / width != n) /* n × width could wrap: divide instead */
        return pd_cl_fail(c, PD_EPROTO, "permd sent an inconsistent FetchReply");
    if (width > out_width)
        return pd_cl_fail(c, PD_EOVERFLOW, "dataset '%s' has ids above 2^32: use permd_fetch_u64", s->dataset);
    if (width == 16) {
        for (uint64_t i = 0; i < n; i++) {
            ((uint64_t *)out)[i] = pd_load_le64(v.ids + 16 * i);
            ((uint64_t *)out2)[i] = pd_load_le64(v.ids + 16 * i + 8);
        }
    } else {
        pd_cl_copy_ids(out, out_width, v.ids, (unsigned)width, n);
    }
    *got = n;
    if (next_offset)
        *next_offset = v.f[3];
    return 0;
}

int permd_fetch_u32(permd_client *c, const permd_slice *s, uint64_t count, uint32_t *out, uint64_t *got,
                    uint64_t *next_offset)
{
    return pd_cl_fetch(c, s, count, out, NULL, 4, got, next_offset);
}

int permd_fetch_u64(permd_client *c, const permd_slice *s, uint64_t count, uint64_t *out, uint64_t *got,
                    uint64_t *next_offset)
{
    return pd_cl_fetch(c, s, count, out, NULL, 8, got, next_offset);
}

int permd_fetch_locations(permd_client *c, const permd_slice *s, uint64_t count, uint64_t *shards, uint64_t *offsets,
                          uint64_t *got, uint64_t *next_offset)
{
    return pd_cl_fetch(c, s, count, shards, offsets, 16, got, next_offset);
}

int permd_group_join(permd_client *c, const char *group, uint32_t members, uint8_t nccl_id[PERMD_NCCL_ID_BYTES],
                     uint32_t *rank, uint32_t *nranks)
{
    int rc;
    if (!c || !nccl_id || !rank || !nranks)
        return c ? pd_cl_fail(c, PD_EINVAL, "nccl_id, rank and nranks are required") : PD_EINVAL;
    if ((rc = pd_cl_check_name(c, group)))
        return rc;
    Permd__V1__JoinGroup m = PERMD__V1__JOIN_GROUP__INIT;
    m.group = (char *)group;
    m.members = members;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_JOIN_GROUP;
    req.join_group = &m;
    if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_JOIN_GROUP_REPLY, &rep)))
        return rc;
    const Permd__V1__JoinGroupReply *r = rep->join_group_reply;
    if (r->nccl_id.len != PERMD_NCCL_ID_BYTES || r->rank == 0 || r->rank >= r->nranks)
        return pd_cl_fail(c, PD_EPROTO, "permd sent an inconsistent JoinGroupReply");
    memcpy(nccl_id, r->nccl_id.data, PERMD_NCCL_ID_BYTES);
    *rank = r->rank;
    *nranks = r->nranks;
    return 0;
}

int permd_group_deliver(permd_client *c, const char *group, const permd_slice *s, uint64_t count, uint32_t id_width,
                        uint64_t *got, uint32_t *width, uint64_t *next_offset)
{
    Permd__V1__Slice sm;
    int rc;
    if (!c || !got || !width)
        return c ? pd_cl_fail(c, PD_EINVAL, "got and width are required") : PD_EINVAL;
    if (id_width != 0 && id_width != 4 && id_width != 8)
        return pd_cl_fail(c, PD_EINVAL, "id_width must be 0 (the dataset's), 4 or 8");
    if ((rc = pd_cl_check_name(c, group)) || (rc = pd_cl_slice(c, s, &sm)))
        return rc;
    Permd__V1__Deliver m = PERMD__V1__DELIVER__INIT;
    m.group = (char *)group;
    m.slice = &sm;
    m.count = count;
    m.id_width = id_width;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_DELIVER;
    req.deliver = &m;
    if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_DELIVER_REPLY, &rep)))
        return rc;
    const Permd__V1__DeliverReply *r = rep->deliver_reply;
    /* A width other than the buffer's would have NCCL overrun it: no receive is posted, and the connection is
     * marked broken (the send permd queued then fails at delivery_timeout_ms, and the group with it). A permd
     * older than id_width answers with the dataset's own. */
    if ((r->id_width != 4 && r->id_width != 8) || r->count > count)
        return pd_cl_fail(c, PD_EPROTO, "permd sent an inconsistent DeliverReply");
    if (id_width && r->id_width != id_width)
        return pd_cl_fail(c, PD_EPROTO, "permd would send %u-byte ids into a buffer of %u-byte ones (a permd older "
                          "than Deliver.id_width?)", r->id_width, id_width);
    *got = r->count;
    *width = r->id_width;
    if (next_offset)
        *next_offset = r->next_offset;
    return 0;
}

int permd_group_leave(permd_client *c, const char *group)
{
    int rc = pd_cl_check_name(c, group);
    if (rc)
        return rc;
    Permd__V1__LeaveGroup m = PERMD__V1__LEAVE_GROUP__INIT;
    m.group = (char *)group;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_LEAVE_GROUP;
    req.leave_group = &m;
    return pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_LEAVE_GROUP_REPLY, &rep);
}

int permd_digest_slice(permd_client *c, const permd_slice *s, permd_digest *out)
{
    Permd__V1__Slice sm;
    int rc;
    if (!c || !out)
        return c ? pd_cl_fail(c, PD_EINVAL, "out is required") : PD_EINVAL;
    if ((rc = pd_cl_slice(c, s, &sm)))
        return rc;
    Permd__V1__Digest m = PERMD__V1__DIGEST__INIT;
    m.slice = &sm;
    m.count = c->info.max_digest; /* 0 (an older server): everything in one request */
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_DIGEST;
    req.digest = &m;
    permd_digest sum = {0, 0, 0};
    uint64_t left = UINT64_MAX; /* the previous part's remaining: each part must shrink it, or this never ends */
    for (;;) {
        if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY, &rep)))
            return rc;
        const Permd__V1__DigestReply *r = rep->digest_reply;
        if ((m.count && r->count > m.count) ||
            (r->remaining && (!m.count || !r->count || r->next_offset <= sm.offset || r->remaining >= left)))
            return pd_cl_fail(c, PD_EPROTO, "permd sent an inconsistent DigestReply");
        left = r->remaining;
        /* Digests are sums mod 2^64, so parts add up to the whole. */
        sum.count += r->count;
        sum.sum += r->sum;
        sum.hash += r->hash;
        if (!r->remaining)
            break;
        sm.offset = r->next_offset;
    }
    *out = sum;
    return 0;
}

/* ---- Streams ---------------------------------------------------------------------------- */

/* The stream's next frame: queued first, then from the socket. */
static int pd_cl_stream_frame(permd_stream *st, const uint8_t **payload, uint32_t *len)
{
    permd_client *c = st->c;
    free(st->held);
    st->held = NULL;
    if (st->head) {
        pd_qframe *q = st->head;
        st->head = q->next;
        if (!st->head)
            st->tail = NULL;
        st->queued--;
        st->held = q;
        *payload = q->data;
        *len = q->len;
        return 0;
    }
    return pd_cl_wait(c, st->id, payload, len);
}

/* Map the ring a StreamRing announced; its descriptor came with the frame. */
static int pd_cl_stream_map(permd_stream *st, const Permd__V1__StreamRing *r)
{
    permd_client *c = st->c;
    int fd = c->pending_fd, dropped = c->fds_dropped;
    c->pending_fd = -1;
    c->fds_dropped = 0; /* what was lost is told once, with the ring it belonged to */
    struct stat sb;
    int rc = 0, seals;
    if (fd < 0 && dropped)
        rc = pd_cl_fail(c, PD_EIO, "the stream ring's descriptor was dropped on receipt: is this process out of "
                                   "file descriptors (RLIMIT_NOFILE)?");
    else if (fd < 0 || !st->want_ring || st->ring)
        rc = pd_cl_fail(c, PD_EPROTO, "permd sent an unexpected StreamRing");
    else if (r->slots != st->window || !r->slot_bytes || r->slot_bytes % 64 || r->slot_bytes > (UINT64_C(1) << 40) ||
             r->size < r->slots * r->slot_bytes || r->size > SIZE_MAX)
        rc = pd_cl_fail(c, PD_EPROTO, "permd sent an inconsistent StreamRing");
    else if (fstat(fd, &sb) || (uint64_t)sb.st_size < r->size)
        rc = pd_cl_fail(c, PD_EPROTO, "the stream ring's file is smaller than announced");
    else if ((seals = fcntl(fd, F_GET_SEALS)) < 0 || !(seals & F_SEAL_SHRINK)) /* a shrink would fault our reads */
        rc = pd_cl_fail(c, PD_EPROTO, "the stream ring is not sealed against shrinking");
    if (rc == 0) {
        void *p = mmap(NULL, (size_t)r->size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) {
            rc = pd_cl_fail(c, PD_EIO, "cannot map the stream ring: %s", strerror(errno));
        } else {
            st->ring = p;
            st->ring_size = (size_t)r->size;
            st->slot_bytes = r->slot_bytes;
        }
    }
    if (fd >= 0)
        close(fd); /* the mapping keeps the memory */
    return rc;
}

/* Interpret one stream frame: 1 for a batch (filled in v), 0 for the end,
 * 2 for the ring (read on), or an error. */
static int pd_cl_stream_decode(permd_stream *st, const uint8_t *payload, uint32_t len, pd_bulk_view *v)
{
    permd_client *c = st->c;
    pd_envelope *env;
    int rc = pd_frame_scan_bulk(payload, len, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH, v);
    if (rc < 0)
        return pd_cl_fail(c, PD_EPROTO, "permd sent a malformed stream frame");
    if (rc == 1) {
        /* Batches come in order, each of 1 to batch items of the kind asked for, advancing the offset; a
         * server that breaks any of these would hand out wrong ids as if they were right. */
        const uint64_t width = v->f[1], n = v->f[2];
        if ((st->locations ? width != 16 : width != 4 && width != 8) || n == 0 || n > st->batch ||
            (st->max_count && n > st->max_count - st->received))
            return pd_cl_fail(c, PD_EPROTO, "permd sent a StreamBatch of %llu items of %llu bytes (asked: batches of "
                              "at most %llu %s%s)", (unsigned long long)n, (unsigned long long)width,
                              (unsigned long long)st->batch, st->locations ? "locations" : "ids",
                              st->max_count ? ", up to max_count" : "");
        if (v->f[4] != st->seq || v->f[3] <= st->offset)
            return pd_cl_fail(c, PD_EPROTO, "permd sent StreamBatch %llu (offset %llu) where batch %llu (past offset "
                              "%llu) was next", (unsigned long long)v->f[4], (unsigned long long)v->f[3],
                              (unsigned long long)st->seq, (unsigned long long)st->offset);
        st->seq++;
        st->received += n;
        if (!st->ring) /* count × width could wrap: divide instead */
            return v->ids_len % width == 0 && n == v->ids_len / width
                       ? 1
                       : pd_cl_fail(c, PD_EPROTO, "permd sent an inconsistent StreamBatch");
        /* Ring batches start one of the slots (so they are aligned) and stay in it. */
        const uint64_t at = v->f[5];
        if (v->ids_len || v->f[2] > st->slot_bytes / width || at % st->slot_bytes || at / st->slot_bytes >= st->window)
            return pd_cl_fail(c, PD_EPROTO, "permd sent a StreamBatch outside its ring");
        v->ids = st->ring + at;
        v->ids_len = v->f[2] * width;
        return 1;
    }
    if (v->body_field == PERMD__V1__ENVELOPE__BODY_STREAM_RING) {
        if ((rc = pd_cl_unpack(c, payload, len, PERMD__V1__ENVELOPE__BODY_STREAM_RING, &env)))
            return rc;
        return (rc = pd_cl_stream_map(st, env->stream_ring)) ? rc : 2;
    }
    if ((rc = pd_cl_unpack(c, payload, len, PERMD__V1__ENVELOPE__BODY_STREAM_END, &env)))
        return rc;
    const Permd__V1__StreamEnd *e = env->stream_end;
    if (e->delivered != st->received)
        return pd_cl_fail(c, PD_EPROTO, "permd ended a stream saying it sent %llu ids; %llu came",
                          (unsigned long long)e->delivered, (unsigned long long)st->received);
    st->offset = e->next_offset;
    switch (e->reason) {
    case PERMD__V1__END_REASON__END_REASON_COMPLETE:
        return 0;
    case PERMD__V1__END_REASON__END_REASON_CANCELLED:
        if (st->cancelled)
            return 0;
        return pd_cl_fail(c, PD_ECLOSED, "permd cancelled the stream; resume from offset %llu",
                          (unsigned long long)st->offset);
    case PERMD__V1__END_REASON__END_REASON_SHUTDOWN:
        return pd_cl_fail(c, PD_ECLOSED, "permd is shutting down; resume from offset %llu",
                          (unsigned long long)st->offset);
    default:
        return pd_cl_fail(c, PD_EPROTO, "permd ended a stream for a reason this client does not know (%d)",
                          (int)e->reason);
    }
}

int permd_stream_open(permd_client *c, const permd_slice *s, uint64_t batch, uint64_t max_count,
                      permd_stream **out)
{
    return permd_stream_open_ex(c, s, batch, max_count, 0, out);
}

int permd_stream_open_ex(permd_client *c, const permd_slice *s, uint64_t batch, uint64_t max_count, uint32_t flags,
                         permd_stream **out)
{
    Permd__V1__Slice sm;
    int rc;
    if (!c || !out)
        return c ? pd_cl_fail(c, PD_EINVAL, "permd_stream_open: out is required") : PD_EINVAL;
    if (c->stream) /* the caller's to fix, not the server's load: not PD_EBUSY */
        return pd_cl_fail(c, PD_EINVAL, "this client already has an open stream: close it first (one stream a "
                                        "client)");
    if ((rc = pd_cl_slice(c, s, &sm)))
        return rc;
    if (batch == 0)
        return pd_cl_fail(c, PD_EINVAL, "batch must be at least 1");
    permd_stream *st = calloc(1, sizeof *st);
    if (!st)
        return pd_cl_fail(c, PD_ENOMEM, "out of memory");
    st->want_ring = c->is_unix && c->server_ring && !(flags & PERMD_STREAM_SOCKET);
    /* The id width is the dataset's, unknown here: 4 bytes assumed (8-byte ids run twice as far ahead); a
     * location is 16 */
    const uint64_t item = (flags & PERMD_LOCATIONS) ? 16 : 4;
    uint64_t window = (st->want_ring ? PD_CL_RING_BYTES : PD_CL_STREAM_BYTES) / (batch * item + 1);
    uint64_t max_window = c->info.max_credits && c->info.max_credits < PD_CL_MAX_WINDOW ? c->info.max_credits
                                                                                       : PD_CL_MAX_WINDOW;
    if (window < 2) /* a Credit every other batch */
        window = 2;
    if (window > max_window) /* a server's max_credits of 1: a Credit after every batch */
        window = max_window;
    st->window = (uint32_t)window;
    st->c = c;
    st->offset = s->offset;
    st->batch = batch;
    st->max_count = max_count;
    st->locations = (flags & PERMD_LOCATIONS) != 0;
    Permd__V1__Stream m = PERMD__V1__STREAM__INIT;
    m.slice = &sm;
    m.batch = batch;
    m.credits = st->window;
    m.max_count = max_count;
    m.locations = (flags & PERMD_LOCATIONS) != 0;
    m.ring = st->want_ring;
    m.reuse_ring = st->want_ring; /* a client has one stream at a time, and closing one unmaps its ring */
    pd_envelope req = PERMD__V1__ENVELOPE__INIT;
    req.id = st->id = ++c->next_id;
    req.body_case = PERMD__V1__ENVELOPE__BODY_STREAM;
    req.stream = &m;
    const uint8_t *payload;
    uint32_t len;
    pd_bulk_view v;
    /* Wait for the first frame (after the ring, if any) so that a refused
     * stream fails here, not in next. */
    pd_cl_arm(c);
    if ((rc = pd_cl_send(c, &req)))
        goto fail;
    do
        if ((rc = pd_cl_wait(c, st->id, &payload, &len)) || (rc = pd_cl_stream_decode(st, payload, len, &v)) < 0)
            goto fail;
    while (rc == 2);
    if (rc == 1) { /* checked; permd_stream_next decodes it again from the queue and counts it then */
        st->seq--;
        st->received -= v.f[2];
    }
    c->stream = st;
    if ((rc = pd_cl_queue_stream_frame(st, payload, len)))
        goto fail;
    *out = st;
    return 0;
fail:
    if (rc == PD_ENOMEM) /* the server's stream may run on: its frames would meet the next call */
        c->broken = 1;
    pd_stream_free(st);
    return rc;
}

/* The stream's next batch (1, in v) or its end (0), past any StreamRing. */
static int pd_cl_stream_step(permd_stream *st, pd_bulk_view *v)
{
    int rc;
    do {
        const uint8_t *payload;
        uint32_t len;
        if ((rc = pd_cl_stream_frame(st, &payload, &len)))
            return rc;
        rc = pd_cl_stream_decode(st, payload, len, v);
    } while (rc == 2);
    return rc;
}

int permd_stream_shared(const permd_stream *st)
{
    return st && st->ring;
}

int permd_stream_next(permd_stream *st, const void **ids, uint32_t *width, uint64_t *count)
{
    if (!st || !ids || !width || !count)
        return st ? pd_cl_fail(st->c, PD_EINVAL, "permd_stream_next: ids, width and count are required") : PD_EINVAL;
    permd_client *c = st->c;
    *count = 0;
    *ids = NULL;
    *width = 0;
    if (!c)
        return PD_ECLOSED;
    if (st->done)
        return st->rc;
    pd_cl_arm(c);
    if (st->unacked && st->unacked >= st->window / 2) { /* top the window up in one message */
        Permd__V1__Credit m = PERMD__V1__CREDIT__INIT;
        m.credits = st->unacked;
        pd_envelope req = PERMD__V1__ENVELOPE__INIT;
        req.id = st->id;
        req.body_case = PERMD__V1__ENVELOPE__BODY_CREDIT;
        req.credit = &m;
        if ((st->rc = pd_cl_send(c, &req))) {
            st->done = 1;
            return st->rc;
        }
        st->unacked = 0;
    }
    pd_bulk_view v;
    int rc = pd_cl_stream_step(st, &v);
    if (rc <= 0) {
        st->done = 1;
        st->rc = rc;
        return rc;
    }
    st->unacked++;
    st->offset = v.f[3];
    /* Hand out aligned ids: slide them back over this frame's own header
     * (already parsed, and always longer than 8 bytes) when they are not. */
    uint8_t *p = (uint8_t *)v.ids; /* the client's own receive buffer */
    size_t mis = (uintptr_t)p % (v.f[1] < 8 ? v.f[1] : 8); /* locations: two u64s, 8-aligned */
    if (mis && !st->ring) {
        memmove(p - mis, p, v.ids_len);
        p -= mis;
    }
    *ids = p;
    *width = (uint32_t)v.f[1];
    *count = v.f[2];
    return 0;
}

uint64_t permd_stream_offset(const permd_stream *st)
{
    return st ? st->offset : 0;
}

int permd_stream_close(permd_stream *st)
{
    if (!st)
        return PD_EINVAL;
    permd_client *c = st->c;
    int rc = st->rc;
    if (c && !st->done && !c->broken) {
        Permd__V1__Cancel m = PERMD__V1__CANCEL__INIT;
        pd_envelope req = PERMD__V1__ENVELOPE__INIT;
        req.id = st->id;
        req.body_case = PERMD__V1__ENVELOPE__BODY_CANCEL;
        req.cancel = &m;
        pd_cl_arm(c); /* one deadline for the whole drain */
        st->cancelled = 1;
        rc = pd_cl_send(c, &req);
        /* Drain the batches already on their way, up to StreamEnd: no more than the credits out, since a
         * batch read here is not credited again. */
        for (uint32_t left = st->window + 1; rc == 0; left--) {
            pd_bulk_view v;
            if (!left) {
                rc = pd_cl_fail(c, PD_EPROTO, "permd sent more than the %u credited batches after a Cancel",
                                st->window);
                break;
            }
            if ((rc = pd_cl_stream_step(st, &v)) == 0)
                break;
            if (rc == 1)
                rc = 0;
        }
    }
    pd_stream_free(st);
    return rc;
}

/* ---- Inverse and stats ------------------------------------------------------------------ */

/* One Inverse request of n samples at id width w (the dataset's). */
static int pd_cl_inverse_part(permd_client *c, const char *dataset, uint64_t seed, uint64_t epoch, uint32_t world,
                              int32_t mode, uint64_t window, uint32_t lanes, unsigned w, const uint64_t *samples,
                              size_t n, uint64_t *positions, uint32_t *ranks)
{
    uint8_t *buf = malloc(n * w + 1);
    if (!buf)
        return pd_cl_fail(c, PD_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (w == 4)
            pd_store_le32(buf + 4 * i, (uint32_t)samples[i]);
        else
            pd_store_le64(buf + 8 * i, samples[i]);
    }
    Permd__V1__Inverse m = PERMD__V1__INVERSE__INIT;
    m.dataset = (char *)dataset;
    m.seed = seed;
    m.epoch = epoch;
    m.world = world;
    m.mode = mode < 0 ? PERMD__V1__MODE__MODE_UNSPECIFIED : pd_wire_mode_from_pd(mode);
    m.samples.data = buf;
    m.samples.len = n * w;
    m.window = window;
    m.lanes = lanes;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_INVERSE;
    req.inverse = &m;
    int rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_INVERSE_REPLY, &rep);
    free(buf);
    if (rc)
        return rc;
    const Permd__V1__InverseReply *r = rep->inverse_reply;
    if (r->count != n || r->positions.len != n * r->id_width || r->ranks.len != n * 4 ||
        (r->id_width != 4 && r->id_width != 8))
        return pd_cl_fail(c, PD_EPROTO, "permd sent an inconsistent InverseReply");
    pd_cl_copy_ids(positions, 8, r->positions.data, r->id_width, n);
    for (size_t i = 0; ranks && i < n; i++)
        ranks[i] = pd_load_le32(r->ranks.data + 4 * i);
    return 0;
}

int permd_inverse(permd_client *c, const char *dataset, uint64_t seed, uint64_t epoch, uint32_t world, int32_t mode,
                  const uint64_t *samples, size_t n, uint64_t *positions, uint32_t *ranks)
{
    return permd_inverse_sharded(c, dataset, seed, epoch, world, mode, 0, 0, samples, n, positions, ranks);
}

int permd_inverse_sharded(permd_client *c, const char *dataset, uint64_t seed, uint64_t epoch, uint32_t world,
                          int32_t mode, uint64_t window, uint32_t lanes, const uint64_t *samples, size_t n,
                          uint64_t *positions, uint32_t *ranks)
{
    int rc = pd_cl_check_name(c, dataset);
    if (rc)
        return rc;
    if (n && (!samples || !positions))
        return pd_cl_fail(c, PD_EINVAL, "samples and positions are required");
    if (mode > PERMD_MODE_EXACT)
        return pd_cl_fail(c, PD_EINVAL, "mode %d is not a PERMD_MODE_* (or negative for none)", mode);
    /* Samples travel at the dataset's id width, looked up at every call: a name deleted and put again with
     * another size (by any client) has another width. */
    permd_dataset d;
    if ((rc = permd_get_dataset(c, dataset, &d))) {
        permd_mixture_def *mx;
        if (rc != PERMD_ENOTFOUND)
            return rc;
        if ((rc = permd_get_mixture(c, dataset, &mx))) /* one namespace: say which it is not */
            return rc == PERMD_ENOTFOUND ? pd_cl_fail(c, PD_ENOTFOUND, "no dataset or mixture named '%s'", dataset)
                                         : rc;
        permd_mixture_def_free(mx);
        return pd_cl_fail(c, PD_EINVAL, "'%s' is a mixture: its inverse takes each global id with its component "
                          "epoch (an inverse on a mixture)", dataset);
    }
    const unsigned w = d.id_width;
    for (size_t i = 0; w == 4 && i < n; i++)
        if (samples[i] > UINT32_MAX)
            return pd_cl_fail(c, PD_EINVAL, "samples[%zu] = %llu is not a sample id of '%s'", i,
                              (unsigned long long)samples[i], dataset);
    /* More samples than one request may carry (max_frame, max_count) go in pieces. */
    permd_server_info info;
    permd_server_info_get(c, &info);
    size_t chunk = info.max_frame > 8192 ? (info.max_frame - 4096) / w : 128;
    if (info.max_count && chunk > info.max_count)
        chunk = (size_t)info.max_count;
    size_t at = 0;
    do {
        const size_t k = n - at < chunk ? n - at : chunk;
        if ((rc = pd_cl_inverse_part(c, dataset, seed, epoch, world, mode, window, lanes, w,
                                     n ? samples + at : samples, k, n ? positions + at : positions,
                                     ranks && n ? ranks + at : ranks)))
            return rc;
        at += k;
    } while (at < n);
    return 0;
}

/* The appended figures. A server with more latency buckets than
 * PERMD_LATENCY_BUCKETS has its extra ones folded into the last (+Inf). */
static void pd_cl_stats_tables(const Permd__V1__StatsReply *r, permd_stats *out)
{
    out->cpu_ids_total = r->cpu_ids_total;
    out->gpu_ids_total = r->gpu_ids_total;
    out->queue_depth = r->queue_depth;
    out->bytes_in_total = r->bytes_in_total;
    out->connections_rejected_total = r->connections_rejected_total;
    out->readahead_hits_total = r->readahead_hits_total;
    out->stream_rings_total = r->stream_rings_total;
    memset(out->latency_bounds_us, 0, sizeof out->latency_bounds_us);
    for (size_t b = 0; b < PERMD_LATENCY_BUCKETS; b++)
        out->latency_bounds_us[b] = b < r->n_latency_bounds_us && b + 1 < PERMD_LATENCY_BUCKETS
                                        ? r->latency_bounds_us[b]
                                        : UINT64_MAX;
    out->nrequests = 0;
    for (size_t i = 0; i < r->n_requests && out->nrequests < PERMD_STATS_TYPES; i++) {
        const Permd__V1__RequestStats *q = r->requests[i];
        permd_request_stats *d = &out->requests[out->nrequests++];
        memset(d, 0, sizeof *d);
        snprintf(d->type, sizeof d->type, "%s", q->type);
        d->requests = q->requests;
        d->errors = q->errors;
        d->latency_sum_us = q->latency_sum_us;
        for (size_t b = 0; b < q->n_latency_buckets; b++)
            d->latency_buckets[b < PERMD_LATENCY_BUCKETS ? b : PERMD_LATENCY_BUCKETS - 1] += q->latency_buckets[b];
    }
    out->nerrors = 0;
    for (size_t i = 0; i < r->n_errors && out->nerrors < PERMD_STATS_ERRORS; i++) {
        permd_error_stats *d = &out->errors[out->nerrors++];
        snprintf(d->type, sizeof d->type, "%s", r->errors[i]->type);
        snprintf(d->code, sizeof d->code, "%s", pd_wire_error_name(r->errors[i]->code));
        d->count = r->errors[i]->count;
    }
}

int permd_stats_get(permd_client *c, permd_stats *out)
{
    if (!c || !out)
        return c ? pd_cl_fail(c, PD_EINVAL, "permd_stats_get: out is required") : PD_EINVAL;
    Permd__V1__Stats m = PERMD__V1__STATS__INIT;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
    req.stats = &m;
    int rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_STATS_REPLY, &rep);
    if (rc)
        return rc;
    const Permd__V1__StatsReply *r = rep->stats_reply;
    out->uptime_ms = r->uptime_ms;
    out->connections = r->connections;
    out->connections_total = r->connections_total;
    out->requests_total = r->requests_total;
    out->errors_total = r->errors_total;
    out->ids_served_total = r->ids_served_total;
    out->bytes_out_total = r->bytes_out_total;
    out->datasets = r->datasets;
    out->streams_active = r->streams_active;
    out->streams_total = r->streams_total;
    out->backpressure_pauses = r->backpressure_pauses;
    out->workers = r->workers;
    pd_cl_stats_tables(r, out);
    return 0;
}

/* ---- Mixtures on the daemon ------------------------------------------------------------------- */

void permd_mixture_def_free(permd_mixture_def *d)
{
    free(d); /* one block: the struct and its arrays */
}

/* A malloc'd permd_mixture_def of a Mixture message (one block). */
static int pd_cl_mixture_def(permd_client *c, const Permd__V1__Mixture *m, permd_mixture_def **out)
{
    if (!m || m->n_components == 0 || m->n_stages == 0 || m->n_component_sizes != m->n_components)
        return pd_cl_fail(c, PD_EPROTO, "permd sent an incomplete mixture");
    if (m->id_width != 4 && m->id_width != 8) /* callers size buffers by it */
        return pd_cl_fail(c, PD_EPROTO, "permd sent a mixture of id width %u", m->id_width);
    size_t C = m->n_components, S = m->n_stages;
    const int layouts = m->n_component_shards == C && m->n_component_windows == C && m->n_component_lanes == C;
    const int hashes = layouts && m->n_component_layout_hashes == C; /* from a permd of 2026-11-26 on */
    size_t bytes = sizeof(permd_mixture_def) + (C + S + 3 * C) * sizeof(uint64_t) + (S * C + C) * sizeof(uint32_t) +
                   C * (PERMD_NAME_MAX + 1);
    permd_mixture_def *d = calloc(1, bytes);
    if (!d)
        return pd_cl_fail(c, PD_ENOMEM, "out of memory");
    d->component_sizes = (uint64_t *)(d + 1);
    d->stage_starts = d->component_sizes + C;
    /* u64 arrays, then u32 arrays, then the byte-aligned names: each array stays aligned */
    uint64_t *shards = d->stage_starts + S, *windows = shards + C, *layout_hashes = windows + C;
    d->weights = (uint32_t *)(layout_hashes + C);
    uint32_t *lanes = d->weights + S * C;
    d->components = (char(*)[PERMD_NAME_MAX + 1])(lanes + C);
    if (layouts) {
        d->component_shards = shards;
        d->component_windows = windows;
        d->component_lanes = lanes;
        memcpy(shards, m->component_shards, C * sizeof *shards);
        memcpy(windows, m->component_windows, C * sizeof *windows);
        memcpy(lanes, m->component_lanes, C * sizeof *lanes);
    }
    if (hashes) {
        d->component_layout_hashes = layout_hashes;
        memcpy(layout_hashes, m->component_layout_hashes, C * sizeof *layout_hashes);
    }
    snprintf(d->name, sizeof d->name, "%s", m->name);
    d->ncomponents = (uint32_t)C;
    d->nstages = (uint32_t)S;
    d->length = m->length;
    d->block = m->block;
    d->size = m->size;
    d->id_width = m->id_width;
    d->created_unix_ms = m->created_unix_ms;
    d->definition = m->definition;
    for (size_t j = 0; j < C; j++) {
        snprintf(d->components[j], PERMD_NAME_MAX + 1, "%s", m->components[j]);
        d->component_sizes[j] = m->component_sizes[j];
    }
    for (size_t k = 0; k < S; k++) {
        if (m->stages[k]->n_weights != C) {
            free(d);
            return pd_cl_fail(c, PD_EPROTO, "permd sent a mixture stage of %zu weights for %zu components",
                              m->stages[k]->n_weights, C);
        }
        d->stage_starts[k] = m->stages[k]->start;
        memcpy(d->weights + k * C, m->stages[k]->weights, C * sizeof(uint32_t));
    }
    *out = d;
    return 0;
}

int permd_put_mixture(permd_client *c, const char *name, const char *const *components, uint32_t ncomponents,
                      const uint64_t *stage_starts, const uint32_t *weights, uint32_t nstages, uint64_t length,
                      uint32_t block, permd_mixture_def **out, int32_t *created)
{
    int rc = pd_cl_check_name(c, name);
    if (rc)
        return rc;
    if (!components || !ncomponents || !stage_starts || !weights || !nstages)
        return pd_cl_fail(c, PD_EINVAL, "a mixture needs components and at least one stage of weights");
    Permd__V1__MixtureStage *st = calloc(nstages, sizeof *st);
    Permd__V1__MixtureStage **stp = calloc(nstages, sizeof *stp);
    if (!st || !stp) {
        free(st);
        free(stp);
        return pd_cl_fail(c, PD_ENOMEM, "out of memory");
    }
    for (uint32_t k = 0; k < nstages; k++) {
        permd__v1__mixture_stage__init(&st[k]);
        st[k].start = stage_starts[k];
        st[k].n_weights = ncomponents;
        st[k].weights = (uint32_t *)weights + (size_t)k * ncomponents;
        stp[k] = &st[k];
    }
    Permd__V1__Mixture mix = PERMD__V1__MIXTURE__INIT;
    mix.name = (char *)name;
    mix.n_components = ncomponents;
    mix.components = (char **)components;
    mix.n_stages = nstages;
    mix.stages = stp;
    mix.length = length;
    mix.block = block;
    Permd__V1__PutMixture m = PERMD__V1__PUT_MIXTURE__INIT;
    m.mixture = &mix;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_PUT_MIXTURE;
    req.put_mixture = &m;
    rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY, &rep);
    free(st);
    free(stp);
    if (rc)
        return rc;
    /* The reply is checked whole before *created says anything: a malformed one leaves both alone. */
    permd_mixture_def *d = NULL;
    if ((rc = pd_cl_mixture_def(c, rep->mixture_reply->mixture, &d)))
        return rc;
    if (created)
        *created = rep->mixture_reply->updated ? 2 : rep->mixture_reply->created ? 1 : 0;
    if (out)
        *out = d;
    else
        permd_mixture_def_free(d);
    return 0;
}

int permd_get_mixture(permd_client *c, const char *name, permd_mixture_def **out)
{
    int rc = pd_cl_check_name(c, name);
    if (rc)
        return rc;
    if (!out)
        return pd_cl_fail(c, PD_EINVAL, "out is NULL");
    Permd__V1__GetMixture m = PERMD__V1__GET_MIXTURE__INIT;
    m.name = (char *)name;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_GET_MIXTURE;
    req.get_mixture = &m;
    if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY, &rep)))
        return rc;
    return pd_cl_mixture_def(c, rep->mixture_reply->mixture, out);
}

int permd_list_mixtures(permd_client *c, char (*names)[PERMD_NAME_MAX + 1], size_t cap, size_t *total)
{
    if (!c || !total || (cap && !names))
        return c ? pd_cl_fail(c, PD_EINVAL, "permd_list_mixtures: total, and names for a cap, are required")
                 : PD_EINVAL;
    pd_cl_pager pg = {.what = "mixture"};
    Permd__V1__ListMixtures m = PERMD__V1__LIST_MIXTURES__INIT;
    m.paged = 1;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_LIST_MIXTURES;
    req.list_mixtures = &m;
    int rc, more;
    do { /* pages as permd_list_datasets */
        m.after = pg.after;
        if ((rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_LIST_MIXTURES_REPLY, &rep)))
            return rc;
        const Permd__V1__ListMixturesReply *r = rep->list_mixtures_reply;
        for (size_t i = 0; i < r->n_mixtures; i++) {
            size_t at = pg.n;
            if ((rc = pd_cl_page_take(c, &pg, r->mixtures[i] ? r->mixtures[i]->name : NULL)))
                return rc;
            if (at < cap)
                memcpy(names[at], pg.last, sizeof pg.last);
        }
        if ((rc = pd_cl_page_end(c, &pg, r->n_mixtures, r->next, &more)))
            return rc;
    } while (more);
    *total = pg.n;
    return 0;
}

int permd_delete_mixture(permd_client *c, const char *name)
{
    int rc = pd_cl_check_name(c, name);
    if (rc)
        return rc;
    Permd__V1__DeleteMixture m = PERMD__V1__DELETE_MIXTURE__INIT;
    m.name = (char *)name;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_DELETE_MIXTURE;
    req.delete_mixture = &m;
    return pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_DELETE_DATASET_REPLY, &rep);
}

/* One Inverse request of n global ids of a mixture (at its id width w) with their component epochs. */
static int pd_cl_inverse_mixture_part(permd_client *c, const char *mixture, uint64_t seed, uint32_t world, int mode,
                                      unsigned w, const uint64_t *samples, const uint64_t *component_epochs, size_t n,
                                      uint64_t *epochs, uint64_t *positions, uint32_t *ranks)
{
    uint8_t *buf = malloc(n * w + 1);
    if (!buf)
        return pd_cl_fail(c, PD_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (w == 4)
            pd_store_le32(buf + 4 * i, (uint32_t)samples[i]);
        else
            pd_store_le64(buf + 8 * i, samples[i]);
    }
    Permd__V1__Inverse m = PERMD__V1__INVERSE__INIT;
    m.dataset = (char *)mixture;
    m.seed = seed;
    m.world = world;
    m.mode = mode < 0 ? PERMD__V1__MODE__MODE_UNSPECIFIED : pd_wire_mode_from_pd(mode);
    m.samples.data = buf;
    m.samples.len = n * w;
    m.n_component_epochs = n;
    m.component_epochs = (uint64_t *)component_epochs;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *rep;
    req.body_case = PERMD__V1__ENVELOPE__BODY_INVERSE;
    req.inverse = &m;
    int rc = pd_cl_call(c, &req, PERMD__V1__ENVELOPE__BODY_INVERSE_REPLY, &rep);
    free(buf);
    if (rc)
        return rc;
    const Permd__V1__InverseReply *r = rep->inverse_reply;
    if (r->count != n || r->id_width != 8 || r->positions.len != n * 8 || r->ranks.len != n * 4 || r->n_epochs != n)
        return pd_cl_fail(c, PD_EPROTO, "permd sent an inconsistent InverseReply for a mixture");
    for (size_t i = 0; i < n; i++) {
        epochs[i] = r->epochs[i];
        positions[i] = pd_load_le64(r->positions.data + 8 * i);
        if (ranks)
            ranks[i] = pd_load_le32(r->ranks.data + 4 * i);
    }
    return 0;
}

int permd_inverse_mixture(permd_client *c, const char *mixture, uint64_t seed, uint32_t world, int mode,
                          const uint64_t *samples, const uint64_t *component_epochs, uint64_t count, uint64_t *epochs,
                          uint64_t *positions, uint32_t *ranks)
{
    int rc = pd_cl_check_name(c, mixture);
    if (rc)
        return rc;
    if (count && (!samples || !component_epochs || !epochs || !positions))
        return pd_cl_fail(c, PD_EINVAL, "samples, component_epochs, epochs and positions are required");
    if (mode > PERMD_MODE_EXACT)
        return pd_cl_fail(c, PD_EINVAL, "mode %d is not a PERMD_MODE_* (or negative for none)", mode);
    if (count > SIZE_MAX / 16)
        return pd_cl_fail(c, PD_EINVAL, "count %llu is more than this process can address",
                          (unsigned long long)count);
    permd_mixture_def *d;
    if ((rc = permd_get_mixture(c, mixture, &d))) { /* samples travel at the mixture's id width */
        permd_dataset ds;
        if (rc != PERMD_ENOTFOUND)
            return rc;
        if ((rc = permd_get_dataset(c, mixture, &ds))) /* one namespace: say which it is not */
            return rc == PERMD_ENOTFOUND ? pd_cl_fail(c, PD_ENOTFOUND, "no dataset or mixture named '%s'", mixture)
                                         : rc; /* a broken connection is not "no such name" */
        return pd_cl_fail(c, PD_EINVAL, "'%s' is a dataset: its inverse takes sample ids alone, without "
                          "component epochs (an inverse on a dataset)", mixture);
    }
    const unsigned w = d->id_width;
    permd_mixture_def_free(d);
    for (uint64_t i = 0; w == 4 && i < count; i++)
        if (samples[i] > UINT32_MAX)
            return pd_cl_fail(c, PD_EINVAL, "samples[%llu] = %llu is not a sample id of '%s'", (unsigned long long)i,
                              (unsigned long long)samples[i], mixture);
    /* More than one request may carry go in pieces, as permd_inverse's: each id takes w bytes and its component
     * epoch a varint of up to 10 (one request of 256,000 ids was a frame past max_frame, which ended the
     * connection). */
    permd_server_info info;
    permd_server_info_get(c, &info);
    size_t chunk = info.max_frame > 8192 ? (info.max_frame - 4096) / (w + 10) : 128;
    if (info.max_count && chunk > info.max_count)
        chunk = (size_t)info.max_count;
    size_t at = 0;
    do {
        const size_t k = count - at < chunk ? (size_t)count - at : chunk;
        if ((rc = pd_cl_inverse_mixture_part(c, mixture, seed, world, mode, w, count ? samples + at : samples,
                                             count ? component_epochs + at : component_epochs, k,
                                             count ? epochs + at : epochs, count ? positions + at : positions,
                                             ranks && count ? ranks + at : ranks)))
            return rc;
        at += k;
    } while (at < count);
    return 0;
}
