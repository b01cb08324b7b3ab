/* Tests for cpu/: every ISA and walk the CPU has, and the thread pool, equal the scalar core bit for bit; bad input gets the core's errors. */
#define _POSIX_C_SOURCE 200809L
#include "test_util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/perm.h"
#include "core/rank.h"
#include "cpu/gen.h"
#include "cpu/kernel.h"
#include "vectors_v1.h"

#define P2(k) (UINT64_C(1) << (k))
#define GUARD 16                              /* words past the end that must stay untouched */
#define SENTINEL UINT64_C(0xA5A5A5A5A5A5A5A5) /* not an id of any n tried here below 2^63 */

/* ---- Generators under test */

typedef struct gen_case {
    pd_gen g;
    char name[40];
} gen_case;

/* Every walk isa supports, each as a generator; 0 when the CPU lacks isa. */
static size_t gens_for(pd_isa isa, gen_case *out)
{
    size_t n = 0;
    if (!pd_cpu_has_isa(isa))
        return 0;
    for (int w = PD_WALK_AUTO; w <= PD_WALK_COMPACT; w++) {
        gen_case *c = &out[n];
        assert_int_equal(pd_gen_init(&c->g, isa), PD_OK);
        if (pd_gen_set_walk(&c->g, (pd_walk)w) != PD_OK)
            continue;
        snprintf(c->name, sizeof c->name, "%s/%s", pd_isa_name(isa), pd_walk_name((pd_walk)w));
        n++;
    }
    assert_true(n >= 1);
    return n;
}

/* Keys for n with the parity flip off and on: the SIMD kernels handle the
 * flip apart from the rounds, so both must be seen. */
static void perms_both_flips(uint64_t n, uint64_t seed, pd_perm out[2])
{
    int have[2] = {0, 0};
    for (uint64_t epoch = 0; !(have[0] && have[1]); epoch++) {
        pd_perm p;
        assert_true(epoch < 64);
        assert_int_equal(pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n), PD_OK);
        if (!have[p.keys.flip]) {
            out[p.keys.flip] = p;
            have[p.keys.flip] = 1;
        }
    }
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* ---- Checks */

static void expect_same(const gen_case *gc, const char *what, const pd_perm *p, uint64_t start, uint64_t count,
                        const uint64_t *want, const void *got, unsigned width)
{
    for (uint64_t i = 0; i < count + GUARD; i++) {
        const uint64_t g = width == 4 ? ((const uint32_t *)got)[i] : ((const uint64_t *)got)[i];
        const uint64_t w = i < count ? want[i] : width == 4 ? (uint32_t)SENTINEL : SENTINEL;
        if (g != w)
            fail_msg("%s %s u%u: n=%llu flip=%u start=%llu count=%llu: [%llu] = %llu, want %llu%s", gc->name, what,
                     width * 8, (unsigned long long)p->n, p->keys.flip, (unsigned long long)start,
                     (unsigned long long)count, (unsigned long long)i, (unsigned long long)g,
                     (unsigned long long)w, i >= count ? " (written past the end)" : "");
    }
}

/* σ over [start, start + count) by every generator, u64 and (where ids fit) u32. */
static void check_range(const gen_case *gens, size_t ngens, const pd_perm *p, uint64_t start, uint64_t count)
{
    uint64_t *want = xmalloc(count * 8);
    uint64_t *got = xmalloc((count + GUARD) * 8);
    uint32_t *got32 = xmalloc((count + GUARD) * 4);
    assert_int_equal(pd_perm_fill_u64(p, start, count, want), PD_OK);
    for (size_t k = 0; k < ngens; k++) {
        for (uint64_t i = 0; i < count + GUARD; i++)
            got[i] = SENTINEL;
        assert_int_equal(pd_gen_fill_u64(&gens[k].g, p, start, count, got), PD_OK);
        expect_same(&gens[k], "range", p, start, count, want, got, 8);
        if (p->n <= P2(32)) {
            memset(got32, 0xA5, (count + GUARD) * 4);
            assert_int_equal(pd_gen_fill_u32(&gens[k].g, p, start, count, got32), PD_OK);
            expect_same(&gens[k], "range", p, start, count, want, got32, 4);
        } else {
            assert_int_equal(pd_gen_fill_u32(&gens[k].g, p, start, count, got32), PD_EOVERFLOW);
        }
    }
    free(want);
    free(got);
    free(got32);
}

/* A window of up to `count` positions around pos, inside [0, n). */
static void check_around(const gen_case *gens, size_t ngens, const pd_perm *p, uint64_t pos, uint64_t count)
{
    if (count > p->n)
        count = p->n;
    uint64_t start = pos > count / 2 ? pos - count / 2 : 0;
    if (start > p->n - count)
        start = p->n - count;
    check_range(gens, ngens, p, start, count);
}

