/*
 * module.c - the engramstore._engram module: init, the exception
 * hierarchy and the mapping of library codes to it.
 *
 * Every library failure raises a subclass of EngramError carrying
 * `errno`: the library's code negated, so a system error has its usual
 * positive errno (errno.ENOSPC) and a library error its ENGRAM_E* value
 * negated (engramstore.EBADID == 4001).  Bad arguments caught before the
 * library is called raise TypeError/ValueError; ENOMEM raises MemoryError.
 */
#include "ext.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

PyObject *ext_EngramError;
PyObject *ext_StoreClosedError;

/* One row per class: its name, the names of its bases among the rows
 * above it (or a builtin), the codes that raise it, and its docstring. */
typedef struct exc_def {
    const char *name;
    const char *base;  /* a class defined above, or NULL for EngramError's own base */
    PyObject **builtin; /* a builtin second base, or NULL */
    int codes[4];       /* 0-terminated */
    const char *doc;
    PyObject *cls;
} exc_def;

static exc_def excs[] = {
    {"EngramError", NULL, NULL, {0}, "Base class of every error engramstore raises for a failed "
     "library call.  `errno` holds the code: a positive errno for system errors, "
     "engramstore.E* for the library's own.", NULL},
    {"TableExistsError", "EngramError", NULL, {-EEXIST}, "A table of that name is already stored "
     "or bound (tables are create-only).", NULL},
    {"TableNotFoundError", "EngramError", NULL, {-ENOENT}, "No table (or namespace) of that name.",
     NULL},
    {"TableRemovedError", "EngramError", NULL, {ENGRAM_EREMOVED}, "The table was removed while "
     "this store had it open.", NULL},
    {"SpecError", "EngramError", &PyExc_ValueError, {ENGRAM_ESPEC}, "An invalid table spec or "
     "name.", NULL},
    {"LayoutMismatchError", "EngramError", &PyExc_ValueError, {ENGRAM_EMISMATCH}, "A spec that "
     "disagrees with the stored table.", NULL},
    {"LayoutError", "EngramError", &PyExc_ValueError, {ENGRAM_ELAYOUT}, "An array layout the "
     "lookup cannot use (overlapping output rows, row sizes that differ between tables).",
     NULL},
    {"BadIdError", "EngramError", &PyExc_IndexError, {ENGRAM_EBADID}, "A row id outside its "
     "table; the message names its position and value, and the output was not modified.",
     NULL},
    {"CorruptTableError", "EngramError", NULL, {ENGRAM_ECORRUPT, ENGRAM_ECHECKSUM,
     ENGRAM_EVERSION}, "A table file that is truncated, corrupt, fails its checksum or has an "
     "unsupported format version.", NULL},
    {"UnsafePathError", "EngramError", NULL, {ENGRAM_EUNSAFE}, "A refused directory entry: a "
     "link, owned by another user, or writable by others.", NULL},
    {"StateError", "EngramError", NULL, {ENGRAM_EBOUND, ENGRAM_ESTATE}, "An operation not "
     "allowed in the object's current state.", NULL},
    {"StoreClosedError", "StateError", NULL, {0}, "The store was closed.", NULL},
    {"InDoubtError", "EngramError", NULL, {ENGRAM_EINDOUBT}, "A write to a remote store (a push "
     "or a removal in a Redis Cluster) whose outcome is unknown: its answer was lost and could "
     "not be asked for afterwards.  It may or may not have taken effect; nothing was deleted "
     "that a published table needs.  The message says how to check.", NULL},
};
#define NEXCS (sizeof excs / sizeof excs[0])

PyObject *ext_raise_arg(int rc)
{
    if (rc == -EINVAL || rc == -ERANGE) {
        PyErr_SetString(PyExc_ValueError, engram_errmsg());
        return NULL;
    }
    return ext_raise(rc, NULL);
}

PyObject *ext_exc_for(int rc)
{
    for (size_t i = 1; i < NEXCS; i++)
        for (int j = 0; excs[i].codes[j]; j++)
            if (excs[i].codes[j] == rc)
                return excs[i].cls;
    return ext_EngramError;
}

