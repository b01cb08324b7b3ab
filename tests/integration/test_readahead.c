/* Integration: Fetch readahead: a sequential reader is answered from predictions, and every request that
 * departs from the prediction (offset, count, seed, rank, a re-created dataset) still gets the core's ids. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/error.h"
#include "core/rank.h"
#include "harness.h"

#define N 10007

static harness h;

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    return harness_start(&h, 0, NULL, NULL) || harness_put(&h, "d", N) ? -1 : 0;
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_reader),
        cmocka_unit_test(test_departures),
        cmocka_unit_test(test_random_reader),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
