/* Replies: one place that builds envelopes, Error replies and bulk frames, and checks slices and counts. */
#include "daemon/reply.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "daemon/log.h"

/* An Envelope carrying msg in its body field: protobuf-c keeps the oneof's members at the offset
 * its descriptor names, so any body is set the same way. */
static int pd_envelope_wrap(pd_envelope *env, uint64_t id, int body_case, const void *msg)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&permd__v1__envelope__descriptor, (unsigned)body_case);
    if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE)
        return PD_EINTERNAL;
    permd__v1__envelope__init(env);
    env->id = id;
    env->body_case = (Permd__V1__Envelope__BodyCase)body_case;
    memcpy((char *)env + f->offset, &msg, sizeof msg);
    return 0;
}

int pd_reply(pd_session *s, uint64_t id, int body_case, const void *msg)
{
    pd_envelope env;
    int rc = pd_envelope_wrap(&env, id, body_case, msg);
    if (rc)
        return rc;
    size_t n = pd_frame_size(&env);
    if (n - PD_FRAME_PREFIX > PD_FRAME_MAX_LIMIT) /* its prefix could not say so (max_count of a mixture's Inverse) */
        return PD_ETOOBIG;
    uint8_t *p = pd_conn_reserve(s->conn, n);
    if (!p)
        return pd_conn_open(s->conn) ? PD_ENOMEM : PD_ECLOSED;
    pd_frame_pack(&env, p);
    pd_conn_commit(s->conn, n);
    return 0;
}

int pd_reply_fd(pd_session *s, uint64_t id, int body_case, const void *msg, int fd)
{
    pd_envelope env;
    int rc = pd_envelope_wrap(&env, id, body_case, msg);
    if (rc)
        return rc;
    size_t len = pd_frame_size(&env);
    uint8_t *frame = malloc(len);
    if (!frame)
        return PD_ENOMEM;
    pd_frame_pack(&env, frame);
    rc = pd_conn_send_fd(s->conn, frame, len, fd);
    free(frame);
    return rc;
}

static void pd_reply_error_v(pd_session *s, uint64_t id, int slot, int err, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    Permd__V1__Error e = PERMD__V1__ERROR__INIT;
    e.code = pd_wire_error_code(err);
    e.message = msg;
    s->loop->stats.errors_total++;
    pd_metrics_error(&s->loop->metrics, slot, (unsigned)e.code);
    pd_log_debug("request_error", "conn=%llu id=%llu code=%s msg=\"%s\"", (unsigned long long)pd_conn_serial(s->conn),
                 (unsigned long long)id, pd_wire_error_name(e.code), msg);
    pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_ERROR, &e);
}

void pd_reply_error(pd_session *s, uint64_t id, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pd_reply_error_v(s, id, pd_conn_request_slot(s->conn), err, fmt, ap);
    va_end(ap);
}

void pd_reply_error_as(pd_session *s, uint64_t id, int slot, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pd_reply_error_v(s, id, slot, err, fmt, ap);
    va_end(ap);
}

int pd_reply_slice(pd_session *s, uint64_t id, const Permd__V1__Slice *m, int locations, pd_target *t)
{
    char msg[256];
    int rc, mode;
    t->plan = NULL;
    if (!m) {
        pd_reply_error(s, id, PD_EINVAL, "slice is required");
        return PD_EINVAL;
    }
    pd_slice_req q = {.dataset = m->dataset, .seed = m->seed, .epoch = m->epoch, .world = m->world,
                      .rank = m->rank, .offset = m->offset, .window = m->window, .lanes = m->lanes,
                      .locations = locations, .definition = m->definition};
    q.mode = pd_wire_mode_to_pd(m->mode, &mode) ? -1 : mode;
    if ((rc = pd_target_resolve(s->svc->reg, s->svc->plans, &q, t, msg, sizeof msg)))
        pd_reply_error(s, id, rc, "%s", msg);
    else
        t->orders_built = &s->loop->stats.mix_orders_built;
    return rc;
}

int pd_reply_count(pd_session *s, uint64_t id, uint64_t count, const char *what)
{
    uint64_t max = s->svc->cfg->max_count;
    if (count <= max)
        return 0;
    pd_reply_error(s, id, PD_ETOOBIG, "%s %llu exceeds max_count %llu; ask in pieces", what,
                   (unsigned long long)count, (unsigned long long)max);
    return PD_ETOOBIG;
}

int pd_reply_bulk_header(pd_session *s, uint64_t id, int body_case, const ProtobufCMessage *head, uint64_t bytes,
                         uint8_t *hdr, size_t *hlen)
{
    /* FetchReply.ids and StreamBatch.ids are both field 15. */
    int rc = pd_frame_bulk_header(hdr, PD_BULK_HDR_MAX, id, (uint32_t)body_case, head, 15, bytes, hlen);
    if (rc == PD_ETOOBIG) /* max_count ids of 16 bytes (locations) may pass a frame's 2^31 - 1 bytes */
        pd_reply_error(s, id, PD_ETOOBIG, "a reply of %llu bytes would exceed a frame's %u; ask in pieces",
                       (unsigned long long)bytes, PD_FRAME_MAX_LIMIT);
    else if (rc)
        pd_reply_error(s, id, PD_EINTERNAL, "reply header does not fit");
    return rc;
}

int pd_reply_bulk_inline(pd_session *s, const uint8_t *hdr, size_t hlen, const pd_target *t, const pd_slice *slice,
                         uint64_t count, const uint8_t *ready, int *deferred)
{
    size_t bytes = (size_t)count * t->width;
    uint8_t *payload = pd_conn_bulk_begin(s->conn, hdr, hlen, bytes, t->width);
    uint64_t got = 0;
    int rc;
    *deferred = 0;
    if (!payload)
        return PD_ENOMEM;
    if (ready) {
        memcpy(payload, ready, bytes);
        got = count;
        rc = 0;
    } else {
        rc = pd_target_generate_now(s->svc->backend, t, slice, count, payload, &got, deferred);
        if (rc == 0 && *deferred)
            return 0; /* nothing committed: the caller hands it to a worker */
    }
    if (rc == 0 && got != count)
        rc = PD_EINTERNAL;
    if (rc == 0) /* else the unfinished frame is simply not committed */
        pd_conn_bulk_end(s->conn, payload);
    return rc;
}

int pd_bulk_alloc(pd_bulk *b, pd_conn *c, const uint8_t *hdr, size_t hlen, size_t bytes)
{
    size_t pad = (16 - hlen % 16) % 16, need = pad + hlen + bytes;
    b->base = c ? pd_conn_take_block(c, need, &b->cap) : NULL;
    if (!b->base) {
        if (!(b->base = malloc(need)))
            return PD_ENOMEM;
        b->cap = need;
    }
    b->frame = b->base + pad;
    b->payload = b->frame + hlen; /* 16-aligned */
    b->frame_len = hlen + bytes;
    memcpy(b->frame, hdr, hlen);
    return 0;
}

uint64_t pd_list_budget(const pd_config *cfg)
{
    /* The reply bound libpermd has always read (8-byte ids of max_count, and 64 KiB), less room for the
     * envelope and the `next` name. */
    return 8 * cfg->max_count + (64u << 10) - 512;
}

size_t pd_list_entry_bytes(size_t packed)
{
    size_t n = 1 + 1 + packed; /* the field's tag, its length's varint, the entry */
    for (size_t v = packed; v >= 0x80; v >>= 7)
        n++;
    return n;
}
