/* Helpers shared by the mixture tests: a mixture plan and its cursor with their own memory. */
#ifndef PERMD_TEST_MIX_UTIL_H
#define PERMD_TEST_MIX_UTIL_H

#include <stdlib.h>

#include "core/mixture.h"

typedef struct owned_mix {
    pd_mix mix;
    pd_mix_cursor cur;
    pd_mix_component *comps;
    uint64_t **layouts; /* sharded components' natural offsets */
    uint64_t ncomp;
    void *mem, *cmem;
} owned_mix;

/* Components as sizes (flat), or, where shards[j] is set, sharded over nshards[j] shards with windows[j]
 * and lanes[j]. Returns pd_mix_init's code (the cursor is set up only when it is 0). */
static inline int mix_make_ex(owned_mix *o, uint64_t seed, const uint64_t *sizes, const uint64_t *const *shards,
                              const uint64_t *nshards, const uint64_t *windows, const uint64_t *lanes, uint64_t ncomp,
                              uint64_t length, uint64_t block, const uint64_t *starts, const uint32_t *weights,
                              uint64_t nstages)
{
    o->ncomp = ncomp;
    o->comps = calloc(ncomp ? ncomp : 1, sizeof *o->comps);
    o->layouts = calloc(ncomp ? ncomp : 1, sizeof *o->layouts);
    o->mem = o->cmem = NULL;
    for (uint64_t j = 0; j < ncomp; j++) {
        o->comps[j].size = sizes[j];
        if (shards && shards[j]) {
            o->layouts[j] = malloc((nshards[j] + 1) * sizeof(uint64_t));
            if (pd_shard_layout_build(shards[j], nshards[j], o->layouts[j]) != 0)
                return PD_EINVAL;
            o->comps[j].shard_start = o->layouts[j];
            o->comps[j].shards = nshards[j];
            o->comps[j].window = windows[j];
            o->comps[j].lanes = lanes[j];
        }
    }
    size_t bytes = pd_mix_bytes(ncomp, nstages);
    o->mem = malloc(bytes ? bytes : 8);
    int rc = pd_mix_init(&o->mix, seed, o->comps, ncomp, length, block, starts, weights, nstages, o->mem, bytes);
    if (rc == 0) {
        size_t cbytes = pd_mix_cursor_bytes(&o->mix);
        o->cmem = malloc(cbytes);
        rc = pd_mix_cursor_init(&o->cur, &o->mix, o->cmem, cbytes);
    }
    return rc;
}

static inline int mix_make(owned_mix *o, uint64_t seed, const uint64_t *sizes, uint64_t ncomp, uint64_t length,
                           uint64_t block, const uint64_t *starts, const uint32_t *weights, uint64_t nstages)
{
    return mix_make_ex(o, seed, sizes, NULL, NULL, NULL, NULL, ncomp, length, block, starts, weights, nstages);
}

static inline void mix_free(owned_mix *o)
{
    for (uint64_t j = 0; j < o->ncomp; j++)
        free(o->layouts[j]);
    free(o->layouts);
    free(o->comps);
    free(o->mem);
    free(o->cmem);
}

#endif
