/* Tests for proto/endpoint.c: HOST:PORT parsing, where the default socket lives, when its directory is trusted, and connecting by a deadline. */
#define _GNU_SOURCE /* setenv */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "test_util.h"

#include "core/error.h"
#include "proto/endpoint.h"

static void test_hostport(void **state)
{
    (void)state;
    char host[64];
    uint16_t port;
    assert_int_equal(pd_endpoint_parse_hostport("127.0.0.1:7470", host, sizeof host, &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 7470);
    assert_int_equal(pd_endpoint_parse_hostport("[::1]:9", host, sizeof host, &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 9);
    assert_int_equal(pd_endpoint_parse_hostport("localhost", host, sizeof host, &port), 0);
    assert_int_equal(port, PD_DEFAULT_TCP_PORT);

    const char *bad[] = {"", ":80", "host:", "host:0", "host:65536", "host:12x", "::1:80", "[::1", "[::1]x", "h:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(pd_endpoint_parse_hostport(bad[i], host, sizeof host, &port), PD_EINVAL);
    assert_int_equal(pd_endpoint_parse_hostport("averyveryverylonghostname:1", host, 8, &port), PD_EINVAL);
}

static void test_default_socket(void **state)
{
    (void)state;
    char buf[256], want[256];
    setenv("PERMD_SOCKET", "/x/y.sock", 1);
    assert_int_equal(pd_endpoint_default_socket(buf, sizeof buf), 0);
    assert_string_equal(buf, "/x/y.sock");
    unsetenv("PERMD_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/run/user/5", 1);
    assert_int_equal(pd_endpoint_default_socket(buf, sizeof buf), 0);
    assert_string_equal(buf, "/run/user/5/permd.sock");
    unsetenv("XDG_RUNTIME_DIR");
    assert_int_equal(pd_endpoint_default_socket(buf, sizeof buf), 0);
    snprintf(want, sizeof want, "/tmp/permd-%u/permd.sock", (unsigned)getuid());
    assert_string_equal(buf, want);
    assert_int_equal(pd_endpoint_default_socket(buf, 5), PD_ETOOBIG);
}

/* /tmp/permd-<uid>, the fallback's directory, is trusted only when it is this user's alone. */
static void test_private_dir(void **state)
{
    (void)state;
    char path[128], dir[64], link[80], why[160];
    snprintf(path, sizeof path, "/tmp/permd-%u/permd.sock", (unsigned)getuid());
    assert_true(pd_endpoint_in_private_dir(path));
    snprintf(path, sizeof path, "/tmp/permd-%u/sub/permd.sock", (unsigned)getuid());
    assert_false(pd_endpoint_in_private_dir(path));
    snprintf(path, sizeof path, "/tmp/permd-%u0/permd.sock", (unsigned)getuid());
    assert_false(pd_endpoint_in_private_dir(path));
    assert_false(pd_endpoint_in_private_dir("/run/user/5/permd.sock"));
    assert_false(pd_endpoint_in_private_dir("permd.sock"));

    strcpy(dir, "/tmp/permd-test-endpoint-XXXXXX");
    assert_non_null(mkdtemp(dir)); /* mode 0700, ours */
    assert_int_equal(pd_endpoint_check_dir(dir, why, sizeof why), 0);
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(pd_endpoint_check_dir(dir, why, sizeof why), 0); /* others may read, not write */
    assert_int_equal(chmod(dir, 0770), 0);
    assert_int_equal(pd_endpoint_check_dir(dir, why, sizeof why), PD_EAUTH);
    assert_non_null(strstr(why, "mode 0770 lets group or others write"));
    assert_int_equal(chmod(dir, 01777), 0); /* sticky, like /tmp: still others may write */
    assert_int_equal(pd_endpoint_check_dir(dir, why, sizeof why), PD_EAUTH);
    assert_int_equal(chmod(dir, 0700), 0);
    snprintf(link, sizeof link, "%s.link", dir);
    assert_int_equal(symlink(dir, link), 0); /* a link to a good directory is not one */
    assert_int_equal(pd_endpoint_check_dir(link, why, sizeof why), PD_EAUTH);
    assert_non_null(strstr(why, "not a directory"));
    assert_int_equal(unlink(link), 0);
    if (geteuid() == 0) { /* another owner */
        assert_int_equal(chown(dir, 65534, 65534), 0);
        assert_int_equal(pd_endpoint_check_dir(dir, why, sizeof why), PD_EAUTH);
        assert_non_null(strstr(why, "owned by uid 65534"));
    }
    assert_int_equal(rmdir(dir), 0);
    assert_int_equal(pd_endpoint_check_dir(dir, why, sizeof why), PD_EIO);
    assert_int_equal(pd_endpoint_unix_path_max(), 107);
}

/* A TCP connect ends by its deadline with PD_ETIMEDOUT where the peer drops SYNs; one that a listener
 * takes returns a blocking socket, or a non-blocking one when asked; a closed port is PD_EIO with
 * ECONNREFUSED, at once. */
static void test_connect_tcp(void **state)
{
    (void)state;
    char why[256];
    int fd, fillers[HARNESS_FILLERS];
    uint16_t port;
    int l = harness_full_tcp_listener(&port, fillers);
    assert_true(l >= 0);
    const double t0 = test_now_s();
    assert_int_equal(pd_endpoint_connect_tcp("127.0.0.1", port, 300, 0, &fd, why, sizeof why), PD_ETIMEDOUT);
    const int err = errno;
    const double s = test_now_s() - t0;
    assert_true(s >= 0.25 && s < 5);
    assert_int_equal(err, ETIMEDOUT);
    assert_non_null(strstr(why, "within 300 ms"));
    harness_full_close(l, fillers);

    /* the control: a listener with room */
    l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l, 8), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
    port = ntohs(a.sin_port);
    for (int nonblock = 0; nonblock < 2; nonblock++) {
        fd = -1;
        assert_int_equal(pd_endpoint_connect_tcp("127.0.0.1", port, 300, nonblock, &fd, why, sizeof why), 0);
        assert_true(fd >= 0);
        assert_int_equal(!!(fcntl(fd, F_GETFL) & O_NONBLOCK), nonblock);
        assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
        close(fd);
    }
    close(l); /* now nothing listens there */
    assert_int_equal(pd_endpoint_connect_tcp("127.0.0.1", port, 300, 0, &fd, why, sizeof why), PD_EIO);
    assert_int_equal(errno, ECONNREFUSED);
}

/* A Unix connect waits while the listener's backlog is full, up to its deadline; it connects as soon as
 * there is room; a missing socket is PD_EIO with ENOENT, a path too long PD_EINVAL. */
static void test_connect_unix(void **state)
{
    (void)state;
    char path[96], why[256];
    snprintf(path, sizeof path, "/tmp/permd-test-endpoint-%d.sock", (int)getpid());
    unlink(path);
    int l = socket(AF_UNIX, SOCK_STREAM, 0), filler = socket(AF_UNIX, SOCK_STREAM, 0), fd;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(l, 0), 0);
    assert_int_equal(connect(filler, (struct sockaddr *)&sa, sizeof sa), 0); /* the backlog is now full */
    const double t0 = test_now_s();
    assert_int_equal(pd_endpoint_connect_unix(path, 200, 0, &fd, why, sizeof why), PD_ETIMEDOUT);
    assert_int_equal(errno, ETIMEDOUT);
    const double s = test_now_s() - t0;
    assert_true(s >= 0.15 && s < 5);
    /* the control: once the pending connection is accepted there is room */
    int taken = accept(l, NULL, NULL);
    assert_true(taken >= 0);
    fd = -1;
    assert_int_equal(pd_endpoint_connect_unix(path, 200, 0, &fd, why, sizeof why), 0);
    assert_false(fcntl(fd, F_GETFL) & O_NONBLOCK);
    close(fd);
    close(taken);
    close(filler);
    close(l);
    unlink(path);
    assert_int_equal(pd_endpoint_connect_unix(path, 200, 0, &fd, why, sizeof why), PD_EIO);
    assert_int_equal(errno, ENOENT);
    char longp[sizeof sa.sun_path + 8];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    assert_int_equal(pd_endpoint_connect_unix(longp, 200, 0, &fd, why, sizeof why), PD_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_default_socket),
        cmocka_unit_test(test_private_dir),
        cmocka_unit_test(test_connect_tcp),
        cmocka_unit_test(test_connect_unix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
