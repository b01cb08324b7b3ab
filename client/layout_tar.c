/* WebDataset tar shards: samples counted from the tar headers alone (libarchive), grouped as WebDataset groups members. */
#include "layout_internal.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/layout_unicode.h"
#include "core/error.h"

#define TAR_BLOCK 16384 /* bytes read at each header: the header plus what follows it */

/* ---- WebDataset's member names ---------------------------------------------------------------------- */

int pd_wds_split(const char *name, size_t *keylen, const char **ext)
{
    /* WebDataset's regex: ^((?:.*SLASH|)[^.]+)[.]([^/]*)$, SLASH being '/'. The extension holds no
     * '/', so the dot lies in the last component, and the key must end in a dot-free run that starts
     * the name or follows a '/': only the component's first dot can qualify, so the match is unique. */
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot)
        return 0;
    if (dot == base) { /* ".x": the key is the directory part, if its last component has no dot */
        if (!slash)
            return 0;
        const char *comp = slash;
        while (comp > name && comp[-1] != '/')
            comp--;
        if (memchr(comp, '.', (size_t)(slash - comp)))
            return 0;
    }
    *keylen = (size_t)(dot - name);
    *ext = dot + 1;
    return 1;
}

int pd_wds_is_meta(const char *name)
{
    size_t n = strlen(name);
    if (n < 2 || name[0] != '_' || name[1] != '_')
        return 0;
    if (!strchr(name, '/') && name[n - 2] == '_' && name[n - 1] == '_') /* "__x__" (and "__", "___") */
        return 1;
    const char *sl = strchr(name + 2, '/'); /* __[^/]*__($|/) at the start */
    size_t e = sl ? (size_t)(sl - name) : n;
    return e >= 4 && name[e - 2] == '_' && name[e - 1] == '_';
}

/* ---- Python's str.lower(), which WebDataset applies to each extension ------------------------------------ */

static size_t uc_put(uint32_t c, unsigned char *out)
{
    if (c & PD_UC_BYTE)
        return out[0] = (unsigned char)c, 1;
    if (c < 0x80)
        return out[0] = (unsigned char)c, 1;
    if (c < 0x800)
        return out[0] = (unsigned char)(0xC0 | c >> 6), out[1] = (unsigned char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return out[0] = (unsigned char)(0xE0 | c >> 12), out[1] = (unsigned char)(0x80 | (c >> 6 & 0x3F)),
               out[2] = (unsigned char)(0x80 | (c & 0x3F)), 3;
    return out[0] = (unsigned char)(0xF0 | c >> 18), out[1] = (unsigned char)(0x80 | (c >> 12 & 0x3F)),
           out[2] = (unsigned char)(0x80 | (c >> 6 & 0x3F)), out[3] = (unsigned char)(0x80 | (c & 0x3F)), 4;
}

/* 1 cased (and not case-ignorable), 2 case-ignorable, 0 neither. */
static uint32_t uc_case(uint32_t c)
{
    size_t a = 0, b = sizeof pd_uc_case / sizeof pd_uc_case[0];
    if (c & PD_UC_BYTE)
        return 0;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (pd_uc_case[m].hi < c)
            a = m + 1;
        else
            b = m;
    }
    return a < sizeof pd_uc_case / sizeof pd_uc_case[0] && pd_uc_case[a].lo <= c ? pd_uc_case[a].cls : 0;
}

static uint32_t uc_lower1(uint32_t c)
{
    size_t a = 0, b = sizeof pd_uc_lower / sizeof pd_uc_lower[0];
    if (c & PD_UC_BYTE)
        return c;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (pd_uc_lower[m].hi < c)
            a = m + 1;
        else
            b = m;
    }
    if (a < sizeof pd_uc_lower / sizeof pd_uc_lower[0] && pd_uc_lower[a].lo <= c &&
        (c - pd_uc_lower[a].lo) % pd_uc_lower[a].stride == 0)
        return (uint32_t)((int32_t)c + pd_uc_lower[a].delta);
    return c;
}

