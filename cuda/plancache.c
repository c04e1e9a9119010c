/*
 * plancache.c - lookups by tables (engram_cuda_lookup_tables): the plans a
 * context keeps per set of columns, per stream on the host path, with
 * staging that grows; and ordering a stream after a producer stream
 * (engram_cuda_order_after).
 *
 * An entry is a set of columns (op, tables, scale tables, offsets), for
 * the host path also a stream, and the plan that serves it.  A lookup
 * hashes its columns, finds the entry under the plan cache's lock and launches
 * with its plan after releasing the lock (see plancache.h for why that is
 * safe).  A miss creates the plan without the lock, then inserts it unless
 * another thread got there first.  A host-path plan whose staging is too
 * small is replaced in its entry by a larger one; the old one is retired:
 * it stays in the context's plan list until engram_cuda_close().
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"

struct engram__cuda_entry {
    uint64_t hash;
    uint32_t op;
    uint32_t K;
    int host;             /* host path: the plan serves `stream` only */
    cudaStream_t stream;  /* host: the stream served */
    size_t max_T;         /* host: tokens its staging holds */
    engram_cuda_plan *plan;
    int64_t *offsets;         /* [K], zeros for none */
    engram_table_id *tables;  /* [K] */
    engram_table_id *scales;  /* [K] or NULL */
};

void engram__cuda_plancache_init(engram__cuda_plancache *k)
{
    memset(k, 0, sizeof *k);
    pthread_mutex_init(&k->lock, NULL);
    pthread_mutex_init(&k->wait_lock, NULL);
}

void engram__cuda_plancache_fini(engram__cuda_plancache *k)
{
    if (k->wait_ev)
        (void)cudaEventDestroy(k->wait_ev);
    for (size_t i = 0; i < k->n; i++)
        free(k->entries[i]); /* one block with its arrays */
    free(k->entries);
    pthread_mutex_destroy(&k->lock);
    pthread_mutex_destroy(&k->wait_lock);
    memset(k, 0, sizeof *k);
}

/* ------------------------------------------------------------------------
 * Entries.
 */

static uint64_t mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

static uint64_t key_hash(const engram_cuda_plan_args *a)
{
    uint64_t h = mix(mix(0, a->op), a->num_cols);
    h = mix(h, a->scale_tables != NULL);
    for (size_t k = 0; k < a->num_cols; k++) {
        h = mix(h, a->tables[k]);
        h = mix(h, a->offsets ? (uint64_t)a->offsets[k] : 0);
        if (a->scale_tables)
            h = mix(h, a->scale_tables[k]);
    }
    return h;
}

/* The entry is for a's columns (NULL offsets are zeros). */
static int key_equal(const engram__cuda_entry *e, const engram_cuda_plan_args *a, uint64_t h)
{
    size_t K = a->num_cols;
    if (e->hash != h || e->op != a->op || e->K != K ||
        (e->scales != NULL) != (a->scale_tables != NULL))
        return 0;
    if (memcmp(e->tables, a->tables, K * sizeof *a->tables) != 0 ||
        (a->scale_tables && memcmp(e->scales, a->scale_tables, K * sizeof *a->tables) != 0))
        return 0;
    if (a->offsets)
        return memcmp(e->offsets, a->offsets, K * sizeof *a->offsets) == 0;
    for (size_t k = 0; k < K; k++)
        if (e->offsets[k])
            return 0;
    return 1;
}

/* The entry serving a's columns on stream s, or NULL; under k->lock. */
static engram__cuda_entry *entry_find(engram__cuda_plancache *k, const engram_cuda_plan_args *a,
                                      uint64_t h, cudaStream_t s)
{
#define ENTRY_SERVES(e) (key_equal((e), a, h) && (!(e)->host || (e)->stream == s))
    if (k->last < k->n && ENTRY_SERVES(k->entries[k->last]))
        return k->entries[k->last];
    for (size_t i = 0; i < k->n; i++)
        if (ENTRY_SERVES(k->entries[i])) {
            k->last = i;
            return k->entries[i];
        }
    return NULL;
#undef ENTRY_SERVES
}

