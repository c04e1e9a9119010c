/*
 * store.c - the store's life and its registry of tables: making a store
 * (a memory store here; a directory's in nsdir.c, a Redis Cluster's in
 * redis.c) and closing it; adding tables (bind, engram_add_source, a
 * table of the namespace opened); removing them and releasing what they
 * held; the context source modules get (the reader and the cache budget).
 *
 * Everything here runs off the lookup path.  store->lock is held only for
 * the registry and namespace bookkeeping, never across slow work: a table
 * is opened, mapped, prefaulted and checked first, and only its
 * publication in the registry takes the lock.  The one contract with
 * gather.c is the registry layout of store.h: tables are appended and
 * published with release stores, and freed only at close.  What a store
 * does in its namespace goes through the namespace interface (remote.h,
 * st->ns) with no branch on the namespace's kind; what it tells of its
 * tables is tableinfo.c's, its counters stats.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "async.h"
#include "pool.h"
#include "reader.h"
#include "remote.h"
#include "readsection.h"
#include "rowcache.h"
#include "stats.h"
#include "store.h"

int engram__store_alloc(const engram_store_options *opts, engram_store **out)
{
    engram_store *st;
    long ncpu;
    *out = NULL;
    if (opts && opts->size != sizeof(engram_store_options))
        return engram__err(-EINVAL, "engram_store_options.size is %u, expected %zu",
                           opts->size, sizeof(engram_store_options));
    if (opts && opts->threads < 0)
        return engram__err(-EINVAL, "threads is %d (must be >= 0)", opts->threads);
    if (opts && (opts->flags & ENGRAM_OPEN_FILE_CACHE) && (opts->flags & ENGRAM_OPEN_PRIVATE_HUGE))
        return engram__err(-EINVAL, "ENGRAM_OPEN_FILE_CACHE reads rows on demand and "
                                    "ENGRAM_OPEN_PRIVATE_HUGE copies whole tables into memory: "
                                    "choose one");
    st = calloc(1, sizeof *st);
    if (!st)
        return engram__err(-ENOMEM, "out of memory for a store");
    st->dirfd = -1;
    atomic_init(&st->lease_fd, -1);
    st->uid = geteuid();
    {
        static _Atomic uint64_t serials;
        st->serial = atomic_fetch_add_explicit(&serials, 1, memory_order_relaxed) + 1;
    }
    if (opts)
        memcpy(&st->opts, opts, opts->size);
    /* The placement is checked now, once; its strings are the caller's and
     * are not kept. */
    {
        int err = engram__numa_resolve(&st->opts, &st->numa);
        st->opts.numa_gpu = st->opts.numa_nodes = NULL;
        if (err) {
            free(st);
            return err;
        }
    }
    st->opts.size = sizeof st->opts;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->opened_cv, NULL);
    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    st->threads = st->opts.threads ? st->opts.threads : (int)(ncpu < 1 ? 1 : ncpu > 8 ? 8 : ncpu);
    /* The default threshold: below it, waking a sleeping worker (tens of
     * microseconds on a VM) costs more than the rows it would copy.  See
     * docs/performance.md for the measurement behind it. */
    st->parallel_min_rows = st->opts.parallel_min_rows ? st->opts.parallel_min_rows : 4096;
    if (st->opts.cache_log_ms) {
        st->log_ns = (uint64_t)st->opts.cache_log_ms * 1000000u;
    } else {
        const char *env = getenv("ENGRAM_CACHE_LOG_MS");
        if (env && atol(env) > 0)
            st->log_ns = (uint64_t)atol(env) * 1000000u;
    }
    atomic_init(&st->next_log_ns, engram__now_ns() + st->log_ns);
    if (st->threads > 1) {
        int err = engram__pool_create(st->threads - 1, &st->pool);
        if (err) {
            pthread_mutex_destroy(&st->lock);
            pthread_cond_destroy(&st->opened_cv);
            free(st);
            return err;
        }
    }
    *out = st;
    return 0;
}

/* A placement is for memory the store writes or copies; a store that has
 * none (a memory store, a Redis Cluster's) refuses it rather than ignore
 * it.  On refusal *st is closed and NULL. */
