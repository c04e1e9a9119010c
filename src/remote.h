/*
 * remote.h - the namespace interface: what a store hands to the
 * namespace its tables live in (internal).
 *
 * A store opened on a namespace has its functions below (st->ns) and its
 * state (st->ns_state).  Two namespaces implement it: a directory
 * (nsdir.c: engram_store_open(); tables are files) and a Redis Cluster
 * (redis.c: engram_store_open_redis()).  store.c and writer.c hand what a
 * store does in its namespace to these functions: open a table (which
 * makes a row source or a memory source for it, as source.h describes),
 * describe, list, verify and remove tables, and write one.  Everything
 * else (the registry, the lookup, the row cache, bound and source tables)
 * is the store's as for any other store; a memory store has no
 * namespace (st->ns is NULL).  The functions run without the store's lock
 * (they do I/O) unless they say otherwise, and must be thread-safe.
 */
#ifndef ENGRAM_REMOTE_H
#define ENGRAM_REMOTE_H

#include <stdint.h>

#include "engram.h"
#include "source.h"

struct engram__numa;

/* Where a remote's read_all() hands a table's rows: begin() once with
 * the table's spec (rows packed: no pitch) and the XXH3-64 of its rows,
 * before anything is read; then rows() with the next n rows, in order,
 * each piece checked against the remote's checksums before it comes
 * (rows() may run on another thread than begin(); the calls never
 * overlap).  The sink checks the whole against begin()'s checksum once
 * read_all() returned 0.  A nonzero return of either stops the read and
 * is its result. */
typedef struct engram__remote_sink {
    int (*begin)(void *ud, const engram_table_spec *spec, uint64_t checksum);
    int (*rows)(void *ud, const void *rows, uint64_t n);
    /* May be NULL: after each piece of n rows is read, on the thread that
     * called read_all() (where a caller's progress callback runs). */
    int (*read)(void *ud, uint64_t n);
    void *ud;
    /* May be NULL, or return NULL: asked once after begin(), the memory
     * of the table's rows (packed: begin()'s num_rows * row_bytes bytes,
     * all of which the read writes), where they are to be read in place.
     * Then rows() is given each part of that memory as soon as the
     * check of its piece has passed over it (a block of whole rows, while
     * it is still in the cache), before the piece's check ends: a check
     * that fails fails read_all() after such rows() calls.  Progress
     * (read()) is as above. */
    unsigned char *(*region)(void *ud);
} engram__remote_sink;

