/* Request resolution for every request that reads a slice: Fetch, Digest, Stream, Deliver, and readahead. */
#include "daemon/target.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/mix.h"

/* The plan cache refused a new plan or cursor (PD_EBUSY): the plans in use fill plan_cache_bytes. */
static int pd_target_plans_full(pd_plans *plans, char *msg, size_t len)
{
    snprintf(msg, len,
             "plan memory is full: plans and mixtures' cursors take %llu bytes (%llu of them cursors) of "
             "plan_cache_bytes (%llu); retry when some requests are done, or raise plan_cache_bytes",
             (unsigned long long)pd_plans_bytes(plans), (unsigned long long)pd_plans_cursor_bytes(plans),
             (unsigned long long)pd_plans_limit(plans));
    return PD_EBUSY;
}

int pd_target_plan(pd_registry *reg, pd_plans *plans, const pd_dataset *d, uint64_t seed, uint64_t epoch,
                   uint64_t window, uint32_t lanes, pd_plan **out, char *msg, size_t len)
{
    pd_layout *layout;
    if (pd_registry_layout(reg, d->name, &layout)) {
        snprintf(msg, len, "dataset '%s' does not exist", d->name);
        return PD_ENOTFOUND;
    }
    if (layout->shards != d->shards || layout->hash != d->layout_hash) { /* re-put since d was read */
        pd_layout_release(layout);
        snprintf(msg, len, "dataset '%s' was re-defined while the request was resolved: ask again", d->name);
        return PD_ECONFLICT;
    }
    int rc = pd_plans_get(plans, layout, seed, epoch, window ? window : d->window, lanes ? lanes : d->lanes, out);
    pd_layout_release(layout);
    if (rc == PD_EBUSY)
        return pd_target_plans_full(plans, msg, len);
    if (rc)
        snprintf(msg, len, "out of memory");
    return rc ? PD_EINTERNAL : 0;
}

void pd_target_release(pd_target *t)
{
    pd_plan_release(t->plan);
    t->plan = NULL;
}

uint64_t pd_target_cost(const pd_target *t, uint64_t count)
{
    if (!t->mixture)
        return count;
    const uint64_t each = pd_mix_id_cost(t->slice.world);
    const uint64_t ids = count > UINT64_MAX / each ? UINT64_MAX : count * each;
    if (count == 0 || ids == UINT64_MAX)
        return ids;
    const uint64_t first = t->slice.offset + t->slice.rank, reads = (count - 1) * t->slice.world; /* ≤ T: no overflow */
    const uint64_t orders = pd_plan_cursor_missing(t->plan, t->epoch, first, first + reads);
    return orders > UINT64_MAX - ids ? UINT64_MAX : ids + orders;
}

int pd_target_may_block(const pd_target *t)
{
    return t->plan && (!pd_plan_ready(t->plan) || (t->mixture && !pd_plan_cursor_warm(t->plan)));
}

int pd_target_error(pd_plans *plans, int rc, char *msg, size_t len)
{
    if (rc == PD_EBUSY)
        return pd_target_plans_full(plans, msg, len);
    snprintf(msg, len, "generation failed: %s", pd_strerror(rc));
    return PD_EINTERNAL;
}

/* A mixture's ids through a cursor kept with the shared plan: its component orders (a sharded one's
 * O(S_j) plan) serve the next request of the same component epochs. */
static int pd_target_generate_mix(pd_backend *b, const pd_target *t, const pd_slice *slice, uint64_t count,
                                  void *out, uint64_t *written, int *deferred)
{
    pd_mix_cursor *cur;
    int rc = deferred ? pd_plan_cursor_try_take(t->plan, &cur) : pd_plan_cursor_take(t->plan, &cur);
    if (rc)
        return rc;
    if (!cur) { /* the loop's, and no cursor is free to use without blocking */
        *deferred = 1;
        return 0;
    }
    const uint64_t built = cur->built;
    rc = pd_backend_mix_slice(b, cur, t->epoch, slice, count, t->width, out, written);
    if (t->orders_built)
        *t->orders_built += cur->built - built;
    pd_plan_cursor_give(t->plan, cur);
    return rc;
}

