/* Tests for cpu/mix.c: every ISA and walk gives the core's mixture ids bit for bit (flat and sharded
 * components, any world, mode and offset, component epochs and stages inside a request), and the same errors. */
#include "test_util.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "cpu/divide.h"
#include "cpu/kernel.h"
#include "cpu/mix.h"
#include "mix_util.h"

#define GUARD 8
#define SENTINEL UINT64_C(0xA5A5A5A5A5A5A5A5)

/* Every generator this CPU can run: each ISA with each walk it has; with without_avx2, and an AVX-512 one without
 * AVX2's helpers (a generator built by hand: the counting sort, each read's draw read by read). */
static size_t all_gens(pd_gen *out, int without_avx2)
{
    size_t n = 0;
    for (int isa = PD_ISA_SCALAR; isa <= PD_ISA_AVX512; isa++) {
        if (!pd_cpu_has_isa((pd_isa)isa))
            continue;
        for (int w = PD_WALK_AUTO; w <= PD_WALK_COMPACT; w++) {
            assert_int_equal(pd_gen_init(&out[n], (pd_isa)isa), PD_OK);
            if (pd_gen_set_walk(&out[n], (pd_walk)w) == PD_OK)
                n++;
        }
        if (without_avx2 && isa == PD_ISA_AVX512 && n && out[n - 1].avx2) {
            out[n] = out[n - 1];
            out[n++].avx2 = 0;
        }
    }
    return n;
}

/* got[0, n_want) equals want, and nothing was written past it (got was filled with SENTINEL). */
static void check_ids(const char *who, const pd_slice *s, const uint64_t *got, const uint64_t *want, uint64_t n_want)
{
    for (uint64_t i = 0; i < n_want; i++)
        if (got[i] != want[i])
            fail_msg("%s W %u rank %u mode %d offset %llu: id %llu of %llu is %llu, want %llu", who, s->world, s->rank,
                     (int)s->mode, (unsigned long long)s->offset, (unsigned long long)i, (unsigned long long)n_want,
                     (unsigned long long)got[i], (unsigned long long)want[i]);
    for (uint64_t i = n_want; i < n_want + GUARD; i++)
        assert_true(got[i] == SENTINEL);
}

/* The u32 fill through g (or the pool, if given) against the core's n_want ids, nothing written past them. */
static void check_u32(const char *who, const pd_gen *g, pd_pool *pool, owned_mix *o, uint64_t epoch,
                      const pd_slice *s, uint64_t count, const uint64_t *want, uint64_t n_want, uint32_t *got32)
{
    uint64_t n_got;
    for (uint64_t i = 0; i < n_want + GUARD; i++)
        got32[i] = (uint32_t)SENTINEL;
    assert_int_equal(pool ? pd_pool_mix_fill_u32(pool, &o->cur, epoch, s, count, got32, &n_got)
                          : pd_gen_mix_fill_u32(g, &o->cur, epoch, s, count, got32, &n_got),
                     PD_OK);
    assert_int_equal(n_got, n_want);
    for (uint64_t i = 0; i < n_want; i++)
        if (got32[i] != want[i])
            fail_msg("%s u32: id %llu is %u, want %llu", who, (unsigned long long)i, got32[i],
                     (unsigned long long)want[i]);
    for (uint64_t i = n_want; i < n_want + GUARD; i++)
        assert_true(got32[i] == (uint32_t)SENTINEL);
}

/* One request through g against the core's n_want ids: u64 and u32 (when ids fit) equal, nothing written
 * past them. */
static void compare(const pd_gen *g, owned_mix *o, uint64_t epoch, const pd_slice *s, uint64_t count,
                    const uint64_t *want, uint64_t n_want, uint64_t *got, uint32_t *got32)
{
    uint64_t n_got;
    char who[64];
    snprintf(who, sizeof who, "%s/%s", pd_isa_name(g->isa), pd_walk_name(g->walk));
    for (uint64_t i = 0; i < n_want + GUARD; i++)
        got[i] = SENTINEL;
    assert_int_equal(pd_gen_mix_fill_u64(g, &o->cur, epoch, s, count, got, &n_got), PD_OK);
    assert_int_equal(n_got, n_want);
    check_ids(who, s, got, want, n_want);
    if (pd_id_width(o->mix.total) != 4) {
        assert_int_equal(pd_gen_mix_fill_u32(g, &o->cur, epoch, s, count, got32, &n_got), PD_EOVERFLOW);
        return;
    }
    check_u32(who, g, NULL, o, epoch, s, count, want, n_want, got32);
}

/* The pooled fill (parts on several threads, a cursor each) against the core's ids. */
static void compare_pool(pd_pool *pool, owned_mix *o, uint64_t epoch, const pd_slice *s, uint64_t count,
                         const uint64_t *want, uint64_t n_want, uint64_t *got, uint32_t *got32)
{
    uint64_t n_got;
    for (uint64_t i = 0; i < n_want + GUARD; i++)
        got[i] = SENTINEL;
    assert_int_equal(pd_pool_mix_fill_u64(pool, &o->cur, epoch, s, count, got, &n_got), PD_OK);
    assert_int_equal(n_got, n_want);
    check_ids("pool", s, got, want, n_want);
    if (pd_id_width(o->mix.total) == 4)
        check_u32("pool", NULL, pool, o, epoch, s, count, want, n_want, got32);
}

/* One long request of slice s over epoch through every generator (all_gens) against the core. */
static void compare_gens(owned_mix *o, uint64_t epoch, const pd_slice *s, uint64_t count, int without_avx2)
{
    pd_gen gens[16];
    const size_t ngens = all_gens(gens, without_avx2);
    uint64_t *want = malloc((count + GUARD) * sizeof *want), *got = malloc((count + GUARD) * sizeof *got), n_want;
    uint32_t *got32 = malloc((count + GUARD) * sizeof *got32);
    assert_true(want && got && got32);
    assert_int_equal(pd_mix_slice_fill_u64(&o->cur, epoch, s, count, want, &n_want), PD_OK);
    for (size_t i = 0; i < ngens; i++)
        compare(&gens[i], o, epoch, s, count, want, n_want, got, got32);
    free(want);
    free(got);
    free(got32);
}

