/* Tests for client/layout*.c: WebDataset member grouping, tar counting from headers, tar specs, sizes files,
 * MDS indexes; tars (written with libarchive) and indexes are built in a temporary directory. */
#include <archive.h>
#include <archive_entry.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "client/layout.h"
#include "core/error.h"

static char dir[64];
static char err[1024];

static int setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/permd-test-layout-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* dir/name, in a static buffer (one of four, so a few may be alive at once). */
static const char *at(const char *name)
{
    static char bufs[4][512];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* A member: 'f' a file of size bytes, 'd' a directory, 's' a symlink, 'h' a hard link to the first member. */
typedef struct member {
    const char *name;
    char type;
    size_t size;
} member;

/* Write a tar (pax, or gzip-compressed with gz) of the members; file data is the byte 'x'. */
static void write_tar(const char *path, const member *m, size_t n, int gz)
{
    struct archive *a = archive_write_new();
    assert_non_null(a);
    assert_int_equal(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
    if (gz)
        assert_int_equal(archive_write_add_filter_gzip(a), ARCHIVE_OK);
    assert_int_equal(archive_write_open_filename(a, path), ARCHIVE_OK);
    static char data[1 << 16];
    memset(data, 'x', sizeof data);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, m[i].name);
        archive_entry_set_perm(e, 0644);
        switch (m[i].type) {
        case 'd':
            archive_entry_set_filetype(e, AE_IFDIR);
            break;
        case 's':
            archive_entry_set_filetype(e, AE_IFLNK);
            archive_entry_set_symlink(e, m[0].name);
            break;
        case 'h':
            archive_entry_set_filetype(e, AE_IFREG);
            archive_entry_set_hardlink(e, m[0].name);
            break;
        default:
            archive_entry_set_filetype(e, AE_IFREG);
            archive_entry_set_size(e, (la_int64_t)m[i].size);
        }
        assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
        for (size_t left = m[i].type == 'f' ? m[i].size : 0; left;) {
            size_t c = left < sizeof data ? left : sizeof data;
            assert_int_equal(archive_write_data(a, data, c), (la_ssize_t)c);
            left -= c;
        }
        archive_entry_free(e);
    }
    assert_int_equal(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
}

/* A ustar header block for name (any bytes, up to 100), with its checksum; type '0' a file. */
static void raw_header(unsigned char h[512], const char *name, size_t size, char type)
{
    memset(h, 0, 512);
    memcpy(h, name, strlen(name) < 100 ? strlen(name) : 100);
    memcpy(h + 100, "0000644", 8);
    memcpy(h + 108, "0000000", 8);
    memcpy(h + 116, "0000000", 8);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    memcpy(h + 136, "00000000000", 12);
    h[156] = (unsigned char)type;
    memcpy(h + 257, "ustar\0" "00", 8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
}

/* A tar of regular members of one byte each ('x'), names as given (bytes: no charset conversion), then the
 * end-of-archive blocks. */
static void write_raw_tar(const char *path, const char *const *names, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char h[512], data[512] = {'x'}, zero[1024] = {0};
    for (size_t i = 0; i < n; i++) {
        raw_header(h, names[i], 1, '0');
        fwrite(h, 1, 512, f);
        fwrite(data, 1, 512, f);
    }
    fwrite(zero, 1, sizeof zero, f);
    assert_int_equal(fclose(f), 0);
}

/* A tar of k samples "s<i>.jpg" + "s<i>.cls", each file size bytes. */
static void write_samples_tar(const char *path, int k, size_t size)
{
    member m[64];
    char names[64][32];
    assert_true(2 * k <= 64);
    for (int i = 0; i < 2 * k; i++) {
        snprintf(names[i], sizeof names[i], "s%03d.%s", i / 2, i % 2 ? "cls" : "jpg");
        m[i] = (member){names[i], 'f', size};
    }
    write_tar(path, m, (size_t)(2 * k), 0);
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

/* Assert an error: the code, and the message naming what it must. */
static void expect_error(int rc, int code, const char *mention)
{
    if (rc != code)
        fail_msg("rc %d (%s), want %d; message: %s", rc, pd_errname(rc), code, err);
    if (mention && !strstr(err, mention))
        fail_msg("the message lacks '%s': %s", mention, err);
}

/* ---- WebDataset's grouping ----------------------------------------------------------------------------- */

static void test_wds_split(void **state)
{
    (void)state;
    /* name, key ("" when the member has none), extension; checked against WebDataset's base_plus_ext */
    static const char *const cases[][3] = {
        {"a.jpg", "a", "jpg"},
        {"a.seg.png", "a", "seg.png"},
        {"dir/x.y/s01.jpg", "dir/x.y/s01", "jpg"},
        {"d.v1/c.png", "d.v1/c", "png"},
        {"noext", "", ""},
        {"dir.v/noext", "", ""},
        {".hidden", "", ""},
        {"x/.hidden", "x/", "hidden"},
        {"x/.a.b", "x/", "a.b"},
        {"d.v/.h", "", ""},
        {"a/b.c/.h", "", ""},
        {"/.x", "/", "x"},
        {"a//.x", "a//", "x"},
        {"a.", "a", ""},
        {"a..b", "a", ".b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t keylen = 0;
        const char *ext = NULL;
        int has = pd_wds_split(cases[i][0], strlen(cases[i][0]), &keylen, &ext);
        if (has != (cases[i][1][0] != '\0'))
            fail_msg("'%s': has a key %d", cases[i][0], has);
        if (has && (keylen != strlen(cases[i][1]) || strncmp(cases[i][0], cases[i][1], keylen) ||
                    strcmp(ext, cases[i][2])))
            fail_msg("'%s': key '%.*s' ext '%s'", cases[i][0], (int)keylen, cases[i][0], ext);
    }
}

static void test_wds_meta(void **state)
{
    (void)state;
    static const char *const meta[] = {"__index__", "__x__/a.jpg", "__", "___", "____", "__a__b__", "__a.b__"};
    static const char *const not_meta[] = {"_a_", "__a_", "a__b__", "x/__a__", "__a/b__", "__a__x", "_"};
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++)
        if (!pd_wds_is_meta(meta[i], strlen(meta[i])))
            fail_msg("'%s' is metadata", meta[i]);
    for (size_t i = 0; i < sizeof not_meta / sizeof not_meta[0]; i++)
        if (pd_wds_is_meta(not_meta[i], strlen(not_meta[i])))
            fail_msg("'%s' is not metadata", not_meta[i]);
}

/* ---- Counting one tar ------------------------------------------------------------------------------------ */

static void test_count_groups(void **state)
{
    (void)state;
    const member m[] = {
        {"a.jpg", 'f', 10},      {"a.json", 'f', 3},     {"__meta__", 'f', 5},  /* skipped: metadata */
        {"noext", 'f', 1},       /* skipped: no key */   {"a.txt", 'f', 1},     /* still sample a */
        {"sub", 'd', 0},         {"sub/b.jpg", 'f', 7},  {"sub/b.cls", 'f', 1}, {"link.jpg", 's', 0},
        {"hard.jpg", 'h', 0},    {"a.png", 'f', 1},      /* a again, not adjacent: a new sample */
        {"x/.hidden", 'f', 1},   {"x/.other", 'f', 1},   /* key "x/" */
    };
    write_tar(at("g.tar"), m, sizeof m / sizeof m[0], 0);
    uint64_t samples = 0, bytes = 0;
    assert_int_equal(pd_layout_count_tar(at("g.tar"), &samples, &bytes, err, sizeof err), 0);
    assert_int_equal(samples, 4); /* a, sub/b, a, x/ */
    assert_true(bytes > 0);
}

/* Large members are seeked over: far fewer bytes are read than the file holds. */
static void test_count_reads_headers_only(void **state)
{
    (void)state;
    write_samples_tar(at("big.tar"), 8, 1 << 20);
    uint64_t samples, bytes, size = file_size(at("big.tar"));
    assert_int_equal(pd_layout_count_tar(at("big.tar"), &samples, &bytes, err, sizeof err), 0);
    assert_int_equal(samples, 8);
    assert_true(size > 16 << 20);
    if (bytes * 20 > size)
        fail_msg("read %llu of %llu bytes", (unsigned long long)bytes, (unsigned long long)size);
    /* compressed: read through, same count */
    member m[] = {{"k1.a", 'f', 100}, {"k1.b", 'f', 100}, {"k2.a", 'f', 100}};
    write_tar(at("c.tar.gz"), m, 3, 1);
    assert_int_equal(pd_layout_count_tar(at("c.tar.gz"), &samples, &bytes, err, sizeof err), 0);
    assert_int_equal(samples, 2);
}

static void truncate_copy(const char *from, const char *to, uint64_t len)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[4096];
    while (len) {
        size_t n = fread(buf, 1, len < sizeof buf ? len : sizeof buf, in);
        assert_true(n > 0);
        fwrite(buf, 1, n, out);
        len -= n;
    }
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

static void test_count_truncated(void **state)
{
    (void)state;
    /* members of 1000 bytes: header 512, data padded to 1024; 3 samples of 2 members = 9216 bytes + end */
    write_samples_tar(at("t.tar"), 3, 1000);
    uint64_t samples, full = file_size(at("t.tar"));
    /* pax adds an extended header per member only when needed: plain names need none */
    assert_int_equal(pd_layout_count_tar(at("t.tar"), &samples, NULL, err, sizeof err), 0);
    assert_int_equal(samples, 3);
    const uint64_t member_bytes = 512 + 1024, body = 6 * member_bytes;
    assert_true(full >= body + 1024);
    const uint64_t cuts[] = {body - 1,   /* inside the last member's padding */
                             body - 600, /* inside its data */
                             body - 1024 - 100, /* inside its header */
                             member_bytes + 100, body - member_bytes + 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        truncate_copy(at("t.tar"), at("cut.tar"), cuts[i]);
        int rc = pd_layout_count_tar(at("cut.tar"), &samples, NULL, err, sizeof err);
        if (rc != PD_EIO)
            fail_msg("cut at %llu: rc %d %s", (unsigned long long)cuts[i], rc, err);
        expect_error(rc, PD_EIO, "cut.tar: truncated");
    }
    /* cut exactly after a member: no end-of-archive block. tarfile (and so WebDataset) would stop there
     * quietly, with 2 of the 3 samples; every tar writer writes the block, so this is a cut shard */
    truncate_copy(at("t.tar"), at("cut.tar"), 4 * member_bytes);
    expect_error(pd_layout_count_tar(at("cut.tar"), &samples, NULL, err, sizeof err), PD_EIO,
                 "cut.tar: truncated after member 4 (no end-of-archive block)");
    /* one zero block after the last member is enough (some writers stop there) */
    truncate_copy(at("t.tar"), at("cut.tar"), body + 512);
    assert_int_equal(pd_layout_count_tar(at("cut.tar"), &samples, NULL, err, sizeof err), 0);
    assert_int_equal(samples, 3);
    /* a truncated gzip stream */
    member m[] = {{"k1.a", 'f', 50000}, {"k2.a", 'f', 50000}};
    write_tar(at("z.tar.gz"), m, 2, 1);
    truncate_copy(at("z.tar.gz"), at("zcut.tar.gz"), file_size(at("z.tar.gz")) / 2);
    expect_error(pd_layout_count_tar(at("zcut.tar.gz"), &samples, NULL, err, sizeof err), PD_EIO, "zcut.tar.gz");
}

static void corrupt(const char *path, long offset)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, SEEK_SET), 0);
    fputc('Z', f);
    fputc('Z', f);
    assert_int_equal(fclose(f), 0);
}

