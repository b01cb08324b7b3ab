/* Sharded plans vs flat permutations on the CPU, in one run: ids/s of a rank's slice, and plan build time.
 * usage: shards [--quick]; prints a markdown table (bench/shards.sh writes bench/results/shards.md). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/shards.h"
#include "cpu/gen.h"
#include "timing.h"
#ifdef PERMD_BENCH_GPU
#include "gpu/permd_gpu.h"
#endif

typedef struct job {
    const pd_shard_plan *plan;
    const pd_perm *perm;
    const pd_gen *gen;
    pd_slice slice;
    uint64_t count;
    uint32_t *out;
    /* plan build */
    const uint64_t *start;
    uint64_t shards, window, lanes;
    void *mem;
} job;

static void run_sharded(void *p)
{
    job *j = p;
    uint64_t got;
    if (pd_shard_slice_fill_u32(j->plan, &j->slice, j->count, j->out, &got) || got != j->count)
        abort();
}

static void run_flat(void *p)
{
    job *j = p;
    uint64_t got;
    int rc = j->gen ? pd_gen_slice_fill_u32(j->gen, j->perm, &j->slice, j->count, j->out, &got)
                    : pd_slice_fill_u32(j->perm, &j->slice, j->count, j->out, &got);
    if (rc || got != j->count)
        abort();
}

#ifdef PERMD_BENCH_GPU
/* The same slice on the GPU into device memory (the generation alone, as bench/gpu_gen measures it). */
typedef struct gpu_job {
    pd_gpu *gpu;
    const pd_gpu_plan *plan; /* NULL: flat σ */
    const pd_perm *perm;
    pd_slice slice;
    uint64_t count;
    void *dev;
} gpu_job;

static void run_gpu(void *p)
{
    gpu_job *j = p;
    uint64_t got;
    int rc = j->plan ? pd_gpu_shard_slice_fill(j->gpu, j->plan, &j->slice, j->count, j->dev, 4, &got)
                     : pd_gpu_slice_fill(j->gpu, j->perm, &j->slice, j->count, j->dev, 4, &got);
    if (rc || got != j->count || pd_gpu_sync(j->gpu))
        abort();
}

static void gpu_table(const uint64_t *start, uint64_t shards, uint64_t n, const pd_slice *slice, uint64_t count,
                      void *mem)
{
    pd_gpu *gpu;
    int devices = 0;
    pd_gpu_device_count(&devices);
    if (devices == 0 || pd_gpu_open(0, &gpu)) {
        printf("\nGPU: none here (the GPU rows need a CUDA device)\n");
        return;
    }
    gpu_job g = {.gpu = gpu, .slice = *slice, .count = count};
    pd_perm perm;
    pd_perm_init(&perm, 1, 2, 0, n);
    g.perm = &perm;
    if (pd_gpu_alloc(gpu, count * 4, &g.dev))
        abort();
    printf("\nGPU: %s; the same slice into device memory\n\n", pd_gpu_describe(gpu));
    printf("| order | K | G | G ids/s | vs flat (GPU) | plan upload |\n|---|---|---|---|---|---|\n");
    double flat = count / median_seconds(run_gpu, &g) / 1e9;
    printf("| flat σ | | | %.2f | 1.00 | |\n", flat);
    const uint64_t ks[] = {1, 8, 64};
    const uint64_t gs[] = {1, 8};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 2; b++) {
            pd_shard_plan plan;
            pd_gpu_plan *dp;
            if (pd_shard_plan_init(&plan, start, shards, 1, 2, ks[a], gs[b], mem, pd_shard_plan_bytes(shards)))
                abort();
            double t0 = bench_now();
            if (pd_gpu_plan_upload(gpu, &plan, &dp))
                abort();
            double upload = bench_now() - t0;
            g.plan = dp;
            double ids = count / median_seconds(run_gpu, &g) / 1e9;
            printf("| sharded | %llu | %llu | %.2f | %.2f | %.2f ms |\n", (unsigned long long)ks[a],
                   (unsigned long long)gs[b], ids, ids / flat, upload * 1e3);
            fflush(stdout);
            pd_gpu_plan_free(gpu, dp);
        }
    pd_gpu_free(gpu, g.dev);
    pd_gpu_close(gpu);
}
#endif

static void run_build(void *p)
{
    job *j = p;
    pd_shard_plan plan;
    if (pd_shard_plan_init(&plan, j->start, j->shards, 1, 2, j->window, j->lanes, j->mem,
                           pd_shard_plan_bytes(j->shards)))
        abort();
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    const uint64_t per_shard = 1024, shards = quick ? 4096 : 65536, n = shards * per_shard;
    const uint32_t world = 8;
    uint64_t *sizes = malloc(shards * sizeof *sizes), *start = malloc((shards + 1) * sizeof *start);
    void *mem = malloc(pd_shard_plan_bytes(shards));
    for (uint64_t s = 0; s < shards; s++)
        sizes[s] = per_shard;
    if (pd_shard_layout_build(sizes, shards, start))
        return 1;
    job j = {.slice = {.world = world, .rank = 3, .mode = PD_MODE_EXACT}, .count = n / world};
    j.out = malloc(j.count * sizeof *j.out);
    pd_perm perm;
    pd_perm_init(&perm, 1, 2, 0, n);
    pd_gen gen;
    pd_gen_init(&gen, PD_ISA_AUTO);

    printf("N = %llu samples in %llu shards of %llu; rank 3 of %u reads %llu ids (u32), exact mode; one thread\n\n",
           (unsigned long long)n, (unsigned long long)shards, (unsigned long long)per_shard, world,
           (unsigned long long)j.count);
    printf("| order | K | G | M ids/s | vs flat (core scalar) | vs flat (%s) | plan build |\n", pd_isa_name(gen.isa));
    printf("|---|---|---|---|---|---|---|\n");
    j.perm = &perm;
    double flat_scalar = j.count / median_seconds(run_flat, &j) / 1e6;
    j.gen = &gen;
    double flat_simd = j.count / median_seconds(run_flat, &j) / 1e6;
    printf("| flat σ, core scalar | | | %.1f | 1.00 | %.2f | |\n", flat_scalar, flat_scalar / flat_simd);
    printf("| flat σ, %s | | | %.1f | %.2f | 1.00 | |\n", pd_isa_name(gen.isa), flat_simd, flat_simd / flat_scalar);
    const uint64_t ks[] = {1, 8, 64};
    const uint64_t gs[] = {1, 8};
    for (size_t a = 0; a < 3; a++) {
        for (size_t b = 0; b < 2; b++) {
            pd_shard_plan plan;
            if (pd_shard_plan_init(&plan, start, shards, 1, 2, ks[a], gs[b], mem, pd_shard_plan_bytes(shards)))
                return 1;
            j.plan = &plan;
            j.start = start;
            j.shards = shards;
            j.window = ks[a];
            j.lanes = gs[b];
            j.mem = malloc(pd_shard_plan_bytes(shards));
            double ids = j.count / median_seconds(run_sharded, &j) / 1e6;
            double build = median_seconds(run_build, &j);
            free(j.mem);
            printf("| sharded | %llu | %llu | %.1f | %.2f | %.2f | %.1f ms |\n", (unsigned long long)ks[a],
                   (unsigned long long)gs[b], ids, ids / flat_scalar, ids / flat_simd, build * 1e3);
            fflush(stdout);
        }
    }
#ifdef PERMD_BENCH_GPU
    gpu_table(start, shards, n, &j.slice, j.count, mem);
#endif
    free(sizes);
    free(start);
    free(mem);
    free(j.out);
    return 0;
}
