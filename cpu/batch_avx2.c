/* σ of several windows' short runs at once on AVX2: every lane carries its own τ (keys and shape by its run number), cycle-walked by compaction. */
#include "cpu/kernel.h"
#include "cpu/philox_avx2.h"

#include <immintrin.h>
#include <string.h>

/* batch_avx512.c on 8 lanes (read it first): per-run values are 8-entry tables read with vpermd,
 * so a batch holds at most 8 runs; the round is kernel_avx2.c's; compress goes through
 * kernel_avx2.c's lookup table, and unsigned compares through min. With 16 registers, values
 * the round reads are kept in memory (bctx.one) wherever a group lies inside one run.
 *
 * Byte lanes, as batch_avx512.c's (read its comment): τ of b ≤ 11 (halves of ≤ 5 and ≤ 6 bits)
 * walk 32 lanes per register, the round's products looked up with pshufb. pshufb reads 16 entries
 * (4 index bits) and yields 0 where the index has bit 7 set, so a 32-entry table is two 16-entry
 * pieces XORed: t(s) = A[s] ^ B[s + 0x70] with A = t[16..31], B = t[0..15] ^ t[16..31] (s + 0x70
 * reaches bit 7 from s = 16 on). A round costs ~16 instructions per 32 lanes where the 32-bit one
 * costs ~15 per 8. (Four pieces would take b ≤ 13, at the word lanes' speed: measured, not kept.)
 *
 * Word lanes, for b ≤ 17 (halves of ≤ 8 and ≤ 9 bits): 16 lanes per register, the round's
 * products from 16-bit multiplies. lo32(M0·s0) << d keeps its low 16 bits as (M0 mod 2^16 << d)·s0
 * mod 2^16. hi32(M0·s0)'s low byte, with s0 < 2^8, is a·s0 + ⌊c·s0 / 2^32⌋ (a = M0's bits 32-39,
 * c = its low word); writing c = ch·2^16 + cl, ⌊c·s0 / 2^32⌋ = mulhi(ch, s0) plus the carry of
 * mullo(ch, s0) + mulhi(cl, s0) — which, for this M0, is 0 for every s0 < 512 (checked for all of
 * them by test_cpu_shards' m0_words_carry_free). s1 >> lbits is mulhi(s1, 2^(16 − lbits)).
 * ~11 instructions per 16 lanes where the 32-bit round costs ~15 per 8. */

#define PD_AI static inline __attribute__((always_inline))
#define VW 8
#define CNV 4             /* vectors evaluated side by side (32-bit lanes) */
#define BNB 2             /* byte vectors side by side on byte lanes, at most (walk's nb): */
#define BNV (BNB * CNV)   /*   their lanes as vectors of u32 */
#define CLANES (VW * BNV) /* lanes of a group, at most */
#define BLOCK 512
#define SMALL_BATCH 2048 /* items: a batch this small that walks takes byte groups of 32 lanes (walk_bytes) */
#define QCAP (BLOCK / 2 + BLOCK + CLANES)
#define OBUF 512

/* One vector's lanes' values of the per-run tables. */
typedef struct lanes {
    __m256i run, m_lo_d, lmask, rmask, lbits, rbits, n_m1;
} lanes;

typedef struct bctx {
    __m256i key[PD_ROUNDS];
    __m256i m_lo_d, lmask, rmask, lbits, rbits, n_m1;
    uint32_t kr[PD__BATCH_RUNS][PD_ROUNDS]; /* the same per run, for groups inside one run: */
    lanes one[PD__BATCH_RUNS];              /*   broadcast keys and values, read from memory */
    uint32_t *v;
    const uint8_t *run;
    /* byte lanes: 16-entry pieces, each in both 128-bit halves */
    __m256i bkey[PD_ROUNDS];              /* byte r: run r's round key (low byte) */
    __m256i blmask, btop, bdl;            /* byte r: lmask; 2^lbits when d = 1, else 0; 0xFF when d = 1 */
    __m256i thi[2], tlo[2], tlo1[2];      /* hi32(M0·s), lo32(M0·s), lo32(M0·s) << 1, low bytes, s < 32 */
} bctx;

