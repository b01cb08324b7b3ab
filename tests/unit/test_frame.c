/* Tests for proto/frame.c: incremental decoding, size caps, bulk headers, hand scanning and enum mappings. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/error.h"
#include "core/rank.h"
#include "proto/arena.h"
#include "proto/frame.h"

/* Pack an envelope asking for Stats with the given id into buf; returns bytes. */
static size_t pack_stats(uint64_t id, uint8_t *buf)
{
    Permd__V1__Stats st = PERMD__V1__STATS__INIT;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
    env.stats = &st;
    return pd_frame_pack(&env, buf);
}

static void feed(pd_frame_reader *r, const uint8_t *p, size_t n)
{
    while (n) {
        uint8_t *space;
        size_t room;
        assert_int_equal(pd_frame_reader_space(r, &space, &room), 0);
        size_t k = n < room ? n : room;
        memcpy(space, p, k);
        pd_frame_reader_commit(r, k);
        p += k;
        n -= k;
    }
}

static void test_reader_byte_by_byte(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t n = 0;
    for (uint64_t id = 1; id <= 5; id++)
        n += pack_stats(id * 1000003, buf + n);
    pd_frame_reader r;
    assert_int_equal(pd_frame_reader_init(&r, 0, 1024), 0);
    uint64_t next = 1;
    for (size_t i = 0; i < n; i++) {
        feed(&r, buf + i, 1);
        const uint8_t *payload;
        uint32_t len;
        int rc;
        while ((rc = pd_frame_reader_next(&r, &payload, &len)) == 1) {
            pd_envelope *env;
            assert_int_equal(pd_frame_unpack(payload, len, NULL, &env), 0);
            assert_int_equal(env->id, next * 1000003);
            assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STATS);
            protobuf_c_message_free_unpacked(&env->base, NULL);
            next++;
        }
        assert_int_equal(rc, 0);
    }
    assert_int_equal(next, 6);
    assert_int_equal(pd_frame_reader_pending(&r), 0);
    pd_frame_reader_free(&r);
}

static void test_reader_oversize_before_payload(void **state)
{
    (void)state;
    pd_frame_reader r;
    assert_int_equal(pd_frame_reader_init(&r, 0, 4096), 0);
    uint8_t hdr[4];
    pd_store_le32(hdr, 4097);
    feed(&r, hdr, 3);
    const uint8_t *payload;
    uint32_t len;
    assert_int_equal(pd_frame_reader_next(&r, &payload, &len), 0); /* prefix incomplete */
    feed(&r, hdr + 3, 1);
    assert_int_equal(pd_frame_reader_next(&r, &payload, &len), PD_ETOOBIG);
    /* The reader must not have grown to hold the announced frame. */
    uint8_t *space;
    size_t room;
    assert_int_equal(pd_frame_reader_space(&r, &space, &room), 0);
    assert_true(r.cap < 64 * 1024);
    pd_frame_reader_free(&r);

    /* Exactly max_frame is allowed. */
    assert_int_equal(pd_frame_reader_init(&r, 0, 4096), 0);
    pd_store_le32(hdr, 4096);
    feed(&r, hdr, 4);
    uint8_t *body = calloc(1, 4096);
    feed(&r, body, 4096);
    assert_int_equal(pd_frame_reader_next(&r, &payload, &len), 1);
    assert_int_equal(len, 4096);
    free(body);
    pd_frame_reader_free(&r);
}

static void test_reader_grows_and_shrinks(void **state)
{
    (void)state;
    pd_frame_reader r;
    const uint32_t big = 300000;
    assert_int_equal(pd_frame_reader_init(&r, 8192, 1u << 20), 0);
    uint8_t *frame = malloc(4 + big);
    pd_store_le32(frame, big);
    for (uint32_t i = 0; i < big; i++)
        frame[4 + i] = (uint8_t)(i * 7);
    feed(&r, frame, 4 + big);
    assert_true(r.cap >= 4 + big);
    const uint8_t *payload;
    uint32_t len;
    assert_int_equal(pd_frame_reader_next(&r, &payload, &len), 1);
    assert_int_equal(len, big);
    assert_memory_equal(payload, frame + 4, big);
    uint8_t *space;
    size_t room;
    assert_int_equal(pd_frame_reader_space(&r, &space, &room), 0);
    assert_int_equal(r.cap, 8192); /* back to its base size once empty */
    assert_ptr_equal(space, r.buf);  /* and the space handed out lies inside it */
    assert_int_equal(room, 8192);
    feed(&r, frame, 4 + 100); /* a small frame after the big one still decodes */
    pd_store_le32(r.buf, 100);
    assert_int_equal(pd_frame_reader_next(&r, &payload, &len), 1);
    assert_int_equal(len, 100);
    free(frame);
    pd_frame_reader_free(&r);
}

