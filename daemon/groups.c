/* NCCL delivery groups: join/deliver/leave on the loop, NCCL on one thread per group, results back by uv_async. */
#include "daemon/groups.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/name.h"
#include "daemon/backend.h"
#include "daemon/log.h"
#include "daemon/reply.h"
#include "daemon/sigmask.h"
#include "daemon/target.h"
#include "gpu/permd_delivery.h"

/* libpermd_delivery.so's entry points: loaded at run time, so that permd
 * starts (and serves sockets) on machines without CUDA or NCCL. */
typedef struct pd_delivery_api {
    int (*probe)(int, char *, size_t);
    int (*unique_id)(uint8_t *);
    int (*open)(int, const uint8_t *, int, uint32_t, const int *, pd_delivery **);
    int (*send_jobs)(pd_delivery *, const pd_delivery_job *, unsigned, uint32_t, const int *);
    void (*close)(pd_delivery *, uint32_t, const int *);
} pd_delivery_api;

/* One send, queued for the group's thread. */
typedef struct pd_send {
    struct pd_send *next;
    pd_delivery_job job;
} pd_send;

typedef struct pd_group {
    struct pd_group *next;
    pd_groups *table;
    char name[PD_NAME_MAX + 1];
    uint32_t members, joined, gone; /* gone: left or disconnected */
    pd_session **members_at;        /* rank r is members_at[r - 1]; NULL once gone */
    uint8_t id[PD_NCCL_ID_BYTES];
    int cancel;                     /* read by the thread's NCCL waits (__atomic) */
    uv_async_t async;               /* the thread tells the loop it has ended */
    pthread_t thread;
    /* shared with the thread */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pd_send *head, *tail;
    uint64_t queued;                /* sends in head..tail (max_group_sends) */
    int ready, failed, closing, exited;
    char why[256];
} pd_group;

struct pd_groups {
    const pd_config *cfg;
    /* Requests come from every serving loop: one lock over the table and the groups' loop-side
     * fields. Recursive, because a reply that fails closes its connection, which leaves its groups. */
    pthread_mutex_t lock;
    pd_group *list;
    unsigned count;                 /* groups in list (max_groups) */
    int loaded; /* 1: api usable; -1: failed (why says) */
    char why[256];
    void *dl;
    pd_delivery_api api;
};

int pd_groups_open(const pd_config *cfg, pd_groups **out)
{
    pd_groups *g = calloc(1, sizeof *g);
    if (!g)
        return PD_ENOMEM;
    g->cfg = cfg;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g->lock, &a);
    pthread_mutexattr_destroy(&a);
    *out = g;
    return 0;
}

void pd_groups_close(pd_groups *g)
{
    if (!g)
        return;
    if (g->dl)
        dlclose(g->dl);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* ---- Loading NCCL ----------------------------------------------------------------------------------------- */

static void *pd_delivery_dlopen(const char *configured, char *why, size_t len)
{
    char exe[PATH_MAX], path[PATH_MAX + 64];
    if (configured && *configured) {
        void *dl = dlopen(configured, RTLD_NOW | RTLD_LOCAL);
        if (!dl)
            snprintf(why, len, "%s", dlerror());
        return dl;
    }
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, sizeof path, "%s/../lib/libpermd_delivery.so", exe);
            if (access(path, F_OK) == 0) {
                void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
                if (!dl)
                    snprintf(why, len, "%s", dlerror());
                return dl;
            }
        }
    }
    void *dl = dlopen("libpermd_delivery.so", RTLD_NOW | RTLD_LOCAL);
    if (!dl)
        snprintf(why, len, "%s", dlerror());
    return dl;
}

/* Load and probe once; later calls return the verdict. */
static int pd_groups_load(pd_groups *t)
{
    if (t->loaded)
        return t->loaded > 0 ? 0 : PD_EUNAVAILABLE;
    const pd_config *cfg = t->cfg;
    t->loaded = -1;
    if (!(t->dl = pd_delivery_dlopen(cfg->delivery_library, t->why, sizeof t->why)))
        goto fail;
    *(void **)&t->api.probe = dlsym(t->dl, "pd_delivery_probe");
    *(void **)&t->api.unique_id = dlsym(t->dl, "pd_delivery_unique_id");
    *(void **)&t->api.open = dlsym(t->dl, "pd_delivery_open");
    *(void **)&t->api.send_jobs = dlsym(t->dl, "pd_delivery_send_jobs");
    *(void **)&t->api.close = dlsym(t->dl, "pd_delivery_close");
    if (!t->api.probe || !t->api.unique_id || !t->api.open || !t->api.send_jobs || !t->api.close) {
        snprintf(t->why, sizeof t->why, "libpermd_delivery.so lacks the expected symbols");
        goto fail;
    }
    if (t->api.probe((int)cfg->gpu_device, t->why, sizeof t->why))
        goto fail;
    t->loaded = 1;
    pd_log_info("nccl", "state=available device=%llu", (unsigned long long)cfg->gpu_device);
    return 0;
fail:
    pd_log_info("nccl", "state=unavailable reason=\"%s\"", t->why);
    return PD_EUNAVAILABLE;
}

