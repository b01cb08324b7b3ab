/* Tests for core/keys.h: the round keys and flip bit of the spec's vectors; seed and epoch stay apart. */
#include "test_util.h"

#include <string.h>

#include "core/keys.h"
#include "vectors_v1.h"

static void known_round_keys(void **state)
{
    (void)state;
    assert_true(VEC_COUNT(vec_keys) >= 6);
    for (size_t i = 0; i < VEC_COUNT(vec_keys); i++) {
        pd_keys k;
        pd_keys_derive(vec_keys[i].seed, vec_keys[i].epoch, vec_keys[i].stream, &k);
        for (int j = 0; j < PD_ROUNDS; j++)
            assert_int_equal(k.k[j], vec_keys[i].keys[j]);
        assert_int_equal(k.flip, vec_keys[i].flip);
    }
}

/* (s, e+1) and (s+1, e) must not collide, as they do in seed+epoch schemes. */
static void seed_and_epoch_do_not_add(void **state)
{
    (void)state;
    pd_keys a, b;
    for (uint64_t s = 0; s < 50; s++) {
        pd_keys_derive(s, 1, 0, &a);
        pd_keys_derive(s + 1, 0, 0, &b);
        assert_memory_not_equal(a.k, b.k, sizeof a.k);
    }
}

static void streams_are_separate(void **state)
{
    (void)state;
    pd_keys a, b;
    pd_keys_derive(42, 7, 0, &a);
    pd_keys_derive(42, 7, 1, &b);
    assert_memory_not_equal(a.k, b.k, sizeof a.k);
}

static void flip_is_balanced(void **state)
{
    (void)state;
    int ones = 0;
    pd_keys k;
    for (uint64_t e = 0; e < 4000; e++) {
        pd_keys_derive(12345, e, 0, &k);
        assert_true(k.flip <= 1);
        ones += (int)k.flip;
    }
    assert_in_range(ones, 1800, 2200); /* binomial(4000, 1/2): ±6 sd */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(known_round_keys),
        cmocka_unit_test(seed_and_epoch_do_not_add),
        cmocka_unit_test(streams_are_separate),
        cmocka_unit_test(flip_is_balanced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
