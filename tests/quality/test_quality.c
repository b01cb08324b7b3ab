/* Spec §6 quality tests: χ² at n = 5, Mallows-kernel MMD at n = 5, 100, 1000, and balanced parity,
 * each beside a deliberately weakened variant that must fail, so every test is shown able to fail. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/perm.h"

#define QUALITY_SEED UINT64_C(20261123)
#define QUALITY_PERMS 100000 /* |Π|, as in the paper and the spec */

/* One way of producing σ: the spec's (24 rounds, parity fix, b ≥ 6) or a weakened one. */
typedef struct variant {
    const char *name;
    int rounds;
    int parity;
    uint32_t min_bits;
} variant;

static const variant SPEC = {"spec v1", PD_ROUNDS, 1, PD_MIN_BITS};

/* σ of epoch e over [0, n) into out[0..n). */
static void permutation(const variant *v, uint64_t epoch, uint32_t n, uint32_t *out)
{
    pd_perm p;
    assert_int_equal(pd_perm_init(&p, QUALITY_SEED, epoch, PD_STREAM_SAMPLES, n), 0);
    pd__perm_shape(&p, n, v->min_bits);
    for (uint32_t i = 0; i < n; i++)
        out[i] = (uint32_t)pd__sigma(&p, i, v->rounds, v->parity);
}

/* ---- χ² over the 120 permutations of 5 elements ---- */

static unsigned lehmer_rank5(const uint32_t *s)
{
    unsigned r = 0;
    for (int i = 0; i < 5; i++) {
        unsigned smaller = 0;
        for (int j = i + 1; j < 5; j++)
            smaller += s[j] < s[i];
        r = r * (unsigned)(5 - i) + smaller;
    }
    return r;
}

static double chi2_n5(const variant *v)
{
    unsigned counts[120] = {0};
    uint32_t s[5];
    for (uint64_t e = 0; e < QUALITY_PERMS; e++) {
        permutation(v, e, 5, s);
        counts[lehmer_rank5(s)]++;
    }
    double expect = QUALITY_PERMS / 120.0, chi2 = 0;
    for (int i = 0; i < 120; i++)
        chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
    return chi2;
}

#define CHI2_THRESHOLD 145.5 /* χ²(119) at α = 0.05, from the spec */

static void chi2_passes(void **state)
{
    (void)state;
    double c = chi2_n5(&SPEC);
    printf("chi2 n=5 %s: %.1f (accept < %.1f)\n", SPEC.name, c, CHI2_THRESHOLD);
    assert_true(c < CHI2_THRESHOLD);
}

static void chi2_negative_controls_fail(void **state)
{
    (void)state;
    const variant bad[] = {
        {"4 rounds", 4, 1, PD_MIN_BITS},
        /* thrust's shape. With the parity fix alone b >= 4 passes here; it is
         * the even-only Feistel on 16 values that fails (spec §3 blames the width). */
        {"b >= 4 without parity correction (thrust)", PD_ROUNDS, 0, 4},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double c = chi2_n5(&bad[i]);
        printf("chi2 n=5 negative control %s: %.1f (must be >= %.1f)\n", bad[i].name, c, CHI2_THRESHOLD);
        assert_true(c >= CHI2_THRESHOLD);
    }
}

/* ---- MMD with the Mallows kernel (Mitchell et al., §5) ---- */

/* Inversions of c[0..n) by merge sort; tmp has room for n. */
static uint64_t inversions(uint32_t *c, uint32_t *tmp, uint32_t n)
{
    if (n < 2)
        return 0;
    uint32_t h = n / 2;
    uint64_t inv = inversions(c, tmp, h) + inversions(c + h, tmp, n - h);
    uint32_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        if (c[i] <= c[j]) {
            tmp[k++] = c[i++];
        } else {
            inv += h - i;
            tmp[k++] = c[j++];
        }
    }
    while (i < h)
        tmp[k++] = c[i++];
    while (j < n)
        tmp[k++] = c[j++];
    memcpy(c, tmp, n * sizeof *c);
    return inv;
}

/* Discordant pairs of (a, b): inversions of b read in a's order. */
static uint64_t discordant(const uint32_t *a, const uint32_t *b, uint32_t n, uint32_t *c, uint32_t *tmp)
{
    for (uint32_t i = 0; i < n; i++)
        c[a[i]] = b[i];
    return inversions(c, tmp, n);
}

/* E over uniform σ' of exp(-lambda·n_dis/C(n,2)): a product of n terms, in logs for n = 1000. */
static double mallows_expectation(uint32_t n, double lambda)
{
    double pairs = n * (n - 1) / 2.0, log_e = 0;
    for (uint32_t j = 1; j <= n; j++)
        log_e += log(-expm1(-lambda * j / pairs)) - log(j * -expm1(-lambda / pairs));
    return exp(log_e);
}

