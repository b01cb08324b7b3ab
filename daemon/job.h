/* Work a connection hands to the libuv worker pool (generation too large for the loop, SQLite commits), tied to its lifetime. */
#ifndef PD_JOB_H
#define PD_JOB_H

#include <stddef.h>

#include <uv.h>

#include "daemon/conn.h"

typedef struct pd_job pd_job;
typedef void (*pd_job_fn)(pd_job *job);

/* Embed as the first member of a job type. */
struct pd_job {
    uv_work_t req;
    pd_conn *conn;
    pd_job_fn run;    /* on a worker thread: touch nothing but the job */
    pd_job_fn done;   /* on the loop: reply if pd_conn_open(conn), then free the job */
    size_t out_bytes; /* reply size it will add, counted against output_cap meanwhile */
    int request;      /* it answers the connection's current request */
};

/* Whether the job's connection has closed or permd is stopping: a job that runs long (a Digest)
 * checks between chunks and gives up. Any thread. */
int pd_job_cancelled(const pd_job *job);

/* Queue a job that answers the connection's current request: the connection reads no further
 * request until done has returned (replies stay in order). The job holds a reference on the
 * connection until then. PD_EINTERNAL when libuv refuses (the caller still owns the job). */
int pd_job_submit_request(pd_job *job, pd_conn *c, pd_job_fn run, pd_job_fn done, size_t out_bytes);

/* Queue a job beside the requests (a stream's batch): the connection goes on reading. */
int pd_job_submit(pd_job *job, pd_conn *c, pd_job_fn run, pd_job_fn done, size_t out_bytes);

/* From done (and only there): instead of ending, queue the job to run again, keeping its
 * connection and its request. 0: queued, and done must return at once without touching the job (a
 * worker may already run it); PD_EINTERNAL: not queued, done ends the job as usual; PD_ECLOSED: not
 * queued because the peer has left (pd_conn_peer_gone): the connection is closed, done ends the job.
 * A long job runs in slices this way: between two slices its worker takes whatever was queued
 * meanwhile, so other connections' work is not held up behind it (libuv's queue is first in, first
 * out). */
int pd_job_continue(pd_job *job);

#endif
