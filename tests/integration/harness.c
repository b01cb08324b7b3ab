/* Integration-test harness: spawn permd (fork/exec), wait for its socket, stop it, and raw frame I/O. */
#define _GNU_SOURCE
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "proto/endpoint.h"

int harness_fake_listen(char dir[64], char path[128])
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(dir, "/tmp/permd-fake-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, 128, "%s/fake.sock", dir);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 4)) {
        if (fd >= 0)
            close(fd);
        rmdir(dir);
        return -1;
    }
    return fd;
}

void harness_fake_close(int fd, const char *dir, const char *path)
{
    close(fd);
    unlink(path);
    rmdir(dir);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int harness_full_tcp_listener(uint16_t *port, int fillers[HARNESS_FILLERS])
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 0) || getsockname(l, (struct sockaddr *)&a, &len))
        return -1;
    *port = ntohs(a.sin_port);
    for (int i = 0; i < HARNESS_FILLERS; i++) { /* the first fills the queue; the others' SYNs wait already */
        fillers[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fillers[i] < 0 || (connect(fillers[i], (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS))
            return -1;
    }
    sleep_ms(50); /* their handshakes */
    return l;
}

void harness_full_close(int fd, const int fillers[HARNESS_FILLERS])
{
    for (int i = 0; i < HARNESS_FILLERS; i++)
        close(fillers[i]);
    close(fd);
}

void harness_init(harness *h)
{
    memset(h, 0, sizeof *h);
    strcpy(h->dir, "/tmp/permd-it-XXXXXX");
    if (!mkdtemp(h->dir))
        fail_msg("mkdtemp: %s", strerror(errno));
    snprintf(h->sock, sizeof h->sock, "%s/permd.sock", h->dir);
    snprintf(h->state, sizeof h->state, "%s/state", h->dir);
    snprintf(h->log, sizeof h->log, "%s/permd.log", h->dir);
}

int harness_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || getsockname(fd, (struct sockaddr *)&sa, &len))
        fail_msg("no free port: %s", strerror(errno));
    close(fd);
    return ntohs(sa.sin_port);
}

int harness_metrics_addr(char addr[32])
{
    int port = harness_free_port();
    snprintf(addr, 32, "127.0.0.1:%d", port);
    return port;
}

int harness_start(harness *h, int with_tcp, const char *const *extra, int *status)
{
    /* PERMD_TEST_BIN runs permd through a wrapper (valgrind) instead. */
    const char *bin = getenv("PERMD_TEST_BIN") ? getenv("PERMD_TEST_BIN") : PERMD_BIN;
    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--socket";
    argv[n++] = h->sock;
    argv[n++] = "--state-dir";
    argv[n++] = h->state;
    argv[n++] = "--log-level";
    argv[n++] = "debug";
    if (with_tcp) {
        snprintf(h->tcp, sizeof h->tcp, "127.0.0.1:%d", harness_free_port());
        argv[n++] = "--tcp";
        argv[n++] = h->tcp;
    }
    for (int i = 0; extra && extra[i] && n < 63; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;

    pid_t pid = fork();
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        /* A failed assertion skips cleanup: take permd down with the test, and
         * keep it off the test's stdout so nothing waits on an orphan. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(h->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDERR_FILENO);
            dup2(fd, STDOUT_FILENO);
            close(fd);
        }
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    h->pid = pid;
    for (int i = 0; i < 3000; i++) { /* up to 30 s for a cold start under sanitizers or valgrind */
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            h->pid = 0;
            if (status)
                *status = st;
            return -1;
        }
        int fd = raw_connect_unix(h->sock);
        if (fd >= 0) {
            close(fd);
            if (!with_tcp || (fd = raw_connect_tcp(h->tcp)) >= 0) {
                if (with_tcp)
                    close(fd);
                return 0;
            }
        }
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    h->pid = 0;
    fail_msg("permd did not start listening on %s", h->sock);
    return -1;
}

/* An unexpected end of permd (not asked for with SIGKILL) leaves its log on stderr: CI keeps only
 * the test's output, and harness_cleanup removes the directory the log lives in. */
static void harness_show_log(const harness *h, int st)
{
    char line[2048];
    FILE *f = fopen(h->log, "r");
    fprintf(stderr, "harness: permd (pid %d) ended with status %#x; its log:\n", (int)h->pid, st);
    if (!f)
        return;
    while (fgets(line, sizeof line, f))
        fprintf(stderr, "  | %s", line);
    fclose(f);
}

int harness_stop(harness *h, int sig)
{
    int st = -1;
    if (!h->pid)
        return -1;
    kill(h->pid, sig);
    for (int i = 0; i < 3000; i++) {
        if (waitpid(h->pid, &st, WNOHANG) == h->pid)
            goto done;
        sleep_ms(10);
    }
    kill(h->pid, SIGKILL);
    waitpid(h->pid, &st, 0);
    st = -1;
done:
    if (sig != SIGKILL && !harness_exited_with(st, 0))
        harness_show_log(h, st);
    h->pid = 0;
    return st;
}

