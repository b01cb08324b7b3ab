/* Integration: stream credits, in-order batches, Cancel, max_count, resume offsets and several streams per connection. */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/perm.h"
#include "core/rank.h"
#include "harness.h"

#define N 100000

static harness h;

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    const char *extra[] = {"--inline-ids", "100", NULL}; /* batches of 100 inline, larger on the pool */
    return harness_start(&h, 0, extra, NULL) || harness_put(&h, "d", N) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

/* A Stream of slice sl in batches of batch ids (max_count 0: none), as request id. */
static void send_stream_slice(int fd, uint64_t id, Permd__V1__Slice *sl, uint64_t batch, uint32_t credits,
                              uint64_t max_count)
{
    assert_int_equal(raw_send_stream(fd, id, sl, batch, credits, max_count, 0), 0);
}

static void send_stream(int fd, uint64_t id, uint64_t batch, uint32_t credits, uint64_t max_count, uint64_t offset)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "d";
    sl.seed = 5;
    sl.epoch = 6;
    sl.world = 3;
    sl.rank = 2;
    sl.mode = PERMD__V1__MODE__MODE_PAD;
    sl.offset = offset;
    send_stream_slice(fd, id, &sl, batch, credits, max_count);
}

static void send_credit(int fd, uint64_t id, uint32_t credits)
{
    Permd__V1__Credit m = PERMD__V1__CREDIT__INIT;
    m.credits = credits;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_CREDIT;
    env.credit = &m;
    assert_int_equal(raw_send_env(fd, &env), 0);
}

static void send_cancel(int fd, uint64_t id)
{
    Permd__V1__Cancel m = PERMD__V1__CANCEL__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_CANCEL;
    env.cancel = &m;
    assert_int_equal(raw_send_env(fd, &env), 0);
}

/* The k-th id (from offset) of rank 2 of 3, pad mode, per the core. */
static uint64_t want_id(uint64_t offset, uint64_t k)
{
    pd_perm p;
    pd_perm_init(&p, 5, 6, PD_STREAM_SAMPLES, N);
    return pd_stream_sample(&p, offset + 2 + 3 * k);
}

/* Receive one batch of the stream and check it against the core. */
static void expect_batch(int fd, uint64_t id, uint64_t seq, uint64_t offset, uint64_t first_k, uint64_t count)
{
    pd_envelope *env;
    assert_int_equal(raw_recv_env(fd, 10000, &env), 0);
    assert_int_equal(env->id, id);
    if (env->body_case != PERMD__V1__ENVELOPE__BODY_STREAM_BATCH)
        fail_msg("expected batch %llu, got body %d", (unsigned long long)seq, (int)env->body_case);
    const Permd__V1__StreamBatch *b = env->stream_batch;
    assert_int_equal(b->seq, seq);
    assert_int_equal(b->count, count);
    assert_int_equal(b->id_width, 4);
    assert_int_equal(b->ids.len, count * 4);
    for (uint64_t i = 0; i < count; i++)
        assert_int_equal(pd_load_le32(b->ids.data + 4 * i), want_id(offset, first_k + i));
    assert_int_equal(b->next_offset, offset + 3 * (first_k + count));
    protobuf_c_message_free_unpacked(&env->base, NULL);
}

static void expect_end(int fd, uint64_t id, Permd__V1__EndReason reason, uint64_t delivered, uint64_t next_offset)
{
    pd_envelope *env;
    assert_int_equal(raw_recv_env(fd, 10000, &env), 0);
    assert_int_equal(env->id, id);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_END);
    assert_int_equal(env->stream_end->reason, reason);
    assert_int_equal(env->stream_end->delivered, delivered);
    assert_int_equal(env->stream_end->next_offset, next_offset);
    protobuf_c_message_free_unpacked(&env->base, NULL);
}

/* Nothing arrives while the stream has no credits. */
static void expect_silence(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 300), 0);
}

