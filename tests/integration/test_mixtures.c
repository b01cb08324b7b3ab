/* Integration: mixtures on the daemon give the offline mixture's ids through Fetch, Stream, Digest, Inverse and locations; definitions persist, extend and refuse what would give wrong ids. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

#define SEED 1234

static const char *const comp_ab[] = {"a", "b"};
static const uint64_t sizes_ab[] = {1000, 250};
static const uint64_t starts1[] = {0};
static const uint32_t weights1[] = {3, 1};
static const uint64_t starts2[] = {0, 640};
static const uint32_t weights2[] = {3, 1, 1, 4};

/* The offline mixture the daemon's "m" must equal. */
static permd_mixture *offline(const uint64_t *starts, const uint32_t *weights, uint32_t nstages)
{
    permd_mixture *m;
    assert_int_equal(permd_mixture_new(SEED, sizes_ab, 2, 0, 0, starts, weights, nstages, &m), 0);
    return m;
}

/* Fetch a whole rank of mixture epoch `epoch` in pieces and compare it with the offline mixture's. */
static void check_fetch(permd_client *c, const char *name, permd_mixture *off, uint64_t epoch, uint32_t world,
                        uint32_t rank, int mode)
{
    permd_slice s = {.dataset = name, .seed = SEED, .epoch = epoch, .world = world, .rank = rank, .mode = mode};
    uint32_t got_ids[700], want[700];
    uint64_t got, next, wgot;
    assert_int_equal(permd_fetch_u32(c, &s, 700, got_ids, &got, &next), 0);
    assert_int_equal(permd_mixture_rank_fill(off, epoch, world, rank, mode, 0, 700, want, 4, &wgot), 0);
    assert_int_equal(got, wgot);
    assert_memory_equal(got_ids, want, got * 4);
    if (got == 700) { /* the rest from the offset the reply gave */
        s.offset = next;
        assert_int_equal(permd_fetch_u32(c, &s, 700, got_ids, &got, &next), 0);
        assert_int_equal(permd_mixture_rank_fill(off, epoch, world, rank, mode, s.offset, 700, want, 4, &wgot), 0);
        assert_int_equal(got, wgot);
        assert_memory_equal(got_ids, want, got * 4);
    }
}

/* A permd (with extra flags, or NULL) and a client, with datasets a (1000) and b (250). */
static void setup_datasets_with(harness *h, permd_client **c, const char *const *extra)
{
    harness_init(h);
    assert_int_equal(harness_start(h, 0, extra, NULL), 0);
    assert_int_equal(permd_connect_unix(h->sock, c), 0);
    assert_int_equal(permd_put_dataset(*c, "a", 1000, NULL, NULL), 0);
    assert_int_equal(permd_put_dataset(*c, "b", 250, NULL, NULL), 0);
}

static void setup_datasets(harness *h, permd_client **c)
{
    setup_datasets_with(h, c, NULL);
}