typedef struct engram__remote_vt {
    uint32_t kind; /* engram_table_info.kind of the namespace's tables */
    /* Frees the remote state at engram_store_close(), after every table's
     * source was released. */
    void (*close)(void *rs);
    /* Makes the source of table `name` (-ENOENT if it has none) and its
     * spec. */
    int (*open)(void *rs, const engram__store_ctx *ctx, const char *name,
                engram_table_spec *spec, uint64_t *data_size, engram__source *src);
    /* Describes table `name` without opening it. */
    int (*info)(void *rs, const char *name, engram_table_info *info);
    /* Calls add(ud, name) for every table; stops at add's first error. */
    int (*list)(void *rs, int (*add)(void *ud, const char *name), void *ud);
    /* Reads table `name` whole into `sink` (above), checking every piece
     * (ENGRAM_ECHECKSUM; -ENODATA for data missing): what verify and pull
     * are made of. */
    int (*read_all)(void *rs, const char *name, const engram__remote_sink *sink);
    /* Unpublishes table `name` (-ENOENT if it is not there) and deletes
     * its data; *unpublished says whether it was unpublished, also when
     * deleting the data then failed. */
    int (*remove)(void *rs, const char *name, int *unpublished);
    /* A writer of table `name`: begin fails at once with -EEXIST if the
     * name is published; commit publishes create-only and frees it. */
    int (*writer_begin)(void *rs, const char *name, const engram_table_spec *spec, void **w);
    int (*writer_append)(void *w, const void *rows, uint64_t nrows, size_t src_stride);
    int (*writer_commit)(void *w);
    void (*writer_abort)(void *w);
    /* engram_store_gc() of the namespace (idle_ms: its idle_s in ms). */
    int (*gc)(void *rs, uint64_t idle_ms, uint32_t flags, engram_gc_report_fn report, void *ud);
    /* engram_verify() of table `name` of st, the store whose namespace it
     * is (ENGRAM_ECHECKSUM for corrupt data). */
    int (*verify)(engram_store *st, const char *name, engram_progress_fn progress, void *ud);

    /* What only some namespaces have: NULL (or 0) where one has none. */
    /* 1: open() gets a NULL ctx and makes the store's context itself
     * (engram__store_ctx_get()) only where it needs one, which sets up the
     * reader and reads the namespace's size; 0: it gets the context. */
    int lazy_ctx;
    /* Under the store's lock, just before the table that open() made is
     * added: 0 if `name` is still what open() opened (src->ident, which
     * open() set), else the failure with its message. */
    int (*current_locked)(void *rs, const char *name, const engram__source *src);
    /* 1 if the namespace has an entry `name`, a table or not (a name a
     * table of the store cannot take); called under the store's lock. */
    int (*has)(void *rs, const char *name);
    /* Bytes of the namespace's tables (the row cache's share rule). */
    uint64_t (*bytes)(void *rs);
    /* The store uses the namespace: it opened a table or waits for one
     * (a directory's lease: gc leaves it alone while the store lives). */
    void (*use)(void *rs);
    /* 1: the namespace keeps a table's rows packed (no pitch), and its
     * checksum is of the rows so. */
    int packed;
    /* writer_begin() with the NUMA placement `pl` for the table's memory
     * (a node copy: engram_numa_copy()). */
    int (*writer_begin_placed)(void *rs, const char *name, const engram_table_spec *spec,
                               const struct engram__numa *pl, void **w);
    /* engram_writer_set_range(): the table is rows [row_start, row_start +
     * num_rows) of total_rows; a bad range fails with its message and
     * leaves the writer usable.  NULL: the namespace keeps no range. */
    int (*writer_range)(void *w, uint64_t row_start, uint64_t total_rows);
    /* engram_writer_set_origin() of an origin already checked
     * (engram__origin_check()).  NULL: the namespace keeps no origin. */
    int (*writer_origin)(void *w, const engram_origin *o);
    /* engram__writer_region() (writer.h), of a writer that has not
     * failed; region_bytes is what the caller will write (NULL unless the
     * table's data is exactly that).  writer_append() then takes rows
     * appended from their own place in the region where they are.  NULL:
     * the namespace takes rows only by copy. */
    unsigned char *(*writer_region)(void *w, uint64_t region_bytes);
    /* engram_populate_shared(): waits for a running writer of `name` until
     * *deadline (set at the first wait, from timeout_ms: < 0 none): 1 if
     * one ended (look again), 0 if none runs, or the failure (-ETIMEDOUT
     * naming it).  NULL: racing writers are not waited for; the
     * create-only publication picks one. */
    int (*writer_wait)(void *rs, const char *name, int timeout_ms, uint64_t *deadline);
    /* engram_table_open_wait() after a first try found no table `name`:
     * waits for its publication until `deadline` (CLOCK_MONOTONIC ns;
     * UINT64_MAX: none; timeout_ms for messages) and opens it.  NULL: the
     * store looks again from time to time. */
    int (*wait)(void *rs, const char *name, int timeout_ms, uint64_t deadline,
                engram_table_id *id);
    /* engram_get_table_placement() of table `name`, not open in the store
     * or read through the row cache: where its pages are. */
    int (*placement)(void *rs, const char *name, engram_table_placement *p);
    /* The origin its tables report (engram_table_info.origin), epoch 0:
     * the kind, the namespace and the address.  NULL: a namespace whose
     * tables are not pulled from (a directory). */
    void (*origin)(void *rs, engram_origin *o);
} engram__remote_vt;

/* Makes a store whose namespace is vt's (a remote's: no NUMA placement);
 * `path` names it in messages.  On success the store owns rs (close
 * frees it); on failure the caller still does. */
int engram__store_open_remote(const engram_store_options *opts, const char *path,
                              const engram__remote_vt *vt, void *rs, engram_store **out);

/* The namespace state of a store opened on `vt`, or NULL. */
void *engram__store_remote(engram_store *st, const engram__remote_vt *vt);

/* The nearest tier: a memory source of table `name` of `local` (a store
 * of a directory namespace) if it is there with exactly `want` (rows
 * packed, no pitch) and data checksum `sum`, mapped with `flags` and
 * local's placement; 0, -ENOENT (no such table, or not readable as one),
 * or -ESTALE (another spec or other rows: not a copy of this table). */
int engram__store_local_copy(engram_store *local, const char *name,
                             const engram_table_spec *want, uint64_t sum, uint32_t flags,
                             engram__source *src);

/* engram_verify() of remote table `name` of st (pull.c): the verify()
 * of a namespace that has read_all(). */
int engram__remote_verify(engram_store *st, const char *name, engram_progress_fn progress,
                          void *ud);

#endif