/* A rank's slice by every generator against pd_slice_fill_*. */
static void check_slice(const gen_case *gens, size_t ngens, const pd_perm *p, const pd_slice *s, uint64_t count)
{
    uint64_t *want = xmalloc(count * 8);
    uint64_t *got = xmalloc((count + GUARD) * 8);
    uint32_t *got32 = xmalloc((count + GUARD) * 4);
    uint64_t nwant = 0, ngot = 0;
    assert_int_equal(pd_slice_fill_u64(p, s, count, want, &nwant), PD_OK);
    for (size_t k = 0; k < ngens; k++) {
        for (uint64_t i = 0; i < count + GUARD; i++)
            got[i] = SENTINEL;
        assert_int_equal(pd_gen_slice_fill_u64(&gens[k].g, p, s, count, got, &ngot), PD_OK);
        assert_int_equal(ngot, nwant);
        expect_same(&gens[k], pd_mode_name(s->mode), p, s->offset, nwant, want, got, 8);
        memset(got32, 0xA5, (count + GUARD) * 4);
        if (p->n <= P2(32)) {
            assert_int_equal(pd_gen_slice_fill_u32(&gens[k].g, p, s, count, got32, &ngot), PD_OK);
            assert_int_equal(ngot, nwant);
            expect_same(&gens[k], pd_mode_name(s->mode), p, s->offset, nwant, want, got32, 4);
        } else {
            assert_int_equal(pd_gen_slice_fill_u32(&gens[k].g, p, s, count, got32, &ngot), PD_EOVERFLOW);
        }
    }
    free(want);
    free(got);
    free(got32);
}

/* Positions whose walk passes through v: the kernels' inside test (v < n)
 * is exercised exactly at its edges, which random positions would almost
 * never reach (at b = 63 the band s0 = n >> rbits is 2^-31 of the domain). */
static void check_walk_through(const gen_case *gens, size_t ngens, const pd_perm *p, uint64_t v)
{
    if (v >> p->bits)
        return;
    uint64_t w = v;
    for (int step = 0; step < 200; step++) { /* back along f's cycle to a position */
        w = pd__f_inv(p, w, PD_ROUNDS, 1);
        if (w < p->n) {
            check_around(gens, ngens, p, w, 97);
            return;
        }
    }
}

static void check_walk_edges(const gen_case *gens, size_t ngens, const pd_perm *p)
{
    const uint64_t n = p->n, top = (n >> p->rbits) << p->rbits, nl = n & p->rmask;
    const uint64_t values[] = {n - 1, n, n + 1, (UINT64_C(1) << p->bits) - 1, top, top + nl - 1, top + nl + 1,
                               top + p->rmask, top + (UINT64_C(1) << 31) - 1, top + (UINT64_C(1) << 31),
                               top + (UINT64_C(1) << 31) + 1};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
        check_walk_through(gens, ngens, p, values[i]);
}

/* Sizes around every boundary the kernels care about: b even and odd (d = 0
 * and 1), n = 2^b (no walk), just above (the longest walks), 4^k + 1,
 * ids of exactly 32 bits, the first wide n, and the top of the domain. */
static const uint64_t sizes[] = {
    1, 2, 3, 5, 31, 63, 64, 65, 100, 127, 128, 129, 1000, 1023, 1024, 1025, 4097, 5000,
    P2(16) - 1, P2(16), P2(16) + 1, P2(20) - 1, P2(20), P2(20) + 1, P2(21) + 1, P2(26) + 1, P2(26),
    1000000000, P2(31) + 1, P2(32) - 1, P2(32), P2(32) + 1, P2(33) + 1, P2(34) + 1, P2(40) - 1,
    P2(47) + 1, P2(62) + 1, P2(62) + P2(31) + 5, P2(63) - 1, P2(63),
};

static const uint64_t counts[] = {1, 2, 7, 23, 63, 64, 65, 100, 257, 1000, 4099};

static void check_sizes(const gen_case *gens, size_t ngens)
{
    uint64_t rng = 0x5eed;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const uint64_t n = sizes[i];
        pd_perm ps[2];
        perms_both_flips(n, 0xC0FFEE + i, ps);
        for (int f = 0; f < 2; f++) {
            const pd_perm *p = &ps[f];
            if (n <= 5000) { /* everything, in one request */
                check_range(gens, ngens, p, 0, n);
                continue;
            }
            check_range(gens, ngens, p, 0, 4099);              /* aligned start */
            check_range(gens, ngens, p, n - 1000, 1000);       /* the very end */
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) /* unaligned starts, odd counts */
                check_range(gens, ngens, p, test_below(&rng, n - counts[c] + 1), counts[c]);
            check_walk_edges(gens, ngens, p);
            /* The parity flip only changes the ids 0 and 1: make sure they are produced. */
            uint64_t pos;
            for (uint64_t id = 0; id < 2; id++) {
                assert_int_equal(pd_perm_position(p, id, &pos), PD_OK);
                check_around(gens, ngens, p, pos, 301);
            }
        }
    }
}