static void test_serve_like_offline(void **state)
{
    (void)state;
    harness h;
    permd_client *c;
    setup_datasets(&h, &c);
    permd_mixture_def *d;
    int32_t created = -1;
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts1, weights1, 1, 0, 0, &d, &created), 0);
    assert_int_equal(created, 1);
    assert_int_equal(d->length, 1250); /* L defaults to the sum of the sizes */
    assert_int_equal(d->block, 64);
    assert_int_equal(d->size, 1250);
    assert_int_equal(d->component_sizes[1], 250);
    assert_string_equal(d->components[1], "b");
    assert_non_null(d->component_shards); /* the layouts as put: both flat */
    assert_true(d->component_shards[0] == 0 && d->component_shards[1] == 0 && d->component_lanes[1] == 0);
    permd_mixture_def_free(d);
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts1, weights1, 1, 0, 0, NULL, &created), 0);
    assert_int_equal(created, 0); /* the same definition: confirmed */
    char names[4][PERMD_NAME_MAX + 1];
    size_t total;
    assert_int_equal(permd_list_mixtures(c, names, 4, &total), 0);
    assert_int_equal(total, 1);
    assert_string_equal(names[0], "m");

    permd_mixture *off = offline(starts1, weights1, 1);
    for (uint64_t epoch = 0; epoch < 3; epoch++)
        for (uint32_t world = 1; world <= 4; world += 3)
            for (int mode = PERMD_MODE_PAD; mode <= PERMD_MODE_EXACT; mode++)
                check_fetch(c, "m", off, epoch, world, world - 1, mode);

    /* A stream of the same slice. */
    permd_slice s = {.dataset = "m", .seed = SEED, .epoch = 1, .world = 3, .rank = 2, .mode = PERMD_MODE_EXACT};
    permd_stream *st;
    assert_int_equal(permd_stream_open(c, &s, 64, 0, &st), 0);
    uint32_t want[1250];
    uint64_t wgot, seen = 0, n;
    assert_int_equal(permd_mixture_rank_fill(off, 1, 3, 2, PERMD_MODE_EXACT, 0, 1250, want, 4, &wgot), 0);
    const void *ids;
    uint32_t width;
    while (permd_stream_next(st, &ids, &width, &n) == 0 && n) {
        assert_int_equal(width, 4);
        assert_memory_equal(ids, want + seen, n * 4);
        seen += n;
    }
    assert_int_equal(seen, wgot);
    permd_stream_close(st);

    /* Digest and locations. */
    permd_digest dg, wdg;
    assert_int_equal(permd_digest_slice(c, &s, &dg), 0);
    assert_int_equal(permd_mixture_rank_digest(off, 1, 3, 2, PERMD_MODE_EXACT, 0, &wdg), 0);
    assert_int_equal(dg.count, wdg.count);
    assert_int_equal(dg.sum, wdg.sum);
    assert_int_equal(dg.hash, wdg.hash);
    uint64_t comps[100], locals[100], got, next;
    assert_int_equal(permd_fetch_locations(c, &s, 100, comps, locals, &got, &next), 0);
    uint32_t wc[100];
    uint64_t wl[100];
    assert_int_equal(permd_mixture_rank_locations(off, 1, 3, 2, PERMD_MODE_EXACT, 0, 100, wc, wl, NULL, &wgot), 0);
    for (uint64_t i = 0; i < got; i++) {
        assert_int_equal(comps[i], wc[i]);
        assert_int_equal(locals[i], wl[i]);
    }

    /* Inverse: where a sample of a component epoch is drawn, for positions the offline mixture names. */
    uint64_t samples[40], cepochs[40], epochs[40], pos[40];
    uint32_t ranks[40];
    for (int i = 0; i < 40; i++) {
        uint32_t comp;
        uint64_t local;
        assert_int_equal(permd_mixture_locate(off, (uint64_t)i % 3, (uint64_t)i * 31, &samples[i], &comp, &local,
                                              &cepochs[i]),
                         0);
    }
    assert_int_equal(permd_inverse_mixture(c, "m", SEED, 4, PERMD_MODE_PAD, samples, cepochs, 40, epochs, pos, ranks),
                     0);
    for (int i = 0; i < 40; i++) {
        assert_int_equal(epochs[i], (uint64_t)i % 3);
        assert_int_equal(pos[i], (uint64_t)i * 31);
        assert_int_equal(ranks[i], (uint32_t)(pos[i] % 4));
    }
    /* More than one request carries goes in pieces (256,000 ids were one frame past max_frame, which ended the
     * connection). */
    enum { LOTS = 300000 };
    uint64_t *lots = malloc(4 * LOTS * sizeof *lots);
    assert_non_null(lots);
    uint64_t *lce = lots + LOTS, *le = lots + 2 * LOTS, *lp = lots + 3 * LOTS;
    for (uint64_t i = 0; i < LOTS; i++) {
        uint32_t comp;
        uint64_t local;
        assert_int_equal(permd_mixture_locate(off, i / 1000, i * 7 % 1000, &lots[i], &comp, &local, &lce[i]), 0);
    }
    assert_int_equal(permd_inverse_mixture(c, "m", SEED, 1, -1, lots, lce, LOTS, le, lp, NULL), 0);
    for (uint64_t i = 0; i < LOTS; i++)
        if (le[i] != i / 1000 || lp[i] != i * 7 % 1000)
            fail_msg("inverse %llu: (%llu, %llu)", (unsigned long long)i, (unsigned long long)le[i],
                     (unsigned long long)lp[i]);
    assert_int_equal(permd_usable(c), 1);
    free(lots);
    permd_mixture_free(off);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

