/*
 * ext.h - what the files of the engramstore._engram extension share.
 *
 * module.c   the module: init, the exception hierarchy, error mapping
 * arrays.c   taking arrays from Python: the buffer protocol, DLPack, and
 *            the refusal of device memory (__cuda_array_interface__)
 * pystore.c  the Store type: the table API over one engram_store; its
 *            methods are in pystore_lookup.c (lookups), pystore_tables.c
 *            (tables: populate, bind, define, queries), pystore_stats.c
 *            (stats) and pystore_source.c (Python row sources), and
 *            pystore.h is what these share
 * ngram.c    the NgramLayout and NgramHasher types: the Engram n-gram hash
 * pending.c  the PendingLookup type: lookups submitted ahead of time
 * publication.c  the _Publication type: the library's publication
 *            protocol over a key-value store written in Python
 * cuda_load.c  the GPU lookups' side in this module (CUDA builds): their
 *            stream argument, their errors, and the loading of the CUDA
 *            runtime and of the GPU module at the first one
 * cuda.c     that GPU module, engramstore._engram_cuda: lookups into GPU
 *            memory through libengram_cuda (a module of its own, and the
 *            only one that links the CUDA runtime)
 */
#ifndef ENGRAMSTORE_EXT_H
#define ENGRAMSTORE_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include <engram.h>

/* ---- module.c ---------------------------------------------------------- */

/* The exception classes, created at module init (strong references held by
 * the module for its lifetime). */
extern PyObject *ext_EngramError;
extern PyObject *ext_StoreClosedError;

/* Raises the exception that matches library code `rc` (negative), with
 * `what` (may be NULL) and engram_errmsg() (in the package's terms, see
 * ext_python_terms()) as the message, and sets its `errno` attribute to
 * -rc.  Returns NULL for `return ext_raise(...)`. */
PyObject *ext_raise(int rc, const char *what);

/* The library's message `msg` in the package's terms (its C names, such
 * as ENGRAM_OPEN_CREATE, replaced by the Python ones, create=True), in
 * buf (truncated to len); returns buf.  ext_raise() applies it. */
const char *ext_python_terms(const char *msg, char *buf, size_t len);

/* Raises a failed call's error: ValueError with the library's message for
 * a bad argument (-EINVAL, -ERANGE), else as ext_raise(rc, NULL).  Returns
 * NULL. */
PyObject *ext_raise_arg(int rc);

/* The exception class for library code `rc` (borrowed). */
PyObject *ext_exc_for(int rc);

/* Raises exception class `cls` with a formatted message and errno = -rc. */
PyObject *ext_raise_cls(PyObject *cls, int rc, const char *fmt, ...);

/* Strings and paths cross into C as NUL-terminated bytes: a NUL inside
 * one would make the library act on a shorter, other name or path (a
 * namespace "prod\0-staging" would be "prod").  These refuse it.
 *
 * ext_utf8_arg(): the UTF-8 text of str `s` (the caller checked the type),
 * or NULL with ValueError naming argument `arg` if it holds a NUL.
 * ext_str_arg(): the same with the type checked (TypeError: "ARG:
 * expected a str, got T").
 * ext_path_arg(): a path (str, bytes or os.PathLike) as a new bytes object
 * in *out (encoded as os.fsencode does), or -1 with TypeError or, for a
 * NUL, ValueError naming `arg`. */
const char *ext_utf8_arg(PyObject *s, const char *arg);
const char *ext_str_arg(PyObject *s, const char *arg);

/* A list of str from a name list of the library (engram_list(),
 * engram_namespace_list(): valid names, ASCII), which it releases with
 * engram_free(); NULL with an exception set if out of memory. */
PyObject *ext_names_list(char **names, size_t n);
int ext_path_arg(PyObject *o, const char *arg, PyObject **out);

/* An int argument `arg` in [0, max] (a size, a count handed to a C
 * unsigned field, which a negative or too large value would wrap): 0 and
 * *out, or -1 with TypeError (not an int) or ValueError naming `arg`, the
 * range and `hint` (e.g. " (0 = 64)"; may be NULL). */
