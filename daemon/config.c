/* The configuration table and everything it drives: defaults, YAML loading, flags, validation, docs. */
#include "daemon/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cyaml/cyaml.h>

#include "core/error.h"
#include "core/name.h"
#include "core/parse.h"
#include "core/perm.h"
#include "core/shards.h"
#include "daemon/log.h"
#include "proto/endpoint.h"
#include "proto/frame.h"

typedef enum pd_opt_type { PD_OPT_STR, PD_OPT_U64, PD_OPT_OCTAL, PD_OPT_LEVEL, PD_OPT_UIDS } pd_opt_type;

typedef struct pd_opt {
    const char *key; /* YAML key; the flag is --key with '_' as '-' */
    pd_opt_type type;
    size_t offset;   /* of the value in pd_config */
    const char *def; /* default, as text */
    uint64_t min, max;
    const char *doc;
} pd_opt;

#define PD_METRICS_DEFAULT "127.0.0.1:9464"

#define PD_OPT(key, type, def, min, max, doc) {#key, type, offsetof(pd_config, key), def, min, max, doc}

/* The one table. Its order is the order of config/permd.yaml. */
static const pd_opt pd_opts[] = {
    PD_OPT(socket, PD_OPT_STR, "", 0, 0,
           "Unix socket to listen on (always on). Empty: $PERMD_SOCKET if set, else\n"
           "$XDG_RUNTIME_DIR/permd.sock, else /tmp/permd-<uid>/permd.sock; permctl and\n"
           "libpermd look in the same places. permd creates /tmp/permd-<uid> (mode 0700)\n"
           "and, like its clients, refuses it unless this user owns it and neither group\n"
           "nor others may write in it. At most 107 bytes (a Unix socket path's limit)."),
    PD_OPT(socket_mode, PD_OPT_OCTAL, "0660", 0, 0777,
           "File mode of the Unix socket (octal): owner and group may connect."),
    PD_OPT(allow_uids, PD_OPT_UIDS, "", 0, UINT32_MAX - 1,
           "Uids allowed on the Unix socket, checked with SO_PEERCRED at accept (as a\n"
           "flag: --allow-uids 1000,1001). Others get UNAUTHENTICATED and are closed.\n"
           "Empty: whoever socket_mode lets open the socket."),
    PD_OPT(tcp, PD_OPT_STR, "", 0, 0,
           "TCP listener, HOST:PORT with a numeric address or localhost ([::1]:7470 for\n"
           "IPv6). Empty: no TCP. Any address but loopback requires token_file."),
    PD_OPT(token_file, PD_OPT_STR, "", 0, 0,
           "File whose first line (without its line end) is the shared secret TCP\n"
           "clients must send in Hello: a regular file holding 1-1024 bytes of text\n"
           "without a control byte (openssl rand -hex 32; under 16 bytes is warned about),\n"
           "with 128 bytes of max_preauth_frame to spare. When set, every TCP\n"
           "connection must authenticate; Unix socket clients are trusted by\n"
           "socket_mode."),
    PD_OPT(metrics, PD_OPT_STR, PD_METRICS_DEFAULT, 0, 0,
           "Prometheus endpoint, HOST:PORT: GET /metrics (text format) and GET /healthz\n"
           "over HTTP/1.1. Empty: off. When the default port is taken, permd logs a\n"
           "warning and runs without it; an address set here must bind."),
    PD_OPT(metrics_connections, PD_OPT_U64, "64", 1, 65536,
           "Scrapers connected to the metrics endpoint at once. A new one beyond it\n"
           "evicts the oldest whose request has not arrived, so slow or idle clients\n"
           "cannot keep a health probe out."),
    PD_OPT(metrics_timeout_ms, PD_OPT_U64, "5000", 100, 3600000,
           "How long a scraper may take to send its request (and read the answer)."),
    PD_OPT(metrics_max_head, PD_OPT_U64, "8192", 256, 1048576,
           "Bytes of a scraper's request line and headers; a longer head is answered 431.\n"
           "Each scraper connected holds a buffer this big."),
    PD_OPT(metrics_cache_ms, PD_OPT_U64, "1000", 0, 3600000,
           "How long a rendered /metrics body is served again before permd renders a\n"
           "new one. A render takes ~90 us of the event loop that accepts connections;\n"
           "a client scraping thousands of times a second would take a third of it.\n"
           "Figures read through /metrics may be this old (permctl stats never are);\n"
           "/healthz is never cached. 0: render every scrape."),
    PD_OPT(state_dir, PD_OPT_STR, "", 0, 0,
           "Directory of the dataset registry (SQLite, WAL). Empty: $STATE_DIRECTORY if\n"
           "set (systemd), else $XDG_STATE_HOME/permd, else ~/.local/state/permd."),
    PD_OPT(fresh_registry, PD_OPT_U64, "0", 0, 1,
           "1: when the registry exists but cannot be read whole (damaged, truncated),\n"
           "move its files aside (registry.db.damaged-<time>) and start with an empty\n"
           "one. 0: refuse to start, so that no dataset is lost without a word."),
    PD_OPT(registry_busy_ms, PD_OPT_U64, "5000", 0, 600000,
           "How long startup and each put or delete wait for a lock another process\n"
           "holds on the registry (sqlite3 writing to it) before failing: startup exits\n"
           "1 (at once if SIGTERM or SIGINT comes meanwhile), a request is answered\n"
           "OVERLOADED. A reader (a backup) never makes them wait: its WAL is folded in\n"
           "by a later commit."),
    PD_OPT(log_level, PD_OPT_LEVEL, "info", 0, 0, "error, warn, info or debug; logs go to stderr."),
    PD_OPT(peer_log_rate, PD_OPT_U64, "10", 0, 1000000,
           "Lines a second each warning a peer can cause at will may write: auth_fail\n"
           "(a wrong token), conn_reject (a connection refused), conn_expire (a\n"
           "deadline passed), accept. Past it, lines are counted and not written\n"
           "(permd_log_suppressed_total), and one log_suppressed line says how many once\n"
           "the second is over, so a hostile peer cannot fill the log. 0: no limit."),
    PD_OPT(workers, PD_OPT_U64, "0", 0, 1024,
           "Worker threads for large generation and storage I/O; 0: one per CPU."),
    PD_OPT(loops, PD_OPT_U64, "0", 0, 256,
           "Event loops (threads) serving connections, each taking every loops-th new\n"
           "connection; one loop saturates near 100k small requests/s. 0: one per CPU,\n"
           "at most 4 (the worker pool wants the other cores)."),
    PD_OPT(max_frame, PD_OPT_U64, "1048576", 4096, PD_FRAME_MAX_LIMIT,
           "Largest request frame accepted, in bytes. A larger frame gets TOO_LARGE and\n"
           "its connection is closed."),
    PD_OPT(max_connections, PD_OPT_U64, "1024", 1, 1000000,
           "Unix-socket connections beyond this are answered OVERLOADED and closed.\n"
           "TCP connections have their own cap, so they can never take these places."),
    PD_OPT(max_tcp_connections, PD_OPT_U64, "1024", 1, 1000000,
           "TCP connections beyond this are answered OVERLOADED and closed."),
    PD_OPT(hello_timeout_ms, PD_OPT_U64, "5000", 100, 3600000,
           "A connection that must authenticate (TCP with token_file) and has not sent a\n"
           "good Hello within this is answered UNAUTHENTICATED and closed."),
    PD_OPT(max_preauth_frame, PD_OPT_U64, "4096", 256, PD_FRAME_MAX_LIMIT,
           "Largest frame read from a connection that has not authenticated yet (a\n"
           "Hello with its token is far smaller); larger ones get TOO_LARGE and close it.\n"
           "At most max_frame."),
    PD_OPT(frame_timeout_ms, PD_OPT_U64, "10000", 100, 3600000,
           "How long a frame may take to arrive, from its first byte (while permd reads\n"
           "from the connection): a client that stops mid-frame holds its buffer no\n"
           "longer, and is answered BAD_FRAME and closed."),
    PD_OPT(error_linger_ms, PD_OPT_U64, "2000", 0, 60000,
           "After an error that closes a connection (TOO_LARGE, BAD_FRAME, a refusal at\n"
           "accept), how long permd keeps reading and discarding what the peer still\n"
           "sends, waiting for it to close: closing at once would make a TCP peer that\n"
           "is still writing lose the error to a reset. Each such connection holds a\n"
           "descriptor (not a connection place) meanwhile. 0: close once the error is\n"
           "written. (While permd stops, a client that may still send, one with a\n"
           "stream, is waited for until shutdown_timeout_ms whatever this says.)"),
    PD_OPT(max_count, PD_OPT_U64, "1048576", 1, UINT64_C(1) << 27,
           "Most ids in one Fetch reply, one Stream batch or one Inverse request."),
    PD_OPT(max_digest, PD_OPT_U64, "1073741824", 1, UINT64_C(1) << 63,
           "Most ids one Digest request may cover: a worker generates them all (about\n"
           "10 ns an id; a mixture's several times that), and a client cannot stop it\n"
           "once asked but by closing its connection (the work stops at the next\n"
           "job_slice_ids). Clients digest longer slices in parts; libpermd does it for\n"
           "them."),
    PD_OPT(max_inverse_work, PD_OPT_U64, "1073741824", 1, UINT64_C(1) << 63,
           "Most work one Inverse on a mixture may take, counted in ids: one a sample,\n"
           "plus a sharded component's shards each time the samples, in order, name one\n"
           "of its component epochs that the two last named (one of each parity) are not\n"
           "(it needs that component's order, built from all its shards: about 80 ns a\n"
           "shard). Past it the request is TOO_LARGE: ask in parts, or sort the samples\n"
           "by component epoch, which costs the least."),
    PD_OPT(max_shards, PD_OPT_U64, "16777216", 1, PD_SHARDS_MAX,
           "Most shards a sharded dataset may have (its upload is held in memory, 8\n"
           "bytes a shard, until it is complete)."),
    PD_OPT(upload_memory, PD_OPT_U64, "268435456", 4096, UINT64_C(1) << 40,
           "Bytes of shard sizes that unfinished sharded uploads may hold, all\n"
           "connections together (8 a shard); a part beyond it is answered TOO_LARGE and\n"
           "its upload dropped."),
    PD_OPT(upload_timeout_ms, PD_OPT_U64, "60000", 100, 86400000,
           "An unfinished sharded upload whose next part does not come within this is\n"
           "dropped and its memory (upload_memory) freed; its connection stays open, and\n"
           "a later part of it is answered INVALID_ARGUMENT saying so."),
    PD_OPT(layout_memory, PD_OPT_U64, "1073741824", 4096, UINT64_C(1) << 40,
           "Bytes of shard layouts kept in memory, all sharded datasets together (8 a\n"
           "shard). Layouts of deleted datasets count too while plans or streams still\n"
           "hold them (until the streams end). A sharded PutDataset beyond it is answered\n"
           "TOO_LARGE."),
    PD_OPT(mixture_memory, PD_OPT_U64, "268435456", 4096, UINT64_C(1) << 40,
           "Bytes of mixture definitions kept in memory, all mixtures together (176 a\n"
           "component, and 8 plus 4 a component a stage: 200 components of 4096 stages\n"
           "hold 3.3 MB). A PutMixture beyond it is answered TOO_LARGE; those stored\n"
           "before are kept whatever they hold. permd_mixture_bytes shows the total."),
    PD_OPT(max_mixture_components, PD_OPT_U64, "1024", 1, 65536,
           "Most components (datasets) one mixture may draw from."),
    PD_OPT(max_mixture_stages, PD_OPT_U64, "4096", 1, 65536,
           "Most stages (weight changes) one mixture may have; its plan holds 12 bytes a\n"
           "component a stage."),
    PD_OPT(plan_cache, PD_OPT_U64, "16", 1, 4096,
           "Plans nobody uses kept built for the next request (a sharded dataset's per\n"
           "seed, epoch, window and lanes; a mixture's per seed)."),
    PD_OPT(plan_cache_bytes, PD_OPT_U64, "1073741824", 4096, UINT64_C(1) << 40,
           "Bytes all plans may take together (16 a shard; 12 a mixture component a\n"
           "stage), and mixtures' cursors (32 a shard of each sharded component, one\n"
           "per request reading the mixture at once): kept ones, those requests and\n"
           "streams use, those being built. For a new plan, unused ones go first (least\n"
           "recently used), then the tables of streams waiting for credit or for their\n"
           "client to read (rebuilt when they go on); when the plans in use leave no\n"
           "room, the request is answered OVERLOADED. One plan and one cursor of it\n"
           "alone may take more."),
    PD_OPT(output_cap, PD_OPT_U64, "4194304", 65536, UINT64_C(1) << 34,
           "Bytes queued for one connection before permd stops reading its requests and\n"
           "pauses its streams (a client that stops reading costs at most this, plus one\n"
           "reply, plus up to stream_ahead batches per stream generated ahead of the one\n"
           "it waits for)."),
    PD_OPT(output_memory, PD_OPT_U64, "1073741824", 0, UINT64_C(1) << 40,
           "Bytes queued for all connections together (permd_output_bytes). Past it, a\n"
           "connection that has output queued stops as at output_cap, while one that has\n"
           "none still gets its next reply: clients that do not read hold at most this,\n"
           "plus one reply each, and those that read are never stopped for them.\n"
           "0: no bound but output_cap times the connections."),
    PD_OPT(max_streams, PD_OPT_U64, "16", 1, 4096, "Concurrent streams per connection."),
    PD_OPT(max_credits, PD_OPT_U64, "64", 1, 65536, "Most outstanding credits (batches) per stream."),
    PD_OPT(stream_ahead, PD_OPT_U64, "4", 1, 64,
           "Batches one stream may have generated and not yet sent, ahead of the one its\n"
           "client waits for: more hide a slow batch behind the others, each costs a\n"
           "batch's memory (its ids) while its client is not reading."),
    PD_OPT(readahead_bytes, PD_OPT_U64, "32768", 0, UINT64_C(1) << 24,
           "Largest Fetch reply (count x id width, in bytes) generated ahead for a\n"
           "client that reads its slice in order, while the loop is idle; each such\n"
           "connection holds a buffer as big as its Fetches' replies, up to this\n"
           "(permd_readahead_bytes). Larger Fetches, and those costing more than\n"
           "inline_ids, are generated when they arrive. 0: no readahead."),
    PD_OPT(stream_ring_max, PD_OPT_U64, "67108864", 0, UINT64_C(1) << 32,
           "Largest shared-memory ring (credits x batch x id width, in bytes) one stream\n"
           "may have. Clients on the Unix socket ask for one (libpermd does): permd\n"
           "writes batches straight into memory the client maps, with no socket copy.\n"
           "A larger ring, or 0, sends that stream's ids through the socket instead."),
    PD_OPT(stream_ring_total, PD_OPT_U64, "1073741824", 0, UINT64_C(1) << 44,
           "Most bytes of stream rings at once, all connections together: in use, kept\n"
           "by a connection for its next stream, and ended streams' rings a connection\n"
           "may still map (until it says it is done with them, or closes). Beyond it,\n"
           "streams go through the socket. A client that keeps a ring's descriptor after\n"
           "its connection closes keeps that memory (charged to permd) alive: set\n"
           "stream_ring_max to 0 where the clients allowed on the socket are not trusted\n"
           "with memory."),
    PD_OPT(inline_ids, PD_OPT_U64, "65536", 0, UINT64_C(1) << 27,
           "Ids the event loop may generate itself per loop iteration (no thread hop,\n"
           "which costs more than generating this many with SIMD; a mixture id counts\n"
           "as 3 read by one rank, 8 by more); requests beyond the\n"
           "budget, and stream batches above 4096 ids, go to the worker pool. Lower it\n"
           "if loop latency matters more than throughput on a slow (scalar) CPU.\n"
           "0: always the pool."),
    PD_OPT(job_slice_ids, PD_OPT_U64, "4194304", 4096, UINT64_C(1) << 40,
           "Ids one worker-pool job generates before it yields its thread (a long\n"
           "Digest goes on in slices, behind other connections' work), so one client's\n"
           "long requests cannot starve the others."),
    PD_OPT(shutdown_timeout_ms, PD_OPT_U64, "5000", 0, 3600000,
           "On SIGTERM or SIGINT, how long in-flight replies may take before the\n"
           "remaining connections are closed."),
    PD_OPT(cpu_isa, PD_OPT_STR, "auto", 0, 0,
           "CPU kernels: auto (the best this CPU runs), scalar, avx2 or avx512 (AVX-512F\n"
           "and BW: Skylake-SP, Zen 4 and later). Every choice gives the same ids."),
    PD_OPT(cpu_threads, PD_OPT_U64, "0", 0, 1024,
           "Threads one large request is split over (the worker that took it\n"
           "included); 0: one per CPU."),
    PD_OPT(cpu_spin_us, PD_OPT_U64, "500", 0, 100000,
           "Microseconds a helper of the split polls for the next request before it\n"
           "sleeps, while split requests have been arriving at most this long after\n"
           "the last one ended (a client reading back to back, however long each\n"
           "request takes; one asking every few ms costs no polling). The\n"
           "splitting thread polls at most 50 of them for its helpers' parts. Waking a\n"
           "sleeper costs tens of microseconds on some VMs, as much as a mixture Fetch's\n"
           "part. Only as many helpers poll as the last split request had parts for\n"
           "(less one); the others sleep. 0: sleep at once."),
    PD_OPT(gpu, PD_OPT_STR, "auto", 0, 0,
           "auto: serve large requests from a GPU when libpermd_gpu.so loads and a\n"
           "device opens (otherwise one log line, and the CPU serves everything);\n"
           "off: never. NCCL delivery (delivery_library) is apart: trainers ask for\n"
           "it, and it uses gpu_device whatever this says."),
    PD_OPT(gpu_device, PD_OPT_U64, "0", 0, 1023, "CUDA device index for gpu: auto."),
    PD_OPT(gpu_min_ids, PD_OPT_U64, "1048576", 1, UINT64_C(1) << 40,
           "Requests (a Fetch or a Stream batch) of at least this many ids go to the\n"
           "GPU; smaller ones stay on the CPU, where the copy back would cost more."),
    PD_OPT(gpu_library, PD_OPT_STR, "", 0, 0,
           "Path of libpermd_gpu.so. Empty: ../lib beside the permd executable, then\n"
           "the dynamic loader's search path."),
    PD_OPT(delivery_library, PD_OPT_STR, "", 0, 0,
           "Path of libpermd_delivery.so (NCCL delivery into trainers' GPUs, docs/nccl.md),\n"
           "loaded on the first JoinGroup. Empty: as gpu_library. Without it, or without\n"
           "a GPU or NCCL, delivery requests get UNAVAILABLE and nothing else changes."),
    PD_OPT(delivery_timeout_ms, PD_OPT_U64, "60000", 100, 86400000,
           "How long forming a delivery group, or one NCCL send (the sends queued together,\n"
           "which go out in one NCCL group), may take before permd aborts the group's\n"
           "communicator (a trainer that died or hung)."),
    PD_OPT(max_group_members, PD_OPT_U64, "256", 1, 65535, "Most trainers in one delivery group."),
    PD_OPT(max_groups, PD_OPT_U64, "64", 1, 4096,
           "Most delivery groups at once, all connections together (each has a thread and\n"
           "an NCCL communicator); a JoinGroup that would start another is answered\n"
           "OVERLOADED."),
    PD_OPT(max_group_sends, PD_OPT_U64, "256", 1, 1000000,
           "Most Delivers queued in one group and not yet sent (a trainer that does not\n"
           "post its receives holds them until delivery_timeout_ms); a Deliver beyond it\n"
           "is answered OVERLOADED."),
    PD_OPT(max_request_memory, PD_OPT_U64, "16777216", 65536, UINT64_C(1) << 40,
           "Bytes one request may take decoded (its fields as permd reads them),\n"
           "freed once it is answered; a request past it is answered TOO_LARGE and its\n"
           "connection stays open. A request decodes to 1 to 4 times its frame; many\n"
           "small or unknown fields cost more (tens of bytes each). At least max_frame;\n"
           "keep it at least 4 x max_frame."),
};
#define PD_NOPTS (sizeof pd_opts / sizeof pd_opts[0])

