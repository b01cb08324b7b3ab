/* The batch kernel on 16-bit lanes (AVX-512BW, for CPUs without VBMI): batch_avx512.c compiled with PD_BATCH_WORDS, for batches whose τ all have b ≤ 17. */
#define PD_BATCH_WORDS 1
#include "batch_avx512.c"
