/*
 * safetensors.c - safetensors checkpoints: index files of sharded
 * checkpoints, the tensors' info and list, and tables served from a
 * weight tensor (plus an optional scale tensor) through the row cache.
 *
 * Nothing in a checkpoint is trusted: the header goes through
 * engram__st_parse() (safetensors_parse.c; see safetensors.h for every
 * check), index files through cJSON with their shard names restricted to
 * plain file names in the index's directory, and files are opened with
 * O_NOFOLLOW and must be regular files that others cannot write.
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

#include "filesrc.h"
#include "safetensors.h"
#include "store.h"

#define INDEX_MAX ((uint64_t)64 << 20)

/* ------------------------------------------------------------------------
 * "Did you mean": the tensor name closest to a name that was not found.
 */

/* The edit distance (insertions, deletions, substitutions) between a and
 * b if it is at most `cap`, else cap + 1.  Names longer than the row
 * buffer are compared by their first ENGRAM__SUGGEST_MAX bytes. */
#define ENGRAM__SUGGEST_MAX 255
static size_t edit_distance(const char *a, const char *b, size_t cap)
{
    size_t la = strnlen(a, ENGRAM__SUGGEST_MAX), lb = strnlen(b, ENGRAM__SUGGEST_MAX);
    size_t row[ENGRAM__SUGGEST_MAX + 1];
    if ((la > lb ? la - lb : lb - la) > cap)
        return cap + 1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0], best;
        row[0] = i;
        best = row[0];
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t v = diag + (a[i - 1] != b[j - 1]);
            if (row[j - 1] + 1 < v)
                v = row[j - 1] + 1;
            if (up + 1 < v)
                v = up + 1;
            row[j] = v;
            diag = up;
            if (v < best)
                best = v;
        }
        if (best > cap) /* every later row is at least this far */
            return cap + 1;
    }
    return row[lb] <= cap ? row[lb] : cap + 1;
}

/* Collects the candidate closest to `want`: close enough to be a typo
 * (at most a quarter of its length, and at least 2 edits allowed). */
typedef struct suggest {
    const char *want;
    size_t best; /* distance of name[], or the threshold + 1 */
    char name[ENGRAM__SUGGEST_MAX + 1];
} suggest;

static void suggest_init(suggest *sg, const char *want)
{
    size_t len = strnlen(want, ENGRAM__SUGGEST_MAX);
    sg->want = want;
    sg->best = (len / 4 > 2 ? len / 4 : 2) + 1;
    sg->name[0] = '\0';
}

static void suggest_try(suggest *sg, const char *name)
{
    size_t d = edit_distance(sg->want, name, sg->best - 1);
    if (d < sg->best && strlen(name) <= ENGRAM__SUGGEST_MAX) {
        sg->best = d;
        snprintf(sg->name, sizeof sg->name, "%s", name);
    }
}

/* " (did you mean 'x'?)" into buf, or "" when nothing was close. */
static const char *suggest_text(const suggest *sg, char *buf, size_t cap)
{
    if (!sg->name[0])
        return "";
    snprintf(buf, cap, " (did you mean '%s'?)", sg->name);
    return buf;
}

/* The -ENOENT of a tensor missing from `what`, whose tensors are h's. */
static int no_tensor(const char *what, const char *tensor, const engram__st_header *h)
{
    suggest sg;
    char hint[ENGRAM__SUGGEST_MAX + 32];
    suggest_init(&sg, tensor);
    for (size_t i = 0; i < h->n; i++)
        suggest_try(&sg, h->t[i].name);
    return engram__err(-ENOENT, "%s: no tensor '%s'%s", what, tensor,
                       suggest_text(&sg, hint, sizeof hint));
}

/* ------------------------------------------------------------------------
 * Files and index files.
 */

/* Checks the checkpoint file open on fd (`what` in messages): a regular
 * file (not a FIFO, device, ...) that others cannot write.  *sb receives
 * its fstat. */
