/*
 * publication.c - the _Publication type: the library's publication
 * protocol (src/publish.c) over a key-value store written in Python.
 *
 * A remote store that only Python can reach (Mooncake's client is a
 * Python module) implements kv.h's operations as methods of one object;
 * the protocol itself stays the library's, the same code that publishes,
 * removes and collects the tables of a Redis Cluster.  The protocol runs
 * with the GIL released; each kv.h operation takes the GIL for its call
 * into Python (on the thread that runs the protocol: the thread of
 * read()'s checks touches no Python object).
 *
 * An exception raised by a method fails the operation: an EngramError
 * keeps its code, TimeoutError is -ETIMEDOUT, PermissionError -EACCES,
 * LookupError -ENODATA, anything else -EIO; its text is the message.  A
 * write whose method raised may have taken effect or not, which is what
 * the protocol is built for.
 */
#include "ext.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "xxh.h"

#include "common.h"
#include "publish.h"
#include "writer.h"

typedef struct {
    PyObject_HEAD
    PyObject *kv;
    char *where;
    engram__pub pub;
    /* A KeyboardInterrupt or SystemExit a method raised: the operation
     * failed (-EINTR), and the exception is raised again when the
     * protocol's call returns (done()). */
    PyObject *itype, *ivalue, *itb;
    /* get_ranges()'s bytearray, reused while no method kept it (its
     * pages stay mapped: a fresh one per read costs its page faults). */
    PyObject *scratch;
    /* The kv keeps no view of get_ranges()'s `out` past the call
     * (MooncakeKV): it is given the destination itself. */
    int direct;
} PubObject;

/* ------------------------------------------------------------------------
 * A destination lent to a direct kv's get_ranges(): the protocol's buffer
 * as an object that counts the buffers taken of it.  Every view made of
 * `out` (a slice, a cast, memoryview(out), an array) holds one of them
 * until it is gone, so a count above 0 once the call returned and `out`
 * was dropped means a view outlived the call.
 */
typedef struct {
    PyObject_HEAD
    char *buf; /* NULL once the call returned: no new buffer is given */
    Py_ssize_t len, exports;
} DstObject;

static PyTypeObject *dst_type;

static int Dst_getbuffer(DstObject *d, Py_buffer *view, int flags)
{
    if (!d->buf) {
        PyErr_SetString(PyExc_BufferError, "get_ranges: out is no longer valid");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)d, d->buf, d->len, 0, flags) < 0)
        return -1;
    d->exports++;
    return 0;
}

static void Dst_releasebuffer(DstObject *d, Py_buffer *view)
{
    (void)view;
    d->exports--;
}

static void Dst_dealloc(DstObject *d)
{
    PyTypeObject *tp = Py_TYPE(d);
    PyObject_Free(d);
    Py_DECREF(tp);
}

static PyType_Slot Dst_slots[] = {
    {Py_bf_getbuffer, (void *)Dst_getbuffer},
    {Py_bf_releasebuffer, (void *)Dst_releasebuffer},
    {Py_tp_dealloc, (void *)Dst_dealloc},
    {0, NULL},
};

static PyType_Spec Dst_spec = {
    .name = "engramstore._engram._Destination",
    .basicsize = sizeof(DstObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Dst_slots,
};

/* ------------------------------------------------------------------------
 * kv.h over the Python object (each with the GIL taken).
 */

/* The failure of method `op` (its exception, which is cleared), as a
 * library code with a message. */
static int py_fail(void *kv, const char *op)
{
    PyObject *type, *value, *tb, *s;
    const char *text = NULL;
    int code = -EIO;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && !PyErr_GivenExceptionMatches(value, PyExc_Exception)) {
        /* Ctrl-C or an exit: not the store's failure, and not to be lost. */
        PubObject *o = kv;
        s = PyObject_Str(value);
        code = engram__err(-EINTR, "%s: kv.%s: interrupted (%s)", o->where, op,
                           s && PyUnicode_AsUTF8(s) ? PyUnicode_AsUTF8(s) : "");
        PyErr_Clear();
        Py_XDECREF(s);
        if (!o->itype) {
            o->itype = type;
            o->ivalue = value;
            o->itb = tb;
            return code;
        }
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return code;
    }
    if (value && PyErr_GivenExceptionMatches(value, ext_EngramError)) {
        PyObject *e = PyObject_GetAttrString(value, "errno");
        long v = e && PyLong_Check(e) ? PyLong_AsLong(e) : 0;
        Py_XDECREF(e);
        PyErr_Clear();
        code = v > 0 ? (int)-v : -EIO;
    } else if (value && PyErr_GivenExceptionMatches(value, PyExc_TimeoutError)) {
        code = -ETIMEDOUT;
    } else if (value && PyErr_GivenExceptionMatches(value, PyExc_PermissionError)) {
        code = -EACCES;
    } else if (value && PyErr_GivenExceptionMatches(value, PyExc_LookupError)) {
        code = -ENODATA;
    }
    s = value ? PyObject_Str(value) : NULL;
    if (s)
        text = PyUnicode_AsUTF8(s);
    if (!text) {
        PyErr_Clear();
        text = "(no message)";
    }
    code = engram__err(code, "%s: kv.%s: %s", ((PubObject *)kv)->where, op, text);
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return code;
}