static void test_count_bad(void **state)
{
    (void)state;
    uint64_t samples;
    /* a damaged header after the first member (its checksum no longer matches) */
    write_samples_tar(at("d.tar"), 3, 1000);
    corrupt(at("d.tar"), 2 * (512 + 1024) + 100);
    expect_error(pd_layout_count_tar(at("d.tar"), &samples, NULL, err, sizeof err), PD_EIO, "d.tar");
    /* damaged at the start: not a tar at all */
    write_samples_tar(at("d0.tar"), 1, 10);
    corrupt(at("d0.tar"), 148); /* the checksum field */
    expect_error(pd_layout_count_tar(at("d0.tar"), &samples, NULL, err, sizeof err), PD_EINVAL, "d0.tar: not a tar");
    write_text(at("text.tar"), "hello, not a tar\n");
    expect_error(pd_layout_count_tar(at("text.tar"), &samples, NULL, err, sizeof err), PD_EINVAL,
                 "text.tar: not a tar");
    write_text(at("empty.tar"), "");
    expect_error(pd_layout_count_tar(at("empty.tar"), &samples, NULL, err, sizeof err), PD_EINVAL, "empty.tar");
    expect_error(pd_layout_count_tar(at("missing.tar"), &samples, NULL, err, sizeof err), PD_ENOTFOUND,
                 "missing.tar");
    expect_error(pd_layout_count_tar(dir, &samples, NULL, err, sizeof err), PD_EINVAL, "not a regular file");
    /* an empty shard: a valid tar without samples */
    member meta[] = {{"__index__", 'f', 3}, {"README", 'f', 3}, {"d", 'd', 0}};
    write_tar(at("nosamples.tar"), meta, 3, 0);
    expect_error(pd_layout_count_tar(at("nosamples.tar"), &samples, NULL, err, sizeof err), PD_EINVAL,
                 "nosamples.tar: an empty shard");
    write_tar(at("none.tar"), meta, 0, 0);
    expect_error(pd_layout_count_tar(at("none.tar"), &samples, NULL, err, sizeof err), PD_EINVAL, "none.tar");
    /* WebDataset raises on an extension repeated in one sample (case-insensitively), and on __key__ */
    member dup[] = {{"a.jpg", 'f', 1}, {"a.cls", 'f', 1}, {"a.JPG", 'f', 1}};
    write_tar(at("dup.tar"), dup, 3, 0);
    expect_error(pd_layout_count_tar(at("dup.tar"), &samples, NULL, err, sizeof err), PD_EINVAL, "a.JPG");
    member key[] = {{"a.jpg", 'f', 1}, {"a.__key__", 'f', 1}};
    write_tar(at("key.tar"), key, 2, 0);
    expect_error(pd_layout_count_tar(at("key.tar"), &samples, NULL, err, sizeof err), PD_EINVAL, "__key__");
    /* extensions compared after Python's str.lower(), not ASCII's: the Kelvin sign folds to k, É to é, a
     * capital sigma to a final sigma after a letter (and to σ elsewhere), U+0130 to i + U+0307 */
    static const char *const same[][2] = {
        {"a.k", "a.\xe2\x84\xaa"},                   /* k, K (U+212A) */
        {"a.\xc3\xa9", "a.\xc3\x89"},                 /* é, É */
        {"a.x\xcf\x82", "a.X\xce\xa3"},               /* xς, XΣ (final) */
        {"a.\xcf\x83x", "a.\xce\xa3x"},               /* σx, Σx (not final) */
        {"a.x\xcc\x81\xcf\x82", "a.x\xcc\x81\xce\xa3"}, /* a combining accent between: still final */
        {"a.i\xcc\x87", "a.\xc4\xb0"},               /* i + U+0307, İ */
        {"a.\xff\xc3\x89", "a.\xff\xc3\xa9"},       /* not UTF-8 first: a byte of its own, É still folds */
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        write_raw_tar(at("case.tar"), same[i], 2);
        expect_error(pd_layout_count_tar(at("case.tar"), &samples, NULL, err, sizeof err), PD_EINVAL, "repeats");
    }
    static const char *const differ[][2] = {
        {"a.\xcf\x83", "a.\xce\xa3"},   /* σ, Σ alone: Σ lowers to σ there... */
        {"a.x\xcf\x83", "a.X\xce\xa3"}, /* ...but to ς after a letter */
        {"a.\xc3\x9f", "a.ss"},          /* ß has no lower case of two letters */
        {"a.\xc4\xb0", "a.i"},
    };
    for (size_t i = 0; i < sizeof differ / sizeof differ[0]; i++) {
        write_raw_tar(at("case.tar"), differ[i], 2);
        int rc = pd_layout_count_tar(at("case.tar"), &samples, NULL, err, sizeof err);
        if (rc != (i == 0 ? PD_EINVAL : 0))
            fail_msg("differ %zu: rc %d %s", i, rc, err);
    }
    /* not adjacent, not a repeat */
    member apart[] = {{"a.jpg", 'f', 1}, {"b.jpg", 'f', 1}, {"a.jpg", 'f', 1}};
    write_tar(at("apart.tar"), apart, 3, 0);
    assert_int_equal(pd_layout_count_tar(at("apart.tar"), &samples, NULL, err, sizeof err), 0);
    assert_int_equal(samples, 3);
}

