/* Dataset registry: a sorted in-memory table guarded by a mutex, written through to SQLite in WAL mode. */
#include "daemon/registry.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "core/error.h"
#include "core/name.h"
#include "core/perm.h"
#include "core/shards.h"
#include "daemon/clock.h"
#include "daemon/definition.h"
#include "daemon/log.h"

#define PD_REGISTRY_APP_ID 0x70657264 /* PRAGMA application_id of a permd registry: "perd" */
#define PD_REGISTRY_MARK "PRAGMA application_id=1885696612;" /* the same, in decimal as SQL takes it */
_Static_assert(PD_REGISTRY_APP_ID == 1885696612, "PD_REGISTRY_MARK spells PD_REGISTRY_APP_ID");
#define PD_REGISTRY_SCHEMA 3 /* PRAGMA user_version of the current schema (2: shard layouts, 3: mixtures); the
                              * row checksums' column is added to any schema 3 without a version of its own: an
                              * older permd ignores it and writes rows without one, which load unchecked */

#define PD_REGISTRY_BUSY_MS 5000 /* registry_busy_ms's default (pd_registry_open) */

/* A dataset and, when sharded, its layout (the table owns one reference). */
typedef struct pd_entry {
    pd_dataset d;
    pd_layout *layout;
    int stored; /* a row in registry.db (a config dataset is not, until a put of it) */
} pd_entry;

struct pd_registry {
    int lock_fd;                /* registry.lock, flock'd for the registry's life; -1 before */
    sqlite3 *db;
    sqlite3_stmt *put, *del, *put_mix, *del_mix;
    pthread_mutex_t write_lock; /* one SQLite transaction at a time */
    pthread_mutex_t lock;       /* guards the table below; never held across disk I/O */
    pd_entry *sets;             /* sorted by name */
    size_t n, cap;
    uint64_t layout_limit;      /* a sharded put beyond it is refused; 0: none */
    uint64_t mix_limit;         /* a mixture put that would hold more definition bytes is refused; 0: none */
    size_t skipped;             /* rows found damaged at load (their names stay usable) */
    _Atomic uint64_t checkpoint_failures; /* commits left in the WAL by a failed checkpoint */
    pd_mixdef **mixes;          /* sorted by name (the table holds one reference each) */
    size_t nmix, capmix;
    char pending[4200];         /* registry.db-pending: the last commit a failed checkpoint left in the WAL alone */
    int has_pending;            /* that file exists */
    int opened;                 /* loaded whole: a close may checkpoint (a damaged registry is left as found) */
    unsigned busy_ms;           /* how long a commit or startup waits for a lock another process holds */
    uint64_t busy_since;        /* when the wait for one began (pd_registry_busy) */
    int busy_stopped;           /* that wait ended early: a stop signal is pending */
};

/* Bytes a layout of S shards holds in memory. */
static uint64_t pd_layout_bytes(uint64_t shards)
{
    return (shards + 1) * sizeof(uint64_t) + sizeof(pd_layout);
}

/* Bytes of every layout a registry stored that is still alive. A deleted or replaced dataset's layout lives on
 * while a plan, a stream or a request holds it, so counting the table alone let put / stream / delete / put
 * grow memory past layout_memory with the gauge reading one layout. Process-wide: the last reference may go
 * after the registry that stored the layout was closed (the plan cache closes after it). */
static _Atomic uint64_t pd_layouts_held;

/* What a failed SQLite write means, in words for the client: the cause, not "I/O error". */
/* SQLite's busy handler: wait for a lock another process holds, registry_busy_ms at most, as sqlite3_busy_timeout
 * does, but give up at once when SIGTERM or SIGINT is pending. Startup runs with them blocked (sigmask.h: only the
 * loop takes them, once it runs), so a stop during a long wait (registry_busy_ms allows 10 minutes) used to wait
 * it out. At run time they are taken at once by the loop, never left pending. */
static int pd_registry_busy(void *arg, int tries)
{
    pd_registry *r = arg;
    const uint64_t now = pd_clock_ms();
    if (tries == 0)
        r->busy_since = now;
    sigset_t pending;
    r->busy_stopped = sigpending(&pending) == 0 && (sigismember(&pending, SIGTERM) || sigismember(&pending, SIGINT));
    if (r->busy_stopped || now - r->busy_since >= r->busy_ms)
        return 0;
    const uint64_t left = r->busy_ms - (now - r->busy_since), ms = left < 5 ? left : 5;
    const struct timespec nap = {0, (long)ms * 1000000L};
    nanosleep(&nap, NULL);
    return 1;
}

/* Commits and startup wait for other processes' locks (pd_registry_busy); a checkpoint tries once (timeout 0). */
static void pd_registry_wait_for_locks(pd_registry *r)
{
    sqlite3_busy_handler(r->db, pd_registry_busy, r);
}

static void pd_registry_why(sqlite3 *db, int code, char *err, size_t errlen)
{
    const char *cause = NULL;
    switch (code & 0xff) {
    case SQLITE_FULL:
        cause = "disk full";
        break;
    case SQLITE_READONLY:
        cause = "registry read-only";
        break;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        cause = "registry damaged";
        break;
    case SQLITE_IOERR: /* a failed fsync of the WAL may leave the commit's frames there: a crash replays them */
        cause = "I/O error; a write that failed so may yet be stored (get the name to know; puts are idempotent)";
        break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        cause = "registry locked by another process (or read by one, for a checkpoint)";
        break;
    }
    pd_errf(err, errlen, "%s (%s)", cause ? cause : "storage failed", sqlite3_errmsg(db));
}

/* What SQLite's last error on db means for the caller. Only damage is PD_ECORRUPT (fresh_registry moves
 * such files aside); a lock another process holds is PD_EBUSY, and permissions, a read-only file or
 * directory and I/O errors are PD_EIO: the registry may be intact, so nothing is moved. */
static int pd_registry_code(sqlite3 *db)
{
    switch (sqlite3_errcode(db) & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return PD_ECORRUPT;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return PD_EBUSY;
    case SQLITE_NOMEM:
        return PD_ENOMEM;
    default:
        return PD_EIO;
    }
}

/* ---- Layouts ------------------------------------------------------------------- */

int pd_layout_create(const uint64_t *sizes, uint64_t shards, pd_layout **out)
{
    if (!sizes || !out || shards == 0 || shards > PD_SHARDS_MAX)
        return PD_EINVAL;
    pd_layout *l = malloc(sizeof *l + (size_t)(shards + 1) * sizeof l->start[0]);
    if (!l)
        return PD_ENOMEM;
    int rc = pd_shard_layout_build(sizes, shards, l->start);
    if (rc) {
        free(l);
        return rc;
    }
    atomic_init(&l->refs, 1);
    atomic_init(&l->held, 0);
    atomic_init(&l->retired, 0);
    l->shards = shards;
    l->hash = pd_shard_layout_hash(sizes, shards);
    *out = l;
    return 0;
}

pd_layout *pd_layout_ref(pd_layout *l)
{
    if (l)
        atomic_fetch_add(&l->refs, 1);
    return l;
}

void pd_layout_release(pd_layout *l)
{
    if (l && atomic_fetch_sub(&l->refs, 1) == 1) {
        if (atomic_load(&l->held))
            atomic_fetch_sub(&pd_layouts_held, pd_layout_bytes(l->shards));
        free(l);
    }
}

static int pd_layout_equal(const pd_layout *a, const pd_layout *b)
{
    return a->shards == b->shards && !memcmp(a->start, b->start, (size_t)(a->shards + 1) * sizeof a->start[0]);
}

/* ---- The in-memory table (caller holds r->lock) --------------------------- */

/* Index of name, or of where it would go (with *found = 0). */
static size_t pd_table_find(const pd_registry *r, const char *name, int *found)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->sets[mid].d.name, name);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = 0;
    return lo;
}

/* Insert d at `at`; the table takes over the caller's reference to layout (may be NULL), which is counted
 * from now until its last reference goes (pd_layouts_held). */
static int pd_table_insert(pd_registry *r, size_t at, const pd_dataset *d, pd_layout *layout, int stored)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        pd_entry *s = realloc(r->sets, cap * sizeof *s);
        if (!s)
            return PD_ENOMEM;
        r->sets = s;
        r->cap = cap;
    }
    memmove(r->sets + at + 1, r->sets + at, (r->n - at) * sizeof *r->sets);
    r->sets[at].d = *d;
    r->sets[at].layout = layout;
    r->sets[at].stored = stored;
    r->n++;
    if (layout && !atomic_exchange(&layout->held, 1))
        atomic_fetch_add(&pd_layouts_held, pd_layout_bytes(layout->shards));
    return 0;
}

/* The table's reference goes; the layout stays counted until its last one does (pd_layout_release). */
static void pd_table_remove(pd_registry *r, size_t at)
{
    if (r->sets[at].layout) /* before the release: the plans holding it may be all that keeps it */
        atomic_store(&r->sets[at].layout->retired, 1);
    pd_layout_release(r->sets[at].layout);
    memmove(r->sets + at, r->sets + at + 1, (r->n - at - 1) * sizeof *r->sets);
    r->n--;
}

/* ---- SQLite ---------------------------------------------------------------- */

/* mkdir -p with mode 0700 for directories permd creates (the registry is private). */
static int pd_mkdirs(const char *path)
{
    char tmp[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof tmp)
        return -1;
    memcpy(tmp, path, len + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0700) && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0700) && errno != EEXIST)
        return -1;
    return 0;
}

/* SQLite integers are signed; sizes up to 2^63 are stored as their two's-complement bit pattern. */
static int64_t pd_size_to_db(uint64_t size)
{
    int64_t v;
    memcpy(&v, &size, sizeof v);
    return v;
}

static uint64_t pd_size_from_db(int64_t v)
{
    uint64_t size;
    memcpy(&size, &v, sizeof size);
    return size;
}

/* Sizes travel to and from SQLite as a BLOB of little-endian u64s. */
static int pd_layout_from_blob(const void *blob, int bytes, pd_layout **out)
{
    if (bytes <= 0 || bytes % 8)
        return PD_EINVAL;
    uint64_t shards = (uint64_t)bytes / 8;
    uint64_t *sizes = malloc((size_t)bytes);
    if (!sizes)
        return PD_ENOMEM;
    const uint8_t *b = blob;
    for (uint64_t i = 0; i < shards; i++) {
        uint64_t v = 0;
        for (int k = 7; k >= 0; k--)
            v = v << 8 | b[8 * i + (uint64_t)k];
        sizes[i] = v;
    }
    int rc = pd_layout_create(sizes, shards, out);
    free(sizes);
    return rc;
}

