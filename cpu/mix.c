/* Bulk mixture fills: blocks' slots and components' σ batched onto the SIMD kernels, then scattered to the rank's ids. */
#include "cpu/mix.h"

#include <stdlib.h>

#include "cpu/kernel.h"

/*
 * A request is cut into chunks of whole blocks (PD_MIX_CHUNK run positions). Two ways through a chunk:
 *
 * Dense (W ≤ PD_MIX_DENSE_WORLD: the rank reads at least one position in PD_MIX_DENSE_WORLD):
 *   1. per block: its keys (one Philox call), the slots of the rank's positions in it (g's kernel,
 *      stride W), and its parts: one walk of the tree lists each component's slot range and first draw;
 *   2. per component: its draws in the chunk are contiguous (blocks and stages continue each other's
 *      counters), so σ runs over the whole range on g's kernel (split at component epochs) — W times
 *      more σ than the rank reads, each at SIMD speed;
 *   3. per block: its ids laid out in slot order (one copy per part), then each read takes the id of
 *      its slot: no branch per position.
 * Sparse (larger W): per read, its slot (g's kernel per block, scalar when the block has few reads), one
 * descent of the tree, and σ of its component at that draw alone (the core's scalar σ, keys cached).
 */

#define PD_MIX_CHUNK 8192u      /* run positions per chunk (a multiple of every B) */
#define PD_MIX_DENSE_WORLD 32u  /* dense up to this W: measured in bench/mixtures.c */

typedef struct pd_mix_part {
    uint64_t draw;                    /* run draw of its first slot */
    uint32_t component, slot, count;  /* slots [slot, slot + count) of its block */
} pd_mix_part;

typedef struct pd_mix_seen {
    uint64_t chunk;   /* the chunk that last touched the component (+ 1; 0: never) */
    uint64_t lo, hi;  /* its draws in the chunk: [lo, hi) */
    uint64_t scratch; /* where the ids of [lo, hi) start in the scratch */
} pd_mix_seen;

typedef struct pd_mix_work {
    pd_mix_seen *seen;   /* C */
    uint32_t *present;   /* components touched in this chunk */
    uint32_t npresent;
    uint32_t *slot;      /* the slot of each read of the chunk */
    pd_mix_part *parts;  /* the chunk's blocks' parts, block after block */
    uint32_t *first;     /* block b's parts: [first[b], first[b + 1]) */
    uint64_t *scratch;   /* the ids of each component's range */
    uint64_t *by_slot;   /* one block's ids in slot order */
    uint32_t *block_slots; /* one block's slots, all B */
} pd_mix_work;

static void pd_mix_work_free(pd_mix_work *w)
{
    free(w->seen);
    free(w->present);
    free(w->slot);
    free(w->parts);
    free(w->first);
    free(w->scratch);
    free(w->by_slot);
    free(w->block_slots);
}

static int pd_mix_work_alloc(pd_mix_work *w, const pd_mix *m)
{
    const uint64_t C = m->components, B = m->block, blocks = PD_MIX_CHUNK / B + 1;
    w->seen = calloc(C, sizeof *w->seen);
    w->present = malloc(C * sizeof *w->present);
    w->slot = malloc((PD_MIX_CHUNK + B) * sizeof *w->slot); /* a chunk ends with the block its last read is in */
    w->parts = malloc(blocks * (C < B ? C : B) * sizeof *w->parts);
    w->first = malloc((blocks + 1) * sizeof *w->first);
    w->scratch = malloc((PD_MIX_CHUNK + B) * sizeof *w->scratch);
    w->by_slot = malloc(B * sizeof *w->by_slot);
    w->block_slots = malloc(B * sizeof *w->block_slots);
    w->npresent = 0;
    if (w->seen && w->present && w->slot && w->parts && w->first && w->scratch && w->by_slot && w->block_slots)
        return PD_OK;
    pd_mix_work_free(w);
    return PD_ENOMEM;
}

/* Stage k's tree walked for the block at stage position x0 (spec §5): its components with slots, in slot
 * order, skipping empty subtrees; each part also extends its component's range in the chunk. Depth first
 * with an explicit stack; returns how many parts. */