/* s[0..n) lower-cased as Python's str.lower() does it, into a new NUL-terminated buffer (*out, *outlen
 * bytes); 0 or PD_ENOMEM. ASCII, nearly every extension, takes the short way. */
static int uc_lower(const char *s, size_t n, char **out, size_t *outlen)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && u[i] < 0x80)
        i++;
    uint32_t *cp = i < n ? malloc(n * sizeof *cp) : NULL;
    unsigned char *o = malloc(i < n ? 3 * n + 1 : n + 1); /* a code point of k bytes lower-cases to ≤ k + 1 */
    if (!o || (i < n && !cp)) {
        free(cp);
        free(o);
        return PD_ENOMEM;
    }
    size_t len = 0, m = 0;
    if (i == n) {
        for (; len < n; len++)
            o[len] = (unsigned char)(u[len] >= 'A' && u[len] <= 'Z' ? u[len] + 32 : u[len]);
    } else {
        for (i = 0; i < n;)
            cp[m++] = pd_uc_next(u, n, &i);
        for (size_t k = 0; k < m; k++) {
            uint32_t c = cp[k];
            if (c == 0x130) { /* the one code point whose lower case is two: i and a combining dot above */
                len += uc_put('i', o + len);
                c = 0x307;
            } else if (c == 0x3A3) { /* capital sigma: final (U+03C2) after a cased letter and not before one,
                                      * case-ignorable code points skipped both ways (Unicode's Final_Sigma) */
                size_t j = k;
                while (j > 0 && uc_case(cp[j - 1]) == 2)
                    j--;
                int final = j > 0 && uc_case(cp[j - 1]) == 1;
                for (j = k + 1; final && j < m && uc_case(cp[j]) == 2;)
                    j++;
                c = final && (j == m || uc_case(cp[j]) != 1) ? 0x3C2 : 0x3C3;
            } else {
                c = uc_lower1(c);
            }
            len += uc_put(c, o + len);
        }
    }
    o[len] = '\0';
    free(cp);
    *out = (char *)o;
    *outlen = len;
    return 0;
}

/* ---- One sample's extensions: a hash set, so a sample of a million members stays linear ----------------- */

typedef struct tar_exts {
    char *text;      /* the extensions, NUL-terminated, back to back */
    size_t len, cap;
    size_t *slots;   /* offset + 1 into text; 0 = empty */
    size_t nslots, used;
} tar_exts;

static uint64_t tar_hash(const char *s)
{
    uint64_t h = UINT64_C(1469598103934665603);
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(1099511628211);
    return h;
}

static void tar_exts_clear(tar_exts *x)
{
    x->len = 0;
    x->used = 0;
    if (x->nslots > 64) { /* a large sample passed: do not clear its table for every small one */
        free(x->slots);
        x->slots = NULL;
        x->nslots = 0;
    } else if (x->slots) {
        memset(x->slots, 0, x->nslots * sizeof *x->slots);
    }
}

static void tar_exts_place(tar_exts *x, size_t off)
{
    size_t i = tar_hash(x->text + off) & (x->nslots - 1);
    while (x->slots[i])
        i = (i + 1) & (x->nslots - 1);
    x->slots[i] = off + 1;
}

/* Add ext: 0 when new, 1 when the sample has it already, PD_ENOMEM. */
static int tar_exts_add(tar_exts *x, const char *ext)
{
    if (x->slots) {
        for (size_t i = tar_hash(ext) & (x->nslots - 1); x->slots[i]; i = (i + 1) & (x->nslots - 1))
            if (!strcmp(x->text + x->slots[i] - 1, ext))
                return 1;
    }
    size_t off;
    if (pd_layout_append_str(&x->text, &x->len, &x->cap, ext, &off))
        return PD_ENOMEM;
    if ((x->used + 1) * 2 > x->nslots) { /* grow and rehash: load stays ≤ 1/2 */
        size_t n = x->nslots ? x->nslots * 2 : 16;
        size_t *s = calloc(n, sizeof *s);
        if (!s)
            return PD_ENOMEM;
        free(x->slots);
        x->slots = s;
        x->nslots = n;
        for (size_t o = 0; o < off; o += strlen(x->text + o) + 1)
            tar_exts_place(x, o);
    }
    tar_exts_place(x, off);
    x->used++;
    return 0;
}

