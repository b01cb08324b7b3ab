/* Integration: libpermd against scripted fake servers — endpoints, timeouts, closed or malformed peers, argument checks. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

typedef enum {
    FAKE_SILENT,
    FAKE_CLOSE,
    FAKE_GARBAGE,
    FAKE_SPEC2,
    FAKE_ERROR0,
    FAKE_GONE,  /* closes right after the Hello: the next request is sent to nobody (EPIPE) */
    FAKE_RESET, /* closes with the request unread: the client's read is reset (ECONNRESET) */
    FAKE_DEAF,  /* reads nothing after the Hello, until the client hangs up */
    FAKE_REFUSE, /* refuses the next frame by its length (TOO_LARGE, id 0) and closes, its body unread */
    FAKE_MIX_HOLLOW, /* answers a PutMixture "created" without the mixture */
    FAKE_UNKNOWN,    /* answers the request NOT_FOUND, then closes */
    /* Stream replies a client must refuse (the fake offers stream rings from here on): */
    FAKE_RING_NOFD,     /* a StreamRing without its descriptor */
    FAKE_RING_UNSEALED, /* a ring that could shrink under the client's reads */
    FAKE_RING_OUTSIDE,  /* a batch announced past the ring's end */
    FAKE_BATCH_WRAP,    /* no ring: count × width wraps to the empty ids' length (and count is above batch) */
} fake_kind;

#define FAKE_SLOTS 4 /* = the fake's max_credits, so libpermd's window */
#define FAKE_SLOT_BYTES 448

typedef struct fake {
    char dir[64], path[128];
    int listen_fd;
    fake_kind kind;
    pthread_t th;
} fake;

static int read_frame(int fd, pd_envelope **env)
{
    return raw_recv_env(fd, 10000, env);
}

static void send_hello_reply(int fd, uint64_t id, uint32_t spec, int ring, uint32_t max_frame)
{
    char *features[] = {"stream", "stream_ring"};
    Permd__V1__Limits lim = PERMD__V1__LIMITS__INIT;
    lim.max_frame = max_frame;
    lim.max_count = 1000;
    lim.max_credits = 4;
    Permd__V1__HelloReply r = PERMD__V1__HELLO_REPLY__INIT;
    r.protocol_version = 1;
    r.spec_version = spec;
    r.server = "fake";
    r.limits = &lim;
    r.n_features = ring ? 2 : 1;
    r.features = features;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO_REPLY;
    env.hello_reply = &r;
    raw_send_env(fd, &env);
}

/* A frame, with a descriptor on its first byte when pass >= 0. */
static void send_env_fd(int fd, const pd_envelope *env, int pass)
{
    size_t n = pd_frame_size(env);
    uint8_t *buf = malloc(n);
    pd_frame_pack(env, buf);
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = buf, .iov_len = n};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pass >= 0) {
        msg.msg_control = ctl.b;
        msg.msg_controllen = sizeof ctl.b;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass, sizeof pass);
    }
    if (sendmsg(fd, &msg, MSG_NOSIGNAL) != (ssize_t)n)
        fprintf(stderr, "fake: sendmsg failed\n");
    free(buf);
}

