/* The AVX2 kernel: VariablePhilox on 16 lanes of 16 bits per register for b ≤ 32 (8 of 32 bits above), cycle-walked four ways (lockstep, table refill, scalar refill, compaction). */
#include "cpu/kernel.h"

#include <immintrin.h>

/*
 * Layout. However wide n is (up to 2^63), the Feistel halves s0 (≤ 31 bits)
 * and s1 (≤ 32 bits) each fit a 32-bit lane, so every n uses the same
 * 8-lane round; only turning positions into (s0, s1) and results back into
 * ids needs 64-bit lanes when b > 32 ("wide"). Several independent vectors
 * are in flight so that one vector's multiplies hide the others' latency: a
 * round is a chain of ~6 dependent operations, 3 cycles of them multiplies.
 *
 * Every kernel body below is an always-inline function of compile-time
 * flags (d = rbits - lbits, and the shape of n: ids below 2^31, of exactly
 * 32 bits, or wider), instantiated once per combination at the bottom, so
 * the hot loops carry no run-time branches on the shape of n.
 *
 * The parity correction is left to pd__run_fix_parity (kernel.h says why),
 * which saves four operations per vector and evaluation.
 */

#define PD_AI static inline __attribute__((always_inline))
#define VW 8          /* lanes per vector */
#define NV 3          /* vectors in flight in the refill walks (each evaluation waits for the last) */
#define LANES (VW * NV)
#define CNV 8         /* vectors per group where groups are independent (no walk, compaction): 4 of words */
#define CLANES (VW * CNV)
#define OBUF 512     /* finished (id, index) pairs buffered before they are scattered */

/* The shape of n, for the compare v < n and the id layout. */
enum { NARROW = 0,   /* n < 2^31: ids and n fit a signed lane, one vpcmpgtd */
       NARROW32 = 1, /* n ≥ 2^31 (b = 32, or n = 2^31): ids fit a lane but need an unsigned compare */
       WIDE = 2 };   /* b > 32: ids are (s0, s1) pairs; positions need 64-bit lanes */

typedef struct avx2_ctx {
    __m256i k[PD_ROUNDS];      /* round keys, broadcast */
    __m256i m_lo, m_hi;        /* M0 = m_hi·2^32 + m_lo */
    __m256i m_lo_d;            /* m_lo << d: folds the round's "lo << d" into the multiply */
    __m256i lmask, rmask;
    __m128i lbits, rbits;      /* shift counts */
    __m256i kw[PD_ROUNDS];     /* word lanes (vp_eval_words): the key's low 16 bits in every word */
    __m256i lmask_w, rmask_w, m_lo_d_w; /*   the masks and lo16(M0) << d in every word */
    __m256i n32, n_m1;         /* narrow: n and n - 1 (ids fit 32 bits) */
    __m256i n_hi, n_lo_x;      /* wide: (n − 1) >> rbits, and ((n − 1) & rmask) with its sign bit flipped */
    __m256i first32, stride32; /* narrow: position = first + i·stride, exact mod 2^32 */
    __m256i first64, stride64; /* wide: the same in 64-bit lanes */
    __m256i count;             /* lanes whose index is not below count are idle */
    const pd__run *run;
    const uint64_t *list; /* a gather's positions (pd__gather_avx2), else NULL */
} avx2_ctx;

static const __m256i *pd_avx2_iota(void)
{
    static const int32_t iota[VW] __attribute__((aligned(32))) = {0, 1, 2, 3, 4, 5, 6, 7};
    return (const __m256i *)iota;
}

/* ---- One evaluation of VariablePhilox */

/* a·m mod 2^32 in each lane, or, but for shape WIDE, only its low 16 bits (0 above) where a < 2^16: with
 * b ≤ 32 a round reads no more of either product (halves of at most 16 bits, masked by lmask and rmask).
 * vpmullw is one uop where vpmulld is two, with 10 cycles' latency on Intel. */
PD_AI __m256i pd_mul_lo(__m256i a, __m256i m, const int shape)
{
    return shape == WIDE ? _mm256_mullo_epi32(a, m) : _mm256_mullo_epi16(a, m);
}

PD_AI void vp_round(const avx2_ctx *c, int i, __m256i *s0, __m256i *s1, const int d, const int shape)
{
    /* M0·s0 is a 64 × 31-bit product; AVX2 only multiplies 32 × 32 → 64
     * (vpmuludq, even lanes) or keeps the low 32 bits (vpmulld). Since
     * hi32(M0·s0) = hi32(m_lo·s0) + lo32(m_hi·s0) mod 2^32, the high word
     * costs two vpmuludq (even lanes, then odd lanes shifted down), a blend
     * that puts each lane's high word in place, and one multiply (pd_mul_lo). */
    const __m256i e = _mm256_mul_epu32(*s0, c->m_lo);
    const __m256i o = _mm256_mul_epu32(_mm256_srli_epi64(*s0, 32), c->m_lo);
    __m256i hi = _mm256_blend_epi32(_mm256_srli_epi64(e, 32), o, 0xAA);
    hi = _mm256_add_epi32(hi, pd_mul_lo(*s0, c->m_hi, shape));
    __m256i lo = pd_mul_lo(*s0, c->m_lo_d, shape); /* lo32(M0·s0) << d */
    if (d) /* s1 >> lbits is s1's top bit: s1 is kept masked when d = 1 */
        lo = _mm256_or_si256(lo, _mm256_srl_epi32(*s1, c->lbits));
    *s0 = _mm256_and_si256(_mm256_xor_si256(_mm256_xor_si256(hi, c->k[i]), *s1), c->lmask);
    /* When d = 0, s1 >> lbits is 0 and the next s0 keeps only s1's low
     * lbits = rbits bits, so s1 may carry junk above rbits until the end. */
    *s1 = d ? _mm256_and_si256(lo, c->rmask) : lo;
}

