/* Internal contract between cpu/gen.c, cpu/pool.c and the per-ISA kernels: one validated run of positions. */
#ifndef PD_CPU_KERNEL_H
#define PD_CPU_KERNEL_H

#include <stdint.h>

#include "core/mixture.h"
#include "cpu/gen.h"

/* A run: out[i] = σ(first + i·stride) for i < count. The caller has checked
 * everything: every position is below n, n ≥ 2, stride < 2^32, and count is
 * at most PD__RUN_MAX, so a lane's output index always fits a signed 32-bit
 * lane (SIMD compares on x86 are signed). Kernels cannot fail. */
typedef struct pd__run {
    const pd_perm *perm;
    uint64_t first;
    uint64_t stride; /* 1 for a range, W for a rank's slice */
    uint64_t count;
    void *out;
    unsigned width; /* bytes per id: 4 or 8 */
    pd_walk walk;   /* never PD_WALK_AUTO */
} pd__run;

#define PD__RUN_MAX (UINT64_C(1) << 30)

/* Below this many ids a request runs on the scalar kernel: a SIMD kernel's
 * set-up and its last partly empty vectors cost more than they save. */
#define PD__SIMD_MIN 64

/* A validated request: a body run of positions below n and, in pad mode, at
 * most one last id whose position wraps (p ≥ n reads σ(p mod n)). Positions
 * of one rank are W apart and the wrapped part [n, T) is shorter than W, so
 * one is all there can be. */
typedef struct pd__req {
    pd__run body;
    int has_tail;
    uint64_t tail_position;
    uint64_t total; /* ids written: body.count + has_tail */
} pd__req;

/* Validate like pd_perm_fill_* and pd_slice_fill_* (same codes, same order). */
int pd__req_range(const pd_perm *p, uint64_t start, uint64_t count, void *out, unsigned width, pd__req *req);
int pd__req_slice(const pd_perm *p, const pd_slice *s, uint64_t count, void *out, unsigned width,
                  pd__req *req);

/* PD_EINVAL for a g that pd_gen_init did not set up, PD_EUNSUPPORTED for an ISA this CPU cannot run. */
int pd__gen_check(const pd_gen *g);

/* Run a validated run (any count; chunked to PD__RUN_MAX) on g's kernel. */
void pd__gen_run(const pd_gen *g, const pd__run *run);

/* Write a request's wrapped last id, if it has one. */
void pd__req_tail(const pd__req *req);

/* The parity correction (spec §3) swaps the images 0 and 1 of f. Both are
 * below any n ≥ 2, so it never changes whether a walk goes on, only the final
 * id of the two positions whose walk ends at 0 or 1. The SIMD kernels
 * therefore walk without it and call this at the end: it finds those two
 * positions with the core's inverse walk (no parity) and flips their ids. */
void pd__run_fix_parity(const pd__run *run);

/* Kernels. The SIMD ones exist only in x86-64 builds and may only be called
 * once pd_cpu_has_isa said yes: they are compiled for their ISA. */
void pd__run_scalar(const pd__run *run);
/* The scalar walk with the parity correction on (1, σ) or off (0: for the
 * tails of SIMD kernels, which fix the parity of the whole run at the end). */
void pd__run_scalar_walk(const pd__run *run, int parity);
#if defined(PD_CPU_HAVE_AVX2)
void pd__run_avx2(const pd__run *run);
#endif
#if defined(PD_CPU_HAVE_AVX512)
void pd__run_avx512(const pd__run *run);
#endif

/* ---- Entry points for mixtures (cpu/mix.c; docs/spec/mixtures-v1.md) */

/* Block slots: out[t] = π_β(g mod B) for run positions g = first + t·stride, t < count, β = g / B, with
 * block β's keys of a mixture of this seed and block (pd__mix_block_keys): every lane its own keys, so one
 * call covers any number of blocks. B is a power of two in [64, 2048], stride < 2^32, count ≤ PD__RUN_MAX. */
typedef struct pd__slots {
    uint64_t seed, block;
    uint64_t first, stride, count;
    uint32_t *out;
} pd__slots;

void pd__slots_scalar(const pd__slots *s);
#if defined(PD_CPU_HAVE_AVX512)
void pd__slots_avx512(const pd__slots *s);
#endif

/* Gather: out[i] = σ(positions[i]) for i < run->count (run->first and stride are not used), every position
 * below n, n ≥ 2, count ≤ PD__RUN_MAX. */
void pd__gather_scalar(const pd__run *run, const uint64_t *positions);
#if defined(PD_CPU_HAVE_AVX512)
void pd__gather_avx512(const pd__run *run, const uint64_t *positions);
#endif

#endif
