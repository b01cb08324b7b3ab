/* σ of several windows' short runs at once on AVX-512 (F and BW): every lane carries its own τ (keys and shape by its run number), cycle-walked by compaction; τ of ≤ 32 bits on 16-bit lanes (eval_w16), of ≤ 17 bits with one multiply a round, with PD_BATCH_WORDS (batch_bw.c) on 16-bit lanes, or with PD_BATCH_BYTES (batch_vbmi.c) on byte lanes. */
#include "cpu/kernel.h"

#include <string.h>

#ifdef PD_CPU_AVX512_EMULATED /* tests on CPUs without AVX-512: see avx512_emu.h */
#include "cpu/avx512_emu.h"
#define PD_UNROLL(n)
#else
#include <immintrin.h>
#define PD_UNROLL(n) _Pragma(PD_STR(GCC unroll n))
#endif
#include "cpu/words_avx512.h"
#define PD_STR(x) #x

/*
 * The walk is kernel_avx512.c's compaction (read walk_compact there) over a batch (pd__batch,
 * kernel.h) instead of one run. What differs is the round: each per-run value (the 24 round
 * keys, M0's low word shifted by d, the half masks and widths, n − 1) is a 16-entry table, one
 * entry per run, and a lane reads its entry with vpermd by its run number. The keys cost one
 * vpermd per round; the rest once per evaluation. With d per lane, a round takes the d = 1
 * form, which is exact for d = 0 too as long as s1 stays masked (then s1 >> lbits = 0); a
 * batch whose runs all have d = 0 takes the lighter d = 0 round. A first evaluation of a group
 * that lies inside one run (a shard batch's runs are contiguous, so most of its groups do) reads that
 * run's keys and values broadcast from memory instead, as kernel_avx512.c does.
 *
 * Runs of b ≤ 32 (a mixture's components, windows of 2^18 and more) take word lanes (eval_w16, the walk's L = 32):
 * words_avx512.h's 16-bit round, 8 vectors of u32 a group as 4 of words, every lane's values read by vpermw.
 * A mixture's σ at W = 8 (the bench's four components, one core of the 2-vCPU Xeon) took 102 → 125 M ids/s.
 *
 * Small windows on 32-bit lanes (PD_SMALL: every run of the batch has b ≤ 17, where the generator has
 * neither vbmi nor bw: before the word lanes, what CPUs without VBMI ran; now tests and bench/shards
 * clear both to run it): a round's product is one vpmulld by a per-run multiplier
 * (core/perm.h's pd__vp_small_mult_d: lo << d in the low bits, the high part in the top lbits, taken
 * by a vpsrlvd) instead of two vpmuludq, a shuffle, two 16-bit multiplies and an add: ~7 instructions per 16
 * lanes where the general round costs ~11-12. It took uneven shards from 0.33-0.46 to 0.34-0.53 of
 * flat σ and uniform ones from 0.56-0.75 to 0.71-1.06 (Zen 5 with VBMI turned off: bench/shards'
 * "avx512 no-VBMI" column; the H100 host's Xeon, whose vpmulld costs more: 0.40-0.62, 0.81-1.09).
 *
 * Word lanes (compiled with PD_BATCH_WORDS, AVX-512BW without VBMI: batch_bw.c), for batches whose
 * every τ has b ≤ 17: batch_avx2.c's word round (read its comment) on 32 lanes a register: two
 * vpmulhuw, two vpmullw, a vpermw for the keys and four logic ops per 32 lanes, where PD_SMALL's
 * round costs a vpmulld (two uops on Intel) and ~6 more per 16. A group's 128 values are packed to
 * words for its 24 rounds (vpackusdw: lanes pair up within each 128-bit lane; the per-lane values
 * are packed alike, so they still match) and unpacked after (vpunpck{l,h}wd). A batch holds up to 32
 * runs, as on byte lanes: per-run values two registers each (vpermt2d), keys one (vpermw). With 16
 * (vpshufb's keys, vpermd's values) the drain and set-up came twice as often: uneven K = 1, G = 1 read
 * 323-325 M ids/s where 32 runs read 342-345 (Zen 5 with VBMI turned off, 2026-11-27).
 *
 * Byte lanes (compiled with PD_BATCH_BYTES, AVX-512 VBMI: batch_vbmi.c). Windows are mostly small
 * (2^10 to 2^17 samples), and a τ on b ≤ 16 bits has halves of at most 8 bits. A round reads its
 * left half only through M0·s0, so with s0 < 2^8 the round's products are two 256-entry byte tables
 * (hi32(M0·s) and lo32(M0·s), low bytes: every mask and shift of the round keeps within them), and
 * a vpermb looks 64 lanes up at once (vpermi2b: 128 entries; two and a blend: 256). The halves
 * travel as bytes, 64 lanes per register; s1 >> lbits is s1's top bit when d = 1 and 0 when d = 0,
 * a byte test. A round costs ~8 instructions per 64 lanes where the 32-bit one costs ~11 per 16.
 * The walk (queue, compaction, output) is the same: a group's 64 values are packed to bytes for its
 * 24 rounds and unpacked after.
 */

#ifndef PD_BATCH_BYTES
#define PD_BATCH_BYTES 0
#endif
#ifndef PD_BATCH_WORDS
#define PD_BATCH_WORDS 0
#endif
/* The plain build's word lanes for runs of b ≤ 32 (eval_w16); the byte and word builds take only narrow batches. */
#define PD_W16 (!PD_BATCH_BYTES && !PD_BATCH_WORDS)

#define PD_AI static inline __attribute__((always_inline))
#define VW 16
#define CNV 4            /* vectors evaluated side by side (32-bit lanes) */
#define BNB 2            /* byte vectors side by side on byte lanes: */
#define BNV (BNB * CNV)  /*   their lanes as vectors of u32 */
#define CLANES (VW * BNV) /* lanes of a group, at most */
#define BLOCK 1024
#define QCAP (BLOCK / 2 + BLOCK + CLANES)
#define OBUF 1024
#define PD_TL_XOR3 0x96   /* a ^ b ^ c */
#define PD_TL_OR_AND 0xA8 /* (a | b) & c */

/* The walk's d argument: bit 0, some run has d = 1; bit 1 (PD_SMALL, 32-bit lanes), every run has b ≤ 17:
 * a round's product is one 32-bit multiply (core/perm.h's pd__vp_small_mult_d) instead of three. */
#define PD_SMALL 2

/* One vector's lanes' values of the per-run tables (m_lo_d: with PD_SMALL, pd__vp_small_mult_d's
 * multiplier; hsh: 32 − lbits, where that product's top holds the round's high part). */
typedef struct lanes {
    __m512i run, m_lo_d, lmask, rmask, lbits, rbits, n_m1, hsh;
} lanes;

