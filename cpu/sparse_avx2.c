/* A mixture's sparse chunk on AVX2 (cpu/mix.c): one component's reads picked out of the chunk, 8 reads a compare. */
#include "cpu/kernel.h"

#include <immintrin.h>

/* Each 8 reads: compare their components with j, then store the matching reads' indices packed to the front by
 * one vpermd through kernel_avx2.c's compress table (idx may take 8 entries past the count: n ≥ count + 8 there,
 * since a vector is stored only while 8 reads are left to compare). */
uint64_t pd__group_reads_avx2(const uint32_t *comp, uint64_t n, uint32_t j, uint32_t *idx)
{
    const __m256i want = _mm256_set1_epi32((int)j), step = _mm256_set1_epi32(8);
    __m256i at = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    uint64_t k = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)(comp + i));
        const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, want)));
        const __m256i pack = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pd__avx2_compress_tab[m]));
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
