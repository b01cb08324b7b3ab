/* Plan cache: a short LRU list under a mutex, charged against one byte bound; each plan builds once under its own lock, readers then share it. */
#include "daemon/plans.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* How many idle cursors a mixture plan keeps for the next requests (more given back are freed). */
#define PD_PLAN_CURSORS_KEPT 4

/* A mixture's cursor and its orders, kept with its plan between requests. */
typedef struct pd_plan_cursor {
    pd_mix_cursor cur;           /* first: a pd_mix_cursor * handed out is one of these */
    size_t bytes;                /* charged: this struct and the orders */
    struct pd_plan_cursor *next; /* the plan's idle list */
} pd_plan_cursor;

struct pd_plan {
    _Atomic unsigned refs;   /* the cache's list holds one while listed */
    pd_plans *cache;         /* whose byte count its table is in */
    uint64_t id;             /* unique for the process's life: the GPU's plan cache key */
    uint64_t seed;
    size_t size;             /* its table's bytes, known before it is built */
    pthread_mutex_t build;   /* held while the table is computed */
    _Atomic int ready;
    void *mem;               /* the table */
    /* Under the cache's lock: */
    int charged;             /* size is counted in the cache's bytes (admitted, built or to be) */
    int listed;              /* in the cache's list (it then holds a reference) */
    unsigned idle;           /* of the references, those of holders that do not use it now (pd_plan_idle) */
    /* A sharded epoch (mixdef NULL) ... */
    pd_layout *layout;
    uint64_t epoch, window, lanes;
    pd_shard_plan plan;
    /* ... or a mixture: its definition (the key, by identity), its components (with their layouts). */
    pd_mixdef *mixdef;
    pd_layout **layouts;     /* C, NULL for flat components */
    pd_mix_component *comps; /* C */
    pd_mix mix;
    /* Under the cache's lock: a mixture's cursors (their orders are not in size). */
    pd_plan_cursor *cursors; /* idle, most recently given first */
    unsigned ncursors;       /* idle ones */
    uint64_t cursor_bytes;   /* charged for its cursors, idle or taken */
    int sharded;             /* a component is sharded: a cold cursor builds O(S_j) orders */
    pd_plan *next;           /* LRU order, most recent first */
};

/*
 * What bounds plan memory: every plan alive is charged its table's size from the moment it is
 * admitted (pd_plans_get making it, or pd_plan_wake needing its table again) until its last reference
 * goes, and a mixture plan's cursors theirs while they live (taken by a request or idle on its list),
 * and `bytes`, all the charges, stays within max_bytes. Idle cursors give way first, least recently
 * used plan first. To admit one, the least recently used
 * plans nobody uses give way first: a plan only the list holds is dropped, and one held only by
 * holders that said they are idle (a stream waiting for credit) loses its table, which its holder
 * rebuilds when it wakes. When what remains is in use, the new plan is refused (PD_EBUSY), unless it
 * would be alone: one plan larger than max_bytes can still be served.
 */
struct pd_plans {
    pthread_mutex_t lock;
    pd_plan *head;
    unsigned n, max;
    uint64_t max_bytes;
    _Atomic uint64_t bytes; /* charged: tables built or admitted to be, cached or in use, and cursors */
    _Atomic uint64_t cursor_bytes; /* of bytes, mixtures' cursors' */
    pthread_cond_t cursor_back;    /* a cursor was given back or freed (pd_plan_cursor_take waits for one) */
    uint64_t next_id;
    pd_gen gen;  /* builds sharded plans' shard orders, when has_gen */
    int has_gen;
};

/* Whether nobody but the list and idle holders has p (no table is being read or built). Caller holds
 * c->lock: a new reference comes from the list (under the lock) or from a holder that uses it. */
static int pd_plan_unused(pd_plan *p)
{
    return atomic_load(&p->refs) == (p->listed ? 1u : 0u) + p->idle;
}

/* A cursor of p's (bytes) is freed: its charge goes. Caller holds c->lock (or has p's last reference). */
static void pd_plans_uncharge_cursor(pd_plans *c, pd_plan *p, uint64_t bytes)
{
    p->cursor_bytes -= bytes;
    atomic_fetch_sub(&c->bytes, bytes);
    atomic_fetch_sub(&c->cursor_bytes, bytes);
    pthread_cond_broadcast(&c->cursor_back);
}

/* Free p's idle cursors. Caller holds c->lock (or has the last reference). */
static void pd_plan_free_cursors(pd_plans *c, pd_plan *p)
{
    while (p->cursors) {
        pd_plan_cursor *k = p->cursors;
        p->cursors = k->next;
        p->ncursors--;
        pd_plans_uncharge_cursor(c, p, k->bytes);
        free(k);
    }
}

