/* Fetch, Digest and Inverse: answered on the loop within its inline budget, else by a worker-pool job. */
#include "daemon/fetch.h"

#include <stdlib.h>
#include <string.h>

#include "core/digest.h"
#include "core/error.h"
#include "daemon/job.h"
#include "daemon/mixdef.h"
#include "daemon/readahead.h"
#include "daemon/registry.h"
#include "daemon/reply.h"
#include "daemon/target.h"

/* ---- Fetch ------------------------------------------------------------------------------------ */

/* Reply to request id with the typed error of a failed generation (pd_target_error: plans full, or internal). */
static void pd_reply_generation_error(pd_session *s, uint64_t id, int rc)
{
    char msg[256];
    const int code = pd_target_error(s->svc->plans, rc, msg, sizeof msg);
    pd_reply_error(s, id, code, "%s", msg);
}

/* A Fetch too large for the loop: the frame is built in its own buffer and leaves as one owned write. */
typedef struct pd_fetch_job {
    pd_job job;
    pd_session *s;
    uint64_t id, count;
    pd_target t; /* owns its plan reference */
    pd_bulk bulk;
    int rc;
} pd_fetch_job;

static void pd_fetch_job_run(pd_job *job)
{
    pd_fetch_job *j = (pd_fetch_job *)job;
    uint64_t got;
    j->rc = pd_target_generate(j->s->svc->backend, &j->t, &j->t.slice, j->count, j->bulk.payload, &got);
    if (j->rc == 0 && got != j->count)
        j->rc = PD_EINTERNAL;
}

static void pd_fetch_job_done(pd_job *job)
{
    pd_fetch_job *j = (pd_fetch_job *)job;
    pd_session *s = j->s;
    if (!pd_conn_open(s->conn)) {
        free(j->bulk.base);
    } else if (j->rc) {
        free(j->bulk.base);
        pd_reply_generation_error(s, j->id, j->rc);
    } else {
        s->loop->stats.ids_served_total += j->count;
        pd_conn_write_owned(s->conn, j->bulk.base, j->bulk.cap, j->bulk.frame, j->bulk.frame_len);
    }
    pd_target_release(&j->t);
    free(j);
}

