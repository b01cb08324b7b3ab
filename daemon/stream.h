/* Stream handlers: batches pushed to the client while it has credits and its connection is under the output cap. */
#ifndef PD_STREAM_H
#define PD_STREAM_H

#include <stdint.h>

#include "daemon/service.h"
#include "proto/frame.h"

/* Larger batches always go to the pool, whatever inline_ids allows: the
 * pool splits them over threads, and the loop thread generating one alone
 * (about 250 µs for 65536 ids) held up the stream by up to 15% (measured). */
#define PD_STREAM_INLINE_MAX 4096

void pd_on_stream(pd_session *s, uint64_t id, const Permd__V1__Stream *m);
/* Credit and Cancel for a stream that already ended are ignored: they
 * race with its last batch by nature. */
void pd_on_credit(pd_session *s, uint64_t id, const Permd__V1__Credit *m);
void pd_on_cancel(pd_session *s, uint64_t id, const Permd__V1__Cancel *m);

/* Schedule batches on every stream that may produce (after credits arrive or output drains). */
void pd_streams_pump(pd_session *s);
/* Send StreamEnd (SHUTDOWN, or CANCELLED when the peer sent EOF) for every live stream and stop
 * them; returns how many there were. */
int pd_streams_end_all(pd_session *s, int shutdown);
/* Stop every stream without a message (the connection is draining or going away). */
void pd_streams_discard_all(pd_session *s);
/* Free what is left when the session is freed (no jobs remain). */
void pd_streams_free(pd_session *s);

#endif
