/* Slice generation for the daemon: today the scalar core (pd_slice_fill_*); the SIMD/CUDA backends plug in here. */
#include "daemon/gen.h"

#include <stdint.h>

#include "core/error.h"

const char *pd_gen_backend(void)
{
    return "core-scalar";
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
/* The wire is little-endian; big-endian hosts swap in place after filling. */
static void pd_gen_to_le(void *out, uint64_t n, unsigned width)
{
    if (width == 4)
        for (uint64_t i = 0; i < n; i++)
            ((uint32_t *)out)[i] = __builtin_bswap32(((uint32_t *)out)[i]);
    else
        for (uint64_t i = 0; i < n; i++)
            ((uint64_t *)out)[i] = __builtin_bswap64(((uint64_t *)out)[i]);
}
#else
static void pd_gen_to_le(void *out, uint64_t n, unsigned width)
{
    (void)out;
    (void)n;
    (void)width;
}
#endif

int pd_gen_slice(const pd_perm *perm, const pd_slice *slice, uint64_t count, unsigned width, void *out,
                 uint64_t *written)
{
    int rc;
    if (width == 4)
        rc = pd_slice_fill_u32(perm, slice, count, out, written);
    else if (width == 8)
        rc = pd_slice_fill_u64(perm, slice, count, out, written);
    else
        return PD_EINVAL;
    if (rc == 0)
        pd_gen_to_le(out, *written, width);
    return rc;
}