void pd_on_fetch(pd_session *s, uint64_t id, const Permd__V1__Fetch *m)
{
    pd_target t;
    if (pd_reply_slice(s, id, m->slice, m->locations, &t))
        return;
    uint64_t count = m->count;
    if (pd_reply_count(s, id, count, "count")) {
        pd_target_release(&t);
        return;
    }
    uint64_t got = count < t.remaining ? count : t.remaining;
    size_t bytes = (size_t)got * t.width;
    Permd__V1__FetchReply head = PERMD__V1__FETCH_REPLY__INIT;
    head.id_width = t.width;
    head.count = got;
    head.next_offset = pd_target_next_offset(&t, t.slice.offset, got);
    head.remaining = t.remaining - got;
    uint8_t hdr[PD_BULK_HDR_MAX];
    size_t hlen;
    if (pd_reply_bulk_header(s, id, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, &head.base, bytes, hdr, &hlen)) {
        pd_target_release(&t);
        return;
    }

    /* Requests within this loop iteration's inline budget run on the loop: a thread hop costs more
     * than generating them. The rest go to the pool, so big requests spread over every core while
     * the loop moves bytes. A sharded plan not built yet always goes to the pool. */
    const uint8_t *ahead = got ? pd_readahead_find(s, &t, count, got) : NULL; /* generated while the loop was idle */
    int deferred = 0;
    if (got == 0 || ahead || (!pd_target_may_block(&t) && pd_loop_take_inline(s->loop, pd_target_cost(&t, got)))) {
        int rc = pd_reply_bulk_inline(s, hdr, hlen, &t, &t.slice, got, ahead, &deferred);
        if (deferred) {
            s->loop->stats.inline_deferred++;
        } else if (rc == 0) {
            s->loop->stats.ids_served_total += got;
            s->loop->stats.readahead_hits += ahead != NULL;
            pd_readahead_note(s, &t, count, got, head.remaining);
        } else {
            pd_reply_generation_error(s, id, rc);
        }
        if (!deferred) {
            pd_target_release(&t);
            return;
        }
    }

    pd_fetch_job *j = calloc(1, sizeof *j);
    if (!j || pd_bulk_alloc(&j->bulk, s->conn, hdr, hlen, bytes)) {
        free(j);
        pd_target_release(&t);
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    j->s = s;
    j->id = id;
    j->count = got;
    j->t = t;
    if (pd_job_submit_request(&j->job, s->conn, pd_fetch_job_run, pd_fetch_job_done, j->bulk.frame_len)) {
        pd_target_release(&t);
        free(j->bulk.base);
        free(j);
        pd_reply_error(s, id, PD_EINTERNAL, "cannot queue work");
    }
}

/* ---- Digest: the rank's next ids (or all it has left), reduced to (count, sum, hash) ------------ */

/* A digest runs in slices of job_slice_ids: each slice is one turn on a worker, so a long digest
 * waits behind other connections' work between two turns instead of holding a worker for seconds. */
typedef struct pd_digest_job {
    pd_job job;
    pd_session *s;
    uint64_t id, count; /* count: ids to digest, ≤ max_digest */
    uint64_t left;      /* of them, not digested yet */
    uint64_t slice_ids; /* ids per turn */
    pd_slice cur;       /* where the next turn starts */
    pd_target t;
    pd_digest d;        /* what the turns so far added up to */
    int rc;
} pd_digest_job;

static void pd_digest_job_run(pd_job *job)
{
    pd_digest_job *j = (pd_digest_job *)job;
    enum { CHUNK = 1 << 16 };
    uint64_t *ids = malloc(CHUNK * sizeof *ids), got;
    uint64_t turn = j->left < j->slice_ids ? j->left : j->slice_ids;
    if (!ids) {
        j->rc = PD_ENOMEM;
        return;
    }
    while (turn && !j->rc) {
        if (pd_job_cancelled(job)) { /* permd is stopping, or the reply has nowhere to go */
            j->rc = PD_ECLOSED;
            break;
        }
        j->rc = pd_target_generate(j->s->svc->backend, &j->t, &j->cur, turn < CHUNK ? turn : CHUNK, ids, &got);
        for (uint64_t i = 0; i < got && !j->rc; i++)
            pd_digest_add(&j->d, pd_load_le64((const uint8_t *)&ids[i]));
        turn -= got;
        j->left -= got;
        j->cur.offset += got * j->cur.world; /* more remain, so this stays ≤ T */
    }
    free(ids);
}

static void pd_digest_job_done(pd_job *job)
{
    pd_digest_job *j = (pd_digest_job *)job;
    pd_session *s = j->s;
    if (j->rc == 0 && j->left && pd_conn_open(s->conn) && (j->rc = pd_job_continue(job)) == 0)
        return; /* the next turn is queued behind what others asked meanwhile */
    /* (not queued: j->rc says why, so a partial digest is never answered as the whole) */
    if (pd_conn_open(s->conn)) {
        if (j->rc == PD_ECLOSED) {
            pd_reply_error(s, j->id, PD_EUNAVAILABLE, "digest cancelled: permd is stopping");
        } else if (j->rc == PD_EBUSY) { /* no room for a mixture's cursor */
            pd_reply_generation_error(s, j->id, j->rc);
        } else if (j->rc) {
            pd_reply_error(s, j->id, PD_EINTERNAL, "digest failed: %s", pd_strerror(j->rc));
        } else {
            Permd__V1__DigestReply r = PERMD__V1__DIGEST_REPLY__INIT;
            r.count = j->d.count;
            r.sum = j->d.sum;
            r.hash = j->d.hash;
            r.next_offset = pd_target_next_offset(&j->t, j->t.slice.offset, j->count);
            r.remaining = j->t.remaining - j->count;
            pd_reply(s, j->id, PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY, &r);
        }
    }
    pd_target_release(&j->t);
    free(j);
}

void pd_on_digest(pd_session *s, uint64_t id, const Permd__V1__Digest *m)
{
    uint64_t max = s->svc->cfg->max_digest;
    pd_digest_job *j = calloc(1, sizeof *j);
    if (!j) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    if (pd_reply_slice(s, id, m->slice, 0, &j->t)) {
        free(j);
        return;
    }
    j->count = m->count && m->count < j->t.remaining ? m->count : j->t.remaining;
    if (j->count > max) {
        /* Generating them would hold a worker for a long time: the client asks in parts. */
        pd_reply_error(s, id, PD_ETOOBIG,
                       "a digest of %llu ids exceeds max_digest (%llu); digest in parts with count, "
                       "each from the previous next_offset, and add them",
                       (unsigned long long)j->count, (unsigned long long)max);
        pd_target_release(&j->t);
        free(j);
        return;
    }
    j->s = s;
    j->id = id;
    j->left = j->count;
    j->slice_ids = s->svc->cfg->job_slice_ids;
    j->cur = j->t.slice;
    j->t.width = 8; /* host-order u64s: the digest mixes values, not wire bytes */
    pd_digest_init(&j->d);
    if (pd_job_submit_request(&j->job, s->conn, pd_digest_job_run, pd_digest_job_done, 128)) {
        pd_target_release(&j->t);
        free(j);
        pd_reply_error(s, id, PD_EINTERNAL, "cannot queue work");
    }
}

/* ---- Inverse ---------------------------------------------------------------------------------- */

typedef struct pd_inverse {
    pd_perm perm;
    pd_plan *plan; /* sharded datasets and mixtures (a reference) */
    int mixture;   /* plan is a mixture's */
    uint32_t world;
    uint64_t keep; /* positions ≥ keep are dropped (drop mode), else n (L for a mixture) */
    unsigned width;
    const uint8_t *samples;
    const uint64_t *comp_epochs; /* a mixture's: each sample's component epoch */
    uint64_t count;
    uint8_t *positions, *ranks;
    uint64_t *epochs;            /* a mixture's: the mixture epoch that draws each */
    uint64_t cost;               /* in flat ids (the inline budget's unit): count, plus a mixture's order builds */
    pd_counter *orders_built;    /* a mixture's: the loop's mix_orders_built */
    const pd_job *job;           /* on a worker: the job, to notice cancellation; NULL inline */
    uint64_t slice;              /* a mixture's on a worker: the cost one turn may spend (0: no limit) */
    uint64_t next;               /* a mixture's: samples done (the turns so far) */
    int rc;                      /* a mixture's: no cursor (PD_EBUSY, PD_ENOMEM), or cancelled (PD_ECLOSED) */
    int deferred;                /* a mixture's inline: no cursor free without blocking the loop (a worker's turn) */
} pd_inverse;

/* A mixture's inverse (spec §7): each global id and component epoch to (mixture epoch, position),
 * through a cursor kept with the plan, from sample v->next on until all are done or this turn has
 * spent v->slice (a sample costs 1, an order built S_j: pd_inverse_mix_cost's units); v->next says
 * where it stopped. On a worker it stops (v->rc = PD_ECLOSED) when the job is cancelled, checked
 * after each order built. */
static void pd_inverse_compute_mix(pd_inverse *v)
{
    const pd_mix *mix;
    pd_mix_cursor *cur;
    /* Inline, the loop takes an idle cursor or none (pd_plan_cursor_try_take); a worker may wait or build. */
    if ((v->rc = v->job ? pd_plan_cursor_take(v->plan, &cur) : pd_plan_cursor_try_take(v->plan, &cur)))
        return;
    if (!cur) {
        v->deferred = 1;
        return;
    }
    mix = cur->mix;
    uint64_t built = cur->built, spent = 0;
    for (uint64_t i = v->next; i < v->count; i++, v->next = i) {
        if (v->slice && spent >= v->slice)
            break; /* the job goes on in another turn (pd_job_continue), behind others' work */
        uint64_t g = v->width == 4 ? pd_load_le32(v->samples + 4 * i) : pd_load_le64(v->samples + 8 * i);
        uint64_t j = pd__last_at_most(mix->offset, 1, 0, mix->components, g), e = UINT64_MAX, p = UINT64_MAX;
        const uint64_t before = cur->built;
        if (pd_mix_position(cur, j, g - mix->offset[j], v->comp_epochs[i], &e, &p)) /* never drawn */
            e = p = UINT64_MAX;
        v->epochs[i] = e;
        pd_store_le64(v->positions + 8 * i, p);
        pd_store_le32(v->ranks + 4 * i, p < v->keep ? (uint32_t)(p % v->world) : UINT32_MAX);
        spent += 1 + (cur->built != before ? mix->comp[j].shards : 0);
        if (v->job && cur->built != before && pd_job_cancelled(v->job)) { /* permd is stopping */
            v->rc = PD_ECLOSED;
            break;
        }
    }
    if (v->orders_built)
        *v->orders_built += cur->built - built;
    pd_plan_cursor_give(v->plan, cur);
}

static void pd_inverse_compute(pd_inverse *v)
{
    const pd_shard_plan *plan = NULL;
    if (v->mixture) {
        pd_inverse_compute_mix(v);
        return;
    }
    if (v->plan && pd_plan_use(v->plan, &plan))
        return; /* out of memory building the plan: pd_send_inverse reports it */
    for (uint64_t i = 0; i < v->count; i++) {
        uint64_t smp = v->width == 4 ? pd_load_le32(v->samples + 4 * i) : pd_load_le64(v->samples + 8 * i), p;
        if (plan)
            pd_shard_position(plan, smp, &p);
        else
            p = pd_perm_inv(&v->perm, smp);
        if (v->width == 4)
            pd_store_le32(v->positions + 4 * i, (uint32_t)p);
        else
            pd_store_le64(v->positions + 8 * i, p);
        pd_store_le32(v->ranks + 4 * i, p < v->keep ? (uint32_t)(p % v->world) : UINT32_MAX);
    }
}

static void pd_send_inverse(pd_session *s, uint64_t id, const pd_inverse *v)
{
    if (v->rc == PD_ECLOSED) {
        pd_reply_error(s, id, PD_EUNAVAILABLE, "inverse cancelled: permd is stopping");
        return;
    }
    if (v->rc == PD_EBUSY) { /* no room for the mixture's cursor */
        pd_reply_generation_error(s, id, v->rc);
        return;
    }
    if (v->rc && v->rc != PD_ENOMEM) { /* a turn could not be queued */
        pd_reply_error(s, id, PD_EINTERNAL, "inverse failed: %s", pd_strerror(v->rc));
        return;
    }
    if ((v->plan && !pd_plan_ready(v->plan)) || v->rc) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory building the %s plan", v->mixture ? "mixture" : "shard");
        return;
    }
    unsigned pwidth = v->mixture ? 8 : v->width; /* a mixture's positions are below L, which may pass 2^32 */
    Permd__V1__InverseReply r = PERMD__V1__INVERSE_REPLY__INIT;
    r.id_width = pwidth;
    r.count = v->count;
    r.positions.data = v->positions;
    r.positions.len = (size_t)v->count * pwidth;
    if (v->mixture) {
        r.n_epochs = v->count;
        r.epochs = v->epochs;
    }
    r.ranks.data = v->ranks;
    r.ranks.len = (size_t)v->count * 4;
    int rc = pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_INVERSE_REPLY, &r);
    if (rc == PD_ETOOBIG)
        pd_reply_error(s, id, PD_ETOOBIG, "a reply of %llu samples would exceed a frame's %u bytes; ask in pieces",
                       (unsigned long long)v->count, PD_FRAME_MAX_LIMIT);
    else if (rc)
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
}

