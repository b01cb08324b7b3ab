/* Sharded epochs on the device: a warp per tile of a rank's positions (its windows' keys and slot tables in shared memory), or the core's per-position kernel, over a device copy of the plan. */
#include <stdlib.h>

#include "check.h"
#include "internal.h"

struct pd_gpu_plan {
    pd_shard_plan plan; /* the host plan's fields, its three tables pointing into mem */
    void *mem;          /* start[S+1], slot_shard[S], slot_start[S+1] */
    int device;
    int narrow;         /* every window holds fewer than 2^32 samples: the tile kernel's 32-bit walk applies */
    int small;          /* and at most 2^(2·PD_VP_SMALL_LBITS + 1): its rounds take one 32-bit multiply */
};

namespace {

constexpr int kBlock = 256;

constexpr unsigned kFull = 0xffffffffu;

/* Philox block blk (0 to 6) of window w's keys: the block pd_keys_derive computes for stream 2 + w
 * (blocks 0-5: round keys 4·blk to 4·blk + 3; block 6: the flip, its first word's low bit). */
__device__ __forceinline__ void window_key_block(const pd_shard_plan &plan, uint64_t w, uint32_t blk, uint32_t out[4])
{
    const uint32_t key[2] = {(uint32_t)plan.seed, (uint32_t)(plan.seed >> 32)};
    const uint32_t ctr[4] = {blk, PD_STREAM_WINDOW_BASE + (uint32_t)w, (uint32_t)plan.epoch,
                             (uint32_t)(plan.epoch >> 32)};
    pd_philox4x32_10(ctr, key, out);
}

/* τ_w for window w, its 24 keys and flip (7 Philox blocks) computed by lanes 0-6 of the warp and
 * shuffled to every lane: deriving them costs more than σ itself, and a warp's positions mostly
 * share one window. Every lane of the warp must call this with the same w. */
__device__ __forceinline__ void warp_window_perm(const pd_shard_plan &plan, uint64_t w, pd_perm *tau)
{
    const unsigned lane = threadIdx.x & 31;
    uint32_t r[4] = {0, 0, 0, 0};
    if (lane < 7)
        window_key_block(plan, w, lane, r); /* one block per lane */
#pragma unroll
    for (int j = 0; j < 6; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            tau->keys.k[4 * j + i] = __shfl_sync(kFull, r[i], j);
    tau->keys.flip = __shfl_sync(kFull, r[0], 6) & 1u;
    const uint64_t *P = plan.slot_start;
    pd__perm_shape(tau, P[pd__window_end(&plan, w)] - P[w * plan.window], PD_MIN_BITS);
}

/* An id (W = 4, 8) or a location (W = 16: shard then offset) at out[k]. */
template <unsigned W>
__device__ __forceinline__ void store_loc(void *out, uint64_t k, const pd_shard_loc &loc)
{
    if (W == 4)
        ((uint32_t *)out)[k] = (uint32_t)loc.sample;
    else if (W == 8)
        ((uint64_t *)out)[k] = loc.sample;
    else
        ((ulonglong2 *)out)[k] = make_ulonglong2(loc.shard, loc.offset);
}

/* out[k] for the rank's k-th position: the core's pd_shard_fill, one position per thread. The loop
 * runs warp by warp (all lanes iterate together, idle ones included) so that lanes can share the
 * window keys; a lane whose window differs from lane 0's derives its own (the core's path). */
template <unsigned W>
__global__ void __launch_bounds__(kBlock) shard_fill(const __grid_constant__ pd_shard_plan plan, uint64_t first,
                                                     uint64_t stride, uint64_t count, void *out)
{
    const unsigned lane = threadIdx.x & 31;
    const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t warp_k = blockIdx.x * (uint64_t)blockDim.x + (threadIdx.x & ~31u); warp_k < count;
         warp_k += step) {
        const uint64_t k = warp_k + lane;
        const bool active = k < count;
        uint64_t pos = first + (active ? k : warp_k) * stride; /* idle lanes shadow lane 0 */
        uint64_t p = pos < plan.n ? pos : pos % plan.n;       /* pad wraps */
        uint64_t x = pd__lane_index(&plan, p), w = pd__window_of(&plan, x);
        pd_perm tau;
        warp_window_perm(plan, __shfl_sync(kFull, w, 0), &tau);
        if (w != __shfl_sync(kFull, w, 0))
            pd__window_perm(&plan, w, &tau);
        if (!active)
            continue;
        pd_shard_loc loc;
        pd__window_locate(&plan, w, &tau, x, &loc);
        store_loc<W>(out, k, loc);
    }
}

/* ---- Tiles: a warp per tile of a rank's positions, walking many windows' runs at once.
 *
 * The arithmetic is cpu/shards.c's (read its opening comment): a rank's positions f + kW fall
 * into m = G / gcd(G, W) subsequences k = c + i·m, each in one lane, whose window-stream index x
 * moves by d = W / gcd(G, W) per step of i (backward on odd lanes), so each crosses a window in
 * one run. Warps take tiles (consecutive i of one subsequence; the subsequences' tiles of one range
 * of i, then the next range's; large requests' tiles span several segments, plan_tiers) from a counter
 * as they come free, and work through each a segment at a time (at most kStage positions, kRuns runs,
 * kSlots slots):
 *   1. plan (plan_segment): lane L takes the L-th window from the segment's first and finds the
 *      segment's positions inside it, a run; the runs that fit go to the warp's shared memory with
 *      τ_w's keys (7 Philox blocks a run, spread over the lanes), the windows' slot tables and
 *      their buckets. A tile's first window is found by 32 lanes probing at once.
 *   2. walk (walk_segment): walk.cuh's refill walk over the segment's positions, two per lane at
 *      a time (σ is a chain of dependent multiplies: one chain per lane left the warps waiting on
 *      it), a lane done with one run's positions taking the next run's, so no lane idles at the
 *      end of a run (runs are often a few hundred positions, and draining the walk at each cost as
 *      much as the walk). Runs whose b is even are walked first, then the odd ones: the shift of
 *      rbits − lbits is then fixed at compile time (small windows: an odd b costs 5 instructions a
 *      round, an even one 4; a shift chosen per lane cost 7 for both). σ's results wait in shared
 *      memory by position.
 *   3. store (store_segment): run by run, each position's slot found between its bucket's and the
 *      next bucket's, stores coalesced.
 * The walk is 32-bit: plans with a window of 2^32 samples or more take the per-position kernel
 * above. Windows of more than kSlots slots are searched in the plan's device tables in step 3.
 * Where the time went (ncu, uneven shards of 512-1535, K = 1, one position per lane): the odd-b
 * walk 59% of the instructions, the even-b walk 22%, planning 10%, stores 8%. */

#ifndef PD_GPU_SHARD_WARPS
#define PD_GPU_SHARD_WARPS 4
#endif
constexpr unsigned kTileWarps = PD_GPU_SHARD_WARPS;
constexpr unsigned kTileBlock = 32 * kTileWarps;
/* Blocks per SM the tile kernel is compiled for: 6 blocks of 4 warps (what shared memory allows)
 * leave it 80 registers, which the walk's two positions per lane use (64 measured slower). */
#ifndef PD_GPU_SHARD_MIN_BLOCKS
#define PD_GPU_SHARD_MIN_BLOCKS 6
#endif
#ifndef PD_GPU_SHARD_TILES_PER_WARP /* tiles per resident warp: 2 measured best among 1, 2, 4, 8 */
#define PD_GPU_SHARD_TILES_PER_WARP 2
#endif
/* Large requests take tiles of several segments (up to PD_GPU_SHARD_BIG_TILE positions): a tile's
 * first segment searches for its window and takes a tile from the counter, the others follow on from
 * the last window. Their last positions go in tiers of half the size each, down to one segment (a
 * tier holding one of the tier before's tiles per resident warp), so that warps still finish
 * together. H100, N = 2^30 (a rank's 134 M ids), against tiles of one segment, alternating: +3-8%
 * on every row (uneven 0.44-0.53 → 0.47-0.61 of flat σ); N = 2^26 (whose requests stay at one
 * segment a tile) unchanged. Segments never get shorter: tiers of 512-128 positions at N = 2^26 cost
 * 22% (each walk's drain, its last, mostly idle iterations, is paid per segment). */
#ifndef PD_GPU_SHARD_BIG_TILE
#define PD_GPU_SHARD_BIG_TILE 8192
#endif
constexpr unsigned kTiers = 4;
#ifndef PD_GPU_SHARD_BY_SUB
#define PD_GPU_SHARD_BY_SUB 0
#endif
#ifndef PD_GPU_SHARD_STAGE
#define PD_GPU_SHARD_STAGE 1024
#endif
constexpr uint32_t kStage = PD_GPU_SHARD_STAGE; /* positions per segment */
#ifndef PD_GPU_SHARD_RUNS
#define PD_GPU_SHARD_RUNS 12
#endif
constexpr uint32_t kRuns = PD_GPU_SHARD_RUNS; /* runs (windows) per segment: 12 leave room for 6 blocks of 4 warps per SM */
constexpr uint32_t kSlots = 128;   /* slots of a segment's windows held in shared memory */
constexpr uint32_t kNoTable = ~0u; /* a run whose window has more slots: searched in the plan */
constexpr uint64_t kMinTile = 256; /* positions per tile at least: each tile's first window is searched */

/* A run as the walk enters it: walk positions j < end are its positions j + to, with σ's argument
 * vo + j·step (step = ±d); its τ_w's shape, and the shifts and multipliers its rounds take (Tau32's,
 * set in planning: a lane enters a run every ~2 refills at K = 1, and the warp executes an entry
 * whenever one lane makes it; H100, uneven K = 1, G = 1: 0.49 → 0.51-0.52 of flat σ, with one-shard
 * windows' bucket tables left out). Three 16-byte loads. */
struct alignas(16) WalkEntry {
    uint32_t end, to, vo, run;
    uint32_t n, rbits, lmask, rmask;
    uint32_t y, hsh, smul, fsh;
};

/* One warp's shared memory: a segment's runs, their windows' slot tables, σ's results. Runs are
 * numbered in position order; the walk takes them in walk order (even b first, then odd: see
 * walk_segment), walks[q] describing the run walked q-th. */
struct Segment {
    uint4 keys[6][kRuns];        /* τ_w's 24 round keys, key-major: lanes of different runs hit different banks */
    uint32_t n[kRuns];           /* m_w: the window's samples (< 2^32) */
    uint32_t flip[kRuns];
    uint32_t v0[kRuns];          /* window-relative x of the run's first position */
    uint32_t tab[kRuns];         /* the run's first slot in the table, or kNoTable */
    uint32_t slots[kRuns];
    uint32_t first[kRuns + 1];   /* segment-relative index of each run's first position; first[runs] = length */
    WalkEntry walks[kRuns];      /* walk order → run, as a lane entering it needs it */
    uint64_t lo[kRuns];          /* the window's first x: P[w·K] */
    uint64_t w[kRuns];
    uint64_t shard[kSlots];
    uint64_t base[kSlots];       /* start[shard] − rel: window-relative u is sample base + u */
    uint32_t rel[kSlots];        /* the slot's first sample, window-relative */
    uint32_t bshift[kRuns];      /* the run's buckets: samples [j·2^bshift, (j+1)·2^bshift) */
    uint8_t bucket[2 * kSlots];  /* per table run, from 2·tab: the slot (from tab) holding each bucket's first sample */
    uint32_t stage[kStage];      /* σ's results by position */
};

/* A request, validated and split on the host. */
struct TileRequest {
    pd_shard_plan plan;
    uint64_t first;  /* the rank's first position f */
    uint64_t world;  /* W */
    uint64_t count;  /* body ids (positions below N) */
    uint64_t m, d;   /* subsequence period and index step */
    uint64_t subs;   /* min(m, count) */
    /* tier k: each subsequence's positions [tier_i[k], tier_i[k + 1]) in tiles of tier_size[k], tiles
     * tier_tile[k] to tier_tile[k + 1] − 1 (tile t: subsequence (t − tier_tile[k]) mod subs);
     * tier_i[kTiers] is the longest subsequence's length */
    uint64_t tier_i[kTiers + 1];
    uint64_t tier_tile[kTiers + 1];
    uint64_t tier_size[kTiers];
    int has_tail;    /* pad: out[count] is the wrapped position tail */
    uint64_t tail;
    unsigned long long *next_tile; /* zeroed before the launch; warps take tiles from it */
};

/* A planned segment: its length, runs, and how many of them (walked first) have an even b. */
struct Plan {
    uint32_t len, runs, even_runs, even_len;
};

/* τ_w of one lane's current run, 32-bit: window-relative values are below m_w < 2^32. Its keys stay
 * in shared memory (a 16-byte load per four rounds): in registers they spilled, 24 of them per lane. */
struct Tau32 {
    const uint4 *keys; /* &s.keys[0][run]: keys[j·kRuns] holds round keys 4j..4j+3 */
    uint32_t n, rbits, lmask, rmask;
    uint32_t hsh, smul, m32, fsh; /* tau_rounds' shifts and multipliers */
    uint32_t y;        /* small windows: pd__vp_small_mult(lbits) */
};

__device__ __forceinline__ uint32_t perm_bits(uint32_t n) /* pd__perm_shape's b for n < 2^32 */
{
    const uint32_t b = n > 1 ? 32 - __clz(n - 1) : 0;
    return b < PD_MIN_BITS ? PD_MIN_BITS : b;
}

/* Windows of b ≤ 2·PD_VP_SMALL_LBITS + 1 bits (every plan whose windows hold at most 2^17 samples) take
 * rounds of one 32-bit multiply (core/perm.h's pd__vp_small_mult): M0·s0's two parts come from Y·s0, the
 * high one by a shift. The 32x32→64 multiply and the multiply-add it replaces were the walk's costliest
 * instructions: uneven shards went 0.39-0.48 → 0.43-0.53 of flat σ on an H200 (same run, both builds).
 * Tried there too, slower: the high part by __umulhi(lo, 2^lbits) (IMAD.HI is dearer than the shift).
 * (S1 by a multiply written in C measured no better: the compiler made it a shift again; fma_mul below
 * keeps it an IMAD, which helped.) PD_GPU_SHARD_SMALL=0 builds
 * the 64-bit rounds alone (for comparison: tests/gpu/run.sh shards-profile with PD_SHARD_VARIANTS). */
#ifndef PD_GPU_SHARD_SMALL
#define PD_GPU_SHARD_SMALL 1
#endif
/* Even b's small rounds at the register's top (tau_f): uniform shards 0.65 → 0.75-0.77 of flat σ on the
 * rows with even windows (H100, alternating builds); uneven ones within noise of the bottom form, but for
 * K = 1, G = 1 (0.44-0.45 against 0.46-0.49). */
#ifndef PD_GPU_SHARD_TOP /* 0: even b's small rounds at the register's bottom (for comparison) */
#define PD_GPU_SHARD_TOP 1
#endif
/* Odd b's small rounds at the register's top too (tau_f): 3 ALU and 3 FMA-pipe instructions a round
 * instead of 4 and 2, for the walk is ALU-pipe bound. H100, both builds in one run (twice): uneven
 * K = 1, G = 1 0.46-0.48 of flat σ against 0.45-0.46, other rows within noise. Taking C's shift down
 * by IMAD.HI instead was slower (K = 1: 0.41). */
#ifndef PD_GPU_SHARD_ODD_TOP /* 0: odd b's small rounds at the bottom, s1's top bit by a funnel shift */
#define PD_GPU_SHARD_ODD_TOP 1
#endif
/* The odd top round now takes 5 instructions (2 IMAD, LOP3, 2 SHF: tau_f), where carrying s1's top bit
 * in a register of its own took 6 (3 IMAD, LOP3, 2 SHF). H100, against the 6-instruction round,
 * alternating twice: uneven shards at N ≈ 2^30 +2-5% on every row (K = 1, G = 1 0.47 → 0.49 of flat σ),
 * at N ≈ 2^26 K = 64 +2-6%, K = 1, G = 1 +1-2%, uniform K = 8 (b = 13) up to +10%. */

/* x·y as an IMAD: a multiply the compiler cannot see is by a power of two, so it stays on the FMA pipe
 * instead of becoming a shift on the ALU pipe, which the walk keeps busiest (ncu: 73-78% against
 * 13-17%). For S1 in odd rounds it lifted uneven shards by ~0.03 of flat on the H100 (0.45-0.54
 * against 0.43-0.54, both builds alternating twice). */
__device__ __forceinline__ uint32_t fma_mul(uint32_t x, uint32_t y)
{
    uint32_t r;
    asm("mul.lo.u32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(y));
    return r;
}

/* The core's pd__vphilox_d on 32-bit values (the parity correction waits for the store: it only swaps
 * 0 and 1, which end the walk alike), D = rbits − lbits fixed for the warp. General rounds cost 4
 * instructions for an even b. For an odd b the core's lo = (lo << 1) | (s1 >> lbits) takes s1's top
 * bit; here s1 is also kept top-aligned (S1), so a funnel shift does it in one, and s1 stays unmasked
 * (the xor's & lmask drops what rmask would): 6 instructions a round instead of 7, S1's shift done as
 * a multiply (fma_mul).
 * SMALL: lbits ≤ PD_VP_SMALL_LBITS, and the product is Y·s0's 32 bits (core/perm.h), its high part
 * their top lbits (instead of a 32x32→64 multiply and a multiply-add). SMALL rounds work at the top of
 * the register: their keys come shifted there (plan_segment), s1's low lbits bits live there (S1), so
 * X = p ^ k ^ S1 holds the new s0 in its top lbits and one shift brings it down. Even b: S1 = p moved
 * up by a multiply; 4 instructions, 2 on the FMA pipe (IMAD, LOP3, SHF, IMAD). Odd b: see below; 5
 * instructions, 2 on the FMA pipe, where the bottom-aligned round had 6, 4 of them on the ALU pipe. */
template <int D, bool SMALL>
__device__ __forceinline__ uint32_t tau_f(const Tau32 &t, uint32_t v)
{
    const uint32_t lmask = t.lmask, rmask = t.rmask, hshift = t.hsh, smul = t.smul;
    if (SMALL && (D ? PD_GPU_SHARD_ODD_TOP : PD_GPU_SHARD_TOP)) {
        /* t.y = Y (pd__vp_small_mult(lbits)): p = Y·s0 holds hi in its top lbits and lo in its low
         * lbits. Even b: the next S1 is lo moved to the top by a multiply. Odd b: the next S1 is lo's
         * bits 0 to lbits − 2 above s1's top bit, which is the last round's lo's bit lbits − 1; R =
         * p·2^(32−lbits) holds lo at the top, so one funnel shift of the last round's R below this
         * round's p joins them: S1 = (p:R_last) << (33 − lbits), its high word. What lands below bit
         * 32 − lbits only reaches X's low bits, which the shift drops. At the end, s1 = lo·2 | that
         * top bit, from R and S1. (The odd round was checked against the core for every value of
         * b = 7 to 17 with random keys, then by test_gpu_shards.) */
        const uint32_t fsh = t.fsh, m32 = t.m32; /* odd b: 33 − lbits, 2^(32 − lbits) */
        const uint32_t s1 = v & rmask;
        uint32_t s0 = v >> t.rbits, S1 = (D ? s1 : v) << hshift, R = D ? s1 << (hshift - 1) : 0;
#pragma unroll
        for (int j = 0; j < 6; j++) {
            const uint4 q = t.keys[j * kRuns]; /* shifted to the top */
            const uint32_t k[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t p = t.y * s0;
                s0 = (p ^ k[i] ^ S1) >> hshift;
                if (D) {
                    S1 = __funnelshift_l(R, p, fsh);
                    R = fma_mul(p, m32);
                } else {
                    S1 = fma_mul(p, smul);
                }
            }
        }
        return D ? (s0 << t.rbits) | (R >> (hshift - 1)) | ((S1 >> hshift) & 1u) : (s0 << t.rbits) | (S1 >> hshift);
    }
    uint32_t s0 = v >> t.rbits, s1 = D ? v : v & rmask, S1 = v << (32 - t.rbits);
#pragma unroll
    for (int j = 0; j < 6; j++) {
        const uint4 q = t.keys[j * kRuns];
        const uint32_t k[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t hi, lo;
            if (SMALL) {
                lo = t.y * s0;
                hi = lo >> hshift;
            } else {
                const uint64_t prod = PD_VP_M0 * (uint64_t)s0;
                hi = (uint32_t)(prod >> 32);
                lo = (uint32_t)prod;
            }
            s0 = (hi ^ k[i] ^ s1) & lmask;
            if (D) {
                s1 = __funnelshift_l(S1, lo, 1); /* (lo << 1) | the old s1's bit lbits */
                S1 = fma_mul(s1, smul);
            } else {
                s1 = lo & rmask;
            }
        }
    }
    return (s0 << t.rbits) | (s1 & rmask);
}

/* e's shifts and multipliers for its rounds, lbits = ⌊b/2⌋ and d = b mod 2 (small: rounds of one
 * 32-bit multiply, tau_f). */
__device__ __forceinline__ void tau_rounds(WalkEntry &e, bool small, uint32_t lbits, uint32_t d)
{
    e.hsh = 32 - lbits;               /* a SMALL product's high part sits above it */
    e.smul = 1u << (32 - e.rbits);    /* S1 = s1 << (32 − rbits) as a multiply */
    e.fsh = 33 - lbits;               /* odd b's funnel shift (top rounds) */
    e.y = small ? pd__vp_small_mult(lbits) : 0;
}

/* τ_w's shape as a lane entering a run of the walk needs it (enter in walk_segment), from the run's
 * entry: the per-run shifts and multipliers are set once per run in planning (tau_rounds), not once
 * per evaluation, nor at each entry. With the parity correction
 * moved to the store, that took uneven shards from 0.45-0.56 to 0.49-0.61 of flat σ (H100, against
 * the tree before the odd top-aligned round, alternating: ODD_TOP's part is above). */
template <int D, bool SMALL>
__device__ __forceinline__ void tau_shape(Tau32 &t, const uint4 *keys, const WalkEntry &e)
{
    t.keys = keys;
    t.n = e.n;
    t.rbits = e.rbits;
    t.lmask = e.lmask;
    t.rmask = e.rmask;
    t.hsh = e.hsh;
    t.smul = e.smul;
    t.m32 = 2 * e.smul; /* odd b: 2^(32 − lbits) */
    t.fsh = e.fsh;
    t.y = e.y;
}

/* a / d for d < 2^32, in 32 bits when a fits: a spans a few windows, and a 64-bit division is a call. */
__device__ __forceinline__ uint64_t quot(uint64_t a, uint64_t d)
{
    return a >> 32 ? a / d : (uint32_t)a / (uint32_t)d;
}

/* The window of x (pd__window_of's answer), the warp's lanes probing 32 windows a round: a few
 * rounds of loads instead of a dozen one after another. Every lane of the warp calls it alike. */
__device__ uint64_t warp_window_of(const pd_shard_plan &plan, uint64_t x)
{
    const unsigned lane = threadIdx.x & 31u;
    uint64_t lo = 0, hi = plan.windows; /* P[lo·K] ≤ x, and x < P[hi·K] where hi < windows */
    while (hi - lo > 1) {
        const uint64_t step = (hi - lo + 31) / 32, w = lo + lane * step;
        const bool ok = w < hi && plan.slot_start[w * plan.window] <= x;
        lo += (31 - __clz(__ballot_sync(kFull, ok))) * step; /* lane 0 (w = lo) always holds */
        hi = hi - lo < step ? hi : lo + step;
    }
    return lo;
}

__device__ __forceinline__ bool window_holds(const pd_shard_plan &plan, uint64_t w, uint64_t x)
{
    return w < plan.windows && plan.slot_start[w * plan.window] <= x && x < plan.slot_start[pd__window_end(&plan, w)];
}

/* Plan the segment of positions i, i+1, ... (below end) of a subsequence starting at window-stream
 * index x0: write its runs to s. *guess: a window to try first (the last segment's last). Every
 * lane of the warp calls it alike. */
__device__ __noinline__ Plan plan_segment(const pd_shard_plan &plan, Segment &s, uint64_t x0, bool back, uint64_t d,
                                          uint64_t i, uint64_t end, uint64_t *guess, bool small)
{
    const unsigned lane = threadIdx.x & 31u, below = (1u << lane) - 1u;
    const uint64_t *P = plan.slot_start;
    const uint64_t x = back ? x0 - i * d : x0 + i * d;
    uint64_t w = *guess;
    if (!window_holds(plan, w, x)) {
        const uint64_t near = back ? w - 1 : w + 1; /* the window after the last, in walking order */
        w = window_holds(plan, near, x) ? near : warp_window_of(plan, x);
    }
    /* lane L: window w ± L and the positions of [i, end) inside it: [a, b) */
    const bool valid = back ? w >= lane : w + lane < plan.windows;
    const uint64_t wl = back ? w - lane : w + lane;
    uint64_t a = 0, b = 0, lo = 0, hi = 0, slots = 0;
    if (valid) {
        const uint64_t first_slot = wl * plan.window, last_slot = pd__window_end(&plan, wl);
        lo = P[first_slot];
        hi = P[last_slot];
        slots = last_slot - first_slot;
        /* offsets from i: position i + o lies at x ± o·d */
        if (back) {
            a = x >= hi ? quot(x - hi, d) + 1 : 0;
            b = x >= lo ? quot(x - lo, d) + 1 : 0;
        } else {
            a = lo > x ? quot(lo - x + d - 1, d) : 0;
            b = hi > x ? quot(hi - x + d - 1, d) : 0;
        }
        const uint64_t stop = end - i < kStage ? end - i : kStage;
        a += i;
        b = i + (b < stop ? b : stop);
    }
    /* Runs in lane order while they fit: kRuns of them, kSlots table slots. */
    const bool some = a < b;
    const uint32_t need = some && slots <= kSlots ? (uint32_t)slots : 0;
    uint32_t upto = need; /* inclusive prefix sums over the lanes */
#pragma unroll
    for (unsigned o = 1; o < 32; o *= 2) {
        const uint32_t y = __shfl_up_sync(kFull, upto, o);
        upto += lane >= o ? y : 0;
    }
    const uint32_t rank = __popc(__ballot_sync(kFull, some) & below);
    const bool taken = some && rank < kRuns && upto <= kSlots;
    const unsigned took = __ballot_sync(kFull, taken);
    const unsigned last = 31 - __clz(took); /* lane 0 always takes its run: x lies in window w */
    const uint32_t n = (uint32_t)(hi - lo), len = taken ? (uint32_t)(b - a) : 0;
    const bool odd = perm_bits(n) % 2;
    /* walk order: the even runs, then the odd ones; each's positions before it in that order */
    const unsigned evens = __ballot_sync(kFull, taken && !odd), odds = took & ~evens;
    uint64_t both = odd ? (uint64_t)len << 32 : len; /* even lengths low, odd high */
#pragma unroll
    for (unsigned o = 1; o < 32; o *= 2) {
        const uint64_t y = __shfl_up_sync(kFull, both, o);
        both += lane >= o ? y : 0;
    }
    const uint64_t all = __shfl_sync(kFull, both, 31);
    Plan pl;
    pl.runs = __popc(took);
    pl.even_runs = __popc(evens);
    pl.even_len = (uint32_t)all;
    pl.len = (uint32_t)(__shfl_sync(kFull, b, last) - i);
    *guess = __shfl_sync(kFull, wl, last);
    if (taken) {
        s.first[rank] = (uint32_t)(a - i);
        s.n[rank] = n;
        s.v0[rank] = (uint32_t)((back ? x - (a - i) * d : x + (a - i) * d) - lo);
        s.tab[rank] = slots <= kSlots ? upto - need : kNoTable;
        s.slots[rank] = (uint32_t)slots;
        s.lo[rank] = lo;
        s.w[rank] = wl;
        const uint32_t q = odd ? pl.even_runs + __popc(odds & below) : __popc(evens & below);
        const uint32_t cum = odd ? pl.even_len + (uint32_t)(both >> 32) - len : (uint32_t)both - len;
        const uint32_t step = back ? 0u - (uint32_t)d : (uint32_t)d, bits = perm_bits(n);
        WalkEntry e;
        e.end = cum + len;
        e.to = s.first[rank] - cum;
        e.vo = s.v0[rank] - cum * step;
        e.run = rank;
        e.n = n > 1 ? n : UINT32_MAX; /* one sample: any value is taken, and the store reads 0 */
        e.rbits = bits - bits / 2;
        e.lmask = (1u << (bits / 2)) - 1;
        e.rmask = (1u << e.rbits) - 1; /* rbits ≤ 16 */
        tau_rounds(e, small, bits / 2, bits % 2);
        s.walks[q] = e;
    }
    if (lane == 0)
        s.first[pl.runs] = pl.len;
    __syncwarp();
    /* τ_w's keys: pd_keys_derive's 7 Philox blocks of each run, one block per lane */
    for (uint32_t q = lane; q < 7 * pl.runs; q += 32) {
        const uint32_t r = q / 7, blk = q % 7;
        uint32_t o[4];
        window_key_block(plan, s.w[r], blk, o);
        const uint32_t bits = perm_bits(s.n[r]);
        const bool top = small && (bits % 2 ? PD_GPU_SHARD_ODD_TOP : PD_GPU_SHARD_TOP);
        const uint32_t up = top ? 32 - bits / 2 : 0;
        if (blk < 6) /* small rounds at the register's top take their keys there (tau_f) */
            s.keys[blk][r] = make_uint4(o[0] << up, o[1] << up, o[2] << up, o[3] << up);
        else
            s.flip[r] = o[0] & 1u;
    }
    /* the windows' slot tables */
    const uint32_t total = __shfl_sync(kFull, upto, last);
    for (uint32_t e = lane; e < total; e += 32) {
        uint32_t r = 0;
        for (uint32_t q = 0; q < pl.runs; q++)
            r = s.tab[q] != kNoTable && s.tab[q] <= e ? q : r;
        const uint64_t t = s.w[r] * plan.window + (e - s.tab[r]);
        const uint64_t sh = plan.slot_shard[t];
        const uint32_t rel = (uint32_t)(P[t] - s.lo[r]);
        s.rel[e] = rel;
        s.shard[e] = sh;
        s.base[e] = plan.start[sh] - rel;
    }
    __syncwarp();
    /* buckets: nb = 2^lg ≥ slots of them (nb + 1 ≤ 2·slots entries from 2·tab) cover [0, 2^b) ⊇ [0, m_w),
     * so a lookup searches only the slots between its bucket's and the next one's */
    for (uint32_t r = 0; r < pl.runs; r++) {
        const uint32_t tab = s.tab[r], slots = s.slots[r], m = s.n[r];
        if (tab == kNoTable || slots < 2) /* a window of one shard: the store needs no search */
            continue;
        const uint32_t lg = slots > 1 ? 32 - __clz(slots - 1) : 0, b = m > 1 ? 32 - __clz(m - 1) : 0;
        const uint32_t shift = b > lg ? b - lg : 0;
        for (uint32_t j = lane; j <= (1u << lg); j += 32) {
            const uint32_t u = (j << shift) < m ? j << shift : m - 1;
            uint32_t e = tab;
            for (uint32_t c = slots; c > 1;) {
                const uint32_t h = c / 2;
                e = s.rel[e + h] <= u ? e + h : e;
                c -= h;
            }
            s.bucket[2 * tab + j] = (uint8_t)(e - tab);
        }
        if (lane == 0)
            s.bshift[r] = shift;
    }
    __syncwarp();
    return pl;
}

/* Step 2: σ of walk positions begin to end (the runs walked q-th from q0 on) into s.stage, every run
 * of them with rbits − lbits = D, lanes refilled across runs. Not inlined: it gets registers of its
 * own, away from the tile loop's. */
template <int D, bool SMALL>
__device__ __noinline__ void walk_segment(Segment &s, uint32_t q0, uint32_t begin, uint32_t end, uint32_t step)
{
    const unsigned lane = threadIdx.x & 31u, below = (1u << lane) - 1u;
    /* Two walk positions per lane, computed side by side: one σ is a chain of dependent multiplies,
     * and a lane with two in flight keeps the multiply pipe fed where one chain left it waiting. */
    struct Item {
        uint32_t j, v, q, qend, to, vo;
        Tau32 tau;
        bool busy;
    } it[2];
    const auto enter = [&](Item &x) { /* the run of walk position x.j, from x.q on */
        while (x.j >= s.walks[x.q].end)
            x.q++;
        const WalkEntry e = s.walks[x.q];
        x.qend = e.end;
        x.to = e.to;
        x.vo = e.vo;
        tau_shape<D, SMALL>(x.tau, &s.keys[0][e.run], e);
    };
    WalkEntry idle = {}; /* b = 6 + D */
    idle.n = 2;
    idle.rbits = 3 + D;
    idle.lmask = 7;
    idle.rmask = 7 + 8 * D;
    tau_rounds(idle, SMALL, 3, D);
    uint32_t next = begin + 64;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        Item &x = it[k];
        x.j = begin + 32 * k + lane;
        x.q = q0;
        x.busy = x.j < end;
        tau_shape<D, SMALL>(x.tau, &s.keys[0][0], idle); /* an idle item computes on something harmless */
        x.v = x.qend = x.to = x.vo = 0;
        if (x.busy) {
            enter(x);
            x.v = x.vo + x.j * step;
        }
    }
    while (__any_sync(kFull, it[0].busy || it[1].busy)) {
        const uint32_t f0 = tau_f<D, SMALL>(it[0].tau, it[0].v), f1 = tau_f<D, SMALL>(it[1].tau, it[1].v);
        it[0].v = it[0].busy ? f0 : it[0].v;
        it[1].v = it[1].busy ? f1 : it[1].v;
        bool done[2];
        unsigned fin[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            done[k] = it[k].busy && it[k].v < it[k].tau.n;
            if (done[k])
                s.stage[it[k].j + it[k].to] = it[k].v;
            fin[k] = __ballot_sync(kFull, done[k]);
        }
        const uint32_t rank[2] = {(uint32_t)__popc(fin[0] & below), (uint32_t)(__popc(fin[0]) + __popc(fin[1] & below))};
#pragma unroll
        for (int k = 0; k < 2; k++) {
            Item &x = it[k];
            if (done[k]) {
                x.j = next + rank[k];
                x.busy = x.j < end;
                if (x.busy) {
                    if (x.j >= x.qend)
                        enter(x);
                    x.v = x.vo + x.j * step;
                }
            }
        }
        next += __popc(fin[0]) + __popc(fin[1]);
    }
    __syncwarp();
}

/* Step 3: each position's sample from its window's slots, run by run; out[k0 + t·m]. σ's parity
 * correction (u < 2: u ^ flip) is applied here, the walk having left it out. */
template <unsigned W>
__device__ __noinline__ void store_segment(const pd_shard_plan &plan, const Segment &s, uint32_t runs, uint64_t k0, uint64_t m,
                              void *out)
{
    const unsigned lane = threadIdx.x & 31u;
    for (uint32_t r = 0; r < runs; r++) {
        const uint32_t f0 = s.first[r], f1 = s.first[r + 1], tab = s.tab[r], slots = s.slots[r];
        const uint32_t keep = s.n[r] > 1 ? ~0u : 0; /* a window of one sample: its walk took any value */
        const uint32_t flip = s.flip[r] & keep;     /* σ's parity correction, left out of the walk */
        if (tab != kNoTable) {
            const uint8_t *bucket = &s.bucket[2 * tab];
            const uint32_t shift = s.bshift[r];
            for (uint32_t t = f0 + lane; t < f1; t += 32) {
                uint32_t u = s.stage[t] & keep;
                u ^= flip & (uint32_t)(u < 2);
                uint32_t e = tab; /* the last slot starting at or before u: between u's bucket's and the next's */
                if (slots > 1) {
                    const uint32_t j = u >> shift, first = bucket[j];
                    e += first;
                    for (uint32_t c = bucket[j + 1] - first + 1; c > 1;) {
                        const uint32_t h = c / 2;
                        e = s.rel[e + h] <= u ? e + h : e;
                        c -= h;
                    }
                }
                pd_shard_loc loc;
                loc.shard = s.shard[e];
                loc.offset = u - s.rel[e];
                loc.sample = s.base[e] + u;
                store_loc<W>(out, k0 + (uint64_t)t * m, loc);
            }
        } else {
            const uint64_t *P = plan.slot_start;
            const uint64_t w = s.w[r], lo = s.lo[r];
            for (uint32_t t = f0 + lane; t < f1; t += 32) {
                const uint32_t u = s.stage[t] & keep;
                const uint64_t x = lo + (u ^ (flip & (uint32_t)(u < 2)));
                const uint64_t slot = pd__last_at_most(P, 1, w * plan.window, pd__window_end(&plan, w), x);
                pd_shard_loc loc;
                loc.shard = plan.slot_shard[slot];
                loc.offset = x - P[slot];
                loc.sample = plan.start[loc.shard] + loc.offset;
                store_loc<W>(out, k0 + (uint64_t)t * m, loc);
            }
        }
    }
    __syncwarp();
}

/* Pad's wrapped last position (out of line: the core's 64-bit σ would crowd the tile loop's registers). */
template <unsigned W>
__device__ __noinline__ void store_tail(const TileRequest &r, void *out)
{
    pd_shard_loc loc;
    pd__shard_at(&r.plan, r.tail % r.plan.n, &loc);
    store_loc<W>(out, r.count, loc);
}

template <unsigned W, bool SMALL>
__global__ void __launch_bounds__(kTileBlock, PD_GPU_SHARD_MIN_BLOCKS)
    shard_tiles(const __grid_constant__ TileRequest r, void *out)
{
    __shared__ Segment segments[kTileWarps];
    Segment &s = segments[threadIdx.x >> 5];
    const pd_shard_plan &plan = r.plan;
    if (r.has_tail && blockIdx.x == 0 && threadIdx.x == 0)
        store_tail<W>(r, out);
    uint64_t guess = plan.windows; /* none yet */
    for (;;) { /* tiles taken as warps come free: windows differ in cost (b's parity, σ's walk) */
        uint64_t tile = 0;
        if ((threadIdx.x & 31u) == 0)
            tile = atomicAdd(r.next_tile, 1ull);
        tile = __shfl_sync(kFull, tile, 0);
        if (tile >= r.tier_tile[kTiers])
            break;
        unsigned k = 0;
        while (tile >= r.tier_tile[k + 1])
            k++;
        const uint64_t t = tile - r.tier_tile[k], size = r.tier_size[k];
        /* tile t: subsequence t mod subs, its positions from t / subs tiles on, so that running warps write
         * near one another: with m > 1 subsequences interleave in the output, and taken subsequence by
         * subsequence (PD_GPU_SHARD_BY_SUB=1) each line of an output larger than L2 went to memory m
         * times, a part at a time. H100, N = 2^30, K = 8: G = 8, W = 1 0.32-0.34 → 0.54-0.56 of flat σ,
         * G = 3, W = 8 0.52-0.54 → 0.55-0.66 (alternating builds; N = 2^26, whose output fits in L2: the same). */
#if PD_GPU_SHARD_BY_SUB
        const uint64_t per = (r.tier_i[k + 1] - r.tier_i[k] + size - 1) / size; /* tiles per subsequence */
        const uint64_t c = t / per, i0 = r.tier_i[k] + t % per * size;
#else
        const uint64_t c = t % r.subs, i0 = r.tier_i[k] + t / r.subs * size;
#endif
        const uint64_t n = (r.count - c - 1) / r.m + 1; /* this subsequence's positions */
        if (i0 >= n)
            continue;
        const uint64_t e = r.tier_i[k + 1] - i0 < size ? r.tier_i[k + 1] : i0 + size;
        const uint64_t i1 = e < n ? e : n;
        const uint64_t p = r.first + c * r.world, G = plan.lanes;
        const uint64_t lane = p % G, step = p / G, lb = pd__lane_begin(&plan, lane);
        const bool back = lane % 2;
        const uint64_t x0 = back ? lb + pd__lane_length(&plan, lane) - 1 - step : lb + step;
        for (uint64_t i = i0; i < i1;) {
            const Plan pl = plan_segment(plan, s, x0, back, r.d, i, i1, &guess, SMALL);
            const uint32_t step = back ? 0u - (uint32_t)r.d : (uint32_t)r.d;
            if (pl.even_runs)
                walk_segment<0, SMALL>(s, 0, 0, pl.even_len, step);
            if (pl.even_runs < pl.runs)
                walk_segment<1, SMALL>(s, pl.even_runs, pl.even_len, pl.len, step);
            store_segment<W>(plan, s, pl.runs, c + i * r.m, r.m, out);
            i += pl.len;
        }
    }
}

/* r's tiers for subsequences of at most longest positions: tiles of size tile, then tiers of half the
 * size each down to one segment (kStage), tier k > 0 holding one tile of tier k − 1 per resident warp,
 * taken from the end. Boundaries fall on multiples of 32 positions (coalesced stores). */
void plan_tiers(TileRequest &r, uint64_t tile, uint64_t warps, uint64_t longest)
{
    const uint64_t least = tile < kStage ? tile : kStage;
    uint64_t size[kTiers], len[kTiers] = {0};
    for (unsigned k = 0; k < kTiers; k++) {
        const uint64_t half = k ? size[k - 1] / 2 : tile;
        size[k] = half > least ? half : least;
    }
    uint64_t left = longest;
    for (unsigned k = kTiers - 1; k > 0; k--) { /* the small tiers, from the end */
        const uint64_t want = size[k] < size[k - 1] ? (warps * size[k - 1] + r.subs - 1) / r.subs : 0;
        len[k] = want < left ? want : left;
        left -= len[k];
    }
    len[0] = left;
    uint64_t at = 0, tiles = 0;
    for (unsigned k = 0; k < kTiers; k++) { /* at stays a multiple of 32, so end ≥ at */
        const uint64_t end = k + 1 < kTiers ? (at + len[k]) / 32 * 32 : longest;
        r.tier_i[k] = at;
        r.tier_tile[k] = tiles;
        r.tier_size[k] = size[k];
        tiles += r.subs * ((end - at + size[k] - 1) / size[k]);
        at = end;
    }
    r.tier_i[kTiers] = longest;
    r.tier_tile[kTiers] = tiles;
}

/* Resident blocks of the tile kernel per SM (asked once per width and kind of round). */
template <unsigned W, bool SMALL>
int tile_blocks_per_sm()
{
    static int blocks = 0;
    if (!blocks &&
        (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, shard_tiles<W, SMALL>, kTileBlock, 0) != cudaSuccess ||
         blocks < 1))
        blocks = 1;
    return blocks;
}