static const char pd_datasets_doc[] =
    "Datasets declared here exist whenever permd runs, beside those stored with\n"
    "PutDataset; they cannot be deleted over the wire. Example:\n"
    "  datasets:\n"
    "    - name: imagenet-train\n"
    "      size: 1281167";


static char **pd_opt_str(pd_config *c, const pd_opt *o)
{
    return (char **)((char *)c + o->offset);
}

static uint64_t *pd_opt_u64(pd_config *c, const pd_opt *o)
{
    return (uint64_t *)((char *)c + o->offset);
}

static pd_uid_list *pd_opt_uids(pd_config *c, const pd_opt *o)
{
    return (pd_uid_list *)((char *)c + o->offset);
}

/* "1000,1001", "1000 1001" or "[1000, 1001]"; "" or "[]" is the empty list. */
static int pd_parse_uids(const char *key, const char *value, uint64_t max, pd_uid_list *out, char *err,
                         size_t errlen)
{
    pd_uid_list l = {0};
    const char *p = value;
    char tok[32];
    size_t brackets = strspn(p, " [");
    p += brackets;
    while (*p && *p != ']') {
        size_t n = strcspn(p, ", ]");
        uint64_t v;
        if (n == 0 || n >= sizeof tok) {
            pd_errf(err, errlen, "%s: '%s' is not a list of uids like 1000,1001", key, value);
            goto fail;
        }
        memcpy(tok, p, n);
        tok[n] = '\0';
        if (pd_parse_u64_range(tok, 0, max, &v)) {
            pd_errf(err, errlen, "%s: '%s' is not a uid (0-%llu)", key, tok, (unsigned long long)max);
            goto fail;
        }
        uint32_t *u = realloc(l.uids, (l.n + 1) * sizeof *u);
        if (!u)
            goto fail;
        l.uids = u;
        l.uids[l.n++] = (uint32_t)v;
        p += n;
        p += strspn(p, ", ");
    }
    if (*p == ']')
        p += 1 + strspn(p + 1, " ");
    if (*p) {
        pd_errf(err, errlen, "%s: '%s' is not a list of uids like 1000,1001", key, value);
        goto fail;
    }
    *out = l;
    return 0;
fail:
    free(l.uids);
    return PD_EINVAL;
}

