/*
 * redis.c - namespaces kept in a Redis Cluster: the remote functions of
 * a store opened with engram_store_open_redis() (remote.h), and the row
 * source of its tables (source.h).  The cluster client is rcluster.c's,
 * the manifest rmanifest.c's; docs/redis.md describes the layout and the
 * rules.
 *
 * A push (the writer) runs in numbered steps, each with its failure path
 * (docs/redis.md, "The publication protocol", says what every party can
 * observe at each step):
 *  1. begin: in one atomic step (a script), the name must not be
 *     published, and an open pending record of the push is written; a
 *     random epoch names its chunk keys, so no other push (of this name,
 *     now or later) can ever write one of them;
 *  2. append: each full chunk goes up with SET ... PX <ttl>, and its
 *     XXH3-64 is kept; the TTLs and the record's stamp are renewed while
 *     the push runs, so the chunks of a push that dies expire on their
 *     own, and its record shows a gc that it is dead;
 *  3. commit: PERSIST every chunk (one that expired fails the push), WAIT
 *     until the replicas of every master written to have the chunks,
 *  4. then publish: one atomic step that writes the manifest only if the
 *     name is free and the record still open, and drops the record.  A
 *     loser deletes its chunks.  A publication whose answer is lost is
 *     resolved before anything is deleted: closing the record settles
 *     it (a copy of the publication still in flight can no longer land),
 *     and the manifest then says whether it landed first.  When even
 *     that cannot be asked, the push fails with ENGRAM_EINDOUBT and keeps
 *     everything: the table may yet appear, whole.
 * Remove is compare-and-delete: the manifest read is unpublished only if
 * it is still the one published, in one step with a closed record that
 * takes over its chunks; the chunks go, then the record.  gc settles the
 * records that dead pushes and removals left (engram_store_gc()).
 *
 * A lookup's rows of this store's tables come to read_rows together, and
 * go out as one batch per node (rcluster.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
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
    uint16_t mslot; /* its slot */
    char *where; /* "redis://nodes/ns", for messages */
    uint64_t chunk_bytes;
    uint32_t ttl_ms;
    int tagged;
    pthread_mutex_t lock;
    int have_ns_bytes; /* ns_bytes known (lock) */
    uint64_t ns_bytes; /* bytes of the namespace's tables, for the cache's share rule */
    engram_store *near;    /* the local copies' namespace (local_root), or NULL */
    uint64_t local_tables; /* tables opened from their copy there (lock) */
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

void (*engram__redis_hook)(const char *step, const char *name);

