/* The metrics endpoint: a bounded HTTP/1.1 request parser and responder on the libuv loop (no keep-alive, no bodies). */
#include "daemon/http.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "daemon/clock.h"
#include "daemon/listen.h"
#include "daemon/log.h"

/* ---- Parsing ------------------------------------------------------------------ */

/* Where the head ends (after the blank line), or 0 when it has not yet. */
static size_t pd_http_head_end(const char *buf, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] != '\n')
            continue;
        if (buf[i + 1] == '\n')
            return i + 2;
        if (buf[i + 1] == '\r' && i + 2 < len && buf[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

/* One token of the request line, ended by a space: [start, start + n). */
static size_t pd_http_token(const char *p, const char *end)
{
    size_t n = 0;
    while (p + n < end && p[n] != ' ')
        n++;
    return n;
}

int pd_http_parse(const char *buf, size_t len, size_t max_head, pd_http_request *req)
{
    memset(req, 0, sizeof *req);
    size_t head = pd_http_head_end(buf, len < max_head ? len : max_head);
    if (!head)
        return len >= max_head ? PD_ETOOBIG : 0;
    const char *p = buf, *end = memchr(buf, '\n', head);
    if (end > p && end[-1] == '\r')
        end--;

    size_t n = pd_http_token(p, end); /* method: 1-7 upper-case letters */
    if (n == 0 || n >= sizeof req->method)
        return PD_EPROTO;
    for (size_t i = 0; i < n; i++)
        if (p[i] < 'A' || p[i] > 'Z')
            return PD_EPROTO;
    memcpy(req->method, p, n);
    p += n;
    if (p >= end || *p++ != ' ')
        return PD_EPROTO;

    n = pd_http_token(p, end); /* target: origin form, printable ASCII */
    if (n == 0 || p[0] != '/' || n >= sizeof req->path)
        return PD_EPROTO;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] <= 0x20 || (unsigned char)p[i] >= 0x7f)
            return PD_EPROTO;
    size_t path = 0;
    while (path < n && p[path] != '?' && p[path] != '#')
        path++;
    memcpy(req->path, p, path);
    p += n;
    if (p >= end || *p++ != ' ')
        return PD_EPROTO;

    if ((size_t)(end - p) != 8 || memcmp(p, "HTTP/1.", 7) || (p[7] != '0' && p[7] != '1'))
        return PD_EPROTO;

    /* Header lines: "Name: value"; nothing in them matters to us but their shape. */
    const char *line = memchr(buf, '\n', head) + 1, *stop = buf + head;
    while (line < stop) {
        const char *nl = memchr(line, '\n', (size_t)(stop - line));
        size_t ll = (size_t)(nl - line);
        if (ll && line[ll - 1] == '\r')
            ll--;
        if (ll == 0)
            break; /* the blank line */
        const char *colon = memchr(line, ':', ll);
        if (!colon || colon == line)
            return PD_EPROTO;
        for (const char *c = line; c < line + ll; c++)
            if (*c == '\0')
                return PD_EPROTO;
        line = nl + 1;
    }
    req->head_len = head;
    return 1;
}

/* ---- Responses ------------------------------------------------------------------ */

static int pd_http_build(int status, const char *reason, const char *type, const char *extra, const char *body,
                         size_t body_len, int head_only, char **out, size_t *len)
{
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n"
                     "Cache-Control: no-store\r\n\r\n",
                     status, reason, type, body_len, extra);
    if (n < 0 || (size_t)n >= sizeof hdr)
        return PD_EINTERNAL;
    size_t total = (size_t)n + (head_only ? 0 : body_len);
    char *r = malloc(total);
    if (!r)
        return PD_ENOMEM;
    memcpy(r, hdr, (size_t)n);
    if (!head_only)
        memcpy(r + n, body, body_len);
    *out = r;
    *len = total;
    return 0;
}

static int pd_http_text(int status, const char *reason, const char *extra, const char *body, int head_only,
                        char **out, size_t *len)
{
    return pd_http_build(status, reason, "text/plain; charset=utf-8", extra, body, strlen(body), head_only, out,
                         len);
}

