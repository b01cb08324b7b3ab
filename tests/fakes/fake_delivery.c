/* A stand-in for libpermd_delivery.so (gpu/permd_delivery.h) whose trainers never post their receives: groups
 * form at once (but groups of FAKE_NEVER_FORMS members, which time out forming) and every send waits until it
 * is cancelled or times out. Lets CI test delivery groups' limits without a GPU or NCCL. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "gpu/permd_delivery.h"

#define FAKE_NEVER_FORMS 7 /* a group of this many members never forms */

struct pd_delivery {
    int unused;
};

/* Like NCCL, it would read NCCL_NVLS_ENABLE now: permd must have set it to 0, whatever its environment said. */
int pd_delivery_probe(int device, char *why, size_t whylen)
{
    (void)device;
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    if (!nvls || strcmp(nvls, "0")) {
        snprintf(why, whylen, "NCCL_NVLS_ENABLE is %s, not 0", nvls ? nvls : "unset");
        return PD_EUNSUPPORTED;
    }
    return PD_OK;
}

int pd_delivery_unique_id(uint8_t id[PD_NCCL_ID_BYTES])
{
    memset(id, 0x5a, PD_NCCL_ID_BYTES);
    return PD_OK;
}

int pd_delivery_open(int device, const uint8_t id[PD_NCCL_ID_BYTES], int nranks, uint32_t timeout_ms,
                     const int *cancel, pd_delivery **out)
{
    (void)device;
    (void)id;
    (void)cancel;
    *out = NULL;
    if (nranks == FAKE_NEVER_FORMS + 1) { /* permd and its members: some never join */
        const struct timespec ms = {0, 1000000};
        for (uint32_t waited = 0; waited < timeout_ms; waited++)
            nanosleep(&ms, NULL);
        return PD_ETIMEDOUT;
    }
    *out = calloc(1, sizeof **out);
    return *out ? PD_OK : PD_ENOMEM;
}

int pd_delivery_send_jobs(pd_delivery *d, const pd_delivery_job *jobs, unsigned n, uint32_t timeout_ms,
                          const int *cancel)
{
    (void)d;
    (void)jobs;
    (void)n;
    const struct timespec tick = {0, 1000000};
    for (uint32_t waited = 0; waited < timeout_ms; waited++) {
        if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE))
            return PD_ECLOSED;
        nanosleep(&tick, NULL);
    }
    return PD_ETIMEDOUT;
}

void pd_delivery_close(pd_delivery *d, uint32_t timeout_ms, const int *cancel)
{
    (void)timeout_ms;
    (void)cancel;
    free(d);
}
