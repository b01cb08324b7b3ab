/* Peer credentials: the Unix socket's allow_uids check at accept, with its log line, error reply and counter. */
#include "daemon/auth.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "core/error.h"
#include "daemon/log.h"
#include "daemon/metrics.h"

int pd_auth_peer_uid(int fd, uint32_t *uid)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) || len != sizeof cred)
        return PD_EIO;
    *uid = (uint32_t)cred.uid;
    return 0;
}

static int pd_auth_uid_allowed(const pd_uid_list *allow, uint32_t uid)
{
    for (size_t i = 0; i < allow->n; i++)
        if (allow->uids[i] == uid)
            return 1;
    return 0;
}

int pd_auth_peer_refused(pd_conn *c)
{
    pd_server *s = c->srv;
    const pd_uid_list *allow = &s->cfg->allow_uids;
    uv_os_fd_t fd;
    uint32_t uid = UINT32_MAX;
    if (allow->n == 0)
        return 0;
    /* A peer whose credentials cannot be read is refused: the list is a promise. */
    if (uv_fileno(&c->h.handle, &fd) == 0 && pd_auth_peer_uid(fd, &uid) == 0 && pd_auth_uid_allowed(allow, uid))
        return 0;
    s->metrics.rejected[PD_REJECT_PEER_UID]++;
    if (uid == UINT32_MAX) {
        pd_log_warn("conn_reject", "conn=%llu reason=peer_uid msg=\"no peer credentials: %s\"",
                    (unsigned long long)c->serial, strerror(errno));
        pd_conn_send_error(c, 0, PD_EAUTH, "permd could not read this connection's peer credentials");
    } else {
        pd_log_warn("conn_reject", "conn=%llu reason=peer_uid uid=%u", (unsigned long long)c->serial, uid);
        pd_conn_send_error(c, 0, PD_EAUTH, "uid %u is not in permd's allow_uids", uid);
    }
    pd_conn_drain_close(c);
    return 1;
}