static void check_known_vectors(const gen_case *gens, size_t ngens)
{
    for (size_t i = 0; i < VEC_COUNT(vec_permutation); i++) {
        const struct vec_map *v = &vec_permutation[i];
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, v->seed, v->epoch, PD_STREAM_SAMPLES, v->n), PD_OK);
        for (size_t j = 0; j < v->count; j++) {
            /* A window of 200 around the position, so the SIMD path (not the short-run scalar one) answers. */
            const uint64_t len = v->n < 200 ? v->n : 200;
            const uint64_t start = v->in[j] < v->n - len ? v->in[j] : v->n - len;
            uint64_t *got = xmalloc(len * 8);
            for (size_t k = 0; k < ngens; k++) {
                assert_int_equal(pd_gen_fill_u64(&gens[k].g, &p, start, len, got), PD_OK);
                if (got[v->in[j] - start] != v->out[j])
                    fail_msg("%s: vector %zu: σ(%llu) = %llu, want %llu", gens[k].name, i,
                             (unsigned long long)v->in[j], (unsigned long long)got[v->in[j] - start],
                             (unsigned long long)v->out[j]);
            }
            free(got);
        }
    }
}

static void check_slices(const gen_case *gens, size_t ngens)
{
    static const uint64_t slice_sizes[] = {1, 2, 5, 1000, 65537, P2(26) + 1, P2(32), P2(32) + 1, P2(40) - 1, P2(63)};
    static const uint32_t worlds[] = {1, 2, 3, 8, 1000, 70001, UINT32_MAX};
    uint64_t rng = 0x511ce;
    for (size_t i = 0; i < sizeof slice_sizes / sizeof slice_sizes[0]; i++) {
        const uint64_t n = slice_sizes[i];
        pd_perm ps[2];
        perms_both_flips(n, 77 + i, ps);
        for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
            for (int mode = PD_MODE_PAD; mode <= PD_MODE_EXACT; mode++) {
                pd_slice s = {.world = worlds[w], .mode = (pd_mode)mode};
                uint64_t len;
                assert_int_equal(pd_epoch_length(n, s.world, s.mode, &len), PD_OK);
                const pd_perm *p = &ps[(w + (size_t)mode) & 1];
                /* From the start, from a random offset, and up to the end (pad's wrapped tail). */
                const uint64_t offsets[3] = {0, test_below(&rng, len + 1), len > 3000 * (uint64_t)s.world ? len - 3000 * (uint64_t)s.world : 0};
                for (int o = 0; o < 3; o++) {
                    s.offset = offsets[o];
                    s.rank = (uint32_t)test_below(&rng, s.world);
                    check_slice(gens, ngens, p, &s, 1 + test_below(&rng, 3500));
                }
                s.offset = len; /* past T: empty, not an error */
                s.rank = s.world - 1;
                check_slice(gens, ngens, p, &s, 10);
            }
        }
    }
}

static void check_isa(pd_isa isa)
{
    gen_case gens[8];
    const size_t n = gens_for(isa, gens);
    if (n == 0) {
        print_message("skipped: this CPU (or build) has no %s kernel\n", pd_isa_name(isa));
        skip();
    }
    for (size_t i = 0; i < n; i++)
        print_message("checking %s\n", gens[i].name);
    check_known_vectors(gens, n);
    check_sizes(gens, n);
    check_slices(gens, n);
}

/* ---- Tests */

static void scalar_matches_core(void **state)
{
    (void)state;
    check_isa(PD_ISA_SCALAR);
}

static void avx2_matches_core(void **state)
{
    (void)state;
    check_isa(PD_ISA_AVX2);
}

static void avx512_matches_core(void **state)
{
    (void)state;
    check_isa(PD_ISA_AVX512);
}

