/*
 * cuda_load.c - the GPU lookups' side in engramstore._engram (CUDA builds):
 * their stream argument, their errors, and the loading of the GPU module.
 *
 * This module does not link the CUDA runtime: a process that has none
 * (no toolkit, a CPU-only container) imports the package and looks up
 * into host memory as anywhere else.  The first lookup into GPU memory
 * loads the runtime (ENGRAMSTORE_CUDART if set, else the soname the GPU
 * module was linked with, from the loader's path and then from the
 * toolkit's directory recorded at build time) and imports the GPU module,
 * engramstore._engram_cuda, whose dependency on the runtime the loaded
 * copy then meets.  What cannot be loaded raises ImportError naming the
 * library, where it was searched and how to get it; nothing is cached on
 * failure, so a later lookup tries again.
 *
 * The GPU module calls libengram through its internal interface
 * (src/internal.h), which it gets from here: that of the copy linked into
 * this module, so one library, one set of stores, one per-thread error
 * message.  Everything here runs with the GIL held.
 */
#include "ext.h"

#ifdef ENGRAMSTORE_HAVE_CUDA

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ENGRAMSTORE_CUDART
#include <dlfcn.h>
#endif

#include "internal.h" /* engram_internal_v1 */

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

PyObject *ext_cuda_raise(int rc, const ext_cuda_error *err)
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
    if (rc == -EINVAL) { /* an argument the library refuses (the stream, say) */
        char buf[1024];
        const char *msg = ext_python_terms(engram_errmsg(), buf, sizeof buf);
        if (err->what)
            PyErr_Format(PyExc_ValueError, "%s: %s", err->what, msg);
        else
            PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    }
    return ext_raise(rc, err->what);
}

/* ---- loading ----------------------------------------------------------------- */

/* The GPU module's functions once loaded (set once, with the GIL held). */
static const ext_cuda_api *gpu;

/* Raises ImportError with the message `fmt` (PyUnicode_FromFormat) and the
 * exception being raised, if any, as its cause. */
static void import_error(const char *fmt, ...)
{
    PyObject *cause = NULL, *msg, *exc;
    va_list ap;
    if (PyErr_Occurred()) {
#if PY_VERSION_HEX >= 0x030C0000
        cause = PyErr_GetRaisedException();
#else
        PyObject *t, *tb;
        PyErr_Fetch(&t, &cause, &tb);
        PyErr_NormalizeException(&t, &cause, &tb);
        if (cause && tb)
            PyException_SetTraceback(cause, tb);
        Py_XDECREF(t);
        Py_XDECREF(tb);
#endif
    }
    va_start(ap, fmt);
    msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    exc = msg ? PyObject_CallOneArg(PyExc_ImportError, msg) : NULL;
    Py_XDECREF(msg);
    if (!exc) {
        Py_XDECREF(cause);
        return;
    }
    if (cause) {
        Py_INCREF(cause); /* SetCause steals one reference, SetContext another */
        PyException_SetCause(exc, cause);
        PyException_SetContext(exc, cause);
    }
    PyErr_SetObject(PyExc_ImportError, exc);
    Py_DECREF(exc);
}

#ifdef ENGRAMSTORE_CUDART
#define CUDART_WHY "GPU lookups need the CUDA runtime " ENGRAMSTORE_CUDART " (CUDA %d), "
#if ENGRAMSTORE_CUDA_MAJOR >= 13
#define CUDART_PIP "nvidia-cuda-runtime==%d.*"
#else
#define CUDART_PIP "nvidia-cuda-runtime-cu%d"
#endif
#define CUDART_HOW                                                                              \
    "Install the CUDA %d runtime (the CUDA toolkit, or `pip install " CUDART_PIP "`) and put " \
    "its directory on LD_LIBRARY_PATH, or set ENGRAMSTORE_CUDART to the library's path.  "     \
    "Lookups into host memory do not need it."

/* The runtime, loaded once and kept for the life of the process. */
static void *cudart;

/* dlerror()'s text, copied: the next dl call may overwrite it. */
static void last_dlerror(char *buf, size_t len)
{
    const char *e = dlerror();
    snprintf(buf, len, "%s", e ? e : "unknown error");
}

