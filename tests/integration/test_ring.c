/* Integration: streams through a shared-memory ring — the core's ids, slots and credits, seals, declines, no leaks. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "core/rank.h"
#include "harness.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define N 100000
#define BIG_N ((UINT64_C(1) << 33) + 7) /* 8-byte ids */
#define RING_MAX (1u << 20)             /* --stream-ring-max: 1 MiB */
#define RING_TOTAL (2u << 20)           /* --stream-ring-total: two such rings */

static harness h;

static int setup(void **state)
{
    (void)state;
    harness_init(&h);
    char max[32], total[32];
    snprintf(max, sizeof max, "%u", RING_MAX);
    snprintf(total, sizeof total, "%u", RING_TOTAL);
    const char *extra[] = {"--inline-ids", "100", "--stream-ring-max", max, "--stream-ring-total", total, NULL};
    return harness_start(&h, 1, extra, NULL) || harness_put(&h, "d", N) || harness_put(&h, "big", BIG_N) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return harness_finish(&h);
}

static const permd_slice slice_d = {.dataset = "d", .seed = 5, .epoch = 6, .world = 3, .rank = 2, .mode = PERMD_MODE_PAD};

/* The k-th id from offset of s's rank, per the core. */
static uint64_t want_id(const permd_slice *s, uint64_t n, uint64_t offset, uint64_t k)
{
    pd_perm p;
    pd_perm_init(&p, s->seed, s->epoch, PD_STREAM_SAMPLES, n);
    return pd_stream_sample(&p, offset + s->rank + (uint64_t)s->world * k);
}

/* Read `batches` batches (or to the end) and check every id; returns ids read. */
static uint64_t check_stream(permd_stream *st, const permd_slice *s, uint64_t n, uint64_t batches)
{
    uint64_t k = 0;
    for (uint64_t b = 0; b < batches; b++) {
        const void *ids;
        uint32_t width;
        uint64_t cnt;
        assert_int_equal(permd_stream_next(st, &ids, &width, &cnt), 0);
        if (cnt == 0)
            break;
        assert_int_equal(width, n > (UINT64_C(1) << 32) ? 8 : 4);
        assert_int_equal((uintptr_t)ids % width, 0);
        for (uint64_t i = 0; i < cnt; i++) {
            uint64_t got = width == 4 ? ((const uint32_t *)ids)[i] : ((const uint64_t *)ids)[i];
            if (got != want_id(s, n, s->offset, k + i))
                fail_msg("id %llu: %llu, the core says %llu", (unsigned long long)(k + i), (unsigned long long)got,
                         (unsigned long long)want_id(s, n, s->offset, k + i));
        }
        k += cnt;
    }
    return k;
}

static uint64_t rings_total(permd_client *c)
{
    permd_stats st;
    assert_int_equal(permd_stats_get(c, &st), 0);
    return st.stream_rings_total;
}

/* Mappings of stream rings in permd's address space. */
static int server_rings(void)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)h.pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, "permd-stream-ring") != NULL;
    fclose(f);
    return n;
}

/* Wait (10 s at most: a loaded machine) until permd has at most n rings mapped; returns how many. */
static int wait_rings(int n)
{
    for (int i = 0; i < 500 && server_rings() > n; i++)
        usleep(20000);
    return server_rings();
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

/* libpermd on the Unix socket takes a ring, and its ids are the core's,
 * across inline and pool batches, u32 and u64, odd batch sizes and a resume. */
static void test_ring_matches_core(void **state)
{
    (void)state;
    permd_client *c;
    permd_stream *st;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    uint64_t before = rings_total(c);
    const uint64_t batches[] = {1, 7, 100, 1000, 4099};
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        assert_int_equal(permd_stream_open(c, &slice_d, batches[i], 0, &st), 0);
        assert_int_equal(permd_stream_shared(st), 1);
        uint64_t want = (N + 2) / 3, got = check_stream(st, &slice_d, N, UINT64_MAX);
        assert_int_equal(got, want); /* to the end of the rank */
        assert_int_equal(permd_stream_close(st), 0);
    }
    /* u64 ids, and a checkpoint resumed on a fresh stream. */
    permd_slice s = {.dataset = "big", .seed = 9, .epoch = 1, .world = 5, .rank = 4, .mode = PERMD_MODE_EXACT};
    assert_int_equal(permd_stream_open(c, &s, 3000, 0, &st), 0);
    assert_int_equal(permd_stream_shared(st), 1);
    uint64_t k = check_stream(st, &s, BIG_N, 10);
    assert_int_equal(k, 30000);
    permd_slice resume = s;
    resume.offset = permd_stream_offset(st);
    assert_int_equal(resume.offset, 5 * k);
    assert_int_equal(permd_stream_close(st), 0);
    assert_int_equal(permd_stream_open(c, &resume, 3000, 20000, &st), 0);
    assert_int_equal(check_stream(st, &resume, BIG_N, UINT64_MAX), 20000); /* max_count ends it */
    assert_int_equal(permd_stream_close(st), 0);
    assert_int_equal(rings_total(c), before + 7);
    permd_close(c);
}

