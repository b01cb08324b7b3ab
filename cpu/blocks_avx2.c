/* Mixture block slots on AVX2: every slot of 8 blocks' π_β at once, or every read on its own block's keys; a byte per slot, the round function a pshufb. */
#include "cpu/kernel.h"
#include "cpu/philox_avx2.h"

#include <immintrin.h>
#include <string.h>

/*
 * π_β is v1's f on b = log2 B ≤ 8 bits (mixtures-v1 §2, §5). A round of VariablePhilox reads its left
 * half s0 (lbits ≤ 4 bits) only through M0·s0, so with v = s0·2^rbits + s1 (d = rbits − lbits)
 *
 *     v' = TT[s0] ^ (((s1 ^ k_i) & lmask) << rbits) ^ (d ? s1 >> lbits : 0),
 *     TT[s0] = (hi32(M0·s0) & lmask) << rbits | (lo32(M0·s0) << d) & rmask,
 *
 * TT having 2^lbits ≤ 16 entries: one pshufb per 32 slots. Register j holds slots 4j … 4j + 3 of each of the
 * 8 blocks (pd__block_group_at), so round i's keys are one register for all B/4 of them, built from the 8
 * blocks' Philox outputs computed side by side. About 7 vector operations per slot-round, no multiply.
 */

#define PD_AI static inline __attribute__((always_inline))
#define NV 8 /* registers in flight: independent rounds hide each other's latency (16 ymm in all) */

/* NV registers of slots through the 24 rounds and the blocks' transposition of 0 and 1. */
PD_AI void rounds(__m256i *v, const __m256i keys[PD_ROUNDS], __m256i flip, __m256i tt, __m128i rb, __m128i lb,
                  __m256i lmask, const int d)
{
    const __m256i one = _mm256_set1_epi8(1);
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int j = 0; j < NV; j++) {
            /* 16-bit shifts: bits crossing from the next byte land above lbits (b ≤ 8) and are masked off */
            const __m256i s0 = _mm256_and_si256(_mm256_srl_epi16(v[j], rb), lmask);
            const __m256i low = _mm256_sll_epi16(_mm256_and_si256(_mm256_xor_si256(v[j], keys[i]), lmask), rb);
            __m256i next = _mm256_xor_si256(_mm256_shuffle_epi8(tt, s0), low);
            if (d)
                next = _mm256_xor_si256(next, _mm256_and_si256(_mm256_srl_epi16(v[j], lb), one));
            v[j] = next;
        }
    }
    for (int j = 0; j < NV; j++) {
        const __m256i low2 = _mm256_cmpeq_epi8(_mm256_andnot_si256(one, v[j]), _mm256_setzero_si256()); /* v < 2 */
        v[j] = _mm256_xor_si256(v[j], _mm256_and_si256(low2, flip));
    }
}

static void rounds_d0(__m256i *v, const __m256i keys[PD_ROUNDS], __m256i flip, __m256i tt, __m128i rb, __m128i lb,
                      __m256i lmask)
{
    rounds(v, keys, flip, tt, rb, lb, lmask, 0);
}

static void rounds_d1(__m256i *v, const __m256i keys[PD_ROUNDS], __m256i flip, __m256i tt, __m128i rb, __m128i lb,
                      __m256i lmask)
{
    rounds(v, keys, flip, tt, rb, lb, lmask, 1);
}

/* Bits [at, at + 5) of each lane's 128-bit Philox output x (pd__mix_block_keys), in the lane's low bits (above
 * them, junk the caller masks off). */
PD_AI __m256i key_bits(const __m256i x[4], unsigned at)
{
    const unsigned w = at / 32, off = at % 32;
    __m256i kv = _mm256_srli_epi32(x[w], (int)off);
    if (off > 27)
        kv = _mm256_or_si256(kv, _mm256_slli_epi32(x[w + 1], (int)(32 - off)));
    return kv;
}

/* key_bits' five bits, spread to the lane's 4 bytes. */
PD_AI __m256i packed_key(const __m256i x[4], unsigned at, __m256i spread)
{
    return _mm256_shuffle_epi8(_mm256_and_si256(key_bits(x, at), _mm256_set1_epi32(31)), spread);
}

