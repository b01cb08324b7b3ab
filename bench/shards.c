/* Sharded ids vs flat σ per backend, in one run: the core's scalar loop, the CPU kernels (scalar, AVX2, AVX-512) and the GPU; plan build (core vs kernel) and upload.
 * usage: shards [--quick] [--gpu-only]; prints markdown tables (bench/shards.sh writes bench/results/shards.md). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/shards.h"
#include "cpu/gen.h"
#include "shard_sizes.h"
#include "timing.h"
#ifdef PERMD_BENCH_GPU
#include "gpu/permd_gpu.h"
#endif

/* What each table row varies: the window, the lanes, and the world the reading rank is in. */
typedef struct shape {
    uint64_t window, lanes;
    uint32_t world;
} shape;

static const shape shapes[] = {
    {1, 1, 8}, {1, 8, 8}, {8, 1, 8}, {8, 8, 8}, {64, 1, 8}, {64, 8, 8},
    {8, 8, 1}, /* one reader of every lane (a whole-epoch export): lanes interleave in the output */
    {8, 3, 8}, /* lanes that do not divide the world */
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

/* A layout: shard sizes, their natural offsets and the plan's memory. */
typedef struct layout {
    const char *name;
    uint64_t shards, n;
    uint64_t *start;
    void *mem;
} layout;

/* ---- CPU: the core's loop and each kernel, flat and sharded, one thread */

#define MAX_BACKENDS 5
typedef struct job {
    const pd_gen *gen; /* NULL: the core */
    const pd_shard_plan *plan;
    const pd_perm *perm;
    pd_slice slice;
    uint64_t count;
    uint32_t *out;
} job;

static void run_sharded(void *p)
{
    job *j = p;
    uint64_t got;
    int rc = j->gen ? pd_gen_shard_slice_fill_u32(j->gen, j->plan, &j->slice, j->count, j->out, &got)
                    : pd_shard_slice_fill_u32(j->plan, &j->slice, j->count, j->out, &got);
    if (rc || got != j->count)
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

typedef struct plan_build {
    const layout *l;
    shape sh;
    const pd_gen *gen; /* NULL: the core's loop */
} plan_build;

static void run_build(void *p)
{
    plan_build *b = p;
    pd_shard_plan plan;
    int rc = b->gen ? pd_gen_shard_plan_init(b->gen, &plan, b->l->start, b->l->shards, 1, 2, b->sh.window,
                                             b->sh.lanes, b->l->mem, pd_shard_plan_bytes(b->l->shards))
                    : pd_shard_plan_init(&plan, b->l->start, b->l->shards, 1, 2, b->sh.window, b->sh.lanes,
                                         b->l->mem, pd_shard_plan_bytes(b->l->shards));
    if (rc)
        abort();
}

/* σ's cycle walk costs 2^b / n evaluations per id on average over [0, n) (Kac's lemma), b the
 * domain's width: the work of a sharded epoch's windows against flat σ's over N, per id. */
static double walk_ratio(const pd_shard_plan *plan)
{
    double sharded = 0;
    for (uint64_t w = 0; w < plan->windows; w++) {
        pd_perm tau;
        pd__window_perm(plan, w, &tau);
        sharded += tau.n >= 2 ? (double)(UINT64_C(1) << tau.bits) : 0; /* n = 1: σ = 0, no walk */
    }
    pd_perm flat;
    pd_perm_init(&flat, 1, 2, PD_STREAM_SAMPLES, plan->n);
    return sharded / (double)(UINT64_C(1) << flat.bits);
}

static void cpu_table(const layout *l, uint64_t count)
{
    static const pd_isa isas[] = {PD_ISA_SCALAR, PD_ISA_AVX2, PD_ISA_AVX512};
    pd_gen gens[MAX_BACKENDS];
    const pd_gen *backends[MAX_BACKENDS] = {NULL};
    const char *names[MAX_BACKENDS] = {"core"};
    size_t nb = 1;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        if (pd_gen_init(&gens[nb], isas[i]) == PD_OK) {
            backends[nb] = &gens[nb];
            names[nb++] = pd_isa_name(isas[i]);
        }
    if (nb > 1 && gens[nb - 1].vbmi) { /* what AVX-512 CPUs without VBMI (Skylake-X, Cascade Lake) run */
        gens[nb] = gens[nb - 1];
        gens[nb].vbmi = 0;
        const char *f_only = getenv("PERMD_BENCH_AVX512F"); /* 1: PD_SMALL's 32-bit lanes, not BW's words */
        if (f_only && strcmp(f_only, "1") == 0)
            gens[nb].bw = 0;
        backends[nb] = &gens[nb];
        names[nb++] = "avx512 no-VBMI";
    }
    job j = {.count = count, .out = malloc(count * sizeof *j.out)};
    if (!j.out)
        abort();
    pd_perm perm;
    pd_perm_init(&perm, 1, 2, PD_STREAM_SAMPLES, l->n);
    j.perm = &perm;

    printf("\n### %s: N = %llu in %llu shards; %llu ids (u32) of one rank, exact mode, one thread\n\n", l->name,
           (unsigned long long)l->n, (unsigned long long)l->shards, (unsigned long long)count);
    printf("| order | K | G | W | σ work ÷ flat |");
    for (size_t b = 0; b < nb; b++)
        printf(" %s M ids/s | ÷ flat |", names[b]);
    printf("\n|---|---|---|---|---|");
    for (size_t b = 0; b < nb; b++)
        printf("---|---|");
    printf("\n");

    j.slice = (pd_slice){.world = 8, .rank = 3, .mode = PD_MODE_EXACT};
    printf("| flat σ | | | 8 | 1.00 |");
    for (size_t b = 0; b < nb; b++) {
        j.gen = backends[b];
        printf(" %.1f | 1.00 |", count / median_seconds(run_flat, &j) / 1e6);
    }
    printf("\n");
    fflush(stdout);
    for (size_t s = 0; s < NSHAPES; s++) {
        pd_shard_plan plan;
        if (pd_shard_plan_init(&plan, l->start, l->shards, 1, 2, shapes[s].window, shapes[s].lanes, l->mem,
                               pd_shard_plan_bytes(l->shards)))
            abort();
        j.plan = &plan;
        j.slice = (pd_slice){.world = shapes[s].world, .rank = 3 % shapes[s].world, .mode = PD_MODE_EXACT};
        printf("| sharded | %llu | %llu | %u | %.2f |", (unsigned long long)shapes[s].window,
               (unsigned long long)shapes[s].lanes, shapes[s].world, walk_ratio(&plan));
        for (size_t b = 0; b < nb; b++) { /* flat σ again, alternately with this row: the ratio's own */
            job f = j;
            f.gen = j.gen = backends[b];
            f.slice = (pd_slice){.world = 8, .rank = 3, .mode = PD_MODE_EXACT};
            double tf, ts;
            median_seconds_paired(run_flat, &f, run_sharded, &j, &tf, &ts);
            printf(" %.1f | %.2f |", count / ts / 1e6, tf / ts);
            fflush(stdout);
        }
        printf("\n");
        fflush(stdout);
    }
    free(j.out);
}

#ifdef PERMD_BENCH_GPU
/* ---- GPU: the same slices into device memory (the generation alone, as bench/gpu_gen measures it) */

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

static void gpu_table(pd_gpu *gpu, const layout *l, uint64_t count)
{
    gpu_job g = {.gpu = gpu, .count = count};
    pd_perm perm;
    pd_perm_init(&perm, 1, 2, PD_STREAM_SAMPLES, l->n);
    g.perm = &perm;
    if (pd_gpu_alloc(gpu, count * 4, &g.dev))
        abort();
    printf("\n### %s on the GPU: %llu ids (u32) of one rank into device memory\n\n", l->name,
           (unsigned long long)count);
    printf("| order | K | G | W | σ work ÷ flat | G ids/s | ÷ flat (GPU) | plan upload |\n"
           "|---|---|---|---|---|---|---|---|\n");
    g.slice = (pd_slice){.world = 8, .rank = 3, .mode = PD_MODE_EXACT};
    const double flat = count / median_seconds(run_gpu, &g) / 1e9;
    printf("| flat σ | | | 8 | 1.00 | %.2f | 1.00 | |\n", flat);
    for (size_t s = 0; s < NSHAPES; s++) {
        pd_shard_plan plan;
        pd_gpu_plan *dp;
        if (pd_shard_plan_init(&plan, l->start, l->shards, 1, 2, shapes[s].window, shapes[s].lanes, l->mem,
                               pd_shard_plan_bytes(l->shards)))
            abort();
        const double t0 = bench_now();
        if (pd_gpu_plan_upload(gpu, &plan, &dp))
            abort();
        const double upload = bench_now() - t0;
        g.plan = dp;
        g.slice = (pd_slice){.world = shapes[s].world, .rank = 3 % shapes[s].world, .mode = PD_MODE_EXACT};
        const double ids = count / median_seconds(run_gpu, &g) / 1e9;
        printf("| sharded | %llu | %llu | %u | %.2f | %.2f | %.2f | %.2f ms |\n", (unsigned long long)shapes[s].window,
               (unsigned long long)shapes[s].lanes, shapes[s].world, walk_ratio(&plan), ids, ids / flat, upload * 1e3);
        fflush(stdout);
        pd_gpu_plan_free(gpu, dp);
        g.plan = NULL;
    }
    pd_gpu_free(gpu, g.dev);
}
#endif

/* Shards of `per` samples each (uniform), or of per/2 .. 3·per/2 - 1 at random (uneven: windows
 * of any size, so τ_w cycle-walks as flat σ over N does). */
static void layout_init(layout *l, const char *name, uint64_t shards, uint64_t per, int uneven)
{
    uint64_t *sizes = malloc(shards * sizeof *sizes);
    l->name = name;
    l->shards = shards;
    l->start = malloc((shards + 1) * sizeof *l->start);
    l->mem = malloc(pd_shard_plan_bytes(shards));
    if (!sizes || !l->start || !l->mem)
        abort();
    bench_shard_sizes(sizes, shards, uneven ? per / 2 : per, uneven ? per : 0);
    if (pd_shard_layout_build(sizes, shards, l->start))
        abort();
    l->n = l->start[shards];
    free(sizes);
}

/* A plan's build (once per epoch, before its first id) at the shard counts sharding is for: the core's loop
 * against pd_gen_shard_plan_init on the fastest kernel here, timed alternately. */
static void build_table(int quick)
{
    pd_gen g;
    if (pd_gen_init(&g, PD_ISA_AUTO))
        abort();
    printf("\n### Plan build: uneven shards of 512-1535, window 8, one lane; one thread\n\n"
           "| shards | core ms | %s ms | core / %s |\n|---:|---:|---:|---:|\n", pd_isa_name(g.isa),
           pd_isa_name(g.isa));
    for (unsigned k = 16; k <= (quick ? 16u : 24u); k += 4) {
        layout l;
        layout_init(&l, "", UINT64_C(1) << k, 1024, 1);
        plan_build core = {.l = &l, .sh = {.window = 8, .lanes = 1}}, fast = core;
        fast.gen = &g;
        double tc, tg;
        median_seconds_paired(run_build, &core, run_build, &fast, &tc, &tg);
        printf("| 2^%u | %.2f | %.2f | %.1f |\n", k, tc * 1e3, tg * 1e3, tc / tg);
        fflush(stdout);
        free(l.start);
        free(l.mem);
    }
}

int main(int argc, char **argv)
{
    int quick = 0, cpu = 1; /* --gpu-only: the GPU tables alone (the CPU ones take minutes on a slow host) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--gpu-only")) {
            cpu = 0;
        } else {
            fprintf(stderr, "usage: shards [--quick] [--gpu-only]\n");
            return 2;
        }
    }
    const uint64_t shards = quick ? 4096 : 65536;
    layout layouts[2];
    layout_init(&layouts[0], "Uniform shards of 1024", shards, 1024, 0);
    layout_init(&layouts[1], "Uneven shards of 512-1535", shards, 1024, 1);
    printf("Rank 3 of W reads N/8 ids from the start of its slice (rank 0 when W = 1). K: shards per window,\n"
           "G: lanes. \"÷ flat\": sharded ids/s over flat σ's ids/s on the same backend (flat: rank 3 of 8, the\n"
           "same count, σ over the same N), the two timed alternately for each cell (medians of 5 each) so\n"
           "that a drift in the machine's speed moves both; the flat σ row is a separate, earlier timing.\n"
           "\"σ work ÷ flat\": the cycle walk's evaluations per id over the windows (each τ_w walks 2^b/m_w\n"
           "times on average) over flat σ's on N: σ alone would make \"÷ flat\" about 1 / that.\n");
    for (int i = 0; cpu && i < 2; i++)
        cpu_table(&layouts[i], layouts[i].n / 8);
    if (cpu)
        build_table(quick);
#ifdef PERMD_BENCH_GPU
    pd_gpu *gpu;
    int devices = 0;
    pd_gpu_device_count(&devices);
    if (devices == 0 || pd_gpu_open(0, &gpu)) {
        printf("\nGPU: none here (the GPU rows need a CUDA device)\n");
    } else {
        printf("\nGPU: %s\n", pd_gpu_describe(gpu));
        for (int i = 0; i < 2; i++)
            gpu_table(gpu, &layouts[i], layouts[i].n / 8);
        /* At the scale sharding is for (N ≈ 10^9): a rank's request of N/8 ids keeps every warp busy for
         * ~40 segments instead of ~3, so the last tiles' imbalance, which the tables above pay, fades. */
        for (int i = 0; !quick && i < 2; i++) {
            layout big;
            layout_init(&big, i ? "Uneven shards of 512-1535, N ≈ 2^30" : "Uniform shards of 1024, N = 2^30",
                        UINT64_C(1) << 20, 1024, i);
            gpu_table(gpu, &big, big.n / 8);
            free(big.start);
            free(big.mem);
        }
        pd_gpu_close(gpu);
    }
#endif
    for (int i = 0; i < 2; i++) {
        free(layouts[i].start);
        free(layouts[i].mem);
    }
    return 0;
}
