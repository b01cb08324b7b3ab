/* Framing shared by the daemon and the clients: a 4-byte little-endian length, then one serialized Envelope. */
#ifndef PD_FRAME_H
#define PD_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "proto/permd.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PD_FRAME_PREFIX 4u                /* bytes of the length prefix */
#define PD_PROTOCOL_VERSION 1u
#define PD_FRAME_MAX_LIMIT 0x7fffffffu    /* no configuration may exceed this */

typedef Permd__V1__Envelope pd_envelope;

/* ---- Incremental decoder -------------------------------------------------
 * Bytes arrive in arbitrary pieces; the reader hands out space to read into
 * (so a socket reads straight into it), then returns each complete frame's
 * payload without copying. A length above max_frame is reported before any
 * of the payload is buffered, and the buffer grows with the bytes that
 * arrive, not with the length announced: a hostile peer cannot make it
 * allocate more than about twice what it has sent. */
typedef struct pd_frame_reader {
    uint8_t *buf;
    size_t cap;        /* allocated bytes */
    size_t base_cap;   /* the size it shrinks back to when idle */
    size_t start, end; /* unconsumed bytes are buf[start, end) */
    uint32_t max_frame;
} pd_frame_reader;

int pd_frame_reader_init(pd_frame_reader *r, size_t base_cap, uint32_t max_frame);
void pd_frame_reader_free(pd_frame_reader *r);

/* Space for the next read: the buffer compacts, and grows (doubling, as the
 * frame's bytes arrive) towards a frame whose length is already known.
 * Invalidates payload pointers returned earlier. PD_ENOMEM. */
int pd_frame_reader_space(pd_frame_reader *r, uint8_t **buf, size_t *len);
/* Account n bytes just read into the space. */
void pd_frame_reader_commit(pd_frame_reader *r, size_t n);
/* The next complete frame: 1 with its payload, 0 when more bytes are
 * needed, PD_ETOOBIG when the announced length exceeds max_frame. The
 * payload stays valid until the next pd_frame_reader_space call. */
int pd_frame_reader_next(pd_frame_reader *r, const uint8_t **payload, uint32_t *len);
/* Drop everything buffered (a connection that is closing ignores its input). */
void pd_frame_reader_discard(pd_frame_reader *r);
/* Bytes buffered but not yet returned as frames. */
size_t pd_frame_reader_pending(const pd_frame_reader *r);

/* ---- Encoding ------------------------------------------------------------ */

/* Bytes pd_frame_pack will write: prefix + serialized envelope. */
size_t pd_frame_size(const pd_envelope *env);
/* Write prefix + envelope into out (pd_frame_size bytes); returns that size. */
size_t pd_frame_pack(const pd_envelope *env, uint8_t *out);

/* Frames whose body ends in a large bytes field (FetchReply.ids,
 * StreamBatch.ids) are written in two parts so that ids can be generated
 * straight into the outgoing buffer: first this header, which is the
 * prefix, the envelope id, the body's tag and length, the body's other
 * fields (`head`, serialized by protobuf-c) and the bytes field's tag and
 * length; then bytes_len raw bytes follow. Protobuf fields may appear in any
 * order, so the result is an ordinary Envelope. */
size_t pd_frame_bulk_header_size(uint64_t id, uint32_t body_field, const ProtobufCMessage *head,
                                 uint32_t bytes_field, uint64_t bytes_len);
/* Write that header into out (cap bytes); *hdr_len gets its size.
 * PD_ETOOBIG when the frame would exceed PD_FRAME_MAX_LIMIT; PD_EINVAL when cap is short. */
int pd_frame_bulk_header(uint8_t *out, size_t cap, uint64_t id, uint32_t body_field,
                         const ProtobufCMessage *head, uint32_t bytes_field, uint64_t bytes_len,
                         size_t *hdr_len);

/* Parse one payload; PD_EPROTO when it is not a valid Envelope. Free with
 * protobuf_c_message_free_unpacked (a no-op with an arena allocator). */
int pd_frame_unpack(const uint8_t *payload, size_t len, ProtobufCAllocator *alloc, pd_envelope **env);

/* Whether every string field of an Envelope payload (at any depth) holds no NUL byte: protobuf-c
 * hands strings out NUL-terminated, so "abc\0../x" would be read as "abc" and a token followed by
 * "\0junk" would compare equal; such a request must be refused, not truncated. 0, PD_EINVAL with
 * the field's name in *bad, or PD_EPROTO when the payload is not well formed. */
int pd_frame_check_strings(const uint8_t *payload, size_t len, const char **bad);

/* Read a FetchReply or StreamBatch without copying its ids: the varint
 * fields 1-4 of the body land in f[1..4] and `ids` points into payload.
 * protobuf-c would copy the bytes field; at stream rates that copy costs as
 * much as the socket read, so the hot reply types are scanned by hand. */
typedef struct pd_bulk_view {
    uint64_t id;          /* Envelope.id */
    uint32_t body_field;  /* the body's field number */
    uint64_t f[6];        /* FetchReply: id_width, count, next_offset, remaining; StreamBatch: …, seq, ring_offset */
    const uint8_t *ids;
    uint64_t ids_len;
} pd_bulk_view;

/* 1 when the envelope's body is field `want` (filled in v), 0 when it is
 * another body (unpack it with pd_frame_unpack), PD_EPROTO when malformed. */
int pd_frame_scan_bulk(const uint8_t *payload, size_t len, uint32_t want, pd_bulk_view *v);

/* ---- Wire enums <-> core codes ------------------------------------------ */

/* PD_E* -> ErrorCode sent in an Error message, and back (PD_EPROTO for unknown codes). */
Permd__V1__ErrorCode pd_wire_error_code(int err);
int pd_wire_error_to_pd(Permd__V1__ErrorCode code);
/* A symbolic name ("TOO_LARGE") for logs and permctl. */
const char *pd_wire_error_name(Permd__V1__ErrorCode code);

/* Mode on the wire (MODE_PAD = 1 …) <-> core pd_mode (PD_MODE_PAD = 0 …); PD_EINVAL when unspecified or unknown. */
int pd_wire_mode_to_pd(int wire_mode, int *mode);
int pd_wire_mode_from_pd(int mode);

/* Little-endian stores and loads for the raw id fields. */
static inline void pd_store_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t pd_load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void pd_store_le64(uint8_t *p, uint64_t v)
{
    pd_store_le32(p, (uint32_t)v);
    pd_store_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t pd_load_le64(const uint8_t *p)
{
    return (uint64_t)pd_load_le32(p) | (uint64_t)pd_load_le32(p + 4) << 32;
}

#ifdef __cplusplus
}
#endif

#endif