/* A method's result of the wrong kind. */
static int py_bad(void *kv, const char *op, const char *want)
{
    PyErr_Clear();
    return engram__err(-EIO, "%s: kv.%s: expected %s", ((PubObject *)kv)->where, op, want);
}

static int kv_sess_get(void *kv, void **s)
{
    *s = kv;
    return 0;
}

static void kv_sess_put(void *kv, void *s)
{
    (void)kv;
    (void)s;
}

/* Calls kv.<op>(*args) (args: a new tuple, consumed): the result, or NULL
 * with the failure in *err. */
static PyObject *call(void *kv, const char *op, PyObject *args, int *err)
{
    PyObject *m, *r = NULL;
    *err = 0;
    if (!args) {
        *err = py_fail(kv, op);
        return NULL;
    }
    if (!((PubObject *)kv)->kv) {
        Py_DECREF(args);
        *err = engram__err(-EIO, "kv.%s: the publication was cleared", op);
        return NULL;
    }
    if ((m = PyObject_GetAttrString(((PubObject *)kv)->kv, op)) != NULL) {
        r = PyObject_CallObject(m, args);
        Py_DECREF(m);
    }
    Py_DECREF(args);
    if (!r)
        *err = py_fail(kv, op);
    return r;
}

static int kv_rec_get(void *kv, void *s, const char *name, char **val, size_t *len)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r;
    Py_buffer view;
    int err;
    (void)s;
    if (!(r = call(kv, "rec_get", Py_BuildValue("(s)", name), &err)))
        goto out;
    if (r == Py_None) {
        err = engram__err(-ENOENT, "record '%s' not found", name);
    } else if (PyObject_GetBuffer(r, &view, PyBUF_SIMPLE) < 0) {
        err = py_bad(kv, "rec_get", "bytes or None");
    } else {
        if (!(*val = malloc((size_t)view.len + 1))) {
            err = engram__err(-ENOMEM, "out of memory");
        } else {
            memcpy(*val, view.buf, (size_t)view.len);
            (*val)[view.len] = '\0';
            *len = (size_t)view.len;
        }
        PyBuffer_Release(&view);
    }
    Py_DECREF(r);
out:
    PyGILState_Release(g);
    return err;
}

/* bytes of n bytes at p, or None for NULL. */
static PyObject *bytes_or_none(const char *p, size_t n)
{
    return p ? PyBytes_FromStringAndSize(p, (Py_ssize_t)n) : Py_NewRef(Py_None);
}

static int kv_rec_cas(void *kv, void *s, const char *name, const char *expect, size_t elen,
                      const char *val, size_t vlen, int *res)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *e = bytes_or_none(expect, elen), *v = bytes_or_none(val, vlen), *r;
    long x;
    int err = 0;
    (void)s;
    r = e && v ? call(kv, "rec_cas", Py_BuildValue("(sOO)", name, e, v), &err) : NULL;
    if (!e || !v)
        err = py_fail(kv, "rec_cas");
    Py_XDECREF(e);
    Py_XDECREF(v);
    if (r) {
        x = PyLong_Check(r) ? PyLong_AsLong(r) : 99;
        if (x == -1 && PyErr_Occurred())
            x = 99; /* too large: not an answer */
        PyErr_Clear();
        if (x == ENGRAM__KV_DONE || x == ENGRAM__KV_ABSENT || x == ENGRAM__KV_PRESENT ||
            x == ENGRAM__KV_DIFFERS)
            *res = (int)x;
        else
            err = py_bad(kv, "rec_cas", "1, 0, 2 or -1");
        Py_DECREF(r);
    }
    PyGILState_Release(g);
    return err;
}

static int kv_rec_list(void *kv, void *s,
                       int (*each)(void *ud, const char *name, const char *val, size_t len),
                       void *ud)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r, *seq = NULL;
    int err;
    (void)s;
    if (!(r = call(kv, "rec_list", PyTuple_New(0), &err)))
        goto out;
    if (!(seq = PySequence_Fast(r, "rec_list() must return a list"))) {
        err = py_bad(kv, "rec_list", "a list of (str, bytes)");
        goto out;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && !err; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
        const char *name;
        Py_buffer view;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(t, 0)) ||
            !(name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 0))) ||
            PyObject_GetBuffer(PyTuple_GET_ITEM(t, 1), &view, PyBUF_SIMPLE) < 0) {
            err = py_bad(kv, "rec_list", "a list of (str, bytes)");
            break;
        }
        err = each(ud, name, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
    }
