/* The wiring: builds the model, the service and the event loops, binds the listeners, and runs until a graceful shutdown. */
#ifndef PD_SERVER_H
#define PD_SERVER_H

#include <uv.h>

#include "daemon/config.h"
#include "daemon/stats.h"

/*
 * permd serves connections on several event loops (config key loops): one loop of one thread
 * saturates long before the machine does. The primary loop (the one pd_server_create is given)
 * binds the listeners, handles signals and /metrics, and hands each accepted connection to the
 * loops in turn; each loop has its own thread, connections (daemon/conn.h), counters, inline
 * budget and readahead queue (daemon/service.h), and shares the config, registry, plans, delivery
 * groups and backend (each safe to use from several threads). A connection lives on one loop.
 */
typedef struct pd_server pd_server;

/* Open the registry, declare config datasets, start the loops, bind the listeners. Logs and returns
 * a PD_E* on failure (the caller exits non-zero; *out is then NULL).
 * Signals: it blocks SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 on the calling thread, so every
 * thread it starts inherits the block (daemon/sigmask.h); pd_server_run lifts it on that thread while
 * the loop runs, and pd_server_free, called on the same thread, restores the caller's mask. After a
 * stop, those five signals stay ignored (SIG_IGN) for the rest of the process. */
int pd_server_create(uv_loop_t *loop, const pd_config *cfg, unsigned workers, pd_server **out);

/* Where SIGHUP reads the configuration again: fill fresh (initialized with defaults) as at
 * startup; 0, or a PD_E* with a message in err. Without one, SIGHUP is logged and ignored. */
typedef int (*pd_reload_fn)(void *ctx, pd_config *fresh, char *err, size_t errlen);
void pd_server_on_reload(pd_server *s, pd_reload_fn fn, void *ctx);

/* Run the primary loop until a graceful shutdown completes. */
int pd_server_run(pd_server *s);

/* Stop accepting, end streams, let in-flight replies flush, then close. Idempotent. */
void pd_server_stop(pd_server *s);

/* Every loop's counters and the server's gauges (any thread). */
void pd_server_totals(pd_server *s, pd_stats_view *v);

/* The registry it serves (for tests that reset it between runs). */
struct pd_registry *pd_server_registry(pd_server *s);

/* Release everything (after run returns). NULL is a no-op. */
void pd_server_free(pd_server *s);

#endif
