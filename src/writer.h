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
