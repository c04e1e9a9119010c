/*
 * ngram.c - engramstore._engram.NgramLayout and NgramHasher: the Engram
 * n-gram hash (engram_ngram_*) for Python.  The package's NgramLayout and
 * NgramHasher (python/engramstore/_ngram.py) wrap them: shapes, numpy
 * arrays, config files and tokenizers are theirs; arguments here are flat.
 *
 * NgramLayout(layer_ids, vocab_size, max_ngram, heads, compressed_vocab,
 *             pad_id, primes=None, multipliers=None)
 *     layer_ids, primes and multipliers are flat sequences of ints.  The
 *     arrays come back as bytes (native int64) from _arrays().
 * NgramHasher(layout, token_map=None)
 *     token_map: a 1-D int32 or int64 array (buffer protocol), copied.
 * NgramHasher.hash(tokens, out, history=None, starts=None,
 *                  history_starts=None, local=False, layer=-1)
 *     tokens (and history): 1-D C-contiguous int32 or int64 of one dtype;
 *     starts and history_starts: 1-D int64 [R + 1] for a ragged batch;
 *     out: writable C-contiguous int32 or int64 of shape (T, L, C), or
 *     (T, C) for one layer.  The GIL is released while it hashes.
 * NgramHasher._lookup(store, layer, tables, tokens, out, history=None,
 *                     zero_dead=False, submit=False)
 *     tokens to rows (engram_ngram_lookup, or its submit: a PendingLookup):
 *     layer an index, tables one name (the layer's table, global ids) or
 *     C names (a table per column, local ids), out writable C-contiguous
 *     uint8 (T, C, row_bytes).
 */
#include "pystore.h"

#include <errno.h>
#include <string.h>

/* starts and history_starts are taken as int64 and handed on as size_t. */
_Static_assert(sizeof(size_t) == sizeof(int64_t), "size_t is 64-bit");

typedef struct {
    PyObject_HEAD
    engram_ngram_layout *lay;
} LayoutObject;

typedef struct {
    PyObject_HEAD
    engram_ngram_hasher *h;
    uint32_t L, C;
} HasherObject;

static PyTypeObject *layout_type; /* for isinstance checks (module lifetime) */

/* A flat sequence of ints `arg` into a new array of n (if *n is 0, any
 * length, returned in *n) int64 (or uint64 with is_unsigned); NULL with an
 * exception. */
static void *int_seq(PyObject *o, const char *arg, int is_unsigned, size_t *n)
{
    PyObject *f = PySequence_Fast(o, "");
    Py_ssize_t len;
    int64_t *out;
    if (!f) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of ints, got %.100s", arg,
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    len = PySequence_Fast_GET_SIZE(f);
    if (*n && (size_t)len != *n) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zu values, got %zd", arg, *n, len);
        Py_DECREF(f);
        return NULL;
    }
    if (!(out = PyMem_Malloc((size_t)(len ? len : 1) * sizeof *out))) {
        Py_DECREF(f);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(f, i), *iv = PyNumber_Index(v);
        int overflow = 0;
        if (!iv) {
            PyErr_Format(PyExc_TypeError, "%s[%zd]: expected an int, got %.100s", arg, i,
                         Py_TYPE(v)->tp_name);
            goto fail;
        }
        if (is_unsigned) {
            unsigned long long u = PyLong_AsUnsignedLongLong(iv);
            if (u == (unsigned long long)-1 && PyErr_Occurred())
                overflow = 1;
            out[i] = (int64_t)u;
        } else {
            out[i] = PyLong_AsLongLongAndOverflow(iv, &overflow);
            if (out[i] == -1 && !overflow && PyErr_Occurred())
                overflow = 1;
        }
        Py_DECREF(iv);
        if (overflow) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s[%zd]: %R does not fit %s", arg, i, v,
                         is_unsigned ? "uint64" : "int64");
            goto fail;
        }
    }
    Py_DECREF(f);
    *n = (size_t)len;
    return out;
fail:
    Py_DECREF(f);
    PyMem_Free(out);
    return NULL;
}

/* ---- NgramLayout ------------------------------------------------------- */

