/* MosaicML Streaming (MDS) index.json: shard sample counts and basenames, parsed with jansson and checked strictly. */
#include "layout_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* Arrays and objects nested deeper than this are refused (PD_EINVAL) by C and Python alike. */
#define MDS_DEPTH_MAX 512

/* The shard formats a version-2 index may list (Streaming's readers); all count samples alike. */
static const char *const mds_formats[] = {"mds", "csv", "tsv", "xsv", "json"};

typedef struct mds_ctx {
    const char *index; /* the index file, for messages */
    char *dir;         /* its directory, where shard files would lie */
    char *err;
    size_t errlen;
    uint64_t bytes_read;
} mds_ctx;

/* Fail naming the index and shard i. */
#define MDS_FAIL(c, code, i, fmt, ...)                                                                    \
    pd_layout_fail(code, (c)->err, (c)->errlen, "%s: shard %zu: " fmt, (c)->index, (size_t)(i), __VA_ARGS__)

/* obj[key] as an integer in [0, max]; 0 or a typed error. */
static int mds_uint(mds_ctx *c, size_t i, const json_t *obj, const char *key, uint64_t max, uint64_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return MDS_FAIL(c, PD_EINVAL, i, "no \"%s\"", key);
    if (!json_is_integer(v))
        return MDS_FAIL(c, PD_EINVAL, i, "\"%s\" is not an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < 0)
        return MDS_FAIL(c, PD_EINVAL, i, "\"%s\" is negative (%" JSON_INTEGER_FORMAT ")", key, x);
    if ((uint64_t)x > max)
        return MDS_FAIL(c, PD_EOVERFLOW, i, "\"%s\" is %" JSON_INTEGER_FORMAT ", more than %" PRIu64 " %s", key, x,
                        max, max == UINT32_MAX ? "(an MDS shard counts its samples in 32 bits)" : "");
    *out = (uint64_t)x;
    return 0;
}

/* A basename must stay inside the dataset's directory, as Streaming joins it to it, and name its file one
 * way only: every part a name, none empty, "." or "..", so that a.mds and ./a.mds cannot both be listed. */
static int mds_name_ok(const char *s)
{
    if (!*s)
        return 0;
    for (const char *p = s;;) {
        const char *end = strchr(p, '/');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        if (!end)
            return 1;
        p = end + 1;
    }
}

/* raw_data / zip_data: {"basename": non-empty string inside the directory, "bytes": integer}. */
static int mds_file(mds_ctx *c, size_t i, const json_t *shard, const char *key, const char **name, uint64_t *bytes)
{
    json_t *f = json_object_get(shard, key);
    const char *s;
    *name = NULL;
    if (!f)
        return MDS_FAIL(c, PD_EINVAL, i, "no \"%s\"", key);
    if (json_is_null(f) && strcmp(key, "raw_data"))
        return 0;
    if (!json_is_object(f))
        return MDS_FAIL(c, PD_EINVAL, i, "\"%s\" is not an object", key);
    if (!(s = json_string_value(json_object_get(f, "basename"))))
        return MDS_FAIL(c, PD_EINVAL, i, "\"%s\" has no \"basename\" string", key);
    if (!mds_name_ok(s))
        return MDS_FAIL(c, PD_EINVAL, i, "\"%s\".basename '%s' is not a plain relative path inside the dataset's directory",
                        key, s);
    int rc = mds_uint(c, i, f, "bytes", UINT64_MAX, bytes);
    if (rc)
        return rc;
    *name = s;
    return 0;
}

/* When the shard's file lies next to the index: its size must be the index's, and an MDS file's
 * first 4 bytes (its sample count, little-endian) the shard's samples. 1 when it was there. */
static int mds_check_file(mds_ctx *c, size_t i, const char *name, uint64_t bytes, uint64_t samples, int header)
{
    char *path = malloc(strlen(c->dir) + strlen(name) + 2);
    struct stat st;
    int rc = 0, fd = -1;
    if (!path)
        return MDS_FAIL(c, PD_ENOMEM, i, "%s", "out of memory");
    sprintf(path, "%s/%s", c->dir, name);
    if (lstat(path, &st)) /* not there: an index may be registered away from its shards */
        goto done;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) {
        rc = MDS_FAIL(c, PD_EINVAL, i, "%s is not a regular file", path);
        goto done;
    }
    rc = 1;
    if ((uint64_t)st.st_size != bytes) {
        rc = MDS_FAIL(c, PD_EINVAL, i, "%s is %lld bytes but the index lists %" PRIu64 " (a partial or stale file?)",
                      path, (long long)st.st_size, bytes);
        goto done;
    }
    if (!header)
        goto done;
    unsigned char b[4];
    /* Non-blocking, and checked again once open: a file swapped for a FIFO since the stat above would hold the
     * open (and the read) until something wrote to it. */
    struct stat opened;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) >= 0 && (fstat(fd, &opened) || !S_ISREG(opened.st_mode))) {
        rc = MDS_FAIL(c, PD_EINVAL, i, "%s is not a regular file", path);
        goto done;
    }
    ssize_t got = fd < 0 ? -1 : read(fd, b, 4);
    if (got < 0) {
        rc = MDS_FAIL(c, PD_EIO, i, "%s: cannot read its header: %s", path, strerror(errno));
        goto done;
    }
    if (got != 4) { /* the index lists so few bytes: malformed, as a wrong count is */
        rc = MDS_FAIL(c, PD_EINVAL, i, "%s is %zd bytes, too short for its header (4 bytes: the sample count)",
                      path, got);
        goto done;
    }
    c->bytes_read += 4;
    uint64_t n = (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 | (uint64_t)b[3] << 24;
    if (n != samples)
        rc = MDS_FAIL(c, PD_EINVAL, i, "%s holds %" PRIu64 " samples but the index lists %" PRIu64, path, n, samples);
done:
    if (fd >= 0)
        close(fd);
    free(path);
    return rc;
}

