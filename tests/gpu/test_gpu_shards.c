/* The GPU's sharded epochs against the core's, bit for bit: layouts with empty and huge shards, K, G, W, modes, widths, both kernels, small windows' rounds and wide ones.
 * Exits 77 (ctest: skipped) with a message when the machine has no GPU. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/shards.h"
#include "gpu/permd_gpu.h"
#include "gpu_test.h"

static pd_gpu *gpu;

/* A layout of S shards: mostly small and uneven, some empty, now and then one that dwarfs the rest. */
static uint64_t *make_layout(uint64_t *rng, uint64_t S, uint64_t big)
{
    uint64_t *sizes = malloc(S * 8), *start = malloc((S + 1) * 8);
    assert_non_null(sizes);
    assert_non_null(start);
    for (uint64_t i = 0; i < S; i++) {
        uint64_t r = test_below(rng, 16);
        sizes[i] = r == 0 ? 0 : r == 1 && big ? big : 1 + test_below(rng, 300);
    }
    sizes[test_below(rng, S)] += 1; /* never all empty */
    assert_int_equal(pd_shard_layout_build(sizes, S, start), PD_OK);
    free(sizes);
    return start;
}

/* One plan, every width, a few ranks and offsets: GPU (device and host output) == core. */
static void compare_plan(const pd_shard_plan *plan, uint64_t *rng)
{
    pd_gpu_plan *dp;
    assert_int_equal(pd_gpu_plan_upload(gpu, plan, &dp), PD_OK);
    const uint64_t cap = 1 << 16;
    uint64_t *want = malloc(cap * 16), *got = malloc(cap * 16);
    pd_shard_loc *locs = malloc(cap * sizeof *locs);
    void *dev;
    assert_int_equal(pd_gpu_alloc(gpu, cap * 16, &dev), PD_OK);
    for (int trial = 0; trial < 6; trial++) {
        uint32_t world = trial == 0 ? 1 : 1 + (uint32_t)test_below(rng, 64);
        pd_slice s = {world, (uint32_t)test_below(rng, world), (pd_mode)(trial % 3), 0}; /* every mode, at 0 and not */
        uint64_t left;
        if (pd_slice_remaining(plan->n, &s, &left))
            continue;
        s.offset = trial % 2 ? world * test_below(rng, left + 1) : 0;
        uint64_t count = 1 + test_below(rng, cap), w_core, w_gpu;
        int rc = pd_slice_remaining(plan->n, &s, &left); /* exact mode: W·k may pass T */
        if (rc) {
            assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &s, count, got, 8, &w_gpu), rc);
            continue;
        }
        /* u64 and locations always; u32 when N fits */
        assert_int_equal(pd_shard_slice_fill_u64(plan, &s, count, want, &w_core), PD_OK);
        assert_int_equal(pd_gpu_shard_slice_fill(gpu, dp, &s, count, dev, 8, &w_gpu), PD_OK);
        assert_int_equal(pd_gpu_sync(gpu), PD_OK);
        assert_int_equal(w_gpu, w_core);
        assert_int_equal(pd_gpu_copy_to_host(gpu, got, dev, w_gpu * 8), PD_OK);
        assert_memory_equal(got, want, w_core * 8);
        memset(got, 0, cap * 8);
        assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &s, count, got, 8, &w_gpu), PD_OK);
        assert_int_equal(w_gpu, w_core);
        assert_memory_equal(got, want, w_core * 8);

        assert_int_equal(pd_shard_slice_fill_locs(plan, &s, count, locs, &w_core), PD_OK);
        for (uint64_t i = 0; i < w_core; i++) {
            want[2 * i] = locs[i].shard;
            want[2 * i + 1] = locs[i].offset;
        }
        assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &s, count, got, 16, &w_gpu), PD_OK);
        assert_int_equal(w_gpu, w_core);
        assert_memory_equal(got, want, w_core * 16);

        if (plan->n <= UINT64_C(1) << 32) {
            assert_int_equal(pd_shard_slice_fill_u32(plan, &s, count, (uint32_t *)want, &w_core), PD_OK);
            assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &s, count, got, 4, &w_gpu), PD_OK);
            assert_int_equal(w_gpu, w_core);
            assert_memory_equal(got, want, w_core * 4);
        } else {
            assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &s, count, got, 4, &w_gpu), PD_EOVERFLOW);
        }
    }
    pd_gpu_free(gpu, dev);
    pd_gpu_plan_free(gpu, dp);
    free(want);
    free(got);
    free(locs);
}

