/*
 * stats.c - the store's counters: the per-thread stats slot of the lookup
 * path, and the sums of engram_store_stats(), engram_get_cache_stats()
 * and the cache stats line.
 *
 * Lookups count in per-thread stats slots (table.h's counters and the store's
 * own): a thread takes a slot of its own once, and while there are slots
 * left it is the only writer of its slot, so its counts take no locked
 * instruction.  The sums here add the slots up with relaxed loads,
 * walking the registry without the store's lock (store.h): figures
 * that are each exact, read while lookups go on.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>

#include "reader.h"
#include "rowcache.h"
#include "readsection.h"
#include "stats.h"
#include "store.h"

/* stats.h */
unsigned engram__stats_slot(int *exclusive)
{
    static _Atomic unsigned next;
    /* initial-exec: a plain %fs-relative load even in the shared library,
     * instead of a __tls_get_addr call on every lookup. */
    static _Thread_local int mine __attribute__((tls_model("initial-exec"))) = -1;
    if (ENGRAM__UNLIKELY(mine < 0))
        mine = (int)atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
    if (mine < ENGRAM__STATS_SLOTS - 1) {
        *exclusive = 1;
        return (unsigned)mine;
    }
    *exclusive = 0;
    return ENGRAM__STATS_SLOTS - 1;
}

/* stats.h */
void engram__stats_sum(engram_store *st, engram_stats *out)
{
    engram_stats all, *s = &all;
    uint32_t size = out->size;
    memset(s, 0, sizeof *s);
    s->size = size;
    s->threads = (uint32_t)st->threads;
    for (int i = 0; i < ENGRAM__STATS_SLOTS; i++) {
        const engram__store_counters *c = &st->ctr[i];
        s->lookups += atomic_load_explicit(&c->lookups, memory_order_relaxed);
        s->failed += atomic_load_explicit(&c->failed, memory_order_relaxed);
        s->rows += atomic_load_explicit(&c->rows, memory_order_relaxed);
        s->dead_rows += atomic_load_explicit(&c->dead, memory_order_relaxed);
        s->bytes += atomic_load_explicit(&c->bytes, memory_order_relaxed);
        s->parallel += atomic_load_explicit(&c->parallel, memory_order_relaxed);
        s->time_ns += atomic_load_explicit(&c->time_ns, memory_order_relaxed);
    }
    for (uint32_t i = 0; i < engram__table_count(st); i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_relaxed)) {
            if (t->src.base) {
                s->tables_open++;
                s->mapped_bytes += t->data_size;
            }
        } else if (!atomic_load_explicit(&t->released, memory_order_relaxed)) {
            s->removed_tables++;
            s->removed_bytes += t->data_size;
        }
    }
    memcpy(out, s, size);
}

/* ------------------------------------------------------------------------
 * Row cache stats: the counters of tables with a row source.
 */

static void add_cache_stats(const engram__table *t, engram_cache_stats *s)
{
    s->tables++;
    for (int i = 0; i < ENGRAM__STATS_SLOTS; i++) {
        const engram__table_counters *c = &t->ctr[i];
        s->hits += atomic_load_explicit(&c->hits, memory_order_relaxed);
        s->misses += atomic_load_explicit(&c->misses, memory_order_relaxed);
        s->dedup += atomic_load_explicit(&c->dedup, memory_order_relaxed);
        s->not_kept += atomic_load_explicit(&c->not_kept, memory_order_relaxed);
        s->reads += atomic_load_explicit(&c->reads, memory_order_relaxed);
        s->bytes_read += atomic_load_explicit(&c->bytes, memory_order_relaxed);
        s->read_errors += atomic_load_explicit(&c->errors, memory_order_relaxed);
    }
    if (t->src.vt && t->src.vt->cache_stats)
        t->src.vt->cache_stats(t->src.state, s);
    if (t->src.cache)
        engram__rcache_stats(t->src.cache, s);
}

int engram_get_cache_stats(engram_store *st, const char *name, engram_cache_stats *s)
{
    engram_cache_stats all;
    engram__cbudget *b;
    engram__reader *rd;
    uint32_t size;
    int err = 0;
    if (!st || !s || s->size != sizeof(engram_cache_stats))
        return engram__err(-EINVAL, "store and stats (with size = sizeof(engram_cache_stats)) "
                                    "are required");
    if (name && (err = engram_name_check(name)) != 0)
        return err;
    size = s->size;
    memset(&all, 0, sizeof all);
    all.size = size;
    all.ways = ENGRAM_CACHE_WAYS;
    /* A read section keeps the caches read here from being released. */
    if ((err = engram__rsec_enter()) != 0)
        return err;
    /* Acquire pairs with the release stores that published them. */
    b = atomic_load_explicit(&st->budget, memory_order_acquire);
    rd = atomic_load_explicit(&st->reader, memory_order_acquire);
    all.budget_bytes = b ? engram__cbudget_total(b)
                     : st->opts.cache_bytes ? st->opts.cache_bytes
                                            : ENGRAM__CACHE_DEFAULT_BUDGET;
    all.queue_depth = rd ? atomic_load_explicit(&st->queue_depth, memory_order_relaxed)
                      : st->opts.queue_depth ? st->opts.queue_depth
                                             : ENGRAM__RD_DEFAULT_QD;
    all.staging_bytes = b ? engram__cbudget_staging(b) : 0;
    if (name) {
        engram__table *t = engram__table_find(st, name);
        if (!t || !t->src.ops.read_rows)
            err = engram__err(-ENOENT, "table '%s' is not an open table read through a source",
                              name);
        else
            add_cache_stats(t, &all);
    } else {
        for (uint32_t i = 0; i < engram__table_count(st); i++) {
            engram__table *t = engram__table_get(st, i);
            if (t->src.ops.read_rows && !atomic_load_explicit(&t->removed, memory_order_relaxed))
                add_cache_stats(t, &all);
        }
    }
    engram__rsec_exit();
    memcpy(s, &all, size);
    return err;
}

void engram__store_maybe_log(engram_store *st)
{
    engram_cache_stats s = ENGRAM_CACHE_STATS_INIT;
    uint64_t now = engram__now_ns(), due;
    due = atomic_load_explicit(&st->next_log_ns, memory_order_relaxed);
    /* The CAS makes exactly one of the lookups that notice the interval
     * has passed print. */
    if (now < due || !atomic_compare_exchange_strong_explicit(&st->next_log_ns, &due,
                                                              now + st->log_ns,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed))
        return;
    if (engram_get_cache_stats(st, NULL, &s) != 0)
        return;
    /* Asked for by the store (its interval), so it reaches stderr even
     * without a log function. */
    engram__log(ENGRAM_LOG_INFO, ENGRAM__LOG_ASKED,
                "cache %s: hit rate %.1f%% (%" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
                " deduplicated, %" PRIu64 " not kept), %" PRIu64 " reads, %.1f MiB read, %" PRIu64 " errors, %.1f MiB in %"
                PRIu64 " slots (%u ways), %.1f MiB staging, %" PRIu64 "/%" PRIu64
                " tables O_DIRECT",
                st->path,
                s.hits + s.misses ? 100.0 * (double)s.hits / (double)(s.hits + s.misses) : 0.0,
                s.hits, s.misses, s.dedup, s.not_kept, s.reads, (double)s.bytes_read / 1048576.0,
                s.read_errors, (double)s.cache_bytes / 1048576.0, s.slots, s.ways,
                (double)s.staging_bytes / 1048576.0, s.direct_tables, s.tables);
}
