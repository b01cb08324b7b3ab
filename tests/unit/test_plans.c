/* Tests for daemon/plans.c: sharded plans built on the CPU kernels; mixture cursors kept warm with their plan, charged against the cache's bytes, given up for room. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/plans.h"

enum { SHARDS = 4096 };

/* A mixture of a flat dataset (1000 samples) and a sharded one (SHARDS shards of 3), with layouts[1]
 * the sharded one's layout (the caller releases both). */
static pd_mixdef *mix_def(pd_layout **layouts)
{
    uint64_t *sizes = malloc(SHARDS * sizeof *sizes);
    assert_non_null(sizes);
    for (int i = 0; i < SHARDS; i++)
        sizes[i] = 3;
    layouts[0] = NULL;
    assert_int_equal(pd_layout_create(sizes, SHARDS, &layouts[1]), 0);
    free(sizes);
    pd_mixdef *d;
    assert_int_equal(pd_mixdef_alloc("mx", 2, 1, &d), 0);
    strcpy(d->comp[0].name, "flat");
    d->comp[0].size = 1000;
    strcpy(d->comp[1].name, "sharded");
    d->comp[1].size = 3 * SHARDS;
    d->comp[1].shards = SHARDS;
    d->comp[1].window = 4;
    d->comp[1].lanes = 2;
    d->comp[1].layout_hash = layouts[1]->hash;
    d->starts[0] = 0;
    d->weights[0] = 1;
    d->weights[1] = 1;
    assert_int_equal(pd_mixdef_check(d, NULL, 0), 0);
    return d;
}

/* A cache of max_bytes with mixture d's plan (seed 7) in *p. */
static void open_mix(pd_mixdef *d, pd_layout **layouts, uint64_t max_bytes, pd_plans **c, pd_plan **p)
{
    assert_int_equal(pd_plans_open(4, max_bytes, NULL, c), 0);
    assert_int_equal(pd_plans_get_mix(*c, d, layouts, 7, p), 0);
}

/* Release what mix_def made. */
static void free_def(pd_mixdef *d, pd_layout **layouts)
{
    pd_layout_release(layouts[1]);
    pd_mixdef_release(d);
}

/* The first `count` ids of mixture epoch `epoch` (world 1) through cursor c. */
static void fill(pd_mix_cursor *c, uint64_t epoch, uint64_t offset, uint64_t count, uint64_t *out)
{
    pd_slice s = {.world = 1, .rank = 0, .mode = PD_MODE_EXACT, .offset = offset};
    uint64_t written;
    assert_int_equal(pd_mix_slice_fill_u64(c, epoch, &s, count, out, &written), 0);
    assert_int_equal(written, count);
}

/* A cursor given back is the next one taken: it keeps its orders (no sharded order built again), its
 * ids are those of a fresh cursor, and its bytes are charged until its plan goes. */
static void test_cursor_reused(void **state)
{
    (void)state;
    pd_layout *layouts[2];
    pd_mixdef *d = mix_def(layouts);
    pd_plans *c;
    pd_plan *p;
    open_mix(d, layouts, UINT64_C(1) << 30, &c, &p);
    assert_false(pd_plan_cursor_warm(p));

    pd_mix_cursor *cur, *again;
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    const uint64_t table = pd_plans_bytes(c) - pd_mix_cursor_bytes(cur->mix);
    assert_true(pd_plans_bytes(c) > pd_mix_cursor_bytes(cur->mix)); /* the plan's table and the cursor */
    uint64_t a[200], b[200];
    fill(cur, 0, 0, 100, a);
    const uint64_t built = cur->built;
    assert_true(built >= 1); /* the sharded component's order for its epoch 0 */
    pd_plan_cursor_give(p, cur);
    assert_true(pd_plan_cursor_warm(p));

    assert_int_equal(pd_plan_cursor_take(p, &again), 0);
    assert_ptr_equal(again, cur);
    fill(again, 0, 100, 100, a + 100);
    assert_int_equal(again->built, built); /* same component epochs: nothing rebuilt */
    pd_plan_cursor_give(p, again);

    /* The same ids as a cursor of its own. */
    const pd_mix *mix;
    assert_int_equal(pd_plan_use_mix(p, &mix), 0);
    size_t bytes = pd_mix_cursor_bytes(mix);
    void *mem = malloc(bytes);
    pd_mix_cursor own;
    assert_int_equal(pd_mix_cursor_init(&own, mix, mem, bytes), 0);
    fill(&own, 0, 0, 200, b);
    assert_memory_equal(a, b, sizeof a);
    free(mem);

    /* Two at once: a second cursor, charged too. */
    pd_mix_cursor *x, *y;
    assert_int_equal(pd_plan_cursor_take(p, &x), 0);
    assert_int_equal(pd_plan_cursor_take(p, &y), 0);
    assert_ptr_not_equal(x, y);
    assert_true(pd_plans_bytes(c) > table + bytes);
    pd_plan_cursor_give(p, x);
    pd_plan_cursor_give(p, y);

    pd_plan_release(p);
    pd_plans_close(c); /* frees the plan with its cursors */
    free_def(d, layouts);
}

