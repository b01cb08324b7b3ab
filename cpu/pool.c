/* A pthread pool that splits one bulk σ request into chunks, run by the calling thread and a few helpers. */
#define _POSIX_C_SOURCE 200809L

#include "cpu/kernel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PD_POOL_PAUSE() _mm_pause()
#else
#define PD_POOL_PAUSE() ((void)0)
#endif

#define PD_POOL_MAX_THREADS 4096u

/* One request. It lives on its caller's stack: the caller returns only once
 * every chunk has finished, and helpers touch a job only between taking a
 * chunk and reporting it finished, both under the pool's mutex. */
typedef struct pd_pool_job {
    struct pd_pool_job *next; /* in the queue while chunks are left to take */
    pd__chunk_fn *fn;  /* computes ids [begin, begin + count) of the request */
    void *ctx;
    uint64_t count;
    uint64_t chunk;    /* ids per chunk */
    uint64_t nchunks;
    uint64_t taken;    /* chunks handed out */
    _Atomic uint64_t finished; /* chunks computed: changed under mu, polled by a spinning caller */
} pd_pool_job;

struct pd_pool {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was queued, or the pool stops */
    pthread_cond_t done; /* some job finished its last chunk */
    pd_pool_job *head, *tail;
    int stop;
    /* Spinning (pd_pool_set_spin): readable without mu, and polled by every idle helper, so on a cache line of
     * their own: the mutex's and the counters' writes would otherwise take it from each poller at every lock.
     * pending is 1 while head is set or the pool stops. tickets: how many more polling helpers may go for mu
     * (pd_pool_ticket). gap: how long after one split request ended the next has been arriving (an average, ns,
     * plus 1; 0: unknown), which decides whether an idle helper polls at all. It is the gap a helper would poll
     * through: split requests' own lengths do not count (a 65536-id mixture Fetch takes ~500 µs on 2 vCPUs, so
     * arrivals of a client reading back to back were 500+ µs apart and its helpers slept). */
    _Alignas(64) _Atomic uint64_t pending;
    _Atomic int64_t tickets;
    _Atomic uint64_t spin_ns, gap;
    _Alignas(64) uint64_t last_done; /* when the last split request's chunks had all finished (ns), under mu */
    unsigned sleepers;                /* helpers in cond_wait(work), under mu: only then is a wake-up sent */
    /* Helpers polling for the next request, and how many may (the last split request's chunks but its caller's),
     * under mu. All idle helpers used to poll: on a 32-core host the 31 of a pool of 32 held CPUs that the
     * threads with work needed (permd's loop, its workers, the clients). */
    unsigned spinning, spin_want;
    _Atomic uint64_t caught, slept;   /* pd_pool_counts */
    unsigned nthreads; /* per request, the caller included */
    unsigned started;  /* helpers running */
    pd_gen gen;
    pthread_t helpers[];
};

/* Take the next chunk of job; the queue drops a job once all are taken. Under mu. */
static int pd_pool_take(pd_pool *pool, pd_pool_job *job, uint64_t *chunk)
{
    if (job->taken == job->nchunks)
        return 0;
    *chunk = job->taken++;
    if (job->taken == job->nchunks) { /* unlink it: helpers look only at the head */
        pd_pool_job **link = &pool->head, *prev = NULL;
        while (*link != job) {
            prev = *link;
            link = &prev->next;
        }
        *link = job->next;
        if (pool->tail == job)
            pool->tail = prev;
        atomic_store_explicit(&pool->pending, pool->head != NULL || pool->stop, memory_order_relaxed);
        if (!pool->head) /* the tickets of chunks the caller ran itself */
            atomic_store_explicit(&pool->tickets, 0, memory_order_relaxed);
    }
    return 1;
}

/* Compute one chunk. Outside mu. */
static void pd_pool_run_chunk(const pd_pool *pool, const pd_pool_job *job, uint64_t c)
{
    const uint64_t begin = c * job->chunk;
    job->fn(&pool->gen, job->ctx, begin, job->count - begin < job->chunk ? job->count - begin : job->chunk);
}

