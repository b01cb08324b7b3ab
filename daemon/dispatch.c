/* Dispatch: one table row per request type (handler, whether it may come before authentication), like redis's command table. */
#include "daemon/dispatch.h"

#include <stddef.h>
#include <string.h>

#include "core/error.h"
#include "daemon/datasets.h"
#include "daemon/fetch.h"
#include "daemon/groups.h"
#include "daemon/hello.h"
#include "daemon/mixtures.h"
#include "daemon/reply.h"
#include "daemon/reqtype.h"
#include "daemon/stream.h"
#include "proto/frame.h"

typedef void (*pd_handler)(pd_session *s, uint64_t id, const void *msg);

enum {
    PD_CMD_PREAUTH = 1, /* may be sent before the connection authenticated */
    /* Its handler may hand the request's memory to a request job (Inverse's job reads the samples and
     * writes its reply's buffers in the session's arena, daemon/fetch.c) without saying so
     * (pd_arena_keep): the arena is then released by the next frame, not when the handler returns. */
    PD_CMD_KEEPS_ARENA = 2,
};

typedef struct pd_command {
    pd_handler run;
    unsigned flags;
} pd_command;

/* Each handler takes its own message type; the table holds one signature. */
#define PD_ENTRY(fn, type)                                                                                        \
    static void fn##_entry(pd_session *s, uint64_t id, const void *msg)                                           \
    {                                                                                                             \
        fn(s, id, (const type *)msg);                                                                             \
    }
PD_ENTRY(pd_on_hello, Permd__V1__Hello)
PD_ENTRY(pd_on_stats, Permd__V1__Stats)
PD_ENTRY(pd_on_put_dataset, Permd__V1__PutDataset)
PD_ENTRY(pd_on_get_dataset, Permd__V1__GetDataset)
PD_ENTRY(pd_on_list_datasets, Permd__V1__ListDatasets)
PD_ENTRY(pd_on_delete_dataset, Permd__V1__DeleteDataset)
PD_ENTRY(pd_on_fetch, Permd__V1__Fetch)
PD_ENTRY(pd_on_digest, Permd__V1__Digest)
PD_ENTRY(pd_on_inverse, Permd__V1__Inverse)
PD_ENTRY(pd_on_stream, Permd__V1__Stream)
PD_ENTRY(pd_on_credit, Permd__V1__Credit)
PD_ENTRY(pd_on_cancel, Permd__V1__Cancel)
PD_ENTRY(pd_on_join_group, Permd__V1__JoinGroup)
PD_ENTRY(pd_on_deliver, Permd__V1__Deliver)
PD_ENTRY(pd_on_leave_group, Permd__V1__LeaveGroup)
PD_ENTRY(pd_on_put_mixture, Permd__V1__PutMixture)
PD_ENTRY(pd_on_get_mixture, Permd__V1__GetMixture)
PD_ENTRY(pd_on_list_mixtures, Permd__V1__ListMixtures)
PD_ENTRY(pd_on_delete_mixture, Permd__V1__DeleteMixture)

#define PD_ROW(body, fn, fl) [PERMD__V1__ENVELOPE__BODY_##body - PD_REQ_FIELD_FIRST] = {fn##_entry, fl}

/* Indexed by metrics slot (Envelope field number - 10); an empty row is not a request. */
static const pd_command pd_commands[PD_REQ_UNKNOWN] = {
    PD_ROW(HELLO, pd_on_hello, PD_CMD_PREAUTH),
    PD_ROW(STATS, pd_on_stats, 0),
    PD_ROW(PUT_DATASET, pd_on_put_dataset, 0),
    PD_ROW(GET_DATASET, pd_on_get_dataset, 0),
    PD_ROW(LIST_DATASETS, pd_on_list_datasets, 0),
    PD_ROW(DELETE_DATASET, pd_on_delete_dataset, 0),
    PD_ROW(FETCH, pd_on_fetch, 0),
    PD_ROW(DIGEST, pd_on_digest, 0),
    PD_ROW(INVERSE, pd_on_inverse, 0),
    PD_ROW(STREAM, pd_on_stream, 0),
    PD_ROW(CREDIT, pd_on_credit, 0),
    PD_ROW(CANCEL, pd_on_cancel, 0),
    PD_ROW(JOIN_GROUP, pd_on_join_group, 0),
    PD_ROW(DELIVER, pd_on_deliver, 0),
    PD_ROW(LEAVE_GROUP, pd_on_leave_group, 0),
    PD_ROW(PUT_MIXTURE, pd_on_put_mixture, 0),
    PD_ROW(GET_MIXTURE, pd_on_get_mixture, 0),
    PD_ROW(LIST_MIXTURES, pd_on_list_mixtures, 0),
    PD_ROW(DELETE_MIXTURE, pd_on_delete_mixture, 0),
};

/* The message an Envelope carries: protobuf-c keeps every body at the offset its descriptor names. */
static const void *pd_envelope_body(const pd_envelope *env)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&permd__v1__envelope__descriptor, (unsigned)env->body_case);
    const void *msg;
    memcpy(&msg, (const char *)env + f->offset, sizeof msg);
    return msg;
}