static void compare_all(owned_mix *o, uint64_t epoch, const pd_slice *s, uint64_t count)
{
    compare_gens(o, epoch, s, count, 0);
}

/* Random mixtures of flat and sharded components; random slices over random epochs. */
static void matches_core(void **state)
{
    (void)state;
    pd_gen gens[16];
    const size_t ngens = all_gens(gens, 0);
    uint64_t rng = 77;
    const size_t cap = 40000;
    uint64_t *want = malloc((cap + GUARD) * sizeof *want), *got = malloc((cap + GUARD) * sizeof *got);
    uint32_t *got32 = malloc((cap + GUARD) * sizeof *got32);
    static const uint64_t blocks[] = {64, 128, 256, 512, 2048};
    static const uint32_t worlds[] = {1, 1, 2, 3, 8, 64, 1000};
    const int trials = test_quick() ? 3 : 40;
    pd_pool *pool; /* requests of up to 40000 reads split into parts of PD_MIX_POOL_PART_MIN_* to _MAX reads */
    assert_int_equal(pd_pool_create(3, NULL, &pool), PD_OK);
    assert_int_equal(pd_pool_set_spin(pool, 50000), PD_OK); /* as permd runs it (cpu_spin_us) */
    for (int t = 0; t < trials; t++) {
        uint64_t C = 1 + test_below(&rng, 12), S = 1 + test_below(&rng, 4), block = blocks[test_below(&rng, 5)];
        uint64_t sizes[12], nshards[12] = {0}, windows[12], lanes[12], starts[4], shard_sizes[12][20];
        const uint64_t *shards[12] = {NULL};
        uint32_t weights[48];
        for (uint64_t j = 0; j < C; j++) {
            const uint64_t kind = test_below(&rng, 6);
            sizes[j] = kind == 0 ? 1 + test_below(&rng, 5)        /* many component epochs per request */
                     : kind == 1 ? (UINT64_C(1) << 32) + test_below(&rng, 99) /* wide ids and wide σ */
                                 : 1 + test_below(&rng, 5000);
            if (kind == 2) { /* sharded */
                nshards[j] = 1 + test_below(&rng, 20);
                sizes[j] = 0;
                for (uint64_t i = 0; i < nshards[j]; i++)
                    sizes[j] += shard_sizes[j][i] = test_below(&rng, 30);
                if (sizes[j] == 0)
                    sizes[j] = shard_sizes[j][0] = 7;
                shards[j] = shard_sizes[j];
                windows[j] = 1 + test_below(&rng, 4);
                lanes[j] = 1 + test_below(&rng, 3);
            }
        }
        for (uint64_t k = 0, at = 0; k < S; k++) {
            starts[k] = at;
            at += block * (1 + test_below(&rng, 30));
            for (uint64_t j = 0; j < C; j++)
                weights[k * C + j] = test_below(&rng, 3) ? (uint32_t)test_below(&rng, 100) : 0;
            weights[k * C + test_below(&rng, C)] += 1;
        }
        owned_mix o;
        const uint64_t length = test_below(&rng, 2) ? 0 : 1 + test_below(&rng, 30000);
        assert_int_equal(mix_make_ex(&o, test_rand(&rng), sizes, shards, nshards, windows, lanes, C, length, block,
                                     starts, weights, S),
                         PD_OK);
        for (int r = 0; r < 6; r++) {
            pd_slice s = {.world = worlds[test_below(&rng, 7)], .mode = (pd_mode)test_below(&rng, 3)};
            s.rank = (uint32_t)test_below(&rng, s.world);
            const uint64_t last = PD_MIX_RUN_END / o.mix.length - 1; /* the last epoch: run positions near 2^63 */
            uint64_t len, epoch = test_below(&rng, 3) ? test_below(&rng, 5) : test_below(&rng, 1000000);
            if (test_below(&rng, 4) == 0)
                epoch = last - test_below(&rng, last < 3 ? last + 1 : 3);
            epoch %= last + 1; /* an epoch that exists */
            assert_int_equal(pd_epoch_length(o.mix.length, s.world, s.mode, &len), PD_OK);
            s.offset = test_below(&rng, 4) ? test_below(&rng, len + 1) : len - test_below(&rng, len < 9 ? len + 1 : 9);
            const uint64_t count = test_below(&rng, cap);
            uint64_t n_want;
            assert_int_equal(pd_mix_slice_fill_u64(&o.cur, epoch, &s, count, want, &n_want), PD_OK);
            for (size_t i = 0; i < ngens; i++)
                compare(&gens[i], &o, epoch, &s, count, want, n_want, got, got32);
            compare_pool(pool, &o, epoch, &s, count, want, n_want, got, got32);
        }
        mix_free(&o);
    }
    pd_pool_destroy(pool);
    free(want);
    free(got);
    free(got32);
}

/* A mixture of four flat components (B = 64, one stage) read by rank 1 of each of three worlds from offset
 * 7·W of mixture epoch 2, count reads, by every generator against the core. */
static void four_components_match_core(uint64_t seed, const uint64_t sizes[4], const uint32_t weights[4],
                                       const uint32_t worlds[3], uint64_t count)
{
    const uint64_t starts[1] = {0};
    owned_mix o;
    assert_int_equal(mix_make(&o, seed, sizes, 4, 0, 64, starts, weights, 1), PD_OK);
    for (size_t w = 0; w < 3; w++) {
        const pd_slice s = {.world = worlds[w], .rank = 1, .mode = PD_MODE_EXACT, .offset = 7 * worlds[w]};
        compare_all(&o, 2, &s, count);
    }
    mix_free(&o);
}

