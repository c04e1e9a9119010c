/*
 * pystore_stats.c - Store.stats(): the store's counters, those of each table
 * this object has looked up, of the row cache, and of the GPU context.
 */
#include "pystore.h"

#include <errno.h>
#include <limits.h>

#ifdef ENGRAMSTORE_HAVE_CUDA
#include <engram_cuda.h>
#endif

const char ext_store_stats_doc[] = PyDoc_STR(
"stats($self, /)\n--\n\n"
"The store's counters (lookups, failed, rows, dead_rows, bytes, parallel,\n"
"time_ns, threads, tables_open, mapped_bytes, and removed_tables and\n"
"removed_bytes: removed tables whose memory is still held) and, under\n"
"'tables', per table\n"
"looked up through this object: lookups, rows, bytes, resident_bytes,\n"
"huge_bytes, private_copy, map_minor_faults, map_major_faults.  Under\n"
"'cache', the row cache of the tables read through a source (file cache,\n"
"safetensors, add_source): tables, direct_tables, hits, misses, dedup,\n"
"not_kept, reads, "
"bytes_read, read_errors, cache_bytes, slots, ways, queue_depth, budget_bytes,\n"
"staging_bytes.  Under 'cuda', None before the first GPU lookup, then the\n"
"GPU context's: device, tables_mapped (read in place), tables_copied (from a\n"
"pinned copy), tables_host (the host path), mapped_bytes, copied_bytes,\n"
"copy_huge, plans, lookups, host_gathers.  Under 'redis', None unless the\n"
"store is a namespace of a Redis Cluster, then its client's counters: nodes,\n"
"batches, gets, commands, moved, ask, retries, connects, conn_errors,\n"
"map_refreshes, timeouts, local_tables (tables opened from their local copy:\n"
"redis_local_dir).");

const char ext_store_usage_doc[] = PyDoc_STR(
"usage($self, name, /)\n--\n\n"
"A dict: who holds the memory of table file `name` (open or not): processes (that\n"
"map it, this one included), unreadable (processes whose maps this one may\n"
"not read: not counted) and unreadable_may_map (True if they may map some of\n"
"it, told from the PSS of its resident pages; False if none, or shown to map\n"
"none), rss_bytes and pss_bytes (this process's), total_pss_bytes (the\n"
"resident bytes all of them map, each page once), file_bytes (its blocks),\n"
"and cgroup: the memory cgroup its pages are charged to (the one of the\n"
"process that wrote them), None where it cannot be told (it needs\n"
"CAP_SYS_ADMIN), with cgroup_pages of sampled_pages.  Walks /proc, and when\n"
"some process cannot be read may map the table's resident pages here (some\n"
"tenths of a second a GiB): not for a hot path.");

PyObject *ext_store_usage(StoreObject *s, PyObject *name)
{
    engram_table_usage u = ENGRAM_TABLE_USAGE_INIT;
    const char *cname;
    int rc;
    if (!(cname = ext_str_arg(name, "name")))
        return NULL;
    if (ext_store_enter(s) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_get_table_usage(s->st, cname, &u);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc, NULL);
    return Py_BuildValue("{s:I,s:I,s:N,s:K,s:K,s:K,s:K,s:N,s:I,s:I}", "processes", u.processes,
                         "unreadable", u.unreadable, "unreadable_may_map",
                         PyBool_FromLong(u.unreadable_may_map), "rss_bytes",
                         (unsigned long long)u.rss_bytes, "pss_bytes",
                         (unsigned long long)u.pss_bytes, "total_pss_bytes",
                         (unsigned long long)u.total_pss_bytes, "file_bytes",
                         (unsigned long long)u.file_bytes, "cgroup",
                         u.cgroup[0] ? PyUnicode_DecodeFSDefault(u.cgroup) : Py_NewRef(Py_None),
                         "cgroup_pages", u.cgroup_pages, "sampled_pages", u.sampled_pages);
}

const char ext_store_placement_doc[] = PyDoc_STR(
"placement($self, name, /)\n--\n\n"
"A dict: where the pages of table `name` are, as move_pages(2) reports them:\n"
"nodes ({node: pages}), page_size, pages (of the table), sampled (pages looked\n"
"at: all, or 65536 evenly spaced ones of a larger table), absent (of those, not\n"
"in memory), other_nodes (on nodes >= 64) and private_copy (True: this\n"
"process's private copy, huge_pages=True; False: the shared file pages or bound\n"
"memory).  A table file need not be open; only pages already in memory are\n"
"looked at.  Raises EngramError with errno ENOTSUP for a table that is not\n"
"memory (read on demand) or a library built without libnuma.");