/* The same ids come through the socket when the client asks, over TCP, and
 * when the ring would exceed stream_ring_max. */
static void test_ring_declined(void **state)
{
    (void)state;
    permd_client *c;
    permd_stream *st;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    uint64_t before = rings_total(c);
    assert_int_equal(permd_stream_open_ex(c, &slice_d, 500, 0, PERMD_STREAM_SOCKET, &st), 0);
    assert_int_equal(permd_stream_shared(st), 0);
    assert_int_equal(check_stream(st, &slice_d, N, 20), 10000);
    assert_int_equal(permd_stream_close(st), 0);
    /* 32768 u64 ids a batch: libpermd's window of 16 makes a 4 MiB ring, over 1 MiB. */
    permd_slice s = slice_d;
    s.dataset = "big";
    assert_int_equal(permd_stream_open(c, &s, 32768, 0, &st), 0);
    assert_int_equal(permd_stream_shared(st), 0);
    assert_int_equal(check_stream(st, &s, BIG_N, 3), 3 * 32768);
    assert_int_equal(permd_stream_close(st), 0);
    assert_int_equal(rings_total(c), before); /* none of these took a ring */
    permd_close(c);

    assert_int_equal(permd_connect_tcp(h.tcp, NULL, &c), 0);
    assert_int_equal(permd_stream_open(c, &slice_d, 500, 0, &st), 0);
    assert_int_equal(permd_stream_shared(st), 0); /* descriptors do not cross TCP */
    assert_int_equal(check_stream(st, &slice_d, N, 20), 10000);
    assert_int_equal(permd_stream_close(st), 0);
    permd_close(c);
}

/* ---- The raw protocol ---- */

static void send_env(int fd, uint64_t id, pd_envelope *env)
{
    env->id = id;
    assert_int_equal(raw_send_env(fd, env), 0);
}

static void send_ring_stream(int fd, uint64_t id, uint64_t batch, uint32_t credits, int reuse)
{
    Permd__V1__Slice sl = PERMD__V1__SLICE__INIT;
    sl.dataset = "d";
    sl.seed = slice_d.seed;
    sl.epoch = slice_d.epoch;
    sl.world = slice_d.world;
    sl.rank = slice_d.rank;
    sl.mode = PERMD__V1__MODE__MODE_PAD;
    Permd__V1__Stream m = PERMD__V1__STREAM__INIT;
    m.slice = &sl;
    m.batch = batch;
    m.credits = credits;
    m.ring = 1;
    m.reuse_ring = reuse;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STREAM;
    env.stream = &m;
    send_env(fd, id, &env);
}

/* The next frame, and the descriptor that came with its first byte (-1 if none). */
static pd_envelope *recv_env_fd(int fd, int *passed)
{
    uint8_t hdr[4];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = hdr, .iov_len = 4};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 10000), 1);
    assert_int_equal(recvmsg(fd, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC), 4);
    *passed = -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
        memcpy(passed, CMSG_DATA(cm), sizeof *passed);
    uint32_t len = pd_load_le32(hdr);
    uint8_t *buf = malloc(len + 1);
    assert_non_null(buf);
    size_t off = 0;
    while (off < len) {
        ssize_t n = recv(fd, buf + off, len - off, 0);
        assert_true(n > 0);
        off += (size_t)n;
    }
    pd_envelope *env;
    assert_int_equal(pd_frame_unpack(buf, len, NULL, &env), 0);
    free(buf);
    return env;
}