static uint8_t *pd_layout_to_blob(const pd_layout *l, size_t *bytes)
{
    *bytes = (size_t)l->shards * 8;
    uint8_t *b = malloc(*bytes);
    if (!b)
        return NULL;
    for (uint64_t i = 0; i < l->shards; i++) {
        uint64_t v = l->start[i + 1] - l->start[i];
        for (int k = 0; k < 8; k++, v >>= 8)
            b[8 * i + (uint64_t)k] = (uint8_t)v;
    }
    return b;
}

/* ---- Row checksums: SQLite checks its pages' structure, not the values in them; a bit flipped in a size, a
 * shard layout or a mixture's weights would load and serve other ids. Each row carries FNV-1a over its
 * columns (column `sum`); a row whose sum does not match is not served. Rows written before (or by an older
 * permd since) have none and load unchecked. */

static uint64_t pd_fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * UINT64_C(0x100000001b3);
    return h;
}

static uint64_t pd_fnv_u64(uint64_t h, uint64_t v)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(v >> (8 * i));
    return pd_fnv(h, le, sizeof le);
}

static int64_t pd_dataset_row_sum(const char *name, int64_t size, int64_t created_ms, const void *shards,
                                  size_t shards_len, int64_t window, int64_t lanes)
{
    uint64_t h = pd_fnv(UINT64_C(0xcbf29ce484222325), name, strlen(name) + 1);
    h = pd_fnv_u64(h, (uint64_t)size);
    h = pd_fnv_u64(h, (uint64_t)created_ms);
    h = pd_fnv_u64(h, shards ? shards_len : UINT64_MAX); /* NULL (flat) is not an empty blob */
    h = pd_fnv(h, shards, shards ? shards_len : 0);
    h = pd_fnv_u64(h, (uint64_t)window);
    return (int64_t)pd_fnv_u64(h, (uint64_t)lanes);
}

static int64_t pd_mixture_row_sum(const char *name, const void *def, size_t def_len, int64_t created_ms)
{
    uint64_t h = pd_fnv(UINT64_C(0xcbf29ce484222325), name, strlen(name) + 1);
    h = pd_fnv_u64(h, def_len);
    h = pd_fnv(h, def, def_len);
    return (int64_t)pd_fnv_u64(h, (uint64_t)created_ms);
}

/* Whether column `col` of row st holds sum (or NULL: a row from before checksums). */
static int pd_row_sum_ok(sqlite3_stmt *st, int col, int64_t sum)
{
    return sqlite3_column_type(st, col) == SQLITE_NULL || sqlite3_column_int64(st, col) == sum;
}

/* A row that is not loaded: logged and counted. Its name (when a request can carry it) stays usable: a put or
 * delete of it replaces or removes the row. */
static void pd_registry_skip(pd_registry *r, int mixture, const char *name, const char *reason, const char *why)
{
    const char *what = mixture ? "Mixture" : "Dataset";
    pd_log_error("registry_skip",
                 "reason=\"%s\" name=\"%s\" msg=\"%sthe %s is not served; a Put%s or Delete%s of its name replaces or "
                 "removes the row\"",
                 reason, name ? name : "", why, mixture ? "mixture" : "dataset", what, what);
    r->skipped++;
}

#define PD_HEX_SHOWN 128 /* name bytes a skip line spells out; a longer name is matched by its prefix */

/* A row whose name no request can carry (not TEXT, a NUL inside, outside the name rules): no put or delete can
 * reach it, so the line says how to remove it by hand, by the name's bytes in hex (docs/operations.md). */
static void pd_registry_skip_unnamed(pd_registry *r, int mixture, sqlite3_stmt *st, const char *reason)
{
    char hex[2 * PD_HEX_SHOWN + 1];
    const uint8_t *b = sqlite3_column_blob(st, 0); /* the bytes as stored, whatever their type */
    int bytes = sqlite3_column_bytes(st, 0), shown = bytes < PD_HEX_SHOWN ? bytes : PD_HEX_SHOWN;
    for (int i = 0; i < shown; i++)
        snprintf(hex + 2 * i, 3, "%02X", b[i]);
    hex[2 * (shown > 0 ? shown : 0)] = '\0';
    pd_log_error("registry_skip",
                 "reason=\"%s\" name_hex=\"%s\" name_bytes=%d msg=\"the %s is not served, and no request can name "
                 "it: remove the row with sqlite3 (docs/operations.md): DELETE FROM %s WHERE hex(name) %s '%s%s';\"",
                 reason, hex, bytes, mixture ? "mixture" : "dataset", mixture ? "mixtures" : "datasets",
                 bytes > PD_HEX_SHOWN ? "LIKE" : "=", hex, bytes > PD_HEX_SHOWN ? "%" : "");
    r->skipped++;
}

/* Column 0's name when a request could carry it: TEXT, as long as its C string (no NUL inside), within the
 * name rules. Else NULL, and the row is skipped (logged) here: sqlite3_column_text would read a BLOB
 * 'ds1\0evil' as "ds1", another row's name. */
static const char *pd_row_name(pd_registry *r, int mixture, sqlite3_stmt *st)
{
    if (sqlite3_column_type(st, 0) != SQLITE_TEXT) {
        pd_registry_skip_unnamed(r, mixture, st, "name is not TEXT");
        return NULL;
    }
    const char *name = (const char *)sqlite3_column_text(st, 0);
    if (!name || strlen(name) != (size_t)sqlite3_column_bytes(st, 0)) {
        pd_registry_skip_unnamed(r, mixture, st, "name holds a NUL byte");
        return NULL;
    }
    if (pd_name_check(name)) {
        pd_registry_skip_unnamed(r, mixture, st, "name breaks the name rules");
        return NULL;
    }
    return name;
}

/* The first of columns cols[0..n) whose stored type is not want (SQLite would coerce it silently: '12abc'
 * reads as 12, 5.9 as 5), or -1. A NULL passes where null_ok. */
static int pd_row_bad_type(sqlite3_stmt *st, const int *cols, int n, int want, int null_ok)
{
    for (int i = 0; i < n; i++) {
        int t = sqlite3_column_type(st, cols[i]);
        if (t != want && !(null_ok && t == SQLITE_NULL))
            return cols[i];
    }
    return -1;
}

static const char *pd_sqlite_type_name(int t)
{
    switch (t) {
    case SQLITE_INTEGER:
        return "INTEGER";
    case SQLITE_FLOAT:
        return "REAL";
    case SQLITE_TEXT:
        return "TEXT";
    case SQLITE_BLOB:
        return "BLOB";
    default:
        return "NULL";
    }
}

/* Skips the row (named name) when a column has the wrong type; 1 when it did. */
static int pd_row_skip_types(pd_registry *r, int mixture, sqlite3_stmt *st, const char *name, const int *ints,
                             int nints, int blob_col, int blob_null_ok, int sum_col)
{
    int bad = pd_row_bad_type(st, ints, nints, SQLITE_INTEGER, 0), want = SQLITE_INTEGER;
    if (bad < 0 && blob_col >= 0 && pd_row_bad_type(st, &blob_col, 1, SQLITE_BLOB, blob_null_ok) >= 0) {
        bad = blob_col;
        want = SQLITE_BLOB;
    }
    if (bad < 0 && pd_row_bad_type(st, &sum_col, 1, SQLITE_INTEGER, 1) >= 0)
        bad = sum_col;
    if (bad < 0)
        return 0;
    char reason[128];
    snprintf(reason, sizeof reason, "column %s is %s, not %s%s", sqlite3_column_name(st, bad),
             pd_sqlite_type_name(sqlite3_column_type(st, bad)), pd_sqlite_type_name(want),
             want == SQLITE_BLOB && blob_null_ok ? " or NULL" : bad == sum_col ? " or NULL" : "");
    pd_registry_skip(r, mixture, name, reason, "");
    return 1;
}

#define PD_ROW_CHANGED "the row changed on disk since permd wrote it: "

static int pd_registry_load(pd_registry *r, char *err, size_t errlen)
{
    static const int ints[] = {1, 2, 4, 5}; /* size, created_ms, window, lanes */
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(r->db,
                                "SELECT name, size, created_ms, shards, window, lanes, sum FROM datasets ORDER BY name",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        goto fail;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        pd_dataset d = {0};
        pd_layout *layout = NULL;
        int found;
        const char *name = pd_row_name(r, 0, st);
        /* Types first: every row is checked, also one without a checksum (written by an older permd), whose
         * values nothing else vouches for. */
        if (!name || pd_row_skip_types(r, 0, st, name, ints, 4, 3, 1, 6))
            continue;
        const int shards_type = sqlite3_column_type(st, 3); /* NULL: flat; a BLOB: the layout */
        const void *blob = shards_type == SQLITE_BLOB ? sqlite3_column_blob(st, 3) : NULL;
        const int blob_len = sqlite3_column_bytes(st, 3);
        const int64_t window = sqlite3_column_int64(st, 4), lanes = sqlite3_column_int64(st, 5);
        if (!pd_row_sum_ok(st, 6, pd_dataset_row_sum(name, sqlite3_column_int64(st, 1), sqlite3_column_int64(st, 2),
                                                     blob, (size_t)blob_len, window, lanes))) {
            pd_registry_skip(r, 0, name, "checksum mismatch", PD_ROW_CHANGED);
            continue;
        }
        d.size = pd_size_from_db(sqlite3_column_int64(st, 1));
        d.created_ms = sqlite3_column_int64(st, 2);
        char reason[96];
        if (d.size == 0 || d.size > PD_N_MAX) {
            snprintf(reason, sizeof reason, "column size out of range (%llu)", (unsigned long long)d.size);
            pd_registry_skip(r, 0, name, reason, "");
            continue;
        }
        if (shards_type != SQLITE_NULL) {
            if (!blob || pd_layout_from_blob(blob, blob_len, &layout) || layout->start[layout->shards] != d.size) {
                pd_layout_release(layout);
                pd_registry_skip(r, 0, name, "invalid shard layout", "");
                continue;
            }
            if (window == 0 || lanes <= 0 || lanes > UINT32_MAX) { /* window: any u64 but 0 (stored as its bits) */
                pd_layout_release(layout);
                snprintf(reason, sizeof reason, "column %s out of range (%lld)", window == 0 ? "window" : "lanes",
                         (long long)(window == 0 ? window : lanes));
                pd_registry_skip(r, 0, name, reason, "");
                continue;
            }
            d.shards = layout->shards;
            d.layout_hash = layout->hash;
            d.window = (uint64_t)window;
            d.lanes = (uint32_t)lanes;
        }
        strcpy(d.name, name);
        /* Rows arrive sorted, and a name is the primary key: a duplicate would mean the file lies. */
        size_t at = pd_table_find(r, d.name, &found);
        if (found) {
            pd_layout_release(layout);
            pd_registry_skip(r, 0, name, "duplicate name", "");
            continue;
        }
        if (pd_table_insert(r, at, &d, layout, 1)) {
            pd_layout_release(layout);
            sqlite3_finalize(st);
            pd_errf(err, errlen, "out of memory loading the registry");
            return PD_ENOMEM;
        }
    }
    if (rc != SQLITE_DONE)
        goto fail;
    sqlite3_finalize(st);
    return 0;
fail:
    rc = pd_registry_code(r->db);
    pd_errf(err, errlen, "reading the registry: %s", sqlite3_errmsg(r->db));
    sqlite3_finalize(st);
    return rc;
}

