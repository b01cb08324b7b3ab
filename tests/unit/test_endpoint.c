/* Tests for proto/endpoint.c: HOST:PORT parsing, where the default socket lives, and when its directory is trusted. */
#define _GNU_SOURCE /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_default_socket),
        cmocka_unit_test(test_private_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
