/* Quality of sharded epochs (docs/spec/shards-v1.md §5): how random the order stays as K and G vary.
 * Asserts what must hold (uniform positions, uniform order with one window) beside negative controls,
 * and prints the trade-off table recorded in docs/shards.md. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/shards.h"
#include "stats.h"

#define SEED UINT64_C(20261123)

typedef struct layout {
    uint64_t shards, per_shard, window, lanes;
    int identity_order; /* negative control: shards stay in natural order */
} layout;

typedef struct plan_buf {
    uint64_t *sizes, *start;
    void *mem;
    pd_shard_plan plan;
} plan_buf;

static void plan_open(plan_buf *b, const layout *l)
{
    b->sizes = malloc(l->shards * sizeof *b->sizes);
    b->start = malloc((l->shards + 1) * sizeof *b->start);
    b->mem = malloc(pd_shard_plan_bytes(l->shards));
    for (uint64_t s = 0; s < l->shards; s++)
        b->sizes[s] = l->per_shard;
    assert_int_equal(pd_shard_layout_build(b->sizes, l->shards, b->start), 0);
}

static void plan_epoch(plan_buf *b, const layout *l, uint64_t epoch)
{
    assert_int_equal(pd_shard_plan_init(&b->plan, b->start, l->shards, SEED, epoch, l->window, l->lanes, b->mem,
                                        pd_shard_plan_bytes(l->shards)),
                     0);
    if (l->identity_order) { /* overwrite the epoch table as if π were the identity */
        for (uint64_t t = 0; t < l->shards; t++) {
            b->plan.slot_shard[t] = t;
            b->plan.slot_start[t] = t * l->per_shard;
        }
    }
}

static void plan_close(plan_buf *b)
{
    free(b->sizes);
    free(b->start);
    free(b->mem);
}

static void epoch_order(plan_buf *b, const layout *l, uint64_t epoch, uint32_t *out)
{
    plan_epoch(b, l, epoch);
    for (uint64_t p = 0; p < b->plan.n; p++) {
        pd_shard_loc loc;
        assert_int_equal(pd_shard_locate(&b->plan, p, &loc), 0);
        out[p] = (uint32_t)loc.sample;
    }
}

/* χ² (15 dof) of where three samples land, in 16 equal bins of the epoch, over 8,000 epochs.
 * Positions come from a forward scan through the epoch table, so the negative control's
 * doctored table is what gets measured. */
#define CHI2_15 24.996 /* χ²(15) at α = 0.05 */

static double position_chi2(const layout *l)
{
    plan_buf b;
    plan_open(&b, l);
    const uint64_t n = l->shards * l->per_shard, watched[3] = {0, n / 2 + 5, n - 1};
    unsigned bins[3][16] = {{0}};
    const unsigned epochs = 8000;
    for (unsigned e = 0; e < epochs; e++) {
        plan_epoch(&b, l, e);
        int found = 0;
        for (uint64_t p = 0; p < n && found < 3; p++) {
            pd_shard_loc loc;
            assert_int_equal(pd_shard_locate(&b.plan, p, &loc), 0);
            for (int i = 0; i < 3; i++) {
                if (loc.sample == watched[i]) {
                    bins[i][p * 16 / n]++;
                    found++;
                }
            }
        }
        assert_int_equal(found, 3);
    }
    plan_close(&b);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        double chi2 = 0, expect = epochs / 16.0;
        for (int k = 0; k < 16; k++)
            chi2 += (bins[i][k] - expect) * (bins[i][k] - expect) / expect;
        if (chi2 > worst)
            worst = chi2;
    }
    return worst;
}

static void positions_are_uniform(void **state)
{
    (void)state;
    const layout ls[] = {{64, 16, 1, 1, 0}, {64, 16, 4, 4, 0}, {64, 16, 8, 3, 0}};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        double c = position_chi2(&ls[i]);
        printf("position chi2 (S=64, K=%llu, G=%llu): worst of 3 samples %.1f (accept < %.1f)\n",
               (unsigned long long)ls[i].window, (unsigned long long)ls[i].lanes, c, CHI2_15);
        assert_true(c < CHI2_15);
    }
    const layout bad = {64, 16, 4, 4, 1};
    double c = position_chi2(&bad);
    printf("position chi2 negative control (shards in natural order): %.1f (must be >= %.1f)\n", c, CHI2_15);
    assert_true(c >= CHI2_15);
}

