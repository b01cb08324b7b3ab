/* Integration: libpermd against fake servers that each break one rule of a reply: a typed error, never wrong ids, a crash, a hang or unbounded memory. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

typedef struct fake fake;
/* Answer one request (the fake's thread); a non-zero return ends the connection. */
typedef int (*fake_script)(fake *f, int fd, const pd_envelope *req);

struct fake {
    char dir[64], path[128];
    int listen_fd;
    pthread_t th;
    fake_script script;
    uint32_t max_credits;   /* the Hello's (0: 4) */
    uint64_t max_digest;    /* the Hello's */
    uint32_t asked_credits; /* what the Stream request asked for */
    uint64_t stream_id;     /* its request id */
    int credits_seen;       /* Credit messages received */
    uint64_t sent;          /* batches sent so far */
};

/* ---- Frames ---- */

static void send_env(int fd, pd_envelope *env, uint64_t id, int body_case)
{
    env->id = id;
    env->body_case = body_case;
    raw_send_env(fd, env);
}

static void send_batch(int fd, uint64_t id, uint32_t width, uint64_t count, uint64_t next_offset, uint64_t seq)
{
    uint8_t ids[16 * 8] = {0};
    Permd__V1__StreamBatch b = PERMD__V1__STREAM_BATCH__INIT;
    b.id_width = width;
    b.count = count;
    b.next_offset = next_offset;
    b.seq = seq;
    b.ids.data = ids;
    b.ids.len = count * width <= sizeof ids ? count * width : 0;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.stream_batch = &b;
    send_env(fd, &env, id, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
}

static void send_end(int fd, uint64_t id, int reason, uint64_t delivered, uint64_t next_offset)
{
    Permd__V1__StreamEnd e = PERMD__V1__STREAM_END__INIT;
    e.reason = reason;
    e.delivered = delivered;
    e.next_offset = next_offset;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.stream_end = &e;
    send_env(fd, &env, id, PERMD__V1__ENVELOPE__BODY_STREAM_END);
}

/* A FetchReply of the first n ≤ 2 of the ids 7 and 9; extra (when non-zero) bytes of an Envelope field this client does not know
 * follow the body, as a newer server may send (docs/protocol.md §12). */
static void send_fetch_reply(int fd, uint64_t id, uint64_t n, int extra)
{
    uint8_t ids[8] = {7, 0, 0, 0, 9, 0, 0, 0};
    Permd__V1__FetchReply r = PERMD__V1__FETCH_REPLY__INIT;
    r.id_width = 4;
    r.count = n;
    r.next_offset = n;
    r.ids.data = ids;
    r.ids.len = 4 * n;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_FETCH_REPLY;
    env.fetch_reply = &r;
    const uint8_t field99[] = {0x9a, 0x06, 1, 'x'}; /* field 99, length-delimited, one byte */
    size_t len = pd_frame_size(&env);
    uint8_t *buf = malloc(len + sizeof field99);
    pd_frame_pack(&env, buf);
    if (extra) {
        memcpy(buf + len, field99, sizeof field99);
        len += sizeof field99;
        pd_store_le32(buf, (uint32_t)(len - 4));
    }
    raw_send(fd, buf, len);
    free(buf);
}

/* ---- The fake ---- */

static void *fake_main(void *arg)
{
    fake *f = arg;
    int fd = accept(f->listen_fd, NULL, NULL);
    pd_envelope *env;
    if (fd < 0 || raw_recv_env(fd, 10000, &env))
        return NULL;
    char *features[] = {"stream"};
    Permd__V1__Limits lim = PERMD__V1__LIMITS__INIT;
    lim.max_frame = 1 << 20;
    lim.max_count = 1000;
    lim.max_credits = f->max_credits ? f->max_credits : 4;
    lim.max_digest = f->max_digest;
    Permd__V1__HelloReply h = PERMD__V1__HELLO_REPLY__INIT;
    h.protocol_version = 1;
    h.spec_version = 1;
    h.server = "fake";
    h.limits = &lim;
    h.n_features = 1;
    h.features = features;
    pd_envelope out = PERMD__V1__ENVELOPE__INIT;
    out.hello_reply = &h;
    send_env(fd, &out, env->id, PERMD__V1__ENVELOPE__BODY_HELLO_REPLY);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    int stop = 0;
    while (!stop && raw_recv_env(fd, 10000, &env) == 0) {
        if (env->body_case == PERMD__V1__ENVELOPE__BODY_STREAM)
            f->asked_credits = env->stream->credits, f->stream_id = env->id;
        if (env->body_case == PERMD__V1__ENVELOPE__BODY_CREDIT)
            f->credits_seen++;
        stop = f->script(f, fd, env);
        protobuf_c_message_free_unpacked(&env->base, NULL);
    }
    close(fd);
    return NULL;
}

static permd_client *fake_connect(fake *f, fake_script script)
{
    f->listen_fd = harness_fake_listen(f->dir, f->path);
    assert_true(f->listen_fd >= 0);
    f->script = script;
    pthread_create(&f->th, NULL, fake_main, f);
    permd_client *c;
    assert_int_equal(permd_connect_unix(f->path, &c), 0);
    assert_int_equal(permd_set_timeout(c, 5000), 0); /* a hang fails the test, not the run */
    return c;
}

static void fake_done(fake *f, permd_client *c)
{
    permd_close(c);
    pthread_join(f->th, NULL);
    harness_fake_close(f->listen_fd, f->dir, f->path);
}

static void expect_error(permd_client *c, int rc, int want, const char *says)
{
    if (rc != want)
        fail_msg("rc %d (%s), expected %d", rc, permd_last_error(c), want);
    if (!strstr(permd_last_error(c), says))
        fail_msg("'%s' does not say '%s'", permd_last_error(c), says);
}

static const permd_slice slice = {.dataset = "d", .world = 1, .mode = PERMD_MODE_EXACT};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- Fetch ---- */

static int fetch_with_unknown_field(fake *f, int fd, const pd_envelope *req)
{
    (void)f;
    send_fetch_reply(fd, req->id, req->fetch->count < 2 ? req->fetch->count : 2, 1);
    return 0;
}

static int fetch_for_id0(fake *f, int fd, const pd_envelope *req)
{
    (void)f;
    (void)req;
    send_fetch_reply(fd, 0, 2, 0);
    return 0;
}

static int fetch_for_another_id(fake *f, int fd, const pd_envelope *req)
{
    (void)f;
    send_fetch_reply(fd, req->id + 7, 2, 0);
    return 0;
}

static int fetch_trickled(fake *f, int fd, const pd_envelope *req)
{
    (void)f;
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair))
        return 1;
    send_fetch_reply(pair[0], req->id, 2, 0); /* the frame's bytes, then out one at a time */
    uint8_t b;
    while (recv(pair[1], &b, 1, MSG_DONTWAIT) == 1) {
        if (raw_send(fd, &b, 1))
            break;
        usleep(40 * 1000);
    }
    close(pair[0]);
    close(pair[1]);
    return 0;
}

