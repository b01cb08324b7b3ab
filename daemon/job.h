/* Work a connection hands to the libuv worker pool: generation too large for the loop, and SQLite commits. */
#ifndef PD_JOB_H
#define PD_JOB_H

#include <stddef.h>

#include <uv.h>

struct pd_conn;
typedef struct pd_job pd_job;
typedef void (*pd_job_fn)(pd_job *job);

/* Embed as the first member of a job type. */
struct pd_job {
    uv_work_t req;
    struct pd_conn *conn;
    pd_job_fn run;    /* on a worker thread: touch nothing but the job */
    pd_job_fn done;   /* on the loop: reply if pd_conn_open(conn), then free the job */
    size_t out_bytes; /* reply size it will add, counted against output_cap meanwhile */
};

/* Whether the job's connection has closed or permd is stopping: a job that
 * runs long (a Digest) checks between chunks and gives up. Any thread. */
int pd_job_cancelled(const pd_job *job);

/* Queue a job; it holds a reference on the connection until done returns.
 * PD_EINTERNAL when libuv refuses (the caller still owns the job). */
int pd_job_submit(pd_job *job, struct pd_conn *c, pd_job_fn run, pd_job_fn done, size_t out_bytes);

#endif
