/* permctl datasets | fetch | stream | inverse NAME | stats: the subcommands that talk to permd through libpermd. */
#define _POSIX_C_SOURCE 200809L /* O_CLOEXEC */
#include "permctl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/permd.h"
#include "core/error.h"
#include "core/name.h"
#include "core/parse.h"
#include "proto/endpoint.h"
#include "proto/frame.h"
#include "proto/token.h"

static const char permctl_datasets_usage[] =
    "usage: permctl datasets put NAME --size N [--json]\n"
    "       permctl datasets put NAME SHARDS [--window K] [--lanes G] [--max-shards M] [--json]\n"
    "       permctl datasets list [--json]\n"
    "       permctl datasets get NAME [--json]\n"
    "       permctl datasets rm NAME\n"
    "\n"
    "Register, show and remove datasets on permd. put is idempotent; a different\n"
    "size (or shards, window, lanes) for an existing name is a conflict. Names:\n"
    "1-128 of A-Z a-z 0-9 . _ -, the first a letter, a digit or _.\n"
    "A sharded dataset (docs/spec/shards-v1.md) is put from its SHARDS:\n"
    "  --shards-file FILE         shard sizes, one per line (what permctl shards prints)\n"
    "  --mds INDEX                a MosaicML Streaming index.json (or its directory)\n"
    "  --tars SPEC [SPEC...]      WebDataset tars: files, directories, brace patterns\n"
    "                             (\"shard-{000000..000999}.tar\") or globs, in order\n"
    "Its default window K (shards per window, default 8) and lanes G (default 1;\n"
    "set it to the usual world size) apply to its epochs. permctl shards prints the\n"
    "shard order the sample ids follow.\n" PERMCTL_CONN_HELP;

static const char permctl_fetch_usage[] =
    "usage: permctl fetch NAME --seed S --epoch E --world W --rank R --mode pad|drop|exact\n"
    "                     [--offset O] --count C [--json] [--locations] [--window K] [--lanes G]\n"
    "\n"
    "Print the next C sample ids of rank R (fewer at the end of the epoch), one per\n"
    "line, exactly as the offline 'permctl rank' prints them. --json prints\n"
    "{\"ids\":[...],\"next_offset\":N}, next_offset being the checkpoint to resume from.\n"
    "--locations prints each id's place instead: \"SHARD OFFSET\" on a sharded dataset,\n"
    "\"COMPONENT LOCAL_ID\" on a mixture (--json: {\"locations\":[[a,b],...],...}).\n"
    "Sharded datasets: --window and --lanes override the dataset's K and G.\n" PERMCTL_CONN_HELP;

static const char permctl_stream_usage[] =
    "usage: permctl stream NAME --seed S --epoch E --world W --rank R --mode pad|drop|exact\n"
    "                      [--offset O] [--batch B] [--count C] [--locations] [--window K] [--lanes G]\n"
    "\n"
    "Stream every id rank R has left (or the first C), one per line, exactly as the\n"
    "offline 'permctl rank' prints them. --batch sets ids per message, at most the\n"
    "server's max_count (default 65536, or max_count when that is lower).\n"
    "--locations, --window and --lanes as for fetch.\n" PERMCTL_CONN_HELP;

static const char permctl_stats_usage[] =
    "usage: permctl stats [--json]\n"
    "\n"
    "Print permd's counters: uptime, connections, requests, errors, ids served, then\n"
    "requests by type (count, errors, mean and percentile latency from the histogram)\n"
    "and errors by type and code: the figures permd's /metrics exports.\n" PERMCTL_CONN_HELP;

#define PERMCTL_SLICE_OPTS                                                                                   \
    (PERMCTL_BIT(SEED) | PERMCTL_BIT(EPOCH) | PERMCTL_BIT(WORLD) | PERMCTL_BIT(RANK) | PERMCTL_BIT(MODE))
#define PERMCTL_SHARD_OPTS (PERMCTL_BIT(WINDOW) | PERMCTL_BIT(LANES))
#define PERMCTL_DEFAULT_BATCH 65536

/* ---- Connection ------------------------------------------------------------------ */

/* The TCP token, read by the rules permd reads its token_file with (proto/token.h), so that a file permd
 * would refuse is refused here too, naming it (what: --token-file or $PERMD_TOKEN_FILE), instead of being
 * sent cut or hanging on a FIFO. PERMCTL_EXIT_USAGE. A file that group or others may open is used, with a
 * warning. */
static int permctl_read_token(const char *what, const char *path, pd_token_file *f)
{
    if (!pd_token_read(path, f)) {
        if (f->mode & 0077) /* as permd warns of its own: anyone who can read the file can be permd's client */
            permctl_say("warning: %s: %s is open to group or others (mode %04o); chmod 600 it", what, path,
                        f->mode);
        return 0;
    }
    switch (f->fault) {
    case PD_TOKEN_CANNOT_OPEN:
        return permctl_usage_error("%s: cannot open %s: %s", what, path, strerror(f->err));
    case PD_TOKEN_CANNOT_READ:
        return permctl_usage_error("%s: cannot read %s: %s", what, path, strerror(f->err));
    case PD_TOKEN_NOT_REGULAR:
        return permctl_usage_error("%s: %s is not a regular file (a directory, a FIFO or a device): write the "
                                   "token in a file", what, path);
    case PD_TOKEN_TOO_LONG:
        return permctl_usage_error("%s: the first line of %s is longer than %d bytes, the longest token permd "
                                   "takes", what, path, PD_TOKEN_MAX);
    case PD_TOKEN_NOT_TEXT:
        return permctl_usage_error("%s: the first line of %s holds the control byte 0x%02x at byte %zu; a token is "
                                   "text", what, path, f->bad_byte, f->bad_at);
    case PD_TOKEN_EMPTY:
    default:
        return permctl_usage_error("%s: the first line of %s is empty", what, path);
    }
}