/* pd_target_generate, and with deferred (the loop's) pd_target_generate_now. */
static int pd_target_generate_on(pd_backend *b, const pd_target *t, const pd_slice *slice, uint64_t count, void *out,
                                 uint64_t *written, int *deferred)
{
    const pd_shard_plan *plan;
    if (deferred)
        *deferred = 0;
    if (count == 0) { /* a Fetch at the end of its slice: nothing to generate, no plan or cursor to touch */
        *written = 0;
        return 0;
    }
    if (!t->plan)
        return pd_backend_slice(b, &t->perm, slice, count, t->width, out, written);
    if (t->mixture)
        return pd_target_generate_mix(b, t, slice, count, out, written, deferred);
    if (deferred && !pd_plan_ready(t->plan)) { /* defensive: the loop comes here after pd_target_may_block */
        *deferred = 1;
        return 0;
    }
    int rc = pd_plan_use(t->plan, &plan);
    return rc ? rc : pd_backend_shard_slice(b, plan, pd_plan_id(t->plan), slice, count, t->width, out, written);
}

int pd_target_generate(pd_backend *b, const pd_target *t, const pd_slice *slice, uint64_t count, void *out,
                       uint64_t *written)
{
    return pd_target_generate_on(b, t, slice, count, out, written, NULL);
}

int pd_target_generate_now(pd_backend *b, const pd_target *t, const pd_slice *slice, uint64_t count, void *out,
                           uint64_t *written, int *deferred)
{
    return pd_target_generate_on(b, t, slice, count, out, written, deferred);
}

int pd_target_mix_plan(pd_registry *reg, pd_plans *plans, pd_mixdef *def, uint64_t seed, pd_plan **out, char *msg,
                       size_t len)
{
    pd_layout **layouts = calloc(def->components, sizeof *layouts);
    int rc = layouts ? 0 : PD_ENOMEM;
    for (uint32_t j = 0; j < def->components && !rc; j++)
        rc = pd_registry_component(reg, def, j, &layouts[j], msg, len);
    if (rc == 0)
        rc = pd_plans_get_mix(plans, def, layouts, seed, out);
    for (uint32_t j = 0; layouts && j < def->components; j++)
        pd_layout_release(layouts[j]);
    free(layouts);
    if (rc == PD_EBUSY)
        return pd_target_plans_full(plans, msg, len);
    if (rc == PD_ENOMEM) {
        snprintf(msg, len, "out of memory");
        rc = PD_EINTERNAL;
    }
    return rc;
}

/* A slice of mixture def: positions of mixture epoch q->epoch, ids global. */
static int pd_target_resolve_mix(pd_registry *reg, pd_plans *plans, pd_mixdef *def, const pd_slice_req *q,
                                 pd_target *t, char *msg, size_t len)
{
    memset(&t->ds, 0, sizeof t->ds);
    snprintf(t->ds.name, sizeof t->ds.name, "%s", def->name);
    t->ds.size = def->size;
    t->ds.created_ms = def->created_ms;
    t->mixture = 1;
    t->epoch = q->epoch;
    if (q->window || q->lanes) {
        snprintf(msg, len, "window and lanes do not apply to a mixture ('%s'): its components' do", def->name);
        return PD_EINVAL;
    }
    if (q->epoch >= PD_MIX_RUN_END / def->length) { /* (E + 1)·L must not pass 2^63 */
        snprintf(msg, len, "slice.epoch %llu is past the last mixture epoch of '%s' (run positions end at 2^63)",
                 (unsigned long long)q->epoch, def->name);
        return PD_EINVAL;
    }
    pd_epoch_length(def->length, q->world, (pd_mode)q->mode, &t->epoch_len);
    if (q->offset > t->epoch_len) {
        snprintf(msg, len, "slice.offset %llu is past the end of the epoch (%llu positions in %s mode)",
                 (unsigned long long)q->offset, (unsigned long long)t->epoch_len, pd_mode_name((pd_mode)q->mode));
        return PD_EINVAL;
    }
    int rc = pd_target_mix_plan(reg, plans, def, q->seed, &t->plan, msg, len);
    if (rc)
        return rc;
    t->slice.world = q->world;
    t->slice.rank = q->rank;
    t->slice.mode = (pd_mode)q->mode;
    t->slice.offset = q->offset;
    t->width = q->locations ? 16 : pd_id_width(def->size);
    pd_slice_remaining(def->length, &t->slice, &t->remaining);
    return 0;
}

