/*
 * pystore_tables.c - the Store's tables: resolving names to table ids for
 * lookups, declaring (define), storing (populate), binding caller memory
 * (bind) and safetensors checkpoints (open_safetensors), sharing tables
 * between processes (populate_shared, wait_for), and the queries
 * get_table_spec, list_tables, remove and verify; pull (a Redis Cluster's
 * table) and _pull_rows (a table Python code reads: a Mooncake Store's).
 */
#include "pystore.h"

#include "common.h"
#include "nsdir.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

/* ---- names, specs and resolution ----------------------------------------- */

static const char *name_arg(PyObject *name, const char *arg)
{
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a table name (str), got %.100s", arg,
                     Py_TYPE(name)->tp_name);
        return NULL;
    }
    return ext_utf8_arg(name, arg);
}

static PyObject *spec_tuple(const engram_table_spec *sp)
{
    return Py_BuildValue("(KII)", (unsigned long long)sp->num_rows, sp->row_bytes,
                         sp->row_pitch ? sp->row_pitch : sp->row_bytes);
}

static int spec_from_tuple(PyObject *t, engram_table_spec *sp)
{
    unsigned long long n;
    unsigned int r, p;
    if (!PyArg_ParseTuple(t, "KII", &n, &r, &p))
        return -1;
    sp->num_rows = n;
    sp->row_bytes = r;
    sp->row_pitch = p;
    return 0;
}

/* A new reference to `name` (a str, checked by name_arg) as an exact str:
 * the key of the tables and declared dicts. */
static PyObject *name_key(PyObject *name)
{
    return PyUnicode_CheckExact(name) ? Py_NewRef(name) : PyUnicode_FromObject(name);
}

/* Declared spec of `name` (a str), if any: 1 and *sp, 0 if none, -1 on
 * error. */
static int declared_spec(StoreObject *s, PyObject *name, engram_table_spec *sp)
{
    PyObject *key = name_key(name), *t;
    int r;
    if (!key)
        return -1;
    t = PyDict_GetItemWithError(s->declared, key);
    if (!t)
        r = PyErr_Occurred() ? -1 : 0;
    else
        r = spec_from_tuple(t, sp) < 0 ? -1 : 1;
    Py_DECREF(key);
    return r;
}

/* 1 if a stored/bound table has the declared spec (a declared pitch of 0
 * or equal to row_bytes accepts any stored pitch). */
static int spec_matches(const engram_table_spec *decl, const engram_table_spec *have)
{
    uint32_t dp = decl->row_pitch;
    return decl->num_rows == have->num_rows && decl->row_bytes == have->row_bytes &&
           (dp == 0 || dp == decl->row_bytes || dp == have->row_pitch);
}

static PyObject *mismatch(PyObject *name, const engram_table_spec *decl,
                          const engram_table_spec *have)
{
    return ext_raise_cls(ext_exc_for(ENGRAM_EMISMATCH), ENGRAM_EMISMATCH,
                         "table '%U' is stored with num_rows=%llu, row_bytes=%u, row_pitch=%u "
                         "but declared with num_rows=%llu, row_bytes=%u, row_pitch=%u",
                         name, (unsigned long long)have->num_rows, have->row_bytes,
                         have->row_pitch, (unsigned long long)decl->num_rows, decl->row_bytes,
                         decl->row_pitch ? decl->row_pitch : decl->row_bytes);
}

int ext_store_table_info(StoreObject *s, const char *cname, engram_table_info *info)
{
    int rc;
    info->size = sizeof *info;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_get_table_info(s->st, cname, info);
    Py_END_ALLOW_THREADS
    return rc;
}

/* The caches are keyed by exact str copies of the names, so that probing
 * them runs no Python code (a str subclass's __hash__ or __eq__) and every
 * spelling of a name hits one entry. */
/* The resolution cached per name: id | row_bytes << 32 | memory << 62. */
#define RESOLVED_MEMORY (1ull << 62)

static void resolved_from(unsigned long long x, engram_table_id *id, uint32_t *row_bytes,
                          int *memory)
{
    *id = (engram_table_id)(x & 0xffffffffu);
    *row_bytes = (uint32_t)((x >> 32) & 0x3fffffffu);
    *memory = (x & RESOLVED_MEMORY) != 0;
}

int ext_store_resolve(StoreObject *s, PyObject *name, engram_table_id *id, uint32_t *row_bytes,
                      int *memory, Py_ssize_t k)
{
    PyObject *key, *v;
    engram_table_spec spec, decl;
    const char *cname;
    char what[48];
    uint64_t gen;
    int rc, d;

    if (PyUnicode_CheckExact(name)) {
        v = PyDict_GetItemWithError(s->tables, name);
        if (v) {
            resolved_from(PyLong_AsUnsignedLongLong(v), id, row_bytes, memory);
            return 0;
        }
        if (PyErr_Occurred())
            return -1;
    }
    PyOS_snprintf(what, sizeof what, "tables[%zd]", k);
    if (!(cname = name_arg(name, what)) || !(key = name_key(name)))
        return -1;
    if (key != name) {
        v = PyDict_GetItemWithError(s->tables, key);
        if (v) {
            resolved_from(PyLong_AsUnsignedLongLong(v), id, row_bytes, memory);
            Py_DECREF(key);
            return 0;
        }
        if (PyErr_Occurred())
            goto fail;
    }
    if (ext_store_enter(s) < 0)
        goto fail;
    gen = s->gen;
    /* The spec and whether the rows are memory (engram_table_memory()
     * fills the spec either way), not engram_get_table_info(), which reads
     * /proc/self/smaps for memory tables: milliseconds per name. */
    Py_BEGIN_ALLOW_THREADS
    rc = engram_table_open(s->st, cname, id);
    if (rc == 0) {
        rc = engram_table_memory(s->st, *id, NULL, &spec);
        *memory = rc == 0;
        if (rc == -ENOTSUP)
            rc = 0;
    }
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ext_raise(rc, what);
        goto fail;
    }
    if ((d = declared_spec(s, key, &decl)) < 0)
        goto fail;
    if (d && !spec_matches(&decl, &spec)) {
        mismatch(key, &decl, &spec);
        goto fail;
    }
    *row_bytes = spec.row_bytes;
    v = PyLong_FromUnsignedLongLong((unsigned long long)*id |
                                    ((unsigned long long)*row_bytes << 32) |
                                    (*memory ? RESOLVED_MEMORY : 0));
    if (!v)
        goto fail;
    /* Cache the id unless remove() or close() ran while the GIL was
     * released (the name may be gone: resolve it afresh next time). */
    if (s->gen == gen && PyDict_SetItem(s->tables, key, v) < 0) {
        Py_DECREF(v);
        goto fail;
    }
    Py_DECREF(v);
    Py_DECREF(key);
    return 0;
