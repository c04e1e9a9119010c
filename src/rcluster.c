/*
 * rcluster.c - a Redis Cluster client: routing, connections, commands and
 * pipelined ranged reads (see rcluster.h for what it does and why).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "rcluster.h"

#define READ_BUF (64u << 10) /* bytes read from a socket at once */
/* Bytes handed to hiredis's reader at once.  It keeps unparsed bytes in
 * one buffer and moves what is left to its front every time a parse has
 * consumed 1 KiB, so feeding it a large read costs a copy per reply of
 * the rest of the read; small slices keep that copy short. */
#define FEED_SLICE 4096u
#define BACKOFF_MIN_NS 1000000u    /* 1 ms */
#define BACKOFF_MAX_NS 100000000u  /* 100 ms */
#define ASK_MARK UINT32_MAX        /* an expected reply that answers ASKING */

typedef struct rnode {
    char host[256];
    char addr[272]; /* host:port, for messages and MOVED matching */
    int port;
    _Atomic int replicas; /* as the last map said: what WAIT waits for */
} rnode;

/* Why a range of a batch is not done (rcl_get.why). */
enum { W_NONE, W_MOVED, W_ASK, W_BUSY, W_CONN, W_NOSLOT };

/* What the last reply parsed on a connection was (fast functions). */
enum { K_NONE, K_STRING, K_ERROR, K_STATUS, K_INTEGER, K_NIL, K_ARRAY };

typedef struct rconn {
    int fd;
    uint32_t node;
    redisReader *rd;
    redisReplyObjectFunctions *plain_fn; /* hiredis's own: redisReply objects */
    char *out;
    size_t olen, ocap, ooff;
    uint32_t *exp; /* batch: the range each reply answers, or ASK_MARK */
    size_t nexp, expcap, ehead;
    int dirty;     /* wrote since the last sync */
    int failed;    /* the connection broke: closed at the end of the batch */
    int err;       /* why it failed */
    /* The last reply, as the fast functions saw it. */
    int rkind;
    size_t rlen;
    char rtext[200];
    engram__rcl_get *g; /* the batch's ranges */
} rconn;

struct engram__rsess {
    engram__rcl *cl;
    struct engram__rsess *next;     /* free list */
    struct engram__rsess *all_next; /* every session, for destroy */
    rconn **conns;                  /* [ENGRAM__RCL_MAX_NODES] */
    rconn **act;                    /* connections of the current batch */
    struct pollfd *pfd;
    uint32_t *order, *cnt;          /* ranges grouped by node */
    size_t order_cap;
    engram__rcl_get *gets;
    size_t gets_cap;
    char *rbuf;
    int lost_dirty;                 /* a connection with unsynced writes broke ... */
    uint8_t lost[ENGRAM__RCL_MAX_NODES]; /* ... to these nodes (while lost_dirty) */
    /* The batch's failures: the first final one, the last transient one. */
    int final_code;
    char final_msg[1200];
    char last_msg[700];
};

struct engram__rcl {
    pthread_mutex_t lock;         /* nodes, sessions */
    pthread_mutex_t refresh_lock; /* one map reload at a time (and ctl) */
    rnode *nodes[ENGRAM__RCL_MAX_NODES];
    _Atomic uint32_t nnodes;
    uint32_t nseeds;
    _Atomic uint16_t slot_node[ENGRAM__RCL_SLOTS];
    _Atomic uint64_t map_version;
    uint16_t fresh[ENGRAM__RCL_SLOTS]; /* the map being loaded (refresh_lock) */
    _Atomic uint32_t next_probe;  /* the node a reload asks first */
    engram__rsess *free, *all;
    engram__rsess *ctl;           /* the reloads' session (refresh_lock) */
    pid_t pid;                    /* the process the sessions belong to */
    char *user, *password, *seeds;
    uint64_t timeout_ns, connect_ns;
    /* Counters (engram_redis_stats). */
    _Atomic uint64_t batches, gets, commands, moved, ask, retries, connects, conn_errors,
        refreshes, timeouts;
};

static void ctr(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* ------------------------------------------------------------------------
 * Slots.
 */

static uint16_t crc16_table[256];
static pthread_once_t crc16_once = PTHREAD_ONCE_INIT;

static void crc16_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint16_t c = (uint16_t)(i << 8);
        for (int b = 0; b < 8; b++)
            c = (uint16_t)(c & 0x8000 ? (c << 1) ^ 0x1021 : c << 1);
        crc16_table[i] = c;
    }
}

