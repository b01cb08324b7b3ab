/* The AVX-512 kernel (F and BW): VariablePhilox on 32 lanes of 16 bits per register for b ≤ 32 (16 of 32 bits above), cycle-walked in lockstep, by compress/expand refill, or by compaction. */
#include "cpu/kernel.h"

#ifdef PD_CPU_AVX512_EMULATED /* tests on CPUs without AVX-512: see avx512_emu.h */
#include "cpu/avx512_emu.h"
#else
#include <immintrin.h>
#endif
#include "cpu/words_avx512.h"

/*
 * Same plan as kernel_avx2.c (read its opening comment and its walks'
 * comments first), with what AVX-512F adds: 16 lanes, opmask registers
 * instead of vector masks, unsigned compares (so ids of 32 bits need no
 * special case), a 3-input logic instruction (vpternlogd) that fuses the
 * round's xor/xor and or/and pairs, and vpcompressd/vpexpandd, which do in
 * one instruction what the AVX2 kernel does with lookup tables. AVX-512F
 * and, for one multiply (pd_mul_lo), BW: every AVX-512 CPU from Skylake-SP
 * and Zen 4 on has both (the Xeon Phi, F alone, runs the AVX2 kernel).
 * Compress goes to a register and then to memory: the memory form of
 * vpcompressd is microcoded and very slow on Zen 4.
 */

#ifdef PD_CPU_AVX512_EMULATED /* emulated intrinsics unrolled 96 times would take the compiler ages */
#define PD_AI static inline
#define PD_UNROLL(n)
#else
#define PD_AI static inline __attribute__((always_inline))
#define PD_UNROLL(n) _Pragma(PD_STR(GCC unroll n))
#endif
#define PD_STR(x) #x
#define VW 16        /* lanes per vector */
#define NV 4         /* vectors in flight in the refill walks (32 zmm registers leave room) */
#define LANES (VW * NV)
#define CNV 8        /* vectors per group where groups are independent (4 word vectors: vp_eval_words) */
#define CLANES (VW * CNV)
#define OBUF 1024

/* vpternlogd truth tables, indexed by (a, b, c) = (0xF0, 0xCC, 0xAA). */
#define PD_TL_XOR3 0x96   /* a ^ b ^ c */
#define PD_TL_OR_AND 0xA8 /* (a | b) & c */

typedef struct avx512_ctx {
    __m512i k[PD_ROUNDS];
    __m512i m_lo, m_hi, m_lo_d;
    __m512i lmask, rmask;
    __m512i kw[PD_ROUNDS];           /* word lanes (vp_eval_words): the key's low 16 bits in every word */
    __m512i lmask_w, rmask_w, top_w; /*   the masks, and 2^lbits (s1's bit that d = 1 shifts in) */
    __m512i m_lo_d_w;                /*   lo16(M0) << d */
    __m128i lbits, rbits;
    __m512i n_m1;       /* narrow: n - 1 */
    __m512i n_hi, n_lo; /* wide: n >> rbits, n & rmask */
    __m512i first32, stride32, first64, stride64, count;
    const pd__run *run;
} avx512_ctx;

PD_AI __m512i iota16(void)
{
    return _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
}

/* ---- One evaluation of VariablePhilox */

/* a·m mod 2^32 in each lane, or, unless wide, only its low 16 bits (0 above) where a < 2^16: the round
 * reads no more of either product when b ≤ 32 (halves of at most 16 bits, masked by lmask and rmask).
 * vpmullw is one uop where vpmulld is two (10 cycles' latency on Intel), on the port the round's
 * vpmuludq also take: flat σ on b = 25 and 26 ran 13-20% faster (2-core Xeon, 2026-11-27). */
PD_AI __m512i pd_mul_lo(__m512i a, __m512i m, const int wide)
{
    return wide ? _mm512_mullo_epi32(a, m) : _mm512_mullo_epi16(a, m);
}

