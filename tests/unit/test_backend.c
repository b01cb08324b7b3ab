/* Tests for daemon/backend.c: the daemon's generation entry point agrees with σ for every mode, width
 * and CPU ISA; a GPU library that is missing or broken leaves a working CPU backend. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/error.h"
#include "cpu/gen.h"
#include "daemon/backend.h"
#include "proto/frame.h"

/* Reference: rank r's k-th id straight from the spec's definition. */
static uint64_t expected(const pd_perm *p, const pd_slice *s, uint64_t k)
{
    uint64_t pos = s->offset + s->rank + k * s->world;
    return pd_perm_at(p, pos % p->n);
}

static pd_backend *backend;

static void check(uint64_t n, uint32_t world, uint32_t rank, pd_mode mode, uint64_t offset, uint64_t count)
{
    pd_perm p;
    pd_slice s = {world, rank, mode, offset};
    uint64_t left, got;
    assert_int_equal(pd_perm_init(&p, 0x1234, 7, PD_STREAM_SAMPLES, n), 0);
    assert_int_equal(pd_slice_remaining(n, &s, &left), 0);
    uint64_t want = count < left ? count : left;
    unsigned width = pd_id_width(n);
    uint8_t *buf = malloc(count * 8 + 8);
    assert_int_equal(pd_backend_slice(backend, &p, &s, count, width, buf, &got), 0);
    assert_int_equal(got, want);
    for (uint64_t k = 0; k < got; k++) {
        uint64_t v = width == 4 ? pd_load_le32(buf + 4 * k) : pd_load_le64(buf + 8 * k); /* little-endian wire */
        assert_int_equal(v, expected(&p, &s, k));
    }
    /* u64 output always works */
    assert_int_equal(pd_backend_slice(backend, &p, &s, count, 8, buf, &got), 0);
    for (uint64_t k = 0; k < got; k++)
        assert_int_equal(pd_load_le64(buf + 8 * k), expected(&p, &s, k));
    free(buf);
}

/* A sharded plan through the backend (every width) against the core's fills. plan_id 0 stays on the CPU. */
static void check_sharded(uint64_t plan_id, uint64_t epoch, uint64_t window, uint64_t lanes)
{
    uint64_t sizes[6] = {500, 0, 1, 7000, 33, 2048}, start[7], mem[13], want[4096], left, got;
    pd_shard_plan plan;
    pd_shard_loc locs[2048];
    uint8_t buf[2048 * 16];
    assert_int_equal(pd_shard_layout_build(sizes, 6, start), 0);
    assert_int_equal(pd_shard_plan_init(&plan, start, 6, 99, epoch, window, lanes, mem, sizeof mem), 0);
    pd_slice s = {3, 2, PD_MODE_PAD, 3 * 1000};
    assert_int_equal(pd_slice_remaining(plan.n, &s, &left), 0);
    assert_int_equal(pd_shard_slice_fill_u64(&plan, &s, 2048, want, &left), 0);
    assert_int_equal(pd_backend_shard_slice(backend, &plan, plan_id, &s, 2048, 8, buf, &got), 0);
    assert_int_equal(got, left);
    for (uint64_t k = 0; k < got; k++)
        assert_int_equal(pd_load_le64(buf + 8 * k), want[k]);
    assert_int_equal(pd_backend_shard_slice(backend, &plan, plan_id, &s, 2048, 4, buf, &got), 0);
    for (uint64_t k = 0; k < got; k++)
        assert_int_equal(pd_load_le32(buf + 4 * k), want[k]);
    assert_int_equal(pd_shard_slice_fill_locs(&plan, &s, 2048, locs, &left), 0);
    assert_int_equal(pd_backend_shard_slice(backend, &plan, plan_id, &s, 2048, 16, buf, &got), 0);
    assert_int_equal(got, left);
    for (uint64_t k = 0; k < got; k++) {
        assert_int_equal(pd_load_le64(buf + 16 * k), locs[k].shard);
        assert_int_equal(pd_load_le64(buf + 16 * k + 8), locs[k].offset);
    }
    assert_int_equal(pd_backend_shard_slice(backend, &plan, plan_id, &s, 2048, 2, buf, &got), PD_EINVAL);
}

