/*
 * capacity.h - whether new table files fit in a namespace (internal; see
 * capacity.c).
 */
#ifndef ENGRAM_CAPACITY_H
#define ENGRAM_CAPACITY_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

/* Bytes a table file of `spec` takes on a file system of `block`-byte
 * blocks (0: 4096): the header's block and the data region.  UINT64_MAX
 * for a spec that does not fit. */
uint64_t engram__table_file_bytes(const engram_table_spec *spec, uint64_t block);

/* 0 if `bytes` of new table files fit in the directory open at `dirfd`
 * (named `path` in messages): the file system's free space and, on a
 * tmpfs, the room of the calling process's memory cgroup.  Else -ENOSPC
 * with the figures and the fix, `what` naming what needs the bytes
 * ("table 'x'", or with plural set "3 tables"). */
int engram__capacity_check(int dirfd, const char *path, uint64_t bytes, const char *what,
                           int plural);

/* The directory of the calling process's memory cgroup (v1's memory
 * controller where mounted, else v2) and whether it is v2: 0, or -1 if
 * none is found.  For the tests. */
int engram__memcg_dir(char *dir, size_t cap, int *v2);

#endif
