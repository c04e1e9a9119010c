/*
 * pystore.c - engramstore._engram.Store, the type itself: creating, opening,
 * closing and freeing a store, the close guard every method goes through,
 * the parsing of METH_FASTCALL arguments, and the method table of the
 * methods the other pystore_*.c files define (pystore.h describes the object
 * and the guard).
 */
#include "pystore.h"

/* ---- the close guard and argument parsing (see pystore.h) ---------------- */

int ext_store_enter(StoreObject *s)
{
    if (!s->st || atomic_load(&s->closing)) {
        ext_raise_cls(ext_StoreClosedError, ENGRAM_ESTATE, "the store is closed");
        return -1;
    }
    atomic_fetch_add(&s->active, 1);
    return 0;
}

void ext_store_leave(StoreObject *s)
{
    if (atomic_fetch_sub(&s->active, 1) == 1 && atomic_load(&s->closing)) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

int ext_store_parse_args(const char *fn, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames, const char *const *names, int nnames, int npos,
                         int nreq, PyObject **vals)
{
    for (int i = 0; i < nnames; i++)
        vals[i] = NULL;
    if (nargs > npos) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)",
                     fn, npos, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        vals[i] = args[i];
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t j = 0; j < nk; j++) {
            PyObject *kw = PyTuple_GET_ITEM(kwnames, j);
            int i;
            for (i = 0; i < nnames; i++)
                if (PyUnicode_CompareWithASCIIString(kw, names[i]) == 0)
                    break;
            if (i == nnames) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fn,
                             kw);
                return -1;
            }
            if (vals[i]) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fn,
                             names[i]);
                return -1;
            }
            vals[i] = args[nargs + j];
        }
    }
    for (int i = 0; i < nreq; i++)
        if (!vals[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fn, names[i]);
            return -1;
        }
    return 0;
}

/* ---- open and close ---------------------------------------------------- */

PyDoc_STRVAR(close_doc,
"close($self, /)\n--\n\n"
"Closes the store: waits for lookups running in other threads to finish, then\n"
"unmaps every table and releases bound arrays.  Later calls raise\n"
"StoreClosedError.  Closing twice is allowed.");

