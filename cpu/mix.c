/* Bulk mixture fills: blocks' slots and components' σ batched onto the SIMD kernels, then scattered to the rank's ids. */
#include "cpu/mix.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/divide.h"
#include "cpu/kernel.h"

/*
 * A request is cut into chunks. In a chunk, the slots of all the rank's reads come first, one of two ways:
 *   - small W (pd_mix_by_groups): every slot of 8 blocks at once (pd__block_group_*: bytes, a round a
 *     vpermb and an xor with VBMI, else a pshufb and six more; one Philox per block), then each read picks
 *     its own: W·(slots per read) work, no multiply;
 *   - larger W: a kernel keying each read by its block (pd__block_slots_run: with VBMI, bytes, 64 reads a
 *     register, one Philox per block and the keys of the blocks of 256 reads built once; AVX2, bytes, 32 a
 *     register and a Philox per read; AVX-512 without VBMI, 16 lanes each with its own Philox).
 * Then, two ways:
 *
 * Dense (W ≤ PD_MIX_DENSE_WORLD; a chunk is PD_MIX_DENSE_CHUNK run positions of whole blocks):
 *   1. per block: its parts, each component's slot range and first draw (pd_mix_block_parts: for small C
 *      every component's count at the block's end less that at its start, for 32 blocks at once; else one
 *      walk of the tree);
 *   2. per component: its draws in the chunk are contiguous (blocks and stages continue each other's
 *      counters), so σ runs over the whole range on g's kernel (split at component epochs), at its full speed;
 *   3. per block: its global ids laid out in slot order (per part: its local ids plus the component's
 *      offset); each read takes its slot's id.
 * Sparse (larger W; a chunk is pd_mix_sparse_reads(g) reads): each read's component and draw, then only the ids read
 * are computed. A read's component and draw come one of three ways:
 *   - segments (C ≤ 16, reads dense enough: pd_mix_segments): every component's count at the starts of up to 32
 *     blocks at once, then per component and block its first slot and first draw, and each read its component by
 *     one compare per component (pd__segment_reads_avx512: 16 reads a vector; pd__segment_draws_avx2: 8),
 *     nothing per block. W = 8 with the bench's four components, one core of the 2-vCPU Xeon: 106 → 140 M ids/s;
 *   - its block's parts, as dense step 1 (where blocks are read several times, or consecutively with small
 *     C); each read then finds its slot's part (no division);
 *   - otherwise one descent of the tree per read (⌈log2 C⌉ levels, two divisions each).
 * Their σ, two ways:
 *   - by runs (pd_mix_sparse_runs; AVX-512 and scalar, components flat of 2 to 2^32 samples): the reads in
 *     read order through the batch kernel (pd__batch_*), each lane on its (component, component epoch)'s
 *     keys: no grouping and no scatter;
 *   - by groups (AVX2; the other components' reads beside runs, sharded ones or flat ones outside 2 to
 *     2^32, where blocks go a block at a time, and every read of such a mixture otherwise): the reads
 *     are grouped by component and component epoch (pd_mix_sparse_groups; with C ≤ 16 where the CPU has AVX2,
 *     AVX-512 hosts too, a compress pass per component and one division per component, pd_mix_sparse_scan), and σ is
 *     gathered at their draws (pd__gather_*), then scattered back (AVX2's batch kernel, 8 runs and a vpermd
 *     per round, loses to this); a sharded component's reads are gathered too, a window's stretch at a time
 *     (pd_gen_shard_gather_u64).
 */

#define PD_MIX_DENSE_CHUNK 32768u /* run positions per dense chunk; a multiple of every B */
#define PD_MIX_SPARSE_CHUNK 4096u /* reads per sparse chunk: their arrays stay in L1 */
#define PD_MIX_SPARSE_CHUNK_AVX2 8192u /* AVX2: longer gathers drain less often (W = 8, Zen 3: +3-4%; 16384: +3%) */
#define PD_MIX_DENSE_WORLD 1u   /* dense up to this W: W = 2 measured faster sparse (AVX-512 and AVX2, bench/mixtures) */
#define PD_MIX_GROUPS_WORLD_AVX512 4u /* block groups up to this W on AVX-512 without VBMI (pd_mix_by_groups) */
#define PD_MIX_GROUPS_WORLD_VBMI 1u   /* with VBMI (its block-slot kernel wins from W = 2: 120 against 107 M ids/s) */
#define PD_MIX_GROUPS_WORLD_AVX2 4u   /* on AVX2 (W = 64: its per-read kernel runs 2× the groups) */
#define PD_MIX_SCAN_COMPONENTS 16u /* where g->avx2: a sparse chunk grouped by a pass per component up to this C */

/* pd__mix_left with the node's weight S as a divisor: ⌊(y·a + ⌊S/2⌋)/S⌋ = q·a + ⌊(t·a + ⌊S/2⌋)/S⌋, y = qS + t. */
static inline uint64_t pd_mix_left(uint64_t y, uint64_t a, const pd_divisor *S)
{
    if (!a)
        return 0;
    if (y >> 32 == 0) /* stage positions below 2^32: y·a + ⌊S/2⌋ fits 64 bits, one division */
        return pd_divide(S, y * a + S->d / 2);
    const uint64_t q = pd_divide(S, y), t = y - q * S->d;
    return q * a + pd_divide(S, t * a + S->d / 2);
}

typedef struct pd_mix_part {
    uint64_t draw;                    /* run draw of its first slot */
    uint32_t component, slot, count;  /* slots [slot, slot + count) of its block */
} pd_mix_part;

typedef struct pd_mix_seen {
    uint64_t chunk;   /* the chunk that last touched the component (+ 1; 0: never) */
    uint64_t lo, hi;  /* dense: its draws in the chunk, [lo, hi); sparse: its reads' bucket, [lo, hi) */
    uint64_t scratch; /* dense: where the ids of [lo, hi) start in the scratch */
} pd_mix_seen;

typedef struct pd_mix_last {
    uint64_t batch;  /* the batch it is valid in (+ 1; 0: none) */
    uint64_t lo, hi; /* the draws of its component epoch, [lo, hi) */
    uint32_t run;
} pd_mix_last;

/* A node's left(y) kept for the next block: its y0 is this block's y1 (consecutive blocks of one stage). */
typedef struct pd_mix_memo {
    uint64_t y, left;
} pd_mix_memo;

/* An internal node of the tree in preorder (pd_mix_stage_divisors): its left child's weight, its divisor at
 * node[node], its own index and its right child's in the counts' array (its left child's is at + 1). */
typedef struct pd_mix_flat {
    uint64_t a;
    uint32_t node, at, right;
} pd_mix_flat;

#define PD_MIX_FLAT_MAX 64u /* up to this C, a block's parts come from every component's count (pd_mix_counts) */
#define PD_MIX_COUNTS 32u   /* blocks whose counts pd_mix_counts computes at once */
_Static_assert(PD_MIX_COUNTS * PD_MIX_BLOCK_MAX <= 1u << 16, "pd_mix_counts: y_i − y_0 ≤ 2^16");

typedef struct pd_mix_work {
    pd_mix_seen *seen;   /* C */
    uint32_t *present;   /* components touched in this chunk */
    uint32_t npresent;
    uint32_t *slot;      /* the slot of each read of the chunk */
    uint64_t span;       /* dense: run positions per chunk (whole blocks, at most PD_MIX_DENSE_CHUNK) */
    pd_mix_part *parts;  /* dense: the chunk's blocks' parts, block after block; sparse: one block's */
    uint32_t *first;     /* dense: block b's parts are [first[b], first[b + 1]) */
    void *scratch;       /* dense: the ids of each component's range, `sw` bytes each */
    void *by_slot;       /* dense: one block's global ids in slot order, `sw` bytes each */
    unsigned sw;         /* dense: 4 where the output is u32 (every id fits), else 8: σ writes half the bytes */
    int layout64;        /* dense, u32, B = 64 on AVX-512: blocks laid out in registers (pd__layout64_avx512) */
    pd_isa isa;          /* the generator's: pd_mix_counts by pd__counts_node_avx512 or _avx2 (W = 8 on Zen 3, the
                          * scalar divisions were 5.7% of a read) */
    uint64_t align;      /* dense: each component's range in the scratch starts at a multiple of this many ids */
    uint32_t *comp;      /* sparse: each read's component */
    uint64_t *draw;      /* sparse: its run draw */
    uint32_t *order;     /* sparse: the reads grouped by component */
    uint64_t *at;        /* sparse: the positions gathered, then their ids */
    uint32_t *index;     /* sparse: their reads */
    pd_divisor *node;    /* the current stage's node weights as divisors (C − 1, at mid − 1) */
    uint64_t node_stage; /* the stage they are for (UINT64_MAX: none yet) */
    pd_mix_memo *memo;   /* per node (at mid − 1): its last left(y) for y = a block's end, in node_stage */
    pd_mix_flat *flat;   /* C ≤ PD_MIX_FLAT_MAX (else NULL): the internal nodes in preorder (C − 1) */
    uint32_t *leaf;      /* flat: leaf j's index in y (C) */
    uint64_t *y;         /* flat: what each node receives at PD_MIX_COUNTS + 1 block starts (node-major) */
    uint64_t cnt_x;      /* flat: the stage position of y's first block start (UINT64_MAX: none), in node_stage */
    pd_divisor *size;    /* the components' sizes as divisors (sparse; set when first touched) */
    int by_runs;         /* sparse: σ of flat components of 2 to 2^32 samples through batches of runs */
    uint8_t *grouped;    /* by runs: 1 for each component whose reads go by groups instead (sharded, or flat
                            outside 2 to 2^32); NULL where there is none */
    uint32_t *pick;      /* by runs, grouped: the chunk's reads of those components */
    uint32_t npick;
    uint32_t *bidx;      /* by runs, grouped: each batch item's read */
    pd_mix_last *last;   /* by runs: each component's latest run (C) */
    uint64_t batches;    /* by runs: batches flushed so far, in every chunk (pd_mix_last's ids stay unique) */
    uint32_t *bv;        /* by runs: a batch's positions, then samples (PD__BATCH_ITEMS) */
    uint8_t *brun;       /* by runs: each item's run */
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
    free(w->comp);
    free(w->draw);
    free(w->order);
    free(w->at);
    free(w->index);
    free(w->node);
    free(w->memo);
    free(w->flat);
    free(w->leaf);
    free(w->y);
    free(w->size);
    free(w->last);
    free(w->bv);
    free(w->brun);
    free(w->grouped);
    free(w->pick);
    free(w->bidx);
}

