/* Mixture plans: validation and stage tables, draws and their inverse, samples through cached component orders. */
#include "mixture.h"

#include <string.h>

#include "error.h"

/* ---- Plans */

size_t pd_mix_bytes(uint64_t components, uint64_t stages)
{
    if (components == 0 || components > PD_MIX_COMPONENTS_MAX || stages == 0 || stages > PD_MIX_STAGES_MAX)
        return 0;
    const uint64_t words = (components + 1) + components + stages + stages * components; /* u64 tables */
    return (size_t)(words * sizeof(uint64_t) + stages * (components + 1) * sizeof(uint32_t));
}

static int pd_mix_component_check(const pd_mix_component *c)
{
    if (!c->shard_start)
        return c->size >= 1 && c->size <= PD_N_MAX ? PD_OK : PD_EINVAL;
    if (c->shards == 0 || c->shards > PD_SHARDS_MAX || c->window == 0 || c->lanes == 0 || c->lanes > UINT32_MAX ||
        c->shard_start[0] != 0 || c->shard_start[c->shards] != c->size || c->size == 0 || c->size > PD_N_MAX)
        return PD_EINVAL;
    return PD_OK;
}

/* count_j(x) of every leaf of the subtree [lo, hi) that receives y (spec §4), into out[lo..hi). */
static void pd_mix_tree_counts(const uint32_t *cw, uint64_t lo, uint64_t hi, uint64_t y, uint64_t *out)
{
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        const uint64_t left = pd__mix_left(y, cw[mid] - cw[lo], cw[hi] - cw[lo]);
        pd_mix_tree_counts(cw, lo, mid, left, out); /* depth ≤ PD_MIX_DEPTH_MAX */
        lo = mid;
        y -= left;
    }
    out[lo] = y;
}

int pd_mix_check(const pd_mix_component *comps, uint64_t components, uint64_t length, uint64_t block,
                 const uint64_t *starts, const uint32_t *weights, uint64_t stages, char *err, size_t errlen)
{
    if (block < PD_MIX_BLOCK_MIN || block > PD_MIX_BLOCK_MAX || (block & (block - 1))) {
        pd_errf(err, errlen, "block %llu is not a power of two in [%u, %u]", (unsigned long long)block,
                PD_MIX_BLOCK_MIN, PD_MIX_BLOCK_MAX);
        return PD_EINVAL;
    }
    uint64_t total = 0;
    for (uint64_t j = 0; j < components; j++) {
        if (pd_mix_component_check(&comps[j]) || comps[j].size > PD_N_MAX - total) {
            pd_errf(err, errlen, "component %llu: a size of 1 to 2^63 (a layout that sums to it), and all of them "
                    "together at most 2^63", (unsigned long long)j);
            return PD_EINVAL;
        }
        total += comps[j].size;
    }
    if ((length ? length : total) > PD_N_MAX) {
        pd_errf(err, errlen, "length %llu is above 2^63", (unsigned long long)length);
        return PD_EINVAL;
    }
    for (uint64_t k = 0; k < stages; k++) {
        const uint64_t s = starts[k];
        if (k == 0 && s != 0) {
            pd_errf(err, errlen, "the first stage starts at %llu, not 0", (unsigned long long)s);
            return PD_EINVAL;
        }
        if (k > 0 && (s <= starts[k - 1] || s % block || s >= PD_MIX_RUN_END)) {
            pd_errf(err, errlen, "stage %llu starts at %llu: stages start at increasing multiples of block (%llu) "
                    "below 2^63, after %llu", (unsigned long long)k, (unsigned long long)s,
                    (unsigned long long)block, (unsigned long long)starts[k - 1]);
            return PD_EINVAL;
        }
        uint64_t sum = 0;
        for (uint64_t j = 0; j < components; j++)
            sum += weights[k * components + j];
        if (sum == 0 || sum > UINT32_MAX) {
            pd_errf(err, errlen, "stage %llu's weights sum to %llu, not between 1 and 2^32 - 1", (unsigned long long)k,
                    (unsigned long long)sum);
            return PD_EINVAL;
        }
    }
    return 0;
}

