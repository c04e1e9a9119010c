/*
 * safetensors_parse.c - the safetensors header parser: the one reader of
 * a checkpoint's header bytes (see safetensors.h for every check).
 *
 * Its input is untrusted: the bytes come from whoever wrote the
 * checkpoint, and a header may be malformed or hostile in any way (a
 * length past the file, millions of JSON values, numbers that are not
 * exact integers, sizes that overflow, overlapping or missing tensors).
 * Everything is checked here before any of it is used, and nothing else
 * in the library reads these bytes; fuzz/fuzz_safetensors.c drives this
 * file.  The checkpoint API over it (index files, tables over tensors) is
 * safetensors.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common.h"
#include "safetensors.h"

#define INT_MAX_EXACT ((double)((uint64_t)1 << 53)) /* integers a JSON double holds exactly */


static const struct {
    const char *name;
    uint32_t size;
} dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},     {"I32", 4},
    {"F32", 4},  {"U64", 8}, {"I64", 8}, {"F64", 8},
};

size_t engram__json_values_bound(const char *s, size_t n)
{
    size_t count = 1;
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\')
                i++; /* the escaped character, even a quote */
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == ',' || c == '[' || c == '{') {
            count++;
        }
    }
    return count;
}

/* cJSON's parser writes a process-wide error position (global_error) on
 * every call, success or not: two threads opening checkpoints at once
 * would race on it.  Parses are rare (one per open), so they take turns. */
static pthread_mutex_t json_lock = PTHREAD_MUTEX_INITIALIZER;

cJSON *engram__json_parse(const char *s, size_t n, const char **end)
{
    cJSON *root;
    pthread_mutex_lock(&json_lock);
    root = cJSON_ParseWithLengthOpts(s, n, end, 0);
    pthread_mutex_unlock(&json_lock);
    return root;
}

/* Reads a JSON number that must be an integer in [0, 2^53]. */
static int json_uint(const cJSON *j, uint64_t *v)
{
    double d;
    if (!cJSON_IsNumber(j))
        return -1;
    d = j->valuedouble;
    if (!(d >= 0 && d <= INT_MAX_EXACT) || d != floor(d))
        return -1;
    *v = (uint64_t)d;
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const engram__st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const engram__st_tensor *const *)a)->name,
                  (*(const engram__st_tensor *const *)b)->name);
}

void engram__st_free(engram__st_header *h)
{
    if (!h)
        return;
    free(h->t);
    free(h->names);
    h->t = NULL;
    h->names = NULL;
    h->n = 0;
}

/* Fills tensor *t from JSON object j; returns 0 or an error. */
static int parse_tensor(const cJSON *j, const char *name, const char *what, engram__st_tensor *t)
{
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    const cJSON *e;
    uint64_t count = 1, bytes;
    size_t d;

    if (!cJSON_IsObject(j))
        return engram__err(ENGRAM_ECORRUPT, "%s: tensor '%.64s' is not a JSON object", what, name);
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
        return engram__err(ENGRAM_ECORRUPT,
                           "%s: tensor '%.64s' needs a string \"dtype\" and arrays \"shape\" "
                           "and \"data_offsets\"",
                           what, name);
    for (d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        if (strcmp(dt->valuestring, dtypes[d].name) == 0)
            break;
    if (d == sizeof dtypes / sizeof dtypes[0])
        return engram__err(ENGRAM_ECORRUPT, "%s: tensor '%.64s' has unknown dtype '%.32s'", what,
                           name, dt->valuestring);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtypes[d].name);
    t->elem_size = dtypes[d].size;
    t->ndim = 0;
    cJSON_ArrayForEach(e, sh)
    {
        uint64_t v;
        if (t->ndim == ENGRAM_TENSOR_MAX_DIMS)
            return engram__err(ENGRAM_ECORRUPT, "%s: tensor '%.64s' has more than %d dimensions",
                               what, name, ENGRAM_TENSOR_MAX_DIMS);
        if (json_uint(e, &v) != 0)
            return engram__err(ENGRAM_ECORRUPT,
                               "%s: tensor '%.64s': shape[%u] is not an integer in [0, 2^53]",
                               what, name, t->ndim);
        t->shape[t->ndim++] = v;
        if (engram__mul_u64(count, v, &count))
            return engram__err(ENGRAM_ECORRUPT, "%s: tensor '%.64s': element count overflows",
                               what, name);
    }
    if (cJSON_GetArraySize(of) != 2 || json_uint(cJSON_GetArrayItem(of, 0), &t->begin) != 0 ||
        json_uint(cJSON_GetArrayItem(of, 1), &t->end) != 0 || t->begin > t->end)
        return engram__err(ENGRAM_ECORRUPT,
                           "%s: tensor '%.64s': data_offsets must be [begin, end], integers with "
                           "begin <= end",
                           what, name);
    if (engram__mul_u64(count, t->elem_size, &bytes) || bytes != t->end - t->begin)
        return engram__err(ENGRAM_ECORRUPT,
                           "%s: tensor '%.64s': data_offsets [%" PRIu64 ", %" PRIu64
                           "] hold %" PRIu64 " bytes, but its shape and dtype need %" PRIu64
                           " x %u",
                           what, name, t->begin, t->end, t->end - t->begin, count, t->elem_size);
    return 0;
}

