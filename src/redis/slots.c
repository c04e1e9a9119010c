/*
 * slots.c - the Redis Cluster client's routing: CRC16 key slots, the
 * nodes it knows, redirections, the slot map and its reloads, and the
 * retry policy (see cluster.h for what the client does and why).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "cluster_int.h"

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
int parse_addr(const char *s, size_t n, char *host, size_t hcap, int *port)
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
uint32_t node_intern(engram__rcl *cl, const char *host, int port)
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

/* The node of a "MOVED <slot> <host:port>" or "ASK ..." error. */
uint32_t redirect_node(engram__rcl *cl, const char *text, unsigned *slot)
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
 * The slot map.
 */

/* Whether an error reply says the connection's user may not. */
int denied(const char *text)
{
    return strncmp(text, "NOAUTH", 6) == 0 || strncmp(text, "WRONGPASS", 9) == 0 ||
           strncmp(text, "NOPERM", 6) == 0;
}

/* Whether an error reply names a passing condition of the cluster. */
int transient_error(const char *text)
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
int refresh(engram__rcl *cl, uint64_t seen, uint64_t deadline)
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

/* After a failed reload of the slot map (its message in engram_errmsg()):
 * adds it to the failure that made it needed, which stays first in
 * s->last_msg, so that the final message names the command or read
 * that failed and not only the reload. */
void map_failed(engram__rsess *s)
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
void backoff(unsigned attempt, uint64_t deadline)
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
