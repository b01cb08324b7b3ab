/* Tests for core/perm.c: the spec's σ/σ⁻¹ vectors, bijection proofs by enumeration and sampling, bad input. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/perm.h"
#include "vectors_v1.h"

static void known_permutations(void **state)
{
    (void)state;
    assert_true(VEC_COUNT(vec_permutation) >= 18);
    for (size_t i = 0; i < VEC_COUNT(vec_permutation); i++) {
        const struct vec_map *v = &vec_permutation[i];
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, v->seed, v->epoch, PD_STREAM_SAMPLES, v->n), PD_OK);
        for (size_t j = 0; j < v->count; j++) {
            uint64_t s = 0;
            assert_int_equal(pd_perm_sample(&p, v->in[j], &s), PD_OK);
            if (s != v->out[j])
                fail_msg("case %zu (n=%llu) position %llu: got %llu want %llu", i,
                         (unsigned long long)v->n, (unsigned long long)v->in[j],
                         (unsigned long long)s, (unsigned long long)v->out[j]);
        }
    }
}

static void known_inverses(void **state)
{
    (void)state;
    assert_true(VEC_COUNT(vec_inverse) >= 17);
    for (size_t i = 0; i < VEC_COUNT(vec_inverse); i++) {
        const struct vec_map *v = &vec_inverse[i];
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, v->seed, v->epoch, PD_STREAM_SAMPLES, v->n), PD_OK);
        for (size_t j = 0; j < v->count; j++) {
            uint64_t pos = 0;
            assert_int_equal(pd_perm_position(&p, v->in[j], &pos), PD_OK);
            assert_true(pos == v->out[j]);
        }
    }
}

static void shape_follows_spec(void **state)
{
    (void)state;
    static const struct {
        uint64_t n;
        uint32_t bits;
    } cases[] = {
        {1, 6}, {2, 6}, {64, 6}, {65, 7}, {1000, 10}, {1024, 10}, {1025, 11},
        {UINT64_C(1) << 32, 32}, {(UINT64_C(1) << 32) + 1, 33}, {(UINT64_C(1) << 63) - 1, 63},
        {UINT64_C(1) << 63, 63},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, 1, 2, 0, cases[i].n), PD_OK);
        assert_int_equal(p.bits, cases[i].bits);
        assert_int_equal(p.lbits, p.bits / 2);
        assert_int_equal(p.lbits + p.rbits, p.bits);
        assert_true(p.rbits - p.lbits <= 1);
        assert_true((uint64_t)p.rmask == (UINT64_C(1) << p.rbits) - 1);
        assert_true((uint64_t)p.lmask == (UINT64_C(1) << p.lbits) - 1);
    }
}

static void multiplier_inverse(void **state)
{
    (void)state;
    assert_true(PD_VP_M0 * PD_VP_M0_INV == 1);
}

/* Whether one 32-bit multiplier y gives, for every s0 < 2^lbits, M0·s0's low lbits bits shifted left by d
 * and its bits 32 to 32 + lbits, as pd__vp_small_mult_d promises. */
static int small_mult_exact(uint32_t y, uint32_t lbits, uint32_t d)
{
    const uint32_t lmask = (UINT32_C(1) << lbits) - 1, low = (lmask << d) | ((UINT32_C(1) << d) - 1);
    for (uint32_t s0 = 0; s0 <= lmask; s0++) {
        const uint64_t prod = PD_VP_M0 * s0;
        const uint32_t t = y * s0;
        if ((t >> (32 - lbits)) != ((uint32_t)(prod >> 32) & lmask) ||
            (t & low) != (((uint32_t)prod & lmask) << d))
            return 0;
    }
    return 1;
}

/* The narrow-halves multiplier holds for every s0 at every lbits up to PD_VP_SMALL_LBITS, and a round
 * built on it gives v1's f; it is no identity in general: at lbits 9, and with M0's low bits altered, it
 * fails. */
