/* libFuzzer target: the frame parser (incremental reader, Envelope unpack, the hand-written bulk scanner) on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "proto/arena.h"
#include "proto/frame.h"

#define MAX_FRAME (64u << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The bulk scanner must agree with protobuf-c on every reply both accept. */
static void check_bulk(const uint8_t *payload, uint32_t len, const pd_envelope *env)
{
    static const uint32_t fields[] = {PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH};
    for (size_t i = 0; i < 2; i++) {
        pd_bulk_view v;
        int rc = pd_frame_scan_bulk(payload, len, fields[i], &v);
        if (rc != 1 || !env || env->body_case != fields[i])
            continue;
        if (v.id != env->id)
            abort();
        const ProtobufCBinaryData *ids;
        uint64_t count, next;
        if (fields[i] == PERMD__V1__ENVELOPE__BODY_FETCH_REPLY) {
            ids = &env->fetch_reply->ids;
            count = env->fetch_reply->count;
            next = env->fetch_reply->next_offset;
        } else {
            ids = &env->stream_batch->ids;
            count = env->stream_batch->count;
            next = env->stream_batch->next_offset;
        }
        if (v.f[2] != count || v.f[3] != next || v.ids_len != ids->len ||
            (ids->len && memcmp(v.ids, ids->data, ids->len)))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pd_frame_reader r;
    pd_arena arena;
    if (size == 0 || pd_frame_reader_init(&r, 4096, MAX_FRAME))
        return 0;
    if (pd_arena_init(&arena, 4096)) {
        pd_frame_reader_free(&r);
        return 0;
    }
    /* The first byte picks the size of the pieces the bytes arrive in. */
    size_t piece = (size_t)data[0] % 61 + 1;
    data++;
    size--;
    int dead = 0; /* an oversized frame ends the connection */
    while (size && !dead) {
        uint8_t *buf;
        size_t room;
        if (pd_frame_reader_space(&r, &buf, &room))
            break;
        size_t n = size < piece ? size : piece;
        n = n < room ? n : room;
        memcpy(buf, data, n);
        pd_frame_reader_commit(&r, n);
        data += n;
        size -= n;
        for (;;) {
            const uint8_t *payload;
            uint32_t len;
            int rc = pd_frame_reader_next(&r, &payload, &len);
            if (rc == 0)
                break;
            if (rc < 0) {
                if (rc != PD_ETOOBIG)
                    abort();
                dead = 1;
                break;
            }
            if (len > MAX_FRAME)
                abort();
            pd_envelope *env = NULL;
            pd_arena_reset(&arena);
            /* Unpacked or refused, never a crash. (No pack round trip: permd never re-packs what
             * it received, and protobuf-c 1.4.1 crashes packing a message that kept an unknown
             * field numbered 0, which the fuzzer finds in seconds.) */
            if (pd_frame_unpack(payload, len, &arena.pb, &env))
                env = NULL;
            check_bulk(payload, len, env);
        }
    }
    pd_arena_free(&arena);
    pd_frame_reader_free(&r);
    return 0;
}