static int Layout_init(LayoutObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"layer_ids", "vocab_size", "max_ngram",   "heads", "compressed_vocab",
                            "pad_id",    "primes",     "multipliers", NULL};
    PyObject *lids = NULL, *vocab = NULL, *maxn = NULL, *heads = NULL, *cv = NULL, *pad = NULL;
    PyObject *primes = Py_None, *mults = Py_None;
    engram_ngram_config c = ENGRAM_NGRAM_CONFIG_INIT;
    unsigned long long u;
    long long pad_id;
    int64_t *ids = NULL, *m = NULL;
    uint64_t *p = NULL;
    size_t nl = 0, np = 0, nm = 0;
    engram_ngram_layout *lay = NULL;
    int rc = -1, err;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOOOOOO:NgramLayout", names, &lids, &vocab,
                                     &maxn, &heads, &cv, &pad, &primes, &mults))
        return -1;
    if (self->lay) {
        PyErr_SetString(PyExc_TypeError, "NgramLayout is initialised already");
        return -1;
    }
    {
        /* Required, by keyword only. */
        PyObject *req[6] = {lids, vocab, maxn, heads, cv, pad};
        for (int i = 0; i < 6; i++)
            if (!req[i]) {
                PyErr_Format(PyExc_TypeError, "NgramLayout() missing required keyword "
                             "argument '%s'", names[i]);
                return -1;
            }
    }
    if (!(ids = int_seq(lids, "layer_ids", 0, &nl)))
        goto out;
    c.num_layers = nl > UINT32_MAX ? UINT32_MAX : (uint32_t)nl;
    c.layer_ids = ids;
    if (ext_uint_arg(vocab, "vocab_size", UINT64_MAX, NULL, &u) < 0)
        goto out;
    c.vocab_size = u;
    if (ext_uint_arg(maxn, "max_ngram", UINT32_MAX, NULL, &u) < 0)
        goto out;
    c.max_ngram = (uint32_t)u;
    if (ext_uint_arg(heads, "heads", UINT32_MAX, NULL, &u) < 0)
        goto out;
    c.heads = (uint32_t)u;
    if (ext_uint_arg(cv, "compressed_vocab", UINT64_MAX, NULL, &u) < 0)
        goto out;
    c.compressed_vocab = u;
    if (ext_uint_arg(pad, "pad_id", INT64_MAX, NULL, &u) < 0)
        goto out;
    pad_id = (long long)u;
    c.pad_id = pad_id;
    if (primes != Py_None) {
        if (!(p = int_seq(primes, "primes", 1, &np)))
            goto out;
        if (np != (size_t)c.num_layers * (c.max_ngram > 0 ? c.max_ngram - 1 : 0) * c.heads) {
            PyErr_Format(PyExc_ValueError, "primes: expected num_layers * (max_ngram - 1) * "
                         "heads = %llu values, got %zu",
                         (unsigned long long)c.num_layers *
                             (c.max_ngram > 0 ? c.max_ngram - 1 : 0) * c.heads,
                         np);
            goto out;
        }
        c.primes = p;
    }
    if (mults != Py_None) {
        if (!(m = int_seq(mults, "multipliers", 0, &nm)))
            goto out;
        if (nm != (size_t)c.num_layers * c.max_ngram) {
            PyErr_Format(PyExc_ValueError, "multipliers: expected num_layers * max_ngram = "
                         "%llu values, got %zu",
                         (unsigned long long)c.num_layers * c.max_ngram, nm);
            goto out;
        }
        c.multipliers = m;
    }
    Py_BEGIN_ALLOW_THREADS
    err = engram_ngram_layout_create(&c, &lay);
    Py_END_ALLOW_THREADS
    if (err) {
        ext_raise_arg(err); /* a bad value: SpecError, a ValueError */
        goto out;
    }
    engram_ngram_layout_destroy(self->lay);
    self->lay = lay;
    rc = 0;
out:
    PyMem_Free(ids);
    PyMem_Free(p);
    PyMem_Free(m);
    return rc;
}

