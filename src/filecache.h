/*
 * filecache.h - tables served from files through the row cache (internal).
 *
 * A cache-backed table is one or two *segments*: a row of the table is
 * the concatenation of each segment's `len` bytes at file offset
 * base + row * stride of that segment's file.  A table file of the
 * namespace is one segment (its data region at its row pitch); a
 * safetensors weight + scale pair is two (the two planes, possibly in two
 * shard files).  Every cache-backed table of a store shares the store's
 * io_uring rings and its cache budget (the rule is in engram.h, above
 * engram_get_cache_stats()).
 *
 * safetensors.c builds segments and calls engram__fcache_new_table();
 * store.c calls engram__fcache_attach_file() for a table file.  Tests
 * inject read failures through engram__fcache_set_read_hook().
 */
#ifndef ENGRAM_FILECACHE_H
#define ENGRAM_FILECACHE_H

#include <stdint.h>

#include "store.h"

#define ENGRAM__FC_MAX_SEGS 2
#define ENGRAM__FC_DEFAULT_BUDGET ((uint64_t)256 << 20)
#define ENGRAM__FC_DEFAULT_QD 64u
#define ENGRAM__FC_MAX_QD 4096u

typedef struct engram__fc_seg {
    int fd;           /* read-only descriptor of the file (consumed by new_table) */
    uint64_t base;    /* file offset of row 0's bytes of this segment */
    uint64_t stride;  /* bytes between consecutive rows */
    uint32_t len;     /* bytes of each row from this segment */
    uint64_t file_size;
} engram__fc_seg;

/* engram__fcache_new_table() flags */
#define ENGRAM__FC_LOCKED 1u       /* the caller holds st->lock */
#define ENGRAM__FC_IN_NAMESPACE 2u /* a file of the namespace (already in the budget's
                                    * denominator) */

/* Creates the cache state of a table of `num_rows` rows made of `nseg`
 * segments, whose data occupies `size_bytes` (for the budget rule), and
 * returns it in *state with the ops to pass to engram__store_add_table().
 * The segment descriptors are consumed (closed on failure, owned by the
 * state on success).  `what` names the table in messages. */
int engram__fcache_new_table(engram_store *st, const engram__fc_seg *segs, unsigned nseg,
                             uint64_t num_rows, uint64_t size_bytes, const char *what,
                             unsigned flags, const engram__backend_ops **ops, void **state);

/* Frees a state from engram__fcache_new_table() that no table took, and
 * gives its share of the cache budget back (takes st->lock). */
void engram__fcache_free_state(void *state);

/* Test hook: called with each completed read before it is checked, with
 * the kernel's result `res` (bytes or -errno) and the bytes read; returns
 * the result to use instead (e.g. -EIO, or fewer bytes: the rest of the
 * row is then read, and the hook called again; 0 there is the end of the
 * file).  row is
 * UINT64_MAX for the O_DIRECT probe read made when a table is opened
 * (a negative result there makes the table use buffered reads).  NULL
 * removes the hook.  Not for production use; set it while no lookup runs. */
typedef int (*engram__fc_read_hook)(void *ud, const char *table, uint64_t row, unsigned seg,
                                    int res, unsigned char *data);
void engram__fcache_set_read_hook(engram__fc_read_hook fn, void *ud);

#endif