template <unsigned W>
cudaError_t launch_fill(pd_gpu *g, const pd_gpu_plan *dp, uint64_t first, uint64_t world, uint64_t count,
                        void *dev_out)
{
    const pd_shard_plan &plan = dp->plan;
    const uint64_t G = plan.lanes;
    uint64_t a = G, b = world;
    while (b) {
        const uint64_t t = a % b;
        a = b;
        b = t;
    }
    const uint64_t m = G / a;
    if (count < 32 * m || !dp->narrow) { /* subsequences too short for a warp each, or wide windows */
        const uint64_t want = (count + kBlock - 1) / kBlock, cap = (uint64_t)g->sms * 32;
        shard_fill<W><<<(unsigned)(want < cap ? want : cap), kBlock, 0, g->stream>>>(plan, first, world, count, dev_out);
        return cudaGetLastError();
    }
    TileRequest r = {};
    r.plan = plan;
    r.first = first;
    r.world = world;
    r.count = count;
    if (first + (count - 1) * world >= plan.n) { /* pad: the last position wraps */
        r.has_tail = 1;
        r.tail = first + (count - 1) * world;
        r.count--;
    }
    r.m = m;
    r.d = world / a;
    r.subs = m < r.count ? m : r.count;
    /* A few tiles per resident warp, so that warps finish together, up to a segment each. */
    const bool small = PD_GPU_SHARD_SMALL && dp->small;
    const uint64_t resident = (uint64_t)g->sms * (small ? tile_blocks_per_sm<W, true>() : tile_blocks_per_sm<W, false>());
    const uint64_t warps = resident * kTileWarps;
    uint64_t tile = (r.count / (PD_GPU_SHARD_TILES_PER_WARP * warps) + 31) / 32 * 32;
    tile = tile < kMinTile ? kMinTile : tile > PD_GPU_SHARD_BIG_TILE ? PD_GPU_SHARD_BIG_TILE : tile;
    if (tile > kStage) /* whole segments: a tile's last one would be a short walk */
        tile = tile / kStage * kStage;
    if (!g->tiles) {
        const cudaError_t e = cudaMalloc(&g->tiles, sizeof(unsigned long long));
        if (e != cudaSuccess)
            return e;
    }
    r.next_tile = (unsigned long long *)g->tiles;
    const cudaError_t e = cudaMemsetAsync(g->tiles, 0, sizeof(unsigned long long), g->stream);
    if (e != cudaSuccess)
        return e;
    const uint64_t longest = r.subs ? (r.count - 1) / m + 1 : 0;
    plan_tiers(r, tile, warps, longest);
    const uint64_t tiles = r.tier_tile[kTiers];
    const uint64_t want = tiles ? (tiles + kTileWarps - 1) / kTileWarps : 1;
    const unsigned blocks = (unsigned)(want < resident ? want : resident);
    if (small)
        shard_tiles<W, true><<<blocks, kTileBlock, 0, g->stream>>>(r, dev_out);
    else
        shard_tiles<W, false><<<blocks, kTileBlock, 0, g->stream>>>(r, dev_out);
    return cudaGetLastError();
}