static int check_fd(int fd, const char *what, struct stat *sb)
{
    if (fstat(fd, sb) != 0)
        return engram__errno(errno, "fstat %s", what);
    if (!S_ISREG(sb->st_mode))
        return engram__err(ENGRAM_EUNSAFE, "%s is not a regular file", what);
    if (sb->st_mode & S_IWOTH)
        return engram__err(ENGRAM_EUNSAFE, "%s is writable by others (mode %03o)", what,
                           (unsigned)(sb->st_mode & 0777));
    return 0;
}

/* Opens a checkpoint file read-only: no link, a regular file, not
 * writable by others. */
static int open_checked(const char *path, struct stat *sb)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK), err;
    if (fd < 0) {
        err = errno;
        if (err == ELOOP)
            return engram__err(ENGRAM_EUNSAFE, "%s is a symbolic link; refusing to follow it",
                               path);
        if (err == ENOENT)
            return engram__err(-ENOENT, "%s does not exist", path);
        return engram__errno(err, "open %s", path);
    }
    if ((err = check_fd(fd, path, sb)) != 0)
        goto fail;
    if (fcntl(fd, F_SETFL, 0) != 0) {
        err = engram__errno(errno, "fcntl %s", path);
        goto fail;
    }
    return fd;
fail:
    close(fd);
    return err;
}

static int is_index(const char *path)
{
    size_t l = strlen(path);
    return l >= 5 && strcmp(path + l - 5, ".json") == 0;
}

/* Reads and parses the index file at `path`: *root (free it with
 * cJSON_Delete) and *map, its "weight_map" object. */
static int index_load(const char *path, cJSON **root, const cJSON **map)
{
    struct stat sb;
    char *buf = NULL;
    int fd, err = 0;

    *root = NULL;
    if ((fd = open_checked(path, &sb)) < 0)
        return fd;
    if ((uint64_t)sb.st_size > INDEX_MAX) {
        err = engram__err(ENGRAM_ECORRUPT, "%s: an index of %lld bytes is too large", path,
                          (long long)sb.st_size);
        goto out;
    }
    if (!(buf = malloc((size_t)sb.st_size + 1))) {
        err = engram__err(-ENOMEM, "out of memory reading %s", path);
        goto out;
    }
    if ((err = engram__st_read_at(fd, buf, (size_t)sb.st_size, 0)) != 0) {
        err = err == -ENODATA ? engram__err(ENGRAM_ECORRUPT, "%s changed while read", path)
                              : engram__errno(-err, "read %s", path);
        goto out;
    }
    if (engram__json_values_bound(buf, (size_t)sb.st_size) > ENGRAM__ST_VALUES_MAX) {
        err = engram__err(ENGRAM_ECORRUPT, "%s: the index holds more than %zu JSON values: "
                                           "refused before parsing",
                          path, ENGRAM__ST_VALUES_MAX);
        goto out;
    }
    *root = engram__json_parse(buf, (size_t)sb.st_size, NULL);
    *map = *root ? cJSON_GetObjectItemCaseSensitive(*root, "weight_map") : NULL;
    if (!cJSON_IsObject(*map)) {
        err = engram__err(ENGRAM_ECORRUPT, "%s: not JSON with a \"weight_map\" object", path);
        cJSON_Delete(*root);
        *root = NULL;
    }
out:
    free(buf);
    close(fd);
    return err;
}

/* Checks that entry v of the index at `path` names a shard as a plain
 * file name in the index's directory (never a path), at most cap - 1
 * bytes long; returns the name or NULL with ENGRAM_ECORRUPT recorded. */
static const char *index_shard(const char *path, const cJSON *v, size_t cap)
{
    if (!cJSON_IsString(v) || v->valuestring[0] == '\0' || v->valuestring[0] == '.' ||
        strchr(v->valuestring, '/') || strlen(v->valuestring) >= cap) {
        engram__err(ENGRAM_ECORRUPT, "%s: the shard of tensor '%.128s' is not a plain file "
                                     "name in the index's directory",
                    path, v->string);
        return NULL;
    }
    return v->valuestring;
}

/* The path of shard `shard` beside the index at `path`, in out[cap]. */
static int shard_path(const char *path, const char *shard, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    int n = slash ? snprintf(out, cap, "%.*s/%s", (int)(slash - path), path, shard)
                  : snprintf(out, cap, "%s", shard);
    if (n < 0 || (size_t)n >= cap)
        return engram__err(-ENAMETOOLONG, "%s: shard path too long", path);
    return 0;
}

