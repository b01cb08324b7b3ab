/* Plan cache: a short LRU list under a mutex; each plan builds once under its own lock, readers then share it. */
#include "daemon/plans.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/error.h"

struct pd_plan {
    _Atomic unsigned refs;   /* the cache's list holds one while listed */
    pd_plans *cache;         /* whose byte count its table is in */
    uint64_t id;             /* unique for the process's life: the GPU's plan cache key */
    uint64_t seed;
    pthread_mutex_t build;   /* held while the table is computed */
    _Atomic int ready;
    void *mem;               /* the table */
    size_t bytes;            /* of mem, once built */
    /* A sharded epoch (mixdef NULL) ... */
    pd_layout *layout;
    uint64_t epoch, window, lanes;
    pd_shard_plan plan;
    /* ... or a mixture: its definition (the key, by identity), its components (with their layouts). */
    pd_mixdef *mixdef;
    pd_layout **layouts;     /* C, NULL for flat components */
    pd_mix_component *comps; /* C */
    pd_mix mix;
    pd_plan *next;           /* LRU order, most recent first */
};

struct pd_plans {
    pthread_mutex_t lock;
    pd_plan *head;
    unsigned n, max;
    uint64_t max_bytes;
    _Atomic uint64_t bytes; /* tables built and alive, listed or still in use */
    uint64_t next_id;
};

/* Drop least recently used plans (the list's reference) until at most max entries and max_bytes
 * of tables are listed, keeping the most recent. Caller holds c->lock. */
static void pd_plans_trim(pd_plans *c)
{
    while (c->n > 1 && (c->n > c->max || atomic_load(&c->bytes) > c->max_bytes)) {
        pd_plan **last = &c->head;
        while ((*last)->next)
            last = &(*last)->next;
        pd_plan *old = *last;
        *last = NULL;
        c->n--;
        pd_plan_release(old);
    }
}

int pd_plans_open(unsigned max_entries, uint64_t max_bytes, pd_plans **out)
{
    pd_plans *c = calloc(1, sizeof *c);
    if (!c)
        return PD_ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    c->max = max_entries ? max_entries : 1;
    c->max_bytes = max_bytes;
    *out = c;
    return 0;
}

