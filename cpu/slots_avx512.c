/* The sharded ids' slot lookup on AVX-512F: 16 window samples per vector, a branchless binary search of the window's slot table held in registers (or gathered). */
#include "cpu/kernel.h"

#ifdef PD_CPU_AVX512_EMULATED /* tests on CPUs without AVX-512: see avx512_emu.h */
#include "cpu/avx512_emu.h"
#else
#include <immintrin.h>
#endif

/*
 * cpu/shards.c computes a piece of a window run's samples u = τ_w(v) and hands them here with
 * the window's slot table (pd__slots, kernel.h). Each lane finds the last slot i with
 * rel[i] ≤ u in log2(size) steps (i += step where rel[i + step] ≤ u, step halving), then adds
 * the slot's offset: id = u + add[i], add split in 32-bit halves so that every table is read
 * the same way. A table of up to 64 slots lives in four registers and a read is a vpermd
 * (≤ 16), a vpermt2d (≤ 32) or two and a blend (≤ 64): a few cycles, where a vpgatherdd costs
 * tens on the CPUs measured (bench/results/shards.md). Larger tables are gathered from L1.
 */

#define PD_AI static inline __attribute__((always_inline))
#define VW 16

/* Up to 64 table values in registers; regs = 0: read from memory by gathers. */
typedef struct tab {
    __m512i r[4];
    const uint32_t *mem;
} tab;

PD_AI tab tab_load(const uint32_t *mem, const int regs)
{
    tab t = {.mem = mem};
    for (int k = 0; k < 4; k++)
        t.r[k] = k < regs ? _mm512_loadu_si512(mem + VW * k) : _mm512_setzero_si512();
    return t;
}

PD_AI __m512i tab_get(const tab *t, __m512i i, const int regs)
{
    if (regs == 0)
        return _mm512_i32gather_epi32(i, (const void *)t->mem, 4);
    if (regs == 1)
        return _mm512_permutexvar_epi32(i, t->r[0]);
    const __m512i a = _mm512_permutex2var_epi32(t->r[0], i, t->r[1]);
    if (regs == 2)
        return a;
    const __m512i b = _mm512_permutex2var_epi32(t->r[2], i, t->r[3]);
    return _mm512_mask_blend_epi32(_mm512_test_epi32_mask(i, _mm512_set1_epi32(32)), a, b);
}

/* 64-bit lanes of (lo, hi) pairs, in the order of 16 lanes q: the 8 ids of q = 0-7 or 8-15, or
 * reversed (q = 15-8, 7-0): unpack puts q = 4k, 4k+1 in `l` and 4k+2, 4k+3 in `h`. */
static const int64_t pd_order[4][8] = {
    {0, 1, 8, 9, 2, 3, 10, 11},   /* q = 0..7 */
    {4, 5, 12, 13, 6, 7, 14, 15}, /* q = 8..15 */
    {15, 14, 7, 6, 13, 12, 5, 4}, /* q = 15..8 */
    {11, 10, 3, 2, 9, 8, 1, 0},   /* q = 7..0 */
};

PD_AI void map(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, const unsigned width, int reverse,
               const int regs)
{
    const tab rel = tab_load(t->rel, regs), lo = tab_load(t->add_lo, regs);
    const tab hi = tab_load(width == 8 ? t->add_hi : t->add_lo, regs);
    const __m512i two = _mm512_set1_epi32(2), flip = _mm512_set1_epi32((int)t->flip);
    const __m512i rev32 = _mm512_set_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i o0 = _mm512_loadu_si512(pd_order[reverse ? 2 : 0]), o1 = _mm512_loadu_si512(pd_order[reverse ? 3 : 1]);
    uint64_t j = 0;
    for (; j < count; j += VW) {
        /* the last vector's lanes past count: loaded as 0, and not stored (masked stores do not fault) */
        const __mmask16 m = count - j >= VW ? (__mmask16)0xFFFF : (__mmask16)((1u << (count - j)) - 1);
        __m512i v = _mm512_maskz_loadu_epi32(m, u + j);
        v = _mm512_mask_xor_epi32(v, _mm512_cmplt_epu32_mask(v, two), v, flip);
        __m512i i = _mm512_setzero_si512();
        for (uint32_t step = t->size / 2; step; step /= 2) {
            const __m512i c = _mm512_add_epi32(i, _mm512_set1_epi32((int)step));
            i = _mm512_mask_mov_epi32(i, _mm512_cmple_epu32_mask(tab_get(&rel, c, regs), v), c);
        }
        const __m512i sum = _mm512_add_epi32(v, tab_get(&lo, i, regs));
        if (width == 4) {
            if (reverse) /* lane k holds q = 15 − k */
                _mm512_mask_storeu_epi32((uint32_t *)out - j - 15, (__mmask16)(m << (VW - 1 - (31 - __builtin_clz((unsigned)m)))),
                                         _mm512_permutexvar_epi32(rev32, sum));
            else
                _mm512_mask_storeu_epi32((uint32_t *)out + j, m, sum);
            continue;
        }
        /* the high half takes the carry of the low one */
        const __m512i a = tab_get(&hi, i, regs);
        const __m512i top = _mm512_mask_add_epi32(a, _mm512_cmplt_epu32_mask(sum, v), a, _mm512_set1_epi32(1));
        const __m512i l = _mm512_unpacklo_epi32(sum, top), h = _mm512_unpackhi_epi32(sum, top);
        uint64_t *o = reverse ? (uint64_t *)out - j - 15 : (uint64_t *)out + j;
        const __mmask16 sm = reverse ? (__mmask16)(m << (VW - 1 - (31 - __builtin_clz((unsigned)m)))) : m;
        _mm512_mask_storeu_epi64(o, (__mmask8)sm, _mm512_permutex2var_epi64(l, o0, h));
        _mm512_mask_storeu_epi64(o + 8, (__mmask8)(sm >> 8), _mm512_permutex2var_epi64(l, o1, h));
    }
}

