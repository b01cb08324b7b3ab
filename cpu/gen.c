/* CPU feature probe, generator set-up, argument checks and dispatch of bulk σ to the per-ISA kernels. */
#include "cpu/kernel.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(PD_CPU_HAVE_AVX2) || defined(PD_CPU_HAVE_AVX512))
#include <cpuid.h>
#define PD_CPU_PROBE_X86 1
#endif

static const char *const pd_isa_names[] = {"auto", "scalar", "avx2", "avx512"};
static const char *const pd_walk_names[] = {"auto", "lockstep", "refill", "refill-scalar", "compact"};

/* ---- Instruction sets */

#define PD_ISA_BIT(isa) (1u << (isa))
#define PD_CPU_VBMI (1u << 8) /* in the same set: AVX-512 VBMI (and BW) too, for the byte-lane kernels */
#define PD_CPU_BW (1u << 9)   /* AVX-512BW, for the word-lane batch kernel */

#ifdef PD_CPU_PROBE_X86
/* XCR0 says which register files the OS saves on a context switch; a CPU
 * that has AVX-512 is no use if the kernel would lose the upper halves. */
static uint64_t pd_xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* The set of ISAs whose kernel this build has and this CPU and OS can run. */
static unsigned pd_cpu_probe(void)
{
    unsigned a, b, c, d, set = PD_ISA_BIT(PD_ISA_SCALAR);
#ifdef PD_CPU_AVX512_EMULATED /* a test build: the AVX-512 kernel runs on SIMDe's portable intrinsics */
    set |= PD_ISA_BIT(PD_ISA_AVX512) | PD_CPU_VBMI | PD_CPU_BW;
#endif
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return set;
    const unsigned osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, popcnt = (c >> 23) & 1;
    if (!osxsave || !avx || !popcnt)
        return set;
    const uint64_t xcr0 = pd_xgetbv0();
    if ((xcr0 & 0x6) != 0x6) /* SSE and AVX state */
        return set;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return set;
#ifdef PD_CPU_HAVE_AVX2
    if ((b >> 5) & 1)
        set |= PD_ISA_BIT(PD_ISA_AVX2);
#endif
#ifdef PD_CPU_HAVE_AVX512
    /* AVX-512F and BW (pd_mul_lo's vpmullw; every AVX-512 CPU but the Xeon Phi); opmask, ZMM upper halves,
     * ZMM16-31 */
    if (((b >> 16) & 1) && ((b >> 30) & 1) && (xcr0 & 0xE6) == 0xE6) {
        set |= PD_ISA_BIT(PD_ISA_AVX512) | PD_CPU_BW;
#ifdef PD_CPU_HAVE_VBMI
        if (((b >> 30) & 1) && ((c >> 1) & 1)) /* AVX-512BW, AVX-512 VBMI */
            set |= PD_CPU_VBMI;
#endif
    }
#endif
    return set;
}
#else
static unsigned pd_cpu_probe(void)
{
    return PD_ISA_BIT(PD_ISA_SCALAR);
}
#endif

static unsigned pd_cpu_isas(void)
{
    /* The probe is pure, so racing threads store the same value. */
    static atomic_uint cached; /* 0: not probed yet (the set always holds scalar) */
    unsigned set = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!set) {
        set = pd_cpu_probe();
        atomic_store_explicit(&cached, set, memory_order_relaxed);
    }
    return set;
}

pd_isa pd_cpu_best_isa(void)
{
    const unsigned set = pd_cpu_isas();
    pd_isa best = PD_ISA_SCALAR;
    for (int i = PD_ISA_SCALAR; i <= PD_ISA_AVX512; i++)
        if (set & PD_ISA_BIT(i))
            best = (pd_isa)i;
    return best;
}

int pd_cpu_has_isa(pd_isa isa)
{
    if (isa == PD_ISA_AUTO)
        return 1;
    return (unsigned)isa <= PD_ISA_AVX512 && (pd_cpu_isas() & PD_ISA_BIT(isa)) != 0;
}

const char *pd_isa_name(pd_isa isa)
{
    return (unsigned)isa <= PD_ISA_AVX512 ? pd_isa_names[isa] : "?";
}

