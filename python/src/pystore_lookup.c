/*
 * pystore_lookup.c - Store.lookup() and Store._lookup_layer(): resolving the
 * named tables (through the memo of the last lookups' name lists, else
 * ext_store_resolve()), checking the ids/out/offsets arrays and their
 * layouts, and running the lookup on the host or, for GPU arrays, through
 * cuda.c; and the bad-id errors of both paths, cuda_check() included.
 */
#include "pystore.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#ifdef ENGRAMSTORE_HAVE_CUDA
#include <engram_cuda.h>
#endif

/* Lookups of memory tables of at most this many rows keep the GIL. */
#define EXT_HOLD_GIL_ROWS 256

/* ---- the memo ---------------------------------------------------------- */

/* Drops an entry taken out of the memo: its names (which may run Python
 * code: a str subclass's __del__, which may look up and fill the memo
 * again) and its block. */
static void memo_drop(ext_store_memo e)
{
    for (Py_ssize_t i = 0; i < e.k; i++)
        Py_DECREF(e.names[i]);
    PyMem_Free(e.names);
}

/* The entry of exactly these K > 0 name objects, or NULL. */
static const ext_store_memo *memo_find(StoreObject *s, PyObject *const *names, Py_ssize_t K)
{
    int i = s->memo_last;
    for (int j = 0; j < EXT_STORE_MEMOS; j++, i = i + 1 < EXT_STORE_MEMOS ? i + 1 : 0) {
        const ext_store_memo *e = &s->memo[i];
        /* The pointers compared as bytes: K of them in a few vector
         * compares. */
        if (e->k == K && e->names[0] == names[0] &&
            memcmp(e->names, names, (size_t)K * sizeof *names) == 0) {
            s->memo_last = i;
            return e;
        }
    }
    return NULL;
}

/* Memoizes k > 0 names (references stolen) and their ids in place of the
 * entry set longest ago.  Out of memory, nothing is memoized (and no
 * exception raised): the next lookup resolves the names again. */
static void memo_add(StoreObject *s, PyObject *const *names, Py_ssize_t k,
                     const engram_table_id *ids, uint32_t R, int memory)
{
    int i = s->memo_next;
    ext_store_memo old = s->memo[i], *e = &s->memo[i];
    PyObject **blk = PyMem_Malloc((size_t)k * (sizeof *names + sizeof *ids));
    if (!blk) {
        for (Py_ssize_t j = 0; j < k; j++)
            Py_DECREF(names[j]);
        return;
    }
    memcpy(blk, names, (size_t)k * sizeof *names);
    e->names = blk;
    e->ids = (engram_table_id *)(void *)(blk + k);
    memcpy(e->ids, ids, (size_t)k * sizeof *ids);
    e->k = k;
    e->R = R;
    e->memory = memory;
    s->memo_last = i;
    s->memo_next = i + 1 < EXT_STORE_MEMOS ? i + 1 : 0;
    memo_drop(old);
}

void ext_store_memo_clear(StoreObject *s)
{
    for (int i = 0; i < EXT_STORE_MEMOS; i++) {
        ext_store_memo old = s->memo[i];
        s->memo[i].k = 0;
        s->memo[i].names = NULL;
        s->memo[i].ids = NULL;
        memo_drop(old);
    }
}

/* ---- lookup ------------------------------------------------------------ */

/* Collapses dims [0, lead) of `a` into one stride: 0 and *n, *stride, or -1
 * with ValueError if they are not evenly spaced. */
static int collapse_lead(const ext_array *a, int lead, const char *arg, Py_ssize_t *n,
                         Py_ssize_t *stride)
{
    Py_ssize_t cnt = 1, st = 0;
    int have = 0;
    for (int i = 0; i < lead; i++)
        if (a->shape[i] == 0) {
            *n = 0;
            *stride = 0;
            return 0;
        }
    for (int i = lead - 1; i >= 0; i--) {
        if (a->shape[i] == 1)
            continue;
        if (!have) {
            st = a->strides[i];
            have = 1;
        } else if (a->strides[i] != st * cnt) {
            PyErr_Format(PyExc_ValueError,
                         "%s: its leading dimensions cannot be flattened into one (a view "
                         "with stride[0] == shape[1] * stride[1] is needed)",
                         arg);
            return -1;
        }
        cnt *= a->shape[i];
    }
    *n = cnt;
    *stride = st;
    return 0;
}

/* Gives the exception being raised the bad id's `position` (a tuple of
 * indices into the caller's ids array) and `id` (its value), references
 * stolen; None for both when not known. */
static void bad_id_attrs(PyObject *position, PyObject *v)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (!value || !position || !v || PyObject_SetAttrString(value, "position", position) < 0 ||
        PyObject_SetAttrString(value, "id", v) < 0) {
        /* Out of memory: that is the error now. */
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_XDECREF(position);
        Py_XDECREF(v);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return;
    }
    Py_DECREF(position);
    Py_DECREF(v);
    PyErr_Restore(type, value, tb);
}

