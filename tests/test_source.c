/*
 * test_source.c - tables served by the caller's code through the public
 * source API (engram_add_source): exactly the lookup semantics of a
 * memory-resident table, with and without the row cache, deduplication,
 * failures injected in read_rows, grouping of tables into one call, and
 * every bad argument.
 *
 * The "hash source" below keeps its rows in a private buffer behind a
 * lock-free counter of calls and rows, can fail a chosen call (whole, or
 * marking some rows done), and checks every request it gets: rows in
 * range, no (table, row) twice in one call, table_ud and table id
 * consistent.  Every lookup is compared with the same lookup against the
 * same rows bound as memory.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>

enum { NROWS = 1000, R = 40, PITCH = 48 };

typedef struct src_table {
    const unsigned char *rows;
    uint64_t nrows;
    engram_table_id id; /* filled after engram_add_source */
    int released;
} src_table;

typedef struct src_ctx {
    _Atomic int calls;
    _Atomic uint64_t rows_read;
    _Atomic size_t max_n; /* the largest call */
    int fail_call;        /* fail the n-th call (1-based; 0: never) ... */
    int fail_code;        /* ... with this code */
    int done_every;       /* ... marking every n-th request done (0: none) */
    int use_msg;          /* ... with engram_source_error() */
    int positive;         /* ... return a positive value instead */
    _Atomic int tables_seen; /* bit per table_ud index of the last call */
    int lookup_inside;    /* call engram_lookup from inside */
    engram_store *st;
    int inside_rc;
} src_ctx;

static src_table *g_tabs[4];

static int src_read(void *vctx, engram_source_req *reqs, size_t n)
{
    src_ctx *c = vctx;
    int call = atomic_fetch_add(&c->calls, 1) + 1, seen = 0;
    size_t max = atomic_load(&c->max_n);
    ASSERT_GT(n, 0);
    ASSERT_LE(n, ENGRAM_SOURCE_MAX_REQS);
    while (n > max && !atomic_compare_exchange_weak(&c->max_n, &max, n))
        ;
    for (size_t i = 0; i < n; i++) {
        src_table *t = reqs[i].table_ud;
        ASSERT(t != NULL);
        ASSERT_EQ(reqs[i].done, 0);
        ASSERT_EQ(reqs[i].table, t->id);
        ASSERT_LT(reqs[i].row, t->nrows);
        for (int k = 0; k < 4; k++)
            if (g_tabs[k] == t)
                seen |= 1 << k;
    }
    atomic_store(&c->tables_seen, seen);
    /* Deduplicated: no (table, row) twice (n is small in these tests). */
    if (n <= 4096)
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++)
                ASSERT(reqs[i].table_ud != reqs[j].table_ud || reqs[i].row != reqs[j].row);
    if (c->lookup_inside) {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        int64_t id = 0;
        unsigned char out[R];
        a.num_tokens = a.num_cols = 1;
        a.tables = &g_tabs[0]->id;
        a.ids = &id;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        c->inside_rc = engram_lookup(c->st, &a);
    }
    if (c->fail_call && call == c->fail_call) {
        for (size_t i = 0; c->done_every && i < n; i++) {
            if (i % (size_t)c->done_every == 0) {
                src_table *t = reqs[i].table_ud;
                memcpy(reqs[i].dst, t->rows + reqs[i].row * PITCH, R);
                reqs[i].done = 1;
            }
        }
        if (c->positive)
            return 7;
        if (c->use_msg)
            return engram_source_error(c->fail_code, "node %d timed out", 3);
        return c->fail_code;
    }
    for (size_t i = 0; i < n; i++) {
        src_table *t = reqs[i].table_ud;
        memcpy(reqs[i].dst, t->rows + reqs[i].row * PITCH, R);
    }
    atomic_fetch_add(&c->rows_read, n);
    return 0;
}

static void src_release(void *vctx, void *table_ud)
{
    (void)vctx;
    ((src_table *)table_ud)->released++;
}

static engram_source_ops make_ops(src_ctx *c)
{
    engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
    ops.ctx = c;
    ops.read_rows = src_read;
    ops.release = src_release;
    return ops;
}

/* One source table of nrows rows (pattern `seed`) in a memory store: what
 * most cases below start from. */
typedef struct fixture {
    unsigned char *rows;
    engram_table_spec spec;
    src_ctx c;
    src_table tab;
    engram_source_ops ops;
    engram_store *st;
    engram_table_id id;
} fixture;

static void fx_open_flags(fixture *f, uint32_t seed, uint64_t nrows, const char *name,
                          uint64_t cache_bytes, uint32_t flags)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    o.flags = flags;
    memset(f, 0, sizeof *f);
    f->rows = tu_make_rows(seed, nrows, R, PITCH, 0);
    f->spec = (engram_table_spec){nrows, R, PITCH};
    f->tab = (src_table){f->rows, nrows, 0, 0};
    f->ops = make_ops(&f->c);
    g_tabs[0] = &f->tab;
    ASSERT_OK(engram_store_open_memory(&o, &f->st));
    f->c.st = f->st;
    ASSERT_OK(engram_add_source(f->st, name, &f->spec, &f->ops, &f->tab, cache_bytes, &f->id));
    f->tab.id = f->id;
}

