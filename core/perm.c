/* Checked entry points and the scalar bulk loops over σ. */
#include "perm.h"

int pd_perm_init(pd_perm *p, uint64_t seed, uint64_t epoch, uint32_t stream, uint64_t n)
{
    if (!p || n == 0 || n > PD_N_MAX)
        return PD_EINVAL;
    pd__perm_shape(p, n, PD_MIN_BITS);
    pd_keys_derive(seed, epoch, stream, &p->keys);
    return PD_OK;
}

int pd_perm_sample(const pd_perm *p, uint64_t position, uint64_t *sample)
{
    if (!p || !sample)
        return PD_EINVAL;
    if (position >= p->n)
        return PD_ERANGE;
    *sample = pd_perm_at(p, position);
    return PD_OK;
}

int pd_perm_position(const pd_perm *p, uint64_t sample, uint64_t *position)
{
    if (!p || !position)
        return PD_EINVAL;
    if (sample >= p->n)
        return PD_ERANGE;
    *position = pd_perm_inv(p, sample);
    return PD_OK;
}

static int pd_perm_fill_check(const pd_perm *p, uint64_t start, uint64_t count, const void *out)
{
    if (!p || (!out && count))
        return PD_EINVAL;
    if (start > p->n || count > p->n - start)
        return PD_ERANGE;
    return PD_OK;
}

int pd_perm_fill_u64(const pd_perm *p, uint64_t start, uint64_t count, uint64_t *out)
{
    int rc = pd_perm_fill_check(p, start, count, out);
    if (rc)
        return rc;
    for (uint64_t i = 0; i < count; i++)
        out[i] = pd_perm_at(p, start + i);
    return PD_OK;
}

int pd_perm_fill_u32(const pd_perm *p, uint64_t start, uint64_t count, uint32_t *out)
{
    int rc = pd_perm_fill_check(p, start, count, out);
    if (rc)
        return rc;
    if (p->n > (UINT64_C(1) << 32))
        return PD_EOVERFLOW;
    for (uint64_t i = 0; i < count; i++)
        out[i] = (uint32_t)pd_perm_at(p, start + i);
    return PD_OK;
}
