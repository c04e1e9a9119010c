/*
 * bench_redis.c - lookups of tables kept in a Redis Cluster
 * (engram_store_open_redis) against a bare pipelined hiredis client
 * reading the same rows, in one run.
 *
 *   bench_redis [--mib N] [--tables N] [--k K] [--lookups N] [--reps N]
 *               [--threads LIST] [--dist uniform,zipf] [--zipf S]
 *               [--cache-pct P] [--chunk-kib N] [--layout spread|tagged]
 *               [--masters N] [--nodes HOST:PORT,...] [--quick]
 *
 * Unless --nodes names a cluster, it starts its own: --masters (3)
 * redis-server processes with no replicas on free loopback ports of
 * 127.0.0.1 (stopped by PID at exit), since a loopback benchmark on a
 * small machine only measures replicas eating the cores.  It pushes --mib
 * MiB (1024) of 264-byte rows as --tables tables (1) of namespace
 * "bench" with engram_populate() (timed: the push rate is printed), in
 * chunk keys of --chunk-kib KiB (1024), spread over the cluster or, with
 * --layout tagged, each table's chunks in one slot.  Then each lookup
 * asks for K ids (4096) as K / tables tokens of one id per table, drawn
 * uniformly or Zipf(S)-distributed (S = 1.0; ranks scattered over the
 * rows by a fixed permutation, so hot rows are not neighbours), from
 * each of --threads threads (1,2) at once:
 *
 *   bare-naive    a hiredis client as a first try would write it: per
 *                 node a connection of each thread, every id's GETRANGE
 *                 appended to its node's connection (redisAppendCommandArgv,
 *                 offsets formatted with snprintf), all nodes' commands
 *                 written, then the replies read node by node with
 *                 blocking calls (redisGetReply, a reply object per row)
 *                 and copied to the output.
 *   bare          a client as a careful user would write it: per node a
 *                 non-blocking socket of each thread, the commands built
 *                 from per-chunk heads formatted once and a digit-pair
 *                 integer formatter, all nodes written and read at once
 *                 in one poll() loop, each "$264\r\n<row>\r\n" reply
 *                 parsed straight into its output row (no allocation, no
 *                 reply object).  Neither bare client handles the
 *                 cluster (a map read once), deduplicates or validates:
 *                 they are the floor of a client.
 *   engram        engram_lookup() on a store of the namespace with no
 *                 row cache.
 *   engram+cache  the same with a row cache of --cache-pct percent (5)
 *                 of the rows, warm: before each distribution's runs,
 *                 lookups of its ids (not counted) until the cache's
 *                 misses reach 6 times its slots, so that it has turned
 *                 over and its admission filter has seen the rows come
 *                 back.  Every repetition draws new ids, so its hit rate
 *                 is the distribution's, not that of ids seen before.
 *   keep-all      the same cache with ENGRAM_OPEN_CACHE_KEEP_ALL (every
 *                 row read kept, CLOCK alone), same budget, warmed
 *                 alike: what the admission filter is worth.
 *
 * Each figure is the median of --reps repetitions (5) of --lookups
 * lookups per thread (100), printed with the minimum and maximum; the
 * configurations' repetitions are interleaved, so a noisy neighbour slows
 * them alike, and each repetition starts one configuration further on, so
 * none always runs first.  The load average is printed at the start, with
 * each result and at the end.  Beside each figure: the client's CPU time
 * per row (user and system, of all its threads, the checks of the first
 * lookup's rows included), what it costs the cores it shares with the
 * servers.  Every output row of each configuration's first lookup is
 * checked against the rows pushed.  Ratios are of this run's medians,
 * between the configurations this run measured: no figure of another
 * system is printed (Mooncake's EngramStore is measured by
 * bench/bench_mooncake.py, in its own run).
 *
 * --quick: 16 MiB, 2 tables, 20 lookups, 2 repetitions (the CTest smoke
 * run, which checks every output of every lookup).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "engram.h"
#include "redis/cluster.h"
#include "redis_util.h"
#include "bench_util.h"

enum { ROW = 264, MAX_TABLES = 64, MAX_NODES = 64 };

static double mib = 1024, zipf_s = 1.0, cache_pct = 5;
static size_t K = 4096, lookups = 100, ntables = 1, chunk_kib = 1024;
static int reps = 5, quick, tagged, masters = 3, check_all;
static int thread_list[8] = {1, 2}, nthread_list = 2;
static int dists[2] = {1, 1}; /* uniform, zipf */
static const char *nodes_arg;
static uint64_t rows_per_table;

static void die(const char *what)
{
    fprintf(stderr, "bench_redis: %s: %s\n", what, engram_errmsg());
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    return x ^ (x >> 33);
}

/* Row r of table t: 33 words of a hash of (t, r, word). */
static void fill_row(unsigned char *dst, uint64_t t, uint64_t r)
{
    uint64_t h = mix((t << 40) ^ r ^ 0x9E3779B97F4A7C15ull);
    for (int w = 0; w < ROW / 8; w++) {
        uint64_t v = h + (uint64_t)w * 0x9E3779B97F4A7C15ull;
        v = mix(v);
        memcpy(dst + w * 8, &v, 8);
    }
}

