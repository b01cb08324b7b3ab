/* Tests for core/digest.c: order independence, sensitivity to repeats and omissions, rank digests add up. */
#include "test_util.h"

#include <stdlib.h>

#include "core/digest.h"
#include "core/error.h"

static void order_does_not_matter(void **state)
{
    (void)state;
    pd_digest a, b;
    pd_digest_init(&a);
    pd_digest_init(&b);
    for (uint64_t i = 0; i < 1000; i++) {
        pd_digest_add(&a, i * 7);
        pd_digest_add(&b, (999 - i) * 7);
    }
    assert_true(pd_digest_equal(&a, &b));
}

static void repeats_and_swaps_are_caught(void **state)
{
    (void)state;
    pd_digest ok, dup, swap;
    pd_digest_init(&ok);
    pd_digest_init(&dup);
    pd_digest_init(&swap);
    for (uint64_t i = 0; i < 100; i++) {
        pd_digest_add(&ok, i);
        pd_digest_add(&dup, i == 5 ? 6 : i); /* 6 twice, 5 missing: same count */
        pd_digest_add(&swap, i == 5 ? 4 : i == 6 ? 7 : i); /* same count and sum */
    }
    assert_false(pd_digest_equal(&ok, &dup));
    assert_int_equal(ok.count, swap.count);
    assert_int_equal(ok.sum, swap.sum);
    assert_false(pd_digest_equal(&ok, &swap)); /* only the hash can tell */
}

static void rank_digests_merge_to_the_epoch(void **state)
{
    (void)state;
    pd_perm p;
    const uint64_t n = 10007;
    assert_int_equal(pd_perm_init(&p, 8, 9, 0, n), PD_OK);
    pd_digest all, want;
    pd_digest_init(&all);
    pd_digest_init(&want);
    for (uint64_t i = 0; i < n; i++)
        pd_digest_add(&want, i);
    for (uint32_t r = 0; r < 6; r++) {
        pd_slice s = {.world = 6, .rank = r, .mode = PD_MODE_EXACT};
        pd_digest d;
        assert_int_equal(pd_digest_slice(&p, &s, &d), PD_OK);
        pd_digest_merge(&all, &d);
    }
    assert_true(pd_digest_equal(&all, &want));
    /* a rank resumed at its offset digests only what is left */
    pd_slice s = {.world = 6, .rank = 1, .mode = PD_MODE_EXACT, .offset = 6 * 1000};
    pd_digest d;
    assert_int_equal(pd_digest_slice(&p, &s, &d), PD_OK);
    assert_int_equal(d.count, (n - 6000 - 1 + 5) / 6);
    s.offset = n + 1;
    assert_int_equal(pd_digest_slice(&p, &s, &d), PD_ERANGE);
    assert_int_equal(pd_digest_slice(NULL, &s, &d), PD_EINVAL);
}

static void sharded_digests_merge_to_the_epoch(void **state)
{
    (void)state;
    const uint64_t sizes[] = {5, 0, 9, 1, 1, 30, 0, 2};
    uint64_t start[9], mem[17];
    pd_shard_plan plan;
    assert_int_equal(pd_shard_layout_build(sizes, 8, start), PD_OK);
    assert_int_equal(pd_shard_plan_init(&plan, start, 8, 1, 2, 3, 2, mem, sizeof mem), PD_OK);
    pd_digest all, want;
    pd_digest_init(&all);
    pd_digest_init(&want);
    for (uint64_t i = 0; i < plan.n; i++)
        pd_digest_add(&want, i);
    for (uint32_t r = 0; r < 4; r++) {
        pd_slice s = {.world = 4, .rank = r, .mode = PD_MODE_EXACT};
        pd_digest d;
        assert_int_equal(pd_digest_shard_slice(&plan, &s, &d), PD_OK);
        pd_digest_merge(&all, &d);
    }
    assert_true(pd_digest_equal(&all, &want));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(order_does_not_matter),
        cmocka_unit_test(repeats_and_swaps_are_caught),
        cmocka_unit_test(rank_digests_merge_to_the_epoch),
        cmocka_unit_test(sharded_digests_merge_to_the_epoch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
