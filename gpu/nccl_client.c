/* libpermd_nccl: a trainer's NCCL membership: the socket half through libpermd, the GPU half through NCCL. */
#define _POSIX_C_SOURCE 200809L
#include "gpu/permd_nccl.h"

#include <stdlib.h>
#include <string.h>

#include "gpu/nccl_wait.h"

struct permd_nccl {
    permd_client *c;
    char group[PERMD_NAME_MAX + 1];
    int device;
    uint32_t rank, nranks, timeout_ms;
    ncclComm_t comm; /* NULL once aborted */
    cudaStream_t stream;
};

static void pd_member_abort(permd_nccl *g)
{
    if (g->comm)
        ncclCommAbort(g->comm);
    g->comm = NULL;
}

/* Whose device is current on the caller's thread (torch's, say) is the caller's: each call that switches to the
 * member's device switches back. */
static int pd_device_enter(int device, int *was)
{
    if (cudaGetDevice(was) != cudaSuccess)
        *was = -1;
    return cudaSetDevice(device) == cudaSuccess ? PERMD_OK : PERMD_EUNAVAILABLE;
}

static void pd_device_leave(int was)
{
    if (was >= 0)
        cudaSetDevice(was);
}

int permd_nccl_join(permd_client *c, const char *group, uint32_t members, int device, uint32_t timeout_ms,
                    permd_nccl **out)
{
    uint8_t id[PERMD_NCCL_ID_BYTES];
    ncclUniqueId u;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    int was = -1, joined = 0;
    if (!c || !group || !out || strlen(group) > PERMD_NAME_MAX)
        return PERMD_EINVAL;
    *out = NULL;
    permd_nccl *g = calloc(1, sizeof *g);
    if (!g)
        return PERMD_ENOMEM;
    int rc = permd_group_join(c, group, members, id, &g->rank, &g->nranks);
    if (rc)
        goto fail;
    joined = 1;
    g->c = c;
    strcpy(g->group, group);
    g->device = device;
    g->timeout_ms = timeout_ms ? timeout_ms : 60000;
    if ((rc = pd_device_enter(device, &was)))
        goto fail;
    if (cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking) != cudaSuccess) {
        rc = PERMD_EUNAVAILABLE;
        goto fail;
    }
    memcpy(&u, id, sizeof u);
    cfg.blocking = 0;
    /* Never NVLink multicast (docs/nccl.md): point-to-point sends have no use for it, and it can take a shared
     * host's GPUs down. A trainer's explicit setting stands; NCCL reads it when this process first inits. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    if (ncclCommInitRankConfig(&g->comm, (int)g->nranks, u, (int)g->rank, &cfg) != ncclInProgress && !g->comm) {
        rc = PERMD_EIO;
        goto fail;
    }
    if ((rc = pd_nccl_wait(g->comm, NULL, g->timeout_ms, NULL)))
        goto fail;
    pd_device_leave(was);
    *out = g;
    return PERMD_OK;
fail:
    pd_member_abort(g);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    pd_device_leave(was);
    /* permd counted this member: tell it, so the group fails now and its name is free, not at delivery_timeout_ms.
     * The error that matters is the one above; a refused leave (the connection broke) changes nothing. */
    if (joined && rc != PERMD_ECLOSED)
        permd_group_leave(c, group);
    free(g);
    return rc;
}

int permd_nccl_rank(const permd_nccl *g, uint32_t *rank, uint32_t *nranks)
{
    if (!g || !rank || !nranks)
        return PERMD_EINVAL;
    *rank = g->rank;
    *nranks = g->nranks;
    return PERMD_OK;
}

/* NCCL writes into dev_out from its own kernels: a host pointer or another device's memory would fault there and
 * can take the caller's CUDA context down, so it is checked first. */
static int pd_check_buffer(const permd_nccl *g, const void *dev_out)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, dev_out) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it for the caller */
        return PERMD_EINVAL;
    }
    if (a.type == cudaMemoryTypeManaged)
        return PERMD_OK;
    return a.type == cudaMemoryTypeDevice && a.device == g->device ? PERMD_OK : PERMD_EINVAL;
}

int permd_nccl_recv(permd_nccl *g, const permd_slice *s, uint64_t count, uint32_t id_width, void *dev_out,
                    void *cuda_stream, uint64_t *got, uint32_t *width, uint64_t *next_offset)
{
    int was, rc;
    cudaStream_t stream = cuda_stream ? (cudaStream_t)cuda_stream : g ? g->stream : NULL;
    if (!g || !got || !width || (count && !dev_out) || (id_width != 0 && id_width != 4 && id_width != 8))
        return PERMD_EINVAL;
    if (!g->comm)
        return PERMD_ECLOSED;
    if ((rc = pd_device_enter(g->device, &was)))
        return rc;
    if (count && (rc = pd_check_buffer(g, dev_out)))
        goto out;
    if ((rc = permd_group_deliver(g->c, g->group, s, count, id_width, got, width, next_offset)) || *got == 0)
        goto out;
    ncclResult_t r = ncclRecv(dev_out, (size_t)*got * *width, ncclUint8, 0, g->comm, stream);
    if (r != ncclSuccess && r != ncclInProgress) {
        pd_member_abort(g);
        rc = PERMD_EIO;
        goto out;
    }
    if ((rc = pd_nccl_wait(g->comm, stream, g->timeout_ms, NULL)))
        pd_member_abort(g);
out:
    pd_device_leave(was);
    return rc;
}

int permd_nccl_leave(permd_nccl *g)
{
    if (!g)
        return PERMD_OK;
    int rc = permd_group_leave(g->c, g->group), was;
    pd_device_enter(g->device, &was);
    if (g->comm) {
        ncclResult_t r = ncclCommFinalize(g->comm);
        if ((r == ncclSuccess || r == ncclInProgress) && pd_nccl_wait(g->comm, NULL, g->timeout_ms, NULL) == 0) {
            ncclCommDestroy(g->comm);
            g->comm = NULL;
        }
        pd_member_abort(g);
    }
    cudaStreamDestroy(g->stream);
    pd_device_leave(was);
    free(g);
    return rc;
}