static void test_matches_sigma(void **state)
{
    (void)state;
    check_sharded(0, 1, 2, 3);
    check_sharded(1, 1, 2, 3);
    check(1000, 1, 0, PD_MODE_EXACT, 0, 1000);
    check(1001, 8, 3, PD_MODE_PAD, 0, 200);   /* wraps past n */
    check(1001, 8, 7, PD_MODE_DROP, 16, 200);
    check(1001, 8, 2, PD_MODE_EXACT, 1000, 5); /* at the end: empty */
    check(5, 7, 6, PD_MODE_PAD, 0, 3);         /* W > n */
    check(UINT64_C(1) << 32, 3, 1, PD_MODE_PAD, 99, 50);
    check((UINT64_C(1) << 32) + 1, 3, 1, PD_MODE_PAD, 99, 50); /* first size with 8-byte ids */
    check(UINT64_C(1) << 63, 1000, 999, PD_MODE_EXACT, 12345, 64);
}

static void test_errors(void **state)
{
    (void)state;
    pd_perm p;
    pd_slice s = {4, 1, PD_MODE_PAD, 0};
    uint64_t got;
    uint64_t buf[8];
    assert_int_equal(pd_perm_init(&p, 1, 2, PD_STREAM_SAMPLES, (UINT64_C(1) << 32) + 1), 0);
    assert_int_equal(pd_backend_slice(backend, &p, &s, 4, 4, buf, &got), PD_EOVERFLOW);
    assert_int_equal(pd_backend_slice(backend, &p, &s, 4, 2, buf, &got), PD_EINVAL);
    s.rank = 4;
    assert_int_equal(pd_backend_slice(backend, &p, &s, 4, 8, buf, &got), PD_EINVAL);
    assert_int_equal(pd_backend_slice(NULL, &p, &s, 4, 8, buf, &got), PD_EINVAL);
}

static void test_bad_options(void **state)
{
    (void)state;
    pd_backend *b = NULL;
    pd_backend_opts o = {.cpu_isa = "sse9", .gpu = "off"};
    assert_int_equal(pd_backend_open(&o, &b), PD_EINVAL);
    o.cpu_isa = "auto";
    o.gpu = "maybe";
    assert_int_equal(pd_backend_open(&o, &b), PD_EINVAL);
    assert_int_equal(pd_backend_open(NULL, &b), PD_EINVAL);
    assert_null(b);
    if (!pd_cpu_has_isa(PD_ISA_AVX512)) {
        o.cpu_isa = "avx512";
        o.gpu = "off";
        assert_int_equal(pd_backend_open(&o, &b), PD_EUNSUPPORTED);
    }
}

/* A GPU library that is not there is no error: the CPU serves, and says so. */
static void test_missing_gpu_library_falls_back(void **state)
{
    (void)state;
    pd_backend *b = NULL;
    pd_backend_opts o = {.cpu_isa = "auto", .gpu = "auto", .gpu_min_ids = 1, .gpu_library = "/nonexistent/libpermd_gpu.so"};
    assert_int_equal(pd_backend_open(&o, &b), PD_OK);
    assert_non_null(strstr(pd_backend_describe(b), "gpu=none"));
    pd_perm p;
    pd_slice s = {2, 1, PD_MODE_EXACT, 0};
    uint64_t buf[64], got, cpu, gpu;
    assert_int_equal(pd_perm_init(&p, 3, 4, PD_STREAM_SAMPLES, 100), 0);
    assert_int_equal(pd_backend_slice(b, &p, &s, 64, 8, buf, &got), PD_OK);
    pd_backend_counts(b, &cpu, &gpu);
    assert_int_equal(cpu, got);
    assert_int_equal(gpu, 0);
    pd_backend_close(b);
}