int pd_mix_init(pd_mix *m, uint64_t seed, const pd_mix_component *comps, uint64_t components, uint64_t length,
                uint64_t block, const uint64_t *starts, const uint32_t *weights, uint64_t stages, void *mem,
                size_t mem_bytes)
{
    const size_t need = pd_mix_bytes(components, stages);
    if (!m || !comps || !starts || !weights || !mem || need == 0)
        return PD_EINVAL;
    if (block == 0)
        block = PD_MIX_BLOCK_DEFAULT;
    if (pd_mix_check(comps, components, length, block, starts, weights, stages, NULL, 0))
        return PD_EINVAL;
    uint64_t total = 0;
    for (uint64_t j = 0; j < components; j++)
        total += comps[j].size;
    if (length == 0)
        length = total;
    if (mem_bytes < need)
        return PD_ERANGE;

    m->seed = seed;
    m->components = components;
    m->stages = stages;
    m->length = length;
    m->block = block;
    m->block_bits = pd_bit_width(block) - 1;
    m->total = total;
    m->comp = comps;
    m->offset = mem;
    m->comp_seed = m->offset + components + 1;
    m->start = m->comp_seed + components;
    m->drawn = m->start + stages;
    m->cum = (uint32_t *)(m->drawn + stages * components);
    m->offset[0] = 0;
    for (uint64_t j = 0; j < components; j++) {
        m->offset[j + 1] = m->offset[j] + comps[j].size;
        m->comp_seed[j] = pd_mix_component_seed(seed, j);
    }
    for (uint64_t k = 0; k < stages; k++) {
        uint32_t *cw = m->cum + k * (components + 1);
        m->start[k] = starts[k];
        cw[0] = 0;
        for (uint64_t j = 0; j < components; j++)
            cw[j + 1] = cw[j] + weights[k * components + j];
    }
    /* P_0 = 0; P_{k+1} = P_k + stage k's tree counts at its length. */
    uint64_t *P = m->drawn;
    memset(P, 0, components * sizeof *P);
    for (uint64_t k = 0; k + 1 < stages; k++) {
        uint64_t *next = P + (k + 1) * components;
        pd_mix_tree_counts(m->cum + k * (components + 1), 0, components, starts[k + 1] - starts[k], next);
        for (uint64_t j = 0; j < components; j++)
            next[j] += P[k * components + j];
    }
    return PD_OK;
}

int pd_mix_epoch_ok(const pd_mix *m, uint64_t epoch)
{
    return epoch <= (PD_MIX_RUN_END - m->length) / m->length;
}

/* ---- Draws */

int pd_mix_draw_at(const pd_mix *m, uint64_t run_position, pd_mix_draw *out)
{
    if (!m || !out)
        return PD_EINVAL;
    if (run_position >= PD_MIX_RUN_END)
        return PD_ERANGE;
    pd_perm pi;
    pd__mix_block_perm(m, run_position >> m->block_bits, &pi);
    pd__mix_draw(m, &pi, run_position, out);
    return PD_OK;
}

