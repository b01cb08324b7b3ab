/* Who may connect: peer credentials for the Unix socket's allow_uids, and the TCP token file. */
#include "daemon/auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

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

int pd_auth_load_token(const char *path, char **token, size_t *len)
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
    if (!(*token = strdup(buf)))
        return PD_ENOMEM;
    *len = strlen(buf);
    return 0;
}
