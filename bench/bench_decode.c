/*
 * bench_decode.c - engram_lookup() at the shapes of a decode step, against
 * a naive loop over the same memory and ids, in one run.
 *
 *   bench_decode [--sizes 64M,1G] [--tokens 1,4,16,64,256,1024,4096]
 *                [--threads 1,2] [--variants thp,shm] [--load idle,busy]
 *                [--calls N] [--quick]
 *
 * --calls is the number of calls of each side per point for T <= 16
 * (default 4000), scaled down as 16 / T above that (at least 200).
 *
 * One call per layer: K = 24 columns (8 heads x 3 n-gram orders), one table
 * each, of 264-byte rows; T tokens; ids int64 [T, 24], uniform within each
 * table, about 1% dead (-1).  The 24 tables share --sizes bytes in all:
 *
 *   thp  one anonymous region with MADV_HUGEPAGE, filled, the tables bound
 *        at consecutive offsets (engram_bind)
 *   shm  24 table files written into a namespace under /dev/shm and opened
 *        with ENGRAM_OPEN_PREFAULT (the shared mapping every rank uses)
 *
 * The baseline, naive, is what an engine writes by hand: for each id, check
 * it against its table and memcpy the row (row size known only at run
 * time; the function is noinline), on the very memory the library reads
 * (engram_table_memory()).  Per point, calls of the library and of the
 * baseline alternate in blocks of 16 with the same ids, each call timed on
 * its own (CLOCK_MONOTONIC, ~20 ns included in both); the output is the
 * median and p99 of each and naive / engram (the time ratio, higher is
 * better for engram).  --load busy adds a thread spinning on the other CPU
 * for the whole point; --threads is the store's gather threads (the
 * baseline is one thread).  The library's output is compared with the
 * baseline's once per point.
 *
 * Before timing a size, the tables are read once and, from 1 GiB up, the
 * memory is left 25 s to settle: on this kind of VM random access stays
 * several times slower for 20-30 s after a fresh multi-GiB allocation.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "engram.h"
#include "bench_util.h"

enum { K = 24, R = 264, BLOCK = 16, NSETS = 64 };

typedef struct tables {
    engram_store *st;
    engram_table_id id[K];
    const unsigned char *base[K];
    uint64_t nrows[K];
    void *region;
    size_t region_len;
    char root[128];
} tables;

/* The baseline: check each id, copy its row. */
static __attribute__((noinline)) int naive(const tables *tb, const int64_t *ids, size_t T,
                                           unsigned char *out, size_t r)
{
    for (size_t t = 0; t < T; t++) {
        for (size_t k = 0; k < K; k++) {
            int64_t id = ids[t * K + k];
            if (id == -1)
                continue;
            if ((uint64_t)id >= tb->nrows[k])
                return -1;
            memcpy(out + (t * K + k) * r, tb->base[k] + (uint64_t)id * r, r);
        }
    }
    return 0;
}

static void fill_rows(unsigned char *p, uint64_t first, uint64_t n, int k)
{
    for (uint64_t i = 0; i < n; i++)
        for (int b = 0; b < R; b += 8) {
            uint64_t v = (first + i) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(k * 1000 + b);
            memcpy(p + i * R + b, &v, R - b < 8 ? (size_t)(R - b) : 8);
        }
}

static void make_tables(tables *tb, const char *variant, uint64_t bytes, int threads)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    uint64_t per = bytes / K / R;
    memset(tb, 0, sizeof *tb);
    o.threads = threads;
    if (!strcmp(variant, "thp")) {
        size_t len = (size_t)(per * R * K), align = 2u << 20;
        unsigned char *raw = mmap(NULL, len + align, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *p;
        if (raw == MAP_FAILED) {
            perror("mmap");
            exit(1);
        }
        p = (unsigned char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
        (void)madvise(p, len, MADV_HUGEPAGE);
        tb->region = raw;
        tb->region_len = len + align;
        if (engram_store_open_memory(&o, &tb->st) != 0)
            bench_die("bench_decode", "open");
        for (int k = 0; k < K; k++) {
            engram_table_spec sp = {per, R, 0};
            char name[32];
            fill_rows(p + (size_t)k * per * R, 0, per, k);
            snprintf(name, sizeof name, "engram:l1:h%d", k);
            if (engram_bind(tb->st, name, &sp, p + (size_t)k * per * R) != 0 ||
                engram_table_open(tb->st, name, &tb->id[k]) != 0)
                bench_die("bench_decode", "bind");
        }
    } else {
        unsigned char *buf = malloc((size_t)4096 * R);
        snprintf(tb->root, sizeof tb->root, "/dev/shm/engram-bench-decode.%d", (int)getpid());
        o.flags = ENGRAM_OPEN_CREATE | ENGRAM_OPEN_PREFAULT;
        if (!buf || engram_store_open(tb->root, "ns", &o, &tb->st) != 0)
            bench_die("bench_decode", "open /dev/shm namespace");
        for (int k = 0; k < K; k++) {
            engram_table_spec sp = {per, R, 0};
            engram_writer *w;
            char name[32];
            snprintf(name, sizeof name, "engram:l1:h%d", k);
            if (engram_writer_begin(tb->st, name, &sp, &w) != 0)
                bench_die("bench_decode", "writer_begin (is /dev/shm large enough?)");
            for (uint64_t i = 0; i < per; i += 4096) {
                uint64_t n = per - i < 4096 ? per - i : 4096;
                fill_rows(buf, i, n, k);
                if (engram_writer_append(w, buf, n, 0) != 0)
                    bench_die("bench_decode", "writer_append");
            }
            if (engram_writer_commit(w) != 0 || engram_table_open(tb->st, name, &tb->id[k]) != 0)
                bench_die("bench_decode", "commit");
        }
        free(buf);
    }
    for (int k = 0; k < K; k++) {
        const void *b;
        engram_table_spec sp;
        if (engram_table_memory(tb->st, tb->id[k], &b, &sp) != 0)
            bench_die("bench_decode", "table_memory");
        tb->base[k] = b;
        tb->nrows[k] = sp.num_rows;
    }
}

static void free_tables(tables *tb)
{
    engram_store_close(tb->st);
    if (tb->region)
        munmap(tb->region, tb->region_len);
    if (tb->root[0]) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tb->root);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_decode: could not remove %s\n", tb->root);
    }
}

