/* Tests only: blocks_vbmi.c compiled against SIMDe's portable intrinsics (avx512_emu.h), without -mavx512vbmi. */
#include "blocks_vbmi.c"
