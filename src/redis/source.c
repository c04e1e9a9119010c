/*
 * source.c - the row source of a Redis table: opening a table (its
 * manifest, the chunk keys' slots, its row cache, or its local copy when
 * the store has one) and read_rows, which hands a lookup's rows to the
 * cluster client as one batch of ranged reads (cluster.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rstore.h"
#include "rowcache.h"

/* ------------------------------------------------------------------------
 * The row source.
 */

static int redis_read_rows(void *ctx, engram_source_req *reqs, size_t n)
{
    rstore *rs = ctx;
    engram__rsess *s;
    engram__rcl_get *g;
    int err;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return engram_source_error(err, "%s", engram_errmsg());
    if (!(g = engram__rcl_gets(s, n))) {
        engram__rcl_sess_put(s);
        return engram_source_error(-ENOMEM, "out of memory for %zu reads", n);
    }
    for (size_t i = 0; i < n; i++) {
        const rtable *t = reqs[i].table_ud;
        uint64_t c = reqs[i].row / t->m.chunk_rows;
        g[i].kpre = t->kpre;
        g[i].kpre_len = t->kpre_len;
        g[i].ksuf = c;
        g[i].start = (reqs[i].row - c * t->m.chunk_rows) * t->m.row_bytes;
        g[i].len = t->m.row_bytes;
        g[i].dst = reqs[i].dst;
        g[i].slot = t->slots[t->m.tagged ? 0 : c];
        g[i].whole = 0;
    }
    err = engram__rcl_read(s, g, n, engram__rcl_deadline(rs->cl));
    if (err)
        for (size_t i = 0; i < n; i++)
            reqs[i].done = g[i].state == ENGRAM__RCL_DONE;
    engram__rcl_sess_put(s);
    return err ? engram_source_error(err, "%s", engram_errmsg()) : 0;
}

static void rtable_free(rtable *t)
{
    if (!t)
        return;
    engram__rmanifest_free(&t->m);
    free(t->slots);
    free(t);
}

static void rtable_release(void *state)
{
    rtable_free(state);
}

void manifest_info(const rstore *rs, const engram__rmanifest *m, engram_table_info *info)
{
    info->origin = rs->origin;
    info->origin.epoch = m->epoch;
    info->kind = ENGRAM_TABLE_REDIS;
    info->spec = (engram_table_spec){m->num_rows, m->row_bytes, m->row_bytes};
    info->data_offset = 0;
    info->data_size = m->num_rows * m->row_bytes;
    info->checksum = m->checksum;
    info->created_ns = m->created_ns;
}

static void rtable_info(void *state, engram_table_info *info)
{
    const rtable *t = state;
    manifest_info(t->rs, &t->m, info);
}

static const engram__source_vt rtable_vt = {rtable_release, rtable_info, NULL};

static int add_bytes(void *ud, const engram__rmanifest *m)
{
    *(uint64_t *)ud += m->num_rows * m->row_bytes;
    return 0;
}

/* Bytes of the namespace's tables, read once per store: the row cache
 * shares the budget among tables in proportion to their size. */
static uint64_t namespace_bytes(rstore *rs, engram__rsess *s)
{
    uint64_t sum = 0;
    pthread_mutex_lock(&rs->lock);
    if (rs->have_ns_bytes) {
        sum = rs->ns_bytes;
        pthread_mutex_unlock(&rs->lock);
        return sum;
    }
    pthread_mutex_unlock(&rs->lock);
    if (engram__pub_manifests(&rs->pub, s, add_bytes, &sum) != 0)
        return 0; /* then each table counts as the whole namespace */
    pthread_mutex_lock(&rs->lock);
    rs->ns_bytes = sum;
    rs->have_ns_bytes = 1;
    pthread_mutex_unlock(&rs->lock);
    return sum;
}

int redis_open(void *state, const engram__store_ctx *ctx, const char *name,
               engram_table_spec *spec, uint64_t *data_size, engram__source *src)
{
    rstore *rs = state;
    engram__rsess *s;
    rtable *t;
    engram__rcache *cache = NULL;
    uint64_t nslots;
    int err;

    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    if (!(t = calloc(1, sizeof *t))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto fail;
    }
    t->rs = rs;
    if ((err = engram__pub_manifest(&rs->pub, s, name, &t->m, NULL, NULL)) != 0)
        goto fail;
    *data_size = t->m.num_rows * t->m.row_bytes;
    *spec = (engram_table_spec){t->m.num_rows, t->m.row_bytes, 0};
    /* The nearest tier: a local copy with the cluster's rows is served
     * mapped, as the store's own table (its kind stays the cluster's:
     * verify, info and remove go to the cluster). */
    if (rs->near && engram__store_local_copy(rs->near, name, spec, t->m.checksum, ctx->flags,
                                             src) == 0) {
        src->kind = ENGRAM_TABLE_REDIS;
        pthread_mutex_lock(&rs->lock);
        rs->local_tables++;
        pthread_mutex_unlock(&rs->lock);
        engram__rcl_sess_put(s);
        rtable_free(t);
        return 0;
    }
    t->kpre_len = chunk_prefix(rs, name, t->m.epoch, t->m.tagged, t->kpre);
    nslots = t->m.tagged ? 1 : t->m.nchunks;
    if (!(t->slots = malloc(nslots * sizeof *t->slots))) {
        err = engram__err(-ENOMEM, "out of memory for the slots of %" PRIu64 " chunks",
                          t->m.nchunks);
        goto fail;
    }
    for (uint64_t i = 0; i < nslots; i++)
        t->slots[i] = chunk_slot(t->kpre, t->kpre_len, i);
    {
        engram__cache_want want = {0, *data_size, namespace_bytes(rs, s), 1};
        if ((err = engram__rcache_create(ctx->budget, &want, t->m.row_bytes, t->m.num_rows,
                                         ctx->flags, name, &cache)) != 0)
            goto fail;
    }
    engram__rcl_sess_put(s);
    memset(src, 0, sizeof *src);
    src->kind = ENGRAM_TABLE_REDIS;
    src->ops.size = sizeof src->ops;
    src->ops.ctx = rs;
    src->ops.read_rows = redis_read_rows;
    src->table_ud = t;
    src->cache = cache;
    src->vt = &rtable_vt;
    src->state = t;
    return 0;
fail:
    engram__rcl_sess_put(s);
    rtable_free(t);
    return err;
}