/* Long sparse fills (many chunks, each of a batch or a few) where one component is rare: it misses whole
 * chunks, and the run it was given in an earlier chunk's batch must never be taken for a run of the current
 * one (a bug once: batch numbers restarted at each chunk, and a rare component's read took the run another
 * component held at that index, or none). */
static void long_sparse_fills_match_core(void **state)
{
    (void)state;
    const uint64_t sizes[4] = {1000000, 3000000, 2000000, 500000};
    const uint32_t weights[4] = {300, 300, 1, 300}, worlds[3] = {3, 8, 64};
    four_components_match_core(5, sizes, weights, worlds, 150000);
}

/* A large sharded component beside flat ones, read by a few ranks (its reads dense enough that spans of its
 * positions go through the SIMD kernel and each read takes its own) and by many (a locate per read); the
 * pool's parts share the caller's orders: once they hold a request's component epochs, no part builds. */
static void sharded_sparse_fills_match_core(void **state)
{
    (void)state;
    enum { SHARDS = 3000 };
    static uint64_t shard_sizes[SHARDS];
    uint64_t rng = 31, total = 0;
    for (int i = 0; i < SHARDS; i++)
        total += shard_sizes[i] = 100 + test_below(&rng, 200);
    const uint64_t *shards[3] = {shard_sizes, NULL, NULL};
    const uint64_t sizes[3] = {total, 400000, 123457}, nshards[3] = {SHARDS, 0, 0}, windows[3] = {8, 0, 0},
                   lanes[3] = {3, 0, 0}, starts[1] = {0};
    const uint32_t weights[3] = {5, 3, 2};
    static const uint32_t worlds[] = {2, 8, 64, 1000};
    owned_mix o;
    assert_int_equal(mix_make_ex(&o, 12, sizes, shards, nshards, windows, lanes, 3, 0, 64, starts, weights, 1), PD_OK);
    for (size_t w = 0; w < 4; w++) {
        const pd_slice s = {.world = worlds[w], .rank = worlds[w] / 2, .mode = PD_MODE_PAD, .offset = 11 * worlds[w]};
        compare_gens(&o, 1, &s, 40000, 1); /* W ≥ 16: the sharded component's chunks do not go by runs */
    }
    pd_pool *pool;
    assert_int_equal(pd_pool_create(4, NULL, &pool), PD_OK);
    const pd_slice s = {.world = 8, .rank = 3, .mode = PD_MODE_EXACT, .offset = 800};
    uint64_t *ids = malloc(40000 * sizeof *ids), got;
    assert_non_null(ids);
    /* 40000 reads: a part per thread (10000 reads each, within the parts' bounds). The first request builds each
     * component epoch it reaches once (≤ 2, prebuilt on the caller's cursor); the parts build nothing. */
    const uint64_t built = o.cur.built;
    assert_int_equal(pd_pool_mix_fill_u64(pool, &o.cur, 2, &s, 40000, ids, &got), PD_OK);
    assert_true(o.cur.built - built >= 1 && o.cur.built - built <= 2);
    const uint64_t warm = o.cur.built;
    assert_int_equal(pd_pool_mix_fill_u64(pool, &o.cur, 2, &s, 40000, ids, &got), PD_OK);
    assert_int_equal(o.cur.built, warm); /* counted from every part's view: none built */
    pd_pool_destroy(pool);
    free(ids);
    mix_free(&o);
}

/* pd_gen_shard_planner behind a count of its calls (the pool's parts call it from their threads). */
typedef struct counted_planner {
    const pd_gen *g;
    _Atomic uint64_t *calls;
} counted_planner;

static int counted_plan(const void *ctx, pd_shard_plan *plan, const uint64_t *start, uint64_t shards, uint64_t seed,
                        uint64_t epoch, uint64_t window, uint64_t lanes, void *mem, size_t mem_bytes)
{
    const counted_planner *t = ctx;
    atomic_fetch_add(t->calls, 1);
    return pd_gen_shard_planner(t->g, plan, start, shards, seed, epoch, window, lanes, mem, mem_bytes);
}

/* A cursor whose sharded orders pd_gen_shard_planner builds (as the daemon's and libpermd's cursors do) reads
 * the core's ids, through every generator and through the pool, whose parts' views build with it too. */
