/* The CUDA backend against the scalar core, bit for bit: ranges, slices, payload shuffles, bad input.
 * Exits 77 (ctest: skipped) with a message when the machine has no GPU. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rank.h"
#include "gpu/permd_gpu.h"
#include "gpu_test.h"

static pd_gpu *gpu;

/* Sizes worth trying: edges of the widths, just above powers (longest walks), > 2^32, 2^63. */
static uint64_t pick_n(uint64_t *rng, int i)
{
    static const uint64_t fixed[] = {1, 2, 3, 63, 64, 65, 1000, 4097, (UINT64_C(1) << 20) + 1, UINT64_C(1) << 20,
                                     (UINT64_C(1) << 32) - 1, UINT64_C(1) << 32, (UINT64_C(1) << 32) + 1,
                                     (UINT64_C(1) << 40) + 3, (UINT64_C(1) << 63) - 1, UINT64_C(1) << 63};
    if (i < (int)(sizeof fixed / sizeof fixed[0]))
        return fixed[i];
    uint32_t k = 1 + (uint32_t)test_below(rng, 62);
    switch (test_below(rng, 4)) {
    case 0: return (UINT64_C(1) << k) + 1;
    case 1: return (UINT64_C(1) << k) - (k > 1);
    case 2: return k <= 31 ? (UINT64_C(1) << (2 * k)) + 1 : (UINT64_C(1) << k) + 1; /* 4^k + 1 */
    default: return 1 + test_below(rng, UINT64_C(1) << k);
    }
}

static void compare_ranges(pd_gpu_walk walk)
{
    uint64_t rng = 11 + (uint64_t)walk;
    const uint64_t cap = 1 << 17;
    uint64_t *want = malloc(cap * 8), *got = malloc(cap * 8);
    void *dev = NULL;
    assert_non_null(want);
    assert_non_null(got);
    assert_int_equal(pd_gpu_alloc(gpu, cap * 8, &dev), PD_OK);
    assert_int_equal(pd_gpu_set_walk(gpu, walk), PD_OK);
    for (int i = 0; i < 80; i++) {
        uint64_t n = pick_n(&rng, i), count = n < cap ? n : 1 + test_below(&rng, cap);
        uint64_t start = test_below(&rng, n - count + 1);
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, test_rand(&rng), test_rand(&rng), 0, n), PD_OK);
        assert_int_equal(pd_perm_fill_u64(&p, start, count, want), PD_OK);
        for (unsigned width = 4; width <= 8; width += 4) {
            int rc = pd_gpu_perm_fill(gpu, &p, start, count, dev, width);
            if (width == 4 && pd_id_width(n) == 8) {
                assert_int_equal(rc, PD_EOVERFLOW);
                continue;
            }
            assert_int_equal(rc, PD_OK);
            assert_int_equal(pd_gpu_sync(gpu), PD_OK);
            assert_int_equal(pd_gpu_copy_to_host(gpu, got, dev, count * width), PD_OK);
            for (uint64_t j = 0; j < count; j++) {
                uint64_t g = width == 4 ? ((uint32_t *)got)[j] : got[j];
                if (g != want[j])
                    fail_msg("walk %d n=%llu start=%llu j=%llu width %u: gpu %llu core %llu", walk,
                             (unsigned long long)n, (unsigned long long)start, (unsigned long long)j, width,
                             (unsigned long long)g, (unsigned long long)want[j]);
            }
        }
    }
    pd_gpu_free(gpu, dev);
    free(want);
    free(got);
}

static void ranges_match_core_auto(void **state)
{
    (void)state;
    compare_ranges(PD_GPU_WALK_AUTO);
}

static void ranges_match_core_refill(void **state)
{
    (void)state;
    compare_ranges(PD_GPU_WALK_REFILL);
}

static void ranges_match_core_staged(void **state)
{
    (void)state;
    compare_ranges(PD_GPU_WALK_STAGED);
}

static void ranges_match_core_naive(void **state)
{
    (void)state;
    compare_ranges(PD_GPU_WALK_NAIVE);
}



