/*
 * cli_ngram.c - layout and hash: the Engram n-gram hash from the command
 * line (engram_ngram_*), for checking a model's layout and debugging ids.
 *
 * The layout comes from flags or from a model's config.json (--config:
 * the same engram_* fields engramstore.NgramLayout.from_config() reads,
 * at the top or under text_config); flags given with --config replace its
 * values.  hash takes a token map from an .npy file of int32 or int64 ids.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engram.h"
#include "cli.h"
#include "npy.h"

#define MAX_FILE ((size_t)1 << 30) /* a config or a token map read whole */

/* Reads a regular file whole: 0 and *buf (malloc'd, NUL-terminated), *len,
 * or an exit status after reporting. */
static int read_file(const char *path, const char *what, char **buf, size_t *len)
{
    struct stat sb;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cli_fail("%s: cannot open %s: %s", what, path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > MAX_FILE) {
        close(fd);
        return cli_fail("%s: %s is not a regular file of at most 1 GiB", what, path);
    }
    if (!(*buf = malloc((size_t)sb.st_size + 1))) {
        close(fd);
        return cli_fail("out of memory");
    }
    while (got < (size_t)sb.st_size) {
        ssize_t n = read(fd, *buf + got, (size_t)sb.st_size - got);
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            free(*buf);
            *buf = NULL;
            return cli_fail("%s: cannot read %s: %s", what, path, strerror(e));
        }
        got += (size_t)n;
    }
    close(fd);
    (*buf)[got] = '\0';
    *len = got;
    return 0;
}

/* A config field's integer value (the first of `names` found in the
 * scopes, a list of equal values accepted with `list_ok`): 1 and *out, 0
 * if absent, -1 if present but not such a number.  JSON numbers arrive as
 * doubles: from 2^53 on, one no longer tells which integer was written
 * (2^53 + 1 reads as 2^53), so those are refused too. */
static int json_u64(const cJSON *const *scopes, int nscopes, const char *const *names,
                    int list_ok, uint64_t *out)
{
    for (int s = 0; s < nscopes; s++)
        for (int i = 0; names[i]; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(scopes[s], names[i]);
            double d;
            if (!v)
                continue;
            if (list_ok && cJSON_IsArray(v)) {
                const cJSON *e = v->child;
                if (!e)
                    return -1;
                for (const cJSON *x = e; x; x = x->next)
                    if (!cJSON_IsNumber(x) || x->valuedouble != e->valuedouble)
                        return -1;
                v = e;
            }
            if (!cJSON_IsNumber(v))
                return -1;
            d = v->valuedouble;
            if (d < 0 || d >= 9007199254740992.0 || d != (double)(uint64_t)d)
                return -1;
            *out = (uint64_t)d;
            return 1;
        }
    return 0;
}

struct layout_args {
    int64_t layer_ids[ENGRAM_NGRAM_MAX_LAYERS];
    size_t nlayers;
    uint64_t vocab, maxn, heads, cv, pad;
    int have_vocab, have_maxn, have_heads, have_cv, have_pad;
};

/* The fields of --config into *a (flags apply after). */
static int layout_from_config(const struct cli *cli, struct layout_args *a)
{
    static const char *const n_lids[] = {"engram_layer_ids", NULL};
    static const char *const n_vocab[] = {"engram_vocab_size", NULL};
    static const char *const n_maxn[] = {"engram_max_ngram_size", "engram_max_ngram", NULL};
    static const char *const n_heads[] = {"engram_n_head_per_ngram", "engram_heads", NULL};
    static const char *const n_cv[] = {"engram_compressed_vocab_size", "engram_compressed_vocab",
                                       NULL};
    static const char *const n_pad[] = {"engram_pad_id", NULL};
    const char *path = cli->opt[OPT_CONFIG];
    const cJSON *scopes[2], *tc, *l = NULL;
    char *text = NULL;
    size_t len;
    cJSON *root;
    int ns = 0, status = 0, r;

    if ((status = read_file(path, "--config", &text, &len)) != 0)
        return status;
    root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cli_fail("--config: %s is not a JSON object", path);
    }
    tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(tc))
        scopes[ns++] = tc;
    scopes[ns++] = root;
    for (int s = 0; s < ns && !l; s++)
        l = cJSON_GetObjectItemCaseSensitive(scopes[s], n_lids[0]);
    if (l) {
        a->nlayers = 0;
        if (!cJSON_IsArray(l))
            goto bad_lids;
        for (const cJSON *e = l->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e15 ||
                e->valuedouble != (double)(int64_t)e->valuedouble ||
                a->nlayers == ENGRAM_NGRAM_MAX_LAYERS)
                goto bad_lids;
            a->layer_ids[a->nlayers++] = (int64_t)e->valuedouble;
        }
    }
