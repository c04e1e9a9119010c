/*
 * conn.c - the Redis Cluster client's connections and sessions:
 * non-blocking sockets, AUTH, writing pipelined commands, waiting for a
 * plain reply; sessions of connections (one per node) taken by one thread
 * at a time, and dropped in a child after fork() (see cluster.h).
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "cluster_int.h"

/* ------------------------------------------------------------------------
 * Connections.
 */

/* Frees connection `c` and what it holds (not its place in the session). */
static void conn_free(rconn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->rd)
        redisReaderFree(c->rd);
    free(c->out);
    free(c->exp);
    free(c);
}

void conn_close(engram__rsess *s, rconn *c)
{
    if (!c)
        return;
    if (c->dirty) {
        if (!s->lost_dirty)
            memset(s->lost, 0, sizeof s->lost);
        s->lost_dirty = 1;
        s->lost[c->node] = 1;
    }
    s->conns[c->node] = NULL;
    conn_free(c);
}

int out_reserve(rconn *c, size_t more)
{
    size_t need = c->olen + more;
    if (need > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 4096;
        char *p;
        while (cap < need)
            cap *= 2;
        if (!(p = realloc(c->out, cap)))
            return -ENOMEM;
        c->out = p;
        c->ocap = cap;
    }
    return 0;
}

static int out_append(rconn *c, const char *b, size_t n)
{
    if (out_reserve(c, n) != 0)
        return -ENOMEM;
    memcpy(c->out + c->olen, b, n);
    c->olen += n;
    return 0;
}

uint64_t left_ms(uint64_t deadline)
{
    uint64_t now = engram__now_ns();
    return now >= deadline ? 0 : (deadline - now + 999999) / 1000000;
}

/* Writes what the connection has to write without blocking: 0, or a
 * negative errno (the connection is broken). */
int conn_flush(rconn *c)
{
    while (c->ooff < c->olen) {
        ssize_t n = send(c->fd, c->out + c->ooff, c->olen - c->ooff, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -errno;
        }
        c->ooff += (size_t)n;
    }
    c->ooff = c->olen = 0;
    return 0;
}

/* Waits for one plain reply (hiredis objects) on c, writing what is
 * pending first.  0 and *reply, -ETIMEDOUT, -EIO / -errno (broken). */
int conn_reply(engram__rsess *s, rconn *c, uint64_t deadline, redisReply **reply)
{
    void *obj = NULL;
    int err;
    c->rd->fn = c->plain_fn;
    for (;;) {
        struct pollfd p = {c->fd, POLLIN, 0};
        ssize_t n;
        if (redisReaderGetReply(c->rd, &obj) != REDIS_OK)
            return -EIO;
        if (obj) {
            *reply = obj;
            return 0;
        }
        if ((err = conn_flush(c)) != 0)
            return err;
        if (c->ooff < c->olen)
            p.events |= POLLOUT;
        n = poll(&p, 1, (int)left_ms(deadline));
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n == 0)
            return -ETIMEDOUT;
        if (n < 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        n = recv(c->fd, s->rbuf, READ_BUF, 0);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            return -errno;
        }
        if (redisReaderFeed(c->rd, s->rbuf, (size_t)n) != REDIS_OK)
            return -EIO;
    }
}

/* Formats argv as a command and appends it to c's output. */
int conn_append_argv(rconn *c, int argc, const char **argv, const size_t *lens)
{
    char *cmd;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens), err;
    if (len < 0)
        return -ENOMEM;
    err = out_append(c, cmd, (size_t)len);
    redisFreeCommand(cmd);
    return err;
}

/* Runs one command on c and waits for its reply. */
int conn_call(engram__rsess *s, rconn *c, int argc, const char **argv, const size_t *lens,
              uint64_t deadline, redisReply **reply)
{
    int err = conn_append_argv(c, argc, argv, lens);
    return err ? err : conn_reply(s, c, deadline, reply);
}

/* Connects to node `id` (and authenticates).  0 and *out; on failure a
 * negative errno with the reason in s->last_msg: -EACCES (AUTH refused)
 * is final, anything else transient. */