/* Whether the batch kernel runs a component's σ: flat, of 2 to 2^32 samples. */
static int pd_mix_runnable(const pd_mix_component *comp)
{
    return !comp->shard_start && comp->size >= 2 && comp->size <= UINT64_C(1) << 32;
}

/* Reads per sparse chunk on g. */
static uint64_t pd_mix_sparse_reads(const pd_gen *g)
{
    return g->isa == PD_ISA_AVX2 ? PD_MIX_SPARSE_CHUNK_AVX2 : PD_MIX_SPARSE_CHUNK;
}

/* For `reads` reads at stride `world`: dense chunks span the blocks they touch, at most PD_MIX_DENSE_CHUNK
 * positions; sparse ones take at most pd_mix_sparse_reads(g) reads. Sized by the request, so that a small one
 * stays below malloc's mmap threshold (no page faults per request on the daemon). */
static int pd_mix_work_alloc(pd_mix_work *w, const pd_gen *g, const pd_mix *m, int dense, uint64_t reads,
                             uint64_t world, unsigned width)
{
    const uint64_t C = m->components, B = m->block;
    memset(w, 0, sizeof *w);
    w->isa = g->isa;
    if (dense) { /* the reads' blocks span at most (reads − 1)·W + B positions from the first one's start */
        const uint64_t need = ((reads - 1) * world + 2 * B - 1) & ~(B - 1);
        w->span = need < PD_MIX_DENSE_CHUNK ? need : PD_MIX_DENSE_CHUNK;
        reads = w->span + B; /* a dense chunk ends with the block of its last read */
    } else if (reads > pd_mix_sparse_reads(g)) {
        reads = pd_mix_sparse_reads(g);
    }
    const uint64_t blocks = w->span / B + 1;
    w->seen = calloc(C, sizeof *w->seen);
    w->present = malloc(C * sizeof *w->present);
    w->slot = malloc(reads * sizeof *w->slot);
    w->node = malloc(C * sizeof *w->node);
    w->memo = malloc(C * sizeof *w->memo);
    w->node_stage = UINT64_MAX;
    int ok = w->seen && w->present && w->slot && w->node && w->memo;
    if (C <= PD_MIX_FLAT_MAX) {
        w->flat = malloc(C * sizeof *w->flat);
        w->leaf = malloc(C * sizeof *w->leaf);
        w->y = malloc(2 * C * (PD_MIX_COUNTS + 1) * sizeof *w->y);
        ok = ok && w->flat && w->leaf && w->y;
    }
    if (dense) {
        w->parts = malloc(blocks * (C < B ? C : B) * sizeof *w->parts);
        w->first = malloc((blocks + 1) * sizeof *w->first);
        w->sw = width;
        w->layout64 = g->isa == PD_ISA_AVX512 && B == 64 && width == 4;
        /* Few components (most mixtures): each range starts on a 64-byte line, so that σ's vector stores do
         * not straddle two; the padding is at most 15 ids a component. */
        w->align = C <= PD_MIX_FLAT_MAX ? 64 / width : 1;
        const uint64_t ids = w->span + B + (w->align > 1 ? C * w->align : 0);
        w->scratch = aligned_alloc(64, (ids * width + 63) & ~(uint64_t)63);
        w->by_slot = malloc(B * width);
        ok = ok && w->parts && w->first && w->scratch && w->by_slot;
    } else {
        w->comp = malloc(reads * sizeof *w->comp);
        w->draw = malloc(reads * sizeof *w->draw);
        w->order = malloc(reads * sizeof *w->order);
        w->at = malloc(reads * sizeof *w->at);
        w->index = malloc(reads * sizeof *w->index);
        w->size = calloc(C, sizeof *w->size);
        w->parts = malloc((C < B ? C : B) * sizeof *w->parts);
        ok = ok && w->comp && w->draw && w->order && w->at && w->index && w->size && w->parts;
        /* Components the batch kernel runs (flat, 2 to 2^32 samples) by runs, the others by groups, where
         * there is at least one of the former. AVX2's batch kernel (8 runs, vpermd per round) loses to its
         * gather. */
        uint64_t runnable = 0;
        for (uint64_t j = 0; j < C; j++)
            runnable += pd_mix_runnable(&m->comp[j]);
        w->by_runs = g->isa != PD_ISA_AVX2 && runnable;
        if (w->by_runs && runnable < C) {
            w->grouped = malloc(C);
            w->pick = malloc(reads * sizeof *w->pick);
            w->bidx = malloc(PD__BATCH_ITEMS * sizeof *w->bidx);
            ok = ok && w->grouped && w->pick && w->bidx;
            for (uint64_t j = 0; ok && j < C; j++)
                w->grouped[j] = !pd_mix_runnable(&m->comp[j]);
        }
        if (w->by_runs) {
            w->last = calloc(C, sizeof *w->last);
            w->bv = malloc(PD__BATCH_ITEMS * sizeof *w->bv);
            w->brun = malloc(PD__BATCH_ITEMS + 16); /* + 16: pd__block_reads_avx512 stores whole vectors */
            ok = ok && w->last && w->bv && w->brun;
        }
    }
    if (ok)
        return PD_OK;
    pd_mix_work_free(w);
    return PD_ENOMEM;
}

/* Whether the slots come from whole-block groups (pd__block_group_*): they compute every slot of the blocks
 * the rank reads, so they pay while a block has many reads (W small). Measured (bench/mixtures, and one core of
 * the 2-vCPU Xeon): the kernels keying each read win from W = 2 with VBMI, from W = 8 on AVX-512 without it
 * and on AVX2. */
static int pd_mix_by_groups(const pd_gen *g, const pd_mix *m, uint64_t world)
{
    if (m->block > PD__BLOCK_GROUP_MAX_B)
        return 0;
#if defined(PD_CPU_HAVE_AVX512)
    if (g->isa == PD_ISA_AVX512)
        return world <= (g->vbmi ? PD_MIX_GROUPS_WORLD_VBMI : PD_MIX_GROUPS_WORLD_AVX512);
#endif
#if defined(PD_CPU_HAVE_AVX2)
    if (g->isa == PD_ISA_AVX2)
        return world <= PD_MIX_GROUPS_WORLD_AVX2;
#endif
    (void)g;
    (void)world;
    return 0;
}

/* The slots of reads at run positions g0 + t·W, t < n, from their blocks' groups. */
static void pd_mix_slots_by_groups(const pd_gen *g, const pd_mix *m, uint64_t g0, uint64_t world, uint64_t n,
                                   uint32_t *slot)
{
    uint8_t tab[PD__BLOCK_GROUP * PD__BLOCK_GROUP_MAX_B];
    const uint64_t B = m->block;
    for (uint64_t t = 0; t < n;) {
        const pd__block_group grp = {.seed = m->seed, .block = B, .first = (g0 + t * world) >> m->block_bits, .out = tab};
        pd__block_group_run(g, &grp);
        const uint64_t base = grp.first * B, span = PD__BLOCK_GROUP * B; /* the run positions it covers */
        for (uint64_t at = g0 + t * world - base; t < n && at < span;) {
            if (world == 1 && (at & (B - 1)) == 0 && n - t >= B) { /* a whole block: its slots four by four */
                const uint8_t *from = tab + pd__block_group_at((uint32_t)(at >> m->block_bits), 0);
                uint32_t *to = slot + t;
                for (uint64_t r = 0; r < B; r += 4, from += 4 * PD__BLOCK_GROUP)
                    for (int k = 0; k < 4; k++)
                        to[r + k] = from[k];
                t += B;
                at += B;
                continue;
            }
            const uint32_t i = pd__block_group_at((uint32_t)(at >> m->block_bits), (uint32_t)at & (uint32_t)(B - 1));
            if (world == 1 && (at & 3) == 0 && n - t >= 4) { /* four consecutive slots of a block sit together */
                for (int k = 0; k < 4; k++)
                    slot[t + k] = tab[i + k];
                t += 4;
                at += 4;
            } else {
                slot[t++] = tab[i];
                at += world;
            }
        }
    }
}

/* The slots of reads at run positions g0 + t·W, t < n: whole-block groups, or a kernel keying each read by
 * its block (pd__block_slots_run). */
static void pd_mix_slots(const pd_gen *g, const pd_mix *m, uint64_t g0, uint64_t world, uint64_t n, uint32_t *slot)
{
    if (n && pd_mix_by_groups(g, m, world)) {
        pd_mix_slots_by_groups(g, m, g0, world, n, slot);
        return;
    }
    const pd__block_slots s = {.seed = m->seed, .block = m->block, .first = g0, .stride = world, .count = n, .out = slot};
    pd__block_slots_run(g, &s);
}

