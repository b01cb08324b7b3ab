/* Integration: many clients at once over the Unix socket and TCP get exactly the core's answers. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/error.h"
#include "core/rank.h"
#include "harness.h"

static harness h;

static const struct {
    const char *name;
    uint64_t size;
} datasets[] = {
    {"tiny", 5},
    {"small", 1001},
    {"pow2", UINT64_C(1) << 20},
    {"u32max", UINT64_C(1) << 32},
    {"wide", (UINT64_C(1) << 40) + 7}, /* 8-byte ids */
};
#define NDATASETS (sizeof datasets / sizeof datasets[0])

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    const char *extra[] = {"--inline-ids", "512", NULL}; /* exercise both the loop and the pool */
    if (harness_start(&h, 1, extra, NULL))
        return -1;
    permd_client *c;
    if (permd_connect_unix(h.sock, &c))
        return -1;
    for (size_t i = 0; i < NDATASETS; i++)
        if (permd_put_dataset(c, datasets[i].name, datasets[i].size, NULL, NULL))
            return -1;
    permd_close(c);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

typedef struct worker {
    int id, tcp;
    uint64_t rng;
    int mismatches, errors, checks;
    char err[256];
} worker;

static permd_slice random_slice(worker *w, uint64_t *n)
{
    size_t d = test_below(&w->rng, NDATASETS);
    permd_slice s = {0};
    s.dataset = datasets[d].name;
    *n = datasets[d].size;
    s.seed = test_rand(&w->rng);
    s.epoch = test_below(&w->rng, 4);
    s.world = (uint32_t)(1 + test_below(&w->rng, 16));
    s.rank = (uint32_t)test_below(&w->rng, s.world);
    s.mode = (uint32_t)test_below(&w->rng, 3);
    uint64_t T;
    pd_epoch_length(*n, s.world, (pd_mode)s.mode, &T);
    s.offset = test_below(&w->rng, 4) == 0 ? T - test_below(&w->rng, T < 50 ? T + 1 : 50) /* near the end */
                                           : test_below(&w->rng, T < 1000000 ? T + 1 : 1000000);
    return s;
}

/* The core's answer for the same request. */
static uint64_t reference(const permd_slice *s, uint64_t n, uint64_t count, uint64_t *out)
{
    pd_perm p;
    pd_slice sl = {s->world, s->rank, (pd_mode)s->mode, s->offset};
    uint64_t got;
    pd_perm_init(&p, s->seed, s->epoch, PD_STREAM_SAMPLES, n);
    if (pd_slice_fill_u64(&p, &sl, count, out, &got))
        return UINT64_MAX;
    return got;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    permd_client *c;
    int rc = w->tcp ? permd_connect_tcp(h.tcp, NULL, &c) : permd_connect_unix(h.sock, &c);
    if (rc) {
        snprintf(w->err, sizeof w->err, "connect: %s", permd_last_error(NULL));
        w->errors++;
        return NULL;
    }
    uint64_t *got_ids = malloc(3000 * sizeof *got_ids), *want = malloc(3000 * sizeof *want);
    for (int iter = 0; iter < 60; iter++) {
        uint64_t n, got, next;
        permd_slice s = random_slice(w, &n);
        uint64_t count = test_below(&w->rng, 3000);
        rc = permd_fetch_u64(c, &s, count, got_ids, &got, &next);
        uint64_t ref = reference(&s, n, count, want);
        if (rc) {
            snprintf(w->err, sizeof w->err, "fetch: %s", permd_last_error(c));
            w->errors++;
            break;
        }
        w->checks++;
        if (got != ref || memcmp(got_ids, want, got * sizeof *want))
            w->mismatches++;
        /* next_offset continues the rank exactly where this fetch stopped */
        uint64_t T;
        pd_epoch_length(n, s.world, (pd_mode)s.mode, &T);
        uint64_t expect_next = s.offset + got * s.world;
        if (next != (expect_next < T ? expect_next : T))
            w->mismatches++;

        if (iter % 10 == 0 && n <= UINT32_MAX + UINT64_C(1)) { /* the u32 call, same answers */
            uint32_t *ids32 = (uint32_t *)want;
            uint64_t ref2 = reference(&s, n, 100, got_ids);
            if (permd_fetch_u32(c, &s, 100, ids32, &got, NULL) || got != ref2)
                w->mismatches++;
            for (uint64_t i = 0; i < got; i++)
                w->mismatches += ids32[i] != got_ids[i];
        }
        if (iter % 15 == 0) { /* a stream of the same slice, in small batches */
            permd_stream *st;
            uint64_t max = 1 + test_below(&w->rng, 2500), total = 0;
            ref = reference(&s, n, max, want);
            if (permd_stream_open(c, &s, 1 + test_below(&w->rng, 700), max, &st)) {
                snprintf(w->err, sizeof w->err, "stream: %s", permd_last_error(c));
                w->errors++;
                break;
            }
            for (;;) {
                const void *ids;
                uint32_t width;
                uint64_t k;
                if (permd_stream_next(st, &ids, &width, &k)) {
                    w->errors++;
                    break;
                }
                if (k == 0)
                    break;
                for (uint64_t i = 0; i < k; i++) {
                    uint64_t v = width == 4 ? ((const uint32_t *)ids)[i] : ((const uint64_t *)ids)[i];
                    if (total + i >= ref || v != want[total + i])
                        w->mismatches++;
                }
                total += k;
            }
            if (total != ref)
                w->mismatches++;
            uint64_t resume = permd_stream_offset(st);
            if (resume != (s.offset + total * s.world < T ? s.offset + total * s.world : T))
                w->mismatches++;
            permd_stream_close(st);
        }
        if (iter % 20 == 0) { /* inverse of what was fetched gives back the positions */
            if (got == 0)
                continue;
            uint64_t *pos = malloc(got * sizeof *pos);
            uint32_t *ranks = malloc(got * sizeof *ranks);
            if (permd_inverse(c, s.dataset, s.seed, s.epoch, s.world, -1, got_ids, got, pos, ranks)) {
                w->errors++;
            } else {
                for (uint64_t i = 0; i < got; i++) {
                    uint64_t p = (s.offset + s.rank + i * s.world) % n; /* pad wraps to σ(p mod n) */
                    w->mismatches += pos[i] != p;
                    w->mismatches += ranks[i] != p % s.world;
                }
            }
            free(pos);
            free(ranks);
        }
    }
    free(got_ids);
    free(want);
    permd_close(c);
    return NULL;
}

