/*
 * cuda.c - the module engramstore._engram_cuda: lookups into GPU memory
 * through libengram_cuda (CUDA builds).
 *
 * A module of its own because it links the CUDA runtime: engramstore._engram
 * imports it at the first lookup into GPU memory, once the runtime is
 * loaded (cuda_load.c), and calls it through ext_cuda_api, the capsule
 * `_api`.  libengram_cuda calls libengram only through its internal
 * interface, engram_internal_v1() (src/internal.h); this module has no
 * copy of the library, and defines that one function at the end of this
 * file: it returns the interface of the copy in _engram, which attach()
 * receives before any other call.
 *
 * A store gets a CUDA context (engram_cuda_open) on the GPU of the arrays
 * of its first lookup that passes device arrays, and every lookup goes
 * through engram_cuda_lookup_tables(): the library keeps a plan per
 * (tables, offsets), per stream for file-backed tables, until close(),
 * refuses what a capture forbids, and makes the context's GPU current for
 * the call.  What stays here is about Python's arrays: the GPU they are
 * on (one store, one GPU) and the producer stream their
 * __cuda_array_interface__ names (engram_cuda_order_after()).  The lookup
 * returns as soon as the work is enqueued; bad ids cannot raise from the
 * GPU, so they are skipped and reported by Store.cuda_check().
 *
 * These functions run with the store entered (pystore.c's close guard), so
 * they create no Python object: an allocation could start the garbage
 * collector, whose finalizers may call close() on this store and wait for
 * this very call.  Errors are returned as codes for _engram to raise
 * after leaving the store.
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

#include "internal.h" /* engram_internal_v1: defined below */

struct ext_cuda {
    engram_cuda_ctx *ctx;
    int device; /* the context's: every lookup runs there */
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

/* The store's context, opened on GPU `dev` at its first GPU lookup. */
static int cuda_get(ext_cuda **slot, engram_store *st, int dev, ext_cuda_error *err)
{
    engram_cuda_options o = ENGRAM_CUDA_OPTIONS_INIT;
    engram_cuda_ctx *ctx = NULL;
    ext_cuda *c;
    int rc;
    if (*slot)
        return 0;
    o.device = dev;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_open(st, &o, &ctx);
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
    c->ctx = ctx;
    c->device = dev;
    *slot = c;
    return 0;
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

/* A __cuda_array_interface__ v3 stream: 1 legacy, 2 per-thread, else a
 * handle. */
static cudaStream_t cai_stream(uintptr_t v)
{
    return v == 1 ? cudaStreamLegacy : v == 2 ? cudaStreamPerThread : (cudaStream_t)v;
}

static int gpu_lookup(ext_cuda **slot, engram_store *st, const engram_lookup_args *a,
                      const ext_cuda_call *call, ext_cuda_error *err)
{
    engram_cuda_plan_args cols = ENGRAM_CUDA_PLAN_ARGS_INIT;
    engram_cuda_lookup_args ca = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    cudaStream_t stream = (cudaStream_t)call->stream;
    engram_cuda_ctx *ctx;
    int cur = 0, dev, rc = 0;
    cudaError_t e;

    if ((e = cudaGetDevice(&cur)) != cudaSuccess) { /* no driver, or no device */
        (void)cudaGetLastError();
        return refuse(err, -ENODEV, "no CUDA device: %s", cudaGetErrorString(e));
    }
    if ((dev = arrays_device(call, err)) == -2)
        return -EINVAL;
    if (dev < 0)
        dev = *slot ? (*slot)->device : cur;
    if ((rc = cuda_get(slot, st, dev, err)) < 0)
        return rc;
    if ((rc = same_gpu(*slot, dev, err)) < 0) /* maybe another thread's first lookup won */
        return rc;
    if (a->num_tokens == 0 || a->num_cols == 0)
        return 0;
    ctx = (*slot)->ctx;
    cols.num_cols = a->num_cols;
    cols.tables = a->tables;
    cols.offsets = a->offsets;
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
    for (int i = 0; i < call->nwait && rc == 0; i++)
        rc = engram_cuda_order_after(ctx, stream, cai_stream(call->wait[i]));
    if (rc < 0)
        err->what = "ordering the lookup after an array's __cuda_array_interface__ stream";
    else
        rc = engram_cuda_lookup_tables(ctx, &cols, &ca, stream);
    Py_END_ALLOW_THREADS
    return rc;
}

static int gpu_check(ext_cuda *c, engram_cuda_report *rep)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_check(c->ctx, rep);
    Py_END_ALLOW_THREADS
    return rc;
}

static int gpu_stats(const ext_cuda *c, struct engram_cuda_stats *out)
{
    return engram_cuda_get_stats(c->ctx, out) == 0;
}

static void gpu_close(ext_cuda *c)
{
    int prev = 0;
    /* Lookups enqueued on the GPU may still read the registered tables
     * and the plans: let the device finish before unregistering them. */
    Py_BEGIN_ALLOW_THREADS
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(c->device) == cudaSuccess) {
        /* Relaxed, as the library's own setup calls: no capture in
         * another thread is invalidated by the call itself (a device
         * with a stream being captured cannot be waited for: that
         * fails, and the close goes on). */
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
        (void)cudaDeviceSynchronize();
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
        (void)cudaSetDevice(prev);
    }
    (void)cudaGetLastError(); /* nothing of this close is left for the caller's next call */
    engram_cuda_close(c->ctx); /* destroys the plans too */
    Py_END_ALLOW_THREADS
    free(c);
}

/* ---- the module ------------------------------------------------------------------ */

/* The internal interface of the libengram in _engram (set by attach(),
 * before any other call; the same table every time). */
static const engram__internal *core;

static int gpu_attach(const engram__internal *c)
{
    if (!engram__internal_ok(c))
        return -1;
    core = c;
    return 0;
}

static const ext_cuda_api api = {
    .abi = EXT_CUDA_ABI,
    .size = sizeof(ext_cuda_api),
    .attach = gpu_attach,
    .lookup = gpu_lookup,
    .check = gpu_check,
    .stats = gpu_stats,
    .close = gpu_close,
};

PyDoc_STRVAR(module_doc, "engramstore._engram_cuda: lookups into GPU memory, loaded by "
                         "engramstore._engram at the first one.  Nothing here is called "
                         "directly.");

static PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT,
    .m_name = EXT_CUDA_MODULE,
    .m_doc = module_doc,
    .m_size = 0,
};

PyMODINIT_FUNC PyInit__engram_cuda(void);
PyMODINIT_FUNC PyInit__engram_cuda(void)
{
    PyObject *m = PyModule_Create(&moddef), *cap;
    if (!m)
        return NULL;
    cap = PyCapsule_New((void *)(uintptr_t)&api, EXT_CUDA_CAPSULE, NULL);
    if (!cap || PyModule_AddObjectRef(m, "_api", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(cap);
    return m;
}

/* ---- libengram, through _engram ---------------------------------------------------
 * The one function of libengram that libengram_cuda calls (hidden:
 * nothing outside this module binds to it). */

const engram__internal *engram_internal_v1(void)
{
    return core;
}

#endif /* ENGRAMSTORE_HAVE_CUDA */
