/* The two exports of permd's counters: Prometheus text for /metrics and StatsReply for permctl stats. */
#ifndef PD_STATS_H
#define PD_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/log.h"
#include "daemon/metrics.h"
#include "proto/arena.h"
#include "proto/frame.h"

/* Everything the exports show, gathered by whoever can see every serving loop (daemon/server.c). */
#define PD_STATS_CONFIG_MAX 96 /* numeric config keys shown (config.c has fewer) */

typedef struct pd_stats_view {
    pd_stats stats;     /* every loop's, added up */
    pd_metrics metrics; /* likewise */
    unsigned jobs;      /* worker-pool jobs in flight */
    unsigned workers;
    uint64_t uptime_ms;
    uint64_t cpu_ids, gpu_ids; /* ids each backend generated */
    uint64_t gpu_fallbacks;    /* requests the GPU failed, served by the CPU */
    int gpu_off;               /* a CUDA error turned the GPU off until restart */
    uint64_t pool_caught, pool_slept; /* CPU pool helpers: work found polling, sleeps (cpu_spin_us) */
    uint64_t ring_bytes;       /* shared-memory stream rings alive */
    uint64_t ring_fds;         /* their descriptors permd holds */
    uint64_t upload_bytes;     /* shard sizes held by unfinished uploads */
    uint64_t output_bytes;     /* output every connection has queued or promised (output_memory) */
    uint64_t groups;           /* delivery groups alive (max_groups) */
    uint64_t group_sends;      /* Delivers queued in them, not yet sent (max_group_sends each) */
    uint64_t layout_bytes;     /* shard layouts the registry holds */
    uint64_t plan_bytes;       /* sharded epoch plans alive */
    uint64_t plan_cursor_bytes; /* of plan_bytes, mixtures' cursors */
    uint64_t http_evicted;     /* metrics scrapers evicted to make room */
    uint64_t http_expired;     /* metrics scrapers closed at metrics_timeout_ms, their request unfinished */
    uint64_t http_cache_hits;  /* scrapes answered with a body rendered earlier (metrics_cache_ms) */
    uint64_t datasets;         /* registered */
    uint64_t mixtures;         /* registered */
    uint64_t mixture_bytes;    /* their definitions (mixture_memory) */
    uint64_t registry_checkpoint_failures; /* commits left in the registry's WAL by a failed checkpoint */
    pd_log_suppressed log_suppressed[PD_LOG_PEER_EVENTS]; /* lines of peer-caused warnings not written */
    size_t nlog_suppressed;
    struct { const char *key; uint64_t value; } config[PD_STATS_CONFIG_MAX]; /* numeric config keys (limits) */
    size_t nconfig;
} pd_stats_view;

/* The Prometheus text exposition (format 0.0.4), in a malloc'd buffer. PD_ENOMEM. */
int pd_stats_render(const pd_stats_view *v, char **out, size_t *len);

/* Fill StatsReply's counter fields and by-type tables (arrays allocated in arena); the caller sets
 * server, uptime, datasets and workers. PD_ENOMEM. */
int pd_stats_fill_reply(const pd_stats_view *v, Permd__V1__StatsReply *r, pd_arena *arena);

#endif
