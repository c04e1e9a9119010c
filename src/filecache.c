/*
 * filecache.c - tables larger than memory: rows read on demand with
 * io_uring through a bounded, exact, set-associative row cache.
 *
 * The lookup plan hands this backend all the cache-backed rows of a lookup
 * in one call (backend.h: in batches only beyond ENGRAM__BACKEND_BATCH
 * rows).  A call is served in two steps:
 *
 *  1. Every row is looked up in its table's cache.  A set is
 *     ENGRAM_CACHE_WAYS tags and a lock in one cache line; a hit copies the
 *     row under the set's lock, so a slot is never read while it is being
 *     written.  The sets of the rows a few positions ahead are prefetched
 *     (and, one step later, the slot their tag points to), so the misses
 *     of consecutive rows overlap as they do in the memory gather.
 *  2. The missed rows are sorted by (table, row); each distinct row is read
 *     once, duplicates share its bytes.  Reads go to a staging buffer of
 *     one of the store's io_uring rings, queue_depth of them in flight; as
 *     each row completes it is checked (a short read is completed by a
 *     read of the rest, and a read that returns nothing before the row's
 *     end is a truncated file; -EAGAIN and -EINTR are retried), copied to
 *     every output row that asked for it, and only then inserted
 *     in its set (CLOCK replacement), under the set's lock.  A row whose
 *     read failed is never copied nor cached: the cache is exact.  Each
 *     completion frees a staging slot that the next distinct row's read
 *     takes at once, so the queue stays full over all the missed rows of
 *     the call and drains only at its end.  (With 1024-row calls it
 *     drained four times per 4096-row lookup, ~10% of cold throughput.)
 *
 * Rings are a small pool per store, each with its own lock, staging
 * buffer and list of missed rows (grown to the largest call it served,
 * ~56 bytes a row, at most ENGRAM__BACKEND_BATCH rows); a lookup takes any
 * free one at its first miss.  Nothing on the hit path takes more than the
 * one set lock of its row.
 *
 * O_DIRECT: a table file is reopened with O_DIRECT when the file system
 * reports direct I/O alignment (statx STATX_DIOALIGN) and a probe read
 * works; reads then cover the aligned blocks around the row.  Elsewhere
 * (tmpfs reports no alignment) reads are buffered.  A direct read that
 * still fails with EINVAL switches its segment to buffered reads for good
 * and is retried.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/magic.h>
#include <liburing.h>

#include "filecache.h"

#define WAYS ENGRAM_CACHE_WAYS
#define BATCH ENGRAM__BACKEND_BATCH
#define PF_SET 16 /* rows ahead whose set line is prefetched */
#define PF_SLOT 8 /* rows ahead whose slot (from a peek at the tags) is prefetched */
#define STAGE_ALIGN 4096u
#define OP_RETRIES 16 /* retries of a read that failed with -EAGAIN or -EINTR */

_Static_assert(WAYS <= 8, "the CLOCK reference bits are one byte");

/* ------------------------------------------------------------------------
 * State.
 */

/* One set: its lock, CLOCK state and tags (row + 1; 0 = empty) in one
 * cache line.  Tags are atomics because the prefetch step peeks at them
 * without the lock; every decision is taken again under the lock. */
typedef struct fc_set {
    atomic_uint lock;
    unsigned char ref;  /* CLOCK reference bit per way (under lock) */
    unsigned char hand; /* next way the CLOCK hand looks at (under lock) */
    _Atomic uint64_t tag[WAYS];
} __attribute__((aligned(ENGRAM__CACHELINE))) fc_set;

_Static_assert(sizeof(fc_set) == ENGRAM__CACHELINE, "a set is one cache line");

typedef struct fc_counters {
    _Atomic uint64_t hits, misses, dedup, reads, bytes, errors;
} __attribute__((aligned(ENGRAM__CACHELINE))) fc_counters;

typedef struct fc_seg {
    int fd;             /* buffered reads */
    int dfd;            /* O_DIRECT descriptor of the same file, or -1 */
    atomic_int direct;  /* dfd in use (cleared for good by an EINVAL) */
    uint32_t align;     /* direct I/O alignment of offsets, lengths and memory */
    uint64_t base, stride, file_size;
    uint32_t len, dst_off; /* bytes of the row, and where they go in it */
} fc_seg;

typedef struct fc_table {
    engram__fcache *fc;
    unsigned nseg;
    int in_namespace;      /* ENGRAM__FC_IN_NAMESPACE: size_bytes is not in fc->extra */
    fc_seg seg[ENGRAM__FC_MAX_SEGS];
    uint32_t row_bytes, slot_bytes;
    uint64_t nsets, size_bytes, cache_bytes;
    fc_set *sets;          /* nsets sets */
    unsigned char *data;   /* nsets * WAYS slots of slot_bytes */
    size_t sets_len, data_len;
    fc_counters ctr[ENGRAM__SHARDS];
} fc_table;

/* One read in flight: which distinct row and segment, into which staging
 * slot (the op's own index). */
typedef struct fc_op {
    uint32_t u;      /* index into the distinct rows */
    uint32_t seg;
    uint32_t skip;   /* bytes before the row's bytes in the staging slot */
    uint32_t want;   /* bytes the slot must hold: skip + the row's bytes */
    uint32_t done;   /* bytes already in the slot (a short read's first part) */
    uint32_t again;  /* reads retried after -EAGAIN or -EINTR */
    int direct;      /* the next read goes to the O_DIRECT descriptor */
} fc_op;

/* A missed row of the call, and after sorting, the distinct rows. */
typedef struct fc_miss {
    fc_table *ft;
    engram__table *t;
    uint64_t row;
    uint32_t idx; /* position in the call */
} fc_miss;

