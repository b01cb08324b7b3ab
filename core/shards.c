/* Sharded epoch plans: the per-epoch slot table, position → sample through windows and lanes, and back. */
#include "shards.h"

#include <stdint.h>

int pd_shard_layout_build(const uint64_t *sizes, uint64_t shards, uint64_t *start)
{
    if (!sizes || !start || shards == 0 || shards > PD_SHARDS_MAX)
        return PD_EINVAL;
    uint64_t sum = 0;
    for (uint64_t s = 0; s < shards; s++) {
        start[s] = sum;
        if (sizes[s] > PD_N_MAX - sum)
            return PD_EINVAL;
        sum += sizes[s];
    }
    start[shards] = sum;
    return sum == 0 ? PD_EINVAL : PD_OK;
}

uint64_t pd_shard_layout_hash(const uint64_t *sizes, uint64_t shards)
{
    uint64_t h = shards;
    for (uint64_t i = 0; i < shards; i++) {
        uint64_t z = (h ^ sizes[i]) + UINT64_C(0x9E3779B97F4A7C15);
        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        h = z ^ (z >> 31);
    }
    return h;
}

size_t pd_shard_plan_bytes(uint64_t shards)
{
    return (size_t)(2 * shards + 1) * sizeof(uint64_t);
}

int pd__shard_plan_begin(pd_shard_plan *plan, const uint64_t *start, uint64_t shards, uint64_t seed,
                         uint64_t epoch, uint64_t window, uint64_t lanes, void *mem, size_t mem_bytes)
{
    if (!plan || !start || !mem || shards == 0 || shards > PD_SHARDS_MAX || window == 0 || lanes == 0 ||
        lanes > UINT32_MAX || start[0] != 0 || start[shards] == 0 || start[shards] > PD_N_MAX)
        return PD_EINVAL;
    if (mem_bytes < pd_shard_plan_bytes(shards))
        return PD_ERANGE;
    plan->start = start;
    plan->shards = shards;
    plan->n = start[shards];
    plan->window = window;
    plan->windows = shards / window + (shards % window != 0);
    plan->lanes = lanes;
    plan->lane_q = plan->n / lanes;
    plan->lane_r = plan->n % lanes;
    plan->seed = seed;
    plan->epoch = epoch;
    plan->slot_shard = mem;
    plan->slot_start = plan->slot_shard + shards;
    return pd_perm_init(&plan->order, seed, epoch, PD_STREAM_SHARD_ORDER, shards);
}

void pd__shard_plan_end(pd_shard_plan *plan)
{
    uint64_t acc = 0;
    for (uint64_t t = 0; t < plan->shards; t++) {
        const uint64_t s = plan->slot_shard[t];
        plan->slot_start[t] = acc;
        acc += plan->start[s + 1] - plan->start[s];
    }
    plan->slot_start[plan->shards] = acc;
}

int pd_shard_plan_init(pd_shard_plan *plan, const uint64_t *start, uint64_t shards, uint64_t seed,
                       uint64_t epoch, uint64_t window, uint64_t lanes, void *mem, size_t mem_bytes)
{
    int rc = pd__shard_plan_begin(plan, start, shards, seed, epoch, window, lanes, mem, mem_bytes);
    if (rc)
        return rc;
    for (uint64_t t = 0; t < shards; t++)
        plan->slot_shard[t] = pd_perm_at(&plan->order, t);
    pd__shard_plan_end(plan);
    return PD_OK;
}

/* Window w's τ, re-derived only when the window changes: a lane's consecutive indices mostly stay
 * in one window, which also skips the window search. */
typedef struct pd_window_cache {
    uint64_t w;
    uint64_t lo, hi; /* window-stream indices of window w: [lo, hi) */
    int valid;
    pd_perm tau;
} pd_window_cache;

static const pd_perm *pd_window_perm(const pd_shard_plan *plan, pd_window_cache *c, uint64_t w)
{
    if (!c->valid || c->w != w) {
        pd__window_perm(plan, w, &c->tau);
        c->w = w;
        c->lo = plan->slot_start[w * plan->window];
        c->hi = c->lo + c->tau.n;
        c->valid = 1;
    }
    return &c->tau;
}

