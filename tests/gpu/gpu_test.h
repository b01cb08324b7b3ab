/* Shared start of the GPU tests: open GPU 0, or say why not in ctest's terms (77: skipped). */
#ifndef PERMD_GPU_TEST_H
#define PERMD_GPU_TEST_H

#include <stdio.h>

#include "core/error.h"
#include "gpu/permd_gpu.h"

/* 0 with *gpu open; otherwise the exit status main should return. */
static inline int gpu_test_open(pd_gpu **gpu)
{
    int count = 0;
    pd_gpu_device_count(&count);
    if (count == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    if (pd_gpu_open(0, gpu) != PD_OK) {
        printf("could not open GPU 0\n");
        return 1;
    }
    printf("GPU: %s\n", pd_gpu_describe(*gpu));
    return 0;
}

#endif