static void slices_match_core(void **state)
{
    (void)state;
    uint64_t rng = 5;
    const uint64_t cap = 1 << 15;
    uint64_t *want = malloc(cap * 8), *got = malloc(cap * 8), *host = malloc(cap * 8);
    void *dev = NULL;
    assert_int_equal(pd_gpu_alloc(gpu, cap * 8, &dev), PD_OK);
    assert_int_equal(pd_gpu_set_walk(gpu, PD_GPU_WALK_AUTO), PD_OK);
    for (int i = 0; i < 120; i++) {
        uint64_t n = pick_n(&rng, i % 16 + (i >= 16 ? 16 : 0));
        pd_perm p;
        pd_slice s = {.world = 1 + (uint32_t)test_below(&rng, 100), .mode = (pd_mode)test_below(&rng, 3)};
        uint64_t len, w1, w2, w3;
        s.rank = (uint32_t)test_below(&rng, s.world);
        assert_int_equal(pd_perm_init(&p, test_rand(&rng), (uint64_t)i, 0, n), PD_OK);
        assert_int_equal(pd_epoch_length(n, s.world, s.mode, &len), PD_OK);
        s.offset = test_below(&rng, 3) == 0 ? len - (len > 50 ? 50 : len) : test_below(&rng, len + 1);
        uint64_t count = 1 + test_below(&rng, cap);
        assert_int_equal(pd_slice_fill_u64(&p, &s, count, want, &w1), PD_OK);
        assert_int_equal(pd_gpu_slice_fill(gpu, &p, &s, count, dev, 8, &w2), PD_OK);
        assert_int_equal(pd_gpu_sync(gpu), PD_OK);
        assert_int_equal(w1, w2);
        assert_int_equal(pd_gpu_copy_to_host(gpu, got, dev, w2 * 8), PD_OK);
        assert_int_equal(pd_gpu_slice_fill_host(gpu, &p, &s, count, host, 8, &w3), PD_OK);
        assert_int_equal(w1, w3);
        for (uint64_t j = 0; j < w1; j++) {
            assert_true(got[j] == want[j]);
            assert_true(host[j] == want[j]);
        }
        if (pd_id_width(n) == 4) { /* the daemon's width for datasets up to 2^32 */
            assert_int_equal(pd_gpu_slice_fill_host(gpu, &p, &s, count, host, 4, &w3), PD_OK);
            assert_int_equal(w1, w3);
            for (uint64_t j = 0; j < w1; j++)
                assert_true(((uint32_t *)host)[j] == want[j]);
        }
    }
    pd_gpu_free(gpu, dev);
    free(want);
    free(got);
    free(host);
}

/* Past what one launch covers: the host fill's 2^24-id chunks (the second holding a pad position's wrap) and
 * grid-stride loops that go round more than once (every walk, n = 2^k, which takes NAIVE, and 2^k + 1). The
 * tests above stay below both. */
static void large_requests_match_core(void **state)
{
    (void)state;
    const uint64_t count = (UINT64_C(1) << 24) + 1000;
    uint64_t *want = malloc(count * 8), *got = malloc(count * 8), w1, w2;
    void *dev = NULL;
    assert_non_null(want);
    assert_non_null(got);
    assert_int_equal(pd_gpu_alloc(gpu, count * 8, &dev), PD_OK);
    /* rank 1 of 2, pad mode, n odd: its last position is n, which wraps to σ(0) */
    const uint64_t n = 50000017, left = (n + 1) / 2;
    pd_perm p;
    pd_slice s = {.world = 2, .rank = 1, .mode = PD_MODE_PAD, .offset = 2 * (left - count)};
    assert_int_equal(pd_perm_init(&p, 31, 4, 0, n), PD_OK);
    assert_int_equal(pd_slice_fill_u64(&p, &s, count, want, &w1), PD_OK);
    assert_int_equal(w1, count);
    assert_int_equal(want[count - 1], pd_perm_at(&p, 0));
    for (unsigned width = 4; width <= 8; width += 4) {
        memset(got, 0, count * 8);
        assert_int_equal(pd_gpu_slice_fill_host(gpu, &p, &s, count, got, width, &w2), PD_OK);
        assert_int_equal(w2, count);
        for (uint64_t j = 0; j < count; j++)
            if ((width == 4 ? ((uint32_t *)got)[j] : got[j]) != want[j])
                fail_msg("host fill, width %u: id %llu differs", width, (unsigned long long)j);
    }
    static const pd_gpu_walk walks[] = {PD_GPU_WALK_AUTO, PD_GPU_WALK_NAIVE, PD_GPU_WALK_REFILL, PD_GPU_WALK_STAGED};
    for (int k = 0; k < 2; k++) {
        const uint64_t m = (UINT64_C(1) << 26) + (uint64_t)k, start = 12345;
        assert_int_equal(pd_perm_init(&p, 7, 9, 0, m), PD_OK);
        assert_int_equal(pd_perm_fill_u64(&p, start, count, want), PD_OK);
        for (size_t w = 0; w < sizeof walks / sizeof walks[0]; w++) {
            assert_int_equal(pd_gpu_set_walk(gpu, walks[w]), PD_OK);
            assert_int_equal(pd_gpu_perm_fill(gpu, &p, start, count, dev, 8), PD_OK);
            assert_int_equal(pd_gpu_sync(gpu), PD_OK);
            assert_int_equal(pd_gpu_copy_to_host(gpu, got, dev, count * 8), PD_OK);
            if (memcmp(got, want, count * 8))
                fail_msg("n = 2^26 + %d, walk %d: the ids differ from the core's", k, (int)walks[w]);
        }
    }
    assert_int_equal(pd_gpu_set_walk(gpu, PD_GPU_WALK_AUTO), PD_OK);
    pd_gpu_free(gpu, dev);
    free(want);
    free(got);
}

