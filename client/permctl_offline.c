/* permctl perm | inverse | rank | mix: spec-v1, shard and mixture answers computed locally, no daemon involved. */
#include "permctl.h"

#include <stdlib.h>
#include <string.h>

#include "client/permd.h"
#include "core/error.h"
#include "core/mixture.h"
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
    "       permctl inverse NAME --seed S --epoch E --world W [--mode M] [--window K] [--lanes G]\n"
    "                       SAMPLE... [--json]\n"
    "       permctl inverse MIXTURE --seed S --world W [--mode M] SAMPLE:COMPONENT_EPOCH...\n"
    "\n"
    "Print σ⁻¹(SAMPLE): the global position of each sample id, one per line.\n"
    "With --size the core computes it here; with a dataset NAME instead, permd\n"
    "does, and each line also names the rank of W that reads the position\n"
    "(position mod W; '-' when drop mode discards it). On a mixture each global\n"
    "id comes with the component epoch it is drawn in, and each line is\n"
    "'EPOCH POSITION RANK' (the mixture epoch that draws it), or '-' when the\n"
    "run never does (its component's weight fell to 0). --window and --lanes: a\n"
    "sharded dataset's order under other K and G, as fetch's override them.\n"
    "Connection (with NAME or MIXTURE): " PERMCTL_CONN_FLAGS;

