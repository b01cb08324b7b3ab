/* Brace expansion of shard patterns ("shard-{000000..000999}.tar"), as WebDataset expands its URLs. */
#ifndef PD_BRACES_H
#define PD_BRACES_H

#include <stddef.h>
#include <stdint.h>

/* Called once per expanded string, in order; a non-zero return stops the expansion and is returned. */
typedef int (*pd_braces_fn)(void *ctx, const char *s);

/* Braces nested deeper than this are refused (PD_EINVAL) rather than recursed into. */
#define PD_BRACES_DEPTH_MAX 64

/* Expand pattern exactly as the Python package braceexpand 0.1.7 (which WebDataset calls) does with
 * escape=True, and call emit on each result in order:
 *   {a,b,c}    alternatives, nested and empty ones allowed ("x{,.bak}")
 *   {M..N[..S]} integers, either direction, negative allowed; a zero-padded end ("07", "-03")
 *              pads every number to the longer end's width; step S (0 means 1)
 *   {a..e[..S]} letters of A-Z a-z in that order, either direction
 *   \c         the character c, never special (a lone trailing backslash stays)
 * Anything else in braces ("{1}", "{}", "{a.b}") stays literal, braces included.
 * Digits are ASCII (braceexpand also takes other Unicode digits; patterns never hold them).
 * PD_EINVAL (message in err) for unbalanced braces or nesting deeper than PD_BRACES_DEPTH_MAX;
 * PD_ETOOBIG when the pattern expands to more than max strings (counted before any is built);
 * PD_ENOMEM; or emit's non-zero return. */
int pd_braces_expand(const char *pattern, uint64_t max, pd_braces_fn emit, void *ctx, char *err, size_t errlen);

#endif
