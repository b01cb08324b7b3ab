/* Fetch readahead: predict a sequential reader's next Fetch and generate it before the loop blocks in poll. */
#include "daemon/readahead.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/*
 * Why: a trainer reads its slice in order, one Fetch of a batch after another, and waits for each
 * reply before it asks again. Generating a batch on the loop is then on the request's critical path
 * (4 µs for 1,024 ids with AVX-512, a fifth of a round trip; several times that for a mixture's). When a
 * Fetch continues the previous one (same permutation or plan, slice and count; its offset where the last
 * ended), the one after it is
 * generated in the loop's idle phase, while the client is busy with its reply, and the next request
 * is answered with a copy. The work is moved, not added: nothing is predicted for a connection until
 * it has read sequentially, and a miss costs one batch. Every backend gives the same bytes, so a
 * prediction is exact whichever generated it.
 */

/* What one connection predicts: the Fetch that continues the last one it was served. */
struct pd_readahead {
    pd_target t;        /* the continuing request: the last one's key and slice, t.slice.offset where it
                           ended, t.remaining what the rank then has left; its plan (sharded datasets and
                           mixtures) is a reference of its own */
    uint64_t count;     /* the last one's count, which the continuing one asks for again */
    uint64_t got;       /* ids it gets: min(count, t.remaining) */
    int known;          /* t and count are set (a Fetch was served) */
    uint8_t *buf;       /* got * t.width bytes once ready; size bytes (the largest prediction yet) */
    uint64_t size;
    int ready;          /* buf holds them */
    int queued;         /* waiting for the idle pass */
    int plan_idle;      /* t.plan is held for its identity only (pd_plan_idle): a connection that stops
                           reading must not keep a plan's memory from other requests */
    pd_session *prev, *next; /* the loop's queue */
};

/* A loop's connections with a prediction to generate. */
struct pd_ra_queue {
    uv_idle_t idle;
    pd_loop *loop;
    pd_session *head;
};

/* Hold the prediction's plan for its identity only, or let it go. */
static void pd_ra_plan_idle(struct pd_readahead *ra)
{
    if (ra->t.plan && !ra->plan_idle) {
        pd_plan_idle(ra->t.plan);
        ra->plan_idle = 1;
    }
}

/* The connection's buffer, of at least size bytes (the prediction's: a reader of small Fetches holds a small
 * one), counted in permd_readahead_bytes. PD_ENOMEM. */
static int pd_ra_reserve(pd_session *s, struct pd_readahead *ra, uint64_t size)
{
    if (ra->buf && ra->size >= size)
        return 0;
    if (ra->buf)
        s->loop->stats.readahead_bytes -= ra->size;
    free(ra->buf);
    ra->size = 0;
    if (!(ra->buf = malloc(size)))
        return PD_ENOMEM;
    ra->size = size;
    s->loop->stats.readahead_bytes += size;
    return 0;
}

static void pd_ra_release(struct pd_readahead *ra)
{
    if (ra->plan_idle)
        pd_plan_release_idle(ra->t.plan);
    else
        pd_plan_release(ra->t.plan);
    ra->t.plan = NULL;
    ra->plan_idle = 0;
}

static int pd_ra_same(const pd_target *a, const pd_target *b)
{
    /* Flat: the round keys and n fix σ. A plan is immutable and alive while referenced, so the same plan
     * object is the same layout, seed and epoch (sharded) or definition and seed (a mixture, whose epoch is
     * the target's); a re-created dataset or re-weighted mixture gets another plan. The slice fixes which
     * positions; the width fixes the bytes. */
    if (a->plan || b->plan) {
        if (a->plan != b->plan || a->mixture != b->mixture || a->epoch != b->epoch)
            return 0;
    } else if (a->perm.n != b->perm.n || memcmp(&a->perm.keys, &b->perm.keys, sizeof a->perm.keys) != 0) {
        return 0;
    }
    return a->slice.world == b->slice.world && a->slice.rank == b->slice.rank && a->slice.mode == b->slice.mode &&
           a->width == b->width;
}

/* Whether a Fetch of count ids for t is the one that continues the last served. */
static int pd_ra_continues(const struct pd_readahead *ra, const pd_target *t, uint64_t count)
{
    return ra->known && ra->count == count && ra->t.slice.offset == t->slice.offset && pd_ra_same(&ra->t, t);
}

static void pd_ra_unqueue(struct pd_ra_queue *q, pd_session *s)
{
    struct pd_readahead *ra = s->ra;
    if (!ra->queued)
        return;
    if (ra->prev)
        ra->prev->ra->next = ra->next;
    else
        q->head = ra->next;
    if (ra->next)
        ra->next->ra->prev = ra->prev;
    ra->prev = ra->next = NULL;
    ra->queued = 0;
}

static void pd_on_readahead(uv_idle_t *h)
{
    struct pd_ra_queue *q = h->data;
    while (q->head) {
        pd_session *s = q->head;
        struct pd_readahead *ra = s->ra;
        const uint64_t cost = pd_target_cost(&ra->t, ra->got);
        if (cost > q->loop->svc->cfg->inline_ids) { /* never fits (a mixture's order to build): the pool's */
            pd_ra_unqueue(q, s);
            pd_ra_plan_idle(ra);
            continue;
        }
        if (!pd_loop_take_inline(q->loop, cost))
            return; /* this iteration's budget is spent: the next one refills it */
        pd_ra_unqueue(q, s);
        uint64_t w = 0;
        int deferred = 0; /* then nothing is ready: the Fetch, when it comes, goes its own way */
        ra->ready = pd_target_generate_now(s->svc->backend, &ra->t, &ra->t.slice, ra->got, ra->buf, &w, &deferred) ==
                        0 && !deferred && w == ra->got;
        pd_ra_plan_idle(ra); /* generated: the plan is only compared with the next Fetch's */
    }
    uv_idle_stop(h);
}

int pd_readahead_loop_open(pd_loop *l)
{
    struct pd_ra_queue *q = calloc(1, sizeof *q);
    if (!q)
        return PD_ENOMEM;
    q->loop = l;
    uv_idle_init(l->uv, &q->idle);
    q->idle.data = q;
    l->ra = q;
    return 0;
}

static void pd_on_ra_closed(uv_handle_t *h)
{
    free(h->data);
}

void pd_readahead_loop_close(pd_loop *l)
{
    if (!l->ra)
        return;
    uv_close((uv_handle_t *)&l->ra->idle, pd_on_ra_closed);
    l->ra = NULL;
}

const uint8_t *pd_readahead_find(pd_session *s, const pd_target *t, uint64_t count, uint64_t got)
{
    struct pd_readahead *ra = s->ra;
    if (!ra || !ra->ready || !pd_ra_continues(ra, t, count) || ra->got != got)
        return NULL;
    return ra->buf;
}

void pd_readahead_note(pd_session *s, const pd_target *t, uint64_t count, uint64_t got, uint64_t remaining)
{
    struct pd_ra_queue *q = s->loop->ra;
    struct pd_readahead *ra = s->ra;
    if (t->width > 8 || got == 0 || !q) /* ids only (locations are served as they come) */
        return;
    if (!ra && !(ra = s->ra = calloc(1, sizeof *ra)))
        return;
    int sequential = pd_ra_continues(ra, t, count);
    pd_ra_release(ra);
    ra->t = *t;
    if (t->plan)
        ra->t.plan = pd_plan_ref(t->plan); /* in use until the idle pass generated with it */
    ra->t.slice.offset = pd_target_next_offset(t, t->slice.offset, got);
    ra->t.remaining = remaining;
    ra->count = count;
    ra->got = count < remaining ? count : remaining;
    ra->known = 1;
    ra->ready = 0;
    const uint64_t room = s->svc->cfg->readahead_bytes;
    if (!sequential || ra->got == 0 || ra->got * t->width > room || s->loop->stopping ||
        pd_target_may_block(t) || /* the idle pass runs on the loop: only plans already built */
        pd_target_cost(t, ra->got) > s->svc->cfg->inline_ids || /* the idle pass would never generate it */
        pd_ra_reserve(s, ra, ra->got * t->width)) {
        pd_ra_unqueue(q, s);
        pd_ra_plan_idle(ra);
        return;
    }
    if (!ra->queued) {
        ra->queued = 1;
        ra->prev = NULL;
        ra->next = q->head;
        if (ra->next)
            ra->next->ra->prev = s;
        q->head = s;
        uv_idle_start(&q->idle, pd_on_readahead);
    }
}

void pd_readahead_drop(pd_session *s)
{
    if (!s->ra)
        return;
    if (s->loop->ra)
        pd_ra_unqueue(s->loop->ra, s);
    pd_ra_release(s->ra);
    if (s->ra->buf)
        s->loop->stats.readahead_bytes -= s->ra->size;
    free(s->ra->buf);
    free(s->ra);
    s->ra = NULL;
}
