/*
 * cli_demo.c - `engram demo`: the library end to end on one DeepSeek-shaped
 * Engram layer.
 *
 * It creates 24 pattern-filled tables in a fresh namespace (2 GiB in all,
 * far larger than a last-level cache, as real Engram tables are; 64 MiB
 * with --small), runs decode-shaped lookups for a sweep of batch sizes,
 * checks every batch byte for byte against the pattern and against a
 * naive gather over its own mapping of the same files, times both with
 * their calls interleaved, and removes what it created (also on
 * SIGINT/SIGTERM).  The ratio is the baseline's median time over the
 * library's: higher is better for the library.
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
#include <time.h>
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
    int losses; /* batch sizes where the baseline's median was lower */
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

static int cmp_ns(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Times the library and the baseline on the same batches, their calls
 * interleaved in blocks of 8 (so a noisy neighbour or a frequency change
 * slows both alike), each call on its own: `fixed` calls each, or as many
 * as `budget_ns` allows (at least 16).  Median and p99 per side. */
static int demo_time(struct demo *d, const engram_lookup_args *args, const int64_t *ids, size_t T,
                     unsigned char *ref, uint64_t fixed, uint64_t budget_ns, struct timing *te,
                     struct timing *tb)
{
    size_t cap = fixed ? (size_t)fixed : 100000, n = 0;
    uint64_t *s[2], start = cli_now_ns();
    int status = 0;
    s[0] = malloc(cap * sizeof(uint64_t));
    s[1] = malloc(cap * sizeof(uint64_t));
    if (!s[0] || !s[1]) {
        free(s[0]);
        free(s[1]);
        return cli_fail("demo: out of memory for %zu timing samples", cap);
    }
    while (status == 0 && n < cap) {
        if (!fixed && n >= 16 && n % 8 == 0 && cli_now_ns() - start >= budget_ns)
            break;
        if (cli_interrupted) {
            status = cli_fail("interrupted");
            break;
        }
        for (int who = 0; who < 2 && status == 0; who++) {
            for (size_t j = 0; j < 8 && n + j < cap && status == 0; j++) {
                size_t r = (n + j) % DEMO_RING;
                uint64_t t0 = cli_now_ns(), t1;
                int rc = who == 0 ? engram_lookup(d->st, &args[r])
                                  : naive_gather(d, ids + r * T * DEMO_COLS, T, ref);
                t1 = cli_now_ns();
                if (rc != 0)
                    status = who == 0 ? cli_lib_fail(rc, "demo: lookup T=%zu", T) : rc;
                s[who][n + j] = t1 - t0;
            }
        }
        n += cap - n < 8 ? cap - n : 8;
    }
    if (status == 0) {
        struct timing *t[2] = {te, tb};
        for (int who = 0; who < 2; who++) {
            qsort(s[who], n, sizeof(uint64_t), cmp_ns);
            t[who]->iters = n;
            t[who]->median_ns = s[who][n / 2];
            t[who]->p99_ns = s[who][n * 99 / 100];
            t[who]->total_ns = 0;
            for (size_t i = 0; i < n; i++)
                t[who]->total_ns += s[who][i];
        }
    }
    free(s[0]);
    free(s[1]);
    return status;
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

    if ((status = demo_time(d, args, ids, T, ref, fixed_iters, budget_ns, &te, &tb)) != 0)
        goto out;
    /* The timed calls rotate over the ring; re-check the last batch each
     * wrote, so a fault that only shows under load is still caught. */
    {
        size_t last = (te.iters - 1) % DEMO_RING;
        if ((status = demo_check(d, "engram_lookup (timed)", T, ids + last * n, out, 4096, rng,
                                 0)) != 0 ||
            (status = demo_check(d, "the baseline (timed)", T, ids + last * n, ref, 4096, rng,
                                 0)) != 0)
            goto out;
    }
    {
        /* Rates and ratio from the medians: one slow call (a page fault,
         * the other process on the CPU) moves a mean, not a median. */
        double re = (double)live * 1e9 / (double)te.median_ns;
        double rb = (double)live * 1e9 / (double)tb.median_ns;
        printf("%6zu %7zu | %6zu %9s %9s %10.3g | %6zu %9s %9s %10.3g | %6.2fx\n", T, n,
               te.iters, cli_fmt_ns((double)te.median_ns, m1, sizeof(m1)),
               cli_fmt_ns((double)te.p99_ns, p1, sizeof(p1)), re, tb.iters,
               cli_fmt_ns((double)tb.median_ns, m2, sizeof(m2)),
               cli_fmt_ns((double)tb.p99_ns, p2, sizeof(p2)), rb,
               cli_ratio((double)tb.median_ns, (double)te.median_ns));
        fflush(stdout);
        if (tb.median_ns < te.median_ns)
            d->losses++;
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

/* Warns when other work is running: the figures are then noisy (the load
 * average counts this process too, hence the half). */
static void demo_warn_load(const char *timings)
{
    double la[1];
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (getloadavg(la, 1) == 1 && ncpu > 0 && la[0] > 0.5 * (double)ncpu + 1.0)
        printf("warning: load average %.1f on %ld CPUs: other work is running, and %s\n",
               la[0], ncpu, timings);
}

/* Freshly written multi-GiB tables read slower for a while on some VMs
 * (20-30 s here): runs untimed lookups of 256 tokens until two rounds of
 * 0.5 s agree within 10%, for 30 s at most. */
static void demo_settle(struct demo *d, uint64_t *rng)
{
    enum { T = 256 };
    int64_t *ids = malloc((size_t)T * DEMO_COLS * sizeof *ids);
    unsigned char *out = malloc((size_t)T * DEMO_COLS * DEMO_ROW_BYTES);
    uint64_t start = cli_now_ns();
    double last = 0;
    if (!ids || !out)
        goto out;
    for (size_t i = 0; i < (size_t)T * DEMO_COLS; i++) {
        size_t k = i % DEMO_COLS;
        ids[i] = d->offsets[k] + (int64_t)(cli_rng_next(rng) % d->rows[k]);
    }
    printf("settling: untimed lookups until their speed is steady (at most 30 s) ...");
    fflush(stdout);
    while (!cli_interrupted && cli_now_ns() - start < 30000000000ull) {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        uint64_t t0 = cli_now_ns(), calls = 0;
        double rate;
        a.num_tokens = T;
        a.num_cols = DEMO_COLS;
        a.tables = d->ids;
        a.offsets = d->offsets;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        while (cli_now_ns() - t0 < 500000000u) {
            size_t i = (size_t)(cli_rng_next(rng) % ((uint64_t)T * DEMO_COLS)), k = i % DEMO_COLS;
            if (engram_lookup(d->st, &a) != 0) {
                printf(" lookup failed: %s\n", engram_errmsg());
                goto out;
            }
            calls++;
            /* A new id in one position of its column: the batches differ. */
            ids[i] = d->offsets[k] + (int64_t)(cli_rng_next(rng) % d->rows[k]);
        }
        rate = (double)calls / ((double)(cli_now_ns() - t0) / 1e9);
        if (last > 0 && rate > 0.9 * last && rate < 1.1 * last)
            break;
        last = rate;
    }
    printf(" %.1f s\n", (double)(cli_now_ns() - start) / 1e9);
out:
    free(ids);
    free(out);
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

    total_bytes = small ? (uint64_t)64 << 20 : (uint64_t)2 << 30;
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
    if (!small)
        demo_settle(d, &rng);
    demo_warn_load("the timings below will be noisy");
    printf("baseline: a naive loop (bounds check + memcpy per row) over a private read-only "
           "mmap of each file\n");
    printf("the two alternate in blocks of 8 calls on the same batches; rows/s and the ratio "
           "come from the medians\n");
    printf("every batch: engram == baseline byte for byte, rows == pattern, dead rows "
           "untouched; ~1%% ids are -1\n\n");
    printf("%6s %7s | %-39s | %-39s | %s\n", "", "", "engram_lookup", "baseline (naive loop)",
           "speedup");
    printf("%6s %7s | %6s %9s %9s %10s | %6s %9s %9s %10s | %s\n", "tokens", "rows", "iters",
           "median", "p99", "rows/s", "iters", "median", "p99", "rows/s", "(higher is better)");
    fflush(stdout);
    for (size_t i = 0; i < nsweep; i++)
        if ((status = demo_round(d, sweep[i], iters, budget_ns, &rng)) != 0)
            goto out;
    putchar('\n');
    if (d->losses)
        printf("the baseline's median was lower at %d of %zu batch sizes: engram was slower "
               "there in this run%s\n", d->losses, nsweep,
               small ? " (with --small the tables fit in the caches, where a plain copy loop "
                       "has little to lose)" : "");
    else
        printf("engram's median was at least the baseline's at every batch size\n");
    demo_warn_load("the timings above were noisy");
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
