/* Mixture handlers: definitions over registered datasets, stored by the registry; serving them is the slice path's (target.c). */
#include "daemon/mixtures.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/perm.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/mixdef.h"
#include "daemon/plans.h"
#include "daemon/registry.h"
#include "daemon/reply.h"

/* The Mixture message of a definition; its arrays live in the session's arena. PD_ENOMEM. */
static void pd_mixture_summary(const pd_mixdef *d, Permd__V1__Mixture *m);

static int pd_mixture_msg(pd_session *s, const pd_mixdef *d, Permd__V1__Mixture *m)
{
    pd_arena *a = &s->arena;
    uint32_t C = d->components, S = d->stages;
    pd_mixture_summary(d, m); /* the scalars, then components and stages */
    char **names = pd_arena_alloc(a, C * sizeof *names);
    uint64_t *sizes = pd_arena_alloc(a, C * sizeof *sizes);
    uint64_t *shards = pd_arena_alloc(a, C * sizeof *shards), *windows = pd_arena_alloc(a, C * sizeof *windows);
    uint32_t *lanes = pd_arena_alloc(a, C * sizeof *lanes);
    uint64_t *hashes = pd_arena_alloc(a, C * sizeof *hashes);
    Permd__V1__MixtureStage *st = pd_arena_alloc(a, S * sizeof *st);
    Permd__V1__MixtureStage **stp = pd_arena_alloc(a, S * sizeof *stp);
    if (!names || !sizes || !shards || !windows || !lanes || !hashes || !st || !stp)
        return PD_ENOMEM;
    for (uint32_t j = 0; j < C; j++) {
        names[j] = (char *)d->comp[j].name;
        sizes[j] = d->comp[j].size;
        shards[j] = d->comp[j].shards;
        windows[j] = d->comp[j].window; /* 0 for a flat one (pd_registry_component) */
        lanes[j] = d->comp[j].lanes;
        hashes[j] = d->comp[j].layout_hash;
    }
    for (uint32_t k = 0; k < S; k++) {
        permd__v1__mixture_stage__init(&st[k]);
        st[k].start = d->starts[k];
        st[k].n_weights = C;
        st[k].weights = &d->weights[(size_t)k * C];
        stp[k] = &st[k];
    }
    m->n_components = C;
    m->components = names;
    m->n_component_sizes = C;
    m->component_sizes = sizes;
    m->n_component_shards = m->n_component_windows = m->n_component_lanes = C;
    m->component_shards = shards;
    m->component_windows = windows;
    m->component_lanes = lanes;
    m->n_component_layout_hashes = C;
    m->component_layout_hashes = hashes;
    m->n_stages = S;
    m->stages = stp;
    return 0;
}

static void pd_send_mixture(pd_session *s, uint64_t id, const pd_mixdef *d, int created)
{
    Permd__V1__Mixture m;
    if (pd_mixture_msg(s, d, &m)) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    Permd__V1__MixtureReply r = PERMD__V1__MIXTURE_REPLY__INIT;
    r.mixture = &m;
    r.created = created == 1;
    r.updated = created == 2;
    pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY, &r);
}

/* The definition a PutMixture describes (components not looked up yet), or an error reply. */
static pd_mixdef *pd_mixdef_from_msg(pd_session *s, uint64_t id, const Permd__V1__Mixture *m)
{
    const pd_config *cfg = s->svc->cfg;
    pd_mixdef *d;
    if (!m || pd_name_check(m->name)) {
        pd_reply_error(s, id, PD_EINVAL, "mixture.name: a name of 1-%d characters of A-Z a-z 0-9 . _ - is required",
                       PD_NAME_MAX);
        return NULL;
    }
    if (m->n_components == 0 || m->n_components > cfg->max_mixture_components) {
        pd_reply_error(s, id, m->n_components ? PD_ETOOBIG : PD_EINVAL,
                       "a mixture needs 1 to %llu components (max_mixture_components), not %zu",
                       (unsigned long long)cfg->max_mixture_components, m->n_components);
        return NULL;
    }
    if (m->n_stages == 0 || m->n_stages > cfg->max_mixture_stages) {
        pd_reply_error(s, id, m->n_stages ? PD_ETOOBIG : PD_EINVAL,
                       "a mixture needs 1 to %llu stages (max_mixture_stages), not %zu",
                       (unsigned long long)cfg->max_mixture_stages, m->n_stages);
        return NULL;
    }
    if (pd_mixdef_alloc(m->name, (uint32_t)m->n_components, (uint32_t)m->n_stages, &d)) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return NULL;
    }
    d->length = m->length;
    d->block = m->block;
    for (size_t j = 0; j < m->n_components; j++) {
        if (pd_name_check(m->components[j])) {
            pd_reply_error(s, id, PD_EINVAL, "mixture.components[%zu]: not a dataset name", j);
            goto fail;
        }
        strcpy(d->comp[j].name, m->components[j]);
    }
    for (size_t k = 0; k < m->n_stages; k++) {
        const Permd__V1__MixtureStage *st = m->stages[k];
        if (st->n_weights != m->n_components) {
            pd_reply_error(s, id, PD_EINVAL, "mixture.stages[%zu] has %zu weights for %zu components", k,
                           st->n_weights, m->n_components);
            goto fail;
        }
        d->starts[k] = st->start;
        memcpy(&d->weights[k * m->n_components], st->weights, st->n_weights * sizeof *st->weights);
    }
    return d;
