/* Leveled key=value logging to stderr; each line is formatted in full and written with one call. */
#include "daemon/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

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