/* ---- Headers read as Python's tarfile reads them ------------------------------------------------------ */

/* Append a raw member to f: a header (raw_header's, then extra bytes at offsets, checksum redone) and data. */
static void put_member(FILE *f, const char *name, const void *data, size_t size, char type, const char *const *extra,
                       const size_t *at, size_t nextra)
{
    unsigned char h[512], pad[512] = {0};
    raw_header(h, name, size, type);
    for (size_t i = 0; i < nextra; i++)
        memcpy(h + at[i], extra[i], strlen(extra[i]) + 1 > 12 ? strlen(extra[i]) : strlen(extra[i]) + 1);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    fwrite(h, 1, 512, f);
    fwrite(data, 1, size, f);
    fwrite(pad, 1, (512 - size % 512) % 512, f);
}

static FILE *open_raw(const char *name)
{
    FILE *f = fopen(at(name), "wb");
    assert_non_null(f);
    return f;
}

static void close_raw(FILE *f, int end)
{
    static const unsigned char zero[1024];
    if (end)
        fwrite(zero, 1, sizeof zero, f);
    assert_int_equal(fclose(f), 0);
}

/* A pax record "%d key=value\n". */
static size_t pax_record(char *out, const char *kv)
{
    size_t body = strlen(kv) + 2, n = body + 1;
    while (snprintf(NULL, 0, "%zu", n) + body != n)
        n = (size_t)snprintf(NULL, 0, "%zu", n) + body;
    return (size_t)sprintf(out, "%zu %s\n", n, kv);
}

static uint64_t count_ok(const char *name)
{
    uint64_t samples = 0;
    if (pd_layout_count_tar(at(name), &samples, NULL, err, sizeof err))
        fail_msg("%s: %s", name, err);
    return samples;
}

/* Where libarchive and tarfile read a tar differently, permctl reads it as tarfile (so WebDataset) does. */
static void test_count_as_tarfile(void **state)
{
    (void)state;
    uint64_t samples;
    /* GNU tar -G stores atime and ctime where ustar keeps its name prefix; tarfile joins them to the name
     * whatever the magic, so a.jpg and a.txt with different atimes are two samples to WebDataset */
    FILE *f = open_raw("inc.tar");
    const size_t inc_at[] = {257, 345, 357};
    put_member(f, "a.jpg", "x", 1, '0', (const char *[]){"ustar  ", "13602760400", "13602760400"}, inc_at, 3);
    put_member(f, "a.txt", "x", 1, '0', (const char *[]){"ustar  ", "13773463000", "13602760400"}, inc_at, 3);
    put_member(f, "b.jpg", "x", 1, '0', (const char *[]){"ustar  ", "13773463000", "13602760400"}, inc_at, 3);
    close_raw(f, 1);
    assert_int_equal(count_ok("inc.tar"), 3); /* libarchive: 2 */
    /* a number field that is not octal: tarfile stops there (WebDataset yields 1 sample); damage here */
    static const struct {
        size_t at;
        const char *v;
    } odd[] = {{100, "0000888"}, {136, "0000000000x"}, {108, "00017x7"}, {329, "9"}};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        f = open_raw("odd.tar");
        put_member(f, "a.txt", "x", 1, '0', NULL, NULL, 0);
        put_member(f, "a.jpg", "x", 1, '0', (const char *[]){odd[i].v}, &odd[i].at, 1);
        put_member(f, "b.jpg", "x", 1, '0', NULL, NULL, 0);
        close_raw(f, 1);
        expect_error(pd_layout_count_tar(at("odd.tar"), &samples, NULL, err, sizeof err), PD_EIO,
                     "truncated or damaged after member 1");
    }
    /* ...but what Python's int() takes is a number: blanks, "0o", underscores */
    f = open_raw("oct.tar");
    put_member(f, "a.txt", "x", 1, '0', (const char *[]){" 0o6_44 "}, (const size_t[]){100}, 1);
    close_raw(f, 1);
    assert_int_equal(count_ok("oct.tar"), 1);
    /* a pax size is int() of a str: Unicode blanks and digits count, read in place however long the value (one
     * over 63 bytes was copied into a malloc'd buffer, whose failure read as a size of 0) */
    char paxsize[512], rec[512];
    size_t sl = (size_t)sprintf(paxsize, "size=");
    for (int i = 0; i < 30; i++)
        sl += (size_t)sprintf(paxsize + sl, "\u3000"); /* IDEOGRAPHIC SPACE, 3 bytes */
    sprintf(paxsize + sl, "6_0\u0660 "); /* ARABIC-INDIC DIGIT ZERO: 600, in 97 bytes */
    static char six[600];
    memset(six, 'x', sizeof six);
    size_t rl = pax_record(rec, paxsize);
    f = open_raw("paxsize.tar");
    put_member(f, "PaxHeader", rec, rl, 'x', NULL, NULL, 0);
    put_member(f, "a.jpg", six, sizeof six, '0', (const char *[]){"1"}, (const size_t[]){124}, 1); /* header: 1 */
    put_member(f, "a.txt", "x", 1, '0', NULL, NULL, 0);
    close_raw(f, 1);
    assert_int_equal(count_ok("paxsize.tar"), 1); /* a size of 0 or 1 would read a.jpg's second block as a header */
    /* a pax global header's path applies to every later member: zzz.png twice, WebDataset raises */
    char recs[256];
    size_t n = pax_record(recs, "path=zzz.png");
    f = open_raw("global.tar");
    put_member(f, "pax_global_header", recs, n, 'g', NULL, NULL, 0);
    put_member(f, "a.jpg", "x", 1, '0', NULL, NULL, 0);
    put_member(f, "a.txt", "x", 1, '0', NULL, NULL, 0);
    close_raw(f, 1);
    expect_error(pd_layout_count_tar(at("global.tar"), &samples, NULL, err, sizeof err), PD_EINVAL,
                 "member 'zzz.png' repeats the extension 'png'");
    /* an extended header's path loses its trailing slashes; a regular member named "a.jpg/" has no key */
    n = pax_record(recs, "path=k.jpg//");
    f = open_raw("slash.tar");
    put_member(f, "a.jpg/", "data", 4, '0', NULL, NULL, 0); /* libarchive: a directory, its data misread */
    put_member(f, "PaxHeader", recs, n, 'x', NULL, NULL, 0);
    put_member(f, "ignored", "x", 1, '0', NULL, NULL, 0);
    put_member(f, "k.txt", "x", 1, '0', NULL, NULL, 0);
    close_raw(f, 1);
    assert_int_equal(count_ok("slash.tar"), 1); /* k.jpg and k.txt */
    /* a pax record's length past 2^40 (14 digits) is refused: the reader looped on its 14th digit for ever */
    f = open_raw("paxlen.tar");
    put_member(f, "PaxHeader", "99999999999999 path=k.jpg\n", 26, 'x', NULL, NULL, 0);
    put_member(f, "a.jpg", "x", 1, '0', NULL, NULL, 0);
    close_raw(f, 1);
    expect_error(pd_layout_count_tar(at("paxlen.tar"), &samples, NULL, err, sizeof err), PD_EIO,
                 "an invalid pax header");
    /* a type no standard defines is skipped (tarfile's isreg()), its data stepped over; libarchive counted it */
    f = open_raw("types.tar");
    put_member(f, "a.jpg", "x", 1, 'Z', NULL, NULL, 0);
    put_member(f, "b.jpg", "x", 1, '0', NULL, NULL, 0);
    put_member(f, "c.jpg", "xx", 2, '7', NULL, NULL, 0); /* contiguous: a file */
    close_raw(f, 1);
    assert_int_equal(count_ok("types.tar"), 2);
    /* a negative size would have tarfile read the same header for ever */
    f = open_raw("neg.tar");
    put_member(f, "a.jpg", "x", 1, '0', NULL, NULL, 0);
    put_member(f, "b.jpg", "", 0, 'Z', (const char *[]){"-1000"}, (const size_t[]){124}, 1);
    close_raw(f, 1);
    expect_error(pd_layout_count_tar(at("neg.tar"), &samples, NULL, err, sizeof err), PD_EIO,
                 "member 2 ('b.jpg') does not advance the archive");
    /* bounds both readers keep: 64 extended headers before a member, 1 MiB of one */
    f = open_raw("chain.tar");
    n = pax_record(recs, "comment=x");
    for (int i = 0; i < 65; i++)
        put_member(f, "PaxHeader", recs, n, 'x', NULL, NULL, 0);
    put_member(f, "a.jpg", "x", 1, '0', NULL, NULL, 0);
    close_raw(f, 1);
    expect_error(pd_layout_count_tar(at("chain.tar"), &samples, NULL, err, sizeof err), PD_EIO, "more than 64");
    f = open_raw("big.tar");
    put_member(f, "a.jpg", "x", 1, '0', NULL, NULL, 0);
    static char big[(1 << 20) + 512];
    memset(big, 'y', sizeof big);
    put_member(f, "././@LongLink", big, sizeof big, 'L', NULL, NULL, 0);
    put_member(f, "b.jpg", "x", 1, '0', NULL, NULL, 0);
    close_raw(f, 1);
    expect_error(pd_layout_count_tar(at("big.tar"), &samples, NULL, err, sizeof err), PD_EIO, "more than 1 MiB");
    /* the first block no header: not a tar; one that is, then a bad one: damage */
    write_text(at("junk.tar"), "hello, not a tar");
    expect_error(pd_layout_count_tar(at("junk.tar"), &samples, NULL, err, sizeof err), PD_EINVAL, "not a tar archive");
    f = open_raw("late.tar");
    put_member(f, "PaxHeader", "junk", 4, 'x', NULL, NULL, 0); /* a header, then records that are not */
    put_member(f, "a.jpg", "x", 1, '0', NULL, NULL, 0);
    close_raw(f, 1);
    expect_error(pd_layout_count_tar(at("late.tar"), &samples, NULL, err, sizeof err), PD_EIO, "late.tar");
}