/* Resolves `tensor` through the index file at `path` into the path of
 * its shard (same directory), in out[cap]; shard[] gets the bare name. */
static int index_resolve(const char *path, const char *tensor, char *out, size_t cap,
                         char *shard, size_t shard_cap)
{
    cJSON *root;
    const cJSON *map, *v;
    const char *sh;
    int err;

    if ((err = index_load(path, &root, &map)) != 0)
        return err;
    v = cJSON_GetObjectItemCaseSensitive(map, tensor);
    if (!v) {
        suggest sg;
        char hint[ENGRAM__SUGGEST_MAX + 32];
        suggest_init(&sg, tensor);
        cJSON_ArrayForEach(v, map) suggest_try(&sg, v->string);
        err = engram__err(-ENOENT, "%s: no tensor '%s' in the weight_map%s", path, tensor,
                          suggest_text(&sg, hint, sizeof hint));
        goto out;
    }
    if (!(sh = index_shard(path, v, shard_cap))) {
        err = ENGRAM_ECORRUPT;
        goto out;
    }
    snprintf(shard, shard_cap, "%s", sh);
    err = shard_path(path, sh, out, cap);
out:
    cJSON_Delete(root);
    return err;
}

/* Opens the file holding `tensor` (through an index if path is one),
 * parses its header and finds the tensor.  On success *fd is open. */
static int open_tensor(const char *path, const char *tensor, int *fd, struct stat *sb,
                       engram__st_header *h, const engram__st_tensor **t, char *shard,
                       size_t shard_cap)
{
    char file[4096];
    int err;
    *fd = -1;
    shard[0] = '\0';
    if (!tensor || !tensor[0])
        return engram__err(-EINVAL, "a tensor name is required");
    if (is_index(path)) {
        if ((err = index_resolve(path, tensor, file, sizeof file, shard, shard_cap)) != 0)
            return err;
        path = file;
    }
    if ((*fd = open_checked(path, sb)) < 0) {
        err = *fd;
        *fd = -1;
        return err;
    }
    if ((err = engram__st_read(*fd, (uint64_t)sb->st_size, path, h)) != 0)
        goto fail;
    if (!(*t = engram__st_find(h, tensor))) {
        err = no_tensor(path, tensor, h);
        engram__st_free(h);
        goto fail;
    }
    return 0;
fail:
    close(*fd);
    *fd = -1;
    return err;
}

/* Describes tensor t of header h, found in `shard` ("" for the file
 * itself), in *info. */
static void tensor_info(const engram__st_header *h, const engram__st_tensor *t,
                        const char *shard, engram_tensor_info *info)
{
    memset(info, 0, sizeof *info);
    info->size = sizeof *info;
    info->ndim = t->ndim;
    memcpy(info->dtype, t->dtype, sizeof info->dtype);
    info->elem_size = t->elem_size;
    memcpy(info->shape, t->shape, sizeof info->shape);
    info->offset = h->data_start + t->begin;
    info->nbytes = t->end - t->begin;
    /* Only the name: the rest of shard[] may not be initialised, and the
     * caller gets zeros after it (memset above), never our stack. */
    snprintf(info->shard, sizeof info->shard, "%s", shard);
}

int engram_safetensors_tensor(const char *path, const char *tensor, engram_tensor_info *info)
{
    engram__st_header h;
    const engram__st_tensor *t;
    struct stat sb;
    char shard[256];
    int fd, err;
    if (!path || !info || info->size != sizeof(engram_tensor_info))
        return engram__err(-EINVAL, "path and info (with size = sizeof(engram_tensor_info)) are "
                                    "required");
    if ((err = open_tensor(path, tensor, &fd, &sb, &h, &t, shard, sizeof shard)) != 0)
        return err;
    tensor_info(&h, t, shard, info);
    engram__st_free(&h);
    close(fd);
    return 0;
}

