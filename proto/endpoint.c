/* Default Unix socket location, HOST:PORT parsing and connecting by a deadline, shared so the daemon and clients agree. */
#define _GNU_SOURCE /* lstat, SOCK_CLOEXEC, getaddrinfo */
#include "proto/endpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/error.h"
#include "core/parse.h"

int pd_endpoint_default_socket(char *buf, size_t len)
{
    const char *env = getenv("PERMD_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (env && *env)
        n = snprintf(buf, len, "%s", env);
    else if (xdg && *xdg == '/')
        n = snprintf(buf, len, "%s/permd.sock", xdg);
    else
        n = snprintf(buf, len, "/tmp/permd-%u/permd.sock", (unsigned)getuid());
    return n < 0 || (size_t)n >= len ? PD_ETOOBIG : 0;
}

size_t pd_endpoint_unix_path_max(void)
{
    return sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
}

/* The fallback directory's name for this user, /tmp/permd-<uid>. */
static int pd_endpoint_private_dir(char *buf, size_t len)
{
    int n = snprintf(buf, len, "/tmp/permd-%u", (unsigned)getuid());
    return n < 0 || (size_t)n >= len ? PD_ETOOBIG : 0;
}

int pd_endpoint_in_private_dir(const char *path)
{
    char dir[64];
    const char *slash = strrchr(path, '/');
    if (pd_endpoint_private_dir(dir, sizeof dir) || !slash)
        return 0;
    return (size_t)(slash - path) == strlen(dir) && !memcmp(path, dir, (size_t)(slash - path));
}

int pd_endpoint_check_dir(const char *dir, char *why, size_t why_len)
{
    struct stat st;
    /* lstat: a symbolic link planted in /tmp would send the socket wherever its owner likes. */
    if (lstat(dir, &st)) {
        snprintf(why, why_len, "cannot examine it: %s", strerror(errno));
        return PD_EIO;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, why_len, "it is not a directory");
        return PD_EAUTH;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, why_len, "it is owned by uid %u, not by this user (uid %u)", (unsigned)st.st_uid,
                 (unsigned)geteuid());
        return PD_EAUTH;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, why_len, "its mode %04o lets group or others write in it", (unsigned)(st.st_mode & 07777));
        return PD_EAUTH;
    }
    return 0;
}

int pd_endpoint_parse_hostport(const char *s, char *host, size_t host_len, uint16_t *port)
{
    const char *h = s, *hend, *p = NULL;
    if (!s || !*s)
        return PD_EINVAL;
    if (*s == '[') { /* [v6]:port */
        h = s + 1;
        hend = strchr(h, ']');
        if (!hend)
            return PD_EINVAL;
        if (hend[1] == ':')
            p = hend + 2;
        else if (hend[1] != '\0')
            return PD_EINVAL;
    } else {
        hend = strrchr(s, ':');
        if (hend && strchr(s, ':') != hend)
            return PD_EINVAL; /* a bare IPv6 address needs brackets */
        if (hend)
            p = hend + 1;
        else
            hend = s + strlen(s);
    }
    size_t hl = (size_t)(hend - h);
    if (hl == 0 || hl >= host_len)
        return PD_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    uint64_t v = PD_DEFAULT_TCP_PORT;
    if (p && pd_parse_u64_range(p, 1, 65535, &v))
        return PD_EINVAL;
    *port = (uint16_t)v;
    return 0;
}

/* ---- Connecting by a deadline ---------------------------------------------------------------- */

uint64_t pd_endpoint_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int pd_endpoint_ms_left(uint64_t deadline)
{
    if (!deadline)
        return -1;
    const uint64_t now = pd_endpoint_now_ms();
    return now >= deadline ? 0 : deadline - now > INT32_MAX ? INT32_MAX : (int)(deadline - now);
}

int pd_endpoint_wait(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        const int left = pd_endpoint_ms_left(deadline);
        const int n = left ? poll(&p, 1, left) : 0;
        if (n > 0)
            return 0;
        if (n == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (errno != EINTR)
            return -1;
    }
}

