/*
 * writer.c - create-only, atomic, streaming table writes: engram_writer_*,
 * engram_populate() and engram_populate_shared().
 *
 * A store's namespace writes its tables (remote.h: writer_begin, append,
 * commit, abort); this file is what every namespace's writes have in
 * common: the name is checked against the store (a table bound or served
 * under it refuses the write as a published one does), a writer that
 * failed stays failed until it is aborted, and populate_shared() compares
 * a published table's rows with the caller's.  A directory's writer
 * (nsdir.c) does, per docs/format.md section 5:
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
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xxh.h"

#include "format.h"
#include "remote.h"
#include "store.h"
#include "writer.h"

struct engram_writer {
    engram_store *st;
    void *w; /* the namespace's writer (remote.h), NULL once commit took it */
    char name[ENGRAM_NAME_MAX + 1];
    int failed;
};

/* A writer of table `name` in st's namespace, with NUMA placement `pl`
 * (NULL: the store's). */
static int writer_begin(engram_store *st, const char *name, const engram_table_spec *spec,
                        const engram__numa *pl, engram_writer **out)
{
    engram_writer *w;
    int err;

    if (!st || !out)
        return engram__err(-EINVAL, "store and out are required");
    *out = NULL;
    if ((err = engram_name_check(name)) != 0)
        return err;
    if (!st->ns)
        return engram__err(ENGRAM_ESTATE, "a memory store has no directory to write '%s' to; "
                                          "use engram_bind()",
                           name);
    if (pl && !st->ns->writer_begin_placed)
        return engram__err(-ENOTSUP, "table '%s': %s places no table it writes", name,
                           st->path);
    pthread_mutex_lock(&st->lock);
    err = engram__name_taken_locked(st, name)
              ? engram__err(-EEXIST, "table '%s' already exists in %s", name, st->path)
              : 0;
    pthread_mutex_unlock(&st->lock);
    if (err)
        return err;
    if (!(w = calloc(1, sizeof *w)))
        return engram__err(-ENOMEM, "out of memory");
    w->st = st;
    snprintf(w->name, sizeof w->name, "%s", name);
    err = pl ? st->ns->writer_begin_placed(st->ns_state, name, spec, pl, &w->w)
             : st->ns->writer_begin(st->ns_state, name, spec, &w->w);
    if (err) {
        free(w);
        return err;
    }
    *out = w;
    return 0;
}

int engram_writer_begin(engram_store *st, const char *name, const engram_table_spec *spec,
                        engram_writer **out)
{
    return writer_begin(st, name, spec, NULL, out);
}

int engram_writer_set_range(engram_writer *w, uint64_t row_start, uint64_t total_rows)
{
    int err;
    if (!w)
        return engram__err(-EINVAL, "writer is NULL");
    if (w->failed)
        return engram__err(ENGRAM_ESTATE, "writer of '%s' failed earlier; abort it", w->name);
    if (w->st->ns->writer_range)
        return w->st->ns->writer_range(w->w, row_start, total_rows);
    /* A namespace that keeps no range: the range is checked as one of no
     * rows, and not kept. */
    if ((err = engram__range_check(row_start, 0, total_rows)) != 0)
        return engram__err(err, "table '%s': %s", w->name, engram_errmsg());
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
    /* A namespace that keeps no origin (a cluster's table is its own):
     * checked, and not kept. */
    return w->st->ns->writer_origin ? w->st->ns->writer_origin(w->w, o) : 0;
}

int engram_writer_append(engram_writer *w, const void *rows, uint64_t nrows, size_t src_stride)
{
    int err;
    if (!w)
        return engram__err(-EINVAL, "writer is NULL");
    if (w->failed)
        return engram__err(ENGRAM_ESTATE, "writer of '%s' failed earlier; abort it", w->name);
    if ((err = w->st->ns->writer_append(w->w, rows, nrows, src_stride)) != 0)
        w->failed = 1;
    return err;
}

int engram_writer_commit(engram_writer *w)
{
    void *nw;
    int err;
    if (!w)
        return engram__err(-EINVAL, "writer is NULL");
    if (w->failed) {
        err = engram__err(ENGRAM_ESTATE, "writer of '%s' failed earlier; nothing published",
                          w->name);
        engram_writer_abort(w);
        return err;
    }
    /* Commit frees the namespace's writer, whatever happens. */
    nw = w->w;
    w->w = NULL;
    err = w->st->ns->writer_commit(nw);
    free(w);
    return err;
}

void engram_writer_abort(engram_writer *w)
{
    if (!w)
        return;
    if (w->w)
        w->st->ns->writer_abort(w->w);
    free(w);
}

void *engram__writer_impl(const engram_writer *w)
{
    return w->w;
}

unsigned char *engram__writer_region(engram_writer *w, uint64_t bytes)
{
    if (!w || w->failed || !w->w || !w->st->ns->writer_region)
        return NULL;
    return w->st->ns->writer_region(w->w, bytes);
}

/* engram_populate() with placement `pl` (NULL: the store's) and, where
 * total_rows is not 0, the row range [row_start, row_start + num_rows) of
 * total_rows. */
static int populate_placed(engram_store *st, const char *name, const engram_table_spec *spec,
                           const void *rows, size_t src_stride, uint64_t row_start,
                           uint64_t total_rows, const engram__numa *pl)
{
    engram_writer *w;
    int err;
    if ((err = writer_begin(st, name, spec, pl, &w)) != 0)
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
    return populate_placed(st, name, spec, rows, src_stride, 0, 0, NULL);
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
    engram_table_spec want = {spec->num_rows, spec->row_bytes, st->ns->packed ? 0 : spec->row_pitch};
    int err;
    if ((err = engram_get_table_info(st, name, &info)) != 0)
        return err;
    if (info.kind != st->ns->kind)
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

/* writer.h */
int engram__populate_shared(engram_store *st, const char *name, const engram_table_spec *spec,
                            const void *rows, size_t src_stride, uint64_t row_start,
                            uint64_t total_rows, const engram__numa *pl, int timeout_ms,
                            int *written)
{
    uint64_t deadline = 0; /* set by the namespace at its first wait */
    for (;;) {
        int err;
        if ((err = published_as(st, name, spec, rows, src_stride)) != -ENOENT)
            return err;
        /* Another process writing it: its end is waited for, and then we
         * look again.  One that hangs keeps it: the time limit ends the
         * wait, naming it, so that it can be dealt with. */
        if (st->ns->writer_wait &&
            (err = st->ns->writer_wait(st->ns_state, name, timeout_ms, &deadline)) != 0) {
            if (err > 0)
                continue;
            return err;
        }
        err = populate_placed(st, name, spec, rows, src_stride, row_start, total_rows, pl);
        if (err != -EEXIST) {
            if (err == 0 && written)
                *written = 1;
            return err;
        }
        /* Another writer won the race (or a name was bound here
         * meanwhile): compare with what it published. */
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
    if (!st->ns)
        return engram__err(ENGRAM_ESTATE, "a memory store has no directory to write '%s' to; "
                                          "use engram_bind()",
                           name);
    return engram__populate_shared(st, name, spec, rows, src_stride, 0, 0, NULL, timeout_ms,
                                   written);
}

int engram_populate_shared(engram_store *st, const char *name, const engram_table_spec *spec,
                           const void *rows, size_t src_stride, int *written)
{
    return engram_populate_shared_wait(st, name, spec, rows, src_stride,
                                       ENGRAM_SHARED_WAIT_MS, written);
}
