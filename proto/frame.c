/* Frame decoding and encoding: the length prefix, the bulk-payload header, and wire enum mappings. */
#include "proto/frame.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rank.h"

#define PD_READER_MIN_FREE 4096u /* compact or grow when less than this is free */

int pd_frame_reader_init(pd_frame_reader *r, size_t base_cap, uint32_t max_frame)
{
    memset(r, 0, sizeof *r);
    if (base_cap < PD_READER_MIN_FREE)
        base_cap = PD_READER_MIN_FREE;
    r->buf = malloc(base_cap);
    if (!r->buf)
        return PD_ENOMEM;
    r->cap = r->base_cap = base_cap;
    r->max_frame = max_frame;
    return 0;
}

void pd_frame_reader_free(pd_frame_reader *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

size_t pd_frame_reader_pending(const pd_frame_reader *r)
{
    return r->end - r->start;
}

void pd_frame_reader_discard(pd_frame_reader *r)
{
    r->start = r->end = 0;
}

/* The size of the frame at the front, or 0 while its prefix is incomplete. */
static size_t pd_frame_reader_want(const pd_frame_reader *r)
{
    if (r->end - r->start < PD_FRAME_PREFIX)
        return 0;
    uint32_t len = pd_load_le32(r->buf + r->start);
    if (len > r->max_frame)
        return 0; /* pd_frame_reader_next reports it */
    return PD_FRAME_PREFIX + (size_t)len;
}

int pd_frame_reader_space(pd_frame_reader *r, uint8_t **buf, size_t *len)
{
    size_t pending = r->end - r->start;
    size_t want = pd_frame_reader_want(r);
    size_t need = want > pending ? want - pending : 0;
    /* Room for as much again as has arrived, not for all that is announced: a peer that announces a
     * large frame and sends little holds little (the buffer doubles as its bytes come). */
    if (need > pending + PD_READER_MIN_FREE)
        need = pending + PD_READER_MIN_FREE;
    if (need < PD_READER_MIN_FREE)
        need = PD_READER_MIN_FREE;

    if (pending == 0) {
        r->start = r->end = 0;
        if (r->cap > r->base_cap) { /* a large frame came and went: give the memory back */
            uint8_t *small = malloc(r->base_cap);
            if (small) {
                free(r->buf);
                r->buf = small;
                r->cap = r->base_cap;
            }
        }
    }
    if (r->cap - r->end < need) {
        if (r->start > 0) {
            memmove(r->buf, r->buf + r->start, pending);
            r->start = 0;
            r->end = pending;
        }
        if (r->cap - r->end < need) {
            size_t cap = r->cap;
            while (cap - r->end < need)
                cap *= 2;
            uint8_t *nb = realloc(r->buf, cap);
            if (!nb)
                return PD_ENOMEM;
            r->buf = nb;
            r->cap = cap;
        }
    }
    *buf = r->buf + r->end;
    *len = r->cap - r->end;
    return 0;
}

void pd_frame_reader_commit(pd_frame_reader *r, size_t n)
{
    r->end += n;
    if (r->start == r->end)
        r->start = r->end = 0;
}

int pd_frame_reader_next(pd_frame_reader *r, const uint8_t **payload, uint32_t *len)
{
    size_t pending = r->end - r->start;
    if (pending < PD_FRAME_PREFIX)
        return 0;
    uint32_t n = pd_load_le32(r->buf + r->start);
    if (n > r->max_frame)
        return PD_ETOOBIG;
    if (pending - PD_FRAME_PREFIX < n)
        return 0;
    *payload = r->buf + r->start + PD_FRAME_PREFIX;
    *len = n;
    r->start += PD_FRAME_PREFIX + (size_t)n;
    return 1;
}

size_t pd_frame_size(const pd_envelope *env)
{
    return PD_FRAME_PREFIX + permd__v1__envelope__get_packed_size(env);
}

size_t pd_frame_pack(const pd_envelope *env, uint8_t *out)
{
    size_t n = permd__v1__envelope__pack(env, out + PD_FRAME_PREFIX);
    pd_store_le32(out, (uint32_t)n);
    return PD_FRAME_PREFIX + n;
}

/* ---- Protobuf primitives for the bulk header ----------------------------- */

static size_t pd_varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *pd_varint_put(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

enum { PD_WIRE_VARINT = 0, PD_WIRE_LEN = 2 };

static uint64_t pd_tag(uint32_t field, unsigned wire_type)
{
    return (uint64_t)field << 3 | wire_type;
}

/* Sizes of the nested parts: the body message and the whole envelope. */
static void pd_bulk_sizes(uint64_t id, uint32_t body_field, size_t head_len, uint32_t bytes_field,
                          uint64_t bytes_len, uint64_t *body_len, uint64_t *env_len)
{
    *body_len = head_len + pd_varint_size(pd_tag(bytes_field, PD_WIRE_LEN)) + pd_varint_size(bytes_len) +
                bytes_len;
    *env_len = (id ? 1 + pd_varint_size(id) : 0) + pd_varint_size(pd_tag(body_field, PD_WIRE_LEN)) +
               pd_varint_size(*body_len) + *body_len;
}

size_t pd_frame_bulk_header_size(uint64_t id, uint32_t body_field, const ProtobufCMessage *head,
                                 uint32_t bytes_field, uint64_t bytes_len)
{
    uint64_t body_len, env_len;
    size_t head_len = protobuf_c_message_get_packed_size(head);
    pd_bulk_sizes(id, body_field, head_len, bytes_field, bytes_len, &body_len, &env_len);
    return (size_t)(PD_FRAME_PREFIX + env_len - bytes_len);
}

int pd_frame_bulk_header(uint8_t *out, size_t cap, uint64_t id, uint32_t body_field,
                         const ProtobufCMessage *head, uint32_t bytes_field, uint64_t bytes_len,
                         size_t *hdr_len)
{
    uint64_t body_len, env_len;
    size_t head_len = protobuf_c_message_get_packed_size(head);
    pd_bulk_sizes(id, body_field, head_len, bytes_field, bytes_len, &body_len, &env_len);
    if (env_len > PD_FRAME_MAX_LIMIT)
        return PD_ETOOBIG;
    size_t need = (size_t)(PD_FRAME_PREFIX + env_len - bytes_len);
    if (cap < need)
        return PD_EINVAL;
    uint8_t *p = out;
    pd_store_le32(p, (uint32_t)env_len);
    p += PD_FRAME_PREFIX;
    if (id) {
        p = pd_varint_put(p, pd_tag(1, PD_WIRE_VARINT)); /* Envelope.id */
        p = pd_varint_put(p, id);
    }
    p = pd_varint_put(p, pd_tag(body_field, PD_WIRE_LEN));
    p = pd_varint_put(p, body_len);
    p += protobuf_c_message_pack(head, p);
    p = pd_varint_put(p, pd_tag(bytes_field, PD_WIRE_LEN));
    p = pd_varint_put(p, bytes_len);
    *hdr_len = (size_t)(p - out);
    return 0;
}

/* ---- Scanning bulk replies -------------------------------------------------- */

static int pd_varint_get(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return PD_EPROTO;
}

/* Skip one field's value of the given wire type; PD_EPROTO on groups or overruns. */
static int pd_skip_field(const uint8_t **p, const uint8_t *end, unsigned wire_type)
{
    uint64_t v;
    switch (wire_type) {
    case 0:
        return pd_varint_get(p, end, &v);
    case 1:
        if (end - *p < 8)
            return PD_EPROTO;
        *p += 8;
        return 0;
    case 2:
        if (pd_varint_get(p, end, &v) || v > (uint64_t)(end - *p))
            return PD_EPROTO;
        *p += v;
        return 0;
    case 5:
        if (end - *p < 4)
            return PD_EPROTO;
        *p += 4;
        return 0;
    }
    return PD_EPROTO;
}

/* The strings of one message (and of the messages inside it), depth-first. */
static int pd_strings_whole(const uint8_t *p, const uint8_t *end, const ProtobufCMessageDescriptor *d, int depth,
                            const char **bad)
{
    uint64_t tag, n;
    while (p < end) {
        if (pd_varint_get(&p, end, &tag))
            return PD_EPROTO;
        unsigned wt = (unsigned)(tag & 7);
        if (wt != PD_WIRE_LEN) {
            if (pd_skip_field(&p, end, wt))
                return PD_EPROTO;
            continue;
        }
        if (pd_varint_get(&p, end, &n) || n > (uint64_t)(end - p))
            return PD_EPROTO;
        const ProtobufCFieldDescriptor *f = d ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) : NULL;
        if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)n)) {
            *bad = f->name;
            return PD_EINVAL;
        }
        if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
            if (depth >= 16) /* deeper than any permd message: not one of ours */
                return PD_EPROTO;
            int rc = pd_strings_whole(p, p + n, f->descriptor, depth + 1, bad);
            if (rc)
                return rc;
        }
        p += n;
    }
    return 0;
}