void pd__block_group_avx2(const pd__block_group *t)
{
    pd_perm shape;
    pd__perm_shape(&shape, t->block, PD_MIN_BITS);
    uint8_t tt[32], hi[16], lo[16];
    pd__block_round_tables(&shape, hi, lo, 16);
    for (uint32_t s0 = 0; s0 < 16; s0++)
        tt[s0] = tt[16 + s0] = (uint8_t)(hi[s0 & shape.lmask] << shape.rbits | lo[s0 & shape.lmask]);
    /* the 8 blocks' keys: counter (8, 0, β lo, β hi) per lane */
    const __m256i beta_lo = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)t->first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_set1_epi32((int)(uint32_t)t->first), _mm256_set1_epi32(INT32_MIN)),
                                             _mm256_xor_si256(beta_lo, _mm256_set1_epi32(INT32_MIN))); /* the low word wrapped */
    __m256i x[4] = {_mm256_set1_epi32((int)PD_MIX_CTR_BLOCK), _mm256_setzero_si256(), beta_lo,
                    _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(t->first >> 32)), carry)};
    pd__philox8_avx2(x, (uint32_t)t->seed, (uint32_t)(t->seed >> 32));
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4,
                                            8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i lmask = _mm256_set1_epi8((char)shape.lmask);
    __m256i keys[PD_ROUNDS];
    for (unsigned i = 0; i < PD_ROUNDS; i++) /* k_i's low lbits: xored into s1's before the shift */
        keys[i] = _mm256_and_si256(packed_key(x, 5 * i, spread), lmask);
    const __m256i flip = _mm256_shuffle_epi8(_mm256_and_si256(_mm256_srli_epi32(x[3], 24), _mm256_set1_epi32(1)), spread);
    const __m256i table = _mm256_loadu_si256((const __m256i *)tt);
    const __m128i rb = _mm_cvtsi32_si128((int)shape.rbits), lb = _mm_cvtsi32_si128((int)shape.lbits);
    const __m256i quad = _mm256_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1,
                                          2, 3, 0, 1, 2, 3);
    for (uint32_t j0 = 0; j0 < t->block / 4; j0 += NV) {
        __m256i v[NV];
        for (uint32_t j = 0; j < NV; j++)
            v[j] = _mm256_add_epi8(quad, _mm256_set1_epi8((char)(4 * (j0 + j))));
        (shape.rbits != shape.lbits ? rounds_d1 : rounds_d0)(v, keys, flip, table, rb, lb, lmask);
        for (uint32_t j = 0; j < NV; j++)
            _mm256_storeu_si256((__m256i *)(t->out + 32 * (j0 + j)), v[j]);
    }
}

/* ---- Per-read slots (pd__block_slots_avx2): every read keyed by its own block, 32 reads a register.
 *
 * Each read gets its block's Philox output (where a register's 32 reads lie in at most 8 blocks, one call for
 * those blocks and a vpermd per read group: W = 8, B = 64, one core of the 2-vCPU Xeon, 47.8 → 54.1 M mixture
 * ids/s; else 8 reads a call, one counter each), its round keys as bytes, and its halves as bytes; a
 * round is then the group kernel's, with the keys per read: s0' = HI[s0] ^ ((s1 ^ k) & lmask),
 * s1' = LO[s0] ^ (d ? s1 >> lbits : 0) (blocks_vbmi.c's comment), HI and LO by pshufb (two for 32
 * entries). Four registers of 8 dwords pack into one of 32 bytes in the order of two packs (register v's
 * dword j at byte 16·(j / 4) + 4·v + j mod 4); every byte op is lane-wise, and unpacking walks the same
 * order back. */

#define RV 2 /* byte registers in flight */

/* Four registers of dwords below 2^15 as bytes (the packs' order above). */
PD_AI __m256i pack4(__m256i a, __m256i b, __m256i c, __m256i d)
{
    return _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
}

/* table[s] for bytes s < 2^lbits (lbits ≤ 5): tab holds entries 0-15 in both lanes, tab_hi 16-31. */
PD_AI __m256i lookup(__m256i s, __m256i tab, __m256i tab_hi, const int wide)
{
    const __m256i lo = _mm256_shuffle_epi8(tab, s);
    if (!wide)
        return lo;
    const __m256i hi = _mm256_shuffle_epi8(tab_hi, _mm256_and_si256(s, _mm256_set1_epi8(15)));
    return _mm256_blendv_epi8(lo, hi, _mm256_slli_epi16(s, 3)); /* bit 4 of each byte to its top */
}