/* The reply to a Stream (request id) that the kind makes wrong. */
static void fake_stream_reply(int fd, fake_kind kind, uint64_t id)
{
    const size_t size = 4096;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    Permd__V1__StreamBatch b = PERMD__V1__STREAM_BATCH__INIT;
    b.id_width = 4;
    b.count = 100;
    b.next_offset = 100; /* in order, advancing: only what the kind breaks is wrong */
    env.body_case = PERMD__V1__ENVELOPE__BODY_STREAM_BATCH;
    env.stream_batch = &b;
    if (kind == FAKE_BATCH_WRAP) {
        b.id_width = 16;
        b.count = UINT64_C(1) << 60; /* × 16 = 2^64: 0 bytes, as the (empty) ids field */
        send_env_fd(fd, &env, -1);
        return;
    }
    int mfd = memfd_create("fake-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mfd < 0 || ftruncate(mfd, (off_t)size))
        fprintf(stderr, "fake: memfd failed\n");
    if (kind != FAKE_RING_UNSEALED)
        fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    Permd__V1__StreamRing r = PERMD__V1__STREAM_RING__INIT;
    r.size = size;
    r.slots = FAKE_SLOTS;
    r.slot_bytes = FAKE_SLOT_BYTES;
    pd_envelope renv = PERMD__V1__ENVELOPE__INIT;
    renv.id = id;
    renv.body_case = PERMD__V1__ENVELOPE__BODY_STREAM_RING;
    renv.stream_ring = &r;
    send_env_fd(fd, &renv, kind == FAKE_RING_NOFD ? -1 : mfd);
    close(mfd);
    b.ring_offset = FAKE_SLOTS * FAKE_SLOT_BYTES * 2; /* slot 8 of 4 (still inside the 4096-byte mapping) */
    send_env_fd(fd, &env, -1);
}

/* One connection, scripted by kind. */
static void *fake_main(void *arg)
{
    fake *f = arg;
    int fd = accept(f->listen_fd, NULL, NULL);
    pd_envelope *env;
    if (fd < 0 || read_frame(fd, &env))
        return NULL;
    uint64_t id = env->id;
    protobuf_c_message_free_unpacked(&env->base, NULL);
    if (f->kind == FAKE_ERROR0) { /* refuse the connection as an overloaded server does */
        Permd__V1__Error e = PERMD__V1__ERROR__INIT;
        e.code = PERMD__V1__ERROR_CODE__ERROR_CODE_OVERLOADED;
        e.message = "too many connections";
        pd_envelope out = PERMD__V1__ENVELOPE__INIT;
        out.body_case = PERMD__V1__ENVELOPE__BODY_ERROR;
        out.error = &e;
        raw_send_env(fd, &out);
        close(fd);
        return NULL;
    }
    send_hello_reply(fd, id, f->kind == FAKE_SPEC2 ? 2 : 1, f->kind >= FAKE_RING_NOFD && f->kind != FAKE_BATCH_WRAP,
                     f->kind == FAKE_DEAF || f->kind == FAKE_REFUSE ? 1u << 22 : 4096); /* requests in one frame */
    if (f->kind == FAKE_RESET) { /* wait for the request, leave it unread, and close: a kill -9 mid-request */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 10000);
    }
    if (f->kind == FAKE_REFUSE) { /* as permd with error_linger_ms 0: the answer, then the close */
        uint8_t prefix[4];
        if (recv(fd, prefix, sizeof prefix, MSG_WAITALL) == (ssize_t)sizeof prefix) {
            Permd__V1__Error e = PERMD__V1__ERROR__INIT;
            e.code = PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE;
            e.message = "frame exceeds max_frame";
            pd_envelope out = PERMD__V1__ENVELOPE__INIT;
            out.body_case = PERMD__V1__ENVELOPE__BODY_ERROR;
            out.error = &e;
            raw_send_env(fd, &out);
        }
    }
    if (f->kind == FAKE_DEAF) { /* the client's request fills the socket's buffer and stays there */
        struct pollfd p = {.fd = fd, .events = POLLRDHUP};
        poll(&p, 1, 10000);
    }
    if (f->kind == FAKE_GONE || f->kind == FAKE_RESET || f->kind == FAKE_DEAF || f->kind == FAKE_REFUSE) {
        close(fd);
        return NULL;
    }
    if (f->kind != FAKE_SPEC2 && read_frame(fd, &env) == 0) { /* the request under test */
        id = env->id;
        protobuf_c_message_free_unpacked(&env->base, NULL);
        if (f->kind >= FAKE_RING_NOFD)
            fake_stream_reply(fd, f->kind, id);
        if (f->kind == FAKE_GARBAGE) {
            const uint8_t junk[] = {3, 0, 0, 0, 0xff, 0xff, 0xff};
            raw_send(fd, junk, sizeof junk);
        }
        if (f->kind == FAKE_UNKNOWN) {
            Permd__V1__Error e = PERMD__V1__ERROR__INIT;
            e.code = PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND;
            e.message = "no such mixture";
            pd_envelope out = PERMD__V1__ENVELOPE__INIT;
            out.id = id;
            out.body_case = PERMD__V1__ENVELOPE__BODY_ERROR;
            out.error = &e;
            raw_send_env(fd, &out);
        }
        if (f->kind == FAKE_MIX_HOLLOW) {
            Permd__V1__MixtureReply r = PERMD__V1__MIXTURE_REPLY__INIT;
            r.created = 1;
            pd_envelope out = PERMD__V1__ENVELOPE__INIT;
            out.id = id;
            out.body_case = PERMD__V1__ENVELOPE__BODY_MIXTURE_REPLY;
            out.mixture_reply = &r;
            raw_send_env(fd, &out);
        }
        if (f->kind == FAKE_SILENT) {
            char b;
            while (recv(fd, &b, 1, 0) > 0) /* until the client hangs up */
                ;
        }
    }
    close(fd);
    return NULL;
}

