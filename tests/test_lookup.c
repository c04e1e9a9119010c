/*
 * test_lookup.c - every documented lookup semantic, checked byte for byte.
 *
 * Each lookup here is compared with a reference gather (a plain loop that
 * writes each expected row from the row pattern) applied to a copy of the
 * same output buffer, with a sentinel-filled margin around the output, so
 * a wrong row, a byte written into a gap or past the end, or a row that
 * should have been left alone is all caught by one buffer comparison.
 * Failing lookups are compared with a snapshot: the whole buffer must be
 * untouched.  Finally many random shapes run against the reference, and
 * random ids and offsets near the ends of int64 against a 128-bit
 * reference of id - offset.
 */
#include <signal.h>

#include "testutil.h"

/* A table of the fixture: its id in each store, pattern seed and shape. */
typedef struct lk_table {
    const char *name;
    engram_table_id id[2]; /* in store_1 and store_2 */
    uint32_t seed;
    uint64_t nrows;
    uint32_t rb;
    unsigned char *bound_mem; /* non-NULL for bound tables */
} lk_table;

/* One lookup call: the arguments exactly as passed, and the output buffer
 * with a margin.  out = buf + base. */
typedef struct lk_call {
    size_t T, K;
    const lk_table *tabs[64];
    const int64_t *offsets;
    int id_type;
    const void *ids;
    ptrdiff_t ist, isk; /* as passed (0, 0 = contiguous) */
    ptrdiff_t ost, osk; /* as passed (0, 0 = contiguous) */
    uint32_t flags;
    unsigned char *buf;
    size_t len, base;
} lk_call;

static engram_store *store_1; /* threads = 1 */
static engram_store *store_2; /* threads = 2, parallel from 8 rows */
static int cur_store;          /* 0: store_1, 1: store_2 */

#define SENTINEL 0x5A

/* ------------------------------------------------------------------------
 * The reference.
 */
static void resolved_id_strides(const lk_call *c, ptrdiff_t *ist, ptrdiff_t *isk)
{
    if (c->ist == 0 && c->isk == 0) {
        *ist = (ptrdiff_t)c->K;
        *isk = 1;
    } else {
        *ist = c->ist;
        *isk = c->isk;
    }
}

static void resolved_out_strides(const lk_call *c, ptrdiff_t *ost, ptrdiff_t *osk)
{
    if (c->ost == 0 && c->osk == 0) {
        *osk = (ptrdiff_t)c->tabs[0]->rb;
        *ost = (ptrdiff_t)c->K * *osk;
    } else {
        *ost = c->ost;
        *osk = c->osk;
    }
}

static int64_t lk_id(const lk_call *c, size_t t, size_t k)
{
    ptrdiff_t ist, isk;
    resolved_id_strides(c, &ist, &isk);
    ptrdiff_t e = (ptrdiff_t)t * ist + (ptrdiff_t)k * isk;
    if (c->id_type == ENGRAM_ID_INT32)
        return ((const int32_t *)c->ids)[e];
    return ((const int64_t *)c->ids)[e];
}

/* Writes the expected output of `c` into `exp` (same layout as c->buf). */
static void ref_gather(const lk_call *c, unsigned char *exp)
{
    ptrdiff_t ost, osk;
    resolved_out_strides(c, &ost, &osk);
    for (size_t t = 0; t < c->T; t++) {
        for (size_t k = 0; k < c->K; k++) {
            const lk_table *tb = c->tabs[k];
            unsigned char *dst =
                exp + c->base + (ptrdiff_t)t * ost + (ptrdiff_t)k * osk;
            int64_t raw = lk_id(c, t, k);
            if (raw == ENGRAM_DEAD_ID) {
                if (c->flags & ENGRAM_LOOKUP_ZERO_DEAD)
                    memset(dst, 0, tb->rb);
                continue;
            }
            int64_t row = raw - (c->offsets ? c->offsets[k] : 0);
            ASSERT(row >= 0 && (uint64_t)row < tb->nrows); /* a test bug otherwise */
            tu_fill_row(dst, tb->seed, (uint64_t)row, tb->rb);
        }
    }
}

/* Allocates c->buf so that every output row fits with `margin` bytes of
 * slack on both sides, for any sign of the strides. */
static void alloc_out(lk_call *c, size_t margin)
{
    ptrdiff_t ost, osk;
    resolved_out_strides(c, &ost, &osk);
    ptrdiff_t lo = 0, hi = 0;
    if (c->T > 0 && c->K > 0) {
        ptrdiff_t corners[4] = {0, (ptrdiff_t)(c->T - 1) * ost, (ptrdiff_t)(c->K - 1) * osk,
                                (ptrdiff_t)(c->T - 1) * ost + (ptrdiff_t)(c->K - 1) * osk};
        lo = hi = 0;
        for (int i = 0; i < 4; i++) {
            if (corners[i] < lo)
                lo = corners[i];
            if (corners[i] > hi)
                hi = corners[i];
        }
        hi += (ptrdiff_t)c->tabs[0]->rb;
    }
    c->base = margin + (size_t)(-lo);
    c->len = c->base + (size_t)hi + margin;
    c->buf = (unsigned char *)tu_xmalloc(c->len);
}

static engram_store *cur(void)
{
    return cur_store ? store_2 : store_1;
}

static int do_lookup(const lk_call *c, size_t args_size)
{
    engram_table_id tids[64];
    for (size_t k = 0; k < c->K && k < 64; k++)
        tids[k] = c->tabs[k]->id[cur_store];
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.size = (uint32_t)args_size;
    a.flags = c->flags;
    a.num_tokens = c->T;
    a.num_cols = c->K;
    a.tables = tids;
    a.offsets = c->offsets;
    a.ids = c->ids;
    a.id_type = c->id_type;
    a.id_stride_t = c->ist;
    a.id_stride_k = c->isk;
    a.out = c->buf + c->base;
    a.out_stride_t = c->ost;
    a.out_stride_k = c->osk;
    return engram_lookup(cur(), &a);
}

/* Runs `c` and compares the whole buffer (margins included) with the
 * reference. */
static void check_call(lk_call *c, int line)
{
    int own = c->buf == NULL;
    if (own)
        alloc_out(c, 64);
    unsigned char *exp = (unsigned char *)tu_xmalloc(c->len);
    memset(c->buf, SENTINEL, c->len);
    memset(exp, SENTINEL, c->len);
    ref_gather(c, exp);
    int rc = do_lookup(c, sizeof(engram_lookup_args));
    if (rc != 0) {
        fprintf(stderr, "FAIL [%s] (called from line %d): lookup T=%zu K=%zu failed: %d (%s): %s\n",
                tu_current_case, line, c->T, c->K, rc, engram_strerror(rc), engram_errmsg());
        tu_fail_exit();
    }
    if (memcmp(exp, c->buf, c->len) != 0) {
        size_t i = 0;
        while (exp[i] == c->buf[i])
            i++;
        fprintf(stderr,
                "FAIL [%s] (called from line %d): output differs at buffer byte %zu "
                "(out offset %td): got 0x%02x, expected 0x%02x (T=%zu K=%zu rb=%u strides "
                "out %td,%td ids %td,%td)\n",
                tu_current_case, line, i, (ptrdiff_t)i - (ptrdiff_t)c->base, c->buf[i], exp[i],
                c->T, c->K, c->tabs[0]->rb, c->ost, c->osk, c->ist, c->isk);
        tu_fail_exit();
    }
    free(exp);
    if (own) {
        free(c->buf);
        c->buf = NULL;
    }
}

/* Runs `c`, expects `code`, and checks the buffer is untouched. */
static void check_fails(lk_call *c, int code, int line)
{
    int own = c->buf == NULL;
    if (own)
        alloc_out(c, 64);
    memset(c->buf, SENTINEL, c->len);
    int rc = do_lookup(c, sizeof(engram_lookup_args));
    if (rc != code) {
        fprintf(stderr,
                "FAIL [%s] (called from line %d): lookup returned %d (%s), expected %d (%s); "
                "errmsg: %s\n",
                tu_current_case, line, rc, engram_strerror(rc), code, engram_strerror(code),
                engram_errmsg());
        tu_fail_exit();
    }
    for (size_t i = 0; i < c->len; i++) {
        if (c->buf[i] != SENTINEL) {
            fprintf(stderr,
                    "FAIL [%s] (called from line %d): failed lookup wrote byte %td of the "
                    "output (0x%02x)\n",
                    tu_current_case, line, (ptrdiff_t)i - (ptrdiff_t)c->base, c->buf[i]);
            tu_fail_exit();
        }
    }
    if (own) {
        free(c->buf);
        c->buf = NULL;
    }
}

#define CHECK(c) check_call((c), __LINE__)
#define CHECK_FAILS(c, code) check_fails((c), (code), __LINE__)

