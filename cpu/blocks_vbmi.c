/* Mixture block slots on AVX-512 VBMI as bytes: 64 reads a register, each on its own block's keys looked up with vpermb, or every slot of 8 blocks (block groups). */
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

/* Byte q (= pos(e), e = 16v + 4(q >> 4) + (q & 3) with v = (q >> 2) & 3) of a plane is byte 0 of dword e & 15 of
 * register v: in vpermt2b's 128 bytes of a register pair, 64·(v & 1) + 4·(e & 15). */
static const uint8_t plane_at[LANES] = {
    0, 4, 8, 12, 64, 68, 72, 76, 0, 4, 8, 12, 64, 68, 72, 76, 16, 20, 24, 28, 80, 84, 88, 92, 16, 20, 24, 28, 80,
    84, 88, 92, 32, 36, 40, 44, 96, 100, 104, 108, 32, 36, 40, 44, 96, 100, 104, 108, 48, 52, 56, 60, 112, 116, 120,
    124, 48, 52, 56, 60, 112, 116, 120, 124
};

/* Byte p of the 64 blocks' outputs x (16 blocks a register, word p / 4), in pack_bytes' order: two vpermt2b
 * (registers 0-1 and 2-3) and a blend, where a shift and a pack per register took seven operations. */
PD_AI __m512i plane(const __m512i x[4][4], __m512i at, unsigned p)
{
    const __m512i idx = _mm512_add_epi8(at, _mm512_set1_epi8((char)(p % 4)));
    const unsigned w = p / 4;
    return _mm512_mask_blend_epi8(UINT64_C(0xFF00FF00FF00FF00), _mm512_permutex2var_epi8(x[0][w], idx, x[1][w]),
                                  _mm512_permutex2var_epi8(x[2][w], idx, x[3][w]));
}

/* The tables of the blocks whose counters' words 2 and 3 are lo[v], hi[v] (16 blocks a register, nv ≤ 4); keys
 * shifted left by shift (whole bytes: rbits, else 0). Round i's key, bits [5i, 5i + lbits) of each block's
 * output, goes to bits [shift, shift + lbits) of its byte: with the output as 16 byte planes, a vpmultishiftqb
 * takes each byte's 8 bits from bit 5i − shift on (bits of the neighbouring byte fill what lies past the
 * plane: masked), and where the key straddles two planes a second one takes the rest from the next plane. */
static void block_tables(uint64_t seed, const __m512i *lo, const __m512i *hi, unsigned nv, unsigned lbits,
                         unsigned shift, tables *t)
{
    __m512i x[4][4];
    for (unsigned v = 0; v < 4; v++) { /* registers past nv: their blocks are never read */
        x[v][0] = _mm512_set1_epi32((int)PD_MIX_CTR_BLOCK);
        x[v][1] = _mm512_setzero_si512();
        x[v][2] = v < nv ? lo[v] : _mm512_setzero_si512();
        x[v][3] = v < nv ? hi[v] : _mm512_setzero_si512();
        if (v < nv)
            philox16(x[v], (uint32_t)seed, (uint32_t)(seed >> 32));
    }
    __m512i pl[16];
    const __m512i at = _mm512_loadu_si512(plane_at);
    for (unsigned p = 0; p < 16; p++)
        pl[p] = plane(x, at, p);
    const __m512i eight = _mm512_set1_epi8(8), kmask = _mm512_set1_epi8((char)(((1u << lbits) - 1) << shift));
    const __m512i at8 = _mm512_set1_epi64(0x3830282018100800LL); /* byte t of each qword: 8t */
    for (unsigned i = 0; i < PD_ROUNDS; i++) {
        const int s = (int)(5 * i) - (int)shift, pa = s >= 0 ? s / 8 : -1; /* the plane of the key's first bit */
        const unsigned o = (unsigned)(s - 8 * pa);                          /* its bit there */
        const __m512i ctl = _mm512_add_epi8(at8, _mm512_set1_epi8((char)o));
        __m512i k = pa >= 0 ? _mm512_multishift_epi64_epi8(ctl, pl[pa]) : _mm512_setzero_si512();
        if (shift + lbits > 8 - o) { /* the rest from the next plane: its bit 0 at bit 8 − o */
            const __m512i next = _mm512_multishift_epi64_epi8(_mm512_sub_epi8(ctl, eight), pl[pa + 1]);
            k = _mm512_ternarylogic_epi32(k, next, _mm512_set1_epi8((char)((1u << (8 - o)) - 1)), 0xE4); /* c ? a : b */
        }
        t->key[i] = _mm512_and_si512(k, kmask);
    }
    t->flip = _mm512_and_si512(pl[15], _mm512_set1_epi8(1)); /* bit 120 */
}

