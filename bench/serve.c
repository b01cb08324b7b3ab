/* bench/serve: load generator for permd built on libpermd — Fetch requests/s with latency percentiles, Stream ids/s. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client/permd.h"
#include "core/parse.h"
#include "core/digest.h"
#include "core/rank.h"
#include "cpu/gen.h"

static const char usage[] =
    "usage: serve fetch  --socket PATH --dataset NAME [--clients N] [--count C] [--world W] [--seconds S]\n"
    "                    [--offsets next|random]\n"
    "       serve stream --socket PATH --dataset NAME [--batch B] [--seconds S] [--transport ring|socket]\n"
    "                    [--read sum|last]\n"
    "       serve gen    [--count C] [--seconds S]     (one thread of the daemon's CPU generator, no daemon)\n"
    "       serve pipe   [--batch B] [--seconds S]     (a bare Unix socket moving B u32 per write, no daemon)\n"
    "\n"
    "fetch: N threads, one connection each, each Fetch asks rank 0 of W (default 8) for C ids\n"
    "       at a fresh offset; prints requests/s and p50/p99 latency (after 0.5 s warm-up).\n"
    "       --offsets next (default): each client reads its slice in order, as a trainer does (permd's\n"
    "       readahead may have the ids ready); random: a random piece each time (no readahead helps).\n"
    "       NAME may be a mixture's (its epochs have its length in positions).\n"
    "       --digest-load K: meanwhile K more connections each digest 2^28 ids at a time, again and\n"
    "       again (long jobs on the worker pool: what the Fetch latency is under them).\n"
    "stream: one Stream of rank 0 of 1 in batches of B, every id read (summed); prints ids/s.\n"
    "       ring (default, libpermd's choice on a Unix socket): batches in shared memory;\n"
    "       socket: batches through the socket. --read last: one id a batch (the transport alone).\n"
    "Output is one line of key=value pairs (bench/serve.sh parses it).\n";

typedef struct options {
    const char *cmd, *socket, *tcp, *dataset, *transport;
    int read_all; /* --read sum (every id, default) | last (one id a batch: the transport alone) */
    int random_offsets; /* --offsets random: each Fetch at a random piece, beyond any readahead */
    uint64_t clients, count, batch, world, digest_load;
    double seconds;
} options;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int connect_client(const options *o, permd_client **c)
{
    int rc = o->tcp ? permd_connect_tcp(o->tcp, NULL, c) : permd_connect_unix(o->socket, c);
    if (rc)
        fprintf(stderr, "serve: %s\n", permd_last_error(NULL));
    return rc;
}

/* ---- fetch ---- */

/* The positions of an epoch of `name`: a dataset's size, else (one namespace) a mixture's length. */
static int epoch_positions(permd_client *c, const char *name, uint64_t *n)
{
    permd_dataset d;
    int rc = permd_get_dataset(c, name, &d);
    if (rc == 0) {
        *n = d.size;
        return 0;
    }
    permd_mixture_def *m;
    if (rc == PERMD_ENOTFOUND && (rc = permd_get_mixture(c, name, &m)) == 0) {
        *n = m->length;
        permd_mixture_def_free(m);
        return 0;
    }
    if (rc == PERMD_ENOTFOUND)
        fprintf(stderr, "serve: no dataset or mixture named '%s'\n", name);
    else
        fprintf(stderr, "serve: %s\n", permd_last_error(c));
    return rc;
}

typedef struct worker {
    const options *o;
    int index;
    double start, warm, stop;
    uint64_t n, cap;
    double *lat; /* seconds per request after the warm-up */
    int failed;
} worker;

