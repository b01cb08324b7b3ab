/* Sharded ids in bulk: a rank's positions cut into runs inside one window, σ of batches of runs by the SIMD kernels, then a vector slot lookup. */
#include "cpu/kernel.h"
#include "cpu/divide.h"

#include <stdlib.h>
#include <string.h>

/*
 * The core (core/shards.c) computes each position on its own: lane → window-stream index x →
 * window (a binary search) → τ_w(x − P[wK]) → slot (a second binary search) → id. Here the
 * same arithmetic is reorganized around what a rank's positions have in common.
 *
 * Runs. A rank reads positions f + kW. Lanes repeat with period m = G / gcd(G, W) in k, so
 * the subsequence k = c + i·m (c < m) stays in one lane ℓ, where its window-stream index moves
 * by d = W / gcd(G, W) per step of i: x = x₀ + i·d on even lanes, x₀ − i·d on odd ones (spec
 * §3.6). Indices in a lane only grow (or only shrink), so the subsequence crosses each window
 * once: it is a sequence of runs, each an arithmetic progression of window-relative positions
 * v = x − P[wK] inside one window. For G = W (rank r reads lane r) or G = 1, m = 1 and the runs
 * tile the rank's output contiguously (odd lanes backward).
 *
 * σ. A run costs one window search (usually none: the lane's next window is the neighbour)
 * and one key derivation for τ_w. Runs are collected into a batch of up to PD__BATCH_ITEMS
 * positions: a batch of one run (a long one) goes through g's σ kernel as a pd__run of
 * stride d; a batch of several (short runs of consecutive windows) through the batch kernel,
 * whose lanes each carry their own τ (kernel.h). Either way the parity correction is left
 * out and applied in the lookup.
 *
 * Lookup. Each run's samples u = τ_w(v) become ids by a branchless binary search over the
 * window's slots, copied relative to the window into u32 tables (pd__slots: rel and add below,
 * rebuilt when the window changes), in the SIMD lookup kernels. Windows with more than
 * PD_SHARD_TABLE_SLOTS slots, runs too short to pay for a table, windows of 2^32 samples or
 * more (σ in 64 bits, one run at a time) and windows of one sample search the plan's own table
 * as the core does.
 */

#define PD_SHARD_PIECE 1024 /* ids staged at a time where a run's output is strided */
#define PD_SHARD_ALONE 256  /* AVX2: runs this long in word-lane windows take g's σ kernel alone (pd_run_alone) */
#define PD_SHARD_SHORT 16   /* runs shorter than this look each id up in the plan, as the core does */

/* A validated request: body ids (positions below N) and, in pad mode, at most one wrapped last id
 * (positions of a rank are W apart and [N, T) is shorter than W), as pd__req for flat σ. */
typedef struct pd_shard_req {
    const pd_shard_plan *plan;
    uint64_t first; /* the rank's first position: offset + rank */
    uint64_t world; /* W */
    uint64_t count; /* body ids */
    void *out;
    unsigned width;
    int has_tail;
    uint64_t tail_position;
    uint64_t total;
} pd_shard_req;

/* A window and its τ. */
typedef struct pd_window {
    uint64_t w;
    uint64_t lo, hi;       /* its window-stream indices [P[wK], P[e_w]) */
    uint64_t slot0, slots; /* its slots [wK, e_w) */
    pd_perm tau;
} pd_window;

/* A run in the batch: window-relative positions v0 + j·d (j < len, ascending) at items
 * [at, at + len); item j's id goes to output index kb + j·ks (ks = ±m). */
typedef struct pd_run {
    pd_window win;
    uint64_t v0, d, kb;
    int64_t ks;
    uint32_t at, len;
    int alone; /* σ by g's own kernel, this run alone in its batch (pd_run_alone) */
} pd_run;

/* One subsequence k = c + i·m (i < n) of a chunk: window-stream indices x0 + i·d, or x0 − i·d on
 * an odd lane, and the window it is in. */
typedef struct pd_sub {
    uint64_t x0, n;
    int back;
    int entered;
    unsigned kc; /* its key cache (pd_shard_scratch.kc) */
    pd_window win;
} pd_sub;

/* Up to this many subsequences are walked side by side, PD_SHARD_STEP of their indices at a
 * time, so that their interleaved outputs are written while in cache (W = 1 reading G lanes
 * would otherwise write every output line once per lane). Where g has a vector interleave
 * (pd_interleaves), a step's ids go to a stage a row per subsequence, then into the output by
 * whole vectors (pd_interleave): id by id, m apart, the stores cost 17% of a W = 1, G = 8 read. */
#define PD_SHARD_SUBS 16
#define PD_SHARD_STEP 1024
#define PD_SHARD_STAGE_MIN 64 /* subsequences at least this long stage their ids (pd_interleave) */
/* Key caches: subsequences side by side are in different lanes, far apart in windows, so one cache
 * shared by all was refilled (16 windows' keys, one used) at every window a subsequence entered: 5% of
 * a G = 3, W = 8 read. Subsequence c uses cache c mod 4. */
