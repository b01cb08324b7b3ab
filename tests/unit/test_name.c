/* Tests for core/name.c: which dataset and group names are accepted, and their printable form. */
#include <string.h>

#include "test_util.h"

#include "core/error.h"
#include "core/name.h"

static void test_names(void **state)
{
    (void)state;
    char longest[PD_NAME_MAX + 2];
    memset(longest, 'a', sizeof longest);
    longest[PD_NAME_MAX] = '\0';
    assert_int_equal(pd_name_check(longest), 0);
    longest[PD_NAME_MAX] = 'a';
    longest[PD_NAME_MAX + 1] = '\0';
    assert_int_equal(pd_name_check(longest), PD_EINVAL);
    const char *good[] = {"imagenet", "c4.en-train_2", "0", "_x"};
    const char *bad[] = {"", ".hidden", "-flag", "a/b", "a b", "naïve", "x\n"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        assert_int_equal(pd_name_check(good[i]), 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(pd_name_check(bad[i]), PD_EINVAL);
}

static void test_printable(void **state)
{
    (void)state;
    assert_string_equal(pd_name_printable("imagenet"), "imagenet");
    assert_string_equal(pd_name_printable("a/../b"), "(invalid name)");
    assert_string_equal(pd_name_printable(NULL), "(invalid name)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_printable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