PD_AI __m256i iota8(void)
{
    return _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
}

PD_AI lanes lanes_of(const bctx *c, __m256i run)
{
    return (lanes){.run = run,
                   .m_lo_d = _mm256_permutevar8x32_epi32(c->m_lo_d, run),
                   .lmask = _mm256_permutevar8x32_epi32(c->lmask, run),
                   .rmask = _mm256_permutevar8x32_epi32(c->rmask, run),
                   .lbits = _mm256_permutevar8x32_epi32(c->lbits, run),
                   .rbits = _mm256_permutevar8x32_epi32(c->rbits, run),
                   .n_m1 = _mm256_permutevar8x32_epi32(c->n_m1, run)};
}

PD_AI void vp_round(const bctx *c, int i, const lanes *p, __m256i *s0, __m256i *s1, const int d, const uint32_t *hk)
{
    const __m256i m_lo = _mm256_set1_epi32((int)(uint32_t)PD_VP_M0);
    const __m256i m_hi = _mm256_set1_epi32((int)(uint32_t)(PD_VP_M0 >> 32));
    const __m256i e = _mm256_mul_epu32(*s0, m_lo);
    const __m256i o = _mm256_mul_epu32(_mm256_srli_epi64(*s0, 32), m_lo);
    __m256i hi = _mm256_blend_epi32(_mm256_srli_epi64(e, 32), o, 0xAA);
    /* b ≤ 32: of lo32(m_hi·s0) and lo32(M0·s0) << d the round reads the low 16 bits, which vpmullw gives
     * (s0 < 2^16) in one uop where vpmulld takes two (kernel_avx2.c's pd_mul_lo) */
    hi = _mm256_add_epi32(hi, _mm256_mullo_epi16(*s0, m_hi));
    __m256i lo = _mm256_mullo_epi16(*s0, p->m_lo_d);
    if (d)
        lo = _mm256_or_si256(lo, _mm256_srlv_epi32(*s1, p->lbits));
    const __m256i k = hk ? _mm256_set1_epi32((int)hk[i]) : _mm256_permutevar8x32_epi32(c->key[i], p->run);
    *s0 = _mm256_and_si256(_mm256_xor_si256(_mm256_xor_si256(hi, k), *s1), p->lmask);
    *s1 = d ? _mm256_and_si256(lo, p->rmask) : lo; /* d = 0 everywhere: junk above rbits is masked at the end */
}

/* hk: the keys of the one run all lanes belong to, or NULL (each lane looks its own up). */
PD_AI void eval(const bctx *c, const lanes *const *p, __m256i *s0, __m256i *s1, const int d, const uint32_t *hk)
{
#pragma GCC unroll 24
    for (int i = 0; i < PD_ROUNDS; i++) {
#pragma GCC unroll 4
        for (int v = 0; v < CNV; v++)
            vp_round(c, i, p[v], &s0[v], &s1[v], d, hk);
    }
    if (!d)
        for (int v = 0; v < CNV; v++)
            s1[v] = _mm256_and_si256(s1[v], p[v]->rmask);
}

/* ---- Byte lanes */

/* The low bytes of a[0..3]'s 32 u32 lanes, in order (values below 2^15). */
PD_AI __m256i pack4(const __m256i *a)
{
    const __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(a[0], a[1]), _mm256_packus_epi32(a[2], a[3]));
    return _mm256_permutevar8x32_epi32(w, _mm256_set_epi32(7, 3, 6, 2, 5, 1, 4, 0));
}

