/*
 * test_filesrc.c - file-backed tables behind the row cache
 * (ENGRAM_OPEN_FILE_CACHE; src/filesrc.c, reader.c, rowcache.c):
 * exactness against the memory-mapped table, budgets, concurrency,
 * failures, O_DIRECT on and off, stats.
 *
 * Every lookup through the cache is compared byte for byte with the same
 * lookup on a second store that maps the same namespace (the memory
 * path), and with the known pattern of the rows.  Failures are injected
 * through the test-only read hook of src/reader.h, or by truncating a
 * table file under an open store.
 *
 * The cases that cannot run everywhere (seccomp filters, a disk file
 * system with O_DIRECT) are CTest entries of their own
 * (test_filesrc.no_io_uring, test_filesrc.slow_open; CMakeLists.txt),
 * which report a skip where they cannot run; parts of other cases that
 * need a disk are named with the reason when they are left out.
 */
#include "testutil.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include "reader.h"

enum { R = 264, PITCH = 272, NROWS = 5003 };

static engram_store *open_cache(const char *root, const char *ns, uint64_t budget,
                                uint32_t qd, int threads)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    o.flags = ENGRAM_OPEN_CREATE | ENGRAM_OPEN_FILE_CACHE;
    o.cache_bytes = budget;
    o.queue_depth = qd;
    o.threads = threads;
    ASSERT_OK(engram_store_open(root, ns, &o, &st));
    return st;
}

static engram_cache_stats cstats(engram_store *st, const char *name)
{
    engram_cache_stats s = ENGRAM_CACHE_STATS_INIT;
    ASSERT_OK(engram_get_cache_stats(st, name, &s));
    return s;
}

/* Looks up ids[n] of `name` in both stores and checks both outputs
 * against each other and the pattern. */
static void lookup_both(engram_store *fc, engram_store *mem, const char *name, uint32_t seed,
                        const int64_t *ids, size_t n)
{
    engram_table_id a, b;
    unsigned char *o1 = tu_xmalloc(n * R), *o2 = tu_xmalloc(n * R);
    memset(o1, 0xEE, n * R);
    memset(o2, 0xEE, n * R);
    ASSERT_OK(engram_table_open(fc, name, &a));
    ASSERT_OK(engram_table_open(mem, name, &b));
    ASSERT_OK(tu_lookup1(fc, a, ids, n, o1, 0));
    ASSERT_OK(tu_lookup1(mem, b, ids, n, o2, 0));
    ASSERT_MEM_EQ(o1, o2, n * R);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == ENGRAM_DEAD_ID)
            ASSERT_ALL_BYTES(o1 + i * R, 0xEE, R);
        else
            ASSERT_ROW(o1 + i * R, seed, (uint64_t)ids[i], R);
    }
    free(o1);
    free(o2);
}

static void test_exact_patterns(void)
{
    engram_store *mem = tu_open("pat", 0, 1), *fc;
    engram_cache_stats s0, s1;
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    enum { N = 3000 };
    static int64_t ids[N];
    uint64_t rng = 11;

    tu_populate(mem, "t", 5, NROWS, R, PITCH);
    /* 64 KiB: about 240 slots for 5003 rows. */
    fc = open_cache(tu_scratch_root(), "pat", 64 << 10, 32, 1);

    /* All misses: distinct rows never read before. */
    for (int i = 0; i < N; i++)
        ids[i] = (int64_t)((uint64_t)i * 7919 % NROWS);
    lookup_both(fc, mem, "t", 5, ids, N);
    s0 = cstats(fc, "t");
    ASSERT_EQ(s0.hits, 0);
    ASSERT_EQ(s0.misses, N);
    ASSERT_EQ(s0.dedup, 0);
    ASSERT_EQ(s0.reads, N);
    ASSERT_EQ(s0.read_errors, 0);
    ASSERT_EQ(s0.tables, 1);
    ASSERT_EQ(s0.ways, ENGRAM_CACHE_WAYS);
    ASSERT_LE(s0.cache_bytes, 64 << 10);
    ASSERT_GT(s0.slots, 100);
    ASSERT_EQ_U64(s0.slots % ENGRAM_CACHE_WAYS, 0);
    ASSERT_GE(s0.bytes_read, (uint64_t)N * R);

    /* One row repeated: read once, the rest deduplicated or hits. */
    for (int i = 0; i < N; i++)
        ids[i] = 4321;
    lookup_both(fc, mem, "t", 5, ids, N);
    s1 = cstats(fc, "t");
    ASSERT_LE(s1.reads - s0.reads, 1);
    ASSERT_EQ(s1.hits + s1.misses - s0.hits - s0.misses, N);

    /* All hits: a small working set, looked up three times.  The cache
     * is full of the rows above, so the first lookup's rows (asked for
     * once) are not kept; asked for again, they evict the rows above
     * (asked for once too). */
    for (int i = 0; i < 64; i++)
        ids[i] = (int64_t)tu_rand_below(&rng, NROWS);
    s0 = cstats(fc, "t");
    lookup_both(fc, mem, "t", 5, ids, 64);
    s1 = cstats(fc, "t");
    ASSERT_GE(s1.not_kept - s0.not_kept, 48);
    lookup_both(fc, mem, "t", 5, ids, 64);
    s0 = cstats(fc, "t");
    ASSERT_LE(s0.not_kept - s1.not_kept, 16);
    lookup_both(fc, mem, "t", 5, ids, 64);
    s1 = cstats(fc, "t");
    /* 64 rows in ~240 slots of 7-way sets: a few may collide out, most
     * must hit. */
    ASSERT_GE(s1.hits - s0.hits, 48);
    ASSERT_EQ(s1.hits - s0.hits + s1.misses - s0.misses, 64);

    /* Random with dead ids and the ends of the table. */
    for (int i = 0; i < N; i++)
        ids[i] = i % 13 == 0 ? -1 : (int64_t)tu_rand_below(&rng, NROWS);
    ids[1] = 0;
    ids[2] = NROWS - 1;
    lookup_both(fc, mem, "t", 5, ids, N);

    /* The table is not mapped. */
    ASSERT_OK(engram_get_table_info(fc, "t", &info));
    ASSERT_EQ(info.kind, ENGRAM_TABLE_FILE);
    ASSERT_EQ(info.mapped, 0);
    ASSERT_EQ(info.rows, (uint64_t)N * 3 + 64 * 3 - (N / 13 + 1));
    engram_store_close(fc);
    engram_store_close(mem);
}

/* The smallest budget (in steps of 256 bytes) with which table `name` of
 * namespace `ns` opens with any slots, at queue depth `qd`: below it the
 * table opens without a cache, or not at all (-ENOBUFS: not even the
 * staging of one row fits).  The cache it gets there is one set. */
static uint64_t one_set_budget(const char *ns, const char *name, uint32_t qd)
{
    int refused = 0;
    for (uint64_t b = 1024;; b += 256) {
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        engram_store *st;
        engram_table_id tid;
        int rc;
        o.flags = ENGRAM_OPEN_FILE_CACHE;
        o.cache_bytes = b;
        o.queue_depth = qd;
        o.threads = 1;
        ASSERT_OK(engram_store_open(tu_scratch_root(), ns, &o, &st));
        rc = engram_table_open(st, name, &tid);
        if (rc == -ENOBUFS) {
            refused = 1;
            ASSERT_CONTAINS(engram_errmsg(), "staging");
        } else {
            engram_cache_stats s;
            ASSERT_OK(rc);
            s = cstats(st, name);
            ASSERT_LE(s.cache_bytes + s.staging_bytes, b);
            if (s.slots > 0) {
                ASSERT_EQ(s.slots, ENGRAM_CACHE_WAYS);
                engram_store_close(st);
                ASSERT(refused); /* 1 KiB cannot stage a ring */
                return b;
            }
        }
        engram_store_close(st);
    }
}

