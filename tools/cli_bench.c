/*
 * cli_bench.c - `engram bench` and the timing it shares with the demo.
 *
 * cli_measure() times an operation over repeated calls (median and p99);
 * bench uses it to measure lookups of random ids against two baselines
 * taken in the same run: the same lookups with one gather thread, and a
 * memcpy of the same number of bytes.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engram.h"
#include "cli.h"

/* ------------------------------------------------------------------------
 * Timing shared by bench and demo.
 */

uint64_t cli_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Runs op `fixed` times (or, when fixed is 0, until budget_ns has passed
 * and at least 3 runs were made, at most max_iters), timing each call.
 * Two untimed warm-up calls come first.  Returns the op's failure status,
 * or 0 and *t. */
int cli_measure(op_fn op, void *ctx, size_t fixed, uint64_t budget_ns, size_t max_iters,
                struct timing *t)
{
    size_t cap = fixed ? fixed : max_iters, n = 0;
    uint64_t *s = malloc(cap * sizeof(*s)), start, total = 0;
    int status = 0;

    if (!s)
        return cli_fail("out of memory for %zu timing samples", cap);
    for (size_t i = 0; i < 2 && status == 0; i++)
        status = op(ctx, i);
    start = cli_now_ns();
    while (status == 0 && n < cap) {
        uint64_t t0, t1;
        if (!fixed && n >= 3 && cli_now_ns() - start >= budget_ns)
            break;
        if (cli_interrupted) {
            status = cli_fail("interrupted");
            break;
        }
        t0 = cli_now_ns();
        status = op(ctx, n + 2);
        t1 = cli_now_ns();
        s[n++] = t1 - t0;
        total += t1 - t0;
    }
    if (status == 0) {
        qsort(s, n, sizeof(*s), cmp_u64);
        t->iters = n;
        t->total_ns = total;
        t->median_ns = s[n / 2];
        /* The nearest-rank 99th percentile. */
        t->p99_ns = s[(n * 99 + 99) / 100 - 1];
    }
    free(s);
    return status;
}

double cli_per_second(uint64_t count_per_iter, const struct timing *t)
{
    return t->total_ns ? (double)count_per_iter * (double)t->iters * 1e9 / (double)t->total_ns : 0;
}

/* a / b, or 0 when b is 0, so that JSON never receives inf or nan. */
double cli_ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

/* The op_fn of a struct lookup_op: one lookup, the next set of the ring. */
int cli_lookup_op_run(void *ctx, size_t iter)
{
    const struct lookup_op *o = ctx;
    int rc = engram_lookup(o->st, &o->args[iter % o->nargs]);
    return rc ? cli_lib_fail(rc, "%s", o->what) : 0;
}

struct memcpy_op {
    void *dst;
    const void *src;
    size_t bytes;
};

static int memcpy_op_run(void *ctx, size_t iter)
{
    const struct memcpy_op *o = ctx;
    (void)iter;
    memcpy(o->dst, o->src, o->bytes);
    return 0;
}

/* ------------------------------------------------------------------------
 * bench
 */
#define BENCH_RING 8

struct bench_result {
    const char *key, *label;
    struct timing t;
};

static void print_timing_json(const char *key, const struct timing *t, uint64_t rows,
                              uint64_t bytes, int last)
{
    printf("    \"%s\": {\"iters\": %zu, \"median_ns\": %" PRIu64 ", \"p99_ns\": %" PRIu64
           ", \"rows_per_s\": %.6g, \"bytes_per_s\": %.6g}%s\n",
           key, t->iters, t->median_ns, t->p99_ns, cli_per_second(rows, t),
           cli_per_second(bytes, t), last ? "" : ",");
}

