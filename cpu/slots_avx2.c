/* The sharded ids' slot lookup on AVX2: 8 window samples per vector, a branchless binary search of the window's slot table held in registers (or gathered). */
#include "cpu/kernel.h"

#include <immintrin.h>

/* The method is slots_avx512.c's: the last slot i with rel[i] ≤ u, then id = u + add[i]. AVX2
 * compares only signed, so rel ≤ u is min(rel, u) = rel. A table of up to 32 slots is read
 * from four registers by vpermd and blends on the index's bits 3 and 4; one of up to 64 is
 * searched in two levels (map64); a larger one is gathered (vpgatherdd). */

#define PD_AI static inline __attribute__((always_inline))
#define VW 8

typedef struct tab {
    __m256i r[4];
    const uint32_t *mem;
} tab;

PD_AI tab tab_load(const uint32_t *mem, const int regs)
{
    tab t = {.mem = mem};
    for (int k = 0; k < 4; k++)
        t.r[k] = k < regs ? _mm256_loadu_si256((const __m256i *)(mem + VW * k)) : _mm256_setzero_si256();
    return t;
}

/* a where bit `bit` of i is clear, b where it is set (blendv looks at each lane's sign). */
PD_AI __m256i pick(__m256i a, __m256i b, __m256i i, const int bit)
{
    const __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(i, 31 - bit));
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), sel));
}

PD_AI __m256i tab_get(const tab *t, __m256i i, const int regs)
{
    if (regs == 0)
        return _mm256_i32gather_epi32((const int *)t->mem, i, 4);
    const __m256i a = _mm256_permutevar8x32_epi32(t->r[0], i);
    if (regs == 1)
        return a;
    const __m256i ab = pick(a, _mm256_permutevar8x32_epi32(t->r[1], i), i, 3);
    if (regs == 2)
        return ab;
    const __m256i cd = pick(_mm256_permutevar8x32_epi32(t->r[2], i), _mm256_permutevar8x32_epi32(t->r[3], i), i, 3);
    return pick(ab, cd, i, 4);
}

PD_AI __m256i le_u32(__m256i a, __m256i b)
{
    return _mm256_cmpeq_epi32(_mm256_min_epu32(a, b), a);
}

/* The ids u + (a_hi·2^32 + a_lo) of 8 lanes (u32: u + a_lo) at out[j..j+7], or reversed at out[-j-7..-j]. */
PD_AI void store(__m256i u, __m256i a_lo, __m256i a_hi, void *out, uint64_t j, const unsigned width, int reverse)
{
    const __m256i sum = _mm256_add_epi32(u, a_lo);
    if (width == 4) {
        if (reverse)
            _mm256_storeu_si256((__m256i *)((uint32_t *)out - j - 7),
                                _mm256_permutevar8x32_epi32(sum, _mm256_set_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        else
            _mm256_storeu_si256((__m256i *)((uint32_t *)out + j), sum);
        return;
    }
    /* the high half takes the carry of the low one (sum < u unsigned: -1, subtracted) */
    const __m256i sign = _mm256_set1_epi32(INT32_MIN);
    const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(u, sign), _mm256_xor_si256(sum, sign));
    const __m256i top = _mm256_sub_epi32(a_hi, carry);
    /* unpack: l = ids of lanes 0, 1, 4, 5; h = 2, 3, 6, 7 */
    const __m256i l = _mm256_unpacklo_epi32(sum, top), h = _mm256_unpackhi_epi32(sum, top);
    const __m256i first = _mm256_permute2x128_si256(l, h, 0x20), second = _mm256_permute2x128_si256(l, h, 0x31);
    if (reverse) {
        uint64_t *o = (uint64_t *)out - j - 7;
        _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(second, 0x1B));
        _mm256_storeu_si256((__m256i *)(o + 4), _mm256_permute4x64_epi64(first, 0x1B));
    } else {
        uint64_t *o = (uint64_t *)out + j;
        _mm256_storeu_si256((__m256i *)o, first);
        _mm256_storeu_si256((__m256i *)(o + 4), second);
    }
}

