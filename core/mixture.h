/* Mixtures (docs/spec/mixtures-v1.md): weighted, staged draws over several datasets; position ↔ sample in O(log C + log S). */
#ifndef PD_MIXTURE_H
#define PD_MIXTURE_H

#include <stddef.h>

#include "shards.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Philox counter word 0 of the mixture's keys (spec §2): v1's key schedule uses 0..6 only. */
#define PD_MIX_CTR_BLOCK 8u /* block β's packed keys: (8, 0, β lo, β hi) */
#define PD_MIX_CTR_SEED 9u  /* component j's seed: (9, j, 0, 0) */

#define PD_MIX_COMPONENTS_MAX 65536u
#define PD_MIX_STAGES_MAX 65536u
#define PD_MIX_BLOCK_MIN 64u
#define PD_MIX_BLOCK_MAX 2048u
#define PD_MIX_BLOCK_DEFAULT 64u
#define PD_MIX_RUN_END (UINT64_C(1) << 63) /* run positions are below 2^63 */
#define PD_MIX_DEPTH_MAX 16                /* tree levels: ⌈log2 PD_MIX_COMPONENTS_MAX⌉ */

/* One component: flat (shard_start NULL) or sharded (its layout from pd_shard_layout_build, which must
 * outlive the mixture, and its window and lanes). */
typedef struct pd_mix_component {
    uint64_t size;               /* n_j: 1 ≤ n_j ≤ 2^63; for a sharded one, shard_start[shards] */
    const uint64_t *shard_start; /* sharded: natural offsets, shards + 1 values; NULL: flat */
    uint64_t shards;             /* S_j */
    uint64_t window;             /* K_j ≥ 1 */
    uint64_t lanes;              /* G_j in [1, 2^32 − 1] */
} pd_mix_component;

/* A mixture plan: the inputs of spec §1 and the tables derived from them (prefix sums of each stage's
 * weights, each stage's draws before it). Holds pointers to the caller's components and memory; no
 * allocation inside the core. A plain value afterwards: read-only, shareable by threads. */
typedef struct pd_mix {
    uint64_t seed;
    uint64_t components;    /* C */
    uint64_t stages;        /* S */
    uint64_t length;        /* L: positions per mixture epoch */
    uint64_t block;         /* B, a power of two */
    uint32_t block_bits;    /* log2 B */
    uint64_t total;         /* N = Σ n_j: global ids are below N */
    const pd_mix_component *comp; /* C (the caller's) */
    uint64_t *offset;       /* o_j = Σ_{i<j} n_i: C + 1 values */
    uint64_t *comp_seed;    /* seed_j: C values */
    uint64_t *start;        /* s_k: S values */
    uint64_t *drawn;        /* P_k[j], draws of j before stage k: S rows of C */
    uint32_t *cum;          /* Σ_{i<j} w_k[i]: S rows of C + 1 */
} pd_mix;

/* Bytes of memory a plan over C components and S stages needs (8-byte aligned); 0 outside the limits. */
size_t pd_mix_bytes(uint64_t components, uint64_t stages);

/* Whether a definition is inside spec §1 (what pd_mix_init checks before building): PD_EINVAL, with the first
 * rule it breaks said in err (may be NULL), else 0. block is not 0 here (pd_mix_init takes 0 as the default). */
int pd_mix_check(const pd_mix_component *comps, uint64_t components, uint64_t length, uint64_t block,
                 const uint64_t *starts, const uint32_t *weights, uint64_t stages, char *err, size_t errlen);

/* Build a plan. weights: S rows of C u32 (stage k's row at weights + k·C); starts: S run positions.
 * length 0 means N, block 0 means PD_MIX_BLOCK_DEFAULT. O(S·C·log C).
 * PD_EINVAL for anything outside spec §1; PD_ERANGE if mem is too small. */