fail:
    Py_DECREF(key);
    return -1;
}

/* ---- rows for populate and bind ----------------------------------------- */

/* Checks `a` is uint8 [N, R] with contiguous row bytes and a row stride of
 * at least R; fills *sp (pitch = the row stride) from it. */
static int rows_layout(const ext_array *a, const char *arg, engram_table_spec *sp)
{
    char b[64];
    if (a->kind != EXT_KIND_UINT || a->itemsize != 1) {
        PyErr_Format(PyExc_TypeError, "%s: expected uint8, got %s", arg,
                     ext_array_dtype(a, b, sizeof b));
        return -1;
    }
    if (a->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "%s: expected a 2-D array [num_rows, row_bytes], got shape %s",
                     arg, ext_array_shape(a, b, sizeof b));
        return -1;
    }
    if ((a->shape[1] > 1 && a->strides[1] != 1) ||
        (a->shape[0] > 1 && a->strides[0] < a->shape[1])) {
        PyErr_Format(PyExc_ValueError,
                     "%s: rows must be stored one after another with their bytes contiguous "
                     "(strides (>= row_bytes, 1)), got strides (%zd, %zd)",
                     arg, a->strides[0], a->strides[1]);
        return -1;
    }
    if (a->shape[0] < 1 || a->shape[1] < 1 || a->shape[1] > (Py_ssize_t)ENGRAM_ROW_BYTES_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: shape %s is not a table (1 <= row_bytes <= %u, "
                     "num_rows >= 1)", arg, ext_array_shape(a, b, sizeof b),
                     (unsigned)ENGRAM_ROW_BYTES_MAX);
        return -1;
    }
    sp->num_rows = (uint64_t)a->shape[0];
    sp->row_bytes = (uint32_t)a->shape[1];
    sp->row_pitch = a->shape[0] > 1 ? (uint32_t)a->strides[0] : sp->row_bytes;
    if (a->shape[0] > 1 && a->strides[0] > (Py_ssize_t)ENGRAM_ROW_BYTES_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: row stride %zd is more than %u", arg, a->strides[0],
                     (unsigned)ENGRAM_ROW_BYTES_MAX);
        return -1;
    }
    return 0;
}

/* A `timeout` argument in seconds (v: NULL if not given, None for no
 * limit) as the milliseconds of the C API: *ms gets `dflt` when it is not
 * given, -1 for None, else the seconds rounded up.  0, or -1 with
 * ValueError (negative, NaN) or TypeError. */
static int timeout_arg(PyObject *v, int dflt, int *ms)
{
    double t;
    if (!v) {
        *ms = dflt;
        return 0;
    }
    if (v == Py_None) {
        *ms = -1;
        return 0;
    }
    t = PyFloat_AsDouble(v);
    if (t == -1.0 && PyErr_Occurred())
        return -1;
    if (!(t >= 0.0)) {
        PyErr_Format(PyExc_ValueError, "timeout: expected seconds >= 0 or None, got %R", v);
        return -1;
    }
    *ms = t * 1000.0 >= (double)INT_MAX ? INT_MAX : (int)(t * 1000.0 + 0.999);
    return 0;
}

/* The (name, rows) arguments of populate() and bind() (and, where
 * `timeout` is not NULL, populate_shared()'s keyword timeout, NULL if not
 * given): parses them, takes the array into *a, checks it is a table
 * ([num_rows, row_bytes] uint8, rows one after another) agreeing with any
 * declared spec of the name.  *sp receives the array's layout (row_pitch =
 * its row stride) and *decl_pitch the declared pitch (0 if the name is not
 * declared).  0, or -1 with an exception and nothing held. */
static int take_rows(StoreObject *s, const char *fn, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames, PyObject **timeout, const char **cname, ext_array *a,
                     engram_table_spec *sp, uint32_t *decl_pitch)
{
    static const char *const names[] = {"name", "rows", "timeout"};
    PyObject *v[3];
    engram_table_spec decl;
    char b[64];
    int d;
    if (ext_store_parse_args(fn, args, nargs, kwnames, names, timeout ? 3 : 2, 2, 2, v) < 0 ||
        !(*cname = name_arg(v[0], "name")))
        return -1;
    if (timeout)
        *timeout = v[2];
    if (ext_array_get(v[1], "rows", 0, a) < 0)
        return -1;
    if (rows_layout(a, "rows", sp) < 0 || (d = declared_spec(s, v[0], &decl)) < 0)
        goto fail;
    if (d && (decl.num_rows != sp->num_rows || decl.row_bytes != sp->row_bytes)) {
        PyErr_Format(PyExc_ValueError, "rows: expected shape (%llu, %u) for table '%U', got %s",
                     (unsigned long long)decl.num_rows, decl.row_bytes, v[0],
                     ext_array_shape(a, b, sizeof b));
        goto fail;
    }
    *decl_pitch = d ? decl.row_pitch : 0;
    return 0;
fail:
    ext_array_release(a);
    return -1;
}

const char ext_store_populate_doc[] = PyDoc_STR(
"populate($self, name, rows)\n--\n\n"
"Stores rows (uint8 [num_rows, row_bytes], rows stored one after another) as\n"
"table `name`: create-only and atomic.  If the name was declared (tables= or\n"
"define()), the shape must match it; otherwise the shape is the spec.  Raises\n"
"TableExistsError if the name is already stored or bound.  The GIL is released\n"
"while the table is written.");

