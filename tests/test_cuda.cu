/*
 * test_cuda.cu - the CUDA stream lookup against the CPU lookup, on a GPU.
 *
 * Every GPU lookup here is compared byte for byte with engram_lookup() on
 * the same ids into a copy of the same sentinel-filled output buffer
 * (margins included), so a wrong row, a byte written into a gap or past a
 * row, or a dead row that should have been kept is caught by one buffer
 * comparison.  Covered: many random shapes (row sizes and pitches that
 * select every load/store width, both id types, dead ids, offsets,
 * token-major, padded and head-major outputs at odd alignments, background
 * mode), bad-id reporting (and the debug mode), graph capture and replay
 * with new ids, a side stream with events (and a negative control showing
 * the comparison detects a missing wait), registration with several stores
 * and contexts, pinned-copy fallback, the host path, and the dequant op
 * against engram_dequant_fp8_e4m3_e8m0_ref().  Lookups by tables
 * (engram_cuda_lookup_tables) run the random shapes again through the
 * context's plans, and are checked for one plan per set of columns, a
 * callback source table on two streams at once (a plan each), staging
 * growth, the refusals (capture, cudaStreamPerThread, a 17th stream), a
 * warm-up with no tokens before a capture, another device current (with
 * two devices), threads racing for one plan, and dequant (the op and the
 * scale tables are part of the columns);
 * engram_cuda_order_after() with a late producer (and a negative
 * control) and its capture rules.  Ids and offsets anywhere in int64 are
 * checked against a 128-bit reference of id - offset on the kernel and
 * the host path.
 *
 * Without a CUDA device it exits 77 ("no CUDA device"): skipped.
 * Compiled by nvcc as C++ (host code only).
 */
#include <pthread.h>
#include <unistd.h>

#include "testutil.h"

extern "C" {
#include "common.h" /* a C header without its own extern "C" */
}
#include "engram_cuda.h"