static int row_ok(const unsigned char *p, uint64_t t, uint64_t r)
{
    unsigned char want[ROW];
    fill_row(want, t, r);
    return memcmp(p, want, ROW) == 0;
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ------------------------------------------------------------------------
 * Ids.
 */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double *zipf_cdf; /* [rows_per_table] */
static uint64_t perm_mul;

static void zipf_init(void)
{
    double sum = 0;
    uint64_t n = rows_per_table;
    zipf_cdf = malloc(n * sizeof *zipf_cdf);
    if (!zipf_cdf) {
        fprintf(stderr, "bench_redis: out of memory\n");
        exit(1);
    }
    for (uint64_t i = 0; i < n; i++)
        zipf_cdf[i] = (sum += 1.0 / pow((double)(i + 1), zipf_s));
    for (uint64_t i = 0; i < n; i++)
        zipf_cdf[i] /= sum;
    /* An odd multiplier coprime with n scatters the ranks. */
    perm_mul = 0x9E3779B97F4A7C15ull % n | 1;
    for (;;) {
        uint64_t a = perm_mul, b = n;
        while (b) {
            uint64_t t = a % b;
            a = b;
            b = t;
        }
        if (a == 1)
            break;
        perm_mul += 2;
    }
}

static uint64_t draw(uint64_t *s, int zipf)
{
    uint64_t n = rows_per_table;
    if (!zipf)
        return rng_next(s) % n;
    {
        double u = (double)(rng_next(s) >> 11) / 9007199254740992.0;
        uint64_t lo = 0, hi = n - 1;
        while (lo < hi) {
            uint64_t mid = (lo + hi) / 2;
            if (zipf_cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        return (uint64_t)(((unsigned __int128)lo * perm_mul) % n);
    }
}

/* ------------------------------------------------------------------------
 * The bare clients: the slot map and the tables' keys, read once, and the
 * naive client (bare-naive).
 */

typedef struct bare_table {
    char kpre[600];
    size_t kpre_len;
    uint64_t chunk_rows;
    uint16_t *slots; /* per chunk */
    /* The fast client's command head of each chunk, "*4\r\n$8\r\nGETRANGE
     * \r\n$<key length>\r\n<key>\r\n", formatted once: chunk i's is
     * heads[head_off[i] .. head_off[i + 1]). */
    char *heads;
    uint32_t *head_off;
} bare_table;

static bare_table btab[MAX_TABLES];
static char node_host[MAX_NODES][64];
static int node_port[MAX_NODES], nnodes;
static uint8_t slot_node[16384];
static size_t max_head; /* the longest command head of any chunk */

static redisContext *bare_connect(int n)
{
    redisContext *c = redisConnect(node_host[n], node_port[n]);
    if (!c || c->err) {
        fprintf(stderr, "bench_redis: connect %s:%d: %s\n", node_host[n], node_port[n],
                c ? c->errstr : "out of memory");
        exit(1);
    }
    return c;
}

/* The slot map and every table's chunk keys, read once. */
static void bare_init(const char *seed_host, int seed_port)
{
    redisContext *c = redisConnect(seed_host, seed_port);
    redisReply *r;
    if (!c || c->err) {
        fprintf(stderr, "bench_redis: connect to %s:%d failed\n", seed_host, seed_port);
        exit(1);
    }
    r = redisCommand(c, "CLUSTER SLOTS");
    for (size_t i = 0; r && i < r->elements; i++) {
        const redisReply *e = r->element[i];
        const char *h = e->element[2]->element[0]->str;
        int p = (int)e->element[2]->element[1]->integer, n;
        for (n = 0; n < nnodes; n++)
            if (node_port[n] == p && strcmp(node_host[n], h) == 0)
                break;
        if (n == nnodes) {
            snprintf(node_host[n], sizeof node_host[n], "%s", h);
            node_port[n] = p;
            nnodes++;
        }
        for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++)
            slot_node[s] = (uint8_t)n;
    }
    freeReplyObject(r);
    for (size_t t = 0; t < ntables; t++) {
        char name[32], mkey[64];
        const char *ep, *cr;
        uint64_t nch;
        int owner;
        snprintf(name, sizeof name, "t%zu", t);
        snprintf(mkey, sizeof mkey, "engram/bench/.manifests");
        owner = slot_node[engram__rcl_keyslot(mkey, strlen(mkey))];
        {
            redisContext *o = bare_connect(owner);
            r = redisCommand(o, "HGET %s %s", mkey, name);
            redisFree(o);
        }
        if (!r || r->type != REDIS_REPLY_STRING || !(ep = strstr(r->str, "\nepoch ")) ||
            !(cr = strstr(r->str, "\nchunk_rows "))) {
            fprintf(stderr, "bench_redis: no manifest of %s\n", name);
            exit(1);
        }
        btab[t].chunk_rows = strtoull(cr + 12, NULL, 10);
        btab[t].kpre_len = (size_t)snprintf(btab[t].kpre, sizeof btab[t].kpre,
                                            tagged ? "engram/bench/{%s/%.16s}/" : "engram/bench/%s/%.16s/",
                                            name, ep + 7);
        freeReplyObject(r);
        nch = (rows_per_table + btab[t].chunk_rows - 1) / btab[t].chunk_rows;
        btab[t].slots = malloc(nch * sizeof *btab[t].slots);
        btab[t].heads = malloc(nch * (btab[t].kpre_len + 48));
        btab[t].head_off = malloc((nch + 1) * sizeof *btab[t].head_off);
        if (!btab[t].slots || !btab[t].heads || !btab[t].head_off) {
            fprintf(stderr, "bench_redis: out of memory\n");
            exit(1);
        }
        btab[t].head_off[0] = 0;
        for (uint64_t i = 0; i < nch; i++) {
            char key[700];
            int n = snprintf(key, sizeof key, "%s%" PRIu64, btab[t].kpre, i);
            int h = sprintf(btab[t].heads + btab[t].head_off[i],
                            "*4\r\n$8\r\nGETRANGE\r\n$%d\r\n%s\r\n", n, key);
            btab[t].slots[i] = engram__rcl_keyslot(key, (size_t)n);
            btab[t].head_off[i + 1] = btab[t].head_off[i] + (uint32_t)h;
            if ((size_t)h > max_head)
                max_head = (size_t)h;
        }
    }
    redisFree(c);
}

typedef struct bare_client {
    redisContext *c[MAX_NODES];
    uint32_t *by_node; /* ids grouped by node */
    uint32_t cnt[MAX_NODES + 1];
} bare_client;

/* One lookup of T x ntables ids into out. */
static void bare_lookup(bare_client *b, const int64_t *ids, size_t n, unsigned char *out)
{
    int node_of[4096 * 16];
    memset(b->cnt, 0, sizeof b->cnt);
    for (size_t i = 0; i < n; i++) {
        const bare_table *t = &btab[i % ntables];
        uint64_t row = (uint64_t)ids[i], chunk = row / t->chunk_rows;
        uint64_t start = (row - chunk * t->chunk_rows) * ROW;
        char key[700], s[24], e[24];
        const char *argv[4] = {"GETRANGE", key, s, e};
        size_t lens[4];
        int node = slot_node[t->slots[chunk]];
        lens[0] = 8;
        lens[1] = (size_t)snprintf(key, sizeof key, "%s%" PRIu64, t->kpre, chunk);
        lens[2] = (size_t)snprintf(s, sizeof s, "%" PRIu64, start);
        lens[3] = (size_t)snprintf(e, sizeof e, "%" PRIu64, start + ROW - 1);
        redisAppendCommandArgv(b->c[node], 4, argv, lens);
        node_of[i] = node;
        b->cnt[node + 1]++;
    }
    for (int k = 0; k < nnodes; k++)
        b->cnt[k + 1] += b->cnt[k];
    for (size_t i = 0; i < n; i++)
        b->by_node[b->cnt[node_of[i]]++] = (uint32_t)i;
    /* Every node's commands go out before any reply is read. */
    for (int k = 0; k < nnodes; k++) {
        int done = 0;
        while (!done)
            if (redisBufferWrite(b->c[k], &done) != REDIS_OK) {
                fprintf(stderr, "bench_redis: write: %s\n", b->c[k]->errstr);
                exit(1);
            }
    }
    for (int k = 0, start = 0; k < nnodes; start = (int)b->cnt[k], k++) {
        for (uint32_t j = (uint32_t)start; j < b->cnt[k]; j++) {
            redisReply *r;
            if (redisGetReply(b->c[k], (void **)&r) != REDIS_OK || r->type != REDIS_REPLY_STRING ||
                r->len != ROW) {
                fprintf(stderr, "bench_redis: a GETRANGE failed\n");
                exit(1);
            }
            memcpy(out + (size_t)b->by_node[j] * ROW, r->str, ROW);
            freeReplyObject(r);
        }
    }
}

/* ------------------------------------------------------------------------
 * The fast bare client: what a careful user would write without a
 * library.  Per node one non-blocking socket of each thread; a lookup
 * formats every id's GETRANGE into its node's buffer (the chunk's command
 * head copied from a table formatted once, the two offsets by a digit-pair
 * formatter), then one poll() loop writes all nodes' buffers and reads all
 * nodes' replies as they come, parsing each "$264\r\n<row>\r\n" straight
 * into its output row: no allocation, no reply object, no hiredis.
 */

enum { RBUF = 256 << 10, REPLY = ROW + 8 }; /* "$264\r\n" + row + "\r\n" */
static const char reply_head[] = "$264\r\n";
_Static_assert(ROW == 264, "reply_head spells the row size");

typedef struct fast_conn {
    int fd;
    char *wbuf;
    size_t wlen, woff;
    uint32_t *rows; /* the output row of each command, in order */
    size_t nrows, got;
    /* The parser's state when a reply is split across reads: the header
     * bytes seen so far, or how many bytes of the body and its CRLF are
     * left and where the row goes. */
    char hdr[32];
    size_t hlen, body_left;
    unsigned char *dst;
} fast_conn;

typedef struct fast_client {
    fast_conn c[MAX_NODES];
    unsigned char *rbuf;
} fast_client;

static void fast_connect(fast_conn *c, int n, size_t k)
{
    struct addrinfo hints = {0}, *ai = NULL;
    char port[16];
    int one = 1;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof port, "%d", node_port[n]);
    memset(c, 0, sizeof *c);
    if (getaddrinfo(node_host[n], port, &hints, &ai) != 0 ||
        (c->fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol)) < 0 ||
        connect(c->fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK) != 0) {
        fprintf(stderr, "bench_redis: connect %s:%d: %s\n", node_host[n], node_port[n],
                strerror(errno));
        exit(1);
    }
    freeaddrinfo(ai);
    /* Room for every id of a lookup on this node. */
    c->wbuf = malloc(k * (max_head + 2 * 27));
    c->rows = malloc(k * sizeof *c->rows);
    if (!c->wbuf || !c->rows) {
        fprintf(stderr, "bench_redis: out of memory\n");
        exit(1);
    }
}

