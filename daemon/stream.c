/* Stream state machine: credits, in-order delivery of batches generated ahead on the pool, cancel and end. */
#include "daemon/stream.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/reply.h"
#include "daemon/reqtype.h"
#include "daemon/ring.h"
#include "daemon/target.h"

typedef struct pd_batch pd_batch;

typedef struct pd_stream {
    struct pd_stream *next;
    pd_session *s;
    uint64_t id;
    pd_target t;            /* t.slice.offset: where the next scheduled batch starts */
    uint64_t batch;         /* ids per batch */
    uint64_t unscheduled;   /* ids not yet handed to a batch */
    uint64_t delivered;     /* ids sent */
    uint64_t sent_offset;   /* the offset after the last batch sent */
    uint64_t next_seq;      /* seq of the next batch scheduled */
    uint64_t send_seq;      /* seq of the next batch to send */
    uint32_t credits;
    unsigned inflight;      /* batch jobs running */
    pd_batch *ready;        /* finished out of order, sorted by seq */
    int ended;              /* StreamEnd sent or connection gone: freed once inflight is 0 */
    _Atomic int stopped;    /* ended, for its batch jobs: one not yet started skips its generation */
    int plan_idle;          /* waiting for credit: its plan's table may be reclaimed (pd_plan_idle) */
    /* A ring stream's batch seq k is written to slot k % slots of the ring
     * and announced by a StreamBatch without ids; ring.base is NULL otherwise. */
    pd_ring ring;
    uint32_t slots;
    uint64_t slot_bytes;
    uint64_t served;        /* the session's turn (pd_streams.turn) of its last batch scheduled; 0: none */
} pd_stream;

/* A session's streams, and the rings of its ended ring streams. */
struct pd_streams {
    pd_stream *head;
    unsigned n;    /* linked: live ones, and ended ones whose last batch is still generated */
    unsigned live; /* not ended: what max_streams bounds */
    uint64_t turn; /* batches scheduled so far, all streams: each stream's served is one of these */
    pd_ring spare_ring; /* an ended stream's ring, kept for a next stream that may reuse it (Stream.reuse_ring) */
    /* Bytes of ended streams' rings permd unmapped while the client may still map them (its last batches are
     * its own: their credits can no longer come back). They stay counted in stream_ring_total until the client
     * says it is done with them (reuse_ring) or the connection closes: a client keeping descriptors cannot
     * make permd's memory grow past the bound. */
    uint64_t held_bytes;
};

/* One batch: its frame is built in its own buffer and sent as an owned write. */
struct pd_batch {
    pd_job job;
    pd_stream *st;
    pd_batch *next;
    uint64_t seq, count, next_offset;
    pd_slice slice; /* this batch's; the rest of the target is st->t */
    unsigned width;
    pd_bulk bulk;   /* its frame (socket streams); a ring stream's payload is its slot */
    uint8_t *payload;
    size_t frame_len;
    int rc;
    char msg[200]; /* why rc, for the client, when it is not a generation failure */
};

static void pd_stream_ring_put(pd_session *s, pd_ring *r);

/* The session's stream table, made on its first stream. NULL when out of memory. */
static struct pd_streams *pd_streams_of(pd_session *s)
{
    if (!s->streams && (s->streams = calloc(1, sizeof *s->streams)))
        s->streams->spare_ring = PD_RING_NONE;
    return s->streams;
}

static pd_stream *pd_stream_find(pd_session *s, uint64_t id)
{
    for (pd_stream *st = s->streams ? s->streams->head : NULL; st; st = st->next)
        if (st->id == id && !st->ended)
            return st;
    return NULL;
}

static void pd_batch_free(pd_batch *b)
{
    free(b->bulk.base);
    free(b);
}