#define CK(call)                                                                      \
    do {                                                                              \
        cudaError_t ck_e_ = (call);                                                   \
        if (ck_e_ != cudaSuccess) {                                                   \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(ck_e_));           \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

#define SENTINEL 0x5A

/* A table of the fixture. */
typedef struct gt {
    const char *name;
    uint32_t seed, rb, pitch;
    uint64_t nrows;
    engram_table_id id;
} gt;

static gt tabs[] = {
    {"r264p272a", 1, 264, 272, 1000, 0}, {"r264p272b", 2, 264, 272, 777, 0},
    {"r264p264", 3, 264, 264, 513, 0},   {"r272", 4, 272, 272, 300, 0},
    {"r40p48", 5, 40, 48, 200, 0},       {"r40p41", 6, 40, 41, 211, 0},
    {"r7", 7, 7, 7, 100, 0},             {"r16", 8, 16, 16, 64, 0},
    {"r1", 9, 1, 1, 50, 0},              {"r1000p1024", 10, 1000, 1024, 90, 0},
    {"r6p6", 11, 6, 6, 70, 0},           {"r264p268", 12, 264, 268, 123, 0},
};
#define NTABS (sizeof tabs / sizeof tabs[0])

static engram_store *st;
static engram_cuda_ctx *ctx;

static void *dmalloc(size_t n)
{
    void *p;
    CK(cudaMalloc(&p, n ? n : 1));
    return p;
}

/* ------------------------------------------------------------------------
 * One lookup case, run on both sides.
 */
typedef struct gcase {
    size_t T, K;
    engram_table_id tables[16];
    int64_t offsets[16];
    int use_offsets;
    size_t max_tokens;   /* plan args max_tokens (host path) */
    int id_type;
    void *ids;           /* host */
    size_t ids_bytes;
    ptrdiff_t ist, isk;  /* as passed */
    ptrdiff_t ost, osk;  /* as passed */
    uint32_t flags;      /* lookup flags */
    size_t R, out_R;
    unsigned char *buf;  /* host, with margins */
    size_t len, base;
} gcase;

static void resolved_out(const gcase *c, ptrdiff_t *ost, ptrdiff_t *osk)
{
    if (c->ost == 0 && c->osk == 0) {
        *osk = (ptrdiff_t)c->out_R;
        *ost = (ptrdiff_t)(c->K * c->out_R);
    } else {
        *ost = c->ost;
        *osk = c->osk;
    }
}

static void alloc_out(gcase *c, size_t margin, size_t misalign)
{
    ptrdiff_t ost, osk, lo = 0, hi = 0;
    ptrdiff_t corners[4];
    resolved_out(c, &ost, &osk);
    corners[0] = 0;
    corners[1] = (ptrdiff_t)(c->T - 1) * ost;
    corners[2] = (ptrdiff_t)(c->K - 1) * osk;
    corners[3] = corners[1] + corners[2];
    for (int i = 0; i < 4; i++) {
        if (corners[i] < lo)
            lo = corners[i];
        if (corners[i] > hi)
            hi = corners[i];
    }
    hi += (ptrdiff_t)c->out_R;
    c->base = margin + (size_t)(-lo) + misalign;
    c->len = c->base + (size_t)hi + margin;
    c->buf = (unsigned char *)tu_xmalloc(c->len);
}

/* Runs the CPU lookup of `c` into exp (a copy of the sentinel buffer). */
static void cpu_lookup(const gcase *c, unsigned char *exp)
{
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.flags = c->flags & ENGRAM_LOOKUP_ZERO_DEAD;
    a.num_tokens = c->T;
    a.num_cols = c->K;
    a.tables = c->tables;
    a.offsets = c->use_offsets ? c->offsets : NULL;
    a.ids = c->ids;
    a.id_type = c->id_type;
    a.id_stride_t = c->ist;
    a.id_stride_k = c->isk;
    a.out = exp + c->base;
    a.out_stride_t = c->ost;
    a.out_stride_k = c->osk;
    ASSERT_OK(engram_lookup(st, &a));
}

static engram_cuda_lookup_args gpu_args(const gcase *c, const void *dids, unsigned char *dbuf)
{
    engram_cuda_lookup_args a = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    a.flags = c->flags;
    a.num_tokens = c->T;
    a.ids = dids;
    a.id_type = c->id_type;
    a.id_stride_t = c->ist;
    a.id_stride_k = c->isk;
    a.out = dbuf + c->base;
    a.out_stride_t = c->ost;
    a.out_stride_k = c->osk;
    return a;
}

static void report_diff(const gcase *c, const unsigned char *exp, const unsigned char *got,
                        int line)
{
    size_t i = 0;
    while (exp[i] == got[i])
        i++;
    fprintf(stderr,
            "FAIL [%s] (line %d): GPU output differs at buffer byte %zu (out offset %td): got "
            "0x%02x, expected 0x%02x (T=%zu K=%zu R=%zu strides out %td,%td ids %td,%td "
            "id_type %d flags 0x%x base %zu)\n",
            tu_current_case, line, i, (ptrdiff_t)i - (ptrdiff_t)c->base, got[i], exp[i], c->T,
            c->K, c->R, c->ost, c->osk, c->ist, c->isk, c->id_type, c->flags, c->base);
    tu_fail_exit();
}

/* The columns of `c`, as plan args. */
static engram_cuda_plan_args cols_of(const gcase *c)
{
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    pa.num_cols = c->K;
    pa.tables = c->tables;
    pa.offsets = c->use_offsets ? c->offsets : NULL;
    pa.max_tokens = c->max_tokens;
    return pa;
}

/* Enqueues `c`'s lookup `a` on s: with plan `p`, or by tables (the
 * context's plan, engram_cuda_lookup_tables) when p is NULL. */
static int enqueue(engram_cuda_plan *p, const gcase *c, const engram_cuda_lookup_args *a,
                   cudaStream_t s)
{
    engram_cuda_plan_args pa;
    if (p)
        return engram_cuda_lookup(p, a, s);
    pa = cols_of(c);
    return engram_cuda_lookup_tables(ctx, &pa, a, s);
}

/* A case on its way: its buffers. */
typedef struct inflight {
    unsigned char *exp, *dbuf;
    void *dids;
} inflight;

/* Runs `c` on the CPU and enqueues it on s (see enqueue()), with device
 * `dev` current if dev >= 0 (the buffers are made on the current one). */
static void case_start(gcase *c, inflight *f, engram_cuda_plan *p, cudaStream_t s, int dev)
{
    engram_cuda_lookup_args a;
    int cur = -1;
    f->exp = (unsigned char *)tu_xmalloc(c->len);
    f->dbuf = (unsigned char *)dmalloc(c->len);
    f->dids = dmalloc(c->ids_bytes);
    memset(c->buf, SENTINEL, c->len);
    memcpy(f->exp, c->buf, c->len);
    cpu_lookup(c, f->exp);
    CK(cudaMemcpy(f->dbuf, c->buf, c->len, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(f->dids, c->ids, c->ids_bytes, cudaMemcpyHostToDevice));
    /* A cudaMemcpy from pageable memory may return before its DMA lands,
     * and a non-blocking stream is not ordered after it: wait for it. */
    CK(cudaDeviceSynchronize());
    a = gpu_args(c, f->dids, f->dbuf);
    if (dev >= 0) {
        CK(cudaGetDevice(&cur));
        CK(cudaSetDevice(dev));
    }
    ASSERT_OK(enqueue(p, c, &a, s));
    if (dev >= 0) {
        int now = -1;
        CK(cudaGetDevice(&now));
        ASSERT_EQ(now, dev); /* the caller's device stays current */
        CK(cudaSetDevice(cur));
    }
}

/* Waits for s and compares the output of the case with the CPU's. */
static void case_finish(gcase *c, inflight *f, cudaStream_t s, int line)
{
    unsigned char *got = (unsigned char *)tu_xmalloc(c->len);
    engram_cuda_report rep = ENGRAM_CUDA_REPORT_INIT;
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(got, f->dbuf, c->len, cudaMemcpyDeviceToHost));
    if (memcmp(f->exp, got, c->len) != 0)
        report_diff(c, f->exp, got, line);
    ASSERT_OK(engram_cuda_check(ctx, &rep));
    ASSERT_EQ_U64(rep.bad_ids, 0);
    CK(cudaFree(f->dbuf));
    CK(cudaFree(f->dids));
    free(f->exp);
    free(got);
}

/* Runs `c` on the GPU with plan `p` (NULL: by tables) and on the CPU;
 * compares everything. */
static void check_case(gcase *c, engram_cuda_plan *p, cudaStream_t s, int line)
{
    inflight f;
    case_start(c, &f, p, s, -1);
    case_finish(c, &f, s, line);
}

/* Fills c->ids for the resolved strides with valid ids (dead with
 * probability 1/dead_every), as c->id_type. */
static void make_ids(gcase *c, uint64_t *rng, int dead_every)
{
    ptrdiff_t ist = c->ist, isk = c->isk;
    size_t n;
    if (ist == 0 && isk == 0) {
        ist = (ptrdiff_t)c->K;
        isk = 1;
    }
    n = (size_t)((ptrdiff_t)(c->T - 1) * ist + (ptrdiff_t)(c->K - 1) * isk + 1);
    c->ids_bytes = n * (c->id_type == ENGRAM_ID_INT64 ? 8 : 4);
    c->ids = tu_xmalloc(c->ids_bytes);
    memset(c->ids, 0x7f, c->ids_bytes); /* gaps hold huge ids: reading one would be caught */
    for (size_t t = 0; t < c->T; t++)
        for (size_t k = 0; k < c->K; k++) {
            const gt *tb = NULL;
            for (size_t i = 0; i < NTABS; i++)
                if (tabs[i].id == c->tables[k])
                    tb = &tabs[i];
            int64_t v = dead_every && tu_rand_below(rng, (uint64_t)dead_every) == 0
                            ? -1
                            : (int64_t)tu_rand_below(rng, tb->nrows) +
                                  (c->use_offsets ? c->offsets[k] : 0);
            ptrdiff_t e = (ptrdiff_t)t * ist + (ptrdiff_t)k * isk;
            if (c->id_type == ENGRAM_ID_INT64)
                ((int64_t *)c->ids)[e] = v;
            else
                ((int32_t *)c->ids)[e] = (int32_t)v;
        }
}

static engram_cuda_plan *make_plan(const gcase *c)
{
    engram_cuda_plan_args pa = cols_of(c);
    engram_cuda_plan *p = NULL;
    ASSERT_OK(engram_cuda_plan_create(ctx, &pa, &p));
    ASSERT_EQ(engram_cuda_plan_out_row_bytes(p), c->R);
    return p;
}

/* ------------------------------------------------------------------------
 * Random shapes.
 */
static void test_random_shapes(void)
{
    static const size_t groups[][4] = {{0, 1, 2, 11}, {3, 3, 3, 3}, {4, 5, 4, 5}, {6, 6, 6, 6},
                                       {7, 7, 7, 7},  {8, 8, 8, 8}, {9, 9, 9, 9}, {10, 10, 10, 10}};
    uint64_t rng = 20260501;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    tu_current_case = "random shapes vs the CPU lookup";
    for (int iter = 0; iter < 240; iter++) {
        gcase c;
        const size_t *g = groups[tu_rand_below(&rng, sizeof groups / sizeof groups[0])];
        int layout = (int)tu_rand_below(&rng, 5);
        memset(&c, 0, sizeof c);
        c.T = 1 + (size_t)tu_rand_below(&rng, iter % 10 == 0 ? 3000 : iter % 10 == 1 ? 2 : 200);
        c.K = 1 + (size_t)tu_rand_below(&rng, 6);
        for (size_t k = 0; k < c.K; k++) {
            c.tables[k] = tabs[g[tu_rand_below(&rng, 4)]].id;
            c.offsets[k] = (int64_t)tu_rand_below(&rng, 5000);
        }
        c.R = c.out_R = tabs[g[0]].rb;
        c.use_offsets = (int)tu_rand_below(&rng, 2);
        c.id_type = tu_rand_below(&rng, 2) ? ENGRAM_ID_INT64 : ENGRAM_ID_INT32;
        c.flags = (tu_rand_below(&rng, 2) ? ENGRAM_LOOKUP_ZERO_DEAD : 0) |
                  (tu_rand_below(&rng, 4) == 0 ? ENGRAM_CUDA_LOOKUP_BACKGROUND : 0);
        if (tu_rand_below(&rng, 3) == 0) { /* head-major or padded ids */
            c.ist = 1;
            c.isk = (ptrdiff_t)c.T + (ptrdiff_t)tu_rand_below(&rng, 3);
        }
        switch (layout) {
        case 0: /* contiguous [T, K, R] */
            break;
        case 1: /* token-major with padding: odd strides select narrow stores */
            c.osk = (ptrdiff_t)(c.R + tu_rand_below(&rng, 9));
            c.ost = c.osk * (ptrdiff_t)c.K + (ptrdiff_t)tu_rand_below(&rng, 17);
            break;
        case 2: /* head-major [K, T, R] */
            c.ost = (ptrdiff_t)c.R;
            c.osk = (ptrdiff_t)(c.T * c.R);
            break;
        case 3: /* reversed tokens: negative stride */
            c.osk = (ptrdiff_t)c.R;
            c.ost = -(ptrdiff_t)(c.K * c.R);
            break;
        default: /* rows padded to 16 bytes, 16-byte aligned: 16-byte stores
                  * and, for R % 16 != 0, a row tail narrower than them */
            c.osk = (ptrdiff_t)((c.R + 15) / 16 * 16);
            c.ost = c.osk * (ptrdiff_t)c.K;
            break;
        }
        make_ids(&c, &rng, 9);
        alloc_out(&c, 64, layout == 4 ? 0 : (size_t)tu_rand_below(&rng, 16));
        engram_cuda_plan *p = make_plan(&c);
        check_case(&c, p, s, __LINE__);
        engram_cuda_plan_destroy(p);
        check_case(&c, NULL, s, __LINE__); /* by tables: the context's plan */
        free(c.ids);
        free(c.buf);
    }
    CK(cudaStreamDestroy(s));
}

/* ------------------------------------------------------------------------
 * Bad ids.
 */
static void test_bad_ids(void)
{
    gcase c;
    engram_cuda_plan *p;
    engram_cuda_report rep = ENGRAM_CUDA_REPORT_INIT;
    uint64_t rng = 77;
    unsigned char *dbuf, *got, *exp;
    void *dids;
    engram_cuda_lookup_args a;
    int64_t *ids;

    tu_current_case = "bad ids: skipped, counted, first reported";
    memset(&c, 0, sizeof c);
    c.T = 2000;
    c.K = 3;
    c.tables[0] = tabs[0].id;
    c.tables[1] = tabs[1].id;
    c.tables[2] = tabs[0].id;
    c.use_offsets = 1;
    c.offsets[1] = 100;
    c.id_type = ENGRAM_ID_INT64;
    c.R = c.out_R = 264;
    make_ids(&c, &rng, 0);
    alloc_out(&c, 64, 0);
    ids = (int64_t *)c.ids;
    /* Bad ids late and early in the batch: the report must name the
     * smallest (token, column) whatever order the blocks ran in. */
    ids[1990 * 3 + 0] = 1000;      /* past the end of tabs[0] (1000 rows) */
    ids[1500 * 3 + 2] = -7;        /* negative */
    ids[700 * 3 + 1] = 99;         /* below column 1's offset */
    ids[700 * 3 + 2] = 5000000000; /* same token, later column */
    p = make_plan(&c);
    exp = (unsigned char *)tu_xmalloc(c.len);
    got = (unsigned char *)tu_xmalloc(c.len);
    dbuf = (unsigned char *)dmalloc(c.len);
    dids = dmalloc(c.ids_bytes);
    for (int round = 0; round < 3; round++) {
        memset(c.buf, SENTINEL, c.len);
        CK(cudaMemcpy(dbuf, c.buf, c.len, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dids, c.ids, c.ids_bytes, cudaMemcpyHostToDevice));
        a = gpu_args(&c, dids, dbuf);
        ASSERT_OK(engram_cuda_lookup(p, &a, 0));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got, dbuf, c.len, cudaMemcpyDeviceToHost));
        /* The reference: the CPU lookup with the bad ids made dead (dead
         * rows are kept, like skipped bad rows, without ZERO_DEAD). */
        {
            int64_t save[4] = {ids[1990 * 3], ids[1500 * 3 + 2], ids[700 * 3 + 1],
                               ids[700 * 3 + 2]};
            ids[1990 * 3] = ids[1500 * 3 + 2] = ids[700 * 3 + 1] = ids[700 * 3 + 2] = -1;
            memcpy(exp, c.buf, c.len);
            cpu_lookup(&c, exp);
            ids[1990 * 3] = save[0];
            ids[1500 * 3 + 2] = save[1];
            ids[700 * 3 + 1] = save[2];
            ids[700 * 3 + 2] = save[3];
        }
        if (memcmp(exp, got, c.len) != 0)
            report_diff(&c, exp, got, __LINE__);
        ASSERT_ERR(engram_cuda_check(ctx, &rep), ENGRAM_EBADID);
        ASSERT_CONTAINS(engram_errmsg(), "ids[700][1] = 99");
        ASSERT_EQ_U64(rep.bad_ids, 4);
        ASSERT_EQ_U64(rep.first_token, 700);
        ASSERT_EQ(rep.first_col, 1);
        ASSERT_EQ(rep.first_id, 99);
        ASSERT_EQ(rep.first_table, tabs[1].id);
        /* Read and cleared. */
        ASSERT_OK(engram_cuda_check(ctx, &rep));
        ASSERT_EQ_U64(rep.bad_ids, 0);
    }

    tu_current_case = "bad ids: the debug option fails the lookup at once";
    {
        engram_cuda_options o = ENGRAM_CUDA_OPTIONS_INIT;
        engram_cuda_ctx *dbg;
        engram_cuda_plan *dp;
        engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
        o.flags = ENGRAM_CUDA_DEBUG_SYNC;
        ASSERT_OK(engram_cuda_open(st, &o, &dbg));
        pa.num_cols = c.K;
        pa.tables = c.tables;
        pa.offsets = c.offsets;
        ASSERT_OK(engram_cuda_plan_create(dbg, &pa, &dp));
        ASSERT_ERR(engram_cuda_lookup(dp, &a, 0), ENGRAM_EBADID);
        ASSERT_CONTAINS(engram_errmsg(), "ids[700][1] = 99");
        ids[1990 * 3] = ids[1500 * 3 + 2] = ids[700 * 3 + 2] = 5;
        ids[700 * 3 + 1] = 105; /* column 1 has offset 100 */
        CK(cudaMemcpy(dids, c.ids, c.ids_bytes, cudaMemcpyHostToDevice));
        ASSERT_OK(engram_cuda_lookup(dp, &a, 0));
        engram_cuda_close(dbg); /* also destroys dp */
    }

    tu_current_case = "argument errors enqueue nothing";
    a.id_type = 3;
    ASSERT_ERR(engram_cuda_lookup(p, &a, 0), ENGRAM_ELAYOUT);
    a.id_type = ENGRAM_ID_INT64;
    a.out_stride_t = 264;
    a.out_stride_k = 100; /* rows overlap */
    ASSERT_ERR(engram_cuda_lookup(p, &a, 0), ENGRAM_ELAYOUT);
    a.out_stride_t = a.out_stride_k = 0;
    a.ids = (const char *)dids + 4; /* misaligned int64 ids */
    ASSERT_ERR(engram_cuda_lookup(p, &a, 0), ENGRAM_ELAYOUT);
    a.ids = NULL;
    ASSERT_ERR(engram_cuda_lookup(p, &a, 0), -EINVAL);

    engram_cuda_plan_destroy(p);
    CK(cudaFree(dbuf));
    CK(cudaFree(dids));
    free(exp);
    free(got);
    free(c.ids);
    free(c.buf);
}