int pd_mix_draws_before(const pd_mix *m, uint64_t run_position, uint64_t *drawn)
{
    if (!m || !drawn)
        return PD_EINVAL;
    if (run_position > PD_MIX_RUN_END)
        return PD_ERANGE;
    if (run_position == PD_MIX_RUN_END) { /* the run's end: the draws before its last position, and that one's */
        pd_mix_draw d;
        int rc = pd_mix_draws_before(m, run_position - 1, drawn);
        if (rc == PD_OK && (rc = pd_mix_draw_at(m, run_position - 1, &d)) == PD_OK)
            drawn[d.component]++;
        return rc;
    }
    const uint64_t g = run_position, k = pd__mix_stage_of(m, g), C = m->components;
    const uint64_t block_start = g & ~(m->block - 1), x0 = block_start - m->start[k];
    pd_mix_tree_counts(m->cum + k * (C + 1), 0, C, x0, drawn);
    for (uint64_t j = 0; j < C; j++)
        drawn[j] += m->drawn[k * C + j];
    if (g == block_start)
        return PD_OK;
    pd_perm pi; /* the block's first g − block_start positions */
    pd__mix_block_perm(m, g >> m->block_bits, &pi);
    for (uint64_t r = 0; r < g - block_start; r++) {
        uint64_t j, d;
        pd__mix_descend(m, k, x0, pd_perm_at(&pi, r), &j, &d);
        drawn[j]++;
    }
    return PD_OK;
}

int pd_mix_draw_position(const pd_mix *m, uint64_t component, uint64_t draw, uint64_t *run_position)
{
    if (!m || !run_position)
        return PD_EINVAL;
    const uint64_t C = m->components, j = component;
    if (j >= C)
        return PD_ERANGE;
    /* The stage: the last k with P_k[j] ≤ D (stages where j has no draws share the next one's P). */
    const uint64_t k = pd__last_at_most(m->drawn + j, C, 0, m->stages, draw);
    const uint32_t *cw = m->cum + k * (C + 1);
    if (cw[j + 1] == cw[j])
        return PD_ENOTFOUND; /* only the last stage can be chosen with weight 0: j is off for good */
    const uint64_t d = draw - m->drawn[k * C + j];

    /* The path from the root to leaf j, then upward (spec §8): the stage position x with
     * count_j(x) ≤ d < count_j(x + 1). */
    uint64_t path_lo[PD_MIX_DEPTH_MAX + 1], path_hi[PD_MIX_DEPTH_MAX + 1];
    int depth = 0;
    for (uint64_t lo = 0, hi = C; hi - lo > 1; depth++) {
        path_lo[depth] = lo;
        path_hi[depth] = hi;
        const uint64_t mid = lo + (hi - lo) / 2;
        if (j < mid)
            hi = mid;
        else
            lo = mid;
    }
    uint64_t y = d;
    while (depth-- > 0) {
        const uint64_t lo = path_lo[depth], hi = path_hi[depth], mid = lo + (hi - lo) / 2;
        const uint64_t S = cw[hi] - cw[lo], a = cw[mid] - cw[lo], h = S / 2;
        uint64_t z;
        if (j < mid) { /* z = ⌈((y + 1)·S − h)/a⌉, the first arrival with left(z) = y + 1 */
            if (pd__mix_muldiv(y, S, S - h + a - 1, a, &z))
                return PD_ENOTFOUND;
            y = z - 1;
        } else { /* ⌊(y·S + h)/(S − a)⌋: the arrival after which right() reaches y + 1 */
            if (pd__mix_muldiv(y, S, h, S - a, &y))
                return PD_ENOTFOUND;
        }
        if (y >= PD_MIX_RUN_END)
            return PD_ENOTFOUND;
    }
    if (y >= PD_MIX_RUN_END - m->start[k])
        return PD_ENOTFOUND;

    /* The block of x, j's first slot in it, and the offset that takes the slot. */
    const uint64_t x0 = y & ~(m->block - 1);
    uint64_t lo = 0, hi = C, y0 = x0, y1 = x0 + m->block, slot = 0;
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2, S = cw[hi] - cw[lo], a = cw[mid] - cw[lo];
        const uint64_t l0 = pd__mix_left(y0, a, S), l1 = pd__mix_left(y1, a, S);
        if (j < mid) {
            hi = mid;
            y0 = l0;
            y1 = l1;
        } else {
            slot += l1 - l0;
            lo = mid;
            y0 -= l0;
            y1 -= l1;
        }
    }
    slot += d - y0;
    const uint64_t block_start = m->start[k] + x0;
    pd_perm pi;
    pd__mix_block_perm(m, block_start >> m->block_bits, &pi);
    *run_position = block_start + pd_perm_inv(&pi, slot);
    return PD_OK;
}