PyObject *ext_store_populate(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    ext_array a;
    engram_table_spec sp;
    const char *cname;
    uint32_t decl_pitch;
    size_t src_stride;
    int rc;
    if (take_rows(s, "populate", args, nargs, kwnames, NULL, &cname, &a, &sp, &decl_pitch) < 0)
        return NULL;
    /* The rows are read at their own stride and stored at the declared
     * pitch (or packed). */
    src_stride = sp.row_pitch;
    sp.row_pitch = decl_pitch;
    if (ext_store_enter(s) < 0) {
        ext_array_release(&a);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = engram_populate(s->st, cname, &sp, a.data, src_stride);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    ext_array_release(&a);
    if (rc < 0)
        return ext_raise(rc, NULL);
    Py_RETURN_NONE;
}

const char ext_store_populate_shared_doc[] = PyDoc_STR(
"populate_shared($self, name, rows, *, timeout=600.0)\n--\n\n"
"populate() for every process of a node at once, with no leader and no\n"
"barrier: exactly one of them writes the table and the others reuse it.  If\n"
"the table is published, it is compared with rows (spec and data checksum);\n"
"if another live process is writing it, this waits for that writer, for at\n"
"most `timeout` seconds (600, ten minutes, by default; None: no limit; 0: no\n"
"wait), and then compares; if that writer dies, this one writes it.  Returns\n"
"True if this call wrote the table (a bool), False if it reused it.  Raises\n"
"LayoutMismatchError if the published table has another shape or other rows,\n"
"EngramError with errno ETIMEDOUT if the other writer still holds the name\n"
"when the time is up (a writer that hangs: the message names its pid and\n"
"how long it has held the name).  The GIL is released.");

PyObject *ext_store_populate_shared(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    ext_array a;
    engram_table_spec sp;
    const char *cname;
    uint32_t decl_pitch;
    size_t src_stride;
    PyObject *timeout;
    int rc, ms, written = 0;
    if (take_rows(s, "populate_shared", args, nargs, kwnames, &timeout, &cname, &a, &sp,
                  &decl_pitch) < 0)
        return NULL;
    if (timeout_arg(timeout, ENGRAM_SHARED_WAIT_MS, &ms) < 0) {
        ext_array_release(&a);
        return NULL;
    }
    src_stride = sp.row_pitch;
    sp.row_pitch = decl_pitch;
    if (ext_store_enter(s) < 0) {
        ext_array_release(&a);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = engram_populate_shared_wait(s->st, cname, &sp, a.data, src_stride, ms, &written);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    ext_array_release(&a);
    if (rc < 0)
        return ext_raise(rc, NULL);
    return PyBool_FromLong(written);
}

const char ext_store_numa_copy_doc[] = PyDoc_STR(
"numa_copy($self, name, node)\n--\n\n"
"Writes `name`.numa<node> (e.g. 'engram:l1:h0.numa1'), a copy of stored table\n"
"`name` whose pages are on NUMA node `node`, in this namespace (a tmpfs such as\n"
"/dev/shm), with the table's rows and row range.  Every process of a node may\n"
"call it: one writes the copy, the others find it.  Returns True if this call\n"
"wrote it, False if it was there.  A store opened with numa_local=True serves\n"
"`name` from the copy on the node of the thread that first looks it up.\n"
"Raises ValueError (a bad node), TableNotFoundError, LayoutMismatchError (a\n"
"copy with other rows), EngramError with errno ENOTSUP (not a tmpfs, or a\n"
"library built without libnuma).  The GIL is released while copying.");

PyObject *ext_store_numa_copy(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    static const char *const names[] = {"name", "node"};
    PyObject *v[2];
    const char *cname;
    int node, rc, written = 0;
    if (ext_store_parse_args("numa_copy", args, nargs, kwnames, names, 2, 2, 2, v) < 0 ||
        !(cname = name_arg(v[0], "name")) || ext_numa_node_arg(v[1], "node", &node) < 0)
        return NULL;
    if (ext_store_enter(s) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_numa_copy(s->st, cname, node, &written);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc, NULL);
    return PyBool_FromLong(written);
}

const char ext_store_pull_doc[] = PyDoc_STR(
"pull($self, source, name)\n--\n\n"
"Copies table `name` of `source`, a store opened on a Redis Cluster\n"
"(EngramStore(..., redis=...)), into this store's namespace directory\n"
"(engram_pull()): read in pipelined batches from every master at once,\n"
"each chunk checked against the cluster's checksums and the whole table\n"
"before it is published, create-only and atomic (a failed or killed pull\n"
"leaves nothing).  Every process of a node may call it: one copies, the\n"
"others wait and find it.  Returns True if this call copied it, False if\n"
"it was here with the cluster's rows.  Raises TableNotFoundError,\n"
"LayoutMismatchError (another table of that name here), CorruptTableError or\n"
"EngramError with errno ENODATA (the cluster's data is damaged), EngramError\n"
"with errno EINVAL (`source` is not a cluster's store, or this store has no\n"
"directory).  The GIL is released while copying.");

/* pull() and check_origin(): (source, name) of a store opened on a Redis
 * Cluster, both stores entered (ext_store_enter()).  0, or -1 with the
 * exception set and neither entered. */
static int enter_with_source(StoreObject *s, const char *fn, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames, StoreObject **src,
                             const char **cname)
{
    static const char *const names[] = {"source", "name"};
    PyObject *v[2];
    if (ext_store_parse_args(fn, args, nargs, kwnames, names, 2, 2, 2, v) < 0 ||
        !(*cname = name_arg(v[1], "name")))
        return -1;
    if (!PyObject_TypeCheck(v[0], ext_store_type)) {
        PyErr_Format(PyExc_TypeError, "source: expected a store opened on a Redis Cluster, "
                                      "got %.100s",
                     Py_TYPE(v[0])->tp_name);
        return -1;
    }
    *src = (StoreObject *)v[0];
    if (ext_store_enter(s) < 0)
        return -1;
    if (*src != s && ext_store_enter(*src) < 0) {
        ext_store_leave(s);
        return -1;
    }
    return 0;
}

/* Leaves what enter_with_source() entered (without the GIL too). */
static void leave_with_source(StoreObject *s, StoreObject *src)
{
    if (src != s)
        ext_store_leave(src);
    ext_store_leave(s);
}

PyObject *ext_store_pull(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    StoreObject *src;
    const char *cname;
    int rc, written = 0;
    if (enter_with_source(s, "pull", args, nargs, kwnames, &src, &cname) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_pull(s->st, src->st, cname, NULL, NULL, &written);
    leave_with_source(s, src);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc, NULL);
    return PyBool_FromLong(written);
}

const char ext_store_check_origin_doc[] = PyDoc_STR(
"check_origin($self, source, name)\n--\n\n"
"Compares table `name` of this store, pulled with pull(), with the table of\n"
"that name in `source`, a store opened on the Redis Cluster namespace it came\n"
"from (engram_check_origin()).  Reads the cluster's manifest, not its rows\n"
"(verify() checks the local rows).  Returns 'current' (the same publication),\n"
"'republished' (published again with the same rows), 'changed' (other rows\n"
"under that name now: pull it again) or 'gone' (no such table there now).\n"
"Raises EngramError with errno EINVAL when the table records no origin or\n"
"`source` is not the namespace it came from, TableNotFoundError when there is\n"
"no such local table.  The GIL is released while reading.");

PyObject *ext_store_check_origin(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    static const char *const states[] = {"current", "republished", "changed", "gone"};
    StoreObject *src;
    const char *cname;
    int rc, state = 0;
    if (enter_with_source(s, "check_origin", args, nargs, kwnames, &src, &cname) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_check_origin(s->st, cname, src->st, &state);
    leave_with_source(s, src);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc, NULL);
    if (state < 0 || state > 3) {
        PyErr_Format(PyExc_SystemError, "engram_check_origin() gave state %d", state);
        return NULL;
    }
    return PyUnicode_FromString(states[state]);
}

/* ---- _pull_rows: engram_pull_rows() from Python functions --------------- */

/* One _pull_rows() call: the caller's fill and same, and what they raised. */
typedef struct pullrows {
    PyObject *fill, *same;
    PyObject *exc;     /* what fill or same raised (re-raised by _pull_rows) */
    uint64_t num_rows;
    uint32_t row_bytes;
    engram_writer *w;  /* while fill runs */
    /* An append() is writing (the GIL released), or the writer is lent to
     * a read_into() (ext_pull_lend()); changed with the GIL held. */
    int busy;
    /* fill() returned while the writer was lent: the read stops (read by
     * the read's own thread, without the GIL). */
    atomic_int recalled;
    engram_origin origin; /* recorded before fill runs; kind NONE: none */
    int check;            /* the whole's XXH3-64 must be sum */
    uint64_t sum;
    const char *name, *source;
} pullrows;

#define PULL_CAPSULE "engramstore._engram.pull_append"
/* The capsule's name once its fill() returned: its pullrows is gone. */
#define PULL_CAPSULE_DONE "engramstore._engram.pull_append (fill returned)"

/* append(rows): the rows (uint8 [n, row_bytes], rows one after another)
 * appended to the table being pulled, the GIL released. */
static PyObject *pull_append(PyObject *cap, PyObject *rows)
{
    pullrows *pr;
    engram_table_spec sp;
    ext_array a;
    int rc;
    if (!PyCapsule_IsValid(cap, PULL_CAPSULE) || !(pr = PyCapsule_GetPointer(cap, PULL_CAPSULE)) ||
        !pr->w)
        return ext_raise_cls(ext_exc_for(ENGRAM_ESTATE), ENGRAM_ESTATE,
                             "append: the pull's fill() has returned; nothing more is written");
    if (pr->busy)
        return ext_raise_cls(ext_exc_for(ENGRAM_ESTATE), ENGRAM_ESTATE,
                             "append: called while another append or a read into the table "
                             "runs (one thread appends)");
    if (ext_array_get(rows, "rows", 0, &a) < 0)
        return NULL;
    if (rows_layout(&a, "rows", &sp) < 0) {
        ext_array_release(&a);
        return NULL;
    }
    if (sp.row_bytes != pr->row_bytes) {
        ext_array_release(&a);
        PyErr_Format(PyExc_ValueError, "rows: expected rows of %u bytes, got %u",
                     (unsigned)pr->row_bytes, (unsigned)sp.row_bytes);
        return NULL;
    }
    pr->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_writer_append(pr->w, a.data, sp.num_rows, sp.row_pitch);
    Py_END_ALLOW_THREADS
    pr->busy = 0;
    ext_array_release(&a);
    if (rc < 0)
        return ext_raise(rc, NULL);
    Py_RETURN_NONE;
}

static PyMethodDef pull_append_def = {"append", pull_append, METH_O,
                                      "append(rows): rows appended to the table being pulled."};

static pullrows *pull_of(PyObject *fn)
{
    PyObject *cap = PyCFunction_Check(fn) ? PyCFunction_GET_SELF(fn) : NULL;
    return cap && PyCapsule_IsValid(cap, PULL_CAPSULE) ? PyCapsule_GetPointer(cap, PULL_CAPSULE)
                                                       : NULL;
}

/* ext.h: the loan is the pullrows itself. */
int ext_pull_lend(PyObject *fn, uint64_t num_rows, uint32_t row_bytes, ext_pull_loan **loan)
{
    pullrows *pr = pull_of(fn);
    *loan = NULL;
    if (!pr || !pr->w || pr->busy)
        return 0;
    if (num_rows != pr->num_rows || row_bytes != pr->row_bytes) {
        PyErr_Format(PyExc_ValueError, "rows: the pull's append() writes a table of %llu rows "
                                       "of %u bytes, not the %llu rows of %u bytes read",
                     (unsigned long long)pr->num_rows, (unsigned)pr->row_bytes,
                     (unsigned long long)num_rows, (unsigned)row_bytes);
        return -1;
    }
    pr->busy = 1;
    *loan = (ext_pull_loan *)pr;
    return 1;
}

engram_writer *ext_pull_writer(ext_pull_loan *loan)
{
    return ((pullrows *)loan)->w;
}

int ext_pull_recalled(ext_pull_loan *loan)
{
    return atomic_load(&((pullrows *)loan)->recalled);
}

void ext_pull_return(ext_pull_loan *loan)
{
    ((pullrows *)loan)->busy = 0;
}

/* What fill or same raised, kept for _pull_rows (the first one). */
static int pull_raised(pullrows *pr)
{
    PyObject *exc = ext_take_raised();
    if (!pr->exc)
        pr->exc = exc;
    else
        Py_XDECREF(exc);
    return -ECANCELED;
}

static int pull_fill(void *ud, engram_writer *w)
{
    pullrows *pr = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *cap = PyCapsule_New(pr, PULL_CAPSULE, NULL), *fn = NULL, *res = NULL;
    int rc = 0;
    if (pr->origin.kind != ENGRAM_ORIGIN_NONE &&
        (rc = engram_writer_set_origin(w, &pr->origin)) != 0) {
        Py_XDECREF(cap);
        PyGILState_Release(g);
        return rc;
    }
    if (cap && (fn = PyCFunction_New(&pull_append_def, cap))) {
        pr->w = w;
        res = PyObject_CallOneArg(pr->fill, fn);
        /* An append() or a read into the table that fill() left running
         * on another thread stops (a read at its next block), and is
         * waited for: the writer is committed or aborted once this
         * returns. */
        if (pr->busy) {
            atomic_store(&pr->recalled, 1);
            while (pr->busy) {
                Py_BEGIN_ALLOW_THREADS
                nanosleep(&(struct timespec){0, 1000000}, NULL);
                Py_END_ALLOW_THREADS
            }
            if (res) {
                Py_CLEAR(res);
                ext_raise_cls(ext_exc_for(ENGRAM_ESTATE), ENGRAM_ESTATE,
                              "pull: fill() returned while an append() or a read into the "
                              "table still ran; nothing is published");
            }
        }
        pr->w = NULL;
        /* An append() kept by fill now raises, and reads nothing of pr. */
        if (PyCapsule_SetName(cap, PULL_CAPSULE_DONE) < 0 && res)
            Py_CLEAR(res);
    }
    if (!res)
        rc = pull_raised(pr);
    Py_XDECREF(res);
    Py_XDECREF(fn);
    Py_XDECREF(cap);
    PyGILState_Release(g);
    /* The whole, as the file holds it: the writer's own checksum of what
     * it wrote, before anything is published. */
    if (rc == 0 && pr->check && engram__writer_sum(w) != pr->sum)
        rc = engram__err(ENGRAM_ECHECKSUM,
                         "table '%s' from %s: the rows' checksum %016llx differs from the "
                         "source's %016llx",
                         pr->name, pr->source, (unsigned long long)engram__writer_sum(w),
                         (unsigned long long)pr->sum);
    return rc;
}

/* same(rows): a read-only memoryview of the published table's rows,
 * released when same() returns (the rows are unmapped then). */
static int pull_same(void *ud, const void *rows, const engram_table_spec *spec)
{
    pullrows *pr = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *mv = PyMemoryView_FromMemory((char *)(uintptr_t)rows,
                                           (Py_ssize_t)(spec->num_rows * spec->row_bytes),
                                           PyBUF_READ),
             *res, *done;
    int rc;
    if (!mv) {
        rc = pull_raised(pr);
        PyGILState_Release(g);
        return rc;
    }
    res = PyObject_CallOneArg(pr->same, mv);
    rc = res ? PyObject_IsTrue(res) : -1;
    Py_XDECREF(res);
    if (rc < 0)
        rc = pull_raised(pr); /* taken before release() runs */
    /* A view of the rows that outlives the call (release() refuses) fails
     * the pull: the rows are unmapped once same() returns. */
    done = PyObject_CallMethod(mv, "release", NULL);
    if (!done)
        rc = pull_raised(pr);
    Py_XDECREF(done);
    Py_DECREF(mv);
    PyGILState_Release(g);
    return rc;
}

const char ext_store_pull_rows_doc[] = PyDoc_STR(
"_pull_rows($self, name, num_rows, row_bytes, fill, same, source, origin=None,\n"
"           checksum=None)\n--\n\n"
"engram_pull_rows(): copies a table of `num_rows` rows of `row_bytes`\n"
"bytes that Python code reads into this store's namespace directory, as\n"
"pull() copies a Redis Cluster's (create-only and atomic, capacity first,\n"
"the ranks of a node meeting at the namespace).  fill(append) calls\n"
"append(rows) (uint8 [n, row_bytes]) for every row in order, checks them,\n"
"and returns; anything it raises aborts the pull (nothing is published)\n"
"and is raised here.  same(view) is given a read-only memoryview of a\n"
"table published under the name (valid during the call only) and answers\n"
"whether it holds the source's rows: True keeps it, False raises\n"
"LayoutMismatchError.  `source` names the source in messages.  `origin`,\n"
"(namespace, epoch, where) of a Mooncake Store's publication, is recorded\n"
"in the table (engram_writer_set_origin()).  `checksum`, if given, is the\n"
"XXH3-64 the rows must have once fill() returned (the writer's own, taken as\n"
"it wrote them): CorruptTableError otherwise, and nothing is published.\n"
"Returns True if this call copied it, False if it was there.");

/* _pull_rows()'s origin: None, or (namespace, epoch, where) of a Mooncake
 * Store's publication into *o (checked by engram_writer_set_origin()).
 * 0, or -1 with the exception set. */
static int mooncake_origin_arg(PyObject *v, engram_origin *o)
{
    const char *ns, *where;
    unsigned long long epoch;
    memset(o, 0, sizeof *o);
    if (!v || v == Py_None)
        return 0;
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 3) {
        PyErr_SetString(PyExc_TypeError, "origin: expected (namespace, epoch, where)");
        return -1;
    }
    if (!(ns = ext_utf8_arg(PyTuple_GET_ITEM(v, 0), "origin namespace")) ||
        !(where = ext_utf8_arg(PyTuple_GET_ITEM(v, 2), "origin where")))
        return -1;
    epoch = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 1));
    if (epoch == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (strlen(ns) >= sizeof o->ns || strlen(where) >= sizeof o->where) {
        PyErr_SetString(PyExc_ValueError, "origin: namespace or where too long");
        return -1;
    }
    o->kind = ENGRAM_ORIGIN_MOONCAKE;
    o->epoch = epoch;
    memcpy(o->ns, ns, strlen(ns));
    memcpy(o->where, where, strlen(where));
    return 0;
}

