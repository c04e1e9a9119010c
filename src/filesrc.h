/*
 * filesrc.h - row sources of tables read from files on demand: table
 * files of the namespace opened with ENGRAM_OPEN_FILE_CACHE, and tensors
 * of safetensors checkpoints (internal).
 *
 * The source's rows are read by the store's reader (reader.h) and sit
 * behind a row cache (rowcache.h) whose size follows the budget's share
 * rule.
 */
#ifndef ENGRAM_FILESRC_H
#define ENGRAM_FILESRC_H

#include <stdint.h>

#include "format.h"
#include "source.h"

/* One segment of a table's rows in a file (see reader.h). */
typedef struct engram__fseg {
    int fd;             /* read-only descriptor of the file */
    uint64_t base;      /* file offset of row 0's bytes of this segment */
    uint64_t stride;    /* bytes between consecutive rows */
    uint32_t len;       /* bytes of each row from this segment */
    uint64_t file_size;
} engram__fseg;

/* Makes the row source of a table of `kind` named `name` whose num_rows
 * rows are the `nseg` segments, taking `size_bytes` of data (the share
 * rule's measure; in_namespace: one of the namespace's table files).
 * `hdr` (may be NULL) is the table file's header, for its info.  The
 * descriptors are consumed: owned by the source on success, closed on
 * failure. */
int engram__filesrc_make(const engram__store_ctx *ctx, uint32_t kind, const char *name,
                         const engram__fseg *segs, unsigned nseg, uint64_t num_rows,
                         uint64_t size_bytes, int in_namespace, const engram__header *hdr,
                         engram__source *src);

/* Records that a source made by engram__filesrc_make() without a header
 * (a safetensors table) serves rows [row_start, row_start + num_rows) of
 * a tensor of total_rows rows, for the table's info.  Call it before the
 * table is added to the store. */
void engram__filesrc_set_range(engram__source *src, uint64_t row_start, uint64_t total_rows);

#endif
