/* Tests for daemon/config.c: defaults, typed setters, YAML files, flags over files, validation, the template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/config.h"
#include "daemon/log.h"

/* Write text to a fresh temporary file; the caller unlinks path. */
static void write_tmp(char *path, const char *text)
{
    strcpy(path, "/tmp/permd-test-config-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
}

static void test_defaults(void **state)
{
    (void)state;
    pd_config c;
    assert_int_equal(pd_config_init(&c), 0);
    assert_string_equal(c.socket, "");
    assert_string_equal(c.tcp, "");
    assert_int_equal(c.socket_mode, 0660);
    assert_int_equal(c.log_level, PD_LOG_INFO);
    assert_int_equal(c.max_frame, 1048576);
    assert_int_equal(c.max_connections, 1024);
    assert_int_equal(c.output_cap, 4194304);
    assert_int_equal(c.ndatasets, 0);
    assert_int_equal(pd_config_validate(&c, NULL, 0), 0);
    pd_config_free(&c);
}

static void test_set_values_and_errors(void **state)
{
    (void)state;
    pd_config c;
    char err[256];
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_set(&c, "max_frame", "65536", err, sizeof err), 0);
    assert_int_equal(c.max_frame, 65536);
    assert_int_equal(pd_config_set(&c, "socket_mode", "0600", err, sizeof err), 0);
    assert_int_equal(c.socket_mode, 0600);
    assert_int_equal(pd_config_set(&c, "log_level", "debug", err, sizeof err), 0);
    assert_int_equal(c.log_level, PD_LOG_DEBUG);
    assert_int_equal(pd_config_set(&c, "socket", "/run/x.sock", err, sizeof err), 0);
    assert_string_equal(c.socket, "/run/x.sock");

    assert_int_equal(pd_config_set(&c, "max_frame", "12", err, sizeof err), PD_ERANGE);
    assert_non_null(strstr(err, "max_frame"));
    assert_int_equal(c.max_frame, 65536); /* unchanged after a rejected value */
    assert_int_equal(pd_config_set(&c, "max_count", "-1", err, sizeof err), PD_EINVAL);
    assert_non_null(strstr(err, "max_count"));
    assert_int_equal(pd_config_set(&c, "loops", "257", err, sizeof err), PD_ERANGE);
    assert_non_null(strstr(err, "loops"));
    assert_int_equal(c.loops, 0); /* the default: min(CPUs, 4) */
    assert_int_equal(pd_config_set(&c, "max_digest", "0", err, sizeof err), PD_ERANGE);
    assert_non_null(strstr(err, "max_digest"));
    assert_int_equal(c.max_digest, UINT64_C(1) << 30);
    assert_int_equal(pd_config_set(&c, "socket_mode", "0999", err, sizeof err), PD_EINVAL);
    assert_int_equal(pd_config_set(&c, "socket_mode", "1777", err, sizeof err), PD_ERANGE);
    assert_int_equal(pd_config_set(&c, "log_level", "loud", err, sizeof err), PD_EINVAL);
    assert_int_equal(pd_config_set(&c, "no_such_key", "1", err, sizeof err), PD_ENOTFOUND);
    assert_non_null(strstr(err, "no_such_key"));

    assert_int_equal(pd_config_add_dataset(&c, "imagenet", "1281167", err, sizeof err), 0);
    assert_int_equal(pd_config_add_dataset(&c, "bad/name", "5", err, sizeof err), PD_EINVAL);
    assert_int_equal(pd_config_add_dataset(&c, "zero", "0", err, sizeof err), PD_ERANGE);
    assert_int_equal(pd_config_add_dataset(&c, "huge", "9223372036854775809", err, sizeof err), PD_ERANGE);
    assert_int_equal(c.ndatasets, 1);
    pd_config_free(&c);
}