/* χ² over the 120 orders of 5 samples: one 5-shard window, and 5 windows of one shard. */
static double order_chi2(const layout *l)
{
    plan_buf b;
    plan_open(&b, l);
    unsigned counts[120] = {0};
    uint32_t order[5];
    for (unsigned e = 0; e < 100000; e++) {
        epoch_order(&b, l, e, order);
        counts[lehmer_rank5(order)]++;
    }
    plan_close(&b);
    return chi2_uniform120(counts, 100000);
}

static void small_orders_are_uniform(void **state)
{
    (void)state;
    const layout one_window = {5, 1, 5, 1, 0}, shard_order = {5, 1, 1, 1, 0}, bad = {5, 1, 1, 1, 1};
    double a = order_chi2(&one_window), o = order_chi2(&shard_order), c = order_chi2(&bad);
    printf("order chi2 n=5: one window %.1f, shard order only %.1f (accept < %.1f); negative control %.1f\n", a, o,
           CHI2_THRESHOLD, c);
    assert_true(a < CHI2_THRESHOLD);
    assert_true(o < CHI2_THRESHOLD);
    assert_true(c >= CHI2_THRESHOLD);
}

/* ---- the trade-off: MMD against uniform, and batch diversity, as K and G vary ---- */

typedef struct mmd_ctx {
    plan_buf b;
    layout l;
} mmd_ctx;

static void next_sharded(void *ctx, uint64_t e, uint32_t *out)
{
    mmd_ctx *m = ctx;
    epoch_order(&m->b, &m->l, e, out);
}

/* Mean number of distinct shards among 64 consecutive positions (a global batch). */
static double batch_diversity(mmd_ctx *m)
{
    const uint64_t n = m->l.shards * m->l.per_shard, batch = 64;
    uint32_t *order = malloc(n * sizeof *order);
    uint8_t *seen = calloc(m->l.shards, 1);
    double total = 0;
    unsigned batches = 0;
    for (uint64_t e = 0; e < 20; e++) {
        epoch_order(&m->b, &m->l, e, order);
        for (uint64_t s = 0; s + batch <= n; s += batch, batches++) {
            unsigned distinct = 0;
            for (uint64_t i = s; i < s + batch; i++)
                if (!seen[order[i] / m->l.per_shard]++)
                    distinct++;
            for (uint64_t i = s; i < s + batch; i++)
                seen[order[i] / m->l.per_shard] = 0;
            total += distinct;
        }
    }
    free(order);
    free(seen);
    return total / batches;
}

static void trade_off_table(void **state)
{
    (void)state;
    const uint64_t perms = test_quick() ? 200 : 10000;
    const uint64_t ks[] = {1, 5, 25, 100};
    const uint64_t gs[] = {1, 4};
    printf("\n| K | G | MMD² z-score vs uniform (|z| < 1.96 passes) | distinct shards per 64 positions |\n");
    printf("|---|---|---|---|\n");
    double z_one_window = 0, z_k1 = 0;
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        for (size_t j = 0; j < sizeof gs / sizeof gs[0]; j++) {
            mmd_ctx m = {.l = {100, 10, ks[i], gs[j], 0}};
            plan_open(&m.b, &m.l);
            mmd_result r = mmd_estimate(1000, perms, next_sharded, &m);
            double z = 1.96 * r.mmd2 / r.threshold;
            printf("| %llu | %llu | %+.1f | %.1f |\n", (unsigned long long)ks[i], (unsigned long long)gs[j], z,
                   batch_diversity(&m));
            if (ks[i] == 100 && gs[j] == 1)
                z_one_window = z;
            if (ks[i] == 1 && gs[j] == 1)
                z_k1 = z;
            plan_close(&m.b);
        }
    }
    printf("(S = 100 shards of 10 samples, N = 1000; %llu permutations per row)\n", (unsigned long long)perms);
    if (!test_quick()) {
        assert_true(z_one_window > -1.96 && z_one_window < 1.96); /* one window is a uniform shuffle */
        assert_true(z_k1 >= 1.96 || z_k1 <= -1.96);               /* one shard per window is not */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(positions_are_uniform),
        cmocka_unit_test(small_orders_are_uniform),
        cmocka_unit_test(trade_off_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
