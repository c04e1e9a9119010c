/*
 * cli_import.c - writing tables and `engram import`.
 *
 * cli_write_table() streams rows from a source (synthetic rows for create
 * and the demo, a file for import) into the store in fixed-size chunks, so
 * that tables larger than memory can be written.  import reads raw rows,
 * a .npy file of uint8 [N, R] (header parsed by npy.c), or a weight tensor
 * (and its scale tensor) of a safetensors checkpoint, which it verifies
 * after writing.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engram.h"
#include "cli.h"
#include "npy.h"

/* Rows are produced and consumed in chunks of about this many bytes, so
 * memory use stays flat whatever the table size. */
#define CHUNK_BYTES CLI_CHUNK_BYTES

/* ------------------------------------------------------------------------
 * Writing tables (create, import, demo).
 */

/* The row_source_fn of synthetic rows (ctx: a struct synth_source). */
int cli_synth_rows(void *ctx, unsigned char *buf, uint64_t first, uint64_t n)
{
    const struct synth_source *s = ctx;
    for (uint64_t i = 0; i < n; i++)
        cli_fill_row(buf + i * s->row_bytes, s->fill, s->seed, first + i, s->row_bytes);
    return 0;
}

struct file_source {
    int fd;
    const char *path;
    uint64_t data_offset;
    uint32_t row_bytes;
};

static int file_rows(void *ctx, unsigned char *buf, uint64_t first, uint64_t n)
{
    const struct file_source *s = ctx;
    size_t want = (size_t)(n * s->row_bytes);
    size_t got = 0;
    off_t off = (off_t)(s->data_offset + first * s->row_bytes);

    while (got < want) {
        ssize_t r = pread(s->fd, buf + got, want - got, off + (off_t)got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return cli_fail("read '%s': %s", s->path, strerror(errno));
        }
        if (r == 0)
            return cli_fail("read '%s': the file shrank while it was being imported", s->path);
        got += (size_t)r;
    }
    return 0;
}

/* Streams a table into the store in chunks of about CHUNK_BYTES.  The
 * writer publishes nothing unless every row arrived.  total_rows > 0
 * records that the table holds rows [row_start, row_start + num_rows) of
 * a tensor of total_rows rows (engram_writer_set_range). */
int cli_write_table_range(engram_store *st, const char *verb, const char *name,
                          const engram_table_spec *spec, uint64_t row_start, uint64_t total_rows,
                          row_source_fn src, void *ctx)
{
    engram_writer *w = NULL;
    unsigned char *buf = NULL;
    uint64_t chunk_rows = CHUNK_BYTES / spec->row_bytes;
    struct progress pr;
    char label[ENGRAM_NAME_MAX + 32];
    int rc, status = 0;

    if (chunk_rows == 0)
        chunk_rows = 1;
    if (chunk_rows > spec->num_rows)
        chunk_rows = spec->num_rows;
    buf = malloc((size_t)(chunk_rows * spec->row_bytes));
    if (!buf)
        return cli_fail("%s '%s': out of memory for a %" PRIu64 "-row buffer", verb, name,
                        chunk_rows);
    snprintf(label, sizeof(label), "%s %s", verb, name);
    cli_progress_init(&pr, label);

    rc = engram_writer_begin(st, name, spec, &w);
    if (rc == 0 && total_rows)
        rc = engram_writer_set_range(w, row_start, total_rows);
    if (rc != 0) {
        status = cli_lib_fail(rc, "%s '%s'", verb, name);
        goto out;
    }
    for (uint64_t r = 0; r < spec->num_rows; r += chunk_rows) {
        uint64_t n = spec->num_rows - r < chunk_rows ? spec->num_rows - r : chunk_rows;
        if (cli_interrupted) {
            status = cli_fail("%s '%s': interrupted", verb, name);
            goto out;
        }
        status = src(ctx, buf, r, n);
        if (status != 0)
            goto out;
        rc = engram_writer_append(w, buf, n, 0);
        if (rc != 0) {
            status = cli_lib_fail(rc, "%s '%s': append rows %" PRIu64 "..%" PRIu64, verb, name, r,
                                  r + n - 1);
            goto out;
        }
        /* In bytes, which the rate and time left are told in. */
        cli_progress_cb(&pr, (r + n) * spec->row_bytes, spec->num_rows * spec->row_bytes);
    }
    cli_progress_end(&pr);
    rc = engram_writer_commit(w);
    w = NULL; /* commit always frees the writer */
    if (rc != 0)
        status = cli_lib_fail(rc, "%s '%s': commit", verb, name);
out:
    cli_progress_end(&pr);
    engram_writer_abort(w);
    free(buf);
    return status;
}

