/*
 * kv.c - a Redis Cluster as kv.h's key-value store, and the namespace
 * operations of a store on it, which are the publication protocol's
 * (publish.c) over it.
 *
 * Records are the fields of one hash per namespace,
 * "<prefix>/<ns>/.manifests", so a namespace's records live on one master
 * and its compare-and-swap is one Lua script there (no other client's
 * command can come between its read and its write).  Pieces are strings
 * "<prefix>/<ns>/<name>/<epoch>/<index>" spread over the cluster's slots,
 * or with the table's "{<name>/<epoch>}" as hash tag in one slot
 * (layout tagged), written with SET ... PX and made permanent with
 * PERSIST.  The store's clock is TIME of the hash's master; sync is WAIT
 * on every master this session wrote to.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rstore.h"

static int kv_sess_get(void *kv, void **s)
{
    rstore *rs = kv;
    engram__rsess *rsess;
    int err = engram__rcl_sess_get(rs->cl, &rsess);
    *s = err ? NULL : rsess;
    return err;
}

static void kv_sess_put(void *kv, void *s)
{
    (void)kv;
    engram__rcl_sess_put(s);
}

static int kv_rec_get(void *kv, void *s, const char *name, char **val, size_t *len)
{
    rstore *rs = kv;
    const char *argv[3] = {"HGET", rs->mkey, name};
    redisReply *r;
    int err;
    if ((err = key_cmd(rs, s, 0, 3, argv, NULL, REDIS_REPLY_STRING, engram__rcl_deadline(rs->cl),
                       "read a record", &r)) != 0)
        return err;
    if (r->type == REDIS_REPLY_NIL) {
        freeReplyObject(r);
        return engram__err(-ENOENT, "record '%s' not found in %s", name, rs->where);
    }
    if (!(*val = malloc(r->len + 1))) {
        freeReplyObject(r);
        return engram__err(-ENOMEM, "out of memory for a record of %zu bytes", r->len);
    }
    memcpy(*val, r->str, r->len);
    (*val)[r->len] = '\0';
    *len = r->len;
    freeReplyObject(r);
    return 0;
}

/* CAS(name, mode, expect, val): mode "a" put-if-absent, "s" swap, "d"
 * compare-and-delete; answers kv.h's codes.  Expecting the bytes it puts,
 * it writes them again: a server replicates no command that changed
 * nothing, and a WAIT on this connection must cover them. */
static const char S_CAS[] =
    "local cur = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "if ARGV[2] == 'a' then\n"
    "  if cur then return 2 end\n"
    "  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])\n"
    "  return 1\n"
    "end\n"
    "if not cur then return 0 end\n"
    "if cur ~= ARGV[3] then return -1 end\n"
    "if ARGV[2] == 'd' then redis.call('HDEL', KEYS[1], ARGV[1])\n"
    "else redis.call('HSET', KEYS[1], ARGV[1], ARGV[4]) end\n"
    "return 1\n";

static int kv_rec_cas(void *kv, void *s, const char *name, const char *expect, size_t elen,
                      const char *val, size_t vlen, int *res)
{
    rstore *rs = kv;
    const char *mode = !expect ? "a" : val ? "s" : "d";
    const char *argv[8] = {"EVAL", S_CAS, "1", rs->mkey, name, mode,
                           expect ? expect : "", val ? val : ""};
    size_t lens[8] = {4, sizeof S_CAS - 1, 1, rs->mkey_len, strlen(name), 1,
                      expect ? elen : 0, val ? vlen : 0};
    redisReply *r;
    int err;
    *res = ENGRAM__KV_DIFFERS;
    if ((err = engram__rcl_cmd(s, rs->mslot, ENGRAM__RCL_WRITE, 8, argv, lens,
                               engram__rcl_deadline(rs->cl), &r)) != 0)
        return engram__err(err, "change record '%s' in %s: %s", name, rs->where,
                           engram_errmsg());
    if (r->type != REDIS_REPLY_INTEGER || r->integer < -1 || r->integer > 2) {
        err = engram__err(-EIO, "change record '%s' in %s: the script answered %s", name,
                          rs->where,
                          r->type == REDIS_REPLY_ERROR ? r->str : "a reply of an unexpected type");
        freeReplyObject(r);
        return err;
    }
    *res = (int)r->integer;
    freeReplyObject(r);
    return 0;
}

/* Calls each() for the (field, value) pairs of a hash's reply. */
static int each_field(const redisReply *r,
                      int (*each)(void *ud, const char *name, const char *val, size_t len),
                      void *ud)
{
    int err = 0;
    for (size_t i = 0; i + 1 < r->elements && !err; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        /* Only names a C string holds whole. */
        if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING &&
            strlen(k->str) == k->len)
            err = each(ud, k->str, v->str, v->len);
    }
    return err;
}

