/* Epoch length per mode and the scalar fill of one rank's slice. */
#include "rank.h"

#include <string.h>

static const char *const pd_mode_names[] = {"pad", "drop", "exact"};

int pd_mode_parse(const char *s, pd_mode *mode)
{
    if (!s || !mode)
        return PD_EINVAL;
    for (int m = PD_MODE_PAD; m <= PD_MODE_EXACT; m++) {
        if (strcmp(s, pd_mode_names[m]) == 0) {
            *mode = (pd_mode)m;
            return PD_OK;
        }
    }
    return PD_EINVAL;
}

const char *pd_mode_name(pd_mode mode)
{
    return (unsigned)mode <= PD_MODE_EXACT ? pd_mode_names[mode] : "?";
}

unsigned pd_id_width(uint64_t n)
{
    return n <= (UINT64_C(1) << 32) ? 4u : 8u;
}

int pd_epoch_length(uint64_t n, uint32_t world, pd_mode mode, uint64_t *len)
{
    if (!len || n == 0 || n > PD_N_MAX || world == 0)
        return PD_EINVAL;
    switch (mode) {
    case PD_MODE_PAD: /* n ≤ 2^63 and W < 2^32: no overflow */
        *len = (n / world + (n % world != 0)) * world;
        return PD_OK;
    case PD_MODE_DROP:
        *len = n / world * world;
        return PD_OK;
    case PD_MODE_EXACT:
        *len = n;
        return PD_OK;
    }
    return PD_EINVAL;
}

int pd_slice_check(uint64_t n, const pd_slice *s)
{
    uint64_t len;
    if (!s)
        return PD_EINVAL;
    int rc = pd_epoch_length(n, s->world, s->mode, &len);
    if (rc)
        return rc;
    if (s->rank >= s->world)
        return PD_EINVAL;
    if (s->offset > len)
        return PD_ERANGE;
    return PD_OK;
}

int pd_slice_remaining(uint64_t n, const pd_slice *s, uint64_t *count)
{
    uint64_t len;
    if (!count)
        return PD_EINVAL;
    int rc = pd_slice_check(n, s);
    if (rc)
        return rc;
    pd_epoch_length(n, s->world, s->mode, &len);
    uint64_t first = s->offset + s->rank; /* ≤ T + W: fits */
    *count = first >= len ? 0 : (len - 1 - first) / s->world + 1;
    return PD_OK;
}

int pd_slice_position(uint64_t n, const pd_slice *s, uint64_t k, uint64_t *position)
{
    uint64_t left;
    if (!position)
        return PD_EINVAL;
    int rc = pd_slice_remaining(n, s, &left);
    if (rc)
        return rc;
    if (k >= left)
        return PD_ERANGE;
    *position = s->offset + s->rank + k * s->world;
    return PD_OK;
}

/* Shared prologue of the fills: validate and clamp count to what is left. */
static int pd_slice_fill_begin(const pd_perm *perm, const pd_slice *s, uint64_t *count,
                               const void *out, uint64_t *written)
{
    uint64_t left;
    if (!perm || !written || (!out && *count))
        return PD_EINVAL;
    int rc = pd_slice_remaining(perm->n, s, &left);
    if (rc)
        return rc;
    if (*count > left)
        *count = left;
    return PD_OK;
}

int pd_slice_fill_u64(const pd_perm *perm, const pd_slice *s, uint64_t count, uint64_t *out,
                      uint64_t *written)
{
    int rc = pd_slice_fill_begin(perm, s, &count, out, written);
    if (rc)
        return rc;
    uint64_t pos = s->offset + s->rank;
    for (uint64_t k = 0; k < count; k++, pos += s->world)
        out[k] = pd_stream_sample(perm, pos);
    *written = count;
    return PD_OK;
}

int pd_slice_fill_u32(const pd_perm *perm, const pd_slice *s, uint64_t count, uint32_t *out,
                      uint64_t *written)
{
    int rc = pd_slice_fill_begin(perm, s, &count, out, written);
    if (rc)
        return rc;
    if (pd_id_width(perm->n) != 4)
        return PD_EOVERFLOW;
    uint64_t pos = s->offset + s->rank;
    for (uint64_t k = 0; k < count; k++, pos += s->world)
        out[k] = (uint32_t)pd_stream_sample(perm, pos);
    *written = count;
    return PD_OK;
}
