/*
 * cuda.c - lookups into GPU memory (builds with libengram_cuda only).
 *
 * A store gets a CUDA context (engram_cuda_open) the first time a lookup
 * passes device arrays, and one plan per distinct (tables, offsets) pair
 * it sees, kept until close(): a plan uploads its column descriptors once,
 * so a repeated lookup only enqueues a kernel on the caller's stream.  The
 * lookup returns as soon as the work is enqueued; bad ids cannot raise
 * from the GPU, so they are skipped and reported by Store.cuda_check().
 *
 * These functions run with the store entered (store.c's close guard), so
 * they create no Python object: an allocation could start the garbage
 * collector, whose finalizers may call close() on this store and wait for
 * this very call.  The plans are kept in a C table, and errors are
 * returned as codes for the caller to raise after leaving the store.
 */
#include "ext.h"

#ifdef ENGRAMSTORE_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <engram_cuda.h>

/* Host-path staging of a plan (tables without a base address) is sized
 * for this many tokens, or the first lookup's count if larger. */
#define HOST_PATH_TOKENS 16384
/* Host-path plans are per stream; at most this many streams per (tables,
 * offsets). */
#define HOST_PATH_STREAMS 16

/* A plan and the (tables, offsets) it was made for.  A plan whose host
 * path (tables without a base address) stages rows per plan serves one
 * stream only: lookups on two streams would share its staging unordered
 * (engram_cuda.h), so it is made per stream. */
typedef struct plan_entry {
    size_t K;
    int has_offsets;
    int per_stream;
    cudaStream_t stream; /* per_stream: the stream it serves */
    size_t max_tokens;   /* per_stream: tokens its staging holds */
    engram_table_id *tables; /* [K] */
    int64_t *offsets;        /* [K] or NULL */
    engram_cuda_plan *plan;
} plan_entry;

struct ext_cuda {
    engram_cuda_ctx *ctx;
    int device;        /* the context's: every lookup runs there */
    cudaEvent_t ev;    /* orders a lookup after a producer's stream */
    plan_entry *plans; /* [nplans], read and changed with the GIL held */
    size_t nplans, cap;
    /* Host-path plans replaced by larger ones: another thread may still be
     * enqueueing a lookup with one (the GIL released), so they are kept
     * until close().  Each replacement doubles, so they hold less staging
     * than the plans that replaced them. */
    engram_cuda_plan **retired;
    size_t nretired;
    size_t last; /* the entry of the last lookup, tried first */
};

/* Our own refusal, raised once the store is left (as ValueError with code
 * 0, else as the exception of `code`). */
static int refuse(ext_cuda_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(ext_cuda_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
    return code ? code : -EINVAL;
}

/* 1 if work enqueued on `s` now would go into a graph being captured (or,
 * for the legacy stream, break another stream's capture). */
static int capturing(cudaStream_t s)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s ? s : cudaStreamLegacy, &cs);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* Any other error (a bad handle) is left to the calls that follow. */
        return e == cudaErrorStreamCaptureImplicit;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* A stream argument: None (the legacy default stream), an int handle, an
 * object with `cuda_stream` (torch.cuda.Stream) or __cuda_stream__()
 * (the CUDA stream protocol: (version, handle)). */
