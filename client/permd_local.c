/* libpermd's offline half: spec-v1 permutations and rank slices computed in-process by the core. */
#include "client/permd.h"

#include "cpu/gen.h"
#include "core/error.h"
#include "core/rank.h"

static int pd_local_mode(int mode, pd_mode *out)
{
    if (mode < PD_MODE_PAD || mode > PD_MODE_EXACT)
        return PD_EINVAL;
    *out = (pd_mode)mode;
    return 0;
}

int permd_perm_fill(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t start, uint64_t count, void *out,
                    unsigned width)
{
    pd_perm p;
    int rc = pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n);
    if (rc)
        return rc;
    if (count && !out)
        return PD_EINVAL;
    pd_gen g;
    pd_gen_init(&g, PD_ISA_AUTO);
    if (width == 4)
        return pd_gen_fill_u32(&g, &p, start, count, out);
    if (width == 8)
        return pd_gen_fill_u64(&g, &p, start, count, out);
    return PD_EINVAL;
}

int permd_perm_inverse(uint64_t seed, uint64_t epoch, uint64_t n, const uint64_t *samples, uint64_t count,
                       uint64_t *positions)
{
    pd_perm p;
    int rc = pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n);
    if (rc)
        return rc;
    if (count && (!samples || !positions))
        return PD_EINVAL;
    for (uint64_t i = 0; i < count; i++) /* all or nothing: check before writing */
        if (samples[i] >= n)
            return PD_ERANGE;
    for (uint64_t i = 0; i < count; i++)
        positions[i] = pd_perm_inv(&p, samples[i]);
    return 0;
}

int permd_epoch_length(uint64_t n, uint32_t world, int mode, uint64_t *len)
{
    pd_mode m;
    if (!len || pd_local_mode(mode, &m))
        return PD_EINVAL;
    return pd_epoch_length(n, world, m, len);
}

int permd_rank_remaining(uint64_t n, uint32_t world, uint32_t rank, int mode, uint64_t offset, uint64_t *count)
{
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    if (!count || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    return pd_slice_remaining(n, &s, count);
}

int permd_rank_fill(uint64_t seed, uint64_t epoch, uint64_t n, uint32_t world, uint32_t rank, int mode,
                    uint64_t offset, uint64_t count, void *out, unsigned width, uint64_t *written)
{
    pd_perm p;
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    int rc = pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n);
    if (rc)
        return rc;
    if (!written || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    pd_gen g;
    pd_gen_init(&g, PD_ISA_AUTO);
    if (width == 4)
        return pd_gen_slice_fill_u32(&g, &p, &s, count, out, written);
    if (width == 8)
        return pd_gen_slice_fill_u64(&g, &p, &s, count, out, written);
    return PD_EINVAL;
}
