/* GPU benchmark: permd's index generation and payload shuffles against thrust::shuffle_copy, a CUB
 * radix-sort shuffle and a plain random gather (the memory bound), in one run on one GPU.
 * Prints markdown tables; bench/gpu_gen.sh adds torch.randperm and writes bench/results/gpu_gen.md. */
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include <cub/device/device_radix_sort.cuh>
#include <thrust/device_ptr.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/random.h>
#include <thrust/shuffle.h>

#include "gpu/permd_gpu.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define PK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, pd_strerror(rc_));                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int reps = 5;
static void *l2_flush; /* written before every timed run so each starts with a cold L2 */
static size_t l2_flush_bytes;

/* Median milliseconds of fn over reps runs after one warm-up, each from a cold L2. */
template <class F>
static double time_ms(F fn)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    fn();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaMemsetAsync(l2_flush, r, l2_flush_bytes));
        CK(cudaEventRecord(a));
        fn();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static double gps(uint64_t n, double ms) { return n / (ms * 1e-3) / 1e9; }

/* Random 32-bit sort keys for the radix-sort shuffle (a splitmix-style hash of the index). */
__global__ void random_keys(uint32_t *keys, uint32_t *vals, uint64_t n, uint64_t seed)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        keys[i] = (uint32_t)(z ^ (z >> 31));
        vals[i] = (uint32_t)i;
    }
}

template <class E>
__global__ void plain_gather(const E *in, const uint32_t *idx, E *out, uint64_t n)
{
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
        out[i] = __ldg(in + idx[i]);
}

static void index_generation(pd_gpu *g, int sms)
{
    printf("\n### Index generation (u32 ids, G indices/s)\n\n");
    printf("| n | permd (default: refill) | permd staged | permd naive | thrust::shuffle_copy | CUB radix-sort shuffle | permd / thrust | permd / CUB | permd / naive |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    const uint64_t ns[] = {(UINT64_C(1) << 29) + 1, UINT64_C(1) << 29};
    for (uint64_t n : ns) {
        pd_perm p;
        PK(pd_perm_init(&p, 42, 7, 0, n));
        uint32_t *out, *keys, *keys2, *vals2;
        CK(cudaMalloc(&out, n * 4));
        double w[4];
        for (int k = PD_GPU_WALK_AUTO; k <= PD_GPU_WALK_STAGED; k++) {
            PK(pd_gpu_set_walk(g, (pd_gpu_walk)k));
            w[k] = time_ms([&] { PK(pd_gpu_perm_fill(g, &p, 0, n, out, 4)); PK(pd_gpu_sync(g)); });
        }
        PK(pd_gpu_set_walk(g, PD_GPU_WALK_AUTO));
        double refill = w[PD_GPU_WALK_AUTO], staged = w[PD_GPU_WALK_STAGED], naive = w[PD_GPU_WALK_NAIVE];
        thrust::device_ptr<uint32_t> o(out);
        double thr = time_ms([&] {
            thrust::shuffle_copy(thrust::counting_iterator<uint32_t>(0), thrust::counting_iterator<uint32_t>((uint32_t)n), o,
                                 thrust::default_random_engine(7));
        });
        CK(cudaMalloc(&keys, n * 4));
        CK(cudaMalloc(&keys2, n * 4));
        CK(cudaMalloc(&vals2, n * 4));
        size_t temp_bytes = 0;
        void *temp = NULL;
        CK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys2, out, vals2, (int64_t)n));
        CK(cudaMalloc(&temp, temp_bytes));
        double sort = time_ms([&] {
            random_keys<<<sms * 8, 256>>>(keys, out, n, 7);
            CK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys2, out, vals2, (int64_t)n));
        });
        printf("| %llu | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f× | %.2f× | %.2f× |\n", (unsigned long long)n, gps(n, refill),
               gps(n, staged), gps(n, naive), gps(n, thr), gps(n, sort), thr / refill, sort / refill, naive / refill);
        fflush(stdout);
        CK(cudaFree(temp));
        CK(cudaFree(keys));
        CK(cudaFree(keys2));
        CK(cudaFree(vals2));
        CK(cudaFree(out));
    }
}

