/*
 * fsutil.c - safe access to directories (roots, namespaces) and their
 * entries, and lists of their names.
 *
 * Namespaces often live on /dev/shm, which every user can write.  Every
 * entry is therefore opened relative to the namespace's directory fd with
 * O_NOFOLLOW (a link is refused, never followed), checked with fstat on
 * the opened fd (no check-then-open race), and refused unless it is a
 * regular file owned by us that nobody else can write.
 */
#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xxh.h"

#include "common.h"
#include "fsutil.h"

#define IO_CHUNK ((size_t)8 << 20)

int engram__open_dir(int at, const char *name, const char *what, struct stat *sb)
{
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), err;
    if (fd < 0) {
        err = errno;
        if (err == ELOOP || err == ENOTDIR)
            return engram__err(ENGRAM_EUNSAFE, "%s is a link or not a directory", what);
        if (err == ENOENT)
            return engram__err(-ENOENT, "%s does not exist", what);
        return engram__errno(err, "open %s", what);
    }
    if (fstat(fd, sb) != 0) {
        err = engram__errno(errno, "fstat %s", what);
        close(fd);
        return err;
    }
    return fd;
}

int engram__namelist_add(engram__namelist *l, const char *name)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(name)))
        return -ENOMEM;
    l->bytes += strlen(name) + 1;
    l->n++;
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int engram__namelist_pack(engram__namelist *l, const char *what, char ***names, size_t *count)
{
    char **outv, *s;
    size_t n = 0;

    if (l->n > 1)
        qsort(l->v, l->n, sizeof *l->v, cmp_names);
    /* One block: the pointer array, then the strings, freed by one free(). */
    outv = malloc((l->n + 1) * sizeof(char *) + l->bytes + 1);
    if (!outv)
        return engram__err(-ENOMEM, "out of memory listing %s", what);
    s = (char *)(outv + l->n + 1);
    for (size_t i = 0; i < l->n; i++) {
        if (n > 0 && strcmp(outv[n - 1], l->v[i]) == 0)
            continue;
        size_t len = strlen(l->v[i]) + 1;
        memcpy(s, l->v[i], len);
        outv[n++] = s;
        s += len;
    }
    outv[n] = NULL;
    *names = outv;
    *count = n;
    return 0;
}

void engram__namelist_free(engram__namelist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = l->bytes = 0;
}

int engram__open_entry(int dirfd, const char *path, uid_t uid, const char *name, int flags,
                       struct stat *sb)
{
    int fd, err;
    /* O_NONBLOCK keeps a FIFO planted under a table name from blocking us;
     * it is refused below as not a regular file. */
    fd = openat(dirfd, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        err = errno;
        if (err == ELOOP)
            return engram__err(ENGRAM_EUNSAFE, "%s/%s is a symbolic link; refusing to follow it",
                               path, name);
        if (err == ENOENT)
            return engram__err(-ENOENT, "table '%s' not found in %s", name, path);
        return engram__errno(err, "open %s/%s", path, name);
    }
    if (fstat(fd, sb) != 0) {
        err = engram__errno(errno, "fstat %s/%s", path, name);
        goto fail;
    }
    if (!S_ISREG(sb->st_mode)) {
        err = engram__err(ENGRAM_EUNSAFE, "%s/%s is not a regular file", path, name);
        goto fail;
    }
    if (sb->st_uid != uid) {
        err = engram__err(ENGRAM_EUNSAFE, "%s/%s is owned by uid %u, not by the namespace owner (uid %u)",
                          path, name, (unsigned)sb->st_uid, (unsigned)uid);
        goto fail;
    }
    if (sb->st_mode & (S_IWGRP | S_IWOTH)) {
        err = engram__err(ENGRAM_EUNSAFE, "%s/%s is writable by group or others (mode %03o)",
                          path, name, (unsigned)(sb->st_mode & 0777));
        goto fail;
    }
    /* The O_NONBLOCK was only for the open itself. */
    if (fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        err = engram__errno(errno, "fcntl %s/%s", path, name);
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

int engram__open_table_file(int dirfd, const char *path, uid_t uid, const char *name,
                            struct stat *sb, engram__header *h)
{
    int fd, err;
    if ((fd = engram__open_entry(dirfd, path, uid, name, O_RDONLY, sb)) < 0)
        return fd;
    if ((err = engram__read_header(fd, sb, name, h)) == 0 && strcmp(h->name, name) != 0)
        err = engram__err(ENGRAM_ECORRUPT, "file %s/%s holds table '%s' (renamed file?)", path,
                          name, h->name);
    if (err != 0) {
        close(fd);
        return err;
    }
    return fd;
}

int engram__read_full(int fd, void *buf, size_t len, uint64_t off, const char *what)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return engram__errno(errno, "read %s", what);
        }
        if (n == 0)
            return engram__err(ENGRAM_ECORRUPT, "%s: unexpected end of file at %llu", what,
                               (unsigned long long)(off + got));
        got += (size_t)n;
    }
    return 0;
}

int engram__checksum_fd(int fd, const engram__header *h, const char *what,
                        engram_progress_fn progress, void *ud, uint64_t *sum)
{
    XXH3_state_t *xs = XXH3_createState();
    unsigned char *buf = malloc(IO_CHUNK);
    int err = 0;
    if (!xs || !buf) {
        err = engram__err(-ENOMEM, "out of memory for checksum of %s", what);
        goto out;
    }
    XXH3_64bits_reset(xs);
    for (uint64_t done = 0; done < h->data_size;) {
        size_t n = h->data_size - done < IO_CHUNK ? (size_t)(h->data_size - done) : IO_CHUNK;
        if ((err = engram__read_full(fd, buf, n, h->data_offset + done, what)) != 0)
            goto out;
        XXH3_64bits_update(xs, buf, n);
        done += n;
        if (progress && progress(ud, done, h->data_size)) {
            err = engram__err(-ECANCELED, "checksum of %s cancelled", what);
            goto out;
        }
    }
    *sum = XXH3_64bits_digest(xs);
out:
    free(buf);
    XXH3_freeState(xs);
    return err;
}

int engram__check_holes(int fd, const engram__header *h, const char *what)
{
    /* SEEK_HOLE finds the first hole at or after the data offset; the end
     * of the file counts as one.  File systems without hole tracking
     * report the end: nothing to refuse there. */
    off_t hole = lseek(fd, (off_t)h->data_offset, SEEK_HOLE);
    if (hole >= 0 && (uint64_t)hole < h->data_offset + h->data_size)
        return engram__err(ENGRAM_ECORRUPT,
                           "%s has a hole at byte %lld of its data (a sparse copy?): reading "
                           "it could fail with SIGBUS once the file system is full; copy the "
                           "table without --sparse or import it again",
                           what, (long long)((uint64_t)hole - h->data_offset));
    return 0;
}
