/* Tests for core/mixture.c: the addendum's known answers, exactly once per component epoch (across mixture
 * epochs and stage changes), the proportion bound at every prefix (and a naive scheme that breaks it), the
 * inverse, resume under another world size over a stage boundary, modes, digests and bad input. */
#include "test_util.h"

#include <string.h>

#include "core/digest.h"
#include "core/error.h"
#include "mix_util.h"
#include "vectors_mixtures_v1.h"

/* ---- Known answers (tests/data/vectors-mixtures-v1.json, from tests/reference/mixv1.py) */

static void vec_make(owned_mix *o, const struct vec_mix_case *v)
{
    uint64_t sizes[64], nshards[64], windows[64], lanes[64];
    const uint64_t *shards[64];
    assert_true(v->ncomp <= 64);
    for (size_t j = 0; j < v->ncomp; j++) {
        sizes[j] = v->comps[j].size;
        shards[j] = v->comps[j].nshards ? v->comps[j].shards : NULL;
        nshards[j] = v->comps[j].nshards;
        windows[j] = v->comps[j].window;
        lanes[j] = v->comps[j].lanes;
    }
    assert_int_equal(mix_make_ex(o, v->seed, sizes, shards, nshards, windows, lanes, v->ncomp, v->length, v->block,
                                 v->starts, v->weights, v->nstages),
                     PD_OK);
}

static void known_answers(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof vec_mixtures / sizeof vec_mixtures[0]; i++) {
        const struct vec_mix_case *v = &vec_mixtures[i];
        owned_mix o;
        vec_make(&o, v);
        assert_true(o.mix.length == v->length);
        for (size_t j = 0; j < v->ncomp; j++)
            assert_true(o.mix.comp_seed[j] == v->seeds[j] && pd_mix_component_seed(v->seed, j) == v->seeds[j]);
        for (size_t n = 0; n < v->nloc; n++) {
            pd_mix_loc loc;
            assert_int_equal(pd_mix_locate(&o.cur, v->loc_epoch[n], v->loc_position[n], &loc), PD_OK);
            if (loc.sample != v->loc_id[n] || loc.component != v->loc_component[n] || loc.local != v->loc_local[n] ||
                loc.epoch != v->loc_cepoch[n])
                fail_msg("case %zu epoch %llu position %llu: (%llu, %llu, %llu, %llu), want (%llu, %llu, %llu, %llu)",
                         i, (unsigned long long)v->loc_epoch[n], (unsigned long long)v->loc_position[n],
                         (unsigned long long)loc.component, (unsigned long long)loc.local,
                         (unsigned long long)loc.epoch, (unsigned long long)loc.sample,
                         (unsigned long long)v->loc_component[n], (unsigned long long)v->loc_local[n],
                         (unsigned long long)v->loc_cepoch[n], (unsigned long long)v->loc_id[n]);
        }
        uint64_t drawn[64];
        for (size_t n = 0; n < v->ncounts; n++) {
            assert_int_equal(pd_mix_draws_before(&o.mix, v->count_at[n], drawn), PD_OK);
            for (size_t j = 0; j < v->ncomp; j++)
                assert_true(drawn[j] == v->counts[n * v->ncomp + j]);
        }
        for (size_t r = 0; r < v->nranks; r++) {
            const struct vec_mix_rank *vr = &v->ranks[r];
            pd_slice s = {.world = vr->world, .offset = vr->offset};
            assert_int_equal(pd_mode_parse(vr->mode, &s.mode), PD_OK);
            const uint64_t *want = vr->ids;
            for (uint32_t k = 0; k < vr->world; k++) {
                uint64_t got[128], count;
                s.rank = k;
                assert_true(vr->lens[k] <= 128);
                assert_int_equal(pd_mix_slice_fill_u64(&o.cur, vr->epoch, &s, vr->lens[k], got, &count), PD_OK);
                assert_int_equal(count, vr->lens[k]);
                for (size_t n = 0; n < count; n++)
                    assert_true(got[n] == want[n]);
                want += vr->lens[k];
            }
        }
        for (size_t n = 0; n < v->ninv; n++) {
            uint64_t e, p;
            int rc = pd_mix_position(&o.cur, v->inv_component[n], v->inv_local[n], v->inv_cepoch[n], &e, &p);
            if (v->inv_position[n] == VEC_MIX_NONE) {
                assert_int_equal(rc, PD_ENOTFOUND);
                continue;
            }
            assert_int_equal(rc, PD_OK);
            assert_true(e == v->inv_position[n] / v->length && p == v->inv_position[n] % v->length);
        }
        mix_free(&o);
    }
}

/* ---- Random mixtures */

typedef struct random_mix {
    uint64_t C, S, block, sizes[24], starts[6];
    uint32_t weights[6 * 24];
} random_mix;