/* ---- Reading: our own callbacks, so data is seeked over and a short file shows as truncated ------------- */

typedef struct tar_src {
    int fd;
    uint64_t size, pos, bytes_read;
    char buf[TAR_BLOCK];
} tar_src;

static la_ssize_t tar_read(struct archive *a, void *data, const void **buf)
{
    tar_src *s = data;
    ssize_t n;
    do
        n = read(s->fd, s->buf, sizeof s->buf);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        archive_set_error(a, errno, "read failed: %s", strerror(errno));
        return -1;
    }
    s->pos += (uint64_t)n;
    s->bytes_read += (uint64_t)n;
    *buf = s->buf;
    return n;
}

/* Skip at most to the end of the file: libarchive reads for the rest, finds nothing, and reports
 * the tar as truncated (an lseek past the end would succeed and hide it). */
static la_int64_t tar_skip(struct archive *a, void *data, la_int64_t request)
{
    tar_src *s = data;
    uint64_t left = s->size > s->pos ? s->size - s->pos : 0;
    uint64_t n = (uint64_t)request < left ? (uint64_t)request : left;
    if (n && lseek(s->fd, (off_t)n, SEEK_CUR) < 0) {
        archive_set_error(a, errno, "seek failed: %s", strerror(errno));
        return ARCHIVE_FATAL;
    }
    s->pos += n;
    return (la_int64_t)n;
}

/* The state of one count: the current sample's key and extensions. */
typedef struct tar_count {
    const char *path;
    char *key;
    size_t keylen, keycap;
    int have_key;
    tar_exts exts;
    uint64_t samples;
    char *err;
    size_t errlen;
} tar_count;

/* One regular member: a new sample when its key differs from the last one's. */
static int tar_member(tar_count *t, const char *name)
{
    size_t keylen;
    const char *ext;
    if (pd_wds_is_meta(name) || !pd_wds_split(name, &keylen, &ext))
        return 0;
    if (!t->have_key || keylen != t->keylen || memcmp(name, t->key, keylen)) {
        if (keylen + 1 > t->keycap) {
            char *k = realloc(t->key, keylen + 1);
            if (!k)
                return pd_layout_fail(PD_ENOMEM, t->err, t->errlen, "%s: out of memory", t->path);
            t->key = k;
            t->keycap = keylen + 1;
        }
        memcpy(t->key, name, keylen);
        t->key[keylen] = '\0';
        t->keylen = keylen;
        t->have_key = 1;
        t->samples++;
        tar_exts_clear(&t->exts);
    }
    char *low;
    size_t lowlen;
    if (uc_lower(ext, strlen(ext), &low, &lowlen)) /* WebDataset lower-cases extensions: str.lower() */
        return pd_layout_fail(PD_ENOMEM, t->err, t->errlen, "%s: out of memory", t->path);
    /* __key__ and __url__ are fields of every WebDataset sample: a member with that extension collides */
    int rc = !strcmp(low, "__key__") || !strcmp(low, "__url__") ? 1 : tar_exts_add(&t->exts, low);
    if (rc == 1)
        rc = pd_layout_fail(PD_EINVAL, t->err, t->errlen,
                            "%s: member '%s' repeats the extension '%s' in sample '%s' (WebDataset raises on it)",
                            t->path, name, low, t->key);
    else if (rc)
        rc = pd_layout_fail(rc, t->err, t->errlen, "%s: out of memory", t->path);
    free(low);
    return rc;
}

/* An uncompressed tar ends with a zero block where its last member ends. libarchive also ends quietly at
 * the end of the file, so without this a tar cut exactly after a member's data would pass as a shorter
 * shard. (A compressed stream cut anywhere fails its own checks.) */
