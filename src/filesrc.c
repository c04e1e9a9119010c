/*
 * filesrc.c - row sources of tables read from files on demand (see
 * filesrc.h).  The reading itself is reader.c's; this module puts a
 * table's segments, its header and its row cache together.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "filesrc.h"
#include "reader.h"
#include "rowcache.h"

typedef struct filesrc {
    engram__rfile f; /* the table_ud: first, and what the reader reads */
    int has_hdr;
    engram__header hdr;
    uint64_t row_start, total_rows; /* without a header: the range, if any */
} filesrc;

static void filesrc_release(void *state)
{
    filesrc *fs = state;
    engram__reader_file_close(&fs->f);
    free(fs);
}

static void filesrc_info(void *state, engram_table_info *info)
{
    const filesrc *fs = state;
    if (fs->has_hdr) {
        engram__header_info(&fs->hdr, info);
    } else if (fs->total_rows) {
        info->row_start = fs->row_start;
        info->total_rows = fs->total_rows;
    }
}

void engram__filesrc_set_range(engram__source *src, uint64_t row_start, uint64_t total_rows)
{
    filesrc *fs = src->state;
    fs->row_start = row_start;
    fs->total_rows = total_rows;
}

static void filesrc_cache_stats(void *state, engram_cache_stats *s)
{
    engram__reader_file_stats(&((const filesrc *)state)->f, s);
}

static const engram__source_vt filesrc_vt = {filesrc_release, filesrc_info, filesrc_cache_stats};

int engram__filesrc_make(const engram__store_ctx *ctx, uint32_t kind, const char *name,
                         const engram__fseg *segs, unsigned nseg, uint64_t num_rows,
                         uint64_t size_bytes, int in_namespace, const engram__header *hdr,
                         engram__source *src)
{
    engram__cache_want want = {0, size_bytes, ctx->namespace_bytes, in_namespace};
    engram__rcache *cache = NULL;
    filesrc *fs = NULL;
    int err;

    if (nseg == 0 || nseg > ENGRAM__RD_MAX_SEGS) {
        err = engram__err(-EINVAL, "%s: %u segments", name, nseg);
        goto fail;
    }
    if (!(fs = aligned_alloc(ENGRAM__CACHELINE, engram__align_up(sizeof *fs, ENGRAM__CACHELINE)))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto fail;
    }
    memset(fs, 0, sizeof *fs);
    snprintf(fs->f.name, sizeof fs->f.name, "%s", name);
    fs->f.nseg = nseg;
    for (unsigned g = 0; g < nseg; g++) {
        engram__rseg *r = &fs->f.seg[g];
        r->fd = segs[g].fd;
        r->dfd = -1;
        r->base = segs[g].base;
        r->stride = segs[g].stride;
        r->len = segs[g].len;
        r->file_size = segs[g].file_size;
        /* With ENGRAM_OPEN_RANDOM: no readahead on the buffered reads, the
         * file-cache meaning of the flag (direct reads have none). */
        if (ctx->flags & ENGRAM_OPEN_RANDOM)
            (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_RANDOM);
    }
    if (hdr) {
        fs->has_hdr = 1;
        fs->hdr = *hdr;
    }
    /* The reader's staging first: the cache gets what the budget has
     * left after it. */
    if ((err = engram__reader_admit(ctx->reader, &fs->f)) != 0) {
        free(fs); /* admit closed the descriptors */
        return err;
    }
    if ((err = engram__rcache_create(ctx->budget, &want, fs->f.row_bytes, num_rows, ctx->flags,
                                     name, &cache)) != 0) {
        filesrc_release(fs);
        return err;
    }
    memset(src, 0, sizeof *src);
    src->kind = kind;
    src->ops.size = sizeof src->ops;
    src->ops.ctx = ctx->reader;
    src->ops.read_rows = engram__reader_read_rows;
    src->table_ud = &fs->f;
    src->cache = cache;
    src->vt = &filesrc_vt;
    src->state = fs;
    return 0;
fail:
    for (unsigned g = 0; g < nseg && g < ENGRAM__RD_MAX_SEGS; g++)
        close(segs[g].fd);
    return err;
}
