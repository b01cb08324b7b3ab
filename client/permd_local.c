/* libpermd's offline half: spec-v1 permutations, rank slices, sharded plans, mixtures and digests computed in-process. */
#include "client/permd.h"

#include <stdlib.h>

#include "cpu/gen.h"
#include "cpu/mix.h"
#include "core/error.h"
#include "core/digest.h"
#include "core/mixture.h"
#include "core/rank.h"
#include "core/shards.h"

static int pd_local_mode(int mode, pd_mode *out)
{
    if (mode < PD_MODE_PAD || mode > PD_MODE_EXACT)
        return PD_EINVAL;
    *out = (pd_mode)mode;
    return 0;
}

int permd_perm_fill(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t start, uint64_t count, void *out,
                    unsigned width)
{
    pd_perm p;
    int rc = pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n);
    if (rc)
        return rc;
    if (count && !out)
        return PD_EINVAL;
    pd_gen g;
    if ((rc = pd_gen_init(&g, PD_ISA_AUTO)))
        return rc;
    if (width == 4)
        return pd_gen_fill_u32(&g, &p, start, count, out);
    if (width == 8)
        return pd_gen_fill_u64(&g, &p, start, count, out);
    return PD_EINVAL;
}

int permd_perm_inverse(uint64_t seed, uint64_t epoch, uint64_t n, const uint64_t *samples, uint64_t count,
                       uint64_t *positions)
{
    pd_perm p;
    int rc = pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n);
    if (rc)
        return rc;
    if (count && (!samples || !positions))
        return PD_EINVAL;
    for (uint64_t i = 0; i < count; i++) /* all or nothing: check before writing */
        if (samples[i] >= n)
            return PD_ERANGE;
    for (uint64_t i = 0; i < count; i++)
        positions[i] = pd_perm_inv(&p, samples[i]);
    return 0;
}

int permd_epoch_length(uint64_t n, uint32_t world, int mode, uint64_t *len)
{
    pd_mode m;
    if (!len || pd_local_mode(mode, &m))
        return PD_EINVAL;
    return pd_epoch_length(n, world, m, len);
}