/* ---- The group's thread --------------------------------------------------------------------------------------- */

static void pd_group_fail(pd_group *g, const char *fmt, const char *detail)
{
    pthread_mutex_lock(&g->lock);
    if (!g->failed) {
        g->failed = 1;
        snprintf(g->why, sizeof g->why, fmt, detail);
    }
    pthread_mutex_unlock(&g->lock);
}

static void *pd_group_main(void *arg)
{
    pd_group *g = arg;
    const pd_delivery_api *api = &g->table->api;
    const pd_config *cfg = g->table->cfg;
    uint32_t timeout = (uint32_t)cfg->delivery_timeout_ms;
    pd_delivery *d = NULL;
    pd_delivery_job batch[PD_DELIVERY_JOBS];
    int rc = api->open((int)cfg->gpu_device, g->id, (int)g->members + 1, timeout, &g->cancel, &d);
    if (rc)
        pd_group_fail(g, "forming the NCCL communicator failed: %s", pd_strerror(rc));
    pthread_mutex_lock(&g->lock);
    g->ready = rc == 0;
    /* A group that never formed (members that never all joined: delivery_timeout_ms) ends now, giving its
     * max_groups slot back, rather than when its members leave: one that joined and stays would hold it. One
     * that formed goes on after a failed send (its members are told why) until its members leave. */
    const int formed = rc == 0;
    while (formed) {
        while (!g->head && !g->closing)
            pthread_cond_wait(&g->wake, &g->lock);
        if (!g->head)
            break; /* closing, and nothing left to send */
        /* Every send queued by now goes in one NCCL group: transfers to different members overlap, and
         * members asking together are not served one after another. */
        unsigned n = 0;
        while (g->head && n < PD_DELIVERY_JOBS) {
            pd_send *job = g->head;
            g->head = job->next;
            batch[n++] = job->job;
            free(job);
            g->queued--;
        }
        if (!g->head)
            g->tail = NULL;
        int failed = g->failed;
        pthread_mutex_unlock(&g->lock);
        if (!failed && (rc = api->send_jobs(d, batch, n, timeout, &g->cancel)))
            pd_group_fail(g, "an NCCL send failed: %s", pd_strerror(rc));
        pthread_mutex_lock(&g->lock);
    }
    pthread_mutex_unlock(&g->lock);
    if (d)
        api->close(d, timeout, &g->cancel);
    pthread_mutex_lock(&g->lock);
    g->exited = 1;
    pthread_mutex_unlock(&g->lock);
    uv_async_send(&g->async);
    return NULL;
}

/* ---- Lifetime on the loop ---------------------------------------------------------------------------------------- */

static void pd_group_free(uv_handle_t *h)
{
    pd_group *g = h->data;
    pd_send *job = g->head;
    while (job) {
        pd_send *next = job->next;
        free(job);
        job = next;
    }
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->wake);
    free(g->members_at);
    free(g);
}

static void pd_group_on_async(uv_async_t *a)
{
    pd_group *g = a->data;
    pthread_mutex_lock(&g->lock);
    int exited = g->exited;
    pthread_mutex_unlock(&g->lock);
    if (!exited)
        return;
    pthread_join(g->thread, NULL);
    pthread_mutex_lock(&g->table->lock);
    for (pd_group **p = &g->table->list; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            g->table->count--;
            break;
        }
    }
    pthread_mutex_unlock(&g->table->lock);
    pd_log_info("group_end", "group=%s failed=%d reason=\"%s\"", g->name, g->failed, g->failed ? g->why : "");
    uv_close((uv_handle_t *)&g->async, pd_group_free);
}

/* Wind the group down: no more sends are queued; the thread ends when its queue drains. */
static void pd_group_close(pd_group *g, int abort)
{
    if (abort)
        __atomic_store_n(&g->cancel, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g->lock);
    g->closing = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
}