static PyObject *Store_close(StoreObject *s, PyObject *unused)
{
    (void)unused;
    if (!s->st)
        Py_RETURN_NONE;
    if (ext_source_active())
        /* The lookup that called the source is counted in `active`: the
         * wait below would be for this very thread. */
        return ext_raise_cls(ext_exc_for(ENGRAM_ESTATE), ENGRAM_ESTATE,
                             "close() called from inside a source's read_rows");
    atomic_store(&s->closing, 1);
    s->gen++; /* ids resolved meanwhile are not to be cached */
    if (atomic_load(&s->active) > 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&s->mu);
        while (atomic_load(&s->active) > 0)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        Py_END_ALLOW_THREADS
    }
    if (!s->st) /* another thread's close() got here first */
        Py_RETURN_NONE;
    {
        /* Detach everything before the GIL is released again: a second
         * close() (or cuda_check()) arriving meanwhile must find the
         * store closed, not close the same context twice. */
        engram_store *st = s->st;
#ifdef ENGRAMSTORE_HAVE_CUDA
        ext_cuda *c = s->cuda;
        s->cuda = NULL;
#endif
        s->st = NULL;
#ifdef ENGRAMSTORE_HAVE_CUDA
        ext_cuda_close(c);
#endif
        Py_BEGIN_ALLOW_THREADS
        engram_store_close(st);
        Py_END_ALLOW_THREADS
    }
    PyDict_Clear(s->tables);
    ext_store_memo_clear(s);
    if (PyList_SetSlice(s->holds, 0, PyList_GET_SIZE(s->holds), NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Store_enter(StoreObject *s, PyObject *unused)
{
    (void)unused;
    if (!s->st)
        return ext_raise_cls(ext_StoreClosedError, ENGRAM_ESTATE, "the store is closed");
    return Py_NewRef((PyObject *)s);
}

static PyObject *Store_exit(StoreObject *s, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    return Store_close(s, NULL);
}

static PyObject *Store_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    StoreObject *s = (StoreObject *)type->tp_alloc(type, 0);
    (void)args;
    (void)kw;
    if (!s)
        return NULL;
    s->tables = PyDict_New();
    s->declared = PyDict_New();
    s->holds = PyList_New(0);
    s->path = Py_NewRef(Py_None);
    atomic_init(&s->active, 0);
    atomic_init(&s->closing, 0);
    if (!s->tables || !s->declared || !s->holds) {
        Py_DECREF(s);
        return NULL;
    }
    if (pthread_mutex_init(&s->mu, NULL) != 0 || pthread_cond_init(&s->cv, NULL) != 0) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    s->sync_ready = 1;
    return (PyObject *)s;
}

/* The NUMA placement keywords into *o (their strings stay owned by the
 * argument objects, which outlive the open): 0, or -1 with TypeError or
 * ValueError raised. */
static int numa_args(PyObject *node, PyObject *gpu, PyObject *il, engram_store_options *o)
{
    int given = (node != Py_None) + (gpu != Py_None) + (il != Py_None && il != Py_False);
    if (given > 1) {
        PyErr_SetString(PyExc_ValueError,
                        "numa_node, numa_gpu and numa_interleave: give one placement");
        return -1;
    }
    if (node != Py_None) {
        int v;
        if (ext_numa_node_arg(node, "numa_node", &v) < 0)
            return -1;
        o->numa_policy = ENGRAM_NUMA_NODE;
        o->numa_node = v;
    } else if (gpu != Py_None) {
        if (!PyUnicode_Check(gpu)) {
            PyErr_Format(PyExc_TypeError, "numa_gpu: expected a str (a PCI bus id such as "
                                          "'0000:3b:00.0'), got %.100s",
                         Py_TYPE(gpu)->tp_name);
            return -1;
        }
        if (!(o->numa_gpu = ext_utf8_arg(gpu, "numa_gpu")))
            return -1;
        o->numa_policy = ENGRAM_NUMA_NODE;
        o->numa_node = -1;
    } else if (il == Py_True) {
        o->numa_policy = ENGRAM_NUMA_INTERLEAVE;
    } else if (il != Py_None && il != Py_False) {
        if (!PyUnicode_Check(il)) {
            PyErr_Format(PyExc_TypeError, "numa_interleave: expected True or a node list "
                                          "such as '0-1', got %.100s",
                         Py_TYPE(il)->tp_name);
            return -1;
        }
        if (!(o->numa_nodes = ext_utf8_arg(il, "numa_interleave")))
            return -1;
        o->numa_policy = ENGRAM_NUMA_INTERLEAVE;
    }
    return 0;
}

static int Store_init(StoreObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"namespace", "local_dir", "create", "prefault", "random",
                             "huge_pages", "mlock", "verify", "timing", "group", "threads",
                             "file_cache", "cache_bytes", "queue_depth", "redis", "redis_user",
                             "redis_password", "redis_tagged", "redis_chunk_bytes",
                             "redis_timeout_ms", "numa_node", "numa_gpu", "numa_interleave",
                             "numa_local", "cache_keep_all", "redis_local_dir", NULL};
    PyObject *ns = Py_None, *dir = NULL, *dirb = NULL, *cb = NULL, *qd = NULL;
    PyObject *redis = Py_None, *ruser = Py_None, *rpass = Py_None, *rchunk = NULL, *rto = NULL;
    PyObject *nnode = Py_None, *ngpu = Py_None, *nil = Py_None, *rlocal = Py_None,
             *rlocalb = NULL;
    int create = 1, prefault = 0, rnd = 0, huge = 0, mlck = 0, verify = 0, timing = 0,
        group = 0, threads = 0, fcache = 0, rtagged = 0, nlocal = 0, keepall = 0, rc;
    unsigned long long cache_bytes = 0, queue_depth = 0, chunk_bytes = 0, timeout_ms = 0;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    const char *cns = NULL, *cdir = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO$ppppppppipOOOOOpOOOOOppO:EngramStore", kwlist,
                                     &ns, &dir, &create, &prefault, &rnd, &huge, &mlck, &verify,
                                     &timing, &group, &threads, &fcache, &cb, &qd, &redis, &ruser,
                                     &rpass, &rtagged, &rchunk, &rto, &nnode, &ngpu, &nil,
                                     &nlocal, &keepall, &rlocal))
        return -1;
    if (numa_args(nnode, ngpu, nil, &o) < 0)
        return -1;
    if ((rchunk && ext_uint_arg(rchunk, "redis_chunk_bytes", 512u << 20, " (0 = 1 MiB)",
                                &chunk_bytes) < 0) ||
        (rto && ext_uint_arg(rto, "redis_timeout_ms", UINT32_MAX, " (0 = 5000)", &timeout_ms) < 0))
        return -1;
    /* "K" and "I" would wrap -1 or 2**32 + 1 into another value silently. */
    if ((cb && ext_uint_arg(cb, "cache_bytes", UINT64_MAX, " (0 = 256 MiB)", &cache_bytes) < 0) ||
        (qd && ext_uint_arg(qd, "queue_depth", ENGRAM_QUEUE_DEPTH_MAX, " (0 = 64)",
                            &queue_depth) < 0))
        return -1;
    if (s->st || atomic_load(&s->closing)) {
        PyErr_SetString(PyExc_RuntimeError, "EngramStore.__init__ called twice");
        return -1;
    }
    if (threads < 0) {
        PyErr_Format(PyExc_ValueError, "threads: expected >= 0 (0 = one per CPU), got %d",
                     threads);
        return -1;
    }
    o.flags = (create ? ENGRAM_OPEN_CREATE : 0) | (prefault ? ENGRAM_OPEN_PREFAULT : 0) |
              (rnd ? ENGRAM_OPEN_RANDOM : 0) | (huge ? ENGRAM_OPEN_PRIVATE_HUGE : 0) |
              (mlck ? ENGRAM_OPEN_MLOCK : 0) | (verify ? ENGRAM_OPEN_VERIFY : 0) |
              (timing ? ENGRAM_OPEN_TIMING : 0) | (group ? ENGRAM_OPEN_GROUP : 0) |
              (fcache ? ENGRAM_OPEN_FILE_CACHE : 0) | (nlocal ? ENGRAM_OPEN_NUMA_LOCAL : 0) |
              (keepall ? ENGRAM_OPEN_CACHE_KEEP_ALL : 0);
    o.threads = threads;
    o.cache_bytes = cache_bytes;
    o.queue_depth = (uint32_t)queue_depth;
    if (redis != Py_None) {
        engram_redis_options ro = ENGRAM_REDIS_OPTIONS_INIT;
        const char *cnodes;
        if (!PyUnicode_Check(redis) || !PyUnicode_Check(ns) ||
            (ruser != Py_None && !PyUnicode_Check(ruser)) ||
            (rpass != Py_None && !PyUnicode_Check(rpass))) {
            PyErr_SetString(PyExc_TypeError, "redis, namespace, redis_user and redis_password: "
                                             "expected str (the user and password may be None)");
            return -1;
        }
        if (dir && dir != Py_None) {
            PyErr_SetString(PyExc_ValueError,
                            "local_dir: a namespace in a Redis Cluster (redis=) has no directory");
            return -1;
        }
        if (!(cnodes = ext_utf8_arg(redis, "redis")) || !(cns = ext_utf8_arg(ns, "namespace")) ||
            (ruser != Py_None && !(ro.user = ext_utf8_arg(ruser, "redis_user"))) ||
            (rpass != Py_None && !(ro.password = ext_utf8_arg(rpass, "redis_password"))))
            return -1;
        ro.flags = rtagged ? ENGRAM_REDIS_TAGGED : 0;
        ro.chunk_bytes = chunk_bytes;
        ro.timeout_ms = (uint32_t)timeout_ms;
        if (rlocal != Py_None) {
            if (ext_path_arg(rlocal, "redis_local_dir", &rlocalb) < 0)
                return -1;
            ro.local_root = PyBytes_AS_STRING(rlocalb);
        }
        Py_BEGIN_ALLOW_THREADS
        rc = engram_store_open_redis(cnodes, cns, &o, &ro, &st);
        Py_END_ALLOW_THREADS
        Py_XDECREF(rlocalb);
        if (rc < 0) {
            ext_raise(rc, "open");
            return -1;
        }
        Py_SETREF(s->path, PyUnicode_FromFormat("redis://%s/%s", cnodes, cns));
    } else if (rtagged || rchunk || rto || ruser != Py_None || rpass != Py_None ||
               rlocal != Py_None) {
        PyErr_SetString(PyExc_TypeError, "redis_user, redis_password, redis_tagged, "
                                         "redis_chunk_bytes, redis_timeout_ms, redis_local_dir: "
                                         "only with redis=");
        return -1;
    } else if (dir == Py_None) {
        if (ns != Py_None) {
            PyErr_SetString(PyExc_ValueError,
                            "namespace: a memory-only store (local_dir=None) has no namespace");
            return -1;
        }
        Py_BEGIN_ALLOW_THREADS
        rc = engram_store_open_memory(&o, &st);
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            ext_raise(rc, "open");
            return -1;
        }
        Py_SETREF(s->path, PyUnicode_FromString("<memory>"));
    } else {
        if (!PyUnicode_Check(ns)) {
            PyErr_Format(PyExc_TypeError, "namespace: expected a str, got %.100s",
                         Py_TYPE(ns)->tp_name);
            return -1;
        }
        if (!(cns = ext_utf8_arg(ns, "namespace")))
            return -1;
        if (dir) {
            if (ext_path_arg(dir, "local_dir", &dirb) < 0)
                return -1;
            cdir = PyBytes_AS_STRING(dirb);
        }
        Py_BEGIN_ALLOW_THREADS
        rc = engram_store_open(cdir, cns, &o, &st);
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            ext_raise(rc, "open");
            Py_XDECREF(dirb);
            return -1;
        }
        Py_SETREF(s->path, PyUnicode_FromFormat("%s/%s", cdir ? cdir : engram_default_root(), cns));
        Py_XDECREF(dirb);
    }
    s->st = st;
    return s->path ? 0 : -1;
}

