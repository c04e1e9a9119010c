/*
 * numa.h - NUMA placement of table memory, and where it actually is
 * (internal).
 *
 * A store may ask for its tables' pages to go to one node (chosen by
 * number, or as the node of a PCI device such as a GPU) or to be
 * interleaved over several (engram_store_options.numa_*).  The request is
 * checked once, at store open, against the machine (the node must be
 * online, have memory and be allowed to this process) and kept as an
 * engram__numa; it is applied in two places:
 *  - a table file written to a tmpfs namespace: the policy is set on the
 *    file itself (mbind() on a mapping of it gives the tmpfs inode a shared
 *    policy), before its pages are allocated, so every page of the file goes
 *    by it, whoever touches it, for the file's whole life;
 *  - a private copy made at open (ENGRAM_OPEN_PRIVATE_HUGE): mbind() on the
 *    anonymous mapping before the copy touches it.
 * Where the pages are is read back with move_pages(2) in query mode.
 *
 * The mechanism needs libnuma (numaif.h: mbind, move_pages, get_mempolicy).
 * Built without it (src/numa_none.c), a placement request fails with
 * -ENOTSUP at store open and placement queries fail with -ENOTSUP; the
 * node of the calling thread (engram__numa_current_node()) is known either
 * way.
 */
#ifndef ENGRAM_NUMA_H
#define ENGRAM_NUMA_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

/* A checked placement. */
typedef struct engram__numa {
    uint32_t policy;   /* ENGRAM_NUMA_DEFAULT (nothing to do), _NODE or _INTERLEAVE */
    uint64_t mask;     /* the nodes: one bit for NODE, one or more for INTERLEAVE */
    char desc[224];    /* "node 1", "node 0 (of PCI device 0000:3b:00.0)", "interleave 0-1" */
} engram__numa;

/* 1 if the library was built with libnuma. */
int engram__numa_built(void);

/* Checks the placement asked for in `opts` (its numa_* fields) and fills
 * *out.  0, or -EINVAL / -ENODEV / -ENOTSUP with the reason. */
int engram__numa_resolve(const engram_store_options *opts, engram__numa *out);

/* Applies `pl` to [addr, addr + len) (page aligned) with mbind(); a
 * mapping of a tmpfs file gives the file that policy.  `what` names the
 * memory in messages.  0 (also for ENGRAM_NUMA_DEFAULT), or a negative
 * errno with the reason. */
int engram__numa_apply(void *addr, size_t len, const engram__numa *pl, const char *what);

/* Fills the node counts of *p from the pages of [addr, addr + len): all of
 * them, or ENGRAM_PLACEMENT_SAMPLE evenly spaced.  With `touch`, each
 * sampled page that mincore() reports in memory is read first, so that a
 * page of a shared file mapping this process has not faulted in yet is
 * found (nothing is read from disk: a page not in memory stays absent).
 * 0, or -ENOTSUP / a negative errno with the reason. */
int engram__numa_query(const void *addr, size_t len, int touch, engram_table_placement *p);

/* The node of the CPU the calling thread runs on (getcpu(2)), or -1. */
int engram__numa_current_node(void);

/* The name of table `name`'s copy on `node` (engram_numa_copy(),
 * "<name>.numa<node>"), written into buf as snprintf() writes it: the
 * length it needs is returned, the copy fits if that is below cap.  The
 * writer of a copy and ENGRAM_OPEN_NUMA_LOCAL's lookup of it both take
 * the name from here. */
size_t engram__numa_copy_name(char *buf, size_t cap, const char *name, int node);

/* 1 if `name` is a node copy's name (ends in ".numa<digits>"), else 0. */
int engram__numa_is_copy_name(const char *name);

/* Tests only: reads node and PCI facts under `root` instead of "/sys"
 * (NULL restores it).  Not thread-safe. */
void engram__numa_set_sysfs(const char *root);

#endif
