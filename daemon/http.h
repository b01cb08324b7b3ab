/* A tiny HTTP/1.1 responder on the event loop for Prometheus: GET /metrics and GET /healthz, one request per connection. */
#ifndef PD_HTTP_H
#define PD_HTTP_H

#include <stddef.h>

#include "daemon/server.h"

#define PD_HTTP_MAX_HEAD 8192 /* request line and headers; more gets 431 */
#define PD_HTTP_MAX_CONNS 64  /* scrapers at once; more are closed at accept */
#define PD_HTTP_TIMEOUT_MS 5000

typedef struct pd_http_request {
    char method[8];  /* "GET" */
    char path[256];  /* "/metrics", query string removed */
    size_t head_len; /* bytes of the request line and headers, blank line included */
} pd_http_request;

/* Parse the head of a request from the bytes received so far: 1 when it is
 * complete (req filled), 0 when more bytes are needed, PD_EPROTO when it is
 * not an HTTP/1.x request, PD_ETOOBIG when the head exceeds PD_HTTP_MAX_HEAD. */
int pd_http_parse(const char *buf, size_t len, pd_http_request *req);

/* The response to a parsed request (or to a parse error `rc`) as one
 * malloc'd buffer of headers and body. PD_ENOMEM. */
int pd_http_respond(pd_server *s, int rc, const pd_http_request *req, char **out, size_t *len);

/* Listen on HOST:PORT. optional: a port in use is a warning (metrics off),
 * not an error. PD_EIO / PD_ENOMEM. */
int pd_http_listen(pd_server *s, const char *hostport, int optional);
/* Stop listening and close scrapers' connections. Idempotent. */
void pd_http_close(pd_server *s);

#endif