typedef struct bctx {
    __m512i key[PD_ROUNDS]; /* lane r: run r's round key */
    __m512i m_lo_d, lmask, rmask, lbits, rbits, n_m1, hsh;
    __m512i rmask_hi, rbits_hi, n_m1_hi; /* runs 16-31 (byte and word lanes) */
    __m512i m_lo_d_hi, lmask_hi, lbits_hi; /*   (word lanes only) */
    uint32_t kr[PD__BATCH_RUNS][PD_ROUNDS]; /* the same per run, for groups inside one run: */
    lanes one[PD__BATCH_RUNS];              /*   broadcast keys and values, read from memory */
    uint32_t *v;
    const uint8_t *run;
#if PD_BATCH_WORDS
    __m512i wkey[PD_ROUNDS];             /* word r: run r's round key (low byte), for vpermw */
#endif
#if PD_W16
    __m512i wk16[PD_ROUNDS];             /* word r: run r's round key (low 16 bits), for vpermw (eval_w16) */
    __m512i wlmask, wtop, wmult;         /* word r: run r's lmask; 2^lbits where d = 1, else 0; lo16(M0) << d */
#endif
#if PD_BATCH_BYTES
    __m512i bkey[PD_ROUNDS];             /* byte r: run r's round key (low byte) */
    __m512i blmask, btop;                /* byte r: run r's lmask; 2^lbits when d = 1 and lbits < 8, else 0 */
    __m512i bwide;                       /* byte r: 0xFF when run r has rbits = 9 (b = 17), else 0 */
    __m512i thi[4], tlo[4], tlo1[4];     /* low bytes of hi32(M0·s), lo32(M0·s), lo32(M0·s) << 1; s < 256 */
    __m512i pack_idx, unpack_idx[CNV];   /* byte shuffles between 4 vectors of u32 and one of bytes */
#endif
} bctx;

PD_AI __m512i iota16(void)
{
    return _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
}

/* small: the walk takes PD_SMALL rounds, which alone read hsh (the general walk skips its permute). */
PD_AI lanes lanes_of(const bctx *c, __m512i run, const int small)
{
#if PD_BATCH_WORDS /* up to 32 runs: two registers a value (vpermt2d) */
    (void)small;
    return (lanes){.run = run,
                   .m_lo_d = _mm512_permutex2var_epi32(c->m_lo_d, run, c->m_lo_d_hi),
                   .lmask = _mm512_permutex2var_epi32(c->lmask, run, c->lmask_hi),
                   .rmask = _mm512_permutex2var_epi32(c->rmask, run, c->rmask_hi),
                   .lbits = _mm512_permutex2var_epi32(c->lbits, run, c->lbits_hi),
                   .rbits = _mm512_permutex2var_epi32(c->rbits, run, c->rbits_hi),
                   .n_m1 = _mm512_permutex2var_epi32(c->n_m1, run, c->n_m1_hi),
                   .hsh = _mm512_setzero_si512()}; /* every field named: gcc cleared the whole struct first */
#else
    return (lanes){.run = run,
                   .m_lo_d = _mm512_permutexvar_epi32(run, c->m_lo_d),
                   .lmask = _mm512_permutexvar_epi32(run, c->lmask),
                   .rmask = _mm512_permutexvar_epi32(run, c->rmask),
                   .lbits = _mm512_permutexvar_epi32(run, c->lbits),
                   .rbits = _mm512_permutexvar_epi32(run, c->rbits),
                   .n_m1 = _mm512_permutexvar_epi32(run, c->n_m1),
                   .hsh = small ? _mm512_permutexvar_epi32(run, c->hsh) : _mm512_setzero_si512()};
#endif
}

/* lanes_of for byte lanes: up to 32 runs, and only what split, inside and the queue read. */
PD_AI lanes lanes_of_bytes(const bctx *c, __m512i run)
{
    return (lanes){.run = run,
                   .rmask = _mm512_permutex2var_epi32(c->rmask, run, c->rmask_hi),
                   .rbits = _mm512_permutex2var_epi32(c->rbits, run, c->rbits_hi),
                   .n_m1 = _mm512_permutex2var_epi32(c->n_m1, run, c->n_m1_hi)};
}

PD_AI void vp_round(const bctx *c, int i, const lanes *p, __m512i *s0, __m512i *s1, const int d, const uint32_t *hk)
{
    __m512i hi, lo;
    if (d & PD_SMALL) { /* lo << d in the product's low bits, the high part in its top lbits */
        lo = _mm512_mullo_epi32(*s0, p->m_lo_d);
        hi = _mm512_srlv_epi32(lo, p->hsh);
    } else { /* hi32(M0·s0), as kernel_avx512.c computes it */
        const __m512i m_lo = _mm512_set1_epi32((int)(uint32_t)PD_VP_M0);
        const __m512i m_hi = _mm512_set1_epi32((int)(uint32_t)(PD_VP_M0 >> 32));
        const __m512i e = _mm512_mul_epu32(*s0, m_lo);
        const __m512i o = _mm512_mul_epu32(_mm512_srli_epi64(*s0, 32), m_lo);
        hi = _mm512_mask_shuffle_epi32(o, 0x5555, e, _MM_PERM_DDBB);
        /* b ≤ 32: of lo32(m_hi·s0) and lo32(M0·s0) << d the round reads the low 16 bits, which vpmullw
         * gives (s0 < 2^16) in one uop where vpmulld takes two (kernel_avx512.c's pd_mul_lo) */
        hi = _mm512_add_epi32(hi, _mm512_mullo_epi16(*s0, m_hi));
        lo = _mm512_mullo_epi16(*s0, p->m_lo_d);
    }
    const __m512i k = hk ? _mm512_set1_epi32((int)hk[i]) : _mm512_permutexvar_epi32(p->run, c->key[i]);
    *s0 = _mm512_and_si512(_mm512_ternarylogic_epi32(hi, k, *s1, PD_TL_XOR3), p->lmask);
    if (d & 1)
        *s1 = _mm512_ternarylogic_epi32(lo, _mm512_srlv_epi32(*s1, p->lbits), p->rmask, PD_TL_OR_AND);
    else /* every lane has d = 0: s1 >> lbits is 0 and junk above rbits is masked at the end */
        *s1 = lo;
}

/* hk: the keys of the one run all lanes belong to, or NULL (each lane looks its own up). */
PD_AI void eval(const bctx *c, const lanes *const *p, __m512i *s0, __m512i *s1, const int nv, const int d, const uint32_t *hk)
{
    PD_UNROLL(24)
    for (int i = 0; i < PD_ROUNDS; i++) {
        PD_UNROLL(4)
        for (int v = 0; v < nv; v++)
            vp_round(c, i, p[v], &s0[v], &s1[v], d, hk);
    }
    if (!(d & 1))
        for (int v = 0; v < nv; v++)
            s1[v] = _mm512_and_si512(s1[v], p[v]->rmask);
}

#if PD_BATCH_BYTES
/* The low bytes of a[0..3]'s 64 u32 lanes, in order. */
PD_AI __m512i pack4(const bctx *c, const __m512i *a)
{
    const __m512i lo = _mm512_permutex2var_epi8(a[0], c->pack_idx, a[1]);
    const __m512i hi = _mm512_permutex2var_epi8(a[2], c->pack_idx, a[3]);
    return _mm512_mask_blend_epi8(UINT64_C(0xFFFFFFFF00000000), lo, hi);
}

/* The inverse: 64 bytes to 4 vectors of u32. */
PD_AI void unpack4(const bctx *c, __m512i b, __m512i *a)
{
    for (int v = 0; v < CNV; v++)
        a[v] = _mm512_maskz_permutexvar_epi8(UINT64_C(0x1111111111111111), c->unpack_idx[v], b);
}

/* t[s] for every byte s below 2^L: L ≤ 6 one register, 7 two, 8 four. */
PD_AI __m512i lookup(const __m512i *t, __m512i s, const int L)
{
    if (L <= 6)
        return _mm512_permutexvar_epi8(s, t[0]);
    const __m512i a = _mm512_permutex2var_epi8(t[0], s, t[1]);
    if (L == 7)
        return a;
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(s), a, _mm512_permutex2var_epi8(t[2], s, t[3]));
}

