/* permctl perm | inverse | rank: spec-v1 answers computed locally by the core, no daemon involved. */
#include "permctl.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/shards.h"
#include "cpu/gen.h"
#include "core/parse.h"

#define PERMCTL_CHUNK 4096 /* ids computed per bulk call before printing */

static const char permctl_perm_usage[] =
    "usage: permctl perm --seed S --epoch E --size N [--start P] [--count C]\n"
    "\n"
    "Print σ(P), σ(P+1), …: the sample id at each global position of epoch E,\n"
    "one per line. --start defaults to 0, --count to the rest of the epoch.\n"
    "S and E are any u64; 1 ≤ N ≤ 2^63; P + C ≤ N.\n";

const char permctl_inverse_usage[] =
    "usage: permctl inverse --seed S --epoch E --size N SAMPLE...              (offline)\n"
    "       permctl inverse NAME --seed S --epoch E --world W [--mode M] SAMPLE... [--json]\n"
    "\n"
    "Print σ⁻¹(SAMPLE): the global position of each sample id, one per line.\n"
    "With --size the core computes it here; with a dataset NAME instead, permd\n"
    "does, and each line also names the rank of W that reads the position\n"
    "(position mod W; '-' when drop mode discards it).\n";

static const char permctl_rank_usage[] =
    "usage: permctl rank --seed S --epoch E (--size N | SHARDS [--window K] [--lanes G] [--locations])\n"
    "                    --world W --rank R --mode pad|drop|exact [--offset O] [--count C]\n"
    "       SHARDS: --shards-file F | --mds INDEX | --tars SPEC [SPEC...]  (see permctl shards --help)\n"
    "\n"
    "Print the sample ids rank R of W reads after O global positions were\n"
    "consumed (positions O + R + k·W), one per line. pad repeats samples so every\n"
    "rank reads ⌈N/W⌉; drop discards the last N mod W positions; exact reads\n"
    "every sample once. --count defaults to all the rank has left.\n"
    "With SHARDS (sizes one per line, or as an MDS index or tars list them) the epoch is the sharded order of\n"
    "docs/spec/shards-v1.md: windows of K shards (default 8) read through G lanes\n"
    "(default 1); --locations prints \"SHARD OFFSET\" instead of sample ids.\n";

#define PERMCTL_KEY_OPTS (PERMCTL_BIT(SEED) | PERMCTL_BIT(EPOCH) | PERMCTL_BIT(SIZE))

static int permctl_init_perm(const permctl_args *a, pd_perm *p)
{
    int rc = pd_perm_init(p, a->u[PERMCTL_OPT_SEED], a->u[PERMCTL_OPT_EPOCH], PD_STREAM_SAMPLES,
                          a->u[PERMCTL_OPT_SIZE]);
    return rc ? permctl_fail(rc, "--size") : 0;
}

int permctl_cmd_perm(int argc, char **argv)
{
    permctl_args a;
    pd_perm p;
    int rc = permctl_parse(argc, argv, PERMCTL_KEY_OPTS | PERMCTL_BIT(START) | PERMCTL_BIT(COUNT),
                           PERMCTL_KEY_OPTS, permctl_perm_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if (a.npos)
        return permctl_usage_error("perm: unexpected argument '%s'", a.pos[0]);
    if ((rc = permctl_init_perm(&a, &p)))
        return rc;
    uint64_t n = a.u[PERMCTL_OPT_SIZE], start = a.u[PERMCTL_OPT_START];
    if (start > n)
        return permctl_usage_error("--start: %llu is past the end of the epoch (size %llu)",
                                   (unsigned long long)start, (unsigned long long)n);
    uint64_t count = (a.set & PERMCTL_BIT(COUNT)) ? a.u[PERMCTL_OPT_COUNT] : n - start;
    if (count > n - start)
        return permctl_usage_error("--count: start %llu + count %llu exceeds size %llu",
                                   (unsigned long long)start, (unsigned long long)count,
                                   (unsigned long long)n);
    static uint64_t ids[PERMCTL_CHUNK];
    static permctl_out out;
    pd_gen gen;
    pd_gen_init(&gen, PD_ISA_AUTO); /* the fastest kernel here: same ids as the core */
    permctl_out_init(&out, stdout);
    while (count) {
        uint64_t c = count < PERMCTL_CHUNK ? count : PERMCTL_CHUNK;
        if ((rc = pd_gen_fill_u64(&gen, &p, start, c, ids)))
            return permctl_fail(rc, "perm");
        for (uint64_t i = 0; i < c; i++)
            permctl_out_u64(&out, ids[i]);
        start += c;
        count -= c;
    }
    return permctl_out_flush(&out);
}

/* Whether argv holds --NAME or --NAME=VALUE before any "--". */
static int permctl_has_option(int argc, char **argv, const char *name)
{
    size_t n = strlen(name);
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strncmp(argv[i], "--", 2) && !strncmp(argv[i] + 2, name, n) &&
            (argv[i][2 + n] == '\0' || argv[i][2 + n] == '='))
            return 1;
    return 0;
}

