/* WebDataset tar shards: samples counted as WebDataset reads them, from the tar headers alone. The headers are
 * read as Python's tarfile reads them (WebDataset iterates tarfile), not as libarchive would: the two differ on
 * name prefixes, invalid number fields, pax global headers and more. libarchive only decompresses. */
#include "layout_internal.h"

#include <archive.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/layout_unicode.h"
#include "core/error.h"

#define TAR_BLOCK 16384          /* bytes read at each header: the header plus what follows it */
#define TAR_EXT_MAX (1u << 20)   /* the data of one extended header (pax, GNU long name) */
#define TAR_CHAIN_MAX 64         /* headers before one member (tarfile recurses into each) */
#define TAR_SAMPLE_EXTS 65536    /* distinct extensions in one sample (kept to find a repeat) */
#define TAR_SAMPLE_EXT_BYTES (UINT64_C(1) << 24) /* and their bytes, all together */
#define TAR_HUGE (INT64_C(1) << 62) /* numbers saturate here: past any file, and no sum of two overflows */

/* ---- WebDataset's member names ---------------------------------------------------------------------- */

int pd_wds_split(const char *name, size_t len, size_t *keylen, const char **ext)
{
    /* WebDataset's re.match(r"^((?:.*SLASH|)[^.]+)[.]([^/]*)$"), SLASH being '/' (written out, it would end
     * this comment). The extension holds no '/', so its dot lies after
     * the last '/'; the key is some prefix P ("" or ending in '/', without '\n': '.' matches no newline) and
     * then a dot-free run up to the first dot after P. The engine tries the longest P first, "" last. */
    size_t last_slash = SIZE_MAX, first_nl = len, dot = SIZE_MAX;
    for (size_t i = 0; i < len; i++) {
        if (name[i] == '/')
            last_slash = i;
        else if (name[i] == '\n' && first_nl == len)
            first_nl = i;
    }
    for (size_t st = len + 1; st-- > 0;) {
        if (st < len && name[st] == '.')
            dot = st; /* the first dot at or after st */
        int candidate = st == 0 || (name[st - 1] == '/' && first_nl >= st);
        if (candidate && dot != SIZE_MAX && dot > st && (last_slash == SIZE_MAX || dot > last_slash)) {
            *keylen = dot;
            *ext = name + dot + 1;
            return 1;
        }
    }
    return 0;
}

int pd_wds_is_meta(const char *name, size_t len)
{
    if (len < 2 || name[0] != '_' || name[1] != '_')
        return 0;
    const char *sl = memchr(name, '/', len);
    if (!sl && name[len - 2] == '_' && name[len - 1] == '_') /* "__x__" (and "__", "___") */
        return 1;
    /* re.match(r"__[^/]*__($|/)"): "__" closing at the first '/' or the end, or before a final newline ('$') */
    size_t e = sl ? (size_t)(sl - name) : len;
    if (e >= 4 && name[e - 2] == '_' && name[e - 1] == '_')
        return 1;
    return !sl && len >= 5 && name[len - 1] == '\n' && name[len - 3] == '_' && name[len - 2] == '_';
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

/* ---- Python's int(), which tarfile applies to header fields and pax numbers ------------------------------- */

enum { PYINT_STR, PYINT_BYTES };

static int uc_in(const uint32_t *v, size_t n, uint32_t c)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == c)
            return 1;
    return 0;
}

/* int()'s input, one character at a time, read in place: its bytes (PYINT_BYTES), or the code points of the str
 * they decode to (PYINT_STR: UTF-8 with surrogateescape) as _PyUnicode_TransformDecimalAndSpaceToASCII makes
 * them: ASCII as it is, Unicode whitespace a blank, a Unicode decimal digit its ASCII one. Each code point is
 * one character, so no copy is needed (a copy cost a malloc, and its failure read as a number int() refuses). */
enum { PY_END = -1, PY_NOT = 256 }; /* past the end; a code point int() refuses wherever it stands */

typedef struct py_text {
    const unsigned char *s;
    size_t n, i; /* the input and where the next character starts */
    int mode;
} py_text;

/* The next character (PY_END at the end); *t moves past it when take. */
static int py_next(py_text *t, int take)
{
    size_t i = t->i;
    int ch;
    if (i >= t->n)
        return PY_END;
    if (t->mode == PYINT_BYTES) {
        ch = t->s[i++];
    } else {
        const size_t nzero = sizeof pd_uc_digit_zero / sizeof pd_uc_digit_zero[0];
        uint32_t c = pd_uc_next(t->s, t->n, &i);
        size_t k = 0;
        if (c < 127) {
            ch = (int)c;
        } else if (uc_in(pd_uc_space, sizeof pd_uc_space / sizeof pd_uc_space[0], c)) {
            ch = ' ';
        } else {
            while (k < nzero && !(c >= pd_uc_digit_zero[k] && c < pd_uc_digit_zero[k] + 10))
                k++;
            ch = k < nzero && !(c & PD_UC_BYTE) ? '0' + (int)(c - pd_uc_digit_zero[k]) : PY_NOT; /* PY_NOT: neither */
        }
    }
    if (take)
        t->i = i;
    return ch;
}

static int py_isspace(int c) /* Py_ISSPACE: what int() skips around a number */
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* int(s, base) for s bytes (PYINT_BYTES) or the str they decode to (PYINT_STR, where Unicode decimal digits and
 * blanks count as ASCII ones). 1 and *v (saturated at ±TAR_HUGE) where int() returns a number, 0 where it raises
 * ValueError. */
