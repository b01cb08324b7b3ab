/* Where clients find the daemon: the default Unix socket path, HOST:PORT parsing, connecting by a deadline. */
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

/* The longest Unix socket path, in bytes without its NUL: sockaddr_un.sun_path holds 108 with it
 * on Linux. A longer path cannot be bound or connected to (libuv would truncate it silently). */
size_t pd_endpoint_unix_path_max(void);

/* Whether path lies directly in /tmp/permd-<uid>, the directory of the last default above. In a
 * /tmp that every user may write, anyone can create that directory first: the daemon and clients
 * accept it only when pd_endpoint_check_dir does. */
int pd_endpoint_in_private_dir(const char *path);

/* 0 when dir is a directory (not a symbolic link) owned by this user (the effective uid) that
 * neither its group nor others may write: no one else can replace a socket in it. Else PD_EAUTH,
 * or PD_EIO when it cannot be examined; why says which. */
int pd_endpoint_check_dir(const char *dir, char *why, size_t why_len);

/* "HOST:PORT", "[V6]:PORT" or "HOST" (default port). The host is copied
 * without brackets. PD_EINVAL on a malformed string or a port outside 1..65535. */
int pd_endpoint_parse_hostport(const char *s, char *host, size_t host_len, uint16_t *port);

/* Milliseconds on the monotonic clock: what the deadlines below count in. */
uint64_t pd_endpoint_now_ms(void);

/* Milliseconds left until deadline, at least 0; -1 (poll's "no limit") for deadline 0, none. */
int pd_endpoint_ms_left(uint64_t deadline);

/* Wait until fd is ready for events (poll's) or deadline passes: 0, or -1 with errno set (ETIMEDOUT when the
 * deadline passed). EINTR is retried. */
int pd_endpoint_wait(int fd, short events, uint64_t deadline);

/* A stream socket connected to host:port over TCP in *fd, within ms milliseconds (0: no limit but the
 * kernel's, which waits minutes for a peer that drops SYNs), each address the name resolves to tried
 * in turn under that one deadline. *fd is close-on-exec, and blocking unless nonblock. PD_ETIMEDOUT
 * when the deadline passed, PD_EIO otherwise (the name does not resolve, refused, unreachable); why
 * says which, and errno holds the cause (ETIMEDOUT, ECONNREFUSED, ...). */
int pd_endpoint_connect_tcp(const char *host, uint16_t port, uint32_t ms, int nonblock, int *fd, char *why,
                            size_t why_len);

/* The same for the Unix socket at path, whose connect waits while the listener's backlog is full:
 * retried until ms (0: until it is not full). PD_EINVAL for a path too long for sun_path. */
int pd_endpoint_connect_unix(const char *path, uint32_t ms, int nonblock, int *fd, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
