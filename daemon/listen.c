/* Unix and TCP listeners: stale-socket handling, socket file mode, loopback defaults. */
#include "daemon/listen.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/log.h"
#include "proto/endpoint.h"

#define PD_BACKLOG 511
#define PD_TCP_KEEPALIVE_S 60 /* idle seconds before the first probe; the kernel's interval and count follow */

struct pd_listener {
    pd_socket_handle h;
    pd_accept_drop drop; /* a connection the callback could not take (out of memory) */
    unsigned handles;    /* h and drop while open: the listener is freed when both have closed */
    int is_tcp;
    int closing;
    pd_accept_fn fn;
    void *ctx;
    char path[4096]; /* a Unix socket's file, unlinked at close */
};

static void pd_on_listener_closed(uv_handle_t *h)
{
    pd_listener *l = h->data;
    if (--l->handles == 0)
        free(l);
}

static void pd_accept_drop_open(pd_accept_drop *d)
{
    if (d->is_tcp)
        uv_tcp_init(d->listener->loop, &d->h.tcp);
    else
        uv_pipe_init(d->listener->loop, &d->h.pipe, 0);
    d->h.handle.data = d->data;
    d->ready = 1;
}

void pd_accept_drop_init(pd_accept_drop *d, uv_stream_t *listener, int is_tcp, void *data, uv_close_cb closed)
{
    *d = (pd_accept_drop){.listener = listener, .closed = closed, .data = data, .is_tcp = is_tcp};
    pd_accept_drop_open(d);
}

static void pd_on_drop_closed(uv_handle_t *h)
{
    pd_accept_drop *d = (pd_accept_drop *)h; /* its first member */
    if (d->closing) {
        d->closed(h);
        return;
    }
    pd_accept_drop_open(d);
    pd_accept_drop_left(d); /* one left while it closed */
}

void pd_accept_drop_left(pd_accept_drop *d)
{
    if (d->closing || !d->ready || uv_accept(d->listener, &d->h.stream)) /* UV_EAGAIN: the callback took it */
        return;
    pd_log_warn_peer("accept", "transport=%s msg=\"a connection was not taken (out of memory, or stopping): closed\"",
                     d->is_tcp ? "tcp" : "unix");
    d->ready = 0;
    uv_close(&d->h.handle, pd_on_drop_closed);
}

void pd_accept_drop_close(pd_accept_drop *d)
{
    if (d->closing)
        return;
    d->closing = 1;
    if (d->ready) /* else its close is under way: pd_on_drop_closed calls closed */
        uv_close(&d->h.handle, d->closed);
}

static void pd_on_connection(uv_stream_t *listener, int status)
{
    pd_listener *l = listener->data;
    if (status < 0) {
        pd_log_warn_peer("accept", "err=%s", uv_err_name(status));
        if (!l->closing)
            l->fn(l->ctx, listener, l->is_tcp, status);
        return;
    }
    if (!l->closing)
        l->fn(l->ctx, listener, l->is_tcp, 0);
    pd_accept_drop_left(&l->drop);
}

void pd_listener_close(pd_listener *l)
{
    if (!l || l->closing)
        return;
    l->closing = 1;
    if (l->path[0])
        unlink(l->path);
    pd_accept_drop_close(&l->drop);
    uv_close(&l->h.handle, pd_on_listener_closed);
}

static pd_listener *pd_listener_new(pd_accept_fn fn, void *ctx, int is_tcp)
{
    pd_listener *l = calloc(1, sizeof *l);
    if (l) {
        l->fn = fn;
        l->ctx = ctx;
        l->is_tcp = is_tcp;
        l->h.handle.data = l;
    }
    return l;
}

/* 1 when a server listens at path. Non-blocking: a server stopped (SIGSTOP) or wedged with its backlog full
 * answers EAGAIN, and is there all the same; a blocking connect waited for it for ever. */
static int pd_socket_alive(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return 0;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    int alive = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 || errno == EAGAIN || errno == EINPROGRESS;
    close(fd);
    return alive;
}

/* Create the default path's directory (mode 0700) unless it exists. The fallback /tmp/permd-<uid>
 * lies in a directory every user may write: whoever makes it first owns it, so one found there (or
 * made by someone else between our mkdir and the check) must be ours and writable by no one else,
 * as OpenSSH and tmux require of theirs. Another user's would let them swap the socket for their
 * own and serve our clients other ids. */
static int pd_make_parent(const char *path)
{
    char dir[4096], why[160];
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path || (size_t)(slash - path) >= sizeof dir)
        return 0;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    if (mkdir(dir, 0700) && errno != EEXIST) {
        pd_log_error("listen", "transport=unix path=%s msg=\"cannot create its directory: %s\"", path,
                     strerror(errno));
        return PD_EIO;
    }
    int rc = pd_endpoint_in_private_dir(path) ? pd_endpoint_check_dir(dir, why, sizeof why) : 0;
    if (rc)
        pd_log_error("listen",
                     "transport=unix path=%s msg=\"refusing the socket directory %s: %s (remove it, or set "
                     "--socket or XDG_RUNTIME_DIR)\"",
                     path, dir, why);
    return rc;
}