/* Many distinct rows through a cache of one set: every set is the same,
 * so rows evict each other constantly (CLOCK within one set). */
static void test_one_set_thrash(void)
{
    engram_store *mem = tu_open("thr", 0, 1), *fc;
    engram_cache_stats s;
    enum { N = 4096 };
    static int64_t ids[N];
    uint64_t rng = 3;
    tu_populate(mem, "t", 9, NROWS, R, 0);
    /* A budget far smaller than one batch: one set (the budget holds the
     * reads' staging too, so "one set" is found, not assumed). */
    fc = open_cache(tu_scratch_root(), "thr", one_set_budget("thr", "t", 8), 8, 1);
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++)
            ids[i] = (int64_t)tu_rand_below(&rng, round < 2 ? 20 : NROWS);
        lookup_both(fc, mem, "t", 9, ids, N);
    }
    s = cstats(fc, NULL);
    ASSERT_EQ(s.slots, ENGRAM_CACHE_WAYS);
    ASSERT_EQ(s.hits + s.misses, 4 * N);
    ASSERT_GT(s.dedup, 0);
    engram_store_close(fc);
    engram_store_close(mem);
}

/* Several columns, offsets, head-major strides, int32 ids, a bound
 * memory table in the same lookup, and ZERO_DEAD. */
static void test_multi_column(void)
{
    engram_store *mem = tu_open("mc", 0, 1), *fc;
    enum { T = 700, K = 4 };
    static int32_t ids[T][K];
    static unsigned char o1[K][T][R], o2[K][T][R];
    int64_t offs[K] = {0, 100, NROWS, 0};
    unsigned char *bound = tu_make_rows(77, 100, R, R, 0);
    engram_table_spec bspec = {100, R, 0};
    engram_table_id ta[K], tb[K];
    uint64_t rng = 5;
    tu_populate(mem, "a", 1, NROWS, R, PITCH);
    tu_populate(mem, "b", 2, NROWS / 2, R, 0);
    fc = open_cache(tu_scratch_root(), "mc", 256 << 10, 16, 2);
    ASSERT_OK(engram_bind(fc, "m", &bspec, bound));
    ASSERT_OK(engram_bind(mem, "m", &bspec, bound));
    ASSERT_OK(engram_table_open(fc, "a", &ta[0]));
    ASSERT_OK(engram_table_open(fc, "b", &ta[1]));
    ASSERT_OK(engram_table_open(fc, "a", &ta[2]));
    ASSERT_OK(engram_table_open(fc, "m", &ta[3]));
    ASSERT_OK(engram_table_open(mem, "a", &tb[0]));
    ASSERT_OK(engram_table_open(mem, "b", &tb[1]));
    ASSERT_OK(engram_table_open(mem, "a", &tb[2]));
    ASSERT_OK(engram_table_open(mem, "m", &tb[3]));
    for (int t = 0; t < T; t++) {
        ids[t][0] = (int32_t)tu_rand_below(&rng, NROWS);
        ids[t][1] = (int32_t)(100 + tu_rand_below(&rng, NROWS / 2));
        ids[t][2] = t % 9 == 0 ? -1 : (int32_t)(NROWS + tu_rand_below(&rng, 50));
        ids[t][3] = (int32_t)tu_rand_below(&rng, 100);
    }
    for (int pass = 0; pass < 2; pass++) {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        memset(o1, 0x5A, sizeof o1);
        memset(o2, 0x5A, sizeof o2);
        a.flags = pass ? ENGRAM_LOOKUP_ZERO_DEAD : 0;
        a.num_tokens = T;
        a.num_cols = K;
        a.offsets = offs;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT32;
        a.out_stride_t = R;
        a.out_stride_k = (ptrdiff_t)T * R;
        a.tables = ta;
        a.out = o1;
        ASSERT_OK(engram_lookup(fc, &a));
        a.tables = tb;
        a.out = o2;
        ASSERT_OK(engram_lookup(mem, &a));
        ASSERT_MEM_EQ(o1, o2, sizeof o1);
        for (int t = 0; t < T; t++) {
            ASSERT_ROW(o1[0][t], 1, (uint64_t)ids[t][0], R);
            ASSERT_ROW(o1[1][t], 2, (uint64_t)ids[t][1] - 100, R);
            ASSERT_ROW(o1[3][t], 77, (uint64_t)ids[t][3], R);
        }
    }
    /* A bad id in a cache-backed column: nothing written, no read. */
    {
        engram_cache_stats s0 = cstats(fc, NULL), s1;
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        ids[T - 1][1] = NROWS; /* minus offset 100: still >= NROWS / 2 */
        memset(o1, 0x5A, sizeof o1);
        a.num_tokens = T;
        a.num_cols = K;
        a.offsets = offs;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT32;
        a.tables = ta;
        a.out = o1;
        ASSERT_ERR(engram_lookup(fc, &a), ENGRAM_EBADID);
        ASSERT_ALL_BYTES(o1, 0x5A, sizeof o1);
        s1 = cstats(fc, NULL);
        ASSERT_EQ(s1.hits + s1.misses, s0.hits + s0.misses);
    }
    /* The budget is split by size: a (PITCH x NROWS) gets about twice
     * b's share, and both together stay within it. */
    {
        engram_cache_stats sa = cstats(fc, "a"), sb = cstats(fc, "b"), sall = cstats(fc, NULL);
        ASSERT_EQ(sall.tables, 2);
        ASSERT_LE(sall.cache_bytes, 256 << 10);
        ASSERT_GT(sa.cache_bytes, sb.cache_bytes);
        ASSERT_EQ(sall.cache_bytes, sa.cache_bytes + sb.cache_bytes);
        ASSERT_ERR(engram_get_cache_stats(fc, "m", &sa), -ENOENT);
    }
    engram_store_close(fc);
    engram_store_close(mem);
    free(bound);
}

/* ------------------------------------------------------------------------
 * Threads.
 */
typedef struct worker {
    engram_store *st;
    engram_table_id tid;
    uint64_t seed;
    int bad;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    enum { N = 600 };
    int64_t ids[N];
    unsigned char *out = tu_xmalloc((size_t)N * R);
    for (int it = 0; it < 40 && !w->bad; it++) {
        /* A hot set shared by all threads plus cold rows: hits, misses
         * and insertions race on the same sets. */
        for (int i = 0; i < N; i++)
            ids[i] = (int64_t)(i % 3 ? tu_rand_below(&w->seed, 200)
                                     : tu_rand_below(&w->seed, NROWS));
        if (tu_lookup1(w->st, w->tid, ids, N, out, 0) != 0) {
            fprintf(stderr, "lookup failed: %s\n", engram_errmsg());
            w->bad = 1;
        }
        for (int i = 0; i < N && !w->bad; i++)
            if (tu_row_mismatch(out + (size_t)i * R, 21, (uint64_t)ids[i], R) >= 0)
                w->bad = 1;
    }
    free(out);
    return NULL;
}

