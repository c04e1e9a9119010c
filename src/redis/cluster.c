/*
 * cluster.c - the Redis Cluster client itself: creation, counters, single
 * commands with the cluster's redirections and retries, and the wait for
 * the replicas (WAIT) after writes (see cluster.h).  Routing is slots.c's,
 * connections conn.c's, batches of ranged reads read.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "cluster_int.h"

/* ------------------------------------------------------------------------
 * Creation.
 */

int engram__rcl_create(const char *nodes, const engram__rcl_opts *o, engram__rcl **out)
{
    engram__rcl *cl;
    const char *p;
    int err;

    *out = NULL;
    if (!nodes || !*nodes)
        return engram__err(-EINVAL, "no Redis Cluster node given (host:port[,host:port...])");
    if (!(cl = calloc(1, sizeof *cl)))
        return engram__err(-ENOMEM, "out of memory for a Redis Cluster client");
    pthread_mutex_init(&cl->lock, NULL);
    pthread_mutex_init(&cl->refresh_lock, NULL);
    cl->pid = getpid();
    cl->timeout_ns = (uint64_t)o->timeout_ms * 1000000u;
    cl->connect_ns = (uint64_t)o->connect_timeout_ms * 1000000u;
    for (uint32_t i = 0; i < ENGRAM__RCL_SLOTS; i++)
        atomic_init(&cl->slot_node[i], ENGRAM__RCL_NONE);
    if (!(cl->seeds = strdup(nodes)) || (o->user && !(cl->user = strdup(o->user))) ||
        (o->password && !(cl->password = strdup(o->password)))) {
        err = engram__err(-ENOMEM, "out of memory for a Redis Cluster client");
        goto fail;
    }
    for (p = nodes; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char host[256];
        int port;
        if (parse_addr(p, n, host, sizeof host, &port) != 0) {
            err = engram__err(-EINVAL, "Redis node '%.*s' is not host:port (a port 1..65535)",
                              (int)(n > 300 ? 300 : n), p);
            goto fail;
        }
        if (node_intern(cl, host, port) == ENGRAM__RCL_NONE) {
            err = engram__err(-ENOMEM, "too many Redis nodes in '%s'", nodes);
            goto fail;
        }
        p += n;
        if (*p == ',')
            p++;
    }
    cl->nseeds = atomic_load_explicit(&cl->nnodes, memory_order_relaxed);
    if ((err = refresh(cl, 0, engram__rcl_deadline(cl))) != 0)
        goto fail;
    *out = cl;
    return 0;
fail:
    engram__rcl_destroy(cl);
    return err;
}

void engram__rcl_destroy(engram__rcl *cl)
{
    engram__rsess *s, *next;
    if (!cl)
        return;
    for (s = cl->all; s; s = next) {
        next = s->all_next;
        sess_free(s);
    }
    sess_free(cl->ctl);
    for (uint32_t i = 0; i < atomic_load_explicit(&cl->nnodes, memory_order_relaxed); i++)
        free(cl->nodes[i]);
    free(cl->seeds);
    free(cl->user);
    if (cl->password) {
        /* Not left behind in freed memory. */
        volatile char *v = cl->password;
        while (*v)
            *v++ = 0;
        free(cl->password);
    }
    pthread_mutex_destroy(&cl->lock);
    pthread_mutex_destroy(&cl->refresh_lock);
    free(cl);
}

uint64_t engram__rcl_deadline(const engram__rcl *cl)
{
    return engram__now_ns() + cl->timeout_ns;
}

