/* Internal contract between cpu/gen.c, cpu/pool.c and the per-ISA kernels: one validated run of positions. */
#ifndef PD_CPU_KERNEL_H
#define PD_CPU_KERNEL_H

#include <stdint.h>
#include <string.h>

#include "core/mixture.h"
#include "cpu/gen.h"

/* A run: out[i] = σ(first + i·stride) for i < count. The caller has checked
 * everything: every position is below n, n ≥ 2, stride < 2^32, and count is
 * at most PD__RUN_MAX, so a lane's output index always fits a signed 32-bit
 * lane (SIMD compares on x86 are signed). Kernels cannot fail. */
typedef struct pd__run {
    const pd_perm *perm;
    uint64_t first;
    uint64_t stride; /* 1 for a range, W for a rank's slice */
    uint64_t count;
    void *out;
    unsigned width; /* bytes per id: 4 or 8 */
    pd_walk walk;   /* never PD_WALK_AUTO */
    int unflipped;  /* 1: skip the parity correction; the caller applies it (pd__unflip) */
} pd__run;

#define PD__RUN_MAX (UINT64_C(1) << 30)

/* Below this many ids a request runs on the scalar kernel: a SIMD kernel's
 * set-up and its last partly empty vectors cost more than they save. */
#define PD__SIMD_MIN 64

/* A validated request: a body run of positions below n and, in pad mode, at
 * most one last id whose position wraps (p ≥ n reads σ(p mod n)). Positions
 * of one rank are W apart and the wrapped part [n, T) is shorter than W, so
 * one is all there can be. */
typedef struct pd__req {
    pd__run body;
    int has_tail;
    uint64_t tail_position;
    uint64_t total; /* ids written: body.count + has_tail */
} pd__req;

/* Validate like pd_perm_fill_* and pd_slice_fill_* (same codes, same order). */
int pd__req_range(const pd_perm *p, uint64_t start, uint64_t count, void *out, unsigned width, pd__req *req);
int pd__req_slice(const pd_perm *p, const pd_slice *s, uint64_t count, void *out, unsigned width,
                  pd__req *req);

/* PD_EINVAL for a g that pd_gen_init did not set up, PD_EUNSUPPORTED for an ISA this CPU cannot run. */
int pd__gen_check(const pd_gen *g);

/* Run a validated run (any count; chunked to PD__RUN_MAX) on g's kernel. */
void pd__gen_run(const pd_gen *g, const pd__run *run);

/* PD_EINVAL for a g that pd_gen_init did not set up, PD_EUNSUPPORTED for an ISA this CPU lacks. */
int pd__gen_check(const pd_gen *g);

/* A part of a request the pool splits: ids [begin, begin + count) of it, computed with g. */
typedef void pd__chunk_fn(const pd_gen *g, void *ctx, uint64_t begin, uint64_t count);

/* Split ids [0, count) into chunks run by the pool's threads and the caller; returns when all are done.
 * Small counts (or a one-thread pool) run on the caller alone. Chunks are big enough that taking one (a
 * mutex round trip) is noise next to computing it, and small enough that 4 per thread balance the load. */
#define PD_POOL_CHUNK_MIN (UINT64_C(1) << 15)
#define PD_POOL_CHUNK_MAX (UINT64_C(1) << 20)
void pd__pool_run(pd_pool *pool, uint64_t count, pd__chunk_fn *fn, void *ctx);

/* pd__pool_run in one part per thread, each of min_part to max_part ids (fewer parts if count is short,
 * more if long): for ids whose part has a fixed cost that finer chunks would pay again, and a working set
 * that coarser ones would take out of the cache (a mixture's: cpu/mix.h). */
void pd__pool_run_parts(pd_pool *pool, uint64_t count, uint64_t min_part, uint64_t max_part, pd__chunk_fn *fn,
                        void *ctx);
/* Whether pd__pool_run_parts with these arguments runs more than one part (else fn runs once, on the caller). */
int pd__pool_splits(const pd_pool *pool, uint64_t count, uint64_t min_part, uint64_t max_part);

/* The generator a pool's threads run. */
const pd_gen *pd__pool_gen(const pd_pool *pool);

/* Write a request's wrapped last id, if it has one. */
void pd__req_tail(const pd__req *req);

