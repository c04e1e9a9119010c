/*
 * cli_ckpt.c - checkpoints: `engram inspect` and `engram import --layers`.
 *
 * inspect lists the tensors of a safetensors file or of a sharded
 * checkpoint's index (name, dtype, shape, shard), from the headers the
 * library has checked (engram_safetensors_list).
 *
 * import --layers turns a DeepSeek-style checkpoint into the tables the
 * layer API reads.  Each Engram layer L of such a checkpoint is a weight
 * tensor [N, C] (e.g. [N, 256] F8_E4M3) and a scale tensor [N, D] (e.g.
 * [N, 8] F8_E8M0) whose N rows are the heads' vocabularies one after the
 * other: head h owns rows [p_h, p_h + n_h), p_h the sum of the sizes of
 * the heads before it.  The sizes are not in the tensors, so the user
 * gives them (--head-vocab).  The tensors of every layer are found through
 * the checkpoint's index by a name pattern with {L} for the layer number;
 * head h of layer L becomes table engram:l{L}:h{h} of n_h rows, weight row
 * then scale row (264 bytes for the example), recording its range [p_h,
 * p_h + n_h) of the N rows (engram_writer_set_range).  Everything is
 * checked before the first table is written (tensors, shapes, sizes,
 * names free); each table is verified after it is written; a failure
 * removes the tables this run published.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engram.h"
#include "cli.h"

#define LAYER_PLACEHOLDER "{L}"
#define DEFAULT_WEIGHT "model.layers.{L}.engram.weight"
#define DEFAULT_SCALE "model.layers.{L}.engram.scale"
#define HEADS_MAX 4096
#define LAYER_NAME_MAX (ENGRAM_NAME_MAX + 1)

/* ------------------------------------------------------------------------
 * Shapes.
 */

/* Formats a tensor's shape and dtype: "[36, 256] F8_E4M3". */
const char *cli_fmt_shape(const engram_tensor_info *ti, char *buf, size_t len)
{
    size_t o = 0;
    int n = snprintf(buf, len, "[");
    for (uint32_t d = 0; n >= 0 && d < ti->ndim && d < ENGRAM_TENSOR_MAX_DIMS; d++) {
        o += (size_t)n;
        if (o >= len)
            return buf;
        n = snprintf(buf + o, len - o, "%s%" PRIu64, d ? ", " : "", ti->shape[d]);
    }
    if (n >= 0 && (o += (size_t)n) < len)
        snprintf(buf + o, len - o, "] %s", ti->dtype);
    return buf;
}

/* Checks that tensor `tn` (described by *ti) can give rows: 2-D [N, C]
 * with N >= 1 and C * elem_size at most ENGRAM_ROW_BYTES_MAX, and, with a
 * reference tensor (the weight, for a scale), the reference's N.  Stores
 * the bytes of one row in *row_bytes.  0, or an exit status after a
 * message that shows the shape found. */
int cli_check_rows_tensor(const char *name, const char *tn, const engram_tensor_info *ti,
                          const char *ref_tn, const engram_tensor_info *ref, uint64_t *row_bytes)
{
    char shape[256], rshape[256];
    uint64_t rb = 0;

    if (ti->ndim != 2 || ti->shape[0] == 0 || ti->shape[1] == 0 ||
        __builtin_mul_overflow(ti->shape[1], ti->elem_size, &rb) || rb > ENGRAM_ROW_BYTES_MAX)
        return cli_fail("import '%s': tensor '%s' has shape %s; expected [N, C] with N >= 1 and "
                        "rows of at most %u bytes",
                        name, tn, cli_fmt_shape(ti, shape, sizeof shape), ENGRAM_ROW_BYTES_MAX);
    if (ref && ti->shape[0] != ref->shape[0])
        return cli_fail("import '%s': tensor '%s' has shape %s, but '%s' has shape %s: their "
                        "first dimensions (rows) must be equal",
                        name, tn, cli_fmt_shape(ti, shape, sizeof shape), ref_tn,
                        cli_fmt_shape(ref, rshape, sizeof rshape));
    *row_bytes = rb;
    return 0;
}

/* ------------------------------------------------------------------------
 * The tensors of a checkpoint, and names close to a mistyped one.
 */
struct tensor {
    char *name;
    engram_tensor_info info;
};

struct tensors {
    struct tensor *v;
    size_t n, cap;
};

