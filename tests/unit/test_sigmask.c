/* Unit: daemon/sigmask.c — the handled set, block/unblock/restore, threads that start with the set blocked. */
#include <pthread.h>
#include <signal.h>

#include "test_util.h"

#include "daemon/sigmask.h"

static int all_blocked(const sigset_t *mask)
{
    sigset_t set;
    pd_sigmask_handled(&set);
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&set, s) == 1 && sigismember(mask, s) != 1)
            return 0;
    return 1;
}

static int none_blocked(const sigset_t *mask)
{
    sigset_t set;
    pd_sigmask_handled(&set);
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&set, s) == 1 && sigismember(mask, s) == 1)
            return 0;
    return 1;
}

static sigset_t current(void)
{
    sigset_t m;
    pthread_sigmask(SIG_SETMASK, NULL, &m);
    return m;
}

static void test_handled_set(void **state)
{
    (void)state;
    sigset_t set;
    pd_sigmask_handled(&set);
    assert_int_equal(sigismember(&set, SIGTERM), 1);
    assert_int_equal(sigismember(&set, SIGINT), 1);
    assert_int_equal(sigismember(&set, SIGHUP), 1);
    assert_int_equal(sigismember(&set, SIGUSR1), 1);
    assert_int_equal(sigismember(&set, SIGUSR2), 1);
    assert_int_equal(sigismember(&set, SIGSEGV), 0); /* synchronous faults stay deliverable */
    assert_int_equal(sigismember(&set, SIGPIPE), 0);
}

/* The test process may have inherited any mask: main() opens the handled set first (see there). */
static void test_block_unblock_restore(void **state)
{
    (void)state;
    sigset_t before = current(), old;
    assert_true(none_blocked(&before));
    pd_sigmask_block(&old);
    sigset_t now = current();
    assert_true(all_blocked(&now));
    assert_true(none_blocked(&old));
    pd_sigmask_unblock();
    now = current();
    assert_true(none_blocked(&now));
    pd_sigmask_block(NULL);
    pd_sigmask_restore(&old);
    now = current();
    assert_true(none_blocked(&now));
}

static void *report_mask(void *arg)
{
    *(sigset_t *)arg = current();
    return NULL;
}

/* The caller takes the signals; its thread does not, and the caller's own mask is unchanged. */
static void test_thread_starts_blocked(void **state)
{
    (void)state;
    sigset_t seen, before = current();
    assert_true(none_blocked(&before));
    pthread_t t;
    assert_int_equal(pd_sigmask_thread(&t, report_mask, &seen), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(all_blocked(&seen));
    sigset_t after = current();
    assert_true(none_blocked(&after));
    /* Negative control: plain pthread_create inherits the caller's open mask. */
    assert_int_equal(pthread_create(&t, NULL, report_mask, &seen), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(none_blocked(&seen));
}

int main(void)
{
    /* Start from none of the handled signals blocked, whatever the runner's mask was. */
    sigset_t set;
    pd_sigmask_handled(&set);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handled_set),
        cmocka_unit_test(test_block_unblock_restore),
        cmocka_unit_test(test_thread_starts_blocked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
