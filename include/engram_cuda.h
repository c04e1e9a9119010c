/*
 * engram_cuda.h - the CUDA additions to libengram (library libengram_cuda).
 *
 * Rows of host-resident tables are gathered by a GPU kernel that reads them
 * over UVA (unified virtual addressing) straight into device memory, on the
 * caller's stream.  The pieces:
 *
 *  - A *context* (engram_cuda_open) ties a store to one CUDA device.
 *  - *Registration* (engram_cuda_register) makes a table readable by the
 *    GPU once: its memory is page-locked in place with cudaHostRegister
 *    (read-only, mapped), or, where that is refused, copied once into
 *    pinned memory (engram_cuda_get_stats() says which).  Tables without a base
 *    address (backends that read rows on demand) use the host path below.
 *  - A *plan* (engram_cuda_plan_create) fixes the columns of a lookup:
 *    tables (repeats allowed), offsets and the operation (plain gather or
 *    fused FP8 -> BF16 dequantisation).  Its column descriptors are
 *    uploaded to device memory once, at creation.
 *  - engram_cuda_lookup() launches the gather for a [T, K] batch of ids in
 *    device memory into device output.  It allocates nothing, synchronises
 *    nothing and copies no descriptors, so it may be captured in a CUDA
 *    graph and replayed with new ids written into the same id buffer.
 *  - engram_cuda_lookup_tables() does the same by tables and offsets: the
 *    context finds or creates the plan, keeps it until it closes, and
 *    gives host-path columns staging per stream that grows.
 *
 * Semantics follow engram_lookup() (engram.h) with one difference: ids
 * live on the GPU, so a bad id cannot fail the call.  The kernel skips it
 * (its output row is left untouched), counts it and keeps the first one
 * in a device word that engram_cuda_check() reads and clears; the option
 * ENGRAM_CUDA_DEBUG_SYNC instead synchronises after each lookup and fails
 * it at once.
 *
 * Host path: for a table whose rows are not addressable memory, a lookup
 * copies that column's ids to pinned host staging, runs engram_lookup() on
 * the CPU inside a cudaLaunchHostFunc node, and copies the rows back, all
 * on the stream: still graph-capturable, but bounded by plan max_tokens.
 *
 * Errors follow engram.h: negative codes, details in engram_errmsg().
 * Failures of the CUDA runtime give -EIO (or -ENOMEM / -ENODEV) with the
 * CUDA error's name in the message.  The caller must have the context's
 * device current when it calls engram_cuda_lookup(); the other functions
 * (engram_cuda_lookup_tables() included) select the device themselves and
 * restore the caller's.
 *
 * This header includes <cuda_runtime_api.h> for cudaStream_t; it compiles
 * as C and as C++.
 */
#ifndef ENGRAM_CUDA_H
#define ENGRAM_CUDA_H

#include <cuda_runtime_api.h>

#include "engram.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct engram_cuda_ctx engram_cuda_ctx;
typedef struct engram_cuda_plan engram_cuda_plan;

/* ------------------------------------------------------------------------
 * Contexts.
 */

/* engram_cuda_options.flags */
#define ENGRAM_CUDA_DEBUG_SYNC 0x0001u  /* each lookup synchronises its stream and returns
                                         * ENGRAM_EBADID at once (not graph-capturable) */
#define ENGRAM_CUDA_COPY_TABLES 0x0002u /* never register table memory in place: serve
                                         * every table from a pinned copy */

typedef struct engram_cuda_options {
    uint32_t size;      /* sizeof(engram_cuda_options) */
    uint32_t flags;     /* ENGRAM_CUDA_* */
    int device;         /* CUDA device ordinal; -1 = the device current at open */
    int background_sms; /* SMs a lookup with ENGRAM_CUDA_LOOKUP_BACKGROUND may occupy;
                         * 0 = a quarter of the device's SMs */
} engram_cuda_options;

#define ENGRAM_CUDA_OPTIONS_INIT {sizeof(engram_cuda_options), 0u, -1, 0}

/*! engram_cuda_open() :
 * Creates a context for store `st` on a CUDA device.  `opts` may be NULL.
 * The store must outlive the context.  Loads the kernels (see
 * engram_cuda_warmup()) and allocates the device-side bad-id report.
 * Close with engram_cuda_close().  Thread-safe.
 * @return : 0, -ENODEV ("no CUDA device": no driver or no device),
 *           -EINVAL, -ENOMEM, -EIO (other CUDA failures). */
