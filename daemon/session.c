/* Sessions: admission, the transport's callbacks (frames to the dispatch table, drains to streams), and teardown. */
#include "daemon/session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "daemon/auth.h"
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
    (void)is_tcp;
    unsigned max = (unsigned)svc->cfg->max_connections;
    unsigned n = atomic_load(&svc->conns_open);
    do {
        if (n >= max)
            return 0;
    } while (!atomic_compare_exchange_weak(&svc->conns_open, &n, n + 1));
    return 1;
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
    pd_reply_error(s, 0, PD_ETOOBIG, "frame of %u bytes exceeds max_frame (%u bytes)", announced, limit);
}

static void pd_session_on_writable(void *session)
{
    pd_streams_pump(session);
}

static void pd_session_on_end(void *session, int shutdown)
{
    pd_streams_end_all(session, shutdown);
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
        atomic_fetch_sub(&s->svc->conns_open, 1);
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

static const pd_conn_ops pd_session_ops = {
    .frame = pd_session_on_frame,
    .oversize = pd_session_on_oversize,
    .writable = pd_session_on_writable,
    .end = pd_session_on_end,
    .stop = pd_session_on_stop,
    .free = pd_session_on_free,
};

/* ---- Opening ------------------------------------------------------------------------------- */

/* allow_uids: a Unix peer whose uid is not listed (or cannot be read: the list is a promise) is refused. */
static int pd_session_peer_refused(pd_session *s)
{
    const pd_uid_list *allow = &s->svc->cfg->allow_uids;
    int fd;
    uint32_t uid = UINT32_MAX;
    if (allow->n == 0 || pd_conn_is_tcp(s->conn))
        return 0;
    if (pd_conn_fd(s->conn, &fd) == 0 && pd_auth_peer_uid(fd, &uid) == 0 && pd_auth_uid_allowed(allow, uid))
        return 0;
    s->loop->metrics.rejected[PD_REJECT_PEER_UID]++;
    if (uid == UINT32_MAX) {
        pd_log_warn("conn_reject", "conn=%llu reason=peer_uid msg=\"no peer credentials: %s\"",
                    (unsigned long long)pd_conn_serial(s->conn), strerror(errno));
        pd_reply_error(s, 0, PD_EAUTH, "permd could not read this connection's peer credentials");
    } else {
        pd_log_warn("conn_reject", "conn=%llu reason=peer_uid uid=%u", (unsigned long long)pd_conn_serial(s->conn),
                    uid);
        pd_reply_error(s, 0, PD_EAUTH, "uid %u is not in permd's allow_uids", uid);
    }
    return 1;
}

void pd_session_open(pd_loop *l, pd_conn *c, int admitted)
{
    pd_service *svc = l->svc;
    pd_session *s = calloc(1, sizeof *s);
    if (!s || pd_arena_init(&s->arena, PD_ARENA_SIZE)) {
        pd_log_warn("accept", "err=ENOMEM");
        free(s);
        if (admitted)
            atomic_fetch_sub(&svc->conns_open, 1);
        pd_conn_close(c);
        return;
    }
    s->conn = c;
    s->loop = l;
    s->svc = svc;
    s->admitted = (unsigned)admitted;
    s->authed = !(pd_conn_is_tcp(c) && svc->token);
    pd_conn_start(c, &pd_session_ops, s);
    if (!admitted) {
        l->metrics.rejected[PD_REJECT_MAX_CONNECTIONS]++;
        pd_log_warn("conn_reject", "conn=%llu reason=max_connections limit=%llu",
                    (unsigned long long)pd_conn_serial(c), (unsigned long long)svc->cfg->max_connections);
        pd_reply_error(s, 0, PD_EBUSY, "too many connections (max_connections = %llu); retry later",
                       (unsigned long long)svc->cfg->max_connections);
        pd_conn_drain_close(c);
        return;
    }
    if (pd_session_peer_refused(s))
        pd_conn_drain_close(c);
}