static void fx_open(fixture *f, uint32_t seed, uint64_t nrows, const char *name,
                    uint64_t cache_bytes)
{
    fx_open_flags(f, seed, nrows, name, cache_bytes, 0);
}

/* Closes the store (the table's release must run once) and frees. */
static void fx_close(fixture *f)
{
    engram_store_close(f->st);
    ASSERT_EQ(f->tab.released, 1);
    free(f->rows);
}

static int lookup(engram_store *st, const engram_table_id *tabs, const int64_t *offs,
                  const int64_t *ids, size_t T, size_t K, void *out, uint32_t flags)
{
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.flags = flags;
    a.num_tokens = T;
    a.num_cols = K;
    a.tables = tabs;
    a.offsets = offs;
    a.ids = ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = out;
    return engram_lookup(st, &a);
}

static engram_cache_stats cstats(engram_store *st, const char *name)
{
    engram_cache_stats s = ENGRAM_CACHE_STATS_INIT;
    ASSERT_OK(engram_get_cache_stats(st, name, &s));
    return s;
}

/* Source columns mixed with a memory column, with and without the cache,
 * dead ids kept and zero-filled: byte for byte the memory lookup. */
static void test_matches_memory(void)
{
    enum { T = 700, K = 3 };
    unsigned char *rows = tu_make_rows(7, NROWS, R, PITCH, 0);
    engram_table_spec spec = {NROWS, R, PITCH};
    static int64_t ids[T][K];
    static unsigned char out_s[T][K][R], out_m[T][K][R];
    int64_t offs[K] = {0, 5, 0};
    uint64_t rng = 1;

    for (int cached = 0; cached < 2; cached++) {
        engram_store *st;
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        src_ctx c = {0};
        src_table tab = {rows, NROWS, 0, 0};
        engram_source_ops ops = make_ops(&c);
        engram_table_id ids_s[K], ids_m[K], src_id, mem_id;
        tu_current_case = cached ? "matches memory: cached" : "matches memory: uncached";
        g_tabs[0] = &tab;
        o.cache_bytes = 1 << 20;
        ASSERT_OK(engram_store_open_memory(&o, &st));
        ASSERT_OK(engram_add_source(st, "src", &spec, &ops, &tab, cached ? 256 << 10 : 0,
                                    &src_id));
        tab.id = src_id;
        ASSERT_OK(engram_bind(st, "mem", &spec, rows));
        ASSERT_OK(engram_table_open(st, "mem", &mem_id));
        /* Column 1 is memory, columns 0 and 2 go through the source. */
        ids_s[0] = ids_s[2] = src_id;
        ids_s[1] = mem_id;
        ids_m[0] = ids_m[1] = ids_m[2] = mem_id;
        for (int round = 0; round < 3; round++) {
            for (int t = 0; t < T; t++)
                for (int k = 0; k < K; k++)
                    ids[t][k] = (t % 17 == 0) ? -1
                                              : (int64_t)tu_rand_below(&rng, round ? 150 : NROWS) +
                                                    offs[k];
            for (int zero = 0; zero < 2; zero++) {
                int calls = atomic_load(&c.calls);
                memset(out_s, 0xAB, sizeof out_s);
                memset(out_m, 0xAB, sizeof out_m);
                ASSERT_OK(lookup(st, ids_s, offs, &ids[0][0], T, K, out_s,
                                 zero ? ENGRAM_LOOKUP_ZERO_DEAD : 0));
                ASSERT_OK(lookup(st, ids_m, offs, &ids[0][0], T, K, out_m,
                                 zero ? ENGRAM_LOOKUP_ZERO_DEAD : 0));
                ASSERT_MEM_EQ(out_s, out_m, sizeof out_s);
                /* One call per lookup, both columns together (none when
                 * the cache held everything). */
                ASSERT_LE(atomic_load(&c.calls) - calls, 1);
            }
        }
        {
            engram_cache_stats s = cstats(st, "src");
            uint64_t live = 3 * 2 * 2 * (T - (T + 16) / 17);
            ASSERT_EQ(s.tables, 1);
            ASSERT_EQ_U64(s.hits + s.misses, live);
            /* Each distinct row of a lookup is read once: the repeats of
             * a small working set are deduplicated. */
            ASSERT_EQ_U64(s.reads, atomic_load(&c.rows_read));
            ASSERT_EQ_U64(s.misses - s.dedup, s.reads);
            ASSERT_GT(s.dedup, 0);
            ASSERT_EQ_U64(s.bytes_read, s.reads * R);
            ASSERT_EQ(s.read_errors, 0);
            if (cached) {
                ASSERT_GT(s.hits, 0);
                ASSERT_GT(s.slots, 0);
                ASSERT_LE(s.cache_bytes, 256 << 10);
            } else {
                ASSERT_EQ(s.hits, 0);
                ASSERT_EQ(s.slots, 0);
            }
        }
        {
            engram_table_info info = ENGRAM_TABLE_INFO_INIT;
            const void *base;
            engram_table_spec sp;
            ASSERT_OK(engram_get_table_info(st, "src", &info));
            ASSERT_EQ(info.kind, ENGRAM_TABLE_SOURCE);
            ASSERT_EQ(info.mapped, 0);
            ASSERT_EQ_U64(info.spec.num_rows, NROWS);
            ASSERT_EQ(engram_table_memory(st, src_id, &base, &sp), -ENOTSUP);
            ASSERT(base == NULL);
            ASSERT_EQ(sp.row_pitch, PITCH);
            ASSERT_ERR(engram_remove(st, "src"), ENGRAM_EBOUND);
            ASSERT_CONTAINS(engram_errmsg(), "source");
        }
        ASSERT_EQ(tab.released, 0);
        engram_store_close(st);
        ASSERT_EQ(tab.released, 1);
    }
    free(rows);
}

