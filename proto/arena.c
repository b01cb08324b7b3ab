/* Bump allocator behind protobuf-c unpacking; oversized requests fall back to a freed-on-reset list. */
#include "proto/arena.h"

#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"

#define PD_ARENA_ALIGN 16u

/* Header of an allocation that did not fit the arena. */
typedef struct pd_arena_big {
    struct pd_arena_big *next;
    max_align_t pad[]; /* keeps the payload aligned */
} pd_arena_big;

static void *pd_arena_pb_alloc(void *data, size_t n)
{
    return pd_arena_alloc(data, n);
}

static void pd_arena_pb_free(void *data, void *ptr)
{
    (void)data; /* everything goes at the next reset */
    (void)ptr;
}

int pd_arena_init(pd_arena *a, size_t cap)
{
    a->buf = malloc(cap);
    if (!a->buf)
        return PD_ENOMEM;
    a->cap = cap;
    a->used = 0;
    a->big = NULL;
    a->pb.alloc = pd_arena_pb_alloc;
    a->pb.free = pd_arena_pb_free;
    a->pb.allocator_data = a;
    return 0;
}

void pd_arena_reset(pd_arena *a)
{
    pd_arena_big *b = a->big;
    while (b) {
        pd_arena_big *next = b->next;
        free(b);
        b = next;
    }
    a->big = NULL;
    a->used = 0;
}

void pd_arena_free(pd_arena *a)
{
    pd_arena_reset(a);
    free(a->buf);
    a->buf = NULL;
    a->cap = 0;
}

void *pd_arena_alloc(pd_arena *a, size_t n)
{
    size_t at = (a->used + PD_ARENA_ALIGN - 1) & ~(size_t)(PD_ARENA_ALIGN - 1);
    if (n <= a->cap && at <= a->cap - n) {
        a->used = at + n;
        return a->buf + at;
    }
    if (n > SIZE_MAX - sizeof(pd_arena_big))
        return NULL;
    pd_arena_big *b = malloc(sizeof *b + n);
    if (!b)
        return NULL;
    b->next = a->big;
    a->big = b;
    return b->pad;
}