#define PD_SHARD_KEYSETS 4

typedef struct pd_keycache {
    pd_keys keys[16]; /* τ keys of windows [w, w + n) (16: what one vectorized derivation makes) */
    uint64_t w;
    unsigned n;
} pd_keycache;

/* Per chunk of a request, on the stack (~60 KiB; the σ kernels add up to ~50 KiB of their own). */
typedef struct pd_shard_scratch {
    pd_sub subs[PD_SHARD_SUBS];
    unsigned nruns;
    int narrow;        /* every run's τ walks on narrow lanes (pd__batch_narrow): the batch may hold more */
    uint32_t items;
    pd_run runs[PD__BATCH_RUNS];
    uint32_t v[PD__BATCH_ITEMS]; /* positions in, samples out */
    uint8_t run[PD__BATCH_ITEMS];
    uint64_t ids[PD_SHARD_PIECE]; /* ids of a strided run, or a wide window's samples */
    pd_keycache kc[PD_SHARD_KEYSETS];
    int one_key;                  /* derive only the window entered (a gather: its next windows are seldom read) */
    int tabled;                   /* 1: tab holds window tab_w's slots for this request's width */
    uint64_t tab_w;
    pd__slots tab;
    uint32_t rel[PD_SHARD_TABLE_SLOTS], add_lo[PD_SHARD_TABLE_SLOTS], add_hi[PD_SHARD_TABLE_SLOTS];
} pd_shard_scratch;

_Static_assert(PD_SHARD_TABLE_SLOTS >= 16, "the lookup kernels may read 16 table entries");
_Static_assert(PD__BATCH_RUNS <= 256, "run numbers are bytes");

void pd__slots_map_scalar(const pd__slots *t, const uint32_t *u, uint64_t count, void *out, unsigned width,
                          int reverse)
{
    for (uint64_t j = 0; j < count; j++) {
        const uint64_t id = pd__slots_id(t, u[j], width);
        if (width == 4)
            ((uint32_t *)out)[reverse ? -(int64_t)j : (int64_t)j] = (uint32_t)id;
        else
            ((uint64_t *)out)[reverse ? -(int64_t)j : (int64_t)j] = id;
    }
}

void pd__batch_scalar(const pd__batch *b)
{
    for (uint32_t i = 0; i < b->count; i++)
        b->v[i] = (uint32_t)pd__sigma(b->perm[b->run[i]], b->v[i], PD_ROUNDS, 0);
}

static void pd_slots_map(const pd_gen *g, const pd__slots *t, const uint32_t *u, uint64_t count, void *out,
                         unsigned width, int reverse)
{
    switch (g->isa) {
#ifdef PD_CPU_HAVE_AVX2
    case PD_ISA_AVX2:
        pd__slots_map_avx2(t, u, count, out, width, reverse);
        return;
#endif
#ifdef PD_CPU_HAVE_AVX512
    case PD_ISA_AVX512:
        pd__slots_map_avx512(t, u, count, out, width, reverse);
        return;
#endif
    default:
        pd__slots_map_scalar(t, u, count, out, width, reverse);
    }
}

static uint64_t pd_gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* Whether window w holds window-stream index x: then it is the core's pd__window_of(x). */
static int pd_window_holds(const pd_shard_plan *plan, uint64_t w, uint64_t x)
{
    return w < plan->windows && plan->slot_start[w * plan->window] <= x &&
           x < plan->slot_start[pd__window_end(plan, w)];
}

void pd__keys_many_scalar(uint64_t seed, uint64_t epoch, uint32_t first, unsigned count, pd_keys *out)
{
    for (unsigned i = 0; i < count; i++)
        pd_keys_derive(seed, epoch, first + i, &out[i]);
}

/* Window w's τ keys, from the keys of the next windows in the direction the lane moves, derived
 * together when w is not among them (a key derivation costs as much as σ of ~50 ids). */
static void pd_window_keys(const pd_gen *g, const pd_shard_plan *plan, pd_shard_scratch *sc, const pd_sub *sub,
                           uint64_t w, pd_keys *out)
{
    pd_keycache *kc = &sc->kc[sub->kc];
    if (!kc->n || w < kc->w || w - kc->w >= kc->n) {
        const unsigned many = sc->one_key ? 1 : g->isa == PD_ISA_AVX512 ? 16 : g->isa == PD_ISA_AVX2 ? 8 : 1;
        const int down = sub->entered && w + 1 == sub->win.w; /* an odd lane, backward */
        const uint64_t first = !down ? w : w + 1 >= many ? w + 1 - many : 0;
        const unsigned n = (unsigned)(plan->windows - first < many ? plan->windows - first : many);
        const uint32_t stream = PD_STREAM_WINDOW_BASE + (uint32_t)first;
        switch (many > 1 ? g->isa : PD_ISA_SCALAR) {
#ifdef PD_CPU_HAVE_AVX2
        case PD_ISA_AVX2:
            pd__keys_many_avx2(plan->seed, plan->epoch, stream, n, kc->keys);
            break;
#endif
#ifdef PD_CPU_HAVE_AVX512
        case PD_ISA_AVX512:
            pd__keys_many_avx512(plan->seed, plan->epoch, stream, n, kc->keys);
            break;
#endif
        default:
            pd__keys_many_scalar(plan->seed, plan->epoch, stream, n, kc->keys);
        }
        kc->w = first;
        kc->n = n;
    }
    *out = kc->keys[w - kc->w];
}