/* Compressed shards are read through to their end: the whole stream must be sound, as in Python. */
static void write_compressed(const char *path, const member *m, size_t n, int filter)
{
    struct archive *a = archive_write_new();
    assert_non_null(a);
    assert_int_equal(archive_write_set_format_ustar(a), ARCHIVE_OK);
    assert_int_equal(archive_write_add_filter(a, filter), ARCHIVE_OK);
    assert_int_equal(archive_write_open_filename(a, path), ARCHIVE_OK);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, m[i].name);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_size(e, (la_int64_t)m[i].size);
        assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
        for (size_t k = 0; k < m[i].size; k++) {
            unsigned char c = (unsigned char)(k * 131 + i * 7 + (k >> 5) * 17);
            assert_int_equal(archive_write_data(a, &c, 1), 1);
        }
        archive_entry_free(e);
    }
    assert_int_equal(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
}

static void append_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    fwrite(b, 1, n, f);
    assert_int_equal(fclose(f), 0);
}

static void test_count_compressed(void **state)
{
    (void)state;
    uint64_t samples;
    const member m[] = {{"k1.a", 'f', 3000}, {"k1.b", 'f', 3000}, {"k2.a", 'f', 3000}};
    static const int filters[] = {ARCHIVE_FILTER_GZIP, ARCHIVE_FILTER_BZIP2, ARCHIVE_FILTER_XZ, ARCHIVE_FILTER_LZMA};
    char name[64];
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++) { /* .tar.lzma (LZMA-alone) included */
        snprintf(name, sizeof name, "c%zu.tar.z", i);
        write_compressed(at(name), m, 3, filters[i]);
        assert_int_equal(count_ok(name), 2);
        const uint64_t zsize = file_size(at(name));
        truncate_copy(at(name), at("cut.tar.z"), zsize - 5); /* cut in its last bytes, after the tar's end */
        expect_error(pd_layout_count_tar(at("cut.tar.z"), &samples, NULL, err, sizeof err), PD_EIO,
                     "a damaged or cut compressed stream");
        assert_null(strstr(err, "(null)"));
        truncate_copy(at(name), at("junk.tar.z"), zsize); /* junk after it */
        append_bytes(at("junk.tar.z"), "JUNK", 4);
        expect_error(pd_layout_count_tar(at("junk.tar.z"), &samples, NULL, err, sizeof err), PD_EIO,
                     i == 2 ? "compressed stream" : "not zeros");
        truncate_copy(at(name), at("zeros.tar.z"), zsize); /* zeros after it: padding, allowed */
        append_bytes(at("zeros.tar.z"), "\0\0\0\0", 4);
        assert_int_equal(count_ok("zeros.tar.z"), 2);
    }
    /* gzip's CRC-32 and length: not checked (libarchive shows no member's trailer); a tar read whole counts */
    write_compressed(at("crc.tar.gz"), m, 3, ARCHIVE_FILTER_GZIP);
    const uint64_t size = file_size(at("crc.tar.gz"));
    FILE *f = fopen(at("crc.tar.gz"), "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)size - 8, SEEK_SET), 0);
    const int c = fgetc(f);
    assert_int_equal(fseek(f, (long)size - 8, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(count_ok("crc.tar.gz"), 2);
    /* two gzip members (the second after the tar's end, as bgzip or cat writes them): a valid gzip */
    write_compressed(at("two.tar.gz"), m, 3, ARCHIVE_FILTER_GZIP);
    write_compressed(at("other.gz"), m, 1, ARCHIVE_FILTER_GZIP);
    f = fopen(at("other.gz"), "rb");
    static unsigned char buf[1 << 16];
    size_t got = fread(buf, 1, sizeof buf, f);
    fclose(f);
    append_bytes(at("two.tar.gz"), buf, got);
    assert_int_equal(count_ok("two.tar.gz"), 2);
    /* compressed twice: WebDataset decompresses one layer */
    struct archive *a = archive_write_new();
    archive_write_set_format_raw(a);
    archive_write_add_filter_gzip(a);
    assert_int_equal(archive_write_open_filename(a, at("twice.tar.gz.gz")), ARCHIVE_OK);
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_pathname(e, "x");
    archive_write_header(a, e);
    write_compressed(at("inner.tar.gz"), m, 3, ARCHIVE_FILTER_GZIP);
    f = fopen(at("inner.tar.gz"), "rb");
    got = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_int_equal(archive_write_data(a, buf, got), (la_ssize_t)got);
    archive_entry_free(e);
    archive_write_close(a);
    archive_write_free(a);
    expect_error(pd_layout_count_tar(at("twice.tar.gz.gz"), &samples, NULL, err, sizeof err), PD_EINVAL,
                 "compressed twice");
}

/* One sample of 3000 members: the extension set grows and stays correct (and linear). */
static void test_count_wide_sample(void **state)
{
    (void)state;
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    assert_int_equal(archive_write_open_filename(a, at("wide.tar")), ARCHIVE_OK);
    char name[64];
    for (int i = 0; i < 3001; i++) {
        struct archive_entry *e = archive_entry_new();
        snprintf(name, sizeof name, i < 3000 ? "one.e%d" : "two.e0", i);
        archive_entry_set_pathname(e, name);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_size(e, 0);
        assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
        archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    uint64_t samples;
    assert_int_equal(pd_layout_count_tar(at("wide.tar"), &samples, NULL, err, sizeof err), 0);
    assert_int_equal(samples, 2);
}

/* ---- Tar specs ------------------------------------------------------------------------------------------- */

static void check_layout(const pd_layout *l, const char *const *paths, const uint64_t *sizes, size_t n)
{
    assert_int_equal(pd_layout_shards(l), n);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!pd_layout_path(l, i) || strcmp(pd_layout_path(l, i), paths[i]))
            fail_msg("shard %zu: path %s, want %s", i, pd_layout_path(l, i), paths[i]);
        assert_int_equal(pd_layout_sizes(l)[i], sizes[i]);
        total += sizes[i];
    }
    assert_int_equal(pd_layout_samples(l), total);
}

static void test_tar_specs(void **state)
{
    (void)state;
    char name[64];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "shard-%06d.tar", i);
        write_samples_tar(at(name), i + 1, 10);
    }
    pd_layout *l;
    /* a brace pattern, in its order; "::" joins a second spec */
    char spec[512];
    snprintf(spec, sizeof spec, "%s/shard-{000002..000000}.tar::%s/shard-000003.tar", dir, dir);
    const char *specs[] = {spec};
    assert_int_equal(pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err), 0);
    const char *want[] = {at("shard-000002.tar"), at("shard-000001.tar"), at("shard-000000.tar"), at("shard-000003.tar")};
    const uint64_t sizes[] = {3, 2, 1, 4};
    check_layout(l, want, sizes, 4);
    assert_true(pd_layout_bytes_read(l) > 0);
    pd_layout_free(l);
    /* a directory: its tars sorted by name; hidden and other files left out */
    mkdir(at("d"), 0755);
    write_samples_tar(at("d/b.tar"), 2, 10);
    write_samples_tar(at("d/a.tar"), 1, 10);
    write_samples_tar(at("d/.partial.tar"), 1, 10);
    write_text(at("d/notes.txt"), "x");
    specs[0] = at("d");
    assert_int_equal(pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err), 0);
    const char *dwant[] = {at("d/a.tar"), at("d/b.tar")};
    check_layout(l, dwant, (const uint64_t[]){1, 2}, 2);
    pd_layout_free(l);
    /* a glob, sorted; several specs in order */
    char glob[256];
    snprintf(glob, sizeof glob, "%s/shard-00000[13].tar", dir);
    const char *two[] = {glob, at("d/a.tar")};
    assert_int_equal(pd_layout_read_tars(two, 2, 0, &l, err, sizeof err), 0);
    const char *gwant[] = {at("shard-000001.tar"), at("shard-000003.tar"), at("d/a.tar")};
    check_layout(l, gwant, (const uint64_t[]){2, 4, 1}, 3);
    pd_layout_free(l);
}

