/* An application of an installed engram with its CUDA library:
 * tests/install/run.sh builds it with pkg-config and with
 * find_package(engram COMPONENTS cuda), against the shared and the static
 * library, and runs it.  It opens a store in the directory argv[1] and a
 * table, then a CUDA context; where there is a GPU it looks rows up into
 * device memory and checks them ("app_cuda: GPU lookup ok"), and where
 * there is none (no driver, no device) it prints the library's -ENODEV
 * message ("app_cuda: -ENODEV: no CUDA device: ...").  It calls the CUDA runtime itself, as an engine does, so
 * it links one (the shared runtime, or the static one that
 * libengram_cuda.a brings).  Exits 1 on any other outcome. */
#include <cuda_runtime_api.h>
#include <engram_cuda.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#define ROWS 5
#define ROW_BYTES 16

static int fail(const char *what, int rc)
{
    fprintf(stderr, "app_cuda: %s: %s (%d): %s\n", what, engram_strerror(rc), rc,
            engram_errmsg());
    return 1;
}

static int cuda_fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "app_cuda: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: app_cuda STORE_DIR\n");
        return 2;
    }
    engram_store_options opts = ENGRAM_STORE_OPTIONS_INIT;
    opts.flags = ENGRAM_OPEN_CREATE;
    engram_store *st;
    int rc = engram_store_open(argv[1], "install-test-cuda", &opts, &st);
    if (rc != 0)
        return fail("engram_store_open", rc);
    unsigned char rows[ROWS][ROW_BYTES];
    for (int r = 0; r < ROWS; r++)
        memset(rows[r], 3 * r + 1, ROW_BYTES);
    engram_table_spec spec = {ROWS, ROW_BYTES, 0};
    rc = engram_populate(st, "t", &spec, rows, 0);
    if (rc != 0 && rc != -EEXIST)
        return fail("engram_populate", rc);
    engram_table_id table;
    rc = engram_table_open(st, "t", &table);
    if (rc != 0)
        return fail("engram_table_open", rc);

    engram_cuda_ctx *ctx;
    rc = engram_cuda_open(st, NULL, &ctx);
    if (rc == -ENODEV) {
        printf("app_cuda: -ENODEV: %s\n", engram_errmsg());
        engram_store_close(st);
        return 0;
    }
    if (rc != 0)
        return fail("engram_cuda_open", rc);

    int64_t ids[3] = {4, 0, 2};
    unsigned char out[3][ROW_BYTES];
    void *d_ids = NULL, *d_out = NULL;
    cudaError_t e = cudaMalloc(&d_ids, sizeof ids);
    if (e == cudaSuccess)
        e = cudaMalloc(&d_out, sizeof out);
    if (e == cudaSuccess)
        e = cudaMemcpy(d_ids, ids, sizeof ids, cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
        return cuda_fail("cudaMalloc/cudaMemcpy", e);

    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    pa.num_cols = 1;
    pa.tables = &table;
    engram_cuda_lookup_args la = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    la.num_tokens = 3;
    la.ids = d_ids;
    la.id_type = ENGRAM_ID_INT64;
    la.out = d_out;
    rc = engram_cuda_lookup_tables(ctx, &pa, &la, 0);
    if (rc != 0)
        return fail("engram_cuda_lookup_tables", rc);
    e = cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost); /* waits for the lookup */
    if (e != cudaSuccess)
        return cuda_fail("cudaMemcpy", e);
    rc = engram_cuda_check(ctx, NULL);
    if (rc != 0)
        return fail("engram_cuda_check", rc);
    for (int t = 0; t < 3; t++)
        for (int b = 0; b < ROW_BYTES; b++)
            if (out[t][b] != 3 * ids[t] + 1) {
                fprintf(stderr, "app_cuda: out[%d][%d] = %d, expected %d\n", t, b, out[t][b],
                        (int)(3 * ids[t] + 1));
                return 1;
            }
    cudaFree(d_ids);
    cudaFree(d_out);
    engram_cuda_close(ctx);
    engram_store_close(st);
    printf("app_cuda: GPU lookup ok\n");
    return 0;
}
