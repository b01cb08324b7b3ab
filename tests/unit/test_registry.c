/* Tests for daemon/registry.c: put/get/list/delete, conflicts, persistence, config datasets, threads, the state
 * directory's lock, open errors (damaged or not), failed writes and checkpoints, rows that must not load. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/mixdef.h"
#include "daemon/registry.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/permd-test-registry-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static pd_registry *open_reg(void)
{
    pd_registry *r;
    char err[256];
    if (pd_registry_open(dir, &r, err, sizeof err))
        fail_msg("open: %s", err);
    return r;
}

/* Setup for the tests below, which look at what the registry then does with these rows. */

/* Store a flat dataset; it must succeed. */
static void put_flat(pd_registry *r, const char *name, uint64_t size)
{
    pd_dataset d;
    int created;
    assert_int_equal(pd_registry_put(r, name, size, &d, &created, NULL, 0), 0);
}

/* Store a sharded dataset of three shards (5, 0 and 7 samples; window 2, lanes 1); it must succeed. */
static void put_small_sharded(pd_registry *r, const char *name)
{
    pd_dataset d;
    pd_layout *layout;
    int created;
    uint64_t sizes[3] = {5, 0, 7};
    assert_int_equal(pd_layout_create(sizes, 3, &layout), 0);
    assert_int_equal(pd_registry_put_sharded(r, name, layout, 2, 1, &d, &created, NULL, 0), 0);
    pd_layout_release(layout);
}

/* Store mixture name of one component, comp, at weight 1: what the put returned. */
static int put_one_mixture(pd_registry *r, const char *name, const char *comp, char *err, size_t errlen)
{
    pd_mixdef *def, *stored = NULL;
    int created;
    assert_int_equal(pd_mixdef_alloc(name, 1, 1, &def), 0);
    strcpy(def->comp[0].name, comp);
    def->weights[0] = 1;
    int rc = pd_registry_put_mixture(r, def, &stored, &created, err, errlen);
    pd_mixdef_release(stored);
    pd_mixdef_release(def);
    return rc;
}