static int no_placement(engram_store **st, const char *what)
{
    if ((*st)->numa.policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    engram_store_close(*st);
    *st = NULL;
    return engram__err(-EINVAL, "NUMA placement: %s writes no table files and makes no private "
                                "copies; place the memory you bind yourself",
                       what);
}

int engram_store_open_memory(const engram_store_options *opts, engram_store **out)
{
    int err;
    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    if ((err = engram__store_alloc(opts, out)) != 0)
        return err;
    if ((err = no_placement(out, "a memory store")) != 0)
        return err;
    (*out)->path = strdup("(memory)");
    if (!(*out)->path) {
        engram_store_close(*out);
        *out = NULL;
        return engram__err(-ENOMEM, "out of memory");
    }
    return 0;
}

int engram__store_open_remote(const engram_store_options *opts, const char *path,
                              const engram__remote_vt *vt, void *rs, engram_store **out)
{
    engram_store *st;
    int err;
    if ((err = engram__store_alloc(opts, &st)) != 0 ||
        (err = no_placement(&st, "a store of a Redis Cluster")) != 0)
        return err;
    if (!(st->path = strdup(path))) {
        engram_store_close(st);
        return engram__err(-ENOMEM, "out of memory");
    }
    st->ns = vt;
    st->ns_state = rs;
    *out = st;
    return 0;
}

void *engram__store_remote(engram_store *st, const engram__remote_vt *vt)
{
    return st && st->ns == vt ? st->ns_state : NULL;
}

/* Releases what a source holds: the module's state, the caller's
 * table_ud (through its release) and the row cache. */
void engram__source_release(const engram__source *src)
{
    if (src->vt && src->vt->release)
        src->vt->release(src->state);
    if (src->ops.release)
        src->ops.release(src->ops.ctx, src->table_ud);
    engram__rcache_destroy(src->cache);
}

void engram_store_close(engram_store *st)
{
    if (!st)
        return;
    /* First: submitted lookups may still read the tables. */
    engram__async_stop(st);
    engram__pool_destroy(st->pool);
    for (uint32_t i = 0; i < engram__table_count(st); i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->released, memory_order_relaxed))
            engram__source_release(&t->src);
        free(t);
    }
    /* After the tables: their sources may use the namespace's state. */
    if (st->ns)
        st->ns->close(st->ns_state);
    engram__reader_destroy(atomic_load_explicit(&st->reader, memory_order_relaxed));
    engram__cbudget_destroy(atomic_load_explicit(&st->budget, memory_order_relaxed));
    for (int c = 0; c < ENGRAM__MAX_CHUNKS; c++)
        /* The chunk's elements are atomic, the allocation is not. */
        free((void *)(uintptr_t)atomic_load_explicit(&st->chunks[c], memory_order_relaxed));
    free(st->path);
    pthread_cond_destroy(&st->opened_cv);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

engram__table *engram__find_locked(engram_store *st, const char *name, engram_table_id *id)
{
    uint32_t n = atomic_load_explicit(&st->ntables, memory_order_relaxed);
    for (uint32_t i = 0; i < n; i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_relaxed) &&
            strcmp(t->name, name) == 0) {
            if (id)
                *id = i;
            return t;
        }
    }
    return NULL;
}

/* Appends t to the registry (st->lock held). */
static int registry_append_locked(engram_store *st, engram__table *t, engram_table_id *id)
{
    uint32_t i = atomic_load_explicit(&st->ntables, memory_order_relaxed);
    _Atomic(engram__table *) *chunk;
    if (i >= (uint32_t)ENGRAM__MAX_CHUNKS * ENGRAM__CHUNK)
        return engram__err(-ENOSPC, "a store holds at most %u tables",
                           (unsigned)ENGRAM__MAX_CHUNKS * ENGRAM__CHUNK);
    chunk = atomic_load_explicit(&st->chunks[i >> ENGRAM__CHUNK_BITS], memory_order_relaxed);
    if (!chunk) {
        chunk = calloc(ENGRAM__CHUNK, sizeof *chunk);
        if (!chunk)
            return engram__err(-ENOMEM, "out of memory for the table registry");
        /* Release: a lookup that sees the chunk sees it zeroed. */
        atomic_store_explicit(&st->chunks[i >> ENGRAM__CHUNK_BITS], chunk, memory_order_release);
    }
    t->id = i;
    /* Release: a lookup that loads this pointer sees the table complete. */
    atomic_store_explicit(&chunk[i & (ENGRAM__CHUNK - 1)], t, memory_order_release);
    /* Release: a walker that reads the new count sees the table's pointer. */
    atomic_store_explicit(&st->ntables, i + 1, memory_order_release);
    *id = i;
    return 0;
}

