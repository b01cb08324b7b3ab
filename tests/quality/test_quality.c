/* Spec §6 quality tests: χ² at n = 5, Mallows-kernel MMD at n = 5, 100, 1000, and balanced parity,
 * each beside a deliberately weakened variant that must fail, so every test is shown able to fail. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/perm.h"
#include "stats.h"

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

static double chi2_n5(const variant *v)
{
    unsigned counts[120] = {0};
    uint32_t s[5];
    for (uint64_t e = 0; e < QUALITY_PERMS; e++) {
        permutation(v, e, 5, s);
        counts[lehmer_rank5(s)]++;
    }
    return chi2_uniform120(counts, QUALITY_PERMS);
}


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

/* Consecutive epochs of one variant, as the MMD's sample. */
typedef struct variant_at {
    const variant *v;
    uint32_t n;
} variant_at;

static void next_epoch(void *ctx, uint64_t e, uint32_t *out)
{
    const variant_at *va = ctx;
    permutation(va->v, e, va->n, out);
}

static mmd_result mmd(const variant *v, uint32_t n)
{
    variant_at va = {v, n};
    return mmd_estimate(n, QUALITY_PERMS, next_epoch, &va);
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
