/* NCCL delivery groups on the daemon side: membership over the socket, a thread per group driving NCCL. */
#ifndef PD_GROUPS_H
#define PD_GROUPS_H

#include "daemon/conn.h"

typedef struct pd_groups pd_groups;

/* The group table. The NCCL library (libpermd_delivery.so) loads on the
 * first JoinGroup; without it every group request is UNAVAILABLE. */
int pd_groups_open(pd_server *s, pd_groups **out);
/* Server shutdown: cancel every group; their threads end and their handles close. */
void pd_groups_stop(pd_groups *g);
/* Free the table (after the loop has closed every group). */
void pd_groups_close(pd_groups *g);

void pd_on_join_group(pd_conn *c, uint64_t id, const Permd__V1__JoinGroup *m);
void pd_on_deliver(pd_conn *c, uint64_t id, const Permd__V1__Deliver *m);
void pd_on_leave_group(pd_conn *c, uint64_t id, const Permd__V1__LeaveGroup *m);

/* A connection went away: a member that did not leave aborts its group. */
void pd_groups_conn_gone(pd_groups *g, pd_conn *c);

#endif