static int tensors_add(void *ud, const char *name, const engram_tensor_info *info)
{
    struct tensors *l = ud;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        struct tensor *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n].name = strdup(name)))
        return -ENOMEM;
    l->v[l->n].info = *info;
    l->n++;
    return 0;
}

static void tensors_free(struct tensors *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].name);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

static int cmp_tensor(const void *x, const void *y)
{
    const struct tensor *a = x, *b = y;
    /* layers.2 before layers.10 (cli_natural_cmp() is a total order). */
    return cli_natural_cmp(a->name, b->name);
}

/* Reads the tensor list of checkpoint `path`, sorted naturally.  0, or an
 * exit status after reporting. */
static int tensors_read(const char *what, const char *path, struct tensors *l)
{
    int rc = engram_safetensors_list(path, tensors_add, l);
    if (rc == -ENOMEM)
        return cli_fail("%s: out of memory listing the tensors of '%s'", what, path);
    if (rc != 0)
        return cli_lib_fail(rc, "%s: '%s'", what, path);
    qsort(l->v, l->n, sizeof *l->v, cmp_tensor);
    return 0;
}

static const struct tensor *tensors_find(const struct tensors *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0)
            return &l->v[i];
    return NULL;
}

/* Whether distance d between `want` and a candidate is small enough to be
 * a typo: a quarter of the name, at least 2 edits. */
static int close_enough(const char *want, size_t d)
{
    size_t len = strlen(want);
    return d <= (len / 4 > 2 ? len / 4 : 2);
}

/* " (did you mean 'x'?)" for the tensor name closest to `want`, or "". */
static const char *suggest_name(const struct tensors *l, const char *want, char *buf, size_t cap)
{
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i < l->n; i++) {
        size_t d = cli_edit_distance(want, l->v[i].name);
        if (d < best) {
            best = d;
            at = i;
        }
    }
    if (best == SIZE_MAX || !close_enough(want, best))
        return "";
    snprintf(buf, cap, " (did you mean '%s'?)", l->v[at].name);
    return buf;
}

/* ------------------------------------------------------------------------
 * inspect
 */
