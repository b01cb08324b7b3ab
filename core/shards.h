/* Sharded epochs (docs/spec/shards-v1.md): shard order, K-shard windows, G lanes; position ↔ sample in O(log S). */
#ifndef PD_SHARDS_H
#define PD_SHARDS_H

#include <stddef.h>

#include "rank.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PD_STREAM_SHARD_ORDER 1u /* π over shards */
#define PD_STREAM_WINDOW_BASE 2u /* window w's sample order uses stream 2 + w */
#define PD_SHARDS_MAX UINT64_C(0xFFFFFFFE) /* 2^32 - 2: one stream per window */

/* Natural offsets of a shard layout: start[s] = Σ sizes[< s], S + 1 values,
 * start[S] = N. PD_EINVAL for S outside [1, PD_SHARDS_MAX] or N outside
 * [1, 2^63] (the sum is checked for overflow). */
int pd_shard_layout_build(const uint64_t *sizes, uint64_t shards, uint64_t *start);

/* A 64-bit hash of shard sizes in their order (splitmix64 folded over them, from the count): equal
 * layouts hash equal, others differ but by accident. Not part of the contract: it tells a checkpoint's
 * or a mixture's layout from another with the same total and shard count (whose order differs). */
uint64_t pd_shard_layout_hash(const uint64_t *sizes, uint64_t shards);

/* One epoch's plan. Holds pointers to the caller's layout and memory; no
 * allocation happens inside the core. Treat as read-only. */
typedef struct pd_shard_plan {
    const uint64_t *start; /* natural offsets, S + 1 (the caller's) */
    uint64_t shards;       /* S */
    uint64_t n;            /* N */
    uint64_t window;       /* K */
    uint64_t windows;      /* ⌈S/K⌉ */
    uint64_t lanes;        /* G */
    uint64_t lane_q;       /* ⌊N/G⌋ */
    uint64_t lane_r;       /* N mod G */
    uint64_t seed, epoch;
    pd_perm order;         /* π (stream 1) */
    uint64_t *slot_shard;  /* π(t) for every slot t: S values */
    uint64_t *slot_start;  /* P: S + 1 values */
} pd_shard_plan;

/* Bytes of memory a plan over S shards needs (16 per shard): the per-epoch cache. */
size_t pd_shard_plan_bytes(uint64_t shards);

/* Compute the per-epoch table into mem (at least pd_shard_plan_bytes(S), 8-byte aligned).
 * start comes from pd_shard_layout_build and must outlive the plan. O(S).
 * PD_EINVAL for a bad layout, window = 0 or lanes = 0 or lanes ≥ 2^32; PD_ERANGE if mem is too small. */
int pd_shard_plan_init(pd_shard_plan *plan, const uint64_t *start, uint64_t shards, uint64_t seed,
                       uint64_t epoch, uint64_t window, uint64_t lanes, void *mem, size_t mem_bytes);

/* A builder of shard plans with pd_shard_plan_init's contract and result, and a context of its own: the hook
 * through which a layer above the core builds them faster (cpu/'s pd_gen_shard_planner, its context a pd_gen)
 * where the core builds them for a caller (a mixture's sharded components: pd_mix_cursor_set_planner). It
 * must be reentrant: the pool's threads call one planner with one context at once (cursor views), so the
 * context is read, never written. */
typedef int pd_shard_planner(const void *ctx, pd_shard_plan *plan, const uint64_t *start, uint64_t shards,
                             uint64_t seed, uint64_t epoch, uint64_t window, uint64_t lanes, void *mem,
                             size_t mem_bytes);

/* pd_shard_plan_init in three steps, for a caller that computes the shard order in bulk (cpu/'s σ kernels:
 * pd_gen_shard_plan_init): pd__shard_plan_begin checks the arguments and sets every field but the two tables,
 * with the same errors; the caller then writes slot_shard[t] = pd_perm_at(&plan->order, t) for every t < S; and
 * pd__shard_plan_end fills slot_start from them. */
int pd__shard_plan_begin(pd_shard_plan *plan, const uint64_t *start, uint64_t shards, uint64_t seed,
                         uint64_t epoch, uint64_t window, uint64_t lanes, void *mem, size_t mem_bytes);
void pd__shard_plan_end(pd_shard_plan *plan);

/* Where a sample lives. */
typedef struct pd_shard_loc {
    uint64_t sample; /* global id: start[shard] + offset */
    uint64_t shard;
    uint64_t offset;
} pd_shard_loc;

/* The sample at stream position p < N (pad positions ≥ N: the caller takes p mod N). PD_ERANGE past N. */
int pd_shard_locate(const pd_shard_plan *plan, uint64_t position, pd_shard_loc *loc);

