/* Brace expansion with braceexpand's rules (what WebDataset applies to shard URLs): parse, count, then build. */
#include "braces.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* A list of expanded strings (backslash escapes still in them until the very end). */
typedef struct br_list {
    char **v;
    size_t n, cap;
    uint64_t bytes; /* the counting pass: its strings' lengths added up (saturating) */
} br_list;

typedef struct br_ctx {
    uint64_t max, bytes_max;
    char *err;
    size_t errlen;
    const char *pattern; /* the whole pattern, for messages */
    int dry;             /* the counting pass: lists keep only their length n */
} br_ctx;

static void br_list_free(br_list *l)
{
    for (size_t i = 0; l->v && i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
    l->bytes = 0;
}

static uint64_t br_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t br_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* Append the string s[0..len) + t[0..tlen) (t may be NULL); only count it in the dry pass. */
static int br_list_push(const br_ctx *c, br_list *l, const char *s, size_t len, const char *t, size_t tlen)
{
    if (c->dry) {
        l->n++;
        l->bytes = br_add(l->bytes, (uint64_t)len + tlen);
        return 0;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return PD_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    char *p = malloc(len + tlen + 1);
    if (!p)
        return PD_ENOMEM;
    memcpy(p, s, len);
    if (tlen)
        memcpy(p + len, t, tlen);
    p[len + tlen] = '\0';
    l->v[l->n++] = p;
    return 0;
}

/* A pattern (or part) as messages quote it: its first BR_QUOTE_MAX bytes, then "…", so that the reason after it
 * fits the caller's buffer. For "%.*s%s". */
#define BR_QUOTE_MAX 160
#define BR_QUOTE(s, len) (int)((len) > BR_QUOTE_MAX ? BR_QUOTE_MAX : (len)), (s), (len) > BR_QUOTE_MAX ? "…" : ""

static int br_too_many(br_ctx *c)
{
    snprintf(c->err, c->errlen, "'%.*s%s' expands to more than %" PRIu64 " names",
             BR_QUOTE(c->pattern, strlen(c->pattern)), c->max);
    return PD_ETOOBIG;
}

static int br_too_long(br_ctx *c)
{
    snprintf(c->err, c->errlen, "'%.*s%s' expands to names of more than %" PRIu64 " bytes in all",
             BR_QUOTE(c->pattern, strlen(c->pattern)), c->bytes_max);
    return PD_ETOOBIG;
}

static int br_pattern(br_ctx *c, const char *s, size_t len, int depth, br_list *out);

/* Items of a product: each a list; the product takes one string of each, the first varying slowest. */
typedef struct br_items {
    br_list *v;
    size_t n, cap;
} br_items;

static void br_items_free(br_items *it)
{
    for (size_t i = 0; i < it->n; i++)
        br_list_free(&it->v[i]);
    free(it->v);
}

/* A new empty item at the end of it (NULL when out of memory). */
static br_list *br_items_add(br_items *it)
{
    if (it->n == it->cap) {
        size_t cap = it->cap ? it->cap * 2 : 4;
        br_list *v = realloc(it->v, cap * sizeof *v);
        if (!v)
            return NULL;
        it->v = v;
        it->cap = cap;
    }
    br_list *l = &it->v[it->n++];
    memset(l, 0, sizeof *l);
    return l;
}

static int br_literal(const br_ctx *c, br_items *it, const char *s, size_t len)
{
    br_list *l = br_items_add(it);
    return l ? br_list_push(c, l, s, len, NULL, 0) : PD_ENOMEM;
}

/* Parse an optionally negative ASCII integer s[0..len) into *v; 1 when it is one, 0 when not;
 * PD_ETOOBIG when it is one that does not fit 64 bits. */
static int br_int(const char *s, size_t len, int64_t *v)
{
    const size_t first = len > 0 && s[0] == '-';
    int neg = (int)first;
    if (first == len)
        return 0;
    for (size_t i = first; i < len; i++) /* digits first: "99999999999999999999x" is no integer, not a big one */
        if (s[i] < '0' || s[i] > '9')
            return 0;
    uint64_t x = 0;
    for (size_t i = first; i < len; i++) {
        if (x > (UINT64_C(1) << 62) / 5) /* x * 10 would pass 2^63 */
            return PD_ETOOBIG;
        x = x * 10 + (uint64_t)(s[i] - '0');
    }
    if (x > (uint64_t)INT64_MAX)
        return PD_ETOOBIG;
    *v = neg ? -(int64_t)x : (int64_t)x;
    return 1;
}

/* Split "L..R" or "L..R..S" (S optionally negative, its sign ignored); 1 on that shape, else 0. */
static int br_range_parts(const char *s, size_t len, size_t *l_end, size_t *r_start, size_t *r_end,
                          size_t *step_start)
{
    const char *d = len >= 2 ? memchr(s + 1, '.', len - 1) : NULL; /* a leading '-' is never the dot */
    if (!d || (size_t)(d - s) + 1 >= len || d[1] != '.')
        return 0;
    *l_end = (size_t)(d - s);
    *r_start = *l_end + 2;
    const char *d2 = *r_start + 1 < len ? memchr(s + *r_start + 1, '.', len - *r_start - 1) : NULL;
    if (!d2) {
        *r_end = len;
        *step_start = len;
        return 1;
    }
    if ((size_t)(d2 - s) + 1 >= len || d2[1] != '.')
        return 0;
    *r_end = (size_t)(d2 - s);
    *step_start = *r_end + 2 + (*r_end + 2 < len && s[*r_end + 2] == '-');
    return *step_start < len;
}

/* The step S: ASCII digits only; 0 means 1; saturates (a huge step yields one element). */
static int br_step(const char *s, size_t len, uint64_t *step)
{
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        x = x > UINT64_MAX / 10 - 1 ? UINT64_MAX : x * 10 + (uint64_t)(s[i] - '0');
    }
    *step = x ? x : 1;
    return 1;
}

static const char br_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/* {M..N..S} or {a..e..S}: 1 and the range in *out; 0 when expr is not a range; or an error. */
static int br_range(br_ctx *c, const char *s, size_t len, br_list *out)
{
    size_t le, rs, re, ss;
    uint64_t step = 1;
    if (!br_range_parts(s, len, &le, &rs, &re, &ss) || (ss < len && !br_step(s + ss, len - ss, &step)))
        return 0;
    int64_t a = 0, b = 0;
    int chars = 0;
    size_t width = 0;
    int ra = br_int(s, le, &a), rb = br_int(s + rs, re - rs, &b);
    if (ra < 0 || rb < 0) {
        if (ra == 0 || rb == 0)
            return 0; /* not two integers: not a range (the too-big one would not matter) */
        snprintf(c->err, c->errlen, "'%.*s%s': the range {%.*s%s} is too large",
                 BR_QUOTE(c->pattern, strlen(c->pattern)), BR_QUOTE(s, len));
        return PD_ETOOBIG;
    }
    if (ra == 1 && rb == 1) {
        /* braceexpand pads when either end other than "0" / "-0" starts with 0 or -0 */
        const char *ends[2] = {s, s + rs};
        size_t lens[2] = {le, re - rs};
        for (int i = 0; i < 2; i++) {
            const char *e = ends[i] + (ends[i][0] == '-');
            size_t digits = lens[i] - (size_t)(ends[i][0] == '-');
            if (e[0] == '0' && digits > 1)
                width = le > re - rs ? le : re - rs;
        }
    } else {
        const char *pa = le == 1 ? strchr(br_alphabet, s[0]) : NULL;
        const char *pb = re - rs == 1 ? strchr(br_alphabet, s[rs]) : NULL;
        if (!pa || !pb || !s[0] || !s[rs])
            return 0;
        a = pa - br_alphabet;
        b = pb - br_alphabet;
        chars = 1;
    }
    uint64_t span = a <= b ? (uint64_t)b - (uint64_t)a : (uint64_t)a - (uint64_t)b;
    uint64_t count = span / step + 1;
    if (count > c->max)
        return br_too_many(c);
    if (c->dry) { /* no name is longer than the longer end's, or the width */
        uint64_t longest = chars ? 1 : width;
        for (int i = 0; !chars && i < 2; i++) {
            int n = snprintf(NULL, 0, "%" PRId64, i ? b : a);
            longest = (uint64_t)n > longest ? (uint64_t)n : longest;
        }
        out->n = (size_t)count;
        out->bytes = br_mul(count, longest);
        return 1;
    }
    /* The counting pass bounded the names' bytes (bytes_max < INT_MAX): the width fits an int. */
    char *buf = malloc(width + 24);
    if (!buf)
        return PD_ENOMEM;
    int rc = 0;
    for (uint64_t i = 0; !rc && i < count; i++) {
        uint64_t delta = i * step; /* ≤ span: no overflow */
        int64_t v = a <= b ? (int64_t)((uint64_t)a + delta) : (int64_t)((uint64_t)a - delta);
        int n = chars ? snprintf(buf, width + 24, "%c", br_alphabet[v])
                      : snprintf(buf, width + 24, "%0*" PRId64, (int)width, v);
        rc = br_list_push(c, out, buf, (size_t)n, NULL, 0);
    }
    free(buf);
    return rc ? rc : 1;
}

/* Expand one alternative s[0..len) of a sequence onto the end of out. */
static int br_alternative(br_ctx *c, const char *s, size_t len, int depth, br_list *out)
{
    br_list alt = {0};
    int rc = br_pattern(c, s, len, depth, &alt);
    if (!rc && out->n + alt.n > c->max)
        rc = br_too_many(c);
    if (!rc && c->dry) {
        out->n += alt.n;
        out->bytes = br_add(out->bytes, alt.bytes);
    }
    for (size_t i = 0; !rc && !c->dry && i < alt.n; i++) { /* move the strings over */
        rc = br_list_push(c, out, "", 0, NULL, 0);
        if (!rc) {
            free(out->v[out->n - 1]);
            out->v[out->n - 1] = alt.v[i];
            alt.v[i] = NULL;
        }
    }
    br_list_free(&alt);
    return rc;
}

/* {a,b,...}: 1 and the alternatives chained in *out; 0 when there is no comma at depth 0. */
static int br_sequence(br_ctx *c, const char *s, size_t len, int depth, br_list *out)
{
    size_t start = 0;
    int level = 0, alts = 0, rc = 0;
    for (size_t pos = 0; !rc && pos < len; pos++) {
        if (s[pos] == '\\')
            pos++;
        else if (s[pos] == '{')
            level++;
        else if (s[pos] == '}')
            level--;
        else if (s[pos] == ',' && level == 0) {
            rc = br_alternative(c, s + start, pos - start, depth, out);
            start = pos + 1;
            alts++;
        }
    }
    if (!rc && alts) /* the part after the last comma, maybe empty */
        rc = br_alternative(c, s + start, len - start, depth, out);
    return rc ? rc : alts > 0;
}

/* The product of the items into *out (its count and bytes alone in the dry pass). */
static int br_product(br_ctx *c, br_items *it, br_list *out)
{
    uint64_t total = 1;
    for (size_t i = 0; i < it->n; i++) {
        if (it->v[i].n && total > c->max / it->v[i].n)
            return br_too_many(c);
        total *= it->v[i].n;
    }
    if (total > c->max)
        return br_too_many(c);
    if (c->dry) {
        uint64_t bytes = 0; /* each of item i's strings is in total / n_i names */
        for (size_t i = 0; total && i < it->n; i++)
            bytes = br_add(bytes, br_mul(it->v[i].bytes, total / it->v[i].n));
        if (bytes > c->bytes_max)
            return br_too_long(c);
        out->n = (size_t)total;
        out->bytes = bytes;
        return 0;
    }
    br_list cur = {0}, next = {0};
    int rc = br_list_push(c, &cur, "", 0, NULL, 0);
    for (size_t i = 0; !rc && i < it->n; i++) {
        for (size_t a = 0; !rc && a < cur.n; a++)
            for (size_t b = 0; !rc && b < it->v[i].n; b++)
                rc = br_list_push(c, &next, cur.v[a], strlen(cur.v[a]), it->v[i].v[b], strlen(it->v[i].v[b]));
        br_list_free(&cur);
        cur = next;
        memset(&next, 0, sizeof next);
    }
    if (rc) {
        br_list_free(&cur);
        return rc;
    }
    *out = cur;
    return 0;
}

/* A pattern's items: literal runs and {expressions}, each expanded (their product is the pattern's names). */
static int br_parse(br_ctx *c, const char *s, size_t len, int depth, br_items *out)
{
    if (depth > PD_BRACES_DEPTH_MAX) {
        snprintf(c->err, c->errlen, "'%.*s%s': braces nested deeper than %d", BR_QUOTE(c->pattern, strlen(c->pattern)),
                 PD_BRACES_DEPTH_MAX);
        return PD_EINVAL;
    }
    br_items it = {0};
    size_t start = 0, pos = 0;
    int level = 0, rc = 0;
    for (; !rc && pos < len; pos++) {
        if (s[pos] == '\\') {
            pos++; /* may step past the end, as braceexpand's pos += 2 does */
            continue;
        }
        if (s[pos] == '{') {
            if (level == 0 && pos > start)
                rc = br_literal(c, &it, s + start, pos - start);
            if (level == 0)
                start = pos;
            level++;
        } else if (s[pos] == '}' && --level == 0) {
            const char *e = s + start + 1;
            size_t elen = pos - start - 1;
            br_list *item = br_items_add(&it);
            if (!item) {
                rc = PD_ENOMEM;
                break;
            }
            int got = br_range(c, e, elen, item);
            if (got == 0)
                got = br_sequence(c, e, elen, depth + 1, item);
            if (got == 0) { /* not an expression: '{', the inside expanded, '}' */
                it.n--;
                rc = br_literal(c, &it, "{", 1);
                br_list *inner = rc ? NULL : br_items_add(&it);
                rc = rc ? rc : !inner ? PD_ENOMEM : br_pattern(c, e, elen, depth + 1, inner);
                rc = rc ? rc : br_literal(c, &it, "}", 1);
            } else if (got < 0) {
                rc = got;
            }
            start = pos + 1;
        }
    }
    if (!rc && level != 0) {
        snprintf(c->err, c->errlen, "unbalanced braces in '%.*s%s'", BR_QUOTE(c->pattern, strlen(c->pattern)));
        rc = PD_EINVAL;
    }
    if (!rc && start < len)
        rc = br_literal(c, &it, s + start, len - start);
    if (rc)
        br_items_free(&it);
    else
        *out = it;
    return rc;
}

/* A pattern: its items' product. */
static int br_pattern(br_ctx *c, const char *s, size_t len, int depth, br_list *out)
{
    br_items it = {0};
    int rc = br_parse(c, s, len, depth, &it);
    if (!rc)
        rc = br_product(c, &it, out);
    br_items_free(&it);
    return rc;
}

/* braceexpand's final pass: "\c" becomes "c" for any c but a newline. */
static void br_unescape(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] && r[1] != '\n')
            r++;
        *w++ = *r;
    }
    *w = '\0';
}