static PyObject *raise_msg(PyObject *cls, int rc, PyObject *msg)
{
    PyObject *exc, *num;
    if (!msg)
        return NULL;
    exc = PyObject_CallOneArg(cls, msg);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    {
        /* A lookup failed by a source callable raises with the callable's
         * own exception as the cause. */
        PyObject *cause = ext_source_take_exception();
        if (cause)
            PyException_SetCause(exc, cause);
    }
    num = PyLong_FromLong(-(long)rc);
    if (!num || PyObject_SetAttrString(exc, "errno", num) < 0) {
        Py_XDECREF(num);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(num);
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

/* The library's messages name its C API; the package's users know the
 * Python names.  Each row: a phrase of a library message that can reach
 * Python, and what to say instead.  Whole phrases, with the words around
 * the C name, so that a table or namespace that happens to be called
 * ENGRAM_OPEN_CREATE is quoted as it is. */
static const char *const python_terms[][2] = {
    {"(open with ENGRAM_OPEN_CREATE)", "(open with create=True)"},
    {"with ENGRAM_OPEN_GROUP another", "with group=True another"},
    {"ENGRAM_OPEN_FILE_CACHE reads rows on demand and ENGRAM_OPEN_PRIVATE_HUGE copies",
     "file_cache=True reads rows on demand and huge_pages=True copies"},
    {"engram_lookup() called from inside", "lookup() called from inside"},
    {"(engram_add_source)", "(add_source)"},
    {"; use engram_bind()", "; use bind()"},
};

const char *ext_python_terms(const char *msg, char *buf, size_t len)
{
    size_t o = 0;
    if (len == 0)
        return "";
    while (*msg && o + 1 < len) {
        size_t i, n = 0;
        for (i = 0; i < sizeof python_terms / sizeof python_terms[0]; i++) {
            n = strlen(python_terms[i][0]);
            if (strncmp(msg, python_terms[i][0], n) == 0)
                break;
        }
        if (i < sizeof python_terms / sizeof python_terms[0]) {
            const char *t = python_terms[i][1];
            while (*t && o + 1 < len)
                buf[o++] = *t++;
            msg += n;
        } else {
            buf[o++] = *msg++;
        }
    }
    buf[o] = '\0';
    return buf;
}

PyObject *ext_raise(int rc, const char *what)
{
    char buf[1024];
    const char *detail = engram_errmsg();
    if (!detail || !detail[0])
        detail = engram_strerror(rc);
    detail = ext_python_terms(detail, buf, sizeof buf);
    if (rc == -ENOMEM)
        return PyErr_Format(PyExc_MemoryError, "%s%s%s", what ? what : "", what ? ": " : "",
                            detail);
    return raise_msg(ext_exc_for(rc), rc,
                     what ? PyUnicode_FromFormat("%s: %s", what, detail)
                          : PyUnicode_FromString(detail));
}

PyObject *ext_raise_cls(PyObject *cls, int rc, const char *fmt, ...)
{
    va_list ap;
    PyObject *msg;
    va_start(ap, fmt);
    msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    return raise_msg(cls, rc, msg);
}

/* ---- strings and paths handed to the library ------------------------------ */

const char *ext_utf8_arg(PyObject *s, const char *arg)
{
    Py_ssize_t len;
    const char *c = PyUnicode_AsUTF8AndSize(s, &len);
    if (c && (size_t)len != strlen(c)) {
        PyErr_Format(PyExc_ValueError, "%s: cannot contain NUL (the library would see only "
                     "what comes before it)", arg);
        return NULL;
    }
    return c;
}

const char *ext_str_arg(PyObject *s, const char *arg)
{
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a str, got %.100s", arg,
                     Py_TYPE(s)->tp_name);
        return NULL;
    }
    return ext_utf8_arg(s, arg);
}

PyObject *ext_names_list(char **names, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *u = PyUnicode_FromString(names[i]);
        if (!u) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, u);
    }
    engram_free(names);
    return list;
}