/* A take on another thread, which may wait. */
typedef struct second_take {
    pd_plan *p;
    pd_mix_cursor *cur;
    int rc;
    atomic_int done;
} second_take;

static void *take_main(void *arg)
{
    second_take *w = arg;
    w->rc = pd_plan_cursor_take(w->p, &w->cur);
    atomic_store(&w->done, 1);
    return NULL;
}

/* With the cache full of plans in use, a new cursor is PD_EBUSY; idle cursors give way to a new plan
 * before any table does; a plan and one cursor alone may pass the bound. */
static void test_cursor_bounded(void **state)
{
    (void)state;
    pd_layout *layouts[2];
    pd_mixdef *d = mix_def(layouts);
    pd_plans *c;
    pd_plan *p, *q;
    pd_mix_cursor *cur, *cur2;
    /* Room for the mixture's table and one cursor, a little more, and not a second cursor. */
    open_mix(d, layouts, UINT64_C(1) << 30, &c, &p);
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    const uint64_t one = pd_plans_bytes(c);
    pd_plan_cursor_give(p, cur);
    pd_plan_release(p);
    pd_plans_close(c);

    const uint64_t shard_plan = pd_shard_plan_bytes(SHARDS);
    open_mix(d, layouts, one + shard_plan, &c, &p);
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    assert_int_equal(pd_plans_bytes(c), one);
    /* A sharded epoch's plan fits beside it. */
    assert_int_equal(pd_plans_get(c, layouts[1], 1, 0, 4, 2, &q), 0);
    /* Now a second cursor does not, and every plan is in use. */
    assert_int_equal(pd_plan_cursor_take(p, &cur2), PD_EBUSY);
    assert_null(cur2);
    pd_plan_release(q);
    /* The first cursor, given back, serves the next request (a second at once would wait for it: below). */
    pd_plan_cursor_give(p, cur);
    assert_int_equal(pd_plan_cursor_take(p, &cur2), 0);
    assert_ptr_equal(cur2, cur);
    pd_plan_cursor_give(p, cur2);
    pd_plan_release(p);
    /* The idle cursors give way to a new sharded plan; the mixture's table stays cached. */
    assert_int_equal(pd_plans_get(c, layouts[1], 1, 1, 4, 2, &q), 0);
    assert_true(pd_plans_bytes(c) <= one + shard_plan);
    pd_plan_release(q);
    assert_int_equal(pd_plans_get_mix(c, d, layouts, 7, &p), 0);
    assert_true(pd_plan_ready(p)); /* its table was not freed */
    pd_plan_release(p);
    pd_plans_close(c);

    /* Alone, a plan and one cursor may pass the bound; a second take at once waits for it (each concurrent request
     * used to add a cursor past the bound: 25 times plan_cache_bytes with four; refusing it instead failed a lone
     * stream, whose batches ahead run at once), and gets it once it is given back. */
    open_mix(d, layouts, 1, &c, &p);
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    assert_int_equal(pd_plans_bytes(c), one);
    second_take w = {.p = pd_plan_ref(p)};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, take_main, &w), 0);
    usleep(100000);
    assert_int_equal(atomic_load(&w.done), 0); /* waiting, and nothing more charged */
    assert_int_equal(pd_plans_bytes(c), one);
    pd_plan_cursor_give(p, cur);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, 0);
    assert_ptr_equal(w.cur, cur);
    assert_int_equal(pd_plans_bytes(c), one);
    assert_true(pd_plans_cursor_bytes(c) > 0 && pd_plans_cursor_bytes(c) < one);
    pd_plan_cursor_give(p, w.cur);
    pd_plan_release(w.p);
    pd_plan_release(p);
    pd_plans_close(c);

    free_def(d, layouts);
}

/* The loop's take never blocks: where pd_plan_cursor_take would start a cursor with sharded orders to build, or
 * wait for a plan's one cursor, pd_plan_cursor_try_take gives none at once (the loop then hands the request to a
 * worker); an idle cursor it gives as take does. */
