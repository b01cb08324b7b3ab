/* Integration: each kind of bad input gets its typed error, and permd keeps serving everyone else. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/error.h"
#include "core/rank.h"
#include "harness.h"

#define MAX_FRAME 4096
#define MAX_COUNT 5000

static harness h;
static char token_path[160];

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    snprintf(token_path, sizeof token_path, "%s/token", h.dir);
    FILE *f = fopen(token_path, "w");
    fputs("s3cret-token\n", f);
    fclose(f);
    const char *extra[] = {"--max-frame", "4096", "--max-count", "5000", "--max-connections", "8",
                           "--max-streams", "2", "--token-file", token_path, NULL};
    return harness_start(&h, 1, extra, NULL) || harness_put(&h, "data", 1000) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

/* After every bad input: a new client still gets correct ids. */
static void assert_still_serving(void)
{
    permd_client *c;
    uint64_t ids[16], want[16], got, wgot;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    permd_slice s = {.dataset = "data", .seed = 3, .epoch = 4, .world = 2, .rank = 1, .mode = PERMD_MODE_DROP};
    assert_int_equal(permd_fetch_u64(c, &s, 16, ids, &got, NULL), 0);
    pd_perm p;
    pd_slice sl = {2, 1, PD_MODE_DROP, 0};
    pd_perm_init(&p, 3, 4, PD_STREAM_SAMPLES, 1000);
    pd_slice_fill_u64(&p, &sl, 16, want, &wgot);
    assert_int_equal(got, wgot);
    assert_memory_equal(ids, want, sizeof ids);
    permd_close(c);
}

