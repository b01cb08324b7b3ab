/* Shared definitions for the permd core: qualifiers that let one header serve C11 and CUDA. */
#ifndef PD_DEFS_H
#define PD_DEFS_H

#include <stdint.h>

/* PD_HD marks functions callable from host and device code, so gpu/ runs
 * the exact same round function as the CPU instead of a re-typed copy. */
#if defined(__CUDACC__)
#define PD_HD __host__ __device__
#define PD_INLINE __forceinline__
#else
#define PD_HD
#define PD_INLINE inline __attribute__((always_inline))
#endif

#define PD_STATIC_INLINE static PD_INLINE PD_HD

#endif