/* C components of 1..max_size samples, S stages with random (sometimes zero) weights at block multiples. */
static void random_mix_draw(uint64_t *rng, random_mix *r, uint64_t max_size)
{
    static const uint64_t blocks[] = {64, 128, 256, 2048};
    r->C = 1 + test_below(rng, 24);
    r->S = 1 + test_below(rng, 6);
    r->block = blocks[test_below(rng, 4)];
    for (uint64_t j = 0; j < r->C; j++)
        r->sizes[j] = 1 + test_below(rng, max_size);
    uint64_t at = 0;
    for (uint64_t k = 0; k < r->S; k++) {
        r->starts[k] = at;
        at += r->block * (1 + test_below(rng, 12));
        uint64_t sum = 0;
        for (uint64_t j = 0; j < r->C; j++) {
            uint64_t kind = test_below(rng, 4);
            r->weights[k * r->C + j] = kind == 0 ? 0 : kind == 1 ? 1 + (uint32_t)test_below(rng, 3)
                                                                  : (uint32_t)test_below(rng, 1000000);
            sum += r->weights[k * r->C + j];
        }
        if (sum == 0)
            r->weights[k * r->C + test_below(rng, r->C)] = 1;
    }
}

static void exactly_once_and_inverse(void **state)
{
    (void)state;
    uint64_t rng = 42;
    const int trials = test_quick() ? 10 : 120;
    for (int t = 0; t < trials; t++) {
        random_mix r;
        random_mix_draw(&rng, &r, 50);
        owned_mix o;
        assert_int_equal(mix_make(&o, test_rand(&rng), r.sizes, r.C, 0, r.block, r.starts, r.weights, r.S), PD_OK);
        /* whole blocks past the last stage start: every component's draws are 0 … count − 1, once each */
        const uint64_t end = r.starts[r.S - 1] + r.block * (1 + test_below(&rng, 8));
        uint64_t *seen = calloc(end * r.C, 1), count[24] = {0}, drawn[24];
        for (uint64_t g = 0; g < end; g++) {
            pd_mix_draw d;
            uint64_t back;
            if (g % 37 == 0 || g % r.block == 0) { /* counts of every prefix, sampled */
                assert_int_equal(pd_mix_draws_before(&o.mix, g, drawn), PD_OK);
                assert_memory_equal(drawn, count, r.C * sizeof *count);
            }
            assert_int_equal(pd_mix_draw_at(&o.mix, g, &d), PD_OK);
            assert_true(d.component < r.C && d.draw < end);
            assert_int_equal(((char *)seen)[d.draw * r.C + d.component]++, 0);
            count[d.component]++;
            assert_int_equal(pd_mix_draw_position(&o.mix, d.component, d.draw, &back), PD_OK);
            assert_true(back == g);
            if (g % 11 == 0) { /* the sample level round trip */
                pd_mix_loc loc;
                uint64_t e, p;
                assert_int_equal(pd_mix_sample(&o.cur, &d, &loc), PD_OK);
                assert_true(loc.local < r.sizes[loc.component]);
                assert_int_equal(pd_mix_position(&o.cur, loc.component, loc.local, loc.epoch, &e, &p), PD_OK);
                assert_true(e * o.mix.length + p == g);
            }
        }
        for (uint64_t j = 0; j < r.C; j++)
            for (uint64_t d = 0; d < count[j]; d++)
                assert_int_equal(((char *)seen)[d * r.C + j], 1);
        /* a component with weight 0 in the last stage is never drawn past its last draw */
        for (uint64_t j = 0; j < r.C; j++) {
            uint64_t g;
            if (r.weights[(r.S - 1) * r.C + j] == 0)
                assert_int_equal(pd_mix_draw_position(&o.mix, j, o.mix.drawn[(r.S - 1) * r.C + j], &g), PD_ENOTFOUND);
        }
        free(seen);
        mix_free(&o);
    }
}

/* |A − t·w/W| ≤ h/2 + B·(w/W)(1 − w/W), times 2W², in exact integers. */
static int within_bound(uint64_t A, uint64_t t, uint64_t w, uint64_t W, uint64_t h, uint64_t B)
{
    __int128 dev = (__int128)A * W - (__int128)t * w; /* (A − t·w/W)·W */
    if (dev < 0)
        dev = -dev;
    return 2 * (__int128)W * dev <= (__int128)h * W * W + 2 * (__int128)B * w * (W - w);
}

/* Internal nodes on the path to leaf j. */
static uint64_t leaf_depth(uint64_t C, uint64_t j)
{
    uint64_t lo = 0, hi = C, h = 0;
    for (; hi - lo > 1; h++) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (j < mid)
            hi = mid;
        else
            lo = mid;
    }
    return h;
}

static void proportion_bound(void **state)
{
    (void)state;
    uint64_t rng = 7;
    const int trials = test_quick() ? 4 : 40;
    for (int t = 0; t < trials; t++) {
        random_mix r;
        random_mix_draw(&rng, &r, 1000);
        for (uint64_t k = 1; k < r.S; k++) /* long stages: the bound must hold however far */
            r.starts[k] = r.starts[k - 1] + r.block * (1 + test_below(&rng, 40));
        owned_mix o;
        assert_int_equal(mix_make(&o, test_rand(&rng), r.sizes, r.C, 0, r.block, r.starts, r.weights, r.S), PD_OK);
        const uint64_t end = r.starts[r.S - 1] + 20000 + test_below(&rng, 3000);
        uint64_t count[24] = {0};
        for (uint64_t g = 0, k = 0; g < end; g++) {
            if (k + 1 < r.S && g == r.starts[k + 1]) { /* a new stage: its prefixes count from here */
                k++;
                memset(count, 0, sizeof count);
            }
            pd_mix_draw d;
            assert_int_equal(pd_mix_draw_at(&o.mix, g, &d), PD_OK);
            count[d.component]++;
            const uint32_t *w = r.weights + k * r.C;
            uint64_t W = 0;
            for (uint64_t j = 0; j < r.C; j++)
                W += w[j];
            for (uint64_t j = 0; j < r.C; j++)
                if (!within_bound(count[j], g + 1 - r.starts[k], w[j], W, leaf_depth(r.C, j), r.block))
                    fail_msg("trial %d stage %llu: component %llu has %llu of %llu positions (weight %u of %llu)", t,
                             (unsigned long long)k, (unsigned long long)j, (unsigned long long)count[j],
                             (unsigned long long)(g + 1 - r.starts[k]), w[j], (unsigned long long)W);
        }
        mix_free(&o);
    }
}