/* Raises BadIdError for a host lookup's first bad id (engram_last_bad_id()).
 * The library names it by its place in the flattened [T, K] batch,
 * "ids[t][k] = ..."; the layer API's caller passed row_ids [B, L, H] (lead
 * 2), so it is named there, "row_ids[b][l][h] = ...", and its `position`
 * is (b, l, h); else (t, k). */
void ext_store_raise_bad_id(int rc, const ext_array *ids, const char *arg, int lead)
{
    engram_bad_id b = ENGRAM_BAD_ID_INIT;
    const char *msg = engram_errmsg();
    unsigned long long t, k, L = lead == 2 ? (unsigned long long)ids->shape[1] : 0;
    char head[64];
    int n;
    if (engram_last_bad_id(&b) != 0) {
        ext_raise(rc, NULL);
        return;
    }
    t = b.token;
    k = b.col;
    n = snprintf(head, sizeof head, "ids[%llu][%llu]", t, k);
    if (L == 0) {
        ext_raise(rc, NULL);
        bad_id_attrs(Py_BuildValue("(KK)", t, k), PyLong_FromLongLong(b.id));
        return;
    }
    if (n > 0 && strncmp(msg, head, (size_t)n) == 0)
        ext_raise_cls(ext_exc_for(rc), rc, "%s[%llu][%llu][%llu]%s", arg, t / L, t % L, k,
                      msg + n);
    else
        ext_raise(rc, NULL);
    bad_id_attrs(Py_BuildValue("(KKK)", t / L, t % L, k), PyLong_FromLongLong(b.id));
}

typedef struct lookup_in {
    PyObject *tables, *ids, *offsets, *stream;
    PyObject *out;   /* NULL or None: a new output is made (host ids only) */
    PyObject *layer; /* the layer API's layer id, for messages, or NULL */
    int zero_dead;
    int lead;       /* leading token dimensions: 1 ([T, K]) or 2 ([B, L, H]) */
    int ids_contig; /* require C-contiguous ids */
    const char *ids_arg, *out_arg;
} lookup_in;

/* The [T, K] form that lookup(), lookup_async() and _bench_lookup() take,
 * without a stream: -1 with an exception if zero_dead's truth fails. */
static int lookup_in_tk(lookup_in *in, PyObject *tables, PyObject *ids, PyObject *out,
                        PyObject *offsets, PyObject *zero_dead)
{
    *in = (lookup_in){.tables = tables, .ids = ids, .out = out, .offsets = offsets, .lead = 1,
                      .ids_arg = "ids", .out_arg = "out"};
    return zero_dead && (in->zero_dead = PyObject_IsTrue(zero_dead)) < 0 ? -1 : 0;
}

/* A lookup whose tables are resolved and whose arrays are checked and
 * held: filled by lookup_prepare(), run by lookup_run(), released by
 * lookup_release(). */
typedef struct lookup_prep {
    engram_lookup_args a;
    engram_table_id tid_stack[EXT_STORE_STACK_COLS];
    int64_t off_stack[EXT_STORE_STACK_COLS];
    int64_t *heap; /* offsets then table ids, for K > EXT_STORE_STACK_COLS */
    ext_array ids, out, oa;
    PyObject *made; /* the output made for an `out` not given, or NULL */
    Py_ssize_t T, K;
    int memory; /* every table named has memory rows */
} lookup_prep;

static void lookup_release(lookup_prep *p)
{
    Py_CLEAR(p->made);
    ext_array_release(&p->oa);
    ext_array_release(&p->out);
    ext_array_release(&p->ids);
    PyMem_Free(p->heap);
    p->heap = NULL;
}

/* Resolves the p->K tables of in->tables into tids[] (the memo, else
 * ext_store_resolve()), their row size into *R and p->memory.  0, or -1
 * with an exception. */
