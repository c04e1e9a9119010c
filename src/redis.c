/*
 * redis.c - namespaces kept in a Redis Cluster: the remote functions of
 * a store opened with engram_store_open_redis() (remote.h), and the row
 * source of its tables (source.h).  The cluster client is rcluster.c's,
 * the manifest rmanifest.c's; docs/redis.md describes the layout and the
 * rules.
 *
 * A push (the writer) runs in numbered steps, each with its failure path:
 *  1. begin: the name must not be published (HEXISTS), a random epoch
 *     names this push's chunk keys, so no other push (of this name, now
 *     or later) can ever write one of them;
 *  2. append: each full chunk goes up with SET ... PX <ttl>, and its
 *     XXH3-64 is kept; the TTLs are renewed while the push runs, so the
 *     chunks of a push that dies expire on their own;
 *  3. commit: PERSIST every chunk (one that expired fails the push), WAIT
 *     until the replicas of every master written to have the chunks,
 *     then HSETNX the manifest (create-only: of racing pushes exactly one
 *     wins) and WAIT for it too.  A loser, or any failure, deletes its
 *     chunks.
 * Remove is the reverse: the manifest goes first (HDEL: the table is
 * unpublished at once), then the chunks.
 *
 * A lookup's rows of this store's tables come to read_rows together, and
 * go out as one batch per node (rcluster.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <xxhash.h>

#include "common.h"
#include "rcluster.h"
#include "remote.h"
#include "rmanifest.h"
#include "rowcache.h"

#define DEFAULT_TIMEOUT_MS 5000u
#define DEFAULT_CONNECT_MS 1000u
#define DEFAULT_CHUNK ((uint64_t)1 << 20)
#define DEFAULT_TTL_MS 3600000u
#define KEY_MAX 600

typedef struct rstore {
    engram__rcl *cl;
    char ns[ENGRAM_NAME_MAX + 1];
    char prefix[ENGRAM_NAME_MAX + 1];
    char mkey[2 * ENGRAM_NAME_MAX + 16]; /* the manifests' hash */
    size_t mkey_len;
    char *where; /* "redis://nodes/ns", for messages */
    uint64_t chunk_bytes;
    uint32_t ttl_ms;
    int tagged;
    pthread_mutex_t lock;
    int have_ns_bytes; /* ns_bytes known (lock) */
    uint64_t ns_bytes; /* bytes of the namespace's tables, for the cache's share rule */
} rstore;

/* A table open for lookups: the table_ud of its requests. */
typedef struct rtable {
    rstore *rs;
    engram__rmanifest m;
    char kpre[KEY_MAX];
    uint32_t kpre_len;
    uint16_t *slots; /* [nchunks] (spread) or [1] (tagged) */
} rtable;

static const engram__remote_vt redis_vt;

/* ------------------------------------------------------------------------
 * Keys and small commands.
 */

/* The chunk keys' common prefix of a table: the chunk's index follows. */
static uint32_t chunk_prefix(const rstore *rs, const char *name, uint64_t epoch, int tagged,
                             char *buf)
{
    int n = snprintf(buf, KEY_MAX, tagged ? "%s/%s/{%s/%016" PRIx64 "}/" : "%s/%s/%s/%016" PRIx64 "/",
                     rs->prefix, rs->ns, name, epoch);
    return (uint32_t)n;
}

/* The key of chunk i: the prefix, then i in decimal (what rcluster.c's
 * batches send as kpre + decimal(ksuf)).  Returns its length. */
static size_t chunk_key(const char *kpre, uint32_t kpre_len, uint64_t i,
                        char key[KEY_MAX + 24])
{
    return (size_t)snprintf(key, KEY_MAX + 24, "%.*s%" PRIu64, (int)kpre_len, kpre, i);
}

static uint16_t chunk_slot(const char *kpre, uint32_t kpre_len, uint64_t i)
{
    char key[KEY_MAX + 24];
    size_t n = chunk_key(kpre, kpre_len, i, key);
    return engram__rcl_keyslot(key, n);
}