static void fast_close(fast_conn *c)
{
    close(c->fd);
    free(c->wbuf);
    free(c->rows);
}

/* Appends "$<digits>\r\n<v>\r\n" at p; returns the end. */
static char *put_bulk_u64(char *p, uint64_t v)
{
    static const char pairs[] = "00010203040506070809101112131415161718192021222324"
                                "25262728293031323334353637383940414243444546474849"
                                "50515253545556575859606162636465666768697071727374"
                                "75767778798081828384858687888990919293949596979899";
    char t[20], *e = t + sizeof t, *d = e;
    size_t nd;
    while (v >= 100) {
        d -= 2;
        memcpy(d, pairs + v % 100 * 2, 2);
        v /= 100;
    }
    if (v >= 10) {
        d -= 2;
        memcpy(d, pairs + v * 2, 2);
    } else {
        *--d = (char)('0' + v);
    }
    nd = (size_t)(e - d);
    *p++ = '$';
    if (nd >= 10)
        *p++ = (char)('0' + nd / 10);
    *p++ = (char)('0' + nd % 10);
    *p++ = '\r';
    *p++ = '\n';
    memcpy(p, d, nd);
    p += nd;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

static void fast_bad(const fast_conn *c, const char *why)
{
    fprintf(stderr, "bench_redis: fast client: %s (reply %zu of %zu)\n", why, c->got, c->nrows);
    exit(1);
}

/* Parses n bytes of c's replies, copying each row to its place in out. */
static void fast_feed(fast_conn *c, const unsigned char *b, size_t n, unsigned char *out)
{
    size_t i = 0;
    while (i < n) {
        if (c->body_left == 0) {
            unsigned char ch;
            /* The common case: a whole reply in the buffer. */
            if (c->hlen == 0 && n - i >= REPLY && memcmp(b + i, reply_head, 6) == 0 &&
                b[i + REPLY - 2] == '\r' && b[i + REPLY - 1] == '\n') {
                if (c->got == c->nrows)
                    fast_bad(c, "a reply nobody asked for");
                memcpy(out + (size_t)c->rows[c->got++] * ROW, b + i + 6, ROW);
                i += REPLY;
                continue;
            }
            /* A reply split across reads, or not a row: byte by byte. */
            ch = b[i++];
            if (c->hlen == sizeof c->hdr - 1)
                fast_bad(c, "a reply header too long");
            c->hdr[c->hlen++] = (char)ch;
            if (ch != '\n')
                continue;
            c->hdr[c->hlen] = '\0';
            if (c->hlen != 6 || memcmp(c->hdr, reply_head, 6) != 0) {
                fprintf(stderr, "bench_redis: fast client: a GETRANGE failed: %s", c->hdr);
                exit(1);
            }
            if (c->got == c->nrows)
                fast_bad(c, "a reply nobody asked for");
            c->hlen = 0;
            c->dst = out + (size_t)c->rows[c->got] * ROW;
            c->body_left = ROW + 2;
        } else {
            size_t m = n - i < c->body_left ? n - i : c->body_left;
            size_t pos = ROW + 2 - c->body_left;
            if (pos < ROW)
                memcpy(c->dst + pos, b + i, m < ROW - pos ? m : ROW - pos);
            for (size_t q = pos < ROW ? ROW : pos; q < pos + m; q++)
                if (b[i + q - pos] != (q == ROW ? '\r' : '\n'))
                    fast_bad(c, "a row without its CRLF");
            i += m;
            if ((c->body_left -= m) == 0)
                c->got++;
        }
    }
}

static void fast_send(fast_conn *c)
{
    ssize_t w = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff, MSG_NOSIGNAL);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        fprintf(stderr, "bench_redis: fast client: send: %s\n", strerror(errno));
        exit(1);
    }
    if (w > 0)
        c->woff += (size_t)w;
}