void engram__rcl_stats(engram__rcl *cl, engram_redis_stats *s)
{
    s->nodes = atomic_load_explicit(&cl->nnodes, memory_order_relaxed);
    s->batches = atomic_load_explicit(&cl->batches, memory_order_relaxed);
    s->gets = atomic_load_explicit(&cl->gets, memory_order_relaxed);
    s->commands = atomic_load_explicit(&cl->commands, memory_order_relaxed);
    s->moved = atomic_load_explicit(&cl->moved, memory_order_relaxed);
    s->ask = atomic_load_explicit(&cl->ask, memory_order_relaxed);
    s->retries = atomic_load_explicit(&cl->retries, memory_order_relaxed);
    s->connects = atomic_load_explicit(&cl->connects, memory_order_relaxed);
    s->conn_errors = atomic_load_explicit(&cl->conn_errors, memory_order_relaxed);
    s->map_refreshes = atomic_load_explicit(&cl->refreshes, memory_order_relaxed);
    s->timeouts = atomic_load_explicit(&cl->timeouts, memory_order_relaxed);
}

/* ------------------------------------------------------------------------
 * Single commands.
 */

int engram__rcl_cmd(engram__rsess *s, uint16_t slot, unsigned flags, int argc, const char **argv,
                    const size_t *lens, uint64_t deadline, redisReply **reply)
{
    engram__rcl *cl = s->cl;
    uint32_t node = slot_owner(cl, slot);
    int ask = 0, err = 0;
    unsigned waits = 0;

    *reply = NULL;
    snprintf(s->last_msg, sizeof s->last_msg, "no attempt");
    for (unsigned attempt = 0;; attempt++) {
        uint64_t seen = map_version(cl);
        redisReply *r = NULL;
        rconn *c;
        if (attempt > 0 && engram__now_ns() >= deadline) {
            ctr(&cl->timeouts, 1);
            return engram__err(-ETIMEDOUT, "%s on slot %u: gave up after %u attempts: %s",
                               argv[0], (unsigned)slot, attempt, s->last_msg);
        }
        if (node == ENGRAM__RCL_NONE) {
            snprintf(s->last_msg, sizeof s->last_msg, "no node serves slot %u", (unsigned)slot);
            goto retry;
        }
        if ((err = conn_get(s, node, deadline, &c)) != 0) {
            if (err == -EACCES || err == -ENOMEM)
                return engram__err(err, "%s", s->last_msg);
            goto retry;
        }
        if (ask) {
            const char *a[1] = {"ASKING"};
            if ((err = conn_append_argv(c, 1, a, NULL)) != 0)
                return engram__err(err, "out of memory for a command");
        }
        if ((err = conn_append_argv(c, argc, argv, lens)) != 0)
            return engram__err(err, "out of memory for a command");
        ctr(&cl->commands, 1);
        if (flags & ENGRAM__RCL_WRITE)
            c->dirty = 1;
        if (ask) {
            err = conn_reply(s, c, deadline, &r);
            if (err == 0)
                freeReplyObject(r);
            r = NULL;
        }
        if (err == 0)
            err = conn_reply(s, c, deadline, &r);
        if (err != 0) {
            snprintf(s->last_msg, sizeof s->last_msg, "%s on %s: %s", argv[0],
                     node_get(cl, node)->addr,
                     err == -ETIMEDOUT ? "timed out" : err == -EIO ? "protocol error"
                                                                   : strerror(-err));
            ctr(&cl->conn_errors, 1);
            conn_close(s, c);
            goto retry;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            unsigned rs = slot;
            if (strncmp(r->str, "MOVED ", 6) == 0 || strncmp(r->str, "ASK ", 4) == 0) {
                int is_ask = r->str[0] == 'A';
                uint32_t to = redirect_node(cl, r->str, &rs);
                snprintf(s->last_msg, sizeof s->last_msg, "%s", r->str);
                freeReplyObject(r);
                if (to == ENGRAM__RCL_NONE)
                    return engram__err(-EIO, "%s: a redirection to a bad address: %s", argv[0],
                                       s->last_msg);
                ctr(is_ask ? &cl->ask : &cl->moved, 1);
                if (!is_ask && rs < ENGRAM__RCL_SLOTS)
                    atomic_store_explicit(&cl->slot_node[rs], (uint16_t)to, memory_order_relaxed);
                node = to;
                ask = is_ask;
                /* A redirection loop (a cluster being reconfigured) gets
                 * the backoff too, after a few. */
                if (attempt >= 8)
                    backoff(waits++, deadline);
                continue;
            }
            if (denied(r->str)) {
                err = engram__err(-EACCES, "%s on %s: %s", argv[0], node_get(cl, node)->addr,
                                  r->str);
                freeReplyObject(r);
                return err;
            }
            if (transient_error(r->str)) {
                snprintf(s->last_msg, sizeof s->last_msg, "%s on %s: %s", argv[0],
                         node_get(cl, node)->addr, r->str);
                freeReplyObject(r);
                goto retry;
            }
        }
        *reply = r;
        return 0;
    retry:
        ctr(&cl->retries, 1);
        backoff(waits++, deadline);
        if ((err = refresh(cl, seen, deadline)) != 0)
            map_failed(s);
        node = slot_owner(cl, slot);
        ask = 0;
    }
}