/* The tables of the n ≤ 64 consecutive blocks from beta0: entry e is block beta0 + e. */
static void range_tables(uint64_t seed, uint64_t beta0, uint64_t n, unsigned lbits, unsigned shift, tables *t)
{
    const __m512i lane16 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i lo[4], hi[4];
    const unsigned nv = (unsigned)((n + 15) / 16);
    for (unsigned v = 0; v < nv; v++) {
        const uint64_t base = beta0 + 16 * v;
        const __m512i l = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)base), lane16);
        const __mmask16 wrap = _mm512_cmplt_epu32_mask(l, _mm512_set1_epi32((int)(uint32_t)base));
        const __m512i h = _mm512_set1_epi32((int)(uint32_t)(base >> 32));
        lo[v] = l;
        hi[v] = _mm512_mask_add_epi32(h, wrap, h, _mm512_set1_epi32(1));
    }
    block_tables(seed, lo, hi, nv, lbits, shift, t);
}

/* NV registers of 64 reads through the 24 rounds side by side (one register's rounds form a chain of
 * dependent permutes: alone it would wait on their latency), read l of register v on byte idx[v][l] of
 * t[v], then their blocks' transposition of 0 and 1; d = rbits − lbits. */
#define NV 4

PD_AI void rounds(__m512i s0[NV], __m512i s1[NV], const __m512i idx[NV], const tables *const t[NV], __m512i thi,
                  __m512i tlo, unsigned lbits, const int d)
{
    const __m512i lmask = _mm512_set1_epi8((char)((1u << lbits) - 1)), one = _mm512_set1_epi8(1);
    __m512i a[NV], c[NV], ix[NV]; /* locals, as in vrounds */
    const __m512i *key[NV];
    for (int v = 0; v < NV; v++) {
        a[v] = s0[v];
        c[v] = s1[v];
        ix[v] = idx[v];
        key[v] = t[v]->key;
    }
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int v = 0; v < NV; v++) {
            const __m512i k = _mm512_permutexvar_epi8(ix[v], key[v][i]);
            const __m512i hi = _mm512_permutexvar_epi8(a[v], thi), lo = _mm512_permutexvar_epi8(a[v], tlo);
            if (d) { /* s1 has lbits + 1 bits: its top one moves to s1' (a 16-bit shift: bit 0 of each byte is right) */
                const __m512i top = _mm512_srli_epi16(c[v], (int)lbits);
                a[v] = _mm512_and_si512(_mm512_ternarylogic_epi32(hi, k, c[v], PD_TL_XOR3), lmask);
                c[v] = _mm512_ternarylogic_epi32(lo, top, one, 0x78); /* lo ^ (top & 1) */
            } else {
                a[v] = _mm512_ternarylogic_epi32(hi, k, c[v], PD_TL_XOR3); /* s1 < 2^lbits */
                c[v] = lo;
            }
        }
    }
    for (int v = 0; v < NV; v++) {
        s0[v] = a[v];
        s1[v] = c[v];
    }
    for (int v = 0; v < NV; v++) {
        const __mmask64 low = _mm512_cmpeq_epi8_mask(s0[v], _mm512_setzero_si512()) &
                              _mm512_cmpeq_epi8_mask(_mm512_andnot_si512(one, s1[v]), _mm512_setzero_si512()) &
                              _mm512_test_epi8_mask(_mm512_permutexvar_epi8(idx[v], t[v]->flip), one);
        s1[v] = _mm512_mask_blend_epi8(low, s1[v], _mm512_xor_si512(s1[v], one));
    }
}

static void rounds_d0(__m512i s0[NV], __m512i s1[NV], const __m512i idx[NV], const tables *const t[NV], __m512i thi,
                      __m512i tlo, unsigned lbits)
{
    rounds(s0, s1, idx, t, thi, tlo, lbits, 0);
}

