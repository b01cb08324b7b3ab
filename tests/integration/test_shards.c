/* Integration: sharded datasets through a real permd: chunked upload, fetch/stream/locations/inverse/digest
 * equal to the core, restart keeps the layout, and every bad upload gets its typed error. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/digest.h"
#include "core/error.h"
#include "core/shards.h"
#include "harness.h"

static harness h;

/* A layout with empty and single-sample shards among larger ones. */
#define NSHARDS 5000
static uint64_t sizes[NSHARDS];

static int setup(void **state)
{
    (void)state;
    uint64_t rng = 42;
    for (int i = 0; i < NSHARDS; i++)
        sizes[i] = i % 7 == 0 ? 0 : i % 5 == 0 ? 1 : test_below(&rng, 40);
    harness_init(&h);
    /* A small max_frame forces the upload into many parts; a small inline budget exercises the pool. */
    const char *extra[] = {"--max-frame", "4096", "--inline-ids", "64", NULL};
    return harness_start(&h, 0, extra, NULL);
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

/* The core's plan for comparison. */
typedef struct ref_plan {
    uint64_t start[NSHARDS + 1];
    uint64_t *mem;
    pd_shard_plan plan;
} ref_plan;

static void ref_init(ref_plan *r, uint64_t seed, uint64_t epoch, uint64_t window, uint64_t lanes)
{
    assert_int_equal(pd_shard_layout_build(sizes, NSHARDS, r->start), 0);
    r->mem = malloc(pd_shard_plan_bytes(NSHARDS));
    assert_int_equal(pd_shard_plan_init(&r->plan, r->start, NSHARDS, seed, epoch, window, lanes, r->mem,
                                        pd_shard_plan_bytes(NSHARDS)),
                     0);
}

static void put_and_serve(void **state)
{
    (void)state;
    permd_client *c;
    permd_dataset d;
    int32_t created;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset_sharded(c, "tars", sizes, NSHARDS, 4, 3, &d, &created), 0);
    assert_int_equal(created, 1);
    assert_int_equal(d.shards, NSHARDS);
    assert_int_equal(d.window, 4);
    assert_int_equal(d.lanes, 3);
    /* idempotent, and a different layout is a conflict */
    assert_int_equal(permd_put_dataset_sharded(c, "tars", sizes, NSHARDS, 4, 3, &d, &created), 0);
    assert_int_equal(created, 0);
    sizes[17]++;
    assert_int_equal(permd_put_dataset_sharded(c, "tars", sizes, NSHARDS, 4, 3, &d, &created), PERMD_ECONFLICT);
    sizes[17]--;
    assert_int_equal(permd_put_dataset_sharded(c, "tars", sizes, NSHARDS, 5, 3, &d, &created), PERMD_ECONFLICT);
    assert_int_equal(permd_put_dataset(c, "tars", d.size, &d, &created), PERMD_ECONFLICT);

    ref_plan r;
    ref_init(&r, 11, 2, 4, 3);
    const uint64_t n = r.plan.n;
    uint64_t *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
    uint64_t *shards = malloc(n * sizeof *shards), *offs = malloc(n * sizeof *offs);
    for (uint32_t world = 1; world <= 4; world++) {
        for (uint32_t rank = 0; rank < world; rank++) {
            permd_slice s = {.dataset = "tars", .seed = 11, .epoch = 2, .world = world, .rank = rank,
                             .mode = PERMD_MODE_PAD, .offset = world};
            pd_slice ps = {.world = world, .rank = rank, .mode = PD_MODE_PAD, .offset = world};
            uint64_t k, nw, next, total = 0;
            assert_int_equal(pd_shard_slice_fill_u64(&r.plan, &ps, n, want, &nw), 0);
            while (total < nw) { /* fetch in pieces */
                assert_int_equal(permd_fetch_u64(c, &s, 777, got + total, &k, &next), 0);
                total += k;
                s.offset = next;
            }
            assert_int_equal(total, nw);
            assert_memory_equal(got, want, nw * sizeof *got);
            s.offset = world;
            assert_int_equal(permd_fetch_locations(c, &s, 900, shards, offs, &k, NULL), 0);
            for (uint64_t i = 0; i < k; i++)
                assert_true(r.start[shards[i]] + offs[i] == want[i]);
        }
    }
    /* stream with window/lanes overrides, ids and locations */
    ref_plan r2;
    ref_init(&r2, 11, 3, 9, 2);
    pd_slice ps = {.world = 2, .rank = 1, .mode = PD_MODE_EXACT};
    uint64_t nw;
    assert_int_equal(pd_shard_slice_fill_u64(&r2.plan, &ps, n, want, &nw), 0);
    for (int loc = 0; loc < 2; loc++) {
        permd_slice s = {.dataset = "tars", .seed = 11, .epoch = 3, .world = 2, .rank = 1, .mode = PERMD_MODE_EXACT,
                         .window = 9, .lanes = 2};
        permd_stream *st;
        assert_int_equal(permd_stream_open_ex(c, &s, 333, 0, loc ? PERMD_LOCATIONS : 0, &st), 0);
        uint64_t total = 0, count;
        const void *ids;
        uint32_t width;
        while (permd_stream_next(st, &ids, &width, &count) == 0 && count) {
            assert_int_equal(width, loc ? 16 : pd_id_width(n));
            for (uint64_t i = 0; i < count; i++) {
                uint64_t v = loc ? r2.start[((const uint64_t *)ids)[2 * i]] + ((const uint64_t *)ids)[2 * i + 1]
                                 : ((const uint32_t *)ids)[i];
                assert_true(v == want[total + i]);
            }
            total += count;
        }
        assert_int_equal(total, nw);
        assert_int_equal(permd_stream_close(st), 0);
    }
    /* inverse and digest */
    uint64_t samples[3] = {want[0], want[5], want[nw - 1]}, pos[3];
    uint32_t ranks[3];
    assert_int_equal(permd_inverse(c, "tars", 11, 2, 4, -1, samples, 3, pos, ranks), 0);
    for (int i = 0; i < 3; i++) {
        uint64_t back;
        assert_int_equal(pd_shard_position(&r.plan, samples[i], &back), 0);
        assert_true(pos[i] == back);
        assert_int_equal(ranks[i], back % 4);
    }
    permd_digest dg;
    permd_slice s = {.dataset = "tars", .seed = 11, .epoch = 3, .world = 2, .rank = 1, .mode = PERMD_MODE_EXACT,
                     .window = 9, .lanes = 2};
    assert_int_equal(permd_digest_slice(c, &s, &dg), 0);
    pd_digest local;
    pd_digest_init(&local);
    for (uint64_t i = 0; i < nw; i++)
        pd_digest_add(&local, want[i]);
    assert_int_equal(dg.count, local.count);
    assert_true(dg.sum == local.sum && dg.hash == local.hash);
    /* the same digest for a flat dataset, against the core */
    assert_int_equal(permd_put_dataset(c, "flat", 10007, NULL, NULL), 0);
    permd_slice fs = {.dataset = "flat", .seed = 3, .epoch = 4, .world = 5, .rank = 2, .mode = PERMD_MODE_PAD,
                      .offset = 50};
    pd_perm p;
    pd_slice fps = {.world = 5, .rank = 2, .mode = PD_MODE_PAD, .offset = 50};
    assert_int_equal(pd_perm_init(&p, 3, 4, 0, 10007), 0);
    assert_int_equal(pd_digest_slice(&p, &fps, &local), 0);
    assert_int_equal(permd_digest_slice(c, &fs, &dg), 0);
    assert_true(dg.count == local.count && dg.sum == local.sum && dg.hash == local.hash);
    permd_close(c);
    free(got);
    free(want);
    free(shards);
    free(offs);
    free(r.mem);
    free(r2.mem);
}

