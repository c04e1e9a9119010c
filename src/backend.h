/*
 * backend.h - the seam between the lookup plan and the places a table's
 * bytes live (internal).
 *
 * Every table of a store is an engram__table.  A table whose rows are
 * addressable memory (a mapped table file, a private copy, bound caller
 * memory) sets `base`: the lookup plan then computes each row's address
 * and copies it directly, with no per-row call.  This is the fast path.
 *
 * A table whose rows are not in memory (a file behind a row cache, a
 * remote store) leaves `base` NULL and provides ops->read_rows: the plan,
 * after validating every id, hands it the rows of one column in batches.
 * Nothing else about such a table differs for the plan's callers.
 *
 * Version 1 of the ops table:
 *   version     ENGRAM__BACKEND_VERSION; checked when a table is added.
 *   name        a short backend name for messages and stats.
 *   read_rows   copy row rows[i] (already validated: < num_rows) of table t
 *               into dsts[i] (row_bytes bytes each) for i < n.  Called from
 *               any lookup thread at once; must be thread-safe.  Returns 0
 *               or a negative code with engram__err() detail.  On failure,
 *               output rows of that column may have been written.
 *   release     frees the backend's state of t at engram_store_close().
 */
#ifndef ENGRAM_BACKEND_H
#define ENGRAM_BACKEND_H

#include <stdint.h>
#include <stddef.h>

#include "engram.h"

#define ENGRAM__BACKEND_VERSION 1u

struct engram__table;

typedef struct engram__backend_ops {
    uint32_t version;
    const char *name;
    int (*read_rows)(struct engram__table *t, size_t n, const uint64_t *rows,
                     unsigned char *const *dsts);
    void (*release)(struct engram__table *t);
} engram__backend_ops;

/* Adds a table served by `ops` to the store under `name` (which must not
 * exist there) and returns its id.  `base` may be NULL (rows reached
 * through ops->read_rows).  On success the store owns `state` and calls
 * ops->release at close. */
int engram__store_add_table(engram_store *st, const char *name, const engram_table_spec *spec,
                            const unsigned char *base, const engram__backend_ops *ops,
                            void *state, engram_table_id *id);

#endif