/* The parity correction (spec §3) swaps the images 0 and 1 of f. Both are
 * below any n ≥ 2, so it never changes whether a walk goes on, only the final
 * id of the two positions whose walk ends at 0 or 1. The SIMD kernels
 * therefore walk without it and call this at the end: it finds those two
 * positions with the core's inverse walk (no parity) and flips their ids. */
void pd__run_fix_parity(const pd__run *run);

/* The parity correction of a run with unflipped set, applied to one of its ids: the walk without it
 * ends at 0 or 1 exactly where σ ends at the other one (n ≥ 2), so the fix needs no position. */
static inline uint64_t pd__unflip(const pd_perm *p, uint64_t v)
{
    return v ^ (uint64_t)(p->n >= 2 && v < 2 ? p->keys.flip : 0);
}

/* Kernels. The SIMD ones exist only in x86-64 builds and may only be called
 * once pd_cpu_has_isa said yes: they are compiled for their ISA. */
void pd__run_scalar(const pd__run *run);
/* The scalar walk with the parity correction on (1, σ) or off (0: for the
 * tails of SIMD kernels, which fix the parity of the whole run at the end). */
void pd__run_scalar_walk(const pd__run *run, int parity);
#if defined(PD_CPU_HAVE_AVX2)
void pd__run_avx2(const pd__run *run);
#endif
#if defined(PD_CPU_HAVE_AVX512)
void pd__run_avx512(const pd__run *run);
#endif

/* ---- Entry points for mixtures (cpu/mix.c; docs/spec/mixtures-v1.md) */

/* Block slots: out[t] = π_β(g mod B) for run positions g = first + t·stride, t < count, β = g / B, with
 * block β's keys of a mixture of this seed and block (pd__mix_block_keys): every lane its own keys, so one
 * call covers any number of blocks. B is a power of two in [64, 2048], stride < 2^32, count ≤ PD__RUN_MAX. */
typedef struct pd__block_slots {
    uint64_t seed, block;
    uint64_t first, stride, count;
    uint32_t *out;
} pd__block_slots;

/* Block π_β's round as byte tables, for the byte kernels (B ≤ 2^11: a half fits a byte). A round reads its
 * left half s0 only through M0·s0: hi[s0] = hi32(M0·s0) & lmask and lo[s0] = (lo32(M0·s0) << d) & rmask,
 * d = rbits − lbits (blocks_vbmi.c's comment shows the round); entries past lmask are 0, n of each. */
static inline void pd__block_round_tables(const pd_perm *shape, uint8_t *hi, uint8_t *lo, unsigned n)
{
    for (uint32_t s0 = 0; s0 < n; s0++) {
        const uint64_t prod = PD_VP_M0 * s0;
        const int in = s0 <= shape->lmask;
        hi[s0] = in ? (uint8_t)((prod >> 32) & shape->lmask) : 0;
        lo[s0] = in ? (uint8_t)(((uint32_t)prod << (shape->rbits - shape->lbits)) & shape->rmask) : 0;
    }
}

void pd__block_slots_scalar(const pd__block_slots *s);
#if defined(PD_CPU_HAVE_AVX512)
void pd__block_slots_avx512(const pd__block_slots *s);
#endif
#if defined(PD_CPU_HAVE_AVX2)
/* Bytes, 32 reads a register, a Philox per read (cpu/blocks_avx2.c); any count. */
void pd__block_slots_avx2(const pd__block_slots *s);
#endif
#if defined(PD_CPU_HAVE_VBMI)
/* Bytes, 64 reads a register, one Philox per block (cpu/blocks_vbmi.c); any count. */
void pd__block_slots_vbmi(const pd__block_slots *s);
#endif
/* The kernel for g: VBMI's where g->vbmi, AVX-512's per-lane-keyed one, AVX2's, else the scalar one. */
void pd__block_slots_run(const pd_gen *g, const pd__block_slots *s);

/* Block groups: every slot of 8 consecutive blocks β = first, …, first + 7 (B a power of two in [64, 256]: a
 * slot fits a byte), interleaved four slots at a time: π_{first+l}(r) is out[pd__block_group_at(l, r)], 8·B
 * bytes. Where a rank reads many of a block's slots (small W), one pass over whole blocks costs less than
 * keying every read; the layout lets a 32-byte register hold 4 slots of each of 8 blocks, so one vector of
 * per-block keys serves every register. */
