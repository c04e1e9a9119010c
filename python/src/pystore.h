/*
 * pystore.h - what the files of the Store type (engramstore._engram.Store)
 * share: the object, its close guard, argument parsing, the resolution of
 * table names, and the methods that pystore.c's method table lists.
 *
 * pystore.c         the type itself: new/init/dealloc/repr, the close
 *                   guard, argument parsing, close() and the method table
 * pystore_lookup.c  lookup(), _lookup_layer(), _bench_lookup() and
 *                   cuda_check(): the memo, layouts and bad-id errors
 * layer_lookup.c    _layer_lookup(): the type of the layer API's lookup_into
 * pystore_tables.c  populate(), bind(), open_safetensors(), define(),
 *                   get_table_spec(), list_tables(), remove(), verify(), and
 *                   the resolution of names to tables
 * pystore_stats.c   stats()
 * pystore_source.c  _add_source(): tables served by a Python callable
 *
 * A Store owns one engram_store (a namespace directory, or memory only)
 * and remembers:
 *   tables    name -> resolved table (id | row_bytes << 32), filled on the
 *             first lookup that names a table, so later lookups resolve a
 *             name with one dict probe;
 *   memo      the name lists of the last lookups (one per layer, say) and
 *             their ids;
 *   gen       bumped by remove() and close(): an id resolved while the GIL
 *             was released is cached (tables, memo) only if gen did not
 *             change meanwhile, so a removed table's id is never kept;
 *   declared  name -> (num_rows, row_bytes, row_pitch) from define():
 *             checked against stored tables when they are resolved;
 *   holds     the arrays bound with bind(), released at close().
 *
 * The GIL is released around every library call.  close() may be called
 * while other threads are inside one: each such call is counted in
 * `active` (incremented with the GIL held, before it is released, and
 * decremented without it when the library returns); close() marks the
 * store closing, so no new call starts, waits for `active` to drain, and
 * only then closes the engram_store.  Calls that arrive after close()
 * raise StoreClosedError.  No Python code may run between
 * ext_store_enter() and ext_store_leave(): code that calls close() there
 * (a __dlpack__, a str subclass's __hash__, a finalizer run by the GC)
 * would wait for its own thread.
 */
#ifndef ENGRAMSTORE_PYSTORE_H
#define ENGRAMSTORE_PYSTORE_H

#include "ext.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* Lookups of at most this many tables keep their table ids (and offsets)
 * on the stack and are memoized. */
#define EXT_STORE_STACK_COLS 64

/* How many name lists the memo keeps: a model's layers looked up in turn,
 * each with its own list, all skip resolution. */
#define EXT_STORE_MEMOS 16

/* One memoized name list: k > 0 names (strong references) and their ids,
 * in one block; k == 0 is an empty entry. */
typedef struct {
    Py_ssize_t k;
    PyObject **names;
    engram_table_id *ids;
    uint32_t R;
    int memory; /* every table of it is memory (no source to call) */
} ext_store_memo;

typedef struct {
    PyObject_HEAD
    engram_store *st;
    PyObject *path;     /* str, for repr */
    PyObject *tables;   /* dict */
    /* The name lists of the last lookups and their ids: a lookup naming
     * the very same objects as one of them skips resolution.  memo_last is
     * the entry hit or set last (tried first), memo_next the one replaced
     * next (round robin). */
    ext_store_memo memo[EXT_STORE_MEMOS];
    int memo_last, memo_next;
    uint64_t gen;       /* see above; read and written with the GIL */
    PyObject *declared; /* dict */
    PyObject *holds;    /* list of capsules */
    atomic_long active;
    atomic_int closing;
    int sync_ready;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ext_cuda *cuda; /* created by the first lookup into device memory */
} StoreObject;

/* ---- pystore.c ---------------------------------------------------------- */

/* The close guard.  ext_store_enter(), with the GIL held: 0 if the store is
 * open (and counts the caller in), -1 with StoreClosedError if not.
 * ext_store_leave(), without the GIL (or with it): counts the caller out,
 * waking close(). */
int ext_store_enter(StoreObject *s);
void ext_store_leave(StoreObject *s);

/* Fills vals[i] (borrowed, NULL if absent) for names[i] from the
 * positional args (at most npos) and keywords of a METH_FASTCALL |
 * METH_KEYWORDS call of fn(); the first nreq are required.  0, or -1 with
 * TypeError. */
int ext_store_parse_args(const char *fn, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames, const char *const *names, int nnames, int npos,
                         int nreq, PyObject **vals);

/* ---- pystore_lookup.c --------------------------------------------------- */

/* Empties the memo (the names are dropped last, and may run Python code). */
void ext_store_memo_clear(StoreObject *s);

PyObject *ext_store_lookup(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames);
PyObject *ext_store_lookup_async(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames);
extern const char ext_store_lookup_async_doc[];
/* The Store type (set at module init), for isinstance checks. */
extern PyTypeObject *ext_store_type;
/* Raises BadIdError for a lookup's first bad id (engram_last_bad_id()),
 * named in the caller's `ids` array (lead 1: [T, K], 2: [B, L, H]). */
