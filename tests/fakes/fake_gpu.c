/* A stand-in for libpermd_gpu.so whose first generation stalls and then fails (the request then runs on the CPU,
 * late): lets CI hold one of a stream's batch jobs while later ones finish, without a GPU. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "gpu/permd_gpu.h"

struct pd_gpu {
    int unused;
};

static pd_gpu the_gpu;
static atomic_int calls;

int pd_gpu_device_count(int *count)
{
    *count = 1;
    return PD_OK;
}

int pd_gpu_open(int device, pd_gpu **out)
{
    (void)device;
    *out = &the_gpu;
    return PD_OK;
}

void pd_gpu_close(pd_gpu *g)
{
    (void)g;
}

const char *pd_gpu_describe(const pd_gpu *g)
{
    (void)g;
    return "fake GPU (tests/fakes/fake_gpu.c): its first request stalls, then every request fails over to the CPU";
}

/* The first call sleeps PERMD_FAKE_GPU_STALL_MS (default 2000) before failing; later ones fail at once. Each fails
 * with PD_EIO (as a CUDA error would), or PD_ENOMEM while PERMD_FAKE_GPU_ERR is "enomem". */
int pd_gpu_slice_fill_host(pd_gpu *g, const pd_perm *p, const pd_slice *s, uint64_t count, void *host_out,
                           unsigned width, uint64_t *written)
{
    (void)g, (void)p, (void)s, (void)count, (void)host_out, (void)width, (void)written;
    if (atomic_fetch_add(&calls, 1) == 0) {
        const char *env = getenv("PERMD_FAKE_GPU_STALL_MS");
        const long ms = env ? atol(env) : 2000;
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    const char *err = getenv("PERMD_FAKE_GPU_ERR");
    return err && !strcmp(err, "enomem") ? PD_ENOMEM : PD_EIO;
}
