/* NCCL delivery vs the socket path, permd on GPU 0 and trainers on GPUs 1..M, same run: ids/s that land in the
 * trainers' GPU memory. usage: nccl SOCKET [--quick] [--trainers M]; prints a markdown table (bench/nccl.sh writes
 * the page). One trainer runs in this process; M > 1 trainers are child processes started together. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/permd.h"
#include "gpu/permd_gpu.h"
#include "gpu/permd_nccl.h"

#define DIE(...)                                                                                        \
    do {                                                                                                \
        fprintf(stderr, __VA_ARGS__);                                                                   \
        fputc('\n', stderr);                                                                            \
        exit(1);                                                                                        \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const uint64_t n = UINT64_C(1) << 32; /* u32 ids */
static const uint64_t pieces[] = {1 << 16, 1 << 20, 1 << 22, 1 << 24};
#define PIECES (sizeof pieces / sizeof pieces[0])

static void put_byte(int fd)
{
    if (write(fd, "x", 1) != 1)
        _exit(1);
}

static void get_bytes(int fd, uint32_t count)
{
    char b;
    for (uint32_t i = 0; i < count; i++)
        if (read(fd, &b, 1) != 1)
            DIE("a trainer died");
}

/* Trainer `i` of `members` (a child on GPU 1 + i): for each size and path, one warm-up request, then it says
 * ready, waits for the parent's go, makes `reps` requests of its rank's slice and says done. */
static void trainer(const char *sock, uint32_t members, uint32_t i, int reps, int ready, int go, int done)
{
    permd_client *c;
    permd_nccl *g;
    pd_gpu *gpu;
    void *dev;
    const int device = 1 + (int)i;
    if (permd_connect_unix(sock, &c) || permd_nccl_join(c, "bench-group", members, device, 60000, &g))
        DIE("trainer %u: join: %s", i, permd_last_error(c));
    uint32_t rank, nranks;
    permd_nccl_rank(g, &rank, &nranks);
    if (pd_gpu_open(device, &gpu) || pd_gpu_alloc(gpu, pieces[PIECES - 1] * 4, &dev))
        DIE("trainer %u: gpu", i);
    uint32_t *host = malloc((size_t)pieces[PIECES - 1] * 4);
    permd_slice s = {.dataset = "bench", .seed = 3, .epoch = 2, .world = members, .rank = rank - 1,
                     .mode = PERMD_MODE_EXACT};
    for (size_t k = 0; k < PIECES; k++)
        for (int path = 0; path < 2; path++)
            for (int r = -1; r < reps; r++) {
                if (r == 0) {
                    put_byte(ready);
                    get_bytes(go, 1);
                }
                uint64_t got, next;
                uint32_t width;
                int rc = path == 0 ? permd_nccl_recv(g, &s, pieces[k], 4, dev, NULL, &got, &width, &next)
                                   : permd_fetch_u32(c, &s, pieces[k], host, &got, &next) ||
                                         pd_gpu_copy_to_device(gpu, dev, host, got * 4);
                if (rc || got != pieces[k])
                    DIE("trainer %u: request: %s", i, permd_last_error(c));
                s.offset = next;
                if (r == reps - 1)
                    put_byte(done);
            }
    permd_nccl_leave(g);
    pd_gpu_free(gpu, dev);
    pd_gpu_close(gpu);
    permd_close(c);
    free(host);
    _exit(0);
}

/* M trainers at once, each its own rank's slice: the ids/s that land in all of their GPUs together. CUDA is
 * never initialized in this process, which forks them. */
