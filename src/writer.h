/*
 * writer.h - what store.c needs of the writer (internal; the writer's
 * own API is public: engram_writer_*).
 */
#ifndef ENGRAM_WRITER_H
#define ENGRAM_WRITER_H

#include <stddef.h>

#include "engram.h"

/* The entry name of w's temporary file in its namespace (a local
 * writer's). */
const char *engram__writer_temp(const engram_writer *w);

/* XXH3-64 of the rows appended to w so far, as they are in the file
 * (the data checksum its commit will record, once all rows are in). */
uint64_t engram__writer_sum(const engram_writer *w);

#endif
