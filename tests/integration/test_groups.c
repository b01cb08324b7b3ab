/* Integration: NCCL delivery requests on a daemon that cannot deliver (no delivery library here, as on any
 * machine without a GPU or NCCL) get UNAVAILABLE with the reason, and nothing else changes. */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
    assert_int_equal(permd_group_deliver(c, "trainers", &s, 4, 0, &got, &width, NULL), PERMD_EUNAVAILABLE);
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

/* Delivery groups are bounded (max_groups) and so are the sends queued in one whose trainer does not receive
 * (max_group_sends): each start a thread and an NCCL communicator, and queued sends were held without limit
 * until delivery_timeout_ms. With a stand-in delivery library whose sends never complete. */
static void groups_and_their_queues_are_bounded(void **state)
{
    (void)state;
    harness g;
    harness_init(&g);
    const char *extra[] = {"--delivery-library", PERMD_FAKE_DELIVERY, "--max-groups", "2", "--max-group-sends", "3",
                           "--delivery-timeout-ms", "600000", NULL};
    assert_int_equal(harness_start(&g, 0, extra, NULL), 0);
    permd_client *c[3];
    uint8_t id[PERMD_NCCL_ID_BYTES];
    uint32_t rank, nranks, width;
    for (int i = 0; i < 3; i++)
        assert_int_equal(permd_connect_unix(g.sock, &c[i]), 0);
    assert_int_equal(permd_group_join(c[0], "g0", 1, id, &rank, &nranks), 0);
    assert_int_equal(permd_group_join(c[1], "g1", 1, id, &rank, &nranks), 0);
    assert_int_equal(permd_group_join(c[2], "g2", 1, id, &rank, &nranks), PERMD_EBUSY);
    assert_non_null(strstr(permd_last_error(c[2]), "max_groups"));

    /* The first sends go to the group's thread, which waits on them; the rest queue up to max_group_sends. */
    assert_int_equal(permd_put_dataset(c[0], "d", 1000, NULL, NULL), 0);
    permd_slice s = {.dataset = "d", .world = 1, .mode = PERMD_MODE_EXACT};
    uint64_t got;
    int accepted = 0, rc = 0;
    for (int i = 0; i < 40 && rc == 0; i++) {
        rc = permd_group_deliver(c[0], "g0", &s, 4, 0, &got, &width, &s.offset);
        accepted += rc == 0;
    }
    assert_int_equal(rc, PERMD_EBUSY);
    assert_non_null(strstr(permd_last_error(c[0]), "max_group_sends"));
    assert_true(accepted >= 3 && accepted <= 6); /* 3 queued, and at most as many taken by the thread */

    /* A group that ends makes room for another. */
    assert_int_equal(permd_group_leave(c[1], "g1"), 0);
    for (int i = 0; i < 500 && (rc = permd_group_join(c[2], "g2", 1, id, &rank, &nranks)) == PERMD_EBUSY; i++)
        usleep(10000);
    assert_int_equal(rc, 0);
    /* a mixture is not delivered, and the message says it is one */
    const char *const parts[2] = {"d", "d"};
    const uint64_t starts[1] = {0};
    const uint32_t weights[2] = {1, 1};
    assert_int_equal(permd_put_mixture(c[2], "mx", parts, 2, starts, weights, 1, 0, 0, NULL, NULL), 0);
    permd_slice ms = {.dataset = "mx", .world = 1, .mode = PERMD_MODE_EXACT};
    assert_int_equal(permd_group_deliver(c[2], "g2", &ms, 4, 0, &got, &width, NULL), PERMD_EUNAVAILABLE);
    assert_non_null(strstr(permd_last_error(c[2]), "'mx' is a mixture"));
    for (int i = 0; i < 3; i++)
        permd_close(c[i]); /* members gone: their groups abort, the stand-in's waiting sends end */
    assert_int_equal(harness_finish(&g), 0);
}

/* A group whose other members never join fails to form after delivery_timeout_ms, and gives its max_groups slot
 * back then, though the member that joined it stays connected (it held the slot for as long: a peer that joined
 * max_groups such groups and stayed stopped delivery for everyone). */
