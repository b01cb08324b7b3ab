/* What layout.c shares with its readers (layout_mds.c, layout_tar.c): building a layout, formatting errors. */
#ifndef PD_LAYOUT_INTERNAL_H
#define PD_LAYOUT_INTERNAL_H

#include <stdio.h>

#include "client/layout.h"

struct pd_layout {
    uint64_t n, cap, max; /* shards, allocated, the caller's bound */
    uint64_t *sizes;
    size_t *path_at;      /* offset of shard i's path in paths, or SIZE_MAX for none */
    char *paths;          /* NUL-terminated paths, back to back */
    size_t paths_len, paths_cap;
    uint64_t total;       /* Σ sizes so far */
    uint64_t bytes_read;
};

/* An empty layout bounded to max shards (0: the default); NULL when out of memory. */
pd_layout *pd_layout_new(uint64_t max);

/* Append a shard (path may be NULL). PD_ETOOBIG past the bound, PD_EOVERFLOW when the total would
 * pass 2^63, PD_ENOMEM; each with a message naming where (the file, or the file and line). */
int pd_layout_add(pd_layout *l, uint64_t size, const char *path, const char *where, char *err, size_t errlen);

/* Set shard i's size (paths listed first, counted after), with pd_layout_add's checks on the total. */
int pd_layout_set_size(pd_layout *l, uint64_t shard, uint64_t size, char *err, size_t errlen);

/* Append s and its NUL to the growing buffer *buf (*len used of *cap); *at gets its offset. 0 or PD_ENOMEM. */
int pd_layout_append_str(char **buf, size_t *len, size_t *cap, const char *s, size_t *at);

/* Names are bytes here and str in Python (UTF-8, surrogateescape), where a byte that starts no valid UTF-8
 * sequence is a code point of its own. PD_UC_BYTE | b stands for it. */
#define PD_UC_BYTE 0x80000000u

/* The code point at s[*i] as Python's strict UTF-8 decoder reads it (no overlong forms, surrogates or values
 * past U+10FFFF), or PD_UC_BYTE | s[*i]; *i advances past it (*i < n). */
uint32_t pd_uc_next(const unsigned char *s, size_t n, size_t *i);

/* snprintf into err (when errlen > 0) and return code: the readers' one-line error exit. */
int pd_layout_fail(int code, char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