/* Runs a command on the key argv[1] (its slot), expecting a reply of
 * `type`: 0 and *reply, or a negative code with a message naming `what`. */
static int key_cmd(rstore *rs, engram__rsess *s, unsigned flags, int argc, const char **argv,
                   const size_t *lens, int type, uint64_t deadline, const char *what,
                   redisReply **reply)
{
    size_t klen = lens ? lens[1] : strlen(argv[1]);
    redisReply *r;
    int err = engram__rcl_cmd(s, engram__rcl_keyslot(argv[1], klen), flags, argc, argv, lens,
                              deadline, &r);
    if (err)
        return engram__err(err, "%s in %s: %s", what, rs->where, engram_errmsg());
    /* A refusal of the user's rights (NOPERM, NOAUTH, WRONGPASS) is
     * -EACCES from engram__rcl_cmd() already: any other reply of the
     * wrong type is a protocol failure. */
    if (r->type != type && !(type == REDIS_REPLY_STRING && r->type == REDIS_REPLY_NIL)) {
        err = engram__err(-EIO, "%s in %s: %s '%s' answered %s", what, rs->where, argv[0], argv[1],
                          r->type == REDIS_REPLY_ERROR ? r->str : "a reply of an unexpected type");
        freeReplyObject(r);
        return err;
    }
    *reply = r;
    return 0;
}

/* The manifest of table `name`: 0 and *m, -ENOENT, or another code. */
static int manifest_get(rstore *rs, engram__rsess *s, const char *name, uint64_t deadline,
                        engram__rmanifest *m)
{
    const char *argv[3] = {"HGET", rs->mkey, name};
    char what[ENGRAM_NAME_MAX + 600];
    redisReply *r = NULL; /* set where key_cmd() returns 0 (GCC 12 -O3 cannot tell) */
    int err;
    memset(m, 0, sizeof *m);
    if ((err = key_cmd(rs, s, 0, 3, argv, NULL, REDIS_REPLY_STRING, deadline, "read a manifest",
                       &r)) != 0)
        return err;
    if (r->type == REDIS_REPLY_NIL) {
        freeReplyObject(r);
        return engram__err(-ENOENT, "table '%s' not found in %s", name, rs->where);
    }
    snprintf(what, sizeof what, "table '%s' in %s", name, rs->where);
    err = engram__rmanifest_parse(r->str, r->len, name, what, m);
    freeReplyObject(r);
    return err;
}

/* Deletes chunks [0, n) of a table: 0, or the first failure (the rest
 * are still tried, until the deadline). */
static int delete_chunks(rstore *rs, engram__rsess *s, const char *kpre, uint32_t kpre_len,
                         uint64_t n, uint64_t deadline)
{
    int first = 0;
    char msg[512] = "";
    for (uint64_t i = 0; i < n; i++) {
        char key[KEY_MAX + 24];
        const char *argv[2] = {"UNLINK", key};
        redisReply *r = NULL; /* as in manifest_get() */
        int err;
        chunk_key(kpre, kpre_len, i, key);
        if ((err = key_cmd(rs, s, ENGRAM__RCL_WRITE, 2, argv, NULL, REDIS_REPLY_INTEGER, deadline,
                           "delete a chunk", &r)) != 0) {
            if (!first) {
                first = err;
                snprintf(msg, sizeof msg, "%s", engram_errmsg());
            }
            if (engram__now_ns() >= deadline)
                break;
            continue;
        }
        freeReplyObject(r);
    }
    return first ? engram__err(first, "%s", msg) : 0;
}

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

static void manifest_info(const engram__rmanifest *m, engram_table_info *info)
{
    info->kind = ENGRAM_TABLE_REDIS;
    info->spec = (engram_table_spec){m->num_rows, m->row_bytes, m->row_bytes};
    info->data_offset = 0;
    info->data_size = m->num_rows * m->row_bytes;
    info->checksum = m->checksum;
    info->created_ns = m->created_ns;
}

