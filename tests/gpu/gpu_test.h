/* Shared start of the GPU tests: open GPU 0, or say why not in ctest's terms (77: skipped). */
#ifndef PERMD_GPU_TEST_H
#define PERMD_GPU_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "gpu/permd_gpu.h"

/* 0 with *gpu open; otherwise the exit status main should return. Without a GPU, a skip, unless
 * PERMD_REQUIRE_GPU is set (tests/gpu/run.sh sets it: on a GPU host, seeing none is a failure). */
static inline int gpu_test_open(pd_gpu **gpu)
{
    int count = 0;
    char why[256] = "";
    pd_gpu_devices(&count, why, sizeof why);
    if (count == 0) {
        const char *require = getenv("PERMD_REQUIRE_GPU");
        const int required = require && *require && strcmp(require, "0");
        printf("%s: no GPU (%s)%s\n", required ? "failed" : "skipped", why,
               required ? ", and PERMD_REQUIRE_GPU is set" : "");
        return required ? 1 : 77;
    }
    if (pd_gpu_open(0, gpu) != PD_OK) {
        printf("could not open GPU 0\n");
        return 1;
    }
    printf("GPU: %s\n", pd_gpu_describe(*gpu));
    return 0;
}

#endif
