/*
 * test_cuda_emu_faults.cpp - libengram_cuda when the runtime refuses, on
 * the host emulation (tests/cuda_emu), which can refuse on demand.
 *
 * cudaHostRegister fails past the memlock limit (RLIMIT_MEMLOCK, often
 * small in containers).  A table that cannot be registered in place is
 * served from a pinned copy if it fits: the lookups stay exact and the
 * stats say so.  One too big to copy (more than half the memory
 * available) is refused with an error that names the likely cause,
 * before anything is allocated or touched.
 */
#include <sys/mman.h>

#include "testutil.h"

extern "C" {
#include "common.h"
}
#include "emu_device.h"
#include "engram_cuda.h"

#define CK(call) ASSERT_EQ((int)(call), (int)cudaSuccess)

enum { ROWS = 1000, R = 264, T = 64 };

static void test_copy_when_registration_fails(void)
{
    engram_table_spec spec = {ROWS, R, 0};
    unsigned char *mem = (unsigned char *)tu_xmalloc((size_t)ROWS * R), *got, *dout;
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_lookup_args la = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    engram_cuda_stats stats = ENGRAM_CUDA_STATS_INIT;
    engram_cuda_plan *plan;
    engram_cuda_ctx *ctx;
    engram_store *st;
    engram_table_id id;
    int64_t ids[T], *dids;
    uint64_t rng = 7;

    tu_current_case = "a table that cannot be registered is served from a pinned copy";
    for (size_t i = 0; i < (size_t)ROWS * R; i++)
        mem[i] = (unsigned char)(i * 131 + 7);
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_OK(engram_bind(st, "t", &spec, mem));
    ASSERT_OK(engram_table_open(st, "t", &id));
    ASSERT_OK(engram_cuda_open(st, NULL, &ctx));
    emu_fail_host_register(1);
    pa.num_cols = 1;
    pa.tables = &id;
    ASSERT_OK(engram_cuda_plan_create(ctx, &pa, &plan));
    emu_fail_host_register(0);
    ASSERT_OK(engram_cuda_get_stats(ctx, &stats));
    ASSERT_EQ_U64(stats.tables_copied, 1);
    ASSERT_EQ_U64(stats.tables_mapped, 0);

    for (int t = 0; t < T; t++)
        ids[t] = (int64_t)tu_rand_below(&rng, ROWS);
    CK(cudaMalloc((void **)&dids, sizeof ids));
    CK(cudaMalloc((void **)&dout, (size_t)T * R));
    CK(cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    la.num_tokens = T;
    la.ids = dids;
    la.id_type = ENGRAM_ID_INT64;
    la.out = dout;
    ASSERT_OK(engram_cuda_lookup(plan, &la, 0));
    got = (unsigned char *)tu_xmalloc((size_t)T * R);
    CK(cudaMemcpy(got, dout, (size_t)T * R, cudaMemcpyDeviceToHost));
    for (int t = 0; t < T; t++)
        ASSERT(memcmp(got + (size_t)t * R, mem + (size_t)ids[t] * R, R) == 0);
    ASSERT_OK(engram_cuda_check(ctx, NULL));

    engram_cuda_plan_destroy(plan);
    engram_cuda_close(ctx);
    engram_store_close(st);
    CK(cudaFree(dids));
    CK(cudaFree(dout));
    free(got);
    free(mem);
}

/* Resident memory of this process, bytes. */
static uint64_t rss(void)
{
    unsigned long long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    ASSERT(f != NULL);
    ASSERT(fscanf(f, "%llu %llu", &pages, &res) == 2);
    fclose(f);
    return res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static void test_too_big_to_copy(void)
{
    /* 1 TiB of address space, never touched: more than any host here. */
    const uint64_t rows = ((uint64_t)1 << 40) / R;
    engram_table_spec spec = {rows, R, 0};
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_stats stats = ENGRAM_CUDA_STATS_INIT;
    engram_cuda_plan *plan = NULL;
    engram_cuda_ctx *ctx;
    engram_store *st;
    engram_table_id id;
    uint64_t before;
    void *mem = mmap(NULL, rows * R, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

    tu_current_case = "a table too big to copy is refused, with the likely cause";
    ASSERT(mem != MAP_FAILED);
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_OK(engram_bind(st, "huge", &spec, mem));
    ASSERT_OK(engram_table_open(st, "huge", &id));
    ASSERT_OK(engram_cuda_open(st, NULL, &ctx));
    before = rss();
    emu_fail_host_register(1);
    pa.num_cols = 1;
    pa.tables = &id;
    ASSERT_ERR(engram_cuda_plan_create(ctx, &pa, &plan), -ENOMEM);
    emu_fail_host_register(0);
    ASSERT(plan == NULL);
    ASSERT_CONTAINS(engram_errmsg(), "memlock");
    ASSERT_CONTAINS(engram_errmsg(), "more than half");
    ASSERT(rss() < before + ((uint64_t)64 << 20)); /* nothing was copied */
    ASSERT_OK(engram_cuda_get_stats(ctx, &stats));
    ASSERT_EQ_U64(stats.tables_copied + stats.tables_mapped, 0);
    /* Once registration works again, the same table is read in place. */
    ASSERT_OK(engram_cuda_plan_create(ctx, &pa, &plan));
    ASSERT_OK(engram_cuda_get_stats(ctx, &stats));
    ASSERT_EQ_U64(stats.tables_mapped, 1);
    engram_cuda_plan_destroy(plan);
    engram_cuda_close(ctx);
    engram_store_close(st);
    munmap(mem, rows * R);
}

/* ------------------------------------------------------------------------
 * Every runtime call failing in turn.
 *
 * One scenario (open a context, make a plan with a mapped column and a
 * host-path column, look up in debug mode, check, destroy, close) is run
 * again and again, the n-th runtime call that can fail failing in run n,
 * until a run meets no failure.  Each run must either succeed with exact
 * rows (the library may step around a failure, e.g. a refused registration
 * becomes a copy) or return an error with a message, and in both cases
 * leave no device or pinned block, registration, stream or event behind.
 */
enum { FT = 40 };

static const unsigned char *fault_mem;

/* A scenario's context, in debug mode (each lookup syncs and checks: no
 * test-side calls), and its args: both columns, FT tokens. */
static int fault_open(engram_store *st, engram_cuda_ctx **ctx, const engram_table_id *ids2,
                      const int64_t *dids, unsigned char *dout, engram_cuda_plan_args *pa,
                      engram_cuda_lookup_args *la)
{
    engram_cuda_options o = ENGRAM_CUDA_OPTIONS_INIT;
    int rc;
    pa->num_cols = 2;
    pa->tables = ids2;
    pa->max_tokens = FT;
    la->num_tokens = FT;
    la->ids = dids;
    la->id_type = ENGRAM_ID_INT64;
    la->out = dout;
    o.flags = ENGRAM_CUDA_DEBUG_SYNC;
    *ctx = NULL;
    if ((rc = engram_cuda_open(st, &o, ctx)) != 0)
        ASSERT(*ctx == NULL);
    return rc;
}

static int scenario(engram_store *st, const engram_table_id *ids2, const int64_t *dids,
                    unsigned char *dout)
{
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_lookup_args la = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    engram_cuda_ctx *ctx;
    engram_cuda_plan *plan = NULL;
    int rc;

    if ((rc = fault_open(st, &ctx, ids2, dids, dout, &pa, &la)) != 0)
        return rc;
    if ((rc = engram_cuda_plan_create(ctx, &pa, &plan)) != 0) {
        ASSERT(plan == NULL);
        goto out;
    }
    if ((rc = engram_cuda_lookup(plan, &la, 0)) != 0)
        goto out;
    rc = engram_cuda_check(ctx, NULL);
out:
    engram_cuda_plan_destroy(plan);
    engram_cuda_close(ctx);
    return rc;
}

/* The same for lookups by tables: the first lookup makes the plan (staging
 * for half the tokens), after ordering the stream after a producer stream;
 * the second, of all the tokens, grows it (the first plan retired). */
static cudaStream_t fault_producer, fault_stream;

static int scenario_tables(engram_store *st, const engram_table_id *ids2, const int64_t *dids,
                           unsigned char *dout)
{
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_lookup_args la = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    engram_cuda_ctx *ctx;
    int rc;

    if ((rc = fault_open(st, &ctx, ids2, dids, dout, &pa, &la)) != 0)
        return rc;
    pa.max_tokens = la.num_tokens = FT / 2;
    if ((rc = engram_cuda_order_after(ctx, fault_stream, fault_producer)) != 0 ||
        (rc = engram_cuda_lookup_tables(ctx, &pa, &la, fault_stream)) != 0)
        goto out;
    la.num_tokens = FT;
    if ((rc = engram_cuda_lookup_tables(ctx, &pa, &la, fault_stream)) != 0)
        goto out;
    rc = engram_cuda_check(ctx, NULL);
out:
    engram_cuda_close(ctx); /* the plans, retired or not, and the event */
    return rc;
}

typedef int (*scenario_fn)(engram_store *, const engram_table_id *, const int64_t *,
                           unsigned char *);

static void test_every_call_failing(const char *name, scenario_fn scenario)
{
    engram_table_spec spec = {ROWS, R, 0};
    engram_store *st;
    engram_table_id tid[2];
    int64_t ids[FT][2], *dids;
    unsigned char *dout, *got = (unsigned char *)tu_xmalloc((size_t)FT * 2 * R);
    unsigned char *mem = (unsigned char *)tu_xmalloc((size_t)ROWS * R);
    uint64_t rng = 99;
    long base, n, failures = 0, stepped_around = 0;

    tu_current_case = name;
    for (size_t i = 0; i < (size_t)ROWS * R; i++)
        mem[i] = (unsigned char)(i * 37 + 1);
    fault_mem = mem;
    /* Column 0: bound memory (registered in place); column 1: a table file
     * behind the row cache (no base address: the host path). */
    static int runs;
    char ns[32];
    snprintf(ns, sizeof ns, "faults%d", runs++); /* a namespace per run */
    {
        engram_store *w = tu_open(ns, 0, 1);
        tu_populate(w, "f", 5, ROWS, R, R);
        engram_store_close(w);
    }
    st = tu_open(ns, ENGRAM_OPEN_FILE_CACHE, 1);
    ASSERT_OK(engram_bind(st, "m", &spec, mem));
    ASSERT_OK(engram_table_open(st, "m", &tid[0]));
    ASSERT_OK(engram_table_open(st, "f", &tid[1]));
    for (int t = 0; t < FT; t++) {
        ids[t][0] = (int64_t)tu_rand_below(&rng, ROWS);
        ids[t][1] = (int64_t)tu_rand_below(&rng, ROWS);
    }
    CK(cudaMalloc((void **)&dids, sizeof ids));
    CK(cudaMalloc((void **)&dout, (size_t)FT * 2 * R));
    CK(cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&fault_producer, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&fault_stream, cudaStreamNonBlocking));
    CK(cudaDeviceSynchronize());
    base = emu_live_objects();

    for (n = 1;; n++) {
        int rc, failed;
        ASSERT(n < 10000);
        CK(cudaMemset(dout, 0, (size_t)FT * 2 * R));
        CK(cudaDeviceSynchronize());
        emu_fail_nth_call(n);
        rc = scenario(st, tid, dids, dout);
        failed = emu_failed();
        emu_fail_nth_call(0);
        if (emu_live_objects() != base) {
            fprintf(stderr, "FAIL [%s]: with call %ld failing (rc %d: %s), %ld runtime objects "
                            "were left behind\n", tu_current_case, n, rc, engram_errmsg(),
                    emu_live_objects() - base);
            tu_fail_exit();
        }
        if (rc != 0) {
            ASSERT(failed); /* no error without a cause */
            ASSERT(rc < 0);
            ASSERT(engram_errmsg()[0] != '\0');
            failures++;
            continue;
        }
        /* Success, whether or not a call failed on the way: exact rows. */
        CK(cudaMemcpy(got, dout, (size_t)FT * 2 * R, cudaMemcpyDeviceToHost));
        for (int t = 0; t < FT; t++) {
            ASSERT(memcmp(got + ((size_t)t * 2) * R, mem + (size_t)ids[t][0] * R, R) == 0);
            ASSERT(tu_row_mismatch(got + ((size_t)t * 2 + 1) * R, 5, (uint64_t)ids[t][1], R) ==
                   -1);
        }
        if (!failed)
            break; /* every failable call of the scenario has been failed once */
        stepped_around++;
    }
    printf("test_cuda_emu_faults: %s: %ld runtime calls failed in turn: %ld errors, %ld "
           "stepped around\n", name, n - 1, failures, stepped_around);
    ASSERT(failures > 10);
    CK(cudaStreamDestroy(fault_producer));
    CK(cudaStreamDestroy(fault_stream));
    CK(cudaFree(dids));
    CK(cudaFree(dout));
    engram_store_close(st);
    free(got);
    free(mem);
}

int main(void)
{
    tu_watchdog(120);
    test_copy_when_registration_fails();
    test_too_big_to_copy();
    test_every_call_failing("every runtime call failing in turn: a plan", scenario);
    test_every_call_failing("every runtime call failing in turn: lookups by tables",
                            scenario_tables);
    printf("test_cuda_emu_faults: ok\n");
    return 0;
}
