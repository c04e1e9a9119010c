/*
 * test_cuda_hostpath.cu - the parts of libengram_cuda that run without a
 * GPU: the CPU half of the host path (engram__cuda_host_gather) and the
 * "no CUDA device" error of engram_cuda_open() on machines without one.
 *
 * The host path gathers staged ids of tables without a base address on
 * the CPU.  Its contract (cuda_internal.h): good ids get their rows in the
 * row staging, exactly as engram_lookup() would write them; dead ids leave
 * their staging row alone; bad ids are turned into dead ones (the kernel
 * reports them from its own copy) so that one bad id does not lose the
 * batch; a source's failure reaches the error sink with its message.
 * Compiled by nvcc as C++ (tests/test_cuda*.cu), run everywhere.  The
 * no-device case is a CTest entry of its own
 * (test_cuda_hostpath.open_without_device), skipped where a device exists.
 */
#include "testutil.h"

extern "C" {
#include "common.h" /* a C header without its own extern "C" */
}
#include "cuda_internal.h"
#include "engram_cuda.h"
#include "ids.h"

enum { NROWS = 300, R = 24, PITCH = 32, T = 40, K = 3 };

static const unsigned char *fake_rows;
static int fake_fail;

static int fake_read(void *ctx, engram_source_req *reqs, size_t n)
{
    (void)ctx;
    if (fake_fail)
        return engram_source_error(-EIO, "injected read failure");
    for (size_t i = 0; i < n; i++)
        memcpy(reqs[i].dst, fake_rows + reqs[i].row * PITCH, R);
    return 0;
}

static int sink_code;
static char sink_msg[512];
static int sink(void *ud, int code, const char *msg)
{
    (void)ud;
    sink_code = code;
    snprintf(sink_msg, sizeof sink_msg, "%s", msg);
    return code;
}

