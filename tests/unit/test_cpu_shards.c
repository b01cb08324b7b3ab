/* Tests for cpu/shards.c: sharded ids from every ISA, walk and the pool equal the core's pd_shard_slice_fill_* bit for bit, over many layouts; bad input gets the core's errors. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/shards.h"
#include "cpu/gen.h"
#include "cpu/kernel.h"

#define P2(k) (UINT64_C(1) << (k))
#define GUARD 16
#define SENTINEL UINT64_C(0xA5A5A5A5A5A5A5A5)

/* ---- Generators under test: every ISA this CPU runs, with every walk its σ kernel has. */

typedef struct gen_case {
    pd_gen g;
    char name[40];
} gen_case;

/* The SIMDe build (test_cpu_shards_avx512emu) checks only the emulated AVX-512 kernels: the native
 * build checks the rest, ten times faster. */
#ifdef PERMD_TEST_AVX512_ONLY
#define FIRST_ISA PD_ISA_AVX512
#else
#define FIRST_ISA PD_ISA_SCALAR
#endif

/* Smaller sweeps under valgrind (PERMD_TEST_QUICK), in emulation and in the sanitizer build (-O0:
 * the Release run covers the full sweep; this one is for memory errors). */
static int quick(void)
{
#if defined(PERMD_TEST_AVX512_ONLY) || defined(__SANITIZE_ADDRESS__)
    return 1;
#else
    return test_quick();
#endif
}

static size_t all_gens(gen_case *out)
{
    size_t n = 0;
    for (int isa = FIRST_ISA; isa <= PD_ISA_AVX512; isa++) {
        if (!pd_cpu_has_isa((pd_isa)isa))
            continue;
        for (int w = PD_WALK_AUTO; w <= PD_WALK_COMPACT; w++) {
            gen_case *c = &out[n];
            assert_int_equal(pd_gen_init(&c->g, (pd_isa)isa), PD_OK);
            if (pd_gen_set_walk(&c->g, (pd_walk)w) != PD_OK)
                continue;
            snprintf(c->name, sizeof c->name, "%s/%s", pd_isa_name((pd_isa)isa), pd_walk_name((pd_walk)w));
            n++;
            if (c->g.vbmi && w == PD_WALK_AUTO) { /* and what AVX-512 CPUs without VBMI run: */
                out[n] = *c;                       /* 16-bit lanes with BW (Skylake-X, Cascade Lake), */
                out[n].g.vbmi = 0;
                snprintf(out[n].name, sizeof out[n].name, "%s-novbmi/%s", pd_isa_name((pd_isa)isa),
                         pd_walk_name((pd_walk)w));
                n++;
                out[n] = out[n - 1]; /* 32-bit lanes without it (PD_SMALL) */
                out[n].g.bw = 0;
                snprintf(out[n].name, sizeof out[n].name, "%s-f/%s", pd_isa_name((pd_isa)isa),
                         pd_walk_name((pd_walk)w));
                n++;
            }
        }
    }
    return n;
}

static gen_case gens[16];
static size_t ngens;
/* Walks differ only where a batch holds one run (the σ kernel's own walk): the random layouts,
 * mostly short runs, check the default walk of each ISA; the others check every walk. */
static int every_walk = 1;

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* ---- Layouts */

typedef struct layout {
    uint64_t shards;
    uint64_t *start;
    void *mem;
} layout;

static void layout_from(layout *l, const uint64_t *sizes, uint64_t shards)
{
    l->shards = shards;
    l->start = xmalloc((shards + 1) * 8);
    l->mem = xmalloc(pd_shard_plan_bytes(shards));
    assert_int_equal(pd_shard_layout_build(sizes, shards, l->start), PD_OK);
}

/* S shards, mostly small and uneven, some empty, some of one sample; big > 0 makes every 16th
 * or so that size (N > 2^32 when big is). */
static void layout_random(layout *l, uint64_t *rng, uint64_t shards, uint64_t big)
{
    uint64_t *sizes = xmalloc(shards * 8);
    for (uint64_t i = 0; i < shards; i++) {
        const uint64_t r = test_below(rng, 16);
        sizes[i] = r == 0 ? 0 : r == 1 ? 1 : r == 2 && big ? big : 2 + test_below(rng, 300);
    }
    sizes[test_below(rng, shards)] += 1; /* never all empty */
    layout_from(l, sizes, shards);
    free(sizes);
}

static void layout_uniform(layout *l, uint64_t shards, uint64_t size)
{
    uint64_t *sizes = xmalloc(shards * 8);
    for (uint64_t i = 0; i < shards; i++)
        sizes[i] = size;
    layout_from(l, sizes, shards);
    free(sizes);
}

