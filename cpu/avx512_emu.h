/* Tests only: SIMDe's portable AVX-512 intrinsics, plus the few SIMDe 0.7 lacks, so kernel_avx512.c can be checked on CPUs without AVX-512. */
#ifndef PD_CPU_AVX512_EMU_H
#define PD_CPU_AVX512_EMU_H

/* With native aliases, SIMDe defines _mm512_* and __m512i as portable C (or
 * AVX2) code when the compiler is not targeting AVX-512. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <stdint.h>
#include <string.h>

typedef simde__mmask16 __mmask16;
typedef simde__mmask32 __mmask32;
typedef simde__mmask64 __mmask64;
typedef simde__mmask8 __mmask8;
#define _MM_PERM_DDBB 0xF5

/* The rest follow the pseudocode of Intel's intrinsics guide, lane by lane. */

static inline __m512i pd_emu_mask_shuffle_epi32(__m512i src, __mmask16 k, __m512i a, int imm)
{
    uint32_t s[16], x[16], r[16];
    _mm512_storeu_si512(s, src);
    _mm512_storeu_si512(x, a);
    for (int j = 0; j < 16; j++) /* each 128-bit lane picks its dwords by imm's 2-bit fields */
        r[j] = (k >> j) & 1 ? x[(j & ~3) + ((imm >> (2 * (j & 3))) & 3)] : s[j];
    return _mm512_loadu_si512(r);
}

static inline __m512i pd_emu_maskz_expand_epi32(__mmask16 k, __m512i a)
{
    uint32_t x[16], r[16];
    int m = 0;
    _mm512_storeu_si512(x, a);
    for (int j = 0; j < 16; j++) /* consecutive elements of a go to the set lanes, in order */
        r[j] = (k >> j) & 1 ? x[m++] : 0;
    return _mm512_loadu_si512(r);
}

static inline __m512i pd_emu_i32gather_epi32(__m512i idx, const void *base, int scale)
{
    int32_t x[16];
    uint32_t r[16];
    _mm512_storeu_si512(x, idx);
    for (int j = 0; j < 16; j++)
        memcpy(&r[j], (const char *)base + (int64_t)x[j] * scale, 4);
    return _mm512_loadu_si512(r);
}

static inline __m512i pd_emu_i32gather_epi64(__m256i idx, const void *base, int scale)
{
    int32_t x[8];
    uint64_t r[8];
    _mm256_storeu_si256((__m256i *)x, idx);
    for (int j = 0; j < 8; j++)
        memcpy(&r[j], (const char *)base + (int64_t)x[j] * scale, 8);
    return _mm512_loadu_si512(r);
}

/* Zero-extending conversions: n lanes of in_t (a vector of vt) to n lanes of out_t. */
#define PD_EMU_WIDEN(name, vt, store, in_t, out_t, n)                                                              \
    static inline __m512i pd_emu_##name(vt a)                                                                     \
    {                                                                                                              \
        in_t x[n];                                                                                                 \
        out_t r[n];                                                                                                \
        store((vt *)x, a);                                                                                         \
        for (int j = 0; j < n; j++)                                                                                \
            r[j] = x[j];                                                                                           \
        return _mm512_loadu_si512(r);                                                                              \
    }
PD_EMU_WIDEN(cvtepu32_epi64, __m256i, _mm256_storeu_si256, uint32_t, uint64_t, 8)
PD_EMU_WIDEN(cvtepu8_epi32, __m128i, _mm_storeu_si128, uint8_t, uint32_t, 16)
PD_EMU_WIDEN(cvtepu8_epi16, __m256i, _mm256_storeu_si256, uint8_t, uint16_t, 32)
PD_EMU_WIDEN(cvtepu16_epi32, __m256i, _mm256_storeu_si256, uint16_t, uint32_t, 16)

static inline __m128i pd_emu_cvtepi32_epi8(__m512i a)
{
    uint32_t x[16];
    uint8_t r[16];
    _mm512_storeu_si512(x, a);
    for (int j = 0; j < 16; j++) /* each dword's low byte (truncation) */
        r[j] = (uint8_t)x[j];
    return _mm_loadu_si128((const __m128i *)r);
}

static inline __m512i pd_emu_mulhi_epu16(__m512i a, __m512i b)
{
    uint16_t x[32], y[32], r[32];
    _mm512_storeu_si512(x, a);
    _mm512_storeu_si512(y, b);
    for (int j = 0; j < 32; j++) /* the high 16 bits of each unsigned 32-bit product */
        r[j] = (uint16_t)(((uint32_t)x[j] * y[j]) >> 16);
    return _mm512_loadu_si512(r);
}