/* ids[i] = σ(positions[i]) of a flat component's order, i < n (gathered), but for the parity correction: the
 * caller's stores apply it (pd__unflip), where a pass of its own cost ~2% of a W = 8 read. */
static void pd_mix_gather(const pd_gen *g, const pd_perm *order, const uint64_t *positions, uint64_t n,
                          uint64_t *ids)
{
    const pd__run run = {.perm = order, .count = n, .out = ids, .width = 8, .walk = g->walk, .unflipped = 1};
    pd__gather_run(g, &run, positions);
}

static void pd_mix_store(void *out, unsigned width, uint64_t i, uint64_t id)
{
    if (width == 4)
        ((uint32_t *)out)[i] = (uint32_t)id;
    else
        ((uint64_t *)out)[i] = id;
}

/* Stage k's internal nodes' weights as divisors, at node[mid − 1] (every internal node splits at its own mid),
 * and for small C (w->flat) the tree in preorder for pd_mix_counts: node [lo, hi) at index i has its left
 * child at i + 1 and its right one at i + 2·(mid − lo); leaf j at leaf[j]. */
static void pd_mix_stage_divisors(const pd_mix *m, uint64_t k, pd_mix_work *w)
{
    const uint32_t *cw = m->cum + k * (m->components + 1);
    struct {
        uint64_t lo, hi;
        uint32_t at;
    } stack[PD_MIX_DEPTH_MAX + 2];
    int top = 0;
    uint32_t internal = 0;
    stack[0].lo = 0;
    stack[0].hi = m->components;
    stack[0].at = 0;
    while (top >= 0) {
        const uint64_t lo = stack[top].lo, hi = stack[top].hi, mid = lo + (hi - lo) / 2;
        const uint32_t at = stack[top].at;
        top--;
        if (hi - lo < 2) {
            if (w->flat)
                w->leaf[lo] = at;
            continue;
        }
        pd_divisor_init(&w->node[mid - 1], cw[hi] - cw[lo] ? cw[hi] - cw[lo] : 1); /* weight 0: never divided by */
        if (w->flat)
            w->flat[internal++] = (pd_mix_flat){.a = cw[mid] - cw[lo], .node = (uint32_t)(mid - 1), .at = at,
                                                .right = at + 2 * (uint32_t)(mid - lo)};
        stack[++top].lo = mid; /* right after left: preorder */
        stack[top].hi = hi;
        stack[top].at = at + 2 * (uint32_t)(mid - lo);
        stack[++top].lo = lo;
        stack[top].hi = mid;
        stack[top].at = at + 1;
    }
}

/* What every node receives at the PD_MIX_COUNTS + 1 stage positions x + i·B, into w->y (node-major, row i):
 * leaf j's are count_j (spec §4). Node by node, the positions side by side, so the divisions of one node
 * overlap. A node's first position y_0 takes pd_mix_left (two divisions from y = 2^32 on, and run positions
 * pass 2^32 early) and its remainder r_0 = (y_0·a + ⌊S/2⌋) − left(y_0)·S < S (mod 2^64: no division); then
 * left(y_i) = left(y_0) + ⌊(r_0 + (y_i − y_0)·a)/S⌋, one division a position on a numerator below 2^49
 * (y_i − y_0 ≤ PD_MIX_COUNTS·B ≤ 2^16: a node receives at most what its parent does), with no branch. */
static void pd_mix_counts(const pd_mix *m, pd_mix_work *w, uint64_t x)
{
    const uint64_t B = m->block, R = PD_MIX_COUNTS + 1;
    uint64_t *y = w->y;
    for (uint64_t i = 0; i < R; i++)
        y[i] = x + i * B;
    for (uint64_t n = 0; n + 1 < m->components; n++) { /* parents before children */
        const pd_mix_flat *f = &w->flat[n];
        const pd_divisor S = w->node[f->node];
        const uint64_t a = f->a, *in = y + f->at * R;
        uint64_t *restrict left = y + (f->at + 1) * R, *restrict right = y + f->right * R;
        const uint64_t y0 = in[0], l0 = pd_mix_left(y0, a, &S);
        const uint64_t r0 = y0 * a + S.d / 2 - l0 * S.d; /* < S, so exact though each term wraps mod 2^64 */
#if defined(PD_CPU_HAVE_AVX512)
        if (w->isa == PD_ISA_AVX512) {
            pd__counts_node_avx512(in, left, right, l0, r0, a, S.d);
            continue;
        }
#endif
#if defined(PD_CPU_HAVE_AVX2)
        if (w->isa == PD_ISA_AVX2) {
            pd__counts_node_avx2(in, left, right, l0, r0, a, S.d);
            continue;
        }
#endif
        for (uint64_t i = 0; i < R; i++) {
            const uint64_t l = l0 + pd_divide(&S, r0 + (in[i] - y0) * a);
            left[i] = l;
            right[i] = in[i] - l;
        }
    }
    w->cnt_x = x;
}

/* pd__mix_descend on the node divisors (the same walk; the core's is the reference, test_cpu_mix compares). */
static inline void pd_mix_descend(const pd_mix *m, const pd_divisor *node, uint64_t k, uint64_t x0, uint64_t q,
                                  uint64_t *component, uint64_t *stage_draw)
{
    const uint32_t *cw = m->cum + k * (m->components + 1);
    uint64_t lo = 0, hi = m->components, y0 = x0, y1 = x0 + m->block;
    while (hi - lo > 1) { /* without branches on the slot: reads of random slots would mispredict half of them */
        const uint64_t mid = lo + (hi - lo) / 2, a = cw[mid] - cw[lo];
        const uint64_t l0 = pd_mix_left(y0, a, &node[mid - 1]), l1 = pd_mix_left(y1, a, &node[mid - 1]);
        const uint64_t left = q < l1 - l0;
        q -= left ? 0 : l1 - l0;
        lo = left ? lo : mid;
        hi = left ? mid : hi;
        y0 = left ? l0 : y0 - l0;
        y1 = left ? l1 : y1 - l1;
    }
    *component = lo;
    *stage_draw = y0 + q;
}

/* Component j first touched in this chunk: it joins the present list. */
static pd_mix_seen *pd_mix_seen_touch(pd_mix_work *w, uint64_t chunk, uint64_t j, uint64_t lo)
{
    pd_mix_seen *s = &w->seen[j];
    if (s->chunk != chunk) {
        s->chunk = chunk;
        s->lo = s->hi = lo;
        w->present[w->npresent++] = (uint32_t)j;
    }
    return s;
}

/* Advance *k to the stage of run position g (positions only grow), with its node divisors. */
static void pd_mix_stage_at(const pd_mix *m, pd_mix_work *w, uint64_t *k, uint64_t g)
{
    while (*k + 1 < m->stages && m->start[*k + 1] <= g)
        (*k)++;
    if (w->node_stage != *k) {
        pd_mix_stage_divisors(m, *k, w);
        for (uint64_t i = 0; i < m->components; i++)
            w->memo[i].y = UINT64_MAX; /* no stage position is */
        w->cnt_x = UINT64_MAX;
        w->node_stage = *k;
    }
}

/* ---- Dense chunks */

/* The parts of the block at stage position x0 of stage k (spec §5): its components with slots, in slot order,
 * each with its slot range and first run draw; returns how many (≤ min(C, B)).
 *
 * Large C: the tree walked depth first (an explicit stack), skipping empty subtrees. */
static uint32_t pd_mix_block_walk(const pd_mix *m, pd_mix_work *w, uint64_t k, uint64_t x0, pd_mix_part *parts)
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
            const uint64_t draw = P[f.lo] + f.y0;
            parts[n++] = (pd_mix_part){draw, (uint32_t)f.lo, (uint32_t)f.slot, (uint32_t)(f.y1 - f.y0)};
            continue;
        }
        const uint64_t mid = f.lo + (f.hi - f.lo) / 2, a = cw[mid] - cw[f.lo];
        pd_mix_memo *memo = &w->memo[mid - 1]; /* the block before ended where this one starts: one division */
        const uint64_t l0 = memo->y == f.y0 ? memo->left : pd_mix_left(f.y0, a, &w->node[mid - 1]);
        const uint64_t l1 = pd_mix_left(f.y1, a, &w->node[mid - 1]);
        *memo = (pd_mix_memo){f.y1, l1};
        stack[++top] = (struct frame){mid, f.hi, f.y0 - l0, f.y1 - l1, f.slot + (l1 - l0)}; /* right after left */
        stack[++top] = (struct frame){f.lo, mid, l0, l1, f.slot};
    }
    return n;
}

/* Small C (w->flat): every component's count at the block's end less that at its start, from counts of
 * PD_MIX_COUNTS consecutive blocks computed at once. */
static uint32_t pd_mix_block_counts(const pd_mix *m, pd_mix_work *w, uint64_t k, uint64_t x0, pd_mix_part *parts)
{
    const uint64_t *P = m->drawn + k * m->components, R = PD_MIX_COUNTS + 1;
    if (w->cnt_x > x0 || x0 - w->cnt_x >= PD_MIX_COUNTS * m->block) /* both block starts: a multiple of B apart */
        pd_mix_counts(m, w, x0);
    const uint64_t i = (x0 - w->cnt_x) >> m->block_bits;
    uint32_t n = 0, slot = 0;
    for (uint64_t j = 0; j < m->components; j++) {
        const uint64_t *leaf = w->y + w->leaf[j] * R + i;
        const uint32_t c = (uint32_t)(leaf[1] - leaf[0]);
        if (c)
            parts[n++] = (pd_mix_part){P[j] + leaf[0], (uint32_t)j, slot, c};
        slot += c;
    }
    return n;
}

