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

/* Read up to len bytes of fd (fewer at its end). */
static ssize_t pd_auth_read(int fd, char *buf, size_t len)
{
    size_t n = 0;
    while (n < len) {
        ssize_t r = read(fd, buf + n, len - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        n += (size_t)r;
    }
    return (ssize_t)n;
}

int pd_auth_load_token(const char *path, char **token, size_t *len)
{
    struct stat st;
    char buf[PD_AUTH_TOKEN_MAX + 1]; /* one byte more than a token: a longer line is refused, not cut */
    int rc = PD_EINVAL;
    /* O_NONBLOCK: a FIFO or a device named here must be refused, not block startup (or the event loop,
     * on SIGHUP) until some writer comes; SIGTERM could not even stop permd there. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        pd_log_error("token", "path=%s msg=\"token_file cannot be opened: %s\"", path, strerror(errno));
        return PD_EIO;
    }
    if (fstat(fd, &st)) {
        pd_log_error("token", "path=%s msg=\"token_file: %s\"", path, strerror(errno));
        rc = PD_EIO;
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        pd_log_error("token", "path=%s msg=\"token_file is not a regular file (a directory, a pipe, a FIFO or a "
                     "device): write the token in a file\"", path);
        goto fail;
    }
    if (st.st_mode & 0077)
        pd_log_warn("token", "path=%s msg=\"token_file is readable by group or others (mode %04o); chmod 600 it\"",
                    path, (unsigned)(st.st_mode & 07777));
    ssize_t n = pd_auth_read(fd, buf, sizeof buf);
    if (n < 0) {
        pd_log_error("token", "path=%s msg=\"token_file cannot be read: %s\"", path, strerror(errno));
        rc = PD_EIO;
        goto fail;
    }
    size_t line = 0; /* the first line, without its \n or \r\n */
    while (line < (size_t)n && buf[line] != '\n' && buf[line] != '\r')
        line++;
    if (line > PD_AUTH_TOKEN_MAX) {
        /* It used to be cut at 4095 bytes, and clients sent it whole in a Hello that max_preauth_frame
         * refuses: permd started, and no client could ever authenticate. */
        pd_log_error("token", "path=%s msg=\"token_file: the first line is longer than %d bytes, the longest token "
                     "(32 random bytes in hex are plenty: openssl rand -hex 32)\"", path, PD_AUTH_TOKEN_MAX);
        rc = PD_ETOOBIG;
        goto fail;
    }
    /* A NUL ends the token for C strings and for every client that reads the file as permctl does: a binary
     * token (head -c 32 /dev/urandom) would be checked only up to its first zero byte, maybe one byte long. */
    const char *nul = memchr(buf, '\0', line);
    if (nul) {
        pd_log_error("token", "path=%s msg=\"token_file: the first line holds a NUL byte at byte %zu; the token "
                     "must be text (openssl rand -hex 32)\"", path, (size_t)(nul - buf));
        goto fail;
    }
    if (line == 0) {
        pd_log_error("token", "path=%s msg=\"token_file: the first line is empty\"", path);
        goto fail;
    }
    /* Nothing bounds how many tokens a network peer may try (one per connection): the token's length is
     * the defence. */
    if (line < PD_AUTH_TOKEN_SHORT)
        pd_log_warn("token", "path=%s msg=\"token_file: the token is %zu bytes; use at least %d random ones "
                    "(openssl rand -hex 32): peers may try tokens without bound\"", path, line, PD_AUTH_TOKEN_SHORT);
    if (!(*token = malloc(line + 1))) {
        rc = PD_ENOMEM;
        goto fail;
    }
    memcpy(*token, buf, line);
    (*token)[line] = '\0';
    *len = line;
    rc = 0;
fail:
    close(fd);
    return rc;
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
