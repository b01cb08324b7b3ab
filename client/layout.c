/* Shard layouts: the container, sizes files, and turning tar specs (paths, directories, braces, globs) into shards. */
#include "layout_internal.h"

#include <dirent.h>
#include <errno.h>
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

/* ---- UTF-8 as Python reads it ---------------------------------------------------------------------- */

uint32_t pd_uc_next(const unsigned char *s, size_t n, size_t *i)
{
    const unsigned char *p = s + *i;
    const size_t left = n - *i;
    uint32_t c = p[0];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (c < 0x80)
        len = 1;
    else if (c >= 0xC2 && c <= 0xDF)
        len = 2, c &= 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, c &= 0x0F, lo = c == 0 ? 0xA0 : 0x80, hi = c == 0xD ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, c &= 0x07, lo = c == 0 ? 0x90 : 0x80, hi = c == 4 ? 0x8F : 0xBF;
    if (!len || len > left || (len > 1 && (p[1] < lo || p[1] > hi))) {
        (*i)++;
        return PD_UC_BYTE | p[0];
    }
    for (size_t k = 1; k < len; k++) {
        if (k > 1 && (p[k] < 0x80 || p[k] > 0xBF)) {
            (*i)++;
            return PD_UC_BYTE | p[0];
        }
        c = c << 6 | (p[k] & 0x3F);
    }
    *i += len;
    return c;
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
    if (line[0] == ' ' || line[0] == '\t')
        return pd_layout_fail(PD_EINVAL, err, errlen, "%s%s: the line starts with a blank (a shard size must start it)",
                              path, where);
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

static int pd_sizes_line_bounded(pd_layout *l, const char *path, uint64_t lineno, char *line, size_t len, char *err,
                                 size_t errlen)
{
    if (len > PD_SIZES_LINE_MAX)
        return pd_layout_fail(PD_EINVAL, err, errlen, "%s:%" PRIu64 ": a line longer than %d bytes (a size and a "
                              "path): not a sizes file", path, lineno, PD_SIZES_LINE_MAX);
    return pd_sizes_line(l, path, lineno, line, len, err, errlen);
}

int pd_layout_read_sizes(const char *path, uint64_t max_shards, pd_layout **out, char *err, size_t errlen)
{
    FILE *f = !strcmp(path, "-") ? stdin : fopen(path, "r");
    if (!f)
        return pd_layout_fail(errno == ENOENT ? PD_ENOTFOUND : PD_EIO, err, errlen, "%s: cannot read it: %s", path,
                              strerror(errno));
    enum { CAP = PD_SIZES_LINE_MAX + 2 }; /* a longest line, its end, and the \n of a \r\n */
    pd_layout *l = pd_layout_new(max_shards);
    char *buf = malloc(CAP + 1);
    size_t have = 0;
    uint64_t lineno = 0;
    int rc = l && buf ? 0 : pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory", path), eof = 0;
    /* Lines end at \n, \r\n or a lone \r, as Python's universal newlines read them (a file written with old Mac
     * line ends must not read as one line), and hold at most PD_SIZES_LINE_MAX bytes: a line is read into one
     * buffer of that size, so that a file with no line end (/dev/zero, a binary given by mistake) is refused
     * rather than read into memory without bound. */
    while (!rc) {
        const size_t got = eof ? 0 : fread(buf + have, 1, CAP - have, f);
        if (got == 0 && !eof && ferror(f)) {
            rc = pd_layout_fail(PD_EIO, err, errlen, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        eof |= got == 0;
        have += got;
        char *p = buf, *end = buf + have;
        while (!rc) {
            char *e = p;
            while (e < end && *e != '\n' && *e != '\r')
                e++;
            if (e == end || (*e == '\r' && e + 1 == end && !eof)) /* no end yet, or a \r\n that may straddle */
                break;
            char *next = e + 1 + (*e == '\r' && e + 1 < end && e[1] == '\n');
            *e = '\0';
            rc = pd_sizes_line_bounded(l, path, ++lineno, p, (size_t)(e - p), err, errlen);
            p = next;
        }
        if (rc)
            break;
        have = (size_t)(end - p);
        memmove(buf, p, have);
        if (eof) { /* the last line, without an end */
            buf[have] = '\0';
            if (have)
                rc = pd_sizes_line_bounded(l, path, ++lineno, buf, have, err, errlen);
            break;
        }
        /* no end in sight (a \r last is the line's end, waiting to see whether a \n follows) */
        if (have - (have && buf[have - 1] == '\r') > PD_SIZES_LINE_MAX)
            rc = pd_sizes_line_bounded(l, path, ++lineno, buf, have, err, errlen);
    }
    if (!rc && l->n == 0)
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s lists no shard sizes", path);
    free(buf);
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

/* ---- Globs: one dialect, the same in C and Python (glibc's glob and Python's fnmatch differ) ---------------- */

/* A pattern part ('/' always separates parts) as code points, escapes kept. */
typedef struct pd_pat {
    uint32_t *c;
    size_t n;
} pd_pat;

static int pd_pat_decode(const char *s, size_t len, pd_pat *p)
{
    p->n = 0;
    p->c = malloc((len + 1) * sizeof *p->c);
    if (!p->c)
        return PD_ENOMEM;
    for (size_t i = 0; i < len;)
        p->c[p->n++] = pd_uc_next((const unsigned char *)s, len, &i);
    return 0;
}

/* The set opened by the '[' at p[i]: its end (the closing ']') in *end, 0 when it has none (the '[' is then a
 * character like any other). A ']' right after "[" or "[!" is a member; a backslash escapes the next. */
static int pd_set_end(const uint32_t *p, size_t n, size_t i, size_t *end)
{
    size_t j = i + 1;
    if (j < n && (p[j] == '!' || p[j] == '^'))
        j++;
    for (size_t first = j; j < n; j++) {
        if (p[j] == '\\')
            j++;
        else if (p[j] == ']' && j > first)
            return *end = j, 1;
    }
    return 0;
}

/* Check a part before anything is listed: a set's members ASCII, no POSIX class, no reversed range. */
static int pd_pat_check(const pd_pat *p, const char *pattern, char *err, size_t errlen)
{
    for (size_t i = 0, end; i < p->n; i++) {
        if (p->c[i] == '\\') {
            i++;
            continue;
        }
        if (p->c[i] != '[' || !pd_set_end(p->c, p->n, i, &end))
            continue;
        for (size_t j = i + 1 + (p->c[i + 1] == '!' || p->c[i + 1] == '^'); j < end; j++) { /* as pd_set_has */
            if (p->c[j] == '[' && j + 1 < end && (p->c[j + 1] == ':' || p->c[j + 1] == '=' || p->c[j + 1] == '.'))
                return pd_layout_fail(PD_EINVAL, err, errlen,
                                      "'%s': POSIX classes ([:digit:], [=a=], [.a.]) are not supported in globs",
                                      pattern);
            uint32_t lo = p->c[j] == '\\' ? p->c[++j] : p->c[j], hi = lo;
            if (j + 2 < end && p->c[j + 1] == '-') {
                j += 2;
                hi = p->c[j] == '\\' ? p->c[++j] : p->c[j];
            }
            if (lo >= 0x80 || hi >= 0x80)
                return pd_layout_fail(PD_EINVAL, err, errlen, "'%s': a glob's [...] set takes ASCII characters only",
                                      pattern);
            if (lo > hi)
                return pd_layout_fail(PD_EINVAL, err, errlen, "'%s': a reversed range in a glob's [...] set", pattern);
        }
        i = end;
    }
    return 0;
}

/* Whether the set p[i..end] (p[i] == '[') holds c. */
static int pd_set_has(const uint32_t *p, size_t i, size_t end, uint32_t c)
{
    size_t j = i + 1;
    int neg = p[j] == '!' || p[j] == '^', in = 0;
    for (j += neg; j < end; j++) {
        uint32_t lo = p[j] == '\\' ? p[++j] : p[j], hi = lo;
        if (j + 2 < end && p[j + 1] == '-') {
            j += 2;
            hi = p[j] == '\\' ? p[++j] : p[j];
        }
        in |= c >= lo && c <= hi;
    }
    return in != neg;
}

/* Whether name (code points) matches the part: '*' any run, '?' one character, [...] one of a set ([!...] or
 * [^...] one not in it), '\c' c itself, anything else itself. */
static int pd_pat_match(const pd_pat *p, const uint32_t *s, size_t sn)
{
    size_t pi = 0, si = 0, star = SIZE_MAX, star_s = 0, end;
    while (si < sn) {
        if (pi < p->n) {
            uint32_t c = p->c[pi];
            if (c == '*') {
                star = pi++;
                star_s = si;
                continue;
            }
            if (c == '?') {
                pi++, si++;
                continue;
            }
            if (c == '[' && pd_set_end(p->c, p->n, pi, &end)) {
                if (pd_set_has(p->c, pi, end, s[si])) {
                    pi = end + 1, si++;
                    continue;
                }
            } else {
                size_t len = c == '\\' && pi + 1 < p->n ? 2 : 1;
                if (p->c[pi + len - 1] == s[si]) {
                    pi += len, si++;
                    continue;
                }
            }
        }
        if (star == SIZE_MAX)
            return 0;
        pi = star + 1;
        si = ++star_s;
    }
    while (pi < p->n && p->c[pi] == '*')
        pi++;
    return pi == p->n;
}

/* Whether the part holds a wildcard ('*', '?' or a closed set) outside escapes. */
static int pd_pat_magic(const pd_pat *p)
{
    size_t end;
    for (size_t i = 0; i < p->n; i++) {
        if (p->c[i] == '\\')
            i++;
        else if (p->c[i] == '*' || p->c[i] == '?' || (p->c[i] == '[' && pd_set_end(p->c, p->n, i, &end)))
            return 1;
    }
    return 0;
}

/* The part without its escapes, as bytes (for a part without wildcards), in a new string; NULL when out of memory. */
static char *pd_pat_literal(const char *part, size_t len)
{
    char *out = malloc(len + 1);
    size_t n = 0;
    for (size_t i = 0; out && i < len; i++) {
        if (part[i] == '\\' && i + 1 < len)
            i++;
        out[n++] = part[i];
    }
    if (out)
        out[n] = '\0';
    return out;
}

typedef struct pd_paths {
    char **v;
    size_t n, cap;
} pd_paths;

static void pd_paths_free(pd_paths *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i]);
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

/* Append a + sep + b (sep 0: none) as a new string. */
static int pd_paths_push(pd_paths *p, const char *a, char sep, const char *b)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        char **v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return PD_ENOMEM;
        p->v = v;
        p->cap = cap;
    }
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (!s)
        return PD_ENOMEM;
    memcpy(s, a, la);
    if (sep)
        s[la++] = sep;
    memcpy(s + la, b, lb + 1);
    p->v[p->n++] = s;
    return 0;
}

static int pd_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of dir matching the part (directories only unless last), appended to out as prefix/name. */
static int pd_glob_list(pd_specs *s, const char *prefix, int first, const pd_pat *p, int last, pd_paths *out)
{
    const char *dir = *prefix ? prefix : first ? "." : "/";
    DIR *d = opendir(dir);
    if (!d) /* a part that names no directory matches nothing, as a missing one */
        return errno == ENOENT || errno == ENOTDIR
                   ? 0
                   : pd_layout_fail(PD_EIO, s->err, s->errlen, "'%s': cannot list %s: %s", s->spec, dir,
                                    strerror(errno));
    int rc = 0, dot = p->n && (p->c[0] == '.' || (p->c[0] == '\\' && p->n > 1 && p->c[1] == '.'));
    uint32_t *cp = NULL;
    size_t cap = 0;
    errno = 0;
    for (struct dirent *e; !rc && (e = readdir(d)); errno = 0) {
        size_t len = strlen(e->d_name), n = 0;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || (e->d_name[0] == '.' && !dot))
            continue; /* hidden names match only a part that starts with a dot */
        if (len > cap) {
            uint32_t *c = realloc(cp, len * sizeof *c);
            if (!c) {
                rc = PD_ENOMEM;
                break;
            }
            cp = c;
            cap = len;
        }
        for (size_t i = 0; i < len;)
            cp[n++] = pd_uc_next((const unsigned char *)e->d_name, len, &i);
        if (!pd_pat_match(p, cp, n))
            continue;
        if ((rc = pd_paths_push(out, prefix, first ? 0 : '/', e->d_name)))
            break;
        struct stat st;
        if (!last && (stat(out->v[out->n - 1], &st) || !S_ISDIR(st.st_mode))) /* a part before the last: dirs */
            free(out->v[--out->n]);
        /* Past max_shards, the last part's matches stop here, and the add says why. Directories matched by a part
         * before it are bounded apart, by the default max_shards whatever --max-shards says: a directory may hold
         * no shard, and stopping at max_shards dropped the shards under those not listed yet, silently. */
        if (last && out->n > s->l->max - s->l->n)
            break;
        if (!last && out->n > PD_LAYOUT_MAX_SHARDS_DEFAULT) {
            rc = pd_layout_fail(PD_ETOOBIG, s->err, s->errlen, "'%s': more than %llu directories match its parts "
                                "before the last: narrow the pattern", s->spec,
                                (unsigned long long)PD_LAYOUT_MAX_SHARDS_DEFAULT);
            break;
        }
    }
    if (!rc && errno)
        rc = pd_layout_fail(PD_EIO, s->err, s->errlen, "'%s': cannot list %s: %s", s->spec, dir, strerror(errno));
    closedir(d);
    free(cp);
    return rc == PD_ENOMEM ? pd_layout_fail(rc, s->err, s->errlen, "'%s': out of memory", s->spec) : rc;
}

