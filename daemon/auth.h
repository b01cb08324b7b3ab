/* Who may talk to permd on the Unix socket beyond the file mode: the peer's uid (SO_PEERCRED) against allow_uids. */
#ifndef PD_AUTH_H
#define PD_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"
#include "proto/token.h"

/* The uid of a Unix socket's peer, from SO_PEERCRED. PD_EIO. */
int pd_auth_peer_uid(int fd, uint32_t *uid);

/* Whether uid is in the list. */
int pd_auth_uid_allowed(const pd_uid_list *allow, uint32_t uid);

#define PD_AUTH_TOKEN_MAX PD_TOKEN_MAX /* the longest token (proto/token.h) */
#define PD_AUTH_TOKEN_SHORT 16 /* a shorter token is warned about: peers may try tokens without bound */

/* The TCP token: the first line of the file at path (without its \n or \r\n), in a malloc'd string
 * (*len its length). Refuses a file that is not a regular file, a first line that is empty or holds a
 * NUL byte (PD_EINVAL), one longer than PD_AUTH_TOKEN_MAX (PD_ETOOBIG), and an unreadable file
 * (PD_EIO), each with an error line naming the file; warns when the file is readable by group or
 * others, and when the token is shorter than PD_AUTH_TOKEN_SHORT. */
int pd_auth_load_token(const char *path, char **token, size_t *len);

#define PD_AUTH_HELLO_RESERVE 128 /* a Hello's bytes besides its token: libpermd's are ~40 */

/* Whether a token of len bytes leaves a client's Hello room under max_preauth_frame (PD_AUTH_HELLO_RESERVE
 * bytes): 0, or PD_EINVAL with err (may be NULL) naming both and the least max_preauth_frame that fits. */
int pd_auth_token_fits(size_t len, uint64_t max_preauth_frame, char *err, size_t errlen);

#endif
