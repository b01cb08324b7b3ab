/* libpermd's offline half: spec-v1 permutations, rank slices, sharded plans and digests computed in-process. */
#include "client/permd.h"

#include <stdlib.h>

#include "cpu/gen.h"
#include "core/error.h"
#include "core/digest.h"
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
    pd_gen_init(&g, PD_ISA_AUTO);
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
    pd_gen_init(&g, PD_ISA_AUTO);
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
    int rc = !p->start || !p->mem ? PD_ENOMEM : pd_shard_layout_build(sizes, nshards, p->start);
    if (rc == 0)
        rc = pd_shard_plan_init(&p->plan, p->start, nshards, seed, epoch, window ? window : 8, lanes ? lanes : 1,
                                p->mem, bytes);
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
    pd_gen_init(&g, PD_ISA_AUTO);
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
