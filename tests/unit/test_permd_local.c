/* Tests for client/permd_local.c: libpermd's offline calls give the core's answers and its errors. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/rank.h"

static void test_perm_fill_and_inverse(void **state)
{
    (void)state;
    const uint64_t n = 1000003;
    pd_perm p;
    pd_perm_init(&p, 11, 12, PD_STREAM_SAMPLES, n);
    uint32_t a[100];
    uint64_t b[100], pos[100];
    assert_int_equal(permd_perm_fill(11, 12, n, 500, 100, a, 4), 0);
    assert_int_equal(permd_perm_fill(11, 12, n, 500, 100, b, 8), 0);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(a[i], pd_perm_at(&p, 500 + (uint64_t)i));
        assert_int_equal(b[i], a[i]);
    }
    assert_int_equal(permd_perm_inverse(11, 12, n, b, 100, pos), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(pos[i], 500 + (uint64_t)i);

    assert_int_equal(permd_perm_fill(11, 12, n, n - 5, 6, b, 8), PERMD_ERANGE);
    assert_int_equal(permd_perm_fill(11, 12, 0, 0, 1, b, 8), PERMD_EINVAL);
    assert_int_equal(permd_perm_fill(11, 12, (UINT64_C(1) << 32) + 1, 0, 1, a, 4), PERMD_EOVERFLOW);
    assert_int_equal(permd_perm_fill(11, 12, n, 0, 1, a, 3), PERMD_EINVAL);
    b[3] = n;
    pos[0] = 77;
    assert_int_equal(permd_perm_inverse(11, 12, n, b, 5, pos), PERMD_ERANGE);
    assert_int_equal(pos[0], 77); /* nothing written */
}

static void test_ranks(void **state)
{
    (void)state;
    uint64_t len, left, got, ids[64], want[64];
    assert_int_equal(permd_epoch_length(10, 4, PERMD_MODE_PAD, &len), 0);
    assert_int_equal(len, 12);
    assert_int_equal(permd_epoch_length(10, 4, PERMD_MODE_DROP, &len), 0);
    assert_int_equal(len, 8);
    assert_int_equal(permd_epoch_length(10, 4, 3, &len), PERMD_EINVAL);
    assert_int_equal(permd_rank_remaining(10, 4, 3, PERMD_MODE_EXACT, 0, &left), 0);
    assert_int_equal(left, 2); /* positions 3 and 7 */
    assert_int_equal(permd_rank_remaining(10, 4, 3, PERMD_MODE_EXACT, 11, &left), PERMD_ERANGE);
    assert_int_equal(permd_rank_remaining(10, 4, 4, PERMD_MODE_EXACT, 0, &left), PERMD_EINVAL);

    pd_perm p;
    pd_slice s = {7, 2, PD_MODE_PAD, 14};
    pd_perm_init(&p, 3, 4, PD_STREAM_SAMPLES, 1000);
    pd_slice_fill_u64(&p, &s, 64, want, &got);
    uint64_t got2;
    assert_int_equal(permd_rank_fill(3, 4, 1000, 7, 2, PERMD_MODE_PAD, 14, 64, ids, 8, &got2), 0);
    assert_int_equal(got2, got);
    assert_memory_equal(ids, want, got * sizeof *ids);
    uint32_t ids32[64];
    assert_int_equal(permd_rank_fill(3, 4, 1000, 7, 2, PERMD_MODE_PAD, 14, 64, ids32, 4, &got2), 0);
    for (uint64_t i = 0; i < got; i++)
        assert_int_equal(ids32[i], want[i]);
    assert_int_equal(permd_rank_fill(3, 4, 1000, 7, 2, PERMD_MODE_PAD, 14, 64, ids, 8, NULL), PERMD_EINVAL);
    assert_int_equal(permd_rank_fill(3, 4, 1000, 7, 2, -1, 14, 64, ids, 8, &got2), PERMD_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perm_fill_and_inverse),
        cmocka_unit_test(test_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