static uint32_t pd_mix_block_parts(const pd_mix *m, pd_mix_work *w, uint64_t k, uint64_t x0, pd_mix_part *parts)
{
    return w->flat ? pd_mix_block_counts(m, w, k, x0, parts) : pd_mix_block_walk(m, w, k, x0, parts);
}

/* Dense step 2: the local ids of every component's range, into the scratch. */
static void pd_mix_ranges(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w)
{
    const pd_mix *m = c->mix;
    uint64_t at = 0;
    for (uint32_t p = 0; p < w->npresent; p++) {
        const uint32_t j = w->present[p];
        pd_mix_seen *s = &w->seen[j];
        const pd_mix_component *comp = &m->comp[j];
        char *ids = (char *)w->scratch + at * w->sw;
        s->scratch = at;
        for (uint64_t d = s->lo; d < s->hi;) { /* one run per component epoch */
            const uint64_t e = d / comp->size, u = d % comp->size;
            const uint64_t n = comp->size - u < s->hi - d ? comp->size - u : s->hi - d;
            const pd_mix_order *o = pd_mix_order_get(c, j, e);
            if (comp->shard_start) { /* the draws u.. are positions u.. of one reader's sharded epoch */
                const pd_slice one = {.world = 1, .mode = PD_MODE_EXACT, .offset = u};
                uint64_t got;
                void *to = ids + (d - s->lo) * w->sw; /* n ≤ size − u, and u32 only if every id fits: no error */
                if (w->sw == 4)
                    pd_gen_shard_slice_fill_u32(g, &o->plan, &one, n, to, &got);
                else
                    pd_gen_shard_slice_fill_u64(g, &o->plan, &one, n, to, &got);
            } else {
                pd__run run = {.perm = &o->perm, .first = u, .stride = 1, .count = n, .out = ids + (d - s->lo) * w->sw,
                               .width = w->sw, .walk = g->walk};
                pd__gen_run(g, &run);
            }
            d += n;
        }
        at = (at + (s->hi - s->lo) + w->align - 1) & ~(uint64_t)(w->align - 1);
    }
}

/* Reads in the block of run position g0 (reads at g0 + t·W), at most left. */
static uint64_t pd_mix_block_count(const pd_mix *m, uint64_t g0, uint64_t world, uint64_t left)
{
    const uint64_t in_block = ((g0 | (m->block - 1)) - g0) / world + 1;
    return in_block < left ? in_block : left;
}

/* Dense step 3 for block i of the chunk: its global ids laid out in slot order (per part: its local ids plus
 * the component's offset), then each of its reads, out[0, reads), takes its slot's. */
static void pd_mix_layout_u32(const pd_mix *m, pd_mix_work *w, uint64_t i, uint32_t *restrict out, uint64_t reads,
                              const uint32_t *restrict slot)
{
#if defined(PD_CPU_HAVE_AVX512)
    if (w->layout64) { /* B = 64 on AVX-512: the block's ids in registers */
        pd__layout_part parts[64];
        unsigned n = 0;
        for (uint32_t p = w->first[i]; p < w->first[i + 1]; p++) {
            const pd_mix_part *part = &w->parts[p];
            const pd_mix_seen *s = &w->seen[part->component];
            parts[n++] = (pd__layout_part){.ids = (const uint32_t *)w->scratch + s->scratch + (part->draw - s->lo),
                                           .slot = part->slot, .count = part->count,
                                           .add = (uint32_t)m->offset[part->component]};
        }
        pd__layout64_avx512(parts, n, slot, reads, out);
        return;
    }
#endif
    uint32_t *restrict by_slot = w->by_slot;
    for (uint32_t p = w->first[i]; p < w->first[i + 1]; p++) {
        const pd_mix_part *part = &w->parts[p];
        const pd_mix_seen *s = &w->seen[part->component];
        const uint32_t *restrict ids = (const uint32_t *)w->scratch + s->scratch + (part->draw - s->lo);
        const uint32_t off = (uint32_t)m->offset[part->component], n = part->count;
        uint32_t *restrict to = by_slot + part->slot;
        for (uint32_t q = 0; q < n; q++)
            to[q] = ids[q] + off;
    }
    for (uint64_t r = 0; r < reads; r++)
        out[r] = by_slot[slot[r]];
}

/* The same for any width: u64 ids, stored as `width` bytes at out[tb, tb + reads). */
static void pd_mix_layout_u64(const pd_mix *m, pd_mix_work *w, uint64_t i, void *out, unsigned width, uint64_t tb,
                              uint64_t reads)
{
    uint64_t *by_slot = w->by_slot;
    for (uint32_t p = w->first[i]; p < w->first[i + 1]; p++) {
        const pd_mix_part *part = &w->parts[p];
        const pd_mix_seen *s = &w->seen[part->component];
        const uint64_t *ids = (const uint64_t *)w->scratch + s->scratch + (part->draw - s->lo);
        const uint64_t off = m->offset[part->component];
        for (uint32_t q = 0; q < part->count; q++)
            by_slot[part->slot + q] = ids[q] + off;
    }
    for (uint64_t r = tb; r < tb + reads; r++)
        pd_mix_store(out, width, r, by_slot[w->slot[r]]);
}

/* One dense chunk: reads from run position g_first on, at most n; returns how many it wrote. */
static uint64_t pd_mix_dense_chunk(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, uint64_t chunk, uint64_t *k,
                                   uint64_t g_first, uint64_t world, uint64_t n, void *out, unsigned width)
{
    const pd_mix *m = c->mix;
    const uint64_t end = (g_first & ~(m->block - 1)) + w->span; /* whole blocks */
    if ((end - g_first - 1) / world + 1 < n)
        n = (end - g_first - 1) / world + 1;
    pd_mix_slots(g, m, g_first, world, n, w->slot);
    uint64_t t = 0, b = 0;
    w->npresent = 0;
    w->first[0] = 0;
    for (; t < n; b++) { /* step 1 */
        const uint64_t g0 = g_first + t * world;
        pd_mix_stage_at(m, w, k, g0);
        const uint64_t x0 = (g0 & ~(m->block - 1)) - m->start[*k];
        w->first[b + 1] = w->first[b] + pd_mix_block_parts(m, w, *k, x0, w->parts + w->first[b]);
        for (uint32_t p = w->first[b]; p < w->first[b + 1]; p++) { /* each part extends its component's range */
            const pd_mix_part *part = &w->parts[p];
            pd_mix_seen_touch(w, chunk, part->component, part->draw)->hi = part->draw + part->count;
        }
        t += pd_mix_block_count(m, g0, world, n - t);
    }
    pd_mix_ranges(g, c, w); /* step 2 */
    for (uint64_t i = 0, tb = 0; i < b; i++) { /* step 3 */
        const uint64_t reads = pd_mix_block_count(m, g_first + tb * world, world, n - tb);
        if (w->sw == 4) /* u32 throughout (the output's width: every global id fits) */
            pd_mix_layout_u32(m, w, i, (uint32_t *)out + tb, reads, w->slot + tb);
        else
            pd_mix_layout_u64(m, w, i, out, width, tb, reads);
        tb += reads;
    }
    return n;
}

/* ---- Sparse chunks */

/* The ids of component j's reads order[a, b) (all of one component epoch e): gathered, then stored. */
static void pd_mix_sparse_batch(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, uint64_t j, uint64_t e,
                                uint64_t n, void *out, unsigned width)
{
    const pd_mix *m = c->mix;
    const pd_mix_order *o = pd_mix_order_get(c, j, e);
    uint32_t flip = 0; /* a flat gather's parity correction, applied by the stores */
    if (m->comp[j].shard_start) {
        /* Its draws, ascending from block to block: each stretch in one window is one gather (a σ evaluation and
         * a slot lookup a read). Computing every position of their span on the shard kernel and keeping the
         * reads cost W evaluations a read: 10,000 shards, K = 8, W = 8, one core of a 2-vCPU EPYC (AVX2):
         * 22 against 54 M mixture ids/s (bench/results/mixtures.md). */
        pd_gen_shard_gather_u64(g, &o->plan, w->at, n);
    } else {
        pd_mix_gather(g, &o->perm, w->at, n, w->at); /* in place: each lane reads its position first */
        flip = o->perm.n >= 2 ? o->perm.keys.flip : 0;
    }
    if (width == 4) { /* every id fits 32 bits: so does the sum */
        uint32_t *ids = out;
        const uint32_t off = (uint32_t)m->offset[j];
        for (uint64_t i = 0; i < n; i++)
            ids[w->index[i]] = off + ((uint32_t)w->at[i] ^ (flip & (w->at[i] < 2)));
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        pd_mix_store(out, width, w->index[i], m->offset[j] + (w->at[i] ^ (flip & (w->at[i] < 2))));
}

/* Component j's reads reads[0, n) of a sparse chunk (read order) in batches of one component epoch each: a division
 * per read, a batch where the epoch changes. reads may be w->index (each is read before its slot is written). */
static void pd_mix_epoch_batches(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, uint32_t j, const uint32_t *reads,
                                 uint64_t n, void *out, unsigned width)
{
    const pd_divisor *size = &w->size[j];
    uint64_t nb = 0, e = 0;
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t t = reads[i];
        const uint64_t ei = pd_divide(size, w->draw[t]);
        if (nb && ei != e) {
            pd_mix_sparse_batch(g, c, w, j, e, nb, out, width);
            nb = 0;
        }
        e = ei;
        w->at[nb] = w->draw[t] - ei * size->d;
        w->index[nb++] = t;
    }
    if (nb)
        pd_mix_sparse_batch(g, c, w, j, e, nb, out, width);
}