/* Word lanes for b ≤ 32 (the round of cpu/words_avx512.h: read its comment), 16 lanes a register. AVX2 has no
 * unsigned 16-bit compare: the carry of al + bh is a signed compare with both sides' top bits flipped (al ^ 2^15,
 * and al ^ 2^15 + bh = (al + bh) ^ 2^15). With d = 1, s1 is kept masked and s1 >> lbits is one vpsrlw. */
PD_AI void vp_eval_words(const avx2_ctx *c, __m256i *s0, __m256i *s1, const int nv, const int d)
{
    const __m256i A = _mm256_set1_epi16((short)(uint16_t)(PD_VP_M0 >> 16));
    const __m256i Bc = _mm256_set1_epi16((short)(uint16_t)PD_VP_M0);
    const __m256i H = _mm256_set1_epi16((short)(uint16_t)(PD_VP_M0 >> 32));
    const __m256i top = _mm256_set1_epi16((short)0x8000);
    __m256i w0[CNV / 2], w1[CNV / 2];
    for (int j = 0; j < nv / 2; j++) {
        w0[j] = _mm256_packus_epi32(s0[2 * j], s0[2 * j + 1]);
        w1[j] = _mm256_packus_epi32(s1[2 * j], s1[2 * j + 1]);
    }
#pragma GCC unroll 24
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int j = 0; j < nv / 2; j++) {
            const __m256i al = _mm256_xor_si256(_mm256_mullo_epi16(w0[j], A), top);
            const __m256i x = _mm256_add_epi16(al, _mm256_mulhi_epu16(w0[j], Bc));
            __m256i hi = _mm256_add_epi16(_mm256_mulhi_epu16(w0[j], A), _mm256_mullo_epi16(w0[j], H));
            hi = _mm256_sub_epi16(hi, _mm256_cmpgt_epi16(al, x)); /* + the carry (all ones: −1) */
            __m256i lo = _mm256_mullo_epi16(w0[j], c->m_lo_d_w);
            if (d)
                lo = _mm256_and_si256(_mm256_or_si256(lo, _mm256_srl_epi16(w1[j], c->lbits)), c->rmask_w);
            w0[j] = _mm256_and_si256(_mm256_xor_si256(_mm256_xor_si256(hi, c->kw[i]), w1[j]), c->lmask_w);
            w1[j] = lo;
        }
    }
    for (int j = 0; j < nv / 2; j++) {
        if (!d)
            w1[j] = _mm256_and_si256(w1[j], c->rmask_w);
        s0[2 * j] = _mm256_unpacklo_epi16(w0[j], _mm256_setzero_si256());
        s0[2 * j + 1] = _mm256_unpackhi_epi16(w0[j], _mm256_setzero_si256());
        s1[2 * j] = _mm256_unpacklo_epi16(w1[j], _mm256_setzero_si256());
        s1[2 * j + 1] = _mm256_unpackhi_epi16(w1[j], _mm256_setzero_si256());
    }
}

/* The 24 rounds on nv ≤ 4 vectors of 32-bit lanes, interleaved round by round. */
PD_AI void vp_eval_32(const avx2_ctx *c, __m256i *s0, __m256i *s1, const int nv, const int d, const int shape)
{
#pragma GCC unroll 24
    for (int i = 0; i < PD_ROUNDS; i++) {
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            vp_round(c, i, &s0[v], &s1[v], d, shape);
    }
    if (!d) {
        for (int v = 0; v < nv; v++)
            s1[v] = _mm256_and_si256(s1[v], c->rmask);
    }
}

/* nv vectors: on word lanes unless WIDE or nv is odd, else 4 at a time on 32-bit lanes. */
PD_AI void vp_eval_n(const avx2_ctx *c, __m256i *s0, __m256i *s1, const int nv, const int d, const int shape)
{
    if (shape != WIDE && nv % 2 == 0) {
        vp_eval_words(c, s0, s1, nv, d);
        return;
    }
    for (int v = 0; v < nv; v += 4)
        vp_eval_32(c, s0 + v, s1 + v, nv - v < 4 ? nv - v : 4, d, shape);
}

PD_AI void vp_eval(const avx2_ctx *c, __m256i s0[NV], __m256i s1[NV], const int d, const int shape)
{
    vp_eval_n(c, s0, s1, NV, d, shape);
}

/* ---- Positions in, ids out */

/* The low 32-bit halves of a's and b's four 64-bit lanes, in lane order. */
PD_AI __m256i pack_lo32(__m256i a, __m256i b)
{
    const __m256 t = _mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), 0x88);
    return _mm256_permute4x64_epi64(_mm256_castps_si256(t), 0xD8);
}

