/*
 * nsdir.h - a namespace that is a directory (internal; see nsdir.c).
 */
#ifndef ENGRAM_NSDIR_H
#define ENGRAM_NSDIR_H

#include "engram.h"
#include "remote.h"

/* The namespace interface (remote.h) of a directory: its state is the
 * store itself. */
extern const engram__remote_vt engram__nsdir_vt;

/* engram_store_open(), with `clean` 0: the stale leases and dead
 * writers' temporary files are left where they are (a gc dry run looks
 * and changes nothing). */
int engram__store_open_dir(const char *root, const char *ns, const engram_store_options *opts,
                           int clean, engram_store **out);

/* The entry name of w's temporary file in its namespace, and the XXH3-64
 * of the rows appended to w so far, as they are in the file (the data
 * checksum its commit will record, once all rows are in): of a writer
 * of a directory store (engram_pull()). */
const char *engram__writer_temp(const engram_writer *w);
uint64_t engram__writer_sum(const engram_writer *w);

#endif
