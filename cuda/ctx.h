/*
 * ctx.h - the context and plan objects of libengram_cuda, shared by ctx.c
 * (contexts, registration, reports, stats), plan.c (plans, lookups) and
 * plancache.c (lookups by tables: the plans a context keeps) (internal, C
 * only).
 *
 * Locking: ctx->lock serialises registration, plan creation and
 * destruction and the table array.  Lookups take no lock: a plan is
 * immutable once created, and the counters are relaxed atomics.  The plan
 * cache has locks of its own (plancache.h), never held while ctx->lock is
 * taken.
 */
#ifndef ENGRAM_CUDA_CTX_H
#define ENGRAM_CUDA_CTX_H

#include <pthread.h>
#include <stdatomic.h>

#include "common.h"
#include "plancache.h"
#include "cuda_internal.h"
#include "engram_cuda.h"
#include "internal.h"

typedef struct engram__cuda_reg engram__cuda_reg;

/* How a context reads one table. */
typedef struct engram__cuda_table {
    int mode;                  /* ENGRAM_CUDA_TABLE_* */
    engram_table_spec spec;    /* row_pitch resolved */
    const unsigned char *host; /* row 0 in host memory; NULL on the host path */
    const unsigned char *dev;  /* device address of row 0 (MAPPED, COPY) */
    size_t bytes;              /* (num_rows - 1) * pitch + row_bytes: what rows span */
    engram__cuda_reg *reg;     /* MAPPED: the shared registration */
    void *copy;                /* COPY: the pinned copy */
    size_t copy_len;
    int copy_huge;             /* 1: our mmap + cudaHostRegister; 0: cudaHostAlloc */
    uint32_t plans;            /* columns of live plans that read the table */
} engram__cuda_table;

struct engram_cuda_ctx {
    engram_store *st;
    uint32_t flags;
    int device;
    int sms;
    unsigned max_blocks;       /* blocks of 256 threads resident on the whole device */
    unsigned background_sms;
    pthread_mutex_t lock;
    engram__cuda_table *tables; /* indexed by table id */
    size_t ntables;             /* entries of `tables` */
    engram__cuda_bad *bad;      /* device: the bad-id report */
    engram__cuda_bad *bad_snap; /* device: where engram_cuda_check() takes it to */
    cudaStream_t stream;        /* internal, non-blocking: checks, descriptor uploads */
    /* Serialises engram_cuda_check(): bad_snap is one buffer, so two checks
     * whose take kernels and copies interleave on `stream` would both read
     * the second take and lose the first. */
    pthread_mutex_t check_lock;
    struct engram_cuda_plan *plans; /* live plans (doubly linked) */
    uint64_t nplans;
    _Atomic uint64_t lookups, host_gathers;
    atomic_int warm; /* every kernel variant has been launched on the device */
    /* The host path's first error since the last check. */
    pthread_mutex_t err_lock;
    int host_err;
    char host_msg[512];
    engram__cuda_plancache plancache; /* engram_cuda_lookup_tables()'s plans (plancache.c) */
};

/* Records failure `code` with a formatted message and returns `code`, as
 * engram__err() does inside libengram: the message is libengram's
 * per-thread one (engram_errmsg()), reached, as everything of libengram
 * is from here, through its internal interface (internal.h). */
int engram__cuda_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records a CUDA failure like engram__cuda_fail(): -ENOMEM, -ENODEV or -EIO with
 * "<what>: <cuda error name> (<text>)"; clears the runtime's last error. */
int engram__cuda_err(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What engram__cuda_enter() changed, for engram__cuda_leave() to undo. */
typedef struct engram__cuda_scope {
    int device;  /* the caller's current device */
    int mode;    /* the caller's stream capture mode */
    int entered; /* 1: the two were switched */
} engram__cuda_scope;

/* Makes the context's device current and the thread's stream capture mode
 * relaxed, for the setup calls of the API (not lookups); leave restores
 * both.  leave is a no-op after a failed enter. */
int engram__cuda_enter(const engram_cuda_ctx *c, engram__cuda_scope *s);
void engram__cuda_leave(const engram_cuda_ctx *c, const engram__cuda_scope *s);

/* engram_cuda_register() with ctx->lock held; *t receives the entry. */
int engram__cuda_register_locked(engram_cuda_ctx *c, engram_table_id id, engram__cuda_table **t);

/* Destroys a plan with ctx->lock held and the device current. */
void engram__cuda_plan_free_locked(struct engram_cuda_plan *p);

/* The checks of engram_cuda_plan_create() on its args alone (`fn` names
 * the caller in the message): 0 or -EINVAL. */
int engram__cuda_plan_args_check(const engram_cuda_plan_args *a, const char *fn);

/* engram_cuda_lookup() once the context's device is known to be current. */
int engram__cuda_lookup_current(struct engram_cuda_plan *p, const engram_cuda_lookup_args *a,
                                cudaStream_t stream);

/* The host path's error sink (engram__cuda_host.on_error). */
int engram__cuda_host_error(void *ud, int code, const char *msg);

#endif
