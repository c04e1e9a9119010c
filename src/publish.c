/*
 * publish.c - the publication protocol of a remote namespace, once, over
 * kv.h's records and chunks.  docs/format.md ("The publication
 * protocol") specifies it; here is how the code maps to it.
 *
 * A table name's record is the protocol's whole state: absent (free), a
 * pending record "open" (a push of epoch E holds the name; its chunks may
 * exist, expiring), a pending record "closed" (the chunks of epoch E are
 * to be deleted; nothing can publish them; the name is held until they
 * are), or a manifest (published).  Every change is one compare-and-swap
 * of that record from the exact bytes last read, so of any number of
 * parties acting at once on a name exactly one wins each step, and a copy
 * of a step still in flight (a reply lost, a command landing late) finds
 * other bytes and changes nothing.  The epoch is random: no two pushes,
 * ever, name the same chunks.
 *
 * A push (engram__pub_writer_*):
 *  1. begin: put-if-absent of its open record, stamped on the store's
 *     clock.  A name held by a manifest fails at once (-EEXIST); one held
 *     by a dead push or a closed record is settled first (as gc would),
 *     one held by a live push fails (-EEXIST: another writer);
 *  2. append: each chunk is a piece written with an expiry of ttl_ms;
 *     every half ttl the record is stamped again (a swap from the bytes
 *     written last) and the chunks' expiry renewed, so a push that dies
 *     leaves chunks that expire and a record that shows it is dead;
 *  3. commit: every piece is made permanent (one expired fails the push),
 *     then sync: the replicas have them before a manifest names them;
 *  4. publish: the swap of its open record for the manifest.  A reply
 *     lost there is resolved before anything is deleted: the swap of the
 *     open record for a closed one settles it (the late copy of the
 *     publication then finds other bytes), and if that finds other bytes
 *     the record tells what happened (the manifest of this epoch:
 *     published).  When even that cannot be asked, the push fails with
 *     ENGRAM_EINDOUBT and keeps everything: gc settles it later.
 * Remove: the swap of the manifest read for a closed record of its
 * epoch (compare-and-delete of the manifest, in the same step as the
 * record that names its chunks), sync, the chunks go, then the record
 * (compare-and-delete).  gc settles the pending records that dead pushes
 * and removals left, by the same swaps.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "xxh.h"

#include "common.h"
#include "publish.h"

void (*engram__pub_hook)(const char *step, const char *name);

static void at_step(const char *step, const char *name)
{
    if (engram__pub_hook)
        engram__pub_hook(step, name);
}

/* ------------------------------------------------------------------------
 * Records.
 */

#define REC_MAX 512 /* a pending record's text, stamp included */

enum { REC_MANIFEST, REC_PENDING, REC_OTHER };

static int rec_kind(const char *v, size_t n)
{
    if (n >= sizeof ENGRAM__RM_MAGIC && memcmp(v, ENGRAM__RM_MAGIC "\n", sizeof ENGRAM__RM_MAGIC) == 0)
        return REC_MANIFEST;
    if (n >= sizeof ENGRAM__RP_MAGIC && memcmp(v, ENGRAM__RP_MAGIC "\n", sizeof ENGRAM__RP_MAGIC) == 0)
        return REC_PENDING;
    return REC_OTHER;
}

/* The text of pending record *p stamped `stamp`, into buf[REC_MAX]. */
static size_t rec_text(const engram__rpending *p, uint64_t stamp, char *buf)
{
    size_t n = engram__rpending_body(p, buf, REC_MAX);
    int m = snprintf(buf + n, REC_MAX - n, "stamp %" PRIu64 "\n", stamp);
    return n + (m > 0 ? (size_t)m : 0);
}

/* The pending record of the chunks [0, nchunks) of the publication *m
 * describes, with ttl_ms. */
static void pending_of(const engram__rmanifest *m, uint64_t nchunks, int closed, uint32_t ttl_ms,
                       engram__rpending *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", m->name);
    p->closed = closed;
    p->epoch = m->epoch;
    p->nchunks = nchunks;
    p->tagged = m->tagged;
    p->ttl_ms = ttl_ms;
}

static engram__kv_piece piece_of(const engram__rpending *p)
{
    return (engram__kv_piece){p->name, p->epoch, p->tagged};
}

/* Reads record `name`: 0 and *val, *len (the caller frees *val), -ENOENT,
 * or the failure. */
static int rec_get(const engram__pub *p, void *s, const char *name, char **val, size_t *len)
{
    *val = NULL;
    *len = 0;
    return p->vt->rec_get(p->kv, s, name, val, len);
}

static int rec_cas(const engram__pub *p, void *s, const char *name, const char *expect,
                   size_t elen, const char *val, size_t vlen, int *res)
{
    *res = ENGRAM__KV_DIFFERS;
    return p->vt->rec_cas(p->kv, s, name, expect, elen, val, vlen, res);
}

/* Record `name` found holding exactly `val`, written by another copy of
 * this very step (or by another party with the same bytes): written
 * again on this session, so that a sync here covers it (kv.h).  0 and
 * *res done, or the failure. */
static int rec_own(const engram__pub *p, void *s, const char *name, const char *val,
                   size_t vlen, int *res)
{
    int err = rec_cas(p, s, name, val, vlen, val, vlen, res);
    return err ? err : *res == ENGRAM__KV_DONE ? 0 : -EAGAIN;
}

/* rec_cas() that puts `val`, sure of its answer: a store's client may
 * send a write again after a lost connection, and the copy that ran
 * second answers for both (differs, or present), though the first did
 * the swap.  So an answer other than done is checked: a record that
 * holds exactly the bytes put is taken as done, once written again
 * (rec_own()).  A failure to read it back is a failure of the step,
 * whose outcome is then unknown. */
static int rec_swap(const engram__pub *p, void *s, const char *name, const char *expect,
                    size_t elen, const char *val, size_t vlen, int *res)
{
    char *v;
    size_t n;
    int err = rec_cas(p, s, name, expect, elen, val, vlen, res);
    if (err || *res == ENGRAM__KV_DONE || *res == ENGRAM__KV_ABSENT)
        return err;
    if ((err = rec_get(p, s, name, &v, &n)) == -ENOENT) {
        *res = ENGRAM__KV_ABSENT;
        return 0;
    }
    if (err)
        return err;
    err = n == vlen && memcmp(v, val, n) == 0 ? rec_own(p, s, name, val, vlen, res) : 0;
    free(v);
    if (err == -EAGAIN) { /* changed again in between: other bytes */
        *res = ENGRAM__KV_DIFFERS;
        err = 0;
    }
    return err;
}

static int now_ms(const engram__pub *p, void *s, uint64_t *ms)
{
    int err = p->vt->now_ms(p->kv, s, ms);
    if (err)
        return engram__err(err, "read the clock of %s: %s", p->where, engram_errmsg());
    return 0;
}

static void changed(const engram__pub *p)
{
    if (p->changed)
        p->changed(p->ud);
}