/* Gather: out[i] = in[σ(i)], for every element width. */
static void gather_follows_sigma(void **state)
{
    (void)state;
    const uint64_t ns[] = {1, 5, 64, 1000, 65537, 1 << 20};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        uint64_t n = ns[t];
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, 3, t, 0, n), PD_OK);
        for (size_t es = 1; es <= 16; es *= 2) {
            unsigned char *in = malloc(n * es), *out = malloc(n * es);
            void *din, *dout;
            for (uint64_t i = 0; i < n * es; i++)
                in[i] = (unsigned char)(i * 131 + i / 7);
            assert_int_equal(pd_gpu_alloc(gpu, n * es, &din), PD_OK);
            assert_int_equal(pd_gpu_alloc(gpu, n * es, &dout), PD_OK);
            assert_int_equal(pd_gpu_copy_to_device(gpu, din, in, n * es), PD_OK);
            for (int walk = PD_GPU_WALK_AUTO; walk <= PD_GPU_WALK_STAGED; walk++) {
                assert_int_equal(pd_gpu_set_walk(gpu, (pd_gpu_walk)walk), PD_OK);
                memset(out, 0, n * es);
                assert_int_equal(pd_gpu_copy_to_device(gpu, dout, out, n * es), PD_OK);
                assert_int_equal(pd_gpu_gather(gpu, &p, din, dout, es), PD_OK);
                assert_int_equal(pd_gpu_sync(gpu), PD_OK);
                assert_int_equal(pd_gpu_copy_to_host(gpu, out, dout, n * es), PD_OK);
                for (uint64_t i = 0; i < n; i++)
                    assert_memory_equal(out + i * es, in + pd_perm_at(&p, i) * es, es);
            }
            assert_int_equal(pd_gpu_set_walk(gpu, PD_GPU_WALK_AUTO), PD_OK);
            pd_gpu_free(gpu, din);
            pd_gpu_free(gpu, dout);
            free(in);
            free(out);
        }
    }
}

/* The fused shuffle keeps the paper's compaction order: f(i) < n, in i order. */
static void fused_is_compaction_order(void **state)
{
    (void)state;
    const uint64_t ns[] = {5, 100, 4097, (1 << 20) + 1, 1 << 21};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        uint64_t n = ns[t];
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, 9, t, 0, n), PD_OK);
        uint64_t *in = malloc(n * 8), *out = malloc(n * 8);
        for (uint64_t i = 0; i < n; i++)
            in[i] = i * 3 + 1;
        void *din, *dout;
        assert_int_equal(pd_gpu_alloc(gpu, n * 8, &din), PD_OK);
        assert_int_equal(pd_gpu_alloc(gpu, n * 8, &dout), PD_OK);
        assert_int_equal(pd_gpu_copy_to_device(gpu, din, in, n * 8), PD_OK);
        assert_int_equal(pd_gpu_shuffle_fused(gpu, &p, din, dout, 8), PD_OK);
        assert_int_equal(pd_gpu_sync(gpu), PD_OK);
        assert_int_equal(pd_gpu_copy_to_host(gpu, out, dout, n * 8), PD_OK);
        uint64_t k = 0;
        for (uint64_t i = 0; i < (UINT64_C(1) << p.bits); i++) {
            uint64_t v = pd__f(&p, i, PD_ROUNDS, 1);
            if (v < n) {
                assert_true(out[k] == in[v]);
                k++;
            }
        }
        assert_int_equal(k, n);
        pd_gpu_free(gpu, din);
        pd_gpu_free(gpu, dout);
        free(in);
        free(out);
    }
}