/* While the connection is busy no other frame is read, so the request (and these buffers) stay
 * valid in its session's arena until the job is done. */
typedef struct pd_inverse_job {
    pd_job job;
    pd_session *s;
    uint64_t id;
    pd_inverse v;
} pd_inverse_job;

static void pd_inverse_job_run(pd_job *job)
{
    pd_inverse_job *j = (pd_inverse_job *)job;
    j->v.job = job;
    pd_inverse_compute(&j->v);
}

/* What a mixture's inverse of v's samples (checked below def->size) costs, in flat ids, into v->cost: one
 * a sample, plus S_j for each sharded order a cold cursor would build (a cursor keeps two component
 * epochs a component, one of each parity), so that requests naming many component epochs of a sharded
 * component go to a worker. Scratch in arena. O(count·log C). PD_ENOMEM. */
static int pd_inverse_mix_cost(const pd_mixdef *def, pd_inverse *v, pd_arena *arena)
{
    const uint32_t n = def->components;
    uint64_t *offset = pd_arena_alloc(arena, (size_t)(n + 1) * sizeof *offset); /* o_j, then N */
    uint64_t *held = pd_arena_alloc(arena, (size_t)2 * n * sizeof *held);        /* epoch + 1 per slot, 0: none */
    if (!offset || !held)
        return PD_ENOMEM;
    offset[0] = 0;
    for (uint32_t j = 0; j < n; j++) {
        offset[j + 1] = offset[j] + def->comp[j].size;
        held[2 * j] = held[2 * j + 1] = 0;
    }
    v->cost = v->count;
    for (uint64_t i = 0; i < v->count; i++) {
        uint64_t g = v->width == 4 ? pd_load_le32(v->samples + 4 * i) : pd_load_le64(v->samples + 8 * i);
        uint64_t j = pd__last_at_most(offset, 1, 0, n, g), e = v->comp_epochs[i];
        uint64_t *slot = &held[2 * j + (e & 1)];
        if (!def->comp[j].shards || *slot == e + 1)
            continue;
        *slot = e + 1; /* e = 2^64 − 1 is refused later (PD_ERANGE), so never held: counted, harmlessly */
        v->cost = v->cost > UINT64_MAX - def->comp[j].shards ? UINT64_MAX : v->cost + def->comp[j].shards;
    }
    return 0;
}