/* The entry's plan serves a lookup of T tokens. */
static int entry_fits(const engram__cuda_entry *e, size_t T)
{
    return e && (!e->host || T <= e->max_T);
}

/* 1 when a's columns have host-path plans for ENGRAM_CUDA_HOST_STREAMS
 * streams already; under k->lock. */
static int streams_full(const engram__cuda_plancache *k, const engram_cuda_plan_args *a, uint64_t h)
{
    unsigned n = 0;
    for (size_t i = 0; i < k->n; i++)
        n += key_equal(k->entries[i], a, h) != 0;
    return n >= ENGRAM_CUDA_HOST_STREAMS;
}

static int streams_full_err(void)
{
    return engram__cuda_fail(ENGRAM_ESTATE,
                             "these tables (without a base address: gathered on the "
                             "CPU) already have plans for %u streams, each with its own "
                             "staging: look them up on fewer streams",
                             ENGRAM_CUDA_HOST_STREAMS);
}

/* Adds an entry for a's columns served by `plan`; under k->lock.  0 or
 * -ENOMEM (no message: the caller sets it once the lock is released). */
static int entry_add(engram__cuda_plancache *k, const engram_cuda_plan_args *a, uint64_t h,
                     int host, cudaStream_t s, size_t max_T, engram_cuda_plan *plan)
{
    size_t K = a->num_cols, nsc = a->scale_tables ? K : 0;
    engram__cuda_entry *e;
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 8;
        engram__cuda_entry **v = realloc(k->entries, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        k->entries = v;
        k->cap = cap;
    }
    /* One block: the entry, then the int64 offsets (aligned after it),
     * then the table ids. */
    e = malloc(sizeof *e + K * sizeof(int64_t) + (K + nsc) * sizeof(engram_table_id));
    if (!e)
        return -ENOMEM;
    e->hash = h;
    e->op = a->op;
    e->K = (uint32_t)K;
    e->host = host;
    e->stream = s;
    e->max_T = max_T;
    e->plan = plan;
    e->offsets = (int64_t *)(void *)(e + 1);
    e->tables = (engram_table_id *)(void *)(e->offsets + K);
    e->scales = nsc ? e->tables + K : NULL;
    if (a->offsets)
        memcpy(e->offsets, a->offsets, K * sizeof *e->offsets);
    else
        memset(e->offsets, 0, K * sizeof *e->offsets);
    memcpy(e->tables, a->tables, K * sizeof *e->tables);
    if (nsc)
        memcpy(e->scales, a->scale_tables, K * sizeof *e->scales);
    k->last = k->n;
    k->entries[k->n++] = e;
    return 0;
}

/* ------------------------------------------------------------------------
 * Lookups by tables.
 */

/* 1 if work enqueued on `s` now would go into a graph being captured (or,
 * for the legacy stream, break another stream's capture). */
static int capturing(cudaStream_t s)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s ? s : cudaStreamLegacy, &cs);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* Any other error (a bad handle) is left to the calls that follow. */
        return e == cudaErrorStreamCaptureImplicit;
    }
    return cs != cudaStreamCaptureStatusNone;
}

static const char warm_up[] =
    "runs before any capture: it registers the tables with the GPU and uploads descriptors, "
    "which a capture forbids (do one such lookup on this stream first)";

/* The miss: creates the plan of a's columns for a lookup of T tokens on
 * `stream` and enters it, or takes the one another thread entered
 * meanwhile.  `had`: tokens of the stream's host-path plan being outgrown,
 * or 0 when there is none.  The context's device is current. */