/* Window-stream index x (spec §3.4) → sample. */
static void pd_window_stream_locate(const pd_shard_plan *plan, pd_window_cache *c, uint64_t x, pd_shard_loc *loc)
{
    uint64_t w = c->valid && x >= c->lo && x < c->hi ? c->w : pd__window_of(plan, x);
    pd__window_locate(plan, w, pd_window_perm(plan, c, w), x, loc);
}

int pd_shard_locate(const pd_shard_plan *plan, uint64_t position, pd_shard_loc *loc)
{
    if (!plan || !loc)
        return PD_EINVAL;
    if (position >= plan->n)
        return PD_ERANGE;
    pd_window_cache c = {0};
    pd_window_stream_locate(plan, &c, pd__lane_index(plan, position), loc);
    return PD_OK;
}

int pd_shard_position(const pd_shard_plan *plan, uint64_t sample, uint64_t *position)
{
    if (!plan || !position)
        return PD_EINVAL;
    if (sample >= plan->n)
        return PD_ERANGE;
    const uint64_t *P = plan->slot_start;
    uint64_t s = pd__last_at_most(plan->start, 1, 0, plan->shards, sample); /* skips empty shards */
    uint64_t t = pd_perm_inv(&plan->order, s);
    uint64_t w = t / plan->window, base = P[w * plan->window];
    pd_window_cache c = {0};
    uint64_t x = base + pd_perm_inv(pd_window_perm(plan, &c, w), P[t] + (sample - plan->start[s]) - base);
    uint64_t q = plan->lane_q, r = plan->lane_r, lane;
    if (x < r * (q + 1))
        lane = x / (q + 1);
    else
        lane = r + (x - r * (q + 1)) / q; /* q > 0 here: x ≥ r(q+1) and x < N = qG + r */
    uint64_t begin = pd__lane_begin(plan, lane);
    uint64_t step = lane % 2 == 0 ? x - begin : begin + pd__lane_length(plan, lane) - 1 - x;
    *position = step * plan->lanes + lane;
    return PD_OK;
}

/* Shared loop of the slice fills: validate, clamp, then visit each position. */
typedef void (*pd_shard_emit)(void *out, uint64_t k, const pd_shard_loc *loc);

static int pd_shard_fill(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, void *out,
                         uint64_t *written, pd_shard_emit emit)
{
    uint64_t left;
    if (!plan || !written || (!out && count))
        return PD_EINVAL;
    int rc = pd_slice_remaining(plan->n, s, &left);
    if (rc)
        return rc;
    if (count > left)
        count = left;
    pd_window_cache c = {0};
    pd_shard_loc loc;
    uint64_t pos = s->offset + s->rank;
    for (uint64_t k = 0; k < count; k++, pos += s->world) {
        uint64_t p = pos < plan->n ? pos : pos % plan->n; /* pad wraps */
        pd_window_stream_locate(plan, &c, pd__lane_index(plan, p), &loc);
        emit(out, k, &loc);
    }
    *written = count;
    return PD_OK;
}

static void pd_emit_u64(void *out, uint64_t k, const pd_shard_loc *loc)
{
    ((uint64_t *)out)[k] = loc->sample;
}

static void pd_emit_u32(void *out, uint64_t k, const pd_shard_loc *loc)
{
    ((uint32_t *)out)[k] = (uint32_t)loc->sample;
}

static void pd_emit_loc(void *out, uint64_t k, const pd_shard_loc *loc)
{
    ((pd_shard_loc *)out)[k] = *loc;
}

int pd_shard_slice_fill_u64(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, uint64_t *out,
                            uint64_t *written)
{
    return pd_shard_fill(plan, s, count, out, written, pd_emit_u64);
}

int pd_shard_slice_fill_u32(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, uint32_t *out,
                            uint64_t *written)
{
    if (plan && pd_id_width(plan->n) != 4)
        return PD_EOVERFLOW;
    return pd_shard_fill(plan, s, count, out, written, pd_emit_u32);
}

int pd_shard_slice_fill_locs(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, pd_shard_loc *out,
                             uint64_t *written)
{
    return pd_shard_fill(plan, s, count, out, written, pd_emit_loc);
}