static int lookup_resolve(StoreObject *s, const lookup_in *in, lookup_prep *p,
                          engram_table_id *tids, uint32_t *R)
{
    PyObject *rn[EXT_STORE_STACK_COLS]; /* the names resolved, held (K <= that) */
    Py_ssize_t nrn = 0, K = p->K;
    uint64_t gen = s->gen;
    const ext_store_memo *e;
    int ret = -1;

    if (K > 0 && K <= EXT_STORE_STACK_COLS &&
        (e = memo_find(s, PySequence_Fast_ITEMS(in->tables), K))) {
        memcpy(tids, e->ids, (size_t)K * sizeof *tids);
        *R = e->R;
        p->memory = e->memory;
        return 0;
    }
    p->memory = 1;
    for (Py_ssize_t k = 0; k < K; k++) {
        PyObject *name;
        uint32_t rb;
        int mem, rc;
        /* The list may change while a table is being opened (the GIL is
         * released there): re-read its length each time, and hold the
         * names resolved, to check them and memoize them with their ids. */
        if (k >= PySequence_Fast_GET_SIZE(in->tables)) {
            PyErr_SetString(PyExc_RuntimeError, "tables: the list changed during the lookup");
            goto out;
        }
        name = Py_NewRef(PySequence_Fast_GET_ITEM(in->tables, k));
        rc = ext_store_resolve(s, name, &tids[k], &rb, &mem, k);
        p->memory &= mem;
        if (K <= EXT_STORE_STACK_COLS)
            rn[nrn++] = name;
        else
            Py_DECREF(name);
        if (rc < 0)
            goto out;
        if (k == 0)
            *R = rb;
    }
    if (K != PySequence_Fast_GET_SIZE(in->tables)) {
        PyErr_SetString(PyExc_RuntimeError, "tables: the list changed during the lookup");
        goto out;
    }
    for (Py_ssize_t k = 0; k < nrn; k++)
        if (PySequence_Fast_GET_ITEM(in->tables, k) != rn[k]) {
            PyErr_SetString(PyExc_RuntimeError, "tables: the list changed during the lookup");
            goto out;
        }
    ret = 0;
    /* Memoize the names with the ids they resolved to, unless remove() or
     * close() ran meanwhile (an id may be a removed table's). */
    if (K > 0 && K <= EXT_STORE_STACK_COLS && s->gen == gen) {
        memo_add(s, rn, K, tids, *R, p->memory);
        nrn = 0; /* the memo took the names */
    }
out:
    for (Py_ssize_t k = 0; k < nrn; k++)
        Py_DECREF(rn[k]);
    return ret;
}

/* The K offsets of `obj` into offs[]: an array of any integer dtype (any
 * stride, through *oa, which the caller releases), or a sequence of ints
 * (list, tuple, range).  Booleans and floats are refused rather than
 * converted: an offset is a row number.  0, or -1 with TypeError or
 * ValueError naming the argument. */
static int lookup_offsets(PyObject *obj, Py_ssize_t K, int64_t *offs, ext_array *oa)
{
    char b1[64];
    if (!PyObject_CheckBuffer(obj) && !PyObject_HasAttrString(obj, "__dlpack__") &&
        !PyObject_HasAttrString(obj, "__cuda_array_interface__") && PySequence_Check(obj) &&
        !PyUnicode_Check(obj)) {
        PyObject *seq = PySequence_Fast(obj, "offsets: expected a sequence of ints");
        int ret = -1;
        if (!seq)
            return -1;
        if (PySequence_Fast_GET_SIZE(seq) != K) {
            PyErr_Format(PyExc_ValueError, "offsets: expected %zd values (one per table), "
                         "got %zd", K, PySequence_Fast_GET_SIZE(seq));
            goto seq_out;
        }
        for (Py_ssize_t k = 0; k < K; k++) {
            PyObject *item = PySequence_Fast_GET_ITEM(seq, k), *v;
            int overflow;
            /* A float has no __index__; numpy's bool has one that raises
             * TypeError: both are named here as what they are. */
            if (PyBool_Check(item) || !PyIndex_Check(item) || !(v = PyNumber_Index(item))) {
                if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError))
                    goto seq_out;
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "offsets[%zd]: expected an int, got %.100s", k,
                             Py_TYPE(item)->tp_name);
                goto seq_out;
            }
            offs[k] = PyLong_AsLongLongAndOverflow(v, &overflow);
            Py_DECREF(v);
            if (overflow) {
                PyErr_Format(PyExc_ValueError, "offsets[%zd]: %R is outside int64", k, item);
                goto seq_out;
            }
            if (offs[k] == -1 && PyErr_Occurred())
                goto seq_out;
        }
        ret = 0;
    seq_out:
        Py_DECREF(seq);
        return ret;
    }
    if (ext_array_get(obj, "offsets", 0, oa) < 0)
        return -1;
    if ((oa->kind != EXT_KIND_INT && oa->kind != EXT_KIND_UINT) ||
        (oa->itemsize != 1 && oa->itemsize != 2 && oa->itemsize != 4 && oa->itemsize != 8)) {
        PyErr_Format(PyExc_TypeError, "offsets: expected integers (any int dtype, or a list of "
                     "ints), got %s", ext_array_dtype(oa, b1, sizeof b1));
        return -1;
    }
    if (oa->ndim != 1 || oa->shape[0] != K) {
        PyErr_Format(PyExc_ValueError, "offsets: expected shape (%zd,), got %s", K,
                     ext_array_shape(oa, b1, sizeof b1));
        return -1;
    }
    for (Py_ssize_t k = 0; k < K; k++) {
        const char *e = oa->data + k * oa->strides[0];
        if (oa->kind == EXT_KIND_INT) {
            int64_t v = 0;
            switch (oa->itemsize) {
            case 1: { int8_t x; memcpy(&x, e, 1); v = x; break; }
            case 2: { int16_t x; memcpy(&x, e, 2); v = x; break; }
            case 4: { int32_t x; memcpy(&x, e, 4); v = x; break; }
            default: memcpy(&v, e, 8); break;
            }
            offs[k] = v;
        } else {
            uint64_t v = 0;
            switch (oa->itemsize) {
            case 1: { uint8_t x; memcpy(&x, e, 1); v = x; break; }
            case 2: { uint16_t x; memcpy(&x, e, 2); v = x; break; }
            case 4: { uint32_t x; memcpy(&x, e, 4); v = x; break; }
            default: memcpy(&v, e, 8); break;
            }
            if (v > (uint64_t)INT64_MAX) {
                PyErr_Format(PyExc_ValueError, "offsets[%zd]: %llu is outside int64", k,
                             (unsigned long long)v);
                return -1;
            }
            offs[k] = (int64_t)v;
        }
    }
    return 0;
}

