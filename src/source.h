/*
 * source.h - the seam between the registry of tables and the places their
 * rows live (internal).
 *
 * Every table of a store has one *source*, made by the module of its kind
 * and handed to the registry whole when the table is added
 * (engram__store_add_table(), store.h):
 *
 *  - A memory source has a base address: row i is at base + i * pitch.
 *    The lookup plan computes each row's address and copies it with no
 *    per-row call: the fast path.  Kinds: a mapped table file or its
 *    private huge-page copy (mapfile.c), memory bound by the caller
 *    (store.c, engram_bind).
 *  - A row source has no base address but the public source interface of
 *    engram.h (engram_source_ops: read_rows and its ctx) plus the table's
 *    table_ud.  After validation, the lookup hands every row it needs
 *    from row sources to fetch.c, which deduplicates them, serves what
 *    the table's row cache (rowcache.c) holds, and passes the rest to
 *    read_rows, one call per (read_rows, ctx).  Kinds: table files and
 *    safetensors tensors read with io_uring (filesrc.c over reader.c),
 *    and the caller's own sources (engram_add_source, store.c).  The
 *    library's own row sources implement exactly the public interface.
 *
 * Besides its rows, a source kind may have state to release at close and
 * facts for engram_get_table_info() and engram_get_cache_stats(): the
 * engram__source_vt below.  A source gets what it needs of the store
 * (options, the reader, the cache budget) as arguments from the code that
 * makes it, never by reading the store.
 */
#ifndef ENGRAM_SOURCE_H
#define ENGRAM_SOURCE_H

#include <stdint.h>

#include "engram.h"

struct engram__rcache;
struct engram__reader;
struct engram__cbudget;

/* What a source kind does besides serving rows.  Every member may be
 * NULL. */
typedef struct engram__source_vt {
    /* Frees the source's state at engram_store_close(). */
    void (*release)(void *state);
    /* Adds what the source knows to a table's info (header facts, mapping
     * faults, residency, ...), outside the store's lock. */
    void (*info)(void *state, engram_table_info *info);
    /* Adds the source's own read counters (reads, bytes_read,
     * read_errors, direct_tables) to a table's cache stats.  A source
     * without it has them counted by fetch.c, per row it is handed. */
    void (*cache_stats)(void *state, engram_cache_stats *s);
} engram__source_vt;

/* A table's source, as its module makes it. */
typedef struct engram__source {
    const unsigned char *base;    /* memory sources: row 0; else NULL */
    uint32_t kind;                /* ENGRAM_TABLE_* */
    engram_source_ops ops;        /* row sources: read_rows and ctx (size 0 otherwise) */
    void *table_ud;               /* row sources: handed back in each request */
    struct engram__rcache *cache; /* row sources: the row cache, or NULL (owned) */
    const engram__source_vt *vt;  /* may be NULL */
    void *state;                  /* the module's own, for vt */
    uint64_t ident[2];            /* what it was made from, as its namespace knows it
                                   * (a file's device and inode), for the namespace's
                                   * current_locked() (remote.h); else 0 */
} engram__source;

/* What a source module gets of the store to make a source. */
typedef struct engram__store_ctx {
    struct engram__reader *reader;  /* the store's io_uring reader */
    struct engram__cbudget *budget; /* the store's row cache budget */
    uint32_t flags;                 /* ENGRAM_OPEN_* */
    uint64_t namespace_bytes;       /* bytes of the namespace's table files (the share rule) */
} engram__store_ctx;

#endif