static void bad_arguments(void **state)
{
    (void)state;
    pd_perm p;
    void *dev;
    uint64_t w;
    pd_slice s = {.world = 2, .rank = 2, .mode = PD_MODE_PAD};
    assert_int_equal(pd_perm_init(&p, 1, 1, 0, 100), PD_OK);
    assert_int_equal(pd_gpu_alloc(gpu, 800, &dev), PD_OK);
    assert_int_equal(pd_gpu_perm_fill(gpu, &p, 0, 101, dev, 8), PD_ERANGE);
    assert_int_equal(pd_gpu_perm_fill(gpu, &p, 0, 10, dev, 2), PD_EINVAL);
    assert_int_equal(pd_gpu_perm_fill(NULL, &p, 0, 10, dev, 8), PD_EINVAL);
    assert_int_equal(pd_gpu_perm_fill(gpu, &p, 0, 10, NULL, 8), PD_EINVAL);
    assert_int_equal(pd_gpu_slice_fill(gpu, &p, &s, 10, dev, 8, &w), PD_EINVAL);
    s.rank = 0;
    s.offset = 101;
    assert_int_equal(pd_gpu_slice_fill(gpu, &p, &s, 10, dev, 8, &w), PD_ERANGE);
    assert_int_equal(pd_gpu_gather(gpu, &p, dev, dev, 3), PD_EINVAL);
    /* misaligned or in place: refused before a launch (a misaligned load is a sticky error: the context is lost) */
    void *other;
    assert_int_equal(pd_gpu_alloc(gpu, 100 * 16 + 16, &other), PD_OK);
    assert_int_equal(pd_gpu_gather(gpu, &p, dev, dev, 8), PD_EINVAL);
    assert_int_equal(pd_gpu_gather(gpu, &p, (char *)other + 8, dev, 16), PD_EINVAL);
    assert_int_equal(pd_gpu_gather(gpu, &p, other, (char *)dev + 2, 4), PD_EINVAL);
    assert_int_equal(pd_gpu_shuffle_fused(gpu, &p, (char *)other + 1, dev, 2), PD_EINVAL);
    assert_int_equal(pd_gpu_gather(gpu, &p, other, (char *)other + 400, 8), PD_EINVAL); /* overlapping by half */
    assert_int_equal(pd_gpu_gather(gpu, &p, (char *)other + 792, other, 8), PD_EINVAL); /* by one element */
    assert_int_equal(pd_gpu_gather(gpu, &p, other, (char *)other + 800, 8), PD_OK);     /* end to end */
    assert_int_equal(pd_gpu_gather(gpu, &p, other, dev, 8), PD_OK); /* the context is fine */
    assert_int_equal(pd_gpu_sync(gpu), PD_OK);
    pd_gpu_free(gpu, other);
    assert_int_equal(pd_gpu_set_walk(gpu, (pd_gpu_walk)7), PD_EINVAL);
    pd_gpu *none = NULL;
    assert_int_equal(pd_gpu_open(1000, &none), PD_EUNSUPPORTED);
    assert_null(none);
    pd_gpu_free(gpu, dev);
}

int main(void)
{
    int rc = gpu_test_open(&gpu);
    if (rc)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranges_match_core_auto),
        cmocka_unit_test(ranges_match_core_refill),
        cmocka_unit_test(ranges_match_core_staged),
        cmocka_unit_test(ranges_match_core_naive),
        cmocka_unit_test(slices_match_core),
        cmocka_unit_test(large_requests_match_core),
        cmocka_unit_test(gather_follows_sigma),
        cmocka_unit_test(fused_is_compaction_order),
        cmocka_unit_test(bad_arguments),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    pd_gpu_close(gpu);
    return rc;
}