/* An out-of-range id reaches no source; a failed call leaves its unread
 * rows untouched, caches nothing of them, and names the table. */
static void test_failures(void)
{
    enum { N = 64 };
    fixture f;
    src_ctx *const cp = &f.c;
    int64_t ids[N];
    static unsigned char out[N][R];
    engram_cache_stats s0, s1;
    engram_store *st;
    engram_table_id id;
    fx_open(&f, 9, NROWS, "flaky", 64 << 10);
    st = f.st;
    id = f.id;
    for (int i = 0; i < N; i++)
        ids[i] = i % 8 == 7 ? ids[i - 4] : (int64_t)(i * 13 % NROWS); /* some repeats */

    tu_current_case = "bad id: no call";
    ids[5] = NROWS;
    memset(out, 0xEE, sizeof out);
    ASSERT_ERR(lookup(st, &id, NULL, ids, N, 1, out, 0), ENGRAM_EBADID);
    ASSERT_EQ(atomic_load(&cp->calls), 0);
    ASSERT_ALL_BYTES(out, 0xEE, sizeof out);
    ids[5] = 5;

    tu_current_case = "failed call: nothing written, nothing cached";
    cp->fail_call = 1;
    cp->fail_code = -EIO;
    ASSERT_ERR(lookup(st, &id, NULL, ids, N, 1, out, 0), -EIO);
    ASSERT_CONTAINS(engram_errmsg(), "table 'flaky'");
    ASSERT_CONTAINS(engram_errmsg(), "read_rows failed");
    ASSERT_ALL_BYTES(out, 0xEE, sizeof out);
    s0 = cstats(st, "flaky");
    ASSERT_EQ(s0.hits, 0);
    ASSERT_GT(s0.read_errors, 0);
    /* Nothing was cached: the same lookup reads every distinct row again. */
    ASSERT_OK(lookup(st, &id, NULL, ids, N, 1, out, 0));
    s1 = cstats(st, "flaky");
    ASSERT_EQ(s1.hits, 0);
    for (int i = 0; i < N; i++)
        ASSERT_ROW(out[i], 9, (uint64_t)ids[i], R);
    /* And now they are cached. */
    ASSERT_OK(lookup(st, &id, NULL, ids, N, 1, out, 0));
    ASSERT_EQ_U64(cstats(st, "flaky").hits - s1.hits, N);

    tu_current_case = "failed call marking some rows done";
    for (int i = 0; i < N; i++)
        ids[i] = i % 8 == 7 ? ids[i - 4] : (int64_t)(500 + i * 7);
    cp->fail_call = atomic_load(&cp->calls) + 1;
    cp->fail_code = -ETIMEDOUT;
    cp->done_every = 3;
    cp->use_msg = 1;
    memset(out, 0xEE, sizeof out);
    ASSERT_ERR(lookup(st, &id, NULL, ids, N, 1, out, 0), -ETIMEDOUT);
    ASSERT_CONTAINS(engram_errmsg(), "table 'flaky': node 3 timed out");
    {
        int written = 0, untouched = 0;
        for (int i = 0; i < N; i++) {
            if (tu_row_mismatch(out[i], 9, (uint64_t)ids[i], R) < 0)
                written++;
            else {
                ASSERT_ALL_BYTES(out[i], 0xEE, R);
                untouched++;
            }
        }
        ASSERT_GT(written, 0);
        ASSERT_GT(untouched, 0);
        /* The rows marked done were cached, and only those: the next
         * lookup hits exactly as many distinct rows as were marked. */
        s0 = cstats(st, "flaky");
        cp->fail_call = 0;
        ASSERT_OK(lookup(st, &id, NULL, ids, N, 1, out, 0));
        s1 = cstats(st, "flaky");
        ASSERT_EQ_U64(s1.hits - s0.hits, written);
        for (int i = 0; i < N; i++)
            ASSERT_ROW(out[i], 9, (uint64_t)ids[i], R);
    }

    tu_current_case = "a positive return";
    for (int i = 0; i < N; i++)
        ids[i] = 942 + i % 57; /* rows no lookup asked for yet */
    cp->fail_call = atomic_load(&cp->calls) + 1;
    cp->done_every = 1;
    cp->use_msg = 0;
    cp->positive = 1;
    memset(out, 0xEE, sizeof out);
    ASSERT_ERR(lookup(st, &id, NULL, ids, N, 1, out, 0), -EIO);
    ASSERT_CONTAINS(engram_errmsg(), "returned 7");
    /* done marks mean nothing without a code: nothing was cached. */
    cp->fail_call = 0;
    cp->positive = 0;
    s0 = cstats(st, "flaky");
    ASSERT_OK(lookup(st, &id, NULL, ids, N, 1, out, 0));
    ASSERT_EQ_U64(cstats(st, "flaky").hits, s0.hits);

    tu_current_case = "a lookup from inside read_rows";
    cp->lookup_inside = 1;
    ids[0] = 999;
    ASSERT_OK(lookup(st, &id, NULL, ids, 1, 1, out, 0));
    ASSERT_EQ(cp->inside_rc, ENGRAM_ESTATE);
    cp->lookup_inside = 0;
    fx_close(&f);
}