static int py_int(const unsigned char *s, size_t n, int mode, int base, int64_t *v)
{
    /* PyLong_FromString: blanks, a sign, base 8's optional "0o" (and one '_' after it), digits with single
     * underscores between them, blanks, and nothing else (a NUL included) */
    py_text t = {s, n, 0, mode};
    while (py_isspace(py_next(&t, 0)))
        py_next(&t, 1);
    int c = py_next(&t, 0), neg = c == '-';
    if (c == '-' || c == '+')
        py_next(&t, 1);
    if (base == 8 && py_next(&t, 0) == '0') {
        py_text o = t;
        py_next(&o, 1);
        if ((c = py_next(&o, 1)) == 'o' || c == 'O') {
            t = o;
            if (py_next(&t, 0) == '_')
                py_next(&t, 1);
        }
    }
    int64_t x = 0;
    size_t digits = 0;
    int under = 1; /* the last character was '_' (or nothing yet) */
    for (;; py_next(&t, 1)) {
        c = py_next(&t, 0);
        if (c == '_' && !under && digits) {
            under = 1;
            continue;
        }
        int d = c >= '0' && c <= '9' ? c - '0' : 99;
        if (d >= base)
            break;
        x = x > TAR_HUGE / base ? TAR_HUGE : x * base + d;
        digits++;
        under = 0;
    }
    if (!digits || under || (base == 10 && digits > 4300)) /* 4300: int()'s limit on decimal digits */
        return 0;
    while (py_isspace(py_next(&t, 0)))
        py_next(&t, 1);
    if (py_next(&t, 0) != PY_END)
        return 0;
    *v = x > TAR_HUGE ? TAR_HUGE : neg ? -x : x;
    return 1;
}

/* tarfile's nti(): a header number field. Base 256 after a 0x80 or 0xff byte, else octal text up to its first
 * NUL, ASCII only, str.strip()ped. 1 and *v, or 0 where tarfile raises InvalidHeaderError. */
static int tar_nti(const unsigned char *s, size_t n, int64_t *v)
{
    if (n && (s[0] == 0x80 || s[0] == 0xff)) { /* big-endian; 0xff: negative, -(bitwise NOT + 1) */
        const int neg = s[0] == 0xff;
        int64_t x = 0;
        for (size_t i = 1; i < n; i++) {
            x = x > (TAR_HUGE >> 8) ? TAR_HUGE : x * 256 + (neg ? (unsigned char)~s[i] : s[i]);
            if (x > TAR_HUGE)
                x = TAR_HUGE;
        }
        *v = neg ? -(x < TAR_HUGE ? x + 1 : TAR_HUGE) : x;
        return 1;
    }
    const unsigned char *end = memchr(s, 0, n);
    size_t len = end ? (size_t)(end - s) : n, a = 0;
    for (size_t i = 0; i < len; i++)
        if (s[i] >= 0x80)
            return 0;
    while (a < len && (py_isspace(s[a]) || (s[a] >= 0x1c && s[a] <= 0x1f))) /* str.isspace(), ASCII */
        a++;
    while (len > a && (py_isspace(s[len - 1]) || (s[len - 1] >= 0x1c && s[len - 1] <= 0x1f)))
        len--;
    if (a == len) {
        *v = 0;
        return 1;
    }
    return py_int(s + a, len - a, PYINT_BYTES, 8, v);
}

/* tarfile's _block(): count rounded up to whole blocks, flooring as Python's divmod does for a negative count. */
static int64_t tar_blocks(int64_t count)
{
    int64_t b = count / 512, r = count % 512;
    if (r < 0)
        b--, r += 512;
    return (b + (r != 0)) * 512;
}

/* ---- One sample's extensions: a hash set, so a sample of a million members stays linear ----------------- */

typedef struct tar_exts {
    char *text;      /* the extensions back to back, each its length (a size_t) then its bytes */
    size_t len, cap;
    size_t *slots;   /* offset + 1 into text; 0 = empty */
    size_t nslots, used;
} tar_exts;

static uint64_t tar_hash(const char *s, size_t n)
{
    uint64_t h = UINT64_C(1469598103934665603);
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * UINT64_C(1099511628211);
    return h;
}

static size_t tar_ext_len(const tar_exts *x, size_t off)
{
    size_t n;
    memcpy(&n, x->text + off, sizeof n);
    return n;
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
    size_t i = tar_hash(x->text + off + sizeof(size_t), tar_ext_len(x, off)) & (x->nslots - 1);
    while (x->slots[i])
        i = (i + 1) & (x->nslots - 1);
    x->slots[i] = off + 1;
}

/* Add ext[0..n): 0 when new, 1 when the sample has it already, PD_ENOMEM. */
static int tar_exts_add(tar_exts *x, const char *ext, size_t n)
{
    if (x->slots) {
        for (size_t i = tar_hash(ext, n) & (x->nslots - 1); x->slots[i]; i = (i + 1) & (x->nslots - 1))
            if (tar_ext_len(x, x->slots[i] - 1) == n && !memcmp(x->text + x->slots[i] - 1 + sizeof n, ext, n))
                return 1;
    }
    const size_t off = x->len, need = sizeof n + n;
    if (x->len + need > x->cap) {
        size_t c = x->cap ? x->cap : 256;
        while (c < x->len + need)
            c *= 2;
        char *t = realloc(x->text, c);
        if (!t)
            return PD_ENOMEM;
        x->text = t;
        x->cap = c;
    }
    memcpy(x->text + off, &n, sizeof n);
    memcpy(x->text + off + sizeof n, ext, n);
    x->len += need;
    if ((x->used + 1) * 2 > x->nslots) { /* grow and rehash: load stays ≤ 1/2 */
        size_t ns = x->nslots ? x->nslots * 2 : 16;
        size_t *s = calloc(ns, sizeof *s);
        if (!s)
            return PD_ENOMEM;
        free(x->slots);
        x->slots = s;
        x->nslots = ns;
        for (size_t o = 0; o < off; o += sizeof(size_t) + tar_ext_len(x, o))
            tar_exts_place(x, o);
    }
    tar_exts_place(x, off);
    x->used++;
    return 0;
}

/* ---- The tar's bytes: the file (read at each header, data skipped), or its decompressed stream ------------- */

