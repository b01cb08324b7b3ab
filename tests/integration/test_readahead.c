/* Integration: Fetch readahead: a sequential reader (of a flat dataset, a sharded one or a mixture) is answered
 * from predictions, and every request that departs from the prediction (offset, count, seed, rank, epoch, a
 * re-created dataset, a re-weighted mixture) still gets the core's ids. */
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
#include "core/shards.h"
#include "harness.h"

#define N 10007

static harness h;

static const uint64_t shard_sizes[6] = {700, 0, 1500, 333, 2900, 1000}; /* "s": K = 2, G = 3 */
static const uint64_t mix_sizes[2] = {N, 4000};                          /* "m": "ma" and "mb", 3:1 */
static const uint32_t mix_weights[4] = {3, 1, 1, 5};                     /* re-weighted from run position 3200 */
static const uint64_t mix_starts[2] = {0, 3200};

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    if (harness_start(&h, 0, NULL, NULL) || harness_put(&h, "d", N) || harness_put(&h, "ma", N) ||
        harness_put(&h, "mb", 4000))
        return -1;
    permd_client *c;
    const char *comps[2] = {"ma", "mb"};
    int32_t created;
    int rc = permd_connect_unix(h.sock, &c);
    if (rc == 0)
        rc = permd_put_dataset_sharded(c, "s", shard_sizes, 6, 2, 3, NULL, &created) ||
             permd_put_mixture(c, "m", comps, 2, mix_starts, mix_weights, 1, 0, 0, NULL, &created);
    permd_close(c);
    return rc ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

static uint64_t hits(permd_client *c)
{
    permd_stats st;
    assert_int_equal(permd_stats_get(c, &st), 0);
    return st.readahead_hits_total;
}

/* Fetch through permd and check against the core; returns next_offset. */
static uint64_t fetch_checked(permd_client *c, const char *name, uint64_t n, uint64_t seed, uint32_t world,
                              uint32_t rank, uint64_t offset, uint64_t count)
{
    uint32_t got_ids[512], want[512];
    uint64_t got, wgot, next;
    assert_true(count <= 512);
    permd_slice s = {.dataset = name, .seed = seed, .epoch = 9, .world = world, .rank = rank,
                     .mode = PERMD_MODE_PAD, .offset = offset};
    assert_int_equal(permd_fetch_u32(c, &s, count, got_ids, &got, &next), 0);
    pd_perm p;
    pd_slice sl = {world, rank, PD_MODE_PAD, offset};
    assert_int_equal(pd_perm_init(&p, seed, 9, PD_STREAM_SAMPLES, n), 0);
    assert_int_equal(pd_slice_fill_u32(&p, &sl, count, want, &wgot), 0);
    assert_int_equal(got, wgot);
    if (got && memcmp(got_ids, want, got * sizeof want[0]))
        fail_msg("ids differ from the core at offset %llu (count %llu, seed %llu, rank %u)", (unsigned long long)offset,
                 (unsigned long long)count, (unsigned long long)seed, rank);
    return next;
}

/* A whole epoch read in order: right ids, and all but the first two Fetches answered ahead. */
static void test_sequential_reader(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    uint64_t before = hits(c), offset = 0, fetches = 0, T;
    assert_int_equal(pd_epoch_length(N, 3, PD_MODE_PAD, &T), 0);
    while (offset < T) { /* rank 1 reads 3336 ids: the last Fetch is short */
        offset = fetch_checked(c, "d", N, 1, 3, 1, offset, 100);
        fetches++;
    }
    uint64_t got = hits(c) - before;
    fprintf(stderr, "readahead: %llu of %llu fetches answered ahead\n", (unsigned long long)got,
            (unsigned long long)fetches);
    assert_true(got == fetches - 2); /* the first shows nothing yet; the second shows the pattern */
    permd_close(c);
}