/* Resolves the tables and checks and takes the arrays of `in` into *p
 * (released by lookup_release() either way).  0, or -1 with an exception. */
static int lookup_prepare(StoreObject *s, const lookup_in *in, lookup_prep *p)
{
    engram_lookup_args *a = &p->a;
    engram_table_id *tids = p->tid_stack;
    int64_t *offs = p->off_stack;
    Py_ssize_t K, T, T2, ist, ost;
    uint32_t R = 0;
    char b1[64], b2[64];
    const int lead = in->lead;

    /* What lookup_release() reads, set before anything can fail. */
    p->ids.has_view = p->out.has_view = p->oa.has_view = 0;
    p->ids.dl_capsule = p->out.dl_capsule = p->oa.dl_capsule = NULL;
    p->heap = NULL;
    p->made = NULL;
    *a = (engram_lookup_args)ENGRAM_LOOKUP_ARGS_INIT;

    if (!PyList_Check(in->tables) && !PyTuple_Check(in->tables)) {
        PyErr_Format(PyExc_TypeError, "tables: expected a list or tuple of table names, got %.100s",
                     Py_TYPE(in->tables)->tp_name);
        return -1;
    }
    /* The store is entered only around library calls (see pystore.h); this
     * just fails early. */
    if (!s->st || atomic_load(&s->closing)) {
        ext_raise_cls(ext_StoreClosedError, ENGRAM_ESTATE, "the store is closed");
        return -1;
    }
    p->K = K = PySequence_Fast_GET_SIZE(in->tables);
    if (K > EXT_STORE_STACK_COLS) {
        /* One block: the int64 offsets first, so they are aligned, then the
         * table ids. */
        p->heap = PyMem_Malloc((size_t)K * (sizeof *offs + sizeof *tids));
        if (!p->heap) {
            PyErr_NoMemory();
            return -1;
        }
        offs = p->heap;
        tids = (engram_table_id *)(void *)(offs + K);
    }
    a->tables = tids;
    if (lookup_resolve(s, in, p, tids, &R) < 0)
        return -1;

    /* ids: [T, K] of int32 or int64; the layer API's row_ids [B, L, H] are
     * int64 only, as Mooncake's EngramStore contract has them. */
    if (ext_array_get_gpu(in->ids, in->ids_arg, EXT_DEVICE_OK, in->stream, &p->ids) < 0)
        return -1;
    const ext_array *ids = &p->ids;
    if (ids->kind != EXT_KIND_INT || (ids->itemsize != 8 && (ids->itemsize != 4 || lead == 2))) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %s", in->ids_arg,
                     lead == 2 ? "int64" : "int32 or int64", ext_array_dtype(ids, b1, sizeof b1));
        return -1;
    }
    if (ids->ndim != lead + 1) {
        PyErr_Format(PyExc_ValueError, "%s: expected %s, got shape %s", in->ids_arg,
                     lead == 1 ? "a 2-D array [T, K]" : "a 3-D array [B, L, H]",
                     ext_array_shape(ids, b1, sizeof b1));
        return -1;
    }
    if (ids->shape[lead] != K) {
        /* The layer API names no tables: its last dimension is the heads. */
        if (lead == 2 && in->layer)
            PyErr_Format(PyExc_ValueError, "%s: shape %s gives ids for %zd head%s, but layer %R "
                         "has %zd head%s", in->ids_arg, ext_array_shape(ids, b1, sizeof b1),
                         ids->shape[lead], ids->shape[lead] == 1 ? "" : "s", in->layer, K,
                         K == 1 ? "" : "s");
        else if (lead == 2)
            PyErr_Format(PyExc_ValueError, "%s: shape %s gives ids for %zd head%s, but the "
                         "layer has %zd head%s", in->ids_arg, ext_array_shape(ids, b1, sizeof b1),
                         ids->shape[lead], ids->shape[lead] == 1 ? "" : "s", K,
                         K == 1 ? "" : "s");
        else
            PyErr_Format(PyExc_ValueError, "%s: shape %s has %zd columns but %zd tables are "
                         "named", in->ids_arg, ext_array_shape(ids, b1, sizeof b1),
                         ids->shape[lead], K);
        return -1;
    }
    if (in->ids_contig && !ext_array_c_contiguous(ids)) {
        PyErr_Format(PyExc_ValueError, "%s: must be C-contiguous", in->ids_arg);
        return -1;
    }
    for (int i = 0; i <= lead; i++)
        if (ids->strides[i] % ids->itemsize) {
            PyErr_Format(PyExc_ValueError, "%s: strides must be multiples of the item size",
                         in->ids_arg);
            return -1;
        }
    if (collapse_lead(ids, lead, in->ids_arg, &T, &ist) < 0)
        return -1;
    p->T = T;

    /* out: [T, K, R] (or [B, L, H, R]) of uint8, writable, rows contiguous;
     * made here, zeroed, when not given (what a given one must be). */
    PyObject *outobj = in->out;
    if (!outobj || outobj == Py_None) {
        Py_ssize_t shape[4];
        if (ids->device != EXT_DEVICE_HOST) {
            PyErr_Format(PyExc_TypeError, "%s: required for GPU %s (pass an output array in "
                         "GPU memory)", in->out_arg, in->ids_arg);
            return -1;
        }
        for (int i = 0; i < lead; i++)
            shape[i] = ids->shape[i];
        shape[lead] = K;
        shape[lead + 1] = (Py_ssize_t)R;
        if (!(p->made = ext_new_uint8(shape, lead + 2)))
            return -1;
        outobj = p->made;
    }
    if (ext_array_get_gpu(outobj, in->out_arg, EXT_WRITABLE | EXT_DEVICE_OK, in->stream,
                          &p->out) < 0)
        return -1;
    const ext_array *out = &p->out;
    if (ids->device != out->device) {
        PyErr_Format(PyExc_ValueError, "%s and %s: both must be host arrays or both GPU arrays "
                     "(%s is %s memory)", in->ids_arg, in->out_arg, in->out_arg,
                     out->device == EXT_DEVICE_CUDA ? "GPU" : "host");
        return -1;
    }
    if (out->device == EXT_DEVICE_HOST && in->stream && in->stream != Py_None) {
        PyErr_SetString(PyExc_ValueError, "stream: a CUDA stream orders GPU lookups only; "
                        "ids and out are host arrays (pass stream=None)");
        return -1;
    }
    if (out->kind != EXT_KIND_UINT || out->itemsize != 1) {
        PyErr_Format(PyExc_TypeError, "%s: expected uint8, got %s", in->out_arg,
                     ext_array_dtype(out, b1, sizeof b1));
        return -1;
    }
    {
        int bad = out->ndim != lead + 2;
        for (int i = 0; !bad && i < lead; i++)
            bad = out->shape[i] != ids->shape[i];
        if (!bad)
            bad = out->shape[lead] != K || (K > 0 && out->shape[lead + 1] != (Py_ssize_t)R);
        if (bad) {
            char want[96];
            if (lead == 1)
                PyOS_snprintf(want, sizeof want, "(%zd, %zd, %u)", ids->shape[0], K, R);
            else
                PyOS_snprintf(want, sizeof want, "(%zd, %zd, %zd, %u)", ids->shape[0],
                              ids->shape[1], K, R);
            PyErr_Format(PyExc_ValueError, "%s: expected shape %s (%s x row_bytes), got %s",
                         in->out_arg, want, lead == 1 ? "ids.shape" : "row_ids.shape",
                         ext_array_shape(out, b2, sizeof b2));
            return -1;
        }
    }
    if (R > 1 && out->strides[lead + 1] != 1) {
        PyErr_Format(PyExc_ValueError, "%s: the bytes of each row must be contiguous "
                     "(last stride 1, got %zd)", in->out_arg, out->strides[lead + 1]);
        return -1;
    }
    if (collapse_lead(out, lead, in->out_arg, &T2, &ost) < 0)
        return -1;

    /* offsets: [K] ints. */
    if (in->offsets && in->offsets != Py_None) {
        if (lookup_offsets(in->offsets, K, offs, &p->oa) < 0)
            return -1;
        a->offsets = offs;
    }

    a->flags = in->zero_dead ? ENGRAM_LOOKUP_ZERO_DEAD : 0;
    a->num_tokens = (size_t)T;
    a->num_cols = (size_t)K;
    a->ids = ids->data;
    a->id_type = ids->itemsize == 8 ? ENGRAM_ID_INT64 : ENGRAM_ID_INT32;
    a->id_stride_t = ist / ids->itemsize;
    a->id_stride_k = ids->strides[lead] / ids->itemsize;
    a->out = out->data;
    a->out_stride_t = ost;
    a->out_stride_k = out->strides[lead];
    a->row_bytes = R;
    /* The library reads strides 0, 0 as "contiguous [T, K]": never pass
     * them for a view that is not.  A stride of a dimension of size 1 is
     * never used, so it can be made nonzero; zero strides of T > 1 tokens
     * and K > 1 columns describe ids no stride pair can (one element read
     * everywhere), or output rows that overlap. */
    if (a->id_stride_t == 0 && a->id_stride_k == 0) {
        if (T <= 1)
            a->id_stride_t = K > 0 ? K : 1;
        else if (K <= 1)
            a->id_stride_k = 1;
        else {
            PyErr_Format(PyExc_ValueError, "%s: every stride is 0 (one id broadcast to "
                         "every token and column); pass the ids as an array", in->ids_arg);
            return -1;
        }
    }
    if (a->out_stride_t == 0 && a->out_stride_k == 0) {
        /* With no columns there are no rows to overlap (numpy gives an
         * array of shape (T, 0, 0) the strides (0, 0, 1)): a no-op. */
        if (T > 1 && K > 0) {
            ext_raise_cls(ext_exc_for(ENGRAM_ELAYOUT), ENGRAM_ELAYOUT,
                          "%s: output rows overlap (the strides of its token and column "
                          "dimensions are 0)", in->out_arg);
            return -1;
        }
        a->out_stride_t = K > 0 && R > 0 ? (ptrdiff_t)K * R : 1;
    }
    return 0;
}

