/*
 * pystore_source.c - Store._add_source(): a table served by a Python callable
 * through the library's source API (engram_add_source).  The package's
 * TableStore.add_source() wraps it, handing the callable numpy arrays.
 *
 * The lookup that needs rows of such a table runs without the GIL; the
 * library calls read_rows() below on the same thread with the distinct
 * rows it needs, and only there is the GIL taken, for the callable:
 *
 *     read_rows(rows, out)
 *
 * (or read_rows(rows, out, tables) for the tables of a group made by
 * _source_group(): they share one ctx, so a lookup reads all of their rows
 * in one call; tables gives each row's table by its index in the group)
 *
 * rows is a memoryview of uint64 row numbers ('Q', [n]) and out a writable
 * memoryview of bytes ('B', [n, row_bytes]) for the callable to fill; both
 * are views of bytearrays owned by Python, so a callable that keeps them
 * keeps valid memory, and the rows are copied to the lookup's output only
 * after it returned.  The callable must fill every row of out and return
 * None (or out itself).  An exception fails the lookup with -EIO (nothing
 * of the call is kept or cached); the lookup then raises an EngramError
 * whose __cause__ is that exception.  Any other return value fails it the
 * same way, with a TypeError, and so does a row left unwritten, with a
 * ValueError naming it (found as call_fn() says).
 *
 * out's bytearray stays exported to call_fn() itself for the whole call:
 * a callable that reaches the bytearray (out.obj) and releases every view
 * of it still cannot resize or free it (BufferError), so the copy after
 * the call reads the n * row_bytes bytes the callable was handed.
 *
 * Inside the callable the store is in use by the lookup that called it:
 * close() there raises StateError instead of waiting for its own thread,
 * and a lookup there fails with StateError (ENGRAM_ESTATE).
 */
#include "pystore.h"

#include <errno.h>
#include <string.h>

typedef struct pysource {
    PyObject *fn;       /* the callable */
    PyObject *name;     /* str, for messages */
    uint32_t row_bytes;
    /* A group (_source_group()): the ctx of several tables, each with its
     * index in the group as table_ud, so a lookup reads all of their rows
     * in one call, read_rows(rows, out, tables).  Owned by the group's
     * capsule and by each table added with it (nref). */
    int grouped;
    uint32_t ntables;
    Py_ssize_t nref;
} pysource;

#define GROUP_CAPSULE "engramstore._engram.source_group"

/* The callable's exception of this thread's last failed call, for the
 * EngramError the lookup raises (ext_source_take_exception()). */
static _Thread_local PyObject *pending_exc;
/* Calls of a source callable running on this thread. */
static _Thread_local int depth;

int ext_source_active(void)
{
    return depth > 0;
}

PyObject *ext_source_take_exception(void)
{
    PyObject *e = pending_exc;
    pending_exc = NULL;
    return e;
}

/* A view of `buf` (a bytearray) as `fmt` with `shape`; NULL with an
 * exception. */
static PyObject *view_of(PyObject *buf, const char *fmt, PyObject *shape)
{
    PyObject *mv = PyMemoryView_FromObject(buf), *cast;
    if (!mv)
        return NULL;
    cast = PyObject_CallMethod(mv, "cast", "sO", fmt, shape);
    Py_DECREF(mv);
    return cast;
}

/* What out's rows start with, 8 bytes at a time from each row's start:
 * pattern[0] for the call, pattern[1] (its complement) for the second call
 * that asks again for the rows still holding pattern[0] whole (call_fn()).
 * No row can hold both, so a row holding pattern[1] after the second call
 * was not written. */
static const unsigned char pattern[2][8] = {
    {0xe5, 0x6e, 0x67, 0x72, 0x61, 0x6d, 0x00, 0x7f},
    {0x1a, 0x91, 0x98, 0x8d, 0x9e, 0x92, 0xff, 0x80},
};