static void test_threads(void)
{
    engram_store *mem = tu_open("thd", 0, 1), *fc;
    enum { NT = 4 };
    pthread_t th[NT];
    worker w[NT];
    engram_table_id tid;
    engram_cache_stats s;
    tu_populate(mem, "t", 21, NROWS, R, PITCH);
    fc = open_cache(tu_scratch_root(), "thd", 48 << 10, 16, 2);
    ASSERT_OK(engram_table_open(fc, "t", &tid));
    for (int i = 0; i < NT; i++) {
        w[i] = (worker){fc, tid, (uint64_t)i * 1000 + 1, 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        ASSERT_EQ(w[i].bad, 0);
    }
    s = cstats(fc, NULL);
    ASSERT_EQ(s.hits + s.misses, (uint64_t)NT * 40 * 600);
    ASSERT_GT(s.hits, 0);
    ASSERT_EQ(s.read_errors, 0);
    engram_store_close(fc);
    engram_store_close(mem);
}

/* ------------------------------------------------------------------------
 * Failures.
 */
typedef struct hook_cfg {
    uint64_t row;    /* fail the first read of this row ... */
    int res;         /* ... with this result */
    int probe_res;   /* result for the O_DIRECT probe (0: leave it) */
    int einval_once; /* fail the next read with -EINVAL, once */
    int calls;
    int after;       /* result of the row's later reads (the rest of a short read, a
                      * retry): 0 = end of file, PASS = the real result */
    int fired;       /* the first read of the row was failed */
} hook_cfg;

#define PASS INT_MIN

static hook_cfg hk;

static int hook(void *ud, const char *table, uint64_t row, unsigned seg, int res,
                unsigned char *data)
{
    (void)ud;
    (void)table;
    (void)seg;
    (void)data;
    if (row == UINT64_MAX)
        return hk.probe_res ? hk.probe_res : res;
    hk.calls++;
    if (hk.einval_once) {
        hk.einval_once = 0;
        return -EINVAL;
    }
    if (row == hk.row) {
        if (!hk.fired) {
            hk.fired = 1;
            return hk.res;
        }
        return hk.after == PASS ? res : hk.after;
    }
    return res;
}

static void test_read_errors(void)
{
    engram_store *mem = tu_open("err", 0, 1), *fc;
    engram_table_id tid;
    engram_cache_stats s0, s1;
    int64_t ids[5] = {10, 20, 30, 20, 40};
    unsigned char out[5][R];
    tu_populate(mem, "t", 31, NROWS, R, PITCH);
    fc = open_cache(tu_scratch_root(), "err", 1 << 20, 4, 1);
    ASSERT_OK(engram_table_open(fc, "t", &tid));
    hk.row = 20;
    hk.res = -EIO;
    engram__reader_set_hook(hook, NULL);
    memset(out, 0xEE, sizeof out);
    ASSERT_ERR(tu_lookup1(fc, tid, ids, 5, out, 0), -EIO);
    ASSERT_CONTAINS(engram_errmsg(), "read of row 20");
    ASSERT_CONTAINS(engram_errmsg(), "'t'");
    /* The failed row (twice in the batch) is untouched; the others are
     * right (they were read in the same batch). */
    ASSERT_ALL_BYTES(out[1], 0xEE, R);
    ASSERT_ALL_BYTES(out[3], 0xEE, R);
    for (int i = 0; i < 5; i += 2)
        if (out[i][0] != 0xEE || out[i][1] != 0xEE)
            ASSERT_ROW(out[i], 31, (uint64_t)ids[i], R);
    s0 = cstats(fc, "t");
    ASSERT_EQ(s0.read_errors, 1);

    /* A short read whose rest is at the end of the file: truncated. */
    hk.res = 100;
    hk.fired = 0;
    ASSERT_ERR(tu_lookup1(fc, tid, &ids[1], 1, out[1], 0), ENGRAM_ECORRUPT);
    ASSERT_CONTAINS(engram_errmsg(), "shorter");
    ASSERT_CONTAINS(engram_errmsg(), "returned 100 of 264");
    ASSERT_ALL_BYTES(out[1], 0xEE, R);

    /* Without the fault, the row is read again (it was never cached) and
     * right. */
    engram__reader_set_hook(NULL, NULL);
    s0 = cstats(fc, "t");
    ASSERT_OK(tu_lookup1(fc, tid, ids, 5, out, 0));
    s1 = cstats(fc, "t");
    ASSERT_GE(s1.reads - s0.reads, 1);
    for (int i = 0; i < 5; i++)
        ASSERT_ROW(out[i], 31, (uint64_t)ids[i], R);
    engram_store_close(fc);
    engram_store_close(mem);
}

static void test_truncated_file(void)
{
    engram_store *mem = tu_open("trunc", 0, 1), *fc;
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    engram_table_id tid;
    char path[512];
    int64_t ids[3] = {5, NROWS - 1, 6};
    unsigned char out[3][R];
    tu_populate(mem, "t", 41, NROWS, R, PITCH);
    fc = open_cache(tu_scratch_root(), "trunc", 1 << 20, 8, 1);
    ASSERT_OK(engram_table_open(fc, "t", &tid));
    ASSERT_OK(engram_get_table_info(fc, "t", &info));
    engram_store_close(mem); /* its mapping must not see the truncation */
    /* Cut the file in the middle of the data, under the open store. */
    tu_path(path, sizeof path, "trunc/t");
    ASSERT_EQ(chmod(path, 0600), 0);
    ASSERT_EQ(truncate(path, (off_t)(info.data_offset + (uint64_t)(NROWS / 2) * PITCH + 7)), 0);
    memset(out, 0xEE, sizeof out);
    ASSERT_ERR(tu_lookup1(fc, tid, ids, 3, out, 0), ENGRAM_ECORRUPT);
    ASSERT_CONTAINS(engram_errmsg(), "row 5002");
    ASSERT_CONTAINS(engram_errmsg(), "truncated");
    ASSERT_ALL_BYTES(out[1], 0xEE, R);
    ASSERT_ROW(out[0], 41, 5, R);
    ASSERT_ROW(out[2], 41, 6, R);
    /* Rows before the cut still work. */
    ASSERT_OK(tu_lookup1(fc, tid, ids, 1, out, 0));
    ASSERT_ROW(out[0], 41, 5, R);
    engram_store_close(fc);
}

/* Reads that need another go.  A short read that is not at the end of the
 * file (FUSE, NFS, a signal) is completed by a read of the rest, and a read
 * failing with -EAGAIN, -EINTR or -ECANCELED (what io_uring completes a
 * read with when a signal interrupts the thread) is retried: both give
 * exact rows, which the cache then serves.  A short read whose rest is at
 * the end of the file is a truncated file, and an -EAGAIN or -ECANCELED
 * that never goes away fails after a few retries.  Used on every read path: io_uring (buffered and O_DIRECT)
 * and pread. */
static void retry_cases(engram_store *fc, engram_table_id tid, uint32_t seed)
{
    static const struct {
        int res, after, code;
    } cases[] = {
        {100, PASS, 0},  {1, PASS, 0},          {-EAGAIN, PASS, 0},
        {-EINTR, PASS, 0}, {100, 0, ENGRAM_ECORRUPT}, {-EAGAIN, -EAGAIN, -EAGAIN},
        {-ECANCELED, PASS, 0}, {-ECANCELED, -ECANCELED, -ECANCELED},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t base = 100 + 50 * c;
        int64_t ids[5] = {(int64_t)base, (int64_t)base + 1, (int64_t)base + 2, (int64_t)base + 1,
                          (int64_t)base + 3};
        unsigned char out[5][R];
        engram_cache_stats s0, s1;
        /* Rows no lookup of this store has read before: the fault hits. */
        hk = (hook_cfg){base + 1, cases[c].res, 0, 0, 0, cases[c].after, 0};
        engram__reader_set_hook(hook, NULL);
        memset(out, 0xEE, sizeof out);
        s0 = cstats(fc, NULL);
        if (cases[c].code == 0) {
            ASSERT_OK(tu_lookup1(fc, tid, ids, 5, out, 0));
            ASSERT(hk.fired);
            s1 = cstats(fc, NULL);
            ASSERT_EQ(s1.read_errors, s0.read_errors);
            /* Each distinct missed row read once, and one of them twice. */
            ASSERT_GT(s1.reads - s0.reads, (s1.misses - s0.misses) - (s1.dedup - s0.dedup));
            for (int i = 0; i < 5; i++)
                ASSERT_ROW(out[i], seed, (uint64_t)ids[i], R);
        } else {
            ASSERT_ERR(tu_lookup1(fc, tid, ids, 5, out, 0), cases[c].code);
            ASSERT_CONTAINS(engram_errmsg(), "read of row");
            s1 = cstats(fc, NULL);
            ASSERT_EQ(s1.read_errors - s0.read_errors, 1);
            ASSERT_ALL_BYTES(out[1], 0xEE, R);
            ASSERT_ALL_BYTES(out[3], 0xEE, R);
        }
        engram__reader_set_hook(NULL, NULL);
        /* The cache holds exactly what a read without faults gives. */
        memset(out, 0xEE, sizeof out);
        ASSERT_OK(tu_lookup1(fc, tid, ids, 5, out, 0));
        for (int i = 0; i < 5; i++)
            ASSERT_ROW(out[i], seed, (uint64_t)ids[i], R);
    }
}

static void test_retried_reads(void)
{
    engram_store *mem = tu_open("retry", 0, 1), *fc;
    engram_table_id tid;
    tu_populate(mem, "t", 33, NROWS, R, PITCH);
    fc = open_cache(tu_scratch_root(), "retry", 1 << 20, 4, 1);
    ASSERT_OK(engram_table_open(fc, "t", &tid));
    retry_cases(fc, tid, 33);
    engram_store_close(fc);
    engram_store_close(mem);
}

/* ------------------------------------------------------------------------
 * No io_uring: containers deny io_uring_setup (seccomp: EPERM or ENOSYS),
 * and before Linux 5.12 a ring counts against RLIMIT_MEMLOCK, which is
 * small in containers (ENOMEM).  Lookups must then read with pread, not
 * fail.  A seccomp filter on one thread stands in for the container.
 */
#if defined(__x86_64__)
#define TEST_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define TEST_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

/* Makes io_uring_setup fail with `err` on the calling thread (and threads
 * it starts); -1 where seccomp filters are not available. */
static int deny_io_uring(int err)
{
#if defined(TEST_AUDIT_ARCH) && defined(__NR_io_uring_setup)
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TEST_AUDIT_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((unsigned)err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return -1;
    return 0;
#else
    (void)err;
    return -1;
#endif
}

typedef struct noring_arg {
    engram_store *fc;
    engram_table_id tid;
    int err;
    int ran;
} noring_arg;

static void *noring_main(void *p)
{
    noring_arg *a = p;
    int64_t ids[64];
    unsigned char out[64][R];
    if (deny_io_uring(a->err) != 0)
        return NULL;
#ifdef __NR_io_uring_setup
    {
        /* The filter works: io_uring is gone for this thread. */
        unsigned char params[120] = {0}; /* struct io_uring_params */
        errno = 0;
        ASSERT_EQ(syscall(__NR_io_uring_setup, 4, params), -1);
        ASSERT_EQ(errno, a->err);
    }
#endif
    a->ran = 1;
    for (int i = 0; i < 64; i++)
        ids[i] = (int64_t)((uint64_t)i * 97 % NROWS);
    memset(out, 0xEE, sizeof out);
    ASSERT_OK(tu_lookup1(a->fc, a->tid, ids, 64, out, 0));
    for (int i = 0; i < 64; i++)
        ASSERT_ROW(out[i], 81, (uint64_t)ids[i], R);
    retry_cases(a->fc, a->tid, 81);
    return NULL;
}

static void test_no_io_uring(void)
{
    engram_store *mem = tu_open("noring", 0, 1);
    const int errs[3] = {EPERM, ENOSYS, ENOMEM};
    tu_populate(mem, "t", 81, NROWS, R, PITCH);
    for (int e = 0; e < 3; e++) {
        noring_arg a = {open_cache(tu_scratch_root(), "noring", 1 << 20, 8, 1), 0, errs[e], 0};
        pthread_t th;
        ASSERT_OK(engram_table_open(a.fc, "t", &a.tid));
        ASSERT_EQ(pthread_create(&th, NULL, noring_main, &a), 0);
        ASSERT_EQ(pthread_join(th, NULL), 0);
        engram_store_close(a.fc);
        if (!a.ran) {
            if (e == 0)
                tu_skip_case("no seccomp filters here: io_uring cannot be denied");
            else
                tu_skip_part("no seccomp filter for the error %d here", errs[e]);
            break;
        }
    }
    engram_store_close(mem);
}

/* Lookups of many more rows than the plan's old 1024-row batches.  The
 * source gets all the rows of a lookup in one call (up to
 * ENGRAM_SOURCE_MAX_REQS), so each distinct row is read once per lookup even
 * through a one-set cache that keeps none of them.  A read that fails late
 * in the call (the failing row is asked for first after most others)
 * leaves the failed row unwritten at both its positions and every other
 * row either right or untouched, and is never cached. */
static void test_large_lookup(void)
{
    engram_store *mem = tu_open("big", 0, 1), *fc;
    engram_table_id tid;
    engram_cache_stats s0, s1;
    enum { N = 20000, M = 4000, NB = ENGRAM_SOURCE_MAX_REQS + 3000 };
    int64_t *ids = tu_xmalloc((N + NB) * sizeof *ids);
    unsigned char *out = tu_xmalloc((size_t)(N + NB) * R);
    static unsigned char seen[NROWS];
    const int fails[2] = {-EIO, 100}, codes[2] = {-EIO, ENGRAM_ECORRUPT};
    uint64_t rng = 17, distinct = 0;
    tu_populate(mem, "t", 71, NROWS, R, PITCH);
    fc = open_cache(tu_scratch_root(), "big", one_set_budget("big", "t", 8), 8, 1);
    ASSERT_OK(engram_table_open(fc, "t", &tid));

    for (int i = 0; i < N; i++) {
        ids[i] = (int64_t)tu_rand_below(&rng, NROWS);
        distinct += seen[ids[i]]++ == 0;
    }
    s0 = cstats(fc, "t");
    lookup_both(fc, mem, "t", 71, ids, N);
    s1 = cstats(fc, "t");
    ASSERT_EQ(s1.misses - s0.misses, N);
    ASSERT_EQ_U64(s1.reads - s0.reads, distinct);
    ASSERT_EQ_U64(s1.dedup - s0.dedup, N - distinct);

    /* M distinct rows, the failing one (row 4500, late in the sorted
     * order) at positions 2500 and 3900. */
    for (int f = 0; f < 2; f++) {
        int written = 0;
        for (int i = 0; i < M; i++)
            ids[i] = (int64_t)((uint64_t)i * 7919 % NROWS);
        ids[2500] = ids[3900] = 4500;
        hk = (hook_cfg){4500, fails[f], 0, 0, 0, 0, 0};
        engram__reader_set_hook(hook, NULL);
        memset(out, 0xEE, (size_t)M * R);
        s0 = cstats(fc, "t");
        ASSERT_ERR(tu_lookup1(fc, tid, ids, M, out, 0), codes[f]);
        ASSERT_CONTAINS(engram_errmsg(), "row 4500");
        s1 = cstats(fc, "t");
        ASSERT_EQ(s1.read_errors - s0.read_errors, 1);
        ASSERT_ALL_BYTES(out + (size_t)2500 * R, 0xEE, R);
        ASSERT_ALL_BYTES(out + (size_t)3900 * R, 0xEE, R);
        for (int i = 0; i < M; i++) {
            unsigned char *o = out + (size_t)i * R;
            if (tu_row_mismatch(o, 71, (uint64_t)ids[i], R) < 0)
                written++;
            else
                ASSERT_ALL_BYTES(o, 0xEE, R);
        }
        /* The rows that sort before the failing one were read first. */
        ASSERT_GT(written, 1024);
    }
    /* Without the fault: the failed row is read again (never cached). */
    engram__reader_set_hook(NULL, NULL);
    s0 = cstats(fc, "t");
    lookup_both(fc, mem, "t", 71, ids, M);
    s1 = cstats(fc, "t");
    ASSERT_GE(s1.reads - s0.reads, 1);
    ASSERT_EQ(s1.read_errors, s0.read_errors);

    /* More rows than one source call: two calls, the same rows. */
    for (int i = 0; i < NB; i++)
        ids[i] = i % 11 == 0 ? -1 : (int64_t)tu_rand_below(&rng, NROWS);
    s0 = cstats(fc, "t");
    lookup_both(fc, mem, "t", 71, ids, NB);
    s1 = cstats(fc, "t");
    ASSERT_EQ(s1.hits + s1.misses - s0.hits - s0.misses, NB - (NB + 10) / 11);
    ASSERT_LE(s1.reads - s0.reads, 2 * NROWS);
    engram_store_close(fc);
    engram_store_close(mem);
    free(ids);
    free(out);
}

/* ------------------------------------------------------------------------
 * O_DIRECT.
 */

/* A root on a disk file system (ext4/xfs under /var/tmp), or NULL. */
static char disk_root[256];

static void disk_cleanup(void)
{
    if (disk_root[0])
        tu_rm_rf(disk_root);
}

static const char *make_disk_root(void)
{
    struct statfs fs;
    const char *bases[] = {getenv("ENGRAM_TEST_DISK_DIR"), "/var/tmp", "."};
    if (disk_root[0])
        return disk_root; /* one per run, removed at exit */
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        if (!bases[i] || statfs(bases[i], &fs) != 0 || fs.f_type == 0x01021994 /* tmpfs */)
            continue;
        snprintf(disk_root, sizeof disk_root, "%s/engram-test-disk-XXXXXX", bases[i]);
        if (mkdtemp(disk_root)) {
            atexit(disk_cleanup);
            return disk_root;
        }
    }
    disk_root[0] = 0;
    return NULL;
}

/* Opens (creating) namespace `ns` under `root` without the row cache. */
static engram_store *open_mapped(const char *root, const char *ns)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    o.flags = ENGRAM_OPEN_CREATE;
    ASSERT_OK(engram_store_open(root, ns, &o, &st));
    return st;
}