static void fake_start(fake *f, fake_kind kind)
{
    memset(f, 0, sizeof *f);
    f->listen_fd = harness_fake_listen(f->dir, f->path);
    assert_true(f->listen_fd >= 0);
    f->kind = kind;
    pthread_create(&f->th, NULL, fake_main, f);
}

static void fake_stop(fake *f)
{
    pthread_join(f->th, NULL);
    harness_fake_close(f->listen_fd, f->dir, f->path);
}

static const permd_slice any_slice = {.dataset = "d", .world = 1, .mode = PERMD_MODE_PAD};

static void test_timeout(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, FAKE_SILENT);
    permd_client *c;
    char ep[160];
    snprintf(ep, sizeof ep, "unix:%s", f.path);
    assert_int_equal(permd_connect(ep, NULL, &c), 0);
    permd_server_info info;
    assert_int_equal(permd_server_info_get(c, &info), 0);
    assert_string_equal(info.server, "fake");
    assert_int_equal(info.max_count, 1000);
    assert_int_equal(permd_set_timeout(c, 200), 0);
    uint64_t ids[4], got;
    assert_int_equal(permd_fetch_u64(c, &any_slice, 4, ids, &got, NULL), PERMD_ETIMEDOUT);
    assert_non_null(strstr(permd_last_error(c), "200 ms"));
    /* after a timeout the connection is not reused: its reply could still come */
    assert_int_equal(permd_fetch_u64(c, &any_slice, 4, ids, &got, NULL), PERMD_ECLOSED);
    permd_close(c);
    fake_stop(&f);
}

#define BIG_PUT_SHARDS ((size_t)1 << 18) /* a sharded put of ~1 MiB of varints: far more than a socket buffers */

/* The shard sizes of that put (the caller frees them). */
static uint64_t *big_put_sizes(void)
{
    uint64_t *sizes = malloc(BIG_PUT_SHARDS * sizeof *sizes);
    assert_non_null(sizes);
    for (size_t i = 0; i < BIG_PUT_SHARDS; i++)
        sizes[i] = 1000000 + i;
    return sizes;
}

/* A request larger than the socket's buffer, to a server that reads none of it: the deadline holds while it is
 * sent (the client sat in a blocking send() for as long as the server read nothing). */
static void test_timeout_while_sending(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, FAKE_DEAF);
    permd_client *c;
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    assert_int_equal(permd_set_timeout(c, 300), 0);
    const size_t n = BIG_PUT_SHARDS;
    uint64_t *sizes = big_put_sizes();
    const double t0 = test_now_s();
    assert_int_equal(permd_put_dataset_sharded(c, "big", sizes, n, 0, 0, NULL, NULL), PERMD_ETIMEDOUT);
    const double took = test_now_s() - t0;
    assert_true(took >= 0.25 && took < 5);
    assert_non_null(strstr(permd_last_error(c), "within 300 ms"));
    free(sizes);
    permd_close(c);
    fake_stop(&f);
}