static void isa_detection_and_names(void **state)
{
    (void)state;
    const pd_isa best = pd_cpu_best_isa();
    print_message("best ISA here: %s\n", pd_isa_name(best));
    assert_true(best >= PD_ISA_SCALAR && best <= PD_ISA_AVX512);
    assert_int_equal(pd_cpu_best_isa(), best); /* cached, stable */
    assert_true(pd_cpu_has_isa(PD_ISA_SCALAR) && pd_cpu_has_isa(PD_ISA_AUTO) && pd_cpu_has_isa(best));
    for (int i = (int)best + 1; i <= PD_ISA_AVX512; i++) /* nothing better than the best */
        assert_false(pd_cpu_has_isa((pd_isa)i));
    for (int i = PD_ISA_SCALAR; i <= PD_ISA_AVX512; i++)
        print_message("%-7s %s\n", pd_isa_name((pd_isa)i), pd_cpu_has_isa((pd_isa)i) ? "available" : "absent");
    assert_false(pd_cpu_has_isa((pd_isa)42));

    pd_gen g;
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), PD_OK);
    assert_int_equal(g.isa, best);
    assert_int_equal(g.walk, PD_WALK_AUTO);

    for (int i = PD_ISA_AUTO; i <= PD_ISA_AVX512; i++) {
        pd_isa back;
        assert_int_equal(pd_isa_parse(pd_isa_name((pd_isa)i), &back), PD_OK);
        assert_int_equal(back, i);
    }
    pd_isa isa;
    assert_int_equal(pd_isa_parse("sse9", &isa), PD_EINVAL);
    assert_int_equal(pd_isa_parse(NULL, &isa), PD_EINVAL);
    assert_int_equal(pd_isa_parse("avx2", NULL), PD_EINVAL);
    assert_string_equal(pd_isa_name((pd_isa)9), "?");
    assert_string_equal(pd_walk_name(PD_WALK_REFILL), "refill");
    assert_string_equal(pd_walk_name((pd_walk)9), "?");
}

static void bad_generators(void **state)
{
    (void)state;
    pd_gen g;
    assert_int_equal(pd_gen_init(NULL, PD_ISA_AUTO), PD_EINVAL);
    assert_int_equal(pd_gen_init(&g, (pd_isa)7), PD_EINVAL);
    for (int i = PD_ISA_AVX2; i <= PD_ISA_AVX512; i++) {
        assert_int_equal(pd_gen_init(&g, (pd_isa)i), pd_cpu_has_isa((pd_isa)i) ? PD_OK : PD_EUNSUPPORTED);
        if (pd_cpu_has_isa((pd_isa)i)) /* AVX2's helpers serve AVX-512 too, where the CPU (not SIMDe) has AVX2 */
            assert_int_equal(g.avx2, pd_cpu_has_isa(PD_ISA_AVX2));
    }

    assert_int_equal(pd_gen_init(&g, PD_ISA_SCALAR), PD_OK);
    assert_int_equal(g.avx2, 0); /* the scalar generator runs no SIMD helper */
    assert_int_equal(pd_gen_set_walk(&g, PD_WALK_REFILL), PD_EUNSUPPORTED);
    assert_int_equal(pd_gen_set_walk(&g, PD_WALK_AUTO), PD_OK);
    assert_int_equal(pd_gen_set_walk(&g, (pd_walk)17), PD_EINVAL);
    assert_int_equal(pd_gen_set_walk(NULL, PD_WALK_AUTO), PD_EINVAL);
    if (pd_cpu_has_isa(PD_ISA_AVX512)) {
        assert_int_equal(pd_gen_init(&g, PD_ISA_AVX512), PD_OK);
        assert_int_equal(pd_gen_set_walk(&g, PD_WALK_REFILL_SCALAR), PD_EUNSUPPORTED);
    }

    /* A hand-made generator for an ISA this CPU lacks (or no ISA) must not run. */
    pd_perm p;
    uint32_t out[4];
    assert_int_equal(pd_perm_init(&p, 1, 2, 0, 100), PD_OK);
    const pd_gen junk = {.isa = (pd_isa)99, .walk = PD_WALK_AUTO};
    assert_int_equal(pd_gen_fill_u32(&junk, &p, 0, 4, out), PD_EINVAL);
    const pd_gen unset = {.isa = PD_ISA_AUTO, .walk = PD_WALK_AUTO};
    assert_int_equal(pd_gen_fill_u32(&unset, &p, 0, 4, out), PD_EINVAL);
    if (!pd_cpu_has_isa(PD_ISA_AVX512)) {
        const pd_gen absent = {.isa = PD_ISA_AVX512, .walk = PD_WALK_AUTO};
        assert_int_equal(pd_gen_fill_u32(&absent, &p, 0, 4, out), PD_EUNSUPPORTED);
    }
}