static engram_table_id tid_of(engram_store *st, const char *name)
{
    engram_table_id id;
    ASSERT_OK(engram_table_open(st, name, &id));
    return id;
}

/* ------------------------------------------------------------------------
 * A signal storm: another thread sends SIGUSR1 (a handler that only counts,
 * installed without SA_RESTART) to the thread that looks up, thousands of
 * times during lookups whose rows are read from the file.  io_uring_enter()
 * then returns -EINTR, and io_uring may complete a read the signal
 * interrupted with -EINTR or -ECANCELED.  Kernels differ in when they do
 * (this test's VM never did on its own), so the read hook also completes
 * with -ECANCELED each read that finishes after a signal arrived, up to 3
 * times per row: every lookup must still succeed with exact rows.
 */
static atomic_ulong storm_handled;
static unsigned long storm_seen, storm_canceled;
static unsigned char storm_cancels[NROWS];

static void storm_handler(int sig)
{
    (void)sig;
    atomic_fetch_add_explicit(&storm_handled, 1, memory_order_relaxed);
}

/* The read hook during the storm (called on the looking-up thread only:
 * the store has one gather thread). */
static int storm_hook(void *ud, const char *table, uint64_t row, unsigned seg, int res,
                      unsigned char *data)
{
    unsigned long h = atomic_load_explicit(&storm_handled, memory_order_relaxed);
    (void)ud;
    (void)table;
    (void)seg;
    (void)data;
    if (row >= NROWS || h == storm_seen || storm_cancels[row] >= 3)
        return res;
    storm_seen = h;
    storm_cancels[row]++;
    storm_canceled++;
    return -ECANCELED;
}