/* eval on byte lanes: L ≥ every lane's lbits (6, 7 or 8), D = 0 (every lane d = 0), 1 (every lane
 * d = 1), 2 (mixed) or 3 (L = 8, some lanes b = 17: s1 has 9 bits, the 9th in a mask). runb: the
 * lanes' run numbers as bytes. Junk above rbits in s1 stays out of s0 (masked by lmask, lbits ≤
 * rbits) and of the d = 1 test (bit lbits < rbits), and is masked off at the end. */
PD_AI void eval_bytes(const bctx *c, const lanes *const *p, const __m512i *runb, __m512i *s0, __m512i *s1,
                      const int L, const int D, const int nb)
{
    __m512i b0[BNB], b1[BNB], lmask[BNB], top[BNB];
    __mmask64 dlanes[BNB], wide[BNB], s1_8[BNB]; /* D = 3: lanes with rbits = 9, and s1's bit 8 there */
    const __m512i one = _mm512_set1_epi8(1);
    for (int j = 0; j < nb; j++) { /* two chains (nb = BNB): a round's latency is ~2× its issue time */
        b0[j] = pack4(c, s0 + CNV * j);
        b1[j] = pack4(c, s1 + CNV * j);
        lmask[j] = _mm512_permutexvar_epi8(runb[j], c->blmask);
        top[j] = D ? _mm512_permutexvar_epi8(runb[j], c->btop) : _mm512_setzero_si512();
        dlanes[j] = D >= 2 ? _mm512_test_epi8_mask(top[j], top[j]) : 0;
        wide[j] = s1_8[j] = 0;
        if (D == 3) {
            const __m512i w = _mm512_permutexvar_epi8(runb[j], c->bwide);
            wide[j] = _mm512_test_epi8_mask(w, w);
            dlanes[j] |= wide[j];
            for (int v = 0; v < CNV; v++)
                s1_8[j] |= (uint64_t)_mm512_test_epi32_mask(s1[CNV * j + v], _mm512_set1_epi32(256)) << (VW * v);
        }
    }
    PD_UNROLL(24)
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int j = 0; j < nb; j++) {
            const __m512i hi = lookup(c->thi, b0[j], L);
            __m512i lo = lookup(D == 1 ? c->tlo1 : c->tlo, b0[j], L);
            __mmask64 shifted_in = D ? _mm512_test_epi8_mask(b1[j], top[j]) : 0; /* s1 >> lbits */
            if (D == 3) { /* rbits = 9: s1 >> 8 is bit 8, and lo << 1 moves lo's bit 7 there */
                shifted_in |= s1_8[j];
                s1_8[j] = _mm512_movepi8_mask(lo) & wide[j];
            }
            if (D >= 2)
                lo = _mm512_mask_add_epi8(lo, dlanes[j], lo, lo); /* << 1 */
            const __m512i k = _mm512_permutexvar_epi8(runb[j], c->bkey[i]);
            const __m512i n0 = _mm512_and_si512(_mm512_ternarylogic_epi32(hi, k, b1[j], PD_TL_XOR3), lmask[j]);
            b1[j] = D ? _mm512_mask_add_epi8(lo, shifted_in, lo, one) : lo; /* lo's bit 0 is 0 */
            b0[j] = n0;
        }
    }
    for (int j = 0; j < nb; j++) {
        unpack4(c, b0[j], s0 + CNV * j);
        unpack4(c, b1[j], s1 + CNV * j);
        for (int v = 0; D == 3 && v < CNV; v++)
            s1[CNV * j + v] = _mm512_mask_or_epi32(s1[CNV * j + v], (__mmask16)(s1_8[j] >> (VW * v)),
                                                   s1[CNV * j + v], _mm512_set1_epi32(256));
    }
    for (int v = 0; v < CNV * nb; v++)
        s1[v] = _mm512_and_si512(s1[v], p[v]->rmask);
}
#endif

#if PD_BATCH_WORDS
/* eval on word lanes (batch_avx2.c's eval_words): every lane's b ≤ 17, so s0 < 2^8 and s1 < 2^9; D = 0
 * (every lane d = 0: s1 unmasked until the end) or 1 (some lane d = 1: s1 masked each round, so
 * s1 >> lbits is 0 where d = 0). hk: the keys of the one run all lanes belong to, or NULL. With one run
 * (K = 64's batches of one long run), the per-run values are one register each instead of one per word
 * vector: 28 live registers became 12, and the rounds stopped reading spilled values from the stack. */
PD_AI void eval_words(const bctx *c, const lanes *const *p, __m512i *s0, __m512i *s1, const int D,
                      const uint32_t *hk, const int nv)
{
    const int NW = nv / 2;
    const __m512i ch = _mm512_set1_epi16((short)(uint16_t)(PD_VP_M0 >> 16));
    const __m512i a = _mm512_set1_epi16((short)((PD_VP_M0 >> 32) & 0xFF));
    const __m512i low16 = _mm512_set1_epi32(0xFFFF), one32 = _mm512_set1_epi32(1), sixteen = _mm512_set1_epi32(16);
    const int nt = hk ? 1 : NW; /* per-run values: one set (one run), or one per word vector */
    __m512i w0[BNV / 2], w1[BNV / 2], lmask[BNV / 2], rmask[BNV / 2], cld[BNV / 2], shr[BNV / 2], runi[BNV / 2];
    for (int j = 0; j < NW; j++) {
        w0[j] = pd__w16_pack(s0[2 * j], s0[2 * j + 1]);
        w1[j] = pd__w16_pack(s1[2 * j], s1[2 * j + 1]);
    }
    for (int j = 0; j < nt; j++) {
        const lanes *x = p[2 * j], *y = p[2 * j + 1];
        lmask[j] = pd__w16_pack(x->lmask, y->lmask);
        rmask[j] = pd__w16_pack(x->rmask, y->rmask);
        cld[j] = pd__w16_pack(_mm512_and_si512(x->m_lo_d, low16), _mm512_and_si512(y->m_lo_d, low16));
        shr[j] = pd__w16_pack(_mm512_sllv_epi32(one32, _mm512_sub_epi32(sixteen, x->lbits)),
                        _mm512_sllv_epi32(one32, _mm512_sub_epi32(sixteen, y->lbits)));
        runi[j] = pd__w16_pack(x->run, y->run);
    }
    PD_UNROLL(24)
    for (int i = 0; i < PD_ROUNDS; i++) {
        const __m512i hkey = hk ? _mm512_set1_epi16((short)(hk[i] & 0xFF)) : _mm512_setzero_si512();
        for (int j = 0; j < NW; j++) {
            const int t = hk ? 0 : j;
            const __m512i hi = _mm512_add_epi16(_mm512_mulhi_epu16(w0[j], ch), _mm512_mullo_epi16(w0[j], a));
            const __m512i lo = _mm512_mullo_epi16(w0[j], cld[t]);
            const __m512i k = hk ? hkey : _mm512_permutexvar_epi16(runi[t], c->wkey[i]);
            const __m512i n0 = _mm512_and_si512(_mm512_ternarylogic_epi32(hi, k, w1[j], PD_TL_XOR3), lmask[t]);
            w1[j] = D ? _mm512_ternarylogic_epi32(lo, _mm512_mulhi_epu16(w1[j], shr[t]), rmask[t], PD_TL_OR_AND) : lo;
            w0[j] = n0;
        }
    }
    for (int j = 0; j < NW; j++) {
        pd__w16_unpack(w0[j], s0 + 2 * j);
        pd__w16_unpack(w1[j], s1 + 2 * j);
    }
    if (!D)
        for (int v = 0; v < nv; v++)
            s1[v] = _mm512_and_si512(s1[v], p[v]->rmask);
}
#endif