/* Globs: one dialect, the same as Python's ShardLayout (glibc's glob read [^a] and [[:digit:]] as Python's
 * fnmatch does not): each case's matches under dir/g, in byte order, or an error code. */
static void test_glob_dialect(void **state)
{
    (void)state;
    static const char *const files[] = {"a.tar", "b.tar", "^.tar", "s1.tar", "x y.tar", ".h.tar", "[a].tar",
                                        "\xc3\xa9.tar", "\xff.tar", "sub1/c.tar", "sub2/c.tar", "sub2/d.tar"};
    mkdir(at("g"), 0755);
    mkdir(at("g/sub1"), 0755);
    mkdir(at("g/sub2"), 0755);
    char path[512];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/g/%s", dir, files[i]);
        write_samples_tar(path, 1, 1);
    }
    static const struct {
        const char *pattern, *want; /* matches (under g/), space-separated; NULL: an error */
        int code;
    } cases[] = {
        {"[^a].tar", "^.tar b.tar \xc3\xa9.tar \xff.tar", 0}, /* '^' negates, as '!'; é is one character */
        {"[!ab^].tar", "\xc3\xa9.tar \xff.tar", 0},
        {"[\\\\^a].tar", "^.tar a.tar", 0}, /* an escaped '^' is a member (the braces take one backslash) */
        {"?.tar", "^.tar a.tar b.tar \xc3\xa9.tar \xff.tar", 0}, /* '?': one character, é or a lone byte */
        {"*.tar", "[a].tar ^.tar a.tar b.tar s1.tar x y.tar \xc3\xa9.tar \xff.tar", 0}, /* hidden names left out */
        {".*", ".h.tar", 0},
        {"\\\\[a].tar", "[a].tar", 0},         /* an escaped '[' is itself */
        {"[a-b].tar", "a.tar b.tar", 0},
        {"[]a].tar", "a.tar", 0},              /* ']' first is a member */
        {"sub*/c.tar", "sub1/c.tar sub2/c.tar", 0},
        {"sub?/*", "sub1/c.tar sub2/c.tar sub2/d.tar", 0},
        {"*/d.tar", "sub2/d.tar", 0},
        {"s[[:digit:]].tar", NULL, PD_EINVAL}, /* POSIX classes: refused, not read two ways */
        {"[\xc3\xa9].tar", NULL, PD_EINVAL},  /* a set of non-ASCII characters */
        {"[b-a].tar", NULL, PD_EINVAL},
        {"nothing*", NULL, PD_ENOTFOUND},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char spec[512], want[1024] = "", got[1024] = "";
        snprintf(spec, sizeof spec, "%s/g/%s", dir, cases[i].pattern);
        const char *specs[] = {spec};
        pd_layout *l = NULL;
        int rc = pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err);
        if (cases[i].want && rc == 0) {
            for (uint64_t k = 0; k < pd_layout_shards(l); k++) {
                const char *p = pd_layout_path(l, k) + strlen(dir) + 3;
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", k ? " " : "", p);
            }
            snprintf(want, sizeof want, "%s", cases[i].want);
            if (strcmp(got, want))
                fail_msg("'%s': matched '%s', want '%s'", cases[i].pattern, got, want);
        } else if (rc != (cases[i].code ? cases[i].code : 0)) {
            fail_msg("'%s': rc %d, want %d (%s)", cases[i].pattern, rc, cases[i].code, err);
        }
        pd_layout_free(l);
    }
}

static void test_tar_specs_bad(void **state)
{
    (void)state;
    write_samples_tar(at("s-0.tar"), 1, 10);
    write_samples_tar(at("s-1.tar"), 1, 10);
    pd_layout *l = NULL;
    char spec[512];
    const char *specs[] = {spec};
    snprintf(spec, sizeof spec, "%s/s-{0..2}.tar", dir);
    expect_error(pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err), PD_ENOTFOUND, "s-2.tar (from '");
    snprintf(spec, sizeof spec, "%s/nothing-*.tar", dir);
    expect_error(pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err), PD_ENOTFOUND, "matches no file");
    mkdir(at("emptydir"), 0755);
    specs[0] = at("emptydir");
    expect_error(pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err), PD_ENOTFOUND, "no tar shards");
    snprintf(spec, sizeof spec, "%s/s-{0,1.tar", dir);
    specs[0] = spec;
    expect_error(pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err), PD_EINVAL, "unbalanced");
    snprintf(spec, sizeof spec, "%s/s-0.tar::", dir);
    expect_error(pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err), PD_EINVAL, "empty shard spec");
    /* the bound on shards: a pattern past it is refused before its names are built */
    snprintf(spec, sizeof spec, "%s/s-{0..1}.tar", dir);
    expect_error(pd_layout_read_tars(specs, 1, 1, &l, err, sizeof err), PD_ETOOBIG, "--max-shards");
    snprintf(spec, sizeof spec, "%s/s-{0..99999999999}.tar", dir);
    expect_error(pd_layout_read_tars(specs, 1, 0, &l, err, sizeof err), PD_ETOOBIG, "s-{0..99999999999}.tar");
    const char *twice[] = {at("s-0.tar"), at("s-1.tar")};
    expect_error(pd_layout_read_tars(twice, 2, 1, &l, err, sizeof err), PD_ETOOBIG, "more than 1 shards");
    expect_error(pd_layout_read_tars(specs, 0, 0, &l, err, sizeof err), PD_EINVAL, "no tar shards given");
    /* a FIFO is refused at once: opening it must not wait for a writer */
    assert_int_equal(mkfifo(at("fifo.tar"), 0600), 0);
    expect_error(pd_layout_read_tars((const char *[]){at("fifo.tar")}, 1, 0, &l, err, sizeof err), PD_EINVAL,
                 "fifo.tar: not a regular file");
    /* in a directory, a shard behind a broken link is an error, not a shard quietly missing */
    mkdir(at("links"), 0755);
    write_samples_tar(at("links/a.tar"), 1, 10);
    assert_int_equal(symlink(at("nowhere.tar"), at("links/b.tar")), 0);
    expect_error(pd_layout_read_tars((const char *[]){at("links")}, 1, 0, &l, err, sizeof err), PD_ENOTFOUND,
                 "links/b.tar: a broken link");
    /* one file listed twice, however it is spelled, would have its samples counted twice */
    assert_int_equal(symlink(at("s-0.tar"), at("link.tar")), 0);
    char s0[512], s1[512], link[512], dot[512], braces[512]; /* (at() has four buffers only) */
    snprintf(s0, sizeof s0, "%s/s-0.tar", dir);
    snprintf(s1, sizeof s1, "%s/s-1.tar", dir);
    snprintf(link, sizeof link, "%s/link.tar", dir);
    snprintf(dot, sizeof dot, "%s/./s-1.tar", dir);
    snprintf(braces, sizeof braces, "%s/s-{0,1}.tar", dir);
    const char *dups[][3] = {{s0, s1, dot}, {s0, link, s1}, {braces, s1, s0}};
    const char *said[] = {"./s-1.tar: shard 2 is ", "link.tar: shard 1 is ", "s-1.tar: shard 2 is "};
    for (size_t i = 0; i < 3; i++)
        expect_error(pd_layout_read_tars(dups[i], 3, 0, &l, err, sizeof err), PD_EINVAL, said[i]);
    /* one bad shard among good ones names itself */
    write_text(at("s-bad.tar"), "garbage");
    const char *mixed[] = {at("s-0.tar"), at("s-bad.tar"), at("s-1.tar")};
    expect_error(pd_layout_read_tars(mixed, 3, 0, &l, err, sizeof err), PD_EINVAL, "s-bad.tar");
    assert_null(l);
}