static void test_credits_pace_batches(void **state)
{
    (void)state;
    for (int pooled = 0; pooled <= 1; pooled++) {
        uint64_t batch = pooled ? 1000 : 50; /* inline_ids is 100 */
        int fd = raw_connect_unix(h.sock);
        send_stream(fd, 9, batch, 2, 0, 30);
        expect_batch(fd, 9, 0, 30, 0, batch);
        expect_batch(fd, 9, 1, 30, batch, batch);
        expect_silence(fd);
        send_credit(fd, 9, 1);
        expect_batch(fd, 9, 2, 30, 2 * batch, batch);
        expect_silence(fd);
        send_cancel(fd, 9);
        expect_end(fd, 9, PERMD__V1__END_REASON__END_REASON_CANCELLED, 3 * batch, 30 + 3 * 3 * batch);
        send_credit(fd, 9, 5); /* after the end: ignored, no reply */
        send_cancel(fd, 9);
        expect_silence(fd);
        close(fd);
    }
}

static void test_max_count_and_end_of_slice(void **state)
{
    (void)state;
    int fd = raw_connect_unix(h.sock);
    /* max_count 250 in batches of 100: 100, 100, 50, then COMPLETE. */
    send_stream(fd, 1, 100, 8, 250, 0);
    expect_batch(fd, 1, 0, 0, 0, 100);
    expect_batch(fd, 1, 1, 0, 100, 100);
    expect_batch(fd, 1, 2, 0, 200, 50);
    expect_end(fd, 1, PERMD__V1__END_REASON__END_REASON_COMPLETE, 250, 750);
    /* Near the end of the epoch: T = 100002 (pad, W = 3); rank 2 has 1 id left after 99999. */
    send_stream(fd, 2, 100, 8, 0, 99999);
    expect_batch(fd, 2, 0, 99999, 0, 1);
    expect_end(fd, 2, PERMD__V1__END_REASON__END_REASON_COMPLETE, 1, 100002);
    /* At T exactly: an empty stream ends at once. */
    send_stream(fd, 3, 100, 8, 0, 100002);
    expect_end(fd, 3, PERMD__V1__END_REASON__END_REASON_COMPLETE, 0, 100002);
    close(fd);
}

/* Two streams on one connection interleave, each in order, with requests between. */
static void test_two_streams_and_requests(void **state)
{
    (void)state;
    int fd = raw_connect_unix(h.sock);
    send_stream(fd, 10, 500, 64, 5000, 0);
    send_stream(fd, 11, 700, 64, 4900, 300);
    Permd__V1__Stats st = PERMD__V1__STATS__INIT;
    pd_envelope req = PERMD__V1__ENVELOPE__INIT, *env;
    req.id = 12;
    req.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
    req.stats = &st;
    raw_send_env(fd, &req);
    uint64_t seq[2] = {0, 0}, got[2] = {0, 0};
    int ended = 0, stats_seen = 0;
    while (ended < 2 || !stats_seen) {
        assert_int_equal(raw_recv_env(fd, 10000, &env), 0);
        if (env->id == 12) {
            assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
            stats_seen = 1;
        } else {
            int s = env->id == 11;
            uint64_t off = s ? 300 : 0;
            assert_true(env->id == 10 || env->id == 11);
            if (env->body_case == PERMD__V1__ENVELOPE__BODY_STREAM_END) {
                assert_int_equal(env->stream_end->delivered, got[s]);
                ended++;
            } else {
                const Permd__V1__StreamBatch *b = env->stream_batch;
                assert_int_equal(b->seq, seq[s]++);
                for (uint64_t i = 0; i < b->count; i++)
                    assert_int_equal(pd_load_le32(b->ids.data + 4 * i), want_id(off, got[s] + i));
                got[s] += b->count;
            }
        }
        protobuf_c_message_free_unpacked(&env->base, NULL);
    }
    assert_int_equal(got[0], 5000);
    assert_int_equal(got[1], 4900);
    close(fd);
}

/* libpermd: a fetch while a stream is open is answered, and the stream's
 * frames that arrive meanwhile are kept for it; close mid-stream cancels. */