static void pd_stream_unlink_free(pd_stream *st)
{
    struct pd_streams *all = st->s->streams;
    for (pd_stream **pp = &all->head; *pp; pp = &(*pp)->next) {
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    }
    all->n--;
    while (st->ready) {
        pd_batch *b = st->ready;
        st->ready = b->next;
        pd_batch_free(b);
    }
    if (st->plan_idle)
        pd_plan_release_idle(st->t.plan);
    else
        pd_target_release(&st->t);
    pd_stream_ring_put(st->s, &st->ring); /* no job writes to it any more */
    free(st);
}

/* Mark ended; free now (returning 1) unless batch jobs still point at it. */
static int pd_stream_stop(pd_stream *st)
{
    if (!st->ended) {
        st->ended = 1;
        atomic_store_explicit(&st->stopped, 1, memory_order_relaxed);
        st->s->streams->live--;
        st->s->loop->stats.streams_active--;
    }
    if (st->inflight)
        return 0;
    pd_stream_unlink_free(st);
    return 1;
}

/* The stream's Error: counted under Stream whatever request the connection is handling when it goes out
 * (a Credit, another stream's batch done, a Fetch), as the stream is what failed. */
static void pd_stream_error(pd_stream *st, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pd_stream_error(pd_stream *st, int err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pd_reply_error_as(st->s, st->id, pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_STREAM), err, "%s", msg);
}

static void pd_stream_send_end(pd_stream *st, Permd__V1__EndReason reason)
{
    Permd__V1__StreamEnd e = PERMD__V1__STREAM_END__INIT;
    e.reason = reason;
    e.delivered = st->delivered;
    e.next_offset = st->sent_offset;
    pd_reply(st->s, st->id, PERMD__V1__ENVELOPE__BODY_STREAM_END, &e);
}

/* Header of a batch frame: known before generation, so ids go right after it. */
static int pd_batch_header(const pd_stream *st, const pd_batch *b, uint8_t *hdr, size_t *hlen)
{
    Permd__V1__StreamBatch head = PERMD__V1__STREAM_BATCH__INIT;
    head.id_width = b->width;
    head.count = b->count;
    head.next_offset = b->next_offset;
    head.seq = b->seq;
    return pd_frame_bulk_header(hdr, PD_BULK_HDR_MAX, st->id, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH, &head.base,
                                15, b->count * b->width, hlen);
}

/* Where batch seq's ids go in a ring stream, from the ring's start. */
static uint64_t pd_stream_slot_offset(const pd_stream *st, uint64_t seq)
{
    return (seq % st->slots) * st->slot_bytes;
}

/* Announce a batch already written to its ring slot. */
static int pd_stream_send_ring_batch(pd_stream *st, const pd_batch *b)
{
    Permd__V1__StreamBatch m = PERMD__V1__STREAM_BATCH__INIT;
    m.id_width = b->width;
    m.count = b->count;
    m.next_offset = b->next_offset;
    m.seq = b->seq;
    m.ring_offset = pd_stream_slot_offset(st, b->seq);
    return pd_reply(st->s, st->id, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH, &m);
}

static void pd_batch_run(pd_job *job)
{
    pd_batch *b = (pd_batch *)job;
    pd_stream *st = b->st;
    uint64_t got;
    /* Ended (Cancel, an error, the connection gone) before this job started: nobody will send its ids (done frees
     * it unsent; st stays allocated while a job is in flight). A client that opened streams and cancelled them at
     * once used to cost up to stream_ahead batches of max_count ids each per stream, generated for nothing. */
    if (atomic_load_explicit(&st->stopped, memory_order_relaxed)) {
        b->rc = PD_ECLOSED;
        return;
    }
    /* Its name must still have the definition the stream resolved: never a batch of a deleted or re-defined
     * dataset or mixture (the stream's plan would keep serving the old one). */
    if ((b->rc = pd_target_current(st->s->svc->reg, &st->t, b->msg, sizeof b->msg)))
        return;
    b->rc = pd_target_generate(st->s->svc->backend, &st->t, &b->slice, b->count, b->payload, &got);
    if (b->rc == 0 && got != b->count)
        b->rc = PD_EINTERNAL;
}