static void layout_free(layout *l)
{
    free(l->start);
    free(l->mem);
}

static void plan_for(pd_shard_plan *plan, const layout *l, uint64_t seed, uint64_t epoch, uint64_t window,
                     uint64_t lanes)
{
    assert_int_equal(pd_shard_plan_init(plan, l->start, l->shards, seed, epoch, window, lanes, l->mem,
                                        pd_shard_plan_bytes(l->shards)),
                     PD_OK);
}

/* ---- Checks */

static void expect_same(const char *who, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                        const uint64_t *want, const void *got, unsigned width)
{
    for (uint64_t i = 0; i < count + GUARD; i++) {
        const uint64_t g = width == 4 ? ((const uint32_t *)got)[i] : ((const uint64_t *)got)[i];
        const uint64_t w = i < count ? (width == 4 ? (uint32_t)want[i] : want[i])
                                     : (width == 4 ? (uint32_t)SENTINEL : SENTINEL);
        if (g != w)
            fail_msg("%s u%u: S=%llu N=%llu K=%llu G=%llu W=%u rank=%u %s offset=%llu count=%llu: [%llu] = %llu, "
                     "want %llu%s",
                     who, width * 8, (unsigned long long)plan->shards, (unsigned long long)plan->n,
                     (unsigned long long)plan->window, (unsigned long long)plan->lanes, s->world, s->rank,
                     pd_mode_name(s->mode), (unsigned long long)s->offset, (unsigned long long)count,
                     (unsigned long long)i, (unsigned long long)g, (unsigned long long)w,
                     i >= count ? " (written past the end)" : "");
    }
}

/* One slice by every generator (and pool, when given) against pd_shard_slice_fill_*: ids, counts
 * and errors, u64 and u32. */
static void check_slice(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, pd_pool *pool)
{
    uint64_t *want = xmalloc(count * 8), *got = xmalloc((count + GUARD) * 8);
    uint32_t *got32 = xmalloc((count + GUARD) * 4);
    uint64_t nwant = 0, ngot = 0;
    const int rc = pd_shard_slice_fill_u64(plan, s, count, want, &nwant);
    const int fits = plan->n <= P2(32);
    for (size_t k = 0; k <= ngens; k++) {
        if (k == ngens && !pool)
            break;
        if (k < ngens && !every_walk && gens[k].g.walk != PD_WALK_AUTO)
            continue;
        const char *who = k < ngens ? gens[k].name : "pool";
        for (uint64_t i = 0; i < count + GUARD; i++)
            got[i] = SENTINEL;
        memset(got32, 0xA5, (count + GUARD) * 4);
        int r64, r32;
        if (k < ngens) {
            r64 = pd_gen_shard_slice_fill_u64(&gens[k].g, plan, s, count, got, &ngot);
        } else {
            r64 = pd_pool_shard_slice_fill_u64(pool, plan, s, count, got, &ngot);
        }
        if (r64 != rc)
            fail_msg("%s u64: rc %d, the core's %d", who, r64, rc);
        if (rc == PD_OK) {
            assert_int_equal(ngot, nwant);
            expect_same(who, plan, s, nwant, want, got, 8);
        }
        ngot = 0;
        if (k < ngens)
            r32 = pd_gen_shard_slice_fill_u32(&gens[k].g, plan, s, count, got32, &ngot);
        else
            r32 = pd_pool_shard_slice_fill_u32(pool, plan, s, count, got32, &ngot);
        if (!fits) {
            assert_int_equal(r32, PD_EOVERFLOW);
        } else {
            assert_int_equal(r32, rc);
            if (rc == PD_OK) {
                assert_int_equal(ngot, nwant);
                expect_same(who, plan, s, nwant, want, got32, 4);
            }
        }
    }
    free(want);
    free(got);
    free(got32);
}

/* Slices of one plan: each mode, from the start, from a random offset, up to T (pad's wrapped
 * tail), and past T; rank and count random. */
static void check_plan(const pd_shard_plan *plan, uint64_t *rng, const uint32_t *worlds, size_t nworlds,
                       uint64_t max_count)
{
    for (size_t wi = 0; wi < nworlds; wi++) {
        for (int mode = PD_MODE_PAD; mode <= PD_MODE_EXACT; mode++) {
            pd_slice s = {.world = worlds[wi], .mode = (pd_mode)mode};
            uint64_t len;
            if (pd_epoch_length(plan->n, s.world, s.mode, &len) != PD_OK || len == 0)
                continue;
            const uint64_t per = len / s.world;
            const uint64_t offsets[3] = {0, test_below(rng, len + 1),
                                         per > max_count ? len - (max_count - 1) * s.world - s.world : 0};
            for (int o = 0; o < 3; o++) {
                s.offset = offsets[o];
                s.rank = (uint32_t)test_below(rng, s.world);
                check_slice(plan, &s, 1 + test_below(rng, max_count), NULL);
            }
            s.offset = len; /* past T: nothing, not an error */
            s.rank = s.world - 1;
            check_slice(plan, &s, 10, NULL);
        }
    }
}

