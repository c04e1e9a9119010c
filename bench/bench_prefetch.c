/*
 * bench_prefetch.c - an engine-like decode loop over slow tiers: every
 * Engram layer's tokens-to-rows submitted at the start of a step
 * (engram_ngram_lookup_submit) and waited for when the layer runs, against
 * the same loop with each layer's lookup made inline (engram_ngram_lookup),
 * in one run.
 *
 *   bench_prefetch [--tiers file,redis] [--work-us W] [--tokens T] [--steps S]
 *                  [--vocab V] [--dir DIR] [--quick]
 *
 * The layout has V4.1's shape (2 layers, 4-grams, 8 heads: 24 columns a
 * layer) with a base size of --vocab (20,000: ~480,000 rows of 264 bytes,
 * ~127 MiB a layer), each layer one table.  A step hashes T tokens (64, a
 * decode step of 64 requests, as one chunk after 3 tokens of history) and
 * does W microseconds of other work (1000: a busy loop, the model's
 * layers), half before each Engram layer:
 *
 *   inline    work/2, layer 1's rows, work/2, layer 14's rows
 *   prefetch  submit both layers, work/2, wait layer 1, work/2, wait 14
 *
 * Tiers:
 *   file   the tables as files of a namespace under --dir (default: a
 *          scratch directory under the current one, on its disk), opened
 *          with ENGRAM_OPEN_FILE_CACHE and a row cache of 1% of the rows,
 *          so most rows are read from the file (O_DIRECT where the file
 *          system allows it)
 *   redis  the tables pushed to a Redis Cluster of 3 masters this run
 *          starts on loopback ports (as tests/redis_util.h does), read
 *          without a row cache
 *
 * The store has 2 gather threads, so 2 lookup threads.  Reported per tier:
 * the medians over 5 repetitions of S steps (100) of each loop, alternated,
 * per step; the lookups' own time per step (inline minus work); and the
 * hidden fraction 1 - (prefetch - work) / (inline - work): the share of
 * the lookups' time the prefetch took off the step.  Every step's rows are
 * compared once with a direct lookup of the same ids.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "bench_util.h"
#ifdef ENGRAM_BENCH_REDIS
#include "redis_util.h"
#endif

enum { C = 24, R = 264, NL = 2, REPS = 5 };

static volatile uint64_t sink;

/* The model's work: a busy loop of `us` microseconds. */
static void work(uint64_t us)
{
    uint64_t end = bench_now_ns() + us * 1000u, x = 0;
    while (bench_now_ns() < end)
        for (int i = 0; i < 64; i++)
            x = x * 6364136223846793005ull + 1;
    sink = x;
}

typedef struct tier {
    const char *name;
    engram_store *st;
    engram_table_id t[NL];
} tier;

typedef struct setup {
    engram_ngram_hasher *h;
    size_t T, steps;
    uint64_t work_us;
    int64_t *tokens; /* [steps][T] */
    int64_t hist[3];
    unsigned char *out[NL];
} setup;

static void args_of(const setup *s, size_t step, int layer, engram_ngram_hash_args *ha,
                    engram_lookup_args *la, void *out)
{
    *ha = (engram_ngram_hash_args)ENGRAM_NGRAM_HASH_ARGS_INIT;
    *la = (engram_lookup_args)ENGRAM_LOOKUP_ARGS_INIT;
    ha->num_tokens = s->T;
    ha->tokens = s->tokens + step * s->T;
    ha->token_type = ENGRAM_ID_INT64;
    ha->history = s->hist;
    ha->history_len = 3;
    ha->layer = layer;
    la->out = out;
}

/* One pass of S steps: ns per step. */
static uint64_t run(const tier *t, const setup *s, int prefetch)
{
    uint64_t t0 = bench_now_ns();
    for (size_t step = 0; step < s->steps; step++) {
        engram_ngram_hash_args ha[NL];
        engram_lookup_args la[NL];
        engram_pending *p[NL];
        for (int l = 0; l < NL; l++)
            args_of(s, step, l, &ha[l], &la[l], s->out[l]);
        if (prefetch) {
            for (int l = 0; l < NL; l++)
                if (engram_ngram_lookup_submit(t->st, s->h, &ha[l], &t->t[l], 1, &la[l], &p[l]) !=
                    0)
                    bench_die("bench_prefetch", "submit");
            for (int l = 0; l < NL; l++) {
                work(s->work_us / 2);
                if (engram_lookup_wait(p[l]) != 0)
                    bench_die("bench_prefetch", "wait");
            }
        } else {
            for (int l = 0; l < NL; l++) {
                work(s->work_us / 2);
                if (engram_ngram_lookup(t->st, s->h, &ha[l], &t->t[l], 1, &la[l]) != 0)
                    bench_die("bench_prefetch", "lookup");
            }
        }
    }
    return (bench_now_ns() - t0) / s->steps;
}