/* Runs a prepared lookup: on the GPU for GPU arrays, else on the host
 * (the GIL released for all but small lookups of memory rows).  None, or
 * NULL with an exception (BadIdError naming the first bad id). */
static PyObject *lookup_run(StoreObject *s, const lookup_in *in, lookup_prep *p)
{
    int rc;
#ifdef ENGRAMSTORE_HAVE_CUDA
    if (p->out.device == EXT_DEVICE_CUDA) {
        ext_cuda_error cerr;
        ext_cuda_call call;
        memset(&cerr, 0, sizeof cerr);
        memset(&call, 0, sizeof call);
        if (p->ids.has_sync_stream)
            call.wait[call.nwait++] = p->ids.sync_stream;
        if (p->out.has_sync_stream && !(call.nwait && call.wait[0] == p->out.sync_stream))
            call.wait[call.nwait++] = p->out.sync_stream; /* one wait per stream is enough */
        call.ptr[0] = p->ids.data;
        call.ptr[1] = p->out.data;
        call.device[0] = p->ids.device_id;
        call.device[1] = p->out.device_id;
        if (ext_cuda_stream(in->stream, &call.stream) < 0 || ext_cuda_load() < 0 ||
            ext_store_enter(s) < 0)
            return NULL;
        rc = ext_cuda_lookup(&s->cuda, s->st, &p->a, &call, &cerr);
        ext_store_leave(s);
        if (rc == 0)
            Py_RETURN_NONE;
        ext_cuda_raise(rc, &cerr);
        return NULL;
    }
#else
    (void)in;
#endif
    /* A source callable's exception left from a failure that raised
     * nothing here (a GPU host path) must not become this lookup's cause. */
    Py_XDECREF(ext_source_take_exception());
    if (ext_store_enter(s) < 0)
        return NULL;
    if (p->memory && (uint64_t)p->T * (uint64_t)p->K <= EXT_HOLD_GIL_ROWS) {
        /* A small lookup of memory rows takes a few microseconds at most,
         * less than releasing and taking back the GIL costs (about 0.2 us
         * here): it keeps it, and no Python code runs meanwhile (no source
         * to call). */
        rc = engram_lookup(s->st, &p->a);
        ext_store_leave(s);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = engram_lookup(s->st, &p->a);
        ext_store_leave(s);
        Py_END_ALLOW_THREADS
    }
    if (rc == ENGRAM_EBADID) {
        ext_store_raise_bad_id(rc, &p->ids, in->ids_arg, in->lead);
        return NULL;
    }
    if (rc < 0)
        return ext_raise(rc, NULL);
    Py_RETURN_NONE;
}

