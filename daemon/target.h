/* Request resolution: a dataset name and a rank's slice, checked against the registry and made ready to generate. */
#ifndef PD_TARGET_H
#define PD_TARGET_H

#include <stddef.h>
#include <stdint.h>

#include "core/rank.h"
#include "daemon/backend.h"
#include "daemon/metrics.h"
#include "daemon/plans.h"
#include "daemon/registry.h"

/* What a request names: the fields of the protocol's Slice, already decoded. */
typedef struct pd_slice_req {
    const char *dataset;
    uint64_t seed, epoch;
    uint32_t world, rank;
    int mode;         /* a pd_mode, or -1 when the request's mode was not one */
    uint64_t offset;
    uint64_t window;  /* sharded datasets: K and G overrides; 0 = the dataset's */
    uint32_t lanes;
    int locations;    /* (shard, offset) pairs instead of ids */
    uint64_t definition; /* the definition hash the client read (pd_dataset_definition, pd_mixdef_hash); 0:
                          * unchecked */
} pd_slice_req;

/* A slice checked against the registry and ready to generate. */
typedef struct pd_target {
    pd_dataset ds;          /* a mixture's name, and its size N (global ids are below it) */
    pd_perm perm;           /* flat datasets */
    struct pd_plan *plan;   /* sharded datasets and mixtures: a reference (pd_target_release) */
    int mixture;            /* plan is a mixture's: slice positions are those of mixture epoch `epoch` */
    uint64_t epoch;
    pd_slice slice;
    unsigned width;         /* bytes per item on the wire: 4 or 8 (ids), 16 (locations) */
    uint64_t epoch_len;     /* T */
    uint64_t remaining;     /* ids the rank has left after slice.offset */
    uint64_t definition;    /* the resolved definition's hash, for a stream's later checks (pd_target_current) */
    pd_counter *orders_built; /* a mixture's: where its cursors count the sharded orders they build (a loop's
                               * mix_orders_built), or NULL; set by the caller after resolve */
} pd_target;

/* Resolve q: a dataset, or a mixture (docs/mixtures.md). PD_EINVAL, PD_ENOTFOUND or PD_ECONFLICT
 * (a mixture's component deleted or re-created), or PD_EINTERNAL (out of memory), with a message
 * for the client in msg. Never blocks: a sharded dataset's or a mixture's plan is referenced, not
 * built. */
int pd_target_resolve(pd_registry *reg, pd_plans *plans, const pd_slice_req *q, pd_target *t, char *msg,
                      size_t len);

/* A sharded dataset's plan for (seed, epoch, K, G) from the cache (0 = the dataset's K and G).
 * PD_ENOTFOUND or PD_EINTERNAL with a message. */
int pd_target_plan(pd_registry *reg, pd_plans *plans, const pd_dataset *d, uint64_t seed, uint64_t epoch,
                   uint64_t window, uint32_t lanes, pd_plan **out, char *msg, size_t len);

/* A stored mixture's plan for seed, its components checked against the registry (PD_ENOTFOUND or
 * PD_ECONFLICT with a message when one changed). */
int pd_target_mix_plan(pd_registry *reg, pd_plans *plans, pd_mixdef *def, uint64_t seed, pd_plan **out, char *msg,
                       size_t len);

/* 0 while t's name still has the definition t resolved; else PD_ENOTFOUND (gone) or PD_ECONFLICT
 * (re-defined) with a message: a stream asks before each batch. */
int pd_target_current(pd_registry *reg, const pd_target *t, char *msg, size_t len);

/* Drop what resolve acquired (the plan reference). */
void pd_target_release(pd_target *t);

/* What count of t's ids from t->slice on costs to generate, in flat ids (the unit of the inline budget):
 * a mixture's cost several each (cpu/mix.h's PD_MIX_COST_*), others one; a mixture's besides, each
 * sharded component order its warm cursor lacks for them, S_j (pd_plan_cursor_missing: a component epoch
 * crossed at a million shards would hold the loop ~60 ms). */
uint64_t pd_target_cost(const pd_target *t, uint64_t count);

/* Whether generating for t may block on building its plan, or a mixture's on building a sharded
 * component's order from scratch (no warm cursor, pd_plan_cursor_warm): then the pool, not the loop. */
int pd_target_may_block(const pd_target *t);

/* The rank's next min(count, remaining) items of slice (t's dataset, epoch and layout) into out, as
 * the wire wants them. Builds a sharded plan if needed: off the loop unless !pd_target_may_block. A
 * mixture's ids come through a cursor kept with its plan (pd_plan_cursor_take): PD_EBUSY when the
 * plan cache has no room for a new one (pd_target_error words it). */
int pd_target_generate(pd_backend *b, const pd_target *t, const pd_slice *slice, uint64_t count, void *out,
                       uint64_t *written);

/* pd_target_generate on the event loop: the same, except that where it would block (a mixture's idle cursor
 * taken by another thread since pd_target_may_block said one was idle: pd_plan_cursor_try_take; or, defensively,
 * a table not built) it writes nothing, sets *deferred and returns 0, and the caller hands the work to a worker.
 * Not closed: a worker may give back, between pd_target_cost and the take, an idle cursor that lacks an order the
 * estimate counted as built; the loop then builds that one order itself (a narrow window, once). */
int pd_target_generate_now(pd_backend *b, const pd_target *t, const pd_slice *slice, uint64_t count, void *out,
                           uint64_t *written, int *deferred);

/* The wire code and message for a generation that failed with rc (pd_target_generate's): PD_EBUSY is
 * "plan memory is full", anything else PD_EINTERNAL "generation failed". Returns the code. */
int pd_target_error(pd_plans *plans, int rc, char *msg, size_t len);

/* The offset that continues after `got` more ids of the rank (clamped to T). */
uint64_t pd_target_next_offset(const pd_target *t, uint64_t offset, uint64_t got);

#endif