int ext_uint_arg(PyObject *v, const char *arg, unsigned long long max, const char *hint,
                 unsigned long long *out);

/* A NUMA node argument `arg` (an int, not a bool, in [0,
 * ENGRAM_NUMA_MAX_NODES - 1]): 0 and *out, or -1 with TypeError or
 * ValueError naming `arg`. */
int ext_numa_node_arg(PyObject *v, const char *arg, int *out);

/* ---- arrays.c ---------------------------------------------------------- */

#define EXT_MAX_DIMS 8

/* Element kinds, as in numpy's dtype.kind. */
#define EXT_KIND_INT 'i'
#define EXT_KIND_UINT 'u'
#define EXT_KIND_OTHER '?'

/* An array taken from a Python object for the length of a call (or, for
 * bound tables, the life of a store).  Exactly one of the two sources is
 * held: a buffer-protocol view or a DLPack capsule. */
typedef struct ext_array {
    char *data;
    int ndim;
    char kind;          /* EXT_KIND_* */
    int itemsize;       /* bytes */
    int readonly;
    int device;         /* EXT_DEVICE_HOST or EXT_DEVICE_CUDA */
    int device_id;      /* CUDA device ordinal, -1 = not known (the current one) */
    Py_ssize_t shape[EXT_MAX_DIMS];
    Py_ssize_t strides[EXT_MAX_DIMS]; /* bytes */
    /* sources */
    int has_view;
    Py_buffer view;
    PyObject *dl_capsule;  /* the capsule, renamed "used_..." once taken */
    void *dl_managed;      /* DLManagedTensor[Versioned] * */
    int dl_versioned;
    /* __cuda_array_interface__ v3 "stream": the producer's stream, which
     * the consumer must order its work after (1: the legacy default
     * stream, 2: the per-thread default stream, else a cudaStream_t). */
    int has_sync_stream;
    uintptr_t sync_stream;
} ext_array;

#define EXT_DEVICE_HOST 0
#define EXT_DEVICE_CUDA 1

/* ext_array_get() flags */
#define EXT_WRITABLE 1u  /* refuse read-only memory */
#define EXT_DEVICE_OK 2u /* accept CUDA device memory (builds with the CUDA library) */

/* Fills *a from `obj`.  `arg` names the argument in error messages.
 * Python sequences, objects with neither the buffer protocol nor DLPack,
 * big-endian data and more than EXT_MAX_DIMS dimensions raise
 * TypeError/ValueError.  Device memory (__cuda_array_interface__ or DLPack
 * on a CUDA device) is taken with EXT_DEVICE_OK in a CUDA build; otherwise
 * it raises TypeError, or NotImplementedError in a build without CUDA.
 * Returns 0, or -1 with an exception set (and nothing held). */
int ext_array_get(PyObject *obj, const char *arg, unsigned flags, ext_array *a);
/* ext_array_get() with the consumer's stream argument (`stream`, as given
 * to lookup(); NULL or None: the legacy default stream), which a DLPack
 * producer on a CUDA device is passed as __dlpack__(stream=...) so that
 * it orders its pending writes before the consumer's work.  A
 * __cuda_array_interface__ v3 "stream" is returned in a->sync_stream. */
int ext_array_get_gpu(PyObject *obj, const char *arg, unsigned flags, PyObject *stream,
                      ext_array *a);

/* A new zeroed, C-contiguous uint8 array of `shape` (ndim dimensions): a
 * numpy array where numpy is installed (the package never requires it),
 * else a writable memoryview of a bytearray cast to that shape (every
 * dimension nonzero: memoryview has no empty shapes).  The output a lookup
 * makes when none is given.  NULL with an exception. */
PyObject *ext_new_uint8(const Py_ssize_t *shape, int ndim);

/* Releases what ext_array_get() took.  Safe on a zeroed or released array. */
void ext_array_release(ext_array *a);

/* "int64", "uint8", ... for messages. */
const char *ext_array_dtype(const ext_array *a, char *buf, size_t len);

/* Writes "(3, 2, 264)" into buf. */
const char *ext_array_shape(const ext_array *a, char *buf, size_t len);

