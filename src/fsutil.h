/*
 * fsutil.h - safe access to directories (roots, namespaces) and their
 * entries, lists of their names, and reading table files (internal).
 */
#ifndef ENGRAM_FSUTIL_H
#define ENGRAM_FSUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "format.h"

/* Opens directory `name` relative to `at` (AT_FDCWD for a path), refusing
 * links, shown as `what` in messages; *sb receives its fstat.  Returns the
 * descriptor, or a negative code with the reason: ENGRAM_EUNSAFE (a link
 * or not a directory), -ENOENT, -errno. */
int engram__open_dir(int at, const char *name, const char *what, struct stat *sb);

/* A growable list of names, for the functions that hand a caller a list
 * (engram_list(), engram_namespace_list()). */
typedef struct engram__namelist {
    char **v;
    size_t n, cap, bytes;
} engram__namelist;

/* Appends a copy of `name`: 0 or -ENOMEM (no message). */
int engram__namelist_add(engram__namelist *l, const char *name);

/* Hands the names over as the public lists are: sorted, without
 * duplicates, in one allocation (the NULL-terminated pointer array, then
 * the strings) for engram_free().  0, or -ENOMEM with a message naming
 * `what`.  `l` still needs engram__namelist_free(). */
int engram__namelist_pack(engram__namelist *l, const char *what, char ***names, size_t *count);

void engram__namelist_free(engram__namelist *l);

/* Opens entry `name` of the namespace directory `dirfd` (shown as `path`
 * in messages) with O_NOFOLLOW, refusing anything but a regular file
 * owned by `uid` that nobody else may write.  Returns the descriptor, or
 * a negative code (-ENOENT, ENGRAM_EUNSAFE, ...) with the reason. */
int engram__open_entry(int dirfd, const char *path, uid_t uid, const char *name, int flags,
                       struct stat *sb);

/* Reads and validates the header of an open table file. */
int engram__read_header(int fd, const struct stat *sb, const char *what, engram__header *h);

/* engram__open_entry() and engram__read_header() of table file `name`,
 * which must hold table `name` (not a renamed file: ENGRAM_ECORRUPT).
 * Returns the descriptor (read-only) with *sb and *h filled, or a
 * negative code with the reason (nothing left open). */
int engram__open_table_file(int dirfd, const char *path, uid_t uid, const char *name,
                            struct stat *sb, engram__header *h);

/* Refuses a table file whose data region has a hole (a sparse copy):
 * reading a hole of a mapping allocates a page, and where the file
 * system is full (any user can fill /dev/shm) the reader gets SIGBUS.
 * 0, or ENGRAM_ECORRUPT with the offset. */
int engram__check_holes(int fd, const engram__header *h, const char *what);

/* Reads len bytes at off, all of them: ENGRAM_ECORRUPT at the end of the
 * file, -errno on a failed read. */
int engram__read_full(int fd, void *buf, size_t len, uint64_t off, const char *what);

/* XXH3-64 of the data of an open table file, with progress. */
int engram__checksum_fd(int fd, const engram__header *h, const char *what,
                        engram_progress_fn progress, void *ud, uint64_t *sum);

#endif