int pd_isa_parse(const char *s, pd_isa *isa)
{
    if (!s || !isa)
        return PD_EINVAL;
    for (int i = PD_ISA_AUTO; i <= PD_ISA_AVX512; i++) {
        if (strcmp(s, pd_isa_names[i]) == 0) {
            *isa = (pd_isa)i;
            return PD_OK;
        }
    }
    return PD_EINVAL;
}

const char *pd_walk_name(pd_walk walk)
{
    return (unsigned)walk <= PD_WALK_COMPACT ? pd_walk_names[walk] : "?";
}

/* ---- Generators */

int pd_gen_init(pd_gen *g, pd_isa isa)
{
    if (!g || (unsigned)isa > PD_ISA_AVX512)
        return PD_EINVAL;
    if (!pd_cpu_has_isa(isa))
        return PD_EUNSUPPORTED;
    g->isa = isa == PD_ISA_AUTO ? pd_cpu_best_isa() : isa;
    g->walk = PD_WALK_AUTO;
    g->vbmi = g->isa == PD_ISA_AVX512 && (pd_cpu_isas() & PD_CPU_VBMI);
    g->bw = g->isa == PD_ISA_AVX512 && (pd_cpu_isas() & PD_CPU_BW);
    /* an emulated AVX-512 (a test build) may run where AVX2 does not */
    g->avx2 = (g->isa == PD_ISA_AVX2 || g->isa == PD_ISA_AVX512) && pd_cpu_has_isa(PD_ISA_AVX2);
    return PD_OK;
}

int pd_gen_set_walk(pd_gen *g, pd_walk walk)
{
    if (!g || (unsigned)walk > PD_WALK_COMPACT || g->isa < PD_ISA_SCALAR || g->isa > PD_ISA_AVX512)
        return PD_EINVAL;
    if (walk != PD_WALK_AUTO) {
        if (g->isa == PD_ISA_SCALAR) /* one lane has nothing to refill */
            return PD_EUNSUPPORTED;
        if (g->isa == PD_ISA_AVX512 && walk == PD_WALK_REFILL_SCALAR) /* native compress/expand make it moot */
            return PD_EUNSUPPORTED;
    }
    g->walk = walk;
    return PD_OK;
}

int pd__gen_check(const pd_gen *g)
{
    if (!g || g->isa < PD_ISA_SCALAR || g->isa > PD_ISA_AVX512 || (unsigned)g->walk > PD_WALK_COMPACT)
        return PD_EINVAL;
    if (g->vbmi && (g->isa != PD_ISA_AVX512 || !(pd_cpu_isas() & PD_CPU_VBMI)))
        return PD_EUNSUPPORTED;
    if (g->bw && (g->isa != PD_ISA_AVX512 || !(pd_cpu_isas() & PD_CPU_BW)))
        return PD_EUNSUPPORTED;
    if (g->avx2 && !pd_cpu_has_isa(PD_ISA_AVX2))
        return PD_EUNSUPPORTED;
    return pd_cpu_has_isa(g->isa) ? PD_OK : PD_EUNSUPPORTED;
}

/* ---- Requests */

int pd__req_range(const pd_perm *p, uint64_t start, uint64_t count, void *out, unsigned width, pd__req *req)
{
    /* Same checks, same order as pd_perm_fill_*: arguments, range, width. */
    if (!p || (!out && count))
        return PD_EINVAL;
    if (start > p->n || count > p->n - start)
        return PD_ERANGE;
    if (width == 4 && p->n > (UINT64_C(1) << 32))
        return PD_EOVERFLOW;
    memset(req, 0, sizeof *req);
    req->body = (pd__run){.perm = p, .first = start, .stride = 1, .count = count, .out = out, .width = width};
    req->total = count;
    return PD_OK;
}

int pd__req_slice(const pd_perm *p, const pd_slice *s, uint64_t count, void *out, unsigned width,
                  pd__req *req)
{
    /* Same checks, same order as pd_slice_fill_*. */
    uint64_t left;
    if (!p || (!out && count))
        return PD_EINVAL;
    int rc = pd_slice_remaining(p->n, s, &left);
    if (rc)
        return rc;
    if (count > left)
        count = left;
    if (width == 4 && pd_id_width(p->n) != 4)
        return PD_EOVERFLOW;
    memset(req, 0, sizeof *req);
    req->total = count;
    const uint64_t first = s->offset + s->rank; /* ≤ T + W < 2^64 */
    if (count && first + (count - 1) * s->world >= p->n) {
        req->has_tail = 1;
        req->tail_position = first + (count - 1) * s->world;
        count--;
    }
    req->body = (pd__run){.perm = p, .first = first, .stride = s->world, .count = count, .out = out, .width = width};
    return PD_OK;
}

