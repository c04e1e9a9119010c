/*
 * swap_open.c - an LD_PRELOAD shim for tests/cli/run.sh: right after the
 * first successful open of the path $ENGRAM_SWAP_PATH (compared as the
 * string passed to open), renames $ENGRAM_SWAP_WITH over it, as any user
 * who can write the file's directory could do between two opens of the
 * path.  The test then sees whether the CLI reads the file it checked or
 * opens the path again (and gets the other file, or blocks on a FIFO).
 *
 * Interposes the libc entry points a program's open() may end up in
 * (open, open64, openat, openat64 and the _FORTIFY_SOURCE variants).
 * Test-only; built without sanitizers, since it is loaded before their
 * runtimes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);

static int swapped;

static void after_open(const char *path, int fd)
{
    const char *target = getenv("ENGRAM_SWAP_PATH"), *with = getenv("ENGRAM_SWAP_WITH");
    if (fd < 0 || swapped || !target || !with || strcmp(path, target) != 0)
        return;
    swapped = 1;
    if (rename(with, target) != 0) {
        perror("swap_open: rename");
        abort();
    }
}

static mode_t mode_arg(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

/* Defines `name` (parameters PARAMS, the last named one `flags`), which
 * calls the next definition of `name` (of type TYPE) with ARGS and then
 * after_open(). */
#define INTERPOSE(name, TYPE, PARAMS, ARGS)                    \
    int name PARAMS                                            \
    {                                                          \
        static TYPE real;                                      \
        va_list ap;                                            \
        mode_t mode;                                           \
        int fd;                                                \
        if (!real)                                             \
            real = (TYPE)dlsym(RTLD_NEXT, #name);              \
        va_start(ap, flags);                                   \
        mode = mode_arg(flags, ap);                            \
        va_end(ap);                                            \
        fd = real ARGS;                                        \
        after_open(path, fd);                                  \
        return fd;                                             \
    }

INTERPOSE(open, open_fn, (const char *path, int flags, ...), (path, flags, mode))
INTERPOSE(open64, open_fn, (const char *path, int flags, ...), (path, flags, mode))
INTERPOSE(openat, openat_fn, (int dirfd, const char *path, int flags, ...),
          (dirfd, path, flags, mode))
INTERPOSE(openat64, openat_fn, (int dirfd, const char *path, int flags, ...),
          (dirfd, path, flags, mode))

int __open_2(const char *path, int flags)
{
    return open(path, flags);
}

int __open64_2(const char *path, int flags)
{
    return open64(path, flags);
}

int __openat_2(int dirfd, const char *path, int flags)
{
    return openat(dirfd, path, flags);
}

int __openat64_2(int dirfd, const char *path, int flags)
{
    return openat64(dirfd, path, flags);
}