static void test_stages_and_persistence(void **state)
{
    (void)state;
    harness h;
    permd_client *c;
    setup_datasets(&h, &c);
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts1, weights1, 1, 0, 0, NULL, NULL), 0);
    permd_slice s = {.dataset = "m", .seed = SEED, .epoch = 0, .world = 1, .mode = PERMD_MODE_EXACT};
    uint32_t before[1250], after[1250];
    uint64_t got, next;
    assert_int_equal(permd_fetch_u32(c, &s, 1250, before, &got, &next), 0);
    /* Re-weighting from position 640 on (a multiple of the block): appended, nothing before changes. */
    int32_t created = -1;
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts2, weights2, 2, 0, 0, NULL, &created), 0);
    assert_int_equal(created, 2);
    assert_int_equal(permd_fetch_u32(c, &s, 1250, after, &got, &next), 0);
    assert_memory_equal(before, after, 640 * 4);
    assert_memory_not_equal(before + 640, after + 640, 610 * 4); /* the new weights apply after */
    permd_mixture *off = offline(starts2, weights2, 2);
    check_fetch(c, "m", off, 0, 1, 0, PERMD_MODE_EXACT);
    check_fetch(c, "m", off, 5, 2, 1, PERMD_MODE_DROP);
    /* Changing an existing stage is not an append. */
    static const uint32_t other[] = {2, 1};
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts1, other, 1, 0, 0, NULL, NULL), PERMD_ECONFLICT);
    permd_close(c);

    /* Restart: the definition survives, with the same ids. */
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));
    assert_int_equal(harness_start(&h, 0, NULL, NULL), 0);
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_fetch_u32(c, &s, 1250, before, &got, &next), 0);
    assert_memory_equal(before, after, 1250 * 4);
    check_fetch(c, "m", off, 5, 2, 1, PERMD_MODE_DROP);
    permd_mixture_free(off);
    assert_int_equal(permd_delete_mixture(c, "m"), 0);
    assert_int_equal(permd_fetch_u32(c, &s, 10, before, &got, &next), PERMD_ENOTFOUND);
    assert_int_equal(permd_delete_mixture(c, "m"), PERMD_ENOTFOUND);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

static void test_refusals(void **state)
{
    (void)state;
    harness h;
    permd_client *c;
    setup_datasets(&h, &c);
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts1, weights1, 1, 0, 0, NULL, NULL), 0);
    /* One namespace: a mixture cannot take a dataset's name, nor a dataset a mixture's. */
    assert_int_equal(permd_put_mixture(c, "a", comp_ab, 2, starts1, weights1, 1, 0, 0, NULL, NULL), PERMD_ECONFLICT);
    assert_int_equal(permd_put_dataset(c, "m", 5, NULL, NULL), PERMD_ECONFLICT);
    /* A component that does not exist, a stage not on a block boundary, a zero-sum stage. */
    static const char *const missing[] = {"a", "nope"};
    assert_int_equal(permd_put_mixture(c, "x", missing, 2, starts1, weights1, 1, 0, 0, NULL, NULL), PERMD_ENOTFOUND);
    assert_non_null(strstr(permd_last_error(c), "'nope' is not a registered dataset"));
    static const char *const nested[] = {"a", "m"}; /* a mixture of mixtures: said so, not "not registered" */
    assert_int_equal(permd_put_mixture(c, "x", nested, 2, starts1, weights1, 1, 0, 0, NULL, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "'m' is a mixture: a mixture's components are datasets"));
    static const uint64_t off_block[] = {0, 100};
    assert_int_equal(permd_put_mixture(c, "x", comp_ab, 2, off_block, weights2, 2, 0, 0, NULL, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "stage 1 starts at 100")); /* which rule, not all of them */
    static const uint32_t zero[] = {0, 0};
    assert_int_equal(permd_put_mixture(c, "x", comp_ab, 2, starts1, zero, 1, 0, 0, NULL, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "stage 0's weights sum to 0"));
    assert_int_equal(permd_put_mixture(c, "x", comp_ab, 2, starts1, weights1, 1, 0, 96, NULL, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "block 96 is not a power of two"));
    /* The datasets' inverse on a mixture's name says what it is. */
    uint64_t sample = 3, position;
    assert_int_equal(permd_inverse(c, "m", 1, 0, 1, PERMD_MODE_EXACT, &sample, 1, &position, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "is a mixture"));
    assert_int_equal(permd_inverse(c, "neither", 1, 0, 1, PERMD_MODE_EXACT, &sample, 1, &position, NULL),
                     PERMD_ENOTFOUND);
    /* A component in use cannot be deleted. */
    assert_int_equal(permd_delete_dataset(c, "a"), PERMD_ECONFLICT);
    assert_non_null(strstr(permd_last_error(c), "mixture 'm'"));
    permd_slice s = {.dataset = "m", .seed = 1, .world = 1, .mode = PERMD_MODE_EXACT};
    uint32_t ids[8];
    uint64_t got, next;
    assert_int_equal(permd_fetch_u32(c, &s, 8, ids, &got, &next), 0);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

