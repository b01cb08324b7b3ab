/* Listeners: the Unix socket (always on) and the optional TCP socket, with their safety checks; accepts go to a callback. */
#ifndef PD_LISTEN_H
#define PD_LISTEN_H

#include <uv.h>

/* A connection is waiting on listener: accept it (uv_accept) now. status < 0: accepting failed (libuv's
 * error, logged already: out of descriptors, say), nothing to accept. */
typedef void (*pd_accept_fn)(void *ctx, uv_stream_t *listener, int is_tcp, int status);

typedef struct pd_listener pd_listener;

/* libuv reads a listener no more while a connection it accepted waits for uv_accept, so an accept callback
 * that returns without taking one (its allocation failed) would stop the socket for good. A pd_accept_drop,
 * kept beside the listener, takes such a connection and closes it. Call pd_accept_drop_left after each
 * accept callback; pd_accept_drop_close when closing the listener: `closed` (given `data` in the handle) runs
 * once, when the drop's handle has closed for good. */
typedef union pd_socket_handle { /* a Unix or TCP socket's libuv handle, as each call wants it */
    uv_handle_t handle;
    uv_stream_t stream;
    uv_pipe_t pipe;
    uv_tcp_t tcp;
} pd_socket_handle;

typedef struct pd_accept_drop {
    pd_socket_handle h; /* first: its close callback finds the drop from it */
    uv_stream_t *listener;
    uv_close_cb closed;
    void *data;
    int is_tcp;
    int ready;   /* initialized and unused */
    int closing; /* pd_accept_drop_close called */
} pd_accept_drop;

void pd_accept_drop_init(pd_accept_drop *d, uv_stream_t *listener, int is_tcp, void *data, uv_close_cb closed);
void pd_accept_drop_left(pd_accept_drop *d);
void pd_accept_drop_close(pd_accept_drop *d);

/* Bind the Unix socket at path with the file mode given: refuses to start when another server
 * answers there, replaces a stale socket file, and creates the default directory (mode 0700) when
 * the path is the default (create_dir). A default directory /tmp/permd-<uid> that is not this
 * user's alone (pd_endpoint_check_dir) is refused: PD_EAUTH. A path longer than a Unix socket's
 * (pd_endpoint_unix_path_max) is PD_ETOOBIG. Else PD_EIO, PD_ECONFLICT, PD_ENOMEM. Each refusal is
 * logged with the path and why. */
int pd_listen_unix(uv_loop_t *loop, const char *path, unsigned mode, int create_dir, pd_accept_fn fn, void *ctx,
                   pd_listener **out);

/* Bind HOST:PORT (validated by pd_config_validate); token: whether clients must authenticate (for
 * the log line). PD_EIO, PD_EINVAL, PD_ENOMEM. */
int pd_listen_tcp(uv_loop_t *loop, const char *hostport, int token, pd_accept_fn fn, void *ctx, pd_listener **out);

/* The address of HOST:PORT (a numeric address or localhost); PD_EINVAL, logged with transport. */
int pd_listen_sockaddr(const char *hostport, const char *transport, struct sockaddr_storage *sa);

/* Stop listening (a Unix socket's file is removed); it frees itself once closed. NULL is a no-op. */
void pd_listener_close(pd_listener *l);

#endif