int permctl_connect(const permctl_args *a, permd_client **c)
{
    int rc;
    /* --timeout-ms bounds the connection, the Hello and each reply (libpermd's timeout); without it the
     * first two wait 10 s each and replies as long as they take, as before the option existed. */
    const uint32_t ms = a->set & PERMCTL_BIT(TIMEOUT_MS) ? (uint32_t)a->u[PERMCTL_OPT_TIMEOUT_MS] : 0;
    char endpoint[512];
    if (a->s[PERMCTL_OPT_TCP] && a->s[PERMCTL_OPT_SOCKET])
        return permctl_usage_error("give --socket or --tcp, not both");
    if (a->s[PERMCTL_OPT_TCP]) {
        pd_token_file token;
        const char *tf = a->s[PERMCTL_OPT_TOKEN_FILE] ? a->s[PERMCTL_OPT_TOKEN_FILE] : getenv("PERMD_TOKEN_FILE");
        if (tf && *tf &&
            (rc = permctl_read_token(a->s[PERMCTL_OPT_TOKEN_FILE] ? "--token-file" : "$PERMD_TOKEN_FILE", tf, &token)))
            return rc;
        const int n = snprintf(endpoint, sizeof endpoint, "tcp:%s", a->s[PERMCTL_OPT_TCP]);
        if (n < 0 || (size_t)n >= sizeof endpoint)
            return permctl_usage_error("--tcp: '%s' is not HOST:PORT", a->s[PERMCTL_OPT_TCP]);
        rc = permd_connect_timeout(endpoint, tf && *tf ? token.token : NULL, ms, c);
    } else {
        if (a->s[PERMCTL_OPT_TOKEN_FILE])
            return permctl_usage_error("--token-file applies to --tcp only");
        const char *path = a->s[PERMCTL_OPT_SOCKET];
        const int n = path ? snprintf(endpoint, sizeof endpoint, "unix:%s", path) : 0;
        if (n < 0 || (size_t)n >= sizeof endpoint)
            return permctl_usage_error("--socket: path too long: %s", path);
        rc = permd_connect_timeout(path ? endpoint : NULL, NULL, ms, c);
    }
    /* The address itself (a bad HOST:PORT, a socket path too long): the command line, or its environment, is wrong. */
    const char *given = a->s[PERMCTL_OPT_TCP] ? "--tcp" : a->s[PERMCTL_OPT_SOCKET] ? "--socket"
                        : getenv("PERMD_SOCKET") && *getenv("PERMD_SOCKET") ? "$PERMD_SOCKET" : NULL;
    if (rc == PERMD_EINVAL && given)
        return permctl_usage_error("%s: %s", given, permd_last_error(NULL));
    if (rc) {
        permctl_say("%s", permd_last_error(NULL));
        return PERMCTL_EXIT_FAIL;
    }
    return 0;
}

int permctl_name(const char *what, const char *name)
{
    if (pd_name_check(name) == 0)
        return 0;
    return permctl_usage_error("%s: '%s' is not a name: 1-%d characters of A-Z a-z 0-9 . _ -, the first a letter, "
                               "a digit or _", what, name, PD_NAME_MAX);
}

int permctl_name_failed(permd_client *c, const char *what, int rc, const char *name, int wanted_mixture)
{
    if (rc != PERMD_ENOTFOUND)
        return permctl_call_failed(c, what);
    /* Datasets and mixtures share one namespace: a name of the other kind is said so, with the command for it. */
    permd_dataset ds;
    permd_mixture_def *mx = NULL;
    int other = wanted_mixture ? permd_get_dataset(c, name, &ds) : permd_get_mixture(c, name, &mx);
    permd_mixture_def_free(mx);
    if (other == PERMD_ENOTFOUND) {
        permctl_say("%s: NOT_FOUND: no dataset or mixture named '%s'", what, name);
        permd_close(c);
        return PERMCTL_EXIT_FAIL;
    }
    if (other) /* the second question failed otherwise (the connection): that error */
        return permctl_call_failed(c, what);
    permctl_say("%s: NOT_FOUND: '%s' is a %s, not a %s (permctl %s ... %s)", what, name,
                wanted_mixture ? "dataset" : "mixture", wanted_mixture ? "mixture" : "dataset",
                wanted_mixture ? "datasets" : "mixtures", name);
    permd_close(c);
    return PERMCTL_EXIT_FAIL;
}

/* Report a failed call: the server's typed error and message. */
int permctl_call_failed(permd_client *c, const char *what)
{
    permctl_say("%s: %s", what, permd_last_error(c));
    permd_close(c);
    return PERMCTL_EXIT_FAIL;
}

/* ---- JSON output ------------------------------------------------------------------ */

/* Dataset names are restricted to [A-Za-z0-9._-]; server strings are escaped anyway. */
void permctl_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void permctl_json_dataset(FILE *f, const permd_dataset *d)
{
    fputs("{\"name\":", f);
    permctl_json_string(f, d->name);
    fprintf(f, ",\"size\":%llu,\"id_width\":%u,\"source\":\"%s\",\"created_unix_ms\":%lld",
            (unsigned long long)d->size, d->id_width, d->from_config ? "config" : "api",
            (long long)d->created_unix_ms);
    if (d->shards)
        fprintf(f, ",\"shards\":%llu,\"window\":%llu,\"lanes\":%u", (unsigned long long)d->shards,
                (unsigned long long)d->window, d->lanes);
    fputc('}', f);
}

static void permctl_table_header(void)
{
    printf("%-32s %20s %8s %6s %10s %6s %5s\n", "NAME", "SIZE", "ID_WIDTH", "SOURCE", "SHARDS", "WINDOW", "LANES");
}

/* A flat dataset's shard columns read "-": it has no shards (0 would read as a sharded one holding none). */
static void permctl_table_row(const permd_dataset *d)
{
    char shards[24] = "-", window[24] = "-", lanes[24] = "-";
    if (d->shards) {
        snprintf(shards, sizeof shards, "%llu", (unsigned long long)d->shards);
        snprintf(window, sizeof window, "%llu", (unsigned long long)d->window);
        snprintf(lanes, sizeof lanes, "%u", d->lanes);
    }
    printf("%-32s %20llu %8u %6s %10s %6s %5s\n", d->name, (unsigned long long)d->size, d->id_width,
           d->from_config ? "config" : "api", shards, window, lanes);
}

/* ---- datasets ------------------------------------------------------------------------ */