/* Send every ready batch whose turn it is. Returns 1 when st is gone (or its connection is
 * closing) and must not be touched. */
static int pd_stream_deliver(pd_stream *st)
{
    pd_session *s = st->s;
    while (st->ready && st->ready->seq == st->send_seq && !st->ended) {
        pd_batch *b = st->ready;
        st->ready = b->next;
        st->send_seq++;
        if (b->rc) {
            if (!b->msg[0])
                b->rc = pd_target_error(s->svc->plans, b->rc, b->msg, sizeof b->msg);
            pd_stream_error(st, b->rc, "%s", b->msg);
            pd_batch_free(b);
            pd_stream_stop(st);
            return 1;
        }
        st->delivered += b->count;
        st->sent_offset = b->next_offset;
        s->loop->stats.ids_served_total += b->count;
        if (st->ring.base) {
            if (pd_stream_send_ring_batch(st, b))
                pd_conn_close(s->conn); /* out of memory for 60 bytes: the client cannot be told in order */
            pd_batch_free(b);
        } else {
            pd_conn_write_owned(s->conn, b->bulk.base, b->bulk.cap, b->bulk.frame, b->bulk.frame_len);
            free(b);
        }
        if (!pd_conn_open(s->conn))
            return 1;
    }
    return st->ended;
}

/* After deliveries: end the stream when everything went out. */
static void pd_stream_maybe_complete(pd_stream *st)
{
    if (!st->ended && st->unscheduled == 0 && st->inflight == 0 && !st->ready) {
        pd_stream_send_end(st, PERMD__V1__END_REASON__END_REASON_COMPLETE);
        pd_stream_stop(st);
    }
}

static void pd_batch_done(pd_job *job)
{
    pd_batch *b = (pd_batch *)job;
    pd_stream *st = b->st;
    pd_session *s = st->s;
    st->inflight--;
    if (st->ended || !pd_conn_open(s->conn)) {
        pd_batch_free(b);
        if (st->ended && st->inflight == 0)
            pd_stream_unlink_free(st);
        return;
    }
    pd_batch **pp = &st->ready; /* keep the ready list sorted by seq */
    while (*pp && (*pp)->seq < b->seq)
        pp = &(*pp)->next;
    b->next = *pp;
    *pp = b;
    if (!pd_stream_deliver(st))
        pd_stream_maybe_complete(st);
    if (!pd_conn_open(s->conn))
        return;
    pd_streams_pump(s);
    pd_conn_flush(s->conn);
    pd_conn_maybe_resume(s->conn);
}

/* Generate the next batch inline (small batches, nothing in flight, so order holds): into the
 * output buffer after its frame's header, or into its ring slot. */
static int pd_stream_inline(pd_stream *st, uint64_t count, int *deferred)
{
    pd_session *s = st->s;
    pd_batch b = {.seq = st->next_seq, .count = count, .width = st->t.width};
    b.next_offset = pd_target_next_offset(&st->t, st->t.slice.offset, count);
    int rc;
    if (st->ring.base) {
        uint64_t got;
        uint8_t *slot = st->ring.base + pd_stream_slot_offset(st, b.seq);
        rc = pd_target_generate_now(s->svc->backend, &st->t, &st->t.slice, count, slot, &got, deferred);
        if (rc == 0 && *deferred)
            return 0;
        if (rc == 0 && got != count)
            rc = PD_EINTERNAL;
        if (rc == 0)
            rc = pd_stream_send_ring_batch(st, &b);
    } else {
        uint8_t hdr[PD_BULK_HDR_MAX];
        size_t hlen;
        rc = pd_batch_header(st, &b, hdr, &hlen);
        if (rc == 0)
            rc = pd_reply_bulk_inline(s, hdr, hlen, &st->t, &st->t.slice, count, NULL, deferred);
    }
    if (rc || *deferred)
        return rc;
    st->next_seq++;
    st->send_seq++;
    st->delivered += count;
    st->sent_offset = b.next_offset;
    s->loop->stats.ids_served_total += count;
    return 0;
}