static const pd_opt *pd_opt_find(const char *key)
{
    for (size_t i = 0; i < PD_NOPTS; i++)
        if (!strcmp(pd_opts[i].key, key))
            return &pd_opts[i];
    return NULL;
}

int pd_config_set(pd_config *c, const char *key, const char *value, char *err, size_t errlen)
{
    const pd_opt *o = pd_opt_find(key);
    uint64_t v;
    int rc;
    if (!o) {
        pd_errf(err, errlen, "unknown key '%s'", key);
        return PD_ENOTFOUND;
    }
    switch (o->type) {
    case PD_OPT_STR: {
        char *s = strdup(value);
        if (!s)
            return PD_ENOMEM;
        free(*pd_opt_str(c, o));
        *pd_opt_str(c, o) = s;
        if (o->offset == offsetof(pd_config, metrics))
            c->metrics_given = 1;
        return 0;
    }
    case PD_OPT_LEVEL: {
        pd_log_level l;
        if (pd_log_level_parse(value, &l)) {
            pd_errf(err, errlen, "%s: '%s' is not one of error, warn, info, debug", key, value);
            return PD_EINVAL;
        }
        *pd_opt_u64(c, o) = (uint64_t)l;
        return 0;
    }
    case PD_OPT_OCTAL: {
        char *end;
        if (!*value || strspn(value, "01234567") != strlen(value)) {
            pd_errf(err, errlen, "%s: '%s' is not an octal file mode like 0660", key, value);
            return PD_EINVAL;
        }
        v = strtoull(value, &end, 8);
        if (v > o->max) {
            pd_errf(err, errlen, "%s: %s is not a file mode (at most 0777)", key, value);
            return PD_ERANGE;
        }
        *pd_opt_u64(c, o) = v;
        return 0;
    }
    case PD_OPT_UIDS: {
        pd_uid_list l;
        if ((rc = pd_parse_uids(key, value, o->max, &l, err, errlen)))
            return rc;
        free(pd_opt_uids(c, o)->uids);
        *pd_opt_uids(c, o) = l;
        return 0;
    }
    case PD_OPT_U64:
        rc = pd_parse_u64_range(value, o->min, o->max, &v);
        if (rc == PD_EINVAL)
            pd_errf(err, errlen, "%s: '%s' is not an unsigned decimal integer", key, value);
        else if (rc)
            pd_errf(err, errlen, "%s: %s is outside [%llu, %llu]", key, value, (unsigned long long)o->min,
                    (unsigned long long)o->max);
        else
            *pd_opt_u64(c, o) = v;
        return rc;
    }
    return PD_EINTERNAL;
}

