/* Sessions: a connection's service side, from admission to teardown; the transport's callbacks land here. */
#ifndef PD_SESSION_H
#define PD_SESSION_H

#include "daemon/conn.h"
#include "daemon/service.h"

/* Admission, decided where connections are accepted (any loop): whether one more connection of
 * this transport fits its cap; if so it is counted until its session closes. */
int pd_session_admit(pd_service *svc, int is_tcp);
/* A place pd_session_admit counted is free again (the connection never reached a session). */
void pd_session_release(pd_service *svc, int is_tcp);

/* Serve a new connection of loop l: its session is created and the connection starts reading.
 * A connection that was not admitted (pd_session_admit said no), whose peer uid is not allowed, or
 * for which memory runs out is answered with an Error and closed. */
void pd_session_open(pd_loop *l, pd_conn *c, int admitted);

#endif