static int pd_stream_schedule(pd_stream *st, uint64_t count)
{
    pd_session *s = st->s;
    pd_batch *b = calloc(1, sizeof *b);
    if (!b)
        return PD_ENOMEM;
    b->st = st;
    b->seq = st->next_seq;
    b->count = count;
    b->width = st->t.width;
    b->slice = st->t.slice;
    b->next_offset = pd_target_next_offset(&st->t, st->t.slice.offset, count);
    if (st->ring.base) {
        b->payload = st->ring.base + pd_stream_slot_offset(st, b->seq);
        b->frame_len = PD_BULK_HDR_MAX; /* the announcement is all that goes out */
    } else {
        uint8_t hdr[PD_BULK_HDR_MAX];
        size_t hlen;
        int rc = pd_batch_header(st, b, hdr, &hlen);
        if (rc || (rc = pd_bulk_alloc(&b->bulk, st->s->conn, hdr, hlen, (size_t)count * b->width))) {
            free(b);
            return rc;
        }
        b->payload = b->bulk.payload;
        b->frame_len = b->bulk.frame_len;
    }
    if (pd_job_submit(&b->job, s->conn, pd_batch_run, pd_batch_done, b->frame_len)) {
        pd_batch_free(b);
        return PD_EINTERNAL;
    }
    st->next_seq++;
    st->inflight++;
    return 0;
}

/*
 * A stream waiting for credit, or for its client to read what was sent (the connection over
 * output_cap), with nothing in flight or ready, tells the plan cache that it does not use its plan: a
 * client that opens streams and stops reading them, with credits left or not, would otherwise pin one
 * plan each, whatever plan_cache_bytes says. The plan stays the stream's (its identity, and its table
 * as long as no other plan needs the room); a stream that credits and reads keep busy never lets go of
 * it, so an active reader is never rebuilt under.
 */
static void pd_stream_maybe_idle(pd_stream *st)
{
    if (st->t.plan && !st->plan_idle && !st->ended && (st->credits == 0 || pd_conn_congested(st->s->conn)) &&
        st->inflight == 0 && !st->ready && st->unscheduled) {
        pd_plan_idle(st->t.plan);
        st->plan_idle = 1;
    }
}

/* An idle stream may produce again (credit came, its connection drained): its plan back in use, or the
 * stream ends OVERLOADED when its table was given to other plans and those in use leave no room for it. Its dataset is checked first: one
 * deleted or re-defined while it waited ends it with that error (as its next batch would), not with
 * OVERLOADED, which asks for a retry, nor after taking another plan's room for a table it cannot use.
 * Returns 1 when st stopped. */
static int pd_stream_wake(pd_stream *st)
{
    char msg[200];
    if (!st->plan_idle)
        return 0;
    int rc = pd_target_current(st->s->svc->reg, &st->t, msg, sizeof msg);
    if (rc) { /* nothing in flight or ready: the error comes after every batch sent */
        pd_stream_error(st, rc, "%s", msg);
        pd_stream_stop(st);
        return 1;
    }
    if (pd_plan_wake(st->t.plan) == 0) {
        st->plan_idle = 0;
        return 0;
    }
    pd_stream_error(st, PD_EBUSY,
                   "plan memory is full (plan_cache_bytes = %llu): the plan of '%s' was given to other streams "
                   "and requests while this stream waited for credit; open it again from offset %llu later, or "
                   "raise plan_cache_bytes",
                   (unsigned long long)st->s->svc->cfg->plan_cache_bytes, st->t.ds.name,
                   (unsigned long long)st->sent_offset);
    pd_stream_stop(st);
    return 1;
}