static void test_client_stream_with_fetch(void **state)
{
    (void)state;
    permd_client *c;
    permd_stream *st, *second;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    permd_slice s = {.dataset = "d", .seed = 5, .epoch = 6, .world = 3, .rank = 2, .mode = PERMD_MODE_PAD};
    assert_int_equal(permd_stream_open(c, &s, 64, 0, &st), 0);
    assert_int_equal(permd_stream_open(c, &s, 64, 0, &second), PERMD_EINVAL);
    uint64_t k = 0;
    for (int round = 0; round < 20; round++) {
        const void *ids;
        uint32_t width;
        uint64_t n;
        assert_int_equal(permd_stream_next(st, &ids, &width, &n), 0);
        assert_int_equal(n, 64);
        for (uint64_t i = 0; i < n; i++)
            assert_int_equal(((const uint32_t *)ids)[i], want_id(0, k + i));
        k += n;
        uint64_t f[8], got;
        permd_slice fs = s;
        fs.offset = 600;
        assert_int_equal(permd_fetch_u64(c, &fs, 8, f, &got, NULL), 0);
        assert_int_equal(f[0], want_id(600, 0));
    }
    assert_int_equal(permd_stream_offset(st), 3 * k);
    assert_int_equal(permd_stream_close(st), 0); /* cancels and drains */
    uint64_t f[1], got;
    assert_int_equal(permd_fetch_u64(c, &s, 1, f, &got, NULL), 0); /* the connection is clean */
    assert_int_equal(f[0], want_id(0, 0));
    permd_close(c);
}

/* A client that stops reading with credits left does not pin its stream's plan: once its connection is
 * over output_cap with nothing in flight, the stream lends its plan, and another client's new plan finds
 * room within plan_cache_bytes (it was refused OVERLOADED for as long as the reader stayed away). */
static void test_unread_stream_lends_its_plan(void **state)
{
    (void)state;
    enum { S = 100000 }; /* a plan of 1.6 MB: room for one */
    harness own;
    harness_init(&own);
    const char *extra[] = {"--plan-cache-bytes", "2000000", "--output-cap", "65536", NULL};
    assert_int_equal(harness_start(&own, 0, extra, NULL), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(own.sock, &c), 0);
    uint64_t *sizes = malloc(S * sizeof *sizes);
    assert_non_null(sizes);
    for (size_t i = 0; i < S; i++)
        sizes[i] = 100;
    assert_int_equal(permd_put_dataset_sharded(c, "s", sizes, S, 8, 1, NULL, NULL), 0);
    free(sizes);

    int fd = raw_connect_unix(own.sock); /* streams 256 KB batches with 64 credits, and never reads */
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "s";
    sl.seed = 1;
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    send_stream_slice(fd, 1, &sl, 65536, 64, 0);
    permd_stats st = {0};
    for (int i = 0; i < 3000 && !st.backpressure_pauses; i++) { /* its output passes output_cap */
        assert_int_equal(permd_stats_get(c, &st), 0);
        usleep(10000);
    }
    assert_true(st.backpressure_pauses > 0);
    /* A batch still in flight when the pause came keeps the plan in use until it is done: ask until then. */
    permd_slice other = {.dataset = "s", .seed = 2, .world = 1, .mode = PERMD_MODE_EXACT};
    uint32_t ids[10];
    uint64_t got, next;
    int rc = PERMD_EBUSY;
    for (int i = 0; i < 500 && rc == PERMD_EBUSY; i++)
        if ((rc = permd_fetch_u32(c, &other, 10, ids, &got, &next)) == PERMD_EBUSY)
            usleep(10000);
    if (rc)
        fail_msg("a new plan beside an unread stream: %s", permd_last_error(c));
    assert_int_equal(got, 10);
    close(fd);
    permd_close(c);
    assert_int_equal(harness_finish(&own), 0);
}

/* A stream whose inline batches fill output_cap in one pass pauses; when the flush that ends the pass
 * hands everything to the kernel at once, no write completion comes to resume it, so permd must go on
 * itself: every credited batch arrives (before, the stream stopped after 4 of 64, for good). */
static void test_cap_filled_inline_resumes(void **state)
{
    (void)state;
    harness own;
    harness_init(&own);
    const char *extra[] = {"--output-cap", "65536", NULL}; /* inline_ids 65536: 4096-id batches inline */
    assert_int_equal(harness_start(&own, 0, extra, NULL), 0);
    assert_int_equal(harness_put(&own, "d", N), 0);
    int fd = raw_connect_unix(own.sock);
    send_stream(fd, 4, 500, 64, 0, 0); /* 2 KB batches: 32 fill the cap; the rank has 33334 ids */
    for (uint64_t seq = 0; seq < 64; seq++)
        expect_batch(fd, 4, seq, 0, seq * 500, 500);
    expect_silence(fd); /* credits spent */
    send_cancel(fd, 4);
    expect_end(fd, 4, PERMD__V1__END_REASON__END_REASON_CANCELLED, 32000, 3 * 32000);
    close(fd);
    assert_int_equal(harness_finish(&own), 0);
}