/* ------------------------------------------------------------------------
 * Graph capture and replay with new ids.
 */
/* Captures c's lookup (plan p, or by tables if NULL) on s (0: a stream of
 * its own) and replays it with new ids. */
static void graph_round(engram_cuda_plan *p, gcase *c, uint64_t *rng, cudaStream_t s)
{
    int own = s == 0;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    unsigned char *dbuf = (unsigned char *)dmalloc(c->len);
    unsigned char *exp = (unsigned char *)tu_xmalloc(c->len);
    unsigned char *got = (unsigned char *)tu_xmalloc(c->len);
    void *dids = dmalloc(c->ids_bytes);
    engram_cuda_lookup_args a = gpu_args(c, dids, dbuf);

    if (own)
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ASSERT_OK(enqueue(p, c, &a, s));
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int replay = 0; replay < 4; replay++) {
        free(c->ids);
        make_ids(c, rng, 7); /* new ids, same buffer on the device */
        memset(c->buf, SENTINEL, c->len);
        memcpy(exp, c->buf, c->len);
        cpu_lookup(c, exp);
        CK(cudaMemcpy(dbuf, c->buf, c->len, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dids, c->ids, c->ids_bytes, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize()); /* s is non-blocking: see check_case() */
        CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(got, dbuf, c->len, cudaMemcpyDeviceToHost));
        if (memcmp(exp, got, c->len) != 0)
            report_diff(c, exp, got, __LINE__);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    if (own)
        CK(cudaStreamDestroy(s));
    CK(cudaFree(dbuf));
    CK(cudaFree(dids));
    free(exp);
    free(got);
}

static void test_graph(void)
{
    gcase c;
    uint64_t rng = 4242;
    engram_cuda_plan *p;
    tu_current_case = "graph capture, replayed with new ids";
    memset(&c, 0, sizeof c);
    c.T = 256;
    c.K = 4;
    for (size_t k = 0; k < 4; k++)
        c.tables[k] = tabs[k % 2].id;
    c.id_type = ENGRAM_ID_INT32;
    c.flags = ENGRAM_LOOKUP_ZERO_DEAD;
    c.R = c.out_R = 264;
    make_ids(&c, &rng, 7);
    alloc_out(&c, 64, 0);
    p = make_plan(&c);
    graph_round(p, &c, &rng, 0);
    engram_cuda_plan_destroy(p);
    free(c.ids);
    free(c.buf);
}

/* ------------------------------------------------------------------------
 * Side stream with events, and the negative control.
 */
static void CUDART_CB sleep_fn(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
}

/* The consumer copies the output out on `consumer` (pinned `got`): with
 * the wait under test (`waited`) it must be `exp`; without it the copy ran
 * before the work held up on another stream, and the comparison must see
 * that (the negative control). */
static void consumer_reads(const gcase *c, const unsigned char *exp, unsigned char *got,
                           const unsigned char *dbuf, cudaStream_t consumer, int waited, int line)
{
    CK(cudaMemcpyAsync(got, dbuf, c->len, cudaMemcpyDeviceToHost, consumer));
    CK(cudaStreamSynchronize(consumer));
    if (!waited)
        ASSERT(memcmp(exp, got, c->len) != 0);
    else if (memcmp(exp, got, c->len) != 0)
        report_diff(c, exp, got, line);
}

static void test_side_stream(void)
{
    gcase c;
    uint64_t rng = 99;
    engram_cuda_plan *p;
    cudaStream_t main_s, side;
    cudaEvent_t ev;
    unsigned char *dbuf, *exp, *got;
    void *dids;
    engram_cuda_lookup_args a;

    memset(&c, 0, sizeof c);
    c.T = 256;
    c.K = 16;
    for (size_t k = 0; k < c.K; k++)
        c.tables[k] = tabs[k % 2].id;
    c.id_type = ENGRAM_ID_INT64;
    c.R = c.out_R = 264;
    make_ids(&c, &rng, 0);
    alloc_out(&c, 0, 0);
    p = make_plan(&c);
    dbuf = (unsigned char *)dmalloc(c.len);
    dids = dmalloc(c.ids_bytes);
    CK(cudaMallocHost((void **)&got, c.len));
    exp = (unsigned char *)tu_xmalloc(c.len);
    memset(c.buf, SENTINEL, c.len);
    memcpy(exp, c.buf, c.len);
    cpu_lookup(&c, exp);
    CK(cudaMemcpy(dids, c.ids, c.ids_bytes, cudaMemcpyHostToDevice));
    CK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    a = gpu_args(&c, dids, dbuf);

    for (int wait = 0; wait < 2; wait++) {
        tu_current_case = wait ? "side stream: the consumer waits on the event"
                                : "side stream: negative control without the wait";
        CK(cudaMemset(dbuf, SENTINEL, c.len));
        CK(cudaDeviceSynchronize());
        /* The side stream is held up before the lookup, as a busy
         * prefetch stream would be. */
        CK(cudaLaunchHostFunc(side, sleep_fn, NULL));
        ASSERT_OK(engram_cuda_lookup(p, &a, side));
        CK(cudaEventRecord(ev, side));
        if (wait)
            CK(cudaStreamWaitEvent(main_s, ev, 0));
        consumer_reads(&c, exp, got, dbuf, main_s, wait, __LINE__);
        CK(cudaStreamSynchronize(side));
    }
    CK(cudaEventDestroy(ev));
    CK(cudaStreamDestroy(main_s));
    CK(cudaStreamDestroy(side));
    CK(cudaFree(dbuf));
    CK(cudaFree(dids));
    CK(cudaFreeHost(got));
    free(exp);
    engram_cuda_plan_destroy(p);
    free(c.ids);
    free(c.buf);
}

/* ------------------------------------------------------------------------
 * Registration with several stores and contexts.
 */

/* Looks up rows 0..n-1 of table `id` of `s` through context `cx` and
 * checks them against pattern `seed`. */