/* ---- Tests */

/* Random layouts × windows × lanes × worlds: empty and single-sample shards, K = 1, K ≥ S, tables
 * in registers (≤ 8 / 16 slots) and in memory, windows with more slots than a table holds, lanes
 * that do and do not divide W, odd lanes read backward, N > 2^32. */
static void random_layouts(void **state)
{
    (void)state;
    uint64_t rng = 0x5a4d;
    static const uint64_t shard_counts[] = {1, 2, 3, 7, 64, 1000, 4099};
    /* The even ones alone (quick) still take every lookup path: 1 slot, 32 and 64 in registers,
     * 1024 gathered, more than a table holds. */
    static const uint64_t windows[] = {1, 2, 17, 8, 64, 16, 1000, 3, P2(40), 1025};
    static const uint64_t lanes[] = {1, 2, 3, 8, 17};
    const int fast = quick();
    every_walk = 0;
    for (size_t i = 0; i < sizeof shard_counts / sizeof shard_counts[0]; i++) {
        const uint64_t S = shard_counts[i];
        layout l;
        layout_random(&l, &rng, S, i % 3 == 2 ? P2(33) : 0);
        for (size_t k = 0; k < sizeof windows / sizeof windows[0]; k++) {
            if (fast && k % 2)
                continue;
            for (size_t g = 0; g < sizeof lanes / sizeof lanes[0]; g++) {
                if (lanes[g] > l.start[S])
                    continue;
                pd_shard_plan plan;
                plan_for(&plan, &l, 7 + i, k * 5 + g, windows[k], lanes[g]);
                const uint32_t G = (uint32_t)lanes[g];
                const uint32_t worlds[] = {1, 2, 3, 8, G, 2 * G, 3 * G + 1};
                check_plan(&plan, &rng, worlds, fast ? 3 : 7, fast ? 300 : 3000);
            }
        }
        layout_free(&l);
    }
    every_walk = 1;
}

/* Shards of one sample (windows of K samples: τ over 1 or 2, where the parity correction must be
 * skipped or applied), and long uniform shards whose runs span several σ pieces. */
static void uniform_layouts(void **state)
{
    (void)state;
    uint64_t rng = 0x0f1;
    static const struct {
        uint64_t shards, size;
    } shapes[] = {{1, 1}, {2, 1}, {9, 1}, {300, 1}, {4, 5000}, {64, 1024}, {3, 100000}};
    static const uint64_t windows[] = {1, 2, 8, 64};
    static const uint64_t lanes[] = {1, 2, 8};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        layout l;
        layout_uniform(&l, shapes[i].shards, shapes[i].size);
        for (size_t k = 0; k < sizeof windows / sizeof windows[0]; k++)
            for (size_t g = 0; g < sizeof lanes / sizeof lanes[0]; g++) {
                if (lanes[g] > l.start[l.shards])
                    continue;
                /* Epochs whose window keys flip and whose do not: several per plan. */
                for (uint64_t epoch = 0; epoch < (quick() ? 1 : 3); epoch++) {
                    pd_shard_plan plan;
                    plan_for(&plan, &l, 100 + i, epoch, windows[k], lanes[g]);
                    const uint32_t worlds[] = {1, (uint32_t)lanes[g], 8, 5};
                    check_plan(&plan, &rng, worlds, 4, quick() ? 500 : 12000);
                }
            }
        layout_free(&l);
    }
}

/* A rank that reads several lanes (m = G / gcd(G, W) subsequences) walks them side by side, 1024
 * indices at a time (up to 16 of them; more one after the other), each step's ids staged a row per
 * subsequence and interleaved (AVX-512: perfect shuffles for m = 2, 4, 8, 16, masked permutes for
 * other m): counts that end on and just past those steps, where some subsequences are one shorter
 * than the rest, and counts too short to stage. */