ENGRAM_API int engram_cuda_open(engram_store *st, const engram_cuda_options *opts,
                                engram_cuda_ctx **out);

/*! engram_cuda_close() :
 * Destroys the context's remaining plans, unregisters its tables (and
 * frees their pinned copies) and frees the context.  Accepts NULL.  No
 * lookup of the context may still be running on the GPU: synchronise the
 * streams first.  Must not race with other calls on the context. */
ENGRAM_API void engram_cuda_close(engram_cuda_ctx *ctx);

/*! engram_cuda_warmup() :
 * Loads every kernel variant on the context's device by launching each
 * once with no work (under lazy module loading, CUDA_MODULE_LOADING=LAZY,
 * a launch is what certainly loads a kernel), so that a later lookup under
 * stream capture triggers no loading.  engram_cuda_open() does it, so a
 * context is always warm and a call returns at once; it stays for callers
 * that want to say so.  Thread-safe.
 * @return : 0 or -EIO. */
ENGRAM_API int engram_cuda_warmup(engram_cuda_ctx *ctx);

/* ------------------------------------------------------------------------
 * Registration.
 */

/* engram_cuda_table_mode() results */
#define ENGRAM_CUDA_TABLE_NONE 0   /* not registered with this context */
#define ENGRAM_CUDA_TABLE_MAPPED 1 /* read in place (cudaHostRegister of the table memory) */
#define ENGRAM_CUDA_TABLE_COPY 2   /* read from a pinned copy (registration was refused) */
#define ENGRAM_CUDA_TABLE_HOST 3   /* no base address: gathered on the CPU (host path) */

/*! engram_cuda_register() :
 * Makes table `id` readable by the context's GPU.  Memory-resident tables
 * are registered in place: the page-rounded range of the table memory is
 * page-locked with cudaHostRegister (mapped, read-only, portable), shared
 * with any other context of the process that registered the same range.
 * Where registration is refused (an overlapping foreign registration, no
 * read-only registration support, a file system that cannot be pinned) or
 * ENGRAM_CUDA_COPY_TABLES is set, the table is copied once into pinned
 * memory (2 MiB-aligned anonymous memory asked for huge pages, else
 * cudaHostAlloc).  Tables without a base address are noted for the host
 * path.  Registering a registered table is a no-op.  Plans register their
 * tables themselves.  Thread-safe.
 * @return : 0, -EINVAL (bad id), ENGRAM_EREMOVED, -ENOMEM or -EIO when
 *           neither registration nor a pinned copy worked. */
ENGRAM_API int engram_cuda_register(engram_cuda_ctx *ctx, engram_table_id id);

/*! engram_cuda_unregister() :
 * Undoes engram_cuda_register(): unregisters the range when no other
 * context uses it, or frees the pinned copy.  Thread-safe.
 * @return : 0, -ENOENT (not registered), ENGRAM_ESTATE (a plan of the
 *           context still uses the table: destroy it first). */
ENGRAM_API int engram_cuda_unregister(engram_cuda_ctx *ctx, engram_table_id id);

/*! engram_cuda_table_mode() :
 * @return : how the context reads table `id`: ENGRAM_CUDA_TABLE_NONE,
 *           _MAPPED, _COPY or _HOST; or -EINVAL.  Thread-safe. */
ENGRAM_API int engram_cuda_table_mode(engram_cuda_ctx *ctx, engram_table_id id);

/* ------------------------------------------------------------------------
 * Plans.
 */

/* engram_cuda_plan_args.op */
#define ENGRAM_CUDA_OP_GATHER 0 /* copy row_bytes bytes per row */
#define ENGRAM_CUDA_OP_DEQUANT_FP8 1 /* FP8 E4M3 x E8M0 block scales -> BF16, as
                                      * engram_dequant_fp8_e4m3_e8m0_ref() */

#define ENGRAM_CUDA_MAX_COLS (1u << 20)

typedef struct engram_cuda_plan_args {
    uint32_t size;                       /* sizeof(engram_cuda_plan_args) */
    uint32_t op;                         /* ENGRAM_CUDA_OP_* */
    size_t num_cols;                     /* K, 1 .. ENGRAM_CUDA_MAX_COLS */
    const engram_table_id *tables;       /* [K]; ids may repeat */
    const engram_table_id *scale_tables; /* DEQUANT_FP8 only: [K] planar scale tables (row i of
                                          * scale_tables[k] holds the scales of row i of
                                          * tables[k]); NULL = packed rows */
    const int64_t *offsets;              /* [K] or NULL (all 0) */
    size_t max_tokens;                   /* most tokens per lookup on the host path; only
                                          * needed when a table has no base address */
} engram_cuda_plan_args;

