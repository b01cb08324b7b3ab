/* Listeners: the Unix socket (always on) and the optional TCP socket, with their safety checks. */
#ifndef PD_LISTEN_H
#define PD_LISTEN_H

#include "daemon/server.h"

/* Bind the Unix socket at path with the file mode given: refuses to start
 * when another server answers there, replaces a stale socket file, and
 * creates the default directory (mode 0700) when the path is the default. */
int pd_listen_unix(pd_server *s, const char *path, unsigned mode, int create_dir);

/* Bind HOST:PORT (validated by pd_config_validate). */
int pd_listen_tcp(pd_server *s, const char *hostport);

/* Stop listening; removes the socket file. */
void pd_listen_close(pd_server *s);

/* Read the first line of the token file into s->token. Refuses an empty
 * token; warns when the file is readable by others. */
int pd_listen_load_token(pd_server *s, const char *path);

#endif