/* ------------------------------------------------------------------------
 * The fixture: tables of several row sizes, in two stores on one
 * namespace (and the bound ones bound to both).
 */
#define NTAB 64
static lk_table tabs[NTAB];
static size_t ntabs;

static lk_table *add_table(const char *name, uint32_t seed, uint64_t nrows, uint32_t rb,
                           uint32_t pitch, int bound)
{
    ASSERT(ntabs < NTAB);
    lk_table *t = &tabs[ntabs++];
    t->name = name;
    t->seed = seed;
    t->nrows = nrows;
    t->rb = rb;
    engram_table_spec spec = {nrows, rb, pitch};
    if (bound) {
        t->bound_mem = tu_make_rows(seed, nrows, rb, pitch, 0xEE);
        ASSERT_OK(engram_bind(store_1, name, &spec, t->bound_mem));
        ASSERT_OK(engram_bind(store_2, name, &spec, t->bound_mem));
    } else {
        unsigned char *rows = tu_make_rows(seed, nrows, rb, 0, 0);
        ASSERT_OK(engram_populate(store_1, name, &spec, rows, 0));
        free(rows);
    }
    ASSERT_OK(engram_table_open(store_1, name, &t->id[0]));
    ASSERT_OK(engram_table_open(store_2, name, &t->id[1]));
    return t;
}

static lk_table *find(const char *name)
{
    for (size_t i = 0; i < ntabs; i++)
        if (strcmp(tabs[i].name, name) == 0)
            return &tabs[i];
    fprintf(stderr, "FAIL: no fixture table %s\n", name);
    tu_fail_exit();
    return NULL;
}

static char size_names[32][32];

static void setup(void)
{
    store_1 = tu_open("lk", 0, 1);
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    o.threads = 2;
    o.parallel_min_rows = 8;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "lk", &o, &store_2));

    add_table("a", 101, 17, 264, 0, 0);
    add_table("b", 102, 1000, 264, 0, 0);
    add_table("c", 103, 50, 264, 272, 0);
    add_table("bound264", 104, 77, 264, 280, 1);
    add_table("s8a", 105, 300, 8, 0, 0);
    add_table("s8b", 106, 5, 8, 16, 0);
    add_table("s8c", 107, 64, 8, 9, 1);
    add_table("s100a", 108, 123, 100, 0, 0);
    add_table("s100b", 109, 9, 100, 104, 1);
    add_table("engram:l1:h1", 110, 17, 264, 0, 0);

    static const uint32_t sizes[] = {1, 3, 8, 17, 64, 100, 264, 272, 1024, 4096};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        snprintf(size_names[2 * i], sizeof size_names[0], "rs%u", sizes[i]);
        snprintf(size_names[2 * i + 1], sizeof size_names[0], "rsb%u", sizes[i]);
        add_table(size_names[2 * i], 200 + (uint32_t)i, 300, sizes[i], 0, 0);
        add_table(size_names[2 * i + 1], 300 + (uint32_t)i, 301, sizes[i], sizes[i] + 5, 1);
    }
}

static void teardown(void)
{
    engram_store_close(store_1);
    engram_store_close(store_2);
    for (size_t i = 0; i < ntabs; i++)
        free(tabs[i].bound_mem);
}

/* Runs `fn` once with each store. */
#define BOTH_STORES(fn)                        \
    do {                                       \
        for (cur_store = 0; cur_store < 2; cur_store++) { \
            printf("   store_%d\n", cur_store + 1); \
            fn();                              \
        }                                      \
        cur_store = 0;                         \
    } while (0)

/* ------------------------------------------------------------------------ */

static void basic_body(void)
{
    /* Columns a, b, a: a table repeated across columns. */
    int64_t ids64[5][3] = {{0, 0, 16}, {16, 999, 0}, {3, 500, 3}, {7, 1, 8}, {0, 998, 0}};
    int32_t ids32[5][3];
    for (int t = 0; t < 5; t++)
        for (int k = 0; k < 3; k++)
            ids32[t][k] = (int32_t)ids64[t][k];
    lk_call c = {0};
    c.T = 5;
    c.K = 3;
    c.tabs[0] = find("a");
    c.tabs[1] = find("b");
    c.tabs[2] = find("a");
    c.id_type = ENGRAM_ID_INT64;
    c.ids = ids64;
    CHECK(&c);
    c.id_type = ENGRAM_ID_INT32;
    c.ids = ids32;
    CHECK(&c);

    /* One token, one column. */
    c.T = 1;
    c.K = 1;
    c.tabs[0] = find("c");
    int64_t one = 49;
    c.ids = &one;
    c.id_type = ENGRAM_ID_INT64;
    CHECK(&c);
}

static void test_basic(void)
{
    BOTH_STORES(basic_body);
}

static void offsets_body(void)
{
    /* Global ids: a at [1000, 1017), b at [2000, 3000), c at [0, 50). */
    int64_t offs[3] = {1000, 2000, 0};
    int64_t ids[4][3] = {{1000, 2000, 0}, {1016, 2999, 49}, {1005, 2500, 25}, {1000, 2001, 1}};
    lk_call c = {0};
    c.T = 4;
    c.K = 3;
    c.tabs[0] = find("a");
    c.tabs[1] = find("b");
    c.tabs[2] = find("c");
    c.offsets = offs;
    c.id_type = ENGRAM_ID_INT64;
    c.ids = ids;
    CHECK(&c);

    int32_t ids32[4][3];
    for (int t = 0; t < 4; t++)
        for (int k = 0; k < 3; k++)
            ids32[t][k] = (int32_t)ids[t][k];
    c.id_type = ENGRAM_ID_INT32;
    c.ids = ids32;
    CHECK(&c);

    /* Raw -1 is dead even though -1 - offset is some other number. */
    ids32[2][0] = -1;
    ids32[3][1] = -1;
    CHECK(&c);
    c.flags = ENGRAM_LOOKUP_ZERO_DEAD;
    CHECK(&c);
    c.flags = 0;

    /* Below the offset, at offset + num_rows: errors. */
    ids32[2][0] = 999;
    CHECK_FAILS(&c, ENGRAM_EBADID);
    ids32[2][0] = 1017;
    CHECK_FAILS(&c, ENGRAM_EBADID);
    ids32[2][0] = 1016;
    ids32[3][1] = 3000;
    CHECK_FAILS(&c, ENGRAM_EBADID);
    ids32[3][1] = 1999;
    CHECK_FAILS(&c, ENGRAM_EBADID);
    ids32[3][1] = 0; /* a local id where a global one is expected */
    CHECK_FAILS(&c, ENGRAM_EBADID);
    ids32[3][1] = 2000;
    CHECK(&c);

    /* A large offset with int64 ids. */
    int64_t big_off[1] = {(int64_t)1 << 40};
    int64_t big_ids[3] = {((int64_t)1 << 40) + 16, (int64_t)1 << 40, ((int64_t)1 << 40) + 17};
    lk_call d = {0};
    d.T = 2;
    d.K = 1;
    d.tabs[0] = find("a");
    d.offsets = big_off;
    d.id_type = ENGRAM_ID_INT64;
    d.ids = big_ids;
    CHECK(&d);
    d.T = 3;
    CHECK_FAILS(&d, ENGRAM_EBADID);
}

static void test_offsets(void)
{
    BOTH_STORES(offsets_body);
}

/* The same ids in several output layouts. */
static void layouts_body(void)
{
    enum { T = 6, K = 4 };
    const uint32_t R = 264;
    int64_t ids[T][K];
    uint64_t rng = 5;
    lk_call c = {0};
    c.T = T;
    c.K = K;
    c.tabs[0] = find("b");
    c.tabs[1] = find("a");
    c.tabs[2] = find("bound264");
    c.tabs[3] = find("b");
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            ids[t][k] = (int64_t)tu_rand_below(&rng, c.tabs[k]->nrows);
    c.id_type = ENGRAM_ID_INT64;
    c.ids = ids;

    /* Contiguous [T, K, R], implicitly and explicitly. */
    CHECK(&c);
    c.ost = K * R;
    c.osk = R;
    CHECK(&c);

    /* Head-major [K, T, R]. */
    c.ost = R;
    c.osk = T * R;
    CHECK(&c);

    /* Padded token-major: 13 bytes after each row, 7 after each token. */
    c.osk = R + 13;
    c.ost = K * (R + 13) + 7;
    CHECK(&c);

    /* Padded head-major. */
    c.ost = R + 3;
    c.osk = T * (R + 3) + 100;
    CHECK(&c);

    /* Unaligned output base and strides. */
    c.ost = K * R + 1;
    c.osk = R;
    alloc_out(&c, 64);
    c.base += 1;
    CHECK(&c);
    free(c.buf);
    c.buf = NULL;

    /* Negative strides (a reversed view, as numpy/DLPack may hand over). */
    c.ost = -(ptrdiff_t)(K * R);
    c.osk = R;
    CHECK(&c);
    c.ost = R;
    c.osk = -(ptrdiff_t)(T * R);
    CHECK(&c);

    /* Only one token: the token stride does not matter (0 is fine since no
     * two rows overlap). */
    c.T = 1;
    c.ost = 0;
    c.osk = R;
    CHECK(&c);
    /* Only one column: likewise. */
    c.T = T;
    c.K = 1;
    c.ost = R;
    c.osk = 0;
    CHECK(&c);
}