static void shards_match_core(void **state)
{
    (void)state;
    uint64_t rng = 2026;
    static const uint64_t shard_counts[] = {1, 2, 3, 7, 64, 1000, 4099};
    static const uint64_t windows[] = {1, 2, 3, 8, 1000, UINT64_C(1) << 40};
    static const uint64_t lanes[] = {1, 2, 3, 8, 17};
    for (size_t i = 0; i < sizeof shard_counts / sizeof shard_counts[0]; i++) {
        uint64_t S = shard_counts[i];
        uint64_t *start = make_layout(&rng, S, i % 3 == 2 ? UINT64_C(1) << 33 : 0); /* some N > 2^32 */
        size_t bytes = pd_shard_plan_bytes(S);
        void *mem = malloc(bytes);
        for (size_t k = 0; k < sizeof windows / sizeof windows[0]; k++)
            for (size_t g = 0; g < sizeof lanes / sizeof lanes[0]; g++) {
                if (lanes[g] > start[S])
                    continue;
                pd_shard_plan plan;
                assert_int_equal(pd_shard_plan_init(&plan, start, S, 7 + i, k * 5 + g, windows[k], lanes[g], mem,
                                                    bytes),
                                 PD_OK);
                compare_plan(&plan, &rng);
            }
        free(mem);
        free(start);
    }
}

/* One slice into device memory (u64), GPU == core, in want and got (count u64 each). */
static void compare_device_u64(const pd_shard_plan *plan, pd_gpu_plan *dp, const pd_slice *s, uint64_t count,
                               uint64_t *want, uint64_t *got)
{
    uint64_t w_core, w_gpu;
    void *dev;
    assert_int_equal(pd_gpu_alloc(gpu, count * 8 + 8, &dev), PD_OK);
    memset(got, 0xa5, count * 8); /* a position the kernel never wrote cannot pass on what an earlier call left */
    assert_int_equal(pd_gpu_copy_to_device(gpu, dev, got, count * 8), PD_OK);
    assert_int_equal(pd_shard_slice_fill_u64(plan, s, count, want, &w_core), PD_OK);
    assert_int_equal(pd_gpu_shard_slice_fill(gpu, dp, s, count, dev, 8, &w_gpu), PD_OK);
    assert_int_equal(pd_gpu_sync(gpu), PD_OK);
    assert_int_equal(w_gpu, w_core);
    assert_int_equal(pd_gpu_copy_to_host(gpu, got, dev, w_gpu * 8), PD_OK);
    for (uint64_t i = 0; i < w_core; i++)
        if (got[i] != want[i])
            fail_msg("u64: S=%llu K=%llu G=%llu W=%u rank=%u mode=%d offset=%llu count=%llu: [%llu] = %llu, want %llu",
                     (unsigned long long)plan->shards, (unsigned long long)plan->window,
                     (unsigned long long)plan->lanes, s->world, s->rank, (int)s->mode, (unsigned long long)s->offset,
                     (unsigned long long)count, (unsigned long long)i, (unsigned long long)got[i],
                     (unsigned long long)want[i]);
    pd_gpu_free(gpu, dev);
}

/* One slice, every width, GPU (device and host output) == core. */
static void compare_slice(const pd_shard_plan *plan, pd_gpu_plan *dp, const pd_slice *s, uint64_t count)
{
    uint64_t *want = malloc(count * 16 + 16), *got = malloc(count * 16 + 16), w_core, w_gpu;
    pd_shard_loc *locs = malloc(count * sizeof *locs + 1);
    assert_non_null(want);
    assert_non_null(got);
    assert_non_null(locs);
    compare_device_u64(plan, dp, s, count, want, got);
    if (plan->n <= UINT64_C(1) << 32) {
        assert_int_equal(pd_shard_slice_fill_u32(plan, s, count, (uint32_t *)want, &w_core), PD_OK);
        assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, s, count, got, 4, &w_gpu), PD_OK);
        assert_int_equal(w_gpu, w_core);
        assert_memory_equal(got, want, w_core * 4);
    }
    assert_int_equal(pd_shard_slice_fill_locs(plan, s, count, locs, &w_core), PD_OK);
    for (uint64_t i = 0; i < w_core; i++) {
        want[2 * i] = locs[i].shard;
        want[2 * i + 1] = locs[i].offset;
    }
    assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, s, count, got, 16, &w_gpu), PD_OK);
    assert_int_equal(w_gpu, w_core);
    assert_memory_equal(got, want, w_core * 16);
    free(want);
    free(got);
    free(locs);
}