/* ---- Cursors and samples */

size_t pd_mix_cursor_bytes(const pd_mix *m)
{
    if (!m)
        return 0;
    size_t bytes = 2 * m->components * sizeof(pd_mix_order);
    for (uint64_t j = 0; j < m->components; j++)
        if (m->comp[j].shard_start)
            bytes += 2 * pd_shard_plan_bytes(m->comp[j].shards);
    return bytes;
}

int pd_mix_cursor_init(pd_mix_cursor *c, const pd_mix *m, void *mem, size_t mem_bytes)
{
    if (!c || !m || !mem)
        return PD_EINVAL;
    if (mem_bytes < pd_mix_cursor_bytes(m))
        return PD_ERANGE;
    c->mix = m;
    c->orders = mem;
    c->built = 0;
    c->planner = NULL;
    c->planner_ctx = NULL;
    char *plans = (char *)mem + 2 * m->components * sizeof(pd_mix_order);
    for (uint64_t i = 0; i < 2 * m->components; i++) {
        pd_mix_order *o = &c->orders[i];
        const pd_mix_component *comp = &m->comp[i / 2];
        o->valid = 0;
        o->mem = NULL;
        if (comp->shard_start) {
            o->mem = plans;
            plans += pd_shard_plan_bytes(comp->shards);
        }
    }
    return PD_OK;
}

void pd_mix_cursor_set_planner(pd_mix_cursor *c, pd_shard_planner *planner, const void *ctx)
{
    c->planner = planner;
    c->planner_ctx = planner ? ctx : NULL;
}

int pd_mix_cursor_share(pd_mix_cursor *c, const pd_mix_cursor *from)
{
    if (!c || !from || c->mix != from->mix)
        return PD_EINVAL;
    pd_mix_cursor_set_planner(c, from->planner, from->planner_ctx);
    for (uint64_t i = 0; i < 2 * c->mix->components; i++) {
        void *own = c->orders[i].mem; /* where c builds: a shared order's tables stay from's */
        c->orders[i] = from->orders[i];
        c->orders[i].mem = own;
    }
    return PD_OK;
}

int pd_mix_reach(const pd_mix *m, uint64_t epoch, uint64_t first, uint64_t last, uint64_t *drawn)
{
    if (!m || !drawn)
        return PD_EINVAL;
    const uint64_t C = m->components;
    if (first > last || last >= m->length || !pd_mix_epoch_ok(m, epoch))
        return PD_EINVAL;
    uint64_t sharded = 0;
    for (uint64_t j = 0; j < C; j++)
        sharded |= m->comp[j].shard_start != NULL;
    if (!sharded) {
        memset(drawn, 0, 2 * C * sizeof *drawn);
        return PD_OK;
    }
    /* (E + 1)·L ≤ 2^63, a multiple of B: no overflow, and the last block ends at 2^63 at most */
    const uint64_t g0 = (epoch * m->length + first) & ~(m->block - 1);
    const uint64_t g1 = ((epoch * m->length + last) | (m->block - 1)) + 1;
    int rc = pd_mix_draws_before(m, g0, drawn);
    return rc == PD_OK ? pd_mix_draws_before(m, g1, drawn + C) : rc;
}

