/* Integration: the Unix socket's mode is what admits a uid, allow_uids (SO_PEERCRED) narrows it, TCP tokens and non-loopback refusals, the default socket's directory must be the user's alone. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

#define NOBODY 65534

/* What a client running as `uid` sees on the socket, measured in a child
 * process that drops root: 0 served, 1 connect refused by the file mode
 * (EACCES), 2 UNAUTHENTICATED and closed, 3 anything else. */
static int outcome_as(const char *sock, uid_t uid)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (setgroups(0, NULL) || setgid(uid) || setuid(uid))
            _exit(3);
        int fd = raw_connect_unix(sock);
        if (fd < 0)
            _exit(errno == EACCES ? 1 : 3);
        Permd__V1__Stats st = PERMD__V1__STATS__INIT;
        pd_envelope env = PERMD__V1__ENVELOPE__INIT, *rep;
        env.id = 1;
        env.body_case = PERMD__V1__ENVELOPE__BODY_STATS;
        env.stats = &st;
        raw_send_env(fd, &env);
        if (raw_recv_env(fd, 10000, &rep))
            _exit(3);
        int served = rep->body_case == PERMD__V1__ENVELOPE__BODY_STATS_REPLY;
        int refused = rep->body_case == PERMD__V1__ENVELOPE__BODY_ERROR && rep->id == 0 &&
                      rep->error->code == PERMD__V1__ERROR_CODE__ERROR_CODE_UNAUTHENTICATED &&
                      strstr(rep->error->message, "allow_uids") && raw_wait_eof(fd, 10000);
        _exit(served ? 0 : refused ? 2 : 3);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}

static void start(harness *h, const char *const *extra)
{
    harness_init(h);
    chmod(h->dir, 0711); /* others may reach the socket; its own mode decides */
    assert_int_equal(harness_start(h, 0, extra, NULL), 0);
}

static void stop(harness *h)
{
    assert_true(harness_exited_with(harness_stop(h, SIGTERM), 0));
    harness_cleanup(h);
}

static void test_socket_mode_is_honoured(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* needs a second uid */
    harness h;
    const char *owner_only[] = {"--socket-mode", "0600", NULL};
    start(&h, owner_only);
    struct stat st;
    assert_int_equal(stat(h.sock, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(outcome_as(h.sock, NOBODY), 1);
    assert_int_equal(outcome_as(h.sock, 0), 0);
    stop(&h);

    const char *everyone[] = {"--socket-mode", "0666", NULL}; /* the control: the mode is what refused */
    start(&h, everyone);
    assert_int_equal(outcome_as(h.sock, NOBODY), 0);
    stop(&h);
}

static void test_allow_uids(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    harness h;
    const char *root_only[] = {"--socket-mode", "0666", "--allow-uids", "0", NULL};
    start(&h, root_only);
    assert_int_equal(outcome_as(h.sock, NOBODY), 2);
    assert_int_equal(outcome_as(h.sock, NOBODY), 2);
    assert_int_equal(outcome_as(h.sock, 0), 0);
    assert_true(harness_log_contains(&h, "reason=peer_uid uid=65534"));
    permd_client *c;
    permd_stats s;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    assert_int_equal(permd_stats_get(c, &s), 0);
    assert_int_equal(s.connections_rejected_total, 2);
    int found = 0;
    for (uint32_t i = 0; i < s.nerrors; i++)
        if (!strcmp(s.errors[i].type, "connection") && !strcmp(s.errors[i].code, "UNAUTHENTICATED"))
            found = s.errors[i].count == 2;
    assert_true(found);
    permd_close(c);
    stop(&h);

    /* Listed uids only: root itself is refused when not listed. */
    const char *nobody_only[] = {"--socket-mode", "0666", "--allow-uids", "1000,65534", NULL};
    start(&h, nobody_only);
    assert_int_equal(outcome_as(h.sock, NOBODY), 0);
    assert_int_equal(permd_connect_unix(h.sock, &c), PERMD_EAUTH);
    assert_non_null(strstr(permd_last_error(NULL), "uid 0 is not in permd's allow_uids"));
    stop(&h);
}

static void test_allow_uids_config(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    char cfg[160];
    snprintf(cfg, sizeof cfg, "%s/permd.yaml", h.dir);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "allow_uids: [%u, 4242]\n", (unsigned)geteuid());
    fclose(f);
    const char *extra[] = {"--config", cfg, NULL};
    assert_int_equal(harness_start(&h, 0, extra, NULL), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0); /* listed: served */
    permd_close(c);
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));

    int status;
    const char *bad[] = {"--allow-uids", "1000,bob", NULL};
    assert_int_equal(harness_start(&h, 0, bad, &status), -1);
    assert_true(harness_exited_with(status, 2));
    assert_true(harness_log_contains(&h, "allow_uids: 'bob' is not a uid"));
    harness_cleanup(&h);
}