/* ---- Sizes files ----------------------------------------------------------------------------------------- */

static void test_sizes_file(void **state)
{
    (void)state;
    pd_layout *l;
    write_text(at("sizes.txt"), "# a comment\n3\n\n0\t  shards/b.tar\n5 c d.tar\r\n");
    assert_int_equal(pd_layout_read_sizes(at("sizes.txt"), 0, &l, err, sizeof err), 0);
    assert_int_equal(pd_layout_shards(l), 3);
    assert_int_equal(pd_layout_samples(l), 8);
    assert_null(pd_layout_path(l, 0));
    assert_string_equal(pd_layout_path(l, 1), "shards/b.tar");
    assert_string_equal(pd_layout_path(l, 2), "c d.tar");
    assert_int_equal(pd_layout_sizes(l)[1], 0);
    pd_layout_free(l);
    /* line ends as Python's universal newlines read them: \n, \r\n and a lone \r (old Mac files were read
     * as one line of 5, the rest dropped) */
    write_text(at("cr.txt"), "5\r3\r\n7 a b.tar\r\r# c\n\n1");
    assert_int_equal(pd_layout_read_sizes(at("cr.txt"), 0, &l, err, sizeof err), 0);
    assert_int_equal(pd_layout_shards(l), 4);
    assert_int_equal(pd_layout_sizes(l)[0], 5);
    assert_int_equal(pd_layout_sizes(l)[1], 3);
    assert_int_equal(pd_layout_sizes(l)[2], 7);
    assert_string_equal(pd_layout_path(l, 2), "a b.tar");
    assert_int_equal(pd_layout_sizes(l)[3], 1);
    pd_layout_free(l);
    write_text(at("crbad.txt"), "5\rx\r");
    expect_error(pd_layout_read_sizes(at("crbad.txt"), 0, &l, err, sizeof err), PD_EINVAL, "crbad.txt:2: 'x'");
    FILE *nul = fopen(at("nul.txt"), "w");
    assert_non_null(nul);
    fwrite("5\n3\0junk\n", 1, 10, nul); /* C would read 3, Python "3\0junk": refused */
    assert_int_equal(fclose(nul), 0);
    expect_error(pd_layout_read_sizes(at("nul.txt"), 0, &l, err, sizeof err), PD_EINVAL, "nul.txt:2: a NUL byte");
    write_text(at("bad.txt"), "3\n4\n-1\n");
    expect_error(pd_layout_read_sizes(at("bad.txt"), 0, &l, err, sizeof err), PD_EINVAL, "bad.txt:3: '-1'");
    write_text(at("blank.txt"), "# nothing\n\n");
    expect_error(pd_layout_read_sizes(at("blank.txt"), 0, &l, err, sizeof err), PD_EINVAL, "lists no shard sizes");
    expect_error(pd_layout_read_sizes(at("nope.txt"), 0, &l, err, sizeof err), PD_ENOTFOUND, "nope.txt");
    write_text(at("big.txt"), "9223372036854775807\n1\n1\n");
    expect_error(pd_layout_read_sizes(at("big.txt"), 0, &l, err, sizeof err), PD_EOVERFLOW, "big.txt:3");
    write_text(at("huge.txt"), "18446744073709551616\n");
    expect_error(pd_layout_read_sizes(at("huge.txt"), 0, &l, err, sizeof err), PD_EINVAL, "huge.txt:1");
    write_text(at("many.txt"), "1\n2\n3\n");
    expect_error(pd_layout_read_sizes(at("many.txt"), 2, &l, err, sizeof err), PD_ETOOBIG, "many.txt:3");

    /* Lines are read into one buffer: a line past PD_SIZES_LINE_MAX is refused, where a file without line ends
     * (/dev/zero) was read into memory without bound, and one whose read ran out of memory ended there silently,
     * its later shards dropped. Lines of every length up to it, their \r\n across the buffer's reads, still
     * read whole. */
    const size_t big = PD_SIZES_LINE_MAX + 100;
    char *text = malloc(3 * big);
    assert_non_null(text);
    for (size_t len = PD_SIZES_LINE_MAX - 3; len <= PD_SIZES_LINE_MAX; len++) {
        /* "5 <path of len - 2 bytes>\r\n" three times, then "7": lines of exactly len bytes */
        size_t k = 0;
        for (int i = 0; i < 3; i++) {
            text[k++] = '5';
            text[k++] = ' ';
            memset(text + k, 'a' + i, len - 2);
            k += len - 2;
            text[k++] = '\r';
            text[k++] = '\n';
        }
        text[k++] = '7';
        FILE *f = fopen(at("long.txt"), "w");
        assert_non_null(f);
        assert_int_equal(fwrite(text, 1, k, f), k);
        assert_int_equal(fclose(f), 0);
        assert_int_equal(pd_layout_read_sizes(at("long.txt"), 0, &l, err, sizeof err), 0);
        assert_int_equal(pd_layout_shards(l), 4);
        assert_int_equal(pd_layout_samples(l), 22);
        assert_int_equal(strlen(pd_layout_path(l, 2)), len - 2);
        pd_layout_free(l);
    }
    /* a short line, then one whose \r is the last byte of the buffer's first read, its \n the first of the next */
    memcpy(text, "5\r\n5 ", 5);
    memset(text + 5, 'x', PD_SIZES_LINE_MAX - 4);
    memcpy(text + PD_SIZES_LINE_MAX + 1, "\r\n7", 3);
    FILE *s = fopen(at("straddle.txt"), "w");
    assert_non_null(s);
    assert_int_equal(fwrite(text, 1, PD_SIZES_LINE_MAX + 4, s), PD_SIZES_LINE_MAX + 4);
    assert_int_equal(fclose(s), 0);
    assert_int_equal(pd_layout_read_sizes(at("straddle.txt"), 0, &l, err, sizeof err), 0);
    assert_int_equal(pd_layout_shards(l), 3);
    assert_int_equal(strlen(pd_layout_path(l, 1)), PD_SIZES_LINE_MAX - 4);
    pd_layout_free(l);
    text[PD_SIZES_LINE_MAX + 3] = 'x'; /* line 3, not 4: that \r\n is one line end, not \r and then \n */
    s = fopen(at("straddle.txt"), "w");
    assert_non_null(s);
    assert_int_equal(fwrite(text, 1, PD_SIZES_LINE_MAX + 4, s), PD_SIZES_LINE_MAX + 4);
    assert_int_equal(fclose(s), 0);
    expect_error(pd_layout_read_sizes(at("straddle.txt"), 0, &l, err, sizeof err), PD_EINVAL, "straddle.txt:3: 'x'");
    /* a line of exactly PD_SIZES_LINE_MAX bytes whose \r is the last byte of a read: at the file's end, and with
     * its \n in the next read (after an empty line, so the line starts a byte into the buffer) */
    text[0] = '5';
    text[1] = ' ';
    memset(text + 2, 'y', PD_SIZES_LINE_MAX - 2);
    text[PD_SIZES_LINE_MAX] = '\r';
    s = fopen(at("exact.txt"), "w");
    assert_non_null(s);
    assert_int_equal(fwrite(text, 1, PD_SIZES_LINE_MAX + 1, s), PD_SIZES_LINE_MAX + 1);
    assert_int_equal(fclose(s), 0);
    assert_int_equal(pd_layout_read_sizes(at("exact.txt"), 0, &l, err, sizeof err), 0);
    assert_int_equal(strlen(pd_layout_path(l, 0)), PD_SIZES_LINE_MAX - 2);
    pd_layout_free(l);
    s = fopen(at("exact.txt"), "w");
    assert_non_null(s);
    assert_int_equal(fwrite("\n", 1, 1, s), 1);
    assert_int_equal(fwrite(text, 1, PD_SIZES_LINE_MAX + 1, s), PD_SIZES_LINE_MAX + 1);
    assert_int_equal(fwrite("\n7", 1, 2, s), 2);
    assert_int_equal(fclose(s), 0);
    assert_int_equal(pd_layout_read_sizes(at("exact.txt"), 0, &l, err, sizeof err), 0);
    assert_int_equal(pd_layout_shards(l), 2);
    assert_int_equal(strlen(pd_layout_path(l, 0)), PD_SIZES_LINE_MAX - 2);
    pd_layout_free(l);
    memset(text, '1', big); /* one line past the bound */
    FILE *f = fopen(at("toolong.txt"), "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, big, f), big);
    assert_int_equal(fclose(f), 0);
    expect_error(pd_layout_read_sizes(at("toolong.txt"), 0, &l, err, sizeof err), PD_EINVAL,
                 "toolong.txt:1: a line longer than 65536 bytes");
    free(text);
    expect_error(pd_layout_read_sizes("/dev/zero", 0, &l, err, sizeof err), PD_EINVAL, "/dev/zero:1: a line longer");
}

/* ---- MDS indexes ----------------------------------------------------------------------------------------- */

/* A shard entry as Streaming's MDSWriter writes it; extra is spliced in before "version". */
static void mds_shard_json(char *out, size_t len, const char *base, long long samples, long long bytes,
                           const char *zip, const char *extra)
{
    char zipbuf[256];
    if (zip)
        snprintf(zipbuf, sizeof zipbuf, "{\"basename\": \"%s\", \"bytes\": 40, \"hashes\": {}}", zip);
    snprintf(out, len,
             "{\"column_encodings\": [\"str\", \"int\"], \"column_names\": [\"text\", \"label\"], "
             "\"column_sizes\": [null, 8], \"compression\": %s, \"format\": \"mds\", \"hashes\": [], "
             "\"raw_data\": {\"basename\": \"%s\", \"bytes\": %lld, \"hashes\": {}}, \"samples\": %lld, "
             "\"size_limit\": 67108864, %s\"version\": 2, \"zip_data\": %s}",
             zip ? "\"zstd\"" : "null", base, bytes, samples, extra ? extra : "", zip ? zipbuf : "null");
}

/* Write dir/sub/index.json listing the given shard entries. */
static void write_index(const char *path, const char *const *shards, size_t n)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"shards\": [", f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%s", i ? ", " : "", shards[i]);
    fputs("], \"version\": 2}", f);
    assert_int_equal(fclose(f), 0);
}