int permctl_cmd_inverse(int argc, char **argv)
{
    permctl_args a;
    pd_perm p;
    int help = permctl_has_option(argc, argv, "help");
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        help |= !strcmp(argv[i], "-h");
    if (!help && !permctl_has_option(argc, argv, "size"))
        return permctl_cmd_inverse_daemon(argc, argv); /* a dataset NAME instead of --size */
    int rc = permctl_parse(argc, argv, PERMCTL_KEY_OPTS, PERMCTL_KEY_OPTS, permctl_inverse_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if (!a.npos)
        return permctl_usage_error("inverse: give at least one SAMPLE (see permctl inverse --help)");
    if ((rc = permctl_init_perm(&a, &p)))
        return rc;
    /* Validate every sample before printing any answer: all or nothing. */
    uint64_t n = a.u[PERMCTL_OPT_SIZE];
    uint64_t *samples = malloc((size_t)a.npos * sizeof *samples);
    if (!samples)
        return permctl_fail(PD_ENOMEM, "inverse");
    for (int i = 0; i < a.npos; i++) {
        rc = pd_parse_u64(a.pos[i], &samples[i]);
        if (rc || samples[i] >= n) {
            free(samples);
            if (rc == PD_EINVAL)
                return permctl_usage_error("inverse: SAMPLE '%s' is not an unsigned decimal integer",
                                           a.pos[i]);
            return permctl_usage_error("inverse: SAMPLE %s is not below --size %llu", a.pos[i],
                                       (unsigned long long)n);
        }
    }
    static permctl_out out;
    permctl_out_init(&out, stdout);
    for (int i = 0; i < a.npos; i++)
        permctl_out_u64(&out, pd_perm_inv(&p, samples[i]));
    free(samples);
    return permctl_out_flush(&out);
}

/* The sharded form of rank: a plan over the shard sizes, printed in chunks. */
static int permctl_rank_sharded(const permctl_args *a, pd_slice *s, uint64_t want)
{
    uint64_t *sizes, nshards;
    int rc = permctl_read_shards(a, 0, &sizes, &nshards);
    if (rc)
        return rc;
    uint64_t *start = malloc((size_t)(nshards + 1) * sizeof *start);
    size_t bytes = pd_shard_plan_bytes(nshards);
    void *mem = malloc(bytes);
    pd_shard_plan plan;
    uint64_t left;
    int locations = (a->set & PERMCTL_BIT(LOCATIONS)) != 0;
    if (!start || !mem)
        rc = permctl_fail(PD_ENOMEM, "rank");
    else if (pd_shard_layout_build(sizes, nshards, start))
        rc = permctl_usage_error("rank: the shard sizes must sum to between 1 and 2^63 samples");
    else if ((rc = pd_shard_plan_init(&plan, start, nshards, a->u[PERMCTL_OPT_SEED], a->u[PERMCTL_OPT_EPOCH],
                                      (a->set & PERMCTL_BIT(WINDOW)) ? a->u[PERMCTL_OPT_WINDOW] : 8,
                                      (a->set & PERMCTL_BIT(LANES)) ? a->u[PERMCTL_OPT_LANES] : 1, mem, bytes)))
        rc = permctl_fail(rc, "rank");
    else if ((rc = pd_slice_remaining(plan.n, s, &left)))
        rc = rc == PD_ERANGE ? permctl_usage_error("--offset: %llu is past the end of the epoch",
                                                   (unsigned long long)s->offset)
                             : permctl_fail(rc, "rank");
    if (rc)
        goto done;
    static pd_shard_loc locs[PERMCTL_CHUNK];
    static permctl_out out;
    permctl_out_init(&out, stdout);
    for (uint64_t count = want < left ? want : left, got; count; count -= got) {
        if ((rc = pd_shard_slice_fill_locs(&plan, s, count < PERMCTL_CHUNK ? count : PERMCTL_CHUNK, locs, &got))) {
            rc = permctl_fail(rc, "rank");
            goto done;
        }
        for (uint64_t i = 0; i < got; i++) {
            if (locations) {
                permctl_out_u64_sep(&out, locs[i].shard, ' ');
                permctl_out_u64(&out, locs[i].offset);
            } else {
                permctl_out_u64(&out, locs[i].sample);
            }
        }
        s->offset += got * s->world; /* the next chunk starts where this one ended */
    }
    rc = permctl_out_flush(&out);
done:
    free(sizes);
    free(start);
    free(mem);
    return rc;
}

int permctl_cmd_rank(int argc, char **argv)
{
    permctl_args a;
    pd_perm p;
    const unsigned req = PERMCTL_BIT(SEED) | PERMCTL_BIT(EPOCH) | PERMCTL_BIT(WORLD) | PERMCTL_BIT(RANK) |
                         PERMCTL_BIT(MODE);
    const unsigned shard_opts = PERMCTL_BIT(WINDOW) | PERMCTL_BIT(LANES) | PERMCTL_BIT(LOCATIONS);
    int rc = permctl_parse(argc, argv,
                           req | PERMCTL_BIT(SIZE) | PERMCTL_LAYOUT_OPTS | shard_opts | PERMCTL_BIT(OFFSET) |
                               PERMCTL_BIT(COUNT),
                           req, permctl_rank_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    int sharded = (a.set & PERMCTL_SOURCE_OPTS) != 0;
    if (a.npos && !(a.set & PERMCTL_BIT(TARS)))
        return permctl_usage_error("rank: unexpected argument '%s'", a.pos[0]);
    if (sharded == ((a.set & PERMCTL_BIT(SIZE)) != 0))
        return permctl_usage_error("rank: give --size N or the shards: --shards-file, --mds or --tars (see permctl rank --help)");
    if (!sharded && (a.set & (shard_opts | PERMCTL_BIT(MAX_SHARDS))))
        return permctl_usage_error("rank: --window, --lanes, --locations and --max-shards need the shards");
    pd_slice s = {
        .world = (uint32_t)a.u[PERMCTL_OPT_WORLD],
        .rank = (uint32_t)a.u[PERMCTL_OPT_RANK],
        .mode = a.mode,
        .offset = a.u[PERMCTL_OPT_OFFSET],
    };
    if (s.rank >= s.world)
        return permctl_usage_error("--rank: %u must be below --world %u", s.rank, s.world);
    if (sharded)
        return permctl_rank_sharded(&a, &s, (a.set & PERMCTL_BIT(COUNT)) ? a.u[PERMCTL_OPT_COUNT] : UINT64_MAX);
    if ((rc = permctl_init_perm(&a, &p)))
        return rc;
    uint64_t left, len;
    pd_epoch_length(p.n, s.world, s.mode, &len);
    if (s.rank >= s.world)
        return permctl_usage_error("--rank: %u must be below --world %u", s.rank, s.world);
    if (s.offset > len)
        return permctl_usage_error("--offset: %llu is past the end of the epoch (%llu positions in %s mode)",
                                   (unsigned long long)s.offset, (unsigned long long)len,
                                   pd_mode_name(s.mode));
    if ((rc = pd_slice_remaining(p.n, &s, &left)))
        return permctl_fail(rc, "rank");
    uint64_t count = (a.set & PERMCTL_BIT(COUNT)) && a.u[PERMCTL_OPT_COUNT] < left ? a.u[PERMCTL_OPT_COUNT]
                                                                                  : left;
    static uint64_t ids[PERMCTL_CHUNK];
    static permctl_out out;
    pd_gen gen;
    pd_gen_init(&gen, PD_ISA_AUTO); /* the fastest kernel here: same ids as the core */
    permctl_out_init(&out, stdout);
    while (count) {
        uint64_t c = count < PERMCTL_CHUNK ? count : PERMCTL_CHUNK, got;
        if ((rc = pd_gen_slice_fill_u64(&gen, &p, &s, c, ids, &got)))
            return permctl_fail(rc, "rank");
        for (uint64_t i = 0; i < got; i++)
            permctl_out_u64(&out, ids[i]);
        s.offset += got * s.world; /* the next chunk starts where this one ended */
        count -= got;
    }
    return permctl_out_flush(&out);
}