fail:
    pd_mixdef_release(d);
    return NULL;
}

/* PutMixture and DeleteMixture commit to SQLite on the pool. */
typedef struct pd_mixture_job {
    pd_job job;
    pd_session *s;
    uint64_t id;
    pd_mixdef *def;    /* a put's definition; NULL: a delete */
    char name[PD_NAME_MAX + 1];
    pd_mixdef *stored; /* what the registry holds after a put */
    int rc, created;
    int again; /* another write had the turn: queued again (pd_service_write_turn) */
    char why[512];
} pd_mixture_job;

static void pd_mixture_job_run(pd_job *job)
{
    pd_mixture_job *j = (pd_mixture_job *)job;
    pd_registry *reg = j->s->svc->reg;
    pd_plans *plans = j->s->svc->plans;
    if ((j->again = !pd_service_write_turn(j->s->svc)))
        return;
    /* Plans are keyed by their definition's identity: no request finds those of a definition replaced or
     * deleted, so they go now (as a deleted dataset's do), not when evicted; they hold plan_cache_bytes,
     * the old definition and its components' layouts. A put or delete of the same name racing this one
     * costs at most a cache miss: the plans it keeps are the registry's definition as this job saw it. */
    if (j->def) {
        j->rc = pd_registry_put_mixture(reg, j->def, &j->stored, &j->created, j->why, sizeof j->why);
        if (j->rc == 0 && j->created == 2) /* stages appended: a new definition */
            pd_plans_drop_mixture(plans, j->name, j->stored);
    } else if ((j->rc = pd_registry_delete_mixture(reg, j->name, j->why, sizeof j->why)) == 0) {
        pd_mixdef *now = NULL;
        pd_registry_mixture(reg, j->name, &now); /* put again since: its plans stay */
        pd_plans_drop_mixture(plans, j->name, now);
        pd_mixdef_release(now);
    }
    pd_service_write_done(j->s->svc);
}

static void pd_mixture_job_done(pd_job *job)
{
    pd_mixture_job *j = (pd_mixture_job *)job;
    pd_session *s = j->s;
    if (j->again && pd_service_write_again(job, &j->rc, j->why, sizeof j->why))
        return; /* queued again: a worker may run it already */
    if (j->rc == 0 && j->def && j->created)
        pd_log_info("mixture_put", "name=%s components=%u stages=%u %s", j->name, j->stored->components,
                    j->stored->stages, j->created == 2 ? "updated=1" : "created=1");
    if (j->rc == 0 && !j->def)
        pd_log_info("mixture_delete", "name=%s", j->name);
    if (!pd_conn_open(s->conn)) {
        /* nothing to answer */
    } else if (j->rc == PD_ENOTFOUND && !j->def) {
        pd_reply_error(s, j->id, PD_ENOTFOUND, "mixture '%s' does not exist", j->name);
    } else if (j->rc == PD_EIO) {
        pd_reply_error(s, j->id, PD_EINTERNAL, "storing the registry failed: %s", j->why);
    } else if (j->rc) {
        pd_reply_error(s, j->id, j->rc, "%s", j->why[0] ? j->why : pd_strerror(j->rc));
    } else if (j->def) {
        pd_send_mixture(s, j->id, j->stored, j->created);
    } else {
        Permd__V1__DeleteDatasetReply r = PERMD__V1__DELETE_DATASET_REPLY__INIT;
        r.name = j->name;
        pd_reply(s, j->id, PERMD__V1__ENVELOPE__BODY_DELETE_DATASET_REPLY, &r);
    }
    pd_mixdef_release(j->def);
    pd_mixdef_release(j->stored);
    free(j);
    /* The reply was built in the arena after the dispatch let it go; the connection was busy meanwhile,
     * so nothing else is in it: release it now, not at the next frame. */
    pd_arena_reset(&s->arena);
}

