/* Sessions: admission, the transport's callbacks (frames to the dispatch table, drains to streams), and teardown. */
#include "daemon/session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "daemon/auth.h"
#include "daemon/clock.h"
#include "daemon/datasets.h"
#include "daemon/dispatch.h"
#include "daemon/groups.h"
#include "daemon/log.h"
#include "daemon/readahead.h"
#include "daemon/reply.h"
#include "daemon/stream.h"

#define PD_ARENA_SIZE (16u << 10) /* unpacked requests; larger ones spill to malloc */

int pd_session_admit(pd_service *svc, int is_tcp)
{
    /* Each transport has its own cap: peers on the network can never take the Unix socket's places. */
    unsigned max = (unsigned)(is_tcp ? svc->cfg->max_tcp_connections : svc->cfg->max_connections);
    _Atomic unsigned *open = &svc->conns_open[is_tcp != 0];
    unsigned n = atomic_load(open);
    do {
        if (n >= max)
            return 0;
    } while (!atomic_compare_exchange_weak(open, &n, n + 1));
    return 1;
}

void pd_session_release(pd_service *svc, int is_tcp)
{
    atomic_fetch_sub(&svc->conns_open[is_tcp != 0], 1);
}

/* ---- The transport's callbacks ------------------------------------------------------------- */

static void pd_session_on_frame(void *session, const uint8_t *payload, uint32_t len)
{
    pd_dispatch_frame(session, payload, len);
}

static void pd_session_on_oversize(void *session, uint32_t announced, uint32_t limit)
{
    pd_session *s = session;
    s->loop->stats.requests_total++;
    pd_metrics_request(&s->loop->metrics, PD_REQ_INVALID);
    /* Until a token Hello, the limit is max_preauth_frame (pd_session_open): name the key that applied. */
    pd_reply_error(s, 0, PD_ETOOBIG, "frame of %u bytes exceeds %s (%u bytes)", announced,
                   s->authed ? "max_frame" : "max_preauth_frame", limit);
}

static void pd_session_on_writable(void *session)
{
    pd_streams_pump(session);
}

static int pd_session_on_end(void *session, int shutdown)
{
    return pd_streams_end_all(session, shutdown);
}

static void pd_session_on_stop(void *session, int closing)
{
    pd_session *s = session;
    pd_streams_discard_all(s);
    if (!closing)
        return;
    pd_readahead_drop(s);
    pd_groups_conn_gone(s->svc->groups, s);
    if (s->admitted) {
        s->admitted = 0;
        pd_session_release(s->svc, pd_conn_is_tcp(s->conn));
    }
}

static void pd_session_on_free(void *session)
{
    pd_session *s = session;
    pd_streams_free(s);
    pd_upload_free(s->upload);
    pd_arena_free(&s->arena);
    free(s);
}

static void pd_session_on_expired(void *session, int why)
{
    pd_session *s = session;
    const pd_config *cfg = s->svc->cfg;
    pd_expire_reason r = why == PD_CONN_FRAME ? PD_EXPIRE_FRAME : PD_EXPIRE_HELLO;
    s->loop->metrics.expired[r]++;
    pd_log_warn_peer("conn_expire", "conn=%llu peer=%s reason=%s", (unsigned long long)pd_conn_serial(s->conn),
                     pd_conn_peer(s->conn), pd_metrics_expire_name(r));
    if (r == PD_EXPIRE_FRAME)
        pd_reply_error(s, 0, PD_EPROTO, "a frame did not arrive whole within frame_timeout_ms (%llu ms)",
                       (unsigned long long)cfg->frame_timeout_ms);
    else
        pd_reply_error(s, 0, PD_EAUTH, "no Hello with the token within hello_timeout_ms (%llu ms)",
                       (unsigned long long)cfg->hello_timeout_ms);
}

static void pd_session_on_alarm(void *session)
{
    pd_datasets_on_alarm(session); /* the only alarm a session sets: its upload's */
}

