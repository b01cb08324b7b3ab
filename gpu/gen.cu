/* The CUDA backend's context and index generation: σ over a range and a rank's slice, u32 or u64. */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "internal.h"
#include "walk.cuh"

using namespace pd_gpu_detail;

namespace {

template <class T>
struct StoreIds {
    static constexpr bool kGathers = false;
    T *out;
    __device__ __forceinline__ void operator()(uint64_t j, uint64_t v) const { out[j] = (T)v; }
};

/* Queue out[j] = sample at position first + j·stride for j < count. */
int queue_ids(pd_gpu *g, const pd_perm *p, Positions at, uint64_t count, void *dev_out, unsigned width)
{
        cudaError_t e = width == 4
                        ? launch_walk(*p, at, count, StoreIds<uint32_t>{(uint32_t *)dev_out}, g->walk, g->sms, g->stream)
                        : launch_walk(*p, at, count, StoreIds<uint64_t>{(uint64_t *)dev_out}, g->walk, g->sms, g->stream);
    return pd_gpu_err(e);
}

int check_width(const pd_perm *p, unsigned width)
{
    if (width != 4 && width != 8)
        return PD_EINVAL;
    if (width == 4 && pd_id_width(p->n) != 4)
        return PD_EOVERFLOW;
    return PD_OK;
}

} // namespace

extern "C" int pd_gpu_devices(int *count, char *why, size_t len)
{
    if (!count)
        return PD_EINVAL;
    int n = 0;
    /* No driver or no device is an answer (zero), not an error. */
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        n = 0;
        if (why && len)
            snprintf(why, len, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    } else if (n == 0 && why && len) {
        snprintf(why, len, "the driver reports no device");
    }
    *count = n;
    return PD_OK;
}

extern "C" int pd_gpu_device_count(int *count)
{
    return pd_gpu_devices(count, NULL, 0);
}

extern "C" int pd_gpu_open(int device, pd_gpu **out)
{
    int count = 0, rc = PD_OK;
    cudaDeviceProp prop;
    if (!out)
        return PD_EINVAL;
    *out = NULL;
    pd_gpu_device_count(&count);
    if (device < 0 || device >= count)
        return PD_EUNSUPPORTED;
    pd_gpu *g = (pd_gpu *)calloc(1, sizeof *g);
    if (!g)
        return PD_ENOMEM;
    g->device = device;
    CUDACHECKGOTO(cudaSetDevice(device), rc, fail);
    CUDACHECKGOTO(cudaGetDeviceProperties(&prop, device), rc, fail);
    CUDACHECKGOTO(cudaStreamCreateWithFlags(&g->own, cudaStreamNonBlocking), rc, fail);
    g->stream = g->own;
    g->sms = prop.multiProcessorCount;
    g->walk = PD_GPU_WALK_AUTO;
    snprintf(g->desc, sizeof g->desc, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor, g->sms);
    *out = g;
    return PD_OK;
fail:
    pd_gpu_close(g);
    return rc;
}

extern "C" void pd_gpu_close(pd_gpu *g)
{
    if (!g)
        return;
    cudaSetDevice(g->device);
    if (g->own)
        cudaStreamSynchronize(g->own);
    cudaFree(g->staging);
    cudaFree(g->scratch);
    cudaFree(g->tiles);
    if (g->own)
        cudaStreamDestroy(g->own);
    free(g);
}

extern "C" const char *pd_gpu_describe(const pd_gpu *g)
{
    return g ? g->desc : "";
}

extern "C" int pd_gpu_set_stream(pd_gpu *g, void *cuda_stream)
{
    if (!g)
        return PD_EINVAL;
    g->stream = cuda_stream ? (cudaStream_t)cuda_stream : g->own;
    return PD_OK;
}

extern "C" int pd_gpu_set_walk(pd_gpu *g, pd_gpu_walk walk)
{
    if (!g || (unsigned)walk > PD_GPU_WALK_STAGED)
        return PD_EINVAL;
    g->walk = walk;
    return PD_OK;
}

extern "C" int pd_gpu_sync(pd_gpu *g)
{
    if (!g)
        return PD_EINVAL;
    CUDACHECK(cudaSetDevice(g->device));
    CUDACHECK(cudaStreamSynchronize(g->stream));
    return PD_OK;
}