static void small_multiplier_exact(void **state)
{
    (void)state;
    for (uint32_t lbits = PD_MIN_BITS / 2; lbits <= PD_VP_SMALL_LBITS; lbits++)
        for (uint32_t d = 0; d <= 1; d++)
            assert_true(small_mult_exact(pd__vp_small_mult_d(lbits, d), lbits, d));
    for (uint32_t d = 0; d <= 1; d++) {
        assert_false(small_mult_exact(pd__vp_small_mult_d(PD_VP_SMALL_LBITS + 1, d), PD_VP_SMALL_LBITS + 1, d));
        assert_false(small_mult_exact(pd__vp_small_mult_d(PD_VP_SMALL_LBITS, d) ^ (2u << d), PD_VP_SMALL_LBITS, d));
    }
    /* d = 1 without its unit: the plain multiplier one bit lower lets lbits = 8's low product carry in */
    const uint32_t z8 = ((uint32_t)(PD_VP_M0 >> 9) & ~UINT32_C(0xFF)) | ((uint32_t)PD_VP_M0 & 0xFF);
    assert_false(small_mult_exact(z8 << 1, 8, 1));
    /* f on b = 6 … 17 through rounds of one 32-bit multiply, as gpu/shards.cu's walk computes it */
    uint64_t rng = 5;
    for (uint32_t b = PD_MIN_BITS; b <= 2 * PD_VP_SMALL_LBITS + 1; b++) {
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, b, 3, 2 + b, UINT64_C(1) << b), PD_OK);
        const uint32_t d = p.rbits - p.lbits, y = pd__vp_small_mult(p.lbits), yd = pd__vp_small_mult_d(p.lbits, d);
        for (int i = 0; i < 2000; i++) {
            const uint32_t v = (uint32_t)(test_rand(&rng) & ((UINT64_C(1) << b) - 1));
            uint32_t s0 = v >> p.rbits, s1 = v & p.rmask, s0d = s0, s1d = s1;
            for (int r = 0; r < PD_ROUNDS; r++) {
                const uint32_t t = y * s0, hi = t >> (32 - p.lbits); /* the GPU's: lo shifted after */
                const uint32_t lo = d ? (t << 1) | (s1 >> p.lbits) : t;
                s0 = (hi ^ p.keys.k[r] ^ s1) & p.lmask;
                s1 = lo & p.rmask;
                const uint32_t td = yd * s0d; /* the CPU's: lo shifted by the multiplier */
                const uint32_t s1n = (td | (s1d >> p.lbits)) & p.rmask;
                s0d = ((td >> (32 - p.lbits)) ^ p.keys.k[r] ^ s1d) & p.lmask;
                s1d = s1n;
            }
            assert_int_equal(((uint64_t)s0 << p.rbits) | s1, pd__vphilox(&p, v, PD_ROUNDS));
            assert_int_equal(((uint64_t)s0d << p.rbits) | s1d, pd__vphilox(&p, v, PD_ROUNDS));
        }
    }
}

/* The Feistel network itself must invert at every width, b = 63 included. */
static void vphilox_inverts_at_every_width(void **state)
{
    (void)state;
    uint64_t rng = 1;
    for (uint32_t b = PD_MIN_BITS; b <= 63; b++) {
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, b, 99, 0, UINT64_C(1) << (b - 1)), PD_OK);
        pd__perm_shape(&p, (UINT64_C(1) << (b - 1)) + 1, PD_MIN_BITS);
        assert_int_equal(p.bits, b);
        uint64_t dom = UINT64_C(1) << b;
        for (int i = 0; i < 2000; i++) {
            uint64_t v = i < 4 ? (i < 2 ? (uint64_t)i : dom - 1 - (uint64_t)(i - 2)) : test_below(&rng, dom);
            uint64_t w = pd__vphilox(&p, v, PD_ROUNDS);
            assert_true(w < dom);
            assert_true(pd__vphilox_inv(&p, w, PD_ROUNDS) == v);
            assert_true(pd__f_inv(&p, pd__f(&p, v, PD_ROUNDS, 1), PD_ROUNDS, 1) == v);
        }
    }
}

