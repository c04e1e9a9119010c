/*
 * bench_source.c - tables served by the caller's own code
 * (engram_add_source) against the caller reading the same rows from the
 * same store directly, in one run.
 *
 *   bench_source [--rows N] [--k K] [--lookups N] [--reps N] [--zipf S]
 *                [--call-us US] [--row-ns NS] [--cache-mib N] [--quick]
 *
 * The "store" is an in-process table of N rows of 264 bytes behind a cost
 * model of a remote key-value store: every batched read costs --call-us
 * microseconds (a round trip) plus --row-ns nanoseconds per row asked for
 * (transfer), spent in a busy wait, besides the real copy of each row.
 * Each lookup asks for K ids, drawn Zipf(S)-distributed over the rows
 * (Engram n-gram hashes repeat: hot rows recur within and across batches)
 * or uniformly (--zipf 0).  Per lookup:
 *
 *   direct        the caller's own code: one batched read of all K ids from
 *                 the store, rows scattered to the output (no engram)
 *   source        engram_lookup() of a table added with engram_add_source()
 *                 over the same store, no row cache: one read_rows call of
 *                 the distinct rows
 *   source+cache  the same with a row cache of --cache-mib MiB
 *   memory        the same rows bound as memory (engram_bind): no store at
 *                 all, the floor
 *
 * Each figure is the median over --reps repetitions of --lookups lookups
 * (the repetitions of the four are interleaved, so a noisy neighbour slows
 * them alike); ratios are between medians of this run.  The outputs of all
 * four are compared with the table once.  The cache starts cold in every
 * repetition of source+cache (a fresh store).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engram.h"
#include "bench_util.h"

enum { R = 264 };

static uint64_t nrows = 1000000, call_ns = 20000, row_ns = 100;
static size_t K = 6144, lookups = 200;
static int reps = 7;
static double zipf_s = 1.05;
static uint64_t cache_mib = 64;
static unsigned char *table;

static void spin_ns(uint64_t ns)
{
    uint64_t end = bench_now_ns() + ns;
    while (bench_now_ns() < end)
        ;
}

/* The store's batched read: the cost model, then the rows. */
static void store_read(const uint64_t *rows, unsigned char *const *dsts, size_t n)
{
    spin_ns(call_ns + row_ns * n);
    for (size_t i = 0; i < n; i++)
        memcpy(dsts[i], table + rows[i] * R, R);
}

/* read_rows over the store: one batched read of the distinct rows. */
static int read_rows(void *ctx, engram_source_req *reqs, size_t n)
{
    static _Thread_local uint64_t *rows;
    static _Thread_local unsigned char **dsts;
    static _Thread_local size_t cap;
    (void)ctx;
    if (n > cap) {
        free(rows);
        free(dsts);
        rows = malloc(n * sizeof *rows);
        dsts = malloc(n * sizeof *dsts);
        if (!rows || !dsts)
            return -ENOMEM;
        cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        rows[i] = reqs[i].row;
        dsts[i] = reqs[i].dst;
    }
    store_read(rows, dsts, n);
    return 0;
}

/* Zipf(s) over [0, n) by inversion of the cumulative weights (s > 0), ids
 * scattered over the table by a fixed permutation-like mix. */