extern "C" int pd_gpu_alloc(pd_gpu *g, size_t bytes, void **dev_ptr)
{
    if (!g || !dev_ptr)
        return PD_EINVAL;
    *dev_ptr = NULL;
    CUDACHECK(cudaSetDevice(g->device));
    CUDACHECK(cudaMalloc(dev_ptr, bytes ? bytes : 1));
    return PD_OK;
}

extern "C" void pd_gpu_free(pd_gpu *g, void *dev_ptr)
{
    if (g && dev_ptr && cudaSetDevice(g->device) == cudaSuccess)
        cudaFree(dev_ptr);
}

extern "C" int pd_gpu_copy_to_host(pd_gpu *g, void *host, const void *dev, size_t bytes)
{
    if (!g || ((!host || !dev) && bytes))
        return PD_EINVAL;
    CUDACHECK(cudaSetDevice(g->device));
    CUDACHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, g->stream));
    CUDACHECK(cudaStreamSynchronize(g->stream));
    return PD_OK;
}

extern "C" int pd_gpu_copy_to_device(pd_gpu *g, void *dev, const void *host, size_t bytes)
{
    if (!g || ((!host || !dev) && bytes))
        return PD_EINVAL;
    CUDACHECK(cudaSetDevice(g->device));
    CUDACHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, g->stream));
    CUDACHECK(cudaStreamSynchronize(g->stream));
    return PD_OK;
}

extern "C" int pd_gpu_perm_fill(pd_gpu *g, const pd_perm *p, uint64_t start, uint64_t count, void *dev_out,
                                unsigned width)
{
    if (!g || !p || (!dev_out && count))
        return PD_EINVAL;
    if (start > p->n || count > p->n - start)
        return PD_ERANGE;
    int rc = check_width(p, width);
    if (rc)
        return rc;
    CUDACHECK(cudaSetDevice(g->device));
    return queue_ids(g, p, Positions{start, 1}, count, dev_out, width);
}

/* Validate a slice request and clamp count to what the rank has left. */
static int slice_prepare(const pd_gpu *g, const pd_perm *p, const pd_slice *s, uint64_t *count,
                         const void *out, unsigned width, uint64_t *written)
{
    uint64_t left;
    if (!g || !p || !written || (!out && *count))
        return PD_EINVAL;
    int rc = pd_slice_remaining(p->n, s, &left);
    if (rc)
        return rc;
    if ((rc = check_width(p, width)))
        return rc;
    if (*count > left)
        *count = left;
    return PD_OK;
}

extern "C" int pd_gpu_slice_fill(pd_gpu *g, const pd_perm *p, const pd_slice *s, uint64_t count, void *dev_out,
                                 unsigned width, uint64_t *written)
{
    int rc = slice_prepare(g, p, s, &count, dev_out, width, written);
    if (rc)
        return rc;
    CUDACHECK(cudaSetDevice(g->device));
    if ((rc = queue_ids(g, p, Positions{s->offset + s->rank, s->world}, count, dev_out, width)))
        return rc;
    *written = count;
    return PD_OK;
}

/* Reusable device buffer of at least bytes (grown, never shrunk). */
int pd_gpu__reserve(void **buf, size_t *have, size_t bytes)
{
    if (*have >= bytes)
        return PD_OK;
    cudaFree(*buf);
    *buf = NULL;
    *have = 0;
    CUDACHECK(cudaMalloc(buf, bytes));
    *have = bytes;
    return PD_OK;
}

extern "C" int pd_gpu_slice_fill_host(pd_gpu *g, const pd_perm *p, const pd_slice *s, uint64_t count,
                                      void *host_out, unsigned width, uint64_t *written)
{
    int rc = slice_prepare(g, p, s, &count, host_out, width, written);
    if (rc)
        return rc;
    CUDACHECK(cudaSetDevice(g->device));
    rc = pd_gpu__fill_host(g, count, width, host_out, [&](uint64_t done, uint64_t c) {
        return queue_ids(g, p, Positions{s->offset + s->rank + done * s->world, s->world}, c, g->staging, width);
    });
    if (rc)
        return rc;
    *written = count;
    return PD_OK;
}