static void test_tcp_token(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    char token[160];
    snprintf(token, sizeof token, "%s/token", h.dir);
    FILE *f = fopen(token, "w");
    fputs("0123456789abcdef\n", f);
    fclose(f);
    chmod(token, 0600);
    const char *extra[] = {"--token-file", token, NULL};
    assert_int_equal(harness_start(&h, 1, extra, NULL), 0);
    permd_client *c;
    /* Wrong in the last byte, a prefix, one byte longer, empty: all refused alike. */
    const char *wrong[] = {"0123456789abcdeF", "0123456789abcde", "0123456789abcdef0", ""};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        assert_int_equal(permd_connect_tcp(h.tcp, wrong[i], &c), PERMD_EAUTH);
        assert_non_null(strstr(permd_last_error(NULL), "UNAUTHENTICATED"));
    }
    assert_int_equal(permd_connect_tcp(h.tcp, "0123456789abcdef", &c), 0);
    permd_close(c);
    assert_int_equal(permd_connect_unix(h.sock, &c), 0); /* the Unix socket needs none */
    permd_close(c);
    assert_true(harness_log_contains(&h, "event=auth_fail"));
    /* A frame above max_preauth_frame before the Hello: TOO_LARGE names that key, not max_frame. */
    int fd = raw_connect_tcp(h.tcp);
    assert_true(fd >= 0);
    uint8_t len[4] = {0x88, 0x13, 0, 0}; /* 5000 bytes, above the default 4096 */
    assert_int_equal(raw_send(fd, len, sizeof len), 0);
    pd_envelope *rep;
    assert_int_equal(raw_recv_env(fd, 10000, &rep), 0);
    assert_int_equal(rep->body_case, PERMD__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(rep->error->code, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    assert_non_null(strstr(rep->error->message, "exceeds max_preauth_frame (4096 bytes)"));
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    close(fd);
    assert_true(harness_exited_with(harness_stop(&h, SIGTERM), 0));

    /* Non-loopback TCP without a token: refused at startup, with or without other keys. */
    int status;
    const char *open_v4[] = {"--tcp", "0.0.0.0:7471", NULL};
    assert_int_equal(harness_start(&h, 0, open_v4, &status), -1);
    assert_true(harness_exited_with(status, 2));
    const char *open_v6[] = {"--tcp", "[::]:7471", NULL};
    assert_int_equal(harness_start(&h, 0, open_v6, &status), -1);
    assert_true(harness_exited_with(status, 2));
    assert_true(harness_log_contains(&h, "not a loopback address; set token_file"));
    harness_cleanup(&h);
}

/* The default socket (no XDG_RUNTIME_DIR, no PERMD_SOCKET) lives in /tmp/permd-<uid>, a name any
 * user can take first in /tmp. Each runs as uid in a child; the directory is made beforehand. */

/* A client's permd_connect_unix(NULL) as uid: 0 connected, 1 PERMD_EAUTH (the directory refused),
 * 2 anything else. */
static int default_client_as(uid_t uid)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (setgroups(0, NULL) || setgid(uid) || setuid(uid))
            _exit(2);
        unsetenv("XDG_RUNTIME_DIR");
        unsetenv("PERMD_SOCKET");
        permd_client *c;
        int rc = permd_connect_unix(NULL, &c);
        if (rc == 0)
            permd_close(c);
        _exit(rc == 0 ? 0 : rc == PERMD_EAUTH && strstr(permd_last_error(NULL), "refusing") ? 1 : 2);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

/* permd as uid on the default socket (its log in h->log, its registry in h->state): 1 when it exits
 * 1 without listening; 0 when it listens at sock, *client then being default_client_as(uid) while it
 * runs, and exits 0 on SIGTERM; 2 anything else. */
static int default_daemon_as(const harness *h, uid_t uid, const char *sock, int *client)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(h->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0 || setgroups(0, NULL) || setgid(uid) || setuid(uid))
            _exit(3);
        unsetenv("XDG_RUNTIME_DIR");
        unsetenv("PERMD_SOCKET");
        execl(PERMD_BIN, PERMD_BIN, "--state-dir", h->state, "--metrics", "", "--workers", "1", "--loops", "1",
              (char *)NULL);
        _exit(3);
    }
    int status, fd = -1;
    for (int i = 0; i < 3000 && fd < 0; i++) { /* up to 30 s for a cold start under sanitizers */
        if (waitpid(pid, &status, WNOHANG) == pid)
            return harness_exited_with(status, 1) ? 1 : 2;
        if ((fd = raw_connect_unix(sock)) < 0)
            usleep(10000);
    }
    if (fd >= 0) {
        close(fd);
        *client = default_client_as(uid);
    }
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    return fd >= 0 && harness_exited_with(status, 0) ? 0 : 2;
}