int pd_http_respond(const pd_http_routes *routes, int rc, const pd_http_request *req, char **out, size_t *len)
{
    if (rc == PD_ETOOBIG)
        return pd_http_text(431, "Request Header Fields Too Large", "", "request head too large\n", 0, out, len);
    if (rc < 0)
        return pd_http_text(400, "Bad Request", "", "not an HTTP/1.x request\n", 0, out, len);
    int head = !strcmp(req->method, "HEAD");
    if (!head && strcmp(req->method, "GET"))
        return pd_http_text(405, "Method Not Allowed", "Allow: GET, HEAD\r\n", "only GET and HEAD\n", 0, out, len);
    if (!strcmp(req->path, "/healthz")) {
        if (routes->stopping(routes->ctx))
            return pd_http_text(503, "Service Unavailable", "", "stopping\n", head, out, len);
        return pd_http_text(200, "OK", "", "ok\n", head, out, len);
    }
    if (!strcmp(req->path, "/metrics")) {
        char *body;
        size_t blen;
        int err = routes->metrics(routes->ctx, &body, &blen);
        if (err)
            return err;
        err = pd_http_build(200, "OK", "text/plain; version=0.0.4; charset=utf-8", "", body, blen, head, out, len);
        free(body);
        return err;
    }
    return pd_http_text(404, "Not Found", "", "permd serves /metrics and /healthz\n", head, out, len);
}

/* ---- Connections ------------------------------------------------------------------ */

typedef struct pd_http_conn pd_http_conn;

struct pd_http {
    pd_http_routes routes; /* the owner's */
    pd_http_routes served; /* what pd_http_respond is given: the owner's, /metrics through the cache */
    pd_http_limits lim;
    _Atomic uint64_t evicted;
    _Atomic uint64_t expired; /* closed at the deadline before their request was whole */
    _Atomic uint64_t cache_hits;
    char *cache;              /* the last /metrics body rendered (lim.cache_ms > 0), or NULL */
    size_t cache_len;
    uint64_t cache_at;        /* when it was rendered (pd_clock_ms) */
    uv_tcp_t listener;
    pd_accept_drop drop; /* a connection pd_http_accept could not take (out of memory) */
    uv_timer_t sweep; /* closes connections past their deadline */
    pd_http_conn *conns;
    unsigned nconns;
    unsigned handles; /* open handles; freed when the last one closes after pd_http_close */
    int closing;
};

struct pd_http_conn {
    uv_tcp_t tcp;
    pd_http *http;
    pd_http_conn *prev, *next;
    uint64_t deadline_ms;
    uv_write_t wreq;
    uv_shutdown_t sreq;
    char *resp;
    size_t resp_len;
    size_t len; /* bytes of the request in buf */
    int closing;
    char buf[]; /* max_head bytes */
};

static void pd_http_release(pd_http *h)
{
    if (--h->handles == 0 && h->closing) {
        free(h->cache);
        free(h);
    }
}

/* /metrics through the cache: a body rendered less than cache_ms ago is served again (a copy).
 * Rendering costs ~90 us of the loop that serves this endpoint (loop 0, which also accepts every
 * connection and takes the signals); one client scraping in a loop reached 3,000 scrapes a second,
 * a third of that loop. With the cache, scrapers cost a copy each and one render per cache_ms.
 * Only this loop touches the cache. */
static int pd_http_cached_metrics(void *ctx, char **body, size_t *len)
{
    pd_http *h = ctx;
    uint64_t now = pd_clock_ms();
    if (!h->lim.cache_ms)
        return h->routes.metrics(h->routes.ctx, body, len);
    int hit = h->cache && now - h->cache_at < h->lim.cache_ms;
    if (!hit) {
        char *fresh;
        size_t flen;
        int rc = h->routes.metrics(h->routes.ctx, &fresh, &flen);
        if (rc)
            return rc;
        free(h->cache);
        h->cache = fresh;
        h->cache_len = flen;
        h->cache_at = now;
    }
    char *copy = malloc(h->cache_len ? h->cache_len : 1);
    if (!copy)
        return PD_ENOMEM;
    memcpy(copy, h->cache, h->cache_len);
    if (hit)
        atomic_fetch_add(&h->cache_hits, 1);
    *body = copy;
    *len = h->cache_len;
    return 0;
}

