/*
 * writer.c - create-only, atomic, streaming table writes.
 *
 * In a directory namespace (docs/format.md, section 5):
 *  1. Make a temporary file for the table and take its lock
 *     (engram__temp_create(): the temporary-file and lease protocol is
 *     lease.c's, described there once).  A live writer therefore always
 *     holds its temporary file's lock; the kernel drops it when the
 *     writer dies, however it dies.
 *  2. With a NUMA placement (a tmpfs namespace only), give the file its
 *     memory policy (numa.h) before any of its pages exists; then reserve
 *     the header and the data region (fallocate) so a full disk fails at
 *     begin.
 *  3. Stream rows at their pitch, hashing them (XXH3-64) as they go.
 *  4. Commit: write the header, fsync, make the file read-only, link(2) it
 *     to the table name (fails with EEXIST: create-only, exactly one of
 *     racing writers wins), unlink the temporary name, fsync the
 *     directory.
 * A remote namespace's tables are written by the remote (remote.h).
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
#include "nsdir.h"
#include "remote.h"
#include "store.h"
#include "writer.h"

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

static void writer_free(engram_writer *w)
{
    if (w->remote)
        w->st->ns->writer_abort(w->remote);
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
    if ((err = st->ns->writer_begin(st->ns_state, name, spec, &w->remote)) != 0) {
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
    if (st->ns && st->ns->writer_begin)
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
    if ((err = engram__temp_create(st, name, w->tmp, sizeof w->tmp, &w->fd)) != 0 ||
        (err = place_file(w, pl)) != 0)
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
        if ((err = w->st->ns->writer_append(w->remote, rows, nrows, src_stride)) != 0)
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
        err = st->ns->writer_commit(rw);
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
    engram_table_spec want = {spec->num_rows, spec->row_bytes, st->ns && st->ns->writer_begin ? 0 : spec->row_pitch};
    int err;
    if ((err = engram_get_table_info(st, name, &info)) != 0)
        return err;
    if (info.kind != (st->ns ? st->ns->kind : ENGRAM_TABLE_FILE))
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
    if (st->ns && st->ns->writer_begin)
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
    if (!engram__store_remote(st, &engram__nsdir_vt))
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

