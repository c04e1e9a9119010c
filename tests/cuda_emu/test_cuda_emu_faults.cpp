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

int main(void)
{
    tu_watchdog(120);
    test_copy_when_registration_fails();
    test_too_big_to_copy();
    printf("test_cuda_emu_faults: ok\n");
    return 0;
}