int ext_path_arg(PyObject *o, const char *arg, PyObject **out)
{
    PyObject *p = PyOS_FSPath(o), *b;
    *out = NULL;
    if (!p) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: expected a path (str, bytes or os.PathLike), "
                         "got %.100s", arg, Py_TYPE(o)->tp_name);
        }
        return -1;
    }
    b = PyUnicode_Check(p) ? PyUnicode_EncodeFSDefault(p) : Py_NewRef(p);
    Py_DECREF(p);
    if (!b)
        return -1;
    if (strlen(PyBytes_AS_STRING(b)) != (size_t)PyBytes_GET_SIZE(b)) {
        Py_DECREF(b);
        PyErr_Format(PyExc_ValueError, "%s: a path cannot contain NUL (the library would see "
                     "only what comes before it)", arg);
        return -1;
    }
    *out = b;
    return 0;
}

int ext_uint_arg(PyObject *v, const char *arg, unsigned long long max, const char *hint,
                 unsigned long long *out)
{
    unsigned long long x;
    int overflow;
    long long sx;
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int, got %.100s", arg,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    sx = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (sx == -1 && !overflow && PyErr_Occurred())
        return -1;
    if (overflow < 0 || (!overflow && sx < 0))
        goto range;
    if (!overflow)
        x = (unsigned long long)sx;
    else if ((x = PyLong_AsUnsignedLongLong(v)) == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* above 2**64 - 1 */
        goto range;
    }
    if (x > max)
        goto range;
    *out = x;
    return 0;
range:
    PyErr_Format(PyExc_ValueError, "%s: expected an int in [0, %llu]%s, got %R", arg, max,
                 hint ? hint : "", v);
    return -1;
}

int ext_numa_node_arg(PyObject *v, const char *arg, int *out)
{
    long n;
    int overflow;
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int, got %.100s", arg,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    /* An int past a C long is out of range like 64 is, not an
     * OverflowError that names no argument. */
    n = PyLong_AsLongAndOverflow(v, &overflow);
    if (n == -1 && !overflow && PyErr_Occurred())
        return -1;
    if (overflow || n < 0 || n >= ENGRAM_NUMA_MAX_NODES) {
        PyErr_Format(PyExc_ValueError, "%s: expected a node in [0, %d], got %R", arg,
                     ENGRAM_NUMA_MAX_NODES - 1, v);
        return -1;
    }
    *out = (int)n;
    return 0;
}

static PyObject *find_class(const char *name)
{
    for (size_t i = 0; i < NEXCS; i++)
        if (excs[i].cls && !strcmp(excs[i].name, name))
            return excs[i].cls;
    return NULL;
}

static int add_exceptions(PyObject *m)
{
    char qual[96];
    for (size_t i = 0; i < NEXCS; i++) {
        exc_def *d = &excs[i];
        PyObject *bases, *dict;
        PyObject *base = d->base ? find_class(d->base) : PyExc_Exception;
        if (!base)
            return -1;
        bases = d->builtin ? PyTuple_Pack(2, base, *d->builtin) : PyTuple_Pack(1, base);
        dict = PyDict_New();
        if (!bases || !dict || PyDict_SetItemString(dict, "errno", Py_None) < 0) {
            Py_XDECREF(bases);
            Py_XDECREF(dict);
            return -1;
        }
        PyOS_snprintf(qual, sizeof qual, "engramstore.%s", d->name);
        d->cls = PyErr_NewExceptionWithDoc(qual, d->doc, bases, dict);
        Py_DECREF(bases);
        Py_DECREF(dict);
        if (!d->cls)
            return -1;
        if (PyModule_AddObjectRef(m, d->name, d->cls) < 0)
            return -1;
    }
    ext_EngramError = find_class("EngramError");
    ext_StoreClosedError = find_class("StoreClosedError");
    return 0;
}