/* Fills n rows of rb bytes at o with pat. */
static void fill_rows(unsigned char *o, size_t n, size_t rb, const unsigned char *pat)
{
    size_t have = rb < 8 ? rb : 8;
    if (n == 0)
        return;
    memcpy(o, pat, have);
    while (have < rb) { /* the first row, doubling what it holds */
        size_t m = have < rb - have ? have : rb - have;
        memcpy(o + have, o, m);
        have += m;
    }
    for (size_t i = 1; i < n; i++)
        memcpy(o + i * rb, o, rb);
}

/* Whether the rb bytes at r hold pat whole (pat repeated, from r). */
static int holds(const unsigned char *r, size_t rb, const unsigned char *pat)
{
    return memcmp(r, pat, rb < 8 ? rb : 8) == 0 && (rb <= 8 || memcmp(r + 8, r, rb - 8) == 0);
}

/* Set when call_fn() fails because the callable broke its contract (its
 * return value, a row left unwritten) rather than raised: read_rows()
 * then reports the exception's text as it is. */
static _Thread_local int contract_broken;

/* One call of the callable for n rows (row[i], of the group's table tab[i]
 * where grouped) into a fresh out filled with pat.  0 with *outp a new
 * reference to out's bytearray and *held our export of it (the rows at
 * held->buf), or -1 with an exception. */
static int call_pass(const pysource *ps, const uint64_t *row, const uint32_t *tab, size_t n,
                     const unsigned char *pat, PyObject **outp, Py_buffer *held)
{
    PyObject *rows = NULL, *out = NULL, *mrows = NULL, *mout = NULL, *shape = NULL, *res;
    PyObject *tabs = NULL, *mtabs = NULL;
    int rc = -1;
    held->obj = NULL;
    if (!(rows = PyByteArray_FromStringAndSize((const char *)row,
                                               (Py_ssize_t)(n * sizeof(uint64_t)))) ||
        !(out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(n * ps->row_bytes))))
        goto out;
    /* Our own export of out, held until the caller copied the rows: the
     * views handed to the callable can be released (out.release()), and a
     * bytearray no view exports can be shrunk or freed under the copy
     * (del out.obj[:]).  With this one it cannot: the resize raises
     * BufferError in the callable. */
    if (PyObject_GetBuffer(out, held, PyBUF_SIMPLE) < 0)
        goto out; /* held->obj is NULL */
    /* A fresh bytearray holds whatever the allocator had: never hand back
     * old heap bytes.  The pattern is how a row left unwritten is found. */
    fill_rows(held->buf, n, ps->row_bytes, pat);
    if (!(shape = Py_BuildValue("(n)", (Py_ssize_t)n)) ||
        !(mrows = view_of(rows, "Q", shape)))
        goto out;
    if (ps->grouped) {
        if (!(tabs = PyByteArray_FromStringAndSize((const char *)tab,
                                                   (Py_ssize_t)(n * sizeof(uint32_t)))) ||
            !(mtabs = view_of(tabs, "I", shape)))
            goto out;
    }
    Py_SETREF(shape, Py_BuildValue("(nn)", (Py_ssize_t)n, (Py_ssize_t)ps->row_bytes));
    if (!shape || !(mout = view_of(out, "B", shape)))
        goto out;
    if (!(res = PyObject_CallFunctionObjArgs(ps->fn, mrows, mout, mtabs, NULL)))
        goto out;
    /* None (or out itself, as numpy's out= functions return it) says every
     * row is written; anything else is a callable that meant something
     * else (the rows returned instead of written, a count, False). */
    if (res != Py_None && res != mout) {
        PyErr_Format(PyExc_TypeError,
                     "read_rows returned %.100s: it must fill out and return None",
                     Py_TYPE(res)->tp_name);
        contract_broken = 1;
        Py_DECREF(res);
        goto out;
    }
    Py_DECREF(res);
    *outp = Py_NewRef(out);
    rc = 0;
