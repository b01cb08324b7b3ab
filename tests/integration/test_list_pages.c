/* Integration: permd_list_datasets / permd_list_mixtures read a list longer than one reply page by page
 * (docs/protocol.md §5) — against a real permd whose page is small, and against a fake server that pages
 * wrongly (a next that does not advance, a page that repeats a name, a list without end) or not at all (an
 * older daemon that ignores `paged`). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "test_util.h"

#include "client/permd.h"
#include "harness.h"

/* ---- A real permd ---- */

/* Names of PERMD_NAME_MAX characters, so that few fill a page: "<p>-NNNN-xxx…". */
static void long_name(char *out, char prefix, int i)
{
    int n = snprintf(out, PERMD_NAME_MAX + 1, "%c-%04d-", prefix, i);
    memset(out + n, 'x', (size_t)(PERMD_NAME_MAX - n));
    out[PERMD_NAME_MAX] = 0;
}

/* With --max-count 1 one reply holds about 64 KiB, some 450 of these datasets or mixtures: 1000 of each take
 * three pages. Every one comes back exactly once, in order, with its size. */
#define NLIST 1000

static void test_daemon_pages(void **state)
{
    (void)state;
    harness h;
    harness_init(&h);
    const char *extra[] = {"--max-count", "1", NULL};
    int status;
    assert_int_equal(harness_start(&h, 0, extra, &status), 0);
    permd_client *c;
    assert_int_equal(permd_connect_unix(h.sock, &c), 0);
    static char names[NLIST][PERMD_NAME_MAX + 1];
    /* Put in reverse order: the list's order is the daemon's (by name), not the order of puts. */
    for (int i = NLIST - 1; i >= 0; i--) {
        long_name(names[i], 'd', i);
        assert_int_equal(permd_put_dataset(c, names[i], (uint64_t)i + 1, NULL, NULL), 0);
    }
    size_t total = 0;
    assert_int_equal(permd_list_datasets(c, NULL, 0, &total), 0);
    assert_int_equal(total, NLIST);
    permd_dataset *all = calloc(NLIST + 1, sizeof *all);
    assert_non_null(all);
    assert_int_equal(permd_list_datasets(c, all, NLIST + 1, &total), 0);
    assert_int_equal(total, NLIST);
    for (int i = 0; i < NLIST; i++) {
        assert_string_equal(all[i].name, names[i]);
        assert_int_equal(all[i].size, (uint64_t)i + 1);
    }
    /* A smaller array gets the first ones and the whole count. */
    assert_int_equal(permd_list_datasets(c, all, 10, &total), 0);
    assert_int_equal(total, NLIST);
    assert_string_equal(all[9].name, names[9]);
    free(all);

    const char *comp[] = {names[0]};
    const uint64_t starts[] = {0};
    const uint32_t weights[] = {1};
    static char mnames[NLIST][PERMD_NAME_MAX + 1];
    for (int i = NLIST - 1; i >= 0; i--) {
        long_name(mnames[i], 'm', i);
        assert_int_equal(permd_put_mixture(c, mnames[i], comp, 1, starts, weights, 1, 0, 0, NULL, NULL), 0);
    }
    char (*got)[PERMD_NAME_MAX + 1] = calloc(NLIST, sizeof *got);
    assert_non_null(got);
    assert_int_equal(permd_list_mixtures(c, got, NLIST, &total), 0);
    assert_int_equal(total, NLIST);
    for (int i = 0; i < NLIST; i++)
        assert_string_equal(got[i], mnames[i]);
    free(got);
    /* The daemon did page: a client that asks for no pages is refused (what libpermd got before). */
    int fd = raw_connect_unix(h.sock);
    assert_true(fd >= 0);
    Permd__V1__Hello hello = PERMD__V1__HELLO__INIT;
    hello.protocol_version = 1;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = 1;
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    assert_int_equal(raw_send_env(fd, &env), 0);
    pd_envelope *rep;
    assert_int_equal(raw_recv_env(fd, 10000, &rep), 0);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    Permd__V1__ListMixtures lm = PERMD__V1__LIST_MIXTURES__INIT;
    env.id = 2;
    env.body_case = PERMD__V1__ENVELOPE__BODY_LIST_MIXTURES;
    env.list_mixtures = &lm;
    assert_int_equal(raw_send_env(fd, &env), 0);
    raw_expect_error(fd, PERMD__V1__ERROR_CODE__ERROR_CODE_TOO_LARGE);
    close(fd);
    permd_close(c);
    assert_int_equal(harness_finish(&h), 0);
}

/* ---- A fake server ---- */