int pd_mix_init(pd_mix *m, uint64_t seed, const pd_mix_component *comps, uint64_t components, uint64_t length,
                uint64_t block, const uint64_t *starts, const uint32_t *weights, uint64_t stages, void *mem,
                size_t mem_bytes);

/* Whether mixture epoch E exists: (E + 1)·L ≤ 2^63. */
int pd_mix_epoch_ok(const pd_mix *m, uint64_t epoch);

/* ---- Draws: run position ↔ (component, run draw). Pure; no cursor needed. */

typedef struct pd_mix_draw {
    uint64_t component; /* j */
    uint64_t draw;      /* D: j's run-wide draw counter */
} pd_mix_draw;

/* The draw at run position g < 2^63 (PD_ERANGE otherwise). */
int pd_mix_draw_at(const pd_mix *m, uint64_t run_position, pd_mix_draw *out);

/* drawn[j] = how many of run positions [0, g) draw from j, for every j (C values), g ≤ 2^63 (the run's end;
 * PD_ERANGE past it). O(C + B·log C). */
int pd_mix_draws_before(const pd_mix *m, uint64_t run_position, uint64_t *drawn);

/* The run position of component j's draw D; PD_ENOTFOUND if the run never makes it (weight 0 in the
 * last stage, or at or past 2^63); PD_ERANGE for j ≥ C. */
int pd_mix_draw_position(const pd_mix *m, uint64_t component, uint64_t draw, uint64_t *run_position);

/* ---- Samples: a cursor caches each component's order for its two latest component epochs. */

typedef struct pd_mix_order {
    uint64_t epoch;      /* the component epoch this holds */
    int valid;
    pd_perm perm;        /* flat: σ(seed_j, epoch, 0, n_j) */
    pd_shard_plan plan;  /* sharded: the shard addendum's plan, in mem */
    void *mem;
} pd_mix_order;

/* Per-thread state over a plan (not shareable). Two orders per component (indexed by epoch parity), so
 * that draws on both sides of a component epoch boundary never rebuild one back and forth. */
typedef struct pd_mix_cursor {
    const pd_mix *mix;
    pd_mix_order *orders; /* 2·C */
    uint64_t built;       /* sharded orders built (O(S_j) each) since pd_mix_cursor_init: lets a caller that
                           * keeps cursors warm see what each use cost */
    pd_shard_planner *planner; /* builds them (pd_mix_cursor_set_planner); NULL: pd_shard_plan_init */
    const void *planner_ctx;
} pd_mix_cursor;

/* Bytes a cursor needs: 2·C orders and, per sharded component, two plans. 0 for a NULL plan. */
size_t pd_mix_cursor_bytes(const pd_mix *m);
/* PD_EINVAL for NULL arguments; PD_ERANGE if mem is too small. */
int pd_mix_cursor_init(pd_mix_cursor *c, const pd_mix *m, void *mem, size_t mem_bytes);

/* Have c build its sharded components' orders with planner (ctx passed along; it must outlive c's use), not
 * with the core's pd_shard_plan_init: cpu/'s pd_gen_shard_planner builds them 4-11x faster. An order the planner
 * fails to build is built by the core instead (the same order, slower; built counts it alike). planner NULL:
 * the core's again, as after pd_mix_cursor_init. */
void pd_mix_cursor_set_planner(pd_mix_cursor *c, pd_shard_planner *planner, const void *ctx);

/* Make c, initialized over from's plan, a view of from: each order from holds now serves c too (its tables
 * shared, read-only), an order c builds goes to c's own memory, built by from's planner. Threads may each take
 * a view of one cursor, so a sharded order built once serves them all, as long as from itself does not change
 * until the views are done. PD_EINVAL for NULL arguments or cursors of different plans. */
int pd_mix_cursor_share(pd_mix_cursor *c, const pd_mix_cursor *from);

