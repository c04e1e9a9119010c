/*
 * bench_ngram.c - tokens to rows at decode shapes: engram_ngram_lookup()
 * (hash and lookup in one call) against engram_lookup() of ids hashed
 * beforehand (the lookup alone), in one run.
 *
 *   bench_ngram [--tokens 1,4,16,64] [--vocab V] [--calls N] [--quick]
 *
 * The layout is DeepSeek-V4.1's shape (2 layers, 4-grams, 8 heads: 24
 * columns, compressed_vocab 99,092) with a smaller base size (--vocab,
 * default 170,000: a layer of ~4.1 M rows of 264 bytes, ~1 GiB), so the
 * layer's table fits this machine; the hash costs the same whatever the
 * primes.  One layer's table is bound from an anonymous region with
 * MADV_HUGEPAGE, filled.  Each call reads T tokens of one request after its
 * 3 tokens of history (uniform compressed ids, ~1% DEAD), 24 rows each:
 *
 *   lookup  engram_lookup() of the T x 24 global ids, hashed before the
 *           timing (what an engine pays once the ids exist)
 *   fused   engram_ngram_lookup() of the tokens (hash + lookup)
 *
 * Calls of the two alternate in blocks of 16 with the same tokens, each
 * timed alone; the output is the median and p99 of each and fused /
 * lookup (the goal: at most 1.1).  The two outputs are compared once per
 * point.  Before timing, the table is read once and left 25 s to settle
 * (this kind of VM keeps random access slow for a while after a fresh
 * multi-GiB allocation; --quick skips that and uses 64 MiB).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "bench_util.h"

enum { C = 24, R = 264, BLOCK = 16 };

static uint64_t pct(uint64_t *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, bench_cmp_u64);
    return v[(size_t)(p * (double)(n - 1))];
}

int main(int argc, char **argv)
{
    static const int64_t layers[2] = {1, 14};
    size_t tokens[16] = {1, 4, 16, 64}, ntok = 4;
    uint64_t vocab = 170000, calls = 4000, seed = 42;
    int quick = 0;
    engram_ngram_config cfg = ENGRAM_NGRAM_CONFIG_INIT;
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_ngram_layout *lay;
    engram_ngram_hasher *h;
    engram_store *st;
    engram_table_id tid, tids[C];
    unsigned char *mem;
    size_t bytes;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
            vocab = 10000;
            calls = 1000;
        } else if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) {
            vocab = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
            calls = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
            char *p = argv[++i];
            ntok = 0;
            while (*p && ntok < 16) {
                tokens[ntok++] = strtoull(p, &p, 10);
                if (*p == ',')
                    p++;
            }
        } else {
            fprintf(stderr, "usage: bench_ngram [--tokens 1,4,16,64] [--vocab V] [--calls N] "
                            "[--quick]\n");
            return 2;
        }
    }
    cfg.num_layers = 2;
    cfg.layer_ids = layers;
    cfg.vocab_size = vocab;
    cfg.max_ngram = 4;
    cfg.heads = 8;
    cfg.compressed_vocab = 99092;
    cfg.pad_id = 2;
    if (engram_ngram_layout_create(&cfg, &lay) != 0 ||
        engram_ngram_hasher_create(lay, NULL, 0, &h) != 0)
        bench_die("bench_ngram", "layout");
    engram_get_ngram_layout_info(lay, &li);
    bytes = (size_t)li.num_rows[0] * R;
    mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    madvise(mem, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < bytes; i += 4096)
        mem[i] = (unsigned char)(i >> 12);
    for (size_t i = 0; i < li.num_rows[0]; i++)
        memcpy(mem + i * R, &i, sizeof i);
    o.threads = 1;
    if (engram_store_open_memory(&o, &st) != 0)
        bench_die("bench_ngram", "store");
    {
        engram_table_spec spec = {li.num_rows[0], R, 0};
        if (engram_bind(st, "layer", &spec, mem) != 0 || engram_table_open(st, "layer", &tid) != 0)
            bench_die("bench_ngram", "bind");
    }
    for (int c = 0; c < C; c++)
        tids[c] = tid;
    if (!quick) {
        printf("settling %.1f GiB for 25 s\n", (double)bytes / (1 << 30));
        fflush(stdout);
        sleep(25);
    }
    {
        double load[1];
        if (getloadavg(load, 1) == 1)
            printf("layer table %" PRIu64 " rows of %d bytes (%.2f GiB); load average %.2f\n",
                   li.num_rows[0], R, (double)bytes / (1 << 30), load[0]);
    }
    printf("%6s %12s %12s %12s %12s %10s\n", "T", "lookup p50", "fused p50", "lookup p99",
           "fused p99", "fused/lkup");
    for (size_t ti = 0; ti < ntok; ti++) {
        size_t T = tokens[ti], n = T <= 16 ? calls : calls * 16 / T;
        int64_t *tok = malloc(T * 8), hist[3], *ids = malloc(T * C * 8);
        unsigned char *out1 = malloc(T * C * R), *out2 = malloc(T * C * R);
        uint64_t *t1 = malloc(n * 8), *t2 = malloc(n * 8);
        engram_ngram_hash_args ha = ENGRAM_NGRAM_HASH_ARGS_INIT;
        engram_lookup_args la = ENGRAM_LOOKUP_ARGS_INIT, fa = ENGRAM_LOOKUP_ARGS_INIT;
        size_t k1 = 0, k2 = 0;
        if (n < BLOCK)
            n = BLOCK;
        for (size_t i = 0; i < T; i++)
            tok[i] = bench_rng(&seed) % 100 == 0 ? -1 : (int64_t)(bench_rng(&seed) % 99092);
        for (int i = 0; i < 3; i++)
            hist[i] = (int64_t)(bench_rng(&seed) % 99092);
        ha.num_tokens = T;
        ha.tokens = tok;
        ha.token_type = ENGRAM_ID_INT64;
        ha.history = hist;
        ha.history_len = 3;
        ha.layer = 0;
        {
            engram_ngram_hash_args g = ha;
            g.out = ids;
            g.out_type = ENGRAM_ID_INT64;
            if (engram_ngram_hash(h, &g) != 0)
                bench_die("bench_ngram", "hash");
        }
        la.num_tokens = T;
        la.num_cols = C;
        la.tables = tids;
        la.ids = ids;
        la.id_type = ENGRAM_ID_INT64;
        la.out = out1;
        fa.out = out2;
        if (engram_lookup(st, &la) != 0 || engram_ngram_lookup(st, h, &ha, &tid, 1, &fa) != 0)
            bench_die("bench_ngram", "warm-up");
        if (memcmp(out1, out2, T * C * R) != 0) {
            fprintf(stderr, "bench_ngram: the fused lookup's rows differ at T = %zu\n", T);
            return 1;
        }
        while (k1 < n || k2 < n) {
            for (int b = 0; b < BLOCK && k1 < n; b++) {
                uint64_t t0 = bench_now_ns();
                engram_lookup(st, &la);
                t1[k1++] = bench_now_ns() - t0;
            }
            for (int b = 0; b < BLOCK && k2 < n; b++) {
                uint64_t t0 = bench_now_ns();
                engram_ngram_lookup(st, h, &ha, &tid, 1, &fa);
                t2[k2++] = bench_now_ns() - t0;
            }
        }
        {
            uint64_t l50 = pct(t1, n, 0.5), l99 = pct(t1, n, 0.99);
            uint64_t f50 = pct(t2, n, 0.5), f99 = pct(t2, n, 0.99);
            printf("%6zu %10" PRIu64 "ns %10" PRIu64 "ns %10" PRIu64 "ns %10" PRIu64
                   "ns %9.2fx\n",
                   T, l50, f50, l99, f99, (double)f50 / (double)l50);
        }
        free(tok);
        free(ids);
        free(out1);
        free(out2);
        free(t1);
        free(t2);
    }
    engram_store_close(st);
    engram_ngram_hasher_destroy(h);
    engram_ngram_layout_destroy(lay);
    munmap(mem, bytes);
    return 0;
}
