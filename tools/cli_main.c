/*
 * cli_main.c - main(), the command table, argument parsing and help of the
 * `engram` command-line tool.  See cli.h for what the other files hold.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "cli.h"
#include "npy.h"

/* ------------------------------------------------------------------------
 * Small helpers: errors, numbers, sizes, time.
 */

static void on_signal(int sig)
{
    (void)sig;
    cli_interrupted = 1;
}

/* ------------------------------------------------------------------------
 * Command-line parsing.
 */
static const struct opt_def {
    const char *name;
    int has_arg;
} opt_defs[OPT_COUNT] = {
    [OPT_ROOT] = {"root", 1},      [OPT_NS] = {"ns", 1},
    [OPT_HELP] = {"help", 0},      [OPT_ROWS] = {"rows", 1},
    [OPT_ROW_BYTES] = {"row-bytes", 1}, [OPT_PITCH] = {"pitch", 1},
    [OPT_FILL] = {"fill", 1},      [OPT_SEED] = {"seed", 1},
    [OPT_JSON] = {"json", 0},      [OPT_MAP] = {"map", 0},
    [OPT_ALL] = {"all", 0},        [OPT_OFFSET] = {"offset", 1},
    [OPT_ZERO_DEAD] = {"zero-dead", 0}, [OPT_IDS] = {"ids", 1},
    [OPT_ITERS] = {"iters", 1},    [OPT_THREADS] = {"threads", 1},
    [OPT_COLS] = {"cols", 1},      [OPT_HUGE] = {"huge", 0},
    [OPT_SMALL] = {"small", 0},    [OPT_TOKENS] = {"tokens", 1},
    [OPT_KEEP] = {"keep", 0},
    [OPT_SAFETENSORS] = {"safetensors", 1}, [OPT_WEIGHT] = {"weight", 1},
    [OPT_SCALE] = {"scale", 1},
};

#define O(x) (1u << OPT_##x)
#define GLOBAL_OPTS (O(ROOT) | O(NS) | O(HELP))