/* A component declared in the config changes under the mixture between runs: typed errors, never ids. */
static void test_component_changed_under_it(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    const char *v1[] = {"--dataset", "cfg:300", NULL};
    assert_int_equal(harness_start(&h, 0, v1, NULL), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_put_dataset(c, "b", 250, NULL, NULL), 0);
    static const char *const comps[] = {"cfg", "b"};
    assert_int_equal(permd_put_mixture(c, "m", comps, 2, starts1, weights1, 1, 0, 0, NULL, NULL), 0);
    permd_close(c);
    permd_slice s = {.dataset = "m", .seed = 1, .world = 1, .mode = PERMD_MODE_EXACT};
    uint32_t ids[8];
    uint64_t got, next;

    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));
    const char *v2[] = {"--dataset", "cfg:301", NULL}; /* re-declared with another size */
    assert_int_equal(harness_start(&h, 0, v2, NULL), 0);
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_fetch_u32(c, &s, 8, ids, &got, &next), PERMD_ECONFLICT);
    assert_non_null(strstr(permd_last_error(c), "re-created"));
    permd_digest dg;
    assert_int_equal(permd_digest_slice(c, &s, &dg), PERMD_ECONFLICT);
    permd_close(c);

    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));
    assert_int_equal(harness_start(&h, 0, NULL, NULL), 0); /* no longer declared at all */
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_fetch_u32(c, &s, 8, ids, &got, &next), PERMD_ENOTFOUND);
    assert_non_null(strstr(permd_last_error(c), "no longer exists"));
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));

    /* A config dataset named as a stored mixture: refused at startup (a Fetch on the name would have served the
     * dataset's ids, the mixture hidden behind it). */
    const char *v3[] = {"--dataset", "m:400", NULL};
    int status;
    assert_int_equal(harness_start(&h, 0, v3, &status), -1);
    assert_true(harness_exited_with(status, 1));
    assert_true(harness_log_contains(&h, "stores a mixture of this name"));
    harness_cleanup(&h);
}

/* Requests naming the definition they read (permd_slice.definition) are refused once the name is re-defined,
 * and an open stream ends with a typed error at its next batch instead of serving a deleted dataset. */