static void planned_orders_match_core(void **state)
{
    (void)state;
    enum { SHARDS = 2000 };
    static uint64_t shard_sizes[SHARDS];
    uint64_t rng = 77, total = 0;
    for (int i = 0; i < SHARDS; i++)
        total += shard_sizes[i] = 20 + test_below(&rng, 60); /* component epochs turn often: orders are rebuilt */
    const uint64_t *shards[2] = {shard_sizes, NULL};
    const uint64_t sizes[2] = {total, 5000}, nshards[2] = {SHARDS, 0}, windows[2] = {8, 0}, lanes[2] = {2, 0},
                   starts[1] = {0};
    const uint32_t weights[2] = {7, 1};
    owned_mix core, o;
    assert_int_equal(mix_make_ex(&core, 5, sizes, shards, nshards, windows, lanes, 2, 0, 64, starts, weights, 1),
                     PD_OK);
    assert_int_equal(mix_make_ex(&o, 5, sizes, shards, nshards, windows, lanes, 2, 0, 64, starts, weights, 1), PD_OK);
    pd_gen gens[16];
    const size_t ngens = all_gens(gens, 0);
    pd_pool *pool;
    assert_int_equal(pd_pool_create(4, NULL, &pool), PD_OK);
    enum { COUNT = 30000 };
    uint64_t *want = malloc((COUNT + GUARD) * sizeof *want), *got = malloc((COUNT + GUARD) * sizeof *got), n_want;
    uint32_t *got32 = malloc((COUNT + GUARD) * sizeof *got32);
    assert_true(want && got && got32);
    _Atomic uint64_t calls = 0;
    for (size_t i = 0; i < ngens; i++) {
        const counted_planner t = {.g = &gens[i], .calls = &calls};
        pd_mix_cursor_set_planner(&o.cur, counted_plan, &t);
        for (uint64_t k = 0; k < 6; k++) { /* W = 1, 8, 100, each through g, then through the pool */
            const uint32_t world = k / 2 == 0 ? 1 : k / 2 == 1 ? 8 : 100;
            const uint64_t epoch = 6 * i + k;
            const pd_slice s = {.world = world, .rank = world / 3, .mode = PD_MODE_PAD, .offset = 7 * world};
            assert_int_equal(pd_mix_slice_fill_u64(&core.cur, epoch, &s, COUNT, want, &n_want), PD_OK);
            if (k % 2 == 0)
                compare(&gens[i], &o, epoch, &s, COUNT, want, n_want, got, got32);
            else
                compare_pool(pool, &o, epoch, &s, COUNT, want, n_want, got, got32);
        }
    }
    pd_mix_cursor_set_planner(&o.cur, NULL, NULL); /* the last planner's context is gone */
    assert_true(core.cur.built > 0 && atomic_load(&calls) > 0);
    assert_int_equal(atomic_load(&calls), o.cur.built); /* every order o's cursor and its views built */
    pd_pool_destroy(pool);
    free(want);
    free(got);
    free(got32);
    mix_free(&core);
    mix_free(&o);
}

/* Sparse fills a block at a time (W small, blocks with more reads than components) over many small
 * components: their component epochs turn every few blocks, so a block's parts often need more runs than
 * the batch has left (a flush while they are resolved: resolved again) or cross a component epoch (the
 * block then goes read by read). */
static void block_runs_match_core(void **state)
{
    (void)state;
    uint64_t sizes[12], starts[1] = {0}, rng = 21;
    uint32_t weights[12];
    for (int j = 0; j < 12; j++) {
        sizes[j] = 60 + test_below(&rng, 300);
        weights[j] = 1 + (uint32_t)test_below(&rng, 9);
    }
    owned_mix o;
    assert_int_equal(mix_make(&o, 4, sizes, 12, 100000, 64, starts, weights, 1), PD_OK);
    for (uint32_t world = 2; world <= 4; world++) {
        const pd_slice s = {.world = world, .rank = 1, .mode = PD_MODE_EXACT, .offset = 5 * world};
        compare_all(&o, 3, &s, 30000);
    }
    mix_free(&o);
}

/* S stages of C components at random: stage k starts 1 to gaps blocks of B after the last, each weight 0 a quarter
 * of the time and else 1 to 1000, one weight per stage raised by 1 (a stage needs a positive one). */
static void random_stages(uint64_t *rng, uint64_t C, uint64_t B, uint64_t S, uint64_t gaps, uint64_t *starts,
                          uint32_t *weights)
{
    for (uint64_t k = 0, at = 0; k < S; k++) {
        starts[k] = at;
        at += B * (1 + test_below(rng, gaps));
        for (uint64_t j = 0; j < C; j++)
            weights[k * C + j] = test_below(rng, 4) ? 1 + (uint32_t)test_below(rng, 1000) : 0;
        weights[k * C + test_below(rng, C)] += 1;
    }
}

/* Sparse fills a segment at a time (pd_mix_runs_segment: C ≤ 16 flat components, reads dense enough): up to 32
 * blocks' counts at once, each read's component found among them. Stages start every few blocks (a segment ends at
 * the next stage), components are large enough that most segments stay in one component epoch and small enough
 * that some cross one (that segment goes a block at a time), and W may exceed B or not divide it (reads fall at
 * every offset of a block, some blocks have none). */
static void segment_runs_match_core(void **state)
{
    (void)state;
    uint64_t rng = 41;
    static const uint64_t blocks[] = {64, 128, 256};
    const int trials = test_quick() ? 4 : 12;
    for (int t = 0; t < trials; t++) {
        const uint64_t C = 2 + test_below(&rng, 15), B = blocks[test_below(&rng, 3)], S = 1 + test_below(&rng, 4);
        uint64_t sizes[16], starts[4];
        uint32_t weights[64];
        for (uint64_t j = 0; j < C; j++)
            sizes[j] = 2 + test_below(&rng, 200000);
        random_stages(&rng, C, B, S, 70, starts, weights);
        owned_mix o;
        assert_int_equal(mix_make(&o, test_rand(&rng), sizes, C, 0, B, starts, weights, S), PD_OK);
        const uint64_t depth = pd_bit_width(C - 1); /* ⌈log2 C⌉, C ≥ 2 */
        const uint64_t wmax = 4 * depth * B / (C - 1), world = 2 + test_below(&rng, wmax - 1); /* (C − 1)·W ≤ 4·depth·B */
        uint64_t len;
        assert_int_equal(pd_epoch_length(o.mix.length, world, PD_MODE_PAD, &len), PD_OK);
        const pd_slice s = {.world = world, .rank = (uint32_t)test_below(&rng, world), .mode = PD_MODE_PAD,
                            .offset = test_below(&rng, 1000) * world % len};
        compare_all(&o, test_below(&rng, 3), &s, 20000 + test_below(&rng, 20000));
        mix_free(&o);
    }
}

/* Dense fills (W = 1) whose ids fit u32: each block's ids laid out in slot order and read by slot (on AVX-512 with
 * B = 64, in registers: pd__layout64_avx512), over stages and component epochs, against the core. */
