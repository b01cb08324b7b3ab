/* CUDA error idiom of the GPU backend, after NCCL's NCCLCHECK / NCCLCHECKGOTO. */
#ifndef PD_GPU_CHECK_H
#define PD_GPU_CHECK_H

#include <cuda_runtime.h>

#include "core/error.h"

/* Map a CUDA error to a PD_E code (allocation failures stay distinguishable). */
static inline int pd_gpu_err(cudaError_t e)
{
    if (e == cudaSuccess)
        return PD_OK;
    if (e == cudaErrorMemoryAllocation)
        return PD_ENOMEM;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice)
        return PD_EUNSUPPORTED;
    return PD_EINTERNAL;
}

/* Return a PD_E code from the enclosing function when a CUDA call fails. */
#define CUDACHECK(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return pd_gpu_err(e_);                                                                 \
    } while (0)

/* Set rc and jump to label when a CUDA call fails (for cleanup paths). */
#define CUDACHECKGOTO(call, rc, label)                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (rc) = pd_gpu_err(e_);                                                                 \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#endif