int cli_cmd_inspect(struct cli *cli)
{
    const char *path = cli->args[0];
    struct tensors l = {NULL, 0, 0};
    size_t width = 4, swidth = 5;
    char shape[256];
    int status;

    if ((status = tensors_read("inspect", path, &l)) != 0)
        return status;
    if (cli->opt[OPT_JSON]) {
        putchar('[');
        for (size_t i = 0; i < l.n; i++) {
            const engram_tensor_info *ti = &l.v[i].info;
            printf("%s\n  {\"name\": ", i ? "," : "");
            cli_json_str(stdout, l.v[i].name);
            printf(", \"dtype\": ");
            cli_json_str(stdout, ti->dtype);
            printf(", \"shape\": [");
            for (uint32_t d = 0; d < ti->ndim; d++)
                printf("%s%" PRIu64, d ? ", " : "", ti->shape[d]);
            printf("], \"nbytes\": %" PRIu64 ", \"shard\": ", ti->nbytes);
            cli_json_str(stdout, ti->shard);
            putchar('}');
        }
        puts(l.n ? "\n]" : "]");
        tensors_free(&l);
        return 0;
    }
    for (size_t i = 0; i < l.n; i++) {
        size_t sl;
        /* Names come from the checkpoint: no control bytes to the
         * terminal. */
        for (char *c = l.v[i].name; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
        if (strlen(l.v[i].name) > width)
            width = strlen(l.v[i].name);
        cli_fmt_shape(&l.v[i].info, shape, sizeof shape);
        sl = strcspn(shape, "]") + 1;
        if (sl > swidth)
            swidth = sl;
    }
    printf("%-*s  %-8s  %-*s  %s\n", (int)width, "NAME", "DTYPE", (int)swidth, "SHAPE", "SHARD");
    for (size_t i = 0; i < l.n; i++) {
        const engram_tensor_info *ti = &l.v[i].info;
        cli_fmt_shape(ti, shape, sizeof shape);
        shape[strcspn(shape, "]") + 1] = '\0'; /* the dtype has its own column */
        printf("%-*s  %-8s  %-*s  %s\n", (int)width, l.v[i].name, ti->dtype, (int)swidth, shape,
               ti->shard[0] ? ti->shard : "-");
    }
    printf("%zu tensors\n", l.n);
    tensors_free(&l);
    return 0;
}

/* ------------------------------------------------------------------------
 * import --layers
 */

/* A name pattern with one {L}: prefix, then the layer number, then
 * suffix. */
struct pattern {
    const char *text;
    size_t pre, suf; /* lengths of the prefix and of the suffix */
};

static int pattern_parse(const struct cli *cli, const char *opt, const char *text,
                         struct pattern *p)
{
    const char *at = strstr(text, LAYER_PLACEHOLDER);
    if (!at || strstr(at + 1, LAYER_PLACEHOLDER))
        return cli_usage_error(cli, "--%s: '%s' must contain %s exactly once (where the layer "
                                    "number goes)",
                               opt, text, LAYER_PLACEHOLDER);
    if (strlen(text) > 200)
        return cli_usage_error(cli, "--%s: '%s' is too long", opt, text);
    p->text = text;
    p->pre = (size_t)(at - text);
    p->suf = strlen(at + 3);
    return 0;
}

/* The tensor name of layer L. */
static void pattern_name(const struct pattern *p, uint64_t layer, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.*s%" PRIu64 "%s", (int)p->pre, p->text, layer, p->text + p->pre + 3);
}

/* If `name` is the pattern's name of a layer (its number in canonical
 * decimal: no sign, no leading zero), stores it in *layer and returns 1. */
static int pattern_match(const struct pattern *p, const char *name, uint64_t *layer)
{
    size_t len = strlen(name), digits;
    const char *d;
    if (len <= p->pre + p->suf || strncmp(name, p->text, p->pre) != 0 ||
        strcmp(name + len - p->suf, p->text + p->pre + 3) != 0)
        return 0;
    d = name + p->pre;
    digits = len - p->pre - p->suf;
    if (digits > 9 || (digits > 1 && d[0] == '0'))
        return 0;
    *layer = 0;
    for (size_t i = 0; i < digits; i++) {
        if (d[i] < '0' || d[i] > '9')
            return 0;
        *layer = *layer * 10 + (uint64_t)(d[i] - '0');
    }
    return 1;
}

/* " (did you mean --opt 'x'?)" for the pattern closest to `p` among the
 * tensor names with one of their runs of digits written as {L}. */
static const char *suggest_pattern(const struct tensors *l, const struct pattern *p,
                                   const char *opt, char *buf, size_t cap)
{
    char cand[512], best_text[512] = "";
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < l->n; i++) {
        const char *n = l->v[i].name;
        for (const char *r = n; *r; r++) {
            const char *e = r;
            size_t d;
            if (*r < '0' || *r > '9' || (r > n && r[-1] >= '0' && r[-1] <= '9'))
                continue;
            while (*e >= '0' && *e <= '9')
                e++;
            snprintf(cand, sizeof cand, "%.*s%s%s", (int)(r - n), n, LAYER_PLACEHOLDER, e);
            d = cli_edit_distance(p->text, cand);
            if (d < best) {
                best = d;
                snprintf(best_text, sizeof best_text, "%s", cand);
            }
        }
    }
    if (best == SIZE_MAX || !close_enough(p->text, best))
        return "";
    snprintf(buf, cap, " (did you mean --%s '%s'?)", opt, best_text);
    return buf;
}


/* One layer to import: its tensors and the bytes of a row. */
struct layer {
    uint64_t id;
    const uint64_t *vocab; /* its heads' rows: --head-vocab's, or the layout's */
    uint64_t sum;          /* their sum */
    const struct tensor *w, *s;
    char wname[LAYER_NAME_MAX + 256], sname[LAYER_NAME_MAX + 256];
    uint32_t len[2];
};

/* The tables published so far, removed again if a later one fails. */
struct published {
    char (*names)[ENGRAM_NAME_MAX + 1];
    size_t n;
};

static void rollback(engram_store *st, struct published *pub)
{
    size_t removed = 0;
    for (size_t i = pub->n; i-- > 0;)
        if (engram_remove(st, pub->names[i]) == 0)
            removed++;
    if (pub->n)
        fprintf(stderr, "engram: import --layers: removed the %zu table%s this import had "
                        "published\n",
                removed, removed == 1 ? "" : "s");
    pub->n = 0;
}