/* Make sub->win the window of x: the current one, a neighbour (a lane's next run), or a search. */
static void pd_window_enter(const pd_gen *g, const pd_shard_plan *plan, pd_shard_scratch *sc, pd_sub *sub,
                            uint64_t x)
{
    pd_window *win = &sub->win;
    if (sub->entered && x >= win->lo && x < win->hi)
        return;
    uint64_t w;
    if (sub->entered && pd_window_holds(plan, win->w + 1, x))
        w = win->w + 1;
    else if (sub->entered && win->w > 0 && pd_window_holds(plan, win->w - 1, x))
        w = win->w - 1;
    else
        w = pd__window_of(plan, x);
    pd_window_keys(g, plan, sc, sub, w, &win->tau.keys);
    sub->entered = 1;
    win->w = w;
    win->slot0 = w * plan->window;
    win->slots = pd__window_end(plan, w) - win->slot0;
    win->lo = plan->slot_start[win->slot0];
    win->hi = plan->slot_start[win->slot0 + win->slots];
    pd__perm_shape(&win->tau, win->hi - win->lo, PD_MIN_BITS); /* τ_w as pd__window_perm makes it */
    /* The slots' shards are anywhere in start[]: ask for their lines now, read when the batch is
     * flushed (a miss per window was ~5% of the time at 1000 samples a window). */
    for (uint64_t i = 0; i < win->slots && i < 64; i++)
        __builtin_prefetch(&plan->start[plan->slot_shard[win->slot0 + i]]);
}

/* Copy window win's slots into the scratch tables, relative to the window (narrow windows only). */
static void pd_window_table(const pd_shard_plan *plan, const pd_window *win, pd_shard_scratch *sc,
                            unsigned width)
{
    uint32_t size = 1;
    while (size < win->slots)
        size *= 2;
    for (uint32_t i = 0; i < size || i < 16; i++) {
        uint64_t rel = UINT32_MAX, add = 0;
        if (i < win->slots) {
            const uint64_t t = win->slot0 + i;
            rel = plan->slot_start[t] - win->lo; /* ≤ m_w < 2^32 */
            add = plan->start[plan->slot_shard[t]] - rel;
        }
        sc->rel[i] = (uint32_t)rel;
        sc->add_lo[i] = (uint32_t)add;
        if (width == 8)
            sc->add_hi[i] = (uint32_t)(add >> 32);
    }
    sc->tab = (pd__slots){.rel = sc->rel, .add_lo = sc->add_lo, .add_hi = sc->add_hi, .size = size,
                          .flip = win->tau.keys.flip};
    sc->tabled = 1;
    sc->tab_w = win->w;
}

/* The id of window sample u (unflipped) through the plan's table: the core's pd__window_locate. */
static uint64_t pd_window_id(const pd_shard_plan *plan, const pd_window *win, uint64_t u)
{
    const uint64_t *P = plan->slot_start;
    const uint64_t x = win->lo + pd__unflip(&win->tau, u);
    const uint64_t t = pd__last_at_most(P, 1, win->slot0, win->slot0 + win->slots, x);
    return plan->start[plan->slot_shard[t]] + (x - P[t]);
}

static void pd_store(void *out, unsigned width, uint64_t k, uint64_t id)
{
    if (width == 4)
        ((uint32_t *)out)[k] = (uint32_t)id;
    else
        ((uint64_t *)out)[k] = id;
}

/* ids of a run's samples u[j], j < len, to its output indices. */
static void pd_run_ids(const pd_gen *g, const pd_shard_req *r, pd_shard_scratch *sc, const pd_run *ru,
                       const uint32_t *u)
{
    const pd_window *win = &ru->win;
    const uint64_t len = ru->len;
    if (win->slots > PD_SHARD_TABLE_SLOTS || len < PD_SHARD_SHORT || (win->slots > 16 && win->slots > len)) {
        for (uint64_t j = 0; j < len; j++)
            pd_store(r->out, r->width, ru->kb + (uint64_t)((int64_t)j * ru->ks), pd_window_id(r->plan, win, u[j]));
        return;
    }
    if (!sc->tabled || sc->tab_w != win->w)
        pd_window_table(r->plan, win, sc, r->width);
    if (ru->ks == 1 || ru->ks == -1) {
        pd_slots_map(g, &sc->tab, u, len, (char *)r->out + ru->kb * r->width, r->width, ru->ks < 0);
        return;
    }
    for (uint64_t j = 0; j < len; j += PD_SHARD_PIECE) { /* strided: staged, then scattered */
        const uint64_t n = len - j < PD_SHARD_PIECE ? len - j : PD_SHARD_PIECE;
        pd_slots_map(g, &sc->tab, u + j, n, sc->ids, r->width, 0);
        const uint64_t k = ru->kb + (uint64_t)((int64_t)j * ru->ks);
        if (r->width == 4)
            for (uint64_t i = 0; i < n; i++)
                ((uint32_t *)r->out)[k + (uint64_t)((int64_t)i * ru->ks)] = ((const uint32_t *)sc->ids)[i];
        else
            for (uint64_t i = 0; i < n; i++)
                ((uint64_t *)r->out)[k + (uint64_t)((int64_t)i * ru->ks)] = sc->ids[i];
    }
}