PyObject *ext_store_pull_rows(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    static const char *const names[] = {"name", "num_rows", "row_bytes", "fill", "same",
                                        "source", "origin", "checksum"};
    PyObject *v[8];
    pullrows pr = {0};
    engram_pull_ops ops = {pull_fill, pull_same};
    engram_table_spec sp = {0, 0, 0};
    const char *cname, *csource;
    unsigned long long n;
    unsigned long r;
    int rc, written = 0;
    if (ext_store_parse_args("_pull_rows", args, nargs, kwnames, names, 8, 8, 6, v) < 0 ||
        !(cname = name_arg(v[0], "name")) || !(csource = ext_utf8_arg(v[5], "source")) ||
        mooncake_origin_arg(v[6], &pr.origin) < 0)
        return NULL;
    n = PyLong_AsUnsignedLongLong(v[1]);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    r = PyLong_AsUnsignedLong(v[2]);
    if (r == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (r > UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "row_bytes: %lu is too large", r);
        return NULL;
    }
    if (!PyCallable_Check(v[3]) || !PyCallable_Check(v[4])) {
        PyErr_SetString(PyExc_TypeError, "fill and same: expected callables");
        return NULL;
    }
    sp.num_rows = n;
    sp.row_bytes = (uint32_t)r;
    if (v[7] && v[7] != Py_None) {
        unsigned long long sum = PyLong_AsUnsignedLongLong(v[7]);
        if (sum == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        pr.check = 1;
        pr.sum = sum;
    }
    pr.name = cname;
    pr.source = csource;
    pr.fill = v[3];
    pr.same = v[4];
    pr.num_rows = sp.num_rows;
    pr.row_bytes = sp.row_bytes;
    if (ext_store_enter(s) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_pull_rows(s->st, cname, &sp, csource, &ops, &pr, &written);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (pr.exc) {
        ext_raise_taken(pr.exc);
        return NULL;
    }
    if (rc < 0)
        return ext_raise(rc, NULL);
    return PyBool_FromLong(written);
}

const char ext_store_wait_for_doc[] = PyDoc_STR(
"wait_for($self, name, timeout=None)\n--\n\n"
"Waits until table `name` is published in the namespace (by any process),\n"
"for at most `timeout` seconds (None: no limit; 0: no wait), sleeping on\n"
"inotify events of the directory rather than polling: ranks can block on a\n"
"table another process populates instead of meeting at a barrier.  Raises\n"
"EngramError with errno ETIMEDOUT when the time is up (naming the process\n"
"that is writing the table, if one is), TableNotFoundError if the namespace\n"
"is removed meanwhile.  The GIL is released while waiting.");

PyObject *ext_store_wait_for(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    static const char *const names[] = {"name", "timeout"};
    PyObject *v[2];
    const char *cname;
    engram_table_id id;
    int ms = -1, rc;
    if (ext_store_parse_args("wait_for", args, nargs, kwnames, names, 2, 2, 1, v) < 0 ||
        !(cname = name_arg(v[0], "name")) || timeout_arg(v[1], -1, &ms) < 0)
        return NULL;
    if (ext_store_enter(s) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_table_open_wait(s->st, cname, ms, &id);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc, NULL);
    Py_RETURN_NONE;
}

static void hold_destroy(PyObject *cap)
{
    ext_array *a = PyCapsule_GetPointer(cap, "engramstore.hold");
    if (a) {
        ext_array_release(a);
        PyMem_Free(a);
    }
}

const char ext_store_bind_doc[] = PyDoc_STR(
"bind($self, name, rows)\n--\n\n"
"Serves caller memory as table `name` without copying: rows is a uint8\n"
"[num_rows, row_bytes] array (any row stride >= row_bytes, e.g. an np.memmap).\n"
"The store keeps a reference to it until close(); its contents must not change\n"
"meanwhile.  Raises TableExistsError if the name is bound or stored.");

PyObject *ext_store_bind(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    PyObject *cap = NULL;
    ext_array *a;
    engram_table_spec sp;
    const char *cname;
    uint32_t decl_pitch;
    int rc;
    if (!(a = PyMem_Calloc(1, sizeof *a)))
        return PyErr_NoMemory();
    /* Bound rows are served where they are: the pitch is the array's row
     * stride, whatever was declared. */
    if (take_rows(s, "bind", args, nargs, kwnames, NULL, &cname, a, &sp, &decl_pitch) < 0) {
        PyMem_Free(a);
        return NULL;
    }
    if (!(cap = PyCapsule_New(a, "engramstore.hold", hold_destroy))) {
        ext_array_release(a);
        PyMem_Free(a);
        return NULL;
    }
    /* Hold the array before binding it: once bound, the store must never
     * outlive its reference. */
    if (PyList_Append(s->holds, cap) < 0 || ext_store_enter(s) < 0)
        goto fail_held;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_bind(s->st, cname, &sp, a->data);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ext_raise(rc, NULL);
        goto fail_held;
    }
    Py_DECREF(cap);
    Py_RETURN_NONE;
fail_held:
    /* Drop our entry (the last one with this capsule) again. */
    for (Py_ssize_t i = PyList_GET_SIZE(s->holds) - 1; i >= 0; i--)
        if (PyList_GET_ITEM(s->holds, i) == cap) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            if (PyList_SetSlice(s->holds, i, i + 1, NULL) < 0)
                PyErr_Clear();
            PyErr_Restore(et, ev, tb);
            break;
        }
    Py_DECREF(cap);
    return NULL;
}