/* Imports the heads of one layer (its tensors already checked). */
static int import_layer(engram_store *st, const char *path, const struct layer *ly,
                        const uint64_t *vocab, size_t h0, size_t h1, uint32_t pitch,
                        struct published *pub, size_t *done, size_t total)
{
    struct cli_st_source src = {{-1, -1}, {0, 0}, {0, 0}, 2, NULL, path};
    engram_tensor_info ti[2] = {ENGRAM_TENSOR_INFO_INIT, ENGRAM_TENSOR_INFO_INIT};
    const char *tn[2] = {ly->wname, ly->sname};
    char file[2][4096], table[ENGRAM_NAME_MAX + 1], label[64];
    uint64_t first = 0, rb;
    int status = 0;

    snprintf(label, sizeof label, "engram:l%" PRIu64, ly->id);

    /* Each file is opened once and its rows read from that descriptor,
     * whose header is checked again (cli_open_tensor_file). */
    for (unsigned g = 0; g < 2; g++) {
        if (g == 1)
            src.fd[1] = src.fd[0];
        if ((status = cli_open_tensor_file(label, path, tn[g], &ti[g], g ? file[0] : NULL,
                                           file[g], sizeof file[g], &src.fd[g])) != 0)
            goto out;
        /* The file may have changed since it was listed. */
        if ((status = cli_check_rows_tensor(label, tn[g], &ti[g], g ? tn[0] : NULL,
                                            g ? &ti[0] : NULL, &rb)) != 0)
            goto out;
        if (ti[g].shape[0] != ly->w->info.shape[0] || rb != ly->len[g]) {
            status = cli_fail("import --layers: '%s' changed while it was being imported", path);
            goto out;
        }
    }
    if (!(src.tmp = malloc(CLI_ST_TMP_BYTES))) {
        status = cli_fail("import --layers: out of memory");
        goto out;
    }
    src.len[0] = ly->len[0];
    src.len[1] = ly->len[1];
    for (size_t h = 0; h < h0; h++)
        first += vocab[h];
    for (size_t h = h0; h < h1; h++) {
        engram_table_spec spec = {vocab[h], ly->len[0] + ly->len[1], pitch};
        snprintf(table, sizeof table, "engram:l%" PRIu64 ":h%zu", ly->id, h);
        for (unsigned g = 0; g < 2; g++)
            src.off[g] = ti[g].offset + first * src.len[g];
        if ((status = cli_write_table_range(st, "import", table, &spec, first,
                                            ti[0].shape[0], cli_st_rows, &src)) != 0)
            goto out;
        snprintf(pub->names[pub->n++], ENGRAM_NAME_MAX + 1, "%s", table);
        if ((status = cli_verify_rows(st, "import", table, &spec, cli_st_rows, &src)) != 0)
            goto out;
        (*done)++;
        printf("[%zu/%zu] %s: %" PRIu64 " rows of %" PRIu32 " bytes, rows %" PRIu64 "..%" PRIu64
               " of layer %" PRIu64 ", verified\n",
               *done, total, table, spec.num_rows, spec.row_bytes, first,
               first + spec.num_rows - 1, ly->id);
        fflush(stdout);
        first += vocab[h];
    }
out:
    if (src.fd[0] >= 0)
        close(src.fd[0]);
    if (src.fd[1] >= 0 && src.fd[1] != src.fd[0])
        close(src.fd[1]);
    free(src.tmp);
    return status;
}

/* The heads [*h0, *h1) of import --layers: all of them, or with --shard S
 * those of shard S of the plan --tp/--dp/--per-tp/--reads/--balanced
 * describe (as engram plan prints it). */
