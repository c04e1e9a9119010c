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
 * Calls of the two alternate in blocks of 16, each timed alone; the
 * output is the median and p99 of each and fused / lookup (the goal: at
 * most 1.1).  Two tables: the same tokens every call (the 24 x T rows stay
 * in the CPU's caches, so the lookup is as cheap as it gets and the hash's
 * share is largest), and fresh tokens every call, as in decoding, where
 * each step brings new n-grams and so rows from memory (each call reads a
 * window of tokens no other call reads).  The two outputs are compared
 * once per point.  Before timing, the table is read once and left 25 s to settle
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

/* One point: T tokens a call, n calls of each kind (fewer above T = 16).
 * With `fresh`, every call reads a window of tokens of its own (the
 * lookup's windows and the fused call's are different ones, hashed alike),
 * as a decode step does; else every call reads the same window.  0, or -1
 * with a message. */
static int point(engram_store *st, const engram_ngram_hasher *h, engram_table_id tid,
                 const engram_table_id *tids, size_t T, uint64_t calls, int fresh, uint64_t *seed)
{
    size_t n = T <= 16 ? calls : calls * 16 / T, W, k1 = 0, k2 = 0;
    int64_t *tok, *hist, *ids;
    unsigned char *out1 = malloc(T * C * R), *out2 = malloc(T * C * R);
    uint64_t *t1, *t2;
    engram_ngram_hash_args ha = ENGRAM_NGRAM_HASH_ARGS_INIT;
    engram_lookup_args la = ENGRAM_LOOKUP_ARGS_INIT, fa = ENGRAM_LOOKUP_ARGS_INIT;
    int rc = -1;
    if (n < BLOCK)
        n = BLOCK;
    W = fresh ? 2 * n : 1; /* windows [0, n) for the lookup, [n, 2n) fused */
    tok = malloc(W * T * 8);
    hist = malloc(W * 3 * 8);
    ids = malloc(W * T * C * 8);
    t1 = malloc(n * 8);
    t2 = malloc(n * 8);
    if (!out1 || !out2 || !tok || !hist || !ids || !t1 || !t2) {
        fprintf(stderr, "bench_ngram: out of memory at T = %zu\n", T);
        goto out;
    }
    for (size_t i = 0; i < W * T; i++)
        tok[i] = bench_rng(seed) % 100 == 0 ? -1 : (int64_t)(bench_rng(seed) % 99092);
    for (size_t i = 0; i < W * 3; i++)
        hist[i] = (int64_t)(bench_rng(seed) % 99092);
    ha.num_tokens = T;
    ha.token_type = ENGRAM_ID_INT64;
    ha.history_len = 3;
    ha.layer = 0;
    for (size_t w = 0; w < W; w++) {
        engram_ngram_hash_args g = ha;
        g.tokens = tok + w * T;
        g.history = hist + w * 3;
        g.out = ids + w * T * C;
        g.out_type = ENGRAM_ID_INT64;
        if (engram_ngram_hash(h, &g) != 0)
            bench_die("bench_ngram", "hash");
    }
    la.num_tokens = T;
    la.num_cols = C;
    la.tables = tids;
    la.id_type = ENGRAM_ID_INT64;
    la.out = out1;
    fa.out = out2;
    /* One check: both kinds of call give the same rows for one window. */
    la.ids = ids;
    ha.tokens = tok;
    ha.history = hist;
    if (engram_lookup(st, &la) != 0 || engram_ngram_lookup(st, h, &ha, &tid, 1, &fa) != 0)
        bench_die("bench_ngram", "warm-up");
    if (memcmp(out1, out2, T * C * R) != 0) {
        fprintf(stderr, "bench_ngram: the fused lookup's rows differ at T = %zu\n", T);
        goto out;
    }
    while (k1 < n || k2 < n) {
        for (int b = 0; b < BLOCK && k1 < n; b++) {
            uint64_t t0;
            la.ids = ids + (fresh ? k1 : 0) * T * C;
            t0 = bench_now_ns();
            engram_lookup(st, &la);
            t1[k1++] = bench_now_ns() - t0;
        }
        for (int b = 0; b < BLOCK && k2 < n; b++) {
            size_t w = fresh ? n + k2 : 0;
            uint64_t t0;
            ha.tokens = tok + w * T;
            ha.history = hist + w * 3;
            t0 = bench_now_ns();
            engram_ngram_lookup(st, h, &ha, &tid, 1, &fa);
            t2[k2++] = bench_now_ns() - t0;
        }
    }
    {
        uint64_t l50 = pct(t1, n, 0.5), l99 = pct(t1, n, 0.99);
        uint64_t f50 = pct(t2, n, 0.5), f99 = pct(t2, n, 0.99);
        printf("%6zu %10" PRIu64 "ns %10" PRIu64 "ns %10" PRIu64 "ns %10" PRIu64 "ns %9.2fx\n", T,
               l50, f50, l99, f99, (double)f50 / (double)l50);
    }
    rc = 0;
out:
    free(tok);
    free(hist);
    free(ids);
    free(out1);
    free(out2);
    free(t1);
    free(t2);
    return rc;
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
    for (int fresh = 0; fresh < 2; fresh++) {
        printf("\n%s\n", fresh ? "fresh tokens each call (a decode step: new n-grams, rows from "
                                  "memory)"
                                : "the same tokens each call (rows stay in the CPU's caches: the "
                                  "hash's worst case)");
        printf("%6s %12s %12s %12s %12s %10s\n", "T", "lookup p50", "fused p50", "lookup p99",
               "fused p99", "fused/lkup");
        for (size_t ti = 0; ti < ntok; ti++)
            if (point(st, h, tid, tids, tokens[ti], calls, fresh, &seed) != 0)
                return 1;
    }
    engram_store_close(st);
    engram_ngram_hasher_destroy(h);
    engram_ngram_layout_destroy(lay);
    munmap(mem, bytes);
    return 0;
}