#if PD_W16
/* eval on word lanes for batches whose every run has b ≤ 32 (the walk's L = 32): words_avx512.h's round (read its
 * comment: five 16-bit multiplies and a carry per 32 lanes), with each lane's values by its run: its lmask,
 * 2^lbits where d = 1 (else 0: no bit shifted in) and multiplier lo16(M0) << d read once per evaluation by vpermw,
 * and its key each round (or broadcast: hk, the keys of the one run all lanes belong to). D: some run has d = 1.
 * nv (even) vectors of u32 as nv / 2 of words. */
PD_AI void eval_w16(const bctx *c, const lanes *const *p, __m512i *s0, __m512i *s1, const int D, const uint32_t *hk,
                    const int nv)
{
    __m512i w0[BNV / 2], w1[BNV / 2], runi[BNV / 2], lmask[BNV / 2], top[BNV / 2], mult[BNV / 2];
    for (int j = 0; j < nv / 2; j++) {
        w0[j] = pd__w16_pack(s0[2 * j], s0[2 * j + 1]);
        w1[j] = pd__w16_pack(s1[2 * j], s1[2 * j + 1]);
        runi[j] = pd__w16_pack(p[2 * j]->run, p[2 * j + 1]->run);
        lmask[j] = _mm512_permutexvar_epi16(runi[j], c->wlmask);
        top[j] = D ? _mm512_permutexvar_epi16(runi[j], c->wtop) : _mm512_setzero_si512();
        mult[j] = _mm512_permutexvar_epi16(runi[j], c->wmult);
    }
    PD_UNROLL(24)
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (int j = 0; j < nv / 2; j++) {
            const __m512i k = hk ? _mm512_set1_epi16((short)(uint16_t)hk[i]) : _mm512_permutexvar_epi16(runi[j], c->wk16[i]);
            pd__w16_round(&w0[j], &w1[j], k, lmask[j], mult[j], top[j], D);
        }
    }
    for (int j = 0; j < nv / 2; j++) {
        pd__w16_unpack(w0[j], s0 + 2 * j);
        pd__w16_unpack(w1[j], s1 + 2 * j);
    }
    for (int v = 0; v < nv; v++)
        s1[v] = _mm512_and_si512(s1[v], p[v]->rmask);
}
#endif

/* The word build's eval on word lanes (b ≤ 17), or the plain build's (b ≤ 32): the same arguments. */
#if PD_BATCH_WORDS
#define eval_word_lanes eval_words
#elif PD_W16
#define eval_word_lanes eval_w16
#endif

PD_AI void split(const lanes *p, __m512i x, __m512i *s0, __m512i *s1)
{
    *s0 = _mm512_srlv_epi32(x, p->rbits);
    *s1 = _mm512_and_si512(x, p->rmask);
}

/* The lanes inside their τ's [0, n), and every lane's joined value. */
PD_AI __mmask16 inside(const lanes *p, __m512i s0, __m512i s1, __m512i *val)
{
    *val = _mm512_or_si512(_mm512_sllv_epi32(s0, p->rbits), s1);
    return _mm512_cmple_epu32_mask(*val, p->n_m1);
}

/* ---- Finished values waiting to be written to v[idx] */

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

PD_AI void outbuf_push(outbuf *b, __mmask16 m, __m512i val, __m512i idx)
{
    _mm512_storeu_si512(b->val + b->n, _mm512_maskz_compress_epi32(m, val));
    _mm512_storeu_si512(b->idx + b->n, _mm512_maskz_compress_epi32(m, idx));
    b->n += (unsigned)__builtin_popcount(m);
}

/* ---- Values still walking, with their run and index */

typedef struct queue {
    uint32_t val[QCAP + CLANES], run[QCAP + CLANES], idx[QCAP + CLANES];
    uint32_t n;
} queue;

PD_AI void queue_put(queue *q, uint32_t at, __mmask16 m, __m512i val, __m512i run, __m512i idx)
{
    _mm512_storeu_si512(q->val + at, _mm512_maskz_compress_epi32(m, val));
    _mm512_storeu_si512(q->run + at, _mm512_maskz_compress_epi32(m, run));
    _mm512_storeu_si512(q->idx + at, _mm512_maskz_compress_epi32(m, idx));
}

/* The first evaluation of a group of consecutive items from i (nv vectors: CNV, or BNV on byte
 * lanes, L > 0: eval_bytes). */
PD_AI void compact_first(const bctx *c, queue *q, uint32_t i, const int d, const int L)
{
    const int nv = L ? BNV : CNV;
    lanes own[BNV];
    const lanes *p[BNV];
    __m512i s0[BNV], s1[BNV];
    const uint32_t r = c->run[i], one = pd__batch_one_run(c->run + i, VW * nv);
    for (int v = 0; v < nv; v++) {
        if (one) {
            p[v] = &c->one[r];
        } else {
            const __m512i run = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c->run + i + VW * v)));
            own[v] = L && PD_BATCH_BYTES ? lanes_of_bytes(c, run) : lanes_of(c, run, d & PD_SMALL);
            p[v] = &own[v];
        }
        split(p[v], _mm512_loadu_si512(c->v + i + VW * v), &s0[v], &s1[v]);
    }
#if PD_BATCH_WORDS || PD_W16
    if (L && one) /* two calls: each inlined with hk known NULL or not */
        eval_word_lanes(c, p, s0, s1, d, c->kr[r], BNV);
    else if (L)
        eval_word_lanes(c, p, s0, s1, d, NULL, BNV);
    else
#endif
#if PD_BATCH_BYTES
    if (L) {
        __m512i runb[BNB];
        for (int j = 0; j < BNB; j++)
            runb[j] = _mm512_loadu_si512(c->run + i + 64 * j);
        eval_bytes(c, p, runb, s0, s1, L, d, BNB);
    } else
#endif
    if (one)
        eval(c, p, s0, s1, CNV, d, c->kr[r]);
    else
        eval(c, p, s0, s1, CNV, d, NULL);
    for (int v = 0; v < nv; v++) {
        __m512i val;
        const __mmask16 out = (__mmask16)~inside(p[v], s0[v], s1[v], &val);
        _mm512_storeu_si512(c->v + i + VW * v, val); /* lanes still outside are overwritten later */
        const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32((int)(i + VW * v)), iota16());
        if (out) { /* never for n = 2^b */
            queue_put(q, q->n, out, val, p[v]->run, idx);
            q->n += (unsigned)__builtin_popcount(out);
        }
    }
}

/* One group of nv vectors from queue entry r: evaluated, finished lanes to the output, the rest queued
 * again from *w (≤ r). */
