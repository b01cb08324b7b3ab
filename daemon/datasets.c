/* Dataset handlers: the registry's requests, and sharded uploads whose shard sizes arrive in parts within max_frame. */
#include "daemon/datasets.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/perm.h"
#include "daemon/clock.h"
#include "daemon/conn.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/registry.h"
#include "daemon/reply.h"

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
    m->layout_hash = d->layout_hash;
    m->definition = pd_dataset_definition(d);
}

static void pd_send_dataset(pd_session *s, uint64_t id, const pd_dataset *d, int created)
{
    Permd__V1__Dataset dm;
    pd_dataset_msg(d, &dm);
    Permd__V1__DatasetReply r = PERMD__V1__DATASET_REPLY__INIT;
    r.dataset = &dm;
    r.created = created;
    pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY, &r);
}

static int pd_check_name(pd_session *s, uint64_t id, const char *name)
{
    if (!pd_name_check(name))
        return 0;
    pd_reply_error(s, id, PD_EINVAL,
                       "dataset name must be 1-%d characters of A-Z a-z 0-9 . _ -, starting with a letter, "
                       "digit or _",
                       PD_NAME_MAX);
    return PD_EINVAL;
}

/* PutDataset and DeleteDataset commit to SQLite on the pool. */
typedef struct pd_registry_job {
    pd_job job;
    pd_session *s; /* alive while the job holds its connection */
    uint64_t id;
    char why[256]; /* the cause of a failed commit */
    int is_put;
    char name[PD_NAME_MAX + 1];
    uint64_t size;
    pd_layout *layout; /* a sharded put: its layout (released when done) */
    uint64_t window;
    uint32_t lanes;
    int rc, created;
    int again; /* another write had the turn: queued again (pd_service_write_turn) */
    pd_dataset result;
} pd_registry_job;

static void pd_registry_job_run(pd_job *job)
{
    pd_registry_job *j = (pd_registry_job *)job;
    pd_registry *reg = j->s->svc->reg;
    if ((j->again = !pd_service_write_turn(j->s->svc)))
        return;
    if (j->is_put && j->layout)
        j->rc = pd_registry_put_sharded(reg, j->name, j->layout, j->window, j->lanes, &j->result, &j->created,
                                        j->why, sizeof j->why);
    else if (j->is_put)
        j->rc = pd_registry_put(reg, j->name, j->size, &j->result, &j->created, j->why, sizeof j->why);
    else if ((j->rc = pd_registry_delete(reg, j->name, j->why, sizeof j->why)) == 0)
        pd_plans_drop_retired(j->s->svc->plans); /* its cached plans would keep its layout until evicted */
    pd_service_write_done(j->s->svc);
}

