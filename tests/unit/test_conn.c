/* Tests for daemon/conn.c alone, over memory connections: frames in, backpressure and the shared output budget. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include <uv.h>

#include "test_util.h"

#include "daemon/clock.h"
#include "daemon/conn.h"
#include "daemon/metrics.h"

/* One loop's set with one memory connection whose owner counts the frames it is handed. */
typedef struct fixture {
    uv_loop_t loop;
    pd_stats stats;
    pd_metrics metrics;
    _Atomic unsigned long long total; /* every connection's output together (other loops' too) */
    pd_conn_limits lim;
    pd_conns *set;
    pd_conn *conn;
    atomic_ulong frames; /* frames the owner was handed */
} fixture;

static void on_frame(void *session, const uint8_t *payload, uint32_t len)
{
    (void)payload;
    (void)len;
    fixture *f = session;
    atomic_fetch_add(&f->frames, 1);
}
static void on_oversize(void *session, uint32_t announced, uint32_t limit)
{
    (void)session;
    (void)announced;
    (void)limit;
}
static void on_writable(void *session) { (void)session; }
static int on_end(void *session, int shutdown)
{
    (void)session;
    (void)shutdown;
    return 0;
}
static void on_stop(void *session, int closing)
{
    (void)session;
    (void)closing;
}
static void on_free(void *session) { (void)session; }
static void on_expired(void *session, int why)
{
    (void)session;
    (void)why;
}
static void sink(void *ctx, const uint8_t *data, size_t len)
{
    (void)ctx;
    (void)data;
    (void)len;
}

static const pd_conn_ops ops = {on_frame, on_oversize, on_writable, on_end, on_stop, on_free, on_expired, NULL};

enum { HELD = 100, BUDGET = 1000, OTHERS = 100000 };

/* output_memory BUDGET; the connection holds HELD bytes of its own (a stream batch promised), so the
 * budget may pause it: one that holds none would always get its next reply. */
static void open_set(fixture *f, const pd_conn_ops *conn_ops)
{
    assert_int_equal(pd_conns_create(&f->loop, &f->lim, &f->stats, &f->metrics, NULL, NULL, &f->set), 0);
    assert_int_equal(pd_conn_open_memory(f->set, 0, sink, f, &f->conn), 0);
    pd_conn_start(f->conn, conn_ops, f);
    pd_conn_job_hold(f->conn, HELD);
}

static void close_set(fixture *f)
{
    pd_conn_job_settle(f->conn, HELD);
    pd_conn_close(f->conn);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    pd_conns_free(f->set);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    f->lim = (pd_conn_limits){.output_cap = 1 << 20, .output_memory = BUDGET, .output_total = &f->total,
                              .max_frame = 1 << 16};
    open_set(f, &ops);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    close_set(f);
    assert_int_equal(uv_loop_close(&f->loop), 0);
    free(f);
    return 0;
}

static const uint8_t two_frames[8]; /* two empty frames: a 4-byte length of 0 each */

/* Past the budget, a connection with output of its own leaves its frames unread and counts a pause; once the
 * total falls, what a write completion does (pd_conn_maybe_resume) hands them over. */
static void test_budget_pauses_and_resumes(void **state)
{
    fixture *f = *state;
    atomic_fetch_add(&f->total, OTHERS); /* other connections' output */
    pd_conn_input(f->conn, two_frames, sizeof two_frames);
    assert_int_equal(atomic_load(&f->frames), 0);
    assert_true(pd_conn_congested(f->conn));
    assert_int_equal(atomic_load(&f->stats.output_memory_pauses), 1);

    atomic_fetch_sub(&f->total, OTHERS);
    assert_false(pd_conn_congested(f->conn));
    pd_conn_maybe_resume(f->conn);
    assert_int_equal(atomic_load(&f->frames), 2);
}

/* Without a budget the same total pauses nothing. */
static void test_no_budget_no_pause(void **state)
{
    fixture *f = *state;
    close_set(f); /* the set keeps its own copy of the limits: a new one with the key off */
    f->lim.output_memory = 0;
    open_set(f, &ops);

    atomic_fetch_add(&f->total, OTHERS);
    pd_conn_input(f->conn, two_frames, sizeof two_frames);
    assert_int_equal(atomic_load(&f->frames), 2);
    assert_int_equal(atomic_load(&f->stats.output_memory_pauses), 0);
    atomic_fetch_sub(&f->total, OTHERS);
}