PD_AI void map(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, const unsigned width, int reverse,
               const int regs)
{
    const tab rel = tab_load(t->rel, regs), lo = tab_load(t->add_lo, regs);
    const tab hi = tab_load(width == 8 ? t->add_hi : t->add_lo, regs);
    const __m256i one = _mm256_set1_epi32(1), flip = _mm256_set1_epi32((int)t->flip);
    uint64_t j = 0;
    for (; j + VW <= count; j += VW) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(u + j));
        v = _mm256_xor_si256(v, _mm256_and_si256(le_u32(v, one), flip));
        __m256i i = _mm256_setzero_si256();
        for (uint32_t step = t->size / 2; step; step /= 2) {
            const __m256i c = _mm256_add_epi32(i, _mm256_set1_epi32((int)step));
            i = _mm256_blendv_epi8(i, c, le_u32(tab_get(&rel, c, regs), v));
        }
        store(v, tab_get(&lo, i, regs), width == 8 ? tab_get(&hi, i, regs) : v, out, j, width, reverse);
    }
    if (j < count)
        pd__slots_map_scalar(t, u + j, count - j, (char *)out + (reverse ? -(int64_t)j : (int64_t)j) * (int64_t)width,
                             width, reverse);
}

/* ---- 33 to 64 slots: eight blocks of eight, transposed so that column o holds entry o of every
 * block. The coarse search (three vpermd steps on column 0) finds the lane's block q; within it,
 * entry o ≤ u for every o up to the answer (the table is sorted), so seven compares of column o
 * at q pick the last one, carrying its offsets along, without a gather. */

typedef struct cols {
    __m256i c[8];
} cols;

/* Rows r_q = t[8q .. 8q + 7] → columns c_o[q] = t[8q + o]. */
static cols transpose(const uint32_t *t)
{
    __m256i r[8], a[8], b[8];
    cols out;
    for (int q = 0; q < 8; q++)
        r[q] = _mm256_loadu_si256((const __m256i *)(t + 8 * q));
    for (int q = 0; q < 8; q += 2) {
        a[q] = _mm256_unpacklo_epi32(r[q], r[q + 1]);
        a[q + 1] = _mm256_unpackhi_epi32(r[q], r[q + 1]);
    }
    for (int q = 0; q < 8; q += 4) {
        b[q] = _mm256_unpacklo_epi64(a[q], a[q + 2]);
        b[q + 1] = _mm256_unpackhi_epi64(a[q], a[q + 2]);
        b[q + 2] = _mm256_unpacklo_epi64(a[q + 1], a[q + 3]);
        b[q + 3] = _mm256_unpackhi_epi64(a[q + 1], a[q + 3]);
    }
    for (int o = 0; o < 4; o++) {
        out.c[o] = _mm256_permute2x128_si256(b[o], b[o + 4], 0x20);
        out.c[o + 4] = _mm256_permute2x128_si256(b[o], b[o + 4], 0x31);
    }
    return out;
}

