/*
 * async.c - lookups that run on the store's lookup threads while the
 * caller goes on (engram_lookup_submit, engram_ngram_lookup_submit), and
 * tokens to rows in one call (engram_ngram_lookup).
 *
 * An engine knows every Engram layer's ids at the start of a forward pass
 * and needs a layer's rows only when that layer runs: it submits each
 * layer's lookup at once and waits for each when it needs it, so slow
 * tiers (files, Redis, a caller's source) read while the model computes.
 *
 * The pending lookup (engram_pending) is the one object caller and worker
 * share.  Its life:
 *
 *   QUEUED --worker takes it--> RUNNING --done--> DONE
 *      \--caller cancels, or the store closes--> CANCELLED
 *
 * Each step from QUEUED is a compare-and-swap, so exactly one of the
 * worker and the canceller wins it.  The object is held by two references,
 * the queue's and the caller's (wait or cancel drops it); whoever drops
 * the last frees it, so a cancelled lookup still in the queue is freed by
 * the worker that finds it, and the caller may wait after the store is
 * closed (close cancels what did not start and joins the workers).  The
 * result, the message and the bad id are written before DONE under the
 * lookup's own mutex, and the waiter reads them after seeing DONE under
 * it; the worker's thread-local message is handed over that way, so
 * engram_errmsg() after a wait is the lookup's.
 *
 * The workers (as many as the store's gather threads, at least one) start
 * with the first submit.  After fork() the child's first submit starts
 * workers of its own; lookups the parent submitted are the parent's: in
 * the child, no worker would ever finish them, so waiting for or
 * cancelling one fails at once (ENGRAM_ESTATE) instead of blocking.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "async.h"
#include "common.h"
#include "store.h"

#define MAX_WORKERS 16

enum { QUEUED, RUNNING, DONE, CANCELLED };

struct engram_pending {
    _Atomic int state;
    _Atomic int refs;
    pid_t pid;            /* the submitter's: a child of fork() has no workers of it */
    engram_pending *next; /* the queue (the async's lock) */
    engram_store *st;     /* while queued or running */
    /* The lookup, its arrays copied. */
    engram_lookup_args look;
    engram_table_id *tables;
    int64_t *offsets;
    /* Tokens to rows: the hash of one layer, then the lookup of its ids
     * (ngram_run(), in the lookup thread's buffer). */
    const engram_ngram_hasher *hasher;
    engram_ngram_hash_args hash;
    /* The outcome (mu). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int result;
    int have_bad;
    engram_bad_id bad;
    char msg[ENGRAM__ERRMSG_MAX];
};

struct engram__async {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work queued, or stopping */
    engram_pending *head, *tail;
    int stopping;
    int nworkers;
    pthread_t workers[MAX_WORKERS];
    pid_t pid;
};

static void pending_unref(engram_pending *p)
{
    /* acq_rel: the last dropper sees every write of the other before it
     * frees. */
    if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->tables);
    free(p->offsets);
    free(p);
}