/* The tile kernel (warps taking tiles of a rank's positions) on the shapes that pick its paths: long
 * runs and short ones, segments of many runs and of both parities of b, windows of one sample,
 * windows with more slots than shared memory holds (the plan searched in global memory), bucket
 * searches among many tiny shards, windows of 2^32 samples and more (the per-position kernel),
 * lanes that do not divide W (m > 1), odd lanes backward, pad's wrapped tail, requests of many
 * tiles per warp; windows of at most 2^17 samples (rounds of one 32-bit multiply) and larger ones. */
static void runs_match_core(void **state)
{
    (void)state;
    uint64_t rng = 1717;
    static const struct {
        uint64_t shards, size; /* size 0: random (empty and single-sample shards among them); 1000003:
                                  skewed (one shard of 10^6 every 37, the rest of one sample) */
        uint64_t window, lanes;
        uint32_t world;
        uint64_t count;
    } cases[] = {
        {4096, 1024, 1, 1, 8, 1 << 19},  {4096, 1024, 8, 8, 8, 1 << 19}, {4096, 1000, 64, 1, 8, 1 << 19},
        {2000, 0, 8, 3, 8, 100000},      {2000, 0, 8, 8, 1, 300000},     {2000, 0, 200, 2, 4, 100000},
        {2000, 0, 1000, 1, 2, 200000},   {5000, 1, 1, 1, 3, 1600},       {3000, 1, 4, 2, 2, 1500},
        {300, 0, 2000, 5, 7, 40000},     {64, 40000, 2, 4, 6, 400000},   {4096, 1024, 8, 8, 3, 1 << 20},
        {5000, 1, 1, 1, 40, 2000}, /* one-sample windows 40 apart: each segment searches its first window */
        {2000, 1000003, 64, 1, 8, 300000}, /* a bucket's slots: many tiny shards beside a huge one */
        {65536, 0, 64, 1, 8, 1 << 21},     /* a rank's slice of ~2.5 M ids: tiles of no power-of-two size */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint64_t S = cases[c].shards;
        uint64_t *sizes = malloc(S * 8), *start = malloc((S + 1) * 8);
        assert_non_null(sizes);
        assert_non_null(start);
        for (uint64_t i = 0; i < S; i++)
            sizes[i] = cases[c].size == 1000003 ? (i % 37 == 0 ? 1000000 : 1)
                       : cases[c].size         ? cases[c].size
                       : test_below(&rng, 8) == 0 ? test_below(&rng, 2)
                                                  : 1 + test_below(&rng, 700);
        sizes[0] += 1;
        assert_int_equal(pd_shard_layout_build(sizes, S, start), PD_OK);
        size_t bytes = pd_shard_plan_bytes(S);
        void *mem = malloc(bytes);
        pd_shard_plan plan;
        pd_gpu_plan *dp;
        assert_int_equal(pd_shard_plan_init(&plan, start, S, 3, c, cases[c].window, cases[c].lanes, mem, bytes), PD_OK);
        assert_int_equal(pd_gpu_plan_upload(gpu, &plan, &dp), PD_OK);
        for (int mode = PD_MODE_PAD; mode <= PD_MODE_EXACT; mode++) {
            pd_slice s = {cases[c].world, (uint32_t)test_below(&rng, cases[c].world), (pd_mode)mode, 0};
            uint64_t len;
            assert_int_equal(pd_epoch_length(plan.n, s.world, s.mode, &len), PD_OK);
            compare_slice(&plan, dp, &s, cases[c].count); /* from the start */
            s.offset = len > cases[c].count * s.world ? len - cases[c].count * s.world : 0; /* up to T */
            s.rank = s.world - 1;
            compare_slice(&plan, dp, &s, cases[c].count);
        }
        pd_gpu_plan_free(gpu, dp);
        free(mem);
        free(sizes);
        free(start);
    }
    /* windows of 2^32 samples and more */
    const uint64_t huge[5] = {(UINT64_C(1) << 33) + 7, 5, 0, 12, UINT64_C(1) << 32};
    uint64_t start[6];
    uint64_t mem[11];
    assert_int_equal(pd_shard_layout_build(huge, 5, start), PD_OK);
    for (uint64_t k = 1; k <= 5; k += 2) {
        pd_shard_plan plan;
        pd_gpu_plan *dp;
        assert_int_equal(pd_shard_plan_init(&plan, start, 5, 9, k, k, 2, mem, sizeof mem), PD_OK);
        assert_int_equal(pd_gpu_plan_upload(gpu, &plan, &dp), PD_OK);
        pd_slice s = {4, 1, PD_MODE_PAD, UINT64_C(1) << 30};
        compare_slice(&plan, dp, &s, 100000);
        pd_gpu_plan_free(gpu, dp);
    }
}

