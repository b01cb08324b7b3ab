/* libFuzzer target: arbitrary bytes as one client's whole connection to an in-process permd (decode, dispatch, every handler's validation). */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "core/error.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/registry.h"
#include "daemon/server.h"
#include "proto/frame.h"

/*
 * Input: the first byte chooses the mode.
 *  - even: the remaining bytes are written to the socket as they are (framing, prefixes, garbage);
 *  - odd: they are records [sel][len lo][len hi][body], each sent as a well-framed Envelope whose
 *    body field is 10 + (sel & 31) (requests, unknown and server-only fields) and whose id is
 *    sel >> 5, so the fuzzer reaches every handler's validation without rediscovering framing.
 * Oracles: no crash or sanitizer report; every byte permd sends is a well-formed frame holding an
 * Envelope; every Error carries a code and a message; the connection ends within 10 s (no hang).
 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static pd_server *srv;
static uv_loop_t loop;
static pd_config cfg;
static char sock_path[128];

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_server: %s\n", what);
    abort();
}

static void set(const char *key, const char *value)
{
    char err[256];
    if (pd_config_set(&cfg, key, value, err, sizeof err))
        fail(err);
}

static void cleanup_dir(void)
{
    char cmd[256];
    pd_server_stop(srv);
    uv_run(&loop, UV_RUN_DEFAULT);
    pd_server_free(srv);
    uv_loop_close(&loop);
    pd_config_free(&cfg);
    snprintf(cmd, sizeof cmd, "rm -rf '%.*s'", (int)(strrchr(sock_path, '/') - sock_path), sock_path);
    if (system(cmd) != 0)
        fprintf(stderr, "fuzz_server: could not remove the temporary directory\n");
}

static void init_once(void)
{
    static char dir[64];
    char err[256], state[128];
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp"; /* SQLite fsyncs cost nothing there */
    snprintf(dir, sizeof dir, "%s/permd-fuzz-XXXXXX", base);
    if (!mkdtemp(dir))
        fail("mkdtemp");
    snprintf(sock_path, sizeof sock_path, "%s/permd.sock", dir);
    snprintf(state, sizeof state, "%s/state", dir);
    setenv("UV_THREADPOOL_SIZE", "2", 1);
    if (pd_config_init(&cfg))
        fail("config");
    set("socket", sock_path);
    set("state_dir", state);
    set("log_level", "error");
    set("metrics", "");
    set("gpu", "off");
    set("cpu_threads", "1");
    set("loops", "1"); /* one loop: the harness drives it with uv_run and reads its connections */
    set("max_frame", "65536");
    set("max_count", "4096");
    set("max_digest", "65536"); /* a Digest of the wide dataset would take hours */
    set("output_cap", "262144");
    set("max_streams", "4");
    set("max_credits", "8");
    set("inline_ids", "1024");
    if (pd_config_add_dataset(&cfg, "small", "1000", err, sizeof err) ||
        pd_config_add_dataset(&cfg, "wide", "1099511627776", err, sizeof err) ||
        pd_config_add_dataset(&cfg, "one", "1", err, sizeof err))
        fail(err);
    pd_log_set_level(PD_LOG_ERROR);
    if (uv_loop_init(&loop) || pd_server_create(&loop, &cfg, 2, &srv))
        fail("server init");
    atexit(cleanup_dir);
}