void ext_store_raise_bad_id(int rc, const ext_array *ids, const char *arg, int lead);

/* ---- pending.c: PendingLookup ------------------------------------------ */

/* A PendingLookup of `p`, taking the nheld arrays (moved out of held[]) and
 * a reference to `keep` (may be NULL); held[ids_index] (or -1) names bad
 * ids as `ids_arg` with `lead`.  `result` (may be NULL: None), with a
 * reference taken, is what wait() returns once the lookup succeeded.  NULL
 * with an exception (p cancelled and the arrays released). */
PyObject *ext_pending_new(engram_pending *p, ext_array *held, int nheld, int ids_index,
                          const char *ids_arg, int lead, PyObject *keep, PyObject *result);
PyObject *ext_store_lookup_layer(StoreObject *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *ext_store_bench_lookup(StoreObject *s, PyObject *const *args, Py_ssize_t nargs);
PyObject *ext_store_cuda_check(StoreObject *s, PyObject *unused);
extern const char ext_store_lookup_doc[];
extern const char ext_store_lookup_layer_doc[];
extern const char ext_store_bench_lookup_doc[];
extern const char ext_store_cuda_check_doc[];

/* The layer API's lookup, as _lookup_layer(names, row_ids, output, layer):
 * names a tuple or list of the layer's H table names, row_ids int64
 * C-contiguous [B, L, H], output uint8 [B, L, H, row_bytes] (NULL or None:
 * made, and returned instead of None), layer the layer id its errors name
 * (may be NULL). */
PyObject *ext_store_lookup_layer_call(StoreObject *s, PyObject *names, PyObject *row_ids,
                                      PyObject *output, PyObject *layer);

/* ---- layer_lookup.c ----------------------------------------------------- */

/* Makes the type of _layer_lookup()'s objects (at module init). */
int ext_layer_lookup_module_init(PyObject *m);
PyObject *ext_store_layer_lookup(StoreObject *s, PyObject *const *args, Py_ssize_t nargs);
extern const char ext_store_layer_lookup_doc[];

/* ---- pystore_tables.c --------------------------------------------------- */

/* Resolves table name `name` (argument tables[k]) to its id, row_bytes
 * and whether its rows are memory (*memory: no source is called to read
 * them), opening (mapping) the table on first use and checking it
 * against a declared spec; caches the result in s->tables.  Enters the
 * store around the library calls only.  0, or -1 with an exception. */
int ext_store_resolve(StoreObject *s, PyObject *name, engram_table_id *id, uint32_t *row_bytes,
                      int *memory, Py_ssize_t k);

/* engram_get_table_info() with the GIL released; the caller has entered
 * the store.  Returns the library's code. */
int ext_store_table_info(StoreObject *s, const char *cname, engram_table_info *info);

PyObject *ext_store_populate(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames);
PyObject *ext_store_bind(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames);
PyObject *ext_store_open_safetensors(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames);
PyObject *ext_store_define(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames);
PyObject *ext_store_get_table_spec(StoreObject *s, PyObject *name);
extern const char ext_store_populate_shared_doc[], ext_store_wait_for_doc[];
extern const char ext_store_usage_doc[];
PyObject *ext_store_usage(StoreObject *s, PyObject *name);
extern const char ext_store_placement_doc[];
PyObject *ext_store_placement(StoreObject *s, PyObject *name);
/* The pages per node of table `cname` as a dict {node: pages}, or None
 * where they cannot be told (not memory, no libnuma, the query refused);
 * NULL with an exception only for a closed store or no memory.  Enters
 * the store. */
PyObject *ext_store_numa_nodes(StoreObject *s, const char *cname);
extern const char ext_store_numa_copy_doc[];
PyObject *ext_store_numa_copy(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames);
PyObject *ext_store_populate_shared(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames);
PyObject *ext_store_wait_for(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames);
PyObject *ext_store_list_tables(StoreObject *s, PyObject *unused);
PyObject *ext_store_remove(StoreObject *s, PyObject *name);
PyObject *ext_store_verify(StoreObject *s, PyObject *name);
PyObject *ext_store_check_origin(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames);
PyObject *ext_store_pull(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames);
extern const char ext_store_populate_doc[];
extern const char ext_store_bind_doc[];
extern const char ext_store_open_safetensors_doc[];
extern const char ext_store_define_doc[];
extern const char ext_store_get_table_spec_doc[];
extern const char ext_store_list_tables_doc[];
extern const char ext_store_remove_doc[];
extern const char ext_store_verify_doc[];
extern const char ext_store_pull_doc[];
extern const char ext_store_check_origin_doc[];
PyObject *ext_store_pull_rows(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames);
extern const char ext_store_pull_rows_doc[];

/* ---- pystore_stats.c ---------------------------------------------------- */

PyObject *ext_store_stats(StoreObject *s, PyObject *unused);
extern const char ext_store_stats_doc[];

/* ---- pystore_source.c --------------------------------------------------- */

PyObject *ext_store_add_source(StoreObject *s, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames);
extern const char ext_store_add_source_doc[];


#endif
