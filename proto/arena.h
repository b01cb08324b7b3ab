/* A bump allocator for protobuf-c unpacking: one reset per request instead of a free per field. */
#ifndef PD_ARENA_H
#define PD_ARENA_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#ifdef __cplusplus
extern "C" {
#endif

/* `pb` is the allocator to hand to protobuf-c; it must stay the first
 * member so callbacks can recover the arena from its allocator_data.
 * What does not fit buf goes to blocks of the heap (small allocations
 * share 64 KiB blocks: protobuf-c makes one per field, and a request of
 * many small fields would otherwise cost a malloc each), all freed by reset. */
typedef struct pd_arena {
    ProtobufCAllocator pb;
    unsigned char *buf;
    size_t cap, used;
    void *big;                 /* blocks from the heap, newest first */
    unsigned char *spill;      /* free room in the newest shared block */
    size_t spill_left;
    size_t spilled;            /* bytes handed out from blocks since the last reset */
    size_t held;               /* bytes of the blocks themselves (what the arena costs beyond buf) */
    size_t limit;              /* 0: none; else used + spilled may not pass it (pd_arena_set_limit) */
    int over;                  /* an allocation was refused for the limit since the last reset */
    int kept;                  /* pd_arena_keep: a job still uses what was handed out (until reset) */
    _Atomic uint64_t *gauge;   /* NULL, or a counter that held is added to (pd_arena_count_in) */
} pd_arena;

/* PD_ENOMEM */
int pd_arena_init(pd_arena *a, size_t cap);
void pd_arena_free(pd_arena *a);
/* Forget every allocation (frees the blocks; the limit stays). */
void pd_arena_reset(pd_arena *a);
void *pd_arena_alloc(pd_arena *a, size_t n);

/* Refuse allocations (NULL, and pd_arena_over says so) once the bytes handed out since the last reset
 * would pass limit; 0 lifts it. A decoder's input can ask for many times its size (each empty field of
 * two bytes costs protobuf-c tens): a limit around an unpack bounds what one request may cost. */
void pd_arena_set_limit(pd_arena *a, size_t limit);
/* Whether an allocation was refused for the limit since the last reset. */
int pd_arena_over(const pd_arena *a);
/* What was handed out stays in use past the current request (a worker job reads it): its owner resets
 * the arena when the job is done, and pd_arena_kept says so meanwhile. */
void pd_arena_keep(pd_arena *a);
int pd_arena_kept(const pd_arena *a);
/* Keep *gauge up to date with the heap the arena holds beyond buf (add as blocks come, subtract at
 * reset): a process-wide view of what requests hold. Call before the first allocation. */
void pd_arena_count_in(pd_arena *a, _Atomic uint64_t *gauge);

#ifdef __cplusplus
}
#endif

#endif