static void dense_fills_match_core(void **state)
{
    (void)state;
    uint64_t rng = 53;
    static const uint64_t blocks[] = {64, 64, 128, 256};
    const int trials = test_quick() ? 4 : 10;
    for (int t = 0; t < trials; t++) {
        const uint64_t C = 1 + test_below(&rng, 12), B = blocks[test_below(&rng, 4)], S = 1 + test_below(&rng, 4);
        uint64_t sizes[12], starts[4];
        uint32_t weights[48];
        for (uint64_t j = 0; j < C; j++)
            sizes[j] = 1 + test_below(&rng, test_below(&rng, 2) ? 300 : 100000); /* some turn epochs often */
        random_stages(&rng, C, B, S, 300, starts, weights);
        owned_mix o;
        assert_int_equal(mix_make(&o, test_rand(&rng), sizes, C, 0, B, starts, weights, S), PD_OK);
        uint64_t len;
        const pd_mode mode = (pd_mode)test_below(&rng, 3);
        assert_int_equal(pd_epoch_length(o.mix.length, 1, mode, &len), PD_OK);
        const pd_slice s = {.world = 1, .rank = 0, .mode = mode, .offset = test_below(&rng, len)};
        compare_all(&o, test_below(&rng, 3), &s, 1 + test_below(&rng, 40000));
        mix_free(&o);
    }
}

/* Components the batch kernel runs (2 to 2^32 samples each) whose global ids pass 2^32: the batch's ids
 * (pd__batch_ids) add offsets of 33 bits, their high halves joined to the low ones, against the core. */
static void wide_offsets_match_core(void **state)
{
    (void)state;
    const uint64_t sizes[4] = {UINT32_MAX, 7000, UINT32_MAX - 2, 5000};
    const uint32_t weights[4] = {3, 2, 3, 1}, worlds[3] = {2, 8, 64};
    four_components_match_core(12, sizes, weights, worlds, 20000);
}

/* Components of 2^62 samples (and 2^61, 2^32 + 1; then 2^31): σ's halves are 31 bits each, and the top half of n is 2^31, which
 * AVX2's signed compares once read as negative: its gather never found a lane inside and never returned. Every
 * generator against the core, dense and sparse, in mixture epoch 0 (the only one: N nears 2^63). */
static void huge_components_match_core(void **state)
{
    (void)state;
    const uint64_t sizes[4] = {UINT64_C(1) << 62, UINT64_C(1) << 61, UINT64_C(3) << 59, (UINT64_C(1) << 32) + 1};
    const uint64_t starts[1] = {0};
    const uint32_t weights[4] = {3, 1, 2, 1}, worlds[4] = {1, 2, 8, 64};
    owned_mix o;
    assert_int_equal(mix_make(&o, 21, sizes, 4, 0, 64, starts, weights, 1), PD_OK);
    for (size_t w = 0; w < 4; w++) {
        const pd_slice s = {.world = worlds[w], .rank = worlds[w] / 2, .mode = PD_MODE_EXACT, .offset = 5 * worlds[w]};
        compare_gens(&o, 0, &s, 3000, 1); /* no component the batch kernel runs: never by runs */
    }
    mix_free(&o);
    /* A component of exactly 2^31 (b = 31, no walk): AVX2's signed compare read n as negative there too, and its
     * gather (W > 1) never returned. */
    const uint64_t sizes31[2] = {1000, UINT64_C(1) << 31};
    const uint32_t weights31[2] = {1, 1};
    assert_int_equal(mix_make(&o, 22, sizes31, 2, 0, 64, starts, weights31, 1), PD_OK);
    for (size_t w = 0; w < 4; w++) {
        const pd_slice s = {.world = worlds[w], .rank = worlds[w] - 1, .mode = PD_MODE_PAD, .offset = 3 * worlds[w]};
        compare_all(&o, 0, &s, 3000);
    }
    mix_free(&o);
}

/* Weights summing to 2^32 − 1 (node weights near 2^32, where y·a nears 2^64) at run positions from 2^32 to
 * near 2^63, and from just below a multiple of the root's weight (y − q·S crosses 2^32 inside a batch of
 * blocks): the fills' counts of whole blocks at once (one division a node, on a base) against the core. */
static void heavy_weights_match_core(void **state)
{
    (void)state;
    const uint64_t sizes[3] = {70000, 50000, 30000}, starts[1] = {0};
    const uint32_t weights[3] = {UINT32_C(0xFFFFFFFC), 2, 1}; /* the root: a = 2^32 − 4 of S = 2^32 − 1 */
    static const uint32_t worlds[] = {1, 8, 64};
    owned_mix o;
    assert_int_equal(mix_make(&o, 9, sizes, 3, 0, 64, starts, weights, 1), PD_OK);
    const uint64_t last = PD_MIX_RUN_END / o.mix.length - 1;
    const uint64_t L = o.mix.length, S = UINT32_MAX, edge = (6 * S - 1024) & ~UINT64_C(63);
    const uint64_t epochs[] = {0, (UINT64_C(1) << 32) / L + 1, UINT64_C(1) << 40, last, edge / L};
    for (size_t e = 0; e < 5; e++)
        for (size_t w = 0; w < 3; w++) {
            pd_slice s = {.world = worlds[w], .rank = worlds[w] - 1, .mode = PD_MODE_EXACT, .offset = 3 * worlds[w]};
            if (e == 4) /* the first read at run position edge */
                s.offset = edge % L - s.rank;
            compare_all(&o, epochs[e], &s, 20000);
        }
    mix_free(&o);
}

/* pd__group_reads_run on every generator against the definition: exactly the indices of component j's reads, in
 * order, for counts around a vector's 8 and components up to 16; idx holds exactly n entries (ASan sees a store
 * past them). */