int ext_cuda_stream(PyObject *obj, void **out)
{
    PyObject *h = NULL;
    unsigned long long v;
    if (!obj || obj == Py_None) {
        *out = 0;
        return 0;
    }
    if (PyLong_Check(obj)) {
        h = Py_NewRef(obj);
    } else if (PyObject_HasAttrString(obj, "__cuda_stream__")) {
        PyObject *r = PyObject_CallMethod(obj, "__cuda_stream__", NULL);
        if (!r)
            return -1;
        if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2)
            h = Py_NewRef(PyTuple_GET_ITEM(r, 1));
        Py_DECREF(r);
    } else if (PyObject_HasAttrString(obj, "cuda_stream")) {
        h = PyObject_GetAttrString(obj, "cuda_stream");
        if (!h)
            return -1;
    }
    if (!h || !PyLong_Check(h)) {
        Py_XDECREF(h);
        PyErr_Format(PyExc_TypeError, "stream: expected None, an int stream handle or a CUDA "
                     "stream object (torch.cuda.Stream), got %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    v = PyLong_AsUnsignedLongLong(h);
    Py_DECREF(h);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (void *)(uintptr_t)v;
    return 0;
}

static const char warm_up[] =
    "runs before any capture: it registers the tables with the GPU and uploads descriptors, "
    "which a capture forbids (do one such lookup on this stream first)";

static int cuda_get(ext_cuda **slot, engram_store *st, cudaStream_t stream, ext_cuda_error *err)
{
    engram_cuda_ctx *ctx = NULL;
    engram_cuda_stats stats = ENGRAM_CUDA_STATS_INIT;
    ext_cuda *c;
    int rc;
    if (*slot)
        return 0;
    if (capturing(stream))
        return refuse(err, ENGRAM_ESTATE, "the store's first GPU lookup %s", warm_up);
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_open(st, NULL, &ctx);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        err->what = "CUDA";
        return rc;
    }
    if (*slot || !(c = calloc(1, sizeof *c))) {
        /* Another thread got there while the GIL was released; or no
         * memory.  (Closing frees device memory, which waits for the
         * device: without the GIL.) */
        int lost = *slot != NULL;
        Py_BEGIN_ALLOW_THREADS
        engram_cuda_close(ctx);
        Py_END_ALLOW_THREADS
        if (lost)
            return 0;
        err->nomem = 1;
        return -ENOMEM;
    }
    /* On the current device, the one engram_cuda_open() took; relaxed, as
     * the library's own setup calls, so that a capture in progress on
     * another stream is not invalidated. */
    {
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
        rc = cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming);
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
    }
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        Py_BEGIN_ALLOW_THREADS
        engram_cuda_close(ctx);
        Py_END_ALLOW_THREADS
        free(c);
        err->cuda = rc;
        err->doing = "creating an event";
        return -EIO;
    }
    (void)engram_cuda_get_stats(ctx, &stats);
    c->ctx = ctx;
    c->device = stats.device;
    *slot = c;
    return 0;
}

/* The plan's tables and offsets are a's. */
static int key_matches(const plan_entry *e, const engram_lookup_args *a)
{
    return e->K == a->num_cols && e->has_offsets == (a->offsets != NULL) &&
           memcmp(e->tables, a->tables, a->num_cols * sizeof *a->tables) == 0 &&
           (!a->offsets || memcmp(e->offsets, a->offsets, a->num_cols * sizeof(int64_t)) == 0);
}

static int entry_matches(const plan_entry *e, const engram_lookup_args *a, cudaStream_t s)
{
    return key_matches(e, a) && (!e->per_stream || e->stream == s);
}

static plan_entry *entry_find(ext_cuda *c, const engram_lookup_args *a, cudaStream_t s)
{
    if (c->last < c->nplans && entry_matches(&c->plans[c->last], a, s))
        return &c->plans[c->last];
    for (size_t i = 0; i < c->nplans; i++)
        if (entry_matches(&c->plans[i], a, s)) {
            c->last = i;
            return &c->plans[i];
        }
    return NULL;
}

/* The entry's plan serves a lookup of a->num_tokens tokens. */
static int entry_fits(const plan_entry *e, const engram_lookup_args *a)
{
    return e && (!e->per_stream || a->num_tokens <= e->max_tokens);
}

static void plan_destroy_nogil(engram_cuda_plan *p)
{
    Py_BEGIN_ALLOW_THREADS
    engram_cuda_plan_destroy(p);
    Py_END_ALLOW_THREADS
}

static void entry_free(plan_entry *e)
{
    free(e->tables);
    free(e->offsets);
}

/* Host-path plans pin their staging (max_tokens x columns x rows) on the
 * host and the GPU until close(): a refusal once a's tables have plans for
 * HOST_PATH_STREAMS streams, else 0. */
static int streams_full(const ext_cuda *c, const engram_lookup_args *a, ext_cuda_error *err)
{
    size_t n = 0;
    for (size_t i = 0; i < c->nplans; i++)
        n += key_matches(&c->plans[i], a);
    if (n < HOST_PATH_STREAMS)
        return 0;
    return refuse(err, ENGRAM_ESTATE, "these tables (file-backed: gathered on the CPU) already "
                                      "have plans for %d streams, each with its own staging: "
                                      "look them up on fewer streams",
                  HOST_PATH_STREAMS);
}

