/* Mixture definitions: allocation, the spec's checks (by building a plan), comparison, and the stored encoding. */
#include "daemon/mixdef.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/mixture.h"
#include "daemon/definition.h"

static size_t pd_mixdef_bytes_of(uint32_t components, uint32_t stages)
{
    return sizeof(pd_mixdef) + (size_t)components * sizeof(pd_mixcomp) + (size_t)stages * sizeof(uint64_t) +
           (size_t)stages * components * sizeof(uint32_t);
}

size_t pd_mixdef_bytes(const pd_mixdef *d)
{
    return pd_mixdef_bytes_of(d->components, d->stages);
}

int pd_mixdef_alloc(const char *name, uint32_t components, uint32_t stages, pd_mixdef **out)
{
    if (pd_name_check(name) || components == 0 || components > PD_MIX_COMPONENTS_MAX || stages == 0 ||
        stages > PD_MIX_STAGES_MAX)
        return PD_EINVAL;
    /* One block: the struct, then its arrays (8-byte members first). */
    pd_mixdef *d = calloc(1, pd_mixdef_bytes_of(components, stages));
    if (!d)
        return PD_ENOMEM;
    atomic_init(&d->refs, 1);
    strcpy(d->name, name);
    d->components = components;
    d->stages = stages;
    d->comp = (pd_mixcomp *)(d + 1);
    d->starts = (uint64_t *)(d->comp + components);
    d->weights = (uint32_t *)(d->starts + stages);
    *out = d;
    return 0;
}

pd_mixdef *pd_mixdef_ref(pd_mixdef *d)
{
    if (d)
        atomic_fetch_add(&d->refs, 1);
    return d;
}

void pd_mixdef_release(pd_mixdef *d)
{
    if (d && atomic_fetch_sub(&d->refs, 1) == 1)
        free(d);
}

int pd_mixdef_check(pd_mixdef *d, char *err, size_t errlen)
{
    uint64_t n = 0;
    for (uint32_t j = 0; j < d->components; j++) {
        if (d->comp[j].size == 0 || d->comp[j].size > PD_N_MAX - n) {
            pd_errf(err, errlen, "the components' sizes must sum to at most 2^63");
            return PD_EINVAL;
        }
        n += d->comp[j].size;
    }
    d->size = n;
    if (!d->length)
        d->length = n;
    if (!d->block)
        d->block = PD_MIX_BLOCK_DEFAULT;
    /* The core decides what a valid mixture is: a plan over flat components of these sizes (a
     * sharded component's layout changes no rule of the spec). */
    pd_mix_component *comps = calloc(d->components, sizeof *comps);
    size_t bytes = pd_mix_bytes(d->components, d->stages);
    void *mem = bytes ? malloc(bytes) : NULL;
    int rc = PD_ENOMEM;
    if (comps && mem) {
        for (uint32_t j = 0; j < d->components; j++) {
            comps[j].size = d->comp[j].size;
            comps[j].window = 1;
            comps[j].lanes = 1;
        }
        pd_mix plan;
        rc = pd_mix_init(&plan, 0, comps, d->components, d->length, d->block, d->starts, d->weights, d->stages, mem,
                         bytes);
        /* The core says which rule the definition breaks; the list is for a failure it does not explain. */
        if (rc && !pd_mix_check(comps, d->components, d->length, d->block, d->starts, d->weights, d->stages, err,
                                errlen))
            pd_errf(err, errlen,
                    "not a mixture the spec allows: stages start at 0 then increase in multiples of block, "
                    "block is a power of two in [%u, %u], each stage's weights sum to between 1 and 2^32 - 1, "
                    "and length is at least 1",
                    PD_MIX_BLOCK_MIN, PD_MIX_BLOCK_MAX);
    } else if (!bytes) {
        rc = PD_EINVAL;
        pd_errf(err, errlen, "too many components or stages");
    }
    free(mem);
    free(comps);
    if (rc == 0)
        d->definition = pd_mixdef_hash(d);
    return rc;
}

static int pd_mixcomp_equal(const pd_mixcomp *a, const pd_mixcomp *b)
{
    return !strcmp(a->name, b->name) && a->size == b->size && a->shards == b->shards && a->window == b->window &&
           a->lanes == b->lanes && a->layout_hash == b->layout_hash;
}

int pd_mixdef_compare(const pd_mixdef *a, const pd_mixdef *b)
{
    if (strcmp(a->name, b->name) || a->components != b->components || a->length != b->length ||
        a->block != b->block || b->stages < a->stages)
        return 0;
    for (uint32_t j = 0; j < a->components; j++)
        if (!pd_mixcomp_equal(&a->comp[j], &b->comp[j]))
            return 0;
    if (memcmp(a->starts, b->starts, a->stages * sizeof *a->starts) ||
        memcmp(a->weights, b->weights, (size_t)a->stages * a->components * sizeof *a->weights))
        return 0;
    return b->stages == a->stages ? 1 : 2;
}

uint64_t pd_mixdef_hash(const pd_mixdef *d)
{
    uint64_t h = pd_definition_add(0, UINT64_C(0x4d4958)); /* "MIX": never a dataset's */
    h = pd_definition_add(h, d->components);
    h = pd_definition_add(h, d->length);
    h = pd_definition_add(h, d->block);
    for (uint32_t j = 0; j < d->components; j++) {
        const pd_mixcomp *c = &d->comp[j];
        h = pd_definition_add(h, c->size);
        h = pd_definition_add(h, c->shards);
        h = pd_definition_add(h, c->window);
        h = pd_definition_add(h, c->lanes);
        h = pd_definition_add(h, c->layout_hash);
    }
    h = pd_definition_add(h, d->stages);
    for (uint32_t k = 0; k < d->stages; k++) {
        h = pd_definition_add(h, d->starts[k]);
        for (uint32_t j = 0; j < d->components; j++)
            h = pd_definition_add(h, d->weights[(size_t)k * d->components + j]);
    }
    return pd_definition_done(h);
}