static atomic_int busy_stop;

static void *busy_main(void *arg)
{
    (void)arg;
    while (!atomic_load_explicit(&busy_stop, memory_order_relaxed))
        ;
    return NULL;
}

typedef struct point {
    double med[2], p99[2]; /* [engram, naive], ns */
} point;

static size_t calls_small = 4000; /* calls per point for T <= 16 */

static point run_point(const tables *tb, size_t T, int busy)
{
    /* Fewer calls for big batches (a 4096-token call takes milliseconds),
     * but at least 200 for a p99. */
    size_t ncalls = T <= 16 ? calls_small : calls_small * 16 / T < 200 ? 200 : calls_small * 16 / T;
    int64_t *ids = malloc(NSETS * T * K * sizeof *ids);
    unsigned char *out = malloc(T * K * R), *ref = malloc(T * K * R);
    uint64_t *lat[2], seed = 7 + T;
    size_t n[2] = {0, 0};
    pthread_t th;
    point pt;
    if (!ids || !out || !ref)
        exit(1);
    lat[0] = malloc(ncalls * sizeof(uint64_t));
    lat[1] = malloc(ncalls * sizeof(uint64_t));
    for (size_t i = 0; i < NSETS * T * K; i++) {
        size_t k = i % K;
        ids[i] = bench_rng(&seed) % 100 == 0 ? -1 : (int64_t)(bench_rng(&seed) % tb->nrows[k]);
    }
    if (busy) {
        cpu_set_t cs;
        atomic_store(&busy_stop, 0);
        pthread_create(&th, NULL, busy_main, NULL);
        CPU_ZERO(&cs);
        CPU_SET(1, &cs);
        (void)pthread_setaffinity_np(th, sizeof cs, &cs);
    }
    {
        /* Once: the library's rows are the baseline's. */
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        a.num_tokens = T;
        a.num_cols = K;
        a.tables = tb->id;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        memset(out, 0, T * K * R);
        memset(ref, 0, T * K * R);
        if (engram_lookup(tb->st, &a) != 0 || naive(tb, ids, T, ref, R) != 0)
            bench_die("bench_decode", "lookup");
        if (memcmp(out, ref, T * K * R) != 0) {
            fprintf(stderr, "bench_decode: the library's rows differ from the baseline's\n");
            exit(1);
        }
    }
    for (size_t call = 0; n[0] < ncalls || n[1] < ncalls; call++) {
        int who = (int)((call / BLOCK) % 2);
        const int64_t *id = ids + (call / 2 % NSETS) * T * K;
        uint64_t t0, t1;
        if (n[who] >= ncalls)
            continue;
        if (who == 0) {
            engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
            a.num_tokens = T;
            a.num_cols = K;
            a.tables = tb->id;
            a.ids = id;
            a.id_type = ENGRAM_ID_INT64;
            a.out = out;
            t0 = bench_now_ns();
            if (engram_lookup(tb->st, &a) != 0)
                bench_die("bench_decode", "lookup");
            t1 = bench_now_ns();
        } else {
            t0 = bench_now_ns();
            if (naive(tb, id, T, ref, R) != 0)
                bench_die("bench_decode", "naive");
            t1 = bench_now_ns();
        }
        lat[who][n[who]++] = t1 - t0;
    }
    if (busy) {
        atomic_store(&busy_stop, 1);
        pthread_join(th, NULL);
    }
    for (int w = 0; w < 2; w++) {
        qsort(lat[w], ncalls, sizeof(uint64_t), bench_cmp_u64);
        pt.med[w] = (double)lat[w][ncalls / 2];
        pt.p99[w] = (double)lat[w][ncalls * 99 / 100];
        free(lat[w]);
    }
    free(ids);
    free(out);
    free(ref);
    return pt;
}