out:
    Py_XDECREF(seq);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return err;
}

static int kv_now_ms(void *kv, void *s, uint64_t *ms)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r;
    int err;
    (void)s;
    if ((r = call(kv, "now_ms", PyTuple_New(0), &err)) != NULL) {
        unsigned long long v = PyLong_Check(r) ? PyLong_AsUnsignedLongLong(r) : 0;
        if (v == 0 || PyErr_Occurred())
            err = py_bad(kv, "now_ms", "an int above 0");
        *ms = v;
        Py_DECREF(r);
    }
    PyGILState_Release(g);
    return err;
}

/* Calls a method whose result does not matter. */
static int call_void(void *kv, const char *op, PyObject *args)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int err;
    PyObject *r = call(kv, op, args, &err);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return err;
}

static int kv_sync(void *kv, void *s)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *args = PyTuple_New(0);
    PyGILState_Release(g);
    (void)s;
    return call_void(kv, "sync", args);
}

static int kv_piece_put(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                        const void *data, size_t len, uint32_t ttl_ms)
{
    PyGILState_STATE g = PyGILState_Ensure();
    /* A copy: a view of the caller's rows could outlive the call (a
     * memoryview's slices survive its release()). */
    PyObject *b = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    PyObject *args = b ? Py_BuildValue("(sKiKOI)", pc->name, (unsigned long long)pc->epoch,
                                       pc->layout, (unsigned long long)index, b, ttl_ms)
                       : NULL;
    int err;
    PyObject *r = call(kv, "piece_put", args, &err);
    Py_XDECREF(r);
    Py_XDECREF(b);
    PyGILState_Release(g);
    (void)s;
    return err;
}

static int kv_piece_expire(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                           uint32_t ttl_ms)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int err, have;
    PyObject *r = call(kv, "piece_expire",
                       Py_BuildValue("(sKiKI)", pc->name, (unsigned long long)pc->epoch,
                                     pc->layout, (unsigned long long)index, ttl_ms),
                       &err);
    (void)s;
    if (r) {
        if ((have = PyObject_IsTrue(r)) < 0)
            err = py_bad(kv, "piece_expire", "a bool");
        else if (!have)
            err = engram__err(-ENODATA, "chunk %llu of '%s' is gone", (unsigned long long)index,
                              pc->name);
        Py_DECREF(r);
    }
    PyGILState_Release(g);
    return err;
}

static int kv_piece_del(void *kv, void *s, const engram__kv_piece *pc, uint64_t n)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *args = Py_BuildValue("(sKiK)", pc->name, (unsigned long long)pc->epoch, pc->layout,
                                   (unsigned long long)n);
    PyGILState_Release(g);
    (void)s;
    return call_void(kv, "piece_del", args);
}

static int kv_get_ranges(void *kv, void *s, const engram__kv_piece *pc,
                         const engram__kv_range *rg, size_t n, uint64_t bytes)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *list = PyList_New((Py_ssize_t)n), *out = NULL, *r = NULL;
    DstObject *dst = NULL;
    int err = 0, direct = ((PubObject *)kv)->direct;
    uint64_t at = 0;
    (void)s;
    (void)bytes;
    if (!list) {
        err = py_fail(kv, "get_ranges");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(KKIO)", (unsigned long long)rg[i].index,
                                    (unsigned long long)rg[i].start, rg[i].len,
                                    rg[i].whole ? Py_True : Py_False);
        if (!t) {
            err = py_fail(kv, "get_ranges");
            goto done;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
        at += rg[i].len;
    }
    /* A bytearray of the method's own, copied out after: a view of the
     * destinations could outlive the call (a slice or an array made from
     * it survives a memoryview's release()).  A kv made with direct
     * (keeping no view) is given destinations back to back as they are. */
    for (size_t i = 1; i < n && direct; i++)
        direct = rg[i].dst == rg[i - 1].dst + rg[i - 1].len;
    if (direct && n > 0) {
        if (!(dst = PyObject_New(DstObject, dst_type))) {
            err = py_fail(kv, "get_ranges");
            goto done;
        }
        dst->buf = (char *)rg[0].dst;
        dst->len = (Py_ssize_t)at;
        dst->exports = 0;
        if (!(out = PyMemoryView_FromObject((PyObject *)dst))) {
            err = py_fail(kv, "get_ranges");
            goto done;
        }
    } else {
        PubObject *o = kv;
        direct = 0;
        if (o->scratch && Py_REFCNT(o->scratch) == 1 &&
            (uint64_t)PyByteArray_GET_SIZE(o->scratch) == at) {
            out = Py_NewRef(o->scratch);
        } else if ((out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)at)) != NULL) {
            Py_XSETREF(o->scratch, Py_NewRef(out));
        } else {
            err = py_fail(kv, "get_ranges");
            goto done;
        }
    }
    r = call(kv, "get_ranges",
             Py_BuildValue("(sKiOO)", pc->name, (unsigned long long)pc->epoch, pc->layout, list,
                           out),
             &err);
    if (direct) {
        /* A view of out that outlived the call fails the read (and would
         * point at memory the protocol reuses and frees). */
        Py_CLEAR(r);
        Py_CLEAR(out);
        dst->buf = NULL;
        if (dst->exports != 0 && !err)
            err = py_bad(kv, "get_ranges", "no view of out kept (direct)");
    } else if (!err && (uint64_t)PyByteArray_GET_SIZE(out) != at)
        err = py_bad(kv, "get_ranges", "out left at its size");
    if (!err && !direct) {
        const char *b = PyByteArray_AS_STRING(out);
        at = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(rg[i].dst, b + at, rg[i].len);
            at += rg[i].len;
        }
    }
