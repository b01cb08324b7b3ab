/* Unix and TCP listeners: stale-socket handling, socket file mode, loopback defaults and the TCP token. */
#include "daemon/listen.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/error.h"
#include "daemon/conn.h"
#include "daemon/log.h"
#include "proto/endpoint.h"

#define PD_BACKLOG 511

static void pd_on_connection(uv_stream_t *listener, int status)
{
    pd_server *s = listener->data;
    if (status < 0) {
        pd_log_warn("accept", "err=%s", uv_err_name(status));
        return;
    }
    if (s->stopping)
        return;
    pd_server_dispatch(s, listener, listener == (uv_stream_t *)&s->tcp_listener);
}

/* 1 when a server accepts connections at path. */
static int pd_socket_alive(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return 0;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int alive = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return alive;
}

static int pd_make_parent(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path || (size_t)(slash - path) >= sizeof dir)
        return 0;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    if (mkdir(dir, 0700) && errno != EEXIST)
        return -1;
    return 0;
}

int pd_listen_unix(pd_server *s, const char *path, unsigned mode, int create_dir)
{
    struct stat st;
    if (create_dir && pd_make_parent(path)) {
        pd_log_error("listen", "transport=unix path=%s msg=\"cannot create its directory: %s\"", path,
                     strerror(errno));
        return PD_EIO;
    }
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
    uv_pipe_init(s->loop, &s->unix_listener, 0);
    s->unix_listener.data = s;
    s->unix_on = 1;
    mode_t old = umask(~(mode_t)mode & 0777); /* never exists with looser permissions, even briefly */
    int rc = uv_pipe_bind(&s->unix_listener, path);
    umask(old);
    if (rc == 0 && chmod(path, (mode_t)mode))
        rc = uv_translate_sys_error(errno);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->unix_listener, PD_BACKLOG, pd_on_connection);
    if (rc) {
        pd_log_error("listen", "transport=unix path=%s err=%s", path, uv_err_name(rc));
        return PD_EIO;
    }
    snprintf(s->socket_path, sizeof s->socket_path, "%s", path);
    pd_log_info("listen", "transport=unix path=%s mode=%04o", path, mode);
    return 0;
}

int pd_listen_tcp(pd_server *s, const char *hostport)
{
    char host[256];
    uint16_t port;
    struct sockaddr_storage sa;
    if (pd_endpoint_parse_hostport(hostport, host, sizeof host, &port))
        return PD_EINVAL;
    const char *h = strcmp(host, "localhost") ? host : "127.0.0.1";
    int rc = strchr(h, ':') ? uv_ip6_addr(h, port, (struct sockaddr_in6 *)&sa)
                            : uv_ip4_addr(h, port, (struct sockaddr_in *)&sa);
    if (rc) {
        pd_log_error("listen", "transport=tcp addr=%s err=%s", hostport, uv_err_name(rc));
        return PD_EINVAL;
    }
    uv_tcp_init(s->loop, &s->tcp_listener);
    s->tcp_listener.data = s;
    s->tcp_on = 1;
    rc = uv_tcp_bind(&s->tcp_listener, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->tcp_listener, PD_BACKLOG, pd_on_connection);
    if (rc) {
        pd_log_error("listen", "transport=tcp addr=%s err=%s", hostport, uv_err_name(rc));
        return PD_EIO;
    }
    pd_log_info("listen", "transport=tcp addr=%s auth=%s", hostport, s->token ? "token" : "none");
    return 0;
}

void pd_listen_close(pd_server *s)
{
    if (s->unix_on && !uv_is_closing((uv_handle_t *)&s->unix_listener)) {
        uv_close((uv_handle_t *)&s->unix_listener, NULL);
        if (s->socket_path[0])
            unlink(s->socket_path);
    }
    if (s->tcp_on && !uv_is_closing((uv_handle_t *)&s->tcp_listener))
        uv_close((uv_handle_t *)&s->tcp_listener, NULL);
}

int pd_listen_load_token(pd_server *s, const char *path)
{
    struct stat st;
    char buf[4096];
    FILE *f = fopen(path, "r");
    if (!f) {
        pd_log_error("token", "path=%s msg=\"%s\"", path, strerror(errno));
        return PD_EIO;
    }
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 0077))
        pd_log_warn("token", "path=%s msg=\"readable by group or others; chmod 600 it\"", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (!buf[0]) {
        pd_log_error("token", "path=%s msg=\"the first line is empty\"", path);
        return PD_EINVAL;
    }
    s->token = strdup(buf);
    if (!s->token)
        return PD_ENOMEM;
    s->token_len = strlen(buf);
    return 0;
}
