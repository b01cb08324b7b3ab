/* Streams: batches pushed to the client while it has credits and its connection is under the output cap. */
#ifndef PD_STREAM_H
#define PD_STREAM_H

#include <stdint.h>

#include "daemon/conn.h"

#define PD_STREAM_MAX_INFLIGHT 4 /* batches generated ahead, per stream */
/* Larger batches always go to the pool, whatever inline_ids allows: the
 * pool splits them over threads, and the loop thread generating one alone
 * (about 250 µs for 65536 ids) held up the stream by up to 15% (measured). */
#define PD_STREAM_INLINE_MAX 4096

void pd_stream_open(pd_conn *c, uint64_t id, const Permd__V1__Stream *m);
/* Credit and Cancel for a stream that already ended are ignored: they
 * race with its last batch by nature. */
void pd_stream_credit(pd_conn *c, uint64_t id, uint32_t credits);
void pd_stream_cancel(pd_conn *c, uint64_t id);

/* Schedule batches on every stream that may produce (after credits arrive
 * or output drains). */
void pd_stream_pump(pd_conn *c);

/* Send StreamEnd(reason) for every live stream and stop them. */
void pd_stream_end_all(pd_conn *c, Permd__V1__EndReason reason);
/* Stop every stream without a message (the connection is going away). */
void pd_stream_discard_all(pd_conn *c);
/* Free what is left when the connection is freed (no jobs remain). */
void pd_stream_free_all(pd_conn *c);

#endif
