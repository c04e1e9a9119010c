/*
 * test_table_memory.c - engram_table_memory(): the base address and spec
 * of memory-resident tables (what libengram_cuda registers with the GPU).
 *
 * For each kind of table memory (a shared mapping of a table file, a
 * private huge-page copy, bound caller memory) the rows read through the
 * returned base must be the table's rows at the returned pitch; tables
 * without a base address (a source reading rows on demand) give -ENOTSUP
 * with the spec still filled; removed tables and foreign ids fail.
 */
#include "testutil.h"

/* Reads every row through `base` and checks it against pattern `seed`. */
static void check_rows_at(const void *base, const engram_table_spec *sp, uint32_t seed)
{
    for (uint64_t i = 0; i < sp->num_rows; i++)
        ASSERT_ROW((const unsigned char *)base + i * sp->row_pitch, seed, i, sp->row_bytes);
}

static void test_file_tables(void)
{
    static const uint32_t flags[] = {0, ENGRAM_OPEN_PREFAULT, ENGRAM_OPEN_PRIVATE_HUGE};
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        engram_store *st;
        engram_table_id id;
        engram_table_spec sp;
        const void *base = NULL;
        char ns[32];
        tu_current_case = "file tables: base and spec";
        snprintf(ns, sizeof ns, "files%zu", f);
        st = tu_open(ns, flags[f], 1);
        tu_populate(st, "t264", 3, 1000, 264, 272);
        ASSERT_OK(engram_table_open(st, "t264", &id));
        memset(&sp, 0, sizeof sp);
        ASSERT_OK(engram_table_memory(st, id, &base, &sp));
        ASSERT(base != NULL);
        ASSERT_EQ_U64(sp.num_rows, 1000);
        ASSERT_EQ(sp.row_bytes, 264);
        ASSERT_EQ(sp.row_pitch, 272);
        /* The data region is page aligned in the mapping (2 MiB in the
         * file), which is what GPU registration relies on. */
        ASSERT_EQ((uintptr_t)base % 4096, 0);
        check_rows_at(base, &sp, 3);
        /* Either out-pointer may be NULL. */
        ASSERT_OK(engram_table_memory(st, id, NULL, &sp));
        ASSERT_OK(engram_table_memory(st, id, &base, NULL));
        /* Same id, same memory: the table is mapped once per store. */
        {
            const void *again = NULL;
            ASSERT_OK(engram_table_memory(st, id, &again, NULL));
            ASSERT(again == base);
        }
        engram_store_close(st);
    }
}

static void test_bound_and_pitch_zero(void)
{
    engram_store *st;
    engram_table_spec spec = {77, 40, 0}, sp;
    unsigned char *rows = tu_make_rows(9, 77, 40, 40, 0);
    engram_table_id id;
    const void *base = NULL;
    tu_current_case = "bound memory: base is the caller's pointer, pitch resolved";
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_OK(engram_bind(st, "b", &spec, rows));
    ASSERT_OK(engram_table_open(st, "b", &id));
    ASSERT_OK(engram_table_memory(st, id, &base, &sp));
    ASSERT(base == rows);
    ASSERT_EQ(sp.row_pitch, 40); /* 0 resolved to row_bytes */
    check_rows_at(base, &sp, 9);
    engram_store_close(st);
    free(rows);
}

static int fake_read(void *ctx, engram_source_req *reqs, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        memset(reqs[i].dst, (int)(reqs[i].row & 0xff), 16);
    return 0;
}

static void test_no_base(void)
{
    engram_store *st;
    engram_table_spec spec = {500, 16, 32}, sp;
    engram_table_id id;
    const void *base = (const void *)&spec;
    tu_current_case = "a table without base address: -ENOTSUP, spec filled";
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    {
        engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
        ops.read_rows = fake_read;
        ASSERT_OK(engram_add_source(st, "ondemand", &spec, &ops, NULL, 0, &id));
    }
    memset(&sp, 0, sizeof sp);
    ASSERT_ERR(engram_table_memory(st, id, &base, &sp), -ENOTSUP);
    ASSERT(base == NULL);
    ASSERT_EQ_U64(sp.num_rows, 500);
    ASSERT_EQ(sp.row_bytes, 16);
    ASSERT_EQ(sp.row_pitch, 32);
    ASSERT_CONTAINS(engram_errmsg(), "ondemand");
    ASSERT_CONTAINS(engram_errmsg(), "no base address");
    engram_store_close(st);
}

static void test_errors(void)
{
    engram_store *st;
    engram_table_id id;
    const void *base = NULL;
    tu_current_case = "removed tables and foreign ids";
    st = tu_open("errs", 0, 1);
    tu_populate(st, "gone", 5, 10, 8, 0);
    ASSERT_OK(engram_table_open(st, "gone", &id));
    ASSERT_OK(engram_table_memory(st, id, &base, NULL));
    ASSERT_OK(engram_remove(st, "gone"));
    ASSERT_ERR(engram_table_memory(st, id, &base, NULL), ENGRAM_EREMOVED);
    ASSERT(base == NULL);
    ASSERT_ERR(engram_table_memory(st, id + 1, &base, NULL), -EINVAL);
    ASSERT_ERR(engram_table_memory(st, 1u << 30, &base, NULL), -EINVAL);
    ASSERT_ERR(engram_table_memory(NULL, 0, &base, NULL), -EINVAL);
    engram_store_close(st);
}

int main(void)
{
    tu_watchdog(120);
    test_file_tables();
    test_bound_and_pitch_zero();
    test_no_base();
    test_errors();
    printf("test_table_memory: ok\n");
    return 0;
}