static inline void pd_emu_mask_storeu_epi32(void *p, __mmask16 k, __m512i a)
{
    uint32_t x[16];
    _mm512_storeu_si512(x, a);
    for (int j = 0; j < 16; j++) /* unselected lanes are not touched */
        if ((k >> j) & 1)
            memcpy((char *)p + 4 * j, &x[j], 4);
}

static inline void pd_emu_mask_storeu_epi64(void *p, __mmask8 k, __m512i a)
{
    uint64_t x[8];
    _mm512_storeu_si512(x, a);
    for (int j = 0; j < 8; j++) /* unselected lanes are not touched */
        if ((k >> j) & 1)
            memcpy((char *)p + 8 * j, &x[j], 8);
}

static inline __m512i pd_emu_maskz_loadu_epi32(__mmask16 k, const void *p)
{
    uint32_t r[16];
    for (int j = 0; j < 16; j++) /* unselected lanes are not read */
        r[j] = 0;
    for (int j = 0; j < 16; j++)
        if ((k >> j) & 1)
            memcpy(&r[j], (const char *)p + 4 * j, 4);
    return _mm512_loadu_si512(r);
}

static inline __mmask32 pd_emu_test_epi16_mask(__m512i a, __m512i b)
{
    uint16_t x[32], y[32];
    uint32_t r = 0;
    _mm512_storeu_si512(x, a);
    _mm512_storeu_si512(y, b);
    for (int j = 0; j < 32; j++) /* SIMDe 0.7's shifts a signed 1 into bit 31 (UBSan) */
        r |= (uint32_t)((x[j] & y[j]) != 0) << j;
    return r;
}

/* Byte i: the 8 bits of qword i / 8 of b from bit a[i] mod 64 on, wrapping (SIMDe 0.7 shifts a u64 by 64 there). */
static inline __m512i pd_emu_multishift_epi64_epi8(__m512i a, __m512i b)
{
    uint8_t c[64], r[64];
    uint64_t x[8];
    _mm512_storeu_si512(c, a);
    _mm512_storeu_si512(x, b);
    for (int i = 0; i < 64; i++) {
        const unsigned s = c[i] & 63;
        r[i] = (uint8_t)(s ? x[i / 8] >> s | x[i / 8] << (64 - s) : x[i / 8]);
    }
    return _mm512_loadu_si512(r);
}

#define _mm512_mask_shuffle_epi32(src, k, a, imm) pd_emu_mask_shuffle_epi32(src, k, a, imm)
#define _mm512_maskz_expand_epi32(k, a) pd_emu_maskz_expand_epi32(k, a)
#define _mm512_cvtepu32_epi64(a) pd_emu_cvtepu32_epi64(a)
#define _mm512_cvtepu8_epi32(a) pd_emu_cvtepu8_epi32(a)
#define _mm512_cvtepu8_epi16(a) pd_emu_cvtepu8_epi16(a)
#define _mm512_cvtepu16_epi32(a) pd_emu_cvtepu16_epi32(a)
#define _mm512_cvtepi32_epi8(a) pd_emu_cvtepi32_epi8(a)
#define _mm512_mask_storeu_epi32(p, k, a) pd_emu_mask_storeu_epi32(p, k, a)
#define _mm512_mask_storeu_epi64(p, k, a) pd_emu_mask_storeu_epi64(p, k, a)
#define _mm512_maskz_loadu_epi32(k, p) pd_emu_maskz_loadu_epi32(k, p)
#define _mm512_mulhi_epu16(a, b) pd_emu_mulhi_epu16(a, b)
#undef _mm512_multishift_epi64_epi8
#define _mm512_multishift_epi64_epi8(a, b) pd_emu_multishift_epi64_epi8(a, b)
#undef _mm512_test_epi16_mask
#define _mm512_test_epi16_mask(a, b) pd_emu_test_epi16_mask(a, b)
#define _mm512_i32gather_epi32(idx, base, scale) pd_emu_i32gather_epi32(idx, base, scale)
#define _mm512_i32gather_epi64(idx, base, scale) pd_emu_i32gather_epi64(idx, base, scale)
#define _mm512_cmplt_epu32_mask(a, b) ((__mmask16)~_mm512_cmpge_epu32_mask(a, b))
#define _mm512_cmplt_epi32_mask(a, b) _mm512_cmpgt_epi32_mask(b, a)
#define _mm512_cmplt_epu16_mask(a, b) ((__mmask32)~_mm512_cmpge_epu16_mask(a, b))

#endif
