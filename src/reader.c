/*
 * reader.c - reading rows of files with io_uring (see reader.h).
 *
 * A call of engram__reader_read_rows() gets distinct rows (fetch.c
 * deduplicated them) and reads them on one ring:
 *
 *   Each row takes a staging slot per segment; its reads go on the ring,
 *   up to the ring's slots in flight.  As each read completes it is
 *   checked: a short read is completed by a read of the rest, -EAGAIN,
 *   -EINTR and -ECANCELED are retried, and a read that returns nothing
 *   before the row's
 *   end is a truncated file.  When all of a row's reads are in, the row is
 *   copied to its destination and marked done; a row whose read failed is
 *   never copied.  Each completion frees its slots, which the next row's
 *   reads take at once, so the queue stays full over all the rows of the
 *   call and drains only at its end.
 *
 * Rings are a small set per reader, each with its own lock, staging and
 * op slots; a call takes any free one.  How many rings are used, how many
 * reads each keeps in flight and how big a staging slot is form one
 * configuration word, decided when a table is admitted from the staging
 * the budget grants (see plan_config()) and read by calls without a lock.
 *
 * O_DIRECT: a segment is reopened with O_DIRECT when the file system
 * reports direct I/O alignment (statx STATX_DIOALIGN) and a probe read
 * works; its reads then cover the aligned blocks around the row.
 * Elsewhere (tmpfs reports no alignment) reads are buffered.  A direct
 * read that still fails with EINVAL switches its segment to buffered reads
 * for good and is retried.
 *
 * fork(): a child process shares the parent's rings (their submission
 * queues are shared memory) and may inherit their locks held.  The rings
 * therefore carry the fork generation they were made in; a call in a
 * process of a later generation replaces the whole set with fresh rings of
 * its own and never touches the inherited ones, which stay the parent's.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/magic.h>
#include <liburing.h>

#include "common.h"
#include "reader.h"
#include "rowcache.h"

#define MAX_SEGS ENGRAM__RD_MAX_SEGS
#define DIRECT_ALIGN 4096u  /* staging alignment with O_DIRECT segments */
#define BUFFERED_ALIGN 64u  /* staging alignment otherwise */
#define OP_RETRIES 16       /* retries of a read that failed with -EAGAIN, -EINTR or
                             * -ECANCELED */
#define MAX_RINGS 64
/* The reader's share of the budget: at most this fraction for staging. */
#define STAGING_SHARE 8

/* ------------------------------------------------------------------------
 * State.
 */

/* One read in flight, in the staging slot of its own index. */
typedef struct rd_op {
    uint32_t row;    /* index of its row's state (the row's first slot) */
    uint32_t seg;
    uint32_t skip;   /* bytes before the row's bytes in the slot */
    uint32_t want;   /* bytes the slot must hold: skip + the segment's bytes */
    uint32_t done;   /* bytes already in the slot (a short read's first part) */
    uint32_t again;  /* reads retried after -EAGAIN, -EINTR or -ECANCELED */
    int direct;      /* the next read goes to the O_DIRECT descriptor */
} rd_op;

/* A row in flight, at the index of its first slot. */
typedef struct rd_row {
    size_t req;                 /* its request */
    uint32_t left;              /* reads not yet completed */
    uint32_t slot[MAX_SEGS];
    int failed;
} rd_row;

typedef struct rd_ring {
    pthread_mutex_t lock;
    int state;            /* 0 not set up, 1 io_uring, -1 io_uring unavailable: pread */
    uint32_t qd;          /* slots (and SQ entries) it was set up with */
    struct io_uring ring;
    unsigned char *stage; /* qd slots of stage_slot bytes */
    size_t stage_slot;
    rd_op *ops;           /* [qd] */
    rd_row *rows;         /* [qd] */
    uint32_t *free_slots; /* [qd] stack of free slots */
} rd_ring;

/* The rings of one process. */
typedef struct rd_set {
    unsigned gen;          /* fork generation they were made in */
    struct rd_set *retired; /* older sets, freed at destroy */
    rd_ring rings[];
} rd_set;

/* Bytes a ring holds besides its staging slots, and per slot besides the
 * staging: what the budget is charged (the SQ and CQ entries and rings
 * are the kernel's memory, mapped into ours). */
