/*
 * table.h - a table of a store, as the lookup reads it (internal).
 *
 * Tables are made by store.c and freed only at engram_store_close(), so a
 * lookup may hold a table pointer for its whole length, even while the
 * table is being removed.  A removed table's source (its mapping, file
 * and row cache) is released earlier, once no read section can reach it
 * (readsection.h), unless engram_table_memory() lent its memory out.  What a
 * lookup reads of a table comes first; the per-thread-slot counters come
 * last, one cache line per slot.
 */
#ifndef ENGRAM_TABLE_H
#define ENGRAM_TABLE_H

#include <stdatomic.h>
#include <stdint.h>

#include "common.h"
#include "source.h"
#include "stats.h" /* engram__stats_slot(): the slot a lookup counts in */

#define ENGRAM__STATS_SLOTS 16 /* stats slots; one per thread index */

/* Per-thread-slot counters.  A thread with an exclusive slot updates it
 * with relaxed load + store (no locked instruction on the hot path); only
 * threads beyond ENGRAM__STATS_SLOTS share the last slot with atomic adds. */
typedef struct engram__table_counters {
    _Atomic uint64_t lookups, rows; /* every table */
    _Atomic uint64_t hits, misses, dedup, not_kept; /* row sources (fetch.c) */
    _Atomic uint64_t reads, bytes, errors; /* row sources without their own read counters */
} __attribute__((aligned(ENGRAM__CACHELINE))) engram__table_counters;

typedef struct engram__table {
    engram_table_spec spec; /* row_pitch resolved (never 0) */
    atomic_int removed;     /* set by engram_remove() */
    engram__source src;     /* src.base first: the lookup reads it with spec */
    uint64_t data_size;     /* num_rows * row_pitch */
    engram_table_id id;     /* its index in the store's registry */
    atomic_int lent;        /* engram_table_memory() gave its base out: kept until close */
    atomic_int released;    /* removed and its source released (store.c) */
    struct engram__table *retired_next; /* removed, source not yet released (store->lock) */
    char name[ENGRAM_NAME_MAX + 1];
    engram__table_counters ctr[ENGRAM__STATS_SLOTS];
} engram__table;

/* Adds v to a slot counter: plain RMW when the slot is exclusive. */
static inline void engram__ctr_add(_Atomic uint64_t *c, uint64_t v, int exclusive)
{
    if (exclusive)
        atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
                              memory_order_relaxed);
    else
        atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

#endif