static void lookup_all(engram_cuda_ctx *cx, engram_table_id id, uint32_t seed, uint64_t n,
                       uint32_t rb)
{
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_plan *p;
    engram_cuda_lookup_args a = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    int64_t *ids = (int64_t *)tu_xmalloc(n * 8);
    unsigned char *out = (unsigned char *)tu_xmalloc(n * rb);
    void *dids = dmalloc(n * 8), *dout = dmalloc(n * rb);
    for (uint64_t i = 0; i < n; i++)
        ids[i] = (int64_t)(n - 1 - i);
    pa.num_cols = 1;
    pa.tables = &id;
    ASSERT_OK(engram_cuda_plan_create(cx, &pa, &p));
    CK(cudaMemcpy(dids, ids, n * 8, cudaMemcpyHostToDevice));
    a.num_tokens = n;
    a.ids = dids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = dout;
    ASSERT_OK(engram_cuda_lookup(p, &a, 0));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(out, dout, n * rb, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < n; i++)
        ASSERT_ROW(out + i * rb, seed, n - 1 - i, rb);
    ASSERT_OK(engram_cuda_check(cx, NULL));
    engram_cuda_plan_destroy(p);
    CK(cudaFree(dids));
    CK(cudaFree(dout));
    free(ids);
    free(out);
}

static void test_registration(void)
{
    engram_store *st2, *mem;
    engram_cuda_ctx *c1, *c2, *c3, *cm, *ccopy;
    engram_cuda_options o = ENGRAM_CUDA_OPTIONS_INIT;
    engram_cuda_stats s = ENGRAM_CUDA_STATS_INIT;
    engram_table_id id2, b1, b2;
    engram_table_spec spec = {100, 40, 40};
    unsigned char *page = (unsigned char *)tu_xmalloc(3 * 4096 + 100 * 40 * 2 + 64);
    unsigned char *rows1 = page + 8, *rows2 = rows1 + 100 * 40; /* share a page */
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_plan *p;
    int m;

    tu_current_case = "registration: two contexts of one store share the range";
    ASSERT_OK(engram_cuda_open(st, NULL, &c1));
    ASSERT_OK(engram_cuda_open(st, NULL, &c2));
    ASSERT_OK(engram_cuda_register(c1, tabs[0].id));
    ASSERT_OK(engram_cuda_register(c1, tabs[0].id)); /* no-op */
    m = engram_cuda_table_mode(c1, tabs[0].id);
    ASSERT(m == ENGRAM_CUDA_TABLE_MAPPED || m == ENGRAM_CUDA_TABLE_COPY);
    if (m == ENGRAM_CUDA_TABLE_COPY)
        printf("  note: this driver refused to register the read-only table mapping in place; "
               "served from a pinned copy\n");
    ASSERT_OK(engram_cuda_register(c2, tabs[0].id));
    ASSERT_EQ(engram_cuda_table_mode(c2, tabs[0].id), m);
    lookup_all(c1, tabs[0].id, tabs[0].seed, tabs[0].nrows, tabs[0].rb);
    lookup_all(c2, tabs[0].id, tabs[0].seed, tabs[0].nrows, tabs[0].rb);
    /* Closing one context keeps the other's registration alive. */
    engram_cuda_close(c1);
    lookup_all(c2, tabs[0].id, tabs[0].seed, tabs[0].nrows, tabs[0].rb);

    tu_current_case = "registration: a plan holds its tables";
    pa.num_cols = 1;
    pa.tables = &tabs[0].id;
    ASSERT_OK(engram_cuda_plan_create(c2, &pa, &p));
    ASSERT_ERR(engram_cuda_unregister(c2, tabs[0].id), ENGRAM_ESTATE);
    engram_cuda_plan_destroy(p);
    ASSERT_OK(engram_cuda_unregister(c2, tabs[0].id));
    ASSERT_EQ(engram_cuda_table_mode(c2, tabs[0].id), ENGRAM_CUDA_TABLE_NONE);
    ASSERT_ERR(engram_cuda_unregister(c2, tabs[0].id), -ENOENT);
    ASSERT_OK(engram_cuda_register(c2, tabs[0].id)); /* again after unregistering */
    lookup_all(c2, tabs[0].id, tabs[0].seed, tabs[0].nrows, tabs[0].rb);

    tu_current_case = "registration: a second store of the same namespace";
    st2 = tu_open("g", 0, 1);
    ASSERT_OK(engram_table_open(st2, tabs[1].name, &id2));
    ASSERT_OK(engram_cuda_open(st2, NULL, &c3));
    lookup_all(c3, id2, tabs[1].seed, tabs[1].nrows, tabs[1].rb);
    lookup_all(c2, tabs[1].id, tabs[1].seed, tabs[1].nrows, tabs[1].rb);
    engram_cuda_close(c3);
    engram_store_close(st2);
    lookup_all(c2, tabs[1].id, tabs[1].seed, tabs[1].nrows, tabs[1].rb);

    tu_current_case = "registration: bound memory, unaligned, two tables in one page";
    for (int i = 0; i < 100; i++) {
        tu_fill_row(rows1 + i * 40, 31, (uint64_t)i, 40);
        tu_fill_row(rows2 + i * 40, 32, (uint64_t)i, 40);
    }
    ASSERT_OK(engram_store_open_memory(NULL, &mem));
    ASSERT_OK(engram_bind(mem, "b1", &spec, rows1));
    ASSERT_OK(engram_bind(mem, "b2", &spec, rows2));
    ASSERT_OK(engram_table_open(mem, "b1", &b1));
    ASSERT_OK(engram_table_open(mem, "b2", &b2));
    ASSERT_OK(engram_cuda_open(mem, NULL, &cm));
    lookup_all(cm, b1, 31, 100, 40);
    lookup_all(cm, b2, 32, 100, 40);
    m = engram_cuda_table_mode(cm, b1);
    ASSERT(m == ENGRAM_CUDA_TABLE_MAPPED || m == ENGRAM_CUDA_TABLE_COPY);
    ASSERT(engram_cuda_table_mode(cm, b2) == ENGRAM_CUDA_TABLE_MAPPED ||
           engram_cuda_table_mode(cm, b2) == ENGRAM_CUDA_TABLE_COPY);
    ASSERT_OK(engram_cuda_get_stats(cm, &s));
    ASSERT_EQ_U64(s.tables_mapped + s.tables_copied, 2);
    ASSERT_EQ_U64(s.mapped_bytes + s.copied_bytes, 2 * 100 * 40);
    engram_cuda_close(cm);

    tu_current_case = "registration: ENGRAM_CUDA_COPY_TABLES serves pinned copies";
    o.flags = ENGRAM_CUDA_COPY_TABLES;
    ASSERT_OK(engram_cuda_open(st, &o, &ccopy));
    lookup_all(ccopy, tabs[2].id, tabs[2].seed, tabs[2].nrows, tabs[2].rb);
    ASSERT_EQ(engram_cuda_table_mode(ccopy, tabs[2].id), ENGRAM_CUDA_TABLE_COPY);
    ASSERT_OK(engram_cuda_get_stats(ccopy, &s));
    ASSERT_EQ_U64(s.tables_copied, 1);
    ASSERT_EQ_U64(s.copied_bytes, (tabs[2].nrows - 1) * tabs[2].pitch + tabs[2].rb);
    engram_cuda_close(ccopy);
    engram_cuda_close(c2);
    engram_store_close(mem);
    free(page);

    tu_current_case = "registration: bad ids of tables";
    ASSERT_OK(engram_cuda_open(st, NULL, &c1));
    ASSERT_ERR(engram_cuda_register(c1, 1u << 20), -EINVAL);
    engram_cuda_close(c1);
}

/* ------------------------------------------------------------------------
 * Host path: a table without a base address.
 */
static const unsigned char *fake_rows;
static engram_table_id ondemand; /* the source table of test_host_path() */
enum { FAKE_ROWS = 400 };

static int fake_read(void *unused, engram_source_req *reqs, size_t n)
{
    (void)unused;
    for (size_t i = 0; i < n; i++)
        memcpy(reqs[i].dst, fake_rows + reqs[i].row * 264, 264);
    return 0;
}