typedef struct read_ctx {
    __m256i hi, hi2, lo, lo2; /* HI and LO: entries 0-15, 16-31 */
    __m256i lmask, one;
    unsigned lbits, rbits, b;
} read_ctx;

/* Where a register's reads lie in 8 consecutive blocks, whose Philox outputs are xb (block β0 + i in lane i): each
 * round's keys of those 8 blocks as bytes 0-7 of both halves of a register, looked up per read by pshufb with its
 * block's number (blk, a byte per read in the packs' order). Four rounds' keys pack into one register (bytes
 * 4r + i: round r's key of block i, blocks 0-3 in the low half and 4-7 in the high), and a vpermd takes round r's
 * dwords to bytes 0-7 of each half; the flip bits go the same way. ~5 operations a round for all 32 reads, where
 * taking each read's key from its own copy of its block's output cost ~15. */
typedef struct block_keys {
    uint64_t beta0;   /* the first of the 8 blocks */
    int valid;
    __m256i four[6];  /* rounds 4i … 4i + 3: byte 4r + b, round r's key of block b (blocks 0-3 low, 4-7 high) */
    __m256i fb;       /* the flips the same way */
} block_keys;

/* The packed keys of blocks β0 … β0 + 7 from their Philox outputs xb. */
static void block_keys_pack(const __m256i xb[4], __m256i lmask32, block_keys *bk)
{
#pragma GCC unroll 6
    for (unsigned i = 0; i < PD_ROUNDS; i += 4) { /* unrolled: the shifts' counts become constants */
        __m256i k[4];
        for (unsigned r = 0; r < 4; r++)
            k[r] = _mm256_and_si256(key_bits(xb, 5 * (i + r)), lmask32);
        bk->four[i / 4] = pack4(k[0], k[1], k[2], k[3]);
    }
    const __m256i f = _mm256_and_si256(_mm256_srli_epi32(xb[3], 24), _mm256_set1_epi32(1)); /* bit 120 */
    bk->fb = pack4(f, f, f, f);
}

static void shared_keys(const block_keys *bk, __m256i blk, __m256i keys[PD_ROUNDS], __m256i *flip)
{
#pragma GCC unroll 6
    for (unsigned i = 0; i < PD_ROUNDS; i += 4) {
        for (unsigned r = 0; r < 4; r++) {
            const __m256i take = _mm256_setr_epi32((int)r, (int)r + 4, (int)r, (int)r + 4, (int)r, (int)r + 4, (int)r,
                                                   (int)r + 4);
            keys[i + r] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(bk->four[i / 4], take), blk);
        }
    }
    *flip = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(bk->fb, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)), blk);
}

/* 32 reads from run position g0 on (stride apart): keys, flips and halves, as bytes. bk: the packed keys of the
 * last 8 blocks whose Philox outputs were computed, kept for the next registers. */