static void rtable_info(void *state, engram_table_info *info)
{
    manifest_info(&((const rtable *)state)->m, info);
}

static const engram__source_vt rtable_vt = {rtable_release, rtable_info, NULL};

/* Bytes of the namespace's tables, read once per store: the row cache
 * shares the budget among tables in proportion to their size. */
static uint64_t namespace_bytes(rstore *rs, engram__rsess *s, uint64_t deadline)
{
    const char *argv[2] = {"HVALS", rs->mkey};
    redisReply *r;
    uint64_t sum = 0;
    pthread_mutex_lock(&rs->lock);
    if (rs->have_ns_bytes) {
        sum = rs->ns_bytes;
        pthread_mutex_unlock(&rs->lock);
        return sum;
    }
    pthread_mutex_unlock(&rs->lock);
    if (key_cmd(rs, s, 0, 2, argv, NULL, REDIS_REPLY_ARRAY, deadline, "list the manifests",
                &r) != 0)
        return 0; /* then each table counts as the whole namespace */
    for (size_t i = 0; i < r->elements; i++) {
        engram__rmanifest m;
        if (r->element[i]->type == REDIS_REPLY_STRING &&
            engram__rmanifest_parse(r->element[i]->str, r->element[i]->len, NULL, "a table",
                                    &m) == 0) {
            sum += m.num_rows * m.row_bytes;
            engram__rmanifest_free(&m);
        }
    }
    freeReplyObject(r);
    pthread_mutex_lock(&rs->lock);
    rs->ns_bytes = sum;
    rs->have_ns_bytes = 1;
    pthread_mutex_unlock(&rs->lock);
    return sum;
}

static int redis_open(void *state, const engram__store_ctx *ctx, const char *name,
                      engram_table_spec *spec, uint64_t *data_size, engram__source *src)
{
    rstore *rs = state;
    engram__rsess *s;
    rtable *t;
    engram__rcache *cache = NULL;
    uint64_t deadline = engram__rcl_deadline(rs->cl), nslots;
    int err;

    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    if (!(t = calloc(1, sizeof *t))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto fail;
    }
    t->rs = rs;
    if ((err = manifest_get(rs, s, name, deadline, &t->m)) != 0)
        goto fail;
    t->kpre_len = chunk_prefix(rs, name, t->m.epoch, t->m.tagged, t->kpre);
    nslots = t->m.tagged ? 1 : t->m.nchunks;
    if (!(t->slots = malloc(nslots * sizeof *t->slots))) {
        err = engram__err(-ENOMEM, "out of memory for the slots of %" PRIu64 " chunks",
                          t->m.nchunks);
        goto fail;
    }
    for (uint64_t i = 0; i < nslots; i++)
        t->slots[i] = chunk_slot(t->kpre, t->kpre_len, i);
    *data_size = t->m.num_rows * t->m.row_bytes;
    {
        engram__cache_want want = {0, *data_size, namespace_bytes(rs, s, deadline), 1};
        if ((err = engram__rcache_create(ctx->budget, &want, t->m.row_bytes, t->m.num_rows,
                                         ctx->flags, name, &cache)) != 0)
            goto fail;
    }
    engram__rcl_sess_put(s);
    *spec = (engram_table_spec){t->m.num_rows, t->m.row_bytes, 0};
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

/* ------------------------------------------------------------------------
 * Info, list, verify, remove.
 */

static int redis_info(void *state, const char *name, engram_table_info *info)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    int err;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    err = manifest_get(rs, s, name, engram__rcl_deadline(rs->cl), &m);
    engram__rcl_sess_put(s);
    if (err)
        return err;
    manifest_info(&m, info);
    engram__rmanifest_free(&m);
    return 0;
}

