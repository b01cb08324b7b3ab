/* Signal routing: which threads may take the signals permd handles (see sigmask.h). */
#include "daemon/sigmask.h"

void pd_sigmask_handled(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
}

/* pthread_sigmask fails only on a bad `how` or set pointer, neither possible here. */
void pd_sigmask_block(sigset_t *old)
{
    sigset_t set;
    pd_sigmask_handled(&set);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

void pd_sigmask_unblock(void)
{
    sigset_t set;
    pd_sigmask_handled(&set);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

void pd_sigmask_restore(const sigset_t *old)
{
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

int pd_sigmask_thread(pthread_t *thread, void *(*fn)(void *), void *arg)
{
    sigset_t old;
    pd_sigmask_block(&old); /* the new thread inherits the caller's mask at creation */
    int rc = pthread_create(thread, NULL, fn, arg);
    pd_sigmask_restore(&old);
    return rc;
}