static void *fetch_worker(void *arg)
{
    worker *w = arg;
    const options *o = w->o;
    permd_client *c;
    if (connect_client(o, &c)) {
        w->failed = 1;
        return NULL;
    }
    uint64_t n; /* positions per epoch: the dataset's size, or the mixture's length */
    if (epoch_positions(c, o->dataset, &n)) {
        w->failed = 1;
        permd_close(c);
        return NULL;
    }
    uint32_t *ids = malloc(o->count * sizeof *ids);
    permd_slice s = {.dataset = o->dataset, .seed = 1234, .epoch = (uint64_t)w->index, .world = (uint32_t)o->world,
                     .rank = 0, .mode = PERMD_MODE_PAD};
    uint64_t span = n / o->world / o->count; /* distinct offsets before wrapping */
    for (uint64_t i = 0;; i++) {
        double t0 = now_s();
        if (t0 >= w->stop)
            break;
        uint64_t got;
        /* random: splitmix64's finalizer of (client, request), a fixed sequence per client */
        uint64_t piece = o->random_offsets ? pd_digest_mix(((uint64_t)w->index << 40) ^ i) : i;
        s.offset = (piece % (span ? span : 1)) * o->count * o->world;
        if (permd_fetch_u32(c, &s, o->count, ids, &got, NULL) || got != o->count) {
            fprintf(stderr, "serve: fetch: %s\n", permd_last_error(c));
            w->failed = 1;
            break;
        }
        double t1 = now_s();
        if (t0 < w->warm)
            continue;
        if (w->n == w->cap) {
            w->cap = w->cap ? w->cap * 2 : 1 << 16;
            w->lat = realloc(w->lat, w->cap * sizeof *w->lat);
        }
        w->lat[w->n++] = t1 - t0;
    }
    free(ids);
    permd_close(c);
    return NULL;
}