/* The ids of batch seq (of slice_d from offset 0) in their slot of the ring. */
static void expect_slot(const uint8_t *ring, uint64_t slot_bytes, uint32_t slots, uint64_t seq, uint64_t batch)
{
    const uint8_t *ids = ring + (seq % slots) * slot_bytes;
    for (uint64_t i = 0; i < batch; i++)
        assert_int_equal(pd_load_le32(ids + 4 * i), want_id(&slice_d, N, 0, seq * batch + i));
}

/* Batch seq in its slot: announced without ids, the core's ids in the ring. */
static void expect_ring_batch(int fd, const uint8_t *ring, uint64_t slot_bytes, uint32_t slots, uint64_t seq,
                              uint64_t batch)
{
    int passed;
    pd_envelope *env = recv_env_fd(fd, &passed);
    assert_int_equal(passed, -1);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
    const Permd__V1__StreamBatch *b = env->stream_batch;
    assert_int_equal(b->seq, seq);
    assert_int_equal(b->count, batch);
    assert_int_equal(b->ids.len, 0);
    assert_int_equal(b->ring_offset, (seq % slots) * slot_bytes);
    expect_slot(ring, slot_bytes, slots, seq, batch);
    protobuf_c_message_free_unpacked(&env->base, NULL);
}

/* StreamRing brings a sealed, read-only memfd; batch k lands in slot k %
 * slots; credits pace it as on the socket; Cancel ends it; the server unmaps
 * the ring once the stream is over. */
static void test_ring_raw_protocol(void **state)
{
    (void)state;
    const uint64_t batch = 100, slot_bytes = 448; /* 400 bytes rounded up to 64 */
    const uint32_t slots = 3;
    assert_int_equal(server_rings(), 0);
    int fd = raw_connect_unix(h.sock);
    send_ring_stream(fd, 7, batch, slots, 0);
    int ring_fd;
    pd_envelope *env = recv_env_fd(fd, &ring_fd);
    assert_int_equal(env->id, 7);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_RING);
    assert_int_equal(env->stream_ring->slots, slots);
    assert_int_equal(env->stream_ring->slot_bytes, slot_bytes);
    const uint64_t size = env->stream_ring->size;
    assert_int_equal(size % (uint64_t)sysconf(_SC_PAGESIZE), 0);
    assert_true(size >= slots * slot_bytes);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    assert_true(ring_fd >= 0);
    assert_int_equal(server_rings(), 1);

    /* The client can neither shrink the ring (permd's next write would fault) nor write it. */
    struct stat sb;
    assert_int_equal(fstat(ring_fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, size);
    int seals = fcntl(ring_fd, F_GET_SEALS);
    assert_true(seals >= 0);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_equal(ftruncate(ring_fd, 0), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fcntl(ring_fd, F_ADD_SEALS, F_SEAL_WRITE), -1); /* sealed against new seals too */
    if (seals & F_SEAL_FUTURE_WRITE) {
        assert_true(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0) == MAP_FAILED);
        assert_int_equal(write(ring_fd, "x", 1), -1);
        assert_int_equal(fallocate(ring_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), -1);
    } else {
        print_message("this kernel has no F_SEAL_FUTURE_WRITE (Linux < 5.1): the write checks are skipped\n");
    }
    const uint8_t *ring = mmap(NULL, size, PROT_READ, MAP_SHARED, ring_fd, 0);
    assert_true(ring != MAP_FAILED);
    const ino_t ino = sb.st_ino;
    close(ring_fd);

    for (uint64_t seq = 0; seq < slots; seq++)
        expect_ring_batch(fd, ring, slot_bytes, slots, seq, batch);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 300), 0); /* no credits, no batch: the slots are the client's */

    Permd__V1__Credit cr = PERMD__V1__CREDIT__INIT;
    cr.credits = 1000; /* more than the ring holds: capped at its slots */
    pd_envelope e = PERMD__V1__ENVELOPE__INIT;
    e.body_case = PERMD__V1__ENVELOPE__BODY_CREDIT;
    e.credit = &cr;
    send_env(fd, 7, &e);
    for (uint64_t seq = slots; seq < 2 * slots; seq++)
        expect_ring_batch(fd, ring, slot_bytes, slots, seq, batch);
    assert_int_equal(poll(&pf, 1, 300), 0);

    Permd__V1__Cancel cancel = PERMD__V1__CANCEL__INIT;
    e.body_case = PERMD__V1__ENVELOPE__BODY_CANCEL;
    e.cancel = &cancel;
    send_env(fd, 7, &e);
    assert_int_equal(raw_recv_env(fd, 10000, &env), 0);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_END);
    assert_int_equal(env->stream_end->delivered, 2 * slots * batch);
    protobuf_c_message_free_unpacked(&env->base, NULL);

    /* The ended stream's last batches stay the client's: a next ring stream that does not say the client is
     * done with them (reuse_ring) gets new memory and leaves them be; permd lets go of the old ring. */
    send_ring_stream(fd, 8, batch, slots, 0);
    env = recv_env_fd(fd, &ring_fd);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_RING);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    assert_int_equal(fstat(ring_fd, &sb), 0);
    assert_true(sb.st_ino != ino);
    const ino_t ino2 = sb.st_ino;
    const uint8_t *ring2 = mmap(NULL, size, PROT_READ, MAP_SHARED, ring_fd, 0);
    assert_true(ring2 != MAP_FAILED);
    close(ring_fd);
    for (uint64_t seq = 0; seq < slots; seq++)
        expect_ring_batch(fd, ring2, slot_bytes, slots, seq, batch);
    for (uint64_t seq = slots; seq < 2 * slots; seq++)
        expect_slot(ring, slot_bytes, slots, seq, batch); /* stream 7's last batches, intact */
    munmap((void *)ring, size);
    assert_int_equal(server_rings(), 1);
    e.body_case = PERMD__V1__ENVELOPE__BODY_CANCEL;
    send_env(fd, 8, &e);
    assert_int_equal(raw_recv_env(fd, 10000, &env), 0);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_END);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    munmap((void *)ring2, size);

    /* Done with it (reuse_ring): the connection's kept ring serves the next stream, the same memory. */
    send_ring_stream(fd, 9, batch, slots, 1);
    env = recv_env_fd(fd, &ring_fd);
    assert_int_equal(env->body_case, PERMD__V1__ENVELOPE__BODY_STREAM_RING);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    assert_int_equal(fstat(ring_fd, &sb), 0);
    assert_int_equal(sb.st_ino, ino2);
    close(ring_fd);
    assert_int_equal(server_rings(), 1);

    /* A client that vanishes mid-stream leaves no ring behind. */
    close(fd);
    assert_int_equal(wait_rings(0), 0);
}

