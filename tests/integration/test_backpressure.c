/* Integration: a client that stops reading costs bounded daemon memory (RSS), loses nothing, and stalls no one else. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/rank.h"
#include "harness.h"

#define NFETCH 400
#define COUNT 65536 /* ids per fetch: 256 KiB replies, 100 MiB for all of them */
#define DATASET_SIZE (UINT64_C(1) << 30)

static permd_slice slice_for(uint64_t i)
{
    permd_slice s = {.dataset = "big", .seed = 77, .epoch = i, .world = 1, .rank = 0, .mode = PERMD_MODE_EXACT};
    return s;
}

/* Append a Fetch frame to buf at *len. */
static void fetch_frame(uint8_t *buf, size_t *len, uint64_t id, const permd_slice *s)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = (char *)s->dataset;
    sl.seed = s->seed;
    sl.epoch = s->epoch;
    sl.world = s->world;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    Permd__V1__Fetch f = PERMD__V1__FETCH__INIT;
    f.slice = &sl;
    f.count = COUNT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_FETCH;
    env.fetch = &f;
    *len += pd_frame_pack(&env, buf + *len);
}

/* Wait until permd has served at least min_ids and then stops producing
 * for a whole second (every reader is stalled). */
static void wait_quiescent(permd_client *c, permd_stats *st, uint64_t min_ids)
{
    uint64_t last = UINT64_MAX;
    int stable = 0;
    for (int i = 0; i < 1200 && stable < 10; i++) {
        usleep(100000);
        assert_int_equal(permd_stats_get(c, st), 0);
        /* stats replies add bytes, not ids */
        stable = st->ids_served_total == last && st->ids_served_total >= min_ids ? stable + 1 : 0;
        last = st->ids_served_total;
    }
    assert_int_equal(stable, 10);
}

/* A Stream of COUNT-id batches with 64 credits on fd, whose client will not read. */
static void open_unread_stream(int fd)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "big";
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_PAD;
    assert_int_equal(raw_send_stream(fd, 1, &sl, COUNT, 64, 0, 0), 0);
}

/* Fetch count ids of epoch e (rank 0 of 1, exact) on c: all come, and the first 16 are the core's. */
static void expect_fetch(permd_client *c, uint64_t e, uint64_t count, uint32_t *ids)
{
    permd_slice s = slice_for(e);
    uint64_t want[16], got;
    assert_int_equal(permd_fetch_u32(c, &s, count, ids, &got, NULL), 0);
    assert_int_equal(got, count);
    pd_perm p;
    pd_slice ps = {1, 0, PD_MODE_EXACT, 0};
    pd_perm_init(&p, 77, e, PD_STREAM_SAMPLES, DATASET_SIZE);
    pd_slice_fill_u64(&p, &ps, 16, want, &got);
    for (int i = 0; i < 16; i++)
        assert_int_equal(ids[i], want[i]);
}

/* The scenario with a given output cap; returns permd's RSS growth in KiB
 * while two clients stall (after checking that nothing was lost). */
