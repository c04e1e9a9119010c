/*
 * lease.h - who uses a namespace (internal; see lease.c).
 */
#ifndef ENGRAM_LEASE_H
#define ENGRAM_LEASE_H

#include <stddef.h>
#include <sys/types.h>

#include "engram.h"

#define ENGRAM__LEASE_PREFIX ".lease."
#define ENGRAM__TMP_PREFIX ".tmp."

/* Takes store st's lease on its namespace unless it holds one (at its
 * first table open).  Best effort: where the namespace cannot be written
 * (a group member's store), there is no lease. */
void engram__lease_take(engram_store *st);

/* Drops st's lease (at close): the file is removed by the process that
 * made it, unless children it forked still hold the lock; a forked child
 * only closes its descriptor. */
void engram__lease_drop(engram_store *st);

/* Whether entry `name` of the directory open at `dirfd` is a lease of a
 * live process: 1 (`who` gets what its holder wrote: pid, start time,
 * command), 2 if this process holds it (one of its stores, or a store it
 * inherited across fork), 0 if its holder is gone (a
 * stale lease), -1 if it is not a lease file of `uid`.  *mtime_ns gets
 * the file's modification time. */
int engram__lease_state(int dirfd, uid_t uid, const char *name, char *who, size_t cap,
                        uint64_t *mtime_ns);

#endif