static int conn_open(engram__rsess *s, uint32_t id, uint64_t deadline, rconn **out)
{
    engram__rcl *cl = s->cl;
    const rnode *nd = node_get(cl, id);
    struct addrinfo hints, *ai = NULL;
    char port[16];
    rconn *c = NULL;
    uint64_t cdl = engram__now_ns() + cl->connect_ns;
    int err = 0, one = 1, gai;

    if (cdl > deadline)
        cdl = deadline;
    ctr(&cl->connects, 1);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port, sizeof port, "%d", nd->port);
    if ((gai = getaddrinfo(nd->host, port, &hints, &ai)) != 0) {
        snprintf(s->last_msg, sizeof s->last_msg, "resolve %s: %s", nd->addr, gai_strerror(gai));
        err = -EHOSTUNREACH;
        goto fail;
    }
    if (!(c = calloc(1, sizeof *c))) {
        err = -ENOMEM;
        goto fail;
    }
    c->node = id;
    c->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        err = -errno;
        snprintf(s->last_msg, sizeof s->last_msg, "socket for %s: %s", nd->addr, strerror(errno));
        goto fail;
    }
    if (connect(c->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        struct pollfd p = {c->fd, POLLOUT, 0};
        socklen_t sl = sizeof err;
        int n;
        if (errno != EINPROGRESS) {
            err = -errno;
            goto connfail;
        }
        do
            n = poll(&p, 1, (int)left_ms(cdl));
        while (n < 0 && errno == EINTR);
        if (n == 0) {
            err = -ETIMEDOUT;
            goto connfail;
        }
        if (n < 0 || getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0) {
            err = -errno;
            goto connfail;
        }
        if (err) {
            err = -err;
            goto connfail;
        }
    }
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!(c->rd = redisReaderCreate())) {
        err = -ENOMEM;
        goto fail;
    }
    c->plain_fn = c->rd->fn;
    c->rd->privdata = c;
    c->rd->maxbuf = 0; /* keep the reader's buffer: it is reused every batch */
    s->conns[id] = c;
    if (cl->password) {
        const char *argv[3] = {"AUTH", cl->user ? cl->user : cl->password, cl->password};
        redisReply *r = NULL;
        int argc = cl->user ? 3 : 2;
        if ((err = conn_call(s, c, argc, argv, NULL, cdl, &r)) != 0) {
            s->conns[id] = NULL;
            goto connfail;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            snprintf(s->last_msg, sizeof s->last_msg, "%s refused AUTH%s%s: %s", nd->addr,
                     cl->user ? " as user " : "", cl->user ? cl->user : "", r->str);
            freeReplyObject(r);
            s->conns[id] = NULL;
            err = -EACCES;
            goto fail;
        }
        freeReplyObject(r);
    }
    freeaddrinfo(ai);
    *out = c;
    return 0;
connfail:
    snprintf(s->last_msg, sizeof s->last_msg, "connect to %s: %s", nd->addr,
             err == -ETIMEDOUT ? "timed out" : strerror(-err));
fail:
    ctr(&cl->conn_errors, 1);
    if (ai)
        freeaddrinfo(ai);
    if (c)
        conn_free(c);
    if (err == -ENOMEM)
        snprintf(s->last_msg, sizeof s->last_msg, "out of memory for a connection to %s",
                 nd->addr);
    return err;
}

int conn_get(engram__rsess *s, uint32_t id, uint64_t deadline, rconn **out)
{
    if (s->conns[id]) {
        *out = s->conns[id];
        return 0;
    }
    return conn_open(s, id, deadline, out);
}

/* ------------------------------------------------------------------------
 * Sessions.
 */

void sess_free(engram__rsess *s)
{
    if (!s)
        return;
    if (s->conns)
        for (uint32_t i = 0; i < ENGRAM__RCL_MAX_NODES; i++)
            if (s->conns[i]) {
                s->conns[i]->dirty = 0;
                conn_close(s, s->conns[i]);
            }
    free(s->conns);
    free(s->act);
    free(s->pfd);
    free(s->order);
    free(s->cnt);
    free(s->gets);
    free(s->rbuf);
    free(s);
}

engram__rsess *sess_new(engram__rcl *cl)
{
    engram__rsess *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->cl = cl;
    s->conns = calloc(ENGRAM__RCL_MAX_NODES, sizeof *s->conns);
    s->act = calloc(ENGRAM__RCL_MAX_NODES, sizeof *s->act);
    s->pfd = calloc(ENGRAM__RCL_MAX_NODES, sizeof *s->pfd);
    s->cnt = calloc(ENGRAM__RCL_MAX_NODES + 1, sizeof *s->cnt);
    s->rbuf = malloc(READ_BUF);
    if (!s->conns || !s->act || !s->pfd || !s->cnt || !s->rbuf) {
        sess_free(s);
        return NULL;
    }
    return s;
}

/* In a child after fork(): the inherited connections are the parent's
 * conversations.  Close our copies of their descriptors (the parent's
 * stay open) and forget every session (cl->lock held). */
static void drop_inherited_locked(engram__rcl *cl)
{
    engram__rsess *s = cl->all, *next;
    for (; s; s = next) {
        next = s->all_next;
        sess_free(s);
    }
    cl->all = cl->free = NULL;
    sess_free(cl->ctl);
    cl->ctl = NULL;
    cl->pid = getpid();
}

int engram__rcl_sess_get(engram__rcl *cl, engram__rsess **out)
{
    engram__rsess *s;
    pthread_mutex_lock(&cl->lock);
    if (ENGRAM__UNLIKELY(cl->pid != getpid()))
        drop_inherited_locked(cl);
    if ((s = cl->free) != NULL) {
        cl->free = s->next;
    } else if ((s = sess_new(cl)) != NULL) {
        s->all_next = cl->all;
        cl->all = s;
    }
    pthread_mutex_unlock(&cl->lock);
    if (!s)
        return engram__err(-ENOMEM, "out of memory for a Redis session");
    s->lost_dirty = 0;
    *out = s;
    return 0;
}

void engram__rcl_sess_put(engram__rsess *s)
{
    engram__rcl *cl;
    if (!s)
        return;
    cl = s->cl;
    pthread_mutex_lock(&cl->lock);
    if (cl->pid == getpid()) {
        s->next = cl->free;
        cl->free = s;
    }
    pthread_mutex_unlock(&cl->lock);
}

engram__rcl_get *engram__rcl_gets(engram__rsess *s, size_t n)
{
    if (n > s->gets_cap) {
        engram__rcl_get *g = realloc(s->gets, n * sizeof *g);
        if (!g)
            return NULL;
        s->gets = g;
        s->gets_cap = n;
    }
    return s->gets;
}