static void measure(const tier *t, const setup *s)
{
    uint64_t in[REPS], pf[REPS], wk[REPS];
    unsigned char *check = malloc(s->T * C * R);
    /* Every layer's rows of step 0, from both loops, against a lookup. */
    for (int mode = 0; mode < 2; mode++) {
        setup one = *s;
        one.steps = 1;
        run(t, &one, mode);
        for (int l = 0; l < NL; l++) {
            engram_ngram_hash_args ha;
            engram_lookup_args la;
            args_of(s, 0, l, &ha, &la, check);
            if (engram_ngram_lookup(t->st, s->h, &ha, &t->t[l], 1, &la) != 0)
                bench_die("bench_prefetch", "check");
            if (memcmp(check, s->out[l], s->T * C * R) != 0) {
                fprintf(stderr, "bench_prefetch: %s: rows differ\n", t->name);
                exit(1);
            }
        }
    }
    free(check);
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = bench_now_ns();
        for (size_t i = 0; i < s->steps; i++)
            work(s->work_us);
        wk[r] = (bench_now_ns() - t0) / s->steps;
        if (r % 2) {
            pf[r] = run(t, s, 1);
            in[r] = run(t, s, 0);
        } else {
            in[r] = run(t, s, 0);
            pf[r] = run(t, s, 1);
        }
    }
    qsort(in, REPS, sizeof *in, bench_cmp_u64);
    qsort(pf, REPS, sizeof *pf, bench_cmp_u64);
    qsort(wk, REPS, sizeof *wk, bench_cmp_u64);
    {
        double w = (double)wk[REPS / 2], i = (double)in[REPS / 2], p = (double)pf[REPS / 2];
        double lk = i - w, hidden = lk > 0 ? 1.0 - (p - w) / lk : 0;
        printf("%-6s  inline %8.1f us/step  prefetch %8.1f us/step  work %7.1f us  "
               "lookups %7.1f us/step  hidden %5.1f%%  (inline %.1f-%.1f, prefetch %.1f-%.1f)\n",
               t->name, i / 1e3, p / 1e3, w / 1e3, lk / 1e3, 100 * hidden, (double)in[0] / 1e3,
               (double)in[REPS - 1] / 1e3, (double)pf[0] / 1e3, (double)pf[REPS - 1] / 1e3);
        fflush(stdout);
    }
}

/* Writes both layers' tables (random rows) into store `st`. */
static void populate(engram_store *st, const engram_ngram_layout_info *li)
{
    uint64_t seed = 7;
    for (int l = 0; l < NL; l++) {
        engram_table_spec spec = {li->num_rows[l], R, 0};
        engram_writer *w;
        unsigned char *buf = malloc((size_t)4096 * R);
        char name[32];
        snprintf(name, sizeof name, "layer%" PRId64, li->layer_ids[l]);
        if (engram_writer_begin(st, name, &spec, &w) != 0)
            bench_die("bench_prefetch", "writer_begin");
        for (uint64_t done = 0; done < spec.num_rows;) {
            uint64_t n = spec.num_rows - done < 4096 ? spec.num_rows - done : 4096;
            for (size_t i = 0; i < n * R; i += 8) {
                uint64_t x = bench_rng(&seed);
                memcpy(buf + i, &x, 8);
            }
            if (engram_writer_append(w, buf, n, 0) != 0)
                bench_die("bench_prefetch", "writer_append");
            done += n;
        }
        if (engram_writer_commit(w) != 0)
            bench_die("bench_prefetch", "writer_commit");
        free(buf);
    }
}

static void open_tables(tier *t, const engram_ngram_layout_info *li)
{
    for (int l = 0; l < NL; l++) {
        char name[32];
        snprintf(name, sizeof name, "layer%" PRId64, li->layer_ids[l]);
        if (engram_table_open(t->st, name, &t->t[l]) != 0)
            bench_die("bench_prefetch", "table_open");
    }
}