static void test_put_get_list_delete(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    assert_int_equal(pd_registry_put(r, "zeta", 10, &d, &created, NULL, 0), 0);
    assert_int_equal(created, 1);
    assert_int_equal(pd_registry_put(r, "alpha", UINT64_C(1) << 63, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_put(r, "zeta", 10, &d, &created, NULL, 0), 0); /* idempotent */
    assert_int_equal(created, 0);
    assert_int_equal(pd_registry_put(r, "zeta", 11, &d, &created, NULL, 0), PD_ECONFLICT);
    assert_int_equal(d.size, 10); /* reports what exists */
    assert_int_equal(pd_registry_put(r, "bad name", 1, &d, &created, NULL, 0), PD_EINVAL);
    assert_int_equal(pd_registry_put(r, "zero", 0, &d, &created, NULL, 0), PD_EINVAL);
    assert_int_equal(pd_registry_put(r, "big", (UINT64_C(1) << 63) + 1, &d, &created, NULL, 0), PD_EINVAL);

    assert_int_equal(pd_registry_get(r, "alpha", &d), 0);
    assert_int_equal(d.size, UINT64_C(1) << 63);
    assert_int_equal(pd_registry_get(r, "beta", &d), PD_ENOTFOUND);

    pd_dataset *all;
    size_t n;
    assert_int_equal(pd_registry_list(r, &all, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(all[0].name, "alpha"); /* sorted */
    assert_string_equal(all[1].name, "zeta");
    free(all);

    assert_int_equal(pd_registry_delete(r, "zeta", NULL, 0), 0);
    assert_int_equal(pd_registry_delete(r, "zeta", NULL, 0), PD_ENOTFOUND);
    assert_int_equal(pd_registry_count(r), 1);
    pd_registry_close(r);
}

static void test_survives_reopen(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    assert_int_equal(pd_registry_put(r, "kept", 1281167, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_put(r, "gone", 5, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_put(r, "max", UINT64_C(1) << 63, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_delete(r, "gone", NULL, 0), 0);
    int64_t created_ms = d.created_ms;
    pd_registry_close(r);

    r = open_reg();
    assert_int_equal(pd_registry_count(r), 2);
    assert_int_equal(pd_registry_get(r, "kept", &d), 0);
    assert_int_equal(d.size, 1281167);
    assert_int_equal(pd_registry_get(r, "max", &d), 0);
    assert_int_equal(d.size, UINT64_C(1) << 63); /* stored beyond SQLite's signed range */
    assert_int_equal(d.created_ms, created_ms);
    assert_int_equal(pd_registry_get(r, "gone", &d), PD_ENOTFOUND);
    pd_registry_close(r);
}

static void test_config_datasets(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    assert_int_equal(pd_registry_put(r, "stored", 100, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_declare(r, "stored", 100, NULL, 0), 0); /* same size: fine */
    assert_int_equal(pd_registry_declare(r, "cfg", 7, NULL, 0), 0);
    assert_int_equal(pd_registry_declare(r, "cfg", 8, NULL, 0), PD_ECONFLICT);
    assert_int_equal(pd_registry_get(r, "cfg", &d), 0);
    assert_true(d.from_config);
    assert_int_equal(pd_registry_declare(r, "cfg2", 3, NULL, 0), 0);
    assert_int_equal(pd_registry_put(r, "cfg", 7, &d, &created, NULL, 0), 0); /* "exists", and now stored */
    assert_int_equal(created, 0);
    assert_true(d.from_config);
    int64_t cfg_created_ms = d.created_ms;
    assert_int_equal(pd_registry_put(r, "cfg", 7, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_put(r, "cfg", 9, &d, &created, NULL, 0), PD_ECONFLICT);
    assert_int_equal(pd_registry_delete(r, "cfg", NULL, 0), PD_ECONFLICT); /* while the config declares it */
    assert_int_equal(pd_registry_delete(r, "stored", NULL, 0), PD_ECONFLICT);
    pd_registry_close(r);

    /* A config dataset nobody put is not stored; one that was put is (its put returned 0: durable), and
     * outlives its declaration, as a dataset of its own. */
    r = open_reg();
    assert_int_equal(pd_registry_get(r, "cfg2", &d), PD_ENOTFOUND);
    assert_int_equal(pd_registry_get(r, "cfg", &d), 0);
    assert_int_equal(d.size, 7);
    assert_false(d.from_config);
    assert_int_equal(d.created_ms, cfg_created_ms);
    assert_int_equal(pd_registry_declare(r, "stored", 101, NULL, 0), PD_ECONFLICT);
    assert_int_equal(pd_registry_declare(r, "cfg", 7, NULL, 0), 0); /* declared again: the same definition */
    assert_int_equal(pd_registry_declare(r, "cfg", 8, NULL, 0), PD_ECONFLICT);
    pd_registry_close(r);
    r = open_reg();
    assert_int_equal(pd_registry_delete(r, "cfg", NULL, 0), 0); /* undeclared: an ordinary stored dataset */
    pd_registry_close(r);
}

static void test_open_errors(void **state)
{
    (void)state;
    pd_registry *r;
    char err[256] = "", path[128];
    snprintf(path, sizeof path, "%s/file", dir);
    FILE *f = fopen(path, "w");
    fclose(f);
    snprintf(path, sizeof path, "%s/file/sub", dir); /* a file where a directory must be */
    assert_int_equal(pd_registry_open(path, &r, err, sizeof err), PD_EIO);
    assert_non_null(strstr(err, "file/sub"));
}

/* Whether dir holds a file whose name starts with prefix. */
static int has_file(const char *prefix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    assert_non_null(d);
    while ((e = readdir(d)))
        found |= !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return found;
}

/* One registry per state directory: a second open (another permd) is refused, naming the directory and the
 * holder, until the first closes. Without the lock both served, and one's put replaced the other's row. */
static void test_state_dir_lock(void **state)
{
    (void)state;
    pd_registry *r = open_reg(), *r2 = NULL;
    pd_dataset d;
    int created;
    char err[512] = "", pid[32];
    assert_int_equal(pd_registry_put(r, "imagenet", 1000, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_open(dir, &r2, err, sizeof err), PD_EBUSY);
    assert_null(r2);
    assert_non_null(strstr(err, dir));
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    assert_non_null(strstr(err, pid));
    assert_int_equal(pd_registry_open_fresh(dir, &r2, err, sizeof err), PD_EBUSY); /* and moves nothing */
    assert_false(has_file("registry.db.damaged"));
    pd_registry_close(r);
    r = open_reg();
    assert_int_equal(pd_registry_get(r, "imagenet", &d), 0);
    assert_int_equal(d.size, 1000);
    pd_registry_close(r);
}

static void exec_sql(const char *sql);

/* Only real damage counts as damaged. A registry another process holds locked, or one whose files permd
 * cannot create, may be intact: fresh_registry must not move it aside, and the error says what it is. */
static void test_not_damaged(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    char err[512] = "", path[128];
    assert_int_equal(pd_registry_put(r, "keep", 10, &d, &created, NULL, 0), 0);
    pd_registry_close(r);

    /* Locked: a maintenance transaction holds SQLite's exclusive lock past the busy timeout (5 s). */
    sqlite3 *db;
    snprintf(path, sizeof path, "%s/registry.db", dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "PRAGMA locking_mode=EXCLUSIVE; BEGIN EXCLUSIVE;"
                                      "UPDATE datasets SET created_ms = created_ms;", NULL, NULL, NULL), SQLITE_OK);
    r = NULL;
    assert_int_equal(pd_registry_open_fresh(dir, &r, err, sizeof err), PD_EBUSY);
    assert_null(r);
    assert_non_null(strstr(err, "not damaged"));
    assert_false(has_file("registry.db.damaged"));
    assert_int_equal(sqlite3_exec(db, "ROLLBACK;", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    /* Files SQLite must create cannot be (as in a read-only directory; a directory in the way works for root
     * too): an I/O error, not damage. */
    snprintf(path, sizeof path, "%s/registry.db-shm", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(pd_registry_open_fresh(dir, &r, err, sizeof err), PD_EIO);
    assert_null(strstr(err, "damaged"));
    assert_false(has_file("registry.db.damaged"));
    assert_int_equal(rmdir(path), 0);

    r = open_reg();
    assert_int_equal(pd_registry_get(r, "keep", &d), 0);
    pd_registry_close(r);

    /* Real damage still is: a file that is not a database is moved aside with fresh_registry. */
    FILE *f;
    snprintf(path, sizeof path, "%s/registry.db", dir);
    assert_non_null(f = fopen(path, "w"));
    for (int i = 0; i < 256; i++)
        fputs("not a database, ", f);
    fclose(f);
    assert_int_equal(pd_registry_open(dir, &r, err, sizeof err), PD_ECORRUPT);
    assert_false(has_file("registry.db.damaged"));
    assert_int_equal(pd_registry_open_fresh(dir, &r, err, sizeof err), 0);
    assert_true(has_file("registry.db.damaged"));
    assert_int_equal(pd_registry_count(r), 0);
    pd_registry_close(r);
}

static void exec_sql_in(const char *d, const char *sql)
{
    char path[160];
    sqlite3 *db;
    snprintf(path, sizeof path, "%s/registry.db", d);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

static void exec_sql(const char *sql)
{
    exec_sql_in(dir, sql);
}

/* One text value from a query on the registry in d. */
static void query_in(const char *d, const char *sql, char *out, size_t len)
{
    char path[160];
    sqlite3 *db;
    sqlite3_stmt *st;
    snprintf(path, sizeof path, "%s/registry.db", d);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    snprintf(out, len, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* Rewrite a sharded dataset's stored shard sizes with the first and the last swapped (the same total, another
 * layout), as a damaged disk might leave them. */
static void swap_stored_sizes(const char *name)
{
    char path[128];
    sqlite3 *db;
    sqlite3_stmt *st;
    snprintf(path, sizeof path, "%s/registry.db", dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT shards FROM datasets WHERE name = ?1", -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int n = sqlite3_column_bytes(st, 0);
    uint8_t blob[64], t[8];
    assert_true(n >= 16 && n <= (int)sizeof blob && sqlite3_column_type(st, 0) == SQLITE_BLOB);
    memcpy(blob, sqlite3_column_blob(st, 0), (size_t)n);
    sqlite3_finalize(st);
    memcpy(t, blob, 8);
    memcpy(blob, blob + n - 8, 8);
    memcpy(blob + n - 8, t, 8);
    assert_int_equal(sqlite3_prepare_v2(db, "UPDATE datasets SET shards = ?1 WHERE name = ?2", -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_blob(st, 1, blob, n, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* A registry written by permd 0.1 (schema 1: no shard columns, user_version 0) opens, keeps its
 * datasets and takes sharded ones; a registry from a newer permd is refused, untouched. */
static void test_schema_versions(void **state)
{
    (void)state;
    exec_sql("CREATE TABLE datasets (name TEXT PRIMARY KEY NOT NULL, size INTEGER NOT NULL,"
             " created_ms INTEGER NOT NULL) WITHOUT ROWID;"
             "INSERT INTO datasets VALUES('old', 1281167, 1700000000000);");
    pd_registry *r = open_reg();
    pd_dataset d;
    assert_int_equal(pd_registry_get(r, "old", &d), 0);
    assert_int_equal(d.size, 1281167);
    assert_int_equal(d.created_ms, 1700000000000);
    put_small_sharded(r, "new");
    pd_registry_close(r);
    r = open_reg(); /* migrated once; opens again as schema 2 */
    assert_int_equal(pd_registry_count(r), 2);
    pd_registry_close(r);

    exec_sql("PRAGMA user_version=99;");
    char err[512] = "";
    assert_int_equal(pd_registry_open(dir, &r, err, sizeof err), PD_EUNSUPPORTED);
    assert_non_null(strstr(err, "schema 99"));
    exec_sql("PRAGMA user_version=2;");
    r = open_reg();
    assert_int_equal(pd_registry_count(r), 2);
    pd_registry_close(r);

    /* Schema 3 whose mixtures' table was dropped by hand: the datasets load and the table is created empty
     * (it was refused as an I/O error that fresh_registry does not move aside). */
    exec_sql("DROP TABLE mixtures;");
    r = open_reg();
    assert_int_equal(pd_registry_count(r), 2);
    assert_int_equal(put_one_mixture(r, "mx", "old", NULL, 0), 0);
    pd_registry_close(r);

    /* A version set back by hand over the newer columns: the migration adds only what is missing. */
    exec_sql("PRAGMA user_version=1;");
    r = open_reg();
    assert_int_equal(pd_registry_count(r), 2);
    pd_registry_close(r);
    exec_sql("PRAGMA user_version=-1;"); /* not a version permd writes: refused, saying so */
    assert_int_equal(pd_registry_open(dir, &r, err, sizeof err), PD_EUNSUPPORTED);
    assert_non_null(strstr(err, "schema -1"));

    /* A migration that fails says why (ROLLBACK used to replace the cause with "not an error"). */
    char other[128], v[64];
    snprintf(other, sizeof other, "%s/view", dir);
    assert_int_equal(mkdir(other, 0700), 0);
    exec_sql_in(other, "CREATE TABLE datasets (name TEXT PRIMARY KEY NOT NULL, size INTEGER NOT NULL,"
                       " created_ms INTEGER NOT NULL) WITHOUT ROWID;"
                       "CREATE VIEW mixtures AS SELECT 'x' AS name; PRAGMA user_version=1;");
    assert_int_equal(pd_registry_open(other, &r, err, sizeof err), PD_EIO);
    assert_non_null(strstr(err, "migrating the registry from schema 1 to 3 failed"));
    assert_null(strstr(err, "not an error"));

    /* A newer schema is refused before anything is written: no switch to WAL, no table of ours. */
    snprintf(other, sizeof other, "%s/newer", dir);
    assert_int_equal(mkdir(other, 0700), 0);
    exec_sql_in(other, "CREATE TABLE datasets_v4 (name TEXT PRIMARY KEY, size INTEGER); PRAGMA user_version=4;"
                       "PRAGMA application_id=1885696612;"); /* a newer permd's: marked as permd's */
    assert_int_equal(pd_registry_open(other, &r, err, sizeof err), PD_EUNSUPPORTED);
    assert_non_null(strstr(err, "schema 4"));
    query_in(other, "PRAGMA journal_mode", v, sizeof v);
    assert_string_equal(v, "delete");
    query_in(other, "SELECT count(*) FROM sqlite_master WHERE name = 'datasets'", v, sizeof v);
    assert_string_equal(v, "0");
}

/* Another program's SQLite file at registry.db (a path mixed up in a deployment) is refused untouched: it used
 * to be adopted, permd adding its tables to that program's data. An older permd's registry (application_id 0,
 * permd's tables only) is adopted and marked, and so is every new one: the negative controls. */
static void test_foreign_sqlite_file(void **state)
{
    (void)state;
    static const struct {
        const char *sql, *says;
    } foreign[] = {
        {"CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT); PRAGMA user_version=2;", "holds users"},
        /* a user_version past permd's: said to be another program's, not "a newer permd's schema" */
        {"CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT); PRAGMA user_version=7;", "holds users"},
        {"CREATE TABLE datasets (id INTEGER PRIMARY KEY, path TEXT);", "other columns than permd's"},
        /* permd's own shape, but stamped by another program */
        {"CREATE TABLE datasets (name TEXT PRIMARY KEY NOT NULL, size INTEGER NOT NULL, created_ms INTEGER NOT NULL)"
         " WITHOUT ROWID; PRAGMA application_id=42;", "application_id 0x0000002a"},
    };
    char other[128], err[512], v[64];
    pd_registry *r;
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        snprintf(other, sizeof other, "%s/foreign%zu", dir, i);
        assert_int_equal(mkdir(other, 0700), 0);
        exec_sql_in(other, foreign[i].sql);
        err[0] = 0;
        assert_int_equal(pd_registry_open(other, &r, err, sizeof err), PD_EUNSUPPORTED);
        assert_non_null(strstr(err, "is not a permd registry"));
        assert_non_null(strstr(err, foreign[i].says));
        query_in(other, "PRAGMA journal_mode", v, sizeof v); /* untouched: no switch to WAL, no table of ours */
        assert_string_equal(v, "delete");
        query_in(other, "SELECT count(*) FROM sqlite_master WHERE name = 'mixtures'", v, sizeof v);
        assert_string_equal(v, "0");
        /* fresh_registry moves only damage aside: another program's file stays where it is */
        assert_int_equal(pd_registry_open_fresh(other, &r, err, sizeof err), PD_EUNSUPPORTED);
        query_in(other, "SELECT count(*) FROM sqlite_master", v, sizeof v);
        assert_string_equal(v, "1");
    }

    /* A new registry is marked; an older permd's (no id, permd's tables only) is adopted and marked. */
    r = open_reg();
    put_flat(r, "kept", 7);
    pd_registry_close(r);
    query_in(dir, "PRAGMA application_id", v, sizeof v);
    assert_string_equal(v, "1885696612");
    exec_sql("PRAGMA application_id=0;");
    r = open_reg();
    pd_dataset d;
    assert_int_equal(pd_registry_get(r, "kept", &d), 0);
    pd_registry_close(r);
    query_in(dir, "PRAGMA application_id", v, sizeof v);
    assert_string_equal(v, "1885696612");
}

/* A value changed on disk behind permd's back (SQLite checks pages, not values): the row's checksum no longer
 * matches, and the dataset or mixture is not served, where it would have given other ids. A row from before
 * checksums (NULL) still loads: the negative control. */
static void test_row_checksums(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d;
    pd_mixdef *stored;
    int created;
    put_flat(r, "flat", 100);
    put_flat(r, "older", 100);
    put_flat(r, "comp", 50);
    put_small_sharded(r, "sharded");
    assert_int_equal(put_one_mixture(r, "mx", "comp", NULL, 0), 0);
    pd_registry_close(r);

    exec_sql("UPDATE datasets SET size = 101 WHERE name = 'flat';" /* a bit flipped in a size */
             "UPDATE mixtures SET def = CAST(substr(def, 1, length(def) - 1) || X'02' AS BLOB) WHERE name = 'mx';"
             "UPDATE datasets SET sum = NULL, size = 102 WHERE name = 'older';"); /* as written before checksums */
    swap_stored_sizes("sharded"); /* {5, 0, 7} read back as {7, 0, 5}: the same total, a valid layout */
    r = open_reg();
    assert_int_equal(pd_registry_get(r, "flat", &d), PD_ENOTFOUND);
    assert_int_equal(pd_registry_get(r, "sharded", &d), PD_ENOTFOUND);
    assert_int_equal(pd_registry_mixture(r, "mx", &stored), PD_ENOTFOUND);
    assert_int_equal(pd_registry_skipped(r), 3);
    assert_int_equal(pd_registry_get(r, "older", &d), 0);
    assert_int_equal(d.size, 102);
    assert_int_equal(pd_registry_get(r, "comp", &d), 0);
    /* a put of the name replaces the damaged row */
    assert_int_equal(pd_registry_put(r, "flat", 100, &d, &created, NULL, 0), 0);
    assert_int_equal(created, 1);
    pd_registry_close(r);
    r = open_reg();
    assert_int_equal(pd_registry_get(r, "flat", &d), 0);
    pd_registry_close(r);

    /* A shards column of another type than a blob (and no checksum, as an older permd wrote it) is not read as a
     * flat dataset of that size. */
    exec_sql("UPDATE datasets SET shards = 'x', sum = NULL WHERE name = 'comp';");
    r = open_reg();
    assert_int_equal(pd_registry_get(r, "comp", &d), PD_ENOTFOUND);
    pd_registry_close(r);
}

/* ---- A full disk, one file at a time: a VFS over the default one whose writes fail with SQLITE_FULL on the
 * main database file or on the WAL. A commit writes only the WAL; its checkpoint only the main file. */

typedef struct full_file {
    sqlite3_file base;
    int kind; /* 1: main database, 2: WAL, 0: other */
    sqlite3_file *real;
} full_file;

static sqlite3_vfs *real_vfs, full_vfs;
static int full_main, full_wal;

#define REAL(f) (((full_file *)(f))->real)
static int ff_close(sqlite3_file *f) { return REAL(f)->pMethods->xClose(REAL(f)); }
static int ff_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o)
{
    return REAL(f)->pMethods->xRead(REAL(f), b, n, o);
}
static int ff_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o)
{
    int kind = ((full_file *)f)->kind;
    if ((kind == 1 && full_main) || (kind == 2 && full_wal))
        return SQLITE_FULL;
    return REAL(f)->pMethods->xWrite(REAL(f), b, n, o);
}
static int ff_truncate(sqlite3_file *f, sqlite3_int64 n) { return REAL(f)->pMethods->xTruncate(REAL(f), n); }
static int ff_sync(sqlite3_file *f, int fl) { return REAL(f)->pMethods->xSync(REAL(f), fl); }
static int ff_size(sqlite3_file *f, sqlite3_int64 *n) { return REAL(f)->pMethods->xFileSize(REAL(f), n); }
static int ff_lock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xLock(REAL(f), l); }
static int ff_unlock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xUnlock(REAL(f), l); }
static int ff_reserved(sqlite3_file *f, int *o) { return REAL(f)->pMethods->xCheckReservedLock(REAL(f), o); }
static int ff_control(sqlite3_file *f, int op, void *a) { return REAL(f)->pMethods->xFileControl(REAL(f), op, a); }
static int ff_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int ff_device(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int ff_shm_map(sqlite3_file *f, int i, int sz, int w, void volatile **p)
{
    return REAL(f)->pMethods->xShmMap(REAL(f), i, sz, w, p);
}
static int ff_shm_lock(sqlite3_file *f, int o, int n, int fl) { return REAL(f)->pMethods->xShmLock(REAL(f), o, n, fl); }
static void ff_shm_barrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int ff_shm_unmap(sqlite3_file *f, int del) { return REAL(f)->pMethods->xShmUnmap(REAL(f), del); }
static int ff_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **p)
{
    return REAL(f)->pMethods->xFetch(REAL(f), o, n, p);
}
static int ff_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p) { return REAL(f)->pMethods->xUnfetch(REAL(f), o, p); }

static const sqlite3_io_methods full_io = {3, ff_close, ff_read, ff_write, ff_truncate, ff_sync, ff_size, ff_lock,
                                           ff_unlock, ff_reserved, ff_control, ff_sector, ff_device, ff_shm_map,
                                           ff_shm_lock, ff_shm_barrier, ff_shm_unmap, ff_fetch, ff_unfetch};

static int ff_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *out_flags)
{
    (void)vfs;
    full_file *f = (full_file *)file;
    f->real = (sqlite3_file *)(f + 1);
    f->kind = flags & SQLITE_OPEN_MAIN_DB ? 1 : flags & SQLITE_OPEN_WAL ? 2 : 0;
    int rc = real_vfs->xOpen(real_vfs, name, f->real, flags, out_flags);
    f->base.pMethods = f->real->pMethods ? &full_io : NULL;
    return rc;
}

static void full_vfs_install(void)
{
    real_vfs = sqlite3_vfs_find(NULL);
    assert_true(real_vfs->iVersion >= 1);
    full_vfs = *real_vfs;
    full_vfs.zName = "permd-test-full";
    full_vfs.szOsFile = (int)sizeof(full_file) + real_vfs->szOsFile;
    full_vfs.xOpen = ff_open;
    full_vfs.pNext = NULL;
    assert_int_equal(sqlite3_vfs_register(&full_vfs, 1), SQLITE_OK); /* the default: the registry opens with it */
}

static void full_vfs_remove(void)
{
    full_main = full_wal = 0;
    if (real_vfs) {
        sqlite3_vfs_unregister(&full_vfs);
        sqlite3_vfs_register(real_vfs, 1);
        real_vfs = NULL;
    }
}

/* teardown, and the default VFS back even when the test failed midway */
static int teardown_full(void **state)
{
    full_vfs_remove();
    return teardown(state);
}

/* A commit that succeeded is a success even when the checkpoint after it fails (a full disk): it is durable in
 * the WAL and appears after a restart, so reporting it failed was a lie. A commit that fails stores nothing. */
static void test_full_disk(void **state)
{
    (void)state;
    full_vfs_install();
    pd_registry *r = open_reg();
    pd_dataset d;
    pd_mixdef *stored;
    int created;
    char err[256] = "";
    put_flat(r, "gone", 3);
    put_flat(r, "other", 4);

    full_main = 1; /* the main file cannot grow: commits land in the WAL, checkpoints fail */
    assert_int_equal(pd_registry_put(r, "kept", 7, &d, &created, err, sizeof err), 0);
    assert_int_equal(created, 1);
    assert_int_equal(pd_registry_get(r, "kept", &d), 0);
    assert_int_equal(pd_registry_delete(r, "gone", err, sizeof err), 0);
    assert_int_equal(pd_registry_get(r, "gone", &d), PD_ENOTFOUND);
    assert_int_equal(put_one_mixture(r, "mx", "kept", err, sizeof err), 0);
    assert_int_equal(pd_registry_checkpoint_failures(r), 3);

    full_main = 0;
    full_wal = 1; /* nothing can be written: the commit itself fails */
    assert_int_equal(pd_registry_put(r, "lost", 9, &d, &created, err, sizeof err), PD_EIO);
    assert_non_null(strstr(err, "disk full"));
    assert_int_equal(pd_registry_get(r, "lost", &d), PD_ENOTFOUND);
    assert_int_equal(pd_registry_delete(r, "other", err, sizeof err), PD_EIO);
    assert_int_equal(pd_registry_get(r, "other", &d), 0);
    full_wal = 0;
    pd_registry_close(r);
    full_vfs_remove();

    r = open_reg(); /* what each call said is what is stored */
    assert_int_equal(pd_registry_get(r, "kept", &d), 0);
    assert_int_equal(d.size, 7);
    assert_int_equal(pd_registry_get(r, "gone", &d), PD_ENOTFOUND);
    assert_int_equal(pd_registry_get(r, "lost", &d), PD_ENOTFOUND);
    assert_int_equal(pd_registry_get(r, "other", &d), 0);
    assert_int_equal(pd_registry_mixture(r, "mx", &stored), 0);
    pd_mixdef_release(stored);
    pd_registry_close(r);
}

/* A commit whose checkpoint failed lives in the WAL alone (registry.db-pending names it). If that WAL is then lost
 * or damaged, startup refuses the registry instead of starting without acknowledged commits and saying nothing;
 * with it intact, startup folds it in and the file goes. */
static void test_lost_wal_is_noticed(void **state)
{
    (void)state;
    char wal[128], pending[128], err[512] = "";
    snprintf(wal, sizeof wal, "%s/registry.db-wal", dir);
    snprintf(pending, sizeof pending, "%s/registry.db-pending", dir);
    full_vfs_install();
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    put_flat(r, "before", 3);
    assert_int_equal(access(pending, F_OK), -1); /* checkpointed: nothing pending */
    full_main = 1;
    assert_int_equal(pd_registry_delete(r, "before", err, sizeof err), 0); /* a delete left in the WAL: then intact */
    assert_int_equal(access(pending, F_OK), 0);
    pd_registry_close(r); /* its checkpoint fails too (full), and SQLite's own */
    full_main = 0;
    r = open_reg();
    assert_int_equal(pd_registry_get(r, "before", &d), PD_ENOTFOUND);
    assert_int_equal(access(pending, F_OK), -1); /* folded in at startup */
    full_main = 1;
    assert_int_equal(pd_registry_put(r, "acked", 7, &d, &created, err, sizeof err), 0);
    assert_int_equal(access(pending, F_OK), 0);
    pd_registry_close(r);
    full_vfs_remove();
    assert_int_equal(unlink(wal), 0); /* lost (a damaged one reads the same: SQLite stops at its first bad frame) */
    assert_int_equal(pd_registry_open(dir, &r, err, sizeof err), PD_ECORRUPT);
    if (!strstr(err, "put of dataset 'acked'"))
        fail_msg("error: %s", err);
    assert_int_equal(access(pending, F_OK), 0); /* refused: left as found */
    assert_int_equal(pd_registry_open_fresh(dir, &r, err, sizeof err), 0); /* moved aside with the rest */
    assert_int_equal(access(pending, F_OK), -1);
    pd_registry_close(r);
}

/* A restart while the disk is still full: the commits in the WAL are read and served, and folded in once there is
 * room (startup exited 1, "cannot fold the write-ahead log", until space was freed: a full disk became an outage
 * at the first restart). */
static void test_restart_on_a_full_disk(void **state)
{
    (void)state;
    char pending[128];
    snprintf(pending, sizeof pending, "%s/registry.db-pending", dir);
    full_vfs_install();
    pd_registry *r = open_reg();
    pd_dataset d;
    put_flat(r, "folded", 3);
    full_main = 1;
    put_flat(r, "in_wal", 5);
    pd_registry_close(r);
    r = open_reg(); /* the disk still full */
    assert_int_equal(pd_registry_get(r, "in_wal", &d), 0);
    assert_int_equal(d.size, 5);
    assert_int_equal(pd_registry_checkpoint_failures(r), 1);
    assert_int_equal(access(pending, F_OK), 0); /* still names the commit the WAL alone holds */
    full_main = 0;
    put_flat(r, "after", 7); /* room again: its checkpoint folds everything in */
    assert_int_equal(access(pending, F_OK), -1);
    pd_registry_close(r);
    full_vfs_remove();
    r = open_reg();
    assert_int_equal(pd_registry_get(r, "in_wal", &d), 0);
    assert_int_equal(pd_registry_get(r, "after", &d), 0);
    pd_registry_close(r);
}

/* A first start on a full disk fails, and leaves no registry.db behind: it left a 0-byte one, which every later
 * start refused as damaged, even with room again. */
static void test_first_start_on_a_full_disk(void **state)
{
    (void)state;
    char path[128], err[512] = "";
    snprintf(path, sizeof path, "%s/registry.db", dir);
    full_vfs_install();
    full_main = 1;
    pd_registry *r;
    assert_int_not_equal(pd_registry_open(dir, &r, err, sizeof err), 0);
    assert_non_null(strstr(err, "cannot create the registry"));
    assert_int_equal(access(path, F_OK), -1);
    full_main = 0;
    r = open_reg();
    put_flat(r, "first", 1);
    pd_registry_close(r);
    full_vfs_remove();
    r = open_reg();
    pd_dataset d;
    assert_int_equal(pd_registry_get(r, "first", &d), 0);
    pd_registry_close(r);
}

/* A FIFO where registry.db-pending belongs is refused at once: opening it waited for a writer, and startup (its
 * signals blocked) with it, for ever. */
static void test_pending_not_a_file(void **state)
{
    (void)state;
    char pending[128], err[512] = "";
    snprintf(pending, sizeof pending, "%s/registry.db-pending", dir);
    pd_registry *r = open_reg();
    put_flat(r, "x", 3);
    pd_registry_close(r);
    assert_int_equal(mkfifo(pending, 0600), 0);
    /* PD_EIO, not damage: fresh_registry moves nothing aside for it */
    assert_int_equal(pd_registry_open(dir, &r, err, sizeof err), PD_EIO);
    assert_non_null(strstr(err, "registry.db-pending is not a regular file"));
}

/* The commits left in the WAL alone, then the WAL lost: startup refuses the registry, naming the commit (says). */
static void expect_lost_commit(pd_registry *r, const char *says)
{
    char wal[128], err[512] = "";
    snprintf(wal, sizeof wal, "%s/registry.db-wal", dir);
    pd_registry_close(r);
    full_main = 0;
    full_vfs_remove();
    assert_int_equal(unlink(wal), 0);
    assert_int_equal(pd_registry_open(dir, &r, err, sizeof err), PD_ECORRUPT);
    if (!strstr(err, says))
        fail_msg("error: %s", err);
}

/* A mixture stored over a config dataset outlives the declaration: the next start names it (it was served as
 * listed and failed at every request, with nothing logged). */
static void test_mixture_over_a_dropped_config_dataset(void **state)
{
    (void)state;
    char err[256] = "";
    pd_registry *r = open_reg();
    assert_int_equal(pd_registry_declare(r, "declared", 500, err, sizeof err), 0);
    assert_int_equal(put_one_mixture(r, "over_config", "declared", err, sizeof err), 0);
    put_flat(r, "stored", 9);
    assert_int_equal(put_one_mixture(r, "over_stored", "stored", err, sizeof err), 0);
    assert_int_equal(pd_registry_check_mixtures(r), 0);
    pd_registry_close(r);
    r = open_reg(); /* the config without it */
    assert_int_equal(pd_registry_check_mixtures(r), 1);
    assert_int_equal(pd_registry_declare(r, "declared", 500, err, sizeof err), 0); /* declared again */
    assert_int_equal(pd_registry_check_mixtures(r), 0);
    pd_registry_close(r);
}

/* Several commits in the WAL alone, the last a delete of another name: losing the WAL loses the earlier put, and a
 * check of the last commit alone (the delete: its name is absent) passed and started without it. */
static void test_lost_wal_after_several_commits(void **state)
{
    (void)state;
    char err[512] = "";
    full_vfs_install();
    pd_registry *r = open_reg();
    put_flat(r, "before", 2); /* checkpointed */
    full_main = 1;
    put_flat(r, "kept", 3);
    put_flat(r, "brief", 4);
    assert_int_equal(pd_registry_delete(r, "brief", err, sizeof err), 0);
    expect_lost_commit(r, "put of dataset 'kept'");
}

/* The same for a name deleted and put again with another size, both left in the WAL: the older row is still in
 * registry.db, so finding the name is not enough: its definition must be the acknowledged one (size 3 was served). */
static void test_lost_wal_after_reput(void **state)
{
    (void)state;
    char err[512] = "";
    full_vfs_install();
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    put_flat(r, "x", 3); /* checkpointed into registry.db */
    full_main = 1;
    assert_int_equal(pd_registry_delete(r, "x", err, sizeof err), 0);
    assert_int_equal(pd_registry_put(r, "x", 10, &d, &created, err, sizeof err), 0); /* acknowledged */
    expect_lost_commit(r, "put of dataset 'x'");
}

/* A mixture's delete left in the WAL alone, then the WAL lost: the mixture is back in registry.db, and startup
 * must say the acknowledged delete is missing rather than serve it again (a delete names no definition). */
static void test_lost_wal_after_mixture_delete(void **state)
{
    (void)state;
    char err[512] = "";
    full_vfs_install();
    pd_registry *r = open_reg();
    put_flat(r, "part", 3);
    assert_int_equal(put_one_mixture(r, "blend", "part", err, sizeof err), 0); /* checkpointed */
    full_main = 1;
    assert_int_equal(pd_registry_delete_mixture(r, "blend", err, sizeof err), 0); /* acknowledged, in the WAL */
    expect_lost_commit(r, "delete of mixture 'blend'");
}

/* Startup beside another process writing to the registry (sqlite3 in a transaction) waits registry_busy_ms for
 * it, then refuses as locked (startup exits 1), rather than load what the writer is about to change. */
static void test_writer_at_startup(void **state)
{
    (void)state;
    char path[128], err[512] = "";
    snprintf(path, sizeof path, "%s/registry.db", dir);
    pd_registry *r = open_reg();
    put_flat(r, "x", 3);
    pd_registry_close(r);
    sqlite3 *writer;
    assert_int_equal(sqlite3_open_v2(path, &writer, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(writer, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    double t0 = test_now_s();
    assert_int_equal(pd_registry_open_with(dir, 0, 300, &r, err, sizeof err), PD_EBUSY);
    double took = test_now_s() - t0;
    print_message("startup beside a writer holding the lock: %.3f s (%s)\n", took, err);
    assert_true(took >= 0.25);
    assert_non_null(strstr(err, "locked"));
    /* A stop asked during the wait ends it at once: startup runs with SIGTERM blocked (the loop takes it once it
     * runs), and a 10-minute registry_busy_ms was waited out whole. */
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    assert_int_equal(pthread_sigmask(SIG_BLOCK, &term, &old), 0);
    assert_int_equal(kill(getpid(), SIGTERM), 0); /* pending, as when systemd stops a starting permd */
    t0 = test_now_s();
    assert_int_equal(pd_registry_open_with(dir, 0, 600000, &r, err, sizeof err), PD_EBUSY);
    took = test_now_s() - t0;
    assert_true(took < 5);
    assert_non_null(strstr(err, "asked to stop"));
    const struct timespec none = {0, 0};
    assert_int_equal(sigtimedwait(&term, NULL, &none), SIGTERM); /* taken: the test goes on */
    assert_int_equal(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
    assert_int_equal(sqlite3_exec(writer, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(writer);
    assert_int_equal(pd_registry_open_with(dir, 0, 300, &r, err, sizeof err), 0);
    pd_registry_close(r);
}

/* A registry.db-pending that is not a whole line of ours (torn by a crash while it was written, or written by
 * something else) cannot name a commit: startup warns and goes on, rather than refuse an intact registry. */
static void test_unreadable_pending(void **state)
{
    (void)state;
    static const char *const lines[] = {"", "put dataset", "put dataset 00000000000000zz x\n",
                                        "frobnicate dataset 0000000000000000 x\n",
                                        "delete table 0000000000000000 x\n", "put dataset 0000000000000000 a/b\n"};
    char pending[128], err[256] = "";
    snprintf(pending, sizeof pending, "%s/registry.db-pending", dir);
    pd_registry *r = open_reg();
    put_flat(r, "x", 3);
    pd_registry_close(r);
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        FILE *f = fopen(pending, "w");
        assert_non_null(f);
        fputs(lines[i], f);
        fclose(f);
        if (pd_registry_open(dir, &r, err, sizeof err))
            fail_msg("pending file '%s': %s", lines[i], err);
        pd_dataset d;
        assert_int_equal(pd_registry_get(r, "x", &d), 0);
        pd_registry_close(r);
        assert_int_equal(access(pending, F_OK), -1); /* gone with the startup checkpoint */
    }
}

/* Another process reading the registry at path (a backup): a read transaction that has seen `rows` datasets and
 * holds its snapshot of the WAL until COMMIT. */
static sqlite3 *open_reader(const char *path, int rows)
{
    sqlite3 *reader;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open_v2(path, &reader, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(reader, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(reader, "SELECT count(*) FROM datasets", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(st, 0), rows);
    sqlite3_finalize(st);
    return reader;
}

/* A restart while another process reads the registry (a backup holding an old snapshot of the WAL): neither the
 * stop nor the startup can fold the WAL in, and neither may wait registry_busy_ms for the reader, nor startup
 * refuse to start (it waited and exited 1): the rows are there, and the first commit after the reader is gone
 * folds them in. */
static void test_reader_at_startup(void **state)
{
    (void)state;
    char path[128], wal[128], pending[128], err[256] = "";
    snprintf(path, sizeof path, "%s/registry.db", dir);
    snprintf(wal, sizeof wal, "%s/registry.db-wal", dir);
    snprintf(pending, sizeof pending, "%s/registry.db-pending", dir);
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    put_flat(r, "first", 3);
    sqlite3 *reader = open_reader(path, 1);
    assert_int_equal(pd_registry_put(r, "during", 10, &d, &created, err, sizeof err), 0); /* left in the WAL */
    assert_int_equal(access(pending, F_OK), 0);
    double t0 = test_now_s();
    pd_registry_close(r);
    double stop = test_now_s() - t0;

    t0 = test_now_s();
    assert_int_equal(pd_registry_open_with(dir, 0, 2000, &r, err, sizeof err), 0);
    double took = test_now_s() - t0;
    print_message("beside a reader holding the WAL: close %.3f s, startup %.3f s\n", stop, took);
    assert_true(stop < 1.5); /* not the 5 s busy wait (registry_busy_ms) */
    assert_true(took < 1.5); /* not its 2 s */
    assert_int_equal(pd_registry_checkpoint_failures(r), 1);
    assert_int_equal(pd_registry_get(r, "during", &d), 0);
    assert_int_equal(d.size, 10);
    assert_int_equal(sqlite3_exec(reader, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(reader);
    put_flat(r, "after", 4); /* its checkpoint folds everything in */
    struct stat sb;
    assert_int_equal(stat(wal, &sb), 0);
    assert_int_equal(sb.st_size, 0);
    assert_int_equal(access(pending, F_OK), -1); /* "during" was named there until then */
    pd_registry_close(r);
}

/* Another process writing to the registry (sqlite3 in a transaction) holds its lock: a put waits registry_busy_ms
 * for it, then fails with PD_EBUSY saying so, and stores nothing. */
static void test_writer_holding_the_lock(void **state)
{
    (void)state;
    char path[128], err[256] = "";
    snprintf(path, sizeof path, "%s/registry.db", dir);
    pd_registry *r;
    assert_int_equal(pd_registry_open_with(dir, 0, 300, &r, err, sizeof err), 0);
    pd_dataset d;
    int created;
    sqlite3 *writer;
    assert_int_equal(sqlite3_open_v2(path, &writer, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(writer, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    double t0 = test_now_s();
    assert_int_equal(pd_registry_put(r, "waits", 5, &d, &created, err, sizeof err), PD_EBUSY);
    double took = test_now_s() - t0;
    print_message("a put beside a writer holding the lock: %.3f s (%s)\n", took, err);
    assert_true(took >= 0.25 && took < 3); /* its 300 ms, not the default 5 s */
    assert_non_null(strstr(err, "locked"));
    assert_int_equal(pd_registry_get(r, "waits", &d), PD_ENOTFOUND);
    assert_int_equal(sqlite3_exec(writer, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(writer);
    assert_int_equal(pd_registry_put(r, "waits", 5, &d, &created, err, sizeof err), 0);
    pd_registry_close(r);
}

/* Another process reading the registry (a backup, sqlite3 on a live state directory) holds the WAL: a put's
 * checkpoint cannot finish. The put must not wait for it (each used to wait SQLite's 5 s busy timeout): it is
 * acknowledged at once, durable in the WAL, named in registry.db-pending, and folded in by the first commit
 * after the reader is gone. */
static void test_reader_holding_the_wal(void **state)
{
    (void)state;
    char path[128], pending[128], err[256] = "";
    snprintf(path, sizeof path, "%s/registry.db", dir);
    snprintf(pending, sizeof pending, "%s/registry.db-pending", dir);
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    put_flat(r, "first", 3);
    sqlite3 *reader = open_reader(path, 1);

    double t0 = test_now_s();
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "during%d", i);
        assert_int_equal(pd_registry_put(r, name, 10 + (uint64_t)i, &d, &created, err, sizeof err), 0);
    }
    double took = test_now_s() - t0;
    print_message("3 puts beside a reader holding the WAL: %.3f s\n", took);
    assert_true(took < 2.5); /* not one busy timeout (5 s), let alone three */
    assert_int_equal(pd_registry_checkpoint_failures(r), 3);
    assert_int_equal(access(pending, F_OK), 0);

    assert_int_equal(sqlite3_exec(reader, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(reader);
    put_flat(r, "after", 4);
    assert_int_equal(access(pending, F_OK), -1); /* folded in */
    assert_int_equal(pd_registry_checkpoint_failures(r), 3);
    pd_registry_close(r);
    r = open_reg();
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "during%d", i);
        assert_int_equal(pd_registry_get(r, name, &d), 0);
        assert_int_equal(d.size, 10 + (uint64_t)i);
    }
    pd_registry_close(r);
}

/* A row whose name no request can carry is skipped, logged, and does not stand in for another: a BLOB
 * 'ds1\0evil' loaded as "ds1" (a second ds1, the table out of order, `rm ds1` unable to remove it). */
static void test_unservable_names(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d, *all;
    pd_mixdef *stored;
    size_t n;
    for (const char *const *nm = (const char *const[]){"ds1", "ds2", "zz", NULL}; *nm; nm++)
        put_flat(r, *nm, 100);
    put_flat(r, "comp", 50);
    assert_int_equal(put_one_mixture(r, "mx", "comp", NULL, 0), 0);
    pd_registry_close(r);
    exec_sql("INSERT INTO datasets(name, size, created_ms, window, lanes) VALUES(x'6473310065766976', 777, 1, 0, 0);"
             "INSERT INTO datasets(name, size, created_ms, window, lanes)"
             " VALUES(CAST(x'647332006576696c' AS TEXT), 778, 1, 0, 0);" /* TEXT 'ds2\0evil' */
             "INSERT INTO datasets(name, size, created_ms, window, lanes) VALUES('bad name', 779, 1, 0, 0);"
             "INSERT INTO mixtures(name, def, created_ms) SELECT x'6d78', def, created_ms FROM mixtures;"
             /* a mixture row under a dataset's name (one namespace: no put makes both) */
             "INSERT INTO mixtures(name, def, created_ms) SELECT 'zz', def, created_ms FROM mixtures WHERE name = 'mx';");
    r = open_reg();
    assert_int_equal(pd_registry_skipped(r), 5);
    assert_int_equal(pd_registry_mixture(r, "mx", &stored), 0); /* the TEXT one */
    pd_mixdef_release(stored);
    assert_int_equal(pd_registry_mixture(r, "zz", &stored), PD_ENOTFOUND); /* the dataset keeps the name */
    assert_int_equal(pd_registry_get(r, "zz", &d), 0);
    assert_int_equal(pd_registry_list(r, &all, &n), 0);
    assert_int_equal(n, 4);
    assert_string_equal(all[0].name, "comp");
    assert_string_equal(all[1].name, "ds1");
    assert_int_equal(all[1].size, 100);
    assert_string_equal(all[2].name, "ds2");
    assert_int_equal(all[2].size, 100);
    assert_string_equal(all[3].name, "zz");
    free(all);
    assert_int_equal(pd_registry_delete(r, "ds1", NULL, 0), 0);
    assert_int_equal(pd_registry_get(r, "ds1", &d), PD_ENOTFOUND);
    pd_registry_close(r);
    char v[64];
    query_in(dir, "SELECT count(*) FROM datasets WHERE hex(name) = '6473310065766976'", v, sizeof v);
    assert_string_equal(v, "1"); /* kept on disk for the operator; the documented DELETE removes it */
    exec_sql("DELETE FROM datasets WHERE hex(name) = '6473310065766976';");
    r = open_reg();
    assert_int_equal(pd_registry_skipped(r), 4);
    pd_registry_close(r);
}

/* Rows without a checksum (an older permd's) are checked for their stored types and ranges: SQLite coerced
 * size '12abc' to 12, 5.9 to 5, and lanes 4294967297 went to 1 through the uint32. */
static void test_stored_types(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    static const char *const names[] = {"a", "b", "c", "e", "f", "g", "ok"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        put_flat(r, names[i], 100);
    for (const char *const *nm = (const char *const[]){"s0", "s1", "s2", NULL}; *nm; nm++)
        put_small_sharded(r, *nm);
    pd_registry_close(r);
    exec_sql("UPDATE datasets SET sum = NULL;"
             "UPDATE datasets SET size = '12abc' WHERE name = 'a';"
             "UPDATE datasets SET size = 5.9 WHERE name = 'b';"
             "UPDATE datasets SET created_ms = 'yesterday' WHERE name = 'c';"
             "UPDATE datasets SET size = -5 WHERE name = 'e';"                  /* 2^64 - 5: beyond 2^63 */
             "UPDATE datasets SET window = 'x' WHERE name = 'f';"
             "UPDATE datasets SET sum = 'abc' WHERE name = 'g';"
             "UPDATE datasets SET lanes = 4294967297 WHERE name = 's0';"
             "UPDATE datasets SET window = 0 WHERE name = 's1';");
    r = open_reg();
    for (const char *const *nm = (const char *const[]){"a", "b", "c", "e", "f", "g", "s0", "s1", NULL}; *nm; nm++)
        if (pd_registry_get(r, *nm, &d) != PD_ENOTFOUND)
            fail_msg("row %s loaded (size %llu)", *nm, (unsigned long long)d.size);
    assert_int_equal(pd_registry_skipped(r), 8);
    assert_int_equal(pd_registry_get(r, "ok", &d), 0); /* the negative control: an older row that is fine */
    assert_int_equal(d.size, 100);
    assert_int_equal(pd_registry_get(r, "s2", &d), 0);
    assert_int_equal(d.lanes, 1);
    assert_int_equal(pd_registry_put(r, "a", 12, &d, &created, NULL, 0), 0); /* the name is usable */
    assert_int_equal(created, 1);
    pd_registry_close(r);
}

/* layout_memory bounds every stored layout still alive, not only the table's: a deleted dataset's layout that a
 * plan or stream still holds was uncounted, so put / stream / delete / put grew past it. */
static void test_layout_accounting(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    uint64_t a_sizes[1000], b_sizes[1000];
    for (int i = 0; i < 1000; i++) {
        a_sizes[i] = 10;
        b_sizes[i] = 11;
    }
    pd_layout *a, *b, *held;
    assert_int_equal(pd_layout_create(a_sizes, 1000, &a), 0);
    assert_int_equal(pd_layout_create(b_sizes, 1000, &b), 0);
    assert_int_equal(pd_registry_layout_bytes(r), 0);
    assert_int_equal(pd_registry_put_sharded(r, "sh", a, 8, 1, &d, &created, NULL, 0), 0);
    pd_layout_release(a); /* the upload's reference: the table holds its own */
    uint64_t one = pd_registry_layout_bytes(r);
    assert_true(one >= 1001 * 8);
    pd_registry_set_layout_limit(r, 2 * one - 1); /* room for one layout, not two */
    assert_int_equal(pd_registry_layout(r, "sh", &held), 0); /* as a plan or a stream holds it */
    assert_int_equal(pd_registry_delete(r, "sh", NULL, 0), 0);
    assert_int_equal(pd_registry_layout_bytes(r), one); /* deleted, still alive, still counted */
    char err[256] = "";
    assert_int_equal(pd_registry_put_sharded(r, "sh", b, 8, 1, &d, &created, err, sizeof err), PD_ETOOBIG);
    assert_non_null(strstr(err, "layout_memory"));
    pd_layout_release(held); /* the stream ends */
    assert_int_equal(pd_registry_layout_bytes(r), 0);
    assert_int_equal(pd_registry_put_sharded(r, "sh", b, 8, 1, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_layout_bytes(r), one);
    pd_layout_release(b);
    pd_registry_close(r);
    r = open_reg(); /* the closed table's references went with it: only the reloaded layout counts */
    assert_int_equal(pd_registry_layout_bytes(r), one);
    pd_registry_close(r);
}

typedef struct {
    pd_registry *r;
    int t;
    int errors;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    for (int i = 0; i < 50; i++) {
        char name[32];
        pd_dataset d;
        int created;
        snprintf(name, sizeof name, "ds%d", i);
        /* every thread races to create the same names with the same sizes */
        if (pd_registry_put(a->r, name, (uint64_t)i + 1, &d, &created, NULL, 0) || d.size != (uint64_t)i + 1)
            a->errors++;
        if (pd_registry_get(a->r, name, &d) || d.size != (uint64_t)i + 1)
            a->errors++;
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pthread_t th[4];
    worker_arg args[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (worker_arg){r, t, 0};
        pthread_create(&th[t], NULL, worker, &args[t]);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(args[t].errors, 0);
    }
    assert_int_equal(pd_registry_count(r), 50);
    pd_registry_close(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_get_list_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_survives_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_datasets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_sqlite_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_row_checksums, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_dir_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_damaged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk, setup, teardown_full),
        cmocka_unit_test_setup_teardown(test_lost_wal_is_noticed, setup, teardown_full),
        cmocka_unit_test_setup_teardown(test_lost_wal_after_reput, setup, teardown_full),
        cmocka_unit_test_setup_teardown(test_lost_wal_after_mixture_delete, setup, teardown_full),
        cmocka_unit_test_setup_teardown(test_lost_wal_after_several_commits, setup, teardown_full),
        cmocka_unit_test_setup_teardown(test_mixture_over_a_dropped_config_dataset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_on_a_full_disk, setup, teardown_full),
        cmocka_unit_test_setup_teardown(test_first_start_on_a_full_disk, setup, teardown_full),
        cmocka_unit_test_setup_teardown(test_pending_not_a_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_holding_the_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_holding_the_wal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_at_startup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreadable_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_at_startup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unservable_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stored_types, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layout_accounting, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
