/*
 * cuda_internal.h - the seam between the host code of libengram_cuda (C11:
 * ctx.c, plan.c, hostpath.c) and its kernels (kernels.cu) (internal).
 *
 * The host side validates everything and resolves every choice that can
 * be made once (alignment, vector widths, lanes per row, grid bounds) into
 * an engram__cuda_launch of scalars and device pointers; the kernels only
 * read it.  The structs here are plain data with the same layout in C and
 * C++.  Launch functions return a cudaError_t as int.
 *
 * Column descriptors live in device memory, written once when a plan is
 * created.  A host-path column reads row t of the plan's device staging
 * (rows were copied there by the host function) instead of row id; its
 * ids are still checked against the table so bad ids are reported the same
 * way on both paths.
 */
#ifndef ENGRAM_CUDA_INTERNAL_H
#define ENGRAM_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Key of "no bad id yet" in engram__cuda_bad.key. */
#define ENGRAM__CUDA_NO_BAD (~0ull)
/* A bad id's key: token in the high bits, column in the low 20 bits, so
 * the smallest key is the first (token, column). */
#define ENGRAM__CUDA_COL_BITS 20

/* The device-side bad-id report of a context. */
typedef struct engram__cuda_bad {
    unsigned long long count; /* bad ids since the last take */
    unsigned long long key;   /* smallest key seen, or ENGRAM__CUDA_NO_BAD */
    long long value;          /* the id at `key` */
    unsigned int table;       /* its column's table id */
    int lock;                 /* guards (key, value, table) updates */
} engram__cuda_bad;

/* One column of a plan, in device memory. */
typedef struct engram__cuda_col {
    const unsigned char *base;  /* device address of row 0 (host path: staging of this column) */
    const unsigned char *sbase; /* planar dequant: scale table row 0; else NULL */
    uint64_t span;              /* the ids the column accepts, from off on (src/ids.h) */
    int64_t off;                /* offsets[k] */
    uint64_t pitch;             /* bytes between rows (host path: between tokens) */
    uint64_t spitch;            /* bytes between scale rows */
    uint32_t table;             /* table id, for the report */
    uint32_t by_token;          /* 1: host-path column, read row t of the staging */
} engram__cuda_col;

/* Everything a gather or dequant launch needs. */
typedef struct engram__cuda_launch {
    const engram__cuda_col *cols; /* [K], device */
    engram__cuda_bad *bad;        /* device */
    const void *ids;              /* device */
    unsigned char *out;           /* device */
    ptrdiff_t ist, isk;           /* id strides, elements */
    ptrdiff_t ost, osk;           /* output strides, bytes */
    uint64_t T;
    uint32_t K;
    uint32_t R;         /* gather: bytes per row; dequant: values per row (N) */
    uint32_t lanes;     /* threads per row: a power of two, 1..32 */
    uint32_t load_w;    /* gather: load width (1, 2, 4, 8, 16); dequant: 8 = vector loads */
    uint32_t store_w;   /* gather: store width <= load_w; dequant: 16 = vector stores */
    uint32_t block;     /* threads per block: 256, or 1024 in background mode */
    uint32_t max_blocks;
    int id64;
    int zero_dead;
    int planar; /* dequant: scales from cols[k].sbase */
} engram__cuda_launch;

int engram__cuda_launch_gather(const engram__cuda_launch *L, cudaStream_t s);
int engram__cuda_launch_dequant(const engram__cuda_launch *L, cudaStream_t s);
/* Packs ids[t][cols[j]] (any id type and strides) as int64 into dst[t][j]
 * for the host path. */
int engram__cuda_launch_pack_ids(const void *ids, int id64, ptrdiff_t ist, ptrdiff_t isk,
                                 uint64_t T, const uint32_t *cols, uint32_t ncols, int64_t *dst,
                                 cudaStream_t s);
/* Moves the report at `bad` into `snap` and resets it, atomically with
 * respect to running kernels. */
int engram__cuda_launch_take_bad(engram__cuda_bad *bad, engram__cuda_bad *snap, cudaStream_t s);
/* Resets a fresh report. */
int engram__cuda_launch_init_bad(engram__cuda_bad *bad, cudaStream_t s);
/* Loads every kernel variant on the current device by launching each on
 * `s` with no work (no lazy loading later, e.g. under stream capture). */
int engram__cuda_preload(cudaStream_t s);

/* ------------------------------------------------------------------------
 * Host path, the CPU part (hostpath.c).  Testable without a GPU: it only
 * reads and writes host memory through the core library.
 */
typedef struct engram__cuda_host {
    struct engram_store *store;
    size_t K;                 /* host-path columns */
    const uint32_t *tables;   /* [K] table ids */
    const int64_t *offsets;   /* [K] */
    const uint64_t *spans;    /* [K] the ids each column accepts (src/ids.h) */
    uint32_t row_bytes;
    int64_t *ids;             /* [max_T][K] pinned staging; bad ids are rewritten to -1 */
    unsigned char *rows;      /* [max_T][K][row_bytes] pinned staging */
    /* Error sink (the context's): the first failure is kept. */
    int (*on_error)(void *ud, int code, const char *msg);
    void *ud;
} engram__cuda_host;

/* Gathers T tokens of staged ids into the row staging on the CPU.  Bad ids
 * become dead (the kernel reports them from the device copy of the ids);
 * dead rows are left as they are (the kernel skips or zero-fills their
 * output).  Returns the engram_lookup() code, also passed to on_error. */
int engram__cuda_host_gather(const engram__cuda_host *h, size_t T);

#ifdef __cplusplus
}
#endif

#endif