#define PD__BLOCK_GROUP 8u
#define PD__BLOCK_GROUP_MAX_B 256u

static inline uint32_t pd__block_group_at(uint32_t l, uint32_t r)
{
    return (r >> 2) * 32 + l * 4 + (r & 3);
}

typedef struct pd__block_group {
    uint64_t seed, block, first;
    uint8_t *out;
} pd__block_group;

void pd__block_group_scalar(const pd__block_group *t);
#if defined(PD_CPU_HAVE_AVX2)
void pd__block_group_avx2(const pd__block_group *t);
#endif
#if defined(PD_CPU_HAVE_VBMI)
/* Whole bytes, a vpermb and an xor a round per 64 slots (cpu/blocks_vbmi.c). */
void pd__block_group_vbmi(const pd__block_group *t);
#endif
/* The kernel for g: VBMI's where g->vbmi, else AVX2's where g->avx2 (AVX2 and AVX-512), else the scalar one. */
void pd__block_group_run(const pd_gen *g, const pd__block_group *t);

/* Gather: out[i] = σ(positions[i]) for i < run->count (run->first and stride are not used), every position
 * below n, n ≥ 2, count ≤ PD__RUN_MAX. */
void pd__gather_scalar(const pd__run *run, const uint64_t *positions);
#if defined(PD_CPU_HAVE_AVX2)
void pd__gather_avx2(const pd__run *run, const uint64_t *positions);
#endif
#if defined(PD_CPU_HAVE_AVX512)
void pd__gather_avx512(const pd__run *run, const uint64_t *positions);
#endif
/* The SIMD gathers walk without the parity transposition: this applies it to run->out afterwards (unless
 * run->unflipped: then the caller does, as pd__unflip). */
void pd__gather_fix_parity(const pd__run *run);
/* The gather for g: its ISA's where there are PD__SIMD_MIN positions or more (and n ≥ 2), else the scalar one.
 * run->out may be positions itself (each lane reads its position before any output is stored). */
void pd__gather_run(const pd_gen *g, const pd__run *run, const uint64_t *positions);

/* ---- Sharded ids (cpu/shards.c): σ of several windows' runs at once.
 *
 * Runs of a rank in consecutive windows are often short (a window's samples divided among the
 * ranks that share its lane), and a SIMD walk's last evaluations of a short run leave most
 * lanes idle. A batch gives every lane its own τ (keys and shape, looked up by the lane's run
 * number), so the runs of up to PD__BATCH_RUNS windows fill the vectors together and share one
 * drain. Item i is position v[i] under τ = perm[run[i]]; v[i] becomes τ(v[i]) without the
 * parity correction (pd__unflip). Each τ has 2 ≤ n ≤ 2^32. Items of a run need not be contiguous: mixtures
 * (cpu/mix.c) batch their reads in read order, each read on its component's order. */
#define PD__BATCH_RUNS 32    /* on byte and word lanes; AVX-512F takes 16, AVX2 8: pd__batch_max_runs */
#define PD__BATCH_ITEMS 4096 /* enough that the drain costs a few per cent */
typedef struct pd__batch {
    const pd_perm *perm[PD__BATCH_RUNS];
    unsigned nruns;
    uint32_t *v;
    const uint8_t *run;
    uint32_t count; /* ≤ PD__BATCH_ITEMS */
} pd__batch;

void pd__batch_scalar(const pd__batch *b);

/* A mixture's batch after σ (cpu/mix.c): out[i] = add[run[i]] + v[i] with τ's parity correction (pd__unflip,
 * flip[run]) for i < count, as width-byte ids (u32: mod 2^32). nruns ≤ 16. AVX2 gathers a mixture's reads by
 * component and never makes such a batch, so AVX-512 alone has a kernel for this (scalar: pd__batch_id_store). */
typedef struct pd__batch_ids {
    const uint32_t *v;
    const uint8_t *run;
    uint64_t count;
    const uint64_t *add;
    const uint32_t *flip;
    unsigned nruns;
    void *out;
    unsigned width;
} pd__batch_ids;

