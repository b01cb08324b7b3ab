/* Tests only: slots_avx512.c compiled against SIMDe's portable intrinsics (avx512_emu.h), without -mavx512f. */
#include "slots_avx512.c"