static void rounds_d1(__m512i s0[NV], __m512i s1[NV], const __m512i idx[NV], const tables *const t[NV], __m512i thi,
                      __m512i tlo, unsigned lbits)
{
    rounds(s0, s1, idx, t, thi, tlo, lbits, 1);
}

/* ---- Whole bytes (B ≤ 256, b ≤ 8): a slot v = s0·2^rbits + s1 fits one byte, and a round is
 *
 *     v' = T[v] ^ K_i,   T[v] = (HI[s0] ^ (s1 & lmask)) << rbits | (LO[s0] ^ (d ? s1 >> lbits : 0)),
 *                        K_i  = (k_i & lmask) << rbits,
 *
 * since the key enters s0' only through an xor, which the mask keeps apart: one table lookup of 2^b entries
 * (a vpermb for b = 6, vpermi2b for 7, two and a blend for 8) and an xor per 64 slots, where the halves
 * take three permutes (key, HI, LO) and one to three logic ops. */

typedef struct vtable {
    __m512i t[4]; /* T[0 … 2^b), 64 entries a register */
} vtable;

static void vtable_init(const pd_perm *shape, vtable *vt)
{
    uint8_t hi[LANES], lo[LANES], T[4 * LANES];
    pd__block_round_tables(shape, hi, lo, LANES);
    const unsigned b = shape->lbits + shape->rbits, d = shape->rbits - shape->lbits;
    for (uint32_t v = 0; v < (1u << b); v++) {
        const uint32_t s0 = v >> shape->rbits, s1 = v & shape->rmask;
        T[v] = (uint8_t)((hi[s0] ^ (s1 & shape->lmask)) << shape->rbits | (lo[s0] ^ (d ? s1 >> shape->lbits : 0)));
    }
    for (unsigned q = 0; q < 4; q++)
        vt->t[q] = q < (1u << b) / LANES ? _mm512_loadu_si512(T + LANES * q) : _mm512_setzero_si512();
}

PD_AI __m512i vlookup(const vtable *vt, __m512i v, const unsigned b)
{
    if (b <= 6)
        return _mm512_permutexvar_epi8(v, vt->t[0]);
    const __m512i a = _mm512_permutex2var_epi8(vt->t[0], v, vt->t[1]);
    if (b == 7)
        return a;
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), a, _mm512_permutex2var_epi8(vt->t[2], v, vt->t[3]));
}

/* The block's transposition of 0 and 1 where the flip byte's bit 0 is set. */
PD_AI __m512i vflip(__m512i v, __m512i flip)
{
    const __m512i one = _mm512_set1_epi8(1);
    const __mmask64 low = _mm512_cmple_epu8_mask(v, one) & _mm512_test_epi8_mask(flip, one);
    return _mm512_mask_blend_epi8(low, v, _mm512_xor_si512(v, one));
}

/* NV registers of 64 reads on whole bytes (b: 6, 7 or 8), read l of register v on byte idx[v][l] of t[v]. */
/* The slots, indices and tables are copied to locals first (as rounds' halves): through the pointers, gcc stored
 * every round's slots and loaded the indices, table pointers and T again, since a store might alias them. */
PD_AI void vrounds(__m512i v[NV], const __m512i idx[NV], const tables *const t[NV], const vtable *vt, const unsigned b)
{
    __m512i x[NV], ix[NV];
    const __m512i *key[NV];
    const vtable T = *vt;
    for (int r = 0; r < NV; r++) {
        x[r] = v[r];
        ix[r] = idx[r];
        key[r] = t[r]->key;
    }
    for (int i = 0; i < PD_ROUNDS; i++)
        for (int r = 0; r < NV; r++)
            x[r] = _mm512_xor_si512(vlookup(&T, x[r], b), _mm512_permutexvar_epi8(ix[r], key[r][i]));
    for (int r = 0; r < NV; r++)
        v[r] = vflip(x[r], _mm512_permutexvar_epi8(ix[r], t[r]->flip));
}

#define VROUNDS(B)                                                                                 \
    static void vrounds_##B(__m512i v[NV], const __m512i idx[NV], const tables *const t[NV], const vtable *vt) \
    {                                                                                              \
        vrounds(v, idx, t, vt, B);                                                                 \
    }