static int plan_make(engram_cuda_ctx *c, const engram_cuda_plan_args *a, uint64_t h, size_t T,
                     size_t had, cudaStream_t stream, engram_cuda_plan **out)
{
    engram__cuda_plancache *k = &c->plancache;
    engram_cuda_plan_args pa = *a;
    engram_cuda_plan *plan = NULL;
    engram__cuda_entry *e;
    int host = had != 0, err, full = 0;

    if (capturing(stream)) {
        if (had)
            return engram__cuda_fail(
                ENGRAM_ESTATE,
                "a GPU lookup of %zu tokens on tables without a base address "
                "(gathered on the CPU) grows its staging, made for %zu, which "
                "allocates: a capture forbids it (do a lookup of as many tokens "
                "on this stream before capturing, or give a larger max_tokens)",
                T, had);
        return engram__cuda_fail(ENGRAM_ESTATE,
                                 "the first GPU lookup of these tables and offsets %s", warm_up);
    }
    for (size_t i = 0; i < a->num_cols && !host; i++)
        host = engram_internal_v1()->table_memory(c->st, a->tables[i], NULL, NULL) == -ENOTSUP;
    if (host && stream == cudaStreamPerThread)
        return engram__cuda_fail(-EINVAL,
                                 "stream: tables without a base address are gathered on the "
                                 "CPU into staging kept per stream, and cudaStreamPerThread "
                                 "is another stream in each thread: pass an explicit stream");
    if (host && !had) {
        pthread_mutex_lock(&k->lock);
        full = streams_full(k, a, h);
        pthread_mutex_unlock(&k->lock);
        if (full)
            return streams_full_err();
    }
    pa.max_tokens = 0;
    if (host) {
        size_t base = had ? (had > SIZE_MAX / 2 ? had : 2 * had)
                          : a->max_tokens ? a->max_tokens : ENGRAM_CUDA_HOST_TOKENS;
        pa.max_tokens = T > base ? T : base;
    }
    if ((err = engram_cuda_plan_create(c, &pa, &plan)) != 0)
        return err;

    pthread_mutex_lock(&k->lock);
    e = entry_find(k, a, h, stream);
    if (entry_fits(e, T)) { /* another thread's, made meanwhile */
        *out = e->plan;
        pthread_mutex_unlock(&k->lock);
        engram_cuda_plan_destroy(plan);
        return 0;
    }
    if (e) { /* grow: the old plan is retired, not destroyed (see plancache.h) */
        e->plan = plan;
        e->max_T = pa.max_tokens;
        pthread_mutex_unlock(&k->lock);
        *out = plan;
        return 0;
    }
    /* Other threads may have made plans for other streams meanwhile: the
     * bound holds after the fact too. */
    if (!(full = host && streams_full(k, a, h)))
        err = entry_add(k, a, h, host, stream, pa.max_tokens, plan);
    pthread_mutex_unlock(&k->lock);
    if (full || err) {
        engram_cuda_plan_destroy(plan);
        return full ? streams_full_err()
                    : engram__cuda_fail(-ENOMEM, "out of memory for a plan entry");
    }
    *out = plan;
    return 0;
}

