/* Bulk σ and sharded ids on the CPU: scalar, AVX2 and AVX-512 kernels chosen at run time, and a thread pool; bit-identical to core/. */
#ifndef PD_CPU_GEN_H
#define PD_CPU_GEN_H

#include <stdint.h>

#include "core/perm.h"
#include "core/rank.h"
#include "core/shards.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Instruction sets with a kernel. The numbering orders them by preference. */
typedef enum pd_isa {
    PD_ISA_AUTO = 0,   /* the best one this CPU (and OS) can run */
    PD_ISA_SCALAR = 1, /* the core's loop: always available */
    PD_ISA_AVX2 = 2,   /* 8 lanes of 32 bits */
    PD_ISA_AVX512 = 3, /* 16 lanes of 32 bits (AVX-512F and BW) */
} pd_isa;

/* How a SIMD kernel cycle-walks (spec §4): lanes whose value is still ≥ n
 * must apply f again while their neighbours are done. Only benchmarks and
 * tests need anything but AUTO; every strategy gives the same bytes. */
typedef enum pd_walk {
    PD_WALK_AUTO = 0,     /* the fastest measured strategy (COMPACT) */
    PD_WALK_LOCKSTEP = 1, /* a vector of consecutive positions walks until all its lanes are done: the naive baseline */
    PD_WALK_REFILL = 2,   /* finished lanes are compress-stored with their output index and refilled with the
                             next positions by vector permutes (AVX2: lookup tables; AVX-512: vpcompressd/vpexpandd) */
    PD_WALK_REFILL_SCALAR = 3, /* the same refill, done lane by lane in scalar code (AVX2 only) */
    PD_WALK_COMPACT = 4,  /* every position is evaluated once in order; lanes still outside are
                             compress-stored to a queue that later passes evaluate and compact */
} pd_walk;

/* A generator: which kernel runs and how it walks. A plain value; set it up
 * with pd_gen_init (and, for experiments, pd_gen_set_walk); it is read-only
 * afterwards, so one pd_gen may serve any number of threads. */
typedef struct pd_gen {
    pd_isa isa;   /* never PD_ISA_AUTO after pd_gen_init */
    pd_walk walk; /* PD_WALK_AUTO unless pd_gen_set_walk chose one */
    int vbmi;     /* AVX-512 only, set by pd_gen_init where the CPU has AVX-512 VBMI: small τ
                     (sharded windows, b ≤ 17) walk on byte lanes. */
    int bw;       /* AVX-512 only, set by pd_gen_init: without vbmi, small τ walk on 16-bit lanes. Clear
                     both to walk them on 32-bit lanes (PD_SMALL), the way before word lanes. */
    int avx2;     /* set by pd_gen_init where isa is AVX2, or AVX-512 on a CPU with AVX2 (every real one): the
                     helpers that have no AVX-512 version (a mixture's sparse grouping) run their AVX2 one */
} pd_gen;

/* ---- Instruction sets */

/* The best ISA that this CPU and OS support and this build contains. The
 * CPUID probe runs once; its result is cached (the only global state here). */
pd_isa pd_cpu_best_isa(void);

/* 1 if isa can run here (PD_ISA_AUTO and PD_ISA_SCALAR always can), else 0. */
int pd_cpu_has_isa(pd_isa isa);

/* "auto", "scalar", "avx2", "avx512"; "?" for anything else. */
const char *pd_isa_name(pd_isa isa);

/* Inverse of pd_isa_name; PD_EINVAL for an unknown name. */
int pd_isa_parse(const char *s, pd_isa *isa);

/* "auto", "lockstep", "refill", "refill-scalar", "compact"; "?" for anything else. */
const char *pd_walk_name(pd_walk walk);

/* ---- Generators */

/* Choose isa (PD_ISA_AUTO: the best available) with its default walk.
 * PD_EINVAL for a NULL g or an unknown isa; PD_EUNSUPPORTED when this CPU
 * or build cannot run isa. */
int pd_gen_init(pd_gen *g, pd_isa isa);

/* Choose how g's ISA walks. PD_EINVAL for an unknown walk; PD_EUNSUPPORTED
 * when the ISA has no such strategy (the scalar ISA takes only AUTO). */
int pd_gen_set_walk(pd_gen *g, pd_walk walk);

/* Bulk σ: out[i] = σ(start + i) for i < count, as pd_perm_fill_u64/u32 and
 * with the same errors: PD_EINVAL for a NULL g or p (or out with count > 0),
 * PD_ERANGE if start + count > n, PD_EOVERFLOW for u32 output when n > 2^32;
 * besides, PD_EINVAL for a g that pd_gen_init did not set up and
 * PD_EUNSUPPORTED for one whose ISA this CPU cannot run. */
int pd_gen_fill_u64(const pd_gen *g, const pd_perm *p, uint64_t start, uint64_t count, uint64_t *out);
int pd_gen_fill_u32(const pd_gen *g, const pd_perm *p, uint64_t start, uint64_t count, uint32_t *out);

/* A rank's next min(count, remaining) sample ids, as pd_slice_fill_u64/u32
 * and with the same errors. *written gets how many were written. */
int pd_gen_slice_fill_u64(const pd_gen *g, const pd_perm *p, const pd_slice *s, uint64_t count,
                          uint64_t *out, uint64_t *written);
int pd_gen_slice_fill_u32(const pd_gen *g, const pd_perm *p, const pd_slice *s, uint64_t count,
                          uint32_t *out, uint64_t *written);

/* ---- Thread pool: one request split across cores */

