/* Integration: hostile peers, slow clients, signals and damaged files (issue 14): each attack bounded, nobody locked out, nothing lost. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

static void start(harness *h, int with_tcp, const char *const *extra)
{
    harness_init(h);
    assert_int_equal(harness_start(h, with_tcp, extra, NULL), 0);
}

static void stop(harness *h)
{
    assert_true(harness_exited_with(harness_stop(h, SIGTERM), 0));
    harness_cleanup(h);
}

/* A token file in h's directory. */
static const char *token_file(harness *h, const char *token, char *path, size_t len)
{
    snprintf(path, len, "%s/token", h->dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", token);
    fclose(f);
    chmod(path, 0600);
    return path;
}

static void send_stats(int fd, uint64_t id)
{
    Permd__V1__Stats st = PERMD__V1__STATS__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
    env.stats = &st;
    assert_int_equal(raw_send_env(fd, &env), 0);
}

/* The body of the next reply (an Error's code as a negative number), or -100 on EOF or timeout. */
static int reply_kind(int fd, int timeout_ms)
{
    pd_envelope *env;
    if (raw_recv_env(fd, timeout_ms, &env))
        return -100;
    int kind = env->body_case == PERMD__V1__ENVELOPE__BODY_ERROR ? -(int)env->error->code : (int)env->body_case;
    protobuf_c_message_free_unpacked(&env->base, NULL);
    return kind;
}

static void send_hello(int fd, const char *token)
{
    Permd__V1__Hello m = PERMD__V1__HELLO__INIT;
    m.token = (char *)token;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO;
    env.hello = &m;
    assert_int_equal(raw_send_env(fd, &env), 0);
}

/* A length prefix announcing n bytes, and only the first `have` of them. */
static void send_partial(int fd, uint32_t n, size_t have)
{
    uint8_t *buf = calloc(1, 4 + have);
    pd_store_le32(buf, n);
    memset(buf + 4, 0x0a, have); /* never completes, so its content does not matter */
    assert_int_equal(raw_send(fd, buf, 4 + have), 0);
    free(buf);
}

/* After a closing error, permd discards what the peer still sends for error_linger_ms, then closes: a
 * peer still writing sees its writes taken at first and refused (EPIPE) once the linger has passed;
 * with 0, at once. Returns the seconds from the error's arrival to the refusal. */
static double linger_seconds(const char *linger_ms, int *taken_after_eof)
{
    harness h;
    const char *extra[] = {"--error-linger-ms", linger_ms, NULL};
    start(&h, 0, extra);
    int fd = raw_connect_unix(h.sock);
    send_partial(fd, 2u << 20, 64); /* announces a frame past max_frame (1 MiB) */
    assert_int_equal(reply_kind(fd, 3000), -PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    double t0 = test_now_s();
    assert_true(raw_wait_eof(fd, 3000)); /* permd shut its writing half */
    char junk[256] = {0};
    *taken_after_eof = send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk;
    double t = -1;
    while (test_now_s() - t0 < 10) {
        if (send(fd, junk, sizeof junk, MSG_NOSIGNAL) < 0) {
            assert_true(errno == EPIPE || errno == ECONNRESET);
            t = test_now_s() - t0;
            break;
        }
        usleep(10000);
    }
    close(fd);
    stop(&h);
    return t;
}

static void test_error_linger(void **state)
{
    (void)state;
    int taken;
    double t = linger_seconds("400", &taken);
    print_message("error_linger_ms 400: closed %.3f s after the error\n", t);
    assert_true(taken);              /* lingering: the peer's bytes are read and dropped */
    assert_true(t > 0 && t < 1.7);   /* 400 ms, the 500 ms sweep, slack; the old constant took 2 s */
    t = linger_seconds("0", &taken);
    print_message("error_linger_ms 0: closed %.3f s after the error\n", t);
    assert_true(t >= 0 && t < 0.3); /* closed once the error was written */
}

/* 1. Unauthenticated TCP peers neither take the Unix socket's places nor stay: a Hello deadline,
 *    a small frame limit before Hello, and their own cap. */
static void test_tcp_peers_cannot_lock_out_unix(void **state)
{
    (void)state;
    harness h;
    char tok[160];
    harness_init(&h);
    const char *extra[] = {"--token-file", token_file(&h, "s3cret", tok, sizeof tok), "--max-connections", "8",
                           "--max-tcp-connections", "24", "--hello-timeout-ms", "700", "--max-preauth-frame", "4096",
                           NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    usleep(200000); /* the harness's own probe connections are gone */
    enum { IDLE = 40 };
    int idle[IDLE];
    for (int i = 0; i < IDLE; i++)
        assert_true((idle[i] = raw_connect_tcp(h.tcp)) >= 0);
    usleep(100000);
    /* 40 idle TCP peers: the Unix socket still serves (its 8 places are its own). */
    for (int i = 0; i < 8; i++) {
        int fd = raw_connect_unix(h.sock);
        send_stats(fd, 1);
        assert_int_equal(reply_kind(fd, 5000), PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
        close(fd);
    }
    /* Each TCP peer's first reply: OVERLOADED for the 16 beyond max_tcp_connections, UNAUTHENTICATED for the 24
     * admitted once hello_timeout_ms passes. Both are read with a deadline: counting the refusals with a poll of
     * 0 ms missed those not written yet on a loaded machine, and the admitted ones' expiry could come first. */
    double t0 = test_now_s();
    int overloaded = 0, expired = 0;
    for (int i = 0; i < IDLE; i++) {
        pd_envelope *env;
        if (raw_recv_env(idle[i], 3000, &env) == 0) {
            const int error = env->body_case == PERMD__V1__ENVELOPE__BODY_ERROR;
            overloaded += error && env->error->code == PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED;
            expired += error && env->error->code == PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED &&
                       strstr(env->error->message, "hello_timeout_ms");
            protobuf_c_message_free_unpacked(&env->base, NULL);
        }
        close(idle[i]);
    }
    assert_int_equal(overloaded, IDLE - 24);
    assert_int_equal(expired, 24);
    assert_true(test_now_s() - t0 < 3.0);
    /* Before Hello, a frame may announce at most max_preauth_frame bytes. */
    int fd = raw_connect_tcp(h.tcp);
    send_partial(fd, 100000, 16);
    assert_int_equal(reply_kind(fd, 3000), -PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    assert_true(raw_wait_eof(fd, 3000));
    close(fd);
    /* After a good Hello the deadline and the small limit are gone. */
    fd = raw_connect_tcp(h.tcp);
    send_hello(fd, "s3cret");
    assert_int_equal(reply_kind(fd, 3000), PERMD__V1__ENVELOPE__BODY_HELLO_REPLY);
    usleep(1000000); /* past hello_timeout_ms */
    send_stats(fd, 2);
    assert_int_equal(reply_kind(fd, 3000), PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
    close(fd);
    assert_true(harness_log_contains(&h, "reason=hello_timeout"));
    stop(&h);
}

/* 2. Admission counts exactly: a burst beyond max_connections admits exactly that many, and the
 *    refused ones (still lingering after their error) hold no place. */
static void test_admission_is_exact(void **state)
{
    (void)state;
    harness h;
    const char *extra[] = {"--max-connections", "32", "--loops", "3", NULL};
    start(&h, 0, extra);
    usleep(200000); /* the harness's own probe connection is gone */
    enum { BURST = 48 };
    int fds[BURST], served = 0, refused = 0, first_served = -1;
    for (int i = 0; i < BURST; i++)
        assert_true((fds[i] = raw_connect_unix(h.sock)) >= 0);
    for (int i = 0; i < BURST; i++)
        send_stats(fds[i], 1);
    for (int i = 0; i < BURST; i++) {
        int k = reply_kind(fds[i], 5000);
        if (k == PERMD__V1__ENVELOPE__BODY_STATS_REPLY) {
            served++;
            if (first_served < 0)
                first_served = i;
        } else if (k == -PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED) {
            refused++;
        }
    }
    assert_int_equal(served, 32);
    assert_int_equal(refused, BURST - 32);
    /* One admitted client leaves: its place is free at once, whatever the refused ones do. */
    close(fds[first_served]);
    fds[first_served] = -1;
    usleep(200000);
    int fd = raw_connect_unix(h.sock);
    send_stats(fd, 2);
    assert_int_equal(reply_kind(fd, 5000), PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
    close(fd);
    for (int i = 0; i < BURST; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    stop(&h);
}

/* 3. A client that stops mid-frame holds its buffer no longer than frame_timeout_ms. */
static void test_partial_frames_expire(void **state)
{
    (void)state;
    harness h;
    const char *extra[] = {"--frame-timeout-ms", "600", "--max-frame", "2097152", NULL};
    start(&h, 0, extra);
    long rss0 = harness_rss_kb(&h);
    enum { N = 40 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        assert_true((fds[i] = raw_connect_unix(h.sock)) >= 0);
        send_partial(fds[i], 2000000, 1 << 20); /* 1 MiB of a 2 MB frame, then nothing */
    }
    usleep(200000);
    long rss_held = harness_rss_kb(&h);
    double t0 = test_now_s();
    for (int i = 0; i < N; i++) {
        assert_int_equal(reply_kind(fds[i], 5000), -PERMD__V1__ERROR_CODE__ERROR_CODE_BAD_FRAME);
        assert_true(raw_wait_eof(fds[i], 5000));
        close(fds[i]);
    }
    assert_true(test_now_s() - t0 < 3.0);
    usleep(300000);
    long rss_after = harness_rss_kb(&h);
    print_message("partial frames: RSS %ld KiB idle, %ld KiB with %d x 1 MiB held, %ld KiB after they expired\n",
                  rss0, rss_held, N, rss_after);
    assert_true(rss_held - rss0 > N * 512); /* they were held (the test measures something) */
#if !defined(__SANITIZE_ADDRESS__) /* ASan keeps freed memory in quarantine: RSS cannot show it let go */
    assert_true(rss_after - rss0 < (rss_held - rss0) / 2); /* and let go */
#endif
    /* A frame that arrives slowly but within the limit is served. */
    int fd = raw_connect_unix(h.sock);
    Permd__V1__Stats st = PERMD__V1__STATS__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 3;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
    env.stats = &st;
    uint8_t buf[64];
    size_t n = pd_frame_pack(&env, buf);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(raw_send(fd, buf + i, 1), 0);
        usleep(20000);
    }
    assert_int_equal(reply_kind(fd, 3000), PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
    close(fd);
    assert_true(harness_log_contains(&h, "reason=frame_timeout"));
    stop(&h);
}

/* A frame timeout answers no request: its BAD_FRAME is counted as the connection's, not under the type
 * of the request answered before it on that connection (it was counted as a "stats" error here). */
static void test_frame_timeout_counted_as_connection(void **state)
{
    (void)state;
    harness h;
    const char *extra[] = {"--frame-timeout-ms", "200", NULL};
    start(&h, 0, extra);
    int fd = raw_connect_unix(h.sock);
    assert_true(fd >= 0);
    send_stats(fd, 1);
    assert_int_equal(reply_kind(fd, 5000), PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
    send_partial(fd, 50, 1);
    assert_int_equal(reply_kind(fd, 5000), -PERMD__V1__ERROR_CODE__ERROR_CODE_BAD_FRAME);
    assert_true(raw_wait_eof(fd, 5000));
    close(fd);
    permd_client *c;
    permd_stats st;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_stats_get(c, &st), 0);
    permd_close(c);
    uint64_t as_conn = 0, as_stats = 0;
    for (uint32_t i = 0; i < st.nerrors; i++) {
        if (strcmp(st.errors[i].code, "BAD_FRAME"))
            continue;
        if (!strcmp(st.errors[i].type, "connection"))
            as_conn += st.errors[i].count;
        else if (!strcmp(st.errors[i].type, "stats"))
            as_stats += st.errors[i].count;
    }
    assert_int_equal(as_conn, 1);
    assert_int_equal(as_stats, 0);
    stop(&h);
}

/* An HTTP GET /healthz on a fresh connection: the status, or 0. */
static int healthz(int port)
{
    char hp[32];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", port);
    int fd = raw_connect_tcp(hp);
    if (fd < 0)
        return 0;
    const char *req = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(fd, req, strlen(req));
    char buf[256] = "";
    size_t got = 0;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    while (got < 12 && poll(&pf, 1, 2000) == 1) {
        ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    int status = 0;
    sscanf(buf, "HTTP/1.1 %d", &status);
    return status;
}

/* 4. Slow and idle clients of the metrics endpoint cannot keep a health probe out. */
static void test_healthz_under_slowloris(void **state)
{
    (void)state;
    harness h;
    char addr[32];
    int port = harness_metrics_addr(addr);
    const char *extra[] = {"--metrics", addr, NULL};
    start(&h, 0, extra);
    enum { SLOW = 200 };
    int slow[SLOW];
    for (int i = 0; i < SLOW; i++) {
        assert_true((slow[i] = raw_connect_tcp(addr)) >= 0);
        assert_int_equal(raw_send(slow[i], "G", 1), 0); /* a request that never finishes */
    }
    usleep(200000);
    int ok = 0;
    for (int probe = 0; probe < 20; probe++) {
        for (int i = 0; i < SLOW; i += 20) /* the slow clients keep trickling */
            raw_send(slow[i], "E", 1);
        ok += healthz(port) == 200;
        usleep(50000);
    }
    print_message("healthz under %d slow connections: %d of 20 probes answered 200\n", SLOW, ok);
    assert_int_equal(ok, 20);
    for (int i = 0; i < SLOW; i++)
        close(slow[i]);
    stop(&h);
}

/* 5. SIGHUP reloads what can change safely (log level, allowed uids, the token file); SIGUSR1 and
 *    SIGUSR2 are logged and ignored. permd keeps serving through all three. */
static void test_signals(void **state)
{
    (void)state;
    harness h;
    char cfg[160], tok[160], tok2[160];
    harness_init(&h);
    snprintf(cfg, sizeof cfg, "%s/permd.yaml", h.dir);
    token_file(&h, "first", tok, sizeof tok);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "token_file: %s\nmax_streams: 16\n", tok);
    fclose(f);
    const char *extra[] = {"--config", cfg, NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    kill(h.pid, SIGUSR1);
    kill(h.pid, SIGUSR2);
    usleep(200000);
    assert_int_equal(harness_put(&h, "still", 10), 0);
    assert_true(harness_log_contains(&h, "name=SIGUSR1 action=ignore"));
    assert_true(harness_log_contains(&h, "name=SIGUSR2 action=ignore"));

    /* A new token in a new file, and a key that only a restart applies. */
    snprintf(tok2, sizeof tok2, "%s/token2", h.dir);
    f = fopen(tok2, "w");
    fprintf(f, "second\n");
    fclose(f);
    chmod(tok2, 0600);
    f = fopen(cfg, "w");
    fprintf(f, "token_file: %s\nmax_streams: 4\n", tok2);
    fclose(f);
    kill(h.pid, SIGHUP);
    usleep(300000);
    assert_true(harness_log_contains(&h, "name=SIGHUP action=reload"));
    assert_true(harness_log_contains(&h, "key=max_streams msg=\"changed; restart permd to apply it\""));
    int fd = raw_connect_tcp(h.tcp);
    send_hello(fd, "first");
    assert_int_equal(reply_kind(fd, 3000), -PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED);
    close(fd);
    fd = raw_connect_tcp(h.tcp);
    send_hello(fd, "second");
    assert_int_equal(reply_kind(fd, 3000), PERMD__V1__ENVELOPE__BODY_HELLO_REPLY);
    close(fd);
    /* A configuration that does not parse is refused whole; permd goes on with the last good one. */
    f = fopen(cfg, "w");
    fprintf(f, "token_file: [not, a, path\n");
    fclose(f);
    kill(h.pid, SIGHUP);
    usleep(300000);
    assert_true(harness_log_contains(&h, "the configuration was not applied"));
    fd = raw_connect_tcp(h.tcp);
    send_hello(fd, "second");
    assert_int_equal(reply_kind(fd, 3000), PERMD__V1__ENVELOPE__BODY_HELLO_REPLY);
    close(fd);
    struct stat st;
    assert_int_equal(stat(h.sock, &st), 0); /* still listening: no stale socket */
    stop(&h);
}

/* 6. Every string field is checked whole: a NUL byte inside is refused, never cut short. */
static void test_nul_in_strings(void **state)
{
    (void)state;
    harness h;
    char tok[160];
    harness_init(&h);
    const char *extra[] = {"--token-file", token_file(&h, "tok", tok, sizeof tok), NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    /* Put "abc\0evil/../../x": protobuf-c would hand out "abc". */
    static const char name[] = "abc\0evil/../../x";
    Permd__V1__PutDataset m = PERMD__V1__PUT_DATASET__INIT;
    m.size = 5;
    m.name = (char *)name;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_PUT_DATASET;
    env.put_dataset = &m;
    /* protobuf-c packs strings with strlen: pack, then splice the whole name in by hand. */
    uint8_t buf[256];
    size_t n = pd_frame_pack(&env, buf);
    uint8_t *at = memmem(buf, n, "abc", 3);
    assert_non_null(at);
    assert_int_equal(at[-1], 3);
    uint8_t out[256];
    size_t head = (size_t)(at - buf) - 1, tail = n - head - 1 - 3;
    memcpy(out, buf, head);
    out[head] = (uint8_t)(sizeof name - 1);
    memcpy(out + head + 1, name, sizeof name - 1);
    memcpy(out + head + 1 + sizeof name - 1, at + 3, tail);
    size_t total = n + sizeof name - 1 - 3;
    /* The envelope's body length grew too: envelope = [id][tag 11][len][body]; body = [tag][len][name][size]. */
    out[4 + 2 + 1] = (uint8_t)(out[4 + 2 + 1] + sizeof name - 1 - 3);
    pd_store_le32(out, (uint32_t)(total - 4));
    int fd = raw_connect_unix(h.sock);
    assert_int_equal(raw_send(fd, out, total), 0);
    pd_envelope *rep;
    assert_int_equal(raw_recv_env(fd, 3000, &rep), 0);
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(rep->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    assert_non_null(strstr(rep->error->message, "NUL"));
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    close(fd);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    permd_dataset d;
    assert_int_equal(permd_get_dataset(c, "abc", &d), PERMD_ENOTFOUND); /* nothing was created */
    permd_close(c);

    /* A token followed by "\0junk" does not authenticate. */
    static const char token[] = "tok\0junk";
    Permd__V1__Hello hm = PERMD__V1__HELLO__INIT;
    hm.token = "tok";
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO;
    env.hello = &hm;
    n = pd_frame_pack(&env, buf);
    at = memmem(buf, n, "tok", 3);
    assert_non_null(at);
    head = (size_t)(at - buf) - 1;
    tail = n - head - 1 - 3;
    memcpy(out, buf, head);
    out[head] = (uint8_t)(sizeof token - 1);
    memcpy(out + head + 1, token, sizeof token - 1);
    memcpy(out + head + 1 + sizeof token - 1, at + 3, tail);
    total = n + sizeof token - 1 - 3;
    out[4 + 2 + 1] = (uint8_t)(out[4 + 2 + 1] + sizeof token - 1 - 3);
    pd_store_le32(out, (uint32_t)(total - 4));
    fd = raw_connect_tcp(h.tcp);
    assert_int_equal(raw_send(fd, out, total), 0);
    int k = reply_kind(fd, 3000);
    assert_true(k == -PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT ||
                k == -PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED);
    send_stats(fd, 9); /* still not authenticated */
    k = reply_kind(fd, 3000);
    assert_true(k == -PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED || k == -100);
    close(fd);
    stop(&h);
}

static void send_stream(int fd, uint64_t id, uint64_t batch)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "big";
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    Permd__V1__Stream m = PERMD__V1__STREAM__INIT;
    m.slice = &sl;
    m.batch = batch;
    m.credits = 1;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STREAM;
    env.stream = &m;
    assert_int_equal(raw_send_env(fd, &env), 0);
}

static void send_cancel(int fd, uint64_t id)
{
    Permd__V1__Cancel m = PERMD__V1__CANCEL__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_CANCEL;
    env.cancel = &m;
    assert_int_equal(raw_send_env(fd, &env), 0);
}

/* What a reader thread counts while the test sends. */
typedef struct cycle_reader {
    int fd;
    int cycles;
    int overloaded, ends;
} cycle_reader;

static void *read_cycles(void *arg)
{
    cycle_reader *r = arg;
    while (r->ends + r->overloaded < r->cycles) {
        pd_envelope *env;
        if (raw_recv_env(r->fd, 10000, &env))
            break;
        if (env->body_case == PERMD__V1__ENVELOPE__BODY_ERROR &&
            env->error->code == PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED)
            r->overloaded++;
        if (env->body_case == PERMD__V1__ENVELOPE__BODY_STREAM_END && env->id >= 10)
            r->ends++;
        protobuf_c_message_free_unpacked(&env->base, NULL);
    }
    return NULL;
}

/* 7. A cancelled stream stops counting toward max_streams at once, though its last batch is still
 *    being generated. */
static void test_cancelled_streams_free_their_place(void **state)
{
    (void)state;
    harness h;
    const char *extra[] = {"--max-streams", "2", NULL};
    start(&h, 0, extra);
    assert_int_equal(harness_put(&h, "big", UINT64_C(1) << 40), 0);
    int fd = raw_connect_unix(h.sock);
    send_stream(fd, 1, 100); /* one stream stays live throughout */
    enum { CYCLES = 1500 };
    /* Replies are read as they come (a client that never reads is paused by output_cap, by design). */
    cycle_reader r = {.fd = fd, .cycles = CYCLES};
    pthread_t reader;
    assert_int_equal(pthread_create(&reader, NULL, read_cycles, &r), 0);
    for (uint64_t i = 0; i < CYCLES; i++) {
        send_stream(fd, 10 + i, 65536); /* a pool batch: still in flight when Cancel arrives */
        send_cancel(fd, 10 + i);
    }
    pthread_join(reader, NULL);
    print_message("%d Stream+Cancel cycles beside a live stream: %d OVERLOADED\n", CYCLES, r.overloaded);
    assert_int_equal(r.overloaded, 0);
    assert_int_equal(r.ends, CYCLES);
    close(fd);
    stop(&h);
}

/* 8. Sharded datasets are bounded in bytes: uploads in flight, layouts kept, plans cached. */
static void test_shard_memory_bounds(void **state)
{
    (void)state;
    harness h;
    char addr[32];
    int port = harness_metrics_addr(addr);
    const char *extra[] = {"--metrics", addr, "--metrics-cache-ms", "0", /* each scrape follows an action */
                           "--upload-memory", "3145728", "--layout-memory", "4194304",
                           "--plan-cache-bytes", "4194304", "--max-shards", "16777216", NULL};
    start(&h, 0, extra);
    /* Uploads: 16 M shards announced, sizes held only as they arrive, 3 MiB in all. */
    int a = raw_connect_unix(h.sock), b = raw_connect_unix(h.sock);
    assert_int_equal(raw_send_upload_part(a, "a", 1 << 24, 0, 100000), 0); /* 800 KB */
    assert_int_equal(reply_kind(a, 3000), PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    assert_int_equal(raw_send_upload_part(b, "b", 1 << 24, 0, 100000), 0);
    assert_int_equal(reply_kind(b, 3000), PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    long long held = harness_metric(port, "permd_upload_bytes");
    assert_true(held >= 1600000 && held <= 3145728);
    assert_int_equal(raw_send_upload_part(b, "b", 1 << 24, 100000, 200000), 0); /* over 3 MiB together */
    assert_int_equal(reply_kind(b, 3000), -PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    assert_true(harness_metric(port, "permd_upload_bytes") < held); /* b's upload was dropped */
    close(a);
    close(b);
    usleep(200000);
    assert_int_equal(harness_metric(port, "permd_upload_bytes"), 0); /* a's went with its connection */

    /* Layouts: 4 MiB of them (8 bytes a shard). */
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    enum { S = 300000 };
    uint64_t *sizes = malloc(S * sizeof *sizes);
    for (size_t i = 0; i < S; i++)
        sizes[i] = 3;
    assert_int_equal(permd_put_dataset_sharded(c, "s1", sizes, S, 8, 1, NULL, NULL), 0); /* 2.4 MB */
    assert_int_equal(permd_put_dataset_sharded(c, "s2", sizes, S, 8, 1, NULL, NULL), PERMD_ETOOBIG);
    assert_non_null(strstr(permd_last_error(c), "layout_memory"));
    long long layouts = harness_metric(port, "permd_layout_bytes");
    assert_true(layouts > 2400000 && layouts <= 4194304);

    /* Plans: each 16 bytes a shard (4.8 MB here): never more than the newest beyond the bound. */
    for (uint64_t seed = 0; seed < 6; seed++) {
        permd_slice sl = {.dataset = "s1", .seed = seed, .world = 1, .mode = PERMD_MODE_EXACT};
        uint32_t ids[10];
        uint64_t got, next;
        assert_int_equal(permd_fetch_u32(c, &sl, 10, ids, &got, &next), 0);
        assert_true(harness_metric(port, "permd_plan_bytes") <= 16LL * S + 4194304);
    }
    free(sizes);
    permd_close(c);
    stop(&h);
}

/* A Digest of count ids of "big" on fd; the reply's kind. */
static void send_digest(int fd, uint64_t id, uint64_t count)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "big";
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    sl.epoch = id;
    Permd__V1__Digest m = PERMD__V1__DIGEST__INIT;
    m.slice = &sl;
    m.count = count;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_DIGEST;
    env.digest = &m;
    assert_int_equal(raw_send_env(fd, &env), 0);
}

/* The time a Put takes while two connections digest long slices; *digest_s: how long one took. */
static double put_latency_under_digests(const char *slice_ids, double *digest_s)
{
    harness h;
    const char *extra[] = {"--workers", "2", "--cpu-threads", "1", "--job-slice-ids", slice_ids, NULL};
    start(&h, 0, extra);
    assert_int_equal(harness_put(&h, "big", UINT64_C(1) << 40), 0);
    int d1 = raw_connect_unix(h.sock), d2 = raw_connect_unix(h.sock);
    double t0 = test_now_s();
    send_digest(d1, 1, UINT64_C(1) << 27);
    send_digest(d2, 2, UINT64_C(1) << 27);
    usleep(100000);
    double p0 = test_now_s();
    assert_int_equal(harness_put(&h, "during", 7), 0);
    double put = test_now_s() - p0;
    assert_int_equal(reply_kind(d1, 120000), PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY);
    assert_int_equal(reply_kind(d2, 120000), PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY);
    *digest_s = test_now_s() - t0;
    close(d1);
    close(d2);
    stop(&h);
    return put;
}

/* 9. Long jobs run in slices: other connections' work is not held up behind two long digests. */
static void test_long_jobs_do_not_starve_others(void **state)
{
    (void)state;
    double digest, digest_whole;
    double put = put_latency_under_digests("1048576", &digest);
    double put_whole = put_latency_under_digests("1099511627776", &digest_whole); /* the control: one slice */
    print_message("Put while two connections digest 2^27 ids (workers 2): %.3f s in slices of 2^20 (digests took "
                  "%.2f s), %.3f s in one slice (%.2f s)\n",
                  put, digest, put_whole, digest_whole);
    assert_true(put < digest / 4);
    assert_true(put_whole > digest_whole / 3); /* the control shows what slicing prevents */
}

/* Start permd on a state dir prepared by the caller; the exit status if it exits within 5 s, else -1
 * (it serves: stopped with SIGTERM). */
static int start_status(harness *h, const char *const *extra)
{
    int status = 0;
    if (harness_start(h, 0, extra, &status) < 0)
        return status;
    return -1;
}

static int count_files(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return n;
}

/* 10. A registry that cannot be read whole refuses to start (or, asked to, starts afresh keeping the
 *     damaged files); a WAL lost after kill -9 loses nothing acknowledged; causes are named. */
static void test_damaged_registries(void **state)
{
    (void)state;
    harness h;
    char db[200], wal[220];
    start(&h, 0, NULL);
    for (int i = 0; i < 50; i++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", i);
        assert_int_equal(harness_put(&h, name, (uint64_t)i + 1), 0);
    }
    kill(h.pid, SIGKILL);
    waitpid(h.pid, NULL, 0);
    h.pid = 0;
    snprintf(db, sizeof db, "%s/registry.db", h.state);
    snprintf(wal, sizeof wal, "%s-wal", db);
    unlink(wal); /* the WAL lost after kill -9 */
    assert_int_equal(harness_start(&h, 0, NULL, NULL), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    permd_dataset all[64];
    size_t total = 0;
    assert_int_equal(permd_list_datasets(c, all, 64, &total), 0);
    assert_int_equal(total, 50); /* every acknowledged dataset was in the main file */
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));

    /* Damage in the middle of the file: refused, with a clear error; the file is left as it was. */
    int fd = open(db, O_WRONLY);
    assert_true(fd >= 0);
    char junk[4096];
    memset(junk, 0xa5, sizeof junk);
    assert_int_equal(pwrite(fd, junk, sizeof junk, 4096), (ssize_t)sizeof junk);
    close(fd);
    int st = start_status(&h, NULL);
    assert_true(harness_exited_with(st, 1));
    assert_true(harness_log_contains(&h, "the registry is damaged"));
    assert_true(harness_log_contains(&h, "fresh_registry"));

    /* fresh_registry: 1 starts afresh and keeps the damaged file aside. */
    const char *fresh[] = {"--fresh-registry", "1", NULL};
    assert_int_equal(harness_start(&h, 0, fresh, NULL), 0);
    assert_int_equal(count_files(h.state, "registry.db.damaged-"), 1);
    assert_int_equal(harness_put(&h, "after", 3), 0);
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));

    /* A 0-byte registry.db (SQLite would take it for a new, empty one): refused. */
    fd = open(db, O_WRONLY | O_TRUNC);
    close(fd);
    st = start_status(&h, NULL);
    assert_true(harness_exited_with(st, 1));
    assert_true(harness_log_contains(&h, "exists but is empty"));
    harness_cleanup(&h);
}

/* 11. Smaller things: auth failures name the peer; an idle client does not hold the shutdown up. */
static void test_auth_log_and_quick_shutdown(void **state)
{
    (void)state;
    harness h;
    char tok[160];
    harness_init(&h);
    const char *extra[] = {"--token-file", token_file(&h, "right", tok, sizeof tok), NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    int fd = raw_connect_tcp(h.tcp);
    send_hello(fd, "wrong");
    assert_int_equal(reply_kind(fd, 3000), -PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED);
    close(fd);
    usleep(100000);
    assert_true(harness_log_contains(&h, "event=auth_fail"));
    assert_true(harness_log_contains(&h, "peer=127.0.0.1:"));
    int idle = raw_connect_unix(h.sock); /* connected, never says anything */
    usleep(100000);
    double t0 = test_now_s();
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));
    double took = test_now_s() - t0;
    print_message("shutdown with an idle client: %.3f s\n", took);
    assert_true(took < 1.5); /* shutdown_timeout_ms is 5 s */
    close(idle);
    harness_cleanup(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_peers_cannot_lock_out_unix),
        cmocka_unit_test(test_admission_is_exact),
        cmocka_unit_test(test_partial_frames_expire),
        cmocka_unit_test(test_frame_timeout_counted_as_connection),
        cmocka_unit_test(test_healthz_under_slowloris),
        cmocka_unit_test(test_signals),
        cmocka_unit_test(test_nul_in_strings),
        cmocka_unit_test(test_cancelled_streams_free_their_place),
        cmocka_unit_test(test_shard_memory_bounds),
        cmocka_unit_test(test_long_jobs_do_not_starve_others),
        cmocka_unit_test(test_damaged_registries),
        cmocka_unit_test(test_auth_log_and_quick_shutdown),
        cmocka_unit_test(test_error_linger),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