int pd_config_init(pd_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < PD_NOPTS; i++) {
        int rc = pd_config_set(c, pd_opts[i].key, pd_opts[i].def, NULL, 0);
        if (rc) {
            pd_config_free(c);
            return rc;
        }
    }
    c->metrics_given = 0; /* the defaults went through pd_config_set too */
    return 0;
}

void pd_config_free(pd_config *c)
{
    for (size_t i = 0; i < PD_NOPTS; i++)
        if (pd_opts[i].type == PD_OPT_STR)
            free(*pd_opt_str(c, &pd_opts[i]));
        else if (pd_opts[i].type == PD_OPT_UIDS)
            free(pd_opt_uids(c, &pd_opts[i])->uids);
    for (size_t i = 0; i < c->ndatasets; i++)
        free(c->datasets[i].name);
    free(c->datasets);
    memset(c, 0, sizeof *c);
}

int pd_config_add_dataset(pd_config *c, const char *name, const char *size, char *err, size_t errlen)
{
    uint64_t n;
    int rc = pd_parse_u64_range(size, 1, PD_N_MAX, &n);
    if (rc) {
        pd_errf(err, errlen, "dataset '%s': size '%s' is not an integer in [1, 2^63]", name, size);
        return rc;
    }
    if (pd_name_check(name)) {
        pd_errf(err, errlen, "dataset name '%s': use 1-%d of A-Z a-z 0-9 . _ -, starting with a letter, digit or _",
                name, PD_NAME_MAX);
        return PD_EINVAL;
    }
    pd_config_dataset *d = realloc(c->datasets, (c->ndatasets + 1) * sizeof *d);
    if (!d)
        return PD_ENOMEM;
    c->datasets = d;
    if (!(d[c->ndatasets].name = strdup(name)))
        return PD_ENOMEM;
    d[c->ndatasets++].size = n;
    return 0;
}