/* One lookup of T x ntables ids into out. */
static void fast_lookup(fast_client *b, const int64_t *ids, size_t n, unsigned char *out)
{
    struct pollfd pfd[MAX_NODES];
    int at[MAX_NODES];
    for (int k = 0; k < nnodes; k++)
        b->c[k].wlen = b->c[k].woff = b->c[k].nrows = b->c[k].got = 0;
    for (size_t i = 0; i < n; i++) {
        const bare_table *t = &btab[i % ntables];
        uint64_t row = (uint64_t)ids[i], chunk = row / t->chunk_rows;
        uint64_t start = (row - chunk * t->chunk_rows) * ROW;
        fast_conn *c = &b->c[slot_node[t->slots[chunk]]];
        char *p = c->wbuf + c->wlen;
        size_t hl = t->head_off[chunk + 1] - t->head_off[chunk];
        memcpy(p, t->heads + t->head_off[chunk], hl);
        p = put_bulk_u64(p + hl, start);
        p = put_bulk_u64(p, start + ROW - 1);
        c->wlen = (size_t)(p - c->wbuf);
        c->rows[c->nrows++] = (uint32_t)i;
    }
    /* Every node's commands go out at once; then one poll() over all
     * nodes writes what is left and reads what arrives. */
    for (int k = 0; k < nnodes; k++)
        if (b->c[k].wlen)
            fast_send(&b->c[k]);
    for (;;) {
        int np = 0, r;
        for (int k = 0; k < nnodes; k++) {
            fast_conn *c = &b->c[k];
            if (c->got == c->nrows)
                continue;
            pfd[np].fd = c->fd;
            pfd[np].events = (short)(POLLIN | (c->woff < c->wlen ? POLLOUT : 0));
            pfd[np].revents = 0;
            at[np++] = k;
        }
        if (np == 0)
            break;
        if ((r = poll(pfd, (nfds_t)np, 30000)) <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            fprintf(stderr, "bench_redis: fast client: %s\n",
                    r ? strerror(errno) : "no reply in 30 s");
            exit(1);
        }
        for (int j = 0; j < np; j++) {
            fast_conn *c = &b->c[at[j]];
            if (pfd[j].revents & POLLOUT)
                fast_send(c);
            if (pfd[j].revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t got = recv(c->fd, b->rbuf, RBUF, 0);
                if (got == 0)
                    fast_bad(c, "the connection closed");
                if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    fprintf(stderr, "bench_redis: fast client: recv: %s\n", strerror(errno));
                    exit(1);
                }
                if (got > 0)
                    fast_feed(c, b->rbuf, (size_t)got, out);
            }
        }
    }
}

