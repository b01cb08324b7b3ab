/* Statistics shared by the quality tests: χ² over permutations of 5, and the Mallows-kernel MMD
 * of Mitchell et al. §5 (Kendall distance by merge sort, the kernel's expectation in closed form). */
#ifndef PERMD_QUALITY_STATS_H
#define PERMD_QUALITY_STATS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHI2_THRESHOLD 145.5 /* χ²(119) at α = 0.05, from the spec */

/* Index 0..119 of a permutation of 5 distinct values (Lehmer code). */
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

/* χ² of 120 counts against the uniform expectation. */
static double chi2_uniform120(const unsigned counts[120], unsigned total)
{
    double expect = total / 120.0, chi2 = 0;
    for (int i = 0; i < 120; i++)
        chi2 += (counts[i] - expect) * (counts[i] - expect) / expect;
    return chi2;
}

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

/* MMD² estimate and its α = 0.05 acceptance threshold for `perms` permutations of n,
 * produced pairwise by next(ctx, index, out). */
typedef struct mmd_result {
    double mmd2, threshold;
} mmd_result;

static mmd_result mmd_estimate(uint32_t n, uint64_t perms, void (*next)(void *ctx, uint64_t i, uint32_t *out),
                               void *ctx)
{
    const double lambda = 5;
    uint32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    uint32_t *c = malloc(n * sizeof *c), *tmp = malloc(n * sizeof *tmp);
    double pairs = n * (n - 1) / 2.0, sum = 0;
    for (uint64_t e = 0; e + 1 < perms; e += 2) {
        next(ctx, e, a);
        next(ctx, e + 1, b);
        sum += exp(-lambda * (double)discordant(a, b, n, c, tmp) / pairs);
    }
    free(a);
    free(b);
    free(c);
    free(tmp);
    double ek = mallows_expectation(n, lambda);
    double var_k = mallows_expectation(n, 2 * lambda) - ek * ek;
    double var_mmd = 2 * var_k / (double)perms;
    mmd_result r = {2.0 * sum / (double)perms - ek, sqrt(2 * var_mmd) * erfinv(0.95)};
    return r;
}

#endif
