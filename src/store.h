/*
 * store.h - the store and table objects shared by store.c, writer.c and
 * gather.c (internal).
 *
 * Tables live in a registry of fixed-size chunks that is only ever
 * appended to: an engram_table_id is an index into it and stays valid
 * until the store closes.  Lookups read the registry without a lock
 * (acquire loads of pointers published with release stores); writers of
 * the registry hold store->lock.  Table objects are freed only at close,
 * which is why engram_remove() never invalidates memory a concurrent
 * lookup may be reading.
 */
#ifndef ENGRAM_STORE_H
#define ENGRAM_STORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "backend.h"
#include "common.h"
#include "format.h"

#define ENGRAM__CHUNK_BITS 8
#define ENGRAM__CHUNK (1u << ENGRAM__CHUNK_BITS)
#define ENGRAM__MAX_CHUNKS 256 /* 65536 tables per store */
#define ENGRAM__SHARDS 16      /* stats shards; one per thread index */

/* Per-thread-shard counters.  A thread with an exclusive shard updates it
 * with relaxed load + store (no locked instruction on the hot path); only
 * threads beyond ENGRAM__SHARDS share the last shard with atomic adds. */
typedef struct engram__table_counters {
    _Atomic uint64_t lookups, rows;
} __attribute__((aligned(ENGRAM__CACHELINE))) engram__table_counters;

typedef struct engram__store_counters {
    _Atomic uint64_t lookups, failed, rows, dead, bytes, parallel, time_ns;
} __attribute__((aligned(ENGRAM__CACHELINE))) engram__store_counters;

typedef struct engram__table {
    /* What a lookup reads comes first: one cache line per table. */
    const unsigned char *base;    /* row 0, or NULL: use ops->read_rows */
    engram_table_spec spec;       /* row_pitch resolved (never 0) */
    atomic_int removed;           /* set by engram_remove() */
    uint32_t kind;                /* ENGRAM_TABLE_FILE / BOUND / other backends */
    const engram__backend_ops *ops;
    void *state;                  /* the backend's own */
    uint64_t data_size;
    char name[ENGRAM_NAME_MAX + 1];
    /* File tables: the header as read, and how the memory was obtained. */
    engram__header hdr;
    void *map_addr;
    size_t map_len;
    int private_copy;
    uint64_t minor_faults, major_faults;
    engram__table_counters ctr[ENGRAM__SHARDS];
} engram__table;

typedef struct engram__pool engram__pool;
typedef struct engram__fcache engram__fcache;

/* sizeof(engram_store_options) before the row cache fields were added. */
#define ENGRAM__STORE_OPTIONS_V1_SIZE offsetof(engram_store_options, cache_bytes)

struct engram_store {
    int dirfd;                    /* namespace directory, or -1 for a memory store */
    char *path;                   /* root/ns, for messages */
    engram_store_options opts;
    uid_t uid;                    /* the namespace's owner: the only uid whose files we trust */
    pthread_mutex_t lock;         /* registry writes, bind/populate/remove bookkeeping */
    _Atomic(engram__table *) *_Atomic chunks[ENGRAM__MAX_CHUNKS];
    uint32_t ntables;             /* registry length, under lock */
    engram__pool *pool;           /* NULL when threads == 1 */
    engram__fcache *fcache;       /* the row cache's shared state (filecache.c), created
                                   * with the first cache-backed table; under lock */
    int threads;
    size_t parallel_min_rows;
    engram__store_counters ctr[ENGRAM__SHARDS];
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

/* This thread's stats shard index (< ENGRAM__SHARDS); *exclusive says
 * whether no other thread uses it. */
unsigned engram__shard(int *exclusive);

/* Adds v to a shard counter: plain RMW when the shard is exclusive. */
static inline void engram__ctr_add(_Atomic uint64_t *c, uint64_t v, int exclusive)
{
    if (exclusive)
        atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
                              memory_order_relaxed);
    else
        atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* Finds a live (not removed) table by name; call with st->lock held. */
engram__table *engram__find_locked(engram_store *st, const char *name, engram_table_id *id);

/* 1 if `name` exists as an entry of the namespace directory (any type). */
int engram__dir_has(engram_store *st, const char *name);

/* Safe opening of entries of the namespace directory (fsutil.c). */
int engram__open_entry(engram_store *st, const char *name, int flags, struct stat *sb);

/* Reads and validates the header of an open table file. */
int engram__read_header(int fd, const struct stat *sb, const char *what, engram__header *h);

/* Mapping of file tables per the store's options (mem.c). */
int engram__map_file_table(engram_store *st, engram__table *t, int fd);
void engram__unmap_table(engram__table *t);
/* Resident and huge-page bytes of [addr, addr+len) from /proc/self/smaps. */
int engram__smaps_coverage(const void *addr, size_t len, uint64_t *resident, uint64_t *huge);
/* XXH3-64 of the data of an open table file, with progress. */
int engram__checksum_fd(int fd, const engram__header *h, const char *what,
                        engram_progress_fn progress, void *ud, uint64_t *sum);

/* Cache-backed tables (filecache.c).  attach_file serves the open table
 * file `fd` (not consumed) through the row cache instead of mapping it;
 * call with st->lock held.  destroy frees the shared state after every
 * table was released; accepts NULL. */
int engram__fcache_attach_file(engram_store *st, engram__table *t, int fd);
void engram__fcache_destroy(engram__fcache *fc);

/* Stale temporary files of dead writers (writer.c). */
void engram__clean_temps(engram_store *st);

/* Thread pool (pool.c): runs fn(arg, part, nparts) for part < nparts, the
 * caller running part 0.  Returns -EBUSY at once if another lookup holds
 * the pool (the caller then does the whole job itself). */
typedef void (*engram__job_fn)(void *arg, size_t part, size_t nparts);
int engram__pool_create(int workers, engram__pool **out);
void engram__pool_destroy(engram__pool *p);
int engram__pool_run(engram__pool *p, engram__job_fn fn, void *arg, size_t nparts);

#endif