typedef struct pd_pool pd_pool;

/* A pool in which each request runs on nthreads threads: the caller and
 * nthreads - 1 helpers it starts (0: one per online CPU). gen picks the
 * kernel (NULL: PD_ISA_AUTO). Any number of threads may submit requests at
 * once; each waits for its own. PD_EINVAL for a NULL out or a bad gen,
 * PD_ENOMEM when memory or threads run out. */
int pd_pool_create(unsigned nthreads, const pd_gen *gen, pd_pool **out);

/* Stop and join the helpers. No request may be in flight. NULL is a no-op. */
void pd_pool_destroy(pd_pool *pool);

/* Threads that work on one request, the caller included. */
unsigned pd_pool_threads(const pd_pool *pool);

/* How long a pool thread polls before it sleeps: a helper after its last chunk, for the next request, while
 * split requests have been arriving at most ns after the last one ended (else it sleeps at once: a client
 * asking every few ms costs no polling); and a caller whose chunks are done, for its helpers', at most
 * min(ns, 50 µs).
 * Sleeping costs a wake-up through the kernel, several µs and on VMs tens (cpu/pool.c), which split
 * requests of tens of µs cannot afford. 0 (the default): sleep at once. PD_EINVAL for a NULL pool or
 * ns > PD_POOL_SPIN_MAX_NS. Any thread, any time. */
#define PD_POOL_SPIN_MAX_NS UINT64_C(100000000) /* 100 ms */
int pd_pool_set_spin(pd_pool *pool, uint64_t ns);

/* Times a helper found a request's work while polling, or in the yield it makes before polling after a
 * request's last chunk (*caught; a request counts once per helper that catches it), and times a helper went
 * to sleep (*slept). Zeros for NULL. */
void pd_pool_counts(const pd_pool *pool, uint64_t *caught, uint64_t *slept);

/* The pd_gen_* fills, split across the pool; same results and errors
 * (PD_EINVAL for a NULL pool too). Small requests run on the caller alone. */
int pd_pool_fill_u64(pd_pool *pool, const pd_perm *p, uint64_t start, uint64_t count, uint64_t *out);
int pd_pool_fill_u32(pd_pool *pool, const pd_perm *p, uint64_t start, uint64_t count, uint32_t *out);
int pd_pool_slice_fill_u64(pd_pool *pool, const pd_perm *p, const pd_slice *s, uint64_t count,
                           uint64_t *out, uint64_t *written);
int pd_pool_slice_fill_u32(pd_pool *pool, const pd_perm *p, const pd_slice *s, uint64_t count,
                           uint32_t *out, uint64_t *written);

/* ---- Sharded epochs (docs/spec/shards-v1.md) */

/* pd_shard_plan_init with the shard order π computed by g's σ kernel: the same plan and errors, besides those
 * of g (checked first). The core evaluates π one shard at a time; this builds a plan 4-11x faster on AVX2
 * (bench/results/shards.md, "Plan build": less at 2^24 shards, where summing the slots' starts reads the
 * layout at random). It is the plan build of a sharded dataset's first request of each epoch. */
int pd_gen_shard_plan_init(const pd_gen *g, pd_shard_plan *plan, const uint64_t *start, uint64_t shards,
                           uint64_t seed, uint64_t epoch, uint64_t window, uint64_t lanes, void *mem,
                           size_t mem_bytes);

/* pd_gen_shard_plan_init as a pd_shard_planner, its context a const pd_gen * (pd_mix_cursor_set_planner). */
int pd_gen_shard_planner(const void *g, pd_shard_plan *plan, const uint64_t *start, uint64_t shards, uint64_t seed,
                         uint64_t epoch, uint64_t window, uint64_t lanes, void *mem, size_t mem_bytes);

/* A rank's next min(count, remaining) ids of a sharded epoch, as pd_shard_slice_fill_u64/u32 and
 * with the same errors (PD_EOVERFLOW for u32 when N > 2^32), besides those of g or pool above.
 * The rank's positions are cut into runs that stay inside one window; batches of runs go through
 * g's σ kernels and their slot lookups through a vector search of the window's slot table, copied
 * (windows of at most PD_SHARD_TABLE_SLOTS slots, 12 bytes each) to the stack. No allocation:
 * each call (each pool chunk) uses ~95 KiB of stack. docs/shards.md#speed explains the kernels. */
#define PD_SHARD_TABLE_SLOTS 1024
int pd_gen_shard_slice_fill_u64(const pd_gen *g, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                                uint64_t *out, uint64_t *written);
int pd_gen_shard_slice_fill_u32(const pd_gen *g, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                                uint32_t *out, uint64_t *written);
int pd_pool_shard_slice_fill_u64(pd_pool *pool, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                                 uint64_t *out, uint64_t *written);
int pd_pool_shard_slice_fill_u32(pd_pool *pool, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                                 uint32_t *out, uint64_t *written);
/* The samples at stream positions at[0, n) of a sharded epoch (each below N, in any order), in place:
 * at[i] becomes pd_shard_locate(plan, at[i])'s sample. Fastest where consecutive positions mostly share a
 * window and move one way in their lane (a mixture's reads of a sharded component, ascending draws): each
 * stretch of them in one window is gathered on g's σ kernel. Unchecked (the caller validated); ~145 KiB of
 * stack, with the gather kernel's (~130 measured, before its lane sort took 4096 positions at a time). */
void pd_gen_shard_gather_u64(const pd_gen *g, const pd_shard_plan *plan, uint64_t *at, uint64_t n);

#ifdef __cplusplus
}
#endif

#endif
