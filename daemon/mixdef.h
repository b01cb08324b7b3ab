/* Mixture definitions: what a registered mixture is (components, stages, length, block), immutable and reference-counted. */
#ifndef PD_MIXDEF_H
#define PD_MIXDEF_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/name.h"

/* What a component was when the mixture was put: a request finds the dataset of that name and
 * refuses to serve if it is no longer this (deleted, or re-created otherwise), so a mixture never
 * gives ids of another dataset than the one it was defined over. */
typedef struct pd_mixcomp {
    char name[PD_NAME_MAX + 1];
    uint64_t size;        /* n_j */
    uint64_t shards;      /* 0: flat */
    uint64_t window;      /* sharded: K */
    uint32_t lanes;       /* sharded: G */
    uint64_t layout_hash; /* sharded: pd_layout's hash of its shard sizes */
} pd_mixcomp;

typedef struct pd_mixdef {
    _Atomic unsigned refs;
    char name[PD_NAME_MAX + 1];
    uint32_t components; /* C */
    uint32_t stages;     /* S */
    uint64_t length;     /* L */
    uint32_t block;      /* B */
    uint64_t size;       /* N = Σ n_j */
    int64_t created_ms;
    pd_mixcomp *comp;    /* C */
    uint64_t *starts;    /* S run positions */
    uint32_t *weights;   /* S rows of C */
    uint64_t definition; /* pd_mixdef_hash, set by pd_mixdef_check (and so by pd_mixdef_decode) */
} pd_mixdef;

/* A definition with room for C components and S stages (one reference), every field zero but
 * the counts and name. PD_EINVAL for a bad name or counts outside [1, max]; PD_ENOMEM. */
int pd_mixdef_alloc(const char *name, uint32_t components, uint32_t stages, pd_mixdef **out);
pd_mixdef *pd_mixdef_ref(pd_mixdef *d);
/* The bytes d holds in memory (its one allocation): what mixture_memory counts. */
size_t pd_mixdef_bytes(const pd_mixdef *d);
void pd_mixdef_release(pd_mixdef *d);

/* Check d against the spec's domain (stages, weights, length, block; the components' sizes must be
 * filled in) by building its plan once; fills size, and length when 0 (Σ n_j) and block when 0
 * (64), and definition. PD_EINVAL with a message. */
int pd_mixdef_check(pd_mixdef *d, char *err, size_t errlen);

/* 1 when b is a, 2 when b is a with stages appended (a's stages a prefix of b's, all else equal),
 * 0 otherwise. created_ms is not compared. */
int pd_mixdef_compare(const pd_mixdef *a, const pd_mixdef *b);

/* d's definition hash (the protocol's Mixture.definition, daemon/definition.h): what defines its orders (each component's size and layout as put, L, B, and
 * every stage), not its name or its components' names. Appending a stage changes it. */
uint64_t pd_mixdef_hash(const pd_mixdef *d);

/* The bytes the registry stores (a versioned little-endian encoding), malloc'd. PD_ENOMEM. */
int pd_mixdef_encode(const pd_mixdef *d, uint8_t **out, size_t *len);
/* Back from those bytes. PD_EINVAL for anything malformed; PD_ENOMEM. */
int pd_mixdef_decode(const char *name, const uint8_t *buf, size_t len, pd_mixdef **out);

#endif
