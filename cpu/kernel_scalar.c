/* The scalar kernel (the core's σ one position at a time, for CPUs without SIMD and short runs), the SIMD kernels' parity fix-up, and the mixture entry points' scalar forms. */
#include "cpu/kernel.h"

void pd__run_scalar_walk(const pd__run *run, int parity)
{
    const pd_perm *p = run->perm;
    uint64_t pos = run->first;
    if (run->width == 4) {
        uint32_t *out = run->out;
        for (uint64_t i = 0; i < run->count; i++, pos += run->stride)
            out[i] = (uint32_t)pd__sigma(p, pos, PD_ROUNDS, parity);
    } else {
        uint64_t *out = run->out;
        for (uint64_t i = 0; i < run->count; i++, pos += run->stride)
            out[i] = pd__sigma(p, pos, PD_ROUNDS, parity);
    }
}

void pd__run_scalar(const pd__run *run)
{
    pd__run_scalar_walk(run, !run->unflipped);
}

void pd__run_fix_parity(const pd__run *run)
{
    const pd_perm *p = run->perm;
    if (!p->keys.flip || run->unflipped)
        return;
    for (uint64_t id = 0; id < 2; id++) {
        const uint64_t q = pd__sigma_inv(p, id, PD_ROUNDS, 0); /* the position whose unflipped walk ends at id */
        if (q < run->first || (q - run->first) % run->stride)
            continue;
        const uint64_t i = (q - run->first) / run->stride;
        if (i >= run->count)
            continue;
        if (run->width == 4)
            ((uint32_t *)run->out)[i] ^= 1;
        else
            ((uint64_t *)run->out)[i] ^= 1;
    }
}

void pd__gather_fix_parity(const pd__run *run)
{
    if (!run->perm->keys.flip || run->unflipped) /* σ = the unflipped walk ^ 1 where it ends below 2 */
        return;
    for (uint64_t i = 0; i < run->count; i++) {
        if (run->width == 4) {
            uint32_t *out = run->out;
            out[i] ^= out[i] < 2;
        } else {
            uint64_t *out = run->out;
            out[i] ^= out[i] < 2;
        }
    }
}

void pd__block_slots_scalar(const pd__block_slots *s)
{
    pd_perm pi = {0}; /* keyed at the first position: no block is numbered UINT64_MAX */
    uint64_t beta = UINT64_MAX, g = s->first;
    for (uint64_t t = 0; t < s->count; t++, g += s->stride) {
        if (g / s->block != beta) { /* keys once per block */
            beta = g / s->block;
            pd__mix_block_keys(s->seed, s->block, beta, &pi);
        }
        s->out[t] = (uint32_t)pd_perm_at(&pi, g & (s->block - 1));
    }
}

void pd__block_group_scalar(const pd__block_group *t)
{
    pd_perm pi;
    for (uint32_t l = 0; l < PD__BLOCK_GROUP; l++) {
        pd__mix_block_keys(t->seed, t->block, t->first + l, &pi);
        for (uint32_t r = 0; r < t->block; r++)
            t->out[pd__block_group_at(l, r)] = (uint8_t)pd_perm_at(&pi, r);
    }
}

void pd__block_group_run(const pd_gen *g, const pd__block_group *t)
{
#if defined(PD_CPU_HAVE_VBMI)
    if (g->isa == PD_ISA_AVX512 && g->vbmi) {
        pd__block_group_vbmi(t);
        return;
    }
#endif
#if defined(PD_CPU_HAVE_AVX2)
    if (g->avx2) { /* AVX-512 without VBMI too; never an emulated AVX-512 on a CPU without AVX2 */
        pd__block_group_avx2(t);
        return;
    }
#endif
    (void)g;
    pd__block_group_scalar(t);
}