/* Column `col` (declared decl) on table unless it is there already: a user_version set back by hand, or the
 * checksum column, which schema 3 gains without a version of its own. 1 on success. */
static int pd_registry_add_column(sqlite3 *db, const char *table, const char *col, const char *decl)
{
    char sql[160];
    sqlite3_stmt *st;
    snprintf(sql, sizeof sql, "SELECT %s FROM %s LIMIT 0", col, table);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
        sqlite3_finalize(st);
        return 1;
    }
    snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN %s %s;", table, col, decl);
    return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK;
}

/* The schema version (PRAGMA user_version), read before anything is written: a registry this permd cannot
 * read is refused untouched. 0 for a new file. */
static int pd_registry_version(pd_registry *r, const char *path, int *version, char *err, size_t errlen)
{
    sqlite3_stmt *st;
    int step = SQLITE_ERROR;
    *version = 0;
    if (sqlite3_prepare_v2(r->db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK) {
        if ((step = sqlite3_step(st)) == SQLITE_ROW)
            *version = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    if (step != SQLITE_ROW) {
        pd_errf(err, errlen, "%s: reading the schema version: %s", path, sqlite3_errmsg(r->db));
        return pd_registry_code(r->db);
    }
    if (*version > PD_REGISTRY_SCHEMA) {
        pd_errf(err, errlen, "%s: registry schema %d is newer than this permd's (%d); run a newer permd", path,
                *version, PD_REGISTRY_SCHEMA);
        return PD_EUNSUPPORTED;
    }
    if (*version < 0) {
        pd_errf(err, errlen, "%s: registry schema %d is not one permd writes (PRAGMA user_version was changed); "
                "restore a backup, or set it back with sqlite3 if you know the schema", path, *version);
        return PD_EUNSUPPORTED;
    }
    return 0;
}

/* Whose file registry.db is, read before anything is written. permd's registries carry application_id
 * PD_REGISTRY_APP_ID from schema 3's row checksums on; an older permd's carry 0 and nothing but permd's
 * tables. Another program's SQLite file, put at registry.db by mistake (a path mixed up in a deployment), is
 * refused untouched: it used to be adopted, permd adding its tables to that program's data. *adopt is 1 for a
 * file of an older permd, whose id is written by the migration. */
static int pd_registry_owner(pd_registry *r, const char *path, int *adopt, char *err, size_t errlen)
{
    sqlite3_stmt *st;
    int64_t id = -1;
    *adopt = 0;
    if (sqlite3_prepare_v2(r->db, "PRAGMA application_id", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            id = (uint32_t)sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    if (id == PD_REGISTRY_APP_ID)
        return 0;
    if (id < 0) {
        pd_errf(err, errlen, "%s: reading its application_id: %s", path, sqlite3_errmsg(r->db));
        return pd_registry_code(r->db);
    }
    /* id 0: permd's tables only (an index SQLite makes for them is named sqlite_*), datasets with its columns. */
    char other[128] = "";
    int datasets = 0, shaped = 0;
    if (id == 0 && sqlite3_prepare_v2(r->db, "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' "
                                             "ESCAPE '\\' ORDER BY name", -1, &st, NULL) == SQLITE_OK) {
        while (sqlite3_step(st) == SQLITE_ROW) {
            const char *name = (const char *)sqlite3_column_text(st, 0);
            if (name && !strcmp(name, "datasets"))
                datasets = 1;
            else if (name && strcmp(name, "mixtures") && !other[0])
                snprintf(other, sizeof other, "%s", name);
        }
        sqlite3_finalize(st);
        shaped = datasets && sqlite3_prepare_v2(r->db, "SELECT name, size, created_ms FROM datasets LIMIT 0", -1,
                                                &st, NULL) == SQLITE_OK;
        if (shaped)
            sqlite3_finalize(st);
    }
    if (id == 0 && !other[0] && (shaped || !datasets)) {
        *adopt = 1;
        return 0;
    }
    if (id != 0)
        pd_errf(err, errlen, "%s is not a permd registry: it is another program's SQLite file (application_id "
                "0x%08llx); permd leaves it untouched. Move it away, or point state_dir elsewhere", path,
                (unsigned long long)id);
    else if (other[0])
        pd_errf(err, errlen, "%s is not a permd registry: it holds %s, which permd does not write; permd leaves it "
                "untouched. Move it away, or point state_dir elsewhere", path, other);
    else
        pd_errf(err, errlen, "%s is not a permd registry: its datasets table has other columns than permd's; permd "
                "leaves it untouched. Move it away, or point state_dir elsewhere", path);
    return PD_EUNSUPPORTED;
}

/* Older schemas gain what they lack in place, in one transaction: 1 (flat datasets only) the shard columns,
 * 2 the mixtures' table, and every one the row checksums' column. Each step is skipped when its column or
 * table is there already (a user_version set back), so a migration never fails on what it would add. */
static int pd_registry_migrate(pd_registry *r, const char *path, int version, char *err, size_t errlen)
{
    static const char v3[] = "CREATE TABLE IF NOT EXISTS mixtures ("
                             "  name TEXT PRIMARY KEY NOT NULL,"
                             "  def BLOB NOT NULL,"
                             "  created_ms INTEGER NOT NULL) WITHOUT ROWID;";
    if (version == PD_REGISTRY_SCHEMA) {
        /* A schema-3 file whose mixtures' table was dropped by hand: its datasets are intact, and what it
         * lost is gone either way. Created empty, said once, rather than refusing the whole registry as an
         * I/O error that fresh_registry would not move aside. */
        sqlite3_stmt *st;
        int named = 1;
        if (sqlite3_prepare_v2(r->db, "SELECT count(*) FROM sqlite_master WHERE name = 'mixtures'", -1, &st,
                               NULL) == SQLITE_OK) {
            if (sqlite3_step(st) == SQLITE_ROW)
                named = sqlite3_column_int(st, 0) > 0;
            sqlite3_finalize(st);
        }
        if (!named && sqlite3_exec(r->db, v3, NULL, NULL, NULL) == SQLITE_OK)
            pd_log_warn("registry", "path=%s msg=\"schema 3 without its mixtures table (dropped by hand?): created "
                        "empty; the datasets are kept\"", path);
        if (pd_registry_add_column(r->db, "datasets", "sum", "INTEGER") &&
            pd_registry_add_column(r->db, "mixtures", "sum", "INTEGER"))
            return 0;
        pd_errf(err, errlen, "%s: adding the row checksums' column: %s", path, sqlite3_errmsg(r->db));
        return pd_registry_code(r->db);
    }
    int ok = sqlite3_exec(r->db, "BEGIN;", NULL, NULL, NULL) == SQLITE_OK &&
             pd_registry_add_column(r->db, "datasets", "shards", "BLOB") &&
             pd_registry_add_column(r->db, "datasets", "window", "INTEGER NOT NULL DEFAULT 0") &&
             pd_registry_add_column(r->db, "datasets", "lanes", "INTEGER NOT NULL DEFAULT 0") &&
             sqlite3_exec(r->db, v3, NULL, NULL, NULL) == SQLITE_OK &&
             pd_registry_add_column(r->db, "datasets", "sum", "INTEGER") &&
             pd_registry_add_column(r->db, "mixtures", "sum", "INTEGER") &&
             sqlite3_exec(r->db, "PRAGMA user_version=3; COMMIT;", NULL, NULL, NULL) == SQLITE_OK;
    if (!ok) {
        /* The cause first: ROLLBACK replaces SQLite's last error ("not an error"). */
        int rc = pd_registry_code(r->db);
        pd_errf(err, errlen, "%s: migrating the registry from schema %d to %d failed: %s", path, version,
                PD_REGISTRY_SCHEMA, sqlite3_errmsg(r->db));
        sqlite3_exec(r->db, "ROLLBACK;", NULL, NULL, NULL);
        return rc;
    }
    pd_log_info("registry_migrate", "from=%d to=%d", version, PD_REGISTRY_SCHEMA);
    return 0;
}

/* ---- The mixtures' table (caller holds r->lock) --------------------------- */

/* Index of a mixture's name, or of where it would go (*found = 0). */
static size_t pd_mix_find(const pd_registry *r, const char *name, int *found)
{
    size_t lo = 0, hi = r->nmix;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->mixes[mid]->name, name);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = 0;
    return lo;
}

/* Put d (the table takes the caller's reference) at `at`, or in place of the one there (replace). */
static int pd_mix_insert(pd_registry *r, size_t at, pd_mixdef *d, int replace)
{
    if (replace) {
        pd_mixdef_release(r->mixes[at]);
        r->mixes[at] = d;
        return 0;
    }
    if (r->nmix == r->capmix) {
        size_t cap = r->capmix ? 2 * r->capmix : 8;
        pd_mixdef **p = realloc(r->mixes, cap * sizeof *p);
        if (!p)
            return PD_ENOMEM;
        r->mixes = p;
        r->capmix = cap;
    }
    memmove(r->mixes + at + 1, r->mixes + at, (r->nmix - at) * sizeof *r->mixes);
    r->mixes[at] = d;
    r->nmix++;
    return 0;
}

/* The mixture using dataset `name` as a component, if any (for a refused delete). */
static const pd_mixdef *pd_mix_user(const pd_registry *r, const char *name)
{
    for (size_t i = 0; i < r->nmix; i++)
        for (uint32_t j = 0; j < r->mixes[i]->components; j++)
            if (!strcmp(r->mixes[i]->comp[j].name, name))
                return r->mixes[i];
    return NULL;
}

static int pd_registry_load_mixtures(pd_registry *r, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(r->db, "SELECT name, def, created_ms, sum FROM mixtures ORDER BY name", -1, &st,
                                NULL);
    if (rc != SQLITE_OK)
        goto fail;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        static const int ints[] = {2}; /* created_ms */
        const char *name = pd_row_name(r, 1, st);
        pd_mixdef *d;
        int found;
        if (!name || pd_row_skip_types(r, 1, st, name, ints, 1, 1, 0, 3))
            continue;
        if (!pd_row_sum_ok(st, 3, pd_mixture_row_sum(name, sqlite3_column_blob(st, 1),
                                                      (size_t)sqlite3_column_bytes(st, 1),
                                                      sqlite3_column_int64(st, 2)))) {
            pd_registry_skip(r, 1, name, "checksum mismatch", PD_ROW_CHANGED);
            continue;
        }
        if (pd_mixdef_decode(name, sqlite3_column_blob(st, 1), (size_t)sqlite3_column_bytes(st, 1), &d)) {
            pd_registry_skip(r, 1, name, "invalid mixture", "");
            continue;
        }
        d->created_ms = sqlite3_column_int64(st, 2);
        pd_table_find(r, name, &found); /* datasets and mixtures share one namespace: a put never makes both */
        if (found) {
            pd_mixdef_release(d);
            pd_registry_skip(r, 1, name, "a dataset has this name", "");
            continue;
        }
        size_t at = pd_mix_find(r, name, &found); /* rows arrive sorted; a duplicate would mean the file lies */
        if (found) {
            pd_mixdef_release(d);
            pd_registry_skip(r, 1, name, "duplicate name", "");
            continue;
        }
        if (pd_mix_insert(r, at, d, 0)) {
            pd_mixdef_release(d);
            sqlite3_finalize(st);
            pd_errf(err, errlen, "out of memory loading the registry");
            return PD_ENOMEM;
        }
    }
    if (rc != SQLITE_DONE)
        goto fail;
    sqlite3_finalize(st);
    return 0;
fail:
    rc = pd_registry_code(r->db);
    pd_errf(err, errlen, "reading the registry's mixtures: %s", sqlite3_errmsg(r->db));
    sqlite3_finalize(st);
    return rc;
}

/* Fold the WAL into registry.db and empty it, so the main file alone holds every committed dataset
 * (a WAL lost or damaged after a crash then loses nothing that was acknowledged). */
static int pd_registry_checkpoint(pd_registry *r)
{
    return sqlite3_wal_checkpoint_v2(r->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
}

/* fsync the directory holding path, so that a file created or renamed there keeps its name after a crash. */
static void pd_fsync_dir_of(const char *path)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
}

/* registry.db-pending lists the commits that live in the WAL alone: a WAL lost or damaged before a checkpoint
 * folds them in would lose commits acknowledged as durable, and SQLite, which reads a WAL up to its first bad
 * frame, would start without them and say nothing. Startup checks them (pd_pending_check); the file goes once a
 * checkpoint succeeds. One line a commit, appended: "put|delete dataset|mixture <definition, hex> <name>". Every
 * one, not the last alone: a put, then a delete of another name, both in the WAL and the WAL lost, passed a check
 * of the delete and lost the put. A line that cannot be appended drops the list (see below); one a crash cut
 * short is followed by a newline first, so the next is read whole. */
static void pd_pending_write(pd_registry *r, const char *op, const char *kind, uint64_t definition, const char *name)
{
    char line[PD_NAME_MAX + 65], last = '\n';
    struct stat st;
    int fd = open(r->pending, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    const int had = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (had && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) != 1)
        last = 0;
    /* After a line a crash cut short: a newline first, so that this one is read whole. */
    int n = snprintf(line, sizeof line, "%s%s %s %016llx %s\n", last == '\n' ? "" : "\n", op, kind,
                     (unsigned long long)definition, name);
    ssize_t wrote = had ? write(fd, line, (size_t)n) : -1;
    if (wrote != n || fsync(fd)) {
        const int e = wrote >= 0 && wrote < n ? ENOSPC : errno;
        /* Unlisted, this commit would leave an earlier line of its name contradicting it, and startup would
         * refuse an intact registry: no list at all instead (a lost WAL then goes unnoticed, as before it). */
        if (fd >= 0)
            close(fd);
        fd = -1;
        unlink(r->pending);
        r->has_pending = 0;
        pd_log_warn("registry_checkpoint", "path=%s msg=\"cannot record the commit left in the WAL (%s): the list "
                    "of such commits is dropped; a WAL lost before the next checkpoint would go unnoticed\"",
                    r->pending, strerror(e));
    } else if (!r->has_pending) {
        pd_fsync_dir_of(r->pending); /* the file's name, durable too */
        r->has_pending = 1;
    }
    if (fd >= 0)
        close(fd);
}

static void pd_pending_clear(pd_registry *r)
{
    if (r->has_pending && (unlink(r->pending) == 0 || errno == ENOENT))
        r->has_pending = 0;
}

/* After a commit that succeeded. The commit is durable already (synchronous=FULL fsynced it into the WAL, and
 * a restart reads it back), so a checkpoint that fails (a full disk, a reader holding the WAL) must not turn
 * it into a reported failure: the client would be told "not stored" of a dataset that appears after the next
 * restart. It is logged and counted instead, and the next commit's checkpoint, or startup's, retries. */
static void pd_registry_after_commit(pd_registry *r, const char *op, const char *kind, uint64_t definition,
                                     const char *name)
{
    /* Tried once, without the busy timeout: another process reading the registry (a backup) holds the WAL
     * for as long as it reads, and waiting for it made every put take 5 s. What it leaves is durable. */
    sqlite3_busy_timeout(r->db, 0);
    int code = pd_registry_checkpoint(r);
    pd_registry_wait_for_locks(r);
    if (code == SQLITE_OK) {
        pd_pending_clear(r);
        return;
    }
    char why[256];
    pd_registry_why(r->db, code, why, sizeof why);
    atomic_fetch_add(&r->checkpoint_failures, 1);
    pd_pending_write(r, op, kind, definition, name);
    pd_log_warn("registry_checkpoint",
                "%s=%s msg=\"committed and durable in registry.db-wal, but not folded into registry.db: %s; the "
                "next commit or startup retries\"",
                !strcmp(kind, "dataset") ? "name" : "mixture", name, why);
}

/* A failed commit: SQLite rolled the statement's transaction back (nothing is stored); err gets the cause.
 * PD_EBUSY for a lock another process holds, else PD_EIO. */
static int pd_registry_commit_failed(pd_registry *r, const char *event, const char *key, const char *name, char *err,
                                     size_t errlen)
{
    const int code = pd_registry_code(r->db); /* read before anything else runs on db */
    pd_registry_why(r->db, sqlite3_errcode(r->db), err, errlen);
    pd_log_error(event, "%s=%s msg=\"%s\"", key, name, sqlite3_errmsg(r->db));
    return code == PD_EBUSY ? PD_EBUSY : PD_EIO; /* a lock another process holds passes: a retry may work */
}

/* Whether SQLite can read the whole file: quick_check reads every page and index. 0, or PD_ECORRUPT when it
 * finds damage (or the file is not a database); PD_EBUSY and PD_EIO when it could not look (a lock another
 * process holds, permissions, I/O): those say nothing about damage. why gets SQLite's words. */
static int pd_registry_check(pd_registry *r, char *why, size_t len)
{
    sqlite3_stmt *st;
    int rc;
    if (sqlite3_prepare_v2(r->db, "PRAGMA quick_check", -1, &st, NULL) != SQLITE_OK) {
        pd_errf(why, len, "%s", sqlite3_errmsg(r->db));
        return pd_registry_code(r->db);
    }
    if (sqlite3_step(st) == SQLITE_ROW) {
        const char *v = (const char *)sqlite3_column_text(st, 0);
        rc = v && !strcmp(v, "ok") ? 0 : PD_ECORRUPT; /* a row is quick_check's verdict: "ok" or a problem */
        pd_errf(why, len, "%s", v ? v : "no verdict");
    } else {
        rc = pd_registry_code(r->db);
        pd_errf(why, len, "%s", sqlite3_errmsg(r->db));
    }
    sqlite3_finalize(st);
    return rc;
}

/* What a registry that cannot be opened or read (not damaged) needs, for the startup message. */
static const char *pd_registry_advice(int rc)
{
    switch (rc) {
    case PD_ECORRUPT:
        return ": the registry is damaged";
    case PD_EBUSY:
        return ": another process holds a lock on it (permd waited registry_busy_ms); the registry is not damaged: "
               "find the process (fuser registry.db) and start permd when it is done";
    default:
        return ": the registry may be intact; check the permissions and free space of the state directory and "
               "its files";
    }
}

/* Rename registry.db and its -wal and -shm aside (registry.db.damaged-<unix ms>), so a fresh one can start
 * while the damaged files are kept for inspection; moved gets the new name. Under the registry's lock. */
static int pd_registry_move_aside(const char *state_dir, char *moved, size_t len)
{
    static const char *const suffix[] = {"", "-wal", "-shm", "-pending"};
    char from[4200], to[4300];
    long long now = (long long)pd_clock_unix_ms();
    pd_errf(moved, len, "%s/registry.db.damaged-%lld", state_dir, now);
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        snprintf(from, sizeof from, "%s/registry.db%s", state_dir, suffix[i]);
        snprintf(to, sizeof to, "%s/registry.db.damaged-%lld%s", state_dir, now, suffix[i]);
        if (rename(from, to) && errno != ENOENT)
            return PD_EIO;
    }
    return 0;
}

/* One permd per state directory, for the registry's life. Two would each keep their own table over one
 * database, and a put through one would silently replace a row the other acknowledged. flock on a file of its
 * own: SQLite's locking_mode=EXCLUSIVE would also shut out the sqlite3 shell's online backup
 * (docs/operations.md), and flock on registry.db itself could collide with SQLite's own fcntl locks where the
 * kernel emulates flock with them (NFS). The kernel drops the lock with the process, so a crash leaves nothing
 * to clean up; the file stays (removing it would race with the next holder) and holds the holder's pid. */
static int pd_registry_lock(pd_registry *r, const char *state_dir, char *err, size_t errlen)
{
    char path[4200], holder[32];
    snprintf(path, sizeof path, "%s/registry.lock", state_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        pd_errf(err, errlen, "%s: cannot open the state directory's lock file: %s (permd must be able to write "
                "state_dir)", path, strerror(errno));
        return PD_EIO;
    }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno, rc = PD_EIO;
        if (e == EWOULDBLOCK) {
            ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
            holder[n > 0 ? n : 0] = '\0';
            holder[strspn(holder, "0123456789")] = '\0';
            pd_errf(err, errlen, "state_dir %s is in use by another permd (pid %s, holding %s): two permd cannot "
                    "share one registry; stop that one, or give this one its own state_dir",
                    state_dir, holder[0] ? holder : "unknown", path);
            rc = PD_EBUSY;
        } else {
            pd_errf(err, errlen, "%s: cannot lock: %s", path, strerror(e));
        }
        close(fd);
        return rc;
    }
    /* The pid is for the message above only: the lock holds whether or not it could be written. */
    int n = snprintf(holder, sizeof holder, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) == 0 && pwrite(fd, holder, (size_t)n, 0) != n)
        pd_log_warn("registry", "path=%s msg=\"cannot write the pid into the lock file\"", path);
    r->lock_fd = fd;
    return 0;
}