/* A peer that announces a large frame and sends a few bytes of it holds little: the buffer grows with what
 * arrives (it was sized for the whole frame, twice over, as soon as the length came). */
static void test_reader_grows_with_what_arrives(void **state)
{
    (void)state;
    pd_frame_reader r;
    assert_int_equal(pd_frame_reader_init(&r, 16384, 1u << 20), 0);
    uint8_t head[4 + 10] = {0};
    pd_store_le32(head, 1u << 20);
    feed(&r, head, sizeof head);
    const uint8_t *payload;
    uint32_t len;
    assert_int_equal(pd_frame_reader_next(&r, &payload, &len), 0);
    uint8_t *space;
    size_t room;
    assert_int_equal(pd_frame_reader_space(&r, &space, &room), 0);
    assert_true(r.cap <= 32768);
    pd_frame_reader_free(&r);
}

static void test_bulk_header_roundtrip(void **state)
{
    (void)state;
    /* Several sizes so that every varint length boundary is crossed. */
    const uint64_t counts[] = {0, 1, 31, 32, 4095, 4096, 40000};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        uint64_t count = counts[k];
        Permd__V1__FetchReply head = PERMD__V1__FETCH_REPLY__INIT;
        head.id_width = 4;
        head.count = count;
        head.next_offset = UINT64_C(1) << 40;
        head.remaining = 77;
        uint64_t id = k ? UINT64_MAX - k : 0;
        size_t bytes = count * 4, hlen;
        uint8_t *frame = malloc(128 + bytes);
        assert_int_equal(pd_frame_bulk_header(frame, 128, id, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, &head.base, 15,
                                              bytes, &hlen),
                         0);
        assert_int_equal(hlen, pd_frame_bulk_header_size(id, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, &head.base, 15,
                                                         bytes));
        for (uint64_t i = 0; i < count; i++)
            pd_store_le32(frame + hlen + 4 * i, (uint32_t)(i * 2654435761u));
        assert_int_equal(pd_load_le32(frame), hlen + bytes - 4);

        /* protobuf-c reads it as an ordinary envelope */
        pd_envelope *env;
        assert_int_equal(pd_frame_unpack(frame + 4, hlen + bytes - 4, NULL, &env), 0);
        assert_int_equal(env->id, id);
        assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY);
        assert_int_equal(env->fetch_reply->count, count);
        assert_int_equal(env->fetch_reply->next_offset, UINT64_C(1) << 40);
        assert_int_equal(env->fetch_reply->ids.len, bytes);
        if (bytes)
            assert_memory_equal(env->fetch_reply->ids.data, frame + hlen, bytes);
        protobuf_c_message_free_unpacked(&env->base, NULL);

        /* and so does the hand scanner, without copying */
        pd_bulk_view v;
        assert_int_equal(pd_frame_scan_bulk(frame + 4, hlen + bytes - 4, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, &v),
                         1);
        assert_int_equal(v.id, id);
        assert_int_equal(v.f[1], 4);
        assert_int_equal(v.f[2], count);
        assert_int_equal(v.f[3], UINT64_C(1) << 40);
        assert_int_equal(v.f[4], 77);
        assert_int_equal(v.ids_len, bytes);
        if (bytes)
            assert_ptr_equal(v.ids, frame + hlen);
        free(frame);
    }
}

static void test_bulk_header_short_buffer(void **state)
{
    (void)state;
    Permd__V1__StreamBatch head = PERMD__V1__STREAM_BATCH__INIT;
    head.count = 5;
    uint8_t small[8];
    size_t hlen;
    assert_int_equal(pd_frame_bulk_header(small, sizeof small, 99, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH, &head.base,
                                          15, 20, &hlen),
                     PD_EINVAL);
    uint8_t buf[128];
    assert_int_equal(pd_frame_bulk_header(buf, sizeof buf, 99, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH, &head.base, 15,
                                          UINT64_C(1) << 32, &hlen),
                     PD_ETOOBIG);
}