static void group_reads_match_definition(void **state)
{
    (void)state;
    pd_gen gens[16];
    const size_t ngens = all_gens(gens, 0);
    static const uint64_t counts[] = {0, 1, 7, 8, 9, 15, 16, 17, 64, 1000, 4096};
    static const uint32_t comps[] = {1, 2, 4, 16};
    uint64_t rng = 5;
    for (size_t a = 0; a < sizeof counts / sizeof *counts; a++)
        for (size_t b = 0; b < sizeof comps / sizeof *comps; b++) {
            const uint64_t n = counts[a];
            uint32_t *comp = malloc((n + 1) * sizeof *comp), *idx = malloc((n + 1) * sizeof *idx);
            assert_true(comp && idx);
            for (uint64_t i = 0; i < n; i++)
                comp[i] = (uint32_t)test_below(&rng, comps[b]);
            for (size_t g = 0; g < ngens; g++)
                for (uint32_t j = 0; j < comps[b]; j++) {
                    const uint64_t k = pd__group_reads_run(&gens[g], comp, n, j, idx);
                    uint64_t want = 0;
                    for (uint64_t i = 0; i < n; i++)
                        if (comp[i] == j) {
                            assert_true(want < k);
                            assert_int_equal(idx[want], i);
                            want++;
                        }
                    assert_int_equal(k, want);
                }
            free(comp);
            free(idx);
        }
}

/* pd__segment_draws_run on every generator against pd__segment_draw read by read: random tables of 1-32 blocks (the
 * columns past them garbage, which no read may take), B of 64-1024, 1-16 components, strides from 1 (8 reads a
 * block's) to past B (one read a block). */
static void segment_draws_match_scalar(void **state)
{
    (void)state;
    pd_gen gens[16];
    const size_t ngens = all_gens(gens, 0);
    enum { C = 16, COLS = PD__SEGMENT_BLOCKS };
    uint32_t start[C * COLS], slot[4096], comp[4096], want_comp[4096];
    uint64_t base[C * COLS], draw[4096], want_draw[4096];
    uint64_t rng = 17;
    for (int t = 0; t < 200; t++) {
        const uint32_t bits = 6 + (uint32_t)test_below(&rng, 5), B = 1u << bits;
        const uint32_t blocks = 1 + (uint32_t)test_below(&rng, COLS), ncomp = 1 + (uint32_t)test_below(&rng, C);
        static const uint32_t worlds[] = {1, 3, 8, 9, 64, 100, 1000};
        const uint32_t world = worlds[test_below(&rng, 7)], rel = (uint32_t)test_below(&rng, B);
        for (uint32_t i = 0; i < C * COLS; i++) {
            start[i] = 0xFFFFFFFFu;
            base[i] = test_rand(&rng);
        }
        for (uint32_t b = 0; b < blocks; b++) { /* each component's first slot: 0 for the first, non-decreasing */
            uint32_t at = 0;
            for (uint32_t c = 0; c < ncomp; c++) {
                start[COLS * c + b] = at;
                at += (uint32_t)test_below(&rng, (B - at) / 2 + 1);
            }
        }
        uint64_t count = rel < blocks * B ? (blocks * B - rel + world - 1) / world : 0;
        count = count < 4096 ? count : 4096; /* a sparse chunk's reads at most */
        for (uint64_t i = 0; i < count; i++)
            slot[i] = (uint32_t)test_below(&rng, B);
        pd__segment_draws x = {.slot = slot, .count = count, .rel = rel, .world = world, .bits = bits,
                               .blocks = blocks, .start = start, .base = base, .ncomp = ncomp,
                               .comp = want_comp, .draw = want_draw};
        for (uint64_t i = 0; i < count; i++)
            pd__segment_draw(&x, i);
        x.comp = comp;
        x.draw = draw;
        for (size_t g = 0; g < ngens; g++) {
            memset(comp, 0xA5, sizeof comp);
            pd__segment_draws_run(&gens[g], &x);
            for (uint64_t i = 0; i < count; i++)
                if (comp[i] != want_comp[i] || draw[i] != want_draw[i])
                    fail_msg("%s: read %llu (W = %u, B = %u, %u blocks, %u components): (%u, %llu), want (%u, %llu)",
                             pd_isa_name(gens[g].isa), (unsigned long long)i, world, B, blocks, ncomp, comp[i],
                             (unsigned long long)draw[i], want_comp[i], (unsigned long long)want_draw[i]);
        }
    }
}

/* The block-slot kernels (every read keyed by its block: per lane on AVX-512, bytes on VBMI) against the core's
 * π_β, for each B, strides below and above B (blocks shared by reads, or one each), counts with tails, and
 * blocks whose number carries into its high word; the VBMI build also with vbmi off. */