/* wide: b > 32 (n > 2^32), whose halves have up to 32 bits. */
PD_AI void vp_round(const avx512_ctx *c, int i, __m512i *s0, __m512i *s1, const int d, const int wide)
{
    /* hi32(M0·s0) = hi32(m_lo·s0) + lo32(m_hi·s0), as in kernel_avx2.c. The
     * even lanes' high words sit in odd positions of the vpmuludq product;
     * one merge-masked vpshufd moves them down over the odd lanes' product. */
    const __m512i e = _mm512_mul_epu32(*s0, c->m_lo);
    const __m512i o = _mm512_mul_epu32(_mm512_srli_epi64(*s0, 32), c->m_lo);
    __m512i hi = _mm512_mask_shuffle_epi32(o, 0x5555, e, _MM_PERM_DDBB);
    hi = _mm512_add_epi32(hi, pd_mul_lo(*s0, c->m_hi, wide));
    const __m512i lo = pd_mul_lo(*s0, c->m_lo_d, wide);
    *s0 = _mm512_and_si512(_mm512_ternarylogic_epi32(hi, c->k[i], *s1, PD_TL_XOR3), c->lmask);
    if (d)
        *s1 = _mm512_ternarylogic_epi32(lo, _mm512_srl_epi32(*s1, c->lbits), c->rmask, PD_TL_OR_AND);
    else /* s1 >> lbits is 0; junk above rbits is masked once at the end (see kernel_avx2.c) */
        *s1 = lo;
}

/* Word lanes (b ≤ 32): words_avx512.h's round, nv (even) vectors of u32 as nv / 2 of words. */
PD_AI void vp_eval_words(const avx512_ctx *c, __m512i *s0, __m512i *s1, const int nv, const int d)
{
    __m512i w0[CNV / 2], w1[CNV / 2];
    for (int j = 0; j < nv / 2; j++) {
        w0[j] = pd__w16_pack(s0[2 * j], s0[2 * j + 1]);
        w1[j] = pd__w16_pack(s1[2 * j], s1[2 * j + 1]);
    }
    PD_UNROLL(24)
    for (int i = 0; i < PD_ROUNDS; i++)
        for (int j = 0; j < nv / 2; j++)
            pd__w16_round(&w0[j], &w1[j], c->kw[i], c->lmask_w, c->m_lo_d_w, c->top_w, d);
    for (int j = 0; j < nv / 2; j++) {
        pd__w16_unpack(w0[j], s0 + 2 * j);
        pd__w16_unpack(_mm512_and_si512(w1[j], c->rmask_w), s1 + 2 * j);
    }
}

/* 32-bit lanes, at most 4 vectors (8 would spill). */
PD_AI void vp_eval_32(const avx512_ctx *c, __m512i *s0, __m512i *s1, const int nv, const int d, const int wide)
{
    PD_UNROLL(24)
    for (int i = 0; i < PD_ROUNDS; i++) {
        PD_UNROLL(4)
        for (int v = 0; v < nv; v++)
            vp_round(c, i, &s0[v], &s1[v], d, wide);
    }
    if (!d) {
        for (int v = 0; v < nv; v++)
            s1[v] = _mm512_and_si512(s1[v], c->rmask);
    }
}

