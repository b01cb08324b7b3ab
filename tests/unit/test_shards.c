/* Tests for core/shards.c: the addendum's known answers, exactly-once coverage, inverse, locality bounds,
 * resume under another world size, and bad input. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/shards.h"
#include "vectors_shards_v1.h"

/* A plan with its own memory, for tests. */
typedef struct owned_plan {
    pd_shard_plan plan;
    uint64_t *start;
    void *mem;
} owned_plan;

static int plan_make(owned_plan *o, const uint64_t *sizes, uint64_t shards, uint64_t seed, uint64_t epoch,
                     uint64_t window, uint64_t lanes)
{
    o->start = malloc((shards + 1) * sizeof *o->start);
    o->mem = malloc(pd_shard_plan_bytes(shards));
    assert_non_null(o->start);
    assert_non_null(o->mem);
    int rc = pd_shard_layout_build(sizes, shards, o->start);
    if (rc == PD_OK)
        rc = pd_shard_plan_init(&o->plan, o->start, shards, seed, epoch, window, lanes, o->mem,
                                pd_shard_plan_bytes(shards));
    return rc;
}

static void plan_free(owned_plan *o)
{
    free(o->start);
    free(o->mem);
}

static void known_answers(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof vec_shards / sizeof vec_shards[0]; i++) {
        const struct vec_shard_case *v = &vec_shards[i];
        owned_plan o;
        assert_int_equal(plan_make(&o, v->sizes, v->nsizes, v->seed, v->epoch, v->window, v->lanes), PD_OK);
        for (size_t j = 0; j < v->npos; j++) {
            pd_shard_loc loc;
            uint64_t back;
            assert_int_equal(pd_shard_locate(&o.plan, v->positions[j], &loc), PD_OK);
            if (loc.sample != v->samples[j])
                fail_msg("case %zu position %llu: sample %llu, want %llu", i, (unsigned long long)v->positions[j],
                         (unsigned long long)loc.sample, (unsigned long long)v->samples[j]);
            assert_true(loc.shard == v->shards[j]);
            assert_true(loc.offset == v->offsets[j]);
            assert_int_equal(pd_shard_position(&o.plan, loc.sample, &back), PD_OK);
            assert_true(back == v->positions[j]);
        }
        for (size_t r = 0; r < v->nranks; r++) {
            const struct vec_shard_rank *vr = &v->ranks[r];
            pd_slice s = {.world = vr->world, .offset = vr->offset};
            assert_int_equal(pd_mode_parse(vr->mode, &s.mode), PD_OK);
            const uint64_t *want = vr->ids;
            for (uint32_t k = 0; k < vr->world; k++) {
                uint64_t got[64], n;
                s.rank = k;
                assert_true(vr->lens[k] <= 64);
                assert_int_equal(pd_shard_slice_fill_u64(&o.plan, &s, vr->lens[k], got, &n), PD_OK);
                assert_int_equal(n, vr->lens[k]);
                for (size_t j = 0; j < n; j++)
                    assert_true(got[j] == want[j]);
                want += vr->lens[k];
            }
        }
        plan_free(&o);
    }
}

/* A random layout: many empty and single-sample shards among larger ones. */
static uint64_t random_layout(uint64_t *rng, uint64_t *sizes, uint64_t max_shards)
{
    uint64_t shards = 1 + test_below(rng, max_shards), total = 0;
    for (uint64_t s = 0; s < shards; s++) {
        switch (test_below(rng, 4)) {
        case 0: sizes[s] = 0; break;
        case 1: sizes[s] = 1; break;
        default: sizes[s] = test_below(rng, 40);
        }
        total += sizes[s];
    }
    if (total == 0)
        sizes[test_below(rng, shards)] = 1 + test_below(rng, 5);
    return shards;
}