VROUNDS(6)
VROUNDS(7)
VROUNDS(8)

/* out[0, n) (n ≤ 64) = the bytes of v, as u32. */
static void store_bytes(uint32_t *out, uint64_t n, __m512i v)
{
    uint8_t b[LANES];
    _mm512_storeu_si512(b, v);
    for (uint64_t q = 0; q < 4 && 16 * q < n; q++) {
        const uint64_t m = n - 16 * q;
        const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 16 * q)));
        _mm512_mask_storeu_epi32(out + 16 * q, m >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << m) - 1), w);
    }
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

/* Table bytes of 64 reads of consecutive blocks: read l (run position g + l·stride, g mod B = off + t0·stride)
 * is in entry (off + (t0 + l)·stride) >> b < 64 of tables whose entry 0 is g's block (32-bit products:
 * stride < 64·B then). */
static __m512i consecutive_idx(const consts *c, uint64_t off, uint64_t t0, uint64_t stride, unsigned b)
{
    const __m512i lane16 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i o = _mm512_set1_epi32((int)(off + t0 * stride)), st = _mm512_set1_epi32((int)stride);
    __m512i ent[4];
    for (int q = 0; q < 4; q++) {
        const __m512i l = _mm512_add_epi32(lane16, _mm512_set1_epi32(16 * q));
        ent[q] = _mm512_srli_epi32(_mm512_add_epi32(o, _mm512_mullo_epi32(l, st)), (int)b);
    }
    const __m512i natural = _mm512_permutexvar_epi8(c->pos, pack_bytes(ent[0], ent[1], ent[2], ent[3]));
    return _mm512_permutexvar_epi8(natural, c->pos);
}

/* The tables of 64 reads from run position g0 that each have a block of their own (stride ≥ B): entry l is
 * read l's block. */
static void own_tables(const pd__block_slots *s, uint64_t g0, unsigned b, unsigned lbits, unsigned shift, tables *t)
{
    __m512i lo[4], hi[4];
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
    block_tables(s->seed, lo, hi, 4, lbits, shift, t);
}

/* The offsets r = (g0 + l·stride) mod B of 64 reads as bytes (whole: B ≤ 256), else their halves as bytes. */
static void read_offsets(const pd__block_slots *s, uint64_t g0, unsigned rbits, const consts *c, const int whole,
                         __m512i *s0, __m512i *s1)
{
    const __m512i r0 = _mm512_set1_epi16((short)(g0 & (s->block - 1))); /* in words: B divides 2^16 */
    const __m512i ra = _mm512_and_si512(_mm512_add_epi16(r0, _mm512_mullo_epi16(c->words, c->stride16)), c->bmask16);
    const __m512i rb = _mm512_and_si512(
        _mm512_add_epi16(r0, _mm512_mullo_epi16(_mm512_add_epi16(c->words, _mm512_set1_epi16(32)), c->stride16)),
        c->bmask16);
    if (whole) {
        *s0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(ra)), _mm512_cvtepi16_epi8(rb), 1);
        return;
    }
    *s0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(ra, (int)rbits))),
                             _mm512_cvtepi16_epi8(_mm512_srli_epi16(rb, (int)rbits)), 1);
    *s1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_and_si512(ra, c->rmask16))),
                             _mm512_cvtepi16_epi8(_mm512_and_si512(rb, c->rmask16)), 1);
}

/* A set of tables kept across the registers of one call: the blocks [beta, beta + n) (n = 0: none). */
typedef struct kept {
    uint64_t beta, n;
} kept;

/* The tables and table bytes of the NV registers of reads from t00 on, of which the first `reads` are stored.
 * Where those lie in at most 64 consecutive blocks (stride ≤ B/4), one set of tables serves every register:
 * with W = 8 and B = 64, 256 reads share 32 blocks' keys, where a set per register built 8 blocks' each in a
 * 16-lane Philox and four 16-lane key packs a round (the tables were 17% of a W = 8 mixture read; the rounds
 * 2%). That set holds up to 64 blocks from the first read's (*k), as many as the call's remaining reads reach, and
 * serves the next steps' registers while their blocks lie in it: W = 8's 256 reads from a block's first read take
 * 32 blocks, so it is built every other step (pd__block_slots_vbmi aligns the steps). Else a set per register, of
 * consecutive blocks or of each read's own. */