/* Lanes with output index idx start at position first + idx·stride. */
PD_AI void positions(const avx2_ctx *c, __m256i idx, __m256i *s0, __m256i *s1, const int shape)
{
    if (shape != WIDE) { /* every position is below n ≤ 2^32, so 32-bit arithmetic is exact */
        const __m256i p = _mm256_add_epi32(c->first32, _mm256_mullo_epi32(idx, c->stride32));
        *s0 = _mm256_srl_epi32(p, c->rbits);
        *s1 = _mm256_and_si256(p, c->rmask);
        return;
    }
    const __m256i i0 = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(idx));
    const __m256i i1 = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(idx, 1));
    const __m256i p0 = _mm256_add_epi64(c->first64, _mm256_mul_epu32(i0, c->stride64));
    const __m256i p1 = _mm256_add_epi64(c->first64, _mm256_mul_epu32(i1, c->stride64));
    *s0 = pack_lo32(_mm256_srl_epi64(p0, c->rbits), _mm256_srl_epi64(p1, c->rbits));
    *s1 = _mm256_and_si256(pack_lo32(p0, p1), c->rmask);
}

/* Narrow ids (b ≤ 32) fit a lane: v = s0·2^rbits + s1. */
PD_AI __m256i join(const avx2_ctx *c, __m256i s0, __m256i s1)
{
    return _mm256_or_si256(_mm256_sll_epi32(s0, c->rbits), s1);
}

/* v < n for narrow ids. AVX2 compares only signed; for n < 2^31 that is
 * exact, and from 2^31 on (b = 32, and n = 2^31 itself: shape_of) min_epu32
 * gives an unsigned v ≤ n - 1. */
PD_AI __m256i inside_narrow(const avx2_ctx *c, __m256i v, const int shape)
{
    if (shape == NARROW)
        return _mm256_cmpgt_epi32(c->n32, v);
    return _mm256_cmpeq_epi32(_mm256_min_epu32(v, c->n_m1), v);
}

/* (s0, s1) ≤ (n_hi, n_lo), the halves of n − 1, lexicographically: v < n. s0 and n_hi are below 2^lbits ≤ 2^31,
 * so a signed compare is exact (n's own top half is 2^31 where n = 2^62, which a gather of such a component walks:
 * "s0 < 2^31" as signed compares was never true there, and the walk never ended); s1 may use all 32 bits, so it
 * is compared with both sign bits flipped. */
PD_AI __m256i inside_wide(const avx2_ctx *c, __m256i s0, __m256i s1)
{
    const __m256i sign = _mm256_set1_epi32(INT32_MIN);
    const __m256i lt0 = _mm256_cmpgt_epi32(c->n_hi, s0);
    const __m256i eq0 = _mm256_cmpeq_epi32(s0, c->n_hi);
    const __m256i gt1 = _mm256_cmpgt_epi32(_mm256_xor_si256(s1, sign), c->n_lo_x);
    return _mm256_or_si256(lt0, _mm256_andnot_si256(gt1, eq0));
}

/* 8 consecutive ids from out + i: narrow v, or wide (s0, s1), in u32 or u64. */
PD_AI void store_narrow(const avx2_ctx *c, uint64_t i, __m256i v)
{
    if (c->run->width == 4) {
        _mm256_storeu_si256((__m256i *)((uint32_t *)c->run->out + i), v);
    } else {
        uint64_t *out = (uint64_t *)c->run->out + i;
        _mm256_storeu_si256((__m256i *)out, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(v)));
        _mm256_storeu_si256((__m256i *)(out + 4), _mm256_cvtepu32_epi64(_mm256_extracti128_si256(v, 1)));
    }
}

PD_AI void store_wide(const avx2_ctx *c, uint64_t i, __m256i s0, __m256i s1)
{
    uint64_t *out = (uint64_t *)c->run->out + i;
    const __m256i a0 = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(s0));
    const __m256i a1 = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(s0, 1));
    const __m256i b0 = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(s1));
    const __m256i b1 = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(s1, 1));
    _mm256_storeu_si256((__m256i *)out, _mm256_or_si256(_mm256_sll_epi64(a0, c->rbits), b0));
    _mm256_storeu_si256((__m256i *)(out + 4), _mm256_or_si256(_mm256_sll_epi64(a1, c->rbits), b1));
}

/* Indices from..count-1 the vector loops left over, one by one. */
static void scalar_tail(const pd__run *r, uint64_t from)
{
    pd__run rest = *r;
    rest.first += from * r->stride;
    rest.count -= from;
    rest.out = (char *)r->out + from * r->width;
    pd__run_scalar_walk(&rest, 0); /* the parity is fixed for the whole run at the end */
}

/* ---- n = 2^b: f is already a permutation of [0, n), nothing walks */

PD_AI void walk_none(const avx2_ctx *c, const int d, const int shape)
{
    const pd__run *r = c->run;
    uint64_t i = 0;
    for (; i + CLANES <= r->count; i += CLANES) {
        __m256i s0[CNV], s1[CNV];
        for (int v = 0; v < CNV; v++) {
            const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(i + VW * v)), *pd_avx2_iota());
            positions(c, idx, &s0[v], &s1[v], shape);
        }
        vp_eval_n(c, s0, s1, CNV, d, shape);
        for (int v = 0; v < CNV; v++) {
            if (shape == WIDE)
                store_wide(c, i + VW * v, s0[v], s1[v]);
            else
                store_narrow(c, i + VW * v, join(c, s0[v], s1[v]));
        }
    }
    scalar_tail(r, i);
}

