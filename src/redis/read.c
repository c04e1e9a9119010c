/*
 * read.c - the Redis Cluster client's read engine: batches of ranged
 * reads (GETRANGE) pipelined to every node at once, their replies parsed
 * by hiredis's reader with object functions that copy each range straight
 * into its destination, redirected and failed ranges retried in rounds
 * (see cluster.h, engram__rcl_read()).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common.h"
#include "cluster_int.h"

/* ------------------------------------------------------------------------
 * Batches of ranged reads.
 */

static void *fast_string(const redisReadTask *t, char *str, size_t len);
static void *fast_array(const redisReadTask *t, int n);
static void *fast_integer(const redisReadTask *t, long long v);
static void *fast_nil(const redisReadTask *t);
static void fast_free(void *obj);
static redisReplyObjectFunctions fast_fn = {fast_string, fast_array, fast_integer, fast_nil,
                                            fast_free};
static char fast_token; /* what the fast functions return: not NULL, never freed */

static void *fast_string(const redisReadTask *t, char *str, size_t len)
{
    rconn *c = t->privdata;
    if (t->parent)
        return &fast_token;
    if (t->type == REDIS_REPLY_STRING) {
        uint32_t e = c->exp[c->ehead];
        c->rkind = K_STRING;
        c->rlen = len;
        /* Only a reply of the exact length is a row: a missing key reads
         * as "", and nothing else is ever written to the destination. */
        if (e != ASK_MARK && len == c->g[e].len)
            memcpy(c->g[e].dst, str, len);
    } else {
        size_t n = len < sizeof c->rtext - 1 ? len : sizeof c->rtext - 1;
        c->rkind = t->type == REDIS_REPLY_ERROR ? K_ERROR : K_STATUS;
        memcpy(c->rtext, str, n);
        c->rtext[n] = '\0';
    }
    return &fast_token;
}

static void *fast_array(const redisReadTask *t, int n)
{
    (void)n;
    if (!t->parent)
        ((rconn *)t->privdata)->rkind = K_ARRAY;
    return &fast_token;
}

static void *fast_integer(const redisReadTask *t, long long v)
{
    (void)v;
    if (!t->parent)
        ((rconn *)t->privdata)->rkind = K_INTEGER;
    return &fast_token;
}

static void *fast_nil(const redisReadTask *t)
{
    if (!t->parent)
        ((rconn *)t->privdata)->rkind = K_NIL;
    return &fast_token;
}

static void fast_free(void *obj)
{
    (void)obj;
}

static void key_text(const engram__rcl_get *g, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.*s%" PRIu64, (int)g->kpre_len, g->kpre, g->ksuf);
}

/* Records the batch's first final failure (its code and message). */
__attribute__((format(printf, 3, 4))) static void final_fail(engram__rsess *s, int code,
                                                             const char *fmt, ...)
{
    va_list ap;
    if (s->final_code)
        return;
    s->final_code = code;
    va_start(ap, fmt);
    vsnprintf(s->final_msg, sizeof s->final_msg, fmt, ap);
    va_end(ap);
}