static void test_definitions(void **state)
{
    (void)state;
    harness h;
    permd_client *c;
    setup_datasets(&h, &c);
    permd_dataset a, a2;
    assert_int_equal(permd_get_dataset(c, "a", &a), 0);
    assert_true(a.definition != 0);
    permd_mixture_def *d, *d2;
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts1, weights1, 1, 0, 0, &d, NULL), 0);
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts2, weights2, 2, 0, 0, &d2, NULL), 0);
    assert_true(d->definition != 0 && d2->definition != d->definition); /* an appended stage */
    uint32_t ids[8];
    uint64_t got, next;
    permd_slice s = {.dataset = "m", .seed = 1, .world = 1, .mode = PERMD_MODE_EXACT, .definition = d->definition};
    assert_int_equal(permd_fetch_u32(c, &s, 8, ids, &got, &next), PERMD_ECONFLICT);
    assert_non_null(strstr(permd_last_error(c), "re-defined"));
    s.definition = d2->definition;
    assert_int_equal(permd_fetch_u32(c, &s, 8, ids, &got, &next), 0);
    s.definition = 0; /* unchecked */
    assert_int_equal(permd_fetch_u32(c, &s, 8, ids, &got, &next), 0);
    permd_mixture_def_free(d);
    permd_mixture_def_free(d2);

    /* A stream on dataset "a" (flat) whose name is deleted and put again with another size: batches sent
     * before, then PERMD_ECONFLICT; never a batch of the new dataset's ids (they would be below 10). */
    assert_int_equal(permd_delete_mixture(c, "m"), 0);
    permd_client *c2;
    assert_int_equal(permd_connect_unix(h.sock, &c2), 0);
    permd_slice sa = {.dataset = "a", .seed = 1, .world = 1, .mode = PERMD_MODE_EXACT, .definition = a.definition};
    permd_stream *st;
    assert_int_equal(permd_stream_open(c, &sa, 10, 0, &st), 0);
    const void *batch;
    uint32_t width;
    uint64_t count, seen = 0;
    assert_int_equal(permd_stream_next(st, &batch, &width, &count), 0);
    seen += count;
    assert_int_equal(permd_delete_dataset(c2, "a"), 0);
    assert_int_equal(permd_put_dataset(c2, "a", 10, &a2, NULL), 0);
    assert_true(a2.definition != a.definition);
    int rc;
    while ((rc = permd_stream_next(st, &batch, &width, &count)) == 0 && count)
        seen += count; /* batches generated before the change */
    assert_int_equal(rc, PERMD_ECONFLICT);
    assert_non_null(strstr(permd_last_error(c), "re-defined"));
    assert_true(seen < 1000);
    permd_stream_close(st);
    sa.definition = a2.definition; /* the new one, read again: served */
    assert_int_equal(permd_fetch_u32(c, &sa, 8, ids, &got, &next), 0);
    assert_int_equal(got, 8);
    permd_close(c2);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

