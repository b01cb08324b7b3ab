/* permctl mixtures: put, get, list and rm mixtures of registered datasets on permd (fetch and stream take their names). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/permctl.h"
#include "client/permd.h"
#include "core/error.h"

static const char permctl_mixtures_usage[] =
    "usage: permctl mixtures put NAME --components A,B,... --weights W0,W1,... [--stage G:W0,W1,...]...\n"
    "                            [--length L] [--block B] [--json]\n"
    "       permctl mixtures get NAME [--json]\n"
    "       permctl mixtures list [--json]\n"
    "       permctl mixtures rm NAME\n"
    "       (and --socket PATH | --tcp HOST:PORT [--token-file F], --timeout-ms MS)\n"
    "\n"
    "A mixture draws from registered datasets (its components) in proportion to integer weights;\n"
    "each --stage G:W0,W1,... re-weights from run position G (a multiple of the block, 64 by\n"
    "default). Putting the same definition again confirms it; putting it with stages appended\n"
    "after the last re-weights it from there on (docs/mixtures.md). fetch, stream, verify and\n"
    "inverse take a mixture's NAME like a dataset's: its epoch is the mixture epoch, its ids are\n"
    "global (a component's local id plus the sizes of the components before it).\n";

static void permctl_mixture_print(const permd_mixture_def *d, int json)
{
    if (json) {
        fputs("{\"name\":", stdout);
        permctl_json_string(stdout, d->name);
        fputs(",\"components\":[", stdout);
        for (uint32_t j = 0; j < d->ncomponents; j++) {
            fputs(j ? "," : "", stdout);
            permctl_json_string(stdout, d->components[j]);
        }
        fputs("],\"component_sizes\":[", stdout);
        for (uint32_t j = 0; j < d->ncomponents; j++)
            printf("%s%llu", j ? "," : "", (unsigned long long)d->component_sizes[j]);
        fputs("],\"stages\":[", stdout);
        for (uint32_t k = 0; k < d->nstages; k++) {
            printf("%s{\"start\":%llu,\"weights\":[", k ? "," : "", (unsigned long long)d->stage_starts[k]);
            for (uint32_t j = 0; j < d->ncomponents; j++)
                printf("%s%u", j ? "," : "", d->weights[(size_t)k * d->ncomponents + j]);
            fputs("]}", stdout);
        }
        printf("],\"length\":%llu,\"block\":%u,\"size\":%llu,\"id_width\":%u,\"created_unix_ms\":%lld}",
               (unsigned long long)d->length, d->block, (unsigned long long)d->size, d->id_width,
               (long long)d->created_unix_ms);
        return;
    }
    printf("%s: %u components, length %llu, block %u, size %llu\n", d->name, d->ncomponents,
           (unsigned long long)d->length, d->block, (unsigned long long)d->size);
    for (uint32_t j = 0; j < d->ncomponents; j++)
        printf("  component %u: %s (size %llu)\n", j, d->components[j], (unsigned long long)d->component_sizes[j]);
    for (uint32_t k = 0; k < d->nstages; k++) {
        printf("  stage from %llu: weights", (unsigned long long)d->stage_starts[k]);
        for (uint32_t j = 0; j < d->ncomponents; j++)
            printf(" %u", d->weights[(size_t)k * d->ncomponents + j]);
        putchar('\n');
    }
}

/* --components A,B,...: names into a NULL-terminated array pointing into a copy of the text. */
static int permctl_components(const char *text, char **copy, const char ***names, uint32_t *n)
{
    *copy = strdup(text);
    size_t cap = 1;
    for (const char *p = text; *p; p++)
        cap += *p == ',';
    *names = calloc(cap + 1, sizeof **names);
    if (!*copy || !*names)
        return permctl_fail(PD_ENOMEM, "mixtures put");
    *n = 0;
    for (char *tok = strtok(*copy, ","); tok; tok = strtok(NULL, ","))
        (*names)[(*n)++] = tok;
    if (*n == 0 || *n != cap)
        return permctl_usage_error("mixtures put: --components must be NAME0,NAME1,... with no empty name");
    for (uint32_t j = 0; j < *n; j++) { /* a name permd would refuse is the command line's fault */
        int rc = permctl_name("mixtures put: --components", (*names)[j]);
        if (rc)
            return rc;
    }
    return 0;
}