static void block_slots_match_core(void **state)
{
    (void)state;
    enum { MAX = 700 };
    uint32_t got[MAX + GUARD];
    uint64_t rng = 11;
    pd_gen gens[16];
    size_t ngens = 0;
    for (int isa = PD_ISA_SCALAR; isa <= PD_ISA_AVX512; isa++) {
        if (!pd_cpu_has_isa((pd_isa)isa))
            continue;
        assert_int_equal(pd_gen_init(&gens[ngens], (pd_isa)isa), PD_OK);
        if (gens[ngens].vbmi) { /* and the per-lane 32-bit kernel, with BW's word lanes and without */
            gens[ngens + 1] = gens[ngens];
            gens[++ngens].vbmi = 0;
            gens[ngens + 1] = gens[ngens];
            gens[++ngens].bw = 0;
        }
        ngens++;
    }
    static const uint64_t strides[] = {1, 3, 8, 63, 64, 100, 1000, 4096, 99999, UINT64_C(0xFFFFFFFF)};
    for (uint64_t block = 64; block <= 2048; block *= 2) {
        for (int t = 0; t < 30; t++) {
            uint64_t stride = strides[test_below(&rng, 10)], count = test_below(&rng, MAX + 1);
            uint64_t first = test_rand(&rng) >> (1 + test_below(&rng, 40));
            if (t <= 1) /* β's low word wraps among the reads; t = 1: among reads that share their blocks' keys */
                first = (UINT64_C(0xFFFFFFFF) - 5) * block;
            if (t == 1) {
                stride = block / 8;
                count = MAX;
            }
            if (first + (count + 64) * stride >= UINT64_C(1) << 63)
                first = 0;
            const uint64_t seed = test_rand(&rng);
            for (size_t i = 0; i < ngens; i++) {
                const pd__block_slots s = {.seed = seed, .block = block, .first = first, .stride = stride,
                                           .count = count, .out = got};
                for (size_t k = 0; k < MAX + GUARD; k++)
                    got[k] = 0xA5A5A5A5u;
                pd__block_slots_run(&gens[i], &s);
                for (uint64_t k = 0; k < count; k++) {
                    const uint64_t g = first + k * stride;
                    pd_perm pi;
                    pd__mix_block_keys(seed, block, g / block, &pi);
                    if (got[k] != pd_perm_at(&pi, g % block))
                        fail_msg("%s%s B %llu stride %llu first %llu: read %llu is %u, want %llu",
                                 pd_isa_name(gens[i].isa), gens[i].vbmi ? "+vbmi" : gens[i].bw ? "+bw" : "", (unsigned long long)block,
                                 (unsigned long long)stride, (unsigned long long)first, (unsigned long long)k, got[k],
                                 (unsigned long long)pd_perm_at(&pi, g % block));
                }
                for (uint64_t k = count; k < count + GUARD; k++)
                    assert_true(got[k] == 0xA5A5A5A5u);
            }
        }
    }
}

/* The block-group kernels (every slot of 8 blocks, interleaved) equal the core's π_β: the scalar reference,
 * and the SIMD ones (VBMI's where the CPU has it, and AVX2's) against it, for each B they take, blocks whose
 * number carries into its high word included. */
static void block_groups_match_core(void **state)
{
    (void)state;
    uint8_t ref[PD__BLOCK_GROUP * PD__BLOCK_GROUP_MAX_B], simd[sizeof ref];
    uint64_t rng = 5;
    for (uint64_t block = 64; block <= PD__BLOCK_GROUP_MAX_B; block *= 2) {
        for (int t = 0; t < 40; t++) {
            const uint64_t first = t == 0   ? UINT64_C(0xFFFFFFFD)                    /* β lo wraps inside the group */
                                 : t == 1 ? (UINT64_C(1) << 63) / block - PD__BLOCK_GROUP /* the last blocks */
                                          : test_rand(&rng) >> (1 + test_below(&rng, 60));
            const pd__block_group grp = {.seed = test_rand(&rng), .block = block, .first = first, .out = ref};
            pd__block_group_scalar(&grp);
            for (uint32_t l = 0; l < PD__BLOCK_GROUP; l++) {
                pd_perm pi;
                pd__mix_block_keys(grp.seed, block, first + l, &pi);
                for (uint32_t r = 0; r < block; r++)
                    assert_int_equal(ref[pd__block_group_at(l, r)], pd_perm_at(&pi, r));
            }
            for (int isa = PD_ISA_AVX2; isa <= PD_ISA_AVX512; isa++) {
                if (!pd_cpu_has_isa((pd_isa)isa))
                    continue;
                pd_gen gen;
                assert_int_equal(pd_gen_init(&gen, (pd_isa)isa), PD_OK);
                for (int vbmi = gen.vbmi; vbmi >= 0; vbmi--) { /* VBMI's kernel, then AVX2's */
                    gen.vbmi = vbmi;
                    pd__block_group g2 = grp;
                    g2.out = simd;
                    memset(simd, 0xFF, sizeof simd);
                    pd__block_group_run(&gen, &g2);
                    assert_memory_equal(simd, ref, PD__BLOCK_GROUP * block);
                }
            }
        }
    }
}

/* The comparison can fail: another seed's ids differ from these somewhere. */
static void comparison_can_fail(void **state)
{
    (void)state;
    const uint64_t sizes[2] = {1000, 3000}, starts[1] = {0};
    const uint32_t weights[2] = {1, 2};
    owned_mix a, b;
    assert_int_equal(mix_make(&a, 1, sizes, 2, 0, 64, starts, weights, 1), PD_OK);
    assert_int_equal(mix_make(&b, 2, sizes, 2, 0, 64, starts, weights, 1), PD_OK);
    pd_gen g;
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), PD_OK);
    uint64_t x[4000], y[4000], n1, n2, same = 0;
    pd_slice s = {.world = 1, .mode = PD_MODE_EXACT};
    assert_int_equal(pd_gen_mix_fill_u64(&g, &a.cur, 0, &s, 4000, x, &n1), PD_OK);
    assert_int_equal(pd_gen_mix_fill_u64(&g, &b.cur, 0, &s, 4000, y, &n2), PD_OK);
    for (uint64_t i = 0; i < n1; i++)
        same += x[i] == y[i];
    assert_true(n1 == 4000 && n2 == 4000 && same < 100);
    mix_free(&a);
    mix_free(&b);
}