PD_AI void compact_group(const bctx *c, queue *q, outbuf *buf, uint32_t r, uint32_t *w, const int d, const int L,
                         const int nv)
{
    lanes own[BNV];
    const lanes *p[BNV];
    __m512i s0[BNV], s1[BNV], idx[BNV];
    /* A group whose lanes all walk one run (a batch of one long run: every group) reads that run's
     * values and keys broadcast, as compact_first does, instead of 7 permutes a vector and a key
     * shuffle a round (uneven K = 64 on words: +6%, and +14% with eval_words' one set of values). */
#if !PD_BATCH_WORDS /* bytes and 32-bit lanes as they were: on byte lanes the check alone made the walk 5-15%
                  * slower (gcc laid it out anew) */
    for (int v = 0; v < nv; v++) {
        const __m512i run = _mm512_loadu_si512(q->run + r + VW * v);
        own[v] = L && PD_BATCH_BYTES ? lanes_of_bytes(c, run) : lanes_of(c, run, d & PD_SMALL);
        p[v] = &own[v];
        split(p[v], _mm512_loadu_si512(q->val + r + VW * v), &s0[v], &s1[v]);
        idx[v] = _mm512_loadu_si512(q->idx + r + VW * v);
    }
#else
    const uint32_t r0 = q->run[r];
    __mmask16 same = 0xFFFF;
    for (int v = 0; v < nv; v++)
        same &= _mm512_cmpeq_epi32_mask(_mm512_loadu_si512(q->run + r + VW * v), _mm512_set1_epi32((int)r0));
    const int one = same == 0xFFFF;
    for (int v = 0; v < nv; v++) {
        if (one) {
            p[v] = &c->one[r0];
        } else {
            own[v] = lanes_of(c, _mm512_loadu_si512(q->run + r + VW * v), d & PD_SMALL);
            p[v] = &own[v];
        }
        split(p[v], _mm512_loadu_si512(q->val + r + VW * v), &s0[v], &s1[v]);
        idx[v] = _mm512_loadu_si512(q->idx + r + VW * v);
    }
#endif
#if PD_BATCH_WORDS
    if (L && one)
        eval_words(c, p, s0, s1, d, c->kr[r0], nv);
    else if (L)
        eval_words(c, p, s0, s1, d, NULL, nv);
    else
#endif
#if PD_BATCH_BYTES
    if (L) {
        __m512i run[BNV], runb[BNB];
        for (int v = 0; v < nv; v++)
            run[v] = own[v].run;
        for (int j = 0; j < nv / CNV; j++)
            runb[j] = pack4(c, run + CNV * j);
        eval_bytes(c, p, runb, s0, s1, L, d, nv / CNV);
    } else
#endif
#if PD_W16
    if (L)
        eval_word_lanes(c, p, s0, s1, d, NULL, nv);
    else
#endif
        eval(c, p, s0, s1, CNV, d, NULL);
    for (int v = 0; v < nv; v++) {
        __m512i val;
        const __mmask16 in = inside(p[v], s0[v], s1[v], &val);
        outbuf_push(buf, in, val, idx[v]);
        queue_put(q, *w, (__mmask16)~in, val, p[v]->run, idx[v]); /* w ≤ r + VW·v: only loaded entries */
        *w += (unsigned)__builtin_popcount((__mmask16)~in);
    }
    if (buf->n >= OBUF)
        outbuf_flush(c, buf);
}

/* One pass over the queue's whole groups; a shorter rest stays queued. With tail (the drain, on narrow
 * lanes), whole groups of one word vector (words) or byte vector (bytes) follow, so that a queue padded
 * to those is evaluated whole: every entry takes a step each pass, and the walk ends. */
PD_AI void compact_pass(const bctx *c, queue *q, outbuf *buf, const int d, const int L, const int tail)
{
    const int nv = L ? BNV : CNV, tv = PD_BATCH_WORDS ? 2 : CNV;
    uint32_t r = 0, w = 0;
    for (; r + VW * nv <= q->n; r += VW * nv)
        compact_group(c, q, buf, r, &w, d, L, nv);
    if (L && tail)
        for (; r + VW * tv <= q->n; r += VW * tv)
            compact_group(c, q, buf, r, &w, d, L, tv);
    for (; r < q->n; r++, w++) {
        q->val[w] = q->val[r];
        q->run[w] = q->run[r];
        q->idx[w] = q->idx[r];
    }
    q->n = w;
}

/* small: every run has b ≤ 17 and the walk takes PD_SMALL rounds. */
static void bctx_init(bctx *c, const pd__batch *b, int small)
{
    uint32_t t[8][PD__BATCH_RUNS];
    memset(t, 0, sizeof t);
    for (unsigned r = 0; r < b->nruns; r++) {
        const pd_perm *p = b->perm[r];
        const uint32_t d = p->rbits - p->lbits;
        t[0][r] = small ? pd__vp_small_mult_d(p->lbits, d) : (uint32_t)PD_VP_M0 << d;
        t[1][r] = p->lmask;
        t[2][r] = p->rmask;
        t[3][r] = p->lbits;
        t[4][r] = p->rbits;
        t[5][r] = (uint32_t)(p->n - 1);
        t[7][r] = 32 - p->lbits;
    }
    c->m_lo_d = _mm512_loadu_si512(t[0]);
    c->lmask = _mm512_loadu_si512(t[1]);
    c->rmask = _mm512_loadu_si512(t[2]);
    c->lbits = _mm512_loadu_si512(t[3]);
    c->rbits = _mm512_loadu_si512(t[4]);
    c->n_m1 = _mm512_loadu_si512(t[5]);
    c->hsh = _mm512_loadu_si512(t[7]);
    c->rmask_hi = _mm512_loadu_si512(t[2] + VW);
    c->rbits_hi = _mm512_loadu_si512(t[4] + VW);
    c->n_m1_hi = _mm512_loadu_si512(t[5] + VW);
    c->m_lo_d_hi = _mm512_loadu_si512(t[0] + VW);
    c->lmask_hi = _mm512_loadu_si512(t[1] + VW);
    c->lbits_hi = _mm512_loadu_si512(t[3] + VW);
    for (unsigned r = 0; r < b->nruns; r++) {
        c->one[r] = (lanes){.run = _mm512_set1_epi32((int)r), .m_lo_d = _mm512_set1_epi32((int)t[0][r]),
                            .lmask = _mm512_set1_epi32((int)t[1][r]), .rmask = _mm512_set1_epi32((int)t[2][r]),
                            .lbits = _mm512_set1_epi32((int)t[3][r]), .rbits = _mm512_set1_epi32((int)t[4][r]),
                            .n_m1 = _mm512_set1_epi32((int)t[5][r]), .hsh = _mm512_set1_epi32((int)t[7][r])};
    }
    c->v = b->v;
    c->run = b->run;
#if !PD_BATCH_BYTES /* 32-bit rounds' keys */
    for (unsigned r = 0; r < b->nruns; r++)
        memcpy(c->kr[r], b->perm[r]->keys.k, sizeof c->kr[r]);
#if PD_BATCH_WORDS /* word r: run r's key, low byte (up to 32 runs) */
    uint16_t wk[PD__BATCH_RUNS];
    memset(wk, 0, sizeof wk);
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (unsigned r = 0; r < b->nruns; r++)
            wk[r] = (uint8_t)b->perm[r]->keys.k[i];
        c->wkey[i] = _mm512_loadu_si512(wk);
    }
#else
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (unsigned r = 0; r < b->nruns; r++)
            t[6][r] = b->perm[r]->keys.k[i];
        c->key[i] = _mm512_loadu_si512(t[6]);
    }
#if PD_W16
    uint16_t w16[4][32];
    memset(w16, 0, sizeof w16);
    for (int i = 0; i < PD_ROUNDS; i++) {
        for (unsigned r = 0; r < b->nruns; r++)
            w16[0][r] = (uint16_t)b->perm[r]->keys.k[i];
        c->wk16[i] = _mm512_loadu_si512(w16[0]);
    }
    for (unsigned r = 0; r < b->nruns; r++) {
        const pd_perm *p = b->perm[r];
        const uint32_t d = p->rbits - p->lbits;
        w16[1][r] = (uint16_t)p->lmask;
        w16[2][r] = (uint16_t)(d ? 1u << p->lbits : 0);
        w16[3][r] = (uint16_t)((uint32_t)PD_VP_M0 << d);
    }
    c->wlmask = _mm512_loadu_si512(w16[1]);
    c->wtop = _mm512_loadu_si512(w16[2]);
    c->wmult = _mm512_loadu_si512(w16[3]);
