/* Bump allocator behind protobuf-c unpacking; what does not fit goes to heap blocks freed on reset. */
#include "proto/arena.h"

#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"

#define PD_ARENA_ALIGN 16u
#define PD_ARENA_BLOCK (64u << 10) /* shared block for small allocations past buf */

/* Header of a heap block: a shared one, or one allocation larger than a quarter of PD_ARENA_BLOCK. */
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
    a->spill = NULL;
    a->spill_left = 0;
    a->spilled = 0;
    a->held = 0;
    a->limit = 0;
    a->over = 0;
    a->kept = 0;
    a->gauge = NULL;
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
    if (a->gauge && a->held)
        atomic_fetch_sub(a->gauge, a->held);
    a->big = NULL;
    a->used = 0;
    a->spill = NULL;
    a->spill_left = 0;
    a->spilled = 0;
    a->held = 0;
    a->over = 0;
    a->kept = 0;
}

void pd_arena_free(pd_arena *a)
{
    pd_arena_reset(a);
    free(a->buf);
    a->buf = NULL;
    a->cap = 0;
}

void pd_arena_set_limit(pd_arena *a, size_t limit)
{
    a->limit = limit;
}

int pd_arena_over(const pd_arena *a)
{
    return a->over;
}

void pd_arena_keep(pd_arena *a)
{
    a->kept = 1;
}

int pd_arena_kept(const pd_arena *a)
{
    return a->kept;
}

void pd_arena_count_in(pd_arena *a, _Atomic uint64_t *gauge)
{
    a->gauge = gauge;
}

/* A heap block with room for n bytes after its header, linked into the arena and counted. */
static unsigned char *pd_arena_block(pd_arena *a, size_t n)
{
    if (n > SIZE_MAX - sizeof(pd_arena_big))
        return NULL;
    pd_arena_big *b = malloc(sizeof *b + n);
    if (!b)
        return NULL;
    b->next = a->big;
    a->big = b;
    a->held += sizeof *b + n;
    if (a->gauge)
        atomic_fetch_add(a->gauge, sizeof *b + n);
    return (unsigned char *)b->pad;
}

void *pd_arena_alloc(pd_arena *a, size_t n)
{
    size_t at = (a->used + PD_ARENA_ALIGN - 1) & ~(size_t)(PD_ARENA_ALIGN - 1);
    if (n <= a->cap && at <= a->cap - n) {
        if (a->limit && (at + n > a->limit || a->spilled > a->limit - (at + n))) {
            a->over = 1;
            return NULL;
        }
        a->used = at + n;
        return a->buf + at;
    }
    if (n > SIZE_MAX - PD_ARENA_ALIGN)
        return NULL;
    size_t need = (n + PD_ARENA_ALIGN - 1) & ~(size_t)(PD_ARENA_ALIGN - 1);
    if (a->limit && (need > a->limit || a->used + a->spilled > a->limit - need)) {
        a->over = 1;
        return NULL;
    }
    unsigned char *p;
    if (need <= a->spill_left) {
        p = a->spill;
    } else if (need > PD_ARENA_BLOCK / 4) { /* its own block: the shared one keeps its room */
        if (!(p = pd_arena_block(a, need)))
            return NULL;
        a->spilled += need;
        return p;
    } else {
        if (!(p = pd_arena_block(a, PD_ARENA_BLOCK)))
            return NULL;
        a->spill_left = PD_ARENA_BLOCK;
    }
    a->spill = p + need;
    a->spill_left -= need;
    a->spilled += need;
    return p;
}
