/* The AVX-512F kernel: VariablePhilox on 16 lanes of 32 bits per register, cycle-walked in lockstep or by native compress/expand refill. */
#include "cpu/kernel.h"

#include <immintrin.h>

/*
 * Same plan as kernel_avx2.c (read its opening comment first), with what
 * AVX-512F adds: 16 lanes, opmask registers instead of vector masks, a
 * 3-input logic instruction (vpternlogd) that fuses the round's xor/xor and
 * or/and pairs, unsigned compares, and vpcompressd/vpexpandd, which do in
 * one instruction what the AVX2 kernel does with lookup tables. Only
 * AVX-512F is used, so any AVX-512 CPU (Skylake-SP on, Zen 4 on) runs it.
 * Compress goes to a register and then to memory: the memory form of
 * vpcompressd is microcoded and very slow on Zen 4.
 */

#define PD_AI static inline __attribute__((always_inline))
#define VW 16        /* lanes per vector */
#define NV 4         /* vectors in flight (32 zmm registers leave room) */
#define LANES (VW * NV)
#define OBUF 1024

/* vpternlogd truth tables, indexed by (a, b, c) = (0xF0, 0xCC, 0xAA). */
#define PD_TL_XOR3 0x96     /* a ^ b ^ c */
#define PD_TL_OR_AND 0xA8   /* (a | b) & c */

typedef struct avx512_ctx {
    __m512i k[PD_ROUNDS];
    __m512i m_lo, m_hi, m_lo_d;
    __m512i lmask, rmask;
    __m128i lbits, rbits;
    __m512i n_m1;        /* narrow: n - 1 */
    __m512i n_hi, n_lo;  /* wide: n >> rbits, n & rmask */
    __mmask16 flip;      /* all lanes if f swaps the images 0 and 1, else none */
    __m512i first32, stride32, first64, stride64, count;
    const pd__run *run;
} avx512_ctx;

PD_AI __m512i iota16(void)
{
    return _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
}

/* ---- One evaluation of VariablePhilox */

PD_AI void vp_round(const avx512_ctx *c, int i, __m512i *s0, __m512i *s1, const int d)
{
    /* hi32(M0·s0) = hi32(m_lo·s0) + lo32(m_hi·s0), as in kernel_avx2.c. The
     * even lanes' high words sit in odd positions of the vpmuludq product;
     * one merge-masked vpshufd moves them down over the odd lanes' product. */
    const __m512i e = _mm512_mul_epu32(*s0, c->m_lo);
    const __m512i o = _mm512_mul_epu32(_mm512_srli_epi64(*s0, 32), c->m_lo);
    __m512i hi = _mm512_mask_shuffle_epi32(o, 0x5555, e, _MM_PERM_DDBB);
    hi = _mm512_add_epi32(hi, _mm512_mullo_epi32(*s0, c->m_hi));
    const __m512i lo = _mm512_mullo_epi32(*s0, c->m_lo_d);
    *s0 = _mm512_and_si512(_mm512_ternarylogic_epi32(hi, c->k[i], *s1, PD_TL_XOR3), c->lmask);
    if (d)
        *s1 = _mm512_ternarylogic_epi32(lo, _mm512_srl_epi32(*s1, c->lbits), c->rmask, PD_TL_OR_AND);
    else /* s1 >> lbits is 0; junk above rbits is masked once at the end (see kernel_avx2.c) */
        *s1 = lo;
}

PD_AI void vp_eval(const avx512_ctx *c, __m512i s0[NV], __m512i s1[NV], const int d)
{
#pragma GCC unroll 24
    for (int i = 0; i < PD_ROUNDS; i++) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            vp_round(c, i, &s0[v], &s1[v], d);
    }
    if (!d) {
        for (int v = 0; v < NV; v++)
            s1[v] = _mm512_and_si512(s1[v], c->rmask);
    }
}

/* ---- Positions in, ids out */

/* The low 32-bit halves of a's and b's eight 64-bit lanes, in lane order. */
PD_AI __m512i pack_lo32(__m512i a, __m512i b)
{
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    return _mm512_permutex2var_epi32(a, even, b);
}

