/* Mixture block groups on AVX2: every slot of 8 blocks' π_β at once, a byte per slot, the round function a pshufb. */
#include "cpu/kernel.h"
#include "cpu/philox_avx2.h"

#include <immintrin.h>

/*
 * π_β is v1's f on b = log2 B ≤ 8 bits (mixtures-v1 §2, §5). A round of VariablePhilox reads its left
 * half s0 (lbits ≤ 4 bits) only through M0·s0, so with v = s0·2^rbits + s1 (d = rbits − lbits)
 *
 *     v' = TT[s0] ^ (((s1 ^ k_i) & lmask) << rbits) ^ (d ? s1 >> lbits : 0),
 *     TT[s0] = (hi32(M0·s0) & lmask) << rbits | (lo32(M0·s0) << d) & rmask,
 *
 * TT having 2^lbits ≤ 16 entries: one pshufb per 32 slots. Register j holds slots 4j … 4j + 3 of each of the
 * 8 blocks (pd__block_group_at), so round i's keys are one register for all B/4 of them, built from the 8
 * blocks' Philox outputs computed side by side. About 7 vector operations per slot-round, no multiply.
 */

#define PD_AI static inline __attribute__((always_inline))
#define NV 8 /* registers in flight: independent rounds hide each other's latency (16 ymm in all) */

/* NV registers of slots through the 24 rounds and the blocks' transposition of 0 and 1. */
PD_AI void rounds(__m256i *v, const __m256i keys[PD_ROUNDS], __m256i flip, __m256i tt, __m128i rb, __m128i lb,
                  __m256i lmask, const int d)
{
    const __m256i one = _mm256_set1_epi8(1);
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int j = 0; j < NV; j++) {
            /* 16-bit shifts: bits crossing from the next byte land above lbits (b ≤ 8) and are masked off */
            const __m256i s0 = _mm256_and_si256(_mm256_srl_epi16(v[j], rb), lmask);
            const __m256i low = _mm256_sll_epi16(_mm256_and_si256(_mm256_xor_si256(v[j], keys[i]), lmask), rb);
            __m256i next = _mm256_xor_si256(_mm256_shuffle_epi8(tt, s0), low);
            if (d)
                next = _mm256_xor_si256(next, _mm256_and_si256(_mm256_srl_epi16(v[j], lb), one));
            v[j] = next;
        }
    }
    for (int j = 0; j < NV; j++) {
        const __m256i low2 = _mm256_cmpeq_epi8(_mm256_andnot_si256(one, v[j]), _mm256_setzero_si256()); /* v < 2 */
        v[j] = _mm256_xor_si256(v[j], _mm256_and_si256(low2, flip));
    }
}

static void rounds_d0(__m256i *v, const __m256i keys[PD_ROUNDS], __m256i flip, __m256i tt, __m128i rb, __m128i lb,
                      __m256i lmask)
{
    rounds(v, keys, flip, tt, rb, lb, lmask, 0);
}

static void rounds_d1(__m256i *v, const __m256i keys[PD_ROUNDS], __m256i flip, __m256i tt, __m128i rb, __m128i lb,
                      __m256i lmask)
{
    rounds(v, keys, flip, tt, rb, lb, lmask, 1);
}

/* Bits [at, at + 5) of each lane's 128-bit Philox output x (pd__mix_block_keys), spread to the lane's 4 bytes. */
PD_AI __m256i packed_key(const __m256i x[4], unsigned at, __m256i spread)
{
    const unsigned w = at / 32, off = at % 32;
    __m256i v = _mm256_srl_epi32(x[w], _mm_cvtsi32_si128((int)off));
    if (off > 27)
        v = _mm256_or_si256(v, _mm256_sll_epi32(x[w + 1], _mm_cvtsi32_si128((int)(32 - off))));
    return _mm256_shuffle_epi8(_mm256_and_si256(v, _mm256_set1_epi32(31)), spread);
}

void pd__block_group_avx2(const pd__block_group *t)
{
    pd_perm shape;
    pd__perm_shape(&shape, t->block, PD_MIN_BITS);
    uint8_t tt[32];
    for (uint32_t s0 = 0; s0 < 16; s0++) {
        const uint64_t prod = PD_VP_M0 * (s0 & shape.lmask);
        const uint32_t hi = (uint32_t)(prod >> 32), lo = (uint32_t)prod;
        tt[s0] = tt[16 + s0] =
            (uint8_t)(((hi & shape.lmask) << shape.rbits) | ((lo << (shape.rbits - shape.lbits)) & shape.rmask));
    }
    /* the 8 blocks' keys: counter (8, 0, β lo, β hi) per lane */
    const __m256i beta_lo = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)t->first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_set1_epi32((int)(uint32_t)t->first), _mm256_set1_epi32(INT32_MIN)),
                                             _mm256_xor_si256(beta_lo, _mm256_set1_epi32(INT32_MIN))); /* the low word wrapped */
    __m256i x[4] = {_mm256_set1_epi32((int)PD_MIX_CTR_BLOCK), _mm256_setzero_si256(), beta_lo,
                    _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(t->first >> 32)), carry)};
    pd__philox8_avx2(x, (uint32_t)t->seed, (uint32_t)(t->seed >> 32));
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4,
                                            8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i lmask = _mm256_set1_epi8((char)shape.lmask);
    __m256i keys[PD_ROUNDS];
    for (unsigned i = 0; i < PD_ROUNDS; i++) /* k_i's low lbits: xored into s1's before the shift */
        keys[i] = _mm256_and_si256(packed_key(x, 5 * i, spread), lmask);
    const __m256i flip = _mm256_shuffle_epi8(_mm256_and_si256(_mm256_srli_epi32(x[3], 24), _mm256_set1_epi32(1)), spread);
    const __m256i table = _mm256_loadu_si256((const __m256i *)tt);
    const __m128i rb = _mm_cvtsi32_si128((int)shape.rbits), lb = _mm_cvtsi32_si128((int)shape.lbits);
    const __m256i quad = _mm256_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1,
                                          2, 3, 0, 1, 2, 3);
    for (uint32_t j0 = 0; j0 < t->block / 4; j0 += NV) {
        __m256i v[NV];
        for (uint32_t j = 0; j < NV; j++)
            v[j] = _mm256_add_epi8(quad, _mm256_set1_epi8((char)(4 * (j0 + j))));
        (shape.rbits != shape.lbits ? rounds_d1 : rounds_d0)(v, keys, flip, table, rb, lb, lmask);
        for (uint32_t j = 0; j < NV; j++)
            _mm256_storeu_si256((__m256i *)(t->out + 32 * (j0 + j)), v[j]);
    }
}
