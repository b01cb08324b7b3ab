/* Tests for daemon/http.c on a real loop: a scraper that never finishes its request is closed at the
 * deadline and counted (pd_http_expired); one that was answered and lingers is closed, not counted;
 * /metrics bodies are served again within metrics_cache_ms, /healthz never; heads past metrics_max_head get 431. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/http.h"

static int metrics(void *ctx, char **body, size_t *len)
{
    (void)ctx;
    *body = strdup("m 1\n");
    *len = 4;
    return *body ? 0 : PD_ENOMEM;
}

static int stopping(void *ctx)
{
    (void)ctx;
    return 0;
}

/* A server whose figure changes between scrapes: each render says how many renders there were. */
typedef struct counting {
    unsigned renders;
    int stopping;
} counting;

static int counting_metrics(void *ctx, char **body, size_t *len)
{
    counting *c = ctx;
    char text[32];
    snprintf(text, sizeof text, "renders %u\n", ++c->renders);
    *body = strdup(text);
    *len = strlen(text);
    return *body ? 0 : PD_ENOMEM;
}

static int counting_stopping(void *ctx)
{
    return ((counting *)ctx)->stopping;
}

static int free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static int connect_to(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* Run the loop (its sweep runs every second) until fd reads EOF, at most ~10 s. */
static int wait_closed(uv_loop_t *loop, int fd)
{
    char buf[256];
    for (int i = 0; i < 10000; i++) {
        uv_run(loop, UV_RUN_NOWAIT);
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0)
            return 1;
        usleep(1000);
    }
    return 0;
}