static void test_cursor_try_take(void **state)
{
    (void)state;
    pd_layout *layouts[2];
    pd_mixdef *d = mix_def(layouts);
    pd_plans *c;
    pd_plan *p;
    pd_mix_cursor *cur, *got;
    open_mix(d, layouts, UINT64_C(1) << 30, &c, &p);
    assert_int_equal(pd_plan_use_mix(p, &(const pd_mix *){NULL}), 0); /* the table built: only the cursor is missing */
    got = (pd_mix_cursor *)1;
    assert_int_equal(pd_plan_cursor_try_take(p, &got), 0);
    assert_null(got); /* no idle cursor, and a new one would build the sharded component's orders */
    assert_int_equal(pd_plans_cursor_bytes(c), 0); /* nothing charged */
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    assert_int_equal(pd_plan_cursor_try_take(p, &got), 0);
    assert_null(got); /* the one cursor is taken (by "another thread") */
    pd_plan_cursor_give(p, cur);
    assert_int_equal(pd_plan_cursor_try_take(p, &got), 0);
    assert_ptr_equal(got, cur); /* idle: the loop gets it */
    pd_plan_cursor_give(p, got);
    pd_plan_release(p);
    pd_plans_close(c);

    free_def(d, layouts);

    /* A plan alone past the bound, its one cursor taken: take would wait for it, try_take does not. A flat
     * mixture's, whose new cursors build nothing (the sharded one's is refused before this rule applies). */
    pd_layout *none[1] = {NULL};
    assert_int_equal(pd_mixdef_alloc("mf", 1, 1, &d), 0);
    strcpy(d->comp[0].name, "flat");
    d->comp[0].size = 1000;
    d->starts[0] = 0;
    d->weights[0] = 1;
    assert_int_equal(pd_mixdef_check(d, NULL, 0), 0);
    open_mix(d, none, 1, &c, &p);
    assert_int_equal(pd_plan_cursor_try_take(p, &got), 0);
    assert_null(got); /* its table not built yet: the loop does not build it */
    assert_int_equal(pd_plan_use_mix(p, &(const pd_mix *){NULL}), 0);
    assert_int_equal(pd_plan_cursor_try_take(p, &got), 0); /* nothing taken yet: a new cursor, on the loop too */
    assert_non_null(got);
    pd_plan_cursor_give(p, got);
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    const uint64_t one = pd_plans_bytes(c);
    assert_int_equal(pd_plan_cursor_try_take(p, &got), 0);
    assert_null(got);
    assert_int_equal(pd_plans_bytes(c), one);
    pd_plan_cursor_give(p, cur);
    assert_int_equal(pd_plan_cursor_try_take(p, &got), 0);
    assert_ptr_equal(got, cur);
    pd_plan_cursor_give(p, got);
    pd_plan_release(p);
    pd_plans_close(c);
    pd_mixdef_release(d);
}

/* A mixture whose plan loses its table (a dataset deleted under it) frees its cursors and their
 * charge; a plan released for the last time does too. */
static void test_cursor_freed_with_plan(void **state)
{
    (void)state;
    pd_layout *layouts[2];
    pd_mixdef *d = mix_def(layouts);
    pd_plans *c;
    pd_plan *p;
    pd_mix_cursor *cur;
    open_mix(d, layouts, UINT64_C(1) << 30, &c, &p);
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    pd_plan_cursor_give(p, cur);
    pd_plan_release(p);
    assert_true(pd_plans_bytes(c) > 0);
    pd_plans_drop_mixture(c, "mx", NULL); /* deleted: unused, so freed now */
    assert_int_equal(pd_plans_bytes(c), 0);
    pd_plans_close(c);
    free_def(d, layouts);
}

/* What a request would build, as the event loop asks before running it inline: nothing in the component
 * epochs the idle cursor holds, the sharded component's SHARDS for a range reaching another one,
 * UINT64_MAX while the plan is not built or no cursor is idle; a mixture without sharded components: 0. */