static int fetch_error_code_99(fake *f, int fd, const pd_envelope *req)
{
    (void)f;
    Permd__V1__Error e = PERMD__V1__ERROR__INIT;
    e.code = 99;
    e.message = "a newer server's reason";
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.error = &e;
    send_env(fd, &env, req->id, PERMD__V1__ENVELOPE__BODY_ERROR);
    return 0;
}

static void test_fetch_replies(void **state)
{
    (void)state;
    fake f = {0};
    uint32_t ids[4] = {0};
    uint64_t got = 99, next = 99;
    /* A field added by a newer server is skipped: the ids are read, not lost (it used to return 0 with nothing
     * filled in). */
    permd_client *c = fake_connect(&f, fetch_with_unknown_field);
    assert_int_equal(permd_fetch_u32(c, &slice, 4, ids, &got, &next), 0);
    assert_int_equal(got, 2);
    assert_int_equal(next, 2);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 9);
    assert_int_equal(permd_fetch_u32(c, &slice, 0, NULL, &got, &next), 0); /* nothing asked: out may be NULL */
    assert_int_equal(got, 0);
    fake_done(&f, c);

    memset(&f, 0, sizeof f);
    c = fake_connect(&f, fetch_for_id0);
    expect_error(c, permd_fetch_u32(c, &slice, 4, ids, &got, &next), PERMD_EPROTO, "request id 0");
    fake_done(&f, c);

    memset(&f, 0, sizeof f);
    c = fake_connect(&f, fetch_for_another_id);
    expect_error(c, permd_fetch_u32(c, &slice, 4, ids, &got, &next), PERMD_EPROTO, "answered request");
    fake_done(&f, c);

    /* An error code this client does not know: named by its number (it read "UNSPECIFIED"). */
    memset(&f, 0, sizeof f);
    c = fake_connect(&f, fetch_error_code_99);
    int rc = permd_fetch_u32(c, &slice, 4, ids, &got, &next);
    assert_true(rc < 0);
    expect_error(c, rc, rc, "error code 99 (unknown to this client): a newer server's reason");
    fake_done(&f, c);

    /* A reply trickled a byte every 40 ms (~1.5 s in all) against a 300 ms timeout: late as a whole, though no
     * single read waits 300 ms. */
    memset(&f, 0, sizeof f);
    c = fake_connect(&f, fetch_trickled);
    assert_int_equal(permd_set_timeout(c, 300), 0);
    uint64_t t0 = now_ms();
    expect_error(c, permd_fetch_u32(c, &slice, 4, ids, &got, &next), PERMD_ETIMEDOUT, "within 300 ms");
    assert_true(now_ms() - t0 < 1000);
    fake_done(&f, c);
}