/* A slice of a dataset (flat or sharded), t->ds already found. */
static int pd_target_resolve_set(pd_registry *reg, pd_plans *plans, const pd_slice_req *q, pd_target *t, char *msg,
                                 size_t len)
{
    uint64_t n = t->ds.size;
    pd_epoch_length(n, q->world, (pd_mode)q->mode, &t->epoch_len);
    if (q->offset > t->epoch_len) {
        snprintf(msg, len, "slice.offset %llu is past the end of the epoch (%llu positions in %s mode)",
                 (unsigned long long)q->offset, (unsigned long long)t->epoch_len, pd_mode_name((pd_mode)q->mode));
        return PD_EINVAL;
    }
    if (!t->ds.shards && (q->window || q->lanes || q->locations)) {
        snprintf(msg, len, "window, lanes and locations apply to sharded datasets; '%s' is flat", t->ds.name);
        return PD_EINVAL;
    }
    if (t->ds.shards) {
        int rc = pd_target_plan(reg, plans, &t->ds, q->seed, q->epoch, q->window, q->lanes, &t->plan, msg, len);
        if (rc)
            return rc;
    } else {
        pd_perm_init(&t->perm, q->seed, q->epoch, PD_STREAM_SAMPLES, n);
    }
    t->slice.world = q->world;
    t->slice.rank = q->rank;
    t->slice.mode = (pd_mode)q->mode;
    t->slice.offset = q->offset;
    t->width = q->locations ? 16 : pd_id_width(n);
    pd_slice_remaining(n, &t->slice, &t->remaining);
    return 0;
}

int pd_target_resolve(pd_registry *reg, pd_plans *plans, const pd_slice_req *q, pd_target *t, char *msg,
                      size_t len)
{
    pd_mixdef *def = NULL;
    int rc = PD_EINVAL;
    t->plan = NULL;
    t->orders_built = NULL;
    t->definition = 0;
    t->mixture = 0;
    t->epoch = q->epoch;
    if (pd_name_check(q->dataset)) {
        snprintf(msg, len, "slice.dataset: %s", q->dataset[0] ? "invalid dataset name" : "a dataset name is required");
        return PD_EINVAL;
    }
    if (pd_registry_get(reg, q->dataset, &t->ds) && pd_registry_mixture(reg, q->dataset, &def)) {
        snprintf(msg, len, "dataset '%s' does not exist", q->dataset);
        return PD_ENOTFOUND;
    }
    t->definition = def ? def->definition : pd_dataset_definition(&t->ds);
    if (q->definition && q->definition != t->definition) {
        snprintf(msg, len,
                 "'%s' was re-defined since the client read it (definition %016llx, now %016llx): read its definition "
                 "again",
                 q->dataset, (unsigned long long)q->definition, (unsigned long long)t->definition);
        pd_mixdef_release(def);
        return PD_ECONFLICT;
    }
    if (q->world == 0)
        snprintf(msg, len, "slice.world must be at least 1");
    else if (q->rank >= q->world)
        snprintf(msg, len, "slice.rank %u must be below world %u", q->rank, q->world);
    else if (q->mode < 0)
        snprintf(msg, len, "slice.mode must be MODE_PAD, MODE_DROP or MODE_EXACT");
    else if (def)
        rc = pd_target_resolve_mix(reg, plans, def, q, t, msg, len);
    else
        rc = pd_target_resolve_set(reg, plans, q, t, msg, len);
    pd_mixdef_release(def);
    return rc;
}

int pd_target_current(pd_registry *reg, const pd_target *t, char *msg, size_t len)
{
    pd_dataset d;
    pd_mixdef *def = NULL;
    uint64_t now;
    if (t->mixture ? pd_registry_mixture(reg, t->ds.name, &def) : pd_registry_get(reg, t->ds.name, &d)) {
        snprintf(msg, len, "'%s' was deleted", t->ds.name);
        return PD_ENOTFOUND;
    }
    now = def ? def->definition : pd_dataset_definition(&d);
    pd_mixdef_release(def);
    if (now == t->definition)
        return 0;
    snprintf(msg, len, "'%s' was re-defined (definition %016llx, now %016llx)", t->ds.name,
             (unsigned long long)t->definition, (unsigned long long)now);
    return PD_ECONFLICT;
}

uint64_t pd_target_next_offset(const pd_target *t, uint64_t offset, uint64_t got)
{
    /* offset ≤ T ≤ 2^63 + 2^32 and got·W ≤ T: no overflow */
    uint64_t next = offset + got * t->slice.world;
    return next < t->epoch_len ? next : t->epoch_len;
}
