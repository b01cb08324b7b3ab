/* Load generator: N concurrent clients on one libuv loop, each fetching and verifying ids until a deadline; prints latency percentiles and permd's RSS. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "core/rank.h"
#include "proto/endpoint.h"
#include "proto/frame.h"

/*
 * usage: permd_load (--unix PATH | --tcp HOST:PORT) [--clients N] [--seconds S] [--count K]
 *                   [--dataset NAME --size N] [--pid PID]
 *
 * Every client says Hello, then Fetches K ids of its own (epoch, rank) again and again, checking
 * every reply against the spec computed here, until the deadline; an observer connection asks for
 * Stats every 200 ms to see how many connections permd holds at once. Any error reply, unexpected
 * close, wrong id or failed connection is an error; the exit status is 1 when there was one, or
 * when the clients were never all connected at the same time.
 */

#define WAVE 50          /* connections started per tick */
#define WAVE_MS 5
#define MAX_RETRIES 200  /* a full listen backlog (EAGAIN, ECONNREFUSED) is retried */
#define WORLD 8

typedef struct client {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_pipe_t pipe;
        uv_tcp_t tcp;
    } h;
    uv_connect_t creq;
    uv_write_t wreq;
    uv_timer_t retry;
    pd_frame_reader in;
    uint8_t wbuf[256];
    unsigned idx;
    int observer, connected, done, retries;
    uint64_t id, offset, sent_ns;
    pd_perm perm;
} client;

static struct {
    const char *unix_path, *tcp, *dataset;
    unsigned clients;
    double seconds;
    uint64_t count, size, epoch_len;
    int pid;
    uv_loop_t *loop;
    uint64_t deadline_ns;
    client *all;
    unsigned started, connected_now, connected_peak, finished;
    uint64_t requests, errors, retries, ids, server_peak_conns;
    uint32_t *lat_us;
    size_t nlat, lat_cap;
    uv_timer_t wave;
    char first_error[256];
} L;

static void error_once(client *c, const char *fmt, const char *detail)
{
    L.errors++;
    if (!L.first_error[0])
        snprintf(L.first_error, sizeof L.first_error, "client %u: %s%s", c->idx, fmt, detail ? detail : "");
}

static void on_closed(uv_handle_t *h)
{
    client *c = h->data;
    pd_frame_reader_free(&c->in);
    if (!c->done) {
        c->done = 1;
        L.finished++;
    }
}

static void client_close(client *c)
{
    if (uv_is_closing(&c->h.handle))
        return;
    if (c->connected) {
        c->connected = 0;
        L.connected_now--;
    }
    uv_close(&c->h.handle, on_closed);
}

static void on_written(uv_write_t *w, int status)
{
    client *c = w->data;
    if (status < 0 && !uv_is_closing(&c->h.handle)) {
        error_once(c, "write failed: ", uv_strerror(status));
        client_close(c);
    }
}

static void send_env(client *c, pd_envelope *env)
{
    size_t n = pd_frame_pack(env, c->wbuf);
    uv_buf_t b = uv_buf_init((char *)c->wbuf, (unsigned)n);
    c->wreq.data = c;
    c->sent_ns = uv_hrtime();
    if (uv_write(&c->wreq, &c->h.stream, &b, 1, on_written)) {
        error_once(c, "uv_write refused", NULL);
        client_close(c);
    }
}

static void send_fetch(client *c)
{
    Permd__V1__Slice s = PERMD__V1__SLICE__INIT;
    s.dataset = (char *)L.dataset;
    s.seed = 1234;
    s.epoch = c->idx;
    s.world = WORLD;
    s.rank = c->idx % WORLD;
    s.mode = PERMD__V1__MODE__MODE_PAD;
    s.offset = c->offset;
    Permd__V1__Fetch f = PERMD__V1__FETCH__INIT;
    f.slice = &s;
    f.count = L.count;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = ++c->id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_FETCH;
    env.fetch = &f;
    send_env(c, &env);
}

static void send_stats(client *c)
{
    Permd__V1__Stats st = PERMD__V1__STATS__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = ++c->id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
    env.stats = &st;
    send_env(c, &env);
}

static void on_stats_timer(uv_timer_t *t)
{
    client *c = t->data;
    if (!uv_is_closing(&c->h.handle))
        send_stats(c);
}

static void record_latency(uint64_t ns)
{
    if (L.nlat == L.lat_cap) {
        L.lat_cap = L.lat_cap ? L.lat_cap * 2 : 1 << 16;
        uint32_t *p = realloc(L.lat_us, L.lat_cap * sizeof *p);
        if (!p) {
            fprintf(stderr, "permd_load: out of memory\n");
            exit(2);
        }
        L.lat_us = p;
    }
    L.lat_us[L.nlat++] = (uint32_t)(ns / 1000 > UINT32_MAX ? UINT32_MAX : ns / 1000);
}