#define ENGRAM_CUDA_PLAN_ARGS_INIT {sizeof(engram_cuda_plan_args), 0u, 0, NULL, NULL, NULL, 0}

/*! engram_cuda_plan_create() :
 * Prepares the columns of later lookups: registers each table (as
 * engram_cuda_register()), checks that every table has the same row_bytes
 * and uploads the column descriptors (device address of row 0, rows,
 * pitch, offset) to device memory.  With a table on the host path it also
 * allocates the staging for max_tokens tokens (device and pinned host).
 *
 * DEQUANT_FP8 rows: packed, each row holds N FP8 values then N/32 scale
 * bytes (row_bytes = 33 * N / 32, e.g. 264 for N = 256); or planar, the
 * weights table rows hold N values and the scale table rows N/32 bytes.
 * N must be a multiple of 32.  The output row is N BF16 values (2N bytes).
 * Planar columns must be memory-resident (no host path).
 * Thread-safe.  The plan belongs to `ctx`; destroy it with
 * engram_cuda_plan_destroy() or let engram_cuda_close() do it.
 * @return : 0, -EINVAL, ENGRAM_ELAYOUT (row sizes differ or do not fit the
 *           op), ENGRAM_EREMOVED, -ENOTSUP (planar scales on the host path),
 *           -ENOMEM, -EIO. */
ENGRAM_API int engram_cuda_plan_create(engram_cuda_ctx *ctx, const engram_cuda_plan_args *args,
                                       engram_cuda_plan **out);

/*! engram_cuda_plan_destroy() :
 * Frees the plan's device descriptors and staging.  Accepts NULL.  No
 * lookup of the plan may still be running (or be captured in a graph that
 * will run).  Thread-safe with respect to other plans. */
ENGRAM_API void engram_cuda_plan_destroy(engram_cuda_plan *plan);

/*! engram_cuda_plan_out_row_bytes() :
 * @return : bytes one output row takes: row_bytes for a gather, 2N for a
 *           dequant plan. */
ENGRAM_API size_t engram_cuda_plan_out_row_bytes(const engram_cuda_plan *plan);

/* ------------------------------------------------------------------------
 * Lookups.
 */

/* engram_cuda_lookup_args.flags, besides ENGRAM_LOOKUP_ZERO_DEAD */
#define ENGRAM_CUDA_LOOKUP_BACKGROUND 0x0100u /* bound the grid to the context's background_sms
                                               * SMs, for a side-stream prefetch that must not
                                               * starve the model's kernels */

typedef struct engram_cuda_lookup_args {
    uint32_t size;          /* sizeof(engram_cuda_lookup_args) */
    uint32_t flags;         /* ENGRAM_LOOKUP_ZERO_DEAD, ENGRAM_CUDA_LOOKUP_BACKGROUND */
    size_t num_tokens;      /* T */
    const void *ids;        /* device memory: T x K ids of id_type */
    int id_type;            /* ENGRAM_ID_INT32 or ENGRAM_ID_INT64 */
    ptrdiff_t id_stride_t;  /* in elements; 0 with id_stride_k 0 = contiguous [T,K] */
    ptrdiff_t id_stride_k;  /* in elements */
    void *out;              /* device memory: output base */
    ptrdiff_t out_stride_t; /* in bytes; 0 with out_stride_k 0 = contiguous [T,K,out_row] */
    ptrdiff_t out_stride_k; /* in bytes */
} engram_cuda_lookup_args;

#define ENGRAM_CUDA_LOOKUP_ARGS_INIT \
    {sizeof(engram_cuda_lookup_args), 0u, 0, NULL, 0, 0, 0, NULL, 0, 0}

