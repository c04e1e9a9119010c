/*
 * writer.h - what the library needs of the writer besides its public
 * API (engram_writer_*) (internal).
 */
#ifndef ENGRAM_WRITER_H
#define ENGRAM_WRITER_H

#include <stddef.h>

#include "engram.h"

/* The namespace's writer (remote.h) of w. */
void *engram__writer_impl(const engram_writer *w);

/* Rows written in place, without a copy (a pull's transfer lands in the
 * table file): engram__writer_region(w, bytes) is w's data region, mapped
 * writable until commit or abort, where the caller writes every row
 * itself (`bytes`, exactly the table's packed rows), then appends each
 * next n rows from where they are (engram_writer_append(w, region + done
 * * row_bytes, n, 0)), in order, once they are there: they are hashed
 * there and not copied.  NULL where rows cannot go in place (the
 * namespace takes none so: a disk, a remote; rows with a pitch; bytes not
 * the table's; once rows were appended; the writer failed; the mapping
 * failed): append them from elsewhere. */
unsigned char *engram__writer_region(engram_writer *w, uint64_t bytes);

struct engram__numa;

/* engram_populate_shared() in st's namespace (which the caller checked
 * there is), with NUMA placement `pl` (NULL: the store's) and, where
 * total_rows is not 0, the row range [row_start, row_start + num_rows)
 * of total_rows (engram_numa_copy()). */
int engram__populate_shared(engram_store *st, const char *name, const engram_table_spec *spec,
                            const void *rows, size_t src_stride, uint64_t row_start,
                            uint64_t total_rows, const struct engram__numa *pl, int timeout_ms,
                            int *written);

#endif
