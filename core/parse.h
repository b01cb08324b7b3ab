/* Strict decimal parsing for command lines and config values: no signs, spaces or trailing junk. */
#ifndef PD_PARSE_H
#define PD_PARSE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parse a whole string as an unsigned decimal u64. PD_EINVAL for empty
 * strings, signs, junk; PD_ERANGE when the value exceeds 2^64 - 1. */
int pd_parse_u64(const char *s, uint64_t *out);

/* As pd_parse_u64, then PD_ERANGE unless lo ≤ value ≤ hi. */
int pd_parse_u64_range(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif
