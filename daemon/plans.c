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
    pd_layout *layout;
    uint64_t seed, epoch, window, lanes;
    pthread_mutex_t build;   /* held while the table is computed */
    _Atomic int ready;
    pd_shard_plan plan;
    void *mem;
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
        atomic_fetch_sub(&p->cache->bytes, pd_shard_plan_bytes(p->layout->shards));
    pd_layout_release(p->layout);
    pthread_mutex_destroy(&p->build);
    free(p->mem);
    free(p);
}

int pd_plans_get(pd_plans *c, pd_layout *layout, uint64_t seed, uint64_t epoch, uint64_t window, uint64_t lanes,
                 pd_plan **out)
{
    pthread_mutex_lock(&c->lock);
    pd_plan **link = &c->head, *p;
    for (; (p = *link); link = &p->next) {
        if (p->layout == layout && p->seed == seed && p->epoch == epoch && p->window == window && p->lanes == lanes) {
            *link = p->next; /* move to the front */
            p->next = c->head;
            c->head = p;
            *out = pd_plan_ref(p);
            pthread_mutex_unlock(&c->lock);
            return 0;
        }
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        pthread_mutex_unlock(&c->lock);
        return PD_ENOMEM;
    }
    atomic_init(&p->refs, 2); /* the list's and the caller's */
    atomic_init(&p->ready, 0);
    pthread_mutex_init(&p->build, NULL);
    p->cache = c;
    p->id = ++c->next_id;
    p->layout = pd_layout_ref(layout);
    p->seed = seed;
    p->epoch = epoch;
    p->window = window;
    p->lanes = lanes;
    p->next = c->head;
    c->head = p;
    c->n++;
    pd_plans_trim(c);
    pthread_mutex_unlock(&c->lock);
    *out = p;
    return 0;
}

uint64_t pd_plans_bytes(pd_plans *c)
{
    return c ? atomic_load(&c->bytes) : 0;
}

uint64_t pd_plan_id(const pd_plan *p)
{
    return p->id;
}

int pd_plan_ready(pd_plan *p)
{
    return atomic_load(&p->ready);
}

int pd_plan_use(pd_plan *p, const pd_shard_plan **out)
{
    int rc = 0;
    if (!atomic_load(&p->ready)) {
        pthread_mutex_lock(&p->build);
        if (!atomic_load(&p->ready)) {
            size_t bytes = pd_shard_plan_bytes(p->layout->shards);
            if (!(p->mem = malloc(bytes)))
                rc = PD_ENOMEM;
            else if ((rc = pd_shard_plan_init(&p->plan, p->layout->start, p->layout->shards, p->seed, p->epoch,
                                              p->window, p->lanes, p->mem, bytes))) {
                free(p->mem);
                p->mem = NULL;
            } else {
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
    }
    *out = rc ? NULL : &p->plan;
    return rc;
}