static void pd_registry_job_done(pd_job *job)
{
    pd_registry_job *j = (pd_registry_job *)job;
    pd_session *s = j->s;
    if (j->again && pd_service_write_again(job, &j->rc, j->why, sizeof j->why))
        return; /* queued again: a worker may run it already */
    if (j->is_put && j->rc == 0 && j->created)
        pd_log_info("dataset_put", "name=%s size=%llu shards=%llu", j->name, (unsigned long long)j->result.size,
                    (unsigned long long)j->result.shards);
    if (!j->is_put && j->rc == 0)
        pd_log_info("dataset_delete", "name=%s", j->name);
    if (pd_conn_open(s->conn)) {
        if (j->rc == PD_ECONFLICT && j->why[0]) /* a mixture's name, or a dataset a mixture uses */
            pd_reply_error(s, j->id, PD_ECONFLICT, "%s", j->why);
        else if (j->rc == PD_ECONFLICT && j->is_put && (j->layout || j->result.shards))
            pd_reply_error(s, j->id, PD_ECONFLICT,
                           "dataset '%s' exists with another size, shard layout, window or lanes", j->name);
        else if (j->rc == PD_ECONFLICT && j->is_put)
            pd_reply_error(s, j->id, PD_ECONFLICT, "dataset '%s' exists with size %llu, not %llu", j->name,
                           (unsigned long long)j->result.size, (unsigned long long)j->size);
        else if (j->rc == PD_ECONFLICT)
            pd_reply_error(s, j->id, PD_ECONFLICT,
                           "dataset '%s' is declared in the config file and cannot be deleted", j->name);
        else if (j->rc == PD_ENOTFOUND)
            pd_reply_error(s, j->id, PD_ENOTFOUND, "dataset '%s' does not exist", j->name);
        else if (j->rc == PD_ETOOBIG)
            pd_reply_error(s, j->id, PD_ETOOBIG, "dataset '%s': %s", j->name, j->why);
        else if (j->rc == PD_EBUSY) /* another process holds the registry locked: worth a retry, as mixtures say */
            pd_reply_error(s, j->id, PD_EBUSY, "storing the registry failed, retry later: %s",
                           j->why[0] ? j->why : pd_strerror(j->rc));
        else if (j->rc)
            pd_reply_error(s, j->id, PD_EINTERNAL, "storing the registry failed: %s",
                           j->why[0] ? j->why : pd_strerror(j->rc));
        else if (j->is_put)
            pd_send_dataset(s, j->id, &j->result, j->created);
        else {
            Permd__V1__DeleteDatasetReply r = PERMD__V1__DELETE_DATASET_REPLY__INIT;
            r.name = j->name;
            pd_reply(s, j->id, PERMD__V1__ENVELOPE__BODY_DELETE_DATASET_REPLY, &r);
        }
    }
    pd_layout_release(j->layout);
    free(j);
}

