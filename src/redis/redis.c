/*
 * redis.c - namespaces kept in a Redis Cluster: the remote functions of
 * a store opened with engram_store_open_redis() (remote.h), and the row
 * source of its tables (source.h).  The cluster client is cluster.h's,
 * the manifest manifest.c's; docs/redis.md describes the layout and the
 * rules.  This file opens the store; rstore.h says which file of
 * src/redis/ does the rest.
 *
 * Tables are published, removed and collected by the publication
 * protocol (publish.c, over this store as kv.c's key-value store).
 *
 * A lookup's rows of this store's tables come to read_rows together, and
 * go out as one batch per node (source.c, read.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rstore.h"

#define DEFAULT_TIMEOUT_MS 5000u
#define DEFAULT_CONNECT_MS 1000u
#define DEFAULT_CHUNK ((uint64_t)1 << 20)
#define DEFAULT_TTL_MS 3600000u

/* ------------------------------------------------------------------------
 * The store.
 */

static void rstore_free(rstore *rs)
{
    if (!rs)
        return;
    engram__rcl_destroy(rs->cl);
    engram_store_close(rs->near);
    pthread_mutex_destroy(&rs->lock);
    free(rs->where);
    free(rs);
}

static void redis_close(void *state)
{
    rstore_free(state);
}

/* The protocol's: after a table was published or unpublished, the
 * namespace's size is read again. */
static void ns_changed(void *ud)
{
    rstore *rs = ud;
    pthread_mutex_lock(&rs->lock);
    rs->have_ns_bytes = 0;
    pthread_mutex_unlock(&rs->lock);
}

static void redis_origin(void *state, engram_origin *o)
{
    *o = ((const rstore *)state)->origin;
}

static const engram__remote_vt redis_vt = {
    .kind = ENGRAM_TABLE_REDIS,         .close = redis_close,
    .open = redis_open,                 .info = redis_info,
    .list = redis_list,                 .read_all = redis_read_all,
    .remove = redis_remove,             .writer_begin = redis_writer_begin,
    .writer_append = engram__pub_writer_append, .writer_commit = engram__pub_writer_commit,
    .writer_abort = engram__pub_writer_abort, .gc = redis_gc,
    .verify = engram__remote_verify,   .packed = 1,
    .origin = redis_origin,
};

/* Whether node `s` (n bytes) can be recorded in an origin's address:
 * printable bytes other than a space (engram__origin_check()). */
static int node_recordable(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return 0;
    return 1;
}

/* The origin of the namespace's tables (engram_origin): its name and as
 * many whole nodes of `nodes` (host:port, checked when the cluster was
 * made) as fit in `where`.  A node with a space or an unprintable byte
 * (" host:port" after a comma, which the client tries and cannot
 * resolve) is left out: recorded, it would make every pull's origin
 * invalid. */
static void origin_init(engram_origin *o, const char *ns, const char *nodes)
{
    size_t len = 0;
    memset(o, 0, sizeof *o);
    o->kind = ENGRAM_ORIGIN_REDIS;
    memcpy(o->ns, ns, strlen(ns));
    while (nodes && *nodes) {
        size_t n = strcspn(nodes, ",");
        if (n > 0 && len + (len > 0) + n <= ENGRAM_ORIGIN_WHERE_MAX &&
            node_recordable(nodes, n)) {
            if (len > 0)
                o->where[len++] = ',';
            memcpy(o->where + len, nodes, n);
            len += n;
        }
        nodes += n + (nodes[n] == ',');
    }
}