/* ---- YAML --------------------------------------------------------------- */

typedef struct pd_raw_dataset {
    char *name;
    char *size;
} pd_raw_dataset;

/* What libcyaml fills: every scalar as text, so file values go through
 * pd_config_set exactly like flags. */
typedef struct pd_raw_config {
    char *v[PD_NOPTS];
    char **seq[PD_NOPTS]; /* list options (allow_uids): a YAML sequence */
    unsigned seq_count[PD_NOPTS];
    pd_raw_dataset *datasets;
    unsigned datasets_count;
} pd_raw_config;

static const cyaml_schema_field_t pd_raw_dataset_fields[] = {
    CYAML_FIELD_STRING_PTR("name", CYAML_FLAG_DEFAULT, pd_raw_dataset, name, 1, CYAML_UNLIMITED),
    CYAML_FIELD_STRING_PTR("size", CYAML_FLAG_DEFAULT, pd_raw_dataset, size, 1, CYAML_UNLIMITED),
    CYAML_FIELD_END,
};

static const cyaml_schema_value_t pd_raw_dataset_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, pd_raw_dataset, pd_raw_dataset_fields),
};

/* Lists take YAML's null (~, null, an empty value) for none: libcyaml's NULL_STR flag. */
static const cyaml_schema_field_t pd_raw_datasets_field =
    CYAML_FIELD_SEQUENCE("datasets", CYAML_FLAG_POINTER_NULL_STR | CYAML_FLAG_OPTIONAL, pd_raw_config, datasets,
                         &pd_raw_dataset_schema, 0, CYAML_UNLIMITED);

/* A model optional string field; the schema copies it once per table row. */
static const cyaml_schema_field_t pd_raw_string_field =
    CYAML_FIELD_STRING_PTR("-", CYAML_FLAG_OPTIONAL, pd_raw_config, v[0], 0, CYAML_UNLIMITED);

/* The same for list options: a sequence of scalars, each kept as text. */
static const cyaml_schema_value_t pd_raw_scalar_entry = {
    CYAML_VALUE_STRING(CYAML_FLAG_POINTER, char, 0, CYAML_UNLIMITED),
};
static const cyaml_schema_field_t pd_raw_list_field = CYAML_FIELD_SEQUENCE_COUNT(
    "-", CYAML_FLAG_POINTER_NULL_STR | CYAML_FLAG_OPTIONAL, pd_raw_config, seq[0], seq_count[0],
    &pd_raw_scalar_entry, 0, CYAML_UNLIMITED);

/* Whether a scalar is YAML's null (~, null, Null, NULL): the key is then unset, as if absent (state_dir: ~
 * had put the registry in ./~). libcyaml's CYAML_FLAG_POINTER_NULL_STR cannot do it for scalars: it takes
 * a quoted "" for null too, and metrics: "" must stay "off". A quoted "~" reads the same as a plain one
 * here; it names no sensible value of any key. */