#endif
#endif
#else
    uint8_t bt[PD_ROUNDS + 3][64], tab[3][256], pk[64];
    memset(bt, 0, sizeof bt);
    for (unsigned r = 0; r < b->nruns; r++) {
        const pd_perm *p = b->perm[r];
        for (int i = 0; i < PD_ROUNDS; i++)
            bt[i][r] = (uint8_t)p->keys.k[i];
        bt[PD_ROUNDS][r] = (uint8_t)p->lmask;
        bt[PD_ROUNDS + 1][r] = (uint8_t)(p->rbits != p->lbits && p->lbits < 8 ? 1u << p->lbits : 0);
        bt[PD_ROUNDS + 2][r] = p->rbits == 9 ? 0xFF : 0;
    }
    for (int i = 0; i < PD_ROUNDS; i++)
        c->bkey[i] = _mm512_loadu_si512(bt[i]);
    c->blmask = _mm512_loadu_si512(bt[PD_ROUNDS]);
    c->btop = _mm512_loadu_si512(bt[PD_ROUNDS + 1]);
    c->bwide = _mm512_loadu_si512(bt[PD_ROUNDS + 2]);
    uint64_t m = 0; /* M0·x */
    for (uint32_t x = 0; x < 256; x++, m += PD_VP_M0) {
        tab[0][x] = (uint8_t)(m >> 32);
        tab[1][x] = (uint8_t)m;
        tab[2][x] = (uint8_t)(m << 1);
    }
    for (int j = 0; j < 4; j++) {
        c->thi[j] = _mm512_loadu_si512(tab[0] + 64 * j);
        c->tlo[j] = _mm512_loadu_si512(tab[1] + 64 * j);
        c->tlo1[j] = _mm512_loadu_si512(tab[2] + 64 * j);
    }
    for (int i = 0; i < 64; i++) /* vpermi2b: bytes 0-63 of a, 64-127 of b */
        pk[i] = (uint8_t)(4 * (i % 32));
    c->pack_idx = _mm512_loadu_si512(pk);
    for (int v = 0; v < CNV; v++) /* dword j of vector v: byte 16v + j */
        c->unpack_idx[v] = _mm512_add_epi32(iota16(), _mm512_set1_epi32(16 * v));
#endif
}

/* d: 0 or 1 (every run's d = 0, or not), | PD_SMALL on 32-bit lanes when every run has b ≤ 17; on byte
 * lanes (L > 0, see eval_bytes) 0, 1 or 2; on word lanes (L = 16) 0 or 1. */
PD_AI void walk(const pd__batch *b, const int d, const int L)
{
    bctx c;
    queue q;
    outbuf buf;
    const uint32_t gl = VW * (L ? BNV : CNV); /* lanes per group */
    bctx_init(&c, b, !L && (d & PD_SMALL));
    q.n = buf.n = 0;
    uint32_t i = 0;
    while (i + gl <= b->count) {
        const uint32_t end = b->count - i < BLOCK ? i + (b->count - i) / gl * gl : i + BLOCK;
        for (; i < end; i += gl)
            compact_first(&c, &q, i, d, L);
        while (q.n > BLOCK / 2)
            compact_pass(&c, &q, &buf, d, L, 0);
    }
    for (; i < b->count; i++) { /* fewer than gl items left: queue them unevaluated */
        q.val[q.n] = b->v[i];
        q.run[q.n] = b->run[i];
        q.idx[q.n++] = i;
    }
    /* The drain pads the queue to whole groups with copies. A batch of short runs (uneven K = 1: 16 runs
     * of ~128 items) then spent a fifth of its evaluations on copies, so word lanes pad to one word vector
     * (32 lanes) and evaluate what whole groups leave in groups of one (no-VBMI uneven K = 1, G = 1: +10%);
     * byte lanes likewise to one byte vector (64).
     * Each pass still evaluates every entry: copies are walkers too, and a pass that left some behind
     * while new copies came in need not end. */
    while (q.n) {
        const uint32_t pad = !L ? gl : PD_BATCH_WORDS ? 2 * VW : CNV * VW;
        for (uint32_t last = q.n - 1; q.n % pad; q.n++) { /* pad with copies of the last entry */
            q.val[q.n] = q.val[last];
            q.run[q.n] = q.run[last];
            q.idx[q.n] = q.idx[last];
        }
        compact_pass(&c, &q, &buf, d, L, 1);
    }
    outbuf_flush(&c, &buf);
}

#if PD_BATCH_BYTES
#define PD_BYTES_WALK(L, D) \
    static void walk_##L##_##D(const pd__batch *b) { walk(b, D, L); }
PD_BYTES_WALK(6, 0)
PD_BYTES_WALK(6, 1)
PD_BYTES_WALK(6, 2)
PD_BYTES_WALK(7, 0)
PD_BYTES_WALK(7, 1)
PD_BYTES_WALK(7, 2)
PD_BYTES_WALK(8, 0)
PD_BYTES_WALK(8, 1)
PD_BYTES_WALK(8, 2)
PD_BYTES_WALK(8, 3)
static void (*const walk_bytes[3][3])(const pd__batch *) = {
    {walk_6_0, walk_6_1, walk_6_2}, {walk_7_0, walk_7_1, walk_7_2}, {walk_8_0, walk_8_1, walk_8_2}};

void pd__batch_vbmi(const pd__batch *b)
{
    unsigned lbits = 0, d0 = 0, d1 = 0, wide = 0;
    for (unsigned r = 0; r < b->nruns; r++) {
        const pd_perm *p = b->perm[r];
        lbits = p->lbits > lbits ? p->lbits : lbits;
        wide |= p->rbits == 9;
        if (p->rbits != p->lbits)
            d1 = 1;
        else
            d0 = 1;
    }
    if (wide)
        walk_8_3(b);
    else
        walk_bytes[lbits <= 6 ? 0 : lbits - 6][d0 && d1 ? 2 : d1](b);
}
#elif PD_BATCH_WORDS
static void walk_words_d0(const pd__batch *b)
{
    walk(b, 0, 16);
}

static void walk_words_d1(const pd__batch *b)
{
    walk(b, 1, 16);
}

void pd__batch_bw(const pd__batch *b)
{
    int any_d = 0;
    for (unsigned r = 0; r < b->nruns; r++)
        any_d |= b->perm[r]->rbits != b->perm[r]->lbits;
    (any_d ? walk_words_d1 : walk_words_d0)(b);
}
#else
static void walk_d0(const pd__batch *b)
{
    walk(b, 0, 0);
}

static void walk_d1(const pd__batch *b)
{
    walk(b, 1, 0);
}

static void walk_small_d0(const pd__batch *b)
{
    walk(b, PD_SMALL, 0);
}

static void walk_small_d1(const pd__batch *b)
{
    walk(b, PD_SMALL | 1, 0);
}

static void walk_w16_d0(const pd__batch *b)
{
    walk(b, 0, 32);
}

static void walk_w16_d1(const pd__batch *b)
{
    walk(b, 1, 32);
}

void pd__batch_avx512(const pd__batch *b)
{
    int any_d = 0, small = 1, w16 = 1; /* the lighter round when every run has d = 0; one multiply when b ≤ 17 */
    for (unsigned r = 0; r < b->nruns; r++) {
        any_d |= b->perm[r]->rbits != b->perm[r]->lbits;
        small &= b->perm[r]->lbits <= PD_VP_SMALL_LBITS;
        w16 &= b->perm[r]->bits <= 32;
    }
    if (small)
        (any_d ? walk_small_d1 : walk_small_d0)(b);
    else if (w16)
        (any_d ? walk_w16_d1 : walk_w16_d0)(b);
    else
        (any_d ? walk_d1 : walk_d0)(b);
}

