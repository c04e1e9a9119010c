/*
 * writer.c - create-only, atomic, streaming table writes, and the cleanup
 * of temporary files left by writers that died.
 *
 * Protocol (docs/format.md):
 *  1. Take a shared flock on a fresh descriptor of the namespace directory
 *     if it is free, create ".tmp.<name>.<pid>.<nonce>" with O_EXCL, take
 *     an exclusive flock on it, check that the name is still that file,
 *     and drop the directory lock.  A live writer therefore always holds
 *     its temp file's lock; the kernel drops it when the writer dies,
 *     however it dies.
 *  2. With a NUMA placement (a tmpfs namespace only), give the file its
 *     memory policy (numa.h) before any of its pages exists; then reserve
 *     the header and the data region (fallocate) so a full disk fails at
 *     begin.
 *  3. Stream rows at their pitch, hashing them (XXH3-64) as they go.
 *  4. Commit: write the header, fsync, make the file read-only, link(2) it
 *     to the table name (fails with EEXIST: create-only, exactly one of
 *     racing writers wins), unlink the temp name, fsync the directory.
 * Cleanup takes the directory lock exclusively (so no writer is between
 * create and lock) and removes every temp whose lock it can take.
 *
 * Nobody waits for the directory lock: anyone who can read the directory
 * (a member of a group namespace's group, say) can flock it and keep it.
 * A cleanup that cannot have it is skipped (the next open runs it), and a
 * writer that cannot have it goes on without it: a cleanup that removed
 * its temp between the create and the lock is then caught by the check
 * that the name still is the file locked, and the writer tries a new name.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "capacity.h"
#include "fsutil.h"
#include "format.h"
#include "lease.h"
#include "remote.h"
#include "store.h"
#include "writer.h"

#define TMP_PREFIX ENGRAM__TMP_PREFIX
#define BUF_SIZE ((size_t)4 << 20)

struct engram_writer {
    engram_store *st;
    void *remote; /* a writer of the store's remote namespace (remote.h), or NULL */
    int fd;
    char name[ENGRAM_NAME_MAX + 1];
    char tmp[ENGRAM_NAME_MAX + 64];
    engram__header h;
    uint64_t rows_done;
    int failed;
    XXH3_state_t *xs;
    unsigned char *buf; /* rows formatted at their pitch, BUF_SIZE bytes */
};

static int write_full(int fd, const void *buf, size_t len, uint64_t off, const char *what)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return engram__errno(errno, "write %s", what);
        }
        done += (size_t)n;
    }
    return 0;
}

/* A new descriptor of the namespace directory (flock() locks belong to
 * the open file description, so each user needs its own), locked with
 * `op` if that can be had without waiting.  Returns the descriptor,
 * -EWOULDBLOCK (no message) when another open file description holds a
 * conflicting lock, or another negative code with the reason. */
static int dir_trylock(engram_store *st, int op)
{
    int fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return engram__errno(errno, "open %s", st->path);
    while (flock(fd, op | LOCK_NB) != 0) {
        int e = errno;
        if (e == EINTR)
            continue;
        close(fd);
        return e == EWOULDBLOCK ? -EWOULDBLOCK : engram__errno(e, "lock %s", st->path);
    }
    return fd;
}

static void writer_free(engram_writer *w)
{
    if (w->remote)
        w->st->remote->writer_abort(w->remote);
    if (w->fd >= 0) {
        unlinkat(w->st->dirfd, w->tmp, 0);
        close(w->fd);
    }
    XXH3_freeState(w->xs);
    free(w->buf);
    free(w);
}

/* Allocates bytes [off, off + len) of w's file.  File systems without
 * fallocate (EOPNOTSUPP, EINVAL) are tolerated: they get no reservation. */
static int reserve(engram_writer *w, uint64_t off, uint64_t len)
{
    int err = posix_fallocate(w->fd, (off_t)off, (off_t)len);
    if (err == 0 || err == EOPNOTSUPP || err == EINVAL)
        return 0;
    return engram__errno(err, "reserve %llu bytes at offset %llu of table '%s' in %s",
                         (unsigned long long)len, (unsigned long long)off, w->name, w->st->path);
}

/* Attempts at a temporary file that a cleanup keeps taking away. */
#define TMP_TRIES 8

/* Creates w's temporary file and takes its lock (step 1 of the protocol):
 * 0 with w->fd and w->tmp, or a negative code with the reason. */
