/* Fetch readahead: predict a sequential reader's next Fetch and generate it before the loop blocks in poll. */
#include "daemon/readahead.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/conn.h"
#include "daemon/server.h"

/*
 * Why: a trainer reads its slice in order, one Fetch of a batch after another, and waits for each
 * reply before it asks again. Generating a batch on the loop is then on the request's critical path
 * (4 µs for 1,024 ids with AVX-512, a fifth of a round trip). When a Fetch continues the previous one
 * (same permutation, slice and count; its offset where the last ended), the one after it is
 * generated in the loop's idle phase, while the client is busy with its reply, and the next request
 * is answered with a copy. The work is moved, not added: nothing is predicted for a connection until
 * it has read sequentially, and a miss costs one batch. Every backend gives the same bytes, so a
 * prediction is exact whichever generated it.
 */

static int pd_ra_same(const pd_target *a, const pd_target *b)
{
    /* The round keys and n fix σ; the slice fixes which positions; the width fixes the bytes. */
    return !a->plan && !b->plan && a->perm.n == b->perm.n &&
           memcmp(&a->perm.keys, &b->perm.keys, sizeof a->perm.keys) == 0 && a->slice.world == b->slice.world &&
           a->slice.rank == b->slice.rank && a->slice.mode == b->slice.mode && a->width == b->width;
}

/* Whether a Fetch of count ids for t is the one that continues the last served. */
static int pd_ra_continues(const pd_readahead *ra, const pd_target *t, uint64_t count)
{
    return ra->known && ra->count == count && ra->t.slice.offset == t->slice.offset && pd_ra_same(&ra->t, t);
}

static void pd_ra_unqueue(pd_server *s, pd_conn *c)
{
    pd_readahead *ra = c->ra;
    if (!ra->queued)
        return;
    if (ra->prev)
        ra->prev->ra->next = ra->next;
    else
        s->readahead_queue = ra->next;
    if (ra->next)
        ra->next->ra->prev = ra->prev;
    ra->prev = ra->next = NULL;
    ra->queued = 0;
}

static void pd_on_readahead(uv_idle_t *h)
{
    pd_server *s = h->data;
    while (s->readahead_queue) {
        pd_conn *c = s->readahead_queue;
        pd_readahead *ra = c->ra;
        if (!pd_server_take_inline(s, ra->got))
            return; /* this iteration's budget is spent: the next one refills it */
        pd_ra_unqueue(s, c);
        uint64_t w = 0;
        ra->ready = pd_target_generate(s->backend, &ra->t, &ra->t.slice, ra->got, ra->buf, &w) == 0 && w == ra->got;
    }
    uv_idle_stop(h);
}

void pd_readahead_init(pd_server *s)
{
    uv_idle_init(s->loop, &s->readahead_idle);
    s->readahead_idle.data = s;
}

void pd_readahead_close(pd_server *s)
{
    uv_close((uv_handle_t *)&s->readahead_idle, NULL);
}

const uint8_t *pd_readahead_find(pd_conn *c, const pd_target *t, uint64_t count, uint64_t got)
{
    pd_readahead *ra = c->ra;
    if (!ra || !ra->ready || !pd_ra_continues(ra, t, count) || ra->got != got)
        return NULL;
    return ra->buf;
}

void pd_readahead_note(pd_conn *c, const pd_target *t, uint64_t count, uint64_t got, uint64_t remaining)
{
    pd_server *s = c->srv;
    pd_readahead *ra = c->ra;
    if (t->plan || t->width > 8 || got == 0) /* flat ids only: sharded plans are shared and may be rebuilt */
        return;
    if (!ra && !(ra = c->ra = calloc(1, sizeof *ra)))
        return;
    int sequential = pd_ra_continues(ra, t, count);
    ra->t = *t;
    ra->t.slice.offset = pd_target_next_offset(t, t->slice.offset, got);
    ra->t.remaining = remaining;
    ra->count = count;
    ra->got = count < remaining ? count : remaining;
    ra->known = 1;
    ra->ready = 0;
    if (!sequential || ra->got == 0 || ra->got * t->width > PD_READAHEAD_MAX_BYTES || s->stopping ||
        (!ra->buf && !(ra->buf = malloc(PD_READAHEAD_MAX_BYTES)))) {
        pd_ra_unqueue(s, c);
        return;
    }
    if (!ra->queued) {
        ra->queued = 1;
        ra->prev = NULL;
        ra->next = s->readahead_queue;
        if (ra->next)
            ra->next->ra->prev = c;
        s->readahead_queue = c;
        uv_idle_start(&s->readahead_idle, pd_on_readahead);
    }
}

void pd_readahead_drop(pd_conn *c)
{
    if (!c->ra)
        return;
    pd_ra_unqueue(c->srv, c);
    free(c->ra->buf);
    free(c->ra);
    c->ra = NULL;
}
