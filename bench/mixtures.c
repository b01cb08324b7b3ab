/* Mixtures vs a flat dataset on the CPU, in one run: ids/s of a rank's slice per world size and block size,
 * time to the first batch and memory, and a sharded component's first batch with its order built by the core or
 * on the σ kernel. usage: mixtures [--quick]; prints markdown (bench/mixtures.sh). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mixture.h"
#include "cpu/mix.h"
#include "shard_sizes.h"
#include "timing.h"

#define C 4
static const uint64_t sizes[C] = {20000000, 17000000, 3000000, 10000000}; /* N = 5·10^7: σ walks (2^26/N = 1.34) */
static const uint32_t weights[C] = {4, 3, 2, 1};

typedef struct job {
    const pd_gen *gen; /* NULL: the core's scalar loop */
    pd_perm perm;      /* flat */
    pd_mix mix;
    pd_mix_cursor cur;
    pd_slice slice;
    uint64_t epoch, count;
    uint32_t *out;
    /* first batch */
    pd_mix_component comps[C];
    void *mem, *cmem;
    uint64_t block;
    /* the floor: each component's σ alone, over its share of the ids */
    pd_perm comp[C];
    uint64_t comp_count[C];
} job;

static void run_flat(void *p)
{
    job *j = p;
    uint64_t got;
    int rc = j->gen ? pd_gen_slice_fill_u32(j->gen, &j->perm, &j->slice, j->count, j->out, &got)
                    : pd_slice_fill_u32(&j->perm, &j->slice, j->count, j->out, &got);
    if (rc || got != j->count)
        abort();
}

static void run_mix(void *p)
{
    job *j = p;
    uint64_t got;
    int rc = j->gen ? pd_gen_mix_fill_u32(j->gen, &j->cur, j->epoch, &j->slice, j->count, j->out, &got)
                    : pd_mix_slice_fill_u32(&j->cur, j->epoch, &j->slice, j->count, j->out, &got);
    if (rc || got != j->count)
        abort();
    j->epoch++; /* a new mixture epoch each run: nothing is cached between runs but the component orders */
}

/* What any mixture of these components costs at least: each component's share of the ids (4:3:2:1) from its own σ,
 * consecutive positions on the flat kernel, with no block slots, no components or draws and no grouping. */
static void run_floor(void *p)
{
    job *j = p;
    const pd_slice whole = {.world = 1, .mode = PD_MODE_EXACT};
    uint64_t got, at = 0;
    for (int c = 0; c < C; c++) {
        if (pd_gen_slice_fill_u32(j->gen, &j->comp[c], &whole, j->comp_count[c], j->out + at, &got) ||
            got != j->comp_count[c])
            abort();
        at += got;
    }
}

static int mix_setup(job *j, uint64_t block)
{
    const uint64_t start = 0;
    size_t bytes = pd_mix_bytes(C, 1);
    if (pd_mix_init(&j->mix, 1, j->comps, C, 0, block, &start, weights, 1, j->mem, bytes))
        return -1;
    return pd_mix_cursor_init(&j->cur, &j->mix, j->cmem, pd_mix_cursor_bytes(&j->mix));
}

/* A new job's first 1024 ids: plan, cursor and one fill, as a trainer's first batch after a restart. */
static void run_first_batch(void *p)
{
    job *j = p;
    uint64_t got;
    if (mix_setup(j, j->block) || pd_gen_mix_fill_u32(j->gen, &j->cur, 7, &j->slice, 1024, j->out, &got))
        abort();
}

/* A first batch of a mixture with a sharded component: its order for the component epoch read (O(S), built into
 * a new cursor) dominates. One job per planner: the core's loop, or pd_gen_shard_planner (the daemon's cursors). */
typedef struct sharded_first {
    const pd_gen *gen;
    const pd_mix *mix;
    void *cmem;
    int planned;
    uint64_t epoch;
    uint32_t out[1024];
} sharded_first;

