/*
 * fetch.h - the rows of one lookup that come from row sources:
 * deduplicated, served from the row cache where it holds them, read from
 * their sources otherwise (internal).
 *
 * gather.c calls engram__fetch() once per lookup, after validation and
 * after copying the rows of memory sources, with every live row of the
 * lookup whose table has a row source.
 */
#ifndef ENGRAM_FETCH_H
#define ENGRAM_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

typedef struct engram__fetch_req {
    engram__table *t;   /* has a row source */
    uint64_t row;       /* validated: < t->spec.num_rows */
    unsigned char *dst; /* t->spec.row_bytes bytes */
} engram__fetch_req;

/* Serves the n requests.  Returns 0, or the first failure (its message
 * names the table): every request whose row could be read is written
 * with its bytes, the others are untouched.  -ENOMEM if the scratch for
 * deduplication cannot grow (never after engram__fetch_reserve(n)). */
int engram__fetch(const engram__fetch_req *reqs, size_t n);

/* Grows this thread's scratch for a call of engram__fetch() with n
 * requests, so that the call allocates nothing: the lookup reserves it
 * before it writes its first output row.  0 or -ENOMEM. */
int engram__fetch_reserve(size_t n);

/* 1 while this thread is inside a source's read_rows (where a lookup
 * must not run: its scratch is in use). */
int engram__fetch_in_source(void);

#endif