/* Batches that finish out of order wait for the earlier ones, no longer counted as a job's output: they
 * must stay few. One batch job is held (a GPU library whose first request stalls, then fails over to the
 * CPU) while the client, with 64 credits, reads nothing: at most stream_ahead (2 here; 4 by default) batches
 * are in flight, so at most 1 is generated ahead of the held one (before, all 63 were, and more with each
 * Credit), and every batch then arrives in order. The first jobs start together and any of them may take
 * the GPU first (the likely cause of 4 batches counted where 3 were allowed, on a 16-core host and under
 * ctest -j): the batches before the held one are sent, so the bound counts from it, as many batches as
 * arrive before it. */
#define BIG_BATCH 65536

/* env is batch seq of count ids, id i the sample at seq·count + i of order p (checked every stride-th);
 * frees env. */
static void check_sampled_batch(pd_envelope *env, const pd_perm *p, uint64_t seq, uint64_t count, uint64_t stride)
{
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
    const Permd__V1__StreamBatch *b = env->stream_batch;
    assert_int_equal(b->seq, seq);
    assert_int_equal(b->count, count);
    for (uint64_t i = 0; i < count; i += stride)
        assert_int_equal(pd_load_le32(b->ids.data + 4 * i), pd_stream_sample(p, seq * count + i));
    protobuf_c_message_free_unpacked(&env->base, NULL);
}

/* Batch seq of that stream (BIG_BATCH ids of order p), checked at a sample of its ids; where none is given
 * it must come within timeout_ms, else *none tells whether nothing did. */
static void expect_big_batch(int fd, const pd_perm *p, uint64_t seq, int timeout_ms, int *none)
{
    pd_envelope *env;
    if (raw_recv_env(fd, timeout_ms, &env)) {
        assert_non_null(none); /* a batch that must come did not */
        *none = 1;
        return;
    }
    check_sampled_batch(env, p, seq, BIG_BATCH, 4099);
}

#define STALLED_N (UINT64_C(1) << 24)

/* A permd (extra: its options, the fake GPU's among them) whose first GPU request stalls stall_ms, with "big"
 * (STALLED_N samples, exact mode, seed 3, epoch 1) put, a client *c, and stream 1 of that slice in batches of
 * BIG_BATCH with `credits` opened on the raw connection *fd. */
static void start_stalled_stream(harness *own, const char *stall_ms, const char *const *extra, uint32_t credits,
                                 permd_client **c, int *fd)
{
    setenv("PERMD_FAKE_GPU_STALL_MS", stall_ms, 1);
    harness_init(own);
    assert_int_equal(harness_start(own, 0, extra, NULL), 0);
    unsetenv("PERMD_FAKE_GPU_STALL_MS");
    assert_int_equal(harness_put(own, "big", STALLED_N), 0);
    assert_int_equal(permd_connect_unix(own->sock, c), 0);
    *fd = raw_connect_unix(own->sock);
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "big";
    sl.seed = 3;
    sl.epoch = 1;
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    send_stream_slice(*fd, 1, &sl, BIG_BATCH, credits, 0);
}

static void test_out_of_order_batches_bounded(void **state)
{
    (void)state;
    enum { BATCH = BIG_BATCH, CREDITS = 64, AHEAD = 2 };
    const uint64_t n = STALLED_N;
    harness own;
    permd_client *c;
    int fd;
    const char *extra[] = {"--gpu-library", PERMD_FAKE_GPU, "--gpu-min-ids", "65536", "--stream-ahead", "2", NULL};
    start_stalled_stream(&own, "3000", extra, CREDITS, &c, &fd);
    usleep(500000); /* batch 0 is held for 3 s; the others would take a few ms */
    permd_stats st;
    assert_int_equal(permd_stats_get(c, &st), 0);
    pd_perm p;
    pd_perm_init(&p, 3, 1, PD_STREAM_SAMPLES, n);
    uint64_t seq = 0; /* the batches before the held one: sent, read now */
    for (int none = 0; seq < AHEAD; seq++) {
        expect_big_batch(fd, &p, seq, 200, &none);
        if (none)
            break;
    }
    if (st.cpu_ids_total > (seq + AHEAD - 1) * BATCH)
        fail_msg("%llu ids generated while batch %llu is held: more than %d batches ahead of it",
                 (unsigned long long)st.cpu_ids_total, (unsigned long long)seq, AHEAD - 1);
    for (; seq < CREDITS; seq++)
        expect_big_batch(fd, &p, seq, 10000, NULL);
    close(fd);
    permd_close(c);
    assert_int_equal(harness_finish(&own), 0);
}