/* Deletes the chunks pending record *rp names, then the record itself
 * (compare-and-delete of its exact bytes `text`): 0, or the first failure
 * (what is left is then a gc's). */
static int finish(const engram__pub *p, void *s, const engram__rpending *rp, const char *text,
                  size_t tlen)
{
    engram__kv_piece pc = piece_of(rp);
    int err, res;
    if ((err = p->vt->piece_del(p->kv, s, &pc, rp->nchunks)) != 0)
        return engram__err(err, "some of the %" PRIu64 " chunks of '%s' (epoch %016" PRIx64
                                ") could not be deleted: %s",
                           rp->nchunks, rp->name, rp->epoch, engram_errmsg());
    if ((err = rec_cas(p, s, rp->name, text, tlen, NULL, 0, &res)) != 0)
        return engram__err(err, "drop the pending record of '%s' in %s: %s", rp->name, p->where,
                           engram_errmsg());
    return 0;
}

/* ------------------------------------------------------------------------
 * Reading: manifests, the list, a whole table.
 */

int engram__pub_manifest(const engram__pub *p, void *s, const char *name, engram__rmanifest *m,
                         char **raw, size_t *rawlen)
{
    char what[ENGRAM_NAME_MAX + 600], *v;
    size_t n;
    int err;
    memset(m, 0, sizeof *m);
    if (raw) {
        *raw = NULL;
        *rawlen = 0;
    }
    if ((err = rec_get(p, s, name, &v, &n)) != 0) {
        if (err == -ENOENT)
            return engram__err(-ENOENT, "table '%s' not found in %s", name, p->where);
        return engram__err(err, "read the manifest of '%s' in %s: %s", name, p->where,
                           engram_errmsg());
    }
    if (rec_kind(v, n) == REC_PENDING) {
        free(v);
        return engram__err(-ENOENT, "table '%s' not found in %s (a push of it is under way, or "
                                    "a removal)",
                           name, p->where);
    }
    snprintf(what, sizeof what, "table '%s' in %s", name, p->where);
    err = engram__rmanifest_parse(v, n, name, what, m);
    if (raw) {
        *raw = v;
        *rawlen = n;
    } else {
        free(v);
    }
    return err;
}

typedef struct list_ctx {
    int (*add)(void *ud, const char *name);
    int (*each)(void *ud, const engram__rmanifest *m);
    void *ud;
} list_ctx;

static int list_one(void *ud, const char *name, const char *val, size_t len)
{
    list_ctx *c = ud;
    if (rec_kind(val, len) != REC_MANIFEST || strlen(name) > ENGRAM_NAME_MAX ||
        !engram__name_valid(name))
        return 0;
    if (c->add)
        return c->add(c->ud, name);
    {
        engram__rmanifest m;
        int err;
        if (engram__rmanifest_parse(val, len, name, "a table", &m) != 0)
            return 0; /* not a table this library can read */
        err = c->each(c->ud, &m);
        engram__rmanifest_free(&m);
        return err;
    }
}

int engram__pub_list(const engram__pub *p, int (*add)(void *ud, const char *name), void *ud)
{
    list_ctx c = {add, NULL, ud};
    void *s;
    int err;
    if ((err = p->vt->sess_get(p->kv, &s)) != 0)
        return err;
    err = p->vt->rec_list(p->kv, s, list_one, &c);
    p->vt->sess_put(p->kv, s);
    return err;
}

int engram__pub_manifests(const engram__pub *p, void *s,
                          int (*each)(void *ud, const engram__rmanifest *m), void *ud)
{
    list_ctx c = {NULL, each, ud};
    return p->vt->rec_list(p->kv, s, list_one, &c);
}

/* Whole chunks read in one batch by read_all(): about 32 MiB, so that
 * every server has many in flight at once, and at most 4096 chunks. */
#define STREAM_BATCH_BYTES ((uint64_t)32 << 20)
#define STREAM_BATCH_CHUNKS 4096u

/* Rows a read in place hands to its sink at a time: the check of a chunk
 * and the sink (a writer hashing the file) pass over each block while it
 * is in the cache, not over the whole chunk twice. */
#define STREAM_BLOCK_BYTES ((size_t)512 << 10)

/* read_all()'s two buffers: while the reader fills one from the store, a
 * thread of its own checks the other's chunks and hands them to the sink
 * (which may write them to a file), so the network and the disk work at
 * once.  Read in place (the sink's region()), the two are parts of the
 * sink's own memory, one after the other.  Everything below `mu` guards. */
typedef struct stream {
    const engram__pub *p;
    const char *name;
    const engram__rmanifest *m;
    const engram__remote_sink *k;
    unsigned char *buf[2];
    unsigned char *region; /* the sink's memory for the rows, or NULL */
    XXH3_state_t *xs;      /* a chunk's checksum, read in place */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t c0[2], n[2], rows[2]; /* the batch a full buffer holds */
    int full[2];
    int done; /* no more batches */
    int err;  /* the consumer's failure, with its message */
    char msg[ENGRAM__ERRMSG_MAX];
} stream;

static uint64_t chunk_len(const engram__rmanifest *m, uint64_t c)
{
    return (c + 1 < m->nchunks ? m->chunk_rows : m->num_rows - c * m->chunk_rows) * m->row_bytes;
}

/* Chunk c's checksum, read in place: hashed a block at a time, each
 * block handed to the sink once hashed. */
static int stream_chunk_in_place(stream *x, const unsigned char *q, uint64_t len, uint64_t *sum)
{
    uint32_t rb = x->m->row_bytes;
    uint64_t block = STREAM_BLOCK_BYTES / rb ? STREAM_BLOCK_BYTES / rb * rb : rb;
    int err;
    XXH3_64bits_reset(x->xs);
    for (uint64_t at = 0; at < len; at += block) {
        uint64_t n = len - at < block ? len - at : block;
        XXH3_64bits_update(x->xs, q + at, (size_t)n);
        if ((err = x->k->rows(x->k->ud, q + at, n / rb)) != 0)
            return err;
    }
    *sum = XXH3_64bits_digest(x->xs);
    return 0;
}

/* Checks batch `b`'s chunks against the manifest and hands them on. */
static int stream_consume(stream *x, int b)
{
    const engram__rmanifest *m = x->m;
    const unsigned char *q = x->buf[b];
    for (uint64_t i = 0; i < x->n[b]; i++) {
        uint64_t c = x->c0[b] + i, len = chunk_len(m, c), sum;
        int err;
        if (x->region) {
            if ((err = stream_chunk_in_place(x, q, len, &sum)) != 0)
                return err;
        } else {
            sum = XXH3_64bits(q, len);
        }
        if (sum != m->chunk_sums[c])
            return engram__err(ENGRAM_ECHECKSUM,
                               "table '%s' in %s: chunk %" PRIu64 " (epoch %016" PRIx64
                               ") has checksum %016" PRIx64 ", the manifest says %016" PRIx64,
                               x->name, x->p->where, c, m->epoch, sum, m->chunk_sums[c]);
        q += len;
    }
    return x->region ? 0 : x->k->rows(x->k->ud, x->buf[b], x->rows[b]);
}

