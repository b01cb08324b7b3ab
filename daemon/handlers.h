/* Request handlers: decode one Envelope, validate it, and answer inline or through a worker-pool job. */
#ifndef PD_HANDLERS_H
#define PD_HANDLERS_H

#include <stddef.h>
#include <stdint.h>

#include "core/rank.h"
#include "daemon/conn.h"
#include "daemon/backend.h"
#include "daemon/registry.h"

/* Handle one frame's payload (already length-checked). */
void pd_handle_frame(pd_conn *c, const uint8_t *payload, uint32_t len);

/* A Slice message checked against the registry and ready to generate. */
typedef struct pd_target {
    pd_dataset ds;
    pd_perm perm;           /* flat datasets */
    struct pd_plan *plan;   /* sharded datasets: a reference (pd_target_release) */
    pd_slice slice;
    unsigned width;         /* bytes per item on the wire: 4 or 8 (ids), 16 (locations) */
    uint64_t epoch_len;     /* T */
    uint64_t remaining;     /* ids the rank has left after slice.offset */
} pd_target;

/* PD_EINVAL / PD_ENOTFOUND with a message for the Error reply. locations:
 * (shard, offset) pairs instead of ids (sharded datasets only). */
int pd_target_resolve(pd_server *s, const Permd__V1__Slice *m, int locations, pd_target *t, char *msg, size_t len);

/* Drop what resolve acquired (the plan reference). */
void pd_target_release(pd_target *t);

/* Whether generating for t may block on building its plan (then: the pool, not the loop). */
int pd_target_may_block(const pd_target *t);

/* The rank's next min(count, remaining) items of slice (t's dataset, epoch and
 * layout) into out, as the wire wants them. Builds a sharded plan if needed:
 * off the loop unless !pd_target_may_block. */
int pd_target_generate(pd_backend *b, const pd_target *t, const pd_slice *slice, uint64_t count, void *out,
                       uint64_t *written);

/* A sharded upload in progress on a connection. */
struct pd_upload;
void pd_upload_free(struct pd_upload *u);

/* The offset that continues after `got` more ids of the rank (clamped to T). */
uint64_t pd_target_next_offset(const pd_target *t, uint64_t offset, uint64_t got);

/* A dataset name safe to echo in messages and logs (request strings may be
 * arbitrary bytes, and replies must stay valid UTF-8). */
const char *pd_printable_name(const char *name);

#endif