static void run_sharded_first(void *p)
{
    sharded_first *f = p;
    pd_mix_cursor cur;
    uint64_t got;
    const pd_slice s = {.world = 8, .rank = 0, .mode = PD_MODE_PAD};
    if (pd_mix_cursor_init(&cur, f->mix, f->cmem, pd_mix_cursor_bytes(f->mix)))
        abort();
    if (f->planned)
        pd_mix_cursor_set_planner(&cur, pd_gen_shard_planner, f->gen);
    if (pd_gen_mix_fill_u32(f->gen, &cur, f->epoch++, &s, 1024, f->out, &got) || got != 1024)
        abort();
}

static void sharded_first_table(const pd_gen *g, int quick)
{
    printf("\n| first batch (new cursor + 1024 ids, rank 0 of 8) of a mixture 3:1 of a sharded dataset (shards of "
           "512-1535, K = 8) and a flat one of 10^7 | µs, order by the core | µs, order on %s | core / %s |\n|---:|---:|---:|---:|\n",
           pd_isa_name(g->isa), pd_isa_name(g->isa));
    for (unsigned k = 16; k <= (quick ? 16u : 20u); k += 4) {
        const uint64_t S = UINT64_C(1) << k, one = 0;
        const uint32_t w[2] = {3, 1};
        uint64_t *shard_sizes = malloc(S * sizeof *shard_sizes), *start = malloc((S + 1) * sizeof *start);
        pd_mix mix;
        void *mem = malloc(pd_mix_bytes(2, 1));
        if (!shard_sizes || !start || !mem)
            abort();
        bench_shard_sizes(shard_sizes, S, 512, 1024);
        if (pd_shard_layout_build(shard_sizes, S, start))
            abort();
        const pd_mix_component comps[2] = {
            {.size = start[S], .shard_start = start, .shards = S, .window = 8, .lanes = 1}, {.size = 10000000}};
        if (pd_mix_init(&mix, 1, comps, 2, 0, 64, &one, w, 1, mem, pd_mix_bytes(2, 1)))
            abort();
        sharded_first core = {.gen = g, .mix = &mix, .cmem = malloc(pd_mix_cursor_bytes(&mix))}, fast = core;
        fast.planned = 1;
        fast.cmem = malloc(pd_mix_cursor_bytes(&mix));
        if (!core.cmem || !fast.cmem)
            abort();
        double tc, tf;
        median_seconds_paired(run_sharded_first, &core, run_sharded_first, &fast, &tc, &tf);
        printf("| 2^%u shards | %.0f | %.0f | %.1f |\n", k, tc * 1e6, tf * 1e6, tc / tf);
        fflush(stdout);
        free(core.cmem);
        free(fast.cmem);
        free(mem);
        free(start);
        free(shard_sizes);
    }
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    uint64_t n = 0;
    job j = {0};
    for (int c = 0; c < C; c++) {
        j.comps[c].size = sizes[c];
        n += sizes[c];
    }
    j.mem = malloc(pd_mix_bytes(C, 1));
    j.cmem = malloc(2 * C * sizeof(pd_mix_order));
    const uint64_t want = quick ? UINT64_C(1) << 20 : UINT64_C(1) << 23;
    j.out = malloc(want * sizeof *j.out);
    pd_perm_init(&j.perm, 1, 2, PD_STREAM_SAMPLES, n);
    pd_gen gen;
    if (pd_gen_init(&gen, PD_ISA_AUTO))
        abort();

    printf("%d flat components, N = %llu samples, weights 4:3:2:1; rank 3 of W reads min(%llu, N/W) ids (u32), "
           "exact mode, one thread; flat: σ over N\n\n",
           C, (unsigned long long)n, (unsigned long long)want);
    printf("| W | order | B | M ids/s | vs flat %s |\n|---:|---|---:|---:|---:|\n", pd_isa_name(gen.isa));
    const uint32_t worlds[] = {1, 4, 8, 64};
    const uint64_t blocks[] = {64, 256, 1024};
    for (size_t w = 0; w < 4; w++) {
        j.slice = (pd_slice){.world = worlds[w], .rank = worlds[w] > 3 ? 3 : 0, .mode = PD_MODE_EXACT};
        j.count = want < n / worlds[w] ? want : n / worlds[w]; /* what the rank has in an epoch */
        j.gen = &gen;
        const double flat = j.count / median_seconds(run_flat, &j) / 1e6;
        j.gen = NULL;
        const double flat_scalar = j.count / median_seconds(run_flat, &j) / 1e6;
        printf("| %u | flat σ, %s | | %.1f | 1.00 |\n", worlds[w], pd_isa_name(gen.isa), flat);
        printf("| %u | flat σ, core scalar | | %.1f | %.2f |\n", worlds[w], flat_scalar, flat_scalar / flat);
        for (size_t b = 0; b < 3; b++) {
            if (mix_setup(&j, blocks[b]))
                return 1;
            j.epoch = 0;
            j.gen = &gen;
            const double mix = j.count / median_seconds(run_mix, &j) / 1e6;
            printf("| %u | mixture, %s | %llu | %.1f | %.2f |\n", worlds[w], pd_isa_name(gen.isa),
                   (unsigned long long)blocks[b], mix, mix / flat);
            if (b == 0) {
                j.gen = NULL;
                const uint64_t keep = j.count;
                j.count /= 8; /* the scalar loop is slow */
                const double mix_scalar = j.count / median_seconds(run_mix, &j) / 1e6;
                j.count = keep;
                printf("| %u | mixture, core scalar | %llu | %.1f | %.2f |\n", worlds[w], (unsigned long long)blocks[b],
                       mix_scalar, mix_scalar / flat);
            }
            fflush(stdout);
        }
        if (gen.isa == PD_ISA_AVX512 && pd_cpu_has_isa(PD_ISA_AVX2)) { /* the AVX2 kernels on the same CPU */
            pd_gen avx2;
            pd_gen_init(&avx2, PD_ISA_AVX2);
            j.gen = &avx2;
            const double flat2 = j.count / median_seconds(run_flat, &j) / 1e6;
            if (mix_setup(&j, 64))
                return 1;
            j.epoch = 0;
            const double mix2 = j.count / median_seconds(run_mix, &j) / 1e6;
            printf("| %u | flat σ, avx2 | | %.1f | %.2f |\n", worlds[w], flat2, flat2 / flat);
            printf("| %u | mixture, avx2 | 64 | %.1f | %.2f (%.2f of flat avx2) |\n", worlds[w], mix2, mix2 / flat,
                   mix2 / flat2);
            fflush(stdout);
        }
    }

    /* The floor: one pair of rows, flat σ and the components' σ alone, timed alternately over the same count. */
    j.gen = &gen;
    j.slice = (pd_slice){.world = 1, .mode = PD_MODE_EXACT};
    j.count = want;
    uint64_t left = want;
    for (int c = 0; c < C; c++) {
        pd_perm_init(&j.comp[c], 100 + (uint64_t)c, 2, PD_STREAM_SAMPLES, sizes[c]);
        j.comp_count[c] = c == C - 1 ? left : want * weights[c] / 10;
        left -= j.comp_count[c];
    }
    double t_flat, t_floor;
    median_seconds_paired(run_flat, &j, run_floor, &j, &t_flat, &t_floor);
    printf("\n| the same %llu ids, %s, one thread | M ids/s | vs flat |\n|---|---:|---:|\n"
           "| flat σ over N | %.1f | 1.00 |\n"
           "| components' σ alone, each its 4:3:2:1 share (a floor for a mixture of these sizes) | %.1f | %.2f |\n",
           (unsigned long long)want, pd_isa_name(gen.isa), want / t_flat / 1e6, want / t_floor / 1e6,
           t_flat / t_floor);

    j.slice = (pd_slice){.world = 8, .rank = 3, .mode = PD_MODE_EXACT, .offset = 123456};
    printf("\n| first batch (new plan + cursor + 1024 ids, W = 8) | B | µs | plan bytes | cursor bytes |\n"
           "|---|---:|---:|---:|---:|\n");
    for (size_t b = 0; b < 3; b++) {
        j.block = blocks[b];
        const double t = median_seconds(run_first_batch, &j);
        printf("| mixture | %llu | %.1f | %zu | %zu |\n", (unsigned long long)blocks[b], t * 1e6, pd_mix_bytes(C, 1),
               pd_mix_cursor_bytes(&j.mix));
    }
    sharded_first_table(&gen, quick);
    free(j.mem);
    free(j.cmem);
    free(j.out);
    return 0;
}
