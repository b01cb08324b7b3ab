/* The dataset registry: names and sizes, durable in SQLite (WAL) under the state directory, cached in memory. */
#ifndef PD_REGISTRY_H
#define PD_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "core/name.h"
#include "daemon/mixdef.h"

#define PD_DEFAULT_WINDOW 8 /* K of a sharded dataset put without one */

typedef struct pd_dataset {
    char name[PD_NAME_MAX + 1];
    uint64_t size;
    int64_t created_ms; /* Unix time of the first PutDataset (or of startup, for config datasets) */
    int from_config;    /* declared in the config file: not stored, not deletable */
    uint64_t shards;    /* 0: flat; else the shard count (its layout: pd_registry_layout) */
    uint64_t window;    /* sharded: default K */
    uint32_t lanes;     /* sharded: default G */
    uint64_t layout_hash; /* sharded: its layout's hash (pd_shard_layout_hash) */
} pd_dataset;

/* A sharded dataset's natural offsets (docs/spec/shards-v1.md §1): start[s],
 * S + 1 values. Immutable and reference-counted, so a request keeps using
 * the layout it resolved even if the dataset is deleted meanwhile. */
typedef struct pd_layout {
    _Atomic unsigned refs;
    _Atomic int held; /* a registry stored it: counted in pd_registry_layout_bytes until its last reference goes */
    _Atomic int retired; /* the registry dropped it (its dataset deleted): caches let go of it (pd_plans_drop_retired) */
    uint64_t shards;
    uint64_t hash;    /* of the shard sizes: tells two layouts apart (a mixture's component check) */
    uint64_t start[]; /* S + 1 */
} pd_layout;

/* A new layout from sizes (one reference). PD_EINVAL when S or N is out of range. */
int pd_layout_create(const uint64_t *sizes, uint64_t shards, pd_layout **out);
pd_layout *pd_layout_ref(pd_layout *l);
void pd_layout_release(pd_layout *l);

typedef struct pd_registry pd_registry;

/* Open (creating the directory and database as needed) and load every
 * stored dataset. Blocking; call at startup. The registry holds an exclusive
 * lock on <state_dir>/registry.lock until it is closed: PD_EBUSY, naming the
 * holder's pid, when another permd (or another open registry) has it. A
 * registry that exists must be read whole: PD_ECORRUPT when it is damaged (a
 * 0-byte file, damaged pages, a WAL without its main file, SQLite's "not a
 * database"); PD_EBUSY when another process holds SQLite's lock on it past the
 * busy timeout; PD_EIO when it cannot be written (read-only) or opened;
 * PD_EUNSUPPORTED for a schema this permd does not know (checked before
 * anything is written); a message in err in every case. Only PD_ECORRUPT
 * means damaged. A row that fails to load is logged at error level
 * (registry_skip) and not served; its name stays usable (a put replaces it,
 * a delete removes it) when it is a name a request can carry. */
int pd_registry_open(const char *state_dir, pd_registry **out, char *err, size_t errlen);

/* pd_registry_open, but a damaged registry (PD_ECORRUPT, nothing else) has its
 * files renamed aside (registry.db.damaged-<unix ms>, with its -wal and -shm),
 * under the same lock, and an empty one opens instead; both are logged
 * (fresh_registry: 1). */
int pd_registry_open_fresh(const char *state_dir, pd_registry **out, char *err, size_t errlen);

/* Either of them (fresh: pd_registry_open_fresh's), waiting busy_ms (registry_busy_ms; they wait 5000) for a
 * lock another process holds, at startup and at each commit, before PD_EBUSY. */
int pd_registry_open_with(const char *state_dir, int fresh, unsigned busy_ms, pd_registry **out, char *err,
                          size_t errlen);

/* Refuse sharded puts whose layouts would hold more than bytes in all (0: no bound). */
void pd_registry_set_layout_limit(pd_registry *r, uint64_t bytes);
/* Bytes all mixture definitions may hold in memory (pd_mixdef_bytes; mixture_memory): a put beyond it is PD_ETOOBIG.
 * Those loaded at startup are kept whatever they hold. 0: no limit. */
void pd_registry_set_mixture_limit(pd_registry *r, uint64_t bytes);
/* The mixtures registered and the bytes their definitions hold. */
void pd_registry_mixture_totals(pd_registry *r, uint64_t *count, uint64_t *bytes);
/* Bytes every stored layout still alive holds (permd_layout_bytes): the registry's own and those it
 * deleted or replaced that a plan, stream or request still references. layout_memory bounds this. */
uint64_t pd_registry_layout_bytes(pd_registry *r);
/* Rows that failed to load at open. */
size_t pd_registry_skipped(pd_registry *r);
/* Commits whose checkpoint into the main file failed (they stayed in the write-ahead log). */
uint64_t pd_registry_checkpoint_failures(pd_registry *r);
void pd_registry_close(pd_registry *r);