int engram_safetensors_tensor_fd(int fd, const char *what, const char *tensor,
                                 engram_tensor_info *info)
{
    engram__st_header h;
    const engram__st_tensor *t;
    struct stat sb;
    char name[32];
    int err;
    if (fd < 0 || !info || info->size != sizeof(engram_tensor_info))
        return engram__err(-EINVAL, "a descriptor and info (with size = "
                                    "sizeof(engram_tensor_info)) are required");
    if (!tensor || !tensor[0])
        return engram__err(-EINVAL, "a tensor name is required");
    if (!what) {
        snprintf(name, sizeof name, "descriptor %d", fd);
        what = name;
    }
    if ((err = check_fd(fd, what, &sb)) != 0 ||
        (err = engram__st_read(fd, (uint64_t)sb.st_size, what, &h)) != 0)
        return err;
    if (!(t = engram__st_find(&h, tensor))) {
        err = no_tensor(what, tensor, &h);
        engram__st_free(&h);
        return err;
    }
    tensor_info(&h, t, "", info);
    engram__st_free(&h);
    return 0;
}

/* A tensor of an index's weight_map: its name and its shard's. */
typedef struct index_entry {
    const char *name, *shard;
} index_entry;

static int cmp_entry(const void *a, const void *b)
{
    const index_entry *x = a, *y = b;
    int c = strcmp(x->shard, y->shard);
    return c ? c : strcmp(x->name, y->name);
}

/* engram_safetensors_list() of an index: the weight_map's tensors, shard
 * by shard, each shard's header read once. */
static int list_index(const char *path, engram_tensor_fn fn, void *ud)
{
    cJSON *root;
    const cJSON *map, *v;
    index_entry *e = NULL;
    size_t n = 0, i = 0;
    int err;

    if ((err = index_load(path, &root, &map)) != 0)
        return err;
    cJSON_ArrayForEach(v, map) n++;
    if (n && !(e = malloc(n * sizeof *e))) {
        err = engram__err(-ENOMEM, "%s: out of memory for %zu tensors", path, n);
        goto out;
    }
    cJSON_ArrayForEach(v, map)
    {
        if (!(e[i].shard = index_shard(path, v, sizeof ((engram_tensor_info *)0)->shard))) {
            err = ENGRAM_ECORRUPT;
            goto out;
        }
        e[i++].name = v->string;
    }
    qsort(e, n, sizeof *e, cmp_entry);
    for (i = 0; i < n && err == 0;) {
        engram__st_header h;
        struct stat sb;
        char file[4096];
        size_t j;
        int fd;
        if ((err = shard_path(path, e[i].shard, file, sizeof file)) != 0)
            break;
        if ((fd = open_checked(file, &sb)) < 0) {
            err = fd;
            break;
        }
        err = engram__st_read(fd, (uint64_t)sb.st_size, file, &h);
        close(fd);
        if (err)
            break;
        for (j = i; j < n && strcmp(e[j].shard, e[i].shard) == 0; j++) {
            const engram__st_tensor *t;
            engram_tensor_info info;
            if (err)
                continue;
            if (!(t = engram__st_find(&h, e[j].name))) {
                err = engram__err(ENGRAM_ECORRUPT, "%s: the index puts tensor '%.128s' in %s, "
                                                   "which has no such tensor",
                                  path, e[j].name, e[j].shard);
                continue;
            }
            tensor_info(&h, t, e[j].shard, &info);
            err = fn(ud, e[j].name, &info);
        }
        engram__st_free(&h);
        i = j;
    }
out:
    free(e);
    cJSON_Delete(root);
    return err;
}

int engram_safetensors_list(const char *path, engram_tensor_fn fn, void *ud)
{
    engram__st_header h;
    struct stat sb;
    int fd, err = 0;

    if (!path || !fn)
        return engram__err(-EINVAL, "path and fn are required");
    if (is_index(path))
        return list_index(path, fn, ud);
    if ((fd = open_checked(path, &sb)) < 0)
        return fd;
    err = engram__st_read(fd, (uint64_t)sb.st_size, path, &h);
    close(fd);
    if (err)
        return err;
    for (size_t i = 0; i < h.n && err == 0; i++) {
        engram_tensor_info info;
        tensor_info(&h, &h.t[i], "", &info);
        err = fn(ud, h.t[i].name, &info);
    }
    engram__st_free(&h);
    return err;
}