/* The bytes the client sends: raw, or records turned into frames. */
static uint8_t *client_bytes(const uint8_t *data, size_t size, size_t *out_len)
{
    if (size == 0 || !(data[0] & 1)) {
        uint8_t *b = malloc(size ? size : 1);
        if (b && size > 1)
            memcpy(b, data + 1, size - 1);
        *out_len = size ? size - 1 : 0;
        return b;
    }
    uint8_t *b = malloc(size * 4 + 64), *p = b; /* a 3-byte record becomes at most an 11-byte frame */
    if (!b)
        return NULL;
    for (size_t i = 1; i + 3 <= size;) {
        uint8_t sel = data[i];
        size_t len = (size_t)data[i + 1] | (size_t)data[i + 2] << 8;
        i += 3;
        if (len > size - i)
            len = size - i;
        /* Envelope{id = sel >> 5 (field 1, varint), field 10 + (sel & 31) = bytes} */
        uint8_t hdr[16];
        size_t h = 0;
        hdr[h++] = 0x08;
        hdr[h++] = (uint8_t)(sel >> 5);
        uint32_t tag = (uint32_t)(10 + (sel & 31)) << 3 | 2;
        while (tag >= 0x80) {
            hdr[h++] = (uint8_t)(tag | 0x80);
            tag >>= 7;
        }
        hdr[h++] = (uint8_t)tag;
        size_t l = len;
        while (l >= 0x80) {
            hdr[h++] = (uint8_t)(l | 0x80);
            l >>= 7;
        }
        hdr[h++] = (uint8_t)l;
        pd_store_le32(p, (uint32_t)(h + len));
        memcpy(p + 4, hdr, h);
        memcpy(p + 4 + h, data + i, len);
        p += 4 + h + len;
        i += len;
    }
    *out_len = (size_t)(p - b);
    return b;
}

/* Check every complete frame permd sent; returns the bytes consumed. */
static size_t check_output(const uint8_t *buf, size_t len)
{
    size_t at = 0;
    while (len - at >= 4) {
        uint32_t n = pd_load_le32(buf + at);
        if (len - at - 4 < n)
            break;
        pd_envelope *env;
        if (pd_frame_unpack(buf + at + 4, n, NULL, &env))
            fail("permd sent a frame that is not an Envelope");
        if (env->body_case == PERMD__V1__ENVELOPE__BODY_ERROR &&
            (env->error->code == PERMD__V1__ERROR_CODE__ERROR_CODE_UNSPECIFIED || !env->error->message[0]))
            fail("an Error without a code or a message");
        protobuf_c_message_free_unpacked(&env->base, NULL);
        at += 4 + n;
    }
    return at;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Forget the datasets this input stored, so every input starts alike. */
static void reset_registry(void)
{
    pd_dataset *all;
    size_t n;
    if (pd_registry_list(pd_server_registry(srv), &all, &n))
        fail("registry list");
    for (size_t i = 0; i < n; i++)
        if (!all[i].from_config && pd_registry_delete(pd_server_registry(srv), all[i].name, NULL, 0))
            fail("registry delete");
    free(all);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        init_once();
        ready = 1;
    }
    size_t len;
    uint8_t *in = client_bytes(data, size, &len);
    if (!in)
        return 0;

    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", sock_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa))
        fail("connect");

    size_t out_cap = 1 << 16, out_len = 0, sent = 0;
    uint8_t *out = malloc(out_cap);
    int shut = 0, eof = 0;
    uint64_t deadline = now_ms() + 10000;
    for (;;) {
        pd_stats_view v;
        pd_server_totals(srv, &v);
        if (eof && !v.stats.connections && !v.jobs)
            break;
        if (now_ms() > deadline)
            fail("the connection did not end within 10 s");
        if (sent < len) {
            ssize_t w = send(fd, in + sent, len - sent, MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                sent = len; /* permd closed on us (after an error): stop writing */
        }
        if (sent == len && !shut) {
            shutdown(fd, SHUT_WR);
            shut = 1;
        }
        uv_run(&loop, UV_RUN_NOWAIT);
        while (!eof) {
            if (out_cap - out_len < 4096) {
                out_cap *= 2;
                uint8_t *p = realloc(out, out_cap);
                if (!p)
                    fail("out of memory");
                out = p;
            }
            ssize_t r = recv(fd, out + out_len, out_cap - out_len, 0);
            if (r > 0) {
                out_len += (size_t)r;
                size_t used = check_output(out, out_len);
                memmove(out, out + used, out_len - used);
                out_len -= used;
            } else if (r == 0 || (r < 0 && errno == ECONNRESET)) {
                eof = 1;
            } else {
                break;
            }
        }
        if (!eof || v.jobs) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            poll(&pf, 1, v.jobs ? 1 : 0);
        }
    }
    if (out_len)
        fail("permd's output ended inside a frame");
    close(fd);
    free(out);
    free(in);
    reset_registry();
    return 0;
}