#define FIELD(names, list_ok, dst, have)                                                         \
    if ((r = json_u64(scopes, ns, names, list_ok, &a->dst)) < 0) {                                 \
        status = cli_fail("--config: %s in %s is not a non-negative integer%s", names[0], path,  \
                          list_ok ? " (or a list of one repeated)" : "");                         \
        goto out;                                                                                \
    }                                                                                            \
    a->have |= r;
    FIELD(n_vocab, 1, vocab, have_vocab)
    FIELD(n_maxn, 0, maxn, have_maxn)
    FIELD(n_heads, 0, heads, have_heads)
    FIELD(n_cv, 0, cv, have_cv)
    FIELD(n_pad, 0, pad, have_pad)
#undef FIELD
out:
    cJSON_Delete(root);
    return status;
bad_lids:
    cJSON_Delete(root);
    return cli_fail("--config: engram_layer_ids in %s is not a list of layer numbers (at most "
                    "%d)",
                    path, ENGRAM_NGRAM_MAX_LAYERS);
}

int cli_make_layout(const struct cli *cli, int use_layer_ids, engram_ngram_layout **out)
{
    static const int ids[5] = {OPT_VOCAB_SIZE, OPT_MAX_NGRAM, OPT_HEADS, OPT_COMPRESSED_VOCAB,
                               OPT_PAD_ID};
    static const char *const flag[5] = {"--vocab-size", "--max-ngram", "--heads",
                                        "--compressed-vocab", "--pad-id"};
    struct layout_args a;
    engram_ngram_config c = ENGRAM_NGRAM_CONFIG_INIT;
    uint64_t *dst[5];
    int *have[5], status, rc;

    memset(&a, 0, sizeof a);
    dst[0] = &a.vocab, dst[1] = &a.maxn, dst[2] = &a.heads, dst[3] = &a.cv, dst[4] = &a.pad;
    have[0] = &a.have_vocab, have[1] = &a.have_maxn, have[2] = &a.have_heads;
    have[3] = &a.have_cv, have[4] = &a.have_pad;
    if (cli->opt[OPT_CONFIG] && (status = layout_from_config(cli, &a)) != 0)
        return status;
    if (use_layer_ids && cli->opt[OPT_LAYER_IDS]) {
        uint64_t v[ENGRAM_NGRAM_MAX_LAYERS];
        if (cli_parse_list(cli->opt[OPT_LAYER_IDS], 0, v, ENGRAM_NGRAM_MAX_LAYERS, &a.nlayers) !=
                0)
            return cli_usage_error(cli, "--layer-ids: %s is not a list of layer numbers",
                                   cli->opt[OPT_LAYER_IDS]);
        for (size_t i = 0; i < a.nlayers; i++) {
            if (v[i] > (uint64_t)INT64_MAX)
                return cli_usage_error(cli, "--layer-ids: %" PRIu64 " is too large", v[i]);
            a.layer_ids[i] = (int64_t)v[i];
        }
    }
    for (int i = 0; i < 5; i++) {
        if (cli->opt[ids[i]]) {
            if ((status = cli_opt_u64(cli, ids[i], 0, UINT64_MAX, dst[i])) != 0)
                return status;
            *have[i] = 1;
        }
    }
    if (a.nlayers == 0)
        return cli_usage_error(cli, "the layout needs --layer-ids (or --config with "
                                    "engram_layer_ids)");
    for (int i = 0; i < 5; i++)
        if (!*have[i])
            return cli_usage_error(cli, "the layout needs %s (or --config with its field)",
                                   flag[i]);
    if (a.maxn > UINT32_MAX || a.heads > UINT32_MAX || a.pad > (uint64_t)INT64_MAX)
        return cli_usage_error(cli, "--max-ngram, --heads or --pad-id is too large");
    c.num_layers = (uint32_t)a.nlayers;
    c.layer_ids = a.layer_ids;
    c.vocab_size = a.vocab;
    c.max_ngram = (uint32_t)a.maxn;
    c.heads = (uint32_t)a.heads;
    c.compressed_vocab = a.cv;
    c.pad_id = (int64_t)a.pad;
    if ((rc = engram_ngram_layout_create(&c, out)) != 0)
        return rc == ENGRAM_ESPEC ? cli_usage_error(cli, "%s", engram_errmsg())
                                  : cli_lib_fail(rc, "layout");
    return 0;
}