done:
    Py_XDECREF(r);
    Py_XDECREF(out);
    if (dst) {
        dst->buf = NULL;
        Py_DECREF(dst);
    }
    Py_XDECREF(list);
    PyGILState_Release(g);
    return err;
}

static const engram__kv_vt py_kv_vt = {
    .sess_get = kv_sess_get,
    .sess_put = kv_sess_put,
    .rec_get = kv_rec_get,
    .rec_cas = kv_rec_cas,
    .rec_list = kv_rec_list,
    .now_ms = kv_now_ms,
    .sync = kv_sync,
    .piece_put = kv_piece_put,
    .piece_expire = kv_piece_expire,
    .piece_del = kv_piece_del,
    .get_ranges = kv_get_ranges,
};

/* ------------------------------------------------------------------------
 * The type.
 */

static PyObject *Pub_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kv", "where", "chunk_bytes", "ttl_ms", "layout", "direct", NULL};
    PyObject *kv;
    const char *where;
    unsigned long long chunk_bytes, ttl_ms;
    int layout = 0, direct = 0;
    PubObject *o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsKK|ip:_Publication", kwlist, &kv, &where,
                                     &chunk_bytes, &ttl_ms, &layout, &direct))
        return NULL;
    if (chunk_bytes == 0 || ttl_ms == 0 || ttl_ms > UINT32_MAX)
        return PyErr_Format(PyExc_ValueError, "chunk_bytes must be above 0, and ttl_ms in "
                                              "[1, 2^32 - 1]");
    if (!(o = (PubObject *)type->tp_alloc(type, 0)))
        return NULL;
    if (!(o->where = strdup(where))) {
        Py_DECREF(o);
        return PyErr_NoMemory();
    }
    o->kv = Py_NewRef(kv);
    o->direct = direct;
    o->pub = (engram__pub){&py_kv_vt, o, o->where, chunk_bytes, (uint32_t)ttl_ms, layout,
                           NULL, NULL};
    return (PyObject *)o;
}

/* The kv object may hold its _Publication: a cycle the collector must
 * see. */
static int Pub_traverse(PubObject *o, visitproc visit, void *arg)
{
    Py_VISIT(o->kv);
    Py_VISIT(Py_TYPE(o));
    return 0;
}

static int Pub_clear(PubObject *o)
{
    Py_CLEAR(o->kv);
    Py_CLEAR(o->itype);
    Py_CLEAR(o->ivalue);
    Py_CLEAR(o->itb);
    Py_CLEAR(o->scratch);
    return 0;
}

static void Pub_dealloc(PubObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    Pub_clear(o);
    free(o->where);
    tp->tp_free(o);
    Py_DECREF(tp);
}

/* What a method returns: r, unless a method of the kv was interrupted
 * meanwhile, whose exception is then raised (whatever the protocol made
 * of the failure). */
static PyObject *done(PubObject *o, PyObject *r)
{
    if (!o->itype)
        return r;
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Restore(o->itype, o->ivalue, o->itb);
    o->itype = o->ivalue = o->itb = NULL;
    return NULL;
}

PyDoc_STRVAR(push_doc,
"push($self, name, rows, /)\n--\n\n"
"Publishes rows (C-contiguous uint8 [num_rows, row_bytes]) as table\n"
"`name`, create-only.");