static engram__table *table_new(const char *name, const engram_table_spec *spec, uint64_t size,
                                const engram__source *src)
{
    engram__table *t = aligned_alloc(ENGRAM__CACHELINE,
                                     engram__align_up(sizeof *t, ENGRAM__CACHELINE));
    if (!t)
        return NULL;
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->spec = *spec;
    t->spec.row_pitch = engram__spec_pitch(spec);
    t->data_size = size;
    t->src = *src;
    return t;
}

int engram__name_taken_locked(engram_store *st, const char *name)
{
    return engram__find_locked(st, name, NULL) != NULL ||
           (st->ns && st->ns->has && st->ns->has(st->ns_state, name));
}

struct engram__claim {
    struct engram__claim *next;
    char name[ENGRAM_NAME_MAX + 1];
};

static int claimed_locked(engram_store *st, const char *name)
{
    for (const struct engram__claim *c = st->claims; c; c = c->next)
        if (strcmp(c->name, name) == 0)
            return 1;
    return 0;
}

/* Waits (st->lock held) until no other thread opens `name`, then claims
 * it.  -ENOMEM with the message if the claim cannot be recorded. */
static int claim_locked(engram_store *st, const char *name)
{
    struct engram__claim *c;
    while (claimed_locked(st, name))
        pthread_cond_wait(&st->opened_cv, &st->lock);
    if (!(c = malloc(sizeof *c)))
        return engram__err(-ENOMEM, "out of memory");
    snprintf(c->name, sizeof c->name, "%s", name);
    c->next = st->claims;
    st->claims = c;
    return 0;
}

static void unclaim_locked(engram_store *st, const char *name)
{
    for (struct engram__claim **pp = &st->claims; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->name, name) == 0) {
            struct engram__claim *c = *pp;
            *pp = c->next;
            free(c);
            break;
        }
    }
    pthread_cond_broadcast(&st->opened_cv);
}

int engram__store_claim(engram_store *st, const char *name)
{
    int err;
    pthread_mutex_lock(&st->lock);
    if ((err = claim_locked(st, name)) == 0 && engram__name_taken_locked(st, name)) {
        unclaim_locked(st, name);
        err = engram__err(-EEXIST, "table '%s' already exists in %s", name, st->path);
    }
    pthread_mutex_unlock(&st->lock);
    return err;
}

void engram__store_unclaim(engram_store *st, const char *name)
{
    pthread_mutex_lock(&st->lock);
    unclaim_locked(st, name);
    pthread_mutex_unlock(&st->lock);
}

int engram__store_add_table(engram_store *st, const char *name, const engram_table_spec *spec,
                            const engram__source *src, engram_table_id *id)
{
    engram__table *t;
    uint64_t size;
    engram_table_id tmp;
    int err;

    if (!st || !src || (!src->base && !src->ops.read_rows))
        return engram__err(-EINVAL, "add table: a store and a source with rows are required");
    if ((err = engram_name_check(name)) != 0 || (err = engram__spec_size(spec, &size)) != 0)
        return err;
    if (!(t = table_new(name, spec, size, src)))
        return engram__err(-ENOMEM, "out of memory");
    pthread_mutex_lock(&st->lock);
    if (engram__name_taken_locked(st, name))
        err = engram__err(-EEXIST, "table '%s' already exists in %s", name, st->path);
    else
        err = registry_append_locked(st, t, id ? id : &tmp);
    pthread_mutex_unlock(&st->lock);
    if (err)
        free(t);
    return err;
}

int engram__store_ctx_get(engram_store *st, engram__store_ctx *ctx)
{
    engram__cbudget *b;
    engram__reader *rd;
    int err = 0;
    pthread_mutex_lock(&st->lock);
    b = atomic_load_explicit(&st->budget, memory_order_relaxed);
    if (!b) {
        if ((err = engram__cbudget_create(st->opts.cache_bytes, &b)) != 0)
            goto out;
        /* Release: a reader of the pointer without the lock (the stats)
         * sees the budget made. */
        atomic_store_explicit(&st->budget, b, memory_order_release);
    }
    rd = atomic_load_explicit(&st->reader, memory_order_relaxed);
    if (!rd) {
        /* A ring per gather thread and a few more for lookups from other
         * threads; a lookup that reads waits only when all are busy. */
        if ((err = engram__reader_create(st->opts.queue_depth, (unsigned)st->threads + 2, b,
                                         &rd)) != 0)
            goto out;
        /* Before the reader's release store: a reader of the pointer
         * sees its queue depth. */
        atomic_store_explicit(&st->queue_depth, engram__reader_queue_depth(rd),
                              memory_order_relaxed);
        atomic_store_explicit(&st->reader, rd, memory_order_release);
    }
    ctx->budget = b;
    ctx->reader = rd;
    ctx->flags = st->opts.flags;
out:
    pthread_mutex_unlock(&st->lock);
    if (err == 0)
        ctx->namespace_bytes = st->ns && st->ns->bytes ? st->ns->bytes(st->ns_state) : 0;
    return err;
}

