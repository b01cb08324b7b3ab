/* Who may talk to permd on the Unix socket beyond the file mode: the peer's uid (SO_PEERCRED) against allow_uids. */
#ifndef PD_AUTH_H
#define PD_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"

/* The uid of a Unix socket's peer, from SO_PEERCRED. PD_EIO. */
int pd_auth_peer_uid(int fd, uint32_t *uid);

/* Whether uid is in the list. */
int pd_auth_uid_allowed(const pd_uid_list *allow, uint32_t uid);

/* The TCP token: the first line of the file at path, in a malloc'd string (*len its length).
 * Refuses an empty token (PD_EINVAL) and an unreadable file (PD_EIO); warns when the file is
 * readable by others. */
int pd_auth_load_token(const char *path, char **token, size_t *len);

#endif
