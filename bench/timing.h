/* Timing shared by the benchmarks: a monotonic clock and the median of repeated runs. */
#ifndef PERMD_BENCH_TIMING_H
#define PERMD_BENCH_TIMING_H

#include <time.h>

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Median of BENCH_REPS timings of fn(ctx), after one warm-up. */
#define BENCH_REPS 5
static inline double median_seconds(void (*fn)(void *), void *ctx)
{
    double t[BENCH_REPS];
    fn(ctx);
    for (int r = 0; r < BENCH_REPS; r++) {
        double t0 = bench_now();
        fn(ctx);
        t[r] = bench_now() - t0;
    }
    for (int i = 0; i < BENCH_REPS; i++)
        for (int j = i + 1; j < BENCH_REPS; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    return t[BENCH_REPS / 2];
}

/* Medians of BENCH_REPS timings each of fa(ca) and fb(cb), timed alternately after one warm-up of each,
 * so that a machine whose speed drifts over minutes (a shared VM: the H100 host's rows moved 30-40%
 * between runs) slows both alike and their ratio holds. */
static inline void median_seconds_paired(void (*fa)(void *), void *ca, void (*fb)(void *), void *cb, double *ta,
                                         double *tb)
{
    double t[2][BENCH_REPS];
    fa(ca);
    fb(cb);
    for (int r = 0; r < BENCH_REPS; r++) {
        double t0 = bench_now();
        fa(ca);
        t[0][r] = bench_now() - t0;
        t0 = bench_now();
        fb(cb);
        t[1][r] = bench_now() - t0;
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < BENCH_REPS; i++)
            for (int j = i + 1; j < BENCH_REPS; j++)
                if (t[k][j] < t[k][i]) {
                    double x = t[k][i];
                    t[k][i] = t[k][j];
                    t[k][j] = x;
                }
    *ta = t[0][BENCH_REPS / 2];
    *tb = t[1][BENCH_REPS / 2];
}

#endif