out:
    if (rc < 0 && held->obj)
        PyBuffer_Release(held);
    Py_XDECREF(shape);
    Py_XDECREF(mtabs);
    Py_XDECREF(tabs);
    Py_XDECREF(mrows);
    Py_XDECREF(mout);
    Py_XDECREF(rows);
    Py_XDECREF(out);
    return rc;
}

/* Runs the callable with the GIL held; 0, or -1 with an exception.
 *
 * A row the callable leaves unwritten must fail the lookup, not be served
 * (and cached) as whatever out started with; but no content tells such a
 * row apart from a row written with the same bytes.  So out starts filled
 * with pattern[0], and the rows that still hold it whole after the call
 * (rows left unwritten, or rows that are pattern[0], which no real table
 * is likely to hold) are asked for again, in a second call, into an out
 * filled with pattern[1]: a row holding that whole was not written. */
static int call_fn(const pysource *ps, engram_source_req *reqs, size_t n)
{
    PyObject *out1 = NULL, *out2 = NULL;
    Py_buffer h1, h2;
    uint64_t *row = NULL;
    uint32_t *tab = NULL;
    size_t *again = NULL, nagain = 0, rb = ps->row_bytes;
    int rc = -1;
    h1.obj = h2.obj = NULL;
    contract_broken = 0;
    if (!(row = PyMem_Malloc((n ? n : 1) * sizeof *row)) ||
        (ps->grouped && !(tab = PyMem_Malloc((n ? n : 1) * sizeof *tab)))) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        row[i] = reqs[i].row;
        if (tab)
            tab[i] = (uint32_t)(uintptr_t)reqs[i].table_ud;
    }
    if (call_pass(ps, row, tab, n, pattern[0], &out1, &h1) < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        if (!holds((const unsigned char *)h1.buf + i * rb, rb, pattern[0]))
            continue;
        if (!again && !(again = PyMem_Malloc(n * sizeof *again))) {
            PyErr_NoMemory();
            goto out;
        }
        /* row[] and tab[] are done with: they take the second call's. */
        again[nagain] = i;
        row[nagain] = reqs[i].row;
        if (tab)
            tab[nagain] = (uint32_t)(uintptr_t)reqs[i].table_ud;
        nagain++;
    }
    if (nagain) {
        if (call_pass(ps, row, tab, nagain, pattern[1], &out2, &h2) < 0)
            goto out;
        for (size_t j = 0; j < nagain; j++) {
            if (!holds((const unsigned char *)h2.buf + j * rb, rb, pattern[1]))
                continue;
            if (tab)
                PyErr_Format(PyExc_ValueError,
                             "read_rows left row %llu (of table %u of the group) unwritten: it "
                             "must fill every row of out (a source that cannot serve a row "
                             "must raise)", (unsigned long long)row[j], (unsigned)tab[j]);
            else
                PyErr_Format(PyExc_ValueError,
                             "read_rows left row %llu unwritten: it must fill every row of out "
                             "(a source that cannot serve a row must raise)",
                             (unsigned long long)row[j]);
            contract_broken = 1;
            goto out;
        }
    }
    for (size_t i = 0, j = 0; i < n; i++) {
        const unsigned char *src = (const unsigned char *)h1.buf + i * rb;
        if (j < nagain && again[j] == i)
            src = (const unsigned char *)h2.buf + j++ * rb;
        memcpy(reqs[i].dst, src, rb);
    }
    rc = 0;
out:
    if (h2.obj)
        PyBuffer_Release(&h2);
    if (h1.obj)
        PyBuffer_Release(&h1);
    Py_XDECREF(out2);
    Py_XDECREF(out1);
    PyMem_Free(again);
    PyMem_Free(tab);
    PyMem_Free(row);
    return rc;
}

