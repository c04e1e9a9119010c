/*
 * cluster.h - a client of a Redis Cluster: slot routing, connections,
 * single commands and pipelined batches of ranged reads, with the
 * cluster's redirections and failures handled (internal; needs hiredis).
 *
 * libhiredis 0.14 (Debian's) formats and parses the protocol; it has no
 * cluster support, so everything about the cluster is here:
 *
 *  - Routing: a key's slot is CRC16 (XMODEM) of the key, or of its hash
 *    tag (the bytes between the first '{' and the next '}', if not
 *    empty), mod 16384.  The slot map comes from CLUSTER SLOTS, asked of
 *    any node that answers, and is one atomic entry per slot: a reader
 *    may see a map half way through a refresh, which only costs a
 *    redirection.
 *  - Nodes are interned once ("host:port") and never forgotten, so a
 *    node index stays valid for the client's life.
 *  - Sessions: a set of connections, at most one per node, used by one
 *    thread at a time.  Lookup threads take a session from a free list
 *    and give it back, so each concurrent lookup has its own connection
 *    to each node and nothing is locked while bytes move.
 *  - Redirections and failures: MOVED updates the slot and retries at
 *    once (and reloads the whole map before the next round); ASK retries
 *    on the named node after ASKING; TRYAGAIN, CLUSTERDOWN, LOADING,
 *    MASTERDOWN and a connection that fails or is refused are retried
 *    after a backoff (1 ms doubling to 100 ms) with the map reloaded,
 *    until the operation's deadline.  Anything else is final.
 *  - Writes: a session remembers the nodes it wrote to and
 *    engram__rcl_sync() waits (WAIT) until each one's replicas, as the
 *    map knows them, acknowledged the writes; a connection lost after
 *    writes and before that makes the sync fail (the writes may be lost
 *    in a failover).
 *
 * Connections are non-blocking sockets driven by poll(): a batch writes
 * its pipelined commands to every node at once and reads the replies as
 * they come, so all nodes work at the same time.  Replies of a batch are
 * parsed by hiredis's reader with object functions of our own that copy
 * a range straight into its destination, allocating nothing.
 *
 * After fork() the child's first session drops the connections it
 * inherited (closing its copies only) and opens its own.
 *
 * The client is four files, over one inside (cluster_int.h): slots.c
 * (key slots, nodes, the slot map, retries), conn.c (connections and
 * sessions), cluster.c (creation, single commands, WAIT) and read.c
 * (batches of ranged reads).
 */
#ifndef ENGRAM_REDIS_CLUSTER_H
#define ENGRAM_REDIS_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "engram.h"

#define ENGRAM__RCL_SLOTS 16384
#define ENGRAM__RCL_MAX_NODES 1024
#define ENGRAM__RCL_NONE 0xffffu

typedef struct engram__rcl engram__rcl;
typedef struct engram__rsess engram__rsess;

typedef struct engram__rcl_opts {
    const char *user;            /* NULL: AUTH with the password only */
    const char *password;        /* NULL: no AUTH */
    uint32_t timeout_ms;         /* an operation's deadline, retries included */
    uint32_t connect_timeout_ms; /* one connection attempt */
} engram__rcl_opts;

/* The slot of a key (CRC16 of the key or its hash tag). */
uint16_t engram__rcl_keyslot(const char *key, size_t len);

/* CRC16-CCITT (XMODEM), Redis Cluster's key hash. */
uint16_t engram__rcl_crc16(const char *buf, size_t len);

/* Parses `nodes` ("host:port[,host:port...]", IPv6 hosts in brackets),
 * connects to the first that answers and loads the slot map.  0, or
 * -EINVAL (a bad list), -EACCES (AUTH refused), -ETIMEDOUT / -ECONNREFUSED
 * / -EHOSTUNREACH (no node answered), -EIO (not a cluster: CLUSTER SLOTS
 * refused), -ENOMEM, with the reason. */
int engram__rcl_create(const char *nodes, const engram__rcl_opts *o, engram__rcl **out);
void engram__rcl_destroy(engram__rcl *cl);

/* The deadline of an operation starting now (CLOCK_MONOTONIC ns). */
uint64_t engram__rcl_deadline(const engram__rcl *cl);
void engram__rcl_stats(engram__rcl *cl, engram_redis_stats *s);

/* Takes a session (made on first need), or gives it back.  -ENOMEM. */
int engram__rcl_sess_get(engram__rcl *cl, engram__rsess **out);
void engram__rcl_sess_put(engram__rsess *s);

#define ENGRAM__RCL_WRITE 0x1u /* the command writes: engram__rcl_sync() waits for it */

/* Runs one command on the master of `slot`, following redirections and
 * retrying as described above until `deadline`.  *reply (the caller
 * frees it with freeReplyObject) is the command's reply, which may be an
 * error reply other than the cluster's.  0, or -ETIMEDOUT (with the last
 * failure), -EACCES, -EIO (a protocol error), -ENOMEM. */
int engram__rcl_cmd(engram__rsess *s, uint16_t slot, unsigned flags, int argc, const char **argv,
                    const size_t *lens, uint64_t deadline, redisReply **reply);

/* Waits until the replicas of every node this session wrote to since the
 * last sync acknowledged those writes (WAIT), at most until `deadline`.
 * 0, -ETIMEDOUT (fewer replicas acknowledged), -EIO (a connection that
 * held writes was lost before). */
int engram__rcl_sync(engram__rsess *s, uint64_t deadline);

/* One ranged read of a batch: `len` bytes at `start` of the string at
 * key kpre + decimal(ksuf), which lives in `slot`, into dst.  With
 * `whole`, the range must end the string: one byte more is asked for,
 * and a string longer than start + len fails as a shorter one does. */
typedef struct engram__rcl_get {
    const char *kpre;
    uint64_t ksuf;
    uint64_t start;
    unsigned char *dst;
    uint32_t kpre_len;
    uint32_t len;
    uint16_t slot;
    uint16_t ask;   /* internal: the node an ASK pointed to, or NONE */
    uint16_t node;  /* internal: the node of this round */
    uint8_t state;  /* out: ENGRAM__RCL_DONE once dst holds the bytes */
    uint8_t why;    /* internal */
    uint8_t whole;  /* the range is the string's end (above) */
} engram__rcl_get;

#define ENGRAM__RCL_DONE 1

/* Reads the n ranges with one pipelined batch per node, every node at
 * once, and again for the ones redirected or failed transiently, until
 * `deadline`.  A range whose string is missing or shorter (an empty
 * reply: the key is gone) is final: -ENODATA.  Returns 0 when all are
 * done, else the first final failure or -ETIMEDOUT, with a message naming
 * the key and the node; the ranges done hold their bytes (state DONE),
 * the others' dst may hold nothing of value but were never written
 * (a range is copied only when its whole reply has the right length). */
int engram__rcl_read(engram__rsess *s, engram__rcl_get *g, size_t n, uint64_t deadline);

/* A buffer of this session's for n ranges (kept between calls); NULL
 * when out of memory. */
engram__rcl_get *engram__rcl_gets(engram__rsess *s, size_t n);

#endif