typedef struct storm {
    pthread_t target;
    atomic_int stop;
    unsigned long sent;
} storm;

static void *storm_main(void *p)
{
    storm *s = p;
    while (!atomic_load(&s->stop) && pthread_kill(s->target, SIGUSR1) == 0)
        s->sent++;
    return NULL;
}

/* Looks up random rows of table `name` (pattern `seed`) in namespace `ns`
 * under `root` through a small row cache, so that most rows are read,
 * while the storm runs. */
static void storm_lookups(const char *root, const char *ns, const char *name, uint32_t seed)
{
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer defers and replays every signal: a storm of them
     * slows the lookups a hundredfold, so fewer rounds there. */
    enum { N = 256, ITERS = 5 };
#else
    enum { N = 256, ITERS = 200 };
#endif
    engram_store *fc = open_cache(root, ns, 32 << 10, 32, 1);
    engram_table_id tid = tid_of(fc, name);
    struct sigaction sa, old;
    storm s;
    pthread_t th;
    static int64_t ids[N];
    static unsigned char out[N][R];
    uint64_t rng = seed;
    unsigned long handled0 = atomic_load(&storm_handled);
    engram_cache_stats cs;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = storm_handler;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
    s.target = pthread_self();
    atomic_init(&s.stop, 0);
    s.sent = 0;
    memset(storm_cancels, 0, sizeof storm_cancels);
    storm_canceled = 0;
    storm_seen = handled0;
    engram__reader_set_hook(storm_hook, NULL);
    ASSERT_EQ(pthread_create(&th, NULL, storm_main, &s), 0);
    /* ITERS rounds, and more while fewer than 100 signals were handled
     * (ThreadSanitizer delivers them late), for 30 s at most. */
    uint64_t t_end = engram__now_ns() + 30000000000ull;
    for (int it = 0; it < ITERS || (atomic_load(&storm_handled) - handled0 <= 100 &&
                                    engram__now_ns() < t_end);
         it++) {
        for (int i = 0; i < N; i++)
            ids[i] = (int64_t)tu_rand_below(&rng, NROWS);
        memset(out, 0xEE, sizeof out);
        ASSERT_OK(tu_lookup1(fc, tid, ids, N, out, 0));
        for (int i = 0; i < N; i++)
            ASSERT_ROW(out[i], seed, (uint64_t)ids[i], R);
    }
    atomic_store(&s.stop, 1);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    engram__reader_set_hook(NULL, NULL);
    ASSERT_EQ(sigaction(SIGUSR1, &old, NULL), 0);
    cs = cstats(fc, NULL);
    printf("   %s: %lu signals sent, %lu handled, %llu reads (%lu completed with -ECANCELED), "
           "%llu direct tables\n",
           root, s.sent, atomic_load(&storm_handled) - handled0, (unsigned long long)cs.reads,
           storm_canceled, (unsigned long long)cs.direct_tables);
    ASSERT_GT(atomic_load(&storm_handled) - handled0, 100);
    ASSERT_GT(storm_canceled, 0);
    ASSERT_GT(cs.reads, (uint64_t)ITERS * N / 2); /* most rows were read, not cached */
    ASSERT_EQ(cs.read_errors, 0);
    engram_store_close(fc);
}

static void test_signal_storm(void)
{
    const char *droot = make_disk_root();
    engram_store *mem = tu_open("storm", 0, 1);
    tu_populate(mem, "t", 61, NROWS, R, PITCH);
    engram_store_close(mem);
    storm_lookups(tu_scratch_root(), "storm", "t", 61); /* tmpfs: buffered reads */
    if (!droot) {
        tu_skip_part("no disk file system (ENGRAM_TEST_DISK_DIR, /var/tmp, .): the O_DIRECT storm");
        return;
    }
    mem = open_mapped(droot, "storm");
    tu_populate(mem, "t", 62, NROWS, R, 0);
    engram_store_close(mem);
    storm_lookups(droot, "storm", "t", 62); /* a disk: O_DIRECT where it allows it */
}

