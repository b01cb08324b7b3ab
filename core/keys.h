/* Key schedule (spec §2): the 24 round keys and the parity flip of one (seed, epoch, stream). */
#ifndef PD_KEYS_H
#define PD_KEYS_H

#include "defs.h"
#include "philox.h"

#define PD_ROUNDS 24

/* Reserved streams (spec §1). Any document that defines a new stream lists it in the spec too. */
#define PD_STREAM_SAMPLES 0u

typedef struct pd_keys {
    uint32_t k[PD_ROUNDS];
    uint32_t flip; /* 0 or 1: whether f swaps the images 0 and 1 (parity correction) */
} pd_keys;

/* Derive the keys. seed and epoch enter Philox separately (key and counter),
 * never as a sum, so (s, e+1) and (s+1, e) are unrelated. Cannot fail. */
PD_STATIC_INLINE void pd_keys_derive(uint64_t seed, uint64_t epoch, uint32_t stream, pd_keys *out)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {0, stream, (uint32_t)epoch, (uint32_t)(epoch >> 32)};
    for (uint32_t j = 0; j < 6; j++) {
        ctr[0] = j;
        pd_philox4x32_10(ctr, key, &out->k[4 * j]);
    }
    uint32_t last[4];
    ctr[0] = 6;
    pd_philox4x32_10(ctr, key, last);
    out->flip = last[0] & 1u;
}

#endif