static int plan_get(ext_cuda *c, engram_store *st, const engram_lookup_args *a,
                    cudaStream_t stream, engram_cuda_plan **out, ext_cuda_error *err)
{
    size_t K = a->num_cols;
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_plan *plan = NULL;
    plan_entry e = {K, a->offsets != NULL, 0, stream, 0, NULL, NULL, NULL}, *have;
    int rc;

    if (entry_fits(have = entry_find(c, a, stream), a)) {
        *out = have->plan;
        return 0;
    }
    if (capturing(stream))
        return refuse(err, ENGRAM_ESTATE,
                      have ? "a GPU lookup of more tokens than before on file-backed tables "
                             "grows its staging, which %s"
                           : "the first GPU lookup of these tables and offsets %s",
                      warm_up);
    if (have) {
        e.per_stream = 1;
        e.max_tokens = have->max_tokens;
    }
    for (size_t k = 0; k < K && !e.per_stream; k++)
        e.per_stream = engram_table_memory(st, a->tables[k], NULL, NULL) == -ENOTSUP;
    if (e.per_stream && stream == cudaStreamPerThread)
        return refuse(err, 0, "stream: file-backed tables are gathered on the CPU into staging "
                              "kept per stream, and cudaStreamPerThread is another stream in "
                              "each thread: pass an explicit stream");
    if (e.per_stream && !have && (rc = streams_full(c, a, err)) < 0)
        return rc;
    e.max_tokens = a->num_tokens > 2 * e.max_tokens ? a->num_tokens : 2 * e.max_tokens;
    if (e.max_tokens < HOST_PATH_TOKENS)
        e.max_tokens = HOST_PATH_TOKENS;
    pa.num_cols = K;
    pa.tables = a->tables;
    pa.offsets = a->offsets;
    pa.max_tokens = e.max_tokens;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_plan_create(c->ctx, &pa, &plan);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        err->what = "CUDA plan";
        return rc;
    }
    if (entry_fits(have = entry_find(c, a, stream), a)) { /* another thread's meanwhile */
        *out = have->plan; /* before the GIL goes: c->plans may move */
        plan_destroy_nogil(plan);
        return 0;
    }
    if (have) {
        /* Grow: the old plan is retired, not destroyed (see ext_cuda). */
        engram_cuda_plan **r = realloc(c->retired, (c->nretired + 1) * sizeof *r);
        if (!r)
            goto nomem;
        c->retired = r;
        c->retired[c->nretired++] = have->plan;
        have->plan = plan;
        have->max_tokens = e.max_tokens;
        *out = plan;
        return 0;
    }
    /* Other threads may have added plans for these tables while the GIL
     * was released: the bound holds after the fact too. */
    if (e.per_stream && (rc = streams_full(c, a, err)) < 0) {
        plan_destroy_nogil(plan);
        return rc;
    }
    if (c->nplans == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        plan_entry *p = realloc(c->plans, cap * sizeof *p);
        if (!p)
            goto nomem;
        c->plans = p;
        c->cap = cap;
    }
    if (!(e.tables = malloc(K * sizeof *e.tables)) ||
        (a->offsets && !(e.offsets = malloc(K * sizeof *e.offsets))))
        goto nomem;
    memcpy(e.tables, a->tables, K * sizeof *e.tables);
    if (a->offsets)
        memcpy(e.offsets, a->offsets, K * sizeof *e.offsets);
    e.plan = plan;
    c->last = c->nplans;
    c->plans[c->nplans++] = e;
    *out = plan;
    return 0;
nomem:
    entry_free(&e);
    plan_destroy_nogil(plan);
    err->nomem = 1;
    return -ENOMEM;
}

/* Makes `consumer` wait for the work enqueued so far on `producer` (a
 * __cuda_array_interface__ v3 stream: 1 legacy, 2 per-thread, else a
 * handle).  The GIL is held, so the one event is not shared meanwhile. */