/* ------------------------------------------------------------------------
 * The runs.
 */

enum { C_NAIVE, C_BARE, C_ENGRAM, C_CACHE, C_KEEPALL, NCONF };
static const char *const conf_name[NCONF] = {"bare-naive", "bare", "engram", "engram+cache",
                                             "keep-all"};

typedef struct worker {
    pthread_t th;
    int conf;
    int idx;
    const int64_t *ids; /* [lookups][K] */
    unsigned char *out;
    engram_store *st;
    engram_table_id tids[MAX_TABLES];
    bare_client naive;
    fast_client fast;
    int check; /* check every output row (else only the first lookup's) */
    uint64_t bad;
} worker;

static void check_out(worker *w, const int64_t *ids)
{
    for (size_t i = 0; i < K; i++)
        if (!row_ok(w->out + i * ROW, i % ntables, (uint64_t)ids[i]))
            w->bad++;
}

/* The CPU time (user + system) of every thread of this process so far. */
static uint64_t process_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *run_worker(void *p)
{
    worker *w = p;
    for (size_t l = 0; l < lookups; l++) {
        const int64_t *ids = w->ids + l * K;
        if (w->conf == C_NAIVE) {
            bare_lookup(&w->naive, ids, K, w->out);
        } else if (w->conf == C_BARE) {
            fast_lookup(&w->fast, ids, K, w->out);
        } else {
            engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
            a.num_tokens = K / ntables;
            a.num_cols = ntables;
            a.tables = w->tids;
            a.ids = ids;
            a.id_type = ENGRAM_ID_INT64;
            a.out = w->out;
            if (engram_lookup(w->st, &a) != 0)
                die("engram_lookup");
        }
        if (w->check || l == 0)
            check_out(w, ids);
    }
    return NULL;
}

static engram_store *open_store(const char *nodes, uint64_t cache_bytes, uint32_t flags)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st;
    o.threads = 1;
    o.flags = flags;
    o.cache_bytes = cache_bytes;
    if (engram_store_open_redis(nodes, "bench", &o, NULL, &st) != 0)
        die("engram_store_open_redis");
    return st;
}

/* Warms each store's row cache with lookups of distribution d (ids of a
 * seed of their own, one thread) until its misses reach 6 times its slots,
 * 120 s at most. */
