/* Tests only: kernel_avx512.c compiled against SIMDe's portable intrinsics (avx512_emu.h), without -mavx512f. */
#include "kernel_avx512.c"