/* Prints a usage error for the current command and returns 2. */
int cli_usage_error(const struct cli *cli, const char *fmt, ...)
{
    va_list ap;
    fputs("engram: ", stderr);
    if (cli->cmd)
        fprintf(stderr, "%s: ", cli->cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (cli->cmd)
        fprintf(stderr, "\nTry 'engram %s --help'.\n", cli->cmd->name);
    else
        fputs("\nTry 'engram --help'.\n", stderr);
    return EXIT_USAGE;
}

/* Reads an unsigned option into *out (left alone when the option is
 * absent), checking [min, max].  Returns 0 or the usage exit status. */
int cli_opt_u64(const struct cli *cli, int id, uint64_t min, uint64_t max, uint64_t *out)
{
    const char *s = cli->opt[id];
    uint64_t v;

    if (!s)
        return 0;
    if (cli_parse_u64(s, &v) != 0)
        return cli_usage_error(cli, "--%s: '%s' is not a non-negative decimal integer",
                               opt_defs[id].name, s);
    if (v < min || v > max)
        return cli_usage_error(cli, "--%s: %" PRIu64 " is outside [%" PRIu64 ", %" PRIu64 "]",
                               opt_defs[id].name, v, min, max);
    *out = v;
    return 0;
}

/* Checks a table name before any store is opened, as a usage error. */
int cli_check_name(const struct cli *cli, const char *name)
{
    int rc = engram_name_check(name);
    if (rc != 0)
        return cli_usage_error(cli, "invalid table name '%s': %s", name, cli_lib_detail(rc));
    return 0;
}

/* ------------------------------------------------------------------------
 * demo: one DeepSeek-shaped Engram layer, end to end.
 */
static void print_stats(engram_store *st)
{
    engram_stats s = ENGRAM_STATS_INIT;
    char copied[32], mapped[32];
    int rc = engram_store_stats(st, &s);

    if (rc != 0) {
        cli_lib_fail(rc, "store stats");
        return;
    }
    printf("store stats: %" PRIu32 " gather threads, %" PRIu64 " lookups (%" PRIu64
           " failed, %" PRIu64 " split across threads), %" PRIu64 " rows + %" PRIu64
           " dead, %s copied, %" PRIu64 " tables open, %s mapped\n",
           s.threads, s.lookups, s.failed, s.parallel, s.rows, s.dead_rows,
           cli_fmt_bytes(s.bytes, copied, sizeof(copied)), s.tables_open,
           cli_fmt_bytes(s.mapped_bytes, mapped, sizeof(mapped)));
}

#define DEMO_COLS 24
#define DEMO_ROW_BYTES 264
#define DEMO_SENTINEL 0xA5
#define DEMO_RING 4

struct demo {
    engram_store *st;
    char names[DEMO_COLS][32];
    uint64_t rows[DEMO_COLS];
    int64_t offsets[DEMO_COLS];
    engram_table_id ids[DEMO_COLS];
    int created[DEMO_COLS];
    const unsigned char *base[DEMO_COLS]; /* baseline's own mapping of the rows */
    void *map[DEMO_COLS];
    size_t map_len[DEMO_COLS];
    uint32_t pitch[DEMO_COLS];
    unsigned char expect[DEMO_ROW_BYTES];
};

static int is_prime(uint64_t n)
{
    if (n < 2)
        return 0;
    for (uint64_t d = 2; d * d <= n; d++)
        if (n % d == 0)
            return 0;
    return 1;
}

/* The naive baseline: one bounds check and one memcpy per row, reading the
 * rows through the demo's own read-only mapping of each table file. */
struct naive_op {
    const struct demo *d;
    const int64_t *ids; /* DEMO_RING batches of T x K */
    size_t T;
    unsigned char *out;
};

static int naive_gather(const struct demo *d, const int64_t *ids, size_t T, unsigned char *out)
{
    for (size_t t = 0; t < T; t++) {
        for (size_t k = 0; k < DEMO_COLS; k++) {
            int64_t id = ids[t * DEMO_COLS + k], r;
            if (id == ENGRAM_DEAD_ID)
                continue;
            r = id - d->offsets[k];
            if (r < 0 || (uint64_t)r >= d->rows[k])
                return cli_fail("demo: baseline: id %" PRId64 " outside column %zu", id, k);
            memcpy(out + (t * DEMO_COLS + k) * DEMO_ROW_BYTES,
                   d->base[k] + (uint64_t)r * d->pitch[k], DEMO_ROW_BYTES);
        }
    }
    return 0;
}

static int naive_op_run(void *ctx, size_t iter)
{
    const struct naive_op *o = ctx;
    return naive_gather(o->d, o->ids + (iter % DEMO_RING) * o->T * DEMO_COLS, o->T, o->out);
}

/* Checks `nsamples` positions of a gathered batch (all of them when the
 * batch is smaller) against the pattern; with `dead_untouched`, dead rows
 * must still hold the sentinel.  Fails loudly on the first wrong byte. */
static int demo_check(struct demo *d, const char *who, size_t T, const int64_t *ids,
                      const unsigned char *out, size_t nsamples, uint64_t *rng, int dead_untouched)
{
    size_t total = T * DEMO_COLS;
    int all = nsamples >= total;

    for (size_t s = 0; s < (all ? total : nsamples); s++) {
        size_t pos = all ? s : (size_t)(cli_rng_next(rng) % total);
        size_t k = pos % DEMO_COLS;
        const unsigned char *row = out + pos * DEMO_ROW_BYTES;
        int64_t id = ids[pos];
        uint64_t local;

        if (id == ENGRAM_DEAD_ID) {
            if (!dead_untouched)
                continue;
            for (size_t j = 0; j < DEMO_ROW_BYTES; j++) {
                if (row[j] != DEMO_SENTINEL)
                    return cli_fail("demo: DATA ERROR: %s wrote byte %zu of the dead row at "
                                    "token %zu column %zu (0x%02x, expected it untouched: "
                                    "0x%02x)", who, j, pos / DEMO_COLS, k, row[j], DEMO_SENTINEL);
            }
            continue;
        }
        local = (uint64_t)(id - d->offsets[k]);
        cli_fill_row(d->expect, FILL_PATTERN, k + 1, local, DEMO_ROW_BYTES);
        if (memcmp(row, d->expect, DEMO_ROW_BYTES) != 0) {
            size_t j = 0;
            while (row[j] == d->expect[j])
                j++;
            return cli_fail("demo: DATA ERROR: %s returned wrong bytes for token %zu column %zu "
                            "(table '%s', id %" PRId64 ", row %" PRIu64 "): byte %zu is 0x%02x, "
                            "expected 0x%02x", who, pos / DEMO_COLS, k, d->names[k], id, local, j,
                            row[j], d->expect[j]);
        }
    }
    return 0;
}

/* Measures one T: engram lookup against the naive baseline, with checks of
 * both outputs before and after timing. */
static int demo_round(struct demo *d, size_t T, uint64_t fixed_iters, uint64_t budget_ns,
                      uint64_t *rng)
{
    size_t n = T * DEMO_COLS, live = 0;
    size_t out_bytes = n * DEMO_ROW_BYTES;
    int64_t *ids = malloc(DEMO_RING * n * sizeof(*ids));
    unsigned char *out = malloc(out_bytes), *ref = malloc(out_bytes);
    engram_lookup_args args[DEMO_RING];
    struct timing te = {0, 0, 0, 0}, tb = {0, 0, 0, 0};
    char m1[32], p1[32], m2[32], p2[32];
    int status = 0, rc;

    if (!ids || !out || !ref) {
        status = cli_fail("demo: out of memory for T = %zu", T);
        goto out;
    }
    /* Decode-shaped ids: per column a uniform global id (table-local row
     * plus the column's prefix-sum offset), ~1% DEAD_ID padding. */
    for (size_t r = 0; r < DEMO_RING; r++) {
        for (size_t i = 0; i < n; i++) {
            size_t k = i % DEMO_COLS;
            int64_t *id = &ids[r * n + i];
            if (cli_rng_next(rng) % 100 == 0) {
                *id = ENGRAM_DEAD_ID;
            } else {
                *id = d->offsets[k] + (int64_t)(cli_rng_next(rng) % d->rows[k]);
                if (r == 0)
                    live++;
            }
        }
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        a.num_tokens = T;
        a.num_cols = DEMO_COLS;
        a.tables = d->ids;
        a.offsets = d->offsets;
        a.ids = ids + r * n;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        args[r] = a;
    }

    /* Correctness first: both gathers of batch 0 into sentinel-filled
     * buffers must agree byte for byte, match the pattern, and leave dead
     * rows untouched. */
    memset(out, DEMO_SENTINEL, out_bytes);
    memset(ref, DEMO_SENTINEL, out_bytes);
    rc = engram_lookup(d->st, &args[0]);
    if (rc != 0) {
        status = cli_lib_fail(rc, "demo: lookup T=%zu", T);
        goto out;
    }
    if ((status = naive_gather(d, ids, T, ref)) != 0 ||
        (status = demo_check(d, "engram_lookup", T, ids, out, 4096, rng, 1)) != 0 ||
        (status = demo_check(d, "the baseline", T, ids, ref, 4096, rng, 1)) != 0)
        goto out;
    if (memcmp(out, ref, out_bytes) != 0) {
        status = cli_fail("demo: DATA ERROR: engram_lookup and the baseline disagree for "
                          "T = %zu", T);
        goto out;
    }

    {
        struct lookup_op lo = {d->st, args, DEMO_RING, "demo: lookup"};
        struct naive_op no = {d, ids, T, ref};
        if ((status = cli_measure(cli_lookup_op_run, &lo, (size_t)fixed_iters, budget_ns, 100000,
                                  &te)) != 0 ||
            (status = cli_measure(naive_op_run, &no, (size_t)fixed_iters, budget_ns, 100000,
                                  &tb)) != 0)
            goto out;
    }
    /* The timed calls rotate over the ring; re-check the last batch each
     * wrote, so a fault that only shows under load is still caught. */
    {
        size_t last_e = (te.iters + 1) % DEMO_RING, last_b = (tb.iters + 1) % DEMO_RING;
        if ((status = demo_check(d, "engram_lookup (timed)", T, ids + last_e * n, out, 4096, rng,
                                 0)) != 0 ||
            (status = demo_check(d, "the baseline (timed)", T, ids + last_b * n, ref, 4096, rng,
                                 0)) != 0)
            goto out;
    }
    {
        double re = cli_per_second(live, &te), rb = cli_per_second(live, &tb);
        printf("%6zu %7zu | %6zu %9s %9s %10.3g | %6zu %9s %9s %10.3g | %6.2fx\n", T, n,
               te.iters, cli_fmt_ns((double)te.median_ns, m1, sizeof(m1)),
               cli_fmt_ns((double)te.p99_ns, p1, sizeof(p1)), re, tb.iters,
               cli_fmt_ns((double)tb.median_ns, m2, sizeof(m2)),
               cli_fmt_ns((double)tb.p99_ns, p2, sizeof(p2)), rb, cli_ratio(re, rb));
        fflush(stdout);
    }
out:
    free(ids);
    free(out);
    free(ref);
    return status;
}

static int cmd_demo(struct cli *cli)
{
    int small = cli->opt[OPT_SMALL] != NULL, keep = cli->opt[OPT_KEEP] != NULL;
    uint64_t tokens = 256, iters = 0, threads = 0, total_bytes, base_rows, data_bytes = 0;
    uint64_t budget_ns, rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
    size_t sweep[5] = {1, 16, 256, 4096, 0}, nsweep = 4;
    struct demo *d = calloc(1, sizeof(*d));
    char nsbuf[64], nspath[PATH_MAX * 2], sz[32];
    const char *root = cli_root(cli);
    int status = 0, rc, ns_created = 0;
    struct sigaction sa, old_int, old_term;
    struct stat sb;
    uint64_t t0;

    if (!d)
        return cli_fail("demo: out of memory");
    if ((status = cli_opt_u64(cli, OPT_TOKENS, 1, 16384, &tokens)) != 0 ||
        (status = cli_opt_u64(cli, OPT_ITERS, 1, 100000, &iters)) != 0 ||
        (status = cli_opt_u64(cli, OPT_THREADS, 0, 1024, &threads)) != 0) {
        free(d);
        return status;
    }
    /* --tokens adds a batch size to the standard decode sweep. */
    if (tokens != 1 && tokens != 16 && tokens != 256 && tokens != 4096) {
        size_t i = nsweep++;
        while (i > 0 && sweep[i - 1] > tokens) {
            sweep[i] = sweep[i - 1];
            i--;
        }
        sweep[i] = (size_t)tokens;
    }
    /* A fresh namespace per run unless one is named, so that the demo never
     * touches existing tables. */
    if (cli->opt[OPT_NS]) {
        snprintf(nsbuf, sizeof(nsbuf), "%s", cli->ns);
    } else {
        snprintf(nsbuf, sizeof(nsbuf), "demo-%ld", (long)getpid());
        cli->ns = nsbuf;
    }
    snprintf(nspath, sizeof(nspath), "%s/%s", root, cli->ns);
    ns_created = stat(nspath, &sb) != 0 && errno == ENOENT;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    total_bytes = small ? (uint64_t)64 << 20 : (uint64_t)1 << 30;
    budget_ns = small ? 100000000u : 400000000u;
    base_rows = total_bytes / ((uint64_t)DEMO_COLS * DEMO_ROW_BYTES);

    if (cli_open_store(cli, ENGRAM_OPEN_CREATE | ENGRAM_OPEN_PREFAULT, (int)threads, &d->st, 0,
                       &status) != 0)
        goto out;
    for (size_t k = 0; k < DEMO_COLS; k++) {
        uint64_t p = k == 0 ? base_rows : d->rows[k - 1] + 1;
        while (!is_prime(p))
            p++;
        d->rows[k] = p;
        d->offsets[k] = k == 0 ? 0 : d->offsets[k - 1] + (int64_t)d->rows[k - 1];
        data_bytes += p * DEMO_ROW_BYTES;
        snprintf(d->names[k], sizeof(d->names[k]), "engram:l1:h%zu", k);
    }
    printf("engram demo: one DeepSeek-shaped Engram layer: %d tables engram:l1:h0..h%d "
           "(8 heads x 3 n-gram orders),\n", DEMO_COLS, DEMO_COLS - 1);
    printf("  %" PRIu64 "..%" PRIu64 " rows each (primes) of %d bytes, %s in all, in namespace "
           "%s%s\n", d->rows[0], d->rows[DEMO_COLS - 1], DEMO_ROW_BYTES,
           cli_fmt_bytes(data_bytes, sz, sizeof(sz)), nspath,
           keep ? " (kept)" : " (removed at exit)");
    fflush(stdout);

    t0 = cli_now_ns();
    for (size_t k = 0; k < DEMO_COLS; k++) {
        engram_table_spec spec = {d->rows[k], DEMO_ROW_BYTES, 0};
        struct synth_source src = {FILL_PATTERN, k + 1, DEMO_ROW_BYTES};
        status = cli_write_table(d->st, "populate", d->names[k], &spec, cli_synth_rows, &src);
        if (status != 0)
            goto out;
        d->created[k] = 1;
    }
    {
        uint64_t dt = cli_now_ns() - t0;
        printf("populated in %.2f s (%.0f MB/s, pattern fill, create-only atomic writes)\n",
               (double)dt / 1e9, (double)data_bytes / ((double)dt / 1e9) / 1e6);
    }

    /* Open every table in the store (prefaulted) and, for the baseline, map
     * each file's rows privately and read-only at the reported data_offset,
     * also prefaulted, so both sides start with their page tables filled. */
    t0 = cli_now_ns();
    for (size_t k = 0; k < DEMO_COLS; k++) {
        engram_table_info t = ENGRAM_TABLE_INFO_INIT;
        char path[PATH_MAX * 2 + 64];
        int fd;

        rc = engram_table_open(d->st, d->names[k], &d->ids[k]);
        if (rc == 0)
            rc = engram_get_table_info(d->st, d->names[k], &t);
        if (rc != 0) {
            status = cli_lib_fail(rc, "demo: open '%s'", d->names[k]);
            goto out;
        }
        d->pitch[k] = t.spec.row_pitch;
        snprintf(path, sizeof(path), "%s/%s", nspath, d->names[k]);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            status = cli_fail("demo: baseline: open '%s': %s", path, strerror(errno));
            goto out;
        }
        d->map_len[k] = (size_t)t.data_size;
        d->map[k] = mmap(NULL, d->map_len[k], PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd,
                         (off_t)t.data_offset);
        close(fd);
        if (d->map[k] == MAP_FAILED) {
            d->map[k] = NULL;
            status = cli_fail("demo: baseline: mmap '%s' at offset %" PRIu64 ": %s", path,
                              t.data_offset, strerror(errno));
            goto out;
        }
        d->base[k] = d->map[k];
    }
    {
        engram_stats s = ENGRAM_STATS_INIT;
        engram_store_stats(d->st, &s);
        printf("opened and prefaulted in %.2f s; engram uses %" PRIu32 " gather thread%s\n",
               (double)(cli_now_ns() - t0) / 1e9, s.threads, s.threads == 1 ? "" : "s");
    }
    printf("baseline: a naive loop (bounds check + memcpy per row) over a private read-only "
           "mmap of each file\n");
    printf("every batch: engram == baseline byte for byte, rows == pattern, dead rows "
           "untouched; ~1%% ids are -1\n\n");
    printf("%6s %7s | %-39s | %-39s | %s\n", "", "", "engram_lookup", "baseline (naive loop)",
           "engram/");
    printf("%6s %7s | %6s %9s %9s %10s | %6s %9s %9s %10s | %s\n", "tokens", "rows", "iters",
           "median", "p99", "rows/s", "iters", "median", "p99", "rows/s", "baseline");
    fflush(stdout);
    for (size_t i = 0; i < nsweep; i++)
        if ((status = demo_round(d, sweep[i], iters, budget_ns, &rng)) != 0)
            goto out;
    putchar('\n');
    print_stats(d->st);

out:
    for (size_t k = 0; k < DEMO_COLS; k++)
        if (d->map[k])
            munmap(d->map[k], d->map_len[k]);
    if (d->st && !keep) {
        for (size_t k = 0; k < DEMO_COLS; k++) {
            if (!d->created[k])
                continue;
            rc = engram_remove(d->st, d->names[k]);
            if (rc != 0 && status == 0)
                status = cli_lib_fail(rc, "demo: remove '%s'", d->names[k]);
        }
    }
    engram_store_close(d->st);
    if (!keep && ns_created && rmdir(nspath) != 0 && errno != ENOENT && status == 0)
        status = cli_fail("demo: remove namespace directory '%s': %s", nspath, strerror(errno));
    if (cli_interrupted && status == 0)
        status = EXIT_FAIL;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    free(d);
    return status;
}

