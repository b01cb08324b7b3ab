/* Hello: the protocol version, the server's limits and features, and the TCP token check; Stats: every loop's counters. */
#include "daemon/hello.h"

#include <string.h>

#include "core/error.h"
#include "daemon/clock.h"
#include "daemon/log.h"
#include "daemon/registry.h"
#include "daemon/reply.h"
#include "daemon/stats.h"

/* Token comparison in time independent of where the first difference is. */
static int pd_token_equal(const char *given, const char *want, size_t want_len)
{
    size_t given_len = strlen(given);
    unsigned diff = given_len != want_len;
    for (size_t i = 0; i < want_len; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < given_len ? given[i] : 0);
    return diff == 0;
}

void pd_on_hello(pd_session *s, uint64_t id, const Permd__V1__Hello *m)
{
    const pd_service *svc = s->svc;
    const pd_config *cfg = svc->cfg;
    const pd_access *access = atomic_load(&s->svc->access);
    if (m->protocol_version && m->protocol_version != PD_PROTOCOL_VERSION) {
        pd_reply_error(s, id, PD_EINVAL, "protocol version %u is not supported; this server speaks %u",
                       m->protocol_version, PD_PROTOCOL_VERSION);
        return;
    }
    if (pd_conn_is_tcp(s->conn) && access->token) {
        if (!pd_token_equal(m->token, access->token, access->token_len)) {
            /* Rate-limited: a peer may try a token per connection, as fast as it can connect. */
            pd_log_warn_peer("auth_fail", "conn=%llu peer=%s", (unsigned long long)pd_conn_serial(s->conn),
                             pd_conn_peer(s->conn));
            pd_reply_error(s, id, PD_EAUTH, m->token[0] ? "wrong token" : "this listener requires a token");
            pd_conn_drain_close(s->conn);
            return;
        }
        pd_session_authenticate(s);
    }
    static char *features[] = {"datasets", "fetch", "stream", "inverse", "stats", "shards", "digest", "nccl", "stream_ring", "mixtures"};
    Permd__V1__Limits lim = PERMD__V1__LIMITS__INIT;
    lim.max_frame = (uint32_t)cfg->max_frame;
    lim.max_count = cfg->max_count;
    lim.max_streams = (uint32_t)cfg->max_streams;
    lim.max_credits = (uint32_t)cfg->max_credits;
    lim.output_cap = cfg->output_cap;
    lim.max_digest = cfg->max_digest;
    Permd__V1__HelloReply r = PERMD__V1__HELLO_REPLY__INIT;
    r.protocol_version = PD_PROTOCOL_VERSION;
    r.spec_version = 1;
    r.server = "permd " PERMD_VERSION;
    r.n_features = sizeof features / sizeof features[0];
    r.features = features;
    r.limits = &lim;
    pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_HELLO_REPLY, &r);
}

void pd_on_stats(pd_session *s, uint64_t id, const Permd__V1__Stats *m)
{
    const pd_service *svc = s->svc;
    pd_stats_view v;
    (void)m;
    svc->totals(svc->totals_ctx, &v);
    Permd__V1__StatsReply r = PERMD__V1__STATS_REPLY__INIT;
    r.server = "permd " PERMD_VERSION;
    r.uptime_ms = pd_clock_ms() - svc->started_ms;
    r.datasets = (uint32_t)pd_registry_count(svc->reg);
    r.workers = svc->workers;
    if (pd_stats_fill_reply(&v, &r, &s->arena)) { /* every loop's counters, and the by-type tables */
        pd_reply_error(s, id, PD_EINTERNAL, "out of memory");
        return;
    }
    pd_reply(s, id, PERMD__V1__ENVELOPE__BODY_STATS_REPLY, &r);
}
