/*
 * lease.h - who is alive in a namespace directory: the leases of the
 * stores that use it and the temporary files of the writers that write
 * in it (internal; the protocol is described once, at the top of
 * lease.c).
 */
#ifndef ENGRAM_LEASE_H
#define ENGRAM_LEASE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engram.h"

#define ENGRAM__LEASE_PREFIX ".lease."
#define ENGRAM__TMP_PREFIX ".tmp."

/* ---- Leases ---- */

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

/* ---- Writers' temporary files ---- */

/* Whether `ent` is a temporary file's name, ".tmp.<table>.<pid>.<hex
 * nonce>" exactly (the one parser of that name): 1 with the table's name
 * into table[cap] (may be NULL) and the pid into *pid (may be NULL; -1
 * where it has more than 9 digits), else 0. */
int engram__temp_parse(const char *ent, char *table, size_t cap, long *pid);

/* Creates a temporary file for table `table` in st's namespace and takes
 * its lock (step 1 of the protocol): 0 with its descriptor in *fd and its
 * entry's name in tmp[cap], or a negative code with the reason. */
int engram__temp_create(engram_store *st, const char *table, char *tmp, size_t cap, int *fd);

/* What an entry named ".tmp.*" of a namespace is (engram__temp_state()). */
#define ENGRAM__TEMP_STRAY (-1) /* no writer's: not a regular file of the owner */
#define ENGRAM__TEMP_DEAD 0     /* a temporary file whose writer is gone (its lock is free) */
#define ENGRAM__TEMP_LIVE 1     /* the temporary file of a running writer */
#define ENGRAM__TEMP_GONE 2     /* removed meanwhile */

/* Whether entry `ent` ("." TMP_PREFIX ...) of the directory open at
 * `dirfd`, owned by `uid`, is a running writer's temporary file.  For a
 * live one, `who` (may be NULL) gets "by pid P, which has held it for N s
 * now" (the pid the file's name holds: the writer's in its own PID
 * namespace; the time since the file was made), and *fd (may be NULL) a
 * descriptor of it, whose lock the caller may wait for; it is the
 * caller's to close.  Never follows a link, never blocks on a FIFO. */
int engram__temp_state(int dirfd, uid_t uid, const char *ent, char *who, size_t cap, int *fd);

/* A descriptor of the temporary file of a running writer of table `name`
 * in st's namespace (its entry's name into ent[cap]), or -1 if none is
 * writing it; the caller closes it. */
int engram__live_writer(engram_store *st, const char *name, char *ent, size_t cap);

/* engram__live_writer() of a writer other than the one whose temporary
 * file's entry is `mine` (NULL: any). */
int engram__live_writer_other(engram_store *st, const char *name, const char *mine, char *ent,
                              size_t cap);

/* "by pid P, which has held it for N s now" for the running writer whose
 * temporary file `ent` is open at `fd` (see engram__temp_state()). */
void engram__temp_holder(int fd, const char *ent, char *who, size_t cap);

/* Waits until the lock of the writer's temporary file open at `fd` is
 * free (it committed, aborted or died), or until `deadline`
 * (CLOCK_MONOTONIC ns; UINT64_MAX: none).  0, or -ETIMEDOUT (no
 * message). */
int engram__wait_writer(int fd, uint64_t deadline);

/* ---- Cleanup ---- */

/* Removes the files of the dead from st's namespace: stale leases and
 * dead writers' temporary files. */
void engram__clean_temps(engram_store *st);

#endif
