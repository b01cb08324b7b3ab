/* Who may connect: peer credentials for the Unix socket's allow_uids, and the TCP token file. */
#include "daemon/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/log.h"
#include "proto/token.h"

int pd_auth_peer_uid(int fd, uint32_t *uid)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) || len != sizeof cred)
        return PD_EIO;
    *uid = (uint32_t)cred.uid;
    return 0;
}

int pd_auth_uid_allowed(const pd_uid_list *allow, uint32_t uid)
{
    for (size_t i = 0; i < allow->n; i++)
        if (allow->uids[i] == uid)
            return 1;
    return 0;
}

int pd_auth_load_token(const char *path, char **token, size_t *len)
{
    pd_token_file f;
    int rc = pd_token_read(path, &f);
    switch (f.fault) {
    case PD_TOKEN_FINE:
        break;
    case PD_TOKEN_CANNOT_OPEN:
        pd_log_error("token", "path=%s msg=\"token_file cannot be opened: %s\"", path, strerror(f.err));
        return rc;
    case PD_TOKEN_CANNOT_READ:
        pd_log_error("token", "path=%s msg=\"token_file cannot be read: %s\"", path, strerror(f.err));
        return rc;
    case PD_TOKEN_NOT_REGULAR: /* a FIFO would have blocked startup, or the event loop on SIGHUP, deaf to SIGTERM */
        pd_log_error("token", "path=%s msg=\"token_file is not a regular file (a directory, a pipe, a FIFO or a "
                     "device): write the token in a file\"", path);
        return rc;
    case PD_TOKEN_TOO_LONG:
        pd_log_error("token", "path=%s msg=\"token_file: the first line is longer than %d bytes, the longest token "
                     "(32 random bytes in hex are plenty: openssl rand -hex 32)\"", path, PD_AUTH_TOKEN_MAX);
        return rc;
    case PD_TOKEN_NOT_TEXT:
        pd_log_error("token", "path=%s msg=\"token_file: the first line holds the control byte 0x%02x at byte %zu; "
                     "the token must be text (openssl rand -hex 32)\"", path, f.bad_byte, f.bad_at);
        return rc;
    case PD_TOKEN_EMPTY:
        pd_log_error("token", "path=%s msg=\"token_file: the first line is empty\"", path);
        return rc;
    }
    if (f.mode & 0077)
        pd_log_warn("token", "path=%s msg=\"token_file is readable by group or others (mode %04o); chmod 600 it\"",
                    path, f.mode);
    /* Nothing bounds how many tokens a network peer may try (one per connection): the token's length is
     * the defence. */
    if (f.len < PD_AUTH_TOKEN_SHORT)
        pd_log_warn("token", "path=%s msg=\"token_file: the token is %zu bytes; use at least %d random ones "
                    "(openssl rand -hex 32): peers may try tokens without bound\"", path, f.len, PD_AUTH_TOKEN_SHORT);
    if (!(*token = malloc(f.len + 1)))
        return PD_ENOMEM;
    memcpy(*token, f.token, f.len + 1);
    *len = f.len;
    return 0;
}

int pd_auth_token_fits(size_t len, uint64_t max_preauth_frame, char *err, size_t errlen)
{
    if (len + PD_AUTH_HELLO_RESERVE <= max_preauth_frame)
        return 0;
    if (err && errlen)
        snprintf(err, errlen,
                 "a token of %zu bytes leaves a client's Hello no room under max_preauth_frame (%llu): raise "
                 "max_preauth_frame to at least %zu, or shorten the token",
                 len, (unsigned long long)max_preauth_frame, len + PD_AUTH_HELLO_RESERVE);
    return PD_EINVAL;
}
