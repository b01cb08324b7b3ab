/* permctl: the command-line client of permd; dispatches subcommands and holds their shared helpers. */
#include "permctl.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/parse.h"

static const permctl_cmd permctl_cmds[] = {
    {"perm", permctl_cmd_perm, "print σ(p): the sample ids of an epoch, in order (offline)"},
    {"inverse", permctl_cmd_inverse, "print σ⁻¹(s): positions of samples (offline with --size, else from permd)"},
    {"rank", permctl_cmd_rank, "print one rank's sample ids (pad, drop or exact) (offline)"},
    {"mix", permctl_cmd_mix, "a weighted mixture of datasets: one rank's ids, or where a sample is drawn (offline)"},
    {"datasets", permctl_cmd_datasets, "put | list | get | rm datasets on permd"},
    {"mixtures", permctl_cmd_mixtures, "put | list | get | rm mixtures of datasets on permd (docs/mixtures.md)"},
    {"fetch", permctl_cmd_fetch, "print the next ids of a rank, fetched from permd"},
    {"stream", permctl_cmd_stream, "print all ids left to a rank, streamed from permd"},
    {"stats", permctl_cmd_stats, "print permd's counters"},
    {"health", permctl_cmd_health, "GET /healthz on permd's metrics endpoint: exit 0 while it serves"},
    {"verify", permctl_cmd_verify, "check a rank's received ids against the epoch's digest (exactly once)"},
    {"shards", permctl_cmd_shards, "print the shard sizes of an MDS index or WebDataset tars (offline)"},
};

static void permctl_help(FILE *f)
{
    fprintf(f, "usage: permctl COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof permctl_cmds / sizeof permctl_cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", permctl_cmds[i].name, permctl_cmds[i].summary);
    fprintf(f, "\n'permctl COMMAND --help' describes a command's options. Daemon commands connect to\n"
               "--socket PATH, else $PERMD_SOCKET, else $XDG_RUNTIME_DIR/permd.sock, else\n"
               "/tmp/permd-<uid>/permd.sock; or to --tcp HOST:PORT (--token-file FILE). --timeout-ms MS\n"
               "bounds the connection and each answer (without it: 10 s to connect and 10 s for the\n"
               "first answer, permd's Hello; later answers unbounded). These four may also come before\n"
               "COMMAND: permctl --socket PATH datasets list.\n");
}

/* The connection options, which may come before COMMAND as well as among its options. */
static const char *const permctl_leading_opts[] = {"--socket", "--tcp", "--token-file", "--timeout-ms"};

/* How many of argv's words the connection option at argv[i] takes (1 for --NAME=VALUE, 2 for --NAME VALUE), or 0
 * if argv[i] is not one. */
static int permctl_leading_opt(int argc, char **argv, int i)
{
    for (size_t k = 0; k < sizeof permctl_leading_opts / sizeof permctl_leading_opts[0]; k++) {
        const size_t n = strlen(permctl_leading_opts[k]);
        if (strncmp(argv[i], permctl_leading_opts[k], n) != 0)
            continue;
        if (argv[i][n] == '=')
            return 1;
        if (argv[i][n] == '\0')
            return i + 1 < argc ? 2 : 1; /* no value: the command's parser says so */
    }
    return 0;
}

/* The command line with the connection options before COMMAND (argv[1 .. first)) moved behind the command's own
 * words, before its "--" if it has one, where its parser takes them as it would have there; NULL without memory.
 * The caller frees the array (not the strings: they are argv's). */
static char **permctl_move_leading(int argc, char **argv, int first, int *out_argc)
{
    char **v = malloc(((size_t)argc + 1) * sizeof *v);
    if (!v)
        return NULL;
    int n = 0, end = first;
    v[n++] = argv[0];
    while (end < argc && strcmp(argv[end], "--") != 0)
        v[n++] = argv[end++];
    for (int i = 1; i < first; i++)
        v[n++] = argv[i];
    while (end < argc)
        v[n++] = argv[end++];
    v[n] = NULL;
    *out_argc = n;
    return v;
}

