/* Bulk mixture fills on the CPU kernels (docs/spec/mixtures-v1.md): bit-identical to core/mixture.c's fills. */
#ifndef PD_CPU_MIX_H
#define PD_CPU_MIX_H

#include "core/mixture.h"
#include "cpu/gen.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A rank's next min(count, remaining) global ids of mixture epoch E, as pd_mix_slice_fill_u64/u32 and
 * with the same errors (in the same order); besides, those of pd_gen_fill_* for g, and PD_ENOMEM.
 *
 * How: cpu/mix.c's opening comment. In short, a read costs its block's slot (tables of whole blocks, 8 at
 * a time, for small W; a kernel keying each read for larger W), its component and draw (a walk of the
 * weight tree per block, or a descent per read) and its component's σ (over whole ranges for W = 1;
 * else, on AVX-512, the reads of flat components of 2 to 2^32 samples in read order with every lane on its
 * component's keys, and the others', or all on AVX2, gathered by component). A sharded component's draws
 * come from its cursor's plan: over whole ranges (W = 1) or spans dense in reads on the SIMD kernel, else
 * a locate per read. The cursor is the caller's (one per thread). */
int pd_gen_mix_fill_u64(const pd_gen *g, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                        uint64_t *out, uint64_t *written);
int pd_gen_mix_fill_u32(const pd_gen *g, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                        uint32_t *out, uint64_t *written);

/* The same, split across the pool: one part per thread, each of PD_MIX_POOL_PART_MIN_* to _MAX reads. A
 * part has a fixed cost (each component's σ run ends in a latency-bound drain of its walks, and parts
 * set up a cursor): ~5 µs at W = 1 on Zen 5, a thousand ids' work, so finer parts lose (one thread,
 * 8192 ids at W = 1 on an EPYC: 40 µs in one part, 45 in 2, 72 in 8). Longer parts would not gain, and
 * their scratch (4 or 8 bytes a position) would leave the L2 cache. A request of one part runs on the
 * caller's cursor. Else the caller's cursor first builds the orders of sharded components the request
 * reaches, where a component's reach is two component epochs at most, and every part reads through a
 * view of it (pd_mix_cursor_share): such an O(S_j) order is built once, not once per part. (A component
 * the request cycles more often, small for its W, is built by each part that reaches it.) The views' own
 * builds count in c->built. Mixtures whose cursor is over PD_MIX_POOL_CURSOR_MAX bytes run on the caller
 * alone (each view may build into memory of that size). Same results and errors. */
#define PD_MIX_POOL_PART_MIN_DENSE 2048 /* W = 1 */
#define PD_MIX_POOL_PART_MIN_SPARSE 512 /* W > 1: a part's fixed cost is lower (8192 reads at W = 8 on one
                                           thread: 69 µs in 1 part, 80 in 8); 16 threads share 8192 reads */
#define PD_MIX_POOL_PART_MAX 32768 /* 65536 reads on a 2-thread pool: 2 parts, not 8 (8192 a part cost W = 1
                                      184 µs a request, W = 8 229; 32768: 157 and 222; 2-vCPU Xeon) */
#define PD_MIX_POOL_CURSOR_MAX ((size_t)1 << 20) /* bytes */
/* What a mixture id costs in flat σ evaluations, PD_MIX_COST_DENSE read by one rank (the dense fill) and
 * PD_MIX_COST_SPARSE by more (bench/mixtures: 2.7 and 4-10 on the CPUs measured): the daemon's inline
 * budget counts mixture ids by it. */
#define PD_MIX_COST_DENSE 3
#define PD_MIX_COST_SPARSE 8
/* What a mixture id read by one of `world` ranks costs, in flat σ evaluations: PD_MIX_COST_DENSE or _SPARSE. */
uint64_t pd_mix_id_cost(uint64_t world);
int pd_pool_mix_fill_u64(pd_pool *pool, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                         uint64_t *out, uint64_t *written);
int pd_pool_mix_fill_u32(pd_pool *pool, pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, uint64_t count,
                         uint32_t *out, uint64_t *written);

#ifdef __cplusplus
}
#endif

#endif