static void interleaved_lanes(void **state)
{
    (void)state;
    uint64_t rng = 0x1a7e;
    layout l;
    layout_random(&l, &rng, 3000, 0);
    static const struct {
        uint64_t lanes;
        uint32_t world;
    } shapes[] = {{2, 1}, {4, 1}, {8, 1}, {8, 3}, {16, 1}, {17, 1}, {12, 8}, {7, 1}, {10, 4}, {15, 2}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        pd_shard_plan plan;
        plan_for(&plan, &l, 21, i, 4, shapes[i].lanes);
        uint64_t gcd = shapes[i].lanes, r = shapes[i].world;
        while (r) {
            const uint64_t t = gcd % r;
            gcd = r;
            r = t;
        }
        const uint64_t m = shapes[i].lanes / gcd;
        const uint64_t counts[] = {m * 1024, m * 1024 + 1, m * 1024 + m - 1, 2 * m * 1024 + 1, 3, m * 63 + 2};
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            pd_slice s = {.world = shapes[i].world, .rank = 0, .mode = PD_MODE_EXACT};
            check_slice(&plan, &s, counts[c], NULL);
            s.offset = shapes[i].world * 5;
            s.rank = shapes[i].world - 1;
            check_slice(&plan, &s, counts[c], NULL);
        }
    }
    layout_free(&l);
}

/* Windows of 2^32 samples or more (τ's values need 64 bits: the plan is searched directly), and
 * N near 2^63. */
static void huge_layouts(void **state)
{
    (void)state;
    uint64_t rng = 0xb16;
    const uint64_t a[] = {P2(33) + 7, 5, 0, 12, P2(32)};
    const uint64_t b[] = {P2(62), P2(62) - 5, 3, 0, 1};
    const uint64_t *layouts[] = {a, b};
    static const uint64_t windows[] = {1, 2, 5};
    static const uint64_t lanes[] = {1, 2, 3, 8};
    for (size_t i = 0; i < 2; i++) {
        layout l;
        layout_from(&l, layouts[i], 5);
        for (size_t k = 0; k < sizeof windows / sizeof windows[0]; k++)
            for (size_t g = 0; g < sizeof lanes / sizeof lanes[0]; g++) {
                pd_shard_plan plan;
                plan_for(&plan, &l, 3, k + g, windows[k], lanes[g]);
                const uint32_t worlds[] = {1, 3, (uint32_t)lanes[g], UINT32_MAX};
                check_plan(&plan, &rng, worlds, quick() ? 2 : 4, quick() ? 500 : 2000);
            }
        layout_free(&l);
    }
}

/* Gathers (pd_gen_shard_gather_u64): positions as a mixture's sparse reads bring them (ascending with random gaps,
 * which stay in a window for a stretch), descending, and in no order, over random and huge layouts, windows of
 * one shard to all of them and lanes 1 to 40 (sorted by lane up to 16): every ISA's ids against
 * pd_shard_locate's. */
static void check_gather(const pd_shard_plan *plan, uint64_t *rng, uint64_t n)
{
    uint64_t *at = xmalloc(n * 8), *pos = xmalloc(n * 8);
    for (int order = 0; order < 3; order++) {
        const uint64_t gap = 1 + test_below(rng, 1 + 2 * plan->n / (n + 1)); /* mean gap: the reads span up to N */
        uint64_t p = test_below(rng, plan->n);
        for (uint64_t i = 0; i < n; i++) {
            pos[i] = order == 2 ? test_below(rng, plan->n) : p % plan->n;
            p = order == 0 ? p + test_below(rng, 2 * gap) : p + plan->n - test_below(rng, 2 * gap) % plan->n;
        }
        for (size_t k = 0; k < ngens; k++) {
            memcpy(at, pos, n * 8);
            pd_gen_shard_gather_u64(&gens[k].g, plan, at, n);
            for (uint64_t i = 0; i < n; i++) {
                pd_shard_loc loc;
                assert_int_equal(pd_shard_locate(plan, pos[i], &loc), PD_OK);
                if (at[i] != loc.sample) {
                    print_error("%s: gather order %d, K=%llu G=%llu: position %llu (read %llu of %llu) gave %llu, "
                                "want %llu\n", gens[k].name, order, (unsigned long long)plan->window,
                                (unsigned long long)plan->lanes, (unsigned long long)pos[i], (unsigned long long)i,
                                (unsigned long long)n, (unsigned long long)at[i], (unsigned long long)loc.sample);
                    fail();
                }
            }
        }
    }
    free(at);
    free(pos);
}

