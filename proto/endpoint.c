/* Default Unix socket location and HOST:PORT parsing, shared so the daemon and clients agree. */
#include "proto/endpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
