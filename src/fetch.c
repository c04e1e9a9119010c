/*
 * fetch.c - the rows of one lookup that come from row sources (see
 * fetch.h).
 *
 * Up to ENGRAM_SOURCE_MAX_REQS positions at a time:
 *
 *  1. Look each position's row up in its table's row cache, prefetching
 *     the sets (and, one step later, the slots) of the rows a few
 *     positions ahead, so the misses of consecutive rows overlap as in
 *     the memory gather.  A hit is copied at once: the all-hit lookup of
 *     a warm cache does nothing more.
 *  2. Deduplicate the misses: an open-addressing hash of (table, row)
 *     maps each missed position to its distinct row; the other positions
 *     of a row are chained behind it.  Engram ids are Zipf-like, so a
 *     batch repeats rows often, and each distinct row is then read and
 *     cached once.  Each distinct row is counted in its cache's admission
 *     sketch (prefetched a few rows ahead, before the reads, while the
 *     sketch is likelier in the CPU's caches than after them), and each
 *     cache ages once per chunk with the sum.
 *  3. Hand the distinct missed rows to their sources: one read_rows call
 *     per (read_rows, ctx), with every such row of the chunk.  A row the
 *     source wrote (all of them when it returns 0, the ones it marked
 *     done otherwise) is offered to the cache, which keeps it where its
 *     set has room or the row was asked for often enough lately; one it
 *     did not write counts as unread.
 *  4. Copy every row read to its other positions.
 *
 * Nothing here locks except the cache's set locks.  The scratch (about 100
 * bytes a missed position) is the thread's own and kept between lookups.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "fetch.h"
#include "rowcache.h"

#define CHUNK ENGRAM_SOURCE_MAX_REQS
#define NONE UINT32_MAX
#define PF_SET 16 /* distinct rows ahead whose set line is prefetched */
#define PF_SLOT 8 /* distinct rows ahead whose slot is prefetched */
#define PF_COUNT 8 /* distinct missed rows ahead whose sketch block is prefetched */
#define AGE_SLOTS 16 /* caches whose asks a chunk sums before aging them */
#define AGE_BATCH 64 /* asks of one cache summed at most before it ages */

enum { UNREAD, IN_CALL, SERVED, FAILED };

typedef struct uniq {
    engram__table *t;
    uint64_t row;
    unsigned char *dst; /* the first position's output */
    uint32_t count;     /* positions that ask for the row */
    uint32_t dups;      /* the other positions, chained through nxt[] */
    uint32_t state;
    uint32_t est;       /* asks its cache's sketch estimates, for the put */
} uniq;

typedef struct scratch {
    uint32_t *hash;          /* [cap] index into uq, or NONE */
    uniq *uq;                /* [n] distinct missed rows */
    uint32_t *miss;          /* [n] the missed positions */
    uint32_t *nxt;           /* [n] next position of the same row */
    uint32_t *map;           /* [n] distinct row of each request of a call */
    engram_source_req *req;  /* [n] the requests of a call */
} scratch;

static _Thread_local int in_source;

int engram__fetch_in_source(void)
{
    return in_source;
}

static inline uint32_t hash_of(const engram__table *t, uint64_t row, unsigned bits)
{
    uint64_t h = row * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)t * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

/* The scratch for n positions, the hash of 2^bits slots made later (its
 * size depends on the misses). */
static int scratch_get(size_t n, unsigned bits, scratch *s)
{
    size_t cap = (size_t)1 << bits;
    /* Largest alignment first: uniq and req hold 8-byte fields. */
    size_t size = n * sizeof(uniq) + n * sizeof(engram_source_req) +
                  (cap + 3 * n) * sizeof(uint32_t);
    unsigned char *p = engram__scratch(ENGRAM__SCRATCH_FETCH, size);
    if (!p)
        return engram__err(-ENOMEM, "out of memory for the deduplication of %zu rows", n);
    s->uq = (uniq *)(void *)p;
    s->req = (engram_source_req *)(void *)(p + n * sizeof(uniq));
    s->miss = (uint32_t *)(void *)(p + n * sizeof(uniq) + n * sizeof(engram_source_req));
    s->nxt = s->miss + n;
    s->map = s->nxt + n;
    s->hash = s->map + n;
    return 0;
}

/* Step 1: the positions the row caches hold are copied; the others are
 * listed in s->miss.  Returns how many missed. */
static uint32_t from_cache(const engram__fetch_req *reqs, size_t n, scratch *s, unsigned stats_slot,
                           int excl)
{
    uint32_t nm = 0;
    for (size_t i = 0; i < n; i++) {
        const engram__fetch_req *q = &reqs[i];
        if (i + PF_SET < n && reqs[i + PF_SET].t->src.cache)
            engram__rcache_prefetch_set(reqs[i + PF_SET].t->src.cache, reqs[i + PF_SET].row);
        if (i + PF_SLOT < n && reqs[i + PF_SLOT].t->src.cache)
            engram__rcache_prefetch_slot(reqs[i + PF_SLOT].t->src.cache, reqs[i + PF_SLOT].row);
        if (q->t->src.cache && engram__rcache_get(q->t->src.cache, q->row, q->dst))
            engram__ctr_add(&q->t->ctr[stats_slot].hits, 1, excl);
        else
            s->miss[nm++] = (uint32_t)i;
    }
    return nm;
}

