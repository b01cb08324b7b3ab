/* Shard layouts: the container, sizes files, and turning tar specs (paths, directories, braces, globs) into shards. */
#include "layout_internal.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client/braces.h"
#include "core/error.h"
#include "core/parse.h"
#include "core/perm.h"

/* ---- The container ---------------------------------------------------------------------------- */

int pd_layout_fail(int code, char *err, size_t errlen, const char *fmt, ...)
{
    if (errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

pd_layout *pd_layout_new(uint64_t max)
{
    pd_layout *l = calloc(1, sizeof *l);
    if (l)
        l->max = max ? max : PD_LAYOUT_MAX_SHARDS_DEFAULT;
    return l;
}

void pd_layout_free(pd_layout *l)
{
    if (!l)
        return;
    free(l->sizes);
    free(l->path_at);
    free(l->paths);
    free(l);
}

uint64_t pd_layout_shards(const pd_layout *l) { return l->n; }
const uint64_t *pd_layout_sizes(const pd_layout *l) { return l->sizes; }
uint64_t pd_layout_samples(const pd_layout *l) { return l->total; }
uint64_t pd_layout_bytes_read(const pd_layout *l) { return l->bytes_read; }

const char *pd_layout_path(const pd_layout *l, uint64_t shard)
{
    return shard < l->n && l->path_at[shard] != SIZE_MAX ? l->paths + l->path_at[shard] : NULL;
}

int pd_layout_append_str(char **buf, size_t *len, size_t *cap, const char *s, size_t *at)
{
    size_t n = strlen(s) + 1;
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n)
            c *= 2;
        char *p = realloc(*buf, c);
        if (!p)
            return PD_ENOMEM;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *at = *len;
    *len += n;
    return 0;
}

static int pd_layout_overflow(char *err, size_t errlen, const char *where)
{
    return pd_layout_fail(PD_EOVERFLOW, err, errlen, "%s: the shards hold more than 2^63 samples in all", where);
}

int pd_layout_add(pd_layout *l, uint64_t size, const char *path, const char *where, char *err, size_t errlen)
{
    if (l->n == l->max)
        return pd_layout_fail(PD_ETOOBIG, err, errlen, "%s: more than %" PRIu64 " shards (raise the bound: --max-shards)",
                              where, l->max);
    if (size > PD_N_MAX - l->total)
        return pd_layout_overflow(err, errlen, where);
    if (l->n == l->cap) {
        uint64_t cap = l->cap ? l->cap * 2 : 64;
        uint64_t *s = realloc(l->sizes, cap * sizeof *s);
        if (s)
            l->sizes = s;
        size_t *p = s ? realloc(l->path_at, cap * sizeof *p) : NULL;
        if (!p)
            return pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory for %" PRIu64 " shards", where, cap);
        l->path_at = p;
        l->cap = cap;
    }
    l->path_at[l->n] = SIZE_MAX;
    if (path && pd_layout_append_str(&l->paths, &l->paths_len, &l->paths_cap, path, &l->path_at[l->n]))
        return pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory for shard paths", where);
    l->sizes[l->n++] = size;
    l->total += size;
    return 0;
}

int pd_layout_set_size(pd_layout *l, uint64_t shard, uint64_t size, char *err, size_t errlen)
{
    uint64_t rest = l->total - l->sizes[shard];
    if (size > PD_N_MAX - rest)
        return pd_layout_overflow(err, errlen, pd_layout_path(l, shard) ? pd_layout_path(l, shard) : "layout");
    l->sizes[shard] = size;
    l->total = rest + size;
    return 0;
}

/* ---- Sizes files -------------------------------------------------------------------------------- */

/* One line of a sizes file (its end already cut off): skipped, or a shard appended. */
static int pd_sizes_line(pd_layout *l, const char *path, uint64_t lineno, char *line, size_t len, char *err,
                         size_t errlen)
{
    char where[32];
    snprintf(where, sizeof where, ":%" PRIu64, lineno);
    if (memchr(line, '\0', len)) /* C strings would end there, Python's would not: refused by both */
        return pd_layout_fail(PD_EINVAL, err, errlen, "%s%s: a NUL byte in the line", path, where);
    if (!line[0] || line[0] == '#')
        return 0;
    char *name = line + strcspn(line, " \t");
    if (*name) { /* "SIZE<blanks>PATH": the path is the rest of the line */
        *name++ = '\0';
        name += strspn(name, " \t");
    }
    uint64_t size;
    if (pd_parse_u64(line, &size))
        return pd_layout_fail(PD_EINVAL, err, errlen, "%s%s: '%s' is not a shard size (an unsigned decimal integer)",
                              path, where, line);
    char *at = malloc(strlen(path) + sizeof where);
    if (!at)
        return pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory", path);
    strcat(strcpy(at, path), where);
    int rc = pd_layout_add(l, size, *name ? name : NULL, at, err, errlen);
    free(at);
    return rc;
}

int pd_layout_read_sizes(const char *path, uint64_t max_shards, pd_layout **out, char *err, size_t errlen)
{
    FILE *f = !strcmp(path, "-") ? stdin : fopen(path, "r");
    if (!f)
        return pd_layout_fail(errno == ENOENT ? PD_ENOTFOUND : PD_EIO, err, errlen, "%s: cannot read it: %s", path,
                              strerror(errno));
    pd_layout *l = pd_layout_new(max_shards);
    char *chunk = NULL;
    size_t cap = 0;
    ssize_t n;
    uint64_t lineno = 0;
    int rc = l ? 0 : pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory", path);
    /* Lines end at \n, \r\n or a lone \r, as Python's universal newlines read them (a file written with
     * old Mac line ends must not read as one line). getline splits at \n only, and a \r\n never straddles
     * two of its chunks, so each chunk is split again at every \r. */
    while (!rc && (n = getline(&chunk, &cap, f)) > 0) {
        for (char *p = chunk, *end = chunk + n; !rc && p < end;) {
            char *e = p;
            while (e < end && *e != '\n' && *e != '\r')
                e++;
            char *next = e < end ? e + 1 + (*e == '\r' && e + 1 < end && e[1] == '\n') : end;
            *e = '\0'; /* the line end, or (last line without one) the terminator getline put there */
            rc = pd_sizes_line(l, path, ++lineno, p, (size_t)(e - p), err, errlen);
            p = next;
        }
    }
    if (!rc && ferror(f))
        rc = pd_layout_fail(PD_EIO, err, errlen, "%s: read failed", path);
    if (!rc && l->n == 0)
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s lists no shard sizes", path);
    free(chunk);
    if (f != stdin)
        fclose(f);
    if (rc) {
        pd_layout_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* ---- Tar specs ------------------------------------------------------------------------------------ */

typedef struct pd_specs {
    pd_layout *l;
    const char *spec; /* the spec being resolved, for messages */
    char *err;
    size_t errlen;
} pd_specs;

static int pd_specs_add(pd_specs *s, const char *path)
{
    return pd_layout_add(s->l, 0, path, s->spec, s->err, s->errlen);
}

static int pd_has_glob(const char *s)
{
    return strpbrk(s, "*?[") != NULL;
}

static int pd_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A glob, its matches sorted bytewise (glob's own sort follows the locale's collation). */
static int pd_specs_glob(pd_specs *s, const char *pattern)
{
    glob_t g;
    int grc = glob(pattern, GLOB_NOSORT, NULL, &g);
    if (grc == GLOB_NOMATCH)
        return pd_layout_fail(PD_ENOTFOUND, s->err, s->errlen, "'%s' matches no file", pattern);
    if (grc)
        return pd_layout_fail(grc == GLOB_NOSPACE ? PD_ENOMEM : PD_EIO, s->err, s->errlen, "'%s': cannot list it",
                              pattern);
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, pd_cmp_str);
    int rc = 0;
    for (size_t i = 0; !rc && i < g.gl_pathc; i++)
        rc = pd_specs_add(s, g.gl_pathv[i]);
    globfree(&g);
    return rc;
}

static int pd_is_tar_name(const char *name)
{
    static const char *const ext[] = {".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"};
    size_t n = strlen(name);
    if (name[0] == '.')
        return 0;
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && !strcmp(name + n - e, ext[i]))
            return 1;
    }
    return 0;
}

