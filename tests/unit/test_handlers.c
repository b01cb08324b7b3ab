/* Tests for the service layer (session, dispatch, handlers) over a memory connection: no socket, no listener. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>
#include <uv.h>

#include "test_util.h"

#include "core/error.h"
#include "core/name.h"
#include "core/rank.h"
#include "core/shards.h"
#include "daemon/backend.h"
#include "daemon/conn.h"
#include "daemon/groups.h"
#include "daemon/log.h"
#include "daemon/plans.h"
#include "daemon/readahead.h"
#include "daemon/registry.h"
#include "daemon/reqtype.h"
#include "daemon/service.h"
#include "daemon/session.h"
#include "daemon/stats.h"
#include "daemon/target.h"
#include "proto/frame.h"

/* One daemon's worth of service state on one loop, and one client on a memory connection. */
typedef struct fixture {
    char dir[64];
    uv_loop_t loop;
    pd_config cfg;
    pd_service svc;
    pd_loop sl;
    pd_conns *conns;
    pd_registry *reg;
    pd_plans *plans;
    pd_backend *backend;
    pd_groups *groups;
    pd_access access; /* no allow_uids; a token when a test sets one */
    pd_conn *conn;
    uint8_t *out; /* what permd sent, not yet taken by next_reply */
    size_t out_len, out_cap;
    int freed;    /* the session's connection is gone */
} fixture;

static void sink(void *ctx, const uint8_t *data, size_t len)
{
    fixture *f = ctx;
    if (f->out_len + len > f->out_cap) {
        f->out_cap = (f->out_len + len) * 2;
        f->out = realloc(f->out, f->out_cap);
        assert_non_null(f->out);
    }
    memcpy(f->out + f->out_len, data, len);
    f->out_len += len;
}

static void totals(void *ctx, pd_stats_view *v)
{
    fixture *f = ctx;
    memset(v, 0, sizeof *v);
    pd_stats_add(&v->stats, &f->sl.stats);
    pd_metrics_add(&v->metrics, &f->sl.metrics);
}

static void set(fixture *f, const char *key, const char *value)
{
    char err[256];
    if (pd_config_set(&f->cfg, key, value, err, sizeof err))
        fail_msg("config %s: %s", key, err);
}

static int setup_with(void **state, const char *inline_ids)
{
    fixture *f = calloc(1, sizeof *f);
    char err[256];
    assert_non_null(f);
    strcpy(f->dir, "/tmp/permd-test-handlers-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    assert_int_equal(uv_loop_init(&f->loop), 0);
    assert_int_equal(pd_config_init(&f->cfg), 0);
    set(f, "inline_ids", inline_ids);
    set(f, "max_count", "100000");
    if (pd_registry_open(f->dir, &f->reg, err, sizeof err))
        fail_msg("registry: %s", err);
    pd_backend_opts bo = {.cpu_isa = "auto", .cpu_threads = 1, .gpu = "off"};
    assert_int_equal(pd_backend_open(&bo, &f->backend), 0);
    assert_int_equal(pd_plans_open(4, UINT64_C(1) << 30, pd_backend_gen(f->backend), &f->plans), 0);
    assert_int_equal(pd_groups_open(&f->cfg, &f->groups), 0);
    f->svc.cfg = &f->cfg;
    f->svc.reg = f->reg;
    f->svc.plans = f->plans;
    f->svc.backend = f->backend;
    f->svc.groups = f->groups;
    atomic_store(&f->svc.access, &f->access);
    f->svc.workers = 2;
    f->svc.totals = totals;
    f->svc.totals_ctx = f;
    pd_loop_init(&f->sl, &f->svc, &f->loop, 0);
    pd_conn_limits lim = {.output_cap = f->cfg.output_cap, .max_frame = (uint32_t)f->cfg.max_frame};
    assert_int_equal(pd_conns_create(&f->loop, &lim, &f->sl.stats, &f->sl.metrics, NULL, NULL, &f->conns), 0);
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, "65536");
}

static int setup_no_inline(void **state)
{
    return setup_with(state, "0"); /* every generation goes to the worker pool */
}

/* Connect the client: is_tcp with a token makes it an unauthenticated TCP peer. */
static void connect_client(fixture *f, int is_tcp)
{
    assert_int_equal(pd_conn_open_memory(f->conns, is_tcp, sink, f, &f->conn), 0);
    assert_true(pd_session_admit(&f->svc, is_tcp));
    pd_session_open(&f->sl, f->conn, 1);
}

static int teardown(void **state)
{
    fixture *f = *state;
    pd_conns_close_all(f->conns);
    pd_loop_close(&f->sl);
    uv_run(&f->loop, UV_RUN_DEFAULT); /* jobs finish, handles close, the session is freed */
    assert_int_equal(uv_loop_close(&f->loop), 0);
    assert_int_equal(atomic_load(&f->svc.conns_open[0]) + atomic_load(&f->svc.conns_open[1]), 0);
    pd_conns_free(f->conns);
    pd_groups_close(f->groups);
    pd_plans_close(f->plans);
    pd_backend_close(f->backend);
    pd_registry_close(f->reg);
    pd_config_free(&f->cfg);
    free(f->out);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f);
    return 0;
}

/* Send one request as the client would. */
static void send_env(fixture *f, pd_envelope *env)
{
    size_t n = pd_frame_size(env);
    uint8_t *buf = malloc(n);
    assert_non_null(buf);
    pd_frame_pack(env, buf);
    pd_conn_input(f->conn, buf, n);
    free(buf);
}

/* The next reply permd sent, or NULL when none is complete yet (without running the loop). */
static pd_envelope *take_reply(fixture *f)
{
    if (f->out_len < 4)
        return NULL;
    uint32_t len = pd_load_le32(f->out);
    if (f->out_len < 4 + (size_t)len)
        return NULL;
    pd_envelope *env;
    assert_int_equal(pd_frame_unpack(f->out + 4, len, NULL, &env), 0);
    memmove(f->out, f->out + 4 + len, f->out_len - 4 - len);
    f->out_len -= 4 + len;
    return env;
}

/* The next reply, running the loop (worker-pool jobs) until it comes. */
static pd_envelope *next_reply(fixture *f)
{
    for (int i = 0; i < 100000; i++) {
        pd_envelope *env = take_reply(f);
        if (env)
            return env;
        uv_run(&f->loop, UV_RUN_ONCE);
    }
    fail_msg("no reply");
    return NULL;
}

static void free_env(pd_envelope *env)
{
    protobuf_c_message_free_unpacked(&env->base, NULL);
}

/* The next reply, running the loop until it comes: request id's, of kind body_case. The caller frees it. */
static pd_envelope *expect_reply(fixture *f, uint64_t id, Permd__V1__Envelope__BodyCase body_case)
{
    pd_envelope *r = next_reply(f);
    assert_int_equal(r->id, id);
    assert_int_equal(r->body_case, body_case);
    return r;
}

/* A reply's n u32 ids (its bytes must be exactly those) into ids. */
static void load_ids(const ProtobufCBinaryData *bytes, uint32_t *ids, unsigned n)
{
    assert_int_equal(bytes->len, 4 * (size_t)n);
    for (unsigned i = 0; i < n; i++)
        ids[i] = pd_load_le32(bytes->data + 4 * i);
}