static void test_layouts(void)
{
    BOTH_STORES(layouts_body);
}

static void id_strides_body(void)
{
    enum { T = 5, K = 3 };
    lk_call c = {0};
    c.T = T;
    c.K = K;
    c.tabs[0] = find("s100a");
    c.tabs[1] = find("s100b");
    c.tabs[2] = find("s100a");
    uint64_t rng = 9;
    int64_t logical[T][K];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            logical[t][k] = (int64_t)tu_rand_below(&rng, c.tabs[k]->nrows);

    /* A transposed [K, T] id array. */
    int64_t tr[K][T];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            tr[k][t] = logical[t][k];
    c.id_type = ENGRAM_ID_INT64;
    c.ids = tr;
    c.ist = 1;
    c.isk = T;
    CHECK(&c);

    /* Rows of ids with padding between them (id_stride_t = K + 2). */
    int32_t padded[T][K + 2];
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < K; k++)
            padded[t][k] = (int32_t)logical[t][k];
        padded[t][K] = 123456; /* out of range for every table: never read */
        padded[t][K + 1] = -7;
    }
    c.id_type = ENGRAM_ID_INT32;
    c.ids = padded;
    c.ist = K + 2;
    c.isk = 1;
    CHECK(&c);

    /* Every other element of an interleaved array. */
    int64_t inter[T][K][2];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            inter[t][k][0] = logical[t][k];
            inter[t][k][1] = 999999;
        }
    c.id_type = ENGRAM_ID_INT64;
    c.ids = inter;
    c.ist = 2 * K;
    c.isk = 2;
    CHECK(&c);

    /* Negative id strides: tokens in reverse. */
    int64_t rev[T][K];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            rev[T - 1 - t][k] = logical[t][k];
    c.ids = &rev[T - 1][0];
    c.ist = -K;
    c.isk = 1;
    CHECK(&c);

    /* A bad id in a padded id array is reported at its logical position. */
    padded[3][2] = 9;
    padded[3][1] = 9; /* s100b has 9 rows */
    c.id_type = ENGRAM_ID_INT32;
    c.ids = padded;
    c.ist = K + 2;
    c.isk = 1;
    CHECK_FAILS(&c, ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "ids[3][1]");
    ASSERT_CONTAINS(engram_errmsg(), "s100b");
}

static void test_id_strides(void)
{
    BOTH_STORES(id_strides_body);
}

static void dead_body(void)
{
    int32_t ids32[3][2] = {{-1, 4}, {0, -1}, {-1, -1}};
    int64_t ids64[3][2] = {{-1, 4}, {0, -1}, {-1, -1}};
    lk_call c = {0};
    c.T = 3;
    c.K = 2;
    c.tabs[0] = find("s8a");
    c.tabs[1] = find("s8b");
    c.id_type = ENGRAM_ID_INT32;
    c.ids = ids32;
    CHECK(&c); /* dead rows keep the sentinel */
    c.flags = ENGRAM_LOOKUP_ZERO_DEAD;
    CHECK(&c); /* dead rows are zero */
    c.id_type = ENGRAM_ID_INT64;
    c.ids = ids64;
    CHECK(&c);
    c.flags = 0;
    CHECK(&c);

    /* Explicitly: the kept row is byte for byte what was there. */
    unsigned char out[3][2][8];
    for (int i = 0; i < 48; i++)
        ((unsigned char *)out)[i] = (unsigned char)(i * 7 + 1);
    unsigned char before[48];
    memcpy(before, out, 48);
    engram_table_id tids[2] = {c.tabs[0]->id[cur_store], c.tabs[1]->id[cur_store]};
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.num_tokens = 3;
    a.num_cols = 2;
    a.tables = tids;
    a.ids = ids64;
    a.id_type = ENGRAM_ID_INT64;
    a.out = out;
    ASSERT_OK(engram_lookup(cur(), &a));
    ASSERT_MEM_EQ(out[0][0], before + 0, 8);
    ASSERT_ROW(out[0][1], 106, 4, 8);
    ASSERT_ROW(out[1][0], 105, 0, 8);
    ASSERT_MEM_EQ(out[1][1], before + 24, 8);
    ASSERT_MEM_EQ(out[2][0], before + 32, 8);
    ASSERT_MEM_EQ(out[2][1], before + 40, 8);
    a.flags = ENGRAM_LOOKUP_ZERO_DEAD;
    ASSERT_OK(engram_lookup(cur(), &a));
    ASSERT_ALL_BYTES(out[0][0], 0, 8);
    ASSERT_ALL_BYTES(out[1][1], 0, 8);
    ASSERT_ALL_BYTES(out[2][0], 0, 16);

    /* All dead. */
    int64_t all_dead[4] = {-1, -1, -1, -1};
    c.T = 4;
    c.K = 1;
    c.ids = all_dead;
    CHECK(&c);
    c.flags = ENGRAM_LOOKUP_ZERO_DEAD;
    CHECK(&c);
}

static void test_dead(void)
{
    BOTH_STORES(dead_body);
}

/* A bad id at [bt][bk]: EBADID, output untouched, and the message names
 * the position, the value and the table. */
static void bad_id_case(lk_call *c, int64_t *ids64, int32_t *ids32, size_t bt, size_t bk,
                        int64_t value, int line)
{
    int64_t saved64 = ids64 ? ids64[bt * c->K + bk] : 0;
    int32_t saved32 = ids32 ? ids32[bt * c->K + bk] : 0;
    if (c->id_type == ENGRAM_ID_INT64)
        ids64[bt * c->K + bk] = value;
    else
        ids32[bt * c->K + bk] = (int32_t)value;
    check_fails(c, ENGRAM_EBADID, line);
    char pos[64], val[32];
    snprintf(pos, sizeof pos, "ids[%zu][%zu]", bt, bk);
    snprintf(val, sizeof val, "%lld", (long long)value);
    const char *m = engram_errmsg();
    if (strstr(m, pos) == NULL || strstr(m, val) == NULL || strstr(m, c->tabs[bk]->name) == NULL) {
        fprintf(stderr,
                "FAIL [%s] (line %d): message should name %s, %s and table '%s': \"%s\"\n",
                tu_current_case, line, pos, val, c->tabs[bk]->name, m);
        tu_fail_exit();
    }
    /* The same id as numbers. */
    {
        engram_bad_id b = ENGRAM_BAD_ID_INIT;
        int64_t v = c->id_type == ENGRAM_ID_INT64 ? value : (int64_t)(int32_t)value;
        ASSERT_OK(engram_last_bad_id(&b));
        ASSERT_EQ_U64(b.token, bt);
        ASSERT_EQ_U64(b.col, bk);
        ASSERT_EQ(b.id, v);
        ASSERT_EQ(b.offset, c->offsets ? c->offsets[bk] : 0);
        ASSERT_EQ_U64(b.num_rows, c->tabs[bk]->nrows);
        ASSERT_EQ(b.table, c->tabs[bk]->id[cur_store]);
    }
    if (c->id_type == ENGRAM_ID_INT64)
        ids64[bt * c->K + bk] = saved64;
    else
        ids32[bt * c->K + bk] = saved32;
}