static PyObject *Pub_push(PubObject *o, PyObject *args)
{
    const char *name;
    PyObject *rows;
    ext_array a;
    void *w = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "sO:push", &name, &rows) ||
        ext_array_get(rows, "rows", 0, &a) < 0)
        return NULL;
    if (a.ndim != 2 || a.itemsize != 1 || a.kind != EXT_KIND_UINT || !ext_array_c_contiguous(&a) ||
        a.shape[0] <= 0 || a.shape[1] <= 0 || a.shape[1] > ENGRAM_ROW_BYTES_MAX) {
        ext_array_release(&a);
        return PyErr_Format(PyExc_ValueError, "rows: expected a C-contiguous uint8 array of "
                                              "[num_rows, row_bytes], both above 0, row_bytes "
                                              "at most 16 MiB");
    }
    {
        engram_table_spec spec = {(uint64_t)a.shape[0], (uint32_t)a.shape[1], 0};
        Py_BEGIN_ALLOW_THREADS
        rc = engram__pub_writer_begin(&o->pub, name, &spec, &w);
        if (rc == 0 && (rc = engram__pub_writer_append(w, a.data, spec.num_rows, 0)) != 0) {
            engram__pub_writer_abort(w);
            w = NULL;
        }
        if (rc == 0)
            rc = engram__pub_writer_commit(w);
        Py_END_ALLOW_THREADS
    }
    ext_array_release(&a);
    if (rc != 0)
        return done(o, ext_raise(rc, NULL));
    return done(o, Py_NewRef(Py_None));
}

PyDoc_STRVAR(remove_doc,
"remove($self, name, /)\n--\n\n"
"Unpublishes table `name` (compare-and-delete) and deletes its chunks.");

static PyObject *Pub_remove(PubObject *o, PyObject *args)
{
    const char *name;
    int rc, unpublished;
    if (!PyArg_ParseTuple(args, "s:remove", &name))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram__pub_remove(&o->pub, name, &unpublished);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return done(o, ext_raise(rc, NULL));
    return done(o, Py_NewRef(Py_None));
}

/* gc's reports, appended to a Python list (with the GIL taken). */
static void gc_report(void *ud, const char *name, int code, const char *detail)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *t = Py_BuildValue("(sis)", name, code, detail);
    if (!t || PyList_Append(ud, t) < 0)
        PyErr_Clear(); /* out of memory: the report is lost, not the gc */
    Py_XDECREF(t);
    PyGILState_Release(g);
}

PyDoc_STRVAR(gc_doc,
"gc($self, idle_ms=0, dry_run=False)\n--\n\n"
"Settles what dead pushes and removals left; returns [(name, code,\n"
"detail)]: code 0 settled (or would be), 1 kept, negative failed.");

static PyObject *Pub_gc(PubObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"idle_ms", "dry_run", NULL};
    unsigned long long idle_ms = 0;
    int dry = 0, rc;
    PyObject *out;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Kp:gc", kwlist, &idle_ms, &dry) ||
        !(out = PyList_New(0)))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram__pub_gc(&o->pub, idle_ms, dry ? ENGRAM_GC_DRY_RUN : 0, gc_report, out);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_DECREF(out);
        return done(o, ext_raise(rc, NULL));
    }
    return done(o, out);
}

PyDoc_STRVAR(manifest_doc,
"manifest($self, name, /)\n--\n\n"
"The manifest of published table `name`, as a dict (chunk_sums: the\n"
"XXH3-64 of each chunk).");

static PyObject *Pub_manifest(PubObject *o, PyObject *args)
{
    const char *name;
    engram__rmanifest m;
    PyObject *d;
    int rc;
    if (!PyArg_ParseTuple(args, "s:manifest", &name))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram__pub_manifest(&o->pub, o, name, &m, NULL, NULL);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return done(o, ext_raise(rc, NULL));
    d = Py_BuildValue("{s:s,s:K,s:I,s:K,s:K,s:i,s:K,s:K,s:K}", "name", m.name, "num_rows",
                      (unsigned long long)m.num_rows, "row_bytes", m.row_bytes, "chunk_rows",
                      (unsigned long long)m.chunk_rows, "nchunks", (unsigned long long)m.nchunks,
                      "layout", m.tagged, "epoch", (unsigned long long)m.epoch, "created_ns",
                      (unsigned long long)m.created_ns, "checksum",
                      (unsigned long long)m.checksum);
    if (d) {
        PyObject *sums = PyList_New((Py_ssize_t)m.nchunks);
        for (uint64_t i = 0; sums && i < m.nchunks; i++) {
            PyObject *v = PyLong_FromUnsignedLongLong(m.chunk_sums[i]);
            if (!v)
                Py_CLEAR(sums);
            else
                PyList_SET_ITEM(sums, (Py_ssize_t)i, v);
        }
        if (!sums || PyDict_SetItemString(d, "chunk_sums", sums) < 0)
            Py_CLEAR(d);
        Py_XDECREF(sums);
    }
    engram__rmanifest_free(&m);
    return done(o, d);
}

typedef struct names {
    char **v;
    size_t n, cap;
} names;