typedef enum {
    FAKE_OLD,       /* ignores `paged`: the whole list, no next */
    FAKE_STUCK,     /* the second page's next is the first's: it does not advance */
    FAKE_REPEAT,    /* the second page starts again from the first name */
    FAKE_EMPTY,     /* a page without entries that names a next */
    FAKE_ENDLESS,   /* pages of new names for ever */
    FAKE_CHANGING,  /* names put and deleted between pages, as a real registry may */
} fake_kind;

typedef struct fake {
    char dir[64], path[128];
    int listen_fd;
    fake_kind kind;
    int requests;  /* List requests answered */
    int unpaged;   /* List requests without `paged` */
    pthread_t th;
} fake;

static void send_hello_reply(int fd, uint64_t id)
{
    Permd__V1__Limits lim = PERMD__V1__LIMITS__INIT;
    lim.max_frame = 4096;
    lim.max_count = 1000;
    lim.max_credits = 4;
    Permd__V1__HelloReply r = PERMD__V1__HELLO_REPLY__INIT;
    r.protocol_version = 1;
    r.spec_version = 1;
    r.server = "fake";
    r.limits = &lim;
    pd_envelope env = PERMD__V1__ENVELOPE__INIT;
    env.id = id;
    env.body_case = PERMD__V1__ENVELOPE__BODY_HELLO_REPLY;
    env.hello_reply = &r;
    raw_send_env(fd, &env);
}

#define PAGE_MAX 1000

/* The page the fake sends for request number k (0 first) asking after `after`: names into page, *next. */
static size_t fake_page(fake_kind kind, int k, const char *after, char page[][16], char *next)
{
    size_t n = 0;
    next[0] = 0;
    switch (kind) {
    case FAKE_OLD:
        for (; n < 5; n++)
            snprintf(page[n], 16, "d%zu", n);
        break;
    case FAKE_STUCK: /* a, b (next b); then c (next b again) */
        if (k == 0) {
            strcpy(page[n++], "a");
            strcpy(page[n++], "b");
            strcpy(next, "b");
        } else {
            strcpy(page[n++], "c");
            strcpy(next, "b");
        }
        break;
    case FAKE_REPEAT: /* a, b (next b); then a, b again */
        strcpy(page[n++], "a");
        strcpy(page[n++], "b");
        strcpy(next, "b");
        break;
    case FAKE_EMPTY:
        if (k == 0) {
            strcpy(page[n++], "a");
            strcpy(next, "a");
        } else {
            strcpy(next, "b");
        }
        break;
    case FAKE_ENDLESS:
        for (; n < PAGE_MAX; n++)
            snprintf(page[n], 16, "n%09d", k * PAGE_MAX + (int)n);
        strcpy(next, page[n - 1]);
        break;
    case FAKE_CHANGING: {
        /* After the first page "a0" is put (before `after`: not seen), "f1" too (ahead: seen) and "e" (not yet
         * sent) is deleted; two names a page. */
        const char *v0[] = {"a", "b", "c", "d", "e", "f"};
        const char *v1[] = {"a", "a0", "b", "c", "d", "f", "f1"};
        const char **v = k == 0 ? v0 : v1;
        size_t nv = k == 0 ? 6 : 7, i = 0;
        while (i < nv && after[0] && strcmp(v[i], after) <= 0)
            i++;
        for (; i < nv && n < 2; i++)
            strcpy(page[n++], v[i]);
        if (i < nv)
            strcpy(next, page[n - 1]);
        break;
    }
    }
    return n;
}

/* One connection: Hello, then List requests answered by kind until the client hangs up. */
static void *fake_main(void *arg)
{
    fake *f = arg;
    int fd = accept(f->listen_fd, NULL, NULL);
    pd_envelope *env;
    if (fd < 0 || raw_recv_env(fd, 10000, &env))
        return NULL;
    send_hello_reply(fd, env->id);
    protobuf_c_message_free_unpacked(&env->base, NULL);
    static char page[PAGE_MAX][16];
    Permd__V1__Dataset ds[PAGE_MAX], *dp[PAGE_MAX];
    Permd__V1__Mixture mx[PAGE_MAX], *mp[PAGE_MAX];
    while (raw_recv_env(fd, 10000, &env) == 0) {
        const int datasets = env->body_case == PERMD__V1__ENVELOPE__BODY_LIST_DATASETS;
        const char *after = datasets ? env->list_datasets->after : env->list_mixtures->after;
        if (!(datasets ? env->list_datasets->paged : env->list_mixtures->paged))
            f->unpaged++;
        char next[16];
        size_t n = fake_page(f->kind, f->requests++, after, page, next);
        pd_envelope out = PERMD__V1__ENVELOPE__INIT;
        out.id = env->id;
        Permd__V1__ListDatasetsReply dr = PERMD__V1__LIST_DATASETS_REPLY__INIT;
        Permd__V1__ListMixturesReply mr = PERMD__V1__LIST_MIXTURES_REPLY__INIT;
        for (size_t i = 0; i < n; i++) {
            permd__v1__dataset__init(&ds[i]);
            ds[i].name = page[i];
            ds[i].size = 7;
            ds[i].id_width = 4; /* a width libpermd sizes buffers by: it refuses others */
            dp[i] = &ds[i];
            permd__v1__mixture__init(&mx[i]);
            mx[i].name = page[i];
            mp[i] = &mx[i];
        }
        if (datasets) {
            dr.n_datasets = n;
            dr.datasets = dp;
            dr.next = next;
            out.body_case = PERMD__V1__ENVELOPE__BODY_LIST_DATASETS_REPLY;
            out.list_datasets_reply = &dr;
        } else {
            mr.n_mixtures = n;
            mr.mixtures = mp;
            mr.next = next;
            out.body_case = PERMD__V1__ENVELOPE__BODY_LIST_MIXTURES_REPLY;
            out.list_mixtures_reply = &mr;
        }
        protobuf_c_message_free_unpacked(&env->base, NULL);
        if (raw_send_env(fd, &out))
            break;
    }
    close(fd);
    return NULL;
}