/* erf⁻¹ by bisection: the test's one use does not justify a dependency. */
static double erfinv(double y)
{
    double lo = 0, hi = 6;
    for (int i = 0; i < 200; i++) {
        double mid = (lo + hi) / 2;
        if (erf(mid) < y)
            lo = mid;
        else
            hi = mid;
    }
    return (lo + hi) / 2;
}

typedef struct mmd_result {
    double mmd2, threshold;
} mmd_result;

static mmd_result mmd(const variant *v, uint32_t n)
{
    const double lambda = 5;
    uint32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    uint32_t *c = malloc(n * sizeof *c), *tmp = malloc(n * sizeof *tmp);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_non_null(tmp);
    double pairs = n * (n - 1) / 2.0, sum = 0;
    for (uint64_t e = 0; e < QUALITY_PERMS; e += 2) {
        permutation(v, e, n, a);
        permutation(v, e + 1, n, b);
        sum += exp(-lambda * (double)discordant(a, b, n, c, tmp) / pairs);
    }
    free(a);
    free(b);
    free(c);
    free(tmp);
    double ek = mallows_expectation(n, lambda);
    double var_k = mallows_expectation(n, 2 * lambda) - ek * ek;
    double var_mmd = 2 * var_k / QUALITY_PERMS;
    mmd_result r = {2.0 * sum / QUALITY_PERMS - ek, sqrt(2 * var_mmd) * erfinv(0.95)};
    return r;
}

static const uint32_t MMD_SIZES[] = {5, 100, 1000};

static void mmd_passes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof MMD_SIZES / sizeof MMD_SIZES[0]; i++) {
        mmd_result r = mmd(&SPEC, MMD_SIZES[i]);
        printf("mmd n=%u %s: |MMD^2| = %.3g (accept < %.3g)\n", MMD_SIZES[i], SPEC.name, fabs(r.mmd2),
               r.threshold);
        assert_true(fabs(r.mmd2) < r.threshold);
    }
}

static void mmd_negative_controls_fail(void **state)
{
    (void)state;
    const variant bad = {"2 rounds", 2, 1, PD_MIN_BITS};
    for (size_t i = 0; i < sizeof MMD_SIZES / sizeof MMD_SIZES[0]; i++) {
        mmd_result r = mmd(&bad, MMD_SIZES[i]);
        printf("mmd n=%u negative control %s: |MMD^2| = %.3g (must be >= %.3g)\n", MMD_SIZES[i], bad.name,
               fabs(r.mmd2), r.threshold);
        assert_true(fabs(r.mmd2) >= r.threshold);
    }
}

/* ---- parity of σ over 400 epochs ---- */

static double odd_fraction(const variant *v, uint32_t n)
{
    uint32_t *s = malloc(n * sizeof *s);
    uint8_t *seen = malloc(n);
    assert_non_null(s);
    assert_non_null(seen);
    int odd = 0;
    for (uint64_t e = 0; e < 400; e++) {
        permutation(v, e, n, s);
        memset(seen, 0, n);
        uint32_t cycles = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (seen[i])
                continue;
            cycles++;
            for (uint32_t j = i; !seen[j]; j = s[j])
                seen[j] = 1;
        }
        odd += (n - cycles) & 1; /* a k-cycle is k - 1 transpositions */
    }
    free(s);
    free(seen);
    return odd / 400.0;
}

static const uint32_t PARITY_SIZES[] = {1024, 1023};

static void parity_is_balanced(void **state)
{
    (void)state;
    for (size_t i = 0; i < 2; i++) {
        double f = odd_fraction(&SPEC, PARITY_SIZES[i]);
        printf("parity n=%u %s: odd fraction %.3f (accept 0.4..0.6)\n", PARITY_SIZES[i], SPEC.name, f);
        assert_true(f >= 0.4 && f <= 0.6);
    }
}

static void parity_negative_control_fails(void **state)
{
    (void)state;
    const variant bad = {"no parity correction", PD_ROUNDS, 0, PD_MIN_BITS};
    for (size_t i = 0; i < 2; i++) {
        double f = odd_fraction(&bad, PARITY_SIZES[i]);
        printf("parity n=%u negative control %s: odd fraction %.3f (must be outside 0.4..0.6)\n",
               PARITY_SIZES[i], bad.name, f);
        assert_true(f < 0.4 || f > 0.6);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chi2_passes),
        cmocka_unit_test(chi2_negative_controls_fail),
        cmocka_unit_test(mmd_passes),
        cmocka_unit_test(mmd_negative_controls_fail),
        cmocka_unit_test(parity_is_balanced),
        cmocka_unit_test(parity_negative_control_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