/* fd's connect, started non-blocking, completed by deadline: 0, or the errno that ended it (ETIMEDOUT). */
static int pd_endpoint_finish(int fd, uint64_t deadline)
{
    if (pd_endpoint_wait(fd, POLLOUT, deadline))
        return errno;
    int err = 0;
    socklen_t len = sizeof err;
    return getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) ? errno : err;
}

/* Hand a connected socket over, blocking unless nonblock. */
static int pd_endpoint_done(int fd, int nonblock, int *out, char *why, size_t why_len)
{
    const int fl = fcntl(fd, F_GETFL);
    if (!nonblock && (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK))) {
        snprintf(why, why_len, "fcntl: %s", strerror(errno));
        close(fd);
        return PD_EIO;
    }
    *out = fd;
    return 0;
}

/* The error for a connect ended by err, which errno is left holding for the caller. */
static int pd_endpoint_fail(int err, uint32_t ms, char *why, size_t why_len)
{
    const int rc = err == ETIMEDOUT && ms ? PD_ETIMEDOUT : PD_EIO;
    if (rc == PD_ETIMEDOUT)
        snprintf(why, why_len, "no connection within %u ms", (unsigned)ms);
    else
        snprintf(why, why_len, "%s", strerror(err));
    errno = err;
    return rc;
}

int pd_endpoint_connect_tcp(const char *host, uint16_t port, uint32_t ms, int nonblock, int *fd, char *why,
                            size_t why_len)
{
    const uint64_t deadline = ms ? pd_endpoint_now_ms() + ms : 0;
    char service[8];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    snprintf(service, sizeof service, "%u", (unsigned)port);
    const int rc = getaddrinfo(host, service, &hints, &res);
    if (rc) {
        snprintf(why, why_len, "cannot resolve %s: %s", host, gai_strerror(rc));
        errno = EHOSTUNREACH;
        return PD_EIO;
    }
    int s = -1, err = ECONNREFUSED;
    for (ai = res; ai && s < 0; ai = ai->ai_next) {
        s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (s < 0) {
            err = errno;
            continue;
        }
        err = connect(s, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno != EINPROGRESS ? errno
                                                                                       : pd_endpoint_finish(s, deadline);
        if (err) {
            close(s);
            s = -1;
            if (err == ETIMEDOUT && deadline) /* the deadline covers every address: it has passed */
                break;
        }
    }
    freeaddrinfo(res);
    return s < 0 ? pd_endpoint_fail(err, ms, why, why_len) : pd_endpoint_done(s, nonblock, fd, why, why_len);
}

int pd_endpoint_connect_unix(const char *path, uint32_t ms, int nonblock, int *fd, char *why, size_t why_len)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(why, why_len, "socket path too long (at most %zu bytes)", pd_endpoint_unix_path_max());
        return PD_EINVAL;
    }
    strcpy(sa.sun_path, path);
    const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return pd_endpoint_fail(errno, ms, why, why_len);
    const uint64_t deadline = ms ? pd_endpoint_now_ms() + ms : 0;
    /* A full backlog answers a non-blocking Unix connect with EAGAIN and nothing to poll for: try again
     * after a pause that grows from 1 ms to 50. */
    for (int pause = 1;; pause = pause < 50 ? 2 * pause : 50) {
        if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0)
            return pd_endpoint_done(s, nonblock, fd, why, why_len);
        int err = errno;
        if (err == EINPROGRESS) /* Linux completes Unix connects at once; other systems may not */
            err = pd_endpoint_finish(s, deadline);
        if (!err)
            return pd_endpoint_done(s, nonblock, fd, why, why_len);
        const int left = pd_endpoint_ms_left(deadline);
        if ((err != EAGAIN && err != EINTR) || left == 0) {
            close(s);
            return pd_endpoint_fail(err == EAGAIN ? ETIMEDOUT : err, ms, why, why_len);
        }
        poll(NULL, 0, left < 0 || left > pause ? pause : left);
    }
}