void pd__req_tail(const pd__req *req)
{
    if (!req->has_tail)
        return;
    const pd__run *b = &req->body;
    const uint64_t id = pd_stream_sample(b->perm, req->tail_position);
    if (b->width == 4)
        ((uint32_t *)b->out)[b->count] = (uint32_t)id;
    else
        ((uint64_t *)b->out)[b->count] = id;
}

/* ---- Dispatch */

typedef void pd__kernel_fn(const pd__run *run);

static pd__kernel_fn *pd_kernel_for(const pd_gen *g, uint64_t count)
{
    if (count < PD__SIMD_MIN)
        return pd__run_scalar;
    switch (g->isa) {
#ifdef PD_CPU_HAVE_AVX2
    case PD_ISA_AVX2:
        return pd__run_avx2;
#endif
#ifdef PD_CPU_HAVE_AVX512
    case PD_ISA_AVX512:
        return pd__run_avx512;
#endif
    default:
        return pd__run_scalar;
    }
}

void pd__gen_run(const pd_gen *g, const pd__run *run)
{
    if (run->count == 0)
        return;
    if (run->perm->n == 1) { /* σ = 0; nothing to compute */
        memset(run->out, 0, run->count * run->width);
        return;
    }
    pd__run part = *run;
    if (part.walk == PD_WALK_AUTO) /* the fastest in bench/results/cpu_gen.md */
        part.walk = PD_WALK_COMPACT;
    for (uint64_t done = 0; done < run->count; done += part.count) {
        part.count = run->count - done < PD__RUN_MAX ? run->count - done : PD__RUN_MAX;
        part.first = run->first + done * run->stride;
        part.out = (char *)run->out + done * run->width;
        pd_kernel_for(g, part.count)(&part);
    }
}

static int pd_gen_req_run(const pd_gen *g, pd__req *req)
{
    req->body.walk = g->walk;
    pd__gen_run(g, &req->body);
    pd__req_tail(req);
    return PD_OK;
}

int pd_gen_fill_u64(const pd_gen *g, const pd_perm *p, uint64_t start, uint64_t count, uint64_t *out)
{
    pd__req req;
    int rc = pd__gen_check(g);
    if (!rc)
        rc = pd__req_range(p, start, count, out, 8, &req);
    return rc ? rc : pd_gen_req_run(g, &req);
}

int pd_gen_fill_u32(const pd_gen *g, const pd_perm *p, uint64_t start, uint64_t count, uint32_t *out)
{
    pd__req req;
    int rc = pd__gen_check(g);
    if (!rc)
        rc = pd__req_range(p, start, count, out, 4, &req);
    return rc ? rc : pd_gen_req_run(g, &req);
}

static int pd_gen_slice_fill(const pd_gen *g, const pd_perm *p, const pd_slice *s, uint64_t count, void *out,
                             unsigned width, uint64_t *written)
{
    pd__req req;
    int rc = pd__gen_check(g);
    if (!rc && !written)
        rc = PD_EINVAL;
    if (!rc)
        rc = pd__req_slice(p, s, count, out, width, &req);
    if (rc)
        return rc;
    pd_gen_req_run(g, &req);
    *written = req.total;
    return PD_OK;
}

int pd_gen_slice_fill_u64(const pd_gen *g, const pd_perm *p, const pd_slice *s, uint64_t count,
                          uint64_t *out, uint64_t *written)
{
    return pd_gen_slice_fill(g, p, s, count, out, 8, written);
}

int pd_gen_slice_fill_u32(const pd_gen *g, const pd_perm *p, const pd_slice *s, uint64_t count,
                          uint32_t *out, uint64_t *written)
{
    return pd_gen_slice_fill(g, p, s, count, out, 4, written);
}