/* None, or the output made when `out` was not given; NULL with an
 * exception (the output made is dropped: no rows of a failed lookup are
 * ever returned). */
static PyObject *do_lookup(StoreObject *s, const lookup_in *in)
{
    lookup_prep p;
    PyObject *ret = NULL;
    if (lookup_prepare(s, in, &p) == 0 && (ret = lookup_run(s, in, &p)) && p.made)
        Py_SETREF(ret, Py_NewRef(p.made));
    lookup_release(&p);
    return ret;
}

const char ext_store_lookup_doc[] = PyDoc_STR(
"lookup($self, tables, ids, out=None, offsets=None, stream=None, *, zero_dead=False)\n"
"--\n\n"
"Gathers rows: for every token t and column k, the row ids[t, k] - offsets[k]\n"
"of table tables[k] is copied to out[t, k].  Returns None, or with out omitted\n"
"(or None) the output it made.\n\n"
"tables: list or tuple of K table names (names may repeat).\n"
"ids: int32 or int64 array [T, K], any strides.\n"
"out: writable uint8 array [T, K, row_bytes]; any non-overlapping strides with\n"
"     each row's bytes contiguous (e.g. out_km.transpose(1, 0, 2) for head-major).\n"
"     Omitted or None (host ids only): a new zeroed uint8 array [T, K, row_bytes]\n"
"     (numpy; a memoryview of that shape without numpy) is filled and returned.\n"
"offsets: None, or K ints subtracted from the ids of each column (a list,\n"
"         tuple, range or integer array; not bools or floats): an id is a row\n"
"         when 0 <= id - offset < num_rows.\n"
"stream: for GPU arrays, the CUDA stream to enqueue on: an int handle, a\n"
"        torch.cuda.Stream, or None for the default stream.  The call returns\n"
"        once the work is enqueued; bad ids are reported by cuda_check().\n"
"zero_dead: id -1 zero-fills its output row instead of leaving it untouched.\n\n"
"Every id is checked before any byte is written: an id outside its table raises\n"
"BadIdError naming its position and value, and out is left untouched.  The GIL\n"
"is released while rows are copied; any number of threads may look up at once.");