static void json_i64s(const int64_t *v, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf("%s%" PRId64, i ? ", " : "", v[i]);
    putchar(']');
}

/* engram layout [layout options] [--json] */
int cli_cmd_layout(struct cli *cli)
{
    engram_ngram_layout *lay = NULL;
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    int status;

    if ((status = cli_make_layout(cli, 1, &lay)) != 0)
        return status;
    engram_get_ngram_layout_info(lay, &li);
    if (cli->opt[OPT_JSON]) {
        printf("{\n  \"schema\": %d,\n  \"vocab_size\": %" PRIu64 ",\n  \"max_ngram\": %u,\n"
               "  \"heads\": %u,\n  \"num_cols\": %u,\n  \"compressed_vocab\": %" PRIu64 ",\n"
               "  \"pad_id\": %" PRId64 ",\n  \"layers\": [",
               CLI_JSON_SCHEMA, li.vocab_size, li.max_ngram, li.heads, li.num_cols,
               li.compressed_vocab, li.pad_id);
        for (uint32_t l = 0; l < li.num_layers; l++) {
            printf("%s\n    {\"layer_id\": %" PRId64 ", \"num_rows\": %" PRIu64
                   ", \"multipliers\": ",
                   l ? "," : "", li.layer_ids[l], li.num_rows[l]);
            json_i64s(li.multipliers + (size_t)l * li.max_ngram, li.max_ngram);
            printf(", \"primes\": ");
            json_i64s((const int64_t *)(const void *)(li.primes + (size_t)l * li.num_cols),
                      li.num_cols); /* below 2^62: the same as int64 */
            printf(", \"offsets\": ");
            json_i64s(li.offsets + (size_t)l * li.num_cols, li.num_cols);
            putchar('}');
        }
        printf("\n  ]\n}\n");
    } else {
        printf("%u layers, %u columns each ((max_ngram %u - 1) x %u heads), compressed_vocab %"
               PRIu64 ", pad_id %" PRId64 "\n",
               li.num_layers, li.num_cols, li.max_ngram, li.heads, li.compressed_vocab, li.pad_id);
        for (uint32_t l = 0; l < li.num_layers; l++) {
            printf("\nlayer %" PRId64 ": %" PRIu64 " rows; multipliers", li.layer_ids[l],
                   li.num_rows[l]);
            for (uint32_t s = 0; s < li.max_ngram; s++)
                printf(" %" PRId64, li.multipliers[(size_t)l * li.max_ngram + s]);
            printf("\n  %-5s %-3s %-5s %-14s %s\n", "col", "n", "head", "prime", "offset");
            for (uint32_t c = 0; c < li.num_cols; c++)
                printf("  %-5u %-3u %-5u %-14" PRIu64 " %" PRId64 "\n", c, c / li.heads + 2,
                       c % li.heads, li.primes[(size_t)l * li.num_cols + c],
                       li.offsets[(size_t)l * li.num_cols + c]);
        }
    }
    engram_ngram_layout_destroy(lay);
    return 0;
}