/* The inverse: 32 bytes to 4 vectors of u32. */
PD_AI void unpack4(__m256i b, __m256i *a)
{
    const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    a[0] = _mm256_cvtepu8_epi32(lo);
    a[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
    a[2] = _mm256_cvtepu8_epi32(hi);
    a[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
}

/* t(s) for every byte s below 32 from its two pieces; sh = s + 0x70. */
PD_AI __m256i lookup(const __m256i *t, __m256i s, __m256i sh)
{
    return _mm256_xor_si256(_mm256_shuffle_epi8(t[0], s), _mm256_shuffle_epi8(t[1], sh));
}

/* eval on byte lanes (batch_avx512.c's eval_bytes): every lane's lbits ≤ 5; D = 0, 1 or 2 (every
 * lane d = 0, every lane d = 1, mixed). */
PD_AI void eval_bytes(const bctx *c, const lanes *const *p, const __m256i *runb, __m256i *s0, __m256i *s1,
                      const int D, const int nb)
{
    const __m256i *tlo = D == 1 ? c->tlo1 : c->tlo;
    __m256i b0[BNB], b1[BNB], lmask[BNB], top[BNB], dl[BNB];
    const __m256i one = _mm256_set1_epi8(1);
    for (int j = 0; j < nb; j++) {
        b0[j] = pack4(s0 + CNV * j);
        b1[j] = pack4(s1 + CNV * j);
        lmask[j] = _mm256_shuffle_epi8(c->blmask, runb[j]);
        top[j] = _mm256_shuffle_epi8(c->btop, runb[j]);
        dl[j] = _mm256_shuffle_epi8(c->bdl, runb[j]);
    }
#pragma GCC unroll 24
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int j = 0; j < nb; j++) {
            const __m256i sh = _mm256_add_epi8(b0[j], _mm256_set1_epi8(0x70));
            const __m256i hi = lookup(c->thi, b0[j], sh);
            __m256i lo = lookup(tlo, b0[j], sh);
            if (D == 2)
                lo = _mm256_add_epi8(lo, _mm256_and_si256(lo, dl[j])); /* << 1 where d = 1 */
            const __m256i k = _mm256_shuffle_epi8(c->bkey[i], runb[j]);
            const __m256i n0 = _mm256_and_si256(_mm256_xor_si256(_mm256_xor_si256(hi, k), b1[j]), lmask[j]);
            if (D) /* s1 >> lbits: bit lbits, 0 or 1 (lo's bit 0 is 0 where d = 1) */
                lo = _mm256_or_si256(lo, _mm256_min_epu8(_mm256_and_si256(b1[j], top[j]), one));
            b1[j] = lo;
            b0[j] = n0;
        }
    }
    for (int j = 0; j < nb; j++) {
        unpack4(b0[j], s0 + CNV * j);
        unpack4(b1[j], s1 + CNV * j);
    }
    for (int v = 0; v < nb * CNV; v++)
        s1[v] = _mm256_and_si256(s1[v], p[v]->rmask);
}

/* ---- Word lanes */

/* a[0..1]'s 16 u32 lanes (below 2^16) as 16-bit lanes, in order, and back. */
PD_AI __m256i pack2w(__m256i a0, __m256i a1)
{
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a0, a1), 0xD8);
}

PD_AI void unpack2w(__m256i w, __m256i *a)
{
    a[0] = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(w));
    a[1] = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(w, 1));
}

