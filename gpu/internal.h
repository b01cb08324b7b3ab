/* The CUDA backend's private context, shared by gen.cu and shuffle.cu. */
#ifndef PD_GPU_INTERNAL_H
#define PD_GPU_INTERNAL_H

#include <cuda_runtime.h>

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
    size_t scratch_bytes;
    char desc[320];
};

int pd_gpu__reserve(void **buf, size_t *have, size_t bytes);

#endif
