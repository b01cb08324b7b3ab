/* sd_notify through libsystemd: readiness, stopping, and a watchdog timer on the event loop. */
#include "daemon/notify.h"

#include <stdint.h>
#include <stdio.h>

#include "daemon/log.h"

#ifdef PERMD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

static uv_timer_t pd_watchdog;
static int pd_watchdog_on;

static void pd_on_watchdog(uv_timer_t *t)
{
    (void)t;
    sd_notify(0, "WATCHDOG=1");
}

void pd_notify_ready(uv_loop_t *loop, const char *status)
{
    char msg[512];
    uint64_t usec = 0;
    snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s", status);
    int rc = sd_notify(0, msg);
    if (rc > 0)
        pd_log_info("notify", "state=ready");
    else if (rc < 0)
        pd_log_warn("notify", "state=ready err=%d", rc);
    if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000) {
        /* Ping at half the period: a loop blocked for longer gets permd restarted. */
        uv_timer_init(loop, &pd_watchdog);
        uv_timer_start(&pd_watchdog, pd_on_watchdog, usec / 2000, usec / 2000);
        uv_unref((uv_handle_t *)&pd_watchdog);
        pd_watchdog_on = 1;
        pd_log_info("notify", "watchdog_ms=%llu", (unsigned long long)(usec / 1000));
    }
}

void pd_notify_stopping(void)
{
    sd_notify(0, "STOPPING=1");
    if (pd_watchdog_on) {
        pd_watchdog_on = 0;
        uv_close((uv_handle_t *)&pd_watchdog, NULL);
    }
}

#else /* built without libsystemd: nothing to tell */

void pd_notify_ready(uv_loop_t *loop, const char *status)
{
    (void)loop;
    (void)status;
}

void pd_notify_stopping(void)
{
}

#endif