static void prepare(const pd__block_slots *s, uint64_t t00, uint64_t reads, unsigned b, unsigned lbits,
                    unsigned shift, const consts *c, tables t[NV], const tables *tp[NV], __m512i idx[NV], kept *k)
{
    const uint64_t B = s->block, g00 = s->first + t00 * s->stride, beta = g00 >> b;
    const uint64_t span = ((g00 & (B - 1)) + (reads - 1) * s->stride) >> b; /* last read's block − first's */
    if (span < LANES) {
        if (beta < k->beta || beta + span >= k->beta + k->n) {
            const uint64_t reach = (((g00 & (B - 1)) + (s->count - t00 - 1) * s->stride) >> b) + 1;
            k->beta = beta;
            k->n = reach < LANES ? reach : LANES;
            range_tables(s->seed, beta, k->n, lbits, shift, &t[0]);
        }
        for (int v = 0; v < NV; v++) { /* entries from the set's first block */
            idx[v] = consecutive_idx(c, g00 - (k->beta << b), (uint64_t)v * LANES, s->stride, b);
            tp[v] = &t[0];
        }
        return;
    }
    k->n = 0;
    for (int v = 0; v < NV; v++) { /* registers past the count compute reads never stored */
        const uint64_t g0 = g00 + (uint64_t)v * LANES * s->stride, span0 = ((g0 & (B - 1)) + (LANES - 1) * s->stride) >> b;
        if (span0 < LANES) {
            range_tables(s->seed, g0 >> b, span0 + 1, lbits, shift, &t[v]);
            idx[v] = consecutive_idx(c, g0 & (B - 1), 0, s->stride, b);
        } else {
            own_tables(s, g0, b, lbits, shift, &t[v]);
            idx[v] = c->pos;
        }
        tp[v] = &t[v];
    }
}

void pd__block_slots_vbmi(const pd__block_slots *s)
{
    pd_perm shape;
    pd__perm_shape(&shape, s->block, PD_MIN_BITS);
    const unsigned b = shape.lbits + shape.rbits, lbits = shape.lbits, rbits = shape.rbits;
    const int whole = b <= 8;
    uint8_t hi_tab[LANES], lo_tab[LANES], pos_tab[LANES];
    pd__block_round_tables(&shape, hi_tab, lo_tab, LANES);
    for (unsigned e = 0; e < LANES; e++)
        pos_tab[e] = pos(e);
    const consts cs = {
        .thi = _mm512_loadu_si512(hi_tab),
        .tlo = _mm512_loadu_si512(lo_tab),
        .pos = _mm512_loadu_si512(pos_tab),
        .words = _mm512_cvtepu8_epi16(_mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                                       19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)),
        .rmask16 = _mm512_set1_epi16((short)shape.rmask),
        .bmask16 = _mm512_set1_epi16((short)(s->block - 1)),
        .stride16 = _mm512_set1_epi16((short)(s->stride & (s->block - 1))),
    };
    vtable vt;
    if (whole)
        vtable_init(&shape, &vt);
    void (*const vrun)(__m512i *, const __m512i *, const tables *const *, const vtable *) =
        b == 6 ? vrounds_6 : b == 7 ? vrounds_7 : vrounds_8;
    tables t[NV];
    const tables *tp[NV];
    __m512i s0[NV], s1[NV], idx[NV];
    kept k = {0, 0};
    /* Steps of NV registers. Where W divides B (p = B/W reads a block, p ≤ NV·64), the first step stops short at a
     * block's first read, so that every later one starts at one and its NV·64 reads fill NV·64/p blocks exactly
     * (with W = 8, 32: two steps a set of tables, prepare); else each would take one block more, and no two would
     * share a set. */
    uint64_t step = NV * LANES;
    const uint64_t per = s->stride < s->block && s->block % s->stride == 0 ? s->block / s->stride : 0;
    if (per && per <= NV * LANES) {
        const uint64_t off = s->first & (s->block - 1);
        const uint64_t head = off < s->stride ? 0 : (s->block - off + s->stride - 1) / s->stride; /* its block's rest */
        step = head + (NV * LANES - head) / per * per;
    }
    for (uint64_t t00 = 0, end; t00 < s->count; t00 = end, step = NV * LANES) {
        end = s->count - t00 < step ? s->count : t00 + step;
        prepare(s, t00, end - t00, b, lbits, whole ? rbits : 0, &cs, t, tp, idx, &k);
        for (int v = 0; v < NV; v++)
            read_offsets(s, s->first + (t00 + (uint64_t)v * LANES) * s->stride, rbits, &cs, whole, &s0[v], &s1[v]);
        if (whole)
            vrun(s0, idx, tp, &vt);
        else
            (rbits != lbits ? rounds_d1 : rounds_d0)(s0, s1, idx, tp, cs.thi, cs.tlo, lbits);
        for (int v = 0; v < NV; v++) {
            const uint64_t t0 = t00 + (uint64_t)v * LANES;
            if (t0 >= end)
                break;
            const uint64_t n = end - t0 < LANES ? end - t0 : LANES;
            if (whole)
                store_bytes(s->out + t0, n, s0[v]);
            else
                store_slots(s->out + t0, n, s0[v], s1[v], rbits);
        }
    }
}

