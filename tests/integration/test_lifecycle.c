/* Integration: datasets survive restarts, config datasets, startup refusals, and clean exits on SIGTERM/SIGINT; a file-size limit is survived. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

static void test_restart_keeps_datasets(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    assert_int_equal(harness_start(&h, 0, NULL, NULL), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset(c, "a", 10, NULL, NULL), 0);
    assert_int_equal(permd_put_dataset(c, "b", UINT64_C(1) << 63, NULL, NULL), 0);
    assert_int_equal(permd_put_dataset(c, "c", 7, NULL, NULL), 0);
    assert_int_equal(permd_delete_dataset(c, "c"), 0);
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));

    assert_int_equal(harness_start(&h, 0, NULL, NULL), 0);
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    permd_dataset all[4];
    size_t total;
    assert_int_equal(permd_list_datasets(c, all, 4, &total), 0);
    assert_int_equal(total, 2);
    assert_string_equal(all[0].name, "a");
    assert_int_equal(all[0].size, 10);
    assert_string_equal(all[1].name, "b");
    assert_int_equal(all[1].size, UINT64_C(1) << 63);
    assert_int_equal(all[1].id_width, 8);
    permd_close(c);

    /* A crash (SIGKILL) right after an acknowledged put loses nothing either. */
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset(c, "acked", 99, NULL, NULL), 0);
    permd_close(c);
    harness_stop(&h, SIGKILL);
    assert_int_equal(harness_start(&h, 0, NULL, NULL), 0);
    permd_dataset d;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_get_dataset(c, "acked", &d), 0);
    assert_int_equal(d.size, 99);
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&h, SIGINT), 0));
    harness_cleanup(&h);
}

static void test_config_datasets(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    char cfg[160];
    snprintf(cfg, sizeof cfg, "%s/permd.yaml", h.dir);
    FILE *f = fopen(cfg, "w");
    fputs("max_streams: 4\ndatasets:\n  - name: declared\n    size: 1281167\n", f);
    fclose(f);
    const char *extra[] = {"--config", cfg, "--dataset", "flagged:77", NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    permd_client *c;
    permd_dataset d;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_get_dataset(c, "declared", &d), 0);
    assert_int_equal(d.size, 1281167);
    assert_int_equal(d.from_config, 1);
    assert_int_equal(permd_get_dataset(c, "flagged", &d), 0);
    assert_int_equal(permd_delete_dataset(c, "declared"), PERMD_ECONFLICT);
    assert_int_equal(permd_put_dataset(c, "declared", 5, NULL, NULL), PERMD_ECONFLICT);
    assert_int_equal(permd_put_dataset(c, "stored", 5, NULL, NULL), 0);
    permd_server_info info;
    permd_server_info_get(c, &info);
    assert_int_equal(info.max_streams, 4); /* the file's value reached the server */
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));

    /* A config that contradicts the stored registry refuses to start, and says why. */
    const char *bad[] = {"--dataset", "stored:6", NULL};
    int status;
    assert_int_equal(harness_start(&h, 0, bad, &status), -1);
    assert_true(harness_exited_with(status, 1));
    assert_true(harness_log_contains(&h, "dataset=stored"));
    harness_cleanup(&h);
}

static void test_startup_refusals(void **state)
{
    (void)state;
    harness h;
    int status;
    harness_init(&h);

    /* Non-loopback TCP without a token file: a configuration error. */
    const char *open_tcp[] = {"--tcp", "0.0.0.0:7471", NULL};
    assert_int_equal(harness_start(&h, 0, open_tcp, &status), -1);
    assert_true(harness_exited_with(status, 2));

    /* A stale socket file is replaced; a live server's socket is not stolen. */
    FILE *f = fopen(h.sock, "w"); /* a regular file in the way: refused */
    fclose(f);
    assert_int_equal(harness_start(&h, 0, NULL, &status), -1);
    assert_true(harness_exited_with(status, 1));
    unlink(h.sock);
    assert_int_equal(harness_start(&h, 0, NULL, NULL), 0);
    struct stat st;
    assert_int_equal(stat(h.sock, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0660);
    char cmd[512]; /* a second permd on the same socket exits 1 and says why */
    snprintf(cmd, sizeof cmd, "'%s' --socket '%s' --state-dir '%s/state2' 2>>'%s'", PERMD_BIN, h.sock, h.dir, h.log);
    status = system(cmd);
    assert_true(harness_exited_with(status, 1));
    assert_true(harness_log_contains(&h, "another server is listening"));
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0); /* the first still serves */
    permd_close(c);
    pid_t first = h.pid;
    assert_int_equal(kill(first, SIGKILL), 0); /* dies without removing its socket */
    waitpid(first, NULL, 0);
    h.pid = 0;
    assert_int_equal(stat(h.sock, &st), 0);
    assert_int_equal(harness_start(&h, 0, NULL, NULL), 0); /* the stale one is replaced */
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));
    assert_int_equal(stat(h.sock, &st), -1); /* a clean exit removes it */
    harness_cleanup(&h);
}