int permctl_cmd_datasets(int argc, char **argv)
{
    permctl_args a;
    permd_client *c;
    int rc = permctl_parse(argc, argv,
                           PERMCTL_CONN_OPTS | PERMCTL_BIT(JSON) | PERMCTL_BIT(SIZE) | PERMCTL_LAYOUT_OPTS |
                               PERMCTL_SHARD_OPTS,
                           0, permctl_datasets_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if (a.npos < 1)
        return permctl_usage_error("datasets: give an action: put, list, get or rm (see permctl datasets --help)");
    const char *action = a.pos[0];
    int json = (a.set & PERMCTL_BIT(JSON)) != 0;
    int is_put = !strcmp(action, "put"), is_list = !strcmp(action, "list");
    int is_get = !strcmp(action, "get"), is_rm = !strcmp(action, "rm");
    if (!is_put && !is_list && !is_get && !is_rm)
        return permctl_usage_error("datasets: unknown action '%s' (put, list, get or rm)", action);
    int sharded = (a.set & PERMCTL_SOURCE_OPTS) != 0;
    int more_tars = is_put && (a.set & PERMCTL_BIT(TARS)); /* --tars SPEC SPEC...: more SPECs after NAME */
    if (is_list ? a.npos != 1 : more_tars ? a.npos < 2 : a.npos != 2)
        return permctl_usage_error(is_list ? "datasets list: unexpected argument '%s'"
                                           : "datasets %s: give exactly one dataset NAME",
                                   is_list ? a.pos[1] : action);
    if (!is_list && (rc = permctl_name("datasets", a.pos[1])))
        return rc;
    if (is_put && sharded == ((a.set & PERMCTL_BIT(SIZE)) != 0))
        return permctl_usage_error("datasets put: give --size N or --shards-file FILE (or --mds INDEX, or --tars SPEC...)");
    if (!is_put && (a.set & (PERMCTL_BIT(SIZE) | PERMCTL_LAYOUT_OPTS | PERMCTL_SHARD_OPTS)))
        return permctl_usage_error("datasets %s: --size, the shards, --window and --lanes apply to put only",
                                   action);
    if (is_put && !sharded && (a.set & (PERMCTL_SHARD_OPTS | PERMCTL_BIT(MAX_SHARDS))))
        return permctl_usage_error("datasets put: --window, --lanes and --max-shards need the shards");
    uint64_t *sizes = NULL, nshards = 0;
    if (sharded && (rc = permctl_read_shards(&a, 2, &sizes, &nshards)))
        return rc;
    if (is_rm && json)
        return permctl_usage_error("datasets rm: --json does not apply");
    if ((rc = permctl_connect(&a, &c))) {
        free(sizes);
        return rc;
    }

    permd_dataset d;
    if (is_put) {
        int32_t created;
        rc = sharded ? permd_put_dataset_sharded(c, a.pos[1], sizes, nshards, a.u[PERMCTL_OPT_WINDOW],
                                                 (uint32_t)a.u[PERMCTL_OPT_LANES], &d, &created)
                     : permd_put_dataset(c, a.pos[1], a.u[PERMCTL_OPT_SIZE], &d, &created);
        free(sizes);
        if (rc)
            return permctl_call_failed(c, "datasets put");
        if (json) {
            fputs("{\"dataset\":", stdout);
            permctl_json_dataset(stdout, &d);
            printf(",\"created\":%s}\n", created ? "true" : "false");
        } else if (d.shards) {
            printf("%s %s (size %llu, %llu shards, window %llu, lanes %u)\n", created ? "created" : "exists", d.name,
                   (unsigned long long)d.size, (unsigned long long)d.shards, (unsigned long long)d.window, d.lanes);
        } else {
            printf("%s %s (size %llu)\n", created ? "created" : "exists", d.name, (unsigned long long)d.size);
        }
    } else if (is_get) {
        if ((rc = permd_get_dataset(c, a.pos[1], &d)))
            return permctl_name_failed(c, "datasets get", rc, a.pos[1], 0);
        if (json) {
            permctl_json_dataset(stdout, &d);
            fputc('\n', stdout);
        } else {
            permctl_table_header();
            permctl_table_row(&d);
        }
    } else if (is_rm) {
        if ((rc = permd_delete_dataset(c, a.pos[1])))
            return permctl_name_failed(c, "datasets rm", rc, a.pos[1], 0);
        printf("deleted %s\n", a.pos[1]);
    } else {
        size_t total, cap = 64;
        permd_dataset *all = NULL;
        for (;;) { /* grow until everything fits */
            permd_dataset *p = realloc(all, cap * sizeof *all);
            if (!p) {
                free(all);
                permd_close(c);
                return permctl_fail(PD_ENOMEM, "datasets list");
            }
            all = p;
            if (permd_list_datasets(c, all, cap, &total)) {
                free(all);
                return permctl_call_failed(c, "datasets list");
            }
            if (total <= cap)
                break;
            cap = total;
        }
        if (json) {
            fputs("{\"datasets\":[", stdout);
            for (size_t i = 0; i < total; i++) {
                if (i)
                    fputc(',', stdout);
                permctl_json_dataset(stdout, &all[i]);
            }
            fputs("]}\n", stdout);
        } else {
            permctl_table_header();
            for (size_t i = 0; i < total; i++)
                permctl_table_row(&all[i]);
        }
        free(all);
    }
    permd_close(c);
    return permctl_stdout_done();
}

/* ---- fetch and stream ---------------------------------------------------------------------- */

/* Shared checks of NAME and the slice options. */
static int permctl_slice(const char *cmd, const permctl_args *a, permd_slice *s)
{
    if (a->npos != 1)
        return permctl_usage_error(a->npos ? "%s: give one dataset NAME, not '%s' too" : "%s: give a dataset NAME",
                                   cmd, a->npos > 1 ? a->pos[1] : "");
    if (a->u[PERMCTL_OPT_RANK] >= a->u[PERMCTL_OPT_WORLD])
        return permctl_usage_error("--rank: %llu must be below --world %llu", (unsigned long long)a->u[PERMCTL_OPT_RANK],
                                   (unsigned long long)a->u[PERMCTL_OPT_WORLD]);
    int rc = permctl_name(cmd, a->pos[0]);
    if (rc)
        return rc;
    memset(s, 0, sizeof *s);
    s->dataset = a->pos[0];
    s->seed = a->u[PERMCTL_OPT_SEED];
    s->epoch = a->u[PERMCTL_OPT_EPOCH];
    s->world = (uint32_t)a->u[PERMCTL_OPT_WORLD];
    s->rank = (uint32_t)a->u[PERMCTL_OPT_RANK];
    s->mode = (uint32_t)a->mode;
    s->offset = a->u[PERMCTL_OPT_OFFSET];
    s->window = a->u[PERMCTL_OPT_WINDOW];
    s->lanes = (uint32_t)a->u[PERMCTL_OPT_LANES];
    return 0;
}

/* Grow *ids (and *offs, unless NULL) to hold need items, doubling *cap; 0 or PD_ENOMEM (the arrays stay valid). */
static int permctl_fetch_room(uint64_t **ids, uint64_t **offs, uint64_t need, uint64_t *cap)
{
    uint64_t n = *cap;
    while (n < need)
        n *= 2;
    uint64_t *p = realloc(*ids, n * sizeof *p);
    if (!p)
        return PD_ENOMEM;
    *ids = p;
    if (offs) {
        if (!(p = realloc(*offs, n * sizeof *p)))
            return PD_ENOMEM;
        *offs = p;
    }
    *cap = n;
    return 0;
}

int permctl_cmd_fetch(int argc, char **argv)
{
    permctl_args a;
    permd_slice s;
    permd_client *c;
    const unsigned req = PERMCTL_SLICE_OPTS | PERMCTL_BIT(COUNT);
    int rc = permctl_parse(argc, argv,
                           req | PERMCTL_BIT(OFFSET) | PERMCTL_BIT(JSON) | PERMCTL_CONN_OPTS | PERMCTL_SHARD_OPTS |
                               PERMCTL_BIT(LOCATIONS),
                           req, permctl_fetch_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if ((rc = permctl_slice("fetch", &a, &s)) || (rc = permctl_connect(&a, &c)))
        return rc;
    permd_server_info info;
    permd_server_info_get(c, &info);
    uint64_t chunk = info.max_count ? info.max_count : 65536, want = a.u[PERMCTL_OPT_COUNT];
    if (chunk > (1u << 20))
        chunk = 1u << 20;
    int locations = (a.set & PERMCTL_BIT(LOCATIONS)) != 0, json = (a.set & PERMCTL_BIT(JSON)) != 0;
    /* --json holds every item until the last reply is in: a failure part way must leave no JSON
     * prefix on stdout for a parser to choke on. Lines go out a chunk at a time. */
    uint64_t cap = chunk, have = 0, *ids = NULL, *offs = NULL;
    static permctl_out out;
    permctl_out_init(&out, stdout);
    /* Counts above the server's max_count are fetched in pieces; the output is the same. --count 0 still asks
     * once: permd checks the name and the offset (it printed an empty answer for a dataset that does not
     * exist, and a next_offset past the epoch's end). */
    do {
        uint64_t n = want < chunk ? want : chunk, got;
        if ((!ids || have + n > cap) && permctl_fetch_room(&ids, locations ? &offs : NULL, have + n, &cap)) {
            free(ids);
            free(offs);
            permd_close(c);
            return permctl_fail(PD_ENOMEM, "fetch");
        }
        rc = locations ? permd_fetch_locations(c, &s, n, ids + have, offs + have, &got, &s.offset)
                       : permd_fetch_u64(c, &s, n, ids + have, &got, &s.offset);
        if (rc) {
            free(ids);
            free(offs);
            permctl_out_flush(&out);
            return permctl_call_failed(c, "fetch");
        }
        for (uint64_t i = json ? got : 0; i < got; i++) {
            if (locations)
                permctl_out_u64_sep(&out, ids[i], ' ');
            permctl_out_u64(&out, locations ? offs[i] : ids[i]);
        }
        if (json)
            have += got; /* else the next chunk reuses the arrays */
        want -= got;
        if (got < n || permctl_out_failed(&out))
            break; /* the rank's slice ended, or nobody reads the output */
    } while (want);
    if (json) {
        char tmp[64];
        permctl_out_str(&out, locations ? "{\"locations\":[" : "{\"ids\":[");
        for (uint64_t i = 0; i < have; i++) {
            if (locations)
                snprintf(tmp, sizeof tmp, "%s[%llu,%llu]", i ? "," : "", (unsigned long long)ids[i],
                         (unsigned long long)offs[i]);
            else
                snprintf(tmp, sizeof tmp, "%s%llu", i ? "," : "", (unsigned long long)ids[i]);
            permctl_out_str(&out, tmp);
        }
        snprintf(tmp, sizeof tmp, "],\"next_offset\":%llu}\n", (unsigned long long)s.offset);
        permctl_out_str(&out, tmp);
    }
    free(ids);
    free(offs);
    permd_close(c);
    return permctl_out_flush(&out);
}

int permctl_cmd_stream(int argc, char **argv)
{
    permctl_args a;
    permd_slice s;
    permd_client *c;
    permd_stream *st;
    const unsigned req = PERMCTL_SLICE_OPTS;
    int rc = permctl_parse(argc, argv,
                           req | PERMCTL_BIT(OFFSET) | PERMCTL_BIT(BATCH) | PERMCTL_BIT(COUNT) | PERMCTL_CONN_OPTS |
                               PERMCTL_SHARD_OPTS | PERMCTL_BIT(LOCATIONS),
                           req, permctl_stream_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if ((rc = permctl_slice("stream", &a, &s)))
        return rc;
    if ((rc = permctl_connect(&a, &c)))
        return rc;
    if ((a.set & PERMCTL_BIT(COUNT)) && a.u[PERMCTL_OPT_COUNT] == 0) {
        /* Nothing asked, nothing printed (0 means "all" on the wire), but the slice is checked as a Fetch of 0
         * ids checks it: a name that does not exist, or an offset past the end, fails as it would with more. */
        uint64_t none, got;
        rc = permd_fetch_u64(c, &s, 0, &none, &got, NULL) ? permctl_call_failed(c, "stream") : PERMCTL_EXIT_OK;
        if (!rc)
            permd_close(c);
        return rc;
    }
    uint64_t batch = (a.set & PERMCTL_BIT(BATCH)) ? a.u[PERMCTL_OPT_BATCH] : PERMCTL_DEFAULT_BATCH;
    permd_server_info info;
    permd_server_info_get(c, &info);
    if (!(a.set & PERMCTL_BIT(BATCH)) && info.max_count && batch > info.max_count)
        batch = info.max_count; /* a server may allow fewer ids a batch than the default; the output is the same */
    if (info.max_count && batch > info.max_count) { /* asked for: said so, in the option's terms */
        permd_close(c);
        return permctl_usage_error("--batch: %llu is above this permd's max_count, %llu ids a message",
                                   (unsigned long long)batch, (unsigned long long)info.max_count);
    }
    uint32_t flags = (a.set & PERMCTL_BIT(LOCATIONS)) ? PERMD_LOCATIONS : 0;
    if (permd_stream_open_ex(c, &s, batch, a.u[PERMCTL_OPT_COUNT], flags, &st))
        return permctl_call_failed(c, "stream");
    static permctl_out out;
    permctl_out_init(&out, stdout);
    for (;;) {
        const void *ids;
        uint32_t width;
        uint64_t n;
        if (permd_stream_next(st, &ids, &width, &n)) {
            permctl_out_flush(&out);
            permd_stream_close(st);
            return permctl_call_failed(c, "stream");
        }
        if (n == 0)
            break;
        const uint8_t *p = ids;
        for (uint64_t i = 0; i < n; i++) {
            if (width == 16) {
                permctl_out_u64_sep(&out, pd_load_le64(p + 16 * i), ' ');
                permctl_out_u64(&out, pd_load_le64(p + 16 * i + 8));
            } else {
                permctl_out_u64(&out, width == 4 ? pd_load_le32(p + 4 * i) : pd_load_le64(p + 8 * i));
            }
        }
        if (permctl_out_failed(&out))
            break; /* nobody reads the output: the stream is cancelled below */
    }
    permd_stream_close(st);
    permd_close(c);
    return permctl_out_flush(&out);
}

/* ---- inverse NAME ---------------------------------------------------------------------------- */

/* Samples one Inverse may carry: at most the server's max_count, and few enough for its max_frame
 * (8 bytes a sample, a mixture's component epoch a varint of up to 10 more). */
static uint64_t permctl_inverse_chunk(permd_client *c)
{
    permd_server_info info;
    permd_server_info_get(c, &info);
    uint64_t n = info.max_frame > 8192 ? (info.max_frame - 4096) / 18 : 128;
    if (info.max_count && n > info.max_count)
        n = info.max_count;
    return n ? n : 1;
}

/* inverse on a mixture: each SAMPLE:CEPOCH (a global id and its component epoch) to "EPOCH POSITION RANK". */
static int permctl_inverse_mixture(const permctl_args *a)
{
    size_t n = (size_t)a->npos - 1;
    uint64_t *q = malloc(2 * n * sizeof *q), *epochs = malloc(n * sizeof *epochs), *pos = malloc(n * sizeof *pos);
    uint32_t *ranks = malloc(n * sizeof *ranks);
    permd_client *c;
    int rc = 0;
    if (!q || !epochs || !pos || !ranks) {
        rc = permctl_fail(PD_ENOMEM, "inverse");
        goto done;
    }
    for (size_t i = 0; i < n && !rc; i++) { /* SAMPLE:COMPONENT_EPOCH, a positional argument (no option to name) */
        const char *t = a->pos[i + 1], *colon = strchr(t, ':');
        char head[32];
        const size_t len = colon ? (size_t)(colon - t) : 0;
        const int fits = len > 0 && len < sizeof head;
        if (fits) {
            memcpy(head, t, len);
            head[len] = '\0';
        }
        if (!fits || pd_parse_u64(head, &q[2 * i]) || pd_parse_u64(colon + 1, &q[2 * i + 1]))
            rc = permctl_usage_error("inverse: '%s' is not SAMPLE:COMPONENT_EPOCH (two unsigned decimal integers)", t);
    }
    if (rc || (rc = permctl_connect(a, &c)))
        goto done;
    uint64_t *samples = malloc(n * sizeof *samples), *cepochs = malloc(n * sizeof *cepochs);
    for (size_t i = 0; samples && cepochs && i < n; i++) {
        samples[i] = q[2 * i];
        cepochs[i] = q[2 * i + 1];
    }
    int mode = (a->set & PERMCTL_BIT(MODE)) ? (int)a->mode : -1;
    uint64_t chunk = permctl_inverse_chunk(c);
    if (!samples || !cepochs) {
        rc = permctl_fail(PD_ENOMEM, "inverse");
        permd_close(c);
    }
    for (size_t i = 0; !rc && i < n; i += chunk) { /* more samples than one request takes go in pieces */
        size_t k = n - i < chunk ? n - i : (size_t)chunk;
        if (permd_inverse_mixture(c, a->pos[0], a->u[PERMCTL_OPT_SEED], (uint32_t)a->u[PERMCTL_OPT_WORLD], mode,
                                  samples + i, cepochs + i, k, epochs + i, pos + i, ranks + i))
            rc = permctl_call_failed(c, "inverse");
    }
    free(samples);
    free(cepochs);
    if (rc)
        goto done;
    permd_close(c);
    for (size_t i = 0; i < n; i++) {
        if (epochs[i] == UINT64_MAX)
            printf("-\n"); /* the run never draws it */
        else if (ranks[i] == PERMD_NO_RANK)
            printf("%llu %llu -\n", (unsigned long long)epochs[i], (unsigned long long)pos[i]);
        else
            printf("%llu %llu %u\n", (unsigned long long)epochs[i], (unsigned long long)pos[i], ranks[i]);
    }
    rc = permctl_stdout_done();
done:
    free(q);
    free(epochs);
    free(pos);
    free(ranks);
    return rc;
}

int permctl_cmd_inverse_daemon(int argc, char **argv)
{
    permctl_args a;
    permd_client *c;
    const unsigned req = PERMCTL_BIT(SEED) | PERMCTL_BIT(WORLD);
    int rc = permctl_parse(argc, argv,
                           req | PERMCTL_BIT(EPOCH) | PERMCTL_BIT(MODE) | PERMCTL_BIT(JSON) | PERMCTL_CONN_OPTS |
                               PERMCTL_SHARD_OPTS,
                           req, permctl_inverse_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if (a.npos < 2)
        return permctl_usage_error("inverse: give a dataset NAME and at least one SAMPLE (or --size N for the "
                                   "offline form; see permctl inverse --help)");
    if ((rc = permctl_name("inverse", a.pos[0])))
        return rc;
    const char *pair = NULL, *alone = NULL; /* SAMPLE:COMPONENT_EPOCH: a mixture's; all of them or none */
    for (int i = 1; i < a.npos; i++) {
        const char **first = strchr(a.pos[i], ':') ? &pair : &alone;
        if (!*first)
            *first = a.pos[i];
    }
    if (pair && alone)
        return permctl_usage_error("inverse: give every SAMPLE as GLOBAL_ID:COMPONENT_EPOCH (on a mixture) or "
                                   "none (on a dataset), not both ('%s', '%s')", pair, alone);
    if (pair) {
        if (a.set & (PERMCTL_BIT(EPOCH) | PERMCTL_BIT(JSON) | PERMCTL_SHARD_OPTS))
            return permctl_usage_error("inverse on a mixture: each SAMPLE:COMPONENT_EPOCH finds its own epoch "
                                       "(no --epoch, no --json; its components' window and lanes are their own)");
        return permctl_inverse_mixture(&a);
    }
    if (!(a.set & PERMCTL_BIT(EPOCH)))
        return permctl_usage_error("inverse: --epoch E is required");
    size_t n = (size_t)a.npos - 1;
    uint64_t *samples = malloc(n * sizeof *samples), *pos = malloc(n * sizeof *pos);
    uint32_t *ranks = malloc(n * sizeof *ranks);
    if (!samples || !pos || !ranks) {
        rc = permctl_fail(PD_ENOMEM, "inverse");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        int prc = pd_parse_u64(a.pos[i + 1], &samples[i]);
        if (prc) {
            rc = permctl_usage_error(prc == PD_ERANGE ? "inverse: SAMPLE %s is above 2^64 - 1"
                                                      : "inverse: SAMPLE '%s' is not an unsigned decimal integer",
                                     a.pos[i + 1]);
            goto done;
        }
    }
    if ((rc = permctl_connect(&a, &c)))
        goto done;
    int32_t mode = (a.set & PERMCTL_BIT(MODE)) ? (int32_t)a.mode : -1;
    uint64_t chunk = permctl_inverse_chunk(c);
    for (size_t i = 0; i < n; i += chunk) { /* more samples than one request takes go in pieces */
        size_t k = n - i < chunk ? n - i : (size_t)chunk;
        if (permd_inverse_sharded(c, a.pos[0], a.u[PERMCTL_OPT_SEED], a.u[PERMCTL_OPT_EPOCH],
                                  (uint32_t)a.u[PERMCTL_OPT_WORLD], mode, a.u[PERMCTL_OPT_WINDOW],
                                  (uint32_t)a.u[PERMCTL_OPT_LANES], samples + i, k, pos + i, ranks + i)) {
            rc = permctl_call_failed(c, "inverse");
            goto done;
        }
    }
    permd_close(c);
    if (a.set & PERMCTL_BIT(JSON)) {
        fputs("{\"samples\":[", stdout);
        for (size_t i = 0; i < n; i++)
            printf("%s%llu", i ? "," : "", (unsigned long long)samples[i]);
        fputs("],\"positions\":[", stdout);
        for (size_t i = 0; i < n; i++)
            printf("%s%llu", i ? "," : "", (unsigned long long)pos[i]);
        fputs("],\"ranks\":[", stdout);
        for (size_t i = 0; i < n; i++) {
            if (ranks[i] == PERMD_NO_RANK)
                printf("%snull", i ? "," : "");
            else
                printf("%s%u", i ? "," : "", ranks[i]);
        }
        fputs("]}\n", stdout);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (ranks[i] == PERMD_NO_RANK)
                printf("%llu -\n", (unsigned long long)pos[i]);
            else
                printf("%llu %u\n", (unsigned long long)pos[i], ranks[i]);
        }
    }
    rc = permctl_stdout_done();
done:
    free(samples);
    free(pos);
    free(ranks);
    return rc;
}

/* ---- stats ------------------------------------------------------------------------------------ */

/* The latency bound (us) below which a fraction q of a type's requests fell;
 * UINT64_MAX when it lies in the +Inf bucket, 0 when there were none. */
static uint64_t permctl_quantile_us(const permd_stats *st, const permd_request_stats *r, double q)
{
    uint64_t total = 0, cum = 0;
    for (int b = 0; b < PERMD_LATENCY_BUCKETS; b++)
        total += r->latency_buckets[b];
    if (!total)
        return 0;
    for (int b = 0; b < PERMD_LATENCY_BUCKETS; b++) {
        cum += r->latency_buckets[b];
        if ((double)cum >= q * (double)total)
            return st->latency_bounds_us[b];
    }
    return UINT64_MAX;
}

static void permctl_print_bound(uint64_t us)
{
    if (us == UINT64_MAX)
        printf(" %10s", "+Inf");
    else
        printf(" %10llu", (unsigned long long)us);
}

static void permctl_stats_tables(const permd_stats *st, int json)
{
    if (json) {
        fputs(",\"latency_bounds_us\":[", stdout);
        for (int b = 0; b + 1 < PERMD_LATENCY_BUCKETS; b++)
            printf("%s%llu", b ? "," : "", (unsigned long long)st->latency_bounds_us[b]);
        fputs("],\"requests_by_type\":[", stdout);
        for (uint32_t i = 0; i < st->nrequests; i++) {
            const permd_request_stats *r = &st->requests[i];
            fputs(i ? ",{\"type\":" : "{\"type\":", stdout);
            permctl_json_string(stdout, r->type);
            printf(",\"requests\":%llu,\"errors\":%llu,\"latency_sum_us\":%llu,\"latency_buckets\":[",
                   (unsigned long long)r->requests, (unsigned long long)r->errors,
                   (unsigned long long)r->latency_sum_us);
            for (int b = 0; b < PERMD_LATENCY_BUCKETS; b++)
                printf("%s%llu", b ? "," : "", (unsigned long long)r->latency_buckets[b]);
            fputs("]}", stdout);
        }
        fputs("],\"errors_by_type\":[", stdout);
        for (uint32_t i = 0; i < st->nerrors; i++) {
            fputs(i ? ",{\"type\":" : "{\"type\":", stdout);
            permctl_json_string(stdout, st->errors[i].type);
            fputs(",\"code\":", stdout);
            permctl_json_string(stdout, st->errors[i].code);
            printf(",\"count\":%llu}", (unsigned long long)st->errors[i].count);
        }
        fputs("]", stdout);
        return;
    }
    printf("\n%-16s %10s %10s %10s %10s %10s\n", "type", "requests", "errors", "mean_us", "p50_us<=", "p99_us<=");
    for (uint32_t i = 0; i < st->nrequests; i++) {
        const permd_request_stats *r = &st->requests[i];
        uint64_t done = 0;
        for (int b = 0; b < PERMD_LATENCY_BUCKETS; b++)
            done += r->latency_buckets[b];
        printf("%-16s %10llu %10llu %10llu", r->type, (unsigned long long)r->requests, (unsigned long long)r->errors,
               (unsigned long long)(done ? r->latency_sum_us / done : 0));
        permctl_print_bound(permctl_quantile_us(st, r, 0.5));
        permctl_print_bound(permctl_quantile_us(st, r, 0.99));
        putchar('\n');
    }
    if (st->nerrors) {
        printf("\n%-16s %-20s %10s\n", "type", "error", "count");
        for (uint32_t i = 0; i < st->nerrors; i++)
            printf("%-16s %-20s %10llu\n", st->errors[i].type, st->errors[i].code,
                   (unsigned long long)st->errors[i].count);
    }
}

int permctl_cmd_stats(int argc, char **argv)
{
    permctl_args a;
    permd_client *c;
    permd_stats st;
    int rc = permctl_parse(argc, argv, PERMCTL_BIT(JSON) | PERMCTL_CONN_OPTS, 0, permctl_stats_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if (a.npos)
        return permctl_usage_error("stats: unexpected argument '%s'", a.pos[0]);
    if ((rc = permctl_connect(&a, &c)))
        return rc;
    if (permd_stats_get(c, &st))
        return permctl_call_failed(c, "stats");
    permd_server_info info;
    permd_server_info_get(c, &info);
    permd_close(c);
    const struct {
        const char *name;
        uint64_t v;
    } rows[] = {
        {"uptime_ms", st.uptime_ms},
        {"connections", st.connections},
        {"connections_total", st.connections_total},
        {"requests_total", st.requests_total},
        {"errors_total", st.errors_total},
        {"ids_served_total", st.ids_served_total},
        {"bytes_out_total", st.bytes_out_total},
        {"datasets", st.datasets},
        {"streams_active", st.streams_active},
        {"streams_total", st.streams_total},
        {"backpressure_pauses", st.backpressure_pauses},
        {"workers", st.workers},
        {"cpu_ids_total", st.cpu_ids_total},
        {"gpu_ids_total", st.gpu_ids_total},
        {"queue_depth", st.queue_depth},
        {"bytes_in_total", st.bytes_in_total},
        {"connections_rejected_total", st.connections_rejected_total},
        {"readahead_hits_total", st.readahead_hits_total},
        {"stream_rings_total", st.stream_rings_total},
    };
    int json = (a.set & PERMCTL_BIT(JSON)) != 0;
    if (json) {
        fputs("{\"server\":", stdout);
        permctl_json_string(stdout, info.server);
    } else {
        printf("%-20s %s\n", "server", info.server);
    }
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (json)
            printf(",\"%s\":%llu", rows[i].name, (unsigned long long)rows[i].v);
        else
            printf("%-20s %llu\n", rows[i].name, (unsigned long long)rows[i].v);
    }
    permctl_stats_tables(&st, json);
    if (json)
        fputs("}\n", stdout);
    return permctl_stdout_done();
}

/* ---- verify ------------------------------------------------------------------------------------ */

static const char permctl_verify_usage[] =
    "usage: permctl verify NAME --seed S --epoch E --world W --rank R --mode M [--offset O]\n"
    "                      [--window K] [--lanes G] [FILE | --ids FILE]\n"
    "       permctl verify (--size N | (--shards-file F | --mds INDEX) [SHARD_OPTS]) --seed S --epoch E\n"
    "                      --world W --rank R --mode M [--offset O] [FILE | --ids FILE]\n"
    "       permctl verify --tars SPEC [SPEC...] [SHARD_OPTS] --seed S --epoch E --world W --rank R\n"
    "                      --mode M [--offset O] [--ids FILE]\n"
    "SHARD_OPTS: [--window K] [--lanes G] [--max-shards M]\n"
    "\n"
    "Check that the ids in FILE (default: standard input; one per line) are exactly\n"
    "what rank R reads from offset O to the end of the epoch — no id missing,\n"
    "repeated or foreign, in any order — by comparing order-independent digests\n"
    "(count, sum, hash). The expected digest comes from permd (NAME) or is computed\n"
    "here (--size, or the shards). Exit 0 when they match, 1 when not, 2 when FILE\n"
    "cannot be read or a line of it is not a sample id (nothing was compared).\n"
    "With --tars every argument is a SPEC, as for permctl rank: give the ids as\n"
    "--ids FILE or on standard input.\n"
    "Connection (with NAME): " PERMCTL_CONN_FLAGS;

/* Digest the ids in a file (or stdin): one decimal id per line. */
static int permctl_digest_file(const char *path, permd_digest *d)
{
    FILE *f = !path || !strcmp(path, "-") ? stdin : fopen(path, "r");
    char line[64];
    uint64_t lineno = 0;
    if (!f)
        return permctl_usage_error("verify: cannot read %s: %s", path, strerror(errno));
    memset(d, 0, sizeof *d);
    while (fgets(line, sizeof line, f)) {
        uint64_t id;
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) { /* fgets stopped at the buffer: the rest would count as another id */
            if (f != stdin)
                fclose(f);
            return permctl_usage_error("verify: %s:%llu: a line longer than %zu bytes is not a sample id",
                                       path ? path : "-", (unsigned long long)lineno, sizeof line - 2);
        }
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0])
            continue;
        if (pd_parse_u64(line, &id)) {
            if (f != stdin)
                fclose(f);
            return permctl_usage_error("verify: %s:%llu: '%s' is not a sample id", path ? path : "-",
                                       (unsigned long long)lineno, line);
        }
        permd_digest_add(d, &id, 1, 8);
    }
    int err = ferror(f) ? errno : 0; /* fgets fails as at the end: a directory (EISDIR), an I/O error */
    if (f != stdin)
        fclose(f);
    if (err)
        return permctl_usage_error("verify: cannot read %s: %s", path ? path : "-", strerror(err));
    return 0;
}