/* Every departure from the prediction gets freshly generated ids. */
static void test_departures(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    uint64_t o = 0;
    for (int i = 0; i < 3; i++)
        o = fetch_checked(c, "d", N, 2, 4, 3, o, 64);
    uint64_t base = hits(c);
    fetch_checked(c, "d", N, 2, 4, 3, o - 64 * 4, 64); /* the same batch again */
    fetch_checked(c, "d", N, 2, 4, 3, o, 63);          /* another count */
    for (int i = 0; i < 3; i++)
        o = fetch_checked(c, "d", N, 2, 4, 3, o, 64);
    fetch_checked(c, "d", N, 3, 4, 3, o, 64); /* another seed */
    for (int i = 0; i < 3; i++)
        o = fetch_checked(c, "d", N, 2, 4, 3, o, 64);
    fetch_checked(c, "d", N, 2, 4, 2, o, 64); /* another rank */
    for (int i = 0; i < 3; i++)
        o = fetch_checked(c, "d", N, 2, 4, 3, o, 64);
    fetch_checked(c, "d", N, 2, 4, 3, o + 4, 64); /* skipped a batch's worth */
    uint64_t ahead = hits(c) - base;
    assert_true(ahead >= 3); /* the sequential runs between departures were answered ahead */

    /* The dataset is deleted and stored again with another size: same name, other ids. */
    for (int i = 0; i < 3; i++)
        o = fetch_checked(c, "d", N, 2, 4, 3, o, 64);
    assert_int_equal(permd_delete_dataset(c, "d"), 0);
    assert_int_equal(permd_put_dataset(c, "d", N + 5, NULL, NULL), 0);
    fetch_checked(c, "d", N + 5, 2, 4, 3, o, 64);
    assert_int_equal(permd_delete_dataset(c, "d"), 0);
    assert_int_equal(permd_put_dataset(c, "d", N, NULL, NULL), 0);
    permd_close(c);
}

/* Rank 2 of 3 of a sharded dataset's epoch 9 (seed 1) at offset, count ids against the core; returns the next offset. */
static uint64_t fetch_sharded(permd_client *c, uint64_t offset, uint64_t count)
{
    uint64_t start[7], mem[64], got, wgot, next;
    uint32_t got_ids[512], want[512];
    pd_shard_plan plan;
    assert_true(count <= 512 && pd_shard_plan_bytes(6) <= sizeof mem);
    assert_int_equal(pd_shard_layout_build(shard_sizes, 6, start), 0);
    assert_int_equal(pd_shard_plan_init(&plan, start, 6, 1, 9, 2, 3, mem, sizeof mem), 0);
    const pd_slice sl = {3, 2, PD_MODE_PAD, offset};
    assert_int_equal(pd_shard_slice_fill_u32(&plan, &sl, count, want, &wgot), 0);
    permd_slice s = {.dataset = "s", .seed = 1, .epoch = 9, .world = 3, .rank = 2, .mode = PERMD_MODE_PAD,
                     .offset = offset};
    assert_int_equal(permd_fetch_u32(c, &s, count, got_ids, &got, &next), 0);
    assert_int_equal(got, wgot);
    if (got && memcmp(got_ids, want, got * sizeof want[0]))
        fail_msg("sharded ids differ from the core at offset %llu", (unsigned long long)offset);
    return next;
}

/* Rank 1 of 4 of the mixture's epoch `epoch` (seed 3; stages: nstages of mix_starts) at offset against the
 * offline mixture; returns the next offset. */
static uint64_t fetch_mixture(permd_client *c, uint64_t epoch, uint32_t nstages, uint64_t offset, uint64_t count)
{
    uint32_t got_ids[512], want[512];
    uint64_t got, wgot, next;
    permd_mixture *m;
    assert_true(count <= 512);
    assert_int_equal(permd_mixture_new(3, mix_sizes, 2, 0, 0, mix_starts, mix_weights, nstages, &m), 0);
    assert_int_equal(permd_mixture_rank_fill(m, epoch, 4, 1, PERMD_MODE_PAD, offset, count, want, 4, &wgot), 0);
    permd_mixture_free(m);
    permd_slice s = {.dataset = "m", .seed = 3, .epoch = epoch, .world = 4, .rank = 1, .mode = PERMD_MODE_PAD,
                     .offset = offset};
    assert_int_equal(permd_fetch_u32(c, &s, count, got_ids, &got, &next), 0);
    assert_int_equal(got, wgot);
    if (got && memcmp(got_ids, want, got * sizeof want[0]))
        fail_msg("mixture ids differ from the offline mixture at epoch %llu offset %llu (%u stages)",
                 (unsigned long long)epoch, (unsigned long long)offset, nstages);
    return next;
}

/* Sharded datasets and mixtures are predicted too (their plans held while predicted): a whole rank in
 * order, all but the first three Fetches answered ahead (the first builds the plan off the loop, and only
 * Fetches served on the loop teach the pattern), right ids; a new epoch departs from the prediction. */
