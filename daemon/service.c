/* The per-loop inline budget (refilled once per libuv iteration by a check handle), and a session's authentication. */
#include "daemon/service.h"

#include <stdio.h>
#include <time.h>

#include "core/error.h"
#include "daemon/job.h"

static void pd_on_budget(uv_check_t *h)
{
    pd_loop *l = h->data;
    l->inline_left = l->svc->cfg->inline_ids;
}

void pd_loop_init(pd_loop *l, pd_service *svc, uv_loop_t *uv, unsigned index)
{
    l->svc = svc;
    l->uv = uv;
    l->index = index;
    l->inline_left = svc->cfg->inline_ids;
    uv_check_init(uv, &l->budget);
    l->budget.data = l;
    uv_check_start(&l->budget, pd_on_budget);
    uv_unref((uv_handle_t *)&l->budget); /* never what keeps the loop alive */
}

void pd_loop_close(pd_loop *l)
{
    if (!uv_is_closing((uv_handle_t *)&l->budget))
        uv_close((uv_handle_t *)&l->budget, NULL);
}

int pd_loop_take_inline(pd_loop *l, uint64_t count)
{
    if (count > l->inline_left)
        return 0;
    l->inline_left -= count;
    return 1;
}

void pd_session_authenticate(pd_session *s)
{
    s->authed = 1;
    pd_conn_set_max_frame(s->conn, (uint32_t)s->svc->cfg->max_frame);
    pd_conn_set_deadline(s->conn, 0);
}

int pd_service_write_turn(pd_service *svc)
{
    if (!atomic_exchange(&svc->registry_writer, 1))
        return 1;
    const struct timespec pause = {0, 200 * 1000};
    nanosleep(&pause, NULL);
    return 0;
}

void pd_service_write_done(pd_service *svc)
{
    atomic_store(&svc->registry_writer, 0);
}

int pd_service_write_again(pd_job *job, int *rc, char *why, size_t len)
{
    /* its connection closed, or permd stopping: nobody waits for this write, which never began */
    int err = pd_job_cancelled(job) ? PD_ECLOSED : pd_job_continue(job);
    if (err == 0)
        return 1;
    *rc = err == PD_ECLOSED ? err : PD_EINTERNAL;
    snprintf(why, len, "cannot queue work");
    return 0;
}