void pd__block_slots_run(const pd_gen *g, const pd__block_slots *s)
{
#if defined(PD_CPU_HAVE_VBMI)
    if (g->isa == PD_ISA_AVX512 && g->vbmi && s->count >= PD__SIMD_MIN) {
        pd__block_slots_vbmi(s);
        return;
    }
#endif
#if defined(PD_CPU_HAVE_AVX512)
    if (g->isa == PD_ISA_AVX512 && s->count >= PD__SIMD_MIN) {
        pd__block_slots_avx512(s);
        return;
    }
#endif
#if defined(PD_CPU_HAVE_AVX2)
    if (g->isa == PD_ISA_AVX2 && s->count >= PD__SIMD_MIN) {
        pd__block_slots_avx2(s);
        return;
    }
#endif
    (void)g;
    pd__block_slots_scalar(s);
}

uint64_t pd__group_reads_scalar(const uint32_t *comp, uint64_t n, uint32_t j, uint32_t *idx)
{
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        idx[k] = (uint32_t)i; /* kept only where it matches: no branch on random components */
        k += comp[i] == j;
    }
    return k;
}

uint64_t pd__group_reads_run(const pd_gen *g, const uint32_t *comp, uint64_t n, uint32_t j, uint32_t *idx)
{
#if defined(PD_CPU_HAVE_AVX2)
    if (g->avx2)
        return pd__group_reads_avx2(comp, n, j, idx);
#endif
    (void)g;
    return pd__group_reads_scalar(comp, n, j, idx);
}

void pd__gather_run(const pd_gen *g, const pd__run *run, const uint64_t *positions)
{
#if defined(PD_CPU_HAVE_AVX512)
    if (g->isa == PD_ISA_AVX512 && run->count >= PD__SIMD_MIN && run->perm->n > 1) {
        pd__gather_avx512(run, positions);
        return;
    }
#endif
#if defined(PD_CPU_HAVE_AVX2)
    if (g->isa == PD_ISA_AVX2 && run->count >= PD__SIMD_MIN && run->perm->n > 1) {
        pd__gather_avx2(run, positions);
        return;
    }
#endif
    (void)g;
    pd__gather_scalar(run, positions);
}

void pd__segment_draws_run(const pd_gen *g, const pd__segment_draws *x)
{
#if defined(PD_CPU_HAVE_AVX2)
    if (g->avx2) {
        pd__segment_draws_avx2(x);
        return;
    }
#endif
    (void)g;
    for (uint64_t i = 0; i < x->count; i++)
        pd__segment_draw(x, i);
}

void pd__batch_run(const pd_gen *g, const pd__batch *b)
{
    switch (g->isa) {
#ifdef PD_CPU_HAVE_AVX2
    case PD_ISA_AVX2:
        pd__batch_avx2(b);
        return;
#endif
#ifdef PD_CPU_HAVE_AVX512
    case PD_ISA_AVX512: {
        unsigned narrow = 1, lbits = 0;
        for (unsigned r = 0; r < b->nruns; r++) {
            narrow &= pd__batch_narrow(g, b->perm[r]);
            lbits = b->perm[r]->lbits > lbits ? b->perm[r]->lbits : lbits;
        }
        /* Bytes are faster than words but for b of 16 or 17, whose
         * 256-entry tables take four registers (uneven shards of K = 64: 5-10% faster on words, on
         * Zen 5 and on the H100 host's Xeon). */
        const int words = narrow && g->bw && (!g->vbmi || lbits == 8);
        (void)words;
#ifdef PD_CPU_HAVE_BW
        if (words) {
            pd__batch_bw(b);
            return;
        }
#endif
#ifdef PD_CPU_HAVE_VBMI
        if (narrow && g->vbmi) {
            pd__batch_vbmi(b);
            return;
        }
#endif
        pd__batch_avx512(b);
        return;
    }
#endif
    default:
        pd__batch_scalar(b);
    }
}

void pd__gather_scalar(const pd__run *run, const uint64_t *positions)
{
    for (uint64_t i = 0; i < run->count; i++) {
        const uint64_t id = run->unflipped ? pd__sigma(run->perm, positions[i], PD_ROUNDS, 0)
                                           : pd_perm_at(run->perm, positions[i]);
        if (run->width == 4)
            ((uint32_t *)run->out)[i] = (uint32_t)id;
        else
            ((uint64_t *)run->out)[i] = id;
    }
}
