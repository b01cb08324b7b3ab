/* Integration: the TCP token file as a careless operator writes it (binary, too long, a FIFO, short, CRLF), on
 * startup and on SIGHUP, and listen addresses in any case. Each is refused with a line naming token_file, or
 * works the same on both sides; none hangs permd. TCP connections have keepalive. Wrong tokens write a
 * bounded number of auth_fail lines. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

#define PD_TEST_TOKEN_MAX 1024 /* the longest token permd takes (daemon/auth.h's PD_AUTH_TOKEN_MAX) */

/* Write len bytes to h->dir/name (mode 0600); its path in path. */
static const char *write_file(harness *h, const char *name, const void *data, size_t len, char *path, size_t plen)
{
    snprintf(path, plen, "%s/%s", h->dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    chmod(path, 0600);
    return path;
}

/* permd started with --tcp, --token-file path and flag value (flag NULL: none) must exit 1 at startup, its log
 * holding msg. */
static void expect_refused_with(harness *h, const char *flag, const char *value, const char *path, const char *msg)
{
    int status;
    const char *extra[] = {"--token-file", path, flag, value, NULL};
    assert_int_equal(harness_start(h, 1, extra, &status), -1);
    assert_true(harness_exited_with(status, 1));
    if (!harness_log_contains(h, msg))
        fail_msg("permd's log lacks '%s'", msg);
}

static void expect_refused(harness *h, const char *path, const char *msg)
{
    expect_refused_with(h, NULL, NULL, path, msg);
}

/* permd started with --tcp, a token file holding the len bytes of tok as its line, and flag value (flag NULL:
 * none) lets in a client that sends that token. */
static void expect_token_works(const char *flag, const char *value, const char *tok, size_t len)
{
    harness h;
    char path[160], line[PD_TEST_TOKEN_MAX + 2];
    assert_true(len <= PD_TEST_TOKEN_MAX);
    memcpy(line, tok, len);
    line[len] = '\n';
    harness_init(&h);
    const char *extra[] = {"--token-file", write_file(&h, "token", line, len + 1, path, sizeof path), flag, value,
                           NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    line[len] = '\0';
    permd_client *c;
    assert_int_equal(permd_connect_tcp(h.tcp, line, &c), 0);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

/* A binary token (head -c 32 /dev/urandom) with a zero byte: permd checked only the bytes before it, so
 * "ab" alone authenticated. Refused now, naming the byte. */
static void test_token_with_nul(void **state)
{
    (void)state;
    harness h;
    char path[160];
    static const char tok[] = "ab\0cdefghijklmnopqrstuvwxyz0123\n";
    /* a binary token: random bytes that, without the rule, were taken up to their first \n (the rest unseen) */
    static const char bin[] = "\x9c\x01\xf3Zq\xe2\x7f\xb0\x11\xa4\x8e\x02\x99\xcd\x10\x83\n\x05\xfe";
    harness_init(&h);
    expect_refused(&h, write_file(&h, "token", tok, sizeof tok - 1, path, sizeof path),
                   "the first line holds the control byte 0x00 at byte 2");
    harness_cleanup(&h);
    harness_init(&h);
    expect_refused(&h, write_file(&h, "token", bin, sizeof bin - 1, path, sizeof path),
                   "the first line holds the control byte 0x01 at byte 1");
    harness_cleanup(&h);
}

/* A first line past 1024 bytes was cut at 4095 and permd started, but a client's Hello carrying it
 * whole is above max_preauth_frame: nobody could ever authenticate. Refused at startup now; the longest
 * token accepted authenticates. */
static void test_token_too_long(void **state)
{
    (void)state;
    harness h;
    char path[160], tok[5002];
    memset(tok, 'x', sizeof tok - 1);
    tok[sizeof tok - 1] = '\n';
    harness_init(&h);
    expect_refused(&h, write_file(&h, "token", tok, sizeof tok, path, sizeof path),
                   "the first line is longer than 1024 bytes");
    harness_cleanup(&h);
    expect_token_works(NULL, NULL, tok, 1024);
}

/* A token that fits PD_AUTH_TOKEN_MAX but not max_preauth_frame (its least, 256) with the rest of a Hello:
 * permd started and no client could authenticate. Refused at startup, naming both; a token with room works. */
static void test_token_past_preauth_frame(void **state)
{
    (void)state;
    harness h;
    char path[160], tok[202];
    memset(tok, 'y', sizeof tok - 1);
    tok[sizeof tok - 1] = '\n';
    harness_init(&h);
    expect_refused_with(&h, "--max-preauth-frame", "256", write_file(&h, "token", tok, sizeof tok, path, sizeof path),
                        "leaves a client's Hello no room under max_preauth_frame (256)");
    harness_cleanup(&h);
    expect_token_works("--max-preauth-frame", "256", tok, 100);
}

/* A FIFO (or a directory) as token_file: permd blocked in open() at startup, deaf to SIGTERM, and a
 * directory read as "the first line is empty". Both are refused as not regular files. */
static void test_token_not_a_file(void **state)
{
    (void)state;
    harness h;
    char path[160];
    harness_init(&h);
    snprintf(path, sizeof path, "%s/fifo", h.dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    expect_refused(&h, path, "token_file is not a regular file");
    harness_cleanup(&h);

    harness_init(&h);
    snprintf(path, sizeof path, "%s/tokdir", h.dir);
    assert_int_equal(mkdir(path, 0700), 0);
    expect_refused(&h, path, "token_file is not a regular file");
    harness_cleanup(&h);
}

/* --check-config loads the token file as startup does: it passed an empty first line (which startup then
 * refused) and blocked for ever in fopen() on a FIFO. Both are configuration errors (2) now; a good file is
 * OK (0). A token leaving a Hello no room under max_preauth_frame is an error (2) too, as startup refuses it. */
static void test_check_config_token(void **state)
{
    (void)state;
    harness h;
    char path[160], cmd[600];
    harness_init(&h);
    static const char *const files[][2] = {{"empty", ""}, {"good", "0123456789abcdef0123\n"}};
    for (int i = 0; i < 3; i++) {
        if (i < 2) {
            write_file(&h, files[i][0], files[i][1], strlen(files[i][1]), path, sizeof path);
        } else {
            snprintf(path, sizeof path, "%s/fifo", h.dir);
            assert_int_equal(mkfifo(path, 0600), 0);
        }
        snprintf(cmd, sizeof cmd, "timeout 20 '%s' --check-config --tcp 127.0.0.1:1 --token-file '%s' >/dev/null 2>&1",
                 PERMD_BIN, path);
        const int status = system(cmd);
        if (!harness_exited_with(status, i == 1 ? 0 : 2))
            fail_msg("--check-config with token file %s: status %d", path, status);
    }
    /* A good token with too little max_preauth_frame for its Hello, as startup refuses it. */
    char tok[201];
    memset(tok, 'z', sizeof tok - 1);
    tok[sizeof tok - 1] = '\n';
    write_file(&h, "long", tok, sizeof tok, path, sizeof path);
    snprintf(cmd, sizeof cmd, "timeout 20 '%s' --check-config --tcp 127.0.0.1:1 --max-preauth-frame 256 "
             "--token-file '%s' >/dev/null 2>&1", PERMD_BIN, path);
    assert_true(harness_exited_with(system(cmd), 2));
    harness_cleanup(&h);
}

#define FIRST_TOKEN "first-token-of-32-bytes-length!!"

/* Start permd (with --tcp) from a config file in h->dir holding first_yaml; its path in cfg. */
static void start_with_config(harness *h, const char *first_yaml, char *cfg, size_t len)
{
    snprintf(cfg, len, "%s/permd.yaml", h->dir);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs(first_yaml, f);
    fclose(f);
    const char *extra[] = {"--config", cfg, NULL};
    assert_int_equal(harness_start(h, 1, extra, NULL), 0);
}

/* Rewrite the config to next_yaml and SIGHUP: the reload must refuse the token (the log says why, and permd
 * serves on with FIRST_TOKEN). */
static void reload_refused(harness *h, const char *cfg, const char *next_yaml, const char *why)
{
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs(next_yaml, f);
    fclose(f);
    kill(h->pid, SIGHUP);
    for (int i = 0; i < 3000 && !harness_log_contains(h, "allow_uids and the token were not applied"); i++)
        usleep(10000);
    if (!harness_log_contains(h, why))
        fail_msg("permd's log lacks '%s'", why);
    permd_client *c;
    assert_int_equal(permd_connect_timeout(h->sock, NULL, 10000, &c), 0); /* the loop still answers */
    permd_close(c);
    assert_int_equal(permd_connect_tcp(h->tcp, FIRST_TOKEN, &c), 0);
    permd_close(c);
}

/* SIGHUP reads the token file again on the event loop: rotated to a FIFO, the reload is refused and permd
 * serves on with the last token, instead of its primary loop blocking for ever. */
static void test_reload_to_fifo(void **state)
{
    (void)state;
    harness h;
    char cfg[160], tok[160], fifo[160], yaml[400];
    harness_init(&h);
    write_file(&h, "token", FIRST_TOKEN "\n", 33, tok, sizeof tok);
    snprintf(fifo, sizeof fifo, "%s/fifo", h.dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(yaml, sizeof yaml, "token_file: %s\n", tok);
    start_with_config(&h, yaml, cfg, sizeof cfg);
    snprintf(yaml, sizeof yaml, "token_file: %s\n", fifo);
    reload_refused(&h, cfg, yaml, "token_file is not a regular file");
    assert_int_equal(harness_finish(&h), 0);
}

/* A rotated token longer than the running max_preauth_frame leaves room for (a new max_preauth_frame in the same
 * file takes effect on restart): the reload applied it and locked every TCP client out. Now it is refused, naming
 * the running value, and permd serves on with the last token. */
static void test_reload_token_past_running_preauth_frame(void **state)
{
    (void)state;
    harness h;
    char cfg[160], tok[160], longer[160], line[1002], yaml[400];
    harness_init(&h);
    write_file(&h, "token", FIRST_TOKEN "\n", 33, tok, sizeof tok);
    memset(line, 'w', sizeof line - 1);
    line[sizeof line - 1] = '\n';
    write_file(&h, "longer", line, sizeof line, longer, sizeof longer);
    snprintf(yaml, sizeof yaml, "token_file: %s\nmax_preauth_frame: 256\n", tok);
    start_with_config(&h, yaml, cfg, sizeof cfg);
    snprintf(yaml, sizeof yaml, "token_file: %s\nmax_preauth_frame: 2048\n", longer);
    reload_refused(&h, cfg, yaml, "the running max_preauth_frame: a new one takes effect on restart");
    assert_true(harness_log_contains(&h, "no room under max_preauth_frame (256)"));
    assert_int_equal(harness_finish(&h), 0);
}

/* A short token works but is warned about (peers may try tokens without bound); CRLF line ends are not
 * part of it, whichever ends the client's copy has. */
static void test_token_short_and_crlf(void **state)
{
    (void)state;
    harness h;
    char path[160];
    harness_init(&h);
    const char *extra[] = {"--token-file", write_file(&h, "token", "s3cret\r\n", 8, path, sizeof path), NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    assert_true(harness_log_contains(&h, "the token is 6 bytes; use at least 16"));
    permd_client *c;
    assert_int_equal(permd_connect_tcp(h.tcp, "s3cret", &c), 0);
    permd_close(c);
    assert_int_equal(permd_connect_tcp(h.tcp, "s3cret\r", &c), PERMD_EAUTH);
    assert_int_equal(harness_finish(&h), 0);
}

/* "LOCALHOST:PORT" passes --check-config (any case is localhost), and must then bind: it failed with a
 * bare EINVAL, for tcp and for metrics alike. */
static void test_localhost_any_case(void **state)
{
    (void)state;
    harness h;
    char tcp[64], metrics[64];
    harness_init(&h);
    int port = harness_free_port();
    snprintf(tcp, sizeof tcp, "LOCALHOST:%d", port);
    snprintf(metrics, sizeof metrics, "LocalHost:%d", harness_free_port());
    const char *extra[] = {"--tcp", tcp, "--metrics", metrics, NULL};
    int status = 0;
    if (harness_start(&h, 0, extra, &status))
        fail_msg("permd exited (status %d) on --tcp %s --metrics %s", status, tcp, metrics);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    permd_client *c;
    assert_int_equal(permd_connect_tcp(addr, NULL, &c), 0);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

/* The keepalive timer ("tr" 2 in /proc/net/tcp) of permd's end of the connection from local port `mine` to
 * permd's `port`: 1 armed, 0 not, -1 not found. */
static int server_keepalive_armed(int port, int mine)
{
    char line[512], want_local[32], want_rem[32];
    snprintf(want_local, sizeof want_local, "0100007F:%04X", port);
    snprintf(want_rem, sizeof want_rem, "0100007F:%04X", mine);
    FILE *f = fopen("/proc/net/tcp", "r");
    if (!f)
        return -1;
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        char local[64], rem[64];
        unsigned st, tr;
        if (sscanf(line, " %*d: %63s %63s %x %*s %x:", local, rem, &st, &tr) == 4 && !strcmp(local, want_local) &&
            !strcmp(rem, want_rem))
            found = tr == 2;
    }
    fclose(f);
    return found;
}

/* A TCP peer that vanishes without a FIN (its host died, a partition) while its connection is idle
 * held a max_tcp_connections place and its buffers for as long as permd ran: nothing ever wrote to it.
 * The listener's sockets have TCP keepalive now (inherited by each accepted one), so the kernel ends
 * such a connection and permd sees the error. */
static void test_tcp_keepalive(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    assert_int_equal(harness_start(&h, 1, NULL, NULL), 0);
    if (access("/proc/net/tcp", R_OK)) {
        assert_int_equal(harness_finish(&h), 0);
        skip();
    }
    int port = atoi(strrchr(h.tcp, ':') + 1);
    int fd = raw_connect_tcp(h.tcp);
    assert_true(fd >= 0);
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&me, &len), 0);
    assert_int_equal(server_keepalive_armed(port, ntohs(me.sin_port)), 1);
    close(fd);
    assert_int_equal(harness_finish(&h), 0);
}

/* Guesses pipelined in one segment: the first wrong token closes the connection, and the frames behind it
 * (a right token, a request) are never read, so one connection is one guess. */
static void test_pipelined_guesses(void **state)
{
    (void)state;
    harness h;
    char path[160];
    harness_init(&h);
    const char *extra[] = {"--token-file", write_file(&h, "token", "right-token-right-token\n", 24, path, sizeof path),
                           NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    const char *tokens[] = {"wrong-token", "right-token-right-token"};
    uint8_t buf[1024];
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        Permd__V1__Hello hm = PERMD__V1__HELLO__INIT;
        Permd__V1__Stats sm = PERMD__V1__STATS__INIT;
        pd_envelope env = PERMD__V1__ENVELOPE__INIT;
        env.id = (uint64_t)i + 1;
        if (i < 2) {
            hm.token = (char *)tokens[i];
            env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO;
            env.hello = &hm;
        } else {
            env.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
            env.stats = &sm;
        }
        assert_true(n + pd_frame_size(&env) <= sizeof buf);
        n += pd_frame_pack(&env, buf + n);
    }
    int fd = raw_connect_tcp(h.tcp);
    assert_true(fd >= 0);
    assert_int_equal(raw_send(fd, buf, n), 0);
    pd_envelope *rep;
    assert_int_equal(raw_recv_env(fd, 10000, &rep), 0);
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(rep->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    assert_int_not_equal(raw_recv_env(fd, 10000, &rep), 0); /* EOF (or a reset): nothing else answered */
    close(fd);
    assert_int_equal(harness_finish(&h), 0);
}

/* A peer guessing tokens as fast as it can connect: each guess is refused, but auth_fail lines stop at
 * peer_log_rate a second; every guess is either a line or counted in permd_log_suppressed_total, and the
 * log_suppressed lines never say more than that count. (How many are suppressed depends on the
 * machine's speed; the bound itself is tested on a fake clock in test_handlers and test_log.) */
static void test_auth_fail_log_rate(void **state)
{
    (void)state;
    enum { GUESSES = 40 };
    harness h;
    char path[160], metrics[32];
    harness_init(&h);
    int port = harness_free_port();
    snprintf(metrics, sizeof metrics, "127.0.0.1:%d", port);
    const char *extra[] = {"--token-file", write_file(&h, "token", "right-token-right-token\n", 24, path, sizeof path),
                           "--peer-log-rate", "2", "--metrics", metrics, "--metrics-cache-ms", "0", NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    for (int i = 0; i < GUESSES; i++) {
        permd_client *c;
        assert_int_equal(permd_connect_tcp(h.tcp, "wrong-token", &c), PERMD_EAUTH);
    }
    /* permd logs a refusal before it answers it: every line is in the log by now. */
    long long suppressed = harness_metric(port, "permd_log_suppressed_total{event=\"auth_fail\"}");
    FILE *f = fopen(h.log, "r");
    assert_non_null(f);
    char line[1024];
    long long lines = 0, reported = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "event=log_suppressed of=auth_fail lines=");
        lines += strstr(line, "event=auth_fail ") != NULL;
        if (p)
            reported += atoll(p + strlen("event=log_suppressed of=auth_fail lines="));
    }
    fclose(f);
    assert_true(suppressed >= 0);
    assert_int_equal(lines + suppressed, GUESSES);
    assert_true(reported <= suppressed);
    assert_int_equal(harness_finish(&h), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_with_nul),
        cmocka_unit_test(test_token_too_long),
        cmocka_unit_test(test_token_past_preauth_frame),
        cmocka_unit_test(test_token_not_a_file),
        cmocka_unit_test(test_check_config_token),
        cmocka_unit_test(test_reload_to_fifo),
        cmocka_unit_test(test_reload_token_past_running_preauth_frame),
        cmocka_unit_test(test_token_short_and_crlf),
        cmocka_unit_test(test_localhost_any_case),
        cmocka_unit_test(test_tcp_keepalive),
        cmocka_unit_test(test_pipelined_guesses),
        cmocka_unit_test(test_auth_fail_log_rate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