static void gathers_match_core(void **state)
{
    (void)state;
    uint64_t rng = 0x9a7;
    static const uint64_t windows[] = {1, 3, 8, 64, 5000};
    static const uint64_t lanes[] = {1, 2, 3, 16, 40};
    for (int t = 0; t < (quick() ? 4 : 16); t++) {
        layout l;
        const uint64_t shards = 1 + test_below(&rng, t % 2 ? 3000 : 40);
        layout_random(&l, &rng, shards, t % 4 == 3 ? P2(33) + 3 : 0); /* some windows of 2^32 samples or more */
        pd_shard_plan plan;
        plan_for(&plan, &l, test_rand(&rng), t, windows[test_below(&rng, 5)], lanes[test_below(&rng, 5)]);
        check_gather(&plan, &rng, test_below(&rng, quick() ? 1500 : 5000));
        layout_free(&l);
    }
    /* Past one lane sort's piece (4096 reads) and one stretch's room (1024): every shard in one window, and the
     * reads dense enough (N ~ 450,000 over 9000) that a lane's stretch in it runs for thousands. */
    layout l;
    layout_random(&l, &rng, 3000, 0);
    for (uint64_t g = 1; g <= 3; g++) {
        pd_shard_plan plan;
        plan_for(&plan, &l, 5, g, 3000, g);
        check_gather(&plan, &rng, 9000);
    }
    layout_free(&l);
    /* A window of exactly 2^31 samples (τ's b = 31, no walk), where AVX2's signed compare read n as negative and its
     * gather never returned. */
    const uint64_t halves[2] = {P2(30), P2(30)};
    layout_from(&l, halves, 2);
    for (uint64_t g = 1; g <= 2; g++) {
        pd_shard_plan plan;
        plan_for(&plan, &l, 6, g, 2, g);
        check_gather(&plan, &rng, 3000);
    }
    layout_free(&l);
}

/* The pool splits large requests into chunks that each start mid-window (and mid-lane), against
 * the core; u32 and u64, with pad's wrapped tail. */
static void pool_matches_core(void **state)
{
    (void)state;
    uint64_t rng = 0x9001;
    static const unsigned threads[] = {1, 3};
    layout l;
    layout_random(&l, &rng, 5000, 0);
    const uint64_t count = quick() ? 70000 : 300007;
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        pd_pool *pool;
        assert_int_equal(pd_pool_create(threads[t], NULL, &pool), PD_OK);
        static const struct {
            uint64_t window, lanes;
            uint32_t world;
        } cases[] = {{1, 1, 1}, {8, 1, 2}, {8, 4, 4}, {64, 8, 3}, {2000, 3, 1}};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            pd_shard_plan plan;
            plan_for(&plan, &l, 11, t * 10 + c, cases[c].window, cases[c].lanes);
            pd_slice s = {.world = cases[c].world, .rank = cases[c].world - 1, .mode = PD_MODE_PAD};
            uint64_t len;
            assert_int_equal(pd_epoch_length(plan.n, s.world, s.mode, &len), PD_OK);
            s.offset = len / s.world > count ? len - count * s.world : 0; /* up to T */
            check_slice(&plan, &s, count, pool);
            s.offset = 0;
            s.mode = PD_MODE_EXACT;
            check_slice(&plan, &s, count, pool);
        }
        pd_pool_destroy(pool);
    }
    layout_free(&l);
}