/* The placement of `cname`: 0 and *p, the library's negative code, or
 * INT_MIN with an exception raised (a closed store). */
static int placement_of(StoreObject *s, const char *cname, engram_table_placement *p)
{
    int rc;
    if (ext_store_enter(s) < 0)
        return INT_MIN;
    Py_BEGIN_ALLOW_THREADS
    rc = engram_get_table_placement(s->st, cname, p);
    ext_store_leave(s);
    Py_END_ALLOW_THREADS
    return rc;
}

/* {node: pages} of the nodes holding sampled pages; NULL on error. */
static PyObject *nodes_dict(const engram_table_placement *p)
{
    PyObject *d = PyDict_New();
    for (int n = 0; d && n <= p->max_node && n < ENGRAM_NUMA_MAX_NODES; n++) {
        PyObject *k, *v;
        int bad;
        if (!p->node_pages[n])
            continue;
        k = PyLong_FromLong(n);
        v = PyLong_FromUnsignedLongLong((unsigned long long)p->node_pages[n]);
        bad = !k || !v || PyDict_SetItem(d, k, v) < 0;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (bad)
            Py_CLEAR(d);
    }
    return d;
}

PyObject *ext_store_numa_nodes(StoreObject *s, const char *cname)
{
    engram_table_placement p = ENGRAM_TABLE_PLACEMENT_INIT;
    int rc = placement_of(s, cname, &p);
    if (rc == INT_MIN)
        return NULL;
    /* The spec does not fail for want of a placement: placement() says
     * why there is none. */
    if (rc < 0)
        Py_RETURN_NONE;
    return nodes_dict(&p);
}

PyObject *ext_store_placement(StoreObject *s, PyObject *name)
{
    engram_table_placement p = ENGRAM_TABLE_PLACEMENT_INIT;
    const char *cname;
    int rc;
    if (!(cname = ext_str_arg(name, "name")))
        return NULL;
    if ((rc = placement_of(s, cname, &p)) == INT_MIN)
        return NULL;
    if (rc < 0)
        return ext_raise(rc, NULL);
    return Py_BuildValue("{s:N,s:I,s:K,s:K,s:K,s:K,s:O}", "nodes", nodes_dict(&p), "page_size",
                         p.page_size, "pages", (unsigned long long)p.pages, "sampled",
                         (unsigned long long)p.sampled, "absent", (unsigned long long)p.absent,
                         "other_nodes", (unsigned long long)p.other_nodes, "private_copy",
                         p.private_copy ? Py_True : Py_False);
}