static int add_codes(PyObject *m)
{
#define ADD_CODE(name, value, text)                              \
    if (PyModule_AddIntConstant(m, #name, -(value)) < 0)         \
        return -1;
    ENGRAM_ERRNO_MAP(ADD_CODE)
#undef ADD_CODE
    return 0;
}

PyDoc_STRVAR(strerror_doc, "strerror($module, errno, /)\n--\n\n"
                           "The library's fixed description of an error number (the `errno` of "
                           "an EngramError).");

static PyObject *mod_strerror(PyObject *self, PyObject *arg)
{
    long e = PyLong_AsLong(arg);
    (void)self;
    if (e == -1 && PyErr_Occurred())
        return NULL;
    if (e < 0 || e > 100000)
        return PyErr_Format(PyExc_ValueError, "errno: %ld is not an error number", e);
    return PyUnicode_FromString(engram_strerror(-(int)e));
}

PyDoc_STRVAR(default_root_doc, "default_root($module, /)\n--\n\n"
                               "The default root directory of namespaces: /dev/shm/engram when "
                               "/dev/shm exists, else /tmp/engram.");

static PyObject *mod_default_root(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(engram_default_root());
}

PyDoc_STRVAR(check_capacity_doc,
"check_capacity($module, dir, specs, /)\n--\n\n"
"Raises EngramError (errno ENOSPC) with the bytes needed, the bytes available\n"
"and the fix unless tables of `specs` ((num_rows, row_bytes, row_pitch)\n"
"tuples) fit in directory `dir`: its file system's free space and, on a\n"
"tmpfs, this process's memory cgroup limit.  engramstore.can_share() is the\n"
"friendlier form.");

static PyObject *mod_check_capacity(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *dirb = NULL, *seq = NULL;
    engram_table_spec *specs = NULL;
    Py_ssize_t n = 0;
    int rc;
    (void)self;
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "check_capacity(dir, specs): 2 arguments, got %zd",
                            nargs);
    if (ext_path_arg(args[0], "dir", &dirb) < 0)
        return NULL;
    if (!(seq = PySequence_Fast(args[1], "specs: expected a sequence of spec tuples")))
        goto fail;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n && !(specs = PyMem_Calloc((size_t)n, sizeof *specs))) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long rows;
        unsigned int rb, pitch = 0;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KI|I", &rows, &rb, &pitch))
            goto fail;
        specs[i].num_rows = rows;
        specs[i].row_bytes = rb;
        specs[i].row_pitch = pitch;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = engram_check_capacity(PyBytes_AS_STRING(dirb), specs, (size_t)n);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        ext_raise(rc, NULL);
        goto fail;
    }
    PyMem_Free(specs);
    Py_DECREF(seq);
    Py_DECREF(dirb);
    Py_RETURN_NONE;
fail:
    PyMem_Free(specs);
    Py_XDECREF(seq);
    Py_XDECREF(dirb);
    return NULL;
}

/* A sequence of ints (each 0..2^64-1) into a new array of *n; NULL with
 * an exception (`what` is TypeError's message for a non-sequence). */
static uint64_t *u64_seq(PyObject *o, const char *what, Py_ssize_t *n)
{
    PyObject *seq = PySequence_Fast(o, what);
    uint64_t *v = NULL;
    if (!seq)
        return NULL;
    *n = PySequence_Fast_GET_SIZE(seq);
    if (!(v = PyMem_Calloc(*n ? (size_t)*n : 1, sizeof *v))) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        v[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v[i] == (uint64_t)-1 && PyErr_Occurred()) {
            PyMem_Free(v);
            v = NULL;
            goto out;
        }
    }
out:
    Py_DECREF(seq);
    return v;
}

/* tp, dp and flags of a plan: ints (numpy's too) in [0, 2**32 - 1], each
 * named when it is not.  (PyArg's "I" took any int modulo 2**32: tp=-1
 * asked for 2**32 - 1 shards, a MemoryError, and tp=2**32 + 2 planned 2
 * shards for 2**32 + 2 ranks.) */
