/*
 * none.c - the Redis Cluster calls of a library built without
 * hiredis (ENGRAM_REDIS=OFF, or AUTO where hiredis was not found): they
 * exist, so that programs link the same way, and say why they fail.
 */
#include <errno.h>

#include "common.h"
#include "publish.h"

int engram_store_open_redis(const char *nodes, const char *ns, const engram_store_options *opts,
                            const engram_redis_options *ropts, engram_store **out)
{
    (void)nodes;
    (void)ns;
    (void)opts;
    (void)ropts;
    if (out)
        *out = NULL;
    return engram__err(-ENOTSUP, "this libengram was built without Redis Cluster support "
                                 "(hiredis was not found, or ENGRAM_REDIS=OFF)");
}

int engram_get_redis_stats(engram_store *st, engram_redis_stats *stats)
{
    (void)st;
    (void)stats;
    return engram__err(-ENOTSUP, "this libengram was built without Redis Cluster support");
}

const engram__pub *engram__redis_pub(engram_store *st)
{
    (void)st;
    return NULL;
}
