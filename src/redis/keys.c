/*
 * keys.c - the keys of a Redis namespace's tables, and the small commands
 * on them: chunk keys and their slots, one command on one key with its
 * reply's type checked, deleting a table's chunks.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "rstore.h"

/* ------------------------------------------------------------------------
 * Keys and small commands.
 */

/* The chunk keys' common prefix of a table: the chunk's index follows. */
uint32_t chunk_prefix(const rstore *rs, const char *name, uint64_t epoch, int tagged,
                      char *buf)
{
    int n = snprintf(buf, KEY_MAX, tagged ? "%s/%s/{%s/%016" PRIx64 "}/" : "%s/%s/%s/%016" PRIx64 "/",
                     rs->prefix, rs->ns, name, epoch);
    return (uint32_t)n;
}

/* The key of chunk i: the prefix, then i in decimal (what read.c's
 * batches send as kpre + decimal(ksuf)).  Returns its length. */
size_t chunk_key(const char *kpre, uint32_t kpre_len, uint64_t i,
                 char key[KEY_MAX + 24])
{
    return (size_t)snprintf(key, KEY_MAX + 24, "%.*s%" PRIu64, (int)kpre_len, kpre, i);
}

uint16_t chunk_slot(const char *kpre, uint32_t kpre_len, uint64_t i)
{
    char key[KEY_MAX + 24];
    size_t n = chunk_key(kpre, kpre_len, i, key);
    return engram__rcl_keyslot(key, n);
}

/* Runs a command on the key argv[1] (its slot), expecting a reply of
 * `type`: 0 and *reply, or a negative code with a message naming `what`. */
int key_cmd(rstore *rs, engram__rsess *s, unsigned flags, int argc, const char **argv,
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

/* Deletes chunks [0, n) of a table: 0, or the first failure (the rest
 * are still tried, until the deadline). */
int delete_chunks(rstore *rs, engram__rsess *s, const char *kpre, uint32_t kpre_len,
                  uint64_t n, uint64_t deadline)
{
    int first = 0;
    char msg[ENGRAM__ERRMSG_MAX] = "";
    for (uint64_t i = 0; i < n; i++) {
        char key[KEY_MAX + 24];
        const char *argv[2] = {"UNLINK", key};
        redisReply *r = NULL; /* set where key_cmd() returns 0 (GCC 12 -O3 cannot tell) */
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
