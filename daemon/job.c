/* Worker-pool jobs on behalf of connections: accounting of references, output promised and jobs in flight. */
#include "daemon/job.h"

#include "core/error.h"
#include "daemon/conn.h"

static void pd_job_run(uv_work_t *req)
{
    pd_job *job = (pd_job *)req;
    job->run(job);
}

static void pd_job_after(uv_work_t *req, int status)
{
    pd_job *job = (pd_job *)req;
    pd_conn *c = job->conn;
    pd_server *s = c->srv;
    (void)status; /* jobs are never cancelled */
    s->jobs--;
    c->job_bytes -= job->out_bytes;
    job->done(job);
    pd_conn_unref(c);
    pd_server_maybe_finish(s);
}

int pd_job_cancelled(const pd_job *job)
{
    /* The job's reference keeps the connection alive while it runs. */
    return atomic_load_explicit(&job->conn->cancel, memory_order_relaxed);
}

int pd_job_submit(pd_job *job, pd_conn *c, pd_job_fn run, pd_job_fn done, size_t out_bytes)
{
    job->conn = c;
    job->run = run;
    job->done = done;
    job->out_bytes = out_bytes;
    if (uv_queue_work(c->srv->loop, &job->req, pd_job_run, pd_job_after))
        return PD_EINTERNAL;
    c->srv->jobs++;
    c->job_bytes += out_bytes;
    pd_conn_ref(c);
    return 0;
}
