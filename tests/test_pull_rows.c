/*
 * test_pull_rows.c - engram_pull_rows(): a pull whose rows the caller's
 * code reads (engramstore's Mooncake pull is one), through the writer and
 * the ranks' meeting of engram_pull().
 *
 *  - the rows appended by fill, in chunks, are the published table's;
 *  - a published table: kept when same() says it holds the source's rows
 *    (fill is not called), refused (ENGRAM_EMISMATCH) when it says not or
 *    when its shape differs;
 *  - fill that fails, or that appends too few rows: its error, nothing
 *    published and no temporary file left;
 *  - same() and fill() answering what they may not: -EINVAL;
 *  - bad arguments;
 *  - four ranks (threads with stores of their own) pulling at once: one
 *    fills, the others wait for its temporary file and keep its table;
 *  - rows written in place (engram__writer_region, what a pull's
 *    read does on a tmpfs): the table they make, and when a writer gives
 *    no region (another size, a pitch, rows appended, failed earlier).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <sys/vfs.h>

#include "testutil.h"
#include "writer.h"

#define RB 264
#define ROWS 3001
#define CHUNK 500

typedef struct src {
    uint32_t seed;
    uint64_t rows;        /* rows fill appends (ROWS unless testing a short one) */
    int fail_after;       /* fill fails with -EIO after this many chunks (-1: never) */
    int same_answer;      /* what same() answers; -2: compare the rows with the pattern */
    int delay_ms;         /* between chunks */
    atomic_int fills, sames;
} src;