/* Records the outcome and wakes the waiter. */
static void pending_finish(engram_pending *p, int state, int rc, const char *msg,
                           const engram_bad_id *bad)
{
    pthread_mutex_lock(&p->mu);
    p->result = rc;
    if (rc)
        snprintf(p->msg, sizeof p->msg, "%s", msg);
    if (bad) {
        p->bad = *bad;
        p->have_bad = 1;
    }
    p->st = NULL;
    /* Release: the outcome above is visible to whoever sees the state. */
    atomic_store_explicit(&p->state, state, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Tokens to rows once ngram_args() has filled ho and lo: the hash into
 * this thread's ids buffer (T x C int64, kept for its next calls), then
 * the lookup of those ids. */
static int ngram_run(engram_store *st, const engram_ngram_hasher *h, engram_ngram_hash_args *ho,
                     engram_lookup_args *lo)
{
    size_t n = ho->num_tokens * lo->num_cols;
    int64_t *ids;
    int err;
    if (!(ids = engram__scratch(ENGRAM__SCRATCH_NGRAM, (n ? n : 1) * sizeof *ids)))
        return engram__err(-ENOMEM, "out of memory for %zu ids", n);
    ho->out = ids;
    lo->ids = ids;
    if ((err = engram_ngram_hash(h, ho)) != 0)
        return err;
    return engram_lookup(st, lo);
}

/* Runs p's job on this thread: its result (the message in errmsg). */
static int run_job(engram_pending *p)
{
    if (p->hasher)
        return ngram_run(p->st, p->hasher, &p->hash, &p->look);
    return engram_lookup(p->st, &p->look);
}

static void *worker_main(void *arg)
{
    struct engram__async *as = arg;
    for (;;) {
        engram_pending *p;
        int expect = QUEUED, rc;
        pthread_mutex_lock(&as->mu);
        while (!as->head && !as->stopping)
            pthread_cond_wait(&as->cv, &as->mu);
        if (!as->head) {
            pthread_mutex_unlock(&as->mu);
            return NULL;
        }
        p = as->head;
        as->head = p->next;
        if (!as->head)
            as->tail = NULL;
        pthread_mutex_unlock(&as->mu);
        /* acquire: the submitter's writes to the job are visible (they
         * also came through the queue's lock). */
        if (!atomic_compare_exchange_strong_explicit(&p->state, &expect, RUNNING,
                                                     memory_order_acq_rel,
                                                     memory_order_acquire)) {
            pending_unref(p); /* cancelled while queued */
            continue;
        }
        rc = run_job(p);
        if (rc) {
            engram_bad_id bad = ENGRAM_BAD_ID_INIT;
            int have = rc == ENGRAM_EBADID && engram_last_bad_id(&bad) == 0;
            pending_finish(p, DONE, rc, engram_errmsg(), have ? &bad : NULL);
        } else {
            pending_finish(p, DONE, 0, NULL, NULL);
        }
        pending_unref(p);
    }
}

/* The store's async state, started on first use (or again in a child of
 * fork()): NULL with a message if the workers cannot start. */
static struct engram__async *async_get(engram_store *st)
{
    struct engram__async *as = atomic_load_explicit(&st->async, memory_order_acquire);
    int n;
    if (as && as->pid == getpid())
        return as;
    pthread_mutex_lock(&st->lock);
    as = atomic_load_explicit(&st->async, memory_order_relaxed);
    if (as && as->pid == getpid()) {
        pthread_mutex_unlock(&st->lock);
        return as;
    }
    /* A parent's state in a child is left alone: its threads are not
     * here, and its lookups are the parent's. */
    if (!(as = calloc(1, sizeof *as))) {
        pthread_mutex_unlock(&st->lock);
        engram__err(-ENOMEM, "out of memory for the lookup threads");
        return NULL;
    }
    pthread_mutex_init(&as->mu, NULL);
    pthread_cond_init(&as->cv, NULL);
    as->pid = getpid();
    n = st->threads < 1 ? 1 : st->threads > MAX_WORKERS ? MAX_WORKERS : st->threads;
    for (int i = 0; i < n; i++) {
        int e = pthread_create(&as->workers[i], NULL, worker_main, as);
        if (e) {
            if (i == 0) {
                pthread_cond_destroy(&as->cv);
                pthread_mutex_destroy(&as->mu);
                free(as);
                pthread_mutex_unlock(&st->lock);
                engram__errno(e, "start a lookup thread");
                return NULL;
            }
            break; /* fewer workers is fine */
        }
        as->nworkers++;
    }
    /* Release: a submitter that sees the pointer sees it made. */
    atomic_store_explicit(&st->async, as, memory_order_release);
    pthread_mutex_unlock(&st->lock);
    return as;
}

void engram__async_stop(engram_store *st)
{
    struct engram__async *as = atomic_load_explicit(&st->async, memory_order_acquire);
    engram_pending *p, *next;
    if (!as || as->pid != getpid())
        return;
    pthread_mutex_lock(&as->mu);
    as->stopping = 1;
    p = as->head;
    as->head = as->tail = NULL;
    pthread_cond_broadcast(&as->cv);
    pthread_mutex_unlock(&as->mu);
    /* What no worker took does not run. */
    for (; p; p = next) {
        int expect = QUEUED;
        next = p->next;
        if (atomic_compare_exchange_strong_explicit(&p->state, &expect, CANCELLED,
                                                    memory_order_acq_rel, memory_order_acquire))
            pending_finish(p, CANCELLED, ENGRAM_ESTATE,
                           "the store was closed before the lookup ran", NULL);
        pending_unref(p);
    }
    for (int i = 0; i < as->nworkers; i++)
        pthread_join(as->workers[i], NULL);
    pthread_cond_destroy(&as->cv);
    pthread_mutex_destroy(&as->mu);
    free(as);
    atomic_store_explicit(&st->async, NULL, memory_order_relaxed);
}

/* A pending lookup of `a` with its tables and offsets copied. */
static int pending_new(engram_store *st, const engram_lookup_args *a, engram_pending **out)
{
    engram_pending *p;
    *out = NULL;
    if (!st || !a)
        return engram__err(-EINVAL, "store and args are required");
    if (a->size != sizeof *a)
        return engram__err(-EINVAL, "engram_lookup_args.size is %u, expected %zu", a->size,
                           sizeof *a);
    if (a->num_cols > SIZE_MAX / sizeof(int64_t))
        return engram__err(-EINVAL, "num_cols %zu is too large", a->num_cols);
    if (!(p = calloc(1, sizeof *p)))
        return engram__err(-ENOMEM, "out of memory for a pending lookup");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->state, QUEUED);
    atomic_init(&p->refs, 2);
    p->pid = getpid();
    p->st = st;
    p->look = *a;
    if (a->num_cols && a->tables) {
        if (!(p->tables = malloc(a->num_cols * sizeof *p->tables)))
            goto nomem;
        memcpy(p->tables, a->tables, a->num_cols * sizeof *p->tables);
        p->look.tables = p->tables;
    }
    if (a->num_cols && a->offsets) {
        if (!(p->offsets = malloc(a->num_cols * sizeof *p->offsets)))
            goto nomem;
        memcpy(p->offsets, a->offsets, a->num_cols * sizeof *p->offsets);
        p->look.offsets = p->offsets;
    }
    *out = p;
    return 0;
nomem:
    atomic_store_explicit(&p->refs, 1, memory_order_relaxed);
    pending_unref(p);
    return engram__err(-ENOMEM, "out of memory for a pending lookup");
}

/* Queues p: 0, or the failure (p freed). */
static int pending_submit(engram_store *st, engram_pending *p, engram_pending **out)
{
    struct engram__async *as = async_get(st);
    if (!as) {
        atomic_store_explicit(&p->refs, 1, memory_order_relaxed);
        pending_unref(p);
        return engram__err(-EAGAIN, "%s", engram_errmsg());
    }
    pthread_mutex_lock(&as->mu);
    if (as->tail)
        as->tail->next = p;
    else
        as->head = p;
    as->tail = p;
    pthread_cond_signal(&as->cv);
    pthread_mutex_unlock(&as->mu);
    *out = p;
    return 0;
}

int engram_lookup_submit(engram_store *st, const engram_lookup_args *args, engram_pending **out)
{
    engram_pending *p;
    int err;
    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    if ((err = pending_new(st, args, &p)) != 0)
        return err;
    return pending_submit(st, p, out);
}

/* Waits for p's outcome and frees it; the message and bad id become this
 * thread's. */
static int pending_take(engram_pending *p)
{
    int rc, s;
    pthread_mutex_lock(&p->mu);
    while ((s = atomic_load_explicit(&p->state, memory_order_acquire)) != DONE &&
           s != CANCELLED)
        pthread_cond_wait(&p->cv, &p->mu);
    rc = p->result;
    if (rc) {
        engram__err(rc, "%s", p->msg);
        if (p->have_bad)
            engram__set_bad_id(&p->bad);
    }
    pthread_mutex_unlock(&p->mu);
    pending_unref(p);
    return rc;
}

/* A lookup a parent submitted before fork(): no thread of this process
 * runs it or ever finishes it, and its lock may have been held at the
 * fork, so it is not touched (nor freed: the parent's copy is the one). */
static int foreign(const engram_pending *p)
{
    return p->pid != getpid();
}

static int foreign_err(const engram_pending *p)
{
    return engram__err(ENGRAM_ESTATE, "the lookup was submitted by process %ld before a fork: "
                                      "only that process can wait for it or cancel it",
                       (long)p->pid);
}

int engram_lookup_wait(engram_pending *p)
{
    if (!p)
        return engram__err(-EINVAL, "pending lookup is NULL");
    if (foreign(p))
        return foreign_err(p);
    return pending_take(p);
}

int engram_lookup_done(const engram_pending *p)
{
    int s;
    if (!p)
        return engram__err(-EINVAL, "pending lookup is NULL");
    if (foreign(p))
        return 1; /* a wait fails at once */
    s = atomic_load_explicit(&((engram_pending *)(uintptr_t)p)->state, memory_order_acquire);
    return s == DONE || s == CANCELLED;
}

int engram_lookup_cancel(engram_pending *p)
{
    int expect = QUEUED;
    if (!p)
        return engram__err(-EINVAL, "pending lookup is NULL");
    if (foreign(p))
        return foreign_err(p);
    if (atomic_compare_exchange_strong_explicit(&p->state, &expect, CANCELLED,
                                                memory_order_acq_rel, memory_order_acquire)) {
        /* Not started: it never will; the queue's reference goes with
         * the worker that finds it. */
        pending_finish(p, CANCELLED, -ECANCELED, "the lookup was cancelled before it ran",
                       NULL);
    }
    return pending_take(p);
}

/* ------------------------------------------------------------------------
 * Tokens to rows.
 */

/* Checks a fused lookup's arguments and fills its hash and lookup from
 * them (the ids are ngram_run()'s); one[] (ENGRAM_NGRAM_MAX_COLS) holds
 * the layer's table for each column where num_tables is 1. */
static int ngram_args(const engram_ngram_hasher *h, const engram_ngram_hash_args *hash,
                      const engram_table_id *tables, size_t num_tables,
                      const engram_lookup_args *look, engram_table_id *one,
                      engram_ngram_hash_args *ho, engram_lookup_args *lo)
{
    size_t C;
    if (!h || !hash || !look || !tables)
        return engram__err(-EINVAL, "hasher, hash args, tables and lookup args are required");
    if (hash->size != sizeof *hash || look->size != sizeof *look)
        return engram__err(-EINVAL, "engram_ngram_hash_args.size or engram_lookup_args.size is "
                                    "wrong");
    if (hash->layer < 0)
        return engram__err(-EINVAL, "tokens to rows reads one layer: hash.layer must be its "
                                    "index, not %d",
                           hash->layer);
    C = engram__ngram_cols(h); /* at least 1 */
    if (hash->num_tokens > SIZE_MAX / sizeof(int64_t) / C)
        return engram__err(-EINVAL, "num_tokens %zu is too large", hash->num_tokens);
    if (num_tables != 1 && num_tables != C)
        return engram__err(-EINVAL, "num_tables %zu: 1 (the layer's table, global ids) or the "
                                    "layer's %zu columns (a table each, local ids)",
                           num_tables, C);
    if (look->tables || look->ids || look->offsets || look->num_cols)
        return engram__err(-EINVAL, "the lookup args' tables, ids, offsets and num_cols come "
                                    "from the hash: leave them unset");
    *ho = *hash;
    ho->flags = num_tables == 1 ? hash->flags & ~ENGRAM_NGRAM_LOCAL
                                : hash->flags | ENGRAM_NGRAM_LOCAL;
    ho->out = NULL;
    ho->out_type = ENGRAM_ID_INT64;
    *lo = *look;
    lo->num_tokens = hash->num_tokens;
    lo->num_cols = C;
    if (num_tables == 1) {
        for (size_t c = 0; c < C; c++)
            one[c] = tables[0];
        lo->tables = one;
    } else {
        lo->tables = tables;
    }
    lo->id_type = ENGRAM_ID_INT64;
    lo->id_stride_t = 0;
    lo->id_stride_k = 0;
    return 0;
}

int engram_ngram_lookup(engram_store *st, const engram_ngram_hasher *h,
                        const engram_ngram_hash_args *hash, const engram_table_id *tables,
                        size_t num_tables, const engram_lookup_args *look)
{
    engram_table_id one[ENGRAM_NGRAM_MAX_COLS];
    engram_ngram_hash_args ho;
    engram_lookup_args lo;
    int err;
    if (!st)
        return engram__err(-EINVAL, "store is NULL");
    if ((err = ngram_args(h, hash, tables, num_tables, look, one, &ho, &lo)) != 0)
        return err;
    return ngram_run(st, h, &ho, &lo);
}

int engram_ngram_lookup_submit(engram_store *st, const engram_ngram_hasher *h,
                               const engram_ngram_hash_args *hash, const engram_table_id *tables,
                               size_t num_tables, const engram_lookup_args *look,
                               engram_pending **out)
{
    engram_table_id one[ENGRAM_NGRAM_MAX_COLS];
    engram_ngram_hash_args ho;
    engram_lookup_args lo;
    engram_pending *p;
    int err;
    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    *out = NULL;
    /* pending_new() copies the columns' tables. */
    if ((err = ngram_args(h, hash, tables, num_tables, look, one, &ho, &lo)) != 0 ||
        (err = pending_new(st, &lo, &p)) != 0)
        return err;
    p->hasher = h;
    p->hash = ho;
    return pending_submit(st, p, out);
}