/* Errors as the core's, in the same order, for the generator and the pool alike. */
static void bad_arguments_match_core(void **state)
{
    (void)state;
    const uint64_t sizes[3] = {3, 0, 4}, big_sizes[2] = {P2(32), 1};
    layout l, big;
    layout_from(&l, sizes, 3);
    layout_from(&big, big_sizes, 2);
    pd_shard_plan plan, bigplan;
    plan_for(&plan, &l, 1, 2, 2, 1);
    plan_for(&bigplan, &big, 1, 2, 1, 1);
    pd_gen g;
    pd_pool *pool;
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), PD_OK);
    assert_int_equal(pd_pool_create(2, &g, &pool), PD_OK);
    uint64_t o64[16], w;
    uint32_t o32[16];
    const struct {
        const pd_shard_plan *plan;
        pd_slice s;
        uint64_t count;
        int null_out, null_written;
    } cases[] = {
        {NULL, {1, 0, PD_MODE_EXACT, 0}, 1, 0, 0},
        {&plan, {1, 0, PD_MODE_EXACT, 0}, 1, 0, 1},
        {&plan, {1, 0, PD_MODE_EXACT, 0}, 1, 1, 0},
        {&plan, {1, 0, PD_MODE_EXACT, 0}, 0, 1, 0}, /* nothing asked: no buffer needed */
        {&plan, {0, 0, PD_MODE_EXACT, 0}, 1, 0, 0},
        {&plan, {2, 2, PD_MODE_EXACT, 0}, 1, 0, 0},
        {&plan, {2, 0, (pd_mode)7, 0}, 1, 0, 0},
        {&plan, {2, 1, PD_MODE_PAD, 9}, 1, 0, 0},   /* past T = 8 */
        {&plan, {2, 1, PD_MODE_PAD, 8}, 5, 0, 0},   /* at T: nothing */
        {&plan, {3, 2, PD_MODE_PAD, 3}, 16, 0, 0},  /* the wrapped tail */
        {&bigplan, {1, 0, PD_MODE_EXACT, 0}, 4, 0, 0}, /* u32: EOVERFLOW */
        {&bigplan, {1, 0, PD_MODE_EXACT, 0}, 4, 0, 1}, /* u32: EOVERFLOW before the NULL */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const pd_shard_plan *p = cases[i].plan;
        const pd_slice *s = &cases[i].s;
        const uint64_t ct = cases[i].count;
        uint64_t *b64 = cases[i].null_out ? NULL : o64, *wr = cases[i].null_written ? NULL : &w;
        uint32_t *b32 = cases[i].null_out ? NULL : o32;
        const int want64 = pd_shard_slice_fill_u64(p, s, ct, b64, wr);
        const int want32 = pd_shard_slice_fill_u32(p, s, ct, b32, wr);
        assert_int_equal(pd_gen_shard_slice_fill_u64(&g, p, s, ct, b64, wr), want64);
        assert_int_equal(pd_gen_shard_slice_fill_u32(&g, p, s, ct, b32, wr), want32);
        assert_int_equal(pd_pool_shard_slice_fill_u64(pool, p, s, ct, b64, wr), want64);
        assert_int_equal(pd_pool_shard_slice_fill_u32(pool, p, s, ct, b32, wr), want32);
    }
    const pd_slice sl = {.world = 1, .mode = PD_MODE_EXACT};
    const pd_gen junk = {.isa = (pd_isa)99};
    assert_int_equal(pd_gen_shard_slice_fill_u64(NULL, &plan, &sl, 1, o64, &w), PD_EINVAL);
    assert_int_equal(pd_gen_shard_slice_fill_u32(&junk, &plan, &sl, 1, o32, &w), PD_EINVAL);
    assert_int_equal(pd_pool_shard_slice_fill_u64(NULL, &plan, &sl, 1, o64, &w), PD_EINVAL);
    pd_pool_destroy(pool);
    layout_free(&l);
    layout_free(&big);
}

/* cpu/batch_avx2.c's word lanes take hi32(M0·s0)'s low bits as mulhi16(M0's bits 16-31, s0) + M0's
 * bits 32-39 · s0, which needs the carry out of the lower products to be 0: true of this M0 for
 * every s0 < 512 (the word lanes' s0 < 2^8). Checked here for all of them, and the formula's
 * negative control: with the carry dropped from a multiplier that has one, it fails. */
static int words_hi_matches(uint64_t m0, uint32_t limit)
{
    for (uint64_t s = 0; s < limit; s++) {
        const uint32_t ch = (uint32_t)(m0 >> 16) & 0xFFFF, a = (uint32_t)(m0 >> 32) & 0xFFFF;
        const uint32_t words = (((ch * (uint32_t)s) >> 16) + a * (uint32_t)s) & 0xFFFF;
        if (words != ((uint32_t)((m0 * s) >> 32) & 0xFFFF))
            return 0;
    }
    return 1;
}

static void m0_words_carry_free(void **state)
{
    (void)state;
    assert_true(words_hi_matches(PD_VP_M0, 512));
    assert_false(words_hi_matches(UINT64_C(0xD2B74407B1CEFFFF), 512)); /* M0 with another low word */
}

/* The batch kernels (several τ side by side, cpu/kernel.h) equal the scalar one for every ISA, on
 * byte lanes (VBMI) and off them: τ of every width the byte lanes take (b = 6 … 17: d = 0, 1 and
 * mixed, lbits up to 8, a 9-bit right half) and some beyond, runs interleaved or contiguous, counts
 * not a multiple of the vector. */
