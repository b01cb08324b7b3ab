/* The service manager's protocol (sd_notify): READY=1 once listening, STOPPING=1 on shutdown, watchdog pings. */
#ifndef PD_NOTIFY_H
#define PD_NOTIFY_H

#include <uv.h>

/* Tell systemd (Type=notify) that permd serves; start pinging its watchdog
 * from a loop timer when WatchdogSec= is set, so a stuck loop gets permd
 * restarted. A no-op without $NOTIFY_SOCKET or without libsystemd at build
 * time. status is a one-line STATUS= text. */
void pd_notify_ready(uv_loop_t *loop, const char *status);
/* STOPPING=1, and stop the watchdog timer (its handle is closed). */
void pd_notify_stopping(void);

#endif