void harness_cleanup(harness *h)
{
    if (h->pid)
        harness_stop(h, SIGKILL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", h->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "harness: could not remove %s\n", h->dir);
}

int harness_exited_with(int status, int code)
{
    return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == code;
}

int harness_finish(harness *h)
{
    int st = harness_stop(h, SIGTERM);
    harness_cleanup(h);
    return harness_exited_with(st, 0) ? 0 : -1;
}

int harness_put(const harness *h, const char *name, uint64_t size)
{
    permd_client *c;
    if (permd_connect_unix(h->sock, &c))
        return -1;
    int rc = permd_put_dataset(c, name, size, NULL, NULL);
    permd_close(c);
    return rc ? -1 : 0;
}

long harness_rss_kb(const harness *h)
{
    char path[64], line[256];
    long kb = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)h->pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

int harness_log_contains(const harness *h, const char *s)
{
    FILE *f = fopen(h->log, "r");
    char line[2048];
    int found = 0;
    if (!f)
        return 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, s) != NULL;
    fclose(f);
    return found;
}

/* ---- Raw protocol ---- */

int raw_connect_unix(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return -1;
    }
    return fd;
}

int raw_connect_tcp(const char *hostport)
{
    char host[64];
    uint16_t port;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (pd_endpoint_parse_hostport(hostport, host, sizeof host, &port))
        return -1;
    sa.sin_port = htons(port);
    inet_pton(AF_INET, host, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return -1;
    }
    return fd;
}

int raw_send(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int raw_send_upload_part(int fd, const char *name, uint64_t total, uint64_t first, size_t n)
{
    uint64_t *sizes = malloc(n * sizeof *sizes + 1);
    if (!sizes)
        return -1;
    for (size_t i = 0; i < n; i++)
        sizes[i] = 1;
    Permd__V1__PutDataset m = PERMD__V1__PUT_DATASET__INIT;
    m.name = (char *)name;
    m.shards_total = total;
    m.shards_first = first;
    m.n_shard_sizes = n;
    m.shard_sizes = sizes;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 5;
    env.body_case = PERMD__V1__ENVELOPE__BODY_PUT_DATASET;
    env.put_dataset = &m;
    int rc = raw_send_env(fd, &env);
    free(sizes);
    return rc;
}

int raw_send_stream(int fd, uint64_t id, Permd__V1__Slice *sl, uint64_t batch, uint32_t credits, uint64_t max_count,
                    int locations)
{
    Permd__V1__Stream m = PERMD__V1__STREAM__INIT;
    m.slice = sl;
    m.batch = batch;
    m.credits = credits;
    m.max_count = max_count;
    m.locations = locations != 0;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_STREAM;
    env.stream = &m;
    return raw_send_env(fd, &env);
}

int raw_send_env(int fd, const pd_envelope *env)
{
    uint8_t *buf = malloc(pd_frame_size(env));
    size_t n = pd_frame_pack(env, buf);
    int rc = raw_send(fd, buf, n);
    free(buf);
    return rc;
}

static int raw_recv_exact(int fd, uint8_t *p, size_t len, int timeout_ms)
{
    while (len) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int ready = poll(&pf, 1, timeout_ms);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            return -1;
        ssize_t n = recv(fd, p, len, 0);
        if (n == 0)
            return 1;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == ECONNRESET ? 1 : -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int raw_recv_env(int fd, int timeout_ms, pd_envelope **env)
{
    uint8_t hdr[4];
    int rc = raw_recv_exact(fd, hdr, 4, timeout_ms);
    if (rc < 0)
        fprintf(stderr, "raw_recv_env: timeout or error before a frame\n");
    if (rc)
        return rc;
    uint32_t len = pd_load_le32(hdr);
    uint8_t *buf = malloc(len + 1);
    rc = raw_recv_exact(fd, buf, len, timeout_ms);
    if (rc == 0 && pd_frame_unpack(buf, len, NULL, env)) {
        fprintf(stderr, "raw_recv_env: a frame of %u bytes does not unpack\n", len);
        rc = -1;
    } else if (rc) {
        fprintf(stderr, "raw_recv_env: %s while reading a frame of %u bytes\n", rc > 0 ? "EOF" : "timeout or error",
                len);
    }
    free(buf);
    return rc;
}

void raw_expect_error(int fd, Permd__V1__ErrorCode code)
{
    pd_envelope *env = NULL;
    int rc = raw_recv_env(fd, 10000, &env);
    if (rc)
        fail_msg("expected error %s, got rc=%d", pd_wire_error_name(code), rc);
    if (env->body_case != PERMD__V1__ENVELOPE__BODY_ERROR || env->error->code != code)
        fail_msg("expected error %s, got body %d (%s)", pd_wire_error_name(code), (int)env->body_case,
                 env->body_case == PERMD__V1__ENVELOPE__BODY_ERROR ? env->error->message : "");
    assert_true(env->error->message[0] != '\0'); /* every error explains itself */
    protobuf_c_message_free_unpacked(&env->base, NULL);
}

int raw_wait_eof(int fd, int timeout_ms)
{
    char buf[4096];
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, timeout_ms) <= 0)
            return 0;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0 && errno != EINTR)
            return 0;
    }
}

long long harness_metric(int port, const char *series)
{
    char hp[32], line[512];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", port);
    int fd = raw_connect_tcp(hp);
    if (fd < 0)
        return -1;
    const char *req = "GET /metrics HTTP/1.1\r\n\r\n";
    raw_send(fd, req, strlen(req));
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return -1;
    }
    long long v = -1;
    size_t len = strlen(series);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, series, len) && line[len] == ' ')
            v = atoll(line + len + 1);
    fclose(f);
    return v;
}
