/* Integration: Digest through a real permd: parts add up to the whole, max_digest refuses with TOO_LARGE (and
 * libpermd asks in parts), and a digest running when permd stops gives up. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/digest.h"
#include "core/error.h"
#include "core/rank.h"
#include "harness.h"

#define N 100003
#define MAX_DIGEST 1000
#define HUGE_N "1099511627776" /* 2^40: digesting a rank of it takes hours */

static harness h;

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    const char *extra[] = {"--max-digest", "1000", NULL};
    return harness_start(&h, 0, extra, NULL) || harness_put(&h, "flat", N) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

static void send_digest(int fd, uint64_t id, const char *dataset, uint32_t world, uint32_t rank, uint64_t offset,
                        uint64_t count)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = (char *)dataset;
    sl.seed = 5;
    sl.epoch = 6;
    sl.world = world;
    sl.rank = rank;
    sl.mode = PERMD__V1__MODE__MODE_PAD;
    sl.offset = offset;
    Permd__V1__Digest m = PERMD__V1__DIGEST__INIT;
    m.slice = &sl;
    m.count = count;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_DIGEST;
    env.digest = &m;
    assert_int_equal(raw_send_env(fd, &env), 0);
}

/* The core's digest of the rank's next count ids from offset (count 0: all). */
static pd_digest core_digest(uint32_t world, uint32_t rank, uint64_t offset, uint64_t count)
{
    pd_perm p;
    pd_slice s = {world, rank, PD_MODE_PAD, offset};
    uint64_t left, got;
    assert_int_equal(pd_perm_init(&p, 5, 6, PD_STREAM_SAMPLES, N), 0);
    assert_int_equal(pd_slice_remaining(N, &s, &left), 0);
    if (count && count < left)
        left = count;
    uint64_t *ids = malloc((left ? left : 1) * sizeof *ids);
    assert_int_equal(pd_slice_fill_u64(&p, &s, left, ids, &got), 0);
    assert_true(got == left);
    pd_digest d;
    pd_digest_init(&d);
    for (uint64_t i = 0; i < got; i++)
        pd_digest_add(&d, ids[i]);
    free(ids);
    return d;
}

/* A count-limited Digest covers exactly the rank's next ids and says where to continue. */
static void test_parts(void **state)
{
    (void)state;
    int fd = raw_connect_unix(h.sock);
    send_digest(fd, 7, "flat", 3, 2, 30, 400);
    pd_envelope *env;
    assert_int_equal(raw_recv_env(fd, 10000, &env), 0);
    assert_int_equal(env->id, 7);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY);
    pd_digest want = core_digest(3, 2, 30, 400);
    const Permd__V1__DigestReply *r = env->digest_reply;
    assert_true(r->count == 400 && r->sum == want.sum && r->hash == want.hash);
    assert_int_equal(r->next_offset, 30 + 400 * 3);
    uint64_t left;
    pd_slice s = {3, 2, PD_MODE_PAD, 30};
    pd_slice_remaining(N, &s, &left);
    assert_int_equal(r->remaining, left - 400);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    close(fd);
}

/* Past max_digest: TOO_LARGE, and the connection keeps serving. */
static void test_too_large(void **state)
{
    (void)state;
    int fd = raw_connect_unix(h.sock);
    send_digest(fd, 1, "flat", 1, 0, 0, 0); /* all N ids */
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    send_digest(fd, 2, "flat", 1, 0, 0, MAX_DIGEST + 1);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    send_digest(fd, 3, "flat", 1, 0, N - 10, 0); /* the last 10 */
    pd_envelope *env;
    assert_int_equal(raw_recv_env(fd, 10000, &env), 0);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY);
    assert_int_equal(env->digest_reply->count, 10);
    assert_int_equal(env->digest_reply->remaining, 0);
    assert_int_equal(env->digest_reply->next_offset, N);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    close(fd);
}

/* libpermd splits a long slice into max_digest parts; the sum equals the core's whole digest. */
static void test_client_adds_parts(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    permd_server_info info;
    assert_int_equal(permd_server_info_get(c, &info), 0);
    assert_int_equal(info.max_digest, MAX_DIGEST);
    const uint64_t offsets[] = {0, 17, N - 1, N};
    for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; i++) {
        permd_slice s = {.dataset = "flat", .seed = 5, .epoch = 6, .world = 1, .rank = 0, .mode = PERMD_MODE_PAD,
                         .offset = offsets[i]};
        permd_digest got;
        assert_int_equal(permd_digest_slice(c, &s, &got), 0);
        pd_digest want = core_digest(1, 0, offsets[i], 0);
        assert_true(got.count == want.count && got.sum == want.sum && got.hash == want.hash);
    }
    permd_close(c);
}