/* ---- A mixture batch's ids (kernel.h, pd__batch_ids_avx512): 16 items a vector, the run's offset and
 * parity bit read from two 16-entry tables by vpermd (offsets of u64 ids: their halves, joined after) */

void pd__batch_ids_avx512(const pd__batch_ids *x)
{
    uint32_t lo[16] = {0}, hi[16] = {0}, fl[16] = {0};
    for (unsigned r = 0; r < x->nruns; r++) {
        lo[r] = (uint32_t)x->add[r];
        hi[r] = (uint32_t)(x->add[r] >> 32);
        fl[r] = x->flip[r];
    }
    const __m512i tlo = _mm512_loadu_si512(lo), thi = _mm512_loadu_si512(hi), tfl = _mm512_loadu_si512(fl);
    const __m512i one = _mm512_set1_epi32(1);
    uint64_t i = 0;
    for (; i + VW <= x->count; i += VW) {
        const __m512i run = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x->run + i)));
        __m512i v = _mm512_loadu_si512(x->v + i);
        const __mmask16 small = _mm512_cmple_epu32_mask(v, one); /* pd__unflip: v < 2 takes v ^ flip */
        v = _mm512_mask_xor_epi32(v, small, v, _mm512_permutexvar_epi32(run, tfl));
        const __m512i add_lo = _mm512_permutexvar_epi32(run, tlo);
        if (x->width == 4) {
            _mm512_storeu_si512((uint32_t *)x->out + i, _mm512_add_epi32(v, add_lo));
            continue;
        }
        const __m512i add_hi = _mm512_permutexvar_epi32(run, thi);
        for (int h = 0; h < 2; h++) { /* 8 items a half: v + (hi:lo) in 64 bits */
            const __m512i v64 = _mm512_cvtepu32_epi64(h ? _mm512_extracti64x4_epi64(v, 1) : _mm512_castsi512_si256(v));
            const __m512i a64 = _mm512_or_si512(
                _mm512_cvtepu32_epi64(h ? _mm512_extracti64x4_epi64(add_lo, 1) : _mm512_castsi512_si256(add_lo)),
                _mm512_slli_epi64(_mm512_cvtepu32_epi64(h ? _mm512_extracti64x4_epi64(add_hi, 1)
                                                          : _mm512_castsi512_si256(add_hi)),
                                  32));
            _mm512_storeu_si512((uint64_t *)x->out + i + 8 * h, _mm512_add_epi64(v64, a64));
        }
    }
    for (; i < x->count; i++)
        pd__batch_id_store(x, i);
}

/* A block's reads into a mixture's batch (kernel.h, pd__block_reads_avx512): 16 reads a vector, each read's
 * part counted by one compare per part start, its run and base read by vpermd. */
void pd__block_reads_avx512(const pd__block_reads *x)
{
    const __mmask16 parts = (__mmask16)((1u << x->nparts) - 1);
    const __m512i tb = _mm512_maskz_loadu_epi32(parts, x->base), tr = _mm512_maskz_loadu_epi32(parts, x->runs);
    const __m512i one = _mm512_set1_epi32(1);
    for (uint64_t i = 0; i < x->count; i += VW) {
        const uint64_t n = x->count - i < VW ? x->count - i : VW;
        const __mmask16 live = (__mmask16)((1u << n) - 1);
        const __m512i q = _mm512_maskz_loadu_epi32(live, x->slot + i);
        __m512i p = _mm512_setzero_si512();
        for (unsigned k = 1; k < x->nparts; k++) /* parts in slot order: the part of q is how many start ≤ q */
            p = _mm512_mask_add_epi32(p, _mm512_cmpge_epu32_mask(q, _mm512_set1_epi32((int)x->start[k])), p, one);
        _mm512_mask_storeu_epi32(x->v + i, live, _mm512_add_epi32(_mm512_permutexvar_epi32(p, tb), q));
        _mm_storeu_si128((__m128i *)(x->run + i), _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(p, tr)));
    }
}

/* A segment's reads into a mixture's batch (kernel.h, pd__segment_reads_avx512): 16 reads a vector, each read's
 * block from its index, then per component one compare with that block's first slot (vpermt2d from the
 * component's 32 entries) and its base taken where it holds: the starts grow with j, so the last one taken is
 * the read's component. */
void pd__segment_reads_avx512(const pd__segment_reads *x)
{
    const __m512i tr = _mm512_maskz_loadu_epi32((__mmask16)((1u << x->ncomp) - 1), x->runs);
    const __m512i one = _mm512_set1_epi32(1), step = _mm512_set1_epi32((int)(VW * x->world));
    const __m128i bits = _mm_cvtsi32_si128((int)x->bits);
    __m512i at = _mm512_add_epi32(_mm512_set1_epi32((int)x->rel),
                                  _mm512_mullo_epi32(iota16(), _mm512_set1_epi32((int)x->world)));
    for (uint64_t i = 0; i < x->count; i += VW, at = _mm512_add_epi32(at, step)) {
        const uint64_t n = x->count - i < VW ? x->count - i : VW;
        const __mmask16 live = (__mmask16)((1u << n) - 1);
        const __m512i q = _mm512_maskz_loadu_epi32(live, x->slot + i), b = _mm512_srl_epi32(at, bits);
        __m512i base = _mm512_permutex2var_epi32(_mm512_loadu_si512(x->base), b, _mm512_loadu_si512(x->base + 16));
        __m512i p = _mm512_setzero_si512();
        for (unsigned j = 1; j < x->ncomp; j++) {
            const uint32_t *s = x->start + PD__SEGMENT_BLOCKS * j, *t = x->base + PD__SEGMENT_BLOCKS * j;
            const __mmask16 m = _mm512_cmpge_epu32_mask(
                q, _mm512_permutex2var_epi32(_mm512_loadu_si512(s), b, _mm512_loadu_si512(s + 16)));
            p = _mm512_mask_add_epi32(p, m, p, one);
            base = _mm512_mask_mov_epi32(base, m,
                                         _mm512_permutex2var_epi32(_mm512_loadu_si512(t), b, _mm512_loadu_si512(t + 16)));
        }
        _mm512_mask_storeu_epi32(x->v + i, live, _mm512_add_epi32(base, q));
        _mm_storeu_si128((__m128i *)(x->run + i), _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(p, tr)));
    }
}

/* The low 32 bits of y[0 … 16), as 16 u32. */
PD_AI __m512i low16x32(const uint64_t *y)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_loadu_si512(y))),
                              _mm512_cvtepi64_epi32(_mm512_loadu_si512(y + 8)), 1);
}

/* kernel.h, pd__segment_tables_avx512: blocks 0-15 and 16-31 a register each, in u32 (counts differ by ≤ B, and
 * every table is mod 2^32). */
