/* Replies and the checks every handler shares: the envelope around a message, Error replies, slices, counts, bulk frames. */
#ifndef PD_REPLY_H
#define PD_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/service.h"
#include "daemon/target.h"
#include "proto/frame.h"

#define PD_BULK_HDR_MAX 128 /* a bulk frame header: prefix, id, two tags and lengths, a few small fields */

/* Queue msg as the reply to request id: body_case is its Envelope field (PERMD__V1__ENVELOPE__BODY_*)
 * and msg a message of that field's type. PD_ENOMEM, PD_ECLOSED; PD_ETOOBIG (nothing queued) for a frame
 * over PD_FRAME_MAX_LIMIT. */
int pd_reply(pd_session *s, uint64_t id, int body_case, const void *msg);

/* The same, with a file descriptor riding on the frame's first byte (Unix sockets; see
 * pd_conn_send_fd for when it cannot be sent). */
int pd_reply_fd(pd_session *s, uint64_t id, int body_case, const void *msg, int fd);

/* An Error reply (err: a PD_E* code, mapped to the wire's ErrorCode), counted by request type. */
void pd_reply_error(pd_session *s, uint64_t id, int err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* pd_reply_error counted under metrics slot `slot`, not the connection's current request's: for an error
 * that answers an earlier request (a stream's, sent when a later Credit or another request runs). */
void pd_reply_error_as(pd_session *s, uint64_t id, int slot, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Resolve a request's Slice into t; when it cannot be, reply with the error and return it. */
int pd_reply_slice(pd_session *s, uint64_t id, const Permd__V1__Slice *m, int locations, pd_target *t);

/* 0 when count ≤ max_count; else a TOO_LARGE reply ("<what> N exceeds max_count M") and PD_ETOOBIG. */
int pd_reply_count(pd_session *s, uint64_t id, uint64_t count, const char *what);

/* The header of a frame whose body ends in `bytes` raw bytes (pd_frame_bulk_header), into
 * hdr[PD_BULK_HDR_MAX]; when it cannot be built, an error reply and nonzero. */
int pd_reply_bulk_header(pd_session *s, uint64_t id, int body_case, const ProtobufCMessage *head, uint64_t bytes,
                         uint8_t *hdr, size_t *hlen);

/* A bulk frame built inline in the output buffer: the header, then count items of t's slice,
 * generated (or copied from `ready` when not NULL). On failure nothing is committed and the error
 * is returned (the caller replies). Where generating would block the loop (pd_target_generate_now),
 * nothing is committed either: *deferred is set, 0 returned, and the caller hands the work to a worker. */
int pd_reply_bulk_inline(pd_session *s, const uint8_t *hdr, size_t hlen, const pd_target *t, const pd_slice *slice,
                         uint64_t count, const uint8_t *ready, int *deferred);

/* A bulk frame built in its own buffer off the loop (a worker fills payload, 16-byte aligned), then
 * sent as one owned write (pd_conn_write_owned(conn, base, frame, frame_len)). */
typedef struct pd_bulk {
    uint8_t *base, *frame, *payload;
    size_t frame_len;
    size_t cap; /* bytes at base */
} pd_bulk;
/* A frame of hlen header bytes (copied) and bytes of payload (16-aligned) in one block: the connection's kept
 * block when it is large enough (pd_conn_take_block; c may be NULL), else a new one. PD_ENOMEM. */
int pd_bulk_alloc(pd_bulk *b, pd_conn *c, const uint8_t *hdr, size_t hlen, size_t bytes);

/* Bytes of entries one List reply (ListDatasets, ListMixtures) holds at most: what every client reads
 * (8 x max_count + 64 KiB), less the envelope's. A longer list comes in pages to clients that ask. */
uint64_t pd_list_budget(const pd_config *cfg);
/* What a repeated message field's entry of `packed` bytes adds to a reply. */
size_t pd_list_entry_bytes(size_t packed);

#endif