static int many(const char *sock, uint32_t members, int reps)
{
    int ready[2], done[2], go[8];
    pid_t pid[8];
    if (members > 8 || pipe(ready) || pipe(done))
        DIE("at most 8 trainers");
    for (uint32_t i = 0; i < members; i++) {
        int p[2];
        if (pipe(p))
            DIE("pipe");
        if ((pid[i] = fork()) == 0) {
            close(p[1]);
            trainer(sock, members, i, reps, ready[1], p[0], done[1]);
        }
        close(p[0]);
        go[i] = p[1];
    }
    close(ready[1]);
    close(done[1]);
    printf("permd on GPU 0, %u trainers on GPUs 1-%u, started together; each receives its rank's slice (rank r of %u)\n"
           "of a dataset of 2^32 samples (u32 ids) in consecutive pieces, %d per size after one warm-up; the rate is\n"
           "all trainers' ids over the time from the first request to the last reply.\n\n",
           members, members, members, reps);
    printf("| trainers | ids per request | NCCL delivery, all trainers (G ids/s) | socket Fetch + host-to-device copy, all "
           "trainers (G ids/s) | NCCL / socket |\n");
    printf("|---|---|---|---|---|\n");
    for (size_t k = 0; k < PIECES; k++) {
        double rate[2];
        for (int path = 0; path < 2; path++) {
            get_bytes(ready[0], members);
            double t0 = now();
            for (uint32_t i = 0; i < members; i++)
                put_byte(go[i]);
            get_bytes(done[0], members);
            rate[path] = (double)members * reps * pieces[k] / (now() - t0) / 1e9;
        }
        printf("| %u | %llu | %.2f | %.2f | %.1f× |\n", members, (unsigned long long)pieces[k], rate[0], rate[1],
               rate[0] / rate[1]);
        fflush(stdout);
    }
    int fails = 0;
    for (uint32_t i = 0; i < members; i++) {
        int st;
        waitpid(pid[i], &st, 0);
        fails += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        DIE("usage: nccl SOCKET [--quick] [--trainers M]");
    int quick = 0;
    uint32_t members = 1;
    for (int a = 2; a < argc; a++) {
        if (!strcmp(argv[a], "--quick"))
            quick = 1;
        else if (!strcmp(argv[a], "--trainers") && a + 1 < argc)
            members = (uint32_t)atoi(argv[++a]);
        else
            DIE("unknown argument %s", argv[a]);
    }
    const int reps = quick ? 3 : 10, device = 1;
    if (members > 1) {
        permd_client *c;
        if (permd_connect_unix(argv[1], &c) || permd_put_dataset(c, "bench", n, NULL, NULL))
            DIE("connect/put: %s", permd_last_error(c));
        permd_close(c);
        return many(argv[1], members, reps);
    }
    permd_client *c;
    permd_nccl *g;
    pd_gpu *gpu;
    void *dev;
    if (permd_connect_unix(argv[1], &c) || permd_put_dataset(c, "bench", n, NULL, NULL))
        DIE("connect/put: %s", permd_last_error(c));
    if (permd_nccl_join(c, "bench", 1, device, 60000, &g))
        DIE("join: %s", permd_last_error(c));
    if (pd_gpu_open(device, &gpu) || pd_gpu_alloc(gpu, (UINT64_C(1) << 24) * 4, &dev))
        DIE("gpu");
    uint32_t *host = malloc((size_t)(UINT64_C(1) << 24) * 4);
    printf("permd on GPU 0, the trainer on GPU %d (%s); dataset of 2^32 samples (u32 ids), rank 0 of 1,\n"
           "consecutive pieces, %d per size after one warm-up; every id ends in the trainer's GPU memory.\n\n",
           device, pd_gpu_describe(gpu), reps);
    printf("| ids per request | NCCL delivery (G ids/s) | socket Fetch + host-to-device copy (G ids/s) | NCCL / socket |\n");
    printf("|---|---|---|---|\n");
    permd_slice s = {.dataset = "bench", .seed = 3, .epoch = 1, .world = 1, .mode = PERMD_MODE_EXACT};
    for (size_t i = 0; i < PIECES; i++) {
        uint64_t piece = pieces[i], got, next;
        uint32_t width;
        double best[2] = {0, 0};
        for (int path = 0; path < 2; path++) {
            for (int r = 0; r <= reps; r++) {
                double t0 = now();
                if (path == 0) {
                    if (permd_nccl_recv(g, &s, piece, 4, dev, NULL, &got, &width, &next))
                        DIE("recv: %s", permd_last_error(c));
                } else {
                    if (permd_fetch_u32(c, &s, piece, host, &got, &next) ||
                        pd_gpu_copy_to_device(gpu, dev, host, got * 4))
                        DIE("fetch: %s", permd_last_error(c));
                }
                double rate = got / (now() - t0) / 1e9;
                if (got != piece)
                    DIE("short read");
                s.offset = next;
                if (r > 0 && rate > best[path]) /* r = 0 warms up */
                    best[path] = rate;
            }
        }
        printf("| %llu | %.2f | %.2f | %.1f× |\n", (unsigned long long)piece, best[0], best[1], best[0] / best[1]);
        fflush(stdout);
    }
    permd_nccl_leave(g);
    pd_gpu_free(gpu, dev);
    pd_gpu_close(gpu);
    permd_close(c);
    free(host);
    return 0;
}
