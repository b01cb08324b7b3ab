/* Brace expansion of shard patterns ("shard-{000000..000999}.tar"), as WebDataset expands its URLs. */
#ifndef PD_BRACES_H
#define PD_BRACES_H

#include <stddef.h>
#include <stdint.h>

/* Called once per expanded string, in order; a non-zero return stops the expansion and is returned. */
typedef int (*pd_braces_fn)(void *ctx, const char *s);

/* Braces nested deeper than this are refused (PD_EINVAL) rather than recursed into. */
#define PD_BRACES_DEPTH_MAX 64
/* A pattern whose names add up to more bytes than this is refused (PD_ETOOBIG), counted before any is built:
 * 16,777,216 names (the default --max-shards) of 64 bytes. Building holds a pattern's parts, not its names,
 * except where braces nest ("{a{0..9},b}" builds a{0..9}'s), so a pattern never holds more than this. */
#define PD_BRACES_BYTES_MAX (UINT64_C(1) << 30)

/* Expand pattern exactly as the Python package braceexpand 0.1.7 (which WebDataset calls) does with
 * escape=True, and call emit on each result in order:
 *   {a,b,c}    alternatives, nested and empty ones allowed ("x{,.bak}")
 *   {M..N[..S]} integers, either direction, negative allowed; a zero-padded end ("07", "-03")
 *              pads every number to the longer end's width; step S (0 means 1)
 *   {a..e[..S]} letters of A-Z a-z in that order, either direction
 *   \c         the character c, never special (a lone trailing backslash stays)
 * Anything else in braces ("{1}", "{}", "{a.b}") stays literal, braces included.
 * Digits are ASCII (braceexpand also takes other Unicode digits; patterns never hold them).
 * The string passed to emit lives until emit returns.
 * PD_EINVAL (message in err) for unbalanced braces or nesting deeper than PD_BRACES_DEPTH_MAX;
 * PD_ETOOBIG when the pattern expands to more than max strings, or to more than PD_BRACES_BYTES_MAX bytes of
 * them (both counted before any is built), or a range's end does not fit 64 bits; PD_ENOMEM; or emit's
 * non-zero return. */
int pd_braces_expand(const char *pattern, uint64_t max, pd_braces_fn emit, void *ctx, char *err, size_t errlen);

/* How many strings pattern expands to, in *count, building none: PD_ETOOBIG past 2^64 − 1 or where a
 * range's end does not fit 64 bits, PD_EINVAL as pd_braces_expand (0 in *count on an error). */
int pd_braces_count(const char *pattern, uint64_t *count);

#endif