static uint32_t pd_mix_block_parts(const pd_mix *m, pd_mix_work *w, uint64_t chunk, uint64_t k, uint64_t x0,
                                   pd_mix_part *parts)
{
    struct frame {
        uint64_t lo, hi, y0, y1, slot;
    } stack[PD_MIX_DEPTH_MAX + 2];
    const uint32_t *cw = m->cum + k * (m->components + 1);
    const uint64_t *P = m->drawn + k * m->components;
    int top = 0;
    uint32_t n = 0;
    stack[0] = (struct frame){0, m->components, x0, x0 + m->block, 0};
    while (top >= 0) {
        const struct frame f = stack[top--];
        if (f.y1 == f.y0)
            continue;
        if (f.hi - f.lo == 1) {
            pd_mix_seen *s = &w->seen[f.lo];
            const uint64_t draw = P[f.lo] + f.y0;
            parts[n++] = (pd_mix_part){draw, (uint32_t)f.lo, (uint32_t)f.slot, (uint32_t)(f.y1 - f.y0)};
            if (s->chunk != chunk) { /* blocks come in order: the first part starts the range */
                s->chunk = chunk;
                s->lo = draw;
                w->present[w->npresent++] = (uint32_t)f.lo;
            }
            s->hi = draw + (f.y1 - f.y0);
            continue;
        }
        const uint64_t mid = f.lo + (f.hi - f.lo) / 2, S = cw[f.hi] - cw[f.lo], a = cw[mid] - cw[f.lo];
        const uint64_t l0 = pd__mix_left(f.y0, a, S), l1 = pd__mix_left(f.y1, a, S);
        stack[++top] = (struct frame){mid, f.hi, f.y0 - l0, f.y1 - l1, f.slot + (l1 - l0)}; /* right after left */
        stack[++top] = (struct frame){f.lo, mid, l0, l1, f.slot};
    }
    return n;
}

/* The slots of a block's reads, at run positions g0 + t·W, t < reads. Too few reads for a SIMD run: the
 * whole block's slots on the SIMD kernel (B ≥ 64 of them) cost less than theirs on the scalar one, from
 * about B/8 reads on; then each read picks its own. */
static void pd_mix_slots(const pd_gen *g, const pd_mix *m, pd_mix_work *w, uint64_t g0, uint64_t world,
                         uint64_t reads, uint32_t *slot)
{
    pd_perm pi;
    pd__mix_block_perm(m, g0 >> m->block_bits, &pi);
    const uint64_t r0 = g0 & (m->block - 1);
    const int whole = reads < PD__SIMD_MIN && reads * 8 >= m->block;
    pd__run run = {.perm = &pi, .first = whole ? 0 : r0, .stride = whole ? 1 : world, .count = whole ? m->block : reads,
                   .out = whole ? w->block_slots : slot, .width = 4, .walk = g->walk};
    pd__gen_run(g, &run);
    if (whole)
        for (uint64_t t = 0; t < reads; t++)
            slot[t] = w->block_slots[r0 + t * world];
}

/* Dense step 2: the global ids of every component's range, into the scratch. */
static void pd_mix_ranges(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w)
{
    const pd_mix *m = c->mix;
    uint64_t at = 0;
    for (uint32_t p = 0; p < w->npresent; p++) {
        const uint32_t j = w->present[p];
        pd_mix_seen *s = &w->seen[j];
        const pd_mix_component *comp = &m->comp[j];
        uint64_t *ids = w->scratch + at;
        s->scratch = at;
        for (uint64_t d = s->lo; d < s->hi;) { /* one run per component epoch */
            const uint64_t e = d / comp->size, u = d % comp->size;
            const uint64_t n = comp->size - u < s->hi - d ? comp->size - u : s->hi - d;
            const pd_mix_order *o = pd_mix_order_get(c, j, e);
            if (comp->shard_start) {
                pd_shard_loc loc;
                for (uint64_t i = 0; i < n; i++) {
                    pd_shard_locate(&o->plan, u + i, &loc);
                    ids[d - s->lo + i] = loc.sample;
                }
            } else {
                pd__run run = {.perm = &o->perm, .first = u, .stride = 1, .count = n, .out = ids + (d - s->lo),
                               .width = 8, .walk = g->walk};
                pd__gen_run(g, &run);
            }
            d += n;
        }
        for (uint64_t i = 0; i < s->hi - s->lo; i++)
            ids[i] += m->offset[j];
        at += s->hi - s->lo;
    }
}

/* Dense step 3 for one block: its ids in slot order, then each read's. */
static void pd_mix_block_ids(pd_mix_work *w, const pd_mix_part *parts, uint32_t nparts,
                             const uint32_t *slot, uint64_t reads, void *out, unsigned width)
{
    for (uint32_t p = 0; p < nparts; p++) {
        const pd_mix_seen *s = &w->seen[parts[p].component];
        const uint64_t *ids = w->scratch + s->scratch + (parts[p].draw - s->lo);
        for (uint32_t i = 0; i < parts[p].count; i++)
            w->by_slot[parts[p].slot + i] = ids[i];
    }
    if (width == 4)
        for (uint64_t t = 0; t < reads; t++)
            ((uint32_t *)out)[t] = (uint32_t)w->by_slot[slot[t]];
    else
        for (uint64_t t = 0; t < reads; t++)
            ((uint64_t *)out)[t] = w->by_slot[slot[t]];
}

/* Reads in the block of run position g0 (reads at g0 + t·W), at most left. */
static uint64_t pd_mix_block_count(const pd_mix *m, uint64_t g0, uint64_t world, uint64_t left)
{
    const uint64_t in_block = ((g0 | (m->block - 1)) - g0) / world + 1;
    return in_block < left ? in_block : left;
}