static void pd_mixture_job_start(pd_session *s, uint64_t id, pd_mixdef *def, const char *name)
{
    pd_mixture_job *j = calloc(1, sizeof *j);
    if (!j) {
        pd_mixdef_release(def);
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    j->s = s;
    j->id = id;
    j->def = def;
    strcpy(j->name, name);
    if (pd_job_submit_request(&j->job, s->conn, pd_mixture_job_run, pd_mixture_job_done, 4096)) {
        pd_mixdef_release(def);
        free(j);
        pd_reply_error(s, id, PD_EINTERNAL, "cannot queue work");
    }
}

void pd_on_put_mixture(pd_session *s, uint64_t id, const Permd__V1__PutMixture *m)
{
    pd_mixdef *d = pd_mixdef_from_msg(s, id, m->mixture);
    if (d)
        pd_mixture_job_start(s, id, d, d->name);
}

void pd_on_get_mixture(pd_session *s, uint64_t id, const Permd__V1__GetMixture *m)
{
    pd_mixdef *d;
    if (pd_name_check(m->name)) {
        pd_reply_error(s, id, PD_EINVAL, "name: not a mixture name");
        return;
    }
    if (pd_registry_mixture(s->svc->reg, m->name, &d)) {
        pd_reply_error(s, id, PD_ENOTFOUND, "mixture '%s' does not exist", m->name);
        return;
    }
    pd_send_mixture(s, id, d, 0);
    pd_mixdef_release(d);
}

/* What a list says of a mixture: its scalars; GetMixture has the components and stages, which would
 * make a list of large mixtures larger than any reply a client reads. */
static void pd_mixture_summary(const pd_mixdef *d, Permd__V1__Mixture *m)
{
    permd__v1__mixture__init(m);
    m->name = (char *)d->name;
    m->length = d->length;
    m->block = d->block;
    m->size = d->size;
    m->id_width = pd_id_width(d->size);
    m->created_unix_ms = d->created_ms;
    m->definition = d->definition;
}

void pd_on_list_mixtures(pd_session *s, uint64_t id, const Permd__V1__ListMixtures *m)
{
    pd_mixdef **all;
    size_t n;
    if (pd_registry_list_mixtures(s->svc->reg, &all, &n)) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    /* Pages as ListDatasets (daemon/datasets.c). */
    const uint64_t budget = pd_list_budget(s->svc->cfg);
    size_t first = 0, end;
    while (m->after[0] && first < n && strcmp(all[first]->name, m->after) <= 0)
        first++;
    uint64_t bytes = 0;
    for (end = first; end < n; end++) {
        Permd__V1__Mixture msg;
        pd_mixture_summary(all[end], &msg);
        size_t b = pd_list_entry_bytes(permd__v1__mixture__get_packed_size(&msg));
        if (end > first && bytes + b > budget)
            break;
        bytes += b;
    }
    size_t k = end - first;
    Permd__V1__Mixture *msgs = pd_arena_alloc(&s->arena, k * sizeof *msgs + 1);
    Permd__V1__Mixture **ptrs = pd_arena_alloc(&s->arena, k * sizeof *ptrs + 1);
    if (end < n && !m->paged) {
        pd_reply_error(s, id, PD_ETOOBIG,
                       "%zu mixtures take more than one reply (%llu bytes: 8 x max_count + 64 KiB); this client "
                       "does not ask for pages (ListMixtures.paged): a newer one does",
                       n - first, (unsigned long long)budget);
    } else if (!msgs || !ptrs) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
    } else {
        for (size_t i = 0; i < k; i++) {
            pd_mixture_summary(all[first + i], &msgs[i]);
            ptrs[i] = &msgs[i];
        }
        Permd__V1__ListMixturesReply r = PERMD__V1__LIST_MIXTURES_REPLY__INIT;
        r.n_mixtures = k;
        r.mixtures = ptrs;
        if (end < n)
            r.next = all[end - 1]->name; /* the last one sent: the next page starts after it */
        pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_LIST_MIXTURES_REPLY, &r);
    }
    for (size_t i = 0; i < n; i++)
        pd_mixdef_release(all[i]);
    free(all);
}

void pd_on_delete_mixture(pd_session *s, uint64_t id, const Permd__V1__DeleteMixture *m)
{
    if (pd_name_check(m->name)) {
        pd_reply_error(s, id, PD_EINVAL, "name: not a mixture name");
        return;
    }
    pd_mixture_job_start(s, id, NULL, m->name);
}
