/* The daemon's generation backends: SIMD on the CPU through a thread pool, and a GPU loaded with dlopen. */
#include "daemon/backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "cpu/gen.h"
#include "cpu/mix.h"
#include "daemon/log.h"
#include "gpu/permd_gpu.h"

/* The GPU library's entry points. It is loaded at run time so that permd
 * starts on machines without CUDA; the library links the CUDA runtime
 * statically and needs only the driver. */
typedef struct pd_gpu_api {
    void *dl;
    int (*device_count)(int *);
    int (*devices)(int *, char *, size_t); /* with the reason for none (a library older than it lacks it) */
    int (*open)(int, pd_gpu **);
    void (*close)(pd_gpu *);
    const char *(*describe)(const pd_gpu *);
    int (*slice_fill_host)(pd_gpu *, const pd_perm *, const pd_slice *, uint64_t, void *, unsigned, uint64_t *);
    /* sharded epochs; absent in an older library: sharded requests stay on the CPU */
    int (*plan_upload)(pd_gpu *, const pd_shard_plan *, pd_gpu_plan **);
    void (*plan_free)(pd_gpu *, pd_gpu_plan *);
    int (*shard_fill_host)(pd_gpu *, const pd_gpu_plan *, const pd_slice *, uint64_t, void *, unsigned, uint64_t *);
} pd_gpu_api;

/* Device copies of the plans used most recently (each 24 bytes per shard). */
#define PD_GPU_PLANS 4
typedef struct pd_gpu_plan_slot {
    uint64_t id; /* pd_plan_id; 0: empty */
    uint64_t used;
    pd_gpu_plan *plan;
} pd_gpu_plan_slot;

struct pd_backend {
    pd_pool *pool;
    pd_gen gen;
    pd_gpu_api api;
    pd_gpu *gpu;                /* NULL: CPU only */
    pthread_mutex_t gpu_lock;   /* a pd_gpu serves one request at a time; guards plans too */
    pd_gpu_plan_slot plans[PD_GPU_PLANS];
    uint64_t plan_clock;
    uint64_t gpu_min_ids;
    _Atomic uint64_t cpu_ids, gpu_ids;
    _Atomic uint64_t gpu_fallbacks; /* requests the GPU failed, served by the CPU */
    atomic_int gpu_off;             /* a CUDA error: no request tries the GPU again */
    char desc[512];
};

/* libpermd_gpu.so: the configured path, else beside the executable (../lib), else the loader's path. */
static void *pd_gpu_dlopen(const char *configured, char *why, size_t whylen)
{
    if (configured && *configured) {
        void *dl = dlopen(configured, RTLD_NOW | RTLD_LOCAL);
        if (!dl)
            snprintf(why, whylen, "%s", dlerror());
        return dl;
    }
    char exe[PATH_MAX], path[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, sizeof path, "%s/../lib/libpermd_gpu.so", exe);
            if (access(path, F_OK) == 0) { /* there but unloadable: that is the reason to report */
                void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
                if (!dl)
                    snprintf(why, whylen, "%s", dlerror());
                return dl;
            }
        }
    }
    void *dl = dlopen("libpermd_gpu.so", RTLD_NOW | RTLD_LOCAL);
    if (!dl)
        snprintf(why, whylen, "%s", dlerror());
    return dl;
}

static int pd_gpu_try(pd_backend *b, const pd_backend_opts *o, char *why, size_t whylen)
{
    pd_gpu_api *a = &b->api;
    int count = 0;
    if (!(a->dl = pd_gpu_dlopen(o->gpu_library, why, whylen)))
        return PD_EUNSUPPORTED;
    *(void **)&a->device_count = dlsym(a->dl, "pd_gpu_device_count");
    *(void **)&a->devices = dlsym(a->dl, "pd_gpu_devices");
    *(void **)&a->open = dlsym(a->dl, "pd_gpu_open");
    *(void **)&a->close = dlsym(a->dl, "pd_gpu_close");
    *(void **)&a->describe = dlsym(a->dl, "pd_gpu_describe");
    *(void **)&a->slice_fill_host = dlsym(a->dl, "pd_gpu_slice_fill_host");
    *(void **)&a->plan_upload = dlsym(a->dl, "pd_gpu_plan_upload");
    *(void **)&a->plan_free = dlsym(a->dl, "pd_gpu_plan_free");
    *(void **)&a->shard_fill_host = dlsym(a->dl, "pd_gpu_shard_slice_fill_host");
    if (!a->plan_upload || !a->plan_free || !a->shard_fill_host)
        a->plan_upload = NULL;
    if (!a->device_count || !a->open || !a->close || !a->describe || !a->slice_fill_host) {
        snprintf(why, whylen, "libpermd_gpu.so lacks the expected symbols");
        return PD_EUNSUPPORTED;
    }
    char none[256] = "";
    if (a->devices)
        a->devices(&count, none, sizeof none);
    else
        a->device_count(&count);
    if (count == 0) {
        snprintf(why, whylen, "no CUDA device (or no driver)%s%s", none[0] ? ": " : "", none);
        return PD_EUNSUPPORTED;
    }
    int rc = a->open((int)o->gpu_device, &b->gpu);
    if (rc) {
        snprintf(why, whylen, "device %u of %d: %s", o->gpu_device, count, pd_strerror(rc));
        return rc;
    }
    return PD_OK;
}