static int topology_args(PyObject *const o[3], unsigned int *const out[3])
{
    static const char *const names[3] = {"tp", "dp", "flags"};
    for (int k = 0; k < 3; k++) {
        unsigned long long v;
        PyObject *i = PyNumber_Index(o[k]);
        int rc;
        if (!i) {
            PyErr_Format(PyExc_TypeError, "%s: expected an int, got %.100s", names[k],
                         Py_TYPE(o[k])->tp_name);
            return -1;
        }
        rc = ext_uint_arg(i, names[k], UINT32_MAX, NULL, &v);
        Py_DECREF(i);
        if (rc < 0)
            return -1;
        *out[k] = (unsigned int)v;
    }
    return 0;
}

PyDoc_STRVAR(shard_plan_doc,
"shard_plan($module, num_heads, reads, tp, dp, flags, /)\n--\n\n"
"engram_shard_plan(): a list of (first_head, num_heads, reads) per shard.  reads: a\n"
"sequence of num_heads ints, or None.  engramstore.shard_plan() is the\n"
"friendlier form.");

static PyObject *mod_shard_plan(PyObject *self, PyObject *args)
{
    unsigned int heads, tp, dp, flags;
    PyObject *reads_o, *topo[3], *res = NULL;
    uint64_t *reads = NULL;
    engram_shard *sh = NULL;
    Py_ssize_t len;
    uint32_t n;
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "IOOOO", &heads, &reads_o, &topo[0], &topo[1], &topo[2]) ||
        topology_args(topo, (unsigned int *const[3]){&tp, &dp, &flags}) < 0)
        return NULL;
    n = engram_shard_count(tp, dp, flags);
    if (reads_o != Py_None) {
        if (!(reads = u64_seq(reads_o, "reads: expected a sequence of ints", &len)))
            return NULL;
        if ((size_t)len != heads) {
            PyErr_Format(PyExc_ValueError, "reads: expected %u counts (one per head), got %zd",
                         heads, len);
            goto out;
        }
    }
    if (!(sh = PyMem_Calloc(n ? n : 1, sizeof *sh)))
        goto nomem;
    if ((rc = engram_shard_plan(heads, reads, tp, dp, flags, sh)) != 0) {
        ext_raise(rc, NULL);
        goto out;
    }
    if (!(res = PyList_New(n)))
        goto out;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(IIK)", sh[i].first_head, sh[i].num_heads,
                                    (unsigned long long)sh[i].reads);
        if (!t) {
            Py_CLEAR(res);
            goto out;
        }
        PyList_SET_ITEM(res, i, t);
    }
    goto out;
nomem:
    PyErr_NoMemory();
out:
    PyMem_Free(sh);
    PyMem_Free(reads);
    return res;
}

/* A sequence of (row_start, row_end, first_head, last_head) into a new
 * array of *n row shards; NULL with an exception. */
static engram_row_shard *row_shards_arg(PyObject *o, uint32_t *n)
{
    PyObject *seq = PySequence_Fast(o, "shards: expected a sequence of (row_start, row_end, "
                                       "first_head, last_head)");
    engram_row_shard *sh = NULL;
    Py_ssize_t len;
    if (!seq)
        return NULL;
    len = PySequence_Fast_GET_SIZE(seq);
    if (len < 1 || len > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "shards: expected at least one shard");
        goto out;
    }
    if (!(sh = PyMem_Calloc((size_t)len, sizeof *sh))) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned long long a, b;
        unsigned int f, l;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KKII", &a, &b, &f, &l)) {
            PyMem_Free(sh);
            sh = NULL;
            goto out;
        }
        sh[i] = (engram_row_shard){a, b, f, l};
    }
    *n = (uint32_t)len;
out:
    Py_DECREF(seq);
    return sh;
}

PyDoc_STRVAR(shard_plan_rows_doc,
"shard_plan_rows($module, head_rows, tp, dp, flags, /)\n--\n\n"
"engram_shard_plan_rows(): a list of (row_start, row_end, first_head, last_head) per\n"
"shard.  engramstore.shard_plan(..., by_rows=True) is the friendlier form.");

