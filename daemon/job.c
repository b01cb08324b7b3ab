/* Worker-pool jobs on behalf of connections: the connection's reference, its promised output and its busy state. */
#include "daemon/job.h"

#include "core/error.h"
#include "daemon/log.h"

static void pd_job_run(uv_work_t *req)
{
    pd_job *job = (pd_job *)req;
    job->run(job);
}

static void pd_job_after(uv_work_t *req, int status);

/* The job whose done callback runs now on this loop's thread, and whether it asked to run again:
 * after done returns the job may be freed, so the answer cannot live in it. */
static _Thread_local pd_job *pd_job_in_done;
static _Thread_local int pd_job_again;

int pd_job_continue(pd_job *job)
{
    if (job != pd_job_in_done)
        return PD_EINVAL;
    if (pd_conn_peer_gone(job->conn)) { /* nobody to answer: stop here, and close (it read nothing meanwhile) */
        pd_log_info("conn_gone", "conn=%llu msg=\"the peer left during a long request: its work stops\"",
                    (unsigned long long)pd_conn_serial(job->conn));
        pd_conn_close(job->conn);
        return PD_ECLOSED;
    }
    if (uv_queue_work(pd_conn_loop(job->conn), &job->req, pd_job_run, pd_job_after))
        return PD_EINTERNAL;
    pd_job_again = 1;
    return 0;
}

static void pd_job_after(uv_work_t *req, int status)
{
    pd_job *job = (pd_job *)req;
    pd_conn *c = job->conn;
    int request = job->request;
    size_t out_bytes = job->out_bytes;
    (void)status; /* jobs are never cancelled */
    pd_conn_job_settle(c, out_bytes); /* its replies are sent now: no longer promised */
    pd_job_in_done = job;
    pd_job_again = 0;
    job->done(job); /* frees the job, unless it continued (then a worker may run it already) */
    pd_job_in_done = NULL;
    if (pd_job_again) { /* queued again: the connection stays held */
        pd_conn_job_hold(c, out_bytes);
        return;
    }
    pd_conn_job_end(c, request);
}

int pd_job_cancelled(const pd_job *job)
{
    /* The job's reference keeps the connection alive while it runs. */
    return pd_conn_cancelled(job->conn);
}

static int pd_job_queue(pd_job *job, pd_conn *c, pd_job_fn run, pd_job_fn done, size_t out_bytes, int request)
{
    job->conn = c;
    job->run = run;
    job->done = done;
    job->out_bytes = out_bytes;
    job->request = request;
    if (uv_queue_work(pd_conn_loop(c), &job->req, pd_job_run, pd_job_after))
        return PD_EINTERNAL;
    pd_conn_job_begin(c, out_bytes, request);
    return 0;
}

int pd_job_submit_request(pd_job *job, pd_conn *c, pd_job_fn run, pd_job_fn done, size_t out_bytes)
{
    return pd_job_queue(job, c, run, done, out_bytes, 1);
}

int pd_job_submit(pd_job *job, pd_conn *c, pd_job_fn run, pd_job_fn done, size_t out_bytes)
{
    return pd_job_queue(job, c, run, done, out_bytes, 0);
}
