/* Tests for client/permd_local.c: libpermd's offline calls (permutations, ranks, mixtures) give the core's answers and its errors. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/digest.h"
#include "core/rank.h"
#include "core/shards.h"
#include "mix_util.h"

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

/* Mixtures: every call equals the core over the same plan, errors are typed. */
static void test_mixtures(void **state)
{
    (void)state;
    const uint64_t sizes[3] = {100, 7, 1000}, starts[2] = {0, 640};
    const uint32_t weights[6] = {1, 1, 2, 3, 0, 1};
    permd_mixture *m;
    owned_mix o;
    assert_int_equal(permd_mixture_new(9, sizes, 3, 0, 0, starts, weights, 2, &m), 0);
    assert_int_equal(mix_make(&o, 9, sizes, 3, 0, 64, starts, weights, 2), 0);
    assert_true(permd_mixture_length(m) == 1107 && permd_mixture_size(m) == 1107);
    assert_int_equal(permd_mixture_components(m), 3);
    assert_int_equal(permd_mixture_block(m), PERMD_MIX_BLOCK_DEFAULT);
    uint64_t seed, start;
    assert_int_equal(permd_mixture_component_seed(m, 2, &seed), 0);
    assert_true(seed == o.mix.comp_seed[2]);
    assert_int_equal(permd_mixture_component_seed(m, 3, &seed), PERMD_ERANGE);
    assert_int_equal(permd_mixture_stage_start(m, 2, 5, &start), 0);
    assert_true(start == (2 * 1107 + 5 + 63) / 64 * 64);
    assert_int_equal(permd_mixture_stage_start(m, 0, 1108, &start), PERMD_ERANGE);

    uint64_t ids[600], locals[600], cepochs[600], got, drawn[3], want_drawn[3];
    uint32_t ids32[600], comps[600];
    for (uint32_t world = 1; world <= 5; world += 4) {
        pd_slice s = {.world = world, .rank = world - 1, .mode = PD_MODE_PAD, .offset = 17};
        uint64_t want[600], n;
        assert_int_equal(pd_mix_slice_fill_u64(&o.cur, 3, &s, 600, want, &n), 0);
        assert_int_equal(permd_mixture_rank_fill(m, 3, world, world - 1, PERMD_MODE_PAD, 17, 600, ids, 8, &got), 0);
        assert_true(got == n);
        assert_int_equal(permd_mixture_rank_fill(m, 3, world, world - 1, PERMD_MODE_PAD, 17, 600, ids32, 4, &got), 0);
        assert_int_equal(permd_mixture_rank_locations(m, 3, world, world - 1, PERMD_MODE_PAD, 17, 600, comps, locals,
                                                      cepochs, &got),
                         0);
        assert_true(got == n);
        for (uint64_t i = 0; i < n; i++) {
            assert_true(ids[i] == want[i] && ids32[i] == want[i]);
            assert_true(o.mix.offset[comps[i]] + locals[i] == want[i]);
            uint64_t e, p;
            assert_int_equal(permd_mixture_position(m, comps[i], locals[i], cepochs[i], &e, &p), 0);
            assert_true(e == 3 && p == (17 + world - 1 + i * world) % 1107);
        }
        permd_digest d;
        pd_digest pd;
        assert_int_equal(permd_mixture_rank_digest(m, 3, world, world - 1, PERMD_MODE_PAD, 17, &d), 0);
        assert_int_equal(pd_digest_mix_slice(&o.cur, 3, &s, &pd), 0);
        assert_true(d.count == pd.count && d.sum == pd.sum && d.hash == pd.hash);
    }
    uint64_t sample, local, ce;
    uint32_t comp;
    pd_mix_loc loc;
    assert_int_equal(permd_mixture_locate(m, 5, 1000, &sample, &comp, &local, &ce), 0);
    assert_int_equal(pd_mix_locate(&o.cur, 5, 1000, &loc), 0);
    assert_true(sample == loc.sample && comp == loc.component && local == loc.local && ce == loc.epoch);
    assert_int_equal(permd_mixture_locate(m, 5, 1000, NULL, NULL, NULL, NULL), 0);
    assert_int_equal(permd_mixture_drawn(m, 1, 1107, drawn), 0);
    assert_int_equal(pd_mix_draws_before(&o.mix, 2 * 1107, want_drawn), 0);
    assert_memory_equal(drawn, want_drawn, sizeof drawn);

    /* errors */
    assert_int_equal(permd_mixture_locate(m, 0, 1107, &sample, NULL, NULL, NULL), PERMD_ERANGE);
    assert_int_equal(permd_mixture_locate(m, UINT64_MAX, 0, &sample, NULL, NULL, NULL), PERMD_EINVAL);
    assert_int_equal(permd_mixture_position(m, 1, 3, 100, &sample, &local), PERMD_ENOTFOUND); /* off from 640 on */
    assert_int_equal(permd_mixture_position(m, 0, 100, 0, &sample, &local), PERMD_ERANGE);
    assert_int_equal(permd_mixture_rank_fill(m, 0, 2, 2, PERMD_MODE_PAD, 0, 5, ids, 8, &got), PERMD_EINVAL);
    assert_int_equal(permd_mixture_rank_fill(m, 0, 2, 0, 7, 0, 5, ids, 8, &got), PERMD_EINVAL);
    assert_int_equal(permd_mixture_rank_fill(m, 0, 2, 0, PERMD_MODE_PAD, 0, 5, ids, 3, &got), PERMD_EINVAL);
    assert_int_equal(permd_mixture_rank_fill(m, 0, 2, 0, PERMD_MODE_PAD, 1109, 5, ids, 8, &got), PERMD_ERANGE);
    assert_int_equal(permd_mixture_rank_locations(m, 0, 2, 0, PERMD_MODE_PAD, 0, 5, NULL, NULL, NULL, NULL),
                     PERMD_EINVAL);
    assert_int_equal(permd_mixture_rank_digest(NULL, 0, 1, 0, 0, 0, NULL), PERMD_EINVAL);
    permd_mixture_free(m);
    mix_free(&o);

    permd_mixture *bad = NULL;
    const uint64_t unaligned[2] = {0, 100}, zero_size[1] = {0};
    assert_int_equal(permd_mixture_new(1, sizes, 3, 0, 0, unaligned, weights, 2, &bad), PERMD_EINVAL);
    assert_int_equal(permd_mixture_new(1, sizes, 3, 0, 100, starts, weights, 2, &bad), PERMD_EINVAL);
    assert_int_equal(permd_mixture_new(1, sizes, 0, 0, 0, starts, weights, 2, &bad), PERMD_EINVAL);
    assert_int_equal(permd_mixture_new(1, zero_size, 1, 0, 0, starts, weights, 1, &bad), PERMD_EINVAL);
    assert_int_equal(permd_mixture_new(1, sizes, 3, 0, 0, starts, weights, 2, NULL), PERMD_EINVAL);
    assert_null(bad);
    permd_mixture_free(NULL);

    /* a sharded component: the same as the core's over the same layout */
    const uint64_t shard_sizes[5] = {4, 0, 9, 1, 6};
    const permd_mix_component comps2[2] = {{.size = 50}, {.shard_sizes = shard_sizes, .nshards = 5, .window = 2}};
    const uint64_t *shards[2] = {NULL, shard_sizes}, nshards[2] = {0, 5}, windows[2] = {0, 2}, lanes[2] = {0, 1};
    const uint64_t sizes2[2] = {50, 20};
    assert_int_equal(permd_mixture_new_ex(4, comps2, 2, 0, 128, starts, weights, 1, &m), 0);
    assert_int_equal(mix_make_ex(&o, 4, sizes2, shards, nshards, windows, lanes, 2, 0, 128, starts, weights, 1), 0);
    for (uint64_t p = 0; p < 70; p++) {
        assert_int_equal(permd_mixture_locate(m, 7, p, &sample, &comp, &local, &ce), 0);
        assert_int_equal(pd_mix_locate(&o.cur, 7, p, &loc), 0);
        assert_true(sample == loc.sample && comp == loc.component && local == loc.local);
    }
    const permd_mix_component empty[1] = {{.shard_sizes = shard_sizes, .nshards = 0}};
    assert_int_equal(permd_mixture_new_ex(4, empty, 1, 0, 0, starts, weights, 1, &bad), PERMD_EINVAL);
    permd_mixture_free(m);
    mix_free(&o);
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
        cmocka_unit_test(test_mixtures),
        cmocka_unit_test(test_plan_rank_fill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