static int kv_rec_list(void *kv, void *s,
                       int (*each)(void *ud, const char *name, const char *val, size_t len),
                       void *ud)
{
    rstore *rs = kv;
    const char *argv[2] = {"HGETALL", rs->mkey};
    redisReply *r;
    int err;
    if ((err = key_cmd(rs, s, 0, 2, argv, NULL, REDIS_REPLY_ARRAY, engram__rcl_deadline(rs->cl),
                       "list the records", &r)) != 0)
        return err;
    err = each_field(r, each, ud);
    freeReplyObject(r);
    return err;
}

/* Every field of the hash, with only the first line of a value that is
 * not a pending record. */
static const char S_PENDING[] =
    "local all = redis.call('HGETALL', KEYS[1])\n"
    "local out = {}\n"
    "for i = 1, #all, 2 do\n"
    "  local v = all[i + 1]\n"
    "  if string.sub(v, 1, 17) ~= 'engram-pending 1\\n' then\n"
    "    local nl = string.find(v, '\\n', 1, true)\n"
    "    v = string.sub(v, 1, nl or 64)\n"
    "  end\n"
    "  out[#out + 1] = all[i]\n"
    "  out[#out + 1] = v\n"
    "end\n"
    "return out\n";

static int kv_rec_list_pending(void *kv, void *s,
                               int (*each)(void *ud, const char *name, const char *val,
                                           size_t len),
                               void *ud)
{
    rstore *rs = kv;
    const char *argv[4] = {"EVAL", S_PENDING, "1", rs->mkey};
    size_t lens[4] = {4, sizeof S_PENDING - 1, 1, rs->mkey_len};
    redisReply *r;
    int err;
    if ((err = engram__rcl_cmd(s, rs->mslot, 0, 4, argv, lens, engram__rcl_deadline(rs->cl),
                               &r)) != 0)
        return engram__err(err, "list the pending records of %s: %s", rs->where,
                           engram_errmsg());
    if (r->type != REDIS_REPLY_ARRAY) {
        err = engram__err(-EIO, "list the pending records of %s: the script answered %s",
                          rs->where,
                          r->type == REDIS_REPLY_ERROR ? r->str : "a reply of an unexpected type");
        freeReplyObject(r);
        return err;
    }
    err = each_field(r, each, ud);
    freeReplyObject(r);
    return err;
}