/* "version": 2, the only one Streaming writes and reads. where: "" or "shard N: ". */
static int mds_version(mds_ctx *c, const json_t *obj, const char *where)
{
    json_t *v = json_object_get(obj, "version");
    if (json_is_integer(v) && json_integer_value(v) == 2)
        return 0;
    if (!json_is_integer(v))
        return pd_layout_fail(PD_EINVAL, c->err, c->errlen, "%s: %s\"version\" is %s", c->index, where,
                              v ? "not an integer" : "missing");
    return pd_layout_fail(PD_EUNSUPPORTED, c->err, c->errlen,
                          "%s: %s\"version\" is %" JSON_INTEGER_FORMAT "; this reader knows MDS index version 2",
                          c->index, where, json_integer_value(v));
}

/* One shard's entry: checked, then appended to l. */
static int mds_shard(mds_ctx *c, size_t i, const json_t *shard, pd_layout *l)
{
    if (!json_is_object(shard))
        return MDS_FAIL(c, PD_EINVAL, i, "%s", "not an object");
    char where[48];
    snprintf(where, sizeof where, "shard %zu: ", i);
    int rc = mds_version(c, shard, where);
    if (rc)
        return rc;
    const char *format = json_string_value(json_object_get(shard, "format"));
    if (!format)
        return MDS_FAIL(c, PD_EINVAL, i, "%s", "no \"format\" string");
    size_t f = 0;
    while (f < sizeof mds_formats / sizeof mds_formats[0] && strcmp(format, mds_formats[f]))
        f++;
    if (f == sizeof mds_formats / sizeof mds_formats[0])
        return MDS_FAIL(c, PD_EUNSUPPORTED, i, "format '%s' is none of mds, csv, tsv, xsv, json", format);
    int mds = f == 0;
    uint64_t samples, raw_bytes = 0, zip_bytes = 0;
    const char *raw, *zip;
    rc = mds_uint(c, i, shard, "samples", mds ? UINT32_MAX : UINT64_MAX, &samples);
    if (!rc)
        rc = mds_file(c, i, shard, "raw_data", &raw, &raw_bytes);
    if (!rc)
        rc = mds_file(c, i, shard, "zip_data", &zip, &zip_bytes);
    if (rc)
        return rc;
    json_t *comp = json_object_get(shard, "compression");
    if (comp && !json_is_null(comp) != (zip != NULL))
        return MDS_FAIL(c, PD_EINVAL, i, "\"compression\" is %s but \"zip_data\" is %s", json_is_null(comp) ? "null" : "set",
                        zip ? "set" : "null");
    if (samples == 0)
        return MDS_FAIL(c, PD_EINVAL, i, "%s is an empty shard (\"samples\": 0)", raw);
    rc = mds_check_file(c, i, raw, raw_bytes, samples, mds);
    if (rc >= 0 && zip)
        rc = mds_check_file(c, i, zip, zip_bytes, samples, 0);
    if (rc < 0)
        return rc;
    char *at = malloc(strlen(c->index) + sizeof where + 2);
    if (!at)
        return MDS_FAIL(c, PD_ENOMEM, i, "%s", "out of memory");
    sprintf(at, "%s: shard %zu", c->index, i);
    rc = pd_layout_add(l, samples, raw, at, c->err, c->errlen);
    free(at);
    return rc;
}