typedef struct tar_src {
    const char *path;
    int fd;
    uint64_t size;       /* the file's */
    uint64_t bytes_read; /* from the file */
    int64_t pos;         /* the reader's position in the tar */
    /* uncompressed: a window of the file */
    unsigned char win[TAR_BLOCK];
    uint64_t win_at;
    size_t win_len;
    /* compressed: libarchive's raw reader decompresses */
    struct archive *z;
    const unsigned char *blk; /* the current decompressed block, at blk_at */
    size_t blk_len;
    uint64_t blk_at, total; /* decompressed bytes so far */
    int z_end;              /* 1 at the stream's end, -1 after an error (why says which) */
    int failed;             /* reading the file or the stream failed: why says how */
    char why[256];
} tar_src;

/* libarchive's read callback (the compressed case, and the bid on every file): the file in TAR_BLOCK reads. */
static la_ssize_t src_fill(struct archive *a, void *data, const void **buf)
{
    tar_src *s = data;
    ssize_t n;
    do
        n = read(s->fd, s->win, sizeof s->win);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        archive_set_error(a, errno, "read failed: %s", strerror(errno));
        return -1;
    }
    s->win_at = s->bytes_read;
    s->win_len = (size_t)n;
    s->bytes_read += (uint64_t)n;
    *buf = s->win;
    return n;
}

/* The next decompressed block; 0, or -1 with why set. */
static int src_next_block(tar_src *s)
{
    const void *b;
    size_t n;
    la_int64_t off;
    if (s->z_end)
        return s->z_end < 0 ? -1 : 0;
    int r = archive_read_data_block(s->z, &b, &n, &off);
    if (r == ARCHIVE_EOF) {
        s->z_end = 1;
        s->blk_at = s->total;
        s->blk_len = 0;
        return 0;
    }
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
        snprintf(s->why, sizeof s->why, "a damaged or cut compressed stream: %s",
                 archive_error_string(s->z) ? archive_error_string(s->z) : "the decompressor gave no reason");
        s->z_end = -1;
        s->failed = 1;
        return -1;
    }
    s->blk = b;
    s->blk_at = s->total;
    s->blk_len = n;
    s->total += n;
    return 0;
}

/* Read up to n bytes at pos (fewer at the end: Python's read()); the count, or -1 with why set. Compressed,
 * the stream only goes forward, as the Python reader's does. */
static ssize_t src_read(tar_src *s, void *out, size_t n)
{
    unsigned char *o = out;
    size_t got = 0;
    if (s->pos < 0) {
        snprintf(s->why, sizeof s->why, "a seek before the start of the tar");
        return -1;
    }
    while (got < n) {
        uint64_t at = (uint64_t)s->pos;
        if (!s->z) {
            if (at >= s->size)
                break;
            if (at < s->win_at || at >= s->win_at + s->win_len) { /* the block at this header */
                ssize_t r;
                do
                    r = pread(s->fd, s->win, sizeof s->win, (off_t)at);
                while (r < 0 && errno == EINTR);
                if (r < 0) {
                    snprintf(s->why, sizeof s->why, "read failed: %s", strerror(errno));
                    s->failed = 1;
                    return -1;
                }
                s->win_at = at;
                s->win_len = (size_t)r;
                s->bytes_read += (uint64_t)r;
                if (!r)
                    break;
            }
            size_t k = (size_t)(s->win_at + s->win_len - at) < n - got ? (size_t)(s->win_at + s->win_len - at)
                                                                           : n - got;
            memcpy(o + got, s->win + (at - s->win_at), k);
            got += k;
            s->pos += (int64_t)k;
            continue;
        }
        if (at < s->blk_at) {
            snprintf(s->why, sizeof s->why, "a seek backward in a compressed stream");
            return -1;
        }
        while (at >= s->blk_at + s->blk_len && !s->z_end)
            if (src_next_block(s))
                return -1;
        if (s->z_end < 0)
            return -1;
        if (at >= s->blk_at + s->blk_len)
            break; /* the end */
        size_t k = (size_t)(s->blk_at + s->blk_len - at) < n - got ? (size_t)(s->blk_at + s->blk_len - at) : n - got;
        memcpy(o + got, s->blk + (at - s->blk_at), k);
        got += k;
        s->pos += (int64_t)k;
    }
    return (ssize_t)got;
}

/* Whether the tar holds a byte at off - 1 (tarfile's check, before each header, that the data before it is
 * there); -1 on a read error. */
static int src_reaches(tar_src *s, int64_t off)
{
    if (off <= 0)
        return off == 0;
    if (!s->z)
        return (uint64_t)off <= s->size;
    while ((uint64_t)off > s->blk_at + s->blk_len && !s->z_end)
        if (src_next_block(s))
            return -1;
    return s->z_end < 0 ? -1 : (uint64_t)off <= s->blk_at + s->blk_len;
}

/* ---- Reading the headers as Python's tarfile does (TarFile.next, TarInfo.frombuf and _proc_*, 3.11) --------- */

/* The pax keywords that change what a member is read as (name, size, where the next header is); a dict's
 * insertion order matters, as _apply_pax_info applies them in it. */
enum { PAX_PATH, PAX_SPARSE_NAME, PAX_SIZE, PAX_SPARSE_SIZE, PAX_SPARSE_REALSIZE, PAX_SPARSE_MAP, PAX_SPARSE_MAJOR,
       PAX_SPARSE_MINOR, PAX_NKEYS };
static const char *const pax_keys[PAX_NKEYS] = {"path", "GNU.sparse.name", "size", "GNU.sparse.size",
                                                "GNU.sparse.realsize", "GNU.sparse.map", "GNU.sparse.major",
                                                "GNU.sparse.minor"};

/* One value, shared: a non-global header starts from a copy of the global dict, and a chain of 64 headers
 * copying 8 values of up to 1 MiB each would hold half a GiB (Python's dict.copy() shares its strings too). */
typedef struct pax_val {
    size_t refs, len;
    char text[]; /* len bytes and a NUL */
} pax_val;

typedef struct pax_dict {
    int order[PAX_NKEYS]; /* keys in insertion order */
    int n;
    pax_val *val[PAX_NKEYS]; /* NULL: absent */
} pax_dict;

static void pax_release(pax_val *v)
{
    if (v && --v->refs == 0)
        free(v);
}

static void pax_free(pax_dict *d)
{
    for (int k = 0; k < PAX_NKEYS; k++)
        pax_release(d->val[k]);
    memset(d, 0, sizeof *d);
}

