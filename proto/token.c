/* Token files read by one set of rules for permd and its clients (see token.h). */
#define _POSIX_C_SOURCE 200809L
#include "proto/token.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* Read up to len bytes of fd (fewer at its end); -1 with errno on failure. */
static ssize_t pd_token_read_fd(int fd, char *buf, size_t len)
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

static int pd_token_fail(pd_token_file *out, pd_token_fault fault, int rc)
{
    out->fault = fault;
    return rc;
}

int pd_token_read(const char *path, pd_token_file *out)
{
    struct stat st;
    char line[PD_TOKEN_MAX + 1]; /* one byte more than a token: a longer line is refused, not cut */
    int rc;
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        out->err = errno;
        return pd_token_fail(out, PD_TOKEN_CANNOT_OPEN, PD_EIO);
    }
    if (fstat(fd, &st)) {
        out->err = errno;
        rc = pd_token_fail(out, PD_TOKEN_CANNOT_OPEN, PD_EIO);
        goto fail;
    }
    out->mode = (unsigned)(st.st_mode & 07777);
    if (!S_ISREG(st.st_mode)) {
        rc = pd_token_fail(out, PD_TOKEN_NOT_REGULAR, PD_EINVAL);
        goto fail;
    }
    ssize_t n = pd_token_read_fd(fd, line, sizeof line);
    if (n < 0) {
        out->err = errno;
        rc = pd_token_fail(out, PD_TOKEN_CANNOT_READ, PD_EIO);
        goto fail;
    }
    size_t len = 0;
    while (len < (size_t)n && line[len] != '\n' && line[len] != '\r')
        len++;
    size_t bad = 0;
    while (bad < len && (unsigned char)line[bad] >= 0x20 && (unsigned char)line[bad] != 0x7f)
        bad++;
    if (len > PD_TOKEN_MAX) {
        rc = pd_token_fail(out, PD_TOKEN_TOO_LONG, PD_ETOOBIG);
    } else if (bad < len) {
        out->bad_at = bad;
        out->bad_byte = (unsigned char)line[bad];
        rc = pd_token_fail(out, PD_TOKEN_NOT_TEXT, PD_EINVAL);
    } else if (len == 0) {
        rc = pd_token_fail(out, PD_TOKEN_EMPTY, PD_EINVAL);
    } else {
        memcpy(out->token, line, len);
        out->token[len] = '\0';
        out->len = len;
        rc = 0;
    }
fail:
    close(fd);
    return rc;
}
