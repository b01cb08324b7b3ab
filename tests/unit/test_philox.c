/* Tests for core/philox.h: Random123's known answers for Philox4x32-10. */
#include "test_util.h"

#include "core/philox.h"
#include "vectors_v1.h"

static void known_answers(void **state)
{
    (void)state;
    assert_true(VEC_COUNT(vec_philox) >= 3);
    for (size_t i = 0; i < VEC_COUNT(vec_philox); i++) {
        uint32_t out[4];
        pd_philox4x32_10(vec_philox[i].ctr, vec_philox[i].key, out);
        for (int j = 0; j < 4; j++)
            assert_int_equal(out[j], vec_philox[i].out[j]);
    }
}

static void output_may_alias_counter(void **state)
{
    (void)state;
    uint32_t buf[4];
    for (int j = 0; j < 4; j++)
        buf[j] = vec_philox[2].ctr[j];
    pd_philox4x32_10(buf, vec_philox[2].key, buf);
    for (int j = 0; j < 4; j++)
        assert_int_equal(buf[j], vec_philox[2].out[j]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(known_answers),
        cmocka_unit_test(output_may_alias_counter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