static void pd_plans_unlist(pd_plans *c, pd_plan **link)
{
    pd_plan *p = *link;
    *link = p->next;
    p->next = NULL;
    p->listed = 0;
    c->n--;
    pd_plan_release(p); /* the list's reference: frees it (and its charge) when nobody else has it */
}

/* Free the table of p, which only idle holders (and perhaps the list) have: nobody reads it, and its
 * holders build it again when they wake. Caller holds c->lock. */
static void pd_plan_uncharge(pd_plans *c, pd_plan *p)
{
    pd_plan_free_cursors(c, p); /* nobody uses p: every cursor is idle */
    free(p->mem);
    p->mem = NULL;
    atomic_store(&p->ready, 0);
    p->charged = 0;
    atomic_fetch_sub(&c->bytes, p->size);
}

/* Give way to a new charge: the least recently used plan (not keep) that nobody uses is dropped, or
 * its table freed when idle holders keep it. Returns 0 when there was none. Caller holds c->lock. */
static int pd_plans_reclaim_one(pd_plans *c, const pd_plan *keep)
{
    pd_plan **victim = NULL;
    for (pd_plan **link = &c->head; *link; link = &(*link)->next)
        if (*link != keep && (*link)->charged && pd_plan_unused(*link))
            victim = link; /* the last one found is the least recently used */
    if (!victim)
        return 0;
    pd_plan *p = *victim;
    if (p->idle == 0) {
        pd_plans_unlist(c, victim);
        return 1;
    }
    pd_plan_uncharge(c, p);
    return 1;
}

/* Give way to a new charge by freeing one idle cursor, of the least recently used plan that has one.
 * Returns 0 when there was none. Caller holds c->lock. */
static int pd_plans_shed_cursor(pd_plans *c)
{
    pd_plan *victim = NULL;
    for (pd_plan *p = c->head; p; p = p->next)
        if (p->cursors)
            victim = p;
    if (!victim)
        return 0;
    pd_plan_cursor *k = victim->cursors;
    victim->cursors = k->next;
    victim->ncursors--;
    pd_plans_uncharge_cursor(c, victim, k->bytes);
    free(k);
    return 1;
}

/* Make room for size more bytes: idle cursors go first, then plans nobody uses (not keep). Returns
 * whether they fit. Caller holds c->lock. */
static int pd_plans_room(pd_plans *c, const pd_plan *keep, uint64_t size)
{
    while (atomic_load(&c->bytes) + size > c->max_bytes && (pd_plans_shed_cursor(c) || pd_plans_reclaim_one(c, keep)))
        ;
    return atomic_load(&c->bytes) + size <= c->max_bytes;
}

/* Count p's table in the cache's bytes, making room first. PD_EBUSY when the plans in use leave no
 * room (p would not be alone). Caller holds c->lock. */
static int pd_plans_charge(pd_plans *c, pd_plan *p)
{
    if (p->charged)
        return 0;
    pd_plans_room(c, p, p->size);
    uint64_t bytes = atomic_load(&c->bytes);
    if (bytes && bytes + p->size > c->max_bytes)
        return PD_EBUSY;
    atomic_fetch_add(&c->bytes, p->size);
    p->charged = 1;
    return 0;
}

/* Drop least recently used plans nobody uses until at most max entries are listed, keeping the
 * most recent; plans in use stay listed, so that new requests share them. Caller holds c->lock. */
static void pd_plans_trim(pd_plans *c)
{
    while (c->n > c->max) {
        pd_plan **victim = NULL;
        for (pd_plan **link = &c->head->next; *link; link = &(*link)->next)
            if ((*link)->idle == 0 && pd_plan_unused(*link))
                victim = link;
        if (!victim)
            return;
        pd_plans_unlist(c, victim);
    }
}

int pd_plans_open(unsigned max_entries, uint64_t max_bytes, const pd_gen *gen, pd_plans **out)
{
    pd_plans *c = calloc(1, sizeof *c);
    if (!c)
        return PD_ENOMEM;
    if (gen) {
        c->gen = *gen;
        c->has_gen = 1;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cursor_back, NULL);
    c->max = max_entries ? max_entries : 1;
    c->max_bytes = max_bytes;
    *out = c;
    return 0;
}

void pd_plans_close(pd_plans *c)
{
    if (!c)
        return;
    while (c->head)
        pd_plans_unlist(c, &c->head);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cursor_back);
    free(c);
}

/* Whether p was made from a layout the registry has dropped since (its dataset deleted): no request
 * finds it any more (a new one resolves the registry's current layout), so keeping it cached only
 * keeps that layout's memory. */