/*! engram_cuda_lookup() :
 * Enqueues the lookup of a [T, K] batch on `stream` (0 = the legacy default
 * stream): column k reads plan table k at row ids[t][k] - offsets[k] into
 * out + t * out_stride_t + k * out_stride_k.  ENGRAM_DEAD_ID (-1) leaves
 * the output row untouched, or zero-fills it with ENGRAM_LOOKUP_ZERO_DEAD.
 * Any other id outside its table (0 <= ids[t][k] - offsets[k] < num_rows,
 * the difference exact as in engram_lookup()) is skipped (its output row
 * untouched) and reported through engram_cuda_check().  Output rows must
 * not overlap (checked); dequant output must be 2-byte aligned.
 *
 * The arguments are checked on the host at once (no GPU work is enqueued on
 * an error).  The call allocates nothing, synchronises nothing and copies
 * no descriptors: capturable in a CUDA graph (replays read the ids present
 * in the id buffer when they run).  The host path adds a device-to-host id
 * copy, a host function and a host-to-device row copy on the same stream;
 * its staging is per plan, so lookups of one plan with host-path tables
 * must be ordered (same stream or events); threads may share that stream
 * (the plan holds a lock from its first enqueue to its launch).  Lookups
 * of plans without a host path may run concurrently on any streams.  The context's device
 * must be current (-EINVAL otherwise: a kernel on another device would
 * fault on this context's pointers).  Thread-safe.
 * @return : 0, -EINVAL, ENGRAM_ELAYOUT, ENGRAM_EBADID (DEBUG_SYNC only),
 *           -EIO (launch failure). */
ENGRAM_API int engram_cuda_lookup(engram_cuda_plan *plan, const engram_cuda_lookup_args *args,
                                  cudaStream_t stream);

/* ------------------------------------------------------------------------
 * Lookups by tables: the context keeps the plans.
 */

/* Tokens the host-path staging of a plan made by engram_cuda_lookup_tables()
 * holds at least, when engram_cuda_plan_args.max_tokens is 0. */
#define ENGRAM_CUDA_HOST_TOKENS 16384u
/* Streams that may have a host-path plan of one set of columns. */
#define ENGRAM_CUDA_HOST_STREAMS 16u

/*! engram_cuda_lookup_tables() :
 * engram_cuda_lookup() without plans to manage: enqueues the lookup `args`
 * on `stream` through the plan the context keeps for the columns `cols`
 * (op, tables, scale_tables and offsets; NULL offsets and all-zero offsets
 * are the same columns), creating it (engram_cuda_plan_create()) the first
 * time.  The plans are kept until engram_cuda_close() (stats.plans counts
 * them) and keep their tables registered (engram_cuda_unregister() refuses
 * them); the caller never sees or destroys them.
 *
 * Host path (columns whose table has no base address: file-cache and
 * safetensors tables, tables of engram_add_source()): a plan's staging
 * serves one stream, so such columns get one plan per stream, for at most
 * ENGRAM_CUDA_HOST_STREAMS streams (ENGRAM_ESTATE after that, nothing
 * created).  Its staging holds cols->max_tokens tokens (0:
 * ENGRAM_CUDA_HOST_TOKENS), or the lookup's num_tokens if more; a later
 * lookup of more tokens than that replaces the stream's plan by one whose
 * staging holds at least twice as many.  The replaced plan is retired, not
 * destroyed, because another thread may be enqueueing a lookup with it; it
 * is freed by engram_cuda_close().  cudaStreamPerThread is refused for such
 * columns (-EINVAL): it is another stream in each thread, so no staging
 * could be kept for it; pass an explicit stream (0, the legacy default
 * stream, is one stream and is accepted).  Threads may share a stream, as
 * with engram_cuda_lookup().  Other columns get one plan for all streams.
 *
 * Device: the call makes the context's device current for the lookup and
 * restores the caller's; unlike engram_cuda_lookup(), the caller need not.
 *
 * Capture: creating a plan and growing its staging allocate and upload,
 * which a capture forbids, so while `stream` is being captured the first
 * lookup of a set of columns (on this stream, on the host path) and a
 * lookup that would grow the staging are refused with ENGRAM_ESTATE and
 * nothing is enqueued.  Run one such lookup before the capture (a warm-up;
 * num_tokens = 0 only creates the plan, for `stream` on the host path, and
 * enqueues nothing, so ids and out may be NULL then).  A lookup that finds
 * its plan is captured like engram_cuda_lookup().  Plan creation runs in
 * relaxed capture mode, so captures on other streams are not disturbed.
 *
 * Thread-safe.  A lock of the context guards the table of plans; it is
 * held only to find a plan or to insert or replace one, never while a plan
 * is created nor across the launch, so lookups of any threads proceed in
 * parallel.  Threads that miss the same columns at once may each create a
 * plan: the first one inserted is kept and the others are destroyed.
 * @return : 0, -EINVAL, ENGRAM_ESTATE, ENGRAM_ELAYOUT, ENGRAM_EREMOVED,
 *           -ENOTSUP, -ENOMEM, -EIO (as engram_cuda_plan_create() and
 *           engram_cuda_lookup()), ENGRAM_EBADID (DEBUG_SYNC only). */