/* Every bad argument gets the core's code, from the generator and the pool alike. */
static void bad_arguments_match_core(void **state)
{
    (void)state;
    pd_gen g;
    pd_pool *pool;
    pd_perm small, big;
    uint64_t o64[8], written = 0;
    uint32_t o32[8];
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), PD_OK);
    assert_int_equal(pd_pool_create(2, &g, &pool), PD_OK);
    assert_int_equal(pd_perm_init(&small, 1, 2, 0, 10), PD_OK);
    assert_int_equal(pd_perm_init(&big, 1, 2, 0, P2(32) + 1), PD_OK);

    static const struct {
        int p_big, null_p, null_out;
        uint64_t start, count;
        int want64, want32;
    } ranges[] = {
        {0, 1, 0, 0, 1, PD_EINVAL, PD_EINVAL},
        {0, 0, 1, 0, 1, PD_EINVAL, PD_EINVAL},
        {0, 0, 1, 0, 0, PD_OK, PD_OK},       /* nothing to write: no buffer needed */
        {0, 0, 0, 10, 0, PD_OK, PD_OK},      /* the empty range at the end */
        {0, 0, 0, 11, 0, PD_ERANGE, PD_ERANGE},
        {0, 0, 0, 5, 6, PD_ERANGE, PD_ERANGE},
        {0, 0, 0, 0, UINT64_MAX, PD_ERANGE, PD_ERANGE},
        {1, 0, 0, 0, 4, PD_OK, PD_EOVERFLOW},
        {1, 0, 0, P2(32), 4, PD_ERANGE, PD_ERANGE}, /* range beats width, as in the core */
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        const pd_perm *p = ranges[i].null_p ? NULL : ranges[i].p_big ? &big : &small;
        uint64_t *b64 = ranges[i].null_out ? NULL : o64;
        uint32_t *b32 = ranges[i].null_out ? NULL : o32;
        const uint64_t st = ranges[i].start, ct = ranges[i].count;
        assert_int_equal(pd_perm_fill_u64(p, st, ct, b64), ranges[i].want64);
        assert_int_equal(pd_perm_fill_u32(p, st, ct, b32), ranges[i].want32);
        assert_int_equal(pd_gen_fill_u64(&g, p, st, ct, b64), ranges[i].want64);
        assert_int_equal(pd_gen_fill_u32(&g, p, st, ct, b32), ranges[i].want32);
        assert_int_equal(pd_pool_fill_u64(pool, p, st, ct, b64), ranges[i].want64);
        assert_int_equal(pd_pool_fill_u32(pool, p, st, ct, b32), ranges[i].want32);
    }
    assert_int_equal(pd_gen_fill_u64(NULL, &small, 0, 1, o64), PD_EINVAL);
    assert_int_equal(pd_pool_fill_u64(NULL, &small, 0, 1, o64), PD_EINVAL);

    static const struct {
        int p_big, null_s, null_out, null_written;
        uint32_t world, rank;
        int mode;
        uint64_t offset, count;
        int want64, want32;
    } slices[] = {
        {0, 1, 0, 0, 1, 0, PD_MODE_PAD, 0, 1, PD_EINVAL, PD_EINVAL},
        {0, 0, 1, 0, 1, 0, PD_MODE_PAD, 0, 1, PD_EINVAL, PD_EINVAL},
        {0, 0, 0, 1, 1, 0, PD_MODE_PAD, 0, 1, PD_EINVAL, PD_EINVAL},
        {0, 0, 0, 0, 0, 0, PD_MODE_PAD, 0, 1, PD_EINVAL, PD_EINVAL},   /* W = 0 */
        {0, 0, 0, 0, 3, 3, PD_MODE_PAD, 0, 1, PD_EINVAL, PD_EINVAL},   /* r ≥ W */
        {0, 0, 0, 0, 3, 0, 7, 0, 1, PD_EINVAL, PD_EINVAL},             /* no such mode */
        {0, 0, 0, 0, 3, 0, PD_MODE_PAD, 13, 1, PD_ERANGE, PD_ERANGE},  /* offset > T = 12 */
        {0, 0, 0, 0, 3, 0, PD_MODE_PAD, 12, 1, PD_OK, PD_OK},          /* offset = T: empty */
        {0, 0, 0, 0, 3, 0, PD_MODE_DROP, 10, 1, PD_ERANGE, PD_ERANGE}, /* offset > T = 9 */
        {1, 0, 0, 0, 3, 1, PD_MODE_EXACT, 0, 8, PD_OK, PD_EOVERFLOW},
    };
    for (size_t i = 0; i < sizeof slices / sizeof slices[0]; i++) {
        const pd_perm *p = slices[i].p_big ? &big : &small;
        pd_slice sl = {.world = slices[i].world, .rank = slices[i].rank, .mode = (pd_mode)slices[i].mode,
                       .offset = slices[i].offset};
        const pd_slice *s = slices[i].null_s ? NULL : &sl;
        uint64_t *b64 = slices[i].null_out ? NULL : o64;
        uint32_t *b32 = slices[i].null_out ? NULL : o32;
        uint64_t *wr = slices[i].null_written ? NULL : &written;
        const uint64_t ct = slices[i].count;
        assert_int_equal(pd_slice_fill_u64(p, s, ct, b64, wr), slices[i].want64);
        assert_int_equal(pd_slice_fill_u32(p, s, ct, b32, wr), slices[i].want32);
        assert_int_equal(pd_gen_slice_fill_u64(&g, p, s, ct, b64, wr), slices[i].want64);
        assert_int_equal(pd_gen_slice_fill_u32(&g, p, s, ct, b32, wr), slices[i].want32);
        assert_int_equal(pd_pool_slice_fill_u64(pool, p, s, ct, b64, wr), slices[i].want64);
        assert_int_equal(pd_pool_slice_fill_u32(pool, p, s, ct, b32, wr), slices[i].want32);
    }
    pd_slice sl = {.world = 1, .mode = PD_MODE_EXACT};
    assert_int_equal(pd_gen_slice_fill_u64(NULL, &small, &sl, 1, o64, &written), PD_EINVAL);
    assert_int_equal(pd_gen_slice_fill_u64(&g, NULL, &sl, 1, o64, &written), PD_EINVAL);
    assert_int_equal(pd_pool_slice_fill_u64(NULL, &small, &sl, 1, o64, &written), PD_EINVAL);
    pd_pool_destroy(pool);

    assert_int_equal(pd_pool_create(2, &g, NULL), PD_EINVAL);
    assert_int_equal(pd_pool_create(1u << 20, &g, &pool), PD_EINVAL);
    const pd_gen junk = {.isa = (pd_isa)99, .walk = PD_WALK_AUTO};
    assert_int_equal(pd_pool_create(2, &junk, &pool), PD_EINVAL);
    assert_null(pool);
    pd_pool_destroy(NULL); /* a no-op */
}

