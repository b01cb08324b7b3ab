/* Tests for daemon/listen.c alone: a connection its callback cannot take (out of memory) does not stop the socket. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/listen.h"

typedef struct fixture {
    int calls;    /* callbacks with a connection waiting */
    int accepted; /* of those, taken */
    int refuse;   /* callbacks to return without accepting, as an allocation failure does */
} fixture;

static void on_closed(uv_handle_t *h)
{
    free(h);
}

static void on_accept(void *ctx, uv_stream_t *listener, int is_tcp, int status)
{
    fixture *f = ctx;
    (void)is_tcp;
    if (status < 0)
        return;
    f->calls++;
    if (f->refuse > 0) {
        f->refuse--;
        return;
    }
    uv_pipe_t *c = malloc(sizeof *c);
    assert_non_null(c);
    uv_pipe_init(listener->loop, c, 0);
    assert_int_equal(uv_accept(listener, (uv_stream_t *)c), 0);
    f->accepted++;
    uv_close((uv_handle_t *)c, on_closed);
}

static int connect_to(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(path) < sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0); /* the backlog takes it */
    return fd;
}

/* Run the loop until *value reaches want, for at most 5 s. */
static void run_until(uv_loop_t *loop, const int *value, int want)
{
    for (int i = 0; i < 5000 && *value < want; i++) {
        uv_run(loop, UV_RUN_NOWAIT);
        if (*value < want)
            usleep(1000);
    }
}

/* libuv reads a listener no more while a connection it accepted waits for uv_accept: a callback that could not
 * take one (its allocation failed) stopped the socket for good. The listener now closes such a connection and
 * goes on; a later one is served. */
static void test_connection_left_by_its_callback(void **state)
{
    (void)state;
    char dir[] = "/tmp/permd-test-listen-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/s.sock", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    fixture f = {.refuse = 2};
    pd_listener *l;
    assert_int_equal(pd_listen_unix(&loop, path, 0600, 0, on_accept, &f, &l), 0);
    int left[2] = {connect_to(path), connect_to(path)};
    run_until(&loop, &f.calls, 2);
    assert_int_equal(f.calls, 2);
    for (int i = 0; i < 2; i++) { /* each closed by the listener: its peer reads the end */
        char b;
        struct timeval tv = {.tv_sec = 5};
        setsockopt(left[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        for (int k = 0; k < 50; k++) /* the close completes on a later turn of the loop */
            uv_run(&loop, UV_RUN_NOWAIT);
        assert_int_equal(read(left[i], &b, 1), 0);
        close(left[i]);
    }
    int served = connect_to(path);
    run_until(&loop, &f.accepted, 1);
    assert_int_equal(f.accepted, 1);
    assert_int_equal(f.calls, 3);
    close(served);
    pd_listener_close(l);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0); /* every handle closed: the listener freed itself */
    assert_int_equal(uv_loop_close(&loop), 0);
    assert_int_equal(access(path, F_OK), -1); /* the socket file went with it */
    assert_int_equal(rmdir(dir), 0);
}

/* A server at the path that accepts nothing (stopped, SIGSTOP) with its backlog full: listening there is refused
 * at once, as for a live one. The check's blocking connect waited for room in that backlog for ever. */
static void test_path_held_by_a_stopped_server(void **state)
{
    (void)state;
    char dir[] = "/tmp/permd-test-listen-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/s.sock", dir);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int stopped = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(bind(stopped, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(stopped, 0), 0);
    int fillers[8], n = 0; /* connections nobody accepts, until the backlog is full */
    for (; n < 8; n++) {
        fillers[n] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (connect(fillers[n], (struct sockaddr *)&sa, sizeof sa)) {
            assert_int_equal(errno, EAGAIN);
            break;
        }
    }
    assert_true(n < 8); /* full */
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    fixture f = {0};
    pd_listener *l = NULL;
    assert_int_equal(pd_listen_unix(&loop, path, 0600, 0, on_accept, &f, &l), PD_ECONFLICT);
    assert_null(l);
    assert_int_equal(uv_loop_close(&loop), 0);
    for (int i = 0; i <= n && i < 8; i++)
        close(fillers[i]);
    close(stopped);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_connection_left_by_its_callback),
        cmocka_unit_test(test_path_held_by_a_stopped_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