/* Queue a put or delete; a sharded put passes its layout (the job takes the reference). */
static void pd_registry_job_start(pd_session *s, uint64_t id, int is_put, const char *name, uint64_t size,
                                  pd_layout *layout, uint64_t window, uint32_t lanes)
{
    pd_registry_job *j = calloc(1, sizeof *j);
    if (!j) {
        pd_layout_release(layout);
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    j->s = s;
    j->id = id;
    j->is_put = is_put;
    strcpy(j->name, name);
    j->size = size;
    j->layout = layout;
    j->window = window;
    j->lanes = lanes;
    if (pd_job_submit_request(&j->job, s->conn, pd_registry_job_run, pd_registry_job_done, 256)) {
        pd_layout_release(layout);
        free(j);
        pd_reply_error(s, id, PD_EINTERNAL, "cannot queue work");
    }
}

/* ---- Sharded uploads: shard sizes arrive in parts, each within max_frame ---------- */

struct pd_upload {
    pd_service *svc; /* whose upload_bytes it holds */
    char name[PD_NAME_MAX + 1];
    uint64_t total, received, size, window; /* size, window, lanes: as a part said them (0: none has) */
    uint32_t lanes;
    uint64_t *sizes;
    uint64_t cap;        /* sizes allocated, counted in svc->upload_bytes (8 bytes each) */
    uint64_t expires_ms; /* upload_timeout_ms after its last part */
    int expired;         /* dropped at expires_ms: sizes freed, the rest kept to answer its next part */
};

/* Free the sizes and stop counting them in upload_memory. */
static void pd_upload_drop_sizes(struct pd_upload *u)
{
    atomic_fetch_sub(&u->svc->upload_bytes, u->cap * sizeof *u->sizes);
    free(u->sizes);
    u->sizes = NULL;
    u->cap = 0;
}

void pd_upload_free(struct pd_upload *u)
{
    if (u) {
        pd_upload_drop_sizes(u);
        free(u);
    }
}

void pd_datasets_on_alarm(pd_session *s)
{
    struct pd_upload *u = s->upload;
    if (!u || u->expired)
        return;
    const uint64_t now = pd_clock_ms();
    if (now < u->expires_ms) { /* another alarm of the connection's went off first */
        pd_conn_set_alarm(s->conn, u->expires_ms);
        return;
    }
    pd_log_warn_peer("upload_expired", "conn=%llu peer=%s name=%s received=%llu total=%llu",
                     (unsigned long long)pd_conn_serial(s->conn), pd_conn_peer(s->conn), pd_name_printable(u->name),
                     (unsigned long long)u->received, (unsigned long long)u->total);
    s->loop->stats.uploads_expired++;
    pd_upload_drop_sizes(u);
    u->expired = 1;
}

/* Room for n more sizes: grown as parts arrive (a client that announces 16 M shards and sends few
 * holds little), within upload_memory for every upload together. PD_ETOOBIG or PD_ENOMEM. */
static int pd_upload_reserve(struct pd_upload *u, uint64_t n)
{
    uint64_t need = u->received + n;
    if (need <= u->cap)
        return 0;
    uint64_t cap = u->cap * 2 > need ? u->cap * 2 : need;
    if (cap > u->total)
        cap = u->total;
    uint64_t more = (cap - u->cap) * sizeof *u->sizes;
    if (atomic_fetch_add(&u->svc->upload_bytes, more) + more > u->svc->cfg->upload_memory) {
        atomic_fetch_sub(&u->svc->upload_bytes, more);
        return PD_ETOOBIG;
    }
    uint64_t *p = realloc(u->sizes, (size_t)cap * sizeof *p);
    if (!p) {
        atomic_fetch_sub(&u->svc->upload_bytes, more);
        return PD_ENOMEM;
    }
    u->sizes = p;
    u->cap = cap;
    return 0;
}

static void pd_on_put_sharded(pd_session *s, uint64_t id, const Permd__V1__PutDataset *m)
{
    const pd_config *cfg = s->svc->cfg;
    struct pd_upload *u = s->upload;
    if (m->shards_first == 0) { /* a new upload replaces any unfinished one */
        pd_upload_free(u);
        s->upload = u = NULL;
        if (m->shards_total > cfg->max_shards) {
            pd_reply_error(s, id, PD_ETOOBIG, "%llu shards exceed max_shards %llu",
                               (unsigned long long)m->shards_total, (unsigned long long)cfg->max_shards);
            return;
        }
        if (m->size > PD_N_MAX) {
            pd_reply_error(s, id, PD_EINVAL, "size must be at most 2^63, not %llu", (unsigned long long)m->size);
            return;
        }
        if (!(u = calloc(1, sizeof *u))) {
            pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
            return;
        }
        u->svc = s->svc;
        strcpy(u->name, m->name);
        u->total = m->shards_total;
        s->upload = u;
    } else if (u && u->expired && !strcmp(u->name, m->name)) {
        pd_reply_error(s, id, PD_EINVAL,
                       "the upload of '%s' was dropped after %llu of %llu shard sizes: no part came within "
                       "upload_timeout_ms (%llu ms); send it again from shards_first 0", pd_name_printable(u->name),
                       (unsigned long long)u->received, (unsigned long long)u->total,
                       (unsigned long long)cfg->upload_timeout_ms);
        pd_upload_free(u);
        s->upload = NULL;
        return;
    } else if (!u || strcmp(u->name, m->name) || u->total != m->shards_total || u->received != m->shards_first) {
        pd_reply_error(s, id, PD_EINVAL,
                           "shards_first %llu does not continue an upload of '%s' on this connection (%s)",
                           (unsigned long long)m->shards_first, pd_name_printable(m->name),
                           u ? "parts must arrive in order, with the same name and shards_total"
                             : "none in progress");
        return;
    }
    /* Any part may say size, window and lanes (protocol.md §5); parts that say one must agree, or the later part's
     * would be dropped without a word. */
    if ((m->size && u->size && m->size != u->size) || (m->window && u->window && m->window != u->window) ||
        (m->lanes && u->lanes && m->lanes != u->lanes)) {
        pd_reply_error(s, id, PD_EINVAL,
                       "part at shards_first %llu of '%s' says size %llu, window %llu, lanes %u where an earlier part "
                       "said %llu, %llu, %u (0: not said); the upload is dropped",
                       (unsigned long long)m->shards_first, pd_name_printable(m->name), (unsigned long long)m->size,
                       (unsigned long long)m->window, m->lanes, (unsigned long long)u->size,
                       (unsigned long long)u->window, u->lanes);
        pd_upload_free(u);
        s->upload = NULL;
        return;
    }
    u->size = m->size ? m->size : u->size;
    u->window = m->window ? m->window : u->window;
    u->lanes = m->lanes ? m->lanes : u->lanes;
    if (m->n_shard_sizes > u->total - u->received) {
        pd_reply_error(s, id, PD_EINVAL, "%zu more shard sizes overrun shards_total %llu", m->n_shard_sizes,
                           (unsigned long long)u->total);
        pd_upload_free(u);
        s->upload = NULL;
        return;
    }
    int rc = pd_upload_reserve(u, m->n_shard_sizes);
    if (rc) {
        if (rc == PD_ETOOBIG)
            pd_reply_error(s, id, PD_ETOOBIG,
                           "unfinished sharded uploads would hold more than upload_memory (%llu bytes); retry later",
                           (unsigned long long)cfg->upload_memory);
        else
            pd_reply_error(s, id, PD_EINTERNAL, "out of memory for %llu shard sizes", (unsigned long long)u->total);
        pd_upload_free(u);
        s->upload = NULL;
        return;
    }
    if (m->n_shard_sizes) /* a part may carry none; memcpy from protobuf-c's NULL is undefined even for 0 bytes */
        memcpy(u->sizes + u->received, m->shard_sizes, m->n_shard_sizes * sizeof *u->sizes);
    u->received += m->n_shard_sizes;
    if (u->received < u->total) {
        u->expires_ms = pd_clock_ms() + cfg->upload_timeout_ms;
        pd_conn_set_alarm(s->conn, u->expires_ms);
        Permd__V1__DatasetReply r = PERMD__V1__DATASET_REPLY__INIT;
        r.shards_received = u->received;
        pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY, &r);
        return;
    }
    s->upload = NULL;
    pd_layout *layout = NULL;
    rc = pd_layout_create(u->sizes, u->total, &layout);
    if (rc == 0 && u->size && u->size != layout->start[layout->shards]) {
        pd_reply_error(s, id, PD_EINVAL, "size %llu is not the sum of the shard sizes, %llu",
                           (unsigned long long)u->size, (unsigned long long)layout->start[layout->shards]);
        pd_layout_release(layout);
    } else if (rc == PD_EINVAL) {
        pd_reply_error(s, id, PD_EINVAL, "the shard sizes must sum to between 1 and 2^63 samples");
    } else if (rc) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
    } else {
        pd_registry_job_start(s, id, 1, u->name, layout->start[layout->shards], layout,
                              u->window ? u->window : PD_DEFAULT_WINDOW, u->lanes ? u->lanes : 1);
    }
    pd_upload_free(u);
}