/* Report a chunk finished; whether it was the job's last. Under mu. */
static int pd_pool_finish(pd_pool *pool, pd_pool_job *job)
{
    const uint64_t n = job->nchunks; /* the job lives while the caller waits: for mu, if it saw this add */
    if (atomic_fetch_add_explicit(&job->finished, 1, memory_order_release) + 1 != n)
        return 0;
    pthread_cond_broadcast(&pool->done);
    return 1;
}

static uint64_t pd_pool_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* How long the thread that split a request polls for its helpers' last chunks before it sleeps (at most
 * spin_ns): they are usually about to end; a long chunk is not worth polling through. */
#define PD_POOL_WAIT_SPIN_NS UINT64_C(50000)

/* How long an idle helper polls for the next request: spin_ns while split requests have been arriving at
 * most that long after the last one ended (a client reading back to back), else 0. A trainer asking every
 * few ms or seconds costs no polling at all. */
static uint64_t pd_pool_idle_spin(const pd_pool *pool)
{
    const uint64_t cap = atomic_load_explicit(&pool->spin_ns, memory_order_relaxed);
    const uint64_t gap = atomic_load_explicit(&pool->gap, memory_order_relaxed);
    return gap && gap - 1 <= cap ? cap : 0;
}

/* Poll *flag until it reaches want, for at most ns; whether it did. Outside mu. A thread that sleeps on
 * a condition variable costs the one that wakes it a system call, and itself the scheduler's wake-up
 * latency (5-80 µs measured on a 2-vCPU VM, often on the waker's own CPU): more than a mixture Fetch's
 * part takes to compute. */
static int pd_pool_spin(const _Atomic uint64_t *flag, uint64_t want, uint64_t ns)
{
    if (!ns)
        return 0;
    const uint64_t end = pd_pool_now_ns() + ns;
    for (;;) {
        for (int i = 0; i < 32; i++) { /* a clock read costs ~20 ns: every 32 polls */
            if (atomic_load_explicit(flag, memory_order_acquire) >= want)
                return 1;
            PD_POOL_PAUSE();
        }
        if (pd_pool_now_ns() >= end)
            return 0;
    }
}

/* Whether a polling helper may go for mu: a request split in k chunks lets k − 1 of them (its caller runs
 * chunks too). Every polling helper used to go at once (31 on a 32-core host for a request of 16 chunks), and
 * the convoy on the mutex, not the chunks, set the request's time: an 8192-id mixture Fetch at W = 8 took
 * 110-130 µs with 32 threads, 46-54 with 8 or 16. A ticket is a hint, not a claim: a helper that finds no chunk
 * left under mu sleeps (counted in sleepers, so the next request wakes it). */
static int pd_pool_ticket(pd_pool *pool)
{
    if (atomic_fetch_sub_explicit(&pool->tickets, 1, memory_order_relaxed) > 0)
        return 1;
    atomic_fetch_add_explicit(&pool->tickets, 1, memory_order_relaxed);
    return 0;
}

/* Poll for a request this helper may join (pending, and a ticket), for at most ns; whether it found one. */
static int pd_pool_poll_work(pd_pool *pool, uint64_t ns)
{
    if (!ns)
        return 0;
    const uint64_t end = pd_pool_now_ns() + ns;
    for (;;) {
        for (int i = 0; i < 32; i++) { /* a clock read costs ~20 ns: every 32 polls */
            if (atomic_load_explicit(&pool->pending, memory_order_acquire) &&
                atomic_load_explicit(&pool->tickets, memory_order_relaxed) > 0 && pd_pool_ticket(pool))
                return 1;
            PD_POOL_PAUSE();
        }
        if (pd_pool_now_ns() >= end)
            return 0;
    }
}

