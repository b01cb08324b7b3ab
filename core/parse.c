/* Strict decimal parsing (strtoull accepts "-1", " 5" and "0x10"; users' typos must not become ids). */
#include "parse.h"

#include "error.h"

int pd_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !out || !*s)
        return PD_EINVAL;
    uint64_t v = 0;
    for (const char *c = s; *c; c++) {
        if (*c < '0' || *c > '9')
            return PD_EINVAL;
        uint64_t d = (uint64_t)(*c - '0');
        if (v > (UINT64_MAX - d) / 10)
            return PD_ERANGE;
        v = v * 10 + d;
    }
    *out = v;
    return PD_OK;
}

int pd_parse_u64_range(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t v;
    int rc = pd_parse_u64(s, &v);
    if (rc)
        return rc;
    if (v < lo || v > hi)
        return PD_ERANGE;
    *out = v;
    return PD_OK;
}
