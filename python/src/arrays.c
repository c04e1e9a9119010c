/*
 * arrays.c - taking arrays from Python objects, without copying or
 * converting them.
 *
 * Three kinds of objects are told apart, in this order:
 *  1. anything with the buffer protocol (numpy arrays, memoryviews,
 *     np.memmap, bytearray, ...): the view gives data, shape, strides and
 *     the struct-module format, from which the dtype is read;
 *  2. device arrays (__cuda_array_interface__, or __dlpack_device__ naming
 *     a CUDA device): taken where the caller accepts them in a build with
 *     the CUDA library, with the stream handshake of each protocol (the
 *     consumer's stream passed to __dlpack__(stream=...); the producer's
 *     stream of __cuda_array_interface__ v3 returned for the consumer to
 *     wait for); refused otherwise (NotImplementedError without CUDA);
 *  3. host arrays that only speak DLPack (torch CPU tensors): the capsule
 *     from __dlpack__() is taken, renamed "used_..." as the protocol asks,
 *     and its deleter is called on release.
 * Nothing is ever converted: the caller checks dtype and shape and raises
 * if they are not what the argument needs.
 */
#include "ext.h"

#include <stdlib.h>
#include <string.h>

/* ---- DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html) -------
 * The few structs of the stable C ABI this file reads.  Legacy capsules
 * are named "dltensor" and hold a DLManagedTensor; DLPack >= 1.0 producers
 * asked for max_version=(1, 0) return "dltensor_versioned" holding a
 * DLManagedTensorVersioned, which also carries a read-only flag. */
typedef struct {
    int32_t device_type;
    int32_t device_id;
} dl_device;
typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} dl_dtype;
typedef struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL = C-contiguous */
    uint64_t byte_offset;
} dl_tensor;
typedef struct dl_managed {
    dl_tensor t;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *self);
} dl_managed;
typedef struct dl_managed_v {
    struct {
        uint32_t major, minor;
    } version;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_v *self);
    uint64_t flags;
    dl_tensor t;
} dl_managed_v;

#define DL_CPU 1
#define DL_CUDA 2
#define DL_CUDA_HOST 3
#define DL_CUDA_MANAGED 13
#define DL_INT 0
#define DL_UINT 1
#define DL_FLAG_READ_ONLY 1u

/* getattr(obj, name, None) without masking errors other than
 * AttributeError: 0 with *res set (or NULL if absent), -1 on error. */
static int ext_getattr_opt(PyObject *obj, const char *name, PyObject **res)
{
    *res = PyObject_GetAttrString(obj, name);
    if (*res)
        return 0;
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* *r = x * y for x, y >= 0, or 0 with *r untouched if it overflows. */
static int mul_ok(Py_ssize_t x, Py_ssize_t y, Py_ssize_t *r)
{
    if (x && y > PY_SSIZE_T_MAX / x)
        return 0;
    *r = x * y;
    return 1;
}

/* Checks shape and strides that a DLPack producer or a
 * __cuda_array_interface__ gave (the buffer protocol's are checked by
 * CPython): no negative dimension, and an extent, sum of |stride| *
 * (shape - 1) plus the item, that fits in Py_ssize_t, so no offset computed
 * from them overflows.  0, or -1 with ValueError naming the argument. */
static int check_extent(const ext_array *a, const char *arg)
{
    Py_ssize_t span = a->itemsize, d;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: dimension %d has negative size %zd", arg, i,
                         a->shape[i]);
            return -1;
        }
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] == 0)
            return 0; /* empty: nothing is ever addressed */
    for (int i = 0; i < a->ndim; i++) {
        Py_ssize_t st = a->strides[i];
        if (st == PY_SSIZE_T_MIN || !mul_ok(st < 0 ? -st : st, a->shape[i] - 1, &d) ||
            span > PY_SSIZE_T_MAX - d) {
            PyErr_Format(PyExc_ValueError, "%s: shape and strides address more memory than "
                         "there can be (dimension %d: size %zd, stride %zd bytes)", arg, i,
                         a->shape[i], st);
            return -1;
        }
        span += d;
    }
    return 0;
}

/* Parses a struct-module format of one element: an optional native or
 * little-endian prefix, then one integer code.  Anything else is "other". */