PyObject *ext_store_stats(StoreObject *s, PyObject *unused)
{
    engram_stats es = ENGRAM_STATS_INIT;
    PyObject *d = NULL, *tabs = NULL, *names = NULL, *cache = NULL, *cuda = NULL, *redis = NULL,
             *key;
    int rc;
    (void)unused;
    if (ext_store_enter(s) < 0)
        return NULL;
    rc = engram_store_stats(s->st, &es);
    ext_store_leave(s);
    if (rc < 0)
        return ext_raise(rc, NULL);
    if (!(tabs = PyDict_New()))
        return NULL;
    /* A snapshot of the names, holding them: the GIL is released for each
     * table, and other threads may add names (lookup) or drop them
     * (remove, close) meanwhile. */
    if (!(names = PyDict_Keys(s->tables)))
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        engram_table_info info;
        PyObject *td;
        const char *cname;
        key = PyList_GET_ITEM(names, i);
        cname = PyUnicode_AsUTF8(key);
        if (!cname || ext_store_enter(s) < 0)
            goto fail;
        rc = ext_store_table_info(s, cname, &info);
        ext_store_leave(s);
        if (rc == -ENOENT)
            continue; /* removed meanwhile */
        if (rc < 0) {
            ext_raise(rc, NULL);
            goto fail;
        }
        td = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:O,s:K,s:K}", "lookups",
                           (unsigned long long)info.lookups, "rows",
                           (unsigned long long)info.rows, "bytes", (unsigned long long)info.bytes,
                           "resident_bytes", (unsigned long long)info.resident_bytes,
                           "huge_bytes", (unsigned long long)info.huge_bytes, "private_copy",
                           info.private_copy ? Py_True : Py_False, "map_minor_faults",
                           (unsigned long long)info.map_minor_faults, "map_major_faults",
                           (unsigned long long)info.map_major_faults);
        if (!td || PyDict_SetItem(tabs, key, td) < 0) {
            Py_XDECREF(td);
            goto fail;
        }
        Py_DECREF(td);
    }
    {
        engram_cache_stats cs = ENGRAM_CACHE_STATS_INIT;
        if (ext_store_enter(s) < 0)
            goto fail;
        rc = engram_get_cache_stats(s->st, NULL, &cs);
        ext_store_leave(s);
        if (rc < 0) {
            ext_raise(rc, NULL);
            goto fail;
        }
        cache = Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:K,s:K}", "tables",
                              (unsigned long long)cs.tables, "direct_tables",
                              (unsigned long long)cs.direct_tables, "hits",
                              (unsigned long long)cs.hits, "misses",
                              (unsigned long long)cs.misses, "dedup",
                              (unsigned long long)cs.dedup, "not_kept",
                              (unsigned long long)cs.not_kept, "reads", (unsigned long long)cs.reads,
                              "bytes_read", (unsigned long long)cs.bytes_read, "read_errors",
                              (unsigned long long)cs.read_errors, "cache_bytes",
                              (unsigned long long)cs.cache_bytes, "slots",
                              (unsigned long long)cs.slots, "ways", cs.ways, "queue_depth",
                              cs.queue_depth, "budget_bytes", (unsigned long long)cs.budget_bytes,
                              "staging_bytes", (unsigned long long)cs.staging_bytes);
        if (!cache)
            goto fail;
    }
    {
        engram_redis_stats rs = ENGRAM_REDIS_STATS_INIT;
        if (ext_store_enter(s) < 0)
            goto fail;
        rc = engram_get_redis_stats(s->st, &rs);
        ext_store_leave(s);
        /* Not a Redis store (or no Redis support): None. */
        redis = rc < 0 ? Py_NewRef(Py_None)
                       : Py_BuildValue("{s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "nodes",
                                       rs.nodes, "batches", (unsigned long long)rs.batches,
                                       "gets", (unsigned long long)rs.gets, "commands",
                                       (unsigned long long)rs.commands, "moved",
                                       (unsigned long long)rs.moved, "ask",
                                       (unsigned long long)rs.ask, "retries",
                                       (unsigned long long)rs.retries, "connects",
                                       (unsigned long long)rs.connects, "conn_errors",
                                       (unsigned long long)rs.conn_errors, "map_refreshes",
                                       (unsigned long long)rs.map_refreshes, "timeouts",
                                       (unsigned long long)rs.timeouts, "local_tables",
                                       (unsigned long long)rs.local_tables);
        if (!redis)
            goto fail;
    }
    cuda = Py_NewRef(Py_None);
#ifdef ENGRAMSTORE_HAVE_CUDA
    {
        engram_cuda_stats cst = ENGRAM_CUDA_STATS_INIT;
        int have;
        if (ext_store_enter(s) < 0)
            goto fail;
        have = ext_cuda_stats(s->cuda, &cst);
        ext_store_leave(s);
        if (have) {
            Py_DECREF(cuda);
            cuda = Py_BuildValue("{s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "device",
                                 cst.device, "tables_mapped",
                                 (unsigned long long)cst.tables_mapped, "tables_copied",
                                 (unsigned long long)cst.tables_copied, "tables_host",
                                 (unsigned long long)cst.tables_host, "mapped_bytes",
                                 (unsigned long long)cst.mapped_bytes, "copied_bytes",
                                 (unsigned long long)cst.copied_bytes, "copy_huge",
                                 (unsigned long long)cst.copy_huge, "plans",
                                 (unsigned long long)cst.plans, "lookups",
                                 (unsigned long long)cst.lookups, "host_gathers",
                                 (unsigned long long)cst.host_gathers);
            if (!cuda)
                goto fail;
        }
    }
#endif
    d = Py_BuildValue("{s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O,s:O,s:O,s:O}",
                      "threads",
                      es.threads,
                      "lookups", (unsigned long long)es.lookups, "failed",
                      (unsigned long long)es.failed, "rows", (unsigned long long)es.rows,
                      "dead_rows", (unsigned long long)es.dead_rows, "bytes",
                      (unsigned long long)es.bytes, "parallel", (unsigned long long)es.parallel,
                      "time_ns", (unsigned long long)es.time_ns, "tables_open",
                      (unsigned long long)es.tables_open, "mapped_bytes",
                      (unsigned long long)es.mapped_bytes, "removed_tables",
                      (unsigned long long)es.removed_tables, "removed_bytes",
                      (unsigned long long)es.removed_bytes, "tables", tabs, "cache", cache,
                      "cuda", cuda, "redis", redis);
fail:
    Py_XDECREF(redis);
    Py_XDECREF(cuda);
    Py_XDECREF(cache);
    Py_XDECREF(names);
    Py_DECREF(tabs);
    return d;
}