/* /healthz is never cached: it says whether permd is stopping now. */
static int pd_http_live_stopping(void *ctx)
{
    pd_http *h = ctx;
    return h->routes.stopping(h->routes.ctx);
}

static void pd_http_on_handle_close(uv_handle_t *handle)
{
    pd_http_release(handle->data);
}

static void pd_http_on_conn_close(uv_handle_t *handle)
{
    pd_http_conn *c = handle->data;
    pd_http *h = c->http;
    free(c->resp);
    free(c);
    pd_http_release(h);
}

static void pd_http_conn_close(pd_http_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    pd_http *h = c->http;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    h->nconns--;
    uv_close((uv_handle_t *)&c->tcp, pd_http_on_conn_close);
}

static void pd_http_on_shutdown(uv_shutdown_t *req, int status)
{
    pd_http_conn *c = req->data;
    if (status < 0)
        pd_http_conn_close(c);
}

static void pd_http_on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf);
static void pd_http_on_discard(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* The response is out: send FIN, and read (discarding) until the scraper
 * closes, so that request bytes we did not read (a body, a huge header)
 * cannot make the kernel reset the connection before the response arrives.
 * The sweep bounds the wait. */
static void pd_http_on_write(uv_write_t *w, int status)
{
    pd_http_conn *c = w->data;
    c->sreq.data = c;
    if (status < 0 || c->closing || uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, pd_http_on_shutdown) ||
        uv_read_start((uv_stream_t *)&c->tcp, pd_http_on_alloc, pd_http_on_discard))
        pd_http_conn_close(c);
}

static void pd_http_on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    pd_http_conn *c = handle->data;
    (void)suggested;
    if (c->resp) { /* the response is out: reuse the whole buffer for discarded input */
        *buf = uv_buf_init(c->buf, (unsigned)c->http->lim.max_head);
        return;
    }
    *buf = uv_buf_init(c->buf + c->len, (unsigned)(c->http->lim.max_head - c->len));
}

static void pd_http_on_discard(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    if (nread < 0)
        pd_http_conn_close(st->data);
}

static void pd_http_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    pd_http_conn *c = st->data;
    pd_http_request req;
    (void)buf;
    if (c->closing || nread == 0)
        return;
    if (nread < 0) { /* EOF before a complete request, or a reset */
        pd_http_conn_close(c);
        return;
    }
    c->len += (size_t)nread;
    int rc = pd_http_parse(c->buf, c->len, c->http->lim.max_head, &req);
    if (rc == 0)
        return;
    uv_read_stop(st);
    if (pd_http_respond(&c->http->served, rc, &req, &c->resp, &c->resp_len)) {
        pd_http_conn_close(c);
        return;
    }
    uv_buf_t b = uv_buf_init(c->resp, (unsigned)c->resp_len);
    c->wreq.data = c;
    if (uv_write(&c->wreq, st, &b, 1, pd_http_on_write))
        pd_http_conn_close(c);
}

static void pd_http_accept(uv_stream_t *listener, int status)
{
    pd_http *h = listener->data;
    if (status < 0 || h->closing)
        return;
    pd_http_conn *c = calloc(1, sizeof *c + h->lim.max_head);
    if (!c)
        return;
    c->http = h;
    uv_tcp_init(listener->loop, &c->tcp);
    c->tcp.data = c;
    h->handles++;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    h->nconns++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp)) {
        pd_http_conn_close(c);
        return;
    }
    if (h->nconns > h->lim.max_conns) {
        /* Full: the oldest scraper that has not sent its request yet makes room (else the oldest).
         * Slow or idle clients then cannot keep a health probe out: a probe asks at once. */
        pd_http_conn *oldest = NULL, *oldest_waiting = NULL;
        for (pd_http_conn *o = h->conns->next; o; o = o->next) { /* newest first; c itself is the head */
            oldest = o;
            if (!o->resp)
                oldest_waiting = o;
        }
        pd_http_conn_close(oldest_waiting ? oldest_waiting : oldest);
        atomic_fetch_add(&h->evicted, 1);
    }
    c->deadline_ms = pd_clock_ms() + h->lim.timeout_ms;
    if (uv_read_start((uv_stream_t *)&c->tcp, pd_http_on_alloc, pd_http_on_read))
        pd_http_conn_close(c);
}