/* Rings alive at once stay within stream_ring_total (a connection's kept
 * ring counts until it closes); beyond it streams go through the socket. */
static void test_ring_total(void **state)
{
    (void)state;
    assert_int_equal(wait_rings(0), 0);
    permd_client *c[3];
    permd_stream *st[3];
    for (int i = 0; i < 3; i++) { /* 16384 u32 a batch, libpermd's window of 16: 1 MiB rings */
        assert_int_equal(permd_connect_unix(h.sock, &c[i]), 0);
        assert_int_equal(permd_stream_open(c[i], &slice_d, 16384, 0, &st[i]), 0);
        assert_int_equal(permd_stream_shared(st[i]), i < 2);
        assert_int_equal(check_stream(st[i], &slice_d, N, 1), 16384);
    }
    assert_int_equal(server_rings(), 2);
    assert_int_equal(permd_stream_close(st[0]), 0); /* c[0] keeps its ring */
    assert_int_equal(permd_stream_close(st[2]), 0);
    assert_int_equal(permd_stream_open(c[2], &slice_d, 16384, 0, &st[2]), 0);
    assert_int_equal(permd_stream_shared(st[2]), 0);
    assert_int_equal(permd_stream_close(st[2]), 0);
    permd_close(c[0]); /* its ring is freed */
    assert_int_equal(wait_rings(1), 1);
    assert_int_equal(permd_stream_open(c[2], &slice_d, 16384, 0, &st[2]), 0);
    assert_int_equal(permd_stream_shared(st[2]), 1);
    assert_int_equal(check_stream(st[2], &slice_d, N, UINT64_MAX), (N + 2) / 3);
    assert_int_equal(permd_stream_close(st[2]), 0);
    assert_int_equal(permd_stream_close(st[1]), 0);
    permd_close(c[1]);
    permd_close(c[2]);
}

