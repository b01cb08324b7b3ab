/* Tests for daemon/log.c: level names and filtering, and the key=value line format. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/log.h"

static void test_levels(void **state)
{
    (void)state;
    pd_log_level l;
    const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pd_log_level_parse(names[i], &l), 0);
        assert_int_equal(l, i);
        assert_string_equal(pd_log_level_name(l), names[i]);
    }
    assert_int_equal(pd_log_level_parse("verbose", &l), PD_EINVAL);
    pd_log_set_level(PD_LOG_WARN);
    assert_true(pd_log_enabled(PD_LOG_ERROR));
    assert_true(pd_log_enabled(PD_LOG_WARN));
    assert_false(pd_log_enabled(PD_LOG_INFO));
}

/* Capture stderr in a pipe while logging. */
static void test_format(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    dup2(fds[1], STDERR_FILENO);
    pd_log_set_level(PD_LOG_INFO);
    pd_log_info("unit_event", "answer=%d msg=\"%s\"", 42, "two words");
    pd_log_debug("hidden", "x=1"); /* below the level: nothing */
    pd_log_warn("bare", "%s", "");
    pd_log_info("multi", "msg=\"%s\"", "line one\nline two\r\tend"); /* a value with control bytes */
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fds[1]);
    char buf[1024] = "";
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    assert_true(n > 0);
    buf[n] = '\0';
    char *second = strchr(buf, '\n');
    assert_non_null(second);
    *second++ = '\0';
    assert_non_null(strstr(buf, " level=info event=unit_event answer=42 msg=\"two words\""));
    assert_int_equal(buf[4], '-'); /* starts with an ISO date */
    assert_non_null(strstr(second, "level=warn event=bare\n"));
    char *third = strchr(second, '\n') + 1;
    assert_non_null(strstr(third, "level=info event=multi msg=\"line one line two  end\"\n"));
    assert_ptr_equal(strchr(third, '\n'), third + strlen(third) - 1); /* exactly one line */
    assert_null(strstr(second, "hidden"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels),
        cmocka_unit_test(test_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