int engram_open_safetensors(engram_store *st, const char *name, const char *path,
                            const char *weight, const char *scale, uint64_t row_start,
                            uint64_t row_end, engram_table_id *id)
{
    engram__fseg segs[2];
    const char *tn[2] = {weight, scale};
    engram__store_ctx ctx;
    engram__source src;
    engram_table_spec spec = {0, 0, 0};
    uint64_t nrows = 0, row_bytes = 0;
    unsigned nseg = scale ? 2 : 1, opened = 0;
    int err = 0;

    if (!st || !path || !weight)
        return engram__err(-EINVAL, "store, path and weight tensor are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    for (unsigned g = 0; g < nseg; g++) {
        engram__st_header h;
        const engram__st_tensor *t;
        struct stat sb;
        char shard[256];
        uint64_t rb;
        int fd;
        if ((err = open_tensor(path, tn[g], &fd, &sb, &h, &t, shard, sizeof shard)) != 0)
            goto fail;
        if (t->ndim != 2 || t->shape[0] == 0 || t->shape[1] == 0 ||
            (g > 0 && t->shape[0] != nrows) ||
            engram__mul_u64(t->shape[1], t->elem_size, &rb) || rb > ENGRAM_ROW_BYTES_MAX) {
            err = engram__err(ENGRAM_ESPEC,
                              "%s: tensor '%s' has shape [%" PRIu64 "%s%" PRIu64 "%s] of %s; "
                              "expected [N, C] with N >= 1%s",
                              path, tn[g], t->ndim ? t->shape[0] : 0, t->ndim > 1 ? ", " : "",
                              t->ndim > 1 ? t->shape[1] : 0, t->ndim > 2 ? ", ..." : "",
                              t->dtype, g > 0 ? " equal to the weight's N" : "");
            engram__st_free(&h);
            close(fd);
            goto fail;
        }
        nrows = t->shape[0];
        segs[g].fd = fd;
        segs[g].stride = rb;
        segs[g].len = (uint32_t)rb;
        segs[g].base = h.data_start + t->begin;
        segs[g].file_size = (uint64_t)sb.st_size;
        row_bytes += rb;
        opened++;
        engram__st_free(&h);
    }
    if (row_end == 0)
        row_end = nrows;
    if (row_start >= row_end || row_end > nrows) {
        err = engram__err(ENGRAM_ESPEC, "%s: row range [%" PRIu64 ", %" PRIu64 ") is not within "
                                        "the %" PRIu64 " rows of '%s' (or is empty)",
                          path, row_start, row_end, nrows, weight);
        goto fail;
    }
    if (row_bytes > ENGRAM_ROW_BYTES_MAX) {
        err = engram__err(ENGRAM_ESPEC, "%s: rows of %" PRIu64 " bytes exceed the maximum",
                          path, row_bytes);
        goto fail;
    }
    for (unsigned g = 0; g < nseg; g++)
        segs[g].base += row_start * segs[g].stride;
    spec.num_rows = row_end - row_start;
    spec.row_bytes = (uint32_t)row_bytes;
    if ((err = engram_spec_check(&spec)) != 0)
        goto fail;
    /* A name already taken fails here, before the reader and the cache
     * are asked for anything, and a concurrent open of the same name waits
     * for this one (add_table checks again, under the lock). */
    if ((err = engram__store_claim(st, name)) != 0)
        goto fail;
    if ((err = engram__store_ctx_get(st, &ctx)) != 0) {
        engram__store_unclaim(st, name);
        goto fail;
    }
    opened = 0; /* filesrc_make consumes the descriptors */
    if ((err = engram__filesrc_make(&ctx, ENGRAM_TABLE_SAFETENSORS, name, segs, nseg,
                                    spec.num_rows, spec.num_rows * row_bytes, 0, NULL,
                                    &src)) == 0) {
        engram__filesrc_set_range(&src, row_start, nrows);
        if ((err = engram__store_add_table(st, name, &spec, &src, id)) != 0)
            engram__source_release(&src);
    }
    engram__store_unclaim(st, name);
    return err;
fail:
    for (unsigned g = 0; g < opened; g++)
        close(segs[g].fd);
    return err;
}