static void test_host_path(void)
{
    engram_table_spec spec = {FAKE_ROWS, 264, 264};
    unsigned char *rows = tu_make_rows(50, FAKE_ROWS, 264, 264, 0);
    engram_table_id fid;
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_plan *p;
    engram_cuda_stats s = ENGRAM_CUDA_STATS_INIT;
    gcase c;
    uint64_t rng = 11;
    cudaStream_t strm;

    tu_current_case = "host path: mixed with mapped columns";
    fake_rows = rows;
    {
        engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
        ops.read_rows = fake_read;
        ASSERT_OK(engram_add_source(st, "ondemand", &spec, &ops, NULL, 0, &fid));
        ondemand = fid;
    }
    {
        /* A fixture entry so make_ids knows its size. */
        static gt extra = {"ondemand", 50, 264, 264, FAKE_ROWS, 0};
        extra.id = fid;
        tabs[NTABS - 1] = extra; /* replaces r264p268, not used below */
    }
    memset(&c, 0, sizeof c);
    c.T = 300;
    c.K = 3;
    c.tables[0] = tabs[0].id;
    c.tables[1] = fid;
    c.tables[2] = tabs[1].id;
    c.use_offsets = 1;
    c.offsets[1] = 17;
    c.id_type = ENGRAM_ID_INT32;
    c.flags = ENGRAM_LOOKUP_ZERO_DEAD;
    c.R = c.out_R = 264;
    make_ids(&c, &rng, 6);
    alloc_out(&c, 64, 0);
    pa.num_cols = 3;
    pa.tables = c.tables;
    pa.offsets = c.offsets;
    ASSERT_ERR(engram_cuda_plan_create(ctx, &pa, &p), -EINVAL); /* no max_tokens */
    pa.max_tokens = 512;
    ASSERT_OK(engram_cuda_plan_create(ctx, &pa, &p));
    ASSERT_EQ(engram_cuda_table_mode(ctx, fid), ENGRAM_CUDA_TABLE_HOST);
    CK(cudaStreamCreateWithFlags(&strm, cudaStreamNonBlocking));
    check_case(&c, p, strm, __LINE__);
    c.flags = 0;
    check_case(&c, p, strm, __LINE__);

    tu_current_case = "host path: bad ids reported like the GPU path";
    {
        unsigned char *dbuf = (unsigned char *)dmalloc(c.len);
        void *dids = dmalloc(c.ids_bytes);
        engram_cuda_report rep = ENGRAM_CUDA_REPORT_INIT;
        engram_cuda_lookup_args a;
        ((int32_t *)c.ids)[10 * 3 + 1] = 16; /* below the offset */
        CK(cudaMemcpy(dids, c.ids, c.ids_bytes, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize()); /* strm is non-blocking: see check_case() */
        a = gpu_args(&c, dids, dbuf);
        ASSERT_OK(engram_cuda_lookup(p, &a, strm));
        CK(cudaStreamSynchronize(strm));
        ASSERT_ERR(engram_cuda_check(ctx, &rep), ENGRAM_EBADID);
        ASSERT_EQ_U64(rep.bad_ids, 1);
        ASSERT_EQ_U64(rep.first_token, 10);
        ASSERT_EQ(rep.first_col, 1);
        ASSERT_EQ(rep.host_error, 0);
        a.num_tokens = 513;
        ASSERT_ERR(engram_cuda_lookup(p, &a, strm), -EINVAL); /* over max_tokens */
        ((int32_t *)c.ids)[10 * 3 + 1] = 17;
        CK(cudaFree(dbuf));
        CK(cudaFree(dids));
    }

    tu_current_case = "host path: graph capture and replay";
    graph_round(p, &c, &rng, 0);
    ASSERT_OK(engram_cuda_get_stats(ctx, &s));
    ASSERT_GE(s.host_gathers, 4 + 3);
    ASSERT_GE(s.tables_host, 1);

    CK(cudaStreamDestroy(strm));
    engram_cuda_plan_destroy(p);
    free(c.ids);
    free(c.buf);
    /* The store keeps reading `rows` until it closes (at exit). */
}

/* ------------------------------------------------------------------------
 * Ids and offsets anywhere in int64, against a 128-bit reference: the
 * kernel (mapped columns) and the host path (the source table of
 * test_host_path()) skip and report exactly the ids whose exact
 * difference id - offset is outside the table, such as id INT64_MIN with
 * offset INT64_MAX (-2^64 + 1, which wraps to 1 in 64 bits).
 */
__extension__ typedef __int128 g_i128;

/* 1 if id is bad in a column of `nrows` rows with offset `off`. */
static int ref_bad(int64_t id, int64_t off, uint64_t nrows)
{
    g_i128 d = (g_i128)id - (g_i128)off;
    return id != ENGRAM_DEAD_ID && !(d >= 0 && d < (g_i128)nrows);
}

/* A value within `spread` of `base`, wrapping around int64. */
static int64_t g_near(uint64_t *rng, int64_t base, uint64_t spread)
{
    return (int64_t)((uint64_t)base + tu_rand_below(rng, 2 * spread + 1) - spread);
}

/* An id near where the answer changes for offset `off` and `nrows` rows:
 * off + r modulo 2^64 (a row, or a difference that wraps onto one), the
 * ends of int64 and int32, -1, or anywhere. */
static int64_t g_fuzz_id(uint64_t *rng, int64_t off, uint64_t nrows)
{
    switch (tu_rand_below(rng, 6)) {
    case 0:
    case 1:
        return (int64_t)((uint64_t)off + tu_rand_below(rng, nrows + 8) - 4);
    case 2:
        return g_near(rng, tu_rand_below(rng, 2) ? INT64_MIN : INT64_MAX, nrows + 4);
    case 3:
        return g_near(rng, tu_rand_below(rng, 2) ? INT32_MIN : INT32_MAX, nrows + 4);
    case 4:
        return -1;
    default:
        return (int64_t)tu_rand(rng);
    }
}

static void test_offset_extremes(void)
{
    enum { T = 300, K = 4 };
    static const int64_t fixed[K] = {INT64_MAX, INT64_MIN, INT64_MAX - 5, INT64_MAX - 3};
    static const int64_t bases[] = {INT64_MIN, INT64_MAX, 0, -1, INT32_MIN, INT32_MAX};
    const uint64_t nrows[K] = {tabs[0].nrows, tabs[1].nrows, tabs[2].nrows, FAKE_ROWS};
    uint64_t rng = 0x0FF5E7;
    gcase c;

    tu_current_case = "ids and offsets at the ends of int64";
    memset(&c, 0, sizeof c);
    c.T = T;
    c.K = K;
    c.tables[0] = tabs[0].id; /* r264p272a, 1000 rows */
    c.tables[1] = tabs[1].id; /* r264p272b, 777 rows */
    c.tables[2] = tabs[2].id; /* r264p264, 513 rows */
    c.tables[3] = ondemand;   /* a source table: the host path */
    c.use_offsets = 1;
    c.max_tokens = T;
    c.R = c.out_R = 264;
    alloc_out(&c, 64, 0);
    for (int round = 0; round < 12; round++) {
        int64_t ids64[T * K], clean[T * K];
        int32_t ids32[T * K], clean32[T * K];
        uint64_t nbad = 0, first = ~0ull;
        engram_cuda_report rep = ENGRAM_CUDA_REPORT_INIT;
        unsigned char *exp = (unsigned char *)tu_xmalloc(c.len);
        unsigned char *got = (unsigned char *)tu_xmalloc(c.len);
        unsigned char *dbuf = (unsigned char *)dmalloc(c.len);
        void *dids = dmalloc(sizeof ids64);
        engram_cuda_plan *p;
        engram_cuda_lookup_args a;

        /* Round 0: the extreme offsets; then offsets near the ends of
         * int64 and int32, int32 ids every third round. */
        c.id_type = round % 3 == 2 ? ENGRAM_ID_INT32 : ENGRAM_ID_INT64;
        for (int k = 0; k < K; k++)
            c.offsets[k] = round == 0 ? fixed[k]
                                      : g_near(&rng, bases[tu_rand_below(&rng, 6)], 1200);
        for (int i = 0; i < T * K; i++) {
            int k = i % K;
            int64_t id = g_fuzz_id(&rng, c.offsets[k], nrows[k]);
            if (c.id_type == ENGRAM_ID_INT32)
                id = ids32[i] = (int32_t)id;
            ids64[i] = id;
            if (ref_bad(id, c.offsets[k], nrows[k])) {
                nbad++;
                first = first == ~0ull ? (uint64_t)i : first;
                id = ENGRAM_DEAD_ID;
            }
            clean[i] = id;
            clean32[i] = (int32_t)id;
        }
        /* The reference output: the CPU lookup of the good ids (a skipped
         * bad id leaves its row like a kept dead one). */
        memset(c.buf, SENTINEL, c.len);
        memcpy(exp, c.buf, c.len);
        c.ids = c.id_type == ENGRAM_ID_INT32 ? (void *)clean32 : (void *)clean;
        cpu_lookup(&c, exp);
        c.ids = c.id_type == ENGRAM_ID_INT32 ? (void *)ids32 : (void *)ids64;
        c.ids_bytes = c.id_type == ENGRAM_ID_INT32 ? sizeof ids32 : sizeof ids64;

        p = make_plan(&c);
        CK(cudaMemcpy(dbuf, c.buf, c.len, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dids, c.ids, c.ids_bytes, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize());
        a = gpu_args(&c, dids, dbuf);
        ASSERT_OK(engram_cuda_lookup(p, &a, 0));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got, dbuf, c.len, cudaMemcpyDeviceToHost));
        if (memcmp(exp, got, c.len) != 0)
            report_diff(&c, exp, got, __LINE__);
        if (nbad) {
            ASSERT_ERR(engram_cuda_check(ctx, &rep), ENGRAM_EBADID);
            ASSERT_EQ_U64(rep.first_token, first / K);
            ASSERT_EQ(rep.first_col, (uint32_t)(first % K));
            ASSERT_EQ(rep.first_id, ids64[first]);
        } else {
            ASSERT_OK(engram_cuda_check(ctx, &rep));
        }
        ASSERT_EQ_U64(rep.bad_ids, nbad);
        ASSERT_EQ(rep.host_error, 0); /* the host path took the same ids */
        engram_cuda_plan_destroy(p);
        CK(cudaFree(dbuf));
        CK(cudaFree(dids));
        free(exp);
        free(got);
    }
    c.ids = NULL;
    free(c.buf);
}

/* ------------------------------------------------------------------------
 * Lookups by tables: the plans the context keeps.
 */
