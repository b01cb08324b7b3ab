/* Tests for core/parse.c: strict decimal u64 parsing. */
#include "test_util.h"

#include "core/error.h"
#include "core/parse.h"

static void accepts_decimal(void **state)
{
    (void)state;
    uint64_t v = 7;
    assert_int_equal(pd_parse_u64("0", &v), PD_OK);
    assert_int_equal(v, 0);
    assert_int_equal(pd_parse_u64("18446744073709551615", &v), PD_OK);
    assert_true(v == UINT64_MAX);
    assert_int_equal(pd_parse_u64("000123", &v), PD_OK);
    assert_int_equal(v, 123);
}

static void rejects_junk(void **state)
{
    (void)state;
    uint64_t v = 7;
    const char *bad[] = {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "12a", "１"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(pd_parse_u64(bad[i], &v), PD_EINVAL);
    assert_int_equal(v, 7); /* untouched on failure */
    assert_int_equal(pd_parse_u64(NULL, &v), PD_EINVAL);
    assert_int_equal(pd_parse_u64("1", NULL), PD_EINVAL);
}

static void rejects_overflow_and_range(void **state)
{
    (void)state;
    uint64_t v = 7;
    assert_int_equal(pd_parse_u64("18446744073709551616", &v), PD_ERANGE);
    assert_int_equal(pd_parse_u64("99999999999999999999999", &v), PD_ERANGE);
    assert_int_equal(pd_parse_u64_range("0", 1, 10, &v), PD_ERANGE);
    assert_int_equal(pd_parse_u64_range("11", 1, 10, &v), PD_ERANGE);
    assert_int_equal(pd_parse_u64_range("10", 1, 10, &v), PD_OK);
    assert_int_equal(v, 10);
    assert_int_equal(pd_parse_u64_range("x", 1, 10, &v), PD_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accepts_decimal),
        cmocka_unit_test(rejects_junk),
        cmocka_unit_test(rejects_overflow_and_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
