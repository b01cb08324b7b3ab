/* Sharded epochs on the device: the core's position → (shard, offset) kernels over a device copy of the plan. */
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
        if (W == 4)
            ((uint32_t *)out)[k] = (uint32_t)loc.sample;
        else if (W == 8)
            ((uint64_t *)out)[k] = loc.sample;
        else
            ((ulonglong2 *)out)[k] = make_ulonglong2(loc.shard, loc.offset);
    }
}

int queue_fill(pd_gpu *g, const pd_gpu_plan *dp, uint64_t first, uint64_t stride, uint64_t count, void *dev_out,
               unsigned width)
{
    if (count == 0)
        return PD_OK;
    uint64_t want = (count + kBlock - 1) / kBlock, cap = (uint64_t)g->sms * 32;
    unsigned blocks = (unsigned)(want < cap ? want : cap);
    if (width == 4)
        shard_fill<4><<<blocks, kBlock, 0, g->stream>>>(dp->plan, first, stride, count, dev_out);
    else if (width == 8)
        shard_fill<8><<<blocks, kBlock, 0, g->stream>>>(dp->plan, first, stride, count, dev_out);
    else
        shard_fill<16><<<blocks, kBlock, 0, g->stream>>>(dp->plan, first, stride, count, dev_out);
    return pd_gpu_err(cudaGetLastError());
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