/* Negative control: drawing each position's component at random by weight (what a weighted sampler does)
 * leaves the bound within a few thousand positions. */
static void naive_scheme_breaks_bound(void **state)
{
    (void)state;
    const uint32_t w[3] = {1, 2, 1};
    const uint64_t W = 4, B = 64;
    uint64_t rng = 3, count[3] = {0}, broken_at = 0;
    for (uint64_t t = 1; t <= 200000 && !broken_at; t++) {
        uint64_t x = test_below(&rng, W), j = 0;
        while (x >= w[j])
            x -= w[j++];
        count[j]++;
        for (uint64_t i = 0; i < 3; i++)
            if (!within_bound(count[i], t, w[i], W, leaf_depth(3, i), B))
                broken_at = t;
    }
    assert_true(broken_at > 0);
}

/* Every sample of a component once per component epoch: across many mixture epochs (L not a multiple of
 * anything) and a stage that changes the weights mid-epoch. */
static void component_epochs_exactly_once(void **state)
{
    (void)state;
    const uint64_t sizes[4] = {13, 1, 200, 64};
    const uint64_t starts[3] = {0, 64 * 9, 64 * 30};
    const uint32_t weights[12] = {5, 1, 30, 10, 1, 0, 1, 40, 20, 1, 20, 20};
    owned_mix o;
    assert_int_equal(mix_make(&o, 11, sizes, 4, 111, 64, starts, weights, 3), PD_OK);
    const uint64_t epochs = 64; /* 64·111 positions: whole blocks, so the draws made are a prefix of each */
    uint64_t *hits = calloc(4 * 1000 * 200, sizeof *hits); /* [component][component epoch][local] */
    uint64_t drawn[4];
    for (uint64_t e = 0; e < epochs; e++) {
        for (uint64_t p = 0; p < o.mix.length; p++) {
            pd_mix_loc loc;
            assert_int_equal(pd_mix_locate(&o.cur, e, p, &loc), PD_OK);
            assert_true(loc.sample == o.mix.offset[loc.component] + loc.local);
            assert_true(loc.epoch < 1000);
            hits[(loc.component * 1000 + loc.epoch) * 200 + loc.local]++;
        }
    }
    assert_int_equal(pd_mix_draws_before(&o.mix, epochs * o.mix.length, drawn), PD_OK);
    for (uint64_t j = 0; j < 4; j++) {
        const uint64_t full = drawn[j] / sizes[j];
        assert_true(full >= 2); /* the test spans several component epochs of each */
        for (uint64_t e = 0; e <= full && e < 1000; e++) {
            uint64_t in_epoch = 0;
            for (uint64_t u = 0; u < sizes[j]; u++) {
                const uint64_t h = hits[(j * 1000 + e) * 200 + u];
                assert_true(h <= 1); /* never twice */
                in_epoch += h;
            }
            assert_true(in_epoch == (e < full ? sizes[j] : drawn[j] % sizes[j])); /* complete, or the tail */
        }
    }
    free(hits);
    mix_free(&o);
}

/* Adding a stage changes nothing before it, and the run goes on: a job of 4 ranks checkpoints inside mixture
 * epoch 2, re-weights at the next block boundary and resumes on 3 ranks: every position is read once, and
 * each id is the one the new plan has at its position. */