uint16_t engram__rcl_crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    pthread_once(&crc16_once, crc16_init);
    for (size_t i = 0; i < len; i++)
        crc = (uint16_t)((crc << 8) ^ crc16_table[((crc >> 8) ^ (unsigned char)buf[i]) & 0xff]);
    return crc;
}

uint16_t engram__rcl_keyslot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len), *close;
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return engram__rcl_crc16(open + 1, (size_t)(close - open - 1)) & 16383;
    }
    return engram__rcl_crc16(key, len) & 16383;
}

/* ------------------------------------------------------------------------
 * Nodes.
 */

/* Splits "host:port" (IPv6 in brackets, or bare with the port after the
 * last ':').  0 or -EINVAL. */
static int parse_addr(const char *s, size_t n, char *host, size_t hcap, int *port)
{
    const char *colon = NULL, *h = s;
    size_t hl;
    long p = 0;
    for (size_t i = n; i-- > 0;)
        if (s[i] == ':') {
            colon = s + i;
            break;
        }
    if (!colon || colon == s || (size_t)(colon - s) + 1 >= n)
        return -EINVAL;
    hl = (size_t)(colon - s);
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= hcap)
        return -EINVAL;
    for (const char *c = colon + 1; c < s + n; c++) {
        if (*c < '0' || *c > '9' || (p = p * 10 + (*c - '0')) > 65535)
            return -EINVAL;
    }
    if (p == 0)
        return -EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

/* The index of node host:port, added if new.  ENGRAM__RCL_NONE when the
 * table is full or out of memory. */