/* Large requests split into chunks across threads, against the core. */
static void pool_matches_core(void **state)
{
    (void)state;
    static const unsigned threads[] = {1, 2, 3, 0};
    const uint64_t count = 300007; /* several chunks, and a ragged last one */
    uint64_t *want = xmalloc(count * 8), *got = xmalloc((count + GUARD) * 8);
    uint32_t *got32 = xmalloc((count + GUARD) * 4);
    const gen_case whole = {.name = "pool"};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        pd_pool *pool = NULL;
        assert_int_equal(pd_pool_create(threads[t], NULL, &pool), PD_OK);
        assert_true(pd_pool_threads(pool) >= 1);
        if (threads[t])
            assert_int_equal(pd_pool_threads(pool), threads[t]);
        static const uint64_t ns[] = {P2(26) + 1, P2(20), P2(40) + 3};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            pd_perm p;
            assert_int_equal(pd_perm_init(&p, 9, 10 + t, 0, ns[i]), PD_OK);
            const uint64_t start = ns[i] - count - 5;
            assert_int_equal(pd_perm_fill_u64(&p, start, count, want), PD_OK);
            for (uint64_t j = 0; j < count + GUARD; j++)
                got[j] = SENTINEL;
            assert_int_equal(pd_pool_fill_u64(pool, &p, start, count, got), PD_OK);
            expect_same(&whole, "range", &p, start, count, want, got, 8);
            if (ns[i] <= P2(32)) {
                memset(got32, 0xA5, (count + GUARD) * 4);
                assert_int_equal(pd_pool_fill_u32(pool, &p, start, count, got32), PD_OK);
                expect_same(&whole, "range", &p, start, count, want, got32, 4);
            }
            /* A slice with a wrapped tail: pad mode, the last rank, up to T. */
            pd_slice s = {.world = 3, .rank = 2, .mode = PD_MODE_PAD};
            uint64_t len, nwant, ngot;
            assert_int_equal(pd_epoch_length(ns[i], 3, PD_MODE_PAD, &len), PD_OK);
            s.offset = len - 3 * (count - 1) - 3;
            assert_int_equal(pd_slice_fill_u64(&p, &s, count, want, &nwant), PD_OK);
            for (uint64_t j = 0; j < count + GUARD; j++)
                got[j] = SENTINEL;
            assert_int_equal(pd_pool_slice_fill_u64(pool, &p, &s, count, got, &ngot), PD_OK);
            assert_int_equal(ngot, nwant);
            expect_same(&whole, "pad slice", &p, s.offset, nwant, want, got, 8);
            if (ns[i] <= P2(32)) {
                memset(got32, 0xA5, (count + GUARD) * 4);
                assert_int_equal(pd_pool_slice_fill_u32(pool, &p, &s, count, got32, &ngot), PD_OK);
                assert_int_equal(ngot, nwant);
                expect_same(&whole, "pad slice", &p, s.offset, nwant, want, got32, 4);
            }
        }
        pd_pool_destroy(pool);
    }
    free(want);
    free(got);
    free(got32);
}