PyObject *ext_store_lookup(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    static const char *const names[] = {"tables", "ids", "out", "offsets", "stream", "zero_dead"};
    PyObject *v[6];
    lookup_in in;
    if (ext_store_parse_args("lookup", args, nargs, kwnames, names, 6, 5, 2, v) < 0)
        return NULL;
#ifndef ENGRAMSTORE_HAVE_CUDA
    if (v[4] && v[4] != Py_None) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "stream: CUDA streams are not supported yet: this build of engramstore "
                        "has no CUDA library (pass stream=None)");
        return NULL;
    }
#endif
    if (lookup_in_tk(&in, v[0], v[1], v[2], v[3], v[5]) < 0)
        return NULL;
    in.stream = v[4];
    return do_lookup(s, &in);
}

const char ext_store_lookup_async_doc[] = PyDoc_STR(
"lookup_async($self, tables, ids, out=None, offsets=None, *, zero_dead=False)\n--\n\n"
"lookup() on the store's lookup threads: returns at once a PendingLookup whose\n"
"wait() gives the rows (and raises what lookup() would raise): None, or with\n"
"out omitted the output made, as lookup() returns it.  ids and out are\n"
"held, and must not be written, until then.  Host arrays only.  Lookups run in\n"
"the order submitted; close() cancels those that have not started (their\n"
"wait() raises StateError).");

PyObject *ext_store_lookup_async(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    static const char *const names[] = {"tables", "ids", "out", "offsets", "zero_dead"};
    PyObject *v[5];
    lookup_in in;
    lookup_prep p;
    engram_pending *pend = NULL;
    ext_array held[2];
    PyObject *made, *ret;
    int rc;
    if (ext_store_parse_args("lookup_async", args, nargs, kwnames, names, 5, 4, 2, v) < 0)
        return NULL;
    if (lookup_in_tk(&in, v[0], v[1], v[2], v[3], v[4]) < 0)
        return NULL;
    if (lookup_prepare(s, &in, &p) < 0)
        goto fail;
    if (p.out.device != EXT_DEVICE_HOST) {
        PyErr_SetString(PyExc_TypeError, "lookup_async: ids and out must be host arrays (a "
                        "lookup into GPU memory is ordered on its stream already: lookup(..., "
                        "stream=))");
        goto fail;
    }
    /* A source callable's exception left from an earlier failure must not
     * become this lookup's cause. */
    Py_XDECREF(ext_source_take_exception());
    if (ext_store_enter(s) < 0)
        goto fail;
    /* Quick (a copy of the arguments, a queue): the GIL stays. */
    rc = engram_lookup_submit(s->st, &p.a, &pend);
    ext_store_leave(s);
    if (rc) {
        ext_raise(rc, "lookup_async");
        goto fail;
    }
    /* The tables and offsets were copied: only ids and out stay held (and
     * the output made, which wait() returns). */
    held[0] = p.ids;
    held[1] = p.out;
    memset(&p.ids, 0, sizeof p.ids);
    memset(&p.out, 0, sizeof p.out);
    made = p.made;
    p.made = NULL;
    lookup_release(&p);
    ret = ext_pending_new(pend, held, 2, 0, "ids", 1, NULL, made);
    Py_XDECREF(made);
    return ret;
fail:
    lookup_release(&p);
    return NULL;
}

const char ext_store_lookup_layer_doc[] = PyDoc_STR(
"_lookup_layer($self, tables, row_ids, output, layer_id=None, /)\n--\n\n"
"The layer API's lookup: row_ids int64 C-contiguous [B, L, H], output\n"
"uint8 [B, L, H, row_bytes] (None: made, and returned); tables names the H\n"
"tables; layer_id is named in errors.  Used by\n"
"engramstore.EngramStore.lookup_into.");

PyObject *ext_store_lookup_layer_call(StoreObject *s, PyObject *names, PyObject *row_ids,
                                      PyObject *output, PyObject *layer)
{
    lookup_in in;
    in.tables = names;
    in.ids = row_ids;
    in.out = output;
    in.layer = layer;
    in.offsets = NULL;
    in.stream = NULL;
    in.zero_dead = 0;
    in.lead = 2;
    in.ids_contig = 1;
    in.ids_arg = "row_ids";
    in.out_arg = "output";
    return do_lookup(s, &in);
}

