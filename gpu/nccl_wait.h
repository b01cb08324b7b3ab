/* Waiting on a non-blocking NCCL communicator with a deadline, shared by the daemon's and the trainers' halves. */
#ifndef PD_NCCL_WAIT_H
#define PD_NCCL_WAIT_H

#include <stdint.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "core/error.h"

static inline uint64_t pd_nccl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Poll until the communicator is idle and (if stream) the stream has drained.
 * Blocking NCCL calls cannot be interrupted; polling lets a dead peer, a
 * deadline or a cancel flag end the wait, after which the caller aborts.
 * The first PD_NCCL_SPIN_US poll back to back: a delivery of 65536 ids is done
 * in tens of µs, and a nap costs ~50 µs more than asked (Linux's default
 * timer slack), which was most of such a request's time. Longer waits (a
 * large transfer, a peer that is late) nap 50 µs between polls. */
#define PD_NCCL_SPIN_US 200
static inline int pd_nccl_wait(ncclComm_t comm, cudaStream_t stream, uint32_t timeout_ms, const int *cancel)
{
    const uint64_t start = pd_nccl_now_ms(), deadline = start + timeout_ms;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const struct timespec nap = {0, 50000};
    for (;;) {
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess)
            return PD_EIO;
        if (st != ncclSuccess && st != ncclInProgress)
            return PD_EIO;
        if (st == ncclSuccess) {
            if (!stream)
                return PD_OK;
            cudaError_t q = cudaStreamQuery(stream);
            if (q == cudaSuccess)
                return PD_OK;
            if (q != cudaErrorNotReady)
                return PD_EIO;
        }
        if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) /* C and C++ alike */
            return PD_ECLOSED;
        if (pd_nccl_now_ms() >= deadline)
            return PD_ETIMEDOUT;
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        const int64_t waited_us = (int64_t)(t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000;
        if (waited_us >= PD_NCCL_SPIN_US)
            nanosleep(&nap, NULL);
    }
}

#endif