static void payload_shuffle(pd_gpu *g, int sms, int max_log)
{
    printf("\n### Payload shuffle of u64 elements (G elements/s)\n\n");
    printf("| n | permd gather (σ order; default: staged) | gather, refill | gather, naive | permd fused (Algorithm 1) | thrust::shuffle_copy | random gather (bound) | permd gather / bound | fused / bound | permd / thrust |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    const uint64_t maxn = (UINT64_C(1) << max_log) + 1;
    uint64_t *in, *out;
    uint32_t *idx;
    CK(cudaMalloc(&in, maxn * 8));
    CK(cudaMalloc(&out, maxn * 8));
    CK(cudaMalloc(&idx, maxn * 4));
    CK(cudaMemset(in, 1, maxn * 8));
    for (int lg = 23; lg <= max_log; lg += 2) {
        for (int plus = 1; plus >= 0; plus--) {
            uint64_t n = (UINT64_C(1) << lg) + (uint64_t)plus;
            pd_perm p;
            PK(pd_perm_init(&p, 42, (uint64_t)lg, 0, n));
            double gw[4];
            for (int w = PD_GPU_WALK_AUTO; w <= PD_GPU_WALK_REFILL; w++) {
                PK(pd_gpu_set_walk(g, (pd_gpu_walk)w));
                gw[w] = time_ms([&] { PK(pd_gpu_gather(g, &p, in, out, 8)); PK(pd_gpu_sync(g)); });
            }
            PK(pd_gpu_set_walk(g, PD_GPU_WALK_AUTO));
            double gat = gw[PD_GPU_WALK_AUTO];
            double fus = time_ms([&] { PK(pd_gpu_shuffle_fused(g, &p, in, out, 8)); PK(pd_gpu_sync(g)); });
            thrust::device_ptr<uint64_t> i0(in), o0(out);
            double thr = time_ms([&] { thrust::shuffle_copy(i0, i0 + n, o0, thrust::default_random_engine(7)); });
            PK(pd_gpu_perm_fill(g, &p, 0, n, idx, 4));
            PK(pd_gpu_sync(g));
            double bound = time_ms([&] { plain_gather<<<sms * 16, 256>>>(in, idx, out, n); });
            printf("| 2^%d%s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f× |\n", lg, plus ? "+1" : "",
                   gps(n, gat), gps(n, gw[PD_GPU_WALK_REFILL]), gps(n, gw[PD_GPU_WALK_NAIVE]), gps(n, fus),
                   gps(n, thr), gps(n, bound), bound / gat, bound / fus, thr / gat);
            fflush(stdout);
        }
    }
    CK(cudaFree(in));
    CK(cudaFree(out));
    CK(cudaFree(idx));
}

int main(int argc, char **argv)
{
    int max_log = 29, ids = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            max_log = 25;
            reps = 2;
        } else if (!strcmp(argv[i], "--payload-only")) {
            ids = 0;
        } else if (!strncmp(argv[i], "--max-log=", 10)) {
            max_log = atoi(argv[i] + 10);
        }
    }
    pd_gpu *g;
    if (pd_gpu_open(0, &g) != 0) {
        fprintf(stderr, "gpu_gen: no usable GPU\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    l2_flush_bytes = (size_t)prop.l2CacheSize * 4;
    CK(cudaMalloc(&l2_flush, l2_flush_bytes));
    printf("GPU: %s\n", pd_gpu_describe(g));
    if (ids)
        index_generation(g, prop.multiProcessorCount);
    payload_shuffle(g, prop.multiProcessorCount, max_log);
    pd_gpu_close(g);
    return 0;
}