int engram__st_parse(const unsigned char *buf, size_t len, uint64_t file_size, const char *what,
                     engram__st_header *h)
{
    cJSON *root = NULL;
    const cJSON *e;
    const char *end = NULL;
    engram__st_tensor **byname = NULL;
    size_t n = 0, names_len = 0, pos = 0;
    uint64_t hl = 0;
    int err = 0;

    memset(h, 0, sizeof *h);
    if (len < 8 || file_size < 8)
        return engram__err(ENGRAM_ECORRUPT, "%s: shorter than the 8-byte header length: not a "
                                            "safetensors file", what);
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | buf[i];
    if (hl < 2 || hl > ENGRAM__ST_HEADER_MAX)
        return engram__err(ENGRAM_ECORRUPT, "%s: header length %" PRIu64 " is outside [2, %" PRIu64
                                            "]: not a safetensors file",
                           what, hl, ENGRAM__ST_HEADER_MAX);
    if (hl > file_size - 8)
        return engram__err(ENGRAM_ECORRUPT, "%s: header length %" PRIu64 " runs past the end of "
                                            "the %" PRIu64 "-byte file (truncated?)",
                           what, hl, file_size);
    if (hl > len - 8)
        return engram__err(ENGRAM_ECORRUPT, "%s: only %zu of the %" PRIu64 " header bytes could "
                                            "be read (truncated?)",
                           what, len - 8, hl);
    h->header_len = hl;
    h->data_start = 8 + hl;
    h->data_size = file_size - h->data_start;

    if (engram__json_values_bound((const char *)buf + 8, (size_t)hl) > ENGRAM__ST_VALUES_MAX)
        return engram__err(ENGRAM_ECORRUPT, "%s: the header holds more than %zu JSON values: "
                                            "refused before parsing",
                           what, ENGRAM__ST_VALUES_MAX);
    root = engram__json_parse((const char *)buf + 8, (size_t)hl, &end);
    if (!root) {
        size_t at = end ? (size_t)(end - (const char *)buf - 8) : 0;
        return engram__err(ENGRAM_ECORRUPT, "%s: the header is not valid JSON (error near byte "
                                            "%zu of %" PRIu64 ")",
                           what, at, hl);
    }
    /* The format pads the header with spaces; anything else is garbage. */
    for (const char *p = end; p < (const char *)buf + 8 + hl; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            err = engram__err(ENGRAM_ECORRUPT, "%s: bytes after the header's JSON object (at "
                                               "byte %zu)",
                              what, (size_t)(p - (const char *)buf - 8));
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        err = engram__err(ENGRAM_ECORRUPT, "%s: the header is not a JSON object", what);
        goto out;
    }
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        n++;
        names_len += strlen(e->string) + 1;
    }
    if (n && (!(h->t = calloc(n, sizeof *h->t)) || !(h->names = malloc(names_len)) ||
              !(byname = malloc(n * sizeof *byname)))) {
        err = engram__err(-ENOMEM, "%s: out of memory for %zu tensors", what, n);
        goto out;
    }
    h->n = 0;
    cJSON_ArrayForEach(e, root)
    {
        engram__st_tensor *t;
        size_t l;
        if (strcmp(e->string, "__metadata__") == 0) {
            const cJSON *m;
            if (!cJSON_IsObject(e)) {
                err = engram__err(ENGRAM_ECORRUPT, "%s: __metadata__ is not an object", what);
                goto out;
            }
            cJSON_ArrayForEach(m, e) if (!cJSON_IsString(m))
            {
                err = engram__err(ENGRAM_ECORRUPT, "%s: __metadata__ value '%.64s' is not a "
                                                   "string",
                                  what, m->string);
                goto out;
            }
            continue;
        }
        t = &h->t[h->n];
        l = strlen(e->string) + 1;
        if (l == 1) {
            err = engram__err(ENGRAM_ECORRUPT, "%s: a tensor has an empty name", what);
            goto out;
        }
        memcpy(h->names + pos, e->string, l);
        t->name = h->names + pos;
        pos += l;
        if ((err = parse_tensor(e, t->name, what, t)) != 0)
            goto out;
        if (t->end > h->data_size) {
            err = engram__err(ENGRAM_ECORRUPT,
                              "%s: tensor '%.64s' ends at data byte %" PRIu64 ", past the %" PRIu64
                              " data bytes of the file (truncated?)",
                              what, t->name, t->end, h->data_size);
            goto out;
        }
        byname[h->n] = t;
        h->n++;
    }
    if (h->n > 1) {
        qsort(byname, h->n, sizeof *byname, cmp_name);
        for (size_t i = 1; i < h->n; i++)
            if (strcmp(byname[i - 1]->name, byname[i]->name) == 0) {
                err = engram__err(ENGRAM_ECORRUPT, "%s: tensor '%.64s' is defined twice", what,
                                  byname[i]->name);
                goto out;
            }
        qsort(h->t, h->n, sizeof *h->t, cmp_begin);
    }
    /* The tensors must tile the data: no overlap, no hole, no tail. */
    {
        uint64_t at = 0;
        for (size_t i = 0; i < h->n; i++) {
            if (h->t[i].begin < at) {
                err = engram__err(ENGRAM_ECORRUPT,
                                  "%s: tensors '%.64s' and '%.64s' overlap (data bytes %" PRIu64
                                  " .. %" PRIu64 ")",
                                  what, h->t[i - 1].name, h->t[i].name, h->t[i].begin, at);
                goto out;
            }
            if (h->t[i].begin > at) {
                err = engram__err(ENGRAM_ECORRUPT,
                                  "%s: data bytes %" PRIu64 " .. %" PRIu64 " before tensor '%.64s' "
                                  "belong to no tensor",
                                  what, at, h->t[i].begin, h->t[i].name);
                goto out;
            }
            at = h->t[i].end;
        }
        if (at != h->data_size) {
            err = engram__err(ENGRAM_ECORRUPT,
                              "%s: the file has %" PRIu64 " data bytes but its tensors cover "
                              "%" PRIu64,
                              what, h->data_size, at);
            goto out;
        }
    }