/* cli_write_table_range() without a range. */
int cli_write_table(engram_store *st, const char *verb, const char *name,
                    const engram_table_spec *spec, row_source_fn src, void *ctx)
{
    return cli_write_table_range(st, verb, name, spec, 0, 0, src, ctx);
}

/* Reads --row-bytes/--pitch shared by create and import. */
int cli_read_pitch(const struct cli *cli, engram_table_spec *spec)
{
    uint64_t pitch = 0;
    int st = cli_opt_u64(cli, OPT_PITCH, 0, ENGRAM_ROW_BYTES_MAX, &pitch);
    spec->row_pitch = (uint32_t)pitch;
    return st;
}

/* ------------------------------------------------------------------------
 * import: raw rows or a .npy file of uint8 [N, R].
 */
/* Reads exactly len bytes at off, or fails (a short file is an error). */
static int pread_full(int fd, void *buf, size_t len, off_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, off + (off_t)got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -ENODATA;
        got += (size_t)r;
    }
    return 0;
}

/* Reads up to len bytes at off and returns how many arrived: fewer than
 * len at the end of the file or on a read error. */
static size_t pread_upto(int fd, void *buf, size_t len, off_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

/* Reads the preamble and header of the .npy file at fd (of file_size
 * bytes) and parses them with npy_parse().  A short or failed read is not
 * reported here: npy_parse() is handed the bytes that did arrive and says
 * "truncated .npy preamble" or "cannot read the .npy header", whichever
 * part is missing. */
static int npy_read_header(int fd, uint64_t file_size, struct npy_info *info, char *err,
                           size_t errlen)
{
    size_t want = file_size < NPY_PARSE_MAX ? (size_t)file_size : NPY_PARSE_MAX;
    unsigned char *h;
    int rc;

    h = malloc(want ? want : 1);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    rc = npy_parse(h, pread_upto(fd, h, want, 0), file_size, info, err, errlen);
    free(h);
    return rc;
}

/* The row_source_fn of checkpoint rows (ctx: a struct cli_st_source): row
 * i is row i of the imported range of each tensor, packed.  s->tmp holds
 * CLI_ST_TMP_BYTES. */
int cli_st_rows(void *ctx, unsigned char *buf, uint64_t first, uint64_t n)
{
    struct cli_st_source *s = ctx;
    uint32_t row = s->len[0] + (s->n > 1 ? s->len[1] : 0), at = 0;
    for (unsigned g = 0; g < s->n; g++) {
        /* One sequential read per tensor and chunk, then interleave. */
        int rc = pread_full(s->fd[g], s->tmp, (size_t)(n * s->len[g]),
                            (off_t)(s->off[g] + first * s->len[g]));
        if (rc != 0)
            return cli_fail("read '%s': %s", s->path,
                            rc == -ENODATA ? "the file ended early" : strerror(-rc));
        for (uint64_t i = 0; i < n; i++)
            memcpy(buf + i * row + at, s->tmp + i * s->len[g], s->len[g]);
        at += s->len[g];
    }
    return 0;
}

/* Parses "START:END" (END may be empty: to the end). */
static int parse_range(const char *v, uint64_t *a, uint64_t *b)
{
    const char *colon = strchr(v, ':');
    char head[32];
    if (!colon || (size_t)(colon - v) >= sizeof head)
        return -1;
    memcpy(head, v, (size_t)(colon - v));
    head[colon - v] = '\0';
    if (cli_parse_u64(head, a) != 0)
        return -1;
    if (colon[1] == '\0') {
        *b = 0;
        return 0;
    }
    return cli_parse_u64(colon + 1, b);
}

/* Describes tensor `tn` of checkpoint `path` in *ti from the descriptor of
 * the file that holds it (the shard an index names, or the file itself),
 * which it opens once, read-only, into *fd, unless that file is `prev`,
 * already open on *fd (the weight's file, for a scale in the same file).
 * The rows are then read from the very file whose header was checked:
 * opening the path a second time after a check could open another file
 * put there meanwhile, or block on a FIFO.  O_NONBLOCK keeps the open
 * itself from blocking, and the library refuses anything but a regular
 * file.  file[cap] receives the file's path.  Returns 0, or an exit
 * status after reporting (*fd is then -1 if it was opened here). */
int cli_open_tensor_file(const char *name, const char *path, const char *tn,
                         engram_tensor_info *ti, const char *prev, char *file, size_t cap,
                         int *fd)
{
    const char *slash = strrchr(path, '/');
    size_t len = strlen(path);
    int rc;

    snprintf(file, cap, "%s", path);
    /* An index (the library's rule: a name ending in .json) names the
     * shard; only the name is taken from this first look. */
    if (len >= 5 && strcmp(path + len - 5, ".json") == 0) {
        if ((rc = engram_safetensors_tensor(path, tn, ti)) != 0)
            return cli_lib_fail(rc, "import '%s': tensor '%s' of '%s'", name, tn, path);
        if (slash)
            snprintf(file, cap, "%.*s/%s", (int)(slash - path), path, ti->shard);
        else
            snprintf(file, cap, "%s", ti->shard);
    }
    if (!prev || strcmp(prev, file) != 0) {
        *fd = open(file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (*fd < 0)
            return cli_fail("import '%s': open '%s': %s", name, file,
                            errno == ELOOP ? "a symbolic link; refusing to follow it"
                                           : strerror(errno));
    }
    if ((rc = engram_safetensors_tensor_fd(*fd, file, tn, ti)) != 0)
        return cli_lib_fail(rc, "import '%s': tensor '%s' of '%s'", name, tn, path);
    return 0;
}

/* Checks a table just written from `src`: its checksum (what reached the
 * disk) and 1024 rows (the first, the last and random ones) read back
 * through a lookup against the source's bytes.  0, or an exit status
 * after reporting. */
int cli_verify_rows(engram_store *st, const char *verb, const char *name,
                    const engram_table_spec *spec, row_source_fn src, void *ctx)
{
    struct progress pr;
    engram_table_id tid;
    int64_t ids[1024];
    size_t row = spec->row_bytes;
    unsigned char *got = malloc(1024 * row), *want = malloc(row);
    uint64_t seed = 12345;
    int status = 0, rc;

    cli_progress_init(&pr, "verify");
    rc = engram_verify(st, name, cli_progress_cb, &pr);
    cli_progress_end(&pr);
    if (rc != 0) {
        status = cli_lib_fail(rc, "%s '%s': verify", verb, name);
        goto out;
    }
    if (!got || !want) {
        status = cli_fail("%s '%s': out of memory", verb, name);
        goto out;
    }
    if ((rc = engram_table_open(st, name, &tid)) != 0) {
        status = cli_lib_fail(rc, "%s '%s': open", verb, name);
        goto out;
    }
    for (int i = 0; i < 1024; i++)
        ids[i] = (int64_t)(i == 0 ? 0 : i == 1 ? spec->num_rows - 1
                                               : cli_rng_next(&seed) % spec->num_rows);
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.num_tokens = 1024;
    a.num_cols = 1;
    a.tables = &tid;
    a.ids = ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = got;
    if ((rc = engram_lookup(st, &a)) != 0)
        status = cli_lib_fail(rc, "%s '%s': read back", verb, name);
    for (int i = 0; i < 1024 && status == 0; i++) {
        if ((status = src(ctx, want, (uint64_t)ids[i], 1)) != 0)
            break;
        if (memcmp(want, got + (size_t)i * row, row) != 0)
            status = cli_fail("%s '%s': row %" PRId64 " read back differs from the "
                              "checkpoint", verb, name, ids[i]);
    }
out:
    free(got);
    free(want);
    return status;
}

static int import_safetensors(struct cli *cli)
{
    const char *name = cli->args[0], *path = cli->opt[OPT_SAFETENSORS];
    const char *tn[2] = {cli->opt[OPT_WEIGHT], cli->opt[OPT_SCALE]};
    engram_tensor_info ti[2] = {ENGRAM_TENSOR_INFO_INIT, ENGRAM_TENSOR_INFO_INIT};
    struct cli_st_source src = {{-1, -1}, {0, 0}, {0, 0}, 0, NULL, path};
    engram_table_spec spec = {0, 0, 0};
    uint64_t start = 0, end = 0, nrows = 0, row = 0;
    engram_store *st = NULL;
    char file[2][4096];
    int status, made = 0;

    if (!tn[0])
        return cli_usage_error(cli, "--safetensors needs --weight NAME");
    if (cli->nargs != 1)
        return cli_usage_error(cli, "with --safetensors, give only the table name");
    if (cli->opt[OPT_ROW_BYTES])
        return cli_usage_error(cli, "--row-bytes does not apply to --safetensors");
    if ((status = cli_check_name(cli, name)) != 0)
        return status;
    if ((status = cli_read_pitch(cli, &spec)) != 0)
        return status;
    if (cli->opt[OPT_ROWS] && parse_range(cli->opt[OPT_ROWS], &start, &end) != 0)
        return cli_usage_error(cli, "--rows: '%s' is not START:END", cli->opt[OPT_ROWS]);
    src.n = tn[1] ? 2 : 1;
    for (unsigned g = 0; g < src.n; g++) {
        uint64_t rb;
        /* The scale in the weight's file is read from the weight's
         * descriptor (one open of each file). */
        if (g == 1)
            src.fd[1] = src.fd[0];
        if ((status = cli_open_tensor_file(name, path, tn[g], &ti[g], g ? file[0] : NULL,
                                           file[g], sizeof file[g], &src.fd[g])) != 0)
            goto out;
        if ((status = cli_check_rows_tensor(name, tn[g], &ti[g], g ? tn[0] : NULL,
                                            g ? &ti[0] : NULL, &rb)) != 0)
            goto out;
        nrows = ti[g].shape[0];
        src.len[g] = (uint32_t)rb;
        row += rb;
    }
    if (end == 0)
        end = nrows;
    if (start >= end || end > nrows) {
        status = cli_fail("import '%s': --rows %" PRIu64 ":%" PRIu64 " is not within the %" PRIu64
                          " rows of '%s'", name, start, end, nrows, tn[0]);
        goto out;
    }
    for (unsigned g = 0; g < src.n; g++)
        src.off[g] = ti[g].offset + start * src.len[g];
    spec.num_rows = end - start;
    spec.row_bytes = (uint32_t)row;
    if (row > ENGRAM_ROW_BYTES_MAX || engram_spec_check(&spec) != 0) {
        status = cli_lib_fail(ENGRAM_ESPEC, "import '%s': rows of %" PRIu64 " bytes", name, row);
        goto out;
    }
    if (!(src.tmp = malloc(CLI_ST_TMP_BYTES))) {
        status = cli_fail("import '%s': out of memory", name);
        goto out;
    }
    if (cli_open_for_write(cli, &st, &made, &status) != 0)
        goto out;
    /* The writer syncs the file before it publishes it.  A part of the
     * tensor records where it lies in it, so that its global ids can be
     * looked up with the right offset (the whole tensor records nothing:
     * the same file as before ranges existed). */
    if ((status = cli_write_table_range(st, "import", name, &spec, start,
                                        start != 0 || end != nrows ? nrows : 0, cli_st_rows,
                                        &src)) != 0)
        goto out;
    status = cli_verify_rows(st, "import", name, &spec, cli_st_rows, &src);
    if (status == 0)
        printf("imported %s: %" PRIu64 " rows of %" PRIu64 " bytes from %s (%s%s%s), "
               "verified\n", name, spec.num_rows, row, path, tn[0], tn[1] ? " + " : "",
               tn[1] ? tn[1] : "");
    if (status == 0 && (start != 0 || end != nrows))
        printf("  rows %" PRIu64 "..%" PRIu64 " of %" PRIu64 ": global id = row + %" PRIu64
               " (look up with offset %" PRIu64 ")\n",
               start, end - 1, nrows, start, start);
out:
    cli_close_written(cli, st, made, status);
    if (src.fd[0] >= 0)
        close(src.fd[0]);
    if (src.fd[1] >= 0 && src.fd[1] != src.fd[0])
        close(src.fd[1]);
    free(src.tmp);
    return status;
}

int cli_cmd_import(struct cli *cli)
{
    const char *name = cli->nargs > 0 ? cli->args[0] : NULL;
    const char *path = cli->nargs > 1 ? cli->args[1] : NULL;
    engram_table_spec spec = {0, 0, 0};
    struct file_source src;
    uint64_t row_bytes = 0, file_size;
    unsigned char magic[6];
    engram_store *st = NULL;
    struct stat sb;
    int fd = -1, status, is_npy = 0, made = 0;

    if (cli->opt[OPT_LAYERS])
        return cli_import_layers(cli);
    if (cli->opt[OPT_HEAD_VOCAB] || cli->opt[OPT_LAYER_IDS])
        return cli_usage_error(cli, "--head-vocab and --layer-ids go with --layers");
    if (cli->nargs == 0)
        return cli_usage_error(cli, "missing arguments; usage: engram %s", cli->cmd->synopsis);
    if (cli->opt[OPT_SAFETENSORS])
        return import_safetensors(cli);
    if (cli->opt[OPT_WEIGHT] || cli->opt[OPT_SCALE] || cli->opt[OPT_ROWS])
        return cli_usage_error(cli, "--weight, --scale and --rows go with --safetensors");
    if (!path)
        return cli_usage_error(cli, "missing FILE; usage: engram %s", cli->cmd->synopsis);
    if ((status = cli_check_name(cli, name)) != 0)
        return status;
    if ((status = cli_opt_u64(cli, OPT_ROW_BYTES, 1, ENGRAM_ROW_BYTES_MAX, &row_bytes)) != 0)
        return status;
    if ((status = cli_read_pitch(cli, &spec)) != 0)
        return status;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cli_fail("import '%s': open '%s': %s", name, path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        status = cli_fail("import '%s': stat '%s': %s", name, path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        status = cli_fail("import '%s': '%s' is not a regular file", name, path);
        goto out;
    }
    file_size = (uint64_t)sb.st_size;
    is_npy = file_size >= 6 && pread_full(fd, magic, 6, 0) == 0 &&
             memcmp(magic, "\x93NUMPY", 6) == 0;

    src.fd = fd;
    src.path = path;
    if (is_npy) {
        struct npy_info info;
        char err[512];
        if (npy_read_header(fd, file_size, &info, err, sizeof(err)) != 0) {
            status = cli_fail("import '%s': '%s': %s", name, path, err);
            goto out;
        }
        if (info.cols > ENGRAM_ROW_BYTES_MAX) {
            status = cli_fail("import '%s': '%s': rows of %" PRIu64 " bytes exceed the %u-byte "
                              "maximum", name, path, info.cols, ENGRAM_ROW_BYTES_MAX);
            goto out;
        }
        if (row_bytes != 0 && row_bytes != info.cols) {
            status = cli_fail("import '%s': '%s' holds rows of %" PRIu64 " bytes, not the %" PRIu64
                              " given by --row-bytes", name, path, info.cols, row_bytes);
            goto out;
        }
        spec.num_rows = info.rows;
        spec.row_bytes = (uint32_t)info.cols;
        src.data_offset = info.data_offset;
    } else {
        if (row_bytes == 0) {
            status = cli_usage_error(cli, "'%s' is not an .npy file; raw files need --row-bytes",
                                     path);
            goto out;
        }
        if (file_size == 0) {
            status = cli_fail("import '%s': '%s' is empty", name, path);
            goto out;
        }
        if (file_size % row_bytes != 0) {
            status = cli_fail("import '%s': the size of '%s' (%" PRIu64 " bytes) is not a multiple "
                              "of the row size (%" PRIu64 " bytes)", name, path, file_size,
                              row_bytes);
            goto out;
        }
        spec.num_rows = file_size / row_bytes;
        spec.row_bytes = (uint32_t)row_bytes;
        src.data_offset = 0;
    }
    src.row_bytes = spec.row_bytes;
    if (engram_spec_check(&spec) != 0) {
        status = cli_lib_fail(ENGRAM_ESPEC, "import '%s': '%s'", name, path);
        goto out;
    }
    if (cli_open_for_write(cli, &st, &made, &status) != 0)
        goto out;
    status = cli_write_table(st, "import", name, &spec, file_rows, &src);
    if (status == 0)
        printf("imported %s: %" PRIu64 " rows of %" PRIu32 " bytes from %s\n", name,
               spec.num_rows, spec.row_bytes, path);
out:
    cli_close_written(cli, st, made, status);
    if (fd >= 0)
        close(fd);
    return status;
}