int queue_fill(pd_gpu *g, const pd_gpu_plan *dp, uint64_t first, uint64_t stride, uint64_t count, void *dev_out,
               unsigned width)
{
    if (count == 0)
        return PD_OK;
    if (width == 4)
        return pd_gpu_err(launch_fill<4>(g, dp, first, stride, count, dev_out));
    if (width == 8)
        return pd_gpu_err(launch_fill<8>(g, dp, first, stride, count, dev_out));
    return pd_gpu_err(launch_fill<16>(g, dp, first, stride, count, dev_out));
}

/* Validate as the core does, then clamp count to what the rank has left. */
int prepare(const pd_gpu *g, const pd_gpu_plan *dp, const pd_slice *s, uint64_t *count, const void *out,
            unsigned width, uint64_t *written)
{
    uint64_t left;
    if (!g || !dp || !written || (!out && *count) || (width != 4 && width != 8 && width != 16))
        return PD_EINVAL;
    if (dp->device != g->device)
        return PD_EINVAL;
    int rc = pd_slice_remaining(dp->plan.n, s, &left);
    if (rc)
        return rc;
    if (width == 4 && pd_id_width(dp->plan.n) != 4)
        return PD_EOVERFLOW;
    if (*count > left)
        *count = left;
    return PD_OK;
}

} // namespace

