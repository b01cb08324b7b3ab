/* The scalar kernel: the core's σ one position at a time, for CPUs without a SIMD kernel and for short runs. */
#include "cpu/kernel.h"

void pd__run_scalar(const pd__run *run)
{
    const pd_perm *p = run->perm;
    uint64_t pos = run->first;
    if (run->width == 4) {
        uint32_t *out = run->out;
        for (uint64_t i = 0; i < run->count; i++, pos += run->stride)
            out[i] = (uint32_t)pd_perm_at(p, pos);
    } else {
        uint64_t *out = run->out;
        for (uint64_t i = 0; i < run->count; i++, pos += run->stride)
            out[i] = pd_perm_at(p, pos);
    }
}