/* The product of the top-level items, one name at a time (an odometer, the last item varying fastest): only
 * the items are held, never all the names (a prefix of 2 KB before {0..999999} would be 2 GB of them). */
static int br_emit(const br_items *it, pd_braces_fn emit, void *ctx)
{
    size_t longest = 1; /* the names' longest: each item's longest string, added up */
    for (size_t i = 0; i < it->n; i++) {
        size_t item = 0;
        for (size_t k = 0; k < it->v[i].n; k++) {
            size_t len = strlen(it->v[i].v[k]);
            item = len > item ? len : item;
        }
        longest += item;
    }
    char *name = malloc(longest);
    size_t *at = calloc(it->n + 1, sizeof *at); /* each item's current string */
    int rc = name && at ? 0 : PD_ENOMEM;
    for (int more = 1; !rc && more;) {
        char *p = name;
        for (size_t i = 0; i < it->n; i++) {
            size_t len = strlen(it->v[i].v[at[i]]);
            memcpy(p, it->v[i].v[at[i]], len);
            p += len;
        }
        *p = '\0';
        br_unescape(name);
        rc = emit(ctx, name);
        more = 0;
        for (size_t i = it->n; !more && i-- > 0;) {
            more = ++at[i] < it->v[i].n;
            if (!more)
                at[i] = 0;
        }
    }
    free(at);
    free(name);
    return rc;
}

