/* Order-independent digests of served ids (count, sum, hash-sum), so a job can verify exactly-once delivery. */
#ifndef PD_DIGEST_H
#define PD_DIGEST_H

#include "defs.h"
#include "mixture.h"
#include "shards.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A multiset digest: equal multisets give equal digests whatever the order;
 * a repeated, missing or changed id changes count, sum or hash (the hash
 * terms are a strong 64-bit mix, so compensating changes are ~2^-64 likely). */
typedef struct pd_digest {
    uint64_t count;
    uint64_t sum;  /* Σ id mod 2^64 */
    uint64_t hash; /* Σ mix(id) mod 2^64 */
} pd_digest;

/* The mix is splitmix64's finalizer, with an offset so that id 0 contributes. */
PD_STATIC_INLINE uint64_t pd_digest_mix(uint64_t id)
{
    uint64_t z = id + UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

PD_STATIC_INLINE void pd_digest_add(pd_digest *d, uint64_t id)
{
    d->count++;
    d->sum += id;
    d->hash += pd_digest_mix(id);
}

void pd_digest_init(pd_digest *d);
void pd_digest_merge(pd_digest *into, const pd_digest *other);
int pd_digest_equal(const pd_digest *a, const pd_digest *b);

/* Digest of everything a rank reads from its offset to the end of the epoch (O(T/W)). */
int pd_digest_slice(const pd_perm *perm, const pd_slice *s, pd_digest *out);
int pd_digest_shard_slice(const pd_shard_plan *plan, const pd_slice *s, pd_digest *out);
/* The same over mixture epoch E of a mixture (docs/spec/mixtures-v1.md), through a cursor. */
int pd_digest_mix_slice(pd_mix_cursor *c, uint64_t epoch, const pd_slice *s, pd_digest *out);

#ifdef __cplusplus
}
#endif

#endif