static void parse_format(const char *fmt, Py_ssize_t itemsize, ext_array *a)
{
    a->kind = EXT_KIND_OTHER;
    a->itemsize = (int)itemsize;
    if (!fmt) { /* no format requested/given means unsigned bytes */
        a->kind = EXT_KIND_UINT;
        return;
    }
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    if (!fmt[0] || fmt[1])
        return;
    switch (fmt[0]) {
    case 'b': case 'h': case 'i': case 'l': case 'q':
        a->kind = EXT_KIND_INT;
        break;
    case 'B': case 'H': case 'I': case 'L': case 'Q':
        a->kind = EXT_KIND_UINT;
        break;
    default:
        break;
    }
}

/* Replaces the pending exception, raised by the exporter of `obj`, with a
 * ValueError that names the argument and keeps the exporter's text. */
static void reraise_named(const char *arg, PyObject *obj, const char *what)
{
    PyObject *et, *ev, *tb, *msg;
    PyErr_Fetch(&et, &ev, &tb);
    msg = ev ? PyObject_Str(ev) : NULL;
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    PyErr_Format(PyExc_ValueError, "%s: cannot take %s of this %.100s (%S)", arg, what,
                 Py_TYPE(obj)->tp_name, msg ? msg : Py_None);
    Py_XDECREF(msg);
}

static int from_buffer(PyObject *obj, const char *arg, unsigned flags, ext_array *a)
{
    /* Ask for a read-only view first, so a read-only output gets our own
     * message instead of the exporter's BufferError. */
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_RECORDS_RO) < 0) {
        reraise_named(arg, obj, "a strided view");
        return -1;
    }
    a->has_view = 1;
    if (a->view.ndim > EXT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions is more than %d", arg, a->view.ndim,
                     EXT_MAX_DIMS);
        goto fail;
    }
    if (a->view.format && (a->view.format[0] == '>' || a->view.format[0] == '!')) {
        PyErr_Format(PyExc_TypeError, "%s: big-endian data is not accepted (format '%s')", arg,
                     a->view.format);
        goto fail;
    }
    if ((flags & EXT_WRITABLE) && a->view.readonly) {
        PyErr_Format(PyExc_ValueError, "%s: the array is read-only; a writable array is needed",
                     arg);
        goto fail;
    }
    a->data = a->view.buf;
    a->ndim = a->view.ndim;
    a->readonly = a->view.readonly;
    parse_format(a->view.format, a->view.itemsize, a);
    for (int i = 0; i < a->ndim; i++) {
        a->shape[i] = a->view.shape[i];
        a->strides[i] = a->view.strides[i];
    }
    return 0;
fail:
    PyBuffer_Release(&a->view);
    a->has_view = 0;
    return -1;
}

/* Calls obj.__dlpack_device__() if present: 1 and *type on success, 0 if
 * the object has no such method, -1 on error. */
static int dlpack_device(PyObject *obj, const char *arg, int *type)
{
    PyObject *m, *r;
    if (ext_getattr_opt(obj, "__dlpack_device__", &m) < 0)
        return -1;
    if (!m)
        return 0;
    r = PyObject_CallNoArgs(m);
    Py_DECREF(m);
    if (!r)
        return -1;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2 || !PyLong_Check(PyTuple_GET_ITEM(r, 0))) {
        Py_DECREF(r);
        PyErr_Format(PyExc_TypeError, "%s: __dlpack_device__() did not return (type, id)", arg);
        return -1;
    }
    *type = (int)PyLong_AsLong(PyTuple_GET_ITEM(r, 0));
    Py_DECREF(r);
    if (*type == -1 && PyErr_Occurred())
        return -1;
    return 1;
}

static PyObject *device_refusal(const char *arg, const char *how, unsigned flags)
{
#ifdef ENGRAMSTORE_HAVE_CUDA
    if (!(flags & EXT_DEVICE_OK)) {
        PyErr_Format(PyExc_TypeError, "%s: CUDA device memory (%s) is not accepted here; pass a "
                     "host array", arg, how);
        return NULL;
    }
#endif
    (void)flags;
    PyErr_Format(PyExc_NotImplementedError,
                 "%s: CUDA device memory (%s) is not supported yet: this build of engramstore "
                 "has no CUDA library (build it where nvcc is found)",
                 arg, how);
    return NULL;
}