/* ---- Lockstep: the naive baseline. Each group of LANES consecutive
 * positions evaluates f until its slowest lane is inside, so it pays for the
 * longest of LANES walks (~5.5 evaluations for 24 lanes when n ≈ 2^b / 2,
 * where the average walk is 2). Kept to measure what the refill saves. */

PD_AI void walk_lockstep(const avx2_ctx *c, const int d, const int shape)
{
    const pd__run *r = c->run;
    uint64_t i = 0;
    for (; i + LANES <= r->count; i += LANES) {
        __m256i s0[NV], s1[NV], r0[NV], r1[NV], fin[NV];
        for (int v = 0; v < NV; v++) {
            const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(i + VW * v)), *pd_avx2_iota());
            positions(c, idx, &s0[v], &s1[v], shape);
            r0[v] = r1[v] = fin[v] = _mm256_setzero_si256();
        }
        for (;;) {
            vp_eval(c, s0, s1, d, shape);
            int all = 1;
            for (int v = 0; v < NV; v++) {
                if (shape == WIDE) {
                    const __m256i in = inside_wide(c, s0[v], s1[v]);
                    const __m256i now = _mm256_andnot_si256(fin[v], in);
                    r0[v] = _mm256_blendv_epi8(r0[v], s0[v], now);
                    r1[v] = _mm256_blendv_epi8(r1[v], s1[v], now);
                    fin[v] = _mm256_or_si256(fin[v], in);
                } else {
                    const __m256i val = join(c, s0[v], s1[v]);
                    const __m256i in = inside_narrow(c, val, shape);
                    r0[v] = _mm256_blendv_epi8(r0[v], val, _mm256_andnot_si256(fin[v], in));
                    fin[v] = _mm256_or_si256(fin[v], in);
                }
                all &= _mm256_movemask_ps(_mm256_castsi256_ps(fin[v])) == 0xFF;
            }
            if (all)
                break;
        }
        for (int v = 0; v < NV; v++) {
            if (shape == WIDE)
                store_wide(c, i + VW * v, r0[v], r1[v]);
            else
                store_narrow(c, i + VW * v, r0[v]);
        }
    }
    scalar_tail(r, i);
}

/* ---- Refill through lookup tables.
 *
 * Lanes walk independently: after each evaluation, the lanes that are inside
 * hand their id and output index to a buffer and take the next pending
 * positions, so no lane idles while another walks (each position costs its
 * own walk, 2 evaluations on average at n = 2^26 + 1). AVX2 has no compress
 * or expand instruction, so both go through vpermd with patterns looked up
 * by the 8-bit mask of finished lanes:
 *   PD_COMPRESS(m): byte k = the lane of m's k-th set bit, so vpermd moves
 *                   the finished lanes to the front for one unaligned store;
 *   PD_RANK(m):     byte j = how many set bits m has below lane j, so a
 *                   finished lane j takes index next + rank.
 * The ids come out of order (a lane may walk 6 times while its neighbours
 * finish), so they are scattered from the buffer in batches: one loop, and
 * one mispredicted branch, per thousand ids. */

#define PD_BIT(m, j) (((m) >> (j)) & 1)
#define PD_BELOW(m, j)                                                                                 \
    ((j > 0 && PD_BIT(m, 0)) + (j > 1 && PD_BIT(m, 1)) + (j > 2 && PD_BIT(m, 2)) + (j > 3 && PD_BIT(m, 3)) + \
     (j > 4 && PD_BIT(m, 4)) + (j > 5 && PD_BIT(m, 5)) + (j > 6 && PD_BIT(m, 6)))
#define PD_CBYTE(m, j) ((uint64_t)(PD_BIT(m, j) * (j)) << (8 * PD_BELOW(m, j)))
#define PD_COMPRESS(m)                                                                                 \
    (PD_CBYTE(m, 0) | PD_CBYTE(m, 1) | PD_CBYTE(m, 2) | PD_CBYTE(m, 3) | PD_CBYTE(m, 4) | PD_CBYTE(m, 5) | \
     PD_CBYTE(m, 6) | PD_CBYTE(m, 7))
#define PD_RBYTE(m, j) ((uint64_t)PD_BELOW(m, j) << (8 * (j)))
#define PD_RANK(m)                                                                                     \
    (PD_RBYTE(m, 0) | PD_RBYTE(m, 1) | PD_RBYTE(m, 2) | PD_RBYTE(m, 3) | PD_RBYTE(m, 4) | PD_RBYTE(m, 5) | \
     PD_RBYTE(m, 6) | PD_RBYTE(m, 7))
#define PD_T4(F, m) F(m), F(m + 1), F(m + 2), F(m + 3)
#define PD_T16(F, m) PD_T4(F, m), PD_T4(F, m + 4), PD_T4(F, m + 8), PD_T4(F, m + 12)
#define PD_T64(F, m) PD_T16(F, m), PD_T16(F, m + 16), PD_T16(F, m + 32), PD_T16(F, m + 48)
#define PD_T256(F) PD_T64(F, 0), PD_T64(F, 64), PD_T64(F, 128), PD_T64(F, 192)

