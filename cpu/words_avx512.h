/* VariablePhilox's round on 32 word lanes of AVX-512 (BW) for b ≤ 32, shared by the flat (kernel_avx512.c) and batch (batch_avx512.c) kernels. */
#ifndef PD_CPU_WORDS_AVX512_H
#define PD_CPU_WORDS_AVX512_H

/* Include after the intrinsics (<immintrin.h>, or avx512_emu.h in the emulated tests) and core/perm.h. */

/*
 * b ≤ 32, so both halves fit 16 bits, and a round reads only the low 16 bits of hi32(M0·s0) and of
 * lo32(M0·s0) << d. With M0's low word m_lo = A·2^16 + Bc and its high word's low 16 bits H (s0 < 2^16):
 *     lo16(hi32(M0·s0)) = lo16(H·s0) + hi16(A·s0) + carry(lo16(A·s0) + hi16(Bc·s0))   (mod 2^16)
 *     lo16(lo32(M0·s0) << d) = lo16((Bc << d)·s0)
 * Five 16-bit multiplies per 32 lanes, where 32-bit lanes take four per 16 (two vpmuludq, two vpmullw), on
 * the one port both use on Intel. For d = 1, s1 >> lbits is s1's bit lbits (s1 < 2^(lbits + 1) but for junk
 * above rbits, which that bit never sees): a test and a masked add (lo's bit 0 is 0); the caller masks s1 by
 * rmask once after the last round. The round's chain is ~12 cycles, so callers keep 4 word vectors in flight:
 * with 2, flat σ ran no faster than on 32-bit lanes (2-vCPU Xeon, 2026-11-27).
 */

/* One round on words s0, s1: k the round key's low 16 bits, lmask, mult = lo16(M0) << d and top = 2^lbits
 * (where d = 1; 0 where d = 0: nothing shifted in) per lane or broadcast; d: some lane has d = 1. */
static inline __attribute__((always_inline)) void pd__w16_round(__m512i *s0, __m512i *s1, __m512i k, __m512i lmask,
                                                               __m512i mult, __m512i top, const int d)
{
    const __m512i A = _mm512_set1_epi16((short)(uint16_t)(PD_VP_M0 >> 16));
    const __m512i Bc = _mm512_set1_epi16((short)(uint16_t)PD_VP_M0);
    const __m512i H = _mm512_set1_epi16((short)(uint16_t)(PD_VP_M0 >> 32));
    const __m512i one = _mm512_set1_epi16(1);
    const __m512i al = _mm512_mullo_epi16(*s0, A);
    const __m512i x = _mm512_add_epi16(al, _mm512_mulhi_epu16(*s0, Bc));
    __m512i hi = _mm512_add_epi16(_mm512_mulhi_epu16(*s0, A), _mm512_mullo_epi16(*s0, H));
    hi = _mm512_mask_add_epi16(hi, _mm512_cmplt_epu16_mask(x, al), hi, one); /* the carry */
    const __m512i lo = _mm512_mullo_epi16(*s0, mult);
    const __m512i n0 = _mm512_and_si512(_mm512_ternarylogic_epi32(hi, k, *s1, 0x96 /* a ^ b ^ c */), lmask);
    *s1 = d ? _mm512_mask_add_epi16(lo, _mm512_test_epi16_mask(*s1, top), lo, one) : lo;
    *s0 = n0;
}

/* Two vectors of u32 lanes below 2^16 as one of words (per 128-bit lane: a0's four, then a1's), and back. */
static inline __attribute__((always_inline)) __m512i pd__w16_pack(__m512i a0, __m512i a1)
{
    return _mm512_packus_epi32(a0, a1);
}

static inline __attribute__((always_inline)) void pd__w16_unpack(__m512i w, __m512i *a)
{
    a[0] = _mm512_unpacklo_epi16(w, _mm512_setzero_si512());
    a[1] = _mm512_unpackhi_epi16(w, _mm512_setzero_si512());
}

#endif