/* A frame whose decoding took more than max_request_memory: answered TOO_LARGE under its id and type
 * (read from the wire, which is well formed up to there), and the connection goes on. An Envelope it
 * could not even scan is BAD_FRAME. */
static unsigned pd_dispatch_too_big(pd_session *s, const uint8_t *payload, uint32_t len)
{
    pd_bulk_view v;
    if (pd_frame_scan_bulk(payload, len, 0, &v) < 0) {
        pd_metrics_request(&s->loop->metrics, PD_REQ_INVALID);
        pd_reply_error(s, 0, PD_EPROTO, "a frame of %u bytes is not a valid permd.v1.Envelope", len);
        pd_conn_drain_close(s->conn);
        return 0;
    }
    int slot = pd_reqtype_slot((int)v.body_field);
    pd_conn_request_begin(s->conn, v.id, slot, pd_reqtype_name(slot));
    pd_metrics_request(&s->loop->metrics, slot);
    if (!s->authed && v.body_field != PERMD__V1__ENVELOPE__BODY_HELLO) {
        pd_reply_error(s, v.id, PD_EAUTH, "this listener requires Hello with a token first");
        pd_conn_drain_close(s->conn);
        return 0;
    }
    pd_reply_error(s, v.id, PD_ETOOBIG,
                   "a request of %u bytes takes more than max_request_memory (%llu bytes) decoded: send fewer "
                   "fields",
                   len, (unsigned long long)s->svc->cfg->max_request_memory);
    return 0;
}

/* Decode, check and run one request; returns its table row's flags (0 when none ran). */
static unsigned pd_dispatch_run(pd_session *s, const uint8_t *payload, uint32_t len)
{
    pd_envelope *env;
    s->loop->stats.requests_total++;
    /* protobuf-c allocates per field: a frame of many small (or unknown) fields decodes to tens of times
     * its size. The limit fails the decoding there instead of letting one request cost that much. */
    pd_arena_set_limit(&s->arena, (size_t)s->svc->cfg->max_request_memory);
    int rc = pd_frame_unpack(payload, len, &s->arena.pb, &env);
    pd_arena_set_limit(&s->arena, 0); /* the handler's reply buffers are bounded by their own limits */
    if (rc && pd_arena_over(&s->arena))
        return pd_dispatch_too_big(s, payload, len);
    if (rc) {
        pd_metrics_request(&s->loop->metrics, PD_REQ_INVALID);
        pd_reply_error(s, 0, PD_EPROTO, "a frame of %u bytes is not a valid permd.v1.Envelope", len);
        pd_conn_drain_close(s->conn);
        return 0;
    }
    uint64_t id = env->id;
    int slot = pd_reqtype_slot((int)env->body_case);
    pd_conn_request_begin(s->conn, id, slot, pd_reqtype_name(slot)); /* timed by type, the request log line */
    pd_metrics_request(&s->loop->metrics, slot);
    const pd_command *cmd = slot < PD_REQ_UNKNOWN && pd_commands[slot].run ? &pd_commands[slot] : NULL;
    if (!s->authed && !(cmd && (cmd->flags & PD_CMD_PREAUTH))) {
        pd_reply_error(s, id, PD_EAUTH, "this listener requires Hello with a token first");
        pd_conn_drain_close(s->conn);
        return 0;
    }
    const char *bad;
    if (cmd && pd_frame_check_strings(payload, len, &bad)) {
        pd_reply_error(s, id, PD_EINVAL, "%s holds a NUL byte: strings are checked whole, never cut short",
                       bad ? bad : "a string field");
        return 0;
    }
    if (cmd) {
        cmd->run(s, id, pd_envelope_body(env));
        return cmd->flags;
    }
    if (env->base.n_unknown_fields)
        pd_reply_error(s, id, PD_EUNSUPPORTED, "unknown message (envelope field %u)", env->base.unknown_fields[0].tag);
    else if (env->body_case == PERMD__V1__ENVELOPE__BODY__NOT_SET)
        pd_reply_error(s, id, PD_EUNSUPPORTED, "the envelope carries no message");
    else
        pd_reply_error(s, id, PD_EUNSUPPORTED, "message %d is sent by servers, not clients", (int)env->body_case);
    return 0;
}

void pd_dispatch_frame(pd_session *s, const uint8_t *payload, uint32_t len)
{
    pd_arena *a = &s->arena;
    if (!a->gauge)
        pd_arena_count_in(a, &s->loop->stats.request_memory); /* permd_request_memory_bytes */
    pd_arena_reset(a); /* what the last frame's request job kept, if its done did not reset it */
    unsigned flags = pd_dispatch_run(s, payload, len);
    /* The reply is queued (or a job that copied what it needs has it): the decoded request goes now,
     * not at the connection's next frame, so an idle connection holds none of it. A handler whose job
     * reads it says so (pd_arena_keep), and the job's done callback resets it. */
    if (!(flags & PD_CMD_KEEPS_ARENA) && !pd_arena_kept(a))
        pd_arena_reset(a);
}