/* Step 2: the distinct rows of the nm missed positions; returns how
 * many. */
static uint32_t dedupe(const engram__fetch_req *reqs, uint32_t nm, unsigned bits, scratch *s,
                       unsigned stats_slot, int excl)
{
    uint32_t mask = ((uint32_t)1 << bits) - 1, nu = 0;
    memset(s->hash, 0xff, ((size_t)1 << bits) * sizeof *s->hash);
    for (uint32_t m = 0; m < nm; m++) {
        uint32_t i = s->miss[m];
        engram__table *t = reqs[i].t;
        uint64_t row = reqs[i].row;
        uint32_t h = hash_of(t, row, bits), j;
        /* The hash has at least twice the misses' slots: a probe ends. */
        while ((j = s->hash[h]) != NONE && (s->uq[j].t != t || s->uq[j].row != row))
            h = (h + 1) & mask;
        if (j == NONE) {
            s->hash[h] = nu;
            s->uq[nu] = (uniq){t, row, reqs[i].dst, 1, NONE, UNREAD, 0};
            nu++;
        } else {
            s->nxt[i] = s->uq[j].dups;
            s->uq[j].dups = i;
            s->uq[j].count++;
        }
    }
    for (uint32_t u = 0; u < nu; u++) {
        const uniq *q = &s->uq[u];
        engram__ctr_add(&q->t->ctr[stats_slot].misses, q->count, excl);
        if (q->count > 1)
            engram__ctr_add(&q->t->ctr[stats_slot].dedup, q->count - 1, excl);
    }
    return nu;
}

/* Step 2, end: counts each distinct missed row in its cache's admission
 * sketch (its estimate kept for the put), and ages each cache by the sum
 * of its rows' asks every AGE_BATCH asks and at the end: one atomic add
 * per cache and batch instead of one per row, while a lookup of more rows
 * than a small cache's sketch holds still ages it as it goes.  The sums
 * are kept in a small table indexed by the cache's address; a cache that
 * finds its entry taken ages the entry's first, so a lookup of many
 * tables stays exact, only less batched. */
static void count_misses(scratch *s, uint32_t nu)
{
    struct {
        engram__rcache *c;
        uint64_t asks;
    } sum[AGE_SLOTS];
    memset(sum, 0, sizeof sum);
    for (uint32_t u = 0; u < nu; u++) {
        uniq *q = &s->uq[u];
        engram__rcache *c = q->t->src.cache;
        unsigned k;
        if (u + PF_COUNT < nu && s->uq[u + PF_COUNT].t->src.cache)
            engram__rcache_prefetch_count(s->uq[u + PF_COUNT].t->src.cache,
                                          s->uq[u + PF_COUNT].row);
        if (!c)
            continue;
        q->est = engram__rcache_count(c, q->row, q->count);
        k = (unsigned)(((uintptr_t)c >> 6) % AGE_SLOTS);
        if (sum[k].c != c) {
            if (sum[k].c)
                engram__rcache_age(sum[k].c, sum[k].asks);
            sum[k].c = c;
            sum[k].asks = 0;
        }
        sum[k].asks += q->count;
        if (sum[k].asks >= AGE_BATCH) {
            engram__rcache_age(c, sum[k].asks);
            sum[k].asks = 0;
        }
    }
    for (unsigned k = 0; k < AGE_SLOTS; k++)
        if (sum[k].c)
            engram__rcache_age(sum[k].c, sum[k].asks);
}

/* Calls a source with m requests and turns its failure into the lookup's
 * error, naming the table of the first row it did not write. */
static int call_source(const engram_source_ops *ops, const scratch *s, uint32_t m)
{
    const engram__table *t;
    int rc, msg;
    (void)engram__source_msg_take();
    in_source = 1;
    rc = ops->read_rows(ops->ctx, s->req, m);
    in_source = 0;
    msg = engram__source_msg_take();
    if (ENGRAM__LIKELY(rc == 0))
        return 0;
    t = s->uq[s->map[0]].t;
    for (uint32_t j = 0; j < m; j++) {
        if (rc < 0 && s->req[j].done != 1) {
            t = s->uq[s->map[j]].t;
            break;
        }
    }
    if (rc > 0) {
        /* Not a code: nothing it wrote can be trusted as done either. */
        for (uint32_t j = 0; j < m; j++)
            s->req[j].done = 0;
        return engram__err(-EIO, "table '%s': read_rows returned %d (must be 0 or negative)",
                           t->name, rc);
    }
    /* The library's own sources name the table in their messages; a
     * caller's source gets its table's name put before its own message,
     * or a plain one. */
    if (msg)
        return engram__err(rc, "table '%s': %s", t->name, engram_errmsg());
    if (!t->src.vt)
        return engram__err(rc, "table '%s': read_rows failed: %s", t->name, engram_strerror(rc));
    return rc;
}

