/* Where clients find the daemon: the default Unix socket path and HOST:PORT parsing. */
#ifndef PD_ENDPOINT_H
#define PD_ENDPOINT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PD_DEFAULT_TCP_PORT 7470

/* $PERMD_SOCKET when set; else $XDG_RUNTIME_DIR/permd.sock; else
 * /tmp/permd-<uid>/permd.sock. PD_ETOOBIG when it does not fit. */
int pd_endpoint_default_socket(char *buf, size_t len);

/* "HOST:PORT", "[V6]:PORT" or "HOST" (default port). The host is copied
 * without brackets. PD_EINVAL on a malformed string or a port outside 1..65535. */
int pd_endpoint_parse_hostport(const char *s, char *host, size_t host_len, uint16_t *port);

#ifdef __cplusplus
}
#endif

#endif
