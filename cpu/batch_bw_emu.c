/* Tests only: batch_bw.c compiled against SIMDe's portable intrinsics (avx512_emu.h), without -mavx512bw. */
#include "batch_bw.c"
