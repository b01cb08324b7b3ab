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

#endif