/* Whether uid may run permd where it was built: a checkout under a private directory (mktemp -d's 0700, as
 * in a clean-clone CI run) is out of another user's reach. */
static int uid_can_run_permd(uid_t uid)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(setgroups(0, NULL) || setgid(uid) || setuid(uid) || access(PERMD_BIN, X_OK) ? 1 : 0);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static char default_dir[64], default_sock[96];

/* Whatever the test's outcome, /tmp keeps no directory of it. */
static int default_dir_teardown(void **state)
{
    (void)state;
    if (default_dir[0]) {
        unlink(default_sock);
        rmdir(default_dir);
    }
    return 0;
}

static void test_default_socket_dir_must_be_ours(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* needs a second uid */
    uid_t uid = 60000 + (uid_t)(getpid() % 5000); /* no one's: its /tmp/permd-<uid> is this test's alone */
    if (!uid_can_run_permd(uid)) {
        fprintf(stderr, "skipped: uid %u cannot reach %s (a directory above it is private)\n", (unsigned)uid,
                PERMD_BIN);
        skip();
    }
    char *dir = default_dir, *sock = default_sock;
    snprintf(default_dir, sizeof default_dir, "/tmp/permd-%u", (unsigned)uid);
    snprintf(default_sock, sizeof default_sock, "%s/permd.sock", dir);
    harness h;
    harness_init(&h);
    chmod(h.dir, 0711);
    assert_int_equal(mkdir(h.state, 0700), 0);
    assert_int_equal(chown(h.state, uid, uid), 0);
    unlink(sock);
    rmdir(dir);
    int client = -1;

    /* Made first by another user, open to all: the daemon and clients refuse it. */
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(chmod(dir, 0777), 0);
    assert_int_equal(chown(dir, NOBODY, NOBODY), 0);
    assert_int_equal(default_daemon_as(&h, uid, sock, &client), 1);
    assert_true(harness_log_contains(&h, "refusing the socket directory"));
    assert_true(harness_log_contains(&h, "it is owned by uid 65534"));
    assert_int_equal(default_client_as(uid), 1);
    /* Another user's even when closed to others. */
    assert_int_equal(chmod(dir, 0700), 0);
    assert_int_equal(default_daemon_as(&h, uid, sock, &client), 1);
    assert_int_equal(default_client_as(uid), 1);
    /* The user's own, but others may write in it (replace the socket): refused too. */
    assert_int_equal(chown(dir, uid, uid), 0);
    assert_int_equal(chmod(dir, 0733), 0);
    assert_int_equal(default_daemon_as(&h, uid, sock, &client), 1);
    assert_true(harness_log_contains(&h, "lets group or others write in it"));
    assert_int_equal(default_client_as(uid), 1);
    /* The control: the user's alone, found or made by permd, is served through. */
    assert_int_equal(chmod(dir, 0700), 0);
    assert_int_equal(default_daemon_as(&h, uid, sock, &client), 0);
    assert_int_equal(client, 0);
    assert_int_equal(rmdir(dir), 0); /* the socket went with a clean exit */
    client = -1;
    assert_int_equal(default_daemon_as(&h, uid, sock, &client), 0);
    assert_int_equal(client, 0);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_uid, uid);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(rmdir(dir), 0);
    harness_cleanup(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_socket_mode_is_honoured),
        cmocka_unit_test(test_allow_uids),
        cmocka_unit_test(test_allow_uids_config),
        cmocka_unit_test(test_tcp_token),
        cmocka_unit_test_teardown(test_default_socket_dir_must_be_ours, default_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