/* Accept, then close a connection pd_http_accept left waiting: else libuv would read the listener no more. */
static void pd_http_on_connection(uv_stream_t *listener, int status)
{
    pd_http_accept(listener, status);
    pd_accept_drop_left(&((pd_http *)listener->data)->drop);
}

static void pd_http_on_sweep(uv_timer_t *t)
{
    pd_http *h = t->data;
    uint64_t now = pd_clock_ms();
    for (pd_http_conn *c = h->conns, *next; c; c = next) {
        next = c->next;
        if (now >= c->deadline_ms) {
            if (!c->resp) /* a slow or idle scraper, not one that was answered and lingers */
                atomic_fetch_add(&h->expired, 1);
            pd_http_conn_close(c);
        }
    }
}

uint64_t pd_http_evicted(const pd_http *h)
{
    return h ? atomic_load(&h->evicted) : 0;
}

uint64_t pd_http_expired(const pd_http *h)
{
    return h ? atomic_load(&h->expired) : 0;
}

uint64_t pd_http_cache_hits(const pd_http *h)
{
    return h ? atomic_load(&h->cache_hits) : 0;
}

int pd_http_listen(uv_loop_t *loop, const char *hostport, int optional, const pd_http_routes *routes,
                   const pd_http_limits *lim, pd_http **out)
{
    struct sockaddr_storage sa;
    if (lim->max_head < 64 || lim->max_head > UINT32_MAX) /* the shortest request is 18 bytes */
        return PD_EINVAL;
    int rc = pd_listen_sockaddr(hostport, "http", &sa);
    if (rc)
        return rc;
    pd_http *h = calloc(1, sizeof *h);
    if (!h)
        return PD_ENOMEM;
    h->routes = *routes;
    h->served = (pd_http_routes){.metrics = pd_http_cached_metrics, .stopping = pd_http_live_stopping, .ctx = h};
    h->lim = *lim;
    *out = NULL;
    uv_tcp_init(loop, &h->listener);
    uv_timer_init(loop, &h->sweep);
    h->listener.data = h->sweep.data = h;
    h->handles = 3;
    pd_accept_drop_init(&h->drop, (uv_stream_t *)&h->listener, 1, h, pd_http_on_handle_close);
    rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&h->listener, 64, pd_http_on_connection);
    if (rc) {
        pd_http_close(h);
        if (optional && rc == UV_EADDRINUSE) {
            pd_log_warn("listen", "transport=http addr=%s err=%s msg=\"the default metrics port is taken; "
                        "metrics are off (set metrics to another HOST:PORT, or empty)\"", hostport,
                        uv_err_name(rc));
            return 0;
        }
        pd_log_error("listen", "transport=http addr=%s err=%s", hostport, uv_err_name(rc));
        return PD_EIO;
    }
    uv_timer_start(&h->sweep, pd_http_on_sweep, 1000, 1000);
    uv_unref((uv_handle_t *)&h->sweep);
    *out = h;
    pd_log_info("listen", "transport=http addr=%s paths=/metrics,/healthz", hostport);
    return 0;
}

void pd_http_close(pd_http *h)
{
    if (!h || h->closing)
        return;
    h->closing = 1;
    while (h->conns)
        pd_http_conn_close(h->conns);
    pd_accept_drop_close(&h->drop);
    uv_close((uv_handle_t *)&h->listener, pd_http_on_handle_close);
    uv_close((uv_handle_t *)&h->sweep, pd_http_on_handle_close);
}