static void elastic_resume_over_stage(void **state)
{
    (void)state;
    const uint64_t sizes[3] = {500, 70, 1234};
    const uint64_t starts[2] = {0, 0};
    const uint32_t before[3] = {1, 1, 2}, after[6] = {1, 1, 2, 0, 5, 1};
    owned_mix a, b;
    assert_int_equal(mix_make(&a, 5, sizes, 3, 0, 64, starts, before, 1), PD_OK);
    const uint64_t L = a.mix.length, epoch = 2, steps = 111;
    /* 4 ranks, exact mode, 111 lockstep steps of 1: offset 444 */
    uint64_t offset = 4 * steps, *ids = malloc(L * sizeof *ids), got;
    uint64_t *read_at = malloc(L * sizeof *read_at);
    for (uint64_t p = 0; p < L; p++)
        read_at[p] = UINT64_MAX;
    for (uint32_t r = 0; r < 4; r++) {
        pd_slice s = {.world = 4, .rank = r, .mode = PD_MODE_EXACT};
        assert_int_equal(pd_mix_slice_fill_u64(&a.cur, epoch, &s, steps, ids, &got), PD_OK);
        assert_int_equal(got, steps);
        for (uint64_t k = 0; k < got; k++)
            read_at[r + 4 * k] = ids[k];
    }
    /* the new stage: at the checkpoint's run position, rounded up to a block */
    const uint64_t g = epoch * L + offset, stage = (g + 63) / 64 * 64;
    const uint64_t starts2[2] = {0, stage};
    assert_int_equal(mix_make(&b, 5, sizes, 3, 0, 64, starts2, after, 2), PD_OK);
    for (uint64_t p = 0; p < L; p++) { /* before the stage both plans agree; after it the weights differ */
        pd_mix_loc la, lb;
        assert_int_equal(pd_mix_locate(&a.cur, epoch, p, &la), PD_OK);
        assert_int_equal(pd_mix_locate(&b.cur, epoch, p, &lb), PD_OK);
        if (epoch * L + p < stage)
            assert_true(la.sample == lb.sample);
        if (p < offset)
            assert_true(read_at[p] == la.sample);
    }
    for (uint32_t r = 0; r < 3; r++) {
        pd_slice s = {.world = 3, .rank = r, .mode = PD_MODE_EXACT, .offset = offset};
        assert_int_equal(pd_mix_slice_fill_u64(&b.cur, epoch, &s, L, ids, &got), PD_OK);
        for (uint64_t k = 0; k < got; k++) {
            const uint64_t p = offset + r + 3 * k;
            assert_true(read_at[p] == UINT64_MAX); /* nothing read twice */
            read_at[p] = ids[k];
        }
    }
    uint64_t switched_off = 0;
    for (uint64_t p = 0; p < L; p++) {
        pd_mix_loc lb;
        assert_true(read_at[p] != UINT64_MAX); /* nothing skipped */
        assert_int_equal(pd_mix_locate(&b.cur, epoch, p, &lb), PD_OK);
        assert_true(read_at[p] == lb.sample);
        switched_off += epoch * L + p >= stage && lb.component == 0;
    }
    assert_int_equal(switched_off, 0); /* the new weights apply: component 0 is off */
    /* and every component's draws go on without a gap or a repeat across the change */
    uint64_t drawn_a[3], drawn_b[3];
    assert_int_equal(pd_mix_draws_before(&a.mix, stage, drawn_a), PD_OK);
    assert_int_equal(pd_mix_draws_before(&b.mix, stage, drawn_b), PD_OK);
    assert_memory_equal(drawn_a, drawn_b, sizeof drawn_a);
    assert_true(memcmp(b.mix.drawn + 3, drawn_b, sizeof drawn_b) == 0); /* P_1 = the draws before s_1 */
    free(ids);
    free(read_at);
    mix_free(&a);
    mix_free(&b);
}

/* Ranks and modes as v1 §5 over the mixture epoch; u32 and location fills agree; digests match. */
static void ranks_modes_and_digests(void **state)
{
    (void)state;
    const uint64_t sizes[3] = {40, 3, 17};
    const uint64_t starts[2] = {0, 128};
    const uint32_t weights[6] = {2, 1, 1, 1, 1, 5};
    owned_mix o;
    assert_int_equal(mix_make(&o, 21, sizes, 3, 97, 64, starts, weights, 2), PD_OK);
    const uint64_t L = o.mix.length;
    uint64_t ids[256], want[200];
    uint32_t ids32[256];
    pd_mix_loc locs[256];
    for (uint64_t epoch = 0; epoch < 4; epoch++) {
        for (uint64_t p = 0; p < L; p++) {
            pd_mix_loc loc;
            assert_int_equal(pd_mix_locate(&o.cur, epoch, p, &loc), PD_OK);
            want[p] = loc.sample;
        }
        for (uint32_t world = 1; world <= 9; world += 4) {
            for (int m = PD_MODE_PAD; m <= PD_MODE_EXACT; m++) {
                uint64_t len, total = 0;
                assert_int_equal(pd_epoch_length(L, world, (pd_mode)m, &len), PD_OK);
                for (uint32_t r = 0; r < world; r++) {
                    pd_slice s = {.world = world, .rank = r, .mode = (pd_mode)m, .offset = 3};
                    uint64_t got, got32, gotl;
                    pd_digest d, dd;
                    assert_int_equal(pd_mix_slice_fill_u64(&o.cur, epoch, &s, 256, ids, &got), PD_OK);
                    assert_int_equal(pd_mix_slice_fill_u32(&o.cur, epoch, &s, 256, ids32, &got32), PD_OK);
                    assert_int_equal(pd_mix_slice_fill_locs(&o.cur, epoch, &s, 256, locs, &gotl), PD_OK);
                    assert_true(got == got32 && got == gotl);
                    pd_digest_init(&dd);
                    for (uint64_t k = 0; k < got; k++) {
                        const uint64_t p = 3 + r + k * world;
                        assert_true(p < len);
                        assert_true(ids[k] == want[p % L] && ids32[k] == ids[k] && locs[k].sample == ids[k]);
                        pd_digest_add(&dd, ids[k]);
                    }
                    assert_int_equal(pd_digest_mix_slice(&o.cur, epoch, &s, &d), PD_OK);
                    assert_true(pd_digest_equal(&d, &dd));
                    total += got;
                }
                assert_int_equal(total, len - 3);
            }
        }
    }
    mix_free(&o);
}