const uint64_t pd__avx2_compress_tab[256] = {PD_T256(PD_COMPRESS)};
static const uint64_t pd_rank_tab[256] = {PD_T256(PD_RANK)};

/* Eight byte-sized lane numbers widened to a vector of u32. */
PD_AI __m256i table_vec(const uint64_t *tab, unsigned m)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&tab[m]));
}

/* Finished ids waiting to be scattered: v (narrow) or (v, v1) = (s0, s1) (wide). */
typedef struct outbuf { /* filled up to OBUF, plus one group of lanes of slack */
    uint32_t v[OBUF + CLANES], v1[OBUF + CLANES], idx[OBUF + CLANES];
    uint32_t n;
} outbuf;

PD_AI void outbuf_flush(const avx2_ctx *c, outbuf *b, const int shape)
{
    const pd__run *r = c->run;
    if (shape == WIDE) {
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

/* Lanes in flight: state, output index, and the refill cursor. */
typedef struct lanes {
    __m256i s0[NV], s1[NV], idx[NV];
    uint32_t next;     /* the next output index to hand out */
    uint32_t produced; /* ids finished so far */
} lanes;

/* One evaluation of every lane, then out with the finished, in with the
 * next positions. While drain is 0 the caller guarantees that LANES more
 * indices exist, so no lane can be idle and the liveness test is skipped;
 * in the drain, lanes past the end idle until the last walk finishes. */
PD_AI void refill_step(const avx2_ctx *c, lanes *L, outbuf *buf, const int d, const int shape, const int drain)
{
    vp_eval(c, L->s0, L->s1, d, shape);
    for (int v = 0; v < NV; v++) {
        __m256i val = L->s0[v], done;
        if (shape == WIDE)
            done = inside_wide(c, L->s0[v], L->s1[v]);
        else
            done = inside_narrow(c, val = join(c, L->s0[v], L->s1[v]), shape);
        if (drain)
            done = _mm256_and_si256(done, _mm256_cmpgt_epi32(c->count, L->idx[v]));
        const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(done));
        const unsigned k = (unsigned)__builtin_popcount(m);
        const __m256i pack = pd__avx2_compress_pattern(m);
        if (shape == WIDE)
            _mm256_storeu_si256((__m256i *)(buf->v1 + buf->n), _mm256_permutevar8x32_epi32(L->s1[v], pack));
        _mm256_storeu_si256((__m256i *)(buf->v + buf->n), _mm256_permutevar8x32_epi32(val, pack));
        _mm256_storeu_si256((__m256i *)(buf->idx + buf->n), _mm256_permutevar8x32_epi32(L->idx[v], pack));
        buf->n += k;
        /* Refill: finished lanes take indices next, next + 1, … in lane order. */
        const __m256i nidx = _mm256_add_epi32(_mm256_set1_epi32((int)L->next), table_vec(pd_rank_tab, m));
        L->next += k;
        L->produced += k;
        __m256i n0, n1;
        positions(c, nidx, &n0, &n1, shape);
        L->s0[v] = _mm256_blendv_epi8(L->s0[v], n0, done);
        L->s1[v] = _mm256_blendv_epi8(L->s1[v], n1, done);
        L->idx[v] = _mm256_blendv_epi8(L->idx[v], nidx, done);
    }
    if (buf->n >= OBUF)
        outbuf_flush(c, buf, shape);
}

PD_AI void walk_refill(const avx2_ctx *c, const int d, const int shape)
{
    const uint32_t count = (uint32_t)c->run->count; /* ≥ PD__SIMD_MIN > LANES */
    lanes L;
    outbuf buf;
    buf.n = 0;
    for (int v = 0; v < NV; v++) {
        L.idx[v] = _mm256_add_epi32(_mm256_set1_epi32(VW * v), *pd_avx2_iota());
        positions(c, L.idx[v], &L.s0[v], &L.s1[v], shape);
    }
    L.next = LANES;
    L.produced = 0;
    while (L.next + LANES <= count)
        refill_step(c, &L, &buf, d, shape, 0);
    while (L.produced < count)
        refill_step(c, &L, &buf, d, shape, 1);
    outbuf_flush(c, &buf, shape);
}

/* ---- Compaction passes.
 *
 * The refill above chains every lane's next walk to its last: the 24 rounds
 * (~190 cycles of latency) of one iteration must finish before the compare
 * and refill that feed the next, so only NV vectors are ever in flight.
 * Here a block of BLOCK positions is evaluated once with nothing carried
 * over: inside ids go straight to the output in order, and the lanes still
 * outside are compress-stored, with their output index, to a queue. Passes
 * over the queue evaluate it again, scatter the ids that came inside
 * (through the output buffer) and compact the rest in place. No evaluation
 * depends on the one before it except through memory, so the out-of-order
 * core overlaps consecutive groups, and every lane of every vector does
 * useful work. The queue is passed over until it is at most BLOCK / 2 long
 * (at n just above 2^b that is one pass per block), and emptied at the end
 * by padding it with copies of its last entry: a copy walks the same way and
 * writes the same id to the same place. */

#define BLOCK (512 / CLANES * CLANES) /* whole groups */
#define QCAP (BLOCK / 2 + BLOCK + CLANES)

/* Values still walking and their output indices. A narrow value is kept
 * joined (v = s0·2^rbits + s1, one array, split again when loaded), which
 * saves a third of the queue's loads and stores; wide ones keep (v, v1) =
 * (s0, s1). */
typedef struct queue {
    uint32_t v[QCAP + CLANES], v1[QCAP + CLANES], idx[QCAP + CLANES];
    uint32_t n;
} queue;

/* Store the lanes of (val, s1, idx) selected by m at q's entry `at`. */
PD_AI void queue_put(queue *q, uint32_t at, unsigned m, __m256i val, __m256i s1, __m256i idx, const int shape)
{
    const __m256i pack = pd__avx2_compress_pattern(m);
    _mm256_storeu_si256((__m256i *)(q->v + at), _mm256_permutevar8x32_epi32(val, pack));
    if (shape == WIDE)
        _mm256_storeu_si256((__m256i *)(q->v1 + at), _mm256_permutevar8x32_epi32(s1, pack));
    _mm256_storeu_si256((__m256i *)(q->idx + at), _mm256_permutevar8x32_epi32(idx, pack));
}

/* Load 8 entries from `at` as (s0, s1, idx). */
PD_AI void queue_get(const avx2_ctx *c, const queue *q, uint32_t at, __m256i *s0, __m256i *s1, __m256i *idx,
                     const int shape)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(q->v + at));
    if (shape == WIDE) {
        *s0 = v;
        *s1 = _mm256_loadu_si256((const __m256i *)(q->v1 + at));
    } else {
        *s0 = _mm256_srl_epi32(v, c->rbits);
        *s1 = _mm256_and_si256(v, c->rmask);
    }
    *idx = _mm256_loadu_si256((const __m256i *)(q->idx + at));
}