/* The next reply is request id's Error of code, its message naming words (NULL: not checked). */
static void expect_error(fixture *f, uint64_t id, unsigned code, const char *words)
{
    pd_envelope *r = expect_reply(f, id, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(r->error->code, code);
    if (words && !strstr(r->error->message, words))
        fail_msg("error '%s' does not name %s", r->error->message, words);
    free_env(r);
}

static void put_dataset(fixture *f, const char *name, uint64_t size)
{
    Permd__V1__PutDataset m = PERMD__V1__PUT_DATASET__INIT;
    m.name = (char *)name;
    m.size = size;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_PUT_DATASET;
    env.put_dataset = &m;
    send_env(f, &env);
}

static void test_put_and_get(void **state)
{
    fixture *f = *state;
    connect_client(f, 0);
    put_dataset(f, "imagenet", 1281167);
    /* The commit runs on the pool: no reply until the loop runs it, and the connection waits. */
    assert_null(take_reply(f));
    assert_int_equal(pd_conns_jobs(f->conns), 1);
    pd_envelope *r = expect_reply(f, 1, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    assert_true(r->dataset_reply->created);
    assert_string_equal(r->dataset_reply->dataset->name, "imagenet");
    assert_int_equal(r->dataset_reply->dataset->size, 1281167);
    free_env(r);
    pd_dataset d;
    assert_int_equal(pd_registry_get(f->reg, "imagenet", &d), 0); /* stored */

    Permd__V1__GetDataset g = PERMD__V1__GET_DATASET__INIT;
    g.name = "imagenet";
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 2;
    env.body_case = PERMD__V1__ENVELOPE__BODY_GET_DATASET;
    env.get_dataset = &g;
    send_env(f, &env);
    r = take_reply(f); /* answered from memory, inline */
    assert_non_null(r);
    assert_int_equal(r->id, 2);
    assert_int_equal(r->dataset_reply->dataset->size, 1281167);
    assert_false(r->dataset_reply->created);
    free_env(r);

    /* A bad name is refused with a typed error and stores nothing. */
    put_dataset(f, "../etc", 5);
    r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(r->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    free_env(r);
    assert_int_equal(pd_registry_count(f->reg), 1);
}

/* A registry another process holds locked (a maintenance transaction past SQLite's 5 s busy timeout) fails a put
 * that may well work a moment later: OVERLOADED (retry), naming the lock, not INTERNAL. */
static void test_put_on_locked_registry(void **state)
{
    fixture *f = *state;
    char path[160];
    sqlite3 *db;
    snprintf(path, sizeof path, "%s/registry.db", f->dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN EXCLUSIVE;", NULL, NULL, NULL), SQLITE_OK);
    connect_client(f, 0);
    put_dataset(f, "imagenet", 1281167);
    expect_error(f, 1, PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED, "locked by another process");
    assert_int_equal(sqlite3_exec(db, "ROLLBACK;", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    put_dataset(f, "imagenet", 1281167); /* the lock gone, the same put works */
    pd_envelope *r = next_reply(f);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    assert_true(r->dataset_reply->created);
    free_env(r);
}

/* A Fetch of count ids of slice sl, as request id. */
static void send_fetch_slice(fixture *f, uint64_t id, Permd__V1__Slice *sl, uint64_t count)
{
    Permd__V1__Fetch m = PERMD__V1__FETCH__INIT;
    m.slice = sl;
    m.count = count;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_FETCH;
    env.fetch = &m;
    send_env(f, &env);
}

/* A Stream of slice sl in batches of batch ids with credits credits (max_count 0: all), as request id. */
static void send_stream_slice(fixture *f, uint64_t id, Permd__V1__Slice *sl, uint32_t batch, uint32_t credits,
                              uint64_t max_count)
{
    Permd__V1__Stream m = PERMD__V1__STREAM__INIT;
    m.slice = sl;
    m.batch = batch;
    m.credits = credits;
    m.max_count = max_count;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STREAM;
    env.stream = &m;
    send_env(f, &env);
}

/* Rank `rank` of `world` of name's epoch 3 under seed 42, exact mode, from offset: what send_fetch asks. */
static Permd__V1__Slice exact_slice(const char *name, uint32_t world, uint32_t rank, uint64_t offset)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = (char *)name;
    sl.seed = 42;
    sl.epoch = 3;
    sl.world = world;
    sl.rank = rank;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    sl.offset = offset;
    return sl;
}

static void send_fetch(fixture *f, uint64_t id, const char *name, uint32_t world, uint32_t rank, uint64_t offset,
                       uint64_t count)
{
    Permd__V1__Slice sl = exact_slice(name, world, rank, offset);
    send_fetch_slice(f, id, &sl, count);
}

/* The ids of a FetchReply equal the core's for the same slice. */
static void check_fetch(const pd_envelope *r, uint64_t n, uint32_t world, uint32_t rank, uint64_t offset,
                        uint64_t count)
{
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
    const Permd__V1__FetchReply *fr = r->fetch_reply;
    assert_int_equal(fr->id_width, 4);
    assert_int_equal(fr->count, count);
    assert_int_equal(fr->ids.len, count * 4);
    pd_perm p;
    pd_perm_init(&p, 42, 3, PD_STREAM_SAMPLES, n);
    pd_slice s = {.world = world, .rank = rank, .mode = PD_MODE_EXACT, .offset = offset};
    uint32_t *want = malloc(count * 4);
    uint64_t got;
    assert_int_equal(pd_slice_fill_u32(&p, &s, count, want, &got), 0);
    assert_int_equal(got, count);
    for (uint64_t i = 0; i < count; i++)
        assert_int_equal(pd_load_le32(fr->ids.data + 4 * i), want[i]);
    assert_int_equal(fr->next_offset, offset + count * world);
    free(want);
}

static void test_fetch_inline(void **state)
{
    fixture *f = *state;
    connect_client(f, 0);
    put_dataset(f, "d", 100000);
    free_env(next_reply(f));
    send_fetch(f, 7, "d", 8, 5, 24, 1000);
    /* Within the loop's inline budget: answered before the loop runs again, no job. */
    assert_int_equal(pd_conns_jobs(f->conns), 0);
    pd_envelope *r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->id, 7);
    check_fetch(r, 100000, 8, 5, 24, 1000);
    free_env(r);
    assert_int_equal(f->sl.stats.ids_served_total, 1000);
}

static void test_fetch_pool(void **state)
{
    fixture *f = *state;
    connect_client(f, 0);
    put_dataset(f, "d", 100000);
    free_env(next_reply(f));
    send_fetch(f, 8, "d", 3, 2, 0, 20000);
    send_fetch(f, 9, "d", 3, 2, 60000, 10); /* read only after the first is answered: replies keep their order */
    assert_null(take_reply(f));
    assert_int_equal(pd_conns_jobs(f->conns), 1);
    pd_envelope *r = next_reply(f);
    assert_int_equal(r->id, 8);
    check_fetch(r, 100000, 3, 2, 0, 20000);
    free_env(r);
    r = next_reply(f);
    assert_int_equal(r->id, 9);
    check_fetch(r, 100000, 3, 2, 60000, 10);
    free_env(r);
    /* Errors of a Fetch: a dataset that does not exist, a count above max_count. */
    send_fetch(f, 10, "nope", 1, 0, 0, 1);
    r = next_reply(f);
    assert_int_equal(r->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND);
    free_env(r);
    send_fetch(f, 11, "d", 1, 0, 0, 100001);
    r = next_reply(f);
    assert_int_equal(r->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    free_env(r);
}

static void send_credit(fixture *f, uint64_t id, uint32_t credits)
{
    Permd__V1__Credit m = PERMD__V1__CREDIT__INIT;
    m.credits = credits;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_CREDIT;
    env.credit = &m;
    send_env(f, &env);
}

/* Batches until none is pending without running the loop; each must continue the last. */
static unsigned take_batches(fixture *f, uint64_t *offset, uint64_t *seq)
{
    unsigned n = 0;
    pd_envelope *r;
    while ((r = take_reply(f))) {
        assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
        assert_int_equal(r->stream_batch->seq, *seq);
        assert_int_equal(r->stream_batch->count, 10);
        *seq += 1;
        *offset += 10 * 4;
        assert_int_equal(r->stream_batch->next_offset, *offset);
        free_env(r);
        n++;
    }
    return n;
}

static void test_stream_credits(void **state)
{
    fixture *f = *state;
    connect_client(f, 0);
    put_dataset(f, "d", 1000);
    free_env(next_reply(f));
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "d";
    sl.world = 4;
    sl.rank = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    send_stream_slice(f, 5, &sl, 10, 2, 50);
    uint64_t offset = 0, seq = 0;
    assert_int_equal(take_batches(f, &offset, &seq), 2); /* two credits: two batches, then it waits */
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(take_batches(f, &offset, &seq), 0);
    send_credit(f, 5, 1);
    assert_int_equal(take_batches(f, &offset, &seq), 1);
    send_credit(f, 5, 5); /* more than it needs: the last two batches, then StreamEnd */
    pd_envelope *r;
    for (uint64_t k = 3; k < 5; k++) {
        r = next_reply(f);
        assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
        assert_int_equal(r->stream_batch->seq, k);
        free_env(r);
    }
    r = next_reply(f);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_END);
    assert_int_equal(r->stream_end->reason, PERMD__V1__END_REASON__END_REASON_COMPLETE);
    assert_int_equal(r->stream_end->delivered, 50);
    assert_int_equal(r->stream_end->next_offset, 200);
    free_env(r);
    assert_int_equal(f->sl.stats.streams_active, 0);
    send_credit(f, 5, 1); /* a Credit for an ended stream is ignored */
    assert_null(take_reply(f));
}

static void test_auth_refusal(void **state)
{
    fixture *f = *state;
    f->access.token = "s3cret";
    f->access.token_len = 6;
    connect_client(f, 1); /* a TCP peer: must say Hello with the token first */
    put_dataset(f, "d", 10);
    pd_envelope *r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(r->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED);
    free_env(r);
    assert_false(pd_conn_open(f->conn)); /* draining: nothing more is read */
    put_dataset(f, "e", 10);
    assert_null(take_reply(f));
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(pd_registry_count(f->reg), 0);

    /* A wrong token is refused too; the right one lets requests through. */
    connect_client(f, 1);
    Permd__V1__Hello h = PERMD__V1__HELLO__INIT;
    h.token = "wrong";
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    send_env(f, &env);
    r = take_reply(f);
    assert_int_equal(r->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED);
    free_env(r);
    connect_client(f, 1);
    h.token = "s3cret";
    send_env(f, &env);
    r = take_reply(f);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_HELLO_REPLY);
    free_env(r);
    put_dataset(f, "d", 10);
    r = next_reply(f);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    free_env(r);
}

static uint64_t fake_ms;

static uint64_t fake_clock(void)
{
    return fake_ms;
}

/* One TCP peer's Hello with a wrong token: refused, and the connection drained. */
static void wrong_hello(fixture *f)
{
    connect_client(f, 1);
    Permd__V1__Hello h = PERMD__V1__HELLO__INIT;
    h.token = "guess";
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    send_env(f, &env);
    pd_envelope *r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED);
    free_env(r);
}

static size_t count_of(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* A burst of wrong tokens writes peer_log_rate auth_fail lines a second, then one line with the count
 * of the others (and counts them for permd_log_suppressed_total): a peer guessing as fast as it can
 * connect cannot fill the log. The limiter's clock is a fake one here: no timing. */
static void test_auth_fail_log_bounded(void **state)
{
    fixture *f = *state;
    f->access.token = "s3cret";
    f->access.token_len = 6;
    pd_log_set_peer_clock(fake_clock);
    pd_log_set_peer_rate(5);
    fake_ms = 1000000;
    FILE *log = tmpfile();
    assert_non_null(log);
    int saved = dup(STDERR_FILENO);
    dup2(fileno(log), STDERR_FILENO);
    for (int i = 0; i < 25; i++)
        wrong_hello(f);
    fake_ms += 1000; /* the next second: the summary, then the line */
    wrong_hello(f);
    dup2(saved, STDERR_FILENO);
    close(saved);
    long n = ftell(log);
    char *text = calloc(1, (size_t)n + 1);
    assert_non_null(text);
    rewind(log);
    assert_int_equal(fread(text, 1, (size_t)n, log), (size_t)n);
    fclose(log);
    assert_int_equal(count_of(text, "event=auth_fail "), 6);
    assert_int_equal(count_of(text, "event=log_suppressed of=auth_fail lines=20 "), 1);
    const char *last = text;
    for (const char *p = text; (p = strstr(p, "event=auth_fail ")); p++)
        last = p;
    assert_true(strstr(text, "event=log_suppressed") < last); /* the summary comes before the next line */
    free(text);
    pd_log_suppressed sup[PD_LOG_PEER_EVENTS];
    size_t k = pd_log_peer_suppressed(sup, PD_LOG_PEER_EVENTS);
    uint64_t lines = 0;
    for (size_t i = 0; i < k; i++)
        if (!strcmp(sup[i].event, "auth_fail"))
            lines = sup[i].lines;
    assert_int_equal(lines, 20);
    /* Every refusal is still counted where it always was. */
    const int hello = pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_HELLO);
    assert_int_equal(f->sl.metrics.errors[hello][PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED], 26);
    pd_log_set_peer_clock(NULL);
    pd_log_set_peer_rate(10);
}

/* Send a payload as one frame, written by hand (fields protobuf-c would not pack: unknown ones). */
static void send_raw(fixture *f, const uint8_t *payload, size_t len)
{
    uint8_t *buf = malloc(4 + len);
    assert_non_null(buf);
    pd_store_le32(buf, (uint32_t)len);
    memcpy(buf + 4, payload, len);
    pd_conn_input(f->conn, buf, 4 + len);
    free(buf);
}

/* Envelope{id, stats: Stats{field 99 = 0, n times}}: a valid Stats whose unknown fields each cost
 * protobuf-c tens of bytes decoded, for 3 on the wire. */
static void send_stats_with_unknown_fields(fixture *f, uint8_t id, size_t n)
{
    size_t body = 3 * n, len = 2 + 2 + 3 + body;
    uint8_t *p = malloc(len), *q = p;
    assert_non_null(p);
    *q++ = 0x08; /* field 1, varint: the id */
    *q++ = id;
    *q++ = 0xa2; /* field 20 (stats), length-delimited */
    *q++ = 0x01;
    *q++ = (uint8_t)(0x80 | (body & 0x7f)); /* the body's length, 3 bytes of varint */
    *q++ = (uint8_t)(0x80 | ((body >> 7) & 0x7f));
    *q++ = (uint8_t)(body >> 14);
    for (size_t i = 0; i < n; i++) {
        *q++ = 0x98; /* field 99, varint */
        *q++ = 0x06;
        *q++ = 0x00;
    }
    assert_true(body < (1u << 21));
    send_raw(f, p, len);
    free(p);
}

static void send_stats(fixture *f, uint64_t id)
{
    Permd__V1__Stats m = PERMD__V1__STATS__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
    env.stats = &m;
    send_env(f, &env);
}

/* A request's decoded form (beyond the session's fixed arena) is let go once it is answered, not kept
 * until the connection's next frame: an idle connection holds none of it. */
static void test_request_memory_released(void **state)
{
    fixture *f = *state;
    connect_client(f, 0);
    send_stats_with_unknown_fields(f, 3, 20000); /* 60 KB that decode to about a megabyte */
    pd_envelope *r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->id, 3);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
    free_env(r);
    assert_int_equal(atomic_load(&f->sl.stats.request_memory), 0); /* the connection now idles */
}

/* A request that decodes to more than max_request_memory is refused with TOO_LARGE under its id; the
 * connection stays open and its next request is served. */
static void test_request_memory_limit(void **state)
{
    fixture *f = *state;
    set(f, "max_request_memory", "65536");
    connect_client(f, 0);
    send_stats_with_unknown_fields(f, 4, 20000);
    pd_envelope *r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->id, 4);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(r->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    assert_non_null(strstr(r->error->message, "max_request_memory"));
    free_env(r);
    assert_true(pd_conn_open(f->conn));
    assert_int_equal(atomic_load(&f->sl.stats.request_memory), 0);
    assert_int_equal(f->sl.metrics.errors[PERMD__V1__ENVELOPE__BODY_STATS - PD_REQ_FIELD_FIRST]
                                         [PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE],
                     1); /* counted under its type */
    send_stats_with_unknown_fields(f, 5, 100); /* within the limit */
    r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->id, 5);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
    free_env(r);
    send_stats(f, 6);
    r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_STATS_REPLY);
    free_env(r);
}