/* Where a GPU is present (the device machine), large requests take it and give the same bytes. */
static void test_gpu_when_present(void **state)
{
    (void)state;
    pd_backend *b = NULL;
    pd_backend_opts o = {.cpu_isa = "auto", .gpu = "auto", .gpu_min_ids = 1};
    assert_int_equal(pd_backend_open(&o, &b), PD_OK);
    if (strstr(pd_backend_describe(b), "gpu=none")) {
        const char *require = getenv("PERMD_REQUIRE_GPU"); /* tests/gpu/run.sh: on a GPU host none is a failure */
        if (require && *require && strcmp(require, "0"))
            fail_msg("PERMD_REQUIRE_GPU is set, but the backend has no GPU: %s", pd_backend_describe(b));
        pd_backend_close(b);
        skip(); /* no GPU here: the fallback test above covers this machine */
    }
    backend = b;
    check(1001, 8, 3, PD_MODE_PAD, 0, 200);
    check((UINT64_C(1) << 32) + 1, 3, 1, PD_MODE_PAD, 99, 5000);
    uint64_t cpu, gpu, gpu_flat;
    pd_backend_counts(b, &cpu, &gpu_flat);
    assert_true(gpu_flat > 0);
    /* sharded: more plans than the device cache holds, then the first ones again (evicted, re-uploaded) */
    for (uint64_t id = 1; id <= 6; id++)
        check_sharded(id, id, 1 + id % 3, 1 + id % 4);
    for (uint64_t id = 1; id <= 2; id++)
        check_sharded(id, id, 1 + id % 3, 1 + id % 4);
    pd_backend_counts(b, &cpu, &gpu);
    assert_true(gpu > gpu_flat);
    uint64_t fallbacks; /* every request above took the GPU: a failure would have been served by the CPU, unseen */
    int off;
    pd_backend_gpu_health(b, &fallbacks, &off);
    assert_int_equal(fallbacks, 0);
    assert_int_equal(off, 0);
    pd_backend_close(b);
    backend = NULL;
}

/* A GPU that fails hands its requests to the CPU, which gives the right ids. Out of device memory may pass (another
 * process's allocation), so the GPU is tried again; any other failure is a CUDA error, sticky (the context is lost):
 * the GPU is turned off, where every request used to try it, fail and log a warning. Both counted for metrics. */
static void test_failing_gpu(void **state)
{
    (void)state;
    pd_backend *b = NULL;
    pd_backend_opts o = {.cpu_isa = "auto", .gpu = "auto", .gpu_min_ids = 1, .gpu_library = PERMD_FAKE_GPU};
    setenv("PERMD_FAKE_GPU_STALL_MS", "0", 1);
    setenv("PERMD_FAKE_GPU_ERR", "enomem", 1);
    assert_int_equal(pd_backend_open(&o, &b), PD_OK);
    assert_null(strstr(pd_backend_describe(b), "gpu=none"));
    backend = b;
    uint64_t fallbacks, cpu, gpu;
    int off;
    check(1001, 8, 3, PD_MODE_PAD, 0, 200); /* two requests, each tried on the GPU */
    pd_backend_gpu_health(b, &fallbacks, &off);
    assert_int_equal(fallbacks, 2);
    assert_int_equal(off, 0);
    setenv("PERMD_FAKE_GPU_ERR", "cuda", 1);
    check(1001, 8, 3, PD_MODE_PAD, 0, 200); /* the first fails as a CUDA error would: the second stays on the CPU */
    pd_backend_gpu_health(b, &fallbacks, &off);
    assert_int_equal(fallbacks, 3);
    assert_int_equal(off, 1);
    check(1001, 8, 3, PD_MODE_PAD, 0, 200);
    pd_backend_gpu_health(b, &fallbacks, &off);
    assert_int_equal(fallbacks, 3);
    pd_backend_counts(b, &cpu, &gpu);
    assert_int_equal(cpu, 6 * 126); /* six requests of rank 3's 126 ids (1001 over 8, padded) */
    assert_int_equal(gpu, 0);
    unsetenv("PERMD_FAKE_GPU_STALL_MS");
    unsetenv("PERMD_FAKE_GPU_ERR");
    pd_backend_close(b);
    backend = NULL;
}

/* The whole check on every CPU ISA this machine runs. */
static void test_every_isa(void **state)
{
    (void)state;
    static const char *const isas[] = {"scalar", "avx2", "avx512", "auto"};
    static const pd_isa ids[] = {PD_ISA_SCALAR, PD_ISA_AVX2, PD_ISA_AVX512, PD_ISA_AUTO};
    for (size_t i = 0; i < 4; i++) {
        if (!pd_cpu_has_isa(ids[i]))
            continue;
        pd_backend_opts o = {.cpu_isa = isas[i], .gpu = "off", .cpu_threads = 2};
        assert_int_equal(pd_backend_open(&o, &backend), PD_OK);
        test_matches_sigma(state);
        test_errors(state);
        pd_backend_close(backend);
        backend = NULL;
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_isa),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_missing_gpu_library_falls_back),
        cmocka_unit_test(test_gpu_when_present),
        cmocka_unit_test(test_failing_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