static uint64_t live_plans(void)
{
    engram_cuda_stats s = ENGRAM_CUDA_STATS_INIT;
    ASSERT_OK(engram_cuda_get_stats(ctx, &s));
    return s.plans;
}

/* A fresh case of T tokens over K columns `tables` (offsets `offs` or
 * none), int64 ids with some dead, contiguous output. */
static void new_case(gcase *c, size_t T, size_t K, const engram_table_id *tables,
                     const int64_t *offs, uint64_t *rng)
{
    memset(c, 0, sizeof *c);
    c->T = T;
    c->K = K;
    for (size_t k = 0; k < K; k++) {
        c->tables[k] = tables[k];
        c->offsets[k] = offs ? offs[k] : 0;
    }
    c->use_offsets = offs != NULL;
    c->id_type = ENGRAM_ID_INT64;
    for (size_t i = 0; i < NTABS; i++)
        if (tabs[i].id == tables[0])
            c->R = c->out_R = tabs[i].rb;
    make_ids(c, rng, 7);
    alloc_out(c, 64, 0);
}

/* Args of a lookup of no tokens and no arrays: a warm-up. */
static engram_cuda_lookup_args no_tokens(void)
{
    engram_cuda_lookup_args a = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    a.id_type = ENGRAM_ID_INT64;
    return a;
}

static void free_case(gcase *c)
{
    free(c->ids);
    free(c->buf);
}

/* Device buffers for refused lookups (made before any capture). */
static void *refused_ids, *refused_out;
enum { REFUSED_IDS = 1 << 16, REFUSED_OUT = 1 << 20 };

/* A lookup by tables of c on s must be refused with `code`, its message
 * naming `why`, and make no plan. */
static void refused(const gcase *c, cudaStream_t s, int code, const char *why)
{
    engram_cuda_plan_args pa = cols_of(c);
    engram_cuda_lookup_args a;
    uint64_t before = live_plans();
    ASSERT(c->ids_bytes <= REFUSED_IDS && c->len <= REFUSED_OUT);
    a = gpu_args(c, refused_ids, (unsigned char *)refused_out);
    ASSERT_ERR(engram_cuda_lookup_tables(ctx, &pa, &a, s), code);
    ASSERT_CONTAINS(engram_errmsg(), why);
    ASSERT_EQ_U64(live_plans(), before);
}

/* Threads racing for one new plan. */
typedef struct racer {
    gcase c;
    pthread_barrier_t *bar;
} racer;

static void *race_run(void *arg)
{
    racer *r = (racer *)arg;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    pthread_barrier_wait(r->bar);
    check_case(&r->c, NULL, s, __LINE__);
    CK(cudaStreamDestroy(s));
    return NULL;
}

static void test_lookup_tables(void)
{
    const engram_table_id mapped3[3] = {tabs[0].id, tabs[1].id, tabs[0].id};
    const engram_table_id mixed[2] = {tabs[0].id, ondemand};
    const int64_t zeros[3] = {0, 0, 0}, offs3[3] = {0, 100, 7}, offs2[2] = {5, 17};
    engram_cuda_plan_args pa;
    engram_cuda_lookup_args a;
    gcase c, c2;
    inflight f1, f2;
    uint64_t rng = 5150, before;
    cudaStream_t s1, s2;
    int ndev = 0;

    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    refused_ids = dmalloc(REFUSED_IDS);
    refused_out = dmalloc(REFUSED_OUT);

    tu_current_case = "lookup by tables: one plan per set of columns, on every stream";
    new_case(&c, 200, 3, mapped3, NULL, &rng);
    before = live_plans();
    check_case(&c, NULL, s1, __LINE__);
    ASSERT_EQ_U64(live_plans(), before + 1);
    check_case(&c, NULL, s2, __LINE__);
    check_case(&c, NULL, 0, __LINE__);
    check_case(&c, NULL, cudaStreamPerThread, __LINE__); /* no host path: any stream */
    free_case(&c);
    new_case(&c, 150, 3, mapped3, zeros, &rng); /* all-zero offsets: the same columns */
    check_case(&c, NULL, s1, __LINE__);
    ASSERT_EQ_U64(live_plans(), before + 1);
    graph_round(NULL, &c, &rng, 0); /* the plan exists: capturable on any stream */
    ASSERT_EQ_U64(live_plans(), before + 1);
    free_case(&c);
    new_case(&c, 150, 3, mapped3, offs3, &rng); /* other offsets: other columns */
    check_case(&c, NULL, s1, __LINE__);
    ASSERT_EQ_U64(live_plans(), before + 2);
    /* The tables hold: a plan of the context reads them until it closes. */
    ASSERT_ERR(engram_cuda_unregister(ctx, tabs[1].id), ENGRAM_ESTATE);
    free_case(&c);

    tu_current_case = "lookup by tables: a callback source table on two streams at once";
    new_case(&c, 300, 2, mixed, offs2, &rng);
    new_case(&c2, 280, 2, mixed, offs2, &rng);
    before = live_plans();
    for (int round = 0; round < 2; round++) {
        case_start(&c, &f1, NULL, s1, -1);
        case_start(&c2, &f2, NULL, s2, -1);
        case_finish(&c, &f1, s1, __LINE__);
        case_finish(&c2, &f2, s2, __LINE__);
        ASSERT_EQ_U64(live_plans(), before + 2); /* its staging is per stream */
    }
    free_case(&c2);

    tu_current_case = "lookup by tables: the capture rules of the host path";
    refused(&c, cudaStreamPerThread, -EINVAL, "cudaStreamPerThread");
    {
        cudaStream_t s3;
        cudaGraph_t g;
        CK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
        CK(cudaStreamBeginCapture(s3, cudaStreamCaptureModeGlobal));
        refused(&c, s3, ENGRAM_ESTATE, "runs before any capture"); /* no plan on s3 yet */
        CK(cudaStreamEndCapture(s3, &g)); /* the capture was not disturbed */
        CK(cudaGraphDestroy(g));
        /* A warm-up: no tokens, no arrays; then the capture works. */
        pa = cols_of(&c);
        a = no_tokens();
        ASSERT_OK(engram_cuda_lookup_tables(ctx, &pa, &a, s3));
        ASSERT_EQ_U64(live_plans(), before + 3);
        graph_round(NULL, &c, &rng, s3);
        ASSERT_EQ_U64(live_plans(), before + 3);
        CK(cudaStreamDestroy(s3));
    }
    free_case(&c);

    tu_current_case = "lookup by tables: host-path staging grows, the old plan retired";
    {
        static const size_t Ts[] = {10, 64, 65, 100, 300};
        static const uint64_t made[] = {1, 1, 2, 2, 3};
        const int64_t off1 = 3;
        cudaGraph_t g;
        before = live_plans();
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            new_case(&c, Ts[i], 1, &ondemand, &off1, &rng);
            c.max_tokens = 64; /* then 128, then 300 (> 256) */
            check_case(&c, NULL, s1, __LINE__);
            ASSERT_EQ_U64(live_plans(), before + made[i]);
            if (Ts[i] != 300)
                free_case(&c);
        }
        c.T = 301; /* more than the staging holds: growing is refused under capture */
        free(c.ids);
        make_ids(&c, &rng, 7);
        CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
        refused(&c, s1, ENGRAM_ESTATE, "grows its staging");
        CK(cudaStreamEndCapture(s1, &g));
        CK(cudaGraphDestroy(g));
        check_case(&c, NULL, s1, __LINE__); /* outside the capture it grows */
        ASSERT_EQ_U64(live_plans(), before + 4);
        free_case(&c);
    }

    tu_current_case = "lookup by tables: host-path plans for at most 16 streams";
    {
        cudaStream_t ss[ENGRAM_CUDA_HOST_STREAMS + 1];
        const int64_t off1 = 9;
        new_case(&c, 8, 1, &ondemand, &off1, &rng);
        c.max_tokens = 16;
        pa = cols_of(&c);
        a = no_tokens();
        before = live_plans();
        for (unsigned i = 0; i <= ENGRAM_CUDA_HOST_STREAMS; i++) {
            CK(cudaStreamCreateWithFlags(&ss[i], cudaStreamNonBlocking));
            if (i < ENGRAM_CUDA_HOST_STREAMS)
                ASSERT_OK(engram_cuda_lookup_tables(ctx, &pa, &a, ss[i]));
        }
        ASSERT_EQ_U64(live_plans(), before + ENGRAM_CUDA_HOST_STREAMS);
        refused(&c, ss[ENGRAM_CUDA_HOST_STREAMS], ENGRAM_ESTATE, "plans for 16 streams");
        check_case(&c, NULL, ss[3], __LINE__); /* the streams that have one go on */
        for (unsigned i = 0; i <= ENGRAM_CUDA_HOST_STREAMS; i++)
            CK(cudaStreamDestroy(ss[i]));
        free_case(&c);
    }

    tu_current_case = "lookup by tables: argument errors";
    new_case(&c, 4, 3, mapped3, NULL, &rng);
    pa = cols_of(&c);
    a = no_tokens();
    a.num_tokens = c.T; /* ids and out NULL */
    ASSERT_ERR(engram_cuda_lookup_tables(NULL, &pa, &a, s1), -EINVAL);
    ASSERT_ERR(engram_cuda_lookup_tables(ctx, NULL, &a, s1), -EINVAL);
    ASSERT_ERR(engram_cuda_lookup_tables(ctx, &pa, NULL, s1), -EINVAL);
    pa.num_cols = 0;
    ASSERT_ERR(engram_cuda_lookup_tables(ctx, &pa, &a, s1), -EINVAL);
    pa = cols_of(&c);
    pa.size = 1;
    ASSERT_ERR(engram_cuda_lookup_tables(ctx, &pa, &a, s1), -EINVAL);
    pa = cols_of(&c);
    ASSERT_ERR(engram_cuda_lookup_tables(ctx, &pa, &a, s1), -EINVAL); /* ids and out NULL */

    tu_current_case = "lookup by tables: the context's device made current for the call";
    CK(cudaGetDeviceCount(&ndev));
    if (ndev >= 2) {
        engram_cuda_plan *p = make_plan(&c);
        void *dids = dmalloc(c.ids_bytes), *dbuf = dmalloc(c.len);
        inflight f;
        check_case(&c, NULL, s1, __LINE__);
        case_start(&c, &f, NULL, s1, 1); /* device 1 current: switched to 0 and back */
        case_finish(&c, &f, s1, __LINE__);
        /* An explicit plan needs the caller to make it current. */
        a = gpu_args(&c, dids, (unsigned char *)dbuf);
        CK(cudaSetDevice(1));
        ASSERT_ERR(engram_cuda_lookup(p, &a, s1), -EINVAL);
        CK(cudaSetDevice(0));
        CK(cudaFree(dids));
        CK(cudaFree(dbuf));
        engram_cuda_plan_destroy(p);
    } else {
        tu_skip_part("one CUDA device: the device switch of lookups by tables");
    }
    free_case(&c);

    tu_current_case = "lookup by tables: threads racing for one new plan";
    {
        enum { NR = 8 };
        static racer rs[NR];
        pthread_t th[NR];
        pthread_barrier_t bar;
        const engram_table_id t1 = tabs[3].id;
        const int64_t off1 = 11;
        pthread_barrier_init(&bar, NULL, NR);
        before = live_plans();
        for (int i = 0; i < NR; i++) {
            new_case(&rs[i].c, 50 + (size_t)i, 1, &t1, &off1, &rng);
            rs[i].bar = &bar;
        }
        for (int i = 0; i < NR; i++)
            ASSERT_EQ(pthread_create(&th[i], NULL, race_run, &rs[i]), 0);
        for (int i = 0; i < NR; i++)
            ASSERT_EQ(pthread_join(th[i], NULL), 0);
        ASSERT_EQ_U64(live_plans(), before + 1); /* the losers' plans were destroyed */
        for (int i = 0; i < NR; i++)
            free_case(&rs[i].c);
        pthread_barrier_destroy(&bar);
    }

    CK(cudaFree(refused_ids));
    CK(cudaFree(refused_out));
    CK(cudaStreamDestroy(s1));
    CK(cudaStreamDestroy(s2));
}