int pd_listen_unix(uv_loop_t *loop, const char *path, unsigned mode, int create_dir, pd_accept_fn fn, void *ctx,
                   pd_listener **out)
{
    struct stat st;
    int rc;
    size_t max = pd_endpoint_unix_path_max();
    if (strlen(path) > max) { /* libuv would bind the path cut short, leaving a stray socket there */
        pd_log_error("listen",
                     "transport=unix path=%s msg=\"the path is %zu bytes; a Unix socket path holds at most %zu\"",
                     path, strlen(path), max);
        return PD_ETOOBIG;
    }
    if (create_dir && (rc = pd_make_parent(path)))
        return rc;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            pd_log_error("listen", "transport=unix path=%s msg=\"exists and is not a socket\"", path);
            return PD_ECONFLICT;
        }
        if (pd_socket_alive(path)) {
            pd_log_error("listen", "transport=unix path=%s msg=\"another server is listening there\"", path);
            return PD_ECONFLICT;
        }
        unlink(path); /* left behind by a server that died */
    }
    pd_listener *l = pd_listener_new(fn, ctx, 0);
    if (!l)
        return PD_ENOMEM;
    uv_pipe_init(loop, &l->h.pipe, 0);
    l->handles = 2;
    pd_accept_drop_init(&l->drop, &l->h.stream, 0, l, pd_on_listener_closed);
    mode_t old = umask(~(mode_t)mode & 0777); /* never exists with looser permissions, even briefly */
    rc = uv_pipe_bind(&l->h.pipe, path);
    umask(old);
    if (rc == 0) /* ours now: a failure below removes it (pd_listener_close) instead of leaving it behind */
        snprintf(l->path, sizeof l->path, "%s", path);
    if (rc == 0 && chmod(path, (mode_t)mode))
        rc = uv_translate_sys_error(errno);
    if (rc == 0)
        rc = uv_listen(&l->h.stream, PD_BACKLOG, pd_on_connection);
    if (rc) {
        pd_log_error("listen", "transport=unix path=%s err=%s", path, uv_err_name(rc));
        pd_listener_close(l);
        return PD_EIO;
    }
    *out = l;
    pd_log_info("listen", "transport=unix path=%s mode=%04o", path, mode);
    return 0;
}

int pd_listen_sockaddr(const char *hostport, const char *transport, struct sockaddr_storage *sa)
{
    char host[256];
    uint16_t port;
    if (pd_endpoint_parse_hostport(hostport, host, sizeof host, &port))
        return PD_EINVAL;
    /* Any case, as pd_config_validate accepts it: "LOCALHOST:7470" passed --check-config, then failed to
     * bind with a bare EINVAL. */
    const char *ip = strcasecmp(host, "localhost") ? host : "127.0.0.1";
    int rc = strchr(ip, ':') ? uv_ip6_addr(ip, port, (struct sockaddr_in6 *)sa)
                             : uv_ip4_addr(ip, port, (struct sockaddr_in *)sa);
    if (rc) {
        pd_log_error("listen", "transport=%s addr=%s err=%s", transport, hostport, uv_err_name(rc));
        return PD_EINVAL;
    }
    return 0;
}

int pd_listen_tcp(uv_loop_t *loop, const char *hostport, int token, pd_accept_fn fn, void *ctx, pd_listener **out)
{
    struct sockaddr_storage sa;
    int rc = pd_listen_sockaddr(hostport, "tcp", &sa);
    if (rc)
        return rc;
    pd_listener *l = pd_listener_new(fn, ctx, 1);
    if (!l)
        return PD_ENOMEM;
    uv_tcp_init(loop, &l->h.tcp);
    l->handles = 2;
    pd_accept_drop_init(&l->drop, &l->h.stream, 1, l, pd_on_listener_closed);
    rc = uv_tcp_bind(&l->h.tcp, (struct sockaddr *)&sa, 0);
    /* Keepalive on the listener: Linux gives each accepted socket the listener's options. A peer that
     * vanished without a FIN (its host died) while idle would otherwise keep its connection, and its
     * max_tcp_connections place, for as long as permd runs: nothing is ever written to it. */
    if (rc == 0)
        rc = uv_tcp_keepalive(&l->h.tcp, 1, PD_TCP_KEEPALIVE_S);
    if (rc == 0)
        rc = uv_listen(&l->h.stream, PD_BACKLOG, pd_on_connection);
    if (rc) {
        pd_log_error("listen", "transport=tcp addr=%s err=%s", hostport, uv_err_name(rc));
        pd_listener_close(l);
        return PD_EIO;
    }
    pd_log_info("listen", "transport=tcp addr=%s auth=%s", hostport, token ? "token" : "none");
    *out = l;
    return 0;
}