static void exactly_once_and_inverse(void **state)
{
    (void)state;
    uint64_t rng = 99, sizes[300];
    uint32_t *hits = malloc(300 * 40 * sizeof *hits);
    uint64_t *ids = malloc(300 * 40 * sizeof *ids);
    pd_shard_loc *locs = malloc(300 * 40 * sizeof *locs);
    for (int trial = 0; trial < 300; trial++) {
        uint64_t shards = random_layout(&rng, sizes, 300);
        uint64_t window = 1 + test_below(&rng, 12), lanes = 1 + test_below(&rng, 9);
        owned_plan o;
        assert_int_equal(plan_make(&o, sizes, shards, test_rand(&rng), (uint64_t)trial, window, lanes), PD_OK);
        uint64_t n = o.plan.n;
        memset(hits, 0, n * sizeof *hits);
        for (uint64_t p = 0; p < n; p++) {
            pd_shard_loc loc;
            uint64_t back;
            assert_int_equal(pd_shard_locate(&o.plan, p, &loc), PD_OK);
            assert_true(loc.sample < n);
            assert_true(loc.offset < sizes[loc.shard]);
            assert_true(o.start[loc.shard] + loc.offset == loc.sample);
            hits[loc.sample]++;
            assert_int_equal(pd_shard_position(&o.plan, loc.sample, &back), PD_OK);
            assert_true(back == p);
        }
        for (uint64_t i = 0; i < n; i++)
            assert_int_equal(hits[i], 1);
        /* every world and mode: ranks' slices partition the stream as in v1 */
        uint32_t world = 1 + (uint32_t)test_below(&rng, 10);
        for (int m = PD_MODE_PAD; m <= PD_MODE_EXACT; m++) {
            uint64_t len, total = 0;
            assert_int_equal(pd_epoch_length(n, world, (pd_mode)m, &len), PD_OK);
            memset(hits, 0, n * sizeof *hits);
            for (uint32_t r = 0; r < world; r++) {
                pd_slice s = {.world = world, .rank = r, .mode = (pd_mode)m};
                uint64_t got, got2;
                assert_int_equal(pd_shard_slice_fill_u64(&o.plan, &s, n + world, ids, &got), PD_OK);
                assert_int_equal(pd_shard_slice_fill_locs(&o.plan, &s, n + world, locs, &got2), PD_OK);
                assert_int_equal(got, got2);
                for (uint64_t k = 0; k < got; k++) {
                    assert_true(locs[k].sample == ids[k]);
                    hits[ids[k]]++;
                }
                total += got;
            }
            assert_int_equal(total, len);
            for (uint64_t i = 0; i < n; i++) {
                if (m == PD_MODE_EXACT)
                    assert_int_equal(hits[i], 1);
                else if (m == PD_MODE_DROP)
                    assert_true(hits[i] <= 1);
                else
                    assert_true(hits[i] >= 1);
            }
        }
        plan_free(&o);
    }
    free(hits);
    free(ids);
    free(locs);
}

/* Largest number of shards open at once for one reader, a shard being open
 * from its first read to its last (docs/spec/shards-v1.md §4). */
static uint64_t max_open(const pd_shard_loc *reads, uint64_t count, uint64_t shards)
{
    uint64_t *first = malloc(shards * sizeof *first), *last = malloc(shards * sizeof *last);
    int64_t *delta = calloc(count + 1, sizeof *delta);
    for (uint64_t s = 0; s < shards; s++)
        first[s] = UINT64_MAX;
    for (uint64_t k = 0; k < count; k++) {
        uint64_t s = reads[k].shard;
        if (first[s] == UINT64_MAX)
            first[s] = k;
        last[s] = k;
    }
    for (uint64_t s = 0; s < shards; s++) {
        if (first[s] != UINT64_MAX) {
            delta[first[s]]++;
            delta[last[s] + 1]--;
        }
    }
    int64_t open = 0, peak = 0;
    for (uint64_t k = 0; k < count; k++) {
        open += delta[k];
        if (open > peak)
            peak = open;
    }
    free(first);
    free(last);
    free(delta);
    return (uint64_t)peak;
}

