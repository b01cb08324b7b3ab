/* A bump allocator for protobuf-c unpacking: one reset per request instead of a free per field. */
#ifndef PD_ARENA_H
#define PD_ARENA_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#ifdef __cplusplus
extern "C" {
#endif

/* `pb` is the allocator to hand to protobuf-c; it must stay the first
 * member so callbacks can recover the arena from its allocator_data. */
typedef struct pd_arena {
    ProtobufCAllocator pb;
    unsigned char *buf;
    size_t cap, used;
    void *big; /* allocations that did not fit, freed by reset */
} pd_arena;

/* PD_ENOMEM */
int pd_arena_init(pd_arena *a, size_t cap);
void pd_arena_free(pd_arena *a);
/* Forget every allocation (frees the oversized ones). */
void pd_arena_reset(pd_arena *a);
void *pd_arena_alloc(pd_arena *a, size_t n);

#ifdef __cplusplus
}
#endif

#endif
