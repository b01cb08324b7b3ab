/* Shared-memory rings for streams: a sealed memfd that permd writes and a client on the same host only reads. */
#ifndef PD_RING_H
#define PD_RING_H

#include <stddef.h>
#include <stdint.h>

typedef struct pd_ring {
    uint8_t *base; /* permd's read-write mapping; NULL when there is no ring */
    size_t size;
    int fd; /* until sent to the client; -1 after */
} pd_ring;

#define PD_RING_NONE ((pd_ring){NULL, 0, -1})

/* A ring of size bytes (a whole number of pages), its memory allocated
 * up front, mapped here, and sealed so that the client can neither write
 * it, shrink it nor punch holes in it (a shrunk file would fault permd's
 * next write). PD_ENOMEM, PD_EIO. */
int pd_ring_create(pd_ring *r, size_t size);
/* Close the descriptor (after sending it); the mapping stays. */
void pd_ring_close_fd(pd_ring *r);
/* Unmap and close. PD_RING_NONE or a freed ring is fine. */
void pd_ring_free(pd_ring *r);

#endif