/* ------------------------------------------------------------------------
 * Ordering after a producer stream.
 */
static void test_order_after(void)
{
    const engram_table_id t2[2] = {tabs[0].id, tabs[1].id};
    engram_cuda_plan_args pa;
    engram_cuda_lookup_args a;
    gcase c;
    uint64_t rng = 31337;
    cudaStream_t p, q, b;
    cudaGraph_t g, g2;
    unsigned char *dbuf, *got, *exp;
    void *dids, *hids;

    new_case(&c, 256, 2, t2, NULL, &rng);
    pa = cols_of(&c);
    dbuf = (unsigned char *)dmalloc(c.len);
    dids = dmalloc(c.ids_bytes);
    CK(cudaMallocHost(&hids, c.ids_bytes));
    CK(cudaMallocHost((void **)&got, c.len));
    exp = (unsigned char *)tu_xmalloc(c.len);
    memcpy(hids, c.ids, c.ids_bytes);
    memset(c.buf, SENTINEL, c.len);
    memcpy(exp, c.buf, c.len);
    cpu_lookup(&c, exp);
    CK(cudaStreamCreateWithFlags(&p, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&q, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamDefault)); /* blocking */
    a = gpu_args(&c, dids, dbuf);
    ASSERT_OK(engram_cuda_lookup_tables(ctx, &pa, &a, q)); /* the plan, made before */
    CK(cudaDeviceSynchronize());

    for (int wait = 0; wait < 2; wait++) {
        tu_current_case = wait ? "order after: the lookup waits for the ids' producer"
                                : "order after: negative control without the wait";
        CK(cudaMemset(dids, 0, c.ids_bytes)); /* stale ids: row 0 everywhere */
        CK(cudaMemset(dbuf, SENTINEL, c.len));
        CK(cudaDeviceSynchronize());
        /* The producer writes the ids late, as a busy stream would. */
        CK(cudaLaunchHostFunc(p, sleep_fn, NULL));
        CK(cudaMemcpyAsync(dids, hids, c.ids_bytes, cudaMemcpyHostToDevice, p));
        if (wait)
            ASSERT_OK(engram_cuda_order_after(ctx, q, p));
        ASSERT_OK(engram_cuda_lookup_tables(ctx, &pa, &a, q));
        consumer_reads(&c, exp, got, dbuf, q, wait, __LINE__);
        CK(cudaStreamSynchronize(p));
    }

    tu_current_case = "order after: the same stream, and the capture rules";
    ASSERT_OK(engram_cuda_order_after(ctx, q, q));
    ASSERT_OK(engram_cuda_order_after(ctx, 0, cudaStreamLegacy));
    ASSERT_ERR(engram_cuda_order_after(NULL, q, p), -EINVAL);
    /* q captured, p not: p's work predates the capture, nothing to do. */
    CK(cudaStreamBeginCapture(q, cudaStreamCaptureModeGlobal));
    ASSERT_OK(engram_cuda_order_after(ctx, q, p));
    CK(cudaStreamEndCapture(q, &g)); /* not invalidated */
    CK(cudaGraphDestroy(g));
    /* p captured, q not: waiting would pull q into p's graph. */
    CK(cudaStreamBeginCapture(p, cudaStreamCaptureModeGlobal));
    ASSERT_ERR(engram_cuda_order_after(ctx, q, p), ENGRAM_ESTATE);
    ASSERT_CONTAINS(engram_errmsg(), "captured into a graph");
    CK(cudaStreamEndCapture(p, &g));
    CK(cudaGraphDestroy(g));
    /* The legacy stream cannot be used while a blocking stream captures
     * (relaxed captures: only the rule under test). */
    CK(cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed));
    ASSERT_ERR(engram_cuda_order_after(ctx, q, 0), ENGRAM_ESTATE);
    ASSERT_CONTAINS(engram_errmsg(), "legacy default stream");
    CK(cudaStreamBeginCapture(q, cudaStreamCaptureModeRelaxed));
    ASSERT_OK(engram_cuda_order_after(ctx, q, 0)); /* q captured: nothing to do */
    CK(cudaStreamEndCapture(q, &g2));
    CK(cudaStreamEndCapture(b, &g));
    CK(cudaGraphDestroy(g));
    CK(cudaGraphDestroy(g2));

    CK(cudaStreamDestroy(p));
    CK(cudaStreamDestroy(q));
    CK(cudaStreamDestroy(b));
    CK(cudaFree(dbuf));
    CK(cudaFree(dids));
    CK(cudaFreeHost(hids));
    CK(cudaFreeHost(got));
    free(exp);
    free_case(&c);
}

/* ------------------------------------------------------------------------
 * Dequant.
 */
/* Dequant lookups with plan p, or by tables `cols` (the context's plan)
 * when p is NULL, against the CPU reference. */
static void dequant_check(engram_cuda_plan *p, const engram_cuda_plan_args *cols,
                          const unsigned char *const *wmem, const uint32_t *wpitch,
                          const unsigned char *const *smem, size_t K, size_t T, size_t misalign,
                          uint32_t flags)
{
    size_t N = 256, orow = 2 * N, len = T * K * orow + misalign;
    int64_t *ids = (int64_t *)tu_xmalloc(T * K * 8);
    uint16_t *exp = (uint16_t *)tu_xmalloc(len + 2), *got = (uint16_t *)tu_xmalloc(len + 2);
    unsigned char *dout = (unsigned char *)dmalloc(len);
    void *dids = dmalloc(T * K * 8);
    engram_cuda_lookup_args a = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    uint64_t rng = T * 31 + K;
    memset(exp, 0x77, len);
    for (size_t t = 0; t < T; t++)
        for (size_t k = 0; k < K; k++) {
            int64_t id = tu_rand_below(&rng, 8) == 0 ? -1 : (int64_t)tu_rand_below(&rng, 300);
            unsigned char *o = (unsigned char *)exp + misalign + (t * K + k) * orow;
            ids[t * K + k] = id;
            if (id == -1) {
                if (flags & ENGRAM_LOOKUP_ZERO_DEAD)
                    memset(o, 0, orow);
                continue;
            }
            {
                const unsigned char *row = wmem[k] + (size_t)id * wpitch[k];
                const unsigned char *scales = smem ? smem[k] + (size_t)id * 8 : row + 256;
                uint16_t tmp[256];
                ASSERT_OK(engram_dequant_fp8_e4m3_e8m0_ref(row, scales, N, tmp));
                memcpy(o, tmp, orow);
            }
        }
    CK(cudaMemset(dout, 0x77, len)); /* dead rows stay 0x77 unless zero-filled */
    CK(cudaMemcpy(dids, ids, T * K * 8, cudaMemcpyHostToDevice));
    a.flags = flags;
    a.num_tokens = T;
    a.ids = dids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = dout + misalign;
    ASSERT_OK(p ? engram_cuda_lookup(p, &a, 0) : engram_cuda_lookup_tables(ctx, cols, &a, 0));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dout, len, cudaMemcpyDeviceToHost));
    if (memcmp(exp, got, len) != 0) {
        size_t i = 0;
        while (((unsigned char *)exp)[i] == ((unsigned char *)got)[i])
            i++;
        fprintf(stderr, "FAIL [%s]: dequant output differs at byte %zu (T=%zu K=%zu misalign %zu)\n",
                tu_current_case, i, T, K, misalign);
        tu_fail_exit();
    }
    ASSERT_OK(engram_cuda_check(ctx, NULL));
    CK(cudaFree(dout));
    CK(cudaFree(dids));
    free(ids);
    free(exp);
    free(got);
}