static void locality_bounds(void **state)
{
    (void)state;
    uint64_t rng = 5, sizes[400];
    pd_shard_loc *locs = malloc(400 * 40 * sizeof *locs);
    for (int trial = 0; trial < 150; trial++) {
        uint64_t shards = random_layout(&rng, sizes, 400);
        uint64_t window = 1 + test_below(&rng, 8);
        uint32_t lanes = 1 + (uint32_t)test_below(&rng, 6);
        owned_plan o;
        assert_int_equal(plan_make(&o, sizes, shards, 7, (uint64_t)trial, window, lanes), PD_OK);
        /* W = G: every rank is one lane and has at most K shards open. */
        for (uint32_t r = 0; r < lanes; r++) {
            pd_slice s = {.world = lanes, .rank = r, .mode = PD_MODE_EXACT};
            uint64_t got;
            assert_int_equal(pd_shard_slice_fill_locs(&o.plan, &s, o.plan.n, locs, &got), PD_OK);
            assert_true(max_open(locs, got, shards) <= window);
        }
        /* W ≠ G: a rank visits G / gcd(G, W) lanes, each with at most K open. */
        uint32_t world = 1 + (uint32_t)test_below(&rng, 8);
        uint32_t a = lanes, b = world;
        while (b) {
            uint32_t t = a % b;
            a = b;
            b = t;
        }
        for (uint32_t r = 0; r < world; r++) {
            pd_slice s = {.world = world, .rank = r, .mode = PD_MODE_EXACT, .offset = test_below(&rng, 5)};
            uint64_t got;
            if (s.offset > o.plan.n)
                s.offset = o.plan.n;
            assert_int_equal(pd_shard_slice_fill_locs(&o.plan, &s, o.plan.n, locs, &got), PD_OK);
            assert_true(max_open(locs, got, shards) <= (uint64_t)(lanes / a) * window);
        }
        /* The whole job, read in stream order, has at most G·K open. */
        uint64_t got;
        pd_slice all = {.world = 1, .rank = 0, .mode = PD_MODE_EXACT};
        assert_int_equal(pd_shard_slice_fill_locs(&o.plan, &all, o.plan.n, locs, &got), PD_OK);
        assert_true(max_open(locs, got, shards) <= (uint64_t)lanes * window);
        plan_free(&o);
    }
    free(locs);
}

/* A negative control for the locality check: the flat permutation spreads reads over every shard. */
static void locality_check_can_fail(void **state)
{
    (void)state;
    uint64_t sizes[64];
    for (int s = 0; s < 64; s++)
        sizes[s] = 50;
    owned_plan o;
    assert_int_equal(plan_make(&o, sizes, 64, 1, 1, 4, 1), PD_OK);
    pd_perm flat;
    assert_int_equal(pd_perm_init(&flat, 1, 1, 0, o.plan.n), PD_OK);
    pd_shard_loc *reads = malloc(o.plan.n * sizeof *reads);
    for (uint64_t p = 0; p < o.plan.n; p++) {
        uint64_t id = pd_perm_at(&flat, p);
        reads[p].shard = id / 50;
    }
    assert_true(max_open(reads, o.plan.n, 64) > 4);
    free(reads);
    plan_free(&o);
}

