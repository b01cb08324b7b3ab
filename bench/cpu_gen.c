/* Benchmark: M indices/s of permd's CPU generators (core scalar, each SIMD ISA and walk, the pool) and a C Fisher–Yates, one TSV line per case. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/perm.h"
#include "cpu/gen.h"

#define MAX_SIZES 16

typedef struct opts {
    uint64_t sizes[MAX_SIZES];
    int nsizes;
    int reps;
    unsigned threads; /* pool size; 0 = all online CPUs */
    const char *only; /* run cases whose name contains this */
    int u64;          /* also measure u64 output */
} opts;

/* One case: fill out[0..n) with a permutation of [0, n). */
typedef struct bench_case {
    char name[48];
    int (*run)(const struct bench_case *c, uint64_t n, void *out);
    pd_gen gen;
    pd_pool *pool;
    unsigned width;
} bench_case;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Every permd case draws a fresh epoch each run, as a training job would. */
static uint64_t epoch_counter;

static int run_core(const bench_case *c, uint64_t n, void *out)
{
    pd_perm p;
    int rc = pd_perm_init(&p, 42, epoch_counter++, 0, n);
    if (!rc)
        rc = c->width == 4 ? pd_perm_fill_u32(&p, 0, n, out) : pd_perm_fill_u64(&p, 0, n, out);
    return rc;
}

static int run_gen(const bench_case *c, uint64_t n, void *out)
{
    pd_perm p;
    int rc = pd_perm_init(&p, 42, epoch_counter++, 0, n);
    if (!rc)
        rc = c->width == 4 ? pd_gen_fill_u32(&c->gen, &p, 0, n, out) : pd_gen_fill_u64(&c->gen, &p, 0, n, out);
    return rc;
}

static int run_pool(const bench_case *c, uint64_t n, void *out)
{
    pd_perm p;
    int rc = pd_perm_init(&p, 42, epoch_counter++, 0, n);
    if (!rc)
        rc = c->width == 4 ? pd_pool_fill_u32(c->pool, &p, 0, n, out) : pd_pool_fill_u64(c->pool, &p, 0, n, out);
    return rc;
}

/* ---- The peer: Fisher–Yates with xoshiro256** and Lemire's bounded random */

typedef struct xoshiro {
    uint64_t s[4];
} xoshiro;

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t xoshiro_next(xoshiro *r)
{
    const uint64_t out = rotl(r->s[1] * 5, 7) * 9, t = r->s[1] << 17;
    r->s[2] ^= r->s[0];
    r->s[3] ^= r->s[1];
    r->s[1] ^= r->s[2];
    r->s[0] ^= r->s[3];
    r->s[2] ^= t;
    r->s[3] = rotl(r->s[3], 45);
    return out;
}

static void xoshiro_seed(xoshiro *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (seed += UINT64_C(0x9E3779B97F4A7C15));
        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        r->s[i] = z ^ (z >> 31);
    }
}