typedef struct fc_uniq {
    uint32_t first, count; /* its entries in the sorted miss list */
    uint32_t left;         /* reads not yet completed */
    uint32_t slot[ENGRAM__FC_MAX_SEGS];
    int failed;
} fc_uniq;

typedef struct fc_ring {
    pthread_mutex_t lock;
    int state; /* 0 not set up, 1 io_uring, -1 io_uring unavailable: pread */
    struct io_uring ring;
    unsigned char *stage; /* qd slots of stage_slot bytes */
    size_t stage_slot;
    fc_op *ops;           /* [qd] */
    uint32_t *free_slots; /* [qd] stack of free staging slots */
    fc_miss *miss;        /* [cap] the missed rows of the call being served */
    fc_uniq *uniq;        /* [cap] its distinct rows */
    size_t cap;
} fc_ring;

struct engram__fcache {
    engram_store *st;
    uint64_t budget;   /* cache_bytes of the store */
    uint64_t assigned; /* bytes of slots given to tables (under st->lock) */
    uint64_t extra;    /* data bytes of the safetensors tables so far (under st->lock) */
    uint32_t qd;
    uint64_t log_ns;   /* 0: no stats log */
    _Atomic uint64_t next_log_ns;
    unsigned nrings;
    fc_ring *rings[64];
};

static _Atomic(engram__fc_read_hook) g_hook;
static void *_Atomic g_hook_ud;

void engram__fcache_set_read_hook(engram__fc_read_hook fn, void *ud)
{
    atomic_store_explicit(&g_hook_ud, ud, memory_order_relaxed);
    /* Release: a reader that sees the hook sees its argument. */
    atomic_store_explicit(&g_hook, fn, memory_order_release);
}

static int apply_hook(const char *table, uint64_t row, unsigned seg, int res, unsigned char *data)
{
    engram__fc_read_hook fn = atomic_load_explicit(&g_hook, memory_order_acquire);
    if (ENGRAM__LIKELY(!fn))
        return res;
    return fn(atomic_load_explicit(&g_hook_ud, memory_order_relaxed), table, row, seg, res, data);
}

/* ------------------------------------------------------------------------
 * Sets: placement, locking, lookup and insertion.
 */

/* Set of `row`: a multiplicative hash spreads strided ids over the sets,
 * and the high half of hash * nsets maps it onto any number of sets. */
static inline uint64_t set_of(const fc_table *ft, uint64_t row)
{
    uint64_t h = row * 0x9E3779B97F4A7C15ull;
    return (uint64_t)(((unsigned __int128)h * ft->nsets) >> 64);
}

static inline unsigned char *slot_of(const fc_table *ft, uint64_t set, unsigned way)
{
    return ft->data + (set * WAYS + way) * (size_t)ft->slot_bytes;
}

static inline void set_lock(fc_set *s)
{
    /* Acquire: the slot bytes and tags written by the last holder are
     * visible once we own the lock. */
    while (atomic_exchange_explicit(&s->lock, 1u, memory_order_acquire)) {
        while (atomic_load_explicit(&s->lock, memory_order_relaxed))
            engram__cpu_relax();
    }
}

static inline void set_unlock(fc_set *s)
{
    /* Release: our slot writes are visible to the next holder. */
    atomic_store_explicit(&s->lock, 0u, memory_order_release);
}

/* Copies `row` into dst if the cache holds it; returns 1 on a hit. */
static inline int cache_get(fc_table *ft, uint64_t row, unsigned char *dst)
{
    uint64_t si = set_of(ft, row);
    fc_set *s = &ft->sets[si];
    int hit = 0;
    set_lock(s);
    for (unsigned w = 0; w < WAYS; w++) {
        if (atomic_load_explicit(&s->tag[w], memory_order_relaxed) == row + 1) {
            memcpy(dst, slot_of(ft, si, w), ft->row_bytes);
            s->ref |= (unsigned char)(1u << w);
            hit = 1;
            break;
        }
    }
    set_unlock(s);
    return hit;
}

/* Prefetches the set line of `row` (stage one). */
static inline void prefetch_set(const fc_table *ft, uint64_t row)
{
    __builtin_prefetch(&ft->sets[set_of(ft, row)], 1, 3);
}

/* Peeks at the (prefetched) tags of `row`'s set without the lock and
 * prefetches the slot that holds it, if any (stage two).  A stale peek
 * only costs a useless prefetch: cache_get() decides under the lock. */
static inline void prefetch_slot(const fc_table *ft, uint64_t row)
{
    uint64_t si = set_of(ft, row);
    const fc_set *s = &ft->sets[si];
    for (unsigned w = 0; w < WAYS; w++) {
        if (atomic_load_explicit(&s->tag[w], memory_order_relaxed) == row + 1) {
            const unsigned char *p = slot_of(ft, si, w);
            for (uint32_t o = 0; o < ft->row_bytes; o += 64)
                __builtin_prefetch(p + o, 0, 0);
            __builtin_prefetch(p + ft->row_bytes - 1, 0, 0);
            return;
        }
    }
}

/* Inserts a row whose bytes are the pieces[seg] of the table's segments.
 * The slot and its tag are written under the set's lock, so no reader
 * sees the slot before all its bytes are there. */
static void cache_put(fc_table *ft, uint64_t row, unsigned char *const *pieces)
{
    uint64_t si = set_of(ft, row);
    fc_set *s = &ft->sets[si];
    unsigned w, victim = WAYS;
    set_lock(s);
    for (w = 0; w < WAYS; w++) {
        uint64_t tag = atomic_load_explicit(&s->tag[w], memory_order_relaxed);
        if (tag == row + 1) {
            /* Another lookup read the same row meanwhile. */
            set_unlock(s);
            return;
        }
        if (tag == 0 && victim == WAYS)
            victim = w;
    }
    /* CLOCK: pass over ways whose reference bit is set, clearing it. */
    while (victim == WAYS) {
        unsigned h = s->hand;
        s->hand = (unsigned char)((h + 1) % WAYS);
        if (s->ref & (1u << h))
            s->ref &= (unsigned char)~(1u << h);
        else
            victim = h;
    }
    for (unsigned g = 0; g < ft->nseg; g++)
        memcpy(slot_of(ft, si, victim) + ft->seg[g].dst_off, pieces[g], ft->seg[g].len);
    s->ref &= (unsigned char)~(1u << victim);
    atomic_store_explicit(&s->tag[victim], row + 1, memory_order_relaxed);
    set_unlock(s);
}

