/* Leveled key=value logging to stderr; each line is formatted in full and written with one call. */
#include "daemon/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/clock.h"

static const char *const pd_log_names[] = {"error", "warn", "info", "debug"};
static _Atomic int pd_log_threshold = PD_LOG_INFO; /* set at startup and on SIGHUP, read by every thread */

int pd_log_level_parse(const char *s, pd_log_level *out)
{
    for (int l = PD_LOG_ERROR; l <= PD_LOG_DEBUG; l++) {
        if (!strcmp(s, pd_log_names[l])) {
            *out = (pd_log_level)l;
            return 0;
        }
    }
    return PD_EINVAL;
}

const char *pd_log_level_name(pd_log_level level)
{
    return (unsigned)level <= PD_LOG_DEBUG ? pd_log_names[level] : "?";
}

void pd_log_set_level(pd_log_level level)
{
    pd_log_threshold = (int)level;
}

int pd_log_enabled(pd_log_level level)
{
    return (int)level <= pd_log_threshold;
}

void pd_log(pd_log_level level, const char *event, const char *fields, ...)
{
    if (!pd_log_enabled(level))
        return;
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    int w = snprintf(line + n, sizeof line - n, ".%03ldZ level=%s event=%s ", ts.tv_nsec / 1000000L,
                     pd_log_level_name(level), event);
    if (w > 0)
        n += (size_t)w < sizeof line - n ? (size_t)w : sizeof line - n - 1;
    va_list ap;
    va_start(ap, fields);
    w = vsnprintf(line + n, sizeof line - n, fields, ap);
    va_end(ap);
    if (w > 0)
        n += (size_t)w < sizeof line - n ? (size_t)w : sizeof line - n - 1;
    if (n > 0 && line[n - 1] == ' ')
        n--; /* no fields */
    for (size_t i = 0; i < n; i++) /* one event, one line: a value never breaks it */
        if ((unsigned char)line[i] < 0x20)
            line[i] = ' ';
    line[n++] = '\n';
    ssize_t rc = write(STDERR_FILENO, line, n); /* one write: lines from threads never interleave */
    (void)rc;
}

/* ---- Lines a peer can cause at will ------------------------------------------------------------ */

typedef struct pd_log_limit {
    const char *event;   /* NULL: the slot is free */
    int started;         /* a second has begun */
    uint64_t second_at;  /* when the current second began */
    uint64_t written;    /* lines written in it */
    uint64_t pending;    /* lines suppressed and not yet reported */
    uint64_t suppressed; /* lines suppressed ever */
} pd_log_limit;

static pthread_mutex_t pd_log_limits_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the table */
static pd_log_limit pd_log_limits[PD_LOG_PEER_EVENTS];
static _Atomic uint64_t pd_log_peer_rate = 10;
static uint64_t (*_Atomic pd_log_peer_now)(void) = pd_clock_ms;

void pd_log_set_peer_rate(uint64_t lines_per_sec)
{
    pd_log_peer_rate = lines_per_sec;
}

void pd_log_set_peer_clock(uint64_t (*now_ms)(void))
{
    pd_log_peer_now = now_ms ? now_ms : pd_clock_ms;
}

/* The event's slot (taken on its first line); the last one is shared by events beyond the table.
 * Caller holds the lock. */
static pd_log_limit *pd_log_limit_of(const char *event)
{
    for (size_t i = 0; i < PD_LOG_PEER_EVENTS - 1; i++) {
        pd_log_limit *l = &pd_log_limits[i];
        if (!l->event)
            l->event = event;
        if (!strcmp(l->event, event))
            return l;
    }
    pd_log_limit *other = &pd_log_limits[PD_LOG_PEER_EVENTS - 1];
    other->event = "other";
    return other;
}

/* The lines to report of l, when its second is over (and a new one begins if `begin`). Caller holds
 * the lock. */
static uint64_t pd_log_limit_roll(pd_log_limit *l, uint64_t now, int begin)
{
    if (l->started && now - l->second_at < 1000)
        return 0;
    uint64_t report = l->pending;
    l->pending = 0;
    if (begin) {
        l->started = 1;
        l->second_at = now;
        l->written = 0;
    }
    return report;
}

static void pd_log_suppressed_line(const char *event, uint64_t lines)
{
    pd_log(PD_LOG_WARN, "log_suppressed",
           "of=%s lines=%llu msg=\"lines past peer_log_rate a second were not written\"", event,
           (unsigned long long)lines);
}

int pd_log_peer_pass(const char *event)
{
    uint64_t now = pd_log_peer_now(), rate = pd_log_peer_rate;
    pthread_mutex_lock(&pd_log_limits_lock);
    pd_log_limit *l = pd_log_limit_of(event);
    uint64_t report = pd_log_limit_roll(l, now, 1);
    int pass = rate == 0 || l->written < rate;
    if (pass) {
        l->written++;
    } else {
        l->pending++;
        l->suppressed++;
    }
    const char *name = l->event;
    pthread_mutex_unlock(&pd_log_limits_lock);
    if (report) /* before the line it precedes; two threads' lines may interleave, never their counts */
        pd_log_suppressed_line(name, report);
    return pass;
}

void pd_log_peer_flush(void)
{
    uint64_t now = pd_log_peer_now();
    pd_log_suppressed out[PD_LOG_PEER_EVENTS];
    size_t n = 0;
    pthread_mutex_lock(&pd_log_limits_lock);
    for (size_t i = 0; i < PD_LOG_PEER_EVENTS && pd_log_limits[i].event; i++) {
        uint64_t report = pd_log_limit_roll(&pd_log_limits[i], now, 0);
        if (report)
            out[n++] = (pd_log_suppressed){pd_log_limits[i].event, report};
    }
    pthread_mutex_unlock(&pd_log_limits_lock);
    for (size_t i = 0; i < n; i++)
        pd_log_suppressed_line(out[i].event, out[i].lines);
}

size_t pd_log_peer_suppressed(pd_log_suppressed *out, size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(&pd_log_limits_lock);
    for (size_t i = 0; i < PD_LOG_PEER_EVENTS && n < cap; i++)
        if (pd_log_limits[i].event)
            out[n++] = (pd_log_suppressed){pd_log_limits[i].event, pd_log_limits[i].suppressed};
    pthread_mutex_unlock(&pd_log_limits_lock);
    return n;
}