void pd_plans_close(pd_plans *c)
{
    if (!c)
        return;
    while (c->head) {
        pd_plan *p = c->head;
        c->head = p->next;
        pd_plan_release(p);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}

uint64_t pd_plans_bytes(pd_plans *c)
{
    return c ? atomic_load(&c->bytes) : 0;
}

pd_plan *pd_plan_ref(pd_plan *p)
{
    if (p)
        atomic_fetch_add(&p->refs, 1);
    return p;
}

void pd_plan_release(pd_plan *p)
{
    if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    if (p->mem)
        atomic_fetch_sub(&p->cache->bytes, p->bytes);
    pd_layout_release(p->layout);
    if (p->mixdef) {
        for (uint32_t j = 0; j < p->mixdef->components; j++)
            pd_layout_release(p->layouts[j]);
        pd_mixdef_release(p->mixdef);
    }
    free(p->layouts);
    free(p->comps);
    pthread_mutex_destroy(&p->build);
    free(p->mem);
    free(p);
}

/* The listed plan matching the key (moved to the front, with a new reference), or NULL. Caller
 * holds c->lock. */
static pd_plan *pd_plans_find(pd_plans *c, const pd_layout *layout, const pd_mixdef *mixdef, uint64_t seed,
                              uint64_t epoch, uint64_t window, uint64_t lanes)
{
    for (pd_plan **link = &c->head, *p; (p = *link); link = &p->next) {
        if (p->layout == layout && p->mixdef == mixdef && p->seed == seed && p->epoch == epoch &&
            p->window == window && p->lanes == lanes) {
            *link = p->next; /* move to the front */
            p->next = c->head;
            c->head = p;
            return pd_plan_ref(p);
        }
    }
    return NULL;
}

/* A new unbuilt plan (two references: the list's and the caller's), listed at the front. Caller
 * holds c->lock. */
static pd_plan *pd_plans_add(pd_plans *c, uint64_t seed)
{
    pd_plan *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    atomic_init(&p->refs, 2);
    atomic_init(&p->ready, 0);
    pthread_mutex_init(&p->build, NULL);
    p->cache = c;
    p->id = ++c->next_id;
    p->seed = seed;
    p->next = c->head;
    c->head = p;
    c->n++;
    pd_plans_trim(c);
    return p;
}

int pd_plans_get(pd_plans *c, pd_layout *layout, uint64_t seed, uint64_t epoch, uint64_t window, uint64_t lanes,
                 pd_plan **out)
{
    pthread_mutex_lock(&c->lock);
    pd_plan *p = pd_plans_find(c, layout, NULL, seed, epoch, window, lanes);
    if (!p && (p = pd_plans_add(c, seed))) {
        p->layout = pd_layout_ref(layout);
        p->epoch = epoch;
        p->window = window;
        p->lanes = lanes;
    }
    pthread_mutex_unlock(&c->lock);
    *out = p;
    return p ? 0 : PD_ENOMEM;
}

int pd_plans_get_mix(pd_plans *c, pd_mixdef *def, pd_layout *const *layouts, uint64_t seed, pd_plan **out)
{
    uint32_t n = def->components;
    pd_layout **refs = calloc(n, sizeof *refs);
    pd_mix_component *comps = calloc(n, sizeof *comps);
    if (!refs || !comps) {
        free(refs);
        free(comps);
        return PD_ENOMEM;
    }
    pthread_mutex_lock(&c->lock);
    pd_plan *p = pd_plans_find(c, NULL, def, seed, 0, 0, 0);
    if (!p && (p = pd_plans_add(c, seed))) {
        p->mixdef = pd_mixdef_ref(def);
        for (uint32_t j = 0; j < n; j++) {
            refs[j] = pd_layout_ref(layouts[j]);
            comps[j].size = def->comp[j].size;
            comps[j].window = refs[j] ? def->comp[j].window : 1;
            comps[j].lanes = refs[j] ? def->comp[j].lanes : 1;
            if (refs[j]) {
                comps[j].shard_start = refs[j]->start;
                comps[j].shards = refs[j]->shards;
            }
        }
        p->layouts = refs;
        p->comps = comps;
        refs = NULL;
        comps = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    free(refs);
    free(comps);
    *out = p;
    return p ? 0 : PD_ENOMEM;
}

uint64_t pd_plan_id(const pd_plan *p)
{
    return p->id;
}

int pd_plan_ready(pd_plan *p)
{
    return atomic_load(&p->ready);
}

/* Build the table once (under the plan's build lock), count its bytes, and trim the cache. */
static int pd_plan_build(pd_plan *p)
{
    int rc = 0;
    if (atomic_load(&p->ready))
        return 0;
    pthread_mutex_lock(&p->build);
    if (!atomic_load(&p->ready)) {
        const pd_mixdef *d = p->mixdef;
        size_t bytes = d ? pd_mix_bytes(d->components, d->stages) : pd_shard_plan_bytes(p->layout->shards);
        if (!(p->mem = malloc(bytes)))
            rc = PD_ENOMEM;
        else if (d)
            rc = pd_mix_init(&p->mix, p->seed, p->comps, d->components, d->length, d->block, d->starts, d->weights,
                             d->stages, p->mem, bytes);
        else
            rc = pd_shard_plan_init(&p->plan, p->layout->start, p->layout->shards, p->seed, p->epoch, p->window,
                                    p->lanes, p->mem, bytes);
        if (rc) {
            free(p->mem);
            p->mem = NULL;
        } else {
            p->bytes = bytes;
            atomic_fetch_add(&p->cache->bytes, bytes);
            atomic_store(&p->ready, 1);
        }
    }
    pthread_mutex_unlock(&p->build);
    if (rc == 0) { /* the new table may put the cache over its bytes */
        pthread_mutex_lock(&p->cache->lock);
        pd_plans_trim(p->cache);
        pthread_mutex_unlock(&p->cache->lock);
    }
    return rc;
}

int pd_plan_use(pd_plan *p, const pd_shard_plan **out)
{
    int rc = p->mixdef ? PD_EINVAL : pd_plan_build(p);
    *out = rc ? NULL : &p->plan;
    return rc;
}

int pd_plan_use_mix(pd_plan *p, const pd_mix **out)
{
    int rc = p->mixdef ? pd_plan_build(p) : PD_EINVAL;
    *out = rc ? NULL : &p->mix;
    return rc;
}