int engram__rcl_sync(engram__rsess *s, uint64_t deadline)
{
    engram__rcl *cl = s->cl;
    /* A master replicates one ordered stream, so a later write on a new
     * connection to it, once WAIT acknowledges it, covers every write
     * the master ran before it, those of a broken connection included.
     * WAIT counts only to the last command of its connection that changed
     * something (a server replicates nothing else), so the writers here
     * follow a write whose answer was lost with one that changes data
     * when it succeeds: a chunk's PERSIST (1: it removed the TTL) after
     * its SET (kv.c sets and removes a TTL again where PERSIST found
     * none), a record's compare-and-swap that writes the bytes it finds
     * again after a lost one (publish.c).  Only a node with no later write
     * is in doubt.  A node without replicas has nothing to wait for. */
    for (uint32_t i = 0; s->lost_dirty && i < ENGRAM__RCL_MAX_NODES; i++) {
        if (!s->lost[i] || (s->conns[i] && s->conns[i]->dirty) ||
            atomic_load_explicit(&node_get(cl, i)->replicas, memory_order_relaxed) <= 0)
            continue;
        s->lost_dirty = 0;
        for (uint32_t j = 0; j < ENGRAM__RCL_MAX_NODES; j++)
            if (s->conns[j])
                s->conns[j]->dirty = 0;
        return engram__err(-EIO, "a connection to %s broke after writes that were not yet "
                                 "acknowledged by its replicas: they may be lost",
                           node_get(cl, i)->addr);
    }
    s->lost_dirty = 0;
    for (uint32_t i = 0; i < ENGRAM__RCL_MAX_NODES; i++) {
        rconn *c = s->conns[i];
        const rnode *nd;
        redisReply *r = NULL;
        char want[16], ms[24];
        const char *argv[3] = {"WAIT", want, ms};
        int replicas, err;
        uint64_t left;
        if (!c || !c->dirty)
            continue;
        nd = node_get(cl, i);
        c->dirty = 0;
        replicas = atomic_load_explicit(&nd->replicas, memory_order_relaxed);
        if (replicas <= 0)
            continue;
        left = left_ms(deadline);
        snprintf(want, sizeof want, "%d", replicas);
        snprintf(ms, sizeof ms, "%" PRIu64, left ? left : 1);
        ctr(&cl->commands, 1);
        if ((err = conn_call(s, c, 3, argv, NULL, deadline + 1000000000u, &r)) != 0) {
            conn_close(s, c);
            return engram__err(err == -ETIMEDOUT ? -ETIMEDOUT : -EIO,
                               "WAIT on %s for its replicas: %s", nd->addr,
                               err == -ETIMEDOUT ? "timed out" : strerror(-err));
        }
        if (r->type != REDIS_REPLY_INTEGER || r->integer < replicas) {
            err = engram__err(-ETIMEDOUT,
                              "WAIT on %s: %lld of its %d replicas acknowledged the writes in "
                              "time%s%s",
                              nd->addr, r->type == REDIS_REPLY_INTEGER ? r->integer : 0LL,
                              replicas, r->type == REDIS_REPLY_ERROR ? ": " : "",
                              r->type == REDIS_REPLY_ERROR ? r->str : "");
            freeReplyObject(r);
            return err;
        }
        freeReplyObject(r);
    }
    return 0;
}