static int pd_yaml_is_null(const char *v)
{
    return !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

/* A YAML list joined with commas, as the flag spells it. NULL on ENOMEM. */
static char *pd_join_list(char **items, unsigned n)
{
    size_t len = 1;
    for (unsigned i = 0; i < n; i++)
        len += strlen(items[i]) + 1;
    char *s = malloc(len), *p = s;
    if (!s)
        return NULL;
    *p = '\0';
    for (unsigned i = 0; i < n; i++)
        p += sprintf(p, "%s%s", i ? "," : "", items[i]);
    return s;
}

typedef struct pd_yaml_log {
    char *err;
    size_t len, used;
} pd_yaml_log;

/* Collect libcyaml's error lines (the message, then a backtrace with line numbers). */
static void pd_yaml_log_fn(cyaml_log_t level, void *ctx, const char *fmt, va_list args)
{
    pd_yaml_log *l = ctx;
    if (level < CYAML_LOG_ERROR || !l->err || l->used + 1 >= l->len)
        return;
    char line[256];
    vsnprintf(line, sizeof line, fmt, args);
    line[strcspn(line, "\n")] = '\0';
    const char *s = line;
    if (!strncmp(s, "Load: ", 6))
        s += 6;
    if (!strcmp(s, "Backtrace:"))
        return;
    while (*s == ' ')
        s++;
    int n = snprintf(l->err + l->used, l->len - l->used, "%s%s", l->used ? "; " : "", s);
    if (n > 0)
        l->used += (size_t)n < l->len - l->used ? (size_t)n : l->len - l->used - 1;
}

int pd_config_load_file(pd_config *c, const char *path, char *err, size_t errlen)
{
    cyaml_schema_field_t fields[PD_NOPTS + 2];
    for (size_t i = 0; i < PD_NOPTS; i++) {
        if (pd_opts[i].type == PD_OPT_UIDS) {
            fields[i] = pd_raw_list_field;
            fields[i].data_offset = (uint32_t)(offsetof(pd_raw_config, seq) + i * sizeof(char **));
            fields[i].count_offset = (uint32_t)(offsetof(pd_raw_config, seq_count) + i * sizeof(unsigned));
        } else {
            fields[i] = pd_raw_string_field;
            fields[i].data_offset = (uint32_t)(offsetof(pd_raw_config, v) + i * sizeof(char *));
        }
        fields[i].key = pd_opts[i].key;
    }
    fields[PD_NOPTS] = pd_raw_datasets_field;
    fields[PD_NOPTS + 1] = (cyaml_schema_field_t)CYAML_FIELD_END;
    const cyaml_schema_value_t top = {CYAML_VALUE_MAPPING(CYAML_FLAG_POINTER, pd_raw_config, fields)};

    char yerr[512] = "";
    pd_yaml_log log = {yerr, sizeof yerr, 0};
    const cyaml_config_t ycfg = {
        .log_fn = pd_yaml_log_fn,
        .log_ctx = &log,
        .mem_fn = cyaml_mem,
        .log_level = CYAML_LOG_ERROR,
        .flags = CYAML_CFG_DEFAULT,
    };
    /* Non-blocking, and a regular file only: a FIFO (or a device) there would hold startup, or loop 0 at a
     * SIGHUP reload (every accept and signal waiting), until something wrote to it. */
    struct stat st;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        pd_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return PD_EIO;
    }
    const int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    close(fd);
    if (!regular) {
        pd_errf(err, errlen, "%s: not a regular file (a FIFO, a directory or a device): write the config in a file",
                path);
        return PD_EINVAL;
    }

    pd_raw_config *raw = NULL;
    cyaml_err_t yrc = cyaml_load_file(path, &ycfg, &top, (cyaml_data_t **)&raw, NULL);
    if (yrc != CYAML_OK) {
        pd_errf(err, errlen, "%s: %s%s%s", path, cyaml_strerror(yrc), yerr[0] ? ": " : "", yerr);
        return PD_EINVAL;
    }
    int rc = 0;
    if (!raw)
        return 0; /* an empty file: nothing to override */
    char msg[256];
    for (size_t i = 0; i < PD_NOPTS && !rc; i++) {
        char *joined = NULL;
        const char *value = raw->v[i];
        if (value && pd_yaml_is_null(value))
            value = NULL;
        if (raw->seq[i] && !(value = joined = pd_join_list(raw->seq[i], raw->seq_count[i])))
            rc = PD_ENOMEM;
        if (value && (rc = pd_config_set(c, pd_opts[i].key, value, msg, sizeof msg)))
            pd_errf(err, errlen, "%s: %s", path, msg);
        free(joined);
    }
    for (unsigned i = 0; i < raw->datasets_count && !rc; i++) {
        if ((rc = pd_config_add_dataset(c, raw->datasets[i].name, raw->datasets[i].size, msg, sizeof msg)))
            pd_errf(err, errlen, "%s: %s", path, msg);
    }
    cyaml_free(&ycfg, &top, raw, 0);
    return rc;
}

/* ---- Validation ----------------------------------------------------------- */

int pd_config_host_is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (!strcasecmp(host, "localhost"))
        return 1;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return !memcmp(&a6, &in6addr_loopback, sizeof a6);
    return 0;
}