PyObject *ext_store_lookup_layer(StoreObject *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 && nargs != 4) {
        PyErr_Format(PyExc_TypeError, "_lookup_layer() takes 3 or 4 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    return ext_store_lookup_layer_call(s, args[0], args[1], args[2],
                                       nargs == 4 && args[3] != Py_None ? args[3] : NULL);
}

/* ---- timing the library's own call, for bench/bench_pycall.py ----------- */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

const char ext_store_bench_lookup_doc[] = PyDoc_STR(
"_bench_lookup($self, tables, ids, out, calls, empty, /)\n--\n\n"
"For benchmarks: the arguments of lookup(tables, ids, out) checked once,\n"
"then engram_lookup() called `calls` times with them, each call timed on its\n"
"own (CLOCK_MONOTONIC, the clock of time.perf_counter_ns), the GIL held.\n"
"Host arrays and tables of memory rows (no source) only.\n"
"With `empty` true, the same number of empty timed regions instead (the\n"
"timer's own cost).  Returns bytes of `calls` int64 nanoseconds.");

PyObject *ext_store_bench_lookup(StoreObject *s, PyObject *const *args, Py_ssize_t nargs)
{
    lookup_in in;
    lookup_prep p;
    unsigned long long calls;
    PyObject *ret = NULL;
    int empty, rc = 0;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "_bench_lookup() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    /* calls * 8 bytes of times must fit a bytes object. */
    if (ext_uint_arg(args[3], "calls", PY_SSIZE_T_MAX / 8, NULL, &calls) < 0 ||
        (empty = PyObject_IsTrue(args[4])) < 0)
        return NULL;
    lookup_in_tk(&in, args[0], args[1], args[2], NULL, NULL);
    if (lookup_prepare(s, &in, &p) == 0) {
        if (p.out.device != EXT_DEVICE_HOST)
            PyErr_SetString(PyExc_ValueError, "_bench_lookup: host arrays only");
        else if (!p.memory)
            /* A source's read_rows would run Python code in the loop. */
            PyErr_SetString(PyExc_ValueError, "_bench_lookup: tables of memory rows only");
        else if ((ret = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)calls * 8)) &&
                 ext_store_enter(s) == 0) {
            int64_t *ns = (int64_t *)(void *)PyBytes_AS_STRING(ret);
            /* The GIL stays held: the loop times the library's call alone,
             * as a C caller makes it (no other thread's Python code runs
             * between two calls). */
            for (unsigned long long c = 0; c < calls && rc >= 0; c++) {
                int64_t t0 = now_ns();
                if (!empty)
                    rc = engram_lookup(s->st, &p.a);
                ns[c] = now_ns() - t0;
            }
            ext_store_leave(s);
            if (rc < 0) {
                Py_CLEAR(ret);
                ext_raise(rc, NULL);
            }
        } else
            Py_CLEAR(ret);
    }
    lookup_release(&p);
    return ret;
}

const char ext_store_cuda_check_doc[] = PyDoc_STR(
"cuda_check($self, /)\n--\n\n"
"GPU lookups cannot raise for a bad id: the kernel skips it (its output row is\n"
"left untouched) and keeps the first one.  After synchronising with the\n"
"lookups to check, cuda_check() raises BadIdError naming that id (position,\n"
"value, table; its attributes position = (token, column) and id) and clears\n"
"the report; it returns None if there was none, or if no lookup went to the\n"
"GPU.");

PyObject *ext_store_cuda_check(StoreObject *s, PyObject *unused)
{
    (void)unused;
#ifdef ENGRAMSTORE_HAVE_CUDA
    {
        /* Entered: close() must not free the context while the check,
         * the GIL released, reads it. */
        engram_cuda_report rep = ENGRAM_CUDA_REPORT_INIT;
        int rc;
        if (ext_store_enter(s) < 0)
            return NULL;
        rc = ext_cuda_check(s->cuda, &rep);
        ext_store_leave(s);
        if (rc == ENGRAM_EBADID) {
            ext_raise(rc, NULL);
            if (rep.first_col == ENGRAM_CUDA_NO_FIRST) /* the next check has it */
                bad_id_attrs(Py_NewRef(Py_None), Py_NewRef(Py_None));
            else
                bad_id_attrs(Py_BuildValue("(KI)", (unsigned long long)rep.first_token,
                                           (unsigned)rep.first_col),
                             PyLong_FromLongLong(rep.first_id));
            return NULL;
        }
        if (rc < 0)
            return ext_raise(rc, NULL);
        Py_RETURN_NONE;
    }
#else
    if (!s->st)
        return ext_raise_cls(ext_StoreClosedError, ENGRAM_ESTATE, "the store is closed");
    Py_RETURN_NONE;
#endif
}