static void bad_ids_body(void)
{
    enum { T = 8, K = 3 };
    int64_t ids64[T * K];
    int32_t ids32[T * K];
    lk_call c = {0};
    c.T = T;
    c.K = K;
    c.tabs[0] = find("a");
    c.tabs[1] = find("engram:l1:h1");
    c.tabs[2] = find("b");
    uint64_t rng = 1234;
    for (int i = 0; i < T * K; i++) {
        ids64[i] = (int64_t)tu_rand_below(&rng, c.tabs[i % K]->nrows);
        ids32[i] = (int32_t)ids64[i];
    }
    c.id_type = ENGRAM_ID_INT64;
    c.ids = ids64;
    CHECK(&c);

    /* The doc's own example, then the boundaries and extremes. */
    bad_id_case(&c, ids64, NULL, 3, 1, 912, __LINE__);
    bad_id_case(&c, ids64, NULL, 2, 1, 17, __LINE__);
    bad_id_case(&c, ids64, NULL, 0, 0, 17, __LINE__);
    bad_id_case(&c, ids64, NULL, 5, 2, 1000, __LINE__);
    bad_id_case(&c, ids64, NULL, 5, 2, -2, __LINE__);
    bad_id_case(&c, ids64, NULL, 1, 0, INT64_MIN, __LINE__);
    bad_id_case(&c, ids64, NULL, 1, 0, INT64_MAX, __LINE__);
    bad_id_case(&c, ids64, NULL, 1, 0, ((int64_t)1 << 32) + 3, __LINE__); /* no truncation */
    bad_id_case(&c, ids64, NULL, 1, 0, -((int64_t)1 << 32) - 1, __LINE__);
    /* The very last element: every earlier row must still be untouched. */
    bad_id_case(&c, ids64, NULL, T - 1, K - 1, 1000, __LINE__);
    bad_id_case(&c, ids64, NULL, 0, 0, -100, __LINE__);

    c.id_type = ENGRAM_ID_INT32;
    c.ids = ids32;
    CHECK(&c);
    bad_id_case(&c, NULL, ids32, 3, 1, 912, __LINE__);
    bad_id_case(&c, NULL, ids32, T - 1, K - 1, 1000, __LINE__);
    bad_id_case(&c, NULL, ids32, 4, 2, INT32_MIN, __LINE__);
    bad_id_case(&c, NULL, ids32, 4, 2, INT32_MAX, __LINE__);
    bad_id_case(&c, NULL, ids32, 4, 0, -2, __LINE__);

    /* Two bad ids, far apart (in different parts of a split plan): the
     * message names the first one in the batch. */
    ids32[6 * K + 2] = 7777;
    bad_id_case(&c, NULL, ids32, 1, 0, 4444, __LINE__);
    if (strstr(engram_errmsg(), "7777") != NULL) {
        fprintf(stderr, "FAIL [%s]: the first bad id should be reported: \"%s\"\n",
                tu_current_case, engram_errmsg());
        tu_fail_exit();
    }
    ids32[6 * K + 2] = 0;

    /* With ZERO_DEAD and dead ids before the bad one: still untouched. */
    c.flags = ENGRAM_LOOKUP_ZERO_DEAD;
    ids32[0] = -1;
    ids32[1] = -1;
    bad_id_case(&c, NULL, ids32, T - 1, 2, 5000, __LINE__);
    c.flags = 0;
    ids32[0] = 0;
    ids32[1] = 0;
    CHECK(&c);

    /* With an offset: the record carries it, and the id as passed. */
    {
        int64_t offs[K] = {0, 5, 0};
        c.id_type = ENGRAM_ID_INT64;
        c.ids = ids64;
        c.offsets = offs;
        for (int t = 0; t < T; t++)
            ids64[t * K + 1] += 5;
        CHECK(&c);
        bad_id_case(&c, ids64, NULL, 2, 1, 4, __LINE__); /* 4 - 5 = -1: below the offset */
        for (int t = 0; t < T; t++)
            ids64[t * K + 1] -= 5;
        c.offsets = NULL;
    }

    /* Any later failure replaces the record; bad arguments are refused. */
    {
        engram_bad_id b = ENGRAM_BAD_ID_INIT;
        c.id_type = 3;
        CHECK_FAILS(&c, ENGRAM_ELAYOUT);
        ASSERT_ERR(engram_last_bad_id(&b), -ENOENT);
        ASSERT_ERR(engram_last_bad_id(NULL), -EINVAL);
        b.size = 8;
        ASSERT_ERR(engram_last_bad_id(&b), -EINVAL);
        c.id_type = ENGRAM_ID_INT64;
    }
}

static void test_bad_ids(void)
{
    BOTH_STORES(bad_ids_body);
}

/* ------------------------------------------------------------------------
 * Ids and offsets anywhere in int64: id - offset is the exact difference
 * of two integers, never taken modulo 2^64.  An id far below its offset
 * (id INT64_MIN, offset INT64_MAX: -2^64 + 1) is outside the table, even
 * though its difference wraps to 1 in 64 bits.
 */
__extension__ typedef __int128 lk_i128;

#define ROW_DEAD (-1)
#define ROW_BAD (-2)

/* The reference rule, in 128 bits where every difference of two int64
 * fits: the row of `id`, ROW_DEAD, or ROW_BAD. */
static int64_t ref_row(int64_t id, int64_t off, uint64_t nrows)
{
    lk_i128 d;
    if (id == ENGRAM_DEAD_ID)
        return ROW_DEAD;
    d = (lk_i128)id - (lk_i128)off;
    return d >= 0 && d < (lk_i128)nrows ? (int64_t)d : ROW_BAD;
}

/* Looks up `n` ids of `id_type` (as int64 in ids[]) in one column of
 * `table` with offset `off`: the output must be the reference's, or the
 * lookup must fail with ENGRAM_EBADID at the first bad id with the output
 * untouched, its record naming that id, its offset and the table's rows. */
static void offset_ids(const char *table, int64_t off, int id_type, const int64_t *ids, size_t n,
                       int line)
{
    lk_call c = {0};
    int32_t ids32[64];
    size_t first_bad = SIZE_MAX;
    ASSERT(n >= 1 && n <= 64);
    c.T = n;
    c.K = 1;
    c.tabs[0] = find(table);
    c.offsets = &off;
    c.id_type = id_type;
    c.ids = ids;
    for (size_t i = 0; i < n; i++) {
        if (id_type == ENGRAM_ID_INT32) {
            ids32[i] = (int32_t)ids[i];
            ASSERT(ids32[i] == ids[i]); /* a test bug otherwise */
        }
        if (first_bad == SIZE_MAX && ref_row(ids[i], off, c.tabs[0]->nrows) == ROW_BAD)
            first_bad = i;
    }
    if (id_type == ENGRAM_ID_INT32)
        c.ids = ids32;
    if (first_bad == SIZE_MAX) {
        check_call(&c, line);
        return;
    }
    check_fails(&c, ENGRAM_EBADID, line);
    engram_bad_id b = ENGRAM_BAD_ID_INIT;
    ASSERT_OK(engram_last_bad_id(&b));
    if (b.token != first_bad || b.col != 0 || b.id != ids[first_bad] || b.offset != off ||
        b.num_rows != c.tabs[0]->nrows) {
        fprintf(stderr,
                "FAIL [%s] (called from line %d): bad id record: token %llu id %lld offset %lld "
                "rows %llu, expected token %zu id %lld offset %lld rows %llu\n",
                tu_current_case, line, (unsigned long long)b.token, (long long)b.id,
                (long long)b.offset, (unsigned long long)b.num_rows, first_bad,
                (long long)ids[first_bad], (long long)off, (unsigned long long)c.tabs[0]->nrows);
        tu_fail_exit();
    }
}

/* One id with an outcome stated by hand (a row, ROW_DEAD or ROW_BAD),
 * which the reference must agree with, then looked up. */
static void offset_case(const char *table, int64_t off, int id_type, int64_t id, int64_t want,
                        int line)
{
    int64_t ref = ref_row(id, off, find(table)->nrows);
    if (ref != want) {
        fprintf(stderr, "FAIL [%s] (line %d): the case says %lld, the reference %lld\n",
                tu_current_case, line, (long long)want, (long long)ref);
        tu_fail_exit();
    }
    offset_ids(table, off, id_type, &id, 1, line);
}

#define OFF64(off, id, want) offset_case("a", (off), ENGRAM_ID_INT64, (id), (want), __LINE__)
#define OFF32(off, id, want) offset_case("a", (off), ENGRAM_ID_INT32, (id), (want), __LINE__)