/* The fetch reply must hold exactly the spec's ids for this client's slice. */
static int verify_fetch(client *c, const pd_envelope *env)
{
    const Permd__V1__FetchReply *r = env->fetch_reply;
    uint32_t want[4096];
    uint64_t got;
    pd_slice s = {WORLD, c->idx % WORLD, PD_MODE_PAD, c->offset};
    if (env->id != c->id || r->id_width != 4 || r->count != L.count || r->ids.len != L.count * 4 ||
        pd_slice_fill_u32(&c->perm, &s, L.count, want, &got) || got != L.count)
        return -1;
    for (uint64_t i = 0; i < L.count; i++)
        if (pd_load_le32(r->ids.data + 4 * i) != want[i])
            return -1;
    c->offset = r->next_offset + L.count * WORLD <= L.epoch_len ? r->next_offset : 0;
    return 0;
}

static void on_frame(client *c, const uint8_t *payload, uint32_t len)
{
    pd_envelope *env;
    if (pd_frame_unpack(payload, len, NULL, &env)) {
        error_once(c, "a reply that is not an Envelope", NULL);
        client_close(c);
        return;
    }
    uint64_t now = uv_hrtime();
    switch (env->body_case) {
    case PERMD__V1__ENVELOPE__BODY_HELLO_REPLY:
        if (c->observer)
            send_stats(c);
        else
            send_fetch(c);
        break;
    case PERMD__V1__ENVELOPE__BODY_FETCH_REPLY:
        L.requests++;
        record_latency(now - c->sent_ns);
        if (verify_fetch(c, env)) {
            error_once(c, "wrong ids in a reply", NULL);
            client_close(c);
            break;
        }
        L.ids += L.count;
        if (now < L.deadline_ns)
            send_fetch(c);
        else
            client_close(c);
        break;
    case PERMD__V1__ENVELOPE__BODY_STATS_REPLY:
        if (env->stats_reply->connections > L.server_peak_conns)
            L.server_peak_conns = env->stats_reply->connections;
        if (now < L.deadline_ns)
            uv_timer_start(&c->retry, on_stats_timer, 200, 0);
        else
            client_close(c);
        break;
    case PERMD__V1__ENVELOPE__BODY_ERROR:
        error_once(c, "error reply: ", env->error->message);
        client_close(c);
        break;
    default:
        error_once(c, "an unexpected reply", NULL);
        client_close(c);
    }
    protobuf_c_message_free_unpacked(&env->base, NULL);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    client *c = h->data;
    uint8_t *p;
    size_t len;
    (void)suggested;
    if (pd_frame_reader_space(&c->in, &p, &len))
        *buf = uv_buf_init(NULL, 0);
    else
        *buf = uv_buf_init((char *)p, (unsigned)(len > (1u << 20) ? 1u << 20 : len));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    client *c = st->data;
    (void)buf;
    if (nread < 0) {
        if (!uv_is_closing(&c->h.handle)) {
            error_once(c, "connection lost: ", uv_strerror((int)nread));
            client_close(c);
        }
        return;
    }
    pd_frame_reader_commit(&c->in, (size_t)nread);
    const uint8_t *payload;
    uint32_t len;
    int rc;
    while (!uv_is_closing(&c->h.handle) && (rc = pd_frame_reader_next(&c->in, &payload, &len)) != 0) {
        if (rc < 0) {
            error_once(c, "an oversized frame", NULL);
            client_close(c);
            return;
        }
        on_frame(c, payload, len);
    }
}

static void client_connect(client *c);

static void on_retry(uv_timer_t *t)
{
    client_connect(t->data);
}

static void on_connect(uv_connect_t *req, int status)
{
    client *c = req->data;
    if (status == UV_EAGAIN || status == UV_ECONNREFUSED || status == UV_ETIMEDOUT) {
        /* the listen backlog was full: a fresh handle, a little later */
        if (++c->retries > MAX_RETRIES) {
            error_once(c, "could not connect: ", uv_strerror(status));
            uv_close(&c->h.handle, on_closed);
            return;
        }
        L.retries++;
        uv_close(&c->h.handle, NULL);
        uv_timer_start(&c->retry, on_retry, 20, 0);
        return;
    }
    if (status < 0) {
        error_once(c, "connect failed: ", uv_strerror(status));
        uv_close(&c->h.handle, on_closed);
        return;
    }
    c->connected = 1;
    if (++L.connected_now > L.connected_peak)
        L.connected_peak = L.connected_now;
    uv_read_start(&c->h.stream, on_alloc, on_read);
    Permd__V1__Hello hello = PERMD__V1__HELLO__INIT;
    hello.protocol_version = PD_PROTOCOL_VERSION;
    hello.client_name = "permd_load";
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = ++c->id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    send_env(c, &env);
}

static void client_connect(client *c)
{
    c->creq.data = c;
    c->h.handle.data = c;
    if (L.unix_path) {
        uv_pipe_init(L.loop, &c->h.pipe, 0);
        uv_pipe_connect(&c->creq, &c->h.pipe, L.unix_path, on_connect);
        return;
    }
    char host[64];
    uint16_t port;
    struct sockaddr_in sa;
    pd_endpoint_parse_hostport(L.tcp, host, sizeof host, &port);
    uv_ip4_addr(host, port, &sa);
    uv_tcp_init(L.loop, &c->h.tcp);
    uv_tcp_nodelay(&c->h.tcp, 1);
    int rc = uv_tcp_connect(&c->creq, &c->h.tcp, (struct sockaddr *)&sa, on_connect);
    if (rc)
        on_connect(&c->creq, rc);
}