/* Whether a run of len positions in window win, its ids ks apart in the output, goes through g's σ kernel on its
 * own rather than in a batch: on AVX2, contiguous runs (|ks| = 1) of PD_SHARD_ALONE or more in windows of 12 to
 * 17 bits. Flat σ's word lanes (broadcast keys) came after the batch kernel's (a key per lane, gathered each
 * round), and beat them: on a Zen 3, one rank of 8, uneven windows of 8 shards 118 → 155 M ids/s, uniform
 * 239 → 284, of 64 shards 121 → 146 (shorter runs, 64 and 128, lost up to 45% where windows are single shards).
 * Strided runs (G = 3, W = 8: ids 3 apart) lost instead, uniform 194 → 164, and stay batched (157 → 198 in an
 * A/B run); why is not settled: one suspect is that a run alone is flushed as soon as it is queued, so its
 * scattered stores no longer find their lines prefetched (pd_prefetch_out) during other runs' σ. Byte-lane
 * windows (b ≤ 11) stay in batches, whose byte lanes win; AVX-512 was not measured, and stays as it was. */
static int pd_run_alone(const pd_gen *g, const pd_window *win, uint64_t len, int64_t ks)
{
    return g->isa == PD_ISA_AVX2 && (ks == 1 || ks == -1) && len >= PD_SHARD_ALONE &&
           win->tau.bits > PD__BATCH_BYTES_AVX2 && win->tau.bits <= PD__BATCH_WORDS_AVX2;
}

/* σ of the batch's runs, then their ids; the batch is empty afterwards. */
static void pd_batch_flush(const pd_gen *g, const pd_shard_req *r, pd_shard_scratch *sc)
{
    const pd_run *ru = &sc->runs[0];
    if (sc->nruns == 1 && (ru->alone || !pd__batch_narrow(g, &ru->win.tau))) { /* one window: g's own kernel */
        const pd__run run = {.perm = &ru->win.tau, .first = ru->v0, .stride = ru->d, .count = ru->len,
                             .out = sc->v, .width = 4, .walk = g->walk, .unflipped = 1};
        pd__gen_run(g, &run);
    } else if (sc->nruns) {
        pd__batch b = {.nruns = sc->nruns, .v = sc->v, .run = sc->run, .count = sc->items};
        for (unsigned i = 0; i < sc->nruns; i++)
            b.perm[i] = &sc->runs[i].win.tau;
        pd__batch_run(g, &b);
    }
    for (unsigned i = 0; i < sc->nruns; i++)
        pd_run_ids(g, r, sc, &sc->runs[i], sc->v + sc->runs[i].at);
    sc->nruns = 0;
    sc->items = 0;
}

/* A run's ids are stored after the batch's σ, and each store of a line not in cache waited for it: a
 * strided run's (ks apart, its lane's subsequence among m; an 8-lane G = 3 read spent 16% of its time on
 * those stores) and a contiguous run's alike (the lookup's vector stores, 8% of an uneven K = 1 read on
 * word lanes). Asking for the lines when the run is queued brings them in while σ runs. Only where
 * ids share lines (|ks|·width ≤ 64): with farther ids the range's lines are mostly not the run's. */
static void pd_prefetch_out(const pd_shard_req *r, uint64_t kb, uint64_t len, int64_t ks)
{
    const uint64_t step = (uint64_t)(ks < 0 ? -ks : ks) * r->width;
    if (step > 64 || !len)
        return;
    const uint64_t first = kb, last = ks < 0 ? kb - (len - 1) * (uint64_t)-ks : kb + (len - 1) * (uint64_t)ks;
    const uintptr_t lo = (uintptr_t)r->out + (first < last ? first : last) * r->width;
    const uintptr_t hi = (uintptr_t)r->out + (first < last ? last : first) * r->width;
    for (uintptr_t b = lo & ~(uintptr_t)63; b <= hi; b += 64)
        __builtin_prefetch((const void *)b, 1);
}