static void make_ids(int64_t *ids, size_t total, uint64_t seed)
{
    uint64_t s = seed | 1;
    if (zipf_s <= 0) {
        for (size_t i = 0; i < total; i++)
            ids[i] = (int64_t)(bench_rng(&s) % nrows);
        return;
    }
    double *cdf = malloc(nrows * sizeof *cdf), sum = 0;
    if (!cdf) {
        fprintf(stderr, "bench_source: out of memory\n");
        exit(1);
    }
    for (uint64_t r = 0; r < nrows; r++)
        cdf[r] = (sum += 1.0 / pow((double)(r + 1), zipf_s));
    for (size_t i = 0; i < total; i++) {
        double u = (double)(bench_rng(&s) >> 11) / 9007199254740992.0 * sum;
        uint64_t lo = 0, hi = nrows - 1;
        while (lo < hi) {
            uint64_t mid = (lo + hi) / 2;
            if (cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        /* Rank -> row: an odd multiplier mod 2^k folded into nrows keeps
         * hot rows apart in the table. */
        ids[i] = (int64_t)((lo * 0x9E3779B97F4A7C15ull >> 11) % nrows);
    }
    free(cdf);
}

typedef struct run {
    const int64_t *ids; /* lookups x K */
    unsigned char *out; /* K x R */
} run;

static double time_direct(const run *r)
{
    uint64_t *rows = malloc(K * sizeof *rows), t0;
    unsigned char **dsts = malloc(K * sizeof *dsts);
    if (!rows || !dsts)
        exit(1);
    t0 = bench_now_ns();
    for (size_t l = 0; l < lookups; l++) {
        const int64_t *ids = r->ids + l * K;
        for (size_t i = 0; i < K; i++) {
            rows[i] = (uint64_t)ids[i];
            dsts[i] = r->out + i * R;
        }
        store_read(rows, dsts, K);
    }
    t0 = bench_now_ns() - t0;
    free(rows);
    free(dsts);
    return (double)t0 / (double)lookups;
}

static double time_engram(const run *r, int kind, engram_cache_stats *cs)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_spec spec = {nrows, R, 0};
    engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
    engram_store *st;
    engram_table_id id;
    uint64_t t0;
    o.threads = 1;
    o.flags = ENGRAM_OPEN_PREFAULT;
    o.cache_bytes = (cache_mib + 8) << 20;
    ops.read_rows = read_rows;
    if (engram_store_open_memory(&o, &st) != 0)
        bench_die("bench_source", "open");
    if (kind == 0) {
        if (engram_bind(st, "t", &spec, table) != 0 || engram_table_open(st, "t", &id) != 0)
            bench_die("bench_source", "bind");
    } else if (engram_add_source(st, "t", &spec, &ops, NULL, kind == 2 ? cache_mib << 20 : 0,
                                 &id) != 0) {
        bench_die("bench_source", "add source");
    }
    t0 = bench_now_ns();
    for (size_t l = 0; l < lookups; l++) {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        a.num_tokens = K;
        a.num_cols = 1;
        a.tables = &id;
        a.ids = r->ids + l * K;
        a.id_type = ENGRAM_ID_INT64;
        a.out = r->out;
        if (engram_lookup(st, &a) != 0)
            bench_die("bench_source", "lookup");
    }
    t0 = bench_now_ns() - t0;
    if (cs) {
        *cs = (engram_cache_stats)ENGRAM_CACHE_STATS_INIT;
        if (kind)
            engram_get_cache_stats(st, "t", cs);
    }
    engram_store_close(st);
    return (double)t0 / (double)lookups;
}

static void check(const run *r, const char *who)
{
    const int64_t *ids = r->ids + (lookups - 1) * K;
    for (size_t i = 0; i < K; i++)
        if (memcmp(r->out + i * R, table + (uint64_t)ids[i] * R, R) != 0) {
            fprintf(stderr, "bench_source: %s: row %zu differs from the table\n", who, i);
            exit(1);
        }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    static const char *names[4] = {"direct", "source", "source+cache", "memory"};
    double t[4][64], med[4];
    engram_cache_stats cs;
    run r;
    int64_t *ids;
    size_t distinct = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            nrows = 100000;
            lookups = 20;
            reps = 3;
            continue;
        }
        if (!v) {
            fprintf(stderr, "usage: see the comment at the top of bench/bench_source.c\n");
            return 2;
        }
        i++;
        if (!strcmp(a, "--rows"))
            nrows = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--k"))
            K = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--lookups"))
            lookups = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--zipf"))
            zipf_s = atof(v);
        else if (!strcmp(a, "--call-us"))
            call_ns = strtoull(v, NULL, 10) * 1000;
        else if (!strcmp(a, "--row-ns"))
            row_ns = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--cache-mib"))
            cache_mib = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "bench_source: unknown option %s\n", a);
            return 2;
        }
    }
    if (reps < 1 || reps > 64 || !nrows || !K || !lookups) {
        fprintf(stderr, "bench_source: bad options\n");
        return 2;
    }
    table = malloc(nrows * R);
    ids = malloc(lookups * K * sizeof *ids);
    r.out = malloc(K * R);
    if (!table || !ids || !r.out)
        return 1;
    for (uint64_t i = 0; i < nrows * R; i++)
        table[i] = (unsigned char)(i * 131 + (i >> 12));
    make_ids(ids, lookups * K, 42);
    r.ids = ids;
    {
        /* Distinct rows per lookup, on average: what deduplication saves. */
        unsigned char *seen = calloc(nrows, 1);
        for (size_t l = 0; l < lookups && seen; l++) {
            for (size_t i = 0; i < K; i++)
                distinct += seen[ids[l * K + i]]++ == 0;
            for (size_t i = 0; i < K; i++)
                seen[ids[l * K + i]] = 0;
        }
        free(seen);
    }
    printf("bench_source: libengram %s; %" PRIu64 " rows of %d bytes; %zu lookups of K=%zu "
           "ids, %s; %.0f distinct rows per lookup; store: %" PRIu64 " us per call + %" PRIu64
           " ns per row; cache %" PRIu64 " MiB; %d reps\n",
           engram_version_string(), nrows, R, lookups, K,
           zipf_s > 0 ? "Zipf" : "uniform", (double)distinct / (double)lookups,
           call_ns / 1000, row_ns, cache_mib, reps);
    if (zipf_s > 0)
        printf("  (Zipf exponent %.2f)\n", zipf_s);
    for (int rep = 0; rep < reps; rep++) {
        t[0][rep] = time_direct(&r);
        if (rep == 0)
            check(&r, names[0]);
        for (int k = 0; k < 3; k++) {
            t[k == 2 ? 3 : k + 1][rep] =
                time_engram(&r, k == 2 ? 0 : k + 1, k == 1 && rep == reps - 1 ? &cs : NULL);
            if (rep == 0)
                check(&r, names[k == 2 ? 3 : k + 1]);
        }
    }
    for (int k = 0; k < 4; k++)
        med[k] = median(t[k], reps);
    printf("  %-13s %12s %12s %10s\n", "", "us/lookup", "M rows/s", "vs direct");
    for (int k = 0; k < 4; k++)
        printf("  %-13s %12.1f %12.2f %9.2fx\n", names[k], med[k] / 1000.0,
               (double)K * 1000.0 / med[k], med[0] / med[k]);
    printf("  source+cache (last rep): hit rate %.1f%%, %" PRIu64 " rows read for %" PRIu64
           " asked (%" PRIu64 " deduplicated)\n",
           cs.hits + cs.misses ? 100.0 * (double)cs.hits / (double)(cs.hits + cs.misses) : 0.0,
           cs.reads, cs.hits + cs.misses, cs.dedup);
    {
        double dfrac = (double)distinct / (double)lookups / (double)K;
        double hit = cs.hits + cs.misses ? (double)cs.hits / (double)(cs.hits + cs.misses) : 0;
        double store_row_ns = ((double)call_ns / (double)K + (double)row_ns);
        for (int k = 1; k <= 2; k++) {
            const char *why;
            if (med[k] <= med[0])
                why = k == 1 ? "engram wins: each distinct row is read once"
                             : "engram wins: each distinct row is read once, hot rows from "
                               "the cache";
            else if (store_row_ns < 20)
                why = "the direct read wins: the store costs almost nothing a row here, so "
                      "engram's validation, deduplication and cache cost more than the reads "
                      "they save";
            else if (k == 2 && hit < 0.5)
                why = "the direct read wins: the cache inserts every row it misses and hits "
                      "too few of them at this spread of ids";
            else if (dfrac > 0.9)
                why = "the direct read wins: almost every id is distinct, so deduplication "
                      "saves no reads and costs its hash";
            else
                why = "the direct read wins at these costs";
            printf("  %s vs direct: %.2fx (%s; %.0f%% of the ids distinct)\n", names[k],
                   med[0] / med[k], why, 100.0 * dfrac);
        }
        printf("  source+cache hit rate %.0f%%; the store costs %.0f ns a row asked for\n",
               100.0 * hit, store_row_ns);
    }
    free(table);
    free(ids);
    free(r.out);
    return 0;
}