static void on_wave(uv_timer_t *t)
{
    for (unsigned i = 0; i < WAVE && L.started <= L.clients; i++) {
        client *c = &L.all[L.started];
        c->idx = L.started;
        c->observer = L.started == L.clients; /* the last one watches permd's connection count */
        uv_timer_init(L.loop, &c->retry);
        c->retry.data = c;
        pd_frame_reader_init(&c->in, 4096, 64u << 20);
        pd_perm_init(&c->perm, 1234, c->idx, PD_STREAM_SAMPLES, L.size);
        client_connect(c);
        L.started++;
    }
    if (L.started > L.clients)
        uv_timer_stop(t);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t pct(double q)
{
    if (!L.nlat)
        return 0;
    size_t i = (size_t)(q * (double)(L.nlat - 1) + 0.5);
    return L.lat_us[i];
}

static long proc_status_kb(const char *key)
{
    char path[64], line[256];
    long kb = -1;
    size_t klen = strlen(key);
    snprintf(path, sizeof path, "/proc/%d/status", L.pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':')
            kb = strtol(line + klen + 1, NULL, 10);
    fclose(f);
    return kb;
}

static int usage(void)
{
    fprintf(stderr, "usage: permd_load (--unix PATH | --tcp HOST:PORT) [--clients N] [--seconds S] [--count K] "
                    "[--dataset NAME --size N] [--pid PID]\n");
    return 2;
}

int main(int argc, char **argv)
{
    L.clients = 1000;
    L.seconds = 10;
    L.count = 64;
    L.dataset = "load";
    L.size = 10000000;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--unix"))
            L.unix_path = v;
        else if (!strcmp(k, "--tcp"))
            L.tcp = v;
        else if (!strcmp(k, "--clients"))
            L.clients = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(k, "--seconds"))
            L.seconds = strtod(v, NULL);
        else if (!strcmp(k, "--count"))
            L.count = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--dataset"))
            L.dataset = v;
        else if (!strcmp(k, "--size"))
            L.size = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--pid"))
            L.pid = atoi(v);
        else
            return usage();
    }
    if (argc % 2 == 0 || !!L.unix_path == !!L.tcp || !L.clients || L.count == 0 || L.count > 4096 ||
        L.size > UINT32_MAX || L.size < L.count * WORLD)
        return usage();
    pd_epoch_length(L.size, WORLD, PD_MODE_PAD, &L.epoch_len);

    L.loop = uv_default_loop();
    L.all = calloc(L.clients + 1, sizeof *L.all);
    if (!L.all)
        return 2;
    uint64_t t0 = uv_hrtime();
    L.deadline_ns = t0 + (uint64_t)(L.seconds * 1e9);
    uv_timer_init(L.loop, &L.wave);
    uv_timer_start(&L.wave, on_wave, 0, WAVE_MS);
    uv_run(L.loop, UV_RUN_DEFAULT);
    double elapsed = (double)(uv_hrtime() - t0) / 1e9;
    for (unsigned i = 0; i <= L.clients; i++)
        uv_close((uv_handle_t *)&L.all[i].retry, NULL);
    uv_run(L.loop, UV_RUN_DEFAULT);

    qsort(L.lat_us, L.nlat, sizeof *L.lat_us, cmp_u32);
    printf("transport=%s clients=%u seconds=%.1f requests=%llu errors=%llu ids=%llu rps=%.0f p50_us=%u p90_us=%u "
           "p99_us=%u p999_us=%u max_us=%u peak_clients_connected=%u peak_server_connections=%llu "
           "connect_retries=%llu rss_kb=%ld hwm_kb=%ld\n",
           L.unix_path ? "unix" : "tcp", L.clients, elapsed, (unsigned long long)L.requests,
           (unsigned long long)L.errors, (unsigned long long)L.ids, (double)L.requests / elapsed, pct(0.50),
           pct(0.90), pct(0.99), pct(0.999), L.nlat ? L.lat_us[L.nlat - 1] : 0, L.connected_peak,
           (unsigned long long)L.server_peak_conns, (unsigned long long)L.retries,
           L.pid ? proc_status_kb("VmRSS") : -1L, L.pid ? proc_status_kb("VmHWM") : -1L);
    if (L.first_error[0])
        fprintf(stderr, "permd_load: %llu errors; first: %s\n", (unsigned long long)L.errors, L.first_error);
    int ok = L.errors == 0 && L.connected_peak >= L.clients + 1 && L.finished == L.clients + 1 &&
             L.server_peak_conns >= L.clients;
    if (!ok && !L.errors)
        fprintf(stderr, "permd_load: the clients were never all connected at once (peak %u of %u, server saw %llu)\n",
                L.connected_peak, L.clients + 1, (unsigned long long)L.server_peak_conns);
    uv_loop_close(L.loop);
    free(L.all);
    free(L.lat_us);
    return ok ? 0 : 1;
}