/* The reply just parsed on c answers its next expected request. */
static void on_reply(engram__rsess *s, rconn *c)
{
    engram__rcl *cl = s->cl;
    uint32_t e = c->exp[c->ehead++];
    engram__rcl_get *g;
    char key[600];
    if (e == ASK_MARK)
        return; /* ASKING's +OK (an error shows on the command after it) */
    g = &c->g[e];
    switch (c->rkind) {
    case K_STRING:
        if (c->rlen == g->len) {
            g->state = ENGRAM__RCL_DONE;
        } else if (c->rlen > g->len) { /* asked for one byte past a whole string's end */
            key_text(g, key, sizeof key);
            final_fail(s, -ENODATA, "key '%s' on %s is longer than the %" PRIu64 " bytes it "
                                    "should hold",
                       key, node_get(cl, c->node)->addr, g->start + g->len);
        } else {
            key_text(g, key, sizeof key);
            final_fail(s, -ENODATA,
                       "key '%s' on %s holds %zu of the %u bytes at %" PRIu64
                       " (an empty string: the key is missing; the node lost its data, or the "
                       "table was removed)",
                       key, node_get(cl, c->node)->addr, c->rlen, g->len, g->start);
        }
        return;
    case K_ERROR:
        if (strncmp(c->rtext, "MOVED ", 6) == 0 || strncmp(c->rtext, "ASK ", 4) == 0) {
            unsigned rs = g->slot;
            int is_ask = c->rtext[0] == 'A';
            uint32_t to = redirect_node(cl, c->rtext, &rs);
            if (to == ENGRAM__RCL_NONE) {
                final_fail(s, -EIO, "%s: a redirection to a bad address: %s",
                           node_get(cl, c->node)->addr, c->rtext);
                return;
            }
            ctr(is_ask ? &cl->ask : &cl->moved, 1);
            if (is_ask) {
                g->ask = (uint16_t)to;
                g->why = W_ASK;
            } else {
                if (rs < ENGRAM__RCL_SLOTS)
                    atomic_store_explicit(&cl->slot_node[rs], (uint16_t)to,
                                          memory_order_relaxed);
                g->why = W_MOVED;
            }
            return;
        }
        if (transient_error(c->rtext)) {
            g->why = W_BUSY;
            snprintf(s->last_msg, sizeof s->last_msg, "%s: %s", node_get(cl, c->node)->addr,
                     c->rtext);
            return;
        }
        key_text(g, key, sizeof key);
        final_fail(s, denied(c->rtext) ? -EACCES : -EIO,
                   "GETRANGE '%s' on %s: %s", key, node_get(cl, c->node)->addr, c->rtext);
        return;
    default:
        key_text(g, key, sizeof key);
        final_fail(s, -EIO, "GETRANGE '%s' on %s: an unexpected reply (type %d)", key,
                   node_get(cl, c->node)->addr, c->rkind);
        return;
    }
}

/* Marks c broken: the requests it has not answered are retried. */
static void conn_broke(engram__rsess *s, rconn *c, int err)
{
    engram__rcl *cl = s->cl;
    if (c->failed)
        return;
    c->failed = 1;
    c->err = err;
    ctr(&cl->conn_errors, 1);
    for (size_t i = c->ehead; i < c->nexp; i++)
        if (c->exp[i] != ASK_MARK)
            c->g[c->exp[i]].why = W_CONN;
    c->ehead = c->nexp;
    snprintf(s->last_msg, sizeof s->last_msg, "%s: %s", node_get(cl, c->node)->addr,
             err == -ETIMEDOUT ? "no reply in time"
             : err == -EIO     ? "protocol error"
             : err == -ECONNRESET ? "connection closed"
                                  : strerror(-err));
}

/* Reads what arrived on c and handles every complete reply. */
static void conn_read(engram__rsess *s, rconn *c)
{
    ssize_t n = recv(c->fd, s->rbuf, READ_BUF, 0);
    if (n == 0) {
        conn_broke(s, c, -ECONNRESET);
        return;
    }
    if (n < 0) {
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
            conn_broke(s, c, -errno);
        return;
    }
    for (size_t off = 0; off < (size_t)n; off += FEED_SLICE) {
        size_t len = (size_t)n - off < FEED_SLICE ? (size_t)n - off : FEED_SLICE;
        void *obj;
        if (redisReaderFeed(c->rd, s->rbuf + off, len) != REDIS_OK) {
            conn_broke(s, c, -EIO);
            return;
        }
        for (;;) {
            obj = NULL;
            if (redisReaderGetReply(c->rd, &obj) != REDIS_OK) {
                conn_broke(s, c, -EIO);
                return;
            }
            if (!obj)
                break;
            if (c->ehead >= c->nexp) {
                /* A reply nobody asked for: the stream is out of step. */
                conn_broke(s, c, -EIO);
                return;
            }
            on_reply(s, c);
        }
    }
}

