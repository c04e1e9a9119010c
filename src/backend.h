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
 * after validating every id, hands it all its rows of the lookup at once.
 * Nothing else about such a table differs for the plan's callers.
 *
 * Version 2 of the ops table:
 *   version     ENGRAM__BACKEND_VERSION; checked when a table is added.
 *   name        a short backend name for messages and stats.
 *   read_rows   copy row rows[i] (already validated: < num_rows) of table
 *               tabs[i] into dsts[i] (row_bytes bytes each) for i < n.
 *               Every tabs[i] has these ops, but one call may carry rows
 *               of several tables and columns: the plan hands a backend all
 *               its rows of a lookup in one call (in batches of
 *               ENGRAM__BACKEND_BATCH only beyond that many rows), so it
 *               can dedupe repeated rows and keep its reads in flight over
 *               all of them: reads drain only at the end of a call.  A
 *               call from the plan has at most ENGRAM__BACKEND_BATCH
 *               rows, so a backend may size its scratch by it.  The
 *               backend may serve the rows in any order.  Called from any
 *               lookup thread at once; must be thread-safe.  Returns 0 or
 *               a negative code with engram__err() detail.  On failure,
 *               some output rows of the call may have been written, each
 *               with its correct bytes; a row whose bytes could not be
 *               read is not written.
 *   release     frees the backend's state of t at engram_store_close().
 *
 * Version 1 passed one table per call (the rows of one column).
 */
#ifndef ENGRAM_BACKEND_H
#define ENGRAM_BACKEND_H

#include <stdint.h>
#include <stddef.h>

#include "engram.h"

#define ENGRAM__BACKEND_VERSION 2u
/* Rows of one read_rows call at most from the plan: large enough that
 * the drain at the end of a call is noise (one read latency per 65536
 * rows), small enough to bound the scratch of a huge lookup (24 bytes a
 * row in the plan, about 60 in the file cache). */
#define ENGRAM__BACKEND_BATCH 65536

struct engram__table;

typedef struct engram__backend_ops {
    uint32_t version;
    const char *name;
    int (*read_rows)(size_t n, struct engram__table *const *tabs, const uint64_t *rows,
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