/* The weight tree's depth, ⌈log2 C⌉: the internal nodes on the longest path from the root to a leaf. */
static uint64_t pd_mix_depth(const pd_mix *m)
{
    return m->components > 1 ? pd_bit_width(m->components - 1) : 0;
}

/* Whether a sparse fill takes each block's parts (pd_mix_block_parts) rather than descending once per read:
 * a descent costs 2·⌈log2 C⌉ divisions, a block's parts C − 1 for small C (consecutive blocks, as when W ≤ B),
 * else a walk of up to C − 1 nodes at 2 each. */
static int pd_mix_by_parts(const pd_mix *m, uint64_t world)
{
    const uint64_t depth = pd_mix_depth(m);
    if (m->components <= PD_MIX_FLAT_MAX)
        return world <= m->block && m->components - 1 <= 2 * depth * (m->block / world);
    return world < m->block && m->components - 1 <= m->block / world * depth;
}

/* The index in parts[0, n) (in slot order, covering the block) of the part holding slot q: the last whose
 * first slot ≤ q. */
static inline uint32_t pd_mix_part_index(const pd_mix_part *parts, uint32_t n, uint32_t q)
{
    if (n <= 8) { /* a few parts: count the starts ≤ q, each compare independent of the others */
        uint32_t i = 0;
        for (uint32_t p = 1; p < n; p++)
            i += parts[p].slot <= q;
        return i;
    }
    uint32_t lo = 0;
    while (n > 1) {
        const uint32_t half = n / 2;
        lo = parts[lo + half].slot <= q ? lo + half : lo;
        n -= half;
    }
    return lo;
}

static inline const pd_mix_part *pd_mix_part_of(const pd_mix_part *parts, uint32_t n, uint32_t q)
{
    return &parts[pd_mix_part_index(parts, n, q)];
}

/* Whether sparse runs go a block at a time (pd_mix_runs_block): by parts, with more reads a block than
 * components. */
static int pd_mix_blockwise(const pd_mix *m, int by_parts, uint64_t world)
{
    return by_parts && m->block / world > m->components;
}

/* How sparse reads find their component and draw: in their block's parts (pd_mix_by_parts), walked once per
 * block, or by a descent of the tree per read. */
typedef struct pd_mix_reader {
    uint64_t block;  /* the block whose parts w->parts holds (UINT64_MAX: none yet) */
    uint32_t nparts;
} pd_mix_reader;

/* The component *j and run draw *d of the read at run position g0 whose slot is q (positions only grow);
 * by_parts as pd_mix_by_parts gave it. Inlined into each loop, which the compiler splits on by_parts. */
static inline __attribute__((always_inline)) void pd_mix_read(const pd_mix *m, pd_mix_work *w, pd_mix_reader *rd,
                                                              const int by_parts, uint64_t *k, uint64_t g0,
                                                              uint32_t q, uint64_t *j, uint64_t *d)
{
    const uint64_t block = g0 & ~(m->block - 1);
    if (by_parts) {
        if (block != rd->block) {
            rd->block = block;
            pd_mix_stage_at(m, w, k, g0);
            rd->nparts = pd_mix_block_parts(m, w, *k, block - m->start[*k], w->parts);
        }
        const pd_mix_part *part = pd_mix_part_of(w->parts, rd->nparts, q);
        *j = part->component;
        *d = part->draw + (q - part->slot);
        return;
    }
    pd_mix_stage_at(m, w, k, g0);
    pd_mix_descend(m, w->node, *k, block - m->start[*k], q, j, d);
    *d += m->drawn[*k * m->components + *j];
}

/* A batch of runs: count items, item i read start + i of the chunk, or read idx[i] where some components go
 * by groups (w->bidx). */
typedef struct pd_mix_runs {
    pd__batch b;
    uint64_t comp[PD__BATCH_RUNS], epoch[PD__BATCH_RUNS];
    uint64_t start, count, id; /* id: this batch's number (+ 1), for pd_mix_last */
    const uint32_t *idx;
} pd_mix_runs;

#define PD_MIX_RUN_GROUPED 0xffu /* pd_mix_runs_block: a part of a component that goes by groups */

/* The batch's ids (pd__batch_ids) by g's kernel. */
static void pd_batch_ids(const pd_gen *g, const pd__batch_ids *x)
{
    switch (g->isa) {
#if defined(PD_CPU_HAVE_AVX512)
    case PD_ISA_AVX512:
        pd__batch_ids_avx512(x);
        return;
#endif
    default:
        for (uint64_t i = 0; i < x->count; i++)
            pd__batch_id_store(x, i);
    }
}

/* σ of the batch's items in place (every lane its own component order), then each read's global id. */
static void pd_mix_runs_flush(const pd_gen *g, const pd_mix *m, pd_mix_runs *r, void *out, unsigned width)
{
    uint64_t offset[PD__BATCH_RUNS];
    uint32_t flip[PD__BATCH_RUNS];
    r->b.count = (uint32_t)r->count;
    if (r->count)
        pd__batch_run(g, &r->b);
    for (unsigned i = 0; i < r->b.nruns; i++) {
        offset[i] = m->offset[r->comp[i]];
        flip[i] = r->b.perm[i]->keys.flip;
    }
    const pd__batch_ids ids = {.v = r->b.v, .run = r->b.run, .count = r->count, .add = offset, .flip = flip,
                               .nruns = r->b.nruns, .out = (char *)out + r->start * width, .width = width};
    if (r->idx) /* reads of some components left for the groups: each id to its read */
        for (uint64_t i = 0; i < r->count; i++)
            pd_mix_store(out, width, r->idx[i], pd__batch_id(&ids, i));
    else
        pd_batch_ids(g, &ids);
    r->start += r->count;
    r->count = 0;
    r->b.nruns = 0;
    r->id++;
}

/* The run of component j's component epoch e in the batch: found, or added (after a flush when the batch
 * has as many runs as the kernel takes, or holds j's epoch of the same parity, whose order the cursor would
 * replace). */
static uint32_t pd_mix_runs_get(const pd_gen *g, pd_mix_cursor *c, pd_mix_runs *r, uint64_t j, uint64_t e,
                                void *out, unsigned width)
{
    const unsigned cap = pd__batch_max_runs(g, 0); /* components are wide */
    for (unsigned i = 0; i < r->b.nruns; i++) {
        if (r->comp[i] != j || (r->epoch[i] ^ e) & 1)
            continue;
        if (r->epoch[i] == e)
            return i;
        pd_mix_runs_flush(g, c->mix, r, out, width);
        break;
    }
    if (r->b.nruns == cap)
        pd_mix_runs_flush(g, c->mix, r, out, width);
    const unsigned i = r->b.nruns++;
    r->comp[i] = j;
    r->epoch[i] = e;
    r->b.perm[i] = &pd_mix_order_get(c, j, e)->perm;
    return i;
}

/* The run of read draw d of component j in the batch (pd_mix_last caches it per component): found, or added
 * (which may flush the batch). */
static inline __attribute__((always_inline)) const pd_mix_last *
pd_mix_runs_of(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, pd_mix_runs *r, uint64_t j, uint64_t d, void *out,
               unsigned width)
{
    pd_mix_last *last = &w->last[j];
    if (last->batch != r->id || d < last->lo || d >= last->hi) { /* another component epoch, or batch */
        pd_divisor *size = &w->size[j];
        if (!size->d)
            pd_divisor_init(size, c->mix->comp[j].size);
        const uint64_t e = pd_divide(size, d);
        const uint32_t run = pd_mix_runs_get(g, c, r, j, e, out, width);
        *last = (pd_mix_last){.batch = r->id, .lo = e * size->d, .hi = (e + 1) * size->d, .run = run};
    }
    return last;
}

/* Read t, of component j at run draw d, left for the groups (pd_mix_sparse_groups) after the runs. */
static inline void pd_mix_pick(pd_mix_work *w, uint64_t t, uint64_t j, uint64_t d)
{
    w->comp[t] = (uint32_t)j;
    w->draw[t] = d;
    w->pick[w->npick++] = (uint32_t)t;
}

/* The nb reads from t on, all in the block whose parts rd holds: each part's run resolved once (again if
 * that flushed the batch, which then holds this block's runs only), then a lookup per read. 0, adding
 * nothing, where a part's draws cross a component epoch or the block has more parts than a batch runs. */