static int pd_plan_retired(const pd_plan *p)
{
    if (p->layout)
        return atomic_load(&p->layout->retired);
    for (uint32_t j = 0; p->mixdef && j < p->mixdef->components; j++)
        if (p->layouts[j] && atomic_load(&p->layouts[j]->retired))
            return 1;
    return 0;
}

/* Let go of the listed plans `gone` says no request will find again: unused ones are freed now, an
 * idle holder's loses its table, one in use is freed by its last holder. */
static void pd_plans_drop_if(pd_plans *c, int (*gone)(const pd_plan *p, const void *ctx), const void *ctx)
{
    pthread_mutex_lock(&c->lock);
    for (pd_plan **link = &c->head; *link;) {
        pd_plan *p = *link;
        if (!gone(p, ctx)) {
            link = &p->next;
            continue;
        }
        if (p->idle && p->charged && pd_plan_unused(p))
            pd_plan_uncharge(c, p); /* a stream waiting for credit: it ends when it wakes (its target gone) */
        pd_plans_unlist(c, link); /* in use: freed, layout and all, by its last holder */
    }
    pthread_mutex_unlock(&c->lock);
}

static int pd_plan_retired_cb(const pd_plan *p, const void *ctx)
{
    (void)ctx;
    return pd_plan_retired(p);
}

void pd_plans_drop_retired(pd_plans *c)
{
    pd_plans_drop_if(c, pd_plan_retired_cb, NULL);
}

typedef struct pd_mix_key {
    const char *name;
    const pd_mixdef *keep;
} pd_mix_key;

static int pd_plan_replaced(const pd_plan *p, const void *ctx)
{
    const pd_mix_key *k = ctx;
    return p->mixdef && p->mixdef != k->keep && !strcmp(p->mixdef->name, k->name);
}

void pd_plans_drop_mixture(pd_plans *c, const char *name, const pd_mixdef *keep)
{
    pd_mix_key k = {name, keep};
    pd_plans_drop_if(c, pd_plan_replaced, &k);
}

uint64_t pd_plans_bytes(pd_plans *c)
{
    return c ? atomic_load(&c->bytes) : 0;
}

uint64_t pd_plans_cursor_bytes(pd_plans *c)
{
    return c ? atomic_load(&c->cursor_bytes) : 0;
}