/* One dense chunk: reads [0, n) at run positions g_first + t·W; returns how many it wrote (whole blocks). */
static uint64_t pd_mix_dense_chunk(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, uint64_t chunk, uint64_t *k,
                                   uint64_t g_first, uint64_t world, uint64_t n, void *out, unsigned width)
{
    const pd_mix *m = c->mix;
    uint64_t t = 0, b = 0;
    w->npresent = 0;
    w->first[0] = 0;
    for (; t < n && t * world < PD_MIX_CHUNK; b++) { /* step 1 */
        const uint64_t g0 = g_first + t * world, reads = pd_mix_block_count(m, g0, world, n - t);
        while (*k + 1 < m->stages && m->start[*k + 1] <= g0)
            (*k)++;
        pd_mix_slots(g, m, w, g0, world, reads, w->slot + t);
        const uint64_t x0 = (g0 & ~(m->block - 1)) - m->start[*k];
        w->first[b + 1] = w->first[b] + pd_mix_block_parts(m, w, chunk, *k, x0, w->parts + w->first[b]);
        t += reads;
    }
    pd_mix_ranges(g, c, w); /* step 2 */
    for (uint64_t i = 0, tb = 0; i < b; i++) { /* step 3 */
        const uint64_t reads = pd_mix_block_count(m, g_first + tb * world, world, n - tb);
        pd_mix_block_ids(w, w->parts + w->first[i], w->first[i + 1] - w->first[i], w->slot + tb, reads,
                         (char *)out + tb * width, width);
        tb += reads;
    }
    return t;
}

/* One sparse block: reads [0, reads) at run positions g0 + t·W. */
static void pd_mix_sparse_block(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, uint64_t k, uint64_t g0,
                                uint64_t world, uint64_t reads, void *out, unsigned width)
{
    const pd_mix *m = c->mix;
    const uint64_t x0 = (g0 & ~(m->block - 1)) - m->start[k];
    pd_mix_slots(g, m, w, g0, world, reads, w->slot);
    for (uint64_t t = 0; t < reads; t++) {
        pd_mix_draw d;
        pd_mix_loc loc;
        uint64_t stage_draw;
        pd__mix_descend(m, k, x0, w->slot[t], &d.component, &stage_draw);
        d.draw = m->drawn[k * m->components + d.component] + stage_draw;
        pd_mix_sample(c, &d, &loc);
        if (width == 4)
            ((uint32_t *)out)[t] = (uint32_t)loc.sample;
        else
            ((uint64_t *)out)[t] = loc.sample;
    }
}

static int pd_gen_mix_fill(const pd_gen *g, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                           void *out, unsigned width, uint64_t *written)
{
    uint64_t left;
    int rc = pd__gen_check(g);
    if (rc)
        return rc;
    if (c && width == 4 && pd_id_width(c->mix->total) != 4) /* then the checks of pd_mix_slice_fill_*, in order */
        return PD_EOVERFLOW;
    if (!c || !written || (!out && count))
        return PD_EINVAL;
    const pd_mix *m = c->mix;
    if (!pd_mix_epoch_ok(m, epoch))
        return PD_EINVAL;
    if ((rc = pd_slice_remaining(m->length, s, &left)))
        return rc;
    if (count > left)
        count = left;
    const uint64_t W = s->world, first = s->offset + s->rank, base = epoch * m->length;
    /* Pad mode may wrap the last read past L (v1 §5: only one can): the core resolves it. */
    uint64_t body = count;
    if (count && first + (count - 1) * W >= m->length) {
        pd_mix_loc loc;
        body--;
        pd_mix_locate(c, epoch, (first + body * W) % m->length, &loc);
        if (width == 4)
            ((uint32_t *)out)[body] = (uint32_t)loc.sample;
        else
            ((uint64_t *)out)[body] = loc.sample;
    }
    *written = count;
    if (body == 0)
        return PD_OK;
    pd_mix_work w;
    if ((rc = pd_mix_work_alloc(&w, m)))
        return rc;
    uint64_t k = pd__mix_stage_of(m, base + first);
    for (uint64_t done = 0, chunk = 1; done < body; chunk++) {
        const uint64_t g0 = base + first + done * W;
        char *at = (char *)out + done * width;
        if (W <= PD_MIX_DENSE_WORLD) {
            done += pd_mix_dense_chunk(g, c, &w, chunk, &k, g0, W, body - done, at, width);
            continue;
        }
        const uint64_t reads = pd_mix_block_count(m, g0, W, body - done);
        while (k + 1 < m->stages && m->start[k + 1] <= g0)
            k++;
        pd_mix_sparse_block(g, c, &w, k, g0, W, reads, at, width);
        done += reads;
    }
    pd_mix_work_free(&w);
    return PD_OK;
}

int pd_gen_mix_fill_u64(const pd_gen *g, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                        uint64_t *out, uint64_t *written)
{
    return pd_gen_mix_fill(g, c, epoch, s, count, out, 8, written);
}

int pd_gen_mix_fill_u32(const pd_gen *g, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                        uint32_t *out, uint64_t *written)
{
    return pd_gen_mix_fill(g, c, epoch, s, count, out, 4, written);
}