/* SIGTERM while a stream runs and clients are connected: exit 0, the stream
 * ends with a resumable offset, idle clients see the close. */
static void test_sigterm_with_active_stream(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    assert_int_equal(harness_start(&h, 1, NULL, NULL), 0);
    permd_client *c, *idle;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_connect_tcp(h.tcp, NULL, &idle), 0);
    assert_int_equal(permd_put_dataset(c, "big", UINT64_C(1) << 40, NULL, NULL), 0);
    permd_slice s = {.dataset = "big", .seed = 1, .world = 1, .mode = PERMD_MODE_EXACT};
    permd_stream *st;
    assert_int_equal(permd_stream_open(c, &s, 4096, 0, &st), 0);
    const void *ids;
    uint32_t width;
    uint64_t n, seen = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(permd_stream_next(st, &ids, &width, &n), 0);
        assert_int_equal(n, 4096);
        seen += n;
    }
    kill(h.pid, SIGTERM);
    int rc;
    while ((rc = permd_stream_next(st, &ids, &width, &n)) == 0 && n)
        seen += n;
    assert_int_equal(rc, PERMD_ECLOSED); /* told it is a shutdown, not the end of the slice */
    assert_non_null(strstr(permd_last_error(c), "resume"));
    assert_int_equal(permd_stream_offset(st), seen); /* W = 1: the offset counts what was read */
    permd_stream_close(st);
    permd_dataset d;
    assert_true(permd_get_dataset(idle, "big", &d) < 0);
    permd_close(idle);
    permd_close(c);
    int status = harness_stop(&h, SIGTERM); /* already stopping: collect the exit */
    assert_true(harness_exited_with(status, 0));
    assert_true(harness_log_contains(&h, "event=stopped"));
    harness_cleanup(&h);
}

/* error_linger_ms 0 closes at once after an error, not while permd stops: a stream's client may still be
 * sending Credits then, and closing under them would reset the connection (losing, over TCP, the StreamEnd
 * that tells it where to resume). permd keeps reading and discarding until the client closes. */
static void test_stop_waits_for_stream_peer(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    const char *extra[] = {"--error-linger-ms", "0", NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    assert_int_equal(harness_put(&h, "big", UINT64_C(1) << 40), 0);
    int fd = raw_connect_unix(h.sock);
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "big";
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    assert_int_equal(raw_send_stream(fd, 7, &sl, 4096, 2, 0, 0), 0);
    pd_envelope env = PERMD__V1__ENVELOPE__INIT, *rep;
    env.id = 7;
    assert_int_equal(raw_recv_env(fd, 10000, &rep), 0); /* the first batch: the stream runs */
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    kill(h.pid, SIGTERM);
    int ended = 0;
    while (!ended) {
        assert_int_equal(raw_recv_env(fd, 10000, &rep), 0);
        ended = rep->body_case == PERMD__V1__ENVELOPE__BODY_STREAM_END;
        if (ended)
            assert_int_equal(rep->stream_end->reason, PERMD__V1__END_REASON__END_REASON_SHUTDOWN);
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    usleep(200000);
    Permd__V1__Credit credit = PERMD__V1__CREDIT__INIT; /* a client's credit in flight as the stream ended */
    credit.credits = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_CREDIT;
    env.credit = &credit;
    assert_int_equal(raw_send_env(fd, &env), 0); /* permd still reads: the send is not refused (EPIPE) */
    assert_true(raw_wait_eof(fd, 10000));       /* it had shut down its side, and closes after our EOF */
    close(fd);
    int status = harness_stop(&h, SIGTERM);
    assert_true(harness_exited_with(status, 0));
    harness_cleanup(&h);
}

/* SIGTERM or SIGINT sent again and again while permd stops (a supervisor retrying, Ctrl-C held down)
 * must not turn the clean exit into death by signal: whichever thread a signal lands on, at whatever
 * moment of the shutdown, permd exits 0. Each round sends signals every ~20 us from before the first
 * until the process is gone, so they land during the handlers' close as well. */
static void test_repeated_stop_signals(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        harness h;
        harness_init(&h);
        assert_int_equal(harness_start(&h, 0, NULL, NULL), 0);
        permd_client *c;
        assert_int_equal(permd_connect_unix(h.sock, &c), 0);
        assert_int_equal(permd_put_dataset(c, "d", 1000, NULL, NULL), 0);
        int sig = round % 2 ? SIGINT : SIGTERM, st = -1;
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) { /* until reaped, 10 s at most (then harness_cleanup kills it) */
            kill(h.pid, sig);
            if (waitpid(h.pid, &st, WNOHANG) == h.pid) {
                h.pid = 0;
                break;
            }
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - t0.tv_sec >= 10)
                break;
            usleep(20);
        }
        if (!harness_exited_with(st, 0))
            fprintf(stderr, "round %d: permd ended with status %#x\n", round, st);
        assert_true(harness_exited_with(st, 0));
        permd_close(c);
        harness_cleanup(&h);
    }
}