/* Bad input gets the core's codes, checked in the core's order. */
static void bad_arguments_match_core(void **state)
{
    (void)state;
    const uint64_t sizes[2] = {10, 20}, wide[2] = {UINT64_C(1) << 33, 1}, starts[1] = {0};
    const uint32_t weights[2] = {1, 1};
    owned_mix o, w;
    assert_int_equal(mix_make(&o, 3, sizes, 2, 0, 64, starts, weights, 1), PD_OK);
    assert_int_equal(mix_make(&w, 3, wide, 2, 100, 64, starts, weights, 1), PD_OK);
    pd_gen g;
    assert_int_equal(pd_gen_init(&g, PD_ISA_AUTO), PD_OK);
    uint64_t out[64], got;
    uint32_t out32[64];
    pd_pool *pool;
    assert_int_equal(pd_pool_create(3, &g, &pool), PD_OK);
    const pd_slice ok = {.world = 2, .rank = 1, .mode = PD_MODE_PAD};
    const pd_slice bad_rank = {.world = 2, .rank = 2}, bad_offset = {.world = 2, .offset = 31},
                   bad_world = {.world = 0};
    struct {
        owned_mix *o;
        uint64_t epoch;
        const pd_slice *s;
        int null_out, null_written;
    } cases[] = {
        {&o, 0, &ok, 0, 0},      {&o, 0, &bad_rank, 0, 0},   {&o, 0, &bad_offset, 0, 0}, {&o, 0, &bad_world, 0, 0},
        {&o, 0, NULL, 0, 0},     {&o, 0, &ok, 1, 0},         {&o, 0, &ok, 0, 1},         {&o, UINT64_MAX, &ok, 0, 0},
        {&w, 0, &ok, 0, 0},      {&w, 0, &ok, 0, 1},         {&w, UINT64_MAX, &bad_rank, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pd_mix_cursor *c = &cases[i].o->cur;
        uint64_t *o64 = cases[i].null_out ? NULL : out, *wr = cases[i].null_written ? NULL : &got;
        uint32_t *o32 = cases[i].null_out ? NULL : out32;
        assert_int_equal(pd_gen_mix_fill_u64(&g, c, cases[i].epoch, cases[i].s, 5, o64, wr),
                         pd_mix_slice_fill_u64(c, cases[i].epoch, cases[i].s, 5, o64, wr));
        assert_int_equal(pd_gen_mix_fill_u32(&g, c, cases[i].epoch, cases[i].s, 5, o32, wr),
                         pd_mix_slice_fill_u32(c, cases[i].epoch, cases[i].s, 5, o32, wr));
        assert_int_equal(pd_pool_mix_fill_u64(pool, c, cases[i].epoch, cases[i].s, 5, o64, wr),
                         pd_mix_slice_fill_u64(c, cases[i].epoch, cases[i].s, 5, o64, wr));
        assert_int_equal(pd_pool_mix_fill_u32(pool, c, cases[i].epoch, cases[i].s, 5, o32, wr),
                         pd_mix_slice_fill_u32(c, cases[i].epoch, cases[i].s, 5, o32, wr));
    }
    assert_int_equal(pd_pool_mix_fill_u64(NULL, &o.cur, 0, &ok, 5, out, &got), PD_EINVAL);
    assert_int_equal(pd_pool_mix_fill_u64(pool, NULL, 0, &ok, 5, out, &got), PD_EINVAL);
    pd_pool_destroy(pool);
    assert_int_equal(pd_gen_mix_fill_u64(&g, NULL, 0, &ok, 5, out, &got), PD_EINVAL);
    const pd_gen junk = {.isa = (pd_isa)99, .walk = PD_WALK_AUTO};
    assert_int_equal(pd_gen_mix_fill_u64(&junk, &o.cur, 0, &ok, 5, out, &got), PD_EINVAL);
    assert_int_equal(pd_gen_mix_fill_u64(NULL, &o.cur, 0, &ok, 5, out, &got), PD_EINVAL);
    mix_free(&o);
    mix_free(&w);
}

/* cpu/divide.h against the division instruction: edge divisors and dividends over all of u64. */
static void divide_by_invariants(void **state)
{
    (void)state;
    uint64_t rng = 5, divisors[64] = {1, 2, 3, 5, 7, 10, 64, 1000, UINT32_MAX, (UINT64_C(1) << 32) + 1,
                                      UINT64_C(1) << 63, (UINT64_C(1) << 63) + 1, UINT64_MAX - 1, UINT64_MAX};
    for (int i = 14; i < 64; i++)
        divisors[i] = test_rand(&rng) >> test_below(&rng, 64);
    for (int i = 0; i < 64; i++) {
        pd_divisor v;
        const uint64_t d = divisors[i] ? divisors[i] : 1;
        pd_divisor_init(&v, d);
        const uint64_t edges[6] = {0, 1, d - 1, d, UINT64_MAX - 1, UINT64_MAX};
        for (int k = 0; k < 6; k++)
            assert_true(pd_divide(&v, edges[k]) == edges[k] / d);
        for (int k = 0; k < 20000; k++) {
            const uint64_t y = test_rand(&rng) >> test_below(&rng, 64);
            if (pd_divide(&v, y) != y / d)
                fail_msg("%llu / %llu: %llu", (unsigned long long)y, (unsigned long long)d,
                         (unsigned long long)pd_divide(&v, y));
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(divide_by_invariants),
        cmocka_unit_test(comparison_can_fail),
        cmocka_unit_test(bad_arguments_match_core),
        cmocka_unit_test(matches_core),
        cmocka_unit_test(long_sparse_fills_match_core),
        cmocka_unit_test(heavy_weights_match_core),
        cmocka_unit_test(wide_offsets_match_core),
        cmocka_unit_test(huge_components_match_core),
        cmocka_unit_test(block_runs_match_core),
        cmocka_unit_test(segment_runs_match_core),
        cmocka_unit_test(dense_fills_match_core),
        cmocka_unit_test(sharded_sparse_fills_match_core),
        cmocka_unit_test(planned_orders_match_core),
        cmocka_unit_test(block_slots_match_core),
        cmocka_unit_test(block_groups_match_core),
        cmocka_unit_test(group_reads_match_definition),
        cmocka_unit_test(segment_draws_match_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
