/* Tests for daemon/mixdef.c: the registry's encoding of a mixture definition, round trip and damaged blobs. */
#include <string.h>
#include <sys/resource.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/mixdef.h"

/* A valid definition: two components (one sharded), two stages. */
static pd_mixdef *sample_def(void)
{
    pd_mixdef *d;
    assert_int_equal(pd_mixdef_alloc("mx", 2, 2, &d), 0);
    strcpy(d->comp[0].name, "web");
    d->comp[0].size = 1000;
    strcpy(d->comp[1].name, "code");
    d->comp[1].size = 300;
    d->comp[1].shards = 3;
    d->comp[1].window = 2;
    d->comp[1].lanes = 1;
    d->comp[1].layout_hash = 0x1234;
    d->starts[0] = 0;
    d->starts[1] = 640;
    const uint32_t w[4] = {3, 1, 1, 1};
    memcpy(d->weights, w, sizeof w);
    assert_int_equal(pd_mixdef_check(d, NULL, 0), 0);
    return d;
}

/* What is encoded decodes to the same definition, hash included. */
static void test_round_trip(void **state)
{
    (void)state;
    pd_mixdef *d = sample_def(), *back;
    uint8_t *buf;
    size_t len;
    assert_int_equal(pd_mixdef_encode(d, &buf, &len), 0);
    assert_int_equal(pd_mixdef_decode("mx", buf, len, &back), 0);
    assert_int_equal(pd_mixdef_compare(d, back), 1);
    assert_int_equal(back->definition, d->definition);
    pd_mixdef_release(back);
    free(buf);
    pd_mixdef_release(d);
}

/* Every prefix of a blob, and the blob with a byte more, is PD_EINVAL: never a definition read short. */
static void test_truncated_and_extended(void **state)
{
    (void)state;
    pd_mixdef *d = sample_def(), *back;
    uint8_t *buf;
    size_t len;
    assert_int_equal(pd_mixdef_encode(d, &buf, &len), 0);
    for (size_t n = 0; n < len; n++)
        assert_int_equal(pd_mixdef_decode("mx", buf, n, &back), PD_EINVAL);
    uint8_t *more = malloc(len + 1);
    assert_non_null(more);
    memcpy(more, buf, len);
    more[len] = 0;
    assert_int_equal(pd_mixdef_decode("mx", more, len + 1, &back), PD_EINVAL);
    free(more);
    free(buf);
    pd_mixdef_release(d);
}

static long max_rss_kib(void)
{
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_maxrss;
}

/* A damaged header's counts size nothing: a 16-byte blob claiming 65536 components and 2048 stages (a 512 MiB
 * weight table) is refused before anything is allocated for it; so are counts outside the spec's domain. */
static void test_counts_larger_than_the_blob(void **state)
{
    (void)state;
    const uint32_t claims[][2] = {{65536, 2048}, {65536, 65536}, {0, 1}, {1, 0}, {65537, 1}, {1, 65537}};
    pd_mixdef *back = NULL;
    const long before = max_rss_kib();
    for (size_t i = 0; i < sizeof claims / sizeof claims[0]; i++) {
        uint8_t blob[16] = {'P', 'D', 'M', 'X', 1, 0, 0, 0};
        for (int k = 0; k < 4; k++) {
            blob[8 + k] = (uint8_t)(claims[i][0] >> (8 * k));
            blob[12 + k] = (uint8_t)(claims[i][1] >> (8 * k));
        }
        assert_int_equal(pd_mixdef_decode("mx", blob, sizeof blob, &back), PD_EINVAL);
    }
    assert_null(back);
    assert_true(max_rss_kib() - before < 64 * 1024); /* before the fix: ~530 MiB for the first claim */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncated_and_extended),
        cmocka_unit_test(test_counts_larger_than_the_blob),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