/* Enumerate σ over all of [0, n): every id hit once, σ⁻¹ undoes it, and the bulk fills agree. */
static void check_enumerated(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t *buf, uint8_t *seen)
{
    pd_perm p;
    assert_int_equal(pd_perm_init(&p, seed, epoch, PD_STREAM_SAMPLES, n), PD_OK);
    memset(seen, 0, (size_t)(n + 7) / 8);
    assert_int_equal(pd_perm_fill_u64(&p, 0, n, buf), PD_OK);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t s = buf[i];
        if (s >= n || (seen[s / 8] >> (s % 8)) & 1)
            fail_msg("n=%llu: sigma(%llu)=%llu out of range or repeated", (unsigned long long)n,
                     (unsigned long long)i, (unsigned long long)s);
        seen[s / 8] |= (uint8_t)(1u << (s % 8));
        if (pd_perm_inv(&p, s) != i)
            fail_msg("n=%llu: inverse(sigma(%llu)) != %llu", (unsigned long long)n, (unsigned long long)i,
                     (unsigned long long)i);
    }
}

static void bijection_all_small_n(void **state)
{
    (void)state;
    uint64_t *buf = malloc(5000 * sizeof *buf);
    uint8_t *seen = malloc(5000 / 8 + 1);
    assert_non_null(buf);
    assert_non_null(seen);
    const uint64_t max_n = test_quick() ? 300 : 5000;
    for (uint64_t n = 1; n <= max_n; n++)
        check_enumerated(n * 31, n % 7, n, buf, seen);
    free(buf);
    free(seen);
}

static void bijection_near_powers(void **state)
{
    (void)state;
    const uint64_t max = UINT64_C(1) << 22;
    uint64_t *buf = malloc((max + 1) * sizeof *buf);
    uint8_t *seen = malloc(max / 8 + 1);
    assert_non_null(buf);
    assert_non_null(seen);
    const uint32_t max_k = test_quick() ? 12 : 22;
    for (uint32_t k = 1; k <= max_k; k++) {
        uint64_t pk = UINT64_C(1) << k;
        check_enumerated(k, 1, pk - 1, buf, seen);
        check_enumerated(k, 2, pk, buf, seen);
        if (pk + 1 <= max)
            check_enumerated(k, 3, pk + 1, buf, seen);
        if (2 * k <= max_k)
            check_enumerated(k, 4, (UINT64_C(1) << (2 * k)) + 1, buf, seen); /* 4^k + 1 */
    }
    free(buf);
    free(seen);
}

/* Large n cannot be enumerated: sample positions and check both directions. */
static void bijection_sampled_large_n(void **state)
{
    (void)state;
    const uint64_t ns[] = {
        UINT64_C(1000000000), (UINT64_C(1) << 32) - 1, UINT64_C(1) << 32, (UINT64_C(1) << 32) + 1,
        (UINT64_C(1) << 40) + 12345, (UINT64_C(1) << 62) + 1, (UINT64_C(1) << 63) - 1,
        UINT64_C(1) << 63,
    };
    uint64_t rng = 7;
    for (size_t i = 0; i < sizeof ns / sizeof ns[0] + 8; i++) {
        uint64_t n = i < sizeof ns / sizeof ns[0] ? ns[i] : 1 + test_below(&rng, UINT64_C(1) << 63);
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, i, i * 3, PD_STREAM_SAMPLES, n), PD_OK);
        for (int j = 0; j < 3000; j++) {
            uint64_t pos = j == 0 ? 0 : j == 1 ? n - 1 : test_below(&rng, n);
            uint64_t s = pd_perm_at(&p, pos);
            assert_true(s < n);
            assert_true(pd_perm_inv(&p, s) == pos);
            uint64_t s2 = test_below(&rng, n);
            assert_true(pd_perm_at(&p, pd_perm_inv(&p, s2)) == s2);
        }
    }
}