static const char permctl_rank_usage[] =
    "usage: permctl rank --seed S --epoch E (--size N | SHARDS [--window K] [--lanes G] [--locations])\n"
    "                    --world W --rank R --mode pad|drop|exact [--offset O] [--count C]\n"
    "       SHARDS: (--shards-file F | --mds INDEX | --tars SPEC [SPEC...]) [--max-shards M]\n"
    "               (see permctl shards --help)\n"
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
    if ((rc = pd_gen_init(&gen, PD_ISA_AUTO))) /* the fastest kernel here: same ids as the core */
        return permctl_fail(rc, "perm");
    permctl_out_init(&out, stdout);
    while (count) {
        uint64_t c = count < PERMCTL_CHUNK ? count : PERMCTL_CHUNK;
        if ((rc = pd_gen_fill_u64(&gen, &p, start, c, ids)))
            return permctl_fail(rc, "perm");
        for (uint64_t i = 0; i < c; i++)
            permctl_out_u64(&out, ids[i]);
        start += c;
        count -= c;
        if (permctl_out_failed(&out))
            break;
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
    /* --world and --mode are parsed to say what they belong to: the daemon's form has ranks, this one does not. */
    int rc = permctl_parse(argc, argv, PERMCTL_KEY_OPTS | PERMCTL_BIT(WORLD) | PERMCTL_BIT(MODE), PERMCTL_KEY_OPTS,
                           permctl_inverse_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if (a.set & (PERMCTL_BIT(WORLD) | PERMCTL_BIT(MODE)))
        return permctl_usage_error("inverse --size N computes positions here, without ranks: drop --world and "
                                   "--mode, or give a dataset NAME instead of --size to ask permd");
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
    pd_gen gen;
    uint64_t left;
    int locations = (a->set & PERMCTL_BIT(LOCATIONS)) != 0;
    if (!start || !mem)
        rc = permctl_fail(PD_ENOMEM, "rank");
    else if ((rc = pd_gen_init(&gen, PD_ISA_AUTO))) /* π on the fastest kernel here: the core's plan */
        rc = permctl_fail(rc, "rank");
    else if (pd_shard_layout_build(sizes, nshards, start))
        rc = permctl_usage_error("rank: the shard sizes must sum to between 1 and 2^63 samples");
    else if ((rc = pd_gen_shard_plan_init(&gen, &plan, start, nshards, a->u[PERMCTL_OPT_SEED],
                                          a->u[PERMCTL_OPT_EPOCH],
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
        if (permctl_out_failed(&out))
            break;
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
    if ((rc = pd_gen_init(&gen, PD_ISA_AUTO))) /* the fastest kernel here: same ids as the core */
        return permctl_fail(rc, "rank");
    permctl_out_init(&out, stdout);
    while (count) {
        uint64_t c = count < PERMCTL_CHUNK ? count : PERMCTL_CHUNK, got;
        if ((rc = pd_gen_slice_fill_u64(&gen, &p, &s, c, ids, &got)))
            return permctl_fail(rc, "rank");
        for (uint64_t i = 0; i < got; i++)
            permctl_out_u64(&out, ids[i]);
        s.offset += got * s.world; /* the next chunk starts where this one ended */
        count -= got;
        if (permctl_out_failed(&out))
            break;
    }
    return permctl_out_flush(&out);
}

/* ---- permctl mix ----------------------------------------------------------------------------- */

static const char permctl_mix_usage[] =
    "usage: permctl mix --seed S --epoch E --sizes N0,N1,... --weights W0,W1,... [--stage G:W0,W1,...]...\n"
    "                   [--length L] [--block B] --world W --rank R --mode pad|drop|exact [--offset O]\n"
    "                   [--count C] [--locations]\n"
    "       permctl mix --seed S --sizes N0,N1,... --weights W0,W1,... [--stage ...]... [--length L]\n"
    "                   [--block B] --inverse J:LOCAL:CEPOCH...\n"
    "\n"
    "A mixture (docs/spec/mixtures-v1.md) of flat datasets of N0, N1, ... samples, drawn in\n"
    "proportion to integer weights; each --stage G:W0,W1,... re-weights from run position G\n"
    "on (G = epoch * L + offset, a multiple of B; 0 switches a component off). Prints the\n"
    "global ids rank R of W reads in mixture epoch E after O positions, one per line (a global\n"
    "id is the index into the datasets concatenated in order); --locations prints\n"
    "\"COMPONENT LOCAL COMPONENT_EPOCH\" instead. --inverse prints, for each component J's\n"
    "sample LOCAL of its epoch CEPOCH, the \"EPOCH POSITION\" that draws it, or '-' when the\n"
    "run never does. L (positions per mixture epoch) defaults to the sum of the sizes, B to 64.\n";


/* A list of u64 in [lo, hi] separated by sep into out (at most cap). */
int permctl_u64_list(const char *opt, const char *text, char sep, uint64_t lo, uint64_t hi, uint64_t *out,
                            size_t cap, size_t *n)
{
    char item[32];
    const char seps[2] = {sep, '\0'};
    *n = 0;
    for (const char *p = text;; p++) {
        size_t len = strcspn(p, seps);
        if (len == 0 || len >= sizeof item) /* an empty item ("1,1,") before the count: it is what is wrong */
            return permctl_usage_error("--%s: '%s' is not a list of unsigned integers", opt, text);
        if (*n == cap)
            return permctl_usage_error("--%s: more than %zu values", opt, cap);
        memcpy(item, p, len);
        item[len] = '\0';
        if (permctl_opt_u64(opt, item, lo, hi, &out[(*n)++]))
            return PERMCTL_EXIT_USAGE;
        p += len;
        if (!*p)
            return 0;
    }
}

/* One stage's weights: exactly ncomp of them, in [0, 2^32 − 1]. */
static int permctl_weights(const char *opt, const char *text, size_t ncomp, uint32_t *out)
{
    uint64_t *v = malloc(ncomp * sizeof *v);
    size_t n;
    if (!v)
        return permctl_fail(PD_ENOMEM, "mix");
    int rc = permctl_u64_list(opt, text, ',', 0, UINT32_MAX, v, ncomp, &n);
    if (!rc && n != ncomp)
        rc = permctl_usage_error("--%s: %zu weights for %zu components", opt, n, ncomp);
    for (size_t j = 0; !rc && j < ncomp; j++)
        out[j] = (uint32_t)v[j];
    free(v);
    return rc;
}

/* Take every --stage VALUE / --stage=VALUE out of argv (before any "--"); the rest goes to permctl_parse. */
int permctl_take_stages(int *argc, char **argv, const char **stages, int *nstages)
{
    int w = 1;
    *nstages = 0;
    for (int i = 1; i < *argc; i++) {
        const char *value = NULL;
        if (!strcmp(argv[i], "--")) {
            while (i < *argc)
                argv[w++] = argv[i++];
            break;
        }
        if (!strcmp(argv[i], "--stage")) {
            /* No stage starts with "--": "--stage --count 3" lacks its value, rather than being a stage named --count. */
            if (i + 1 == *argc || !strncmp(argv[i + 1], "--", 2))
                return permctl_usage_error("--stage needs a value (G:W0,W1,...)");
            value = argv[++i];
        } else if (!strncmp(argv[i], "--stage=", 8)) {
            value = argv[i] + 8;
        } else {
            argv[w++] = argv[i];
            continue;
        }
        if (*nstages == PERMCTL_MIX_STAGES)
            return permctl_usage_error("--stage: more than %d stages", PERMCTL_MIX_STAGES);
        stages[(*nstages)++] = value;
    }
    *argc = w;
    return 0;
}

int permctl_mix_stages(const permctl_args *a, const char **stage_text, int nstages, size_t ncomp, uint64_t **starts_out,
                       uint32_t **weights_out)
{
    int rc = 0;
    uint64_t *starts = malloc((size_t)(nstages + 1) * sizeof *starts);
    uint32_t *weights = malloc((size_t)(nstages + 1) * ncomp * sizeof *weights);
    if (!starts || !weights) {
        rc = permctl_fail(PD_ENOMEM, "mix");
        goto done;
    }
    starts[0] = 0;
    if ((rc = permctl_weights("weights", a->s[PERMCTL_OPT_WEIGHTS], ncomp, weights)))
        goto done;
    for (int k = 0; k < nstages; k++) {
        const char *colon = strchr(stage_text[k], ':');
        char at[32];
        size_t len = colon ? (size_t)(colon - stage_text[k]) : 0;
        if (!colon || len == 0 || len >= sizeof at) {
            rc = permctl_usage_error("--stage: '%s' is not G:W0,W1,...", stage_text[k]);
            goto done;
        }
        memcpy(at, stage_text[k], len);
        at[len] = '\0';
        if ((rc = permctl_opt_u64("stage", at, 1, PD_MIX_RUN_END - 1, &starts[k + 1])) ||
            (rc = permctl_weights("stage", colon + 1, ncomp, weights + (size_t)(k + 1) * ncomp)))
            goto done;
    }
done:
    if (rc) {
        free(starts);
        free(weights);
        starts = NULL;
        weights = NULL;
    }
    *starts_out = starts;
    *weights_out = weights;
    return rc;
}

/* The mixture the options describe; prints what is wrong and returns an exit code on failure. */
static int permctl_mix_build(const permctl_args *a, const char **stage_text, int nstages, permd_mixture **out)
{
    static uint64_t sizes[PD_MIX_COMPONENTS_MAX];
    size_t ncomp;
    uint64_t *starts;
    uint32_t *weights;
    int rc = permctl_u64_list("sizes", a->s[PERMCTL_OPT_SIZES], ',', 1, PD_N_MAX, sizes, PD_MIX_COMPONENTS_MAX, &ncomp);
    if (rc || (rc = permctl_mix_stages(a, stage_text, nstages, ncomp, &starts, &weights)))
        return rc;
    const uint64_t length = (a->set & PERMCTL_BIT(LENGTH)) ? a->u[PERMCTL_OPT_LENGTH] : 0;
    const uint64_t block = (a->set & PERMCTL_BIT(BLOCK)) ? a->u[PERMCTL_OPT_BLOCK] : 0;
    rc = permd_mixture_new(a->u[PERMCTL_OPT_SEED], sizes, (uint32_t)ncomp, length, (uint32_t)block, starts, weights,
                           (uint32_t)nstages + 1, out);
    if (rc == PD_EINVAL) { /* the core names the rule the definition breaks; the list is for one it does not */
        static pd_mix_component comps[PD_MIX_COMPONENTS_MAX];
        char why[256];
        for (size_t j = 0; j < ncomp; j++)
            comps[j] = (pd_mix_component){.size = sizes[j]};
        if (pd_mix_check(comps, ncomp, length, block ? block : PD_MIX_BLOCK_DEFAULT, starts, weights,
                         (uint64_t)nstages + 1, why, sizeof why))
            rc = permctl_usage_error("mix: not a valid mixture: %s", why);
        else
            rc = permctl_usage_error("mix: not a valid mixture: the sizes must sum to at most 2^63, each stage's "
                                     "weights to between 1 and 2^32 - 1, stages must increase and start at "
                                     "multiples of the block (a power of two from 64 to 2048)");
    } else if (rc)
        rc = permctl_fail(rc, "mix");
    free(starts);
    free(weights);
    return rc;
}

/* --inverse: each J:LOCAL:CEPOCH → "EPOCH POSITION" or "-". All are parsed before any is printed. */
static int permctl_mix_inverse(const permctl_args *a, permd_mixture *m)
{
    uint64_t *q = malloc((size_t)a->npos * 3 * sizeof *q);
    if (!q)
        return permctl_fail(PD_ENOMEM, "mix");
    for (int i = 0; i < a->npos; i++) {
        size_t n;
        int rc = permctl_u64_list("inverse", a->pos[i], ':', 0, UINT64_MAX, q + 3 * i, 3, &n);
        if (rc || n != 3) {
            free(q);
            return rc ? rc : permctl_usage_error("mix --inverse: '%s' is not J:LOCAL:CEPOCH", a->pos[i]);
        }
    }
    /* Answered, each in place of its question (found, epoch, position), before anything is printed. */
    for (int i = 0; i < a->npos; i++) {
        uint64_t epoch = 0, position = 0;
        int r = q[3 * i] > UINT32_MAX ? PD_ERANGE
                                      : permd_mixture_position(m, (uint32_t)q[3 * i], q[3 * i + 1], q[3 * i + 2],
                                                               &epoch, &position);
        if (r == PD_ERANGE) {
            int rc = permctl_usage_error("mix --inverse: '%s' names no sample (component below %u, local id below "
                                         "its size)", a->pos[i], permd_mixture_components(m));
            free(q);
            return rc;
        }
        if (r && r != PD_ENOTFOUND) {
            free(q);
            return permctl_fail(r, "mix --inverse");
        }
        q[3 * i] = r == 0;
        q[3 * i + 1] = epoch;
        q[3 * i + 2] = position;
    }
    static permctl_out out;
    permctl_out_init(&out, stdout);
    for (int i = 0; i < a->npos; i++) {
        if (!q[3 * i]) {
            permctl_out_str(&out, "-\n");
            continue;
        }
        permctl_out_u64_sep(&out, q[3 * i + 1], ' ');
        permctl_out_u64(&out, q[3 * i + 2]);
    }
    free(q);
    return permctl_out_flush(&out);
}

/* A rank's ids (or locations) of mixture epoch E, in chunks. */
static int permctl_mix_rank(const permctl_args *a, permd_mixture *m)
{
    const uint32_t world = (uint32_t)a->u[PERMCTL_OPT_WORLD], rank = (uint32_t)a->u[PERMCTL_OPT_RANK];
    const uint64_t epoch = a->u[PERMCTL_OPT_EPOCH];
    uint64_t offset = a->u[PERMCTL_OPT_OFFSET], left, len;
    if (rank >= world)
        return permctl_usage_error("--rank: %u must be below --world %u", rank, world);
    pd_epoch_length(permd_mixture_length(m), world, a->mode, &len);
    if (offset > len)
        return permctl_usage_error("--offset: %llu is past the end of the epoch (%llu positions in %s mode)",
                                   (unsigned long long)offset, (unsigned long long)len, pd_mode_name(a->mode));
    int rc = permd_rank_remaining(permd_mixture_length(m), world, rank, a->mode, offset, &left);
    if (rc)
        return permctl_fail(rc, "mix");
    uint64_t count = (a->set & PERMCTL_BIT(COUNT)) && a->u[PERMCTL_OPT_COUNT] < left ? a->u[PERMCTL_OPT_COUNT] : left;
    static uint64_t ids[PERMCTL_CHUNK], locals[PERMCTL_CHUNK], cepochs[PERMCTL_CHUNK];
    static uint32_t comps[PERMCTL_CHUNK];
    static permctl_out out;
    const int locations = (a->set & PERMCTL_BIT(LOCATIONS)) != 0;
    permctl_out_init(&out, stdout);
    for (uint64_t got; count; count -= got) {
        const uint64_t c = count < PERMCTL_CHUNK ? count : PERMCTL_CHUNK;
        rc = locations ? permd_mixture_rank_locations(m, epoch, world, rank, a->mode, offset, c, comps, locals,
                                                      cepochs, &got)
                       : permd_mixture_rank_fill(m, epoch, world, rank, a->mode, offset, c, ids, 8, &got);
        if (rc == PD_EINVAL)
            return permctl_usage_error("--epoch: mixture epoch %llu lies past run position 2^63",
                                       (unsigned long long)epoch);
        if (rc)
            return permctl_fail(rc, "mix");
        for (uint64_t i = 0; i < got; i++) {
            if (locations) {
                permctl_out_u64_sep(&out, comps[i], ' ');
                permctl_out_u64_sep(&out, locals[i], ' ');
                permctl_out_u64(&out, cepochs[i]);
            } else {
                permctl_out_u64(&out, ids[i]);
            }
        }
        offset += got * world; /* the next chunk starts where this one ended */
        if (permctl_out_failed(&out))
            break;
    }
    return permctl_out_flush(&out);
}

int permctl_cmd_mix(int argc, char **argv)
{
    const char *stages[PERMCTL_MIX_STAGES];
    int nstages;
    permctl_args a;
    permd_mixture *m = NULL;
    int rc = permctl_take_stages(&argc, argv, stages, &nstages);
    if (rc)
        return rc;
    const unsigned mixture = PERMCTL_BIT(SEED) | PERMCTL_BIT(SIZES) | PERMCTL_BIT(WEIGHTS);
    const unsigned rank_opts = PERMCTL_BIT(EPOCH) | PERMCTL_BIT(WORLD) | PERMCTL_BIT(RANK) | PERMCTL_BIT(MODE);
    const unsigned optional = PERMCTL_BIT(LENGTH) | PERMCTL_BIT(BLOCK) | PERMCTL_BIT(OFFSET) | PERMCTL_BIT(COUNT) |
                              PERMCTL_BIT(LOCATIONS) | PERMCTL_BIT(INVERSE);
    rc = permctl_parse(argc, argv, mixture | rank_opts | optional, mixture, permctl_mix_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    const int inverse = (a.set & PERMCTL_BIT(INVERSE)) != 0;
    const unsigned rank_only = rank_opts | PERMCTL_BIT(OFFSET) | PERMCTL_BIT(COUNT) | PERMCTL_BIT(LOCATIONS);
    if (inverse && (a.set & rank_only))
        return permctl_usage_error("mix --inverse takes no --epoch, --world, --rank, --mode, --offset, --count or "
                                   "--locations");
    if (inverse && !a.npos)
        return permctl_usage_error("mix --inverse: give at least one J:LOCAL:CEPOCH");
    if (!inverse && a.npos)
        return permctl_usage_error("mix: unexpected argument '%s'", a.pos[0]);
    if (!inverse && (a.set & rank_opts) != rank_opts)
        return permctl_usage_error("mix: --epoch, --world, --rank and --mode are required (see permctl mix --help)");
    if ((rc = permctl_mix_build(&a, stages, nstages, &m)))
        return rc;
    rc = inverse ? permctl_mix_inverse(&a, m) : permctl_mix_rank(&a, m);
    permd_mixture_free(m);
    return rc;
}