static int read_rows(void *ctx, engram_source_req *reqs, size_t n)
{
    const pysource *ps = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = 0;
    depth++;
    if (call_fn(ps, reqs, n) < 0) {
        PyObject *exc = ext_take_raised(), *text = exc ? PyObject_Str(exc) : NULL;
        const char *ctext = text ? PyUnicode_AsUTF8(text) : NULL;
        if (!ctext)
            PyErr_Clear();
        if (contract_broken)
            rc = engram_source_error(-EIO, "%s", ctext ? ctext : "read_rows broke its contract");
        else
            rc = engram_source_error(-EIO, "read_rows raised %s: %s",
                                     exc ? Py_TYPE(exc)->tp_name : "an exception",
                                     ctext ? ctext : "(no message)");
        Py_XDECREF(text);
        Py_XSETREF(pending_exc, exc);
    }
    depth--;
    PyGILState_Release(g);
    return rc;
}

/* Drops one reference to ps (with the GIL). */
static void pysource_unref(pysource *ps)
{
    if (--ps->nref > 0)
        return;
    Py_DECREF(ps->fn);
    Py_DECREF(ps->name);
    PyMem_RawFree(ps);
}

static void release(void *ctx, void *table_ud)
{
    PyGILState_STATE g;
    (void)table_ud;
    /* engram_store_close() may run with the GIL released (close()) or held
     * (dealloc): Ensure works in both. */
    g = PyGILState_Ensure();
    pysource_unref(ctx);
    PyGILState_Release(g);
}

static void group_capsule_free(PyObject *cap)
{
    pysource *ps = PyCapsule_GetPointer(cap, GROUP_CAPSULE);
    if (ps)
        pysource_unref(ps);
    else
        PyErr_Clear();
}

const char ext_source_group_doc[] = PyDoc_STR(
"_source_group($module, read_rows, row_bytes, /)\n--\n\n"
"A group of source tables of row_bytes-byte rows served by one callable:\n"
"pass it as _add_source's read_rows.  A lookup then reads the rows of all\n"
"the group's tables in one call, read_rows(rows, out, tables), where\n"
"tables ('I', [n]) gives each row's table as its index in the group (the\n"
"value _add_source returned for it).");

PyObject *ext_source_group(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    pysource *ps;
    unsigned long long rbytes;
    PyObject *cap;
    (void)mod;
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "_source_group() takes 2 arguments (%zd given)",
                            nargs);
    if (!PyCallable_Check(args[0]))
        return PyErr_Format(PyExc_TypeError, "read_rows: expected a callable, got %.100s",
                            Py_TYPE(args[0])->tp_name);
    if ((rbytes = PyLong_AsUnsignedLongLong(args[1])) == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (rbytes == 0 || rbytes > ENGRAM_ROW_BYTES_MAX)
        return PyErr_Format(PyExc_ValueError, "row_bytes: 1 to %u, got %llu",
                            ENGRAM_ROW_BYTES_MAX, rbytes);
    if (!(ps = PyMem_RawMalloc(sizeof *ps)))
        return PyErr_NoMemory();
    ps->fn = Py_NewRef(args[0]);
    if (!(ps->name = PyUnicode_FromString("group"))) {
        Py_DECREF(ps->fn);
        PyMem_RawFree(ps);
        return NULL;
    }
    ps->row_bytes = (uint32_t)rbytes;
    ps->grouped = 1;
    ps->ntables = 0;
    ps->nref = 1; /* the capsule's */
    if (!(cap = PyCapsule_New(ps, GROUP_CAPSULE, group_capsule_free)))
        pysource_unref(ps);
    return cap;
}