#define RING_FIXED ((uint64_t)sizeof(rd_ring) + 3 * 4096)
#define PER_SLOT ((uint64_t)sizeof(rd_op) + sizeof(rd_row) + sizeof(uint32_t) + 64 + 2 * 16)

/* The configuration word: slot bytes | slots per ring << 32 | rings << 48. */
#define CFG(slot, qd, nr) ((uint64_t)(slot) | ((uint64_t)(qd) << 32) | ((uint64_t)(nr) << 48))
#define CFG_SLOT(c) ((uint32_t)(c))
#define CFG_QD(c) ((uint32_t)((c) >> 32) & 0xffffu)
#define CFG_NR(c) ((unsigned)((c) >> 48))

struct engram__reader {
    engram__cbudget *budget;
    uint32_t qd;                /* reads in flight per ring at most, as asked */
    unsigned nrings;            /* rings at most */
    pthread_mutex_t admit_lock; /* admissions: the fields below and cfg */
    uint32_t max_span;          /* staging bytes of one segment's read, largest admitted */
    unsigned max_seg;           /* segments of a row, most admitted */
    int any_direct;             /* some admitted segment reads with O_DIRECT */
    _Atomic uint64_t cfg;       /* 0 until the first admission */
    _Atomic(rd_set *) set;
};

static _Atomic unsigned fork_gen;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void)
{
    atomic_fetch_add_explicit(&fork_gen, 1, memory_order_relaxed);
}

static void atfork_init(void)
{
    (void)pthread_atfork(NULL, NULL, on_fork_child);
}

static _Atomic(engram__read_hook) g_hook;
static void *_Atomic g_hook_ud;

void engram__reader_set_hook(engram__read_hook fn, void *ud)
{
    atomic_store_explicit(&g_hook_ud, ud, memory_order_relaxed);
    /* Release: a reader that sees the hook sees its argument. */
    atomic_store_explicit(&g_hook, fn, memory_order_release);
}

static int apply_hook(const char *table, uint64_t row, unsigned seg, int res, unsigned char *data)
{
    engram__read_hook fn = atomic_load_explicit(&g_hook, memory_order_acquire);
    if (ENGRAM__LIKELY(!fn))
        return res;
    return fn(atomic_load_explicit(&g_hook_ud, memory_order_relaxed), table, row, seg, res, data);
}

/* ------------------------------------------------------------------------
 * Rings.
 */

static rd_set *set_new(unsigned nrings, unsigned gen)
{
    rd_set *s = calloc(1, sizeof *s + nrings * sizeof(rd_ring));
    if (!s)
        return NULL;
    s->gen = gen;
    for (unsigned i = 0; i < nrings; i++)
        pthread_mutex_init(&s->rings[i].lock, NULL);
    return s;
}

/* Frees what ring r holds; it is set up again at its next use. */
static void ring_teardown(rd_ring *r)
{
    if (r->state == 1)
        io_uring_queue_exit(&r->ring);
    r->state = 0;
    free(r->stage);
    free(r->ops);
    free(r->rows);
    free(r->free_slots);
    r->stage = NULL;
    r->stage_slot = 0;
    r->ops = NULL;
    r->rows = NULL;
    r->free_slots = NULL;
    r->qd = 0;
}

/* Makes ring r (locked) match configuration `cfg`: `qd` slots of at
 * least `slot` bytes and its io_uring (or pread where io_uring cannot be
 * set up). */
