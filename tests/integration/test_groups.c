/* Integration: NCCL delivery requests on a daemon that cannot deliver (no delivery library here, as on any
 * machine without a GPU or NCCL) get UNAVAILABLE with the reason, and nothing else changes. */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

static harness h;

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    const char *extra[] = {"--delivery-library", "/nonexistent/libpermd_delivery.so", NULL};
    return harness_start(&h, 0, extra, NULL);
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

static void unavailable_and_unharmed(void **state)
{
    (void)state;
    permd_client *c;
    uint8_t id[PERMD_NCCL_ID_BYTES];
    uint32_t rank, nranks, width;
    uint64_t got, ids[4], k;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_group_join(c, "trainers", 2, id, &rank, &nranks), PERMD_EUNAVAILABLE);
    assert_non_null(strstr(permd_last_error(c), "unavailable"));
    assert_non_null(strstr(permd_last_error(c), "nonexistent"));
    assert_int_equal(permd_put_dataset(c, "d", 100, NULL, NULL), 0);
    permd_slice s = {.dataset = "d", .world = 2, .mode = PERMD_MODE_PAD};
    assert_int_equal(permd_group_deliver(c, "trainers", &s, 4, &got, &width, NULL), PERMD_EUNAVAILABLE);
    assert_int_equal(permd_group_leave(c, "trainers"), PERMD_EUNAVAILABLE);
    /* bad arguments are typed before availability matters */
    assert_int_equal(permd_group_join(c, "bad name", 2, id, &rank, &nranks), PERMD_EINVAL);
    assert_int_equal(permd_group_join(c, "trainers", 0, id, &rank, &nranks), PERMD_EINVAL);
    /* the same connection still serves */
    assert_int_equal(permd_fetch_u64(c, &s, 4, ids, &k, NULL), 0);
    assert_int_equal(k, 4);
    permd_close(c);
    assert_true(harness_log_contains(&h, "event=nccl state=unavailable"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unavailable_and_unharmed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