/* Save at offset O under W1, resume under W2: every sample exactly once. */
static void resume_under_another_world(void **state)
{
    (void)state;
    uint64_t rng = 17, sizes[200];
    uint64_t *ids = malloc(200 * 40 * sizeof *ids);
    uint32_t *hits = malloc(200 * 40 * sizeof *hits);
    for (int trial = 0; trial < 60; trial++) {
        uint64_t shards = random_layout(&rng, sizes, 200);
        owned_plan o;
        assert_int_equal(plan_make(&o, sizes, shards, 3, 3, 1 + test_below(&rng, 6), 1 + test_below(&rng, 5)), PD_OK);
        uint64_t n = o.plan.n;
        uint32_t w1 = 1 + (uint32_t)test_below(&rng, 8), w2 = 1 + (uint32_t)test_below(&rng, 8);
        uint64_t steps = test_below(&rng, n / w1 + 1), offset = steps * w1;
        memset(hits, 0, n * sizeof *hits);
        for (uint32_t r = 0; r < w1; r++) {
            pd_slice s = {.world = w1, .rank = r, .mode = PD_MODE_EXACT};
            uint64_t got;
            assert_int_equal(pd_shard_slice_fill_u64(&o.plan, &s, steps, ids, &got), PD_OK);
            for (uint64_t k = 0; k < got; k++)
                hits[ids[k]]++;
        }
        for (uint32_t r = 0; r < w2; r++) {
            pd_slice s = {.world = w2, .rank = r, .mode = PD_MODE_EXACT, .offset = offset};
            uint64_t got;
            assert_int_equal(pd_shard_slice_fill_u64(&o.plan, &s, n, ids, &got), PD_OK);
            for (uint64_t k = 0; k < got; k++)
                hits[ids[k]]++;
        }
        for (uint64_t i = 0; i < n; i++)
            assert_int_equal(hits[i], 1);
        plan_free(&o);
    }
    free(ids);
    free(hits);
}

static void large_layouts(void **state)
{
    (void)state;
    /* N near 2^63 and a million shards: sampled round trips. */
    const uint64_t big[] = {UINT64_C(1) << 60, (UINT64_C(1) << 60) - 1, 0, 12345, UINT64_C(1) << 62};
    owned_plan o;
    assert_int_equal(plan_make(&o, big, 5, 1, 2, 2, 7), PD_OK);
    uint64_t rng = 4;
    for (int i = 0; i < 2000; i++) {
        uint64_t p = test_below(&rng, o.plan.n), back;
        pd_shard_loc loc;
        assert_int_equal(pd_shard_locate(&o.plan, p, &loc), PD_OK);
        assert_int_equal(pd_shard_position(&o.plan, loc.sample, &back), PD_OK);
        assert_true(back == p);
    }
    plan_free(&o);
    const uint64_t shards = test_quick() ? 10000 : 1000000;
    uint64_t *sizes = malloc(shards * sizeof *sizes);
    for (uint64_t s = 0; s < shards; s++)
        sizes[s] = test_below(&rng, 100);
    assert_int_equal(plan_make(&o, sizes, shards, 5, 5, 16, 64), PD_OK);
    for (int i = 0; i < 20000; i++) {
        uint64_t p = test_below(&rng, o.plan.n), back;
        pd_shard_loc loc;
        assert_int_equal(pd_shard_locate(&o.plan, p, &loc), PD_OK);
        assert_int_equal(pd_shard_position(&o.plan, loc.sample, &back), PD_OK);
        assert_true(back == p);
    }
    plan_free(&o);
    free(sizes);
}

/* The layout hash a checkpoint records: the same for the same sizes, another for the same total and count
 * in another order, for a size moved between shards, or for a zero-size shard added. */