/* The database's part of the registry: its connection, statements and the tables loaded from it. */
static void pd_registry_close_db(pd_registry *r)
{
    sqlite3_finalize(r->put);
    sqlite3_finalize(r->del);
    sqlite3_finalize(r->put_mix);
    sqlite3_finalize(r->del_mix);
    r->put = r->del = r->put_mix = r->del_mix = NULL;
    for (size_t i = 0; i < r->nmix; i++)
        pd_mixdef_release(r->mixes[i]);
    free(r->mixes);
    r->mixes = NULL;
    r->nmix = r->capmix = 0;
    sqlite3_close(r->db);
    r->db = NULL;
    for (size_t i = 0; i < r->n; i++)
        pd_layout_release(r->sets[i].layout);
    free(r->sets);
    r->sets = NULL;
    r->n = r->cap = 0;
    r->skipped = 0;
}

/* The line pd_pending_write writes, whole: "put|delete dataset|mixture <16 hex digits> <name>\n". 0, or -1 for
 * anything else (torn by a crash while it was written, or not ours). */
static int pd_pending_parse(const char *line, char *op, char *kind, uint64_t *definition, char *name)
{
    char hex[17];
    int end = 0;
    if (sscanf(line, "%15s %15s %16s %129s%n", op, kind, hex, name, &end) != 4 || strcmp(line + end, "\n") ||
        strlen(hex) != 16 || strspn(hex, "0123456789abcdef") != 16 || pd_name_check(name) ||
        (strcmp(op, "put") && strcmp(op, "delete")) || (strcmp(kind, "dataset") && strcmp(kind, "mixture")))
        return -1;
    *definition = strtoull(hex, NULL, 16);
    return 0;
}

