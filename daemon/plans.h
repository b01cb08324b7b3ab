/* The plan cache: per-epoch tables of sharded datasets and per-seed plans of mixtures, built off the loop and shared. */
#ifndef PD_PLANS_H
#define PD_PLANS_H

#include <stdint.h>

#include "core/mixture.h"
#include "core/shards.h"
#include "cpu/gen.h"
#include "daemon/mixdef.h"
#include "daemon/registry.h"

typedef struct pd_plans pd_plans;
typedef struct pd_plan pd_plan;

/* Plans whose tables take at most max_bytes together: those cached, those requests and streams use,
 * and those being built (one plan alone may take more); of those nobody uses, at most max_entries are
 * kept listed (least recently used go first; the most recent is always kept). gen (copied): the kernels
 * that build a sharded plan's shard order (pd_gen_shard_plan_init: the backend's, which pd_gen_init set
 * up; a bad one would fail every sharded build) and those of mixture cursors' sharded components (their
 * planner: a bad gen there falls back to the core's loop), or NULL for the core's loop; the plan is the
 * same. PD_ENOMEM. */
int pd_plans_open(unsigned max_entries, uint64_t max_bytes, const pd_gen *gen, pd_plans **out);
void pd_plans_close(pd_plans *c);
/* Bytes of plan tables alive or admitted to be built, and of mixture cursors kept with their plans
 * (permd_plan_bytes): at most max_bytes, or one plan and one cursor of it. */
uint64_t pd_plans_bytes(pd_plans *c);
/* Of pd_plans_bytes, those of mixtures' cursors (pd_plan_cursor_take), idle or taken. */
uint64_t pd_plans_cursor_bytes(pd_plans *c);
/* max_bytes (plan_cache_bytes), for messages. */
uint64_t pd_plans_limit(const pd_plans *c);
/* Let go of the plans of layouts the registry dropped (pd_layout.retired: a dataset deleted): cached
 * ones nobody uses are freed now, with the layout they keep (layout_memory); one a stream waiting for
 * credit holds loses its table; one in use is freed when its last holder releases it. Call after a
 * delete. */
void pd_plans_drop_retired(pd_plans *c);
/* The same for a mixture: let go of the plans of mixture `name` made from any definition but keep
 * (the one the registry holds now; NULL after a delete). Plans are keyed by their definition's
 * identity, so no request finds those of a definition replaced (stages appended) or deleted: cached,
 * they only keep its plan tables, the definition and its components' layouts until evicted. Call
 * after a delete or a put that changed the definition. */
void pd_plans_drop_mixture(pd_plans *c, const char *name, const pd_mixdef *keep);

/* A reference to the sharded plan of (layout, seed, epoch, window, lanes). Cheap and never builds,
 * so the event loop may call it. A plan not cached is admitted within max_bytes: plans nobody uses
 * (cached, or held only by idle holders) give way, least recently used first; PD_EBUSY when the
 * plans in use leave no room. PD_ENOMEM. */
int pd_plans_get(pd_plans *c, pd_layout *layout, uint64_t seed, uint64_t epoch, uint64_t window, uint64_t lanes,
                 pd_plan **out);

/* A reference to the plan of a stored mixture definition for seed; layouts[j] is component j's
 * layout (NULL when flat; the plan takes its own references). Never builds. PD_EBUSY as
 * pd_plans_get; PD_ENOMEM. */
int pd_plans_get_mix(pd_plans *c, pd_mixdef *def, pd_layout *const *layouts, uint64_t seed, pd_plan **out);

/* The holder of a reference will not use the plan until pd_plan_wake (a stream waiting for credit):
 * meanwhile its table may be freed to admit another plan, and is built again when next used. The
 * reference keeps the plan's identity (its key and id). */
void pd_plan_idle(pd_plan *p);
/* The idle holder uses its plan again. PD_EBUSY (still idle) when its table was freed and the plans
 * in use leave no room to build it again; 0 otherwise (the table may still need building: pd_plan_ready). */
int pd_plan_wake(pd_plan *p);
/* Drop an idle holder's reference (pd_plan_release is for references in use). NULL is a no-op. */
void pd_plan_release_idle(pd_plan *p);

/* A number no other plan of this process has (1, 2, ...): lets the GPU
 * backend keep device copies of plans without ever serving a stale one. */
uint64_t pd_plan_id(const pd_plan *p);

/* Whether the plan's table is built (then pd_plan_use never blocks). */
int pd_plan_ready(pd_plan *p);

/* The plan, built first if needed (O(S), or O(C·stages) for a mixture: call off the event loop
 * unless pd_plan_ready). Concurrent callers build once. PD_ENOMEM, PD_EINVAL; PD_EINVAL too for
 * the other kind of plan. */
int pd_plan_use(pd_plan *p, const pd_shard_plan **out);
int pd_plan_use_mix(pd_plan *p, const pd_mix **out);

/* A cursor over mixture plan p (built first if needed, as pd_plan_use_mix), for one thread until
 * pd_plan_cursor_give: one given back earlier, with the component orders it built (a sharded
 * component's O(S_j) plan for each of its last two component epochs), else a new one. A new cursor's
 * bytes (pd_mix_cursor_bytes) are admitted within max_bytes as a plan's are, idle cursors giving way
 * first: PD_EBUSY when other plans in use leave no room. With p alone past max_bytes, it has one cursor:
 * a second take waits until it is given back (held for one generation), so requests on a plan larger
 * than the cache run one at a time. PD_ENOMEM; PD_EINVAL for a sharded epoch's plan. The caller must hold a
 * reference it uses (not idle). The event loop calls pd_plan_cursor_try_take instead. */
int pd_plan_cursor_take(pd_plan *p, pd_mix_cursor **out);
/* The same without blocking, for the event loop: 0 with *out NULL where pd_plan_cursor_take would build p's
 * table, start a cursor whose sharded components' orders are still to build, or wait for p's one cursor. The
 * loop asks pd_plan_cursor_warm first, but another thread may take the idle cursor before the loop does: the
 * loop used to wait for that thread's generation, or start a cursor and build its orders itself. An idle cursor
 * is given as it is, whatever orders it lacks. */
int pd_plan_cursor_try_take(pd_plan *p, pd_mix_cursor **out);
/* Give the cursor back to p (before releasing p): kept for the next request while p has few idle ones
 * and stays cached (freed with p, with its table, or when the cache needs room), else freed. NULL is a
 * no-op. */
void pd_plan_cursor_give(pd_plan *p, pd_mix_cursor *cur);
/* Whether a cursor taken now would build no component order from scratch: p has no sharded component,
 * or an idle cursor (which may still need other component epochs). Cheap: the event loop may call it. */
int pd_plan_cursor_warm(pd_plan *p);
/* What the cursor pd_plan_cursor_take would give now must build to read mixture epoch E's positions
 * [first, last]: the shards of the sharded component orders it lacks (pd_mix_cursor_missing). A last
 * past L (pad mode's wrapped read, at last mod L) counts positions from that one to L − 1. 0 without
 * sharded components; UINT64_MAX when p is not built or has no idle cursor, or out of memory. Never
 * builds; O(C + B·log C), under the plans' lock only to read the idle cursor: the event loop may call it. */
uint64_t pd_plan_cursor_missing(pd_plan *p, uint64_t epoch, uint64_t first, uint64_t last);

pd_plan *pd_plan_ref(pd_plan *p);
void pd_plan_release(pd_plan *p);

#endif