static int ring_ready(rd_ring *r, uint64_t cfg)
{
    uint32_t qd = CFG_QD(cfg);
    size_t slot = CFG_SLOT(cfg);
    if (r->qd != qd)
        ring_teardown(r);
    if (r->state == 0) {
        r->ops = calloc(qd, sizeof *r->ops);
        r->rows = calloc(qd, sizeof *r->rows);
        r->free_slots = calloc(qd, sizeof *r->free_slots);
        if (!r->ops || !r->rows || !r->free_slots) {
            ring_teardown(r);
            return engram__err(-ENOMEM, "out of memory for an io_uring ring");
        }
        r->qd = qd;
        /* Any failure here means no io_uring for this ring, not a failed
         * lookup: ENOSYS, EPERM or EACCES where it is disabled
         * (kernel.io_uring_disabled, seccomp: containers), ENOMEM where the
         * ring's memory counts against a small RLIMIT_MEMLOCK (kernels
         * before 5.12, containers again), EMFILE, ...  The same reads
         * then run one pread at a time. */
        int qerr = io_uring_queue_init(qd, &r->ring, 0);
        r->state = qerr == 0 ? 1 : -1;
        if (qerr != 0) {
            /* Once per process: every ring of every store would say the
             * same. */
            static atomic_flag told = ATOMIC_FLAG_INIT;
            if (!atomic_flag_test_and_set_explicit(&told, memory_order_relaxed))
                engram__log(ENGRAM_LOG_WARN, 0, "io_uring is unavailable (%s): rows behind "
                                                "the row cache are read one pread at a time",
                            engram_strerror(qerr));
        }
    }
    if (slot > r->stage_slot) {
        void *p = NULL;
        free(r->stage);
        r->stage = NULL;
        r->stage_slot = 0;
        /* Page aligned whatever the slots: O_DIRECT needs it where the
         * configuration has direct segments, and it costs nothing. */
        if (posix_memalign(&p, DIRECT_ALIGN, slot * qd) != 0)
            return engram__err(-ENOMEM, "out of memory for %u staging slots of %zu bytes", qd,
                               slot);
        r->stage = p;
        r->stage_slot = slot;
    }
    return 0;
}

/* This process's rings: the reader's set, or a fresh one in a child of
 * the process that made it.  NULL when out of memory. */
static rd_set *current_set(engram__reader *rd)
{
    unsigned gen = atomic_load_explicit(&fork_gen, memory_order_relaxed);
    /* Acquire pairs with the release CAS below: a set's rings are
     * initialised before the set is seen. */
    rd_set *s = atomic_load_explicit(&rd->set, memory_order_acquire), *fresh;
    while (ENGRAM__UNLIKELY(s->gen != gen)) {
        /* Every thread of the child that gets here makes a set; one wins
         * and the others free theirs.  The parent's set is never used
         * again here: it is kept on the retired list (freed at destroy,
         * without touching its rings' locks). */
        if (!(fresh = set_new(rd->nrings, gen)))
            return NULL;
        fresh->retired = s;
        if (atomic_compare_exchange_strong_explicit(&rd->set, &s, fresh, memory_order_release,
                                                    memory_order_acquire))
            return fresh;
        for (unsigned i = 0; i < rd->nrings; i++)
            pthread_mutex_destroy(&fresh->rings[i].lock);
        free(fresh);
    }
    return s;
}

/* Takes a free ring of the current configuration's, or waits for the one
 * this thread's stats slot maps to, and returns it locked with the
 * configuration in *cfg.  The configuration is read again once the ring
 * is held: an admission that shrank the rings tears the ones it left out
 * down under their locks, so a ring that is no longer in the
 * configuration read under its lock is given back (and never set up
 * again outside the budget). */
static rd_ring *ring_take(engram__reader *rd, rd_set *s, uint64_t *cfg)
{
    int excl;
    unsigned start = engram__stats_slot(&excl);
    for (;;) {
        /* Acquire pairs with the release store of the admission that made
         * the tables of a call's rows visible: the configuration covers
         * them (slots and segments only grow). */
        uint64_t c = atomic_load_explicit(&rd->cfg, memory_order_acquire);
        unsigned nr = CFG_NR(c), i;
        rd_ring *r = NULL;
        for (i = 0; i < nr && !r; i++)
            if (pthread_mutex_trylock(&s->rings[(start + i) % nr].lock) == 0)
                r = &s->rings[(start + i) % nr];
        if (!r) {
            r = &s->rings[start % nr];
            pthread_mutex_lock(&r->lock);
        }
        c = atomic_load_explicit(&rd->cfg, memory_order_acquire);
        if ((unsigned)(r - s->rings) < CFG_NR(c)) {
            *cfg = c;
            return r;
        }
        pthread_mutex_unlock(&r->lock);
    }
}

/* ------------------------------------------------------------------------
 * Reading.
 */

typedef struct fill_ctx {
    rd_ring *r;
    engram_source_req *reqs;
    size_t n, next;    /* requests, and the next one to issue */
    uint32_t inflight, nfree;
    int err;
    unsigned stats_slot;
    int excl;
} fill_ctx;

static engram__rfile *req_file(const fill_ctx *c, size_t i)
{
    return c->reqs[i].table_ud;
}