static void test_load_file(void **state)
{
    (void)state;
    pd_config c;
    char path[64], err[512];
    write_tmp(path, "# a comment\n"
                    "socket: /tmp/p.sock\n"
                    "max_connections: 7\n"
                    "socket_mode: 0640\n"
                    "datasets:\n"
                    "  - name: a\n"
                    "    size: 10\n"
                    "  - name: b.c-d_e\n"
                    "    size: 9223372036854775808\n");
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_load_file(&c, path, err, sizeof err), 0);
    assert_string_equal(c.socket, "/tmp/p.sock");
    assert_int_equal(c.max_connections, 7);
    assert_int_equal(c.socket_mode, 0640);
    assert_int_equal(c.ndatasets, 2);
    assert_string_equal(c.datasets[1].name, "b.c-d_e");
    assert_int_equal(c.datasets[1].size, UINT64_C(1) << 63);
    assert_int_equal(c.max_frame, 1048576); /* untouched keys keep their defaults */
    pd_config_free(&c);
    unlink(path);
}

static void test_load_file_errors(void **state)
{
    (void)state;
    struct {
        const char *text, *needle;
    } cases[] = {
        {"max_frame: 1\n", "max_frame"},
        {"maxframe: 65536\n", "maxframe"},         /* a typo is an error, not silently ignored */
        {"max_count: [1, 2]\n", "max_count"},
        {"datasets:\n  - name: x\n", "size"},       /* a dataset needs both fields */
        {"datasets:\n  - name: x\n    size: no\n", "size"},
        {"log_level: chatty\n", "log_level"},
        {"socket: a\nsocket: b\n", "socket"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pd_config c;
        char path[64], err[512] = "";
        write_tmp(path, cases[i].text);
        assert_int_equal(pd_config_init(&c), 0);
        int rc = pd_config_load_file(&c, path, err, sizeof err);
        if (rc == 0 || !strstr(err, cases[i].needle))
            fail_msg("case %zu: rc=%d err='%s'", i, rc, err);
        pd_config_free(&c);
        unlink(path);
    }
    pd_config c;
    char err[256];
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_load_file(&c, "/nonexistent/permd.yaml", err, sizeof err), PD_EIO);
    assert_non_null(strstr(err, "/nonexistent/permd.yaml"));
    /* A FIFO is refused at once: reading it waited for a writer (at a SIGHUP reload, on the loop that accepts). */
    char fifo[64];
    snprintf(fifo, sizeof fifo, "/tmp/permd-test-fifo-%d", (int)getpid());
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(pd_config_load_file(&c, fifo, err, sizeof err), PD_EINVAL);
    assert_non_null(strstr(err, "not a regular file"));
    unlink(fifo);
    char path[64];
    write_tmp(path, "");
    assert_int_equal(pd_config_load_file(&c, path, err, sizeof err), 0); /* empty: nothing overridden */
    unlink(path);
    pd_config_free(&c);
}

/* The template documents every key with its default: loading it changes nothing. */
static void test_template_is_defaults(void **state)
{
    (void)state;
    char path[64], err[512] = "", *a = NULL, *b = NULL;
    size_t alen, blen;
    strcpy(path, "/tmp/permd-test-template-XXXXXX");
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    pd_config_write_template(f);
    fclose(f);

    pd_config dflt, loaded;
    assert_int_equal(pd_config_init(&dflt), 0);
    assert_int_equal(pd_config_init(&loaded), 0);
    assert_int_equal(pd_config_set(&loaded, "max_frame", "4096", NULL, 0), 0); /* the file must reset it */
    if (pd_config_load_file(&loaded, path, err, sizeof err))
        fail_msg("template does not load: %s", err);
    FILE *fa = open_memstream(&a, &alen), *fb = open_memstream(&b, &blen);
    pd_config_write_effective(&dflt, fa);
    pd_config_write_effective(&loaded, fb);
    fclose(fa);
    fclose(fb);
    assert_string_equal(a, b);
    free(a);
    free(b);
    pd_config_free(&dflt);
    pd_config_free(&loaded);
    unlink(path);
}

