/* The daemon's single entry point for turning a rank's slice into sample ids (the backend switch point). */
#ifndef PD_GEN_H
#define PD_GEN_H

#include <stdint.h>

#include "core/rank.h"

/* Write the rank's next min(count, remaining) ids, as `width`-byte
 * little-endian integers (4 or 8, see pd_id_width), into out, which must be
 * aligned to width; *written gets how many. Callable from any thread.
 * PD_EINVAL for a bad width or slice, PD_EOVERFLOW for width 4 when n > 2^32.
 *
 * Every Fetch, Stream batch and benchmark path of the daemon goes through
 * here, so swapping the scalar core for the SIMD (cpu/) or CUDA backend is a
 * change to gen.c alone. */
int pd_gen_slice(const pd_perm *perm, const pd_slice *slice, uint64_t count, unsigned width, void *out,
                 uint64_t *written);

/* Name of the backend in use, for logs and Stats. */
const char *pd_gen_backend(void);

#endif