PyObject *ext_check_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ext_array a;
    engram_table_spec sp;
    const char *arg;
    unsigned long long n;
    unsigned long r;
    int bad = 0;
    char b[64];
    (void)self;
    if (nargs != 4 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_check_rows(rows, arg: str, num_rows, row_bytes)");
        return NULL;
    }
    if (!(arg = PyUnicode_AsUTF8(args[1])))
        return NULL;
    n = PyLong_AsUnsignedLongLong(args[2]);
    r = PyLong_AsUnsignedLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (ext_array_get(args[0], arg, 0, &a) < 0)
        return NULL;
    if (rows_layout(&a, arg, &sp) < 0) {
        ext_array_release(&a);
        return NULL;
    }
    bad = sp.num_rows != n || sp.row_bytes != r;
    if (bad)
        PyErr_Format(PyExc_ValueError, "%s: expected shape (%llu, %lu), got %s", arg, n, r,
                     ext_array_shape(&a, b, sizeof b));
    else if (!ext_array_c_contiguous(&a)) {
        PyErr_Format(PyExc_ValueError, "%s: must be C-contiguous", arg);
        bad = 1;
    }
    ext_array_release(&a);
    if (bad)
        return NULL;
    Py_RETURN_NONE;
}

const char ext_store_open_safetensors_doc[] = PyDoc_STR(
"open_safetensors($self, name, path, weight, scale=None, row_start=0, row_end=0)\n--\n\n"
"Serves rows of a safetensors checkpoint as table `name`, read on demand\n"
"through the store's row cache (no copy of the checkpoint): row i is row\n"
"row_start + i of tensor `weight` followed by the same row of `scale` (e.g.\n"
"[N, 256] F8_E4M3 values and [N, 8] F8_E8M0 scales give 264-byte rows).\n"
"`path` is a .safetensors file or a model.safetensors.index.json; row_end 0\n"
"means all rows.  The header is validated before use (CorruptTableError).");