/* A window of S shards or more is one window (protocol.md): 2^32 - 1, the spec's largest K, and 2^64 - 1 give
 * the order of K = S, as Fetch overrides and as a dataset's stored default. */
static void one_window_however_large(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset_sharded(c, "whole", sizes, NSHARDS, UINT64_MAX, 1, NULL, NULL), 0);
    ref_plan r;
    ref_init(&r, 5, 1, NSHARDS, 2);
    enum { COUNT = 600 };
    uint64_t want[COUNT], got[COUNT], k, nw;
    pd_slice ps = {.world = 3, .rank = 2, .mode = PD_MODE_PAD, .offset = 40};
    assert_int_equal(pd_shard_slice_fill_u64(&r.plan, &ps, COUNT, want, &nw), 0);
    const uint64_t windows[3] = {0, UINT32_MAX, UINT64_MAX}; /* 0: the dataset's own, 2^64 - 1 */
    for (int i = 0; i < 3; i++) {
        permd_slice s = {.dataset = "whole", .seed = 5, .epoch = 1, .world = 3, .rank = 2, .mode = PERMD_MODE_PAD,
                         .offset = 40, .window = windows[i], .lanes = 2};
        assert_int_equal(permd_fetch_u64(c, &s, COUNT, got, &k, NULL), 0);
        assert_int_equal(k, nw);
        assert_memory_equal(got, want, nw * sizeof *got);
    }
    permd_close(c);
    free(r.mem);
}