static void test_sharded_component(void **state)
{
    (void)state;
    harness h;
    permd_client *c;
    setup_datasets(&h, &c);
    uint64_t shard_sizes[37];
    for (int i = 0; i < 37; i++)
        shard_sizes[i] = (uint64_t)(i % 5) * 7; /* empty shards too */
    uint64_t n = 0;
    for (int i = 0; i < 37; i++)
        n += shard_sizes[i];
    assert_int_equal(permd_put_dataset_sharded(c, "sh", shard_sizes, 37, 4, 2, NULL, NULL), 0);
    static const char *const comps[] = {"a", "sh"};
    assert_int_equal(permd_put_mixture(c, "ms", comps, 2, starts1, weights1, 1, 0, 128, NULL, NULL), 0);
    permd_mix_component oc[2] = {{.size = 1000}, {.shard_sizes = shard_sizes, .nshards = 37, .window = 4, .lanes = 2}};
    permd_mixture *off;
    assert_int_equal(permd_mixture_new_ex(SEED, oc, 2, 0, 128, starts1, weights1, 1, &off), 0);
    assert_int_equal(permd_mixture_size(off), 1000 + n);
    for (uint64_t epoch = 0; epoch < 4; epoch++)
        check_fetch(c, "ms", off, epoch, 2, 1, PERMD_MODE_PAD);
    permd_mixture_free(off);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

/* A mixture over a sharded dataset of many shards keeps its component orders warm between requests, and an
 * Inverse naming many component epochs runs on a worker and stops when its connection closes. */
enum { BIG_SHARDS = 1 << 17, MANY_EPOCHS = 300, CANCEL_EPOCHS = 20000 };

typedef struct inverse_call {
    permd_client *c;
    uint64_t samples[MANY_EPOCHS], comp_epochs[MANY_EPOCHS], epochs[MANY_EPOCHS], positions[MANY_EPOCHS];
    _Atomic int done;
    int rc;
} inverse_call;

static void *inverse_main(void *arg)
{
    inverse_call *x = arg;
    x->rc = permd_inverse_mixture(x->c, "mb", SEED, 1, -1, x->samples, x->comp_epochs, MANY_EPOCHS, x->epochs,
                                  x->positions, NULL);
    atomic_store(&x->done, 1);
    return NULL;
}

/* Run fn(arg) on a thread, which sets *done at its end, while connection d polls Stats: whether one of them
 * saw a worker-pool job. A request the loop ran inline would leave no job to see. */
static int ran_as_job(permd_client *d, void *(*fn)(void *), void *arg, _Atomic int *done)
{
    pthread_t th;
    int seen = 0;
    assert_int_equal(pthread_create(&th, NULL, fn, arg), 0);
    while (!seen && !atomic_load(done)) {
        permd_stats st;
        assert_int_equal(permd_stats_get(d, &st), 0);
        seen = st.queue_depth > 0;
    }
    pthread_join(th, NULL);
    return seen;
}

static long long built(int port)
{
    long long n = harness_metric(port, "permd_mix_orders_built_total");
    assert_true(n >= 0);
    return n;
}

static void test_sharded_component_warm(void **state)
{
    (void)state;
    harness h;
    permd_client *c, *d;
    char addr[32];
    int port = harness_metrics_addr(addr);
    /* each scrape follows an action; room for the cancelled Inverse below (20000 orders of 2^17 shards) */
    const char *extra[] = {"--metrics", addr, "--metrics-cache-ms", "0", "--max-inverse-work", "3000000000", NULL};
    harness_init(&h);
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_connect_unix(h.sock, &d), 0);
    uint64_t *sizes = malloc(BIG_SHARDS * sizeof *sizes);
    assert_non_null(sizes);
    for (int i = 0; i < BIG_SHARDS; i++)
        sizes[i] = 1 + i % 3;
    assert_int_equal(permd_put_dataset(c, "a", 1000, NULL, NULL), 0);
    assert_int_equal(permd_put_dataset_sharded(c, "big", sizes, BIG_SHARDS, 8, 4, NULL, NULL), 0);
    static const char *const comps[] = {"a", "big"};
    static const uint32_t even[] = {1, 1};
    assert_int_equal(permd_put_mixture(c, "mb", comps, 2, starts1, even, 1, 0, 0, NULL, NULL), 0);
    permd_mix_component oc[2] = {{.size = 1000}, {.shard_sizes = sizes, .nshards = BIG_SHARDS, .window = 8, .lanes = 4}};
    permd_mixture *off;
    assert_int_equal(permd_mixture_new_ex(SEED, oc, 2, 0, 0, starts1, even, 1, &off), 0);

    /* Ten Fetches in mixture epoch 0 (which draws from big's component epoch 0 only): the offline ids,
     * and big's order built once, not once a Fetch. */
    const long long before = built(port);
    permd_slice sl = {.dataset = "mb", .seed = SEED, .epoch = 0, .world = 1, .rank = 0, .mode = PERMD_MODE_EXACT};
    for (int i = 0; i < 10; i++) {
        uint32_t got_ids[50], want[50];
        uint64_t got, next, wgot;
        assert_int_equal(permd_fetch_u32(c, &sl, 50, got_ids, &got, &next), 0);
        assert_int_equal(permd_mixture_rank_fill(off, 0, 1, 0, PERMD_MODE_EXACT, sl.offset, 50, want, 4, &wgot), 0);
        assert_int_equal(got, 50);
        assert_memory_equal(got_ids, want, sizeof want);
        sl.offset = next;
    }
    assert_int_equal(built(port) - before, 1);

    /* A Fetch of mixture epoch 1's last 20000 positions reaches big's component epoch 1, whose order the warm
     * cursor lacks: within the inline budget by its ids (20000 at 3 each), but its order of BIG_SHARDS
     * shards sends it to a worker (permd_worker_jobs_total) instead of holding the loop while it is built;
     * a Fetch of 50 in the component epoch the cursor holds stays on the loop. Their ids are the offline
     * ones. */
    uint32_t *cross = malloc(20000 * sizeof *cross), *want = malloc(20000 * sizeof *want);
    assert_non_null(cross);
    assert_non_null(want);
    permd_slice late = sl;
    late.epoch = 1;
    late.offset = permd_mixture_size(off) - 20000; /* L = N */
    uint64_t got, next, wgot;
    long long jobs = harness_metric(port, "permd_worker_jobs_total");
    assert_int_equal(permd_fetch_u32(c, &sl, 50, cross, &got, &next), 0); /* warm: inline */
    assert_int_equal(harness_metric(port, "permd_worker_jobs_total"), jobs);
    const long long before_cross = built(port);
    assert_int_equal(permd_fetch_u32(c, &late, 20000, cross, &got, &next), 0);
    assert_true(harness_metric(port, "permd_worker_jobs_total") > jobs);
    assert_int_equal(built(port) - before_cross, 1);
    assert_int_equal(permd_mixture_rank_fill(off, 1, 1, 0, PERMD_MODE_EXACT, late.offset, 20000, want, 4, &wgot), 0);
    assert_int_equal(got, 20000);
    assert_memory_equal(cross, want, 20000 * sizeof *want);
    free(cross);
    free(want);

    /* An Inverse of MANY_EPOCHS samples of big, each of another component epoch: MANY_EPOCHS orders to
     * build, which the cost model sends to a worker. While it runs the loop answers another connection's
     * Stats, which then counts it among the jobs; inline, every Stats would come after it with none. */
    inverse_call *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->c = c;
    for (int i = 0; i < MANY_EPOCHS; i++) {
        x->samples[i] = 1000 + (uint64_t)i * 7;
        x->comp_epochs[i] = 1000 + (uint64_t)i;
    }
    const long long before_inverse = built(port);
    assert_true(ran_as_job(d, inverse_main, x, &x->done));
    assert_int_equal(x->rc, 0);
    assert_int_equal(built(port) - before_inverse, MANY_EPOCHS); /* each distinct epoch once */
    for (int i = 0; i < MANY_EPOCHS; i += 37) {
        uint64_t e, p;
        assert_int_equal(permd_mixture_position(off, 1, x->samples[i] - 1000, x->comp_epochs[i], &e, &p), 0);
        assert_int_equal(x->epochs[i], e);
        assert_int_equal(x->positions[i], p);
    }
    free(x);

    /* One naming CANCEL_EPOCHS component epochs, whose connection closes while it runs: it stops at the
     * end of its turn (job_slice_ids' worth of builds) rather than building them all. */
    uint64_t *samples = malloc(CANCEL_EPOCHS * 8), *epochs = malloc(CANCEL_EPOCHS * sizeof *epochs);
    assert_non_null(samples);
    assert_non_null(epochs);
    for (uint64_t i = 0; i < CANCEL_EPOCHS; i++) {
        samples[i] = 1000 + i % 1000; /* little-endian u32s would do too: N < 2^32 makes id_width 4 */
        epochs[i] = 5000 + i;
    }
    uint32_t *ids = malloc(CANCEL_EPOCHS * 4);
    assert_non_null(ids);
    for (uint64_t i = 0; i < CANCEL_EPOCHS; i++)
        ids[i] = (uint32_t)samples[i];
    Permd__V1__Inverse inv = PERMD__V1__INVERSE__INIT;
    inv.dataset = "mb";
    inv.seed = SEED;
    inv.world = 1;
    inv.samples.data = (uint8_t *)ids;
    inv.samples.len = CANCEL_EPOCHS * 4;
    inv.n_component_epochs = CANCEL_EPOCHS;
    inv.component_epochs = epochs;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_INVERSE;
    env.inverse = &inv;
    const long long before_cancel = built(port);
    int fd = raw_connect_unix(h.sock);
    assert_true(fd >= 0);
    assert_int_equal(raw_send_env(fd, &env), 0);
    permd_stats st;
    do /* until the job runs */
        assert_int_equal(permd_stats_get(d, &st), 0);
    while (st.queue_depth == 0);
    close(fd);
    do /* until it has stopped: without cancellation, after CANCEL_EPOCHS builds */
        assert_int_equal(permd_stats_get(d, &st), 0);
    while (st.queue_depth > 0);
    const long long cancelled = built(port) - before_cancel;
    print_message("cancelled inverse built %lld of %d orders\n", cancelled, CANCEL_EPOCHS);
    assert_true(cancelled < CANCEL_EPOCHS);

    /* Past max_inverse_work: 23000 component epochs of big cost 23000 orders of 2^17 shards, over 3e9 ids of work
     * (hours of a worker at max_count samples): TOO_LARGE before any is built, and the connection serves on. */
    enum { TOO_MANY = 23000 };
    uint64_t *many = malloc(TOO_MANY * 8), *many_epochs = malloc(TOO_MANY * 8), *out = malloc(TOO_MANY * 8);
    assert_true(many && many_epochs && out);
    for (uint64_t i = 0; i < TOO_MANY; i++) {
        many[i] = 1000 + i % 1000;
        many_epochs[i] = 90000 + i;
    }
    const long long before_refused = built(port);
    assert_int_equal(permd_inverse_mixture(c, "mb", SEED, 1, -1, many, many_epochs, TOO_MANY, out, out, NULL),
                     PERMD_ETOOBIG);
    assert_non_null(strstr(permd_last_error(c), "max_inverse_work"));
    assert_int_equal(built(port), before_refused);
    assert_int_equal(permd_inverse_mixture(c, "mb", SEED, 1, -1, many, many_epochs, 2, out, out, NULL), 0);
    free(many);
    free(many_epochs);
    free(out);
    free(ids);
    free(samples);
    free(epochs);

    permd_mixture_free(off);
    free(sizes);
    permd_close(d);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

/* Mixture definitions are bounded (mixture_memory, 576 bytes for "m" here): a put past it is TOO_LARGE naming the
 * key, and the daemon serves on; a put of one already stored costs nothing more. 100 definitions of 200
 * components and 4096 stages had grown permd by 330 MB with no limit and no gauge. */
static void test_definitions_are_bounded(void **state)
{
    (void)state;
    harness h;
    permd_client *c;
    const char *extra[] = {"--mixture-memory", "8192", NULL};
    setup_datasets_with(&h, &c, extra);
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts1, weights1, 1, 0, 0, NULL, NULL), 0);
    enum { S = 600 }; /* 208 + 2·176 + 600·16 bytes: past 8192 with "m" */
    uint64_t starts[S];
    uint32_t weights[2 * S];
    for (uint32_t k = 0; k < S; k++) {
        starts[k] = 64 * (uint64_t)k;
        weights[2 * k] = 1 + k % 3;
        weights[2 * k + 1] = 1;
    }
    assert_int_equal(permd_put_mixture(c, "big", comp_ab, 2, starts, weights, S, 0, 0, NULL, NULL), PERMD_ETOOBIG);
    if (!strstr(permd_last_error(c), "mixture_memory"))
        fail_msg("error: %s", permd_last_error(c));
    assert_int_equal(permd_put_mixture(c, "m", comp_ab, 2, starts1, weights1, 1, 0, 0, NULL, NULL), 0); /* as stored */
    assert_int_equal(permd_put_mixture(c, "big", comp_ab, 2, starts, weights, 300, 0, 0, NULL, NULL), 0); /* fits */
    permd_mixture *off = offline(starts1, weights1, 1);
    check_fetch(c, "m", off, 0, 2, 1, PERMD_MODE_PAD);
    permd_mixture_free(off);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_definitions_are_bounded),
        cmocka_unit_test(test_serve_like_offline),
        cmocka_unit_test(test_stages_and_persistence),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_component_changed_under_it),
        cmocka_unit_test(test_definitions),
        cmocka_unit_test(test_sharded_component),
        cmocka_unit_test(test_sharded_component_warm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
