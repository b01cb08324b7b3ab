/* Digests of a rank's ids, computed through the same fills that serve them. */
#include "digest.h"

#define PD_DIGEST_CHUNK 1024

void pd_digest_init(pd_digest *d)
{
    d->count = d->sum = d->hash = 0;
}

void pd_digest_merge(pd_digest *into, const pd_digest *other)
{
    into->count += other->count;
    into->sum += other->sum;
    into->hash += other->hash;
}

int pd_digest_equal(const pd_digest *a, const pd_digest *b)
{
    return a->count == b->count && a->sum == b->sum && a->hash == b->hash;
}

/* Both digests walk the rank's remaining ids in chunks through a fill function. */
typedef int (*pd_fill_fn)(const void *src, const pd_slice *s, uint64_t count, uint64_t *out, uint64_t *written);

static int pd_digest_fill(const void *src, uint64_t n, const pd_slice *s, pd_fill_fn fill, pd_digest *out)
{
    uint64_t ids[PD_DIGEST_CHUNK], left, got;
    if (!src || !s || !out)
        return PD_EINVAL;
    int rc = pd_slice_remaining(n, s, &left);
    if (rc)
        return rc;
    pd_slice cur = *s;
    pd_digest_init(out);
    while (left) {
        if ((rc = fill(src, &cur, left < PD_DIGEST_CHUNK ? left : PD_DIGEST_CHUNK, ids, &got)))
            return rc;
        for (uint64_t i = 0; i < got; i++)
            pd_digest_add(out, ids[i]);
        left -= got;
        cur.offset += got * cur.world; /* stays ≤ T while ids remain */
    }
    return PD_OK;
}

static int pd_fill_flat(const void *src, const pd_slice *s, uint64_t count, uint64_t *out, uint64_t *written)
{
    return pd_slice_fill_u64((const pd_perm *)src, s, count, out, written);
}

static int pd_fill_sharded(const void *src, const pd_slice *s, uint64_t count, uint64_t *out, uint64_t *written)
{
    return pd_shard_slice_fill_u64((const pd_shard_plan *)src, s, count, out, written);
}

int pd_digest_slice(const pd_perm *perm, const pd_slice *s, pd_digest *out)
{
    return pd_digest_fill(perm, perm ? perm->n : 0, s, pd_fill_flat, out);
}

int pd_digest_shard_slice(const pd_shard_plan *plan, const pd_slice *s, pd_digest *out)
{
    return pd_digest_fill(plan, plan ? plan->n : 0, s, pd_fill_sharded, out);
}

/* A mixture's fill needs its cursor and epoch: both travel as the source. */
typedef struct pd_mix_source {
    pd_mix_cursor *cursor;
    uint64_t epoch;
} pd_mix_source;

static int pd_fill_mixture(const void *src, const pd_slice *s, uint64_t count, uint64_t *out, uint64_t *written)
{
    const pd_mix_source *m = src;
    return pd_mix_slice_fill_u64(m->cursor, m->epoch, s, count, out, written);
}

int pd_digest_mix_slice(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, pd_digest *out)
{
    if (!c || !pd_mix_epoch_ok(c->mix, epoch))
        return PD_EINVAL;
    const pd_mix_source src = {c, epoch};
    return pd_digest_fill(&src, c->mix->length, s, pd_fill_mixture, out);
}
