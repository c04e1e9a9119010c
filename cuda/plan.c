/*
 * plan.c - plans (columns prepared once) and the stream lookup.
 *
 * Everything a lookup can decide once is decided at plan creation: each
 * column's device address, rows, pitch and offset are uploaded to device
 * memory, and the load alignment common to all columns is computed.  A
 * lookup then only checks its arguments on the host, derives the store
 * alignment from the output address and strides, and launches one kernel
 * whose arguments are scalars and the resident descriptor pointer: no
 * allocation, no synchronisation, no host-to-device descriptor copy, so
 * the call can be captured in a CUDA graph.
 *
 * The host path (tables without a base address) adds, before the kernel:
 * a kernel packing those columns' ids into device staging, an async copy
 * of them to pinned host staging, a host function gathering the rows on
 * the CPU into pinned staging, and an async copy of the rows to device
 * staging, which the main kernel reads as row t of the column.  The host
 * function's argument must not change per call (a captured graph keeps
 * it), so the plan preallocates one argument per possible T.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "ids.h"

typedef struct host_slot {
    struct engram_cuda_plan *p;
    size_t T;
} host_slot;

struct engram_cuda_plan {
    engram_cuda_ctx *ctx;
    struct engram_cuda_plan *prev, *next;
    uint32_t op;
    uint32_t K;
    uint32_t R;      /* row_bytes of the tables */
    uint32_t N;      /* dequant: values per row */
    uint32_t out_R;  /* output bytes per row */
    uint32_t in_align;
    int planar;
    int linked; /* in ctx->plans, holding references on its tables */
    engram_table_id *tables;  /* [K] */
    engram_table_id *scales;  /* [K] or NULL */
    engram__cuda_col *d_cols; /* [K], device */
    /* Host path. */
    uint32_t Kh;
    size_t max_T;
    uint32_t *d_hcols;      /* [Kh] plan columns on the host path, device */
    int64_t *d_hids;        /* [max_T][Kh], device */
    unsigned char *d_hrows; /* [max_T][Kh][R], device */
    int64_t *h_ids;         /* pinned */
    unsigned char *h_rows;  /* pinned */
    uint32_t *h_tables;
    int64_t *h_offsets;
    uint64_t *h_spans;
    engram__cuda_host host;
    host_slot *slots; /* [max_T + 1] */
    /* Held from the host path's first enqueue to the kernel's launch: two
     * threads' lookups on one stream would otherwise interleave their
     * five operations, and one would copy out the other's staging. */
    pthread_mutex_t host_lock;
};

/* The largest power of two <= 16 dividing v (16 for 0). */
static uint32_t align_of(uint64_t v)
{
    uint32_t a = 16;
    while (a > 1 && (v & (a - 1)))
        a >>= 1;
    return a;
}

static uint32_t lanes_for(uint32_t units)
{
    uint32_t l = 1;
    while (l < units && l < 32)
        l <<= 1;
    return l;
}

static void refs_drop(engram_cuda_ctx *c, const engram_table_id *ids, size_t n)
{
    for (size_t k = 0; ids && k < n; k++)
        if (ids[k] < c->ntables && c->tables[ids[k]].plans)
            c->tables[ids[k]].plans--;
}

void engram__cuda_plan_free_locked(struct engram_cuda_plan *p)
{
    engram_cuda_ctx *c = p->ctx;
    if (p->linked) {
        if (p->prev)
            p->prev->next = p->next;
        else
            c->plans = p->next;
        if (p->next)
            p->next->prev = p->prev;
        c->nplans--;
        refs_drop(c, p->tables, p->K);
        refs_drop(c, p->scales, p->K);
    }
    (void)cudaFree(p->d_cols);
    (void)cudaFree(p->d_hcols);
    (void)cudaFree(p->d_hids);
    (void)cudaFree(p->d_hrows);
    (void)cudaFreeHost(p->h_ids);
    (void)cudaFreeHost(p->h_rows);
    free(p->h_tables);
    free(p->h_offsets);
    free(p->h_spans);
    free(p->slots);
    pthread_mutex_destroy(&p->host_lock);
    free(p->tables);
    free(p->scales);
    free(p);
}

