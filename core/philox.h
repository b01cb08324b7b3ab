/* Philox4x32-10 (Salmon et al., Random123): the counter-based generator behind permd's key schedule. */
#ifndef PD_PHILOX_H
#define PD_PHILOX_H

#include "defs.h"

#define PD_PHILOX_M0 UINT32_C(0xD2511F53)
#define PD_PHILOX_M1 UINT32_C(0xCD9E8D57)
#define PD_PHILOX_W0 UINT32_C(0x9E3779B9)
#define PD_PHILOX_W1 UINT32_C(0xBB67AE85)

/* out = philox4x32_10(ctr, key). out may alias ctr. Pure; callable from CUDA. */
PD_STATIC_INLINE void pd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) { /* Random123 bumps the key between rounds, not before the first */
            k0 += PD_PHILOX_W0;
            k1 += PD_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PD_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PD_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

#endif
