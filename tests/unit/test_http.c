/* Tests for daemon/http.c: the request parser's verdicts and the responses for each path, method and error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/http.h"
#include "daemon/stats.h"

#define HEAD 8192 /* metrics_max_head's default */

static int parse(const char *s, pd_http_request *r)
{
    return pd_http_parse(s, strlen(s), HEAD, r);
}

static void test_parse(void **state)
{
    (void)state;
    pd_http_request r;
    const char *get = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nAccept: */*\r\n\r\n";
    assert_int_equal(parse(get, &r), 1);
    assert_string_equal(r.method, "GET");
    assert_string_equal(r.path, "/metrics");
    assert_int_equal(r.head_len, strlen(get));
    for (size_t cut = 0; cut < strlen(get); cut++) /* any prefix: more bytes needed, never a verdict */
        assert_int_equal(pd_http_parse(get, cut, HEAD, &r), 0);
    assert_int_equal(parse("HEAD /healthz?verbose=1#x HTTP/1.0\n\n", &r), 1); /* bare LF, query dropped */
    assert_string_equal(r.path, "/healthz");
    assert_int_equal(parse("GET /metrics HTTP/1.1\r\n\r\nbody after the head", &r), 1);

    const char *bad[] = {
        "get /metrics HTTP/1.1\r\n\r\n",      /* lower-case method */
        "GET metrics HTTP/1.1\r\n\r\n",       /* not origin form */
        "GET /metrics\r\n\r\n",               /* HTTP/0.9 */
        "GET /metrics HTTP/2.0\r\n\r\n",      /* not 1.x */
        "GET /metrics HTTP/1.1 \r\n\r\n",     /* trailing space */
        "GET  /metrics HTTP/1.1\r\n\r\n",     /* two spaces */
        "GET /a\x01 HTTP/1.1\r\n\r\n",        /* control byte in the target */
        "GET / HTTP/1.1\r\nno colon\r\n\r\n", /* a header line that is not one */
        "GET / HTTP/1.1\r\n: empty name\r\n\r\n",
        "LONGMETHOD / HTTP/1.1\r\n\r\n",
        "\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (parse(bad[i], &r) != PD_EPROTO)
            fail_msg("accepted %s", bad[i]);

    char big[HEAD + 64];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    assert_int_equal(pd_http_parse(big, sizeof big, HEAD, &r), PD_ETOOBIG);
    assert_int_equal(pd_http_parse(big, HEAD - 1, HEAD, &r), 0);
    /* The limit is the caller's: a head of 300 bytes is whole under 8192 and too large under 256. */
    char mid[301];
    memset(mid, 'a', sizeof mid);
    memcpy(mid, "GET / HTTP/1.1\r\nX: ", 19);
    memcpy(mid + 296, "\r\n\r\n", 4);
    mid[300] = '\0';
    assert_int_equal(pd_http_parse(mid, 300, HEAD, &r), 1);
    assert_int_equal(r.head_len, 300);
    assert_int_equal(pd_http_parse(mid, 300, 256, &r), PD_ETOOBIG);
    assert_int_equal(pd_http_parse(mid, 200, 256, &r), 0);
    char path[400] = "GET /";
    memset(path + 5, 'p', 300);
    strcpy(path + 305, " HTTP/1.1\r\n\r\n");
    assert_int_equal(parse(path, &r), PD_EPROTO); /* a target longer than we route */
}

/* The routes permd gives its endpoint, over a zeroed set of counters. */
typedef struct fake_server {
    int stopping;
} fake_server;

static int fake_metrics(void *ctx, char **body, size_t *len)
{
    pd_stats_view v;
    (void)ctx;
    memset(&v, 0, sizeof v); /* no registry, no backend: enough to render */
    return pd_stats_render(&v, body, len);
}

static int fake_stopping(void *ctx)
{
    return ((fake_server *)ctx)->stopping;
}

static int status_of(fake_server *s, int rc, const char *method, const char *path, char **body)
{
    pd_http_request r = {0};
    char *out;
    size_t len;
    snprintf(r.method, sizeof r.method, "%s", method);
    snprintf(r.path, sizeof r.path, "%s", path);
    pd_http_routes routes = {.metrics = fake_metrics, .stopping = fake_stopping, .ctx = s};
    assert_int_equal(pd_http_respond(&routes, rc, &r, &out, &len), 0);
    char *raw = out; /* the response is bytes, not a string */
    out = strndup(raw, len);
    free(raw);
    assert_int_equal(strlen(out), len);
    int status = 0;
    assert_int_equal(sscanf(out, "HTTP/1.1 %d ", &status), 1);
    const char *sep = strstr(out, "\r\n\r\n");
    assert_non_null(sep);
    size_t clen = 0;
    const char *cl = strstr(out, "Content-Length: ");
    assert_non_null(cl);
    sscanf(cl, "Content-Length: %zu", &clen);
    size_t blen = len - (size_t)(sep + 4 - out);
    assert_true(blen == clen || (blen == 0 && !strcmp(method, "HEAD")));
    *body = strndup(sep + 4, blen);
    free(out);
    return status;
}

static void test_respond(void **state)
{
    (void)state;
    fake_server s = {0};
    char *body;
    assert_int_equal(status_of(&s, 1, "GET", "/healthz", &body), 200);
    assert_string_equal(body, "ok\n");
    free(body);
    assert_int_equal(status_of(&s, 1, "GET", "/metrics", &body), 200);
    assert_non_null(strstr(body, "# TYPE permd_requests_total counter\n"));
    assert_non_null(strstr(body, "permd_requests_total{type=\"fetch\"} 0\n"));
    free(body);
    assert_int_equal(status_of(&s, 1, "HEAD", "/metrics", &body), 200);
    assert_string_equal(body, "");
    free(body);
    assert_int_equal(status_of(&s, 1, "GET", "/", &body), 404);
    free(body);
    assert_int_equal(status_of(&s, 1, "DELETE", "/metrics", &body), 405);
    free(body);
    assert_int_equal(status_of(&s, PD_EPROTO, "", "", &body), 400);
    free(body);
    assert_int_equal(status_of(&s, PD_ETOOBIG, "", "", &body), 431);
    free(body);
    s.stopping = 1;
    assert_int_equal(status_of(&s, 1, "GET", "/healthz", &body), 503);
    free(body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_respond),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