void engram_cuda_plan_destroy(engram_cuda_plan *p)
{
    engram_cuda_ctx *c;
    engram__cuda_scope prev;
    if (!p)
        return;
    c = p->ctx;
    (void)engram__cuda_enter(c, &prev); /* destroy anyway: frees still free */
    pthread_mutex_lock(&c->lock);
    engram__cuda_plan_free_locked(p);
    pthread_mutex_unlock(&c->lock);
    engram__cuda_leave(c, &prev);
}

size_t engram_cuda_plan_out_row_bytes(const engram_cuda_plan *p)
{
    return p ? p->out_R : 0;
}

/* Checks the op against the tables' row sizes and sets R, N, out_R. */
static int plan_shape(engram_cuda_plan *p, engram__cuda_table **tab, engram__cuda_table **sc)
{
    p->R = tab[0]->spec.row_bytes;
    for (uint32_t k = 1; k < p->K; k++)
        if (tab[k]->spec.row_bytes != p->R)
            return engram__cuda_fail(
                ENGRAM_ELAYOUT, "tables[%u] = %u has row_bytes %u but tables[0] = %u has %u", k,
                (unsigned)p->tables[k], tab[k]->spec.row_bytes, (unsigned)p->tables[0], p->R);
    if (p->op == ENGRAM_CUDA_OP_GATHER) {
        p->out_R = p->R;
        return 0;
    }
    if (!p->planar) {
        if (p->R % 33 != 0)
            return engram__cuda_fail(ENGRAM_ELAYOUT,
                                     "packed FP8 rows hold N values and N/32 scales (33 * N / 32 "
                                     "bytes, N a multiple of 32); row_bytes %u is not", p->R);
        p->N = p->R / 33 * 32;
    } else {
        p->N = p->R;
        if (p->N % 32 != 0)
            return engram__cuda_fail(
                ENGRAM_ELAYOUT, "planar FP8 weight rows must hold a multiple of 32 values, not %u",
                p->N);
        for (uint32_t k = 0; k < p->K; k++) {
            if (sc[k]->spec.row_bytes != p->N / 32)
                return engram__cuda_fail(
                    ENGRAM_ELAYOUT,
                    "scale_tables[%u] = %u has row_bytes %u, expected %u (one per "
                    "32 values)",
                    k, (unsigned)p->scales[k], sc[k]->spec.row_bytes, p->N / 32);
            if (sc[k]->spec.num_rows < tab[k]->spec.num_rows)
                return engram__cuda_fail(
                    ENGRAM_ELAYOUT,
                    "scale_tables[%u] = %u has %llu rows, fewer than tables[%u] "
                    "(%llu)",
                    k, (unsigned)p->scales[k], (unsigned long long)sc[k]->spec.num_rows, k,
                    (unsigned long long)tab[k]->spec.num_rows);
            if (tab[k]->mode == ENGRAM_CUDA_TABLE_HOST || sc[k]->mode == ENGRAM_CUDA_TABLE_HOST)
                return engram__cuda_fail(-ENOTSUP,
                                         "column %u: planar dequant needs memory-resident "
                                         "tables; table %u or %u has no base address",
                                         k, (unsigned)p->tables[k], (unsigned)p->scales[k]);
        }
    }
    p->out_R = 2 * p->N;
    return 0;
}

