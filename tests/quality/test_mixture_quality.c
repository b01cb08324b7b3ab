/* Quality of mixtures (docs/spec/mixtures-v1.md): χ² tests that a component's draws sit uniformly in their
 * blocks, spread evenly over ranks, and reach each sample at a uniform place in its component epoch — each
 * beside a negative control that the test must reject (the block shuffle or the per-epoch key removed). */
#include "test_util.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "mix_util.h"

/* χ² quantiles at 1 − α = 0.95 for the degrees of freedom used here. */
static double chi2_threshold(unsigned df)
{
    switch (df) {
    case 1: return 3.841;
    case 2: return 5.991;
    case 7: return 14.067;
    case 49: return 66.339;
    case 63: return 82.529;
    }
    fail_msg("no χ² quantile for %u degrees of freedom", df);
    return 0;
}

static double chi2(const uint64_t *counts, unsigned bins, double expect)
{
    double x = 0;
    for (unsigned i = 0; i < bins; i++)
        x += (counts[i] - expect) * (counts[i] - expect) / expect;
    return x;
}

/* The draw at run position g, with the block shuffle on (the spec) or off (slot = offset: the control). */
static void draw_at(const pd_mix *m, uint64_t g, int shuffle, pd_mix_draw *d)
{
    const uint64_t k = pd__last_at_most(m->start, 1, 0, m->stages, g), x0 = (g & ~(m->block - 1)) - m->start[k];
    uint64_t q = g & (m->block - 1), stage_draw;
    if (shuffle) {
        pd_perm pi;
        pd__mix_block_perm(m, g / m->block, &pi);
        q = pd_perm_at(&pi, q);
    }
    pd__mix_descend(m, k, x0, q, &d->component, &stage_draw);
    d->draw = m->drawn[k * m->components + d->component] + stage_draw;
}

static const uint64_t sizes[4] = {8, 1000, 3000, 600};
static const uint32_t weights[4] = {1, 2, 3, 4};
static const uint64_t start0 = 0;

/* χ² of where component 0 (weight 1/10) falls modulo `bins` (the B offsets of a block, or W ranks). With the
 * shuffle it is even; without it each block packs component 0 into its slot range, and with W = B each rank
 * reads the same slot of every block, so some ranks never see component 0. */
static double share_chi2(uint64_t seed, int shuffle, unsigned bins)
{
    owned_mix o;
    assert_int_equal(mix_make(&o, seed, sizes, 4, 0, 64, &start0, weights, 1), PD_OK);
    uint64_t counts[64] = {0}, total = 0;
    for (uint64_t g = 0; g < 64 * 20000; g++) {
        pd_mix_draw d;
        draw_at(&o.mix, g, shuffle, &d);
        if (d.component == 0) {
            counts[g % bins]++;
            total++;
        }
    }
    mix_free(&o);
    return chi2(counts, bins, (double)total / bins);
}

static void block_offsets_uniform(void **state)
{
    (void)state;
    const double x = share_chi2(2026, 1, 64), control = share_chi2(2026, 0, 64), t = chi2_threshold(63);
    printf("  offsets in the block, χ²(63): %.1f (threshold %.1f); without the shuffle: %.1f\n", x, t, control);
    assert_true(x < t);
    assert_true(control > 10 * t);
}

static void ranks_balanced(void **state)
{
    (void)state;
    const unsigned worlds[] = {2, 3, 8, 64};
    for (size_t i = 0; i < 4; i++) {
        const double x = share_chi2(7, 1, worlds[i]), t = chi2_threshold(worlds[i] - 1);
        printf("  component 0 per rank, W = %u: χ²(%u) %.1f (threshold %.1f)\n", worlds[i], worlds[i] - 1, x, t);
        assert_true(x < t);
    }
    const double control = share_chi2(7, 0, 64);
    printf("  W = 64 without the shuffle: χ²(63) %.1f\n", control);
    assert_true(control > 10 * chi2_threshold(63));
}

/* Each sample of component 0 (8 samples) should come at every place 0..7 of its component epoch equally
 * often over many component epochs. The control keeps component epoch 0's key for every epoch. */
static double places_chi2(int fresh_keys)
{
    owned_mix o;
    const uint64_t starts[2] = {0, 64 * 5000};
    const uint32_t w2[8] = {1, 2, 3, 4, 3, 1, 1, 1}; /* a stage change half way: nothing may show */
    assert_int_equal(mix_make(&o, 99, sizes, 4, 0, 64, starts, w2, 2), PD_OK);
    uint64_t counts[64] = {0}, place = 0, total = 0;
    for (uint64_t g = 0; g < 64 * 10000; g++) { /* whole blocks: each component epoch of component 0 complete */
        pd_mix_draw d;
        draw_at(&o.mix, g, 1, &d);
        if (d.component != 0)
            continue;
        pd_perm order;
        pd_perm_init(&order, o.mix.comp_seed[0], fresh_keys ? d.draw / 8 : 0, PD_STREAM_SAMPLES, 8);
        const uint64_t sample = pd_perm_at(&order, d.draw % 8);
        counts[sample * 8 + place]++; /* its place in the order the stream reads the epoch */
        place = (place + 1) % 8;
        total++;
    }
    mix_free(&o);
    return chi2(counts, 64, total / 64.0);
}

static void samples_uniform_over_places(void **state)
{
    (void)state;
    const double x = places_chi2(1), control = places_chi2(0), t = chi2_threshold(49);
    printf("  (sample, place in its component epoch), χ²(49): %.1f (threshold %.1f); one key for all epochs: %.1f\n",
           x, t, control);
    assert_true(x < t);
    assert_true(control > 2 * t); /* weaker than the others: a block holds most of an 8-sample epoch's draws and
                                     shuffles their order anyway; p < 1e-20 all the same */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(block_offsets_uniform),
        cmocka_unit_test(ranks_balanced),
        cmocka_unit_test(samples_uniform_over_places),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