/* Three components, sharded (7 shards, some empty, K = 2), flat, sharded (40 shards, K = 3, G = 2), weights 3:1:2;
 * sizes: 18, 25, 44. */
static const uint64_t sharded3_sizes[3] = {18, 25, 44};

static void make_sharded3(owned_mix *o)
{
    static const uint64_t shards0[7] = {3, 0, 5, 1, 0, 7, 2}, shards2[40] = {[0] = 9, [3] = 1, [17] = 30, [39] = 4};
    const uint64_t *shards[3] = {shards0, NULL, shards2};
    const uint64_t nshards[3] = {7, 0, 40}, windows[3] = {2, 0, 3}, lanes[3] = {1, 0, 2}, starts[1] = {0};
    const uint32_t weights[3] = {3, 1, 2};
    assert_int_equal(mix_make_ex(o, 8, sharded3_sizes, shards, nshards, windows, lanes, 3, 0, 64, starts, weights, 1),
                     PD_OK);
}

/* Sharded components: each component epoch holds every sample once, and the inverse undoes the forward map. */
static void sharded_components(void **state)
{
    (void)state;
    const uint64_t *sizes = sharded3_sizes;
    owned_mix o;
    make_sharded3(&o);
    uint64_t hits[3][32][44] = {{{0}}}, drawn[3];
    const uint64_t epochs = 6;
    for (uint64_t e = 0; e < epochs; e++)
        for (uint64_t p = 0; p < o.mix.length; p++) {
            pd_mix_loc loc;
            uint64_t be, bp;
            assert_int_equal(pd_mix_locate(&o.cur, e, p, &loc), PD_OK);
            assert_true(loc.epoch < 32 && loc.local < sizes[loc.component]);
            hits[loc.component][loc.epoch][loc.local]++;
            assert_int_equal(pd_mix_position(&o.cur, loc.component, loc.local, loc.epoch, &be, &bp), PD_OK);
            assert_true(be == e && bp == p);
        }
    assert_int_equal(pd_mix_draws_before(&o.mix, epochs * o.mix.length, drawn), PD_OK);
    for (uint64_t j = 0; j < 3; j++)
        for (uint64_t e = 0; e < drawn[j] / sizes[j]; e++)
            for (uint64_t u = 0; u < sizes[j]; u++)
                assert_int_equal(hits[j][e][u], 1);
    mix_free(&o);
}

/* A view (pd_mix_cursor_share) reads the orders its source holds, tables and all, without building them;
 * what it builds goes to its own memory and leaves the source's orders as they were. */
static void cursor_views_share_orders(void **state)
{
    (void)state;
    const uint64_t shards0[7] = {3, 0, 5, 1, 0, 7, 2};
    const uint64_t *shards[2] = {shards0, NULL};
    const uint64_t sizes[2] = {18, 25}, nshards[2] = {7, 0}, windows[2] = {2, 0}, lanes[2] = {1, 0};
    const uint64_t starts[1] = {0};
    const uint32_t weights[2] = {1, 1};
    owned_mix o, other;
    assert_int_equal(mix_make_ex(&o, 8, sizes, shards, nshards, windows, lanes, 2, 0, 64, starts, weights, 1), PD_OK);
    assert_int_equal(mix_make(&other, 8, sizes, 2, 0, 64, starts, weights, 1), PD_OK);
    const pd_mix_order *held = pd_mix_order_get(&o.cur, 0, 4);
    uint64_t before[18];
    for (uint64_t u = 0; u < 18; u++) {
        pd_shard_loc loc;
        assert_int_equal(pd_shard_locate(&held->plan, u, &loc), PD_OK);
        before[u] = loc.sample;
    }
    const size_t bytes = pd_mix_cursor_bytes(&o.mix);
    void *mem = malloc(bytes);
    pd_mix_cursor view;
    assert_int_equal(pd_mix_cursor_init(&view, &o.mix, mem, bytes), PD_OK);
    assert_int_equal(pd_mix_cursor_share(&view, &other.cur), PD_EINVAL); /* another plan's cursor */
    assert_int_equal(pd_mix_cursor_share(NULL, &o.cur), PD_EINVAL);
    assert_int_equal(pd_mix_cursor_share(&view, &o.cur), PD_OK);
    const pd_mix_order *seen = pd_mix_order_get(&view, 0, 4);
    assert_int_equal(view.built, 0); /* held by the source: shared, not built */
    assert_ptr_equal(seen->plan.slot_shard, held->plan.slot_shard);
    const pd_mix_order *next = pd_mix_order_get(&view, 0, 6); /* the same slot (parity), another epoch */
    assert_int_equal(view.built, 1);
    assert_true(next->plan.slot_shard != held->plan.slot_shard);
    for (uint64_t u = 0; u < 18; u++) { /* the source's order of epoch 4 is untouched */
        pd_shard_loc loc;
        assert_int_equal(pd_shard_locate(&o.cur.orders[0].plan, u, &loc), PD_OK);
        assert_int_equal(o.cur.orders[0].epoch, 4);
        assert_int_equal(loc.sample, before[u]);
    }
    free(mem);
    mix_free(&o);
    mix_free(&other);
}

/* A planner for cursor_planner: counts its calls, then builds as the core does, with the seed moved by shift (a
 * planner whose plans differ: the control), or fails (fail: the core builds instead). */
