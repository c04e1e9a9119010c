/*
 * protocol.c - the publication protocol's atomic steps (Lua scripts run
 * on the manifests' hash) and the pending records they keep; what a push
 * (push.c), a removal and a gc (nsops.c) are made of.  docs/redis.md
 * ("The publication protocol") says what every party can observe.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "rstore.h"

void (*engram__redis_hook)(const char *step, const char *name);

void at_step(const char *step, const char *name)
{
    if (engram__redis_hook)
        engram__redis_hook(step, name);
}

/* ------------------------------------------------------------------------
 * The publication protocol's atomic steps: Lua scripts run by the master
 * of the manifests' hash (EVAL with that one key), so each one is a
 * single step no other client's command can come between.  docs/redis.md
 * ("The publication protocol") says what each party can observe.
 *
 * Every set of chunk keys that no manifest owns has a pending record
 * (manifest.h): "open" while its push may still publish, "closed" once
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
const char S_BEGIN[] =
    LUA_NOW "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end\n"
            "redis.call('HSET', KEYS[1], ARGV[2], stamped(ARGV[3]))\n"
            "return 1\n";

/* S_TOUCH(field, body): 1 and a new stamp if the record is open, else 0
 * (closed by a resolver, or gone). */
const char S_TOUCH[] =
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
const char S_PUBLISH[] =
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
const char S_CLOSE[] =
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
const char S_REMOVE[] =
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
int script(rstore *rs, engram__rsess *s, const char *body, int nargs, const char **args,
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

void pending_field(uint64_t epoch, char field[32])
{
    snprintf(field, 32, ENGRAM__RP_FIELD "%016" PRIx64, epoch);
}

/* The pending record (without its stamp) of chunks [0, nchunks) of the
 * table *m describes, with this store's TTL. */
void pending_of(const rstore *rs, const engram__rmanifest *m, uint64_t nchunks,
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
int pending_finish(rstore *rs, engram__rsess *s, const engram__rpending *p,
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
