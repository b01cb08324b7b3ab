/* Dataset registry: a sorted in-memory table guarded by a mutex, written through to SQLite in WAL mode. */
#include "daemon/registry.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "core/error.h"
#include "core/name.h"
#include "core/perm.h"
#include "core/shards.h"
#include "daemon/clock.h"
#include "daemon/definition.h"
#include "daemon/log.h"

#define PD_REGISTRY_SCHEMA 3 /* PRAGMA user_version of the current schema (2: shard layouts, 3: mixtures); the
                              * row checksums' column is added to any schema 3 without a version of its own: an
                              * older permd ignores it and writes rows without one, which load unchecked */

/* A dataset and, when sharded, its layout (the table owns one reference). */
typedef struct pd_entry {
    pd_dataset d;
    pd_layout *layout;
} pd_entry;

struct pd_registry {
    sqlite3 *db;
    sqlite3_stmt *put, *del, *put_mix, *del_mix;
    pthread_mutex_t write_lock; /* one SQLite transaction at a time */
    pthread_mutex_t lock;       /* guards the table below; never held across disk I/O */
    pd_entry *sets;             /* sorted by name */
    size_t n, cap;
    uint64_t layout_bytes;      /* shard layouts held (the table's), under lock */
    uint64_t layout_limit;      /* a sharded put beyond it is refused; 0: none */
    size_t skipped;             /* rows found damaged at load (their names stay usable) */
    pd_mixdef **mixes;          /* sorted by name (the table holds one reference each) */
    size_t nmix, capmix;
};

/* Bytes a layout of S shards holds in memory. */
static uint64_t pd_layout_bytes(uint64_t shards)
{
    return (shards + 1) * sizeof(uint64_t) + sizeof(pd_layout);
}

/* What a failed SQLite write means, in words for the client: the cause, not "I/O error". */
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
    case SQLITE_IOERR:
        cause = "I/O error";
        break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        cause = "registry locked by another process";
        break;
    }
    pd_errf(err, errlen, "%s (%s)", cause ? cause : "storage failed", sqlite3_errmsg(db));
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
    if (l && atomic_fetch_sub(&l->refs, 1) == 1)
        free(l);
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

/* Insert d at `at`; the table takes over the caller's reference to layout (may be NULL). */
static int pd_table_insert(pd_registry *r, size_t at, const pd_dataset *d, pd_layout *layout)
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
    r->n++;
    if (layout)
        r->layout_bytes += pd_layout_bytes(layout->shards);
    return 0;
}

