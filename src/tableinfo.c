/*
 * tableinfo.c - what a store tells of its tables: engram_get_table_info(),
 * engram_get_table_placement(), engram_table_memory(), engram_list() and
 * engram_verify().
 *
 * All of it reads the registry without the store's lock, as lookups do
 * (store.h): a table found stays valid until close, and a read section
 * (rsec.h) keeps its source from being released while it is looked at.
 * A table not open in the store is the namespace's to describe
 * (remote.h); a memory store has none.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "mapfile.h"
#include "remote.h"
#include "readsection.h"
#include "store.h"

int engram_table_memory(engram_store *st, engram_table_id id, const void **base,
                        engram_table_spec *spec)
{
    engram__table *t;
    int err = 0;
    if (base)
        *base = NULL;
    if (!st || !(t = engram__table_get(st, id)))
        return engram__err(-EINVAL, "table id %u is not a table id of this store", (unsigned)id);
    /* In a read section: a removal that releases the table waits for it,
     * and then sees it lent. */
    if ((err = engram__rsec_enter()) != 0)
        return err;
    if (atomic_load_explicit(&t->removed, memory_order_acquire)) {
        err = engram__err(ENGRAM_EREMOVED, "table '%s' was removed", t->name);
    } else {
        if (spec)
            *spec = t->spec;
        if (!t->src.base) {
            err = engram__err(-ENOTSUP, "table '%s' has no base address: its rows are read on "
                                        "demand from its source",
                              t->name);
        } else if (base) {
            atomic_store_explicit(&t->lent, 1, memory_order_relaxed);
            *base = t->src.base;
        }
    }
    engram__rsec_exit();
    return err;
}

static void counters_sum(const engram__table *t, uint64_t *lookups, uint64_t *rows)
{
    *lookups = *rows = 0;
    for (int s = 0; s < ENGRAM__STATS_SLOTS; s++) {
        *lookups += atomic_load_explicit(&t->ctr[s].lookups, memory_order_relaxed);
        *rows += atomic_load_explicit(&t->ctr[s].rows, memory_order_relaxed);
    }
}

/* Fills *info (a whole current struct) about table `name`. */
static int table_info(engram_store *st, const char *name, engram_table_info *info)
{
    engram__table *t;
    int err = 0;

    /* No lock: a table found stays valid until close, and reading
     * /proc/self/smaps takes a while.  A read section keeps its source
     * from being released meanwhile (a removal then waits for it). */
    if ((err = engram__rsec_enter()) != 0)
        return err;
    if ((t = engram__table_find(st, name)) != NULL) {
        info->kind = t->src.kind;
        info->spec = t->spec;
        info->data_size = t->data_size;
        if (t->src.vt && t->src.vt->info)
            t->src.vt->info(t->src.state, info);
        info->mapped = t->src.base != NULL;
        counters_sum(t, &info->lookups, &info->rows);
        info->bytes = info->rows * t->spec.row_bytes;
        if (t->src.base)
            err = engram__smaps_coverage(t->src.base, (size_t)t->data_size,
                                         &info->resident_bytes, &info->huge_bytes);
        engram__rsec_exit();
        return err;
    }
    engram__rsec_exit();
    if (!st->ns)
        return engram__err(-ENOENT, "table '%s' is not bound in this memory store", name);
    return st->ns->info(st->ns_state, name, info);
}

int engram_get_table_info(engram_store *st, const char *name, engram_table_info *info)
{
    engram_table_info all;
    uint32_t size;
    int err;

    if (!st || !info || info->size != sizeof(engram_table_info))
        return engram__err(-EINVAL, "store and info (with size = sizeof(engram_table_info)) are "
                                    "required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    /* Filled whole here, copied out as far as the caller's struct goes. */
    size = info->size;
    memset(&all, 0, sizeof all);
    err = table_info(st, name, &all);
    all.size = size;
    memcpy(info, &all, size);
    return err;
}

int engram_get_table_placement(engram_store *st, const char *name, engram_table_placement *p)
{
    engram__table *t;
    int err = 0, done = 0;

    if (!st || !p || p->size != sizeof *p)
        return engram__err(-EINVAL, "store and p (with size = sizeof(engram_table_placement)) "
                                    "are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    memset((char *)p + sizeof p->size, 0, sizeof *p - sizeof p->size);
    p->max_node = -1;
    /* A read section keeps an open table's memory mapped meanwhile. */
    if ((err = engram__rsec_enter()) != 0)
        return err;
    if ((t = engram__table_find(st, name)) != NULL) {
        done = 1;
        if (t->src.base) {
            /* This process's memory of the table: its private copy, the
             * caller's bound memory (not touched), or its shared mapping
             * of the file (pages in memory touched, to be found). */
            p->private_copy = (uint32_t)engram__mapfile_is_private(&t->src);
            err = engram__numa_query(t->src.base, (size_t)t->data_size,
                                     t->src.kind == ENGRAM_TABLE_FILE && !p->private_copy, p);
        } else if (st->ns && t->src.kind == st->ns->kind && st->ns->placement) {
            done = 0; /* read through the row cache: the namespace's pages are queried */
        } else {
            err = engram__err(-ENOTSUP, "table '%s' is not memory of this process: its rows "
                                        "are read on demand from its source",
                              name);
        }
    }
    engram__rsec_exit();
    if (done)
        return err;
    if (!st->ns)
        return engram__err(-ENOENT, "table '%s' is not bound in this memory store", name);
    if (!st->ns->placement)
        return engram__err(-ENOTSUP, "table '%s' of %s is %s, not in memory of this machine",
                           name, st->path, engram__bound_kind(st->ns->kind));
    return st->ns->placement(st->ns_state, name, p);
}

/* Adds a name of the namespace to engram_list()'s list. */
static int namelist_add_cb(void *l, const char *name)
{
    return engram__namelist_add(l, name) == 0 ? 0 : engram__err(-ENOMEM, "out of memory");
}

int engram_list(engram_store *st, char ***names, size_t *count)
{
    engram__namelist l = {0};
    int err = 0;

    if (!st || !names || !count)
        return engram__err(-EINVAL, "store, names and count are required");
    *names = NULL;
    *count = 0;
    /* Without the lock: the registry is walked as lookups walk it. */
    for (uint32_t i = 0; i < engram__table_count(st) && !err; i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_acquire))
            err = engram__namelist_add(&l, t->name);
    }
    /* The namespace's own message stands (it may be a network
     * failure), but for a lack of memory. */
    if (!err && st->ns)
        err = st->ns->list(st->ns_state, namelist_add_cb, &l);
    if (err == -ENOMEM)
        err = engram__err(-ENOMEM, "out of memory listing %s", st->path);
    if (!err)
        err = engram__namelist_pack(&l, st->path, names, count);
    engram__namelist_free(&l);
    return err;
}

void engram_free(void *p)
{
    free(p);
}

int engram_verify(engram_store *st, const char *name, engram_progress_fn progress, void *ud)
{
    engram__table *t;
    int err;

    if (!st)
        return engram__err(-EINVAL, "store is NULL");
    if ((err = engram_name_check(name)) != 0)
        return err;
    t = engram__table_find(st, name);
    if (t && (!st->ns || t->src.kind != st->ns->kind))
        return engram__err(ENGRAM_EBOUND, "table '%s' is %s: no checksum to verify", name,
                           engram__bound_kind(t->src.kind));
    if (!st->ns)
        return engram__err(-ENOENT, "table '%s' not found in this memory store", name);
    return st->ns->verify(st, name, progress, ud);
}