static void *pd_pool_helper(void *arg)
{
    pd_pool *pool = arg;
    int yielded = 0; /* after a request's last chunk, to its caller (below) */
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        if (!pool->head && !pool->stop) { /* stay awake a moment: a client's next request often follows */
            const unsigned poll = pool->spinning < pool->spin_want; /* as many as the last request could use */
            pool->spinning += poll;
            pthread_mutex_unlock(&pool->mu);
            const int work = poll && pd_pool_poll_work(pool, pd_pool_idle_spin(pool));
            pthread_mutex_lock(&pool->mu);
            pool->spinning -= poll;
            if (work && pool->head)
                atomic_fetch_add_explicit(&pool->caught, 1, memory_order_relaxed);
        } else if (yielded && pool->head) { /* the caller's next request came while this helper yielded */
            atomic_fetch_add_explicit(&pool->caught, 1, memory_order_relaxed);
        }
        yielded = 0;
        while (!pool->head && !pool->stop) {
            atomic_fetch_add_explicit(&pool->slept, 1, memory_order_relaxed);
            pool->sleepers++;
            pthread_cond_wait(&pool->work, &pool->mu);
            pool->sleepers--;
        }
        if (!pool->head) /* stopping, and nothing is left */
            break;
        pd_pool_job *job = pool->head;
        uint64_t c = 0;
        pd_pool_take(pool, job, &c); /* a queued job always has a chunk left */
        pthread_mutex_unlock(&pool->mu);
        pd_pool_run_chunk(pool, job, c);
        pthread_mutex_lock(&pool->mu);
        if (pd_pool_finish(pool, job) && pd_pool_idle_spin(pool)) {
            /* The caller may sleep on done, and the scheduler often wakes it on this CPU: were this helper
             * to poll there at once, the caller would wait out the poll (a 2-vCPU VM: up to the whole
             * cpu_spin_us, while the other CPU idled). A yield lets it run first. */
            pthread_mutex_unlock(&pool->mu);
            sched_yield();
            pthread_mutex_lock(&pool->mu);
            yielded = 1;
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void pd_pool_stop(pd_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    atomic_store(&pool->tickets, INT64_MAX / 2); /* polling helpers look, and stop */
    atomic_store(&pool->pending, 1);
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    for (unsigned i = 0; i < pool->started; i++)
        pthread_join(pool->helpers[i], NULL);
    pool->started = 0;
}

int pd_pool_create(unsigned nthreads, const pd_gen *gen, pd_pool **out)
{
    pd_pool *pool = NULL;
    pd_gen g;
    int rc = PD_EINVAL, sync = 0;
    if (!out || nthreads > PD_POOL_MAX_THREADS)
        return PD_EINVAL;
    *out = NULL;
    if (gen) {
        if ((rc = pd_gen_init(&g, gen->isa)) != PD_OK || (rc = pd_gen_set_walk(&g, gen->walk)) != PD_OK)
            return rc;
    } else if ((rc = pd_gen_init(&g, PD_ISA_AUTO)) != PD_OK) {
        return rc;
    }
    if (nthreads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = online < 1 ? 1u : online > (long)PD_POOL_MAX_THREADS ? PD_POOL_MAX_THREADS : (unsigned)online;
    }
    rc = PD_ENOMEM;
    const size_t bytes = (sizeof *pool + (nthreads - 1) * sizeof(pthread_t) + 63) & ~(size_t)63;
    pool = aligned_alloc(64, bytes); /* the polled line of its own (_Alignas) */
    if (!pool)
        goto fail;
    memset(pool, 0, bytes);
    pool->nthreads = nthreads;
    pool->gen = g;
    if (pthread_mutex_init(&pool->mu, NULL))
        goto fail;
    if (pthread_cond_init(&pool->work, NULL)) {
        pthread_mutex_destroy(&pool->mu);
        goto fail;
    }
    if (pthread_cond_init(&pool->done, NULL)) {
        pthread_cond_destroy(&pool->work);
        pthread_mutex_destroy(&pool->mu);
        goto fail;
    }
    sync = 1;
    for (; pool->started < nthreads - 1; pool->started++) {
        if (pthread_create(&pool->helpers[pool->started], NULL, pd_pool_helper, pool))
            goto fail;
    }
    *out = pool;
    return PD_OK;
fail:
    if (sync) {
        pd_pool_stop(pool);
        pthread_cond_destroy(&pool->done);
        pthread_cond_destroy(&pool->work);
        pthread_mutex_destroy(&pool->mu);
    }
    free(pool);
    return rc;
}

void pd_pool_destroy(pd_pool *pool)
{
    if (!pool)
        return;
    pd_pool_stop(pool);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->work);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

unsigned pd_pool_threads(const pd_pool *pool)
{
    return pool ? pool->nthreads : 0;
}

int pd_pool_set_spin(pd_pool *pool, uint64_t ns)
{
    if (!pool || ns > PD_POOL_SPIN_MAX_NS)
        return PD_EINVAL;
    atomic_store(&pool->spin_ns, ns);
    return PD_OK;
}

void pd_pool_counts(const pd_pool *pool, uint64_t *caught, uint64_t *slept)
{
    *caught = pool ? atomic_load(&pool->caught) : 0;
    *slept = pool ? atomic_load(&pool->slept) : 0;
}

/* ids [0, count) in chunks of `chunk` (a multiple of 64: whole vectors for every SIMD kernel). */
/* Whether count ids in chunks of chunk run on the caller alone: one thread, or fewer than two chunks. */
static int pd_pool_alone(const pd_pool *pool, uint64_t count, uint64_t chunk)
{
    return pool->nthreads == 1 || count < 2 * chunk;
}

static void pd_pool_run_chunks(pd_pool *pool, uint64_t count, uint64_t chunk, pd__chunk_fn *fn, void *ctx)
{
    if (pd_pool_alone(pool, count, chunk)) {
        if (count)
            fn(&pool->gen, ctx, 0, count);
        return;
    }
    pd_pool_job job = {.fn = fn, .ctx = ctx, .count = count, .chunk = chunk, .nchunks = (count + chunk - 1) / chunk};
    uint64_t c = 0;
    pthread_mutex_lock(&pool->mu);
    if (pool->tail)
        pool->tail->next = &job;
    else
        pool->head = &job;
    pool->tail = &job;
    atomic_fetch_add_explicit(&pool->tickets, (int64_t)job.nchunks - 1, memory_order_relaxed);
    atomic_store_explicit(&pool->pending, 1, memory_order_release);
    if (pool->last_done) { /* another caller's request may have ended after this one came: a gap of 0 */
        const uint64_t now = pd_pool_now_ns(), gap = (now > pool->last_done ? now - pool->last_done : 0) + 1,
                       avg = atomic_load_explicit(&pool->gap, memory_order_relaxed);
        atomic_store_explicit(&pool->gap, avg ? (avg + gap) / 2 : gap, memory_order_relaxed);
    }
    /* Wake only the sleepers this request has chunks for beyond the polling helpers (they see pending without a
     * wake-up), and let as many poll after it as it could use. */
    for (uint64_t n = 0; n < pool->sleepers && n + 1 + pool->spinning < job.nchunks; n++)
        pthread_cond_signal(&pool->work);
    pool->spin_want = job.nchunks - 1 < pool->nthreads - 1 ? (unsigned)job.nchunks - 1 : pool->nthreads - 1;
    while (pd_pool_take(pool, &job, &c)) { /* the caller works on its own request too */
        pthread_mutex_unlock(&pool->mu);
        pd_pool_run_chunk(pool, &job, c);
        pthread_mutex_lock(&pool->mu);
        pd_pool_finish(pool, &job);
    }
    if (atomic_load(&job.finished) < job.nchunks) { /* a helper's last chunk is often about to end */
        pthread_mutex_unlock(&pool->mu);
        const uint64_t cap = atomic_load_explicit(&pool->spin_ns, memory_order_relaxed);
        pd_pool_spin(&job.finished, job.nchunks, cap < PD_POOL_WAIT_SPIN_NS ? cap : PD_POOL_WAIT_SPIN_NS);
        pthread_mutex_lock(&pool->mu);
    }
    while (atomic_load(&job.finished) < job.nchunks)
        pthread_cond_wait(&pool->done, &pool->mu);
    pool->last_done = pd_pool_now_ns();
    pthread_mutex_unlock(&pool->mu);
}

void pd__pool_run(pd_pool *pool, uint64_t count, pd__chunk_fn *fn, void *ctx)
{
    uint64_t chunk = count / ((uint64_t)pool->nthreads * 4);
    chunk = chunk < PD_POOL_CHUNK_MIN ? PD_POOL_CHUNK_MIN : chunk > PD_POOL_CHUNK_MAX ? PD_POOL_CHUNK_MAX : chunk;
    pd_pool_run_chunks(pool, count, (chunk + 63) & ~UINT64_C(63), fn, ctx);
}

/* The chunk of pd__pool_run_parts: a part per thread, within [min_part, max_part], a multiple of 64. */
static uint64_t pd_pool_part(const pd_pool *pool, uint64_t count, uint64_t min_part, uint64_t max_part)
{
    uint64_t chunk = (count + pool->nthreads - 1) / pool->nthreads;
    chunk = chunk > max_part ? max_part : chunk;
    chunk = chunk < min_part ? min_part : chunk;
    return (chunk + 63) & ~UINT64_C(63);
}

void pd__pool_run_parts(pd_pool *pool, uint64_t count, uint64_t min_part, uint64_t max_part, pd__chunk_fn *fn,
                        void *ctx)
{
    pd_pool_run_chunks(pool, count, pd_pool_part(pool, count, min_part, max_part), fn, ctx);
}

int pd__pool_splits(const pd_pool *pool, uint64_t count, uint64_t min_part, uint64_t max_part)
{
    return !pd_pool_alone(pool, count, pd_pool_part(pool, count, min_part, max_part));
}

const pd_gen *pd__pool_gen(const pd_pool *pool)
{
    return &pool->gen;
}

/* ids [begin, begin + count) of a σ run. */
static void pd_pool_sigma_chunk(const pd_gen *g, void *ctx, uint64_t begin, uint64_t count)
{
    pd__run part = *(const pd__run *)ctx;
    part.count = count;
    part.first += begin * part.stride;
    part.out = (char *)part.out + begin * part.width;
    pd__gen_run(g, &part);
}

/* Run a validated request: its body across the pool, its wrapped tail here. */
static void pd_pool_run(pd_pool *pool, pd__req *req)
{
    req->body.walk = pool->gen.walk;
    pd__pool_run(pool, req->body.count, pd_pool_sigma_chunk, &req->body);
    pd__req_tail(req);
}

int pd_pool_fill_u64(pd_pool *pool, const pd_perm *p, uint64_t start, uint64_t count, uint64_t *out)
{
    pd__req req;
    if (!pool)
        return PD_EINVAL;
    int rc = pd__req_range(p, start, count, out, 8, &req);
    if (rc)
        return rc;
    pd_pool_run(pool, &req);
    return PD_OK;
}

int pd_pool_fill_u32(pd_pool *pool, const pd_perm *p, uint64_t start, uint64_t count, uint32_t *out)
{
    pd__req req;
    if (!pool)
        return PD_EINVAL;
    int rc = pd__req_range(p, start, count, out, 4, &req);
    if (rc)
        return rc;
    pd_pool_run(pool, &req);
    return PD_OK;
}

static int pd_pool_slice_fill(pd_pool *pool, const pd_perm *p, const pd_slice *s, uint64_t count, void *out,
                              unsigned width, uint64_t *written)
{
    pd__req req;
    if (!pool || !written)
        return PD_EINVAL;
    int rc = pd__req_slice(p, s, count, out, width, &req);
    if (rc)
        return rc;
    pd_pool_run(pool, &req);
    *written = req.total;
    return PD_OK;
}

int pd_pool_slice_fill_u64(pd_pool *pool, const pd_perm *p, const pd_slice *s, uint64_t count,
                           uint64_t *out, uint64_t *written)
{
    return pd_pool_slice_fill(pool, p, s, count, out, 8, written);
}

int pd_pool_slice_fill_u32(pd_pool *pool, const pd_perm *p, const pd_slice *s, uint64_t count,
                           uint32_t *out, uint64_t *written)
{
    return pd_pool_slice_fill(pool, p, s, count, out, 4, written);
}