static int kv_now_ms(void *kv, void *s, uint64_t *ms)
{
    rstore *rs = kv;
    const char *argv[1] = {"TIME"};
    redisReply *r;
    int err;
    if ((err = engram__rcl_cmd(s, rs->mslot, 0, 1, argv, NULL, engram__rcl_deadline(rs->cl),
                               &r)) != 0)
        return engram__err(err, "TIME in %s: %s", rs->where, engram_errmsg());
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

static int kv_sync(void *kv, void *s)
{
    rstore *rs = kv;
    int err = engram__rcl_sync(s, engram__rcl_deadline(rs->cl));
    return err ? engram__err(err, "%s: %s", rs->where, engram_errmsg()) : 0;
}

static int kv_piece_put(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                        const void *data, size_t len, uint32_t ttl_ms)
{
    rstore *rs = kv;
    char kpre[KEY_MAX], key[KEY_MAX + 24], ms[24];
    uint32_t kpre_len = chunk_prefix(rs, pc->name, pc->epoch, pc->layout, kpre);
    const char *argv[5] = {"SET", key, data, "PX", ms};
    size_t lens[5] = {3, chunk_key(kpre, kpre_len, index, key), len, 2, 0};
    redisReply *r;
    int err;
    lens[4] = (size_t)snprintf(ms, sizeof ms, "%u", ttl_ms);
    if ((err = key_cmd(rs, s, ENGRAM__RCL_WRITE, 5, argv, lens, REDIS_REPLY_STATUS,
                       engram__rcl_deadline(rs->cl), "write a chunk", &r)) != 0)
        return err;
    freeReplyObject(r);
    return 0;
}

static int kv_piece_expire(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                           uint32_t ttl_ms)
{
    rstore *rs = kv;
    char kpre[KEY_MAX], key[KEY_MAX + 24], ms[24];
    uint32_t kpre_len = chunk_prefix(rs, pc->name, pc->epoch, pc->layout, kpre);
    const char *argv[3] = {ttl_ms ? "PEXPIRE" : "PERSIST", key, ms};
    redisReply *r;
    int err, have;
    chunk_key(kpre, kpre_len, index, key);
    snprintf(ms, sizeof ms, "%u", ttl_ms);
    if ((err = key_cmd(rs, s, ENGRAM__RCL_WRITE, ttl_ms ? 3 : 2, argv, NULL, REDIS_REPLY_INTEGER,
                       engram__rcl_deadline(rs->cl),
                       ttl_ms ? "renew a chunk's TTL" : "keep a chunk", &r)) != 0)
        return err;
    have = r->integer == 1;
    freeReplyObject(r);
    if (!have && !ttl_ms) {
        /* PERSIST answers 0 also for a key that has no TTL: made permanent
         * by a copy of this command whose connection broke.  A WAIT on
         * this connection covers that copy's writes only after a write
         * here that changes something (cluster.c), so the TTL is set and
         * removed again. */
        const char *ex[3] = {"PEXPIRE", key, "86400000"};
        if ((err = key_cmd(rs, s, ENGRAM__RCL_WRITE, 3, ex, NULL, REDIS_REPLY_INTEGER,
                           engram__rcl_deadline(rs->cl), "renew a chunk's TTL", &r)) != 0)
            return err;
        have = r->integer == 1;
        freeReplyObject(r);
        if (have) {
            /* Answered 0 only if a copy of it, sent again after a lost
             * connection, ran first: then the chunk is there. */
            const char *ex2[2] = {"EXISTS", key};
            if ((err = key_cmd(rs, s, ENGRAM__RCL_WRITE, 2, argv, NULL, REDIS_REPLY_INTEGER,
                               engram__rcl_deadline(rs->cl), "keep a chunk", &r)) != 0)
                return err;
            have = r->integer == 1;
            freeReplyObject(r);
            if (!have) {
                if ((err = key_cmd(rs, s, 0, 2, ex2, NULL, REDIS_REPLY_INTEGER,
                                   engram__rcl_deadline(rs->cl), "look for a chunk", &r)) != 0)
                    return err;
                have = r->integer == 1;
                freeReplyObject(r);
            }
        }
    }
    return have ? 0 : engram__err(-ENODATA, "chunk '%s' of %s is gone", key, rs->where);
}

static int kv_piece_del(void *kv, void *s, const engram__kv_piece *pc, uint64_t n)
{
    rstore *rs = kv;
    char kpre[KEY_MAX];
    uint32_t kpre_len = chunk_prefix(rs, pc->name, pc->epoch, pc->layout, kpre);
    return delete_chunks(rs, s, kpre, kpre_len, n, engram__rcl_deadline(rs->cl));
}

/* One operation's time (the store's timeout) per 32 MiB read. */
#define READ_SCALE_BYTES ((uint64_t)32 << 20)

static int kv_get_ranges(void *kv, void *s, const engram__kv_piece *pc,
                         const engram__kv_range *rg, size_t n, uint64_t bytes)
{
    rstore *rs = kv;
    char kpre[KEY_MAX];
    uint32_t kpre_len = chunk_prefix(rs, pc->name, pc->epoch, pc->layout, kpre);
    uint64_t now = engram__now_ns(), dl = engram__rcl_deadline(rs->cl);
    uint64_t scale = (bytes + READ_SCALE_BYTES - 1) / READ_SCALE_BYTES;
    engram__rcl_get *g;
    if (!(g = engram__rcl_gets(s, n)))
        return engram__err(-ENOMEM, "out of memory for %zu reads", n);
    for (size_t i = 0; i < n; i++)
        g[i] = (engram__rcl_get){.kpre = kpre,
                                 .ksuf = rg[i].index,
                                 .start = rg[i].start,
                                 .dst = rg[i].dst,
                                 .kpre_len = kpre_len,
                                 .len = rg[i].len,
                                 .slot = chunk_slot(kpre, kpre_len, rg[i].index),
                                 .whole = (uint8_t)(rg[i].whole != 0)};
    if (scale > 1)
        dl += (dl - now) * (scale - 1);
    return engram__rcl_read(s, g, n, dl);
}

const engram__kv_vt engram__redis_kv_vt = {
    .sess_get = kv_sess_get,
    .sess_put = kv_sess_put,
    .rec_get = kv_rec_get,
    .rec_cas = kv_rec_cas,
    .rec_list = kv_rec_list,
    .now_ms = kv_now_ms,
    .sync = kv_sync,
    .piece_put = kv_piece_put,
    .piece_expire = kv_piece_expire,
    .piece_del = kv_piece_del,
    .get_ranges = kv_get_ranges,
    .rec_list_pending = kv_rec_list_pending,
};

/* ------------------------------------------------------------------------
 * The namespace operations (remote.h): the protocol's, on this store.
 */

int redis_info(void *state, const char *name, engram_table_info *info)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    int err;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    err = engram__pub_manifest(&rs->pub, s, name, &m, NULL, NULL);
    engram__rcl_sess_put(s);
    if (err)
        return err;
    manifest_info(rs, &m, info);
    engram__rmanifest_free(&m);
    return 0;
}

int redis_list(void *state, int (*add)(void *ud, const char *name), void *ud)
{
    return engram__pub_list(&((rstore *)state)->pub, add, ud);
}

int redis_read_all(void *state, const char *name, const engram__remote_sink *k)
{
    return engram__pub_read_all(&((rstore *)state)->pub, name, k);
}

int redis_remove(void *state, const char *name, int *unpublished)
{
    return engram__pub_remove(&((rstore *)state)->pub, name, unpublished);
}

int redis_gc(void *state, uint64_t idle_ms, uint32_t flags, engram_gc_report_fn report,
             void *ud)
{
    return engram__pub_gc(&((rstore *)state)->pub, idle_ms, flags, report, ud);
}

int redis_writer_begin(void *state, const char *name, const engram_table_spec *spec,
                       void **out)
{
    return engram__pub_writer_begin(&((rstore *)state)->pub, name, spec, out);
}
