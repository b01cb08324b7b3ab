/* NCCL delivery, daemon side: a non-blocking communicator as rank 0, slices generated on the GPU and ncclSent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "nccl_wait.h"
#include "permd_delivery.h"
#include "permd_gpu.h"

struct pd_delivery {
    int device;
    ncclComm_t comm;      /* NULL once aborted */
    cudaStream_t stream;
    pd_gpu *gpu;          /* the CUDA backend, for generation */
    void *buf;            /* staging: ids are generated here, then sent */
    size_t cap;
    int broken;
};

static int pd_cancelled(const int *cancel)
{
    return cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE);
}

extern "C" int pd_delivery_probe(int device, char *why, size_t whylen)
{
    int count = 0, version = 0;
    pd_gpu_device_count(&count);
    if (count == 0) {
        snprintf(why, whylen, "no CUDA device");
        return PD_EUNAVAILABLE;
    }
    if (device < 0 || device >= count) {
        snprintf(why, whylen, "CUDA device %d does not exist (%d present)", device, count);
        return PD_EUNAVAILABLE;
    }
    if (ncclGetVersion(&version) != ncclSuccess) {
        snprintf(why, whylen, "NCCL does not load");
        return PD_EUNAVAILABLE;
    }
    return PD_OK;
}

extern "C" int pd_delivery_unique_id(uint8_t id[PD_NCCL_ID_BYTES])
{
    ncclUniqueId u;
    static_assert(sizeof u == PD_NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");
    if (ncclGetUniqueId(&u) != ncclSuccess)
        return PD_EUNAVAILABLE;
    memcpy(id, &u, sizeof u);
    return PD_OK;
}

static void pd_delivery_abort(pd_delivery *d)
{
    if (d->comm)
        ncclCommAbort(d->comm);
    d->comm = NULL;
    d->broken = 1;
}

extern "C" int pd_delivery_open(int device, const uint8_t id[PD_NCCL_ID_BYTES], int nranks, uint32_t timeout_ms,
                                const int *cancel, pd_delivery **out)
{
    int rc = PD_OK;
    ncclUniqueId u;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    if (!id || !out || nranks < 2)
        return PD_EINVAL;
    pd_delivery *d = (pd_delivery *)calloc(1, sizeof *d);
    if (!d)
        return PD_ENOMEM;
    d->device = device;
    *out = NULL;
    CUDACHECKGOTO(cudaSetDevice(device), rc, fail);
    CUDACHECKGOTO(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), rc, fail);
    if ((rc = pd_gpu_open(device, &d->gpu)) || (rc = pd_gpu_set_stream(d->gpu, d->stream)))
        goto fail;
    memcpy(&u, id, sizeof u);
    cfg.blocking = 0; /* so that a rank that never comes cannot hang us: see pd_nccl_wait */
    if (ncclCommInitRankConfig(&d->comm, nranks, u, 0, &cfg) != ncclInProgress && !d->comm) {
        rc = PD_EIO;
        goto fail;
    }
    if ((rc = pd_nccl_wait(d->comm, NULL, timeout_ms, cancel)))
        goto fail;
    *out = d;
    return PD_OK;
fail:
    d->broken = 1; /* abort, do not finalize, a communicator that never formed */
    pd_delivery_close(d, 0, NULL);
    return rc;
}

extern "C" int pd_delivery_send_jobs(pd_delivery *d, const pd_delivery_job *jobs, unsigned n, uint32_t timeout_ms,
                                     const int *cancel)
{
    size_t at[PD_DELIVERY_JOBS], total = 0;
    int rc;
    ncclResult_t r, end; /* declared before the first goto: C++ does not jump past an initialization */
    if (!d || !jobs || n == 0 || n > PD_DELIVERY_JOBS)
        return PD_EINVAL;
    for (unsigned i = 0; i < n; i++) {
        if (jobs[i].width != 4 && jobs[i].width != 8)
            return PD_EINVAL;
        at[i] = total;
        total += ((size_t)jobs[i].count * jobs[i].width + 255) & ~(size_t)255; /* each job on its own lines */
    }
    if (d->broken || !d->comm)
        return PD_ECLOSED;
    if (pd_cancelled(cancel)) {
        pd_delivery_abort(d);
        return PD_ECLOSED;
    }
    /* The trainers were told `count` ids are coming and post their receives: from here on a failure aborts the
     * communicator, so that theirs fail now rather than wait out their own timeouts. */
    if (cudaSetDevice(d->device) != cudaSuccess) {
        rc = PD_EINTERNAL;
        goto fail;
    }
    if ((rc = pd_gpu__reserve(&d->buf, &d->cap, total)))
        goto fail;
    for (unsigned i = 0; i < n; i++) { /* queued on d->stream, ahead of the sends */
        uint64_t written = 0;
        if ((rc = pd_gpu_slice_fill(d->gpu, &jobs[i].perm, &jobs[i].slice, jobs[i].count, (char *)d->buf + at[i],
                                    jobs[i].width, &written)))
            goto fail;
        if (written != jobs[i].count) { /* the daemon told the trainer `count`: it must be exact */
            rc = PD_EINTERNAL;
            goto fail;
        }
    }
    r = ncclGroupStart();
    for (unsigned i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++)
        r = ncclSend((char *)d->buf + at[i], (size_t)jobs[i].count * jobs[i].width, ncclUint8, jobs[i].peer, d->comm,
                     d->stream);
    end = ncclGroupEnd();
    if ((r != ncclSuccess && r != ncclInProgress) || (end != ncclSuccess && end != ncclInProgress)) {
        pd_delivery_abort(d);
        return PD_EIO;
    }
    if ((rc = pd_nccl_wait(d->comm, d->stream, timeout_ms, cancel)))
        pd_delivery_abort(d);
    return rc;
fail:
    pd_delivery_abort(d);
    return rc;
}

extern "C" void pd_delivery_close(pd_delivery *d, uint32_t timeout_ms, const int *cancel)
{
    if (!d)
        return;
    cudaSetDevice(d->device);
    if (d->comm && !d->broken && !pd_cancelled(cancel)) {
        ncclResult_t r = ncclCommFinalize(d->comm);
        if ((r == ncclSuccess || r == ncclInProgress) && pd_nccl_wait(d->comm, NULL, timeout_ms, cancel) == PD_OK) {
            ncclCommDestroy(d->comm);
            d->comm = NULL;
        }
    }
    pd_delivery_abort(d); /* no-op when destroyed above */
    if (d->stream)
        cudaStreamSynchronize(d->stream);
    cudaFree(d->buf);
    pd_gpu_close(d->gpu);
    if (d->stream)
        cudaStreamDestroy(d->stream);
    free(d);
}