/* A PutMixture of one component, "d", with `stages` stages of weight 1 (one every 64 positions): large
 * frames, for tests of the memory a mixture's request and reply take. */
typedef struct one_component_mixture {
    Permd__V1__MixtureStage *st, **stp;
    uint32_t one;
    char *comps[1];
    Permd__V1__Mixture mix;
    Permd__V1__PutMixture put;
} one_component_mixture;

/* m must stay where it is until mixture_free (its messages point into it). */
static void mixture_init(one_component_mixture *m, unsigned stages, const char *name)
{
    m->st = calloc(stages, sizeof *m->st);
    m->stp = calloc(stages, sizeof *m->stp);
    assert_non_null(m->st);
    assert_non_null(m->stp);
    m->one = 1;
    m->comps[0] = "d";
    for (unsigned k = 0; k < stages; k++) {
        permd__v1__mixture_stage__init(&m->st[k]);
        m->st[k].start = (uint64_t)k * 64;
        m->st[k].n_weights = 1;
        m->st[k].weights = &m->one;
        m->stp[k] = &m->st[k];
    }
    permd__v1__mixture__init(&m->mix);
    m->mix.name = (char *)name;
    m->mix.n_components = 1;
    m->mix.components = m->comps;
    m->mix.n_stages = stages;
    m->mix.stages = m->stp;
    permd__v1__put_mixture__init(&m->put);
    m->put.mixture = &m->mix;
}