/* One commit registry.db-pending lists, and where in the file. */
typedef struct pd_pending_commit {
    char op[16], kind[16], name[PD_NAME_MAX + 2];
    uint64_t definition;
    size_t line;
} pd_pending_commit;

static int pd_pending_order(const void *a, const void *b)
{
    const pd_pending_commit *x = a, *y = b;
    int c = strcmp(x->kind, y->kind);
    if (!c)
        c = strcmp(x->name, y->name);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* Whether the loaded tables hold what commit c left: a put's definition (a name found with another one, deleted
 * and put again with the WAL lost, is not the acknowledged commit; 0, as from an older permd's dataset puts: the
 * name alone), a delete's absence. */
static int pd_pending_holds(pd_registry *r, const pd_pending_commit *c)
{
    int found, present;
    if (!strcmp(c->kind, "mixture")) {
        size_t at = pd_mix_find(r, c->name, &found);
        present = found && (!c->definition || r->mixes[at]->definition == c->definition);
    } else {
        size_t at = pd_table_find(r, c->name, &found);
        present = found && (!c->definition || pd_dataset_definition(&r->sets[at].d) == c->definition);
    }
    return present == !strcmp(c->op, "put");
}

/* Whether the commits registry.db-pending lists (if any) are in the loaded tables, each name as its last commit
 * left it: PD_ECORRUPT if not. Before the startup checkpoint, which would fold a damaged WAL's readable part in and
 * drop the evidence. */
static int pd_pending_check(pd_registry *r, const char *path, char *err, size_t errlen)
{
    /* O_NONBLOCK and a regular file only: a FIFO put there would hold startup (and its blocked signals) for ever. */
    struct stat st;
    int fd = open(r->pending, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT)
        return 0; /* none: every commit reached registry.db */
    if (fd < 0) { /* not damage (fresh_registry moves nothing aside): permissions, descriptors, a symlink */
        pd_errf(err, errlen, "%s cannot be read: %s", r->pending, strerror(errno));
        return PD_EIO;
    }
    FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "r") : NULL;
    if (!f) {
        close(fd);
        pd_errf(err, errlen, "%s is not a regular file: it cannot name the commits the WAL holds; remove it",
                r->pending);
        return PD_EIO;
    }
    r->has_pending = 1;
    pd_pending_commit *all = NULL;
    size_t n = 0, cap = 0, lines = 0, unreadable = 0;
    char line[PD_NAME_MAX + 64];
    int rc = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        if (n == cap) {
            pd_pending_commit *more = realloc(all, (cap = cap ? 2 * cap : 16) * sizeof *all);
            if (!more) {
                rc = PD_ENOMEM;
                break;
            }
            all = more;
        }
        pd_pending_commit *c = &all[n];
        if (pd_pending_parse(line, c->op, c->kind, &c->definition, c->name)) {
            unreadable++;
            if (!strchr(line, '\n')) /* the rest of a line too long to be one: skip it */
                while (fgets(line, sizeof line, f) && !strchr(line, '\n'))
                    ;
            continue;
        }
        c->line = lines;
        n++;
    }
    fclose(f);
    if (rc) {
        free(all);
        pd_errf(err, errlen, "%s: out of memory", r->pending);
        return rc;
    }
    if (unreadable)
        pd_log_warn("registry", "path=%s lines=%zu msg=\"unreadable; the commits they named cannot be checked\"",
                    r->pending, unreadable);
    if (n)
        qsort(all, n, sizeof *all, pd_pending_order);
    const pd_pending_commit *bad = NULL;
    for (size_t i = 0; i < n; i++) /* each name's last commit, the one its row must show */
        if ((i + 1 == n || strcmp(all[i].kind, all[i + 1].kind) || strcmp(all[i].name, all[i + 1].name)) &&
            !pd_pending_holds(r, &all[i]) && (!bad || all[i].line > bad->line))
            bad = &all[i];
    if (bad)
        pd_errf(err, errlen,
                "%s: a commit acknowledged as durable (%s of %s '%s') is not in the registry: it was in the "
                "write-ahead log alone (a checkpoint had failed, %s), and registry.db-wal was lost or damaged since; "
                "restore the state directory from a backup",
                path, bad->op, bad->kind, bad->name, r->pending);
    rc = bad ? PD_ECORRUPT : 0;
    free(all);
    return rc;
}

/* The first table of every schema (1): a new registry starts with it and migrates like an old one. */
#define PD_REGISTRY_BASE_TABLE                                                                                      \
    "CREATE TABLE IF NOT EXISTS datasets ("                                                                         \
    "  name TEXT PRIMARY KEY NOT NULL,"                                                                             \
    "  size INTEGER NOT NULL,"                                                                                      \
    "  created_ms INTEGER NOT NULL) WITHOUT ROWID;"

/* A new registry.db, made under a temporary name and renamed into place once its first table is committed (in
 * a rollback journal: the main file itself holds it): a first start that fails midway, on a full disk or killed,
 * leaves no 0-byte registry.db, which every later start would refuse as damaged. */
static int pd_registry_create(const char *path, char *err, size_t errlen)
{
    static const char *const sides[] = {"", "-journal", "-wal", "-shm"};
    char tmp[4200], side[4300], why[512] = "";
    snprintf(tmp, sizeof tmp, "%s.new", path);
    for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) { /* an earlier attempt's */
        snprintf(side, sizeof side, "%s%s", tmp, sides[i]);
        unlink(side);
    }
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(tmp, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "PRAGMA synchronous=FULL;" PD_REGISTRY_MARK PD_REGISTRY_BASE_TABLE, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        pd_registry_why(db, db ? sqlite3_errcode(db) : rc, why, sizeof why);
    const int code = rc == SQLITE_OK ? 0 : db ? pd_registry_code(db) : PD_EIO;
    sqlite3_close(db);
    if (code == 0 && rename(tmp, path) == 0) {
        pd_fsync_dir_of(path); /* the new name, durable */
        return 0;
    }
    if (code == 0)
        snprintf(why, sizeof why, "renaming it into place: %s", strerror(errno));
    for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) {
        snprintf(side, sizeof side, "%s%s", tmp, sides[i]);
        unlink(side);
    }
    pd_errf(err, errlen, "%s: cannot create the registry: %s%s", path, why, pd_registry_advice(code ? code : PD_EIO));
    return code ? code : PD_EIO;
}