/* Another loop moves the total while this one reads: whatever it saw, no frame may be left unread and
 * unpaused, where only more bytes from the peer (which may send none: a Cancel awaiting its StreamEnd)
 * would hand it over. Before the fix a stop for congestion judged at one instant and a pause decided at
 * another lost frames within a few dozen rounds. */
typedef struct mover {
    fixture *f;
    atomic_int run, hold, holding;
} mover;

static void *move_total(void *arg)
{
    mover *m = arg;
    while (atomic_load(&m->run)) {
        if (atomic_load(&m->hold)) { /* the test checks with the total within the budget */
            atomic_store(&m->holding, 1);
            sched_yield();
            continue;
        }
        atomic_fetch_add(&m->f->total, OTHERS);
        for (volatile int i = 0; i < 50; i++)
            ;
        atomic_fetch_sub(&m->f->total, OTHERS);
        for (volatile int i = 0; i < 50; i++)
            ;
    }
    return NULL;
}

static void test_moving_total_loses_no_frame(void **state)
{
    fixture *f = *state;
    mover m = {.f = f, .run = 1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, move_total, &m), 0);
    const int rounds = test_quick() ? 2000 : 100000;
    unsigned long sent = 0, lost = 0;
    for (int r = 0; r < rounds && !lost; r++) {
        pd_conn_input(f->conn, two_frames, sizeof two_frames);
        sent += 2;
        atomic_store(&m.holding, 0);
        atomic_store(&m.hold, 1);
        while (!atomic_load(&m.holding))
            sched_yield();
        pd_conn_maybe_resume(f->conn); /* the connection's next write completion */
        lost = sent - atomic_load(&f->frames);
        atomic_store(&m.hold, 0);
    }
    atomic_store(&m.run, 0);
    pthread_join(th, NULL);
    assert_int_equal(lost, 0);
}

/* The same race where the connection's own output is between half its cap and its cap, so that a write completion
 * does not resume it at once: a pass that stalled with whole frames buffered must not leave the frame clock
 * running, or a sweep answers a complete request with a frame timeout (PD_CONN_FRAME) while the peer drains. */
static atomic_int expirations;

static void count_expired(void *session, int why)
{
    (void)session;
    if (why == PD_CONN_FRAME)
        atomic_fetch_add(&expirations, 1);
}

static const pd_conn_ops counting_ops = {on_frame, on_oversize, on_writable, on_end, on_stop, on_free, count_expired,
                                         NULL};

static void test_stalled_frames_do_not_expire(void **state)
{
    fixture *f = *state;
    close_set(f); /* a set with cap 150, so that HELD is past half of it */
    f->lim.output_cap = 150;
    f->lim.frame_timeout_ms = 10;
    open_set(f, &counting_ops);
    atomic_store(&expirations, 0);

    mover m = {.f = f, .run = 1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, move_total, &m), 0);
    const int rounds = test_quick() ? 2000 : 100000;
    unsigned long sent = 0;
    for (int r = 0; r < rounds && !atomic_load(&expirations); r++) {
        pd_conn_input(f->conn, two_frames, sizeof two_frames);
        sent += 2;
        atomic_store(&m.holding, 0);
        atomic_store(&m.hold, 1);
        while (!atomic_load(&m.holding))
            sched_yield();
        pd_conns_sweep(f->set, pd_clock_ms() + 1000); /* long past frame_timeout_ms */
        /* The peer drained: the promised output goes, and the write completion resumes the connection. */
        pd_conn_job_settle(f->conn, HELD);
        pd_conn_maybe_resume(f->conn);
        pd_conn_job_hold(f->conn, HELD);
        atomic_store(&m.hold, 0);
    }
    atomic_store(&m.run, 0);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&expirations), 0);
    assert_int_equal(atomic_load(&f->frames), sent);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_budget_pauses_and_resumes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_budget_no_pause, setup, teardown),
        cmocka_unit_test_setup_teardown(test_moving_total_loses_no_frame, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stalled_frames_do_not_expire, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
