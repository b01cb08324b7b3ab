/* σ of several windows' short runs at once on AVX2: every lane carries its own τ (keys and shape by its run number), cycle-walked by compaction. */
#include "cpu/kernel.h"
#include "cpu/philox_avx2.h"

#include <immintrin.h>
#include <string.h>

/* batch_avx512.c on 8 lanes (read it first): per-run values are 8-entry tables read with vpermd,
 * so a batch holds at most 8 runs; the round is kernel_avx2.c's; compress goes through
 * kernel_avx2.c's lookup table, and unsigned compares through min. With 16 registers, values
 * the round reads are kept in memory (bctx.one) wherever a group lies inside one run. */

#define PD_AI static inline __attribute__((always_inline))
#define VW 8
#define CNV 4
#define CLANES (VW * CNV)
#define BLOCK 512
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
    hi = _mm256_add_epi32(hi, _mm256_mullo_epi32(*s0, m_hi));
    __m256i lo = _mm256_mullo_epi32(*s0, p->m_lo_d);
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
    const __m256i pack = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pd__avx2_compress_tab[m]));
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

PD_AI void compact_first(const bctx *c, queue *q, uint32_t i, const int d)
{
    lanes own[CNV];
    const lanes *p[CNV];
    __m256i s0[CNV], s1[CNV];
    const uint32_t r = c->run[i], one = pd__batch_one_run(c->run + i, CLANES);
    for (int v = 0; v < CNV; v++) {
        if (one) {
            p[v] = &c->one[r];
        } else {
            own[v] = lanes_of(c, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c->run + i + VW * v))));
            p[v] = &own[v];
        }
        split(p[v], _mm256_loadu_si256((const __m256i *)(c->v + i + VW * v)), &s0[v], &s1[v]);
    }
    if (one)
        eval(c, p, s0, s1, d, c->kr[r]);
    else
        eval(c, p, s0, s1, d, NULL);
    for (int v = 0; v < CNV; v++) {
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

PD_AI void compact_pass(const bctx *c, queue *q, outbuf *buf, const int d)
{
    uint32_t r = 0, w = 0;
    for (; r + CLANES <= q->n; r += CLANES) {
        lanes own[CNV];
        const lanes *p[CNV];
        __m256i s0[CNV], s1[CNV], idx[CNV];
        for (int v = 0; v < CNV; v++) {
            own[v] = lanes_of(c, _mm256_loadu_si256((const __m256i *)(q->run + r + VW * v)));
            p[v] = &own[v];
            split(p[v], _mm256_loadu_si256((const __m256i *)(q->val + r + VW * v)), &s0[v], &s1[v]);
            idx[v] = _mm256_loadu_si256((const __m256i *)(q->idx + r + VW * v));
        }
        eval(c, p, s0, s1, d, NULL);
        for (int v = 0; v < CNV; v++) {
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

PD_AI void walk(const pd__batch *b, const int d)
{
    bctx c;
    queue q;
    outbuf buf;
    bctx_init(&c, b);
    q.n = buf.n = 0;
    uint32_t i = 0;
    while (i + CLANES <= b->count) {
        const uint32_t end = b->count - i < BLOCK ? i + (b->count - i) / CLANES * CLANES : i + BLOCK;
        for (; i < end; i += CLANES)
            compact_first(&c, &q, i, d);
        while (q.n > BLOCK / 2)
            compact_pass(&c, &q, &buf, d);
    }
    for (; i < b->count; i++) {
        q.val[q.n] = b->v[i];
        q.run[q.n] = b->run[i];
        q.idx[q.n++] = i;
    }
    while (q.n) {
        for (uint32_t last = q.n - 1; q.n % CLANES; q.n++) {
            q.val[q.n] = q.val[last];
            q.run[q.n] = q.run[last];
            q.idx[q.n] = q.idx[last];
        }
        compact_pass(&c, &q, &buf, d);
    }
    outbuf_flush(&c, &buf);
}

static void walk_d0(const pd__batch *b)
{
    walk(b, 0);
}

static void walk_d1(const pd__batch *b)
{
    walk(b, 1);
}

void pd__batch_avx2(const pd__batch *b)
{
    int any_d = 0; /* the lighter round when every run has d = 0 */
    for (unsigned r = 0; r < b->nruns; r++)
        any_d |= b->perm[r]->rbits != b->perm[r]->lbits;
    if (any_d)
        walk_d1(b);
    else
        walk_d0(b);
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