/* ---- Block groups (pd__block_group_vbmi): every slot of 8 blocks on whole bytes, in kernel.h's layout
 * (register j: slots 8j … 8j + 7 of each block, four of block l at bytes 4l … 4l + 3 of each half), so each
 * round's keys are one register for every register of the group, and a round is a lookup and an xor per 64
 * slots (blocks_avx2.c's group kernel: seven operations per 32). */

#define GV 8 /* registers in flight: the lookup's latency is hidden by the others' */

PD_AI void group_rounds(__m512i v[GV], const __m512i key[PD_ROUNDS], __m512i flip, const vtable *vt, const unsigned b)
{
    for (int i = 0; i < PD_ROUNDS; i++)
        for (int r = 0; r < GV; r++)
            v[r] = _mm512_xor_si512(vlookup(vt, v[r], b), key[i]);
    for (int r = 0; r < GV; r++)
        v[r] = vflip(v[r], flip);
}

#define GROUP_ROUNDS(B)                                                                                       \
    static void group_rounds_##B(__m512i v[GV], const __m512i key[PD_ROUNDS], __m512i flip, const vtable *vt) \
    {                                                                                                         \
        group_rounds(v, key, flip, vt, B);                                                                    \
    }
GROUP_ROUNDS(6)
GROUP_ROUNDS(7)
GROUP_ROUNDS(8)

void pd__block_group_vbmi(const pd__block_group *t)
{
    pd_perm shape;
    pd__perm_shape(&shape, t->block, PD_MIN_BITS);
    const unsigned b = shape.lbits + shape.rbits;
    vtable vt;
    vtable_init(&shape, &vt);
    tables tb;
    range_tables(t->seed, t->first, PD__BLOCK_GROUP, shape.lbits, shape.rbits, &tb);
    uint8_t gi[LANES], base[LANES];
    for (unsigned p = 0; p < LANES; p++) {
        gi[p] = pos((p % 32) / 4);              /* byte p holds a slot of block (p mod 32) / 4 */
        base[p] = (uint8_t)(4 * (p / 32) + p % 4); /* register 0's slot there */
    }
    const __m512i gidx = _mm512_loadu_si512(gi), first = _mm512_loadu_si512(base);
    __m512i key[PD_ROUNDS];
    for (int i = 0; i < PD_ROUNDS; i++)
        key[i] = _mm512_permutexvar_epi8(gidx, tb.key[i]);
    const __m512i flip = _mm512_permutexvar_epi8(gidx, tb.flip);
    void (*const run)(__m512i *, const __m512i *, __m512i, const vtable *) =
        b == 6 ? group_rounds_6 : b == 7 ? group_rounds_7 : group_rounds_8;
    for (uint32_t j0 = 0; j0 < t->block / 8; j0 += GV) {
        __m512i v[GV];
        for (uint32_t j = 0; j < GV; j++)
            v[j] = _mm512_add_epi8(first, _mm512_set1_epi8((char)(8 * (j0 + j))));
        run(v, key, flip, &vt);
        for (uint32_t j = 0; j < GV; j++)
            _mm512_storeu_si512(t->out + 64 * (j0 + j), v[j]);
    }
}