static void batch_kernels_match_scalar(void **state)
{
    (void)state;
    enum { ITEMS = PD__BATCH_ITEMS };
    static uint32_t v0[ITEMS], want[ITEMS], got[ITEMS];
    static uint8_t run[ITEMS];
    pd_perm perm[PD__BATCH_RUNS];
    uint64_t rng = 11;
    for (int t = 0; t < (quick() ? 60 : 400); t++) {
        /* Every 8th batch: one long run of b = 16 or 17 that walks (a window of K = 64 shards), whose queued
         * groups all belong to it (the word lanes' broadcast path). */
        const int one_long = t % 8 == 0;
        const unsigned nruns = one_long ? 1 : 1 + (unsigned)test_below(&rng, t % 3 ? 16 : PD__BATCH_RUNS); /* > 16: bytes only */
        const unsigned maxbits = t % 4 == 3 ? 24 : 6 + (unsigned)test_below(&rng, 12); /* mostly b ≤ 17 */
        for (unsigned r = 0; r < nruns; r++) {
            const unsigned bits = one_long ? 16 + (unsigned)(t / 8 % 2) : 1 + (unsigned)test_below(&rng, maxbits);
            const uint64_t n = one_long ? (UINT64_C(1) << (bits - 1)) + 1 + test_below(&rng, (UINT64_C(1) << (bits - 1)) - 1)
                                        : 2 + test_below(&rng, (UINT64_C(1) << bits) - 1);
            assert_int_equal(pd_perm_init(&perm[r], test_rand(&rng), t, 2 + r, n), PD_OK);
        }
        const uint32_t count = one_long ? ITEMS - (uint32_t)test_below(&rng, 100) : (uint32_t)test_below(&rng, ITEMS + 1);
        const int interleaved = t % 2;
        for (uint32_t i = 0; i < count; i++) {
            run[i] = (uint8_t)(interleaved ? test_below(&rng, nruns) : (uint64_t)i * nruns / count);
            v0[i] = (uint32_t)test_below(&rng, perm[run[i]].n);
        }
        pd__batch b = {.nruns = nruns, .v = want, .run = run, .count = count};
        for (unsigned r = 0; r < nruns; r++)
            b.perm[r] = &perm[r];
        memcpy(want, v0, count * sizeof *v0);
        pd__batch_scalar(&b);
        for (uint32_t i = 0; i < count; i++) /* the scalar kernel is the core's σ, unflipped */
            assert_int_equal(want[i], pd__sigma(&perm[run[i]], v0[i], PD_ROUNDS, 0));
        for (int isa = PD_ISA_AVX2; isa <= PD_ISA_AVX512; isa++) {
            pd_gen g;
            if (pd_gen_init(&g, (pd_isa)isa) != PD_OK)
                continue;
            const int has_vbmi = g.vbmi, has_bw = g.bw;
            for (int k = 0; k < 4; k++) { /* VBMI with words for b ≥ 16; VBMI's bytes alone; BW's words; 32-bit lanes */
                g.vbmi = k <= 1 && has_vbmi;
                g.bw = (k == 0 || k == 2) && has_bw;
                if ((k <= 1 && !has_vbmi) || (k == 2 && !has_bw))
                    continue;
                int narrow = 1;
                for (unsigned r = 0; r < nruns; r++)
                    narrow &= pd__batch_narrow(&g, &perm[r]);
                if (b.nruns > pd__batch_max_runs(&g, narrow))
                    continue;
                memcpy(got, v0, count * sizeof *v0);
                b.v = got;
                pd__batch_run(&g, &b);
                if (count && memcmp(got, want, count * sizeof *got) != 0) {
                    for (uint32_t i = 0; i < count; i++)
                        if (got[i] != want[i]) {
                            const pd_perm *p = &perm[run[i]];
                            print_error("%s%s: t=%d runs=%u item %u (run %u, n=%llu, b=%u): %u, want %u\n",
                                        pd_isa_name(g.isa), g.vbmi ? (g.bw ? "+vbmi+bw" : "+vbmi") : g.bw ? "+bw" : "",
                                        t, nruns, i, run[i],
                                        (unsigned long long)p->n, p->bits, got[i], want[i]);
                            break;
                        }
                    fail();
                }
            }
        }
    }
}

/* pd_gen_shard_plan_init: the core's plan, table for table, from every ISA and walk (one shard, counts below the
 * SIMD kernels' minimum whose π cycle-walks a 64-value domain, powers of two, and enough shards for whole
 * vectors); the core's errors, and a bad g's before them. */