PyObject *ext_store_open_safetensors(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    static const char *const names[] = {"name", "path", "weight", "scale", "row_start",
                                        "row_end"};
    PyObject *v[6], *pathb = NULL;
    const char *cname, *cweight, *cscale = NULL;
    unsigned long long r0 = 0, r1 = 0;
    engram_table_id id;
    int rc;
    if (ext_store_parse_args("open_safetensors", args, nargs, kwnames, names, 6, 6, 3, v) < 0)
        return NULL;
    if (!(cname = name_arg(v[0], "name")) || !(cweight = name_arg(v[2], "weight")))
        return NULL;
    if (v[3] && v[3] != Py_None && !(cscale = name_arg(v[3], "scale")))
        return NULL;
    if ((v[4] && (r0 = PyLong_AsUnsignedLongLong(v[4])) == (unsigned long long)-1 &&
         PyErr_Occurred()) ||
        (v[5] && (r1 = PyLong_AsUnsignedLongLong(v[5])) == (unsigned long long)-1 &&
         PyErr_Occurred()))
        return NULL;
    if (ext_path_arg(v[1], "path", &pathb) < 0)
        return NULL;
    if (ext_store_enter(s) < 0) {
        Py_DECREF(pathb);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = engram_open_safetensors(s->st, cname, PyBytes_AS_STRING(pathb), cweight, cscale, r0, r1,
                                 &id);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    Py_DECREF(pathb);
    if (rc < 0)
        return ext_raise(rc, NULL);
    Py_RETURN_NONE;
}

/* ---- definitions and queries ------------------------------------------- */

const char ext_store_define_doc[] = PyDoc_STR(
"define($self, name, num_rows, row_bytes, row_pitch=0)\n--\n\n"
"Declares table `name` with its spec.  If the table is already stored, the\n"
"spec must match it (LayoutMismatchError otherwise); a name declared twice must\n"
"be declared the same way.  Declared tables are checked again when they are\n"
"first looked up, and populate() of a declared name takes its spec from here.");

PyObject *ext_store_define(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    static const char *const names[] = {"name", "num_rows", "row_bytes", "row_pitch"};
    PyObject *v[4], *t, *key;
    engram_table_spec sp = {0, 0, 0}, old;
    engram_table_info info;
    const char *cname;
    int rc, d;
    if (ext_store_parse_args("define", args, nargs, kwnames, names, 4, 4, 3, v) < 0)
        return NULL;
    if (!(cname = name_arg(v[0], "name")))
        return NULL;
    for (int i = 1; i < 4; i++) {
        if (v[i] && !PyLong_Check(v[i])) {
            PyErr_Format(PyExc_TypeError, "%s: expected an int, got %.100s", names[i],
                         Py_TYPE(v[i])->tp_name);
            return NULL;
        }
    }
    {
        long long n = PyLong_AsLongLong(v[1]);
        long long r = PyLong_AsLongLong(v[2]);
        long long p = v[3] ? PyLong_AsLongLong(v[3]) : 0;
        if (PyErr_Occurred())
            return NULL;
        if (n < 1 || r < 1 || r > ENGRAM_ROW_BYTES_MAX || p < 0 || p > ENGRAM_ROW_BYTES_MAX ||
            (p && p < r))
            return ext_raise_cls(ext_exc_for(ENGRAM_ESPEC), ENGRAM_ESPEC,
                                 "table '%s': num_rows=%lld, row_bytes=%lld, row_pitch=%lld is "
                                 "not a spec (num_rows >= 1, 1 <= row_bytes <= %u, row_pitch 0 "
                                 "or row_bytes..%u)",
                                 cname, n, r, p, (unsigned)ENGRAM_ROW_BYTES_MAX,
                                 (unsigned)ENGRAM_ROW_BYTES_MAX);
        sp.num_rows = (uint64_t)n;
        sp.row_bytes = (uint32_t)r;
        sp.row_pitch = (uint32_t)p;
    }
    if ((rc = engram_name_check(cname)) < 0 || (rc = engram_spec_check(&sp)) < 0)
        return ext_raise(rc, "name");
    if ((d = declared_spec(s, v[0], &old)) < 0)
        return NULL;
    if (d && (old.num_rows != sp.num_rows || old.row_bytes != sp.row_bytes ||
              (old.row_pitch ? old.row_pitch : old.row_bytes) !=
                  (sp.row_pitch ? sp.row_pitch : sp.row_bytes)))
        return mismatch(v[0], &sp, &old);
    if (ext_store_enter(s) < 0)
        return NULL;
    rc = ext_store_table_info(s, cname, &info);
    ext_store_leave(s);
    if (rc == 0 && !spec_matches(&sp, &info.spec))
        return mismatch(v[0], &sp, &info.spec);
    if (rc < 0 && rc != -ENOENT)
        return ext_raise(rc, NULL);
    if (!(t = spec_tuple(&sp)))
        return NULL;
    if (!(key = name_key(v[0]))) {
        Py_DECREF(t);
        return NULL;
    }
    rc = PyDict_SetItem(s->declared, key, t);
    Py_DECREF(key);
    Py_DECREF(t);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static const char *kind_name(uint32_t kind)
{
    return kind == ENGRAM_TABLE_FILE          ? "file"
           : kind == ENGRAM_TABLE_BOUND       ? "bound"
           : kind == ENGRAM_TABLE_SAFETENSORS ? "safetensors"
           : kind == ENGRAM_TABLE_SOURCE      ? "source"
           : kind == ENGRAM_TABLE_REDIS       ? "redis"
                                              : "other";
}

const char ext_store_get_table_spec_doc[] = PyDoc_STR(
"get_table_spec($self, name, /)\n--\n\n"
"The spec of table `name`: num_rows, row_bytes, row_pitch, and `stored` (False\n"
"for a name that is declared but not populated yet).  Stored tables also give\n"
"kind ('file', 'bound', 'safetensors', 'source' or 'redis'), data_size, checksum\n"
"(XXH3-64), created_ns, and the global row range the table holds: row i is\n"
"row row_start + i of a tensor of total_rows rows (a TP shard, a layer's head;\n"
"look it up with offsets=[row_start] to use global ids), or 0 and 0 when no\n"
"range was recorded.  origin is where the rows were published, for a table\n"
"pulled from a remote namespace (pull()) and a table of one: a dict of store\n"
"('redis' or 'mooncake'), namespace, epoch and where (how the store was\n"
"reached), or None.  numa_nodes is {node: pages} of the table's memory as\n"
"placement() counts it (sampled above 65536 pages), or None where that cannot\n"
"be told (rows read on demand, no libnuma; placement() says why).\n"
"Raises TableNotFoundError for a name neither stored nor declared.");

/* engram_table_info.origin as get_table_spec() gives it: None, or a dict
 * of store, namespace, epoch and where.  New reference, NULL on error. */
static PyObject *origin_dict(const engram_origin *o)
{
    if (o->kind == ENGRAM_ORIGIN_NONE)
        Py_RETURN_NONE;
    return Py_BuildValue("{s:s,s:s,s:K,s:s}", "store",
                         o->kind == ENGRAM_ORIGIN_REDIS ? "redis" : "mooncake", "namespace",
                         o->ns, "epoch", (unsigned long long)o->epoch, "where", o->where);
}

PyObject *ext_store_get_table_spec(StoreObject *s, PyObject *name)
{
    engram_table_info info;
    engram_table_spec decl;
    PyObject *nodes = NULL, *origin = NULL;
    const char *cname;
    int rc, d;
    if (!(cname = name_arg(name, "name")))
        return NULL;
    if (ext_store_enter(s) < 0)
        return NULL;
    rc = ext_store_table_info(s, cname, &info);
    ext_store_leave(s);
    if (rc == 0 && !(nodes = ext_store_numa_nodes(s, cname)))
        return NULL;
    if (rc == 0 && !(origin = origin_dict(&info.origin))) {
        Py_DECREF(nodes);
        return NULL;
    }
    if (rc == 0)
        return Py_BuildValue("{s:K,s:I,s:I,s:O,s:s,s:K,s:K,s:K,s:K,s:K,s:N,s:N}", "num_rows",
                             (unsigned long long)info.spec.num_rows, "row_bytes",
                             info.spec.row_bytes, "row_pitch", info.spec.row_pitch, "stored",
                             Py_True, "kind", kind_name(info.kind), "data_size",
                             (unsigned long long)info.data_size, "checksum",
                             (unsigned long long)info.checksum, "created_ns",
                             (unsigned long long)info.created_ns, "row_start",
                             (unsigned long long)info.row_start, "total_rows",
                             (unsigned long long)info.total_rows, "numa_nodes", nodes,
                             "origin", origin);
    if (rc == -ENOENT) {
        if ((d = declared_spec(s, name, &decl)) < 0)
            return NULL;
        if (d)
            return Py_BuildValue("{s:K,s:I,s:I,s:O}", "num_rows",
                                 (unsigned long long)decl.num_rows, "row_bytes", decl.row_bytes,
                                 "row_pitch", decl.row_pitch ? decl.row_pitch : decl.row_bytes,
                                 "stored", Py_False);
    }
    return ext_raise(rc, NULL);
}

const char ext_store_list_tables_doc[] = PyDoc_STR(
"list_tables($self, /)\n--\n\n"
"The names of the stored and bound tables, sorted.");

PyObject *ext_store_list_tables(StoreObject *s, PyObject *unused)
{
    char **names = NULL;
    size_t n = 0;
    int rc;
    (void)unused;
    if (ext_store_enter(s) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_list(s->st, &names, &n);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc, NULL);
    return ext_names_list(names, n);
}

const char ext_store_remove_doc[] = PyDoc_STR(
"remove($self, name, /)\n--\n\n"
"Unpublishes stored table `name` (the name is free again at once).  Other\n"
"processes keep the mapping they have; this store's later lookups of the name\n"
"find the table gone.  Bound tables cannot be removed (StateError).");

/* Calls fn(store, name) with the GIL released: 0, or -1 with the
 * library's error raised. */
static int call_named(StoreObject *s, PyObject *name, int (*fn)(engram_store *, const char *))
{
    const char *cname;
    int rc;
    if (!(cname = name_arg(name, "name")) || ext_store_enter(s) < 0)
        return -1;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(s->st, cname);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ext_raise(rc, NULL);
        return -1;
    }
    return 0;
}

PyObject *ext_store_remove(StoreObject *s, PyObject *name)
{
    if (call_named(s, name, engram_remove) < 0)
        return NULL;
    /* The next lookup of the name resolves it afresh; resolutions running
     * in other threads (the GIL released) must not cache what they found.
     * The whole cache goes: removing is rare, and every other name
     * resolves again to the id it had. */
    s->gen++;
    ext_store_memo_clear(s);
    PyDict_Clear(s->tables);
    Py_RETURN_NONE;
}

const char ext_store_verify_doc[] = PyDoc_STR(
"verify($self, name, /)\n--\n\n"
"Re-reads stored table `name` and checks its header and data checksum\n"
"(CorruptTableError if they disagree).  The GIL is released meanwhile.");

static int verify_quiet(engram_store *st, const char *name)
{
    return engram_verify(st, name, NULL, NULL);
}

PyObject *ext_store_verify(StoreObject *s, PyObject *name)
{
    if (call_named(s, name, verify_quiet) < 0)
        return NULL;
    Py_RETURN_NONE;
}
