/* Division by invariant integers (Granlund and Montgomery 1994, Figure 4.1): ⌊y/d⌋ for every u64 y as a
 * multiply-high and shifts, exact for 1 ≤ d < 2^64. For divisors that stay fixed over many divisions (a
 * mixture's node weights and component sizes): a 64-bit div costs ~40 cycles on the CPUs measured. */
#ifndef PD_CPU_DIVIDE_H
#define PD_CPU_DIVIDE_H

#include <stdint.h>

#include "core/perm.h"

typedef struct pd_divisor {
    uint64_t d, magic;
    uint32_t shift; /* ⌈log2 d⌉ */
} pd_divisor;

/* m' = ⌊2^64·(2^ℓ − d)/d⌋ + 1 with ℓ = ⌈log2 d⌉ (d = 1: ℓ = 0, no multiply). */
static inline void pd_divisor_init(pd_divisor *v, uint64_t d)
{
    const uint32_t l = d > 1 ? pd_bit_width(d - 1) : 0;
    v->d = d;
    v->shift = l;
    v->magic = l ? (uint64_t)((((unsigned __int128)1 << 64) * (((unsigned __int128)1 << l) - d)) / d) + 1 : 0;
}

/* t = mulhi(m', y); ⌊y/d⌋ = (t + ⌊(y − t)/2⌋) >> (ℓ − 1). */
static inline uint64_t pd_divide(const pd_divisor *v, uint64_t y)
{
    if (!v->shift)
        return y;
    const uint64_t t = (uint64_t)(((unsigned __int128)y * v->magic) >> 64);
    return (t + ((y - t) >> 1)) >> (v->shift - 1);
}

#endif