int engram_bind(engram_store *st, const char *name, const engram_table_spec *spec,
                const void *mem)
{
    engram__source src;
    if (!mem)
        return engram__err(-EINVAL, "bind '%s': memory is NULL", name ? name : "?");
    memset(&src, 0, sizeof src);
    src.kind = ENGRAM_TABLE_BOUND;
    src.base = mem;
    return engram__store_add_table(st, name, spec, &src, NULL);
}

int engram_add_source(engram_store *st, const char *name, const engram_table_spec *spec,
                      const engram_source_ops *ops, void *table_ud, uint64_t cache_bytes,
                      engram_table_id *id)
{
    engram__source src;
    engram__store_ctx ctx;
    int err;

    if (!st || !ops)
        return engram__err(-EINVAL, "add source: store and ops are required");
    if (ops->size != sizeof(engram_source_ops) || ops->flags != 0 || !ops->read_rows)
        return engram__err(-EINVAL, "add source '%s': ops must have size = "
                                    "sizeof(engram_source_ops) (%zu, not %u), flags 0 and "
                                    "read_rows",
                           name ? name : "?", sizeof(engram_source_ops), ops->size);
    if ((err = engram_name_check(name)) != 0 || (err = engram_spec_check(spec)) != 0)
        return err;
    memset(&src, 0, sizeof src);
    src.kind = ENGRAM_TABLE_SOURCE;
    src.ops = *ops;
    src.table_ud = table_ud;
    if (cache_bytes > 0) {
        engram__cache_want want = {cache_bytes, 0, 0, 0};
        if ((err = engram__store_ctx_get(st, &ctx)) != 0 ||
            (err = engram__rcache_create(ctx.budget, &want, spec->row_bytes, spec->num_rows,
                                         ctx.flags, name, &src.cache)) != 0)
            return err;
    }
    /* Not engram__source_release(): the caller's release is for tables
     * the store took. */
    if ((err = engram__store_add_table(st, name, spec, &src, id)) != 0)
        engram__rcache_destroy(src.cache);
    return err;
}


/* With ENGRAM_OPEN_NUMA_LOCAL: the name of the copy of `name` on the
 * calling thread's node, into buf, if the store or its namespace has that
 * table; else `name`. */
static const char *local_copy(engram_store *st, const char *name, char *buf, size_t cap)
{
    int node, have;
    if (!(st->opts.flags & ENGRAM_OPEN_NUMA_LOCAL) || engram__numa_is_copy_name(name) ||
        (node = engram__numa_current_node()) < 0 ||
        engram__numa_copy_name(buf, cap, name, node) >= cap ||
        !engram__name_valid(buf))
        return name;
    pthread_mutex_lock(&st->lock);
    have = engram__name_taken_locked(st, buf);
    pthread_mutex_unlock(&st->lock);
    return have ? buf : name;
}

