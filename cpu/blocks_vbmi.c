/* Mixture block slots on AVX-512 VBMI: 64 reads per register as bytes, each on its own block's keys, looked up with vpermb. */
#include "cpu/kernel.h"

#ifdef PD_CPU_AVX512_EMULATED /* tests on CPUs without VBMI: see avx512_emu.h */
#include "cpu/avx512_emu.h"
#else
#include <immintrin.h>
#endif

#include "core/philox.h"

/*
 * out[t] = π_β(r) for the reads g = first + t·stride, β = g >> b, r = g mod B (mixtures-v1 §5): v1's f on
 * b = log2 B ≤ 11 bits, so a half fits a byte (s0: lbits ≤ 5 bits, s1: rbits ≤ 6). A round reads s0 only
 * through M0·s0 (as blocks_avx2.c's comment shows), so with k the round key (low lbits bits):
 *
 *     s0' = HI[s0] ^ ((s1 ^ k) & lmask)      HI[s0] = hi32(M0·s0) & lmask
 *     s1' = LO[s0] ^ (d ? s1 >> lbits : 0)   LO[s0] = (lo32(M0·s0) << d) & rmask,  d = rbits − lbits
 *
 * HI and LO have 2^lbits ≤ 32 entries: a vpermb each. Keys differ per block: the blocks of 64 reads get
 * their Philox outputs 16 at a time (one counter per block, not per read), round i's keys of up to 64 blocks
 * become one byte register, and each read takes its block's with a vpermb by its block's index. Reads of
 * consecutive blocks (stride < B) share them; with stride ≥ B every read is its own block.
 */

#define PD_AI static inline __attribute__((always_inline))
#define LANES 64
#define PD_TL_XOR3 0x96 /* a ^ b ^ c */

/* hi32(c·m) of every lane. */
PD_AI __m512i mulhi32(__m512i c, __m512i m)
{
    const __m512i e = _mm512_srli_epi64(_mm512_mul_epu32(c, m), 32);
    const __m512i o = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
    return _mm512_mask_blend_epi32((__mmask16)0xAAAA, e, o);
}

/* Philox4x32-10 (core/philox.h) on 16 lanes: counter word w of every lane in x[w], one key. */
PD_AI void philox16(__m512i x[4], uint32_t k0, uint32_t k1)
{
    const __m512i m0 = _mm512_set1_epi32((int)PD_PHILOX_M0), m1 = _mm512_set1_epi32((int)PD_PHILOX_M1);
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += PD_PHILOX_W0;
            k1 += PD_PHILOX_W1;
        }
        const __m512i hi0 = mulhi32(x[0], m0), lo0 = _mm512_mullo_epi32(x[0], m0);
        const __m512i hi1 = mulhi32(x[2], m1), lo1 = _mm512_mullo_epi32(x[2], m1);
        x[0] = _mm512_ternarylogic_epi32(hi1, x[1], _mm512_set1_epi32((int)k0), PD_TL_XOR3);
        x[2] = _mm512_ternarylogic_epi32(hi0, x[3], _mm512_set1_epi32((int)k1), PD_TL_XOR3);
        x[1] = lo1;
        x[3] = lo0;
    }
}

/* Bits [at, at + 5) of each lane's 128-bit output x (pd__mix_block_keys), and-ed with mask. */
PD_AI __m512i packed_key(const __m512i x[4], unsigned at, __m512i mask)
{
    const unsigned w = at / 32, off = at % 32;
    __m512i v = _mm512_srli_epi32(x[w], off);
    if (off > 27)
        v = _mm512_or_si512(v, _mm512_slli_epi32(x[w + 1], 32 - off));
    return _mm512_and_si512(v, mask);
}

/* Four registers of 16 dwords, each below 2^15, as 64 bytes in the order of two packs: dword j of register
 * v, j = 4L + i, lands in byte 16L + 4v + i (pos() below; unpermute with a vpermb by POS). */
PD_AI __m512i pack_bytes(__m512i a, __m512i b, __m512i c, __m512i d)
{
    return _mm512_packus_epi16(_mm512_packus_epi32(a, b), _mm512_packus_epi32(c, d));
}