static void Layout_dealloc(LayoutObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    engram_ngram_layout_destroy(self->lay);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static int layout_info(LayoutObject *self, engram_ngram_layout_info *li)
{
    *li = (engram_ngram_layout_info)ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    if (!self->lay) {
        PyErr_SetString(PyExc_ValueError, "NgramLayout was not initialised");
        return -1;
    }
    return engram_get_ngram_layout_info(self->lay, li) == 0 ? 0 : (ext_raise(-EINVAL, NULL), -1);
}

PyDoc_STRVAR(Layout_arrays_doc,
"_arrays($self, /)\n--\n\n"
"(dims, primes, offsets, multipliers, num_rows): dims is (num_layers, max_ngram, heads,\n"
"num_cols, vocab_size, compressed_vocab, pad_id, layer_ids); the others are bytes of\n"
"native int64 ([L*C], [L*C], [L*N], [L]; primes and num_rows are below 2**62).");

static PyObject *Layout_arrays(LayoutObject *self, PyObject *unused)
{
    engram_ngram_layout_info li;
    PyObject *lids;
    size_t lc;
    (void)unused;
    if (layout_info(self, &li) < 0)
        return NULL;
    lc = (size_t)li.num_layers * li.num_cols;
    if (!(lids = PyTuple_New(li.num_layers)))
        return NULL;
    for (uint32_t l = 0; l < li.num_layers; l++) {
        PyObject *v = PyLong_FromLongLong(li.layer_ids[l]);
        if (!v) {
            Py_DECREF(lids);
            return NULL;
        }
        PyTuple_SET_ITEM(lids, l, v);
    }
    return Py_BuildValue("(IIIIKKLN)y#y#y#y#", li.num_layers, li.max_ngram, li.heads,
                         li.num_cols, (unsigned long long)li.vocab_size,
                         (unsigned long long)li.compressed_vocab, (long long)li.pad_id, lids,
                         (const char *)li.primes, (Py_ssize_t)(lc * 8), (const char *)li.offsets,
                         (Py_ssize_t)(lc * 8), (const char *)li.multipliers,
                         (Py_ssize_t)((size_t)li.num_layers * li.max_ngram * 8),
                         (const char *)li.num_rows, (Py_ssize_t)(li.num_layers * 8));
}

static PyMethodDef Layout_methods[] = {
    {"_arrays", (PyCFunction)Layout_arrays, METH_NOARGS, Layout_arrays_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Layout_doc,
"NgramLayout(*, layer_ids, vocab_size, max_ngram, heads, compressed_vocab, pad_id,\n"
"            primes=None, multipliers=None)\n--\n\n"
"The flat C layout behind engramstore.NgramLayout (use that).");

static PyType_Slot Layout_slots[] = {
    {Py_tp_init, Layout_init},
    {Py_tp_dealloc, Layout_dealloc},
    {Py_tp_methods, Layout_methods},
    {Py_tp_doc, (void *)(uintptr_t)Layout_doc},
    {0, NULL},
};

static PyType_Spec Layout_spec = {
    .name = "engramstore._engram.NgramLayout",
    .basicsize = sizeof(LayoutObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = Layout_slots,
};

/* ---- NgramHasher ------------------------------------------------------- */

static int Hasher_init(HasherObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"layout", "token_map", NULL};
    PyObject *layout, *map = Py_None;
    engram_ngram_layout_info li;
    engram_ngram_hasher *h = NULL;
    ext_array ma;
    int64_t *m64 = NULL;
    size_t n = 0;
    int err;

    memset(&ma, 0, sizeof ma);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:NgramHasher", names, &layout, &map))
        return -1;
    if (self->h) {
        /* Lookups submitted with the hasher it has may still use it. */
        PyErr_SetString(PyExc_TypeError, "NgramHasher is initialised already");
        return -1;
    }
    if (!PyObject_TypeCheck(layout, layout_type)) {
        PyErr_Format(PyExc_TypeError, "layout: expected an NgramLayout, got %.100s",
                     Py_TYPE(layout)->tp_name);
        return -1;
    }
    if (layout_info((LayoutObject *)layout, &li) < 0)
        return -1;
    if (map != Py_None) {
        char b[32];
        if (ext_array_get(map, "token_map", 0, &ma) < 0)
            return -1;
        if (ma.kind != EXT_KIND_INT || (ma.itemsize != 4 && ma.itemsize != 8) || ma.ndim != 1) {
            PyErr_Format(PyExc_TypeError, "token_map: expected a 1-D int32 or int64 array, got "
                         "%s with %d dimensions",
                         ext_array_dtype(&ma, b, sizeof b), ma.ndim);
            goto fail;
        }
        n = (size_t)ma.shape[0];
        if (n == 0) {
            PyErr_SetString(PyExc_ValueError, "token_map: empty");
            goto fail;
        }
        if (!(m64 = PyMem_Malloc(n * sizeof *m64))) {
            PyErr_NoMemory();
            goto fail;
        }
        for (size_t i = 0; i < n; i++) {
            const char *e = ma.data + (Py_ssize_t)i * ma.strides[0];
            if (ma.itemsize == 8)
                memcpy(&m64[i], e, 8);
            else {
                int32_t v;
                memcpy(&v, e, 4);
                m64[i] = v;
            }
        }
    }
    Py_BEGIN_ALLOW_THREADS
    err = engram_ngram_hasher_create(((LayoutObject *)layout)->lay, m64, n, &h);
    Py_END_ALLOW_THREADS
    if (err) {
        ext_raise_arg(err);
        goto fail;
    }
    engram_ngram_hasher_destroy(self->h);
    self->h = h;
    self->L = li.num_layers;
    self->C = li.num_cols;
    PyMem_Free(m64);
    ext_array_release(&ma);
    return 0;
fail:
    PyMem_Free(m64);
    ext_array_release(&ma);
    return -1;
}

static void Hasher_dealloc(HasherObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    engram_ngram_hasher_destroy(self->h);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* A 1-D C-contiguous integer array `arg` of itemsize 4 or 8 (want: 0 any,
 * else that itemsize): 0, or -1 with an exception (nothing held). */
static int int_vector(PyObject *o, const char *arg, int want, ext_array *a)
{
    char b[32];
    if (ext_array_get(o, arg, 0, a) < 0)
        return -1;
    if (a->kind != EXT_KIND_INT || (a->itemsize != 4 && a->itemsize != 8) ||
        (want && a->itemsize != want)) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %s", arg,
                     want == 8 ? "int64" : want == 4 ? "int32" : "int32 or int64",
                     ext_array_dtype(a, b, sizeof b));
        goto fail;
    }
    if (a->ndim != 1 || !ext_array_c_contiguous(a)) {
        PyErr_Format(PyExc_ValueError, "%s: expected a contiguous 1-D array, got shape %s", arg,
                     ext_array_shape(a, b, sizeof b));
        goto fail;
    }
    return 0;
fail:
    ext_array_release(a);
    return -1;
}

PyDoc_STRVAR(Hasher_hash_doc,
"hash($self, /, tokens, out, history=None, starts=None, history_starts=None, local=False,\n"
"     layer=-1, threads=0)\n--\n\n"
"Hashes tokens into out (see engramstore.NgramHasher.hash).");

static PyObject *Hasher_hash(HasherObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"tokens", "out", "history", "starts", "history_starts",
                            "local", "layer", "threads", NULL};
    PyObject *tok, *outo, *hist = Py_None, *sto = Py_None, *hsto = Py_None;
    int local = 0, layer = -1, threads = 0, err;
    engram_ngram_hash_args a = ENGRAM_NGRAM_HASH_ARGS_INIT;
    ext_array ta, oa, ha, sa, hsa;
    PyObject *ret = NULL;
    char b[64];
    Py_ssize_t T;

    memset(&ta, 0, sizeof ta);
    memset(&oa, 0, sizeof oa);
    memset(&ha, 0, sizeof ha);
    memset(&sa, 0, sizeof sa);
    memset(&hsa, 0, sizeof hsa);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOpii:hash", names, &tok, &outo, &hist, &sto,
                                     &hsto, &local, &layer, &threads))
        return NULL;
    if (threads < 0) { /* "I" took it modulo 2**32: -1 was 8 threads */
        PyErr_Format(PyExc_ValueError, "threads: expected 0 (automatic) or a count, got %d",
                     threads);
        return NULL;
    }
    if (!self->h) {
        PyErr_SetString(PyExc_ValueError, "NgramHasher was not initialised");
        return NULL;
    }
    if (int_vector(tok, "tokens", 0, &ta) < 0)
        return NULL;
    T = ta.shape[0];
    if (hist != Py_None && int_vector(hist, "history", ta.itemsize, &ha) < 0)
        goto out;
    if (sto != Py_None) {
        if (int_vector(sto, "starts", 8, &sa) < 0)
            goto out;
        if (sa.shape[0] < 2) {
            PyErr_SetString(PyExc_ValueError, "starts: expected at least 2 values (R + 1)");
            goto out;
        }
        for (Py_ssize_t i = 0; i < sa.shape[0]; i++)
            if (((const int64_t *)(void *)sa.data)[i] < 0) {
                PyErr_Format(PyExc_ValueError, "starts[%zd] is negative", i);
                goto out;
            }
        a.num_requests = (size_t)sa.shape[0] - 1;
        a.starts = (const size_t *)(void *)sa.data;
        if (hist != Py_None) {
            if (hsto == Py_None) {
                PyErr_SetString(PyExc_ValueError, "history of a batch needs history_starts");
                goto out;
            }
            if (int_vector(hsto, "history_starts", 8, &hsa) < 0)
                goto out;
            if (hsa.shape[0] != sa.shape[0]) {
                PyErr_Format(PyExc_ValueError, "history_starts: expected %zd values, like "
                             "starts, got %zd",
                             sa.shape[0], hsa.shape[0]);
                goto out;
            }
            for (Py_ssize_t i = 0; i < hsa.shape[0]; i++)
                if (((const int64_t *)(void *)hsa.data)[i] < 0) {
                    PyErr_Format(PyExc_ValueError, "history_starts[%zd] is negative", i);
                    goto out;
                }
            if (((const int64_t *)(void *)hsa.data)[hsa.shape[0] - 1] != ha.shape[0]) {
                PyErr_Format(PyExc_ValueError, "history_starts: the last value must be "
                             "len(history) = %zd", ha.shape[0]);
                goto out;
            }
            a.history_starts = (const size_t *)(void *)hsa.data;
        }
    } else if (hsto != Py_None) {
        PyErr_SetString(PyExc_ValueError, "history_starts goes with starts");
        goto out;
    } else if (hist != Py_None) {
        a.history_len = (size_t)ha.shape[0];
    }
    if (ext_array_get(outo, "out", EXT_WRITABLE, &oa) < 0)
        goto out;
    if (oa.kind != EXT_KIND_INT || (oa.itemsize != 4 && oa.itemsize != 8)) {
        PyErr_Format(PyExc_TypeError, "out: expected int32 or int64, got %s",
                     ext_array_dtype(&oa, b, sizeof b));
        goto out;
    }
    if (layer < -1 || layer >= (int)self->L) {
        PyErr_Format(PyExc_ValueError, "layer: expected -1 (all) or an index below %u, got %d",
                     self->L, layer);
        goto out;
    }
    {
        int ok = ext_array_c_contiguous(&oa) && oa.shape[0] == T &&
                 (layer < 0 ? oa.ndim == 3 && oa.shape[1] == (Py_ssize_t)self->L &&
                                  oa.shape[2] == (Py_ssize_t)self->C
                            : oa.ndim == 2 && oa.shape[1] == (Py_ssize_t)self->C);
        if (!ok) {
            char want[64];
            if (layer < 0)
                PyOS_snprintf(want, sizeof want, "(%zd, %u, %u)", T, self->L, self->C);
            else
                PyOS_snprintf(want, sizeof want, "(%zd, %u)", T, self->C);
            PyErr_Format(PyExc_ValueError, "out: expected a C-contiguous array of shape %s, got "
                         "%s%s",
                         want, ext_array_shape(&oa, b, sizeof b),
                         ext_array_c_contiguous(&oa) ? "" : " (not contiguous)");
            goto out;
        }
    }
    a.flags = local ? ENGRAM_NGRAM_LOCAL : 0;
    a.num_tokens = (size_t)T;
    a.tokens = ta.data;
    a.token_type = ta.itemsize == 8 ? ENGRAM_ID_INT64 : ENGRAM_ID_INT32;
    a.history = hist != Py_None ? ha.data : NULL;
    a.layer = layer;
    a.out = oa.data;
    a.out_type = oa.itemsize == 8 ? ENGRAM_ID_INT64 : ENGRAM_ID_INT32;
    a.threads = (uint32_t)threads;
    Py_BEGIN_ALLOW_THREADS
    err = engram_ngram_hash(self->h, &a);
    Py_END_ALLOW_THREADS
    if (err) {
        ext_raise_arg(err);
        goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    ext_array_release(&ta);
    ext_array_release(&oa);
    ext_array_release(&ha);
    ext_array_release(&sa);
    ext_array_release(&hsa);
    return ret;
}