static int exp_push(rconn *c, uint32_t v)
{
    if (c->nexp == c->expcap) {
        size_t cap = c->expcap ? c->expcap * 2 : 1024;
        uint32_t *p = realloc(c->exp, cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        c->exp = p;
        c->expcap = cap;
    }
    c->exp[c->nexp++] = v;
    return 0;
}

/* Decimal digits of v into b (no terminator); returns how many. */
static size_t u64_dec(uint64_t v, char *b)
{
    char t[20];
    size_t n = 0;
    do
        t[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    for (size_t i = 0; i < n; i++)
        b[i] = t[n - 1 - i];
    return n;
}

/* Appends "GETRANGE key start end" (and ASKING before it) to c. */
static int encode_get(rconn *c, const engram__rcl_get *g, uint32_t idx)
{
    static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
    char num[3][24];
    size_t nl[3], klen, need;
    char *p;
    nl[0] = u64_dec(g->ksuf, num[0]);
    nl[1] = u64_dec(g->start, num[1]);
    nl[2] = u64_dec(g->start + g->len - 1 + (g->whole ? 1 : 0), num[2]);
    klen = g->kpre_len + nl[0];
    need = sizeof asking + 40 + klen + nl[1] + nl[2] + 3 * 24;
    if (out_reserve(c, need) != 0)
        return -ENOMEM;
    if (g->ask != ENGRAM__RCL_NONE) {
        if (exp_push(c, ASK_MARK) != 0)
            return -ENOMEM;
        memcpy(c->out + c->olen, asking, sizeof asking - 1);
        c->olen += sizeof asking - 1;
    }
    if (exp_push(c, idx) != 0)
        return -ENOMEM;
    p = c->out + c->olen;
    memcpy(p, "*4\r\n$8\r\nGETRANGE\r\n$", 19);
    p += 19;
    {
        char kl[24];
        size_t n = u64_dec(klen, kl);
        memcpy(p, kl, n);
        p += n;
    }
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, g->kpre, g->kpre_len);
    p += g->kpre_len;
    memcpy(p, num[0], nl[0]);
    p += nl[0];
    for (int i = 1; i < 3; i++) {
        char ln[4];
        size_t n = u64_dec(nl[i], ln);
        memcpy(p, "\r\n$", 3);
        p += 3;
        memcpy(p, ln, n);
        p += n;
        *p++ = '\r';
        *p++ = '\n';
        memcpy(p, num[i], nl[i]);
        p += nl[i];
    }
    *p++ = '\r';
    *p++ = '\n';
    c->olen = (size_t)(p - c->out);
    return 0;
}

/* One round: every range not done yet goes to its node, all nodes at
 * once; returns when every connection answered all, broke, or the
 * deadline passed.  *need_map: a range found no node or a connection
 * failed (reload the map); *busy: a range failed for a passing reason
 * (a busy node, a connection, no node for its slot: back off). */
static int read_round(engram__rsess *s, engram__rcl_get *g, size_t n, uint64_t deadline,
                      int *need_map, int *busy)
{
    engram__rcl *cl = s->cl;
    uint32_t nn = atomic_load_explicit(&cl->nnodes, memory_order_acquire), na = 0;
    int err;

    if (n > s->order_cap) {
        uint32_t *o = realloc(s->order, n * sizeof *o);
        if (!o)
            return engram__err(-ENOMEM, "out of memory for a batch of %zu reads", n);
        s->order = o;
        s->order_cap = n;
    }
    /* Group the pending ranges by node (counting sort).  Each range's
     * node is read from the map once: a reload by another thread between
     * the two passes must not move a range to a node it was not counted
     * for. */
    memset(s->cnt, 0, (nn + 1) * sizeof *s->cnt);
    for (size_t i = 0; i < n; i++) {
        uint32_t node;
        if (g[i].state == ENGRAM__RCL_DONE)
            continue;
        node = g[i].ask != ENGRAM__RCL_NONE ? g[i].ask : slot_owner(cl, g[i].slot);
        g[i].node = (uint16_t)node;
        g[i].why = W_NONE;
        if (node == ENGRAM__RCL_NONE || node >= nn) {
            g[i].why = W_NOSLOT;
            snprintf(s->last_msg, sizeof s->last_msg, "no node serves slot %u",
                     (unsigned)g[i].slot);
            *need_map = 1;
            continue;
        }
        s->cnt[node + 1]++;
    }
    for (uint32_t k = 0; k < nn; k++)
        s->cnt[k + 1] += s->cnt[k];
    for (size_t i = 0; i < n; i++)
        if (g[i].state != ENGRAM__RCL_DONE && g[i].why != W_NOSLOT)
            s->order[s->cnt[g[i].node]++] = (uint32_t)i;
    /* s->cnt[k] is now the end of node k's ranges. */
    for (uint32_t k = 0, start = 0; k < nn; start = s->cnt[k], k++) {
        rconn *c;
        if (s->cnt[k] == start)
            continue;
        if ((err = conn_get(s, k, deadline, &c)) != 0) {
            for (uint32_t j = start; j < s->cnt[k]; j++)
                g[s->order[j]].why = W_CONN;
            if (err == -EACCES || err == -ENOMEM)
                final_fail(s, err, "%s", s->last_msg);
            *need_map = 1;
            continue;
        }
        c->g = g;
        c->nexp = c->ehead = 0;
        c->failed = 0;
        c->rd->fn = &fast_fn;
        for (uint32_t j = start; j < s->cnt[k]; j++) {
            engram__rcl_get *q = &g[s->order[j]];
            if (encode_get(c, q, s->order[j]) != 0) {
                final_fail(s, -ENOMEM, "out of memory for a batch of %zu reads", n);
                return s->final_code;
            }
            q->ask = ENGRAM__RCL_NONE;
        }
        ctr(&cl->batches, 1);
        ctr(&cl->gets, s->cnt[k] - start);
        s->act[na++] = c;
    }
    /* Every connection writes what it can now, then poll until all
     * replies are in. */
    for (uint32_t i = 0; i < na; i++)
        if ((err = conn_flush(s->act[i])) != 0)
            conn_broke(s, s->act[i], err);
    for (;;) {
        uint32_t np = 0;
        uint64_t ms;
        int r;
        for (uint32_t i = 0; i < na; i++) {
            rconn *c = s->act[i];
            if (c->failed || c->ehead == c->nexp)
                continue;
            s->pfd[np].fd = c->fd;
            s->pfd[np].events = (short)(POLLIN | (c->ooff < c->olen ? POLLOUT : 0));
            s->pfd[np].revents = 0;
            np++;
        }
        if (np == 0)
            break;
        if ((ms = left_ms(deadline)) == 0) {
            for (uint32_t i = 0; i < na; i++)
                if (!s->act[i]->failed && s->act[i]->ehead < s->act[i]->nexp)
                    conn_broke(s, s->act[i], -ETIMEDOUT);
            break;
        }
        r = poll(s->pfd, np, ms > 1000 ? 1000 : (int)ms);
        if (r < 0 && errno != EINTR)
            return engram__errno(errno, "poll");
        if (r <= 0)
            continue;
        for (uint32_t i = 0, p = 0; i < na && p < np; i++) {
            rconn *c = s->act[i];
            short re;
            if (c->failed || c->ehead == c->nexp)
                continue;
            re = s->pfd[p++].revents;
            if ((re & POLLOUT) && (err = conn_flush(c)) != 0) {
                conn_broke(s, c, err);
                continue;
            }
            if (re & (POLLIN | POLLHUP | POLLERR))
                conn_read(s, c);
        }
    }
    for (uint32_t i = 0; i < na; i++) {
        rconn *c = s->act[i];
        c->g = NULL;
        if (c->failed) {
            *need_map = 1;
            conn_close(s, c);
        }
    }
    for (size_t i = 0; i < n; i++)
        if (g[i].state != ENGRAM__RCL_DONE && (g[i].why == W_BUSY || g[i].why == W_CONN ||
                                               g[i].why == W_NOSLOT))
            *busy = 1;
    return 0;
}

int engram__rcl_read(engram__rsess *s, engram__rcl_get *g, size_t n, uint64_t deadline)
{
    engram__rcl *cl = s->cl;
    unsigned waits = 0;
    int err;

    s->final_code = 0;
    snprintf(s->last_msg, sizeof s->last_msg, "no attempt");
    for (size_t i = 0; i < n; i++) {
        g[i].state = 0;
        g[i].ask = ENGRAM__RCL_NONE;
    }
    for (unsigned round = 0;; round++) {
        uint64_t seen = map_version(cl);
        int need_map = 0, busy = 0;
        size_t left = 0, moved = 0;
        if ((err = read_round(s, g, n, deadline, &need_map, &busy)) != 0)
            return err;
        if (s->final_code)
            return engram__err(s->final_code, "%s", s->final_msg);
        for (size_t i = 0; i < n; i++) {
            if (g[i].state == ENGRAM__RCL_DONE)
                continue;
            left++;
            moved += g[i].why == W_MOVED;
        }
        if (left == 0)
            return 0;
        if (engram__now_ns() >= deadline) {
            size_t i = 0;
            char key[600];
            while (g[i].state == ENGRAM__RCL_DONE)
                i++;
            key_text(&g[i], key, sizeof key);
            ctr(&cl->timeouts, 1);
            return engram__err(-ETIMEDOUT,
                               "%zu of %zu reads (the first: key '%s') not done when the "
                               "deadline passed, after %u rounds: %s",
                               left, n, key, round + 1, s->last_msg);
        }
        if (busy) {
            ctr(&cl->retries, 1);
            backoff(waits++, deadline);
        } else if (round >= 8) {
            /* Redirected again and again: a slot in motion. */
            backoff(waits++, deadline);
        }
        if ((need_map || moved) && (err = refresh(cl, seen, deadline)) != 0)
            map_failed(s);
    }
}