/* Step 3: the rows of one source, those of distinct row u and every later
 * unread one with the same read_rows and ctx. */
static int from_source(scratch *s, uint32_t u, uint32_t nu, unsigned stats_slot, int excl)
{
    const engram_source_ops *ops = &s->uq[u].t->src.ops;
    uint32_t m = 0;
    int rc;
    for (uint32_t v = u; v < nu; v++) {
        uniq *q = &s->uq[v];
        if (q->state != UNREAD || q->t->src.ops.read_rows != ops->read_rows ||
            q->t->src.ops.ctx != ops->ctx)
            continue;
        q->state = IN_CALL;
        s->map[m] = v;
        s->req[m] = (engram_source_req){q->row, q->dst, q->t->src.table_ud, q->t->id, 0};
        m++;
    }
    rc = call_source(ops, s, m);
    for (uint32_t j = 0; j < m; j++) {
        uniq *q = &s->uq[s->map[j]];
        int ok = rc == 0 || s->req[j].done == 1;
        q->state = ok ? SERVED : FAILED;
        if (ok && q->t->src.cache && engram__rcache_put(q->t->src.cache, q->row, q->dst, q->est))
            engram__ctr_add(&q->t->ctr[stats_slot].not_kept, 1, excl);
        if (!q->t->src.vt || !q->t->src.vt->cache_stats) {
            /* A source without read counters of its own: count its rows. */
            engram__table_counters *c = &q->t->ctr[stats_slot];
            engram__ctr_add(&c->reads, 1, excl);
            if (ok)
                engram__ctr_add(&c->bytes, q->t->spec.row_bytes, excl);
            else
                engram__ctr_add(&c->errors, 1, excl);
        }
    }
    return rc;
}

/* Keeps the message of a lookup's first failure: later failing calls of
 * the same lookup overwrite the thread's message, and the code returned
 * is the first one's. */
typedef struct first_err {
    int code;
    char msg[512];
} first_err;

static void note_err(first_err *f, int rc)
{
    if (rc && !f->code) {
        f->code = rc;
        snprintf(f->msg, sizeof f->msg, "%s", engram_errmsg());
    }
}

static int fetch_chunk(const engram__fetch_req *reqs, size_t n, unsigned stats_slot, int excl,
                       first_err *fe)
{
    scratch s = {NULL, NULL, NULL, NULL, NULL, NULL};
    unsigned bits = 4;
    uint32_t nm, nu;
    int rc;
    /* Sized for the worst case, all misses: the scratch is kept, so a
     * thread's first cold lookup grows it and later ones reuse it. */
    while (((size_t)1 << bits) < 2 * n)
        bits++;
    if ((rc = scratch_get(n, bits, &s)) != 0)
        return rc;
    if ((nm = from_cache(reqs, n, &s, stats_slot, excl)) == 0)
        return 0;
    bits = 4;
    while (((size_t)1 << bits) < 2 * (size_t)nm)
        bits++;
    nu = dedupe(reqs, nm, bits, &s, stats_slot, excl);
    count_misses(&s, nu);
    for (uint32_t u = 0; u < nu; u++)
        if (s.uq[u].state == UNREAD)
            note_err(fe, from_source(&s, u, nu, stats_slot, excl));
    /* Step 4. */
    for (uint32_t u = 0; u < nu; u++) {
        const uniq *q = &s.uq[u];
        if (q->state != SERVED)
            continue;
        for (uint32_t d = q->dups; d != NONE; d = s.nxt[d])
            memcpy(reqs[d].dst, q->dst, q->t->spec.row_bytes);
    }
    return 0;
}

int engram__fetch_reserve(size_t n)
{
    scratch s;
    unsigned bits = 4;
    if (n > CHUNK)
        n = CHUNK;
    while (((size_t)1 << bits) < 2 * n)
        bits++;
    return scratch_get(n, bits, &s);
}

int engram__fetch(const engram__fetch_req *reqs, size_t n)
{
    first_err fe = {0, {0}};
    int excl;
    unsigned stats_slot = engram__stats_slot(&excl);
    for (size_t i = 0; i < n; i += CHUNK) {
        /* Every chunk is served, even after a failure: each row that can
         * be read is written. */
        note_err(&fe, fetch_chunk(reqs + i, n - i < CHUNK ? n - i : CHUNK, stats_slot, excl, &fe));
    }
    if (fe.code)
        return engram__err(fe.code, "%s", fe.msg);
    return 0;
}