/* Uniform in [0, range) without division in the common case (Lemire 2019). */
static inline uint32_t bounded(xoshiro *r, uint32_t range)
{
    uint64_t m = (xoshiro_next(r) >> 32) * range;
    uint32_t low = (uint32_t)m;
    if (low < range) {
        const uint32_t floor = (uint32_t)-range % range;
        while (low < floor) {
            m = (xoshiro_next(r) >> 32) * range;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

/* What a job without permd does: materialise 0..n-1 and shuffle it in place. */
static int run_fisher_yates(const bench_case *c, uint64_t n, void *out)
{
    (void)c;
    if (n > UINT32_MAX)
        return PD_EOVERFLOW;
    uint32_t *a = out;
    xoshiro r;
    xoshiro_seed(&r, epoch_counter++);
    for (uint32_t i = 0; i < n; i++)
        a[i] = i;
    for (uint32_t i = (uint32_t)n - 1; i > 0; i--) {
        const uint32_t j = bounded(&r, i + 1);
        const uint32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
    return PD_OK;
}

/* ---- Driver */

/* Timing on a shared machine drifts, so the cases of one size are timed in
 * rounds, one run of each per round: a slow spell then hits them all alike.
 * After one warm-up run each, a case keeps running until it has at least
 * reps runs and at least MIN_TOTAL_S seconds of them; it reports the median. */
#define MIN_TOTAL_S 1.0
#define MAX_RUNS 255

typedef struct timing {
    double t[MAX_RUNS], total;
    int runs;
} timing;

static double median_of(timing *tm)
{
    qsort(tm->t, (size_t)tm->runs, sizeof tm->t[0], cmp_double);
    return tm->runs % 2 ? tm->t[tm->runs / 2] : 0.5 * (tm->t[tm->runs / 2 - 1] + tm->t[tm->runs / 2]);
}

static int measure_size(const bench_case *cases, const int *on, int ncases, uint64_t n, void *buf, int reps,
                        timing *tm)
{
    for (int i = 0; i < ncases; i++) {
        tm[i].runs = 0;
        tm[i].total = 0;
        int rc = on[i] ? cases[i].run(&cases[i], n, buf) : PD_OK;
        if (rc) {
            fprintf(stderr, "cpu_gen: %s at n=%" PRIu64 ": %s\n", cases[i].name, n, pd_errname(rc));
            return rc;
        }
    }
    for (int busy = 1; busy;) {
        busy = 0;
        for (int i = 0; i < ncases; i++) {
            if (!on[i] || tm[i].runs == MAX_RUNS || (tm[i].runs >= reps && tm[i].total >= MIN_TOTAL_S))
                continue;
            busy = 1;
            const double t0 = now_s();
            cases[i].run(&cases[i], n, buf); /* succeeded in the warm-up with the same arguments */
            const double t = now_s() - t0;
            tm[i].t[tm[i].runs++] = t;
            tm[i].total += t;
        }
    }
    return PD_OK;
}

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    errno = 0;
    if (strncmp(s, "2^", 2) == 0) { /* 2^26, 2^26+1, 2^26-1 */
        unsigned long k = strtoul(s + 2, &end, 10);
        long long adj = *end ? strtoll(end, &end, 10) : 0;
        if (errno || *end || k > 63)
            return -1;
        *v = (UINT64_C(1) << k) + (uint64_t)adj;
        return 0;
    }
    *v = strtoull(s, &end, 10);
    return errno || *end || end == s ? -1 : 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: cpu_gen [--n N]... [--reps R] [--threads T] [--only SUBSTRING] [--u64]\n"
               "  Prints one TSV line per case: case, n, threads, median seconds, M indices/s (median run),\n"
               "  M indices/s (fastest run).\n"
               "  The cases of one size run in rounds (one run of each per round) after a warm-up, each\n"
               "  until it has at least R runs (default 5) and 1 s of them; the median is reported.\n"
               "  N may be written 2^K, 2^K+1, 2^K-1 (default: 2^20+1 2^26+1 2^26).\n"
               "  T is the pool's size (default 0: one thread per online CPU).\n");
}

static int parse_opts(int argc, char **argv, opts *o)
{
    const char *arg = "";
    memset(o, 0, sizeof *o);
    o->reps = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        arg = a;
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--u64") == 0) {
            o->u64 = 1;
        } else if (!v) {
            goto bad;
        } else if (strcmp(a, "--n") == 0 && o->nsizes < MAX_SIZES && !parse_u64(v, &x) && x >= 1 && x <= UINT32_MAX) {
            o->sizes[o->nsizes++] = x;
            i++;
        } else if (strcmp(a, "--reps") == 0 && !parse_u64(v, &x) && x >= 1 && x <= MAX_RUNS) {
            o->reps = (int)x;
            i++;
        } else if (strcmp(a, "--threads") == 0 && !parse_u64(v, &x) && x <= 4096) {
            o->threads = (unsigned)x;
            i++;
        } else if (strcmp(a, "--only") == 0) {
            o->only = v;
            i++;
        } else {
            goto bad;
        }
    }
    if (o->nsizes == 0) {
        o->sizes[0] = (UINT64_C(1) << 20) + 1;
        o->sizes[1] = (UINT64_C(1) << 26) + 1;
        o->sizes[2] = UINT64_C(1) << 26;
        o->nsizes = 3;
    }
    return 0;
bad:
    fprintf(stderr, "cpu_gen: bad or incomplete argument '%s'\n", arg);
    usage(stderr);
    return -1;
}