int pd_frame_check_strings(const uint8_t *payload, size_t len, const char **bad)
{
    *bad = NULL;
    return pd_strings_whole(payload, payload + len, &permd__v1__envelope__descriptor, 0, bad);
}

/* Whether field is one of the Envelope's bodies: a field a newer peer added is not, and is skipped as protobuf-c
 * skips it (docs/protocol.md §12), so the body both readers see is the same. */
static int pd_envelope_body(uint32_t field)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(&permd__v1__envelope__descriptor,
                                                                                (unsigned)field);
    return f && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF);
}

int pd_frame_scan_bulk(const uint8_t *payload, size_t len, uint32_t want, pd_bulk_view *v)
{
    const uint8_t *p = payload, *end = payload + len, *body = NULL;
    uint64_t tag, blen = 0;
    memset(v, 0, sizeof *v);
    while (p < end) {
        if (pd_varint_get(&p, end, &tag))
            return PD_EPROTO;
        uint32_t field = (uint32_t)(tag >> 3);
        unsigned wt = (unsigned)(tag & 7);
        if (field == 1 && wt == PD_WIRE_VARINT) {
            if (pd_varint_get(&p, end, &v->id))
                return PD_EPROTO;
        } else if (wt == PD_WIRE_LEN && pd_envelope_body(field)) {
            if (pd_varint_get(&p, end, &blen) || blen > (uint64_t)(end - p))
                return PD_EPROTO;
            v->body_field = field;
            body = p;
            p += blen;
        } else if (pd_skip_field(&p, end, wt)) {
            return PD_EPROTO;
        }
    }
    if (v->body_field != want || !body)
        return 0;
    p = body;
    end = body + blen;
    while (p < end) {
        if (pd_varint_get(&p, end, &tag))
            return PD_EPROTO;
        uint32_t field = (uint32_t)(tag >> 3);
        unsigned wt = (unsigned)(tag & 7);
        if (field >= 1 && field <= 5 && wt == PD_WIRE_VARINT) {
            if (pd_varint_get(&p, end, &v->f[field]))
                return PD_EPROTO;
        } else if (field == 15 && wt == PD_WIRE_LEN) {
            if (pd_varint_get(&p, end, &v->ids_len) || v->ids_len > (uint64_t)(end - p))
                return PD_EPROTO;
            v->ids = p;
            p += v->ids_len;
        } else if (pd_skip_field(&p, end, wt)) {
            return PD_EPROTO;
        }
    }
    return 1;
}

