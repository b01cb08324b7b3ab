/* NCCL delivery on a machine with 2+ GPUs: permd on GPU 0, one trainer process per other GPU (3 at most).
 * Ids that arrive in trainers' GPU memory equal the core's; a trainer that stalls or dies aborts its group
 * with a typed error for the others, and permd keeps serving. Exits 77 (skipped) with fewer than 2 GPUs. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/permd.h"
#include "core/rank.h"
#include "gpu/permd_gpu.h"
#include "gpu/permd_nccl.h"
#include "integration/harness.h"

static harness h;

#define CHECK(cond, ...)                                                                                \
    do {                                                                                                \
        if (!(cond)) {                                                                                  \
            fprintf(stderr, "trainer %d: %s:%d: ", getpid(), __FILE__, __LINE__);                       \
            fprintf(stderr, __VA_ARGS__);                                                               \
            fputc('\n', stderr);                                                                        \
            _exit(1);                                                                                   \
        }                                                                                               \
    } while (0)

/* CUDA must not be initialized in the parent before fork: count devices in a child. */
static int gpu_count(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        pd_gpu_device_count(&n);
        _exit(n > 100 ? 100 : n);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

static const uint64_t N = 10000019; /* a prime: ranks differ in length, positions walk */

/* A trainer of `members`, receiving its whole exact-mode slice in pieces of `piece` ids. */
static void trainer(uint32_t members, int device, const char *group, uint64_t piece, int stall)
{
    permd_client *c;
    permd_nccl *g;
    pd_gpu *gpu;
    void *dev;
    CHECK(permd_connect_unix(h.sock, &c) == 0, "connect: %s", permd_last_error(NULL));
    CHECK(permd_nccl_join(c, group, members, device, 20000, &g) == 0, "join: %s", permd_last_error(c));
    CHECK(pd_gpu_open(device, &gpu) == 0, "open gpu %d", device);
    CHECK(pd_gpu_alloc(gpu, piece * 8, &dev) == 0, "alloc");
    uint64_t *host = malloc(piece * 8), *want = malloc(piece * 8);
    uint32_t rank, nranks;
    permd_nccl_rank(g, &rank, &nranks);
    pd_perm p;
    pd_perm_init(&p, 77, 5, 0, N);
    /* every member reads the slice of its NCCL rank - 1, so the group covers the epoch */
    permd_slice s = {.dataset = "big", .seed = 77, .epoch = 5, .world = members, .rank = rank - 1,
                     .mode = PERMD_MODE_EXACT};
    pd_slice ps = {.world = members, .rank = rank - 1, .mode = PD_MODE_EXACT};
    uint64_t total = 0;
    for (;;) {
        uint64_t got, next, want_n;
        uint32_t width;
        if (stall) { /* ask, then never receive: permd's send must time out and abort the group */
            CHECK(permd_group_deliver(c, group, &s, piece, 4, &got, &width, &next) == 0, "deliver");
            sleep((unsigned)stall);
            int rc = permd_group_deliver(c, group, &s, piece, 4, &got, &width, &next);
            CHECK(rc == PERMD_EUNAVAILABLE, "a stalled member should find its group aborted, got %d", rc);
            CHECK(strstr(permd_last_error(c), "aborted") != NULL, "message: %s", permd_last_error(c));
            _exit(0);
        }
        int rc = permd_nccl_recv(g, &s, piece, 4, dev, NULL, &got, &width, &next);
        CHECK(rc == 0, "recv: %d %s", rc, permd_last_error(c));
        if (got == 0)
            break;
        CHECK(width == 4, "width %u", width);
        CHECK(pd_gpu_copy_to_host(gpu, host, dev, got * width) == 0, "copy");
        CHECK(pd_slice_fill_u64(&p, &ps, piece, want, &want_n) == 0 && want_n == got, "core %llu vs %llu",
              (unsigned long long)want_n, (unsigned long long)got);
        for (uint64_t i = 0; i < got; i++)
            CHECK(((uint32_t *)host)[i] == want[i], "id %llu: %u vs %llu", (unsigned long long)(total + i),
                  ((uint32_t *)host)[i], (unsigned long long)want[i]);
        total += got;
        s.offset = ps.offset = next;
    }
    uint64_t expect;
    pd_slice_remaining(N, &(pd_slice){.world = members, .rank = rank - 1, .mode = PD_MODE_EXACT}, &expect);
    CHECK(total == expect, "received %llu ids, expected %llu", (unsigned long long)total, (unsigned long long)expect);
    CHECK(permd_nccl_leave(g) == 0, "leave: %s", permd_last_error(c));
    pd_gpu_free(gpu, dev);
    pd_gpu_close(gpu);
    permd_close(c);
    printf("trainer rank %u on GPU %d: %llu ids, all equal to the core\n", rank, device, (unsigned long long)total);
    fflush(stdout); /* _exit does not flush, and stdout is a pipe under ctest */
    _exit(0);
}

/* A member of a group whose other member is killed: it receives epoch after epoch until permd's abort reaches
 * it, as a typed error (the abort itself, or its in-flight receive failing or timing out), never a hang. */
static void survivor(uint32_t members, int device, const char *group)
{
    permd_client *c;
    permd_nccl *g;
    pd_gpu *gpu;
    void *dev;
    const uint64_t piece = 1 << 18;
    CHECK(permd_connect_unix(h.sock, &c) == 0, "connect: %s", permd_last_error(NULL));
    CHECK(permd_nccl_join(c, group, members, device, 20000, &g) == 0, "join: %s", permd_last_error(c));
    CHECK(pd_gpu_open(device, &gpu) == 0 && pd_gpu_alloc(gpu, piece * 4, &dev) == 0, "gpu %d", device);
    uint32_t rank, nranks;
    permd_nccl_rank(g, &rank, &nranks);
    permd_slice s = {.dataset = "big", .seed = 9, .world = members, .rank = rank - 1, .mode = PERMD_MODE_EXACT};
    uint64_t got, next, pieces = 0;
    uint32_t width;
    int rc;
    while ((rc = permd_nccl_recv(g, &s, piece, 4, dev, NULL, &got, &width, &next)) == 0) {
        pieces++;
        CHECK(pieces < 200000, "still receiving after %llu pieces: the group was never aborted",
              (unsigned long long)pieces);
        s.offset = got ? next : 0;
        s.epoch += got ? 0 : 1;
    }
    CHECK(rc == PERMD_EUNAVAILABLE || rc == PERMD_EIO || rc == PERMD_ETIMEDOUT, "rank %u: error %d (%s)", rank, rc,
          permd_last_error(c));
    permd_nccl_leave(g);
    pd_gpu_free(gpu, dev);
    pd_gpu_close(gpu);
    permd_close(c);
    printf("trainer rank %u on GPU %d: %llu pieces, then error %d after its peer died\n", rank, device,
           (unsigned long long)pieces, rc);
    fflush(stdout);
    _exit(0);
}

static pid_t spawn(uint32_t members, int device, const char *group, uint64_t piece, int stall)
{
    pid_t pid = fork();
    if (pid == 0)
        trainer(members, device, group, piece, stall);
    return pid;
}

static int wait_ok(pid_t pid)
{
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* A socket client still gets the core's ids. */
static int socket_serves(void)
{
    permd_client *c;
    uint64_t ids[16], k, want[16], w;
    pd_perm p;
    permd_slice s = {.dataset = "big", .seed = 1, .epoch = 2, .world = 3, .rank = 1, .mode = PERMD_MODE_PAD};
    pd_slice ps = {.world = 3, .rank = 1, .mode = PD_MODE_PAD};
    if (permd_connect_unix(h.sock, &c) || permd_fetch_u64(c, &s, 16, ids, &k, NULL))
        return 0;
    permd_close(c);
    pd_perm_init(&p, 1, 2, 0, N);
    pd_slice_fill_u64(&p, &ps, 16, want, &w);
    return k == 16 && !memcmp(ids, want, sizeof ids);
}

int main(void)
{
    int gpus = gpu_count(), fails = 0;
    if (gpus < 2) {
        printf("skipped: NCCL delivery needs 2 GPUs (permd and a trainer), this machine has %d\n", gpus);
        return 77;
    }
    uint32_t members = (uint32_t)(gpus - 1 < 3 ? gpus - 1 : 3);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    harness_init(&h);
    const char *extra[] = {"--gpu-device", "0", "--delivery-timeout-ms", "5000", "--max-count", "4194304", NULL};
    if (harness_start(&h, 0, extra, NULL)) {
        fprintf(stderr, "permd did not start\n");
        return 1;
    }
    permd_client *c;
    if (permd_connect_unix(h.sock, &c) || permd_put_dataset(c, "big", N, NULL, NULL))
        return 1;
    permd_close(c);

    /* 1. every member receives exactly the core's ids, in pieces */
    pid_t pids[3];
    for (uint32_t i = 0; i < members; i++)
        pids[i] = spawn(members, 1 + (int)i, "g1", 1 << 20, 0);
    for (uint32_t i = 0; i < members; i++)
        if (!wait_ok(pids[i])) {
            fprintf(stderr, "FAIL: trainer %u of group g1\n", i);
            fails++;
        }
    /* 2. a member that asks and never receives: permd aborts the group after delivery_timeout_ms */
    pid_t stall = spawn(1, 1, "g2", 1 << 16, 8);
    if (!wait_ok(stall)) {
        fprintf(stderr, "FAIL: stalled member\n");
        fails++;
    }
    /* 3. the only member killed: permd survives and forms the next group */
    pid_t victim = fork();
    if (victim == 0) {
        permd_client *vc;
        permd_nccl *g;
        if (permd_connect_unix(h.sock, &vc) || permd_nccl_join(vc, "g3", 1, 1, 20000, &g))
            _exit(1);
        pause(); /* killed here, without leaving */
        _exit(0);
    }
    sleep(3);
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    sleep(1);
    if (!harness_log_contains(&h, "group_abort group=g3")) {
        fprintf(stderr, "FAIL: permd did not abort group g3 after its member died\n");
        fails++;
    }
    /* 4. with 2+ members, one killed while the others receive: they get typed errors, permd serves on */
    if (members >= 2) {
        int ready[2];
        if (pipe(ready))
            return 1;
        pid_t killed = fork();
        if (killed == 0) {
            permd_client *kc;
            permd_nccl *g;
            close(ready[0]);
            if (permd_connect_unix(h.sock, &kc) || permd_nccl_join(kc, "g5", members, 1, 20000, &g))
                _exit(1);
            if (write(ready[1], "j", 1) != 1)
                _exit(1);
            pause(); /* killed here, a member that never leaves */
            _exit(0);
        }
        close(ready[1]);
        pid_t others[3];
        for (uint32_t i = 1; i < members; i++) {
            others[i] = fork();
            if (others[i] == 0)
                survivor(members, 1 + (int)i, "g5");
        }
        char byte;
        if (read(ready[0], &byte, 1) != 1)
            fprintf(stderr, "the member to be killed did not join\n");
        close(ready[0]);
        sleep(2); /* the others are receiving */
        kill(killed, SIGKILL);
        waitpid(killed, NULL, 0);
        for (uint32_t i = 1; i < members; i++)
            if (!wait_ok(others[i])) {
                fprintf(stderr, "FAIL: member %u of group g5 after its peer was killed\n", i);
                fails++;
            }
        if (!harness_log_contains(&h, "group_abort group=g5")) {
            fprintf(stderr, "FAIL: permd did not abort group g5 after a member died\n");
            fails++;
        }
    }
    /* 5. a member's own failures say why in permd_last_error (they said the connection's last message): a device
     * that does not exist, then a receive into host memory */
    pid_t own = fork();
    if (own == 0) {
        permd_client *oc;
        permd_nccl *g;
        uint64_t host[4], got;
        uint32_t width;
        CHECK(permd_connect_unix(h.sock, &oc) == 0, "connect: %s", permd_last_error(NULL));
        int rc = permd_nccl_join(oc, "g6", 1, 99, 20000, &g);
        CHECK(rc == PERMD_EUNAVAILABLE && strstr(permd_last_error(oc), "CUDA device 99"), "join on device 99: %d, %s",
              rc, permd_last_error(oc));
        CHECK(permd_nccl_join(oc, "g7", 1, 1, 20000, &g) == 0, "join: %s", permd_last_error(oc));
        permd_slice s = {.dataset = "big", .seed = 1, .world = 1, .mode = PERMD_MODE_EXACT};
        rc = permd_nccl_recv(g, &s, 4, 8, host, NULL, &got, &width, NULL);
        CHECK(rc == PERMD_EINVAL && strstr(permd_last_error(oc), "host memory"), "recv into host memory: %d, %s", rc,
              permd_last_error(oc));
        CHECK(permd_nccl_leave(g) == 0, "leave: %s", permd_last_error(oc));
        permd_close(oc);
        _exit(0);
    }
    if (!wait_ok(own)) {
        fprintf(stderr, "FAIL: a member's own errors\n");
        fails++;
    }
    if (!socket_serves()) {
        fprintf(stderr, "FAIL: socket clients not served after the faults\n");
        fails++;
    }
    pid_t again = spawn(1, 1, "g4", 1 << 22, 0);
    if (!wait_ok(again)) {
        fprintf(stderr, "FAIL: a new group after the faults\n");
        fails++;
    }
    int st = harness_stop(&h, SIGTERM);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "FAIL: permd did not exit cleanly (status %d)\n", st);
        fails++;
    }
    if (fails) {
        fprintf(stderr, "--- permd log ---\n");
        char cmd[256];
        snprintf(cmd, sizeof cmd, "tail -40 %s >&2", h.log);
        if (system(cmd)) {
        }
    }
    harness_cleanup(&h);
    printf("%s: %u trainers on %d GPUs\n", fails ? "FAILED" : "passed", members, gpus);
    return fails ? 1 : 0;
}
