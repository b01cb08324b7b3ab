/* libpermd: the C client of the permd daemon (connect, datasets, fetch, stream, inverse, stats). */
#ifndef PERMD_H
#define PERMD_H

/*
 * One permd_client is one connection. Calls on it are blocking and not
 * thread-safe: give each thread its own client (connections are cheap; the
 * daemon serves them concurrently). Functions return 0 or a negative
 * PERMD_E* code; permd_last_error() then holds the server's message.
 *
 * The ABI is plain for foreign-function callers (Python ctypes): opaque
 * handles, fixed-width integers, structs only through pointers, and
 * error-code numbering that is only ever appended to.
 */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PERMD_API __attribute__((visibility("default")))
#else
#define PERMD_API
#endif

/* Error codes (the same numbers as the daemon's core/error.h). */
enum {
    PERMD_OK = 0,
    PERMD_EINVAL = -1,        /* an argument is out of its domain (INVALID_ARGUMENT) */
    PERMD_ERANGE = -2,
    PERMD_ENOMEM = -3,
    PERMD_EOVERFLOW = -4,     /* ids need 64 bits: use the _u64 call */
    PERMD_EIO = -5,           /* connecting, reading or writing the socket failed */
    PERMD_EPROTO = -6,        /* a malformed frame (BAD_FRAME) */
    PERMD_ENOTFOUND = -7,     /* no such dataset (NOT_FOUND) */
    PERMD_ECONFLICT = -8,     /* e.g. a dataset exists with another size (CONFLICT) */
    PERMD_EAUTH = -9,         /* a token is required or wrong (UNAUTHENTICATED) */
    PERMD_EBUSY = -10,        /* the server is overloaded; retry later (OVERLOADED) */
    PERMD_ETOOBIG = -11,      /* a request exceeds a server limit (TOO_LARGE) */
    PERMD_EUNSUPPORTED = -12, /* the server does not know the message (UNKNOWN_MESSAGE) */
    PERMD_ECLOSED = -13,      /* the connection was closed */
    PERMD_ETIMEDOUT = -14,    /* no reply within permd_set_timeout */
    PERMD_EINTERNAL = -15,    /* a failure inside the server (INTERNAL) */
    PERMD_EUNAVAILABLE = -16, /* no GPU or no NCCL where it is needed (UNAVAILABLE) */
};

/* How the last positions of an epoch are shared among ranks (spec §5). */
enum {
    PERMD_MODE_PAD = 0,   /* every rank gets ceil(n/W) ids; the stream wraps */
    PERMD_MODE_DROP = 1,  /* every rank gets floor(n/W) ids */
    PERMD_MODE_EXACT = 2, /* every sample exactly once; ranks may differ by one */
};

#define PERMD_NAME_MAX 128
/* permd_list_datasets / permd_list_mixtures count at most this many names: a daemon that lists more (or lists
 * without end) gets PERMD_ETOOBIG. */
#define PERMD_LIST_MAX 1000000
#define PERMD_NO_RANK UINT32_MAX /* permd_inverse: a position that drop mode discards */

typedef struct permd_client permd_client;
typedef struct permd_stream permd_stream;

typedef struct permd_dataset {
    char name[PERMD_NAME_MAX + 1];
    uint64_t size;            /* n */
    uint32_t id_width;        /* 4 when n <= 2^32, else 8 */
    uint32_t from_config;     /* 1: declared in the daemon's config file */
    int64_t created_unix_ms;
    uint64_t shards;          /* 0: flat; else a sharded dataset's shard count */
    uint64_t window;          /* sharded: its default K (shards per window) */
    uint32_t lanes;           /* sharded: its default G (lanes) */
    uint64_t layout_hash;     /* sharded: a hash of its shard sizes in order (permd_shard_layout_hash);
                               * 0: unknown (a permd that does not send it) */
    uint64_t definition;      /* a hash of what defines its orders (docs/protocol.md): give it in
                               * permd_slice.definition; 0 from a permd that does not send it */
} permd_dataset;