typedef struct test_planner {
    uint64_t *calls;
    uint64_t shift;
    int fail;
} test_planner;

static int test_plan(const void *ctx, pd_shard_plan *plan, const uint64_t *start, uint64_t shards, uint64_t seed,
                     uint64_t epoch, uint64_t window, uint64_t lanes, void *mem, size_t mem_bytes)
{
    const test_planner *t = ctx;
    ++*t->calls;
    if (t->fail) {
        memset(plan, 0xA5, sizeof *plan); /* what it leaves must not be read */
        return PD_ENOMEM;
    }
    return pd_shard_plan_init(plan, start, shards, seed + t->shift, epoch, window, lanes, mem, mem_bytes);
}

/* A cursor's sharded orders come from its planner (pd_mix_cursor_set_planner), called once per order it builds
 * and passed its context; a view takes its source's planner; an order the planner fails to build is the core's.
 * Control: a planner building other plans changes the samples, so the comparison sees which one built them. */
static void cursor_planner(void **state)
{
    (void)state;
    owned_mix core, o;
    make_sharded3(&core);
    for (int kind = 0; kind < 3; kind++) { /* 0: the core's plans, 1: a failing planner, 2: the control */
        make_sharded3(&o);
        uint64_t calls = 0, differ = 0;
        const test_planner t = {.calls = &calls, .shift = kind == 2, .fail = kind == 1};
        pd_mix_cursor_set_planner(&o.cur, test_plan, &t);
        for (uint64_t e = 0; e < 4; e++)
            for (uint64_t p = 0; p < o.mix.length; p++) {
                pd_mix_loc want, got;
                assert_int_equal(pd_mix_locate(&core.cur, e, p, &want), PD_OK);
                assert_int_equal(pd_mix_locate(&o.cur, e, p, &got), PD_OK);
                differ += got.sample != want.sample;
                assert_true(got.component == want.component && got.epoch == want.epoch);
            }
        assert_true(o.cur.built > 0);
        assert_int_equal(calls, o.cur.built);
        if (kind == 2)
            assert_true(differ > 0);
        else
            assert_int_equal(differ, 0);
        const size_t bytes = pd_mix_cursor_bytes(&o.mix); /* a view builds with its source's planner */
        void *mem = malloc(bytes);
        pd_mix_cursor view;
        assert_int_equal(pd_mix_cursor_init(&view, &o.mix, mem, bytes), PD_OK);
        assert_null(view.planner);
        assert_int_equal(pd_mix_cursor_share(&view, &o.cur), PD_OK);
        const uint64_t before = calls;
        pd_mix_order_get(&view, 0, 100);
        assert_int_equal(calls, before + 1);
        pd_mix_cursor_set_planner(&view, NULL, &t); /* the core's again */
        pd_mix_order_get(&view, 0, 101);
        assert_int_equal(calls, before + 1);
        assert_null(view.planner_ctx);
        free(mem);
        mix_free(&o);
    }
    mix_free(&core);
}

/* pd_mix_cursor_missing says what reading the blocks that hold positions through a cursor would build,
 * exactly (the test reads every position of those blocks in order and counts), from any state the cursor
 * was left in; after pd_mix_cursor_prepare nothing is missing; bad ranges and epochs are refused. */
static void cursor_missing_and_prepare(void **state)
{
    (void)state;
    enum { SHARDS = 40 };
    uint64_t shard_sizes[SHARDS], rng = 5, total = 0;
    for (int i = 0; i < SHARDS; i++)
        total += shard_sizes[i] = 60 + test_below(&rng, 80); /* above B: one block reaches two epochs at most */
    const uint64_t *shards[2] = {shard_sizes, NULL};
    const uint64_t sizes[2] = {total, 3000}, nshards[2] = {SHARDS, 0}, windows[2] = {4, 0}, lanes[2] = {2, 0};
    const uint64_t starts[2] = {0, 6400};
    const uint32_t weights[4] = {3, 1, 1, 4};
    owned_mix o;
    assert_int_equal(mix_make_ex(&o, 3, sizes, shards, nshards, windows, lanes, 2, 4096, 64, starts, weights, 2),
                     PD_OK);
    uint64_t drawn[4], missing;
    for (int t = 0; t < 300; t++) {
        const uint64_t epoch = test_below(&rng, 4), first = test_below(&rng, 4096);
        const uint64_t last = first + test_below(&rng, 4096 - first);
        assert_int_equal(pd_mix_reach(&o.mix, epoch, first, last, drawn), PD_OK);
        missing = pd_mix_cursor_missing(&o.cur, drawn);
        const uint64_t built = o.cur.built;
        if (t % 3 == 0) {
            pd_mix_cursor_prepare(&o.cur, drawn);
            assert_int_equal((o.cur.built - built) * SHARDS, missing); /* a reach of two epochs at most here */
            assert_int_equal(pd_mix_cursor_missing(&o.cur, drawn), 0);
            continue;
        }
        for (uint64_t p = first & ~UINT64_C(63); p <= (last | 63); p++) { /* L = 4096: whole blocks of 64 */
            pd_mix_loc loc;
            assert_int_equal(pd_mix_locate(&o.cur, epoch, p, &loc), PD_OK);
        }
        assert_int_equal((o.cur.built - built) * SHARDS, missing);
    }
    assert_int_equal(pd_mix_reach(&o.mix, 0, 10, 9, drawn), PD_EINVAL);                   /* out of order */
    assert_int_equal(pd_mix_reach(&o.mix, 0, 0, 4096, drawn), PD_EINVAL);                  /* past L */
    assert_int_equal(pd_mix_reach(&o.mix, PD_MIX_RUN_END / 4096, 0, 1, drawn), PD_EINVAL); /* no epoch */
    assert_int_equal(pd_mix_reach(NULL, 0, 0, 1, drawn), PD_EINVAL);
    const uint64_t last_epoch = PD_MIX_RUN_END / 4096 - 1; /* its last position is the run's last, 2^63 − 1 */
    const uint64_t built = o.cur.built;
    assert_int_equal(pd_mix_reach(&o.mix, last_epoch, 4000, 4095, drawn), PD_OK);
    missing = pd_mix_cursor_missing(&o.cur, drawn);
    for (uint64_t p = 4000; p < 4096; p++) {
        pd_mix_loc loc;
        assert_int_equal(pd_mix_locate(&o.cur, last_epoch, p, &loc), PD_OK);
    }
    assert_int_equal((o.cur.built - built) * SHARDS, missing);
    mix_free(&o);
}