static void Store_dealloc(StoreObject *s)
{
    PyTypeObject *tp = Py_TYPE(s);
    /* No other thread can be inside a method: each holds a reference. */
#ifdef ENGRAMSTORE_HAVE_CUDA
    ext_cuda_close(s->cuda);
    s->cuda = NULL;
#endif
    if (s->st) {
        engram_store_close(s->st);
        s->st = NULL;
    }
    ext_store_memo_clear(s);
    Py_CLEAR(s->tables);
    Py_CLEAR(s->declared);
    Py_CLEAR(s->holds);
    Py_CLEAR(s->path);
    if (s->sync_ready) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    tp->tp_free((PyObject *)s);
    Py_DECREF(tp);
}

static PyObject *Store_repr(StoreObject *s)
{
    return PyUnicode_FromFormat("<%s %R%s>", Py_TYPE(s)->tp_name, s->path,
                                s->st ? "" : " (closed)");
}

static PyObject *Store_get_closed(StoreObject *s, void *unused)
{
    (void)unused;
    return PyBool_FromLong(s->st == NULL);
}

static PyObject *Store_get_path(StoreObject *s, void *unused)
{
    (void)unused;
    return Py_NewRef(s->path);
}

/* The methods of pystore.c and, through pystore.h, of the other pystore_*.c
 * files. */