static int pax_set(pax_dict *d, int k, const char *v, size_t n)
{
    pax_val *c = malloc(sizeof *c + n + 1);
    if (!c)
        return PD_ENOMEM;
    c->refs = 1;
    c->len = n;
    memcpy(c->text, v, n);
    c->text[n] = '\0';
    if (!d->val[k])
        d->order[d->n++] = k;
    pax_release(d->val[k]);
    d->val[k] = c;
    return 0;
}

/* to = from, its values shared. */
static void pax_copy(pax_dict *to, const pax_dict *from)
{
    *to = *from;
    for (int k = 0; k < PAX_NKEYS; k++)
        if (to->val[k])
            to->val[k]->refs++;
}

static int pax_is(const pax_dict *d, int k, const char *s)
{
    return d->val[k] && d->val[k]->len == strlen(s) && !memcmp(d->val[k]->text, s, d->val[k]->len);
}

/* A member as tarfile reads it (the fields counting needs). */
typedef struct tar_info {
    char *name; /* bytes: tarfile's str, surrogateescape-encoded */
    size_t name_len;
    char type;
    int64_t size;
    int64_t offset;      /* TarInfo.offset: its header's, or its first extended header's (not a global one's) */
    int64_t offset_data;
} tar_info;

/* How reading a header chain went: a member, or what tarfile would raise. HDR_* are its HeaderErrors, which
 * end the archive quietly where the chain starts (HDR_LATE: an InvalidHeaderError raised after the member
 * behind an extended header was read, which already moved tarfile.offset on); nested, they are
 * SubsequentHeaderError, raised. The first header of the tar not being one is "not a tar"; anything else
 * after it is damage. */
enum { TAR_OK = 0, HDR_EMPTY, HDR_TRUNCATED, HDR_ZEROS, HDR_INVALID, HDR_LATE, TAR_RAISE, TAR_NOMEM };

typedef struct tar_walk {
    tar_src *src;
    int64_t offset;   /* tarfile.offset: where the next header starts */
    pax_dict global;  /* tarfile.pax_headers */
    int depth;        /* headers in the current chain */
    int parsed;       /* a header has been read as one (so the tar is a tar) */
    unsigned char block[512]; /* the last header block read, and its length */
    size_t block_len;
    char why[256];    /* for TAR_RAISE */
} tar_walk;

static int walk_raise(tar_walk *w, const char *why)
{
    snprintf(w->why, sizeof w->why, "%s", why);
    return TAR_RAISE;
}

static int tar_isreg(char t)
{
    return t == '0' || t == '\0' || t == '7' || t == 'S';
}

static int tar_supported(char t)
{
    return tar_isreg(t) || (t >= '1' && t <= '6') || t == 'L' || t == 'K';
}

static int name_set(tar_info *ti, const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (!c)
        return TAR_NOMEM;
    memcpy(c, s, n);
    c[n] = '\0';
    free(ti->name);
    ti->name = c;
    ti->name_len = n;
    return 0;
}

static void name_rstrip_slashes(tar_info *ti, int all)
{
    while (ti->name_len && ti->name[ti->name_len - 1] == '/') {
        ti->name[--ti->name_len] = '\0';
        if (!all)
            break;
    }
}

/* Read n bytes (fewer at the end) into a new buffer: tarfile's fileobj.read(n) of an extended header's data. */
static int walk_read_data(tar_walk *w, int64_t n, unsigned char **out, size_t *got)
{
    *out = malloc(n > 0 ? (size_t)n : 1);
    if (!*out)
        return TAR_NOMEM;
    ssize_t r = n > 0 ? src_read(w->src, *out, (size_t)n) : 0;
    if (r < 0) {
        free(*out);
        *out = NULL;
        return walk_raise(w, w->src->why);
    }
    *got = (size_t)r;
    return 0;
}

static int walk_header(tar_walk *w, tar_info *ti);