static void test_flags_override_file(void **state)
{
    (void)state;
    char path[64], err[512] = "", cfgarg[80];
    write_tmp(path, "max_streams: 3\nmax_credits: 5\n");
    snprintf(cfgarg, sizeof cfgarg, "--config=%s", path);
    char *argv[] = {"permd", "--max-streams", "9", cfgarg, "--dataset", "x:100", "--check-config",
                    "--log-level=warn", NULL};
    pd_config c;
    int check = 0;
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_from_args(&c, 8, argv, &check, err, sizeof err), 0);
    assert_int_equal(c.max_streams, 9); /* the flag wins although it comes first */
    assert_int_equal(c.max_credits, 5); /* the file still applies */
    assert_int_equal(c.log_level, PD_LOG_WARN);
    assert_int_equal(c.ndatasets, 1);
    assert_int_equal(c.datasets[0].size, 100);
    assert_int_equal(check, 1);
    pd_config_free(&c);
    unlink(path);

    struct {
        int argc;
        char *argv[4];
        const char *needle;
    } bad[] = {
        {2, {"permd", "--bogus", NULL}, "bogus"},
        {2, {"permd", "--max-frame", NULL}, "needs a value"},
        {2, {"permd", "stray", NULL}, "stray"},
        {3, {"permd", "--dataset", "nosize", NULL}, "NAME:SIZE"},
        {3, {"permd", "--tcp", "0.0.0.0:7470", NULL}, "token_file"},
        {3, {"permd", "--tcp", "example.com:80", NULL}, "numeric"},
        {3, {"permd", "--tcp", "127.0.0.1:0", NULL}, "HOST:PORT"},
        {3, {"permd", "--config", "/nonexistent.yaml", NULL}, "nonexistent"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(pd_config_init(&c), 0);
        err[0] = '\0';
        int rc = pd_config_from_args(&c, bad[i].argc, bad[i].argv, &check, err, sizeof err);
        if (rc >= 0 || !strstr(err, bad[i].needle))
            fail_msg("case %zu: rc=%d err='%s'", i, rc, err);
        pd_config_free(&c);
    }
}

static void test_validate(void **state)
{
    (void)state;
    pd_config c;
    char err[256];
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_set(&c, "tcp", "[::1]:7470", NULL, 0), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), 0);
    assert_int_equal(pd_config_set(&c, "tcp", "10.1.2.3:7470", NULL, 0), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), PD_EAUTH);
    assert_int_equal(pd_config_set(&c, "token_file", "/etc/permd/token", NULL, 0), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), 0);
    assert_int_equal(pd_config_add_dataset(&c, "d", "5", NULL, 0), 0);
    assert_int_equal(pd_config_add_dataset(&c, "d", "5", NULL, 0), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), PD_ECONFLICT);
    pd_config_free(&c);

    /* Limits in range alone that contradict each other. */
    static const char *const contradictions[][4] = {
        {"max_frame", "65536", "max_preauth_frame", "65537"},   /* more before a Hello than after */
        {"max_frame", "1048576", "max_request_memory", "1048575"}, /* a full frame could never be decoded */
    };
    for (size_t i = 0; i < sizeof contradictions / sizeof contradictions[0]; i++) {
        assert_int_equal(pd_config_init(&c), 0);
        assert_int_equal(pd_config_set(&c, contradictions[i][0], contradictions[i][1], NULL, 0), 0);
        assert_int_equal(pd_config_set(&c, contradictions[i][2], contradictions[i][3], NULL, 0), 0);
        assert_int_equal(pd_config_validate(&c, err, sizeof err), PD_EINVAL);
        if (!strstr(err, contradictions[i][2]) || !strstr(err, "max_frame"))
            fail_msg("case %zu: '%s'", i, err);
        char ok[32];
        snprintf(ok, sizeof ok, "%llu", strtoull(contradictions[i][3], NULL, 10) + (i == 0 ? -1 : 1));
        assert_int_equal(pd_config_set(&c, contradictions[i][2], ok, NULL, 0), 0); /* the boundary itself is fine */
        assert_int_equal(pd_config_validate(&c, err, sizeof err), 0);
        pd_config_free(&c);
    }

    /* A socket path beyond sun_path (107 bytes and its NUL) could only be bound cut short. */
    char sock[160];
    assert_int_equal(pd_config_init(&c), 0);
    snprintf(sock, sizeof sock, "/%0106d", 0); /* 107 bytes: the longest that fits */
    assert_int_equal(pd_config_set(&c, "socket", sock, NULL, 0), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), 0);
    snprintf(sock, sizeof sock, "/%0107d", 0);
    assert_int_equal(pd_config_set(&c, "socket", sock, NULL, 0), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), PD_ETOOBIG);
    assert_non_null(strstr(err, "socket: '/000"));
    assert_non_null(strstr(err, "is 108 bytes; a Unix socket path holds at most 107"));
    pd_config_free(&c);

    assert_true(pd_config_host_is_loopback("127.0.0.1"));
    assert_true(pd_config_host_is_loopback("127.200.0.9"));
    assert_true(pd_config_host_is_loopback("::1"));
    assert_true(pd_config_host_is_loopback("localhost"));
    assert_false(pd_config_host_is_loopback("0.0.0.0"));
    assert_false(pd_config_host_is_loopback("::"));
    assert_false(pd_config_host_is_loopback("128.0.0.1"));
}

