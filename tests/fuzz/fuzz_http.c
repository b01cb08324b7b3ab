/* libFuzzer target: the metrics endpoint's HTTP request parser and responder on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "daemon/http.h"
#include "daemon/stats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HEAD 8192 /* metrics_max_head's default */

static int render(void *ctx, char **body, size_t *len)
{
    static pd_stats_view v; /* zeroed: no registry, no backend; enough to render */
    (void)ctx;
    return pd_stats_render(&v, body, len);
}

static int stopping(void *ctx)
{
    (void)ctx;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const pd_http_routes routes = {.metrics = render, .stopping = stopping};
    pd_http_request req;
    /* Bytes arrive in two parts, as a scraper's may: the verdict on the whole
     * must not depend on an earlier incomplete look. */
    size_t split = size ? data[0] % (size + 1) : 0;
    int early = pd_http_parse((const char *)data, split, HEAD, &req);
    int rc = pd_http_parse((const char *)data, size, HEAD, &req);
    if (early == 1 && rc != 1)
        abort();
    if (rc == 1) {
        if (req.head_len == 0 || req.head_len > size || req.head_len > HEAD || req.path[0] != '/' ||
            !req.method[0] || memchr(req.path, '?', strlen(req.path)))
            abort();
    } else if (rc != 0 && rc != PD_EPROTO && rc != PD_ETOOBIG) {
        abort();
    }
    if (rc == 0)
        return 0;
    char *out;
    size_t len;
    if (pd_http_respond(&routes, rc, &req, &out, &len) == 0) {
        if (len < 12 || memcmp(out, "HTTP/1.1 ", 9))
            abort();
        free(out);
    }
    return 0;
}