static void warm_caches(engram_store *const *sts, int n, int d)
{
    int64_t *ids = malloc(K * sizeof *ids);
    unsigned char *out = malloc(K * ROW);
    if (!ids || !out)
        die("out of memory");
    for (int k = 0; k < n; k++) {
        engram_table_id tids[MAX_TABLES];
        engram_cache_stats s0 = ENGRAM_CACHE_STATS_INIT, s = ENGRAM_CACHE_STATS_INIT;
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        uint64_t seed = 7777 + (uint64_t)d, t0 = now_ns(), nl = 0;
        for (size_t t = 0; t < ntables; t++) {
            char name[32];
            snprintf(name, sizeof name, "t%zu", t);
            if (engram_table_open(sts[k], name, &tids[t]) != 0)
                die("engram_table_open");
        }
        a.num_tokens = K / ntables;
        a.num_cols = ntables;
        a.tables = tids;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        engram_get_cache_stats(sts[k], NULL, &s0);
        do {
            for (size_t j = 0; j < K; j++)
                ids[j] = (int64_t)draw(&seed, d);
            if (engram_lookup(sts[k], &a) != 0)
                die("engram_lookup");
            nl++;
            engram_get_cache_stats(sts[k], NULL, &s);
        } while (s.misses - s0.misses < 6 * s.slots && now_ns() - t0 < 120ull * 1000000000ull);
        printf("%s: cache %d warmed by %" PRIu64 " lookups (%" PRIu64 " misses, %" PRIu64
               " slots) in %.1f s\n",
               d ? "zipf" : "uniform", k, nl, s.misses - s0.misses, s.slots,
               (double)(now_ns() - t0) / 1e9);
    }
    fflush(stdout);
    free(ids);
    free(out);
}

static int parse_list(const char *s, int *v, int max)
{
    int n = 0;
    while (*s && n < max) {
        v[n++] = atoi(s);
        s = strchr(s, ',');
        if (!s)
            break;
        s++;
    }
    return n;
}

