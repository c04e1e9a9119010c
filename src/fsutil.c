/*
 * fsutil.c - safe access to the namespace directory and its entries.
 *
 * Namespaces often live on /dev/shm, which every user can write.  Every
 * entry is therefore opened relative to the namespace's directory fd with
 * O_NOFOLLOW (a link is refused, never followed), checked with fstat on
 * the opened fd (no check-then-open race), and refused unless it is a
 * regular file owned by us that nobody else can write.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store.h"

int engram__open_entry(engram_store *st, const char *name, int flags, struct stat *sb)
{
    int fd, err;
    /* O_NONBLOCK keeps a FIFO planted under a table name from blocking us;
     * it is refused below as not a regular file. */
    fd = openat(st->dirfd, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        err = errno;
        if (err == ELOOP)
            return engram__err(ENGRAM_EUNSAFE, "%s/%s is a symbolic link; refusing to follow it",
                               st->path, name);
        if (err == ENOENT)
            return engram__err(-ENOENT, "table '%s' not found in %s", name, st->path);
        return engram__errno(err, "open %s/%s", st->path, name);
    }
    if (fstat(fd, sb) != 0) {
        err = engram__errno(errno, "fstat %s/%s", st->path, name);
        goto fail;
    }
    if (!S_ISREG(sb->st_mode)) {
        err = engram__err(ENGRAM_EUNSAFE, "%s/%s is not a regular file", st->path, name);
        goto fail;
    }
    if (sb->st_uid != st->uid) {
        err = engram__err(ENGRAM_EUNSAFE, "%s/%s is owned by uid %u, not by the namespace owner (uid %u)",
                          st->path, name, (unsigned)sb->st_uid, (unsigned)st->uid);
        goto fail;
    }
    if (sb->st_mode & (S_IWGRP | S_IWOTH)) {
        err = engram__err(ENGRAM_EUNSAFE, "%s/%s is writable by group or others (mode %03o)",
                          st->path, name, (unsigned)(sb->st_mode & 0777));
        goto fail;
    }
    /* The O_NONBLOCK was only for the open itself. */
    if (fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        err = engram__errno(errno, "fcntl %s/%s", st->path, name);
        goto fail;
    }
    return fd;
fail:
    close(fd);
    return err;
}

int engram__read_header(int fd, const struct stat *sb, const char *what, engram__header *h)
{
    unsigned char buf[ENGRAM__HEADER_SIZE];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t n = pread(fd, buf + got, sizeof buf - got, (off_t)got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return engram__errno(errno, "read header of %s", what);
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return engram__header_parse(buf, got, (uint64_t)sb->st_size, what, h);
}