int engram_store_open_redis(const char *nodes, const char *ns, const engram_store_options *opts,
                            const engram_redis_options *ropts, engram_store **out)
{
    engram_redis_options ro = ENGRAM_REDIS_OPTIONS_INIT;
    engram__rcl_opts co;
    rstore *rs;
    size_t wl;
    int err;

    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    *out = NULL;
    if (engram_name_check(ns) != 0)
        return engram__err(ENGRAM_ESPEC, "namespace: %s", engram_errmsg());
    if (ropts) {
        if (ropts->size != sizeof ro)
            return engram__err(-EINVAL, "engram_redis_options.size is %u, expected %zu",
                               ropts->size, sizeof ro);
        ro = *ropts;
    }
    if (ro.flags & ~ENGRAM_REDIS_TAGGED)
        return engram__err(-EINVAL, "unknown engram_redis_options.flags 0x%x",
                           ro.flags & ~ENGRAM_REDIS_TAGGED);
    if (ro.reserved != 0)
        return engram__err(-EINVAL, "engram_redis_options.reserved must be 0");
    if (ro.prefix && engram_name_check(ro.prefix) != 0)
        return engram__err(ENGRAM_ESPEC, "key prefix: %s", engram_errmsg());
    if (ro.chunk_bytes > ENGRAM__RM_CHUNK_MAX)
        return engram__err(-EINVAL, "chunk_bytes %" PRIu64 " is above 512 MiB", ro.chunk_bytes);
    if (!(rs = calloc(1, sizeof *rs)))
        return engram__err(-ENOMEM, "out of memory");
    pthread_mutex_init(&rs->lock, NULL);
    snprintf(rs->ns, sizeof rs->ns, "%s", ns);
    snprintf(rs->prefix, sizeof rs->prefix, "%s", ro.prefix ? ro.prefix : "engram");
    rs->mkey_len = (size_t)snprintf(rs->mkey, sizeof rs->mkey, "%s/%s/.manifests", rs->prefix,
                                    rs->ns);
    rs->mslot = engram__rcl_keyslot(rs->mkey, rs->mkey_len);
    rs->chunk_bytes = ro.chunk_bytes ? ro.chunk_bytes : DEFAULT_CHUNK;
    rs->ttl_ms = ro.chunk_ttl_ms ? ro.chunk_ttl_ms : DEFAULT_TTL_MS;
    rs->tagged = (ro.flags & ENGRAM_REDIS_TAGGED) != 0;
    wl = strlen(nodes ? nodes : "") + strlen(ns) + 16;
    if (!(rs->where = malloc(wl))) {
        rstore_free(rs);
        return engram__err(-ENOMEM, "out of memory");
    }
    snprintf(rs->where, wl, "redis://%s/%s", nodes ? nodes : "", ns);
    origin_init(&rs->origin, ns, nodes);
    rs->pub = (engram__pub){&engram__redis_kv_vt, rs, rs->where, rs->chunk_bytes, rs->ttl_ms,
                            rs->tagged, ns_changed, rs};
    co.user = ro.user;
    co.password = ro.password;
    co.timeout_ms = ro.timeout_ms ? ro.timeout_ms : DEFAULT_TIMEOUT_MS;
    co.connect_timeout_ms = ro.connect_timeout_ms ? ro.connect_timeout_ms : DEFAULT_CONNECT_MS;
    if ((err = engram__rcl_create(nodes, &co, &rs->cl)) != 0) {
        rstore_free(rs);
        return err;
    }
    if (ro.local_root) {
        /* The local copies' namespace, with the store's options (made if
         * missing: where engram_pull() puts them). */
        engram_store_options lo = ENGRAM_STORE_OPTIONS_INIT;
        if (opts)
            lo = *opts;
        lo.flags |= ENGRAM_OPEN_CREATE;
        if ((err = engram_store_open(ro.local_root, ns, &lo, &rs->near)) != 0) {
            err = engram__err(err, "local_root: %s", engram_errmsg());
            rstore_free(rs);
            return err;
        }
    }
    if ((err = engram__store_open_remote(opts, rs->where, &redis_vt, rs, out)) != 0)
        rstore_free(rs);
    return err;
}

const engram__pub *engram__redis_pub(engram_store *st)
{
    rstore *rs = engram__store_remote(st, &redis_vt);
    return rs ? &rs->pub : NULL;
}

int engram_get_redis_stats(engram_store *st, engram_redis_stats *s)
{
    rstore *rs = engram__store_remote(st, &redis_vt);
    uint32_t size;
    if (!rs || !s || s->size != sizeof *s)
        return engram__err(-EINVAL, "a store opened with engram_store_open_redis() and stats with "
                                    "size = sizeof(engram_redis_stats) are required");
    size = s->size;
    memset(s, 0, sizeof *s);
    s->size = size;
    engram__rcl_stats(rs->cl, s);
    pthread_mutex_lock(&rs->lock);
    s->local_tables = rs->local_tables;
    pthread_mutex_unlock(&rs->lock);
    return 0;
}