static void offset_extremes_body(void)
{
    /* Table a has 17 rows.  The offset INT64_MAX: only INT64_MAX is an
     * id; INT64_MIN + r is -2^64 + 1 + r below it, which wraps to row
     * 1 + r in 64 bits. */
    OFF64(INT64_MAX, INT64_MAX, 0);
    OFF64(INT64_MAX, INT64_MAX - 1, ROW_BAD);
    OFF64(INT64_MAX, INT64_MIN, ROW_BAD);
    OFF64(INT64_MAX, INT64_MIN + 1, ROW_BAD);
    OFF64(INT64_MAX, INT64_MIN + 15, ROW_BAD);
    OFF64(INT64_MAX, INT64_MIN + 16, ROW_BAD);
    OFF64(INT64_MAX, 0, ROW_BAD);
    OFF64(INT64_MAX, -1, ROW_DEAD);
    OFF64(INT64_MAX, -2, ROW_BAD);
    /* A table ending exactly at INT64_MAX, and one row short of it. */
    OFF64(INT64_MAX - 16, INT64_MAX, 16);
    OFF64(INT64_MAX - 16, INT64_MAX - 16, 0);
    OFF64(INT64_MAX - 16, INT64_MAX - 17, ROW_BAD);
    OFF64(INT64_MAX - 16, INT64_MIN, ROW_BAD);
    OFF64(INT64_MAX - 17, INT64_MAX, ROW_BAD); /* id - offset = num_rows */
    OFF64(INT64_MAX - 17, INT64_MAX - 1, 16);  /* num_rows - 1 */
    OFF64(INT64_MAX - 5, INT64_MAX, 5);
    OFF64(INT64_MAX - 5, INT64_MIN, ROW_BAD);      /* wraps to row 6 */
    OFF64(INT64_MAX - 5, INT64_MIN + 10, ROW_BAD); /* wraps to row 16 */
    OFF64(INT64_MAX - 5, INT64_MIN + 11, ROW_BAD);
    /* The offset INT64_MIN: ids from INT64_MIN up. */
    OFF64(INT64_MIN, INT64_MIN, 0);
    OFF64(INT64_MIN, INT64_MIN + 16, 16);
    OFF64(INT64_MIN, INT64_MIN + 17, ROW_BAD);
    OFF64(INT64_MIN, INT64_MAX, ROW_BAD);
    OFF64(INT64_MIN, 0, ROW_BAD);
    OFF64(INT64_MIN, -1, ROW_DEAD);
    OFF64(INT64_MIN, -2, ROW_BAD);
    OFF64(INT64_MIN + 1, INT64_MIN, ROW_BAD);
    OFF64(INT64_MIN + 1, INT64_MAX, ROW_BAD);
    /* INT64_MAX with negative offsets: above the table by 2^63 and more. */
    OFF64(-1, INT64_MAX, ROW_BAD);
    OFF64(-17, INT64_MAX, ROW_BAD);
    OFF64(INT64_MIN + 16, INT64_MAX, ROW_BAD);
    /* Negative offsets: -1 stays dead, even where it would be a row. */
    OFF64(-1, -1, ROW_DEAD);
    OFF64(-1, 0, 1);
    OFF64(-1, 15, 16);
    OFF64(-1, 16, ROW_BAD);
    OFF64(-17, -16, 1);
    OFF64(-17, -17, 0);
    OFF64(-17, -18, ROW_BAD);
    OFF64(1, INT64_MIN, ROW_BAD);
    OFF64(0, INT64_MIN, ROW_BAD);
    OFF64(0, INT64_MAX, ROW_BAD);
    /* id - offset = num_rows - 1 and num_rows at small offsets too. */
    OFF64(1000, 1016, 16);
    OFF64(1000, 1017, ROW_BAD);
    OFF64(1000, 999, ROW_BAD);

    /* int32 ids with large offsets: read as int64 first, then the same
     * rule. */
    OFF32(INT64_MAX, INT32_MIN, ROW_BAD);
    OFF32(INT64_MAX, INT32_MAX, ROW_BAD);
    OFF32(INT64_MAX, 0, ROW_BAD);
    OFF32(INT64_MAX, -1, ROW_DEAD);
    OFF32(INT64_MIN, INT32_MIN, ROW_BAD);
    OFF32(INT64_MIN, INT32_MAX, ROW_BAD);
    OFF32((int64_t)1 << 40, 16, ROW_BAD);
    OFF32(-((int64_t)1 << 40), 16, ROW_BAD);
    OFF32((int64_t)INT32_MIN, INT32_MIN, 0);
    OFF32((int64_t)INT32_MIN, INT32_MIN + 16, 16);
    OFF32((int64_t)INT32_MIN, INT32_MIN + 17, ROW_BAD);
    OFF32((int64_t)INT32_MIN - 1, INT32_MIN, 1);
    OFF32((int64_t)INT32_MAX - 16, INT32_MAX, 16);
    OFF32((int64_t)INT32_MAX - 17, INT32_MAX, ROW_BAD);
    OFF32((int64_t)INT32_MAX + 1, INT32_MAX, ROW_BAD);

    /* In a batch long enough to be split across the pool (store_2): the
     * first bad id is reported, and nothing is written. */
    {
        int64_t ids[40];
        for (int i = 0; i < 40; i++)
            ids[i] = INT64_MAX - i % 17;
        offset_ids("a", INT64_MAX - 16, ENGRAM_ID_INT64, ids, 40, __LINE__);
        ids[29] = INT64_MIN + 3;
        ids[33] = INT64_MIN;
        offset_ids("a", INT64_MAX - 16, ENGRAM_ID_INT64, ids, 40, __LINE__);
    }
}

static void test_offset_extremes(void)
{
    BOTH_STORES(offset_extremes_body);
}

/* A value within `spread` of `base`, wrapping around int64. */
static int64_t near(uint64_t *rng, int64_t base, uint64_t spread)
{
    return (int64_t)((uint64_t)base + tu_rand_below(rng, 2 * spread + 1) - spread);
}

/* An offset near one of the places where id - offset leaves int64. */
static int64_t fuzz_offset(uint64_t *rng)
{
    static const int64_t bases[] = {INT64_MIN, INT64_MAX, 0, -1, INT32_MIN, INT32_MAX,
                                    (int64_t)1 << 62, -((int64_t)1 << 62)};
    uint64_t pick = tu_rand_below(rng, sizeof bases / sizeof bases[0] + 1);
    if (pick == sizeof bases / sizeof bases[0])
        return (int64_t)tu_rand(rng);
    return near(rng, bases[pick], 40);
}

/* An id for offset `off` and a table of `nrows` rows, near the places
 * where the answer changes: the table's ends (and, 2^64 away, the ids
 * whose difference wraps onto a row), halfway round, the ends of int64
 * and of int32, -1, or anywhere. */
static int64_t fuzz_id(uint64_t *rng, int64_t off, uint64_t nrows)
{
    switch (tu_rand_below(rng, 8)) {
    case 0:
    case 1:
    case 2: /* off + r modulo 2^64 for r around [0, nrows]: a row, or a wrap */
        return (int64_t)((uint64_t)off + tu_rand_below(rng, nrows + 8) - 4);
    case 3: /* halfway round from the table */
        return near(rng, (int64_t)((uint64_t)off + ((uint64_t)1 << 63)), nrows + 4);
    case 4:
        return near(rng, tu_rand_below(rng, 2) ? INT64_MIN : INT64_MAX, nrows + 4);
    case 5:
        return near(rng, tu_rand_below(rng, 2) ? INT32_MIN : INT32_MAX, nrows + 4);
    case 6:
        return tu_rand_below(rng, 2) ? -1 : near(rng, 0, nrows + 4);
    default:
        return (int64_t)tu_rand(rng);
    }
}

/* Random ids and offsets clustered at the boundaries, against the 128-bit
 * reference (offset_ids()): single ids and batches of one offset, int64
 * ids and, where they fit, int32 ones. */
static void offset_fuzz_body(void)
{
    static const char *const names[] = {"a", "s8b", "b", "rs1"};
    uint64_t rng = 0xB0DA7 + (uint64_t)cur_store;
    uint64_t rows = 0, dead = 0, bad = 0, wraps = 0;
    for (int iter = 0; iter < 20000; iter++) {
        const lk_table *tb = find(names[tu_rand_below(&rng, 4)]);
        int64_t off = fuzz_offset(&rng), ids[64];
        size_t n = tu_rand_below(&rng, 4) == 0 ? 1 + (size_t)tu_rand_below(&rng, 64) : 1;
        int all_good = n > 1 && tu_rand_below(&rng, 2), fits32 = 1;
        for (size_t i = 0; i < n; i++) {
            int64_t id = fuzz_id(&rng, off, tb->nrows), r;
            while (all_good && ref_row(id, off, tb->nrows) == ROW_BAD)
                id = fuzz_id(&rng, off, tb->nrows);
            r = ref_row(id, off, tb->nrows);
            rows += r >= 0;
            dead += r == ROW_DEAD;
            bad += r == ROW_BAD;
            /* The ids a 64-bit modular check would take for a row. */
            wraps += r == ROW_BAD && (uint64_t)id - (uint64_t)off < tb->nrows;
            fits32 &= (int64_t)(int32_t)id == id;
            ids[i] = id;
        }
        offset_ids(tb->name, off,
                   fits32 && tu_rand_below(&rng, 2) ? ENGRAM_ID_INT32 : ENGRAM_ID_INT64, ids, n,
                   __LINE__);
    }
    printf("   %llu rows, %llu dead, %llu bad (%llu of them wrapping onto a row)\n",
           (unsigned long long)rows, (unsigned long long)dead, (unsigned long long)bad,
           (unsigned long long)wraps);
    /* The generator reaches every outcome, the wrapping ids included. */
    ASSERT_GE(rows, 1000);
    ASSERT_GE(dead, 100);
    ASSERT_GE(bad, 1000);
    ASSERT_GE(wraps, 100);
}

static void test_offset_fuzz(void)
{
    BOTH_STORES(offset_fuzz_body);
}