static void test_plans_sequential(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    uint64_t T, offset = 0, fetches = 0, before = hits(c);
    assert_int_equal(pd_epoch_length(6433, 3, PD_MODE_PAD, &T), 0);
    while (offset < T) {
        offset = fetch_sharded(c, offset, 100);
        fetches++;
    }
    assert_true(hits(c) - before >= fetches - 3);

    assert_int_equal(pd_epoch_length(N + 4000, 4, PD_MODE_PAD, &T), 0);
    offset = fetches = 0;
    before = hits(c);
    while (offset < T) {
        offset = fetch_mixture(c, 0, 1, offset, 128);
        fetches++;
    }
    assert_true(hits(c) - before >= fetches - 3);
    before = hits(c);
    offset = fetch_mixture(c, 1, 1, 0, 128); /* another mixture epoch: not the prediction */
    assert_int_equal(hits(c) - before, 0);
    permd_close(c);
}

/* A mixture re-weighted while a reader's next batch is predicted (a stage appended at run position 3200,
 * past what it has read): the prediction was of the old definition; the next Fetch gets the new one's ids. */
static void test_mixture_reweighted(void **state)
{
    (void)state;
    permd_client *c;
    const char *comps[2] = {"ma", "mb"};
    int32_t created;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    uint64_t o = 0;
    for (int i = 0; i < 6; i++) /* offsets 0 … 767 of rank 1 of 4: positions up to 3069; the prediction's cross 3200 */
        o = fetch_mixture(c, 2, 1, o, 128);
    assert_int_equal(permd_put_mixture(c, "m", comps, 2, mix_starts, mix_weights, 2, 0, 0, NULL, &created), 0);
    assert_int_equal(created, 2); /* appended */
    uint64_t before = hits(c);
    for (int i = 0; i < 6; i++)
        o = fetch_mixture(c, 2, 2, o, 128);
    assert_true(hits(c) - before <= 5); /* the first after the change was not the stale prediction */
    assert_int_equal(permd_delete_mixture(c, "m"), 0);
    assert_int_equal(permd_put_mixture(c, "m", comps, 2, mix_starts, mix_weights, 1, 0, 0, NULL, &created), 0);
    permd_close(c);
}

/* Random offsets never look sequential: nothing is generated ahead. */
static void test_random_reader(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    uint64_t base = hits(c), rng = 7;
    for (int i = 0; i < 50; i++)
        fetch_checked(c, "d", N, 5, 2, 0, test_below(&rng, 9000), 32);
    assert_int_equal(hits(c) - base, 0);
    permd_close(c);
}

/* readahead_bytes bounds the predictions: Fetches whose reply fits it are answered ahead, larger ones are
 * not, each predicting connection holds one buffer of its replies' size (permd_readahead_bytes), and 0 turns
 * readahead off. */
static void test_readahead_bytes(void **state)
{
    (void)state;
    /* 0: readahead_bytes 1024; 1: 0, off; 2: 1024, but the Fetches cost more than inline_ids (50), so the
     * idle pass would never generate them: no buffer is made for them */
    for (int mode = 0; mode <= 2; mode++) {
        harness other;
        char addr[32];
        int port = harness_metrics_addr(addr);
        const int on = mode != 1, fits = mode == 0;
        const char *extra[] = {"--metrics", addr, "--metrics-cache-ms", "0", "--readahead-bytes", on ? "1024" : "0",
                               "--inline-ids", fits ? "65536" : "50", NULL};
        harness_init(&other);
        assert_int_equal(harness_start(&other, 0, extra, NULL), 0);
        assert_int_equal(harness_put(&other, "d", N), 0);
        permd_client *c;
        assert_int_equal(permd_connect_unix(other.sock, &c), 0);
        uint64_t base = hits(c), o = 0;
        for (int i = 0; i < 6; i++) /* at most 800 bytes a reply, whatever the id width */
            o = fetch_checked(c, "d", N, 1, 2, 0, o, 100);
        assert_int_equal(hits(c) - base, fits ? 4 : 0);
        /* a buffer of the replies' size (100 u32 ids), not of the whole room */
        assert_int_equal(harness_metric(port, "permd_readahead_bytes"), fits ? 400 : 0);
        base = hits(c);
        for (int i = 0; i < 6; i++) /* 1200 bytes at least: past the room */
            o = fetch_checked(c, "d", N, 1, 2, 0, o, 300);
        assert_int_equal(hits(c) - base, 0);
        permd_close(c);
        usleep(200000);
        assert_int_equal(harness_metric(port, "permd_readahead_bytes"), 0); /* it went with its connection */
        assert_int_equal(harness_finish(&other), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_reader),
        cmocka_unit_test(test_departures),
        cmocka_unit_test(test_random_reader),
        cmocka_unit_test(test_plans_sequential),
        cmocka_unit_test(test_mixture_reweighted),
        cmocka_unit_test(test_readahead_bytes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