static void *stream_main(void *arg)
{
    stream *x = arg;
    for (int b = 0;; b ^= 1) {
        int err;
        pthread_mutex_lock(&x->mu);
        while (!x->full[b] && !x->done)
            pthread_cond_wait(&x->cv, &x->mu);
        if (!x->full[b]) { /* done, and nothing left */
            pthread_mutex_unlock(&x->mu);
            return NULL;
        }
        pthread_mutex_unlock(&x->mu);
        err = stream_consume(x, b);
        pthread_mutex_lock(&x->mu);
        x->full[b] = 0;
        if (err) {
            x->err = err;
            snprintf(x->msg, sizeof x->msg, "%s", engram_errmsg());
        }
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        if (err)
            return NULL;
    }
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Maps the pages of [p, p + len) of a read in place before the store
 * writes there: one call that maps them all costs less than a fault per
 * page inside a transfer (4 KiB pages of a tmpfs file: ~0.4 s a GiB
 * against ~0.8 s as faults, on a 2-CPU VM).  Kernels before 5.14 refuse;
 * the transfer faults them in then. */
static void populate(unsigned char *p, uint64_t len)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(pg - 1);
    (void)madvise((void *)a, (size_t)((uintptr_t)p + len - a), MADV_POPULATE_WRITE);
}

/* Reads batch [c0, c0 + n) into dst: 0 and *rows, or the failure. */
static int read_batch(const engram__pub *p, void *s, const engram__rmanifest *m, uint64_t c0,
                      uint64_t n, unsigned char *dst, engram__kv_range *r, uint64_t *rows)
{
    engram__kv_piece pc = {m->name, m->epoch, m->tagged};
    uint64_t bytes = 0;
    int err;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = chunk_len(m, c0 + i);
        r[i] = (engram__kv_range){c0 + i, 0, dst + bytes, (uint32_t)len, 1};
        bytes += len;
    }
    *rows = bytes / m->row_bytes;
    if ((err = p->vt->get_ranges(p->kv, s, &pc, r, n, bytes)) == -ENODATA)
        /* A chunk missing or of the wrong length is data lost; anything
         * else (the network, rights) says nothing of the data. */
        err = engram__err(-ENODATA, "table '%s' in %s is listed, but its data is not whole: a "
                                    "chunk is missing or has the wrong length (%s); remove the "
                                    "table and push it again",
                          m->name, p->where, engram_errmsg());
    return err;
}

int engram__pub_read_all(const engram__pub *p, const char *name, const engram__remote_sink *k)
{
    engram__rmanifest m;
    engram__kv_range *r = NULL;
    stream x;
    pthread_t th;
    void *s;
    uint64_t cb, per;
    int err, started = 0;

    memset(&x, 0, sizeof x);
    if ((err = p->vt->sess_get(p->kv, &s)) != 0)
        return err;
    if ((err = engram__pub_manifest(p, s, name, &m, NULL, NULL)) != 0)
        goto out;
    {
        engram_table_spec spec = {m.num_rows, m.row_bytes, 0};
        if (k->begin && (err = k->begin(k->ud, &spec, m.checksum)) != 0)
            goto out;
    }
    cb = m.chunk_rows * m.row_bytes;
    per = STREAM_BATCH_BYTES / cb ? STREAM_BATCH_BYTES / cb : 1;
    if (per > STREAM_BATCH_CHUNKS)
        per = STREAM_BATCH_CHUNKS;
    if (per > m.nchunks)
        per = m.nchunks;
    x.p = p;
    x.name = name;
    x.m = &m;
    x.k = k;
    x.region = k->region ? k->region(k->ud) : NULL;
    if (!(r = malloc(per * sizeof *r)) ||
        (x.region ? !(x.xs = XXH3_createState())
                  : !(x.buf[0] = malloc(per * cb)) ||
                        !(x.buf[1] = m.nchunks > per ? malloc(per * cb) : x.buf[0]))) {
        err = engram__err(-ENOMEM, "out of memory for reading table '%s' (%" PRIu64
                                   " chunks of %" PRIu64 " bytes a batch)",
                          name, per, cb);
        goto out;
    }
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    if ((err = pthread_create(&th, NULL, stream_main, &x)) != 0) {
        err = engram__err(-err, "read table '%s': cannot start a thread", name);
        goto out_sync;
    }
    started = 1;
    for (uint64_t c0 = 0, b = 0; c0 < m.nchunks; c0 += per, b ^= 1) {
        uint64_t n = m.nchunks - c0 < per ? m.nchunks - c0 : per, rows;
        /* Read in place, the slot's rows are the next of the sink's. */
        unsigned char *dst = x.region ? x.region + c0 * cb : x.buf[b];
        if (x.region)
            populate(dst, n * cb > m.num_rows * m.row_bytes - c0 * cb
                              ? m.num_rows * m.row_bytes - c0 * cb
                              : n * cb);
        /* Wait for this buffer to be handed on (or for a failure there). */
        pthread_mutex_lock(&x.mu);
        while (x.full[b] && !x.err)
            pthread_cond_wait(&x.cv, &x.mu);
        /* The consumer's message is in its own thread's errmsg. */
        err = x.err ? engram__err(x.err, "%s", x.msg) : 0;
        pthread_mutex_unlock(&x.mu);
        if (err || (err = read_batch(p, s, &m, c0, n, dst, r, &rows)) != 0)
            break;
        pthread_mutex_lock(&x.mu);
        x.buf[b] = dst;
        x.c0[b] = c0;
        x.n[b] = n;
        x.rows[b] = rows;
        x.full[b] = 1;
        pthread_cond_broadcast(&x.cv);
        pthread_mutex_unlock(&x.mu);
        /* Progress (and a cancel) on the caller's thread. */
        if (k->read && (err = k->read(k->ud, rows)) != 0)
            break;
    }
    /* The consumer hands on what is full, then ends; a failure of the
     * reader's own stops it after the batch it holds. */
    pthread_mutex_lock(&x.mu);
    x.done = 1;
    if (err)
        x.full[0] = x.full[1] = 0;
    pthread_cond_broadcast(&x.cv);
    pthread_mutex_unlock(&x.mu);
    if (started)
        pthread_join(th, NULL);
    if (!err && x.err)
        err = engram__err(x.err, "%s", x.msg);
out_sync:
    pthread_cond_destroy(&x.cv);
    pthread_mutex_destroy(&x.mu);
out:
    if (!x.region) {
        if (x.buf[1] != x.buf[0])
            free(x.buf[1]);
        free(x.buf[0]);
    }
    XXH3_freeState(x.xs);
    free(r);
    engram__rmanifest_free(&m);
    p->vt->sess_put(p->kv, s);
    return err;
}