static inline uint64_t pd__batch_id(const pd__batch_ids *x, uint64_t i)
{
    const uint32_t v = x->v[i], run = x->run[i];
    return x->add[run] + (v ^ (x->flip[run] & (v < 2)));
}

static inline void pd__batch_id_store(const pd__batch_ids *x, uint64_t i)
{
    const uint64_t id = pd__batch_id(x, i);
    if (x->width == 4)
        ((uint32_t *)x->out)[i] = (uint32_t)id;
    else
        ((uint64_t *)x->out)[i] = id;
}
#if defined(PD_CPU_HAVE_AVX512)
void pd__batch_ids_avx512(const pd__batch_ids *x);
#endif

/* A mixture block's reads into its batch (cpu/mix.c, pd_mix_runs_block): read i, of slot q = slot[i], is in
 * the last part p whose first slot start[p] ≤ q (start[0] = 0, ascending); v[i] = base[p] + q, run[i] = runs[p];
 * i < count, nparts ≤ 16. run[] has 16 bytes of room past count (whole vectors are stored). */
typedef struct pd__block_reads {
    const uint32_t *slot;
    uint64_t count;
    const uint32_t *start, *base, *runs;
    unsigned nparts;
    uint32_t *v;
    uint8_t *run;
} pd__block_reads;
#if defined(PD_CPU_HAVE_AVX512)
void pd__block_reads_avx512(const pd__block_reads *x);
#endif

/* A segment's reads into a mixture's batch (cpu/mix.c, pd_mix_runs_segment): up to 32 consecutive blocks of one
 * stage, each component's draws there inside one component epoch. Read i lies in block b = (rel + i·world) >> bits
 * of the segment (b < 32) and has slot q = slot[i]; its component j is the last whose first slot in that block,
 * start[32j + b], is ≤ q (start[b] = 0, non-decreasing in j); v[i] = base[32j + b] + q (mod 2^32), run[i] =
 * runs[j]; i < count, ncomp ≤ 16. run[] has 16 bytes of room past count. */
typedef struct pd__segment_reads {
    const uint32_t *slot;
    uint64_t count;
    uint32_t rel, world, bits;
    const uint32_t *start, *base, *runs;
    unsigned ncomp;
    uint32_t *v;
    uint8_t *run;
} pd__segment_reads;

#define PD__SEGMENT_BLOCKS 32 /* a segment's blocks at most: its tables' stride */

/* The component of slot q in block b of a segment: the last of ncomp whose first slot there, start[32j + b], is
 * ≤ q; a compare per component, no branch (slots are random). */
static inline uint32_t pd__segment_component(const uint32_t *start, unsigned ncomp, uint32_t b, uint32_t q)
{
    uint32_t j = 0;
    for (uint32_t c = 1; c < ncomp; c++)
        j = start[PD__SEGMENT_BLOCKS * c + b] <= q ? c : j;
    return j;
}

static inline void pd__segment_read(const pd__segment_reads *x, uint64_t i)
{
    const uint32_t b = (x->rel + (uint32_t)i * x->world) >> x->bits, q = x->slot[i];
    const uint32_t j = pd__segment_component(x->start, x->ncomp, b, q);
    x->v[i] = x->base[PD__SEGMENT_BLOCKS * j + b] + q;
    x->run[i] = (uint8_t)x->runs[j];
}
#if defined(PD_CPU_HAVE_AVX512)
void pd__segment_reads_avx512(const pd__segment_reads *x);
#endif

/* A segment's reads' components and run draws, for a chunk grouped by component (cpu/mix.c, pd_mix_segment_draws):
 * read i, in block b and of slot q as in pd__segment_reads, takes comp[i] = j (pd__segment_component) and draw[i] =
 * base[32j + b] + q, its component's run draw; i < count, ncomp ≤ 16. */
typedef struct pd__segment_draws {
    const uint32_t *slot;
    uint64_t count;
    uint32_t rel, world, bits, blocks; /* blocks: the segment's, whose columns of the tables are set */
    const uint32_t *start;
    const uint64_t *base;
    unsigned ncomp;
    uint32_t *comp;
    uint64_t *draw;
} pd__segment_draws;