static int redis_list(void *state, int (*add)(void *ud, const char *name), void *ud)
{
    rstore *rs = state;
    const char *argv[2] = {"HKEYS", rs->mkey};
    engram__rsess *s;
    redisReply *r;
    int err;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    err = key_cmd(rs, s, 0, 2, argv, NULL, REDIS_REPLY_ARRAY, engram__rcl_deadline(rs->cl),
                  "list the tables", &r);
    engram__rcl_sess_put(s);
    if (err)
        return err;
    for (size_t i = 0; i < r->elements && !err; i++) {
        const redisReply *e = r->element[i];
        /* Only names this library could have written. */
        if (e->type == REDIS_REPLY_STRING && strlen(e->str) == e->len &&
            engram__name_valid(e->str))
            err = add(ud, e->str);
    }
    freeReplyObject(r);
    return err;
}

static int redis_verify(void *state, const char *name, engram_progress_fn progress, void *ud)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    XXH3_state_t *xs = NULL;
    char kpre[KEY_MAX];
    uint32_t kpre_len;
    uint64_t total, done = 0;
    int err;

    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    if ((err = manifest_get(rs, s, name, engram__rcl_deadline(rs->cl), &m)) != 0)
        goto out;
    if (!(xs = XXH3_createState())) {
        err = engram__err(-ENOMEM, "out of memory");
        goto out;
    }
    XXH3_64bits_reset(xs);
    kpre_len = chunk_prefix(rs, name, m.epoch, m.tagged, kpre);
    total = m.num_rows * m.row_bytes;
    for (uint64_t i = 0; i < m.nchunks; i++) {
        char key[KEY_MAX + 24];
        const char *argv[2] = {"GET", key};
        uint64_t rows = i + 1 < m.nchunks ? m.chunk_rows : m.num_rows - i * m.chunk_rows;
        uint64_t want = rows * m.row_bytes, sum;
        redisReply *r;
        chunk_key(kpre, kpre_len, i, key);
        if ((err = key_cmd(rs, s, 0, 2, argv, NULL, REDIS_REPLY_STRING,
                           engram__rcl_deadline(rs->cl), "read a chunk", &r)) != 0)
            goto out;
        if (r->type == REDIS_REPLY_NIL || r->len != want) {
            err = engram__err(-ENODATA, "table '%s' in %s: chunk %" PRIu64 " ('%s') %s",
                              name, rs->where, i, key,
                              r->type == REDIS_REPLY_NIL ? "is missing" : "has the wrong length");
            freeReplyObject(r);
            goto out;
        }
        sum = XXH3_64bits(r->str, r->len);
        XXH3_64bits_update(xs, r->str, r->len);
        freeReplyObject(r);
        if (sum != m.chunk_sums[i]) {
            err = engram__err(ENGRAM_ECHECKSUM,
                              "table '%s' in %s: chunk %" PRIu64 " ('%s') has checksum %016" PRIx64
                              ", the manifest says %016" PRIx64,
                              name, rs->where, i, key, sum, m.chunk_sums[i]);
            goto out;
        }
        done += want;
        if (progress && progress(ud, done, total) != 0) {
            err = engram__err(-ECANCELED, "verify of table '%s' cancelled", name);
            goto out;
        }
    }
    if (XXH3_64bits_digest(xs) != m.checksum)
        err = engram__err(ENGRAM_ECHECKSUM,
                          "table '%s' in %s: the rows' checksum differs from the manifest's",
                          name, rs->where);
out:
    XXH3_freeState(xs);
    engram__rmanifest_free(&m);
    engram__rcl_sess_put(s);
    return err;
}