static inline __attribute__((always_inline)) int pd_mix_runs_block(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w,
                                                                   pd_mix_runs *r, const int grouped,
                                                                   const pd_mix_reader *rd, uint64_t t, uint64_t nb,
                                                                   void *out, unsigned width)
{
    uint32_t base[PD__BATCH_RUNS], start[PD__BATCH_RUNS], run[PD__BATCH_RUNS];
    if (rd->nparts > pd__batch_max_runs(g, 0))
        return 0;
    if (r->count + nb > PD__BATCH_ITEMS)
        pd_mix_runs_flush(g, c->mix, r, out, width);
    for (int pass = 0;; pass++) {
        const uint64_t id = r->id;
        for (uint32_t p = 0; p < rd->nparts; p++) {
            const pd_mix_part *part = &w->parts[p];
            if (grouped && w->grouped[part->component]) {
                run[p] = PD_MIX_RUN_GROUPED;
                base[p] = 0;
                continue;
            }
            const pd_mix_last *last = pd_mix_runs_of(g, c, w, r, part->component, part->draw, out, width);
            if (part->draw + part->count > last->hi)
                return 0;
            run[p] = last->run;
            base[p] = (uint32_t)(part->draw - last->lo) - part->slot; /* + the slot: the draw's position */
            start[p] = part->slot;
        }
        if (r->id == id)
            break;
        if (pass) /* cannot happen: a fresh batch takes every part */
            return 0;
    }
    /* Locals: a store through brun (bytes) may alias anything, so the fields would be reloaded per read. */
    const pd_mix_part *parts = w->parts;
    const uint32_t *slot = w->slot + t, nparts = rd->nparts;
    uint32_t *bv = w->bv + r->count;
    uint8_t *brun = w->brun + r->count;
    if (grouped) { /* each read stored both ways, kept by one: the components interleave at random */
        uint32_t *bidx = w->bidx + r->count, *pick = w->pick, added = 0, npick = w->npick;
        uint32_t *comp = w->comp;
        uint64_t *draw = w->draw;
        for (uint64_t i = 0; i < nb; i++) {
            const uint32_t q = slot[i], p = pd_mix_part_index(parts, nparts, q), by_groups = run[p] == PD_MIX_RUN_GROUPED;
            comp[t + i] = parts[p].component;
            draw[t + i] = parts[p].draw + (q - parts[p].slot);
            pick[npick] = (uint32_t)(t + i);
            npick += by_groups;
            bv[added] = base[p] + q;
            brun[added] = (uint8_t)run[p];
            bidx[added] = (uint32_t)(t + i);
            added += !by_groups;
        }
        w->npick = npick;
        r->count += added;
        return 1;
    }
#if defined(PD_CPU_HAVE_AVX512)
    if (g->isa == PD_ISA_AVX512) { /* (AVX2 never comes here: it gathers reads by component) */
        const pd__block_reads x = {.slot = slot, .count = nb, .start = start, .base = base, .runs = run,
                                   .nparts = nparts, .v = bv, .run = brun};
        pd__block_reads_avx512(&x);
        r->count += nb;
        return 1;
    }
#endif
    for (uint64_t i = 0; i < nb; i++) {
        const uint32_t q = slot[i], p = pd_mix_part_index(parts, nparts, q);
        bv[i] = base[p] + q;
        brun[i] = (uint8_t)run[p];
    }
    r->count += nb;
    return 1;
}

#define PD_MIX_SEGMENT_COMPONENTS 16u /* components a segment's tables hold (pd_mix_segment_slots) */
_Static_assert(PD_MIX_COUNTS == PD__SEGMENT_BLOCKS, "a segment is one batch of counts");

/* Whether sparse reads may go a segment of blocks at a time (pd_mix_runs_segment, pd_mix_segment_draws): with every
 * component's count (w->flat), C ≤ PD_MIX_SEGMENT_COMPONENTS, and reads dense enough that a segment's counts
 * (C − 1 divisions a block) cost less than a descent per read (2 a level): (C − 1)·W ≤ 4·depth·B. Measured (one
 * core of the 2-vCPU Xeon, B = 64, 65536 reads, by runs): C = 4 faster to W = 128 (30.6 → 44.4 M ids/s), slower
 * at 256 (30.6 → 27.2); C = 16 faster to W = 64 (20 → 25), slower at 128 (20 → 14). */
static int pd_mix_segments(const pd_mix *m, const pd_mix_work *w, uint64_t world)
{
    const uint64_t depth = pd_mix_depth(m);
    return w->flat && m->components <= PD_MIX_SEGMENT_COMPONENTS &&
           (m->components - 1) * world <= 4 * depth * m->block;
}

/* The segment of up to PD_MIX_COUNTS blocks of one stage from the block of run position g0 (reads at g0 + t·W,
 * at most left): stage into *k, the blocks' counts into w->y (pd_mix_counts); returns its reads (≥ 1), its blocks
 * in *blocks and its first run position in *first. */
static uint64_t pd_mix_segment(const pd_mix *m, pd_mix_work *w, uint64_t *k, uint64_t g0, uint64_t world,
                               uint64_t left, uint64_t *blocks, uint64_t *first)
{
    const uint64_t B = m->block;
    *first = g0 & ~(B - 1);
    pd_mix_stage_at(m, w, k, g0);
    *blocks = PD_MIX_COUNTS;
    if (*k + 1 < m->stages && (m->start[*k + 1] - *first) / B < *blocks)
        *blocks = (m->start[*k + 1] - *first) / B;
    const uint64_t reads = (*first + *blocks * B - g0 + world - 1) / world, x0 = *first - m->start[*k];
    if (w->cnt_x != x0)
        pd_mix_counts(m, w, x0);
    return reads < left ? reads : left;
}

/* The segment's tables, from its counts (stage k, blocks blocks): component j's first slot in block i at
 * start[32j + i] (spec §5: the slots go to the components in index order), and the run draw its slot 0 would
 * have, draw0[32j + i] (slot q of j in block i is run draw draw0 + q). */
static void pd_mix_segment_slots(const pd_mix *m, const pd_mix_work *w, uint64_t k, uint64_t blocks, uint32_t *start,
                                 uint64_t *draw0)
{
    const uint64_t C = m->components, R = PD_MIX_COUNTS + 1, *P = m->drawn + k * C;
    uint32_t slot[PD_MIX_COUNTS] = {0};
    for (uint64_t j = 0; j < C; j++) {
        const uint64_t *leaf = w->y + w->leaf[j] * R; /* count_j at the blocks' starts, from the stage's */
        for (uint64_t i = 0; i < blocks; i++) {
            start[PD_MIX_COUNTS * j + i] = slot[i];
            draw0[PD_MIX_COUNTS * j + i] = P[j] + leaf[i] - slot[i];
            slot[i] += (uint32_t)(leaf[i + 1] - leaf[i]);
        }
    }
}

/* The components and run draws of the reads from t on (at most n − t) in one segment (pd_mix_segment), into
 * w->comp and w->draw: the segment's tables, then per read a compare per component. Returns how many reads it
 * took. */
static uint64_t pd_mix_segment_draws(const pd_gen *g, const pd_mix *m, pd_mix_work *w, uint64_t *k, uint64_t g_first,
                                     uint64_t world, uint64_t t, uint64_t n)
{
    const uint64_t C = m->components, g0 = g_first + t * world;
    uint32_t start[PD_MIX_SEGMENT_COMPONENTS * PD_MIX_COUNTS];
    uint64_t base[PD_MIX_SEGMENT_COMPONENTS * PD_MIX_COUNTS], blocks, first;
    const uint64_t reads = pd_mix_segment(m, w, k, g0, world, n - t, &blocks, &first);
    pd_mix_segment_slots(m, w, *k, blocks, start, base);
    /* every read lies in the segment's 32 blocks: its offset from their start, i·W included, is below 2^16 */
    const pd__segment_draws x = {.slot = w->slot + t, .count = reads, .rel = (uint32_t)(g0 - first),
                                 .world = (uint32_t)world, .bits = m->block_bits, .blocks = (uint32_t)blocks,
                                 .start = start, .base = base, .ncomp = (unsigned)C, .comp = w->comp + t,
                                 .draw = w->draw + t};
    pd__segment_draws_run(g, &x);
    return reads;
}

/* Whether sparse runs go a segment at a time (pd_mix_runs_segment): segments (pd_mix_segments), and every
 * component a run of one batch. */
static int pd_mix_segmentwise(const pd_gen *g, const pd_mix *m, const pd_mix_work *w, uint64_t world)
{
    return m->components <= pd__batch_max_runs(g, 0) && pd_mix_segments(m, w, world);
}

/* The reads from t on (at most n − t) in the segment of up to PD_MIX_COUNTS blocks of one stage that starts with
 * read t's block, into the batch at once: the blocks' counts (pd_mix_counts), per component its run, the
 * segment's tables (pd_mix_segment_slots) as positions in those runs, then the reads (pd__segment_reads): no
 * parts and no lookup per block. Returns how many reads it took, or 0 (taking none) where a component's draws in
 * the segment cross a component epoch: then the caller goes a block at a time. */
