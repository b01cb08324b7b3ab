/* Writes the fuzzers' seed corpus (tests/fuzz/corpus/): valid frames of every request and reply, HTTP requests. Run: make_corpus DIR. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/frame.h"

static const char *root;

static void write_file(const char *sub, const char *name, const uint8_t *p, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", root, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

/* A growing byte string. */
typedef struct bytes {
    uint8_t b[65536];
    size_t n;
} bytes;

static void add(bytes *o, const void *p, size_t n)
{
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void add_env(bytes *o, pd_envelope *env)
{
    o->n += pd_frame_pack(env, o->b + o->n);
}

/* A structured-mode record for fuzz_server: [sel][len lo][len hi][body]. */
static void add_record(bytes *o, unsigned field, unsigned id, const ProtobufCMessage *body)
{
    uint8_t tmp[4096];
    size_t n = body ? protobuf_c_message_pack(body, tmp) : 0;
    uint8_t hdr[3] = {(uint8_t)((id << 5) | (field - 10)), (uint8_t)n, (uint8_t)(n >> 8)};
    add(o, hdr, 3);
    add(o, tmp, n);
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static Permd__V1__Slice slice(const char *dataset, unsigned mode, uint64_t offset)
{
    Permd__V1__Slice s = PERMD__V1__SLICE__INIT;
    s.dataset = (char *)dataset;
    s.seed = 42;
    s.epoch = 3;
    s.world = 8;
    s.rank = 5;
    s.mode = mode;
    s.offset = offset;
    return s;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus DIR (tests/fuzz/corpus)\n");
        return 2;
    }
    root = argv[1];

    Permd__V1__Hello hello = PERMD__V1__HELLO__INIT;
    hello.protocol_version = 1;
    hello.client_name = "seed";
    Permd__V1__PutDataset put = PERMD__V1__PUT_DATASET__INIT;
    put.name = "seeded";
    put.size = 12345;
    Permd__V1__GetDataset get = PERMD__V1__GET_DATASET__INIT;
    get.name = "small";
    Permd__V1__ListDatasets list = PERMD__V1__LIST_DATASETS__INIT;
    Permd__V1__DeleteDataset del = PERMD__V1__DELETE_DATASET__INIT;
    del.name = "seeded";
    Permd__V1__Slice s_small = slice("small", 1, 0), s_wide = slice("wide", 3, 16), s_one = slice("one", 2, 0);
    Permd__V1__Fetch fetch = PERMD__V1__FETCH__INIT;
    fetch.slice = &s_small;
    fetch.count = 16;
    Permd__V1__Fetch fetch_wide = PERMD__V1__FETCH__INIT;
    fetch_wide.slice = &s_wide;
    fetch_wide.count = 2000;
    Permd__V1__Stream stream = PERMD__V1__STREAM__INIT;
    stream.slice = &s_small;
    stream.batch = 10;
    stream.credits = 2;
    stream.max_count = 50;
    Permd__V1__Stream stream_one = PERMD__V1__STREAM__INIT;
    stream_one.slice = &s_one;
    stream_one.batch = 1;
    stream_one.credits = 1;
    Permd__V1__Credit credit = PERMD__V1__CREDIT__INIT;
    credit.credits = 3;
    Permd__V1__Cancel cancel = PERMD__V1__CANCEL__INIT;
    uint8_t samples[8] = {1, 0, 0, 0, 200, 1, 0, 0};
    Permd__V1__Inverse inv = PERMD__V1__INVERSE__INIT;
    inv.dataset = "small";
    inv.seed = 42;
    inv.epoch = 3;
    inv.world = 8;
    inv.mode = 2;
    inv.samples.data = samples;
    inv.samples.len = sizeof samples;
    Permd__V1__Stats stats = PERMD__V1__STATS__INIT;

    /* Sharded epochs (docs/shards.md): a sharded dataset, then requests that use its window and lanes. */
    uint64_t shard_sizes[5] = {100, 1, 0, 4096, 37};
    Permd__V1__PutDataset put_sharded = PERMD__V1__PUT_DATASET__INIT;
    put_sharded.name = "sharded";
    put_sharded.shard_sizes = shard_sizes;
    put_sharded.n_shard_sizes = 5;
    put_sharded.window = 3;
    put_sharded.lanes = 2;
    Permd__V1__Slice s_sharded = slice("sharded", 1, 7);
    s_sharded.window = 2;
    s_sharded.lanes = 4;
    Permd__V1__Fetch fetch_loc = PERMD__V1__FETCH__INIT;
    fetch_loc.slice = &s_sharded;
    fetch_loc.count = 64;
    fetch_loc.locations = 1;
    Permd__V1__Stream stream_loc = PERMD__V1__STREAM__INIT;
    stream_loc.slice = &s_sharded;
    stream_loc.batch = 16;
    stream_loc.credits = 2;
    stream_loc.max_count = 40;
    stream_loc.locations = 1;
    Permd__V1__Stream stream_ring = stream; /* the ring's descriptor is dropped by the fuzzer's plain reads */
    stream_ring.ring = 1;
    Permd__V1__Inverse inv_sharded = inv;
    inv_sharded.dataset = "sharded";
    inv_sharded.window = 5;
    inv_sharded.lanes = 3;
    Permd__V1__Digest digest = PERMD__V1__DIGEST__INIT;
    digest.slice = &s_sharded;
    /* NCCL groups: without a GPU these end in UNAVAILABLE, which is the validation path under test. */
    Permd__V1__JoinGroup join = PERMD__V1__JOIN_GROUP__INIT;
    join.group = "g0";
    join.members = 2;
    Permd__V1__Deliver deliver = PERMD__V1__DELIVER__INIT;
    deliver.group = "g0";
    deliver.slice = &s_small;
    deliver.count = 32;
    Permd__V1__LeaveGroup leave = PERMD__V1__LEAVE_GROUP__INIT;
    leave.group = "g0";

    struct {
        const char *name;
        unsigned field;
        const ProtobufCMessage *msg;
    } reqs[] = {
        {"hello", 10, &hello.base},       {"put", 11, &put.base},          {"get", 12, &get.base},
        {"list", 13, &list.base},         {"delete", 14, &del.base},       {"fetch", 15, &fetch.base},
        {"fetch_wide", 15, &fetch_wide.base}, {"stream", 16, &stream.base}, {"stream_one", 16, &stream_one.base},
        {"credit", 17, &credit.base},     {"cancel", 18, &cancel.base},    {"inverse", 19, &inv.base},
        {"stats", 20, &stats.base},       {"put_sharded", 11, &put_sharded.base},
        {"fetch_locations", 15, &fetch_loc.base}, {"stream_locations", 16, &stream_loc.base},
        {"stream_ring", 16, &stream_ring.base},
        {"inverse_sharded", 19, &inv_sharded.base}, {"digest", 21, &digest.base},
        {"join_group", 22, &join.base},   {"deliver", 23, &deliver.base},  {"leave_group", 24, &leave.base},
    };
    size_t nreqs = sizeof reqs / sizeof reqs[0];

    /* fuzz_server, raw mode (first byte even): one request per file, then a session of all. */
    bytes all = {.n = 1}; /* all.b[0] = 0: raw */
    for (size_t i = 0; i < nreqs; i++) {
        bytes o = {.n = 1};
        uint8_t tmp[4096];
        size_t n = protobuf_c_message_pack(reqs[i].msg, tmp);
        uint8_t env[4200];
        size_t h = 0;
        h += put_varint(env + h, 1 << 3 | 0); /* id = i + 1 */
        h += put_varint(env + h, i + 1);
        h += put_varint(env + h, reqs[i].field << 3 | 2);
        h += put_varint(env + h, n);
        memcpy(env + h, tmp, n);
        h += n;
        uint8_t prefix[4];
        pd_store_le32(prefix, (uint32_t)h);
        add(&o, prefix, 4);
        add(&o, env, h);
        add(&all, prefix, 4);
        add(&all, env, h);
        char name[64];
        snprintf(name, sizeof name, "raw_%s", reqs[i].name);
        write_file("server", name, o.b, o.n);
    }
    write_file("server", "raw_session", all.b, all.n);
    write_file("frame", "session", all.b, all.n); /* also a frame-parser seed (first byte: piece size) */

    /* Structured mode (first byte odd): the same requests as records, and a stream session. */
    bytes rec = {.b = {1}, .n = 1};
    for (size_t i = 0; i < nreqs; i++) {
        bytes o = {.b = {1}, .n = 1};
        add_record(&o, reqs[i].field, 1, reqs[i].msg);
        add_record(&rec, reqs[i].field, (unsigned)(i % 8), reqs[i].msg);
        char name[64];
        snprintf(name, sizeof name, "rec_%s", reqs[i].name);
        write_file("server", name, o.b, o.n);
    }
    write_file("server", "rec_session", rec.b, rec.n);
    bytes st = {.b = {1}, .n = 1};
    add_record(&st, 16, 2, &stream.base);
    add_record(&st, 17, 2, &credit.base);
    add_record(&st, 16, 2, &stream.base); /* the same id again: CONFLICT */
    add_record(&st, 18, 2, &cancel.base);
    add_record(&st, 11, 1, &put.base);
    add_record(&st, 14, 1, &del.base);
    write_file("server", "rec_stream_credit_cancel", st.b, st.n);

    /* Frame parser: replies, an error, garbage, an oversized prefix. */
    uint8_t ids[64];
    for (size_t i = 0; i < sizeof ids; i++)
        ids[i] = (uint8_t)(i * 7);
    Permd__V1__FetchReply fr = PERMD__V1__FETCH_REPLY__INIT;
    fr.id_width = 4;
    fr.count = 16;
    fr.next_offset = 128;
    fr.remaining = 100;
    fr.ids.data = ids;
    fr.ids.len = sizeof ids;
    Permd__V1__StreamBatch sb = PERMD__V1__STREAM_BATCH__INIT;
    sb.id_width = 8;
    sb.count = 8;
    sb.next_offset = 64;
    sb.seq = 3;
    sb.ids.data = ids;
    sb.ids.len = sizeof ids;
    Permd__V1__Error er = PERMD__V1__ERROR__INIT;
    er.code = PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND;
    er.message = "dataset 'x' does not exist";
    pd_envelope e = PERMD__V1__ENVELOPE__INIT;
    bytes fo = {.b = {7}, .n = 1};
    e.id = 9;
    e.body_case = PERMD__V1__ENVELOPE__BODY_FETCH_REPLY;
    e.fetch_reply = &fr;
    add_env(&fo, &e);
    e.body_case = PERMD__V1__ENVELOPE__BODY_STREAM_BATCH;
    e.stream_batch = &sb;
    add_env(&fo, &e);
    e.body_case = PERMD__V1__ENVELOPE__BODY_ERROR;
    e.error = &er;
    add_env(&fo, &e);
    write_file("frame", "replies", fo.b, fo.n);
    const uint8_t garbage[] = {3, 5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    write_file("frame", "garbage", garbage, sizeof garbage);
    const uint8_t oversized[] = {60, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3};
    write_file("frame", "oversized", oversized, sizeof oversized);

    /* HTTP. */
    static const char *const http[][2] = {
        {"get_metrics", "\x05GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nUser-Agent: Prometheus/2.45\r\n"
                        "Accept: text/plain;version=0.0.4\r\n\r\n"},
        {"get_healthz", "\x00GET /healthz HTTP/1.0\r\n\r\n"},
        {"head", "\x10HEAD /metrics?x=1 HTTP/1.1\nHost: a\n\n"},
        {"post", "\x03POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"},
        {"not_found", "\x01GET /nope HTTP/1.1\r\n\r\n"},
        {"bad_version", "\x01GET / HTTP/2.0\r\n\r\n"},
        {"bad_header", "\x01GET / HTTP/1.1\r\nno colon here\r\n\r\n"},
    };
    for (size_t i = 0; i < sizeof http / sizeof http[0]; i++)
        write_file("http", http[i][0], (const uint8_t *)http[i][1], strlen(http[i][1] + 1) + 1);
    return 0;
}