int main(int argc, char **argv)
{
    opts o;
    bench_case cases[32];
    int ncases = 0, rc = 1;
    pd_pool *pool = NULL;
    void *buf = NULL;
    if (parse_opts(argc, argv, &o))
        return 2;

    /* The cases. u32 ids (what the daemon sends for n ≤ 2^32) with every
     * walk, to compare them; u64 (--u64) with each ISA's default walk only. */
    for (unsigned w = 4; w <= 8; w += 4) {
        if (w == 8 && !o.u64)
            break;
        const char *sfx = w == 4 ? "u32" : "u64";
        bench_case *c = &cases[ncases++];
        *c = (bench_case){.run = run_core, .width = w};
        snprintf(c->name, sizeof c->name, "core-scalar/%s", sfx);
        for (int isa = PD_ISA_AVX2; isa <= PD_ISA_AVX512; isa++) {
            for (int walk = PD_WALK_LOCKSTEP; walk <= PD_WALK_COMPACT; walk++) {
                pd_gen g;
                if (pd_gen_init(&g, (pd_isa)isa) || pd_gen_set_walk(&g, (pd_walk)walk))
                    continue;
                if (w == 8 && walk != PD_WALK_COMPACT)
                    continue;
                c = &cases[ncases++];
                *c = (bench_case){.run = run_gen, .gen = g, .width = w};
                snprintf(c->name, sizeof c->name, "%s-%s/%s", pd_isa_name((pd_isa)isa), pd_walk_name((pd_walk)walk), sfx);
            }
        }
        c = &cases[ncases++];
        *c = (bench_case){.run = run_pool, .width = w};
        snprintf(c->name, sizeof c->name, "pool-auto/%s", sfx);
    }
    bench_case *fy = &cases[ncases++];
    *fy = (bench_case){.run = run_fisher_yates, .width = 4};
    snprintf(fy->name, sizeof fy->name, "c-fisher-yates/u32");

    if (pd_pool_create(o.threads, NULL, &pool) != PD_OK) {
        fprintf(stderr, "cpu_gen: cannot create the pool\n");
        goto out;
    }
    for (int i = 0; i < ncases; i++)
        cases[i].pool = pool;

    uint64_t nmax = 0;
    for (int s = 0; s < o.nsizes; s++)
        nmax = o.sizes[s] > nmax ? o.sizes[s] : nmax;
    buf = malloc(nmax * (o.u64 ? 8 : 4));
    if (!buf) {
        fprintf(stderr, "cpu_gen: out of memory\n");
        goto out;
    }
    int on[32];
    static timing tm[32];
    for (int i = 0; i < ncases; i++)
        on[i] = !o.only || strstr(cases[i].name, o.only) != NULL;
    printf("# case\tn\tthreads\tmedian_s\tM_per_s\tbest_M_per_s\n");
    for (int s = 0; s < o.nsizes; s++) {
        if (measure_size(cases, on, ncases, o.sizes[s], buf, o.reps, tm))
            goto out;
        for (int i = 0; i < ncases; i++) {
            if (!on[i])
                continue;
            const double med = median_of(&tm[i]), best = tm[i].t[0]; /* sorted by median_of */
            printf("%s\t%" PRIu64 "\t%u\t%.6f\t%.2f\t%.2f\n", cases[i].name, o.sizes[s],
                   cases[i].run == run_pool ? pd_pool_threads(pool) : 1, med, (double)o.sizes[s] / med / 1e6,
                   (double)o.sizes[s] / best / 1e6);
        }
        fflush(stdout);
    }
    rc = 0;
out:
    free(buf);
    pd_pool_destroy(pool);
    return rc;
}
