/* Request handlers: Hello, datasets, Fetch, Inverse and Stats; streams live in stream.c. */
#include "daemon/handlers.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/digest.h"
#include "daemon/backend.h"
#include "daemon/job.h"
#include "daemon/groups.h"
#include "daemon/log.h"
#include "daemon/plans.h"
#include "daemon/readahead.h"
#include "daemon/stream.h"

#define PD_HDR_MAX 128 /* a bulk frame header: prefix, id, two tags and lengths, a few small fields */

const char *pd_printable_name(const char *name)
{
    return pd_registry_name_check(name) ? "(invalid name)" : name;
}

/* ---- Hello -------------------------------------------------------------------- */

/* Token comparison in time independent of where the first difference is. */
static int pd_token_equal(const char *given, const char *want, size_t want_len)
{
    size_t given_len = strlen(given);
    unsigned diff = given_len != want_len;
    for (size_t i = 0; i < want_len; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < given_len ? given[i] : 0);
    return diff == 0;
}

static void pd_on_hello(pd_conn *c, uint64_t id, const Permd__V1__Hello *m)
{
    pd_server *s = c->srv;
    if (m->protocol_version && m->protocol_version != PD_PROTOCOL_VERSION) {
        pd_conn_send_error(c, id, PD_EINVAL, "protocol version %u is not supported; this server speaks %u",
                           m->protocol_version, PD_PROTOCOL_VERSION);
        return;
    }
    if (c->is_tcp && s->token) {
        if (!pd_token_equal(m->token, s->token, s->token_len)) {
            pd_log_warn("auth_fail", "conn=%llu", (unsigned long long)c->serial);
            pd_conn_send_error(c, id, PD_EAUTH, m->token[0] ? "wrong token" : "this listener requires a token");
            pd_conn_drain_close(c);
            return;
        }
        c->authed = 1;
    }
    static char *features[] = {"datasets", "fetch", "stream", "inverse", "stats", "shards", "digest", "nccl", "stream_ring"};
    Permd__V1__Limits lim = PERMD__V1__LIMITS__INIT;
    lim.max_frame = (uint32_t)s->cfg->max_frame;
    lim.max_count = s->cfg->max_count;
    lim.max_streams = (uint32_t)s->cfg->max_streams;
    lim.max_credits = (uint32_t)s->cfg->max_credits;
    lim.output_cap = s->cfg->output_cap;
    lim.max_digest = s->cfg->max_digest;
    Permd__V1__HelloReply r = PERMD__V1__HELLO_REPLY__INIT;
    r.protocol_version = PD_PROTOCOL_VERSION;
    r.spec_version = 1;
    r.server = "permd " PERMD_VERSION;
    r.n_features = sizeof features / sizeof features[0];
    r.features = features;
    r.limits = &lim;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO_REPLY;
    env.hello_reply = &r;
    pd_conn_send(c, &env);
}

/* ---- Datasets ------------------------------------------------------------------ */

static void pd_dataset_msg(const pd_dataset *d, Permd__V1__Dataset *m)
{
    permd__v1__dataset__init(m);
    m->name = (char *)d->name;
    m->size = d->size;
    m->id_width = pd_id_width(d->size);
    m->created_unix_ms = d->created_ms;
    m->source = d->from_config ? PERMD__V1__DATASET_SOURCE__DATASET_SOURCE_CONFIG
                               : PERMD__V1__DATASET_SOURCE__DATASET_SOURCE_API;
    m->shards = d->shards;
    m->window = d->window;
    m->lanes = d->lanes;
}

static void pd_send_dataset(pd_conn *c, uint64_t id, const pd_dataset *d, int created)
{
    Permd__V1__Dataset dm;
    pd_dataset_msg(d, &dm);
    Permd__V1__DatasetReply r = PERMD__V1__DATASET_REPLY__INIT;
    r.dataset = &dm;
    r.created = created;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_DATASET_REPLY;
    env.dataset_reply = &r;
    pd_conn_send(c, &env);
}

static int pd_check_name(pd_conn *c, uint64_t id, const char *name)
{
    if (!pd_registry_name_check(name))
        return 0;
    pd_conn_send_error(c, id, PD_EINVAL,
                       "dataset name must be 1-%d characters of A-Z a-z 0-9 . _ -, starting with a letter, "
                       "digit or _",
                       PD_NAME_MAX);
    return PD_EINVAL;
}

/* PutDataset and DeleteDataset commit to SQLite on the pool. */
typedef struct pd_registry_job {
    pd_job job;
    uint64_t id;
    int is_put;
    char name[PD_NAME_MAX + 1];
    uint64_t size;
    pd_layout *layout; /* a sharded put: its layout (released when done) */
    uint64_t window;
    uint32_t lanes;
    int rc, created;
    pd_dataset result;
} pd_registry_job;

static void pd_registry_job_run(pd_job *job)
{
    pd_registry_job *j = (pd_registry_job *)job;
    pd_registry *reg = job->conn->srv->reg;
    if (j->is_put && j->layout)
        j->rc = pd_registry_put_sharded(reg, j->name, j->layout, j->window, j->lanes, &j->result, &j->created);
    else if (j->is_put)
        j->rc = pd_registry_put(reg, j->name, j->size, &j->result, &j->created);
    else
        j->rc = pd_registry_delete(reg, j->name);
}