int main(int argc, char **argv)
{
    static const int64_t layers[NL] = {1, 14};
    const char *tiers = "file,redis", *dir = NULL;
    uint64_t vocab = 20000, seed = 42;
    setup s = {NULL, 64, 100, 1000, NULL, {5, 6, 7}, {NULL, NULL}};
    engram_ngram_config cfg = ENGRAM_NGRAM_CONFIG_INIT;
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    engram_ngram_layout *lay;
    char scratch[512] = "";

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            vocab = 2000;
            s.steps = 10;
        } else if (strcmp(argv[i], "--tiers") == 0 && i + 1 < argc) {
            tiers = argv[++i];
        } else if (strcmp(argv[i], "--work-us") == 0 && i + 1 < argc) {
            s.work_us = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
            s.T = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
            s.steps = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) {
            vocab = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_prefetch [--tiers file,redis] [--work-us W] "
                            "[--tokens T] [--steps S] [--vocab V] [--dir DIR] [--quick]\n");
            return 2;
        }
    }
    if (s.T == 0 || s.steps == 0) {
        fprintf(stderr, "bench_prefetch: --tokens and --steps must be positive\n");
        return 2;
    }
    cfg.num_layers = NL;
    cfg.layer_ids = layers;
    cfg.vocab_size = vocab;
    cfg.max_ngram = 4;
    cfg.heads = 8;
    cfg.compressed_vocab = 99092;
    cfg.pad_id = 2;
    if (engram_ngram_layout_create(&cfg, &lay) != 0 ||
        engram_ngram_hasher_create(lay, NULL, 0, &s.h) != 0)
        bench_die("bench_prefetch", "layout");
    engram_get_ngram_layout_info(lay, &li);
    s.tokens = malloc(s.steps * s.T * sizeof *s.tokens);
    for (size_t i = 0; i < s.steps * s.T; i++)
        s.tokens[i] = (int64_t)(bench_rng(&seed) % 99092);
    for (int l = 0; l < NL; l++)
        s.out[l] = malloc(s.T * C * R);
    {
        double load[1] = {0};
        getloadavg(load, 1);
        printf("bench_prefetch: libengram %s; 2 layers of %" PRIu64 " and %" PRIu64
               " rows of %d bytes; T = %zu tokens a step, %zu steps, %" PRIu64
               " us of work a step; load average %.2f\n",
               engram_version_string(), li.num_rows[0], li.num_rows[1], R, s.T, s.steps,
               s.work_us, load[0]);
    }

    if (strstr(tiers, "file")) {
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        tier t = {"file", NULL, {0, 0}};
        engram_store *w;
        if (!dir) {
            snprintf(scratch, sizeof scratch, "bench-prefetch.%d", (int)getpid());
            if (mkdir(scratch, 0700) != 0) {
                perror("mkdir");
                return 1;
            }
            dir = scratch;
        }
        o.flags = ENGRAM_OPEN_CREATE;
        o.threads = 1;
        if (engram_store_open(dir, "prefetch", &o, &w) != 0)
            bench_die("bench_prefetch", "store_open");
        populate(w, &li);
        engram_store_close(w);
        o.flags = ENGRAM_OPEN_FILE_CACHE;
        o.threads = 2;
        o.cache_bytes = (li.num_rows[0] + li.num_rows[1]) * R / 100;
        if (engram_store_open(dir, "prefetch", &o, &t.st) != 0)
            bench_die("bench_prefetch", "store_open (file cache)");
        open_tables(&t, &li);
        measure(&t, &s);
        engram_store_close(t.st);
        if (scratch[0] &&
            engram_namespace_remove(dir, "prefetch", ENGRAM_NS_REMOVE_TABLES) == 0)
            rmdir(scratch);
    }
#ifdef ENGRAM_BENCH_REDIS
    if (strstr(tiers, "redis")) {
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        tier t = {"redis", NULL, {0, 0}};
        tr_cluster cl;
        int rc = tr_start(&cl, 3, 0, NULL, NULL);
        if (rc != 0)
            return rc;
        o.threads = 2;
        o.cache_bytes = 1; /* below one cache set: no row cache */
        if (engram_store_open_redis(cl.nodes, "prefetch", &o, NULL, &t.st) != 0)
            bench_die("bench_prefetch", "store_open_redis");
        populate(t.st, &li);
        open_tables(&t, &li);
        measure(&t, &s);
        engram_store_close(t.st);
        tr_stop(&cl);
    }
#else
    if (strstr(tiers, "redis"))
        printf("redis   skipped: this build has no Redis support\n");
#endif
    for (int l = 0; l < NL; l++)
        free(s.out[l]);
    free(s.tokens);
    engram_ngram_hasher_destroy(s.h);
    engram_ngram_layout_destroy(lay);
    return 0;
}