/* 1 if the array's elements are laid out C-contiguously. */
int ext_array_c_contiguous(const ext_array *a);

/* ---- ngram.c ----------------------------------------------------------- */

int ext_ngram_init(PyObject *module);

/* ---- publication.c ----------------------------------------------------- */

int ext_publication_init(PyObject *module);

/* ---- pending.c --------------------------------------------------------- */

int ext_pending_init(PyObject *module);

/* ---- pystore.c --------------------------------------------------------- */

int ext_store_init(PyObject *module);

/* ---- pystore_tables.c -------------------------------------------------- */

/* _check_rows(rows, arg, num_rows, row_bytes): raises unless rows is a
 * C-contiguous uint8 [num_rows, row_bytes] array; takes nothing. */
PyObject *ext_check_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* ---- pystore_source.c -------------------------------------------------- */

/* 1 while a source callable runs on this thread (inside a lookup of its
 * store: close() there would wait for its own thread). */
int ext_source_active(void);
/* The exception of this thread's last failed source callable (new
 * reference, cleared), or NULL: the cause of the EngramError raised for
 * the lookup it failed. */
PyObject *ext_source_take_exception(void);

/* _source_group(read_rows, row_bytes): the group of source tables that a
 * lookup reads in one call (pystore_source.c). */
PyObject *ext_source_group(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
extern const char ext_source_group_doc[];

/* ---- GPU lookups (ENGRAMSTORE_HAVE_CUDA builds) ----------------------------
 *
 * They live in a module of their own, engramstore._engram_cuda (cuda.c
 * over libengram_cuda), which links the CUDA runtime; this module does
 * not, so `import engramstore` and every host lookup work where the
 * runtime is missing.  cuda_load.c loads the runtime and imports that
 * module at the first lookup into GPU memory, and raises ImportError
 * saying what is missing if it cannot.  The two modules meet through two
 * tables of functions, exchanged once: ext_cuda_api (the GPU module's
 * functions, in its capsule `_api`) and libengram's internal interface
 * (src/internal.h: what libengram_cuda calls of libengram), that of the
 * one copy of the library linked into this module, so that both modules
 * work on the same stores and report through the same per-thread
 * message. */

typedef struct ext_cuda ext_cuda;
struct engram__internal;
struct engram_cuda_report;
struct engram_cuda_stats;

#ifdef ENGRAMSTORE_HAVE_CUDA
/* The cudaStream_t named by `stream` (NULL or None: the legacy default
 * stream, an int handle, or a CUDA stream object).  May run Python code,
 * so call it before entering the store.  0, or -1 with an exception set. */
int ext_cuda_stream(PyObject *stream, void **handle);
/* Why ext_cuda_lookup() failed, for ext_cuda_raise() (zero it first). */
typedef struct ext_cuda_error {
    const char *what; /* prefix of the library's message, or NULL */
    int nomem;
    int code;      /* with msg: 0 for ValueError, else the engram code */
    char msg[256]; /* nonempty: our own refusal */
} ext_cuda_error;

/* What ext_cuda_lookup() needs besides the lookup. */
typedef struct ext_cuda_call {
    void *stream;         /* from ext_cuda_stream() */
    uintptr_t wait[2];    /* producer streams to order after (ext_array.sync_stream) */
    int nwait;
    const void *ptr[2];   /* ids, out: device addresses */
    int device[2];        /* their GPUs as the arrays said (DLPack), or -1 */
} ext_cuda_call;

/* Loads the CUDA runtime and the GPU module, once: 0, or -1 with
 * ImportError naming what is missing.  Imports a module (runs Python
 * code), so call it before entering the store. */
int ext_cuda_load(void);
/* Enqueues lookup `a` (ids and out in device memory) on call->stream,
 * after the work already enqueued on each producer stream of call->wait,
 * on the arrays' GPU, creating the store's CUDA context in *slot there on
 * first use; engram_cuda_lookup_tables() keeps the plans (and refuses a
 * first lookup of a's tables and offsets while the stream is being
 * captured into a graph).  Needs ext_cuda_load() first.  Called with the
 * GIL held and the store entered; releases the GIL around library calls
 * and creates no Python object (see cuda.c).  0, or an engram error code
 * with *err (zeroed by the caller) filled in: raise it with
 * ext_cuda_raise() once the store is left. */
int ext_cuda_lookup(ext_cuda **slot, engram_store *st, const engram_lookup_args *a,
                    const ext_cuda_call *call, ext_cuda_error *err);
/* Raises the error of a failed ext_cuda_lookup() (-EINVAL as ValueError);
 * returns NULL. */
PyObject *ext_cuda_raise(int rc, const ext_cuda_error *err);
/* Reads and clears the report of bad ids the GPU skipped since the last
 * check into *rep: 0 if there was none (or no context), else ENGRAM_EBADID
 * (or another engram error) with the library's message, to raise once the
 * store is left.  Creates no Python object. */
int ext_cuda_check(ext_cuda *c, struct engram_cuda_report *rep);
/* Fills *out with the context's counters: 1, or 0 if there is no
 * context (no GPU lookup yet).  Creates no Python object. */
int ext_cuda_stats(const ext_cuda *c, struct engram_cuda_stats *out);
/* Waits for the context's device, then closes the context and its plans.
 * NULL (no GPU lookup yet) does nothing. */
void ext_cuda_close(ext_cuda *c);

/* The seam between the two modules.  ext_cuda_api starts with the ABI
 * number and its size: a GPU module of another build is refused. */
#define EXT_CUDA_ABI 2

/* The GPU module's functions: ext_cuda_lookup() and the others above call
 * these.  attach() hands it libengram's internal interface
 * (engram_internal_v1() of this module's copy), which the GPU module's
 * engram_internal_v1() returns from then on; 0, or -1 if it is not one
 * the module can use. */
typedef struct ext_cuda_api {
    unsigned abi;
    size_t size;
    int (*attach)(const struct engram__internal *core);
    int (*lookup)(ext_cuda **slot, engram_store *st, const engram_lookup_args *a,
                  const ext_cuda_call *call, ext_cuda_error *err);
    int (*check)(ext_cuda *c, struct engram_cuda_report *rep);
    int (*stats)(const ext_cuda *c, struct engram_cuda_stats *out);
    void (*close)(ext_cuda *c);
} ext_cuda_api;

/* The GPU module and the name of its capsule of ext_cuda_api. */
#define EXT_CUDA_MODULE "engramstore._engram_cuda"
#define EXT_CUDA_CAPSULE EXT_CUDA_MODULE "._api"
#endif

/* pystore_tables.c: the writer of the pull whose append() (the function
 * _pull_rows() gives its fill()) `fn` is, lent to a read of num_rows rows
 * of row_bytes while that fill() runs and no append() runs (an append()
 * meanwhile is refused): 1 and *loan, until ext_pull_return(*loan) (the
 * GIL held for both); 0 where fn is no such function or its writer cannot
 * be lent now; -1 (ValueError) where its table has another shape.
 * ext_pull_recalled() (any thread): fill() returned meanwhile, and waits
 * for the read to stop. */
typedef struct ext_pull_loan ext_pull_loan;
int ext_pull_lend(PyObject *fn, uint64_t num_rows, uint32_t row_bytes, ext_pull_loan **loan);
engram_writer *ext_pull_writer(ext_pull_loan *loan);
int ext_pull_recalled(ext_pull_loan *loan);
void ext_pull_return(ext_pull_loan *loan);

/* publication.c: _engram._xxh3_64(buf), a published table's checksum. */
extern const char ext_xxh3_64_doc[];
PyObject *ext_xxh3_64(PyObject *mod, PyObject *buf);

/* The exception being raised, normalised, with its traceback (new
 * reference); clears it.  ext_raise_taken() raises it again (stealing
 * the reference).  For an exception raised in a callback, kept across
 * library code and raised again by the call that ran it. */
static inline PyObject *ext_take_raised(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v && tb)
        PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
#endif
}

static inline void ext_raise_taken(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

#endif