static int order_after(ext_cuda *c, uintptr_t producer, cudaStream_t consumer,
                       ext_cuda_error *err)
{
    cudaStream_t p = producer == 1   ? cudaStreamLegacy
                     : producer == 2 ? cudaStreamPerThread
                                     : (cudaStream_t)producer;
    cudaStream_t q = consumer ? consumer : cudaStreamLegacy;
    enum cudaStreamCaptureStatus cq = cudaStreamCaptureStatusNone, cp = cudaStreamCaptureStatusNone;
    cudaError_t e;
    if (p == q)
        return 0;
    /* While the consumer is captured into a graph, a producer outside the
     * capture made its data before the capture began: there is nothing
     * to order within the graph (and waiting for an event recorded
     * outside a capture is not allowed in it).  The legacy stream cannot
     * be asked while a blocking stream captures (it answers
     * cudaErrorStreamCaptureImplicit), and recording on it then would
     * break that capture: its data is taken as made before. */
    if ((e = cudaStreamIsCapturing(p, &cp)) == cudaErrorStreamCaptureImplicit) {
        (void)cudaGetLastError();
        if (capturing(q))
            return 0;
        return refuse(err, ENGRAM_ESTATE, "an array's __cuda_array_interface__ stream is the "
                                          "legacy default stream, which cannot be waited for "
                                          "while a blocking stream is being captured");
    }
    if (e != cudaSuccess || (e = cudaStreamIsCapturing(q, &cq)) != cudaSuccess)
        goto fail;
    if (cq != cudaStreamCaptureStatusNone && cp == cudaStreamCaptureStatusNone)
        return 0;
    /* The other way round, waiting would pull the lookup into the
     * producer's graph (and its capture would fail, unjoined). */
    if (cq == cudaStreamCaptureStatusNone && cp != cudaStreamCaptureStatusNone)
        return refuse(err, ENGRAM_ESTATE, "an array's __cuda_array_interface__ stream is being "
                                          "captured into a graph but the lookup's stream is not: "
                                          "look up on the captured stream");
    if ((e = cudaEventRecord(c->ev, p)) != cudaSuccess ||
        (e = cudaStreamWaitEvent(q, c->ev, 0)) != cudaSuccess)
        goto fail;
    return 0;
fail:
    (void)cudaGetLastError();
    err->cuda = e;
    err->doing = "ordering the lookup after an array's __cuda_array_interface__ stream";
    return -EIO;
}

/* The device the arrays of `call` live on, or -1 if they do not say and
 * this is a single-GPU machine; -2 after a refusal. */
static int arrays_device(const ext_cuda_call *call, ext_cuda_error *err)
{
    static int gpus; /* 0 until known; read and set with the GIL held */
    int dev[2];
    for (int i = 0; i < 2; i++) {
        struct cudaPointerAttributes pa;
        dev[i] = call->device[i];
        if (dev[i] >= 0)
            continue;
        /* __cuda_array_interface__ does not name the device.  Ask where
         * the memory is, where there is more than one GPU to choose. */
        if (gpus == 0) {
            int n = 0;
            if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
                gpus = n; /* kept: the GPUs of a process do not change */
            else
                (void)cudaGetLastError();
        }
        if (gpus > 1) {
            if (cudaPointerGetAttributes(&pa, call->ptr[i]) == cudaSuccess &&
                (pa.type == cudaMemoryTypeDevice || pa.type == cudaMemoryTypeManaged))
                dev[i] = pa.device;
            (void)cudaGetLastError();
        }
    }
    if (dev[0] >= 0 && dev[1] >= 0 && dev[0] != dev[1]) {
        refuse(err, 0, "ids and out: ids are on GPU %d but out is on GPU %d", dev[0], dev[1]);
        return -2;
    }
    return dev[0] >= 0 ? dev[0] : dev[1];
}

/* 0 if the context runs on GPU `dev` (the arrays'), else a refusal. */
static int same_gpu(const ext_cuda *c, int dev, ext_cuda_error *err)
{
    if (c->device == dev)
        return 0;
    return refuse(err, 0, "ids and out are on GPU %d, but this store's GPU lookups run on GPU "
                          "%d, where its first one ran: use one store per GPU",
                  dev, c->device);
}

/* The lookup proper, on device `dev` (current). */
static int lookup_here(ext_cuda **slot, engram_store *st, const engram_lookup_args *a,
                       const ext_cuda_call *call, int dev, ext_cuda_error *err)
{
    engram_cuda_lookup_args ca = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    engram_cuda_plan *plan = NULL;
    cudaStream_t stream = (cudaStream_t)call->stream;
    int rc;

    if ((rc = cuda_get(slot, st, stream, err)) < 0)
        return rc;
    if ((rc = same_gpu(*slot, dev, err)) < 0) /* another thread's first lookup won */
        return rc;
    if (a->num_tokens == 0 || a->num_cols == 0)
        return 0;
    if ((rc = plan_get(*slot, st, a, stream, &plan, err)) < 0)
        return rc;
    if (engram_cuda_plan_out_row_bytes(plan) != a->row_bytes) {
        err->row_bytes = engram_cuda_plan_out_row_bytes(plan);
        return ENGRAM_ELAYOUT;
    }
    for (int i = 0; i < call->nwait; i++)
        if ((rc = order_after(*slot, call->wait[i], stream, err)) < 0)
            return rc;
    ca.flags = a->flags;
    ca.num_tokens = a->num_tokens;
    ca.ids = a->ids;
    ca.id_type = a->id_type;
    ca.id_stride_t = a->id_stride_t;
    ca.id_stride_k = a->id_stride_k;
    ca.out = a->out;
    ca.out_stride_t = a->out_stride_t;
    ca.out_stride_k = a->out_stride_k;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_lookup(plan, &ca, stream);
    Py_END_ALLOW_THREADS
    return rc;
}