static void restart_keeps_layout(void **state)
{
    (void)state;
    assert_int_equal(WEXITSTATUS(harness_stop(&h, SIGTERM)), 0);
    const char *extra[] = {"--max-frame", "4096", NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    permd_client *c;
    permd_dataset d;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_get_dataset(c, "tars", &d), 0);
    assert_int_equal(d.shards, NSHARDS);
    assert_int_equal(d.window, 4);
    assert_int_equal(d.lanes, 3);
    ref_plan r;
    ref_init(&r, 1, 1, 4, 3);
    uint64_t got[100], want[100], k;
    permd_slice s = {.dataset = "tars", .seed = 1, .epoch = 1, .world = 3, .rank = 2, .mode = PERMD_MODE_DROP};
    pd_slice ps = {.world = 3, .rank = 2, .mode = PD_MODE_DROP};
    assert_int_equal(permd_fetch_u64(c, &s, 100, got, &k, NULL), 0);
    assert_int_equal(pd_shard_slice_fill_u64(&r.plan, &ps, 100, want, &k), 0);
    assert_memory_equal(got, want, sizeof got);
    permd_close(c);
    free(r.mem);
}

/* max_count ids of 16 bytes (locations) may be more than a frame holds (2^31 - 1 bytes): such a Fetch is
 * TOO_LARGE, naming the limit, not INTERNAL "reply header does not fit". Nothing is generated, so the
 * buffers are never touched. */