static inline uint8_t pos(unsigned e)
{
    return (uint8_t)(16 * ((e >> 2) & 3) + 4 * (e >> 4) + (e & 3));
}

/* Per-block tables of up to 64 blocks, block e at byte pos(e): round keys (low lbits bits) and the flip. */
typedef struct tables {
    __m512i key[PD_ROUNDS], flip;
} tables;

/* The tables of the blocks whose counters' words 2 and 3 are lo[v], hi[v] (16 blocks a register, nv ≤ 4). */
static void block_tables(uint64_t seed, const __m512i *lo, const __m512i *hi, unsigned nv, unsigned lbits,
                         tables *t)
{
    __m512i x[4][4];
    const __m512i lmask = _mm512_set1_epi32((int)((1u << lbits) - 1)), one = _mm512_set1_epi32(1);
    for (unsigned v = 0; v < 4; v++) {
        x[v][0] = _mm512_set1_epi32((int)PD_MIX_CTR_BLOCK);
        x[v][1] = _mm512_setzero_si512();
        x[v][2] = v < nv ? lo[v] : _mm512_setzero_si512();
        x[v][3] = v < nv ? hi[v] : _mm512_setzero_si512();
        if (v < nv)
            philox16(x[v], (uint32_t)seed, (uint32_t)(seed >> 32));
    }
    for (unsigned i = 0; i < PD_ROUNDS; i++)
        t->key[i] = pack_bytes(packed_key(x[0], 5 * i, lmask), packed_key(x[1], 5 * i, lmask),
                               packed_key(x[2], 5 * i, lmask), packed_key(x[3], 5 * i, lmask));
    t->flip = pack_bytes(_mm512_and_si512(_mm512_srli_epi32(x[0][3], 24), one), /* bit 120 */
                         _mm512_and_si512(_mm512_srli_epi32(x[1][3], 24), one),
                         _mm512_and_si512(_mm512_srli_epi32(x[2][3], 24), one),
                         _mm512_and_si512(_mm512_srli_epi32(x[3][3], 24), one));
}

/* NV registers of 64 reads through the 24 rounds side by side (one register's rounds form a chain of
 * dependent permutes: alone it would wait on their latency), read l of register v on byte idx[v][l] of
 * t[v], then their blocks' transposition of 0 and 1; d = rbits − lbits. */
#define NV 4

PD_AI void rounds(__m512i s0[NV], __m512i s1[NV], const __m512i idx[NV], const tables t[NV], __m512i thi, __m512i tlo,
                  unsigned lbits, const int d)
{
    const __m512i lmask = _mm512_set1_epi8((char)((1u << lbits) - 1)), one = _mm512_set1_epi8(1);
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int v = 0; v < NV; v++) {
            const __m512i k = _mm512_permutexvar_epi8(idx[v], t[v].key[i]);
            const __m512i hi = _mm512_permutexvar_epi8(s0[v], thi), lo = _mm512_permutexvar_epi8(s0[v], tlo);
            if (d) { /* s1 has lbits + 1 bits: its top one moves to s1' (a 16-bit shift: bit 0 of each byte is right) */
                const __m512i top = _mm512_srli_epi16(s1[v], (int)lbits);
                s0[v] = _mm512_and_si512(_mm512_ternarylogic_epi32(hi, k, s1[v], PD_TL_XOR3), lmask);
                s1[v] = _mm512_ternarylogic_epi32(lo, top, one, 0x78); /* lo ^ (top & 1) */
            } else {
                s0[v] = _mm512_ternarylogic_epi32(hi, k, s1[v], PD_TL_XOR3); /* s1 < 2^lbits */
                s1[v] = lo;
            }
        }
    }
    for (int v = 0; v < NV; v++) {
        const __mmask64 low = _mm512_cmpeq_epi8_mask(s0[v], _mm512_setzero_si512()) &
                              _mm512_cmpeq_epi8_mask(_mm512_andnot_si512(one, s1[v]), _mm512_setzero_si512()) &
                              _mm512_test_epi8_mask(_mm512_permutexvar_epi8(idx[v], t[v].flip), one);
        s1[v] = _mm512_mask_blend_epi8(low, s1[v], _mm512_xor_si512(s1[v], one));
    }
}