static int temp_create(engram_writer *w)
{
    static _Atomic unsigned nonce;
    engram_store *st = w->st;
    int lockfd, err = 0;

    /* Held, the directory's shared lock keeps cleanups out until our file
     * is locked; not to be had, it is not waited for (see the top). */
    if ((lockfd = dir_trylock(st, LOCK_SH)) < 0 && lockfd != -EWOULDBLOCK)
        return lockfd;
    for (int tries = 1;; tries++) {
        struct stat a, b;
        int locked;
        snprintf(w->tmp, sizeof w->tmp, TMP_PREFIX "%s.%ld.%x", w->name, (long)getpid(),
                 atomic_fetch_add(&nonce, 1) ^ (unsigned)engram__now_ns());
        w->fd = openat(st->dirfd, w->tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       0600);
        if (w->fd < 0) {
            err = engram__errno(errno, "create %s/%s", st->path, w->tmp);
            break;
        }
        /* The file is ours and 0600: only a cleanup that took it for a
         * dead writer's may hold its lock, and only to remove it. */
        locked = flock(w->fd, LOCK_EX | LOCK_NB) == 0;
        if (!locked && errno != EWOULDBLOCK) {
            err = engram__errno(errno, "lock %s/%s", st->path, w->tmp);
            break;
        }
        /* Locked, and still under its name: no cleanup can remove it now
         * (one removes only what it locked, after checking the name). */
        if (locked && fstat(w->fd, &a) == 0 &&
            fstatat(st->dirfd, w->tmp, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev)
            break;
        unlinkat(st->dirfd, w->tmp, 0);
        close(w->fd);
        w->fd = -1;
        if (tries == TMP_TRIES) {
            err = engram__err(-EAGAIN, "create a temporary file in %s: a cleanup of stale "
                                       "temporary files removed it %d times in a row",
                              st->path, TMP_TRIES);
            break;
        }
    }
    if (lockfd >= 0)
        close(lockfd);
    return err;
}

/* A writer of a table of the store's remote namespace: the remote
 * writes it; a table of the name in this store (bound, or a source) is
 * refused here as in a directory. */
static int remote_begin(engram_store *st, const char *name, const engram_table_spec *spec,
                        engram_writer **out)
{
    engram_writer *w;
    int err;
    pthread_mutex_lock(&st->lock);
    err = engram__find_locked(st, name, NULL)
              ? engram__err(-EEXIST, "table '%s' already exists in %s", name, st->path)
              : 0;
    pthread_mutex_unlock(&st->lock);
    if (err)
        return err;
    if (!(w = calloc(1, sizeof *w)))
        return engram__err(-ENOMEM, "out of memory");
    w->st = st;
    w->fd = -1;
    snprintf(w->name, sizeof w->name, "%s", name);
    if ((err = st->remote->writer_begin(st->remote_state, name, spec, &w->remote)) != 0) {
        free(w);
        return err;
    }
    *out = w;
    return 0;
}

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

/* Refuses a placement in a namespace whose pages a policy on the file
 * would not place (anything but a tmpfs). */
static int placement_fits(engram_store *st, const engram__numa *pl, const char *name)
{
    struct statfs fs;
    if (pl->policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    if (fstatfs(st->dirfd, &fs) != 0)
        return engram__errno(errno, "statfs %s", st->path);
    if (fs.f_type != TMPFS_MAGIC)
        return engram__err(-ENOTSUP, "table '%s': NUMA placement (%s) of a written table needs "
                                     "a tmpfs namespace (/dev/shm); %s is on another file "
                                     "system, whose cached pages go wherever the process that "
                                     "reads them runs (place private copies at open instead)",
                           name, pl->desc, st->path);
    return 0;
}

/* Gives w's file the placement `pl` (step 2): a policy set with mbind() on
 * a shared mapping of a tmpfs file is the file's own (the inode's), and
 * every page allocated for the range afterwards follows it, by whatever
 * call (fallocate, write, a fault) and whoever makes it.  The mapping is
 * only the handle; it goes at once. */
static int place_file(engram_writer *w, const engram__numa *pl)
{
    char what[ENGRAM_NAME_MAX + 16];
    void *addr;
    int err;
    if (pl->policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    addr = mmap(NULL, (size_t)w->h.data_size, PROT_READ, MAP_SHARED, w->fd,
                (off_t)w->h.data_offset);
    if (addr == MAP_FAILED)
        return engram__errno(errno, "map table '%s' to place it", w->name);
    snprintf(what, sizeof what, "table '%s'", w->name);
    err = engram__numa_apply(addr, (size_t)w->h.data_size, pl, what);
    munmap(addr, (size_t)w->h.data_size);
    return err;
}

/* engram_writer_begin() with placement `pl` (the store's, or a node
 * copy's). */
static int writer_begin_placed(engram_store *st, const char *name, const engram_table_spec *spec,
                               const engram__numa *pl, engram_writer **out)
{
    engram_writer *w = NULL;
    int err;

    if (!st || !out)
        return engram__err(-EINVAL, "store and out are required");
    *out = NULL;
    if ((err = engram_name_check(name)) != 0)
        return err;
    if (st->remote)
        return remote_begin(st, name, spec, out);
    if (st->dirfd < 0)
        return engram__err(ENGRAM_ESTATE, "a memory store has no directory to write '%s' to; "
                                          "use engram_bind()",
                           name);
    if ((err = placement_fits(st, pl, name)) != 0)
        return err;
    if (!(w = calloc(1, sizeof *w)))
        return engram__err(-ENOMEM, "out of memory");
    w->st = st;
    w->fd = -1;
    if ((err = engram__spec_size(spec, &w->h.data_size)) != 0)
        goto fail;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->h.version = engram__header_version(0); /* until a range is set */
    w->h.checksum_algo = ENGRAM__CHECKSUM_XXH3_64;
    w->h.num_rows = spec->num_rows;
    w->h.row_bytes = spec->row_bytes;
    w->h.row_pitch = engram__spec_pitch(spec);
    w->h.data_offset = engram__align_up(ENGRAM__HEADER_SIZE, ENGRAM__DATA_ALIGN);
    snprintf(w->h.name, sizeof w->h.name, "%s", name);
    pthread_mutex_lock(&st->lock);
    err = engram__name_taken_locked(st, name)
              ? engram__err(-EEXIST, "table '%s' already exists in %s", name, st->path)
              : 0;
    pthread_mutex_unlock(&st->lock);
    if (err)
        goto fail;
    if (!(w->xs = XXH3_createState()) || !(w->buf = malloc(BUF_SIZE))) {
        err = engram__err(-ENOMEM, "out of memory for a writer");
        goto fail;
    }
    XXH3_64bits_reset(w->xs);
    {
        /* Room for the file (and, on a tmpfs, under this process's memory
         * cgroup), before anything is written: a clear refusal instead of
         * a kill or a full disk part way. */
        char what[ENGRAM_NAME_MAX + 16];
        snprintf(what, sizeof what, "table '%s'", name);
        if ((err = engram__capacity_check(st->dirfd, st->path,
                                          engram__table_file_bytes(spec, 0), what, 0)) != 0)
            goto fail;
    }
    if ((err = temp_create(w)) != 0 || (err = place_file(w, pl)) != 0)
        goto fail;
    /* Reserve the header and the data region now: a full disk (or a 64 MiB
     * /dev/shm in a container) fails here, before any row is written, and
     * not at commit, whose header write would otherwise be the first to
     * need a new block where the data fit exactly.  The padding between
     * the header and the data offset stays a hole. */
    if ((err = reserve(w, 0, ENGRAM__HEADER_SIZE)) != 0 ||
        (err = reserve(w, w->h.data_offset, w->h.data_size)) != 0)
        goto fail;
    if (ftruncate(w->fd, (off_t)(w->h.data_offset + w->h.data_size)) != 0) {
        err = engram__errno(errno, "size table '%s' in %s", name, st->path);
        goto fail;
    }
    *out = w;
    return 0;
fail:
    writer_free(w);
    return err;
}

int engram_writer_begin(engram_store *st, const char *name, const engram_table_spec *spec,
                        engram_writer **out)
{
    if (!st || !out)
        return engram__err(-EINVAL, "store and out are required");
    return writer_begin_placed(st, name, spec, &st->numa, out);
}

int engram_writer_set_range(engram_writer *w, uint64_t row_start, uint64_t total_rows)
{
    int err;
    if (!w)
        return engram__err(-EINVAL, "writer is NULL");
    if (w->failed)
        return engram__err(ENGRAM_ESTATE, "writer of '%s' failed earlier; abort it", w->name);
    /* A bad range is the caller's argument, not a failure of the writer:
     * it stays usable. */
    if ((err = engram__range_check(row_start, w->h.num_rows, total_rows)) != 0)
        return engram__err(err, "table '%s': %s", w->name, engram_errmsg());
    w->h.flags |= ENGRAM__FLAG_ROW_RANGE;
    w->h.version = engram__header_version(w->h.flags);
    w->h.row_start = row_start;
    w->h.total_rows = total_rows;
    return 0;
}

int engram_writer_set_origin(engram_writer *w, const engram_origin *o)
{
    int err;
    if (!w || !o)
        return engram__err(-EINVAL, "writer and origin are required");
    if (w->failed)
        return engram__err(ENGRAM_ESTATE, "writer of '%s' failed earlier; abort it", w->name);
    /* As with a range, a bad origin leaves the writer usable. */
    if ((err = engram__origin_check(o)) != 0)
        return engram__err(err, "table '%s': %s", w->name, engram_errmsg());
    w->h.flags |= ENGRAM__FLAG_ORIGIN;
    w->h.version = engram__header_version(w->h.flags);
    /* Copied field by field: the bytes after each string's NUL stay zero,
     * as the header's encoding wants. */
    memset(&w->h.origin, 0, sizeof w->h.origin);
    w->h.origin.kind = o->kind;
    w->h.origin.epoch = o->epoch;
    memcpy(w->h.origin.ns, o->ns, strlen(o->ns));
    memcpy(w->h.origin.where, o->where, strlen(o->where));
    return 0;
}

int engram_writer_append(engram_writer *w, const void *rows, uint64_t nrows, size_t src_stride)
{
    const unsigned char *src = rows;
    size_t rb, pitch, per_buf;
    int err;

    if (!w)
        return engram__err(-EINVAL, "writer is NULL");
    if (w->failed)
        return engram__err(ENGRAM_ESTATE, "writer of '%s' failed earlier; abort it", w->name);
    if (w->remote) {
        if ((err = w->st->remote->writer_append(w->remote, rows, nrows, src_stride)) != 0)
            w->failed = 1;
        return err;
    }
    if (nrows == 0)
        return 0;
    rb = w->h.row_bytes;
    pitch = w->h.row_pitch;
    if (!src_stride)
        src_stride = rb;
    if (!rows || src_stride < rb) {
        w->failed = 1;
        return engram__err(-EINVAL, "append to '%s': rows NULL or stride %zu < row_bytes %zu",
                           w->name, src_stride, rb);
    }
    if (nrows > w->h.num_rows - w->rows_done) {
        w->failed = 1;
        return engram__err(ENGRAM_ESTATE, "append of %llu rows to '%s' goes beyond its %llu rows",
                           (unsigned long long)nrows, w->name,
                           (unsigned long long)w->h.num_rows);
    }
    per_buf = BUF_SIZE / pitch;
    if (per_buf == 0)
        per_buf = 1;
    while (nrows > 0) {
        uint64_t off = w->h.data_offset + w->rows_done * pitch;
        size_t n = nrows < per_buf ? (size_t)nrows : per_buf, len = n * pitch;
        const unsigned char *out;
        if (pitch == rb && src_stride == rb) {
            out = src; /* already in file layout: write straight from the caller */
        } else if (len <= BUF_SIZE) {
            unsigned char *b = w->buf;
            for (size_t i = 0; i < n; i++) {
                memcpy(b + i * pitch, src + i * src_stride, rb);
                memset(b + i * pitch + rb, 0, pitch - rb);
            }
            out = b;
        } else {
            /* One row larger than the buffer (huge pitch): write it in two. */
            static const unsigned char zeros[4096];
            if ((err = write_full(w->fd, src, rb, off, w->tmp)) != 0)
                goto fail;
            XXH3_64bits_update(w->xs, src, rb);
            for (size_t z = rb; z < pitch; z += sizeof zeros) {
                size_t zn = pitch - z < sizeof zeros ? pitch - z : sizeof zeros;
                if ((err = write_full(w->fd, zeros, zn, off + z, w->tmp)) != 0)
                    goto fail;
                XXH3_64bits_update(w->xs, zeros, zn);
            }
            goto next;
        }
        if ((err = write_full(w->fd, out, len, off, w->tmp)) != 0)
            goto fail;
        XXH3_64bits_update(w->xs, out, len);
    next:
        w->rows_done += n;
        nrows -= n;
        src += n * src_stride;
    }
    return 0;
fail:
    w->failed = 1;
    return err;
}

const char *engram__writer_temp(const engram_writer *w)
{
    return w->tmp;
}

uint64_t engram__writer_sum(const engram_writer *w)
{
    return XXH3_64bits_digest(w->xs);
}

int engram_writer_commit(engram_writer *w)
{
    unsigned char hdr[ENGRAM__HEADER_SIZE];
    engram_store *st;
    int err;

    if (!w)
        return engram__err(-EINVAL, "writer is NULL");
    st = w->st;
    if (w->failed) {
        err = engram__err(ENGRAM_ESTATE, "writer of '%s' failed earlier; nothing published",
                          w->name);
        goto out;
    }
    if (w->remote) {
        /* Commit frees the remote writer, whatever happens. */
        void *rw = w->remote;
        w->remote = NULL;
        err = st->remote->writer_commit(rw);
        goto out;
    }
    if (w->rows_done != w->h.num_rows) {
        err = engram__err(ENGRAM_ESTATE, "table '%s': only %llu of %llu rows were written",
                          w->name, (unsigned long long)w->rows_done,
                          (unsigned long long)w->h.num_rows);
        goto out;
    }
    w->h.data_checksum = XXH3_64bits_digest(w->xs);
    w->h.created_ns = engram__wall_ns();
    engram__header_encode(&w->h, hdr);
    if ((err = write_full(w->fd, hdr, sizeof hdr, 0, w->tmp)) != 0)
        goto out;
    if (fsync(w->fd) != 0) {
        err = engram__errno(errno, "fsync %s/%s", st->path, w->tmp);
        goto out;
    }
    if (fchmod(w->fd, (st->opts.flags & ENGRAM_OPEN_GROUP) ? 0440 : 0400) != 0) {
        err = engram__errno(errno, "chmod %s/%s", st->path, w->tmp);
        goto out;
    }
    /* Publication and the bound-name check happen under the store lock so
     * a concurrent engram_bind() of the same name cannot also succeed. */
    pthread_mutex_lock(&st->lock);
    if (engram__find_locked(st, w->name, NULL))
        err = engram__err(-EEXIST, "table '%s' already exists in %s", w->name, st->path);
    else if (linkat(st->dirfd, w->tmp, st->dirfd, w->name, 0) != 0)
        err = errno == EEXIST
                  ? engram__err(-EEXIST, "table '%s' already exists in %s", w->name, st->path)
                  : engram__errno(errno, "publish %s/%s", st->path, w->name);
    pthread_mutex_unlock(&st->lock);
    if (err)
        goto out;
    unlinkat(st->dirfd, w->tmp, 0);
    close(w->fd);
    w->fd = -1;
    if (fsync(st->dirfd) != 0)
        err = engram__errno(errno, "fsync %s (table '%s' is published but may not survive a "
                                   "crash)",
                            st->path, w->name);
out:
    writer_free(w);
    return err;
}

void engram_writer_abort(engram_writer *w)
{
    if (w)
        writer_free(w);
}

/* engram_populate() with placement `pl` and, where total_rows is not 0,
 * the row range [row_start, row_start + num_rows) of total_rows. */
static int populate_placed(engram_store *st, const char *name, const engram_table_spec *spec,
                           const void *rows, size_t src_stride, uint64_t row_start,
                           uint64_t total_rows, const engram__numa *pl)
{
    engram_writer *w;
    int err;
    if ((err = writer_begin_placed(st, name, spec, pl, &w)) != 0)
        return err;
    if ((total_rows && (err = engram_writer_set_range(w, row_start, total_rows)) != 0) ||
        (err = engram_writer_append(w, rows, spec->num_rows, src_stride)) != 0) {
        engram_writer_abort(w);
        return err;
    }
    return engram_writer_commit(w);
}

int engram_populate(engram_store *st, const char *name, const engram_table_spec *spec,
                    const void *rows, size_t src_stride)
{
    if (!st)
        return engram__err(-EINVAL, "store is required");
    return populate_placed(st, name, spec, rows, src_stride, 0, 0, &st->numa);
}

/* ------------------------------------------------------------------------
 * Populating without a leader: engram_populate_shared().
 */

/* 1 if directory entry `ent` is a temporary file of table `name`:
 * ".tmp.<name>.<pid>.<hex nonce>" exactly (a name may hold dots, so the
 * pid and nonce are taken from the end). */
static int temp_of(const char *ent, const char *name)
{
    size_t pl = strlen(TMP_PREFIX), nl = strlen(name);
    const char *p;
    if (strncmp(ent, TMP_PREFIX, pl) != 0 || strncmp(ent + pl, name, nl) != 0 ||
        ent[pl + nl] != '.')
        return 0;
    p = ent + pl + nl + 1;
    if (!*p || !strchr("0123456789", *p))
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p++ != '.' || !*p)
        return 0;
    for (; *p; p++)
        if (!strchr("0123456789abcdef", *p))
            return 0;
    return 1;
}

/* The pid a temporary file's name ".tmp.<name>.<pid>.<nonce>" holds
 * (taken from the end: a table name may hold dots), or -1. */
static long temp_pid(const char *ent)
{
    const char *end = strrchr(ent, '.'), *p = end;
    long pid = 0;
    if (!end || end == ent)
        return -1;
    while (p > ent && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p == end || p == ent || p[-1] != '.' || end - p > 9)
        return -1;
    for (; p < end; p++)
        pid = pid * 10 + (*p - '0');
    return pid;
}

void engram__temp_holder(int fd, const char *ent, char *who, size_t cap)
{
    struct statx sx;
    struct stat sb;
    uint64_t now = engram__wall_ns(), since = now;
    long pid = temp_pid(ent);
    char by[64];
    int exact = 0;
    /* How long it has held the name: since its file was made (its birth
     * time, where the file system keeps one; else its last change, which
     * is later, so the time is then a lower bound). */
    if (statx(fd, "", AT_EMPTY_PATH, STATX_BTIME, &sx) == 0 && (sx.stx_mask & STATX_BTIME)) {
        since = (uint64_t)sx.stx_btime.tv_sec * 1000000000u + sx.stx_btime.tv_nsec;
        exact = 1;
    } else if (fstat(fd, &sb) == 0) {
        since = (uint64_t)sb.st_ctim.tv_sec * 1000000000u + (uint64_t)sb.st_ctim.tv_nsec;
    }
    if (pid > 0)
        snprintf(by, sizeof by, "pid %ld", pid);
    else
        snprintf(by, sizeof by, "a process (its file's name gives no pid)");
    snprintf(who, cap, "by %s, which has held it for %s%llu s now", by, exact ? "" : "at least ",
             (unsigned long long)((now > since ? now - since : 0) / 1000000000u));
}

int engram__temp_state(int dirfd, uid_t uid, const char *ent, char *who, size_t cap, int *fdp)
{
    struct stat sb;
    int fd;
    if (fdp)
        *fdp = -1;
    /* No link is followed, and a FIFO is opened without waiting for a
     * writer of it. */
    fd = openat(dirfd, ent, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? ENGRAM__TEMP_GONE : ENGRAM__TEMP_STRAY;
    /* Writers make regular files of the namespace's owner; anything else
     * under such a name is not theirs, whatever its lock says. */
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != uid) {
        close(fd);
        return ENGRAM__TEMP_STRAY;
    }
    if (flock(fd, LOCK_SH | LOCK_NB) == 0 || errno != EWOULDBLOCK) {
        close(fd); /* a dead writer's (closing drops our lock) */
        return ENGRAM__TEMP_DEAD;
    }
    if (who && cap)
        engram__temp_holder(fd, ent, who, cap);
    if (fdp)
        *fdp = fd;
    else
        close(fd);
    return ENGRAM__TEMP_LIVE;
}

int engram__live_writer(engram_store *st, const char *name, char *ent, size_t cap)
{
    return engram__live_writer_other(st, name, NULL, ent, cap);
}

int engram__live_writer_other(engram_store *st, const char *name, const char *mine, char *ent,
                              size_t cap)
{
    struct dirent *de;
    DIR *d;
    int fd, live = -1;
    if ((fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -1;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -1;
    }
    while (live < 0 && (de = readdir(d)) != NULL) {
        if (!temp_of(de->d_name, name) || (mine && strcmp(de->d_name, mine) == 0) ||
            engram__temp_state(st->dirfd, st->uid, de->d_name, NULL, 0, &live) !=
                ENGRAM__TEMP_LIVE)
            continue;
        snprintf(ent, cap, "%s", de->d_name);
    }
    closedir(d);
    return live;
}

/* XXH3-64 of `rows` as a table file of `spec` holds them (each row padded
 * with zeros to the pitch): what the published table's checksum must be.
 * 0, or -ENOMEM. */
static int rows_checksum(const engram_table_spec *spec, const unsigned char *rows,
                         size_t src_stride, uint64_t *sum)
{
    size_t rb = spec->row_bytes, pitch = engram__spec_pitch(spec);
    XXH3_state_t *xs = XXH3_createState();
    unsigned char *buf = NULL;
    if (!src_stride)
        src_stride = rb;
    if (!xs || (pitch != rb && !(buf = calloc(1, pitch)))) {
        XXH3_freeState(xs);
        return engram__err(-ENOMEM, "out of memory");
    }
    XXH3_64bits_reset(xs);
    if (pitch == rb && src_stride == rb) {
        XXH3_64bits_update(xs, rows, (size_t)spec->num_rows * rb);
    } else {
        for (uint64_t i = 0; i < spec->num_rows; i++) {
            if (buf) {
                memcpy(buf, rows + i * src_stride, rb);
                XXH3_64bits_update(xs, buf, pitch);
            } else {
                XXH3_64bits_update(xs, rows + i * src_stride, rb);
            }
        }
    }
    *sum = XXH3_64bits_digest(xs);
    XXH3_freeState(xs);
    free(buf);
    return 0;
}

/* Whether published table `name` (`info`) holds `rows`, laid out as
 * `spec` says (the checksum covers the pitch where the table keeps one):
 * 0, or ENGRAM_EMISMATCH. */
static int same_rows(engram_store *st, const char *name, const engram_table_info *info,
                     const engram_table_spec *spec, const void *rows, size_t src_stride)
{
    uint64_t sum = 0;
    int err;
    if ((err = rows_checksum(spec, rows, src_stride, &sum)) != 0)
        return err;
    if (sum != info->checksum)
        return engram__err(ENGRAM_EMISMATCH,
                           "table '%s' is published in %s with other rows (data checksum "
                           "%016llx, these rows %016llx)",
                           name, st->path, (unsigned long long)info->checksum,
                           (unsigned long long)sum);
    return 0;
}

/* Whether `name` is published with exactly these rows: 0 (reuse it),
 * -ENOENT (not published), ENGRAM_EMISMATCH (another spec or other rows),
 * -EEXIST (the name is bound in this store), or another error. */
static int published_as(engram_store *st, const char *name, const engram_table_spec *spec,
                        const void *rows, size_t src_stride)
{
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    /* A remote keeps rows packed: its checksum is of the rows without
     * any pitch. */
    engram_table_spec want = {spec->num_rows, spec->row_bytes, st->remote ? 0 : spec->row_pitch};
    int err;
    if ((err = engram_get_table_info(st, name, &info)) != 0)
        return err;
    if (info.kind != (st->remote ? st->remote->kind : ENGRAM_TABLE_FILE))
        return engram__err(-EEXIST, "table '%s' is bound in this store, not published", name);
    if (info.spec.num_rows != want.num_rows || info.spec.row_bytes != want.row_bytes ||
        info.spec.row_pitch != engram__spec_pitch(&want))
        return engram__err(ENGRAM_EMISMATCH,
                           "table '%s' is published in %s with num_rows=%llu, row_bytes=%u, "
                           "row_pitch=%u, not num_rows=%llu, row_bytes=%u, row_pitch=%u",
                           name, st->path, (unsigned long long)info.spec.num_rows,
                           info.spec.row_bytes, info.spec.row_pitch,
                           (unsigned long long)want.num_rows, want.row_bytes,
                           engram__spec_pitch(&want));
    return same_rows(st, name, &info, &want, rows, src_stride);
}

/* engram_populate_shared() in a remote namespace: there is no writer's
 * lock to wait on, so racing processes may all upload; the remote's
 * create-only publication picks one, and the others compare. */
static int remote_populate_shared(engram_store *st, const char *name,
                                  const engram_table_spec *spec, const void *rows,
                                  size_t src_stride, int *written)
{
    int err;
    if ((err = published_as(st, name, spec, rows, src_stride)) != -ENOENT)
        return err;
    err = engram_populate(st, name, spec, rows, src_stride);
    if (err == 0 && written)
        *written = 1;
    if (err != -EEXIST)
        return err;
    /* Another writer won the race (or a name was bound here meanwhile). */
    return published_as(st, name, spec, rows, src_stride);
}

/* How often, at most, a wait with a time limit looks at a writer's lock
 * (flock() has no timeout): from 1 ms, doubling. */
#define WRITER_POLL_MAX_NS 50000000u

/* writer.h */
int engram__wait_writer(int fd, uint64_t deadline)
{
    uint64_t pause = 1000000u;
    if (deadline == UINT64_MAX) {
        while (flock(fd, LOCK_SH) != 0 && errno == EINTR)
            ;
        return 0;
    }
    for (;;) {
        uint64_t now, ns;
        struct timespec ts;
        if (flock(fd, LOCK_SH | LOCK_NB) == 0 || (errno != EWOULDBLOCK && errno != EINTR))
            return 0;
        if ((now = engram__now_ns()) >= deadline)
            return -ETIMEDOUT;
        ns = deadline - now < pause ? deadline - now : pause;
        ts.tv_sec = (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        nanosleep(&ts, NULL);
        if (pause < WRITER_POLL_MAX_NS)
            pause = pause * 2 < WRITER_POLL_MAX_NS ? pause * 2 : WRITER_POLL_MAX_NS;
    }
}

/* engram_populate_shared() in a directory namespace, with placement `pl`
 * and a row range as populate_placed() takes it, waiting for other
 * writers up to timeout_ms in all (< 0: no limit). */
static int populate_shared_placed(engram_store *st, const char *name,
                                  const engram_table_spec *spec, const void *rows,
                                  size_t src_stride, uint64_t row_start, uint64_t total_rows,
                                  const engram__numa *pl, int timeout_ms, int *written)
{
    uint64_t deadline = 0; /* set when the first wait starts */
    for (;;) {
        char ent[ENGRAM_NAME_MAX + 64];
        int fd, err;
        if ((err = published_as(st, name, spec, rows, src_stride)) != -ENOENT)
            return err;
        if ((fd = engram__live_writer(st, name, ent, sizeof ent)) >= 0) {
            /* Another process is writing it: its lock goes when it commits,
             * aborts or dies, and then we look again.  One that hangs
             * (stopped, or blocked for good) keeps it: the time limit
             * ends the wait, naming it, so that it can be dealt with. */
            if (!deadline)
                deadline = timeout_ms < 0 ? UINT64_MAX
                                          : engram__now_ns() + (uint64_t)timeout_ms * 1000000u;
            if (engram__wait_writer(fd, deadline) != 0) {
                char who[160];
                engram__temp_holder(fd, ent, who, sizeof who);
                close(fd);
                return engram__err(-ETIMEDOUT, "table '%s' is still being written in %s %s "
                                               "(temporary file %s); gave up waiting for it "
                                               "after %d ms (a writer that hangs holds the "
                                               "name until it ends)",
                                   name, st->path, who, ent, timeout_ms);
            }
            close(fd);
            continue;
        }
        err = populate_placed(st, name, spec, rows, src_stride, row_start, total_rows, pl);
        if (err != -EEXIST) {
            if (err == 0 && written)
                *written = 1;
            return err;
        }
        /* Another writer won the race: compare with what it published. */
    }
}

int engram_populate_shared_wait(engram_store *st, const char *name,
                                const engram_table_spec *spec, const void *rows,
                                size_t src_stride, int timeout_ms, int *written)
{
    int err;
    if (written)
        *written = 0;
    if (!st || !spec || !rows)
        return engram__err(-EINVAL, "store, spec and rows are required");
    if ((err = engram_name_check(name)) != 0 || (err = engram_spec_check(spec)) != 0)
        return err;
    if (src_stride && src_stride < spec->row_bytes)
        return engram__err(-EINVAL, "populate '%s': stride %zu < row_bytes %u", name, src_stride,
                           spec->row_bytes);
    if (st->remote)
        return remote_populate_shared(st, name, spec, rows, src_stride, written);
    if (st->dirfd < 0)
        return engram__err(ENGRAM_ESTATE, "a memory store has no directory to write '%s' to; "
                                          "use engram_bind()",
                           name);
    return populate_shared_placed(st, name, spec, rows, src_stride, 0, 0, &st->numa, timeout_ms,
                                  written);
}

int engram_populate_shared(engram_store *st, const char *name, const engram_table_spec *spec,
                           const void *rows, size_t src_stride, int *written)
{
    return engram_populate_shared_wait(st, name, spec, rows, src_stride,
                                       ENGRAM_SHARED_WAIT_MS, written);
}

int engram_numa_copy(engram_store *st, const char *name, int node, int *written)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram__numa pl;
    engram__header h;
    engram_table_spec spec;
    char copy[ENGRAM_NAME_MAX + 32];
    struct stat sb;
    void *rows = MAP_FAILED;
    int fd = -1, err;

    if (written)
        *written = 0;
    if (!st || !name)
        return engram__err(-EINVAL, "store and name are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    if (node < 0)
        return engram__err(-EINVAL, "node copy of '%s': node %d is not a node", name, node);
    engram__numa_copy_name(copy, sizeof copy, name, node);
    if (strlen(copy) > ENGRAM_NAME_MAX)
        return engram__err(ENGRAM_ESPEC, "node copy of '%s': its name '%s' is longer than %d "
                                         "bytes",
                           name, copy, ENGRAM_NAME_MAX);
    if (st->remote || st->dirfd < 0)
        return engram__err(-ENOTSUP, "node copy of '%s': %s is not a namespace directory", name,
                           st->path);
    /* The node is checked as a store's numa_node is. */
    o.numa_policy = ENGRAM_NUMA_NODE;
    o.numa_node = node;
    if ((err = engram__numa_resolve(&o, &pl)) != 0 || (err = placement_fits(st, &pl, copy)) != 0)
        return err;
    /* The rows come from a read-only mapping of the table's file. */
    if ((fd = engram__open_table_file(st->dirfd, st->path, st->uid, name, &sb, &h)) < 0)
        return fd;
    if ((err = engram__check_holes(fd, &h, name)) != 0)
        goto out;
    rows = mmap(NULL, (size_t)h.data_size, PROT_READ, MAP_SHARED, fd, (off_t)h.data_offset);
    if (rows == MAP_FAILED) {
        err = engram__errno(errno, "map table '%s' to copy it", name);
        goto out;
    }
    spec.num_rows = h.num_rows;
    spec.row_bytes = h.row_bytes;
    spec.row_pitch = h.row_pitch;
    err = populate_shared_placed(st, copy, &spec, rows, h.row_pitch,
                                 (h.flags & ENGRAM__FLAG_ROW_RANGE) ? h.row_start : 0,
                                 (h.flags & ENGRAM__FLAG_ROW_RANGE) ? h.total_rows : 0, &pl,
                                 ENGRAM_SHARED_WAIT_MS, written);
out:
    if (rows != MAP_FAILED)
        munmap(rows, (size_t)h.data_size);
    close(fd);
    return err;
}

void engram__clean_temps(engram_store *st)
{
    struct stat before;
    int lockfd, fd, removed = 0, have_before;
    DIR *d;
    struct dirent *de;

    /* Held by another process: a cleanup running now, or someone who
     * merely can read the directory.  Stale files wait for a later open. */
    if ((lockfd = dir_trylock(st, LOCK_EX)) < 0)
        return;
    have_before = fstat(st->dirfd, &before) == 0;
    fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || !(d = fdopendir(fd))) {
        if (fd >= 0)
            close(fd);
        close(lockfd);
        return;
    }
    while ((de = readdir(d)) != NULL) {
        struct stat a, b;
        int tfd, lease = strncmp(de->d_name, ENGRAM__LEASE_PREFIX,
                                 strlen(ENGRAM__LEASE_PREFIX)) == 0;
        if (!lease && strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) != 0)
            continue;
        tfd = openat(st->dirfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (tfd < 0)
            continue;
        /* Only our own regular files; the lock tells whether the writer is
         * alive; the inode check makes sure we unlink what we locked. */
        if (fstat(tfd, &a) == 0 && S_ISREG(a.st_mode) && a.st_uid == st->uid &&
            flock(tfd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(st->dirfd, de->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev &&
            unlinkat(st->dirfd, de->d_name, 0) == 0) {
            engram__log(ENGRAM_LOG_INFO, 0, "removed %s/%s, the %s that died", st->path,
                        de->d_name,
                        lease ? "namespace lease of a process" : "temporary file of a writer");
            removed = 1;
        }
        close(tfd);
    }
    closedir(d);
    /* Removing what the dead left is no use of the namespace: its
     * modification time (the last use engram gc goes by) stays. */
    if (removed && have_before) {
        struct timespec ts[2] = {{0, UTIME_OMIT}, before.st_mtim};
        utimensat(st->dirfd, ".", ts, 0);
    }
    close(lockfd);
}
