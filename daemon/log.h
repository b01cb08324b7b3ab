/* Daemon logging: one line per event on stderr, "time level=… event=… key=value …". */
#ifndef PD_LOG_H
#define PD_LOG_H

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

#define pd_log_error(event, ...) pd_log(PD_LOG_ERROR, event, __VA_ARGS__)
#define pd_log_warn(event, ...) pd_log(PD_LOG_WARN, event, __VA_ARGS__)
#define pd_log_info(event, ...) pd_log(PD_LOG_INFO, event, __VA_ARGS__)
#define pd_log_debug(event, ...)                                                                 \
    do {                                                                                         \
        if (pd_log_enabled(PD_LOG_DEBUG))                                                        \
            pd_log(PD_LOG_DEBUG, event, __VA_ARGS__);                                            \
    } while (0)

#endif