/* A stream cancelled while its batches wait for a worker: those not started are never generated. With one worker,
 * batch 0 held in the fake GPU for 1.5 s and the others queued behind it, the client cancels; a Fetch queued after
 * them returns once they are done, and by then at most batch 0 and the Fetch were generated. Before, every batch
 * queued (stream_ahead of them, up to max_count ids each) was generated for nobody, so a client cycling streams
 * and Cancels made the daemon compute without bound. */
static void test_cancelled_batches_not_generated(void **state)
{
    (void)state;
    enum { BATCH = BIG_BATCH, CREDITS = 8, FETCH = 70000 };
    harness own;
    permd_client *c;
    int fd;
    const char *extra[] = {"--gpu-library", PERMD_FAKE_GPU, "--gpu-min-ids", "65536", "--stream-ahead", "4",
                           "--workers", "1", NULL};
    start_stalled_stream(&own, "1500", extra, CREDITS, &c, &fd);
    usleep(300000); /* batch 0 stalls on the one worker; batches 1-4 are queued behind it */
    permd_stats st;
    assert_int_equal(permd_stats_get(c, &st), 0);
    assert_int_equal(st.cpu_ids_total, 0);
    send_cancel(fd, 1);
    expect_end(fd, 1, PERMD__V1__END_REASON__END_REASON_CANCELLED, 0, 0);
    const permd_slice fs = {.dataset = "big", .seed = 3, .epoch = 2, .world = 1, .mode = PERMD_MODE_EXACT};
    uint32_t *ids = malloc(FETCH * sizeof *ids);
    uint64_t got;
    assert_non_null(ids);
    assert_int_equal(permd_fetch_u32(c, &fs, FETCH, ids, &got, NULL), 0); /* on the worker, after the batches */
    assert_int_equal(got, FETCH);
    free(ids);
    assert_int_equal(permd_stats_get(c, &st), 0);
    if (st.cpu_ids_total > BATCH + FETCH)
        fail_msg("%llu ids generated: batches of the cancelled stream were generated after its Cancel (batch 0 and "
                 "the Fetch are %d)", (unsigned long long)st.cpu_ids_total, BATCH + FETCH);
    close(fd);
    permd_close(c);
    assert_int_equal(harness_finish(&own), 0);
}

static void stuck(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: a large request beside a running stream did not finish in 30 s (deadlock)\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(1);
}

/* A large request while a socket stream runs ahead of the client (batches of 2^20 ids, 4 MiB each: permd's
 * output for the connection passes output_cap and it stops reading): libpermd reads the stream's batches while it
 * sends. It sat in send() while permd waited for it to read, and neither moved again. The stream goes on. */
static void test_large_request_beside_a_stream(void **state)
{
    (void)state;
    const uint64_t n = UINT64_C(1) << 30;
    harness own;
    harness_init(&own);
    assert_int_equal(harness_start(&own, 0, NULL, NULL), 0);
    assert_int_equal(harness_put(&own, "big", n), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(own.sock, &c), 0);
    const permd_slice s = {.dataset = "big", .seed = 4, .epoch = 1, .world = 1, .mode = PERMD_MODE_EXACT};
    permd_stream *st;
    assert_int_equal(permd_stream_open_ex(c, &s, UINT64_C(1) << 20, 0, PERMD_STREAM_SOCKET, &st), 0);
    usleep(500000); /* the trainer does something else; permd runs ahead */
    const size_t shards = 100000; /* a ~300 kB frame: more than the socket buffers */
    uint64_t *sizes = malloc(shards * sizeof *sizes);
    assert_non_null(sizes);
    for (size_t i = 0; i < shards; i++)
        sizes[i] = 1000000 + i;
    signal(SIGALRM, stuck);
    alarm(30);
    assert_int_equal(permd_put_dataset_sharded(c, "sharded", sizes, shards, 0, 0, NULL, NULL), 0);
    alarm(0);
    free(sizes);
    pd_perm p;
    pd_perm_init(&p, 4, 1, PD_STREAM_SAMPLES, n);
    const void *ids;
    uint32_t width;
    uint64_t count;
    for (uint64_t seq = 0; seq < 3; seq++) { /* the batches read aside come first, in order */
        assert_int_equal(permd_stream_next(st, &ids, &width, &count), 0);
        assert_int_equal(count, UINT64_C(1) << 20);
        for (uint64_t k = 0; k < count; k += 65537)
            assert_int_equal(((const uint32_t *)ids)[k], pd_stream_sample(&p, (seq << 20) + k));
    }
    assert_int_equal(permd_stream_close(st), 0);
    permd_close(c);
    assert_int_equal(harness_finish(&own), 0);
}

