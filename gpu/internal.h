/* The CUDA backend's private context, shared by gen.cu and shuffle.cu. */
#ifndef PD_GPU_INTERNAL_H
#define PD_GPU_INTERNAL_H

#include <cuda_runtime.h>

#include "check.h"
#include "permd_gpu.h"

struct pd_gpu {
    int device;
    int sms;
    pd_gpu_walk walk;
    cudaStream_t own;    /* created by pd_gpu_open */
    cudaStream_t stream; /* where work is queued: own, or the caller's */
    void *staging;       /* device buffer behind pd_gpu_slice_fill_host */
    size_t staging_bytes;
    void *scratch;       /* the fused shuffle's scan state */
    void *tiles;         /* shards.cu's tile counter (8 bytes), allocated on first use */
    size_t scratch_bytes;
    char desc[320];
};

int pd_gpu__reserve(void **buf, size_t *have, size_t bytes);

/* Host output through the reusable staging buffer, in chunks of bounded
 * device memory: queue(done, c) queues the ids done..done+c into g->staging
 * and returns a PD_E code; each chunk is copied back behind it. Synchronous. */
template <class Queue>
int pd_gpu__fill_host(pd_gpu *g, uint64_t count, unsigned width, void *host_out, Queue queue)
{
    const uint64_t chunk = UINT64_C(1) << 24;
    uint64_t per = count < chunk ? count : chunk;
    int rc = pd_gpu__reserve(&g->staging, &g->staging_bytes, (size_t)(per ? per : 1) * width);
    if (rc)
        return rc;
    for (uint64_t done = 0; done < count; done += per) {
        uint64_t c = count - done < per ? count - done : per;
        if ((rc = queue(done, c)))
            return rc;
        cudaError_t e = cudaMemcpyAsync((char *)host_out + done * width, g->staging, (size_t)c * width,
                                        cudaMemcpyDeviceToHost, g->stream);
        if (e != cudaSuccess)
            return pd_gpu_err(e);
    }
    return pd_gpu_err(cudaStreamSynchronize(g->stream));
}

#endif