/* One rank's view of one epoch. */
typedef struct permd_slice {
    const char *dataset;
    uint64_t seed;
    uint64_t epoch;
    uint32_t world;  /* W >= 1 */
    uint32_t rank;   /* < W */
    uint32_t mode;   /* PERMD_MODE_* */
    uint64_t offset; /* global positions already consumed (a checkpoint) */
    uint64_t window; /* sharded datasets: K for this request, 0 = the dataset's */
    uint32_t lanes;  /* sharded datasets: G for this request, 0 = the dataset's */
    /* The definition read with the dataset or mixture (permd_dataset.definition,
     * permd_mixture_def.definition), or 0: unchecked. When the name has been re-defined since
     * (deleted and re-created otherwise, or a mixture's stages appended), the request fails with
     * PERMD_ECONFLICT instead of serving the new definition's ids; a stream checks before each batch. */
    uint64_t definition;
} permd_slice;

/* An order-independent digest of ids (docs/protocol.md, Digest): equal
 * multisets of ids have equal digests, whatever their order. */
typedef struct permd_digest {
    uint64_t count;
    uint64_t sum;  /* Σ id mod 2^64 */
    uint64_t hash; /* Σ mix(id) mod 2^64 */
} permd_digest;

/* permd_stream_open_ex flags */
#define PERMD_LOCATIONS 1u /* sharded datasets: (shard, offset) pairs, 16 bytes each, instead of ids */
#define PERMD_STREAM_SOCKET 2u /* ids through the socket even where a shared-memory ring is possible */

typedef struct permd_server_info {
    char server[64];          /* "permd 0.1.0" */
    uint32_t protocol_version;
    uint32_t spec_version;
    uint32_t max_frame;
    uint32_t max_streams;
    uint32_t max_credits;
    uint64_t max_count;       /* most ids per fetch, batch or inverse */
    uint64_t output_cap;
    uint64_t max_digest;      /* most ids per Digest request (0: a server without the limit) */
} permd_server_info;

#define PERMD_STATS_TYPES 32      /* request types in permd_stats.requests */
#define PERMD_STATS_ERRORS 64     /* (type, code) pairs in permd_stats.errors */
#define PERMD_LATENCY_BUCKETS 20  /* latency histogram buckets; the last is +Inf */

/* Requests of one type ("fetch", "put_dataset", ...; "unknown", "invalid",
 * "connection": see docs/protocol.md, Stats). */
typedef struct permd_request_stats {
    char type[32];
    uint64_t requests;
    uint64_t errors;
    uint64_t latency_sum_us;
    uint64_t latency_buckets[PERMD_LATENCY_BUCKETS]; /* counts per permd_stats.latency_bounds_us, not cumulative */
} permd_request_stats;

typedef struct permd_error_stats {
    char type[32]; /* as permd_request_stats.type */
    char code[32]; /* "NOT_FOUND", "INVALID_ARGUMENT", ... */
    uint64_t count;
} permd_error_stats;

typedef struct permd_stats {
    uint64_t uptime_ms;
    uint64_t connections;
    uint64_t connections_total;
    uint64_t requests_total;
    uint64_t errors_total;
    uint64_t ids_served_total;
    uint64_t bytes_out_total;
    uint64_t datasets;
    uint64_t streams_active;
    uint64_t streams_total;
    uint64_t backpressure_pauses;
    uint64_t workers;
    /* Appended (the fields above keep their offsets): the figures of permd's /metrics. */
    uint64_t cpu_ids_total;
    uint64_t gpu_ids_total;
    uint64_t queue_depth; /* worker-pool jobs queued or running */
    uint64_t bytes_in_total;
    uint64_t connections_rejected_total;
    uint64_t latency_bounds_us[PERMD_LATENCY_BUCKETS]; /* upper bounds; the last is UINT64_MAX (+Inf) */
    uint32_t nrequests, nerrors; /* entries used below */
    permd_request_stats requests[PERMD_STATS_TYPES];
    permd_error_stats errors[PERMD_STATS_ERRORS];
    uint64_t readahead_hits_total; /* Fetches answered from a readahead (appended: the fields above keep their offsets) */
    uint64_t stream_rings_total;   /* streams delivered through a shared-memory ring (appended) */
} permd_stats;