int engram_table_open(engram_store *st, const char *name, engram_table_id *id)
{
    engram__table *t = NULL, *have;
    engram__store_ctx ctx;
    engram__source src;
    engram_table_spec spec;
    char copy[ENGRAM_NAME_MAX + 1];
    uint64_t size;
    int err = 0;

    if (!st || !id)
        return engram__err(-EINVAL, "store and id are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    name = local_copy(st, name, copy, sizeof copy);
    pthread_mutex_lock(&st->lock);
    if (!(have = engram__find_locked(st, name, id)) && st->ns) {
        /* A second opener of the name waits for the first and then finds
         * its table (or tries again if it failed). */
        err = claim_locked(st, name);
        if (err == 0 && (have = engram__find_locked(st, name, id)) != NULL)
            unclaim_locked(st, name);
    }
    pthread_mutex_unlock(&st->lock);
    if (have || err)
        return err;
    if (!st->ns)
        return engram__err(-ENOENT, "table '%s' is not bound in this memory store", name);
    /* What removed tables hold goes first (a row cache's share of the
     * budget, a mapping), where no running lookup can still read it. */
    engram__store_release_removed(st, 0);
    /* The slow part (reading the table's description, mapping,
     * prefaulting, verifying) runs without the store's lock: lookups and
     * other opens go on. */
    memset(&src, 0, sizeof src);
    if ((!st->ns->lazy_ctx && (err = engram__store_ctx_get(st, &ctx)) != 0) ||
        (err = st->ns->open(st->ns_state, st->ns->lazy_ctx ? NULL : &ctx, name, &spec, &size,
                            &src)) != 0) {
        engram__store_unclaim(st, name);
        return err;
    }
    if (!(t = table_new(name, &spec, size, &src))) {
        engram__source_release(&src);
        engram__store_unclaim(st, name);
        return engram__err(-ENOMEM, "out of memory");
    }
    pthread_mutex_lock(&st->lock);
    /* Another table of the name (a bind while we opened it) is the table:
     * nobody else opened this one, they wait for our claim.  The
     * namespace checks, under the lock a removal takes, that what it
     * opened is still the table of that name. */
    if (!engram__find_locked(st, name, id) &&
        (!st->ns->current_locked ||
         (err = st->ns->current_locked(st->ns_state, name, &src)) == 0) &&
        (err = registry_append_locked(st, t, id)) == 0)
        t = NULL;
    unclaim_locked(st, name);
    pthread_mutex_unlock(&st->lock);
    if (t) {
        engram__source_release(&src);
        free(t);
    }
    if (err == 0 && st->ns->use)
        st->ns->use(st->ns_state);
    return err;
}

/* engram_table_open_wait() where the namespace has no way to be woken:
 * it looks again, every 10 ms at first, doubling to 200 ms. */
static int poll_open_wait(engram_store *st, const char *name, int timeout_ms,
                          uint64_t deadline, engram_table_id *id)
{
    uint64_t pause = 10000000u;
    for (;;) {
        uint64_t now = engram__now_ns(), ns;
        struct timespec ts;
        int err;
        if (now >= deadline)
            return engram__err(-ETIMEDOUT, "table '%s' was not published in %s within %d ms",
                               name, st->path, timeout_ms);
        ns = deadline - now < pause ? deadline - now : pause;
        ts.tv_sec = (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        nanosleep(&ts, NULL);
        if (pause < 200000000u)
            pause *= 2;
        if ((err = engram_table_open(st, name, id)) != -ENOENT)
            return err;
    }
}

int engram_table_open_wait(engram_store *st, const char *name, int timeout_ms,
                           engram_table_id *id)
{
    uint64_t deadline;
    int err = engram_table_open(st, name, id);
    if (err != -ENOENT || timeout_ms == 0 || !st->ns)
        return err;
    deadline = timeout_ms < 0 ? UINT64_MAX : engram__now_ns() + (uint64_t)timeout_ms * 1000000u;
    /* A store waiting on the namespace uses it. */
    if (st->ns->use)
        st->ns->use(st->ns_state);
    if (st->ns->wait)
        return st->ns->wait(st->ns_state, name, timeout_ms, deadline, id);
    return poll_open_wait(st, name, timeout_ms, deadline, id);
}

/* How long engram_remove() waits for the lookups that were running to
 * finish before it releases the table's source; a longer one (a source's
 * slow read_rows in another lookup) leaves the release to a later remove,
 * table open or stats call, or to the close. */
#define RELEASE_WAIT_NS 50000000u

/* Releases the sources of the removed tables once no read section can
 * reach them any more, waiting at most wait_ns for the open ones to
 * close.  A table whose memory engram_table_memory() lent out stays
 * mapped until close (its contract).  Not under st->lock: waiting for a
 * lookup under it could wait for a source that takes it. */
void engram__store_release_removed(engram_store *st, uint64_t wait_ns)
{
    engram__table *list, *t, *next, **tail;
    pthread_mutex_lock(&st->lock);
    list = st->retired;
    st->retired = NULL;
    pthread_mutex_unlock(&st->lock);
    if (!list)
        return;
    if (engram__rsec_sync(wait_ns) != 0) {
        /* Sections still open (or called from inside one): later. */
        pthread_mutex_lock(&st->lock);
        for (tail = &list; *tail; tail = &(*tail)->retired_next)
            ;
        *tail = st->retired;
        st->retired = list;
        pthread_mutex_unlock(&st->lock);
        return;
    }
    for (t = list; t; t = next) {
        next = t->retired_next;
        t->retired_next = NULL;
        if (atomic_load_explicit(&t->lent, memory_order_relaxed))
            continue;
        engram__source_release(&t->src);
        atomic_store_explicit(&t->released, 1, memory_order_relaxed);
    }
}

/* store.h */
const char *engram__bound_kind(uint32_t kind)
{
    switch (kind) {
    case ENGRAM_TABLE_SAFETENSORS:
        return "served from a checkpoint";
    case ENGRAM_TABLE_SOURCE:
        return "served by a source (engram_add_source)";
    case ENGRAM_TABLE_REDIS:
        return "a table of a Redis Cluster";
    default:
        return "bound to caller memory";
    }
}

/* Marks t removed and puts it on the list of tables whose source is
 * released once no lookup can read it (st->lock held). */
static void retire_locked(engram_store *st, engram__table *t)
{
    atomic_store_explicit(&t->removed, 1, memory_order_release);
    /* Release: a lookup that sees the new generation sees the table
     * removed, and resolves its columns again (gather.c's memo). */
    atomic_fetch_add_explicit(&st->gen, 1, memory_order_release);
    t->retired_next = st->retired;
    st->retired = t;
}

int engram_store_gc(engram_store *st, uint64_t idle_s, uint32_t flags,
                    engram_gc_report_fn report, void *ud)
{
    if (!st)
        return engram__err(-EINVAL, "store is NULL");
    if (flags & ~ENGRAM_GC_DRY_RUN)
        return engram__err(-EINVAL, "unknown flags 0x%x", flags & ~ENGRAM_GC_DRY_RUN);
    if (!st->ns)
        return 0;
    return st->ns->gc(st->ns_state, idle_s > UINT64_MAX / 1000u ? UINT64_MAX : idle_s * 1000u,
                      flags, report, ud);
}

/* engram_remove(): the namespace unpublishes the table first (without
 * the lock: it may be network I/O), then the store's copy is retired.
 * An open that added the table meanwhile had found it published, so it
 * is retired too; one that had not yet is told by the namespace's
 * current_locked() that it is gone. */
int engram_remove(engram_store *st, const char *name)
{
    engram__table *t;
    int err, unpublished = 0;
    if (!st)
        return engram__err(-EINVAL, "store is NULL");
    if ((err = engram_name_check(name)) != 0)
        return err;
    pthread_mutex_lock(&st->lock);
    t = engram__find_locked(st, name, NULL);
    pthread_mutex_unlock(&st->lock);
    if (t && !st->ns)
        return engram__err(ENGRAM_EBOUND, "table '%s' is %s, not a table file; close the store "
                                          "to release it",
                           name, engram__bound_kind(t->src.kind));
    if (!st->ns)
        return engram__err(-ENOENT, "table '%s' not found in this memory store", name);
    if (t && t->src.kind != st->ns->kind)
        return engram__err(ENGRAM_EBOUND, "table '%s' is %s, not a table of %s; close the "
                                          "store to release it",
                           name, engram__bound_kind(t->src.kind), st->path);
    err = st->ns->remove(st->ns_state, name, &unpublished);
    if (err == -ENOENT && t)
        err = 0; /* removed by someone else already: forget our copy too */
    else if (!unpublished)
        return err;
    pthread_mutex_lock(&st->lock);
    if ((t = engram__find_locked(st, name, NULL)) != NULL && t->src.kind == st->ns->kind)
        retire_locked(st, t);
    else
        t = NULL;
    pthread_mutex_unlock(&st->lock);
    if (t)
        engram__store_release_removed(st, RELEASE_WAIT_NS);
    return err;
}

int engram_store_stats(engram_store *st, engram_stats *out)
{
    if (!st || !out || out->size != sizeof(engram_stats))
        return engram__err(-EINVAL, "store and stats (with size = sizeof(engram_stats)) are "
                                    "required");
    /* What removed tables still hold, released first where it can be
     * without waiting. */
    engram__store_release_removed(st, 0);
    engram__stats_sum(st, out);
    return 0;
}
