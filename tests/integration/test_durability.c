/* Integration: kill -9 at random moments while datasets are being put; after each restart every acknowledged
 * dataset is there, intact. One permd per state directory. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/rank.h"
#include "harness.h"

#define WRITERS 4
#define PER_WRITER 4096 /* more than a round can put */
#define ROUNDS_QUICK 6
#define ROUNDS_LONG 60

/* A dataset's size follows from its name, so a torn or mixed-up record shows. */
static uint64_t size_of(int round, int writer, int i)
{
    uint64_t x = (uint64_t)round * 1000003u + (uint64_t)writer * 7919u + (uint64_t)i;
    x ^= x >> 17;
    x *= UINT64_C(0x9E3779B97F4A7C15);
    return (x >> 1) | 1; /* in [1, 2^63) */
}

typedef struct writer {
    harness *h;
    int round, idx;
    int acked; /* datasets 0 .. acked-1 were acknowledged */
} writer;

static atomic_int acks_this_round; /* the main thread kills permd once enough puts were acknowledged */

static void *write_until_killed(void *arg)
{
    writer *w = arg;
    permd_client *c;
    if (permd_connect_unix(w->h->sock, &c))
        return NULL;
    for (int i = 0; i < PER_WRITER; i++) {
        char name[64];
        snprintf(name, sizeof name, "r%d-w%d-%d", w->round, w->idx, i);
        if (permd_put_dataset(c, name, size_of(w->round, w->idx, i), NULL, NULL))
            break; /* permd is gone: the rest was never acknowledged */
        w->acked = i + 1;
        atomic_fetch_add(&acks_this_round, 1);
    }
    permd_close(c);
    return NULL;
}

static void check_all(harness *h, int rounds_done, writer acked[][WRITERS])
{
    permd_client *c;
    assert_int_equal(permd_connect_unix(h->sock, &c), 0);
    size_t total;
    assert_int_equal(permd_list_datasets(c, NULL, 0, &total), 0);
    permd_dataset *all = calloc(total + 1, sizeof *all);
    assert_int_equal(permd_list_datasets(c, all, total, &total), 0);
    /* Everything stored is intact: the size its name says. */
    for (size_t k = 0; k < total; k++) {
        int r, w, i;
        assert_int_equal(sscanf(all[k].name, "r%d-w%d-%d", &r, &w, &i), 3);
        if (all[k].size != size_of(r, w, i))
            fail_msg("%s has size %llu, not %llu", all[k].name, (unsigned long long)all[k].size,
                     (unsigned long long)size_of(r, w, i));
    }
    /* Everything acknowledged is stored; at most one unacknowledged put per writer may have landed. */
    size_t want = 0;
    for (int r = 0; r < rounds_done; r++) {
        for (int w = 0; w < WRITERS; w++) {
            want += (size_t)acked[r][w].acked;
            for (int i = 0; i < acked[r][w].acked; i++) {
                char name[64];
                permd_dataset d;
                snprintf(name, sizeof name, "r%d-w%d-%d", r, w, i);
                if (permd_get_dataset(c, name, &d))
                    fail_msg("acknowledged dataset %s is missing after kill -9", name);
            }
        }
    }
    assert_true(total >= want && total <= want + (size_t)rounds_done * WRITERS);
    /* And it serves: ids of the last round's first dataset match the spec. */
    if (rounds_done && acked[rounds_done - 1][0].acked) {
        uint64_t n = size_of(rounds_done - 1, 0, 0), ids[8], want_ids[8], got, wgot;
        char name[64];
        snprintf(name, sizeof name, "r%d-w0-0", rounds_done - 1);
        permd_slice s = {.dataset = name, .seed = 5, .epoch = 6, .world = 2, .rank = 1, .mode = PERMD_MODE_EXACT};
        assert_int_equal(permd_fetch_u64(c, &s, 8, ids, &got, NULL), 0);
        pd_perm p;
        pd_slice sl = {2, 1, PD_MODE_EXACT, 0};
        pd_perm_init(&p, 5, 6, PD_STREAM_SAMPLES, n);
        pd_slice_fill_u64(&p, &sl, 8, want_ids, &wgot);
        assert_int_equal(got, wgot);
        assert_memory_equal(ids, want_ids, got * sizeof ids[0]);
    }
    fprintf(stderr, "after %d kills: %zu datasets stored, %zu acknowledged\n", rounds_done, total, want);
    free(all);
    permd_close(c);
}