static void pd_groups_stop_locked(pd_groups *t)
{
    for (pd_group *g = t ? t->list : NULL; g; g = g->next) {
        pd_group_fail(g, "%s", "permd is shutting down");
        pd_group_close(g, 1);
    }
}

static pd_group *pd_group_find(pd_groups *t, const char *name)
{
    for (pd_group *g = t->list; g; g = g->next)
        if (!strcmp(g->name, name) && !g->closing)
            return g;
    return NULL;
}

static uint32_t pd_group_rank_of(const pd_group *g, const pd_session *s)
{
    for (uint32_t i = 0; i < g->members; i++)
        if (g->members_at[i] == s)
            return i + 1;
    return 0;
}

/* A member is gone; when none is left the group closes (aborting if it failed). */
static void pd_group_member_gone(pd_group *g, uint32_t rank)
{
    g->members_at[rank - 1] = NULL;
    g->gone++;
    if (g->gone == g->joined)
        pd_group_close(g, g->failed || g->joined < g->members);
}

static void pd_groups_conn_gone_locked(pd_groups *t, pd_session *c)
{
    char detail[64];
    for (pd_group *g = t ? t->list : NULL; g; g = g->next) {
        uint32_t rank = pd_group_rank_of(g, c);
        if (!rank || g->closing)
            continue;
        snprintf(detail, sizeof detail, "member rank %u disconnected without leaving", rank);
        pd_group_fail(g, "%s", detail);
        __atomic_store_n(&g->cancel, 1, __ATOMIC_RELEASE); /* a send to it would wait for its timeout */
        pd_log_warn("group_abort", "group=%s rank=%u reason=disconnected", g->name, rank);
        pd_group_member_gone(g, rank);
    }
}

/* ---- Requests ------------------------------------------------------------------------------------------------------- */

static int pd_group_check_failed(pd_session *c, uint64_t id, pd_group *g)
{
    pthread_mutex_lock(&g->lock);
    int failed = g->failed;
    char why[256];
    memcpy(why, g->why, sizeof why);
    pthread_mutex_unlock(&g->lock);
    if (failed)
        pd_reply_error(c, id, PD_EUNAVAILABLE, "delivery group '%s' was aborted: %s", g->name, why);
    return failed;
}

void pd_groups_counts(pd_groups *t, uint64_t *groups, uint64_t *sends)
{
    pthread_mutex_lock(&t->lock);
    *groups = t->count;
    *sends = 0;
    for (pd_group *g = t->list; g; g = g->next) {
        pthread_mutex_lock(&g->lock);
        *sends += g->queued;
        pthread_mutex_unlock(&g->lock);
    }
    pthread_mutex_unlock(&t->lock);
}

static pd_group *pd_group_create(pd_groups *t, uv_loop_t *loop, const char *name, uint32_t members, int *rc)
{
    pd_group *g = calloc(1, sizeof *g);
    pd_session **conns = g ? calloc(members, sizeof *conns) : NULL;
    if (!conns) {
        free(g);
        *rc = PD_ENOMEM;
        return NULL;
    }
    g->table = t;
    g->members_at = conns;
    g->members = members;
    strcpy(g->name, name);
    if ((*rc = t->api.unique_id(g->id))) {
        free(conns);
        free(g);
        return NULL;
    }
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->wake, NULL);
    uv_async_init(loop, &g->async, pd_group_on_async); /* the creating connection's loop ends it */
    g->async.data = g;
    if (pd_sigmask_thread(&g->thread, pd_group_main, g)) {
        *rc = PD_EINTERNAL;
        uv_close((uv_handle_t *)&g->async, pd_group_free);
        return NULL;
    }
    g->next = t->list;
    t->list = g;
    t->count++;
    pd_log_info("group_new", "group=%s members=%u", name, members);
    return g;
}