static int names_add(void *ud, const char *name)
{
    names *a = ud;
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 16;
        char **v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return engram__err(-ENOMEM, "out of memory");
        a->v = v;
        a->cap = cap;
    }
    if (!(a->v[a->n] = strdup(name)))
        return engram__err(-ENOMEM, "out of memory");
    a->n++;
    return 0;
}

PyDoc_STRVAR(list_doc,
"list($self, /)\n--\n\n"
"The names of the published tables, in no order.");

static PyObject *Pub_list(PubObject *o, PyObject *unused)
{
    names a = {NULL, 0, 0};
    PyObject *out = NULL;
    int rc;
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    rc = engram__pub_list(&o->pub, names_add, &a);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        ext_raise(rc, NULL);
    else if ((out = PyList_New((Py_ssize_t)a.n)) != NULL)
        for (size_t i = 0; i < a.n && out; i++) {
            PyObject *s = PyUnicode_FromString(a.v[i]);
            if (!s)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, (Py_ssize_t)i, s);
        }
    for (size_t i = 0; i < a.n; i++)
        free(a.v[i]);
    free(a.v);
    return done(o, out);
}

/* read()'s sink: the rows read in place into the result, hashed a block
 * at a time as the protocol checks them, then the whole checked. */
typedef struct rsink {
    PyObject *bytes; /* the result, filled in place */
    unsigned char *buf;
    uint64_t size, at, checksum;
    uint32_t row_bytes;
    XXH3_state_t *xs;
} rsink;

static int rsink_begin(void *ud, const engram_table_spec *spec, uint64_t checksum)
{
    rsink *k = ud;
    k->size = spec->num_rows * spec->row_bytes;
    k->row_bytes = spec->row_bytes;
    k->checksum = checksum;
    if (k->size <= PY_SSIZE_T_MAX) {
        PyGILState_STATE g = PyGILState_Ensure();
        k->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)k->size);
        PyErr_Clear();
        PyGILState_Release(g);
    }
    if (!k->bytes)
        return engram__err(-ENOMEM, "out of memory for a table of %llu bytes",
                           (unsigned long long)k->size);
    k->buf = (unsigned char *)PyBytes_AS_STRING(k->bytes);
    if (!(k->xs = XXH3_createState()))
        return engram__err(-ENOMEM, "out of memory");
    XXH3_64bits_reset(k->xs);
    return 0;
}

static unsigned char *rsink_region(void *ud)
{
    return ((rsink *)ud)->buf;
}

static int rsink_rows(void *ud, const void *rows, uint64_t n)
{
    rsink *k = ud;
    uint64_t len = n * k->row_bytes;
    if (len > k->size - k->at || (const unsigned char *)rows != k->buf + k->at)
        return engram__err(-EIO, "rows out of their order, or more than the manifest says");
    XXH3_64bits_update(k->xs, rows, (size_t)len);
    k->at += len;
    return 0;
}

PyDoc_STRVAR(read_doc,
"read($self, name, /)\n--\n\n"
"The rows of table `name` as bytes, every chunk checked against the\n"
"manifest, and the whole against its checksum.");

static PyObject *Pub_read(PubObject *o, PyObject *args)
{
    const char *name;
    rsink k = {NULL, NULL, 0, 0, 0, 0, NULL};
    engram__remote_sink sink = {rsink_begin, rsink_rows, NULL, &k, rsink_region};
    PyObject *out = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "s:read", &name))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram__pub_read_all(&o->pub, name, &sink);
    if (rc == 0 && (k.at != k.size || XXH3_64bits_digest(k.xs) != k.checksum))
        rc = engram__err(ENGRAM_ECHECKSUM, "table '%s' in %s: the rows read do not match the "
                                           "manifest's checksum",
                         name, o->where);
    XXH3_freeState(k.xs);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        Py_CLEAR(k.bytes);
        ext_raise(rc, NULL);
    }
    out = k.bytes;
    return done(o, out);
}

/* read_into()'s sink: each batch of rows, every chunk of it checked by
 * the protocol, to the caller's function (on the protocol's consumer
 * thread, with the GIL taken), as a read-only memoryview released when it
 * returns; or, for a pull's append(), to its writer (no Python called),
 * read in place into its table file where the writer can take them so.
 * The whole is not hashed again here: the pull's writer hashes what the
 * file holds (_pull_rows(checksum=)). */
typedef struct isink {
    PyObject *rows, *progress;
    PyObject *exc; /* what rows or progress raised (the first) */
    uint64_t expect, size, want_rows;
    uint32_t want_row_bytes;
    const char *name, *where;
    uint64_t at;   /* bytes handed to rows (the consumer thread's) */
    uint64_t read; /* bytes read (the calling thread's, for progress) */
    uint32_t row_bytes;
    PyObject *buf; /* the rows handed to rows() */
    /* rows is a pull's append(): its writer, lent for the call (the rows
     * are appended to it here, no Python called) */
    ext_pull_loan *loan;
    engram_writer *w;
} isink;