static inline void pd__segment_draw(const pd__segment_draws *x, uint64_t i)
{
    const uint32_t b = (x->rel + (uint32_t)i * x->world) >> x->bits, q = x->slot[i];
    const uint32_t j = pd__segment_component(x->start, x->ncomp, b, q);
    x->comp[i] = j;
    x->draw[i] = x->base[PD__SEGMENT_BLOCKS * j + b] + q;
}
#if defined(PD_CPU_HAVE_AVX2)
void pd__segment_draws_avx2(const pd__segment_draws *x);
#endif
/* The kernel for g: AVX2's where g->avx2 (AVX-512 hosts too), else pd__segment_draw read by read. */
void pd__segment_draws_run(const pd_gen *g, const pd__segment_draws *x);

/* A segment's tables for pd__segment_reads (cpu/mix.c, pd_mix_runs_segment) from every component's count at its
 * PD__SEGMENT_BLOCKS + 1 block starts, leaf[j][0 … 32]: start[32j + i] = Σ_{c<j} (leaf[c][i + 1] − leaf[c][i]),
 * component j's first slot in block i, and base[32j + i] = off[j] + leaf[j][i] − start[32j + i] (mod 2^32), the
 * draw of its slot 0 less off[j]'s own offset: every table at once, where blocks past the segment's hold what
 * no read takes. */
#if defined(PD_CPU_HAVE_AVX512)
void pd__segment_tables_avx512(const uint64_t *const *leaf, unsigned ncomp, const uint64_t *off, uint32_t *start,
                               uint32_t *base);
#endif

/* What one node of a mixture's weight tree passes on at PD__SEGMENT_BLOCKS + 1 block starts y_i = in[i]
 * (cpu/mix.c's pd_mix_counts): left[i] = l0 + ⌊(r0 + (y_i − y_0)·a)/S⌋ and right[i] = y_i − left[i], where
 * l0 = left(y_0), r0 < S < 2^32 its remainder, a ≤ S and y_i − y_0 ≤ 2^16 (spec §4). 8 positions a vector, the
 * quotient in doubles (every value exact below 2^53), corrected where it falls one short. */
#if defined(PD_CPU_HAVE_AVX512)
void pd__counts_node_avx512(const uint64_t *in, uint64_t *left, uint64_t *right, uint64_t l0, uint64_t r0, uint64_t a,
                            uint64_t S);
#endif
#if defined(PD_CPU_HAVE_AVX2)
void pd__counts_node_avx2(const uint64_t *in, uint64_t *left, uint64_t *right, uint64_t l0, uint64_t r0, uint64_t a,
                          uint64_t S);
#endif

/* A dense mixture block of 64 slots laid out and read (cpu/mix.c, pd_mix_layout_u32): part p holds slots [slot,
 * slot + count), whose global ids are ids[0, count) + add; read i takes slot[i]'s id into out[i], i < reads ≤ 64.
 * The parts cover the block's 64 slots. */
typedef struct pd__layout_part {
    const uint32_t *ids;
    uint32_t slot, count, add;
} pd__layout_part;
#if defined(PD_CPU_HAVE_AVX512)
void pd__layout64_avx512(const pd__layout_part *parts, unsigned nparts, const uint32_t *slot, uint64_t reads,
                         uint32_t *out);
#endif

/* Whether run[0, n) (n a multiple of 8) are all one run: the kernels then broadcast that run's keys. Runs may
 * come in any order (a mixture's interleave), so every item is compared, 8 at a time. */
static inline int pd__batch_one_run(const uint8_t *run, unsigned n)
{
    uint64_t first, w, diff = 0;
    memcpy(&first, run, 8);
    first = (first & 0xFF) * UINT64_C(0x0101010101010101);
    for (unsigned i = 0; i < n; i += 8) {
        memcpy(&w, run + i, 8);
        diff |= w ^ first;
    }
    return diff == 0;
}

/* The keys of count ≤ PD__BATCH_RUNS consecutive streams first, first + 1, …, each as
 * pd_keys_derive: the next windows' τ keys, derived side by side (AVX2: 8 at a time). */
