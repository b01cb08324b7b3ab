/* The daemon's half of NCCL delivery: permd as rank 0 generates a slice on its GPU and ncclSends it to a trainer. */
#ifndef PERMD_DELIVERY_H
#define PERMD_DELIVERY_H

#include <stddef.h>
#include <stdint.h>

#include "core/rank.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PD_NCCL_ID_BYTES 128

/* One communicator with its GPU stream and staging buffer, used by one
 * thread. The blocking calls poll `cancel` (an int another thread may set
 * with __atomic_store_n; NULL: never) and give up when it is set. */
typedef struct pd_delivery pd_delivery;

/* PD_OK when a GPU and NCCL can be used here; else PD_EUNAVAILABLE and why. */
int pd_delivery_probe(int device, char *why, size_t whylen);

/* A fresh ncclUniqueId for a new group. */
int pd_delivery_unique_id(uint8_t id[PD_NCCL_ID_BYTES]);

/* Join the communicator as rank 0 of nranks on device. Blocks until every
 * rank has joined: PD_ETIMEDOUT after timeout_ms, PD_ECLOSED when cancelled.
 * On failure *out is NULL. */
int pd_delivery_open(int device, const uint8_t id[PD_NCCL_ID_BYTES], int nranks, uint32_t timeout_ms,
                     const int *cancel, pd_delivery **out);

/* One send: the next `count` ids (width 4 or 8) of `slice` under `perm`, for NCCL rank `peer`. */
typedef struct pd_delivery_job {
    pd_perm perm;
    pd_slice slice;
    uint64_t count;
    unsigned width;
    int peer;
} pd_delivery_job;

#define PD_DELIVERY_JOBS 16 /* the most jobs one pd_delivery_send_jobs takes */

/* Generate the n ≤ PD_DELIVERY_JOBS jobs' ids on the GPU, then send them in one NCCL group, so that
 * transfers to different trainers overlap, waiting until every one is delivered. On a timeout or
 * cancel the communicator is aborted (PD_ETIMEDOUT / PD_ECLOSED) and every later call fails; an
 * NCCL error gives PD_EIO. */
int pd_delivery_send_jobs(pd_delivery *d, const pd_delivery_job *jobs, unsigned n, uint32_t timeout_ms,
                          const int *cancel);

/* Finalize (or abort, when broken or cancelled) and free. NULL is fine. */
void pd_delivery_close(pd_delivery *d, uint32_t timeout_ms, const int *cancel);

#ifdef __cplusplus
}
#endif

#endif
