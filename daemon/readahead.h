/* Fetch readahead: a connection that reads its slice in order gets its next Fetch generated while the loop is idle. */
#ifndef PD_READAHEAD_H
#define PD_READAHEAD_H

#include <stdint.h>

#include "daemon/service.h"
#include "daemon/target.h"

/* The loop's half: an idle handle that generates queued predictions before the loop blocks.
 * PD_ENOMEM. */
int pd_readahead_loop_open(pd_loop *l);
/* Close it (at shutdown; the loop then runs the handle down and frees it). */
void pd_readahead_loop_close(pd_loop *l);

/* A Fetch of count ids (got of them left) for t: the got * t->width bytes of its reply when the
 * prediction holds exactly these ids, else NULL. Valid until pd_readahead_note or _drop. */
const uint8_t *pd_readahead_find(pd_session *s, const pd_target *t, uint64_t count, uint64_t got);

/* After a Fetch of count ids for t was served (got of them, remaining after): remember it, and if it
 * continued the previous one, queue the next for the idle pass. Predictions are replies of at most
 * readahead_bytes (a training batch of ids; larger Fetches are rarer) that the loop may generate itself
 * (within inline_ids): each sequential connection holds a buffer as big as its replies
 * (permd_readahead_bytes); 0: none is made. */
void pd_readahead_note(pd_session *s, const pd_target *t, uint64_t count, uint64_t got, uint64_t remaining);

/* The connection is closing: leave the queue, free the buffer. */
void pd_readahead_drop(pd_session *s);

#endif
