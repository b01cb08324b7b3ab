/* libpermd_nccl: a trainer's NCCL membership: the socket half through libpermd, the GPU half through NCCL. */
#define _POSIX_C_SOURCE 200809L
#include "gpu/permd_nccl.h"

#include <stdio.h>
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

unsigned permd_nccl_abi_version(void)
{
    return PERMD_ABI_VERSION;
}

static void pd_member_abort(permd_nccl *g)
{
    if (g->comm)
        ncclCommAbort(g->comm);
    g->comm = NULL;
}

/* Whose device is current on the caller's thread (torch's, say) is the caller's: each call that switches to the
 * member's device switches back. */
static int pd_device_enter(permd_client *c, int device, int *was)
{
    if (cudaGetDevice(was) != cudaSuccess)
        *was = -1;
    const cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        return PERMD_OK;
    cudaGetLastError(); /* not sticky: clear it for the caller */
    return c ? permd_set_error(c, PERMD_EUNAVAILABLE, "CUDA device %d: %s", device, cudaGetErrorString(e))
             : PERMD_EUNAVAILABLE;
}

/* What a failed wait on the communicator says: the deadline, or NCCL's own words. */
static int pd_wait_failed(permd_client *c, ncclComm_t comm, int rc, const char *what, uint32_t timeout_ms)
{
    if (rc == PERMD_ETIMEDOUT)
        return permd_set_error(c, rc, "NCCL %s: not done within %u ms", what, timeout_ms);
    ncclResult_t st = ncclSuccess;
    ncclCommGetAsyncError(comm, &st);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    const char *last = ncclGetLastError(comm);
#else
    const char *last = NULL;
#endif
    return permd_set_error(c, rc, "NCCL %s failed: %s%s%s", what, ncclGetErrorString(st), last && *last ? ": " : "",
                           last ? last : "");
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
        return permd_set_error(c, PERMD_EINVAL, "permd_nccl_join: a connection, a group name of at most %d bytes and "
                               "an output are required", PERMD_NAME_MAX);
    *out = NULL;
    if (permd_abi_version() != PERMD_ABI_VERSION)
        return permd_set_error(c, PERMD_EINVAL, "libpermd_nccl was built for libpermd ABI %d, the libpermd loaded is "
                               "ABI %u: rebuild libpermd_nccl with it", PERMD_ABI_VERSION, permd_abi_version());
    permd_nccl *g = calloc(1, sizeof *g);
    if (!g)
        return permd_set_error(c, PERMD_ENOMEM, "permd_nccl_join: out of memory");
    int rc = permd_group_join(c, group, members, id, &g->rank, &g->nranks); /* its failures say why themselves */
    if (rc)
        goto fail;
    joined = 1;
    g->c = c;
    strcpy(g->group, group);
    g->device = device;
    g->timeout_ms = timeout_ms ? timeout_ms : 60000;
    if ((rc = pd_device_enter(c, device, &was)))
        goto fail;
    const cudaError_t e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        g->stream = NULL;
        rc = permd_set_error(c, PERMD_EUNAVAILABLE, "CUDA device %d: creating a stream: %s", device,
                             cudaGetErrorString(e));
        goto fail;
    }
    memcpy(&u, id, sizeof u);
    cfg.blocking = 0;
    /* Never NVLink multicast (docs/nccl.md): point-to-point sends have no use for it, and it can take a shared
     * host's GPUs down. A trainer's explicit setting stands; NCCL reads it when this process first inits. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const ncclResult_t r = ncclCommInitRankConfig(&g->comm, (int)g->nranks, u, (int)g->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress && !g->comm) {
        rc = permd_set_error(c, PERMD_EIO, "NCCL init of rank %u of %u on CUDA device %d failed: %s", g->rank,
                             g->nranks, device, ncclGetErrorString(r));
        goto fail;
    }
    if ((rc = pd_nccl_wait(g->comm, NULL, g->timeout_ms, NULL))) {
        rc = pd_wait_failed(c, g->comm, rc, "init", g->timeout_ms);
        goto fail;
    }
    pd_device_leave(was);
    *out = g;
    return PERMD_OK;
fail:
    pd_member_abort(g);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    pd_device_leave(was);
    /* permd counted this member: tell it, so the group fails now and its name is free, not at delivery_timeout_ms.
     * The error that matters is the one above, and so is its message; a refused leave (the connection broke)
     * changes nothing. */
    if (joined && rc != PERMD_ECLOSED) {
        char why[512];
        snprintf(why, sizeof why, "%s", permd_last_error(c));
        permd_group_leave(c, group);
        permd_set_error(c, rc, "%s", why);
    }
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
    const cudaError_t e = cudaPointerGetAttributes(&a, dev_out);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it for the caller */
        return permd_set_error(g->c, PERMD_EINVAL, "dev_out %p: %s", dev_out, cudaGetErrorString(e));
    }
    if (a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == g->device))
        return PERMD_OK;
    return permd_set_error(g->c, PERMD_EINVAL, "dev_out %p is %s, not memory of this member's CUDA device %d", dev_out,
                           a.type == cudaMemoryTypeDevice ? "another device's memory" : "host memory", g->device);
}

int permd_nccl_recv(permd_nccl *g, const permd_slice *s, uint64_t count, uint32_t id_width, void *dev_out,
                    void *cuda_stream, uint64_t *got, uint32_t *width, uint64_t *next_offset)
{
    int was, rc;
    cudaStream_t stream = cuda_stream ? (cudaStream_t)cuda_stream : g ? g->stream : NULL;
    if (!g || !got || !width || (count && !dev_out) || (id_width != 0 && id_width != 4 && id_width != 8))
        return permd_set_error(g ? g->c : NULL, PERMD_EINVAL, "permd_nccl_recv: a member, got, width and (for a count) "
                               "dev_out are required; id_width is 0, 4 or 8, not %u", id_width);
    if (!g->comm)
        return permd_set_error(g->c, PERMD_ECLOSED, "this member's communicator was aborted by an earlier failure: "
                               "leave the group and join again");
    if ((rc = pd_device_enter(g->c, g->device, &was)))
        return rc;
    if (count && (rc = pd_check_buffer(g, dev_out)))
        goto out;
    if ((rc = permd_group_deliver(g->c, g->group, s, count, id_width, got, width, next_offset)) || *got == 0)
        goto out;
    ncclResult_t r = ncclRecv(dev_out, (size_t)*got * *width, ncclUint8, 0, g->comm, stream);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = permd_set_error(g->c, PERMD_EIO, "NCCL receive of %llu ids failed: %s", (unsigned long long)*got,
                             ncclGetErrorString(r));
        pd_member_abort(g);
        goto out;
    }
    if ((rc = pd_nccl_wait(g->comm, stream, g->timeout_ms, NULL))) {
        rc = pd_wait_failed(g->c, g->comm, rc, "receive", g->timeout_ms);
        pd_member_abort(g);
    }
out:
    pd_device_leave(was);
    return rc;
}

int permd_nccl_leave(permd_nccl *g)
{
    if (!g)
        return PERMD_OK;
    int rc = permd_group_leave(g->c, g->group), was;
    pd_device_enter(NULL, g->device, &was); /* quietly: the leave's message is permd's answer */
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
