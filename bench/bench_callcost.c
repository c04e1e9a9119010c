/*
 * bench_callcost.c - the instructions of one decode-step lookup (K = 24
 * tables of 264-byte rows, T tokens, rows in the caches) against the naive
 * loop, counted rather than timed, so that a change of a few dozen
 * instructions shows on a noisy machine:
 *
 *   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
 *       build/release/bench_callcost engram 1      # instructions of 100000 calls
 *   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
 *       build/release/bench_callcost naive 1
 *
 * Each run prints the setup's instruction count to subtract (a run with
 * 0 calls: `bench_callcost engram 1 0`), so instructions per call =
 * (I refs of the run - I refs of the 0-call run) / calls.  The tables
 * (24 x 2000 rows, 12.7 MiB: within half of a 32 MiB last-level cache,
 * so the library copies without prefetching) are bound memory; 64 sets
 * of ids are cycled.  With L > 1 (`bench_callcost engram 1 100000 L`),
 * the calls go through L layers in turn, as an engine's decode step does:
 * the same 24 buffers bound as L sets of 24 tables.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram.h"

enum { K = 24, R = 264, ROWS = 2000, SETS = 64, LAYERS_MAX = 16 };

static unsigned char *bases[K];

static __attribute__((noinline)) int naive(const int64_t *ids, size_t T, unsigned char *out,
                                           size_t r)
{
    for (size_t t = 0; t < T; t++)
        for (size_t k = 0; k < K; k++) {
            int64_t id = ids[t * K + k];
            if (id == -1)
                continue;
            if ((uint64_t)id >= ROWS)
                return -1;
            memcpy(out + (t * K + k) * r, bases[k] + (uint64_t)id * r, r);
        }
    return 0;
}

int main(int argc, char **argv)
{
    int use_naive = argc > 1 && !strcmp(argv[1], "naive");
    size_t T = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    long calls = argc > 3 ? atol(argv[3]) : 100000;
    int layers = argc > 4 ? atoi(argv[4]) : 1;
    /* Through a volatile: the row size stays a run-time value for naive. */
    volatile size_t rsize = R;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st;
    engram_table_id tabs[LAYERS_MAX][K];
    int64_t *ids;
    unsigned char *out;
    if (argc < 2 || T == 0 || layers < 1 || layers > LAYERS_MAX) {
        fprintf(stderr, "usage: bench_callcost engram|naive [T] [calls] [layers 1..16]\n");
        return 2;
    }
    o.threads = 1;
    if (engram_store_open_memory(&o, &st) != 0)
        return 1;
    for (int k = 0; k < K; k++) {
        engram_table_spec sp = {ROWS, R, 0};
        char name[32];
        if (!(bases[k] = malloc((size_t)ROWS * R)))
            return 1;
        memset(bases[k], k, (size_t)ROWS * R);
        for (int l = 0; l < layers; l++) {
            snprintf(name, sizeof name, "engram:l%d:h%d", l + 1, k);
            if (engram_bind(st, name, &sp, bases[k]) != 0 ||
                engram_table_open(st, name, &tabs[l][k]))
                return 1;
        }
    }
    ids = malloc(SETS * T * K * sizeof *ids);
    out = malloc(T * K * R);
    if (!ids || !out)
        return 1;
    for (size_t i = 0; i < SETS * T * K; i++)
        ids[i] = (int64_t)(i * 797 % ROWS);
    for (long c = 0; c < calls; c++) {
        const int64_t *id = ids + (size_t)(c % SETS) * T * K;
        if (use_naive) {
            if (naive(id, T, out, rsize) != 0)
                return 1;
        } else {
            engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
            a.num_tokens = T;
            a.num_cols = K;
            a.tables = tabs[c % layers];
            a.ids = id;
            a.id_type = ENGRAM_ID_INT64;
            a.out = out;
            if (engram_lookup(st, &a) != 0)
                return 1;
        }
    }
    printf("%s: %ld calls of T=%zu, K=%d, %d layer%s (first byte %d)\n",
           use_naive ? "naive" : "engram", calls, T, K, layers, layers == 1 ? "" : "s", out[0]);
    engram_store_close(st);
    return 0;
}
