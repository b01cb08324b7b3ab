/* Device-side cycle walking shared by the index and payload kernels: one round function (the core's). */
#ifndef PD_GPU_WALK_CUH
#define PD_GPU_WALK_CUH

#include <stdint.h>

#include "core/perm.h"
#include "permd_gpu.h"

namespace pd_gpu_detail {

constexpr int kBlock = 256;
constexpr unsigned kFull = 0xffffffffu;
constexpr uint64_t kRefillChunk = 32 * 64; /* indices per warp before it takes a new chunk */
/* Tuned on an H100 (bench/gpu_gen --payload-only across 128…1024 and 16/32): smaller
 * batches and more resident blocks overlap the walk with the gather best at 2^23 + 1. */
#ifndef PD_GPU_STAGE_CHUNK
#define PD_GPU_STAGE_CHUNK 256
#endif
#ifndef PD_GPU_BLOCKS_PER_SM
#define PD_GPU_BLOCKS_PER_SM 32
#endif
constexpr uint32_t kStageChunk = PD_GPU_STAGE_CHUNK; /* staged walk: indices per warp per shared-memory batch */

/* Work item j sits at global position first + j·stride; pad mode's positions ≥ n wrap. */
struct Positions {
    uint64_t first, stride;
};

__device__ __forceinline__ uint64_t start_value(const pd_perm &p, Positions at, uint64_t j)
{
    uint64_t pos = at.first + j * at.stride;
    return pos < p.n ? pos : pos % p.n;
}

/* f with the half-width difference D fixed at compile time (the core's pd__f_d). */
template <uint32_t D>
__device__ __forceinline__ uint64_t f(const pd_perm &p, uint64_t v)
{
    return pd__f_d(&p, v, PD_ROUNDS, 1, D);
}

/* One index per thread: simple, but a warp runs as long as its longest walk. */
template <uint32_t D, class Sink>
__global__ void __launch_bounds__(kBlock) walk_naive(const __grid_constant__ pd_perm p, Positions at,
                                                      uint64_t count, Sink sink)
{
    const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; j < count; j += step) {
        uint64_t v = f<D>(p, start_value(p, at, j));
        while (v >= p.n)
            v = f<D>(p, v);
        sink(j, v);
    }
}

/* Refill: every iteration each busy lane applies f once; lanes whose value
 * landed inside [0, n) emit it and take the warp's next pending indices
 * (ballot + popc hands them out in order), so no lane idles while another
 * walks, until the warp's chunk runs dry. */
template <uint32_t D, class Sink>
__global__ void __launch_bounds__(kBlock) walk_refill(const __grid_constant__ pd_perm p, Positions at,
                                                       uint64_t count, Sink sink)
{
    const unsigned lane = threadIdx.x & 31u;
    const unsigned below = (1u << lane) - 1u;
    const uint64_t warp = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    for (uint64_t base = warp * kRefillChunk; base < count; base += warps * kRefillChunk) {
        const uint64_t end = min(count, base + kRefillChunk);
        uint64_t next = base + 32;
        uint64_t j = base + lane;
        bool busy = j < end;
        uint64_t v = busy ? start_value(p, at, j) : 0;
        while (__any_sync(kFull, busy)) {
            if (busy)
                v = f<D>(p, v);
            const bool done = busy && v < p.n;
            if (done)
                sink(j, v);
            const unsigned finished = __ballot_sync(kFull, done);
            if (done) {
                j = next + __popc(finished & below);
                busy = j < end;
                if (busy)
                    v = start_value(p, at, j);
            }
            next += __popc(finished);
        }
    }
}

/* Staged refill: the warp walks a batch as walk_refill does but parks the
 * results in shared memory, then hands them to the sink in index order.
 * The sink's memory traffic (stores, and a gather's random loads) is then
 * coalesced and independent, so many requests are in flight at once instead
 * of one dependent load stalling the walk at every step. */