static void test_dequant(void)
{
    engram_store *mem;
    unsigned char *packed = (unsigned char *)tu_xmalloc(300 * 264);
    unsigned char *odd = (unsigned char *)tu_xmalloc(300 * 265);
    unsigned char *wts = (unsigned char *)tu_xmalloc(300 * 256);
    unsigned char *scl = (unsigned char *)tu_xmalloc(300 * 8);
    engram_table_spec sp_packed = {300, 264, 264}, sp_odd = {300, 264, 265};
    engram_table_spec sp_w = {300, 256, 256}, sp_s = {300, 8, 8};
    engram_table_id tp, to, tw, ts;
    engram_cuda_ctx *saved = ctx;
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_plan *p;
    uint64_t rng = 123;

    /* Random bytes: every E4M3 code including NaN, and scales spread over
     * the whole E8M0 range including 0 and 255. */
    for (size_t i = 0; i < 300 * 264; i++)
        packed[i] = (unsigned char)tu_rand(&rng);
    for (size_t i = 0; i < 300; i++)
        memcpy(odd + i * 265, packed + i * 264, 264);
    for (size_t i = 0; i < 300; i++) {
        memcpy(wts + i * 256, packed + i * 264, 256);
        memcpy(scl + i * 8, packed + i * 264 + 256, 8);
    }
    ASSERT_OK(engram_store_open_memory(NULL, &mem));
    ASSERT_OK(engram_bind(mem, "packed", &sp_packed, packed));
    ASSERT_OK(engram_bind(mem, "odd", &sp_odd, odd));
    ASSERT_OK(engram_bind(mem, "w", &sp_w, wts));
    ASSERT_OK(engram_bind(mem, "s", &sp_s, scl));
    ASSERT_OK(engram_table_open(mem, "packed", &tp));
    ASSERT_OK(engram_table_open(mem, "odd", &to));
    ASSERT_OK(engram_table_open(mem, "w", &tw));
    ASSERT_OK(engram_table_open(mem, "s", &ts));
    ASSERT_OK(engram_cuda_open(mem, NULL, &ctx));

    tu_current_case = "dequant: packed rows, vector and scalar variants";
    {
        engram_table_id t2[2] = {tp, tp};
        const unsigned char *wm[2] = {packed, packed};
        uint32_t wp[2] = {264, 264};
        pa.op = ENGRAM_CUDA_OP_DEQUANT_FP8;
        pa.num_cols = 2;
        pa.tables = t2;
        ASSERT_OK(engram_cuda_plan_create(ctx, &pa, &p));
        ASSERT_EQ(engram_cuda_plan_out_row_bytes(p), 512);
        dequant_check(p, NULL, wm, wp, NULL, 2, 1, 0, 0);
        dequant_check(p, NULL, wm, wp, NULL, 2, 700, 0, ENGRAM_LOOKUP_ZERO_DEAD);
        dequant_check(p, NULL, wm, wp, NULL, 2, 300, 2, 0); /* 2-aligned output: scalar */
        engram_cuda_plan_destroy(p);
        /* By tables: the op is part of the columns, so a gather of the
         * same tables first must not serve the dequant after it. */
        {
            engram_cuda_plan_args gather = pa;
            engram_cuda_lookup_args ga = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
            int64_t *gids = (int64_t *)dmalloc(2 * sizeof(int64_t));
            unsigned char *gout = (unsigned char *)dmalloc(2 * 264);
            CK(cudaMemset(gids, 0, 2 * sizeof(int64_t)));
            gather.op = ENGRAM_CUDA_OP_GATHER;
            ga.num_tokens = 1;
            ga.ids = gids;
            ga.id_type = ENGRAM_ID_INT64;
            ga.out = gout;
            ASSERT_OK(engram_cuda_lookup_tables(ctx, &gather, &ga, 0));
            dequant_check(NULL, &pa, wm, wp, NULL, 2, 300, 0, ENGRAM_LOOKUP_ZERO_DEAD);
            CK(cudaDeviceSynchronize());
            CK(cudaFree(gids));
            CK(cudaFree(gout));
        }
    }
    tu_current_case = "dequant: packed rows at an odd pitch (byte loads)";
    {
        const unsigned char *wm[1] = {odd};
        uint32_t wp[1] = {265};
        pa.num_cols = 1;
        pa.tables = &to;
        ASSERT_OK(engram_cuda_plan_create(ctx, &pa, &p));
        dequant_check(p, NULL, wm, wp, NULL, 1, 500, 0, ENGRAM_LOOKUP_ZERO_DEAD);
        engram_cuda_plan_destroy(p);
    }
    tu_current_case = "dequant: planar weights and scales";
    {
        const unsigned char *wm[1] = {wts}, *sm[1] = {scl};
        uint32_t wp[1] = {256};
        pa.num_cols = 1;
        pa.tables = &tw;
        pa.scale_tables = &ts;
        ASSERT_OK(engram_cuda_plan_create(ctx, &pa, &p));
        ASSERT_EQ(engram_cuda_plan_out_row_bytes(p), 512);
        dequant_check(p, NULL, wm, wp, sm, 1, 400, 0, 0);
        dequant_check(p, NULL, wm, wp, sm, 1, 33, 16, ENGRAM_LOOKUP_ZERO_DEAD);
        engram_cuda_plan_destroy(p);
        /* By tables: the scale tables are part of the columns too, so the
         * same weights without them are packed rows, which 256-byte rows
         * are not: refused, not served by the planar plan. */
        {
            engram_cuda_plan_args packed_w = pa;
            engram_cuda_lookup_args la = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
            dequant_check(NULL, &pa, wm, wp, sm, 1, 200, 0, 0);
            packed_w.scale_tables = NULL;
            la.id_type = ENGRAM_ID_INT64; /* no tokens: the plan only */
            ASSERT_ERR(engram_cuda_lookup_tables(ctx, &packed_w, &la, 0), ENGRAM_ELAYOUT);
        }
    }
    tu_current_case = "dequant: shape errors";
    pa.tables = &tw;
    pa.scale_tables = NULL; /* 256-byte rows are not packed FP8 rows */
    ASSERT_ERR(engram_cuda_plan_create(ctx, &pa, &p), ENGRAM_ELAYOUT);
    pa.tables = &tp;
    pa.scale_tables = &ts; /* planar weight rows of 264 values: not a multiple of 32 */
    ASSERT_ERR(engram_cuda_plan_create(ctx, &pa, &p), ENGRAM_ELAYOUT);
    engram_cuda_close(ctx);
    ctx = saved;
    engram_store_close(mem);
    free(packed);
    free(odd);
    free(wts);
    free(scl);
}

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("test_cuda: skipped: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "none");
        return TU_SKIP_CODE;
    }
    tu_watchdog(240);
    st = tu_open("g", ENGRAM_OPEN_PREFAULT, 1);
    for (size_t i = 0; i < NTABS; i++) {
        tu_populate(st, tabs[i].name, tabs[i].seed, tabs[i].nrows, tabs[i].rb, tabs[i].pitch);
        ASSERT_OK(engram_table_open(st, tabs[i].name, &tabs[i].id));
    }
    ASSERT_OK(engram_cuda_open(st, NULL, &ctx));
    ASSERT_OK(engram_cuda_warmup(ctx));
    /* The graph test first: its capture is then the first use of its kernel
     * variant by the test, which must already be loaded (gpu.sh runs this
     * with CUDA_MODULE_LOADING=LAZY). */
    test_graph();
    test_random_shapes();
    test_bad_ids();
    test_side_stream();
    test_registration();
    test_dequant();
    test_host_path();
    test_offset_extremes();
    test_lookup_tables();
    test_order_after();
    {
        engram_cuda_stats s = ENGRAM_CUDA_STATS_INIT;
        ASSERT_OK(engram_cuda_get_stats(ctx, &s));
        printf("test_cuda: tables mapped %llu copied %llu host %llu, lookups %llu\n",
               (unsigned long long)s.tables_mapped, (unsigned long long)s.tables_copied,
               (unsigned long long)s.tables_host, (unsigned long long)s.lookups);
    }
    engram_cuda_close(ctx);
    engram_store_close(st);
    return tu_done("test_cuda");
}