/* Long jobs beside the Fetches: whole-rank digests of 2^28 ids (rank r of 16 over 2^32), until stop. */
static void *digest_worker(void *arg)
{
    worker *w = arg;
    permd_client *c;
    if (connect_client(w->o, &c)) {
        w->failed = 1;
        return NULL;
    }
    for (uint64_t e = 0; now_s() < w->stop; e++) {
        permd_slice s = {.dataset = w->o->dataset, .seed = 77, .epoch = e, .world = 16,
                         .rank = (uint32_t)w->index % 16, .mode = PERMD_MODE_PAD};
        permd_digest d;
        if (permd_digest_slice(c, &s, &d)) {
            fprintf(stderr, "serve: digest: %s\n", permd_last_error(c));
            w->failed = 1;
            break;
        }
        w->n++;
    }
    permd_close(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run_fetch(const options *o)
{
    uint64_t nt = o->clients + o->digest_load;
    worker *w = calloc(nt, sizeof *w);
    pthread_t *th = calloc(nt, sizeof *th);
    double start = now_s();
    for (uint64_t i = 0; i < nt; i++) {
        w[i] = (worker){.o = o, .index = (int)i, .start = start, .warm = start + 0.5, .stop = start + 0.5 + o->seconds};
        pthread_create(&th[i], NULL, i < o->clients ? fetch_worker : digest_worker, &w[i]);
    }
    uint64_t total = 0, digests = 0;
    int failed = 0;
    for (uint64_t i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        if (i < o->clients)
            total += w[i].n;
        else
            digests += w[i].n;
        failed |= w[i].failed;
    }
    if (failed || total == 0) {
        for (uint64_t i = 0; i < nt; i++)
            free(w[i].lat);
        free(w);
        free(th);
        return 1;
    }
    double *all = malloc(total * sizeof *all);
    uint64_t k = 0;
    for (uint64_t i = 0; i < o->clients; i++) {
        memcpy(all + k, w[i].lat, w[i].n * sizeof *all);
        k += w[i].n;
        free(w[i].lat);
    }
    qsort(all, total, sizeof *all, cmp_double);
    printf("mode=fetch clients=%llu count=%llu world=%llu requests=%llu seconds=%.2f rps=%.0f p50_us=%.1f "
           "p99_us=%.1f digest_load=%llu digests=%llu offsets=%s\n",
           (unsigned long long)o->clients, (unsigned long long)o->count, (unsigned long long)o->world,
           (unsigned long long)total, o->seconds, (double)total / o->seconds, all[total / 2] * 1e6,
           all[(uint64_t)((double)total * 0.99)] * 1e6, (unsigned long long)o->digest_load,
           (unsigned long long)digests, o->random_offsets ? "random" : "next");
    free(all);
    free(w);
    free(th);
    return 0;
}

/* ---- stream ---- */

static int run_stream(const options *o)
{
    permd_client *c;
    permd_stream *st;
    if (connect_client(o, &c))
        return 1;
    permd_slice s = {.dataset = o->dataset, .seed = 99, .world = 1, .rank = 0, .mode = PERMD_MODE_EXACT};
    int want_ring = strcmp(o->transport, "socket") != 0;
    if (permd_stream_open_ex(c, &s, o->batch, 0, want_ring ? 0 : PERMD_STREAM_SOCKET, &st)) {
        fprintf(stderr, "serve: stream: %s\n", permd_last_error(c));
        return 1;
    }
    if (permd_stream_shared(st) != want_ring) { /* a ring row that measured the socket would mislead */
        fprintf(stderr, "serve: asked for the %s transport, permd gave the other\n", o->transport);
        return 1;
    }
    uint64_t ids_total = 0, sink = 0;
    double start = now_s(), t = start;
    while (t - start < o->seconds) {
        const void *ids;
        uint32_t width;
        uint64_t n;
        if (permd_stream_next(st, &ids, &width, &n)) {
            fprintf(stderr, "serve: stream failed: %s\n", permd_last_error(c));
            return 1;
        }
        if (n == 0) { /* the epoch is over (2^32 ids go by in seconds): on to the next, as a trainer does */
            permd_stream_close(st);
            s.epoch++;
            if (permd_stream_open_ex(c, &s, o->batch, 0, want_ring ? 0 : PERMD_STREAM_SOCKET, &st)) {
                fprintf(stderr, "serve: stream (epoch %llu): %s\n", (unsigned long long)s.epoch,
                        permd_last_error(c));
                return 1;
            }
            continue;
        }
        const uint32_t *v = ids; /* read every id, as a consumer would */
        uint32_t acc = v[n - 1];
        for (uint64_t i = 0; o->read_all && i < n; i++)
            acc += v[i];
        sink += acc;
        ids_total += n;
        t = now_s();
    }
    permd_stream_close(st);
    permd_close(c);
    printf("mode=stream transport=%s read=%s batch=%llu ids=%llu seconds=%.2f ids_per_s=%.0f sink=%llu\n",
           want_ring ? "ring" : "socket", o->read_all ? "sum" : "last", (unsigned long long)o->batch, (unsigned long long)ids_total, t - start, (double)ids_total / (t - start), (unsigned long long)(sink & 1));
    return 0;
}

/* ---- pipe: the socket alone, the ceiling of a stream through it ---- */

typedef struct pipe_writer {
    int fd;
    size_t bytes;
} pipe_writer;

static void *pipe_write(void *arg)
{
    const pipe_writer *w = arg;
    uint8_t *buf = malloc(w->bytes);
    if (buf) {
        memset(buf, 1, w->bytes);
        for (;;) {
            size_t off = 0;
            while (off < w->bytes) {
                ssize_t n = send(w->fd, buf + off, w->bytes - off, MSG_NOSIGNAL);
                if (n <= 0)
                    goto out; /* the reader closed: done */
                off += (size_t)n;
            }
        }
    }
out:
    free(buf);
    return NULL;
}

/* What one Unix stream socket moves with this machine's defaults, a reader
 * summing every u32 as the stream reader does: nothing is generated. */
static int run_pipe(const options *o)
{
    int sv[2];
    pthread_t t;
    pipe_writer w = {.bytes = o->batch * 4};
    uint32_t *buf = malloc(w.bytes);
    if (!buf || socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
        free(buf);
        return 1;
    }
    w.fd = sv[0];
    if (pthread_create(&t, NULL, pipe_write, &w)) {
        free(buf);
        return 1;
    }
    uint64_t bytes = 0;
    uint32_t acc = 0;
    double start = now_s(), t_now = start;
    while (t_now - start < o->seconds) {
        size_t off = 0; /* one whole batch, as a frame reader would */
        while (off < w.bytes) {
            ssize_t n = read(sv[1], (uint8_t *)buf + off, w.bytes - off);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        for (size_t i = 0; i < off / 4; i++)
            acc += buf[i];
        bytes += off;
        t_now = now_s();
    }
    close(sv[1]);
    pthread_join(t, NULL);
    close(sv[0]);
    free(buf);
    printf("mode=pipe batch=%llu seconds=%.2f ids_per_s=%.0f sink=%u\n", (unsigned long long)o->batch,
           t_now - start, (double)bytes / 4 / (t_now - start), acc & 1);
    return 0;
}

/* ---- gen: the generator alone, for context ---- */

/* The daemon's CPU backend on one thread (best ISA here), so the serve rows can be read against it. */
static int run_gen(const options *o)
{
    pd_perm p;
    pd_gen g;
    pd_slice s = {8, 0, PD_MODE_PAD, 0};
    uint32_t *ids = malloc(o->count * sizeof *ids);
    uint64_t n = UINT64_C(1) << 30, got, total = 0;
    if (!ids || pd_gen_init(&g, PD_ISA_AUTO)) {
        free(ids);
        return 1;
    }
    pd_perm_init(&p, 1234, 0, PD_STREAM_SAMPLES, n);
    double start = now_s(), t = start;
    while (t - start < o->seconds) {
        pd_gen_slice_fill_u32(&g, &p, &s, o->count, ids, &got);
        s.offset = (s.offset + got * 8) % (n / 2);
        total += got;
        t = now_s();
    }
    printf("mode=gen isa=%s count=%llu ids=%llu seconds=%.2f ids_per_s=%.0f ns_per_id=%.1f\n", pd_isa_name(g.isa),
           (unsigned long long)o->count,
           (unsigned long long)total, t - start, (double)total / (t - start), (t - start) * 1e9 / (double)total);
    free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    options o = {.clients = 1, .count = 1024, .batch = 65536, .world = 8, .seconds = 5, .transport = "ring",
                 .read_all = 1};
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    o.cmd = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        if (!v) {
            fprintf(stderr, "serve: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--socket"))
            o.socket = v;
        else if (!strcmp(a, "--tcp"))
            o.tcp = v;
        else if (!strcmp(a, "--dataset"))
            o.dataset = v;
        else if (!strcmp(a, "--transport")) {
            if (strcmp(v, "ring") && strcmp(v, "socket")) {
                fprintf(stderr, "serve: --transport is ring or socket, not '%s'\n", v);
                return 2;
            }
            o.transport = v;
        }
        else if (!strcmp(a, "--read")) {
            if (strcmp(v, "sum") && strcmp(v, "last")) {
                fprintf(stderr, "serve: --read is sum or last, not '%s'\n", v);
                return 2;
            }
            o.read_all = !strcmp(v, "sum");
        } else if (!strcmp(a, "--offsets")) {
            if (strcmp(v, "next") && strcmp(v, "random")) {
                fprintf(stderr, "serve: --offsets is next or random, not '%s'\n", v);
                return 2;
            }
            o.random_offsets = !strcmp(v, "random");
        } else if (!strcmp(a, "--seconds"))
            o.seconds = atof(v);
        else if (pd_parse_u64_range(v, 1, UINT32_MAX, &x)) {
            fprintf(stderr, "serve: %s: '%s' is not a positive integer\n", a, v);
            return 2;
        } else if (!strcmp(a, "--clients"))
            o.clients = x;
        else if (!strcmp(a, "--digest-load"))
            o.digest_load = x;
        else if (!strcmp(a, "--count"))
            o.count = x;
        else if (!strcmp(a, "--batch"))
            o.batch = x;
        else if (!strcmp(a, "--world"))
            o.world = x;
        else {
            fprintf(stderr, "serve: unknown option %s\n%s", a, usage);
            return 2;
        }
    }
    if (o.seconds <= 0) {
        fprintf(stderr, "serve: --seconds must be positive\n");
        return 2;
    }
    if (!strcmp(o.cmd, "gen"))
        return run_gen(&o);
    if (!strcmp(o.cmd, "pipe"))
        return run_pipe(&o);
    if ((!o.socket && !o.tcp) || !o.dataset) {
        fprintf(stderr, "serve: --socket (or --tcp) and --dataset are required\n%s", usage);
        return 2;
    }
    if (!strcmp(o.cmd, "fetch"))
        return run_fetch(&o);
    if (!strcmp(o.cmd, "stream"))
        return run_stream(&o);
    fprintf(stderr, "serve: unknown mode '%s'\n%s", o.cmd, usage);
    return 2;
}
