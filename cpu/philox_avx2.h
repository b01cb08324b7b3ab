/* Philox4x32-10 on 8 lanes of AVX2 (core/philox.h's, one counter per lane, one key): for files compiled with -mavx2. */
#ifndef PD_CPU_PHILOX_AVX2_H
#define PD_CPU_PHILOX_AVX2_H

#include <immintrin.h>

#include "core/philox.h"

/* hi and lo 32 bits of c·m per lane (m: the multiplier in every lane). */
static inline __attribute__((always_inline)) void pd__mulhilo_avx2(__m256i c, __m256i m, __m256i *hi, __m256i *lo)
{
    const __m256i e = _mm256_mul_epu32(c, m);
    const __m256i o = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(e, 32), o, 0xAA);
    *lo = _mm256_mullo_epi32(c, m);
}

/* c = philox4x32_10(c, (k0, k1)) in each of the 8 lanes (c[w]: counter word w of every lane). */
static inline __attribute__((always_inline)) void pd__philox8_avx2(__m256i c[4], uint32_t k0, uint32_t k1)
{
    const __m256i m0 = _mm256_set1_epi32((int)PD_PHILOX_M0), m1 = _mm256_set1_epi32((int)PD_PHILOX_M1);
    for (int r = 0; r < 10; r++) {
        if (r > 0) { /* Random123 bumps the key between rounds, not before the first */
            k0 += PD_PHILOX_W0;
            k1 += PD_PHILOX_W1;
        }
        __m256i hi0, lo0, hi1, lo1;
        pd__mulhilo_avx2(c[0], m0, &hi0, &lo0);
        pd__mulhilo_avx2(c[2], m1, &hi1, &lo1);
        c[0] = _mm256_xor_si256(_mm256_xor_si256(hi1, c[1]), _mm256_set1_epi32((int)k0));
        c[2] = _mm256_xor_si256(_mm256_xor_si256(hi0, c[3]), _mm256_set1_epi32((int)k1));
        c[1] = lo1;
        c[3] = lo0;
    }
}

#endif