/* A static description of an error code. */
PERMD_API const char *permd_strerror(int err);
/* "0.1.0" */
PERMD_API const char *permd_version(void);
/* The layout of this header's structs: raised whenever a struct gains, loses or moves a field, or a
 * function a binding calls changes its arguments. Bindings that mirror them (the Python package's
 * ctypes) refuse a library of another one. */
#define PERMD_ABI_VERSION 6 /* 3: permd_dataset.layout_hash, permd_mixture_def.component_layout_hashes;
                             * 4: permd_dataset.definition, permd_slice.definition, permd_mixture_def.definition;
                             * 5: permd_group_deliver's and permd_nccl_recv's id_width;
                             * 6: permd_inverse_sharded, which the Python package binds */
PERMD_API unsigned permd_abi_version(void);

/* Connect and say Hello (waiting at most 10 s for the answer). endpoint: NULL or "" for the default socket
 * ($PERMD_SOCKET, $XDG_RUNTIME_DIR/permd.sock, /tmp/permd-<uid>/permd.sock);
 * "unix:PATH" or anything containing '/' for a Unix socket; "tcp:HOST:PORT"
 * or "HOST:PORT" for TCP. token: the TCP auth secret, or NULL. The default /tmp/permd-<uid> is
 * refused (PERMD_EAUTH) unless this user owns it and neither group nor others may write in it: another
 * user could have made it first and put their own socket there. */
PERMD_API int permd_connect(const char *endpoint, const char *token, permd_client **out);
PERMD_API int permd_connect_unix(const char *path, permd_client **out);
PERMD_API int permd_connect_tcp(const char *host_port, const char *token, permd_client **out);
/* permd_connect with a timeout of ms milliseconds for the connection, for the Hello, and then for every
 * reply, as permd_set_timeout sets it (0: the connection and the Hello wait 10 s each, replies forever,
 * as permd_connect). PERMD_ETIMEDOUT when the connection is not made in time (a TCP peer that drops
 * SYNs, a Unix socket whose backlog stays full) or the Hello is not answered in time. A TCP HOST that is a
 * name is looked up first by the system's resolver, outside ms: its own timeouts bound that (resolv.conf's
 * timeout and attempts); give a numeric address where a stalled DNS server must not hold the caller. */
PERMD_API int permd_connect_timeout(const char *endpoint, const char *token, uint32_t ms, permd_client **out);
/* Close the connection, and free what a stream still open on it holds (its queued batches and its
 * shared-memory ring): the stream's handle stays valid, its next permd_stream_next says PERMD_ECLOSED,
 * and permd_stream_close frees it. NULL is fine. */
PERMD_API void permd_close(permd_client *c);

/* Give up on a reply after ms milliseconds (0: wait forever, the default): one deadline from the request
 * to its whole reply (a stream's: from permd_stream_next to its batch; permd_stream_close: for its whole drain),
 * however the server trickles it. After PERMD_ETIMEDOUT the connection is unusable: close it. */
PERMD_API int permd_set_timeout(permd_client *c, uint32_t ms);
/* The message of the last failure on c (the server's text when it sent one). */
PERMD_API const char *permd_last_error(const permd_client *c);
/* Record why a call of a library built on libpermd (libpermd_nccl) failed on c, so that permd_last_error(c)
 * says so, as it does after libpermd's own calls; c NULL: the calling thread's message (permd_last_error(NULL)).
 * It does not end the connection. Returns err. */
