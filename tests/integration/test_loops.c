/* Integration: several event loops: connections spread over them, each answers right, Stats adds every loop up,
 * max_connections counts across loops, and SIGTERM with clients on every loop exits cleanly. */
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

#define LOOPS 3
#define CLIENTS 7 /* more than LOOPS: every loop gets two or three */
#define MAX_CONNECTIONS 8
#define N 5003

static harness h;

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    const char *extra[] = {"--loops", "3", "--max-connections", "8", NULL};
    return harness_start(&h, 0, extra, NULL) || harness_put(&h, "d", N) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

static void fetch_checked(permd_client *c, uint32_t rank)
{
    uint64_t ids[32], want[32], got, wgot;
    permd_slice s = {.dataset = "d", .seed = 4, .epoch = 1, .world = CLIENTS, .rank = rank, .mode = PERMD_MODE_EXACT};
    assert_int_equal(permd_fetch_u64(c, &s, 32, ids, &got, NULL), 0);
    pd_perm p;
    pd_slice sl = {CLIENTS, rank, PD_MODE_EXACT, 0};
    pd_perm_init(&p, 4, 1, PD_STREAM_SAMPLES, N);
    pd_slice_fill_u64(&p, &sl, 32, want, &wgot);
    assert_int_equal(got, wgot);
    assert_memory_equal(ids, want, got * sizeof ids[0]);
}

/* Wait until the connections of earlier tests are gone (closing is asynchronous on the server). */
static void wait_idle(void)
{
    permd_client *c;
    permd_stats st;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    for (int tries = 0; tries < 200; tries++) {
        assert_int_equal(permd_stats_get(c, &st), 0);
        if (st.connections == 1) /* this one */
            break;
        usleep(10 * 1000);
    }
    assert_int_equal(st.connections, 1);
    permd_close(c);
}

static void test_spread_and_totals(void **state)
{
    (void)state;
    wait_idle();
    assert_true(harness_log_contains(&h, "loops=3"));
    permd_client *c[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        assert_int_equal(permd_connect_unix(h.sock, &c[i]), 0);
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < CLIENTS; i++)
            fetch_checked(c[i], (uint32_t)i);
    permd_stats st;
    assert_int_equal(permd_stats_get(c[0], &st), 0);
    assert_true(st.connections >= CLIENTS && st.connections <= CLIENTS + 1); /* on every loop, added up (+ wait_idle's, if not yet closed) */
    assert_int_equal(st.ids_served_total, 3 * CLIENTS * 32);   /* served on every loop */
    assert_true(st.connections_total >= CLIENTS + 1);          /* + the setup's put */
    for (int i = 0; i < CLIENTS; i++)
        permd_close(c[i]);
}

/* max_connections holds for the whole server, not per loop: the 9th of 8 is refused. */
static void test_max_connections_across_loops(void **state)
{
    (void)state;
    wait_idle();
    permd_client *c[MAX_CONNECTIONS];
    for (int i = 0; i < MAX_CONNECTIONS; i++) {
        assert_int_equal(permd_connect_unix(h.sock, &c[i]), 0);
        fetch_checked(c[i], (uint32_t)(i % CLIENTS)); /* surely accepted on its loop */
    }
    permd_client *extra = NULL;
    int rc = permd_connect_unix(h.sock, &extra);
    assert_int_equal(rc, PERMD_EBUSY);
    for (int i = 0; i < MAX_CONNECTIONS; i++)
        permd_close(c[i]);
    /* and the count goes down as they close */
    for (int tries = 0; tries < 100 && rc; tries++) {
        usleep(20 * 1000);
        rc = permd_connect_unix(h.sock, &extra);
    }
    assert_int_equal(rc, 0);
    permd_close(extra);
}

/* SIGTERM while clients sit on every loop: every loop stops, permd exits 0. */
static void test_stop_with_clients_everywhere(void **state)
{
    (void)state;
    wait_idle();
    permd_client *c[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        assert_int_equal(permd_connect_unix(h.sock, &c[i]), 0);
        fetch_checked(c[i], (uint32_t)i);
    }
    int st = harness_stop(&h, SIGTERM);
    assert_true(harness_exited_with(st, 0));
    for (int i = 0; i < CLIENTS; i++)
        permd_close(c[i]);
    assert_true(harness_log_contains(&h, "shard=2"));
    /* start again for the group teardown */
    const char *extra[] = {"--loops", "3", NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spread_and_totals),
        cmocka_unit_test(test_max_connections_across_loops),
        cmocka_unit_test(test_stop_with_clients_everywhere),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
