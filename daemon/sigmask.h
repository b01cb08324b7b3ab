/* Signal routing: only loop 0's thread takes the signals permd handles, and only while it runs. */
#ifndef PD_SIGMASK_H
#define PD_SIGMASK_H

#include <pthread.h>
#include <signal.h>

/* Why: the kernel gives a process-directed signal to any thread that does not block it, and libuv
 * gives a signal back its default action when its last watcher closes. Were another thread able to
 * take a second SIGTERM while loop 0 closes its watchers at shutdown, the default action would kill
 * permd mid-exit (a supervisor's retry, Ctrl-C twice). So every other thread starts with these
 * signals blocked, and loop 0 blocks them before it closes its watchers. */

/* Fill *set with the signals permd handles: SIGTERM and SIGINT (stop), SIGHUP (reload), SIGUSR1 and
 * SIGUSR2 (ignored). */
void pd_sigmask_handled(sigset_t *set);

/* Block the handled signals on the calling thread; threads it creates afterwards inherit the block.
 * *old (when not NULL) receives the previous mask, for pd_sigmask_restore. */
void pd_sigmask_block(sigset_t *old);

/* Unblock the handled signals on the calling thread (loop 0's, while its loop runs). */
void pd_sigmask_unblock(void);

/* Set the calling thread's mask back to one pd_sigmask_block saved. */
void pd_sigmask_restore(const sigset_t *old);

/* pthread_create, the new thread starting with the handled signals blocked whatever the caller's
 * mask. Returns pthread_create's result (0 or an errno value). */
int pd_sigmask_thread(pthread_t *thread, void *(*fn)(void *), void *arg);

#endif
