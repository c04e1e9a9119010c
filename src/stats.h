/*
 * stats.h - the store's counters: the per-thread stats slot that lookups
 * count in, and the sums engram_store_stats() and
 * engram_get_cache_stats() report (internal; see stats.c).
 *
 * The lookup path (gather.c, fetch.c, reader.c) only takes its slot and
 * counts; the sums walk the registry without a lock, as lookups do.
 * Nothing here calls back into the store: store.c calls in (for
 * engram_store_stats(), after releasing what removed tables hold).
 */
#ifndef ENGRAM_STATS_H
#define ENGRAM_STATS_H

#include <stddef.h>

#include "engram.h"

/* This thread's stats slot index (< ENGRAM__STATS_SLOTS); *exclusive says
 * whether no other thread uses it. */
unsigned engram__stats_slot(int *exclusive);

/* Fills *out (its size checked by the caller: sizeof(engram_stats)) with
 * the sums of st's counters and tables. */
void engram__stats_sum(engram_store *st, engram_stats *out);

/* Prints the cache stats line on stderr if its interval has passed (a
 * lookup that read rows through a source calls it; log_ns != 0). */
void engram__store_maybe_log(engram_store *st);

#endif