static int redis_remove(void *state, const char *name, int *unpublished)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    const char *argv[3] = {"HDEL", rs->mkey, name};
    uint64_t deadline = engram__rcl_deadline(rs->cl);
    redisReply *r;
    char kpre[KEY_MAX];
    uint32_t kpre_len;
    int err, parsed = 0;

    *unpublished = 0;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    err = manifest_get(rs, s, name, deadline, &m);
    if (err != 0 && err != ENGRAM_ECORRUPT)
        goto out;
    /* A corrupt manifest is removed all the same; its chunks (whose keys
     * it would name) stay behind. */
    parsed = err == 0;
    if ((err = key_cmd(rs, s, ENGRAM__RCL_WRITE, 3, argv, NULL, REDIS_REPLY_INTEGER, deadline,
                       "unpublish a table", &r)) != 0)
        goto out;
    if (r->integer == 0) {
        freeReplyObject(r);
        err = engram__err(-ENOENT, "table '%s' not found in %s (removed meanwhile)", name,
                          rs->where);
        goto out;
    }
    freeReplyObject(r);
    *unpublished = 1;
    pthread_mutex_lock(&rs->lock);
    rs->have_ns_bytes = 0;
    pthread_mutex_unlock(&rs->lock);
    if (parsed) {
        kpre_len = chunk_prefix(rs, name, m.epoch, m.tagged, kpre);
        if ((err = delete_chunks(rs, s, kpre, kpre_len, m.nchunks, deadline)) != 0)
            err = engram__err(err, "table '%s' was unpublished from %s, but some of its %" PRIu64
                                   " chunk keys ('%s*') could not be deleted: %s",
                              name, rs->where, m.nchunks, kpre, engram_errmsg());
    }
out:
    engram__rmanifest_free(&m);
    engram__rcl_sess_put(s);
    return err;
}

/* ------------------------------------------------------------------------
 * The writer.
 */

typedef struct rwriter {
    rstore *rs;
    engram__rsess *s;
    engram__rmanifest m;
    char kpre[KEY_MAX];
    uint32_t kpre_len;
    unsigned char *buf; /* one chunk */
    uint64_t fill;      /* rows in buf */
    uint64_t rows_done;
    uint64_t chunks_done;
    uint64_t renew_ns;  /* when the chunks' TTLs are renewed next */
    XXH3_state_t *xs;
} rwriter;

/* Sets the TTL of every chunk written so far again (step 2). */
static int renew_ttls(rwriter *w)
{
    char ms[24];
    uint64_t deadline = engram__rcl_deadline(w->rs->cl);
    snprintf(ms, sizeof ms, "%u", w->rs->ttl_ms);
    for (uint64_t i = 0; i < w->chunks_done; i++) {
        char key[KEY_MAX + 24];
        const char *argv[3] = {"PEXPIRE", key, ms};
        redisReply *r;
        int err;
        chunk_key(w->kpre, w->kpre_len, i, key);
        if ((err = key_cmd(w->rs, w->s, ENGRAM__RCL_WRITE, 3, argv, NULL, REDIS_REPLY_INTEGER,
                           deadline, "renew a chunk's TTL", &r)) != 0)
            return err;
        err = r->integer == 1 ? 0
                              : engram__err(-ENODATA, "push of '%s' to %s: chunk '%s' expired "
                                                      "before the push ended",
                                            w->m.name, w->rs->where, key);
        freeReplyObject(r);
        if (err)
            return err;
    }
    w->renew_ns = engram__now_ns() + (uint64_t)w->rs->ttl_ms * 1000000u / 2;
    return 0;
}

/* Writes chunk w->chunks_done from `rows` rows at `data` (step 2). */
static int put_chunk(rwriter *w, const unsigned char *data, uint64_t rows)
{
    char key[KEY_MAX + 24], ms[24];
    const char *argv[5] = {"SET", key, (const char *)data, "PX", ms};
    size_t lens[5];
    size_t len = (size_t)(rows * w->m.row_bytes);
    redisReply *r;
    int err;
    lens[1] = chunk_key(w->kpre, w->kpre_len, w->chunks_done, key);
    snprintf(ms, sizeof ms, "%u", w->rs->ttl_ms);
    lens[0] = 3;
    lens[2] = len;
    lens[3] = 2;
    lens[4] = strlen(ms);
    if ((err = key_cmd(w->rs, w->s, ENGRAM__RCL_WRITE, 5, argv, lens, REDIS_REPLY_STATUS,
                       engram__rcl_deadline(w->rs->cl), "write a chunk", &r)) != 0)
        return err;
    freeReplyObject(r);
    w->m.chunk_sums[w->chunks_done++] = XXH3_64bits(data, len);
    XXH3_64bits_update(w->xs, data, len);
    if (engram__now_ns() >= w->renew_ns)
        return renew_ttls(w);
    return 0;
}