/* ------------------------------------------------------------------------
 * Commands, help and main.
 */
static const struct command commands[] = {
    {"create", cli_cmd_create, O(ROWS) | O(ROW_BYTES) | O(PITCH) | O(FILL) | O(SEED), 1, 1,
     "create NAME --rows N --row-bytes R [--pitch P] [--fill zero|pattern|random] [--seed S]",
     "Creates table NAME of N synthetic rows of R bytes, streamed to the store in 8 MiB\n"
     "chunks (so tables larger than memory work) and published atomically.\n"
     "\n"
     "  --rows N          number of rows (>= 1)\n"
     "  --row-bytes R     bytes per row (1 .. 16777216)\n"
     "  --pitch P         bytes between row starts (>= R; default R)\n"
     "  --fill KIND       zero, pattern (default) or random\n"
     "  --seed S          seed of the pattern and random fills (default 0)\n"
     "\n"
     "pattern: bytes 0..7 of row i hold i as a little-endian uint64 (truncated for\n"
     "shorter rows); the 8 bytes at offset 8*w (w >= 1) hold, little-endian,\n"
     "  mix64(S*0xD6E8FEB86659FD93 ^ i*0x9E3779B97F4A7C15 ^ w*0xC2B2AE3D27D4EB4F)\n"
     "where mix64(z) is the splitmix64 finaliser:\n"
     "  z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB;\n"
     "  z ^ z>>31   (all mod 2^64).\n"
     "random: the same construction with other constants for every word; reproducible\n"
     "from --seed.\n"},
    {"import", cli_cmd_import,
     O(ROW_BYTES) | O(PITCH) | O(SAFETENSORS) | O(WEIGHT) | O(SCALE) | O(ROWS), 1, 2,
     "import NAME FILE [--row-bytes R] [--pitch P] | import --safetensors CKPT --weight W "
     "[--scale S] [--rows A:B] [--pitch P] NAME",
     "Creates table NAME from FILE, streamed in 8 MiB chunks.\n"
     "\n"
     "FILE is either an .npy file (recognised by its magic bytes; format 1.0, 2.0 or\n"
     "3.0) holding a C-ordered uint8 array of shape (rows, row_bytes), dtype '|u1',\n"
     "or raw rows back to back, which needs --row-bytes and a size that is a multiple\n"
     "of it.\n"
     "\n"
     "  --row-bytes R     bytes per row (raw files; checked against .npy files)\n"
     "  --pitch P         bytes between row starts in the table (>= R; default R)\n"
     "\n"
     "With --safetensors, NAME is made of rows A:B (default: all) of the 2-D weight\n"
     "tensor W [N, C] of checkpoint CKPT, each followed by the same row of the scale\n"
     "tensor S [N, D] if given (e.g. [N, 256] F8_E4M3 + [N, 8] F8_E8M0 = 264-byte\n"
     "rows).  CKPT is a .safetensors file or a model.safetensors.index.json whose\n"
     "weight_map names the shard of each tensor.  The header is validated first; the\n"
     "rows are streamed with a progress bar on a terminal, synced, then verified (the\n"
     "table's checksum, and 1024 rows read back against the checkpoint).\n"
     "\n"
     "  --safetensors CKPT  the checkpoint\n"
     "  --weight W          the weight tensor\n"
     "  --scale S           the scale tensor (optional)\n"
     "  --rows A:B          import rows [A, B) only (a TP shard); B empty = N\n"},
    {"ls", cli_cmd_ls, O(JSON), 0, 0, "ls [--json]",
     "Lists the tables of the namespace with their rows, row bytes, pitch and data\n"
     "size.\n"
     "\n"
     "  --json            print a JSON array of {name, kind, rows, row_bytes,\n"
     "                    row_pitch, size}\n"},
    {"info", cli_cmd_info, O(JSON) | O(MAP), 1, 1, "info NAME [--json] [--map]",
     "Shows every field the library reports about table NAME: spec, file layout,\n"
     "checksum, creation time and, with --map, the mapping in this process.\n"
     "\n"
     "  --json            print one JSON object (the checksum as a hex string)\n"
     "  --map             map the table first, to report resident and huge-page bytes\n"},
    {"verify", cli_cmd_verify, O(ALL), 0, -1, "verify NAME... | verify --all",
     "Re-reads each table and checks its header and data checksum; prints\n"
     "'NAME: OK' or 'NAME: FAILED' per table (and the reason on stderr).  A progress\n"
     "bar is drawn on stderr when it is a terminal.  Exits 1 if any table failed.\n"
     "\n"
     "  --all             verify every table of the namespace\n"},
    {"lookup", cli_cmd_lookup, O(OFFSET) | O(ZERO_DEAD), 2, -1,
     "lookup NAME ID [ID...] [--offset O] [--zero-dead]",
     "Gathers the rows of the given ids with engram_lookup and prints one line per\n"
     "id: 'ID: hex bytes'.  Id -1 is padding: it prints 'ID: dead'.  Any other id\n"
     "outside the table fails with the library's message naming position and value.\n"
     "\n"
     "  --offset O        subtract O from every id (except -1) first: global ids\n"
     "  --zero-dead       have the library zero-fill dead rows, printed as zeros\n"},
    {"rm", cli_cmd_rm, 0, 1, -1, "rm NAME...",
     "Removes the named tables (the names are free again at once; processes that\n"
     "have a table mapped keep reading their mapping).\n"},
    {"bench", cli_cmd_bench, O(IDS) | O(ITERS) | O(THREADS) | O(COLS) | O(JSON) | O(HUGE), 1, -1,
     "bench NAME... [--ids T] [--cols C] [--iters N] [--threads N] [--huge] [--json]",
     "Measures engram_lookup of uniform random ids (a fresh batch each call, from a\n"
     "ring of 8), each named table one column, and in the same run two baselines:\n"
     "the same lookups on a store with 1 gather thread, and a plain memcpy of the\n"
     "same number of bytes (sequential bandwidth).  Prints median and p99 time per\n"
     "call, rows/s, GB/s and the ratios.  Tables are mapped prefaulted.\n"
     "\n"
     "  --ids T           ids per column per call (tokens; default 256)\n"
     "  --cols C          C columns, cycling over the named tables (default: one\n"
     "                    column per name)\n"
     "  --iters N         timed calls per measurement (default: as many as fit\n"
     "                    in 1 s)\n"
     "  --threads N       gather threads (default 0: one per CPU, at most 8)\n"
     "  --huge            serve private huge-page copies (ENGRAM_OPEN_PRIVATE_HUGE)\n"
     "  --json            machine-readable output\n"},
    {"demo", cmd_demo, O(SMALL) | O(TOKENS) | O(ITERS) | O(KEEP) | O(THREADS), 0, 0,
     "demo [--small] [--tokens T] [--iters N] [--threads N] [--keep]",
     "Runs the library end to end on one DeepSeek-shaped Engram layer: creates a\n"
     "fresh namespace demo-<pid> (or --ns) of 24 tables engram:l1:h0..h23 (8 heads x 3\n"
     "n-gram orders), each a prime number of 264-byte rows (about 1 GiB in all, or\n"
     "64 MiB with --small), pattern-filled; then runs decode-shaped lookups (T tokens\n"
     "x 24 columns of global ids with prefix-sum offsets, ~1% padding ids -1) for\n"
     "T in 1, 16, 256, 4096, checks returned rows against the pattern and against a\n"
     "naive baseline gather over its own read-only mmap of the same files, and prints\n"
     "median and p99 latency per lookup, rows/s and the ratio engram/baseline, then\n"
     "the store's stats.  Any wrong byte fails the demo with exit status 1.\n"
     "\n"
     "  --small           64 MiB of tables instead of 1 GiB (CI)\n"
     "  --tokens T        also measure batches of T tokens\n"
     "  --iters N         timed lookups per measurement (default: a time budget)\n"
     "  --threads N       gather threads (default 0: one per CPU, at most 8)\n"
     "  --keep            keep the namespace and its tables\n"},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void print_main_help(FILE *f)
{
    fprintf(f,
            "Usage: engram [--root DIR] [--ns NAME] COMMAND [ARGS]\n"
            "\n"
            "Stores Engram embedding tables (static tables of fixed-size rows) in a\n"
            "namespace directory and gathers rows by id.\n"
            "\n"
            "Commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %s\n", commands[i].synopsis);
    fprintf(f,
            "\n"
            "Global options (also accepted after the command):\n"
            "  --root DIR    root directory of namespaces (default %s)\n"
            "  --ns NAME     namespace (default 'default')\n"
            "  -h, --help    show help; 'engram COMMAND --help' for one command\n"
            "  --version     print the version\n"
            "\n"
            "Exit status: 0 ok, 1 an operation failed, 2 usage error.\n",
            engram_default_root());
}

static void print_command_help(const struct command *c)
{
    printf("Usage: engram [--root DIR] [--ns NAME] %s\n\n%s", c->synopsis, c->help);
}

/* Recognises "--name" / "--name=value" / "-h".  Returns the option id or
 * -1, and sets *inline_val to the text after '=' when present. */
static int lookup_option(const char *arg, const char **inline_val)
{
    const char *name, *eq;
    size_t len;

    *inline_val = NULL;
    if (strcmp(arg, "-h") == 0)
        return OPT_HELP;
    if (strncmp(arg, "--", 2) != 0)
        return -1;
    name = arg + 2;
    eq = strchr(name, '=');
    len = eq ? (size_t)(eq - name) : strlen(name);
    for (int i = 0; i < OPT_COUNT; i++) {
        if (strlen(opt_defs[i].name) == len && strncmp(opt_defs[i].name, name, len) == 0) {
            if (eq)
                *inline_val = eq + 1;
            return i;
        }
    }
    return -1;
}

/* An argument is an option if it starts with "--", or is "-h", or is '-'
 * followed by something other than a digit (so negative ids such as -1 are
 * positional). */
static int looks_like_option(const char *a)
{
    return a[0] == '-' && a[1] != '\0' && !isdigit((unsigned char)a[1]);
}

static int parse_and_run(int argc, char **argv)
{
    struct cli cli;
    int i = 1, nargs = 0, only_positional = 0;
    char **pos;

    memset(&cli, 0, sizeof(cli));
    cli.ns = "default";

    /* Global options before the command. */
    for (; i < argc && looks_like_option(argv[i]); i++) {
        const char *val;
        int id;
        if (strcmp(argv[i], "--version") == 0) {
            /* A shared library older or newer than the header the tool was
             * built with is worth saying. */
            if (engram_version_number() == ENGRAM_VERSION_NUMBER)
                printf("engram %s\n", engram_version_string());
            else
                printf("engram %s (built against the header of %d.%d.%d)\n",
                       engram_version_string(), ENGRAM_VERSION_MAJOR, ENGRAM_VERSION_MINOR,
                       ENGRAM_VERSION_PATCH);
            return 0;
        }
        id = lookup_option(argv[i], &val);
        if (id == OPT_HELP) {
            print_main_help(stdout);
            return 0;
        }
        if (id != OPT_ROOT && id != OPT_NS)
            return cli_usage_error(&cli, "unknown option '%s' before the command", argv[i]);
        if (!val) {
            if (i + 1 >= argc)
                return cli_usage_error(&cli, "--%s needs a value", opt_defs[id].name);
            val = argv[++i];
        }
        if (cli.opt[id])
            return cli_usage_error(&cli, "--%s given twice", opt_defs[id].name);
        cli.opt[id] = val;
    }
    if (i >= argc) {
        print_main_help(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[i], "help") == 0) {
        if (i + 1 >= argc) {
            print_main_help(stdout);
            return 0;
        }
        for (size_t c = 0; c < NCOMMANDS; c++) {
            if (strcmp(argv[i + 1], commands[c].name) == 0) {
                print_command_help(&commands[c]);
                return 0;
            }
        }
        return cli_usage_error(&cli, "unknown command '%s'", argv[i + 1]);
    }
    for (size_t c = 0; c < NCOMMANDS; c++)
        if (strcmp(argv[i], commands[c].name) == 0)
            cli.cmd = &commands[c];
    if (!cli.cmd)
        return cli_usage_error(&cli, "unknown command '%s'", argv[i]);
    i++;

    /* --help anywhere among the options wins over any other usage error. */
    for (int j = i; j < argc && strcmp(argv[j], "--") != 0; j++) {
        if (strcmp(argv[j], "--help") == 0 || strcmp(argv[j], "-h") == 0) {
            print_command_help(cli.cmd);
            return 0;
        }
    }

    pos = calloc((size_t)argc, sizeof(*pos));
    if (!pos)
        return cli_fail("out of memory");
    for (; i < argc; i++) {
        const char *val;
        int id;
        if (only_positional || !looks_like_option(argv[i])) {
            pos[nargs++] = argv[i];
            continue;
        }
        if (strcmp(argv[i], "--") == 0) {
            only_positional = 1;
            continue;
        }
        id = lookup_option(argv[i], &val);
        if (id < 0 || !((GLOBAL_OPTS | cli.cmd->opts) & (1u << id))) {
            free(pos);
            return cli_usage_error(&cli, "unknown option '%s'", argv[i]);
        }
        if (!opt_defs[id].has_arg && val) {
            free(pos);
            return cli_usage_error(&cli, "--%s takes no value", opt_defs[id].name);
        }
        if (opt_defs[id].has_arg && !val) {
            if (i + 1 >= argc) {
                free(pos);
                return cli_usage_error(&cli, "--%s needs a value", opt_defs[id].name);
            }
            val = argv[++i];
        }
        if (cli.opt[id]) {
            free(pos);
            return cli_usage_error(&cli, "--%s given twice", opt_defs[id].name);
        }
        cli.opt[id] = val ? val : "";
    }
    cli.args = pos;
    cli.nargs = nargs;

    if (nargs < cli.cmd->min_args || (cli.cmd->max_args >= 0 && nargs > cli.cmd->max_args)) {
        int st;
        if (nargs < cli.cmd->min_args)
            st = cli_usage_error(&cli, "missing arguments; usage: engram %s", cli.cmd->synopsis);
        else
            st = cli_usage_error(&cli, "unexpected argument '%s'", pos[cli.cmd->max_args]);
        free(pos);
        return st;
    }
    if (cli.opt[OPT_ROOT]) {
        if (cli.opt[OPT_ROOT][0] == '\0') {
            free(pos);
            return cli_usage_error(&cli, "--root: empty directory name");
        }
        cli.root = cli.opt[OPT_ROOT];
    }
    if (cli.opt[OPT_NS]) {
        int rc = engram_name_check(cli.opt[OPT_NS]);
        if (rc != 0) {
            int st = cli_usage_error(&cli, "invalid namespace name '%s': %s", cli.opt[OPT_NS],
                                     cli_lib_detail(rc));
            free(pos);
            return st;
        }
        cli.ns = cli.opt[OPT_NS];
    }

    {
        int st = cli.cmd->run(&cli);
        free(pos);
        return st;
    }
}

int main(int argc, char **argv)
{
    int status = parse_and_run(argc, argv);

    /* Output that could not be written (a full disk, a closed pipe) is a
     * failure, not a silent success. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "engram: write error on standard output: %s\n", strerror(errno));
        if (status == 0)
            status = EXIT_FAIL;
    }
    return status;
}
