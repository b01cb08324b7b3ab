/* Request handlers: decode one Envelope, validate it, and answer inline or through a worker-pool job. */
#ifndef PD_HANDLERS_H
#define PD_HANDLERS_H

#include <stddef.h>
#include <stdint.h>

#include "core/rank.h"
#include "daemon/conn.h"
#include "daemon/registry.h"

/* Handle one frame's payload (already length-checked). */
void pd_handle_frame(pd_conn *c, const uint8_t *payload, uint32_t len);

/* A Slice message checked against the registry and ready to generate. */
typedef struct pd_target {
    pd_dataset ds;
    pd_perm perm;
    pd_slice slice;
    unsigned width;     /* bytes per id on the wire */
    uint64_t epoch_len; /* T */
    uint64_t remaining; /* ids the rank has left after slice.offset */
} pd_target;

/* PD_EINVAL / PD_ENOTFOUND with a message for the Error reply. */
int pd_target_resolve(pd_server *s, const Permd__V1__Slice *m, pd_target *t, char *msg, size_t len);

/* The offset that continues after `got` more ids of the rank (clamped to T). */
uint64_t pd_target_next_offset(const pd_target *t, uint64_t offset, uint64_t got);

/* A dataset name safe to echo in messages and logs (request strings may be
 * arbitrary bytes, and replies must stay valid UTF-8). */
const char *pd_printable_name(const char *name);

#endif
