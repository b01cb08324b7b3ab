/* Tests for core/error.c: every code has a distinct name and text; unknown codes are harmless. */
#include "test_util.h"

#include <string.h>

#include "core/error.h"

static void every_code_is_named(void **state)
{
    (void)state;
    for (int e = PD_OK; e >= PD_EUNAVAILABLE; e--) {
        assert_string_not_equal(pd_strerror(e), "unknown error");
        assert_memory_equal(pd_errname(e), "PD_", 3);
        for (int f = e - 1; f >= PD_EUNAVAILABLE; f--)
            assert_string_not_equal(pd_errname(e), pd_errname(f));
    }
}

static void unknown_codes(void **state)
{
    (void)state;
    assert_string_equal(pd_strerror(1), "unknown error");
    assert_string_equal(pd_strerror(-1000), "unknown error");
    assert_string_equal(pd_errname(42), "PD_E?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_is_named),
        cmocka_unit_test(unknown_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