static void rwriter_free(rwriter *w)
{
    if (!w)
        return;
    engram__rcl_sess_put(w->s);
    engram__rmanifest_free(&w->m);
    XXH3_freeState(w->xs);
    free(w->buf);
    free(w);
}

static void redis_writer_abort(void *wp)
{
    rwriter *w = wp;
    if (!w)
        return;
    /* Best effort: what is left expires anyway. */
    (void)delete_chunks(w->rs, w->s, w->kpre, w->kpre_len, w->chunks_done,
                        engram__rcl_deadline(w->rs->cl));
    rwriter_free(w);
}

static int redis_writer_begin(void *state, const char *name, const engram_table_spec *spec,
                              void **out)
{
    rstore *rs = state;
    rwriter *w;
    const char *argv[3] = {"HEXISTS", rs->mkey, name};
    redisReply *r;
    uint64_t chunk_rows, max_rows;
    int err;

    if ((err = engram_spec_check(spec)) != 0)
        return err;
    chunk_rows = rs->chunk_bytes / spec->row_bytes;
    max_rows = ENGRAM__RM_CHUNK_MAX / spec->row_bytes;
    if (chunk_rows == 0)
        chunk_rows = 1;
    if (chunk_rows > max_rows)
        chunk_rows = max_rows;
    if (chunk_rows > spec->num_rows)
        chunk_rows = spec->num_rows;
    if (engram__rm_nchunks(spec->num_rows, chunk_rows) > ENGRAM__RM_CHUNKS_MAX)
        return engram__err(ENGRAM_ESPEC,
                           "table '%s' of %" PRIu64 " rows would need %" PRIu64
                           " chunks of %" PRIu64 " rows, above %" PRIu64 ": raise chunk_bytes",
                           name, spec->num_rows, engram__rm_nchunks(spec->num_rows, chunk_rows),
                           chunk_rows, ENGRAM__RM_CHUNKS_MAX);
    if (!(w = calloc(1, sizeof *w)))
        return engram__err(-ENOMEM, "out of memory");
    w->rs = rs;
    snprintf(w->m.name, sizeof w->m.name, "%s", name);
    w->m.num_rows = spec->num_rows;
    w->m.row_bytes = spec->row_bytes;
    w->m.chunk_rows = chunk_rows;
    w->m.nchunks = engram__rm_nchunks(spec->num_rows, chunk_rows);
    w->m.tagged = rs->tagged;
    if (getrandom(&w->m.epoch, sizeof w->m.epoch, 0) != (ssize_t)sizeof w->m.epoch)
        w->m.epoch = engram__wall_ns() ^ ((uint64_t)getpid() << 32);
    if (w->m.epoch == 0)
        w->m.epoch = 1;
    w->kpre_len = chunk_prefix(rs, name, w->m.epoch, w->m.tagged, w->kpre);
    if (!(w->m.chunk_sums = malloc(w->m.nchunks * sizeof *w->m.chunk_sums)) ||
        !(w->buf = malloc((size_t)(chunk_rows * spec->row_bytes))) ||
        !(w->xs = XXH3_createState())) {
        err = engram__err(-ENOMEM, "out of memory for a push of '%s'", name);
        goto fail;
    }
    XXH3_64bits_reset(w->xs);
    w->renew_ns = engram__now_ns() + (uint64_t)rs->ttl_ms * 1000000u / 2;
    if ((err = engram__rcl_sess_get(rs->cl, &w->s)) != 0)
        goto fail;
    /* Step 1: a published name fails at once, not after the upload. */
    if ((err = key_cmd(rs, w->s, 0, 3, argv, NULL, REDIS_REPLY_INTEGER,
                       engram__rcl_deadline(rs->cl), "look for a table", &r)) != 0)
        goto fail;
    err = r->integer ? engram__err(-EEXIST, "table '%s' already exists in %s", name, rs->where)
                     : 0;
    freeReplyObject(r);
    if (err)
        goto fail;
    *out = w;
    return 0;
fail:
    rwriter_free(w);
    return err;
}

