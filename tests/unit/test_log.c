/* Tests for daemon/log.c: level names and filtering, the key=value line format, and the limit on
 * lines a peer can cause (peer_log_rate) on an injected clock. */
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

static uint64_t fake_ms;

static uint64_t fake_clock(void)
{
    return fake_ms;
}

/* stderr goes to a file while capture is on; captured() gives what was written (malloc'd). */
static int saved_stderr = -1;
static FILE *capture_file;

static void capture(void)
{
    capture_file = tmpfile();
    assert_non_null(capture_file);
    fflush(stderr);
    saved_stderr = dup(STDERR_FILENO);
    dup2(fileno(capture_file), STDERR_FILENO);
}

static char *captured(void)
{
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    long n = ftell(capture_file);
    assert_true(n >= 0);
    char *buf = calloc(1, (size_t)n + 1);
    assert_non_null(buf);
    rewind(capture_file);
    assert_int_equal(fread(buf, 1, (size_t)n, capture_file), (size_t)n);
    fclose(capture_file);
    return buf;
}

static size_t count(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

static uint64_t suppressed_of(const char *event)
{
    pd_log_suppressed s[PD_LOG_PEER_EVENTS];
    size_t n = pd_log_peer_suppressed(s, PD_LOG_PEER_EVENTS);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s[i].event, event))
            return s[i].lines;
    return UINT64_MAX;
}

/* A burst past the rate writes rate lines, then one summary with the count of the rest once the second
 * is over: at the next line of the event, or at a flush. */
static void test_peer_rate(void **state)
{
    (void)state;
    pd_log_set_level(PD_LOG_INFO);
    pd_log_set_peer_clock(fake_clock);
    pd_log_set_peer_rate(3);
    fake_ms = 5000;
    capture();
    for (int i = 0; i < 10; i++)
        pd_log_warn_peer("burst", "n=%d", i);
    fake_ms = 5999; /* the same second: nothing to say yet */
    pd_log_peer_flush();
    pd_log_warn_peer("burst", "n=%d", 10);
    char *out = captured();
    assert_int_equal(count(out, "event=burst "), 3);
    assert_non_null(strstr(out, "event=burst n=2\n"));
    assert_null(strstr(out, "n=3"));
    assert_int_equal(count(out, "event=log_suppressed"), 0);
    assert_int_equal(suppressed_of("burst"), 8);
    free(out);

    /* The next second: the summary comes first, then the line. */
    fake_ms = 6000;
    capture();
    pd_log_warn_peer("burst", "n=%d", 11);
    out = captured();
    char *summary = strstr(out, "level=warn event=log_suppressed of=burst lines=8 ");
    assert_non_null(summary);
    char *line = strstr(out, "event=burst n=11\n");
    assert_non_null(line);
    assert_true(summary < line);
    free(out);

    /* A flood that stops is reported by the flush after its second, once. */
    capture();
    for (int i = 0; i < 5; i++)
        pd_log_warn_peer("burst", "n=%d", 12 + i);
    fake_ms = 7000;
    pd_log_peer_flush();
    pd_log_peer_flush();
    out = captured();
    assert_int_equal(count(out, "event=burst "), 2); /* 11 was the first of three in that second */
    assert_int_equal(count(out, "event=log_suppressed of=burst lines=3 "), 1);
    assert_int_equal(suppressed_of("burst"), 11);
    free(out);

    /* Events are limited apart; below the warn level nothing is written or counted. */
    capture();
    pd_log_warn_peer("other_event", "x=%d", 1);
    pd_log_set_level(PD_LOG_ERROR);
    for (int i = 0; i < 10; i++)
        pd_log_warn_peer("quiet", "x=%d", i);
    pd_log_set_level(PD_LOG_INFO);
    out = captured();
    assert_int_equal(count(out, "event=other_event x=1\n"), 1);
    assert_int_equal(suppressed_of("quiet"), UINT64_MAX); /* never limited: never seen */
    free(out);
    pd_log_set_peer_clock(NULL);
    pd_log_set_peer_rate(10);
}

/* The control: peer_log_rate 0 writes every line. */
static void test_peer_rate_off(void **state)
{
    (void)state;
    pd_log_set_level(PD_LOG_INFO);
    pd_log_set_peer_clock(fake_clock);
    pd_log_set_peer_rate(0);
    fake_ms = 100000;
    capture();
    for (int i = 0; i < 50; i++)
        pd_log_warn_peer("unlimited", "n=%d", i);
    fake_ms = 200000;
    pd_log_peer_flush();
    char *out = captured();
    assert_int_equal(count(out, "event=unlimited "), 50);
    assert_int_equal(count(out, "log_suppressed"), 0);
    assert_int_equal(suppressed_of("unlimited"), 0);
    free(out);
    pd_log_set_peer_clock(NULL);
    pd_log_set_peer_rate(10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_peer_rate),
        cmocka_unit_test(test_peer_rate_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