/* Allocates the host-path staging for max_T tokens of Kh columns. */
static int host_alloc(engram_cuda_plan *p, engram__cuda_table **tab, const int64_t *offsets)
{
    engram_cuda_ctx *c = p->ctx;
    uint32_t *hcols;
    uint64_t nids, nbytes;
    cudaError_t e;
    uint32_t j = 0;

    if (p->max_T == 0)
        return engram__cuda_fail(-EINVAL, "a table of this plan has no base address: the host path "
                                          "needs plan max_tokens > 0");
    if (engram__mul_u64(p->max_T, p->Kh, &nids) || engram__mul_u64(nids, p->R, &nbytes) ||
        engram__mul_u64(nids, sizeof(int64_t), &(uint64_t){0}) || nbytes > SIZE_MAX / 2)
        return engram__cuda_fail(-EINVAL, "host-path staging of %zu tokens overflows", p->max_T);
    p->h_tables = calloc(p->Kh, sizeof *p->h_tables);
    p->h_offsets = calloc(p->Kh, sizeof *p->h_offsets);
    p->h_spans = calloc(p->Kh, sizeof *p->h_spans);
    hcols = calloc(p->Kh, sizeof *hcols);
    p->slots = calloc(p->max_T + 1, sizeof *p->slots);
    if (!p->h_tables || !p->h_offsets || !p->h_spans || !hcols || !p->slots) {
        free(hcols);
        return engram__cuda_fail(-ENOMEM, "out of memory for the host path");
    }
    for (uint32_t k = 0; k < p->K; k++) {
        if (tab[k]->mode != ENGRAM_CUDA_TABLE_HOST)
            continue;
        hcols[j] = k;
        p->h_tables[j] = p->tables[k];
        p->h_offsets[j] = offsets ? offsets[k] : 0;
        p->h_spans[j] = engram__id_span(tab[k]->spec.num_rows, p->h_offsets[j]);
        j++;
    }
    for (size_t t = 0; t <= p->max_T; t++) {
        p->slots[t].p = p;
        p->slots[t].T = t;
    }
    /* See plan_build_locked() for why the upload is stream-ordered and
     * waited for. */
    if ((e = cudaMalloc((void **)&p->d_hcols, p->Kh * sizeof *hcols)) != cudaSuccess ||
        (e = cudaMemcpyAsync(p->d_hcols, hcols, p->Kh * sizeof *hcols, cudaMemcpyHostToDevice,
                             c->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->stream)) != cudaSuccess ||
        (e = cudaMalloc((void **)&p->d_hids, (size_t)nids * sizeof(int64_t))) != cudaSuccess ||
        (e = cudaMalloc((void **)&p->d_hrows, (size_t)nbytes)) != cudaSuccess ||
        (e = cudaHostAlloc((void **)&p->h_ids, (size_t)nids * sizeof(int64_t), 0)) !=
            cudaSuccess ||
        (e = cudaHostAlloc((void **)&p->h_rows, (size_t)nbytes, 0)) != cudaSuccess) {
        free(hcols);
        return engram__cuda_err(e, "host-path staging for %zu tokens x %u columns", p->max_T,
                                p->Kh);
    }
    free(hcols);
    p->host.store = c->st;
    p->host.K = p->Kh;
    p->host.tables = p->h_tables;
    p->host.offsets = p->h_offsets;
    p->host.spans = p->h_spans;
    p->host.row_bytes = p->R;
    p->host.ids = p->h_ids;
    p->host.rows = p->h_rows;
    p->host.on_error = engram__cuda_host_error;
    p->host.ud = c;
    return 0;
}