/* eval on word lanes: every lane's b ≤ 17. */
PD_AI void eval_words(const bctx *c, const lanes *const *p, __m256i *s0, __m256i *s1)
{
    enum { NW = BNV / 2 };
    const __m256i ch = _mm256_set1_epi16((short)(uint16_t)(PD_VP_M0 >> 16));
    const __m256i a = _mm256_set1_epi16((short)((PD_VP_M0 >> 32) & 0xFF));
    const __m256i low16 = _mm256_set1_epi32(0xFFFF), one32 = _mm256_set1_epi32(1), sixteen = _mm256_set1_epi32(16);
    __m256i w0[NW], w1[NW], lmask[NW], rmask[NW], cld[NW], shr[NW], runi[NW];
    for (int j = 0; j < NW; j++) {
        const lanes *x = p[2 * j], *y = p[2 * j + 1];
        w0[j] = pack2w(s0[2 * j], s0[2 * j + 1]);
        w1[j] = pack2w(s1[2 * j], s1[2 * j + 1]);
        lmask[j] = pack2w(x->lmask, y->lmask);
        rmask[j] = pack2w(x->rmask, y->rmask);
        cld[j] = pack2w(_mm256_and_si256(x->m_lo_d, low16), _mm256_and_si256(y->m_lo_d, low16));
        shr[j] = pack2w(_mm256_sllv_epi32(one32, _mm256_sub_epi32(sixteen, x->lbits)),
                        _mm256_sllv_epi32(one32, _mm256_sub_epi32(sixteen, y->lbits)));
        /* pshufb indices: the run in the low byte, 0x80 (a zero) in the high one */
        runi[j] = _mm256_or_si256(pack2w(x->run, y->run), _mm256_set1_epi16((short)0x8000));
    }
#pragma GCC unroll 24
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int j = 0; j < NW; j++) {
            const __m256i hi = _mm256_add_epi16(_mm256_mulhi_epu16(w0[j], ch), _mm256_mullo_epi16(w0[j], a));
            const __m256i lo = _mm256_mullo_epi16(w0[j], cld[j]);
            const __m256i k = _mm256_shuffle_epi8(c->bkey[i], runi[j]);
            const __m256i n0 = _mm256_and_si256(_mm256_xor_si256(_mm256_xor_si256(hi, k), w1[j]), lmask[j]);
            w1[j] = _mm256_and_si256(_mm256_or_si256(lo, _mm256_mulhi_epu16(w1[j], shr[j])), rmask[j]);
            w0[j] = n0;
        }
    }
    for (int j = 0; j < NW; j++) {
        unpack2w(w0[j], s0 + 2 * j);
        unpack2w(w1[j], s1 + 2 * j);
    }
}

PD_AI void split(const lanes *p, __m256i x, __m256i *s0, __m256i *s1)
{
    *s0 = _mm256_srlv_epi32(x, p->rbits);
    *s1 = _mm256_and_si256(x, p->rmask);
}

/* The 8-bit mask of lanes inside their τ's [0, n), and every lane's joined value. */
PD_AI unsigned inside(const lanes *p, __m256i s0, __m256i s1, __m256i *val)
{
    *val = _mm256_or_si256(_mm256_sllv_epi32(s0, p->rbits), s1);
    const __m256i in = _mm256_cmpeq_epi32(_mm256_min_epu32(*val, p->n_m1), *val);
    return (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(in));
}

/* Store the lanes m selects at dst, packed to the front. */
PD_AI void put(uint32_t *dst, unsigned m, __m256i x)
{
    const __m256i pack = pd__avx2_compress_pattern(m);
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(x, pack));
}

typedef struct outbuf {
    uint32_t val[OBUF + CLANES], idx[OBUF + CLANES];
    uint32_t n;
} outbuf;

static void outbuf_flush(const bctx *c, outbuf *b)
{
    for (uint32_t j = 0; j < b->n; j++)
        c->v[b->idx[j]] = b->val[j];
    b->n = 0;
}

typedef struct queue {
    uint32_t val[QCAP + CLANES], run[QCAP + CLANES], idx[QCAP + CLANES];
    uint32_t n;
} queue;

PD_AI void queue_put(queue *q, uint32_t at, unsigned m, __m256i val, __m256i run, __m256i idx)
{
    put(q->val + at, m, val);
    put(q->run + at, m, run);
    put(q->idx + at, m, idx);
}

/* The first evaluation of a group of consecutive items from i (nv vectors: CNV, or BNV on narrow
 * lanes: L = 5 eval_bytes, L = 16 eval_words). */
PD_AI void compact_first(const bctx *c, queue *q, uint32_t i, const int d, const int L, const int nb)
{
    const int nv = L == 16 ? BNV : L ? nb * CNV : CNV;
    lanes own[BNV];
    const lanes *p[BNV];
    __m256i s0[BNV], s1[BNV];
    const uint32_t r = c->run[i], one = pd__batch_one_run(c->run + i, VW * nv);
    for (int v = 0; v < nv; v++) {
        if (one) {
            p[v] = &c->one[r];
        } else {
            own[v] = lanes_of(c, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c->run + i + VW * v))));
            p[v] = &own[v];
        }
        split(p[v], _mm256_loadu_si256((const __m256i *)(c->v + i + VW * v)), &s0[v], &s1[v]);
    }
    if (L == 16) {
        eval_words(c, p, s0, s1);
    } else if (L) {
        __m256i runb[BNB];
        for (int j = 0; j < nb; j++)
            runb[j] = _mm256_loadu_si256((const __m256i *)(c->run + i + 32 * j));
        eval_bytes(c, p, runb, s0, s1, d, nb);
    } else if (one) {
        eval(c, p, s0, s1, d, c->kr[r]);
    } else {
        eval(c, p, s0, s1, d, NULL);
    }
    for (int v = 0; v < nv; v++) {
        __m256i val;
        const unsigned out = ~inside(p[v], s0[v], s1[v], &val) & 0xFF;
        _mm256_storeu_si256((__m256i *)(c->v + i + VW * v), val); /* lanes still outside are overwritten later */
        const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(i + VW * v)), iota8());
        if (out) { /* never for n = 2^b */
            queue_put(q, q->n, out, val, p[v]->run, idx);
            q->n += (unsigned)__builtin_popcount(out);
        }
    }
}

