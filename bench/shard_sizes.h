/* Shard sizes the benchmarks share: the same pseudo-random layout in every program and run. */
#ifndef PERMD_BENCH_SHARD_SIZES_H
#define PERMD_BENCH_SHARD_SIZES_H

#include <stdint.h>

/* sizes[i] = lo + r_i mod span for i < n (span 0: lo each), r_i from a fixed LCG, so a layout is reproducible
 * across programs and runs (bench/shards' uneven layouts and bench/mixtures' sharded component). */
static inline void bench_shard_sizes(uint64_t *sizes, uint64_t n, uint64_t lo, uint64_t span)
{
    uint64_t rng = 0x5eed;
    for (uint64_t i = 0; i < n; i++) {
        rng = rng * 6364136223846793005u + 1442695040888963407u;
        sizes[i] = lo + (span ? (rng >> 33) % span : 0);
    }
}

#endif
