/* Tests for client/braces.c: braceexpand's results on tests/data/braces.tsv, limits, nesting, callbacks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "client/braces.h"
#include "core/error.h"

/* Collects results, one per line in a buffer. */
typedef struct got {
    char buf[1 << 14];
    size_t len, n;
} got;

static int collect(void *ctx, const char *s)
{
    got *g = ctx;
    size_t len = strlen(s);
    assert_true(g->len + len + 1 < sizeof g->buf);
    memcpy(g->buf + g->len, s, len);
    g->buf[g->len + len] = '\t';
    g->len += len + 1;
    g->n++;
    return 0;
}

static void test_cases_file(void **state)
{
    (void)state;
    FILE *f = fopen(PERMD_BRACES_CASES, "r");
    assert_non_null(f);
    char line[4096], err[256];
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0] || line[0] == '#')
            continue;
        char *tab = strchr(line, '\t');
        assert_non_null(tab);
        *tab = '\0';
        const char *want = tab + 1;
        got g = {.len = 0};
        int rc = pd_braces_expand(line, 1000, collect, &g, err, sizeof err);
        if (!strcmp(want, "!unbalanced")) {
            if (rc != PD_EINVAL)
                fail_msg("'%s': rc %d, want PD_EINVAL", line, rc);
            assert_non_null(strstr(err, "unbalanced"));
            assert_non_null(strstr(err, line));
        } else {
            if (rc)
                fail_msg("'%s': rc %d (%s)", line, rc, err);
            g.buf[g.len ? g.len - 1 : 0] = '\0'; /* drop the last separator */
            if (strcmp(g.buf, want))
                fail_msg("'%s' expands to\n  %s\nwant\n  %s", line, g.buf, want);
        }
        cases++;
    }
    fclose(f);
    assert_true(cases >= 60);
}

static void test_typical_shards(void **state)
{
    (void)state;
    got g = {.len = 0};
    char err[256];
    assert_int_equal(pd_braces_expand("data/shard-{000998..001001}.tar", 100, collect, &g, err, sizeof err), 0);
    g.buf[g.len - 1] = '\0';
    assert_string_equal(g.buf, "data/shard-000998.tar\tdata/shard-000999.tar\tdata/shard-001000.tar\tdata/shard-001001.tar");
    g.len = g.n = 0;
    assert_int_equal(pd_braces_expand("plain.tar", 1, collect, &g, err, sizeof err), 0);
    assert_int_equal(g.n, 1);
}

/* Counting comes first: a huge range or product is refused without building a name. */
static void test_limits(void **state)
{
    (void)state;
    got g = {.len = 0};
    char err[256];
    assert_int_equal(pd_braces_expand("{0..9}", 10, collect, &g, err, sizeof err), 0);
    assert_int_equal(g.n, 10);
    g.len = g.n = 0;
    assert_int_equal(pd_braces_expand("{0..10}", 10, collect, &g, err, sizeof err), PD_ETOOBIG);
    assert_int_equal(g.n, 0);
    assert_non_null(strstr(err, "more than 10"));
    assert_int_equal(pd_braces_expand("s{0..999999999999999}.tar", 1 << 24, collect, &g, err, sizeof err), PD_ETOOBIG);
    assert_int_equal(pd_braces_expand("{0..9999}{0..9999}{0..9999}", 1 << 24, collect, &g, err, sizeof err),
                     PD_ETOOBIG);
    assert_int_equal(pd_braces_expand("{a,b,c}{0..4}", 14, collect, &g, err, sizeof err), PD_ETOOBIG);
    assert_int_equal(pd_braces_expand("{{0..7},{0..7}}", 15, collect, &g, err, sizeof err), PD_ETOOBIG);
    assert_int_equal(g.n, 0);
    /* a number past 64 bits is refused, not wrapped */
    assert_int_equal(pd_braces_expand("{0..99999999999999999999}", 10, collect, &g, err, sizeof err), PD_ETOOBIG);
    assert_int_equal(pd_braces_expand("{-9223372036854775807..-9223372036854775806}", 10, collect, &g, err, sizeof err),
                     0);
    assert_int_equal(g.n, 2);
}