static void test_kill9_while_putting(void **state)
{
    (void)state;
    const char *longrun = getenv("PERMD_LONG_TESTS");
    int rounds = longrun && !strcmp(longrun, "1") ? ROUNDS_LONG : ROUNDS_QUICK;
    writer (*acked)[WRITERS] = calloc((size_t)rounds, sizeof *acked);
    harness h;
    harness_init(&h);
    const char *extra[] = {"--metrics", "", NULL};
    unsigned seed = (unsigned)time(NULL);
    fprintf(stderr, "durability: %d rounds, seed %u\n", rounds, seed);
    srand(seed);
    for (int r = 0; r < rounds; r++) {
        assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
        check_all(&h, r, acked);
        pthread_t t[WRITERS];
        atomic_store(&acks_this_round, 0);
        for (int w = 0; w < WRITERS; w++) {
            acked[r][w] = (writer){.h = &h, .round = r, .idx = w};
            pthread_create(&t[w], NULL, write_until_killed, &acked[r][w]);
        }
        /* Kill at a random moment while puts are being acknowledged: after a random number of
         * acknowledgements (not a fixed delay, which a loaded machine may spend before the first),
         * plus up to 5 ms so the kill lands anywhere inside a commit. */
        int target = 1 + rand() % 400;
        for (int waited = 0; atomic_load(&acks_this_round) < target; waited++) {
            if (waited > 60000)
                fail_msg("only %d of %d puts acknowledged in 60 s", atomic_load(&acks_this_round), target);
            usleep(1000);
        }
        usleep((useconds_t)(rand() % 5000));
        harness_stop(&h, SIGKILL);
        for (int w = 0; w < WRITERS; w++)
            pthread_join(t[w], NULL);
        int sum = 0;
        for (int w = 0; w < WRITERS; w++)
            sum += acked[r][w].acked;
        assert_true(sum > 0); /* the kill landed while puts were being acknowledged */
        assert_true(sum < WRITERS * PER_WRITER);
    }
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    check_all(&h, rounds, acked);
    int status = harness_stop(&h, SIGTERM);
    assert_true(harness_exited_with(status, 0));
    harness_cleanup(&h);
    free(acked);
}

/* Two permd on one state directory (different sockets): the second exits 1 naming the directory and the
 * holder, and the first's acknowledged datasets stay as acknowledged. Both used to serve, each with its own
 * table, and the second's put of a name silently replaced the row the first had acknowledged. */
static void test_one_permd_per_state_dir(void **state)
{
    (void)state;
    harness a, b;
    harness_init(&a);
    harness_init(&b);
    snprintf(b.state, sizeof b.state, "%s", a.state);
    assert_int_equal(harness_start(&a, 0, NULL, NULL), 0);
    assert_int_equal(harness_put(&a, "imagenet", 1000), 0);
    int status = 0;
    assert_int_equal(harness_start(&b, 0, NULL, &status), -1);
    assert_true(harness_exited_with(status, 1));
    char want[200];
    snprintf(want, sizeof want, "state_dir %s is in use by another permd (pid %d", a.state, (int)a.pid);
    assert_true(harness_log_contains(&b, want));
    assert_true(harness_exited_with(harness_stop(&a, SIGTERM), 0));

    assert_int_equal(harness_start(&b, 0, NULL, NULL), 0); /* the lock went with the first */
    permd_client *c;
    permd_dataset d;
    assert_int_equal(permd_connect_unix(b.sock, &c), 0);
    assert_int_equal(permd_get_dataset(c, "imagenet", &d), 0);
    assert_int_equal(d.size, 1000);
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&b, SIGTERM), 0));
    harness_cleanup(&a);
    harness_cleanup(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_permd_per_state_dir),
        cmocka_unit_test(test_kill9_while_putting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