/* Receive a batch of `count` ids of stream `id` (0: either of streams 1 and 2, whose orders are p[0], p[1]
 * and next seqs seq[0], seq[1]; else stream id of order *p, seq 0), checked against the order at a
 * sample of its ids; returns its stream. */
static uint64_t expect_batch_of(int fd, uint64_t id, const pd_perm *p, const uint64_t *seq, uint64_t count)
{
    pd_envelope *env;
    assert_int_equal(raw_recv_env(fd, 10000, &env), 0);
    const uint64_t got = env->id; /* (the body is checked with the batch) */
    if (id)
        assert_int_equal(got, id);
    else
        assert_true(got == 1 || got == 2);
    check_sampled_batch(env, id ? p : &p[got - 1], id ? 0 : seq[got - 1], count, 1021);
    return got;
}

/* Streams of one connection share it under output_cap: freed room goes a batch at a time to the stream
 * served longest ago. Two streams open with one credit each; then each gets 64: stream 1's fill the connection
 * (output_cap and the socket's buffer), often before stream 2's Credit is read; the client then reads,
 * and from stream 2's first credited batch on, no stream may keep the connection long. Before,
 * stream 2's Credit made it produce as far as it could, and every pass began at the newest stream,
 * stream 2, which took each freed place: it sent its 64 batches in one run while stream 1 waited. */
static void test_streams_share_the_cap(void **state)
{
    (void)state;
    enum { BATCH = 4096, CREDITS = 64 };
    harness own;
    harness_init(&own);
    /* 4 batches of 16 KiB; every batch inline (a batch on a worker could lag for reasons of its own) */
    const char *extra[] = {"--output-cap", "65536", "--inline-ids", "134217728", NULL};
    assert_int_equal(harness_start(&own, 0, extra, NULL), 0);
    assert_int_equal(harness_put(&own, "wide", UINT64_C(1) << 22), 0);
    int fd = raw_connect_unix(own.sock);
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "wide";
    sl.seed = 8;
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    send_stream_slice(fd, 1, &sl, BATCH, 1, 0);
    sl.epoch = 1;
    send_stream_slice(fd, 2, &sl, BATCH, 1, 0);
    pd_perm p[2];
    pd_perm_init(&p[0], 8, 0, PD_STREAM_SAMPLES, UINT64_C(1) << 22);
    pd_perm_init(&p[1], 8, 1, PD_STREAM_SAMPLES, UINT64_C(1) << 22);
    for (int k = 0; k < 2; k++) /* each stream's first batch */
        expect_batch_of(fd, k + 1, &p[k], 0, BATCH);
    expect_silence(fd);
    send_credit(fd, 1, CREDITS);
    send_credit(fd, 2, CREDITS);
    usleep(200000); /* both Credits sent: stream 1's batches fill the connection */
    uint64_t got[2] = {1, 1}, run = 0, longest = 0, last = 0;
    while (got[0] <= CREDITS && got[1] <= CREDITS) { /* while both still have credit */
        const uint64_t id = expect_batch_of(fd, 0, p, got, BATCH);
        got[id - 1]++;
        if (got[1] > 1) { /* stream 2 has begun (its Credit may be read after stream 1 filled the socket) */
            run = id == last ? run + 1 : 1; /* how long does one stream keep the connection? */
            longest = run > longest ? run : longest;
        }
        last = id;
    }
    if (longest > 8)
        fail_msg("one stream sent %llu batches in a row while the other had credit (stream 1: %llu, 2: %llu)",
                 (unsigned long long)longest, (unsigned long long)got[0], (unsigned long long)got[1]);
    close(fd);
    assert_int_equal(harness_finish(&own), 0);
}