/* A directory's tar files (not its subdirectories'), sorted bytewise by name. */
static int pd_specs_dir(pd_specs *s, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return pd_layout_fail(PD_EIO, s->err, s->errlen, "%s: cannot list it: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0, dlen = strlen(dir);
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (!pd_is_tar_name(e->d_name))
            continue;
        char *p = malloc(dlen + strlen(e->d_name) + 2);
        struct stat st;
        if (!p) {
            rc = PD_ENOMEM;
            break;
        }
        sprintf(p, "%s%s%s", dir, dlen && dir[dlen - 1] == '/' ? "" : "/", e->d_name);
        if (stat(p, &st)) { /* a shard behind a broken link (or a link loop) must not go missing quietly */
            rc = pd_layout_fail(errno == ENOENT ? PD_ENOTFOUND : PD_EIO, s->err, s->errlen, "%s: %s", p,
                                errno == ENOENT ? "a broken link" : strerror(errno));
            free(p);
            break;
        }
        if (!S_ISREG(st.st_mode)) { /* subdirectories and other non-files: not shards */
            free(p);
            continue;
        }
        if (n == cap) {
            char **v = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *v);
            if (!v) {
                free(p);
                rc = PD_ENOMEM;
                break;
            }
            names = v;
        }
        names[n++] = p;
        if (n > s->l->max) /* stop listing: pd_specs_add says why */
            break;
    }
    closedir(d);
    if (rc == PD_ENOMEM)
        pd_layout_fail(rc, s->err, s->errlen, "%s: out of memory listing it", dir);
    else if (!rc && n == 0)
        rc = pd_layout_fail(PD_ENOTFOUND, s->err, s->errlen,
                            "%s: no tar shards in it (*.tar, *.tar.gz, *.tgz, *.tar.bz2, *.tar.xz)", dir);
    if (!rc)
        qsort(names, n, sizeof *names, pd_cmp_str);
    for (size_t i = 0; i < n; i++) {
        if (!rc)
            rc = pd_specs_add(s, names[i]);
        free(names[i]);
    }
    free(names);
    return rc;
}