void pd_on_put_dataset(pd_session *s, uint64_t id, const Permd__V1__PutDataset *m)
{
    pd_dataset d;
    if (pd_check_name(s, id, m->name))
        return;
    if (m->shards_total) {
        pd_on_put_sharded(s, id, m);
        return;
    }
    if (m->n_shard_sizes || m->shards_first || m->window || m->lanes) {
        pd_reply_error(s, id, PD_EINVAL,
                           "shard_sizes, shards_first, window and lanes need shards_total (a sharded dataset)");
        return;
    }
    if (m->size == 0 || m->size > PD_N_MAX) {
        pd_reply_error(s, id, PD_EINVAL, "size must be in [1, 2^63], not %llu", (unsigned long long)m->size);
        return;
    }
    /* answered from memory, no disk round trip: unless declared in config only, whose row the job stores */
    if (pd_registry_get(s->svc->reg, m->name, &d) == 0 && !d.from_config) {
        if (d.shards)
            pd_reply_error(s, id, PD_ECONFLICT, "dataset '%s' exists as a sharded dataset", m->name);
        else if (d.size != m->size)
            pd_reply_error(s, id, PD_ECONFLICT, "dataset '%s' exists with size %llu, not %llu", m->name,
                               (unsigned long long)d.size, (unsigned long long)m->size);
        else
            pd_send_dataset(s, id, &d, 0);
        return;
    }
    pd_registry_job_start(s, id, 1, m->name, m->size, NULL, 0, 0);
}