static void read_prepare(const pd__block_slots *s, const read_ctx *c, uint64_t g0, block_keys *bk,
                         __m256i keys[PD_ROUNDS], __m256i *flip, __m256i *s0, __m256i *s1)
{
    __m256i x[4][4], r[4], xb[4], at[4];
    const __m256i stride = _mm256_set1_epi64x((long long)s->stride), first = _mm256_set1_epi64x((long long)g0);
    const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7); /* even dwords low, odd high */
    const __m128i b = _mm_cvtsi32_si128((int)c->b);
    const __m256i lmask32 = _mm256_set1_epi32((int)((1u << c->lbits) - 1)), one32 = _mm256_set1_epi32(1);
    /* The 32 reads in at most 8 blocks (W ≤ B / 4 or so): those blocks' Philox outputs once, and their keys by
     * block (shared_keys), where 4 calls computed every read's (W = 8, B = 64: each block 8 times); the next
     * register's blocks are often among the same 8 (W = 8, B = 64: 4 a register), which then serve it too. */
    const uint64_t beta0 = g0 >> c->b, beta_last = (g0 + 31 * s->stride) >> c->b, shared = beta_last - beta0 < 8;
    if (shared && !(bk->valid && beta0 >= bk->beta0 && beta_last - bk->beta0 < 8)) {
        const __m256i lo = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)beta0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256i top = _mm256_set1_epi32(INT32_MIN); /* the low word wrapped: the high one carries */
        const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_set1_epi32((int)(uint32_t)beta0), top),
                                                 _mm256_xor_si256(lo, top));
        xb[0] = _mm256_set1_epi32((int)PD_MIX_CTR_BLOCK);
        xb[1] = _mm256_setzero_si256();
        xb[2] = lo;
        xb[3] = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(beta0 >> 32)), carry);
        pd__philox8_avx2(xb, (uint32_t)s->seed, (uint32_t)(s->seed >> 32));
        block_keys_pack(xb, lmask32, bk);
        bk->beta0 = beta0;
        bk->valid = 1;
    }
    for (int v = 0; v < 4; v++) {
        __m256i beta[2], g[2];
        for (int h = 0; h < 2; h++) {
            const __m256i t = _mm256_add_epi64(_mm256_setr_epi64x(0, 1, 2, 3), _mm256_set1_epi64x(8 * v + 4 * h));
            g[h] = _mm256_add_epi64(first, _mm256_mul_epu32(t, stride));
            beta[h] = _mm256_permutevar8x32_epi32(_mm256_srl_epi64(g[h], b), pick); /* lo words, then hi */
            g[h] = _mm256_permutevar8x32_epi32(g[h], pick);
        }
        x[v][2] = _mm256_permute2x128_si256(beta[0], beta[1], 0x20);
        x[v][3] = _mm256_permute2x128_si256(beta[0], beta[1], 0x31);
        r[v] = _mm256_and_si256(_mm256_permute2x128_si256(g[0], g[1], 0x20), _mm256_set1_epi32((int)(s->block - 1)));
        if (shared) { /* each read's block among the 8: its low word less the first one's (mod 2^32) */
            at[v] = _mm256_sub_epi32(x[v][2], _mm256_set1_epi32((int)(uint32_t)bk->beta0));
            continue;
        }
        x[v][0] = _mm256_set1_epi32((int)PD_MIX_CTR_BLOCK);
        x[v][1] = _mm256_setzero_si256();
        pd__philox8_avx2(x[v], (uint32_t)s->seed, (uint32_t)(s->seed >> 32));
    }
    if (shared) {
        shared_keys(bk, pack4(at[0], at[1], at[2], at[3]), keys, flip);
    } else {
#pragma GCC unroll 24
        for (unsigned i = 0; i < PD_ROUNDS; i++)
            keys[i] = pack4(_mm256_and_si256(key_bits(x[0], 5 * i), lmask32), _mm256_and_si256(key_bits(x[1], 5 * i), lmask32),
                            _mm256_and_si256(key_bits(x[2], 5 * i), lmask32), _mm256_and_si256(key_bits(x[3], 5 * i), lmask32));
        __m256i f[4];
        for (int v = 0; v < 4; v++)
            f[v] = _mm256_and_si256(_mm256_srli_epi32(x[v][3], 24), one32); /* bit 120 */
        *flip = pack4(f[0], f[1], f[2], f[3]);
    }
    __m256i h0[4], h1[4];
    const __m256i rmask32 = _mm256_set1_epi32((int)((1u << c->rbits) - 1));
    for (int v = 0; v < 4; v++) {
        h0[v] = _mm256_srli_epi32(r[v], (int)c->rbits);
        h1[v] = _mm256_and_si256(r[v], rmask32);
    }
    *s0 = pack4(h0[0], h0[1], h0[2], h0[3]);
    *s1 = pack4(h1[0], h1[1], h1[2], h1[3]);
}

PD_AI void read_rounds(const read_ctx *c, const __m256i keys[RV][PD_ROUNDS], const __m256i flip[RV], __m256i s0[RV],
                       __m256i s1[RV], const int d, const int wide)
{
    /* The halves in locals, and the context's tables: through the pointers, gcc kept each round's halves in memory
     * (the stores might alias the keys), and a round waited for the store's forwarding (W = 8 on Zen 3: ~15 cycles
     * a round, 9% of a mixture read, where the chain is ~3). */
    __m256i a[RV], b[RV];
    const __m256i hi2 = c->hi2, lo2 = c->lo2, tab_hi = c->hi, tab_lo = c->lo, lmask = c->lmask, one = c->one;
    for (int v = 0; v < RV; v++) {
        a[v] = s0[v];
        b[v] = s1[v];
    }
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int v = 0; v < RV; v++) {
            const __m256i hi = lookup(a[v], tab_hi, hi2, wide), lo = lookup(a[v], tab_lo, lo2, wide);
            a[v] = _mm256_xor_si256(hi, _mm256_and_si256(_mm256_xor_si256(b[v], keys[v][i]), lmask));
            b[v] = d ? _mm256_xor_si256(lo, _mm256_and_si256(_mm256_srli_epi16(b[v], (int)c->lbits), one)) : lo;
        }
    }
    for (int v = 0; v < RV; v++) { /* the block's transposition of 0 and 1 */
        const __m256i zero = _mm256_setzero_si256();
        const __m256i low = _mm256_and_si256(_mm256_cmpeq_epi8(a[v], zero),
                                             _mm256_cmpeq_epi8(_mm256_andnot_si256(one, b[v]), zero));
        s0[v] = a[v];
        s1[v] = _mm256_xor_si256(b[v], _mm256_and_si256(low, flip[v]));
    }
}