static void test_state_dir(void **state)
{
    (void)state;
    pd_config c;
    char buf[256];
    assert_int_equal(pd_config_init(&c), 0);
    setenv("STATE_DIRECTORY", "/var/lib/permd:/other", 1);
    assert_int_equal(pd_config_state_dir(&c, buf, sizeof buf), 0);
    assert_string_equal(buf, "/var/lib/permd");
    unsetenv("STATE_DIRECTORY");
    setenv("XDG_STATE_HOME", "/home/u/.state", 1);
    assert_int_equal(pd_config_state_dir(&c, buf, sizeof buf), 0);
    assert_string_equal(buf, "/home/u/.state/permd");
    unsetenv("XDG_STATE_HOME");
    setenv("HOME", "/home/u", 1);
    assert_int_equal(pd_config_state_dir(&c, buf, sizeof buf), 0);
    assert_string_equal(buf, "/home/u/.local/state/permd");
    assert_int_equal(pd_config_set(&c, "state_dir", "/srv/permd", NULL, 0), 0);
    assert_int_equal(pd_config_state_dir(&c, buf, sizeof buf), 0);
    assert_string_equal(buf, "/srv/permd");
    pd_config_free(&c);
}

/* allow_uids: a list as a flag and as a YAML sequence; metrics: HOST:PORT or empty. */
static void test_allow_uids_and_metrics(void **state)
{
    (void)state;
    pd_config c;
    char err[256], path[64];
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(c.allow_uids.n, 0);
    assert_string_equal(c.metrics, "127.0.0.1:9464");
    assert_true(pd_config_metrics_is_default(&c));
    assert_int_equal(pd_config_set(&c, "allow_uids", "1000,1001 0", err, sizeof err), 0);
    assert_int_equal(c.allow_uids.n, 3);
    assert_int_equal(c.allow_uids.uids[0], 1000);
    assert_int_equal(c.allow_uids.uids[2], 0);
    assert_int_equal(pd_config_set(&c, "allow_uids", "[7, 8]", err, sizeof err), 0);
    assert_int_equal(c.allow_uids.n, 2);
    assert_int_equal(c.allow_uids.uids[1], 8);
    assert_int_equal(pd_config_set(&c, "allow_uids", "7,alice", err, sizeof err), PD_EINVAL);
    assert_non_null(strstr(err, "allow_uids: 'alice' is not a uid"));
    assert_int_equal(pd_config_set(&c, "allow_uids", "4294967295", err, sizeof err), PD_EINVAL); /* (uid_t)-1 */
    assert_int_equal(pd_config_set(&c, "allow_uids", "1,,2", err, sizeof err), 0); /* empty items are skipped */
    assert_int_equal(c.allow_uids.n, 2);
    assert_int_equal(pd_config_set(&c, "allow_uids", "", err, sizeof err), 0);
    assert_int_equal(c.allow_uids.n, 0);

    assert_int_equal(pd_config_set(&c, "metrics", "127.0.0.1:9464", err, sizeof err), 0);
    assert_false(pd_config_metrics_is_default(&c)); /* asked for: it must bind, even at the default address */
    assert_int_equal(pd_config_set(&c, "metrics", "", err, sizeof err), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), 0);
    assert_int_equal(pd_config_set(&c, "metrics", "0.0.0.0:9464", err, sizeof err), 0);
    assert_false(pd_config_metrics_is_default(&c));
    assert_int_equal(pd_config_validate(&c, err, sizeof err), 0);
    assert_int_equal(pd_config_set(&c, "metrics", "prometheus:9464", err, sizeof err), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), PD_EINVAL);
    assert_non_null(strstr(err, "metrics:"));
    assert_int_equal(pd_config_set(&c, "metrics", "127.0.0.1", err, sizeof err), 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), PD_EINVAL);
    pd_config_free(&c);

    write_tmp(path, "allow_uids: [1000, 2000]\nmetrics: \"[::1]:9464\"\n");
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_load_file(&c, path, err, sizeof err), 0);
    assert_int_equal(c.allow_uids.n, 2);
    assert_int_equal(c.allow_uids.uids[1], 2000);
    assert_string_equal(c.metrics, "[::1]:9464");
    assert_int_equal(pd_config_validate(&c, err, sizeof err), 0);
    pd_config_free(&c);
    unlink(path);
    write_tmp(path, "allow_uids: 1000\n"); /* a scalar, not a list */
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_load_file(&c, path, err, sizeof err), PD_EINVAL);
    assert_non_null(strstr(err, path));
    pd_config_free(&c);
    unlink(path);
    write_tmp(path, "allow_uids: [1000, x]\n");
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_load_file(&c, path, err, sizeof err), PD_EINVAL);
    assert_non_null(strstr(err, "'x' is not a uid"));
    pd_config_free(&c);
    unlink(path);
}