static void pd_on_join_group_locked(pd_session *c, uint64_t id, const Permd__V1__JoinGroup *m)
{
    pd_groups *t = c->svc->groups;
    const pd_config *cfg = t->cfg;
    int rc;
    if (pd_name_check(m->group)) {
        pd_reply_error(c, id, PD_EINVAL, "group: a name of 1-%d characters of A-Z a-z 0-9 . _ - is required",
                           PD_NAME_MAX);
        return;
    }
    if (m->members == 0 || m->members > cfg->max_group_members) {
        pd_reply_error(c, id, PD_EINVAL, "members must be in [1, %llu] (max_group_members), not %u",
                           (unsigned long long)cfg->max_group_members, m->members);
        return;
    }
    if (pd_groups_load(t)) {
        pd_reply_error(c, id, PD_EUNAVAILABLE, "NCCL delivery is unavailable here: %s", t->why);
        return;
    }
    pd_group *g = pd_group_find(t, m->group);
    if (g) {
        if (pd_group_check_failed(c, id, g))
            return;
        if (g->members != m->members) {
            pd_reply_error(c, id, PD_ECONFLICT, "group '%s' has %u members, not %u", g->name, g->members,
                               m->members);
            return;
        }
        if (pd_group_rank_of(g, c)) {
            pd_reply_error(c, id, PD_ECONFLICT, "this connection is already in group '%s'", g->name);
            return;
        }
        if (g->joined == g->members) {
            pd_reply_error(c, id, PD_ECONFLICT, "group '%s' is full (%u members)", g->name, g->members);
            return;
        }
    } else if (t->count >= cfg->max_groups) {
        pd_reply_error(c, id, PD_EBUSY, "%u delivery groups exist (max_groups); retry once one has ended", t->count);
        return;
    } else if (!(g = pd_group_create(t, c->loop->uv, m->group, m->members, &rc))) {
        pd_reply_error(c, id, rc == PD_ENOMEM ? PD_EINTERNAL : PD_EUNAVAILABLE, "cannot create group '%s': %s",
                           m->group, pd_strerror(rc));
        return;
    }
    uint32_t rank = ++g->joined;
    g->members_at[rank - 1] = c;
    Permd__V1__JoinGroupReply r = PERMD__V1__JOIN_GROUP_REPLY__INIT;
    r.nccl_id.data = g->id;
    r.nccl_id.len = sizeof g->id;
    r.rank = rank;
    r.nranks = g->members + 1;
    r.device = (char *)pd_backend_describe(c->svc->backend);
    pd_reply(c, id, PERMD__V1__ENVELOPE__BODY_JOIN_GROUP_REPLY, &r);
    pd_log_info("group_join", "group=%s rank=%u of=%u conn=%llu", g->name, rank, g->members,
                (unsigned long long)pd_conn_serial(c->conn));
}

/* The group and the caller's rank in it, or an error reply and NULL. */
static pd_group *pd_group_member(pd_session *c, uint64_t id, const char *name, uint32_t *rank)
{
    pd_groups *t = c->svc->groups;
    pd_group *g = t->loaded > 0 ? pd_group_find(t, name) : NULL;
    if (!g) {
        pd_reply_error(c, id, t->loaded < 0 ? PD_EUNAVAILABLE : PD_ENOTFOUND, "no delivery group '%s'%s%s",
                           pd_name_printable(name), t->loaded < 0 ? ": " : "", t->loaded < 0 ? t->why : "");
        return NULL;
    }
    if (!(*rank = pd_group_rank_of(g, c))) {
        pd_reply_error(c, id, PD_EINVAL, "this connection is not a member of group '%s'", g->name);
        return NULL;
    }
    return g;
}