#ifdef ENGRAMSTORE_HAVE_CUDA
/* Parses a __cuda_array_interface__ dict (version 2 or 3): data pointer,
 * shape, strides (None = C-contiguous) and typestr ("<i8", "|u1", ...). */
static int from_cai(PyObject *cai, const char *arg, unsigned flags, ext_array *a)
{
    PyObject *shape, *strides, *typestr, *data, *mask;
    const char *ts;
    unsigned long long ptr;
    int readonly;
    Py_ssize_t step;

    if (!PyDict_Check(cai))
        goto bad;
    shape = PyDict_GetItemString(cai, "shape");
    strides = PyDict_GetItemString(cai, "strides");
    typestr = PyDict_GetItemString(cai, "typestr");
    data = PyDict_GetItemString(cai, "data");
    mask = PyDict_GetItemString(cai, "mask");
    if (!shape || !PyTuple_Check(shape) || !typestr || !PyUnicode_Check(typestr) || !data ||
        !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2)
        goto bad;
    if (mask && mask != Py_None) {
        PyErr_Format(PyExc_ValueError, "%s: masked device arrays are not accepted", arg);
        return -1;
    }
    /* Version 3: the stream the producer's writes are ordered on (absent
     * or None: nothing to wait for; 0 is disallowed as ambiguous). */
    {
        PyObject *stream = PyDict_GetItemString(cai, "stream");
        if (stream && stream != Py_None) {
            unsigned long long h;
            if (!PyLong_Check(stream))
                goto bad;
            h = PyLong_AsUnsignedLongLong(stream);
            if (h == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear(); /* negative or too large: not a stream */
                goto bad;
            }
            if (h == 0) {
                PyErr_Format(PyExc_ValueError, "%s: __cuda_array_interface__ stream 0 is "
                             "disallowed by the interface (ambiguous): use 1 for the legacy "
                             "default stream", arg);
                return -1;
            }
            a->has_sync_stream = 1;
            a->sync_stream = (uintptr_t)h;
        }
    }
    ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    if (ptr == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if ((readonly = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1))) < 0)
        return -1;
    if (!(ts = PyUnicode_AsUTF8(typestr)))
        return -1;
    if (ts[0] == '>') {
        PyErr_Format(PyExc_TypeError, "%s: big-endian data is not accepted (typestr '%s')", arg,
                     ts);
        return -1;
    }
    a->kind = ts[0] && (ts[1] == 'i' || ts[1] == 'u') ? (ts[1] == 'i' ? EXT_KIND_INT
                                                                      : EXT_KIND_UINT)
                                                      : EXT_KIND_OTHER;
    a->itemsize = ts[0] && ts[1] ? atoi(ts + 2) : 0;
    if (a->itemsize <= 0) {
        a->kind = EXT_KIND_OTHER;
        a->itemsize = 1;
    }
    a->ndim = (int)PyTuple_GET_SIZE(shape);
    if (a->ndim > EXT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions is more than %d", arg, a->ndim,
                     EXT_MAX_DIMS);
        return -1;
    }
    if (strides && strides != Py_None &&
        (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != a->ndim))
        goto bad;
    step = a->itemsize;
    for (int i = a->ndim - 1; i >= 0; i--) {
        a->shape[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (a->shape[i] == -1 && PyErr_Occurred())
            return -1;
        a->strides[i] = strides && strides != Py_None
                            ? PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, i))
                            : step;
        if (PyErr_Occurred())
            return -1;
        if (a->shape[i] >= 0 && !mul_ok(step, a->shape[i], &step))
            step = PY_SSIZE_T_MAX; /* too big: check_extent() refuses it */
    }
    if (check_extent(a, arg) < 0)
        return -1;
    if ((flags & EXT_WRITABLE) && readonly) {
        PyErr_Format(PyExc_ValueError, "%s: the array is read-only; a writable array is needed",
                     arg);
        return -1;
    }
    a->data = (char *)(uintptr_t)ptr;
    a->readonly = readonly;
    a->device = EXT_DEVICE_CUDA;
    a->device_id = -1; /* the interface does not say: the current device */
    return 0;