/* A permd of its own (extra: its options) with dataset "huge" of 2^40 samples, and a client connected to it. */
static permd_client *start_huge(harness *hh, const char *const *extra)
{
    permd_client *c;
    harness_init(hh);
    assert_int_equal(harness_start(hh, 0, extra, NULL), 0);
    assert_int_equal(permd_connect_unix(hh->sock, &c), 0);
    assert_int_equal(permd_put_dataset(c, "huge", UINT64_C(1) << 40, NULL, NULL), 0);
    return c;
}

/* SIGTERM stops a digest that would run for hours: the client gets UNAVAILABLE, and permd exits 0
 * long before shutdown_timeout_ms (while a job runs, the loop cannot end). */
static void test_stop_cancels_digest(void **state)
{
    (void)state;
    harness big;
    const char *extra[] = {"--max-digest", "9223372036854775808", "--shutdown-timeout-ms", "3600000", NULL};
    permd_close(start_huge(&big, extra));

    int fd = raw_connect_unix(big.sock);
    send_digest(fd, 2, "huge", 1, 0, 0, 0);
    usleep(300 * 1000); /* the worker has started */
    double t0 = test_now_s();
    kill(big.pid, SIGTERM);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_UNAVAILABLE);
    close(fd);
    int st = harness_stop(&big, SIGTERM); /* waits 30 s, then SIGKILL */
    assert_true(harness_exited_with(st, 0));
    assert_true(test_now_s() - t0 < 25);
    harness_cleanup(&big);
}

/* A client that leaves during a long digest: the work stops at the next turn of the job (permd reads nothing from a
 * busy connection, so it asks the socket between turns), instead of running to the end for nobody. */
static void test_peer_gone_stops_digest(void **state)
{
    (void)state;
    harness big;
    const char *extra[] = {"--max-digest", "9223372036854775808", "--job-slice-ids", "65536", NULL};
    permd_client *c = start_huge(&big, extra);

    int fd = raw_connect_unix(big.sock);
    send_digest(fd, 2, "huge", 1, 0, 0, 0); /* hours of work */
    usleep(200 * 1000);
    close(fd);
    int gone = 0;
    for (int i = 0; i < 200 && !(gone = harness_log_contains(&big, "conn_gone")); i++)
        usleep(50 * 1000);
    assert_true(gone);
    /* the pool is free again: another client's request is answered */
    permd_digest d;
    permd_slice s = {.dataset = "huge", .seed = 1, .world = 1 << 20, .mode = PERMD_MODE_EXACT};
    assert_int_equal(permd_digest_slice(c, &s, &d), 0);
    assert_int_equal(d.count, UINT64_C(1) << 20);
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&big, SIGTERM), 0));
    harness_cleanup(&big);
}

/* The negative control of the test above: a client that sends a Digest of many turns and then shuts down only its
 * writing half still gets its answer (an EOF is not a peer gone). */
static void test_half_close_gets_answer(void **state)
{
    (void)state;
    harness big;
    harness_init(&big);
    const char *extra[] = {"--job-slice-ids", "65536", NULL};
    assert_int_equal(harness_start(&big, 0, extra, NULL), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(big.sock, &c), 0);
    assert_int_equal(permd_put_dataset(c, "mid", UINT64_C(1) << 22, NULL, NULL), 0);
    permd_close(c);
    int fd = raw_connect_unix(big.sock);
    send_digest(fd, 2, "mid", 1, 0, 0, 0); /* 64 turns of 65536 ids */
    shutdown(fd, SHUT_WR);
    pd_envelope *env = NULL;
    assert_int_equal(raw_recv_env(fd, 20000, &env), 0);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY);
    assert_int_equal(env->digest_reply->count, UINT64_C(1) << 22);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    close(fd);
    assert_false(harness_log_contains(&big, "conn_gone"));
    assert_true(harness_exited_with(harness_stop(&big, SIGTERM), 0));
    harness_cleanup(&big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parts),
        cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_client_adds_parts),
        cmocka_unit_test(test_stop_cancels_digest),
        cmocka_unit_test(test_peer_gone_stops_digest),
        cmocka_unit_test(test_half_close_gets_answer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