/* ------------------------------------------------------------------------
 * Remove.
 */

/* Whether record `name` is a pending record of `epoch` (the publication
 * a removal read): another removal of it got there first. */
static int removing(const engram__pub *p, void *s, const char *name, uint64_t epoch)
{
    char *v;
    size_t n;
    engram__rpending q;
    int yes = 0;
    if (epoch && rec_get(p, s, name, &v, &n) == 0) {
        yes = rec_kind(v, n) == REC_PENDING && n < REC_MAX &&
              engram__rpending_parse(v, n, "a pending record", &q) == 0 && q.epoch == epoch;
        free(v);
    }
    return yes;
}

int engram__pub_remove(const engram__pub *p, const char *name, int *unpublished)
{
    engram__rmanifest m;
    engram__rpending rp;
    char *raw = NULL, closed[REC_MAX];
    size_t rawlen = 0, clen = 0;
    uint64_t now;
    void *s;
    int err, res, parsed;

    *unpublished = 0;
    memset(&m, 0, sizeof m);
    if ((err = p->vt->sess_get(p->kv, &s)) != 0)
        return err;
    /* The bytes read are kept: the removal compares them. */
    err = engram__pub_manifest(p, s, name, &m, &raw, &rawlen);
    if (err != 0 && err != ENGRAM_ECORRUPT)
        goto out;
    /* A corrupt manifest is removed all the same; the chunks it would
     * name stay behind. */
    parsed = err == 0;
    if (parsed) {
        if ((err = now_ms(p, s, &now)) != 0)
            goto out;
        pending_of(&m, m.nchunks, 1, p->ttl_ms, &rp);
        clen = rec_text(&rp, now, closed);
    }
    at_step("remove", name);
    for (int tries = 0;; tries++) {
        /* The manifest, swapped for the closed record of its chunks. */
        if ((err = parsed ? rec_swap(p, s, name, raw, rawlen, closed, clen, &res)
                          : rec_cas(p, s, name, raw, rawlen, NULL, 0, &res)) != 0) {
            char *v;
            size_t n;
            int gerr;
            /* A refusal of the user's rights is an answer: nothing ran. */
            if (err == -EACCES)
                goto out;
            /* The reply is lost: the record tells whether it ran (a copy
             * still in flight can change nothing: it expects the
             * manifest, which is then gone). */
            gerr = rec_get(p, s, name, &v, &n);
            if (gerr == 0 && parsed && n == clen && memcmp(v, closed, n) == 0 &&
                rec_own(p, s, name, closed, clen, &res) == 0) {
                free(v);
                err = 0;
            } else if (gerr == 0 && n == rawlen && memcmp(v, raw, n) == 0 && tries < 2) {
                free(v);
                continue; /* not run (yet): again */
            } else {
                free(v);
                err = engram__err(ENGRAM_EINDOUBT,
                                  "remove of table '%s' from %s: the outcome is in doubt: %s.  "
                                  "If it is no longer listed, it was removed, and "
                                  "engram_store_gc() deletes what is left of its chunks",
                                  name, p->where, engram_errmsg());
                goto out;
            }
        }
        break;
    }
    if (res != ENGRAM__KV_DONE) {
        err = res == ENGRAM__KV_ABSENT || removing(p, s, name, m.epoch)
                  ? engram__err(-ENOENT, "table '%s' not found in %s (removed meanwhile)", name,
                                p->where)
                  : engram__err(-ENOENT, "table '%s' in %s was removed and pushed again while "
                                         "this removal ran: the table pushed since is kept",
                                name, p->where);
        goto out;
    }
    *unpublished = 1;
    changed(p);
    at_step("unpublished", name);
    if (!parsed)
        goto out;
    /* The chunks go only once the replicas have the removal: a failover
     * that lost it would bring the table back, listed, without its
     * data. */
    if ((err = p->vt->sync(p->kv, s)) != 0 || (err = finish(p, s, &rp, closed, clen)) != 0)
        err = engram__err(err, "table '%s' was unpublished from %s, but: %s (its pending record "
                               "stays, for engram_store_gc() to finish)",
                          name, p->where, engram_errmsg());
out:
    free(raw);
    engram__rmanifest_free(&m);
    p->vt->sess_put(p->kv, s);
    return err;
}

/* ------------------------------------------------------------------------
 * gc: pending records left by pushes and removals that died.
 */