static void test_malformed_frame(void **state)
{
    (void)state;
    int fd = raw_connect_unix(h.sock);
    const uint8_t frame[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(raw_send(fd, frame, sizeof frame), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_BAD_FRAME);
    assert_true(raw_wait_eof(fd, 10000)); /* closed after the error */
    close(fd);
    assert_still_serving();
}

static void test_oversized_frame(void **state)
{
    (void)state;
    int fd = raw_connect_unix(h.sock);
    uint8_t hdr[4];
    pd_store_le32(hdr, MAX_FRAME + 1);
    assert_int_equal(raw_send(fd, hdr, 4), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    assert_true(raw_wait_eof(fd, 10000));
    close(fd);

    /* Announced large and actually sent: the error still arrives (no reset loses it). */
    fd = raw_connect_unix(h.sock);
    uint8_t *big = calloc(1, 4 + 3 * MAX_FRAME);
    pd_store_le32(big, 3 * MAX_FRAME);
    assert_int_equal(raw_send(fd, big, 4 + 3 * MAX_FRAME), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    assert_true(raw_wait_eof(fd, 10000));
    close(fd);
    free(big);
    assert_still_serving();
}

static void test_unknown_message(void **state)
{
    (void)state;
    int fd = raw_connect_unix(h.sock);
    /* Envelope{id: 7, field 99: bytes "hi"}: well-formed, but no message permd knows. */
    const uint8_t unknown[] = {9, 0, 0, 0, 0x08, 0x07, 0x9a, 0x06, 0x02, 'h', 'i', 0x10, 0x01};
    uint8_t frame[sizeof unknown];
    memcpy(frame, unknown, sizeof frame);
    pd_store_le32(frame, sizeof frame - 4);
    assert_int_equal(raw_send(fd, frame, sizeof frame), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_UNKNOWN_MESSAGE);
    const uint8_t empty[] = {0, 0, 0, 0}; /* an empty envelope */
    assert_int_equal(raw_send(fd, empty, 4), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_UNKNOWN_MESSAGE);
    /* A server-only message sent by a client. */
    Permd__V1__StatsReply sr = PERMD__V1__STATS_REPLY__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT, *rep;
    env.id = 8;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STATS_REPLY;
    env.stats_reply = &sr;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_UNKNOWN_MESSAGE);
    /* The connection stays usable. */
    Permd__V1__Stats st = PERMD__V1__STATS__INIT;
    env.id = 9;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
    env.stats = &st;
    assert_int_equal(raw_send_env(fd, &env), 0);
    assert_int_equal(raw_recv_env(fd, 10000, &rep), 0);
    assert_int_equal(rep->id, 9);
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    close(fd);
    assert_still_serving();
}

static void expect_fetch_error(permd_client *c, permd_slice s, uint64_t count, int err, const char *needle)
{
    uint64_t ids[8], got;
    int rc = permd_fetch_u64(c, &s, count, ids, &got, NULL);
    if (rc != err || !strstr(permd_last_error(c), needle))
        fail_msg("expected %s with '%s', got %d: %s", pd_errname(err), needle, rc, permd_last_error(c));
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    permd_slice ok = {.dataset = "data", .world = 4, .rank = 1, .mode = PERMD_MODE_PAD};
    permd_slice s = ok;
    s.world = 0;
    expect_fetch_error(c, s, 1, PERMD_EINVAL, "INVALID_ARGUMENT: slice.world");
    s = ok;
    s.rank = 4;
    expect_fetch_error(c, s, 1, PERMD_EINVAL, "rank 4 must be below world 4");
    s = ok;
    s.offset = 1001; /* T = 1000 for W = 4, pad */
    expect_fetch_error(c, s, 1, PERMD_EINVAL, "past the end");
    expect_fetch_error(c, ok, MAX_COUNT + 1, PERMD_ETOOBIG, "TOO_LARGE");
    s = ok;
    s.dataset = "no/such";
    expect_fetch_error(c, s, 1, PERMD_EINVAL, "invalid dataset name");

    /* After each error the same connection goes on. */
    uint64_t ids[8], got;
    assert_int_equal(permd_fetch_u64(c, &ok, 8, ids, &got, NULL), 0);
    assert_int_equal(got, 8);
    s = ok;
    s.offset = 1000; /* exactly at the end: empty, not an error */
    assert_int_equal(permd_fetch_u64(c, &s, 8, ids, &got, NULL), 0);
    assert_int_equal(got, 0);

    assert_int_equal(permd_put_dataset(c, "zero", 0, NULL, NULL), PERMD_EINVAL);
    assert_int_equal(permd_put_dataset(c, "bad name", 5, NULL, NULL), PERMD_EINVAL);
    assert_int_equal(permd_put_dataset(c, "huge", (UINT64_C(1) << 63) + 1, NULL, NULL), PERMD_EINVAL);
    uint64_t sample = 1000, pos;
    assert_int_equal(permd_inverse(c, "data", 1, 2, 4, -1, &sample, 1, &pos, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "not below"));
    assert_int_equal(permd_inverse(c, "data", 1, 2, 0, -1, &sample, 0, &pos, NULL), PERMD_EINVAL);
    permd_stream *st;
    assert_int_equal(permd_stream_open(c, &ok, MAX_COUNT + 1, 0, &st), PERMD_ETOOBIG);
    permd_close(c);

    /* What libpermd never sends, a raw client can: mode unspecified, credits 0. */
    int fd = raw_connect_unix(h.sock);
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "data";
    sl.world = 1;
    Permd__V1__Fetch f = PERMD__V1__FETCH__INIT;
    f.slice = &sl;
    f.count = 1;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_FETCH;
    env.fetch = &f;
    raw_send_env(fd, &env);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    f.slice = NULL;
    raw_send_env(fd, &env);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    Permd__V1__Stream sm = PERMD__V1__STREAM__INIT;
    sm.slice = &sl;
    sm.batch = 10;
    sm.credits = 0;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STREAM;
    env.stream = &sm;
    raw_send_env(fd, &env);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    close(fd);
    assert_still_serving();
}

static void test_not_found_and_conflict(void **state)
{
    (void)state;
    permd_client *c;
    permd_dataset d;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_get_dataset(c, "missing", &d), PERMD_ENOTFOUND);
    assert_non_null(strstr(permd_last_error(c), "NOT_FOUND"));
    assert_int_equal(permd_delete_dataset(c, "missing"), PERMD_ENOTFOUND);
    permd_slice s = {.dataset = "missing", .world = 1, .mode = PERMD_MODE_PAD};
    expect_fetch_error(c, s, 1, PERMD_ENOTFOUND, "missing");
    permd_stream *st;
    assert_int_equal(permd_stream_open(c, &s, 10, 0, &st), PERMD_ENOTFOUND);
    uint64_t sample = 0, pos;
    assert_int_equal(permd_inverse(c, "missing", 1, 2, 1, -1, &sample, 1, &pos, NULL), PERMD_ENOTFOUND);

    int32_t created;
    assert_int_equal(permd_put_dataset(c, "data", 1000, &d, &created), 0);
    assert_int_equal(created, 0);
    assert_int_equal(permd_put_dataset(c, "data", 1001, &d, &created), PERMD_ECONFLICT);
    assert_non_null(strstr(permd_last_error(c), "size 1000"));
    assert_int_equal(permd_get_dataset(c, "data", &d), 0);
    assert_int_equal(d.size, 1000); /* unchanged */
    permd_close(c);
    assert_still_serving();
}

static void test_token(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_tcp(h.tcp, "wrong", &c), PERMD_EAUTH);
    assert_non_null(strstr(permd_last_error(NULL), "UNAUTHENTICATED"));
    assert_int_equal(permd_connect_tcp(h.tcp, NULL, &c), PERMD_EAUTH);
    assert_int_equal(permd_connect_tcp(h.tcp, "s3cret-token-and-more", &c), PERMD_EAUTH);

    /* A request before Hello on TCP: refused and closed. */
    int fd = raw_connect_tcp(h.tcp);
    Permd__V1__ListDatasets l = PERMD__V1__LIST_DATASETS__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 3;
    env.body_case = PERMD__V1__ENVELOPE__BODY_LIST_DATASETS;
    env.list_datasets = &l;
    raw_send_env(fd, &env);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED);
    assert_true(raw_wait_eof(fd, 10000));
    close(fd);

    /* The right token works over TCP; the Unix socket needs none. */
    assert_int_equal(permd_connect_tcp(h.tcp, "s3cret-token", &c), 0);
    size_t total;
    assert_int_equal(permd_list_datasets(c, NULL, 0, &total), 0);
    assert_true(total >= 1);
    permd_close(c);
    assert_still_serving();
}