int ext_cuda_lookup(ext_cuda **slot, engram_store *st, const engram_lookup_args *a,
                    const ext_cuda_call *call, ext_cuda_error *err)
{
    int cur = 0, dev, rc;
    cudaError_t e;
    if ((e = cudaGetDevice(&cur)) != cudaSuccess) { /* no driver, or no device */
        (void)cudaGetLastError();
        return refuse(err, -ENODEV, "no CUDA device: %s", cudaGetErrorString(e));
    }
    if ((dev = arrays_device(call, err)) == -2)
        return -EINVAL;
    if (dev < 0)
        dev = *slot ? (*slot)->device : cur;
    if (*slot && (rc = same_gpu(*slot, dev, err)) < 0)
        return rc;
    /* A kernel launched on the wrong device would fault on these pointers
     * (and poison the CUDA context for good): run on theirs. */
    if (dev != cur && (e = cudaSetDevice(dev)) != cudaSuccess) {
        (void)cudaGetLastError();
        err->cuda = e;
        err->doing = "making the arrays' GPU current";
        return -EIO;
    }
    rc = lookup_here(slot, st, a, call, dev, err);
    if (dev != cur && (e = cudaSetDevice(cur)) != cudaSuccess) {
        (void)cudaGetLastError();
        if (rc == 0) { /* the lookup is queued, but the caller's GPU is not current */
            err->cuda = e;
            err->doing = "making the caller's GPU current again after the lookup";
            rc = -EIO;
        }
    }
    return rc;
}

PyObject *ext_cuda_raise(int rc, const ext_cuda_error *err, size_t row_bytes)
{
    if (err->nomem)
        return PyErr_NoMemory();
    if (err->msg[0]) {
        if (!err->code) {
            PyErr_SetString(PyExc_ValueError, err->msg);
            return NULL;
        }
        return ext_raise_cls(ext_exc_for(err->code), err->code, "%s", err->msg);
    }
    if (err->cuda)
        return ext_raise_cls(ext_exc_for(rc), rc, "%s: %s", err->doing,
                             cudaGetErrorString((cudaError_t)err->cuda));
    if (err->row_bytes) {
        PyErr_Format(PyExc_ValueError, "out: rows of %zu bytes, but the tables' rows are %zu",
                     row_bytes, err->row_bytes);
        return NULL;
    }
    return ext_raise(rc, err->what);
}

int ext_cuda_check(ext_cuda *c, engram_cuda_report *rep)
{
    int rc;
    if (!c)
        return 0;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_check(c->ctx, rep);
    Py_END_ALLOW_THREADS
    return rc;
}

int ext_cuda_stats(const ext_cuda *c, struct engram_cuda_stats *out)
{
    return c && engram_cuda_get_stats(c->ctx, out) == 0;
}

void ext_cuda_close(ext_cuda *c)
{
    engram_cuda_stats stats = ENGRAM_CUDA_STATS_INIT;
    if (!c)
        return;
    /* Lookups enqueued on the GPU may still read the registered tables
     * and the plans: let the device finish before unregistering them. */
    Py_BEGIN_ALLOW_THREADS
    if (engram_cuda_get_stats(c->ctx, &stats) == 0) {
        int prev = 0;
        if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(stats.device) == cudaSuccess) {
            /* Relaxed, as the library's own setup calls: no capture in
             * another thread is invalidated by the call itself (a device
             * with a stream being captured cannot be waited for: that
             * fails, and the close goes on). */
            enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
            (void)cudaThreadExchangeStreamCaptureMode(&mode);
            (void)cudaDeviceSynchronize();
            (void)cudaEventDestroy(c->ev);
            c->ev = NULL;
            (void)cudaThreadExchangeStreamCaptureMode(&mode);
            (void)cudaSetDevice(prev);
        }
    }
    if (c->ev)
        (void)cudaEventDestroy(c->ev);
    (void)cudaGetLastError(); /* nothing of this close is left for the caller's next call */
    engram_cuda_close(c->ctx); /* destroys the plans too */
    Py_END_ALLOW_THREADS
    for (size_t i = 0; i < c->nplans; i++)
        entry_free(&c->plans[i]);
    free(c->plans);
    free(c->retired); /* engram_cuda_close() destroyed those plans too */
    free(c);
}

#endif /* ENGRAMSTORE_HAVE_CUDA */