/* ---- Datasets and mixtures whose id width would size a buffer wrongly ---- */

static int dataset_of_width(fake *f, int fd, const pd_envelope *req, uint32_t width, int present)
{
    (void)f;
    Permd__V1__Dataset d = PERMD__V1__DATASET__INIT;
    d.name = "d";
    d.size = 10;
    d.id_width = width;
    Permd__V1__DatasetReply r = PERMD__V1__DATASET_REPLY__INIT;
    r.dataset = present ? &d : NULL;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.dataset_reply = &r;
    send_env(fd, &env, req->id, PERMD__V1__ENVELOPE__BODY_DATASET_REPLY);
    return 0;
}

static int dataset_width0(fake *f, int fd, const pd_envelope *req)
{
    return dataset_of_width(f, fd, req, 0, 1);
}

static int dataset_width2(fake *f, int fd, const pd_envelope *req)
{
    return dataset_of_width(f, fd, req, 2, 1);
}

static int dataset_missing(fake *f, int fd, const pd_envelope *req)
{
    return dataset_of_width(f, fd, req, 4, 0);
}

static int mixture_width2(fake *f, int fd, const pd_envelope *req)
{
    (void)f;
    char *names[] = {"d"};
    uint64_t sizes[] = {10};
    uint32_t weights[] = {1};
    Permd__V1__MixtureStage st = PERMD__V1__MIXTURE_STAGE__INIT, *stp = &st;
    st.n_weights = 1;
    st.weights = weights;
    Permd__V1__Mixture m = PERMD__V1__MIXTURE__INIT;
    m.name = "m";
    m.n_components = 1;
    m.components = names;
    m.n_stages = 1;
    m.stages = &stp;
    m.length = 10;
    m.block = 64;
    m.size = 10;
    m.id_width = 2;
    m.n_component_sizes = 1;
    m.component_sizes = sizes;
    Permd__V1__MixtureReply r = PERMD__V1__MIXTURE_REPLY__INIT;
    r.mixture = &m;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.mixture_reply = &r;
    send_env(fd, &env, req->id, PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY);
    return 0;
}

static void test_id_widths(void **state)
{
    (void)state;
    const uint64_t samples[3] = {1, 2, 3};
    uint64_t positions[3], epochs[3];
    permd_dataset d;
    /* Width 0 divided by zero, width 2 wrote 8 bytes per sample into 2 (ASan: heap-buffer-overflow). */
    fake_script widths[] = {dataset_width0, dataset_width2};
    for (int i = 0; i < 2; i++) {
        fake f = {0};
        permd_client *c = fake_connect(&f, widths[i]);
        expect_error(c, permd_get_dataset(c, "d", &d), PERMD_EPROTO, "id width");
        fake_done(&f, c);
        memset(&f, 0, sizeof f);
        c = fake_connect(&f, widths[i]);
        expect_error(c, permd_inverse(c, "d", 1, 0, 1, -1, samples, 3, positions, NULL), PERMD_EPROTO, "id width");
        fake_done(&f, c);
    }
    fake f = {0};
    permd_client *c = fake_connect(&f, dataset_missing);
    expect_error(c, permd_get_dataset(c, "d", &d), PERMD_EPROTO, "without its dataset");
    fake_done(&f, c);

    memset(&f, 0, sizeof f);
    c = fake_connect(&f, mixture_width2);
    const uint64_t ce[3] = {0, 0, 0};
    expect_error(c, permd_inverse_mixture(c, "m", 1, 1, -1, samples, ce, 3, epochs, positions, NULL), PERMD_EPROTO,
                 "id width 2");
    /* A count whose buffer size would wrap: refused before anything is allocated or sent. */
    expect_error(c, permd_inverse_mixture(c, "m", 1, 1, -1, samples, ce, (UINT64_C(1) << 62) + 1, epochs, positions,
                                          NULL),
                 PERMD_EINVAL, "more than this process can address");
    fake_done(&f, c);
}