static int load_runtime(void)
{
    const char *env = getenv("ENGRAMSTORE_CUDART");
    char e1[512], e2[512];
    if (cudart)
        return 0;
    if (env && env[0]) {
        /* Only what the caller named: searching elsewhere would hide a
         * wrong setting. */
        if ((cudart = dlopen(env, RTLD_NOW | RTLD_LOCAL)))
            return 0;
        last_dlerror(e1, sizeof e1);
        import_error(CUDART_WHY "and ENGRAMSTORE_CUDART=%s could not be loaded: %s.  " CUDART_HOW,
                     ENGRAMSTORE_CUDA_MAJOR, env, e1, ENGRAMSTORE_CUDA_MAJOR,
                     ENGRAMSTORE_CUDA_MAJOR);
        return -1;
    }
    /* The loader's search first: a runtime already in the process (torch
     * loads its own) is found by its soname, then LD_LIBRARY_PATH, the
     * ld.so cache and the system directories. */
    if ((cudart = dlopen(ENGRAMSTORE_CUDART, RTLD_NOW | RTLD_LOCAL)))
        return 0;
    last_dlerror(e1, sizeof e1);
    if ((cudart = dlopen(ENGRAMSTORE_CUDART_DIR "/" ENGRAMSTORE_CUDART, RTLD_NOW | RTLD_LOCAL)))
        return 0;
    last_dlerror(e2, sizeof e2);
    import_error(CUDART_WHY "which could not be loaded.  Searched the dynamic loader's path "
                 "(LD_LIBRARY_PATH, the ld.so cache, the system library directories): %s; "
                 "and the toolkit engramstore was built with: %s.  " CUDART_HOW,
                 ENGRAMSTORE_CUDA_MAJOR, e1, e2, ENGRAMSTORE_CUDA_MAJOR, ENGRAMSTORE_CUDA_MAJOR);
    return -1;
}
#endif /* ENGRAMSTORE_CUDART */

int ext_cuda_load(void)
{
    const ext_cuda_api *api;
    if (gpu)
        return 0;
#ifdef ENGRAMSTORE_CUDART
    if (load_runtime() < 0)
        return -1;
#endif
    {
        /* Not PyCapsule_Import(), which does not import submodules. */
        PyObject *m = PyImport_ImportModule(EXT_CUDA_MODULE), *cap;
        cap = m ? PyObject_GetAttrString(m, "_api") : NULL;
        api = cap ? PyCapsule_GetPointer(cap, EXT_CUDA_CAPSULE) : NULL;
        Py_XDECREF(cap); /* the module keeps the capsule, and Python the module */
        Py_XDECREF(m);
    }
    if (!api) {
        import_error("GPU lookups: the module " EXT_CUDA_MODULE " could not be loaded "
                     "(it is built and installed with this one where CUDA is found)");
        return -1;
    }
    if (api->abi != EXT_CUDA_ABI || api->size != sizeof(ext_cuda_api)) {
        import_error("GPU lookups: " EXT_CUDA_MODULE " is from another build of engramstore "
                     "(interface %u, %zu bytes; this module needs %u, %zu bytes): reinstall "
                     "the package", api->abi, api->size, (unsigned)EXT_CUDA_ABI,
                     sizeof(ext_cuda_api));
        return -1;
    }
    if (api->attach(engram_internal_v1()) < 0) {
        import_error("GPU lookups: " EXT_CUDA_MODULE " refused this module's library "
                     "interface: reinstall the package");
        return -1;
    }
    gpu = api;
    return 0;
}

/* ---- calls through the GPU module ------------------------------------------------ */

int ext_cuda_lookup(ext_cuda **slot, engram_store *st, const engram_lookup_args *a,
                    const ext_cuda_call *call, ext_cuda_error *err)
{
    /* ext_cuda_load() succeeded before the store was entered. */
    return gpu->lookup(slot, st, a, call, err);
}

/* A store has a context only once a GPU lookup made one, through a loaded
 * module: with none, these have nothing to do and load nothing. */
int ext_cuda_check(ext_cuda *c, struct engram_cuda_report *rep)
{
    return c ? gpu->check(c, rep) : 0;
}

int ext_cuda_stats(const ext_cuda *c, struct engram_cuda_stats *out)
{
    return c ? gpu->stats(c, out) : 0;
}

void ext_cuda_close(ext_cuda *c)
{
    if (c)
        gpu->close(c);
}

#endif /* ENGRAMSTORE_HAVE_CUDA */