static void layout_hash(void **state)
{
    (void)state;
    const uint64_t a[4] = {10, 20, 30, 0}, same[4] = {10, 20, 30, 0}, reordered[4] = {30, 20, 10, 0},
                   moved[4] = {11, 19, 30, 0};
    const uint64_t h = pd_shard_layout_hash(a, 4);
    assert_true(h == pd_shard_layout_hash(same, 4));
    assert_true(h != pd_shard_layout_hash(reordered, 4));
    assert_true(h != pd_shard_layout_hash(moved, 4));
    assert_true(h != pd_shard_layout_hash(a, 3)); /* the trailing empty shard counts */
    /* every permutation of 6 distinct sizes hashes apart (720 layouts) */
    uint64_t s[6] = {1, 2, 3, 4, 5, 6}, seen[720];
    size_t n = 0;
    for (int i = 0; i < 720; i++) { /* the i-th permutation by Lehmer code */
        uint64_t pool[6] = {1, 2, 3, 4, 5, 6};
        int left = 6, code = i;
        for (int k = 0; k < 6; k++) {
            int f = 1;
            for (int j = 2; j < left; j++)
                f *= j;
            const int pick = code / f;
            code %= f;
            s[k] = pool[pick];
            for (int j = pick; j < left - 1; j++)
                pool[j] = pool[j + 1];
            left--;
        }
        seen[n++] = pd_shard_layout_hash(s, 6);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            assert_true(seen[i] != seen[j]);
}

static void bad_arguments(void **state)
{
    (void)state;
    uint64_t sizes[3] = {1, 2, 3}, start[4], mem[7], got, ids[4];
    pd_shard_plan plan;
    pd_shard_loc loc;
    const uint64_t zeros[2] = {0, 0}, huge[2] = {UINT64_C(1) << 63, 1};
    assert_int_equal(pd_shard_layout_build(NULL, 3, start), PD_EINVAL);
    assert_int_equal(pd_shard_layout_build(sizes, 0, start), PD_EINVAL);
    assert_int_equal(pd_shard_layout_build(zeros, 2, start), PD_EINVAL);     /* N = 0 */
    assert_int_equal(pd_shard_layout_build(huge, 2, start), PD_EINVAL);      /* N > 2^63 */
    assert_int_equal(pd_shard_layout_build(sizes, PD_SHARDS_MAX + 1, start), PD_EINVAL);
    assert_int_equal(pd_shard_layout_build(sizes, 3, start), PD_OK);
    assert_int_equal(pd_shard_plan_init(&plan, start, 3, 0, 0, 0, 1, mem, sizeof mem), PD_EINVAL); /* K = 0 */
    assert_int_equal(pd_shard_plan_init(&plan, start, 3, 0, 0, 1, 0, mem, sizeof mem), PD_EINVAL); /* G = 0 */
    assert_int_equal(pd_shard_plan_init(&plan, start, 3, 0, 0, 1, UINT64_C(1) << 32, mem, sizeof mem), PD_EINVAL);
    assert_int_equal(pd_shard_plan_init(&plan, start, 3, 0, 0, 1, 1, mem, sizeof mem - 1), PD_ERANGE);
    assert_int_equal(pd_shard_plan_init(&plan, start, 3, 0, 0, 1, 1, NULL, sizeof mem), PD_EINVAL);
    assert_int_equal(pd_shard_plan_init(&plan, start, 3, 0, 0, UINT64_MAX, UINT32_MAX, mem, sizeof mem), PD_OK);
    assert_int_equal(pd_shard_locate(&plan, 6, &loc), PD_ERANGE);
    assert_int_equal(pd_shard_locate(NULL, 0, &loc), PD_EINVAL);
    assert_int_equal(pd_shard_position(&plan, 6, &got), PD_ERANGE);
    assert_int_equal(pd_shard_position(&plan, 0, NULL), PD_EINVAL);
    pd_slice s = {.world = 2, .rank = 2, .mode = PD_MODE_PAD};
    assert_int_equal(pd_shard_slice_fill_u64(&plan, &s, 4, ids, &got), PD_EINVAL);
    s.rank = 0;
    s.offset = 7;
    assert_int_equal(pd_shard_slice_fill_u64(&plan, &s, 4, ids, &got), PD_ERANGE);
    s.offset = 6; /* T in pad mode: empty, not an error */
    assert_int_equal(pd_shard_slice_fill_u64(&plan, &s, 4, ids, &got), PD_OK);
    assert_int_equal(got, 0);
    /* the widest K and G still give every sample once */
    uint32_t seen = 0;
    for (uint64_t p = 0; p < 6; p++) {
        assert_int_equal(pd_shard_locate(&plan, p, &loc), PD_OK);
        seen |= 1u << loc.sample;
    }
    assert_int_equal(seen, 0x3f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(known_answers),
        cmocka_unit_test(exactly_once_and_inverse),
        cmocka_unit_test(locality_bounds),
        cmocka_unit_test(locality_check_can_fail),
        cmocka_unit_test(resume_under_another_world),
        cmocka_unit_test(large_layouts),
        cmocka_unit_test(layout_hash),
        cmocka_unit_test(bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