/* Queue a run in window win (2 ≤ n < 2^32), flushing the batch as it fills. */
static void pd_batch_add(const pd_gen *g, const pd_shard_req *r, pd_shard_scratch *sc, const pd_window *win,
                         uint64_t v0, uint64_t d, uint64_t len, uint64_t kb, int64_t ks)
{
    const int narrow = pd__batch_narrow(g, &win->tau), alone = pd_run_alone(g, win, len, ks);
    if (alone && sc->nruns) /* it goes on its own: the runs before it go first */
        pd_batch_flush(g, r, sc);
    while (len) {
        const int all_narrow = narrow && (!sc->nruns || sc->narrow); /* the batch's runs and this one */
        if (sc->nruns >= pd__batch_max_runs(g, all_narrow) || sc->items == PD__BATCH_ITEMS) {
            pd_batch_flush(g, r, sc);
            continue;
        }
        sc->narrow = all_narrow;
        const uint32_t take = (uint32_t)(len < PD__BATCH_ITEMS - sc->items ? len : PD__BATCH_ITEMS - sc->items);
        pd_run *ru = &sc->runs[sc->nruns];
        *ru = (pd_run){.win = *win, .v0 = v0, .d = d, .kb = kb, .ks = ks, .at = sc->items, .len = take, .alone = alone};
        uint32_t *v = sc->v + sc->items;
        uint32_t x = (uint32_t)v0; /* exact: positions are below n ≤ 2^32 */
        for (uint32_t j = 0; j < take; j++, x += (uint32_t)d)
            v[j] = x;
        memset(sc->run + sc->items, (int)sc->nruns, take);
        pd_prefetch_out(r, kb, take, ks); /* the run's output lines, wanted for writing at the flush */
        sc->items += take;
        sc->nruns++;
        if (alone)
            pd_batch_flush(g, r, sc);
        v0 += take * d;
        kb += (uint64_t)((int64_t)take * ks);
        len -= take;
    }
}

/* A run of window-relative positions v0 + j·d, j < len, in window win, whose ids go to output
 * indices kb + j·ks. */
static void pd_shard_run(const pd_gen *g, const pd_shard_req *r, pd_shard_scratch *sc, const pd_window *win,
                         uint64_t v0, uint64_t d, uint64_t len, uint64_t kb, int64_t ks)
{
    if (win->tau.n >= 2 && win->tau.n <= UINT32_MAX) {
        pd_batch_add(g, r, sc, win, v0, d, len, kb, ks);
        return;
    }
    /* one sample (σ = 0), or samples that need 64 bits: σ here, ids from the plan's table */
    pd__run run = {.perm = &win->tau, .stride = d, .out = sc->ids, .width = 8, .walk = g->walk, .unflipped = 1};
    for (uint64_t j = 0; j < len; j += run.count) {
        run.first = v0 + j * d;
        run.count = len - j < PD_SHARD_PIECE ? len - j : PD_SHARD_PIECE;
        pd__gen_run(g, &run);
        const uint64_t k = kb + (uint64_t)((int64_t)j * ks);
        for (uint64_t i = 0; i < run.count; i++)
            pd_store(r->out, r->width, k + (uint64_t)((int64_t)i * ks), pd_window_id(r->plan, win, sc->ids[i]));
    }
}

/* Subsequence c of the chunk whose first position is f (p = f + c·W < N, a body position), with key cache kc. */
static void pd_sub_init(const pd_shard_plan *plan, pd_sub *sub, uint64_t p, uint64_t n, unsigned kc)
{
    sub->kc = kc;
    const uint64_t lane = p % plan->lanes, step = p / plan->lanes, lb = pd__lane_begin(plan, lane);
    sub->back = lane % 2;
    sub->x0 = sub->back ? lb + pd__lane_length(plan, lane) - 1 - step : lb + step;
    sub->n = n;
    sub->entered = 0;
}

/* Indices [i, end) of subsequence c (output k = begin + c + i·m), run by run. */
static void pd_sub_walk(const pd_gen *g, const pd_shard_req *r, pd_shard_scratch *sc, pd_sub *sub, uint64_t k0,
                        uint64_t m, uint64_t d, uint64_t i, uint64_t end)
{
    while (i < end) {
        const uint64_t x = sub->back ? sub->x0 - i * d : sub->x0 + i * d; /* n > 1 only when i·m·W < N */
        pd_window_enter(g, r->plan, sc, sub, x);
        const pd_window *win = &sub->win;
        const uint64_t room = sub->back ? (x - win->lo) / d + 1 : (win->hi - 1 - x) / d + 1;
        const uint64_t len = room < end - i ? room : end - i;
        const uint64_t k = k0 + i * m;
        if (sub->back)
            pd_shard_run(g, r, sc, win, x - win->lo - (len - 1) * d, d, len, k + (len - 1) * m, -(int64_t)m);
        else
            pd_shard_run(g, r, sc, win, x - win->lo, d, len, k, (int64_t)m);
        i += len;
    }
}

/* Whether g has a vector interleave for m > 1 subsequences: staging pays for its extra pass only then (a
 * scalar interleave stores as many times as the strided stores it replaces). */
static int pd_interleaves(const pd_gen *g, uint64_t m)
{
    return m > 1 && (g->isa == PD_ISA_AVX512 || (g->isa == PD_ISA_AVX2 && !(m & (m - 1))));
}

/* A step's staged ids into the output: out[t·m + c] = stage[c·step + t] (row c: subsequence c's ids of
 * the step), for t < full on every row, then t = full on rows c < extra (the subsequences one longer). */