static void a_group_that_never_forms_frees_its_slot(void **state)
{
    (void)state;
    harness g;
    harness_init(&g);
    const char *extra[] = {"--delivery-library", PERMD_FAKE_DELIVERY, "--max-groups", "1",
                           "--delivery-timeout-ms", "300", NULL};
    assert_int_equal(harness_start(&g, 0, extra, NULL), 0);
    permd_client *c[2];
    uint8_t id[PERMD_NCCL_ID_BYTES];
    uint32_t rank, nranks;
    for (int i = 0; i < 2; i++)
        assert_int_equal(permd_connect_unix(g.sock, &c[i]), 0);
    assert_int_equal(permd_group_join(c[0], "stuck", 7, id, &rank, &nranks), 0); /* the stand-in's never-forming 7 */
    assert_int_equal(permd_group_join(c[1], "next", 1, id, &rank, &nranks), PERMD_EBUSY);
    int rc = PERMD_EBUSY;
    for (int i = 0; i < 500 && rc == PERMD_EBUSY; i++) /* 300 ms to fail forming, then the slot is free */
        if ((rc = permd_group_join(c[1], "next", 1, id, &rank, &nranks)) == PERMD_EBUSY)
            usleep(10000);
    assert_int_equal(rc, 0);
    assert_true(harness_log_contains(&g, "event=group_end group=stuck failed=1"));
    permd_slice s = {.dataset = "d", .world = 1, .mode = PERMD_MODE_EXACT};
    uint64_t got;
    uint32_t width;
    assert_int_equal(permd_group_deliver(c[0], "stuck", &s, 4, 0, &got, &width, NULL), PERMD_ENOTFOUND); /* it ended */
    /* A group that formed outlives a failed send (the stand-in's time out after 300 ms): its members are told why,
     * and leave it as usual. */
    assert_int_equal(permd_put_dataset(c[1], "d", 1000, NULL, NULL), 0);
    assert_int_equal(permd_group_deliver(c[1], "next", &s, 4, 0, &got, &width, NULL), 0);
    rc = 0;
    for (int i = 0; i < 500 && rc == 0; i++)
        if ((rc = permd_group_deliver(c[1], "next", &s, 4, 0, &got, &width, NULL)) == 0)
            usleep(10000);
    assert_int_equal(rc, PERMD_EUNAVAILABLE);
    assert_non_null(strstr(permd_last_error(c[1]), "an NCCL send failed"));
    assert_int_equal(permd_group_leave(c[1], "next"), 0);
    for (int i = 0; i < 2; i++)
        permd_close(c[i]);
    assert_int_equal(harness_finish(&g), 0);
}

/* Ids arrive in the width of the receiver's buffer (Deliver.id_width): NCCL writes count * width bytes, so a dataset
 * over 2^32 samples delivered into an int32 tensor overran it by half. 8 takes any dataset; 4 is refused for one over
 * 2^32 before anything is sent; 0 is the dataset's own, as before. */
static void delivery_in_the_receivers_width(void **state)
{
    (void)state;
    harness g;
    harness_init(&g);
    const char *extra[] = {"--delivery-library", PERMD_FAKE_DELIVERY, "--delivery-timeout-ms", "600000", NULL};
    setenv("NCCL_NVLS_ENABLE", "1", 1); /* permd overrides it: the stand-in refuses to load otherwise */
    assert_int_equal(harness_start(&g, 0, extra, NULL), 0);
    unsetenv("NCCL_NVLS_ENABLE");
    permd_client *c;
    uint8_t id[PERMD_NCCL_ID_BYTES];
    uint32_t rank, nranks, width;
    uint64_t got, next;
    assert_int_equal(permd_connect_unix(g.sock, &c), 0);
    assert_int_equal(permd_group_join(c, "w", 1, id, &rank, &nranks), 0);
    assert_int_equal(permd_put_dataset(c, "small", 1000, NULL, NULL), 0);
    assert_int_equal(permd_put_dataset(c, "big", (uint64_t)1 << 33, NULL, NULL), 0);
    permd_slice small = {.dataset = "small", .world = 1, .mode = PERMD_MODE_EXACT};
    permd_slice big = {.dataset = "big", .world = 1, .mode = PERMD_MODE_EXACT};

    assert_int_equal(permd_group_deliver(c, "w", &big, 4, 4, &got, &width, &next), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "need 8 bytes"));
    assert_int_equal(permd_group_deliver(c, "w", &small, 4, 5, &got, &width, &next), PERMD_EINVAL); /* client-side */
    assert_int_equal(permd_group_deliver(c, "w", &small, 4, 8, &got, &width, &next), 0);
    assert_int_equal(width, 8);
    assert_int_equal(got, 4);
    assert_int_equal(next, 4);
    assert_int_equal(permd_group_deliver(c, "w", &small, 4, 4, &got, &width, &next), 0);
    assert_int_equal(width, 4);
    assert_int_equal(permd_group_deliver(c, "w", &small, 4, 0, &got, &width, &next), 0);
    assert_int_equal(width, 4);
    assert_int_equal(permd_group_deliver(c, "w", &big, 4, 0, &got, &width, &next), 0);
    assert_int_equal(width, 8);
    assert_int_equal(permd_group_deliver(c, "w", &big, 4, 8, &got, &width, &next), 0);
    assert_int_equal(width, 8);
    /* a width libpermd would not send: permd refuses it too */
    int fd = raw_connect_unix(g.sock);
    assert_true(fd >= 0);
    Permd__V1__JoinGroup join = PERMD__V1__JOIN_GROUP__INIT;
    join.group = "raw";
    join.members = 1;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT, *reply;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_JOIN_GROUP;
    env.join_group = &join;
    assert_int_equal(raw_send_env(fd, &env), 0);
    assert_int_equal(raw_recv_env(fd, 5000, &reply), 0);
    assert_int_equal(reply->body_case, PERMD__V1__ENVELOPE__BODY_JOIN_GROUP_REPLY);
    protobuf_c_message_free_unpacked(&reply->base, NULL);
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "small";
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    Permd__V1__Deliver del = PERMD__V1__DELIVER__INIT;
    del.group = "raw";
    del.slice = &sl;
    del.count = 4;
    del.id_width = 5;
    env.id = 2;
    env.body_case = PERMD__V1__ENVELOPE__BODY_DELIVER;
    env.deliver = &del;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    close(fd);
    permd_close(c);
    assert_int_equal(harness_finish(&g), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unavailable_and_unharmed),
        cmocka_unit_test(groups_and_their_queues_are_bounded),
        cmocka_unit_test(a_group_that_never_forms_frees_its_slot),
        cmocka_unit_test(delivery_in_the_receivers_width),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