/* An MDS shard file: its u32 sample count, little-endian, then filler to bytes. */
static void write_mds_file(const char *path, uint32_t samples, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char h[4] = {(unsigned char)samples, (unsigned char)(samples >> 8), (unsigned char)(samples >> 16),
                          (unsigned char)(samples >> 24)};
    fwrite(h, 1, bytes < 4 ? bytes : 4, f); /* under 4 bytes: a header cut short */
    for (size_t i = 4; i < bytes; i++)
        fputc(0, f);
    assert_int_equal(fclose(f), 0);
}

static void test_mds(void **state)
{
    (void)state;
    char s[3][1024];
    mds_shard_json(s[0], sizeof s[0], "shard.00000.mds", 1000, 64, NULL, NULL);
    mds_shard_json(s[1], sizeof s[1], "shard.00001.mds", 17, 64, "shard.00001.mds.zstd", NULL);
    mds_shard_json(s[2], sizeof s[2], "part2/shard.00000.mds", 400, 64, NULL, NULL); /* a merged index */
    const char *const shards[] = {s[0], s[1], s[2]};
    mkdir(at("m"), 0755);
    write_index(at("m/index.json"), shards, 3);
    pd_layout *l;
    /* no shard files here (a remote dataset): the index alone */
    assert_int_equal(pd_layout_read_mds(at("m/index.json"), 0, &l, err, sizeof err), 0);
    check_layout(l, (const char *[]){"shard.00000.mds", "shard.00001.mds", "part2/shard.00000.mds"},
                 (const uint64_t[]){1000, 17, 400}, 3);
    assert_int_equal(pd_layout_bytes_read(l), 0);
    pd_layout_free(l);
    /* shard files next to it are checked: size and MDS header; a directory means its index.json */
    write_mds_file(at("m/shard.00000.mds"), 1000, 64);
    write_mds_file(at("m/shard.00001.mds.zstd"), 0, 40);
    assert_int_equal(pd_layout_read_mds(at("m"), 0, &l, err, sizeof err), 0);
    assert_int_equal(pd_layout_samples(l), 1417);
    assert_int_equal(pd_layout_bytes_read(l), 4);
    pd_layout_free(l);
    write_mds_file(at("m/shard.00000.mds"), 999, 64);
    expect_error(pd_layout_read_mds(at("m"), 0, &l, err, sizeof err), PD_EINVAL, "holds 999 samples");
    write_mds_file(at("m/shard.00000.mds"), 1000, 63);
    expect_error(pd_layout_read_mds(at("m"), 0, &l, err, sizeof err), PD_EINVAL, "is 63 bytes");
    write_mds_file(at("m/shard.00000.mds"), 1000, 64);
    write_mds_file(at("m/shard.00001.mds.zstd"), 0, 41);
    expect_error(pd_layout_read_mds(at("m"), 0, &l, err, sizeof err), PD_EINVAL, "shard.00001.mds.zstd is 41 bytes");
    write_mds_file(at("m/shard.00001.mds.zstd"), 0, 40);
    expect_error(pd_layout_read_mds(at("m"), 2, &l, err, sizeof err), PD_ETOOBIG, "shard 2");
    /* a shard of the size its index lists, too short for the sample count: malformed, not an I/O error */
    mds_shard_json(s[0], sizeof s[0], "tiny.mds", 5, 3, NULL, NULL);
    mkdir(at("t"), 0755);
    write_index(at("t/index.json"), shards, 1);
    write_mds_file(at("t/tiny.mds"), 5, 3);
    expect_error(pd_layout_read_mds(at("t"), 0, &l, err, sizeof err), PD_EINVAL, "too short for its header");
}