/* Prepares read op `o` of segment gi of the row at row state ri. */
static void op_setup(fill_ctx *c, uint32_t o, uint32_t ri, uint32_t gi)
{
    rd_ring *r = c->r;
    const engram_source_req *q = &c->reqs[r->rows[ri].req];
    engram__rseg *g = &((engram__rfile *)q->table_ud)->seg[gi];
    rd_op *op = &r->ops[o];
    uint64_t off = g->base + q->row * g->stride;
    op->row = ri;
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

static engram__rseg *op_seg(const fill_ctx *c, const rd_op *op)
{
    return &req_file(c, c->r->rows[op->row].req)->seg[op->seg];
}

/* The next read of op: its length, file offset and buffer.  A direct read
 * covers the aligned blocks around the row (done is 0 then: the rest of a
 * short read is read buffered); a buffered one the bytes still missing. */
static unsigned op_read_len(const rd_op *op, const engram__rseg *g)
{
    if (op->direct)
        return (unsigned)engram__align_up(op->want, g->align);
    return op->want - op->done;
}

static uint64_t op_offset(const fill_ctx *c, const rd_op *op, const engram__rseg *g)
{
    uint64_t row = c->reqs[c->r->rows[op->row].req].row;
    return g->base + row * g->stride - op->skip + op->done;
}

static unsigned char *op_buf(const rd_ring *r, uint32_t o)
{
    return r->stage + (size_t)o * r->stage_slot + r->ops[o].done;
}

/* Runs op o's next read with pread: rings without io_uring, and an SQ
 * entry that could not be had. */
static int op_pread(fill_ctx *c, uint32_t o)
{
    rd_op *op = &c->r->ops[o];
    engram__rseg *g = op_seg(c, op);
    ssize_t n;
    do
        n = pread(op->direct ? g->dfd : g->fd, op_buf(c->r, o), op_read_len(op, g),
                  (off_t)op_offset(c, op, g));
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : (int)n;
}

/* A row whose reads all arrived: copy its segments to the destination. */
static void row_done(fill_ctx *c, uint32_t ri)
{
    rd_ring *r = c->r;
    rd_row *w = &r->rows[ri];
    engram_source_req *q = &c->reqs[w->req];
    const engram__rfile *f = q->table_ud;
    for (unsigned g = 0; g < f->nseg; g++) {
        const rd_op *op = &r->ops[w->slot[g]];
        memcpy((unsigned char *)q->dst + f->seg[g].dst_off,
               r->stage + (size_t)w->slot[g] * r->stage_slot + op->skip, f->seg[g].len);
    }
    q->done = 1;
}

/* Handles the result `res` of a read of op o.  Returns 1 when the op
 * needs another read, already set up in r->ops[o]: an O_DIRECT read the
 * file system refused (redone buffered), a read that failed with -EAGAIN,
 * -EINTR or -ECANCELED (retried, OP_RETRIES times at most), or a short
 * read that is
 * not at the end of the file (the rest is read).  The caller queues it or
 * runs it.  Returns 0 once the op is over, well or not. */
static int op_complete(fill_ctx *c, uint32_t o, int res)
{
    rd_ring *r = c->r;
    rd_op *op = &r->ops[o];
    rd_row *w = &r->rows[op->row];
    const engram_source_req *q = &c->reqs[w->req];
    engram__rfile *f = q->table_ud;
    engram__rseg *g = &f->seg[op->seg];
    engram__rfile_counters *ctr = &f->ctr[c->stats_slot];

    res = apply_hook(f->name, q->row, op->seg, res, op_buf(r, o));
    if (res > 0)
        engram__ctr_add(&ctr->bytes, (uint64_t)res, c->excl);
    if (res == -EINVAL && op->direct) {
        /* The file system refused this direct read after all: read this
         * segment buffered from now on, starting with this row. */
        atomic_store_explicit(&g->direct, 0, memory_order_relaxed);
        op_setup(c, o, op->row, op->seg);
        engram__ctr_add(&ctr->reads, 1, c->excl);
        return 1;
    }
    if ((res == -EAGAIN || res == -EINTR || res == -ECANCELED) && op->again < OP_RETRIES) {
        /* Transient: io_uring can pass -EAGAIN or -EINTR up from a file
         * system or a device that is out of request slots, and completes a
         * read with -EINTR or -ECANCELED when a signal interrupts the task
         * while the read waits (a blocking read punted to an io-wq worker).
         * Neither says anything about the file: the same read again. */
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
        if (!w->failed && c->err == 0) {
            if (res < 0)
                c->err = engram__errno(-res, "table '%s': read of row %" PRIu64
                                       " (%u bytes at offset %" PRIu64 ")",
                                       f->name, q->row, g->len, g->base + q->row * g->stride);
            else
                c->err = engram__err(ENGRAM_ECORRUPT,
                                     "table '%s': read of row %" PRIu64 " returned %u of %u "
                                     "bytes at offset %" PRIu64 ": the file is shorter than "
                                     "its header says (truncated?)",
                                     f->name, q->row, got, g->len, g->base + q->row * g->stride);
        }
        w->failed = 1;
    }
    if (--w->left == 0) {
        if (!w->failed)
            row_done(c, op->row);
        for (unsigned s = 0; s < f->nseg; s++)
            r->free_slots[c->nfree++] = w->slot[s];
    }
    return 0;
}

/* Runs op o to its end with pread. */
static void op_run(fill_ctx *c, uint32_t o)
{
    while (op_complete(c, o, op_pread(c, o)))
        ;
}

/* Queues op o's read on the ring; 1 if queued, 0 if it was run with pread
 * instead.  The SQ has qd entries and at most qd ops are in flight, so an
 * entry is always there; should the ring ever say otherwise, the read is
 * not lost: it runs synchronously. */
static int op_queue(fill_ctx *c, uint32_t o)
{
    rd_ring *r = c->r;
    rd_op *op = &r->ops[o];
    engram__rseg *g = op_seg(c, op);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (ENGRAM__UNLIKELY(!sqe)) {
        op_run(c, o);
        return 0;
    }
    io_uring_prep_read(sqe, op->direct ? g->dfd : g->fd, op_buf(r, o), op_read_len(op, g),
                       op_offset(c, op, g));
    io_uring_sqe_set_data64(sqe, o);
    return 1;
}

/* Issues the reads of rows c->next... while slots are free.  Returns how
 * many reads were queued on the ring. */
static uint32_t issue(fill_ctx *c)
{
    rd_ring *r = c->r;
    uint32_t queued = 0;
    while (c->next < c->n && c->err == 0) {
        engram__rfile *f = req_file(c, c->next);
        uint32_t ri;
        if (c->nfree < f->nseg)
            break;
        ri = r->free_slots[c->nfree - 1];
        r->rows[ri] = (rd_row){c->next, f->nseg, {0}, 0};
        for (unsigned g = 0; g < f->nseg; g++)
            r->rows[ri].slot[g] = r->free_slots[--c->nfree];
        c->next++;
        for (unsigned g = 0; g < f->nseg; g++) {
            uint32_t o = r->rows[ri].slot[g];
            op_setup(c, o, ri, g);
            engram__ctr_add(&f->ctr[c->stats_slot].reads, 1, c->excl);
            if (r->state == 1)
                queued += (uint32_t)op_queue(c, o);
            else
                op_run(c, o);
        }
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
    rd_ring *r = c->r;
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
    ring_teardown(r);
    c->inflight = 0;
}

/* Reads the rows of c->reqs on ring c->r. */
static int fill(fill_ctx *c)
{
    rd_ring *r = c->r;
    int err;
    for (uint32_t s = 0; s < r->qd; s++)
        r->free_slots[s] = r->qd - 1 - s;
    c->nfree = r->qd;
    for (;;) {
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        c->inflight += issue(c);
        if (c->inflight == 0)
            break;
        if ((err = io_uring_submit_and_wait(&r->ring, 1)) < 0 && err != -EINTR &&
            err != -EAGAIN && err != -EBUSY) {
            if (c->err == 0)
                c->err = engram__errno(-err, "io_uring_submit");
            ring_abandon(c);
            break;
        }
        io_uring_for_each_cqe(&r->ring, head, cqe)
        {
            uint32_t o = (uint32_t)io_uring_cqe_get_data64(cqe);
            seen++;
            /* Another read of the op takes the SQ entry its last one
             * freed: the SQ has qd entries, at most qd ops are in flight. */
            if (!op_complete(c, o, cqe->res) || !op_queue(c, o))
                c->inflight--;
        }
        io_uring_cq_advance(&r->ring, seen);
    }
    if (c->err == 0 && c->next < c->n)
        c->err = engram__err(-EIO, "file read: %zu of %zu rows were not read", c->n - c->next,
                             c->n);
    return c->err;
}

int engram__reader_read_rows(void *ctx, engram_source_req *reqs, size_t n)
{
    engram__reader *rd = ctx;
    uint64_t cfg;
    fill_ctx c = {NULL, reqs, n, 0, 0, 0, 0, 0, 0};
    rd_set *s = current_set(rd);
    int err;
    if (!s)
        return engram__err(-ENOMEM, "out of memory for the file reader's rings");
    c.stats_slot = engram__stats_slot(&c.excl);
    c.r = ring_take(rd, s, &cfg);
    if ((err = ring_ready(c.r, cfg)) == 0)
        err = fill(&c);
    pthread_mutex_unlock(&c.r->lock);
    return err;
}

/* ------------------------------------------------------------------------
 * Admission and configuration.
 */

/* Decides whether segment g reads with O_DIRECT, and its alignment. */
static void seg_direct_setup(engram__rseg *g, const char *what)
{
    struct statx sx;
    struct statfs fs;
    struct stat a, b;
    char path[64];
    void *buf = NULL;
    uint32_t align = DIRECT_ALIGN;
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
        if (align > DIRECT_ALIGN || (align & (align - 1)))
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
        a.st_ino != b.st_ino || posix_memalign(&buf, DIRECT_ALIGN, align) != 0) {
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

/* Staging bytes a read of segment g needs at most. */
static uint32_t seg_span(const engram__rseg *g)
{
    if (g->dfd >= 0)
        return (uint32_t)engram__align_up(g->len, g->align) + g->align;
    return g->len;
}

/* The largest configuration whose rings fit in `bytes` (admit_lock
 * held): every ring with as many slots as fit up to qd; where not even
 * max_seg slots per ring fit, fewer rings of max_seg slots.  *cost gets
 * its bytes. */
static uint64_t config_for(const engram__reader *rd, uint64_t bytes, uint64_t *cost)
{
    uint32_t slot = (uint32_t)engram__align_up(rd->max_span,
                                               rd->any_direct ? DIRECT_ALIGN : BUFFERED_ALIGN);
    uint64_t per = slot + PER_SLOT, ring_need = RING_FIXED + rd->max_seg * per;
    uint64_t qd = 0, nr = rd->nrings;
    if (bytes / nr > RING_FIXED)
        qd = (bytes / nr - RING_FIXED) / per;
    if (qd > rd->qd)
        qd = rd->qd;
    if (qd < rd->max_seg) {
        qd = rd->max_seg;
        nr = bytes / ring_need;
        if (nr > rd->nrings)
            nr = rd->nrings;
        if (nr == 0)
            nr = 1;
    }
    *cost = nr * (RING_FIXED + qd * per);
    return CFG(slot, qd, nr);
}

int engram__reader_admit(engram__reader *rd, engram__rfile *f)
{
    uint32_t span = 0, off = 0, old_span;
    unsigned old_seg;
    int old_direct, err;
    uint64_t want, need, got, cfg, old;
    rd_set *s;

    for (unsigned g = 0; g < f->nseg; g++) {
        f->seg[g].dst_off = off;
        off += f->seg[g].len;
        seg_direct_setup(&f->seg[g], f->name);
        if (seg_span(&f->seg[g]) > span)
            span = seg_span(&f->seg[g]);
    }
    f->row_bytes = off;
    pthread_mutex_lock(&rd->admit_lock);
    old_span = rd->max_span;
    old_seg = rd->max_seg;
    old_direct = rd->any_direct;
    if (span > rd->max_span)
        rd->max_span = span;
    if (f->nseg > rd->max_seg)
        rd->max_seg = f->nseg;
    for (unsigned g = 0; g < f->nseg; g++)
        rd->any_direct |= f->seg[g].dfd >= 0;
    (void)config_for(rd, engram__cbudget_total(rd->budget) / STAGING_SHARE, &want);
    (void)config_for(rd, 0, &need); /* one ring of max_seg slots */
    if ((err = engram__cbudget_reserve(rd->budget, want, need, f->name, &got)) != 0) {
        rd->max_span = old_span;
        rd->max_seg = old_seg;
        rd->any_direct = old_direct;
        pthread_mutex_unlock(&rd->admit_lock);
        engram__reader_file_close(f);
        return err;
    }
    cfg = config_for(rd, got, &need);
    old = atomic_load_explicit(&rd->cfg, memory_order_relaxed);
    /* Release: a call that reads this word sees the fields it was made
     * from; it pairs with the acquire load in engram__reader_read_rows(). */
    atomic_store_explicit(&rd->cfg, cfg, memory_order_release);
    /* Rings the new configuration leaves out give their staging back
     * now, or the reservation would not bound them.  Taking their locks
     * waits at most for a call in flight on them. */
    if (old && CFG_NR(cfg) < CFG_NR(old) && (s = current_set(rd)) != NULL) {
        for (unsigned i = CFG_NR(cfg); i < CFG_NR(old); i++) {
            pthread_mutex_lock(&s->rings[i].lock);
            ring_teardown(&s->rings[i]);
            pthread_mutex_unlock(&s->rings[i].lock);
        }
    }
    pthread_mutex_unlock(&rd->admit_lock);
    return 0;
}

void engram__reader_file_close(engram__rfile *f)
{
    if (!f)
        return;
    for (unsigned g = 0; g < f->nseg; g++) {
        if (f->seg[g].fd >= 0)
            close(f->seg[g].fd);
        if (f->seg[g].dfd >= 0)
            close(f->seg[g].dfd);
        f->seg[g].fd = f->seg[g].dfd = -1;
    }
}

void engram__reader_file_stats(const engram__rfile *f, engram_cache_stats *s)
{
    int direct = 1;
    for (unsigned g = 0; g < f->nseg; g++)
        direct &= f->seg[g].dfd >= 0 &&
                  atomic_load_explicit(&f->seg[g].direct, memory_order_relaxed);
    s->direct_tables += (uint64_t)direct;
    for (int i = 0; i < ENGRAM__STATS_SLOTS; i++) {
        const engram__rfile_counters *c = &f->ctr[i];
        s->reads += atomic_load_explicit(&c->reads, memory_order_relaxed);
        s->bytes_read += atomic_load_explicit(&c->bytes, memory_order_relaxed);
        s->read_errors += atomic_load_explicit(&c->errors, memory_order_relaxed);
    }
}

/* ------------------------------------------------------------------------
 * The reader.
 */

int engram__reader_create(uint32_t queue_depth, unsigned rings, struct engram__cbudget *budget,
                          engram__reader **out)
{
    engram__reader *rd;
    rd_set *s;
    if (queue_depth > ENGRAM__RD_MAX_QD)
        return engram__err(-EINVAL, "queue_depth is %u (at most %u)", queue_depth,
                           ENGRAM__RD_MAX_QD);
    pthread_once(&atfork_once, atfork_init);
    if (!(rd = calloc(1, sizeof *rd)))
        return engram__err(-ENOMEM, "out of memory for the file reader");
    rd->budget = budget;
    rd->qd = queue_depth ? queue_depth : ENGRAM__RD_DEFAULT_QD;
    rd->nrings = rings < 1 ? 1 : rings > MAX_RINGS ? MAX_RINGS : rings;
    rd->max_seg = 1;
    pthread_mutex_init(&rd->admit_lock, NULL);
    if (!(s = set_new(rd->nrings, atomic_load_explicit(&fork_gen, memory_order_relaxed)))) {
        pthread_mutex_destroy(&rd->admit_lock);
        free(rd);
        return engram__err(-ENOMEM, "out of memory for the file reader");
    }
    atomic_init(&rd->set, s);
    *out = rd;
    return 0;
}

void engram__reader_destroy(engram__reader *rd)
{
    rd_set *s;
    if (!rd)
        return;
    s = atomic_load_explicit(&rd->set, memory_order_relaxed);
    while (s) {
        rd_set *older = s->retired;
        /* A set inherited from a parent process is this process's copy:
         * freeing it (and exiting its rings, which unmaps our mapping and
         * closes our descriptor of them) leaves the parent's alone.  Its
         * locks may have been held at the fork, so they are not touched. */
        for (unsigned i = 0; i < rd->nrings; i++)
            ring_teardown(&s->rings[i]);
        free(s);
        s = older;
    }
    pthread_mutex_destroy(&rd->admit_lock);
    free(rd);
}

uint32_t engram__reader_queue_depth(const engram__reader *rd)
{
    return rd->qd;
}
