/* The batch kernel on byte lanes (AVX-512 VBMI): batch_avx512.c compiled with PD_BATCH_BYTES, for batches whose τ all have b ≤ 16. */
#define PD_BATCH_BYTES 1
#include "batch_avx512.c"