/* The first evaluation of CLANES consecutive output indices from i: positions of the run, or read from
 * c->list (list set: a gather). */
PD_AI void compact_first(const avx2_ctx *c, queue *q, uint32_t i, const int d, const int shape, const int list)
{
    __m256i s0[CNV], s1[CNV], idx[CNV];
    for (int v = 0; v < CNV; v++) {
        idx[v] = _mm256_add_epi32(_mm256_set1_epi32((int)(i + VW * v)), *pd_avx2_iota());
        if (list) {
            const __m256i p0 = _mm256_loadu_si256((const __m256i *)(c->list + i + VW * v));
            const __m256i p1 = _mm256_loadu_si256((const __m256i *)(c->list + i + VW * v + 4));
            s0[v] = pack_lo32(_mm256_srl_epi64(p0, c->rbits), _mm256_srl_epi64(p1, c->rbits));
            s1[v] = _mm256_and_si256(pack_lo32(p0, p1), c->rmask);
        } else {
            positions(c, idx[v], &s0[v], &s1[v], shape);
        }
    }
    vp_eval_n(c, s0, s1, CNV, d, shape);
    for (int v = 0; v < CNV; v++) {
        __m256i in, val = s0[v];
        if (shape == WIDE) {
            in = inside_wide(c, s0[v], s1[v]);
            store_wide(c, i + VW * v, s0[v], s1[v]); /* lanes still outside are overwritten later */
        } else {
            val = join(c, s0[v], s1[v]);
            in = inside_narrow(c, val, shape);
            store_narrow(c, i + VW * v, val);
        }
        const unsigned out = ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(in)) & 0xFF;
        queue_put(q, q->n, out, val, s1[v], idx[v], shape);
        q->n += (unsigned)__builtin_popcount(out);
    }
}

/* One pass over the queue's whole groups of nv vectors (CNV, or 2 in the drain); a shorter rest stays queued. */
PD_AI void compact_pass(const avx2_ctx *c, queue *q, outbuf *buf, const int d, const int shape, const int nv)
{
    uint32_t r = 0, w = 0;
    for (; r + VW * nv <= q->n; r += VW * nv) {
        __m256i s0[CNV], s1[CNV], idx[CNV];
        for (int v = 0; v < nv; v++)
            queue_get(c, q, r + VW * v, &s0[v], &s1[v], &idx[v], shape);
        vp_eval_n(c, s0, s1, nv, d, shape);
        for (int v = 0; v < nv; v++) {
            __m256i val = s0[v], in;
            if (shape == WIDE)
                in = inside_wide(c, s0[v], s1[v]);
            else
                in = inside_narrow(c, val = join(c, s0[v], s1[v]), shape);
            const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(in));
            const __m256i pack = pd__avx2_compress_pattern(m);
            if (shape == WIDE)
                _mm256_storeu_si256((__m256i *)(buf->v1 + buf->n), _mm256_permutevar8x32_epi32(s1[v], pack));
            _mm256_storeu_si256((__m256i *)(buf->v + buf->n), _mm256_permutevar8x32_epi32(val, pack));
            _mm256_storeu_si256((__m256i *)(buf->idx + buf->n), _mm256_permutevar8x32_epi32(idx[v], pack));
            buf->n += (unsigned)__builtin_popcount(m);
            /* In place: w ≤ r + VW·v, so this overwrites only entries already loaded. */
            queue_put(q, w, ~m & 0xFF, val, s1[v], idx[v], shape);
            w += 8 - (unsigned)__builtin_popcount(m);
        }
        if (buf->n >= OBUF)
            outbuf_flush(c, buf, shape);
    }
    for (; r < q->n; r++, w++) { /* the rest moves down behind the survivors */
        q->v[w] = q->v[r];
        q->v1[w] = q->v1[r];
        q->idx[w] = q->idx[r];
    }
    q->n = w;
}

