/* Counter arithmetic for the per-loop totals and the by-type tables; rendering lives in daemon/stats.c. */
#include "daemon/metrics.h"

const uint64_t pd_latency_bounds_us[PD_LATENCY_NBOUNDS] = {
    10,     25,     50,      100,     250,     500,     1000,    2500,    5000,    10000,
    25000,  50000,  100000,  250000,  500000,  1000000, 2500000, 5000000, 10000000,
};

const char *pd_metrics_reject_name(pd_reject_reason r)
{
    static const char *const names[PD_REJECT_NREASONS] = {"max_connections", "peer_uid", "max_tcp_connections"};
    return (unsigned)r < PD_REJECT_NREASONS ? names[r] : "?";
}

const char *pd_metrics_expire_name(pd_expire_reason r)
{
    static const char *const names[PD_EXPIRE_NREASONS] = {"hello_timeout", "frame_timeout"};
    return (unsigned)r < PD_EXPIRE_NREASONS ? names[r] : "?";
}

const char *pd_metrics_ring_decline_name(pd_ring_decline r)
{
    static const char *const names[PD_RING_DECLINE_NREASONS] = {
        "tcp", "off", "stream_ring_max", "stream_ring_total", "descriptors", "memory", "socket_busy"};
    return (unsigned)r < PD_RING_DECLINE_NREASONS ? names[r] : "?";
}

void pd_metrics_request(pd_metrics *m, int slot)
{
    m->requests[slot]++;
}

void pd_metrics_error(pd_metrics *m, int slot, unsigned code)
{
    unsigned k = code < PD_METRICS_CODES ? code : PD_METRICS_CODES - 1;
    m->errors[slot][k]++;
}

void pd_metrics_latency(pd_metrics *m, int slot, uint64_t ns)
{
    unsigned b = 0;
    while (b < PD_LATENCY_NBOUNDS && ns > pd_latency_bounds_us[b] * 1000)
        b++;
    m->latency[slot][b]++;
    m->latency_sum_ns[slot] += ns;
}

uint64_t pd_metrics_slot_errors(const pd_metrics *m, int slot)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < PD_METRICS_CODES; k++)
        n += m->errors[slot][k];
    return n;
}

void pd_metrics_add(pd_metrics *into, const pd_metrics *what)
{
    for (int k = 0; k < PD_REQ_NTYPES; k++) {
        into->requests[k] += what->requests[k];
        into->latency_sum_ns[k] += what->latency_sum_ns[k];
        for (unsigned e = 0; e < PD_METRICS_CODES; e++)
            into->errors[k][e] += what->errors[k][e];
        for (unsigned b = 0; b <= PD_LATENCY_NBOUNDS; b++)
            into->latency[k][b] += what->latency[k][b];
    }
    into->bytes_in += what->bytes_in;
    for (int r = 0; r < PD_REJECT_NREASONS; r++)
        into->rejected[r] += what->rejected[r];
    for (int r = 0; r < PD_EXPIRE_NREASONS; r++)
        into->expired[r] += what->expired[r];
    for (int r = 0; r < PD_RING_DECLINE_NREASONS; r++)
        into->rings_declined[r] += what->rings_declined[r];
}

void pd_stats_add(pd_stats *into, const pd_stats *what)
{
    into->connections_total += what->connections_total;
    into->requests_total += what->requests_total;
    into->errors_total += what->errors_total;
    into->ids_served_total += what->ids_served_total;
    into->bytes_out_total += what->bytes_out_total;
    into->streams_total += what->streams_total;
    into->backpressure_pauses += what->backpressure_pauses;
    into->output_memory_pauses += what->output_memory_pauses;
    into->mix_orders_built += what->mix_orders_built;
    into->readahead_hits += what->readahead_hits;
    into->inline_deferred += what->inline_deferred;
    into->stream_rings_total += what->stream_rings_total;
    into->uploads_expired += what->uploads_expired;
    into->jobs_total += what->jobs_total;
    into->accept_errors += what->accept_errors;
    into->connections += what->connections;
    into->streams_active += what->streams_active;
    into->request_memory += what->request_memory;
    into->readahead_bytes += what->readahead_bytes;
    into->blocks_reused += what->blocks_reused;
    into->block_bytes += what->block_bytes;
}
