/* Integration-test harness: run a real permd on a temporary socket and state dir, and speak raw frames to it. */
#ifndef PERMD_TEST_HARNESS_H
#define PERMD_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/frame.h"

typedef struct harness {
    char dir[64];     /* temporary directory, removed by harness_cleanup */
    char sock[128];   /* dir/permd.sock */
    char state[128];  /* dir/state */
    char log[128];    /* permd's stderr */
    char tcp[64];     /* "127.0.0.1:PORT" when started with TCP, else "" */
    pid_t pid;
} harness;

/* A loopback TCP port nothing listens on now. */
int harness_free_port(void);
/* A free loopback port for a --metrics endpoint, written as "127.0.0.1:PORT" into addr; returns the port
 * (for harness_metric). */
int harness_metrics_addr(char addr[32]);
/* Make the temporary directory. */
void harness_init(harness *h);
/* Start permd (or $PERMD_TEST_BIN, e.g. a valgrind wrapper) on h's socket and state dir with extra flags (NULL-terminated
 * list, may be NULL); with_tcp adds --tcp on a free loopback port. Returns 0
 * once the socket accepts, -1 if permd exited (its status in *status). */
int harness_start(harness *h, int with_tcp, const char *const *extra, int *status);
/* Send sig and wait (30 s at most, then SIGKILL): the exit status as
 * waitpid reports it, or -1. */
int harness_stop(harness *h, int sig);
/* Whether a waitpid/system status (harness_stop's) is a normal exit with this code; -1 is not. */
int harness_exited_with(int status, int code);
/* Remove the directory (after stopping). */
void harness_cleanup(harness *h);
/* A cmocka group teardown's work: stop with SIGTERM and clean up; 0 when permd exited 0, else -1. */
int harness_finish(harness *h);
/* Store a dataset through a fresh client connection: 0 or -1. */
int harness_put(const harness *h, const char *name, uint64_t size);
/* permd's resident memory in KiB (VmRSS). */
long harness_rss_kb(const harness *h);
/* Whether permd's log contains s. */
int harness_log_contains(const harness *h, const char *s);

/* ---- Fake servers (a test's thread playing permd) ---- */

#define HARNESS_FILLERS 3

/* Listen on a Unix socket at dir/fake.sock, dir a fresh private directory (dir and path get their names):
 * the listening fd, or -1. */
int harness_fake_listen(char dir[64], char path[128]);
/* Close the listening fd and remove the socket and its directory. */
void harness_fake_close(int fd, const char *dir, const char *path);
/* A loopback TCP listener whose accept queue is full (backlog 0, filled by connections no one accepts), so
 * the kernel drops a further connect's SYNs and the connect waits for minutes: a peer that never answers.
 * The listening fd (its port in *port) and the fillers' fds in fillers; harness_full_close closes them. */
int harness_full_tcp_listener(uint16_t *port, int fillers[HARNESS_FILLERS]);
void harness_full_close(int fd, const int fillers[HARNESS_FILLERS]);

/* ---- Raw protocol ---- */

int raw_connect_unix(const char *path);
int raw_connect_tcp(const char *hostport);
/* Write all bytes; 0 or -1. */
int raw_send(int fd, const void *buf, size_t len);
int raw_send_env(int fd, const pd_envelope *env);
/* A sharded PutDataset part of `name` (request id 5): shards [first, first + n) of total, all of size 1. */
int raw_send_upload_part(int fd, const char *name, uint64_t total, uint64_t first, size_t n);
/* A Stream request (id) of the slice sl: batches of `batch`, `credits`, at most max_count ids (0: the slice),
 * locations for a sharded dataset's (shard, offset) pairs. */
int raw_send_stream(int fd, uint64_t id, Permd__V1__Slice *sl, uint64_t batch, uint32_t credits, uint64_t max_count,
                    int locations);
/* Read one frame (waiting at most timeout_ms) and unpack it: 0, 1 on EOF,
 * -1 on error or timeout. Free *env with protobuf_c_message_free_unpacked. */
int raw_recv_env(int fd, int timeout_ms, pd_envelope **env);
/* Expect an Error with this code; returns 0 or fails the test. */
void raw_expect_error(int fd, Permd__V1__ErrorCode code);
/* Whether the server closes the connection (EOF) within timeout_ms. */
int raw_wait_eof(int fd, int timeout_ms);
/* The value of the sample `series` (a metric's name and labels, as /metrics writes them) that permd's
 * metrics endpoint on 127.0.0.1:port serves now, or -1 when it is not there or cannot be read. */
long long harness_metric(int port, const char *series);

#endif