static void locations_past_a_frame(void **state)
{
    (void)state;
    assert_int_equal(WEXITSTATUS(harness_stop(&h, SIGTERM)), 0);
    const char *extra[] = {"--max-count", "134217728", NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    const uint64_t n = UINT64_C(1) << 27, two[2] = {n, n};
    permd_client *c;
    permd_dataset d;
    int32_t created;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset_sharded(c, "big", two, 2, 1, 1, &d, &created), 0);
    uint64_t *shards = malloc(n * sizeof *shards), *offs = malloc(n * sizeof *offs), k;
    assert_non_null(shards);
    assert_non_null(offs);
    permd_slice s = {.dataset = "big", .seed = 1, .epoch = 0, .world = 1, .rank = 0, .mode = PERMD_MODE_EXACT};
    assert_int_equal(permd_fetch_locations(c, &s, n, shards, offs, &k, NULL), PERMD_ETOOBIG);
    if (!strstr(permd_last_error(c), "exceed a frame"))
        fail_msg("error: %s", permd_last_error(c));
    assert_int_equal(permd_fetch_locations(c, &s, 4, shards, offs, &k, NULL), 0); /* the connection serves on */
    assert_int_equal(k, 4);
    /* a Stream of such batches too (it was INTERNAL "stream batch failed") */
    int fd = raw_connect_unix(h.sock);
    Permd__V1__Slice slice = PERMD__V1__SLICE__INIT;
    slice.dataset = "big";
    slice.world = 1;
    slice.mode = PERMD__V1__MODE__MODE_EXACT;
    assert_int_equal(raw_send_stream(fd, 7, &slice, n, 1, 0, 1), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    close(fd);
    free(shards);
    free(offs);
    permd_close(c);
}

/* A raw sharded upload's part of `name`: n sizes of 1 from `first`, of `total`; the reply's envelope. */
static pd_envelope *upload_part(int fd, const char *name, uint64_t first, uint64_t n, uint64_t total)
{
    pd_envelope *rep;
    assert_int_equal(raw_send_upload_part(fd, name, total, first, n), 0);
    assert_int_equal(raw_recv_env(fd, 5000, &rep), 0);
    return rep;
}

/* An upload left unfinished holds its share of upload_memory only until upload_timeout_ms passes without a
 * part: it blocked every other sharded upload for as long as its connection stayed open. Then its memory goes,
 * its connection stays open, and its next part says why it is refused. */
static void idle_upload_expires(void **state)
{
    (void)state;
    assert_int_equal(WEXITSTATUS(harness_stop(&h, SIGTERM)), 0);
    const char *extra[] = {"--upload-memory", "65536", "--upload-timeout-ms", "300", NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    int idle = raw_connect_unix(h.sock), other = raw_connect_unix(h.sock);
    pd_envelope *rep = upload_part(idle, "idle", 0, 6000, 10000); /* 48 KB of 64 */
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    int tries = 0, done = 0;
    for (; tries < 100 && !done; tries++) { /* 32 KB more: refused while the idle upload holds its share */
        rep = upload_part(other, "other", 0, 4000, 4000);
        done = rep->body_case == PERMD__V1__ENVELOPE__BODY_DATASET_REPLY;
        if (!done) {
            assert_int_equal(rep->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
            usleep(50000);
        }
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    assert_true(done);
    assert_true(tries > 1); /* the first try came before the timeout */
    rep = upload_part(idle, "idle", 6000, 4000, 10000);
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(rep->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    if (!strstr(rep->error->message, "upload_timeout_ms (300 ms)"))
        fail_msg("error: %s", rep->error->message);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    rep = upload_part(idle, "idle", 0, 4000, 4000); /* the connection serves on: a new upload works */
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    assert_non_null(rep->dataset_reply->dataset);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    assert_true(harness_log_contains(&h, "upload_expired"));
    close(idle);
    close(other);
}

/* Raw PutDataset parts that break the upload rules each get a typed error. */
/* Send a sharded upload's part and read its DatasetReply (the caller frees it). */
static pd_envelope *send_part(int fd, const pd_envelope *env)
{
    pd_envelope *rep;
    assert_int_equal(raw_send_env(fd, env), 0);
    assert_int_equal(raw_recv_env(fd, 2000, &rep), 0);
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    return rep;
}

static void bad_uploads(void **state)
{
    (void)state;
    int fd = raw_connect_unix(h.sock);
    uint64_t three[3] = {1, 2, 3}, zeros[2] = {0, 0};
    Permd__V1__PutDataset m = PERMD__V1__PUT_DATASET__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.body_case = PERMD__V1__ENVELOPE__BODY_PUT_DATASET;
    env.put_dataset = &m;
    m.name = "up";
    /* a continuation with no upload in progress */
    m.shards_total = 6;
    m.shards_first = 3;
    m.shard_sizes = three;
    m.n_shard_sizes = 3;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    /* more sizes than announced */
    m.shards_total = 2;
    m.shards_first = 0;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    /* a gap: first part of 3, then a part claiming to start at 4 */
    m.shards_total = 9;
    m.shards_first = 0;
    assert_int_equal(raw_send_env(fd, &env), 0);
    pd_envelope *rep;
    assert_int_equal(raw_recv_env(fd, 2000, &rep), 0);
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    assert_int_equal(rep->dataset_reply->shards_received, 3);
    assert_null(rep->dataset_reply->dataset);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    m.shards_first = 4;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    /* all-empty shards: no samples */
    m.shards_total = 2;
    m.shards_first = 0;
    m.shard_sizes = zeros;
    m.n_shard_sizes = 2;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    /* a size that is not the sum */
    m.shard_sizes = three;
    m.n_shard_sizes = 3;
    m.shards_total = 3;
    m.size = 7;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    /* shard fields on a flat put */
    m.size = 6;
    m.shards_total = 0;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    /* more shards than max_shards */
    m.n_shard_sizes = 0;
    m.shards_total = UINT64_C(1) << 40;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    /* parts without sizes (found by fuzz_server): accepted, counted as nothing, then completed */
    m.shards_total = 3;
    m.size = 0;
    m.shard_sizes = NULL;
    for (int part = 0; part < 2; part++) {
        assert_int_equal(raw_send_env(fd, &env), 0);
        assert_int_equal(raw_recv_env(fd, 2000, &rep), 0);
        assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
        assert_int_equal(rep->dataset_reply->shards_received, 0);
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    m.shard_sizes = three;
    m.n_shard_sizes = 3;
    assert_int_equal(raw_send_env(fd, &env), 0);
    assert_int_equal(raw_recv_env(fd, 2000, &rep), 0);
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    assert_non_null(rep->dataset_reply->dataset);
    assert_int_equal(rep->dataset_reply->dataset->size, 6);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    /* size, window and lanes on a later part: taken where no earlier part said them, refused where one said others
     * (they had been dropped without a word) */
    m.name = "up2";
    m.shards_total = 6;
    m.shards_first = 0;
    m.window = 4;
    protobuf_c_message_free_unpacked(&send_part(fd, &env)->base, NULL);
    m.shards_first = 3;
    m.window = 5;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    m.window = 4;
    assert_int_equal(raw_send_env(fd, &env), 0); /* the upload was dropped */
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    m.shards_first = 0;
    m.window = 0;
    protobuf_c_message_free_unpacked(&send_part(fd, &env)->base, NULL);
    m.shards_first = 3;
    m.window = 5;
    m.lanes = 3;
    m.size = 12;
    rep = send_part(fd, &env);
    assert_non_null(rep->dataset_reply->dataset);
    assert_int_equal(rep->dataset_reply->dataset->size, 12);
    assert_int_equal(rep->dataset_reply->dataset->window, 5);
    assert_int_equal(rep->dataset_reply->dataset->lanes, 3);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    m.window = m.lanes = 0;
    m.size = 0;
    close(fd);
    /* locations and window on a flat dataset; the daemon still serves */
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset(c, "plain", 100, NULL, NULL), 0);
    uint64_t a[4], b[4], k;
    permd_slice s = {.dataset = "plain", .world = 1, .mode = PERMD_MODE_EXACT};
    assert_int_equal(permd_fetch_locations(c, &s, 4, a, b, &k, NULL), PERMD_EINVAL);
    s.window = 3;
    assert_int_equal(permd_fetch_u64(c, &s, 4, a, &k, NULL), PERMD_EINVAL);
    s.window = 0;
    assert_int_equal(permd_fetch_u64(c, &s, 4, a, &k, NULL), 0);
    assert_int_equal(k, 4);
    permd_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(put_and_serve),
        cmocka_unit_test(one_window_however_large),
        cmocka_unit_test(restart_keeps_layout),
        cmocka_unit_test(bad_uploads),
        cmocka_unit_test(locations_past_a_frame),
        cmocka_unit_test(idle_upload_expires),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