static int isink_raised(isink *k)
{
    PyObject *e = ext_take_raised();
    if (!k->exc)
        k->exc = e;
    else
        Py_XDECREF(e);
    return -ECANCELED;
}

static int isink_begin(void *ud, const engram_table_spec *spec, uint64_t checksum)
{
    isink *k = ud;
    if (checksum != k->expect || spec->num_rows != k->want_rows ||
        spec->row_bytes != k->want_row_bytes)
        return engram__err(-EAGAIN, "table '%s' in %s changed since its manifest was read: "
                                    "%llu rows of %u bytes, checksum %016llx, not %llu of %u, "
                                    "%016llx",
                           k->name, k->where, (unsigned long long)spec->num_rows,
                           spec->row_bytes, (unsigned long long)checksum,
                           (unsigned long long)k->want_rows, k->want_row_bytes,
                           (unsigned long long)k->expect);
    k->size = spec->num_rows * spec->row_bytes;
    k->row_bytes = spec->row_bytes;
    return 0;
}

/* A pull's rows go straight into its table file where they can. */
static unsigned char *isink_region(void *ud)
{
    isink *k = ud;
    return k->w ? engram__writer_region(k->w, k->size) : NULL;
}

static int isink_rows(void *ud, const void *rows, uint64_t n)
{
    isink *k = ud;
    uint64_t len = n * k->row_bytes;
    PyGILState_STATE g;
    PyObject *mv = NULL, *v = NULL, *res = NULL;
    int rc = 0;
    if (len > k->size - k->at)
        return engram__err(-EIO, "more rows than the manifest says");
    k->at += len;
    if (k->w) {
        if (ext_pull_recalled(k->loan))
            return engram__err(-ECANCELED, "table '%s' in %s: the pull's fill() returned while "
                                           "it was read into the pulled table; read stopped",
                               k->name, k->where);
        return engram_writer_append(k->w, rows, n, 0);
    }
    g = PyGILState_Ensure();
    /* The rows go in a bytearray of this sink's (reused while nothing
     * kept it), not as a view of the protocol's buffer, which is reused
     * and freed: a view kept past the call (a slice, an array made from
     * it) then holds memory of its own. */
    if (!k->buf || Py_REFCNT(k->buf) != 1 || (uint64_t)PyByteArray_GET_SIZE(k->buf) < len) {
        Py_CLEAR(k->buf);
        k->buf = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)len);
    }
    if (k->buf) {
        memcpy(PyByteArray_AS_STRING(k->buf), rows, len);
        mv = PyMemoryView_FromObject(k->buf);
    }
    if (mv) {
        PyObject *part = PySequence_GetSlice(mv, 0, (Py_ssize_t)len);
        PyObject *sh = Py_BuildValue("(KI)", (unsigned long long)n, k->row_bytes);
        PyObject *w = part && sh ? PyObject_CallMethod(part, "cast", "sO", "B", sh) : NULL;
        v = w ? PyObject_CallMethod(w, "toreadonly", NULL) : NULL;
        Py_XDECREF(w);
        Py_XDECREF(sh);
        Py_XDECREF(part);
    }
    if (v)
        res = PyObject_CallOneArg(k->rows, v);
    if (!res)
        rc = isink_raised(k);
    Py_XDECREF(res);
    Py_XDECREF(v);
    Py_XDECREF(mv);
    PyGILState_Release(g);
    return rc;
}

static int isink_read(void *ud, uint64_t n)
{
    isink *k = ud;
    PyGILState_STATE g;
    PyObject *res;
    int rc = 0;
    k->read += n * k->row_bytes;
    if (k->progress == Py_None)
        return 0;
    g = PyGILState_Ensure();
    res = PyObject_CallFunction(k->progress, "KK", (unsigned long long)k->read,
                                (unsigned long long)k->size);
    if (!res)
        rc = isink_raised(k);
    Py_XDECREF(res);
    PyGILState_Release(g);
    return rc;
}

PyDoc_STRVAR(read_into_doc,
"read_into($self, name, rows, num_rows, row_bytes, checksum, progress=None)\n"
"--\n\n"
"Streams table `name`: rows(view) is called with each batch of rows in\n"
"order (a read-only memoryview of [n, row_bytes] of a buffer of its own),\n"
"each chunk checked against the manifest's XXH3-64 of it before it goes;\n"
"the manifest must say num_rows, row_bytes and checksum (as read before:\n"
"EngramError with errno EAGAIN if it says otherwise now).  The whole is\n"
"not hashed: the caller does that where it writes the rows.  rows may be\n"
"the append() that _pull_rows() gives its fill(): it is not called then,\n"
"the rows go to its table file here (a tmpfs's read in place, into the\n"
"file itself, each block hashed there once).  progress(done_bytes,\n"
"total_bytes), if given, after each batch is read, on this thread.  What\n"
"rows or progress raise stops the read and is raised here.");