static void layout_errors_body(void)
{
    enum { T = 4, K = 3 };
    const uint32_t R = 264;
    int64_t ids[T][K] = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}};
    lk_call c = {0};
    c.T = T;
    c.K = K;
    c.tabs[0] = find("a");
    c.tabs[1] = find("b");
    c.tabs[2] = find("c");
    c.id_type = ENGRAM_ID_INT64;
    c.ids = ids;
    CHECK(&c);

    /* Tables of different row sizes in one lookup. */
    c.tabs[1] = find("s100a");
    CHECK_FAILS(&c, ENGRAM_ELAYOUT);
    c.tabs[1] = find("s8c");
    CHECK_FAILS(&c, ENGRAM_ELAYOUT);
    c.tabs[1] = find("rs272"); /* equal to another table's pitch, not its row_bytes */
    CHECK_FAILS(&c, ENGRAM_ELAYOUT);
    c.tabs[1] = find("b");

    /* Overlapping output rows.  Each buffer is sized for the rows as the
     * strides place them, so a library that wrote anyway stays in bounds
     * and is caught by the untouched-output check. */
    struct {
        ptrdiff_t ost, osk;
    } overlap[] = {
        {K * R, R - 1},     /* columns overlap by one byte */
        {K * R, 1},         /* columns nearly on top of each other */
        {K * R, 0},         /* every column on one row */
        {0, R},             /* every token on one row */
        {(K - 1) * R, R},   /* token t's last column is token t+1's first */
        {K * R - 1, R},     /* tokens overlap by one byte */
        {R, (T - 1) * R},   /* head-major with a column one token short */
        {R, T * R - 1},     /* head-major, one byte short */
        {-(ptrdiff_t)R, R}, /* negative strides that collide */
    };
    for (size_t i = 0; i < sizeof overlap / sizeof overlap[0]; i++) {
        lk_call o = c;
        o.ost = overlap[i].ost;
        o.osk = overlap[i].osk;
        check_fails(&o, ENGRAM_ELAYOUT, __LINE__);
    }
    /* T = 3, K = 4 with strides (3R, 2R): (t=2,k=0) = 6R = (t=0,k=3). */
    {
        int64_t ids4[3][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
        lk_call o = {0};
        o.T = 3;
        o.K = 4;
        for (int k = 0; k < 4; k++)
            o.tabs[k] = find("b");
        o.id_type = ENGRAM_ID_INT64;
        o.ids = ids4;
        o.ost = 3 * R;
        o.osk = 2 * R;
        CHECK_FAILS(&o, ENGRAM_ELAYOUT);
    }

    /* Bad id types. */
    c.id_type = 0;
    CHECK_FAILS(&c, ENGRAM_ELAYOUT);
    c.id_type = 3;
    CHECK_FAILS(&c, ENGRAM_ELAYOUT);
    c.id_type = -1;
    CHECK_FAILS(&c, ENGRAM_ELAYOUT);
    c.id_type = ENGRAM_ID_INT64;
    CHECK(&c);
}

static void test_layout_errors(void)
{
    BOTH_STORES(layout_errors_body);
}

static void bad_args_body(void)
{
    int64_t ids[2] = {0, 1};
    unsigned char out[2 * 264];
    engram_table_id tid = find("a")->id[cur_store];
    engram_store *st = cur();
    int rc;

    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.num_tokens = 2;
    a.num_cols = 1;
    a.tables = &tid;
    a.ids = ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = out;
    ASSERT_OK(engram_lookup(st, &a));

    /* NULL arrays with work to do. */
    memset(out, SENTINEL, sizeof out);
    engram_lookup_args b = a;
    b.tables = NULL;
    ASSERT_FAILS(engram_lookup(st, &b), rc);
    b = a;
    b.ids = NULL;
    ASSERT_FAILS(engram_lookup(st, &b), rc);
    b = a;
    b.out = NULL;
    ASSERT_FAILS(engram_lookup(st, &b), rc);
    ASSERT_ALL_BYTES(out, SENTINEL, sizeof out);

    /* Unknown flags are refused, as the CUDA lookup refuses them, before
     * anything is written: a flag this library does not know may ask for
     * something it would not do. */
    for (unsigned bit = 1; bit < 32; bit++) {
        b = a;
        b.flags = 1u << bit;
        ASSERT_ERR(engram_lookup(st, &b), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "unknown lookup flags");
        b.flags |= ENGRAM_LOOKUP_ZERO_DEAD;
        ASSERT_ERR(engram_lookup(st, &b), -EINVAL);
    }
    ASSERT_ALL_BYTES(out, SENTINEL, sizeof out);
    b = a;
    b.flags = ENGRAM_LOOKUP_ZERO_DEAD;
    ASSERT_OK(engram_lookup(st, &b));
    memset(out, SENTINEL, sizeof out);

    /* Nothing to do: fine even with NULL pointers and a bad id type. */
    engram_lookup_args z = ENGRAM_LOOKUP_ARGS_INIT;
    z.num_tokens = 0;
    z.num_cols = 5;
    ASSERT_OK(engram_lookup(st, &z));
    z.num_tokens = 7;
    z.num_cols = 0;
    ASSERT_OK(engram_lookup(st, &z));
    z.num_tokens = 0;
    ASSERT_OK(engram_lookup(st, &z));
    /* T == 0 with real arrays writes nothing. */
    b = a;
    b.num_tokens = 0;
    ASSERT_OK(engram_lookup(st, &b));
    ASSERT_ALL_BYTES(out, SENTINEL, sizeof out);

    /* Table ids that were never issued. */
    engram_table_id bogus[] = {12345, 65535, 65536, UINT32_MAX, UINT32_MAX - 1};
    for (size_t i = 0; i < sizeof bogus / sizeof bogus[0]; i++) {
        b = a;
        b.tables = &bogus[i];
        ASSERT_FAILS(engram_lookup(st, &b), rc);
        ASSERT(engram_errmsg()[0] != '\0');
    }
    /* A bad table in a later column. */
    engram_table_id mixed[2] = {tid, 40000};
    int64_t ids2[2][2] = {{0, 0}, {1, 1}};
    b = a;
    b.num_cols = 2;
    b.tables = mixed;
    b.ids = ids2;
    ASSERT_FAILS(engram_lookup(st, &b), rc);
    ASSERT_ALL_BYTES(out, SENTINEL, sizeof out);

    /* A wrong size field. */
    b = a;
    b.size = 0;
    ASSERT_ERR(engram_lookup(st, &b), -EINVAL);
    b.size = 4;
    ASSERT_ERR(engram_lookup(st, &b), -EINVAL);
    b.size = sizeof b - 1;
    ASSERT_ERR(engram_lookup(st, &b), -EINVAL);
    ASSERT_ALL_BYTES(out, SENTINEL, sizeof out);
    ASSERT_ERR(engram_lookup(st, NULL), -EINVAL);

    /* The caller's row size, when given, must be the tables' row_bytes
     * ('a' has 264): a smaller output row is refused before any write. */
    b = a;
    b.row_bytes = 263;
    ASSERT_ERR(engram_lookup(st, &b), ENGRAM_ELAYOUT);
    ASSERT(strstr(engram_errmsg(), "263") != NULL);
    b.row_bytes = 265;
    ASSERT_ERR(engram_lookup(st, &b), ENGRAM_ELAYOUT);
    ASSERT_ALL_BYTES(out, SENTINEL, sizeof out);
    b.row_bytes = 264;
    ASSERT_OK(engram_lookup(st, &b));

    /* Batches whose sizes wrap: 2^61 tokens over broadcast ids (one id
     * read for every token) passed the T x K check, and the plan's 8
     * bytes a row wrapped to a tiny buffer the planner then overran.
     * Refused before anything is allocated or written. */
    {
        static const size_t huge[] = {(size_t)1 << 61, (size_t)1 << 62, SIZE_MAX / 2,
                                      ((size_t)1 << 60) + 1};
        int64_t one = 0;
        memset(out, SENTINEL, sizeof out);
        for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
            b = a;
            b.num_tokens = huge[i];
            b.num_cols = 1;
            b.ids = &one;
            b.id_stride_t = 0;
            b.id_stride_k = 1;
            b.out_stride_t = 264;
            b.out_stride_k = 264;
            ASSERT_ERR(engram_lookup(st, &b), ENGRAM_ELAYOUT);
            ASSERT_CONTAINS(engram_errmsg(), "does not fit");
            ASSERT_ALL_BYTES(out, SENTINEL, sizeof out);
        }
    }
}

static void test_bad_args(void)
{
    BOTH_STORES(bad_args_body);
}