/* Inverse on a mixture: samples are global ids, each with its component epoch. */
static int pd_inverse_mix_setup(pd_session *s, uint64_t id, const Permd__V1__Inverse *m, pd_mixdef *def, int mode,
                                pd_inverse *v)
{
    const pd_service *svc = s->svc;
    char msg[256];
    v->mixture = 1;
    v->width = pd_id_width(def->size);
    if (m->samples.len % v->width) {
        pd_reply_error(s, id, PD_EINVAL, "samples holds %zu bytes, not a multiple of id_width %u", m->samples.len,
                       v->width);
        return PD_EINVAL;
    }
    v->count = m->samples.len / v->width;
    if (pd_reply_count(s, id, v->count, "samples"))
        return PD_ETOOBIG;
    if (m->n_component_epochs != v->count) {
        pd_reply_error(s, id, PD_EINVAL,
                       "a mixture's inverse needs each sample's component epoch: %zu component_epochs for %llu "
                       "samples",
                       m->n_component_epochs, (unsigned long long)v->count);
        return PD_EINVAL;
    }
    if (m->window || m->lanes) {
        pd_reply_error(s, id, PD_EINVAL, "window and lanes do not apply to a mixture ('%s')", def->name);
        return PD_EINVAL;
    }
    v->samples = m->samples.data;
    v->comp_epochs = m->component_epochs;
    for (uint64_t i = 0; i < v->count; i++) {
        uint64_t g = v->width == 4 ? pd_load_le32(v->samples + 4 * i) : pd_load_le64(v->samples + 8 * i);
        if (g >= def->size) {
            pd_reply_error(s, id, PD_EINVAL, "samples[%llu] = %llu is not below the mixture's size %llu",
                           (unsigned long long)i, (unsigned long long)g, (unsigned long long)def->size);
            return PD_EINVAL;
        }
    }
    if (pd_inverse_mix_cost(def, v, &s->arena)) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return PD_ENOMEM;
    }
    /* Each component epoch of a sharded component costs an order of its shards: a request of max_count samples
     * at as many epochs of a component of 200,000 shards held a worker for hours. */
    if (v->cost > svc->cfg->max_inverse_work) {
        pd_reply_error(s, id, PD_ETOOBIG,
                       "this inverse would take the work of %llu ids (%llu samples, and the orders of their sharded "
                       "components' epochs), past max_inverse_work (%llu): ask in parts, fewer samples or fewer "
                       "component epochs at once",
                       (unsigned long long)v->cost, (unsigned long long)v->count,
                       (unsigned long long)svc->cfg->max_inverse_work);
        return PD_ETOOBIG;
    }
    int rc = pd_target_mix_plan(svc->reg, svc->plans, def, m->seed, &v->plan, msg, sizeof msg);
    if (rc) {
        pd_reply_error(s, id, rc, "%s", msg);
        return rc;
    }
    v->world = m->world;
    v->keep = def->length;
    if (mode == PD_MODE_DROP)
        pd_epoch_length(def->length, m->world, PD_MODE_DROP, &v->keep);
    v->positions = pd_arena_alloc(&s->arena, (size_t)v->count * 8 + 1);
    v->ranks = pd_arena_alloc(&s->arena, (size_t)v->count * 4 + 1);
    v->epochs = pd_arena_alloc(&s->arena, (size_t)v->count * 8 + 8);
    if (!v->positions || !v->ranks || !v->epochs) {
        pd_plan_release(v->plan);
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return PD_ENOMEM;
    }
    return 0;
}