const char ext_store_add_source_doc[] = PyDoc_STR(
"_add_source($self, name, num_rows, row_bytes, read_rows, cache_bytes=0)\n--\n\n"
"Adds table `name` of num_rows rows of row_bytes bytes, served by the\n"
"callable read_rows(rows, out): rows is a memoryview of uint64 row numbers\n"
"(distinct, validated), out a writable memoryview of bytes [len(rows),\n"
"row_bytes] to fill with them, every row, before it returns None (or out\n"
"itself; anything else fails the lookup, with a TypeError as the cause, and\n"
"so does a row left unwritten, with a ValueError).\n"
"It runs on the thread that looks up, with the GIL; an exception fails that\n"
"lookup (EngramError, with the exception as __cause__).  cache_bytes > 0\n"
"puts a row cache of that size, from the store's budget, in front of it.\n"
"The table lives until close().\n"
"read_rows may also be a group of _source_group(): the table then joins it\n"
"(its row_bytes must be the group's), and its index in the group is\n"
"returned.");

PyObject *ext_store_add_source(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    static const char *const names[] = {"name", "num_rows", "row_bytes", "read_rows",
                                        "cache_bytes"};
    PyObject *v[5];
    engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
    engram_table_spec spec = {0, 0, 0};
    unsigned long long nrows, rbytes, cache = 0;
    const char *cname;
    pysource *ps, *group = NULL;
    int rc;
    if (ext_store_parse_args("_add_source", args, nargs, kwnames, names, 5, 5, 4, v) < 0)
        return NULL;
    if (!(cname = ext_str_arg(v[0], "name")))
        return NULL;
    if (PyCapsule_IsValid(v[3], GROUP_CAPSULE))
        group = PyCapsule_GetPointer(v[3], GROUP_CAPSULE);
    else if (!PyCallable_Check(v[3]))
        return PyErr_Format(PyExc_TypeError, "read_rows: expected a callable, got %.100s",
                            Py_TYPE(v[3])->tp_name);
    if (((nrows = PyLong_AsUnsignedLongLong(v[1])) == (unsigned long long)-1 && PyErr_Occurred()) ||
        ((rbytes = PyLong_AsUnsignedLongLong(v[2])) == (unsigned long long)-1 && PyErr_Occurred()) ||
        (v[4] && ext_uint_arg(v[4], "cache_bytes", UINT64_MAX, NULL, &cache) < 0))
        return NULL;
    if (rbytes > ENGRAM_ROW_BYTES_MAX)
        return PyErr_Format(PyExc_ValueError, "row_bytes: at most %u, got %llu",
                            ENGRAM_ROW_BYTES_MAX, rbytes);
    spec.num_rows = nrows;
    spec.row_bytes = (uint32_t)rbytes;
    if (group) {
        /* The group's ctx: one read_rows call per lookup for all its tables. */
        if (group->row_bytes != spec.row_bytes)
            return PyErr_Format(PyExc_ValueError,
                                "row_bytes: the group's tables have rows of %u bytes, got %llu",
                                group->row_bytes, rbytes);
        if (group->ntables == UINT32_MAX)
            return PyErr_Format(PyExc_ValueError, "read_rows: the group is full");
        ps = group;
        ps->nref++;
    } else {
        if (!(ps = PyMem_RawMalloc(sizeof *ps)))
            return PyErr_NoMemory();
        ps->fn = Py_NewRef(v[3]);
        ps->name = Py_NewRef(v[0]);
        ps->row_bytes = (uint32_t)rbytes;
        ps->grouped = 0;
        ps->ntables = 0;
        ps->nref = 1;
    }
    /* One ctx per table (the callable gets the rows of its table only), or
     * the group's, with the table's index in it as table_ud. */
    ops.ctx = ps;
    ops.read_rows = read_rows;
    ops.release = release;
    if (ext_store_enter(s) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_add_source(s->st, cname, &spec, &ops, (void *)(uintptr_t)ps->ntables, cache,
                           NULL);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ext_raise(rc, NULL);
        goto fail;
    }
    if (group)
        return PyLong_FromUnsignedLong(group->ntables++);
    Py_RETURN_NONE;
fail:
    pysource_unref(ps);
    return NULL;
}