PD_AI void positions(const avx512_ctx *c, __m512i idx, __m512i *s0, __m512i *s1, const int wide)
{
    if (!wide) { /* positions below n ≤ 2^32: 32-bit arithmetic is exact */
        const __m512i p = _mm512_add_epi32(c->first32, _mm512_mullo_epi32(idx, c->stride32));
        *s0 = _mm512_srl_epi32(p, c->rbits);
        *s1 = _mm512_and_si512(p, c->rmask);
        return;
    }
    const __m512i i0 = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(idx));
    const __m512i i1 = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(idx, 1));
    const __m512i p0 = _mm512_add_epi64(c->first64, _mm512_mul_epu32(i0, c->stride64));
    const __m512i p1 = _mm512_add_epi64(c->first64, _mm512_mul_epu32(i1, c->stride64));
    *s0 = pack_lo32(_mm512_srl_epi64(p0, c->rbits), _mm512_srl_epi64(p1, c->rbits));
    *s1 = _mm512_and_si512(pack_lo32(p0, p1), c->rmask);
}

PD_AI __m512i join(const avx512_ctx *c, __m512i s0, __m512i s1)
{
    return _mm512_or_si512(_mm512_sll_epi32(s0, c->rbits), s1);
}

PD_AI __mmask16 inside_narrow(const avx512_ctx *c, __m512i v)
{
    return _mm512_cmple_epu32_mask(v, c->n_m1);
}

PD_AI __mmask16 inside_wide(const avx512_ctx *c, __m512i s0, __m512i s1)
{
    const __mmask16 lt0 = _mm512_cmplt_epu32_mask(s0, c->n_hi);
    const __mmask16 eq0 = _mm512_cmpeq_epi32_mask(s0, c->n_hi);
    const __mmask16 lt1 = _mm512_cmplt_epu32_mask(s1, c->n_lo);
    return (__mmask16)(lt0 | (eq0 & lt1));
}

/* Parity correction on finished ids only (why: kernel_avx2.c, flip_narrow). */
PD_AI __m512i flip_narrow(const avx512_ctx *c, __m512i v)
{
    const __mmask16 small = (__mmask16)(_mm512_cmplt_epu32_mask(v, _mm512_set1_epi32(2)) & c->flip);
    return _mm512_mask_xor_epi32(v, small, v, _mm512_set1_epi32(1));
}

PD_AI __m512i flip_wide_s1(const avx512_ctx *c, __m512i s0, __m512i s1)
{
    const __m512i hi_bits = _mm512_or_si512(s0, _mm512_srli_epi32(s1, 1));
    const __mmask16 small = (__mmask16)(_mm512_cmpeq_epi32_mask(hi_bits, _mm512_setzero_si512()) & c->flip);
    return _mm512_mask_xor_epi32(s1, small, s1, _mm512_set1_epi32(1));
}

PD_AI void store_narrow(const avx512_ctx *c, uint64_t i, __m512i v)
{
    if (c->run->width == 4) {
        _mm512_storeu_si512((uint32_t *)c->run->out + i, v);
    } else {
        uint64_t *out = (uint64_t *)c->run->out + i;
        _mm512_storeu_si512(out, _mm512_cvtepu32_epi64(_mm512_castsi512_si256(v)));
        _mm512_storeu_si512(out + 8, _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(v, 1)));
    }
}

PD_AI void store_wide(const avx512_ctx *c, uint64_t i, __m512i s0, __m512i s1)
{
    uint64_t *out = (uint64_t *)c->run->out + i;
    const __m512i a0 = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(s0));
    const __m512i a1 = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(s0, 1));
    const __m512i b0 = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(s1));
    const __m512i b1 = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(s1, 1));
    _mm512_storeu_si512(out, _mm512_or_si512(_mm512_sll_epi64(a0, c->rbits), b0));
    _mm512_storeu_si512(out + 8, _mm512_or_si512(_mm512_sll_epi64(a1, c->rbits), b1));
}

static void scalar_tail(const pd__run *r, uint64_t from)
{
    pd__run rest = *r;
    rest.first += from * r->stride;
    rest.count -= from;
    rest.out = (char *)r->out + from * r->width;
    pd__run_scalar(&rest);
}

/* ---- n = 2^b: nothing walks */

PD_AI void walk_none(const avx512_ctx *c, const int d, const int wide)
{
    const pd__run *r = c->run;
    uint64_t i = 0;
    for (; i + LANES <= r->count; i += LANES) {
        __m512i s0[NV], s1[NV];
        for (int v = 0; v < NV; v++)
            positions(c, _mm512_add_epi32(_mm512_set1_epi32((int)(i + VW * v)), iota16()), &s0[v], &s1[v], wide);
        vp_eval(c, s0, s1, d);
        for (int v = 0; v < NV; v++) {
            if (wide)
                store_wide(c, i + VW * v, s0[v], flip_wide_s1(c, s0[v], s1[v]));
            else
                store_narrow(c, i + VW * v, flip_narrow(c, join(c, s0[v], s1[v])));
        }
    }
    scalar_tail(r, i);
}

