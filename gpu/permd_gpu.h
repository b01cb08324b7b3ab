/* permd's CUDA backend behind a plain C ABI: σ over a range or a rank's slice, and payload shuffles. */
#ifndef PERMD_GPU_H
#define PERMD_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "core/rank.h"
#include "core/shards.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One device, one CUDA stream, and scratch space. Not thread-safe: one per thread. */
typedef struct pd_gpu pd_gpu;

/* How kernels handle cycle walking, whose length varies per index (~2 steps
 * on average, 6+ for some lanes of every warp when n is just above 2^k). */
typedef enum pd_gpu_walk {
    PD_GPU_WALK_AUTO = 0,   /* default: REFILL for ids, STAGED for payload gathers (measured best) */
    PD_GPU_WALK_NAIVE = 1,  /* one index per thread; the warp waits for its longest walk */
    PD_GPU_WALK_REFILL = 2, /* a lane that finishes takes the warp's next pending index */
    PD_GPU_WALK_STAGED = 3, /* refill, with results parked in shared memory and then written
                               (or gathered) coalesced, many loads in flight */
} pd_gpu_walk;

/* Number of usable CUDA devices; 0 (and PD_OK) when there is no driver or no GPU. */
int pd_gpu_device_count(int *count);

/* The same, and with 0 devices why (up to len bytes): CUDA's error ("no CUDA-capable device is detected", a
 * driver too old for this runtime, device nodes this process may not open), so that a GPU host that sees none
 * says which, where "no GPU" hid it. */
int pd_gpu_devices(int *count, char *why, size_t len);

/* Open a device. PD_EUNSUPPORTED when it does not exist or CUDA is unusable. */
int pd_gpu_open(int device, pd_gpu **out);
void pd_gpu_close(pd_gpu *g);

/* "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"; valid until pd_gpu_close. */
const char *pd_gpu_describe(const pd_gpu *g);

/* The kernels run on this stream (a cudaStream_t; NULL = the pd_gpu's own). One stream at a time: a
 * pd_gpu's scratch (the shard fill's tile counter, the scan's buffer) is shared by its calls, so work queued
 * on another stream must be done before the stream changes (two fills in flight on two streams would race
 * on it). A pd_gpu serves one thread; open one per stream for concurrent work. */
int pd_gpu_set_stream(pd_gpu *g, void *cuda_stream);
int pd_gpu_set_walk(pd_gpu *g, pd_gpu_walk walk);
/* Wait for the stream; reports any asynchronous kernel failure. */
int pd_gpu_sync(pd_gpu *g);

/* Device memory helpers for callers without the CUDA runtime (C tests, tools):
 * plain cudaMalloc'd buffers on the pd_gpu's device; copies are synchronous. */
int pd_gpu_alloc(pd_gpu *g, size_t bytes, void **dev_ptr);
void pd_gpu_free(pd_gpu *g, void *dev_ptr);
int pd_gpu_copy_to_host(pd_gpu *g, void *host, const void *dev, size_t bytes);
int pd_gpu_copy_to_device(pd_gpu *g, void *dev, const void *host, size_t bytes);

/* Device-memory outputs, queued on the stream (call pd_gpu_sync before reading).
 * width is 4 (u32, requires n ≤ 2^32: else PD_EOVERFLOW) or 8. Arguments and
 * errors as core's pd_perm_fill_* and pd_slice_fill_*. */
int pd_gpu_perm_fill(pd_gpu *g, const pd_perm *p, uint64_t start, uint64_t count, void *dev_out,
                     unsigned width);
int pd_gpu_slice_fill(pd_gpu *g, const pd_perm *p, const pd_slice *s, uint64_t count, void *dev_out,
                      unsigned width, uint64_t *written);

/* Host-memory output: generates on the device through a reusable staging
 * buffer and copies back; synchronous. For the daemon's large requests. */
int pd_gpu_slice_fill_host(pd_gpu *g, const pd_perm *p, const pd_slice *s, uint64_t count,
                           void *host_out, unsigned width, uint64_t *written);

/* Payload shuffle in σ order: out[i] = in[σ(i)] for i < n, elements of
 * elem_size ∈ {1, 2, 4, 8, 16} bytes; in and out are device pointers, each
 * aligned to elem_size, and not overlapping (PD_EINVAL otherwise: a misaligned
 * load is a sticky CUDA error, and in place would read what it overwrote). */
int pd_gpu_gather(pd_gpu *g, const pd_perm *p, const void *dev_in, void *dev_out, size_t elem_size);

/* Mitchell et al.'s Algorithm 1 (fused bijective shuffle: f over [0, 2^b),
 * a single-pass decoupled look-back scan of f(i) < n, scatter). Uniform too,
 * but in compaction order, not σ's: positions depend on prefix counts. For
 * comparison in benchmarks; permd serves σ order. */
int pd_gpu_shuffle_fused(pd_gpu *g, const pd_perm *p, const void *dev_in, void *dev_out, size_t elem_size);

/* ---- Sharded epochs (docs/spec/shards-v1.md) */

/* A device copy of a pd_shard_plan's tables (16 bytes per shard), for any
 * number of requests. Building the plan stays on the host (O(S), cached). */
typedef struct pd_gpu_plan pd_gpu_plan;

int pd_gpu_plan_upload(pd_gpu *g, const pd_shard_plan *plan, pd_gpu_plan **out);
void pd_gpu_plan_free(pd_gpu *g, pd_gpu_plan *plan);

/* A rank's next ids of a sharded epoch, as pd_shard_slice_fill_*: width 4
 * (u32, N ≤ 2^32: else PD_EOVERFLOW), 8, or 16 (locations: shard then offset,
 * each a u64). dev_out: queued on the stream; host_out: synchronous. */
int pd_gpu_shard_slice_fill(pd_gpu *g, const pd_gpu_plan *plan, const pd_slice *s, uint64_t count, void *dev_out,
                            unsigned width, uint64_t *written);
int pd_gpu_shard_slice_fill_host(pd_gpu *g, const pd_gpu_plan *plan, const pd_slice *s, uint64_t count,
                                 void *host_out, unsigned width, uint64_t *written);

#ifdef __cplusplus
}
#endif

#endif