/* Where mixture epoch E's positions [first, last] (first ≤ last < L) reach: drawn[j] and drawn[C + j], component
 * j's draws before the blocks that hold them begin and end (a superset of what those positions draw: a
 * block's partial range is not cheaper to bound), for a mixture with a sharded component; all 0 for one
 * without (nothing to build). drawn: 2·C values. PD_EINVAL for NULL arguments, an epoch that does not
 * exist, or positions out of order or past L. O(C + B·log C); reads the plan only. */
int pd_mix_reach(const pd_mix *m, uint64_t epoch, uint64_t first, uint64_t last, uint64_t *drawn);
/* The shards (Σ S_j, saturating) of the sharded component orders a reach needs that c lacks: what reading
 * those blocks in order through c would build. */
uint64_t pd_mix_cursor_missing(const pd_mix_cursor *c, const uint64_t *drawn);
/* Build them into c, for each component whose reach is at most the two component epochs a cursor holds
 * (one cycled more often is built as its reader goes, possibly again by each reader). */
void pd_mix_cursor_prepare(pd_mix_cursor *c, const uint64_t *drawn);

/* Component j's order for component epoch e (built on first use: O(1) flat, O(S_j) sharded). */
const pd_mix_order *pd_mix_order_get(pd_mix_cursor *c, uint64_t component, uint64_t epoch);

typedef struct pd_mix_loc {
    uint64_t sample;    /* global id: o_j + local */
    uint64_t component; /* j */
    uint64_t local;     /* the sample's id in its component */
    uint64_t epoch;     /* the component epoch that draws it */
} pd_mix_loc;

/* The sample of a draw (spec §6). PD_ERANGE for j ≥ C. */
int pd_mix_sample(pd_mix_cursor *c, const pd_mix_draw *d, pd_mix_loc *loc);

/* The sample at position p < L of mixture epoch E. PD_EINVAL for an epoch that does not exist;
 * PD_ERANGE for p ≥ L. */
int pd_mix_locate(pd_mix_cursor *c, uint64_t epoch, uint64_t position, pd_mix_loc *loc);

/* Inverse (spec §7): where component j's sample `local` of component epoch e is drawn: mixture epoch
 * *epoch, position *position. PD_ERANGE for j ≥ C or local ≥ n_j; PD_ENOTFOUND when never. */
int pd_mix_position(pd_mix_cursor *c, uint64_t component, uint64_t local, uint64_t comp_epoch, uint64_t *epoch,
                    uint64_t *position);

/* A rank's next min(count, remaining) samples of mixture epoch E (spec §7 = v1 §5 with n = L), as
 * pd_slice_fill_*: global ids (u32 needs N ≤ 2^32, else PD_EOVERFLOW) or locations. */
int pd_mix_slice_fill_u64(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count, uint64_t *out,
                          uint64_t *written);
int pd_mix_slice_fill_u32(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count, uint32_t *out,
                          uint64_t *written);
int pd_mix_slice_fill_locs(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count, pd_mix_loc *out,
                           uint64_t *written);

/* ---- Inline kernels, for the CPU bulk path and a device copy of the plan. Unchecked. */

/* component j's seed (spec §2). */
PD_STATIC_INLINE uint64_t pd_mix_component_seed(uint64_t seed, uint64_t j)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {PD_MIX_CTR_SEED, (uint32_t)j, 0, 0};
    uint32_t out[4];
    pd_philox4x32_10(ctr, key, out);
    return (uint64_t)out[0] | (uint64_t)out[1] << 32;
}

/* ⌊(y·mul + add)/div⌋ in 64 bits (spec §8): mul, div in [1, 2^32), add < 2^33. 0 when it fits, 1 when
 * the quotient exceeds 2^64 − 1. */
PD_STATIC_INLINE int pd__mix_muldiv(uint64_t y, uint64_t mul, uint64_t add, uint64_t div, uint64_t *out)
{
    const uint64_t q = y / div, t = y % div;
    const uint64_t low = (t * mul + add) / div; /* t·mul + add < 2^64 − 2^32 + 2 */
    if (q > (UINT64_MAX - low) / mul)
        return 1;
    *out = q * mul + low;
    return 0;
}