static PyObject *Pub_read_into(PubObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "rows", "num_rows", "row_bytes", "checksum", "progress",
                             NULL};
    const char *name;
    unsigned long long want_rows;
    unsigned int want_rb;
    isink k = {NULL, Py_None, NULL, 0, 0, 0, 0, NULL, NULL, 0, 0, 0, NULL, NULL, NULL};
    engram__remote_sink sink = {isink_begin, isink_rows, isink_read, &k, isink_region};
    unsigned long long expect;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOKIK|O:read_into", kwlist, &name, &k.rows,
                                     &want_rows, &want_rb, &expect, &k.progress))
        return NULL;
    k.want_rows = want_rows;
    k.want_row_bytes = want_rb;
    k.name = name;
    k.where = o->where;
    if (!PyCallable_Check(k.rows) || (k.progress != Py_None && !PyCallable_Check(k.progress)))
        return PyErr_Format(PyExc_TypeError, "rows and progress: expected callables");
    k.expect = expect;
    if (ext_pull_lend(k.rows, want_rows, want_rb, &k.loan) < 0)
        return NULL;
    k.w = k.loan ? ext_pull_writer(k.loan) : NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram__pub_read_all(&o->pub, name, &sink);
    if (rc == 0 && k.at != k.size)
        rc = engram__err(-EIO, "table '%s' in %s: %llu bytes read of its %llu", name, o->where,
                         (unsigned long long)k.at, (unsigned long long)k.size);
    Py_END_ALLOW_THREADS
    if (k.loan)
        ext_pull_return(k.loan);
    Py_CLEAR(k.buf);
    if (k.exc) {
        if (o->itype) { /* an interrupt of the kv's goes first */
            Py_DECREF(k.exc);
            return done(o, NULL);
        }
        ext_raise_taken(k.exc);
        return NULL;
    }
    if (rc != 0)
        return done(o, ext_raise(rc, NULL));
    return done(o, Py_NewRef(Py_None));
}

const char ext_xxh3_64_doc[] = PyDoc_STR(
"_xxh3_64($module, buf, /)\n--\n\n"
"XXH3-64 of a contiguous buffer's bytes (a published table's checksum),\n"
"the GIL released.");

PyObject *ext_xxh3_64(PyObject *mod, PyObject *buf)
{
    Py_buffer view;
    uint64_t h;
    (void)mod;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    h = XXH3_64bits(view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef Pub_methods[] = {
    {"push", (PyCFunction)Pub_push, METH_VARARGS, push_doc},
    {"remove", (PyCFunction)Pub_remove, METH_VARARGS, remove_doc},
    {"gc", (PyCFunction)(void (*)(void))Pub_gc, METH_VARARGS | METH_KEYWORDS, gc_doc},
    {"manifest", (PyCFunction)Pub_manifest, METH_VARARGS, manifest_doc},
    {"list", (PyCFunction)Pub_list, METH_NOARGS, list_doc},
    {"read", (PyCFunction)Pub_read, METH_VARARGS, read_doc},
    {"read_into", (PyCFunction)(void (*)(void))Pub_read_into, METH_VARARGS | METH_KEYWORDS,
     read_into_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Pub_doc,
"_Publication(kv, where, chunk_bytes, ttl_ms, layout=0, direct=False)\n--\n\n"
"The library's publication protocol over a key-value store written in\n"
"Python (kv: an object with kv.h's operations as methods).  direct: the\n"
"kv's get_ranges() keeps no view of its `out` past the call (one kept\n"
"fails the read, and would point at memory the protocol reuses), so `out`\n"
"is a view of the protocol's own buffer, not a bytearray copied out after.");

static PyType_Slot Pub_slots[] = {
    {Py_tp_new, Pub_new},
    {Py_tp_dealloc, Pub_dealloc},
    {Py_tp_traverse, Pub_traverse},
    {Py_tp_clear, Pub_clear},
    {Py_tp_methods, Pub_methods},
    {Py_tp_doc, (void *)(uintptr_t)Pub_doc},
    {0, NULL},
};

static PyType_Spec Pub_spec = {
    .name = "engramstore._engram._Publication",
    .basicsize = sizeof(PubObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Pub_slots,
};

int ext_publication_init(PyObject *m)
{
    PyObject *t;
    if (!dst_type && !(dst_type = (PyTypeObject *)PyType_FromSpec(&Dst_spec)))
        return -1;
    t = PyType_FromSpec(&Pub_spec);
    if (!t)
        return -1;
    if (PyModule_AddObjectRef(m, "_Publication", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    Py_DECREF(t);
    return 0;
}