/* Open and load registry.db under state_dir (locked by the caller). */
static int pd_registry_open_db(pd_registry *r, const char *state_dir, char *err, size_t errlen)
{
    char path[4096], wal[4200], why[512];
    struct stat st;
    int rc = PD_EIO;
    if ((size_t)snprintf(path, sizeof path, "%s/registry.db", state_dir) >= sizeof path) {
        pd_errf(err, errlen, "state_dir: path too long");
        return PD_EIO;
    }
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(r->pending, sizeof r->pending, "%s-pending", path);
    /* A registry that exists must be read whole, or permd would start with fewer datasets than it
     * acknowledged and say nothing. SQLite takes a 0-byte file for a new database, and a main file
     * whose WAL is left without it for an empty one: both are refused here. */
    int exists = stat(path, &st) == 0;
    if (exists && st.st_size == 0) {
        pd_errf(err, errlen, "%s exists but is empty (0 bytes): the registry is damaged", path);
        return PD_ECORRUPT;
    }
    if (!exists && stat(wal, &st) == 0 && st.st_size > 0) {
        pd_errf(err, errlen, "%s is missing but its write-ahead log %s is there: the registry is damaged", path, wal);
        return PD_ECORRUPT;
    }
    if (access(state_dir, W_OK | X_OK)) { /* SQLite creates registry.db-wal and -shm beside it */
        pd_errf(err, errlen, "state_dir %s is not writable (%s): permd must be able to create files in it; fix its "
                "permissions", state_dir, strerror(errno));
        return PD_EIO;
    }
    if (exists && access(path, W_OK)) {
        pd_errf(err, errlen, "%s is read-only (%s): permd must be able to store datasets; fix its permissions",
                path, strerror(errno));
        return PD_EIO;
    }
    if (!exists && (rc = pd_registry_create(path, err, errlen)))
        return rc; /* from here on registry.db exists, new or not */
    if (sqlite3_open_v2(path, &r->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        NULL) != SQLITE_OK)
        goto fail_db;
    pd_registry_wait_for_locks(r);
    if (sqlite3_db_readonly(r->db, "main") == 1) {
        pd_errf(err, errlen, "%s can only be opened read-only: permd must be able to store datasets", path);
        return PD_EIO;
    }
    /* Another process writing to the registry (sqlite3 in a transaction): wait for it (registry_busy_ms) before
     * reading anything, so that what it commits is loaded, and refuse as locked past the wait. A reader never
     * blocks this (WAL); other failures are left to the checks below, which name them. */
    if (sqlite3_exec(r->db, "BEGIN IMMEDIATE; COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        const int code = sqlite3_errcode(r->db) & 0xff;
        if (!sqlite3_get_autocommit(r->db))
            sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
        if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
            pd_registry_why(r->db, code, why, sizeof why);
            pd_errf(err, errlen, "%s: %s%s", path, why,
                    r->busy_stopped ? ": permd was asked to stop while it waited for another process's lock"
                                    : pd_registry_advice(PD_EBUSY));
            return PD_EBUSY;
        }
    }
    if ((rc = pd_registry_check(r, why, sizeof why))) {
        pd_errf(err, errlen, "%s cannot be read%s (%s)%s", path, rc == PD_ECORRUPT ? " whole" : "", why,
                pd_registry_advice(rc));
        return rc;
    }
    /* Whose file, then the version, before the first write: another program's file (whatever user_version it
     * sets) and a newer schema are refused untouched (no WAL switch, no table). */
    int version;
    int adopt;
    if ((rc = pd_registry_owner(r, path, &adopt, err, errlen)) ||
        (rc = pd_registry_version(r, path, &version, err, errlen)))
        return rc;
    /* WAL: readers never block the writer; synchronous=FULL: a commit is on disk (fsync of the WAL)
     * before sqlite3_step returns, so an ack means durable; every commit is then checkpointed into
     * the main file. A new database starts at schema 1 and migrates like an old one. */
    static const char schema[] = "PRAGMA journal_mode=WAL;"
                                 "PRAGMA synchronous=FULL;" PD_REGISTRY_BASE_TABLE;
    if (sqlite3_exec(r->db, schema, NULL, NULL, NULL) != SQLITE_OK)
        goto fail_db;
    if ((rc = pd_registry_migrate(r, path, version, err, errlen)))
        return rc;
    /* An older permd's registry is marked as permd's; if that write fails, the next start marks it. */
    if (adopt && sqlite3_exec(r->db, PD_REGISTRY_MARK, NULL, NULL, NULL) != SQLITE_OK)
        pd_log_warn("registry", "path=%s msg=\"cannot mark it as permd's (application_id): %s\"", path,
                    sqlite3_errmsg(r->db));
    /* REPLACE: a row that failed to load (logged, not served) must not block its name. */
    if (sqlite3_prepare_v2(r->db,
                           "INSERT OR REPLACE INTO datasets(name, size, created_ms, shards, window, lanes, sum) "
                           "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                           -1, &r->put, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(r->db, "DELETE FROM datasets WHERE name = ?1", -1, &r->del, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(r->db, "INSERT OR REPLACE INTO mixtures(name, def, created_ms, sum) VALUES(?1, ?2, ?3, ?4)",
                           -1,
                           &r->put_mix, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(r->db, "DELETE FROM mixtures WHERE name = ?1", -1, &r->del_mix, NULL) != SQLITE_OK)
        goto fail_db;
    if ((rc = pd_registry_load(r, err, errlen)) || (rc = pd_registry_load_mixtures(r, err, errlen)) ||
        (rc = pd_pending_check(r, path, err, errlen)))
        return rc;
    /* Fold the WAL in, tried once as after a commit. Another process reading the registry (a backup) holds the
     * WAL for as long as it reads: what the WAL holds is durable and was checked above, so permd starts anyway
     * and a later commit's checkpoint folds it in. It used to wait registry_busy_ms and exit 1. */
    sqlite3_busy_timeout(r->db, 0);
    int code = pd_registry_checkpoint(r);
    pd_registry_wait_for_locks(r);
    if (code == SQLITE_OK) {
        pd_pending_clear(r);
        return 0;
    }
    pd_registry_why(r->db, code, why, sizeof why);
    /* A reader holding the WAL, or no room to fold it in (a full disk, a file-size limit): what the WAL holds was
     * read and checked above and stays durable there, as while permd ran, so it starts and serves; refusing
     * would turn a full disk into an outage at the first restart. The next commit retries. */
    const int primary = code & 0xff;
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED || primary == SQLITE_FULL || primary == SQLITE_IOERR) {
        atomic_fetch_add(&r->checkpoint_failures, 1);
        pd_log_warn("registry_checkpoint",
                    "path=%s msg=\"the write-ahead log is not folded in at startup: %s; the next commit retries\"",
                    path, why);
        return 0;
    }
    pd_errf(err, errlen, "%s: cannot fold the write-ahead log into the main file: %s", path, why);
    return PD_EIO;
fail_db:
    if (!r->db) {
        pd_errf(err, errlen, "%s: cannot open", path);
        return PD_EIO;
    }
    rc = pd_registry_code(r->db);
    pd_registry_why(r->db, sqlite3_errcode(r->db), why, sizeof why);
    pd_errf(err, errlen, "%s: %s%s", path, why, rc == PD_ECORRUPT ? "" : pd_registry_advice(rc));
    return rc;
}

static int pd_registry_open_any(const char *state_dir, int fresh, unsigned busy_ms, pd_registry **out, char *err,
                                size_t errlen)
{
    int rc;
    pd_registry *r = calloc(1, sizeof *r);
    if (!r)
        return PD_ENOMEM;
    r->lock_fd = -1;
    r->busy_ms = busy_ms;
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->write_lock, NULL);
    if (pd_mkdirs(state_dir)) {
        pd_errf(err, errlen, "state_dir %s: cannot create: %s", state_dir, strerror(errno));
        rc = PD_EIO;
        goto fail;
    }
    if ((rc = pd_registry_lock(r, state_dir, err, errlen)))
        goto fail;
    rc = pd_registry_open_db(r, state_dir, err, errlen);
    if (rc == PD_ECORRUPT && fresh) {
        char moved[4400];
        pd_log_error("registry", "msg=\"%s\"", err);
        pd_registry_close_db(r);
        if (pd_registry_move_aside(state_dir, moved, sizeof moved)) {
            pd_errf(err, errlen, "cannot move the damaged registry aside: %s", strerror(errno));
            rc = PD_EIO;
            goto fail;
        }
        pd_log_warn("registry", "msg=\"fresh_registry: the damaged registry was moved to %s; starting empty\"",
                    moved);
        rc = pd_registry_open_db(r, state_dir, err, errlen);
    }
    if (rc)
        goto fail;
    r->opened = 1;
    *out = r;
    return 0;
fail:
    pd_registry_close(r);
    return rc;
}

int pd_registry_open(const char *state_dir, pd_registry **out, char *err, size_t errlen)
{
    return pd_registry_open_any(state_dir, 0, PD_REGISTRY_BUSY_MS, out, err, errlen);
}

int pd_registry_open_fresh(const char *state_dir, pd_registry **out, char *err, size_t errlen)
{
    return pd_registry_open_any(state_dir, 1, PD_REGISTRY_BUSY_MS, out, err, errlen);
}

int pd_registry_open_with(const char *state_dir, int fresh, unsigned busy_ms, pd_registry **out, char *err,
                          size_t errlen)
{
    return pd_registry_open_any(state_dir, fresh, busy_ms, out, err, errlen);
}

void pd_registry_set_layout_limit(pd_registry *r, uint64_t bytes)
{
    pthread_mutex_lock(&r->lock);
    r->layout_limit = bytes;
    pthread_mutex_unlock(&r->lock);
}

void pd_registry_set_mixture_limit(pd_registry *r, uint64_t bytes)
{
    pthread_mutex_lock(&r->lock);
    r->mix_limit = bytes;
    pthread_mutex_unlock(&r->lock);
}

/* The definitions' bytes, under r->lock. */
static uint64_t pd_mix_bytes_locked(const pd_registry *r)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < r->nmix; i++)
        bytes += pd_mixdef_bytes(r->mixes[i]);
    return bytes;
}

void pd_registry_mixture_totals(pd_registry *r, uint64_t *count, uint64_t *bytes)
{
    pthread_mutex_lock(&r->lock);
    *count = r->nmix;
    *bytes = pd_mix_bytes_locked(r);
    pthread_mutex_unlock(&r->lock);
}