/* Two sources failing in one lookup: the code and the message are both
 * the first failure's (the second call used to overwrite the message). */
static void test_two_failures(void)
{
    unsigned char *rows = tu_make_rows(3, NROWS, R, PITCH, 0);
    engram_table_spec spec = {NROWS, R, PITCH};
    src_ctx c1 = {0}, c2 = {0};
    src_table ta = {rows, NROWS, 0, 0}, tb = {rows, NROWS, 0, 0};
    engram_source_ops o1 = make_ops(&c1), o2 = make_ops(&c2);
    engram_store *st;
    engram_table_id tabs[2];
    int64_t ids[2] = {1, 2};
    unsigned char out[2][R];
    g_tabs[0] = &ta;
    g_tabs[1] = &tb;
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_OK(engram_add_source(st, "first", &spec, &o1, &ta, 0, &tabs[0]));
    ASSERT_OK(engram_add_source(st, "second", &spec, &o2, &tb, 0, &tabs[1]));
    ta.id = tabs[0];
    tb.id = tabs[1];
    c1 = (src_ctx){0};
    c2 = (src_ctx){0};
    c1.fail_call = c2.fail_call = 1;
    c1.fail_code = -ETIMEDOUT;
    c2.fail_code = -EPIPE;
    c1.use_msg = c2.use_msg = 1;
    ASSERT_ERR(lookup(st, tabs, NULL, ids, 1, 2, out, 0), -ETIMEDOUT);
    ASSERT_CONTAINS(engram_errmsg(), "table 'first'");
    ASSERT_EQ(atomic_load(&c2.calls), 1); /* the second source was still asked */
    engram_store_close(st);
    free(rows);
}

/* Tables added with the same read_rows and ctx share calls; another ctx
 * gets its own. */
static void test_grouping(void)
{
    enum { T = 50 };
    unsigned char *ra = tu_make_rows(1, NROWS, R, PITCH, 0), *rb = tu_make_rows(2, NROWS, R, PITCH, 0);
    engram_table_spec spec = {NROWS, R, PITCH};
    src_ctx c1 = {0}, c2 = {0};
    src_table ta = {ra, NROWS, 0, 0}, tb = {rb, NROWS, 0, 0}, tc = {rb, NROWS, 0, 0};
    engram_source_ops o1 = make_ops(&c1), o2 = make_ops(&c2);
    engram_store *st;
    engram_table_id tabs[3];
    int64_t ids[T][3];
    static unsigned char out[T][3][R];
    g_tabs[0] = &ta;
    g_tabs[1] = &tb;
    g_tabs[2] = &tc;
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_OK(engram_add_source(st, "a", &spec, &o1, &ta, 0, &tabs[0]));
    ASSERT_OK(engram_add_source(st, "b", &spec, &o1, &tb, 0, &tabs[1]));
    ASSERT_OK(engram_add_source(st, "c", &spec, &o2, &tc, 0, &tabs[2]));
    ta.id = tabs[0];
    tb.id = tabs[1];
    tc.id = tabs[2];
    /* The same row number in a and b is two distinct rows. */
    for (int t = 0; t < T; t++)
        ids[t][0] = ids[t][1] = ids[t][2] = t;
    ASSERT_OK(lookup(st, tabs, NULL, &ids[0][0], T, 3, out, 0));
    ASSERT_EQ(atomic_load(&c1.calls), 1);
    ASSERT_EQ(atomic_load(&c1.tables_seen), 3);
    ASSERT_EQ_U64(atomic_load(&c1.rows_read), 2 * T);
    ASSERT_EQ(atomic_load(&c2.calls), 1);
    ASSERT_EQ(atomic_load(&c2.tables_seen), 4);
    for (int t = 0; t < T; t++) {
        ASSERT_ROW(out[t][0], 1, (uint64_t)t, R);
        ASSERT_ROW(out[t][1], 2, (uint64_t)t, R);
        ASSERT_ROW(out[t][2], 2, (uint64_t)t, R);
    }
    engram_store_close(st);
    ASSERT_EQ(ta.released + tb.released + tc.released, 3);
    free(ra);
    free(rb);
}