int cli_cmd_bench(struct cli *cli)
{
    int json = cli->opt[OPT_JSON] != NULL;
    uint64_t T = 256, iters = 0, threads = 0, cols = 0;
    engram_store *st[2] = {NULL, NULL};
    engram_table_id *tid[2] = {NULL, NULL};
    engram_lookup_args *args[2] = {NULL, NULL};
    engram_table_info *info = NULL;
    int64_t *ids = NULL;
    unsigned char *out = NULL, *src = NULL;
    uint64_t K, R, rows_per_call, bytes_per_call, seed = 0x853C49E6748FEA9Bull;
    struct timing tm[3] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
    uint32_t flags = ENGRAM_OPEN_PREFAULT | (cli->opt[OPT_HUGE] ? ENGRAM_OPEN_PRIVATE_HUGE : 0);
    engram_stats stats = ENGRAM_STATS_INIT;
    int status = 0, rc;
    char b1[32];

    for (int i = 0; i < cli->nargs; i++)
        if ((status = cli_check_name(cli, cli->args[i])) != 0)
            return status;
    if ((status = cli_opt_u64(cli, OPT_IDS, 1, 1u << 24, &T)) != 0 ||
        (status = cli_opt_u64(cli, OPT_ITERS, 1, 10000000, &iters)) != 0 ||
        (status = cli_opt_u64(cli, OPT_THREADS, 0, 1024, &threads)) != 0 ||
        (status = cli_opt_u64(cli, OPT_COLS, 1, 4096, &cols)) != 0)
        return status;
    K = cols ? cols : (uint64_t)cli->nargs;
    if (K < (uint64_t)cli->nargs)
        return cli_usage_error(cli, "--cols %" PRIu64 " is less than the %d tables given", K,
                               cli->nargs);

    info = calloc((size_t)cli->nargs, sizeof(*info));
    for (int s = 0; s < 2; s++) {
        tid[s] = calloc((size_t)K, sizeof(*tid[s]));
        args[s] = calloc(BENCH_RING, sizeof(*args[s]));
    }
    if (!info || !tid[0] || !tid[1] || !args[0] || !args[1]) {
        status = cli_fail("bench: out of memory");
        goto out;
    }
    /* Store 0 runs with the configured threads, store 1 with the calling
     * thread only: the same lookups, so the ratio isolates the threads. */
    if (cli_open_store(cli, flags, (int)threads, &st[0], 0, &status) != 0 ||
        cli_open_store(cli, flags, 1, &st[1], 0, &status) != 0)
        goto out;
    for (int i = 0; i < cli->nargs; i++) {
        engram_table_info init = ENGRAM_TABLE_INFO_INIT;
        info[i] = init;
        rc = engram_get_table_info(st[0], cli->args[i], &info[i]);
        if (rc != 0) {
            status = cli_table_fail(st[0], rc, "bench", cli->args[i]);
            goto out;
        }
        if (info[i].spec.row_bytes != info[0].spec.row_bytes) {
            status = cli_fail("bench: tables '%s' (%" PRIu32 " bytes) and '%s' (%" PRIu32
                              " bytes) differ in row size; one lookup needs one row size",
                              cli->args[0], info[0].spec.row_bytes, cli->args[i],
                              info[i].spec.row_bytes);
            goto out;
        }
    }
    for (int s = 0; s < 2; s++) {
        for (uint64_t k = 0; k < K; k++) {
            const char *name = cli->args[k % (uint64_t)cli->nargs];
            rc = engram_table_open(st[s], name, &tid[s][k]);
            if (rc != 0) {
                status = cli_table_fail(st[s], rc, "bench", name);
                goto out;
            }
        }
    }
    R = info[0].spec.row_bytes;
    rows_per_call = T * K;
    if (!cli_mul_ok(rows_per_call, R, &bytes_per_call) || bytes_per_call > ((uint64_t)4 << 30)) {
        status = cli_usage_error(cli, "one call would gather more than 4 GiB; lower --ids or "
                                 "--cols");
        goto out;
    }
    ids = malloc((size_t)(rows_per_call * BENCH_RING) * sizeof(*ids));
    out = malloc((size_t)bytes_per_call);
    src = malloc((size_t)bytes_per_call);
    if (!ids || !out || !src) {
        status = cli_fail("bench: out of memory for %s of output",
                          cli_fmt_bytes(bytes_per_call, b1, sizeof(b1)));
        goto out;
    }
    memset(out, 0, (size_t)bytes_per_call);
    memset(src, 1, (size_t)bytes_per_call);
    for (size_t r = 0; r < BENCH_RING; r++)
        for (uint64_t t = 0; t < T; t++)
            for (uint64_t k = 0; k < K; k++)
                ids[r * rows_per_call + t * K + k] =
                    (int64_t)(cli_rng_next(&seed) % info[k % (uint64_t)cli->nargs].spec.num_rows);
    for (int s = 0; s < 2; s++) {
        for (size_t r = 0; r < BENCH_RING; r++) {
            engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
            a.num_tokens = (size_t)T;
            a.num_cols = (size_t)K;
            a.tables = tid[s];
            a.ids = ids + r * rows_per_call;
            a.id_type = ENGRAM_ID_INT64;
            a.out = out;
            args[s][r] = a;
        }
    }
    {
        struct lookup_op l0 = {st[0], args[0], BENCH_RING, "bench lookup"};
        struct lookup_op l1 = {st[1], args[1], BENCH_RING, "bench lookup (1 thread)"};
        struct memcpy_op m = {out, src, (size_t)bytes_per_call};
        const uint64_t budget = 1000000000u; /* 1 s per measurement unless --iters */
        if ((status = cli_measure(cli_lookup_op_run, &l0, (size_t)iters, budget, 1000000,
                                  &tm[0])) != 0 ||
            (status = cli_measure(cli_lookup_op_run, &l1, (size_t)iters, budget, 1000000,
                                  &tm[1])) != 0 ||
            (status = cli_measure(memcpy_op_run, &m, (size_t)iters, budget, 1000000,
                                  &tm[2])) != 0)
            goto out;
    }
    engram_store_stats(st[0], &stats);

    {
        double rate = cli_per_second(rows_per_call, &tm[0]);
        double r_threads = cli_ratio(rate, cli_per_second(rows_per_call, &tm[1]));
        double r_memcpy = cli_ratio(rate, cli_per_second(rows_per_call, &tm[2]));
        if (json) {
            printf("{\n  \"schema\": %d,\n  \"tables\": [", CLI_JSON_SCHEMA);
            for (int i = 0; i < cli->nargs; i++) {
                printf("%s", i ? ", " : "");
                cli_json_str(stdout, cli->args[i]);
            }
            printf("],\n  \"cols\": %" PRIu64 ",\n  \"ids\": %" PRIu64 ",\n  \"row_bytes\": %"
                   PRIu64 ",\n  \"threads\": %" PRIu32 ",\n  \"huge\": %s,\n  \"results\": {\n",
                   K, T, R, stats.threads, cli->opt[OPT_HUGE] ? "true" : "false");
            print_timing_json("engram", &tm[0], rows_per_call, bytes_per_call, 0);
            print_timing_json("engram_1thread", &tm[1], rows_per_call, bytes_per_call, 0);
            print_timing_json("memcpy", &tm[2], rows_per_call, bytes_per_call, 1);
            printf("  },\n  \"ratio_threads_vs_1thread\": %.4g,\n  \"ratio_engram_vs_memcpy\": "
                   "%.4g\n}\n", r_threads, r_memcpy);
        } else {
            static const char *const labels[3] = {"engram", "engram, 1 thread",
                                                  "memcpy, same bytes"};
            char lab0[48];
            snprintf(lab0, sizeof(lab0), "engram, %" PRIu32 " thread%s", stats.threads,
                     stats.threads == 1 ? "" : "s");
            printf("bench: %" PRIu64 " ids x %" PRIu64 " columns of %" PRIu64
                   "-byte rows per call (%s), random ids\n",
                   T, K, R, cli_fmt_bytes(bytes_per_call, b1, sizeof(b1)));
            printf("%-22s %8s %12s %12s %14s %12s\n", "", "iters", "median", "p99", "rows/s",
                   "GB/s");
            for (int i = 0; i < 3; i++) {
                char m[32], p[32];
                printf("%-22s %8zu %12s %12s %14.4g %12.3f\n", i == 0 ? lab0 : labels[i],
                       tm[i].iters, cli_fmt_ns((double)tm[i].median_ns, m, sizeof(m)),
                       cli_fmt_ns((double)tm[i].p99_ns, p, sizeof(p)),
                       cli_per_second(rows_per_call, &tm[i]),
                       cli_per_second(bytes_per_call, &tm[i]) / 1e9);
            }
            printf("ratios: %" PRIu32 " threads vs 1 thread %.2fx; engram vs memcpy of the same "
                   "bytes %.2fx\n", stats.threads, r_threads, r_memcpy);
        }
    }
out:
    for (int s = 0; s < 2; s++) {
        engram_store_close(st[s]);
        free(tid[s]);
        free(args[s]);
    }
    free(info);
    free(ids);
    free(out);
    free(src);
    return status;
}