static void at_step(const char *step, const char *name)
{
    if (engram__redis_hook)
        engram__redis_hook(step, name);
}

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
    int err;
    *reply = NULL;
    err = engram__rcl_cmd(s, engram__rcl_keyslot(argv[1], klen), flags, argc, argv, lens,
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

/* The manifest of table `name`: 0 and *m, -ENOENT, or another code.
 * With raw, *raw is the reply that held the manifest's text (the
 * caller frees it) whenever there was one, parsed or corrupt; else
 * NULL. */
static int manifest_get(rstore *rs, engram__rsess *s, const char *name, uint64_t deadline,
                        engram__rmanifest *m, redisReply **raw)
{
    const char *argv[3] = {"HGET", rs->mkey, name};
    char what[ENGRAM_NAME_MAX + 600];
    redisReply *r = NULL; /* set where key_cmd() returns 0 (GCC 12 -O3 cannot tell) */
    int err;
    memset(m, 0, sizeof *m);
    if (raw)
        *raw = NULL;
    if ((err = key_cmd(rs, s, 0, 3, argv, NULL, REDIS_REPLY_STRING, deadline, "read a manifest",
                       &r)) != 0)
        return err;
    if (r->type == REDIS_REPLY_NIL) {
        freeReplyObject(r);
        return engram__err(-ENOENT, "table '%s' not found in %s", name, rs->where);
    }
    snprintf(what, sizeof what, "table '%s' in %s", name, rs->where);
    err = engram__rmanifest_parse(r->str, r->len, name, what, m);
    if (raw)
        *raw = r;
    else
        freeReplyObject(r);
    return err;
}

/* Deletes chunks [0, n) of a table: 0, or the first failure (the rest
 * are still tried, until the deadline). */
static int delete_chunks(rstore *rs, engram__rsess *s, const char *kpre, uint32_t kpre_len,
                         uint64_t n, uint64_t deadline)
{
    int first = 0;
    char msg[ENGRAM__ERRMSG_MAX] = "";
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
    if ((err = manifest_get(rs, s, name, deadline, &t->m, NULL)) != 0)
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
        engram__cache_want want = {0, *data_size, namespace_bytes(rs, s, deadline), 1};
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

/* ------------------------------------------------------------------------
 * The publication protocol's atomic steps: Lua scripts run by the master
 * of the manifests' hash (EVAL with that one key), so each one is a
 * single step no other client's command can come between.  docs/redis.md
 * ("The publication protocol") says what each party can observe.
 *
 * Every set of chunk keys that no manifest owns has a pending record
 * (rmanifest.h): "open" while its push may still publish, "closed" once
 * nothing can publish it and its chunks are to be deleted.  The rules
 * that make a lost reply harmless:
 *  - a push publishes only through S_PUBLISH, which requires its record
 *    open and drops it in the same step as it writes the manifest;
 *  - whoever closes a record (S_CLOSE) makes every later S_PUBLISH of it
 *    fail, so a publication still in flight (sent on a connection whose
 *    reply was lost, and not yet run by a stalled server) can no longer
 *    land once a resolver has closed the record;
 *  - chunks are deleted only under a closed record, or by a push that
 *    never sent S_PUBLISH, and a record is dropped only after its chunks
 *    were deleted.
 * The stamp of a record is the server's time (TIME), so every client
 * measures its age on the same clock.
 */

/* Every script's start: now(), the server's clock in ms, and
 * stamped(body), a record's text with its stamp line (the last) added. */
#define LUA_NOW                                                                              \
    "local function now() local t = redis.call('TIME') "                                   \
    "return string.format('%.0f', t[1] * 1000 + math.floor(t[2] / 1000)) end\n"            \
    "local function stamped(body) return body .. 'stamp ' .. now() .. '\\n' end\n"
#define LUA_OPEN "string.find(p, '\\nstate open\\n', 1, true)"

/* S_BEGIN(name, field, body): 0 if table `name` is published; else
 * writes the open record `field` (body + stamp) and returns 1. */
static const char S_BEGIN[] =
    LUA_NOW "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end\n"
            "redis.call('HSET', KEYS[1], ARGV[2], stamped(ARGV[3]))\n"
            "return 1\n";

/* S_TOUCH(field, body): 1 and a new stamp if the record is open, else 0
 * (closed by a resolver, or gone). */
static const char S_TOUCH[] =
    LUA_NOW "local p = redis.call('HGET', KEYS[1], ARGV[1])\n"
            "if not p or not " LUA_OPEN " then return 0 end\n"
            "redis.call('HSET', KEYS[1], ARGV[1], stamped(ARGV[2]))\n"
            "return 1\n";

/* S_PUBLISH(field, name, manifest, closed body): 1 published (now, or by
 * an earlier copy of this very command: the manifest is ours, byte for
 * byte), 0 the name is taken by another push (the record is closed), -1
 * the record is not open (a resolver closed it): nothing published.
 * Finding its manifest already there, it writes the same bytes again: a
 * WAIT covers only what a connection's own writes changed (a server
 * replicates no command that changed nothing), and this connection's
 * WAIT must cover the publication that the lost answer was for. */
static const char S_PUBLISH[] =
    LUA_NOW "local cur = redis.call('HGET', KEYS[1], ARGV[2])\n"
            "if cur == ARGV[3] then\n"
            "  redis.call('HSET', KEYS[1], ARGV[2], cur)\n"
            "  redis.call('HDEL', KEYS[1], ARGV[1])\n"
            "  return 1\n"
            "end\n"
            "local p = redis.call('HGET', KEYS[1], ARGV[1])\n"
            "if not p or not " LUA_OPEN " then return -1 end\n"
            "if cur then\n"
            "  redis.call('HSET', KEYS[1], ARGV[1], stamped(ARGV[4]))\n"
            "  return 0\n"
            "end\n"
            "redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])\n"
            "redis.call('HDEL', KEYS[1], ARGV[1])\n"
            "return 1\n";

/* S_CLOSE(field, min_idle_ms): closes the record unless it is open and
 * its stamp is less than min_idle_ms old.  Returns 0 gone, 1 closed
 * (now or before), 2 open and alive, 3 not a record.
 * A record closed before is written again as it is, so that a WAIT on
 * this connection covers its closing, whoever closed it (a server
 * replicates no command that changed nothing). */
static const char S_CLOSE[] =
    LUA_NOW "local p = redis.call('HGET', KEYS[1], ARGV[1])\n"
            "if not p then return 0 end\n"
            "local s = string.match(p, '\\nstamp (%d+)\\n$')\n"
            "if not s then return 3 end\n"
            "local idle = tonumber(now()) - tonumber(s)\n"
            "if idle < 0 then idle = 0 end\n"
            "if " LUA_OPEN " then\n"
            "  if idle < tonumber(ARGV[2]) then return 2 end\n"
            "  p = string.gsub(p, '\\nstate open\\n', '\\nstate closed\\n', 1)\n"
            "end\n"
            "redis.call('HSET', KEYS[1], ARGV[1], p)\n"
            "return 1\n";

/* S_REMOVE(name, manifest, field, closed body): compare-and-delete.  1:
 * the manifest was still exactly `manifest` and is deleted, and the
 * closed record `field` (if not empty) now holds its chunks; 0: no such
 * table; -1: the name holds another manifest (removed and pushed again
 * since it was read): nothing changed. */
static const char S_REMOVE[] =
    LUA_NOW "local cur = redis.call('HGET', KEYS[1], ARGV[1])\n"
            "if not cur then return 0 end\n"
            "if cur ~= ARGV[2] then return -1 end\n"
            "redis.call('HDEL', KEYS[1], ARGV[1])\n"
            "if ARGV[3] ~= '' then\n"
            "  redis.call('HSET', KEYS[1], ARGV[3], stamped(ARGV[4]))\n"
            "end\n"
            "return 1\n";

/* Runs `body` on the manifests' hash with the nargs arguments (lens may
 * be NULL: C strings).  0 and *v, the integer it answered, or a negative
 * code with a message naming `what`.  A failure here says nothing of
 * whether the script ran. */
static int script(rstore *rs, engram__rsess *s, const char *body, int nargs, const char **args,
                  const size_t *lens, uint64_t deadline, const char *what, long long *v)
{
    const char *argv[8];
    size_t alen[8];
    redisReply *r;
    int err;
    *v = 0;
    argv[0] = "EVAL";
    argv[1] = body;
    argv[2] = "1";
    argv[3] = rs->mkey;
    for (int i = 0; i < 4; i++)
        alen[i] = strlen(argv[i]);
    for (int i = 0; i < nargs; i++) {
        argv[4 + i] = args[i];
        alen[4 + i] = lens ? lens[i] : strlen(args[i]);
    }
    if ((err = engram__rcl_cmd(s, rs->mslot, ENGRAM__RCL_WRITE, 4 + nargs, argv, alen, deadline,
                               &r)) != 0)
        return engram__err(err, "%s in %s: %s", what, rs->where, engram_errmsg());
    err = r->type == REDIS_REPLY_INTEGER
              ? 0
              : engram__err(-EIO, "%s in %s: the script answered %s", what, rs->where,
                            r->type == REDIS_REPLY_ERROR ? r->str
                                                         : "a reply of an unexpected type");
    *v = err ? 0 : r->integer;
    freeReplyObject(r);
    return err;
}

static void pending_field(uint64_t epoch, char field[32])
{
    snprintf(field, 32, ENGRAM__RP_FIELD "%016" PRIx64, epoch);
}

/* The pending record (without its stamp) of chunks [0, nchunks) of the
 * table *m describes, with this store's TTL. */
static void pending_of(const rstore *rs, const engram__rmanifest *m, uint64_t nchunks,
                       int closed, engram__rpending *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", m->name);
    p->closed = closed;
    p->epoch = m->epoch;
    p->nchunks = nchunks;
    p->tagged = m->tagged;
    p->ttl_ms = rs->ttl_ms;
}

/* Deletes the chunks a pending record names, then the record: 0, or the
 * first failure (the record then stays, for a later gc). */
static int pending_finish(rstore *rs, engram__rsess *s, const engram__rpending *p,
                          const char *field, uint64_t deadline)
{
    char kpre[KEY_MAX];
    uint32_t kpre_len = chunk_prefix(rs, p->name, p->epoch, p->tagged, kpre);
    const char *argv[3] = {"HDEL", rs->mkey, field};
    redisReply *r;
    int err;
    if ((err = delete_chunks(rs, s, kpre, kpre_len, p->nchunks, deadline)) != 0)
        return engram__err(err, "some of the %" PRIu64 " chunk keys '%s*' could not be "
                                "deleted: %s",
                           p->nchunks, kpre, engram_errmsg());
    if ((err = key_cmd(rs, s, ENGRAM__RCL_WRITE, 3, argv, NULL, REDIS_REPLY_INTEGER, deadline,
                       "drop a pending record", &r)) != 0)
        return err;
    freeReplyObject(r);
    return 0;
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
    err = manifest_get(rs, s, name, engram__rcl_deadline(rs->cl), &m, NULL);
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

/* Whole chunks read in one pipelined batch by redis_read_all(): about
 * 32 MiB, so every master has many in flight at once, and at most 4096
 * chunks (tables of tiny chunks: bounded requests).  A batch of larger
 * chunks (one chunk of up to 512 MiB) gets a deadline as much longer. */
#define STREAM_BATCH_BYTES ((uint64_t)32 << 20)
#define STREAM_BATCH_CHUNKS 4096u

/* redis_read_all()'s two buffers: while the reader fills one from the
 * cluster, a thread of its own checks the other's chunks and hands them
 * to the sink (which may write them to a file), so the network and the
 * disk (or memory) work at once.  Everything below `mu` guards. */
typedef struct stream {
    const rstore *rs;
    const char *name;
    const engram__rmanifest *m;
    const engram__remote_sink *k;
    const char *kpre;
    uint32_t kpre_len;
    unsigned char *buf[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t c0[2], n[2], rows[2]; /* the batch a full buffer holds */
    int full[2];
    int done; /* no more batches */
    int err;  /* the consumer's failure, with its message */
    char msg[ENGRAM__ERRMSG_MAX];
} stream;

/* Checks batch `b`'s chunks against the manifest and hands them on: 0,
 * or the failure (its message in this thread's errmsg). */
static int stream_consume(stream *x, int b)
{
    const engram__rmanifest *m = x->m;
    const unsigned char *p = x->buf[b];
    for (uint64_t i = 0; i < x->n[b]; i++) {
        uint64_t c = x->c0[b] + i;
        uint64_t len = (c + 1 < m->nchunks ? m->chunk_rows : m->num_rows - c * m->chunk_rows) *
                       m->row_bytes;
        uint64_t sum = XXH3_64bits(p, len);
        if (sum != m->chunk_sums[c]) {
            char key[KEY_MAX + 24];
            chunk_key(x->kpre, x->kpre_len, c, key);
            return engram__err(ENGRAM_ECHECKSUM,
                               "table '%s' in %s: chunk %" PRIu64 " ('%s') has checksum "
                               "%016" PRIx64 ", the manifest says %016" PRIx64,
                               x->name, x->rs->where, c, key, sum, m->chunk_sums[c]);
        }
        p += len;
    }
    return x->k->rows(x->k->ud, x->buf[b], x->rows[b]);
}

static void *stream_main(void *arg)
{
    stream *x = arg;
    for (int b = 0;; b ^= 1) {
        int err;
        pthread_mutex_lock(&x->mu);
        while (!x->full[b] && !x->done)
            pthread_cond_wait(&x->cv, &x->mu);
        if (!x->full[b]) { /* done, and nothing left */
            pthread_mutex_unlock(&x->mu);
            return NULL;
        }
        pthread_mutex_unlock(&x->mu);
        err = stream_consume(x, b);
        pthread_mutex_lock(&x->mu);
        x->full[b] = 0;
        if (err) {
            x->err = err;
            snprintf(x->msg, sizeof x->msg, "%s", engram_errmsg());
        }
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        if (err)
            return NULL;
    }
}

/* Reads table `name` whole, in order: chunks in pipelined batches of
 * GETRANGE to every master at once, each chunk checked against the
 * manifest's checksum before its rows go to the sink (remote.h). */
static int redis_read_all(void *state, const char *name, const engram__remote_sink *k)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    stream x;
    pthread_t th;
    char kpre[KEY_MAX];
    uint64_t chunk_bytes, per;
    int err, started = 0;

    memset(&x, 0, sizeof x);
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    if ((err = manifest_get(rs, s, name, engram__rcl_deadline(rs->cl), &m, NULL)) != 0)
        goto out;
    {
        engram_table_spec spec = {m.num_rows, m.row_bytes, 0};
        if (k->begin && (err = k->begin(k->ud, &spec, m.checksum)) != 0)
            goto out;
    }
    chunk_bytes = m.chunk_rows * m.row_bytes;
    per = STREAM_BATCH_BYTES / chunk_bytes ? STREAM_BATCH_BYTES / chunk_bytes : 1;
    if (per > STREAM_BATCH_CHUNKS)
        per = STREAM_BATCH_CHUNKS;
    if (per > m.nchunks)
        per = m.nchunks ? m.nchunks : 1;
    x.rs = rs;
    x.name = name;
    x.m = &m;
    x.k = k;
    x.kpre = kpre;
    x.kpre_len = chunk_prefix(rs, name, m.epoch, m.tagged, kpre);
    if (!(x.buf[0] = malloc(per * chunk_bytes)) ||
        !(x.buf[1] = m.nchunks > per ? malloc(per * chunk_bytes) : x.buf[0])) {
        err = engram__err(-ENOMEM, "out of memory for 2 x %" PRIu64 " chunks of %" PRIu64
                                   " bytes",
                          per, chunk_bytes);
        goto out;
    }
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    if ((err = pthread_create(&th, NULL, stream_main, &x)) != 0) {
        err = engram__err(-err, "read table '%s': cannot start a thread", name);
        goto out_sync;
    }
    started = 1;
    for (uint64_t c0 = 0, b = 0; c0 < m.nchunks; c0 += per, b ^= 1) {
        uint64_t n = m.nchunks - c0 < per ? m.nchunks - c0 : per, rows = 0;
        engram__rcl_get *g;
        /* Wait for this buffer to be handed on (or for a failure there). */
        pthread_mutex_lock(&x.mu);
        while (x.full[b] && !x.err)
            pthread_cond_wait(&x.cv, &x.mu);
        /* The consumer's message is in its own thread's errmsg: copied
         * here, as after the join below. */
        err = x.err ? engram__err(x.err, "%s", x.msg) : 0;
        pthread_mutex_unlock(&x.mu);
        if (err)
            break;
        if (!(g = engram__rcl_gets(s, n))) {
            err = engram__err(-ENOMEM, "out of memory for %" PRIu64 " reads", n);
            break;
        }
        for (uint64_t i = 0; i < n; i++) {
            uint64_t c = c0 + i;
            uint64_t r = c + 1 < m.nchunks ? m.chunk_rows : m.num_rows - c * m.chunk_rows;
            g[i] = (engram__rcl_get){.kpre = kpre,
                                     .ksuf = c,
                                     .start = 0,
                                     .dst = x.buf[b] + rows * m.row_bytes,
                                     .kpre_len = x.kpre_len,
                                     .len = (uint32_t)(r * m.row_bytes),
                                     .slot = chunk_slot(kpre, x.kpre_len, c),
                                     .whole = 1};
            rows += r;
        }
        {
            /* One operation's time per 32 MiB of the batch. */
            uint64_t now = engram__now_ns(), dl = engram__rcl_deadline(rs->cl);
            uint64_t scale = (rows * m.row_bytes + STREAM_BATCH_BYTES - 1) / STREAM_BATCH_BYTES;
            if (scale > 1)
                dl += (dl - now) * (scale - 1);
            err = engram__rcl_read(s, g, n, dl);
        }
        if (err != 0) {
            /* A chunk missing or of the wrong length (-ENODATA) is data
             * lost; anything else (the network, rights) says nothing of
             * the data. */
            if (err == -ENODATA)
                err = engram__err(-ENODATA, "table '%s' in %s is listed, but its data is not "
                                            "whole: a chunk is missing or has the wrong length "
                                            "(%s); remove the table and push it again",
                                  name, rs->where, engram_errmsg());
            break;
        }
        pthread_mutex_lock(&x.mu);
        x.c0[b] = c0;
        x.n[b] = n;
        x.rows[b] = rows;
        x.full[b] = 1;
        pthread_cond_broadcast(&x.cv);
        pthread_mutex_unlock(&x.mu);
        /* Progress (and a cancel) on the caller's thread. */
        if (k->read && (err = k->read(k->ud, rows)) != 0)
            break;
    }
    /* The consumer hands on what is full, then ends; a failure of the
     * reader's own stops it after the batch it holds. */
    pthread_mutex_lock(&x.mu);
    x.done = 1;
    if (err)
        x.full[0] = x.full[1] = 0;
    pthread_cond_broadcast(&x.cv);
    pthread_mutex_unlock(&x.mu);
    if (started)
        pthread_join(th, NULL);
    if (!err && x.err)
        err = engram__err(x.err, "%s", x.msg);
out_sync:
    pthread_cond_destroy(&x.cv);
    pthread_mutex_destroy(&x.mu);
out:
    if (x.buf[1] != x.buf[0])
        free(x.buf[1]);
    free(x.buf[0]);
    engram__rmanifest_free(&m);
    engram__rcl_sess_put(s);
    return err;
}

/* Removal is compare-and-delete: the manifest read is unpublished only
 * if it is still the one published (S_REMOVE), in the same step as a
 * closed record takes over its chunks; then the chunks go, then the
 * record. */
static int redis_remove(void *state, const char *name, int *unpublished)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    engram__rpending p;
    uint64_t deadline = engram__rcl_deadline(rs->cl);
    redisReply *raw = NULL;
    char field[32] = "", closed[512] = "";
    long long v;
    int err, parsed;

    *unpublished = 0;
    memset(&m, 0, sizeof m);
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    /* The text read is kept: the removal compares it. */
    err = manifest_get(rs, s, name, deadline, &m, &raw);
    if (err != 0 && err != ENGRAM_ECORRUPT)
        goto out;
    /* A corrupt manifest is removed all the same; its chunks (whose keys
     * it would name) stay behind. */
    parsed = err == 0;
    if (parsed) {
        pending_of(rs, &m, m.nchunks, 1, &p);
        pending_field(m.epoch, field);
        engram__rpending_body(&p, closed, sizeof closed);
    }
    at_step("remove", name);
    {
        const char *args[4] = {name, raw->str, field, closed};
        size_t lens[4] = {strlen(name), raw->len, strlen(field), strlen(closed)};
        if ((err = script(rs, s, S_REMOVE, 4, args, lens, deadline, "unpublish a table", &v)) !=
            0) {
            /* A refusal of the user's rights is an answer: nothing ran. */
            if (err == -EACCES)
                goto out;
            err = engram__err(ENGRAM_EINDOUBT,
                              "remove of table '%s' from %s: the outcome is in doubt: %s.  If "
                              "it is no longer listed, it was removed, and engram_store_gc() "
                              "deletes what is left of its chunks",
                              name, rs->where, engram_errmsg());
            goto out;
        }
    }
    if (v != 1) {
        err = v == 0 ? engram__err(-ENOENT, "table '%s' not found in %s (removed meanwhile)", name,
                                   rs->where)
              : v == -1
                  ? engram__err(-ENOENT, "table '%s' in %s was removed and pushed again while "
                                         "this removal ran: the table pushed since is kept",
                                name, rs->where)
                  : engram__err(-EIO, "remove '%s' in %s: the script answered %lld", name,
                                rs->where, v);
        goto out;
    }
    *unpublished = 1;
    pthread_mutex_lock(&rs->lock);
    rs->have_ns_bytes = 0;
    pthread_mutex_unlock(&rs->lock);
    if (!parsed)
        goto out;
    /* The chunks go only once the replicas have the removal: a failover
     * that lost it would bring the table back, listed, without its
     * data. */
    if ((err = engram__rcl_sync(s, deadline)) != 0 ||
        (err = pending_finish(rs, s, &p, field, deadline)) != 0)
        err = engram__err(err, "table '%s' was unpublished from %s, but: %s (its pending record "
                               "'%s' stays, for engram_store_gc() to finish)",
                          name, rs->where, engram_errmsg(), field);
out:
    if (raw)
        freeReplyObject(raw);
    engram__rmanifest_free(&m);
    engram__rcl_sess_put(s);
    return err;
}

/* The server's clock (TIME of the manifests' master), in ms. */
static int server_ms(rstore *rs, engram__rsess *s, uint64_t deadline, uint64_t *ms)
{
    const char *argv[1] = {"TIME"};
    redisReply *r;
    int err;
    if ((err = engram__rcl_cmd(s, rs->mslot, 0, 1, argv, NULL, deadline, &r)) != 0)
        return engram__err(err, "read the time of %s: %s", rs->where, engram_errmsg());
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return engram__err(-EIO, "TIME in %s: a reply of an unexpected type", rs->where);
    }
    *ms = strtoull(r->element[0]->str, NULL, 10) * 1000u +
          strtoull(r->element[1]->str, NULL, 10) / 1000u;
    freeReplyObject(r);
    return 0;
}

static void gc_say(engram_gc_report_fn report, void *ud, const char *name, int code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void gc_say(engram_gc_report_fn report, void *ud, const char *name, int code,
                   const char *fmt, ...)
{
    char detail[ENGRAM__ERRMSG_MAX];
    va_list ap;
    if (!report)
        return;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    report(ud, name, code, detail);
}

/* Settles one pending record `field` (see gc_pass()); `now` is the
 * server's clock. */
static void gc_one(rstore *rs, engram__rsess *s, const char *field, uint64_t idle_ms,
                   uint64_t now, uint32_t flags, engram_gc_report_fn report, void *ud)
{
    const char *argv[3] = {"HGET", rs->mkey, field};
    uint64_t deadline = engram__rcl_deadline(rs->cl), min_idle, idle;
    char what[64], min_text[24], expect[32];
    const char *whose;
    engram__rpending p;
    redisReply *r;
    long long state;
    int err;

    if ((err = key_cmd(rs, s, 0, 3, argv, NULL, REDIS_REPLY_STRING, deadline,
                       "read a pending record", &r)) != 0) {
        gc_say(report, ud, field, err, "%s", engram_errmsg());
        return;
    }
    if (r->type == REDIS_REPLY_NIL) { /* settled meanwhile */
        freeReplyObject(r);
        return;
    }
    snprintf(what, sizeof what, "'%s'", field);
    err = engram__rpending_parse(r->str, r->len, what, &p);
    freeReplyObject(r);
    if (err) {
        gc_say(report, ud, field, err, "%s; left as it is", engram_errmsg());
        return;
    }
    /* The chunk keys to delete come from the record: only one under its
     * own field is one this library wrote. */
    pending_field(p.epoch, expect);
    if (strcmp(expect, field) != 0) {
        gc_say(report, ud, p.name, ENGRAM_ECORRUPT,
               "pending record %s names epoch %016" PRIx64 ", not its field's: not a record "
               "this library wrote; left as it is, with the keys it names",
               what, p.epoch);
        return;
    }
    whose = p.closed ? "a removed table or a failed push" : "an abandoned push";
    /* A push still running stamps its record every half TTL: one quiet
     * for a whole TTL is dead, or stuck past the life of its chunks. */
    min_idle = p.closed || idle_ms > p.ttl_ms ? idle_ms : p.ttl_ms;
    idle = now > p.stamp_ms ? now - p.stamp_ms : 0;
    if (idle < min_idle) {
        gc_say(report, ud, p.name, ENGRAM_GC_KEPT,
               "%s (epoch %016" PRIx64 ") that showed life %.1f s ago: kept until it has been "
               "quiet for %.1f s",
               p.closed ? "chunks of a removed table or a failed push" : "a push", p.epoch,
               (double)idle / 1e3, (double)min_idle / 1e3);
        return;
    }
    if (flags & ENGRAM_GC_DRY_RUN) {
        gc_say(report, ud, p.name, 0,
               "would delete the %" PRIu64 " chunk keys of %s (epoch %016" PRIx64 ", quiet for "
               "%.1f s)",
               p.nchunks, whose, p.epoch, (double)idle / 1e3);
        return;
    }
    /* Closed first (an open one in one step that checks its age again:
     * the push may have shown life since it was read), and the closing
     * on the replicas before any chunk goes: a failover that lost it
     * would leave an open record that a live push could still publish,
     * or bring back the table a removal unpublished, without its data.
     * A record closed before is written again, so that the wait covers
     * whoever closed it. */
    {
        const char *args[2] = {field, min_text};
        snprintf(min_text, sizeof min_text, "%" PRIu64, min_idle);
        if ((err = script(rs, s, S_CLOSE, 2, args, NULL, deadline, "close a pending record",
                          &state)) != 0) {
            gc_say(report, ud, p.name, err, "%s", engram_errmsg());
            return;
        }
        if (state == 0)
            return;
        if (state == 2) {
            gc_say(report, ud, p.name, ENGRAM_GC_KEPT,
                   "a push (epoch %016" PRIx64 ") that showed life just now: kept", p.epoch);
            return;
        }
        if (state != 1) {
            gc_say(report, ud, p.name, ENGRAM_ECORRUPT, "pending record %s changed into one "
                   "this library did not write; left as it is", what);
            return;
        }
    }
    if ((err = engram__rcl_sync(s, deadline)) != 0) {
        gc_say(report, ud, p.name, err, "pending record %s is closed, but its chunks are kept "
               "until the replicas have it: %s", what, engram_errmsg());
        return;
    }
    if ((err = pending_finish(rs, s, &p, field, engram__rcl_deadline(rs->cl))) != 0) {
        gc_say(report, ud, p.name, err, "%s", engram_errmsg());
        return;
    }
    gc_say(report, ud, p.name, 0,
           "deleted the %" PRIu64 " chunk keys of %s (epoch %016" PRIx64 ", quiet for %.1f s)",
           p.nchunks, whose, p.epoch, (double)idle / 1e3);
}

/* One pass over the namespace's pending records: each one is settled
 * (closed if it is still open, its chunks deleted, then the record), or
 * kept if it is a push that may still be running: open, and stamped less
 * than max(idle_ms, its TTL) ago.  Closed records go once idle_ms passed.
 * 0, or the failure to list the records. */
static int gc_pass(rstore *rs, engram__rsess *s, uint64_t idle_ms, uint32_t flags,
                   engram_gc_report_fn report, void *ud)
{
    const char *argv[2] = {"HKEYS", rs->mkey};
    uint64_t deadline = engram__rcl_deadline(rs->cl), now = 0;
    redisReply *r;
    int err;
    if ((err = key_cmd(rs, s, 0, 2, argv, NULL, REDIS_REPLY_ARRAY, deadline,
                       "list the pending records", &r)) != 0)
        return err;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        size_t fl = sizeof ENGRAM__RP_FIELD - 1;
        if (e->type != REDIS_REPLY_STRING || e->len != fl + 16 || strlen(e->str) != e->len ||
            memcmp(e->str, ENGRAM__RP_FIELD, fl) != 0)
            continue;
        /* The ages are measured on the clock that stamped the records. */
        if (!now && (err = server_ms(rs, s, deadline, &now)) != 0)
            break;
        gc_one(rs, s, e->str, idle_ms, now, flags, report, ud);
    }
    freeReplyObject(r);
    return err;
}

static int redis_gc(void *state, uint64_t idle_ms, uint32_t flags, engram_gc_report_fn report,
                    void *ud)
{
    rstore *rs = state;
    engram__rsess *s;
    int err;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    err = gc_pass(rs, s, idle_ms, flags, report, ud);
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
    uint64_t renew_ns;  /* when the chunks' TTLs and the record are renewed next */
    XXH3_state_t *xs;
    char pfield[32];    /* this push's pending record */
    char popen[512];    /* its text while open, and once closed (without the stamp) */
    char pclosed[512];
    int failed;         /* a step failed: abort adds what it could not clean up */
} rwriter;

/* The next renewal is due in half a TTL. */
static void renew_later(rwriter *w)
{
    w->renew_ns = engram__now_ns() + (uint64_t)w->rs->ttl_ms * 1000000u / 2;
}

/* Stamps this push's record again, and schedules the next stamp: 0, or
 * -ECANCELED if a resolver closed it (the push can never publish). */
static int touch(rwriter *w, uint64_t deadline)
{
    const char *args[2] = {w->pfield, w->popen};
    long long v;
    int err;
    if ((err = script(w->rs, w->s, S_TOUCH, 2, args, NULL, deadline, "stamp a pending record",
                      &v)) != 0)
        return err;
    if (v != 1)
        return engram__err(-ECANCELED, "push of '%s' to %s was abandoned: its pending record "
                                       "'%s' was closed by a gc (engram_store_gc()), which "
                                       "takes a push that shows no life for its chunk TTL "
                                       "(%u ms) for dead",
                           w->m.name, w->rs->where, w->pfield, w->rs->ttl_ms);
    renew_later(w);
    return 0;
}

/* Sets the TTL of every chunk written so far again, and stamps the
 * record (step 2). */
static int renew_ttls(rwriter *w)
{
    char ms[24];
    uint64_t deadline = engram__rcl_deadline(w->rs->cl);
    int err;
    if ((err = touch(w, deadline)) != 0)
        return err;
    snprintf(ms, sizeof ms, "%u", w->rs->ttl_ms);
    for (uint64_t i = 0; i < w->chunks_done; i++) {
        char key[KEY_MAX + 24];
        const char *argv[3] = {"PEXPIRE", key, ms};
        redisReply *r;
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
    renew_later(w);
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
    /* Counted before it is sent: a chunk whose reply is lost may exist. */
    w->chunks_done++;
    if ((err = key_cmd(w->rs, w->s, ENGRAM__RCL_WRITE, 5, argv, lens, REDIS_REPLY_STATUS,
                       engram__rcl_deadline(w->rs->cl), "write a chunk", &r)) != 0)
        return err;
    freeReplyObject(r);
    w->m.chunk_sums[w->chunks_done - 1] = XXH3_64bits(data, len);
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

/* Deletes this push's chunks, then its record: only for a push that can
 * no longer publish (it never sent S_PUBLISH, or its record is closed).
 * 0, or the cleanup's failure (what is left is a gc's). */
static int discard(rwriter *w)
{
    engram__rpending p;
    pending_of(w->rs, &w->m, w->chunks_done, 0, &p);
    return pending_finish(w->rs, w->s, &p, w->pfield, engram__rcl_deadline(w->rs->cl));
}

/* Frees a writer after its push failed with `err` (message in
 * engram_errmsg()) and cannot publish any more: deletes what it wrote.
 * Returns err, with what could not be cleaned up added to the message. */
static int fail_discard(rwriter *w, int err)
{
    char msg[ENGRAM__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", engram_errmsg());
    if (discard(w) != 0)
        engram__err(err, "%s (and cleaning up after it: %s; engram_store_gc() deletes them, or "
                         "they expire within %u ms if not yet published)",
                    msg, engram_errmsg(), w->rs->ttl_ms);
    else
        engram__err(err, "%s", msg);
    rwriter_free(w);
    return err;
}

static void redis_writer_abort(void *wp)
{
    rwriter *w = wp;
    char msg[ENGRAM__ERRMSG_MAX];
    if (!w)
        return;
    if (w->failed) {
        /* After a failure of its own: the failure's message stays, with
         * what the cleanup could not do added. */
        fail_discard(w, 0);
        return;
    }
    /* Aborted by the caller: the cleanup's failure is nobody's return
     * value, so it goes to the log. */
    snprintf(msg, sizeof msg, "%s", engram_errmsg());
    if (discard(w) != 0)
        engram__log(ENGRAM_LOG_ERROR, 0, "abort of the push of '%s' to %s: %s", w->m.name,
                    w->rs->where, engram_errmsg());
    engram__err(0, "%s", msg);
    rwriter_free(w);
}

static int redis_writer_begin(void *state, const char *name, const engram_table_spec *spec,
                              void **out)
{
    rstore *rs = state;
    rwriter *w;
    engram__rpending p;
    uint64_t chunk_rows, max_rows;
    long long v;
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
    pending_of(rs, &w->m, w->m.nchunks, 0, &p);
    engram__rpending_body(&p, w->popen, sizeof w->popen);
    p.closed = 1;
    engram__rpending_body(&p, w->pclosed, sizeof w->pclosed);
    pending_field(w->m.epoch, w->pfield);
    if (!(w->m.chunk_sums = malloc(w->m.nchunks * sizeof *w->m.chunk_sums)) ||
        !(w->buf = malloc((size_t)(chunk_rows * spec->row_bytes))) ||
        !(w->xs = XXH3_createState())) {
        err = engram__err(-ENOMEM, "out of memory for a push of '%s'", name);
        goto fail;
    }
    XXH3_64bits_reset(w->xs);
    renew_later(w);
    if ((err = engram__rcl_sess_get(rs->cl, &w->s)) != 0)
        goto fail;
    /* What dead pushes and removals left behind goes first (best effort:
     * it is only housekeeping, and a failure here says nothing of ours). */
    {
        char msg[ENGRAM__ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", engram_errmsg());
        (void)gc_pass(rs, w->s, 0, 0, NULL, NULL);
        engram__err(0, "%s", msg);
    }
    /* Step 1: a published name fails at once, not after the upload; else
     * the open record makes the chunks to come findable by a gc, should
     * this push die. */
    {
        const char *args[3] = {name, w->pfield, w->popen};
        if ((err = script(rs, w->s, S_BEGIN, 3, args, NULL, engram__rcl_deadline(rs->cl),
                          "begin a push", &v)) != 0)
            goto fail;
    }
    if (v != 1) {
        err = engram__err(-EEXIST, "table '%s' already exists in %s", name, rs->where);
        goto fail;
    }
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
                goto fail;
            n = chunk_left;
        } else {
            n = nrows < chunk_left ? nrows : chunk_left;
            for (uint64_t i = 0; i < n; i++)
                memcpy(w->buf + (w->fill + i) * rb, src + i * src_stride, rb);
            w->fill += n;
            if (n == chunk_left) {
                if ((err = put_chunk(w, w->buf, w->fill)) != 0)
                    goto fail;
                w->fill = 0;
            }
        }
        w->rows_done += n;
        nrows -= n;
        src += n * src_stride;
    }
    return 0;
fail:
    w->failed = 1;
    return err;
}

/* Sends this push's publication (S_PUBLISH) of manifest `text`: 0 and
 * *v, its answer, or the failure (`what` names the step in its message),
 * after which whether it ran is unknown. */
static int publish(rwriter *w, const char *text, size_t tlen, const char *what, long long *v)
{
    const char *args[4] = {w->pfield, w->m.name, text, w->pclosed};
    size_t lens[4] = {strlen(w->pfield), strlen(w->m.name), tlen, strlen(w->pclosed)};
    return script(w->rs, w->s, S_PUBLISH, 4, args, lens, engram__rcl_deadline(w->rs->cl), what,
                  v);
}

/* The publication's reply was lost (`err`, message in engram_errmsg()):
 * resolves what happened by closing this push's record, which no copy of
 * the publication still in flight can get past.  0 if the push turned
 * out published; else frees w and returns the failure, saying what it
 * left. */
static int resolve(rwriter *w, int err, const char *text, size_t tlen)
{
    rstore *rs = w->rs;
    char first[ENGRAM__ERRMSG_MAX];
    const char *args[2] = {w->pfield, "0"};
    long long state, v;
    int rerr;

    snprintf(first, sizeof first, "%s", engram_errmsg());
    at_step("resolve", w->m.name);
    if ((rerr = script(rs, w->s, S_CLOSE, 2, args, NULL, engram__rcl_deadline(rs->cl),
                       "close the push's pending record", &state)) != 0 ||
        (state != 0 && state != 1)) {
        if (!rerr)
            engram__err(-EIO, "its pending record '%s' is not one this library wrote", w->pfield);
        err = engram__err(ENGRAM_EINDOUBT,
                          "push of '%s' to %s: the outcome is in doubt: the publication got no "
                          "answer (%s), and asking afterwards failed too (%s).  Its chunks are "
                          "kept: if the table is listed later, it is published and whole; if "
                          "not, engram_store_gc() (engram gc --redis) deletes them once the "
                          "push has shown no life for its chunk TTL (%u ms)",
                          w->m.name, rs->where, first, engram_errmsg(), rs->ttl_ms);
        rwriter_free(w);
        return err;
    }
    if (state == 1) {
        /* Closed by us (or a gc): nothing can publish it now. */
        engram__err(err, "push of '%s' failed, not published: %s", w->m.name, first);
        return fail_discard(w, err);
    }
    /* Gone: published by the lost publication (or by a copy of it), or
     * resolved by another process.  The publication again tells which
     * (with the record gone it can publish nothing), and if the manifest
     * is ours it writes it again on this connection, so that the WAIT
     * after it covers the publication, as for one answered. */
    if ((rerr = publish(w, text, tlen, "read the manifest back", &v)) != 0) {
        err = engram__err(ENGRAM_EINDOUBT,
                          "push of '%s' to %s: the outcome is in doubt: the publication got "
                          "no answer (%s), its pending record is gone, and the manifest "
                          "could not be read (%s): list the namespace to see whether it "
                          "is published",
                          w->m.name, rs->where, first, engram_errmsg());
        rwriter_free(w);
        return err;
    }
    if (v == 1)
        return 0;
    if (v != 0 && v != -1) {
        err = engram__err(ENGRAM_EINDOUBT,
                          "push of '%s' to %s: the outcome is in doubt: the publication got "
                          "no answer (%s), and reading it back answered %lld: list the "
                          "namespace to see whether it is published",
                          w->m.name, rs->where, first, v);
        rwriter_free(w);
        return err;
    }
    err = engram__err(err, "push of '%s' failed, not published (its pending record was resolved "
                           "by another process, which deletes its chunks): %s",
                      w->m.name, first);
    rwriter_free(w);
    return err;
}

static int redis_writer_commit(void *wp)
{
    rwriter *w = wp;
    rstore *rs = w->rs;
    char *text = NULL;
    size_t tlen;
    redisReply *r;
    long long v;
    int err;

    if (w->rows_done != w->m.num_rows) {
        err = engram__err(ENGRAM_ESTATE, "table '%s': only %" PRIu64 " of %" PRIu64
                                         " rows were written",
                          w->m.name, w->rows_done, w->m.num_rows);
        goto fail;
    }
    /* Step 3: the chunks become permanent, with the record stamped now
     * and then, so that no gc takes a long commit for a dead one ... */
    if ((err = touch(w, engram__rcl_deadline(rs->cl))) != 0)
        goto fail;
    for (uint64_t i = 0; i < w->chunks_done; i++) {
        char key[KEY_MAX + 24];
        const char *argv[2] = {"PERSIST", key};
        if (engram__now_ns() >= w->renew_ns &&
            (err = touch(w, engram__rcl_deadline(rs->cl))) != 0)
            goto fail;
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
    /* Step 4: publication, one atomic step that needs the record open. */
    at_step("publish", w->m.name);
    if ((err = publish(w, text, tlen, "publish a table", &v)) == 0 && v != 1 && v != 0 &&
        v != -1)
        /* Not an answer this script gives: take nothing for granted. */
        err = engram__err(-EIO, "publish '%s' in %s: the script answered %lld", w->m.name,
                          rs->where, v);
    if (err) {
        /* Whether it ran is unknown: find out before anything is
         * deleted. */
        if ((err = resolve(w, err, text, tlen)) != 0) {
            free(text);
            return err;
        }
    } else if (v != 1) {
        err = v == 0 ? engram__err(-EEXIST, "table '%s' already exists in %s (another push won)",
                                   w->m.name, rs->where)
                     : engram__err(-ECANCELED,
                                   "push of '%s' to %s was abandoned: its pending record '%s' "
                                   "was closed by a gc (engram_store_gc()) before it could "
                                   "publish",
                                   w->m.name, rs->where, w->pfield);
        goto fail;
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
    return fail_discard(w, err);
}

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

static const engram__remote_vt redis_vt = {
    .kind = ENGRAM_TABLE_REDIS,         .close = redis_close,
    .open = redis_open,                 .info = redis_info,
    .list = redis_list,                 .read_all = redis_read_all,
    .remove = redis_remove,             .writer_begin = redis_writer_begin,
    .writer_append = redis_writer_append, .writer_commit = redis_writer_commit,
    .writer_abort = redis_writer_abort, .gc = redis_gc,
    .verify = engram__remote_verify,   .packed = 1,
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