/* A server that refuses a request by its length and closes while the client is still sending it: the client
 * reports the server's error (it said "permd closed the connection (sending: Broken pipe)"), and the connection
 * is over. */
static void test_refused_while_sending(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, FAKE_REFUSE);
    permd_client *c;
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    assert_int_equal(permd_set_timeout(c, 10000), 0);
    const size_t n = BIG_PUT_SHARDS;
    uint64_t *sizes = big_put_sizes();
    assert_int_equal(permd_put_dataset_sharded(c, "big", sizes, n, 0, 0, NULL, NULL), PERMD_ETOOBIG);
    assert_non_null(strstr(permd_last_error(c), "frame exceeds max_frame"));
    assert_int_equal(permd_usable(c), 0);
    free(sizes);
    permd_close(c);
    fake_stop(&f);
}

static void test_peer_closes(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, FAKE_CLOSE);
    permd_client *c;
    assert_int_equal(permd_connect(f.path, NULL, &c), 0); /* a path with '/' is a Unix socket */
    permd_dataset d;
    assert_int_equal(permd_get_dataset(c, "d", &d), PERMD_ECLOSED);
    assert_non_null(strstr(permd_last_error(c), "closed"));
    permd_close(c);
    fake_stop(&f);
}

/* A permd killed under its client: whether the client's request or its read meets the close, the message
 * says permd closed the connection (it was "sending to permd: Broken pipe", or "reading from permd:
 * Connection reset by peer" as an I/O error). */
static void test_peer_killed(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, FAKE_GONE);
    permd_client *c;
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    pthread_join(f.th, NULL); /* the fake has closed: the request below is sent to nobody */
    permd_dataset d;
    assert_int_equal(permd_get_dataset(c, "d", &d), PERMD_ECLOSED);
    assert_non_null(strstr(permd_last_error(c), "permd closed the connection"));
    permd_close(c);
    harness_fake_close(f.listen_fd, f.dir, f.path);

    fake_start(&f, FAKE_RESET);
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    assert_int_equal(permd_get_dataset(c, "d", &d), PERMD_ECLOSED);
    assert_non_null(strstr(permd_last_error(c), "permd closed the connection"));
    permd_close(c);
    fake_stop(&f);
}

static void test_garbage_reply(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, FAKE_GARBAGE);
    permd_client *c;
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    uint64_t ids[4], got;
    assert_int_equal(permd_fetch_u64(c, &any_slice, 4, ids, &got, NULL), PERMD_EPROTO);
    permd_close(c);
    fake_stop(&f);
}

/* A PutMixture answered "created" without the mixture: a protocol error, and *created says nothing (it said 1,
 * where the caller passed no out to have the reply checked). */
static void test_hollow_mixture_reply(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, FAKE_MIX_HOLLOW);
    permd_client *c;
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    const char *comps[] = {"a", "b"};
    const uint64_t starts[] = {0};
    const uint32_t weights[] = {1, 1};
    int32_t created = -7;
    assert_int_equal(permd_put_mixture(c, "m", comps, 2, starts, weights, 1, 0, 0, NULL, &created), PERMD_EPROTO);
    assert_int_equal(created, -7);
    assert_non_null(strstr(permd_last_error(c), "incomplete mixture"));
    permd_close(c);
    fake_stop(&f);
}

/* An inverse on a name that is no mixture looks the name up as a dataset too, to say which it is; when the
 * connection breaks there, the caller hears that, not "no dataset or mixture named" (it did). */
static void test_inverse_lookup_broken(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, FAKE_UNKNOWN);
    permd_client *c;
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    const uint64_t samples[] = {1}, component_epochs[] = {0};
    uint64_t epochs[1], positions[1];
    assert_int_equal(permd_inverse_mixture(c, "m", 1, 1, -1, samples, component_epochs, 1, epochs, positions, NULL),
                     PERMD_ECLOSED);
    assert_null(strstr(permd_last_error(c), "no dataset or mixture"));
    permd_close(c);
    fake_stop(&f);
}