/* ------------------------------------------------------------------------
 * Rings.
 */

static void ring_free(fc_ring *r)
{
    if (!r)
        return;
    if (r->state == 1)
        io_uring_queue_exit(&r->ring);
    free(r->stage);
    free(r->ops);
    free(r->free_slots);
    free(r->miss);
    free(r->uniq);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* Makes sure ring r (locked) has staging slots of at least `slot` bytes
 * and its io_uring set up (or marked unavailable, then reads use pread). */
static int ring_ready(engram__fcache *fc, fc_ring *r, size_t slot)
{
    if (r->state == 0) {
        /* Kept across a failed call and a ring set up again (see
         * ring_abandon()), so never allocated twice. */
        if (!r->ops)
            r->ops = calloc(fc->qd, sizeof *r->ops);
        if (!r->free_slots)
            r->free_slots = calloc(fc->qd, sizeof *r->free_slots);
        if (!r->ops || !r->free_slots)
            return engram__err(-ENOMEM, "out of memory for an io_uring ring");
        /* Any failure here means no io_uring for this ring, not a failed
         * lookup: ENOSYS, EPERM or EACCES where it is disabled
         * (kernel.io_uring_disabled, seccomp: containers), ENOMEM where the
         * ring's memory counts against a small RLIMIT_MEMLOCK (kernels
         * before 5.12, containers again), EMFILE, ...  The same reads
         * then run one pread at a time. */
        r->state = io_uring_queue_init(fc->qd, &r->ring, 0) == 0 ? 1 : -1;
    }
    if (slot > r->stage_slot) {
        void *p = NULL;
        slot = engram__align_up(slot, STAGE_ALIGN);
        if (posix_memalign(&p, STAGE_ALIGN, slot * fc->qd) != 0)
            return engram__err(-ENOMEM, "out of memory for %u staging slots of %zu bytes",
                               fc->qd, slot);
        free(r->stage);
        r->stage = p;
        r->stage_slot = slot;
    }
    return 0;
}

/* Makes room in ring r (locked) for the missed rows of a call of n rows.
 * The lists keep their size for the ring's next calls: n is at most
 * BATCH, so a ring holds at most BATCH * 56 bytes of them. */
static int ring_reserve(fc_ring *r, size_t n)
{
    fc_miss *m;
    fc_uniq *u;
    if (n <= r->cap)
        return 0;
    /* Both lists are replaced together, or neither: cap stays true. */
    m = malloc(n * sizeof *m);
    u = malloc(n * sizeof *u);
    if (!m || !u) {
        free(m);
        free(u);
        return engram__err(-ENOMEM, "out of memory for a list of %zu missed rows", n);
    }
    free(r->miss);
    free(r->uniq);
    r->miss = m;
    r->uniq = u;
    r->cap = n;
    return 0;
}

/* Takes a free ring, or waits for the one this thread's shard maps to. */
static fc_ring *ring_take(engram__fcache *fc)
{
    int excl;
    unsigned start = engram__shard(&excl) % fc->nrings;
    for (unsigned i = 0; i < fc->nrings; i++) {
        fc_ring *r = fc->rings[(start + i) % fc->nrings];
        if (pthread_mutex_trylock(&r->lock) == 0)
            return r;
    }
    pthread_mutex_lock(&fc->rings[start]->lock);
    return fc->rings[start];
}

/* ------------------------------------------------------------------------
 * Reading the missed rows.
 */

/* Staging bytes a read of segment g needs at most. */
static size_t seg_span(const fc_seg *g)
{
    if (g->dfd >= 0)
        return (size_t)engram__align_up(g->len, g->align) + g->align;
    return g->len;
}

typedef struct fill_ctx {
    engram__fcache *fc;
    fc_ring *r;
    unsigned char *const *dsts;
    uint32_t nu;
    uint32_t inflight, nfree;
    int err;
    unsigned shard;
    int excl;
} fill_ctx;

/* Prepares read op `o` (of distinct row u, segment gi): what to read
 * where.  op_queue() or op_run() then performs it. */
static void op_setup(fill_ctx *c, uint32_t o, uint32_t u, uint32_t gi)
{
    fc_ring *r = c->r;
    const fc_miss *m = &r->miss[r->uniq[u].first];
    fc_seg *g = &m->ft->seg[gi];
    fc_op *op = &r->ops[o];
    uint64_t off = g->base + m->row * g->stride;
    op->u = u;
    op->seg = gi;
    op->done = 0;
    op->again = 0;
    op->direct = g->dfd >= 0 && atomic_load_explicit(&g->direct, memory_order_relaxed);
    if (op->direct) {
        uint64_t a = off & ~((uint64_t)g->align - 1);
        op->skip = (uint32_t)(off - a);
        op->want = op->skip + g->len;
    } else {
        op->skip = 0;
        op->want = g->len;
    }
}

/* The next read of op: its length, file offset and buffer.  A direct read
 * covers the aligned blocks around the row (done is 0 then: the rest of a
 * short read is read buffered); a buffered one the bytes still missing. */
static int op_read_len(const fc_op *op, const fc_seg *g)
{
    if (op->direct)
        return (int)engram__align_up(op->want, g->align);
    return (int)(op->want - op->done);
}

static uint64_t op_offset(const fc_ring *r, const fc_op *op, const fc_seg *g)
{
    const fc_miss *m = &r->miss[r->uniq[op->u].first];
    return g->base + m->row * g->stride - op->skip + op->done;
}

static unsigned char *op_buf(const fc_ring *r, uint32_t o)
{
    return r->stage + (size_t)o * r->stage_slot + r->ops[o].done;
}

/* Queues op o on the ring.  The SQ has room: it has qd entries and at
 * most qd ops are in flight. */
static void op_queue(fill_ctx *c, uint32_t o)
{
    fc_ring *r = c->r;
    fc_op *op = &r->ops[o];
    const fc_miss *m = &r->miss[r->uniq[op->u].first];
    fc_seg *g = &m->ft->seg[op->seg];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    io_uring_prep_read(sqe, op->direct ? g->dfd : g->fd, op_buf(r, o),
                       (unsigned)op_read_len(op, g), op_offset(r, op, g));
    io_uring_sqe_set_data64(sqe, o);
}

/* Runs op o with pread (rings without io_uring, and retries). */
static int op_pread(fill_ctx *c, uint32_t o)
{
    fc_ring *r = c->r;
    fc_op *op = &r->ops[o];
    const fc_miss *m = &r->miss[r->uniq[op->u].first];
    fc_seg *g = &m->ft->seg[op->seg];
    ssize_t n;
    do
        n = pread(op->direct ? g->dfd : g->fd, op_buf(r, o), (size_t)op_read_len(op, g),
                  (off_t)op_offset(r, op, g));
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : (int)n;
}

/* A distinct row whose reads all arrived: copy it to every output row
 * that asked for it, then cache it. */
static void row_done(fill_ctx *c, uint32_t u)
{
    fc_ring *r = c->r;
    fc_uniq *q = &r->uniq[u];
    fc_table *ft = r->miss[q->first].ft;
    unsigned char *pieces[ENGRAM__FC_MAX_SEGS];
    for (unsigned g = 0; g < ft->nseg; g++)
        pieces[g] = r->stage + (size_t)q->slot[g] * r->stage_slot + r->ops[q->slot[g]].skip;
    for (uint32_t e = q->first; e < q->first + q->count; e++) {
        unsigned char *d = c->dsts[r->miss[e].idx];
        for (unsigned g = 0; g < ft->nseg; g++)
            memcpy(d + ft->seg[g].dst_off, pieces[g], ft->seg[g].len);
    }
    cache_put(ft, r->miss[q->first].row, pieces);
}

/* Handles the result `res` of a read of op o.  Returns 1 when the op
 * needs another read, already set up in r->ops[o]: an O_DIRECT read the
 * file system refused (redone buffered), a read that failed with -EAGAIN
 * or -EINTR (retried, OP_RETRIES times at most), or a short read that is
 * not at the end of the file (the rest is read).  The caller queues it or
 * runs it (op_run()).  Returns 0 once the op is over, well or not. */
static int op_complete(fill_ctx *c, uint32_t o, int res)
{
    fc_ring *r = c->r;
    fc_op *op = &r->ops[o];
    fc_uniq *q = &r->uniq[op->u];
    const fc_miss *m = &r->miss[q->first];
    fc_table *ft = m->ft;
    fc_seg *g = &ft->seg[op->seg];
    fc_counters *ctr = &ft->ctr[c->shard];

    res = apply_hook(m->t->name, m->row, op->seg, res, op_buf(r, o));
    if (res > 0)
        engram__ctr_add(&ctr->bytes, (uint64_t)res, c->excl);
    if (res == -EINVAL && op->direct) {
        /* The file system refused this direct read after all: read this
         * segment buffered from now on, starting with this row. */
        atomic_store_explicit(&g->direct, 0, memory_order_relaxed);
        op_setup(c, o, op->u, op->seg);
        engram__ctr_add(&ctr->reads, 1, c->excl);
        return 1;
    }
    if ((res == -EAGAIN || res == -EINTR) && op->again < OP_RETRIES) {
        /* Transient: io_uring can pass either up from a file system or a
         * device that is out of request slots.  The same read again. */
        op->again++;
        engram__ctr_add(&ctr->reads, 1, c->excl);
        return 1;
    }
    if (res > 0 && (uint64_t)op->done + (uint64_t)res < op->want) {
        /* A short read.  Local file systems return one only at the end of
         * the file, but FUSE (direct_io) and network file systems may
         * return one anywhere, and a signal can cut a read short.  Read
         * the rest, buffered (any offset and length will do); a read that
         * returns nothing there is the end of the file.  Each read returns
         * at least one byte, so this ends. */
        op->done += (uint32_t)res;
        op->direct = 0;
        engram__ctr_add(&ctr->reads, 1, c->excl);
        return 1;
    }
    if (res <= 0) {
        uint32_t got = op->done > op->skip ? op->done - op->skip : 0;
        engram__ctr_add(&ctr->errors, 1, c->excl);
        if (!q->failed && c->err == 0) {
            if (res < 0)
                c->err = engram__errno(-res, "table '%s': read of row %" PRIu64
                                       " (%u bytes at offset %" PRIu64 ")",
                                       m->t->name, m->row, g->len,
                                       g->base + m->row * g->stride);
            else
                c->err = engram__err(ENGRAM_ECORRUPT,
                                     "table '%s': read of row %" PRIu64 " returned %u of %u "
                                     "bytes at offset %" PRIu64 ": the file is shorter than "
                                     "its header says (truncated?)",
                                     m->t->name, m->row, got, g->len,
                                     g->base + m->row * g->stride);
        }
        q->failed = 1;
    }
    if (--q->left == 0) {
        if (!q->failed)
            row_done(c, op->u);
        for (unsigned s = 0; s < ft->nseg; s++)
            r->free_slots[c->nfree++] = q->slot[s];
    }
    return 0;
}

/* Runs op o to its end with pread (rings without io_uring). */
static void op_run(fill_ctx *c, uint32_t o)
{
    while (op_complete(c, o, op_pread(c, o)))
        ;
}

/* Issues the reads of distinct rows u >= *next while staging slots are
 * free.  Returns how many ops were queued on the ring. */
static uint32_t issue(fill_ctx *c, uint32_t *next)
{
    fc_ring *r = c->r;
    uint32_t queued = 0;
    while (*next < c->nu && c->err == 0) {
        uint32_t u = *next;
        fc_uniq *q = &r->uniq[u];
        fc_table *ft = r->miss[q->first].ft;
        if (c->nfree < ft->nseg)
            break;
        q->left = ft->nseg;
        for (unsigned g = 0; g < ft->nseg; g++) {
            uint32_t o = r->free_slots[--c->nfree];
            q->slot[g] = o;
            op_setup(c, o, u, g);
            engram__ctr_add(&ft->ctr[c->shard].reads, 1, c->excl);
            if (r->state == 1) {
                op_queue(c, o);
                queued++;
            } else {
                op_run(c, o);
            }
        }
        (*next)++;
    }
    return queued;
}

/* After io_uring_enter() failed for good: no read of this call may outlive
 * it, because the next call on the ring reuses the staging slots and op
 * indices.  The reads the kernel took are reaped (they complete; their
 * rows stay unwritten); the SQ entries it did not take would go out with
 * the next call's submit and complete into that call, so they are dropped
 * with the ring, which the next call sets up again. */
static void ring_abandon(fill_ctx *c)
{
    fc_ring *r = c->r;
    unsigned pending = io_uring_sq_ready(&r->ring);
    uint32_t taken = c->inflight > pending ? c->inflight - pending : 0;
    while (taken > 0) {
        struct io_uring_cqe *cqe;
        int e = io_uring_wait_cqe(&r->ring, &cqe);
        if (e == -EINTR || e == -EAGAIN)
            continue;
        if (e < 0)
            break;
        io_uring_cqe_seen(&r->ring, cqe);
        taken--;
    }
    if (taken > 0) {
        /* Reads we could not reap may still write into the staging
         * buffer: leave it to them (leaked) rather than reuse it. */
        r->stage = NULL;
        r->stage_slot = 0;
    }
    io_uring_queue_exit(&r->ring);
    r->state = 0;
    c->inflight = 0;
}

static int cmp_miss(const void *a, const void *b)
{
    const fc_miss *x = a, *y = b;
    if (x->ft != y->ft)
        return (uintptr_t)x->ft < (uintptr_t)y->ft ? -1 : 1;
    if (x->row != y->row)
        return x->row < y->row ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Reads the `nm` missed rows listed in r->miss and serves them. */
static int fill_misses(engram__fcache *fc, fc_ring *r, uint32_t nm, unsigned char *const *dsts,
                       unsigned shard, int excl)
{
    fill_ctx c = {fc, r, dsts, 0, 0, 0, 0, shard, excl};
    size_t span = 0;
    uint32_t next = 0;
    int err;

    for (uint32_t i = 0; i < nm; i++)
        for (unsigned g = 0; g < r->miss[i].ft->nseg; g++)
            if (seg_span(&r->miss[i].ft->seg[g]) > span)
                span = seg_span(&r->miss[i].ft->seg[g]);
    if ((err = ring_ready(fc, r, span)) != 0)
        return err;
    /* Distinct rows: sort by (table, row), then one entry per run. */
    if (nm > 1)
        qsort(r->miss, nm, sizeof *r->miss, cmp_miss);
    for (uint32_t i = 0; i < nm;) {
        uint32_t j = i + 1;
        while (j < nm && r->miss[j].ft == r->miss[i].ft && r->miss[j].row == r->miss[i].row)
            j++;
        r->uniq[c.nu] = (fc_uniq){i, j - i, 0, {0}, 0};
        c.nu++;
        engram__ctr_add(&r->miss[i].ft->ctr[shard].misses, j - i, excl);
        if (j - i > 1)
            engram__ctr_add(&r->miss[i].ft->ctr[shard].dedup, j - i - 1, excl);
        i = j;
    }
    for (uint32_t s = 0; s < fc->qd; s++)
        r->free_slots[s] = fc->qd - 1 - s;
    c.nfree = fc->qd;

    for (;;) {
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        c.inflight += issue(&c, &next);
        if (c.inflight == 0)
            break;
        if ((err = io_uring_submit_and_wait(&r->ring, 1)) < 0 && err != -EINTR &&
            err != -EAGAIN && err != -EBUSY) {
            if (c.err == 0)
                c.err = engram__errno(-err, "io_uring_submit");
            ring_abandon(&c);
            break;
        }
        io_uring_for_each_cqe(&r->ring, head, cqe)
        {
            uint32_t o = (uint32_t)io_uring_cqe_get_data64(cqe);
            seen++;
            /* Another read of the op takes the SQ entry its last one
             * freed: the SQ has qd entries, at most qd ops are in flight. */
            if (op_complete(&c, o, cqe->res))
                op_queue(&c, o);
            else
                c.inflight--;
        }
        io_uring_cq_advance(&r->ring, seen);
    }
    if (c.err == 0 && next < c.nu)
        c.err = engram__err(-EIO, "row cache: %u of %u rows were not read", c.nu - next, c.nu);
    return c.err;
}

/* ------------------------------------------------------------------------
 * The backend.
 */

static void maybe_log(engram__fcache *fc);

static int fc_read_rows(size_t n, engram__table *const *tabs, const uint64_t *rows,
                        unsigned char *const *dsts)
{
    engram__fcache *fc = ((fc_table *)tabs[0]->state)->fc;
    fc_ring *r = NULL;
    uint32_t nm = 0;
    unsigned shard;
    int excl, err = 0;

    ENGRAM__ASSERT(n <= BATCH); /* the plan's calls never carry more (backend.h) */
    shard = engram__shard(&excl);
    for (size_t i = 0; i < n; i++) {
        fc_table *ft = tabs[i]->state;
        if (i + PF_SET < n)
            prefetch_set(tabs[i + PF_SET]->state, rows[i + PF_SET]);
        if (i + PF_SLOT < n)
            prefetch_slot(tabs[i + PF_SLOT]->state, rows[i + PF_SLOT]);
        if (cache_get(ft, rows[i], dsts[i])) {
            engram__ctr_add(&ft->ctr[shard].hits, 1, excl);
            continue;
        }
        /* The first miss takes a ring, whose list then collects the
         * misses: an all-hit call takes no ring at all. */
        if (!r) {
            r = ring_take(fc);
            if ((err = ring_reserve(r, n)) != 0)
                break;
        }
        r->miss[nm++] = (fc_miss){ft, tabs[i], rows[i], (uint32_t)i};
    }
    if (r) {
        if (err == 0)
            err = fill_misses(fc, r, nm, dsts, shard, excl);
        pthread_mutex_unlock(&r->lock);
    }
    if (fc->log_ns)
        maybe_log(fc);
    return err;
}

static void fc_table_free(fc_table *ft)
{
    if (!ft)
        return;
    for (unsigned g = 0; g < ft->nseg; g++) {
        if (ft->seg[g].fd >= 0)
            close(ft->seg[g].fd);
        if (ft->seg[g].dfd >= 0)
            close(ft->seg[g].dfd);
    }
    if (ft->sets)
        munmap(ft->sets, ft->sets_len);
    if (ft->data)
        munmap(ft->data, ft->data_len);
    free(ft);
}

static void fc_release(engram__table *t)
{
    fc_table_free(t->state);
    t->state = NULL;
}

static const engram__backend_ops fc_ops = {ENGRAM__BACKEND_VERSION, "file-cache", fc_read_rows,
                                           fc_release};

void engram__fcache_free_state(void *state)
{
    fc_table *ft = state;
    if (ft) {
        /* No table took it: give its share of the budget back, or every
         * failed open (a name that exists, ...) would shrink the cache of
         * the tables opened after it. */
        engram_store *st = ft->fc->st;
        pthread_mutex_lock(&st->lock);
        ft->fc->assigned -= ft->cache_bytes;
        if (!ft->in_namespace)
            ft->fc->extra -= ft->size_bytes;
        pthread_mutex_unlock(&st->lock);
    }
    fc_table_free(ft);
}

/* ------------------------------------------------------------------------
 * Setting tables up.
 */

static engram__fcache *fcache_get_locked(engram_store *st)
{
    engram__fcache *fc = st->fcache;
    const char *env;
    if (fc)
        return fc;
    fc = calloc(1, sizeof *fc);
    if (!fc) {
        engram__err(-ENOMEM, "out of memory for the row cache");
        return NULL;
    }
    fc->st = st;
    fc->budget = st->opts.cache_bytes ? st->opts.cache_bytes : ENGRAM__FC_DEFAULT_BUDGET;
    fc->qd = st->opts.queue_depth ? st->opts.queue_depth : ENGRAM__FC_DEFAULT_QD;
    /* A row of two segments needs two staging slots at once. */
    if (fc->qd < ENGRAM__FC_MAX_SEGS)
        fc->qd = ENGRAM__FC_MAX_SEGS;
    if (st->opts.cache_log_ms)
        fc->log_ns = (uint64_t)st->opts.cache_log_ms * 1000000u;
    else if ((env = getenv("ENGRAM_CACHE_LOG_MS")) != NULL && atol(env) > 0)
        fc->log_ns = (uint64_t)atol(env) * 1000000u;
    atomic_init(&fc->next_log_ns, engram__now_ns() + fc->log_ns);
    /* A ring per gather thread and a few more for lookups from other
     * threads; a lookup that misses waits only when all are busy. */
    fc->nrings = (unsigned)st->threads + 2;
    if (fc->nrings > sizeof fc->rings / sizeof fc->rings[0])
        fc->nrings = sizeof fc->rings / sizeof fc->rings[0];
    for (unsigned i = 0; i < fc->nrings; i++) {
        fc_ring *r = calloc(1, sizeof *r);
        if (!r) {
            engram__fcache_destroy(fc);
            engram__err(-ENOMEM, "out of memory for the row cache");
            return NULL;
        }
        pthread_mutex_init(&r->lock, NULL);
        fc->rings[i] = r;
    }
    st->fcache = fc;
    return fc;
}

void engram__fcache_destroy(engram__fcache *fc)
{
    if (!fc)
        return;
    for (unsigned i = 0; i < fc->nrings; i++)
        ring_free(fc->rings[i]);
    free(fc);
}

/* Bytes of the namespace's table files (the budget rule's denominator). */
static uint64_t namespace_bytes(engram_store *st)
{
    uint64_t sum = 0;
    struct dirent *de;
    DIR *d;
    int fd;
    if (st->dirfd < 0)
        return 0;
    if ((fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return 0;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return 0;
    }
    while ((de = readdir(d)) != NULL) {
        struct stat sb;
        if (engram__name_valid(de->d_name) &&
            fstatat(st->dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode))
            sum += (uint64_t)sb.st_size;
    }
    closedir(d);
    return sum;
}

/* Decides whether segment g reads with O_DIRECT, and its alignment. */
static void seg_direct_setup(fc_seg *g, const char *what)
{
    struct statx sx;
    struct statfs fs;
    struct stat a, b;
    char path[64];
    void *buf = NULL;
    uint32_t align = 4096;
    int dfd, res;

    g->dfd = -1;
    atomic_init(&g->direct, 0);
    /* Memory file systems have no device to bypass: direct reads there
     * would only add the alignment (tmpfs accepts O_DIRECT since 6.6). */
    if (fstatfs(g->fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC))
        return;
#ifdef STATX_DIOALIGN
    if (statx(g->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
        (sx.stx_mask & STATX_DIOALIGN)) {
        /* The file system says what it supports; 0 means no direct I/O
         * (tmpfs).  Kernels before 6.1 say nothing: then try 4 KiB. */
        if (sx.stx_dio_offset_align == 0)
            return;
        align = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align
                                                                : sx.stx_dio_mem_align;
        if (align > STAGE_ALIGN || (align & (align - 1)))
            return;
    }
#else
    (void)sx;
#endif
    /* A second open file description of the very same file (through
     * /proc, not by name again), so no one can swap the file between the
     * checks made on fd and this open. */
    snprintf(path, sizeof path, "/proc/self/fd/%d", g->fd);
    dfd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (dfd < 0)
        return;
    if (fstat(dfd, &a) != 0 || fstat(g->fd, &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino || posix_memalign(&buf, STAGE_ALIGN, align) != 0) {
        close(dfd);
        return;
    }
    do
        res = (int)pread(dfd, buf, align, 0);
    while (res < 0 && errno == EINTR);
    if (res < 0)
        res = -errno;
    res = apply_hook(what, UINT64_MAX, 0, res, buf);
    free(buf);
    if (res < 0) {
        close(dfd);
        return;
    }
    g->dfd = dfd;
    g->align = align;
    atomic_store_explicit(&g->direct, 1, memory_order_relaxed);
}

/* Zeroed memory for sets or slots.  With `populate` (the store's
 * ENGRAM_OPEN_PREFAULT) every page is touched now, so no lookup pays a
 * first-touch fault (~0.5 GB/s for fresh memory on a VM). */
static void *map_zeroed(size_t len, int huge, int populate)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* Huge pages for the slots: random hits then cost no TLB miss each.
     * Only a hint; without them the cache works the same.  It must come
     * before the first touch. */
    if (huge)
        (void)madvise(p, len, MADV_HUGEPAGE);
    if (populate)
        for (size_t o = 0; o < len; o += 4096)
            ((volatile unsigned char *)p)[o] = 0;
    return p;
}

int engram__fcache_new_table(engram_store *st, const engram__fc_seg *segs, unsigned nseg,
                             uint64_t num_rows, uint64_t size_bytes, const char *what,
                             unsigned flags, const engram__backend_ops **ops, void **state)
{
    const int locked = (flags & ENGRAM__FC_LOCKED) != 0;
    engram__fcache *fc;
    fc_table *ft = NULL;
    uint64_t total, extra, share, left, slots, max_sets;
    uint32_t off = 0;
    int err = 0, prefault;

    *state = NULL;
    if (!locked)
        pthread_mutex_lock(&st->lock);
    if (nseg == 0 || nseg > ENGRAM__FC_MAX_SEGS) {
        err = engram__err(-EINVAL, "%s: %u segments", what, nseg);
        goto fail;
    }
    if (st->opts.queue_depth > ENGRAM__FC_MAX_QD) {
        err = engram__err(-EINVAL, "queue_depth is %u (at most %u)", st->opts.queue_depth,
                          ENGRAM__FC_MAX_QD);
        goto fail;
    }
    if (!(fc = fcache_get_locked(st))) {
        err = -ENOMEM;
        goto fail;
    }
    if (!(ft = aligned_alloc(ENGRAM__CACHELINE,
                             engram__align_up(sizeof *ft, ENGRAM__CACHELINE)))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto fail;
    }
    memset(ft, 0, sizeof *ft);
    ft->fc = fc;
    ft->nseg = nseg;
    ft->in_namespace = (flags & ENGRAM__FC_IN_NAMESPACE) != 0;
    for (unsigned g = 0; g < nseg; g++) {
        ft->seg[g].fd = -1;
        ft->seg[g].dfd = -1;
    }
    for (unsigned g = 0; g < nseg; g++) {
        fc_seg *s = &ft->seg[g];
        s->fd = segs[g].fd;
        s->base = segs[g].base;
        s->stride = segs[g].stride;
        s->len = segs[g].len;
        s->file_size = segs[g].file_size;
        s->dst_off = off;
        off += s->len;
        seg_direct_setup(s, what);
    }
    ft->row_bytes = off;
    ft->slot_bytes = (uint32_t)engram__align_up(off, 16);
    ft->size_bytes = size_bytes;

    /* The budget rule (engram.h): a share proportional to the table's size
     * among the namespace's files and the safetensors tables so far,
     * capped by what is left and by the table itself, at least one set. */
    extra = fc->extra + (ft->in_namespace ? 0 : size_bytes); /* kept only on success */
    total = namespace_bytes(st) + extra;
    if (total < size_bytes)
        total = size_bytes;
    share = (uint64_t)(((unsigned __int128)fc->budget * size_bytes) / total);
    left = fc->budget > fc->assigned ? fc->budget - fc->assigned : 0;
    if (share > left)
        share = left;
    slots = share / ft->slot_bytes;
    max_sets = (num_rows + WAYS - 1) / WAYS;
    ft->nsets = slots / WAYS;
    if (ft->nsets > max_sets)
        ft->nsets = max_sets;
    if (ft->nsets == 0)
        ft->nsets = 1;
    ft->sets_len = (size_t)engram__align_up(ft->nsets * sizeof(fc_set), 4096);
    ft->data_len = (size_t)engram__align_up(ft->nsets * WAYS * (uint64_t)ft->slot_bytes, 4096);
    ft->cache_bytes = ft->nsets * WAYS * (uint64_t)ft->slot_bytes;
    prefault = (st->opts.flags & ENGRAM_OPEN_PREFAULT) != 0;
    if (!(ft->sets = map_zeroed(ft->sets_len, 0, prefault)) ||
        !(ft->data = map_zeroed(ft->data_len, 1, prefault))) {
        err = engram__errno(errno, "%s: map %llu bytes of row cache", what,
                            (unsigned long long)ft->cache_bytes);
        goto fail;
    }
    fc->assigned += ft->cache_bytes;
    fc->extra = extra;
    if (!locked)
        pthread_mutex_unlock(&st->lock);
    *ops = &fc_ops;
    *state = ft;
    return 0;
fail:
    if (!locked)
        pthread_mutex_unlock(&st->lock);
    if (ft) {
        fc_table_free(ft); /* closes the segments it took */
    } else {
        for (unsigned g = 0; g < nseg && g < ENGRAM__FC_MAX_SEGS; g++)
            close(segs[g].fd);
    }
    return err;
}

int engram__fcache_attach_file(engram_store *st, engram__table *t, int fd)
{
    engram__fc_seg seg;
    const engram__backend_ops *ops;
    void *state;
    int err, dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dfd < 0)
        return engram__errno(errno, "dup descriptor of table '%s'", t->name);
    seg.fd = dfd;
    seg.base = t->hdr.data_offset;
    seg.stride = t->hdr.row_pitch;
    seg.len = t->hdr.row_bytes;
    seg.file_size = t->hdr.data_offset + t->hdr.data_size;
    if ((err = engram__fcache_new_table(st, &seg, 1, t->hdr.num_rows, seg.file_size, t->name,
                                        ENGRAM__FC_LOCKED | ENGRAM__FC_IN_NAMESPACE, &ops,
                                        &state)) != 0)
        return err;
    t->base = NULL;
    t->ops = ops;
    t->state = state;
    return 0;
}

/* ------------------------------------------------------------------------
 * Stats.
 */

static void add_table_stats(const fc_table *ft, engram_cache_stats *s)
{
    int direct = 1;
    s->tables++;
    for (unsigned g = 0; g < ft->nseg; g++)
        direct &= ft->seg[g].dfd >= 0 &&
                  atomic_load_explicit(&ft->seg[g].direct, memory_order_relaxed);
    s->direct_tables += (uint64_t)direct;
    for (int i = 0; i < ENGRAM__SHARDS; i++) {
        const fc_counters *c = &ft->ctr[i];
        s->hits += atomic_load_explicit(&c->hits, memory_order_relaxed);
        s->misses += atomic_load_explicit(&c->misses, memory_order_relaxed);
        s->dedup += atomic_load_explicit(&c->dedup, memory_order_relaxed);
        s->reads += atomic_load_explicit(&c->reads, memory_order_relaxed);
        s->bytes_read += atomic_load_explicit(&c->bytes, memory_order_relaxed);
        s->read_errors += atomic_load_explicit(&c->errors, memory_order_relaxed);
    }
    s->cache_bytes += ft->cache_bytes;
    s->slots += ft->nsets * WAYS;
}

int engram_get_cache_stats(engram_store *st, const char *name, engram_cache_stats *s)
{
    int err = 0;
    if (!st || !s || s->size != sizeof(engram_cache_stats))
        return engram__err(-EINVAL, "store and stats (with size = sizeof(engram_cache_stats)) "
                                    "are required");
    if (name && (err = engram_name_check(name)) != 0)
        return err;
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    s->ways = WAYS;
    pthread_mutex_lock(&st->lock);
    s->budget_bytes = st->fcache ? st->fcache->budget
                      : st->opts.cache_bytes ? st->opts.cache_bytes
                                             : ENGRAM__FC_DEFAULT_BUDGET;
    s->queue_depth = st->fcache ? st->fcache->qd
                     : st->opts.queue_depth ? st->opts.queue_depth
                                            : ENGRAM__FC_DEFAULT_QD;
    if (name) {
        engram__table *t = engram__find_locked(st, name, NULL);
        if (!t || t->ops != &fc_ops)
            err = engram__err(-ENOENT, "table '%s' is not an open cache-backed table", name);
        else
            add_table_stats(t->state, s);
    } else {
        for (uint32_t i = 0; i < st->ntables; i++) {
            engram__table *t = engram__table_get(st, i);
            if (t->ops == &fc_ops && !atomic_load_explicit(&t->removed, memory_order_relaxed))
                add_table_stats(t->state, s);
        }
    }
    pthread_mutex_unlock(&st->lock);
    return err;
}

/* One stats line on stderr when the log interval has passed; the CAS
 * makes exactly one of the lookups that notice it print. */
static void maybe_log(engram__fcache *fc)
{
    engram_cache_stats s = ENGRAM_CACHE_STATS_INIT;
    uint64_t now = engram__now_ns(), due;
    due = atomic_load_explicit(&fc->next_log_ns, memory_order_relaxed);
    if (now < due || !atomic_compare_exchange_strong_explicit(&fc->next_log_ns, &due,
                                                              now + fc->log_ns,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed))
        return;
    if (engram_get_cache_stats(fc->st, NULL, &s) != 0)
        return;
    fprintf(stderr,
            "engram: cache %s: hit rate %.1f%% (%" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
            " deduplicated), %" PRIu64 " reads, %.1f MiB read, %" PRIu64 " errors, %.1f MiB in %"
            PRIu64 " slots (%u ways), %" PRIu64 "/%" PRIu64 " tables O_DIRECT\n",
            fc->st->path,
            s.hits + s.misses ? 100.0 * (double)s.hits / (double)(s.hits + s.misses) : 0.0,
            s.hits, s.misses, s.dedup, s.reads, (double)s.bytes_read / 1048576.0,
            s.read_errors, (double)s.cache_bytes / 1048576.0, s.slots, s.ways, s.direct_tables,
            s.tables);
}