/* Whether st may schedule a batch now: credit and ids left, and room under the bounds. Batches not sent
 * yet, running or done out of order and waiting for an earlier one (those no longer count toward the
 * cap): at most stream_ahead, and on a ring fewer than its slots, so that two never share one. */
static int pd_stream_can_produce(const pd_stream *st)
{
    const pd_conn *c = st->s->conn;
    const uint64_t ahead = st->next_seq - st->send_seq;
    return !st->ended && st->credits && st->unscheduled && ahead < st->s->svc->cfg->stream_ahead &&
           (!st->ring.base || ahead < st->slots) && pd_conn_open(c) && !pd_conn_congested(c);
}

/* Produce up to `most` batches, as far as credits, the in-flight bound and the output cap allow (st may
 * be freed when it returns). Each batch either is scheduled, or ends the stream with an error. */
static void pd_stream_produce(pd_stream *st, uint64_t most)
{
    pd_session *s = st->s;
    pd_conn *c = s->conn;
    /* Woken only when it can produce: a congested one stays idle until pd_streams_pump on writable. */
    if (st->credits && !st->ended && pd_conn_open(c) && !pd_conn_congested(c) && pd_stream_wake(st))
        return;
    for (uint64_t made = 0; made < most && pd_stream_can_produce(st); made++) {
        uint64_t count = st->unscheduled < st->batch ? st->unscheduled : st->batch;
        /* Inline only in order (nothing in flight) and within the loop's budget. */
        int inl = st->inflight == 0 && !st->ready && count <= PD_STREAM_INLINE_MAX && !pd_target_may_block(&st->t) &&
                  pd_loop_take_inline(s->loop, pd_target_cost(&st->t, count));
        char msg[200];
        int rc = inl ? pd_target_current(s->svc->reg, &st->t, msg, sizeof msg) : 0; /* a job checks its own */
        if (rc) { /* nothing in flight: the error comes after every batch sent */
            pd_stream_error(st, rc, "%s", msg);
            pd_stream_stop(st);
            return;
        }
        int deferred = 0;
        rc = inl ? pd_stream_inline(st, count, &deferred) : pd_stream_schedule(st, count);
        if (rc == 0 && deferred) { /* its cursor or table went to another thread meanwhile: a worker waits */
            s->loop->stats.inline_deferred++;
            inl = 0;
            rc = pd_stream_schedule(st, count);
        }
        if (rc == PD_EBUSY && inl) { /* no room for a mixture's cursor */
            pd_stream_error(st, pd_target_error(s->svc->plans, rc, msg, sizeof msg), "%s", msg);
            pd_stream_stop(st);
            return;
        } else if (rc) {
            pd_stream_error(st, PD_EINTERNAL, "stream batch failed: %s", pd_strerror(rc));
            pd_stream_stop(st);
            return;
        }
        st->credits--;
        st->unscheduled -= count;
        st->t.slice.offset = pd_target_next_offset(&st->t, st->t.slice.offset, count);
        st->served = ++s->streams->turn;
    }
    if (!st->ended && st->credits && st->unscheduled && pd_conn_open(c))
        pd_conn_note_congestion(c); /* stopped by the cap, not by credits */
    pd_stream_maybe_idle(st); /* (one with ids left: complete is the other case, and frees st) */
    pd_stream_maybe_complete(st);
}

/* The connection has room: its streams take it a batch at a time, the one served longest ago first, so
 * that under output_cap no stream takes every freed place from the others (the newest did, when each
 * pump ran the streams in order, each as far as it could). O(streams) a batch. Then every stream settles
 * as after producing (idle plans, completion, the connection's pause). */
void pd_streams_pump(pd_session *s)
{
    for (;;) {
        pd_stream *next = NULL;
        for (pd_stream *st = s->streams ? s->streams->head : NULL; st; st = st->next)
            if (pd_stream_can_produce(st) && (!next || st->served < next->served))
                next = st;
        if (!next)
            break;
        pd_stream_produce(next, 1); /* a batch scheduled, or the stream ended: no pass repeats forever */
    }
    pd_stream *st = s->streams ? s->streams->head : NULL;
    while (st) {
        pd_stream *next = st->next; /* st may be freed */
        if (!st->ended)
            pd_stream_produce(st, 0);
        st = next;
    }
}