out:
    free(byname);
    cJSON_Delete(root);
    if (err)
        engram__st_free(h);
    return err;
}

const engram__st_tensor *engram__st_find(const engram__st_header *h, const char *name)
{
    for (size_t i = 0; i < h->n; i++)
        if (strcmp(h->t[i].name, name) == 0)
            return &h->t[i];
    return NULL;
}

/* Reads exactly len bytes at off (0 or -errno; -ENODATA at end of file). */
int engram__st_read_at(int fd, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -ENODATA;
        got += (size_t)r;
    }
    return 0;
}

int engram__st_read(int fd, uint64_t file_size, const char *what, engram__st_header *h)
{
    unsigned char len8[8] = {0}, *buf;
    uint64_t hl = 0;
    int err;
    memset(h, 0, sizeof *h);
    if (file_size < 8)
        return engram__st_parse(len8, 0, file_size, what, h);
    if ((err = engram__st_read_at(fd, len8, 8, 0)) != 0)
        return engram__errno(-err, "read %s", what);
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | len8[i];
    /* The parser rejects bad lengths with its own messages; read only
     * what a valid header could be. */
    if (hl > ENGRAM__ST_HEADER_MAX || hl > file_size - 8)
        return engram__st_parse(len8, 8, file_size, what, h);
    if (!(buf = malloc(8 + (size_t)hl)))
        return engram__err(-ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header", what, hl);
    err = engram__st_read_at(fd, buf, 8 + (size_t)hl, 0);
    if (err == 0)
        err = engram__st_parse(buf, 8 + (size_t)hl, file_size, what, h);
    else if (err == -ENODATA)
        err = engram__err(ENGRAM_ECORRUPT, "%s: the file ended inside its header", what);
    else
        err = engram__errno(-err, "read the header of %s", what);
    free(buf);
    return err;
}
