/* Tests for proto/endpoint.c: HOST:PORT parsing and where the default socket lives. */
#define _GNU_SOURCE /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_default_socket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