PyDoc_STRVAR(Hasher_lookup_doc,
"_lookup($self, /, store, layer, tables, tokens, out, history=None, zero_dead=False,\n"
"        submit=False)\n--\n\n"
"Tokens to rows (see engramstore.NgramHasher.lookup).");

static PyObject *Hasher_lookup(HasherObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"store", "layer", "tables", "tokens", "out", "history",
                            "zero_dead", "submit", NULL};
    PyObject *sto, *tabs, *tok, *outo, *hist = Py_None, *ret = NULL;
    int layer, zero_dead = 0, submit = 0, rc;
    engram_table_id tids[ENGRAM_NGRAM_MAX_COLS];
    engram_ngram_hash_args h = ENGRAM_NGRAM_HASH_ARGS_INIT;
    engram_lookup_args look = ENGRAM_LOOKUP_ARGS_INIT;
    engram_pending *pend = NULL;
    ext_array held[3];
    StoreObject *s;
    Py_ssize_t ntab;
    uint32_t R = 0;
    char b[64];

    memset(held, 0, sizeof held);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiOOO|Opp:_lookup", names, &sto, &layer, &tabs,
                                     &tok, &outo, &hist, &zero_dead, &submit))
        return NULL;
    if (!self->h) {
        PyErr_SetString(PyExc_ValueError, "NgramHasher was not initialised");
        return NULL;
    }
    if (!PyObject_TypeCheck(sto, ext_store_type)) {
        PyErr_Format(PyExc_TypeError, "store: expected a TableStore, got %.100s",
                     Py_TYPE(sto)->tp_name);
        return NULL;
    }
    s = (StoreObject *)sto;
    if (layer < 0 || layer >= (int)self->L) {
        PyErr_Format(PyExc_ValueError, "layer: expected an index below %u, got %d", self->L,
                     layer);
        return NULL;
    }
    /* tables: one name, or one per column. */
    if (PyUnicode_Check(tabs)) {
        int mem;
        if (ext_store_resolve(s, tabs, &tids[0], &R, &mem, 0) < 0)
            return NULL;
        ntab = 1;
    } else if (PyList_Check(tabs) || PyTuple_Check(tabs)) {
        ntab = PySequence_Size(tabs);
        if (ntab != (Py_ssize_t)self->C) {
            PyErr_Format(PyExc_ValueError, "tables: expected one name (the layer's table) or "
                         "%u (one per column), got %zd", self->C, ntab);
            return NULL;
        }
        for (Py_ssize_t c = 0; c < ntab; c++) {
            PyObject *name = PySequence_GetItem(tabs, c);
            uint32_t rb;
            int mem, e;
            if (!name)
                return NULL;
            e = ext_store_resolve(s, name, &tids[c], &rb, &mem, c);
            Py_DECREF(name);
            if (e < 0)
                return NULL;
            if (c == 0)
                R = rb;
            else if (rb != R) {
                ext_raise_cls(ext_exc_for(ENGRAM_ELAYOUT), ENGRAM_ELAYOUT,
                              "tables: %zd has rows of %u bytes, the first %u", c, rb, R);
                return NULL;
            }
        }
    } else {
        PyErr_Format(PyExc_TypeError, "tables: expected a table name or a list of them, got "
                     "%.100s", Py_TYPE(tabs)->tp_name);
        return NULL;
    }
    if (int_vector(tok, "tokens", 0, &held[0]) < 0)
        return NULL;
    if (hist != Py_None && int_vector(hist, "history", held[0].itemsize, &held[1]) < 0)
        goto out;
    if (ext_array_get(outo, "out", EXT_WRITABLE, &held[2]) < 0)
        goto out;
    {
        const ext_array *o = &held[2];
        if (o->kind != EXT_KIND_UINT || o->itemsize != 1) {
            PyErr_Format(PyExc_TypeError, "out: expected uint8, got %s",
                         ext_array_dtype(o, b, sizeof b));
            goto out;
        }
        if (o->ndim != 3 || o->shape[0] != held[0].shape[0] ||
            o->shape[1] != (Py_ssize_t)self->C || o->shape[2] != (Py_ssize_t)R ||
            !ext_array_c_contiguous(o)) {
            PyErr_Format(PyExc_ValueError, "out: expected a C-contiguous array of shape (%zd, "
                         "%u, %u), got %s%s",
                         held[0].shape[0], self->C, R, ext_array_shape(o, b, sizeof b),
                         ext_array_c_contiguous(o) ? "" : " (not contiguous)");
            goto out;
        }
    }
    h.num_tokens = (size_t)held[0].shape[0];
    h.tokens = held[0].data;
    h.token_type = held[0].itemsize == 8 ? ENGRAM_ID_INT64 : ENGRAM_ID_INT32;
    if (hist != Py_None) {
        h.history = held[1].data;
        h.history_len = (size_t)held[1].shape[0];
    }
    h.layer = layer;
    look.flags = zero_dead ? ENGRAM_LOOKUP_ZERO_DEAD : 0;
    look.out = held[2].data;
    look.row_bytes = R;
    if (ext_store_enter(s) < 0)
        goto out;
    if (submit) {
        rc = engram_ngram_lookup_submit(s->st, self->h, &h, tids, (size_t)ntab, &look, &pend);
        ext_store_leave(s);
    } else {
        Py_XDECREF(ext_source_take_exception());
        Py_BEGIN_ALLOW_THREADS
        rc = engram_ngram_lookup(s->st, self->h, &h, tids, (size_t)ntab, &look);
        ext_store_leave(s);
        Py_END_ALLOW_THREADS
    }
    if (rc) {
        ext_raise_arg(rc);
        goto out;
    }
    if (submit) {
        /* The pending lookup holds the arrays and this hasher. */
        ret = ext_pending_new(pend, held, 3, -1, NULL, 1, (PyObject *)self, NULL);
        return ret;
    }
    ret = Py_NewRef(Py_None);