/* Several threads share one pool, as the daemon's workers will. cmocka's
 * asserts are not thread-safe, so the threads count mismatches instead. */
typedef struct pool_client {
    pd_pool *pool;
    uint64_t seed;
    uint64_t bad;
} pool_client;

static void *pool_client_main(void *arg)
{
    pool_client *c = arg;
    /* requests of two chunks up to many: how many helpers join each (tickets, the polling bound) varies */
    static const uint64_t req_counts[] = {150001, 2 * PD_POOL_CHUNK_MIN, 3 * PD_POOL_CHUNK_MIN + 7, 5000};
    const uint64_t n = P2(26) + 1;
    uint32_t *want = malloc(req_counts[0] * 4), *got = malloc(req_counts[0] * 4);
    if (!want || !got) {
        c->bad = UINT64_MAX;
        goto out;
    }
    for (uint64_t round = 0; round < 8; round++) {
        const uint64_t count = req_counts[(round + c->seed) % 4];
        pd_perm p;
        const uint64_t start = (c->seed * 7919 + round * 100003) % (n - count);
        if (pd_perm_init(&p, c->seed, round, 0, n) || pd_perm_fill_u32(&p, start, count, want) ||
            pd_pool_fill_u32(c->pool, &p, start, count, got)) {
            c->bad++;
            continue;
        }
        for (uint64_t i = 0; i < count; i++)
            c->bad += got[i] != want[i];
    }
out:
    free(want);
    free(got);
    return NULL;
}

static void pool_shared_by_threads(void **state)
{
    (void)state;
    enum { CLIENTS = 4 };
    static const unsigned pool_threads[] = {3, 6}; /* 6: more helpers than most requests have chunks for */
    for (size_t t = 0; t < sizeof pool_threads / sizeof pool_threads[0]; t++) {
        pd_pool *pool;
        pthread_t tid[CLIENTS];
        pool_client clients[CLIENTS];
        assert_int_equal(pd_pool_create(pool_threads[t], NULL, &pool), PD_OK);
        assert_int_equal(pd_pool_set_spin(pool, 200000), PD_OK); /* helpers poll between the clients' requests */
        for (int i = 0; i < CLIENTS; i++) {
            clients[i] = (pool_client){.pool = pool, .seed = (uint64_t)i + 1};
            assert_int_equal(pthread_create(&tid[i], NULL, pool_client_main, &clients[i]), 0);
        }
        for (int i = 0; i < CLIENTS; i++) {
            assert_int_equal(pthread_join(tid[i], NULL), 0);
            assert_int_equal(clients[i].bad, 0);
        }
        pd_pool_destroy(pool);
    }
}

/* Polling (pd_pool_set_spin). Requests of two trivial chunks, the first of which waits (up to 10 s) until
 * the other has started: so a helper takes part in each request, and each request ends right after the
 * helper's chunk, while it polls. The next request, sent at once, is then caught by a polling helper, and
 * never by one that does not poll. Timing-free: the chunks' work is nothing, whatever the build (hold_ns:
 * the helper's chunk sleeps that long, so that requests last longer than the helpers poll). */
typedef struct spin_probe {
    _Atomic int started;
    _Atomic int stuck; /* chunk 0 gave up waiting for the other */
    long hold_ns;
} spin_probe;

static void spin_chunk(const pd_gen *g, void *ctx, uint64_t begin, uint64_t count)
{
    (void)g;
    (void)count;
    spin_probe *p = ctx;
    atomic_fetch_add(&p->started, 1);
    if (begin) {
        if (p->hold_ns)
            nanosleep(&(struct timespec){.tv_nsec = p->hold_ns}, NULL);
        return;
    }
    const double end = test_now_s() + 10;
    while (atomic_load(&p->started) < 2) {
        if (test_now_s() > end) {
            atomic_store(&p->stuck, 1);
            return;
        }
        sched_yield(); /* valgrind runs the other thread only at a system call */
    }
}

/* One round of pool_spin's mode (see there) on a fresh pool: four requests of two chunks, every chunk run once and
 * none stuck, and the pool's ids still right; returns the requests its helper caught polling. */
