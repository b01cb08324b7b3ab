/* Sharded epochs on the device: a warp per tile of window runs (the window's slot table in shared memory), or the core's per-position kernel, over a device copy of the plan. */
#include <stdlib.h>

#include "check.h"
#include "internal.h"

struct pd_gpu_plan {
    pd_shard_plan plan; /* the host plan's fields, its three tables pointing into mem */
    void *mem;          /* start[S+1], slot_shard[S], slot_start[S+1] */
    int device;
};

namespace {

constexpr int kBlock = 256;

constexpr unsigned kFull = 0xffffffffu;

/* τ_w for window w, its 24 keys and flip (7 Philox blocks) computed by lanes 0-6 of the warp and
 * shuffled to every lane: deriving them costs more than σ itself, and a warp's positions mostly
 * share one window. Every lane of the warp must call this with the same w. */
__device__ __forceinline__ void warp_window_perm(const pd_shard_plan &plan, uint64_t w, pd_perm *tau)
{
    const unsigned lane = threadIdx.x & 31;
    const uint32_t key[2] = {(uint32_t)plan.seed, (uint32_t)(plan.seed >> 32)};
    const uint32_t ctr[4] = {lane, PD_STREAM_WINDOW_BASE + (uint32_t)w, (uint32_t)plan.epoch,
                             (uint32_t)(plan.epoch >> 32)};
    uint32_t r[4] = {0, 0, 0, 0};
    if (lane < 7)
        pd_philox4x32_10(ctr, key, r); /* the same blocks pd_keys_derive computes, one per lane */
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

/* ---- Window runs: a warp per tile of a rank's positions, a window at a time.
 *
 * The arithmetic is cpu/shards.c's (read its opening comment): a rank's positions f + kW fall
 * into m = G / gcd(G, W) subsequences k = c + i·m, each in one lane, whose window-stream index
 * moves by d = W / gcd(G, W) per step of i (backward on odd lanes), so each crosses a window in
 * one run. A warp takes a tile of kTile consecutive i of one subsequence and walks it window by
 * window: it finds the window once (then its neighbour), derives τ_w once (lanes 0-6, shuffled),
 * copies the window's slots into its part of shared memory (up to kSlots), and runs the
 * refill walk of walk.cuh over the run, each finished lane looking its sample up in the shared
 * table. The core's per-thread kernel above stays for requests whose subsequences are too
 * short to fill a warp (count < 32·m). */

constexpr uint64_t kTile = 32 * 32; /* positions per warp tile: enough warps to fill an H100 at 2^23 */
/* Blocks per SM the run kernel is compiled for (its registers: 80 at 3); τ lives in registers. */
#ifndef PD_GPU_SHARD_MIN_BLOCKS
#define PD_GPU_SHARD_MIN_BLOCKS 3
#endif
constexpr unsigned kSlots = 128;    /* slots of a window held in shared memory, per warp */
constexpr unsigned kWarps = kBlock / 32;

/* A request, validated and split on the host. */
struct RunRequest {
    pd_shard_plan plan;
    uint64_t first;   /* the rank's first position f */
    uint64_t world;   /* W */
    uint64_t count;   /* body ids (positions below N) */
    uint64_t m, d;    /* subsequence period and index step */
    uint64_t subs;    /* min(m, count) */
    uint64_t tiles_per_sub;
    int has_tail;     /* pad: out[count] is the wrapped position tail */
    uint64_t tail;
};

/* A window's slots in shared memory: rel[i] = P[slot0 + i] − P[slot0] (then ~0), its shard and
 * that shard's first id. */
struct SlotTable {
    uint64_t rel[kSlots];
    uint64_t start[kSlots];
    uint32_t shard[kSlots];
};

struct Window {
    uint64_t w, lo, hi, slot0, slots;
    uint32_t size; /* table size (a power of 2), 0: search the plan in global memory */
};

__device__ __forceinline__ bool window_holds(const pd_shard_plan &plan, uint64_t w, uint64_t x)
{
    return w < plan.windows && plan.slot_start[w * plan.window] <= x && x < plan.slot_start[pd__window_end(&plan, w)];
}

/* Where one sample of the window goes: shard and offset. */
__device__ __forceinline__ void window_loc(const pd_shard_plan &plan, const Window &win, const SlotTable *tab,
                                           uint64_t u, pd_shard_loc *loc)
{
    if (win.size) {
        uint32_t i = 0;
        for (uint32_t step = win.size / 2; step; step /= 2)
            i = tab->rel[i + step] <= u ? i + step : i;
        loc->shard = tab->shard[i];
        loc->offset = u - tab->rel[i];
        loc->sample = tab->start[i] + loc->offset;
        return;
    }
    const uint64_t *P = plan.slot_start;
    const uint64_t t = pd__last_at_most(P, 1, win.slot0, win.slot0 + win.slots, win.lo + u);
    loc->shard = plan.slot_shard[t];
    loc->offset = win.lo + u - P[t];
    loc->sample = plan.start[loc->shard] + loc->offset;
}

/* The refill walk of walk.cuh over a run: window-relative positions v0 + j·d (j < len), ids to
 * output indices kb + j·ks. Every lane of the warp calls it with the same arguments. */
template <unsigned W, uint32_t D>
__device__ void walk_run(const pd_shard_plan &plan, const Window &win, const SlotTable *tab, const pd_perm &tau,
                         uint64_t v0, uint64_t d, uint64_t len, uint64_t kb, int64_t ks, void *out)
{
    const unsigned lane = threadIdx.x & 31u, below = (1u << lane) - 1u;
    uint64_t j = lane, next = 32;
    bool busy = j < len;
    uint64_t v = v0 + (busy ? j : 0) * d;
    while (__any_sync(kFull, busy)) {
        if (busy)
            v = tau.n == 1 ? 0 : pd__f_d(&tau, v, PD_ROUNDS, 1, D);
        const bool done = busy && v < tau.n;
        if (done) {
            pd_shard_loc loc;
            window_loc(plan, win, tab, v, &loc);
            store_loc<W>(out, kb + (uint64_t)((int64_t)j * ks), loc);
        }
        const unsigned finished = __ballot_sync(kFull, done);
        if (done) {
            j = next + __popc(finished & below);
            busy = j < len;
            if (busy)
                v = v0 + j * d;
        }
        next += __popc(finished);
    }
}

/* Enter the window of x: the current one, a neighbour, or a search; fill the warp's slot table. */
__device__ void enter_window(const pd_shard_plan &plan, Window *win, bool *entered, uint64_t x, SlotTable *tab,
                             pd_perm *tau)
{
    if (*entered && x >= win->lo && x < win->hi)
        return;
    uint64_t w;
    if (*entered && window_holds(plan, win->w + 1, x))
        w = win->w + 1;
    else if (*entered && win->w > 0 && window_holds(plan, win->w - 1, x))
        w = win->w - 1;
    else
        w = pd__window_of(&plan, x);
    *entered = true;
    win->w = w;
    win->slot0 = w * plan.window;
    win->slots = pd__window_end(&plan, w) - win->slot0;
    win->lo = plan.slot_start[win->slot0];
    win->hi = plan.slot_start[win->slot0 + win->slots];
    warp_window_perm(plan, w, tau);
    uint32_t size = 1;
    while (size < win->slots)
        size *= 2;
    win->size = win->slots <= kSlots ? size : 0;
    __syncwarp(); /* the last run's lookups are done */
    if (win->size)
        for (uint32_t i = threadIdx.x & 31u; i < size; i += 32) {
            const bool slot = i < win->slots;
            const uint64_t t = win->slot0 + i;
            const uint32_t s = slot ? (uint32_t)plan.slot_shard[t] : 0;
            tab->rel[i] = slot ? plan.slot_start[t] - win->lo : ~UINT64_C(0);
            tab->shard[i] = s;
            tab->start[i] = slot ? plan.start[s] : 0;
        }
    __syncwarp();
}

template <unsigned W>
__global__ void __launch_bounds__(kBlock, PD_GPU_SHARD_MIN_BLOCKS) shard_runs(const __grid_constant__ RunRequest r, void *out)
{
    __shared__ SlotTable tables[kWarps];
    SlotTable *tab = &tables[threadIdx.x >> 5];
    const pd_shard_plan &plan = r.plan;
    const uint64_t warp = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    if (r.has_tail && blockIdx.x == 0 && threadIdx.x == 0) { /* pad's wrapped last position */
        pd_shard_loc loc;
        pd__shard_at(&plan, r.tail % plan.n, &loc);
        store_loc<W>(out, r.count, loc);
    }
    Window win;
    bool entered = false;
    pd_perm tau;
    for (uint64_t tile = warp; tile < r.subs * r.tiles_per_sub; tile += warps) {
        const uint64_t c = tile / r.tiles_per_sub, i0 = tile % r.tiles_per_sub * kTile;
        const uint64_t n = (r.count - c - 1) / r.m + 1; /* this subsequence's positions */
        if (i0 >= n)
            continue;
        const uint64_t i1 = n - i0 < kTile ? n : i0 + kTile;
        const uint64_t p = r.first + c * r.world, G = plan.lanes;
        const uint64_t lane = p % G, step = p / G, lb = pd__lane_begin(&plan, lane);
        const bool back = lane % 2;
        const uint64_t x0 = back ? lb + pd__lane_length(&plan, lane) - 1 - step : lb + step;
        for (uint64_t i = i0; i < i1;) {
            const uint64_t x = back ? x0 - i * r.d : x0 + i * r.d;
            enter_window(plan, &win, &entered, x, tab, &tau);
            const uint64_t room = back ? (x - win.lo) / r.d + 1 : (win.hi - 1 - x) / r.d + 1;
            const uint64_t len = room < i1 - i ? room : i1 - i;
            const uint64_t k = c + i * r.m;
            const uint64_t v0 = back ? x - win.lo - (len - 1) * r.d : x - win.lo;
            const uint64_t kb = back ? k + (len - 1) * r.m : k;
            const int64_t ks = back ? -(int64_t)r.m : (int64_t)r.m;
            if (tau.rbits != tau.lbits)
                walk_run<W, 1>(plan, win, tab, tau, v0, r.d, len, kb, ks, out);
            else
                walk_run<W, 0>(plan, win, tab, tau, v0, r.d, len, kb, ks, out);
            i += len;
        }
    }
}

template <unsigned W>
cudaError_t launch_fill(pd_gpu *g, const pd_shard_plan &plan, uint64_t first, uint64_t world, uint64_t count,
                        void *dev_out)
{
    const uint64_t G = plan.lanes;
    uint64_t a = G, b = world;
    while (b) {
        const uint64_t t = a % b;
        a = b;
        b = t;
    }
    const uint64_t m = G / a;
    const uint64_t cap = (uint64_t)g->sms * 32;
    if (count < 32 * m) { /* subsequences too short for a warp each: a thread per position */
        const uint64_t want = (count + kBlock - 1) / kBlock;
        shard_fill<W><<<(unsigned)(want < cap ? want : cap), kBlock, 0, g->stream>>>(plan, first, world, count, dev_out);
        return cudaGetLastError();
    }
    RunRequest r = {};
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
    const uint64_t longest = r.subs ? (r.count - 1) / m + 1 : 0;
    r.tiles_per_sub = (longest + kTile - 1) / kTile;
    const uint64_t tiles = r.subs * r.tiles_per_sub;
    const uint64_t want = tiles ? (tiles + kWarps - 1) / kWarps : 1;
    shard_runs<W><<<(unsigned)(want < cap ? want : cap), kBlock, 0, g->stream>>>(r, dev_out);
    return cudaGetLastError();
}

int queue_fill(pd_gpu *g, const pd_gpu_plan *dp, uint64_t first, uint64_t stride, uint64_t count, void *dev_out,
               unsigned width)
{
    if (count == 0)
        return PD_OK;
    if (width == 4)
        return pd_gpu_err(launch_fill<4>(g, dp->plan, first, stride, count, dev_out));
    if (width == 8)
        return pd_gpu_err(launch_fill<8>(g, dp->plan, first, stride, count, dev_out));
    return pd_gpu_err(launch_fill<16>(g, dp->plan, first, stride, count, dev_out));
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