out:
    for (int i = 0; i < 3; i++)
        ext_array_release(&held[i]);
    return ret;
}

static PyMethodDef Hasher_methods[] = {
    {"hash", (PyCFunction)(void (*)(void))Hasher_hash, METH_VARARGS | METH_KEYWORDS,
     Hasher_hash_doc},
    {"_lookup", (PyCFunction)(void (*)(void))Hasher_lookup, METH_VARARGS | METH_KEYWORDS,
     Hasher_lookup_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Hasher_doc,
"NgramHasher(layout, token_map=None)\n--\n\n"
"The C hasher behind engramstore.NgramHasher (use that).");

static PyType_Slot Hasher_slots[] = {
    {Py_tp_init, Hasher_init},
    {Py_tp_dealloc, Hasher_dealloc},
    {Py_tp_methods, Hasher_methods},
    {Py_tp_doc, (void *)(uintptr_t)Hasher_doc},
    {0, NULL},
};

static PyType_Spec Hasher_spec = {
    .name = "engramstore._engram.NgramHasher",
    .basicsize = sizeof(HasherObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = Hasher_slots,
};

int ext_ngram_init(PyObject *m)
{
    PyObject *lt, *ht;
    if (!(lt = PyType_FromSpec(&Layout_spec)))
        return -1;
    if (PyModule_AddObjectRef(m, "NgramLayout", lt) < 0) {
        Py_DECREF(lt);
        return -1;
    }
    layout_type = (PyTypeObject *)lt; /* the module's reference keeps it */
    Py_DECREF(lt);
    if (!(ht = PyType_FromSpec(&Hasher_spec)))
        return -1;
    if (PyModule_AddObjectRef(m, "NgramHasher", ht) < 0) {
        Py_DECREF(ht);
        return -1;
    }
    Py_DECREF(ht);
    return 0;
}
