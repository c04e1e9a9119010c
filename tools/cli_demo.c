/*
 * cli_demo.c - `engram demo`: the library end to end on one DeepSeek-shaped
 * Engram layer.
 *
 * It creates 24 pattern-filled tables in a fresh namespace, runs
 * decode-shaped lookups for a sweep of batch sizes, checks every batch
 * byte for byte against the pattern and against a naive gather over its
 * own mapping of the same files, times both, and removes what it created
 * (also on SIGINT/SIGTERM).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engram.h"
#include "cli.h"

/* ------------------------------------------------------------------------
 * demo: one DeepSeek-shaped Engram layer, end to end.
 */
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

/* Sets cli_interrupted: the demo stops and removes its tables. */
static void on_signal(int sig)
{
    (void)sig;
    cli_interrupted = 1;
}

/* The store's counters, printed at the end of the demo. */
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

int cli_cmd_demo(struct cli *cli)
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