static void pd_inverse_job_done(pd_job *job)
{
    pd_inverse_job *j = (pd_inverse_job *)job;
    pd_session *s = j->s;
    /* A mixture's inverse goes in turns: the next one is queued behind what others asked meanwhile,
     * unless the peer has left (pd_job_continue closes the connection: nobody to answer). */
    if (j->v.mixture && j->v.rc == 0 && j->v.next < j->v.count && pd_conn_open(s->conn) &&
        (j->v.rc = pd_job_continue(job)) == 0)
        return;
    if (pd_conn_open(s->conn))
        pd_send_inverse(s, j->id, &j->v);
    pd_plan_release(j->v.plan);
    free(j);
    /* The request and the reply's buffers (pd_arena_keep): its connection was busy, so nothing else is
     * in the arena; an idle connection keeps none of it. */
    pd_arena_reset(&s->arena);
}

void pd_on_inverse(pd_session *s, uint64_t id, const Permd__V1__Inverse *m)
{
    const pd_service *svc = s->svc;
    pd_dataset d;
    pd_inverse v = {0};
    int mode = -1;
    if (pd_name_check(m->dataset)) {
        pd_reply_error(s, id, PD_EINVAL, "dataset: %s",
                       m->dataset[0] ? "invalid dataset name" : "a dataset name is required");
        return;
    }
    pd_mixdef *def = NULL;
    if (pd_registry_get(svc->reg, m->dataset, &d) && pd_registry_mixture(svc->reg, m->dataset, &def)) {
        pd_reply_error(s, id, PD_ENOTFOUND, "dataset '%s' does not exist", m->dataset);
        return;
    }
    if (m->world == 0 || (m->mode != PERMD__V1__MODE__MODE_UNSPECIFIED && pd_wire_mode_to_pd(m->mode, &mode))) {
        pd_reply_error(s, id, PD_EINVAL, "%s", m->world == 0 ? "world must be at least 1"
                                                           : "mode must be unspecified, MODE_PAD, MODE_DROP or MODE_EXACT");
        pd_mixdef_release(def);
        return;
    }
    if (def) {
        int rc = pd_inverse_mix_setup(s, id, m, def, mode, &v);
        pd_mixdef_release(def);
        if (rc)
            return;
        goto run;
    }
    v.width = pd_id_width(d.size);
    if (m->samples.len % v.width) {
        pd_reply_error(s, id, PD_EINVAL, "samples holds %zu bytes, not a multiple of id_width %u", m->samples.len,
                       v.width);
        return;
    }
    v.count = m->samples.len / v.width;
    if (pd_reply_count(s, id, v.count, "samples"))
        return;
    v.samples = m->samples.data;
    for (uint64_t i = 0; i < v.count; i++) {
        uint64_t smp = v.width == 4 ? pd_load_le32(v.samples + 4 * i) : pd_load_le64(v.samples + 8 * i);
        if (smp >= d.size) {
            pd_reply_error(s, id, PD_EINVAL, "samples[%llu] = %llu is not below the dataset size %llu",
                           (unsigned long long)i, (unsigned long long)smp, (unsigned long long)d.size);
            return;
        }
    }
    if (!d.shards && (m->window || m->lanes)) {
        pd_reply_error(s, id, PD_EINVAL, "window and lanes apply to sharded datasets; '%s' is flat", d.name);
        return;
    }
    char msg[256];
    if (d.shards) {
        int rc = pd_target_plan(svc->reg, svc->plans, &d, m->seed, m->epoch, m->window, m->lanes, &v.plan, msg,
                                sizeof msg);
        if (rc) {
            pd_reply_error(s, id, rc, "%s", msg);
            return;
        }
    } else {
        pd_perm_init(&v.perm, m->seed, m->epoch, PD_STREAM_SAMPLES, d.size);
    }
    v.world = m->world;
    v.keep = d.size;
    if (mode == PD_MODE_DROP)
        pd_epoch_length(d.size, m->world, PD_MODE_DROP, &v.keep);
    v.positions = pd_arena_alloc(&s->arena, (size_t)v.count * v.width + 1);
    v.ranks = pd_arena_alloc(&s->arena, (size_t)v.count * 4 + 1);
    if (!v.positions || !v.ranks) {
        pd_plan_release(v.plan);
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
run:
    if (!v.mixture)
        v.cost = v.count;
    v.orders_built = &s->loop->stats.mix_orders_built;
    /* Inline only with the plan built and, for a mixture, a cursor idle (a sharded one's orders start from it). */
    if ((!v.plan || (pd_plan_ready(v.plan) && (!v.mixture || pd_plan_cursor_warm(v.plan)))) &&
        pd_loop_take_inline(s->loop, v.cost)) {
        pd_inverse_compute(&v);
        if (!v.deferred) {
            pd_send_inverse(s, id, &v);
            pd_plan_release(v.plan);
            return;
        }
        s->loop->stats.inline_deferred++; /* a worker's, from its first sample */
        v.deferred = 0;
    }
    pd_inverse_job *j = calloc(1, sizeof *j);
    if (!j) {
        pd_plan_release(v.plan);
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    j->s = s;
    j->id = id;
    j->v = v;
    j->v.slice = svc->cfg->job_slice_ids;
    if (pd_job_submit_request(&j->job, s->conn, pd_inverse_job_run, pd_inverse_job_done,
                              (size_t)v.count * (v.width + 4))) {
        pd_plan_release(v.plan);
        free(j);
        pd_reply_error(s, id, PD_EINTERNAL, "cannot queue work");
        return;
    }
    pd_arena_keep(&s->arena); /* the job reads the samples and writes the reply there: its done lets go */
}