/* ---- Lockstep: the naive baseline (see kernel_avx2.c) */

PD_AI void walk_lockstep(const avx512_ctx *c, const int d, const int wide)
{
    const pd__run *r = c->run;
    uint64_t i = 0;
    for (; i + LANES <= r->count; i += LANES) {
        __m512i s0[NV], s1[NV], r0[NV], r1[NV];
        __mmask16 fin[NV];
        for (int v = 0; v < NV; v++) {
            positions(c, _mm512_add_epi32(_mm512_set1_epi32((int)(i + VW * v)), iota16()), &s0[v], &s1[v], wide);
            r0[v] = r1[v] = _mm512_setzero_si512();
            fin[v] = 0;
        }
        for (;;) {
            vp_eval(c, s0, s1, d);
            int all = 1;
            for (int v = 0; v < NV; v++) {
                __mmask16 in;
                if (wide) {
                    in = inside_wide(c, s0[v], s1[v]);
                    const __mmask16 now = (__mmask16)(in & ~fin[v]);
                    r0[v] = _mm512_mask_mov_epi32(r0[v], now, s0[v]);
                    r1[v] = _mm512_mask_mov_epi32(r1[v], now, s1[v]);
                } else {
                    const __m512i val = join(c, s0[v], s1[v]);
                    in = inside_narrow(c, val);
                    r0[v] = _mm512_mask_mov_epi32(r0[v], (__mmask16)(in & ~fin[v]), val);
                }
                fin[v] = (__mmask16)(fin[v] | in);
                all &= fin[v] == 0xFFFF;
            }
            if (all)
                break;
        }
        for (int v = 0; v < NV; v++) {
            if (wide)
                store_wide(c, i + VW * v, r0[v], flip_wide_s1(c, r0[v], r1[v]));
            else
                store_narrow(c, i + VW * v, flip_narrow(c, r0[v]));
        }
    }
    scalar_tail(r, i);
}

/* ---- Refill with vpcompressd / vpexpandd (the idea: kernel_avx2.c, walk_refill).
 * Finished lanes are compressed (ids and output indices) to a buffer that is
 * scattered in batches; vpexpandd hands the indices next, next + 1, … to the
 * finished lanes in lane order. */

typedef struct outbuf {
    uint32_t v[OBUF + LANES], v1[OBUF + LANES], idx[OBUF + LANES];
    uint32_t n;
} outbuf;

PD_AI void outbuf_flush(const avx512_ctx *c, outbuf *b, const int wide)
{
    const pd__run *r = c->run;
    if (wide) {
        const uint32_t rb = r->perm->rbits;
        uint64_t *out = r->out;
        for (uint32_t j = 0; j < b->n; j++)
            out[b->idx[j]] = ((uint64_t)b->v[j] << rb) | b->v1[j];
    } else if (r->width == 4) {
        uint32_t *out = r->out;
        for (uint32_t j = 0; j < b->n; j++)
            out[b->idx[j]] = b->v[j];
    } else {
        uint64_t *out = r->out;
        for (uint32_t j = 0; j < b->n; j++)
            out[b->idx[j]] = b->v[j];
    }
    b->n = 0;
}