static int plan_build_locked(engram_cuda_plan *p, const engram_cuda_plan_args *a)
{
    engram_cuda_ctx *c = p->ctx;
    engram__cuda_table **tab = NULL, **sc = NULL;
    engram__cuda_col *cols = NULL;
    uint32_t kh = 0;
    cudaError_t e;
    int err;

    tab = calloc(p->K, sizeof *tab);
    sc = calloc(p->K, sizeof *sc);
    cols = calloc(p->K, sizeof *cols);
    if (!tab || !sc || !cols) {
        err = engram__cuda_fail(-ENOMEM, "out of memory for a plan of %u columns", p->K);
        goto out;
    }
    /* Register everything first: the table array may move while growing,
     * so the entries are looked up again afterwards. */
    for (uint32_t k = 0; k < p->K; k++) {
        if ((err = engram__cuda_register_locked(c, p->tables[k], NULL)) != 0 ||
            (p->scales && (err = engram__cuda_register_locked(c, p->scales[k], NULL)) != 0))
            goto out;
    }
    for (uint32_t k = 0; k < p->K; k++) {
        tab[k] = &c->tables[p->tables[k]];
        sc[k] = p->scales ? &c->tables[p->scales[k]] : NULL;
        p->Kh += tab[k]->mode == ENGRAM_CUDA_TABLE_HOST;
    }
    if ((err = plan_shape(p, tab, sc)) != 0)
        goto out;
    if (p->Kh && (err = host_alloc(p, tab, a->offsets)) != 0)
        goto out;
    p->in_align = 16;
    for (uint32_t k = 0; k < p->K; k++) {
        engram__cuda_col *col = &cols[k];
        col->off = a->offsets ? a->offsets[k] : 0;
        col->span = engram__id_span(tab[k]->spec.num_rows, col->off);
        col->table = p->tables[k];
        if (tab[k]->mode == ENGRAM_CUDA_TABLE_HOST) {
            col->base = p->d_hrows + (size_t)kh++ * p->R;
            col->pitch = (uint64_t)p->Kh * p->R;
            col->by_token = 1;
        } else {
            col->base = tab[k]->dev;
            col->pitch = tab[k]->spec.row_pitch;
        }
        if (sc[k]) {
            col->sbase = sc[k]->dev;
            col->spitch = sc[k]->spec.row_pitch;
        }
        if (align_of((uintptr_t)col->base) < p->in_align)
            p->in_align = align_of((uintptr_t)col->base);
        if (align_of(col->pitch) < p->in_align)
            p->in_align = align_of(col->pitch);
    }
    /* A plain cudaMemcpy from pageable memory may return before its DMA
     * has landed, and it is ordered only with the legacy default stream: a
     * first lookup on a non-blocking stream could read the descriptors
     * before they arrive.  Copy on the context's stream and wait for it. */
    if ((e = cudaMalloc((void **)&p->d_cols, p->K * sizeof *cols)) != cudaSuccess ||
        (e = cudaMemcpyAsync(p->d_cols, cols, p->K * sizeof *cols, cudaMemcpyHostToDevice,
                             c->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
        err = engram__cuda_err(e, "uploading the descriptors of %u columns", p->K);
        goto out;
    }
    /* The plan now holds its tables: unregistering them fails until it
     * is destroyed. */
    for (uint32_t k = 0; k < p->K; k++) {
        tab[k]->plans++;
        if (sc[k])
            sc[k]->plans++;
    }
    err = 0;
out:
    free(tab);
    free(sc);
    free(cols);
    return err;
}

int engram__cuda_plan_args_check(const engram_cuda_plan_args *a, const char *fn)
{
    if (!a || a->size != sizeof *a)
        return engram__cuda_fail(-EINVAL,
                                 "%s: args (with size = sizeof(engram_cuda_plan_args)) are "
                                 "required",
                                 fn);
    if (a->num_cols == 0 || a->num_cols > ENGRAM_CUDA_MAX_COLS || !a->tables)
        return engram__cuda_fail(-EINVAL, "a plan needs 1 to %u columns and their tables (got %zu)",
                                 ENGRAM_CUDA_MAX_COLS, a->num_cols);
    if (a->op != ENGRAM_CUDA_OP_GATHER && a->op != ENGRAM_CUDA_OP_DEQUANT_FP8)
        return engram__cuda_fail(-EINVAL, "unknown plan op %u", a->op);
    if (a->scale_tables && a->op != ENGRAM_CUDA_OP_DEQUANT_FP8)
        return engram__cuda_fail(-EINVAL, "scale_tables are only for ENGRAM_CUDA_OP_DEQUANT_FP8");
    return 0;
}

int engram_cuda_plan_create(engram_cuda_ctx *c, const engram_cuda_plan_args *a,
                            engram_cuda_plan **out)
{
    engram_cuda_plan *p;
    engram__cuda_scope prev;
    int err;

    if (!c || !out)
        return engram__cuda_fail(-EINVAL,
                                 "engram_cuda_plan_create: ctx, args and out are required");
    *out = NULL;
    if ((err = engram__cuda_plan_args_check(a, "engram_cuda_plan_create")) != 0)
        return err;
    if ((p = calloc(1, sizeof *p)) != NULL)
        pthread_mutex_init(&p->host_lock, NULL);
    if (!p)
        return engram__cuda_fail(-ENOMEM, "out of memory");
    p->ctx = c;
    p->op = a->op;
    p->K = (uint32_t)a->num_cols;
    p->planar = a->scale_tables != NULL;
    p->max_T = a->max_tokens;
    p->tables = malloc(p->K * sizeof *p->tables);
    p->scales = p->planar ? malloc(p->K * sizeof *p->scales) : NULL;
    if (!p->tables || (p->planar && !p->scales)) {
        free(p->tables);
        free(p->scales);
        free(p);
        return engram__cuda_fail(-ENOMEM, "out of memory");
    }
    memcpy(p->tables, a->tables, p->K * sizeof *p->tables);
    if (p->planar)
        memcpy(p->scales, a->scale_tables, p->K * sizeof *p->scales);
    if ((err = engram__cuda_enter(c, &prev)) != 0) {
        free(p->tables);
        free(p->scales);
        free(p);
        return err;
    }
    pthread_mutex_lock(&c->lock);
    err = plan_build_locked(p, a);
    if (err) {
        engram__cuda_plan_free_locked(p); /* not linked: holds no references */
    } else {
        p->linked = 1;
        p->next = c->plans;
        if (c->plans)
            c->plans->prev = p;
        c->plans = p;
        c->nplans++;
        *out = p;
    }
    pthread_mutex_unlock(&c->lock);
    engram__cuda_leave(c, &prev);
    return err;
}

/* ------------------------------------------------------------------------
 * Lookups.
 */

static void CUDART_CB host_fn(void *arg)
{
    host_slot *s = arg;
    engram__cuda_host_gather(&s->p->host, s->T);
    atomic_fetch_add_explicit(&s->p->ctx->host_gathers, 1, memory_order_relaxed);
}

/* The host path's stream work before the main kernel. */
static int host_enqueue(engram_cuda_plan *p, const engram__cuda_launch *L, cudaStream_t s)
{
    size_t T = (size_t)L->T;
    cudaError_t e;
    if ((e = engram__cuda_launch_pack_ids(L->ids, L->id64, L->ist, L->isk, L->T, p->d_hcols,
                                          p->Kh, p->d_hids, s)) != cudaSuccess ||
        (e = cudaMemcpyAsync(p->h_ids, p->d_hids, T * p->Kh * sizeof(int64_t),
                             cudaMemcpyDeviceToHost, s)) != cudaSuccess ||
        (e = cudaLaunchHostFunc(s, host_fn, &p->slots[T])) != cudaSuccess ||
        (e = cudaMemcpyAsync(p->d_hrows, p->h_rows, T * p->Kh * p->R, cudaMemcpyHostToDevice,
                             s)) != cudaSuccess)
        return engram__cuda_err(e, "enqueueing the host path of a %zu-token lookup", T);
    return 0;
}

int engram_cuda_lookup(engram_cuda_plan *p, const engram_cuda_lookup_args *a, cudaStream_t stream)
{
    cudaError_t e;
    int cur = -1;

    if (ENGRAM__UNLIKELY(!p || !a || a->size != sizeof *a))
        return engram__cuda_fail(-EINVAL,
                                 "plan and args (with size = sizeof(engram_cuda_lookup_args)) "
                                 "are required");
    if (a->num_tokens == 0)
        return 0;
    /* A kernel launched on another device would read this context's
     * device pointers there and fault, which poisons the CUDA context for
     * good; cudaGetDevice is allowed under stream capture. */
    if (ENGRAM__UNLIKELY((e = cudaGetDevice(&cur)) != cudaSuccess))
        return engram__cuda_err(e, "cudaGetDevice"); /* clears it */
    if (ENGRAM__UNLIKELY(cur != p->ctx->device))
        return engram__cuda_fail(-EINVAL, "the current CUDA device is %d but the context is on "
                                          "device %d: make it current first (cudaSetDevice)",
                                 cur, p->ctx->device);
    return engram__cuda_lookup_current(p, a, stream);
}

int engram__cuda_lookup_current(engram_cuda_plan *p, const engram_cuda_lookup_args *a,
                                cudaStream_t stream)
{
    engram__cuda_launch L;
    engram__out_layout ol;
    engram_cuda_ctx *c = p->ctx;
    uint64_t rows;
    uint32_t out_align;
    cudaError_t e;
    int err;

    if (a->num_tokens == 0)
        return 0;
    if (ENGRAM__UNLIKELY(!a->ids || !a->out))
        return engram__cuda_fail(-EINVAL, "ids and out are required for a %zu x %u lookup",
                                 a->num_tokens, p->K);
    if (ENGRAM__UNLIKELY(a->id_type != ENGRAM_ID_INT32 && a->id_type != ENGRAM_ID_INT64))
        return engram__cuda_fail(ENGRAM_ELAYOUT, "id_type %d is neither ENGRAM_ID_INT32 nor "
                                                 "ENGRAM_ID_INT64", a->id_type);
    if (ENGRAM__UNLIKELY(a->flags & ~(uint32_t)(ENGRAM_LOOKUP_ZERO_DEAD |
                                                ENGRAM_CUDA_LOOKUP_BACKGROUND)))
        return engram__cuda_fail(-EINVAL, "unknown lookup flags 0x%x", a->flags);
    if (ENGRAM__UNLIKELY(engram__mul_u64(a->num_tokens, p->K, &rows) ||
                         a->num_tokens >= (1ull << (64 - ENGRAM__CUDA_COL_BITS))))
        return engram__cuda_fail(ENGRAM_ELAYOUT, "%zu x %u ids is too many", a->num_tokens, p->K);
    if (ENGRAM__UNLIKELY(p->Kh && a->num_tokens > p->max_T))
        return engram__cuda_fail(-EINVAL,
                                 "%zu tokens exceed the plan's max_tokens (%zu) of its host "
                                 "path",
                                 a->num_tokens, p->max_T);

    memset(&L, 0, sizeof L);
    L.cols = p->d_cols;
    L.bad = c->bad;
    L.ids = a->ids;
    L.out = a->out;
    L.T = a->num_tokens;
    L.K = p->K;
    L.id64 = a->id_type == ENGRAM_ID_INT64;
    L.zero_dead = (a->flags & ENGRAM_LOOKUP_ZERO_DEAD) != 0;
    L.planar = p->planar;
    L.ist = a->id_stride_t;
    L.isk = a->id_stride_k;
    if (L.ist == 0 && L.isk == 0) {
        L.ist = (ptrdiff_t)p->K;
        L.isk = 1;
    }
    if ((uintptr_t)a->ids % (L.id64 ? 8u : 4u) != 0)
        return engram__cuda_fail(ENGRAM_ELAYOUT, "ids at %p are not aligned to their type",
                                 a->ids);
    if ((err = engram_internal_v1()->out_layout(p->out_R, a->num_tokens, p->K, a->out_stride_t,
                                                a->out_stride_k, &ol)) != 0)
        return err;
    L.ost = ol.ost;
    L.osk = ol.osk;
    out_align = align_of((uintptr_t)a->out);
    if (L.T > 1 && align_of((uint64_t)L.ost) < out_align)
        out_align = align_of((uint64_t)L.ost);
    if (L.K > 1 && align_of((uint64_t)L.osk) < out_align)
        out_align = align_of((uint64_t)L.osk);
    if (a->flags & ENGRAM_CUDA_LOOKUP_BACKGROUND) {
        L.block = 1024;
        L.max_blocks = c->background_sms;
    } else {
        L.block = 256;
        L.max_blocks = c->max_blocks;
    }
    if (p->op == ENGRAM_CUDA_OP_GATHER) {
        L.R = p->R;
        L.load_w = p->in_align;
        L.store_w = out_align < L.load_w ? out_align : L.load_w;
        L.lanes = lanes_for(L.R / L.load_w);
    } else {
        if (out_align < 2)
            return engram__cuda_fail(ENGRAM_ELAYOUT,
                                     "BF16 output (address and strides) must be 2-byte "
                                     "aligned");
        L.R = p->N;
        /* Vector variant: 8 values per 8-byte load, 8 BF16 per 16-byte store. */
        int vec = p->in_align >= 8 && out_align >= 16;
        L.load_w = vec ? 8 : 1;
        L.store_w = vec ? 16 : 2;
        L.lanes = lanes_for(p->N / 8);
    }

    if (p->Kh) {
        pthread_mutex_lock(&p->host_lock);
        if ((err = host_enqueue(p, &L, stream)) != 0) {
            pthread_mutex_unlock(&p->host_lock);
            return err;
        }
    }
    e = p->op == ENGRAM_CUDA_OP_GATHER ? engram__cuda_launch_gather(&L, stream)
                                       : engram__cuda_launch_dequant(&L, stream);
    if (p->Kh)
        pthread_mutex_unlock(&p->host_lock);
    if (ENGRAM__UNLIKELY(e != cudaSuccess))
        return engram__cuda_err(e, "launching a %zu x %u lookup", a->num_tokens, p->K);
    atomic_fetch_add_explicit(&c->lookups, 1, memory_order_relaxed);
    if (c->flags & ENGRAM_CUDA_DEBUG_SYNC) {
        if ((e = cudaStreamSynchronize(stream)) != cudaSuccess)
            return engram__cuda_err(e, "synchronising after a lookup (debug mode)");
        return engram_cuda_check(c, NULL);
    }
    return 0;
}