static uint32_t node_intern(engram__rcl *cl, const char *host, int port)
{
    uint32_t n, id = ENGRAM__RCL_NONE;
    rnode *nd;
    pthread_mutex_lock(&cl->lock);
    n = atomic_load_explicit(&cl->nnodes, memory_order_relaxed);
    for (uint32_t i = 0; i < n; i++)
        if (cl->nodes[i]->port == port && strcmp(cl->nodes[i]->host, host) == 0) {
            id = i;
            goto out;
        }
    if (n < ENGRAM__RCL_MAX_NODES && (nd = calloc(1, sizeof *nd)) != NULL) {
        snprintf(nd->host, sizeof nd->host, "%s", host);
        snprintf(nd->addr, sizeof nd->addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
        nd->port = port;
        cl->nodes[n] = nd;
        id = n;
        /* Release: a reader that sees the count sees the node. */
        atomic_store_explicit(&cl->nnodes, n + 1, memory_order_release);
    }
out:
    pthread_mutex_unlock(&cl->lock);
    return id;
}

static const rnode *node_get(engram__rcl *cl, uint32_t id)
{
    /* Nodes below the count are complete (release store in intern);
     * callers hold ids they got from intern or the map, both below it. */
    (void)atomic_load_explicit(&cl->nnodes, memory_order_acquire);
    return cl->nodes[id];
}

/* The node of a "MOVED <slot> <host:port>" or "ASK ..." error. */
static uint32_t redirect_node(engram__rcl *cl, const char *text, unsigned *slot)
{
    char host[256];
    const char *sp = strchr(text, ' '), *sp2;
    int port;
    if (!sp || !(sp2 = strchr(sp + 1, ' ')))
        return ENGRAM__RCL_NONE;
    *slot = (unsigned)strtoul(sp + 1, NULL, 10);
    if (parse_addr(sp2 + 1, strlen(sp2 + 1), host, sizeof host, &port) != 0)
        return ENGRAM__RCL_NONE;
    return node_intern(cl, host, port);
}

/* ------------------------------------------------------------------------
 * Connections.
 */

static void *fast_string(const redisReadTask *t, char *str, size_t len);
static void *fast_array(const redisReadTask *t, int n);
static void *fast_integer(const redisReadTask *t, long long v);
static void *fast_nil(const redisReadTask *t);
static void fast_free(void *obj);
static redisReplyObjectFunctions fast_fn = {fast_string, fast_array, fast_integer, fast_nil,
                                            fast_free};
static char fast_token; /* what the fast functions return: not NULL, never freed */

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

static void conn_close(engram__rsess *s, rconn *c)
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

static int out_reserve(rconn *c, size_t more)
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

static uint64_t left_ms(uint64_t deadline)
{
    uint64_t now = engram__now_ns();
    return now >= deadline ? 0 : (deadline - now + 999999) / 1000000;
}

/* Writes what the connection has to write without blocking: 0, or a
 * negative errno (the connection is broken). */
static int conn_flush(rconn *c)
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
static int conn_reply(engram__rsess *s, rconn *c, uint64_t deadline, redisReply **reply)
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
static int conn_append_argv(rconn *c, int argc, const char **argv, const size_t *lens)
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
static int conn_call(engram__rsess *s, rconn *c, int argc, const char **argv, const size_t *lens,
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

static int conn_get(engram__rsess *s, uint32_t id, uint64_t deadline, rconn **out)
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

static void sess_free(engram__rsess *s)
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

static engram__rsess *sess_new(engram__rcl *cl)
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

/* ------------------------------------------------------------------------
 * The slot map.
 */

/* Whether an error reply says the connection's user may not. */
static int denied(const char *text)
{
    return strncmp(text, "NOAUTH", 6) == 0 || strncmp(text, "WRONGPASS", 9) == 0 ||
           strncmp(text, "NOPERM", 6) == 0;
}

/* Whether an error reply names a passing condition of the cluster. */
static int transient_error(const char *text)
{
    static const char *const pass[] = {"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN",
                                       "BUSY"};
    for (size_t i = 0; i < sizeof pass / sizeof *pass; i++) {
        size_t n = strlen(pass[i]);
        if (strncmp(text, pass[i], n) == 0 && (text[n] == ' ' || text[n] == '\0'))
            return 1;
    }
    return 0;
}

/* Loads the slot map from the first node that answers CLUSTER SLOTS,
 * unless it changed since `seen` (another thread reloaded it).  0, or a
 * negative code with the reason in the thread's message. */
static int refresh(engram__rcl *cl, uint64_t seen, uint64_t deadline)
{
    uint16_t *fresh = cl->fresh;
    char last[700] = "no node to ask";
    int err = -EHOSTUNREACH;
    uint32_t n, first;

    pthread_mutex_lock(&cl->refresh_lock);
    if (atomic_load_explicit(&cl->map_version, memory_order_acquire) != seen) {
        pthread_mutex_unlock(&cl->refresh_lock);
        return 0;
    }
    if (!cl->ctl) {
        pthread_mutex_lock(&cl->lock);
        cl->ctl = sess_new(cl);
        pthread_mutex_unlock(&cl->lock);
        if (!cl->ctl) {
            pthread_mutex_unlock(&cl->refresh_lock);
            return engram__err(-ENOMEM, "out of memory for a Redis session");
        }
    }
    ctr(&cl->refreshes, 1);
    n = atomic_load_explicit(&cl->nnodes, memory_order_acquire);
    first = atomic_fetch_add_explicit(&cl->next_probe, 1, memory_order_relaxed);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id = (first + k) % n;
        const rnode *nd = node_get(cl, id);
        const char *argv[2] = {"CLUSTER", "SLOTS"};
        redisReply *r = NULL;
        rconn *c;
        int e;
        if ((e = conn_get(cl->ctl, id, deadline, &c)) != 0) {
            snprintf(last, sizeof last, "%s", cl->ctl->last_msg);
            err = e;
            if (e == -EACCES || e == -ENOMEM)
                break;
            continue;
        }
        if ((e = conn_call(cl->ctl, c, 2, argv, NULL, deadline, &r)) != 0) {
            snprintf(last, sizeof last, "CLUSTER SLOTS on %s: %s", nd->addr,
                     e == -ETIMEDOUT ? "timed out" : strerror(-e));
            conn_close(cl->ctl, c);
            err = e;
            continue;
        }
        if (r->type != REDIS_REPLY_ARRAY) {
            snprintf(last, sizeof last, "CLUSTER SLOTS on %s: %s", nd->addr,
                     r->type == REDIS_REPLY_ERROR ? r->str : "not an array");
            err = r->type == REDIS_REPLY_ERROR && denied(r->str) ? -EACCES : -EIO;
            freeReplyObject(r);
            if (err == -EACCES)
                break;
            continue;
        }
        for (uint32_t i = 0; i < ENGRAM__RCL_SLOTS; i++)
            fresh[i] = ENGRAM__RCL_NONE;
        for (size_t i = 0; i < r->elements; i++) {
            const redisReply *e0 = r->element[i], *m;
            char host[256];
            long long lo, hi;
            uint32_t mid;
            if (e0->type != REDIS_REPLY_ARRAY || e0->elements < 3 ||
                e0->element[0]->type != REDIS_REPLY_INTEGER ||
                e0->element[1]->type != REDIS_REPLY_INTEGER)
                continue;
            lo = e0->element[0]->integer;
            hi = e0->element[1]->integer;
            m = e0->element[2];
            if (lo < 0 || hi >= ENGRAM__RCL_SLOTS || lo > hi || m->type != REDIS_REPLY_ARRAY ||
                m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
                m->element[1]->type != REDIS_REPLY_INTEGER || m->element[1]->integer <= 0 ||
                m->element[1]->integer > 65535)
                continue;
            /* An empty or '?' address: the node we asked does not know
             * it; use the address we reached that node at. */
            snprintf(host, sizeof host, "%s",
                     m->element[0]->len == 0 || strcmp(m->element[0]->str, "?") == 0
                         ? nd->host
                         : m->element[0]->str);
            if ((mid = node_intern(cl, host, (int)m->element[1]->integer)) == ENGRAM__RCL_NONE)
                continue;
            atomic_store_explicit(&cl->nodes[mid]->replicas, (int)e0->elements - 3,
                                  memory_order_relaxed);
            for (long long sl = lo; sl <= hi; sl++)
                fresh[sl] = (uint16_t)mid;
        }
        freeReplyObject(r);
        for (uint32_t i = 0; i < ENGRAM__RCL_SLOTS; i++)
            atomic_store_explicit(&cl->slot_node[i], fresh[i], memory_order_relaxed);
        /* Release: a thread that sees the new version sees the new map. */
        atomic_fetch_add_explicit(&cl->map_version, 1, memory_order_release);
        pthread_mutex_unlock(&cl->refresh_lock);
        return 0;
    }
    pthread_mutex_unlock(&cl->refresh_lock);
    return engram__err(err, "no node of %s gave its slot map: %s", cl->seeds, last);
}

static uint64_t map_version(engram__rcl *cl)
{
    return atomic_load_explicit(&cl->map_version, memory_order_acquire);
}

static uint32_t slot_owner(engram__rcl *cl, unsigned slot)
{
    return atomic_load_explicit(&cl->slot_node[slot], memory_order_relaxed);
}

/* After a failed reload of the slot map (its message in engram_errmsg()):
 * adds it to the failure that made it needed, which stays first in
 * s->last_msg, so that the final message names the command or read
 * that failed and not only the reload. */
static void map_failed(engram__rsess *s)
{
    static const char sep[] = "; and reloading the slot map failed: ";
    char tmp[sizeof s->last_msg], *prev;
    /* A failure kept from an earlier round loses its older reload. */
    if ((prev = strstr(s->last_msg, sep)) != NULL)
        *prev = '\0';
    /* Truncation is fine: the failure comes first. */
    if (snprintf(tmp, sizeof tmp, "%s%s%s", s->last_msg, sep, engram_errmsg()) < 0)
        return;
    memcpy(s->last_msg, tmp, sizeof tmp);
}

/* Sleeps the backoff of retry `attempt` (1 ms doubling to 100 ms), not
 * past the deadline. */
static void backoff(unsigned attempt, uint64_t deadline)
{
    uint64_t ns = BACKOFF_MIN_NS, now = engram__now_ns();
    struct timespec ts;
    for (unsigned i = 0; i < attempt && ns < BACKOFF_MAX_NS; i++)
        ns *= 2;
    if (ns > BACKOFF_MAX_NS)
        ns = BACKOFF_MAX_NS;
    if (now >= deadline)
        return;
    if (ns > deadline - now)
        ns = deadline - now;
    ts.tv_sec = (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

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
     * its SET, the publication script after a publication (it writes its
     * manifest again if it finds it).  Only a node with no later write
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

/* ------------------------------------------------------------------------
 * Batches of ranged reads.
 */

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