static void bad_input(void **state)
{
    (void)state;
    const uint64_t sizes[2] = {10, 20}, starts[2] = {0, 64};
    const uint32_t weights[4] = {1, 1, 2, 3};
    owned_mix o;
    assert_int_equal(mix_make(&o, 1, sizes, 2, 0, 64, starts, weights, 2), PD_OK);
    uint8_t mem[4096];
    pd_mix m;
    const size_t bytes = pd_mix_bytes(2, 2);
    const pd_mix_component *c = o.comps;
#define INIT(comps_, C_, len_, block_, starts_, weights_, S_, mem_, bytes_)                                          \
    pd_mix_init(&m, 1, comps_, C_, len_, block_, starts_, weights_, S_, mem_, bytes_)
    assert_int_equal(INIT(c, 2, 0, 64, starts, weights, 2, mem, bytes), PD_OK);
    assert_int_equal(m.length, 30);
    assert_int_equal(INIT(c, 2, 0, 64, starts, weights, 2, mem, bytes - 1), PD_ERANGE);
    assert_int_equal(INIT(c, 0, 0, 64, starts, weights, 2, mem, bytes), PD_EINVAL);
    assert_int_equal(INIT(c, PD_MIX_COMPONENTS_MAX + 1, 0, 64, starts, weights, 2, mem, sizeof mem), PD_EINVAL);
    assert_int_equal(INIT(c, 2, 0, 64, starts, weights, 0, mem, bytes), PD_EINVAL);
    assert_int_equal(INIT(NULL, 2, 0, 64, starts, weights, 2, mem, bytes), PD_EINVAL);
    for (uint64_t block = 1; block <= 8192; block *= 2) /* powers of two from 64 to 2048 */
        assert_int_equal(INIT(c, 2, 0, block, starts, weights, 1, mem, bytes), block >= 64 && block <= 2048 ? 0 : PD_EINVAL);
    assert_int_equal(INIT(c, 2, 0, 96, starts, weights, 1, mem, bytes), PD_EINVAL);
    assert_int_equal(INIT(c, 2, PD_N_MAX + 1, 64, starts, weights, 2, mem, bytes), PD_EINVAL);
    const uint64_t unaligned[2] = {0, 65}, first[2] = {64, 128}, back[2] = {0, 0}, far[2] = {0, PD_MIX_RUN_END};
    assert_int_equal(INIT(c, 2, 0, 64, unaligned, weights, 2, mem, bytes), PD_EINVAL);
    assert_int_equal(INIT(c, 2, 0, 64, first, weights, 2, mem, bytes), PD_EINVAL);
    assert_int_equal(INIT(c, 2, 0, 64, back, weights, 2, mem, bytes), PD_EINVAL);
    assert_int_equal(INIT(c, 2, 0, 64, far, weights, 2, mem, bytes), PD_EINVAL);
    const uint32_t zero[4] = {1, 1, 0, 0}, huge[4] = {UINT32_MAX, 1, 1, 1}, edge[4] = {UINT32_MAX - 1, 1, 1, 1};
    assert_int_equal(INIT(c, 2, 0, 64, starts, zero, 2, mem, bytes), PD_EINVAL);
    assert_int_equal(INIT(c, 2, 0, 64, starts, huge, 2, mem, bytes), PD_EINVAL);
    assert_int_equal(INIT(c, 2, 0, 64, starts, edge, 2, mem, bytes), PD_OK);
    pd_mix_component bad[2] = {{.size = 0}, {.size = 5}};
    assert_int_equal(INIT(bad, 2, 0, 64, starts, weights, 2, mem, bytes), PD_EINVAL);
    bad[0].size = PD_N_MAX;
    assert_int_equal(INIT(bad, 2, 0, 64, starts, weights, 2, mem, bytes), PD_EINVAL); /* N > 2^63 */
    const uint64_t layout[3] = {0, 4, 9};
    pd_mix_component sh[1] = {{.size = 8, .shard_start = layout, .shards = 2, .window = 1, .lanes = 1}};
    assert_int_equal(INIT(sh, 1, 0, 64, starts, weights, 1, mem, bytes), PD_EINVAL); /* size is not the layout's */
    sh[0].size = 9;
    assert_int_equal(INIT(sh, 1, 0, 64, starts, weights, 1, mem, bytes), PD_OK);
    sh[0].window = 0;
    assert_int_equal(INIT(sh, 1, 0, 64, starts, weights, 1, mem, bytes), PD_EINVAL);
#undef INIT

    pd_mix_loc loc;
    pd_mix_draw d = {.component = 2};
    uint64_t e, p, out[4], got, drawn[2];
    uint32_t out32[4];
    pd_slice s = {.world = 2, .rank = 0, .mode = PD_MODE_PAD};
    assert_int_equal(pd_mix_locate(&o.cur, 0, 30, &loc), PD_ERANGE);
    assert_int_equal(pd_mix_locate(&o.cur, PD_MIX_RUN_END / 30, 0, &loc), PD_EINVAL); /* no such epoch */
    assert_int_equal(pd_mix_locate(&o.cur, PD_MIX_RUN_END / 30 - 1, 29, &loc), PD_OK);
    assert_int_equal(pd_mix_draw_at(&o.mix, PD_MIX_RUN_END, &d), PD_ERANGE);
    /* the run's end counts every position of the run: those before its last one, and that one's draw */
    uint64_t before_last[2];
    pd_mix_draw last;
    assert_int_equal(pd_mix_draws_before(&o.mix, PD_MIX_RUN_END, drawn), PD_OK);
    assert_int_equal(pd_mix_draws_before(&o.mix, PD_MIX_RUN_END - 1, before_last), PD_OK);
    assert_int_equal(pd_mix_draw_at(&o.mix, PD_MIX_RUN_END - 1, &last), PD_OK);
    before_last[last.component]++;
    assert_memory_equal(drawn, before_last, sizeof drawn);
    assert_int_equal(drawn[0] + drawn[1], PD_MIX_RUN_END);
    assert_int_equal(pd_mix_draws_before(&o.mix, PD_MIX_RUN_END + 1, drawn), PD_ERANGE);
    assert_int_equal(pd_mix_sample(&o.cur, &d, &loc), PD_ERANGE);
    assert_int_equal(pd_mix_position(&o.cur, 2, 0, 0, &e, &p), PD_ERANGE);
    assert_int_equal(pd_mix_position(&o.cur, 0, 10, 0, &e, &p), PD_ERANGE);
    assert_int_equal(pd_mix_position(&o.cur, 0, 9, UINT64_MAX / 8, &e, &p), PD_ENOTFOUND); /* past 2^63 */
    assert_int_equal(pd_mix_draw_position(&o.mix, 2, 0, &p), PD_ERANGE);
    s.offset = 31;
    assert_int_equal(pd_mix_slice_fill_u64(&o.cur, 0, &s, 4, out, &got), PD_ERANGE);
    s.offset = 30;
    assert_int_equal(pd_mix_slice_fill_u64(&o.cur, 0, &s, 4, out, &got), PD_OK);
    assert_int_equal(got, 0); /* past T: empty */
    s.rank = 2;
    assert_int_equal(pd_mix_slice_fill_u64(&o.cur, 0, &s, 4, out, &got), PD_EINVAL);
    s.rank = 0;
    assert_int_equal(pd_mix_slice_fill_u64(&o.cur, PD_MIX_RUN_END, &s, 4, out, &got), PD_EINVAL);
    assert_int_equal(pd_mix_slice_fill_u64(&o.cur, 0, &s, 4, NULL, &got), PD_EINVAL);
    assert_int_equal(pd_mix_slice_fill_u32(&o.cur, 0, NULL, 4, out32, &got), PD_EINVAL);
    pd_mix_cursor cur;
    assert_int_equal(pd_mix_cursor_init(&cur, &o.mix, mem, pd_mix_cursor_bytes(&o.mix) - 1), PD_ERANGE);
    mix_free(&o);

    /* ids above 2^32 need the u64 fill; a component switched off for good has no inverse */
    const uint64_t wide[2] = {UINT64_C(1) << 33, 5}, one[1] = {0};
    const uint32_t off[2] = {1, 0};
    assert_int_equal(mix_make(&o, 1, wide, 2, 100, 64, one, off, 1), PD_OK);
    assert_int_equal(pd_mix_slice_fill_u32(&o.cur, 0, &s, 4, out32, &got), PD_EOVERFLOW);
    assert_int_equal(pd_mix_slice_fill_u64(&o.cur, 0, &s, 4, out, &got), PD_OK);
    assert_int_equal(pd_mix_position(&o.cur, 1, 3, 0, &e, &p), PD_ENOTFOUND);
    mix_free(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(known_answers),
        cmocka_unit_test(exactly_once_and_inverse),
        cmocka_unit_test(proportion_bound),
        cmocka_unit_test(naive_scheme_breaks_bound),
        cmocka_unit_test(component_epochs_exactly_once),
        cmocka_unit_test(elastic_resume_over_stage),
        cmocka_unit_test(ranks_modes_and_digests),
        cmocka_unit_test(sharded_components),
        cmocka_unit_test(cursor_views_share_orders),
        cmocka_unit_test(cursor_planner),
        cmocka_unit_test(cursor_missing_and_prepare),
        cmocka_unit_test(bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
