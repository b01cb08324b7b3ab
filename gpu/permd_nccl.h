/* libpermd_nccl: the trainer's half of NCCL delivery: join a group, receive a rank's ids into GPU memory, leave. */
#ifndef PERMD_NCCL_H
#define PERMD_NCCL_H

#include <stdint.h>

#include "client/permd.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct permd_nccl permd_nccl;

/* The PERMD_ABI_VERSION of the permd.h this library was built with. A binding checks it against libpermd's
 * permd_abi_version() before it calls anything here; permd_nccl_join refuses (PERMD_EINVAL) to run on a libpermd
 * of another one (a libpermd_nccl left from an older build). Failures of these calls are described by
 * permd_last_error() of the member's connection, as libpermd's own are. */
PERMD_API unsigned permd_nccl_abi_version(void);

/* Join group (created by the first joiner) of `members` trainers on CUDA
 * device `device`, over the connection c (which must outlive the member).
 * Blocks until every member and permd have joined the communicator, or
 * timeout_ms: PERMD_ETIMEDOUT. PERMD_EUNAVAILABLE when permd has no GPU/NCCL.
 * A join that fails after permd took it leaves the group again. The caller's
 * current CUDA device is kept. */
PERMD_API int permd_nccl_join(permd_client *c, const char *group, uint32_t members, int device, uint32_t timeout_ms,
                              permd_nccl **out);

/* The rank's next min(count, remaining) ids, written by NCCL into dev_out
 * and complete on return: device memory of this member's device (or managed
 * memory; anything else is PERMD_EINVAL) with room for count ids of id_width
 * bytes. id_width: 8 (an int64 buffer: any dataset), 4 (int32: PERMD_EINVAL
 * for a dataset over 2^32 samples), or 0 for the dataset's own (4 up to 2^32
 * samples, else 8: dev_out must then hold count * 8 bytes). cuda_stream (a
 * cudaStream_t, NULL for the member's own) orders the receive. *got ids of
 * *width bytes; *next_offset (may be NULL) is the checkpoint after them. A
 * timeout aborts the member's communicator: PERMD_ETIMEDOUT, and
 * PERMD_ECLOSED on later calls. The caller's current CUDA device is kept. */
PERMD_API int permd_nccl_recv(permd_nccl *g, const permd_slice *s, uint64_t count, uint32_t id_width, void *dev_out,
                              void *cuda_stream, uint64_t *got, uint32_t *width, uint64_t *next_offset);

/* The member's NCCL rank (1..members) and the group size (members + 1). */
PERMD_API int permd_nccl_rank(const permd_nccl *g, uint32_t *rank, uint32_t *nranks);

/* Tell permd, tear the communicator down, free. NULL is fine. */
PERMD_API int permd_nccl_leave(permd_nccl *g);

#ifdef __cplusplus
}
#endif

#endif