/* More positions than one call takes: calls of at most
 * ENGRAM_SOURCE_MAX_REQS, every row right. */
static void test_large(void)
{
    size_t n = ENGRAM_SOURCE_MAX_REQS + 5000;
    uint64_t nrows = 200000;
    fixture f;
    int64_t *ids = tu_xmalloc(n * sizeof *ids);
    unsigned char *out = tu_xmalloc(n * R);
    fx_open(&f, 4, nrows, "big", 0);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int64_t)(i * 7 % nrows);
    ASSERT_OK(lookup(f.st, &f.id, NULL, ids, n, 1, out, 0));
    ASSERT_EQ(atomic_load(&f.c.calls), 2);
    ASSERT_EQ_U64(atomic_load(&f.c.max_n), ENGRAM_SOURCE_MAX_REQS);
    for (size_t i = 0; i < n; i++)
        ASSERT_ROW(out + i * R, 4, (uint64_t)ids[i], R);
    fx_close(&f);
    free(ids);
    free(out);
}

/* Lookups from several threads at once through a small cache: hits,
 * misses and insertions race on the same sets. */
typedef struct worker {
    engram_store *st;
    engram_table_id id;
    uint64_t seed;
    int bad;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    enum { N = 300 };
    int64_t ids[N];
    unsigned char *out = tu_xmalloc((size_t)N * R);
    for (int it = 0; it < 40 && !w->bad; it++) {
        for (int i = 0; i < N; i++)
            ids[i] = (int64_t)(i % 3 ? tu_rand_below(&w->seed, 100) : tu_rand_below(&w->seed, NROWS));
        if (lookup(w->st, &w->id, NULL, ids, N, 1, out, 0) != 0)
            w->bad = 1;
        for (int i = 0; i < N && !w->bad; i++)
            if (tu_row_mismatch(out + (size_t)i * R, 5, (uint64_t)ids[i], R) >= 0)
                w->bad = 1;
    }
    free(out);
    return NULL;
}

static void test_threads(void)
{
    enum { NT = 4 };
    fixture f;
    pthread_t th[NT];
    worker w[NT];
    fx_open(&f, 5, NROWS, "t", 8 << 10);
    for (int i = 0; i < NT; i++) {
        w[i] = (worker){f.st, f.id, (uint64_t)i * 77 + 1, 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        ASSERT_EQ(w[i].bad, 0);
    }
    ASSERT_GT(cstats(f.st, "t").hits, 0);
    fx_close(&f);
}

/* The store's budget bounds the caches of source tables. */
static void test_budget(void)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_spec spec = {NROWS, R, PITCH};
    src_ctx c = {0};
    src_table ta = {NULL, NROWS, 0, 0}, tb = {NULL, NROWS, 0, 0};
    engram_source_ops ops = make_ops(&c);
    engram_store *st;
    engram_cache_stats s;
    o.cache_bytes = 32 << 10;
    ASSERT_OK(engram_store_open_memory(&o, &st));
    /* Asks for more than the budget: gets what is left, no more. */
    ASSERT_OK(engram_add_source(st, "a", &spec, &ops, &ta, 1 << 30, NULL));
    s = cstats(st, "a");
    ASSERT_GT(s.slots, 0);
    ASSERT_LE(s.cache_bytes, 32 << 10);
    /* Nothing left: the second table reads every row. */
    ASSERT_OK(engram_add_source(st, "b", &spec, &ops, &tb, 1 << 20, NULL));
    ASSERT_EQ(cstats(st, "b").slots, 0);
    s = cstats(st, NULL);
    ASSERT_EQ(s.tables, 2);
    ASSERT_LE(s.cache_bytes + s.staging_bytes, s.budget_bytes);
    engram_store_close(st);
}

/* Rows of one byte each, made from the row number. */
static int byte_read(void *ctx, engram_source_req *reqs, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        *(unsigned char *)reqs[i].dst = (unsigned char)(reqs[i].row * 31 + 7);
    return 0;
}

/* The largest budget, and a table of 1-byte rows with as many sets as it
 * allows: sets and slots then take 3 * 2^62 + 32 bytes and the admission
 * sketch 2^62, more than 2^64 together.  The cache must be sized in full
 * (and then fail to be allocated), never as the 32 bytes left after
 * wrapping around, which would hold no slot of the 2^59 it reports. */
