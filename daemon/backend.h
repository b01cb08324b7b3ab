/* Where the daemon's ids come from: the CPU (SIMD kernels, a thread pool) or, for large requests, a GPU. */
#ifndef PD_BACKEND_H
#define PD_BACKEND_H

#include <stdint.h>

#include "core/mixture.h"
#include "core/rank.h"
#include "core/shards.h"
#include "cpu/gen.h"

typedef struct pd_backend pd_backend;

typedef struct pd_backend_opts {
    const char *cpu_isa;     /* "auto", "scalar", "avx2", "avx512" */
    unsigned cpu_threads;    /* threads one large request is split over; 0: one per CPU */
    uint64_t cpu_spin_ns;    /* how long the split's threads poll before sleeping (pd_pool_set_spin) */
    const char *gpu;         /* "auto": use a GPU when one can be opened; "off" */
    unsigned gpu_device;     /* CUDA device index */
    uint64_t gpu_min_ids;    /* requests below this stay on the CPU */
    const char *gpu_library; /* path of libpermd_gpu.so; "": beside the executable, then the loader's path */
} pd_backend_opts;

/* Probe the CPU, start the pool, try the GPU. A GPU that cannot be used is
 * not an error: one log line says why, and everything runs on the CPU.
 * PD_EINVAL for an unknown option value, PD_EUNSUPPORTED for a CPU ISA this
 * machine lacks, PD_ENOMEM. */
int pd_backend_open(const pd_backend_opts *opts, pd_backend **out);
void pd_backend_close(pd_backend *b);

/* Write the rank's next min(count, remaining) ids as `width`-byte
 * little-endian integers (4 or 8, see pd_id_width) into out, aligned to
 * width; *written gets how many. Callable from any thread at once.
 * PD_EINVAL for a bad width or slice, PD_EOVERFLOW for width 4 when n > 2^32.
 * Every Fetch and Stream batch goes through here: the same bytes whichever
 * backend serves it. */
int pd_backend_slice(pd_backend *b, const pd_perm *perm, const pd_slice *slice, uint64_t count, unsigned width,
                     void *out, uint64_t *written);

/* The same for a sharded epoch plan (docs/spec/shards-v1.md). width 16
 * writes locations: shard then offset, each a little-endian u64. plan_id
 * names the plan for the GPU's cache of device copies (pd_plan_id: never
 * reused for another plan); 0 keeps the request on the CPU. */
int pd_backend_shard_slice(pd_backend *b, const pd_shard_plan *plan, uint64_t plan_id, const pd_slice *slice,
                           uint64_t count, unsigned width, void *out, uint64_t *written);

/* The same for mixture epoch `epoch` (docs/spec/mixtures-v1.md), through the caller's cursor (one
 * per thread). width 16 writes (component, local id) pairs, each a little-endian u64. Mixtures are
 * computed on the CPU, whatever the GPU: the SIMD kernels (cpu/mix.h) on the calling thread. */
int pd_backend_mix_slice(pd_backend *b, pd_mix_cursor *cur, uint64_t epoch, const pd_slice *slice, uint64_t count,
                         unsigned width, void *out, uint64_t *written);

/* The CPU kernels' generator (cpu_isa), for work outside the requests: building sharded plans (pd_plans_open).
 * NULL for a NULL b. */
const pd_gen *pd_backend_gen(const pd_backend *b);

/* "cpu=avx2 threads=16 spin_us=500 gpu=NVIDIA H100 80GB HBM3 (sm_90, 132 SMs) gpu_min_ids=1048576", for logs. */
const char *pd_backend_describe(const pd_backend *b);

/* Ids served by each side so far (for Stats and metrics). */
void pd_backend_counts(const pd_backend *b, uint64_t *cpu_ids, uint64_t *gpu_ids);

/* The GPU's failures: requests it failed that the CPU served instead, and whether a CUDA error (sticky: the
 * context is lost) turned it off until restart. */
void pd_backend_gpu_health(const pd_backend *b, uint64_t *fallbacks, int *off);

/* The CPU pool's helpers: requests caught while polling, and sleeps (pd_pool_counts). */
void pd_backend_pool_counts(const pd_backend *b, uint64_t *caught, uint64_t *slept);

#endif