int pd_config_validate(const pd_config *c, char *err, size_t errlen)
{
    if (strlen(c->socket) > pd_endpoint_unix_path_max()) {
        pd_errf(err, errlen, "socket: '%s' is %zu bytes; a Unix socket path holds at most %zu", c->socket,
                strlen(c->socket), pd_endpoint_unix_path_max());
        return PD_ETOOBIG;
    }
    if (c->tcp[0]) {
        char host[256];
        uint16_t port;
        struct in6_addr a6;
        if (pd_endpoint_parse_hostport(c->tcp, host, sizeof host, &port)) {
            pd_errf(err, errlen, "tcp: '%s' is not HOST:PORT (port 1-65535; IPv6 as [ADDR]:PORT)", c->tcp);
            return PD_EINVAL;
        }
        if (strcasecmp(host, "localhost") && inet_pton(AF_INET, host, &a6) != 1 &&
            inet_pton(AF_INET6, host, &a6) != 1) {
            pd_errf(err, errlen, "tcp: '%s' is not a numeric address or localhost", host);
            return PD_EINVAL;
        }
        if (!pd_config_host_is_loopback(host) && !c->token_file[0]) {
            pd_errf(err, errlen,
                    "tcp: %s is not a loopback address; set token_file so that clients must authenticate",
                    c->tcp);
            return PD_EAUTH;
        }
    }
    if (c->metrics[0]) {
        char host[256];
        uint16_t port;
        struct in6_addr a6;
        const char *colon = strrchr(c->metrics, ':'), *bracket = strrchr(c->metrics, ']');
        if (!colon || (bracket && colon < bracket) || /* the port is not optional here */
            pd_endpoint_parse_hostport(c->metrics, host, sizeof host, &port) ||
            (strcasecmp(host, "localhost") && inet_pton(AF_INET, host, &a6) != 1 &&
             inet_pton(AF_INET6, host, &a6) != 1)) {
            pd_errf(err, errlen, "metrics: '%s' is not HOST:PORT with a numeric address or localhost", c->metrics);
            return PD_EINVAL;
        }
    }
    static const char *const isas[] = {"auto", "scalar", "avx2", "avx512"};
    int known = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        known |= !strcmp(c->cpu_isa, isas[i]);
    if (!known) {
        pd_errf(err, errlen, "cpu_isa: '%s' is not one of auto, scalar, avx2, avx512", c->cpu_isa);
        return PD_EINVAL;
    }
    if (strcmp(c->gpu, "auto") && strcmp(c->gpu, "off")) {
        pd_errf(err, errlen, "gpu: '%s' is not auto or off", c->gpu);
        return PD_EINVAL;
    }
    /* Limits that contradict each other: each is in its own range, but together they refuse what they allow. */
    if (c->max_preauth_frame > c->max_frame) {
        pd_errf(err, errlen, "max_preauth_frame (%llu) exceeds max_frame (%llu): a peer would be allowed larger frames "
                "before it authenticates than after", (unsigned long long)c->max_preauth_frame,
                (unsigned long long)c->max_frame);
        return PD_EINVAL;
    }
    if (c->max_request_memory < c->max_frame) {
        pd_errf(err, errlen, "max_request_memory (%llu) is below max_frame (%llu): a request of a frame that size "
                "could never be decoded (keep it at least 4 x max_frame)", (unsigned long long)c->max_request_memory,
                (unsigned long long)c->max_frame);
        return PD_EINVAL;
    }
    for (size_t i = 0; i < c->ndatasets; i++)
        for (size_t j = 0; j < i; j++)
            if (!strcmp(c->datasets[i].name, c->datasets[j].name)) {
                pd_errf(err, errlen, "datasets: '%s' is declared twice", c->datasets[i].name);
                return PD_ECONFLICT;
            }
    return 0;
}

int pd_config_metrics_is_default(const pd_config *c)
{
    return !c->metrics_given && !strcmp(c->metrics, PD_METRICS_DEFAULT);
}

/* ---- Paths ------------------------------------------------------------------ */

int pd_config_socket_path(const pd_config *c, char *buf, size_t len)
{
    if (c->socket[0]) {
        if (strlen(c->socket) >= len)
            return PD_ETOOBIG;
        strcpy(buf, c->socket);
        return 0;
    }
    return pd_endpoint_default_socket(buf, len);
}

int pd_config_state_dir(const pd_config *c, char *buf, size_t len)
{
    const char *sd = getenv("STATE_DIRECTORY"), *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    int n;
    if (c->state_dir[0])
        n = snprintf(buf, len, "%s", c->state_dir);
    else if (sd && *sd)
        n = snprintf(buf, len, "%.*s", (int)strcspn(sd, ":"), sd); /* systemd may list several */
    else if (xdg && *xdg == '/')
        n = snprintf(buf, len, "%s/permd", xdg);
    else if (home && *home)
        n = snprintf(buf, len, "%s/.local/state/permd", home);
    else
        return PD_EINVAL;
    return n < 0 || (size_t)n >= len ? PD_ETOOBIG : 0;
}

/* ---- Flags ------------------------------------------------------------------ */

/* "--max-frame" -> "max_frame" (NUL-terminated in key, at most len). */
static int pd_flag_key(const char *flag, size_t flen, char *key, size_t len)
{
    if (flen >= len)
        return PD_ETOOBIG;
    for (size_t i = 0; i < flen; i++)
        key[i] = flag[i] == '-' ? '_' : flag[i];
    key[flen] = '\0';
    return 0;
}

int pd_config_from_args(pd_config *c, int argc, char **argv, int *check_only, char *err, size_t errlen)
{
    int rc;
    *check_only = 0;
    /* Pass 1: the file, so that flags override it whatever their order. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") || !strncmp(argv[i], "--config=", 9)) {
            const char *path = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[i + 1] : NULL);
            if (!path) {
                pd_errf(err, errlen, "--config needs a FILE");
                return PD_EINVAL;
            }
            if ((rc = pd_config_load_file(c, path, err, errlen)))
                return rc;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pd_config_write_usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--version")) {
            printf("permd %s (protocol %u, permutation spec v1)\n", PERMD_VERSION, PD_PROTOCOL_VERSION);
            return 1;
        }
        if (!strcmp(a, "--check-config")) {
            *check_only = 1;
            continue;
        }
        if (!strcmp(a, "--print-template")) {
            pd_config_write_template(stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            pd_errf(err, errlen, "unexpected argument '%s' (see permd --help)", a);
            return PD_EINVAL;
        }
        const char *name = a + 2, *eq = strchr(name, '='), *value;
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        if (eq)
            value = eq + 1;
        else if (i + 1 < argc)
            value = argv[++i];
        else {
            pd_errf(err, errlen, "--%s needs a value", name);
            return PD_EINVAL;
        }
        char key[64];
        if (pd_flag_key(name, nlen, key, sizeof key)) {
            pd_errf(err, errlen, "unknown option '%s' (see permd --help)", a);
            return PD_EINVAL;
        }
        if (!strcmp(key, "config"))
            continue; /* loaded in pass 1 */
        if (!strcmp(key, "dataset")) {
            const char *colon = strrchr(value, ':');
            char dname[PD_NAME_MAX + 2];
            if (!colon || (size_t)(colon - value) >= sizeof dname) {
                pd_errf(err, errlen, "--dataset: '%s' is not NAME:SIZE", value);
                return PD_EINVAL;
            }
            memcpy(dname, value, (size_t)(colon - value));
            dname[colon - value] = '\0';
            if ((rc = pd_config_add_dataset(c, dname, colon + 1, err, errlen)))
                return rc;
            continue;
        }
        rc = pd_config_set(c, key, value, err, errlen);
        if (rc == PD_ENOTFOUND)
            pd_errf(err, errlen, "unknown option '--%.*s' (see permd --help)", (int)nlen, name);
        if (rc)
            return rc;
    }
    return pd_config_validate(c, err, errlen);
}