/* YAML's null (~, null) leaves a key unset, as if absent: state_dir: ~ had put the registry in ./~.
 * A quoted "" stays the empty string (metrics: "" is off). */
static void test_yaml_null_is_unset(void **state)
{
    (void)state;
    pd_config c;
    char err[256], path[64];
    write_tmp(path, "state_dir: ~\n"
                    "token_file: null\n"
                    "cpu_isa: NULL\n"
                    "gpu: Null\n"
                    "max_count: ~\n"
                    "allow_uids: ~\n"
                    "tcp: \"\"\n"
                    "metrics: \"\"\n"
                    "datasets: ~\n");
    assert_int_equal(pd_config_init(&c), 0);
    assert_int_equal(pd_config_set(&c, "max_count", "77", err, sizeof err), 0); /* unset keeps what was there */
    assert_int_equal(pd_config_load_file(&c, path, err, sizeof err), 0);
    assert_string_equal(c.state_dir, "");
    assert_string_equal(c.token_file, "");
    assert_string_equal(c.cpu_isa, "auto");
    assert_string_equal(c.gpu, "auto");
    assert_int_equal(c.max_count, 77);
    assert_int_equal(c.allow_uids.n, 0);
    assert_string_equal(c.metrics, ""); /* "" is not null: off */
    assert_int_equal(c.ndatasets, 0);
    assert_int_equal(pd_config_validate(&c, err, sizeof err), 0);
    pd_config_free(&c);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_set_values_and_errors),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_load_file_errors),
        cmocka_unit_test(test_template_is_defaults),
        cmocka_unit_test(test_flags_override_file),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_state_dir),
        cmocka_unit_test(test_allow_uids_and_metrics),
        cmocka_unit_test(test_yaml_null_is_unset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