static int redis_writer_append(void *wp, const void *rows, uint64_t nrows, size_t src_stride)
{
    rwriter *w = wp;
    const unsigned char *src = rows;
    size_t rb = w->m.row_bytes;
    int err;
    if (nrows == 0)
        return 0;
    if (!src_stride)
        src_stride = rb;
    if (!rows || src_stride < rb)
        return engram__err(-EINVAL, "append to '%s': rows NULL or stride %zu < row_bytes %zu",
                           w->m.name, src_stride, rb);
    if (nrows > w->m.num_rows - w->rows_done)
        return engram__err(ENGRAM_ESTATE, "append of %" PRIu64 " rows to '%s' goes beyond its %"
                                          PRIu64 " rows",
                           nrows, w->m.name, w->m.num_rows);
    while (nrows > 0) {
        uint64_t chunk_left = w->m.chunk_rows, n;
        /* The last chunk holds what is left. */
        if (w->chunks_done * w->m.chunk_rows + chunk_left > w->m.num_rows)
            chunk_left = w->m.num_rows - w->chunks_done * w->m.chunk_rows;
        chunk_left -= w->fill;
        if (w->fill == 0 && src_stride == rb && nrows >= chunk_left) {
            /* A whole chunk, packed in the caller's memory: sent from there. */
            if ((err = put_chunk(w, src, chunk_left)) != 0)
                return err;
            n = chunk_left;
        } else {
            n = nrows < chunk_left ? nrows : chunk_left;
            for (uint64_t i = 0; i < n; i++)
                memcpy(w->buf + (w->fill + i) * rb, src + i * src_stride, rb);
            w->fill += n;
            if (n == chunk_left) {
                if ((err = put_chunk(w, w->buf, w->fill)) != 0)
                    return err;
                w->fill = 0;
            }
        }
        w->rows_done += n;
        nrows -= n;
        src += n * src_stride;
    }
    return 0;
}