static const pd_conn_ops pd_session_ops = {
    .frame = pd_session_on_frame,
    .oversize = pd_session_on_oversize,
    .writable = pd_session_on_writable,
    .end = pd_session_on_end,
    .stop = pd_session_on_stop,
    .free = pd_session_on_free,
    .expired = pd_session_on_expired,
    .alarm = pd_session_on_alarm,
};

/* ---- Opening ------------------------------------------------------------------------------- */

/* allow_uids: a Unix peer whose uid is not listed (or cannot be read: the list is a promise) is refused. */
static int pd_session_peer_refused(pd_session *s, const pd_access *access)
{
    const pd_uid_list *allow = &access->allow_uids;
    int fd;
    uint32_t uid = UINT32_MAX;
    if (allow->n == 0 || pd_conn_is_tcp(s->conn))
        return 0;
    if (pd_conn_fd(s->conn, &fd) == 0 && pd_auth_peer_uid(fd, &uid) == 0 && pd_auth_uid_allowed(allow, uid))
        return 0;
    s->loop->metrics.rejected[PD_REJECT_PEER_UID]++;
    if (uid == UINT32_MAX) {
        int err = errno; /* before the limiter's clock and lock */
        pd_log_warn_peer("conn_reject", "conn=%llu reason=peer_uid msg=\"no peer credentials: %s\"",
                         (unsigned long long)pd_conn_serial(s->conn), strerror(err));
        pd_reply_error(s, 0, PD_EAUTH, "permd could not read this connection's peer credentials");
    } else {
        pd_log_warn_peer("conn_reject", "conn=%llu reason=peer_uid uid=%u",
                         (unsigned long long)pd_conn_serial(s->conn), uid);
        pd_reply_error(s, 0, PD_EAUTH, "uid %u is not in permd's allow_uids", uid);
    }
    return 1;
}

void pd_session_open(pd_loop *l, pd_conn *c, int admitted)
{
    pd_service *svc = l->svc;
    const pd_config *cfg = svc->cfg;
    const pd_access *access = atomic_load(&svc->access);
    int is_tcp = pd_conn_is_tcp(c);
    pd_session *s = calloc(1, sizeof *s);
    if (!s || pd_arena_init(&s->arena, PD_ARENA_SIZE)) {
        pd_log_warn("accept", "err=ENOMEM");
        free(s);
        if (admitted)
            pd_session_release(svc, is_tcp);
        pd_conn_close(c);
        return;
    }
    s->conn = c;
    s->loop = l;
    s->svc = svc;
    s->admitted = (unsigned)admitted;
    s->authed = !(is_tcp && access->token);
    if (!s->authed) { /* until a good Hello: small frames, and not for long */
        pd_conn_set_max_frame(c, (uint32_t)cfg->max_preauth_frame);
        pd_conn_set_deadline(c, pd_clock_ms() + cfg->hello_timeout_ms);
    }
    pd_conn_start(c, &pd_session_ops, s);
    if (!admitted) {
        const char *key = is_tcp ? "max_tcp_connections" : "max_connections";
        uint64_t max = is_tcp ? cfg->max_tcp_connections : cfg->max_connections;
        l->metrics.rejected[is_tcp ? PD_REJECT_MAX_TCP_CONNECTIONS : PD_REJECT_MAX_CONNECTIONS]++;
        pd_log_warn_peer("conn_reject", "conn=%llu peer=%s reason=%s limit=%llu",
                         (unsigned long long)pd_conn_serial(c), pd_conn_peer(c), key, (unsigned long long)max);
        pd_reply_error(s, 0, PD_EBUSY, "too many connections (%s = %llu); retry later", key, (unsigned long long)max);
        pd_conn_drain_close(c);
        return;
    }
    if (pd_session_peer_refused(s, access))
        pd_conn_drain_close(c);
}