void pd__segment_tables_avx512(const uint64_t *const *leaf, unsigned ncomp, const uint64_t *off, uint32_t *start,
                               uint32_t *base)
{
    __m512i slot[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (unsigned j = 0; j < ncomp; j++) {
        const __m512i o = _mm512_set1_epi32((int)(uint32_t)off[j]);
        for (unsigned h = 0; h < 2; h++) {
            const __m512i at = low16x32(leaf[j] + 16 * h), next = low16x32(leaf[j] + 16 * h + 1);
            _mm512_storeu_si512(start + PD__SEGMENT_BLOCKS * j + 16 * h, slot[h]);
            _mm512_storeu_si512(base + PD__SEGMENT_BLOCKS * j + 16 * h, _mm512_sub_epi32(_mm512_add_epi32(o, at), slot[h]));
            slot[h] = _mm512_add_epi32(slot[h], _mm512_sub_epi32(next, at));
        }
    }
}

/* kernel.h, pd__counts_node_avx512. Doubles hold y_i − y_0 (or-ed under 2^52's exponent, then 2^52 taken
 * off), the numerator r0 + (y_i − y_0)·a (an fma, exact below 2^49) and its quotient ⌊num·(1/S)⌋. That floor is
 * never too large: a non-integer num/S lies at least 1/num ≥ 2^-49 (relative) below the next integer, more than
 * the two roundings' 2^-52. It is one too small where num is a multiple of S and the product rounds below it:
 * then the remainder num − q·S (exact) is S, and q takes one more. q goes back to an integer by the same
 * exponent. Positions 25-32 take a fifth vector over 25-31 again: the same values stored twice, no mask. */
void pd__counts_node_avx512(const uint64_t *in, uint64_t *left, uint64_t *right, uint64_t l0, uint64_t r0, uint64_t a,
                            uint64_t S)
{
    const __m512i y0 = _mm512_set1_epi64((long long)in[0]), l = _mm512_set1_epi64((long long)l0);
    const __m512i exp52 = _mm512_set1_epi64(0x4330000000000000LL), low52 = _mm512_set1_epi64((1LL << 52) - 1);
    const __m512d two52 = _mm512_set1_pd(4503599627370496.0), da = _mm512_set1_pd((double)a);
    const __m512d dr0 = _mm512_set1_pd((double)r0), dS = _mm512_set1_pd((double)S), inv = _mm512_set1_pd(1.0 / (double)S);
    const __m512d one = _mm512_set1_pd(1.0);
    for (unsigned v = 0; v < 5; v++) {
        const unsigned i = v < 4 ? 8 * v : PD__SEGMENT_BLOCKS - 7;
        const __m512i y = _mm512_loadu_si512(in + i);
        const __m512d dy = _mm512_sub_pd(_mm512_castsi512_pd(_mm512_or_si512(_mm512_sub_epi64(y, y0), exp52)), two52);
        const __m512d num = _mm512_fmadd_pd(dy, da, dr0);
        __m512d q = _mm512_floor_pd(_mm512_mul_pd(num, inv));
        q = _mm512_mask_add_pd(q, _mm512_cmp_pd_mask(_mm512_fnmadd_pd(q, dS, num), dS, _CMP_GE_OQ), q, one);
        const __m512i lq = _mm512_add_epi64(l, _mm512_and_si512(_mm512_castpd_si512(_mm512_add_pd(q, two52)), low52));
        _mm512_storeu_si512(left + i, lq);
        _mm512_storeu_si512(right + i, _mm512_sub_epi64(y, lq));
    }
}

/* A dense block of 64 slots (kernel.h, pd__layout64_avx512): its ids in four registers, each part's by a masked
 * load per register it touches (no store to reload: a scalar layout's stores stalled the loads after them), then 16
 * reads a vector by two vpermt2d and a blend on the slot's bit 5. */
void pd__layout64_avx512(const pd__layout_part *parts, unsigned nparts, const uint32_t *slot, uint64_t reads,
                         uint32_t *out)
{
    __m512i z[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (unsigned p = 0; p < nparts; p++) {
        const uint32_t lo = parts[p].slot, hi = lo + parts[p].count;
        const uint64_t held = (hi == 64 ? ~UINT64_C(0) : (UINT64_C(1) << hi) - 1) & ~((UINT64_C(1) << lo) - 1);
        const __m512i add = _mm512_set1_epi32((int)parts[p].add);
        /* Register v's lane l: from[16v + l], read for the part's lanes only (ids − lo may lie before the ids'
         * array: an address for the masked loads, formed as an integer, never dereferenced outside the part). */
        const uint32_t *from = (const uint32_t *)((uintptr_t)parts[p].ids - (uintptr_t)lo * sizeof *parts[p].ids);
        PD_UNROLL(4)
        for (int v = 0; v < 4; v++) { /* unrolled: z stays in registers */
            const __mmask16 m = (__mmask16)(held >> (VW * v));
            if (m)
                z[v] = _mm512_mask_add_epi32(z[v], m, _mm512_maskz_loadu_epi32(m, from + VW * v), add);
        }
    }
    const __m512i bit5 = _mm512_set1_epi32(32);
    for (uint64_t i = 0; i < reads; i += VW) {
        const uint64_t n = reads - i < VW ? reads - i : VW;
        const __mmask16 live = (__mmask16)((1u << n) - 1);
        const __m512i q = _mm512_maskz_loadu_epi32(live, slot + i);
        const __m512i low = _mm512_permutex2var_epi32(z[0], q, z[1]), high = _mm512_permutex2var_epi32(z[2], q, z[3]);
        _mm512_mask_storeu_epi32(out + i, live, _mm512_mask_mov_epi32(low, _mm512_test_epi32_mask(q, bit5), high));
    }
}

/* ---- Keys of 16 windows: Philox4x32-10 with one window per lane, block by block (core/keys.h) */

/* hi32 and lo32 of m·c for every lane. */
PD_AI void mulhilo(__m512i c, __m512i m, __m512i *hi, __m512i *lo)
{
    const __m512i e = _mm512_mul_epu32(c, m);
    const __m512i o = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
    *hi = _mm512_mask_shuffle_epi32(o, 0x5555, e, _MM_PERM_DDBB);
    *lo = _mm512_mullo_epi32(c, m);
}

void pd__keys_many_avx512(uint64_t seed, uint64_t epoch, uint32_t first, unsigned count, pd_keys *out)
{
    uint32_t blk[4][VW];
    const __m512i m0 = _mm512_set1_epi32((int)PD_PHILOX_M0), m1 = _mm512_set1_epi32((int)PD_PHILOX_M1);
    const __m512i stream = _mm512_add_epi32(_mm512_set1_epi32((int)first), iota16());
    for (uint32_t j = 0; j < 7; j++) {
        __m512i c0 = _mm512_set1_epi32((int)j), c1 = stream;
        __m512i c2 = _mm512_set1_epi32((int)(uint32_t)epoch), c3 = _mm512_set1_epi32((int)(uint32_t)(epoch >> 32));
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int r = 0; r < 10; r++) {
            if (r > 0) {
                k0 += PD_PHILOX_W0;
                k1 += PD_PHILOX_W1;
            }
            __m512i hi0, lo0, hi1, lo1;
            mulhilo(c0, m0, &hi0, &lo0);
            mulhilo(c2, m1, &hi1, &lo1);
            c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32((int)k0), PD_TL_XOR3);
            c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32((int)k1), PD_TL_XOR3);
            c1 = lo1;
            c3 = lo0;
        }
        _mm512_storeu_si512(blk[0], c0);
        _mm512_storeu_si512(blk[1], c1);
        _mm512_storeu_si512(blk[2], c2);
        _mm512_storeu_si512(blk[3], c3);
        for (unsigned w = 0; w < count; w++) {
            if (j < 6)
                for (int i = 0; i < 4; i++)
                    out[w].k[4 * j + i] = blk[i][w];
            else
                out[w].flip = blk[0][w] & 1u;
        }
    }
}
#endif