ENGRAM_API int engram_cuda_lookup_tables(engram_cuda_ctx *ctx, const engram_cuda_plan_args *cols,
                                         const engram_cuda_lookup_args *args,
                                         cudaStream_t stream);

/*! engram_cuda_order_after() :
 * Makes the work enqueued on `stream` after this call wait for the work
 * enqueued on `producer` so far (the producer of the ids, say): an event of
 * the context is recorded on `producer` and waited for on `stream`.  0 and
 * cudaStreamLegacy are the legacy default stream; a stream is never made to
 * wait for itself.  Both streams must belong to the context's device, which
 * the call makes current itself.  Under stream capture:
 *  - `stream` captured, `producer` not: the producer's work was enqueued
 *    before the capture began, and a capture cannot wait for an event
 *    recorded outside it: nothing to do (0).
 *  - `producer` captured, `stream` not: waiting would pull `stream` into
 *    the producer's graph (whose capture would then fail, unjoined):
 *    ENGRAM_ESTATE.
 *  - `producer` is the legacy default stream while a blocking stream is
 *    being captured: the legacy stream cannot be used then (recording on
 *    it would invalidate that capture): 0 if `stream` is captured (as
 *    above), else ENGRAM_ESTATE.
 * Thread-safe: the record and the wait are made under a lock of the
 * context, so concurrent calls do not wait for each other's records.
 * Capturable where the rules above allow it.
 * @return : 0, ENGRAM_ESTATE, -EINVAL, -ENOMEM, -EIO. */
ENGRAM_API int engram_cuda_order_after(engram_cuda_ctx *ctx, cudaStream_t stream,
                                       cudaStream_t producer);

/* ------------------------------------------------------------------------
 * Bad ids and statistics.
 */
typedef struct engram_cuda_report {
    uint32_t size;             /* sizeof(engram_cuda_report) */
    uint32_t first_col;        /* column of the first bad id (ENGRAM_CUDA_NO_FIRST: see below) */
    uint64_t bad_ids;          /* bad ids skipped since the last check */
    uint64_t first_token;      /* token of the first bad id: the smallest (token, column) */
    int64_t first_id;          /* its value as passed (before the offset) */
    engram_table_id first_table; /* its column's table */
    int host_error;            /* first error of a host-path gather since the last check, or 0 */
} engram_cuda_report;

#define ENGRAM_CUDA_REPORT_INIT {sizeof(engram_cuda_report), 0u, 0, 0, 0, 0u, 0}
/* first_col when bad ids were counted but the first of them is not known
 * yet (a check that raced a lookup: the next check reports it). */
#define ENGRAM_CUDA_NO_FIRST 0xffffffffu

/*! engram_cuda_check() :
 * Reads and clears the context's bad-id report (atomically with respect to
 * running lookups).  Call it after synchronising with the lookups to
 * check.  Of all bad ids since the last check, the one with the smallest
 * (token, column) is reported, whatever the order the GPU ran them in.
 * `report` may be NULL.  Thread-safe.
 * @return : 0 if there was none, ENGRAM_EBADID with the first in
 *           engram_errmsg(), the host path's error, or -EIO. */
ENGRAM_API int engram_cuda_check(engram_cuda_ctx *ctx, engram_cuda_report *report);

typedef struct engram_cuda_stats {
    uint32_t size;          /* sizeof(engram_cuda_stats) */
    int device;             /* the context's device */
    uint64_t tables_mapped; /* tables read in place */
    uint64_t tables_copied; /* tables read from a pinned copy */
    uint64_t tables_host;   /* tables on the host path */
    uint64_t mapped_bytes;  /* bytes of table data read in place */
    uint64_t copied_bytes;  /* bytes of pinned copies */
    uint64_t copy_huge;     /* pinned copies in huge-page-advised memory (the rest: cudaHostAlloc) */
    uint64_t plans;         /* live plans */
    uint64_t lookups;       /* engram_cuda_lookup() calls (graph replays are not calls) */
    uint64_t host_gathers;  /* host-path gathers run, graph replays included */
} engram_cuda_stats;

#define ENGRAM_CUDA_STATS_INIT {sizeof(engram_cuda_stats), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/*! engram_cuda_get_stats() :
 * Fills *stats (stats->size must be set).  Thread-safe.
 * @return : 0 or -EINVAL. */
ENGRAM_API int engram_cuda_get_stats(engram_cuda_ctx *ctx, engram_cuda_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* ENGRAM_CUDA_H */