/* Every row size, with file tables and bound tables at an odd pitch. */
static void row_sizes_body(void)
{
    static const uint32_t sizes[] = {1, 3, 8, 17, 64, 100, 264, 272, 1024, 4096};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        enum { T = 300 };
        static int64_t ids[T][2];
        uint64_t rng = 100 + i;
        lk_call c = {0};
        c.T = T;
        c.K = 2;
        c.tabs[0] = find(size_names[2 * i]);
        c.tabs[1] = find(size_names[2 * i + 1]);
        ASSERT_EQ(c.tabs[0]->rb, sizes[i]);
        for (int t = 0; t < T; t++) {
            ids[t][0] = (int64_t)tu_rand_below(&rng, 300);
            ids[t][1] = (int64_t)tu_rand_below(&rng, 301);
        }
        ids[0][0] = 0;
        ids[1][0] = 299;
        ids[2][1] = 300;
        ids[5][1] = -1;
        c.id_type = ENGRAM_ID_INT64;
        c.ids = ids;
        CHECK(&c);
        c.flags = ENGRAM_LOOKUP_ZERO_DEAD;
        CHECK(&c);
        c.flags = 0;
        /* Head-major with 1 byte of padding. */
        c.ost = sizes[i] + 1;
        c.osk = (ptrdiff_t)T * (sizes[i] + 1);
        CHECK(&c);
        ids[7][0] = 300;
        CHECK_FAILS(&c, ENGRAM_EBADID);
    }
}

static void test_row_sizes(void)
{
    BOTH_STORES(row_sizes_body);
}

/* T = 4096, K = 24 (98304 rows, above any parallel threshold) on stores
 * with one and two threads and the default threshold. */
static void test_large_batch(void)
{
    enum { T = 4096, K = 24 };
    const uint32_t R = 264;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *big[2] = {NULL, NULL};
    engram_table_spec spec = {5000, R, 0};
    unsigned char *rows[8];
    for (int i = 0; i < 8; i++)
        rows[i] = tu_make_rows(400 + (uint32_t)i, 5000, R, 0, 0);
    for (int s = 0; s < 2; s++) {
        o.threads = s + 1;
        o.flags = ENGRAM_OPEN_CREATE;
        ASSERT_OK(engram_store_open(tu_scratch_root(), "big", &o, &big[s]));
    }
    for (int i = 0; i < 8; i++) {
        char name[16];
        snprintf(name, sizeof name, "h%d", i);
        /* Tables 0-5 are files, 6-7 bound. */
        if (i < 6) {
            ASSERT_OK(engram_populate(big[0], name, &spec, rows[i], 0));
        } else {
            ASSERT_OK(engram_bind(big[0], name, &spec, rows[i]));
            ASSERT_OK(engram_bind(big[1], name, &spec, rows[i]));
        }
    }
    engram_table_id tids[2][K];
    int64_t offs[K];
    for (int k = 0; k < K; k++) {
        char name[16];
        snprintf(name, sizeof name, "h%d", k % 8);
        for (int s = 0; s < 2; s++)
            ASSERT_OK(engram_table_open(big[s], name, &tids[s][k]));
        offs[k] = (int64_t)k * 5000;
    }
    int64_t *ids = (int64_t *)tu_xmalloc((size_t)T * K * sizeof *ids);
    uint64_t rng = 42;
    for (size_t t = 0; t < T; t++)
        for (size_t k = 0; k < K; k++) {
            uint64_t r = tu_rand(&rng);
            ids[t * K + k] = (r % 50 == 0) ? -1 : offs[k] + (int64_t)(r % 5000);
        }
    size_t out_len = (size_t)T * K * R;
    unsigned char *exp = (unsigned char *)tu_xmalloc(out_len);
    unsigned char *out = (unsigned char *)tu_xmalloc(out_len);
    memset(exp, SENTINEL, out_len);
    for (size_t t = 0; t < T; t++)
        for (size_t k = 0; k < K; k++) {
            int64_t id = ids[t * K + k];
            if (id != -1)
                tu_fill_row(exp + (t * K + k) * R, 400 + (uint32_t)(k % 8),
                            (uint64_t)(id - offs[k]), R);
        }

    for (int s = 0; s < 2; s++) {
        printf("   threads=%d\n", s + 1);
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        a.num_tokens = T;
        a.num_cols = K;
        a.tables = tids[s];
        a.offsets = offs;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        /* Three lookups, and with a pool as many more as it takes for one
         * to be split: the pool takes a 98k-row batch when it is free,
         * but refuses batches for a while after one where a worker made
         * the caller wait (src/pool.c), which a busy machine (a parallel
         * test run) can cause. */
        engram_stats st = ENGRAM_STATS_INIT;
        int reps = 0;
        do {
            memset(out, SENTINEL, out_len);
            ASSERT_OK(engram_lookup(big[s], &a));
            ASSERT_MEM_EQ(out, exp, out_len);
            ASSERT_OK(engram_store_stats(big[s], &st));
            reps++;
        } while (reps < 3 || (s == 1 && st.parallel == 0 && reps < 200));
        ASSERT_EQ(st.threads, s + 1);
        if (s == 0)
            ASSERT_EQ_U64(st.parallel, 0);
        else
            ASSERT(st.parallel >= 1);
        uint64_t dead = 0;
        for (size_t i = 0; i < (size_t)T * K; i++)
            dead += ids[i] == -1;
        ASSERT_EQ_U64(st.dead_rows, (uint64_t)reps * dead);
        ASSERT_EQ_U64(st.rows, (uint64_t)reps * ((uint64_t)T * K - dead));
        ASSERT_EQ_U64(st.bytes, (uint64_t)reps * ((uint64_t)T * K - dead) * R);

        /* A bad id in the very last position: nothing written, even when
         * the batch is split across threads. */
        int64_t saved = ids[(size_t)T * K - 1];
        ids[(size_t)T * K - 1] = offs[K - 1] + 5000;
        memset(out, SENTINEL, out_len);
        ASSERT_ERR(engram_lookup(big[s], &a), ENGRAM_EBADID);
        ASSERT_ALL_BYTES(out, SENTINEL, out_len);
        char pos[32];
        snprintf(pos, sizeof pos, "ids[%d][%d]", T - 1, K - 1);
        ASSERT_CONTAINS(engram_errmsg(), pos);
        ids[(size_t)T * K - 1] = saved;

        /* And in the middle. */
        ids[(size_t)(T / 2) * K + 7] = -2;
        ASSERT_ERR(engram_lookup(big[s], &a), ENGRAM_EBADID);
        ASSERT_ALL_BYTES(out, SENTINEL, out_len);
        ids[(size_t)(T / 2) * K + 7] = offs[7];
        memcpy(exp + ((size_t)(T / 2) * K + 7) * R, rows[7], R);
        ASSERT_OK(engram_lookup(big[s], &a));
        ASSERT_MEM_EQ(out, exp, out_len);
    }
    engram_store_close(big[0]);
    engram_store_close(big[1]);
    for (int i = 0; i < 8; i++)
        free(rows[i]);
    free(ids);
    free(out);
    free(exp);
}