PD_AI void walk_compact_from(const avx2_ctx *c, const int d, const int shape, const int list)
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
            compact_first(c, &q, i, d, shape, list);
        while (q.n > BLOCK / 2)
            compact_pass(c, &q, &buf, d, shape, CNV);
    }
    for (; i < count; i++) { /* fewer than CLANES positions left: queue them unevaluated */
        const uint64_t pos = list ? c->list[i] : r->first + i * r->stride;
        q.v[q.n] = shape == WIDE ? (uint32_t)(pos >> r->perm->rbits) : (uint32_t)pos;
        q.v1[q.n] = (uint32_t)pos & r->perm->rmask;
        q.idx[q.n++] = i;
    }
    /* The drain: whole groups while the queue holds one, then the rest padded with copies of its last entry to
     * groups of 2 vectors, not of CNV (whole groups of 64 lanes made a mixture's gathers evaluate up to 63). */
    while (q.n >= CLANES)
        compact_pass(c, &q, &buf, d, shape, CNV);
    while (q.n) {
        for (uint32_t last = q.n - 1; q.n % (2 * VW); q.n++) { /* pad with copies of the last entry */
            q.v[q.n] = q.v[last];
            q.v1[q.n] = q.v1[last];
            q.idx[q.n] = q.idx[last];
        }
        compact_pass(c, &q, &buf, d, shape, 2);
    }
    outbuf_flush(c, &buf, shape);
}

PD_AI void walk_compact(const avx2_ctx *c, const int d, const int shape)
{
    walk_compact_from(c, d, shape, 0);
}

PD_AI void walk_gather(const avx2_ctx *c, const int d, const int shape)
{
    walk_compact_from(c, d, shape, 1);
}

/* ---- Refill lane by lane in scalar code: the lane state round-trips
 * through memory, and each finished lane is written out and reloaded with
 * its next position by ordinary loads and stores. Simple, but the vector
 * reload after scalar stores to the same lines defeats store forwarding. */

PD_AI void walk_refill_scalar(const avx2_ctx *c, const int d, const int shape)
{
    const pd__run *r = c->run;
    const pd_perm *p = r->perm;
    const uint32_t count = (uint32_t)r->count;
    uint32_t S0[LANES] __attribute__((aligned(32))), S1[LANES] __attribute__((aligned(32)));
    uint32_t V[LANES] __attribute__((aligned(32))), I[LANES] __attribute__((aligned(32)));
    uint32_t next = 0, produced = 0;
    for (int j = 0; j < LANES; j++) { /* count ≥ PD__SIMD_MIN > LANES */
        const uint64_t pos = r->first + next * r->stride;
        S0[j] = (uint32_t)(pos >> p->rbits);
        S1[j] = (uint32_t)pos & p->rmask;
        I[j] = next++;
    }
    while (produced < count) {
        __m256i s0[NV], s1[NV];
        for (int v = 0; v < NV; v++) {
            s0[v] = _mm256_load_si256((const __m256i *)(S0 + VW * v));
            s1[v] = _mm256_load_si256((const __m256i *)(S1 + VW * v));
        }
        vp_eval(c, s0, s1, d, shape);
        uint32_t mask = 0;
        for (int v = 0; v < NV; v++) {
            const __m256i live = _mm256_cmpgt_epi32(c->count, _mm256_load_si256((const __m256i *)(I + VW * v)));
            __m256i done;
            if (shape == WIDE) {
                done = inside_wide(c, s0[v], s1[v]);
                _mm256_store_si256((__m256i *)(V + VW * v), s1[v]);
            } else {
                const __m256i val = join(c, s0[v], s1[v]);
                done = inside_narrow(c, val, shape);
                _mm256_store_si256((__m256i *)(V + VW * v), val);
            }
            _mm256_store_si256((__m256i *)(S0 + VW * v), s0[v]);
            _mm256_store_si256((__m256i *)(S1 + VW * v), s1[v]);
            mask |= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_and_si256(done, live))) << (VW * v);
        }
        for (; mask; mask &= mask - 1) {
            const int j = __builtin_ctz(mask);
            if (shape == WIDE)
                ((uint64_t *)r->out)[I[j]] = ((uint64_t)S0[j] << p->rbits) | V[j];
            else if (r->width == 4)
                ((uint32_t *)r->out)[I[j]] = V[j];
            else
                ((uint64_t *)r->out)[I[j]] = V[j];
            produced++;
            if (next < count) {
                const uint64_t pos = r->first + next * r->stride;
                S0[j] = (uint32_t)(pos >> p->rbits);
                S1[j] = (uint32_t)pos & p->rmask;
                I[j] = next++;
            } else {
                I[j] = INT32_MAX; /* idle from now on */
            }
        }
    }
}

/* ---- Instances and dispatch */