/* nv vectors: on word lanes unless wide (b > 32) or nv is odd, else 4 at a time on 32-bit lanes. */
PD_AI void vp_eval_n(const avx512_ctx *c, __m512i *s0, __m512i *s1, const int nv, const int d, const int wide)
{
    if (!wide && nv % 2 == 0) {
        vp_eval_words(c, s0, s1, nv, d);
        return;
    }
    for (int v = 0; v < nv; v += 4)
        vp_eval_32(c, s0 + v, s1 + v, nv - v < 4 ? nv - v : 4, d, wide);
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

PD_AI __m512i idx_from(uint32_t i)
{
    return _mm512_add_epi32(_mm512_set1_epi32((int)i), iota16());
}

PD_AI __m512i join(const avx512_ctx *c, __m512i s0, __m512i s1)
{
    return _mm512_or_si512(_mm512_sll_epi32(s0, c->rbits), s1);
}

/* Which lanes are inside [0, n); narrow lanes also get their joined id. */
PD_AI __mmask16 inside(const avx512_ctx *c, __m512i s0, __m512i s1, __m512i *val, const int wide)
{
    if (!wide) {
        *val = join(c, s0, s1);
        return _mm512_cmple_epu32_mask(*val, c->n_m1);
    }
    *val = s0;
    const __mmask16 lt0 = _mm512_cmplt_epu32_mask(s0, c->n_hi);
    const __mmask16 eq0 = _mm512_cmpeq_epi32_mask(s0, c->n_hi);
    const __mmask16 lt1 = _mm512_cmplt_epu32_mask(s1, c->n_lo);
    return (__mmask16)(lt0 | (eq0 & lt1));
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

/* Ids of the lanes whose value is inside: narrow val, or wide (val, s1) = (s0, s1). */
PD_AI void store_ids(const avx512_ctx *c, uint64_t i, __m512i val, __m512i s1, const int wide)
{
    if (wide)
        store_wide(c, i, val, s1);
    else
        store_narrow(c, i, val);
}

static void scalar_tail(const pd__run *r, uint64_t from)
{
    pd__run rest = *r;
    rest.first += from * r->stride;
    rest.count -= from;
    rest.out = (char *)r->out + from * r->width;
    pd__run_scalar_walk(&rest, 0); /* the parity is fixed for the whole run at the end */
}

/* ---- n = 2^b: nothing walks */

PD_AI void walk_none(const avx512_ctx *c, const int d, const int wide)
{
    const pd__run *r = c->run;
    uint64_t i = 0;
    for (; i + CLANES <= r->count; i += CLANES) {
        __m512i s0[CNV], s1[CNV];
        for (int v = 0; v < CNV; v++)
            positions(c, idx_from((uint32_t)i + VW * v), &s0[v], &s1[v], wide);
        vp_eval_n(c, s0, s1, CNV, d, wide);
        for (int v = 0; v < CNV; v++)
            store_ids(c, i + VW * v, wide ? s0[v] : join(c, s0[v], s1[v]), s1[v], wide);
    }
    scalar_tail(r, i);
}

/* ---- Lockstep: the naive baseline */

PD_AI void walk_lockstep(const avx512_ctx *c, const int d, const int wide)
{
    const pd__run *r = c->run;
    uint64_t i = 0;
    for (; i + LANES <= r->count; i += LANES) {
        __m512i s0[NV], s1[NV], r0[NV], r1[NV];
        __mmask16 fin[NV];
        for (int v = 0; v < NV; v++) {
            positions(c, idx_from((uint32_t)i + VW * v), &s0[v], &s1[v], wide);
            r0[v] = r1[v] = _mm512_setzero_si512();
            fin[v] = 0;
        }
        for (;;) {
            vp_eval_n(c, s0, s1, NV, d, wide);
            int all = 1;
            for (int v = 0; v < NV; v++) {
                __m512i val;
                const __mmask16 in = inside(c, s0[v], s1[v], &val, wide);
                const __mmask16 now = (__mmask16)(in & ~fin[v]);
                r0[v] = _mm512_mask_mov_epi32(r0[v], now, val);
                r1[v] = _mm512_mask_mov_epi32(r1[v], now, s1[v]);
                fin[v] = (__mmask16)(fin[v] | in);
                all &= fin[v] == 0xFFFF;
            }
            if (all)
                break;
        }
        for (int v = 0; v < NV; v++)
            store_ids(c, i + VW * v, r0[v], r1[v], wide);
    }
    scalar_tail(r, i);
}

/* ---- Finished ids waiting to be scattered (see kernel_avx2.c, outbuf) */

typedef struct outbuf {
    uint32_t v[OBUF + CLANES], v1[OBUF + CLANES], idx[OBUF + CLANES];
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

/* Compress-store the lanes m selects. */
PD_AI void outbuf_push(outbuf *b, __mmask16 m, __m512i val, __m512i s1, __m512i idx, const int wide)
{
    if (wide)
        _mm512_storeu_si512(b->v1 + b->n, _mm512_maskz_compress_epi32(m, s1));
    _mm512_storeu_si512(b->v + b->n, _mm512_maskz_compress_epi32(m, val));
    _mm512_storeu_si512(b->idx + b->n, _mm512_maskz_compress_epi32(m, idx));
    b->n += (unsigned)__builtin_popcount(m);
}

/* ---- Refill with vpcompressd / vpexpandd (the idea: kernel_avx2.c, walk_refill) */

typedef struct lanes {
    __m512i s0[NV], s1[NV], idx[NV];
    uint32_t next, produced;
} lanes;

PD_AI void refill_step(const avx512_ctx *c, lanes *L, outbuf *buf, const int d, const int wide, const int drain)
{
    vp_eval_n(c, L->s0, L->s1, NV, d, wide);
    for (int v = 0; v < NV; v++) {
        __m512i val;
        __mmask16 done = inside(c, L->s0[v], L->s1[v], &val, wide);
        if (drain)
            done = (__mmask16)(done & _mm512_cmplt_epi32_mask(L->idx[v], c->count));
        const unsigned k = (unsigned)__builtin_popcount(done);
        outbuf_push(buf, done, val, L->s1[v], L->idx[v], wide);
        /* vpexpandd hands next, next + 1, … to the finished lanes in lane order. */
        const __m512i nidx = _mm512_maskz_expand_epi32(done, idx_from(L->next));
        L->next += k;
        L->produced += k;
        __m512i n0, n1;
        positions(c, nidx, &n0, &n1, wide);
        L->s0[v] = _mm512_mask_mov_epi32(L->s0[v], done, n0);
        L->s1[v] = _mm512_mask_mov_epi32(L->s1[v], done, n1);
        L->idx[v] = _mm512_mask_mov_epi32(L->idx[v], done, nidx);
    }
    if (buf->n >= OBUF)
        outbuf_flush(c, buf, wide);
}

PD_AI void walk_refill(const avx512_ctx *c, const int d, const int wide)
{
    const uint32_t count = (uint32_t)c->run->count; /* ≥ PD__SIMD_MIN ≥ LANES */
    lanes L;
    outbuf buf;
    buf.n = 0;
    for (int v = 0; v < NV; v++) {
        L.idx[v] = idx_from(VW * v);
        positions(c, L.idx[v], &L.s0[v], &L.s1[v], wide);
    }
    L.next = LANES;
    L.produced = 0;
    while (L.next + LANES <= count)
        refill_step(c, &L, &buf, d, wide, 0);
    while (L.produced < count)
        refill_step(c, &L, &buf, d, wide, 1);
    outbuf_flush(c, &buf, wide);
}

/* ---- Compaction passes (the idea: kernel_avx2.c, walk_compact) */

#define BLOCK (1024 / CLANES * CLANES)
#define QCAP (BLOCK / 2 + BLOCK + CLANES)

typedef struct queue {
    uint32_t s0[QCAP + CLANES], s1[QCAP + CLANES], idx[QCAP + CLANES];
    uint32_t n;
} queue;

PD_AI void queue_push_at(queue *q, uint32_t at, __mmask16 m, __m512i s0, __m512i s1, __m512i idx)
{
    _mm512_storeu_si512(q->s0 + at, _mm512_maskz_compress_epi32(m, s0));
    _mm512_storeu_si512(q->s1 + at, _mm512_maskz_compress_epi32(m, s1));
    _mm512_storeu_si512(q->idx + at, _mm512_maskz_compress_epi32(m, idx));
}

PD_AI void compact_first(const avx512_ctx *c, queue *q, uint32_t i, const int d, const int wide)
{
    __m512i s0[CNV], s1[CNV], idx[CNV];
    for (int v = 0; v < CNV; v++) {
        idx[v] = idx_from(i + VW * v);
        positions(c, idx[v], &s0[v], &s1[v], wide);
    }
    vp_eval_n(c, s0, s1, CNV, d, wide);
    for (int v = 0; v < CNV; v++) {
        __m512i val;
        const __mmask16 out = (__mmask16)~inside(c, s0[v], s1[v], &val, wide);
        store_ids(c, i + VW * v, val, s1[v], wide); /* lanes still outside are overwritten later */
        queue_push_at(q, q->n, out, s0[v], s1[v], idx[v]);
        q->n += (unsigned)__builtin_popcount(out);
    }
}

/* One pass over the queue's whole groups of nv vectors (CNV, or 2 in the drain); a shorter rest stays queued. */
PD_AI void compact_pass(const avx512_ctx *c, queue *q, outbuf *buf, const int d, const int wide, const int nv)
{
    uint32_t r = 0, w = 0;
    for (; r + VW * nv <= q->n; r += VW * nv) {
        __m512i s0[CNV], s1[CNV], idx[CNV];
        for (int v = 0; v < nv; v++) {
            s0[v] = _mm512_loadu_si512(q->s0 + r + VW * v);
            s1[v] = _mm512_loadu_si512(q->s1 + r + VW * v);
            idx[v] = _mm512_loadu_si512(q->idx + r + VW * v);
        }
        vp_eval_n(c, s0, s1, nv, d, wide);
        for (int v = 0; v < nv; v++) {
            __m512i val;
            const __mmask16 in = inside(c, s0[v], s1[v], &val, wide);
            outbuf_push(buf, in, val, s1[v], idx[v], wide);
            queue_push_at(q, w, (__mmask16)~in, s0[v], s1[v], idx[v]); /* w ≤ r + VW·v: only loaded entries */
            w += (unsigned)__builtin_popcount((__mmask16)~in);
        }
        if (buf->n >= OBUF)
            outbuf_flush(c, buf, wide);
    }
    for (; r < q->n; r++, w++) {
        q->s0[w] = q->s0[r];
        q->s1[w] = q->s1[r];
        q->idx[w] = q->idx[r];
    }
    q->n = w;
}

/* Empty the queue: whole groups while it holds one, then the rest padded with copies of its last entry (a copy
 * walks the same way and writes the same id to the same place) to groups of 2 vectors, not of CNV: with
 * groups of 128 lanes, padding whole groups made short runs and gathers (a mixture's per-component reads)
 * evaluate up to 127 copies. */
PD_AI void compact_drain(const avx512_ctx *c, queue *q, outbuf *buf, const int d, const int wide)
{
    while (q->n >= CLANES)
        compact_pass(c, q, buf, d, wide, CNV);
    while (q->n) {
        for (uint32_t last = q->n - 1; q->n % (2 * VW); q->n++) {
            q->s0[q->n] = q->s0[last];
            q->s1[q->n] = q->s1[last];
            q->idx[q->n] = q->idx[last];
        }
        compact_pass(c, q, buf, d, wide, 2);
    }
    outbuf_flush(c, buf, wide);
}

PD_AI void walk_compact(const avx512_ctx *c, const int d, const int wide)
{
    const pd__run *r = c->run;
    const uint32_t count = (uint32_t)r->count;
    queue q;
    outbuf buf;
    q.n = buf.n = 0;
    uint32_t i = 0;
    while (i + CLANES <= count) {
        const uint32_t end = count - i < BLOCK ? i + (count - i) / CLANES * CLANES : i + BLOCK;
        for (; i < end; i += CLANES)
            compact_first(c, &q, i, d, wide);
        while (q.n > BLOCK / 2)
            compact_pass(c, &q, &buf, d, wide, CNV);
    }
    for (; i < count; i++) {
        const uint64_t pos = r->first + i * r->stride;
        q.s0[q.n] = (uint32_t)(pos >> r->perm->rbits);
        q.s1[q.n] = (uint32_t)pos & r->perm->rmask;
        q.idx[q.n++] = i;
    }
    compact_drain(c, &q, &buf, d, wide);
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
PD_AVX512_INSTANCES(walk_compact)

static void avx512_ctx_init(avx512_ctx *c, const pd__run *r)
{
    const pd_perm *p = r->perm;
    const uint32_t d = p->rbits - p->lbits;
    for (int i = 0; i < PD_ROUNDS; i++)
        c->k[i] = _mm512_set1_epi32((int)p->keys.k[i]);
    for (int i = 0; i < PD_ROUNDS; i++)
        c->kw[i] = _mm512_set1_epi16((short)(uint16_t)p->keys.k[i]);
    c->lmask_w = _mm512_set1_epi16((short)(uint16_t)p->lmask);
    c->rmask_w = _mm512_set1_epi16((short)(uint16_t)p->rmask);
    c->top_w = _mm512_set1_epi16((short)(uint16_t)(1u << p->lbits));
    c->m_lo_d_w = _mm512_set1_epi16((short)(uint16_t)((uint32_t)PD_VP_M0 << d));
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
    c->first32 = _mm512_set1_epi32((int)(uint32_t)r->first);
    c->stride32 = _mm512_set1_epi32((int)(uint32_t)r->stride);
    c->first64 = _mm512_set1_epi64((long long)r->first);
    c->stride64 = _mm512_set1_epi64((long long)r->stride);
    c->count = _mm512_set1_epi32((int)r->count);
    c->run = r;
}

void pd__run_avx512(const pd__run *r)
{
    _Static_assert(PD__SIMD_MIN >= LANES, "the refill walk assumes every lane starts with a position");
    const pd_perm *p = r->perm;
    avx512_ctx c;
    avx512_ctx_init(&c, r);
    const int d = (int)(p->rbits - p->lbits), wide = p->bits > 32;
    if (p->n == UINT64_C(1) << p->bits)
        walk_none_by_shape[d][wide](&c);
    else if (r->walk == PD_WALK_LOCKSTEP)
        walk_lockstep_by_shape[d][wide](&c);
    else if (r->walk == PD_WALK_REFILL)
        walk_refill_by_shape[d][wide](&c);
    else
        walk_compact_by_shape[d][wide](&c);
    pd__run_fix_parity(r);
}

/* ---- Mixture entry points (kernel.h): block slots with every lane's own keys, σ gathered from a list */

#define SG 4 /* groups of 16 lanes in flight in the slot kernel */

/* hi32(a·m) for 16 lanes of 32 bits (m broadcast), as vp_round computes it. */
PD_AI __m512i mulhi32(__m512i a, __m512i m)
{
    const __m512i e = _mm512_mul_epu32(a, m);
    const __m512i o = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    return _mm512_mask_shuffle_epi32(o, 0x5555, e, _MM_PERM_DDBB);
}

/* Philox4x32-10 (core/philox.h) on SG·16 lanes at once: counter words per lane, one key for all. */
PD_AI void philox_lanes(__m512i c[SG][4], uint32_t k0, uint32_t k1)
{
    const __m512i m0 = _mm512_set1_epi32((int)PD_PHILOX_M0), m1 = _mm512_set1_epi32((int)PD_PHILOX_M1);
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += PD_PHILOX_W0;
            k1 += PD_PHILOX_W1;
        }
        const __m512i key0 = _mm512_set1_epi32((int)k0), key1 = _mm512_set1_epi32((int)k1);
        for (int v = 0; v < SG; v++) {
            const __m512i hi0 = mulhi32(c[v][0], m0), lo0 = _mm512_mullo_epi32(c[v][0], m0);
            const __m512i hi1 = mulhi32(c[v][2], m1), lo1 = _mm512_mullo_epi32(c[v][2], m1);
            c[v][0] = _mm512_ternarylogic_epi32(hi1, c[v][1], key0, PD_TL_XOR3);
            c[v][2] = _mm512_ternarylogic_epi32(hi0, c[v][3], key1, PD_TL_XOR3);
            c[v][1] = lo1;
            c[v][3] = lo0;
        }
    }
}

/* Round key i = bits [5i, 5i + 5) of the 128-bit Philox output x (pd__mix_block_keys). */
PD_AI __m512i packed_key(const __m512i x[4], int i)
{
    const int at = 5 * i, w = at / 32, off = at % 32;
    __m512i v = _mm512_srl_epi32(x[w], _mm_cvtsi32_si128(off));
    if (off > 27)
        v = _mm512_or_si512(v, _mm512_sll_epi32(x[w + 1], _mm_cvtsi32_si128(32 - off)));
    return _mm512_and_si512(v, _mm512_set1_epi32(31));
}

/* SG·16 slots from lane t on: positions, keys, f without walk (B = 2^b), the key's parity transposition. */
PD_AI void block_slots_group(avx512_ctx c[SG], const pd__block_slots *s, uint64_t t, const int d)
{
    const __m512i first = _mm512_set1_epi64((long long)s->first), stride = _mm512_set1_epi64((long long)s->stride);
    const __m512i lanes8 = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    const __m128i b = _mm_cvtsi32_si128((int)pd_bit_width(s->block - 1)); /* g >> b: the block */
    __m512i x[SG][4], s0[SG], s1[SG];
    for (int v = 0; v < SG; v++) {
        const __m512i i0 = _mm512_add_epi64(_mm512_set1_epi64((long long)(t + 16 * v)), lanes8);
        const __m512i i1 = _mm512_add_epi64(i0, _mm512_set1_epi64(8));
        const __m512i g0 = _mm512_add_epi64(first, _mm512_mul_epu32(i0, stride));
        const __m512i g1 = _mm512_add_epi64(first, _mm512_mul_epu32(i1, stride));
        const __m512i beta0 = _mm512_srl_epi64(g0, b), beta1 = _mm512_srl_epi64(g1, b);
        x[v][0] = _mm512_set1_epi32((int)PD_MIX_CTR_BLOCK);
        x[v][1] = _mm512_setzero_si512();
        x[v][2] = pack_lo32(beta0, beta1);
        x[v][3] = pack_lo32(_mm512_srli_epi64(beta0, 32), _mm512_srli_epi64(beta1, 32));
        const __m512i r = _mm512_and_si512(pack_lo32(g0, g1), _mm512_set1_epi32((int)(s->block - 1)));
        s0[v] = _mm512_srl_epi32(r, c[v].rbits);
        s1[v] = _mm512_and_si512(r, c[v].rmask);
    }
    philox_lanes(x, (uint32_t)s->seed, (uint32_t)(s->seed >> 32));
    for (int v = 0; v < SG; v++)
        for (int i = 0; i < PD_ROUNDS; i++)
            c[v].k[i] = packed_key(x[v], i);
    PD_UNROLL(24)
    for (int i = 0; i < PD_ROUNDS; i++)
        for (int v = 0; v < SG; v++)
            vp_round(&c[v], i, &s0[v], &s1[v], d, 0);
    const __m512i one = _mm512_set1_epi32(1);
    for (int v = 0; v < SG; v++) {
        if (!d)
            s1[v] = _mm512_and_si512(s1[v], c[v].rmask);
        const __m512i val = join(&c[v], s0[v], s1[v]);
        const __mmask16 flip = _mm512_test_epi32_mask(_mm512_srli_epi32(x[v][3], 24), one); /* bit 120 */
        const __mmask16 low = _mm512_cmplt_epu32_mask(val, _mm512_set1_epi32(2));
        _mm512_storeu_si512(s->out + t + 16 * v, _mm512_mask_xor_epi32(val, (__mmask16)(flip & low), val, one));
    }
}

static void block_slots_d0(avx512_ctx c[SG], const pd__block_slots *s, uint64_t t) { block_slots_group(c, s, t, 0); }
static void block_slots_d1(avx512_ctx c[SG], const pd__block_slots *s, uint64_t t) { block_slots_group(c, s, t, 1); }

void pd__block_slots_avx512(const pd__block_slots *s)
{
    pd_perm shape;
    pd__perm_shape(&shape, s->block, PD_MIN_BITS);
    const pd__run run = {.perm = &shape, .first = 0, .stride = 1, .count = 1};
    avx512_ctx c[SG];
    for (int v = 0; v < SG; v++)
        avx512_ctx_init(&c[v], &run); /* the shape's masks and multipliers; keys come per lane */
    const int d = (int)(shape.rbits - shape.lbits);
    uint64_t t = 0;
    for (; t + 16 * SG <= s->count; t += 16 * SG)
        (d ? block_slots_d1 : block_slots_d0)(c, s, t);
    pd__block_slots rest = *s;
    rest.first += t * s->stride;
    rest.count -= t;
    rest.out += t;
    pd__block_slots_scalar(&rest);
}

/* Gather: compaction (walk_compact) whose first pass reads its positions from a list. */
PD_AI void gather_first(const avx512_ctx *c, queue *q, const uint64_t *pos, uint32_t i, const int d, const int wide)
{
    __m512i s0[CNV], s1[CNV], idx[CNV];
    for (int v = 0; v < CNV; v++) {
        const __m512i p0 = _mm512_loadu_si512(pos + i + VW * v), p1 = _mm512_loadu_si512(pos + i + VW * v + 8);
        idx[v] = idx_from(i + VW * v);
        s0[v] = pack_lo32(_mm512_srl_epi64(p0, c->rbits), _mm512_srl_epi64(p1, c->rbits));
        s1[v] = _mm512_and_si512(pack_lo32(p0, p1), c->rmask);
    }
    vp_eval_n(c, s0, s1, CNV, d, wide);
    for (int v = 0; v < CNV; v++) {
        __m512i val;
        const __mmask16 out = (__mmask16)~inside(c, s0[v], s1[v], &val, wide);
        store_ids(c, i + VW * v, val, s1[v], wide);
        queue_push_at(q, q->n, out, s0[v], s1[v], idx[v]);
        q->n += (unsigned)__builtin_popcount(out);
    }
}

PD_AI void walk_gather(const avx512_ctx *c, const uint64_t *pos, const int d, const int wide)
{
    const pd__run *r = c->run;
    const uint32_t count = (uint32_t)r->count;
    queue q;
    outbuf buf;
    q.n = buf.n = 0;
    uint32_t i = 0;
    while (i + CLANES <= count) {
        const uint32_t end = count - i < BLOCK ? i + (count - i) / CLANES * CLANES : i + BLOCK;
        for (; i < end; i += CLANES)
            gather_first(c, &q, pos, i, d, wide);
        while (q.n > BLOCK / 2)
            compact_pass(c, &q, &buf, d, wide, CNV);
    }
    for (; i < count; i++) {
        q.s0[q.n] = (uint32_t)(pos[i] >> r->perm->rbits);
        q.s1[q.n] = (uint32_t)pos[i] & r->perm->rmask;
        q.idx[q.n++] = i;
    }
    compact_drain(c, &q, &buf, d, wide);
}

typedef void gather_fn(const avx512_ctx *c, const uint64_t *pos);
static void gather_00(const avx512_ctx *c, const uint64_t *pos) { walk_gather(c, pos, 0, 0); }
static void gather_01(const avx512_ctx *c, const uint64_t *pos) { walk_gather(c, pos, 0, 1); }
static void gather_10(const avx512_ctx *c, const uint64_t *pos) { walk_gather(c, pos, 1, 0); }
static void gather_11(const avx512_ctx *c, const uint64_t *pos) { walk_gather(c, pos, 1, 1); }
static gather_fn *const gather_by_shape[2][2] = {{gather_00, gather_01}, {gather_10, gather_11}};

void pd__gather_avx512(const pd__run *r, const uint64_t *positions)
{
    const pd_perm *p = r->perm;
    avx512_ctx c;
    avx512_ctx_init(&c, r);
    gather_by_shape[p->rbits - p->lbits][p->bits > 32](&c, positions);
    pd__gather_fix_parity(r);
}