static void mixture_free(one_component_mixture *m)
{
    free(m->st);
    free(m->stp);
}

static void send_put_mixture(fixture *f, uint64_t id, one_component_mixture *m)
{
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_PUT_MIXTURE;
    env.put_mixture = &m->put;
    send_env(f, &env);
}

/* PutMixture's reply is built on the loop after its job ran, in the session's arena: it is let go
 * there too. */
static void test_mixture_reply_memory_released(void **state)
{
    fixture *f = *state;
    enum { STAGES = 2000 };
    connect_client(f, 0);
    put_dataset(f, "d", 1000000);
    free_env(next_reply(f));
    one_component_mixture m;
    mixture_init(&m, STAGES, "m");
    send_put_mixture(f, 9, &m);
    pd_envelope *r = expect_reply(f, 9, PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY);
    assert_int_equal(r->mixture_reply->mixture->n_stages, STAGES);
    free_env(r);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(atomic_load(&f->sl.stats.request_memory), 0);
    mixture_free(&m);
}

/* A Fetch the loop would run inline (a flat mixture: its cursors need no order built) whose plan's one cursor is
 * taken meanwhile (here by the test, as by another thread): the loop hands it to a worker, which waits for the
 * cursor, instead of waiting for it itself (it blocked the loop for the other thread's whole generation). */