static void pd_interleave(const pd_gen *g, const void *stage, uint64_t step, uint64_t m, uint64_t full,
                          uint64_t extra, void *out, unsigned width)
{
    uint64_t t = 0;
    switch (g->isa) {
#ifdef PD_CPU_HAVE_AVX2
    case PD_ISA_AVX2:
        t = pd__interleave_avx2(stage, step, (unsigned)m, full, out, width);
        break;
#endif
#ifdef PD_CPU_HAVE_AVX512
    case PD_ISA_AVX512:
        t = pd__interleave_avx512(stage, step, (unsigned)m, full, out, width);
        break;
#endif
    default:
        break;
    }
    for (; t < full + (extra > 0); t++)
        for (uint64_t c = 0; c < (t < full ? m : extra); c++) {
            if (width == 4)
                ((uint32_t *)out)[t * m + c] = ((const uint32_t *)stage)[c * step + t];
            else
                ((uint64_t *)out)[t * m + c] = ((const uint64_t *)stage)[c * step + t];
        }
}

/* Body ids [begin, begin + count) of a request (a pd__chunk_fn). */
static void pd_shard_chunk(const pd_gen *g, void *ctx, uint64_t begin, uint64_t count)
{
    const pd_shard_req *r = ctx;
    const pd_shard_plan *plan = r->plan;
    pd_shard_scratch sc;
    sc.one_key = 0;
    sc.tabled = 0;
    for (unsigned k = 0; k < PD_SHARD_KEYSETS; k++)
        sc.kc[k].n = 0;
    sc.nruns = sc.items = 0;
    sc.narrow = 1;
    sc.subs[0].n = 0; /* count == 0 has no subsequence (and gcc -O2 cannot tell that G ≥ 1) */
    const uint64_t G = plan->lanes, W = r->world, f = r->first + begin * W;
    const uint64_t gcd = pd_gcd(G, W), m = G / gcd, d = W / gcd;
    const uint64_t subs = m < count ? m : count;
    if (subs <= PD_SHARD_SUBS) { /* side by side */
        for (uint64_t c = 0; c < subs; c++)
            pd_sub_init(plan, &sc.subs[c], f + c * W, (count - c - 1) / m + 1, (unsigned)(c % PD_SHARD_KEYSETS));
        const uint64_t longest = sc.subs[0].n, step = subs == 1 ? longest : PD_SHARD_STEP;
        pd_shard_req staged = *r; /* m > 1: each step's ids staged a subsequence a row, then interleaved */
        staged.out = longest >= PD_SHARD_STAGE_MIN && pd_interleaves(g, subs) ? malloc(subs * step * r->width) : NULL;
        for (uint64_t i = 0; i < longest; i += step) {
            if (staged.out) /* the step's output lines, written after its σ (as pd_prefetch_out's) */
                pd_prefetch_out(r, begin + i * m, (longest - i < step ? longest - i : step) * m, 1);
            for (uint64_t c = 0; c < subs; c++) {
                pd_sub *sub = &sc.subs[c];
                if (i >= sub->n) /* subsequences differ in length by one at most */
                    continue;
                const uint64_t end = sub->n - i < step ? sub->n : i + step;
                if (staged.out) /* row c of the stage, index i at column 0 */
                    pd_sub_walk(g, &staged, &sc, sub, c * step - i, 1, d, i, end);
                else
                    pd_sub_walk(g, r, &sc, sub, begin + c, m, d, i, end);
            }
            if (staged.out) {
                pd_batch_flush(g, &staged, &sc);
                const uint64_t full = sc.subs[subs - 1].n - i < step ? sc.subs[subs - 1].n - i : step;
                uint64_t extra = 0; /* rows one longer than the last (a final step only) */
                while (extra < subs && sc.subs[extra].n - i > full && full < step)
                    extra++;
                pd_interleave(g, staged.out, step, subs, full, extra, (char *)r->out + (begin + i * m) * r->width,
                              r->width);
            }
        }
        free(staged.out);
    } else { /* one after the other (each has few positions per output line anyway) */
        for (uint64_t c = 0; c < subs; c++) {
            pd_sub_init(plan, &sc.subs[0], f + c * W, (count - c - 1) / m + 1, 0);
            pd_sub_walk(g, r, &sc, &sc.subs[0], begin + c, m, d, 0, sc.subs[0].n);
        }
    }
    pd_batch_flush(g, r, &sc);
}

/* ---- Gathers: the samples at positions that follow no progression (a mixture's reads of a sharded component)
 *
 * Positions go to window-stream indices (sorted by lane first where G is small, so that each lane's indices move
 * one way), and each stretch of indices in one window is one gather of τ_w on g's σ kernel and one slot lookup:
 * about what a flat read costs, where computing every position of their span on the run kernel and keeping the
 * few read cost W evaluations a read. */

#define PD_SHARD_GATHER_LANES PD_SHARD_SUBS /* reads sorted by lane up to this G (a window and key cache each) */
/* Positions sorted by lane at a time: a mixture's sparse chunk gives a sharded component a few thousand reads, and
 * sorting them all at once makes a lane's stretches in one window 4-5 times longer than pieces of 1024 did (fewer
 * of them short enough for the scalar kernel): +15-20% a mixture read at W = 8, G = 8 (AVX2, 2026-11-28). */