/* Large replies through the socket reuse their connection's block (a new one above glibc's 1 MiB mmap threshold
 * is mapped and faulted in each time: a socket Stream of 4 MiB batches ran at half its rate), and the block is
 * given back within a sweep or two once no large reply asks for one. The ids stay the core's. Every request goes
 * to the worker pool (inline_ids 0), as large ones do, so that small replies are built the same way. */
static void test_large_batches_reuse_a_block(void **state)
{
    (void)state;
    harness own;
    char addr[32];
    int port = harness_metrics_addr(addr);
    const char *extra[] = {"--metrics", addr, "--metrics-cache-ms", "0", "--inline-ids", "0", NULL};
    harness_init(&own);
    assert_int_equal(harness_start(&own, 0, extra, NULL), 0);
    enum { BIG = 3000000, BATCH = 400000, FIRST = 100000 }; /* 1.6 MB batches of u32 ids; a 400 KB Fetch first */
    assert_int_equal(harness_put(&own, "big", BIG), 0);
    permd_client *c;
    permd_stream *st;
    assert_int_equal(permd_connect_unix(own.sock, &c), 0);
    permd_slice s = {.dataset = "big", .seed = 4, .epoch = 1, .world = 1, .rank = 0, .mode = PERMD_MODE_EXACT};
    /* A smaller large block kept first gives way to the batches' (it used to keep them out for good). */
    static uint32_t first[FIRST];
    uint64_t got, next;
    assert_int_equal(permd_fetch_u32(c, &s, FIRST, first, &got, &next), 0);
    assert_int_equal(permd_stream_open_ex(c, &s, BATCH, 0, PERMD_STREAM_SOCKET, &st), 0);
    assert_int_equal(permd_stream_shared(st), 0);
    pd_perm p;
    assert_int_equal(pd_perm_init(&p, 4, 1, 0, BIG), 0);
    uint64_t at = 0, n;
    const void *ids;
    uint32_t width;
    while (permd_stream_next(st, &ids, &width, &n) == 0 && n) {
        for (uint64_t i = 0; i < n; i += 9973)
            assert_int_equal(((const uint32_t *)ids)[i], pd_perm_at(&p, at + i));
        at += n;
    }
    assert_int_equal(at, BIG);
    assert_int_equal(permd_stream_close(st), 0);
    long long reused = harness_metric(port, "permd_reply_blocks_reused_total");
    print_message("%d batches of %d ids: %lld written into a reused block\n", BIG / BATCH + 1, BATCH, reused);
    assert_true(reused >= 3); /* the 8 batches but the first few (stream_ahead are made before any is written) */
    /* Small replies neither take the block nor keep it: the sweep (every 0.5 s) gives it back meanwhile. */
    int gone = 0;
    for (int i = 0; i < 40 && !gone; i++) {
        assert_int_equal(permd_fetch_u32(c, &s, 1, first, &got, &next), 0);
        usleep(100000);
        gone = harness_metric(port, "permd_reply_block_bytes") == 0;
    }
    assert_true(gone);
    assert_int_equal(harness_metric(port, "permd_reply_blocks_reused_total"), reused);
    permd_close(c);
    assert_int_equal(harness_finish(&own), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_credits_pace_batches),
        cmocka_unit_test(test_max_count_and_end_of_slice),
        cmocka_unit_test(test_two_streams_and_requests),
        cmocka_unit_test(test_client_stream_with_fetch),
        cmocka_unit_test(test_unread_stream_lends_its_plan),
        cmocka_unit_test(test_cap_filled_inline_resumes),
        cmocka_unit_test(test_out_of_order_batches_bounded),
        cmocka_unit_test(test_cancelled_batches_not_generated),
        cmocka_unit_test(test_large_request_beside_a_stream),
        cmocka_unit_test(test_streams_share_the_cap),
        cmocka_unit_test(test_large_batches_reuse_a_block),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