static uint64_t spin_round(int mode, const pd_perm *p, uint64_t count, const uint32_t *want, uint32_t *got)
{
    pd_pool *pool;
    uint64_t caught, slept;
    assert_int_equal(pd_pool_create(2, NULL, &pool), PD_OK);
    assert_int_equal(pd_pool_set_spin(pool, PD_POOL_SPIN_MAX_NS + 1), PD_EINVAL);
    const uint64_t spin = mode == 0 ? 0 : mode == 1 ? PD_POOL_SPIN_MAX_NS : 1000000;
    assert_int_equal(pd_pool_set_spin(pool, spin), PD_OK);
    spin_probe probe[4];
    for (int r = 0; r < 4; r++) {
        if (mode == 2)
            nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
        atomic_init(&probe[r].started, 0);
        atomic_init(&probe[r].stuck, 0);
        probe[r].hold_ns = mode == 3 ? 3000000 : 0;
        pd__pool_run(pool, 2 * PD_POOL_CHUNK_MIN, spin_chunk, &probe[r]); /* two chunks */
    }
    for (int r = 0; r < 4; r++)
        assert_true(atomic_load(&probe[r].started) == 2 && !atomic_load(&probe[r].stuck));
    pd_pool_counts(pool, &caught, &slept);
    memset(got, 0xA5, count * 4); /* and the same ids either way */
    assert_int_equal(pd_pool_fill_u32(pool, p, 0, count, got), PD_OK);
    assert_memory_equal(got, want, count * 4);
    pd_pool_destroy(pool); /* a polling helper sees the stop (pending) and exits: no waiting out its 100 ms */
    return caught;
}

static void pool_spin(void **state)
{
    (void)state;
    pd_perm p;
    uint64_t caught, slept;
    const uint64_t count = 300007;
    uint32_t *want = xmalloc(count * 4), *got = xmalloc(count * 4);
    assert_int_equal(pd_perm_init(&p, 5, 6, 0, P2(30) + 7), PD_OK);
    assert_int_equal(pd_perm_fill_u32(&p, 0, count, want), PD_OK);
    assert_int_equal(pd_pool_set_spin(NULL, 0), PD_EINVAL);
    pd_pool_counts(NULL, &caught, &slept);
    assert_true(caught == 0 && slept == 0);
    /* Modes: 0 no polling; 1 polling, requests back to back; 2 polling up to 1 ms, requests 5 ms apart;
     * 3 polling up to 1 ms, requests of 3 ms back to back (each comes 3 ms after the last came, but at
     * once after it ended: the gap the helper polls through). */
    for (int mode = 0; mode < 4; mode++) {
        caught = spin_round(mode, &p, count, want, got);
        if (mode == 0 || mode == 2) { /* no polling, or requests further apart than it would poll: every one wakes it */
            assert_int_equal(caught, 0);
            continue;
        }
        if (test_quick()) /* (valgrind runs one thread at a time: its 100 ms may pass unpolled) */
            continue;
        /* Requests 3-4 (from 2 on, the pool knows they come back to back) are caught, but a helper the OS did not
         * run while they came (both cores busy with other tests) misses them. Five rounds were not always enough
         * under ctest -j2 beside the SIMDe tests (mode 3 polls 1 ms, less than a busy core's time slice): rounds
         * for up to 5 s; polling that never catches fails them all. */
        for (const double end = test_now_s() + 5; caught < 2 && test_now_s() < end;)
            caught = spin_round(mode, &p, count, want, got);
        assert_true(caught >= 2);
    }
    free(want);
    free(got);
}

/* A negative control for the comparison itself: a generator run on other
 * keys must be caught, so the checks above are able to fail. */
static void comparison_can_fail(void **state)
{
    (void)state;
    pd_gen g;
    pd_perm p, q;
    uint64_t a[1000], b[1000];
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), PD_OK);
    assert_int_equal(pd_perm_init(&p, 1, 1, 0, P2(26) + 1), PD_OK);
    assert_int_equal(pd_perm_init(&q, 1, 2, 0, P2(26) + 1), PD_OK);
    assert_int_equal(pd_perm_fill_u64(&p, 0, 1000, a), PD_OK);
    assert_int_equal(pd_gen_fill_u64(&g, &q, 0, 1000, b), PD_OK);
    assert_true(memcmp(a, b, sizeof a) != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(isa_detection_and_names),
        cmocka_unit_test(bad_generators),
        cmocka_unit_test(bad_arguments_match_core),
        cmocka_unit_test(comparison_can_fail),
        cmocka_unit_test(scalar_matches_core),
        cmocka_unit_test(avx2_matches_core),
        cmocka_unit_test(avx512_matches_core),
        cmocka_unit_test(pool_matches_core),
        cmocka_unit_test(pool_shared_by_threads),
        cmocka_unit_test(pool_spin),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