/* Each malformed or inconsistent index: the code, and the message names the index and what. */
static void test_mds_bad(void **state)
{
    (void)state;
    static const struct {
        const char *name, *text;
        int code;
        const char *mention;
    } bad[] = {
        {"trunc", "{\"version\": 2, \"shards\": [", PD_EINVAL, "malformed JSON"},
        {"notjson", "hello", PD_EINVAL, ":1:"},
        {"array", "[1, 2]", PD_EINVAL, "not a JSON object"},
        {"dupkey", "{\"version\": 2, \"version\": 2, \"shards\": []}", PD_EINVAL, "malformed JSON"},
        {"v1", "{\"version\": 1, \"shards\": []}", PD_EUNSUPPORTED, "\"version\" is 1"},
        {"vstr", "{\"version\": \"2\", \"shards\": []}", PD_EINVAL, "not an integer"},
        {"noversion", "{\"shards\": []}", PD_EINVAL, "\"version\" is missing"},
        {"noshards", "{\"version\": 2}", PD_EINVAL, "no \"shards\" array"},
        {"empty", "{\"version\": 2, \"shards\": []}", PD_EINVAL, "\"shards\" is empty"},
        {"huge", "{\"version\": 2, \"shards\": [{\"samples\": 99999999999999999999}]}", PD_EOVERFLOW, "out of range"},
        /* what jansson refuses anywhere, in fields nobody reads too, Python refuses alike */
        {"real", "{\"version\": 2, \"x\": 1e999, \"shards\": []}", PD_EOVERFLOW, "a number out of range"},
        {"nul", "{\"version\": 2, \"x\": \"a\\u0000b\", \"shards\": []}", PD_EINVAL, "malformed JSON"},
        {"surrogate", "{\"version\": 2, \"x\": \"\\ud800\", \"shards\": []}", PD_EINVAL, "malformed JSON"},
        /* two errors: the first in the text decides, in C as in Python */
        {"twoerr", "{\"x\": \"\\u0000\", \"y\": 1e999}", PD_EINVAL, "malformed JSON"},
        {"twoerr2", "{\"y\": 1e999, \"x\": \"\\u0000\"}", PD_EOVERFLOW, "out of range"},
        {"shardnotobj", "{\"version\": 2, \"shards\": [3]}", PD_EINVAL, "shard 0: not an object"},
    };
    pd_layout *l = NULL;
    char path[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/%s.json", dir, bad[i].name);
        write_text(path, bad[i].text);
        int rc = pd_layout_read_mds(path, 0, &l, err, sizeof err);
        if (rc != bad[i].code || !strstr(err, bad[i].mention) || !strstr(err, bad[i].name))
            fail_msg("%s: rc %d, want %d; message: %s", bad[i].name, rc, bad[i].code, err);
    }
    /* nesting: 512 deep is read, deeper refused before parsing (jansson went to 2048, Python's json to its
     * recursion limit) */
    static char deep[4096];
    for (int depth = 512; depth <= 513; depth++) {
        int n = sprintf(deep, "{\"version\": 2, \"shards\": [], \"x\": ");
        for (int i = 0; i < depth - 1; i++)
            deep[n++] = '[';
        for (int i = 0; i < depth - 1; i++)
            deep[n++] = ']';
        strcpy(deep + n, "}");
        snprintf(path, sizeof path, "%s/deep%d.json", dir, depth);
        write_text(path, deep);
        expect_error(pd_layout_read_mds(path, 0, &l, err, sizeof err), PD_EINVAL,
                     depth == 512 ? "\"shards\" is empty" : "nested deeper than 512");
    }
    /* an index that is a FIFO is refused at once, not read until a writer comes */
    assert_int_equal(mkfifo(at("fifo.json"), 0600), 0);
    expect_error(pd_layout_read_mds(at("fifo.json"), 0, &l, err, sizeof err), PD_EINVAL, "fifo.json: not a regular file");
    snprintf(path, sizeof path, "%s/absent/index.json", dir);
    expect_error(pd_layout_read_mds(path, 0, &l, err, sizeof err), PD_ENOTFOUND, "absent/index.json");
    assert_null(l);
}

static void test_mds_bad_shards(void **state)
{
    (void)state;
    char ok[1024], s[1024];
    mds_shard_json(ok, sizeof ok, "ok.mds", 5, 64, NULL, NULL);
    static const struct {
        const char *base;
        long long samples;
        const char *zip, *extra;
        int code;
        const char *mention;
    } bad[] = {
        {"a.mds", 0, NULL, NULL, PD_EINVAL, "a.mds is an empty shard"},
        {"a.mds", -3, NULL, NULL, PD_EINVAL, "\"samples\" is negative"},
        {"a.mds", 4294967296LL, NULL, NULL, PD_EOVERFLOW, "32 bits"},
        {"ok.mds", 5, NULL, NULL, PD_EINVAL, "two shards name the file ok.mds"},
        {"../up.mds", 5, NULL, NULL, PD_EINVAL, "not a plain relative path inside the dataset's directory"},
        {"/abs.mds", 5, NULL, NULL, PD_EINVAL, "not a plain relative path inside the dataset's directory"},
        {"", 5, NULL, NULL, PD_EINVAL, "not a plain relative path"},
        {"./ok.mds", 5, NULL, NULL, PD_EINVAL, "not a plain relative path"}, /* ok.mds again, spelled otherwise */
        {"sub//a.mds", 5, NULL, NULL, PD_EINVAL, "not a plain relative path"},
        {".", 5, NULL, NULL, PD_EINVAL, "not a plain relative path"},
        {"adir", 5, NULL, NULL, PD_EINVAL, "adir is not a regular file"}, /* a directory next to the index */
        {"a.mds", 5, NULL, "\"version\": 3, ", PD_EINVAL, "malformed JSON"}, /* a duplicate key */
    };
    const char *const shards[] = {ok, s};
    pd_layout *l = NULL;
    mkdir(at("adir"), 0755);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mds_shard_json(s, sizeof s, bad[i].base, bad[i].samples, 64, bad[i].zip, bad[i].extra);
        write_index(at("index.json"), shards, 2);
        int rc = pd_layout_read_mds(at("index.json"), 0, &l, err, sizeof err);
        if (rc != bad[i].code || !strstr(err, bad[i].mention) || !strstr(err, "index.json"))
            fail_msg("case %zu: rc %d, want %d; message: %s", i, rc, bad[i].code, err);
    }
    /* fields a hand-edited entry may get wrong */
    static const struct {
        const char *entry;
        int code;
        const char *mention;
    } entries[] = {
        {"{\"version\": 2, \"format\": \"mds\", \"samples\": 5, \"zip_data\": null}", PD_EINVAL, "no \"raw_data\""},
        {"{\"version\": 2, \"format\": \"mds\", \"samples\": 5, \"raw_data\": {\"basename\": \"x\", \"bytes\": 1}}",
         PD_EINVAL, "no \"zip_data\""},
        {"{\"version\": 2, \"format\": \"mds\", \"samples\": 5.0, \"raw_data\": {\"basename\": \"x\", \"bytes\": 1}, "
         "\"zip_data\": null}",
         PD_EINVAL, "\"samples\" is not an integer"},
        {"{\"version\": 2, \"format\": \"mds\", \"raw_data\": {\"basename\": \"x\", \"bytes\": 1}, \"zip_data\": null}",
         PD_EINVAL, "no \"samples\""},
        {"{\"version\": 2, \"format\": \"parquet\", \"samples\": 5, \"raw_data\": {\"basename\": \"x\", \"bytes\": 1}, "
         "\"zip_data\": null}",
         PD_EUNSUPPORTED, "format 'parquet'"},
        {"{\"version\": 1, \"format\": \"mds\", \"samples\": 5, \"raw_data\": {\"basename\": \"x\", \"bytes\": 1}, "
         "\"zip_data\": null}",
         PD_EUNSUPPORTED, "shard 1: \"version\" is 1"},
        {"{\"format\": \"mds\", \"samples\": 5, \"raw_data\": {\"basename\": \"x\", \"bytes\": 1}, \"zip_data\": null}",
         PD_EINVAL, "shard 1: \"version\" is missing"},
        {"{\"version\": 2, \"format\": \"mds\", \"samples\": 5, \"raw_data\": {\"bytes\": 1}, \"zip_data\": null}",
         PD_EINVAL, "no \"basename\""},
        {"{\"version\": 2, \"format\": \"mds\", \"samples\": 5, \"raw_data\": {\"basename\": \"x\"}, \"zip_data\": null}",
         PD_EINVAL, "no \"bytes\""},
        {"{\"version\": 2, \"format\": \"mds\", \"samples\": 5, \"compression\": \"zstd\", "
         "\"raw_data\": {\"basename\": \"x\", \"bytes\": 1}, \"zip_data\": null}",
         PD_EINVAL, "\"compression\" is set but \"zip_data\" is null"},
        {"{\"version\": 2, \"format\": \"json\", \"samples\": 9223372036854775807, "
         "\"raw_data\": {\"basename\": \"x\", \"bytes\": 1}, \"zip_data\": null}",
         PD_EOVERFLOW, "more than 2^63"},
    };
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const char *const two[] = {ok, entries[i].entry};
        write_index(at("index.json"), two, 2);
        int rc = pd_layout_read_mds(at("index.json"), 0, &l, err, sizeof err);
        if (rc != entries[i].code || !strstr(err, entries[i].mention))
            fail_msg("entry %zu: rc %d, want %d; message: %s", i, rc, entries[i].code, err);
    }
    assert_null(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wds_split),
        cmocka_unit_test(test_wds_meta),
        cmocka_unit_test_setup_teardown(test_count_groups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_reads_headers_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_bad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_wide_sample, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_as_tarfile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_compressed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tar_specs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tar_specs_bad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_glob_dialect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sizes_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mds_bad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mds_bad_shards, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
