/*
 * test_backend.c - the backend seam (src/backend.h): a table whose rows are
 * not addressable memory is served through ops->read_rows with exactly the
 * lookup semantics of a memory-resident table.
 *
 * The "fake" backend below keeps rows in a private buffer and counts its
 * calls; a failure switch injects read errors.  (Version 2 of the seam:
 * one call carries the rows of every column the backend serves.)  Every lookup is compared
 * with the same lookup against the same rows bound as memory.
 */
#include "testutil.h"

#include "store.h" /* backend.h, and the table fields the fake reads */

typedef struct fake {
    const unsigned char *rows;
    uint32_t pitch, row_bytes;
    int fail_after; /* fail the n-th read_rows call (0: never) */
    int calls;
    uint64_t rows_read;
} fake;

static fake fk;

static int fake_read(size_t n, struct engram__table *const *tabs, const uint64_t *rows,
                     unsigned char *const *dsts)
{
    fk.calls++;
    for (size_t i = 0; i < n; i++)
        ASSERT_STR_EQ(tabs[i]->name, "fake");
    if (fk.fail_after && fk.calls >= fk.fail_after)
        return -EIO;
    for (size_t i = 0; i < n; i++)
        memcpy(dsts[i], fk.rows + rows[i] * fk.pitch, fk.row_bytes);
    fk.rows_read += n;
    return 0;
}

static int released;
static void fake_release(struct engram__table *t)
{
    (void)t;
    released++;
}

static const engram__backend_ops fake_ops = {ENGRAM__BACKEND_VERSION, "fake", fake_read,
                                             fake_release};

enum { NROWS = 1000, R = 40, T = 700, K = 3 };

static void test_backend_matches_memory(void)
{
    engram_store *st;
    engram_table_spec spec = {NROWS, R, 48};
    unsigned char *rows = tu_make_rows(7, NROWS, R, 48, 0);
    engram_table_id idf, idm, tabs[K];
    int64_t ids[T][K], offs[K] = {0, 5, 0};
    static unsigned char out_f[T][K][R], out_m[T][K][R];
    uint64_t rng = 1;

    ASSERT_OK(engram_store_open_memory(NULL, &st));
    fk = (fake){rows, 48, R, 0, 0, 0};
    ASSERT_OK(engram__store_add_table(st, "fake", &spec, NULL, &fake_ops, NULL, &idf));
    ASSERT_OK(engram_bind(st, "mem", &spec, rows));
    ASSERT_OK(engram_table_open(st, "mem", &idm));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            ids[t][k] = (t % 17 == 0) ? -1 : (int64_t)(tu_rand(&rng) % NROWS) + offs[k];

    for (int zero = 0; zero < 2; zero++) {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        memset(out_f, 0xAB, sizeof out_f);
        memset(out_m, 0xAB, sizeof out_m);
        a.flags = zero ? ENGRAM_LOOKUP_ZERO_DEAD : 0;
        a.num_tokens = T;
        a.num_cols = K;
        a.offsets = offs;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        /* Column 1 is memory, columns 0 and 2 go through the backend. */
        tabs[0] = idf;
        tabs[1] = idm;
        tabs[2] = idf;
        a.tables = tabs;
        a.out = out_f;
        ASSERT_OK(engram_lookup(st, &a));
        tabs[0] = tabs[2] = idm;
        a.out = out_m;
        ASSERT_OK(engram_lookup(st, &a));
        ASSERT_MEM_EQ(out_f, out_m, sizeof out_f);
    }
    /* Dead rows never reach the backend; the rows of both backend columns
     * arrive together, in batches of at most ENGRAM__BACKEND_BATCH. */
    ASSERT_EQ(fk.rows_read, 2 * 2 * (T - (T + 16) / 17));
    ASSERT_EQ(fk.calls, 2 * ((2 * (T - (T + 16) / 17) + ENGRAM__BACKEND_BATCH - 1) /
                             ENGRAM__BACKEND_BATCH));

    /* An out-of-range id is rejected before the backend sees anything. */
    {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        int calls = fk.calls;
        int64_t bad[2] = {3, NROWS};
        tabs[0] = idf;
        a.num_tokens = 2;
        a.num_cols = 1;
        a.tables = tabs;
        a.ids = bad;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out_f;
        ASSERT_ERR(engram_lookup(st, &a), ENGRAM_EBADID);
        ASSERT_EQ(fk.calls, calls);
        ASSERT_CONTAINS(engram_errmsg(), "ids[1][0]");
    }
    /* A read error surfaces as the lookup's error. */
    {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        int64_t one[1] = {3};
        fk.fail_after = fk.calls + 1;
        tabs[0] = idf;
        a.num_tokens = 1;
        a.num_cols = 1;
        a.tables = tabs;
        a.ids = one;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out_f;
        ASSERT_ERR(engram_lookup(st, &a), -EIO);
    }
    released = 0;
    engram_store_close(st);
    ASSERT_EQ(released, 1);
    free(rows);
}

static void test_backend_rejects_bad_ops(void)
{
    engram_store *st;
    engram_table_spec spec = {10, 8, 0};
    engram__backend_ops v2 = fake_ops, none = fake_ops;
    v2.version = ENGRAM__BACKEND_VERSION + 1;
    none.read_rows = NULL;
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_ERR(engram__store_add_table(st, "x", &spec, NULL, &v2, NULL, NULL), -EINVAL);
    ASSERT_ERR(engram__store_add_table(st, "x", &spec, NULL, &none, NULL, NULL), -EINVAL);
    ASSERT_OK(engram__store_add_table(st, "x", &spec, NULL, &fake_ops, NULL, NULL));
    ASSERT_ERR(engram__store_add_table(st, "x", &spec, NULL, &fake_ops, NULL, NULL), -EEXIST);
    engram_store_close(st);
}

int main(void)
{
    RUN_TEST(test_backend_matches_memory);
    RUN_TEST(test_backend_rejects_bad_ops);
    printf("test_backend: all passed\n");
    return 0;
}
