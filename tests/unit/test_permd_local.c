/* Tests for client/permd_local.c: libpermd's offline calls give the core's answers and its errors. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/rank.h"
#include "core/shards.h"

static void test_perm_fill_and_inverse(void **state)
{
    (void)state;
    const uint64_t n = 1000003;
    pd_perm p;
    pd_perm_init(&p, 11, 12, PD_STREAM_SAMPLES, n);
    uint32_t a[100];
    uint64_t b[100], pos[100];
    assert_int_equal(permd_perm_fill(11, 12, n, 500, 100, a, 4), 0);
    assert_int_equal(permd_perm_fill(11, 12, n, 500, 100, b, 8), 0);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(a[i], pd_perm_at(&p, 500 + (uint64_t)i));
        assert_int_equal(b[i], a[i]);
    }
    assert_int_equal(permd_perm_inverse(11, 12, n, b, 100, pos), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(pos[i], 500 + (uint64_t)i);

    assert_int_equal(permd_perm_fill(11, 12, n, n - 5, 6, b, 8), PERMD_ERANGE);
    assert_int_equal(permd_perm_fill(11, 12, 0, 0, 1, b, 8), PERMD_EINVAL);
    assert_int_equal(permd_perm_fill(11, 12, (UINT64_C(1) << 32) + 1, 0, 1, a, 4), PERMD_EOVERFLOW);
    assert_int_equal(permd_perm_fill(11, 12, n, 0, 1, a, 3), PERMD_EINVAL);
    b[3] = n;
    pos[0] = 77;
    assert_int_equal(permd_perm_inverse(11, 12, n, b, 5, pos), PERMD_ERANGE);
    assert_int_equal(pos[0], 77); /* nothing written */
}

static void test_ranks(void **state)
{
    (void)state;
    uint64_t len, left, got, ids[64], want[64];
    assert_int_equal(permd_epoch_length(10, 4, PERMD_MODE_PAD, &len), 0);
    assert_int_equal(len, 12);
    assert_int_equal(permd_epoch_length(10, 4, PERMD_MODE_DROP, &len), 0);
    assert_int_equal(len, 8);
    assert_int_equal(permd_epoch_length(10, 4, 3, &len), PERMD_EINVAL);
    assert_int_equal(permd_rank_remaining(10, 4, 3, PERMD_MODE_EXACT, 0, &left), 0);
    assert_int_equal(left, 2); /* positions 3 and 7 */
    assert_int_equal(permd_rank_remaining(10, 4, 3, PERMD_MODE_EXACT, 11, &left), PERMD_ERANGE);
    assert_int_equal(permd_rank_remaining(10, 4, 4, PERMD_MODE_EXACT, 0, &left), PERMD_EINVAL);

    pd_perm p;
    pd_slice s = {7, 2, PD_MODE_PAD, 14};
    pd_perm_init(&p, 3, 4, PD_STREAM_SAMPLES, 1000);
    pd_slice_fill_u64(&p, &s, 64, want, &got);
    uint64_t got2;
    assert_int_equal(permd_rank_fill(3, 4, 1000, 7, 2, PERMD_MODE_PAD, 14, 64, ids, 8, &got2), 0);
    assert_int_equal(got2, got);
    assert_memory_equal(ids, want, got * sizeof *ids);
    uint32_t ids32[64];
    assert_int_equal(permd_rank_fill(3, 4, 1000, 7, 2, PERMD_MODE_PAD, 14, 64, ids32, 4, &got2), 0);
    for (uint64_t i = 0; i < got; i++)
        assert_int_equal(ids32[i], want[i]);
    assert_int_equal(permd_rank_fill(3, 4, 1000, 7, 2, PERMD_MODE_PAD, 14, 64, ids, 8, NULL), PERMD_EINVAL);
    assert_int_equal(permd_rank_fill(3, 4, 1000, 7, 2, -1, 14, 64, ids, 8, &got2), PERMD_EINVAL);
}

/* A plan's rank fill (the CPU's bulk kernels) against the core's pd_shard_slice_fill, u32 and u64. */
static void test_plan_rank_fill(void **state)
{
    (void)state;
    enum { S = 300, COUNT = 20000 };
    uint64_t sizes[S], start[S + 1], rng = 17, got, want_n;
    for (int i = 0; i < S; i++)
        sizes[i] = test_below(&rng, 9) == 0 ? 0 : 1 + test_below(&rng, 500);
    assert_int_equal(pd_shard_layout_build(sizes, S, start), 0);
    uint64_t *want = malloc(COUNT * 8), *ids = malloc(COUNT * 8);
    uint32_t *ids32 = malloc(COUNT * 4);
    void *mem = malloc(pd_shard_plan_bytes(S));
    assert_non_null(want);
    assert_non_null(ids);
    assert_non_null(ids32);
    assert_non_null(mem);
    static const struct {
        uint64_t window;
        uint32_t lanes, world, rank;
        int mode;
        uint64_t offset;
    } cases[] = {{8, 1, 1, 0, PERMD_MODE_EXACT, 0}, {8, 4, 4, 3, PERMD_MODE_PAD, 400}, {3, 8, 2, 1, PERMD_MODE_DROP, 7},
                 {64, 3, 8, 5, PERMD_MODE_PAD, 80}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        permd_plan *plan;
        pd_shard_plan core;
        assert_int_equal(permd_plan_new(5, c, sizes, S, cases[c].window, cases[c].lanes, &plan), 0);
        assert_int_equal(pd_shard_plan_init(&core, start, S, 5, c, cases[c].window, cases[c].lanes, mem,
                                            pd_shard_plan_bytes(S)),
                         0);
        pd_slice s = {cases[c].world, cases[c].rank, (pd_mode)cases[c].mode, cases[c].offset};
        assert_int_equal(pd_shard_slice_fill_u64(&core, &s, COUNT, want, &want_n), 0);
        assert_true(want_n > 1000);
        assert_int_equal(permd_plan_rank_fill(plan, s.world, s.rank, cases[c].mode, s.offset, COUNT, ids, 8, &got), 0);
        assert_int_equal(got, want_n);
        assert_memory_equal(ids, want, got * 8);
        assert_int_equal(permd_plan_rank_fill(plan, s.world, s.rank, cases[c].mode, s.offset, COUNT, ids32, 4, &got), 0);
        assert_int_equal(got, want_n);
        for (uint64_t i = 0; i < got; i++)
            assert_int_equal(ids32[i], want[i]);
        assert_int_equal(permd_plan_rank_fill(plan, s.world, s.rank, cases[c].mode, s.offset, COUNT, ids, 8, NULL),
                         PERMD_EINVAL);
        permd_plan_free(plan);
    }
    free(want);
    free(ids);
    free(ids32);
    free(mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perm_fill_and_inverse),
        cmocka_unit_test(test_ranks),
        cmocka_unit_test(test_plan_rank_fill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
