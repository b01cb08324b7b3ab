/* Shared plumbing of the permctl subcommands: argument errors, option values, fast decimal output. */
#ifndef PERMCTL_H
#define PERMCTL_H

#include <stdint.h>
#include <stdio.h>

#include "core/rank.h"

/* Exit codes: 0 success, 1 the operation failed, 2 the command line is wrong. */
enum { PERMCTL_EXIT_OK = 0, PERMCTL_EXIT_FAIL = 1, PERMCTL_EXIT_USAGE = 2 };

typedef int (*permctl_cmd_fn)(int argc, char **argv);

typedef struct permctl_cmd {
    const char *name;
    permctl_cmd_fn run;
    const char *summary;
} permctl_cmd;

/* Print "permctl: <fmt>" to stderr and return PERMCTL_EXIT_USAGE. */
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
    char buf[1 << 16];
} permctl_out;

void permctl_out_init(permctl_out *o, FILE *f);
void permctl_out_u64(permctl_out *o, uint64_t v);
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
    PERMCTL_OPT__COUNT
};
#define PERMCTL_BIT(o) (1u << PERMCTL_OPT_##o)

typedef struct permctl_args {
    uint64_t u[PERMCTL_OPT__COUNT]; /* numeric values, indexed by permctl_opt */
    pd_mode mode;
    unsigned set;                   /* PERMCTL_BIT of each option given */
    int npos;                       /* positional arguments left in pos[] */
    char **pos;
} permctl_args;

/* Parse argv (argv[0] is the subcommand's name). Returns 0, PERMCTL_EXIT_USAGE
 * after printing what is wrong, or -1 after printing usage for --help. */
int permctl_parse(int argc, char **argv, unsigned allowed, unsigned required, const char *usage,
                  permctl_args *a);

/* The offline subcommands (no daemon needed). */
int permctl_cmd_perm(int argc, char **argv);
int permctl_cmd_inverse(int argc, char **argv);
int permctl_cmd_rank(int argc, char **argv);

#endif