/* d's definition hash (the protocol's Dataset.definition, daemon/definition.h): its
 * size, and a sharded one's shard count, default K and G and layout hash; not its name. */
uint64_t pd_dataset_definition(const pd_dataset *d);

/* Declare a config dataset (startup only). PD_ECONFLICT, said in err, when the store or an earlier
 * declaration has another size or a sharded layout, or a stored mixture has the name (one namespace:
 * a request on it would reach the dataset first). */
int pd_registry_declare(pd_registry *r, const char *name, uint64_t size, char *err, size_t errlen);

/* After the config's datasets are declared at startup: log each stored mixture a component of which
 * is missing or not the dataset it was put over (a config dataset dropped from the config, a row deleted or
 * damaged by hand), whose requests would fail; the number of such mixtures. */
size_t pd_registry_check_mixtures(pd_registry *r);

/* The calls below are thread-safe. get/list/count read memory only and
 * never wait for the disk; put/delete commit to SQLite before returning and
 * must run off the event loop. */

/* Create or confirm: *created = 1 when new. PD_ECONFLICT when it exists with
 * another size; PD_EINVAL for a bad name or size; PD_EIO when the commit failed
 * (err, when not NULL, gets the cause: "disk full", "registry read-only", …),
 * or PD_EBUSY when another process held it locked past the busy timeout (a
 * retry may work), and then nothing was stored. 0 means committed (fsynced): a config dataset
 * put with its declared size is stored too (*created = 0), so it outlives its
 * declaration. Each commit is then checkpointed into the main file; a failed
 * checkpoint (disk full) leaves the commit in the write-ahead log, durable, is
 * logged (registry_checkpoint) and counted, and does not fail the put. The
 * same holds for the deletes and the mixtures' put and delete. */
int pd_registry_put(pd_registry *r, const char *name, uint64_t size, pd_dataset *out, int *created, char *err,
                    size_t errlen);
/* Create or confirm a sharded dataset (takes its own reference to layout):
 * *created = 1 when new; PD_ECONFLICT when the name exists with another
 * size, layout, window or lanes; PD_ETOOBIG beyond the layout limit. */
int pd_registry_put_sharded(pd_registry *r, const char *name, pd_layout *layout, uint64_t window, uint32_t lanes,
                            pd_dataset *out, int *created, char *err, size_t errlen);
/* A reference to a sharded dataset's layout (release it). PD_ENOTFOUND, or
 * PD_EINVAL for a flat dataset. */
int pd_registry_layout(pd_registry *r, const char *name, pd_layout **out);
/* PD_ENOTFOUND; PD_ECONFLICT for a config dataset or one a mixture uses (err names it); PD_EIO or
 * PD_EBUSY (locked by another process) as pd_registry_put (err gets the cause). */
int pd_registry_delete(pd_registry *r, const char *name, char *err, size_t errlen);
/* PD_ENOTFOUND */
int pd_registry_get(pd_registry *r, const char *name, pd_dataset *out);
/* A malloc'd copy sorted by name (free it); *n may be 0 with *out NULL. */
int pd_registry_list(pd_registry *r, pd_dataset **out, size_t *n);
size_t pd_registry_count(pd_registry *r);

/* ---- Mixtures (docs/mixtures.md). They share the datasets' namespace: a name is one or the other. */

/* Store, confirm or extend a mixture: def's components are looked up and recorded (size, layout)
 * first. *created: 1 new, 0 the same as stored, 2 stages appended (the stored ones a prefix).
 * *stored gets a reference to what is stored. PD_ENOTFOUND (a component), PD_ECONFLICT (the name is
 * a dataset, or a mixture defined otherwise), PD_EINVAL (the spec's domain), PD_EIO; err says which. */
int pd_registry_put_mixture(pd_registry *r, pd_mixdef *def, pd_mixdef **stored, int *created, char *err,
                            size_t errlen);
/* A reference to a mixture's definition. PD_ENOTFOUND. */
int pd_registry_mixture(pd_registry *r, const char *name, pd_mixdef **out);
/* References to every mixture, sorted by name (release each, free the array). */
int pd_registry_list_mixtures(pd_registry *r, pd_mixdef ***out, size_t *n);
/* PD_ENOTFOUND, PD_EIO. */
int pd_registry_delete_mixture(pd_registry *r, const char *name, char *err, size_t errlen);
/* 0 when the dataset is still what the mixture component recorded; PD_ENOTFOUND (deleted) or
 * PD_ECONFLICT (re-created otherwise) with a message; a sharded one's layout comes back in *layout
 * (a reference; NULL for a flat one). */
int pd_registry_component(pd_registry *r, const pd_mixdef *d, uint32_t j, pd_layout **layout, char *err,
                          size_t errlen);

#endif