PD_AI void compact_pass(const bctx *c, queue *q, outbuf *buf, const int d, const int L, const int nb)
{
    const int nv = L == 16 ? BNV : L ? nb * CNV : CNV;
    uint32_t r = 0, w = 0;
    for (; r + VW * nv <= q->n; r += VW * nv) {
        lanes own[BNV];
        const lanes *p[BNV];
        __m256i s0[BNV], s1[BNV], idx[BNV];
        for (int v = 0; v < nv; v++) {
            own[v] = lanes_of(c, _mm256_loadu_si256((const __m256i *)(q->run + r + VW * v)));
            p[v] = &own[v];
            split(p[v], _mm256_loadu_si256((const __m256i *)(q->val + r + VW * v)), &s0[v], &s1[v]);
            idx[v] = _mm256_loadu_si256((const __m256i *)(q->idx + r + VW * v));
        }
        if (L == 16) {
            eval_words(c, p, s0, s1);
        } else if (L) {
            __m256i run[BNV], runb[BNB];
            for (int v = 0; v < nb * CNV; v++)
                run[v] = own[v].run;
            for (int j = 0; j < nb; j++)
                runb[j] = pack4(run + CNV * j);
            eval_bytes(c, p, runb, s0, s1, d, nb);
        } else {
            eval(c, p, s0, s1, d, NULL);
        }
        for (int v = 0; v < nv; v++) {
            __m256i val;
            const unsigned in = inside(p[v], s0[v], s1[v], &val);
            put(buf->val + buf->n, in, val);
            put(buf->idx + buf->n, in, idx[v]);
            buf->n += (unsigned)__builtin_popcount(in);
            queue_put(q, w, ~in & 0xFF, val, p[v]->run, idx[v]); /* w ≤ r + VW·v: only loaded entries */
            w += VW - (unsigned)__builtin_popcount(in);
        }
        if (buf->n >= OBUF)
            outbuf_flush(c, buf);
    }
    for (; r < q->n; r++, w++) {
        q->val[w] = q->val[r];
        q->run[w] = q->run[r];
        q->idx[w] = q->idx[r];
    }
    q->n = w;
}

static void bctx_init(bctx *c, const pd__batch *b)
{
    uint32_t t[7][VW];
    memset(t, 0, sizeof t);
    for (unsigned r = 0; r < b->nruns; r++) {
        const pd_perm *p = b->perm[r];
        t[0][r] = (uint32_t)PD_VP_M0 << (p->rbits - p->lbits);
        t[1][r] = p->lmask;
        t[2][r] = p->rmask;
        t[3][r] = p->lbits;
        t[4][r] = p->rbits;
        t[5][r] = (uint32_t)(p->n - 1);
    }
    c->m_lo_d = _mm256_loadu_si256((const __m256i *)t[0]);
    c->lmask = _mm256_loadu_si256((const __m256i *)t[1]);
    c->rmask = _mm256_loadu_si256((const __m256i *)t[2]);
    c->lbits = _mm256_loadu_si256((const __m256i *)t[3]);
    c->rbits = _mm256_loadu_si256((const __m256i *)t[4]);
    c->n_m1 = _mm256_loadu_si256((const __m256i *)t[5]);
    for (unsigned r = 0; r < b->nruns; r++) {
        c->one[r] = (lanes){.run = _mm256_set1_epi32((int)r), .m_lo_d = _mm256_set1_epi32((int)t[0][r]),
                            .lmask = _mm256_set1_epi32((int)t[1][r]), .rmask = _mm256_set1_epi32((int)t[2][r]),
                            .lbits = _mm256_set1_epi32((int)t[3][r]), .rbits = _mm256_set1_epi32((int)t[4][r]),
                            .n_m1 = _mm256_set1_epi32((int)t[5][r])};
        memcpy(c->kr[r], b->perm[r]->keys.k, sizeof c->kr[r]);
    }
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (unsigned r = 0; r < b->nruns; r++)
            t[6][r] = b->perm[r]->keys.k[i];
        c->key[i] = _mm256_loadu_si256((const __m256i *)t[6]);
    }
    c->v = b->v;
    c->run = b->run;
}