/* The stream position of a sample id < N. */
int pd_shard_position(const pd_shard_plan *plan, uint64_t sample, uint64_t *position);

/* A rank's next samples (spec v1 §5 over the sharded stream), as pd_slice_fill_*:
 * ids (u64, or u32 when N ≤ 2^32: else PD_EOVERFLOW), or locations. */
int pd_shard_slice_fill_u64(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, uint64_t *out,
                            uint64_t *written);
int pd_shard_slice_fill_u32(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, uint32_t *out,
                            uint64_t *written);
int pd_shard_slice_fill_locs(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, pd_shard_loc *out,
                             uint64_t *written);

/* ---- Inline kernels, shared with gpu/ (which runs them on a device copy of the plan: the same
 * struct with device pointers). Unchecked: the caller guarantees arguments are in range. */

/* Last index i in [lo, hi) with a[i·stride] ≤ x, given a[lo·stride] ≤ x (a is non-decreasing). */
PD_STATIC_INLINE uint64_t pd__last_at_most(const uint64_t *a, uint64_t stride, uint64_t lo, uint64_t hi,
                                           uint64_t x)
{
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (a[mid * stride] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* One past window w's last slot; wK < S for every window, but (w + 1)K may overflow. */
PD_STATIC_INLINE uint64_t pd__window_end(const pd_shard_plan *plan, uint64_t w)
{
    uint64_t first = w * plan->window;
    return plan->window < plan->shards - first ? first + plan->window : plan->shards;
}

/* The window holding window-stream index x < N: the last w with P[wK] ≤ x, so an empty window
 * never wins over the one starting at x. */
PD_STATIC_INLINE uint64_t pd__window_of(const pd_shard_plan *plan, uint64_t x)
{
    return pd__last_at_most(plan->slot_start, plan->window, 0, plan->windows, x);
}

/* Window w's sample permutation τ_w (stream 2 + w) over its m ≥ 1 samples. */
PD_STATIC_INLINE void pd__window_perm(const pd_shard_plan *plan, uint64_t w, pd_perm *tau)
{
    const uint64_t *P = plan->slot_start;
    pd__perm_shape(tau, P[pd__window_end(plan, w)] - P[w * plan->window], PD_MIN_BITS);
    pd_keys_derive(plan->seed, plan->epoch, PD_STREAM_WINDOW_BASE + (uint32_t)w, &tau->keys);
}

/* Window-stream index x in window w (whose τ is tau) → sample (spec §3.4). */
PD_STATIC_INLINE void pd__window_locate(const pd_shard_plan *plan, uint64_t w, const pd_perm *tau, uint64_t x,
                                        pd_shard_loc *loc)
{
    const uint64_t *P = plan->slot_start;
    uint64_t base = P[w * plan->window];
    uint64_t u = pd_perm_at(tau, x - base);
    uint64_t t = pd__last_at_most(P, 1, w * plan->window, pd__window_end(plan, w), base + u);
    uint64_t s = plan->slot_shard[t];
    loc->shard = s;
    loc->offset = base + u - P[t];
    loc->sample = plan->start[s] + loc->offset;
}

/* First window-stream index of a lane and its length (spec §3.5). */
PD_STATIC_INLINE uint64_t pd__lane_begin(const pd_shard_plan *plan, uint64_t lane)
{
    return lane * plan->lane_q + (lane < plan->lane_r ? lane : plan->lane_r);
}

PD_STATIC_INLINE uint64_t pd__lane_length(const pd_shard_plan *plan, uint64_t lane)
{
    return plan->lane_q + (lane < plan->lane_r);
}

/* Lane interleaving (spec §3.6): position p < N → window-stream index; odd lanes run backward. */
PD_STATIC_INLINE uint64_t pd__lane_index(const pd_shard_plan *plan, uint64_t p)
{
    uint64_t lane = p % plan->lanes, step = p / plan->lanes;
    uint64_t begin = pd__lane_begin(plan, lane);
    return lane % 2 == 0 ? begin + step : begin + pd__lane_length(plan, lane) - 1 - step;
}

/* The sample at position p < N, uncached (one search, one key derivation): the GPU's path. */
PD_STATIC_INLINE void pd__shard_at(const pd_shard_plan *plan, uint64_t p, pd_shard_loc *loc)
{
    uint64_t x = pd__lane_index(plan, p), w = pd__window_of(plan, x);
    pd_perm tau;
    pd__window_perm(plan, w, &tau);
    pd__window_locate(plan, w, &tau, x, loc);
}

#ifdef __cplusplus
}
#endif

#endif