static void test_host_gather(void)
{
    engram_store *st;
    engram_table_spec spec = {NROWS, R, PITCH};
    unsigned char *rows = tu_make_rows(21, NROWS, R, PITCH, 0xEE);
    engram_table_id fake_id, mem_id;
    uint32_t tables[K];
    int64_t offsets[K] = {0, 1000, 7};
    uint64_t spans[K];
    static int64_t ids[T][K], orig[T][K];
    static unsigned char staging[T][K][R], expect[T][K][R];
    uint64_t rng = 5;
    engram__cuda_host h;

    tu_current_case = "host gather: good, dead and bad ids";
    fake_rows = rows;
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    {
        engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
        ops.read_rows = fake_read;
        ASSERT_OK(engram_add_source(st, "ondemand", &spec, &ops, NULL, 0, &fake_id));
    }
    ASSERT_OK(engram_bind(st, "mem", &spec, rows));
    ASSERT_OK(engram_table_open(st, "mem", &mem_id));
    tables[0] = fake_id;
    tables[1] = mem_id; /* the host path may carry memory tables too */
    tables[2] = fake_id;
    for (int k = 0; k < K; k++)
        spans[k] = engram__id_span(NROWS, offsets[k]);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            ids[t][k] = (int64_t)tu_rand_below(&rng, NROWS) + offsets[k];
    ids[3][0] = -1;
    ids[5][1] = NROWS + 1000;  /* bad: past the end */
    ids[9][2] = 3;             /* bad: below the offset */
    ids[11][0] = NROWS;        /* bad: one past */
    memcpy(orig, ids, sizeof ids);

    memset(&h, 0, sizeof h);
    h.store = st;
    h.K = K;
    h.tables = tables;
    h.offsets = offsets;
    h.spans = spans;
    h.row_bytes = R;
    h.ids = &ids[0][0];
    h.rows = &staging[0][0][0];
    h.on_error = sink;
    memset(staging, 0xCC, sizeof staging);
    memset(expect, 0xCC, sizeof expect);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int64_t row = orig[t][k] - offsets[k];
            if (orig[t][k] != -1 && row >= 0 && row < NROWS)
                tu_fill_row(expect[t][k], 21, (uint64_t)row, R);
        }
    sink_code = 0;
    ASSERT_OK(engram__cuda_host_gather(&h, T));
    ASSERT_EQ(sink_code, 0);
    ASSERT_MEM_EQ(staging, expect, sizeof staging);
    /* Bad ids became dead; the others are as staged. */
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int bad = (t == 5 && k == 1) || (t == 9 && k == 2) || (t == 11 && k == 0);
            ASSERT_EQ(ids[t][k], bad ? -1 : orig[t][k]);
        }

    tu_current_case = "host gather: fewer tokens than staged touch only those";
    memcpy(ids, orig, sizeof ids);
    memset(staging, 0xCC, sizeof staging);
    ASSERT_OK(engram__cuda_host_gather(&h, 2));
    ASSERT_MEM_EQ(staging, expect, 2 * sizeof staging[0]);
    ASSERT_ALL_BYTES(staging[2], 0xCC, sizeof staging - 2 * sizeof staging[0]);

    tu_current_case = "host gather: a source failure reaches the sink";
    memcpy(ids, orig, sizeof ids);
    fake_fail = 1;
    ASSERT_ERR(engram__cuda_host_gather(&h, T), -EIO);
    ASSERT_EQ(sink_code, -EIO);
    ASSERT_CONTAINS(sink_msg, "injected read failure");
    fake_fail = 0;

    /* id - offset is exact: INT64_MIN + r is 2^64 - 1 - r below the
     * offset INT64_MAX, although it is row 1 + r modulo 2^64. */
    tu_current_case = "host gather: ids and offsets at the ends of int64";
    {
        const int64_t xoff[K] = {INT64_MAX, INT64_MIN, INT64_MAX - 5};
        static const struct {
            int t, k;
            int64_t id, row; /* row -1: bad */
        } xs[] = {
            {0, 0, INT64_MAX, 0},      {1, 0, INT64_MIN, -1},          {2, 0, INT64_MIN + 7, -1},
            {0, 1, INT64_MIN, 0},      {1, 1, INT64_MIN + NROWS - 1, NROWS - 1},
            {2, 1, INT64_MAX, -1},     {3, 1, INT64_MIN + NROWS, -1},  {0, 2, INT64_MAX, 5},
            {1, 2, INT64_MAX - 5, 0},  {2, 2, INT64_MIN, -1},          {3, 2, INT64_MIN + 100, -1},
        };
        const size_t nx = sizeof xs / sizeof xs[0];
        memcpy(offsets, xoff, sizeof offsets);
        for (int k = 0; k < K; k++)
            spans[k] = engram__id_span(NROWS, offsets[k]);
        for (int t = 0; t < 4; t++)
            for (int k = 0; k < K; k++)
                ids[t][k] = -1;
        for (size_t i = 0; i < nx; i++)
            ids[xs[i].t][xs[i].k] = xs[i].id;
        memset(staging, 0xCC, sizeof staging);
        memset(expect, 0xCC, sizeof expect);
        for (size_t i = 0; i < nx; i++)
            if (xs[i].row >= 0)
                tu_fill_row(expect[xs[i].t][xs[i].k], 21, (uint64_t)xs[i].row, R);
        sink_code = 0;
        ASSERT_OK(engram__cuda_host_gather(&h, 4));
        ASSERT_EQ(sink_code, 0);
        ASSERT_MEM_EQ(staging, expect, 4 * sizeof staging[0]);
        for (size_t i = 0; i < nx; i++)
            ASSERT_EQ(ids[xs[i].t][xs[i].k], xs[i].row < 0 ? -1 : xs[i].id);
    }

    engram_store_close(st);
    free(rows);
}

static void test_open_without_device(void)
{
    engram_store *st;
    engram_cuda_ctx *ctx = NULL;
    int n = 0;
    tu_current_case = "engram_cuda_open: -ENODEV without a device";
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
        tu_skip_case("a CUDA device exists: the no-device error cannot be met here");
        return;
    }
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_ERR(engram_cuda_open(st, NULL, &ctx), -ENODEV);
    ASSERT(ctx == NULL);
    ASSERT_CONTAINS(engram_errmsg(), "no CUDA device");
    engram_store_close(st);
}

int main(int argc, char **argv)
{
    tu_cases(argc, argv);
    tu_watchdog(60);
    RUN_TEST(test_host_gather);
    RUN_TEST(test_open_without_device);
    return tu_done("test_cuda_hostpath");
}
