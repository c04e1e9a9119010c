/*
 * mapfile.h - memory sources of table files: the shared mapping or a
 * private huge-page copy (internal).
 *
 * The default is a read-only MAP_SHARED mapping of the data region: every
 * process of the node then shares the same physical pages (on tmpfs, the
 * file's own pages).  The store's flags add MAP_POPULATE, MADV_RANDOM,
 * mlock, checksum verification, or a private anonymous copy backed by
 * transparent huge pages.
 */
#ifndef ENGRAM_MAPFILE_H
#define ENGRAM_MAPFILE_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"
#include "numa.h"
#include "source.h"

/* Makes the memory source of the open table file fd (not consumed) whose
 * header is h, with the store's ENGRAM_OPEN_* `flags`; a private copy is
 * placed by `numa` (numa.h).  `name` names it in messages. */
int engram__mapfile_make(int fd, const engram__header *h, uint32_t flags,
                         const engram__numa *numa, const char *name, engram__source *src);

/* 1 if `src` is a table file's source serving a private copy. */
int engram__mapfile_is_private(const engram__source *src);

/* Resident and huge-page bytes of [addr, addr+len) from /proc/self/smaps. */
int engram__smaps_coverage(const void *addr, size_t len, uint64_t *resident, uint64_t *huge);

#endif