#define READ_ROUNDS(D, WIDE)                                                                                       \
    static void read_rounds_##D##WIDE(const read_ctx *c, const __m256i keys[RV][PD_ROUNDS], const __m256i flip[RV], \
                                      __m256i s0[RV], __m256i s1[RV])                                              \
    {                                                                                                              \
        read_rounds(c, keys, flip, s0, s1, D, WIDE);                                                               \
    }
READ_ROUNDS(0, 0)
READ_ROUNDS(0, 1)
READ_ROUNDS(1, 0)
READ_ROUNDS(1, 1)

/* out[0, n) (n ≤ 32) = s0 << rbits | s1 of the register's reads, as u32, in read order. */
static void read_store(uint32_t *out, uint64_t n, __m256i s0, __m256i s1, unsigned rbits)
{
    const __m256i zero = _mm256_setzero_si256(), low = _mm256_set1_epi16(255);
    __m256i w[2] = {_mm256_unpacklo_epi8(s1, s0), _mm256_unpackhi_epi8(s1, s0)}; /* s0·256 + s1 */
    uint32_t v32[32];
    uint32_t *to = n == 32 ? out : v32; /* a whole register straight out: a short copy of a variable length cost more */
    for (int h = 0; h < 2; h++) {
        w[h] = _mm256_or_si256(_mm256_slli_epi16(_mm256_srli_epi16(w[h], 8), (int)rbits), _mm256_and_si256(w[h], low));
        const __m256i a = _mm256_unpacklo_epi16(w[h], zero), b = _mm256_unpackhi_epi16(w[h], zero);
        _mm256_storeu_si256((__m256i *)(to + 16 * h), a);     /* register 2h's reads */
        _mm256_storeu_si256((__m256i *)(to + 16 * h + 8), b); /* register 2h + 1's */
    }
    if (n < 32)
        memcpy(out, v32, n * sizeof *out);
}

void pd__block_slots_avx2(const pd__block_slots *s)
{
    pd_perm shape;
    pd__perm_shape(&shape, s->block, PD_MIN_BITS);
    read_ctx c = {.lbits = shape.lbits, .rbits = shape.rbits, .b = shape.lbits + shape.rbits};
    uint8_t hi[32], lo[32];
    pd__block_round_tables(&shape, hi, lo, 32);
    c.hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hi));
    c.hi2 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(hi + 16)));
    c.lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lo));
    c.lo2 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(lo + 16)));
    c.lmask = _mm256_set1_epi8((char)shape.lmask);
    c.one = _mm256_set1_epi8(1);
    const int d = shape.rbits != shape.lbits, wide = shape.lbits > 4;
    void (*const run)(const read_ctx *, const __m256i(*)[PD_ROUNDS], const __m256i *, __m256i *, __m256i *) =
        d ? (wide ? read_rounds_11 : read_rounds_10) : (wide ? read_rounds_01 : read_rounds_00);
    __m256i keys[RV][PD_ROUNDS], flip[RV], s0[RV], s1[RV];
    block_keys bk = {.valid = 0};
    for (uint64_t t0 = 0; t0 < s->count; t0 += 32 * RV) {
        for (int v = 0; v < RV; v++) /* registers past the count compute reads never stored */
            read_prepare(s, &c, s->first + (t0 + 32 * (uint64_t)v) * s->stride, &bk, keys[v], &flip[v], &s0[v],
                         &s1[v]);
        run(&c, (const __m256i(*)[PD_ROUNDS])keys, flip, s0, s1);
        for (int v = 0; v < RV; v++) {
            const uint64_t at = t0 + 32 * (uint64_t)v;
            if (at < s->count)
                read_store(s->out + at, s->count - at < 32 ? s->count - at : 32, s0[v], s1[v], c.rbits);
        }
    }
}