/* ---- Rings ---------------------------------------------------------------------------------- */

/* Unmap a ring the client has seen: permd stops holding it (its descriptor, its mapping) but counts its
 * bytes in stream_ring_total while the client may still map it (pd_streams.held_bytes). */
static void pd_stream_ring_drop(pd_session *s, pd_ring *r)
{
    if (!r->base)
        return;
    s->streams->held_bytes += r->size;
    atomic_fetch_sub(&s->svc->ring_fds, 1);
    pd_ring_free(r);
    *r = PD_RING_NONE; /* its size too: a kept ring's size decides which of two is kept */
}

/* A ring of at least size bytes for a stream whose client did (reuse) or did not say it is done with the rings
 * of its ended streams. Reuse: the session's spare (its last ring stream's, so a stream per epoch costs no new
 * memory), and the held bytes are forgotten. Else the spare is never written again (its last batches may still
 * be read: it is dropped), and a new ring comes within stream_ring_total (PD_EBUSY) and the descriptors left
 * to rings (PD_ETOOBIG: each ring keeps one, and connections must still be accepted). */
static int pd_stream_ring_get(pd_session *s, uint64_t size, int reuse, pd_ring *out)
{
    struct pd_streams *all = s->streams;
    pd_service *svc = s->svc;
    if (reuse) {
        atomic_fetch_sub(&svc->ring_bytes, all->held_bytes);
        all->held_bytes = 0;
        if (all->spare_ring.base && all->spare_ring.size >= size) {
            *out = all->spare_ring;
            all->spare_ring = PD_RING_NONE;
            return 0;
        }
    } else {
        pd_stream_ring_drop(s, &all->spare_ring);
    }
    if (atomic_fetch_add(&svc->ring_fds, 1) >= svc->ring_fds_max) {
        atomic_fetch_sub(&svc->ring_fds, 1);
        return PD_ETOOBIG;
    }
    if (atomic_fetch_add(&svc->ring_bytes, size) + size > svc->cfg->stream_ring_total) {
        atomic_fetch_sub(&svc->ring_bytes, size);
        atomic_fetch_sub(&svc->ring_fds, 1);
        return PD_EBUSY;
    }
    int rc = pd_ring_create(out, (size_t)size);
    if (rc) {
        atomic_fetch_sub(&svc->ring_bytes, size);
        atomic_fetch_sub(&svc->ring_fds, 1);
        *out = PD_RING_NONE; /* no size left behind: it would displace the session's spare at the stream's end */
    }
    return rc;
}

/* Unmap a ring and stop counting it in stream_ring_total. */
static void pd_stream_ring_release(pd_session *s, pd_ring *r)
{
    if (!r->base)
        return;
    atomic_fetch_sub(&s->svc->ring_bytes, r->size);
    atomic_fetch_sub(&s->svc->ring_fds, 1);
    pd_ring_free(r);
    *r = PD_RING_NONE;
}

/* A stream's ring at its end: kept as the session's spare while its connection is open (the larger of two;
 * the other dropped: the client may still read it), else freed. */
static void pd_stream_ring_put(pd_session *s, pd_ring *r)
{
    struct pd_streams *all = s->streams;
    if (!pd_conn_open(s->conn)) {
        pd_stream_ring_release(s, r);
        return;
    }
    if (r->base && r->size > all->spare_ring.size) {
        pd_ring t = all->spare_ring;
        all->spare_ring = *r;
        *r = t;
    }
    pd_stream_ring_drop(s, r);
}

/* Give the stream the ring its client asked for, or decline quietly: its batches then carry their
 * ids, which every client reads anyway. */
