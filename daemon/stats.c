/* Prometheus text and StatsReply, rendered from a snapshot of every loop's counters. */
#include "daemon/stats.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "daemon/reqtype.h"

/* ---- Prometheus text ------------------------------------------------------------- */

typedef struct pd_text {
    char *p;
    size_t len, cap;
    int failed;
} pd_text;

static void pd_text_add(pd_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pd_text_add(pd_text *t, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !t->failed; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 > t->len + (size_t)n + 1 ? t->cap * 2 : t->len + (size_t)n + 1;
        char *q = realloc(t->p, cap);
        if (!q) {
            t->failed = 1;
            return;
        }
        t->p = q;
        t->cap = cap;
    }
}

static void pd_text_family(pd_text *t, const char *name, const char *type, const char *help)
{
    pd_text_add(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void pd_text_u64(pd_text *t, const char *name, const char *type, const char *help, uint64_t v)
{
    pd_text_family(t, name, type, help);
    pd_text_add(t, "%s %llu\n", name, (unsigned long long)v);
}

/* Request types worth a series: every request the protocol defines, and the
 * others once they occurred. */
static int pd_slot_shown(const pd_metrics *m, int slot)
{
    if (slot < PD_REQ_UNKNOWN)
        return pd_reqtype_name(slot) != NULL;
    return m->requests[slot] || pd_metrics_slot_errors(m, slot);
}

int pd_stats_render(const pd_stats_view *v, char **out, size_t *len)
{
    const pd_stats *st = &v->stats;
    const pd_metrics *m = &v->metrics;
    pd_text t = {.cap = 16384};
    if (!(t.p = malloc(t.cap)))
        return PD_ENOMEM;
    pd_text_family(&t, "permd_build_info", "gauge", "permd's version, protocol and spec (always 1).");
    pd_text_add(&t, "permd_build_info{version=\"%s\",protocol=\"%u\",spec=\"1\"} 1\n", PERMD_VERSION,
                PD_PROTOCOL_VERSION);
    pd_text_family(&t, "permd_uptime_seconds", "gauge", "Seconds since permd started.");
    pd_text_add(&t, "permd_uptime_seconds %.3f\n", (double)v->uptime_ms / 1e3);
    pd_text_u64(&t, "permd_connections_open", "gauge", "Client connections open now.", st->connections);
    pd_text_u64(&t, "permd_connections_accepted_total", "counter", "Client connections accepted.",
                st->connections_total);
    pd_text_family(&t, "permd_connections_rejected_total", "counter",
                   "Connections refused at accept, by reason (max_connections, peer_uid, max_tcp_connections).");
    for (int r = 0; r < PD_REJECT_NREASONS; r++)
        pd_text_add(&t, "permd_connections_rejected_total{reason=\"%s\"} %llu\n",
                    pd_metrics_reject_name((pd_reject_reason)r), (unsigned long long)m->rejected[r]);
    pd_text_family(&t, "permd_connections_expired_total", "counter",
                   "Connections closed because a deadline passed (hello_timeout, frame_timeout).");
    for (int r = 0; r < PD_EXPIRE_NREASONS; r++)
        pd_text_add(&t, "permd_connections_expired_total{reason=\"%s\"} %llu\n",
                    pd_metrics_expire_name((pd_expire_reason)r), (unsigned long long)m->expired[r]);
    pd_text_u64(&t, "permd_http_evicted_total", "counter",
                "Metrics scrapers closed to make room for newer ones (metrics_connections).", v->http_evicted);
    pd_text_u64(&t, "permd_http_expired_total", "counter",
                "Metrics scrapers closed at metrics_timeout_ms before their request arrived whole.", v->http_expired);
    pd_text_u64(&t, "permd_http_cache_hits_total", "counter",
                "Scrapes of /metrics answered with a body rendered earlier, less than metrics_cache_ms before.",
                v->http_cache_hits);

    pd_text_family(&t, "permd_log_suppressed_total", "counter",
                   "Log lines of warnings a peer can cause at will (auth_fail, conn_reject, ...) not written because "
                   "they came faster than peer_log_rate a second, by event (those that occurred).");
    for (size_t i = 0; i < v->nlog_suppressed; i++)
        pd_text_add(&t, "permd_log_suppressed_total{event=\"%s\"} %llu\n", v->log_suppressed[i].event,
                    (unsigned long long)v->log_suppressed[i].lines);

    pd_text_family(&t, "permd_requests_total", "counter", "Requests received, by type.");
    for (int k = 0; k < PD_REQ_NTYPES; k++)
        if (pd_slot_shown(m, k))
            pd_text_add(&t, "permd_requests_total{type=\"%s\"} %llu\n", pd_reqtype_name(k),
                        (unsigned long long)m->requests[k]);
    pd_text_family(&t, "permd_request_errors_total", "counter", "Error replies, by request type and error code.");
    for (int k = 0; k < PD_REQ_NTYPES; k++)
        for (unsigned e = 0; e < PD_METRICS_CODES; e++)
            if (m->errors[k][e])
                pd_text_add(&t, "permd_request_errors_total{type=\"%s\",code=\"%s\"} %llu\n",
                            pd_reqtype_name(k), pd_wire_error_name((Permd__V1__ErrorCode)e),
                            (unsigned long long)m->errors[k][e]);

    pd_text_family(&t, "permd_request_duration_seconds", "histogram",
                   "From a request's complete frame to its reply queued for the socket, by type.");
    for (int k = 0; k < PD_REQ_NTYPES; k++) {
        if (!pd_slot_shown(m, k))
            continue;
        const char *name = pd_reqtype_name(k);
        uint64_t cum = 0;
        for (unsigned b = 0; b < PD_LATENCY_NBOUNDS; b++) {
            cum += m->latency[k][b];
            pd_text_add(&t, "permd_request_duration_seconds_bucket{type=\"%s\",le=\"%g\"} %llu\n", name,
                        (double)pd_latency_bounds_us[b] / 1e6, (unsigned long long)cum);
        }
        cum += m->latency[k][PD_LATENCY_NBOUNDS];
        pd_text_add(&t, "permd_request_duration_seconds_bucket{type=\"%s\",le=\"+Inf\"} %llu\n", name,
                    (unsigned long long)cum);
        pd_text_add(&t, "permd_request_duration_seconds_sum{type=\"%s\"} %.9f\n", name,
                    (double)m->latency_sum_ns[k] / 1e9);
        pd_text_add(&t, "permd_request_duration_seconds_count{type=\"%s\"} %llu\n", name,
                    (unsigned long long)cum);
    }

    pd_text_u64(&t, "permd_ids_served_total", "counter", "Sample ids sent in Fetch replies and stream batches.",
                st->ids_served_total);
    pd_text_family(&t, "permd_ids_generated_total", "counter", "Sample ids generated, by backend (cpu, gpu).");
    pd_text_add(&t, "permd_ids_generated_total{backend=\"cpu\"} %llu\n", (unsigned long long)v->cpu_ids);
    pd_text_add(&t, "permd_ids_generated_total{backend=\"gpu\"} %llu\n", (unsigned long long)v->gpu_ids);
    pd_text_u64(&t, "permd_gpu_fallbacks_total", "counter",
                "Requests the GPU failed (out of device memory, or a CUDA error), served by the CPU instead.",
                v->gpu_fallbacks);
    pd_text_u64(&t, "permd_gpu_off", "gauge",
                "1 once a CUDA error turned the GPU off (many are sticky: the context is lost): every request runs "
                "on the CPU until permd restarts.",
                (uint64_t)v->gpu_off);
    pd_text_u64(&t, "permd_cpu_pool_spin_catches_total", "counter",
                "Times a CPU pool helper found a split request's work while polling (cpu_spin_us) or "
                "in the yield before it, without a wake-up (one request can count once per helper).",
                v->pool_caught);
    pd_text_u64(&t, "permd_cpu_pool_sleeps_total", "counter",
                "Times a CPU pool helper went to sleep (to be woken by a split request, which may find "
                "its work already taken).",
                v->pool_slept);
    pd_text_u64(&t, "permd_bytes_sent_total", "counter", "Bytes of replies handed to the sockets.",
                st->bytes_out_total);
    pd_text_u64(&t, "permd_bytes_received_total", "counter", "Bytes of requests read from the sockets.",
                m->bytes_in);
    pd_text_u64(&t, "permd_worker_queue_depth", "gauge", "Worker-pool jobs queued or running.", v->jobs);
    pd_text_u64(&t, "permd_worker_jobs_total", "counter",
                "Worker-pool jobs queued (requests too large for the loop's inline budget, stream batches, "
                "each turn of a long Digest or Inverse).",
                st->jobs_total);
    pd_text_u64(&t, "permd_workers", "gauge", "Worker-pool threads.", v->workers);
    pd_text_u64(&t, "permd_streams_open", "gauge", "Streams running now.", st->streams_active);
    pd_text_u64(&t, "permd_streams_opened_total", "counter", "Streams opened.", st->streams_total);
    pd_text_u64(&t, "permd_mix_orders_built_total", "counter",
                "Sharded component orders built for mixtures (O(shards) each); a mixture plan's cursors keep "
                "those of their last two component epochs for the next requests.",
                st->mix_orders_built);
    pd_text_u64(&t, "permd_backpressure_pauses_total", "counter",
                "Times a connection was paused because its unread output exceeded output_cap, or because "
                "every connection's together exceeded output_memory.",
                st->backpressure_pauses);
    pd_text_u64(&t, "permd_output_memory_pauses_total", "counter",
                "Of those, the pauses of connections within their output_cap: every connection's output "
                "together exceeded output_memory.",
                st->output_memory_pauses);
    pd_text_u64(&t, "permd_output_bytes", "gauge",
                "Bytes of replies and stream batches queued for clients, or promised by jobs running, all "
                "connections together (past output_memory, connections that hold some wait).",
                v->output_bytes);
    pd_text_u64(&t, "permd_readahead_hits_total", "counter",
                "Fetches answered from a readahead: generated while the loop was idle, because the "
                "connection reads its slice in order.",
                st->readahead_hits);
    pd_text_u64(&t, "permd_inline_deferred_total", "counter",
                "Fetches, stream batches and Inverses the loop began itself and handed to a worker "
                "instead: a mixture's idle cursor went to another thread between the loop's check and its use.",
                st->inline_deferred);
    pd_text_u64(&t, "permd_accept_errors_total", "counter",
                "Connections permd could not accept: out of descriptors (RLIMIT_NOFILE) or memory. Each is "
                "logged (accept, warn).",
                st->accept_errors);
    pd_text_u64(&t, "permd_stream_ring_fds", "gauge",
                "Descriptors of stream rings permd holds (one a ring, kept to send a spare ring again); new "
                "rings are declined past RLIMIT_NOFILE less the connections' share.",
                v->ring_fds);
    pd_text_u64(&t, "permd_stream_rings_total", "counter",
                "Streams whose batches went through a shared-memory ring instead of the socket.",
                st->stream_rings_total);
    pd_text_family(&t, "permd_stream_rings_declined_total", "counter",
                   "Streams that asked for a shared-memory ring and went through the socket, by reason (tcp, off, "
                   "stream_ring_max, stream_ring_total, descriptors, memory, socket_busy).");
    for (int r = 0; r < PD_RING_DECLINE_NREASONS; r++)
        pd_text_add(&t, "permd_stream_rings_declined_total{reason=\"%s\"} %llu\n",
                    pd_metrics_ring_decline_name((pd_ring_decline)r), (unsigned long long)m->rings_declined[r]);
    pd_text_u64(&t, "permd_stream_ring_bytes", "gauge",
                "Bytes of shared-memory stream rings counted in stream_ring_total: in use, kept by a connection "
                "for its next stream, or ended streams' that their client may still map (until it asks to reuse "
                "them or closes).",
                v->ring_bytes);
    pd_text_u64(&t, "permd_uploads_expired_total", "counter",
                "Unfinished sharded uploads dropped, with their memory, because no part came within upload_timeout_ms.",
                st->uploads_expired);
    pd_text_u64(&t, "permd_delivery_groups", "gauge", "NCCL delivery groups alive (at most max_groups).", v->groups);
    pd_text_u64(&t, "permd_delivery_sends_queued", "gauge",
                "Delivers queued in the delivery groups, not yet sent (at most max_group_sends a group).",
                v->group_sends);
    pd_text_u64(&t, "permd_upload_bytes", "gauge",
                "Bytes of shard sizes held by unfinished sharded uploads (bounded by upload_memory).",
                v->upload_bytes);
    pd_text_u64(&t, "permd_layout_bytes", "gauge",
                "Bytes of shard layouts the registry holds (bounded by layout_memory).", v->layout_bytes);
    pd_text_u64(&t, "permd_request_memory_bytes", "gauge",
                "Bytes of decoded requests (and replies built from them) that connections hold now; each "
                "request's decoding is bounded by max_request_memory, and released once it is answered.",
                st->request_memory);
    pd_text_u64(&t, "permd_reply_blocks_reused_total", "counter",
                "Large replies (stream batches and Fetches above 256 KiB through the socket) written into the "
                "block a connection's last one left, instead of a new one mapped and faulted in.",
                st->blocks_reused);
    pd_text_u64(&t, "permd_reply_block_bytes", "gauge",
                "Bytes of large reply blocks connections keep for their next one (one each at most, given back "
                "within a second once unused).",
                st->block_bytes);
    pd_text_u64(&t, "permd_readahead_bytes", "gauge",
                "Bytes of readahead buffers connections hold: one as big as its Fetches' replies (at most "
                "readahead_bytes) for each that read its slice in order with Fetches that fit it.",
                st->readahead_bytes);
    pd_text_u64(&t, "permd_plan_bytes", "gauge",
                "Bytes of sharded epoch and mixture plans alive: cached, in use, or admitted and being built, and "
                "mixtures' cursors (at most plan_cache_bytes, or one larger plan and one cursor of it).",
                v->plan_bytes);
    pd_text_u64(&t, "permd_plan_cursor_bytes", "gauge",
                "Of permd_plan_bytes, mixtures' cursors: 32 bytes a shard of each sharded component, one per "
                "request reading the mixture at once (and a few kept idle with their plan).",
                v->plan_cursor_bytes);
    pd_text_u64(&t, "permd_datasets", "gauge", "Datasets registered (stored and declared).",
                v->datasets);
    pd_text_u64(&t, "permd_mixtures", "gauge", "Mixtures registered.", v->mixtures);
    pd_text_u64(&t, "permd_mixture_bytes", "gauge",
                "Bytes the registered mixtures' definitions hold (bounded by mixture_memory for new puts).",
                v->mixture_bytes);
    pd_text_u64(&t, "permd_registry_checkpoint_failures_total", "counter",
                "Registry commits whose checkpoint into registry.db failed (disk full, a reader holding the "
                "WAL): durable in registry.db-wal, folded in by a later commit or startup.",
                v->registry_checkpoint_failures);
    pd_text_family(&t, "permd_config", "gauge",
                   "The numeric config keys as set (config/permd.yaml; 0 where the key says so means one per CPU, "
                   "off or no limit): each limit beside the gauges it bounds.");
    for (size_t i = 0; i < v->nconfig; i++)
        pd_text_add(&t, "permd_config{key=\"%s\"} %llu\n", v->config[i].key, (unsigned long long)v->config[i].value);
    if (t.failed) {
        free(t.p);
        return PD_ENOMEM;
    }
    *out = t.p;
    *len = t.len;
    return 0;
}

/* ---- StatsReply ----------------------------------------------------------------------- */

int pd_stats_fill_reply(const pd_stats_view *v, Permd__V1__StatsReply *r, pd_arena *arena)
{
    const pd_stats *st = &v->stats;
    const pd_metrics *m = &v->metrics;
    size_t ntypes = 0, nerr = 0;
    for (int k = 0; k < PD_REQ_NTYPES; k++) {
        ntypes += pd_slot_shown(m, k) != 0;
        for (unsigned e = 0; e < PD_METRICS_CODES; e++)
            nerr += m->errors[k][e] != 0;
    }
    Permd__V1__RequestStats *req = pd_arena_alloc(arena, ntypes * sizeof *req + 1);
    Permd__V1__RequestStats **reqp = pd_arena_alloc(arena, ntypes * sizeof *reqp + 1);
    uint64_t *buckets = pd_arena_alloc(arena, ntypes * (PD_LATENCY_NBOUNDS + 1) * sizeof *buckets + 1);
    Permd__V1__ErrorStats *err = pd_arena_alloc(arena, nerr * sizeof *err + 1);
    Permd__V1__ErrorStats **errp = pd_arena_alloc(arena, nerr * sizeof *errp + 1);
    if (!req || !reqp || !buckets || !err || !errp)
        return PD_ENOMEM;

    r->connections = (uint32_t)st->connections;
    r->connections_total = st->connections_total;
    r->requests_total = st->requests_total;
    r->errors_total = st->errors_total;
    r->ids_served_total = st->ids_served_total;
    r->bytes_out_total = st->bytes_out_total;
    r->streams_active = (uint32_t)st->streams_active;
    r->streams_total = st->streams_total;
    r->backpressure_pauses = st->backpressure_pauses;
    r->cpu_ids_total = v->cpu_ids;
    r->gpu_ids_total = v->gpu_ids;
    r->queue_depth = v->jobs;
    r->bytes_in_total = m->bytes_in;
    r->readahead_hits_total = st->readahead_hits;
    r->stream_rings_total = st->stream_rings_total;
    r->connections_rejected_total = 0;
    for (int k = 0; k < PD_REJECT_NREASONS; k++)
        r->connections_rejected_total += m->rejected[k];
    r->n_latency_bounds_us = PD_LATENCY_NBOUNDS;
    r->latency_bounds_us = (uint64_t *)pd_latency_bounds_us;

    size_t i = 0, j = 0;
    for (int k = 0; k < PD_REQ_NTYPES; k++) {
        for (unsigned e = 0; e < PD_METRICS_CODES; e++) {
            if (!m->errors[k][e])
                continue;
            permd__v1__error_stats__init(&err[j]);
            err[j].type = (char *)pd_reqtype_name(k);
            err[j].code = (Permd__V1__ErrorCode)e;
            err[j].count = m->errors[k][e];
            errp[j] = &err[j];
            j++;
        }
        if (!pd_slot_shown(m, k))
            continue;
        permd__v1__request_stats__init(&req[i]);
        req[i].type = (char *)pd_reqtype_name(k);
        req[i].requests = m->requests[k];
        req[i].errors = pd_metrics_slot_errors(m, k);
        req[i].latency_sum_us = m->latency_sum_ns[k] / 1000;
        req[i].n_latency_buckets = PD_LATENCY_NBOUNDS + 1;
        req[i].latency_buckets = buckets + i * (PD_LATENCY_NBOUNDS + 1);
        for (unsigned b = 0; b <= PD_LATENCY_NBOUNDS; b++)
            req[i].latency_buckets[b] = m->latency[k][b];
        reqp[i] = &req[i];
        i++;
    }
    r->n_requests = i;
    r->requests = reqp;
    r->n_errors = j;
    r->errors = errp;
    return 0;
}