static PyObject *mod_shard_plan_rows(PyObject *self, PyObject *args)
{
    unsigned int tp, dp, flags;
    PyObject *rows_o, *topo[3], *res = NULL;
    uint64_t *rows;
    engram_row_shard *sh = NULL;
    Py_ssize_t heads;
    uint32_t n;
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOO", &rows_o, &topo[0], &topo[1], &topo[2]) ||
        topology_args(topo, (unsigned int *const[3]){&tp, &dp, &flags}) < 0)
        return NULL;
    if (!(rows = u64_seq(rows_o, "head_rows: expected a sequence of ints", &heads)))
        return NULL;
    if (heads > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "head_rows: too many heads");
        goto out;
    }
    n = engram_shard_count(tp, dp, flags);
    if (!(sh = PyMem_Calloc(n ? n : 1, sizeof *sh)))
        goto nomem;
    if ((rc = engram_shard_plan_rows(rows, (uint32_t)heads, tp, dp, flags, sh)) != 0) {
        ext_raise(rc, NULL);
        goto out;
    }
    if (!(res = PyList_New(n)))
        goto out;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(KKII)", (unsigned long long)sh[i].row_start,
                                    (unsigned long long)sh[i].row_end, sh[i].first_head,
                                    sh[i].last_head);
        if (!t) {
            Py_CLEAR(res);
            goto out;
        }
        PyList_SET_ITEM(res, i, t);
    }
    goto out;
nomem:
    PyErr_NoMemory();
out:
    PyMem_Free(sh);
    PyMem_Free(rows);
    return res;
}

PyDoc_STRVAR(shard_route_doc,
"shard_route($module, shards, ids, out, /)\n--\n\n"
"engram_shard_route(): out[i] (int32) the shard of global id ids[i] (int64, 1-D,\n"
"contiguous), -1 for DEAD; a bad id raises BadIdError with out untouched.");