/* _apply_pax_info: the dict's fields, in its order. */
static int pax_apply(tar_walk *w, const pax_dict *d, tar_info *ti)
{
    for (int i = 0; i < d->n; i++) {
        int k = d->order[i], rc = 0;
        int64_t v;
        switch (k) {
        case PAX_SPARSE_NAME:
            rc = name_set(ti, d->val[k]->text, d->val[k]->len);
            break;
        case PAX_PATH:
            rc = name_set(ti, d->val[k]->text, d->val[k]->len);
            name_rstrip_slashes(ti, 1);
            break;
        case PAX_SIZE: /* int(value), 0 where that fails */
            ti->size = py_int((const unsigned char *)d->val[k]->text, d->val[k]->len, PYINT_STR, 10, &v) ? v : 0;
            break;
        case PAX_SPARSE_SIZE:
        case PAX_SPARSE_REALSIZE: /* int(value), raising where that fails */
            if (!py_int((const unsigned char *)d->val[k]->text, d->val[k]->len, PYINT_STR, 10, &v))
                return walk_raise(w, "an invalid GNU.sparse size in a pax header");
            ti->size = v;
            break;
        default:
            break;
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* _proc_gnusparse_10: the map before a 1.0 sparse member's data, "count\n" then 2 * count numbers "n\n", each
 * int(bytes); a block is read when no newline is left, once per number. Numbers are checked, not kept. */
static int sparse_map(tar_walk *w, tar_info *next)
{
    unsigned char *b = malloc(1024); /* what is left holds no newline and is < 512 bytes when a block comes */
    size_t have = 0, at = 0;
    int64_t want = 1, x; /* numbers still to read, the count first */
    int rc = 0;
    if (!b)
        return TAR_NOMEM;
    for (int first = 1; !rc && want > 0; first = 0) {
        unsigned char *nl = memchr(b + at, '\n', have - at);
        if (first || !nl) { /* keep what is left, then one more block */
            memmove(b, b + at, have - at);
            have -= at;
            at = 0;
            ssize_t r = src_read(w->src, b + have, 512);
            if (r < 0) {
                rc = walk_raise(w, w->src->why);
                break;
            }
            have += (size_t)r;
            nl = memchr(b, '\n', have);
        }
        if (!nl || !py_int(b + at, (size_t)(nl - (b + at)), PYINT_BYTES, 10, &x))
            rc = walk_raise(w, "a cut or invalid GNU sparse map");
        else if (first)
            want = x > TAR_HUGE / 2 ? TAR_HUGE : 2 * x;
        else
            want--;
        at = nl ? (size_t)(nl - b) + 1 : at;
    }
    free(b);
    if (!rc)
        next->offset_data = w->src->pos;
    return rc;
}

/* _proc_gnusparse_01/_00/_10: only whether they raise, and where the data starts after a 1.0 map. */
static int pax_sparse(tar_walk *w, const pax_dict *d, const unsigned char *buf, size_t len, tar_info *next)
{
    int64_t v;
    if (d->val[PAX_SPARSE_MAP]) { /* [int(x) for x in map.split(",")] */
        const char *p = d->val[PAX_SPARSE_MAP]->text, *end = p + d->val[PAX_SPARSE_MAP]->len;
        for (;;) {
            const char *c = memchr(p, ',', (size_t)(end - p));
            if (!py_int((const unsigned char *)p, (size_t)((c ? c : end) - p), PYINT_STR, 10, &v))
                return walk_raise(w, "an invalid GNU.sparse.map in a pax header");
            if (!c)
                return 0;
            p = c + 1;
        }
    }
    if (d->val[PAX_SPARSE_SIZE]) { /* each GNU.sparse.offset / numbytes record of this header: int(value.decode()) */
        for (size_t pos = 0; pos < len && buf[pos];) {
            size_t nd = 0, length = 0;
            while (buf[pos + nd] >= '0' && buf[pos + nd] <= '9')
                length = length * 10 + (size_t)(buf[pos + nd++] - '0');
            const unsigned char *kv = buf + pos + nd + 1, *eq = memchr(kv, '=', pos + length - 1 - (pos + nd + 1));
            size_t kl = (size_t)(eq - kv), vl = (size_t)(buf + pos + length - 1 - (eq + 1));
            if ((kl == 17 && !memcmp(kv, "GNU.sparse.offset", kl)) || (kl == 19 && !memcmp(kv, "GNU.sparse.numbytes", kl))) {
                int utf8 = 1; /* value.decode() is strict */
                for (size_t i = 0; i < vl && utf8;)
                    utf8 = !(pd_uc_next(eq + 1, vl, &i) & PD_UC_BYTE);
                if (!utf8 || !py_int(eq + 1, vl, PYINT_STR, 10, &v)) { /* InvalidHeaderError */
                    snprintf(w->why, sizeof w->why, "an invalid GNU.sparse offset or size in a pax header");
                    return HDR_LATE;
                }
            }
            pos += length;
        }
        return 0;
    }
    if (pax_is(d, PAX_SPARSE_MAJOR, "1") && pax_is(d, PAX_SPARSE_MINOR, "0"))
        return sparse_map(w, next);
    return 0;
}

/* _proc_pax: an extended (x, X) or global (g) header's records, then the member they describe. */
static int walk_pax(tar_walk *w, tar_info *self, tar_info *next)
{
    unsigned char *buf = NULL;
    size_t len = 0; /* set by walk_read_data, as in walk_gnulong */
    int rc = walk_read_data(w, tar_blocks(self->size), &buf, &len);
    if (rc)
        return rc;
    pax_dict local, *d = &w->global;
    if (self->type != 'g') {
        pax_copy(&local, &w->global);
        d = &local;
    }
    for (size_t pos = 0; !rc && pos < len && buf[pos];) { /* "%d %s=%s\n" records */
        size_t nd = 0;
        uint64_t length = 0;
        while (nd < 21 && pos + nd < len && buf[pos + nd] >= '0' && buf[pos + nd] <= '9') { /* ([0-9]{1,20}) */
            const uint64_t digit = (uint64_t)(buf[pos + nd++] - '0'); /* counted past saturation too */
            length = length > (UINT64_C(1) << 40) ? length : length * 10 + digit; /* > any 1 MiB header */
        }
        if (nd == 0 || nd > 20 || pos + nd >= len || buf[pos + nd] != ' ' || length < 5 || length > len - pos) {
            rc = walk_raise(w, "an invalid pax header");
            break;
        }
        const size_t end = pos + (size_t)length - 1, kv = pos + nd + 1;
        const unsigned char *eq = kv < end ? memchr(buf + kv, '=', end - kv) : NULL;
        if (!eq || eq == buf + kv || buf[end] != '\n') {
            rc = walk_raise(w, "an invalid pax header");
            break;
        }
        const size_t kl = (size_t)(eq - (buf + kv));
        for (int k = 0; k < PAX_NKEYS; k++)
            if (strlen(pax_keys[k]) == kl && !memcmp(buf + kv, pax_keys[k], kl))
                rc = pax_set(d, k, (const char *)eq + 1, (size_t)(buf + end - (eq + 1))) ? TAR_NOMEM : 0;
        pos += (size_t)length;
    }
    if (!rc) {
        rc = walk_header(w, next);
        if (rc >= HDR_EMPTY && rc <= HDR_LATE) /* SubsequentHeaderError */
            rc = walk_raise(w, "a damaged header after an extended header");
    }
    if (!rc)
        rc = pax_sparse(w, d, buf, len, next);
    if (!rc && self->type != 'g') {
        next->offset = self->offset;
        rc = pax_apply(w, d, next);
        if (!rc && d->val[PAX_SIZE]) /* the size was replaced: the next header moves */
            w->offset = next->offset_data +
                        (tar_isreg(next->type) || !tar_supported(next->type) ? tar_blocks(next->size) : 0);
    }
    if (d == &local)
        pax_free(&local);
    free(buf);
    return rc;
}

/* _proc_gnulong: a GNU long name (L) or link name (K), then the member it belongs to. */
static int walk_gnulong(tar_walk *w, tar_info *self, tar_info *next)
{
    unsigned char *buf = NULL;
    size_t len = 0; /* set by walk_read_data; a newer gcc cannot tell (-Wmaybe-uninitialized) */
    int rc = walk_read_data(w, tar_blocks(self->size), &buf, &len);
    if (rc)
        return rc;
    rc = walk_header(w, next);
    if (rc >= HDR_EMPTY && rc <= HDR_LATE)
        rc = walk_raise(w, "a damaged header after a GNU long name");
    next->offset = self->offset;
    if (!rc && self->type == 'L') {
        const unsigned char *nul = memchr(buf, 0, len);
        rc = name_set(next, (const char *)buf, nul ? (size_t)(nul - buf) : len);
    }
    if (!rc && next->type == '5')
        name_rstrip_slashes(next, 0); /* removesuffix("/") */
    free(buf);
    return rc;
}

/* _proc_sparse: an old GNU sparse member; its extension blocks are read (and checked) as tarfile does. */
static int walk_sparse(tar_walk *w, tar_info *self, int isextended, int64_t origsize)
{
    unsigned char b[512];
    int64_t v;
    while (isextended) {
        ssize_t n = src_read(w->src, b, sizeof b);
        if (n < 0)
            return walk_raise(w, w->src->why);
        for (size_t i = 0, pos = 0; i < 21; i++, pos += 24) { /* nti() of each field; nti(b"") raises */
            for (size_t f = pos; f < pos + 24; f += 12) {
                size_t k = f < (size_t)n ? ((size_t)n - f < 12 ? (size_t)n - f : 12) : 0;
                if (!k || !tar_nti(b + f, k, &v))
                    return walk_raise(w, k ? "an invalid GNU sparse header" : "a cut GNU sparse header");
            }
        }
        if (n <= 504)
            return walk_raise(w, "a cut GNU sparse header");
        isextended = b[504] != 0;
    }
    self->offset_data = w->src->pos;
    w->offset = self->offset_data + tar_blocks(self->size);
    self->size = origsize;
    return 0;
}

/* fromtarfile(): one header block read and decoded (frombuf), then processed by its type. */
static int walk_header(tar_walk *w, tar_info *ti)
{
    unsigned char *h = w->block;
    int64_t chk, v, size, origsize = 0;
    ssize_t n = src_read(w->src, h, 512);
    if (n < 0)
        return walk_raise(w, w->src->why);
    w->block_len = (size_t)n;
    if (n == 0)
        return HDR_EMPTY;
    if (n != 512)
        return HDR_TRUNCATED;
    size_t z = 0;
    while (z < 512 && !h[z])
        z++;
    if (z == 512)
        return HDR_ZEROS;
    int64_t sum_u = 256, sum_s = 256;
    for (size_t i = 0; i < 512; i++)
        if (i < 148 || i >= 156)
            sum_u += h[i], sum_s += (signed char)h[i];
    if (!tar_nti(h + 148, 8, &chk) || (chk != sum_u && chk != sum_s))
        return HDR_INVALID;
    static const size_t fields[][2] = {{100, 8}, {108, 8}, {116, 8}, {136, 12}, {329, 8}, {337, 8}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!tar_nti(h + fields[i][0], fields[i][1], &v))
            return HDR_INVALID;
    if (!tar_nti(h + 124, 12, &size))
        return HDR_INVALID;
    char type = (char)h[156];
    int isextended = 0;
    if (type == 'S') { /* four sparse fields, each two numbers, then isextended and the real size */
        for (size_t f = 386; f < 482; f += 12)
            if (!tar_nti(h + f, 12, &v))
                return HDR_INVALID;
        isextended = h[482] != 0;
        if (!tar_nti(h + 483, 12, &origsize))
            return HDR_INVALID;
    }
    w->parsed = 1; /* (both set where Python's _proc_member is entered: after the header parsed) */
    if (++w->depth > TAR_CHAIN_MAX)
        return walk_raise(w, "more than 64 headers in a row before a member");
    const unsigned char *nul = memchr(h, 0, 100), *pnul = memchr(h + 345, 0, 155);
    size_t nlen = nul ? (size_t)(nul - h) : 100, plen = pnul ? (size_t)(pnul - (h + 345)) : 155;
    if (name_set(ti, (const char *)h, nlen))
        return TAR_NOMEM;
    ti->offset = w->src->pos - 512;
    ti->type = type;
    ti->size = size;
    if (type == '\0' && nlen && h[nlen - 1] == '/') /* an old directory: a file named with a trailing slash */
        ti->type = type = '5';
    if (type == '5')
        name_rstrip_slashes(ti, 1);
    if (plen && type != 'L' && type != 'K' && type != 'S') { /* the ustar prefix, whatever the header's magic */
        char *full = malloc(plen + 1 + ti->name_len + 1);
        if (!full)
            return TAR_NOMEM;
        memcpy(full, h + 345, plen);
        full[plen] = '/';
        memcpy(full + plen + 1, ti->name, ti->name_len + 1);
        free(ti->name);
        ti->name = full;
        ti->name_len += plen + 1;
    }
    /* _proc_member */
    if (type == 'L' || type == 'K' || type == 'x' || type == 'g' || type == 'X') {
        if (size < 0 || size > TAR_EXT_MAX) /* both refuse it (Python's read would take the rest of the file) */
            return walk_raise(w, size < 0 ? "an extended header of a negative size"
                                          : "an extended header of more than 1 MiB");
        tar_info next = {0};
        int rc = type == 'L' || type == 'K' ? walk_gnulong(w, ti, &next) : walk_pax(w, ti, &next);
        free(ti->name);
        *ti = next;
        return rc;
    }
    if (type == 'S')
        return walk_sparse(w, ti, isextended, origsize);
    ti->offset_data = w->src->pos; /* _proc_builtin */
    w->offset = ti->offset_data + (tar_isreg(type) || !tar_supported(type) ? tar_blocks(size) : 0);
    int rc = pax_apply(w, &w->global, ti);
    if (!rc && ti->type == '5')
        name_rstrip_slashes(ti, 1);
    return rc;
}

/* TarFile.next(): TAR_OK and a member, HDR_* where tarfile stops (the block at w->offset, in w->block, says
 * whether cleanly), TAR_RAISE or TAR_NOMEM. */
static int walk_next(tar_walk *w, tar_info *ti)
{
    w->depth = 0;
    memset(ti, 0, sizeof *ti);
    if (w->offset != w->src->pos) { /* seek(offset - 1); read(1): the data before the header must be there */
        if (w->src->z && w->offset < w->src->pos)
            return walk_raise(w, "a seek backward in a compressed stream");
        int r = src_reaches(w->src, w->offset);
        if (r <= 0)
            return walk_raise(w, r < 0 ? w->src->why : "unexpected end of data");
        w->src->pos = w->offset;
    }
    return walk_header(w, ti);
}

/* ---- Grouping members into samples, as WebDataset's group_by_keys does ----------------------------------- */

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
static int tar_member(tar_count *t, const char *name, size_t len)
{
    size_t keylen;
    const char *ext;
    if (pd_wds_is_meta(name, len) || !pd_wds_split(name, len, &keylen, &ext))
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
    if (uc_lower(ext, (size_t)(name + len - ext), &low, &lowlen)) /* WebDataset lower-cases extensions: str.lower() */
        return pd_layout_fail(PD_ENOMEM, t->err, t->errlen, "%s: out of memory", t->path);
    /* __key__ and __url__ are fields of every WebDataset sample: a member with that extension collides */
    int rc = (lowlen == 7 && (!memcmp(low, "__key__", 7) || !memcmp(low, "__url__", 7)))
                 ? 1
                 : tar_exts_add(&t->exts, low, lowlen);
    /* A sample's extensions are kept to find a repeat: bounded, where a 2 KB bzip2 of 300 members of 1 MiB
     * extensions (pax paths) took 300 MB. No WebDataset sample comes near: its fields are a dict. */
    if (rc == 0 && (t->exts.used > TAR_SAMPLE_EXTS || t->exts.len - t->exts.used * sizeof(size_t) > TAR_SAMPLE_EXT_BYTES))
        rc = pd_layout_fail(PD_EINVAL, t->err, t->errlen,
                            "%s: sample '%s' has more than %u extensions or %llu bytes of them: not a WebDataset "
                            "sample", t->path, t->key, TAR_SAMPLE_EXTS, (unsigned long long)TAR_SAMPLE_EXT_BYTES);
    else if (rc == 1)
        rc = pd_layout_fail(PD_EINVAL, t->err, t->errlen,
                            "%s: member '%s' repeats the extension '%s' in sample '%s' (WebDataset raises on it)",
                            t->path, name, low, t->key);
    else if (rc)
        rc = pd_layout_fail(rc, t->err, t->errlen, "%s: out of memory", t->path);
    free(low);
    return rc;
}

/* Where tarfile raised: a read error or a first block that is no tar header (not a tar), or damage after it. */
static int walk_failed(const tar_walk *w, int r, uint64_t members, char *err, size_t errlen)
{
    const tar_src *src = w->src;
    const char *why = r == TAR_RAISE     ? w->why
                      : r == HDR_EMPTY     ? "empty file"
                      : r == HDR_TRUNCATED ? "truncated header"
                                           : "invalid header";
    if (src->failed)
        return pd_layout_fail(PD_EIO, err, errlen, "%s: %s", src->path, src->why);
    if (w->parsed)
        return pd_layout_fail(PD_EIO, err, errlen, "%s: truncated or damaged after member %llu (%s)", src->path,
                              (unsigned long long)members, why);
    return pd_layout_fail(PD_EINVAL, err, errlen, "%s: not a tar archive (%s)", src->path, why);
}

/* HDR_LATE: tarfile stopped where its offset had moved to, past the block it failed on; the block there says how
 * it stopped (*r: HDR_EMPTY, HDR_TRUNCATED, HDR_ZEROS or HDR_INVALID). 0 or PD_EIO. */
static int walk_block_at_offset(tar_walk *w, int *r, char *err, size_t errlen)
{
    tar_src *src = w->src;
    if (src->z && w->offset < src->pos)
        return pd_layout_fail(PD_EIO, err, errlen, "%s: a seek backward in a compressed stream", src->path);
    src->pos = w->offset;
    ssize_t n = src_read(src, w->block, 512);
    if (n < 0)
        return pd_layout_fail(PD_EIO, err, errlen, "%s: %s", src->path, src->why);
    size_t z = 0;
    while (z < (size_t)n && !w->block[z])
        z++;
    *r = n == 0 ? HDR_EMPTY : n < 512 ? HDR_TRUNCATED : z == 512 ? HDR_ZEROS : HDR_INVALID;
    return 0;
}

/* Where tarfile stopped quietly (r: HDR_*): cleanly only at a zero block where a header would be. */
static int walk_stopped(const tar_walk *w, int r, uint64_t members, char *err, size_t errlen)
{
    if (r == HDR_ZEROS)
        return 0;
    if (r == HDR_EMPTY) /* every tar writer writes one: this tar was cut right after a member */
        return pd_layout_fail(PD_EIO, err, errlen, "%s: truncated after member %llu (no end-of-archive block)",
                              w->src->path, (unsigned long long)members);
    return pd_layout_fail(PD_EIO, err, errlen, "%s: truncated or damaged after member %llu (%s)", w->src->path,
                          (unsigned long long)members, r == HDR_TRUNCATED ? "truncated header" : "invalid header");
}

/* Read the tar's members and group them. */
static int tar_walk_all(tar_src *src, tar_count *t, uint64_t *members, char *err, size_t errlen)
{
    tar_walk w = {.src = src};
    tar_info ti = {0};
    int rc = 0;
    for (;;) {
        int r = walk_next(&w, &ti);
        if (r == TAR_NOMEM) {
            rc = pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory", src->path);
            break;
        }
        if (r == TAR_RAISE || (r != TAR_OK && r != HDR_ZEROS && r != HDR_LATE && !w.parsed)) {
            rc = walk_failed(&w, r, *members, err, errlen);
            break;
        }
        if (r == HDR_LATE && (rc = walk_block_at_offset(&w, &r, err, errlen)))
            break;
        if (r != TAR_OK) {
            rc = walk_stopped(&w, r, *members, err, errlen);
            break;
        }
        ++*members;
        if (w.offset <= ti.offset) { /* a negative size: tarfile would read this header again, for ever */
            rc = pd_layout_fail(PD_EIO, err, errlen, "%s: member %llu ('%s') does not advance the archive",
                                src->path, (unsigned long long)*members, ti.name);
            break;
        }
        /* tarfile's isreg(): regular files only; links, directories, devices and unknown types skipped */
        if (tar_isreg(ti.type) && (rc = tar_member(t, ti.name, ti.name_len)))
            break;
        free(ti.name);
        ti.name = NULL;
    }
    free(ti.name);
    pax_free(&w.global);
    return rc;
}

/* ---- A compressed shard must be whole ---------------------------------------------------------------------- */

/* The stream read to its end (libarchive's checks: bzip2's and xz's own CRCs, cut streams, xz's padding), then
 * the bytes after the last stream, which must be zeros. PD_EIO naming what is wrong. gzip's CRC-32 and length
 * are not checked: libarchive reads a gzip of several members (bgzip's, concatenated files) as one stream and
 * shows no member's trailer, and refusing such valid shards costs more than counting a shard whose damage
 * left its tar whole (Python's reader agrees). */
static int tar_verify(tar_src *s, char *err, size_t errlen)
{
    while (!s->z_end)
        if (src_next_block(s))
            break;
    if (s->z_end < 0)
        return pd_layout_fail(PD_EIO, err, errlen, "%s: %s", s->path, s->why);
    const uint64_t used = (uint64_t)archive_filter_bytes(s->z, archive_filter_count(s->z) - 1);
    unsigned char b[4096];
    for (uint64_t at = used; at < s->size;) { /* what follows the compressed data */
        ssize_t n = pread(s->fd, b, at + sizeof b < s->size ? sizeof b : (size_t)(s->size - at), (off_t)at);
        if (n <= 0)
            return pd_layout_fail(PD_EIO, err, errlen, "%s: read failed: %s", s->path, n ? strerror(errno) : "cut");
        s->bytes_read += (uint64_t)n;
        for (ssize_t i = 0; i < n; i++)
            if (b[i])
                return pd_layout_fail(PD_EIO, err, errlen,
                                      "%s: %llu bytes after the compressed data that are not zeros (junk, or a "
                                      "second stream of another kind)",
                                      s->path, (unsigned long long)(s->size - used));
        at += (uint64_t)n;
    }
    return 0;
}

/* libarchive bids: gzip, bzip2, xz or lzma (layer upon layer), else the file as it is. A plain tar leaves
 * *a NULL (its headers are read where they are); a compressed one is src->z = *a, positioned at its data, with
 * *nested set when it holds a second layer. 0, or PD_ENOMEM / PD_EIO naming the file. */
static int src_open_filters(tar_src *src, struct archive **a, int *nested, char *err, size_t errlen)
{
    const char *path = src->path;
    if (!(*a = archive_read_new()))
        return pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory", path);
    archive_read_support_format_raw(*a);
    archive_read_support_format_empty(*a); /* a stream that decompresses to nothing */
    archive_read_support_filter_gzip(*a);
    archive_read_support_filter_bzip2(*a);
    archive_read_support_filter_xz(*a);
    archive_read_support_filter_lzma(*a);
    archive_read_set_read_callback(*a, src_fill);
    archive_read_set_callback_data(*a, src);
    if (archive_read_open1(*a) != ARCHIVE_OK) /* the raw format takes any bytes: a decompressor failed */
        return pd_layout_fail(PD_EIO, err, errlen, "%s: a damaged or cut compressed stream: %s", path,
                              archive_error_string(*a) ? archive_error_string(*a)
                                                       : "the decompressor gave no reason");
    if (archive_filter_code(*a, 0) == ARCHIVE_FILTER_NONE) { /* a plain tar */
        archive_read_free(*a);
        *a = NULL;
        return 0;
    }
    struct archive_entry *e;
    src->z = *a;
    *nested = archive_filter_count(*a) > 2;
    int r = archive_read_next_header(*a, &e);
    if (r == ARCHIVE_EOF) /* the empty format: nothing inside */
        src->z_end = 1;
    else if (r != ARCHIVE_OK && r != ARCHIVE_WARN) { /* the verdict comes from tar_verify */
        snprintf(src->why, sizeof src->why, "a damaged or cut compressed stream: %s",
                 archive_error_string(*a) ? archive_error_string(*a) : "the decompressor gave no reason");
        src->z_end = -1;
        src->failed = 1;
    }
    return 0;
}

int pd_layout_count_tar(const char *path, uint64_t *samples, uint64_t *bytes_read, char *err, size_t errlen)
{
    tar_src *src = calloc(1, sizeof *src);
    tar_count t = {.path = path, .err = err, .errlen = errlen};
    struct archive *a = NULL;
    struct stat st;
    uint64_t members = 0;
    int rc = 0, nested = 0;
    if (!src)
        return pd_layout_fail(PD_ENOMEM, err, errlen, "%s: out of memory", path);
    src->path = path;
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
    if ((rc = src_open_filters(src, &a, &nested, err, errlen)))
        goto done;
    if (!nested)
        rc = tar_walk_all(src, &t, &members, err, errlen);
    if (src->z && rc != PD_ENOMEM) { /* a broken stream is the verdict, whatever was read from it */
        int v = tar_verify(src, err, errlen);
        if (v)
            rc = v;
        else if (nested)
            rc = pd_layout_fail(PD_EINVAL, err, errlen,
                                "%s: compressed twice (%s inside %s): WebDataset decompresses one layer", path,
                                archive_filter_name(a, 0), archive_filter_name(a, 1));
    }
    if (!rc && t.samples == 0)
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s: an empty shard: no samples in its %llu members", path,
                            (unsigned long long)members);
    if (!rc)
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
