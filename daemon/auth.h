/* Who may talk to permd on the Unix socket beyond the file mode: the peer's uid (SO_PEERCRED) against allow_uids. */
#ifndef PD_AUTH_H
#define PD_AUTH_H

#include <stdint.h>

#include "daemon/conn.h"

/* The uid of a Unix socket's peer, from SO_PEERCRED. PD_EIO. */
int pd_auth_peer_uid(int fd, uint32_t *uid);

/* With allow_uids set, a newly accepted Unix connection whose peer uid is
 * not listed gets UNAUTHENTICATED and is closed: returns 1 then (the caller
 * must stop), else 0. An empty allow_uids admits everyone the socket's mode
 * admits. */
int pd_auth_peer_refused(pd_conn *c);

#endif