static void pd_stream_ring_setup(pd_stream *st, uint32_t slots, int reuse)
{
    pd_session *s = st->s;
    const uint64_t max = s->svc->cfg->stream_ring_max;
    const uint64_t slot_bytes = (st->batch * st->t.width + 63) & ~UINT64_C(63);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t size = (slot_bytes * slots + page - 1) / page * page;
    int why = -1; /* a pd_ring_decline */
    int rc;
    if (pd_conn_is_tcp(s->conn))
        why = PD_RING_DECLINE_TCP;
    else if (size > max)
        why = max ? PD_RING_DECLINE_MAX : PD_RING_DECLINE_OFF;
    else if ((rc = pd_stream_ring_get(s, size, reuse, &st->ring)))
        why = rc == PD_EBUSY     ? PD_RING_DECLINE_TOTAL
              : rc == PD_ETOOBIG ? PD_RING_DECLINE_DESCRIPTORS
                                 : PD_RING_DECLINE_MEMORY;
    if (why < 0) {
        Permd__V1__StreamRing m = PERMD__V1__STREAM_RING__INIT;
        m.size = st->ring.size;
        m.slots = slots;
        m.slot_bytes = slot_bytes;
        /* permd keeps its descriptor: a spare ring is sent again */
        if (pd_reply_fd(s, st->id, PERMD__V1__ENVELOPE__BODY_STREAM_RING, &m, st->ring.fd)) {
            pd_stream_ring_release(s, &st->ring); /* never sent: no client maps it */
            why = PD_RING_DECLINE_SOCKET_BUSY;
        }
    }
    if (why >= 0) {
        s->loop->metrics.rings_declined[why]++;
        pd_log_debug("stream_ring", "conn=%llu id=%llu declined=%s bytes=%llu",
                     (unsigned long long)pd_conn_serial(s->conn), (unsigned long long)st->id,
                     pd_metrics_ring_decline_name((pd_ring_decline)why), (unsigned long long)size);
        return;
    }
    st->slots = slots;
    st->slot_bytes = slot_bytes;
    s->loop->stats.stream_rings_total++;
}

/* ---- Requests ------------------------------------------------------------------------------- */

/* Validate the rest of a Stream request and start it; 0 when the stream took t over. */
static int pd_stream_start(pd_session *s, uint64_t id, const Permd__V1__Stream *m, const pd_target *tp)
{
    const pd_config *cfg = s->svc->cfg;
    const pd_target t = *tp;
    struct pd_streams *all;
    pd_stream *st;
    if (m->batch == 0) {
        pd_reply_error(s, id, PD_EINVAL, "batch must be at least 1");
        return -1;
    }
    if (pd_reply_count(s, id, m->batch, "batch"))
        return -1;
    if ((uint64_t)m->batch * t.width > PD_FRAME_MAX_LIMIT - PD_BULK_HDR_MAX) { /* 16-byte locations, a high max_count */
        pd_reply_error(s, id, PD_ETOOBIG, "a batch of %llu items of %u bytes would exceed a frame's %u; ask for "
                       "smaller batches", (unsigned long long)m->batch, t.width, PD_FRAME_MAX_LIMIT);
        return -1;
    }
    if (m->credits == 0 || m->credits > cfg->max_credits) {
        pd_reply_error(s, id, PD_EINVAL, "credits must be in [1, %llu] (max_credits), not %u",
                       (unsigned long long)cfg->max_credits, m->credits);
        return -1;
    }
    if (pd_stream_find(s, id)) {
        pd_reply_error(s, id, PD_ECONFLICT, "a stream with id %llu is already open on this connection",
                       (unsigned long long)id);
        return -1;
    }
    if (!(all = pd_streams_of(s))) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return -1;
    }
    if (all->live >= cfg->max_streams) { /* a cancelled stream's last batch does not count */
        pd_reply_error(s, id, PD_EBUSY, "too many streams on this connection (max_streams = %llu)",
                       (unsigned long long)cfg->max_streams);
        return -1;
    }
    if (!(st = calloc(1, sizeof *st))) {
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return -1;
    }
    atomic_init(&st->stopped, 0);
    st->s = s;
    st->id = id;
    st->ring = PD_RING_NONE;
    st->t = t;
    st->batch = m->batch;
    st->credits = m->credits;
    st->unscheduled = m->max_count && m->max_count < t.remaining ? m->max_count : t.remaining;
    st->sent_offset = t.slice.offset;
    /* Before the stream is linked: were sending to close the connection, closing would free a
     * linked stream under us. */
    if (m->ring)
        pd_stream_ring_setup(st, m->credits, m->reuse_ring);
    if (!pd_conn_open(s->conn)) {
        pd_stream_ring_put(s, &st->ring);
        free(st);
        return -1;
    }
    st->next = all->head;
    all->head = st;
    all->n++;
    all->live++;
    s->loop->stats.streams_total++;
    s->loop->stats.streams_active++;
    pd_log_debug("stream_open", "conn=%llu id=%llu dataset=%s ids=%llu batch=%llu",
                 (unsigned long long)pd_conn_serial(s->conn), (unsigned long long)id, t.ds.name,
                 (unsigned long long)st->unscheduled, (unsigned long long)st->batch);
    pd_streams_pump(s); /* in turn with the session's other streams */
    return 0;
}