static void gc_say(engram_gc_report_fn report, void *ud, const char *name, int code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void gc_say(engram_gc_report_fn report, void *ud, const char *name, int code,
                   const char *fmt, ...)
{
    char detail[ENGRAM__ERRMSG_MAX];
    va_list ap;
    if (!report)
        return;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    report(ud, name, code, detail);
}

/* What settle() did. */
enum { SETTLE_DONE, SETTLE_KEPT, SETTLE_GONE, SETTLE_FAILED, SETTLE_DRY };

/* Settles pending record `name` of bytes text[tlen] (*rp parsed from it)
 * if it is closed and idle_ms old, or open and max(idle_ms, its ttl) old
 * on the store's clock `now`: closes it if it is open (a swap from the
 * bytes read, which fails if the push showed life since), syncs, deletes
 * its chunks, then the record.  Reports what it did. */
static int settle(const engram__pub *p, void *s, const engram__rpending *rp, const char *text,
                  size_t tlen, uint64_t idle_ms, uint64_t now, uint32_t flags,
                  engram_gc_report_fn report, void *ud)
{
    const char *whose = rp->closed ? "a removed table or a failed push" : "an abandoned push";
    uint64_t min_idle = rp->closed || idle_ms > rp->ttl_ms ? idle_ms : rp->ttl_ms;
    uint64_t idle = now > rp->stamp_ms ? now - rp->stamp_ms : 0;
    char closed[REC_MAX];
    size_t clen = tlen;
    int err, res;

    if (idle < min_idle) {
        gc_say(report, ud, rp->name, ENGRAM_GC_KEPT,
               "%s (epoch %016" PRIx64 ") that showed life %.1f s ago: kept until it has been "
               "quiet for %.1f s",
               rp->closed ? "chunks of a removed table or a failed push" : "a push", rp->epoch,
               (double)idle / 1e3, (double)min_idle / 1e3);
        return SETTLE_KEPT;
    }
    if (flags & ENGRAM_GC_DRY_RUN) {
        gc_say(report, ud, rp->name, 0,
               "would delete the %" PRIu64 " chunks of %s (epoch %016" PRIx64 ", quiet for "
               "%.1f s)",
               rp->nchunks, whose, rp->epoch, (double)idle / 1e3);
        return SETTLE_DRY;
    }
    memcpy(closed, text, tlen);
    if (!rp->closed) {
        engram__rpending c = *rp;
        c.closed = 1;
        clen = rec_text(&c, now, closed);
        if ((err = rec_swap(p, s, rp->name, text, tlen, closed, clen, &res)) != 0) {
            gc_say(report, ud, rp->name, err, "close the pending record in %s: %s", p->where,
                   engram_errmsg());
            return SETTLE_FAILED;
        }
        if (res == ENGRAM__KV_ABSENT)
            return SETTLE_GONE;
        if (res != ENGRAM__KV_DONE) {
            gc_say(report, ud, rp->name, ENGRAM_GC_KEPT,
                   "a push (epoch %016" PRIx64 ") that showed life just now: kept", rp->epoch);
            return SETTLE_KEPT;
        }
    }
    /* The closing on the replicas before any piece goes: a failover that
     * lost it would leave an open record a live push could still
     * publish, or bring back a table a removal unpublished, without its
     * data.  A record found closed is synced too: this session must
     * cover whoever closed it, so it is written again. */
    if (rp->closed && (err = rec_cas(p, s, rp->name, text, tlen, text, tlen, &res)) == 0 &&
        res != ENGRAM__KV_DONE)
        return SETTLE_GONE;
    if ((rp->closed && err) || (err = p->vt->sync(p->kv, s)) != 0) {
        gc_say(report, ud, rp->name, err, "the pending record is closed, but its chunks are kept "
               "until the replicas have it: %s", engram_errmsg());
        return SETTLE_FAILED;
    }
    if ((err = finish(p, s, rp, closed, clen)) != 0) {
        gc_say(report, ud, rp->name, err, "%s", engram_errmsg());
        return SETTLE_FAILED;
    }
    gc_say(report, ud, rp->name, 0,
           "deleted the %" PRIu64 " chunks of %s (epoch %016" PRIx64 ", quiet for %.1f s)",
           rp->nchunks, whose, rp->epoch, (double)idle / 1e3);
    return SETTLE_DONE;
}

/* A pending record found by the listing, kept for after it. */
typedef struct gc_rec {
    char name[ENGRAM_NAME_MAX + 1];
    char text[REC_MAX];
    size_t len;
} gc_rec;

typedef struct gc_ctx {
    gc_rec *v;
    size_t n, cap;
    engram_gc_report_fn report;
    void *ud;
} gc_ctx;

static int gc_collect(void *ud, const char *name, const char *val, size_t len)
{
    gc_ctx *c = ud;
    if (rec_kind(val, len) != REC_PENDING)
        return 0;
    if (len >= REC_MAX || strlen(name) > ENGRAM_NAME_MAX) {
        gc_say(c->report, c->ud, name, ENGRAM_ECORRUPT, "pending record '%.*s' is longer than "
               "any this library writes; left as it is", ENGRAM_NAME_MAX, name);
        return 0;
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        gc_rec *v = realloc(c->v, cap * sizeof *v);
        if (!v)
            return engram__err(-ENOMEM, "out of memory for %zu pending records", cap);
        c->v = v;
        c->cap = cap;
    }
    snprintf(c->v[c->n].name, sizeof c->v[c->n].name, "%s", name);
    memcpy(c->v[c->n].text, val, len);
    c->v[c->n].len = len;
    c->n++;
    return 0;
}

/* Parses pending record g: 0 and *rp, or nonzero (reported). */
static int gc_parse(const gc_rec *g, engram__rpending *rp, engram_gc_report_fn report, void *ud)
{
    char what[ENGRAM_NAME_MAX + 32];
    snprintf(what, sizeof what, "'%s'", g->name);
    if (engram__rpending_parse(g->text, g->len, what, rp) != 0) {
        gc_say(report, ud, g->name, ENGRAM_ECORRUPT, "%s; left as it is", engram_errmsg());
        return -1;
    }
    /* The chunks to delete come from the record: only one under its own
     * name is one this library wrote. */
    if (strcmp(rp->name, g->name) != 0) {
        gc_say(report, ud, g->name, ENGRAM_ECORRUPT,
               "pending record %s names table '%s': not a record this library wrote; left as "
               "it is, with the chunks it names",
               what, rp->name);
        return -1;
    }
    return 0;
}

/* One pass of gc (see engram__pub_gc()) on session s. */
static int gc_pass(const engram__pub *p, void *s, uint64_t idle_ms, uint32_t flags,
                   engram_gc_report_fn report, void *ud)
{
    gc_ctx c = {NULL, 0, 0, report, ud};
    uint64_t now = 0;
    int err;
    if ((err = (p->vt->rec_list_pending ? p->vt->rec_list_pending
                                        : p->vt->rec_list)(p->kv, s, gc_collect, &c)) == 0 &&
        c.n > 0)
        err = now_ms(p, s, &now);
    for (size_t i = 0; !err && i < c.n; i++) {
        engram__rpending rp;
        if (gc_parse(&c.v[i], &rp, report, ud) == 0)
            settle(p, s, &rp, c.v[i].text, c.v[i].len, idle_ms, now, flags, report, ud);
    }
    free(c.v);
    return err;
}

int engram__pub_gc(const engram__pub *p, uint64_t idle_ms, uint32_t flags,
                   engram_gc_report_fn report, void *ud)
{
    void *s;
    int err;
    if ((err = p->vt->sess_get(p->kv, &s)) != 0)
        return err;
    err = gc_pass(p, s, idle_ms, flags, report, ud);
    p->vt->sess_put(p->kv, s);
    return err;
}

/* ------------------------------------------------------------------------
 * The writer.
 */

typedef struct pwriter {
    const engram__pub *p;
    void *s;
    engram__rmanifest m;
    engram__rpending rp; /* its open record */
    engram__kv_piece pc;
    unsigned char *buf;  /* one chunk */
    uint64_t fill;       /* rows in buf */
    uint64_t rows_done;
    uint64_t chunks_done;
    uint64_t renew_ns;   /* when the chunks' expiry and the record are renewed next */
    XXH3_state_t *xs;
    char rec[REC_MAX];   /* the bytes of its record, as written last */
    size_t rec_len;
    int failed;          /* a step failed: abort adds what it could not clean up */
} pwriter;

static void renew_later(pwriter *w)
{
    w->renew_ns = engram__now_ns() + (uint64_t)w->p->ttl_ms * 1000000u / 2;
}

static int abandoned(pwriter *w)
{
    return engram__err(-ECANCELED, "push of '%s' to %s was abandoned: its pending record was "
                                   "closed by a gc (engram_store_gc()), which takes a push that "
                                   "shows no life for its chunk TTL (%u ms) for dead",
                       w->m.name, w->p->where, w->p->ttl_ms);
}

/* Reads the push's record back after a reply was lost: 0 if it is still
 * this push's open record (adopting its bytes), -ECANCELED if it is not,
 * or the failure to read it. */
static int readopt(pwriter *w)
{
    char *v;
    size_t n;
    engram__rpending q;
    int err = rec_get(w->p, w->s, w->m.name, &v, &n);
    if (err == -ENOENT)
        return abandoned(w);
    if (err)
        return err;
    if (rec_kind(v, n) != REC_PENDING || n >= REC_MAX ||
        engram__rpending_parse(v, n, "the push's record", &q) != 0 || q.closed ||
        q.epoch != w->m.epoch) {
        free(v);
        return abandoned(w);
    }
    memcpy(w->rec, v, n);
    w->rec_len = n;
    free(v);
    return 0;
}

/* Stamps the push's record again: 0, -ECANCELED if it was closed, or the
 * failure. */
static int touch(pwriter *w)
{
    char text[REC_MAX];
    size_t len;
    uint64_t now;
    int err, res;
    for (int tries = 0; tries < 3; tries++) {
        if ((err = now_ms(w->p, w->s, &now)) != 0)
            return err;
        len = rec_text(&w->rp, now, text);
        if ((err = rec_cas(w->p, w->s, w->m.name, w->rec, w->rec_len, text, len, &res)) != 0) {
            char msg[ENGRAM__ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s", engram_errmsg());
            /* Lost: whatever it did, the record read back is the truth. */
            int rerr = readopt(w);
            if (rerr == -ECANCELED)
                return rerr;
            if (rerr != 0)
                return engram__err(err, "stamp the pending record of '%s' in %s: %s", w->m.name,
                                   w->p->where, msg);
            continue;
        }
        if (res == ENGRAM__KV_DONE) {
            memcpy(w->rec, text, len);
            w->rec_len = len;
            renew_later(w);
            return 0;
        }
        /* Other bytes: a late copy of an earlier stamp, or a gc. */
        if ((err = readopt(w)) != 0)
            return err;
    }
    return engram__err(-EIO, "stamp the pending record of '%s' in %s: it kept changing",
                       w->m.name, w->p->where);
}

/* Renews the expiry of every piece written so far, and stamps the
 * record (step 2). */
static int renew(pwriter *w)
{
    int err;
    if ((err = touch(w)) != 0)
        return err;
    for (uint64_t i = 0; i < w->chunks_done; i++) {
        if ((err = w->p->vt->piece_expire(w->p->kv, w->s, &w->pc, i, w->p->ttl_ms)) != 0)
            return err == -ENODATA
                       ? engram__err(-ENODATA, "push of '%s' to %s: chunk %" PRIu64 " expired "
                                               "before the push ended",
                                     w->m.name, w->p->where, i)
                       : err;
    }
    renew_later(w);
    return 0;
}

/* Writes chunk w->chunks_done from `rows` rows at `data` (step 2). */
static int put_chunk(pwriter *w, const unsigned char *data, uint64_t rows)
{
    size_t len = (size_t)(rows * w->m.row_bytes);
    int err;
    at_step("chunk", w->m.name);
    /* Counted before it is sent: a piece whose reply is lost may exist. */
    w->chunks_done++;
    if ((err = w->p->vt->piece_put(w->p->kv, w->s, &w->pc, w->chunks_done - 1, data, len,
                                   w->p->ttl_ms)) != 0)
        return err;
    w->m.chunk_sums[w->chunks_done - 1] = XXH3_64bits(data, len);
    XXH3_64bits_update(w->xs, data, len);
    if (engram__now_ns() >= w->renew_ns)
        return renew(w);
    return 0;
}

static void pwriter_free(pwriter *w)
{
    if (!w)
        return;
    if (w->s)
        w->p->vt->sess_put(w->p->kv, w->s);
    engram__rmanifest_free(&w->m);
    XXH3_freeState(w->xs);
    free(w->buf);
    free(w);
}

/* Closes the push's record (so that nothing can publish it) and deletes
 * its chunks, then the record: only for a push that can no longer
 * publish.  0, or the cleanup's failure (what is left is a gc's). */
static int discard(pwriter *w)
{
    engram__rpending c = w->rp;
    char closed[REC_MAX];
    size_t clen;
    uint64_t now;
    int err, res;
    c.nchunks = w->chunks_done ? w->chunks_done : 1;
    c.closed = 1;
    if ((err = now_ms(w->p, w->s, &now)) != 0)
        return err;
    clen = rec_text(&c, now, closed);
    if ((err = rec_swap(w->p, w->s, w->m.name, w->rec, w->rec_len, closed, clen, &res)) != 0)
        return err;
    if (res == ENGRAM__KV_DONE)
        return finish(w->p, w->s, &c, closed, clen);
    /* Not its open record any more: closed by a gc, which deletes the
     * chunks it knew of, though not those written since.  The chunks are
     * this push's alone and nothing can publish them now, so they go;
     * unless the record is this very push's manifest (a publication whose
     * reply was lost, which only resolve() settles). */
    {
        char *v;
        size_t n;
        engram__rmanifest m;
        if ((err = rec_get(w->p, w->s, w->m.name, &v, &n)) == 0) {
            int ours = rec_kind(v, n) == REC_MANIFEST &&
                       engram__rmanifest_parse(v, n, w->m.name, "a manifest", &m) == 0 &&
                       m.epoch == w->m.epoch;
            if (rec_kind(v, n) == REC_MANIFEST)
                engram__rmanifest_free(&m);
            free(v);
            if (ours)
                return 0;
        } else if (err != -ENOENT) {
            return err;
        }
    }
    return w->p->vt->piece_del(w->p->kv, w->s, &w->pc, c.nchunks);
}

/* Frees a writer after its push failed with `err` (message in
 * engram_errmsg()) and cannot publish any more: deletes what it wrote.
 * Returns err, with what could not be cleaned up added. */
static int fail_discard(pwriter *w, int err)
{
    char msg[ENGRAM__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", engram_errmsg());
    if (discard(w) != 0)
        engram__err(err, "%s (and cleaning up after it: %s; engram_store_gc() deletes what is "
                         "left once the push has shown no life for %u ms)",
                    msg, engram_errmsg(), w->p->ttl_ms);
    else
        engram__err(err, "%s", msg);
    pwriter_free(w);
    return err;
}

void engram__pub_writer_abort(void *wp)
{
    pwriter *w = wp;
    char msg[ENGRAM__ERRMSG_MAX];
    if (!w)
        return;
    if (w->failed) {
        /* After a failure of its own: the failure's message stays, with
         * what the cleanup could not do added. */
        fail_discard(w, 0);
        return;
    }
    /* Aborted by the caller: the cleanup's failure is nobody's return
     * value, so it goes to the log. */
    snprintf(msg, sizeof msg, "%s", engram_errmsg());
    if (discard(w) != 0)
        engram__log(ENGRAM_LOG_ERROR, 0, "abort of the push of '%s' to %s: %s", w->m.name,
                    w->p->where, engram_errmsg());
    engram__err(0, "%s", msg);
    pwriter_free(w);
}

/* The chunk rows of a new push of `spec`. */
static uint64_t chunk_rows_of(const engram__pub *p, const engram_table_spec *spec)
{
    uint64_t cr = p->chunk_bytes / spec->row_bytes, most = ENGRAM__RM_CHUNK_MAX / spec->row_bytes;
    if (cr == 0)
        cr = 1;
    if (cr > most)
        cr = most;
    return cr > spec->num_rows ? spec->num_rows : cr;
}

/* Step 1: claims the name with the push's open record.  A name held by a
 * pending record that gc would settle is settled first, once. */
static int claim(pwriter *w)
{
    const engram__pub *p = w->p;
    const char *name = w->m.name;
    for (int tries = 0;; tries++) {
        char *v;
        size_t n;
        uint64_t now;
        int err, res, kind;
        engram__rpending q;
        if ((err = now_ms(p, w->s, &now)) != 0)
            return err;
        w->rec_len = rec_text(&w->rp, now, w->rec);
        err = rec_cas(p, w->s, name, NULL, 0, w->rec, w->rec_len, &res);
        if (err == 0 && res == ENGRAM__KV_DONE)
            return 0;
        if (err == -EACCES)
            return err;
        /* Taken, or the reply lost: the record tells. */
        if ((err = rec_get(p, w->s, name, &v, &n)) != 0) {
            if (err == -ENOENT && tries < 3)
                continue;
            return engram__err(err == -ENOENT ? -EIO : err, "begin a push of '%s' in %s: %s",
                               name, p->where, engram_errmsg());
        }
        kind = rec_kind(v, n);
        if (kind == REC_PENDING && n < REC_MAX &&
            engram__rpending_parse(v, n, "a pending record", &q) == 0 && !q.closed &&
            q.epoch == w->m.epoch && strcmp(q.name, name) == 0) {
            /* Ours: the reply was lost (the claim that landed may be an
             * earlier try's, stamped otherwise). */
            memcpy(w->rec, v, n);
            w->rec_len = n;
            free(v);
            return 0;
        }
        if (kind == REC_PENDING && n < REC_MAX && tries < 2 &&
            engram__rpending_parse(v, n, "a pending record", &q) == 0 && strcmp(q.name, name) == 0) {
            int st = settle(p, w->s, &q, v, n, 0, now, 0, NULL, NULL);
            free(v);
            if (st == SETTLE_FAILED)
                return engram__err(-EAGAIN, "begin a push of '%s' in %s: the name is held by "
                                            "what a dead push or removal left, which could not "
                                            "be settled now (%s); engram_store_gc() settles it",
                                   name, p->where, engram_errmsg());
            if (st != SETTLE_KEPT)
                continue;
            return engram__err(-EEXIST, "table '%s' is being pushed to %s by another writer: "
                                        "its pending record is live",
                               name, p->where);
        }
        free(v);
        if (kind == REC_PENDING)
            return engram__err(-EEXIST, "table '%s' is being pushed to %s by another writer (or "
                                        "removed): its pending record is live",
                               name, p->where);
        return engram__err(-EEXIST, "table '%s' already exists in %s", name, p->where);
    }
}

int engram__pub_writer_begin(const engram__pub *p, const char *name,
                             const engram_table_spec *spec, void **out)
{
    pwriter *w;
    uint64_t cr;
    int err;

    if ((err = engram_spec_check(spec)) != 0)
        return err;
    cr = chunk_rows_of(p, spec);
    if (engram__rm_nchunks(spec->num_rows, cr) > ENGRAM__RM_CHUNKS_MAX)
        return engram__err(ENGRAM_ESPEC,
                           "table '%s' of %" PRIu64 " rows would need %" PRIu64
                           " chunks of %" PRIu64 " rows, above %" PRIu64 ": raise chunk_bytes",
                           name, spec->num_rows, engram__rm_nchunks(spec->num_rows, cr), cr,
                           ENGRAM__RM_CHUNKS_MAX);
    if (!(w = calloc(1, sizeof *w)))
        return engram__err(-ENOMEM, "out of memory");
    w->p = p;
    snprintf(w->m.name, sizeof w->m.name, "%s", name);
    w->m.num_rows = spec->num_rows;
    w->m.row_bytes = spec->row_bytes;
    w->m.chunk_rows = cr;
    w->m.nchunks = engram__rm_nchunks(spec->num_rows, cr);
    w->m.tagged = p->layout;
    if (getrandom(&w->m.epoch, sizeof w->m.epoch, 0) != (ssize_t)sizeof w->m.epoch)
        w->m.epoch = engram__wall_ns() ^ ((uint64_t)getpid() << 32);
    if (w->m.epoch == 0)
        w->m.epoch = 1;
    pending_of(&w->m, w->m.nchunks, 0, p->ttl_ms, &w->rp);
    w->pc = piece_of(&w->rp);
    w->pc.name = w->m.name;
    if (!(w->m.chunk_sums = malloc(w->m.nchunks * sizeof *w->m.chunk_sums)) ||
        !(w->buf = malloc((size_t)(cr * spec->row_bytes))) || !(w->xs = XXH3_createState())) {
        err = engram__err(-ENOMEM, "out of memory for a push of '%s'", name);
        goto fail;
    }
    XXH3_64bits_reset(w->xs);
    if ((err = p->vt->sess_get(p->kv, &w->s)) != 0)
        goto fail;
    /* What dead pushes and removals left behind goes first (best effort:
     * it is only housekeeping, and a failure here says nothing of ours). */
    {
        char msg[ENGRAM__ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", engram_errmsg());
        (void)gc_pass(p, w->s, 0, 0, NULL, NULL);
        engram__err(0, "%s", msg);
    }
    at_step("begin", name);
    if ((err = claim(w)) != 0)
        goto fail;
    renew_later(w);
    *out = w;
    return 0;
fail:
    pwriter_free(w);
    return err;
}

int engram__pub_writer_append(void *wp, const void *rows, uint64_t nrows, size_t src_stride)
{
    pwriter *w = wp;
    const unsigned char *src = rows;
    size_t rb = w->m.row_bytes;
    int err;
    if (nrows == 0)
        return 0;
    if (!src_stride)
        src_stride = rb;
    if (!rows || src_stride < rb)
        return engram__err(-EINVAL, "append to '%s': rows NULL or stride %zu < row_bytes %zu",
                           w->m.name, src_stride, rb);
    if (nrows > w->m.num_rows - w->rows_done)
        return engram__err(ENGRAM_ESTATE, "append of %" PRIu64 " rows to '%s' goes beyond its %"
                                          PRIu64 " rows",
                           nrows, w->m.name, w->m.num_rows);
    while (nrows > 0) {
        uint64_t left = w->m.chunk_rows, n;
        /* The last chunk holds what is left. */
        if (w->chunks_done * w->m.chunk_rows + left > w->m.num_rows)
            left = w->m.num_rows - w->chunks_done * w->m.chunk_rows;
        left -= w->fill;
        if (w->fill == 0 && src_stride == rb && nrows >= left) {
            /* A whole chunk, packed in the caller's memory: sent from there. */
            if ((err = put_chunk(w, src, left)) != 0)
                goto fail;
            n = left;
        } else {
            n = nrows < left ? nrows : left;
            for (uint64_t i = 0; i < n; i++)
                memcpy(w->buf + (w->fill + i) * rb, src + i * src_stride, rb);
            w->fill += n;
            if (n == left) {
                if ((err = put_chunk(w, w->buf, w->fill)) != 0)
                    goto fail;
                w->fill = 0;
            }
        }
        w->rows_done += n;
        nrows -= n;
        src += n * src_stride;
    }
    return 0;
fail:
    w->failed = 1;
    return err;
}

/* The publication's reply was lost (`err`, message in engram_errmsg()):
 * closing the push's record settles what happened, as no copy of the
 * publication still in flight can get past that.  0 if the push turned
 * out published; else frees w and returns the failure, saying what it
 * left. */
static int resolve(pwriter *w, int err, const char *text, size_t tlen)
{
    const engram__pub *p = w->p;
    char first[ENGRAM__ERRMSG_MAX], *v = NULL;
    size_t n = 0;
    int rerr, res;

    snprintf(first, sizeof first, "%s", engram_errmsg());
    at_step("resolve", w->m.name);
    for (int tries = 0; tries < 3; tries++) {
        engram__rpending c = w->rp;
        char closed[REC_MAX];
        size_t clen;
        uint64_t now;
        c.closed = 1;
        free(v);
        v = NULL;
        if ((rerr = now_ms(p, w->s, &now)) != 0)
            break;
        clen = rec_text(&c, now, closed);
        if ((rerr = rec_swap(p, w->s, w->m.name, w->rec, w->rec_len, closed, clen, &res)) != 0)
            break;
        if (res == ENGRAM__KV_DONE) {
            /* Closed by us: nothing can publish it now, once the
             * replicas have the closing (a failover that lost it would
             * let a late copy of the publication land on chunks deleted
             * here). */
            if (p->vt->sync(p->kv, w->s) != 0 || finish(p, w->s, &c, closed, clen) != 0)
                engram__err(err, "push of '%s' failed, not published: %s (its chunks are left "
                                 "for engram_store_gc(): %s)",
                            w->m.name, first, engram_errmsg());
            else
                engram__err(err, "push of '%s' failed, not published: %s", w->m.name, first);
            pwriter_free(w);
            return err;
        }
        if ((rerr = rec_get(p, w->s, w->m.name, &v, &n)) == -ENOENT)
            break;
        if (rerr)
            break;
        if (n == tlen && memcmp(v, text, n) == 0) {
            /* Published, by the lost publication.  Written again on this
             * session, so that the sync after it covers it. */
            free(v);
            v = NULL;
            if ((rerr = rec_cas(p, w->s, w->m.name, text, tlen, text, tlen, &res)) != 0)
                break;
            return 0;
        }
        /* Still this push's open record, stamped otherwise (a late copy
         * of a stamp): close that one. */
        if (readopt(w) != 0) {
            rerr = -ECANCELED;
            break;
        }
    }
    free(v);
    if (rerr == -ECANCELED || rerr == -ENOENT) {
        /* Closed (and maybe already deleted) by another party: a gc. */
        err = engram__err(err, "push of '%s' failed, not published (its pending record was "
                               "settled by a gc, which deletes its chunks): %s",
                          w->m.name, first);
        pwriter_free(w);
        return err;
    }
    err = engram__err(ENGRAM_EINDOUBT,
                      "push of '%s' to %s: the outcome is in doubt: the publication got no "
                      "answer (%s), and asking afterwards failed too (%s).  Its chunks are kept: "
                      "if the table is listed later, it is published and whole; if not, "
                      "engram_store_gc() deletes them once the push has shown no life for %u ms",
                      w->m.name, p->where, first, engram_errmsg(), p->ttl_ms);
    pwriter_free(w);
    return err;
}

int engram__pub_writer_commit(void *wp)
{
    pwriter *w = wp;
    const engram__pub *p = w->p;
    char *text = NULL;
    size_t tlen;
    int err, res;

    if (w->rows_done != w->m.num_rows) {
        err = engram__err(ENGRAM_ESTATE, "table '%s': only %" PRIu64 " of %" PRIu64
                                         " rows were written",
                          w->m.name, w->rows_done, w->m.num_rows);
        goto fail;
    }
    /* Step 3: the chunks become permanent, with the record stamped now
     * and then, so that no gc takes a long commit for a dead one ... */
    if ((err = touch(w)) != 0)
        goto fail;
    at_step("persist", w->m.name);
    for (uint64_t i = 0; i < w->chunks_done; i++) {
        if (engram__now_ns() >= w->renew_ns && (err = touch(w)) != 0)
            goto fail;
        if ((err = p->vt->piece_expire(p->kv, w->s, &w->pc, i, 0)) != 0) {
            if (err == -ENODATA)
                err = engram__err(-ENODATA, "push of '%s' to %s: chunk %" PRIu64 " is gone "
                                            "(expired or removed) before publication",
                                  w->m.name, p->where, i);
            goto fail;
        }
    }
    /* ... and on the replicas, before the manifest makes them a table. */
    if ((err = p->vt->sync(p->kv, w->s)) != 0) {
        err = engram__err(err, "push of '%s' to %s: %s", w->m.name, p->where, engram_errmsg());
        goto fail;
    }
    w->m.checksum = XXH3_64bits_digest(w->xs);
    w->m.created_ns = engram__wall_ns();
    if ((err = engram__rmanifest_encode(&w->m, &text, &tlen)) != 0)
        goto fail;
    /* Step 4: publication, the swap of the open record for the manifest. */
    at_step("publish", w->m.name);
    for (int tries = 0;; tries++) {
        err = rec_swap(p, w->s, w->m.name, w->rec, w->rec_len, text, tlen, &res);
        if (err) {
            /* Whether it ran is unknown: find out before anything is
             * deleted. */
            if ((err = resolve(w, err, text, tlen)) != 0) {
                free(text);
                return err;
            }
            break;
        }
        if (res == ENGRAM__KV_DONE)
            break;
        /* Other bytes: a late copy of a stamp (still ours: again), or a
         * gc closed the record. */
        if (tries < 2 && readopt(w) == 0)
            continue;
        err = engram__err(-ECANCELED, "push of '%s' to %s was abandoned: its pending record was "
                                      "closed by a gc (engram_store_gc()) before it could "
                                      "publish",
                          w->m.name, p->where);
        goto fail;
    }
    changed(p);
    /* The table is published; a manifest not yet on the replicas may be
     * lost in a failover, which the caller should hear of. */
    if ((err = p->vt->sync(p->kv, w->s)) != 0)
        err = engram__err(ENGRAM_EINDOUBT,
                          "table '%s' is published in %s, but its manifest may not be on the "
                          "replicas, and a failover would lose it: %s.  If it is listed later, "
                          "it is published and whole",
                          w->m.name, p->where, engram_errmsg());
    free(text);
    pwriter_free(w);
    return err;
fail:
    free(text);
    return fail_discard(w, err);
}