/* Bytes of the well-formed UTF-8 sequence at p (2-4; overlong forms and surrogates are not well formed), else 0. */
static size_t permctl_utf8_len(const unsigned char *p)
{
    size_t n = p[0] >= 0xc2 && p[0] <= 0xdf   ? 2
               : p[0] >= 0xe0 && p[0] <= 0xef ? 3
               : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4
                                              : 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if ((n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f))) ||
        (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))))
        return 0;
    return n;
}

/* Write s to f with the bytes a terminal would act on shown as \xNN: C0 controls, DEL, UTF-8's C1 controls
 * (U+0080-U+009F), and every byte outside well-formed UTF-8 (a lone 0x9b is CSI to an 8-bit terminal). Messages
 * quote paths, file contents and what a server answered, any of which may hold an escape sequence that would
 * rewrite the user's screen or title. */
void permctl_put_escaped(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = *p < 0x80 ? 1 : permctl_utf8_len(p);
        if (n == 0 || *p < 0x20 || *p == 0x7f || (p[0] == 0xc2 && p[1] <= 0x9f)) {
            n = n ? n : 1; /* a C1 control's two bytes, or one stray byte */
            for (size_t i = 0; i < n; i++)
                fprintf(f, "\\x%02x", p[i]);
        } else {
            fwrite(p, 1, n, f);
        }
        p += n;
    }
}

/* fmt formatted in a buffer of its own (the caller frees it), or NULL out of memory. */
static char *permctl_vformat(const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *msg = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (msg)
        vsnprintf(msg, (size_t)n + 1, fmt, again);
    va_end(again);
    return msg;
}

void permctl_vsay(const char *fmt, va_list ap)
{
    char *msg = permctl_vformat(fmt, ap);
    fputs("permctl: ", stderr);
    permctl_put_escaped(stderr, msg ? msg : "(out of memory formatting the message)");
    fputc('\n', stderr);
    free(msg);
}

void permctl_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    permctl_vsay(fmt, ap);
    va_end(ap);
}

int permctl_stdout_done(void)
{
    return fflush(stdout) || ferror(stdout) ? permctl_fail(PD_EIO, "writing output") : PERMCTL_EXIT_OK;
}

int permctl_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    permctl_vsay(fmt, ap);
    va_end(ap);
    return PERMCTL_EXIT_USAGE;
}

int permctl_fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *what = permctl_vformat(fmt, ap);
    va_end(ap);
    permctl_say("%s: %s (%s)", what ? what : "(out of memory formatting the message)", pd_strerror(err),
                pd_errname(err));
    free(what);
    return PERMCTL_EXIT_FAIL;
}

int permctl_opt_u64(const char *name, const char *value, uint64_t lo, uint64_t hi, uint64_t *out)
{
    int rc = pd_parse_u64_range(value, lo, hi, out);
    if (rc == PD_EINVAL)
        return permctl_usage_error("--%s: '%s' is not an unsigned decimal integer", name, value);
    if (rc == PD_ERANGE)
        return permctl_usage_error("--%s: %s is outside [%llu, %llu]", name, value,
                                   (unsigned long long)lo, (unsigned long long)hi);
    return rc ? PERMCTL_EXIT_USAGE : 0;
}

void permctl_out_init(permctl_out *o, FILE *f)
{
    o->f = f;
    o->len = 0;
    o->failed = 0;
}

static void permctl_out_drain(permctl_out *o)
{
    if (o->len && fwrite(o->buf, 1, o->len, o->f) != o->len)
        o->failed = 1;
    o->len = 0;
}

int permctl_out_failed(const permctl_out *o)
{
    return o->failed || ferror(o->f);
}

void permctl_out_u64(permctl_out *o, uint64_t v)
{
    permctl_out_u64_sep(o, v, '\n');
}