extern "C" int pd_gpu_plan_upload(pd_gpu *g, const pd_shard_plan *plan, pd_gpu_plan **out)
{
    int rc = PD_OK;
    if (!g || !plan || !out || !plan->start || !plan->slot_shard || !plan->slot_start || plan->shards == 0)
        return PD_EINVAL;
    *out = NULL;
    pd_gpu_plan *dp = (pd_gpu_plan *)calloc(1, sizeof *dp);
    if (!dp)
        return PD_ENOMEM;
    const uint64_t S = plan->shards;
    uint64_t *mem = NULL;
    dp->device = g->device;
    dp->plan = *plan;
    dp->narrow = dp->small = 1;
    for (uint64_t w = 0; w < plan->windows; w++) {
        const uint64_t m = plan->slot_start[pd__window_end(plan, w)] - plan->slot_start[w * plan->window];
        if (m > UINT32_MAX)
            dp->narrow = 0;
        if (m > UINT64_C(1) << (2 * PD_VP_SMALL_LBITS + 1)) /* b > 17: lbits > 8 */
            dp->small = 0;
    }
    CUDACHECKGOTO(cudaSetDevice(g->device), rc, fail);
    CUDACHECKGOTO(cudaMalloc(&dp->mem, (size_t)(3 * S + 2) * sizeof(uint64_t)), rc, fail);
    mem = (uint64_t *)dp->mem;
    CUDACHECKGOTO(cudaMemcpyAsync(mem, plan->start, (size_t)(S + 1) * 8, cudaMemcpyHostToDevice, g->stream), rc, fail);
    CUDACHECKGOTO(cudaMemcpyAsync(mem + S + 1, plan->slot_shard, (size_t)S * 8, cudaMemcpyHostToDevice, g->stream), rc,
                  fail);
    CUDACHECKGOTO(cudaMemcpyAsync(mem + 2 * S + 1, plan->slot_start, (size_t)(S + 1) * 8, cudaMemcpyHostToDevice,
                                  g->stream),
                  rc, fail);
    CUDACHECKGOTO(cudaStreamSynchronize(g->stream), rc, fail); /* the host tables may go away after this */
    dp->plan.start = mem;
    dp->plan.slot_shard = mem + S + 1;
    dp->plan.slot_start = mem + 2 * S + 1;
    *out = dp;
    return PD_OK;
fail:
    pd_gpu_plan_free(g, dp);
    return rc;
}

