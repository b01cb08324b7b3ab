/* NCCL delivery vs the socket path, one trainer on GPU 1 and permd on GPU 0, same run: ids/s that land in the
 * trainer's GPU memory. usage: nccl SOCKET [--quick]; prints a markdown table (bench/nccl.sh writes the page). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int main(int argc, char **argv)
{
    if (argc < 2)
        DIE("usage: nccl SOCKET [--quick]");
    int quick = argc > 2 && !strcmp(argv[2], "--quick");
    const uint64_t n = UINT64_C(1) << 32; /* u32 ids */
    const uint64_t pieces[] = {1 << 16, 1 << 20, 1 << 22, 1 << 24};
    const int reps = quick ? 3 : 10, device = 1;
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
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        uint64_t piece = pieces[i], got, next;
        uint32_t width;
        double best[2] = {0, 0};
        for (int path = 0; path < 2; path++) {
            for (int r = 0; r <= reps; r++) {
                double t0 = now();
                if (path == 0) {
                    if (permd_nccl_recv(g, &s, piece, dev, NULL, &got, &width, &next))
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
