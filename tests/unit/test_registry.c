/* Tests for daemon/registry.c: put/get/list/delete, conflicts, persistence, config datasets, threads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    assert_int_equal(pd_registry_put(r, "cfg", 7, &d, &created, NULL, 0), 0);
    assert_int_equal(created, 0);
    assert_int_equal(pd_registry_put(r, "cfg", 9, &d, &created, NULL, 0), PD_ECONFLICT);
    assert_int_equal(pd_registry_delete(r, "cfg", NULL, 0), PD_ECONFLICT);
    assert_int_equal(pd_registry_delete(r, "stored", NULL, 0), PD_ECONFLICT);
    pd_registry_close(r);

    r = open_reg(); /* config datasets are not stored */
    assert_int_equal(pd_registry_get(r, "cfg", &d), PD_ENOTFOUND);
    assert_int_equal(pd_registry_declare(r, "stored", 101, NULL, 0), PD_ECONFLICT);
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

static void exec_sql(const char *sql)
{
    char path[128];
    sqlite3 *db;
    snprintf(path, sizeof path, "%s/registry.db", dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
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
    pd_layout *layout;
    uint64_t sizes[3] = {5, 0, 7};
    assert_int_equal(pd_layout_create(sizes, 3, &layout), 0);
    int created;
    assert_int_equal(pd_registry_put_sharded(r, "new", layout, 2, 1, &d, &created, NULL, 0), 0);
    pd_layout_release(layout);
    pd_registry_close(r);
    r = open_reg(); /* migrated once; opens again as schema 2 */
    assert_int_equal(pd_registry_count(r), 2);
    pd_registry_close(r);

    exec_sql("PRAGMA user_version=99;");
    char err[256] = "";
    assert_int_equal(pd_registry_open(dir, &r, err, sizeof err), PD_EUNSUPPORTED);
    assert_non_null(strstr(err, "schema 99"));
    exec_sql("PRAGMA user_version=2;");
    r = open_reg();
    assert_int_equal(pd_registry_count(r), 2);
    pd_registry_close(r);
}

/* A value changed on disk behind permd's back (SQLite checks pages, not values): the row's checksum no longer
 * matches, and the dataset or mixture is not served, where it would have given other ids. A row from before
 * checksums (NULL) still loads: the negative control. */
static void test_row_checksums(void **state)
{
    (void)state;
    pd_registry *r = open_reg();
    pd_dataset d;
    int created;
    assert_int_equal(pd_registry_put(r, "flat", 100, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_put(r, "older", 100, &d, &created, NULL, 0), 0);
    assert_int_equal(pd_registry_put(r, "comp", 50, &d, &created, NULL, 0), 0);
    pd_layout *layout;
    uint64_t sizes[3] = {5, 0, 7};
    assert_int_equal(pd_layout_create(sizes, 3, &layout), 0);
    assert_int_equal(pd_registry_put_sharded(r, "sharded", layout, 2, 1, &d, &created, NULL, 0), 0);
    pd_layout_release(layout);
    pd_mixdef *def, *stored;
    assert_int_equal(pd_mixdef_alloc("mx", 1, 1, &def), 0);
    strcpy(def->comp[0].name, "comp");
    def->weights[0] = 1;
    assert_int_equal(pd_registry_put_mixture(r, def, &stored, &created, NULL, 0), 0);
    pd_mixdef_release(stored);
    pd_mixdef_release(def);
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
        cmocka_unit_test_setup_teardown(test_row_checksums, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
