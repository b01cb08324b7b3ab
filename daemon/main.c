/* permd: parse the configuration, size the worker pool, run the server until SIGTERM/SIGINT. */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "core/error.h"
#include "daemon/auth.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "proto/endpoint.h"

/* Exit codes: 0 clean (including after SIGTERM/SIGINT), 1 startup failed, 2 bad configuration. */
enum { PD_EXIT_OK = 0, PD_EXIT_FAIL = 1, PD_EXIT_CONFIG = 2 };

/* The command line, for SIGHUP: the file it names is read again, its flags still override. */
typedef struct pd_args {
    int argc;
    char **argv;
} pd_args;

static int pd_reload_from_args(void *ctx, pd_config *fresh, char *err, size_t errlen)
{
    const pd_args *a = ctx;
    int check_only;
    int rc = pd_config_from_args(fresh, a->argc, a->argv, &check_only, err, errlen);
    return rc > 0 ? 0 : rc;
}

/* --check-config: what the configuration alone can tell (no socket, no registry). */
static int pd_check_config(const pd_config *cfg)
{
    char path[4096];
    if (cfg->token_file[0]) { /* as permd would load it: an empty first line or a FIFO fails here too */
        char *token = NULL;
        size_t len = 0;
        char why[256];
        const int rc = pd_auth_load_token(cfg->token_file, &token, &len);
        free(token);
        if (rc) {
            fprintf(stderr, "permd: token_file %s: %s\n", cfg->token_file, pd_strerror(rc));
            return PD_EXIT_CONFIG;
        }
        if (pd_auth_token_fits(len, cfg->max_preauth_frame, why, sizeof why)) {
            fprintf(stderr, "permd: token_file %s: %s\n", cfg->token_file, why);
            return PD_EXIT_CONFIG;
        }
    }
    /* The socket as the environment resolves it now: pd_config_validate saw only an explicit one. */
    size_t max = pd_endpoint_unix_path_max();
    if (pd_config_socket_path(cfg, path, sizeof path)) {
        fprintf(stderr, "permd: socket: the default path is longer than %zu bytes, the most a Unix socket's holds\n",
                max);
        return PD_EXIT_CONFIG;
    }
    if (strlen(path) > max) {
        fprintf(stderr, "permd: socket: %s is %zu bytes; a Unix socket path holds at most %zu\n", path,
                strlen(path), max);
        return PD_EXIT_CONFIG;
    }
    char sock[4096];
    memcpy(sock, path, sizeof sock);
    int rc = pd_config_state_dir(cfg, path, sizeof path);
    if (rc) {
        if (rc == PD_ETOOBIG)
            fprintf(stderr, "permd: state_dir: the path is longer than %zu bytes\n", sizeof path - 1);
        else
            fprintf(stderr, "permd: no state directory: set state_dir (HOME is not set either)\n");
        return PD_EXIT_CONFIG;
    }
    pd_config_write_effective(cfg, stdout);
    /* What the empty and zero values above ("the default") come to in this environment, on this machine. */
    printf("# resolved here: socket %s, state_dir %s, workers %u\n", sock, path,
           cfg->workers ? (unsigned)cfg->workers : uv_available_parallelism());
    fprintf(stderr, "permd: configuration OK\n");
    return PD_EXIT_OK;
}

int main(int argc, char **argv)
{
    pd_config cfg;
    char err[512] = "";
    int check_only = 0, status = PD_EXIT_OK;
    signal(SIGPIPE, SIG_IGN); /* a peer that went away is an error return, not a signal */
    /* Under a file-size limit (ulimit -f, systemd's LimitFSIZE) a write past it would kill permd;
     * ignored, it fails with EFBIG and SQLite reports a full disk, which permd answers and survives. */
    signal(SIGXFSZ, SIG_IGN);
    /* A request's scratch (a mixture's sparse fill: ~250 KiB in arrays below the mmap threshold) is
     * freed at its end; glibc would give the heap's top back to the kernel each time (past 128 KiB)
     * and fault it in again on the next request. Keep up to 4 MiB of freed top: the page faults go,
     * and RSS still falls back after a burst (the load tests bound its growth to 8-16 MiB). Setting it
     * freezes glibc's mmap threshold at 128 KiB, which a 65536-id reply (256-512 KiB) and a mixture part's
     * scratch pass: each was mapped, faulted in page by page and unmapped (with a TLB shootdown) per
     * request, ~50 faults a Fetch. Blocks up to 1 MiB come from the heap instead. Larger ones are mapped
     * per use and given back: raising the threshold past them (16 MiB) kept what hostile peers' partial
     * frames had taken in the heap after they left (test_hardening). Large replies, which would pay a
     * mapping each (a socket Stream of 4 MiB batches ran at half its rate), reuse a block of their
     * connection's instead (daemon/conn.c, pd_conn_take_block). */
    mallopt(M_TRIM_THRESHOLD, 4 << 20);
    mallopt(M_MMAP_THRESHOLD, 1 << 20);

    if (pd_config_init(&cfg)) {
        fprintf(stderr, "permd: out of memory\n");
        return PD_EXIT_FAIL;
    }
    int rc = pd_config_from_args(&cfg, argc, argv, &check_only, err, sizeof err);
    if (rc != 0) {
        pd_config_free(&cfg);
        if (rc > 0)
            return PD_EXIT_OK; /* --help, --version, --print-template */
        fprintf(stderr, "permd: %s\n", err);
        return PD_EXIT_CONFIG;
    }
    if (check_only) {
        status = pd_check_config(&cfg);
        pd_config_free(&cfg);
        return status;
    }
    pd_log_set_level((pd_log_level)cfg.log_level);

    /* libuv sizes its pool from the environment at first use. */
    unsigned workers = cfg.workers ? (unsigned)cfg.workers : uv_available_parallelism();
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%u", workers);
    setenv("UV_THREADPOOL_SIZE", nbuf, 1);
    /* Never NVLink multicast (docs/nccl.md): it can take a shared host's GPUs down, and point-to-point sends have no
     * use for it. NCCL reads it when the first group forms; set here, before any thread, since setenv is not safe
     * beside a getenv on another thread. */
    setenv("NCCL_NVLS_ENABLE", "0", 1);

    uv_loop_t loop;
    pd_server *srv;
    if (uv_loop_init(&loop)) {
        fprintf(stderr, "permd: cannot create the event loop\n");
        pd_config_free(&cfg);
        return PD_EXIT_FAIL;
    }
    if (pd_server_create(&loop, &cfg, workers, &srv) == 0) {
        pd_args args = {argc, argv};
        pd_server_on_reload(srv, pd_reload_from_args, &args);
        pd_server_run(srv);
        pd_stats_view v;
        pd_server_totals(srv, &v);
        pd_server_free(srv);
        pd_log_info("stopped", "requests=%llu connections=%llu", (unsigned long long)v.stats.requests_total,
                    (unsigned long long)v.stats.connections_total);
    } else {
        status = PD_EXIT_FAIL;
    }
    if (uv_loop_close(&loop))
        pd_log_warn("loop_close", "msg=\"handles still open\"");
    pd_config_free(&cfg);
    return status;
}