void permctl_out_str(permctl_out *o, const char *s)
{
    size_t n = strlen(s);
    if (o->len + n > sizeof o->buf)
        permctl_out_drain(o);
    if (n > sizeof o->buf) {
        if (fwrite(s, 1, n, o->f) != n)
            o->failed = 1;
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

void permctl_out_u64_sep(permctl_out *o, uint64_t v, char sep)
{
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (o->len + n + 1 > sizeof o->buf)
        permctl_out_drain(o);
    while (n)
        o->buf[o->len++] = tmp[--n];
    o->buf[o->len++] = sep;
}

int permctl_out_flush(permctl_out *o)
{
    permctl_out_drain(o);
    if (fflush(o->f) != 0 || permctl_out_failed(o)) {
        fprintf(stderr, "permctl: writing output failed\n");
        return PERMCTL_EXIT_FAIL;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int first = 1; /* COMMAND's place, past any connection options before it */
    for (int k; first < argc && (k = permctl_leading_opt(argc, argv, first)) > 0;)
        first += k;
    if (first >= argc) {
        permctl_usage_error("missing COMMAND");
        permctl_help(stderr);
        return PERMCTL_EXIT_USAGE;
    }
    const char *cmd = argv[first];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        permctl_help(stdout);
        return PERMCTL_EXIT_OK;
    }
    if (!strcmp(cmd, "--version")) {
        printf("permctl %s (permutation spec v1)\n", PERMD_VERSION);
        return PERMCTL_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof permctl_cmds / sizeof permctl_cmds[0]; i++) {
        if (strcmp(cmd, permctl_cmds[i].name) != 0)
            continue;
        if (first == 1)
            return permctl_cmds[i].run(argc - 1, argv + 1);
        int n;
        char **moved = permctl_move_leading(argc, argv, first, &n);
        if (!moved) {
            fprintf(stderr, "permctl: out of memory\n");
            return PERMCTL_EXIT_FAIL;
        }
        const int rc = permctl_cmds[i].run(n - 1, moved + 1);
        free(moved);
        return rc;
    }
    permctl_usage_error("unknown command '%s'", cmd);
    permctl_help(stderr);
    return PERMCTL_EXIT_USAGE;
}

enum permctl_opt_kind { PERMCTL_U64, PERMCTL_MODE, PERMCTL_STR, PERMCTL_FLAG };

static const struct {
    const char *name;
    enum permctl_opt_kind kind;
    uint64_t lo, hi;
} permctl_opt_info[PERMCTL_OPT__COUNT] = {
    [PERMCTL_OPT_SEED] = {"seed", PERMCTL_U64, 0, UINT64_MAX},
    [PERMCTL_OPT_EPOCH] = {"epoch", PERMCTL_U64, 0, UINT64_MAX},
    [PERMCTL_OPT_SIZE] = {"size", PERMCTL_U64, 1, PD_N_MAX},
    [PERMCTL_OPT_START] = {"start", PERMCTL_U64, 0, PD_N_MAX},
    [PERMCTL_OPT_COUNT] = {"count", PERMCTL_U64, 0, UINT64_MAX},
    [PERMCTL_OPT_WORLD] = {"world", PERMCTL_U64, 1, UINT32_MAX},
    [PERMCTL_OPT_RANK] = {"rank", PERMCTL_U64, 0, UINT32_MAX - 1},
    [PERMCTL_OPT_MODE] = {"mode", PERMCTL_MODE, 0, 0},
    [PERMCTL_OPT_OFFSET] = {"offset", PERMCTL_U64, 0, UINT64_MAX},
    [PERMCTL_OPT_BATCH] = {"batch", PERMCTL_U64, 1, UINT32_MAX},
    [PERMCTL_OPT_SOCKET] = {"socket", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_TCP] = {"tcp", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_TOKEN_FILE] = {"token-file", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_JSON] = {"json", PERMCTL_FLAG, 0, 0},
    [PERMCTL_OPT_SHARDS_FILE] = {"shards-file", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_WINDOW] = {"window", PERMCTL_U64, 1, UINT64_MAX},
    [PERMCTL_OPT_LANES] = {"lanes", PERMCTL_U64, 1, UINT32_MAX},
    [PERMCTL_OPT_LOCATIONS] = {"locations", PERMCTL_FLAG, 0, 0},
    [PERMCTL_OPT_MDS] = {"mds", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_TARS] = {"tars", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_MAX_SHARDS] = {"max-shards", PERMCTL_U64, 1, UINT32_MAX - 1},
    [PERMCTL_OPT_SIZES] = {"sizes", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_WEIGHTS] = {"weights", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_LENGTH] = {"length", PERMCTL_U64, 1, PD_N_MAX},
    [PERMCTL_OPT_BLOCK] = {"block", PERMCTL_U64, 1, UINT32_MAX},
    [PERMCTL_OPT_INVERSE] = {"inverse", PERMCTL_FLAG, 0, 0},
    [PERMCTL_OPT_COMPONENTS] = {"components", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_HTTP] = {"http", PERMCTL_STR, 0, 0},
    [PERMCTL_OPT_TIMEOUT_MS] = {"timeout-ms", PERMCTL_U64, 1, 3600000},
    [PERMCTL_OPT_IDS] = {"ids", PERMCTL_STR, 0, 0},
};

int permctl_parse(int argc, char **argv, unsigned allowed, unsigned required, const char *usage,
                  permctl_args *a)
{
    memset(a, 0, sizeof *a);
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--")) { /* everything after is positional */
            while (++i < argc)
                argv[1 + npos++] = argv[i];
            break;
        }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fputs(usage, stdout);
            return -1;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            argv[1 + npos++] = argv[i]; /* i ≥ 1 + npos: only consumed slots are overwritten */
            continue;
        }
        const char *name = arg + 2, *value = NULL;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        int o = 0;
        while (o < PERMCTL_OPT__COUNT &&
               !(strlen(permctl_opt_info[o].name) == nlen && !strncmp(name, permctl_opt_info[o].name, nlen)))
            o++;
        if (o == PERMCTL_OPT__COUNT || !(allowed & (1u << o)))
            return permctl_usage_error("%s: unknown option '--%.*s' (see permctl %s --help)", argv[0], (int)nlen,
                                       name, argv[0]);
        if (a->set & (1u << o))
            return permctl_usage_error("--%s given twice", permctl_opt_info[o].name);
        a->set |= 1u << o;
        if (o == PERMCTL_OPT_TARS)
            a->npos_before_tars = npos;
        if (permctl_opt_info[o].kind == PERMCTL_FLAG) {
            if (eq)
                return permctl_usage_error("--%s takes no value", permctl_opt_info[o].name);
            continue;
        }
        if (eq)
            value = eq + 1;
        else if (i + 1 < argc)
            value = argv[++i];
        else
            return permctl_usage_error("--%s needs a value", permctl_opt_info[o].name);
        switch (permctl_opt_info[o].kind) {
        case PERMCTL_MODE:
            if (pd_mode_parse(value, &a->mode))
                return permctl_usage_error("--mode: '%s' is not one of pad, drop, exact", value);
            break;
        case PERMCTL_STR:
            if (!*value)
                return permctl_usage_error("--%s: the value is empty", permctl_opt_info[o].name);
            a->s[o] = value;
            break;
        default:
            if (permctl_opt_u64(permctl_opt_info[o].name, value, permctl_opt_info[o].lo, permctl_opt_info[o].hi,
                                &a->u[o]))
                return PERMCTL_EXIT_USAGE;
        }
    }
    unsigned missing = required & ~a->set;
    for (int o = 0; o < PERMCTL_OPT__COUNT; o++)
        if (missing & (1u << o))
            return permctl_usage_error("%s: --%s is required (see permctl %s --help)", argv[0],
                                       permctl_opt_info[o].name, argv[0]);
    a->pos = argv + 1;
    a->npos = npos;
    return 0;
}