int pd_backend_open(const pd_backend_opts *o, pd_backend **out)
{
    pd_isa isa;
    int rc;
    if (!o || !out || pd_isa_parse(o->cpu_isa ? o->cpu_isa : "auto", &isa))
        return PD_EINVAL;
    const char *gpu = o->gpu ? o->gpu : "auto";
    if (strcmp(gpu, "auto") && strcmp(gpu, "off"))
        return PD_EINVAL;
    pd_backend *b = calloc(1, sizeof *b);
    if (!b)
        return PD_ENOMEM;
    pthread_mutex_init(&b->gpu_lock, NULL);
    b->gpu_min_ids = o->gpu_min_ids;
    if ((rc = pd_gen_init(&b->gen, isa)) || (rc = pd_pool_create(o->cpu_threads, &b->gen, &b->pool)) ||
        (rc = pd_pool_set_spin(b->pool, o->cpu_spin_ns)))
        goto fail;
    if (!strcmp(gpu, "auto")) {
        char why[256] = "";
        if (pd_gpu_try(b, o, why, sizeof why)) {
            pd_log_info("gpu", "state=unavailable reason=\"%s\" msg=\"serving from the CPU\"", why);
            if (b->api.dl)
                dlclose(b->api.dl);
            memset(&b->api, 0, sizeof b->api);
            b->gpu = NULL;
        }
    }
    const unsigned long long spin_us = (unsigned long long)(o->cpu_spin_ns / 1000);
    if (b->gpu)
        snprintf(b->desc, sizeof b->desc, "cpu=%s threads=%u spin_us=%llu gpu=\"%s\" gpu_min_ids=%llu",
                 pd_isa_name(b->gen.isa), pd_pool_threads(b->pool), spin_us, b->api.describe(b->gpu),
                 (unsigned long long)b->gpu_min_ids);
    else
        snprintf(b->desc, sizeof b->desc, "cpu=%s threads=%u spin_us=%llu gpu=none", pd_isa_name(b->gen.isa),
                 pd_pool_threads(b->pool), spin_us);
    *out = b;
    return PD_OK;
fail:
    pd_backend_close(b);
    return rc;
}

void pd_backend_close(pd_backend *b)
{
    if (!b)
        return;
    for (int i = 0; i < PD_GPU_PLANS; i++)
        if (b->plans[i].plan)
            b->api.plan_free(b->gpu, b->plans[i].plan);
    if (b->gpu)
        b->api.close(b->gpu);
    if (b->api.dl)
        dlclose(b->api.dl);
    pd_pool_destroy(b->pool);
    pthread_mutex_destroy(&b->gpu_lock);
    free(b);
}

const pd_gen *pd_backend_gen(const pd_backend *b)
{
    return b ? &b->gen : NULL;
}

const char *pd_backend_describe(const pd_backend *b)
{
    return b ? b->desc : "";
}

void pd_backend_counts(const pd_backend *b, uint64_t *cpu_ids, uint64_t *gpu_ids)
{
    *cpu_ids = atomic_load(&b->cpu_ids);
    *gpu_ids = atomic_load(&b->gpu_ids);
}

void pd_backend_gpu_health(const pd_backend *b, uint64_t *fallbacks, int *off)
{
    *fallbacks = atomic_load(&b->gpu_fallbacks);
    *off = atomic_load(&b->gpu_off);
}