int permctl_cmd_verify(int argc, char **argv)
{
    permctl_args a;
    const unsigned req = PERMCTL_SLICE_OPTS;
    int rc = permctl_parse(argc, argv,
                           req | PERMCTL_BIT(OFFSET) | PERMCTL_BIT(SIZE) | PERMCTL_LAYOUT_OPTS |
                               PERMCTL_SHARD_OPTS | PERMCTL_CONN_OPTS | PERMCTL_BIT(IDS),
                           req, permctl_verify_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    int offline = (a.set & (PERMCTL_BIT(SIZE) | PERMCTL_SOURCE_OPTS)) != 0;
    /* --tars takes any number of SPECs as arguments (as rank does): none of them can be the ids file. */
    int tars = (a.set & PERMCTL_BIT(TARS)) != 0, ids_opt = (a.set & PERMCTL_BIT(IDS)) != 0;
    int named = offline ? 0 : 1;                     /* arguments before the ids file: NAME */
    int most = tars ? a.npos : named + (ids_opt ? 0 : 1); /* arguments allowed */
    if ((a.set & PERMCTL_BIT(SIZE)) && (a.set & PERMCTL_SOURCE_OPTS))
        return permctl_usage_error("verify: give --size or the shards, not both");
    if (a.npos > most)
        return permctl_usage_error("verify: unexpected argument '%s'%s", a.pos[a.npos - 1],
                                   ids_opt ? " (the ids are --ids' file)" : "");
    if (!offline && a.npos < 1)
        return permctl_usage_error("verify: give a dataset NAME, or --size / --shards-file to compute offline");
    if (!offline && (a.set & PERMCTL_BIT(MAX_SHARDS)))
        return permctl_usage_error("verify: --max-shards applies to shards read here, not to dataset '%s'", a.pos[0]);
    if (a.u[PERMCTL_OPT_RANK] >= a.u[PERMCTL_OPT_WORLD])
        return permctl_usage_error("--rank: %llu must be below --world %llu", (unsigned long long)a.u[PERMCTL_OPT_RANK],
                                   (unsigned long long)a.u[PERMCTL_OPT_WORLD]);
    const char *file = ids_opt ? a.s[PERMCTL_OPT_IDS] : !tars && a.npos > named ? a.pos[named] : NULL;
    permd_digest want, got;
    uint32_t world = (uint32_t)a.u[PERMCTL_OPT_WORLD], rank = (uint32_t)a.u[PERMCTL_OPT_RANK];
    if (offline) {
        uint64_t *sizes = NULL, nshards = 0;
        if (a.set & PERMCTL_SOURCE_OPTS) {
            permd_plan *plan;
            if ((rc = permctl_read_shards(&a, tars ? 0 : a.npos, &sizes, &nshards))) /* else: the ids FILE */
                return rc;
            rc = permd_plan_new(a.u[PERMCTL_OPT_SEED], a.u[PERMCTL_OPT_EPOCH], sizes, nshards,
                                a.u[PERMCTL_OPT_WINDOW], (uint32_t)a.u[PERMCTL_OPT_LANES], &plan);
            free(sizes);
            if (rc == PD_EINVAL) /* the options are checked: the layout is what is wrong, as rank says */
                return permctl_usage_error("verify: the shard sizes must sum to between 1 and 2^63 samples");
            if (rc == 0) {
                rc = permd_plan_rank_digest(plan, world, rank, (int)a.mode, a.u[PERMCTL_OPT_OFFSET], &want);
                permd_plan_free(plan);
            }
        } else {
            if (a.set & (PERMCTL_SHARD_OPTS | PERMCTL_BIT(MAX_SHARDS)))
                return permctl_usage_error("verify: --window, --lanes and --max-shards need the shards");
            rc = permd_rank_digest(a.u[PERMCTL_OPT_SEED], a.u[PERMCTL_OPT_EPOCH], a.u[PERMCTL_OPT_SIZE], world, rank,
                                   (int)a.mode, a.u[PERMCTL_OPT_OFFSET], &want);
        }
        if (rc)
            return rc == PD_ERANGE ? permctl_usage_error("--offset: past the end of the epoch")
                                   : permctl_fail(rc, "verify");
    } else {
        permd_slice s;
        permd_client *c;
        char *keep = a.pos[1];
        a.npos = 1; /* permctl_slice wants NAME alone */
        if ((rc = permctl_slice("verify", &a, &s)))
            return rc;
        a.pos[1] = keep;
        if ((rc = permctl_connect(&a, &c)))
            return rc;
        if (permd_digest_slice(c, &s, &want))
            return permctl_call_failed(c, "verify");
        permd_close(c);
    }
    if ((rc = permctl_digest_file(file, &got)))
        return rc;
    if (got.count == want.count && got.sum == want.sum && got.hash == want.hash) {
        printf("ok: %llu ids, each exactly once (digest %016llx)\n", (unsigned long long)got.count,
               (unsigned long long)got.hash);
        /* A verdict nobody could read is no verdict: a failed write fails, as every command's does. */
        return permctl_stdout_done();
    }
    printf("MISMATCH: got %llu ids (sum %llu, hash %016llx), expected %llu ids (sum %llu, hash %016llx)\n",
           (unsigned long long)got.count, (unsigned long long)got.sum, (unsigned long long)got.hash,
           (unsigned long long)want.count, (unsigned long long)want.sum, (unsigned long long)want.hash);
    return PERMCTL_EXIT_FAIL;
}

/* ---- health: GET /healthz on the metrics endpoint ------------------------------------ */

static const char permctl_health_usage[] =
    "usage: permctl health --http HOST:PORT [--timeout-ms MS]\n"
    "\n"
    "Ask permd's metrics endpoint (its metrics key, e.g. 127.0.0.1:9464) for GET\n"
    "/healthz: print its answer and exit 0 when it is 200, 1 otherwise (503 while\n"
    "permd stops, nothing listening, no answer within --timeout-ms, default 5000).\n"
    "A liveness or container health check: unlike stats it needs none of the\n"
    "max_connections places, so a permd busy with clients is not reported unhealthy.\n";

#define PERMCTL_HEALTH_TIMEOUT_MS 5000
#define PERMCTL_HEALTH_ANSWER 1024 /* /healthz answers ~150 bytes; more is read as far as this */

/* One GET /healthz, its answer in buf (NUL-terminated, at most len - 1 bytes): 0, or -1 with *why set. */
static int permctl_http_healthz(const char *hostport, const char *host, uint16_t port, uint64_t deadline, char *buf,
                                size_t len, const char **why)
{
    char req[512];
    int n = snprintf(req, sizeof req, "GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hostport);
    if (n < 0 || (size_t)n >= sizeof req) {
        *why = "HOST:PORT too long";
        return -1;
    }
    static char connect_why[320];
    const int left = pd_endpoint_ms_left(deadline);
    int fd;
    if (pd_endpoint_connect_tcp(host, port, left ? (uint32_t)left : 1, 1, &fd, connect_why, sizeof connect_why)) {
        *why = errno == ETIMEDOUT ? "no answer in time (--timeout-ms)" : connect_why;
        return -1;
    }
    size_t sent = 0, got = 0;
    while (sent < (size_t)n) {
        ssize_t w = send(fd, req + sent, (size_t)n - sent, MSG_NOSIGNAL);
        if (w > 0)
            sent += (size_t)w;
        else if ((errno != EAGAIN && errno != EINTR) || pd_endpoint_wait(fd, POLLOUT, deadline))
            goto fail;
    }
    /* permd answers and closes (Connection: close): read to the end or as far as buf holds. */
    while (got < len - 1) {
        ssize_t r = recv(fd, buf + got, len - 1 - got, 0);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0)
            break;
        else if ((errno != EAGAIN && errno != EINTR) || pd_endpoint_wait(fd, POLLIN, deadline))
            goto fail;
    }
    buf[got] = '\0';
    close(fd);
    return 0;
fail:
    *why = errno == ETIMEDOUT ? "no answer in time (--timeout-ms)" : strerror(errno);
    close(fd);
    return -1;
}

int permctl_cmd_health(int argc, char **argv)
{
    permctl_args a;
    char host[256], answer[PERMCTL_HEALTH_ANSWER + 1];
    uint16_t port;
    const char *why = NULL;
    int rc = permctl_parse(argc, argv, PERMCTL_BIT(HTTP) | PERMCTL_BIT(TIMEOUT_MS), PERMCTL_BIT(HTTP),
                           permctl_health_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if (a.npos)
        return permctl_usage_error("health: unexpected argument '%s'", a.pos[0]);
    const char *hp = a.s[PERMCTL_OPT_HTTP], *colon = strrchr(hp, ':'), *bracket = strrchr(hp, ']');
    /* A port is required: the endpoint's parser would default to permd's TCP port, never the metrics one. */
    if (!colon || (bracket && colon < bracket) || pd_endpoint_parse_hostport(hp, host, sizeof host, &port))
        return permctl_usage_error("--http: '%s' is not HOST:PORT (permd's metrics address, e.g. 127.0.0.1:9464)", hp);
    uint64_t ms = a.set & PERMCTL_BIT(TIMEOUT_MS) ? a.u[PERMCTL_OPT_TIMEOUT_MS] : PERMCTL_HEALTH_TIMEOUT_MS;
    uint64_t deadline = pd_endpoint_now_ms() + ms;
    if (permctl_http_healthz(hp, host, port, deadline, answer, sizeof answer, &why)) {
        permctl_say("health: GET http://%s/healthz: %s", hp, why);
        return PERMCTL_EXIT_FAIL;
    }
    /* "HTTP/1.1 200 OK\r\n...\r\n\r\nok\n": the status line decides; the body says why (ok, stopping). */
    const char *body = strstr(answer, "\r\n\r\n");
    body = body ? body + 4 : "";
    size_t line = strcspn(answer, "\r\n");
    if (strlen(answer) >= 13 && !strncmp(answer, "HTTP/1.", 7) && !strncmp(answer + 8, " 200 ", 5)) {
        /* Its first line, as a server's bytes are printed anywhere: escaped. */
        char first[256];
        const char *said = *body ? body : "ok";
        snprintf(first, sizeof first, "%.*s", (int)strcspn(said, "\r\n"), said);
        permctl_put_escaped(stdout, first);
        putchar('\n');
        return permctl_stdout_done();
    }
    permctl_say("health: GET http://%s/healthz answered '%.*s'%s%.*s", hp, (int)line, answer, *body ? ": " : "",
                (int)strcspn(body, "\r\n"), body);
    return PERMCTL_EXIT_FAIL;
}
