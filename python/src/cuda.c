/*
 * cuda.c - lookups into GPU memory (builds with libengram_cuda only).
 *
 * A store gets a CUDA context (engram_cuda_open) the first time a lookup
 * passes device arrays, and one plan per distinct (tables, offsets) pair
 * it sees, kept until close(): a plan uploads its column descriptors once,
 * so a repeated lookup only enqueues a kernel on the caller's stream.  The
 * lookup returns as soon as the work is enqueued; bad ids cannot raise
 * from the GPU, so they are skipped and reported by Store.cuda_check().
 */
#include "ext.h"

#ifdef ENGRAMSTORE_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <string.h>

#include <engram_cuda.h>

/* Host-path staging of a plan (tables without a base address) is sized
 * for this many tokens, or the first lookup's count if larger. */
#define HOST_PATH_TOKENS 16384

struct ext_cuda {
    engram_cuda_ctx *ctx;
    PyObject *plans; /* bytes key -> capsule(engram_cuda_plan *), destroyed with ctx */
};

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

static ext_cuda *cuda_get(ext_cuda **slot, engram_store *st)
{
    engram_cuda_ctx *ctx = NULL;
    ext_cuda *c;
    int rc;
    if (*slot)
        return *slot;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_open(st, NULL, &ctx);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ext_raise(rc, "CUDA");
        return NULL;
    }
    if (*slot) { /* another thread got there while the GIL was released */
        engram_cuda_close(ctx);
        return *slot;
    }
    if (!(c = PyMem_Calloc(1, sizeof *c)) || !(c->plans = PyDict_New())) {
        PyMem_Free(c);
        engram_cuda_close(ctx);
        PyErr_NoMemory();
        return NULL;
    }
    c->ctx = ctx;
    *slot = c;
    return c;
}

static engram_cuda_plan *plan_get(ext_cuda *c, const engram_lookup_args *a)
{
    size_t K = a->num_cols;
    PyObject *key, *cap;
    engram_cuda_plan *plan = NULL;
    engram_cuda_plan_args pa = ENGRAM_CUDA_PLAN_ARGS_INIT;
    char *k;
    int rc;

    /* The key: the table ids, then the offsets if any. */
    key = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(K * (sizeof *a->tables + sizeof(int64_t)) + 1));
    if (!key)
        return NULL;
    k = PyBytes_AS_STRING(key);
    memcpy(k, a->tables, K * sizeof *a->tables);
    k += K * sizeof *a->tables;
    if (a->offsets)
        memcpy(k, a->offsets, K * sizeof(int64_t));
    else
        memset(k, 0, K * sizeof(int64_t));
    k[K * sizeof(int64_t)] = a->offsets != NULL;
    cap = PyDict_GetItemWithError(c->plans, key);
    if (cap) {
        Py_DECREF(key);
        return PyCapsule_GetPointer(cap, "engramstore.cuda_plan");
    }
    if (PyErr_Occurred())
        goto out;
    pa.num_cols = K;
    pa.tables = a->tables;
    pa.offsets = a->offsets;
    pa.max_tokens = a->num_tokens > HOST_PATH_TOKENS ? a->num_tokens : HOST_PATH_TOKENS;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_plan_create(c->ctx, &pa, &plan);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ext_raise(rc, "CUDA plan");
        plan = NULL;
        goto out;
    }
    if ((cap = PyDict_GetItemWithError(c->plans, key)) != NULL) {
        /* Made by another thread meanwhile: use that one. */
        engram_cuda_plan_destroy(plan);
        plan = PyCapsule_GetPointer(cap, "engramstore.cuda_plan");
        goto out;
    }
    if (PyErr_Occurred() || !(cap = PyCapsule_New(plan, "engramstore.cuda_plan", NULL)) ||
        PyDict_SetItem(c->plans, key, cap) < 0) {
        Py_XDECREF(cap);
        engram_cuda_plan_destroy(plan);
        plan = NULL;
        goto out;
    }
    Py_DECREF(cap);
out:
    Py_DECREF(key);
    return plan;
}

int ext_cuda_lookup(ext_cuda **slot, engram_store *st, const engram_lookup_args *a,
                    void *stream_handle)
{
    engram_cuda_lookup_args ca = ENGRAM_CUDA_LOOKUP_ARGS_INIT;
    engram_cuda_plan *plan;
    cudaStream_t stream = (cudaStream_t)stream_handle;
    ext_cuda *c;
    int rc;

    if (!(c = cuda_get(slot, st)))
        return -1;
    if (a->num_tokens == 0 || a->num_cols == 0)
        return 0;
    if (!(plan = plan_get(c, a)))
        return -1;
    if (engram_cuda_plan_out_row_bytes(plan) != a->row_bytes) {
        PyErr_Format(PyExc_ValueError, "out: rows of %zu bytes, but the tables' rows are %zu",
                     a->row_bytes, engram_cuda_plan_out_row_bytes(plan));
        return -1;
    }
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
    if (rc < 0) {
        ext_raise(rc, NULL);
        return -1;
    }
    return 0;
}

PyObject *ext_cuda_check(ext_cuda *c)
{
    int rc;
    if (!c)
        Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_cuda_check(c->ctx, NULL);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc, NULL);
    Py_RETURN_NONE;
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
            (void)cudaDeviceSynchronize();
            (void)cudaSetDevice(prev);
        }
    }
    engram_cuda_close(c->ctx);
    Py_END_ALLOW_THREADS
    Py_CLEAR(c->plans);
    PyMem_Free(c);
}

#endif /* ENGRAMSTORE_HAVE_CUDA */