static void plan_build_matches_core(void **state)
{
    (void)state;
    const uint64_t counts[] = {1, 2, 3, 5, 8, 64, 100, 1000, 4097, 65536};
    uint64_t rng = 7;
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        layout l;
        layout_random(&l, &rng, counts[c], c % 2 ? P2(33) : 0); /* some with N > 2^32 */
        pd_shard_plan want, got;
        void *mem = xmalloc(pd_shard_plan_bytes(l.shards));
        plan_for(&want, &l, 11, 3 + c, 4, 2);
        for (size_t i = 0; i < ngens; i++) {
            memset(mem, 0xA5, pd_shard_plan_bytes(l.shards));
            assert_int_equal(pd_gen_shard_plan_init(&gens[i].g, &got, l.start, l.shards, 11, 3 + c, 4, 2, mem,
                                                    pd_shard_plan_bytes(l.shards)),
                             PD_OK);
            if (memcmp(got.slot_shard, want.slot_shard, l.shards * 8) ||
                memcmp(got.slot_start, want.slot_start, (l.shards + 1) * 8) || got.n != want.n ||
                got.windows != want.windows || got.lane_q != want.lane_q || got.lane_r != want.lane_r) {
                print_error("%s: %llu shards: another plan than the core's\n", gens[i].name,
                            (unsigned long long)l.shards);
                fail();
            }
        }
        free(mem);
        layout_free(&l);
    }
    /* the core's errors, in its order */
    const uint64_t sizes[2] = {3, 4};
    layout l, none;
    layout_from(&l, sizes, 2);
    none.start = xmalloc(3 * 8);
    none.start[0] = none.start[1] = none.start[2] = 0; /* N = 0 */
    pd_shard_plan plan;
    pd_gen g;
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), PD_OK);
    const size_t bytes = pd_shard_plan_bytes(2);
    assert_int_equal(pd_gen_shard_plan_init(&g, &plan, l.start, 2, 1, 2, 0, 1, l.mem, bytes), PD_EINVAL);
    assert_int_equal(pd_gen_shard_plan_init(&g, &plan, l.start, 2, 1, 2, 1, 0, l.mem, bytes), PD_EINVAL);
    assert_int_equal(pd_gen_shard_plan_init(&g, &plan, l.start, 0, 1, 2, 1, 1, l.mem, bytes), PD_EINVAL);
    assert_int_equal(pd_gen_shard_plan_init(&g, &plan, none.start, 2, 1, 2, 1, 1, l.mem, bytes), PD_EINVAL);
    assert_int_equal(pd_gen_shard_plan_init(&g, &plan, l.start, 2, 1, 2, 1, 1, l.mem, bytes - 1), PD_ERANGE);
    pd_shard_plan untouched;
    memset(&plan, 0xA5, sizeof plan);
    untouched = plan;
    assert_int_equal(pd_gen_shard_plan_init(NULL, &plan, l.start, 2, 1, 2, 1, 1, l.mem, bytes), PD_EINVAL);
    assert_memory_equal(&plan, &untouched, sizeof plan); /* g is checked before the plan is written */
    assert_int_equal(pd_gen_shard_plan_init(&g, &plan, l.start, 2, 1, 2, 1, 1, l.mem, bytes), PD_OK);
    free(none.start);
    layout_free(&l);
}

/* A negative control for the comparison: ids of another epoch's plan differ from the core's. */
static void comparison_can_fail(void **state)
{
    (void)state;
    layout l;
    layout_uniform(&l, 64, 100);
    pd_shard_plan a, b;
    void *mem2 = xmalloc(pd_shard_plan_bytes(64));
    plan_for(&a, &l, 1, 1, 8, 2);
    assert_int_equal(pd_shard_plan_init(&b, l.start, 64, 1, 2, 8, 2, mem2, pd_shard_plan_bytes(64)), PD_OK);
    const pd_slice s = {.world = 2, .rank = 1, .mode = PD_MODE_EXACT};
    uint64_t want[1000], got[1000], nw, ng;
    pd_gen g;
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), PD_OK);
    assert_int_equal(pd_shard_slice_fill_u64(&a, &s, 1000, want, &nw), PD_OK);
    assert_int_equal(pd_gen_shard_slice_fill_u64(&g, &b, &s, 1000, got, &ng), PD_OK);
    assert_int_equal(nw, ng);
    assert_true(memcmp(want, got, sizeof want) != 0);
    free(mem2);
    layout_free(&l);
}

int main(void)
{
    ngens = all_gens(gens);
    for (size_t i = 0; i < ngens; i++)
        printf("checking %s\n", gens[i].name);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_arguments_match_core),
        cmocka_unit_test(plan_build_matches_core),
        cmocka_unit_test(comparison_can_fail),
        cmocka_unit_test(m0_words_carry_free),
        cmocka_unit_test(batch_kernels_match_scalar),
        cmocka_unit_test(random_layouts),
        cmocka_unit_test(uniform_layouts),
        cmocka_unit_test(interleaved_lanes),
        cmocka_unit_test(huge_layouts),
        cmocka_unit_test(pool_matches_core),
        cmocka_unit_test(gathers_match_core),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