/* A glob: each part matched against its directory's entries, the matches sorted bytewise. */
static int pd_specs_glob(pd_specs *s, const char *pattern)
{
    pd_paths cur = {0}, next = {0};
    pd_pat p = {0};
    char *lit = NULL;
    int rc = pd_paths_push(&cur, "", 0, "");
    for (const char *part = pattern; !rc && part;) {
        const char *slash = strchr(part, '/');
        size_t len = slash ? (size_t)(slash - part) : strlen(part);
        int first = part == pattern, last = !slash;
        free(p.c);
        if ((rc = pd_pat_decode(part, len, &p)) || (rc = pd_pat_check(&p, pattern, s->err, s->errlen)))
            break;
        if (pd_pat_magic(&p)) {
            for (size_t i = 0; !rc && i < cur.n; i++)
                rc = pd_glob_list(s, cur.v[i], first, &p, last, &next);
        } else if (!(lit = pd_pat_literal(part, len))) {
            rc = PD_ENOMEM;
        } else {
            for (size_t i = 0; !rc && i < cur.n; i++) {
                struct stat st;
                rc = pd_paths_push(&next, cur.v[i], first ? 0 : '/', lit);
                if (!rc && last && lstat(next.v[next.n - 1], &st)) /* a literal last part: what exists */
                    free(next.v[--next.n]);
            }
            free(lit);
            lit = NULL;
        }
        pd_paths_free(&cur);
        cur = next;
        next = (pd_paths){0};
        part = slash ? slash + 1 : NULL;
    }
    if (rc == PD_ENOMEM)
        pd_layout_fail(rc, s->err, s->errlen, "'%s': out of memory", pattern);
    else if (!rc && cur.n == 0)
        rc = pd_layout_fail(PD_ENOTFOUND, s->err, s->errlen, "'%s' matches no file", pattern);
    if (!rc)
        qsort(cur.v, cur.n, sizeof *cur.v, pd_cmp_str);
    for (size_t i = 0; !rc && i < cur.n; i++)
        rc = pd_specs_add(s, cur.v[i]);
    pd_paths_free(&cur);
    free(p.c);
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
    while (!rc) {
        errno = 0;
        const struct dirent *e = readdir(d);
        if (!e) { /* the end, or a failure that would drop the rest of the shards quietly */
            if (errno)
                rc = pd_layout_fail(PD_EIO, s->err, s->errlen, "%s: cannot list it: %s", dir, strerror(errno));
            break;
        }
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
        if (S_ISDIR(st.st_mode)) { /* subdirectories: not shards */
            free(p);
            continue;
        }
        if (!S_ISREG(st.st_mode)) { /* a FIFO or a device named *.tar: refused as when named, never skipped */
            rc = pd_layout_fail(PD_EINVAL, s->err, s->errlen, "%s: not a regular file", p);
            free(p);
            break;
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
    if (errno == ENOENT && strpbrk(name, "*?["))
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
        uint64_t names; /* the expansion alone had too many names (not too many bytes): say which bound */
        if (rc == PD_ETOOBIG && s->l->n < s->l->max && (pd_braces_count(part, &names) || names > room))
            rc = pd_layout_fail(PD_ETOOBIG, s->err, s->errlen,
                                "more than the %" PRIu64 " shards left of the bound (--max-shards) in '%s'", room,
                                part); /* the reason first: a long pattern may not fit the message */
    }
    free(copy);
    return rc;
}

typedef struct pd_file_id {
    dev_t dev;
    ino_t ino;
    uint64_t shard;
} pd_file_id;

static int pd_cmp_file_id(const void *a, const void *b)
{
    const pd_file_id *x = a, *y = b;
    if (x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino)
        return x->ino < y->ino ? -1 : 1;
    return x->shard < y->shard ? -1 : x->shard > y->shard;
}

/* One file listed twice (a.tar, ./a.tar, a link to it, or {a,a}.tar) would have its samples counted twice:
 * refused, naming the first repeat in shard order and what it repeats. Files that cannot be stat()ed are left
 * to the count, which says why. */
static int pd_tars_unique(const pd_layout *l, char *err, size_t errlen)
{
    pd_file_id *ids = malloc((l->n ? l->n : 1) * sizeof *ids);
    size_t n = 0;
    if (!ids)
        return pd_layout_fail(PD_ENOMEM, err, errlen, "out of memory for %" PRIu64 " shards", l->n);
    for (uint64_t i = 0; i < l->n; i++) {
        struct stat st;
        if (!stat(pd_layout_path(l, i), &st))
            ids[n++] = (pd_file_id){st.st_dev, st.st_ino, i};
    }
    qsort(ids, n, sizeof *ids, pd_cmp_file_id);
    uint64_t first = 0, repeat = UINT64_MAX;
    for (size_t i = 1; i < n; i++) /* in each run of one file: its first shard, then its first repeat */
        if (ids[i].dev == ids[i - 1].dev && ids[i].ino == ids[i - 1].ino &&
            (i < 2 || ids[i - 2].dev != ids[i].dev || ids[i - 2].ino != ids[i].ino) && ids[i].shard < repeat) {
            repeat = ids[i].shard;
            first = ids[i - 1].shard;
        }
    free(ids);
    if (repeat == UINT64_MAX)
        return 0;
    return pd_layout_fail(PD_EINVAL, err, errlen,
                          "%s: shard %" PRIu64 " is %s (shard %" PRIu64 ") again: one file listed twice would have its "
                          "samples counted twice",
                          pd_layout_path(l, repeat), repeat, pd_layout_path(l, first), first);
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
    if (!rc)
        rc = pd_tars_unique(l, err, errlen);
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