template <uint32_t D, class V, class Sink>
__global__ void __launch_bounds__(kBlock) walk_staged(const __grid_constant__ pd_perm p, Positions at,
                                                       uint64_t count, Sink sink)
{
    __shared__ V stage[kBlock / 32][kStageChunk];
    V *buf = stage[threadIdx.x >> 5];
    const unsigned lane = threadIdx.x & 31u;
    const unsigned below = (1u << lane) - 1u;
    const uint64_t warp = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    for (uint64_t base = warp * kStageChunk; base < count; base += warps * kStageChunk) {
        const uint32_t size = (uint32_t)min((uint64_t)kStageChunk, count - base);
        uint32_t next = 32, k = lane;
        bool busy = k < size;
        uint64_t v = busy ? start_value(p, at, base + k) : 0;
        while (__any_sync(kFull, busy)) {
            if (busy)
                v = f<D>(p, v);
            const bool done = busy && v < p.n;
            if (done)
                buf[k] = (V)v;
            const unsigned finished = __ballot_sync(kFull, done);
            if (done) {
                k = next + __popc(finished & below);
                busy = k < size;
                if (busy)
                    v = start_value(p, at, base + k);
            }
            next += __popc(finished);
        }
        __syncwarp();
        for (uint32_t i = lane; i < size; i += 32)
            sink(base + i, (uint64_t)buf[i]);
        __syncwarp();
    }
}

/* Launch the chosen walk with D taken from the shape. n = 2^b never walks,
 * so it always takes the plain kernel. Sinks say whether they gather
 * (kGathers): AUTO stages those, whose random loads gain most from it. */
template <class Sink>
cudaError_t launch_walk(const pd_perm &p, Positions at, uint64_t count, Sink sink, pd_gpu_walk walk, int sms,
                        cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    if (walk == PD_GPU_WALK_AUTO)
        walk = Sink::kGathers ? PD_GPU_WALK_STAGED : PD_GPU_WALK_REFILL;
    if (p.n == (UINT64_C(1) << p.bits))
        walk = PD_GPU_WALK_NAIVE;
    const uint64_t per_block = walk == PD_GPU_WALK_NAIVE    ? kBlock
                               : walk == PD_GPU_WALK_REFILL ? kRefillChunk * (kBlock / 32)
                                                            : kStageChunk * (kBlock / 32);
    const uint64_t want = (count + per_block - 1) / per_block;
    const uint64_t cap = (uint64_t)sms * PD_GPU_BLOCKS_PER_SM; /* enough blocks to fill the GPU; the rest loop */
    const unsigned grid = (unsigned)(want < cap ? want : cap);
    const bool odd = p.rbits != p.lbits;
    const bool narrow = p.n <= (UINT64_C(1) << 32); /* staged values fit u32 */
    switch (walk) {
    case PD_GPU_WALK_NAIVE:
        if (odd)
            walk_naive<1><<<grid, kBlock, 0, stream>>>(p, at, count, sink);
        else
            walk_naive<0><<<grid, kBlock, 0, stream>>>(p, at, count, sink);
        break;
    case PD_GPU_WALK_REFILL:
        if (odd)
            walk_refill<1><<<grid, kBlock, 0, stream>>>(p, at, count, sink);
        else
            walk_refill<0><<<grid, kBlock, 0, stream>>>(p, at, count, sink);
        break;
    default:
        if (odd && narrow)
            walk_staged<1, uint32_t><<<grid, kBlock, 0, stream>>>(p, at, count, sink);
        else if (odd)
            walk_staged<1, uint64_t><<<grid, kBlock, 0, stream>>>(p, at, count, sink);
        else if (narrow)
            walk_staged<0, uint32_t><<<grid, kBlock, 0, stream>>>(p, at, count, sink);
        else
            walk_staged<0, uint64_t><<<grid, kBlock, 0, stream>>>(p, at, count, sink);
        break;
    }
    return cudaGetLastError();
}

} // namespace pd_gpu_detail

#endif