static int tar_check_end(struct archive *a, tar_src *src, const char *path, uint64_t members, char *err,
                         size_t errlen)
{
    unsigned char block[512];
    const la_int64_t end = archive_read_header_position(a); /* after ARCHIVE_EOF: where the next header was */
    if (archive_filter_code(a, 0) != ARCHIVE_FILTER_NONE)
        return 0;
    ssize_t n = end >= 0 ? pread(src->fd, block, sizeof block, (off_t)end) : -1;
    if (n > 0 && (uint64_t)end + (uint64_t)n > src->pos) /* libarchive read up to pos already (as a header) */
        src->bytes_read += (uint64_t)end + (uint64_t)n - (src->pos > (uint64_t)end ? src->pos : (uint64_t)end);
    int zero = n == (ssize_t)sizeof block;
    for (size_t i = 0; zero && i < sizeof block; i++)
        zero = block[i] == 0;
    if (!zero)
        return pd_layout_fail(PD_EIO, err, errlen, "%s: truncated after member %llu (no end-of-archive block)", path,
                              (unsigned long long)members);
    return 0;
}

int pd_layout_count_tar(const char *path, uint64_t *samples, uint64_t *bytes_read, char *err, size_t errlen)
{
    tar_src *src = malloc(sizeof *src);
    tar_count t = {.path = path, .err = err, .errlen = errlen};
    struct archive *a = NULL;
    struct stat st;
    uint64_t members = 0;
    int rc = 0;
    if (!src)
        return pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory", path);
    src->bytes_read = src->pos = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below); no effect on a file */
    if ((src->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0) {
        rc = pd_layout_fail(errno == ENOENT ? PD_ENOTFOUND : PD_EIO, err, errlen, "%s: %s", path, strerror(errno));
        goto done;
    }
    if (fstat(src->fd, &st) || !S_ISREG(st.st_mode)) {
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s: not a regular file", path);
        goto done;
    }
    src->size = (uint64_t)st.st_size;
    if (src->size == 0) {
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s: an empty file (0 bytes), not a tar shard", path);
        goto done;
    }
    if (!(a = archive_read_new())) {
        rc = pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory", path);
        goto done;
    }
    archive_read_support_format_tar(a); /* ustar, pax and GNU tar; nothing else */
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_bzip2(a);
    archive_read_support_filter_xz(a);
    archive_read_set_read_callback(a, tar_read);
    archive_read_set_skip_callback(a, tar_skip);
    archive_read_set_callback_data(a, src);
    if (archive_read_open1(a) != ARCHIVE_OK) {
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s: not a tar archive (%s)", path, archive_error_string(a));
        goto done;
    }
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(a, &e); /* seeks over the previous member's data first */
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) { /* a damaged header is ARCHIVE_RETRY: an error here too */
            const char *why = archive_error_string(a) ? archive_error_string(a) : "unknown error";
            rc = members ? pd_layout_fail(PD_EIO, err, errlen, "%s: truncated or damaged after member %llu (%s)", path,
                                          (unsigned long long)members, why)
                         : pd_layout_fail(PD_EINVAL, err, errlen, "%s: not a tar archive (%s)", path, why);
            goto done;
        }
        members++;
        /* tarfile's isreg(): regular files only; hard links, links, directories and devices are skipped */
        if (archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e))
            continue;
        const char *name = archive_entry_pathname_utf8(e);
        if (!name)
            name = archive_entry_pathname(e);
        if (name && (rc = tar_member(&t, name)))
            goto done;
    }
    if ((rc = tar_check_end(a, src, path, members, err, errlen)))
        goto done;
    if (t.samples == 0) {
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s: an empty shard: no samples in its %llu members", path,
                            (unsigned long long)members);
        goto done;
    }
    *samples = t.samples;
    if (bytes_read)
        *bytes_read = src->bytes_read;
done:
    if (a)
        archive_read_free(a);
    if (src->fd >= 0)
        close(src->fd);
    free(src);
    free(t.key);
    free(t.exts.text);
    free(t.exts.slots);
    return rc;
}