/* ---- Streams ---- */

typedef enum {
    BAD_NONE,        /* a good stream: 2 batches of 2, then its end */
    BAD_SEQ,         /* batch 0, then batch 2 */
    BAD_BACKWARDS,   /* the second batch's offset below the first's */
    BAD_WIDTH16,     /* locations on a stream of ids */
    BAD_EMPTY,       /* a batch of no ids, which next would read as the end */
    BAD_OVER_BATCH,  /* 3 ids in a batch of 2 */
    BAD_OVER_MAX,    /* a stream of max_count 3 given 4 */
    BAD_CANCELLED,   /* ended as cancelled, unasked */
    BAD_REASON,      /* ended for reason 77 */
    BAD_DELIVERED,   /* the end counts ids that never came */
} bad_stream;

static bad_stream bad; /* the stream scripts' case (one fake at a time) */

static int stream_script(fake *f, int fd, const pd_envelope *req)
{
    (void)f;
    if (req->body_case != PERMD__V1__ENVELOPE__BODY_STREAM)
        return 0;
    const uint64_t id = req->id;
    send_batch(fd, id, bad == BAD_WIDTH16 ? 16 : 4, bad == BAD_EMPTY ? 0 : bad == BAD_OVER_BATCH ? 3 : 2, 4, 0);
    send_batch(fd, id, 4, 2, bad == BAD_BACKWARDS ? 2 : 6, bad == BAD_SEQ ? 2 : 1);
    int reason = bad == BAD_CANCELLED ? 1 : bad == BAD_REASON ? 77 : 0;
    send_end(fd, id, reason, bad == BAD_DELIVERED ? 5 : 4, 6);
    return 0;
}