static void test_handshake_refusals(void **state)
{
    (void)state;
    fake f;
    permd_client *c;
    fake_start(&f, FAKE_SPEC2); /* a server computing another permutation spec */
    assert_int_equal(permd_connect_unix(f.path, &c), PERMD_EUNSUPPORTED);
    assert_non_null(strstr(permd_last_error(NULL), "spec v2"));
    fake_stop(&f);
    fake_start(&f, FAKE_ERROR0);
    assert_int_equal(permd_connect_unix(f.path, &c), PERMD_EBUSY);
    assert_non_null(strstr(permd_last_error(NULL), "OVERLOADED: too many connections"));
    fake_stop(&f);
}

/* permd_connect_timeout bounds the Hello: a socket that accepts connections and never answers fails in about the
 * timeout, not after the fixed 10 s of permd_connect. */
static void test_connect_timeout(void **state)
{
    (void)state;
    char path[96];
    snprintf(path, sizeof path, "/tmp/permd-test-mute-%d.sock", (int)getpid());
    unlink(path);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 4), 0); /* the kernel completes connects; nobody reads */
    char ep[128];
    snprintf(ep, sizeof ep, "unix:%s", path);
    permd_client *c;
    const double t0 = test_now_s();
    assert_int_equal(permd_connect_timeout(ep, NULL, 200, &c), PERMD_ETIMEDOUT);
    const double s = test_now_s() - t0;
    assert_true(s >= 0.15 && s < 5);
    close(lfd);
    unlink(path);
}

/* permd_connect_timeout bounds the TCP connect too: a peer that drops SYNs (a full accept queue here, a
 * firewall or a dead host in life) fails in about the timeout, where connect alone waits minutes. */
