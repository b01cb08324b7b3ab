/* Fetch readahead: a connection that reads its slice in order gets its next Fetch generated while the loop is idle. */
#ifndef PD_READAHEAD_H
#define PD_READAHEAD_H

#include <stdint.h>

#include <uv.h>

#include "daemon/handlers.h"

/* Readahead replies of at most this many bytes (a training batch of ids; larger Fetches are rarer and
 * go to the pool anyway). Each sequential connection holds one such buffer. */
#define PD_READAHEAD_MAX_BYTES (32u << 10)

struct pd_conn;
struct pd_server;

/* What one connection predicts: the Fetch that continues the last one it was served. A Fetch
 * that is that request is sequential; after one, the prediction is generated ahead. */
typedef struct pd_readahead {
    pd_target t;        /* the continuing request: the last one's key and slice, t.slice.offset where it
                           ended, t.remaining what the rank then has left */
    uint64_t count;     /* the last one's count, which the continuing one asks for again */
    uint64_t got;       /* ids it gets: min(count, t.remaining) */
    int known;          /* t and count are set (a Fetch was served) */
    uint8_t *buf;       /* got * t.width bytes once ready */
    int ready;          /* buf holds them */
    int queued;         /* waiting for the idle pass */
    struct pd_conn *prev, *next; /* the server's idle queue */
} pd_readahead;

/* The server's half: an idle handle that generates queued predictions before the loop blocks. */
void pd_readahead_init(struct pd_server *s);
void pd_readahead_close(struct pd_server *s);

/* A Fetch of count ids (got of them left) for t: the got * t->width bytes of its reply when the
 * prediction holds exactly these ids, else NULL. Valid until pd_readahead_note or _drop. */
const uint8_t *pd_readahead_find(struct pd_conn *c, const pd_target *t, uint64_t count, uint64_t got);

/* After a Fetch of count ids for t was served (got of them, remaining after): remember it, and if it
 * continued the previous one, queue the next for the idle pass. */
void pd_readahead_note(struct pd_conn *c, const pd_target *t, uint64_t count, uint64_t got, uint64_t remaining);

/* The connection is closing: leave the queue, free the buffer. */
void pd_readahead_drop(struct pd_conn *c);

#endif