/* One name: an existing file, else a directory, else a glob. */
static int pd_specs_name(void *ctx, const char *name)
{
    pd_specs *s = ctx;
    struct stat st;
    if (!stat(name, &st))
        return S_ISDIR(st.st_mode) ? pd_specs_dir(s, name) : pd_specs_add(s, name);
    if (errno == ENOENT && pd_has_glob(name))
        return pd_specs_glob(s, name);
    if (errno == ENOENT && strcmp(name, s->spec))
        return pd_layout_fail(PD_ENOTFOUND, s->err, s->errlen, "%s (from '%s'): no such file", name, s->spec);
    return pd_layout_fail(errno == ENOENT ? PD_ENOTFOUND : PD_EIO, s->err, s->errlen, "%s: %s", name,
                          strerror(errno));
}

/* One spec: split at "::", each part brace-expanded. */
static int pd_specs_resolve(pd_specs *s, const char *spec)
{
    char *copy = strdup(spec);
    if (!copy)
        return pd_layout_fail(PD_ENOMEM, s->err, s->errlen, "out of memory");
    int rc = 0;
    for (char *part = copy, *next; !rc && part; part = next) {
        char *sep = strstr(part, "::");
        next = sep ? sep + 2 : NULL;
        if (sep)
            *sep = '\0';
        if (!*part) {
            rc = pd_layout_fail(PD_EINVAL, s->err, s->errlen, "'%s': an empty shard spec", spec);
            break;
        }
        s->spec = part;
        uint64_t room = s->l->n < s->l->max ? s->l->max - s->l->n : 1; /* at the bound: the add says so */
        rc = pd_braces_expand(part, room, pd_specs_name, s, s->err, s->errlen);
        if (rc == PD_ETOOBIG && s->l->n < s->l->max) /* the expansion alone was too large */
            rc = pd_layout_fail(PD_ETOOBIG, s->err, s->errlen,
                                "'%s' expands to more than the %" PRIu64 " shards left of the bound (--max-shards)",
                                part, room);
    }
    free(copy);
    return rc;
}

int pd_layout_read_tars(const char *const *specs, size_t nspecs, uint64_t max_shards, pd_layout **out, char *err,
                        size_t errlen)
{
    pd_layout *l = pd_layout_new(max_shards);
    if (!l)
        return pd_layout_fail(PD_ENOMEM, err, errlen, "out of memory");
    pd_specs s = {.l = l, .err = err, .errlen = errlen};
    int rc = nspecs ? 0 : pd_layout_fail(PD_EINVAL, err, errlen, "no tar shards given");
    for (size_t i = 0; !rc && i < nspecs; i++)
        rc = pd_specs_resolve(&s, specs[i]);
    for (uint64_t i = 0; !rc && i < l->n; i++) {
        uint64_t samples, bytes;
        rc = pd_layout_count_tar(pd_layout_path(l, i), &samples, &bytes, err, errlen);
        l->bytes_read += rc ? 0 : bytes;
        if (!rc)
            rc = pd_layout_set_size(l, i, samples, err, errlen);
    }
    if (rc) {
        pd_layout_free(l);
        return rc;
    }
    *out = l;
    return 0;
}