uint64_t pd_mix_cursor_missing(const pd_mix_cursor *c, const uint64_t *drawn)
{
    const pd_mix *m = c->mix;
    const uint64_t C = m->components;
    uint64_t sum = 0;
    for (uint64_t j = 0; j < C; j++) {
        const pd_mix_component *comp = &m->comp[j];
        if (!comp->shard_start || drawn[C + j] == drawn[j])
            continue;
        const uint64_t e0 = drawn[j] / comp->size, e1 = (drawn[C + j] - 1) / comp->size;
        /* Read in order, each epoch is built once unless held when reached: only e0 and e0 + 1 can be (a
         * later one's slot is rebuilt for an earlier epoch of its parity first). */
        uint64_t builds = e1 - e0 + 1;
        for (uint64_t slot = 0; slot < 2; slot++) {
            const pd_mix_order *o = &c->orders[2 * j + slot];
            builds -= o->valid && o->epoch >= e0 && o->epoch <= e1 && o->epoch - e0 <= 1;
        }
        const uint64_t cost = builds > UINT64_MAX / comp->shards ? UINT64_MAX : builds * comp->shards;
        sum = sum > UINT64_MAX - cost ? UINT64_MAX : sum + cost;
    }
    return sum;
}

void pd_mix_cursor_prepare(pd_mix_cursor *c, const uint64_t *drawn)
{
    const pd_mix *m = c->mix;
    const uint64_t C = m->components;
    for (uint64_t j = 0; j < C; j++) {
        const pd_mix_component *comp = &m->comp[j];
        if (!comp->shard_start || drawn[C + j] == drawn[j])
            continue;
        const uint64_t e0 = drawn[j] / comp->size, e1 = (drawn[C + j] - 1) / comp->size;
        if (e1 - e0 <= 1) {
            pd_mix_order_get(c, j, e0);
            pd_mix_order_get(c, j, e1);
        }
    }
}

const pd_mix_order *pd_mix_order_get(pd_mix_cursor *c, uint64_t component, uint64_t epoch)
{
    const pd_mix *m = c->mix;
    const pd_mix_component *comp = &m->comp[component];
    pd_mix_order *o = &c->orders[2 * component + (epoch & 1)];
    if (o->valid && o->epoch == epoch)
        return o;
    const uint64_t seed = m->comp_seed[component];
    if (comp->shard_start) {
        const size_t bytes = pd_shard_plan_bytes(comp->shards);
        if (!c->planner || c->planner(c->planner_ctx, &o->plan, comp->shard_start, comp->shards, seed, epoch,
                                      comp->window, comp->lanes, o->mem, bytes))
            pd_shard_plan_init(&o->plan, comp->shard_start, comp->shards, seed, epoch, comp->window, comp->lanes,
                               o->mem, bytes); /* validated by pd_mix_init: cannot fail */
        c->built++;
    } else
        pd_perm_init(&o->perm, seed, epoch, PD_STREAM_SAMPLES, comp->size);
    o->epoch = epoch;
    o->valid = 1;
    return o;
}

int pd_mix_sample(pd_mix_cursor *c, const pd_mix_draw *d, pd_mix_loc *loc)
{
    if (!c || !d || !loc)
        return PD_EINVAL;
    const pd_mix *m = c->mix;
    const uint64_t j = d->component;
    if (j >= m->components)
        return PD_ERANGE;
    const uint64_t n = m->comp[j].size, e = d->draw / n, u = d->draw % n;
    const pd_mix_order *o = pd_mix_order_get(c, j, e);
    if (m->comp[j].shard_start) {
        pd_shard_loc sl;
        pd_shard_locate(&o->plan, u, &sl);
        loc->local = sl.sample;
    } else {
        loc->local = pd_perm_at(&o->perm, u);
    }
    loc->component = j;
    loc->epoch = e;
    loc->sample = m->offset[j] + loc->local;
    return PD_OK;
}

int pd_mix_locate(pd_mix_cursor *c, uint64_t epoch, uint64_t position, pd_mix_loc *loc)
{
    pd_mix_draw d;
    if (!c || !loc)
        return PD_EINVAL;
    const pd_mix *m = c->mix;
    if (!pd_mix_epoch_ok(m, epoch))
        return PD_EINVAL;
    if (position >= m->length)
        return PD_ERANGE;
    pd_mix_draw_at(m, epoch * m->length + position, &d);
    return pd_mix_sample(c, &d, loc);
}