void pd__keys_many_scalar(uint64_t seed, uint64_t epoch, uint32_t first, unsigned count, pd_keys *out);
#if defined(PD_CPU_HAVE_AVX2)
void pd__keys_many_avx2(uint64_t seed, uint64_t epoch, uint32_t first, unsigned count, pd_keys *out);
#endif
#if defined(PD_CPU_HAVE_AVX512)
void pd__keys_many_avx512(uint64_t seed, uint64_t epoch, uint32_t first, unsigned count, pd_keys *out);
#endif
/* A mixture's sparse chunk grouped by component (cpu/mix.c, pd_mix_sparse_scan): the indices i < n with comp[i] = j
 * into idx, ascending; returns how many. idx has room for n entries. */
uint64_t pd__group_reads_scalar(const uint32_t *comp, uint64_t n, uint32_t j, uint32_t *idx);
#if defined(PD_CPU_HAVE_AVX2)
uint64_t pd__group_reads_avx2(const uint32_t *comp, uint64_t n, uint32_t j, uint32_t *idx);
#endif
/* The kernel for g: AVX2's where g->avx2 (AVX-512 hosts too), else the scalar one. */
uint64_t pd__group_reads_run(const pd_gen *g, const uint32_t *comp, uint64_t n, uint32_t j, uint32_t *idx);

#if defined(PD_CPU_HAVE_AVX2)
void pd__batch_avx2(const pd__batch *b);
/* kernel_avx2.c's compress patterns: byte k = the lane of the mask's k-th set bit. */
extern const uint64_t pd__avx2_compress_tab[256];
#if defined(__AVX2__) /* the files compiled with -mavx2 */
#include <immintrin.h>
/* The vpermd pattern that moves the lanes mask m (8 bits) selects to the front, in order: AVX2 has no compress. */
static inline __attribute__((always_inline)) __m256i pd__avx2_compress_pattern(unsigned m)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pd__avx2_compress_tab[m]));
}
#endif
#endif
#if defined(PD_CPU_HAVE_AVX512)
void pd__batch_avx512(const pd__batch *b);
#endif
#if defined(PD_CPU_HAVE_BW)
/* The same on 16-bit lanes (batch_bw.c), for AVX-512 without VBMI: every τ of the batch has b ≤ 17. */
void pd__batch_bw(const pd__batch *b);
#endif
#if defined(PD_CPU_HAVE_VBMI)
/* The same on byte lanes (batch_vbmi.c): every τ of the batch has b ≤ 17. */
void pd__batch_vbmi(const pd__batch *b);
#endif
/* Whether g walks τ on narrow lanes (AVX-512 VBMI and b ≤ 17: bytes; AVX-512BW without VBMI, b ≤ 17:
 * 16-bit words; AVX2: bytes for b ≤ 11, words for b ≤ 17) or, with both vbmi and bw cleared (tests,
 * bench), b ≤ 17 on 32-bit lanes with one multiply a round (batch_avx512.c's PD_SMALL): faster than the σ kernels' general
 * rounds, so even a batch of one run takes the batch kernel then. */
#define PD__BATCH_BYTES_AVX2 11
#define PD__BATCH_WORDS_AVX2 17
static inline int pd__batch_narrow(const pd_gen *g, const pd_perm *p)
{
    return g->isa == PD_ISA_AVX2 ? p->bits <= PD__BATCH_WORDS_AVX2 : g->isa == PD_ISA_AVX512 && p->bits <= 17;
}
/* The batch kernel of g's ISA, and the most runs it takes: one register of per-run values (AVX2 8,
 * AVX-512 16), two on AVX-512BW's narrow lanes, bytes or words (32: every τ of the batch
 * pd__batch_narrow). */
void pd__batch_run(const pd_gen *g, const pd__batch *b);
static inline unsigned pd__batch_max_runs(const pd_gen *g, int narrow)
{
    return g->isa == PD_ISA_AVX2 ? 8 : (g->vbmi || g->bw) && narrow ? PD__BATCH_RUNS : 16;
}

/* ---- Sharded ids (cpu/shards.c): the slot lookup after σ of a window run.
 *
 * A window's slots as the lookup kernels read them: its part of the plan's slot table copied
 * relative to the window, so that the search runs on 32-bit lanes in L1. Only for windows of
 * fewer than 2^32 samples (u < 2^32); the caller searches the plan itself otherwise. */