static PyMethodDef Store_methods[] = {
    {"cuda_check", (PyCFunction)ext_store_cuda_check, METH_NOARGS, ext_store_cuda_check_doc},
    {"lookup_async", (PyCFunction)(void (*)(void))ext_store_lookup_async,
     METH_FASTCALL | METH_KEYWORDS, ext_store_lookup_async_doc},
    {"lookup", (PyCFunction)(void (*)(void))ext_store_lookup, METH_FASTCALL | METH_KEYWORDS,
     ext_store_lookup_doc},
    {"_lookup_layer", (PyCFunction)(void (*)(void))ext_store_lookup_layer, METH_FASTCALL,
     ext_store_lookup_layer_doc},
    {"_layer_lookup", (PyCFunction)(void (*)(void))ext_store_layer_lookup, METH_FASTCALL,
     ext_store_layer_lookup_doc},
    {"_bench_lookup", (PyCFunction)(void (*)(void))ext_store_bench_lookup, METH_FASTCALL,
     ext_store_bench_lookup_doc},
    {"populate", (PyCFunction)(void (*)(void))ext_store_populate, METH_FASTCALL | METH_KEYWORDS,
     ext_store_populate_doc},
    {"populate_shared", (PyCFunction)(void (*)(void))ext_store_populate_shared,
     METH_FASTCALL | METH_KEYWORDS, ext_store_populate_shared_doc},
    {"wait_for", (PyCFunction)(void (*)(void))ext_store_wait_for, METH_FASTCALL | METH_KEYWORDS,
     ext_store_wait_for_doc},
    {"bind", (PyCFunction)(void (*)(void))ext_store_bind, METH_FASTCALL | METH_KEYWORDS,
     ext_store_bind_doc},
    {"define", (PyCFunction)(void (*)(void))ext_store_define, METH_FASTCALL | METH_KEYWORDS,
     ext_store_define_doc},
    {"open_safetensors", (PyCFunction)(void (*)(void))ext_store_open_safetensors,
     METH_FASTCALL | METH_KEYWORDS, ext_store_open_safetensors_doc},
    {"_add_source", (PyCFunction)(void (*)(void))ext_store_add_source,
     METH_FASTCALL | METH_KEYWORDS, ext_store_add_source_doc},
    {"get_table_spec", (PyCFunction)ext_store_get_table_spec, METH_O,
     ext_store_get_table_spec_doc},
    {"list_tables", (PyCFunction)ext_store_list_tables, METH_NOARGS, ext_store_list_tables_doc},
    {"remove", (PyCFunction)ext_store_remove, METH_O, ext_store_remove_doc},
    {"verify", (PyCFunction)ext_store_verify, METH_O, ext_store_verify_doc},
    {"pull", (PyCFunction)(void (*)(void))ext_store_pull, METH_FASTCALL | METH_KEYWORDS,
     ext_store_pull_doc},
    {"check_origin", (PyCFunction)(void (*)(void))ext_store_check_origin,
     METH_FASTCALL | METH_KEYWORDS, ext_store_check_origin_doc},
    {"_pull_rows", (PyCFunction)(void (*)(void))ext_store_pull_rows,
     METH_FASTCALL | METH_KEYWORDS, ext_store_pull_rows_doc},
    {"stats", (PyCFunction)ext_store_stats, METH_NOARGS, ext_store_stats_doc},
    {"usage", (PyCFunction)ext_store_usage, METH_O, ext_store_usage_doc},
    {"placement", (PyCFunction)ext_store_placement, METH_O, ext_store_placement_doc},
    {"numa_copy", (PyCFunction)(void (*)(void))ext_store_numa_copy,
     METH_FASTCALL | METH_KEYWORDS, ext_store_numa_copy_doc},
    {"close", (PyCFunction)Store_close, METH_NOARGS, close_doc},
    {"__enter__", (PyCFunction)Store_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nReturns the store, for `with`."},
    {"__exit__", (PyCFunction)(void (*)(void))Store_exit, METH_FASTCALL,
     "__exit__($self, /, *exc_info)\n--\n\nCloses the store (see close())."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Store_getset[] = {
    {"closed", (getter)Store_get_closed, NULL, "True once close() has run.", NULL},
    {"path", (getter)Store_get_path, NULL, "root/namespace, or '<memory>'.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(Store_doc,
"Store(namespace=None, local_dir=None, *, create=True, prefault=False, random=False, "
"huge_pages=False, mlock=False, verify=False, timing=False, group=False, threads=0, "
"file_cache=False, cache_bytes=0, queue_depth=0, redis=None, redis_user=None, "
"redis_password=None, redis_tagged=False, redis_chunk_bytes=0, redis_timeout_ms=0, "
"numa_node=None, numa_gpu=None, numa_interleave=None, numa_local=False, "
"cache_keep_all=False, redis_local_dir=None)\n--\n\n"
"One namespace of tables: the directory local_dir/namespace (local_dir None with\n"
"a namespace: the default root), or, with local_dir=None and namespace=None, a\n"
"memory-only store that serves bound arrays, or, with redis='host:port,...',\n"
"namespace of that Redis Cluster.  Use engramstore.EngramStore.");

static PyType_Slot Store_slots[] = {
    {Py_tp_new, Store_new},
    {Py_tp_init, Store_init},
    {Py_tp_dealloc, Store_dealloc},
    {Py_tp_repr, Store_repr},
    {Py_tp_methods, Store_methods},
    {Py_tp_getset, Store_getset},
    {Py_tp_doc, (void *)(uintptr_t)Store_doc},
    {0, NULL},
};

static PyType_Spec Store_spec = {
    .name = "engramstore._engram.Store",
    .basicsize = sizeof(StoreObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = Store_slots,
};

PyTypeObject *ext_store_type;

int ext_store_init(PyObject *m)
{
    PyObject *t;
    if (ext_layer_lookup_module_init(m) < 0 || !(t = PyType_FromSpec(&Store_spec)))
        return -1;
    ext_store_type = (PyTypeObject *)t; /* the module's reference keeps it */
    if (PyModule_AddObjectRef(m, "Store", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    Py_DECREF(t);
    return 0;
}