static void test_many_clients_agree_with_core(void **state)
{
    (void)state;
    enum { NWORKERS = 12 };
    pthread_t th[NWORKERS];
    worker w[NWORKERS];
    for (int i = 0; i < NWORKERS; i++) {
        w[i] = (worker){.id = i, .tcp = i % 2, .rng = 0x5eed0000u + (uint64_t)i};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    int checks = 0;
    for (int i = 0; i < NWORKERS; i++) {
        pthread_join(th[i], NULL);
        if (w[i].errors || w[i].mismatches)
            fail_msg("worker %d (%s): %d errors, %d mismatches; %s", i, w[i].tcp ? "tcp" : "unix", w[i].errors,
                     w[i].mismatches, w[i].err);
        checks += w[i].checks;
    }
    assert_int_equal(checks, NWORKERS * 60);
}

/* Large fetches run on the worker pool and still match, in order, on one connection. */
static void test_large_fetch(void **state)
{
    (void)state;
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    permd_server_info info;
    assert_int_equal(permd_server_info_get(c, &info), 0);
    uint64_t count = info.max_count, got, next;
    uint32_t *ids = malloc(count * 4);
    uint64_t *want = malloc(count * 8);
    permd_slice s = {.dataset = "pow2", .seed = 9, .epoch = 1, .world = 1, .rank = 0, .mode = PERMD_MODE_EXACT};
    assert_int_equal(permd_fetch_u32(c, &s, count, ids, &got, &next), 0);
    assert_int_equal(got, UINT64_C(1) << 20);
    assert_int_equal(reference(&s, UINT64_C(1) << 20, count, want), got);
    for (uint64_t i = 0; i < got; i++)
        if (ids[i] != want[i])
            fail_msg("id %llu differs", (unsigned long long)i);
    assert_int_equal(next, UINT64_C(1) << 20);
    /* a u32 fetch of a dataset with 8-byte ids is refused locally, with a reason */
    s.dataset = "wide";
    assert_int_equal(permd_fetch_u32(c, &s, 10, ids, &got, NULL), PERMD_EOVERFLOW);
    assert_non_null(strstr(permd_last_error(c), "u64"));
    free(ids);
    free(want);
    permd_close(c);
}

static void test_stats_count(void **state)
{
    (void)state;
    permd_client *c;
    permd_stats a, b;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_stats_get(c, &a), 0);
    permd_slice s = {.dataset = "small", .world = 1, .mode = PERMD_MODE_PAD};
    uint64_t ids[10], got;
    assert_int_equal(permd_fetch_u64(c, &s, 10, ids, &got, NULL), 0);
    assert_int_equal(permd_stats_get(c, &b), 0);
    assert_int_equal(b.requests_total, a.requests_total + 2);
    assert_int_equal(b.ids_served_total, a.ids_served_total + 10);
    assert_int_equal(b.datasets, NDATASETS);
    assert_true(b.connections >= 1);
    permd_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_clients_agree_with_core),
        cmocka_unit_test(test_large_fetch),
        cmocka_unit_test(test_stats_count),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
