/* Default Unix socket location and HOST:PORT parsing, shared so the daemon and clients agree. */
#define _POSIX_C_SOURCE 200809L /* lstat */
#include "proto/endpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