/* Random shapes against the reference. */
static void test_random(void)
{
    static const char *const groups[3][5] = {
        {"a", "b", "c", "bound264", "engram:l1:h1"},
        {"s8a", "s8b", "s8c", "rs8", "rsb8"},
        {"s100a", "s100b", "rs100", "rsb100", "s100a"},
    };
    uint64_t seed = 20240601;
    const char *env = getenv("ENGRAM_TEST_SEED");
    if (env != NULL)
        seed = strtoull(env, NULL, 0);
    printf("   seed %llu (set ENGRAM_TEST_SEED to reproduce)\n", (unsigned long long)seed);
    uint64_t rng = seed;
    int iters = 600;
    size_t maxn = 64 * 1024;
    int64_t *logical = (int64_t *)tu_xmalloc(maxn * sizeof *logical);
    int64_t *ids64 = (int64_t *)tu_xmalloc(4 * maxn * sizeof *ids64);
    int32_t *ids32 = (int32_t *)tu_xmalloc(4 * maxn * sizeof *ids32);

    for (int it = 0; it < iters; it++) {
        lk_call c;
        memset(&c, 0, sizeof c);
        cur_store = (int)tu_rand_below(&rng, 2);
        const char *const *g = groups[tu_rand_below(&rng, 3)];
        c.T = (size_t)tu_rand_below(&rng, 5) == 0 ? (size_t)tu_rand_below(&rng, 700)
                                                   : (size_t)tu_rand_below(&rng, 33);
        c.K = 1 + (size_t)tu_rand_below(&rng, 8);
        for (size_t k = 0; k < c.K; k++)
            c.tabs[k] = find(g[tu_rand_below(&rng, 5)]);
        uint32_t R = c.tabs[0]->rb;
        int64_t offs[8];
        int use_offs = (int)tu_rand_below(&rng, 2);
        for (size_t k = 0; k < c.K; k++)
            offs[k] = use_offs ? (int64_t)tu_rand_below(&rng, 100000) : 0;
        if (use_offs)
            c.offsets = offs;
        c.flags = tu_rand_below(&rng, 2) ? ENGRAM_LOOKUP_ZERO_DEAD : 0;
        c.id_type = tu_rand_below(&rng, 2) ? ENGRAM_ID_INT64 : ENGRAM_ID_INT32;

        for (size_t t = 0; t < c.T; t++)
            for (size_t k = 0; k < c.K; k++)
                logical[t * c.K + k] = tu_rand_below(&rng, 10) == 0
                                           ? -1
                                           : offs[k] + (int64_t)tu_rand_below(&rng, c.tabs[k]->nrows);

        /* A bad id somewhere in a fifth of the calls. */
        int bad = c.T > 0 && tu_rand_below(&rng, 5) == 0;
        size_t bt = 0, bk = 0;
        if (bad) {
            bt = (size_t)tu_rand_below(&rng, c.T);
            bk = (size_t)tu_rand_below(&rng, c.K);
            int64_t cand[4] = {offs[bk] + (int64_t)c.tabs[bk]->nrows,
                               offs[bk] - 1 == -1 ? -2 : offs[bk] - 1, -2,
                               offs[bk] + (int64_t)c.tabs[bk]->nrows + 1000};
            logical[bt * c.K + bk] = cand[tu_rand_below(&rng, 4)];
        }

        /* Id layout. */
        size_t ilay = (size_t)tu_rand_below(&rng, 4);
        size_t pad = 1 + (size_t)tu_rand_below(&rng, 3);
        size_t ilen = c.T * c.K * (ilay == 2 ? pad + 1 : 1) + 1;
        ptrdiff_t ist = 0, isk = 0, ibase = 0;
        switch (ilay) {
        case 0: /* contiguous, implicit */
            break;
        case 1: /* transposed */
            ist = 1;
            isk = (ptrdiff_t)c.T;
            break;
        case 2: /* spread: each id followed by `pad` junk elements */
            isk = (ptrdiff_t)(pad + 1);
            ist = (ptrdiff_t)(c.K * (pad + 1));
            break;
        case 3: /* tokens reversed */
            ist = -(ptrdiff_t)c.K;
            isk = 1;
            ibase = c.T > 0 ? (ptrdiff_t)((c.T - 1) * c.K) : 0;
            break;
        }
        for (size_t i = 0; i < ilen; i++) {
            ids64[i] = 0x7FFFFFF0; /* junk that is never a valid id */
            ids32[i] = 0x7FFFFFF0;
        }
        ptrdiff_t ist_r = (ist == 0 && isk == 0) ? (ptrdiff_t)c.K : ist;
        ptrdiff_t isk_r = (ist == 0 && isk == 0) ? 1 : isk;
        for (size_t t = 0; t < c.T; t++)
            for (size_t k = 0; k < c.K; k++) {
                ptrdiff_t e = ibase + (ptrdiff_t)t * ist_r + (ptrdiff_t)k * isk_r;
                ids64[e] = logical[t * c.K + k];
                ids32[e] = (int32_t)logical[t * c.K + k];
            }
        c.ids = c.id_type == ENGRAM_ID_INT64 ? (const void *)(ids64 + ibase)
                                             : (const void *)(ids32 + ibase);
        c.ist = ist;
        c.isk = isk;

        /* Output layout. */
        size_t gap = (size_t)tu_rand_below(&rng, 17);
        switch (tu_rand_below(&rng, 5)) {
        case 0: /* contiguous, implicit */
            break;
        case 1: /* token-major with gaps */
            c.osk = (ptrdiff_t)(R + gap);
            c.ost = (ptrdiff_t)(c.K * (R + gap) + gap);
            break;
        case 2: /* head-major with gaps */
            c.ost = (ptrdiff_t)(R + gap);
            c.osk = (ptrdiff_t)(c.T * (R + gap) + gap);
            break;
        case 3: /* token-major, tokens reversed */
            c.osk = (ptrdiff_t)R;
            c.ost = -(ptrdiff_t)(c.K * R + gap);
            break;
        case 4: /* head-major, heads reversed */
            c.ost = (ptrdiff_t)R;
            c.osk = -(ptrdiff_t)(c.T * R + gap);
            break;
        }

        if (bad) {
            check_fails(&c, ENGRAM_EBADID, __LINE__);
            char pos[64];
            snprintf(pos, sizeof pos, "ids[%zu][%zu]", bt, bk);
            /* The first bad id in (t, k) order is the one reported; the
             * injected one is the only one. */
            ASSERT_CONTAINS(engram_errmsg(), pos);
        } else {
            check_call(&c, __LINE__);
        }
    }
    cur_store = 0;
    free(logical);
    free(ids64);
    free(ids32);
}

/* An engine's decode step: one lookup per layer, layer after layer, each
 * with its own tables (and offsets).  Six layers, more than the sets of
 * columns a thread keeps resolved, in turn and in other orders, through
 * two stores, and after a table of one layer is replaced: every row is the
 * right table's. */
static void test_layers_in_turn(void)
{
    enum { L = 6, KL = 3, N = 40, RB = 24 };
    engram_store *st[2] = {tu_open("layers-a", 0, 1), tu_open("layers-b", 0, 1)};
    engram_table_id tid[2][L][KL];
    int64_t offs[L][KL], ids[2][KL];
    unsigned char out[2 * KL * RB];
    uint32_t seed[2][L][KL];
    static const int order[] = {0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 5, 4, 3, 2, 1, 0, 2, 2, 4, 0,
                                1, 2, 3, 4, 5, 5, 3, 1};
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < L; l++)
            for (int k = 0; k < KL; k++) {
                char name[32];
                snprintf(name, sizeof name, "engram:l%d:h%d", l, k);
                seed[s][l][k] = (uint32_t)(100 * s + 10 * l + k + 1);
                tu_populate(st[s], name, seed[s][l][k], N, RB, 0);
                ASSERT_OK(engram_table_open(st[s], name, &tid[s][l][k]));
                offs[l][k] = 1000 * l + 100 * k;
            }
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
            int l = order[i], s = (int)(i + (size_t)round) % 2;
            engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
            for (int t = 0; t < 2; t++)
                for (int k = 0; k < KL; k++)
                    ids[t][k] = offs[l][k] + (int64_t)((i * 7 + (size_t)t * 13 + (size_t)k) % N);
            a.num_tokens = 2;
            a.num_cols = KL;
            a.tables = tid[s][l];
            /* Round 1 looks up without offsets: other ids, same tables. */
            a.offsets = round == 1 ? NULL : offs[l];
            if (round == 1)
                for (int t = 0; t < 2; t++)
                    for (int k = 0; k < KL; k++)
                        ids[t][k] -= offs[l][k];
            a.ids = ids;
            a.id_type = ENGRAM_ID_INT64;
            a.out = out;
            ASSERT_OK(engram_lookup(st[s], &a));
            for (int t = 0; t < 2; t++)
                for (int k = 0; k < KL; k++)
                    ASSERT_ROW(out + (size_t)(t * KL + k) * RB, seed[s][l][k],
                               (uint64_t)(ids[t][k] - (round == 1 ? 0 : offs[l][k])), RB);
            if (round == 2 && i == 10) {
                /* Layer 1's head 2 of store 0 replaced by other rows. */
                engram_lookup_args b = ENGRAM_LOOKUP_ARGS_INIT;
                int64_t one[KL] = {offs[1][0], offs[1][1], offs[1][2]};
                b.num_tokens = 1;
                b.num_cols = KL;
                b.tables = tid[0][1];
                b.offsets = offs[1];
                b.ids = one;
                b.id_type = ENGRAM_ID_INT64;
                b.out = out;
                ASSERT_OK(engram_lookup(st[0], &b));
                ASSERT_OK(engram_remove(st[0], "engram:l1:h2"));
                /* Its columns, resolved just before, are not served any
                 * more. */
                ASSERT_ERR(engram_lookup(st[0], &b), ENGRAM_EREMOVED);
                seed[0][1][2] = 999;
                tu_populate(st[0], "engram:l1:h2", 999, N, RB, 0);
                ASSERT_OK(engram_table_open(st[0], "engram:l1:h2", &tid[0][1][2]));
            }
        }
    engram_store_close(st[0]);
    engram_store_close(st[1]);
}

int main(void)
{
    tu_watchdog(240);
    setup();
    RUN_TEST(test_basic);
    RUN_TEST(test_offsets);
    RUN_TEST(test_layouts);
    RUN_TEST(test_id_strides);
    RUN_TEST(test_dead);
    RUN_TEST(test_bad_ids);
    RUN_TEST(test_offset_extremes);
    RUN_TEST(test_offset_fuzz);
    RUN_TEST(test_layout_errors);
    RUN_TEST(test_bad_args);
    RUN_TEST(test_row_sizes);
    RUN_TEST(test_large_batch);
    RUN_TEST(test_random);
    RUN_TEST(test_layers_in_turn);
    teardown();
    printf("test_lookup: all passed\n");
    return 0;
}