static void test_inline_mixture_deferred(void **state)
{
    fixture *f = *state;
    connect_client(f, 0);
    put_dataset(f, "d", 1000000);
    free_env(next_reply(f));
    one_component_mixture m;
    mixture_init(&m, 1, "m");
    send_put_mixture(f, 9, &m);
    free_env(expect_reply(f, 9, PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY));
    mixture_free(&m);
    pd_plans_close(f->plans); /* a cache of 1 byte: the mixture's plan alone past it, with one cursor */
    assert_int_equal(pd_plans_open(4, 1, pd_backend_gen(f->backend), &f->plans), 0);
    f->svc.plans = f->plans;
    pd_mixdef *def;
    pd_plan *p;
    pd_mix_cursor *cur;
    char msg[200];
    assert_int_equal(pd_registry_mixture(f->reg, "m", &def), 0);
    assert_int_equal(pd_target_mix_plan(f->reg, f->plans, def, 42, &p, msg, sizeof msg), 0); /* send_fetch's seed */
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);

    send_fetch(f, 20, "m", 4, 1, 0, 100);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(atomic_load(&f->sl.stats.inline_deferred), 1);
    assert_null(take_reply(f)); /* its worker waits for the cursor */
    pd_plan_cursor_give(p, cur);
    pd_envelope *r = expect_reply(f, 20, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
    uint32_t deferred_ids[100], inline_ids[100];
    load_ids(&r->fetch_reply->ids, deferred_ids, 100);
    free_env(r);

    send_fetch(f, 21, "m", 4, 1, 0, 100); /* the cursor idle again: inline, the same ids */
    r = expect_reply(f, 21, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
    load_ids(&r->fetch_reply->ids, inline_ids, 100);
    free_env(r);
    assert_memory_equal(deferred_ids, inline_ids, sizeof inline_ids);
    assert_int_equal(atomic_load(&f->sl.stats.inline_deferred), 1);

    /* A stream's batch the same way: scheduled on a worker, which gets the cursor once it is given back. */
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    Permd__V1__Slice sl = exact_slice("m", 4, 1, 0); /* the Fetches' slice */
    send_stream_slice(f, 22, &sl, 100, 1, 100);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(atomic_load(&f->sl.stats.inline_deferred), 2);
    pd_plan_cursor_give(p, cur);
    r = expect_reply(f, 22, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
    load_ids(&r->stream_batch->ids, deferred_ids, 100);
    free_env(r);
    assert_memory_equal(deferred_ids, inline_ids, sizeof inline_ids);
    free_env(expect_reply(f, 22, PERMD__V1__ENVELOPE__BODY_STREAM_END));

    /* And an Inverse of those ids (one component as long as the mixture: component epoch 3 is mixture epoch 3):
     * on a worker, each at its position 1 + 4k. */
    assert_int_equal(pd_plan_cursor_take(p, &cur), 0);
    uint8_t samples[4 * 100];
    uint64_t comp_epochs[100];
    for (unsigned i = 0; i < 100; i++) {
        pd_store_le32(samples + 4 * i, inline_ids[i]);
        comp_epochs[i] = 3;
    }
    Permd__V1__Inverse inv = PERMD__V1__INVERSE__INIT;
    inv.dataset = "m";
    inv.seed = 42;
    inv.world = 4;
    inv.samples.data = samples;
    inv.samples.len = sizeof samples;
    inv.n_component_epochs = 100;
    inv.component_epochs = comp_epochs;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 23;
    env.body_case = PERMD__V1__ENVELOPE__BODY_INVERSE;
    env.inverse = &inv;
    send_env(f, &env);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(atomic_load(&f->sl.stats.inline_deferred), 3);
    pd_plan_cursor_give(p, cur);
    r = expect_reply(f, 23, PERMD__V1__ENVELOPE__BODY_INVERSE_REPLY);
    assert_int_equal(r->inverse_reply->count, 100);
    assert_int_equal(r->inverse_reply->n_epochs, 100);
    for (unsigned i = 0; i < 100; i++) {
        assert_int_equal(r->inverse_reply->epochs[i], 3); /* the Fetches' mixture epoch */
        assert_int_equal(pd_load_le64(r->inverse_reply->positions.data + 8 * i), 1 + 4 * i); /* u64 for a mixture */
    }
    free_env(r);
    pd_plan_release(p);
    pd_mixdef_release(def);
}

/* An Inverse answered by a worker job keeps its request until the job is done, then lets it go; one
 * answered on the loop lets it go when answered. */
static void test_inverse_memory_released(void **state)
{
    fixture *f = *state;
    enum { COUNT = 20000 };
    connect_client(f, 0);
    put_dataset(f, "d", 100000);
    free_env(next_reply(f));
    uint8_t *samples = malloc(4 * COUNT);
    assert_non_null(samples);
    for (uint32_t i = 0; i < COUNT; i++)
        pd_store_le32(samples + 4 * i, i * 5);
    Permd__V1__Inverse m = PERMD__V1__INVERSE__INIT;
    m.dataset = "d";
    m.seed = 42;
    m.epoch = 3;
    m.world = 4;
    m.samples.data = samples;
    m.samples.len = 4 * COUNT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 12;
    env.body_case = PERMD__V1__ENVELOPE__BODY_INVERSE;
    env.inverse = &m;
    send_env(f, &env); /* no inline budget in this fixture: a job */
    assert_int_equal(pd_conns_jobs(f->conns), 1);
    assert_true(atomic_load(&f->sl.stats.request_memory) > 0); /* the job reads it */
    pd_envelope *r = expect_reply(f, 12, PERMD__V1__ENVELOPE__BODY_INVERSE_REPLY);
    assert_int_equal(r->inverse_reply->count, COUNT);
    free_env(r);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(atomic_load(&f->sl.stats.request_memory), 0);
    pd_store_le32(samples, 100000); /* refused on the loop (a sample past the size): let go as well */
    send_env(f, &env);
    r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    free_env(r);
    assert_int_equal(atomic_load(&f->sl.stats.request_memory), 0);
    free(samples);
}

/* ---- Plan memory (daemon/plans.c, daemon/stream.c) ------------------------------------------ */

enum { PLAN_SHARDS = 1000, PLAN_PER_SHARD = 10 };

static pd_layout *plan_layout(void)
{
    uint64_t sizes[PLAN_SHARDS];
    pd_layout *l;
    for (unsigned i = 0; i < PLAN_SHARDS; i++)
        sizes[i] = PLAN_PER_SHARD;
    assert_int_equal(pd_layout_create(sizes, PLAN_SHARDS, &l), 0);
    return l;
}

/* Every plan alive counts against max_bytes, not only those cached: plans in use leave a new one no
 * room (PD_EBUSY), and unused ones give way to it. A plan alone may pass the bound. */
static void test_plans_bounded(void **state)
{
    (void)state;
    const uint64_t size = pd_shard_plan_bytes(PLAN_SHARDS);
    pd_layout *l = plan_layout();
    pd_plans *c;
    pd_plan *p[4], *q;
    const pd_shard_plan *sp;
    assert_int_equal(pd_plans_open(16, 3 * size, NULL, &c), 0);
    for (unsigned i = 0; i < 3; i++) {
        assert_int_equal(pd_plans_get(c, l, 100 + i, 0, 8, 1, &p[i]), 0);
        assert_int_equal(pd_plan_use(p[i], &sp), 0);
    }
    assert_int_equal(pd_plans_bytes(c), 3 * size);
    assert_int_equal(pd_plans_get(c, l, 103, 0, 8, 1, &p[3]), PD_EBUSY); /* all three in use */
    assert_null(p[3]);
    assert_int_equal(pd_plans_get(c, l, 101, 0, 8, 1, &q), 0); /* a cached one is shared, not charged again */
    assert_ptr_equal(q, p[1]);
    pd_plan_release(q);
    assert_int_equal(pd_plans_bytes(c), 3 * size);
    pd_plan_release(p[0]); /* unused now: cached, and the first to give way */
    assert_int_equal(pd_plans_get(c, l, 103, 0, 8, 1, &p[3]), 0);
    assert_int_equal(pd_plans_bytes(c), 3 * size);
    for (unsigned i = 1; i < 4; i++)
        pd_plan_release(p[i]);
    pd_plans_close(c);

    /* One plan larger than the bound is served, alone. */
    assert_int_equal(pd_plans_open(16, size / 2, NULL, &c), 0);
    assert_int_equal(pd_plans_get(c, l, 1, 0, 8, 1, &p[0]), 0);
    assert_int_equal(pd_plans_get(c, l, 2, 0, 8, 1, &p[1]), PD_EBUSY);
    pd_plan_release(p[0]);
    assert_int_equal(pd_plans_get(c, l, 2, 0, 8, 1, &p[1]), 0); /* the unused one gave way */
    assert_int_equal(pd_plans_bytes(c), size);
    pd_plan_release(p[1]);
    pd_plans_close(c);
    pd_layout_release(l);
}

/* An idle holder's plan loses its table when another plan needs the room, keeps its identity, and
 * gets the same table back when it wakes (PD_EBUSY while the plans in use leave no room). */
static void test_plans_idle_reclaim(void **state)
{
    (void)state;
    const uint64_t size = pd_shard_plan_bytes(PLAN_SHARDS);
    pd_layout *l = plan_layout();
    pd_plans *c;
    pd_plan *a, *b, *b2;
    const pd_shard_plan *sp;
    uint64_t want[PLAN_SHARDS * PLAN_PER_SHARD], pos;
    assert_int_equal(pd_plans_open(16, size, NULL, &c), 0);
    assert_int_equal(pd_plans_get(c, l, 7, 3, 8, 1, &a), 0);
    assert_int_equal(pd_plan_use(a, &sp), 0);
    for (uint64_t i = 0; i < PLAN_SHARDS * PLAN_PER_SHARD; i++)
        assert_int_equal(pd_shard_position(sp, i, &want[i]), 0);
    uint64_t id = pd_plan_id(a);
    pd_plan_idle(a); /* a stream waiting for credit */
    assert_int_equal(pd_plans_get(c, l, 8, 3, 8, 1, &b), 0); /* a's table gives way */
    assert_false(pd_plan_ready(a));
    assert_int_equal(pd_plans_bytes(c), size);
    assert_int_equal(pd_plan_wake(a), PD_EBUSY); /* b is in use */
    pd_plan_release(b);
    assert_int_equal(pd_plan_wake(a), 0); /* b, unused, gives way */
    assert_int_equal(pd_plans_bytes(c), size);
    assert_int_equal(pd_plan_id(a), id);
    assert_int_equal(pd_plan_use(a, &sp), 0); /* built again: the same table */
    for (uint64_t i = 0; i < PLAN_SHARDS * PLAN_PER_SHARD; i++) {
        assert_int_equal(pd_shard_position(sp, i, &pos), 0);
        assert_int_equal(pos, want[i]);
    }
    /* An idle holder that is asked for by a new request shares it again (charged once). */
    pd_plan_idle(a);
    assert_int_equal(pd_plans_get(c, l, 7, 3, 8, 1, &b2), 0);
    assert_ptr_equal(b2, a);
    assert_int_equal(pd_plans_bytes(c), size);
    pd_plan_release(b2);
    pd_plan_release_idle(a);
    pd_plans_close(c);
    pd_layout_release(l);
}

/* Plans of a layout the registry dropped (pd_layout.retired: its dataset deleted) leave the cache at
 * once: an unused one is freed with its layout reference, an idle holder's loses its table, one in use
 * goes with its last holder, and gives its table back as soon as only idle holders have it (no cache
 * entry is left to reclaim it by). */
static void test_plans_retired(void **state)
{
    (void)state;
    const uint64_t size = pd_shard_plan_bytes(PLAN_SHARDS);
    pd_layout *l = plan_layout(), *other = plan_layout();
    pd_plans *c;
    pd_plan *cached, *idle, *used, *kept;
    const pd_shard_plan *sp;
    assert_int_equal(pd_plans_open(16, 8 * size, NULL, &c), 0);
    assert_int_equal(pd_plans_get(c, l, 1, 0, 8, 1, &cached), 0);
    assert_int_equal(pd_plan_use(cached, &sp), 0);
    pd_plan_release(cached); /* listed only */
    assert_int_equal(pd_plans_get(c, l, 2, 0, 8, 1, &idle), 0);
    assert_int_equal(pd_plan_use(idle, &sp), 0);
    pd_plan_idle(idle);
    assert_int_equal(pd_plans_get(c, l, 3, 0, 8, 1, &used), 0);
    assert_int_equal(pd_plans_get(c, other, 1, 0, 8, 1, &kept), 0);
    assert_int_equal(pd_plans_bytes(c), 4 * size);
    assert_int_equal(atomic_load(&l->refs), 4); /* ours and three plans' */

    atomic_store(&l->retired, 1);
    pd_plans_drop_retired(c);
    assert_int_equal(atomic_load(&l->refs), 3); /* the cached plan went */
    assert_int_equal(pd_plans_bytes(c), 2 * size); /* and the idle holder's table */
    assert_false(pd_plan_ready(idle));
    pd_plan_idle(used); /* a stream in use at the delete now waits for credit */
    assert_int_equal(pd_plans_bytes(c), size);
    assert_int_equal(pd_plan_wake(used), 0); /* it may still wake (a re-put of the same definition) */
    assert_int_equal(pd_plans_bytes(c), 2 * size);
    pd_plan_release(used);
    pd_plan_release_idle(idle);
    assert_int_equal(atomic_load(&l->refs), 1);
    assert_int_equal(pd_plans_bytes(c), size); /* the other dataset's plan stays */
    pd_plan_release(kept);
    pd_plans_close(c);
    pd_layout_release(l);
    pd_layout_release(other);
}

/* A sharded dataset of PLAN_SHARDS shards, put in one part. */
static void put_sharded(fixture *f, const char *name)
{
    uint64_t sizes[PLAN_SHARDS];
    for (unsigned i = 0; i < PLAN_SHARDS; i++)
        sizes[i] = PLAN_PER_SHARD;
    Permd__V1__PutDataset m = PERMD__V1__PUT_DATASET__INIT;
    m.name = (char *)name;
    m.size = PLAN_SHARDS * PLAN_PER_SHARD;
    m.shards_total = PLAN_SHARDS;
    m.n_shard_sizes = PLAN_SHARDS;
    m.shard_sizes = sizes;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_PUT_DATASET;
    env.put_dataset = &m;
    send_env(f, &env);
    pd_envelope *r = next_reply(f);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    free_env(r);
}

/* The whole epoch of dataset "sh" (one rank) for seed, from offset. */
static Permd__V1__Slice sharded_slice(uint64_t seed, uint64_t offset)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "sh";
    sl.seed = seed;
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    sl.offset = offset;
    return sl;
}

static void send_sharded_fetch_count(fixture *f, uint64_t id, uint64_t seed, uint64_t offset, uint64_t count)
{
    Permd__V1__Slice sl = sharded_slice(seed, offset);
    send_fetch_slice(f, id, &sl, count);
}

static void send_sharded_fetch(fixture *f, uint64_t id, uint64_t seed, uint64_t offset)
{
    send_sharded_fetch_count(f, id, seed, offset, 10);
}

static void send_sharded_stream(fixture *f, uint64_t id, uint64_t seed)
{
    Permd__V1__Slice sl = sharded_slice(seed, 0);
    send_stream_slice(f, id, &sl, 10, 1, 0);
}

/* The next stream batch of stream id: its 10 ids. */
static void stream_batch(fixture *f, uint64_t id, uint64_t seq, uint32_t *ids)
{
    pd_envelope *r = expect_reply(f, id, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
    assert_int_equal(r->stream_batch->seq, seq);
    load_ids(&r->stream_batch->ids, ids, 10);
    free_env(r);
}

/* Streams waiting for credit do not pin their plans: with room for two plans, a third stream of
 * another seed takes the room of the oldest idle one, which gets its plan back (the same ids) when
 * credit comes, or ends OVERLOADED, naming plan_cache_bytes, when the plans in use leave no room. */
static void test_idle_streams_release_plans(void **state)
{
    fixture *f = *state;
    const uint64_t size = pd_shard_plan_bytes(PLAN_SHARDS);
    char bytes[32];
    snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)(2 * size));
    set(f, "plan_cache_bytes", bytes);
    pd_plans_close(f->plans);
    assert_int_equal(pd_plans_open(16, 2 * size, NULL, &f->plans), 0);
    f->svc.plans = f->plans;
    connect_client(f, 0);
    put_sharded(f, "sh");
    uint32_t first[10], again[10], ids[10];

    send_sharded_stream(f, 10, 1);
    stream_batch(f, 10, 0, first);
    send_sharded_stream(f, 11, 2);
    stream_batch(f, 11, 0, ids);
    send_sharded_stream(f, 12, 3); /* 10 and 11 wait for credit: 10's plan gives way */
    stream_batch(f, 12, 0, ids);
    assert_true(pd_plans_bytes(f->plans) <= 2 * size);

    send_credit(f, 10, 1); /* 10's plan is built again (11's, the oldest idle, gives way) */
    stream_batch(f, 10, 1, again);
    assert_true(pd_plans_bytes(f->plans) <= 2 * size);
    /* The same order as before it idled: its second batch continues the first one's epoch. */
    send_sharded_fetch_count(f, 20, 1, 0, 20);
    pd_envelope *r = next_reply(f);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
    assert_int_equal(r->fetch_reply->count, 20);
    for (unsigned i = 0; i < 10; i++) {
        assert_int_equal(pd_load_le32(r->fetch_reply->ids.data + 4 * i), first[i]);
        assert_int_equal(pd_load_le32(r->fetch_reply->ids.data + 40 + 4 * i), again[i]);
    }
    free_env(r);

    /* Plans in use fill the room (held here as a request would): 11, whose table went, cannot have
     * it back. */
    pd_layout *l;
    pd_plan *held[2];
    assert_int_equal(pd_registry_layout(f->reg, "sh", &l), 0);
    for (unsigned i = 0; i < 2; i++)
        assert_int_equal(pd_plans_get(f->plans, l, 500 + i, 0, 8, 1, &held[i]), 0);
    assert_true(pd_plans_bytes(f->plans) <= 2 * size);
    send_credit(f, 11, 1);
    expect_error(f, 11, PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED, "plan_cache_bytes");
    /* A new plan is refused as well while they are in use. */
    send_sharded_fetch_count(f, 21, 9, 0, 20);
    expect_error(f, 21, PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED, "plan_cache_bytes");
    assert_true(pd_plans_bytes(f->plans) <= 2 * size);
    for (unsigned i = 0; i < 2; i++)
        pd_plan_release(held[i]);
    pd_layout_release(l);
}