static void test_budget_huge(void)
{
    const uint64_t nsets = ((uint64_t)3 << 58) / 11 + 1; /* 11 * nsets = 3 * 2^58 + 2 */
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_spec spec = {nsets * ENGRAM_CACHE_WAYS, 1, 0};
    engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
    engram_store *st;
    engram_table_id id;
    int rc;
    ops.read_rows = byte_read;
    o.cache_bytes = UINT64_MAX;
    ASSERT_OK(engram_store_open_memory(&o, &st));
    rc = engram_add_source(st, "huge", &spec, &ops, NULL, UINT64_MAX, &id);
    if (rc == 0) {
        engram_cache_stats s = cstats(st, "huge");
        int64_t ids[4] = {0, 1, (int64_t)spec.num_rows - 1, 12345};
        unsigned char out[4];
        printf("   %" PRIu64 " slots in %" PRIu64 " bytes\n", s.slots, s.cache_bytes);
        /* Unsigned: these pass LLONG_MAX.  A slot holds at least its row. */
        ASSERT(s.cache_bytes <= s.budget_bytes - s.staging_bytes);
        ASSERT(s.cache_bytes >= s.slots);
        ASSERT_OK(lookup(st, &id, NULL, ids, 4, 1, out, 0));
        for (int i = 0; i < 4; i++)
            ASSERT_EQ(out[i], (unsigned char)((uint64_t)ids[i] * 31 + 7));
    } else {
        ASSERT_EQ(rc, -ENOMEM);
    }
    engram_store_close(st);
}

/* Asks rows first..first+n-1 (each `times` times in one lookup, in
 * lookups of at most 1024 positions) and checks the bytes; returns the
 * cache stats after. */
static engram_cache_stats ask_rows(fixture *f, int64_t first, int n, int times)
{
    static int64_t ids[1024];
    static unsigned char out[1024][R];
    int per = 1024 / times, done = 0;
    while (done < n) {
        int m = n - done < per ? n - done : per, k = 0;
        for (int i = 0; i < m; i++)
            for (int t = 0; t < times; t++)
                ids[k++] = first + done + i;
        ASSERT_OK(lookup(f->st, &f->id, NULL, ids, (size_t)k, 1, out, 0));
        for (int i = 0; i < k; i++)
            ASSERT_MEM_EQ(out[i], f->rows + (size_t)ids[i] * PITCH, R);
        done += m;
    }
    return cstats(f->st, "t");
}

/* Admission: once a row's set is full, a row read is kept only if it was
 * asked for at least twice lately (in one lookup or two), so a scan of
 * rows asked for once does not flush the rows asked for again, and the
 * counts fade, so the filter keeps working after a long run of misses. */
static void test_admission(void)
{
    fixture f;
    engram_cache_stats s0, s1;
    uint64_t slots;
    tu_current_case = "admission";
    fx_open(&f, 11, 200000, "t", 30000);
    slots = cstats(f.st, "t").slots;
    ASSERT_GE(slots, 300);
    ASSERT_LE(slots, 600);

    /* A hot set of 200 rows, asked for three times: kept (the cache has
     * room), then hits. */
    ask_rows(&f, 0, 200, 1);
    ask_rows(&f, 0, 200, 1);
    s0 = ask_rows(&f, 0, 200, 1);
    s1 = ask_rows(&f, 0, 200, 1);
    ASSERT_GE(s1.hits - s0.hits, 190);

    /* A scan of 4x the slots, each row once: the cache fills, then keeps
     * almost none of the rest, and the hot set stays. */
    s0 = s1;
    s1 = ask_rows(&f, 1000, (int)(4 * slots), 1);
    ASSERT_EQ(s1.misses - s0.misses, 4 * slots);
    ASSERT_GE(s1.not_kept - s0.not_kept, 3 * slots);
    s0 = s1;
    s1 = ask_rows(&f, 0, 200, 1);
    printf("   after a scan of %" PRIu64 " rows: %" PRIu64 " not kept, %" PRIu64
           " of 200 hot rows hit\n", 4 * slots, s0.not_kept, s1.hits - s0.hits);
    ASSERT_GE(s1.hits - s0.hits, 180);

    /* Fresh rows asked for twice, in two lookups or in one, are kept and
     * then hit. */
    for (int same = 0; same < 2; same++) {
        int64_t first = same ? 60000 : 50000;
        tu_current_case = same ? "admission: twice in one lookup" : "admission: two lookups";
        if (!same) {
            s0 = s1;
            s1 = ask_rows(&f, first, 100, 1);
            ASSERT_GE(s1.not_kept - s0.not_kept, 90);
        }
        s0 = s1;
        s1 = ask_rows(&f, first, 100, same ? 2 : 1);
        printf("   %s: %" PRIu64 " of 100 not kept", tu_current_case, s1.not_kept - s0.not_kept);
        /* A few may miss: their block was halved between the two asks. */
        ASSERT_LE(s1.not_kept - s0.not_kept, 10);
        s0 = s1;
        s1 = ask_rows(&f, first, 100, 1);
        printf(", then %" PRIu64 " hits\n", s1.hits - s0.hits);
        ASSERT_GE(s1.hits - s0.hits, 75);
    }

    /* A long run of misses (50x the slots, each row once): with counts
     * that never faded every counter would be high by now and every row
     * would be kept; the last stretch is still mostly refused. */
    tu_current_case = "admission: counts fade";
    ask_rows(&f, 70000, (int)(46 * slots), 1);
    s0 = cstats(f.st, "t");
    s1 = ask_rows(&f, 70000 + 46 * (int64_t)slots, (int)(4 * slots), 1);
    ASSERT_GE(s1.not_kept - s0.not_kept, 3 * slots);
    printf("   not kept: %" PRIu64 " of %" PRIu64 " rows asked for once\n", s1.not_kept - s0.not_kept,
           4 * slots);
    fx_close(&f);

    /* ENGRAM_OPEN_CACHE_KEEP_ALL: no filter (and no sketch: more slots in
     * the same bytes); the scan flushes the hot set. */
    tu_current_case = "admission: keep all";
    fx_open_flags(&f, 11, 200000, "t", 30000, ENGRAM_OPEN_CACHE_KEEP_ALL);
    ASSERT_GT(cstats(f.st, "t").slots, slots);
    slots = cstats(f.st, "t").slots;
    ask_rows(&f, 0, 200, 1);
    s0 = ask_rows(&f, 0, 200, 1);
    ASSERT_GE(s0.hits, 190);
    s0 = ask_rows(&f, 1000, (int)(4 * slots), 1);
    ASSERT_EQ(s0.not_kept, 0);
    s1 = ask_rows(&f, 0, 200, 1);
    ASSERT_LE(s1.hits - s0.hits, 20);
    fx_close(&f);
}