static uint64_t pd_mix_runs_segment(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, pd_mix_runs *r,
                                    const int grouped, uint64_t *k, uint64_t g_first, uint64_t world, uint64_t t,
                                    uint64_t n, void *out, unsigned width)
{
    const pd_mix *m = c->mix;
    const uint64_t C = m->components, R = PD_MIX_COUNTS + 1, g0 = g_first + t * world;
    uint32_t start[PD_MIX_SEGMENT_COMPONENTS * PD_MIX_COUNTS], base[PD_MIX_SEGMENT_COMPONENTS * PD_MIX_COUNTS];
    uint32_t runs[PD_MIX_SEGMENT_COMPONENTS];
    uint64_t draw0[PD_MIX_SEGMENT_COMPONENTS * PD_MIX_COUNTS], lo[PD_MIX_SEGMENT_COMPONENTS], blocks, first;
    const uint64_t left = n - t < PD__BATCH_ITEMS ? n - t : PD__BATCH_ITEMS;
    const uint64_t reads = pd_mix_segment(m, w, k, g0, world, left, &blocks, &first), *P = m->drawn + *k * C;
    if (r->count + reads > PD__BATCH_ITEMS)
        pd_mix_runs_flush(g, m, r, out, width);
    for (int pass = 0;; pass++) { /* each component's run; again if adding one flushed the batch */
        const uint64_t id = r->id;
        for (uint64_t j = 0; j < C; j++) {
            const uint64_t *leaf = w->y + w->leaf[j] * R, d0 = P[j] + leaf[0], d1 = P[j] + leaf[blocks];
            runs[j] = 0;
            lo[j] = 0;
            if (d1 == d0 || (grouped && w->grouped[j])) /* no reads here, or they go by groups */
                continue;
            const pd_mix_last *last = pd_mix_runs_of(g, c, w, r, j, d0, out, width);
            if (d1 > last->hi) /* the segment's draws cross a component epoch */
                return 0;
            runs[j] = last->run;
            lo[j] = last->lo;
        }
        if (r->id == id)
            break;
        if (pass) /* cannot happen: a fresh batch takes every component */
            return 0;
    }
#if defined(PD_CPU_HAVE_AVX512)
    if (w->isa == PD_ISA_AVX512 && !grouped) { /* the same tables, every block at once (no draw0: only the grouped reads take it) */
        const uint64_t *leaf[PD_MIX_SEGMENT_COMPONENTS];
        uint64_t off[PD_MIX_SEGMENT_COMPONENTS];
        for (uint64_t j = 0; j < C; j++) {
            leaf[j] = w->y + w->leaf[j] * R;
            off[j] = P[j] - lo[j];
        }
        pd__segment_tables_avx512(leaf, (unsigned)C, off, start, base);
    } else
#endif
    {
        pd_mix_segment_slots(m, w, *k, blocks, start, draw0);
        for (uint64_t j = 0; j < C; j++) /* + the slot: the draw's position in its run (< 2^32; mod 2^32 here) */
            for (uint64_t i = 0; i < blocks; i++)
                base[PD_MIX_COUNTS * j + i] = (uint32_t)(draw0[PD_MIX_COUNTS * j + i] - lo[j]);
    }
    const pd__segment_reads x = {.slot = w->slot + t, .count = reads, .rel = (uint32_t)(g0 - first),
                                 .world = (uint32_t)world, .bits = m->block_bits, .start = start, .base = base,
                                 .runs = runs, .ncomp = (unsigned)C, .v = w->bv + r->count,
                                 .run = w->brun + r->count};
    if (grouped) { /* each read stored both ways and kept by one, without a branch (as pd_mix_runs_block) */
        /* Locals: a store through brun (bytes) may alias anything, so the fields would be reloaded per read. */
        uint32_t *bidx = w->bidx + r->count, *pick = w->pick, *comp = w->comp, *bv = x.v, added = 0, npick = w->npick;
        uint64_t *draw = w->draw;
        uint8_t *brun = x.run;
        const uint8_t *by = w->grouped;
        const uint32_t *slot = w->slot, bits = m->block_bits, rel = x.rel;
        for (uint64_t i = 0; i < reads; i++) {
            const uint32_t b = (uint32_t)(rel + i * world) >> bits, q = slot[t + i], tt = (uint32_t)(t + i);
            const uint32_t j = pd__segment_component(start, (unsigned)C, b, q), by_groups = by[j];
            comp[tt] = j;
            draw[tt] = draw0[PD_MIX_COUNTS * j + b] + q;
            pick[npick] = tt;
            npick += by_groups;
            bv[added] = base[PD_MIX_COUNTS * j + b] + q;
            brun[added] = (uint8_t)runs[j];
            bidx[added] = tt;
            added += !by_groups;
        }
        w->npick = npick;
        r->count += added;
        return reads;
    }
#if defined(PD_CPU_HAVE_AVX512)
    if (g->isa == PD_ISA_AVX512)
        pd__segment_reads_avx512(&x);
    else
#endif
        for (uint64_t i = 0; i < reads; i++)
            pd__segment_read(&x, i);
    r->count += reads;
    return reads;
}

/* Read t (at run position g) into the batch: its component and draw, its run, its position. */
static inline __attribute__((always_inline)) void pd_mix_runs_read(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w,
                                                                   pd_mix_runs *r, const int grouped,
                                                                   pd_mix_reader *rd, int by_parts, uint64_t *k,
                                                                   uint64_t gpos, uint64_t t, void *out,
                                                                   unsigned width)
{
    uint64_t j, d;
    if (r->count == PD__BATCH_ITEMS)
        pd_mix_runs_flush(g, c->mix, r, out, width);
    pd_mix_read(c->mix, w, rd, by_parts, k, gpos, w->slot[t], &j, &d);
    if (grouped && w->grouped[j]) {
        pd_mix_pick(w, t, j, d);
        return;
    }
    const pd_mix_last *last = pd_mix_runs_of(g, c, w, r, j, d, out, width);
    if (grouped)
        w->bidx[r->count] = (uint32_t)t;
    w->bv[r->count] = (uint32_t)(d - last->lo);
    w->brun[r->count++] = (uint8_t)last->run;
}

/* The rest of a sparse chunk whose slots are in w->slot (w->by_runs): each read's component and draw, then,
 * for a component the batch kernel runs, its σ in read order through that kernel, whose lanes each carry
 * their own component's keys: no grouping by component, no scatter. Where blocks have more reads than C, a
 * block at a time (its parts' runs resolved once). With `grouped` (w->grouped: some components are not
 * run), their reads are picked for pd_mix_sparse_groups instead. Inlined twice, so that mixtures of runnable
 * components alone test nothing per read. by_parts: pd_mix_by_parts(m, world), as the chunk found it. */
static inline __attribute__((always_inline)) void pd_mix_sparse_runs_as(const pd_gen *g, pd_mix_cursor *c,
                                                                        pd_mix_work *w, const int grouped,
                                                                        int by_parts, uint64_t *k, uint64_t g_first,
                                                                        uint64_t world, uint64_t n, void *out,
                                                                        unsigned width)
{
    const pd_mix *m = c->mix;
    pd_mix_reader rd = {.block = UINT64_MAX};
    pd_mix_runs r = {.b = {.v = w->bv, .run = w->brun}, .id = w->batches + 1, .idx = grouped ? w->bidx : NULL};
    const int segments = pd_mix_segmentwise(g, m, w, world);
    if (segments || pd_mix_blockwise(m, by_parts, world)) {
        for (uint64_t t = 0; t < n;) {
            const uint64_t took =
                segments ? pd_mix_runs_segment(g, c, w, &r, grouped, k, g_first, world, t, n, out, width) : 0;
            if (took) {
                t += took;
                continue;
            }
            const uint64_t g0 = g_first + t * world, nb = pd_mix_block_count(m, g0, world, n - t);
            uint64_t j, d; /* the block's parts into rd */
            pd_mix_read(m, w, &rd, 1, k, g0, w->slot[t], &j, &d);
            if (pd_mix_runs_block(g, c, w, &r, grouped, &rd, t, nb, out, width)) {
                t += nb;
                continue;
            }
            for (const uint64_t end = t + nb; t < end; t++) /* a part crosses a component epoch */
                pd_mix_runs_read(g, c, w, &r, grouped, &rd, 1, k, g_first + t * world, t, out, width);
        }
    } else {
        for (uint64_t t = 0; t < n; t++)
            pd_mix_runs_read(g, c, w, &r, grouped, &rd, by_parts, k, g_first + t * world, t, out, width);
    }
    pd_mix_runs_flush(g, m, &r, out, width);
    w->batches = r.id - 1; /* the next chunk's first batch is new to every pd_mix_last */
}

static void pd_mix_sparse_runs(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, int by_parts, uint64_t *k,
                               uint64_t g_first, uint64_t world, uint64_t n, void *out, unsigned width)
{
    w->npick = 0;
    if (w->grouped)
        pd_mix_sparse_runs_as(g, c, w, 1, by_parts, k, g_first, world, n, out, width);
    else
        pd_mix_sparse_runs_as(g, c, w, 0, by_parts, k, g_first, world, n, out, width);
}

/* The ids of n reads of a sparse chunk whose component and draw are in w->comp and w->draw: the reads pick[i]
 * (or i where pick is NULL), grouped by component and component epoch, each group's σ gathered. */
static void pd_mix_sparse_groups(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, uint64_t chunk,
                                 const uint32_t *pick, uint64_t n, void *out, unsigned width)
{
    const pd_mix *m = c->mix;
    w->npresent = 0;
    for (uint64_t i = 0; i < n; i++) /* count the reads per component */
        pd_mix_seen_touch(w, chunk, w->comp[pick ? pick[i] : i], 0)->hi++;
    uint64_t at = 0;
    for (uint32_t p = 0; p < w->npresent; p++) { /* buckets: [lo, hi) of order; hi counts the bucket's fill */
        pd_mix_seen *s = &w->seen[w->present[p]];
        const uint64_t size = s->hi;
        s->lo = s->hi = at;
        at += size;
    }
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t t = pick ? pick[i] : (uint32_t)i;
        w->order[w->seen[w->comp[t]].hi++] = t;
    }
    for (uint32_t p = 0; p < w->npresent; p++) { /* per component, batches of one component epoch each */
        const uint32_t j = w->present[p];
        const pd_mix_seen *s = &w->seen[j];
        if (!w->size[j].d)
            pd_divisor_init(&w->size[j], m->comp[j].size);
        pd_mix_epoch_batches(g, c, w, j, w->order + s->lo, s->hi - s->lo, out, width);
    }
}

/* pd_mix_sparse_groups for every read of a chunk with few components (where g->avx2): each component's reads picked
 * out by one pass of compares (pd__group_reads_*), where the counting sort's per-read increments, chained through
 * memory, cost a quarter of an AVX2 W = 8 read; then one division for the component epoch of all of them where their
 * lowest and highest draws share one (a component's draws grow from block to block), else one a read. */