static int mds_cmp_path(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Two shards naming one file would count its samples twice. */
static int mds_unique(mds_ctx *c, const pd_layout *l)
{
    const char **names = malloc(l->n * sizeof *names);
    int rc = 0;
    if (!names)
        return pd_layout_fail(PD_ENOMEM, c->err, c->errlen, "%s: out of memory", c->index);
    for (uint64_t i = 0; i < l->n; i++)
        names[i] = pd_layout_path(l, i);
    qsort(names, l->n, sizeof *names, mds_cmp_path);
    for (uint64_t i = 1; !rc && i < l->n; i++)
        if (!strcmp(names[i - 1], names[i]))
            rc = pd_layout_fail(PD_EINVAL, c->err, c->errlen, "%s: two shards name the file %s", c->index, names[i]);
    free(names);
    return rc;
}

/* The deepest nesting of arrays and objects in a JSON text (strings skipped), counted up to max + 1. The same
 * scan as Python's: a text nested deeper is refused by both before either parses it (jansson would go to 2048,
 * Python's json only as deep as its recursion limit lets it). */
static size_t mds_depth(const char *s, size_t n, size_t max)
{
    size_t depth = 0, deepest = 0;
    for (size_t i = 0; i < n && deepest <= max; i++) {
        if (s[i] == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                i += s[i] == '\\';
        } else if (s[i] == '[' || s[i] == '{') {
            deepest = ++depth > deepest ? depth : deepest;
        } else if ((s[i] == ']' || s[i] == '}') && depth) {
            depth--;
        }
    }
    return deepest;
}

static int mds_load(mds_ctx *c, json_t **root)
{
    json_error_t je;
    struct stat st;
    char *text = NULL;
    size_t len = 0;
    int rc = 0, fd = open(c->index, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    *root = NULL;
    if (fd < 0)
        return pd_layout_fail(errno == ENOENT ? PD_ENOTFOUND : PD_EIO, c->err, c->errlen, "%s: %s", c->index,
                              strerror(errno));
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) { /* a FIFO or device would block or never end */
        rc = pd_layout_fail(PD_EINVAL, c->err, c->errlen, "%s: not a regular file", c->index);
        goto done;
    }
    if (!(text = malloc((size_t)st.st_size + 1))) {
        rc = pd_layout_fail(PD_ENOMEM, c->err, c->errlen, "%s: out of memory reading it", c->index);
        goto done;
    }
    for (ssize_t n; len < (size_t)st.st_size; len += (size_t)n) {
        n = read(fd, text + len, (size_t)st.st_size - len);
        if (n < 0 && errno == EINTR) {
            n = 0;
            continue;
        }
        if (n <= 0) { /* (a file that shrank while being read) */
            rc = pd_layout_fail(PD_EIO, c->err, c->errlen, "%s: read failed: %s", c->index,
                                n ? strerror(errno) : "it ended early");
            goto done;
        }
    }
    if (mds_depth(text, len, MDS_DEPTH_MAX) > MDS_DEPTH_MAX) {
        rc = pd_layout_fail(PD_EINVAL, c->err, c->errlen, "%s: malformed JSON: nested deeper than %d", c->index,
                            MDS_DEPTH_MAX);
        goto done;
    }
    if ((*root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je)))
        goto done;
    switch (json_error_code(&je)) {
    case json_error_numeric_overflow: /* an integer outside int64, or a real past DBL_MAX */
        rc = pd_layout_fail(PD_EOVERFLOW, c->err, c->errlen,
                            "%s:%d:%d: a number out of range: integers must fit in 64 bits (±2^63), reals in a "
                            "double (%s)",
                            c->index, je.line, je.column, je.text);
        break;
    case json_error_out_of_memory:
        rc = pd_layout_fail(PD_ENOMEM, c->err, c->errlen, "%s: out of memory parsing it", c->index);
        break;
    default:
        rc = pd_layout_fail(PD_EINVAL, c->err, c->errlen, "%s:%d:%d: malformed JSON: %s", c->index, je.line,
                            je.column, je.text);
    }
done:
    free(text);
    close(fd);
    return rc;
}