static void test_direct_modes(void)
{
    const char *droot = make_disk_root();
    engram_store *mem = tu_open("dio", 0, 1), *fc, *dmem;
    engram_cache_stats s;
    int64_t ids[300];
    uint64_t rng = 9;

    /* tmpfs: buffered. */
    tu_populate(mem, "t", 51, NROWS, R, PITCH);
    fc = open_cache(tu_scratch_root(), "dio", 1 << 20, 16, 1);
    for (int i = 0; i < 300; i++)
        ids[i] = (int64_t)tu_rand_below(&rng, NROWS);
    lookup_both(fc, mem, "t", 51, ids, 300);
    s = cstats(fc, NULL);
    ASSERT_EQ(s.direct_tables, 0);
    ASSERT_EQ(s.bytes_read, s.reads * R); /* buffered: exactly the rows */
    engram_store_close(fc);
    engram_store_close(mem);

    if (!droot) {
        tu_skip_part("no disk file system (ENGRAM_TEST_DISK_DIR, /var/tmp, .): the O_DIRECT "
                     "cases");
        return;
    }
    dmem = open_mapped(droot, "dio");
    tu_populate(dmem, "t", 52, NROWS, R, 0); /* pitch 264: rows straddle blocks */
    {
        /* The file system's own word on direct I/O decides what to expect. */
        char p[512];
        int supported = 0;
        snprintf(p, sizeof p, "%s/dio/t", droot);
#ifdef STATX_DIOALIGN
        {
            struct statx sx;
            if (statx(AT_FDCWD, p, 0, STATX_DIOALIGN, &sx) == 0 &&
                (sx.stx_mask & STATX_DIOALIGN))
                supported = sx.stx_dio_offset_align != 0;
        }
#endif
        fc = open_cache(droot, "dio", 1 << 20, 16, 1);
        for (int i = 0; i < 300; i++)
            ids[i] = (int64_t)tu_rand_below(&rng, NROWS);
        ids[0] = NROWS - 1; /* the last row: an aligned read past the end of the file */
        lookup_both(fc, dmem, "t", 52, ids, 300);
        s = cstats(fc, NULL);
        printf("   %s: O_DIRECT %s (statx says %s)\n", droot, s.direct_tables ? "on" : "off",
               supported ? "supported" : "not supported or unknown");
        if (supported) {
            ASSERT_EQ(s.direct_tables, 1);
            ASSERT_GT(s.bytes_read, s.reads * R); /* whole aligned blocks */
        }
        /* Short and transient direct reads: the rest of a short one is
         * read buffered, at an offset inside the aligned block. */
        if (s.direct_tables) {
            engram_store *fresh = open_cache(droot, "dio", 1 << 20, 16, 1);
            retry_cases(fresh, tid_of(fresh, "t"), 52);
            ASSERT_EQ(cstats(fresh, NULL).direct_tables, 1);
            engram_store_close(fresh);
        }
        /* A direct read refused with EINVAL: retried buffered, and the
         * table stays buffered. */
        if (s.direct_tables) {
            hk = (hook_cfg){UINT64_MAX, 0, 0, 1, 0, 0, 0};
            engram__reader_set_hook(hook, NULL);
            for (int i = 0; i < 300; i++)
                ids[i] = (int64_t)tu_rand_below(&rng, NROWS);
            lookup_both(fc, dmem, "t", 52, ids, 300);
            engram__reader_set_hook(NULL, NULL);
            s = cstats(fc, NULL);
            ASSERT_EQ(s.direct_tables, 0);
            ASSERT_EQ(s.read_errors, 0);
        }
        engram_store_close(fc);

        /* The O_DIRECT probe failing at open: buffered from the start. */
        hk = (hook_cfg){UINT64_MAX, 0, -EINVAL, 0, 0, 0, 0};
        engram__reader_set_hook(hook, NULL);
        fc = open_cache(droot, "dio", 1 << 20, 16, 1);
        lookup_both(fc, dmem, "t", 52, ids, 300);
        engram__reader_set_hook(NULL, NULL);
        s = cstats(fc, NULL);
        ASSERT_EQ(s.direct_tables, 0);
        ASSERT_EQ(s.bytes_read, s.reads * R);
        engram_store_close(fc);
    }
    engram_store_close(dmem);
}

/* ------------------------------------------------------------------------
 * Options and the stats log.
 */
static void test_options_and_log(void)
{
    engram_store *mem = tu_open("opt", 0, 1), *st;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_id tid;
    engram_cache_stats s;
    int64_t ids[64];
    unsigned char out[64][R];
    char logp[512], buf[4096];
    int saved, fd;
    ssize_t n;
    tu_populate(mem, "t", 61, 500, R, 0);

    /* Only the current size of the options is taken (the shorter one
     * before the row cache fields was never released). */
    o.flags = ENGRAM_OPEN_FILE_CACHE;
    o.size = (uint32_t)offsetof(engram_store_options, cache_bytes);
    ASSERT_ERR(engram_store_open(tu_scratch_root(), "opt", &o, &st), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "engram_store_options.size");
    /* The cache fields left 0: their defaults. */
    o.size = sizeof o;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "opt", &o, &st));
    ASSERT_OK(engram_table_open(st, "t", &tid));
    s = cstats(st, NULL);
    ASSERT_EQ_U64(s.budget_bytes, (uint64_t)256 << 20);
    ASSERT_EQ(s.queue_depth, 64);
    /* The whole table fits: the cache is capped by the table's size. */
    ASSERT_LE(s.slots, 500 + ENGRAM_CACHE_WAYS);
    engram_store_close(st);

    o = (engram_store_options)ENGRAM_STORE_OPTIONS_INIT;
    o.size = 12;
    ASSERT_ERR(engram_store_open(tu_scratch_root(), "opt", &o, &st), -EINVAL);

    o = (engram_store_options)ENGRAM_STORE_OPTIONS_INIT;
    o.flags = ENGRAM_OPEN_FILE_CACHE;
    o.queue_depth = 5000;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "opt", &o, &st));
    ASSERT_ERR(engram_table_open(st, "t", &tid), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "queue_depth");
    engram_store_close(st);

    /* Queue depth 1 and a stats line every millisecond, to a file. */
    o.queue_depth = 1;
    o.cache_log_ms = 1;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "opt", &o, &st));
    ASSERT_OK(engram_table_open(st, "t", &tid));
    tu_path(logp, sizeof logp, "log.txt");
    fflush(stderr);
    saved = dup(2);
    fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 64; i++)
            ids[i] = (int64_t)((i * 37 + round) % 500);
        ASSERT_OK(tu_lookup1(st, tid, ids, 64, out, 0));
        for (int i = 0; i < 64; i++)
            ASSERT_ROW(out[i], 61, (uint64_t)ids[i], R);
        usleep(3000);
    }
    ASSERT_OK(tu_lookup1(st, tid, ids, 64, out, 0));
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fd = open(logp, O_RDONLY);
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    ASSERT_GT(n, 0);
    buf[n] = 0;
    ASSERT_CONTAINS(buf, "engram: cache ");
    ASSERT_CONTAINS(buf, "hit rate");
    ASSERT_CONTAINS(buf, "slots (7 ways)");
    ASSERT_CONTAINS(buf, "0/1 tables O_DIRECT");
    engram_store_close(st);
    engram_store_close(mem);
}

/* ------------------------------------------------------------------------
 * Bad days: fork, flags, memory.
 */

/* Lookups of misses on `st` (a small cache: reads every time); 0 if every
 * row came back right. */
static int lookup_rounds(engram_store *st, engram_table_id tid, uint32_t seed, uint64_t rng,
                         int rounds)
{
    enum { N = 256 };
    int64_t ids[N];
    static _Thread_local unsigned char out[N][R];
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < N; i++)
            ids[i] = (int64_t)tu_rand_below(&rng, NROWS);
        if (tu_lookup1(st, tid, ids, N, out, 0) != 0) {
            fprintf(stderr, "lookup: %s\n", engram_errmsg());
            return 1;
        }
        for (int i = 0; i < N; i++)
            if (tu_row_mismatch(out[i], seed, (uint64_t)ids[i], R) >= 0)
                return 1;
    }
    return 0;
}

/* fork() after lookups through the row cache: the child reads with rings
 * of its own while the parent goes on with its own, at the same time;
 * both get right rows and the parent is never disturbed.  (The rings used
 * to be shared: the child's lookups corrupted the parent's queue.) */