int engram_cuda_lookup_tables(engram_cuda_ctx *c, const engram_cuda_plan_args *cols,
                              const engram_cuda_lookup_args *a, cudaStream_t stream)
{
    engram_cuda_plan *plan = NULL;
    engram__cuda_entry *e;
    size_t had = 0;
    uint64_t h;
    int cur = -1, err;
    cudaError_t ce;

    if (ENGRAM__UNLIKELY(!c || !a || a->size != sizeof *a))
        return engram__cuda_fail(-EINVAL, "engram_cuda_lookup_tables: ctx and args (with size = "
                                          "sizeof(engram_cuda_lookup_args)) are required");
    if (ENGRAM__UNLIKELY((err = engram__cuda_plan_args_check(cols, "engram_cuda_lookup_tables"))))
        return err;
    h = key_hash(cols);
    pthread_mutex_lock(&c->plancache.lock);
    e = entry_find(&c->plancache, cols, h, stream);
    if (entry_fits(e, a->num_tokens))
        plan = e->plan;
    else if (e)
        had = e->max_T;
    pthread_mutex_unlock(&c->plancache.lock);

    /* The context's device, for the capture query of the legacy stream
     * (one per device), plan creation and the launch; cudaGetDevice and
     * cudaSetDevice are allowed under capture. */
    if (ENGRAM__UNLIKELY((ce = cudaGetDevice(&cur)) != cudaSuccess))
        return engram__cuda_err(ce, "cudaGetDevice");
    if (cur != c->device && (ce = cudaSetDevice(c->device)) != cudaSuccess)
        return engram__cuda_err(ce, "making the context's device %d current", c->device);
    if (!plan)
        err = plan_make(c, cols, h, a->num_tokens, had, stream, &plan);
    if (!err)
        err = engram__cuda_lookup_current(plan, a, stream);
    if (cur != c->device && (ce = cudaSetDevice(cur)) != cudaSuccess) {
        if (!err) /* the lookup is queued, but the caller's device is not current */
            return engram__cuda_err(ce, "making the caller's device %d current again", cur);
        (void)cudaGetLastError();
    }
    return err;
}

/* ------------------------------------------------------------------------
 * Ordering after a producer stream.
 */

int engram_cuda_order_after(engram_cuda_ctx *c, cudaStream_t stream, cudaStream_t producer)
{
    engram__cuda_plancache *k;
    engram__cuda_scope prev;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    enum cudaStreamCaptureStatus cp = cudaStreamCaptureStatusNone;
    cudaError_t e;
    int err;

    if (!c)
        return engram__cuda_fail(-EINVAL, "engram_cuda_order_after: ctx is NULL");
    stream = stream ? stream : cudaStreamLegacy;
    producer = producer ? producer : cudaStreamLegacy;
    if (stream == producer)
        return 0;
    if ((err = engram__cuda_enter(c, &prev)) != 0)
        return err;
    k = &c->plancache;
    /* The legacy stream cannot be asked while a blocking stream is being
     * captured (cudaErrorStreamCaptureImplicit), and recording on it then
     * would break that capture. */
    if ((e = cudaStreamIsCapturing(producer, &cp)) == cudaErrorStreamCaptureImplicit) {
        (void)cudaGetLastError();
        if (!capturing(stream))
            err = engram__cuda_fail(ENGRAM_ESTATE,
                                    "the producer stream is the legacy default stream, "
                                    "which cannot be waited for while a blocking stream "
                                    "is being captured");
        goto out;
    }
    if (e != cudaSuccess || (e = cudaStreamIsCapturing(stream, &cs)) != cudaSuccess)
        goto fail;
    /* A producer outside the capture of `stream` made its work before the
     * capture began: nothing to order within the graph. */
    if (cs != cudaStreamCaptureStatusNone && cp == cudaStreamCaptureStatusNone)
        goto out;
    if (cs == cudaStreamCaptureStatusNone && cp != cudaStreamCaptureStatusNone) {
        err = engram__cuda_fail(ENGRAM_ESTATE,
                                "the producer stream is being captured into a graph but "
                                "the stream to order after it is not: waiting would "
                                "pull that stream into the graph (look up on the "
                                "captured stream)");
        goto out;
    }
    pthread_mutex_lock(&k->wait_lock);
    if (!k->wait_ev && (e = cudaEventCreateWithFlags(&k->wait_ev, cudaEventDisableTiming)) !=
                           cudaSuccess)
        k->wait_ev = NULL;
    else if ((e = cudaEventRecord(k->wait_ev, producer)) == cudaSuccess)
        e = cudaStreamWaitEvent(stream, k->wait_ev, 0);
    pthread_mutex_unlock(&k->wait_lock);
    if (e != cudaSuccess)
        goto fail;
out:
    engram__cuda_leave(c, &prev);
    return err;
fail:
    err = engram__cuda_err(e, "ordering a stream after its producer stream");
    goto out;
}