void pd_on_get_dataset(pd_session *s, uint64_t id, const Permd__V1__GetDataset *m)
{
    pd_dataset d;
    if (pd_check_name(s, id, m->name))
        return;
    if (pd_registry_get(s->svc->reg, m->name, &d))
        pd_reply_error(s, id, PD_ENOTFOUND, "dataset '%s' does not exist", m->name);
    else
        pd_send_dataset(s, id, &d, 0);
}

void pd_on_delete_dataset(pd_session *s, uint64_t id, const Permd__V1__DeleteDataset *m)
{
    pd_dataset d;
    if (pd_check_name(s, id, m->name))
        return;
    if (pd_registry_get(s->svc->reg, m->name, &d)) {
        if (pd_registry_skipped(s->svc->reg)) /* it may be a row that failed to load: the commit decides */
            pd_registry_job_start(s, id, 0, m->name, 0, NULL, 0, 0);
        else
            pd_reply_error(s, id, PD_ENOTFOUND, "dataset '%s' does not exist", m->name);
        return;
    }
    if (d.from_config) {
        pd_reply_error(s, id, PD_ECONFLICT, "dataset '%s' is declared in the config file and cannot be deleted",
                           m->name);
        return;
    }
    pd_registry_job_start(s, id, 0, m->name, 0, NULL, 0, 0);
}

/* The datasets after `after` (sorted, so a binary search would do; the copy is linear anyway). */
static size_t pd_list_first(const pd_dataset *all, size_t n, const char *after)
{
    size_t i = 0;
    while (after[0] && i < n && strcmp(all[i].name, after) <= 0)
        i++;
    return i;
}

void pd_on_list_datasets(pd_session *s, uint64_t id, const Permd__V1__ListDatasets *m)
{
    pd_dataset *all;
    size_t n;
    if (pd_registry_list(s->svc->reg, &all, &n)) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    /* One reply holds what fits the budget: the rest is the next page, or TOO_LARGE for a client that
     * reads no pages (it could not read a larger frame either). */
    const uint64_t budget = pd_list_budget(s->svc->cfg);
    size_t first = pd_list_first(all, n, m->after), end = first;
    uint64_t bytes = 0;
    for (; end < n; end++) {
        Permd__V1__Dataset msg;
        pd_dataset_msg(&all[end], &msg);
        size_t b = pd_list_entry_bytes(permd__v1__dataset__get_packed_size(&msg));
        if (end > first && bytes + b > budget)
            break;
        bytes += b;
    }
    if (end < n && !m->paged) {
        pd_reply_error(s, id, PD_ETOOBIG,
                       "%zu datasets take more than one reply (%llu bytes: 8 x max_count + 64 KiB); this client "
                       "does not ask for pages (ListDatasets.paged): a newer one does",
                       n - first, (unsigned long long)budget);
        free(all);
        return;
    }
    size_t k = end - first;
    Permd__V1__Dataset *msgs = pd_arena_alloc(&s->arena, k * sizeof *msgs + 1);
    Permd__V1__Dataset **ptrs = pd_arena_alloc(&s->arena, k * sizeof *ptrs + 1);
    if (!msgs || !ptrs) {
        free(all);
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < k; i++) {
        pd_dataset_msg(&all[first + i], &msgs[i]);
        ptrs[i] = &msgs[i];
    }
    Permd__V1__ListDatasetsReply r = PERMD__V1__LIST_DATASETS_REPLY__INIT;
    r.n_datasets = k;
    r.datasets = ptrs;
    if (end < n)
        r.next = all[end - 1].name; /* the last one sent: the next page starts after it */
    pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_LIST_DATASETS_REPLY, &r);
    free(all);
}