static long stalled_growth_kb(const char *output_cap)
{
    harness h;
    harness_init(&h);
    const char *extra[] = {"--output-cap", output_cap, "--max-count", "65536", NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset(c, "big", DATASET_SIZE, NULL, NULL), 0);
    uint32_t *ids = malloc(COUNT * sizeof *ids);
    uint64_t got;
    permd_slice s = slice_for(0);
    for (int i = 0; i < 3; i++) /* warm up: allocator arenas and pool threads exist */
        assert_int_equal(permd_fetch_u32(c, &s, COUNT, ids, &got, NULL), 0);
    long base = harness_rss_kb(&h);

    /* A: 400 pipelined fetches, not read. B: a stream with many credits, not read. */
    int a = raw_connect_unix(h.sock), b = raw_connect_unix(h.sock);
    /* All requests in one write: a client that writes request after request
     * without reading would block once permd stops reading it (by design). */
    uint8_t *reqs = malloc(NFETCH * 64);
    size_t reqs_len = 0;
    for (uint64_t i = 1; i <= NFETCH; i++) {
        permd_slice si = slice_for(i);
        fetch_frame(reqs, &reqs_len, i, &si);
    }
    assert_int_equal(raw_send(a, reqs, reqs_len), 0);
    free(reqs);
    open_unread_stream(b);

    /* Without a cap everything asked for is produced: wait for all of it, so
     * a slow machine cannot make the control pass or fail early. */
    permd_stats st;
    uint64_t warm = 3 * COUNT, all = warm + (uint64_t)(NFETCH + 64) * COUNT;
    wait_quiescent(c, &st, strcmp(output_cap, "262144") ? all : warm);
    long growth = harness_rss_kb(&h) - base;

    /* Others are unaffected: a fresh fetch is served and correct. */
    permd_client *other;
    assert_int_equal(permd_connect_unix(h.sock, &other), 0);
    expect_fetch(other, 5, 16, ids);
    permd_close(other);

    /* A reads at last: every reply arrives, in order, complete. */
    pd_envelope *rep;
    pd_perm p;
    for (uint64_t i = 1; i <= NFETCH; i++) {
        assert_int_equal(raw_recv_env(a, 30000, &rep), 0);
        assert_int_equal(rep->id, i);
        assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
        assert_int_equal(rep->fetch_reply->count, COUNT);
        assert_int_equal(rep->fetch_reply->ids.len, COUNT * 4);
        pd_perm_init(&p, 77, i, PD_STREAM_SAMPLES, DATASET_SIZE);
        uint32_t last = pd_load_le32(rep->fetch_reply->ids.data + 4 * (COUNT - 1));
        assert_int_equal(last, pd_perm_at(&p, COUNT - 1));
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    close(a);
    /* B cancels; batches already sent come first, then StreamEnd(CANCELLED). */
    Permd__V1__Cancel cancel = PERMD__V1__CANCEL__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1; /* the stream's */
    env.body_case = PERMD__V1__ENVELOPE__BODY_CANCEL;
    env.cancel = &cancel;
    assert_int_equal(raw_send_env(b, &env), 0);
    uint64_t batches = 0;
    for (;;) {
        assert_int_equal(raw_recv_env(b, 30000, &rep), 0);
        int end = rep->body_case == PERMD__V1__ENVELOPE__BODY_STREAM_END;
        if (end) {
            assert_int_equal(rep->stream_end->reason, PERMD__V1__END_REASON__END_REASON_CANCELLED);
            assert_int_equal(rep->stream_end->delivered, batches * COUNT);
        } else {
            assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
            assert_int_equal(rep->stream_batch->seq, batches);
            batches++;
        }
        protobuf_c_message_free_unpacked(&rep->base, NULL);
        if (end)
            break;
    }
    assert_true(batches >= 1 && batches <= 64);
    close(b);

    assert_int_equal(permd_stats_get(c, &st), 0);
    fprintf(stderr, "output_cap=%s: RSS growth %ld KiB while stalled, %llu backpressure pauses, %llu batches\n",
            output_cap, growth, (unsigned long long)st.backpressure_pauses, (unsigned long long)batches);
    if (strcmp(output_cap, "262144") == 0)
        assert_true(st.backpressure_pauses >= 1); /* the cap is what stopped it */
    permd_close(c);
    free(ids);
    int status = harness_stop(&h, SIGTERM);
    assert_true(harness_exited_with(status, 0));
    harness_cleanup(&h);
    return growth;
}

static void test_stalled_reader_is_bounded(void **state)
{
    (void)state;
    long growth = stalled_growth_kb("262144");
    assert_true(growth < 24 * 1024); /* vs ~100 MiB of replies asked for */
}

/* Negative control: with the cap out of the way the same clients make permd
 * buffer their replies, so the bound above measures the mechanism. */
static void test_control_without_cap_grows(void **state)
{
    (void)state;
    long growth = stalled_growth_kb("17179869184");
    assert_true(growth > 64 * 1024);
}

#define NSTALLED 8

/* NSTALLED clients open streams and never read, under the given output_memory (output_cap its default,
 * 4 MiB). Returns the output they hold (permd_output_bytes) once permd produces nothing more, after checking
 * that a client that reads is still served, and that the count goes back to 0 once they are gone. */
static long long stalled_streams_output(const char *output_memory)
{
    harness h;
    harness_init(&h);
    char maddr[32];
    const int port = harness_metrics_addr(maddr);
    const char *extra[] = {"--output-memory", output_memory, "--max-count", "65536", "--metrics", maddr,
                           "--metrics-cache-ms", "0", NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset(c, "big", DATASET_SIZE, NULL, NULL), 0);
    int fds[NSTALLED];
    for (int i = 0; i < NSTALLED; i++) {
        fds[i] = raw_connect_unix(h.sock);
        open_unread_stream(fds[i]);
    }
    permd_stats st;
    wait_quiescent(c, &st, NSTALLED * COUNT); /* every stream got a batch at least */
    const long long held = harness_metric(port, "permd_output_bytes");
    const long long pauses = harness_metric(port, "permd_output_memory_pauses_total");

    /* A client that reads holds nothing between its requests: it is served whatever the others hold. */
    uint32_t *ids = malloc(COUNT * sizeof *ids);
    for (uint64_t e = 0; e < 8; e++)
        expect_fetch(c, e, COUNT, ids);
    free(ids);
    /* One of them reads at last: every batch its credits asked for comes, though the others still hold
     * theirs (it goes on a batch at a time, each sent before the next is made). */
    for (uint64_t seq = 0; seq < 64; seq++) {
        pd_envelope *rep;
        assert_int_equal(raw_recv_env(fds[0], 30000, &rep), 0);
        assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
        assert_int_equal(rep->stream_batch->seq, seq);
        assert_int_equal(rep->stream_batch->count, COUNT);
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    for (int i = 0; i < NSTALLED; i++)
        close(fds[i]);
    long long left = -1;
    for (int i = 0; i < 100 && left != 0; i++) { /* their output leaves the count as they close */
        usleep(50000);
        left = harness_metric(port, "permd_output_bytes");
    }
    assert_int_equal(left, 0);
    fprintf(stderr, "output_memory=%s: %d stalled streams hold %lld bytes, %lld output_memory pauses\n",
            output_memory, NSTALLED, held, pauses);
    if (strcmp(output_memory, "0"))
        assert_true(pauses >= 1);
    permd_close(c);
    int status = harness_stop(&h, SIGTERM);
    assert_true(harness_exited_with(status, 0));
    harness_cleanup(&h);
    return held;
}

/* Together they hold output_memory and a batch (256 KiB) each, not output_cap (4 MiB) each. */
static void test_output_memory_bounds_all_connections(void **state)
{
    (void)state;
    const long long held = stalled_streams_output("1048576");
    assert_true(held > 0);
    assert_true(held <= (1 << 20) + NSTALLED * (COUNT * 4 + 4096));
}

/* Negative control: without output_memory the same clients hold output_cap each. */
static void test_control_without_output_memory(void **state)
{
    (void)state;
    assert_true(stalled_streams_output("0") > 16 << 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stalled_reader_is_bounded),
        cmocka_unit_test(test_control_without_cap_grows),
        cmocka_unit_test(test_output_memory_bounds_all_connections),
        cmocka_unit_test(test_control_without_output_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