/* The cache stats of a source table of 2^20 rows given `share` bytes of
 * cache in a store opened with `flags`. */
static engram_cache_stats cache_of(uint64_t share, uint32_t flags)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_spec spec = {1 << 20, R, PITCH};
    src_ctx c = {0};
    src_table t = {NULL, 1 << 20, 0, 0};
    engram_source_ops ops = make_ops(&c);
    engram_cache_stats s;
    engram_store *st;
    o.flags = flags;
    o.cache_bytes = 2 * share;
    ASSERT_OK(engram_store_open_memory(&o, &st));
    ASSERT_OK(engram_add_source(st, "t", &spec, &ops, &t, share, NULL));
    s = cstats(st, "t");
    engram_store_close(st);
    return s;
}

/* The admission filter's counts take 8 bytes a slot (engram.h: a word a
 * slot, rounded up to a 64-byte block): for the same share, a cache with
 * the filter spends that much more per slot than one without, and has as
 * many slots as the share allows at that cost. */
static void test_admission_bytes(void)
{
    tu_current_case = "admission: bytes a slot";
    for (uint64_t share = 8 << 10; share < (1 << 20); share += share / 8) {
        engram_cache_stats f = cache_of(share, 0);
        engram_cache_stats k = cache_of(share, ENGRAM_OPEN_CACHE_KEEP_ALL);
        uint64_t per_set, sets, counts;
        ASSERT_GT(f.slots, 0);
        ASSERT_GT(k.slots, 0);
        /* Without the filter: sets and their slots, nothing else. */
        per_set = k.cache_bytes / (k.slots / ENGRAM_CACHE_WAYS);
        ASSERT_EQ_U64(k.cache_bytes % (k.slots / ENGRAM_CACHE_WAYS), 0);
        sets = f.slots / ENGRAM_CACHE_WAYS;
        ASSERT_GE(f.cache_bytes, sets * per_set);
        counts = f.cache_bytes - sets * per_set;
        ASSERT_GE(counts, 8 * f.slots);
        ASSERT_LT(counts, 8 * f.slots + 64);
        ASSERT_GE(sets, (share - 64 - 4096) / (per_set + 8 * ENGRAM_CACHE_WAYS));
    }
}

/* The rows a source gets are the ids the lookup validated, read once:
 * here the output of the memory column overwrites the ids of the source
 * column before the source is called (out aliases ids).  A second read
 * of the ids would hand the source a row made of table bytes. */
static void test_ids_read_once(void)
{
    fixture f;
    engram_table_id tabs[2];
    union {
        int64_t ids[2];
        unsigned char out[2 * R];
    } buf;
    fx_open(&f, 12, NROWS, "s", 0);
    ASSERT_OK(engram_bind(f.st, "m", &f.spec, f.rows));
    ASSERT_OK(engram_table_open(f.st, "m", &tabs[0]));
    tabs[1] = f.id;
    buf.ids[0] = 3;   /* column 0, memory: its row lands on both ids */
    buf.ids[1] = 777; /* column 1, the source */
    ASSERT_OK(lookup(f.st, tabs, NULL, buf.ids, 1, 2, buf.out, 0));
    ASSERT_ROW(buf.out, 12, 3, R);
    ASSERT_ROW(buf.out + R, 12, 777, R);
    ASSERT_EQ_U64(atomic_load(&f.c.rows_read), 1);
    fx_close(&f);
}

