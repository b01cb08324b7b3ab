/* Positions and ranks (spec §5): the epoch stream, its length per mode, and each rank's share of it. */
#ifndef PD_RANK_H
#define PD_RANK_H

#include "perm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pd_mode {
    PD_MODE_PAD = 0,   /* T = ⌈n/W⌉·W; positions ≥ n wrap to σ(p mod n) */
    PD_MODE_DROP = 1,  /* T = ⌊n/W⌋·W */
    PD_MODE_EXACT = 2, /* T = n: every sample exactly once */
} pd_mode;

/* One rank's view of an epoch: rank r of W reads global positions
 * offset + r + k·W, k = 0, 1, … while they are below T. A checkpoint is
 * just (seed, epoch, offset), and offset means the same under any W. */
typedef struct pd_slice {
    uint32_t world;  /* W ≥ 1 */
    uint32_t rank;   /* r < W */
    pd_mode mode;
    uint64_t offset; /* global positions already consumed, ≤ T */
} pd_slice;

/* Parse "pad" / "drop" / "exact"; PD_EINVAL otherwise. */
int pd_mode_parse(const char *s, pd_mode *mode);
const char *pd_mode_name(pd_mode mode);

/* Bytes per sample id on the wire and in buffers: 4 when every id fits u32 (n ≤ 2^32), else 8. */
unsigned pd_id_width(uint64_t n);

/* T, the epoch stream's length. PD_EINVAL for n outside [1, 2^63], W = 0 or an unknown mode. */
int pd_epoch_length(uint64_t n, uint32_t world, pd_mode mode, uint64_t *len);

/* Validate a slice against n: W ≥ 1, r < W, a known mode (PD_EINVAL); offset ≤ T (PD_ERANGE). */
int pd_slice_check(uint64_t n, const pd_slice *s);

/* How many samples the rank has left after its offset (0 past T). */
int pd_slice_remaining(uint64_t n, const pd_slice *s, uint64_t *count);

/* The global position of the rank's k-th remaining sample; PD_ERANGE at or past T. */
int pd_slice_position(uint64_t n, const pd_slice *s, uint64_t k, uint64_t *position);

/* The sample id at a global stream position p < T (σ(p mod n) covers pad's wrap). */
PD_STATIC_INLINE uint64_t pd_stream_sample(const pd_perm *perm, uint64_t position)
{
    return pd_perm_at(perm, position < perm->n ? position : position % perm->n);
}

/* Write the rank's next min(count, remaining) sample ids, starting at its
 * k-th = first remaining position, into out; *written gets how many. A
 * request past T writes nothing and succeeds. PD_EOVERFLOW for the u32
 * variant when n > 2^32. */
int pd_slice_fill_u64(const pd_perm *perm, const pd_slice *s, uint64_t count, uint64_t *out,
                      uint64_t *written);
int pd_slice_fill_u32(const pd_perm *perm, const pd_slice *s, uint64_t count, uint32_t *out,
                      uint64_t *written);

#ifdef __cplusplus
}
#endif

#endif