static void test_stream_replies(void **state)
{
    (void)state;
    const struct {
        bad_stream bad;
        int open_rc, rc; /* what permd_stream_open, then the reads, return */
        const char *says;
    } cases[] = {
        {BAD_NONE, 0, 0, ""},
        {BAD_SEQ, 0, PERMD_EPROTO, "StreamBatch 2"},
        {BAD_BACKWARDS, 0, PERMD_EPROTO, "past offset 4"},
        {BAD_WIDTH16, PERMD_EPROTO, 0, "of 16 bytes"},
        {BAD_EMPTY, PERMD_EPROTO, 0, "StreamBatch of 0 items"},
        {BAD_OVER_BATCH, PERMD_EPROTO, 0, "StreamBatch of 3 items"},
        {BAD_OVER_MAX, 0, PERMD_EPROTO, "up to max_count"},
        {BAD_CANCELLED, 0, PERMD_ECLOSED, "cancelled the stream; resume from offset 6"},
        {BAD_REASON, 0, PERMD_EPROTO, "(77)"},
        {BAD_DELIVERED, 0, PERMD_EPROTO, "sent 5 ids; 4 came"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake f = {0};
        bad = cases[i].bad;
        permd_client *c = fake_connect(&f, stream_script);
        permd_stream *st = NULL;
        int rc = permd_stream_open(c, &slice, 2, bad == BAD_OVER_MAX ? 3 : 0, &st);
        if (rc != cases[i].open_rc)
            fail_msg("case %zu: open gave %d (%s)", i, rc, permd_last_error(c));
        uint64_t ids = 0, n = 1;
        while (rc == 0 && n) {
            const void *p;
            uint32_t width;
            rc = permd_stream_next(st, &p, &width, &n);
            ids += rc ? 0 : n;
        }
        if (rc != (cases[i].open_rc ? cases[i].open_rc : cases[i].rc))
            fail_msg("case %zu: gave %d (%s)", i, rc, permd_last_error(c));
        if (!strstr(permd_last_error(c), cases[i].says))
            fail_msg("case %zu: '%s' does not say '%s'", i, permd_last_error(c), cases[i].says);
        if (bad == BAD_NONE)
            assert_int_equal(ids, 4);
        if (st)
            permd_stream_close(st);
        fake_done(&f, c);
    }
}

/* The stream is opened (batch 0), then a Fetch waits while the server sends batches no credit asked for. */
static int stream_flood(fake *f, int fd, const pd_envelope *req)
{
    if (req->body_case == PERMD__V1__ENVELOPE__BODY_STREAM) {
        send_batch(fd, req->id, 4, 1, 1, f->sent++);
    } else if (req->body_case == PERMD__V1__ENVELOPE__BODY_FETCH) {
        for (int i = 0; i < 64; i++, f->sent++)
            send_batch(fd, f->stream_id, 4, 1, f->sent + 1, f->sent);
        send_fetch_reply(fd, req->id, 2, 0);
    }
    return 0;
}

/* After a Cancel the server sends on: batches no credit asked for, and never the end. */
static int stream_ignores_cancel(fake *f, int fd, const pd_envelope *req)
{
    if (req->body_case == PERMD__V1__ENVELOPE__BODY_STREAM) {
        send_batch(fd, req->id, 4, 1, 1, f->sent++);
    } else if (req->body_case == PERMD__V1__ENVELOPE__BODY_CANCEL) {
        for (int i = 0; i < 64; i++, f->sent++)
            send_batch(fd, f->stream_id, 4, 1, f->sent + 1, f->sent);
    }
    return 0;
}

/* max_credits 1: one batch per Credit. */
static int stream_one_credit(fake *f, int fd, const pd_envelope *req)
{
    if (req->body_case == PERMD__V1__ENVELOPE__BODY_STREAM)
        f->sent = 0;
    else if (req->body_case != PERMD__V1__ENVELOPE__BODY_CREDIT)
        return 0;
    if (f->sent < 3) {
        send_batch(fd, req->id, 4, 1, f->sent + 1, f->sent);
        f->sent++;
    } else {
        send_end(fd, req->id, 0, 3, 3);
    }
    return 0;
}

static void test_stream_bounds(void **state)
{
    (void)state;
    const void *p;
    uint32_t width;
    uint64_t n, got;
    uint32_t ids[4];
    /* Uncredited batches while another reply is awaited: refused past the window, not queued for ever (256 MB
     * in the review's run). */
    fake f = {0};
    permd_client *c = fake_connect(&f, stream_flood);
    permd_stream *st;
    assert_int_equal(permd_stream_open(c, &slice, 1, 0, &st), 0);
    expect_error(c, permd_fetch_u32(c, &slice, 4, ids, &got, NULL), PERMD_EPROTO, "more stream batches than");
    permd_stream_close(st);
    fake_done(&f, c);

    /* A Cancel the server ignores: the close ends (it drained for ever). */
    memset(&f, 0, sizeof f);
    c = fake_connect(&f, stream_ignores_cancel);
    assert_int_equal(permd_set_timeout(c, 0), 0); /* no timeout: the bound is the credits */
    assert_int_equal(permd_stream_open(c, &slice, 1, 0, &st), 0);
    assert_int_equal(permd_stream_next(st, &p, &width, &n), 0);
    assert_int_equal(n, 1);
    expect_error(c, permd_stream_close(st), PERMD_EPROTO, "after a Cancel");
    fake_done(&f, c);

    /* A server's max_credits of 1 (a valid setting) was refused: the client asked for 2. */
    memset(&f, 0, sizeof f);
    f.max_credits = 1;
    c = fake_connect(&f, stream_one_credit);
    assert_int_equal(permd_stream_open(c, &slice, 1, 0, &st), 0);
    uint64_t total = 0;
    do {
        assert_int_equal(permd_stream_next(st, &p, &width, &n), 0);
        total += n;
    } while (n);
    assert_int_equal(total, 3);
    assert_int_equal(permd_stream_offset(st), 3);
    assert_int_equal(permd_stream_close(st), 0);
    fake_done(&f, c);
    assert_int_equal(f.asked_credits, 1);
    assert_int_equal(f.credits_seen, 3); /* one after each batch */
}

/* ---- Digest ---- */

/* Parts that advance the offset but never shrink what is left. */
static int digest_endless(fake *f, int fd, const pd_envelope *req)
{
    (void)f;
    if (req->body_case != PERMD__V1__ENVELOPE__BODY_DIGEST)
        return 0;
    Permd__V1__DigestReply r = PERMD__V1__DIGEST_REPLY__INIT;
    r.count = 1;
    r.next_offset = req->digest->slice->offset + 1;
    r.remaining = 5;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.digest_reply = &r;
    send_env(fd, &env, req->id, PERMD__V1__ENVELOPE__BODY_DIGEST_REPLY);
    return 0;
}

static void test_digest_that_never_ends(void **state)
{
    (void)state;
    fake f = {.max_digest = 1};
    permd_client *c = fake_connect(&f, digest_endless);
    permd_digest d;
    expect_error(c, permd_digest_slice(c, &slice, &d), PERMD_EPROTO, "inconsistent DigestReply");
    fake_done(&f, c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fetch_replies),
        cmocka_unit_test(test_id_widths),
        cmocka_unit_test(test_stream_replies),
        cmocka_unit_test(test_stream_bounds),
        cmocka_unit_test(test_digest_that_never_ends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