static void pd_table_remove(pd_registry *r, size_t at)
{
    if (r->sets[at].layout)
        r->layout_bytes -= pd_layout_bytes(r->sets[at].layout->shards);
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

/* A row that is not loaded: logged and counted; a put or delete of its name replaces or removes it. */
static void pd_registry_skip(pd_registry *r, int mixture, const char *name, const char *reason, const char *why)
{
    const char *what = mixture ? "Mixture" : "Dataset";
    pd_log_error("registry_skip",
                 "reason=\"%s\" name=\"%s\" msg=\"%sthe %s is not served; a Put%s or Delete%s of its name replaces or "
                 "removes the row\"",
                 reason, name ? name : "", why, mixture ? "mixture" : "dataset", what, what);
    r->skipped++;
}

#define PD_ROW_CHANGED "the row changed on disk since permd wrote it: "

static int pd_registry_load(pd_registry *r, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(r->db,
                                "SELECT name, size, created_ms, shards, window, lanes, sum FROM datasets ORDER BY name",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        goto fail;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        pd_dataset d = {0};
        pd_layout *layout = NULL;
        const char *name = (const char *)sqlite3_column_text(st, 0);
        const int shards_type = sqlite3_column_type(st, 3); /* NULL: flat; a BLOB: the layout; else damaged */
        const void *blob = shards_type == SQLITE_BLOB ? sqlite3_column_blob(st, 3) : NULL;
        const int blob_len = sqlite3_column_bytes(st, 3);
        if (name && !pd_row_sum_ok(st, 6, pd_dataset_row_sum(name, sqlite3_column_int64(st, 1),
                                                             sqlite3_column_int64(st, 2), blob, (size_t)blob_len,
                                                             sqlite3_column_int64(st, 4), sqlite3_column_int64(st, 5)))) {
            pd_registry_skip(r, 0, name, "checksum mismatch", PD_ROW_CHANGED);
            continue;
        }
        d.size = pd_size_from_db(sqlite3_column_int64(st, 1));
        d.created_ms = sqlite3_column_int64(st, 2);
        if (shards_type != SQLITE_NULL) {
            if (!blob || pd_layout_from_blob(blob, blob_len, &layout) || layout->start[layout->shards] != d.size) {
                pd_layout_release(layout);
                pd_registry_skip(r, 0, name, "invalid shard layout", "");
                continue;
            }
            d.shards = layout->shards;
            d.layout_hash = layout->hash;
            d.window = (uint64_t)sqlite3_column_int64(st, 4);
            d.lanes = (uint32_t)sqlite3_column_int64(st, 5);
        }
        if (!name || pd_name_check(name) || d.size == 0 || d.size > PD_N_MAX ||
            (layout && (d.window == 0 || d.lanes == 0))) {
            pd_layout_release(layout);
            pd_registry_skip(r, 0, name, "invalid row", "");
            continue;
        }
        strcpy(d.name, name);
        if (pd_table_insert(r, r->n, &d, layout)) { /* rows arrive sorted */
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
    pd_errf(err, errlen, "reading the registry: %s", sqlite3_errmsg(r->db));
    sqlite3_finalize(st);
    return PD_EIO;
}

/* Schema 4's checksum column on a table that lacks it (NULL in older rows); 1 on success. */
static int pd_registry_add_sum(sqlite3 *db, const char *table)
{
    char sql[96];
    sqlite3_stmt *st;
    snprintf(sql, sizeof sql, "SELECT sum FROM %s LIMIT 0", table);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) { /* there already (a user_version set back) */
        sqlite3_finalize(st);
        return 1;
    }
    snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN sum INTEGER;", table);
    return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK;
}

/* Older schemas gain what they lack in place: 1 (flat datasets only) the shard columns, 2 the mixtures'
 * table, and every one the row checksums' column. A newer
 * schema is refused: this permd could not tell what its columns mean. */
static int pd_registry_migrate(pd_registry *r, int *found)
{
    sqlite3_stmt *st;
    int version = 0;
    if (sqlite3_prepare_v2(r->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK)
        return PD_EIO;
    if (sqlite3_step(st) == SQLITE_ROW)
        version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    *found = version;
    if (version > PD_REGISTRY_SCHEMA)
        return PD_EUNSUPPORTED;
    if (version == PD_REGISTRY_SCHEMA)
        return pd_registry_add_sum(r->db, "datasets") && pd_registry_add_sum(r->db, "mixtures") ? 0 : PD_EIO;
    static const char v2[] = "ALTER TABLE datasets ADD COLUMN shards BLOB;"
                             "ALTER TABLE datasets ADD COLUMN window INTEGER NOT NULL DEFAULT 0;"
                             "ALTER TABLE datasets ADD COLUMN lanes INTEGER NOT NULL DEFAULT 0;";
    static const char v3[] = "CREATE TABLE IF NOT EXISTS mixtures ("
                             "  name TEXT PRIMARY KEY NOT NULL,"
                             "  def BLOB NOT NULL,"
                             "  created_ms INTEGER NOT NULL) WITHOUT ROWID;";
    int ok = sqlite3_exec(r->db, "BEGIN;", NULL, NULL, NULL) == SQLITE_OK &&
             (version >= 2 || sqlite3_exec(r->db, v2, NULL, NULL, NULL) == SQLITE_OK) &&
             sqlite3_exec(r->db, v3, NULL, NULL, NULL) == SQLITE_OK &&
             pd_registry_add_sum(r->db, "datasets") && pd_registry_add_sum(r->db, "mixtures") &&
             sqlite3_exec(r->db, "PRAGMA user_version=3; COMMIT;", NULL, NULL, NULL) == SQLITE_OK;
    if (!ok) {
        sqlite3_exec(r->db, "ROLLBACK;", NULL, NULL, NULL);
        return PD_EIO;
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
        const char *name = (const char *)sqlite3_column_text(st, 0);
        pd_mixdef *d;
        if (name && !pd_row_sum_ok(st, 3, pd_mixture_row_sum(name, sqlite3_column_blob(st, 1),
                                                             (size_t)sqlite3_column_bytes(st, 1),
                                                             sqlite3_column_int64(st, 2)))) {
            pd_registry_skip(r, 1, name, "checksum mismatch", PD_ROW_CHANGED);
            continue;
        }
        if (!name || pd_mixdef_decode(name, sqlite3_column_blob(st, 1), (size_t)sqlite3_column_bytes(st, 1), &d)) {
            pd_registry_skip(r, 1, name, "invalid mixture", "");
            continue;
        }
        d->created_ms = sqlite3_column_int64(st, 2);
        if (pd_mix_insert(r, r->nmix, d, 0)) { /* rows arrive sorted */
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
    pd_errf(err, errlen, "reading the registry's mixtures: %s", sqlite3_errmsg(r->db));
    sqlite3_finalize(st);
    return PD_EIO;
}

/* Fold the WAL into registry.db and empty it, so the main file alone holds every committed dataset
 * (a WAL lost or damaged after a crash then loses nothing that was acknowledged). */
static int pd_registry_checkpoint(pd_registry *r)
{
    return sqlite3_wal_checkpoint_v2(r->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
}

/* Whether SQLite can read the whole file: quick_check reads every page and index. */
static int pd_registry_readable(pd_registry *r, char *why, size_t len)
{
    sqlite3_stmt *st;
    int ok = 0;
    if (sqlite3_prepare_v2(r->db, "PRAGMA quick_check", -1, &st, NULL) != SQLITE_OK) {
        pd_errf(why, len, "%s", sqlite3_errmsg(r->db));
        return 0;
    }
    if (sqlite3_step(st) == SQLITE_ROW) {
        const char *v = (const char *)sqlite3_column_text(st, 0);
        ok = v && !strcmp(v, "ok");
        pd_errf(why, len, "%s", v ? v : "no verdict");
    } else {
        pd_errf(why, len, "%s", sqlite3_errmsg(r->db));
    }
    sqlite3_finalize(st);
    return ok;
}

int pd_registry_move_aside(const char *state_dir, char *moved, size_t len)
{
    static const char *const suffix[] = {"", "-wal", "-shm"};
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

int pd_registry_open(const char *state_dir, pd_registry **out, char *err, size_t errlen)
{
    char path[4096], wal[4200], why[512];
    struct stat st;
    int rc = PD_EIO;
    pd_registry *r = calloc(1, sizeof *r);
    if (!r)
        return PD_ENOMEM;
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->write_lock, NULL);
    if (pd_mkdirs(state_dir)) {
        pd_errf(err, errlen, "state_dir %s: cannot create: %s", state_dir, strerror(errno));
        goto fail;
    }
    if ((size_t)snprintf(path, sizeof path, "%s/registry.db", state_dir) >= sizeof path) {
        pd_errf(err, errlen, "state_dir: path too long");
        goto fail;
    }
    snprintf(wal, sizeof wal, "%s-wal", path);
    /* A registry that exists must be read whole, or permd would start with fewer datasets than it
     * acknowledged and say nothing. SQLite takes a 0-byte file for a new database, and a main file
     * whose WAL is left without it for an empty one: both are refused here. */
    int exists = stat(path, &st) == 0;
    if (exists && st.st_size == 0) {
        pd_errf(err, errlen, "%s exists but is empty (0 bytes): the registry is damaged", path);
        rc = PD_ECORRUPT;
        goto fail;
    }
    if (!exists && stat(wal, &st) == 0 && st.st_size > 0) {
        pd_errf(err, errlen, "%s is missing but its write-ahead log %s is there: the registry is damaged", path, wal);
        rc = PD_ECORRUPT;
        goto fail;
    }
    if (exists && access(path, W_OK)) {
        pd_errf(err, errlen, "%s is read-only (%s): permd must be able to store datasets; fix its permissions",
                path, strerror(errno));
        goto fail;
    }
    if (sqlite3_open_v2(path, &r->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        NULL) != SQLITE_OK)
        goto fail_db;
    sqlite3_busy_timeout(r->db, 5000);
    if (sqlite3_db_readonly(r->db, "main") == 1) {
        pd_errf(err, errlen, "%s can only be opened read-only: permd must be able to store datasets", path);
        goto fail;
    }
    if (exists && !pd_registry_readable(r, why, sizeof why)) {
        pd_errf(err, errlen, "%s cannot be read whole (%s): the registry is damaged", path, why);
        rc = PD_ECORRUPT;
        goto fail;
    }
    /* WAL: readers never block the writer; synchronous=FULL: a commit is on disk (fsync of the WAL)
     * before sqlite3_step returns, so an ack means durable; every commit is then checkpointed into
     * the main file. A new database starts at schema 1 and migrates like an old one. */
    static const char schema[] = "PRAGMA journal_mode=WAL;"
                                 "PRAGMA synchronous=FULL;"
                                 "CREATE TABLE IF NOT EXISTS datasets ("
                                 "  name TEXT PRIMARY KEY NOT NULL,"
                                 "  size INTEGER NOT NULL,"
                                 "  created_ms INTEGER NOT NULL) WITHOUT ROWID;";
    if (sqlite3_exec(r->db, schema, NULL, NULL, NULL) != SQLITE_OK)
        goto fail_db;
    int version = 0, mrc = pd_registry_migrate(r, &version);
    if (mrc == PD_EUNSUPPORTED) {
        pd_errf(err, errlen, "%s: registry schema %d is newer than this permd's (%d); run a newer permd",
                path, version, PD_REGISTRY_SCHEMA);
        rc = PD_EUNSUPPORTED;
        goto fail;
    }
    if (mrc)
        goto fail_db;
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
    if ((rc = pd_registry_load(r, err, errlen)) || (rc = pd_registry_load_mixtures(r, err, errlen)))
        goto fail;
    if (pd_registry_checkpoint(r) != SQLITE_OK) {
        pd_registry_why(r->db, sqlite3_errcode(r->db), why, sizeof why);
        pd_errf(err, errlen, "%s: cannot fold the write-ahead log into the main file: %s", path, why);
        rc = PD_EIO;
        goto fail;
    }
    *out = r;
    return 0;
fail_db:
    rc = PD_EIO;
    if (r->db) {
        int code = sqlite3_errcode(r->db) & 0xff;
        if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB)
            rc = PD_ECORRUPT;
        pd_registry_why(r->db, sqlite3_errcode(r->db), why, sizeof why);
        pd_errf(err, errlen, "%s: %s", path, why);
    } else {
        pd_errf(err, errlen, "%s: cannot open", path);
    }
fail:
    pd_registry_close(r);
    return rc;
}

void pd_registry_set_layout_limit(pd_registry *r, uint64_t bytes)
{
    pthread_mutex_lock(&r->lock);
    r->layout_limit = bytes;
    pthread_mutex_unlock(&r->lock);
}

uint64_t pd_registry_layout_bytes(pd_registry *r)
{
    pthread_mutex_lock(&r->lock);
    uint64_t b = r->layout_bytes;
    pthread_mutex_unlock(&r->lock);
    return b;
}

size_t pd_registry_skipped(pd_registry *r)
{
    return r->skipped;
}

void pd_registry_close(pd_registry *r)
{
    if (!r)
        return;
    sqlite3_finalize(r->put);
    sqlite3_finalize(r->del);
    sqlite3_finalize(r->put_mix);
    sqlite3_finalize(r->del_mix);
    for (size_t i = 0; i < r->nmix; i++)
        pd_mixdef_release(r->mixes[i]);
    free(r->mixes);
    sqlite3_close(r->db);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->write_lock);
    for (size_t i = 0; i < r->n; i++)
        pd_layout_release(r->sets[i].layout);
    free(r->sets);
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
        rc = pd_table_insert(r, at, &d, NULL);
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
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
    int rc = 0, found;
    *created = 0;
    /* The write lock orders puts and deletes, so the table check below stays
     * true until the commit lands. */
    pthread_mutex_lock(&r->write_lock);
    pthread_mutex_lock(&r->lock);
    size_t at = pd_table_find(r, name, &found), mix_at;
    int is_mix;
    mix_at = pd_mix_find(r, name, &is_mix);
    (void)mix_at;
    if (found) {
        rc = pd_entry_matches(&r->sets[at], size, layout, window, lanes) ? 0 : PD_ECONFLICT;
        *out = r->sets[at].d;
    } else if (is_mix) {
        pd_errf(err, errlen, "'%s' is a mixture", name);
        rc = PD_ECONFLICT;
    } else if (layout && r->layout_limit && r->layout_bytes + pd_layout_bytes(layout->shards) > r->layout_limit) {
        pd_errf(err, errlen, "shard layouts would hold %llu bytes, over layout_memory (%llu)",
                (unsigned long long)(r->layout_bytes + pd_layout_bytes(layout->shards)),
                (unsigned long long)r->layout_limit);
        rc = PD_ETOOBIG;
    }
    pthread_mutex_unlock(&r->lock);
    if (found || rc)
        goto done;

    pd_dataset d = {.size = size, .created_ms = pd_clock_unix_ms()};
    size_t blob_len = 0;
    uint8_t *blob = NULL;
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
    sqlite3_clear_bindings(r->put);
    sqlite3_reset(r->put);
    free(blob);
    if (step != SQLITE_DONE || (step = pd_registry_checkpoint(r)) != SQLITE_OK) {
        pd_registry_why(r->db, step == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(r->db), err, errlen);
        pd_log_error("registry_put", "name=%s msg=\"%s\"", name, sqlite3_errmsg(r->db));
        rc = PD_EIO;
        goto done;
    }
    pthread_mutex_lock(&r->lock);
    at = pd_table_find(r, name, &found);
    rc = pd_table_insert(r, at, &d, pd_layout_ref(layout));
    if (rc)
        pd_layout_release(layout);
    pthread_mutex_unlock(&r->lock);
    if (rc == 0) {
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
    sqlite3_clear_bindings(r->del);
    sqlite3_reset(r->del);
    if (step != SQLITE_DONE || (step = pd_registry_checkpoint(r)) != SQLITE_OK) {
        pd_registry_why(r->db, step == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(r->db), err, errlen);
        pd_log_error("registry_delete", "name=%s msg=\"%s\"", name, sqlite3_errmsg(r->db));
        rc = PD_EIO;
        goto done;
    }
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
            pd_errf(err, errlen, "component '%s' is not a registered dataset", pd_name_printable(c->name));
            rc = PD_ENOTFOUND;
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
    sqlite3_clear_bindings(r->put_mix);
    sqlite3_reset(r->put_mix);
    free(blob);
    if (step != SQLITE_DONE || (step = pd_registry_checkpoint(r)) != SQLITE_OK) {
        pd_registry_why(r->db, step == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(r->db), err, errlen);
        pd_log_error("registry_put", "mixture=%s msg=\"%s\"", def->name, sqlite3_errmsg(r->db));
        rc = PD_EIO;
        goto done;
    }
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
    sqlite3_clear_bindings(r->del_mix);
    sqlite3_reset(r->del_mix);
    if (step != SQLITE_DONE || (step = pd_registry_checkpoint(r)) != SQLITE_OK) {
        pd_registry_why(r->db, step == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(r->db), err, errlen);
        rc = PD_EIO;
        goto done;
    }
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
