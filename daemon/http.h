/* A tiny HTTP/1.1 responder on the event loop for Prometheus: GET /metrics and GET /healthz, one request per connection. */
#ifndef PD_HTTP_H
#define PD_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

typedef struct pd_http_request {
    char method[8];  /* "GET" */
    char path[256];  /* "/metrics", query string removed */
    size_t head_len; /* bytes of the request line and headers, blank line included */
} pd_http_request;

/* Parse the head of a request from the bytes received so far: 1 when it is
 * complete (req filled), 0 when more bytes are needed, PD_EPROTO when it is
 * not an HTTP/1.x request, PD_ETOOBIG when the head (request line and headers)
 * does not end within max_head bytes (metrics_max_head; answered 431). */
int pd_http_parse(const char *buf, size_t len, size_t max_head, pd_http_request *req);

/* What the endpoint serves, from its owner: the /metrics text (a malloc'd buffer) and whether
 * permd is stopping (/healthz then says 503). */
typedef struct pd_http_routes {
    int (*metrics)(void *ctx, char **body, size_t *len);
    int (*stopping)(void *ctx);
    void *ctx;
} pd_http_routes;

typedef struct pd_http_limits {
    unsigned max_conns;  /* scrapers at once; a new one beyond evicts the oldest (metrics_connections) */
    uint64_t timeout_ms; /* a scraper's whole exchange (metrics_timeout_ms) */
    uint64_t cache_ms;   /* a /metrics body is served again for this long (metrics_cache_ms); 0: rendered each time */
    size_t max_head;     /* bytes of a request's head; each scraper holds a buffer this big (metrics_max_head) */
} pd_http_limits;

/* The response to a parsed request (or to a parse error `rc`) as one
 * malloc'd buffer of headers and body. PD_ENOMEM. */
int pd_http_respond(const pd_http_routes *routes, int rc, const pd_http_request *req, char **out, size_t *len);

typedef struct pd_http pd_http;

/* Listen on HOST:PORT on loop. optional: a port in use is a warning (metrics off, *out = NULL),
 * not an error. PD_EIO / PD_ENOMEM / PD_EINVAL. */
int pd_http_listen(uv_loop_t *loop, const char *hostport, int optional, const pd_http_routes *routes,
                   const pd_http_limits *lim, pd_http **out);
/* Scrapers evicted to make room for newer ones (permd_http_evicted_total); any thread. */
uint64_t pd_http_evicted(const pd_http *h);
/* Scrapes of /metrics (GET or HEAD) answered with a body rendered earlier, within cache_ms
 * (permd_http_cache_hits_total); any thread. */
uint64_t pd_http_cache_hits(const pd_http *h);
/* Scrapers closed at metrics_timeout_ms before their request arrived whole (slow or idle ones; those
 * answered and lingering are not counted); any thread. */
uint64_t pd_http_expired(const pd_http *h);
/* Stop listening and close scrapers' connections; the endpoint frees itself once its handles are
 * closed. NULL is a no-op. */
void pd_http_close(pd_http *h);

#endif