/* A rank's slice large enough for tiles of several segments and their smaller tiers at the end
 * (over 2 · resident warps · 2048 ids): 16.7 M ids (u64) of 67 M, three subsequences (G = 3, W = 4),
 * against the core. */
static void large_request_matches_core(void **state)
{
    (void)state;
    const uint64_t S = 65536;
    uint64_t *sizes = malloc(S * 8), *start = malloc((S + 1) * 8), rng = 99;
    assert_non_null(sizes);
    assert_non_null(start);
    for (uint64_t i = 0; i < S; i++)
        sizes[i] = 512 + test_below(&rng, 1024);
    assert_int_equal(pd_shard_layout_build(sizes, S, start), PD_OK);
    const size_t bytes = pd_shard_plan_bytes(S);
    void *mem = malloc(bytes);
    pd_shard_plan plan;
    pd_gpu_plan *dp;
    assert_int_equal(pd_shard_plan_init(&plan, start, S, 5, 6, 64, 3, mem, bytes), PD_OK);
    assert_int_equal(pd_gpu_plan_upload(gpu, &plan, &dp), PD_OK);
    const pd_slice s = {4, 1, PD_MODE_EXACT, 0};
    const uint64_t count = plan.n / 4;
    uint64_t *want = malloc(count * 8), *got = malloc(count * 8);
    assert_non_null(want);
    assert_non_null(got);
    compare_device_u64(&plan, dp, &s, count, want, got);
    pd_gpu_plan_free(gpu, dp);
    free(want);
    free(got);
    free(mem);
    free(sizes);
    free(start);
}

static void bad_arguments(void **state)
{
    (void)state;
    uint64_t sizes[2] = {3, 4}, start[3];
    uint64_t mem[5];
    pd_shard_plan plan;
    pd_gpu_plan *dp;
    uint64_t out[16], w;
    assert_int_equal(pd_shard_layout_build(sizes, 2, start), PD_OK);
    assert_int_equal(pd_shard_plan_init(&plan, start, 2, 1, 2, 1, 1, mem, sizeof mem), PD_OK);
    assert_int_equal(pd_gpu_plan_upload(NULL, &plan, &dp), PD_EINVAL);
    assert_int_equal(pd_gpu_plan_upload(gpu, NULL, &dp), PD_EINVAL);
    assert_int_equal(pd_gpu_plan_upload(gpu, &plan, &dp), PD_OK);
    pd_slice ok = {2, 1, PD_MODE_PAD, 0}, bad_rank = {2, 2, PD_MODE_PAD, 0}, past = {2, 0, PD_MODE_PAD, 10};
    assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &ok, 4, out, 3, &w), PD_EINVAL);
    assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &bad_rank, 4, out, 8, &w), PD_EINVAL);
    assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &past, 4, out, 8, &w), PD_ERANGE);
    assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &ok, 4, NULL, 8, &w), PD_EINVAL);
    assert_int_equal(pd_gpu_shard_slice_fill_host(gpu, dp, &ok, 100, out, 8, &w), PD_OK);
    assert_int_equal(w, 4); /* pad: T = 8, rank 1 of 2 has 4 */
    pd_gpu_plan_free(gpu, dp);
    pd_gpu_plan_free(gpu, NULL);
}

int main(void)
{
    int rc = gpu_test_open(&gpu);
    if (rc)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shards_match_core),
        cmocka_unit_test(runs_match_core),
        cmocka_unit_test(large_request_matches_core),
        cmocka_unit_test(bad_arguments),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    pd_gpu_close(gpu);
    return rc;
}
