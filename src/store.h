/*
 * store.h - the store: a namespace and its registry of tables (internal).
 *
 * Tables live in a registry of fixed-size chunks that is only ever
 * appended to: an engram_table_id is an index into it and stays valid
 * until the store closes.  Lookups and the stats read the registry without
 * a lock (acquire loads of pointers published with release stores);
 * writers of the registry hold store->lock.  Table objects are freed only
 * at close, which is why engram_remove() never invalidates memory a
 * concurrent lookup may be reading; what a removed table's source holds
 * is released once no read section (readsection.h) can reach it.
 *
 * store->lock guards the registry and the namespace bookkeeping only.  No
 * slow work runs under it: mapping, prefaulting and checksumming a table,
 * reading /proc/self/smaps and summing counters all happen outside.
 *
 * The modules that make sources (mapfile.c, filesrc.c, safetensors.c)
 * never read this struct: the store passes them what they need.
 */
#ifndef ENGRAM_STORE_H
#define ENGRAM_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/types.h>

#include "common.h"
#include "numa.h"
#include "table.h"

#define ENGRAM__CHUNK_BITS 8
#define ENGRAM__CHUNK (1u << ENGRAM__CHUNK_BITS)
#define ENGRAM__MAX_CHUNKS 256 /* 65536 tables per store */

typedef struct engram__store_counters {
    _Atomic uint64_t lookups, failed, rows, dead, bytes, parallel, time_ns;
} __attribute__((aligned(ENGRAM__CACHELINE))) engram__store_counters;

struct engram__pool;
struct engram__reader;
struct engram__cbudget;
struct engram__remote_vt;

struct engram_store {
    /* The namespace (remote.h): its functions and state; NULL for a
     * memory store. */
    const struct engram__remote_vt *ns;
    void *ns_state;
    int dirfd;                    /* a directory namespace's (nsdir.c), or -1 */
    char *path;                   /* root/ns, for messages */
    engram_store_options opts;     /* numa_gpu and numa_nodes are NULL here: see numa */
    engram__numa numa;            /* the placement of what the store writes or copies */
    uid_t uid;                    /* the namespace's owner: the only uid whose files we trust */
    pthread_mutex_t lock;         /* registry writes, bind/populate/remove bookkeeping */
    /* Names being opened, under lock: a second opener of a name waits for
     * the first (opened_cv) instead of making a second source whose row
     * cache would get only what the first left of the budget. */
    struct engram__claim *claims;
    pthread_cond_t opened_cv;
    _Atomic(engram__table *) *_Atomic chunks[ENGRAM__MAX_CHUNKS];
    _Atomic uint32_t ntables;     /* registry length: written under lock, read without */
    uint64_t serial;              /* unique per store of the process (never 0): a lookup's
                                   * memo of resolved tables is for this store only */
    _Atomic uint64_t gen;         /* bumped by every engram_remove(): memos made before are
                                   * stale */
    engram__table *retired;       /* removed tables whose source is still held (under lock) */
    /* The namespace lease (lease.c), taken at the first table open. */
    _Atomic int lease_fd;         /* -1: none */
    pid_t lease_pid;              /* the process that made it */
    char lease_name[64];
    struct engram__pool *pool;    /* NULL when threads == 1 */
    /* The lookup threads of submitted lookups (async.c), made with the
     * first submit (under lock), then read without it. */
    struct engram__async *_Atomic async;
    /* The row cache's budget and the io_uring reader, made with the first
     * table that needs them (under lock), then read without it. */
    struct engram__cbudget *_Atomic budget;
    struct engram__reader *_Atomic reader;
    _Atomic uint32_t queue_depth; /* the reader's, set before it is published (stats.c) */
    int threads;
    size_t parallel_min_rows;
    uint64_t log_ns;                 /* the cache stats line's interval; 0: none */
    _Atomic uint64_t next_log_ns;
    engram__store_counters ctr[ENGRAM__STATS_SLOTS];
};

/* Returns the table of `id`, or NULL if id was never issued. */
static inline engram__table *engram__table_get(engram_store *st, engram_table_id id)
{
    _Atomic(engram__table *) *chunk;
    if (id >= (uint32_t)ENGRAM__MAX_CHUNKS * ENGRAM__CHUNK)
        return NULL;
    /* Acquire pairs with the release stores in the registry append, so the
     * table's fields are visible once its pointer is. */
    chunk = atomic_load_explicit(&st->chunks[id >> ENGRAM__CHUNK_BITS], memory_order_acquire);
    if (!chunk)
        return NULL;
    return atomic_load_explicit(&chunk[id & (ENGRAM__CHUNK - 1)], memory_order_acquire);
}

/* The number of tables in the registry, for walking it without the lock:
 * every id below it has its table published. */
static inline uint32_t engram__table_count(engram_store *st)
{
    /* Acquire pairs with the release store of the append: the tables below
     * the count are visible. */
    return atomic_load_explicit(&st->ntables, memory_order_acquire);
}

/* Finds a live (not removed) table by name without the lock: for readers
 * of tables, which stay valid until close whatever happens meanwhile. */
static inline engram__table *engram__table_find(engram_store *st, const char *name)
{
    uint32_t n = engram__table_count(st);
    for (uint32_t i = 0; i < n; i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_acquire) &&
            strcmp(t->name, name) == 0)
            return t;
    }
    return NULL;
}

/* What a table of `kind` that is not a table file is, in words
 * ("bound to caller memory"): why it cannot be removed, verified or
 * written over. */
const char *engram__bound_kind(uint32_t kind);

/* Finds a live (not removed) table by name; call with st->lock held. */
engram__table *engram__find_locked(engram_store *st, const char *name, engram_table_id *id);

/* 1 if `name` is a table of the store or an entry of its namespace
 * (st->lock held). */
int engram__name_taken_locked(engram_store *st, const char *name);

/* Claims `name` for a table being made (slow work before add_table):
 * waits while another thread opens the same name, then returns 0 with
 * the claim held, or -EEXIST with the message if the name is a table of
 * the store or an entry of its namespace.  Give the claim back with
 * engram__store_unclaim(), after add_table. */
int engram__store_claim(engram_store *st, const char *name);
void engram__store_unclaim(engram_store *st, const char *name);

/* Releases what a source holds: the module's state, the caller's
 * table_ud (through its release) and the row cache.  For a source no
 * table took, and at close. */
void engram__source_release(const engram__source *src);

/* Makes a store of options `opts` with no namespace yet (its opener sets
 * ns, ns_state and path). */
int engram__store_alloc(const engram_store_options *opts, engram_store **out);

/* Releases the sources of the removed tables once no read section can
 * reach them any more, waiting at most wait_ns for the open ones. */
void engram__store_release_removed(engram_store *st, uint64_t wait_ns);

/* Adds a table made by a source module under `name`, which must be free
 * in the store and its namespace (-EEXIST), and returns its id.  On
 * success the table owns the source (its cache and state, released at
 * close); on failure the caller still does. */
int engram__store_add_table(engram_store *st, const char *name, const engram_table_spec *spec,
                            const engram__source *src, engram_table_id *id);

/* Fills the context a source module gets of the store (source.h),
 * making the reader and budget on first use.  0, or -ENOMEM / -EINVAL (a
 * bad queue_depth) with the reason. */
int engram__store_ctx_get(engram_store *st, engram__store_ctx *ctx);

#endif