static void rounds_d0(__m512i s0[NV], __m512i s1[NV], const __m512i idx[NV], const tables t[NV], __m512i thi,
                      __m512i tlo, unsigned lbits)
{
    rounds(s0, s1, idx, t, thi, tlo, lbits, 0);
}

static void rounds_d1(__m512i s0[NV], __m512i s1[NV], const __m512i idx[NV], const tables t[NV], __m512i thi,
                      __m512i tlo, unsigned lbits)
{
    rounds(s0, s1, idx, t, thi, tlo, lbits, 1);
}

/* out[0, n) (n ≤ 64) = s0 << rbits | s1 of lanes 0 … n − 1, as u32. */
static void store_slots(uint32_t *out, uint64_t n, __m512i s0, __m512i s1, unsigned rbits)
{
    const __m512i w0 = _mm512_or_si512(_mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(s0)), (int)rbits),
                                       _mm512_cvtepu8_epi16(_mm512_castsi512_si256(s1)));
    const __m512i w1 = _mm512_or_si512(
        _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(s0, 1)), (int)rbits),
        _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(s1, 1)));
    const __m512i v[4] = {_mm512_cvtepu16_epi32(_mm512_castsi512_si256(w0)),
                          _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w0, 1)),
                          _mm512_cvtepu16_epi32(_mm512_castsi512_si256(w1)),
                          _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(w1, 1))};
    for (uint64_t q = 0; q < 4 && 16 * q < n; q++) {
        const uint64_t m = n - 16 * q;
        _mm512_mask_storeu_epi32(out + 16 * q, m >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << m) - 1), v[q]);
    }
}

/* What every register of a call shares. */
typedef struct consts {
    __m512i thi, tlo, pos, words, rmask16, bmask16, stride16;
} consts;

/* One register: the reads t0 … t0 + 63 (their first at run position g0): their blocks' tables, each read's
 * table byte, and its halves. */
static void prepare(const pd__block_slots *s, uint64_t g0, unsigned b, unsigned rbits, unsigned lbits, tables *t,
                    __m512i *idx, __m512i *s0, __m512i *s1, const consts *c)
{
    const __m512i lane16 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint64_t beta0 = g0 >> b;
    const uint64_t span = ((g0 & (s->block - 1)) + (LANES - 1) * s->stride) >> b; /* last read's block − beta0 */
    __m512i lo[4], hi[4];
    unsigned nv;
    if (span < LANES) { /* consecutive blocks: entry e = block beta0 + e */
        nv = (unsigned)(span / 16 + 1);
        for (unsigned v = 0; v < nv; v++) {
            const uint64_t base = beta0 + 16 * v;
            const __m512i l = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)base), lane16);
            const __mmask16 wrap = _mm512_cmplt_epu32_mask(l, _mm512_set1_epi32((int)(uint32_t)base));
            const __m512i h = _mm512_set1_epi32((int)(uint32_t)(base >> 32));
            lo[v] = l;
            hi[v] = _mm512_mask_add_epi32(h, wrap, h, _mm512_set1_epi32(1));
        }
        /* read l's entry (g0 mod B + l·stride) >> b < 64 (then stride < 2^17: 32-bit products) */
        const __m512i off = _mm512_set1_epi32((int)(g0 & (s->block - 1))), st = _mm512_set1_epi32((int)s->stride);
        __m512i ent[4];
        for (int q = 0; q < 4; q++) {
            const __m512i l = _mm512_add_epi32(lane16, _mm512_set1_epi32(16 * q));
            ent[q] = _mm512_srli_epi32(_mm512_add_epi32(off, _mm512_mullo_epi32(l, st)), (int)b);
        }
        const __m512i natural = _mm512_permutexvar_epi8(c->pos, pack_bytes(ent[0], ent[1], ent[2], ent[3]));
        *idx = _mm512_permutexvar_epi8(natural, c->pos);
    } else { /* every read its own block: entry l = read l's block */
        nv = 4;
        const __m512i lane8 = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
        const __m512i first = _mm512_set1_epi64((long long)g0), stride = _mm512_set1_epi64((long long)s->stride);
        for (unsigned v = 0; v < 4; v++) {
            const __m512i l0 = _mm512_add_epi64(lane8, _mm512_set1_epi64(16 * v));
            const __m512i l1 = _mm512_add_epi64(l0, _mm512_set1_epi64(8));
            const __m512i b0 = _mm512_srli_epi64(_mm512_add_epi64(first, _mm512_mul_epu32(l0, stride)), b);
            const __m512i b1 = _mm512_srli_epi64(_mm512_add_epi64(first, _mm512_mul_epu32(l1, stride)), b);
            lo[v] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(b0)), _mm512_cvtepi64_epi32(b1), 1);
            hi[v] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_srli_epi64(b0, 32))),
                                       _mm512_cvtepi64_epi32(_mm512_srli_epi64(b1, 32)), 1);
        }
        *idx = c->pos;
    }
    block_tables(s->seed, lo, hi, nv, lbits, t);
    /* r = (g0 + l·stride) mod B in words (B divides 2^16), then the halves as bytes */
    const __m512i r0 = _mm512_set1_epi16((short)(g0 & (s->block - 1)));
    const __m512i ra = _mm512_and_si512(_mm512_add_epi16(r0, _mm512_mullo_epi16(c->words, c->stride16)), c->bmask16);
    const __m512i rb = _mm512_and_si512(
        _mm512_add_epi16(r0, _mm512_mullo_epi16(_mm512_add_epi16(c->words, _mm512_set1_epi16(32)), c->stride16)),
        c->bmask16);
    *s0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(ra, (int)rbits))),
                             _mm512_cvtepi16_epi8(_mm512_srli_epi16(rb, (int)rbits)), 1);
    *s1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_and_si512(ra, c->rmask16))),
                             _mm512_cvtepi16_epi8(_mm512_and_si512(rb, c->rmask16)), 1);
}