/* Opening and closing ring streams leaks no descriptor in the client and no ring in permd:
 * one connection's streams reuse its kept ring. A closed stream holds its ring until its last job
 * ends, so while jobs run a connection may briefly hold more than one; once they end, only the
 * kept ring is left. */
static void test_ring_no_leaks(void **state)
{
    (void)state;
    /* The last test's connections close asynchronously; their rings go first. */
    assert_int_equal(wait_rings(0), 0);
    permd_client *c;
    permd_stream *st;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    int fds = open_fds();
    for (int i = 0; i < 50; i++) {
        assert_int_equal(permd_stream_open(c, &slice_d, 200, 0, &st), 0);
        assert_int_equal(permd_stream_shared(st), 1);
        assert_int_equal(check_stream(st, &slice_d, N, (uint64_t)(i % 3)), 200 * (uint64_t)(i % 3));
        assert_true(server_rings() >= 1); /* the check below can see a ring */
        assert_int_equal(permd_stream_close(st), 0);
        assert_int_equal(wait_rings(1), 1); /* the kept one, reused by the next stream */
    }
    assert_int_equal(open_fds(), fds);
    permd_close(c);
    assert_int_equal(wait_rings(0), 0);
}

/* The ring mappings of this process (/proc/self/maps lines naming permd's memfd). */
static int mapped_rings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    assert_non_null(f);
    while (fgets(line, sizeof line, f))
        n += strstr(line, "permd-stream-ring") != NULL;
    fclose(f);
    return n;
}

/* permd_close with a stream still open frees what the stream holds (its ring's mapping, its queued
 * batches): a client that forgets permd_stream_close used to keep a 4 MiB mapping a stream. The handle
 * stays valid: the next read says PERMD_ECLOSED, and permd_stream_close frees it. */
static void test_close_frees_an_open_stream(void **state)
{
    (void)state;
    int before = mapped_rings();
    for (int i = 0; i < 3; i++) {
        permd_client *c;
        permd_stream *st;
        assert_int_equal(permd_connect_unix(h.sock, &c), 0);
        assert_int_equal(permd_stream_open(c, &slice_d, 200, 0, &st), 0);
        assert_int_equal(permd_stream_shared(st), 1);
        assert_int_equal(check_stream(st, &slice_d, N, 1), 200);
        assert_int_equal(mapped_rings(), before + 1);
        permd_close(c);
        assert_int_equal(mapped_rings(), before);
        const void *ids;
        uint32_t width;
        uint64_t count;
        assert_int_equal(permd_stream_next(st, &ids, &width, &count), PERMD_ECLOSED);
        assert_int_equal(permd_stream_close(st), 0);
    }
}

/* Each ring keeps a descriptor: permd gives rings only what RLIMIT_NOFILE leaves beside its connections
 * (max_connections + max_tcp_connections + metrics_connections + 64, and 4 a loop), so that they never stop
 * it accepting.
 * Here that leaves 2: two streams get rings, a third sends its ids through the socket, and new connections
 * are still accepted. */
static void test_ring_descriptors(void **state)
{
    (void)state;
    struct rlimit was, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &was), 0);
    low = was;
    low.rlim_cur = 10 + 10 + 4 + 64 + 4 + 2; /* permd inherits it; one loop takes 4 */
    harness own;
    harness_init(&own);
    char addr[32];
    const int port = harness_metrics_addr(addr);
    const char *extra[] = {"--max-connections", "10", "--max-tcp-connections", "10", "--metrics-connections", "4",
                           "--loops", "1", "--metrics", addr, "--metrics-cache-ms", "0", NULL};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    const int started = harness_start(&own, 0, extra, NULL);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &was), 0);
    assert_int_equal(started, 0);
    assert_int_equal(harness_put(&own, "d", N), 0);
    permd_client *c[4];
    permd_stream *st[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(permd_connect_unix(own.sock, &c[i]), 0);
        assert_int_equal(permd_stream_open(c[i], &slice_d, 1000, 0, &st[i]), 0);
        assert_int_equal(permd_stream_shared(st[i]), i < 2);
        assert_int_equal(check_stream(st[i], &slice_d, N, 3), 3000);
    }
    assert_int_equal(permd_connect_unix(own.sock, &c[3]), 0); /* still accepted */
    assert_int_equal(rings_total(c[3]), 2);
    assert_int_equal(harness_metric(port, "permd_stream_ring_fds"), 2);
    assert_true(harness_log_contains(&own, "few descriptors: stream rings limited to 2"));
    for (int i = 0; i < 3; i++)
        assert_int_equal(permd_stream_close(st[i]), 0);
    for (int i = 0; i < 4; i++)
        permd_close(c[i]);
    assert_int_equal(harness_finish(&own), 0);
}

