/* Tests only: batch_vbmi.c compiled against SIMDe's portable intrinsics (avx512_emu.h), without -mavx512vbmi. */
#include "batch_vbmi.c"
