/* Tests only: batch_avx512.c compiled against SIMDe's portable intrinsics (avx512_emu.h), without -mavx512f. */
#include "batch_avx512.c"