static int fill(void *ud, engram_writer *w)
{
    src *s = ud;
    unsigned char *rows = tu_make_rows(s->seed, s->rows, RB, RB, 0);
    int rc = 0, chunk = 0;
    atomic_fetch_add(&s->fills, 1);
    for (uint64_t i = 0; i < s->rows && rc == 0; i += CHUNK, chunk++) {
        uint64_t n = s->rows - i < CHUNK ? s->rows - i : CHUNK;
        if (s->fail_after >= 0 && chunk == s->fail_after) {
            rc = -EIO;
            break;
        }
        rc = engram_writer_append(w, rows + i * RB, n, 0);
        if (s->delay_ms) {
            struct timespec ts = {0, (long)s->delay_ms * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    free(rows);
    return rc;
}

static int same(void *ud, const void *rows, const engram_table_spec *spec)
{
    src *s = ud;
    atomic_fetch_add(&s->sames, 1);
    if (spec->num_rows != ROWS || spec->row_bytes != RB)
        return -EPROTO;
    if (s->same_answer != -2)
        return s->same_answer;
    for (uint64_t i = 0; i < spec->num_rows; i++)
        if (tu_row_mismatch((const unsigned char *)rows + i * RB, s->seed, i, RB) >= 0)
            return 0;
    return 1;
}

static const engram_pull_ops OPS = {fill, same};

static void init_src(src *s, uint32_t seed)
{
    s->seed = seed;
    s->rows = ROWS;
    s->fail_after = -1;
    s->same_answer = -2;
    s->delay_ms = 0;
    atomic_store(&s->fills, 0);
    atomic_store(&s->sames, 0);
}

static void assert_nothing(engram_store *st, const char *ns, const char *name)
{
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    char strays[4][256];
    ASSERT_ERR(engram_get_table_info(st, name, &info), -ENOENT);
    ASSERT_EQ(tu_strays(ns, st, strays, 4), 0);
}

static void test_pull(void)
{
    engram_store *st = tu_open("pull", 0, 1);
    engram_table_spec spec = {ROWS, RB, 0}, packed = {ROWS, RB, RB};
    src s;
    int written = -1;
    tu_current_case = "rows appended in chunks are the table's";
    init_src(&s, 7);
    ASSERT_OK(engram_pull_rows(st, "t", &spec, "the test's source", &OPS, &s, &written));
    ASSERT_EQ(written, 1);
    ASSERT_EQ(atomic_load(&s.fills), 1);
    tu_check_named(st, "t", 7, ROWS, RB);
    ASSERT_OK(engram_verify(st, "t", NULL, NULL));

    tu_current_case = "a published table with the source's rows is kept";
    ASSERT_OK(engram_pull_rows(st, "t", &packed, NULL, &OPS, &s, &written));
    ASSERT_EQ(written, 0);
    ASSERT_EQ(atomic_load(&s.fills), 1);
    ASSERT_GE(atomic_load(&s.sames), 1);

    tu_current_case = "a published table with other rows is refused";
    init_src(&s, 8);
    ASSERT_ERR(engram_pull_rows(st, "t", &spec, "the test's source", &OPS, &s, &written),
               ENGRAM_EMISMATCH);
    ASSERT_CONTAINS(engram_errmsg(), "holds other rows than the test's source's");
    ASSERT_EQ(written, 0);
    ASSERT_EQ(atomic_load(&s.fills), 0);
    tu_check_named(st, "t", 7, ROWS, RB);
    {
        engram_table_spec other = {ROWS + 1, RB, 0};
        init_src(&s, 7);
        ASSERT_ERR(engram_pull_rows(st, "t", &other, NULL, &OPS, &s, NULL), ENGRAM_EMISMATCH);
        ASSERT_CONTAINS(engram_errmsg(), "3001 rows of 264 bytes");
        ASSERT_EQ(atomic_load(&s.sames), 0);
    }

    tu_current_case = "same() answering an error or what it may not";
    init_src(&s, 7);
    s.same_answer = -EPROTO;
    ASSERT_ERR(engram_pull_rows(st, "t", &spec, NULL, &OPS, &s, NULL), -EPROTO);
    s.same_answer = 5;
    ASSERT_ERR(engram_pull_rows(st, "t", &spec, NULL, &OPS, &s, NULL), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "same() answered 5");

    tu_current_case = "fill that fails publishes nothing";
    init_src(&s, 9);
    s.fail_after = 3;
    ASSERT_ERR(engram_pull_rows(st, "u", &spec, NULL, &OPS, &s, &written), -EIO);
    ASSERT_EQ(written, 0);
    assert_nothing(st, "pull", "u");
    init_src(&s, 9);
    s.rows = ROWS - 1;
    ASSERT_ERR(engram_pull_rows(st, "u", &spec, NULL, &OPS, &s, &written), ENGRAM_ESTATE);
    assert_nothing(st, "pull", "u");
    init_src(&s, 9);
    s.fail_after = 0; /* before its first row */
    ASSERT_ERR(engram_pull_rows(st, "u", &spec, NULL, &OPS, &s, NULL), -EIO);
    assert_nothing(st, "pull", "u");
    /* And then pulls. */
    init_src(&s, 9);
    ASSERT_OK(engram_pull_rows(st, "u", &spec, NULL, &OPS, &s, &written));
    ASSERT_EQ(written, 1);
    tu_check_named(st, "u", 9, ROWS, RB);

    tu_current_case = "bad arguments";
    init_src(&s, 7);
    {
        engram_pull_ops nofill = {NULL, same}, nosame = {fill, NULL};
        engram_table_spec pitched = {ROWS, RB, RB + 8}, empty = {0, RB, 0};
        engram_store *mem;
        ASSERT_ERR(engram_pull_rows(NULL, "t", &spec, NULL, &OPS, &s, NULL), -EINVAL);
        ASSERT_ERR(engram_pull_rows(st, "t", NULL, NULL, &OPS, &s, NULL), -EINVAL);
        ASSERT_ERR(engram_pull_rows(st, "t", &spec, NULL, NULL, &s, NULL), -EINVAL);
        ASSERT_ERR(engram_pull_rows(st, "t", &spec, NULL, &nofill, &s, NULL), -EINVAL);
        ASSERT_ERR(engram_pull_rows(st, "t", &spec, NULL, &nosame, &s, NULL), -EINVAL);
        ASSERT_ERR(engram_pull_rows(st, "../t", &spec, NULL, &OPS, &s, NULL), ENGRAM_ESPEC);
        ASSERT_ERR(engram_pull_rows(st, "v", &pitched, NULL, &OPS, &s, NULL), ENGRAM_ESPEC);
        ASSERT_CONTAINS(engram_errmsg(), "packed");
        ASSERT_ERR(engram_pull_rows(st, "v", &empty, NULL, &OPS, &s, NULL), ENGRAM_ESPEC);
        ASSERT_OK(engram_store_open_memory(NULL, &mem));
        ASSERT_ERR(engram_pull_rows(mem, "t", &spec, NULL, &OPS, &s, NULL), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "not a directory namespace");
        engram_store_close(mem);
        ASSERT_EQ(atomic_load(&s.fills), 0);
    }
    engram_store_close(st);
}

typedef struct rank {
    src *s;
    int rc, written;
} rank;

static void *rank_main(void *arg)
{
    rank *r = arg;
    engram_store *st = tu_open("ranks", 0, 1);
    engram_table_spec spec = {ROWS, RB, 0};
    r->rc = engram_pull_rows(st, "t", &spec, NULL, &OPS, r->s, &r->written);
    engram_store_close(st);
    return NULL;
}

static void test_ranks(void)
{
    pthread_t th[4];
    rank r[4];
    src s;
    int wrote = 0;
    engram_store *st;
    tu_current_case = "four ranks pulling at once: one fills";
    init_src(&s, 11);
    s.delay_ms = 20; /* the others find its temporary file */
    for (int i = 0; i < 4; i++) {
        r[i] = (rank){&s, -1, -1};
        ASSERT_EQ(pthread_create(&th[i], NULL, rank_main, &r[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
        ASSERT_OK(r[i].rc);
        wrote += r[i].written;
    }
    ASSERT_EQ(wrote, 1);
    ASSERT_EQ(atomic_load(&s.fills), 1);
    st = tu_open("ranks", 0, 1);
    tu_check_named(st, "t", 11, ROWS, RB);
    engram_store_close(st);
}

/* fill() writing its rows in place, CHUNK rows at a time. */
static int fill_in_place(void *ud, engram_writer *w)
{
    src *s = ud;
    unsigned char *p = engram__writer_region(w, (uint64_t)ROWS * RB);
    int rc = 0;
    if (!p)
        return -ENOTSUP;
    for (uint64_t i = 0; i < ROWS && rc == 0; i += CHUNK) {
        uint64_t n = ROWS - i < CHUNK ? ROWS - i : CHUNK;
        for (uint64_t j = 0; j < n; j++)
            tu_fill_row(p + (i + j) * RB, s->seed, i + j, RB);
        rc = engram_writer_append(w, p + i * RB, n, 0);
    }
    /* One row more than the table has: refused, and the writer fails. */
    if (rc == 0 && s->fail_after == 0) {
        ASSERT_ERR(engram_writer_append(w, p, 1, 0), ENGRAM_ESTATE);
        rc = -EIO;
    }
    return rc;
}

static void test_in_place(void)
{
    engram_store *st = tu_open("inplace", 0, 1);
    engram_table_spec spec = {ROWS, RB, 0}, pitched = {ROWS, RB, 272};
    struct statfs fs;
    engram_writer *w;
    unsigned char row[RB];
    src s;
    int written = -1;
    ASSERT_EQ(statfs(tu_scratch_path, &fs), 0);
    if (fs.f_type != 0x01021994) { /* TMPFS_MAGIC: rows go in place only there */
        ASSERT_OK(engram_writer_begin(st, "d", &spec, &w));
        ASSERT(engram__writer_region(w, (uint64_t)ROWS * RB) == NULL);
        engram_writer_abort(w);
        printf("   scratch is not a tmpfs: no region, rows appended\n");
        engram_store_close(st);
        return;
    }
    tu_current_case = "rows written in place make the table";
    init_src(&s, 9);
    ASSERT_OK(engram_pull_rows(st, "t", &spec, "test", &(engram_pull_ops){fill_in_place, same},
                               &s, &written));
    ASSERT_EQ(written, 1);
    tu_check_named(st, "t", 9, ROWS, RB);
    ASSERT_OK(engram_verify(st, "t", NULL, NULL));

    tu_current_case = "rows past the table's fail the writer";
    init_src(&s, 10);
    s.fail_after = 0;
    ASSERT_ERR(engram_pull_rows(st, "u", &spec, "test", &(engram_pull_ops){fill_in_place, same},
                                &s, &written),
               -EIO);
    assert_nothing(st, "inplace", "u");

    tu_current_case = "no region: another size, a pitch, rows appended, a failed writer";
    ASSERT_OK(engram_writer_begin(st, "v", &spec, &w));
    ASSERT(engram__writer_region(w, (uint64_t)ROWS * RB - 1) == NULL);
    ASSERT(engram__writer_region(w, (uint64_t)ROWS * RB + RB) == NULL);
    ASSERT_ERR(engram_writer_append(w, row, ROWS + 1, 0), ENGRAM_ESTATE); /* fails w */
    ASSERT(engram__writer_region(w, (uint64_t)ROWS * RB) == NULL);
    engram_writer_abort(w);
    ASSERT_OK(engram_writer_begin(st, "v", &pitched, &w));
    ASSERT(engram__writer_region(w, (uint64_t)ROWS * RB) == NULL);
    ASSERT(engram__writer_region(w, (uint64_t)ROWS * 272) == NULL);
    engram_writer_abort(w);
    ASSERT_OK(engram_writer_begin(st, "v", &spec, &w));
    tu_fill_row(row, 1, 0, RB);
    ASSERT_OK(engram_writer_append(w, row, 1, 0));
    ASSERT(engram__writer_region(w, (uint64_t)ROWS * RB) == NULL);
    engram_writer_abort(w);
    assert_nothing(st, "inplace", "v");
    engram_store_close(st);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    tu_watchdog(120);
    RUN_TEST(test_pull);
    RUN_TEST(test_ranks);
    RUN_TEST(test_in_place);
    printf("test_pull_rows: ok\n");
    return 0;
}