static void pd_mix_sparse_scan(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, uint64_t n, void *out,
                               unsigned width)
{
    const pd_mix *m = c->mix;
    for (uint32_t j = 0; j < m->components; j++) {
        const uint64_t k = pd__group_reads_run(g, w->comp, n, j, w->index);
        if (!k)
            continue;
        pd_divisor *size = &w->size[j];
        if (!size->d)
            pd_divisor_init(size, m->comp[j].size);
        /* A component's draws grow from block to block (spec §5), the chunk's reads go block after block, and one
         * block's draws span less than B: all lie within B of the first read's and the last read's. Bounds, not a
         * minimum and maximum over every read (two cmov chains, ~4% of a W = 8 read). */
        const uint64_t first = w->draw[w->index[0]], last = w->draw[w->index[k - 1]];
        const uint64_t e = pd_divide(size, first > m->block ? first - m->block : 0);
        if (pd_divide(size, last + m->block) != e) { /* a component epoch may end in the chunk */
            pd_mix_epoch_batches(g, c, w, j, w->index, k, out, width);
            continue;
        }
        const uint64_t base = e * size->d;
        for (uint64_t i = 0; i < k; i++)
            w->at[i] = w->draw[w->index[i]] - base;
        pd_mix_sparse_batch(g, c, w, j, e, k, out, width);
    }
}

/* One sparse chunk: n reads at run positions g_first + t·W. */
static void pd_mix_sparse_chunk(const pd_gen *g, pd_mix_cursor *c, pd_mix_work *w, uint64_t chunk, uint64_t *k,
                                uint64_t g_first, uint64_t world, uint64_t n, void *out, unsigned width)
{
    const pd_mix *m = c->mix;
    const int by_parts = pd_mix_by_parts(m, world);
    pd_mix_slots(g, m, g_first, world, n, w->slot);
    /* Some components not run (w->grouped): runs for the others only where blocks go a block at a time,
     * whose reads are sorted out without a branch; read by read, the branch on each read's component
     * cost more than runs gain (10,000-shard mixture, W = 64, 2-core Xeon: 9.5 against 10.5 M ids/s). */
    if (w->by_runs && (!w->grouped || pd_mix_blockwise(m, by_parts, world))) {
        pd_mix_sparse_runs(g, c, w, by_parts, k, g_first, world, n, out, width);
        if (w->npick) /* reads of components the batch kernel does not run */
            pd_mix_sparse_groups(g, c, w, chunk, w->pick, w->npick, out, width);
        return;
    }
    if (pd_mix_segments(m, w, world)) { /* component and draw of each read */
        for (uint64_t t = 0; t < n;)
            t += pd_mix_segment_draws(g, m, w, k, g_first, world, t, n);
    } else {
        pd_mix_reader rd = {.block = UINT64_MAX};
        for (uint64_t t = 0; t < n; t++) {
            uint64_t j, d;
            pd_mix_read(m, w, &rd, by_parts, k, g_first + t * world, w->slot[t], &j, &d);
            w->comp[t] = (uint32_t)j;
            w->draw[t] = d;
        }
    }
    if (g->avx2 && m->components <= PD_MIX_SCAN_COMPONENTS)
        pd_mix_sparse_scan(g, c, w, n, out, width);
    else
        pd_mix_sparse_groups(g, c, w, chunk, NULL, n, out, width);
}

static int pd_gen_mix_fill(const pd_gen *g, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                           void *out, unsigned width, uint64_t *written)
{
    uint64_t left;
    int rc = pd__gen_check(g);
    if (rc)
        return rc;
    if (count < PD__SIMD_MIN) /* a few ids: the core's loop, without the chunk's workspace */
        return width == 4 ? pd_mix_slice_fill_u32(c, epoch, s, count, out, written)
                          : pd_mix_slice_fill_u64(c, epoch, s, count, out, written);
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
    /* Pad mode may wrap the last read past L (v1 §5: only one can): the core resolves it, after the body,
     * so that an order it needs cannot evict one the body's reads need. */
    const uint64_t body = count && first + (count - 1) * W >= m->length ? count - 1 : count;
    if (body) {
        pd_mix_work w;
        const int dense = W <= PD_MIX_DENSE_WORLD;
        const uint64_t cap = body < pd_mix_sparse_reads(g) ? body : pd_mix_sparse_reads(g);
        if ((rc = pd_mix_work_alloc(&w, g, m, dense, body, W, width)))
            return rc;
        uint64_t k = pd__mix_stage_of(m, base + first);
        for (uint64_t done = 0, chunk = 1; done < body; chunk++) {
            const uint64_t g0 = base + first + done * W, todo = body - done;
            char *at = (char *)out + done * width;
            if (dense) {
                done += pd_mix_dense_chunk(g, c, &w, chunk, &k, g0, W, todo, at, width);
            } else {
                const uint64_t n = todo < cap ? todo : cap;
                pd_mix_sparse_chunk(g, c, &w, chunk, &k, g0, W, n, at, width);
                done += n;
            }
        }
        pd_mix_work_free(&w);
    }
    if (body < count) {
        pd_mix_loc loc;
        pd_mix_locate(c, epoch, (first + body * W) % m->length, &loc);
        if (width == 4)
            ((uint32_t *)out)[body] = (uint32_t)loc.sample;
        else
            ((uint64_t *)out)[body] = loc.sample;
    }
    *written = count;
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

/* ---- Split across the pool */

uint64_t pd_mix_id_cost(uint64_t world)
{
    return world <= PD_MIX_DENSE_WORLD ? PD_MIX_COST_DENSE : PD_MIX_COST_SPARSE;
}

typedef struct pd_mix_pool_ctx {
    const pd_mix_cursor *caller; /* the caller's: each part reads through a view of it (none changes it) */
    uint64_t epoch;
    pd_slice slice;
    void *out;
    unsigned width;
    _Atomic uint64_t built; /* sharded orders the parts' views built into their own memory */
    _Atomic int rc;         /* the first error of a part (PD_ENOMEM: a cursor) */
} pd_mix_pool_ctx;

/* Keep the first error of any part. */
static void pd_mix_pool_fail(pd_mix_pool_ctx *x, int rc)
{
    int none = PD_OK;
    atomic_compare_exchange_strong(&x->rc, &none, rc);
}

/* Reads [begin, begin + count) of the request: the slice moved on by begin reads, through a view of the
 * caller's cursor (pd_mix_cursor_share): the orders it holds serve every part, so a sharded component's
 * O(S_j) order is built once per request at most, not once per part. */
static void pd_mix_pool_chunk(const pd_gen *g, void *arg, uint64_t begin, uint64_t count)
{
    pd_mix_pool_ctx *x = arg;
    pd_mix_cursor view;
    const size_t bytes = pd_mix_cursor_bytes(x->caller->mix);
    void *mem = malloc(bytes);
    if (!mem || pd_mix_cursor_init(&view, x->caller->mix, mem, bytes) || pd_mix_cursor_share(&view, x->caller)) {
        pd_mix_pool_fail(x, PD_ENOMEM);
        free(mem);
        return;
    }
    pd_slice part = x->slice;
    part.offset += begin * part.world;
    uint64_t got;
    const int rc = pd_gen_mix_fill(g, &view, x->epoch, &part, count, (char *)x->out + begin * x->width, x->width, &got);
    if (rc)
        pd_mix_pool_fail(x, rc);
    atomic_fetch_add(&x->built, view.built);
    free(mem);
}

static int pd_pool_mix_fill(pd_pool *pool, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                            void *out, unsigned width, uint64_t *written)
{
    uint64_t left;
    if (!pool)
        return PD_EINVAL;
    if (!c || !s || !out || !written || count < 2 || pd_mix_cursor_bytes(c->mix) > PD_MIX_POOL_CURSOR_MAX ||
        (width == 4 && pd_id_width(c->mix->total) != 4) || pd_slice_remaining(c->mix->length, s, &left) ||
        !pd_mix_epoch_ok(c->mix, epoch))
        return pd_gen_mix_fill(pd__pool_gen(pool), c, epoch, s, count, out, width, written); /* its checks, its errors */
    if (count > left)
        count = left;
    const uint64_t min_part = s->world <= PD_MIX_DENSE_WORLD ? PD_MIX_POOL_PART_MIN_DENSE : PD_MIX_POOL_PART_MIN_SPARSE;
    if (!pd__pool_splits(pool, count, min_part, PD_MIX_POOL_PART_MAX)) /* one part: the caller's cursor itself */
        return pd_gen_mix_fill(pd__pool_gen(pool), c, epoch, s, count, out, width, written);
    /* The body's positions (a pad-mode wrap past L adds one read, which its part's view resolves). */
    const uint64_t L = c->mix->length, first = s->offset + s->rank, last = first + (count - 1) * s->world;
    uint64_t *drawn = malloc(2 * c->mix->components * sizeof *drawn);
    if (drawn && first < L && pd_mix_reach(c->mix, epoch, first, last < L ? last : L - 1, drawn) == PD_OK)
        pd_mix_cursor_prepare(c, drawn); /* else each part's view builds what it needs */
    free(drawn);
    pd_mix_pool_ctx x = {.caller = c, .epoch = epoch, .slice = *s, .out = out, .width = width};
    atomic_init(&x.rc, PD_OK);
    atomic_init(&x.built, 0);
    pd__pool_run_parts(pool, count, min_part, PD_MIX_POOL_PART_MAX, pd_mix_pool_chunk, &x);
    c->built += atomic_load(&x.built);
    const int rc = atomic_load(&x.rc);
    if (rc == PD_OK)
        *written = count;
    return rc;
}

int pd_pool_mix_fill_u64(pd_pool *pool, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                         uint64_t *out, uint64_t *written)
{
    return pd_pool_mix_fill(pool, c, epoch, s, count, out, 8, written);
}

int pd_pool_mix_fill_u32(pd_pool *pool, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                         uint32_t *out, uint64_t *written)
{
    return pd_pool_mix_fill(pool, c, epoch, s, count, out, 4, written);
}