static void test_expired_counted(void **state)
{
    (void)state;
    uv_loop_t loop;
    pd_http *h;
    char addr[32];
    int port = free_port();
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    assert_int_equal(uv_loop_init(&loop), 0);
    pd_http_routes routes = {.metrics = metrics, .stopping = stopping};
    pd_http_limits lim = {.max_conns = 8, .timeout_ms = 100, .max_head = 8192};
    assert_int_equal(pd_http_listen(&loop, addr, 0, &routes, &lim, &h), 0);

    /* Slowloris: half a request line, then nothing. */
    int slow = connect_to(port);
    assert_int_equal(send(slow, "GET /metr", 9, 0), 9);
    assert_true(wait_closed(&loop, slow));
    assert_int_equal(pd_http_expired(h), 1);
    close(slow);

    /* Answered, then lingering without closing: closed at the deadline too, but not a timeout. */
    int done = connect_to(port);
    const char *req = "GET /healthz HTTP/1.1\r\n\r\n";
    assert_int_equal(send(done, req, strlen(req), 0), (ssize_t)strlen(req));
    assert_true(wait_closed(&loop, done)); /* the response, then permd's FIN; it reads on until we close */
    int gone = 0;                          /* we do not: its sweep closes it (our bytes then get a reset) */
    for (int i = 0; i < 10000 && !gone; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        gone = send(done, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0;
        usleep(1000);
    }
    assert_true(gone);
    close(done);
    assert_int_equal(pd_http_expired(h), 1);
    assert_int_equal(pd_http_evicted(h), 0);

    pd_http_close(h);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* One whole exchange: send req, run the loop until the response is whole (permd closes after it);
 * the response in buf (a string). */
static void exchange(uv_loop_t *loop, int port, const char *req, char *buf, size_t cap)
{
    int fd = connect_to(port);
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    size_t got = 0;
    for (int i = 0; i < 10000; i++) {
        uv_run(loop, UV_RUN_NOWAIT);
        ssize_t n = recv(fd, buf + got, cap - 1 - got, MSG_DONTWAIT);
        if (n == 0)
            break;
        if (n > 0)
            got += (size_t)n;
        else
            usleep(1000);
    }
    buf[got] = '\0';
    close(fd);
}

/* The body of GET path (after the blank line). */
static const char *get(uv_loop_t *loop, int port, const char *path, char *buf, size_t cap)
{
    char req[128];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\n\r\n", path);
    exchange(loop, port, req, buf, cap);
    const char *body = strstr(buf, "\r\n\r\n");
    assert_non_null(body);
    return body + 4;
}

/* An endpoint on a free loopback port of loop, serving c's counting routes with this cache window. */
static pd_http *counting_listen_head(uv_loop_t *loop, counting *c, uint64_t cache_ms, size_t max_head, int *port)
{
    pd_http *h;
    char addr[32];
    *port = free_port();
    snprintf(addr, sizeof addr, "127.0.0.1:%d", *port);
    assert_int_equal(uv_loop_init(loop), 0);
    pd_http_routes routes = {.metrics = counting_metrics, .stopping = counting_stopping, .ctx = c};
    pd_http_limits lim = {.max_conns = 8, .timeout_ms = 5000, .cache_ms = cache_ms, .max_head = max_head};
    assert_int_equal(pd_http_listen(loop, addr, 0, &routes, &lim, &h), 0);
    return h;
}

static pd_http *counting_listen(uv_loop_t *loop, counting *c, uint64_t cache_ms, int *port)
{
    return counting_listen_head(loop, c, cache_ms, 8192, port);
}

/* A scraper asking again within metrics_cache_ms gets the body already rendered (no render on the
 * loop), counted in pd_http_cache_hits; with 0 every scrape renders (the control). The window here
 * is an hour, so the second scrape falls in it however slow the machine; /healthz stays live. */
static void test_metrics_cached(void **state)
{
    (void)state;
    for (int cached = 1; cached >= 0; cached--) {
        uv_loop_t loop;
        char buf[1024];
        int port;
        counting c = {0};
        pd_http *h = counting_listen(&loop, &c, cached ? 3600000 : 0, &port);

        assert_string_equal(get(&loop, port, "/metrics", buf, sizeof buf), "renders 1\n");
        assert_string_equal(get(&loop, port, "/healthz", buf, sizeof buf), "ok\n");
        c.stopping = 1; /* liveness changed since the first scrape: /healthz says so at once */
        assert_string_equal(get(&loop, port, "/healthz", buf, sizeof buf), "stopping\n");
        exchange(&loop, port, "HEAD /metrics HTTP/1.1\r\n\r\n", buf, sizeof buf);
        assert_non_null(strstr(buf, "Content-Length: 10\r\n"));
        if (cached) {
            assert_string_equal(get(&loop, port, "/metrics", buf, sizeof buf), "renders 1\n");
            assert_int_equal(c.renders, 1);
            assert_int_equal(pd_http_cache_hits(h), 2); /* the HEAD and the second GET */
        } else {
            assert_string_equal(get(&loop, port, "/metrics", buf, sizeof buf), "renders 3\n");
            assert_int_equal(c.renders, 3);
            assert_int_equal(pd_http_cache_hits(h), 0);
        }
        pd_http_close(h);
        uv_run(&loop, UV_RUN_DEFAULT);
        assert_int_equal(uv_loop_close(&loop), 0);
    }
}

/* Past the window the body is rendered again: a short window, and a sleep well past it (the
 * monotonic clock only moves forward, so this holds on any machine). */
static void test_metrics_cache_expires(void **state)
{
    (void)state;
    uv_loop_t loop;
    char buf[1024];
    int port;
    counting c = {0};
    pd_http *h = counting_listen(&loop, &c, 50, &port);
    assert_string_equal(get(&loop, port, "/metrics", buf, sizeof buf), "renders 1\n");
    usleep(200000);
    assert_string_equal(get(&loop, port, "/metrics", buf, sizeof buf), "renders 2\n");
    pd_http_close(h);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* A request whose head (line and headers) is longer than metrics_max_head is answered 431; one within
 * it is served, on the same endpoint; a limit too small for any request is refused at listen. */
static void test_head_limit(void **state)
{
    (void)state;
    uv_loop_t loop;
    char buf[1024], req[512];
    int port;
    counting c = {0};
    pd_http *h = counting_listen_head(&loop, &c, 0, 256, &port);
    char pad[300];
    for (size_t n = 150; n <= 250; n += 100) { /* heads of 185 and 285 bytes */
        memset(pad, 'x', n);
        pad[n] = '\0';
        snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nX-Pad: %s\r\n\r\n", pad);
        exchange(&loop, port, req, buf, sizeof buf);
        if (strlen(req) <= 256)
            assert_non_null(strstr(buf, "HTTP/1.1 200 OK"));
        else
            assert_non_null(strstr(buf, "HTTP/1.1 431 "));
    }
    assert_int_equal(c.renders, 1);
    pd_http_close(h);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);

    pd_http_routes routes = {.metrics = metrics, .stopping = stopping};
    pd_http_limits lim = {.max_conns = 8, .timeout_ms = 100, .max_head = 0};
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(pd_http_listen(&loop, "127.0.0.1:0", 0, &routes, &lim, &h), PD_EINVAL);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expired_counted),
        cmocka_unit_test(test_metrics_cached),
        cmocka_unit_test(test_metrics_cache_expires),
        cmocka_unit_test(test_head_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