/* ---- Encoding: "PDMX" 1, C, S, L, B, then per component its name (length-prefixed) and record,
 * then the starts and the weights. Little-endian, no padding. */

#define PD_MIXDEF_MAGIC "PDMX"
#define PD_MIXDEF_VERSION 1

typedef struct pd_buf {
    uint8_t *p;
    size_t len, cap;
    const uint8_t *r; /* reading: the cursor and what is left */
    size_t left;
    int bad;
} pd_buf;

static void pd_put(pd_buf *b, uint64_t v, unsigned bytes)
{
    for (unsigned i = 0; i < bytes; i++, v >>= 8)
        b->p[b->len++] = (uint8_t)v;
}

static uint64_t pd_get(pd_buf *b, unsigned bytes)
{
    uint64_t v = 0;
    if (b->left < bytes) {
        b->bad = 1;
        return 0;
    }
    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)b->r[i] << (8 * i);
    b->r += bytes;
    b->left -= bytes;
    return v;
}

int pd_mixdef_encode(const pd_mixdef *d, uint8_t **out, size_t *len)
{
    size_t cap = 4 + 4 + 4 + 4 + 8 + 4 + (size_t)d->components * (2 + PD_NAME_MAX + 8 * 4 + 4) +
                 (size_t)d->stages * (8 + 4 * (size_t)d->components);
    pd_buf b = {.p = malloc(cap), .cap = cap};
    if (!b.p)
        return PD_ENOMEM;
    memcpy(b.p, PD_MIXDEF_MAGIC, 4);
    b.len = 4;
    pd_put(&b, PD_MIXDEF_VERSION, 4);
    pd_put(&b, d->components, 4);
    pd_put(&b, d->stages, 4);
    pd_put(&b, d->length, 8);
    pd_put(&b, d->block, 4);
    for (uint32_t j = 0; j < d->components; j++) {
        const pd_mixcomp *c = &d->comp[j];
        size_t n = strlen(c->name);
        pd_put(&b, n, 2);
        memcpy(b.p + b.len, c->name, n);
        b.len += n;
        pd_put(&b, c->size, 8);
        pd_put(&b, c->shards, 8);
        pd_put(&b, c->window, 8);
        pd_put(&b, c->lanes, 4);
        pd_put(&b, c->layout_hash, 8);
    }
    for (uint32_t k = 0; k < d->stages; k++)
        pd_put(&b, d->starts[k], 8);
    for (size_t i = 0; i < (size_t)d->stages * d->components; i++)
        pd_put(&b, d->weights[i], 4);
    *out = b.p;
    *len = b.len;
    return 0;
}

int pd_mixdef_decode(const char *name, const uint8_t *buf, size_t len, pd_mixdef **out)
{
    pd_buf b = {.r = buf, .left = len};
    if (len < 4 || memcmp(buf, PD_MIXDEF_MAGIC, 4))
        return PD_EINVAL;
    b.r += 4;
    b.left -= 4;
    uint32_t version = (uint32_t)pd_get(&b, 4);
    uint32_t components = (uint32_t)pd_get(&b, 4), stages = (uint32_t)pd_get(&b, 4);
    if (b.bad || version != PD_MIXDEF_VERSION || components == 0 || components > PD_MIX_COMPONENTS_MAX ||
        stages == 0 || stages > PD_MIX_STAGES_MAX)
        return PD_EINVAL;
    /* The counts come from the blob: a damaged one must not size an allocation it cannot fill. Each
     * component takes at least 39 bytes (a one-byte name), each stage 8 and each weight 4. */
    if (b.left < 12 + (uint64_t)components * 39 + (uint64_t)stages * 8 + (uint64_t)stages * components * 4)
        return PD_EINVAL;
    pd_mixdef *d;
    int rc = pd_mixdef_alloc(name, components, stages, &d);
    if (rc)
        return rc;
    d->length = pd_get(&b, 8);
    d->block = (uint32_t)pd_get(&b, 4);
    for (uint32_t j = 0; j < components && !b.bad; j++) {
        pd_mixcomp *c = &d->comp[j];
        size_t n = (size_t)pd_get(&b, 2);
        if (n == 0 || n > PD_NAME_MAX || n > b.left) {
            b.bad = 1;
            break;
        }
        memcpy(c->name, b.r, n);
        c->name[n] = '\0';
        b.r += n;
        b.left -= n;
        c->size = pd_get(&b, 8);
        c->shards = pd_get(&b, 8);
        c->window = pd_get(&b, 8);
        c->lanes = (uint32_t)pd_get(&b, 4);
        c->layout_hash = pd_get(&b, 8);
        b.bad |= pd_name_check(c->name) != 0;
    }
    for (uint32_t k = 0; k < stages && !b.bad; k++)
        d->starts[k] = pd_get(&b, 8);
    for (size_t i = 0; i < (size_t)stages * components && !b.bad; i++)
        d->weights[i] = (uint32_t)pd_get(&b, 4);
    if (b.bad || b.left || pd_mixdef_check(d, NULL, 0)) {
        pd_mixdef_release(d);
        return PD_EINVAL;
    }
    *out = d;
    return 0;
}
