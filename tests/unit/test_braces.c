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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_file), cmocka_unit_test(test_typical_shards), cmocka_unit_test(test_limits),
        cmocka_unit_test(test_nesting),    cmocka_unit_test(test_callback_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
