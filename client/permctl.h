/* Shared plumbing of the permctl subcommands: argument errors, option values, fast decimal output. */
#ifndef PERMCTL_H
#define PERMCTL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "client/layout.h"
#include "client/permd.h"
#include "core/rank.h"

/* Exit codes: 0 success, 1 the operation failed, 2 the command line is wrong. */
enum { PERMCTL_EXIT_OK = 0, PERMCTL_EXIT_FAIL = 1, PERMCTL_EXIT_USAGE = 2 };

typedef int (*permctl_cmd_fn)(int argc, char **argv);

typedef struct permctl_cmd {
    const char *name;
    permctl_cmd_fn run;
    const char *summary;
} permctl_cmd;

/* Print "permctl: <fmt>\n" to stderr, control bytes shown as \xNN (permctl_put_escaped). */
void permctl_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void permctl_vsay(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
/* Write s to f, the bytes a terminal acts on (C0, DEL, UTF-8 C1, any byte outside well-formed UTF-8) shown as
 * \xNN. */
void permctl_put_escaped(FILE *f, const char *s);
/* Flush stdout: PERMCTL_EXIT_OK, or PERMCTL_EXIT_FAIL saying so when a write failed (a full disk, a closed pipe):
 * a command's answer that could not be written is no answer. */
int permctl_stdout_done(void);
/* permctl_say, then return PERMCTL_EXIT_USAGE. */
int permctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "permctl: <what>: <pd_strerror(err)> (<PD_E...>)" to stderr and return PERMCTL_EXIT_FAIL. */
int permctl_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse option --name's value into *out within [lo, hi]; on failure print a
 * message naming the option and return PERMCTL_EXIT_USAGE, else 0. */
int permctl_opt_u64(const char *name, const char *value, uint64_t lo, uint64_t hi, uint64_t *out);

/* Buffered writer of decimal integers, one per line (printf is the
 * bottleneck when printing millions of ids). */
typedef struct permctl_out {
    FILE *f;
    size_t len;
    int failed; /* a write came up short: nobody reads what follows (a closed pipe, a full disk) */
    char buf[1 << 16];
} permctl_out;

void permctl_out_init(permctl_out *o, FILE *f);
void permctl_out_u64(permctl_out *o, uint64_t v);
/* Whether a write failed: loops that print long outputs stop there (with SIGPIPE ignored, a reader that
 * went away would otherwise leave them computing forever), then permctl_out_flush reports it. */
int permctl_out_failed(const permctl_out *o);
/* Flush; returns 0 or PERMCTL_EXIT_FAIL when stdout failed (a closed pipe, a full disk). */
int permctl_out_flush(permctl_out *o);

/* Every option any subcommand takes; a subcommand names the ones it accepts
 * and the ones it requires as bit sets, so all share one parser and one
 * set of messages. */
enum permctl_opt {
    PERMCTL_OPT_SEED,
    PERMCTL_OPT_EPOCH,
    PERMCTL_OPT_SIZE,
    PERMCTL_OPT_START,
    PERMCTL_OPT_COUNT,
    PERMCTL_OPT_WORLD,
    PERMCTL_OPT_RANK,
    PERMCTL_OPT_MODE,
    PERMCTL_OPT_OFFSET,
    PERMCTL_OPT_BATCH,
    PERMCTL_OPT_SOCKET,     /* the daemon's Unix socket (else $PERMD_SOCKET, else the default) */
    PERMCTL_OPT_TCP,        /* HOST:PORT instead of the Unix socket */
    PERMCTL_OPT_TOKEN_FILE, /* TCP auth secret (else $PERMD_TOKEN_FILE) */
    PERMCTL_OPT_JSON,       /* a flag: structured output */
    PERMCTL_OPT_SHARDS_FILE, /* a sharded dataset's sizes, one per line */
    PERMCTL_OPT_WINDOW,     /* K: shards per window */
    PERMCTL_OPT_LANES,      /* G: lanes */
    PERMCTL_OPT_LOCATIONS,  /* a flag: print "shard offset" instead of ids */
    PERMCTL_OPT_MDS,        /* a MosaicML Streaming index.json (client/layout.h) */
    PERMCTL_OPT_TARS,       /* WebDataset tar shards: the first SPEC (more may follow as arguments) */
    PERMCTL_OPT_MAX_SHARDS, /* the most shards a layout may list */
    PERMCTL_OPT_SIZES,      /* a mixture's component sizes: N0,N1,... */
    PERMCTL_OPT_WEIGHTS,    /* its first stage's weights: W0,W1,... */
    PERMCTL_OPT_LENGTH,     /* L: positions per mixture epoch */
    PERMCTL_OPT_BLOCK,      /* B: a mixture's block */
    PERMCTL_OPT_INVERSE,    /* a flag: positional J:LOCAL:CEPOCH triples to find */
    PERMCTL_OPT_COMPONENTS, /* a mixture's components on the daemon: NAME0,NAME1,... */
    PERMCTL_OPT_HTTP,       /* permd's metrics endpoint HOST:PORT (health) */
    PERMCTL_OPT_TIMEOUT_MS, /* how long health waits for its answer */
    PERMCTL_OPT_IDS,        /* verify: the file of ids (where every argument is a --tars SPEC) */
    PERMCTL_OPT__COUNT
};
#define PERMCTL_BIT(o) (1u << PERMCTL_OPT_##o)

typedef struct permctl_args {
    uint64_t u[PERMCTL_OPT__COUNT];    /* numeric values, indexed by permctl_opt */
    const char *s[PERMCTL_OPT__COUNT]; /* string values */
    pd_mode mode;
    unsigned set;                   /* PERMCTL_BIT of each option given */
    int npos;                       /* positional arguments, in order, wherever they appeared */
    int npos_before_tars;           /* of those, the ones before --tars (which are not its SPECs) */
    char **pos;
} permctl_args;

/* Parse argv (argv[0] is the subcommand's name); options and positional
 * arguments may be mixed, "--" ends options. Returns 0, PERMCTL_EXIT_USAGE
 * after printing what is wrong, or -1 after printing usage for --help.
 * Reorders argv so that the positional arguments come first. */
int permctl_parse(int argc, char **argv, unsigned allowed, unsigned required, const char *usage,
                  permctl_args *a);

/* Write v then one separator byte (',' for JSON arrays, '\n' for lines). */
void permctl_out_u64_sep(permctl_out *o, uint64_t v, char sep);
/* Write a string as-is (JSON punctuation, labels). */
void permctl_out_str(permctl_out *o, const char *s);

/* Where a sharded dataset's sizes come from: exactly one of these (with --max-shards). */
#define PERMCTL_SOURCE_OPTS (PERMCTL_BIT(SHARDS_FILE) | PERMCTL_BIT(MDS) | PERMCTL_BIT(TARS))
#define PERMCTL_LAYOUT_OPTS (PERMCTL_SOURCE_OPTS | PERMCTL_BIT(MAX_SHARDS))

/* The layout of --shards-file F, --mds INDEX or --tars SPEC, with a->pos[first_spec..] as more
 * tar SPECs (permctl_shards.c). On failure prints a message naming the file and returns
 * PERMCTL_EXIT_USAGE (no source or two, arguments where --tars is not given, a bad sizes file)
 * or PERMCTL_EXIT_FAIL (an index or tar that cannot be read, with its PD_E* name); else 0. */
int permctl_read_layout(const permctl_args *a, int first_spec, pd_layout **out);
/* As permctl_read_layout, the sizes alone in a malloc'd array. */
int permctl_read_shards(const permctl_args *a, int first_spec, uint64_t **sizes, uint64_t *n);

/* A list of u64 in [lo, hi] separated by sep into out (at most cap; *n gets how many). */
int permctl_u64_list(const char *opt, const char *text, char sep, uint64_t lo, uint64_t hi, uint64_t *out,
                     size_t cap, size_t *n);
/* Take every --stage VALUE out of argv (before any "--") into stages[] (at most PERMCTL_MIX_STAGES). */
#define PERMCTL_MIX_STAGES 256
int permctl_take_stages(int *argc, char **argv, const char **stages, int *nstages);
/* A mixture's stage table from --weights (stage 0) and the --stage G:W0,W1,... texts: nstages + 1
 * starts and rows of ncomp weights, malloc'd. On failure prints why and returns an exit code. */
int permctl_mix_stages(const permctl_args *a, const char **stage_text, int nstages, size_t ncomp, uint64_t **starts,
                       uint32_t **weights);

/* Options every daemon subcommand accepts. */
#define PERMCTL_CONN_OPTS (PERMCTL_BIT(SOCKET) | PERMCTL_BIT(TCP) | PERMCTL_BIT(TOKEN_FILE) | PERMCTL_BIT(TIMEOUT_MS))
/* The line every command that talks to permd ends its --help with. */
#define PERMCTL_CONN_FLAGS "[--socket PATH | --tcp HOST:PORT [--token-file FILE]] [--timeout-ms MS].\n"
#define PERMCTL_CONN_HELP "Connection: " PERMCTL_CONN_FLAGS

/* The offline subcommands (no daemon needed). */
int permctl_cmd_perm(int argc, char **argv);
int permctl_cmd_inverse(int argc, char **argv); /* dispatches to the daemon form without --size */
int permctl_cmd_rank(int argc, char **argv);
int permctl_cmd_mix(int argc, char **argv); /* mixtures: a rank's ids, locations, inverse */

extern const char permctl_inverse_usage[]; /* both forms of inverse */

/* Shared by the daemon subcommands: connect as the options say (prints why it cannot, returning
 * an exit code); print a failed call's error (closing c) and return its exit code; a JSON string. */
int permctl_connect(const permctl_args *a, permd_client **c);
int permctl_call_failed(permd_client *c, const char *what);
/* permctl_call_failed for a call on NAME that failed with rc; NOT_FOUND says whether NAME is of the other kind
 * (a mixture where a dataset was wanted, or the reverse), naming the command for it. Closes c. */
int permctl_name_failed(permd_client *c, const char *what, int rc, const char *name, int wanted_mixture);
/* 0 when name may name a dataset or mixture (core/name.h), else a usage error (exit 2) saying what one is. */
int permctl_name(const char *what, const char *name);
void permctl_json_string(FILE *f, const char *s);

/* The daemon subcommands (permctl_daemon.c). */
int permctl_cmd_datasets(int argc, char **argv);
int permctl_cmd_fetch(int argc, char **argv);
int permctl_cmd_stream(int argc, char **argv);
int permctl_cmd_inverse_daemon(int argc, char **argv);
int permctl_cmd_stats(int argc, char **argv);
int permctl_cmd_health(int argc, char **argv); /* GET /healthz on the metrics endpoint, no libpermd */
int permctl_cmd_verify(int argc, char **argv); /* offline with --size / --shards-file, else the daemon */
int permctl_cmd_shards(int argc, char **argv); /* permctl_shards.c */
int permctl_cmd_mixtures(int argc, char **argv); /* permctl_mixtures.c */

#endif