/* ---- Docs ------------------------------------------------------------------ */

static void pd_write_comment(FILE *f, const char *doc)
{
    const char *p = doc;
    while (*p) {
        size_t n = strcspn(p, "\n");
        fprintf(f, "# %.*s\n", (int)n, p);
        p += n;
        if (*p)
            p++;
    }
}

static void pd_write_yaml_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void pd_write_value(FILE *f, const pd_config *c, const pd_opt *o)
{
    pd_config *m = (pd_config *)c; /* the accessors are shared with the setters */
    switch (o->type) {
    case PD_OPT_STR:
        pd_write_yaml_string(f, *pd_opt_str(m, o));
        break;
    case PD_OPT_LEVEL:
        fputs(pd_log_level_name((pd_log_level)*pd_opt_u64(m, o)), f);
        break;
    case PD_OPT_OCTAL:
        fprintf(f, "\"%04llo\"", (unsigned long long)*pd_opt_u64(m, o));
        break;
    case PD_OPT_U64:
        fprintf(f, "%llu", (unsigned long long)*pd_opt_u64(m, o));
        break;
    case PD_OPT_UIDS: {
        const pd_uid_list *l = pd_opt_uids(m, o);
        fputc('[', f);
        for (size_t i = 0; i < l->n; i++)
            fprintf(f, "%s%u", i ? ", " : "", l->uids[i]);
        fputc(']', f);
        break;
    }
    }
}

static void pd_write_config(FILE *f, const pd_config *c, int docs)
{
    for (size_t i = 0; i < PD_NOPTS; i++) {
        if (docs)
            pd_write_comment(f, pd_opts[i].doc);
        fprintf(f, "%s: ", pd_opts[i].key);
        pd_write_value(f, c, &pd_opts[i]);
        fputs(docs ? "\n\n" : "\n", f);
    }
    if (docs)
        pd_write_comment(f, pd_datasets_doc);
    if (!c->ndatasets) {
        fputs("datasets: []\n", f);
        return;
    }
    fputs("datasets:\n", f);
    for (size_t i = 0; i < c->ndatasets; i++)
        fprintf(f, "  - name: %s\n    size: %llu\n", c->datasets[i].name,
                (unsigned long long)c->datasets[i].size);
}

void pd_config_write_template(FILE *f)
{
    pd_config c;
    fputs("# permd configuration (generated by `permd --print-template`; keep in sync).\n"
          "# Every key is optional and shows its built-in default: permd runs without\n"
          "# this file. Each key is also a flag, --key-name VALUE, which overrides the\n"
          "# file; permd --check-config --config FILE validates a file and exits. A key\n"
          "# set to ~ or null is unset (its default); \"\" is the empty string.\n\n",
          f);
    if (pd_config_init(&c))
        return;
    pd_write_config(f, &c, 1);
    pd_config_free(&c);
}

/* Whether option o holds the same value in a and b. */
static int pd_opt_equal(const pd_config *a, const pd_config *b, const pd_opt *o)
{
    pd_config *x = (pd_config *)a, *y = (pd_config *)b; /* the accessors take no const; nothing is written */
    switch (o->type) {
    case PD_OPT_STR:
        return !strcmp(*pd_opt_str(x, o), *pd_opt_str(y, o));
    case PD_OPT_UIDS: {
        const pd_uid_list *u = pd_opt_uids(x, o), *v = pd_opt_uids(y, o);
        return u->n == v->n && (!u->n || !memcmp(u->uids, v->uids, u->n * sizeof *u->uids));
    }
    default:
        return *pd_opt_u64(x, o) == *pd_opt_u64(y, o);
    }
}

size_t pd_config_diff(const pd_config *a, const pd_config *b, const char **keys, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < PD_NOPTS; i++)
        if (!pd_opt_equal(a, b, &pd_opts[i]) && n < cap)
            keys[n++] = pd_opts[i].key;
    int same = a->ndatasets == b->ndatasets;
    for (size_t i = 0; same && i < a->ndatasets; i++)
        same = !strcmp(a->datasets[i].name, b->datasets[i].name) && a->datasets[i].size == b->datasets[i].size;
    if (!same && n < cap)
        keys[n++] = "datasets";
    return n;
}

void pd_config_write_effective(const pd_config *c, FILE *f)
{
    pd_write_config(f, c, 0);
}

void pd_config_each_number(const pd_config *c, void (*fn)(void *ctx, const char *key, uint64_t value), void *ctx)
{
    for (size_t i = 0; i < sizeof pd_opts / sizeof pd_opts[0]; i++)
        if (pd_opts[i].type == PD_OPT_U64)
            fn(ctx, pd_opts[i].key, *pd_opt_u64((pd_config *)c, &pd_opts[i]));
}

void pd_config_write_usage(FILE *f)
{
    fputs("usage: permd [--config FILE] [--check-config] [--KEY VALUE ...] [--dataset NAME:SIZE ...]\n"
          "\n"
          "Serve epoch permutations of registered datasets over a Unix socket (and TCP).\n"
          "\n"
          "  --config FILE        load a YAML config (config/permd.yaml documents every key)\n"
          "  --check-config       validate the configuration, print the effective values, exit\n"
          "  --print-template     print the documented config template and exit\n"
          "  --dataset NAME:SIZE  declare a dataset (repeatable), like the file's datasets list\n"
          "  --version, --help\n"
          "\n"
          "Every config key is also a flag (flags override the file):\n",
          f);
    for (size_t i = 0; i < PD_NOPTS; i++) {
        char flag[64];
        size_t n = strlen(pd_opts[i].key);
        for (size_t j = 0; j <= n; j++)
            flag[j] = pd_opts[i].key[j] == '_' ? '-' : pd_opts[i].key[j];
        fprintf(f, "\n  --%s (default: %s)\n", flag, pd_opts[i].def[0] ? pd_opts[i].def : "\"\"");
        for (const char *d = pd_opts[i].doc; *d;) {
            size_t len = strcspn(d, "\n");
            fprintf(f, "      %.*s\n", (int)len, d);
            d += len;
            if (*d)
                d++;
        }
    }
}