/* The narrow lanes' per-run bytes, and for byte lanes (tables set) the products' tables
 * (bctx_init does the rest). */
static void bctx_init_bytes(bctx *c, const pd__batch *b, int tables)
{
    uint8_t bt[PD_ROUNDS + 3][16], tab[3][32], piece[16];
    memset(bt, 0, sizeof bt);
    for (unsigned r = 0; r < b->nruns; r++) {
        const pd_perm *p = b->perm[r];
        for (int i = 0; i < PD_ROUNDS; i++)
            bt[i][r] = (uint8_t)p->keys.k[i];
        bt[PD_ROUNDS][r] = (uint8_t)p->lmask;
        bt[PD_ROUNDS + 1][r] = (uint8_t)(p->rbits != p->lbits ? 1u << p->lbits : 0);
        bt[PD_ROUNDS + 2][r] = p->rbits != p->lbits ? 0xFF : 0;
    }
    for (int i = 0; i < PD_ROUNDS; i++)
        c->bkey[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bt[i]));
    c->blmask = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bt[PD_ROUNDS]));
    c->btop = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bt[PD_ROUNDS + 1]));
    c->bdl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bt[PD_ROUNDS + 2]));
    if (!tables) /* word lanes multiply instead */
        return;
    uint64_t m = 0; /* M0·x */
    for (uint32_t x = 0; x < 32; x++, m += PD_VP_M0) {
        tab[0][x] = (uint8_t)(m >> 32);
        tab[1][x] = (uint8_t)m;
        tab[2][x] = (uint8_t)(m << 1);
    }
    __m256i *const out[3] = {c->thi, c->tlo, c->tlo1};
    for (int t = 0; t < 3; t++) {
        for (int j = 0; j < 16; j++) /* A = t[16..31], B = t[0..15] ^ t[16..31] */
            piece[j] = tab[t][16 + j];
        out[t][0] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)piece));
        for (int j = 0; j < 16; j++)
            piece[j] = tab[t][j] ^ tab[t][16 + j];
        out[t][1] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)piece));
    }
}

/* d: 0 or 1 (every run's d = 0, or not); on byte lanes (L = 5, see eval_bytes) 0, 1 or 2;
 * L = 16: word lanes (eval_words, d unused). nb: byte vectors a group on byte lanes (1 or 2). */
PD_AI void walk(const pd__batch *b, const int d, const int L, const int nb)
{
    bctx c;
    queue q;
    outbuf buf;
    const uint32_t gl = VW * (L == 16 ? BNV : L ? nb * CNV : CNV); /* lanes per group */
    bctx_init(&c, b);
    if (L)
        bctx_init_bytes(&c, b, L == 5);
    q.n = buf.n = 0;
    uint32_t i = 0;
    while (i + gl <= b->count) {
        const uint32_t end = b->count - i < BLOCK ? i + (b->count - i) / gl * gl : i + BLOCK;
        for (; i < end; i += gl)
            compact_first(&c, &q, i, d, L, nb);
        while (q.n > BLOCK / 2)
            compact_pass(&c, &q, &buf, d, L, nb);
    }
    for (; i < b->count; i++) {
        q.val[q.n] = b->v[i];
        q.run[q.n] = b->run[i];
        q.idx[q.n++] = i;
    }
    while (q.n) {
        /* the drain: on byte lanes, a rest of up to 32 walks takes one byte vector, not two of
         * mostly padding */
        const int one = L == 5 && q.n <= VW * CNV;
        const uint32_t g = one ? VW * CNV : gl;
        for (uint32_t last = q.n - 1; q.n % g; q.n++) {
            q.val[q.n] = q.val[last];
            q.run[q.n] = q.run[last];
            q.idx[q.n] = q.idx[last];
        }
        if (one)
            compact_pass(&c, &q, &buf, d, L, 1);
        else
            compact_pass(&c, &q, &buf, d, L, nb);
    }
    outbuf_flush(&c, &buf);
}