int main(int argc, char **argv)
{
    tr_cluster cl;
    engram_store *push, *st_plain, *st_cache, *st_keep;
    engram_redis_options ro = ENGRAM_REDIS_OPTIONS_INIT;
    const char *nodes;
    uint64_t t0, cache_bytes;
    unsigned char *rows;
    char seed_host[64] = "127.0.0.1";
    int seed_port;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            quick = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_redis: %s needs a value (see bench/bench_redis.c)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--mib"))
            mib = atof(v);
        else if (!strcmp(a, "--tables"))
            ntables = (size_t)atol(v);
        else if (!strcmp(a, "--k"))
            K = (size_t)atol(v);
        else if (!strcmp(a, "--lookups"))
            lookups = (size_t)atol(v);
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--threads"))
            nthread_list = parse_list(v, thread_list, 8);
        else if (!strcmp(a, "--dist"))
            dists[0] = strstr(v, "uniform") != NULL, dists[1] = strstr(v, "zipf") != NULL;
        else if (!strcmp(a, "--zipf"))
            zipf_s = atof(v);
        else if (!strcmp(a, "--cache-pct"))
            cache_pct = atof(v);
        else if (!strcmp(a, "--chunk-kib"))
            chunk_kib = (size_t)atol(v);
        else if (!strcmp(a, "--layout"))
            tagged = !strcmp(v, "tagged");
        else if (!strcmp(a, "--masters"))
            masters = atoi(v);
        else if (!strcmp(a, "--nodes"))
            nodes_arg = v;
        else {
            fprintf(stderr, "bench_redis: unknown option %s\n", a);
            return 2;
        }
    }
    if (quick) {
        mib = 16;
        ntables = 2;
        lookups = 20;
        reps = 2;
        check_all = 1;
    }
    if (ntables < 1 || ntables > MAX_TABLES || K < ntables || K % ntables || K > 4096 * 16 ||
        reps < 1 || lookups < 1 || masters < 1 || masters > TR_MAX || nthread_list < 1 ||
        mib <= 0) {
        fprintf(stderr, "bench_redis: bad options\n");
        return 2;
    }
    for (int i = 0; i < nthread_list; i++)
        if (thread_list[i] < 1 || thread_list[i] > 16) {
            fprintf(stderr, "bench_redis: threads are 1..16\n");
            return 2;
        }
    rows_per_table = (uint64_t)(mib * 1048576.0 / ROW / (double)ntables);
    if (nodes_arg) {
        nodes = nodes_arg;
        if (sscanf(nodes, "%63[^:]:%d", seed_host, &seed_port) != 2) {
            fprintf(stderr, "bench_redis: --nodes HOST:PORT,...\n");
            return 2;
        }
    } else {
        int rc = tr_start(&cl, masters, 0, NULL, NULL);
        if (rc != 0)
            return rc;
        nodes = cl.nodes;
        seed_port = cl.port[0];
    }
    printf("bench_redis: libengram %s; %s; %zu table(s) of %" PRIu64 " rows of %d bytes "
           "(%.0f MiB), %s layout, %zu KiB chunks; K = %zu; %zu lookups x %d reps\n",
           engram_version_string(), nodes, ntables, rows_per_table, ROW,
           (double)rows_per_table * ntables * ROW / 1048576.0, tagged ? "tagged" : "spread",
           chunk_kib, K, lookups, reps);
    printf("load average at start: %s (%ld CPUs online)\n", bench_loadavg_text(),
           sysconf(_SC_NPROCESSORS_ONLN));

    /* The push. */
    ro.chunk_bytes = (uint64_t)chunk_kib << 10;
    ro.flags = tagged ? ENGRAM_REDIS_TAGGED : 0;
    if (engram_store_open_redis(nodes, "bench", NULL, &ro, &push) != 0)
        die("engram_store_open_redis");
    rows = malloc(rows_per_table * ROW);
    if (!rows) {
        fprintf(stderr, "bench_redis: out of memory\n");
        return 1;
    }
    t0 = now_ns();
    for (size_t t = 0; t < ntables; t++) {
        char name[32];
        engram_table_spec spec = {rows_per_table, ROW, 0};
        int err;
        snprintf(name, sizeof name, "t%zu", t);
        for (uint64_t r = 0; r < rows_per_table; r++)
            fill_row(rows + r * ROW, t, r);
        if ((err = engram_populate(push, name, &spec, rows, 0)) == -EEXIST) {
            /* A cluster given with --nodes may hold them from a run before. */
            if (!nodes_arg)
                die("engram_populate");
            continue;
        }
        if (err)
            die("engram_populate");
    }
    {
        double s = (double)(now_ns() - t0) / 1e9;
        printf("push: %.0f MiB in %.1f s (%.0f MiB/s, with the rows generated)\n",
               (double)rows_per_table * ntables * ROW / 1048576.0, s,
               (double)rows_per_table * ntables * ROW / 1048576.0 / s);
    }
    free(rows);
    engram_store_close(push);
    bare_init(seed_host, seed_port);
    zipf_init();

    cache_bytes = (uint64_t)((double)rows_per_table * ntables * ROW * cache_pct / 100.0);
    st_plain = open_store(nodes, 1, 0); /* below one set: no cache */
    /* The cache gets 7/8 of the budget (the rest is kept for file reads). */
    st_cache = open_store(nodes, cache_bytes / 7 * 8 + (1u << 20), 0);
    st_keep = open_store(nodes, cache_bytes / 7 * 8 + (1u << 20), ENGRAM_OPEN_CACHE_KEEP_ALL);

    for (int d = 0; d < 2; d++) {
        if (!dists[d])
            continue;
        warm_caches((engram_store *[]){st_cache, st_keep}, 2, d);
        for (int ti = 0; ti < nthread_list; ti++) {
            int nt = thread_list[ti];
            double res[NCONF][64];
            worker *w = calloc((size_t)nt, sizeof *w);
            int64_t **ids = calloc((size_t)nt, sizeof *ids);
            uint64_t seed = 42, distinct = 0, total = 0, hits[NCONF] = {0}, misses[NCONF] = {0};
            double cpu[NCONF] = {0}; /* the lookup threads' CPU ns, counted reps */
            if (reps > 64)
                reps = 64;
            for (int i = 0; i < nt; i++) {
                ids[i] = malloc(lookups * K * sizeof **ids);
                for (size_t j = 0; j < lookups * K; j++)
                    ids[i][j] = (int64_t)draw(&seed, d);
                w[i].out = malloc(K * ROW);
                w[i].naive.by_node = malloc(K * sizeof *w[i].naive.by_node);
                w[i].fast.rbuf = malloc(RBUF);
                for (int n = 0; n < nnodes; n++) {
                    w[i].naive.c[n] = bare_connect(n);
                    fast_connect(&w[i].fast.c[n], n, K);
                }
            }
            /* Distinct ids per lookup (what deduplication saves). */
            {
                uint64_t *seen = calloc(rows_per_table * ntables / 64 + 1, 8);
                for (size_t l = 0; l < lookups; l++) {
                    for (size_t j = 0; j < K; j++) {
                        uint64_t b = (uint64_t)ids[0][l * K + j] * ntables + j % ntables;
                        if (!(seen[b / 64] >> (b % 64) & 1)) {
                            seen[b / 64] |= 1ull << (b % 64);
                            distinct++;
                        }
                    }
                    for (size_t j = 0; j < K; j++) {
                        uint64_t b = (uint64_t)ids[0][l * K + j] * ntables + j % ntables;
                        seen[b / 64] &= ~(1ull << (b % 64));
                    }
                    total += K;
                }
                free(seen);
            }
            for (int rep = -1; rep < reps; rep++) {
                /* Fresh ids every repetition (the same for every
                 * configuration): the cache's hit rate is that of the
                 * distribution, not of a replay.  Repetition -1 is not
                 * counted (connections, first touches). */
                if (rep >= 0)
                    for (int i = 0; i < nt; i++)
                        for (size_t j = 0; j < lookups * K; j++)
                            ids[i][j] = (int64_t)draw(&seed, d);
                /* Each repetition starts with the next configuration, so
                 * that none always runs first (after the new ids) or
                 * right after the same neighbour. */
                for (int j = 0; j < NCONF; j++) {
                    int c = (j + rep + 1) % NCONF;
                    engram_store *st = c == C_CACHE ? st_cache : c == C_KEEPALL ? st_keep : st_plain;
                    uint64_t start, cpu0, bad = 0;
                    for (int i = 0; i < nt; i++) {
                        w[i].conf = c;
                        w[i].idx = i;
                        w[i].ids = ids[i];
                        w[i].st = st;
                        w[i].check = check_all;
                        w[i].bad = 0;
                        for (size_t t = 0; t < ntables; t++) {
                            char name[32];
                            snprintf(name, sizeof name, "t%zu", t);
                            if (c > C_BARE && engram_table_open(st, name, &w[i].tids[t]) != 0)
                                die("engram_table_open");
                        }
                    }
                    engram_cache_stats before = ENGRAM_CACHE_STATS_INIT;
                    engram_cache_stats after = ENGRAM_CACHE_STATS_INIT;
                    if (st != st_plain)
                        engram_get_cache_stats(st, NULL, &before);
                    start = now_ns();
                    cpu0 = process_cpu_ns();
                    for (int i = 0; i < nt; i++)
                        pthread_create(&w[i].th, NULL, run_worker, &w[i]);
                    for (int i = 0; i < nt; i++) {
                        pthread_join(w[i].th, NULL);
                        bad += w[i].bad;
                    }
                    if (rep >= 0)
                        cpu[c] += (double)(process_cpu_ns() - cpu0);
                    if (st != st_plain && rep >= 0) {
                        engram_get_cache_stats(st, NULL, &after);
                        hits[c] += after.hits - before.hits;
                        misses[c] += after.misses - before.misses;
                    }
                    if (bad) {
                        fprintf(stderr, "bench_redis: %s: %" PRIu64 " wrong rows\n",
                                conf_name[c], bad);
                        return 1;
                    }
                    if (rep >= 0)
                        res[c][rep] = (double)nt * (double)lookups * (double)K /
                                      ((double)(now_ns() - start) / 1e9);
                }
            }
            {
                double med[NCONF], lo[NCONF], hi[NCONF];
                for (int c = 0; c < NCONF; c++) {
                    med[c] = median(res[c], reps); /* sorts res[c] */
                    lo[c] = res[c][0];
                    hi[c] = res[c][reps - 1];
                }
                printf("%-7s threads %d: %.0f%% of the ids of a lookup distinct; M rows/s, median "
                       "[min, max] of %d; load %s:\n",
                       d ? "zipf" : "uniform", nt, 100.0 * (double)distinct / (double)total, reps,
                       bench_loadavg_text());
                for (int c = 0; c < NCONF; c++) {
                    printf("  %-13s %7.3f [%.3f, %.3f] %5.0f ns CPU/row", conf_name[c],
                           med[c] / 1e6, lo[c] / 1e6, hi[c] / 1e6,
                           cpu[c] / ((double)reps * (double)nt * (double)lookups * (double)K));
                    if (c == C_BARE)
                        printf("  %5.2fx naive", med[c] / med[C_NAIVE]);
                    if (c > C_BARE)
                        printf("  %5.2fx bare  %5.2fx naive", med[c] / med[C_BARE],
                               med[c] / med[C_NAIVE]);
                    if (c == C_CACHE || c == C_KEEPALL)
                        printf("  hit rate %.1f%%",
                               hits[c] + misses[c]
                                   ? 100.0 * (double)hits[c] / (double)(hits[c] + misses[c])
                                   : 0.0);
                    if (c == C_CACHE)
                        printf("  %.2fx keep-all", med[c] / med[C_KEEPALL]);
                    printf("\n");
                }
                fflush(stdout);
            }
            for (int i = 0; i < nt; i++) {
                for (int n = 0; n < nnodes; n++) {
                    redisFree(w[i].naive.c[n]);
                    fast_close(&w[i].fast.c[n]);
                }
                free(w[i].naive.by_node);
                free(w[i].fast.rbuf);
                free(w[i].out);
                free(ids[i]);
            }
            free(w);
            free(ids);
        }
    }
    for (int k = 0; k < 2; k++) {
        engram_cache_stats s = ENGRAM_CACHE_STATS_INIT;
        engram_get_cache_stats(k ? st_keep : st_cache, NULL, &s);
        printf("row cache%s: %.1f MiB of slots and sketch (%.1f%% of the rows), budget %.1f MiB\n",
               k ? " (keep-all)" : "", (double)s.cache_bytes / 1048576.0,
               100.0 * (double)s.slots / (double)(rows_per_table * ntables),
               (double)s.budget_bytes / 1048576.0);
    }
    printf("load average at end: %s\n", bench_loadavg_text());
    engram_store_close(st_plain);
    engram_store_close(st_cache);
    engram_store_close(st_keep);
    if (!nodes_arg)
        tr_stop(&cl);
    return 0;
}