int permctl_cmd_mixtures(int argc, char **argv)
{
    const char *stage_text[PERMCTL_MIX_STAGES];
    int nstages = 0;
    permctl_args a;
    permd_client *c;
    int rc = permctl_take_stages(&argc, argv, stage_text, &nstages);
    if (rc)
        return rc;
    rc = permctl_parse(argc, argv,
                       PERMCTL_CONN_OPTS | PERMCTL_BIT(JSON) | PERMCTL_BIT(COMPONENTS) | PERMCTL_BIT(WEIGHTS) |
                           PERMCTL_BIT(LENGTH) | PERMCTL_BIT(BLOCK),
                       0, permctl_mixtures_usage, &a);
    if (rc)
        return rc < 0 ? PERMCTL_EXIT_OK : rc;
    if (a.npos < 1)
        return permctl_usage_error("mixtures: give an action: put, list, get or rm (see permctl mixtures --help)");
    const char *action = a.pos[0];
    int json = (a.set & PERMCTL_BIT(JSON)) != 0;
    int is_put = !strcmp(action, "put"), is_list = !strcmp(action, "list");
    int is_get = !strcmp(action, "get"), is_rm = !strcmp(action, "rm");
    const unsigned def_opts = PERMCTL_BIT(COMPONENTS) | PERMCTL_BIT(WEIGHTS) | PERMCTL_BIT(LENGTH) | PERMCTL_BIT(BLOCK);
    if (!is_put && !is_list && !is_get && !is_rm)
        return permctl_usage_error("mixtures: unknown action '%s' (put, list, get or rm)", action);
    if (is_list ? a.npos != 1 : a.npos != 2)
        return is_list ? permctl_usage_error("mixtures list: unexpected argument '%s'", a.pos[1])
                       : permctl_usage_error("mixtures %s: give one NAME", action);
    if (!is_list && (rc = permctl_name("mixtures", a.pos[1])))
        return rc;
    if (!is_put && ((a.set & def_opts) || nstages))
        return permctl_usage_error("mixtures %s: the definition's options apply to put only", action);
    if (is_put && !((a.set & PERMCTL_BIT(COMPONENTS)) && (a.set & PERMCTL_BIT(WEIGHTS))))
        return permctl_usage_error("mixtures put: give --components and --weights");
    if (is_rm && json)
        return permctl_usage_error("mixtures rm: --json does not apply");

    char *copy = NULL;
    const char **names = NULL;
    uint64_t *starts = NULL;
    uint32_t *weights = NULL, ncomp = 0;
    if (is_put && ((rc = permctl_components(a.s[PERMCTL_OPT_COMPONENTS], &copy, &names, &ncomp)) ||
                   (rc = permctl_mix_stages(&a, stage_text, nstages, ncomp, &starts, &weights))))
        goto done;
    if ((rc = permctl_connect(&a, &c)))
        goto done;
    permd_mixture_def *d = NULL;
    if (is_put) {
        int32_t created;
        if (permd_put_mixture(c, a.pos[1], names, ncomp, starts, weights, (uint32_t)nstages + 1,
                              (a.set & PERMCTL_BIT(LENGTH)) ? a.u[PERMCTL_OPT_LENGTH] : 0,
                              (a.set & PERMCTL_BIT(BLOCK)) ? (uint32_t)a.u[PERMCTL_OPT_BLOCK] : 0, &d, &created)) {
            rc = permctl_call_failed(c, "mixtures put");
            goto done;
        }
        const char *said = created == 1 ? "created" : created == 2 ? "updated" : "exists";
        if (json)
            fputs("{\"mixture\":", stdout);
        else
            printf("%s ", said);
        permctl_mixture_print(d, json);
        if (json) /* as datasets put --json says "created" */
            printf(",\"created\":%s,\"result\":\"%s\"}\n", created == 1 ? "true" : "false", said);
    } else if (is_get) {
        if ((rc = permd_get_mixture(c, a.pos[1], &d))) {
            rc = permctl_name_failed(c, "mixtures get", rc, a.pos[1], 1);
            goto done;
        }
        permctl_mixture_print(d, json);
        if (json)
            fputc('\n', stdout);
    } else if (is_rm) {
        if ((rc = permd_delete_mixture(c, a.pos[1]))) {
            rc = permctl_name_failed(c, "mixtures rm", rc, a.pos[1], 1);
            goto done;
        }
        printf("deleted %s\n", a.pos[1]);
    } else {
        char(*all)[PERMD_NAME_MAX + 1] = NULL;
        size_t total = 0, cap = 0;
        do { /* grow until every name fits */
            cap = total > cap ? total : cap + 64;
            char(*p)[PERMD_NAME_MAX + 1] = realloc(all, cap * sizeof *all);
            if (!p) {
                free(all);
                permd_close(c);
                rc = permctl_fail(PD_ENOMEM, "mixtures list");
                goto done;
            }
            all = p;
            if (permd_list_mixtures(c, all, cap, &total)) {
                free(all);
                rc = permctl_call_failed(c, "mixtures list");
                goto done;
            }
        } while (total > cap);
        if (json)
            fputs("{\"mixtures\":[", stdout);
        for (size_t i = 0; i < total; i++) {
            if (json) {
                fputs(i ? "," : "", stdout);
                permctl_json_string(stdout, all[i]);
            } else {
                puts(all[i]);
            }
        }
        if (json)
            fputs("]}\n", stdout);
        free(all);
    }
    permd_mixture_def_free(d);
    permd_close(c);
    rc = permctl_stdout_done();
done:
    free(copy);
    free(names);
    free(starts);
    free(weights);
    return rc;
}
