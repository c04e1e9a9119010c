/*
 * writer.h - what store.c needs of the writer (internal; the writer's
 * own API is public: engram_writer_*).
 */
#ifndef ENGRAM_WRITER_H
#define ENGRAM_WRITER_H

#include <stddef.h>
#include <sys/types.h>

#include "engram.h"

/* Removes stale temporary files of dead writers from the namespace. */
void engram__clean_temps(engram_store *st);

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

/* "by pid P, which has held it for N s now" for the running writer whose
 * temporary file `ent` is open at `fd` (see engram__temp_state()). */
void engram__temp_holder(int fd, const char *ent, char *who, size_t cap);

/* Waits until the lock of the writer's temporary file open at `fd` is
 * free (it committed, aborted or died), or until `deadline`
 * (CLOCK_MONOTONIC ns; UINT64_MAX: none).  0, or -ETIMEDOUT (no
 * message). */
int engram__wait_writer(int fd, uint64_t deadline);

/* engram__live_writer() of a writer other than the one whose temporary
 * file's entry is `mine` (NULL: any). */
int engram__live_writer_other(engram_store *st, const char *name, const char *mine, char *ent,
                              size_t cap);

/* The entry name of w's temporary file in its namespace (a local
 * writer's). */
const char *engram__writer_temp(const engram_writer *w);

/* XXH3-64 of the rows appended to w so far, as they are in the file
 * (the data checksum its commit will record, once all rows are in). */
uint64_t engram__writer_sum(const engram_writer *w);

#endif