bad:
    PyErr_Format(PyExc_TypeError, "%s: malformed __cuda_array_interface__", arg);
    return -1;
}
#endif

static void dl_delete(void *managed, int versioned)
{
    if (versioned) {
        dl_managed_v *mv = managed;
        if (mv->deleter)
            mv->deleter(mv);
    } else {
        dl_managed *mt = managed;
        if (mt->deleter)
            mt->deleter(mt);
    }
}

/* Takes obj's DLPack capsule.  `stream` is the consumer's stream handle
 * for a producer on a CUDA device (1 for the legacy default stream), or 0
 * to pass none (host memory). */
static int from_dlpack(PyObject *obj, const char *arg, unsigned flags, uintptr_t stream,
                       ext_array *a)
{
    PyObject *m = NULL, *cap = NULL, *kw = NULL, *args = NULL;
    dl_tensor *t;
    int versioned = 0;

    if (ext_getattr_opt(obj, "__dlpack__", &m) < 0)
        return -1;
    if (!m) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected an array (buffer protocol or DLPack), got %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    /* Ask for a versioned capsule (it says whether the memory is
     * read-only); producers older than DLPack 1.0 reject the keyword.  A
     * device producer also gets the consumer's stream, on which it makes
     * its pending writes visible. */
    args = PyTuple_New(0);
    kw = stream ? Py_BuildValue("{s:(ii),s:K}", "max_version", 1, 0, "stream",
                                (unsigned long long)stream)
                : Py_BuildValue("{s:(ii)}", "max_version", 1, 0);
    if (!args || !kw)
        goto fail;
    cap = PyObject_Call(m, args, kw);
    if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        Py_CLEAR(kw);
        if (stream) {
            if (!(kw = Py_BuildValue("{s:K}", "stream", (unsigned long long)stream)))
                goto fail;
            cap = PyObject_Call(m, args, kw);
        }
        if (!stream || (!cap && PyErr_ExceptionMatches(PyExc_TypeError))) {
            PyErr_Clear(); /* a producer that knows no keywords */
            cap = PyObject_CallNoArgs(m);
        }
    }
    if (!cap && PyErr_ExceptionMatches(PyExc_BufferError))
        /* The producer cannot export it (e.g. numpy refuses a read-only
         * array to a pre-1.0 DLPack request): name the argument, as the
         * buffer path does. */
        reraise_named(arg, obj, "a DLPack tensor");
    if (!cap)
        goto fail;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        dl_managed_v *mv = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (!mv)
            goto fail;
        if (mv->version.major != 1) {
            PyErr_Format(PyExc_TypeError, "%s: DLPack version %u.%u is not supported", arg,
                         mv->version.major, mv->version.minor);
            goto fail;
        }
        versioned = 1;
        a->dl_managed = mv;
        a->readonly = (mv->flags & DL_FLAG_READ_ONLY) != 0;
        t = &mv->t;
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0)
            goto fail_taken;
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        dl_managed *mt = PyCapsule_GetPointer(cap, "dltensor");
        if (!mt)
            goto fail;
        a->dl_managed = mt;
        t = &mt->t;
        if (PyCapsule_SetName(cap, "used_dltensor") < 0)
            goto fail_taken;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__() did not return a DLPack capsule", arg);
        goto fail;
    }
    a->dl_capsule = cap;
    a->dl_versioned = versioned;
    cap = NULL;
    Py_CLEAR(m);
    Py_CLEAR(kw);
    Py_CLEAR(args);

    if (t->device.device_type == DL_CUDA || t->device.device_type == DL_CUDA_MANAGED) {
#ifdef ENGRAMSTORE_HAVE_CUDA
        if (flags & EXT_DEVICE_OK) {
            a->device = EXT_DEVICE_CUDA;
            a->device_id = (int)t->device.device_id;
        } else
#endif
        {
            device_refusal(arg, "DLPack", flags);
            goto fail_held;
        }
    } else
    if (t->device.device_type != DL_CPU && t->device.device_type != DL_CUDA_HOST) {
        PyErr_Format(PyExc_TypeError, "%s: DLPack device type %d is not host memory", arg,
                     (int)t->device.device_type);
        goto fail_held;
    }
    if ((flags & EXT_WRITABLE) && a->readonly) {
        PyErr_Format(PyExc_ValueError, "%s: the array is read-only; a writable array is needed",
                     arg);
        goto fail_held;
    }
    if (t->ndim < 0 || t->ndim > EXT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions is more than %d", arg, (int)t->ndim,
                     EXT_MAX_DIMS);
        goto fail_held;
    }
    if (t->dtype.lanes != 1 || t->dtype.bits % 8 || t->dtype.bits == 0) {
        a->kind = EXT_KIND_OTHER;
        a->itemsize = 0;
    } else {
        a->itemsize = t->dtype.bits / 8;
        a->kind = t->dtype.code == DL_INT    ? EXT_KIND_INT
                  : t->dtype.code == DL_UINT ? EXT_KIND_UINT
                                             : EXT_KIND_OTHER;
    }
    a->ndim = (int)t->ndim;
    a->data = (char *)t->data + t->byte_offset;
    {
        Py_ssize_t step = a->itemsize;
        for (int i = a->ndim - 1; i >= 0; i--) {
            int64_t n = t->shape[i], st = t->strides ? t->strides[i] : 0;
            Py_ssize_t bytes;
            /* Strides come in elements: refuse what does not fit in bytes
             * (check_extent() refuses negative sizes). */
            if (n > PY_SSIZE_T_MAX || n < -PY_SSIZE_T_MAX || st > PY_SSIZE_T_MAX ||
                st < -PY_SSIZE_T_MAX ||
                !mul_ok(st < 0 ? -(Py_ssize_t)st : (Py_ssize_t)st, a->itemsize, &bytes)) {
                PyErr_Format(PyExc_ValueError, "%s: dimension %d: size %lld or stride %lld "
                             "elements is out of range", arg, i, (long long)n, (long long)st);
                goto fail_held;
            }
            a->shape[i] = (Py_ssize_t)n;
            a->strides[i] = t->strides ? (st < 0 ? -bytes : bytes) : step;
            if (n >= 0 && !mul_ok(step, (Py_ssize_t)n, &step))
                step = PY_SSIZE_T_MAX; /* only ever a stride of a bigger
                                        * dimension: check_extent() refuses it */
        }
    }
    if (check_extent(a, arg) < 0)
        goto fail_held;
    return 0;

