/*
 * rowcache.h - the row cache: a bounded, exact, set-associative cache of
 * rows in front of any row source, and the store's memory budget for it
 * (internal).
 *
 * One engram__cbudget per store holds cache_bytes and charges everything
 * the cache and its reads keep in memory: each table's sets and slots
 * (engram__rcache_create) and the io_uring reader's staging
 * (engram__cbudget_reserve, asked for by reader.c).  The sum never
 * exceeds the budget, and caches never take the eighth of it kept for the
 * staging; the sharing rule is in engram.h, above engram_get_cache_stats().
 *
 * A table's cache is nsets sets of ENGRAM_CACHE_WAYS slots and a sketch
 * of how often missed rows were asked for (its admission filter).  A set
 * is its lock, CLOCK state and tags in one cache line; get and put hold
 * the set's lock while they copy, so a slot is never read half-written.  fetch.c is
 * the only user on the lookup path.
 */
#ifndef ENGRAM_ROWCACHE_H
#define ENGRAM_ROWCACHE_H

#include <stdint.h>

#include "engram.h"

#define ENGRAM__CACHE_DEFAULT_BUDGET ((uint64_t)256 << 20)

typedef struct engram__cbudget engram__cbudget;
typedef struct engram__rcache engram__rcache;

int engram__cbudget_create(uint64_t budget, engram__cbudget **out);
/* Accepts NULL.  Every cache must have been destroyed. */
void engram__cbudget_destroy(engram__cbudget *b);
uint64_t engram__cbudget_total(const engram__cbudget *b);
/* Bytes reserved for staging now. */
uint64_t engram__cbudget_staging(const engram__cbudget *b);

/* Sets the staging reservation to `want` bytes if the budget has room for
 * it besides the slots already given out, else to `need` if that fits,
 * and returns the bytes reserved in *got; -ENOBUFS (with a message
 * naming `what`) if even `need` does not fit.  A reservation only grows:
 * a smaller want keeps what is reserved. */
int engram__cbudget_reserve(engram__cbudget *b, uint64_t want, uint64_t need, const char *what,
                            uint64_t *got);

/* How many bytes a new cache asks for. */
typedef struct engram__cache_want {
    uint64_t bytes;           /* explicit (source tables); 0: the share rule below */
    uint64_t size_bytes;      /* the share rule: the table's data bytes ... */
    uint64_t namespace_bytes; /* ... among the namespace's table files ... */
    int in_namespace;         /* ... of which it is one (1) or not (0: a checkpoint) */
} engram__cache_want;

/* Makes a cache of rows of `row_bytes` bytes for a table of `num_rows`
 * rows, of the bytes `want` asks for, capped by what the budget has left.
 * *out is NULL (and 0 returned) where that is less than one set: the
 * table then reads every row from its source.  Of the store's open
 * `flags`: ENGRAM_OPEN_PREFAULT touches the memory now,
 * ENGRAM_OPEN_MLOCK mlocks it, ENGRAM_OPEN_CACHE_KEEP_ALL turns the
 * admission filter off.  -ENOMEM, or the mlock's error, with a message
 * naming `what`. */
int engram__rcache_create(engram__cbudget *b, const engram__cache_want *want, uint32_t row_bytes,
                          uint64_t num_rows, uint32_t flags, const char *what,
                          engram__rcache **out);
/* Frees a cache and gives its bytes back to the budget.  Accepts NULL. */
void engram__rcache_destroy(engram__rcache *c);

/* Copies `row` into dst if the cache holds it: 1 on a hit, else 0. */
int engram__rcache_get(engram__rcache *c, uint64_t row, void *dst);
/* Counts `asks` more asks of `row`, a missed row of a lookup (asks: the
 * positions that ask for it), in the cache's admission sketch, and returns
 * its estimate, this one included, for engram__rcache_put().  It does not
 * age the sketch: engram__rcache_age() does, with the sum of the asks
 * counted (once per lookup part, so that a lookup makes one atomic add per
 * cache, not one per row).  A cache without the filter
 * (ENGRAM_OPEN_CACHE_KEEP_ALL) counts nothing and returns an estimate that
 * admits. */
unsigned engram__rcache_count(engram__rcache *c, uint64_t row, uint32_t asks);
void engram__rcache_age(engram__rcache *c, uint64_t asks);
/* Starts loading the sketch block of `row` (a few rows before count). */
void engram__rcache_prefetch_count(const engram__rcache *c, uint64_t row);
/* Offers `row`, just read, whose bytes are at src (row_bytes of them),
 * with the estimate engram__rcache_count() gave.  A set with a free way
 * takes it; a full one evicts a row by CLOCK only for an estimate of at
 * least two asks (rowcache.c: admission); a row already there is left as
 * it is.  Returns 1 if the filter declined the row (its set was full),
 * else 0. */
int engram__rcache_put(engram__rcache *c, uint64_t row, const void *src, unsigned est);
/* Starts loading the set line of `row` (a few rows before get). */
void engram__rcache_prefetch_set(const engram__rcache *c, uint64_t row);
/* Peeks at the (prefetched) tags of `row`'s set without the lock and
 * starts loading the slot that holds it, if any (one step later). */
void engram__rcache_prefetch_slot(const engram__rcache *c, uint64_t row);

/* Adds the cache's size (cache_bytes, slots) to *s. */
void engram__rcache_stats(const engram__rcache *c, engram_cache_stats *s);

#endif