int pd_layout_read_mds(const char *index, uint64_t max_shards, pd_layout **out, char *err, size_t errlen)
{
    mds_ctx c = {.err = err, .errlen = errlen};
    json_t *root = NULL;
    pd_layout *l = NULL;
    char *file = NULL;
    struct stat st;
    int rc = 0;
    size_t n = strlen(index);
    /* a dataset directory means its index.json */
    int is_dir = !stat(index, &st) && S_ISDIR(st.st_mode);
    if (!(file = malloc(n + sizeof "/index.json")) || !(c.dir = malloc(n + 2))) {
        rc = pd_layout_fail(PD_ENOMEM, err, errlen, "out of memory");
        goto done;
    }
    sprintf(file, is_dir ? "%s/index.json" : "%s", index);
    strcpy(c.dir, is_dir ? index : file);
    char *slash = is_dir ? NULL : strrchr(c.dir, '/');
    if (!is_dir)
        strcpy(slash ? slash + (slash == c.dir) : c.dir, slash ? "" : ".");
    c.index = file;
    if ((rc = mds_load(&c, &root)))
        goto done;
    json_t *shards = json_object_get(root, "shards");
    if (!json_is_object(root))
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s: not a JSON object", file);
    else if ((rc = mds_version(&c, root, "")))
        ;
    else if (!json_is_array(shards))
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s: no \"shards\" array", file);
    else if (json_array_size(shards) == 0)
        rc = pd_layout_fail(PD_EINVAL, err, errlen, "%s: \"shards\" is empty", file);
    else if (!(l = pd_layout_new(max_shards)))
        rc = pd_layout_fail(PD_ENOMEM, err, errlen, "out of memory");
    for (size_t i = 0; !rc && i < json_array_size(shards); i++)
        rc = mds_shard(&c, i, json_array_get(shards, i), l);
    if (!rc)
        rc = mds_unique(&c, l);
    if (!rc) {
        l->bytes_read = c.bytes_read;
        *out = l;
        l = NULL;
    }
done:
    pd_layout_free(l);
    json_decref(root);
    free(file);
    free(c.dir);
    return rc;
}