/* A signed integer (tokens: -1 is DEAD). */
static int parse_i64(const char *s, int64_t *out)
{
    uint64_t v;
    if (s[0] == '-') {
        if (cli_parse_u64(s + 1, &v) != 0 || v > (uint64_t)INT64_MAX + 1)
            return -1;
        *out = (int64_t)(0 - v);
        return 0;
    }
    if (cli_parse_u64(s, &v) != 0 || v > (uint64_t)INT64_MAX)
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* The token map of --token-map (an .npy of int32 or int64 [V]): 0 and
 * *map (malloc'd) and *n, or an exit status. */
static int read_token_map(const struct cli *cli, int64_t **map, uint64_t *n)
{
    const char *path = cli->opt[OPT_TOKEN_MAP];
    struct npy_info info;
    char *buf = NULL, err[256];
    size_t len;
    int status;
    if ((status = read_file(path, "--token-map", &buf, &len)) != 0)
        return status;
    if (npy_parse((const unsigned char *)buf, len, len, &info, err, sizeof err) != 0) {
        free(buf);
        return cli_fail("--token-map: %s: %s", path, err);
    }
    if (info.ndim != 1 || (strcmp(info.descr, "<i8") != 0 && strcmp(info.descr, "<i4") != 0)) {
        free(buf);
        return cli_fail("--token-map: %s holds %s of %u dimensions; expected a 1-D int32 or "
                        "int64 array",
                        path, info.descr, info.ndim);
    }
    *n = info.rows;
    if (!(*map = malloc(info.rows * sizeof **map))) {
        free(buf);
        return cli_fail("out of memory");
    }
    for (uint64_t i = 0; i < info.rows; i++) {
        const char *e = buf + info.data_offset + i * info.itemsize;
        if (info.itemsize == 8) {
            memcpy(&(*map)[i], e, 8);
        } else {
            int32_t v;
            memcpy(&v, e, 4);
            (*map)[i] = v;
        }
    }
    free(buf);
    return 0;
}

/* engram hash TOKEN... [layout options] [--token-map F] [--history T,...]
 * [--layer L] [--local] [--json] */
int cli_cmd_hash(struct cli *cli)
{
    engram_ngram_layout *lay = NULL;
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    engram_ngram_hasher *h = NULL;
    engram_ngram_hash_args a = ENGRAM_NGRAM_HASH_ARGS_INIT;
    int64_t *tokens = NULL, *ids = NULL, *map = NULL, hist[ENGRAM_NGRAM_MAX_N];
    uint64_t map_len = 0;
    size_t T = (size_t)cli->nargs, hl = 0, nl;
    int status, rc;

    if ((status = cli_make_layout(cli, 1, &lay)) != 0)
        return status;
    engram_get_ngram_layout_info(lay, &li);
    if (!(tokens = malloc(T * sizeof *tokens))) {
        status = cli_fail("out of memory");
        goto out;
    }
    for (size_t t = 0; t < T; t++)
        if (parse_i64(cli->args[t], &tokens[t]) != 0) {
            status = cli_usage_error(cli, "token '%s' is not an integer", cli->args[t]);
            goto out;
        }
    if (cli->opt[OPT_HISTORY]) {
        const char *s = cli->opt[OPT_HISTORY];
        int64_t all[64];
        size_t n = 0;
        while (*s) {
            char item[32];
            size_t k = strcspn(s, ",");
            if (k == 0 || k >= sizeof item || n == 64) {
                status = cli_usage_error(cli, "--history: '%s' is not a list of at most 64 "
                                              "tokens", cli->opt[OPT_HISTORY]);
                goto out;
            }
            memcpy(item, s, k);
            item[k] = '\0';
            if (parse_i64(item, &all[n++]) != 0) {
                status = cli_usage_error(cli, "--history: '%s' is not a token", item);
                goto out;
            }
            s += k + (s[k] == ',');
        }
        /* The last max_ngram - 1 of it count. */
        hl = n < li.max_ngram - 1 ? n : li.max_ngram - 1;
        memcpy(hist, all + n - hl, hl * sizeof *hist);
    }
    a.layer = -1;
    if (cli->opt[OPT_LAYER]) {
        int64_t lid;
        if (parse_i64(cli->opt[OPT_LAYER], &lid) != 0) {
            status = cli_usage_error(cli, "--layer: '%s' is not a layer number",
                                     cli->opt[OPT_LAYER]);
            goto out;
        }
        for (uint32_t l = 0; l < li.num_layers; l++)
            if (li.layer_ids[l] == lid)
                a.layer = (int32_t)l;
        if (a.layer < 0) {
            status = cli_usage_error(cli, "--layer: %" PRId64 " is not one of the layout's "
                                          "layers", lid);
            goto out;
        }
    }
    if (cli->opt[OPT_TOKEN_MAP] && (status = read_token_map(cli, &map, &map_len)) != 0)
        goto out;
    if ((rc = engram_ngram_hasher_create(lay, map, map_len, &h)) != 0) {
        status = cli_lib_fail(rc, "--token-map");
        goto out;
    }
    nl = a.layer < 0 ? li.num_layers : 1;
    if (!(ids = malloc((T ? T : 1) * nl * li.num_cols * sizeof *ids))) {
        status = cli_fail("out of memory");
        goto out;
    }
    a.flags = cli->opt[OPT_LOCAL] ? ENGRAM_NGRAM_LOCAL : 0;
    a.num_tokens = T;
    a.tokens = tokens;
    a.token_type = ENGRAM_ID_INT64;
    a.history = hl ? hist : NULL;
    a.history_len = hl;
    a.out = ids;
    a.out_type = ENGRAM_ID_INT64;
    if ((rc = engram_ngram_hash(h, &a)) != 0) {
        status = cli_lib_fail(rc, "hash");
        goto out;
    }
    if (cli->opt[OPT_JSON]) {
        printf("{\n  \"schema\": %d,\n  \"local\": %s,\n  \"layer_ids\": ", CLI_JSON_SCHEMA,
               a.flags ? "true" : "false");
        if (a.layer < 0)
            json_i64s(li.layer_ids, li.num_layers);
        else
            json_i64s(li.layer_ids + a.layer, 1);
        printf(",\n  \"tokens\": ");
        json_i64s(tokens, T);
        printf(",\n  \"ids\": [");
        for (size_t t = 0; t < T; t++) {
            printf("%s\n    [", t ? "," : "");
            for (size_t l = 0; l < nl; l++) {
                printf("%s", l ? ", " : "");
                json_i64s(ids + (t * nl + l) * li.num_cols, li.num_cols);
            }
            putchar(']');
        }
        printf("\n  ]\n}\n");
    } else {
        for (size_t t = 0; t < T; t++)
            for (size_t l = 0; l < nl; l++) {
                printf("%zu %" PRId64 " layer %" PRId64 ":", t, tokens[t],
                       li.layer_ids[a.layer < 0 ? l : (size_t)a.layer]);
                for (uint32_t c = 0; c < li.num_cols; c++)
                    printf(" %" PRId64, ids[(t * nl + l) * li.num_cols + c]);
                putchar('\n');
            }
    }
    status = 0;
out:
    engram_ngram_hasher_destroy(h);
    engram_ngram_layout_destroy(lay);
    free(tokens);
    free(ids);
    free(map);
    return status;
}