static void pd_on_deliver_locked(pd_session *c, uint64_t id, const Permd__V1__Deliver *m)
{
    uint32_t rank;
    pd_target t;
    pd_group *g = pd_group_member(c, id, m->group, &rank);
    if (!g || pd_group_check_failed(c, id, g))
        return;
    if (pd_reply_slice(c, id, m->slice, 0, &t))
        return;
    if (t.plan) {
        pd_target_release(&t);
        pd_reply_error(c, id, PD_EUNAVAILABLE, "NCCL delivery serves flat datasets; '%s' is %s", t.ds.name,
                       t.mixture ? "a mixture" : "sharded");
        return;
    }
    if (pd_reply_count(c, id, m->count, "count")) {
        pd_target_release(&t);
        return;
    }
    /* The receiver's width: an int64 buffer takes any dataset's ids; NCCL writes count * width bytes, so a
     * width the buffer does not have would overrun it. */
    if (m->id_width != 0 && m->id_width != 4 && m->id_width != 8) {
        pd_target_release(&t);
        pd_reply_error(c, id, PD_EINVAL, "id_width must be 0 (the dataset's), 4 or 8, not %u", m->id_width);
        return;
    }
    if (m->id_width == 4 && t.width == 8) {
        pd_reply_error(c, id, PD_EINVAL, "id_width 4: dataset '%s' has %llu samples, whose ids need 8 bytes "
                       "(receive into int64)", t.ds.name, (unsigned long long)t.ds.size);
        pd_target_release(&t);
        return;
    }
    const unsigned width = m->id_width ? m->id_width : t.width;
    const uint64_t max_sends = c->svc->groups->cfg->max_group_sends;
    pthread_mutex_lock(&g->lock);
    const uint64_t queued = g->queued;
    pthread_mutex_unlock(&g->lock);
    if (queued >= max_sends) { /* a member not posting its receives: its sends wait for delivery_timeout_ms */
        pd_target_release(&t);
        pd_reply_error(c, id, PD_EBUSY, "group '%s' has %llu sends queued (max_group_sends); retry once they are "
                       "received", g->name, (unsigned long long)queued);
        return;
    }
    uint64_t got = m->count < t.remaining ? m->count : t.remaining;
    pd_send *job = got ? calloc(1, sizeof *job) : NULL;
    if (got && !job) {
        pd_reply_error(c, id, PD_EINTERNAL, "out of memory");
        return;
    }
    Permd__V1__DeliverReply r = PERMD__V1__DELIVER_REPLY__INIT;
    r.id_width = width;
    r.count = got;
    r.next_offset = pd_target_next_offset(&t, t.slice.offset, got);
    r.remaining = t.remaining - got;
    pd_reply(c, id, PERMD__V1__ENVELOPE__BODY_DELIVER_REPLY, &r);
    if (!job)
        return;
    job->job = (pd_delivery_job){.perm = t.perm, .slice = t.slice, .count = got, .width = width, .peer = (int)rank};
    pthread_mutex_lock(&g->lock);
    if (g->tail)
        g->tail->next = job;
    else
        g->head = job;
    g->tail = job;
    g->queued++;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    c->loop->stats.ids_served_total += got;
}

static void pd_on_leave_group_locked(pd_session *c, uint64_t id, const Permd__V1__LeaveGroup *m)
{
    uint32_t rank;
    pd_group *g = pd_group_member(c, id, m->group, &rank);
    if (!g)
        return;
    pd_log_info("group_leave", "group=%s rank=%u", g->name, rank);
    pd_group_member_gone(g, rank);
    Permd__V1__LeaveGroupReply r = PERMD__V1__LEAVE_GROUP_REPLY__INIT;
    pd_reply(c, id, PERMD__V1__ENVELOPE__BODY_LEAVE_GROUP_REPLY, &r);
}

/* ---- Entry points: each under the table's lock ---------------------------------------------------------------- */

void pd_groups_stop(pd_groups *t)
{
    if (!t) /* never opened */
        return;
    pthread_mutex_lock(&t->lock);
    pd_groups_stop_locked(t);
    pthread_mutex_unlock(&t->lock);
}

void pd_groups_conn_gone(pd_groups *t, pd_session *c)
{
    if (!t) /* never opened */
        return;
    pthread_mutex_lock(&t->lock);
    pd_groups_conn_gone_locked(t, c);
    pthread_mutex_unlock(&t->lock);
}

void pd_on_join_group(pd_session *s, uint64_t id, const Permd__V1__JoinGroup *m)
{
    /* Joining may start threads on this loop's thread, which on loop 0 takes signals: loading the
     * delivery library (cudaGetDeviceCount starts the CUDA driver's) and ncclGetUniqueId (NCCL's
     * bootstrap thread). They inherit the caller's mask, so block the handled signals meanwhile
     * (sigmask.h: only loop 0 may take them). */
    sigset_t old;
    pd_sigmask_block(&old);
    pthread_mutex_lock(&s->svc->groups->lock);
    pd_on_join_group_locked(s, id, m);
    pthread_mutex_unlock(&s->svc->groups->lock);
    pd_sigmask_restore(&old);
}

void pd_on_deliver(pd_session *s, uint64_t id, const Permd__V1__Deliver *m)
{
    pthread_mutex_lock(&s->svc->groups->lock);
    pd_on_deliver_locked(s, id, m);
    pthread_mutex_unlock(&s->svc->groups->lock);
}

void pd_on_leave_group(pd_session *s, uint64_t id, const Permd__V1__LeaveGroup *m)
{
    pthread_mutex_lock(&s->svc->groups->lock);
    pd_on_leave_group_locked(s, id, m);
    pthread_mutex_unlock(&s->svc->groups->lock);
}