int permd_rank_remaining(uint64_t n, uint32_t world, uint32_t rank, int mode, uint64_t offset, uint64_t *count)
{
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    if (!count || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    return pd_slice_remaining(n, &s, count);
}

int permd_rank_fill(uint64_t seed, uint64_t epoch, uint64_t n, uint32_t world, uint32_t rank, int mode,
                    uint64_t offset, uint64_t count, void *out, unsigned width, uint64_t *written)
{
    pd_perm p;
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    int rc = pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n);
    if (rc)
        return rc;
    if (!written || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    pd_gen g;
    if ((rc = pd_gen_init(&g, PD_ISA_AUTO)))
        return rc;
    if (width == 4)
        return pd_gen_slice_fill_u32(&g, &p, &s, count, out, written);
    if (width == 8)
        return pd_gen_slice_fill_u64(&g, &p, &s, count, out, written);
    return PD_EINVAL;
}

/* ---- Digests ---------------------------------------------------------------------------- */

static void pd_local_digest_out(const pd_digest *d, permd_digest *out)
{
    out->count = d->count;
    out->sum = d->sum;
    out->hash = d->hash;
}

int permd_rank_digest(uint64_t seed, uint64_t epoch, uint64_t n, uint32_t world, uint32_t rank, int mode,
                      uint64_t offset, permd_digest *out)
{
    pd_perm p;
    pd_digest d;
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    int rc = pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n);
    if (rc)
        return rc;
    if (!out || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    if ((rc = pd_digest_slice(&p, &s, &d)))
        return rc;
    pd_local_digest_out(&d, out);
    return 0;
}

int permd_digest_add(permd_digest *d, const void *ids, uint64_t count, unsigned width)
{
    if (!d || (count && !ids) || (width != 4 && width != 8))
        return PD_EINVAL;
    pd_digest acc = {d->count, d->sum, d->hash};
    for (uint64_t i = 0; i < count; i++)
        pd_digest_add(&acc, width == 4 ? ((const uint32_t *)ids)[i] : ((const uint64_t *)ids)[i]);
    pd_local_digest_out(&acc, d);
    return 0;
}

/* ---- Sharded plans ------------------------------------------------------------------------ */

struct permd_plan {
    pd_shard_plan plan; /* points into start and mem */
    uint64_t *start;
    void *mem;
};

uint64_t permd_shard_layout_hash(const uint64_t *sizes, uint64_t nshards)
{
    return sizes || !nshards ? pd_shard_layout_hash(sizes, nshards) : 0;
}

int permd_plan_new(uint64_t seed, uint64_t epoch, const uint64_t *sizes, uint64_t nshards, uint64_t window,
                   uint32_t lanes, permd_plan **out)
{
    if (!out || !sizes || nshards == 0 || nshards > PD_SHARDS_MAX)
        return PD_EINVAL;
    permd_plan *p = calloc(1, sizeof *p);
    if (!p)
        return PD_ENOMEM;
    size_t bytes = pd_shard_plan_bytes(nshards);
    p->start = malloc((size_t)(nshards + 1) * sizeof *p->start);
    p->mem = malloc(bytes);
    pd_gen g;
    int rc = !p->start || !p->mem ? PD_ENOMEM : pd_shard_layout_build(sizes, nshards, p->start);
    if (rc == 0 && (rc = pd_gen_init(&g, PD_ISA_AUTO)) == 0) /* π on the SIMD kernel: 2^20 shards in ms */
        rc = pd_gen_shard_plan_init(&g, &p->plan, p->start, nshards, seed, epoch, window ? window : 8,
                                    lanes ? lanes : 1, p->mem, bytes);
    if (rc) {
        permd_plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void permd_plan_free(permd_plan *p)
{
    if (!p)
        return;
    free(p->start);
    free(p->mem);
    free(p);
}

uint64_t permd_plan_size(const permd_plan *p)
{
    return p ? p->plan.n : 0;
}

int permd_plan_locate(const permd_plan *p, uint64_t position, uint64_t *sample, uint64_t *shard, uint64_t *offset)
{
    pd_shard_loc loc;
    if (!p)
        return PD_EINVAL;
    int rc = pd_shard_locate(&p->plan, position, &loc);
    if (rc)
        return rc;
    if (sample)
        *sample = loc.sample;
    if (shard)
        *shard = loc.shard;
    if (offset)
        *offset = loc.offset;
    return 0;
}

int permd_plan_position(const permd_plan *p, uint64_t sample, uint64_t *position)
{
    return p ? pd_shard_position(&p->plan, sample, position) : PD_EINVAL;
}

int permd_plan_rank_fill(const permd_plan *p, uint32_t world, uint32_t rank, int mode, uint64_t offset,
                         uint64_t count, void *out, unsigned width, uint64_t *written)
{
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    if (!p || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    pd_gen g;
    int rc = pd_gen_init(&g, PD_ISA_AUTO);
    if (rc)
        return rc;
    if (width == 4)
        return pd_gen_shard_slice_fill_u32(&g, &p->plan, &s, count, out, written);
    if (width == 8)
        return pd_gen_shard_slice_fill_u64(&g, &p->plan, &s, count, out, written);
    return PD_EINVAL;
}

int permd_plan_rank_locations(const permd_plan *p, uint32_t world, uint32_t rank, int mode, uint64_t offset,
                              uint64_t count, uint64_t *shards, uint64_t *offsets, uint64_t *written)
{
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    pd_shard_loc locs[256];
    uint64_t left, got;
    if (!p || !written || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    int rc = pd_slice_remaining(p->plan.n, &s, &left);
    if (rc)
        return rc;
    if (count > left)
        count = left;
    for (uint64_t done = 0; done < count; done += got) {
        uint64_t want = count - done < 256 ? count - done : 256;
        if ((rc = pd_shard_slice_fill_locs(&p->plan, &s, want, locs, &got)))
            return rc;
        for (uint64_t i = 0; i < got; i++) {
            if (shards)
                shards[done + i] = locs[i].shard;
            if (offsets)
                offsets[done + i] = locs[i].offset;
        }
        s.offset += got * s.world; /* more follow, so this stays ≤ T */
    }
    *written = count;
    return 0;
}

int permd_plan_rank_digest(const permd_plan *p, uint32_t world, uint32_t rank, int mode, uint64_t offset,
                           permd_digest *out)
{
    pd_digest d;
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    if (!p || !out || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    int rc = pd_digest_shard_slice(&p->plan, &s, &d);
    if (rc == 0)
        pd_local_digest_out(&d, out);
    return rc;
}

/* ---- Mixtures ------------------------------------------------------------------------------ */

struct permd_mixture {
    pd_mix mix;          /* points into comps and mem */
    pd_mix_cursor cur;   /* points into cmem */
    pd_gen gen;
    pd_mix_component *comps;
    uint64_t **layouts;  /* sharded components' natural offsets */
    uint32_t ncomp;
    void *mem, *cmem;
};

void permd_mixture_free(permd_mixture *m)
{
    if (!m)
        return;
    for (uint32_t j = 0; m->layouts && j < m->ncomp; j++)
        free(m->layouts[j]);
    free(m->layouts);
    free(m->comps);
    free(m->mem);
    free(m->cmem);
    free(m);
}

/* Component j of the caller's description, its shard layout (if any) built into m->layouts[j]. */
static int pd_local_mix_component(permd_mixture *m, uint32_t j, const permd_mix_component *in)
{
    pd_mix_component *c = &m->comps[j];
    if (!in->shard_sizes) {
        c->size = in->size;
        return 0;
    }
    if (in->nshards == 0 || in->nshards > PD_SHARDS_MAX)
        return PD_EINVAL;
    if (!(m->layouts[j] = malloc((size_t)(in->nshards + 1) * sizeof(uint64_t))))
        return PD_ENOMEM;
    int rc = pd_shard_layout_build(in->shard_sizes, in->nshards, m->layouts[j]);
    if (rc)
        return rc;
    c->shard_start = m->layouts[j];
    c->shards = in->nshards;
    c->size = m->layouts[j][in->nshards];
    c->window = in->window ? in->window : 8;
    c->lanes = in->lanes ? in->lanes : 1;
    return 0;
}

int permd_mixture_new_ex(uint64_t seed, const permd_mix_component *components, uint32_t ncomponents,
                         uint64_t length, uint32_t block, const uint64_t *stage_starts, const uint32_t *weights,
                         uint32_t nstages, permd_mixture **out)
{
    const size_t bytes = pd_mix_bytes(ncomponents, nstages);
    if (!out || !components || !stage_starts || !weights || bytes == 0)
        return PD_EINVAL;
    permd_mixture *m = calloc(1, sizeof *m);
    if (!m)
        return PD_ENOMEM;
    m->ncomp = ncomponents;
    m->comps = calloc(ncomponents, sizeof *m->comps);
    m->layouts = calloc(ncomponents, sizeof *m->layouts);
    m->mem = malloc(bytes);
    int rc = !m->comps || !m->layouts || !m->mem ? PD_ENOMEM : 0;
    for (uint32_t j = 0; !rc && j < ncomponents; j++)
        rc = pd_local_mix_component(m, j, &components[j]);
    if (!rc)
        rc = pd_mix_init(&m->mix, seed, m->comps, ncomponents, length, block, stage_starts, weights, nstages, m->mem,
                         bytes);
    if (!rc) {
        const size_t cbytes = pd_mix_cursor_bytes(&m->mix);
        rc = (m->cmem = malloc(cbytes)) ? pd_mix_cursor_init(&m->cur, &m->mix, m->cmem, cbytes) : PD_ENOMEM;
    }
    if (!rc && !(rc = pd_gen_init(&m->gen, PD_ISA_AUTO)))
        pd_mix_cursor_set_planner(&m->cur, pd_gen_shard_planner, &m->gen); /* sharded orders on the SIMD kernel */
    if (rc) {
        permd_mixture_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int permd_mixture_new(uint64_t seed, const uint64_t *sizes, uint32_t ncomponents, uint64_t length, uint32_t block,
                      const uint64_t *stage_starts, const uint32_t *weights, uint32_t nstages, permd_mixture **out)
{
    if (!sizes || ncomponents == 0 || ncomponents > PD_MIX_COMPONENTS_MAX)
        return PD_EINVAL;
    permd_mix_component *comps = calloc(ncomponents, sizeof *comps);
    if (!comps)
        return PD_ENOMEM;
    for (uint32_t j = 0; j < ncomponents; j++)
        comps[j].size = sizes[j];
    int rc = permd_mixture_new_ex(seed, comps, ncomponents, length, block, stage_starts, weights, nstages, out);
    free(comps);
    return rc;
}

uint64_t permd_mixture_length(const permd_mixture *m)
{
    return m ? m->mix.length : 0;
}

uint64_t permd_mixture_size(const permd_mixture *m)
{
    return m ? m->mix.total : 0;
}

uint32_t permd_mixture_components(const permd_mixture *m)
{
    return m ? (uint32_t)m->mix.components : 0;
}

uint32_t permd_mixture_block(const permd_mixture *m)
{
    return m ? (uint32_t)m->mix.block : 0;
}

int permd_mixture_component_seed(const permd_mixture *m, uint32_t component, uint64_t *seed)
{
    if (!m || !seed)
        return PD_EINVAL;
    if (component >= m->mix.components)
        return PD_ERANGE;
    *seed = m->mix.comp_seed[component];
    return 0;
}

/* Run position epoch·L + offset for offset ≤ L; PD_EINVAL for an epoch that does not exist. */
static int pd_local_run_position(const pd_mix *m, uint64_t epoch, uint64_t offset, uint64_t *g)
{
    if (!pd_mix_epoch_ok(m, epoch))
        return PD_EINVAL;
    if (offset > m->length)
        return PD_ERANGE;
    *g = epoch * m->length + offset; /* ≤ 2^63 */
    return 0;
}

int permd_mixture_stage_start(const permd_mixture *m, uint64_t epoch, uint64_t offset, uint64_t *start)
{
    uint64_t g;
    if (!m || !start)
        return PD_EINVAL;
    int rc = pd_local_run_position(&m->mix, epoch, offset, &g);
    if (rc)
        return rc;
    g = (g + m->mix.block - 1) & ~(m->mix.block - 1);
    if (g >= PD_MIX_RUN_END)
        return PD_ERANGE;
    *start = g;
    return 0;
}

int permd_mixture_locate(permd_mixture *m, uint64_t epoch, uint64_t position, uint64_t *sample, uint32_t *component,
                         uint64_t *local, uint64_t *component_epoch)
{
    pd_mix_loc loc;
    if (!m)
        return PD_EINVAL;
    int rc = pd_mix_locate(&m->cur, epoch, position, &loc);
    if (rc)
        return rc;
    if (sample)
        *sample = loc.sample;
    if (component)
        *component = (uint32_t)loc.component;
    if (local)
        *local = loc.local;
    if (component_epoch)
        *component_epoch = loc.epoch;
    return 0;
}

int permd_mixture_position(permd_mixture *m, uint32_t component, uint64_t local, uint64_t component_epoch,
                           uint64_t *epoch, uint64_t *position)
{
    return m ? pd_mix_position(&m->cur, component, local, component_epoch, epoch, position) : PD_EINVAL;
}

int permd_mixture_drawn(const permd_mixture *m, uint64_t epoch, uint64_t position, uint64_t *drawn)
{
    uint64_t g;
    if (!m || !drawn)
        return PD_EINVAL;
    int rc = pd_local_run_position(&m->mix, epoch, position, &g);
    return rc ? rc : pd_mix_draws_before(&m->mix, g, drawn);
}

int permd_mixture_rank_fill(permd_mixture *m, uint64_t epoch, uint32_t world, uint32_t rank, int mode,
                            uint64_t offset, uint64_t count, void *out, unsigned width, uint64_t *written)
{
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    if (!m || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    if (width == 4)
        return pd_gen_mix_fill_u32(&m->gen, &m->cur, epoch, &s, count, out, written);
    if (width == 8)
        return pd_gen_mix_fill_u64(&m->gen, &m->cur, epoch, &s, count, out, written);
    return PD_EINVAL;
}

int permd_mixture_rank_locations(permd_mixture *m, uint64_t epoch, uint32_t world, uint32_t rank, int mode,
                                 uint64_t offset, uint64_t count, uint32_t *components, uint64_t *locals,
                                 uint64_t *component_epochs, uint64_t *written)
{
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    pd_mix_loc locs[256];
    uint64_t left, got;
    if (!m || !written || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    if (!pd_mix_epoch_ok(&m->mix, epoch))
        return PD_EINVAL;
    int rc = pd_slice_remaining(m->mix.length, &s, &left);
    if (rc)
        return rc;
    if (count > left)
        count = left;
    for (uint64_t done = 0; done < count; done += got) {
        if ((rc = pd_mix_slice_fill_locs(&m->cur, epoch, &s, count - done < 256 ? count - done : 256, locs, &got)))
            return rc;
        for (uint64_t i = 0; i < got; i++) {
            if (components)
                components[done + i] = (uint32_t)locs[i].component;
            if (locals)
                locals[done + i] = locs[i].local;
            if (component_epochs)
                component_epochs[done + i] = locs[i].epoch;
        }
        s.offset += got * s.world; /* more follow, so this stays ≤ T */
    }
    *written = count;
    return 0;
}

int permd_mixture_rank_digest(permd_mixture *m, uint64_t epoch, uint32_t world, uint32_t rank, int mode,
                              uint64_t offset, permd_digest *out)
{
    pd_digest d;
    pd_slice s = {.world = world, .rank = rank, .offset = offset};
    if (!m || !out || pd_local_mode(mode, &s.mode))
        return PD_EINVAL;
    int rc = pd_digest_mix_slice(&m->cur, epoch, &s, &d);
    if (rc == 0)
        pd_local_digest_out(&d, out);
    return rc;
}