/* left(y) of a node of weight S whose left child weighs a ≤ S (spec §4): y·a/S rounded, halves up. */
PD_STATIC_INLINE uint64_t pd__mix_left(uint64_t y, uint64_t a, uint64_t S)
{
    uint64_t out = 0;
    if (a)
        pd__mix_muldiv(y, a, S / 2, S, &out); /* a ≤ S: never overflows */
    return out;
}

/* The stage holding run position g: the last k with s_k ≤ g. */
PD_STATIC_INLINE uint64_t pd__mix_stage_of(const pd_mix *m, uint64_t g)
{
    return pd__last_at_most(m->start, 1, 0, m->stages, g);
}

/* Block β's permutation π_β (spec §2, §5) for a mixture of this seed and block: v1's f on log2 B bits with
 * keys packed in one Philox output. */
PD_STATIC_INLINE void pd__mix_block_keys(uint64_t seed, uint64_t block, uint64_t beta, pd_perm *pi)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {PD_MIX_CTR_BLOCK, 0, (uint32_t)beta, (uint32_t)(beta >> 32)};
    uint32_t x[4];
    pd_philox4x32_10(ctr, key, x);
    const uint64_t lo = (uint64_t)x[0] | (uint64_t)x[1] << 32, hi = (uint64_t)x[2] | (uint64_t)x[3] << 32;
    pd__perm_shape(pi, block, PD_MIN_BITS);
    for (uint32_t i = 0; i < PD_ROUNDS; i++) {
        const uint32_t at = 5 * i; /* bits [5i, 5i + 5) of X */
        uint64_t v = at < 64 ? lo >> at : hi >> (at - 64);
        if (at > 59 && at < 64)
            v |= hi << (64 - at);
        pi->keys.k[i] = (uint32_t)(v & 31);
    }
    pi->keys.flip = (uint32_t)(hi >> 56) & 1; /* bit 120 */
}

PD_STATIC_INLINE void pd__mix_block_perm(const pd_mix *m, uint64_t beta, pd_perm *pi)
{
    pd__mix_block_keys(m->seed, m->block, beta, pi);
}

/* Descend stage k's tree (spec §5) for the block at stage position x0 and slot q < B: the component and
 * its stage draw. */
PD_STATIC_INLINE void pd__mix_descend(const pd_mix *m, uint64_t k, uint64_t x0, uint64_t q, uint64_t *component,
                                      uint64_t *stage_draw)
{
    const uint32_t *cw = m->cum + k * (m->components + 1);
    uint64_t lo = 0, hi = m->components, y0 = x0, y1 = x0 + m->block;
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2, S = cw[hi] - cw[lo], a = cw[mid] - cw[lo];
        const uint64_t l0 = pd__mix_left(y0, a, S), l1 = pd__mix_left(y1, a, S);
        if (q < l1 - l0) {
            hi = mid;
            y0 = l0;
            y1 = l1;
        } else {
            q -= l1 - l0;
            lo = mid;
            y0 -= l0;
            y1 -= l1;
        }
    }
    *component = lo;
    *stage_draw = y0 + q;
}

/* The draw at run position g < 2^63, given its block's permutation. */
PD_STATIC_INLINE void pd__mix_draw(const pd_mix *m, const pd_perm *pi, uint64_t g, pd_mix_draw *d)
{
    const uint64_t k = pd__mix_stage_of(m, g), x0 = (g & ~(m->block - 1)) - m->start[k];
    uint64_t d_stage;
    pd__mix_descend(m, k, x0, pd_perm_at(pi, g & (m->block - 1)), &d->component, &d_stage);
    d->draw = m->drawn[k * m->components + d->component] + d_stage;
}

#ifdef __cplusplus
}
#endif

#endif