static void pd_registry_job_done(pd_job *job)
{
    pd_registry_job *j = (pd_registry_job *)job;
    pd_conn *c = job->conn;
    if (j->is_put && j->rc == 0 && j->created)
        pd_log_info("dataset_put", "name=%s size=%llu shards=%llu", j->name, (unsigned long long)j->result.size,
                    (unsigned long long)j->result.shards);
    if (!j->is_put && j->rc == 0)
        pd_log_info("dataset_delete", "name=%s", j->name);
    if (pd_conn_open(c)) {
        if (j->rc == PD_ECONFLICT && j->is_put && (j->layout || j->result.shards))
            pd_conn_send_error(c, j->id, PD_ECONFLICT,
                               "dataset '%s' exists with another size, shard layout, window or lanes", j->name);
        else if (j->rc == PD_ECONFLICT && j->is_put)
            pd_conn_send_error(c, j->id, PD_ECONFLICT, "dataset '%s' exists with size %llu, not %llu", j->name,
                               (unsigned long long)j->result.size, (unsigned long long)j->size);
        else if (j->rc == PD_ECONFLICT)
            pd_conn_send_error(c, j->id, PD_ECONFLICT,
                               "dataset '%s' is declared in the config file and cannot be deleted", j->name);
        else if (j->rc == PD_ENOTFOUND)
            pd_conn_send_error(c, j->id, PD_ENOTFOUND, "dataset '%s' does not exist", j->name);
        else if (j->rc)
            pd_conn_send_error(c, j->id, PD_EINTERNAL, "storing the registry failed: %s", pd_strerror(j->rc));
        else if (j->is_put)
            pd_send_dataset(c, j->id, &j->result, j->created);
        else {
            Permd__V1__DeleteDatasetReply r = PERMD__V1__DELETE_DATASET_REPLY__INIT;
            r.name = j->name;
            pd_envelope env = PERMD__V1__ENVELOPE__INIT;
            env.id = j->id;
            env.body_case = PERMD__V1__ENVELOPE__BODY_DELETE_DATASET_REPLY;
            env.delete_dataset_reply = &r;
            pd_conn_send(c, &env);
        }
    }
    pd_layout_release(j->layout);
    free(j);
    pd_conn_job_done(c);
}

/* Queue a put or delete; a sharded put passes its layout (the job takes the reference). */
static void pd_registry_job_start(pd_conn *c, uint64_t id, int is_put, const char *name, uint64_t size,
                                  pd_layout *layout, uint64_t window, uint32_t lanes)
{
    pd_registry_job *j = calloc(1, sizeof *j);
    if (!j) {
        pd_layout_release(layout);
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    j->id = id;
    j->is_put = is_put;
    strcpy(j->name, name);
    j->size = size;
    j->layout = layout;
    j->window = window;
    j->lanes = lanes;
    if (pd_job_submit(&j->job, c, pd_registry_job_run, pd_registry_job_done, 256)) {
        pd_layout_release(layout);
        free(j);
        pd_conn_send_error(c, id, PD_EINTERNAL, "cannot queue work");
        return;
    }
    c->busy = 1;
}

/* ---- Sharded uploads: shard sizes arrive in parts, each within max_frame ---------- */

struct pd_upload {
    char name[PD_NAME_MAX + 1];
    uint64_t total, received, size, window;
    uint32_t lanes;
    uint64_t *sizes;
};

void pd_upload_free(struct pd_upload *u)
{
    if (u) {
        free(u->sizes);
        free(u);
    }
}

static void pd_on_put_sharded(pd_conn *c, uint64_t id, const Permd__V1__PutDataset *m)
{
    const pd_config *cfg = c->srv->cfg;
    struct pd_upload *u = c->upload;
    if (m->shards_first == 0) { /* a new upload replaces any unfinished one */
        pd_upload_free(u);
        c->upload = u = NULL;
        if (m->shards_total > cfg->max_shards) {
            pd_conn_send_error(c, id, PD_ETOOBIG, "%llu shards exceed max_shards %llu",
                               (unsigned long long)m->shards_total, (unsigned long long)cfg->max_shards);
            return;
        }
        if (m->size > PD_N_MAX) {
            pd_conn_send_error(c, id, PD_EINVAL, "size must be at most 2^63, not %llu", (unsigned long long)m->size);
            return;
        }
        u = calloc(1, sizeof *u);
        uint64_t *sizes = u ? malloc((size_t)m->shards_total * sizeof *sizes) : NULL;
        if (!sizes) {
            free(u);
            pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory for %llu shard sizes",
                               (unsigned long long)m->shards_total);
            return;
        }
        strcpy(u->name, m->name);
        u->sizes = sizes;
        u->total = m->shards_total;
        u->size = m->size;
        u->window = m->window ? m->window : PD_DEFAULT_WINDOW;
        u->lanes = m->lanes ? m->lanes : 1;
        c->upload = u;
    } else if (!u || strcmp(u->name, m->name) || u->total != m->shards_total || u->received != m->shards_first) {
        pd_conn_send_error(c, id, PD_EINVAL,
                           "shards_first %llu does not continue an upload of '%s' on this connection (%s)",
                           (unsigned long long)m->shards_first, pd_printable_name(m->name),
                           u ? "parts must arrive in order, with the same name and shards_total"
                             : "none in progress");
        return;
    }
    if (m->n_shard_sizes > u->total - u->received) {
        pd_conn_send_error(c, id, PD_EINVAL, "%zu more shard sizes overrun shards_total %llu", m->n_shard_sizes,
                           (unsigned long long)u->total);
        pd_upload_free(u);
        c->upload = NULL;
        return;
    }
    if (m->n_shard_sizes) /* a part may carry none; memcpy from protobuf-c's NULL is undefined even for 0 bytes */
        memcpy(u->sizes + u->received, m->shard_sizes, m->n_shard_sizes * sizeof *u->sizes);
    u->received += m->n_shard_sizes;
    if (u->received < u->total) {
        Permd__V1__DatasetReply r = PERMD__V1__DATASET_REPLY__INIT;
        r.shards_received = u->received;
        pd_envelope env = PERMD__V1__ENVELOPE__INIT;
        env.id = id;
        env.body_case = PERMD__V1__ENVELOPE__BODY_DATASET_REPLY;
        env.dataset_reply = &r;
        pd_conn_send(c, &env);
        return;
    }
    c->upload = NULL;
    pd_layout *layout = NULL;
    int rc = pd_layout_create(u->sizes, u->total, &layout);
    if (rc == 0 && u->size && u->size != layout->start[layout->shards]) {
        pd_conn_send_error(c, id, PD_EINVAL, "size %llu is not the sum of the shard sizes, %llu",
                           (unsigned long long)u->size, (unsigned long long)layout->start[layout->shards]);
        pd_layout_release(layout);
    } else if (rc == PD_EINVAL) {
        pd_conn_send_error(c, id, PD_EINVAL, "the shard sizes must sum to between 1 and 2^63 samples");
    } else if (rc) {
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
    } else {
        pd_registry_job_start(c, id, 1, u->name, layout->start[layout->shards], layout, u->window, u->lanes);
    }
    pd_upload_free(u);
}

