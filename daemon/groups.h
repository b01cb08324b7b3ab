/* NCCL delivery groups: membership over the socket (JoinGroup, Deliver, LeaveGroup), a thread per group driving NCCL. */
#ifndef PD_GROUPS_H
#define PD_GROUPS_H

#include <stdint.h>

#include "daemon/config.h"
#include "daemon/service.h"
#include "proto/frame.h"

typedef struct pd_groups pd_groups;

/* The group table. The NCCL library (libpermd_delivery.so) loads on the first JoinGroup; without it
 * every group request is UNAVAILABLE. PD_ENOMEM. */
int pd_groups_open(const pd_config *cfg, pd_groups **out);
/* Server shutdown: cancel every group; their threads end and their handles close. */
void pd_groups_stop(pd_groups *g);
/* Free the table (after the loops have closed every group). */
void pd_groups_close(pd_groups *g);

void pd_on_join_group(pd_session *s, uint64_t id, const Permd__V1__JoinGroup *m);
void pd_on_deliver(pd_session *s, uint64_t id, const Permd__V1__Deliver *m);
void pd_on_leave_group(pd_session *s, uint64_t id, const Permd__V1__LeaveGroup *m);

/* Groups alive and the sends queued in all of them, for metrics (any thread). */
void pd_groups_counts(pd_groups *g, uint64_t *groups, uint64_t *sends);

/* A session went away: a member that did not leave aborts its group. */
void pd_groups_conn_gone(pd_groups *g, pd_session *s);

#endif