/* Parses "1,4,16" or "64M,1G" into v (at most 16); returns the count. */
static int parse_list(const char *s, uint64_t *v)
{
    int n = 0;
    while (*s && n < 16) {
        char *e;
        uint64_t x = strtoull(s, &e, 10);
        if (*e == 'K' || *e == 'k')
            x <<= 10, e++;
        else if (*e == 'M' || *e == 'm')
            x <<= 20, e++;
        else if (*e == 'G' || *e == 'g')
            x <<= 30, e++;
        v[n++] = x;
        s = *e == ',' ? e + 1 : e;
        if (*e && *e != ',')
            break;
    }
    return n;
}

int main(int argc, char **argv)
{
    uint64_t sizes[16] = {64ull << 20, 1ull << 30}, tokens[16] = {1, 4, 16, 64, 256, 1024, 4096},
             thr[16] = {1, 2};
    int nsizes = 2, ntok = 7, nthr = 2, variants[2] = {1, 1}, loads[2] = {1, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--quick")) {
            sizes[0] = 64ull << 20;
            nsizes = 1;
            calls_small = 400;
            continue;
        }
        i++;
        if (!strcmp(a, "--sizes"))
            nsizes = parse_list(v, sizes);
        else if (!strcmp(a, "--tokens"))
            ntok = parse_list(v, tokens);
        else if (!strcmp(a, "--threads"))
            nthr = parse_list(v, thr);
        else if (!strcmp(a, "--calls"))
            calls_small = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--variants")) {
            variants[0] = strstr(v, "thp") != NULL;
            variants[1] = strstr(v, "shm") != NULL;
        } else if (!strcmp(a, "--load")) {
            loads[0] = strstr(v, "idle") != NULL;
            loads[1] = strstr(v, "busy") != NULL;
        } else {
            fprintf(stderr, "usage: see the comment at the top of bench/bench_decode.c\n");
            return 2;
        }
    }
    if (calls_small < 200) {
        fprintf(stderr, "bench_decode: --calls must be >= 200 for a p99\n");
        return 2;
    }
    printf("bench_decode: libengram %s; K=%d columns of %d-byte rows; %zu calls per point "
           "(fewer from T = 32 up, at least 200); %ld CPUs\n", engram_version_string(), K, R,
           calls_small, sysconf(_SC_NPROCESSORS_ONLN));
    printf("  naive/engram: the baseline's median time over the library's (higher is better "
           "for engram); p99/med of the library\n");
    for (int si = 0; si < nsizes; si++) {
        for (int vi = 0; vi < 2; vi++) {
            if (!variants[vi])
                continue;
            for (int ti = 0; ti < nthr; ti++) {
                tables tb;
                double worst = 1e9, worst_tail = 0;
                make_tables(&tb, vi ? "shm" : "thp", sizes[si], (int)thr[ti]);
                if (sizes[si] >= (1ull << 30) && ti == 0) {
                    printf("  (letting %" PRIu64 " MiB of fresh memory settle for 25 s)\n",
                           sizes[si] >> 20);
                    fflush(stdout);
                    sleep(25);
                }
                for (int li = 0; li < 2; li++) {
                    if (!loads[li])
                        continue;
                    printf("\n  %" PRIu64 " MiB %s, threads=%" PRIu64 ", %s\n", sizes[si] >> 20,
                           vi ? "shm" : "thp", thr[ti], li ? "busy loop on the other CPU" : "idle");
                    printf("  %6s %12s %12s %12s %12s %13s %8s\n", "T", "engram med", "engram p99",
                           "naive med", "naive p99", "naive/engram", "p99/med");
                    for (int k = 0; k < ntok; k++) {
                        point pt = run_point(&tb, tokens[k], li);
                        double ratio = pt.med[1] / pt.med[0], tail = pt.p99[0] / pt.med[0];
                        printf("  %6" PRIu64 " %10.0f ns %10.0f ns %10.0f ns %10.0f ns %12.2fx "
                               "%7.2fx\n",
                               tokens[k], pt.med[0], pt.p99[0], pt.med[1], pt.p99[1], ratio, tail);
                        fflush(stdout);
                        if (ratio < worst)
                            worst = ratio;
                        if (tail > worst_tail)
                            worst_tail = tail;
                    }
                }
                printf("  -> lowest naive/engram %.2fx (%s), highest p99/median %.2fx\n", worst,
                       worst >= 1.0 ? "engram at least as fast everywhere"
                                    : "the naive loop wins somewhere: see the rows below 1.00x",
                       worst_tail);
                free_tables(&tb);
            }
        }
    }
    return 0;
}