static void pd_on_put(pd_conn *c, uint64_t id, const Permd__V1__PutDataset *m)
{
    pd_dataset d;
    if (pd_check_name(c, id, m->name))
        return;
    if (m->shards_total) {
        pd_on_put_sharded(c, id, m);
        return;
    }
    if (m->n_shard_sizes || m->shards_first || m->window || m->lanes) {
        pd_conn_send_error(c, id, PD_EINVAL,
                           "shard_sizes, shards_first, window and lanes need shards_total (a sharded dataset)");
        return;
    }
    if (m->size == 0 || m->size > PD_N_MAX) {
        pd_conn_send_error(c, id, PD_EINVAL, "size must be in [1, 2^63], not %llu", (unsigned long long)m->size);
        return;
    }
    if (pd_registry_get(c->srv->reg, m->name, &d) == 0) { /* answered from memory: no disk round trip */
        if (d.shards)
            pd_conn_send_error(c, id, PD_ECONFLICT, "dataset '%s' exists as a sharded dataset", m->name);
        else if (d.size != m->size)
            pd_conn_send_error(c, id, PD_ECONFLICT, "dataset '%s' exists with size %llu, not %llu", m->name,
                               (unsigned long long)d.size, (unsigned long long)m->size);
        else
            pd_send_dataset(c, id, &d, 0);
        return;
    }
    pd_registry_job_start(c, id, 1, m->name, m->size, NULL, 0, 0);
}

static void pd_on_get(pd_conn *c, uint64_t id, const Permd__V1__GetDataset *m)
{
    pd_dataset d;
    if (pd_check_name(c, id, m->name))
        return;
    if (pd_registry_get(c->srv->reg, m->name, &d))
        pd_conn_send_error(c, id, PD_ENOTFOUND, "dataset '%s' does not exist", m->name);
    else
        pd_send_dataset(c, id, &d, 0);
}

static void pd_on_delete(pd_conn *c, uint64_t id, const Permd__V1__DeleteDataset *m)
{
    pd_dataset d;
    if (pd_check_name(c, id, m->name))
        return;
    if (pd_registry_get(c->srv->reg, m->name, &d)) {
        pd_conn_send_error(c, id, PD_ENOTFOUND, "dataset '%s' does not exist", m->name);
        return;
    }
    if (d.from_config) {
        pd_conn_send_error(c, id, PD_ECONFLICT, "dataset '%s' is declared in the config file and cannot be deleted",
                           m->name);
        return;
    }
    pd_registry_job_start(c, id, 0, m->name, 0, NULL, 0, 0);
}