static void test_bad_arguments(void)
{
    engram_table_spec spec = {10, 8, 0}, bad_spec = {0, 8, 0};
    src_ctx c = {0};
    src_table t = {NULL, 10, 0, 0};
    engram_source_ops ops = make_ops(&c), v;
    engram_store *st, *ns;
    unsigned char mem[80];
    engram_cache_stats old;
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_ERR(engram_add_source(NULL, "x", &spec, &ops, &t, 0, NULL), -EINVAL);
    ASSERT_ERR(engram_add_source(st, "x", &spec, NULL, &t, 0, NULL), -EINVAL);
    v = ops;
    v.size = sizeof v - 8;
    ASSERT_ERR(engram_add_source(st, "x", &spec, &v, &t, 0, NULL), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "size");
    v = ops;
    v.flags = 1;
    ASSERT_ERR(engram_add_source(st, "x", &spec, &v, &t, 0, NULL), -EINVAL);
    v = ops;
    v.read_rows = NULL;
    ASSERT_ERR(engram_add_source(st, "x", &spec, &v, &t, 0, NULL), -EINVAL);
    ASSERT_ERR(engram_add_source(st, "x", &bad_spec, &ops, &t, 0, NULL), ENGRAM_ESPEC);
    ASSERT_ERR(engram_add_source(st, ".x", &spec, &ops, &t, 0, NULL), ENGRAM_ESPEC);
    ASSERT_ERR(engram_add_source(st, NULL, &spec, &ops, &t, 0, NULL), ENGRAM_ESPEC);
    ASSERT_OK(engram_bind(st, "m", &spec, mem));
    ASSERT_ERR(engram_add_source(st, "m", &spec, &ops, &t, 4096, NULL), -EEXIST);
    ASSERT_OK(engram_add_source(st, "x", &spec, &ops, &t, 0, NULL));
    ASSERT_ERR(engram_add_source(st, "x", &spec, &ops, &t, 0, NULL), -EEXIST);
    ASSERT_ERR(engram_bind(st, "x", &spec, mem), -EEXIST);
    /* A failed add never calls release; the one table added gets one. */
    engram_store_close(st);
    ASSERT_EQ(t.released, 1);

    /* A name that is a table file of the namespace is taken. */
    ns = tu_open("names", 0, 1);
    tu_populate(ns, "file", 3, 10, 8, 0);
    t.released = 0;
    ASSERT_ERR(engram_add_source(ns, "file", &spec, &ops, &t, 0, NULL), -EEXIST);
    /* Cache stats of a name that is not a source table, and sizes other
     * than the current one (the shorter structs before staging_bytes and
     * not_kept were never released): refused, nothing written. */
    ASSERT_ERR(engram_get_cache_stats(ns, "file", &(engram_cache_stats)ENGRAM_CACHE_STATS_INIT),
               -ENOENT);
    memset(&old, 0x5A, sizeof old);
    old.size = (uint32_t)offsetof(engram_cache_stats, staging_bytes);
    ASSERT_ERR(engram_get_cache_stats(ns, NULL, &old), -EINVAL);
    ASSERT_EQ_U64(old.tables, 0x5A5A5A5A5A5A5A5Aull); /* not written */
    old.size = (uint32_t)offsetof(engram_cache_stats, not_kept);
    ASSERT_ERR(engram_get_cache_stats(ns, NULL, &old), -EINVAL);
    ASSERT_EQ_U64(old.staging_bytes, 0x5A5A5A5A5A5A5A5Aull);
    old.size = (uint32_t)offsetof(engram_cache_stats, not_kept) + 4;
    ASSERT_ERR(engram_get_cache_stats(ns, NULL, &old), -EINVAL);
    old.size = sizeof old;
    ASSERT_OK(engram_get_cache_stats(ns, NULL, &old));
    ASSERT_NE(old.staging_bytes, 0x5A5A5A5A5A5A5A5Aull);
    engram_store_close(ns);
    ASSERT_EQ(t.released, 0);
}

int main(void)
{
    tu_watchdog(240);
    RUN_TEST(test_matches_memory);
    RUN_TEST(test_failures);
    RUN_TEST(test_two_failures);
    RUN_TEST(test_grouping);
    RUN_TEST(test_large);
    RUN_TEST(test_threads);
    RUN_TEST(test_budget);
    RUN_TEST(test_budget_huge);
    RUN_TEST(test_admission);
    RUN_TEST(test_admission_bytes);
    RUN_TEST(test_ids_read_once);
    RUN_TEST(test_bad_arguments);
    printf("test_source: all passed\n");
    return 0;
}