#define PD_SHARD_GATHER_PIECE 4096
_Static_assert(PD_SHARD_GATHER_PIECE <= 65536, "ord holds u16");

/* The ids of window win's samples at window-relative positions v[0, len), to out[0, len) (v is overwritten). */
static void pd_gather_window(const pd_gen *g, const pd_shard_plan *plan, pd_shard_scratch *sc, const pd_window *win,
                             uint64_t *v, uint64_t len, uint64_t *out)
{
    if (win->tau.n < 2 || win->tau.n > UINT32_MAX) { /* one sample (σ = 0), or σ in 64 bits: ids from the plan */
        const pd__run run = {.perm = &win->tau, .count = len, .out = v, .width = 8, .walk = g->walk, .unflipped = 1};
        if (win->tau.n >= 2)
            pd__gather_run(g, &run, v);
        for (uint64_t j = 0; j < len; j++)
            out[j] = pd_window_id(plan, win, win->tau.n >= 2 ? v[j] : 0);
        return;
    }
    const pd__run run = {.perm = &win->tau, .count = len, .out = sc->v, .width = 4, .walk = g->walk, .unflipped = 1};
    pd__gather_run(g, &run, v);
    if (win->slots > PD_SHARD_TABLE_SLOTS || len < PD_SHARD_SHORT || (win->slots > 16 && win->slots > len)) {
        for (uint64_t j = 0; j < len; j++)
            out[j] = pd_window_id(plan, win, sc->v[j]);
        return;
    }
    if (!sc->tabled || sc->tab_w != win->w)
        pd_window_table(plan, win, sc, 8);
    pd_slots_map(g, &sc->tab, sc->v, len, out, 8, 0);
}

/* The stretches of window-stream indices x[a0, a1) (all in sub's lane), each gathered in its window; their ids
 * replace them in x. */
static void pd_gather_lane(const pd_gen *g, const pd_shard_plan *plan, pd_shard_scratch *sc, pd_sub *sub, uint64_t *x,
                           uint32_t a0, uint32_t a1)
{
    for (uint32_t a = a0, b; a < a1; a = b) {
        pd_window_enter(g, plan, sc, sub, x[a]);
        const pd_window *win = &sub->win;
        const uint32_t cap = a1 - a < PD_SHARD_PIECE ? a1 : a + PD_SHARD_PIECE; /* sc->ids' room */
        for (b = a; b < cap && x[b] >= win->lo && x[b] < win->hi; b++)
            sc->ids[b - a] = x[b] - win->lo;
        pd_gather_window(g, plan, sc, win, sc->ids, b - a, x + a); /* x[a, b) is read: its ids go there */
    }
}

void pd_gen_shard_gather_u64(const pd_gen *g, const pd_shard_plan *plan, uint64_t *at, uint64_t n)
{
    pd_shard_scratch sc;
    sc.one_key = 1;
    sc.tabled = 0;
    for (unsigned k = 0; k < PD_SHARD_KEYSETS; k++)
        sc.kc[k].n = 0;
    const uint64_t G = plan->lanes;
    const int by_lane = G > 1 && G <= PD_SHARD_GATHER_LANES;
    pd_divisor lanes;
    pd_divisor_init(&lanes, G);
    uint64_t first[PD_SHARD_GATHER_LANES], last[PD_SHARD_GATHER_LANES]; /* each lane's first and last index */
    for (uint64_t c = 0; c < (by_lane ? G : 1); c++) {
        sc.subs[c].kc = (unsigned)(c % PD_SHARD_KEYSETS);
        sc.subs[c].entered = 0;
        first[c] = pd__lane_begin(plan, c);
        last[c] = first[c] + pd__lane_length(plan, c) - 1;
    }
    uint64_t x[PD_SHARD_GATHER_PIECE]; /* window-stream indices, then their ids */
    uint16_t ord[PD_SHARD_GATHER_PIECE];
    for (uint64_t i0 = 0; i0 < n; i0 += PD_SHARD_GATHER_PIECE) {
        const uint32_t m = (uint32_t)(n - i0 < PD_SHARD_GATHER_PIECE ? n - i0 : PD_SHARD_GATHER_PIECE);
        uint64_t *p = at + i0;
        if (!by_lane) {
            for (uint32_t k = 0; k < m; k++)
                x[k] = G == 1 ? p[k] : pd__lane_index(plan, p[k]);
            pd_gather_lane(g, plan, &sc, &sc.subs[0], x, 0, m);
            memcpy(p, x, m * sizeof *p);
            continue;
        }
        /* A stable counting sort by lane (p = step·G + lane, spec §3.6; odd lanes run backward), every index
         * computed before any id is stored: the ids go where the positions were. */
        uint32_t end[PD_SHARD_GATHER_LANES + 1] = {0};
        for (uint32_t k = 0; k < m; k++)
            end[p[k] - pd_divide(&lanes, p[k]) * G + 1]++;
        for (uint64_t c = 0; c < G; c++)
            end[c + 1] += end[c];
        for (uint32_t k = 0; k < m; k++) { /* end[c]: where lane c's next read goes, finally its end */
            const uint64_t step = pd_divide(&lanes, p[k]), c = p[k] - step * G;
            const uint32_t to = end[c]++;
            ord[to] = (uint16_t)k;
            x[to] = c % 2 == 0 ? first[c] + step : last[c] - step;
        }
        for (uint64_t c = 0; c < G; c++)
            pd_gather_lane(g, plan, &sc, &sc.subs[c], x, c ? end[c - 1] : 0, end[c]);
        for (uint32_t k = 0; k < m; k++)
            p[ord[k]] = x[k];
    }
}