static void test_nesting(void **state)
{
    (void)state;
    char deep[2 * (PD_BRACES_DEPTH_MAX + 2) + 8], err[256];
    got g = {.len = 0};
    for (int depth = PD_BRACES_DEPTH_MAX; depth <= PD_BRACES_DEPTH_MAX + 1; depth++) {
        size_t n = 0;
        for (int i = 0; i < depth; i++)
            deep[n++] = '{';
        deep[n++] = 'a';
        deep[n++] = ',';
        deep[n++] = 'b';
        for (int i = 0; i < depth; i++)
            deep[n++] = '}';
        deep[n] = '\0';
        g.len = g.n = 0;
        int rc = pd_braces_expand(deep, 100, collect, &g, err, sizeof err);
        assert_int_equal(rc, depth <= PD_BRACES_DEPTH_MAX ? 0 : PD_EINVAL);
        assert_int_equal(g.n, depth <= PD_BRACES_DEPTH_MAX ? 2 : 0); /* {..{a,b}..}: the outer braces stay */
    }
    assert_non_null(strstr(err, "nested deeper"));
}

static int stop_at_third(void *ctx, const char *s)
{
    (void)s;
    return ++*(int *)ctx == 3 ? 42 : 0;
}

static void test_callback_stops(void **state)
{
    (void)state;
    int seen = 0;
    char err[64];
    assert_int_equal(pd_braces_expand("{1..9}", 100, stop_at_third, &seen, err, sizeof err), 42);
    assert_int_equal(seen, 3);
}

static int count_names(void *ctx, const char *s)
{
    (void)s;
    ++*(uint64_t *)ctx;
    return 0;
}

/* A zero-padded range wider than any int's digits pads every name to its width (they were cut at 31). */
static void test_wide_padding(void **state)
{
    (void)state;
    char pattern[128], want[128], err[256];
    snprintf(pattern, sizeof pattern, "x{%0*d..2}.tar", 41, 1); /* 40 zeros and a 1 */
    got g = {.len = 0};
    assert_int_equal(pd_braces_expand(pattern, 10, collect, &g, err, sizeof err), 0);
    snprintf(want, sizeof want, "x%0*d.tar\tx%0*d.tar\t", 41, 1, 41, 2);
    g.buf[g.len] = '\0';
    assert_string_equal(g.buf, want);
}

/* An end with a non-digit is no integer (so no range, however long its digits), as braceexpand's regex says. */
static void test_not_an_integer(void **state)
{
    (void)state;
    char err[256];
    got g = {.len = 0};
    assert_int_equal(pd_braces_expand("x{1..99999999999999999999x,y}.tar", 10, collect, &g, err, sizeof err), 0);
    g.buf[g.len] = '\0';
    assert_string_equal(g.buf, "x1..99999999999999999999x.tar\txy.tar\t");
}

/* Names adding up to more than PD_BRACES_BYTES_MAX are refused before any is built, nested or not; a long
 * prefix under the bound streams its names. */
static void test_bytes_bound(void **state)
{
    (void)state;
    char pattern[4096], err[256]; /* the message quotes the pattern's start: the reason still fits */
    memset(pattern, 'x', 2000);
    strcpy(pattern + 2000, "{0..999999}"); /* 10^6 names of ~2 KB: 2 GB */
    uint64_t n = 0;
    assert_int_equal(pd_braces_expand(pattern, 1 << 24, count_names, &n, err, sizeof err), PD_ETOOBIG);
    assert_non_null(strstr(err, "bytes in all"));
    assert_int_equal(n, 0);
    pattern[0] = '{';
    strcpy(pattern + 2000, "{0..999999},y}");
    assert_int_equal(pd_braces_expand(pattern, 1 << 24, count_names, &n, err, sizeof err), PD_ETOOBIG);
    assert_int_equal(n, 0);
    memset(pattern, 'x', 2000);
    strcpy(pattern + 2000, "{0..99999}"); /* 200 MB of names: under the bound */
    assert_int_equal(pd_braces_expand(pattern, 1 << 24, count_names, &n, err, sizeof err), 0);
    assert_int_equal(n, 100000);
}

static void test_count(void **state)
{
    (void)state;
    uint64_t n = 1;
    assert_int_equal(pd_braces_count("s{a,b}{0..9}{,.bak}", &n), 0);
    assert_int_equal(n, 40);
    assert_int_equal(pd_braces_count("{0..9999}{0..9999}{0..9999}{0..9999}{0..9999}", &n), PD_ETOOBIG);
    assert_int_equal(pd_braces_count("{0..99999999999999999999}", &n), PD_ETOOBIG);
    assert_int_equal(pd_braces_count("{a", &n), PD_EINVAL);
    assert_int_equal(n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_file), cmocka_unit_test(test_typical_shards), cmocka_unit_test(test_limits),
        cmocka_unit_test(test_nesting),    cmocka_unit_test(test_callback_stops), cmocka_unit_test(test_wide_padding),
        cmocka_unit_test(test_not_an_integer), cmocka_unit_test(test_bytes_bound), cmocka_unit_test(test_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