static void test_fork(void)
{
    engram_store *mem = tu_open("fork", 0, 1), *fc;
    engram_table_id tid;
    int status;
    pid_t pid;
    tu_populate(mem, "t", 91, NROWS, R, PITCH);
    fc = open_cache(tu_scratch_root(), "fork", 64 << 10, 16, 2);
    ASSERT_OK(engram_table_open(fc, "t", &tid));
    ASSERT_EQ(lookup_rounds(fc, tid, 91, 1, 4), 0);
    for (int child_first = 0; child_first < 2; child_first++) {
        fflush(stdout);
        pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0)
            _exit(lookup_rounds(fc, tid, 91, 7, 200));
        ASSERT_EQ(lookup_rounds(fc, tid, 91, 3, 200), 0);
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT(WIFEXITED(status));
        ASSERT_EQ(WEXITSTATUS(status), 0);
    }
    /* A child that closes the store leaves the parent's rings alone. */
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        int rc = lookup_rounds(fc, tid, 91, 9, 5);
        engram_store_close(fc);
        _exit(rc);
    }
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_EQ(lookup_rounds(fc, tid, 91, 11, 20), 0);
    engram_store_close(fc);
    engram_store_close(mem);
}

/* A slow open never stalls the store: while one thread opens a table (held
 * inside its O_DIRECT probe read by the hook), lookups of another table,
 * the stats, the list and the info of the same store all complete.  (The
 * store's lock used to be held through the whole open: each of these
 * would have waited for it.) */
static atomic_int probe_waiting, probe_gate;

static int gate_hook(void *ud, const char *table, uint64_t row, unsigned seg, int res,
                     unsigned char *data)
{
    (void)ud;
    (void)seg;
    (void)data;
    if (row == UINT64_MAX && strcmp(table, "slow") == 0) {
        atomic_store(&probe_waiting, 1);
        while (!atomic_load(&probe_gate))
            usleep(1000);
    }
    return res;
}

typedef struct open_arg {
    engram_store *st;
    engram_table_id tid;
    int rc;
} open_arg;

static void *open_main(void *arg)
{
    open_arg *a = arg;
    a->rc = engram_table_open(a->st, "slow", &a->tid);
    return NULL;
}

static void test_slow_open(void)
{
    const char *droot = make_disk_root();
    engram_store *dmem, *fc;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    engram_stats stats = ENGRAM_STATS_INIT;
    engram_table_id tid;
    open_arg a;
    pthread_t th;
    char **names;
    size_t n;
    if (!droot) {
        tu_skip_case("no disk file system (ENGRAM_TEST_DISK_DIR, /var/tmp, .) for the probe read");
        return;
    }
    o.flags = ENGRAM_OPEN_CREATE;
    ASSERT_OK(engram_store_open(droot, "slow", &o, &dmem));
    tu_populate(dmem, "t", 97, NROWS, R, PITCH);
    tu_populate(dmem, "slow", 98, NROWS, R, PITCH);
    engram_store_close(dmem);
    fc = open_cache(droot, "slow", 1 << 20, 16, 1);
    ASSERT_OK(engram_table_open(fc, "t", &tid));
    ASSERT_EQ(lookup_rounds(fc, tid, 97, 1, 1), 0);
    if (cstats(fc, "t").direct_tables == 0) {
        tu_skip_case("no O_DIRECT probe on %s", droot);
        engram_store_close(fc);
        return;
    }
    atomic_store(&probe_waiting, 0);
    atomic_store(&probe_gate, 0);
    engram__reader_set_hook(gate_hook, NULL);
    a = (open_arg){fc, 0, -1};
    ASSERT_EQ(pthread_create(&th, NULL, open_main, &a), 0);
    while (!atomic_load(&probe_waiting))
        usleep(1000);
    /* The open is stuck in its probe: everything else goes on. */
    ASSERT_EQ(lookup_rounds(fc, tid, 97, 2, 3), 0);
    ASSERT_OK(engram_store_stats(fc, &stats));
    ASSERT_OK(engram_get_table_info(fc, "t", &info));
    ASSERT_OK(engram_list(fc, &names, &n));
    ASSERT_EQ(n, 2);
    engram_free(names);
    ASSERT_EQ(cstats(fc, NULL).tables, 1);
    atomic_store(&probe_gate, 1);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    engram__reader_set_hook(NULL, NULL);
    ASSERT_OK(a.rc);
    ASSERT_EQ(lookup_rounds(fc, a.tid, 98, 3, 1), 0);
    engram_store_close(fc);
}

/* Threads opening the same table at once: one source is made and the
 * others wait for it, so the table gets its whole share of the budget
 * (a second opener used to make its own cache from what the first left:
 * none, and could publish that one). */
typedef struct race_arg {
    engram_store *st;
    pthread_barrier_t *bar;
    engram_table_id tid;
    int rc;
} race_arg;

static void *race_open(void *arg)
{
    race_arg *a = arg;
    pthread_barrier_wait(a->bar);
    a->rc = engram_table_open(a->st, "t", &a->tid);
    return NULL;
}

static void test_racing_opens(void)
{
    engram_store *mem = tu_open("race", 0, 1), *st;
    enum { NT = 4 };
    pthread_barrier_t bar;
    pthread_t th[NT];
    race_arg a[NT];
    engram_table_id tid;
    uint64_t alone;
    tu_populate(mem, "t", 99, NROWS, R, PITCH);
    st = open_cache(tu_scratch_root(), "race", 256 << 10, 16, 1);
    ASSERT_OK(engram_table_open(st, "t", &tid));
    alone = cstats(st, "t").cache_bytes;
    engram_store_close(st);
    ASSERT_GT(alone, 0);
    for (int round = 0; round < 20; round++) {
        st = open_cache(tu_scratch_root(), "race", 256 << 10, 16, 1);
        pthread_barrier_init(&bar, NULL, NT);
        for (int i = 0; i < NT; i++) {
            a[i] = (race_arg){st, &bar, 0, -1};
            ASSERT_EQ(pthread_create(&th[i], NULL, race_open, &a[i]), 0);
        }
        for (int i = 0; i < NT; i++) {
            ASSERT_EQ(pthread_join(th[i], NULL), 0);
            ASSERT_OK(a[i].rc);
            ASSERT_EQ(a[i].tid, a[0].tid);
        }
        pthread_barrier_destroy(&bar);
        ASSERT_EQ_U64(cstats(st, "t").cache_bytes, alone);
        ASSERT_EQ(cstats(st, NULL).tables, 1);
        ASSERT_EQ(lookup_rounds(st, a[0].tid, 99, (uint64_t)round + 1, 1), 0);
        engram_store_close(st);
    }
    engram_store_close(mem);
}

/* A source table's cache asked for more than the whole budget leaves the
 * reads of file tables their eighth: a file table opened after it reads
 * (it used to fail with -ENOBUFS). */
static int zero_rows(void *ctx, engram_source_req *reqs, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        memset(reqs[i].dst, 0, R);
    return 0;
}

static void test_source_cache_leaves_staging(void)
{
    engram_store *mem = tu_open("share", 0, 1), *st;
    engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
    engram_table_spec spec = {1 << 20, R, 0};
    engram_table_id tid;
    engram_cache_stats s;
    tu_populate(mem, "t", 101, NROWS, R, PITCH);
    ops.read_rows = zero_rows;
    st = open_cache(tu_scratch_root(), "share", 1 << 20, 16, 1);
    ASSERT_OK(engram_add_source(st, "greedy", &spec, &ops, NULL, (uint64_t)1 << 30, NULL));
    ASSERT_LE(cstats(st, "greedy").cache_bytes, (1 << 20) - (1 << 20) / 8);
    ASSERT_OK(engram_table_open(st, "t", &tid));
    ASSERT_EQ(lookup_rounds(st, tid, 101, 4, 2), 0);
    s = cstats(st, NULL);
    ASSERT_GT(s.staging_bytes, 0);
    ASSERT_LE(s.cache_bytes + s.staging_bytes, s.budget_bytes);
    engram_store_close(st);
    engram_store_close(mem);
}

