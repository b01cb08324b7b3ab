/* A mixture's chunks on AVX2 (cpu/mix.c): the weight tree's counts at a segment's blocks, a segment's reads' components and draws, and one component's reads picked out of a chunk. */
#include "cpu/kernel.h"

#include <immintrin.h>

/* Each 8 reads: compare their components with j, then store the matching reads' indices packed to the front by
 * one vpermd (pd__avx2_compress_pattern). idx may take 8 entries past the count: n ≥ count + 8 there, since a
 * vector is stored only while 8 reads are left to compare. */
uint64_t pd__group_reads_avx2(const uint32_t *comp, uint64_t n, uint32_t j, uint32_t *idx)
{
    const __m256i want = _mm256_set1_epi32((int)j), step = _mm256_set1_epi32(8);
    __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    uint64_t k = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)(comp + i));
        const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, want)));
        const __m256i pack = pd__avx2_compress_pattern(m);
        _mm256_storeu_si256((__m256i *)(idx + k), _mm256_permutevar8x32_epi32(at, pack));
        k += (uint64_t)__builtin_popcount(m);
        at = _mm256_add_epi32(at, step);
    }
    for (; i < n; i++) {
        idx[k] = (uint32_t)i;
        k += comp[i] == j;
    }
    return k;
}

/* 8 reads a vector: the block of each by a multiply and a shift, each component's first slot in it by a gather
 * (a compare each, as pd__segment_component), then the draw's base by two gathers of 4. */
void pd__segment_draws_avx2(const pd__segment_draws *x)
{
    const __m256i world = _mm256_set1_epi32((int)x->world);
    const __m256i step = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), world);
    const __m128i bits = _mm_cvtsi32_si128((int)x->bits);
    uint64_t i = 0;
    for (; i + 8 <= x->count; i += 8) {
        const __m256i at = _mm256_add_epi32(_mm256_set1_epi32((int)(x->rel + (uint32_t)i * x->world)), step);
        const __m256i b = _mm256_srl_epi32(at, bits);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->slot + i));
        __m256i j = _mm256_set1_epi32((int)x->ncomp - 1); /* less one for each component starting past q */
        const uint32_t b0 = (x->rel + (uint32_t)i * x->world) >> x->bits;
        if (((x->rel + (uint32_t)(i + 7) * x->world) >> x->bits) - b0 <= 1) { /* two blocks at most (W ≤ B / 7) */
            const __m256i second = _mm256_cmpgt_epi32(b, _mm256_set1_epi32((int)b0));
            const uint32_t next = b0 + 1 < x->blocks; /* the second block's column, where the segment has one */
            for (unsigned c = 1; c < x->ncomp; c++) { /* slots and starts are below 2^16: signed compares are exact */
                const uint32_t *row = x->start + PD__SEGMENT_BLOCKS * c + b0;
                const __m256i s = _mm256_blendv_epi8(_mm256_set1_epi32((int)row[0]), _mm256_set1_epi32((int)row[next]), second);
                j = _mm256_add_epi32(j, _mm256_cmpgt_epi32(s, q));
            }
        } else {
            for (unsigned c = 1; c < x->ncomp; c++) {
                const __m256i s = _mm256_i32gather_epi32((const int *)(x->start + PD__SEGMENT_BLOCKS * c), b, 4);
                j = _mm256_add_epi32(j, _mm256_cmpgt_epi32(s, q));
            }
        }
        _mm256_storeu_si256((__m256i *)(x->comp + i), j);
        const __m256i row = _mm256_add_epi32(_mm256_slli_epi32(j, 5), b); /* 32j + b */
        const long long *base = (const long long *)x->base;
        const __m256i d0 = _mm256_add_epi64(_mm256_i32gather_epi64(base, _mm256_castsi256_si128(row), 8),
                                            _mm256_cvtepu32_epi64(_mm256_castsi256_si128(q)));
        const __m256i d1 = _mm256_add_epi64(_mm256_i32gather_epi64(base, _mm256_extracti128_si256(row, 1), 8),
                                            _mm256_cvtepu32_epi64(_mm256_extracti128_si256(q, 1)));
        _mm256_storeu_si256((__m256i *)(x->draw + i), d0);
        _mm256_storeu_si256((__m256i *)(x->draw + i + 4), d1);
    }
    for (; i < x->count; i++)
        pd__segment_draw(x, i);
}

/* kernel.h, pd__counts_node_avx2: pd__counts_node_avx512's doubles (read its comment), 4 positions a vector and no
 * fma: the numerator's product (y_i − y_0)·a < 2^48 and q·S ≤ num < 2^49 are exact in a multiply of their own.
 * Positions 29-32 take a ninth vector over 29-31 again: the same values stored twice, no mask. */
void pd__counts_node_avx2(const uint64_t *in, uint64_t *left, uint64_t *right, uint64_t l0, uint64_t r0, uint64_t a,
                          uint64_t S)
{
    const __m256i y0 = _mm256_set1_epi64x((long long)in[0]), l = _mm256_set1_epi64x((long long)l0);
    const __m256i exp52 = _mm256_set1_epi64x(0x4330000000000000LL), low52 = _mm256_set1_epi64x((1LL << 52) - 1);
    const __m256d two52 = _mm256_set1_pd(4503599627370496.0), da = _mm256_set1_pd((double)a);
    const __m256d dr0 = _mm256_set1_pd((double)r0), dS = _mm256_set1_pd((double)S), inv = _mm256_set1_pd(1.0 / (double)S);
    const __m256d one = _mm256_set1_pd(1.0);
    for (unsigned v = 0; v < 9; v++) {
        const unsigned i = v < 8 ? 4 * v : PD__SEGMENT_BLOCKS - 3;
        const __m256i y = _mm256_loadu_si256((const __m256i *)(in + i));
        const __m256d dy = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_sub_epi64(y, y0), exp52)), two52);
        const __m256d num = _mm256_add_pd(_mm256_mul_pd(dy, da), dr0);
        __m256d q = _mm256_floor_pd(_mm256_mul_pd(num, inv));
        const __m256d short_by_one = _mm256_cmp_pd(_mm256_sub_pd(num, _mm256_mul_pd(q, dS)), dS, _CMP_GE_OQ);
        q = _mm256_add_pd(q, _mm256_and_pd(short_by_one, one));
        const __m256i lq = _mm256_add_epi64(l, _mm256_and_si256(_mm256_castpd_si256(_mm256_add_pd(q, two52)), low52));
        _mm256_storeu_si256((__m256i *)(left + i), lq);
        _mm256_storeu_si256((__m256i *)(right + i), _mm256_sub_epi64(y, lq));
    }
}