int pd_frame_unpack(const uint8_t *payload, size_t len, ProtobufCAllocator *alloc, pd_envelope **env)
{
    *env = permd__v1__envelope__unpack(alloc, len, payload);
    return *env ? 0 : PD_EPROTO;
}

/* ---- Wire enums ------------------------------------------------------------ */

static const struct {
    int err;
    Permd__V1__ErrorCode code;
    const char *name;
} pd_wire_errors[] = {
    {PD_EPROTO, PERMD__V1__ERROR_CODE__ERROR_CODE_BAD_FRAME, "BAD_FRAME"},
    {PD_ETOOBIG, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE, "TOO_LARGE"},
    {PD_EUNSUPPORTED, PERMD__V1__ERROR_CODE__ERROR_CODE_UNKNOWN_MESSAGE, "UNKNOWN_MESSAGE"},
    {PD_EINVAL, PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT, "INVALID_ARGUMENT"},
    {PD_ENOTFOUND, PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND, "NOT_FOUND"},
    {PD_ECONFLICT, PERMD__V1__ERROR_CODE__ERROR_CODE_CONFLICT, "CONFLICT"},
    {PD_EAUTH, PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED, "UNAUTHENTICATED"},
    {PD_EBUSY, PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED, "OVERLOADED"},
    {PD_EINTERNAL, PERMD__V1__ERROR_CODE__ERROR_CODE_INTERNAL, "INTERNAL"},
    {PD_EUNAVAILABLE, PERMD__V1__ERROR_CODE__ERROR_CODE_UNAVAILABLE, "UNAVAILABLE"},
};
#define PD_NWIRE_ERRORS (sizeof pd_wire_errors / sizeof pd_wire_errors[0])

Permd__V1__ErrorCode pd_wire_error_code(int err)
{
    if (err == PD_ERANGE || err == PD_EOVERFLOW)
        return PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT;
    for (size_t i = 0; i < PD_NWIRE_ERRORS; i++)
        if (pd_wire_errors[i].err == err)
            return pd_wire_errors[i].code;
    return PERMD__V1__ERROR_CODE__ERROR_CODE_INTERNAL;
}

int pd_wire_error_to_pd(Permd__V1__ErrorCode code)
{
    for (size_t i = 0; i < PD_NWIRE_ERRORS; i++)
        if (pd_wire_errors[i].code == code)
            return pd_wire_errors[i].err;
    return PD_EPROTO;
}

const char *pd_wire_error_name(Permd__V1__ErrorCode code)
{
    for (size_t i = 0; i < PD_NWIRE_ERRORS; i++)
        if (pd_wire_errors[i].code == code)
            return pd_wire_errors[i].name;
    return "UNSPECIFIED";
}

int pd_wire_mode_to_pd(int wire_mode, int *mode)
{
    switch (wire_mode) {
    case PERMD__V1__MODE__MODE_PAD:
        *mode = PD_MODE_PAD;
        return 0;
    case PERMD__V1__MODE__MODE_DROP:
        *mode = PD_MODE_DROP;
        return 0;
    case PERMD__V1__MODE__MODE_EXACT:
        *mode = PD_MODE_EXACT;
        return 0;
    }
    return PD_EINVAL;
}

int pd_wire_mode_from_pd(int mode)
{
    switch (mode) {
    case PD_MODE_PAD:
        return PERMD__V1__MODE__MODE_PAD;
    case PD_MODE_DROP:
        return PERMD__V1__MODE__MODE_DROP;
    case PD_MODE_EXACT:
        return PERMD__V1__MODE__MODE_EXACT;
    }
    return PERMD__V1__MODE__MODE_UNSPECIFIED;
}