PERMD_API int permd_set_error(permd_client *c, int err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* 1 while c may still be used; 0 once a failure ended its connection (a timeout, an I/O error, a
 * malformed reply, or an error permd sent before closing it, e.g. a frame above its max_frame): close it
 * and connect again. */
PERMD_API int permd_usable(const permd_client *c);
/* What the server said in Hello. */
PERMD_API int permd_server_info_get(const permd_client *c, permd_server_info *out);

/* Datasets. put: created (may be NULL) gets 1 when new, 0 when it existed
 * with this size; out may be NULL. Durable when it returns 0. */
PERMD_API int permd_put_dataset(permd_client *c, const char *name, uint64_t size, permd_dataset *out,
                                int32_t *created);
PERMD_API int permd_get_dataset(permd_client *c, const char *name, permd_dataset *out);
/* Fill up to cap entries (sorted by name); *total gets how many exist (cap 0: out
 * may be NULL, just count). The list is read in pages (ListDatasets.paged,
 * docs/protocol.md §5), as many calls as it takes, each reply bounded by the
 * frame bound and nothing allocated beyond it; a dataset put or deleted between
 * pages may or may not be in the result, which still holds each name once, in
 * the daemon's order. A daemon that ignores `paged` (older) answers in one
 * reply, as before. PERMD_EPROTO when a page does not advance or breaks the
 * order; PERMD_ETOOBIG above PERMD_LIST_MAX names. On an error *total is not
 * set and out may be partly filled. */
PERMD_API int permd_list_datasets(permd_client *c, permd_dataset *out, size_t cap, size_t *total);
PERMD_API int permd_delete_dataset(permd_client *c, const char *name);

/* Fetch the rank's next min(count, remaining) ids into out; *got gets how
 * many, *next_offset (may be NULL) the offset that continues after them.
 * count is at most permd_server_info.max_count. The u32 form fails with
 * PERMD_EOVERFLOW for datasets above 2^32 samples. */
PERMD_API int permd_fetch_u32(permd_client *c, const permd_slice *s, uint64_t count, uint32_t *out, uint64_t *got,
                              uint64_t *next_offset);
PERMD_API int permd_fetch_u64(permd_client *c, const permd_slice *s, uint64_t count, uint64_t *out, uint64_t *got,
                              uint64_t *next_offset);

/* Stream the rank's ids in batches of `batch` (max_count = 0: to the end of
 * its slice). Credits are managed inside: the server runs ahead by a few
 * batches and stops when the reader does. One stream per client at a time
 * (a second is PERMD_EINVAL); other calls on the client may be made while it
 * is open. Batches are checked as they come (in order, of the kind asked
 * for, 1 to batch items, within max_count, the offset advancing): a server
 * that breaks any of these gets PERMD_EPROTO, never ids passed on. A stream
 * that permd ends early (shutting down, or cancelled without being asked)
 * is PERMD_ECLOSED: resume from permd_stream_offset. */
PERMD_API int permd_stream_open(permd_client *c, const permd_slice *s, uint64_t batch, uint64_t max_count,
                                permd_stream **out);
/* The next batch: *ids points at *count little-endian ids of *width bytes,
 * aligned to *width (locations, two u64s of 16 bytes: to 8), valid until the
 * next call on the client. *count = 0: the stream is over. */
PERMD_API int permd_stream_next(permd_stream *st, const void **ids, uint32_t *width, uint64_t *count);
/* The offset that resumes after the batches returned so far (a checkpoint). */
PERMD_API uint64_t permd_stream_offset(const permd_stream *st);
/* Cancel if unfinished and free. Returns the stream's error, if it had one. */
PERMD_API int permd_stream_close(permd_stream *st);
/* 1 when the stream's batches arrive through a shared-memory ring (a Unix
 * socket to a permd that has one to give: no socket copy; *ids then points
 * into the read-only ring), 0 when through the socket. */
PERMD_API int permd_stream_shared(const permd_stream *st);

/* Positions of samples: positions[i] = σ⁻¹(samples[i]) (global position in
 * the epoch), ranks[i] = the rank that reads it (position mod W), or
 * PERMD_NO_RANK when mode is PERMD_MODE_DROP and the position is dropped.
 * mode < 0: no mode (no position is dropped). ranks may be NULL. More samples
 * than one request may carry (the server's max_frame and max_count) go in
 * several; the dataset's id width is looked up at each call. */
PERMD_API int permd_inverse(permd_client *c, const char *dataset, uint64_t seed, uint64_t epoch, uint32_t world,
                            int32_t mode, const uint64_t *samples, size_t n, uint64_t *positions, uint32_t *ranks);
/* permd_inverse on a sharded dataset's order under another window K and lanes G than its own (as a slice's
 * window and lanes override them; 0: the dataset's). On a flat dataset only 0, 0 is accepted. */
PERMD_API int permd_inverse_sharded(permd_client *c, const char *dataset, uint64_t seed, uint64_t epoch,
                                    uint32_t world, int32_t mode, uint64_t window, uint32_t lanes,
                                    const uint64_t *samples, size_t n, uint64_t *positions, uint32_t *ranks);

PERMD_API int permd_stats_get(permd_client *c, permd_stats *out);

/* ---- Sharded datasets (docs/spec/shards-v1.md) ----------------------------
 * A sharded dataset is its shard sizes (zero allowed; the sum N is the
 * sample count), a default window K (0: 8) and lanes G (0: 1); sample ids are
 * offsets in the natural order. Fetch, stream, inverse and digest work on it
 * as on a flat one (permd_slice.window/lanes override K and G). */

/* Create or confirm (PERMD_ECONFLICT if the name exists otherwise); the sizes
 * go in as many messages as the server's max_frame needs. */
PERMD_API int permd_put_dataset_sharded(permd_client *c, const char *name, const uint64_t *sizes, uint64_t nshards,
                                        uint64_t window, uint32_t lanes, permd_dataset *out, int32_t *created);
/* The rank's next items as (shard, offset-in-shard) pairs. */
PERMD_API int permd_fetch_locations(permd_client *c, const permd_slice *s, uint64_t count, uint64_t *shards,
                                    uint64_t *offsets, uint64_t *got, uint64_t *next_offset);
/* permd_stream_open with flags (PERMD_LOCATIONS: batches of width 16, shard
 * then offset, little-endian u64 each). */
PERMD_API int permd_stream_open_ex(permd_client *c, const permd_slice *s, uint64_t batch, uint64_t max_count,
                                   uint32_t flags, permd_stream **out);
/* The digest of every id the slice has left, from its offset to the end of
 * the epoch, computed by the daemon (O(remaining): a verification call; about
 * 10 ns an id). Slices longer than the server's max_digest are asked for in
 * parts and added up. */
PERMD_API int permd_digest_slice(permd_client *c, const permd_slice *s, permd_digest *out);

/* ---- NCCL delivery groups: the socket half (docs/nccl.md) -----------------
 * Most callers use libpermd_nccl (gpu/permd_nccl.h), which adds the NCCL
 * half on top of these. PERMD_EUNAVAILABLE when the daemon has no GPU or
 * NCCL, or the group was aborted. */

#define PERMD_NCCL_ID_BYTES 128

/* Join (creating it if new) a group of `members` trainers: the NCCL unique
 * id, this member's rank (1..members) and the communicator size (members + 1). */
PERMD_API int permd_group_join(permd_client *c, const char *group, uint32_t members,
                               uint8_t nccl_id[PERMD_NCCL_ID_BYTES], uint32_t *rank, uint32_t *nranks);
/* Ask for the rank's next ids; *got of *width bytes each then arrive over
 * NCCL from rank 0 (post the receive after this returns; none when *got is 0).
 * id_width: the bytes per id the receive buffer holds: 8 (any dataset), 4
 * (PERMD_EINVAL for a dataset over 2^32 samples), or 0 for the dataset's own
 * (4 up to 2^32 samples, else 8: the caller must have room for either). */
PERMD_API int permd_group_deliver(permd_client *c, const char *group, const permd_slice *s, uint64_t count,
                                  uint32_t id_width, uint64_t *got, uint32_t *width, uint64_t *next_offset);
PERMD_API int permd_group_leave(permd_client *c, const char *group);

/* ---- Offline: spec v1 computed in this process, no daemon ------------------
 * The same answers as the daemon (and `permctl perm | inverse | rank`), for
 * callers that know the dataset size. Ids are written as `width`-byte host
 * integers (4 or 8; 4 needs n <= 2^32, else PERMD_EOVERFLOW). mode is a
 * PERMD_MODE_*. PERMD_EINVAL for n outside [1, 2^63], world 0, rank >= world
 * or an unknown mode; PERMD_ERANGE past the end. */

/* out[i] = σ(start + i), i < count; start + count <= n. */
PERMD_API int permd_perm_fill(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t start, uint64_t count, void *out,
                              unsigned width);
/* positions[i] = σ⁻¹(samples[i]); every sample < n. */
PERMD_API int permd_perm_inverse(uint64_t seed, uint64_t epoch, uint64_t n, const uint64_t *samples, uint64_t count,
                                 uint64_t *positions);
/* T, the number of global positions of an epoch in this mode. */
PERMD_API int permd_epoch_length(uint64_t n, uint32_t world, int mode, uint64_t *len);
/* How many ids rank has left after offset (0 at or past T; offset > T is PERMD_ERANGE). */
PERMD_API int permd_rank_remaining(uint64_t n, uint32_t world, uint32_t rank, int mode, uint64_t offset,
                                   uint64_t *count);
/* The rank's next min(count, remaining) ids after offset; *written gets how many. */
PERMD_API int permd_rank_fill(uint64_t seed, uint64_t epoch, uint64_t n, uint32_t world, uint32_t rank, int mode,
                              uint64_t offset, uint64_t count, void *out, unsigned width, uint64_t *written);
/* The digest of everything the rank has left after offset. */
PERMD_API int permd_rank_digest(uint64_t seed, uint64_t epoch, uint64_t n, uint32_t world, uint32_t rank, int mode,
                                uint64_t offset, permd_digest *out);

/* Add ids (width 4 or 8, host order) to a digest; start from a zeroed one. */
PERMD_API int permd_digest_add(permd_digest *d, const void *ids, uint64_t count, unsigned width);

/* A hash of shard sizes in their order, as permd reports a sharded dataset's layout_hash: a checkpoint
 * records it, so that a resume over other shard sizes with the same total and count is refused. */
PERMD_API uint64_t permd_shard_layout_hash(const uint64_t *sizes, uint64_t nshards);

/* One epoch of a sharded dataset, offline: the O(S) table is built once in
 * permd_plan_new (16 bytes a shard), then lookups are O(log S). */
typedef struct permd_plan permd_plan;
PERMD_API int permd_plan_new(uint64_t seed, uint64_t epoch, const uint64_t *sizes, uint64_t nshards, uint64_t window,
                             uint32_t lanes, permd_plan **out);
PERMD_API void permd_plan_free(permd_plan *p);
/* N, the sample count. */
PERMD_API uint64_t permd_plan_size(const permd_plan *p);
/* The sample at a stream position < N, and where it lives. */
PERMD_API int permd_plan_locate(const permd_plan *p, uint64_t position, uint64_t *sample, uint64_t *shard,
                                uint64_t *offset);
/* The stream position of a sample id < N. */
PERMD_API int permd_plan_position(const permd_plan *p, uint64_t sample, uint64_t *position);
/* As permd_rank_fill over the plan; shards/offsets: as locations (either may be NULL). */
PERMD_API int permd_plan_rank_fill(const permd_plan *p, uint32_t world, uint32_t rank, int mode, uint64_t offset,
                                   uint64_t count, void *out, unsigned width, uint64_t *written);
PERMD_API int permd_plan_rank_locations(const permd_plan *p, uint32_t world, uint32_t rank, int mode,
                                        uint64_t offset, uint64_t count, uint64_t *shards, uint64_t *offsets,
                                        uint64_t *written);
PERMD_API int permd_plan_rank_digest(const permd_plan *p, uint32_t world, uint32_t rank, int mode, uint64_t offset,
                                     permd_digest *out);

/* ---- Mixtures on the daemon (docs/mixtures.md) ------------------------------
 * A mixture registered on the daemon. Mixtures and datasets share one
 * namespace: a permd_slice's dataset may name a mixture (its epoch is the
 * mixture epoch; ids are global, below `size`; locations are (component,
 * local id) pairs), and so may a digest. The ids equal an offline
 * permd_mixture's over the same component sizes, seed, stages, length and
 * block. A deleted or re-created component makes requests on the mixture fail
 * with PERMD_ENOTFOUND or PERMD_ECONFLICT (never wrong ids); deleting a
 * dataset a mixture uses is PERMD_ECONFLICT. */

typedef struct permd_mixture_def {
    char name[PERMD_NAME_MAX + 1];
    uint32_t ncomponents;
    char (*components)[PERMD_NAME_MAX + 1]; /* registered dataset names, component order */
    uint64_t *component_sizes;              /* their sizes when the mixture was put (server) */
    uint32_t nstages;
    uint64_t *stage_starts;                 /* run positions: 0, then increasing multiples of block */
    uint32_t *weights;                      /* nstages rows of ncomponents */
    uint64_t length;                        /* L */
    uint32_t block;                         /* B */
    uint64_t size;                          /* N = sum of component sizes (global ids are below it) */
    uint32_t id_width;                      /* 4 when N <= 2^32, else 8 */
    int64_t created_unix_ms;
    /* Each component's layout when the mixture was put (server; NULL from a permd that does not
     * send them): shard count (0: flat), and for a sharded one its K and G. */
    uint64_t *component_shards;
    uint64_t *component_windows;
    uint32_t *component_lanes;
    uint64_t *component_layout_hashes; /* a sharded one's layout_hash (0: flat); NULL from a permd that does
                                        * not send them */
    uint64_t definition; /* a hash of the whole definition, as permd_dataset.definition (appending a stage
                          * changes it); 0 from a permd that does not send it */
} permd_mixture_def;

/* Register (or confirm) mixture `name` over registered datasets. length 0:
 * the sum of the components' sizes; block 0: 64. *created: 1 new, 0 identical
 * to the stored one, 2 the stored stages were a prefix and the new ones were
 * appended (re-weighting: a stage may only be added after the last one).
 * PERMD_ECONFLICT when the name is a dataset, or a mixture defined otherwise;
 * PERMD_ENOTFOUND for a component that does not exist; PERMD_EINVAL as the
 * spec's domain says. *out (may be NULL) gets the stored definition: free it
 * with permd_mixture_def_free. */
PERMD_API int permd_put_mixture(permd_client *c, const char *name, const char *const *components,
                                uint32_t ncomponents, const uint64_t *stage_starts, const uint32_t *weights,
                                uint32_t nstages, uint64_t length, uint32_t block, permd_mixture_def **out,
                                int32_t *created);
PERMD_API int permd_get_mixture(permd_client *c, const char *name, permd_mixture_def **out);
PERMD_API void permd_mixture_def_free(permd_mixture_def *d);
/* Names, sorted; fill up to cap, *total gets how many exist. Read in pages as
 * permd_list_datasets, with its errors. */
PERMD_API int permd_list_mixtures(permd_client *c, char (*names)[PERMD_NAME_MAX + 1], size_t cap, size_t *total);
PERMD_API int permd_delete_mixture(permd_client *c, const char *name);
/* Where global ids `samples` of component epochs `component_epochs` are
 * drawn, for mixture seed `seed` read by `world` ranks in `mode` (negative:
 * none): the mixture epoch (UINT64_MAX: never drawn), the position in it, and
 * the reading rank (UINT32_MAX: never, or dropped). Any count: more than
 * one request carries (max_frame, max_count) go in pieces. ranks may be NULL. */
PERMD_API int permd_inverse_mixture(permd_client *c, const char *mixture, uint64_t seed, uint32_t world, int mode,
                                    const uint64_t *samples, const uint64_t *component_epochs, uint64_t count,
                                    uint64_t *epochs, uint64_t *positions, uint32_t *ranks);

/* ---- Offline mixtures (docs/spec/mixtures-v1.md) ----------------------------
 * Weighted draws over several datasets (components), in stages whose weights
 * may change at block boundaries, as one stream of run positions; mixture
 * epoch E is run positions E·L … E·L + L − 1. Ids are global: component j's
 * local id plus the sizes of the components before it (a ConcatDataset index).
 * A permd_mixture caches component orders: use it from one thread at a time. */

typedef struct permd_mixture permd_mixture;

/* One component: flat (shard_sizes NULL: `size` samples) or sharded (its shard
 * sizes, zero allowed; window 0 = 8, lanes 0 = 1; `size` is ignored). */
typedef struct permd_mix_component {
    uint64_t size;
    const uint64_t *shard_sizes;
    uint64_t nshards;
    uint64_t window;
    uint32_t lanes;
} permd_mix_component;

#define PERMD_MIX_BLOCK_DEFAULT 64 /* B: slots shuffled together (a power of two, 64 … 2048) */

/* A mixture of flat components of sizes[0 … n): stage k starts at run position
 * stage_starts[k] (the first at 0, increasing, multiples of the block) with
 * weights[k·n … k·n + n) (u32, each stage's sum in [1, 2^32 − 1]). length 0:
 * the sum of the sizes; block 0: PERMD_MIX_BLOCK_DEFAULT. PERMD_EINVAL for
 * anything outside the spec's domain. */
PERMD_API int permd_mixture_new(uint64_t seed, const uint64_t *sizes, uint32_t ncomponents, uint64_t length,
                                uint32_t block, const uint64_t *stage_starts, const uint32_t *weights,
                                uint32_t nstages, permd_mixture **out);
/* The same with components that may be sharded. */
PERMD_API int permd_mixture_new_ex(uint64_t seed, const permd_mix_component *components, uint32_t ncomponents,
                                   uint64_t length, uint32_t block, const uint64_t *stage_starts,
                                   const uint32_t *weights, uint32_t nstages, permd_mixture **out);
PERMD_API void permd_mixture_free(permd_mixture *m);
/* L (positions per mixture epoch), N (global ids are below it), C, B. 0 for NULL. */
PERMD_API uint64_t permd_mixture_length(const permd_mixture *m);
PERMD_API uint64_t permd_mixture_size(const permd_mixture *m);
PERMD_API uint32_t permd_mixture_components(const permd_mixture *m);
PERMD_API uint32_t permd_mixture_block(const permd_mixture *m);
/* Component j's seed: its order in component epoch e is permutation v1's
 * σ(seed_j, e) over its size (or the shard addendum's epoch e under seed_j). */
PERMD_API int permd_mixture_component_seed(const permd_mixture *m, uint32_t component, uint64_t *seed);
/* The first run position at or after epoch·L + offset where a stage may start
 * (a multiple of the block): re-weighting from a checkpoint takes effect there. */
PERMD_API int permd_mixture_stage_start(const permd_mixture *m, uint64_t epoch, uint64_t offset, uint64_t *start);
/* The sample at position < L of mixture epoch `epoch`: its global id, component,
 * local id and component epoch (any pointer but m may be NULL). */
PERMD_API int permd_mixture_locate(permd_mixture *m, uint64_t epoch, uint64_t position, uint64_t *sample,
                                   uint32_t *component, uint64_t *local, uint64_t *component_epoch);
/* Where component j's sample `local` of component epoch e is drawn: mixture
 * epoch and position. PERMD_ENOTFOUND when the run never draws it (its weight
 * is 0 from some stage on, or the draw lies past run position 2^63). */
PERMD_API int permd_mixture_position(permd_mixture *m, uint32_t component, uint64_t local, uint64_t component_epoch,
                                     uint64_t *epoch, uint64_t *position);
/* drawn[j] = how many samples of each component the run drew before position
 * `position` of mixture epoch `epoch` (ncomponents values). */
PERMD_API int permd_mixture_drawn(const permd_mixture *m, uint64_t epoch, uint64_t position, uint64_t *drawn);
/* As permd_rank_fill over mixture epoch `epoch` (n = L): global ids of width
 * 4 or 8 (4 needs N <= 2^32). world 1, rank 0, offset P, exact: positions P, P + 1, … */
PERMD_API int permd_mixture_rank_fill(permd_mixture *m, uint64_t epoch, uint32_t world, uint32_t rank, int mode,
                                      uint64_t offset, uint64_t count, void *out, unsigned width, uint64_t *written);
/* The rank's next reads as (component, local id, component epoch); any array may be NULL. */
PERMD_API int permd_mixture_rank_locations(permd_mixture *m, uint64_t epoch, uint32_t world, uint32_t rank, int mode,
                                           uint64_t offset, uint64_t count, uint32_t *components, uint64_t *locals,
                                           uint64_t *component_epochs, uint64_t *written);
PERMD_API int permd_mixture_rank_digest(permd_mixture *m, uint64_t epoch, uint32_t world, uint32_t rank, int mode,
                                        uint64_t offset, permd_digest *out);

#ifdef __cplusplus
}
#endif

#endif