/* A connection's readahead keeps its plan for the identity of the next Fetch only: a reader that
 * stops does not keep the plan's memory from another request's new plan. */
static void test_readahead_lends_its_plan(void **state)
{
    fixture *f = *state;
    const uint64_t size = pd_shard_plan_bytes(PLAN_SHARDS);
    pd_plans_close(f->plans);
    assert_int_equal(pd_plans_open(16, size, NULL, &f->plans), 0); /* room for one plan */
    f->svc.plans = f->plans;
    assert_int_equal(pd_readahead_loop_open(&f->sl), 0);
    connect_client(f, 0);
    put_sharded(f, "sh");
    for (uint64_t k = 0; k < 4; k++) { /* built on the pool, then read in order: predicted */
        send_sharded_fetch(f, 30 + k, 1, 10 * k);
        pd_envelope *r = next_reply(f);
        assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
        free_env(r);
        uv_run(&f->loop, UV_RUN_NOWAIT); /* the idle pass generates the prediction */
    }
    assert_true(f->sl.stats.readahead_hits > 0);
    pd_layout *l;
    pd_plan *p;
    assert_int_equal(pd_registry_layout(f->reg, "sh", &l), 0);
    assert_int_equal(pd_plans_get(f->plans, l, 2, 0, 8, 1, &p), 0); /* the reader's plan gives way */
    assert_true(pd_plans_bytes(f->plans) <= size);
    pd_plan_release(p);
    pd_layout_release(l);
    send_sharded_fetch(f, 40, 1, 40); /* the reader goes on: its plan is built again */
    pd_envelope *r = next_reply(f);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
    assert_int_equal(r->fetch_reply->count, 10);
    free_env(r);
    pd_conns_close_all(f->conns);
    pd_readahead_loop_close(&f->sl);
}