static void test_scan_other_body_and_malformed(void **state)
{
    (void)state;
    uint8_t buf[64];
    size_t n = pack_stats(42, buf);
    pd_bulk_view v;
    assert_int_equal(pd_frame_scan_bulk(buf + 4, n - 4, PERMD__V1__ENVELOPE__BODY_FETCH_REPLY, &v), 0);
    assert_int_equal(v.id, 42); /* the id is known even for other bodies */
    assert_int_equal(v.body_field, PERMD__V1__ENVELOPE__BODY_STATS);

    const uint8_t truncated_varint[] = {0x08, 0xff, 0xff};
    assert_int_equal(pd_frame_scan_bulk(truncated_varint, sizeof truncated_varint, 45, &v), PD_EPROTO);
    const uint8_t overlong_len[] = {0xea, 0x02, 0x10, 0x01}; /* field 45, length 16, 1 byte present */
    assert_int_equal(pd_frame_scan_bulk(overlong_len, sizeof overlong_len, 45, &v), PD_EPROTO);
    const uint8_t group[] = {0x0b}; /* wire type 3 is not allowed */
    assert_int_equal(pd_frame_scan_bulk(group, sizeof group, 45, &v), PD_EPROTO);

    pd_envelope *env;
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(pd_frame_unpack(junk, sizeof junk, NULL, &env), PD_EPROTO);
}

static void test_unpack_with_arena(void **state)
{
    (void)state;
    pd_arena a;
    assert_int_equal(pd_arena_init(&a, 1024), 0);
    Permd__V1__PutDataset put = PERMD__V1__PUT_DATASET__INIT;
    char name[600];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    put.name = name;
    put.size = 12345;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT, *out;
    env.id = 7;
    env.body_case = PERMD__V1__ENVELOPE__BODY_PUT_DATASET;
    env.put_dataset = &put;
    uint8_t *buf = malloc(pd_frame_size(&env));
    size_t n = pd_frame_pack(&env, buf);
    for (int round = 0; round < 3; round++) { /* reset lets the same arena serve every request */
        pd_arena_reset(&a);
        assert_int_equal(pd_frame_unpack(buf + 4, n - 4, &a.pb, &out), 0);
        assert_string_equal(out->put_dataset->name, name);
        assert_int_equal(out->put_dataset->size, 12345);
    }
    void *big = pd_arena_alloc(&a, 100000); /* larger than the arena: spills, freed by reset */
    assert_non_null(big);
    memset(big, 1, 100000);
    void *p1 = pd_arena_alloc(&a, 3), *p2 = pd_arena_alloc(&a, 3);
    assert_int_equal((uintptr_t)p1 % 16, 0);
    assert_int_equal((uintptr_t)p2 % 16, 0);
    pd_arena_free(&a);
    free(buf);
}

/* Small allocations past the arena share heap blocks (not a malloc each); the gauge follows what the
 * arena holds; a limit refuses what would pass it, and an unpack under it fails instead of growing. */