typedef struct pd__slots {
    const uint32_t *rel;    /* rel[i] = P[slot0 + i] - P[slot0] (rel[0] = 0), then UINT32_MAX up to size */
    const uint32_t *add_lo; /* the id of window sample u in slot i is u + add[i] (mod 2^64), */
    const uint32_t *add_hi; /*   add[i] split into its low and high 32 bits (add_hi: u64 output only) */
    uint32_t size;          /* a power of 2, at least the window's slot count; the arrays hold at least
                               max(size, 16) values */
    uint32_t flip;          /* τ's parity correction, left to the lookup: u < 2 becomes u ^ 1 */
} pd__slots;

/* The id of window sample u (u from a run with unflipped set): the last slot whose rel ≤ u. */
static inline uint64_t pd__slots_id(const pd__slots *t, uint32_t u, unsigned width)
{
    u ^= (uint32_t)(u < 2) & t->flip;
    uint32_t i = 0;
    for (uint32_t step = t->size / 2; step; step /= 2)
        i = t->rel[i + step] <= u ? i + step : i;
    if (width == 4)
        return (uint32_t)(u + t->add_lo[i]);
    return u + ((uint64_t)t->add_hi[i] << 32 | t->add_lo[i]);
}

/* ids of u[j], j < count, as width-byte integers: at out[j], or at out[-j] when reverse is set
 * (out points at the element of j = 0 either way). */
void pd__slots_map_scalar(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, unsigned width,
                          int reverse);
#if defined(PD_CPU_HAVE_AVX2)
void pd__slots_map_avx2(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, unsigned width,
                        int reverse);
#endif
#if defined(PD_CPU_HAVE_AVX512)
void pd__slots_map_avx512(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, unsigned width,
                          int reverse);
#endif

/* The interleave kernels' instances (slots_avx2.c, slots_avx512.c), over the file's own always-inline
 * interleave_pow2(stage, step, full, out, m, width): m and width constants, so its loops unroll into
 * registers. Defines interleave_pow2_of(stage, step, m, full, out, width): the columns written, 0 for m
 * not a power of 2 in [2, 16]. */
#define PD__INTERLEAVE_POW2_OF                                                                              \
    typedef uint64_t pd_pow2_fn(const void *, uint64_t, uint64_t, void *);                                 \
    PD__INTERLEAVE_POW2(2, 4) PD__INTERLEAVE_POW2(4, 4) PD__INTERLEAVE_POW2(8, 4) PD__INTERLEAVE_POW2(16, 4) \
    PD__INTERLEAVE_POW2(2, 8) PD__INTERLEAVE_POW2(4, 8) PD__INTERLEAVE_POW2(8, 8) PD__INTERLEAVE_POW2(16, 8) \
    static uint64_t interleave_pow2_of(const void *stage, uint64_t step, unsigned m, uint64_t full, void *out, \
                                       unsigned width)                                                     \
    {                                                                                                      \
        static pd_pow2_fn *const fn[2][4] = {{pow2_2_4, pow2_4_4, pow2_8_4, pow2_16_4},                    \
                                             {pow2_2_8, pow2_4_8, pow2_8_8, pow2_16_8}};                   \
        if (m < 2 || m > 16 || (m & (m - 1)))                                                              \
            return 0;                                                                                      \
        return fn[width == 8][__builtin_ctz(m) - 1](stage, step, full, out);                               \
    }
#define PD__INTERLEAVE_POW2(m, w)                                                                           \
    static uint64_t pow2_##m##_##w(const void *s, uint64_t step, uint64_t full, void *out)                 \
    {                                                                                                      \
        return interleave_pow2(s, step, full, out, m, w);                                                  \
    }

/* A step of subsequences walked side by side (cpu/shards.c), staged a row each, into the output: out[t·m + c] =
 * stage[c·step + t] for t < full and c < m ≤ 16, width-byte ids. Returns the columns written, from 0 on
 * (the kernels take whole vectors, AVX2 only m = 2, 4, 8, 16; the caller writes the rest). */
#if defined(PD_CPU_HAVE_AVX2)
uint64_t pd__interleave_avx2(const void *stage, uint64_t step, unsigned m, uint64_t full, void *out, unsigned width);
#endif
#if defined(PD_CPU_HAVE_AVX512)
uint64_t pd__interleave_avx512(const void *stage, uint64_t step, unsigned m, uint64_t full, void *out,
                               unsigned width);
#endif

#endif