#define PD_WALK(L, D, NB) \
    static void walk_##L##_##D##_##NB(const pd__batch *b) { walk(b, D, L, NB); }
PD_WALK(0, 0, 2)
PD_WALK(0, 1, 2)
PD_WALK(5, 0, 2)
PD_WALK(5, 1, 2)
PD_WALK(5, 2, 2)
PD_WALK(5, 0, 1)
PD_WALK(5, 1, 1)
PD_WALK(5, 2, 1)
PD_WALK(16, 0, 2)
/* Byte lanes with groups of one byte vector (32 lanes) for small batches that walk (a batch of
 * short runs: K = 1, G = 1 takes ~1000 ids of 8 windows), whose last, partly empty groups cost less
 * so; two (64 lanes, two chains in flight) otherwise: a batch that does not walk (n = 2^b) ran 28%
 * slower on one. Zen 5, uneven shards of K = 1, G = 1: ~9% faster. */
static void (*const walk_bytes[2][3])(const pd__batch *) = {{walk_5_0_2, walk_5_1_2, walk_5_2_2},
                                                            {walk_5_0_1, walk_5_1_1, walk_5_2_1}};

void pd__batch_avx2(const pd__batch *b)
{
    unsigned bits = 0, d0 = 0, d1 = 0, walks = 0;
    for (unsigned r = 0; r < b->nruns; r++) {
        const pd_perm *p = b->perm[r];
        bits = p->bits > bits ? p->bits : bits;
        walks |= p->n != UINT64_C(1) << p->bits;
        if (p->rbits != p->lbits)
            d1 = 1;
        else
            d0 = 1;
    }
    if (bits <= PD__BATCH_BYTES_AVX2)
        walk_bytes[walks && b->count <= SMALL_BATCH][d0 && d1 ? 2 : d1](b);
    else if (bits <= PD__BATCH_WORDS_AVX2)
        walk_16_0_2(b);
    else if (d1) /* the lighter round when every run has d = 0 */
        walk_0_1_2(b);
    else
        walk_0_0_2(b);
}

/* ---- Keys of 8 windows: Philox4x32-10 with one window per lane, block by block (core/keys.h) */

void pd__keys_many_avx2(uint64_t seed, uint64_t epoch, uint32_t first, unsigned count, pd_keys *out)
{
    uint32_t blk[4][VW];
    const __m256i stream = _mm256_add_epi32(_mm256_set1_epi32((int)first), iota8());
    for (uint32_t j = 0; j < 7; j++) {
        __m256i c[4] = {_mm256_set1_epi32((int)j), stream, _mm256_set1_epi32((int)(uint32_t)epoch),
                        _mm256_set1_epi32((int)(uint32_t)(epoch >> 32))};
        pd__philox8_avx2(c, (uint32_t)seed, (uint32_t)(seed >> 32));
        _mm256_storeu_si256((__m256i *)blk[0], c[0]);
        _mm256_storeu_si256((__m256i *)blk[1], c[1]);
        _mm256_storeu_si256((__m256i *)blk[2], c[2]);
        _mm256_storeu_si256((__m256i *)blk[3], c[3]);
        for (unsigned w = 0; w < count; w++) {
            if (j < 6)
                for (int i = 0; i < 4; i++)
                    out[w].k[4 * j + i] = blk[i][w];
            else
                out[w].flip = blk[0][w] & 1u;
        }
    }
}