static void test_arena_blocks_and_limit(void **state)
{
    (void)state;
    pd_arena a;
    _Atomic uint64_t gauge = 0;
    assert_int_equal(pd_arena_init(&a, 1024), 0);
    pd_arena_count_in(&a, &gauge);
    for (int i = 0; i < 10000; i++) { /* 160 KB in 16-byte pieces: three 64 KiB blocks */
        uint8_t *p = pd_arena_alloc(&a, 5);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        memset(p, 0xab, 5);
    }
    assert_true(atomic_load(&gauge) >= 10000 * 16 - 1024);
    assert_true(atomic_load(&gauge) <= 4 * (64 << 10) + 4 * 64);
    assert_int_equal(atomic_load(&gauge), a.held);
    pd_arena_reset(&a);
    assert_int_equal(atomic_load(&gauge), 0);

    /* A limit counts everything handed out since the reset, the arena's own buffer included. */
    pd_arena_set_limit(&a, 4096);
    assert_non_null(pd_arena_alloc(&a, 1000));
    assert_non_null(pd_arena_alloc(&a, 3000));
    assert_false(pd_arena_over(&a));
    assert_null(pd_arena_alloc(&a, 200));
    assert_true(pd_arena_over(&a));
    pd_arena_set_limit(&a, 0); /* lifted: anything goes again */
    assert_non_null(pd_arena_alloc(&a, 200000));
    pd_arena_reset(&a);
    assert_false(pd_arena_over(&a));

    /* A PutDataset of many small shard sizes (unpacked encoding: 2 bytes each on the wire, tens
     * decoded) fails to unpack under a limit it passes, and unpacks without it. */
    size_t n = 20000, len = 2 + 3 + 2 * n;
    uint8_t *buf = malloc(len), *q = buf;
    assert_non_null(buf);
    *q++ = 0x5a; /* field 11 (put_dataset), length-delimited */
    *q++ = (uint8_t)(0x80 | ((2 * n) & 0x7f));
    *q++ = (uint8_t)(0x80 | (((2 * n) >> 7) & 0x7f));
    *q++ = (uint8_t)((2 * n) >> 14);
    for (size_t i = 0; i < n; i++) {
        *q++ = 0x18; /* PutDataset.shard_sizes (field 3), varint */
        *q++ = 0x01;
    }
    len = (size_t)(q - buf);
    pd_envelope *env;
    pd_arena_set_limit(&a, 65536);
    assert_int_equal(pd_frame_unpack(buf, len, &a.pb, &env), PD_EPROTO);
    assert_true(pd_arena_over(&a));
    pd_arena_reset(&a);
    pd_arena_set_limit(&a, 0);
    assert_int_equal(pd_frame_unpack(buf, len, &a.pb, &env), 0);
    assert_int_equal(env->put_dataset->n_shard_sizes, n);
    assert_false(pd_arena_over(&a));
    assert_true(atomic_load(&gauge) > 0);
    pd_arena_free(&a);
    assert_int_equal(atomic_load(&gauge), 0);
    free(buf);
}

static void test_wire_enums(void **state)
{
    (void)state;
    const int errs[] = {PD_EPROTO, PD_ETOOBIG, PD_EUNSUPPORTED, PD_EINVAL,    PD_ENOTFOUND,
                        PD_ECONFLICT, PD_EAUTH, PD_EBUSY,        PD_EINTERNAL};
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        Permd__V1__ErrorCode code = pd_wire_error_code(errs[i]);
        assert_int_not_equal(code, PERMD__V1__ERROR_CODE__ERROR_CODE_UNSPECIFIED);
        assert_int_equal(pd_wire_error_to_pd(code), errs[i]);
        assert_string_not_equal(pd_wire_error_name(code), "UNSPECIFIED");
    }
    assert_int_equal(pd_wire_error_code(PD_ERANGE), PERMD__V1__ERROR_CODE__ERROR_CODE_INVALID_ARGUMENT);
    assert_int_equal(pd_wire_error_code(PD_ENOMEM), PERMD__V1__ERROR_CODE__ERROR_CODE_INTERNAL);
    assert_int_equal(pd_wire_error_to_pd((Permd__V1__ErrorCode)77), PD_EPROTO);

    int mode;
    for (int m = PD_MODE_PAD; m <= PD_MODE_EXACT; m++) {
        assert_int_equal(pd_wire_mode_to_pd(pd_wire_mode_from_pd(m), &mode), 0);
        assert_int_equal(mode, m);
    }
    assert_int_equal(pd_wire_mode_to_pd(PERMD__V1__MODE__MODE_UNSPECIFIED, &mode), PD_EINVAL);
    assert_int_equal(pd_wire_mode_to_pd(9, &mode), PD_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_byte_by_byte),
        cmocka_unit_test(test_reader_oversize_before_payload),
        cmocka_unit_test(test_reader_grows_and_shrinks),
        cmocka_unit_test(test_reader_grows_with_what_arrives),
        cmocka_unit_test(test_bulk_header_roundtrip),
        cmocka_unit_test(test_bulk_header_short_buffer),
        cmocka_unit_test(test_scan_other_body_and_malformed),
        cmocka_unit_test(test_unpack_with_arena),
        cmocka_unit_test(test_arena_blocks_and_limit),
        cmocka_unit_test(test_wire_enums),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
