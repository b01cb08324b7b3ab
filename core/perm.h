/* The epoch permutation σ on [0, n) and its inverse (spec §3–4): VariablePhilox, parity fix, cycle walk. */
#ifndef PD_PERM_H
#define PD_PERM_H

#include <stddef.h>

#include "defs.h"
#include "error.h"
#include "keys.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PD_N_MAX (UINT64_C(1) << 63)
#define PD_MIN_BITS 6 /* spec §3: 4 bits (thrust's minimum) fails χ² at n = 5 */

/* VariablePhilox multiplier and its inverse mod 2^64 (the inverse undoes a round). */
#define PD_VP_M0 UINT64_C(0xD2B74407B1CE6E93)
#define PD_VP_M0_INV UINT64_C(0xF5F365BD212BDF9B)

/* Everything σ needs, derived once by pd_perm_init. It is a plain value
 * (no pointers) so that SIMD code and CUDA kernels can take it by copy;
 * treat the fields as read-only. */
typedef struct pd_perm {
    uint64_t n;      /* domain size, 1 ≤ n ≤ 2^63 */
    uint32_t bits;   /* b = max(6, bit_width(n - 1)) */
    uint32_t lbits;  /* b / 2 */
    uint32_t rbits;  /* b - lbits; rbits - lbits is 0 or 1 */
    uint32_t lmask;  /* 2^lbits - 1 */
    uint32_t rmask;  /* 2^rbits - 1 (rbits may be 32) */
    pd_keys keys;
} pd_perm;

/* Prepare σ for (seed, epoch, stream) over n samples.
 * PD_EINVAL if p is NULL or n is 0 or above 2^63. */
int pd_perm_init(pd_perm *p, uint64_t seed, uint64_t epoch, uint32_t stream, uint64_t n);

/* Checked σ and σ⁻¹: PD_ERANGE when the argument is not below n. */
int pd_perm_sample(const pd_perm *p, uint64_t position, uint64_t *sample);
int pd_perm_position(const pd_perm *p, uint64_t sample, uint64_t *position);

/* Bulk σ: out[i] = σ(start + i) for i < count. The reference for the SIMD
 * and CUDA backends. PD_ERANGE if start + count > n; PD_EOVERFLOW for u32
 * output when an id could exceed 2^32 - 1 (n > 2^32). */
int pd_perm_fill_u64(const pd_perm *p, uint64_t start, uint64_t count, uint64_t *out);
int pd_perm_fill_u32(const pd_perm *p, uint64_t start, uint64_t count, uint32_t *out);

/* ---- Inline kernels. Unchecked: the caller guarantees arguments are in range.
 * The pd__ variants take the round count and the parity switch so that the
 * quality tests can run deliberately weakened negative controls through the
 * same code; everything else uses pd_perm_at / pd_perm_inv. */

/* Bits in the binary representation of x (0 for x = 0). */
PD_STATIC_INLINE uint32_t pd_bit_width(uint64_t x)
{
    uint32_t w = 0;
    while (x) {
        w++;
        x >>= 1;
    }
    return w;
}

/* Fill the shape fields of p for n with a minimum width (6 in spec v1). */
PD_STATIC_INLINE void pd__perm_shape(pd_perm *p, uint64_t n, uint32_t min_bits)
{
    uint32_t b = n > 1 ? pd_bit_width(n - 1) : 0;
    if (b < min_bits)
        b = min_bits;
    p->n = n;
    p->bits = b;
    p->lbits = b / 2;
    p->rbits = b - b / 2;
    p->lmask = (uint32_t)((UINT64_C(1) << p->lbits) - 1);
    p->rmask = (uint32_t)((UINT64_C(1) << p->rbits) - 1);
}

/* VariablePhilox on [0, 2^b) (Mitchell et al., Figure 5). d = rbits - lbits
 * is a parameter so that kernels can fix it at compile time: when b is even,
 * s1 < 2^lbits and the paper's (lo << d) | (s1 >> lbits) is just lo. */
PD_STATIC_INLINE uint64_t pd__vphilox_d(const pd_perm *p, uint64_t v, int rounds, uint32_t d)
{
    uint32_t s0 = (uint32_t)(v >> p->rbits);
    uint32_t s1 = (uint32_t)v & p->rmask;
    for (int i = 0; i < rounds; i++) {
        uint64_t prod = PD_VP_M0 * s0;
        uint32_t hi = (uint32_t)(prod >> 32);
        uint32_t lo = (uint32_t)prod;
        if (d)
            lo = (lo << 1) | (s1 >> p->lbits);
        s0 = (hi ^ p->keys.k[i] ^ s1) & p->lmask;
        s1 = lo & p->rmask;
    }
    return ((uint64_t)s0 << p->rbits) | s1;
}

PD_STATIC_INLINE uint64_t pd__vphilox(const pd_perm *p, uint64_t v, int rounds)
{
    return pd__vphilox_d(p, v, rounds, p->rbits - p->lbits);
}