void pd__block_slots_vbmi(const pd__block_slots *s)
{
    pd_perm shape;
    pd__perm_shape(&shape, s->block, PD_MIN_BITS);
    const unsigned b = shape.lbits + shape.rbits, lbits = shape.lbits, rbits = shape.rbits;
    uint8_t hi_tab[LANES], lo_tab[LANES], pos_tab[LANES];
    pd__block_round_tables(&shape, hi_tab, lo_tab, LANES);
    for (unsigned e = 0; e < LANES; e++)
        pos_tab[e] = pos(e);
    consts cs = {
        .thi = _mm512_loadu_si512(hi_tab),
        .tlo = _mm512_loadu_si512(lo_tab),
        .pos = _mm512_loadu_si512(pos_tab),
        .words = _mm512_cvtepu8_epi16(_mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                                       19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)),
        .rmask16 = _mm512_set1_epi16((short)shape.rmask),
        .bmask16 = _mm512_set1_epi16((short)(s->block - 1)),
        .stride16 = _mm512_set1_epi16((short)(s->stride & (s->block - 1))),
    };
    const consts *c = &cs;
    tables t[NV];
    __m512i s0[NV], s1[NV], idx[NV];
    for (uint64_t t00 = 0; t00 < s->count; t00 += NV * LANES) {
        for (int v = 0; v < NV; v++) { /* registers past the count compute reads never stored */
            const uint64_t t0 = t00 + (uint64_t)v * LANES;
            const uint64_t g0 = s->first + t0 * s->stride;
            prepare(s, g0, b, rbits, lbits, &t[v], &idx[v], &s0[v], &s1[v], c);
        }
        (rbits != lbits ? rounds_d1 : rounds_d0)(s0, s1, idx, t, c->thi, c->tlo, lbits);
        for (int v = 0; v < NV; v++) {
            const uint64_t t0 = t00 + (uint64_t)v * LANES;
            if (t0 < s->count)
                store_slots(s->out + t0, s->count - t0 < LANES ? s->count - t0 : LANES, s0[v], s1[v], rbits);
        }
    }
}