PD_AI void map64(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, const unsigned width,
                 int reverse)
{
    const cols rel = transpose(t->rel), lo = transpose(t->add_lo), hi = width == 8 ? transpose(t->add_hi) : lo;
    const __m256i one = _mm256_set1_epi32(1), flip = _mm256_set1_epi32((int)t->flip);
    uint64_t j = 0;
    for (; j + VW <= count; j += VW) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(u + j));
        v = _mm256_xor_si256(v, _mm256_and_si256(le_u32(v, one), flip));
        __m256i q = _mm256_setzero_si256();
        for (int step = 4; step; step /= 2) {
            const __m256i c = _mm256_add_epi32(q, _mm256_set1_epi32(step));
            q = _mm256_blendv_epi8(q, c, le_u32(_mm256_permutevar8x32_epi32(rel.c[0], c), v));
        }
        __m256i a = _mm256_permutevar8x32_epi32(lo.c[0], q), b = _mm256_permutevar8x32_epi32(hi.c[0], q);
        for (int o = 1; o < 8; o++) {
            const __m256i m = le_u32(_mm256_permutevar8x32_epi32(rel.c[o], q), v);
            a = _mm256_blendv_epi8(a, _mm256_permutevar8x32_epi32(lo.c[o], q), m);
            if (width == 8)
                b = _mm256_blendv_epi8(b, _mm256_permutevar8x32_epi32(hi.c[o], q), m);
        }
        store(v, a, b, out, j, width, reverse);
    }
    if (j < count)
        pd__slots_map_scalar(t, u + j, count - j, (char *)out + (reverse ? -(int64_t)j : (int64_t)j) * (int64_t)width,
                             width, reverse);
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

static void map4_64(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, int reverse)
{
    map64(t, u, count, out, 4, reverse);
}

static void map8_64(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, int reverse)
{
    map64(t, u, count, out, 8, reverse);
}

void pd__slots_map_avx2(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, unsigned width,
                        int reverse)
{
    static map_fn *const by_size[2][5] = {{map4_0, map4_1, map4_2, map4_4, map4_64},
                                          {map8_0, map8_1, map8_2, map8_4, map8_64}};
    const int k = t->size <= 8 ? 1 : t->size <= 16 ? 2 : t->size <= 32 ? 3 : t->size <= 64 ? 4 : 0;
    by_size[width == 8][k](t, u, count, out, reverse);
}

/* cpu/shards.c's interleave (kernel.h, pd__interleave_avx2) for m a power of 2, as slots_avx512.c's: a tile of
 * L = 32 / width columns, log2(m) perfect shuffles of its m row vectors. A shuffle of two vectors is an
 * unpack of each 128-bit lane's low and high halves and two vperm2i128 that put the lanes in order. */
PD_AI void zip(__m256i a, __m256i b, __m256i *lo, __m256i *hi, const unsigned width)
{
    const __m256i l = width == 4 ? _mm256_unpacklo_epi32(a, b) : _mm256_unpacklo_epi64(a, b);
    const __m256i h = width == 4 ? _mm256_unpackhi_epi32(a, b) : _mm256_unpackhi_epi64(a, b);
    *lo = _mm256_permute2x128_si256(l, h, 0x20);
    *hi = _mm256_permute2x128_si256(l, h, 0x31);
}

PD_AI uint64_t interleave_pow2(const void *stage, uint64_t step, uint64_t full, void *out, const unsigned m,
                               const unsigned width)
{
    const unsigned L = 32 / width;
    uint64_t t = 0;
    for (; t + L <= full; t += L) {
        __m256i x[16], y[16];
#pragma GCC unroll 16
        for (unsigned c = 0; c < m; c++)
            x[c] = _mm256_loadu_si256((const __m256i *)((const char *)stage + (c * step + t) * width));
        for (unsigned pass = 1; pass < m; pass *= 2) {
#pragma GCC unroll 16
            for (unsigned i = 0; i < m / 2; i++)
                zip(x[i], x[i + m / 2], &y[2 * i], &y[2 * i + 1], width);
#pragma GCC unroll 16
            for (unsigned i = 0; i < m; i++)
                x[i] = y[i];
        }
        char *o = (char *)out + t * m * width;
#pragma GCC unroll 16
        for (unsigned k = 0; k < m; k++)
            _mm256_storeu_si256((__m256i *)(o + k * 32), x[k]);
    }
    return t;
}

PD__INTERLEAVE_POW2_OF

uint64_t pd__interleave_avx2(const void *stage, uint64_t step, unsigned m, uint64_t full, void *out, unsigned width)
{
    return interleave_pow2_of(stage, step, m, full, out, width); /* other m: the caller's loop */
}