void pd_backend_pool_counts(const pd_backend *b, uint64_t *caught, uint64_t *slept)
{
    pd_pool_counts(b->pool, caught, slept);
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
/* The wire is little-endian; big-endian hosts swap in place after filling. */
static void pd_to_le(void *out, uint64_t n, unsigned width)
{
    if (width == 4)
        for (uint64_t i = 0; i < n; i++)
            ((uint32_t *)out)[i] = __builtin_bswap32(((uint32_t *)out)[i]);
    else
        for (uint64_t i = 0; i < n; i++)
            ((uint64_t *)out)[i] = __builtin_bswap64(((uint64_t *)out)[i]);
}
#else
static void pd_to_le(void *out, uint64_t n, unsigned width)
{
    (void)out;
    (void)n;
    (void)width;
}
#endif

/* Whether a request may try the GPU: there is one, it has not failed for good, and the request is large. */
static int pd_gpu_usable(const pd_backend *b, uint64_t count)
{
    return b->gpu && count >= b->gpu_min_ids && !atomic_load(&b->gpu_off);
}

/* A GPU generation's result: an argument error is the caller's, as on the CPU; anything else sends the request to
 * the CPU (PD_EBUSY). Out of device memory may pass (another process's allocation): said at the 1st, 10th, 100th...
 * time. Any other failure is a CUDA error, and many are sticky (the context is lost: every later request would
 * try, fail and log), so any turns the GPU off until permd restarts, said once. */
static int pd_gpu_result(pd_backend *b, int rc, const char *what)
{
    if (rc == 0 || rc == PD_EINVAL || rc == PD_ERANGE || rc == PD_EOVERFLOW)
        return rc;
    const uint64_t n = atomic_fetch_add(&b->gpu_fallbacks, 1) + 1;
    if (rc != PD_ENOMEM) {
        if (!atomic_exchange(&b->gpu_off, 1))
            pd_log_error("gpu", "err=%s request=%s msg=\"the GPU failed: it is off until permd restarts, and every "
                         "request is served by the CPU\"", pd_errname(rc), what);
    } else {
        uint64_t p = 1;
        while (p < n && p <= UINT64_MAX / 10)
            p *= 10;
        if (p == n)
            pd_log_warn("gpu", "err=%s request=%s fallbacks=%llu msg=\"served by the CPU instead\"", pd_errname(rc),
                        what, (unsigned long long)n);
    }
    return PD_EBUSY;
}

/* Large requests try the GPU; one that is busy with another request leaves
 * this one to the CPU rather than queueing behind it. */
static int pd_gpu_slice(pd_backend *b, const pd_perm *perm, const pd_slice *slice, uint64_t count, unsigned width,
                        void *out, uint64_t *written)
{
    if (!pd_gpu_usable(b, count) || pthread_mutex_trylock(&b->gpu_lock))
        return PD_EBUSY;
    int rc = b->api.slice_fill_host(b->gpu, perm, slice, count, out, width, written);
    pthread_mutex_unlock(&b->gpu_lock);
    return pd_gpu_result(b, rc, "flat");
}

static void pd_store_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

/* The device copy of plan plan_id, uploaded into the least recently used slot if missing. Under gpu_lock. */
static int pd_gpu_plan_get(pd_backend *b, const pd_shard_plan *plan, uint64_t plan_id, pd_gpu_plan **out)
{
    pd_gpu_plan_slot *victim = &b->plans[0];
    for (int i = 0; i < PD_GPU_PLANS; i++) {
        pd_gpu_plan_slot *slot = &b->plans[i];
        if (slot->id == plan_id) {
            slot->used = ++b->plan_clock;
            *out = slot->plan;
            return PD_OK;
        }
        if (slot->used < victim->used)
            victim = slot;
    }
    if (victim->plan)
        b->api.plan_free(b->gpu, victim->plan);
    victim->id = 0;
    victim->plan = NULL;
    int rc = b->api.plan_upload(b->gpu, plan, &victim->plan);
    if (rc)
        return rc;
    victim->id = plan_id;
    victim->used = ++b->plan_clock;
    *out = victim->plan;
    return PD_OK;
}

/* Large sharded requests try the GPU, as pd_gpu_slice does for flat ones. */
static int pd_gpu_shard_slice(pd_backend *b, const pd_shard_plan *plan, uint64_t plan_id, const pd_slice *slice,
                              uint64_t count, unsigned width, void *out, uint64_t *written)
{
    pd_gpu_plan *dp;
    if (!pd_gpu_usable(b, count) || !b->api.plan_upload || plan_id == 0 || pthread_mutex_trylock(&b->gpu_lock))
        return PD_EBUSY;
    int rc = pd_gpu_plan_get(b, plan, plan_id, &dp);
    if (rc == 0)
        rc = b->api.shard_fill_host(b->gpu, dp, slice, count, out, width, written);
    pthread_mutex_unlock(&b->gpu_lock);
    return pd_gpu_result(b, rc, "sharded");
}

/* Locations on the CPU, through a small buffer: pd_shard_loc is wider than the wire's (shard, offset) pair. */
static int pd_cpu_shard_locs(const pd_shard_plan *plan, const pd_slice *slice, uint64_t count, uint8_t *out,
                             uint64_t *written)
{
    pd_shard_loc locs[512];
    pd_slice cur = *slice;
    uint64_t left, got;
    int rc = pd_slice_remaining(plan->n, slice, &left);
    if (rc)
        return rc;
    if (count > left)
        count = left;
    for (uint64_t done = 0; done < count; done += got) {
        uint64_t want = count - done < 512 ? count - done : 512;
        if ((rc = pd_shard_slice_fill_locs(plan, &cur, want, locs, &got)))
            return rc;
        for (uint64_t i = 0; i < got; i++) {
            pd_store_le64(out + 16 * (done + i), locs[i].shard);
            pd_store_le64(out + 16 * (done + i) + 8, locs[i].offset);
        }
        cur.offset += got * cur.world; /* more follow, so this stays ≤ T */
    }
    *written = count;
    return 0;
}

int pd_backend_shard_slice(pd_backend *b, const pd_shard_plan *plan, uint64_t plan_id, const pd_slice *slice,
                           uint64_t count, unsigned width, void *out, uint64_t *written)
{
    if (!b || !plan || (width != 4 && width != 8 && width != 16))
        return PD_EINVAL;
    int rc = pd_gpu_shard_slice(b, plan, plan_id, slice, count, width, out, written);
    if (rc == 0) {
        atomic_fetch_add(&b->gpu_ids, *written);
        if (width == 16)
            pd_to_le(out, *written * 2, 8); /* a location is two u64 */
        else
            pd_to_le(out, *written, width);
        return 0;
    }
    if (rc != PD_EBUSY)
        return rc;
    if (width == 16) /* already little-endian */
        rc = pd_cpu_shard_locs(plan, slice, count, out, written);
    else if ((rc = width == 4 ? pd_pool_shard_slice_fill_u32(b->pool, plan, slice, count, out, written)
                              : pd_pool_shard_slice_fill_u64(b->pool, plan, slice, count, out, written)) == 0)
        pd_to_le(out, *written, width);
    if (rc == 0)
        atomic_fetch_add(&b->cpu_ids, *written);
    return rc;
}

int pd_backend_mix_slice(pd_backend *b, pd_mix_cursor *cur, uint64_t epoch, const pd_slice *slice, uint64_t count,
                         unsigned width, void *out, uint64_t *written)
{
    if (!b || !cur || (width != 4 && width != 8 && width != 16))
        return PD_EINVAL;
    int rc;
    if (width != 16) {
        rc = width == 4 ? pd_pool_mix_fill_u32(b->pool, cur, epoch, slice, count, out, written)
                        : pd_pool_mix_fill_u64(b->pool, cur, epoch, slice, count, out, written);
        if (rc == 0)
            pd_to_le(out, *written, width);
    } else { /* (component, local id), through a small buffer as for shards */
        pd_mix_loc locs[512];
        pd_slice at = *slice;
        uint64_t left, got = 0, done = 0;
        rc = pd_slice_remaining(cur->mix->length, slice, &left);
        if (count > left)
            count = left;
        for (; rc == 0 && done < count; done += got) {
            uint64_t want = count - done < 512 ? count - done : 512;
            if ((rc = pd_mix_slice_fill_locs(cur, epoch, &at, want, locs, &got)))
                break;
            for (uint64_t i = 0; i < got; i++) {
                pd_store_le64((uint8_t *)out + 16 * (done + i), locs[i].component);
                pd_store_le64((uint8_t *)out + 16 * (done + i) + 8, locs[i].local);
            }
            at.offset += got * at.world; /* more follow, so this stays ≤ T */
        }
        if (rc == 0)
            *written = count;
    }
    if (rc == 0)
        atomic_fetch_add(&b->cpu_ids, *written);
    return rc;
}

int pd_backend_slice(pd_backend *b, const pd_perm *perm, const pd_slice *slice, uint64_t count, unsigned width,
                     void *out, uint64_t *written)
{
    if (!b || (width != 4 && width != 8))
        return PD_EINVAL;
    int rc = pd_gpu_slice(b, perm, slice, count, width, out, written);
    if (rc == PD_EBUSY) {
        rc = width == 4 ? pd_pool_slice_fill_u32(b->pool, perm, slice, count, out, written)
                        : pd_pool_slice_fill_u64(b->pool, perm, slice, count, out, written);
        if (rc == 0)
            atomic_fetch_add(&b->cpu_ids, *written);
    } else if (rc == 0) {
        atomic_fetch_add(&b->gpu_ids, *written);
    }
    if (rc == 0)
        pd_to_le(out, *written, width);
    return rc;
}
