/* permctl shards, and the shard sources every sharded subcommand takes: --shards-file, --mds, --tars. */
#include "permctl.h"

#include <stdlib.h>
#include <string.h>

#include "client/layout.h"
#include "core/error.h"

static const char permctl_shards_usage[] =
    "usage: permctl shards (--mds INDEX | --tars SPEC [SPEC...] | --shards-file F) [--max-shards M]\n"
    "\n"
    "Print a sharded dataset's layout as its loader wrote it, one shard per line in\n"
    "the order its sample ids follow: \"SAMPLES<TAB>PATH\" — a file --shards-file reads\n"
    "back. --mds reads a MosaicML Streaming index.json (or a directory holding one);\n"
    "--tars counts the samples of WebDataset tar shards from their headers: a SPEC is\n"
    "a file, a directory of them, a brace pattern (\"shard-{000000..000999}.tar\") or\n"
    "a glob, several joined by \"::\" as WebDataset joins them. At most M shards\n"
    "(default 16777216). docs/shards.md says what is read and what is refused.\n";

int permctl_read_layout(const permctl_args *a, int first_spec, pd_layout **out)
{
    unsigned src = a->set & PERMCTL_SOURCE_OPTS;
    if (!src || (src & (src - 1)))
        return permctl_usage_error("give one of --shards-file FILE, --mds INDEX or --tars SPEC...");
    if (!(src & PERMCTL_BIT(TARS)) && first_spec < a->npos)
        return permctl_usage_error("unexpected argument '%s'", a->pos[first_spec]);
    if ((src & PERMCTL_BIT(TARS)) && first_spec < a->npos_before_tars) /* its place would change the shards' order */
        return permctl_usage_error("--tars: SPEC '%s' comes before --tars; give every SPEC after it, in order",
                                   a->pos[first_spec]);
    uint64_t max = (a->set & PERMCTL_BIT(MAX_SHARDS)) ? a->u[PERMCTL_OPT_MAX_SHARDS] : 0;
    char err[1024];
    int rc;
    const char *opt;
    if (src & PERMCTL_BIT(SHARDS_FILE)) {
        opt = "--shards-file";
        rc = pd_layout_read_sizes(a->s[PERMCTL_OPT_SHARDS_FILE], max, out, err, sizeof err);
        if (rc && rc != PD_ENOMEM) /* a file of the user's: the command line's fault, as always */
            return permctl_usage_error("%s: %s", opt, err);
    } else if (src & PERMCTL_BIT(MDS)) {
        opt = "--mds";
        rc = pd_layout_read_mds(a->s[PERMCTL_OPT_MDS], max, out, err, sizeof err);
    } else {
        opt = "--tars";
        int n = 1 + (a->npos > first_spec ? a->npos - first_spec : 0);
        const char **specs = malloc((size_t)n * sizeof *specs);
        if (!specs)
            return permctl_fail(PD_ENOMEM, "--tars");
        specs[0] = a->s[PERMCTL_OPT_TARS];
        for (int i = 1; i < n; i++)
            specs[i] = a->pos[first_spec + i - 1];
        rc = pd_layout_read_tars(specs, (size_t)n, max, out, err, sizeof err);
        free(specs);
    }
    return rc ? permctl_fail(rc, "%s: %s", opt, err) : 0;
}

int permctl_read_shards(const permctl_args *a, int first_spec, uint64_t **sizes, uint64_t *n)
{
    pd_layout *l;
    int rc = permctl_read_layout(a, first_spec, &l);
    if (rc)
        return rc;
    *n = pd_layout_shards(l);
    *sizes = malloc(*n * sizeof **sizes);
    if (*sizes)
        memcpy(*sizes, pd_layout_sizes(l), *n * sizeof **sizes);
    pd_layout_free(l);
    return *sizes ? 0 : permctl_fail(PD_ENOMEM, "shard sizes");
}

int permctl_cmd_shards(int argc, char **argv)
{
    permctl_args a;
    pd_layout *l;
    int rc = permctl_parse(argc, argv, PERMCTL_SOURCE_OPTS | PERMCTL_BIT(MAX_SHARDS), 0, permctl_shards_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if ((rc = permctl_read_layout(&a, 0, &l)))
        return rc;
    static permctl_out out;
    permctl_out_init(&out, stdout);
    /* What is printed must read back as the same shards: a sizes line ends at \r as at \n (a path holding
     * "\r999 b" read back as a shard of 999 samples more), and the blanks before a path are the separator's. All
     * are checked before a line is printed: no sizes file is left half written. */
    for (uint64_t i = 0; i < pd_layout_shards(l); i++) {
        const char *path = pd_layout_path(l, i);
        if (path && (strpbrk(path, "\n\r") || path[0] == ' ' || path[0] == '\t')) {
            permctl_say("shard %llu's path %s %s: it cannot be printed as a sizes line that reads back the same; "
                        "rename the file", (unsigned long long)i, path,
                        strpbrk(path, "\n\r") ? "holds a line end (\\n or \\r)" : "starts with a blank");
            pd_layout_free(l);
            return PERMCTL_EXIT_FAIL;
        }
    }
    for (uint64_t i = 0; i < pd_layout_shards(l); i++) {
        const char *path = pd_layout_path(l, i);
        permctl_out_u64_sep(&out, pd_layout_sizes(l)[i], path ? '\t' : '\n');
        if (path) {
            permctl_out_str(&out, path);
            permctl_out_str(&out, "\n");
        }
    }
    if ((rc = permctl_out_flush(&out)) == 0) /* the summary after the lines, on stderr: stdout stays a sizes file */
        fprintf(stderr, "permctl: %llu shards, %llu samples (%llu bytes of shard files read)\n",
                (unsigned long long)pd_layout_shards(l), (unsigned long long)pd_layout_samples(l),
                (unsigned long long)pd_layout_bytes_read(l));
    pd_layout_free(l);
    return rc;
}