/* Delete dataset name (or, with mixture, mixture name) as request id: both answer DeleteDatasetReply. */
static void delete_named(fixture *f, uint64_t id, const char *name, int mixture)
{
    Permd__V1__DeleteDataset d = PERMD__V1__DELETE_DATASET__INIT;
    Permd__V1__DeleteMixture m = PERMD__V1__DELETE_MIXTURE__INIT;
    d.name = m.name = (char *)name;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    if (mixture) {
        env.body_case = PERMD__V1__ENVELOPE__BODY_DELETE_MIXTURE;
        env.delete_mixture = &m;
    } else {
        env.body_case = PERMD__V1__ENVELOPE__BODY_DELETE_DATASET;
        env.delete_dataset = &d;
    }
    send_env(f, &env);
    free_env(expect_reply(f, id, PERMD__V1__ENVELOPE__BODY_DELETE_DATASET_REPLY));
}

static void send_delete(fixture *f, uint64_t id, const char *name)
{
    delete_named(f, id, name, 0);
}

/* Deleting a dataset drops its cached plans at once, and with them its layout (permd_layout_bytes); a
 * plan a stream uses goes, and its layout with it, when the stream ends, not when the cache evicts it. */
static void test_delete_drops_cached_plans(void **state)
{
    fixture *f = *state;
    const uint64_t before = pd_registry_layout_bytes(f->reg);
    connect_client(f, 0);
    put_sharded(f, "sh");
    assert_true(pd_registry_layout_bytes(f->reg) > before);
    for (uint64_t k = 0; k < 2; k++) { /* two cached plans, unused once answered */
        send_sharded_fetch(f, 50 + k, 1 + k, 0);
        pd_envelope *r = next_reply(f);
        assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
        free_env(r);
    }
    send_delete(f, 52, "sh");
    assert_int_equal(pd_registry_layout_bytes(f->reg), before);
    assert_int_equal(pd_plans_bytes(f->plans), 0);

    /* A stream waiting for credit keeps the layout until it ends; its table goes at once. */
    put_sharded(f, "sh");
    const uint64_t layout = pd_registry_layout_bytes(f->reg) - before;
    send_sharded_fetch(f, 53, 4, 0);
    free_env(next_reply(f));
    send_sharded_stream(f, 60, 3);
    uint32_t ids[10];
    stream_batch(f, 60, 0, ids);
    send_delete(f, 61, "sh");
    assert_int_equal(pd_registry_layout_bytes(f->reg) - before, layout);
    assert_int_equal(pd_plans_bytes(f->plans), 0);
    send_credit(f, 60, 1); /* the stream learns its dataset went, and ends */
    expect_error(f, 60, PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND, NULL);
    assert_int_equal(pd_registry_layout_bytes(f->reg), before);
    assert_int_equal(pd_plans_bytes(f->plans), 0);
}

/* PutMixture `name` over "sh" (sharded) and "d" (flat): stage 0 weights 1:1 from position 0, then
 * stage 1 (when stages is 2) weights 1:9 from position 64. Waits for its reply: 1 created, 2 updated. */
static int put_two_component_mixture(fixture *f, uint64_t id, const char *name, unsigned stages)
{
    static uint32_t w[2][2] = {{1, 1}, {1, 9}};
    Permd__V1__MixtureStage st[2], *stp[2];
    for (unsigned k = 0; k < 2; k++) {
        permd__v1__mixture_stage__init(&st[k]);
        st[k].start = 64 * k;
        st[k].n_weights = 2;
        st[k].weights = w[k];
        stp[k] = &st[k];
    }
    char *comps[2] = {"sh", "d"};
    Permd__V1__Mixture mix = PERMD__V1__MIXTURE__INIT;
    mix.name = (char *)name;
    mix.n_components = 2;
    mix.components = comps;
    mix.n_stages = stages;
    mix.stages = stp;
    Permd__V1__PutMixture put = PERMD__V1__PUT_MIXTURE__INIT;
    put.mixture = &mix;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_PUT_MIXTURE;
    env.put_mixture = &put;
    send_env(f, &env);
    pd_envelope *r = expect_reply(f, id, PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY);
    int how = r->mixture_reply->created ? 1 : r->mixture_reply->updated ? 2 : 0;
    free_env(r);
    return how;
}

static void send_delete_mixture(fixture *f, uint64_t id, const char *name)
{
    delete_named(f, id, name, 1);
}

/* The first 100 ids of mixture name's epoch 0 for seed 5 (one rank). */
static void fetch_mixture(fixture *f, uint64_t id, const char *name, uint32_t *ids)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = (char *)name;
    sl.seed = 5;
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    send_fetch_slice(f, id, &sl, 100);
    pd_envelope *r = expect_reply(f, id, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
    load_ids(&r->fetch_reply->ids, ids, 100);
    free_env(r);
}

/* A mixture's plans go with its definition, as a deleted dataset's do: a put that appends stages drops
 * the old definition's cached plans (no request can find them: plans are keyed by the definition's
 * identity, and the ids served afterwards are the new definition's), and a delete drops them all, so
 * that deleting a component dataset afterwards gives its layout back at once. */
static void test_mixture_plans_follow_definition(void **state)
{
    fixture *f = *state;
    const uint64_t before = pd_registry_layout_bytes(f->reg);
    uint32_t old_ids[100], new_ids[100], want[100];
    connect_client(f, 0);
    put_sharded(f, "sh");
    put_dataset(f, "d", 1000);
    free_env(next_reply(f));
    const uint64_t layout = pd_registry_layout_bytes(f->reg) - before;
    assert_true(layout > 0);

    assert_int_equal(put_two_component_mixture(f, 10, "mx", 1), 1);
    fetch_mixture(f, 11, "mx", old_ids);
    const uint64_t cursor = pd_plans_cursor_bytes(f->plans); /* the fetch's, kept warm with the plan */
    assert_true(cursor > 0);
    assert_int_equal(pd_plans_bytes(f->plans), pd_mix_bytes(2, 1) + cursor); /* cached, unused */
    assert_int_equal(put_two_component_mixture(f, 12, "mx", 2), 2);   /* stages appended */
    assert_int_equal(pd_plans_bytes(f->plans), 0);                  /* the old definition's plan went */
    fetch_mixture(f, 13, "mx", new_ids);
    assert_int_equal(put_two_component_mixture(f, 14, "mx2", 2), 1); /* the same definition, from scratch */
    fetch_mixture(f, 15, "mx2", want);
    assert_memory_equal(new_ids, want, sizeof want);
    assert_memory_not_equal(new_ids, old_ids, sizeof want); /* stage 1 starts at 64: the definitions differ */
    assert_int_equal(pd_plans_bytes(f->plans), 2 * (pd_mix_bytes(2, 2) + cursor));

    send_delete_mixture(f, 16, "mx");
    assert_int_equal(pd_plans_bytes(f->plans), pd_mix_bytes(2, 2) + cursor); /* mx2's stays */
    send_delete_mixture(f, 17, "mx2");
    assert_int_equal(pd_plans_bytes(f->plans), 0);
    assert_int_equal(pd_registry_layout_bytes(f->reg) - before, layout); /* "sh" is still registered */
    send_delete(f, 18, "sh");
    assert_int_equal(pd_registry_layout_bytes(f->reg), before);
}

/* A mixture plan a stream holds when the mixture is deleted stays until the stream learns of it;
 * deleting a component afterwards lets go of nothing the stream still needs. */
