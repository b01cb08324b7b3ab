/* Helpers shared by the C tests: cmocka's required includes, a seeded generator for sampled inputs, a clock. */
#ifndef PERMD_TEST_UTIL_H
#define PERMD_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <cmocka.h>

/* splitmix64: reproducible inputs for sampled tests (never used by permd itself). */
static inline uint64_t test_rand(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform-enough value in [0, bound) for test sampling (bound > 0). */
static inline uint64_t test_below(uint64_t *state, uint64_t bound)
{
    return test_rand(state) % bound;
}

/* PERMD_TEST_QUICK=1 (set for the valgrind pass) shrinks exhaustive loops to a smoke size. */
static inline int test_quick(void)
{
    const char *q = getenv("PERMD_TEST_QUICK");
    return q && *q && *q != '0';
}

#ifdef CLOCK_MONOTONIC /* the includer defined _POSIX_C_SOURCE or _GNU_SOURCE first */
/* Seconds on the monotonic clock, for tests that bound how long something took (never to time speed). */
static inline double test_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
#endif

#endif