static void test_check_config(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' --check-config --max-streams 3 > '%s/out' 2>&1", PERMD_BIN, h.dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "grep -q '^max_streams: 3$' '%s/out'", h.dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' --check-config --max-frame 1 > /dev/null 2>&1", PERMD_BIN);
    int st = system(cmd);
    assert_true(harness_exited_with(st, 2));
    harness_cleanup(&h);
}

/* A socket path longer than sun_path holds (107 bytes and its NUL) is refused by name, from the
 * command line or the environment, at --check-config as at startup; no socket is left anywhere
 * (libuv used to bind it cut short, then fail chmod with ENOENT and leave the stray file). */
static void test_long_socket_path(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    char dir[256], sock[300], cut[128], cmd[1024];
    snprintf(dir, sizeof dir, "%s/%0100d", h.dir, 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(sock, sizeof sock, "%s/permd.sock", dir);
    assert_true(strlen(sock) > 107);
    snprintf(cut, sizeof cut, "%.107s", sock);
    const char *forms[] = {"--check-config --socket '%s'", "--socket '%s' --state-dir '%s/state' --metrics ''"};
    for (int i = 0; i < 2; i++) {
        char args[700];
        snprintf(args, sizeof args, forms[i], sock, h.dir);
        snprintf(cmd, sizeof cmd, "'%s' %s >>'%s' 2>&1", PERMD_BIN, args, h.log);
        assert_true(harness_exited_with(system(cmd), 2));
    }
    /* From $PERMD_SOCKET: a configuration error at --check-config, a refusal to start (1) otherwise. */
    snprintf(cmd, sizeof cmd, "PERMD_SOCKET='%s' '%s' --check-config >>'%s' 2>&1", sock, PERMD_BIN, h.log);
    assert_true(harness_exited_with(system(cmd), 2));
    snprintf(cmd, sizeof cmd, "PERMD_SOCKET='%s' '%s' --state-dir '%s/state' --metrics '' >>'%s' 2>&1", sock,
             PERMD_BIN, h.dir, h.log);
    assert_true(harness_exited_with(system(cmd), 1));
    char msg[400];
    snprintf(msg, sizeof msg, "%s' is %zu bytes; a Unix socket path holds at most 107", sock, strlen(sock));
    assert_true(harness_log_contains(&h, msg)); /* the flag, named by pd_config_validate */
    snprintf(msg, sizeof msg, "%s is %zu bytes; a Unix socket path holds at most 107", sock, strlen(sock));
    assert_true(harness_log_contains(&h, msg)); /* $PERMD_SOCKET at --check-config */
    snprintf(msg, sizeof msg, "path=%s msg=\"the path is %zu bytes; a Unix socket path holds at most 107", sock,
             strlen(sock));
    assert_true(harness_log_contains(&h, msg)); /* and at startup */
    struct stat st;
    assert_int_equal(lstat(cut, &st), -1);
    assert_int_equal(lstat(sock, &st), -1);
    harness_cleanup(&h);
}

/* Under a file-size limit (ulimit -f, systemd's LimitFSIZE) a write past it fails with EFBIG: a put is
 * refused and permd serves on; SIGXFSZ used to kill it. */
static void test_file_size_limit(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 64 << 10; /* permd inherits it; its registry and log outgrow it within a few hundred puts */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = harness_start(&h, 0, NULL, NULL);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    assert_int_equal(rc, 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    char name[160];
    int i, failed = 0;
    for (i = 0; i < 20000 && !failed; i++) {
        snprintf(name, sizeof name, "x%0120d", i);
        failed = permd_put_dataset(c, name, (uint64_t)i + 1, NULL, NULL) != 0;
    }
    assert_true(failed);
    assert_true(i > 1);
    permd_close(c);
    /* Alive, and what it acknowledged is there. */
    assert_int_equal(kill(h.pid, 0), 0);
    permd_dataset d;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    snprintf(name, sizeof name, "x%0120d", 0);
    assert_int_equal(permd_get_dataset(c, name, &d), 0);
    assert_int_equal(d.size, 1);
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));
    harness_cleanup(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_keeps_datasets),
        cmocka_unit_test(test_config_datasets),
        cmocka_unit_test(test_startup_refusals),
        cmocka_unit_test(test_sigterm_with_active_stream),
        cmocka_unit_test(test_stop_waits_for_stream_peer),
        cmocka_unit_test(test_repeated_stop_signals),
        cmocka_unit_test(test_check_config),
        cmocka_unit_test(test_long_socket_path),
        cmocka_unit_test(test_file_size_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