static void test_cursor_missing(void **state)
{
    (void)state;
    pd_layout *layouts[2];
    pd_mixdef *d = mix_def(layouts);
    pd_plans *c;
    pd_plan *p;
    open_mix(d, layouts, UINT64_C(1) << 30, &c, &p);
    assert_int_equal(pd_plan_cursor_missing(p, 0, 0, 10), UINT64_MAX); /* not built */
    const pd_mix *mix;
    assert_int_equal(pd_plan_use_mix(p, &mix), 0);
    assert_int_equal(pd_plan_cursor_missing(p, 0, 0, 10), UINT64_MAX); /* no idle cursor */
    /* Where the sharded component's epochs 1 and 2 begin: mixture epoch e[k], position o[k]; b1: where the
     * block holding epoch 1's first draw begins (blocks count run positions E·L + p, and L = N is not a
     * multiple of B here). */
    const uint64_t L = mix->length, n = 3 * SHARDS, B = mix->block;
    uint64_t e[3] = {0}, o[3] = {0}, g1 = 0;
    for (int k = 1; k < 3; k++) {
        uint64_t g;
        assert_int_equal(pd_mix_draw_position(mix, 1, k * n, &g), 0);
        e[k] = g / L;
        o[k] = g % L;
        g1 = k == 1 ? g : g1;
        assert_true(o[k] + 10 < L);
    }
    const uint64_t b1 = (g1 & ~(B - 1)) - e[1] * L;
    assert_true(b1 >= B && b1 < L);
    pd_mix_cursor *cur;
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    uint64_t ids[100];
    fill(cur, 0, 0, 100, ids); /* the sharded component's epoch 0 */
    pd_plan_cursor_give(p, cur);
    assert_int_equal(pd_plan_cursor_missing(p, 0, 0, 10), 0);
    assert_int_equal(pd_plan_cursor_missing(p, e[1], b1 - B, b1 - 1), 0);            /* still epoch 0 */
    assert_int_equal(pd_plan_cursor_missing(p, e[1], b1 - 5, b1), SHARDS);           /* into epoch 1 */
    assert_true(e[2] > e[1]); /* so the reach from 100 to L − 1 of e[1] ends before epoch 2 */
    assert_int_equal(pd_plan_cursor_missing(p, e[1], o[1], L + 100), SHARDS); /* a wrap: from 100 to L − 1 */
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    fill(cur, e[1], o[1], 11, ids); /* builds epoch 1 */
    assert_int_equal(pd_plan_cursor_missing(p, e[1], o[1], o[1] + 10), UINT64_MAX); /* the warm one is taken */
    pd_plan_cursor_give(p, cur);
    assert_int_equal(pd_plan_cursor_missing(p, e[1], b1 - 5, o[1] + 10), 0); /* both held: two slots */
    assert_int_equal(pd_plan_cursor_missing(p, e[2], o[2], o[2] + 10), SHARDS);
    pd_plan_release(p);

    pd_mixdef *flat;
    assert_int_equal(pd_mixdef_alloc("fl", 1, 1, &flat), 0);
    strcpy(flat->comp[0].name, "flat");
    flat->comp[0].size = 1000;
    flat->starts[0] = 0;
    flat->weights[0] = 1;
    assert_int_equal(pd_mixdef_check(flat, NULL, 0), 0);
    pd_layout *none[1] = {NULL};
    assert_int_equal(pd_plans_get_mix(c, flat, none, 7, &p), 0);
    assert_int_equal(pd_plan_use_mix(p, &mix), 0);
    assert_int_equal(pd_plan_cursor_missing(p, 5, 0, 999), 0);
    pd_plan_release(p);
    pd_mixdef_release(flat);
    pd_plans_close(c);
    free_def(d, layouts);
}

/* A cache given a generator builds a sharded plan on its σ kernel: the core's plan (a cache without one builds
 * that), table for table; another epoch's differs (the comparison can fail). */
static void test_sharded_plan_on_gen(void **state)
{
    (void)state;
    enum { S = 5000 };
    uint64_t *sizes = malloc(S * sizeof *sizes);
    assert_non_null(sizes);
    for (int i = 0; i < S; i++)
        sizes[i] = 1 + (uint64_t)(i * 7919) % 13;
    pd_layout *layout;
    assert_int_equal(pd_layout_create(sizes, S, &layout), 0);
    free(sizes);
    pd_gen g;
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), 0);
    pd_plans *with, *without;
    assert_int_equal(pd_plans_open(4, UINT64_C(1) << 30, &g, &with), 0);
    assert_int_equal(pd_plans_open(4, UINT64_C(1) << 30, NULL, &without), 0);
    pd_plan *a, *b, *other;
    const pd_shard_plan *pa, *pb, *po;
    assert_int_equal(pd_plans_get(with, layout, 3, 9, 8, 2, &a), 0);
    assert_int_equal(pd_plans_get(without, layout, 3, 9, 8, 2, &b), 0);
    assert_int_equal(pd_plans_get(with, layout, 3, 10, 8, 2, &other), 0);
    assert_int_equal(pd_plan_use(a, &pa), 0);
    assert_int_equal(pd_plan_use(b, &pb), 0);
    assert_int_equal(pd_plan_use(other, &po), 0);
    assert_memory_equal(pa->slot_shard, pb->slot_shard, S * sizeof *pa->slot_shard);
    assert_memory_equal(pa->slot_start, pb->slot_start, (S + 1) * sizeof *pa->slot_start);
    assert_int_equal(pa->n, pb->n);
    assert_true(memcmp(pa->slot_shard, po->slot_shard, S * sizeof *pa->slot_shard) != 0);
    pd_plan_release(a);
    pd_plan_release(b);
    pd_plan_release(other);
    pd_plans_close(with);
    pd_plans_close(without);
    pd_layout_release(layout);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded_plan_on_gen),
        cmocka_unit_test(test_cursor_reused),
        cmocka_unit_test(test_cursor_bounded),
        cmocka_unit_test(test_cursor_try_take),
        cmocka_unit_test(test_cursor_freed_with_plan),
        cmocka_unit_test(test_cursor_missing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