static void bulk_matches_pointwise(void **state)
{
    (void)state;
    pd_perm p;
    uint64_t a[300];
    uint32_t b[300];
    assert_int_equal(pd_perm_init(&p, 5, 6, 0, 100003), PD_OK);
    assert_int_equal(pd_perm_fill_u64(&p, 99703, 300, a), PD_OK);
    assert_int_equal(pd_perm_fill_u32(&p, 99703, 300, b), PD_OK);
    for (int i = 0; i < 300; i++) {
        assert_true(a[i] == pd_perm_at(&p, 99703 + (uint64_t)i));
        assert_true(a[i] == b[i]);
    }
}

static void bad_arguments(void **state)
{
    (void)state;
    pd_perm p;
    uint64_t x = 0, buf[4];
    uint32_t b32[4];
    assert_int_equal(pd_perm_init(NULL, 0, 0, 0, 10), PD_EINVAL);
    assert_int_equal(pd_perm_init(&p, 0, 0, 0, 0), PD_EINVAL);
    assert_int_equal(pd_perm_init(&p, 0, 0, 0, (UINT64_C(1) << 63) + 1), PD_EINVAL);
    assert_int_equal(pd_perm_init(&p, 0, 0, 0, UINT64_MAX), PD_EINVAL);
    assert_int_equal(pd_perm_init(&p, 0, 0, 0, 10), PD_OK);
    assert_int_equal(pd_perm_sample(&p, 10, &x), PD_ERANGE);
    assert_int_equal(pd_perm_sample(&p, UINT64_MAX, &x), PD_ERANGE);
    assert_int_equal(pd_perm_sample(NULL, 1, &x), PD_EINVAL);
    assert_int_equal(pd_perm_sample(&p, 1, NULL), PD_EINVAL);
    assert_int_equal(pd_perm_position(&p, 10, &x), PD_ERANGE);
    assert_int_equal(pd_perm_position(NULL, 1, &x), PD_EINVAL);
    assert_int_equal(pd_perm_position(&p, 1, NULL), PD_EINVAL);
    assert_int_equal(pd_perm_fill_u64(&p, 8, 3, buf), PD_ERANGE);
    assert_int_equal(pd_perm_fill_u64(&p, 11, 0, buf), PD_ERANGE);
    assert_int_equal(pd_perm_fill_u64(&p, 1, UINT64_MAX, buf), PD_ERANGE); /* start + count wraps */
    assert_int_equal(pd_perm_fill_u64(&p, 0, 1, NULL), PD_EINVAL);
    assert_int_equal(pd_perm_fill_u64(&p, 10, 0, NULL), PD_OK); /* empty at the end is fine */
    assert_int_equal(pd_perm_fill_u32(NULL, 0, 1, b32), PD_EINVAL);
    assert_int_equal(pd_perm_init(&p, 0, 0, 0, (UINT64_C(1) << 32) + 1), PD_OK);
    assert_int_equal(pd_perm_fill_u32(&p, 0, 4, b32), PD_EOVERFLOW);
    assert_int_equal(pd_perm_init(&p, 0, 0, 0, UINT64_C(1) << 32), PD_OK);
    assert_int_equal(pd_perm_fill_u32(&p, 0, 4, b32), PD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(known_permutations),
        cmocka_unit_test(known_inverses),
        cmocka_unit_test(shape_follows_spec),
        cmocka_unit_test(multiplier_inverse),
        cmocka_unit_test(small_multiplier_exact),
        cmocka_unit_test(vphilox_inverts_at_every_width),
        cmocka_unit_test(bijection_all_small_n),
        cmocka_unit_test(bijection_near_powers),
        cmocka_unit_test(bijection_sampled_large_n),
        cmocka_unit_test(bulk_matches_pointwise),
        cmocka_unit_test(bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