uint64_t pd_plans_limit(const pd_plans *c)
{
    return c->max_bytes;
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
    /* The last reference: not listed (the list holds one), so nobody else reads charged. */
    if (p->charged)
        atomic_fetch_sub(&p->cache->bytes, p->size);
    pd_plan_free_cursors(p->cache, p); /* every one was given back before its taker released p */
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

void pd_plan_idle(pd_plan *p)
{
    pd_plans *c = p->cache;
    pthread_mutex_lock(&c->lock);
    p->idle++;
    /* An unlisted plan (its dataset deleted while it was in use) is never visited to give way: once only
     * idle holders have it, its table goes now, or it would hold its charge until the holders end. */
    if (!p->listed && p->charged && pd_plan_unused(p))
        pd_plan_uncharge(c, p);
    pthread_mutex_unlock(&c->lock);
}

int pd_plan_wake(pd_plan *p)
{
    pd_plans *c = p->cache;
    pthread_mutex_lock(&c->lock);
    p->idle--; /* in use from here: nothing reclaims it */
    int rc = pd_plans_charge(c, p);
    if (rc) {
        p->idle++;
    } else if (p->listed) { /* used again: the most recent */
        pd_plan **link = &c->head;
        while (*link != p)
            link = &(*link)->next;
        *link = p->next;
        p->next = c->head;
        c->head = p;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void pd_plan_release_idle(pd_plan *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->cache->lock);
    p->idle--;
    pthread_mutex_unlock(&p->cache->lock);
    pd_plan_release(p);
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

/* A new unbuilt, unlisted plan (the caller's reference). Caller holds c->lock. */
static pd_plan *pd_plans_new(pd_plans *c, uint64_t seed)
{
    pd_plan *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    atomic_init(&p->refs, 1);
    atomic_init(&p->ready, 0);
    pthread_mutex_init(&p->build, NULL);
    p->cache = c;
    p->id = ++c->next_id;
    p->seed = seed;
    return p;
}

/* Admit p, new (made by pd_plans_new, keyed and sized) or found: charged, and listed at the front
 * when new. On PD_EBUSY the caller's reference is dropped (a new plan is freed). Caller holds c->lock. */
static int pd_plans_admit(pd_plans *c, pd_plan *p)
{
    int rc = pd_plans_charge(c, p);
    if (rc) {
        pd_plan_release(p);
        return rc;
    }
    if (!p->listed) {
        pd_plan_ref(p);
        p->listed = 1;
        p->next = c->head;
        c->head = p;
        c->n++;
        pd_plans_trim(c);
    }
    return 0;
}

int pd_plans_get(pd_plans *c, pd_layout *layout, uint64_t seed, uint64_t epoch, uint64_t window, uint64_t lanes,
                 pd_plan **out)
{
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    pd_plan *p = pd_plans_find(c, layout, NULL, seed, epoch, window, lanes);
    if (!p && (p = pd_plans_new(c, seed))) {
        p->layout = pd_layout_ref(layout);
        p->epoch = epoch;
        p->window = window;
        p->lanes = lanes;
        p->size = pd_shard_plan_bytes(layout->shards);
    }
    if (!p)
        rc = PD_ENOMEM;
    else if ((rc = pd_plans_admit(c, p)))
        p = NULL;
    pthread_mutex_unlock(&c->lock);
    *out = p;
    return rc;
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
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    pd_plan *p = pd_plans_find(c, NULL, def, seed, 0, 0, 0);
    if (!p && (p = pd_plans_new(c, seed))) {
        p->mixdef = pd_mixdef_ref(def);
        p->size = pd_mix_bytes(def->components, def->stages);
        for (uint32_t j = 0; j < n; j++) {
            refs[j] = pd_layout_ref(layouts[j]);
            comps[j].size = def->comp[j].size;
            comps[j].window = refs[j] ? def->comp[j].window : 1;
            comps[j].lanes = refs[j] ? def->comp[j].lanes : 1;
            if (refs[j]) {
                comps[j].shard_start = refs[j]->start;
                comps[j].shards = refs[j]->shards;
                p->sharded = 1;
            }
        }
        p->layouts = refs;
        p->comps = comps;
        refs = NULL;
        comps = NULL;
    }
    if (!p)
        rc = PD_ENOMEM;
    else if ((rc = pd_plans_admit(c, p)))
        p = NULL;
    pthread_mutex_unlock(&c->lock);
    free(refs);
    free(comps);
    *out = p;
    return rc;
}

uint64_t pd_plan_id(const pd_plan *p)
{
    return p->id;
}

int pd_plan_ready(pd_plan *p)
{
    return atomic_load(&p->ready);
}

/* Build the table once (under the plan's build lock): its bytes were charged when it was admitted. */
static int pd_plan_build(pd_plan *p)
{
    int rc = 0;
    if (atomic_load(&p->ready))
        return 0;
    pthread_mutex_lock(&p->build);
    if (!atomic_load(&p->ready)) {
        const pd_mixdef *d = p->mixdef;
        if (!(p->mem = malloc(p->size)))
            rc = PD_ENOMEM;
        else if (d)
            rc = pd_mix_init(&p->mix, p->seed, p->comps, d->components, d->length, d->block, d->starts, d->weights,
                             d->stages, p->mem, p->size);
        else if (p->cache->has_gen) /* π on the SIMD kernel: several times the core's speed */
            rc = pd_gen_shard_plan_init(&p->cache->gen, &p->plan, p->layout->start, p->layout->shards, p->seed,
                                        p->epoch, p->window, p->lanes, p->mem, p->size);
        else
            rc = pd_shard_plan_init(&p->plan, p->layout->start, p->layout->shards, p->seed, p->epoch, p->window,
                                    p->lanes, p->mem, p->size);
        if (rc) {
            free(p->mem);
            p->mem = NULL;
        } else {
            atomic_store(&p->ready, 1);
        }
    }
    pthread_mutex_unlock(&p->build);
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

/* pd_plan_cursor_take (wait) and pd_plan_cursor_try_take (!wait: *out NULL where it would build a table or
 * a sharded component's orders, or wait for the cursor). */
static int pd_plan_cursor_get(pd_plan *p, int wait, pd_mix_cursor **out)
{
    pd_plans *c = p->cache;
    const pd_mix *mix;
    *out = NULL;
    int rc;
    pd_plan_cursor *k;
again:
    if (!wait && p->mixdef && !pd_plan_ready(p))
        return 0; /* defensive: the loop's callers ask pd_plan_ready first, and hold p in use */
    if ((rc = pd_plan_use_mix(p, &mix)))
        return rc;
    const size_t bytes = sizeof(pd_plan_cursor) + pd_mix_cursor_bytes(mix);
    pthread_mutex_lock(&c->lock);
    if ((k = p->cursors)) { /* the most recently given: its orders are the likeliest to serve this request */
        p->cursors = k->next;
        p->ncursors--;
    } else if (!wait && p->sharded) { /* a new cursor would build its sharded components' orders */
        pthread_mutex_unlock(&c->lock);
        return 0;
    } else if (!pd_plans_room(c, p, bytes)) {
        /* The plans in use fill max_bytes. One plan alone may pass it, with one cursor: a mixture larger than the
         * cache is still served, a request at a time, each waiting here for the cursor (held for one generation:
         * a stream's batches ahead share it too). Every concurrent request used to add a cursor past the bound
         * (32 bytes a shard of each sharded component: 25 times plan_cache_bytes with four at once). */
        const int alone = atomic_load(&c->bytes) == (p->charged ? p->size : 0) + p->cursor_bytes;
        if (alone && p->cursor_bytes && !wait) {
            pthread_mutex_unlock(&c->lock);
            return 0;
        }
        if (alone && p->cursor_bytes) {
            pthread_cond_wait(&c->cursor_back, &c->lock);
            pthread_mutex_unlock(&c->lock);
            goto again; /* its table may have gone meanwhile */
        }
        if (!alone)
            rc = PD_EBUSY; /* other plans in use fill it */
    }
    if (!k && !rc) {
        atomic_fetch_add(&c->bytes, bytes);
        atomic_fetch_add(&c->cursor_bytes, bytes);
        p->cursor_bytes += bytes;
    }
    pthread_mutex_unlock(&c->lock);
    if (k || rc) {
        *out = k ? &k->cur : NULL;
        return rc;
    }
    if (!(k = malloc(bytes))) {
        rc = PD_ENOMEM;
        goto fail;
    }
    k->bytes = bytes;
    k->next = NULL;
    if ((rc = pd_mix_cursor_init(&k->cur, mix, k + 1, bytes - sizeof *k)))
        goto fail;
    if (c->has_gen) /* sharded components' orders on the SIMD kernel, as sharded datasets' plans */
        pd_mix_cursor_set_planner(&k->cur, pd_gen_shard_planner, &c->gen);
    *out = &k->cur;
    return 0;
fail:
    free(k);
    pthread_mutex_lock(&c->lock);
    pd_plans_uncharge_cursor(c, p, bytes);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int pd_plan_cursor_take(pd_plan *p, pd_mix_cursor **out)
{
    return pd_plan_cursor_get(p, 1, out);
}

int pd_plan_cursor_try_take(pd_plan *p, pd_mix_cursor **out)
{
    return pd_plan_cursor_get(p, 0, out);
}

void pd_plan_cursor_give(pd_plan *p, pd_mix_cursor *cur)
{
    if (!cur)
        return;
    pd_plans *c = p->cache;
    pd_plan_cursor *k = (pd_plan_cursor *)cur;
    pthread_mutex_lock(&c->lock);
    if (p->ncursors < PD_PLAN_CURSORS_KEPT) {
        k->next = p->cursors;
        p->cursors = k;
        p->ncursors++;
        k = NULL;
        pthread_cond_broadcast(&c->cursor_back);
    } else {
        pd_plans_uncharge_cursor(c, p, k->bytes);
    }
    pthread_mutex_unlock(&c->lock);
    free(k);
}

int pd_plan_cursor_warm(pd_plan *p)
{
    pthread_mutex_lock(&p->cache->lock);
    int warm = !p->sharded || p->cursors != NULL;
    pthread_mutex_unlock(&p->cache->lock);
    return warm;
}

uint64_t pd_plan_cursor_missing(pd_plan *p, uint64_t epoch, uint64_t first, uint64_t last)
{
    if (!p->mixdef || !pd_plan_ready(p))
        return UINT64_MAX;
    const pd_mix *mix = &p->mix;
    const uint64_t C = mix->components, L = mix->length;
    if (!p->sharded)
        return 0;
    if (last >= L) { /* a pad-mode wrap: the last read at last mod L, near the start: reach it all */
        first = first < last % L ? first : last % L;
        last = L - 1;
    }
    uint64_t small[128], *drawn = 2 * C <= 128 ? small : malloc(2 * C * sizeof *drawn);
    uint64_t missing = UINT64_MAX;
    if (drawn && pd_mix_reach(mix, epoch, first, last, drawn) == PD_OK) { /* the plan alone: no lock */
        pthread_mutex_lock(&p->cache->lock); /* the idle cursor stays as it is while listed */
        if (p->cursors)
            missing = pd_mix_cursor_missing(&p->cursors->cur, drawn);
        pthread_mutex_unlock(&p->cache->lock);
    }
    if (drawn != small)
        free(drawn);
    return missing;
}
