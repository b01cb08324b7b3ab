/* permd's configuration: one table drives the YAML file, the command-line flags, the defaults and the docs. */
#ifndef PD_CONFIG_H
#define PD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct pd_config_dataset {
    char *name;
    uint64_t size;
} pd_config_dataset;

/* A list of uids (allow_uids). */
typedef struct pd_uid_list {
    uint32_t *uids;
    size_t n;
} pd_uid_list;

/* Every field has a default (pd_config_init), may be set by the file and
 * overridden by a flag. Strings are owned; "" means "not set" or "auto". */
typedef struct pd_config {
    char *socket;        /* Unix socket path; "" = $PERMD_SOCKET, $XDG_RUNTIME_DIR/permd.sock or /tmp/permd-UID/ */
    uint64_t socket_mode;
    pd_uid_list allow_uids; /* empty = whoever socket_mode admits */
    char *tcp;           /* HOST:PORT; "" = no TCP listener */
    char *token_file;
    char *metrics;       /* HOST:PORT of the Prometheus endpoint; "" = off */
    int metrics_given;   /* metrics was set (file or flag), if only to its default: then it must bind */
    uint64_t metrics_connections;
    uint64_t metrics_timeout_ms;
    uint64_t metrics_max_head; /* bytes of a scraper's request head */
    uint64_t metrics_cache_ms; /* a /metrics body is served again this long; 0 = rendered each scrape */
    char *state_dir;     /* "" = $STATE_DIRECTORY, $XDG_STATE_HOME/permd or ~/.local/state/permd */
    uint64_t fresh_registry; /* 1: move a damaged registry aside and start afresh */
    uint64_t log_level;  /* pd_log_level */
    uint64_t peer_log_rate; /* lines a second of each warning a peer can cause; 0 = no limit */
    uint64_t workers;    /* 0 = one per CPU */
    uint64_t loops;      /* event loops serving connections; 0 = min(CPUs, 4) */
    uint64_t max_frame;
    uint64_t max_connections;     /* Unix socket */
    uint64_t max_tcp_connections;
    uint64_t hello_timeout_ms;
    uint64_t max_preauth_frame;
    uint64_t frame_timeout_ms;
    uint64_t error_linger_ms; /* after a closing error: how long to discard input, waiting for the peer's EOF */
    uint64_t max_count;
    uint64_t max_digest;
    uint64_t max_inverse_work;
    uint64_t max_shards;
    uint64_t upload_memory;
    uint64_t upload_timeout_ms;
    uint64_t layout_memory;
    uint64_t mixture_memory;
    uint64_t max_mixture_components;
    uint64_t max_mixture_stages;
    uint64_t plan_cache;
    uint64_t plan_cache_bytes;
    uint64_t output_cap;
    uint64_t output_memory;
    uint64_t registry_busy_ms;
    uint64_t max_streams;
    uint64_t max_credits;
    uint64_t stream_ahead;
    uint64_t readahead_bytes; /* largest Fetch reply generated ahead; 0 = off */
    uint64_t stream_ring_max; /* bytes; 0 = no shared-memory rings */
    uint64_t stream_ring_total; /* bytes of rings alive at once, all connections */
    uint64_t inline_ids;
    uint64_t cpu_spin_us;
    uint64_t job_slice_ids;
    uint64_t shutdown_timeout_ms;
    char *cpu_isa;       /* auto | scalar | avx2 | avx512 */
    uint64_t cpu_threads; /* 0 = one per CPU */
    char *gpu;           /* auto | off */
    uint64_t gpu_device;
    uint64_t gpu_min_ids;
    char *gpu_library;   /* "" = beside the executable, then the loader's path */
    char *delivery_library;
    uint64_t delivery_timeout_ms;
    uint64_t max_group_members;
    uint64_t max_groups;
    uint64_t max_group_sends;
    uint64_t max_request_memory; /* bytes one request may take decoded */
    pd_config_dataset *datasets;
    size_t ndatasets;
} pd_config;

/* Embedded defaults. PD_ENOMEM. */
int pd_config_init(pd_config *c);
void pd_config_free(pd_config *c);

/* Set one key from text, as the file and flags do. PD_ENOTFOUND for an
 * unknown key, PD_EINVAL/PD_ERANGE for a bad value; err (may be NULL) gets
 * a message naming the key. */
int pd_config_set(pd_config *c, const char *key, const char *value, char *err, size_t errlen);

/* Append a dataset declaration ("NAME:SIZE" on the command line). */
int pd_config_add_dataset(pd_config *c, const char *name, const char *size, char *err, size_t errlen);

/* Load a YAML file over the current values (unknown keys are errors). */
int pd_config_load_file(pd_config *c, const char *path, char *err, size_t errlen);

/* Whether metrics holds its built-in default, not given (a busy default port is not fatal; one asked for is). */
int pd_config_metrics_is_default(const pd_config *c);

/* Cross-key checks: TCP address syntax, a token file for non-loopback TCP,
 * dataset names and duplicates. */
int pd_config_validate(const pd_config *c, char *err, size_t errlen);

/* Parse argv: defaults, then --config FILE, then every other flag.
 * *check_only is set by --check-config. Returns 0, 1 after printing help
 * or the version (exit 0), or a negative PD_E* after writing err. */
int pd_config_from_args(pd_config *c, int argc, char **argv, int *check_only, char *err, size_t errlen);

/* Resolve the "" defaults of socket and state_dir into buffers. */
int pd_config_socket_path(const pd_config *c, char *buf, size_t len);
int pd_config_state_dir(const pd_config *c, char *buf, size_t len);

/* Write the documented YAML template (every key commented with its default),
 * or the effective values. config/permd.yaml is the template. */
void pd_config_write_template(FILE *f);
void pd_config_write_effective(const pd_config *c, FILE *f);

/* The keys whose values differ between a and b ("datasets" for the declared list), at most cap of
 * them, in the table's order; returns how many. */
size_t pd_config_diff(const pd_config *a, const pd_config *b, const char **keys, size_t cap);

/* Flag help generated from the table. */
void pd_config_write_usage(FILE *f);

/* fn(ctx, key, value) for each numeric key (limits, budgets, timeouts, counts) as set, in the table's order: /metrics
 * shows each limit beside the gauge it bounds. */
void pd_config_each_number(const pd_config *c, void (*fn)(void *ctx, const char *key, uint64_t value), void *ctx);

/* Whether a host string names the loopback interface (127.0.0.0/8, ::1, localhost). */
int pd_config_host_is_loopback(const char *host);

#endif
