/* Names of datasets and groups: the characters a name may hold, checked whole (a NUL inside is no name). */
#ifndef PD_NAME_H
#define PD_NAME_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PD_NAME_MAX 128

/* 0 when name is 1..PD_NAME_MAX bytes of [A-Za-z0-9._-] starting with a
 * letter, a digit or '_' (safe in paths, logs and shells); PD_EINVAL
 * otherwise, and for NULL. */
int pd_name_check(const char *name);

/* name when it passes pd_name_check, else "(invalid name)": request
 * strings may be arbitrary bytes, and replies and logs must stay readable. */
const char *pd_name_printable(const char *name);

#ifdef __cplusplus
}
#endif

#endif