PD_AI void walk_refill(const avx512_ctx *c, const int d, const int wide)
{
    const uint32_t count = (uint32_t)c->run->count;
    __m512i s0[NV], s1[NV], idx[NV];
    outbuf buf;
    buf.n = 0;
    for (int v = 0; v < NV; v++) {
        idx[v] = _mm512_add_epi32(_mm512_set1_epi32(VW * v), iota16());
        positions(c, idx[v], &s0[v], &s1[v], wide);
    }
    uint32_t next = LANES, produced = 0;
    while (produced < count) {
        vp_eval(c, s0, s1, d);
        for (int v = 0; v < NV; v++) {
            const __mmask16 live = _mm512_cmplt_epi32_mask(idx[v], c->count);
            __mmask16 done;
            __m512i val;
            if (wide) {
                done = (__mmask16)(inside_wide(c, s0[v], s1[v]) & live);
                const __m512i t1 = flip_wide_s1(c, s0[v], s1[v]);
                _mm512_storeu_si512(buf.v1 + buf.n, _mm512_maskz_compress_epi32(done, t1));
                val = s0[v];
            } else {
                val = join(c, s0[v], s1[v]);
                done = (__mmask16)(inside_narrow(c, val) & live);
                val = flip_narrow(c, val);
            }
            const unsigned k = (unsigned)__builtin_popcount(done);
            _mm512_storeu_si512(buf.v + buf.n, _mm512_maskz_compress_epi32(done, val));
            _mm512_storeu_si512(buf.idx + buf.n, _mm512_maskz_compress_epi32(done, idx[v]));
            buf.n += k;
            const __m512i nidx = _mm512_maskz_expand_epi32(done, _mm512_add_epi32(_mm512_set1_epi32((int)next), iota16()));
            next += k;
            __m512i n0, n1;
            positions(c, nidx, &n0, &n1, wide);
            s0[v] = _mm512_mask_mov_epi32(s0[v], done, n0);
            s1[v] = _mm512_mask_mov_epi32(s1[v], done, n1);
            idx[v] = _mm512_mask_mov_epi32(idx[v], done, nidx);
            produced += k;
        }
        if (buf.n >= OBUF)
            outbuf_flush(c, &buf, wide);
    }
    outbuf_flush(c, &buf, wide);
}

/* ---- Instances and dispatch */

typedef void walk_fn(const avx512_ctx *c);

#define PD_AVX512_INSTANCES(walk)                                               \
    static void walk##_00(const avx512_ctx *c) { walk(c, 0, 0); }               \
    static void walk##_01(const avx512_ctx *c) { walk(c, 0, 1); }               \
    static void walk##_10(const avx512_ctx *c) { walk(c, 1, 0); }               \
    static void walk##_11(const avx512_ctx *c) { walk(c, 1, 1); }               \
    static walk_fn *const walk##_by_shape[2][2] = {{walk##_00, walk##_01}, {walk##_10, walk##_11}};

PD_AVX512_INSTANCES(walk_none)
PD_AVX512_INSTANCES(walk_lockstep)
PD_AVX512_INSTANCES(walk_refill)

static void avx512_ctx_init(avx512_ctx *c, const pd__run *r)
{
    const pd_perm *p = r->perm;
    const uint32_t d = p->rbits - p->lbits;
    for (int i = 0; i < PD_ROUNDS; i++)
        c->k[i] = _mm512_set1_epi32((int)p->keys.k[i]);
    c->m_lo = _mm512_set1_epi32((int)(uint32_t)PD_VP_M0);
    c->m_hi = _mm512_set1_epi32((int)(uint32_t)(PD_VP_M0 >> 32));
    c->m_lo_d = _mm512_set1_epi32((int)((uint32_t)PD_VP_M0 << d));
    c->lmask = _mm512_set1_epi32((int)p->lmask);
    c->rmask = _mm512_set1_epi32((int)p->rmask);
    c->lbits = _mm_cvtsi32_si128((int)p->lbits);
    c->rbits = _mm_cvtsi32_si128((int)p->rbits);
    c->n_m1 = _mm512_set1_epi32((int)(uint32_t)(p->n - 1));
    c->n_hi = _mm512_set1_epi32((int)(uint32_t)(p->n >> p->rbits));
    c->n_lo = _mm512_set1_epi32((int)((uint32_t)p->n & p->rmask));
    c->flip = p->keys.flip ? (__mmask16)0xFFFF : (__mmask16)0;
    c->first32 = _mm512_set1_epi32((int)(uint32_t)r->first);
    c->stride32 = _mm512_set1_epi32((int)(uint32_t)r->stride);
    c->first64 = _mm512_set1_epi64((long long)r->first);
    c->stride64 = _mm512_set1_epi64((long long)r->stride);
    c->count = _mm512_set1_epi32((int)r->count);
    c->run = r;
}

void pd__run_avx512(const pd__run *r)
{
    const pd_perm *p = r->perm;
    avx512_ctx c;
    avx512_ctx_init(&c, r);
    const int d = (int)(p->rbits - p->lbits), wide = p->bits > 32;
    if (p->n == UINT64_C(1) << p->bits)
        walk_none_by_shape[d][wide](&c);
    else if (r->walk == PD_WALK_LOCKSTEP)
        walk_lockstep_by_shape[d][wide](&c);
    else
        walk_refill_by_shape[d][wide](&c);
}