void pd_on_stream(pd_session *s, uint64_t id, const Permd__V1__Stream *m)
{
    pd_target t;
    if (pd_reply_slice(s, id, m->slice, m->locations, &t))
        return;
    if (pd_stream_start(s, id, m, &t))
        pd_target_release(&t);
}

void pd_on_credit(pd_session *s, uint64_t id, const Permd__V1__Credit *m)
{
    pd_stream *st = pd_stream_find(s, id);
    if (!st)
        return;
    uint64_t total = (uint64_t)st->credits + m->credits;
    uint64_t cap = st->ring.base ? st->slots : s->svc->cfg->max_credits; /* a ring has no room for more */
    st->credits = (uint32_t)(total < cap ? total : cap);
    pd_streams_pump(s); /* in turn with the session's other streams */
}

void pd_on_cancel(pd_session *s, uint64_t id, const Permd__V1__Cancel *m)
{
    pd_stream *st = pd_stream_find(s, id);
    (void)m;
    if (!st)
        return;
    /* Batches already generated are not sent: StreamEnd reports exactly what was. */
    pd_stream_send_end(st, PERMD__V1__END_REASON__END_REASON_CANCELLED);
    pd_stream_stop(st);
}

/* ---- The session's teardown ----------------------------------------------------------------- */

int pd_streams_end_all(pd_session *s, int shutdown)
{
    Permd__V1__EndReason reason =
        shutdown ? PERMD__V1__END_REASON__END_REASON_SHUTDOWN : PERMD__V1__END_REASON__END_REASON_CANCELLED;
    pd_stream *st = s->streams ? s->streams->head : NULL;
    int ended = 0;
    while (st) {
        pd_stream *next = st->next;
        if (!st->ended) {
            pd_stream_send_end(st, reason);
            pd_stream_stop(st);
            ended++;
        }
        st = next;
    }
    return ended;
}

void pd_streams_discard_all(pd_session *s)
{
    pd_stream *st = s->streams ? s->streams->head : NULL;
    while (st) {
        pd_stream *next = st->next;
        if (!st->ended)
            pd_stream_stop(st);
        st = next;
    }
}

void pd_streams_free(pd_session *s)
{
    if (!s->streams)
        return;
    while (s->streams->head)
        pd_stream_unlink_free(s->streams->head);
    pd_stream_ring_release(s, &s->streams->spare_ring);
    atomic_fetch_sub(&s->svc->ring_bytes, s->streams->held_bytes); /* the client's to keep: no longer permd's */
    free(s->streams);
    s->streams = NULL;
}