fail_taken:
    /* Not renamed: the capsule still owns the tensor, and its destructor
     * calls the deleter when it goes (calling it here too would free it
     * twice). */
    a->dl_managed = NULL;
fail:
    Py_XDECREF(cap);
    Py_XDECREF(m);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    return -1;
fail_held:
    ext_array_release(a);
    return -1;
}

int ext_array_get(PyObject *obj, const char *arg, unsigned flags, ext_array *a)
{
    return ext_array_get_gpu(obj, arg, flags, NULL, a);
}

int ext_array_get_gpu(PyObject *obj, const char *arg, unsigned flags, PyObject *stream,
                      ext_array *a)
{
    PyObject *cai;
    uintptr_t dl_stream = 0;
    int dev, r;

    memset(a, 0, sizeof *a);
#ifndef ENGRAMSTORE_HAVE_CUDA
    flags &= ~EXT_DEVICE_OK; /* nothing here can use device memory */
#endif
    if (PyObject_CheckBuffer(obj))
        return from_buffer(obj, arg, flags, a);
    if (PyList_Check(obj) || PyTuple_Check(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected an array, got a Python %.20s (no implicit conversion: "
                     "pass a numpy array of the right dtype)",
                     arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (ext_getattr_opt(obj, "__cuda_array_interface__", &cai) < 0)
        return -1;
    if (cai) {
#ifdef ENGRAMSTORE_HAVE_CUDA
        if (flags & EXT_DEVICE_OK) {
            r = from_cai(cai, arg, flags, a);
            Py_DECREF(cai);
            return r;
        }
#endif
        Py_DECREF(cai);
        device_refusal(arg, "__cuda_array_interface__", flags);
        return -1;
    }
    r = dlpack_device(obj, arg, &dev);
    if (r < 0)
        return -1;
    if (r > 0 && (dev == DL_CUDA || dev == DL_CUDA_MANAGED)) {
        if (!(flags & EXT_DEVICE_OK)) {
            device_refusal(arg, "DLPack", flags);
            return -1;
        }
#ifdef ENGRAMSTORE_HAVE_CUDA
        {
            void *h;
            if (ext_cuda_stream(stream, &h) < 0)
                return -1;
            dl_stream = h ? (uintptr_t)h : 1; /* 1: the legacy default stream */
        }
#endif
    }
    (void)stream;
    return from_dlpack(obj, arg, flags, dl_stream, a);
}

void ext_array_release(ext_array *a)
{
    if (a->has_view) {
        PyBuffer_Release(&a->view);
        a->has_view = 0;
    }
    if (a->dl_capsule) {
        dl_delete(a->dl_managed, a->dl_versioned);
        Py_CLEAR(a->dl_capsule);
        a->dl_managed = NULL;
    }
}

const char *ext_array_dtype(const ext_array *a, char *buf, size_t len)
{
    if (a->kind == EXT_KIND_INT || a->kind == EXT_KIND_UINT)
        PyOS_snprintf(buf, len, "%sint%d", a->kind == EXT_KIND_UINT ? "u" : "", a->itemsize * 8);
    else if (a->has_view && a->view.format) {
        const char *f = a->view.format + (strchr("@=<>!", a->view.format[0]) ? 1 : 0);
        const char *name = !strcmp(f, "e") ? "float16" : !strcmp(f, "f") ? "float32"
                         : !strcmp(f, "d") ? "float64" : !strcmp(f, "?") ? "bool" : NULL;
        if (name)
            PyOS_snprintf(buf, len, "%s", name);
        else
            PyOS_snprintf(buf, len, "format '%s'", a->view.format);
    }
    else
        PyOS_snprintf(buf, len, "a %d-byte non-integer type", a->itemsize);
    return buf;
}

const char *ext_array_shape(const ext_array *a, char *buf, size_t len)
{
    size_t n = 0;
    n += (size_t)PyOS_snprintf(buf, len, "(");
    for (int i = 0; i < a->ndim && n < len; i++)
        n += (size_t)PyOS_snprintf(buf + n, len - n, "%s%zd", i ? ", " : "", a->shape[i]);
    if (n < len)
        PyOS_snprintf(buf + n, len - n, a->ndim == 1 ? ",)" : ")");
    return buf;
}

int ext_array_c_contiguous(const ext_array *a)
{
    Py_ssize_t step = a->itemsize;
    for (int i = a->ndim - 1; i >= 0; i--) {
        if (a->shape[i] != 1 && a->strides[i] != step)
            return 0;
        step *= a->shape[i];
    }
    return 1;
}

PyObject *ext_new_uint8(const Py_ssize_t *shape, int ndim)
{
    PyObject *dims, *np, *buf = NULL, *view = NULL, *ret = NULL;
    Py_ssize_t n = 1;
    if (!(dims = PyTuple_New(ndim)))
        return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *d = PyLong_FromSsize_t(shape[i]);
        if (!d)
            goto out;
        PyTuple_SET_ITEM(dims, i, d);
        if (n && shape[i] > PY_SSIZE_T_MAX / n) {
            PyErr_SetString(PyExc_MemoryError, "the output's size overflows");
            goto out;
        }
        n *= shape[i];
    }
    if ((np = PyImport_ImportModule("numpy"))) {
        ret = PyObject_CallMethod(np, "zeros", "Os", dims, "uint8");
        Py_DECREF(np);
        goto out;
    }
    if (!PyErr_ExceptionMatches(PyExc_ImportError))
        goto out;
    PyErr_Clear();
    if (!(buf = PyByteArray_FromStringAndSize(NULL, n)))
        goto out;
    if (n)
        memset(PyByteArray_AS_STRING(buf), 0, (size_t)n);
    if ((view = PyMemoryView_FromObject(buf)))
        ret = PyObject_CallMethod(view, "cast", "sO", "B", dims);
out:
    Py_XDECREF(view);
    Py_XDECREF(buf);
    Py_DECREF(dims);
    return ret;
}