int pd_braces_expand(const char *pattern, uint64_t max, pd_braces_fn emit, void *ctx, char *err, size_t errlen)
{
    br_ctx c = {.max = max, .bytes_max = PD_BRACES_BYTES_MAX, .err = err, .errlen = errlen, .pattern = pattern,
                .dry = 1};
    br_list counted = {0};
    br_items items = {0};
    if (errlen)
        err[0] = '\0';
    int rc = br_pattern(&c, pattern, strlen(pattern), 0, &counted); /* count first: nothing is built past a bound */
    if (!rc) {
        c.dry = 0;
        rc = br_parse(&c, pattern, strlen(pattern), 0, &items);
    }
    if (!rc)
        rc = br_emit(&items, emit, ctx);
    if (rc == PD_ENOMEM && errlen && !err[0])
        snprintf(err, errlen, "'%.*s%s': out of memory expanding it", BR_QUOTE(pattern, strlen(pattern)));
    br_items_free(&items);
    return rc;
}

int pd_braces_count(const char *pattern, uint64_t *count)
{
    br_ctx c = {.max = UINT64_MAX, .bytes_max = UINT64_MAX, .pattern = pattern, .dry = 1};
    br_list counted = {0};
    int rc = br_pattern(&c, pattern, strlen(pattern), 0, &counted);
    *count = rc ? 0 : counted.n;
    return rc;
}