uint64_t pd_registry_layout_bytes(pd_registry *r)
{
    (void)r; /* every registry's layouts: a process has one */
    return atomic_load(&pd_layouts_held);
}

size_t pd_registry_skipped(pd_registry *r)
{
    return r->skipped;
}

uint64_t pd_registry_checkpoint_failures(pd_registry *r)
{
    return atomic_load(&r->checkpoint_failures);
}

void pd_registry_close(pd_registry *r)
{
    if (!r)
        return;
    if (r->opened && r->db) {
        /* What SQLite's close would do, and then the pending file goes. Tried once: a reader (a backup) would
         * otherwise hold a stopping permd up for registry_busy_ms, and what the WAL holds is durable. */
        sqlite3_busy_timeout(r->db, 0);
        if (pd_registry_checkpoint(r) == SQLITE_OK)
            pd_pending_clear(r);
    }
    pd_registry_close_db(r);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->write_lock);
    if (r->lock_fd >= 0)
        close(r->lock_fd); /* after the database: the next holder finds it closed */
    free(r);
}

uint64_t pd_dataset_definition(const pd_dataset *d)
{
    uint64_t h = pd_definition_add(0, UINT64_C(0x534554)); /* "SET" */
    h = pd_definition_add(h, d->size);
    if (d->shards) { /* a flat dataset's window and lanes mean nothing */
        h = pd_definition_add(h, d->shards);
        h = pd_definition_add(h, d->window);
        h = pd_definition_add(h, d->lanes);
        h = pd_definition_add(h, d->layout_hash);
    }
    return pd_definition_done(h);
}