/* Narrow halves (lbits ≤ PD_VP_SMALL_LBITS): one 32-bit multiplier Y stands in for M0. For every
 * s0 < 2^lbits, t = Y·s0 mod 2^32 holds both parts of M0·s0 a round reads: its low lbits bits are
 * M0·s0's (Y ≡ M0 mod 2^lbits), and its top lbits bits are M0·s0's bits 32 to 32 + lbits (Y's other
 * bits are M0's bits lbits to 32, so Y·s0 is M0·s0 / 2^lbits mod 2^32 but for what the low bits add,
 * which for this M0 never carries into the top lbits: checked for every s0 and lbits 3 to 8 by
 * tests/unit/test_perm.c; at 9 some s0 carries). So a round on windows of b ≤ 17 bits costs one
 * 32x32-bit multiply instead of a 32x32→64 one and a multiply-add (the GPU's sharded walk). */
#define PD_VP_SMALL_LBITS 8
PD_STATIC_INLINE uint32_t pd__vp_small_mult(uint32_t lbits)
{
    const uint32_t lmask = (UINT32_C(1) << lbits) - 1;
    return ((uint32_t)(PD_VP_M0 >> lbits) & ~lmask) | ((uint32_t)PD_VP_M0 & lmask);
}

/* The same with the round's lo shifted left by d = rbits − lbits (0 or 1), as an odd b's round uses
 * it: Y_d·s0 mod 2^32 holds lo·2^d in its low lbits + d bits (bit 0 is 0 when d = 1) and M0·s0's bits
 * 32 to 32 + lbits still at its top. For d = 1, Y_1 is twice a multiplier whose product holds the high
 * part one bit lower (M0's bits lbits + 1 upward, less 2^lbits: at lbits = 8 the plain choice lets
 * the low product carry in, checked like pd__vp_small_mult's). */
PD_STATIC_INLINE uint32_t pd__vp_small_mult_d(uint32_t lbits, uint32_t d)
{
    const uint32_t lmask = (UINT32_C(1) << lbits) - 1;
    if (!d)
        return pd__vp_small_mult(lbits);
    const uint32_t z = (uint32_t)(PD_VP_M0 >> (lbits + 1)) - (UINT32_C(1) << lbits);
    return ((z & ~lmask) | ((uint32_t)PD_VP_M0 & lmask)) << 1;
}

/* Inverse of pd__vphilox. A round keeps the low lbits of M0·s0 in s1, and
 * M0 is odd, so s0 comes back by multiplying with M0⁻¹ mod 2^lbits. */
PD_STATIC_INLINE uint64_t pd__vphilox_inv(const pd_perm *p, uint64_t v, int rounds)
{
    const uint32_t d = p->rbits - p->lbits;
    const uint32_t dmask = (UINT32_C(1) << d) - 1;
    uint32_t s0 = (uint32_t)(v >> p->rbits);
    uint32_t s1 = (uint32_t)v & p->rmask;
    for (int i = rounds - 1; i >= 0; i--) {
        uint32_t prev0 = (uint32_t)((uint64_t)(s1 >> d) * PD_VP_M0_INV) & p->lmask;
        uint32_t hi = (uint32_t)((PD_VP_M0 * prev0) >> 32);
        uint32_t prev1 = ((s1 & dmask) << p->lbits) | ((s0 ^ hi ^ p->keys.k[i]) & p->lmask);
        s0 = prev0;
        s1 = prev1;
    }
    return ((uint64_t)s0 << p->rbits) | s1;
}

/* f = VariablePhilox composed with the key-chosen transposition (0 1). */
PD_STATIC_INLINE uint64_t pd__f_d(const pd_perm *p, uint64_t v, int rounds, int parity, uint32_t d)
{
    uint64_t w = pd__vphilox_d(p, v, rounds, d);
    return w ^ (uint64_t)((uint32_t)parity & p->keys.flip & (uint32_t)(w < 2));
}

PD_STATIC_INLINE uint64_t pd__f(const pd_perm *p, uint64_t v, int rounds, int parity)
{
    return pd__f_d(p, v, rounds, parity, p->rbits - p->lbits);
}

PD_STATIC_INLINE uint64_t pd__f_inv(const pd_perm *p, uint64_t w, int rounds, int parity)
{
    w ^= (uint64_t)((uint32_t)parity & p->keys.flip & (uint32_t)(w < 2));
    return pd__vphilox_inv(p, w, rounds);
}

/* Cycle walk: apply f until the value falls inside [0, n). */
PD_STATIC_INLINE uint64_t pd__sigma(const pd_perm *p, uint64_t pos, int rounds, int parity)
{
    if (p->n == 1)
        return 0;
    uint64_t v = pd__f(p, pos, rounds, parity);
    while (v >= p->n)
        v = pd__f(p, v, rounds, parity);
    return v;
}

PD_STATIC_INLINE uint64_t pd__sigma_inv(const pd_perm *p, uint64_t sample, int rounds, int parity)
{
    if (p->n == 1)
        return 0;
    uint64_t v = pd__f_inv(p, sample, rounds, parity);
    while (v >= p->n)
        v = pd__f_inv(p, v, rounds, parity);
    return v;
}

/* σ(pos) for pos < n: the sample id at global position pos. */
PD_STATIC_INLINE uint64_t pd_perm_at(const pd_perm *p, uint64_t pos)
{
    return pd__sigma(p, pos, PD_ROUNDS, 1);
}

/* σ⁻¹(sample) for sample < n: the global position of a sample. */
PD_STATIC_INLINE uint64_t pd_perm_inv(const pd_perm *p, uint64_t sample)
{
    return pd__sigma_inv(p, sample, PD_ROUNDS, 1);
}

#ifdef __cplusplus
}
#endif

#endif