typedef void walk_fn(const avx2_ctx *c);

#define PD_AVX2_INSTANCES(walk)                                                          \
    static void walk##_0n(const avx2_ctx *c) { walk(c, 0, NARROW); }                     \
    static void walk##_0m(const avx2_ctx *c) { walk(c, 0, NARROW32); }                   \
    static void walk##_0w(const avx2_ctx *c) { walk(c, 0, WIDE); }                       \
    static void walk##_1n(const avx2_ctx *c) { walk(c, 1, NARROW); }                     \
    static void walk##_1m(const avx2_ctx *c) { walk(c, 1, NARROW32); }                   \
    static void walk##_1w(const avx2_ctx *c) { walk(c, 1, WIDE); }                       \
    static walk_fn *const walk##_by_shape[2][3] = {{walk##_0n, walk##_0m, walk##_0w},    \
                                                   {walk##_1n, walk##_1m, walk##_1w}};

PD_AVX2_INSTANCES(walk_none)
PD_AVX2_INSTANCES(walk_lockstep)
PD_AVX2_INSTANCES(walk_refill)
PD_AVX2_INSTANCES(walk_refill_scalar)
PD_AVX2_INSTANCES(walk_compact)
PD_AVX2_INSTANCES(walk_gather)

static void avx2_ctx_init(avx2_ctx *c, const pd__run *r)
{
    const pd_perm *p = r->perm;
    const uint32_t d = p->rbits - p->lbits;
    for (int i = 0; i < PD_ROUNDS; i++)
        c->k[i] = _mm256_set1_epi32((int)p->keys.k[i]);
    for (int i = 0; i < PD_ROUNDS; i++)
        c->kw[i] = _mm256_set1_epi16((short)(uint16_t)p->keys.k[i]);
    c->lmask_w = _mm256_set1_epi16((short)(uint16_t)p->lmask);
    c->rmask_w = _mm256_set1_epi16((short)(uint16_t)p->rmask);
    c->m_lo_d_w = _mm256_set1_epi16((short)(uint16_t)((uint32_t)PD_VP_M0 << d));
    c->m_lo = _mm256_set1_epi32((int)(uint32_t)PD_VP_M0);
    c->m_hi = _mm256_set1_epi32((int)(uint32_t)(PD_VP_M0 >> 32));
    c->m_lo_d = _mm256_set1_epi32((int)((uint32_t)PD_VP_M0 << d));
    c->lmask = _mm256_set1_epi32((int)p->lmask);
    c->rmask = _mm256_set1_epi32((int)p->rmask);
    c->lbits = _mm_cvtsi32_si128((int)p->lbits);
    c->rbits = _mm_cvtsi32_si128((int)p->rbits);
    c->n32 = _mm256_set1_epi32((int)(uint32_t)p->n);
    c->n_m1 = _mm256_set1_epi32((int)(uint32_t)(p->n - 1));
    c->n_hi = _mm256_set1_epi32((int)(uint32_t)((p->n - 1) >> p->rbits));
    c->n_lo_x = _mm256_set1_epi32((int)(((uint32_t)(p->n - 1) & p->rmask) ^ UINT32_C(0x80000000)));
    c->first32 = _mm256_set1_epi32((int)(uint32_t)r->first);
    c->stride32 = _mm256_set1_epi32((int)(uint32_t)r->stride);
    c->first64 = _mm256_set1_epi64x((long long)r->first);
    c->stride64 = _mm256_set1_epi64x((long long)r->stride);
    c->count = _mm256_set1_epi32((int)r->count);
    c->run = r;
    c->list = NULL;
}

/* The lanes' shape for p: a signed compare with n (NARROW) is exact only for n < 2^31. At n = 2^31 (b = 31) it read
 * n as negative, no lane was ever inside, and a gather's walk never ended (a run takes walk_none there). */
static int shape_of(const pd_perm *p)
{
    return p->bits > 32 ? WIDE : p->n > INT32_MAX ? NARROW32 : NARROW;
}

void pd__run_avx2(const pd__run *r)
{
    _Static_assert(PD__SIMD_MIN > LANES, "the refill walks assume every lane starts with a position");
    const pd_perm *p = r->perm;
    avx2_ctx c;
    avx2_ctx_init(&c, r);
    const int d = (int)(p->rbits - p->lbits);
    const int shape = shape_of(p);
    if (p->n == UINT64_C(1) << p->bits)
        walk_none_by_shape[d][shape](&c);
    else if (r->walk == PD_WALK_LOCKSTEP)
        walk_lockstep_by_shape[d][shape](&c);
    else if (r->walk == PD_WALK_REFILL_SCALAR)
        walk_refill_scalar_by_shape[d][shape](&c);
    else if (r->walk == PD_WALK_COMPACT)
        walk_compact_by_shape[d][shape](&c);
    else
        walk_refill_by_shape[d][shape](&c);
    pd__run_fix_parity(r);
}

void pd__gather_avx2(const pd__run *r, const uint64_t *positions)
{
    const pd_perm *p = r->perm;
    avx2_ctx c;
    avx2_ctx_init(&c, r);
    c.list = positions;
    walk_gather_by_shape[p->rbits - p->lbits][shape_of(p)](&c);
    pd__gather_fix_parity(r);
}
