/* Tests for daemon/gen.c: the daemon's generation entry point agrees with σ for every mode and width. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/gen.h"
#include "proto/frame.h"

/* Reference: rank r's k-th id straight from the spec's definition. */
static uint64_t expected(const pd_perm *p, const pd_slice *s, uint64_t k)
{
    uint64_t pos = s->offset + s->rank + k * s->world;
    return pd_perm_at(p, pos % p->n);
}

static void check(uint64_t n, uint32_t world, uint32_t rank, pd_mode mode, uint64_t offset, uint64_t count)
{
    pd_perm p;
    pd_slice s = {world, rank, mode, offset};
    uint64_t left, got;
    assert_int_equal(pd_perm_init(&p, 0x1234, 7, PD_STREAM_SAMPLES, n), 0);
    assert_int_equal(pd_slice_remaining(n, &s, &left), 0);
    uint64_t want = count < left ? count : left;
    unsigned width = pd_id_width(n);
    uint8_t *buf = malloc(count * 8 + 8);
    assert_int_equal(pd_gen_slice(&p, &s, count, width, buf, &got), 0);
    assert_int_equal(got, want);
    for (uint64_t k = 0; k < got; k++) {
        uint64_t v = width == 4 ? pd_load_le32(buf + 4 * k) : pd_load_le64(buf + 8 * k); /* little-endian wire */
        assert_int_equal(v, expected(&p, &s, k));
    }
    /* u64 output always works */
    assert_int_equal(pd_gen_slice(&p, &s, count, 8, buf, &got), 0);
    for (uint64_t k = 0; k < got; k++)
        assert_int_equal(pd_load_le64(buf + 8 * k), expected(&p, &s, k));
    free(buf);
}

static void test_matches_sigma(void **state)
{
    (void)state;
    check(1000, 1, 0, PD_MODE_EXACT, 0, 1000);
    check(1001, 8, 3, PD_MODE_PAD, 0, 200);   /* wraps past n */
    check(1001, 8, 7, PD_MODE_DROP, 16, 200);
    check(1001, 8, 2, PD_MODE_EXACT, 1000, 5); /* at the end: empty */
    check(5, 7, 6, PD_MODE_PAD, 0, 3);         /* W > n */
    check(UINT64_C(1) << 32, 3, 1, PD_MODE_PAD, 99, 50);
    check((UINT64_C(1) << 32) + 1, 3, 1, PD_MODE_PAD, 99, 50); /* first size with 8-byte ids */
    check(UINT64_C(1) << 63, 1000, 999, PD_MODE_EXACT, 12345, 64);
}

static void test_errors(void **state)
{
    (void)state;
    pd_perm p;
    pd_slice s = {4, 1, PD_MODE_PAD, 0};
    uint64_t got;
    uint64_t buf[8];
    assert_int_equal(pd_perm_init(&p, 1, 2, PD_STREAM_SAMPLES, (UINT64_C(1) << 32) + 1), 0);
    assert_int_equal(pd_gen_slice(&p, &s, 4, 4, buf, &got), PD_EOVERFLOW);
    assert_int_equal(pd_gen_slice(&p, &s, 4, 2, buf, &got), PD_EINVAL);
    s.rank = 4;
    assert_int_equal(pd_gen_slice(&p, &s, 4, 8, buf, &got), PD_EINVAL);
    assert_non_null(pd_gen_backend());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_sigma),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