int pd_gen_shard_plan_init(const pd_gen *g, pd_shard_plan *plan, const uint64_t *start, uint64_t shards,
                           uint64_t seed, uint64_t epoch, uint64_t window, uint64_t lanes, void *mem,
                           size_t mem_bytes)
{
    int rc = pd__gen_check(g); /* first, as every pd_gen_* entry: a bad g leaves the plan untouched */
    if (!rc)
        rc = pd__shard_plan_begin(plan, start, shards, seed, epoch, window, lanes, mem, mem_bytes);
    if (rc)
        return rc;
    if ((rc = pd_gen_fill_u64(g, &plan->order, 0, shards, plan->slot_shard)))
        return rc;
    pd__shard_plan_end(plan);
    return PD_OK;
}

int pd_gen_shard_planner(const void *g, pd_shard_plan *plan, const uint64_t *start, uint64_t shards, uint64_t seed,
                         uint64_t epoch, uint64_t window, uint64_t lanes, void *mem, size_t mem_bytes)
{
    return pd_gen_shard_plan_init(g, plan, start, shards, seed, epoch, window, lanes, mem, mem_bytes);
}

/* Validate like pd_shard_slice_fill_* (same codes, same order) and split off the wrapped tail. */
static int pd_shard_req_init(const pd_shard_plan *plan, const pd_slice *s, uint64_t count, void *out,
                             unsigned width, const uint64_t *written, pd_shard_req *r)
{
    uint64_t left;
    if (width == 4 && plan && pd_id_width(plan->n) != 4)
        return PD_EOVERFLOW;
    if (!plan || !written || (!out && count))
        return PD_EINVAL;
    int rc = pd_slice_remaining(plan->n, s, &left);
    if (rc)
        return rc;
    if (count > left)
        count = left;
    *r = (pd_shard_req){.plan = plan, .first = s->offset + s->rank, .world = s->world, .count = count,
                        .out = out, .width = width, .total = count};
    if (count && r->first + (count - 1) * s->world >= plan->n) {
        r->has_tail = 1;
        r->tail_position = r->first + (count - 1) * s->world;
        r->count--;
    }
    return PD_OK;
}

static void pd_shard_tail(const pd_shard_req *r)
{
    pd_shard_loc loc;
    if (!r->has_tail)
        return;
    pd_shard_locate(r->plan, r->tail_position % r->plan->n, &loc); /* pad wraps */
    pd_store(r->out, r->width, r->count, loc.sample);
}

static int pd_gen_shard_fill(const pd_gen *g, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                             void *out, unsigned width, uint64_t *written)
{
    pd_shard_req r;
    int rc = pd__gen_check(g);
    if (!rc)
        rc = pd_shard_req_init(plan, s, count, out, width, written, &r);
    if (rc)
        return rc;
    if (r.count)
        pd_shard_chunk(g, &r, 0, r.count);
    pd_shard_tail(&r);
    *written = r.total;
    return PD_OK;
}

int pd_gen_shard_slice_fill_u64(const pd_gen *g, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                                uint64_t *out, uint64_t *written)
{
    return pd_gen_shard_fill(g, plan, s, count, out, 8, written);
}

int pd_gen_shard_slice_fill_u32(const pd_gen *g, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                                uint32_t *out, uint64_t *written)
{
    return pd_gen_shard_fill(g, plan, s, count, out, 4, written);
}

static int pd_pool_shard_fill(pd_pool *pool, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                              void *out, unsigned width, uint64_t *written)
{
    pd_shard_req r;
    if (!pool)
        return PD_EINVAL;
    int rc = pd_shard_req_init(plan, s, count, out, width, written, &r);
    if (rc)
        return rc;
    pd__pool_run(pool, r.count, pd_shard_chunk, &r);
    pd_shard_tail(&r);
    *written = r.total;
    return PD_OK;
}

int pd_pool_shard_slice_fill_u64(pd_pool *pool, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                                 uint64_t *out, uint64_t *written)
{
    return pd_pool_shard_fill(pool, plan, s, count, out, 8, written);
}

int pd_pool_shard_slice_fill_u32(pd_pool *pool, const pd_shard_plan *plan, const pd_slice *s, uint64_t count,
                                 uint32_t *out, uint64_t *written)
{
    return pd_pool_shard_fill(pool, plan, s, count, out, 4, written);
}