static void test_mixture_delete_with_stream(void **state)
{
    fixture *f = *state;
    const uint64_t before = pd_registry_layout_bytes(f->reg);
    connect_client(f, 0);
    put_sharded(f, "sh");
    put_dataset(f, "d", 1000);
    free_env(next_reply(f));
    assert_int_equal(put_two_component_mixture(f, 20, "mx", 2), 1);
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "mx";
    sl.seed = 5;
    sl.world = 1;
    sl.mode = PERMD__V1__MODE__MODE_EXACT;
    send_stream_slice(f, 21, &sl, 10, 1, 0);
    uint32_t ids[10];
    stream_batch(f, 21, 0, ids);
    send_delete_mixture(f, 22, "mx");
    assert_int_equal(pd_plans_bytes(f->plans), 0); /* the waiting stream's table went with the delete */
    send_delete(f, 23, "sh");                      /* no mixture uses it now */
    send_credit(f, 21, 1);                         /* the stream learns its mixture went, and ends */
    expect_error(f, 21, PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND, "deleted");
    assert_int_equal(pd_plans_bytes(f->plans), 0);
    assert_int_equal(pd_registry_layout_bytes(f->reg), before);
}

/* A stream that wakes to find its dataset deleted is told so (NOT_FOUND), also when its table went to
 * plans in use meanwhile: not OVERLOADED, which would send its client to retry a dataset that is gone. */
static void test_woken_stream_of_deleted_dataset(void **state)
{
    fixture *f = *state;
    const uint64_t size = pd_shard_plan_bytes(PLAN_SHARDS);
    pd_plans_close(f->plans);
    assert_int_equal(pd_plans_open(16, size, NULL, &f->plans), 0); /* room for one plan */
    f->svc.plans = f->plans;
    connect_client(f, 0);
    put_sharded(f, "sh");
    send_sharded_stream(f, 80, 1);
    uint32_t ids[10];
    stream_batch(f, 80, 0, ids);
    pd_layout *l;
    pd_plan *held;
    assert_int_equal(pd_registry_layout(f->reg, "sh", &l), 0);
    assert_int_equal(pd_plans_get(f->plans, l, 500, 0, 8, 1, &held), 0); /* the stream's table gives way */
    send_delete(f, 81, "sh");
    send_credit(f, 80, 1);
    expect_error(f, 80, PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND, "deleted");
    pd_plan_release(held);
    pd_layout_release(l);
}

/* A stream's error is counted under Stream, whatever request the connection handles when it goes out
 * (here the Credit that lets the stream find its dataset deleted). */
static void test_stream_error_counted_as_stream(void **state)
{
    fixture *f = *state;
    const int stream = pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_STREAM);
    const int credit = pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_CREDIT);
    const unsigned nf = PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND;
    connect_client(f, 0);
    put_sharded(f, "sh");
    send_sharded_stream(f, 70, 1);
    uint32_t ids[10];
    stream_batch(f, 70, 0, ids);
    send_delete(f, 71, "sh");
    send_credit(f, 70, 1);
    expect_error(f, 70, nf, NULL);
    assert_int_equal(f->sl.metrics.errors[stream][nf], 1);
    assert_int_equal(pd_metrics_slot_errors(&f->sl.metrics, credit), 0);
}

/* ---- List replies: bounded, in pages for clients that ask ----------------------------------- */

static void send_list_datasets(fixture *f, uint64_t id, const char *after, int paged)
{
    Permd__V1__ListDatasets m = PERMD__V1__LIST_DATASETS__INIT;
    m.after = (char *)after;
    m.paged = paged;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_LIST_DATASETS;
    env.list_datasets = &m;
    send_env(f, &env);
}

/* A list longer than one reply (8 x max_count + 64 KiB) comes in pages, each within the bound and
 * together the whole sorted list, to a client that asks for pages; one that does not gets TOO_LARGE
 * instead of a frame it cannot read. A list that fits is one reply, as before. */
static void test_list_pages(void **state)
{
    fixture *f = *state;
    enum { N = 500 };
    set(f, "max_count", "1"); /* the bound: 65544 bytes */
    char name[PD_NAME_MAX + 1], err[256];
    memset(name, 'x', 120);
    name[120] = '\0';
    for (unsigned i = 0; i < N; i++) { /* declared as a config file does: in memory, quick */
        snprintf(name + 116, 5, "%04u", i);
        assert_int_equal(pd_registry_declare(f->reg, name, 1000 + i, err, sizeof err), 0);
    }
    connect_client(f, 0);
    send_list_datasets(f, 1, "", 0);
    pd_envelope *r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(r->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    assert_non_null(strstr(r->error->message, "paged"));
    free_env(r);

    char after[PD_NAME_MAX + 1] = "";
    unsigned seen = 0, pages = 0;
    do {
        send_list_datasets(f, 2, after, 1);
        assert_true(f->out_len <= 4 + 8 * 1 + 65536); /* the frame within what every client reads */
        r = take_reply(f);
        assert_non_null(r);
        assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_LIST_DATASETS_REPLY);
        const Permd__V1__ListDatasetsReply *lr = r->list_datasets_reply;
        assert_true(lr->n_datasets > 0);
        for (size_t i = 0; i < lr->n_datasets; i++, seen++) {
            snprintf(name + 116, 5, "%04u", seen);
            assert_string_equal(lr->datasets[i]->name, name);
            assert_int_equal(lr->datasets[i]->size, 1000 + seen);
        }
        if (lr->next[0])
            assert_string_equal(lr->next, lr->datasets[lr->n_datasets - 1]->name);
        snprintf(after, sizeof after, "%s", lr->next);
        pages++;
        free_env(r);
    } while (after[0]);
    assert_int_equal(seen, N);
    assert_true(pages > 1);

    set(f, "max_count", "100000"); /* room for all: one reply, paged or not, with no next */
    send_list_datasets(f, 3, "", 0);
    r = take_reply(f);
    assert_non_null(r);
    assert_int_equal(r->list_datasets_reply->n_datasets, N);
    assert_string_equal(r->list_datasets_reply->next, "");
    free_env(r);
}

/* ListMixtures names each mixture with its scalars, not its stages: nine mixtures each as large as a
 * PutMixture frame may be list in one small reply (GetMixture gives a definition whole). */
static void test_list_mixtures_summaries(void **state)
{
    fixture *f = *state;
    enum { STAGES = 4000 };
    connect_client(f, 0);
    put_dataset(f, "d", 1000000);
    free_env(next_reply(f));
    one_component_mixture m;
    char name[8];
    mixture_init(&m, STAGES, name);
    for (unsigned i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "m%u", i);
        send_put_mixture(f, 10 + i, &m);
        pd_envelope *r = next_reply(f);
        assert_int_equal(r->body_case, PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY);
        free_env(r);
    }
    Permd__V1__ListMixtures lm = PERMD__V1__LIST_MIXTURES__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 20;
    env.body_case = PERMD__V1__ENVELOPE__BODY_LIST_MIXTURES;
    env.list_mixtures = &lm;
    send_env(f, &env);
    assert_true(f->out_len < 1024);
    pd_envelope *r = take_reply(f);
    assert_non_null(r);
    const Permd__V1__ListMixturesReply *lr = r->list_mixtures_reply;
    assert_int_equal(lr->n_mixtures, 3);
    for (unsigned i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "m%u", i);
        assert_string_equal(lr->mixtures[i]->name, name);
        assert_int_equal(lr->mixtures[i]->size, 1000000);
        assert_int_equal(lr->mixtures[i]->n_stages, 0);
        assert_int_not_equal(lr->mixtures[i]->definition, 0);
    }
    assert_string_equal(lr->next, "");
    free_env(r);
    mixture_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_and_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_on_locked_registry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fetch_inline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fetch_pool, setup_no_inline, teardown),
        cmocka_unit_test_setup_teardown(test_stream_credits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auth_refusal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auth_fail_log_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_memory_released, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_memory_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixture_reply_memory_released, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inline_mixture_deferred, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inverse_memory_released, setup_no_inline, teardown),
        cmocka_unit_test(test_plans_bounded),
        cmocka_unit_test(test_plans_idle_reclaim),
        cmocka_unit_test(test_plans_retired),
        cmocka_unit_test_setup_teardown(test_idle_streams_release_plans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_readahead_lends_its_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_drops_cached_plans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_error_counted_as_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_woken_stream_of_deleted_dataset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixture_plans_follow_definition, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixture_delete_with_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_mixtures_summaries, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