int pd_registry_declare(pd_registry *r, const char *name, uint64_t size, char *err, size_t errlen)
{
    if (pd_name_check(name) || size == 0 || size > PD_N_MAX)
        return PD_EINVAL;
    int found, is_mix, rc = 0;
    pthread_mutex_lock(&r->lock);
    size_t at = pd_table_find(r, name, &found);
    pd_mix_find(r, name, &is_mix);
    if (is_mix) {
        pd_errf(err, errlen, "the registry stores a mixture of this name (datasets and mixtures share names)");
        rc = PD_ECONFLICT;
    } else if (found) {
        if (r->sets[at].layout) {
            pd_errf(err, errlen, "the registry stores a sharded dataset of this name");
            rc = PD_ECONFLICT;
        } else if (r->sets[at].d.size != size) {
            pd_errf(err, errlen, "the registry stores size %llu", (unsigned long long)r->sets[at].d.size);
            rc = PD_ECONFLICT;
        } else {
            r->sets[at].d.from_config = 1;
        }
    } else {
        pd_dataset d = {.size = size, .created_ms = pd_clock_unix_ms(), .from_config = 1};
        strcpy(d.name, name);
        rc = pd_table_insert(r, at, &d, NULL, 0); /* not stored: the config is its record */
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

size_t pd_registry_check_mixtures(pd_registry *r)
{
    size_t broken = 0;
    pthread_mutex_lock(&r->lock);
    for (size_t m = 0; m < r->nmix; m++) {
        const pd_mixdef *d = r->mixes[m];
        for (uint32_t j = 0; j < d->components; j++) {
            int found;
            size_t at = pd_table_find(r, d->comp[j].name, &found);
            const char *why = !found                                 ? "is not registered (a config dataset no "
                                                                       "longer declared?)"
                              : r->sets[at].d.size != d->comp[j].size ? "has another size than when the mixture "
                                                                       "was put"
                                                                     : NULL;
            if (why) {
                pd_log_warn("registry", "mixture=%s component=%s msg=\"the component %s: the mixture's requests fail "
                            "until it is put back as it was, or the mixture is deleted\"",
                            d->name, d->comp[j].name, why);
                broken++;
                break;
            }
        }
    }
    pthread_mutex_unlock(&r->lock);
    return broken;
}

int pd_registry_get(pd_registry *r, const char *name, pd_dataset *out)
{
    int found;
    pthread_mutex_lock(&r->lock);
    size_t at = pd_table_find(r, name, &found);
    if (found)
        *out = r->sets[at].d;
    pthread_mutex_unlock(&r->lock);
    return found ? 0 : PD_ENOTFOUND;
}

int pd_registry_layout(pd_registry *r, const char *name, pd_layout **out)
{
    int found, rc = PD_ENOTFOUND;
    pthread_mutex_lock(&r->lock);
    size_t at = pd_table_find(r, name, &found);
    if (found) {
        *out = pd_layout_ref(r->sets[at].layout);
        rc = *out ? 0 : PD_EINVAL;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int pd_registry_list(pd_registry *r, pd_dataset **out, size_t *n)
{
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    *out = NULL;
    *n = r->n;
    if (r->n) {
        *out = malloc(r->n * sizeof **out);
        if (*out)
            for (size_t i = 0; i < r->n; i++)
                (*out)[i] = r->sets[i].d;
        else
            rc = PD_ENOMEM;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

size_t pd_registry_count(pd_registry *r)
{
    pthread_mutex_lock(&r->lock);
    size_t n = r->n;
    pthread_mutex_unlock(&r->lock);
    return n;
}

/* Whether an existing entry is the dataset a put describes (then the put is a no-op). */
static int pd_entry_matches(const pd_entry *e, uint64_t size, const pd_layout *layout, uint64_t window, uint32_t lanes)
{
    if (e->d.size != size || !e->layout != !layout)
        return 0;
    return !layout || (pd_layout_equal(e->layout, layout) && e->d.window == window && e->d.lanes == lanes);
}

/* Create or confirm a dataset; layout (NULL when flat) gets one more reference if stored. */
static int pd_registry_put_any(pd_registry *r, const char *name, uint64_t size, pd_layout *layout, uint64_t window,
                               uint32_t lanes, pd_dataset *out, int *created, char *err, size_t errlen)
{
    if (pd_name_check(name) || size == 0 || size > PD_N_MAX)
        return PD_EINVAL;
    int rc = 0, found, store_config = 0;
    *created = 0;
    /* The write lock orders puts and deletes, so the table check below stays
     * true until the commit lands. */
    pthread_mutex_lock(&r->write_lock);
    pthread_mutex_lock(&r->lock);
    size_t at = pd_table_find(r, name, &found);
    int is_mix;
    pd_mix_find(r, name, &is_mix);
    uint64_t held = atomic_load(&pd_layouts_held) + (layout ? pd_layout_bytes(layout->shards) : 0);
    if (found) {
        rc = pd_entry_matches(&r->sets[at], size, layout, window, lanes) ? 0 : PD_ECONFLICT;
        *out = r->sets[at].d;
        /* A config dataset lives in memory only: a put of it is stored like any other, or its 0 ("durable")
         * would be gone with the declaration. It stays a config dataset while the config declares it. */
        store_config = rc == 0 && !r->sets[at].stored;
    } else if (is_mix) {
        pd_errf(err, errlen, "'%s' is a mixture", name);
        rc = PD_ECONFLICT;
    } else if (layout && r->layout_limit && held > r->layout_limit) {
        pd_errf(err, errlen,
                "shard layouts would hold %llu bytes, over layout_memory (%llu; layouts of deleted datasets "
                "count until the streams and plans using them end)",
                (unsigned long long)held, (unsigned long long)r->layout_limit);
        rc = PD_ETOOBIG;
    }
    pthread_mutex_unlock(&r->lock);
    if ((found && !store_config) || rc)
        goto done;

    pd_dataset d = {.size = size, .created_ms = pd_clock_unix_ms()};
    size_t blob_len = 0;
    uint8_t *blob = NULL;
    if (store_config)
        d = *out; /* flat, as declared; its created_ms is kept */
    strcpy(d.name, name);
    if (layout) {
        d.shards = layout->shards;
        d.layout_hash = layout->hash;
        d.window = window;
        d.lanes = lanes;
        if (!(blob = pd_layout_to_blob(layout, &blob_len))) {
            rc = PD_ENOMEM;
            goto done;
        }
    }
    sqlite3_reset(r->put);
    sqlite3_bind_text(r->put, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(r->put, 2, pd_size_to_db(size));
    sqlite3_bind_int64(r->put, 3, d.created_ms);
    if (blob)
        sqlite3_bind_blob64(r->put, 4, blob, blob_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(r->put, 4);
    sqlite3_bind_int64(r->put, 5, (int64_t)window);
    sqlite3_bind_int64(r->put, 6, (int64_t)lanes);
    sqlite3_bind_int64(r->put, 7, pd_dataset_row_sum(name, pd_size_to_db(size), d.created_ms, blob, blob_len,
                                                     (int64_t)window, (int64_t)lanes));
    int step = sqlite3_step(r->put);
    if (step != SQLITE_DONE) /* read the error before the reset */
        rc = pd_registry_commit_failed(r, "registry_put", "name", name, err, errlen);
    sqlite3_clear_bindings(r->put);
    sqlite3_reset(r->put);
    free(blob);
    if (rc)
        goto done;
    pd_registry_after_commit(r, "put", "dataset", pd_dataset_definition(&d), name);
    pthread_mutex_lock(&r->lock);
    at = pd_table_find(r, name, &found);
    if (store_config) {
        if (found) /* a config dataset is never deleted, and the write lock is held */
            r->sets[at].stored = 1;
    } else {
        rc = pd_table_insert(r, at, &d, pd_layout_ref(layout), 1);
        if (rc)
            pd_layout_release(layout);
    }
    pthread_mutex_unlock(&r->lock);
    if (rc == 0 && !store_config) {
        *out = d;
        *created = 1;
    }
done:
    pthread_mutex_unlock(&r->write_lock);
    return rc;
}

int pd_registry_put(pd_registry *r, const char *name, uint64_t size, pd_dataset *out, int *created, char *err,
                    size_t errlen)
{
    return pd_registry_put_any(r, name, size, NULL, 0, 0, out, created, err, errlen);
}

int pd_registry_put_sharded(pd_registry *r, const char *name, pd_layout *layout, uint64_t window, uint32_t lanes,
                            pd_dataset *out, int *created, char *err, size_t errlen)
{
    if (!layout || window == 0 || lanes == 0)
        return PD_EINVAL;
    return pd_registry_put_any(r, name, layout->start[layout->shards], layout, window, lanes, out, created, err,
                               errlen);
}

int pd_registry_delete(pd_registry *r, const char *name, char *err, size_t errlen)
{
    int rc = 0, found;
    pthread_mutex_lock(&r->write_lock);
    pthread_mutex_lock(&r->lock);
    size_t at = pd_table_find(r, name, &found);
    int from_config = found && r->sets[at].d.from_config;
    const pd_mixdef *user = found ? pd_mix_user(r, name) : NULL;
    if (user)
        pd_errf(err, errlen, "dataset '%s' is a component of mixture '%s': delete the mixture first", name, user->name);
    pthread_mutex_unlock(&r->lock);
    if (from_config || user) {
        rc = PD_ECONFLICT;
        goto done;
    }
    if (!found && !r->skipped) { /* a row that failed to load is deleted below: its name is not lost */
        rc = PD_ENOTFOUND;
        goto done;
    }
    sqlite3_reset(r->del);
    sqlite3_bind_text(r->del, 1, name, -1, SQLITE_STATIC);
    int step = sqlite3_step(r->del);
    int changed = sqlite3_changes(r->db);
    if (step != SQLITE_DONE)
        rc = pd_registry_commit_failed(r, "registry_delete", "name", name, err, errlen);
    sqlite3_clear_bindings(r->del);
    sqlite3_reset(r->del);
    if (rc)
        goto done;
    pd_registry_after_commit(r, "delete", "dataset", 0, name);
    if (!found) {
        if (changed)
            pd_log_info("registry_repair", "name=%s msg=\"a row that failed to load was deleted\"", name);
        rc = changed ? 0 : PD_ENOTFOUND;
        goto done;
    }
    pthread_mutex_lock(&r->lock);
    at = pd_table_find(r, name, &found);
    if (found)
        pd_table_remove(r, at);
    pthread_mutex_unlock(&r->lock);
done:
    pthread_mutex_unlock(&r->write_lock);
    return rc;
}

/* ---- Mixtures ---------------------------------------------------------------- */

int pd_registry_component(pd_registry *r, const pd_mixdef *d, uint32_t j, pd_layout **layout, char *err,
                          size_t errlen)
{
    const pd_mixcomp *c = &d->comp[j];
    int found, rc = 0;
    *layout = NULL;
    pthread_mutex_lock(&r->lock);
    size_t at = pd_table_find(r, c->name, &found);
    if (!found) {
        pd_errf(err, errlen, "component '%s' of mixture '%s' no longer exists", c->name, d->name);
        rc = PD_ENOTFOUND;
    } else {
        const pd_entry *e = &r->sets[at];
        const pd_layout *l = e->layout;
        if (e->d.size != c->size || e->d.shards != c->shards || (l && (e->d.window != c->window ||
                                                                          e->d.lanes != c->lanes ||
                                                                          l->hash != c->layout_hash))) {
            pd_errf(err, errlen,
                    "component '%s' of mixture '%s' was re-created otherwise (size %llu, %llu shards; the mixture "
                    "was put over size %llu, %llu shards): put the mixture again under a new name",
                    c->name, d->name, (unsigned long long)e->d.size, (unsigned long long)e->d.shards,
                    (unsigned long long)c->size, (unsigned long long)c->shards);
            rc = PD_ECONFLICT;
        } else {
            *layout = pd_layout_ref(e->layout);
        }
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* Record what each component is now; PD_ENOTFOUND for one that does not exist. */
static int pd_mix_record_components(pd_registry *r, pd_mixdef *d, char *err, size_t errlen)
{
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    for (uint32_t j = 0; j < d->components && !rc; j++) {
        int found;
        pd_mixcomp *c = &d->comp[j];
        size_t at = pd_table_find(r, c->name, &found);
        if (!found) {
            int mixture;
            pd_mix_find(r, c->name, &mixture);
            pd_errf(err, errlen, "component '%s' is %s", pd_name_printable(c->name),
                    mixture ? "a mixture: a mixture's components are datasets" : "not a registered dataset");
            rc = mixture ? PD_EINVAL : PD_ENOTFOUND;
            break;
        }
        const pd_entry *e = &r->sets[at];
        c->size = e->d.size;
        c->shards = e->d.shards;
        c->window = e->layout ? e->d.window : 0;
        c->lanes = e->layout ? e->d.lanes : 0;
        c->layout_hash = e->layout ? e->layout->hash : 0;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int pd_registry_put_mixture(pd_registry *r, pd_mixdef *def, pd_mixdef **stored, int *created, char *err,
                            size_t errlen)
{
    int rc, found, is_set;
    *created = 0;
    *stored = NULL;
    pthread_mutex_lock(&r->write_lock);
    if ((rc = pd_mix_record_components(r, def, err, errlen)) || (rc = pd_mixdef_check(def, err, errlen)))
        goto done;
    pthread_mutex_lock(&r->lock);
    size_t at = pd_mix_find(r, def->name, &found);
    pd_table_find(r, def->name, &is_set);
    int how = found ? pd_mixdef_compare(r->mixes[at], def) : 0;
    if (found && how == 1)
        *stored = pd_mixdef_ref(r->mixes[at]);
    if (found)
        def->created_ms = r->mixes[at]->created_ms;
    /* What the definitions would hold with this one (replacing the one it appends stages to). Checked here and not
     * again before the insert: the write lock keeps every other put and delete out until then. */
    const uint64_t held = pd_mix_bytes_locked(r) - (found ? pd_mixdef_bytes(r->mixes[at]) : 0) + pd_mixdef_bytes(def);
    const int over = !*stored && r->mix_limit && held > r->mix_limit;
    const uint64_t limit = r->mix_limit;
    pthread_mutex_unlock(&r->lock);
    if (is_set) {
        pd_errf(err, errlen, "'%s' is a dataset", def->name);
        rc = PD_ECONFLICT;
        goto done;
    }
    if (found && how == 0) {
        pd_errf(err, errlen,
                "mixture '%s' exists with other components, length, block or stages (only stages may be "
                "appended after the last)",
                def->name);
        rc = PD_ECONFLICT;
        goto done;
    }
    if (*stored) /* the same: nothing to write */
        goto done;
    if (over) {
        pd_errf(err, errlen, "mixture definitions would hold %llu bytes, over mixture_memory (%llu)",
                (unsigned long long)held, (unsigned long long)limit);
        rc = PD_ETOOBIG;
        goto done;
    }
    if (!found)
        def->created_ms = pd_clock_unix_ms();
    uint8_t *blob;
    size_t len;
    if ((rc = pd_mixdef_encode(def, &blob, &len)))
        goto done;
    sqlite3_reset(r->put_mix);
    sqlite3_bind_text(r->put_mix, 1, def->name, -1, SQLITE_STATIC);
    sqlite3_bind_blob64(r->put_mix, 2, blob, len, SQLITE_STATIC);
    sqlite3_bind_int64(r->put_mix, 3, def->created_ms);
    sqlite3_bind_int64(r->put_mix, 4, pd_mixture_row_sum(def->name, blob, len, def->created_ms));
    int step = sqlite3_step(r->put_mix);
    if (step != SQLITE_DONE)
        rc = pd_registry_commit_failed(r, "registry_put", "mixture", def->name, err, errlen);
    sqlite3_clear_bindings(r->put_mix);
    sqlite3_reset(r->put_mix);
    free(blob);
    if (rc)
        goto done;
    pd_registry_after_commit(r, "put", "mixture", def->definition, def->name);
    pthread_mutex_lock(&r->lock);
    at = pd_mix_find(r, def->name, &found);
    rc = pd_mix_insert(r, at, pd_mixdef_ref(def), found);
    if (rc)
        pd_mixdef_release(def);
    pthread_mutex_unlock(&r->lock);
    if (rc == 0) {
        *stored = pd_mixdef_ref(def);
        *created = found ? 2 : 1;
    }
done:
    pthread_mutex_unlock(&r->write_lock);
    return rc;
}

int pd_registry_mixture(pd_registry *r, const char *name, pd_mixdef **out)
{
    int found;
    pthread_mutex_lock(&r->lock);
    size_t at = pd_mix_find(r, name, &found);
    *out = found ? pd_mixdef_ref(r->mixes[at]) : NULL;
    pthread_mutex_unlock(&r->lock);
    return found ? 0 : PD_ENOTFOUND;
}

int pd_registry_list_mixtures(pd_registry *r, pd_mixdef ***out, size_t *n)
{
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    *out = NULL;
    *n = r->nmix;
    if (r->nmix) {
        if ((*out = malloc(r->nmix * sizeof **out)))
            for (size_t i = 0; i < r->nmix; i++)
                (*out)[i] = pd_mixdef_ref(r->mixes[i]);
        else
            rc = PD_ENOMEM;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int pd_registry_delete_mixture(pd_registry *r, const char *name, char *err, size_t errlen)
{
    int rc = 0, found;
    pthread_mutex_lock(&r->write_lock);
    pthread_mutex_lock(&r->lock);
    pd_mix_find(r, name, &found);
    pthread_mutex_unlock(&r->lock);
    if (!found && !r->skipped) {
        rc = PD_ENOTFOUND;
        goto done;
    }
    sqlite3_reset(r->del_mix);
    sqlite3_bind_text(r->del_mix, 1, name, -1, SQLITE_STATIC);
    int step = sqlite3_step(r->del_mix);
    int changed = sqlite3_changes(r->db);
    if (step != SQLITE_DONE)
        rc = pd_registry_commit_failed(r, "registry_delete", "mixture", name, err, errlen);
    sqlite3_clear_bindings(r->del_mix);
    sqlite3_reset(r->del_mix);
    if (rc)
        goto done;
    pd_registry_after_commit(r, "delete", "mixture", 0, name);
    if (!found) {
        rc = changed ? 0 : PD_ENOTFOUND;
        goto done;
    }
    pthread_mutex_lock(&r->lock);
    size_t at = pd_mix_find(r, name, &found);
    if (found) {
        pd_mixdef_release(r->mixes[at]);
        memmove(r->mixes + at, r->mixes + at + 1, (r->nmix - at - 1) * sizeof *r->mixes);
        r->nmix--;
    }
    pthread_mutex_unlock(&r->lock);
done:
    pthread_mutex_unlock(&r->write_lock);
    return rc;
}