static void pd_on_list(pd_conn *c, uint64_t id)
{
    pd_dataset *all;
    size_t n;
    if (pd_registry_list(c->srv->reg, &all, &n)) {
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    Permd__V1__Dataset *msgs = pd_arena_alloc(&c->arena, n * sizeof *msgs + 1);
    Permd__V1__Dataset **ptrs = pd_arena_alloc(&c->arena, n * sizeof *ptrs + 1);
    if (!msgs || !ptrs) {
        free(all);
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        pd_dataset_msg(&all[i], &msgs[i]);
        ptrs[i] = &msgs[i];
    }
    Permd__V1__ListDatasetsReply r = PERMD__V1__LIST_DATASETS_REPLY__INIT;
    r.n_datasets = n;
    r.datasets = ptrs;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_LIST_DATASETS_REPLY;
    env.list_datasets_reply = &r;
    pd_conn_send(c, &env);
    free(all);
}

/* ---- Slices --------------------------------------------------------------------- */

/* Sharded datasets: the plan (dataset layout, seed, epoch, K, G) from the cache. */
static int pd_target_plan(pd_server *s, const pd_dataset *d, uint64_t seed, uint64_t epoch, uint64_t window,
                          uint32_t lanes, pd_plan **out, char *msg, size_t len)
{
    pd_layout *layout;
    if (pd_registry_layout(s->reg, d->name, &layout)) {
        snprintf(msg, len, "dataset '%s' does not exist", d->name);
        return PD_ENOTFOUND;
    }
    int rc = pd_plans_get(s->plans, layout, seed, epoch, window ? window : d->window, lanes ? lanes : d->lanes, out);
    pd_layout_release(layout);
    if (rc)
        snprintf(msg, len, "out of memory");
    return rc ? PD_EINTERNAL : 0;
}

void pd_target_release(pd_target *t)
{
    pd_plan_release(t->plan);
    t->plan = NULL;
}

int pd_target_may_block(const pd_target *t)
{
    return t->plan && !pd_plan_ready(t->plan);
}

int pd_target_generate(pd_backend *b, const pd_target *t, const pd_slice *slice, uint64_t count, void *out,
                       uint64_t *written)
{
    const pd_shard_plan *plan;
    if (!t->plan)
        return pd_backend_slice(b, &t->perm, slice, count, t->width, out, written);
    int rc = pd_plan_use(t->plan, &plan);
    return rc ? rc : pd_backend_shard_slice(b, plan, pd_plan_id(t->plan), slice, count, t->width, out, written);
}

int pd_target_resolve(pd_server *s, const Permd__V1__Slice *m, int locations, pd_target *t, char *msg, size_t len)
{
    int mode;
    t->plan = NULL;
    if (!m) {
        snprintf(msg, len, "slice is required");
        return PD_EINVAL;
    }
    if (pd_registry_name_check(m->dataset)) {
        snprintf(msg, len, "slice.dataset: %s", m->dataset[0] ? "invalid dataset name" : "a dataset name is required");
        return PD_EINVAL;
    }
    if (pd_registry_get(s->reg, m->dataset, &t->ds)) {
        snprintf(msg, len, "dataset '%s' does not exist", m->dataset);
        return PD_ENOTFOUND;
    }
    if (m->world == 0) {
        snprintf(msg, len, "slice.world must be at least 1");
        return PD_EINVAL;
    }
    if (m->rank >= m->world) {
        snprintf(msg, len, "slice.rank %u must be below world %u", m->rank, m->world);
        return PD_EINVAL;
    }
    if (pd_wire_mode_to_pd(m->mode, &mode)) {
        snprintf(msg, len, "slice.mode must be MODE_PAD, MODE_DROP or MODE_EXACT");
        return PD_EINVAL;
    }
    uint64_t n = t->ds.size;
    pd_epoch_length(n, m->world, (pd_mode)mode, &t->epoch_len);
    if (m->offset > t->epoch_len) {
        snprintf(msg, len, "slice.offset %llu is past the end of the epoch (%llu positions in %s mode)",
                 (unsigned long long)m->offset, (unsigned long long)t->epoch_len, pd_mode_name((pd_mode)mode));
        return PD_EINVAL;
    }
    if (!t->ds.shards && (m->window || m->lanes || locations)) {
        snprintf(msg, len, "window, lanes and locations apply to sharded datasets; '%s' is flat", t->ds.name);
        return PD_EINVAL;
    }
    if (t->ds.shards) {
        int rc = pd_target_plan(s, &t->ds, m->seed, m->epoch, m->window, m->lanes, &t->plan, msg, len);
        if (rc)
            return rc;
    } else {
        pd_perm_init(&t->perm, m->seed, m->epoch, PD_STREAM_SAMPLES, n);
    }
    t->slice.world = m->world;
    t->slice.rank = m->rank;
    t->slice.mode = (pd_mode)mode;
    t->slice.offset = m->offset;
    t->width = locations ? 16 : pd_id_width(n);
    pd_slice_remaining(n, &t->slice, &t->remaining);
    return 0;
}

uint64_t pd_target_next_offset(const pd_target *t, uint64_t offset, uint64_t got)
{
    /* offset ≤ T ≤ 2^63 + 2^32 and got·W ≤ T: no overflow */
    uint64_t next = offset + got * t->slice.world;
    return next < t->epoch_len ? next : t->epoch_len;
}

/* ---- Fetch ------------------------------------------------------------------------ */

/* A Fetch too large for the loop: the frame is built in its own buffer and
 * leaves as one owned write. */
typedef struct pd_fetch_job {
    pd_job job;
    pd_backend *backend;
    uint64_t id, count;
    pd_target t; /* owns its plan reference */
    uint8_t *base, *frame, *payload;
    size_t frame_len;
    int rc;
} pd_fetch_job;

static void pd_fetch_job_run(pd_job *job)
{
    pd_fetch_job *j = (pd_fetch_job *)job;
    uint64_t got;
    j->rc = pd_target_generate(j->backend, &j->t, &j->t.slice, j->count, j->payload, &got);
    if (j->rc == 0 && got != j->count)
        j->rc = PD_EINTERNAL;
}

static void pd_fetch_job_done(pd_job *job)
{
    pd_fetch_job *j = (pd_fetch_job *)job;
    pd_conn *c = job->conn;
    if (!pd_conn_open(c)) {
        free(j->base);
    } else if (j->rc) {
        free(j->base);
        pd_conn_send_error(c, j->id, PD_EINTERNAL, "generation failed: %s", pd_strerror(j->rc));
    } else {
        c->srv->stats.ids_served_total += j->count;
        pd_conn_write_owned(c, j->base, j->frame, j->frame_len);
    }
    pd_target_release(&j->t);
    free(j);
    pd_conn_job_done(c);
}

/* After a successful resolve: answer inline or queue a job; t's plan reference is consumed. */
static void pd_fetch_reply(pd_conn *c, uint64_t id, uint64_t count, pd_target *t)
{
    pd_server *s = c->srv;
    if (count > s->cfg->max_count) {
        pd_conn_send_error(c, id, PD_ETOOBIG, "count %llu exceeds max_count %llu; fetch in pieces",
                           (unsigned long long)count, (unsigned long long)s->cfg->max_count);
        pd_target_release(t);
        return;
    }
    uint64_t got = count < t->remaining ? count : t->remaining;
    size_t bytes = (size_t)got * t->width;
    Permd__V1__FetchReply head = PERMD__V1__FETCH_REPLY__INIT;
    head.id_width = t->width;
    head.count = got;
    head.next_offset = pd_target_next_offset(t, t->slice.offset, got);
    head.remaining = t->remaining - got;
    uint8_t hdr[PD_HDR_MAX];
    size_t hlen;
    if (pd_frame_bulk_header(hdr, sizeof hdr, id, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, &head.base, 15, bytes,
                             &hlen)) {
        pd_conn_send_error(c, id, PD_EINTERNAL, "reply header does not fit");
        pd_target_release(t);
        return;
    }

    /* Requests within this loop iteration's inline budget run on the loop: a
     * thread hop costs more than generating them. The rest go to the pool, so
     * big requests spread over every core while the loop moves bytes. A
     * sharded plan not built yet always goes to the pool. */
    const uint8_t *ahead = got ? pd_readahead_find(c, t, count, got) : NULL; /* generated while the loop was idle */
    if (got == 0 || ahead || (!pd_target_may_block(t) && pd_server_take_inline(s, got))) {
        uint64_t w = 0;
        int rc = PD_ENOMEM;
        uint8_t *payload = pd_conn_bulk_begin(c, hdr, hlen, bytes, t->width);
        if (payload && ahead) {
            memcpy(payload, ahead, bytes);
            w = got;
            rc = 0;
            s->stats.readahead_hits++;
        } else if (payload) {
            rc = pd_target_generate(s->backend, t, &t->slice, got, payload, &w);
        }
        if (rc == 0 && w == got) {
            pd_conn_bulk_end(c, payload);
            s->stats.ids_served_total += got;
            pd_readahead_note(c, t, count, got, head.remaining);
        } else { /* the unfinished frame is simply not committed */
            pd_conn_send_error(c, id, PD_EINTERNAL, "generation failed: %s", pd_strerror(rc ? rc : PD_EINTERNAL));
        }
        pd_target_release(t);
        return;
    }

    pd_fetch_job *j = calloc(1, sizeof *j);
    size_t pad = (16 - hlen % 16) % 16;
    uint8_t *base = j ? malloc(pad + hlen + bytes) : NULL;
    if (!base) {
        free(j);
        pd_target_release(t);
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    j->id = id;
    j->backend = s->backend;
    j->count = got;
    j->t = *t;
    j->base = base;
    j->frame = base + pad;
    j->payload = j->frame + hlen; /* 16-aligned */
    j->frame_len = hlen + bytes;
    memcpy(j->frame, hdr, hlen);
    if (pd_job_submit(&j->job, c, pd_fetch_job_run, pd_fetch_job_done, j->frame_len)) {
        pd_target_release(t);
        free(base);
        free(j);
        pd_conn_send_error(c, id, PD_EINTERNAL, "cannot queue work");
        return;
    }
    c->busy = 1;
}

static void pd_on_fetch(pd_conn *c, uint64_t id, const Permd__V1__Fetch *m)
{
    pd_target t;
    char msg[256];
    int rc = pd_target_resolve(c->srv, m->slice, m->locations, &t, msg, sizeof msg);
    if (rc) {
        pd_conn_send_error(c, id, rc, "%s", msg);
        return;
    }
    pd_fetch_reply(c, id, m->count, &t);
}

/* ---- Digest: the rank's next ids (or all it has left), reduced to (count, sum, hash) ---- */

typedef struct pd_digest_job {
    pd_job job;
    pd_backend *backend;
    uint64_t id, count; /* count: ids to digest, ≤ max_digest */
    pd_target t;
    pd_digest d;
    int rc;
} pd_digest_job;

static void pd_digest_job_run(pd_job *job)
{
    pd_digest_job *j = (pd_digest_job *)job;
    enum { CHUNK = 1 << 16 };
    uint64_t *ids = malloc(CHUNK * sizeof *ids), left = j->count, got;
    pd_slice cur = j->t.slice;
    pd_digest_init(&j->d);
    if (!ids) {
        j->rc = PD_ENOMEM;
        return;
    }
    j->t.width = 8; /* host-order u64s: the digest mixes values, not wire bytes */
    while (left && !j->rc) {
        if (pd_job_cancelled(job)) { /* permd is stopping, or the reply has nowhere to go */
            j->rc = PD_ECLOSED;
            break;
        }
        j->rc = pd_target_generate(j->backend, &j->t, &cur, left < CHUNK ? left : CHUNK, ids, &got);
        for (uint64_t i = 0; i < got && !j->rc; i++)
            pd_digest_add(&j->d, pd_load_le64((const uint8_t *)&ids[i]));
        left -= got;
        cur.offset += got * cur.world; /* more remain, so this stays ≤ T */
    }
    free(ids);
}

static void pd_digest_job_done(pd_job *job)
{
    pd_digest_job *j = (pd_digest_job *)job;
    pd_conn *c = job->conn;
    if (pd_conn_open(c)) {
        if (j->rc == PD_ECLOSED) {
            pd_conn_send_error(c, j->id, PD_EUNAVAILABLE, "digest cancelled: permd is stopping");
        } else if (j->rc) {
            pd_conn_send_error(c, j->id, PD_EINTERNAL, "digest failed: %s", pd_strerror(j->rc));
        } else {
            Permd__V1__DigestReply r = PERMD__V1__DIGEST_REPLY__INIT;
            r.count = j->d.count;
            r.sum = j->d.sum;
            r.hash = j->d.hash;
            r.next_offset = pd_target_next_offset(&j->t, j->t.slice.offset, j->count);
            r.remaining = j->t.remaining - j->count;
            pd_envelope env = PERMD__V1__ENVELOPE__INIT;
            env.id = j->id;
            env.body_case = PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY;
            env.digest_reply = &r;
            pd_conn_send(c, &env);
        }
    }
    pd_target_release(&j->t);
    free(j);
    pd_conn_job_done(c);
}

static void pd_on_digest(pd_conn *c, uint64_t id, const Permd__V1__Digest *m)
{
    char msg[256];
    uint64_t max = c->srv->cfg->max_digest;
    pd_digest_job *j = calloc(1, sizeof *j);
    if (!j) {
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    int rc = pd_target_resolve(c->srv, m->slice, 0, &j->t, msg, sizeof msg);
    if (rc) {
        free(j);
        pd_conn_send_error(c, id, rc, "%s", msg);
        return;
    }
    j->count = m->count && m->count < j->t.remaining ? m->count : j->t.remaining;
    if (j->count > max) {
        /* Generating them would hold a worker for a long time: the client asks in parts. */
        pd_conn_send_error(c, id, PD_ETOOBIG,
                           "a digest of %llu ids exceeds max_digest (%llu); digest in parts with count, "
                           "each from the previous next_offset, and add them",
                           (unsigned long long)j->count, (unsigned long long)max);
        pd_target_release(&j->t);
        free(j);
        return;
    }
    j->id = id;
    j->backend = c->srv->backend;
    if (pd_job_submit(&j->job, c, pd_digest_job_run, pd_digest_job_done, 128)) {
        pd_target_release(&j->t);
        free(j);
        pd_conn_send_error(c, id, PD_EINTERNAL, "cannot queue work");
        return;
    }
    c->busy = 1;
}

/* ---- Inverse ---------------------------------------------------------------------- */

typedef struct pd_inverse {
    pd_perm perm;
    pd_plan *plan; /* sharded datasets (a reference) */
    uint32_t world;
    uint64_t keep; /* positions ≥ keep are dropped (drop mode), else n */
    unsigned width;
    const uint8_t *samples;
    uint64_t count;
    uint8_t *positions, *ranks;
} pd_inverse;

static void pd_inverse_compute(const pd_inverse *v)
{
    const pd_shard_plan *plan = NULL;
    if (v->plan && pd_plan_use(v->plan, &plan))
        return; /* out of memory building the plan: pd_send_inverse reports it */
    for (uint64_t i = 0; i < v->count; i++) {
        uint64_t s = v->width == 4 ? pd_load_le32(v->samples + 4 * i) : pd_load_le64(v->samples + 8 * i), p;
        if (plan)
            pd_shard_position(plan, s, &p);
        else
            p = pd_perm_inv(&v->perm, s);
        if (v->width == 4)
            pd_store_le32(v->positions + 4 * i, (uint32_t)p);
        else
            pd_store_le64(v->positions + 8 * i, p);
        pd_store_le32(v->ranks + 4 * i, p < v->keep ? (uint32_t)(p % v->world) : UINT32_MAX);
    }
}

static void pd_send_inverse(pd_conn *c, uint64_t id, const pd_inverse *v)
{
    if (v->plan && !pd_plan_ready(v->plan)) {
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory building the shard plan");
        return;
    }
    Permd__V1__InverseReply r = PERMD__V1__INVERSE_REPLY__INIT;
    r.id_width = v->width;
    r.count = v->count;
    r.positions.data = v->positions;
    r.positions.len = (size_t)v->count * v->width;
    r.ranks.data = v->ranks;
    r.ranks.len = (size_t)v->count * 4;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_INVERSE_REPLY;
    env.inverse_reply = &r;
    if (pd_conn_send(c, &env))
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
}

/* While the connection is busy no other frame is read, so the request (and
 * these buffers) stay valid in its arena until the job is done. */
typedef struct pd_inverse_job {
    pd_job job;
    uint64_t id;
    pd_inverse v;
} pd_inverse_job;

static void pd_inverse_job_run(pd_job *job)
{
    pd_inverse_compute(&((pd_inverse_job *)job)->v);
}

static void pd_inverse_job_done(pd_job *job)
{
    pd_inverse_job *j = (pd_inverse_job *)job;
    pd_conn *c = job->conn;
    if (pd_conn_open(c))
        pd_send_inverse(c, j->id, &j->v);
    pd_plan_release(j->v.plan);
    free(j);
    pd_conn_job_done(c);
}

static void pd_on_inverse(pd_conn *c, uint64_t id, const Permd__V1__Inverse *m)
{
    pd_server *s = c->srv;
    pd_dataset d;
    pd_inverse v = {0};
    int mode = -1;
    if (pd_registry_name_check(m->dataset)) {
        pd_conn_send_error(c, id, PD_EINVAL, "dataset: %s",
                           m->dataset[0] ? "invalid dataset name" : "a dataset name is required");
        return;
    }
    if (pd_registry_get(s->reg, m->dataset, &d)) {
        pd_conn_send_error(c, id, PD_ENOTFOUND, "dataset '%s' does not exist", m->dataset);
        return;
    }
    if (m->world == 0) {
        pd_conn_send_error(c, id, PD_EINVAL, "world must be at least 1");
        return;
    }
    if (m->mode != PERMD__V1__MODE__MODE_UNSPECIFIED && pd_wire_mode_to_pd(m->mode, &mode)) {
        pd_conn_send_error(c, id, PD_EINVAL, "mode must be unspecified, MODE_PAD, MODE_DROP or MODE_EXACT");
        return;
    }
    v.width = pd_id_width(d.size);
    if (m->samples.len % v.width) {
        pd_conn_send_error(c, id, PD_EINVAL, "samples holds %zu bytes, not a multiple of id_width %u",
                           m->samples.len, v.width);
        return;
    }
    v.count = m->samples.len / v.width;
    if (v.count > s->cfg->max_count) {
        pd_conn_send_error(c, id, PD_ETOOBIG, "%llu samples exceed max_count %llu", (unsigned long long)v.count,
                           (unsigned long long)s->cfg->max_count);
        return;
    }
    v.samples = m->samples.data;
    for (uint64_t i = 0; i < v.count; i++) {
        uint64_t smp = v.width == 4 ? pd_load_le32(v.samples + 4 * i) : pd_load_le64(v.samples + 8 * i);
        if (smp >= d.size) {
            pd_conn_send_error(c, id, PD_EINVAL, "samples[%llu] = %llu is not below the dataset size %llu",
                               (unsigned long long)i, (unsigned long long)smp, (unsigned long long)d.size);
            return;
        }
    }
    if (!d.shards && (m->window || m->lanes)) {
        pd_conn_send_error(c, id, PD_EINVAL, "window and lanes apply to sharded datasets; '%s' is flat", d.name);
        return;
    }
    char msg[256];
    if (d.shards) {
        int rc = pd_target_plan(s, &d, m->seed, m->epoch, m->window, m->lanes, &v.plan, msg, sizeof msg);
        if (rc) {
            pd_conn_send_error(c, id, rc, "%s", msg);
            return;
        }
    } else {
        pd_perm_init(&v.perm, m->seed, m->epoch, PD_STREAM_SAMPLES, d.size);
    }
    v.world = m->world;
    v.keep = d.size;
    if (mode == PD_MODE_DROP)
        pd_epoch_length(d.size, m->world, PD_MODE_DROP, &v.keep);
    v.positions = pd_arena_alloc(&c->arena, (size_t)v.count * v.width + 1);
    v.ranks = pd_arena_alloc(&c->arena, (size_t)v.count * 4 + 1);
    if (!v.positions || !v.ranks) {
        pd_plan_release(v.plan);
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    if ((!v.plan || pd_plan_ready(v.plan)) && pd_server_take_inline(s, v.count)) {
        pd_inverse_compute(&v);
        pd_send_inverse(c, id, &v);
        pd_plan_release(v.plan);
        return;
    }
    pd_inverse_job *j = calloc(1, sizeof *j);
    if (!j) {
        pd_plan_release(v.plan);
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    j->id = id;
    j->v = v;
    if (pd_job_submit(&j->job, c, pd_inverse_job_run, pd_inverse_job_done, (size_t)v.count * (v.width + 4))) {
        pd_plan_release(v.plan);
        free(j);
        pd_conn_send_error(c, id, PD_EINTERNAL, "cannot queue work");
        return;
    }
    c->busy = 1;
}

/* ---- Stats ------------------------------------------------------------------------- */

static void pd_on_stats(pd_conn *c, uint64_t id)
{
    pd_server *s = c->srv;
    Permd__V1__StatsReply r = PERMD__V1__STATS_REPLY__INIT;
    r.server = "permd " PERMD_VERSION;
    r.uptime_ms = pd_now_ms() - s->started_ms;
    r.datasets = (uint32_t)pd_registry_count(s->reg);
    r.workers = s->workers;
    if (pd_metrics_fill_stats(s, &r, &c->arena)) { /* every loop's counters, and the by-type tables */
        pd_conn_send_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STATS_REPLY;
    env.stats_reply = &r;
    pd_conn_send(c, &env);
}

/* ---- Dispatch ------------------------------------------------------------------------ */

void pd_handle_frame(pd_conn *c, const uint8_t *payload, uint32_t len)
{
    pd_envelope *env;
    pd_arena_reset(&c->arena);
    c->srv->stats.requests_total++;
    if (pd_frame_unpack(payload, len, &c->arena.pb, &env)) {
        pd_conn_send_error(c, 0, PD_EPROTO, "a frame of %u bytes is not a valid permd.v1.Envelope", len);
        pd_conn_drain_close(c);
        return;
    }
    uint64_t id = env->id;
    pd_conn_request_begin(c, id, (int)env->body_case); /* metrics by type, the request log line */
    if (!c->authed && env->body_case != PERMD__V1__ENVELOPE__BODY_HELLO) {
        pd_conn_send_error(c, id, PD_EAUTH, "this listener requires Hello with a token first");
        pd_conn_drain_close(c);
        return;
    }
    switch (env->body_case) {
    case PERMD__V1__ENVELOPE__BODY_HELLO:
        pd_on_hello(c, id, env->hello);
        break;
    case PERMD__V1__ENVELOPE__BODY_PUT_DATASET:
        pd_on_put(c, id, env->put_dataset);
        break;
    case PERMD__V1__ENVELOPE__BODY_GET_DATASET:
        pd_on_get(c, id, env->get_dataset);
        break;
    case PERMD__V1__ENVELOPE__BODY_LIST_DATASETS:
        pd_on_list(c, id);
        break;
    case PERMD__V1__ENVELOPE__BODY_DELETE_DATASET:
        pd_on_delete(c, id, env->delete_dataset);
        break;
    case PERMD__V1__ENVELOPE__BODY_FETCH:
        pd_on_fetch(c, id, env->fetch);
        break;
    case PERMD__V1__ENVELOPE__BODY_STREAM:
        pd_stream_open(c, id, env->stream);
        break;
    case PERMD__V1__ENVELOPE__BODY_CREDIT:
        pd_stream_credit(c, id, env->credit->credits);
        break;
    case PERMD__V1__ENVELOPE__BODY_CANCEL:
        pd_stream_cancel(c, id);
        break;
    case PERMD__V1__ENVELOPE__BODY_INVERSE:
        pd_on_inverse(c, id, env->inverse);
        break;
    case PERMD__V1__ENVELOPE__BODY_STATS:
        pd_on_stats(c, id);
        break;
    case PERMD__V1__ENVELOPE__BODY_DIGEST:
        pd_on_digest(c, id, env->digest);
        break;
    case PERMD__V1__ENVELOPE__BODY_JOIN_GROUP:
        pd_on_join_group(c, id, env->join_group);
        break;
    case PERMD__V1__ENVELOPE__BODY_DELIVER:
        pd_on_deliver(c, id, env->deliver);
        break;
    case PERMD__V1__ENVELOPE__BODY_LEAVE_GROUP:
        pd_on_leave_group(c, id, env->leave_group);
        break;
    default:
        if (env->base.n_unknown_fields)
            pd_conn_send_error(c, id, PD_EUNSUPPORTED, "unknown message (envelope field %u)",
                               env->base.unknown_fields[0].tag);
        else if (env->body_case == PERMD__V1__ENVELOPE__BODY__NOT_SET)
            pd_conn_send_error(c, id, PD_EUNSUPPORTED, "the envelope carries no message");
        else
            pd_conn_send_error(c, id, PD_EUNSUPPORTED, "message %d is sent by servers, not clients",
                               (int)env->body_case);
        break;
    }
}