int pd_mix_position(pd_mix_cursor *c, uint64_t component, uint64_t local, uint64_t comp_epoch, uint64_t *epoch,
                    uint64_t *position)
{
    if (!c || !epoch || !position)
        return PD_EINVAL;
    const pd_mix *m = c->mix;
    if (component >= m->components || local >= m->comp[component].size)
        return PD_ERANGE;
    const uint64_t n = m->comp[component].size;
    const pd_mix_order *o = pd_mix_order_get(c, component, comp_epoch);
    uint64_t u, g;
    if (m->comp[component].shard_start)
        pd_shard_position(&o->plan, local, &u);
    else
        u = pd_perm_inv(&o->perm, local);
    if (comp_epoch > (UINT64_MAX - u) / n)
        return PD_ENOTFOUND; /* a draw past 2^64: past the run's end too */
    int rc = pd_mix_draw_position(m, component, comp_epoch * n + u, &g);
    if (rc)
        return rc;
    if (!pd_mix_epoch_ok(m, g / m->length)) /* a run position past the last whole mixture epoch: never read */
        return PD_ENOTFOUND;
    *epoch = g / m->length;
    *position = g % m->length;
    return PD_OK;
}

/* ---- Rank slices */

/* Shared loop of the fills: validate, clamp, then visit each position with its block's π cached. */
typedef void (*pd_mix_emit)(void *out, uint64_t k, const pd_mix_loc *loc);

static int pd_mix_fill(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count, void *out,
                       uint64_t *written, pd_mix_emit emit)
{
    uint64_t left;
    if (!c || !written || (!out && count))
        return PD_EINVAL;
    const pd_mix *m = c->mix;
    if (!pd_mix_epoch_ok(m, epoch))
        return PD_EINVAL;
    int rc = pd_slice_remaining(m->length, s, &left);
    if (rc)
        return rc;
    if (count > left)
        count = left;
    const uint64_t base = epoch * m->length;
    uint64_t beta = UINT64_MAX, pos = s->offset + s->rank;
    pd_perm pi = {0}; /* set at the first position: no block is numbered UINT64_MAX */
    for (uint64_t k = 0; k < count; k++, pos += s->world) {
        const uint64_t g = base + (pos < m->length ? pos : pos % m->length); /* pad wraps */
        pd_mix_draw d;
        pd_mix_loc loc;
        if (g >> m->block_bits != beta) {
            beta = g >> m->block_bits;
            pd__mix_block_perm(m, beta, &pi);
        }
        pd__mix_draw(m, &pi, g, &d);
        pd_mix_sample(c, &d, &loc);
        emit(out, k, &loc);
    }
    *written = count;
    return PD_OK;
}

static void pd_mix_emit_u64(void *out, uint64_t k, const pd_mix_loc *loc)
{
    ((uint64_t *)out)[k] = loc->sample;
}

static void pd_mix_emit_u32(void *out, uint64_t k, const pd_mix_loc *loc)
{
    ((uint32_t *)out)[k] = (uint32_t)loc->sample;
}

static void pd_mix_emit_loc(void *out, uint64_t k, const pd_mix_loc *loc)
{
    ((pd_mix_loc *)out)[k] = *loc;
}

int pd_mix_slice_fill_u64(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count, uint64_t *out,
                          uint64_t *written)
{
    return pd_mix_fill(c, epoch, s, count, out, written, pd_mix_emit_u64);
}

int pd_mix_slice_fill_u32(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count, uint32_t *out,
                          uint64_t *written)
{
    if (c && pd_id_width(c->mix->total) != 4)
        return PD_EOVERFLOW;
    return pd_mix_fill(c, epoch, s, count, out, written, pd_mix_emit_u32);
}

int pd_mix_slice_fill_locs(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count, pd_mix_loc *out,
                           uint64_t *written)
{
    return pd_mix_fill(c, epoch, s, count, out, written, pd_mix_emit_loc);
}