static void test_connect_timeout_tcp(void **state)
{
    (void)state;
    uint16_t port;
    int fillers[HARNESS_FILLERS];
    int lfd = harness_full_tcp_listener(&port, fillers);
    assert_true(lfd >= 0);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp:127.0.0.1:%u", (unsigned)port);
    permd_client *c;
    const double t0 = test_now_s();
    assert_int_equal(permd_connect_timeout(ep, NULL, 300, &c), PERMD_ETIMEDOUT);
    const double s = test_now_s() - t0;
    assert_true(s >= 0.25 && s < 5);
    assert_non_null(strstr(permd_last_error(NULL), "no connection within 300 ms"));
    harness_full_close(lfd, fillers);
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* A stream reply that breaks the protocol, ring or not: PERMD_EPROTO saying
 * what, no descriptor kept, nothing read out of bounds. */
static void test_bad_stream_replies(void **state)
{
    (void)state;
    const struct {
        fake_kind kind;
        const char *says;
    } cases[] = {
        {FAKE_RING_NOFD, "unexpected StreamRing"},
        {FAKE_RING_UNSEALED, "not sealed against shrinking"},
        {FAKE_RING_OUTSIDE, "outside its ring"},
        {FAKE_BATCH_WRAP, "StreamBatch of 1152921504606846976 items"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fds = open_fds();
        fake f;
        fake_start(&f, cases[i].kind);
        permd_client *c;
        permd_stream *st = NULL;
        assert_int_equal(permd_connect_unix(f.path, &c), 0);
        int rc = permd_stream_open(c, &any_slice, 100, 0, &st);
        if (rc != PERMD_EPROTO)
            fail_msg("case %zu: permd_stream_open gave %d (%s)", i, rc, permd_last_error(c));
        assert_null(st);
        if (!strstr(permd_last_error(c), cases[i].says))
            fail_msg("case %zu: '%s' does not say '%s'", i, permd_last_error(c), cases[i].says);
        permd_close(c);
        fake_stop(&f);
        assert_int_equal(open_fds(), fds);
    }
}

static void test_endpoints_and_arguments(void **state)
{
    (void)state;
    permd_client *c = NULL;
    assert_int_equal(permd_connect_unix("/nonexistent/permd.sock", &c), PERMD_EIO);
    assert_non_null(strstr(permd_last_error(NULL), "is permd running?"));
    assert_int_equal(permd_connect_tcp("127.0.0.1:0", NULL, &c), PERMD_EINVAL);
    assert_int_equal(permd_connect_tcp("::1:80", NULL, &c), PERMD_EINVAL);
    assert_int_equal(permd_connect("tcp:127.0.0.1:1", NULL, &c), PERMD_EIO); /* nothing listens on port 1 */
    assert_null(c);
    assert_int_equal(permd_connect_unix(NULL, NULL), PERMD_EINVAL);

    assert_string_not_equal(permd_strerror(PERMD_ENOTFOUND), permd_strerror(PERMD_ECONFLICT));
    assert_string_equal(permd_version(), PERMD_VERSION_STRING);
    assert_int_equal(permd_abi_version(), PERMD_ABI_VERSION);
    permd_close(NULL);

    fake f;
    fake_start(&f, FAKE_CLOSE);
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    permd_slice bad = any_slice;
    bad.mode = 7;
    uint64_t ids[4], got;
    assert_int_equal(permd_fetch_u64(c, &bad, 4, ids, &got, NULL), PERMD_EINVAL);
    bad = any_slice;
    bad.dataset = NULL;
    assert_int_equal(permd_fetch_u64(c, &bad, 4, ids, &got, NULL), PERMD_EINVAL);
    assert_int_equal(permd_fetch_u64(c, &any_slice, 4, NULL, &got, NULL), PERMD_EINVAL);
    assert_int_equal(permd_put_dataset(c, "", 5, NULL, NULL), PERMD_EINVAL);
    char longname[PERMD_NAME_MAX + 2];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(permd_get_dataset(c, longname, NULL), PERMD_EINVAL);
    permd_stream *st;
    assert_int_equal(permd_stream_open(c, &any_slice, 0, 0, &st), PERMD_EINVAL);
    assert_int_equal(permd_inverse(c, "d", 1, 1, 1, 5, NULL, 0, NULL, NULL), PERMD_EINVAL);
    /* a caller's mistake caught here says so, not the last failure's message */
    assert_int_equal(permd_stats_get(c, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "permd_stats_get: out is required"));
    size_t total;
    assert_int_equal(permd_list_datasets(c, NULL, 0, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "permd_list_datasets"));
    assert_int_equal(permd_list_mixtures(c, NULL, 3, &total), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "permd_list_mixtures"));
    assert_int_equal(permd_stream_open(c, &any_slice, 4, 0, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(c), "permd_stream_open: out is required"));
    assert_int_equal(permd_connect("127.0.0.1:7470", NULL, NULL), PERMD_EINVAL);
    assert_non_null(strstr(permd_last_error(NULL), "out is required"));
    /* A library built on libpermd (libpermd_nccl) records its own failures: the message is c's (or the thread's
     * for NULL) and the connection stays usable, whatever the code. */
    assert_int_equal(permd_set_error(c, PERMD_EIO, "cuda device %d: %s", 9, "invalid device ordinal"), PERMD_EIO);
    assert_string_equal(permd_last_error(c), "cuda device 9: invalid device ordinal");
    assert_int_equal(permd_usable(c), 1);
    assert_int_equal(permd_set_error(NULL, PERMD_ETIMEDOUT, "no %s", "answer"), PERMD_ETIMEDOUT);
    assert_string_equal(permd_last_error(NULL), "no answer");
    assert_string_equal(permd_last_error(c), "cuda device 9: invalid device ordinal");
    permd_close(c); /* none of those reached the fake, which just hangs up */
    fake_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_timeout_while_sending),
        cmocka_unit_test(test_refused_while_sending),
        cmocka_unit_test(test_peer_closes),
        cmocka_unit_test(test_peer_killed),
        cmocka_unit_test(test_garbage_reply),
        cmocka_unit_test(test_hollow_mixture_reply),
        cmocka_unit_test(test_inverse_lookup_broken),
        cmocka_unit_test(test_handshake_refusals),
        cmocka_unit_test(test_connect_timeout),
        cmocka_unit_test(test_connect_timeout_tcp),
        cmocka_unit_test(test_bad_stream_replies),
        cmocka_unit_test(test_endpoints_and_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