static PyObject *mod_shard_route(PyObject *self, PyObject *args)
{
    PyObject *sh_o, *ids_o, *out_o, *ret = NULL;
    engram_row_shard *sh;
    ext_array ia, oa;
    uint32_t n = 0;
    char b[32], sb[64];
    int rc;
    (void)self;
    memset(&ia, 0, sizeof ia);
    memset(&oa, 0, sizeof oa);
    if (!PyArg_ParseTuple(args, "OOO", &sh_o, &ids_o, &out_o))
        return NULL;
    if (!(sh = row_shards_arg(sh_o, &n)))
        return NULL;
    if (ext_array_get(ids_o, "ids", 0, &ia) < 0 || ext_array_get(out_o, "out", EXT_WRITABLE, &oa) < 0)
        goto out;
    /* The dtype, the shape and whether it is contiguous: an int64 array of
     * the wrong shape was said to be "got int64", and nothing more. */
    if (ia.kind != EXT_KIND_INT || ia.itemsize != 8 || ia.ndim != 1 ||
        !ext_array_c_contiguous(&ia)) {
        PyErr_Format(PyExc_TypeError, "ids: expected a contiguous 1-D int64 array, got %s of "
                     "shape %s%s", ext_array_dtype(&ia, b, sizeof b),
                     ext_array_shape(&ia, sb, sizeof sb),
                     ext_array_c_contiguous(&ia) ? "" : " (not contiguous)");
        goto out;
    }
    if (oa.kind != EXT_KIND_INT || oa.itemsize != 4 || oa.ndim != 1 ||
        !ext_array_c_contiguous(&oa) || oa.shape[0] != ia.shape[0]) {
        PyErr_Format(PyExc_TypeError, "out: expected a contiguous 1-D int32 array of %zd, got "
                     "%s of shape %s%s", ia.shape[0], ext_array_dtype(&oa, b, sizeof b),
                     ext_array_shape(&oa, sb, sizeof sb),
                     ext_array_c_contiguous(&oa) ? "" : " (not contiguous)");
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = engram_shard_route(sh, n, (const int64_t *)(void *)ia.data, (size_t)ia.shape[0],
                            (int32_t *)(void *)oa.data);
    Py_END_ALLOW_THREADS
    if (rc) {
        ext_raise_arg(rc);
        goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    ext_array_release(&ia);
    ext_array_release(&oa);
    PyMem_Free(sh);
    return ret;
}

PyDoc_STRVAR(namespace_usage_doc,
"namespace_usage($module, root, ns, /)\n--\n\n"
"engram_namespace_usage(): (users, stale_leases, last_used_ns, first_user).\n"
"engramstore.namespace_usage() is the friendlier form.");

static PyObject *mod_namespace_usage(PyObject *self, PyObject *args)
{
    PyObject *rootb = NULL, *root_o, *ns_o;
    const char *ns;
    engram_namespace_use u = ENGRAM_NAMESPACE_USE_INIT;
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO", &root_o, &ns_o) || !(ns = ext_str_arg(ns_o, "namespace")) ||
        ext_path_arg(root_o, "root", &rootb) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_namespace_usage(PyBytes_AS_STRING(rootb), ns, &u);
    Py_END_ALLOW_THREADS
    Py_DECREF(rootb);
    if (rc != 0)
        return ext_raise(rc, NULL);
    return Py_BuildValue("(IIKs)", u.users, u.stale_leases, (unsigned long long)u.last_used_ns,
                         u.first_user);
}

/* What engram_namespace_gc() reported, kept while the GIL is released. */
struct gc_list {
    size_t n, cap;
    struct gc_item {
        char *ns, *detail;
        int code;
    } *v;
    int nomem;
};

static void gc_collect(void *ud, const char *ns, int code, const char *detail)
{
    struct gc_list *l = ud;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct gc_item *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->nomem = 1;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].ns = strdup(ns);
    l->v[l->n].detail = strdup(detail ? detail : "");
    l->v[l->n].code = code;
    if (!l->v[l->n].ns || !l->v[l->n].detail) {
        free(l->v[l->n].ns);
        free(l->v[l->n].detail);
        l->nomem = 1;
        return;
    }
    l->n++;
}

PyDoc_STRVAR(namespace_gc_doc,
"namespace_gc($module, root, idle_s, dry_run, /)\n--\n\n"
"engram_namespace_gc(): a list of (namespace, code, detail), code 0 removed\n"
"(or would be), 1 kept, or a negative error.  engramstore.gc() is the\n"
"friendlier form.");

static PyObject *mod_namespace_gc(PyObject *self, PyObject *args)
{
    PyObject *rootb = NULL, *root_o, *idle_o, *res = NULL;
    unsigned long long idle;
    int dry_run, rc;
    struct gc_list l = {0};
    (void)self;
    /* Not "K", which wraps: an age of 2**64 would be 0 seconds, and gc
     * would remove every idle namespace. */
    if (!PyArg_ParseTuple(args, "OO!p", &root_o, &PyLong_Type, &idle_o, &dry_run))
        return NULL;
    idle = PyLong_AsUnsignedLongLong(idle_o);
    if (idle == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (ext_path_arg(root_o, "root", &rootb) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_namespace_gc(PyBytes_AS_STRING(rootb), idle, dry_run ? ENGRAM_GC_DRY_RUN : 0,
                             gc_collect, &l);
    Py_END_ALLOW_THREADS
    Py_DECREF(rootb);
    if (rc != 0)
        ext_raise(rc, NULL);
    else if (l.nomem)
        PyErr_NoMemory();
    else if ((res = PyList_New((Py_ssize_t)l.n)) != NULL)
        for (size_t i = 0; i < l.n; i++) {
            PyObject *t = Py_BuildValue("(sis)", l.v[i].ns, l.v[i].code, l.v[i].detail);
            if (!t) {
                Py_CLEAR(res);
                break;
            }
            PyList_SET_ITEM(res, (Py_ssize_t)i, t);
        }
    for (size_t i = 0; i < l.n; i++) {
        free(l.v[i].ns);
        free(l.v[i].detail);
    }
    free(l.v);
    return res;
}

PyDoc_STRVAR(namespace_list_doc,
"namespace_list($module, root, /)\n--\n\n"
"engram_namespace_list(): the namespaces under root, sorted.");

static PyObject *mod_namespace_list(PyObject *self, PyObject *root_o)
{
    PyObject *rootb = NULL;
    char **names = NULL;
    size_t count = 0;
    int rc;
    (void)self;
    if (ext_path_arg(root_o, "root", &rootb) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_namespace_list(PyBytes_AS_STRING(rootb), &names, &count);
    Py_END_ALLOW_THREADS
    Py_DECREF(rootb);
    if (rc != 0)
        return ext_raise(rc, NULL);
    return ext_names_list(names, count);
}

PyDoc_STRVAR(namespace_remove_doc,
"namespace_remove($module, root, ns, flags, /)\n--\n\n"
"engram_namespace_remove().  engramstore.remove_namespace() is the friendlier\n"
"form.");

static PyObject *mod_namespace_remove(PyObject *self, PyObject *args)
{
    PyObject *rootb = NULL, *root_o, *ns_o;
    const char *ns;
    unsigned int flags;
    int rc;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOI", &root_o, &ns_o, &flags) ||
        !(ns = ext_str_arg(ns_o, "namespace")) || ext_path_arg(root_o, "root", &rootb) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_namespace_remove(PyBytes_AS_STRING(rootb), ns, flags);
    Py_END_ALLOW_THREADS
    Py_DECREF(rootb);
    if (rc != 0)
        return ext_raise(rc, NULL);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"namespace_usage", mod_namespace_usage, METH_VARARGS, namespace_usage_doc},
    {"namespace_gc", mod_namespace_gc, METH_VARARGS, namespace_gc_doc},
    {"namespace_list", mod_namespace_list, METH_O, namespace_list_doc},
    {"namespace_remove", mod_namespace_remove, METH_VARARGS, namespace_remove_doc},
    {"shard_plan", mod_shard_plan, METH_VARARGS, shard_plan_doc},
    {"shard_plan_rows", mod_shard_plan_rows, METH_VARARGS, shard_plan_rows_doc},
    {"shard_route", mod_shard_route, METH_VARARGS, shard_route_doc},
    {"check_capacity", (PyCFunction)(void (*)(void))mod_check_capacity, METH_FASTCALL,
     check_capacity_doc},
    {"strerror", mod_strerror, METH_O, strerror_doc},
    {"_xxh3_64", ext_xxh3_64, METH_O, ext_xxh3_64_doc},
    {"default_root", mod_default_root, METH_NOARGS, default_root_doc},
    {"_check_rows", (PyCFunction)(void (*)(void))ext_check_rows, METH_FASTCALL,
     "_check_rows($module, rows, arg, num_rows, row_bytes, /)\n--\n\n"
     "Checks a layer buffer (argument `arg`: a C-contiguous uint8 [num_rows, row_bytes] "
     "array), copying nothing."},
    {"_source_group", (PyCFunction)(void (*)(void))ext_source_group, METH_FASTCALL,
     ext_source_group_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m)
{
    if (add_exceptions(m) < 0 || add_codes(m) < 0)
        return -1;
    if (PyModule_AddStringConstant(m, "library_version", engram_version_string()) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "DEAD_ID", ENGRAM_DEAD_ID) < 0)
        return -1;
#ifdef ENGRAMSTORE_HAVE_CUDA
    if (PyModule_AddObjectRef(m, "HAVE_CUDA", Py_True) < 0)
        return -1;
#else
    if (PyModule_AddObjectRef(m, "HAVE_CUDA", Py_False) < 0)
        return -1;
#endif
    if (ext_ngram_init(m) < 0 || ext_pending_init(m) < 0 || ext_publication_init(m) < 0)
        return -1;
    return ext_store_init(m);
}

PyDoc_STRVAR(module_doc, "engramstore._engram: the C extension over libengram.  Use the "
                         "engramstore package, which re-exports everything public.");

static PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "engramstore._engram",
    .m_doc = module_doc,
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__engram(void);
PyMODINIT_FUNC PyInit__engram(void)
{
    /* Single-phase init: the exception classes and type are process-wide
     * (the library's error state is too). */
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    if (exec_module(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