/* A raw ring stream of slice_d in batches of `batch` with `slots` credits, read to its end: the descriptor of its
 * ring, kept open as a client holding on to it would (-1: declined, its ids came through the socket). */
static int ring_stream_run(int fd, uint64_t id, uint64_t batch, uint32_t slots, int reuse)
{
    send_ring_stream(fd, id, batch, slots, reuse);
    int ring_fd = -1, passed;
    for (;;) {
        pd_envelope *env = recv_env_fd(fd, &passed);
        assert_int_equal(env->id, id);
        const int body = env->body_case;
        if (body == PERMD__V1__ENVELOPE__BODY_STREAM_RING)
            ring_fd = passed;
        else
            assert_int_equal(passed, -1);
        if (body == PERMD__V1__ENVELOPE__BODY_STREAM_BATCH)
            assert_int_equal(env->stream_batch->ids.len == 0, ring_fd >= 0);
        protobuf_c_message_free_unpacked(&env->base, NULL);
        if (body == PERMD__V1__ENVELOPE__BODY_STREAM_END)
            return ring_fd;
        assert_true(body == PERMD__V1__ENVELOPE__BODY_STREAM_RING || body == PERMD__V1__ENVELOPE__BODY_STREAM_BATCH);
    }
}

/* A client that keeps its ended streams' rings (their descriptors) cannot make permd's ring memory grow past
 * stream_ring_total: rings it may still map stay counted until it says it is done with them (reuse_ring) or
 * closes. Past the bound its streams go through the socket, counted by reason. (Each ring stream used to take
 * the last one's memory, whose last batches the client still held, and a kept descriptor left the bound.) */
static void test_ring_kept_by_client(void **state)
{
    (void)state;
    harness own;
    harness_init(&own);
    char addr[32], max[32], total[32];
    const int port = harness_metrics_addr(addr);
    snprintf(max, sizeof max, "%u", RING_MAX);
    snprintf(total, sizeof total, "%u", RING_TOTAL);
    const char *extra[] = {"--stream-ring-max", max, "--stream-ring-total", total, "--metrics", addr,
                           "--metrics-cache-ms", "0", NULL};
    assert_int_equal(harness_start(&own, 0, extra, NULL), 0);
    assert_int_equal(harness_put(&own, "d", N), 0);
    const char *declined = "permd_stream_rings_declined_total{reason=\"stream_ring_total\"}";
    const uint64_t batch = RING_MAX / 4 / 4; /* u32 ids, 4 slots: rings of RING_MAX, two within the total */
    int fd = raw_connect_unix(own.sock), kept[3];
    for (uint64_t i = 0; i < 3; i++)
        kept[i] = ring_stream_run(fd, 10 + i, batch, 4, 0);
    assert_true(kept[0] >= 0 && kept[1] >= 0);
    assert_int_equal(kept[2], -1);
    assert_int_equal(harness_metric(port, declined), 1);
    assert_int_equal(harness_metric(port, "permd_stream_ring_bytes"), RING_TOTAL);
    assert_int_equal(harness_metric(port, "permd_stream_ring_fds"), 0); /* permd let go of both */
    int again = ring_stream_run(fd, 13, batch, 4, 1); /* done with them: a ring again, counted alone */
    assert_true(again >= 0);
    assert_int_equal(harness_metric(port, "permd_stream_ring_bytes"), RING_MAX);
    assert_int_equal(harness_metric(port, declined), 1);
    close(again);
    close(kept[0]);
    close(kept[1]);
    close(fd);
    assert_int_equal(harness_finish(&own), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_matches_core),
        cmocka_unit_test(test_ring_declined),
        cmocka_unit_test(test_ring_raw_protocol),
        cmocka_unit_test(test_ring_kept_by_client),
        cmocka_unit_test(test_ring_total),
        cmocka_unit_test(test_ring_no_leaks),
        cmocka_unit_test(test_close_frees_an_open_stream),
        cmocka_unit_test(test_ring_descriptors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
