/* Daemon logging: one line per event on stderr, "time level=… event=… key=value …". */
#ifndef PD_LOG_H
#define PD_LOG_H

#include <stddef.h>
#include <stdint.h>

typedef enum pd_log_level {
    PD_LOG_ERROR = 0,
    PD_LOG_WARN = 1,
    PD_LOG_INFO = 2,
    PD_LOG_DEBUG = 3,
} pd_log_level;

/* Parse "error" | "warn" | "info" | "debug"; PD_EINVAL otherwise. */
int pd_log_level_parse(const char *s, pd_log_level *out);
const char *pd_log_level_name(pd_log_level level);

/* Lines above this level are dropped (default info). Set at startup and on reload; any thread. */
void pd_log_set_level(pd_log_level level);
int pd_log_enabled(pd_log_level level);

/* Write one line. `fields` is a printf format of space-separated key=value
 * pairs (quote values that may hold spaces: msg="%s"). Thread-safe: the
 * line goes out in a single write. */
void pd_log(pd_log_level level, const char *event, const char *fields, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- Lines a peer can cause at will (a wrong token, a connection refused or timed out) ----------
 * Each such event writes at most peer_log_rate lines a second (pd_log_set_peer_rate), so that a
 * hostile peer cannot fill the log (or the disk under it) with one line per attempt: lines past the
 * rate are counted, not written, and one line, event=log_suppressed of=EVENT lines=N, says how many
 * once their second is over (before the event's next line, or at pd_log_peer_flush). Any thread. */

#define PD_LOG_PEER_EVENTS 16 /* distinct events limited; more share the last slot, named "other" */

/* Lines a second each event may write; 0: no limit. Set at startup and on reload. */
void pd_log_set_peer_rate(uint64_t lines_per_sec);
/* Where the limiter reads the time (monotonic ms); NULL: pd_clock_ms. For tests. */
void pd_log_set_peer_clock(uint64_t (*now_ms)(void));
/* Whether a line of event (a string that lives for ever, e.g. a literal) may be written now: 1, after
 * writing the summary of the event's lines suppressed in a second that is over, if any; 0 when it is
 * past the rate (counted). pd_log_warn_peer calls it. */
int pd_log_peer_pass(const char *event);
/* Write the summaries of seconds that are over (the server's sweep calls it, so that the count of a
 * flood that stopped is not left unsaid until the event's next line). */
void pd_log_peer_flush(void);

typedef struct pd_log_suppressed {
    const char *event;
    uint64_t lines; /* not written since permd started */
} pd_log_suppressed;
/* The events limited so far (those that occurred) and their suppressed lines, at most cap of them;
 * returns how many (permd_log_suppressed_total{event}). */
size_t pd_log_peer_suppressed(pd_log_suppressed *out, size_t cap);

#define pd_log_warn_peer(event, ...)                                                             \
    do {                                                                                         \
        if (pd_log_enabled(PD_LOG_WARN) && pd_log_peer_pass(event))                              \
            pd_log(PD_LOG_WARN, event, __VA_ARGS__);                                             \
    } while (0)

#define pd_log_error(event, ...) pd_log(PD_LOG_ERROR, event, __VA_ARGS__)
#define pd_log_warn(event, ...) pd_log(PD_LOG_WARN, event, __VA_ARGS__)
#define pd_log_info(event, ...) pd_log(PD_LOG_INFO, event, __VA_ARGS__)
#define pd_log_debug(event, ...)                                                                 \
    do {                                                                                         \
        if (pd_log_enabled(PD_LOG_DEBUG))                                                        \
            pd_log(PD_LOG_DEBUG, event, __VA_ARGS__);                                            \
    } while (0)

#endif