static int shard_heads(const struct cli *cli, const uint64_t *vocab, size_t heads, size_t *h0,
                       size_t *h1)
{
    uint64_t tp = 0, dp = 1, shard = 0, reads[HEADS_MAX];
    uint32_t flags = 0, count;
    size_t nreads = 0;
    engram_shard *sh;
    int status, rc;
    (void)vocab;
    *h0 = 0;
    *h1 = heads;
    if (!cli->opt[OPT_SHARD]) {
        if (cli->opt[OPT_TP] || cli->opt[OPT_DP] || cli->opt[OPT_PER_TP] || cli->opt[OPT_READS] ||
            cli->opt[OPT_BALANCED])
            return cli_usage_error(cli, "--tp, --dp, --per-tp, --reads and --balanced describe "
                                        "the plan of --shard S: give the shard to import");
        return 0;
    }
    if (!cli->opt[OPT_TP])
        return cli_usage_error(cli, "--shard needs the topology: --tp T [--dp D] [--per-tp]");
    if ((status = cli_opt_u64(cli, OPT_TP, 1, 65536, &tp)) != 0 ||
        (status = cli_opt_u64(cli, OPT_DP, 1, 65536, &dp)) != 0)
        return status;
    if (cli->opt[OPT_READS]) {
        if (cli_parse_list(cli->opt[OPT_READS], 0, reads, HEADS_MAX, &nreads) != 0 ||
            nreads != heads)
            return cli_usage_error(cli, "--reads: give %zu read counts (one per head of "
                                        "--head-vocab), got '%s'",
                                   heads, cli->opt[OPT_READS]);
    } else if (cli->opt[OPT_BALANCED]) {
        return cli_usage_error(cli, "--balanced needs --reads R0,... (each head's reads)");
    }
    flags = (cli->opt[OPT_PER_TP] ? ENGRAM_SHARD_PER_TP : 0) |
            (cli->opt[OPT_BALANCED] ? ENGRAM_SHARD_BALANCED : 0);
    count = engram_shard_count((uint32_t)tp, (uint32_t)dp, flags);
    if ((status = cli_opt_u64(cli, OPT_SHARD, 0, count ? count - 1 : 0, &shard)) != 0)
        return status;
    if (!(sh = calloc(count, sizeof *sh)))
        return cli_fail("import --layers: out of memory");
    rc = engram_shard_plan((uint32_t)heads, nreads ? reads : NULL, (uint32_t)tp, (uint32_t)dp,
                           flags, sh);
    if (rc == 0) {
        *h0 = sh[shard].first_head;
        *h1 = (size_t)sh[shard].first_head + sh[shard].num_heads;
    }
    free(sh);
    if (rc != 0)
        return cli_lib_fail(rc, "import --layers: the plan of --shard");
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int cli_import_layers(struct cli *cli)
{
    const char *path = cli->opt[OPT_SAFETENSORS];
    struct pattern pw, ps;
    struct tensors l = {NULL, 0, 0};
    struct layer *layers = NULL;
    struct published pub = {NULL, 0};
    uint64_t vocab[HEADS_MAX], want[1024], sum = 0, pitch = 0;
    size_t heads = 0, nwant = 0, nlayers = 0, done = 0, total, h0 = 0, h1 = 0;
    engram_store *st = NULL;
    engram_ngram_layout *lay = NULL;
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    char hint[600], shape[256];
    int status, rc, made = 0;

    if (!path)
        return cli_usage_error(cli, "--layers needs --safetensors CKPT (a .safetensors file or "
                                    "a model.safetensors.index.json)");
    if (cli->nargs != 0)
        return cli_usage_error(cli, "--layers names the tables itself (engram:l{L}:h{h}); "
                                    "unexpected argument '%s'",
                               cli->args[0]);
    if (cli->opt[OPT_ROWS] || cli->opt[OPT_ROW_BYTES])
        return cli_usage_error(cli, "--%s does not apply to --layers",
                               cli->opt[OPT_ROWS] ? "rows" : "row-bytes");
    if (!cli->opt[OPT_HEAD_VOCAB] == !cli->opt[OPT_CONFIG])
        return cli_usage_error(cli, "--layers needs --head-vocab N0,N1,... (the rows of each "
                                    "head, in the order of the tensor's rows) or --config "
                                    "CONFIG.json (the model's n-gram layout), one of them");
    /* The flags first: the layout, once made, goes at `out`. */
    if (cli->opt[OPT_LAYER_IDS]) {
        rc = cli_parse_list(cli->opt[OPT_LAYER_IDS], 0, want, sizeof want / sizeof want[0], &nwant);
        if (rc != 0)
            return cli_usage_error(cli, "--layer-ids: '%s' is not a comma-separated list of "
                                        "layer numbers (at most 1024)",
                                   cli->opt[OPT_LAYER_IDS]);
        qsort(want, nwant, sizeof want[0], cmp_u64);
        for (size_t i = 1; i < nwant; i++)
            if (want[i] == want[i - 1])
                return cli_usage_error(cli, "--layer-ids: layer %" PRIu64 " given twice",
                                       want[i]);
    }
    if ((status = pattern_parse(cli, "weight", cli->opt[OPT_WEIGHT] ? cli->opt[OPT_WEIGHT]
                                                                    : DEFAULT_WEIGHT,
                                &pw)) != 0 ||
        (status = pattern_parse(cli, "scale", cli->opt[OPT_SCALE] ? cli->opt[OPT_SCALE]
                                                                  : DEFAULT_SCALE,
                                &ps)) != 0)
        return status;
    if ((status = cli_opt_u64(cli, OPT_PITCH, 0, ENGRAM_ROW_BYTES_MAX, &pitch)) != 0)
        return status;
    if (cli->opt[OPT_CONFIG]) {
        /* Each layer's heads are its columns, their rows its primes. */
        if ((status = cli_make_layout(cli, 0, &lay)) != 0)
            return status;
        engram_get_ngram_layout_info(lay, &li);
        heads = li.num_cols;
        if (heads > HEADS_MAX) {
            engram_ngram_layout_destroy(lay);
            return cli_usage_error(cli, "--config: %zu columns a layer, above %d", heads,
                                   HEADS_MAX);
        }
    } else {
        rc = cli_parse_list(cli->opt[OPT_HEAD_VOCAB], 1, vocab, HEADS_MAX, &heads);
        if (rc == -2)
            return cli_usage_error(cli, "--head-vocab: more than %d heads", HEADS_MAX);
        if (rc != 0)
            return cli_usage_error(cli, "--head-vocab: '%s' is not a comma-separated list of "
                                        "positive integers",
                                   cli->opt[OPT_HEAD_VOCAB]);
        for (size_t h = 0; h < heads; h++)
            if (__builtin_add_overflow(sum, vocab[h], &sum))
                return cli_usage_error(cli, "--head-vocab: the sizes overflow");
    }
    if ((status = shard_heads(cli, vocab, heads, &h0, &h1)) != 0)
        goto out;

    /* 1. The layers: every weight tensor the pattern matches, or the
     * layers asked for. */
    if ((status = tensors_read("import --layers", path, &l)) != 0)
        goto out;
    total = nwant;
    for (size_t i = 0; !nwant && i < l.n; i++) {
        uint64_t id;
        total += (size_t)pattern_match(&pw, l.v[i].name, &id);
    }
    if (!(layers = calloc(total + 1, sizeof *layers))) {
        status = cli_fail("import --layers: out of memory");
        goto out;
    }
    if (nwant) {
        for (size_t i = 0; i < nwant; i++) {
            layers[nlayers].id = want[i];
            pattern_name(&pw, want[i], layers[nlayers].wname, sizeof layers[nlayers].wname);
            if (!(layers[nlayers].w = tensors_find(&l, layers[nlayers].wname))) {
                status = cli_fail("import --layers: layer %" PRIu64 ": '%s' has no tensor "
                                  "'%s'%s",
                                  want[i], path, layers[nlayers].wname,
                                  suggest_name(&l, layers[nlayers].wname, hint, sizeof hint));
                goto out;
            }
            nlayers++;
        }
    } else {
        for (size_t i = 0; i < l.n; i++) {
            uint64_t id;
            if (!pattern_match(&pw, l.v[i].name, &id))
                continue;
            layers[nlayers].id = id;
            layers[nlayers].w = &l.v[i];
            snprintf(layers[nlayers].wname, sizeof layers[nlayers].wname, "%s", l.v[i].name);
            nlayers++;
        }
        if (nlayers == 0) {
            status = cli_fail("import --layers: no tensor of '%s' matches --weight '%s'%s; "
                              "'engram inspect %s' lists its tensors",
                              path, pw.text, suggest_pattern(&l, &pw, "weight", hint, sizeof hint),
                              path);
            goto out;
        }
    }
    /* Natural order of the names is numeric order of the layers. */

    /* Each layer's head sizes: --head-vocab for all, or the layout's own. */
    for (size_t i = 0; i < nlayers; i++) {
        struct layer *ly = &layers[i];
        if (!lay) {
            ly->vocab = vocab;
            ly->sum = sum;
            continue;
        }
        for (uint32_t k = 0; k < li.num_layers && !ly->vocab; k++)
            if ((uint64_t)li.layer_ids[k] == ly->id) {
                ly->vocab = li.primes + (size_t)k * li.num_cols;
                ly->sum = li.num_rows[k];
            }
        if (!ly->vocab) {
            status = cli_fail("import --layers: layer %" PRIu64 " ('%s') is not an Engram layer "
                              "of --config's layout (engram_layer_ids)",
                              ly->id, ly->wname);
            goto out;
        }
    }

    /* 2. Every layer's scale, shapes and sizes, and every table name free,
     * before anything is written. */
    for (size_t i = 0; i < nlayers; i++) {
        struct layer *ly = &layers[i];
        uint64_t rb[2], n;
        pattern_name(&ps, ly->id, ly->sname, sizeof ly->sname);
        if (!(ly->s = tensors_find(&l, ly->sname))) {
            status = cli_fail("import --layers: layer %" PRIu64 ": '%s' has no scale tensor "
                              "'%s'%s",
                              ly->id, path, ly->sname,
                              suggest_name(&l, ly->sname, hint, sizeof hint));
            goto out;
        }
        char label[64];
        snprintf(label, sizeof label, "engram:l%" PRIu64, ly->id);
        if ((status = cli_check_rows_tensor(label, ly->wname, &ly->w->info, NULL, NULL,
                                            &rb[0])) != 0 ||
            (status = cli_check_rows_tensor(label, ly->sname, &ly->s->info, ly->wname,
                                            &ly->w->info, &rb[1])) != 0)
            goto out;
        n = ly->w->info.shape[0];
        if (ly->sum != n) {
            status = cli_fail("import --layers: layer %" PRIu64 ": the %zu head sizes of %s "
                              "add up to %" PRIu64 " rows, but '%s' has %" PRIu64 " (shape %s)",
                              ly->id, heads, lay ? "the layout" : "--head-vocab", ly->sum,
                              ly->wname, n, cli_fmt_shape(&ly->w->info, shape, sizeof shape));
            goto out;
        }
        if (rb[0] + rb[1] > ENGRAM_ROW_BYTES_MAX || (pitch && pitch < rb[0] + rb[1])) {
            status = cli_usage_error(cli, "rows of %" PRIu64 " bytes (%s + %s) %s", rb[0] + rb[1],
                                     ly->wname, ly->sname,
                                     pitch ? "do not fit in --pitch" : "are too large");
            goto out;
        }
        ly->len[0] = (uint32_t)rb[0];
        ly->len[1] = (uint32_t)rb[1];
    }
    total = nlayers * (h1 - h0);
    if (!(pub.names = calloc(total, sizeof *pub.names))) {
        status = cli_fail("import --layers: out of memory");
        goto out;
    }
    if (cli_open_for_write(cli, &st, &made, &status) != 0)
        goto out;
    for (size_t i = 0; i < nlayers; i++)
        for (size_t h = h0; h < h1; h++) {
            engram_table_info info = ENGRAM_TABLE_INFO_INIT;
            char table[ENGRAM_NAME_MAX + 1];
            snprintf(table, sizeof table, "engram:l%" PRIu64 ":h%zu", layers[i].id, h);
            rc = engram_get_table_info(st, table, &info);
            if (rc == 0) {
                status = cli_fail("import --layers: table '%s' already exists in namespace "
                                  "'%s' (remove the layer's tables with 'engram rm' first); "
                                  "nothing was imported",
                                  table, cli->ns);
                goto out;
            }
            if (rc != -ENOENT) {
                status = cli_lib_fail(rc, "import --layers: '%s'", table);
                goto out;
            }
        }

    /* 3. The tables, layer by layer, head by head. */
    if (h1 - h0 == heads)
        printf("importing %zu layer%s x %zu heads from %s into namespace '%s'\n", nlayers,
               nlayers == 1 ? "" : "s", heads, path, cli->ns);
    else
        printf("importing %zu layer%s x heads %zu-%zu of %zu (shard %s) from %s into namespace "
               "'%s'\n",
               nlayers, nlayers == 1 ? "" : "s", h0, h1 - 1, heads, cli->opt[OPT_SHARD], path,
               cli->ns);
    fflush(stdout);
    for (size_t i = 0; i < nlayers; i++)
        if ((status = import_layer(st, path, &layers[i], layers[i].vocab, h0, h1,
                                   (uint32_t)pitch, &pub, &done, total)) != 0)
            break;
    if (status != 0)
        rollback(st, &pub);
    else
        printf("imported %zu tables (layers", total);
    for (size_t i = 0; status == 0 && i < nlayers; i++)
        printf("%s %" PRIu64, i ? "," : "", layers[i].id);
    if (status == 0)
        printf("; heads engram:l{L}:h%zu..h%zu), verified\n", h0, h1 - 1);
out:
    cli_close_written(cli, st, made, status);
    engram_ngram_layout_destroy(lay);
    free(pub.names);
    free(layers);
    tensors_free(&l);
    return status;
}