extern "C" void pd_gpu_plan_free(pd_gpu *g, pd_gpu_plan *dp)
{
    if (!dp)
        return;
    if (dp->mem && cudaSetDevice(dp->device) == cudaSuccess) {
        if (g)
            cudaStreamSynchronize(g->stream); /* no kernel still reads the tables */
        cudaFree(dp->mem);
    }
    free(dp);
}

extern "C" int pd_gpu_shard_slice_fill(pd_gpu *g, const pd_gpu_plan *dp, const pd_slice *s, uint64_t count,
                                       void *dev_out, unsigned width, uint64_t *written)
{
    int rc = prepare(g, dp, s, &count, dev_out, width, written);
    if (rc)
        return rc;
    CUDACHECK(cudaSetDevice(g->device));
    if ((rc = queue_fill(g, dp, s->offset + s->rank, s->world, count, dev_out, width)))
        return rc;
    *written = count;
    return PD_OK;
}

extern "C" int pd_gpu_shard_slice_fill_host(pd_gpu *g, const pd_gpu_plan *dp, const pd_slice *s, uint64_t count,
                                            void *host_out, unsigned width, uint64_t *written)
{
    int rc = prepare(g, dp, s, &count, host_out, width, written);
    if (rc)
        return rc;
    CUDACHECK(cudaSetDevice(g->device));
    rc = pd_gpu__fill_host(g, count, width, host_out, [&](uint64_t done, uint64_t c) {
        return queue_fill(g, dp, s->offset + s->rank + done * s->world, s->world, c, g->staging, width);
    });
    if (rc)
        return rc;
    *written = count;
    return PD_OK;
}