static int redis_writer_commit(void *wp)
{
    rwriter *w = wp;
    rstore *rs = w->rs;
    char *text = NULL;
    size_t tlen;
    redisReply *r;
    int err;

    if (w->rows_done != w->m.num_rows) {
        err = engram__err(ENGRAM_ESTATE, "table '%s': only %" PRIu64 " of %" PRIu64
                                         " rows were written",
                          w->m.name, w->rows_done, w->m.num_rows);
        goto fail;
    }
    /* Step 3: the chunks become permanent ... */
    for (uint64_t i = 0; i < w->chunks_done; i++) {
        char key[KEY_MAX + 24];
        const char *argv[2] = {"PERSIST", key};
        chunk_key(w->kpre, w->kpre_len, i, key);
        if ((err = key_cmd(rs, w->s, ENGRAM__RCL_WRITE, 2, argv, NULL, REDIS_REPLY_INTEGER,
                           engram__rcl_deadline(rs->cl), "keep a chunk", &r)) != 0)
            goto fail;
        err = r->integer == 1 ? 0
                              : engram__err(-ENODATA, "push of '%s' to %s: chunk '%s' is gone "
                                                      "(expired or removed) before publication",
                                            w->m.name, rs->where, key);
        freeReplyObject(r);
        if (err)
            goto fail;
    }
    /* ... and on the replicas, before the manifest makes them a table. */
    if ((err = engram__rcl_sync(w->s, engram__rcl_deadline(rs->cl))) != 0) {
        err = engram__err(err, "push of '%s' to %s: %s", w->m.name, rs->where, engram_errmsg());
        goto fail;
    }
    w->m.checksum = XXH3_64bits_digest(w->xs);
    w->m.created_ns = engram__wall_ns();
    if ((err = engram__rmanifest_encode(&w->m, &text, &tlen)) != 0)
        goto fail;
    {
        const char *argv[4] = {"HSETNX", rs->mkey, w->m.name, text};
        size_t lens[4] = {6, rs->mkey_len, strlen(w->m.name), tlen};
        if ((err = key_cmd(rs, w->s, ENGRAM__RCL_WRITE, 4, argv, lens, REDIS_REPLY_INTEGER,
                           engram__rcl_deadline(rs->cl), "publish a table", &r)) != 0)
            goto fail;
    }
    if (r->integer == 0) {
        /* Taken: by another push, or by ours if a lost reply made the
         * command run twice (then the manifest is ours, byte for byte). */
        const char *argv[3] = {"HGET", rs->mkey, w->m.name};
        redisReply *g;
        freeReplyObject(r);
        if ((err = key_cmd(rs, w->s, 0, 3, argv, NULL, REDIS_REPLY_STRING,
                           engram__rcl_deadline(rs->cl), "read a manifest", &g)) != 0)
            goto fail;
        err = g->type == REDIS_REPLY_STRING && g->len == tlen && memcmp(g->str, text, tlen) == 0
                  ? 0
                  : engram__err(-EEXIST, "table '%s' already exists in %s (another push won)",
                                w->m.name, rs->where);
        freeReplyObject(g);
        if (err)
            goto fail;
    } else {
        freeReplyObject(r);
    }
    pthread_mutex_lock(&rs->lock);
    rs->have_ns_bytes = 0;
    pthread_mutex_unlock(&rs->lock);
    /* The table is published; a manifest not yet on the replicas may be
     * lost in a failover, which the caller should hear of. */
    if ((err = engram__rcl_sync(w->s, engram__rcl_deadline(rs->cl))) != 0)
        err = engram__err(err, "table '%s' is published in %s, but: %s", w->m.name, rs->where,
                          engram_errmsg());
    free(text);
    rwriter_free(w);
    return err;
fail:
    free(text);
    {
        /* The failure's message, not the cleanup's. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", engram_errmsg());
        redis_writer_abort(w);
        return engram__err(err, "%s", msg);
    }
}

/* ------------------------------------------------------------------------
 * The store.
 */

static void rstore_free(rstore *rs)
{
    if (!rs)
        return;
    engram__rcl_destroy(rs->cl);
    pthread_mutex_destroy(&rs->lock);
    free(rs->where);
    free(rs);
}

static void redis_close(void *state)
{
    rstore_free(state);
}

static const engram__remote_vt redis_vt = {
    ENGRAM_TABLE_REDIS, redis_close,        redis_open,          redis_info,
    redis_list,         redis_verify,       redis_remove,        redis_writer_begin,
    redis_writer_append, redis_writer_commit, redis_writer_abort,
};

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
    rs->chunk_bytes = ro.chunk_bytes ? ro.chunk_bytes : DEFAULT_CHUNK;
    rs->ttl_ms = ro.chunk_ttl_ms ? ro.chunk_ttl_ms : DEFAULT_TTL_MS;
    rs->tagged = (ro.flags & ENGRAM_REDIS_TAGGED) != 0;
    wl = strlen(nodes ? nodes : "") + strlen(ns) + 16;
    if (!(rs->where = malloc(wl))) {
        rstore_free(rs);
        return engram__err(-ENOMEM, "out of memory");
    }
    snprintf(rs->where, wl, "redis://%s/%s", nodes ? nodes : "", ns);
    co.user = ro.user;
    co.password = ro.password;
    co.timeout_ms = ro.timeout_ms ? ro.timeout_ms : DEFAULT_TIMEOUT_MS;
    co.connect_timeout_ms = ro.connect_timeout_ms ? ro.connect_timeout_ms : DEFAULT_CONNECT_MS;
    if ((err = engram__rcl_create(nodes, &co, &rs->cl)) != 0) {
        rstore_free(rs);
        return err;
    }
    if ((err = engram__store_open_remote(opts, rs->where, &redis_vt, rs, out)) != 0)
        rstore_free(rs);
    return err;
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
    return 0;
}