typedef void map_fn(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, int reverse);

#define PD_SLOTS_INSTANCES(regs)                                                                             \
    static void map4_##regs(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, int reverse) \
    {                                                                                                    \
        map(t, u, count, out, 4, reverse, regs);                                                         \
    }                                                                                                    \
    static void map8_##regs(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, int reverse) \
    {                                                                                                    \
        map(t, u, count, out, 8, reverse, regs);                                                         \
    }
PD_SLOTS_INSTANCES(0)
PD_SLOTS_INSTANCES(1)
PD_SLOTS_INSTANCES(2)
PD_SLOTS_INSTANCES(4)

void pd__slots_map_avx512(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, unsigned width,
                          int reverse)
{
    static map_fn *const by_regs[2][4] = {{map4_0, map4_1, map4_2, map4_4}, {map8_0, map8_1, map8_2, map8_4}};
    const int k = t->size <= 16 ? 1 : t->size <= 32 ? 2 : t->size <= 64 ? 3 : 0;
    by_regs[width == 8][k](t, u, count, out, reverse);
}

/* cpu/shards.c's interleave of a step's staged ids (kernel.h, pd__interleave_avx512), a tile of L columns at
 * a time (L = 64 / width lanes): the m rows' vectors are loaded once and become m output vectors.
 *
 * m a power of 2: a transpose by log2(m) perfect shuffles. Each pairs vector i with vector i + m/2 and
 * interleaves their lanes (vpermt2d: the low halves, then the high halves), m vpermt2d a pass, log2(m)/L a
 * column. Any other m: output vector k takes lane e from row (kL + e) mod m at column (kL + e) / m, one
 * masked vpermd (vpermq) per row, m/L a column. */
PD_AI void shuffle_tile(__m512i *x, const unsigned m, const unsigned width)
{
    const __m512i lo = width == 4 ? _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0)
                                  : _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
    const __m512i hi = width == 4 ? _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8)
                                  : _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
    for (unsigned pass = 1; pass < m; pass *= 2) {
        __m512i y[16];
#pragma GCC unroll 16
        for (unsigned i = 0; i < m / 2; i++) {
            y[2 * i] = width == 4 ? _mm512_permutex2var_epi32(x[i], lo, x[i + m / 2])
                                  : _mm512_permutex2var_epi64(x[i], lo, x[i + m / 2]);
            y[2 * i + 1] = width == 4 ? _mm512_permutex2var_epi32(x[i], hi, x[i + m / 2])
                                      : _mm512_permutex2var_epi64(x[i], hi, x[i + m / 2]);
        }
#pragma GCC unroll 16
        for (unsigned i = 0; i < m; i++)
            x[i] = y[i];
    }
}

PD_AI uint64_t interleave_pow2(const void *stage, uint64_t step, uint64_t full, void *out, const unsigned m,
                               const unsigned width)
{
    const unsigned L = 64 / width;
    uint64_t t = 0;
    for (; t + L <= full; t += L) {
        __m512i x[16];
#pragma GCC unroll 16
        for (unsigned c = 0; c < m; c++)
            x[c] = _mm512_loadu_si512((const char *)stage + (c * step + t) * width);
        shuffle_tile(x, m, width);
        char *o = (char *)out + t * m * width;
#pragma GCC unroll 16
        for (unsigned k = 0; k < m; k++)
            _mm512_storeu_si512(o + k * 64, x[k]);
    }
    return t;
}

PD_AI uint64_t interleave_any(const void *stage, uint64_t step, unsigned m, uint64_t full, void *out,
                              const unsigned width)
{
    const unsigned L = 64 / width;
    __m512i col[16];
    __mmask16 mask[16][16];
    for (unsigned k = 0; k < m; k++) {
        uint32_t c32[16];
        uint64_t c64[8];
        for (unsigned c = 0; c < m; c++)
            mask[k][c] = 0;
        for (unsigned e = 0; e < L; e++) {
            const unsigned o = k * L + e;
            mask[k][o % m] |= (__mmask16)(1u << e);
            c32[e] = o / m;
            c64[e % 8] = o / m;
        }
        col[k] = width == 4 ? _mm512_loadu_si512(c32) : _mm512_loadu_si512(c64);
    }
    uint64_t t = 0;
    for (; t + L <= full; t += L) {
        __m512i row[16];
        for (unsigned c = 0; c < m; c++)
            row[c] = _mm512_loadu_si512((const char *)stage + (c * step + t) * width);
        char *o = (char *)out + t * m * width;
        for (unsigned k = 0; k < m; k++) {
            __m512i v = _mm512_setzero_si512();
            for (unsigned c = 0; c < m; c++)
                v = width == 4 ? _mm512_mask_permutexvar_epi32(v, mask[k][c], col[k], row[c])
                               : _mm512_mask_permutexvar_epi64(v, (__mmask8)mask[k][c], col[k], row[c]);
            _mm512_storeu_si512(o + k * 64, v);
        }
    }
    return t;
}

PD__INTERLEAVE_POW2_OF

uint64_t pd__interleave_avx512(const void *stage, uint64_t step, unsigned m, uint64_t full, void *out,
                               unsigned width)
{
    if (m & (m - 1))
        return width == 4 ? interleave_any(stage, step, m, full, out, 4) : interleave_any(stage, step, m, full, out, 8);
    return interleave_pow2_of(stage, step, m, full, out, width);
}