static void test_overloaded(void **state)
{
    (void)state;
    permd_client *c[8];
    int n = 0;
    while (n < 8 && permd_connect_unix(h.sock, &c[n]) == 0)
        n++;
    assert_int_equal(n, 8); /* max_connections = 8 */
    permd_client *extra;
    assert_int_equal(permd_connect_unix(h.sock, &extra), PERMD_EBUSY);
    assert_non_null(strstr(permd_last_error(NULL), "OVERLOADED"));
    /* the ones already in are unaffected */
    permd_dataset d;
    assert_int_equal(permd_get_dataset(c[7], "data", &d), 0);
    for (int i = 0; i < n; i++)
        permd_close(c[i]);

    /* Streams per connection: max_streams = 2, the third is OVERLOADED. */
    int fd = raw_connect_unix(h.sock);
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "data";
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_PAD;
    Permd__V1__Stream sm = PERMD__V1__STREAM__INIT;
    sm.slice = &sl;
    sm.batch = 10;
    sm.credits = 1;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT, *rep;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STREAM;
    env.stream = &sm;
    for (uint64_t id = 1; id <= 2; id++) {
        env.id = id;
        raw_send_env(fd, &env);
        assert_int_equal(raw_recv_env(fd, 10000, &rep), 0); /* one batch per credit */
        assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    env.id = 2; /* reusing a live stream's id */
    raw_send_env(fd, &env);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_CONFLICT);
    env.id = 3;
    raw_send_env(fd, &env);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED);
    close(fd);
    /* wait until permd has seen those connections go */
    for (int i = 0; i < 500; i++) {
        permd_client *probe;
        if (permd_connect_unix(h.sock, &probe) == 0) {
            permd_stats st;
            int busy = permd_stats_get(probe, &st) || st.connections > 1;
            permd_close(probe);
            if (!busy)
                break;
        }
        usleep(10000);
    }
    assert_still_serving();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_frame),
        cmocka_unit_test(test_oversized_frame),
        cmocka_unit_test(test_unknown_message),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_not_found_and_conflict),
        cmocka_unit_test(test_token),
        cmocka_unit_test(test_overloaded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
