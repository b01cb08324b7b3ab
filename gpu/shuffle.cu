/* Payload shuffles on the GPU: gather in σ order, and the paper's fused bijective shuffle for comparison. */
#include <cub/block/block_scan.cuh>
#include <cub/agent/single_pass_scan_operators.cuh>

#include "check.h"
#include "internal.h"
#include "walk.cuh"

using namespace pd_gpu_detail;

namespace {

template <class E>
struct Gather {
    static constexpr bool kGathers = true;
    const E *in;
    E *out;
    __device__ __forceinline__ void operator()(uint64_t j, uint64_t v) const { out[j] = __ldg(in + v); }
};

template <class E>
int gather_as(pd_gpu *g, const pd_perm *p, const void *in, void *out)
{
    Gather<E> sink{(const E *)in, (E *)out};
    return pd_gpu_err(launch_walk(*p, Positions{0, 1}, p->n, sink, g->walk, g->sms,
                                  g->stream));
}

/* ---- Algorithm 1 (Mitchell et al.): f over all of [0, 2^b), keep f(i) < n,
 * scatter to the prefix count. One pass: tiles publish their counts and look
 * back at their predecessors' (CUB's decoupled look-back), so the scan and
 * the scatter are fused in one kernel. */

constexpr int kItems = 8;
constexpr int kTile = kBlock * kItems;
using TileState = cub::ScanTileState<uint32_t>;
using BlockScan = cub::BlockScan<uint32_t, kBlock>;
using Prefix = cub::TilePrefixCallbackOp<uint32_t, ::cuda::std::plus<>, TileState>;

__global__ void init_tiles(TileState state, int tiles)
{
    state.InitializeStatus(tiles);
}

template <uint32_t D, class E>
__global__ void __launch_bounds__(kBlock) fused_shuffle(const __grid_constant__ pd_perm p, const E *in, E *out,
                                                         TileState state)
{
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ typename Prefix::TempStorage prefix_storage;
    const int tile = blockIdx.x; /* CUB's look-back needs tiles scheduled in order: one block per tile */
    const uint64_t domain = UINT64_C(1) << p.bits;
    uint64_t v[kItems];
    uint32_t keep[kItems], slot[kItems];
    for (int k = 0; k < kItems; k++) {
        uint64_t i = (uint64_t)tile * kTile + threadIdx.x * kItems + k;
        v[k] = i < domain ? f<D>(p, i) : p.n;
        keep[k] = v[k] < p.n;
    }
    if (tile == 0) {
        uint32_t total;
        BlockScan(scan_storage).ExclusiveSum(keep, slot, total);
        if (threadIdx.x == 0)
            state.SetInclusive(0, total);
    } else {
        Prefix prefix(state, prefix_storage, ::cuda::std::plus<>(), tile);
        BlockScan(scan_storage).ExclusiveSum(keep, slot, prefix);
    }
    for (int k = 0; k < kItems; k++)
        if (keep[k])
            out[slot[k]] = __ldg(in + v[k]);
}

template <class E>
int fused_as(pd_gpu *g, const pd_perm *p, const void *in, void *out)
{
    const uint64_t domain = UINT64_C(1) << p->bits;
    const int tiles = (int)((domain + kTile - 1) / kTile);
    size_t bytes = 0;
    int rc;
    CUDACHECK(TileState::AllocationSize(tiles, bytes));
    if ((rc = pd_gpu__reserve(&g->scratch, &g->scratch_bytes, bytes)))
        return rc;
    TileState state;
    CUDACHECK(state.Init(tiles, g->scratch, bytes));
    init_tiles<<<(tiles + 32 + kBlock - 1) / kBlock, kBlock, 0, g->stream>>>(state, tiles);
    if (p->rbits - p->lbits)
        fused_shuffle<1, E><<<tiles, kBlock, 0, g->stream>>>(*p, (const E *)in, (E *)out, state);
    else
        fused_shuffle<0, E><<<tiles, kBlock, 0, g->stream>>>(*p, (const E *)in, (E *)out, state);
    return pd_gpu_err(cudaGetLastError());
}

/* Dispatch on the element size: one instantiation per supported width. */

int dispatch(size_t elem_size, int (*f1)(pd_gpu *, const pd_perm *, const void *, void *),
             int (*f2)(pd_gpu *, const pd_perm *, const void *, void *),
             int (*f4)(pd_gpu *, const pd_perm *, const void *, void *),
             int (*f8)(pd_gpu *, const pd_perm *, const void *, void *),
             int (*f16)(pd_gpu *, const pd_perm *, const void *, void *), pd_gpu *g, const pd_perm *p,
             const void *in, void *out)
{
    switch (elem_size) {
    case 1: return f1(g, p, in, out);
    case 2: return f2(g, p, in, out);
    case 4: return f4(g, p, in, out);
    case 8: return f8(g, p, in, out);
    case 16: return f16(g, p, in, out);
    }
    return PD_EINVAL;
}

} // namespace

/* Elements are loaded and stored whole (a 16-byte one as a uint4): a pointer off their alignment would fault. The
 * two buffers of n elements must not overlap: out would be read after it was written. */
static int pd_gather_args(uint64_t n, const void *dev_in, void *dev_out, size_t elem_size)
{
    if (!dev_in || !dev_out || elem_size == 0 || (elem_size & (elem_size - 1)))
        return PD_EINVAL;
    const uintptr_t in = (uintptr_t)dev_in, out = (uintptr_t)dev_out;
    if ((in | out) % elem_size || n > UINTPTR_MAX / elem_size)
        return PD_EINVAL;
    const uintptr_t bytes = (uintptr_t)n * elem_size;
    if (in < out ? out - in < bytes : in - out < bytes)
        return PD_EINVAL;
    return PD_OK;
}

extern "C" int pd_gpu_gather(pd_gpu *g, const pd_perm *p, const void *dev_in, void *dev_out, size_t elem_size)
{
    if (!g || !p || pd_gather_args(p->n, dev_in, dev_out, elem_size))
        return PD_EINVAL;
    CUDACHECK(cudaSetDevice(g->device));
    return dispatch(elem_size, gather_as<uint8_t>, gather_as<uint16_t>, gather_as<uint32_t>, gather_as<uint64_t>,
                    gather_as<uint4>, g, p, dev_in, dev_out);
}

extern "C" int pd_gpu_shuffle_fused(pd_gpu *g, const pd_perm *p, const void *dev_in, void *dev_out,
                                    size_t elem_size)
{
    if (!g || !p || pd_gather_args(p->n, dev_in, dev_out, elem_size))
        return PD_EINVAL;
    if (p->n > (UINT64_C(1) << 31)) /* 32-bit tile counts and one block per tile */
        return PD_EUNSUPPORTED;
    CUDACHECK(cudaSetDevice(g->device));
    return dispatch(elem_size, fused_as<uint8_t>, fused_as<uint16_t>, fused_as<uint32_t>, fused_as<uint64_t>,
                    fused_as<uint4>, g, p, dev_in, dev_out);
}