static void fake_start(fake *f, fake_kind kind)
{
    memset(f, 0, sizeof *f);
    f->listen_fd = harness_fake_listen(f->dir, f->path);
    assert_true(f->listen_fd >= 0);
    f->kind = kind;
    pthread_create(&f->th, NULL, fake_main, f);
}

static void fake_stop(fake *f)
{
    pthread_join(f->th, NULL);
    harness_fake_close(f->listen_fd, f->dir, f->path);
}

/* List through a fake of this kind (datasets or mixtures); names into got (up to 16). */
static int fake_list(fake_kind kind, int datasets, char got[16][PERMD_NAME_MAX + 1], size_t *total, int *requests,
                     char *err, size_t errlen)
{
    fake f;
    fake_start(&f, kind);
    permd_client *c;
    assert_int_equal(permd_connect_unix(f.path, &c), 0);
    permd_dataset ds[16];
    int rc = datasets ? permd_list_datasets(c, ds, 16, total) : permd_list_mixtures(c, got, 16, total);
    if (datasets && rc == 0)
        for (size_t i = 0; i < *total && i < 16; i++) {
            assert_int_equal(ds[i].size, 7);
            strcpy(got[i], ds[i].name);
        }
    snprintf(err, errlen, "%s", permd_last_error(c));
    permd_close(c);
    fake_stop(&f);
    assert_int_equal(f.unpaged, 0); /* libpermd always asks for pages */
    *requests = f.requests;
    return rc;
}

static void test_fake_pages(void **state)
{
    (void)state;
    for (int datasets = 0; datasets < 2; datasets++) {
        char got[16][PERMD_NAME_MAX + 1], err[512];
        size_t total = 0;
        int requests;
        /* An older daemon: the whole list in its one reply. */
        assert_int_equal(fake_list(FAKE_OLD, datasets, got, &total, &requests, err, sizeof err), 0);
        assert_int_equal(total, 5);
        assert_int_equal(requests, 1);
        assert_string_equal(got[4], "d4");
        /* Put and deleted between pages: each name once, in order, what the pages held. */
        assert_int_equal(fake_list(FAKE_CHANGING, datasets, got, &total, &requests, err, sizeof err), 0);
        const char *want[] = {"a", "b", "c", "d", "f", "f1"};
        assert_int_equal(total, 6);
        for (size_t i = 0; i < 6; i++)
            assert_string_equal(got[i], want[i]);
        /* A next that does not advance: a typed error, not a loop. */
        assert_int_equal(fake_list(FAKE_STUCK, datasets, got, &total, &requests, err, sizeof err), PERMD_EPROTO);
        if (!strstr(err, "did not advance"))
            fail_msg("'%s'", err);
        assert_int_equal(requests, 2);
        assert_int_equal(fake_list(FAKE_EMPTY, datasets, got, &total, &requests, err, sizeof err), PERMD_EPROTO);
        if (!strstr(err, "did not advance"))
            fail_msg("'%s'", err);
        /* A page that lists a name again (or out of order). */
        assert_int_equal(fake_list(FAKE_REPEAT, datasets, got, &total, &requests, err, sizeof err), PERMD_EPROTO);
        if (!strstr(err, "'a' after 'b'"))
            fail_msg("'%s'", err);
        /* A list without end stops at PERMD_LIST_MAX names. */
        assert_int_equal(fake_list(FAKE_ENDLESS, datasets, got, &total, &requests, err, sizeof err), PERMD_ETOOBIG);
        if (!strstr(err, "PERMD_LIST_MAX"))
            fail_msg("'%s'", err);
        assert_int_equal(requests, PERMD_LIST_MAX / PAGE_MAX + 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_pages),
        cmocka_unit_test(test_daemon_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