static uint64_t status_kb(const char *key)
{
    char line[256];
    unsigned long long kb = 0;
    size_t n = strlen(key);
    FILE *f = fopen("/proc/self/status", "r");
    ASSERT(f != NULL);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':')
            sscanf(line + n + 1, "%llu", &kb);
    fclose(f);
    return (uint64_t)kb;
}

/* Every open flag works with the row cache or is refused. */
static void test_flags(void)
{
    engram_store *mem = tu_open("flags", 0, 1), *st;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_id tid;
    tu_populate(mem, "t", 93, NROWS, R, PITCH);

    o.flags = ENGRAM_OPEN_FILE_CACHE | ENGRAM_OPEN_PRIVATE_HUGE;
    ASSERT_ERR(engram_store_open(tu_scratch_root(), "flags", &o, &st), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "PRIVATE_HUGE");

    /* RANDOM: no readahead on the buffered reads; rows as ever. */
    o.flags = ENGRAM_OPEN_FILE_CACHE | ENGRAM_OPEN_RANDOM;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "flags", &o, &st));
    ASSERT_OK(engram_table_open(st, "t", &tid));
    ASSERT_EQ(lookup_rounds(st, tid, 93, 5, 3), 0);
    engram_store_close(st);

    /* MLOCK locks the cache's memory (or says why it cannot). */
    o.flags = ENGRAM_OPEN_FILE_CACHE | ENGRAM_OPEN_MLOCK;
    o.cache_bytes = 4 << 20;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "flags", &o, &st));
    {
        uint64_t before = status_kb("VmLck");
        int rc = engram_table_open(st, "t", &tid);
        if (rc == 0) {
            engram_cache_stats s = cstats(st, "t");
            ASSERT_GT(s.cache_bytes, 1 << 20);
#ifndef TU_HAVE_SANITIZER
            /* (The sanitizers' runtimes make mlock() a no-op that succeeds.) */
            ASSERT_GE((status_kb("VmLck") - before) * 1024, s.cache_bytes - 4096);
#else
            (void)before;
#endif
            ASSERT_EQ(lookup_rounds(st, tid, 93, 6, 3), 0);
        } else {
            ASSERT_CONTAINS(engram_errmsg(), "mlock");
            tu_skip_part("mlock refused here, so the locked memory is not checked: %s",
                         engram_errmsg());
        }
    }
    engram_store_close(st);

    /* CACHE_KEEP_ALL: a scan of every row, once, through a cache of about
     * 240 slots keeps every row it reads (evicting); without it, the full
     * cache declines most of them. */
    for (int keep = 0; keep < 2; keep++) {
        static int64_t ids[NROWS];
        engram_cache_stats s;
        o.flags = ENGRAM_OPEN_FILE_CACHE | (keep ? ENGRAM_OPEN_CACHE_KEEP_ALL : 0);
        o.cache_bytes = 64 << 10;
        ASSERT_OK(engram_store_open(tu_scratch_root(), "flags", &o, &st));
        for (int i = 0; i < NROWS; i++)
            ids[i] = i;
        lookup_both(st, mem, "t", 93, ids, NROWS);
        s = cstats(st, "t");
        ASSERT_GT(s.slots, 100);
        if (keep)
            ASSERT_EQ(s.not_kept, 0);
        else
            ASSERT_GE(s.not_kept, (NROWS - s.slots) / 2);
        engram_store_close(st);
    }
    engram_store_close(mem);
}

/* The budget holds the process's memory, staging included: rows of 4 MiB,
 * a 48 MiB budget, lookups from three threads and the pool.  The cache
 * used to keep queue_depth staging rows per ring (here 4 rings x 64 x 4
 * MiB = 1 GiB) whatever the budget. */
typedef struct big_arg {
    engram_store *st;
    engram_table_id tid;
    unsigned char *out;
    uint64_t seed;
    int bad;
} big_arg;

enum { BIG_R = 4 << 20, BIG_ROWS = 16 };

static void *big_main(void *arg)
{
    big_arg *a = arg;
    for (int it = 0; it < 12 && !a->bad; it++) {
        int64_t ids[2] = {(int64_t)tu_rand_below(&a->seed, BIG_ROWS),
                          (int64_t)tu_rand_below(&a->seed, BIG_ROWS)};
        if (tu_lookup1(a->st, a->tid, ids, 2, a->out, 0) != 0 ||
            tu_row_mismatch(a->out, 95, (uint64_t)ids[0], BIG_R) >= 0 ||
            tu_row_mismatch(a->out + BIG_R, 95, (uint64_t)ids[1], BIG_R) >= 0)
            a->bad = 1;
    }
    return NULL;
}

static void test_budget_holds_memory(void)
{
    engram_store *mem = tu_open("huge", 0, 1), *st;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    const uint64_t budget = 48 << 20;
    big_arg a[3];
    pthread_t th[3];
    uint64_t rss0, rss1;
    engram_cache_stats s;
    tu_populate(mem, "t", 95, BIG_ROWS, BIG_R, 0);
    engram_store_close(mem);
    o.flags = ENGRAM_OPEN_FILE_CACHE;
    o.cache_bytes = budget;
    o.threads = 2;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "huge", &o, &st));
    for (int i = 0; i < 3; i++) {
        a[i] = (big_arg){st, 0, tu_xmalloc(2 * (size_t)BIG_R), (uint64_t)i + 1, 0};
        /* Resident before the baseline (not 0: malloc + memset 0 may
         * become a calloc that touches nothing). */
        memset(a[i].out, 0xEE, 2 * (size_t)BIG_R);
    }
    rss0 = status_kb("VmRSS") * 1024;
    ASSERT_OK(engram_table_open(st, "t", &a[0].tid));
    a[1].tid = a[2].tid = a[0].tid;
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, big_main, &a[i]), 0);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
        ASSERT_EQ(a[i].bad, 0);
    }
    rss1 = status_kb("VmRSS") * 1024;
    s = cstats(st, "t");
    ASSERT_LE(s.cache_bytes + s.staging_bytes, budget);
    ASSERT_GT(s.staging_bytes, BIG_R); /* one row's read at least */
    /* What the lookups left resident: the cache, the staging, and a few
     * MiB of thread stacks, scratch and heap. */
    printf("   RSS +%.1f MiB for a %.0f MiB budget (%.1f MiB slots, %.1f MiB staging)\n",
           (double)(rss1 - rss0) / 1048576.0, (double)budget / 1048576.0,
           (double)s.cache_bytes / 1048576.0, (double)s.staging_bytes / 1048576.0);
#if !defined(__SANITIZE_THREAD__)
    /* (ThreadSanitizer keeps shadow memory for every byte touched: four
     * times the memory itself and more, so RSS says nothing there.) */
    ASSERT_LE(rss1 - rss0, s.cache_bytes + s.staging_bytes + (4 << 20));
#endif
    engram_store_close(st);
    for (int i = 0; i < 3; i++)
        free(a[i].out);
}

int main(int argc, char **argv)
{
    tu_cases(argc, argv);
    tu_watchdog(240);
    RUN_TEST(test_exact_patterns);
    RUN_TEST(test_one_set_thrash);
    RUN_TEST(test_multi_column);
    RUN_TEST(test_threads);
    RUN_TEST(test_read_errors);
    RUN_TEST(test_truncated_file);
    RUN_TEST(test_retried_reads);
    RUN_TEST(test_no_io_uring);
    RUN_TEST(test_large_lookup);
    RUN_TEST(test_direct_modes);
    RUN_TEST(test_signal_storm);
    RUN_TEST(test_options_and_log);
    RUN_TEST(test_fork);
    RUN_TEST(test_slow_open);
    RUN_TEST(test_racing_opens);
    RUN_TEST(test_source_cache_leaves_staging);
    RUN_TEST(test_flags);
    RUN_TEST(test_budget_holds_memory);
    return tu_done("test_filesrc");
}
