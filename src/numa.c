/*
 * numa.c - NUMA placement of table memory, and where it actually is.
 *
 * See numa.h for where a placement applies.  Requests are checked against
 * sysfs (/sys/devices/system/node: online, has_memory; a PCI device's
 * numa_node) and against the nodes this process may use
 * (get_mempolicy(MPOL_F_MEMS_ALLOWED), i.e. its cpuset), so that a bad
 * node is refused at store open with a sentence, not by an EINVAL from
 * mbind() at the first write.  Nodes are counted up to
 * ENGRAM_NUMA_MAX_NODES (64 bits of one mask).
 *
 * Built with libnuma (ENGRAM_HAVE_NUMA), the kernel calls come from its
 * numaif.h; without it only the parts that need no NUMA call remain (the
 * calling thread's node), and the rest fails with -ENOTSUP naming the
 * missing library.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"
#include "numa.h"

#if ENGRAM_HAVE_NUMA
#include <numaif.h>
#endif

int engram__numa_current_node(void)
{
    unsigned cpu = 0, node = 0;
    /* The raw call: glibc wraps getcpu() only from 2.29 on. */
    if (syscall(SYS_getcpu, &cpu, &node, NULL) != 0)
        return -1;
    return (int)node;
}

size_t engram__numa_copy_name(char *buf, size_t cap, const char *name, int node)
{
    int n = snprintf(buf, cap, "%s.numa%d", name, node);
    return n < 0 ? SIZE_MAX : (size_t)n;
}

int engram__numa_is_copy_name(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot || strncmp(dot, ".numa", 5) != 0 || !dot[5])
        return 0;
    for (const char *p = dot + 5; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

#if !ENGRAM_HAVE_NUMA

#define NO_LIBNUMA "this libengram was built without libnuma (install libnuma-dev and rebuild)"

int engram__numa_built(void)
{
    return 0;
}

int engram__numa_resolve(const engram_store_options *opts, engram__numa *out)
{
    memset(out, 0, sizeof *out);
    if (opts->numa_policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    if (opts->numa_policy > ENGRAM_NUMA_INTERLEAVE)
        return engram__err(-EINVAL, "numa_policy is %u (ENGRAM_NUMA_DEFAULT, _NODE or "
                                    "_INTERLEAVE)",
                           opts->numa_policy);
    return engram__err(-ENOTSUP, "NUMA placement: %s", NO_LIBNUMA);
}

int engram__numa_apply(void *addr, size_t len, const engram__numa *pl, const char *what)
{
    (void)addr;
    (void)len;
    if (pl->policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    return engram__err(-ENOTSUP, "NUMA placement of %s: %s", what, NO_LIBNUMA);
}

int engram__numa_query(const void *addr, size_t len, int touch, engram_table_placement *p)
{
    (void)addr;
    (void)len;
    (void)touch;
    (void)p;
    return engram__err(-ENOTSUP, "NUMA placement query: %s", NO_LIBNUMA);
}

void engram__numa_set_sysfs(const char *root)
{
    (void)root;
}

#else /* ENGRAM_HAVE_NUMA */

int engram__numa_built(void)
{
    return 1;
}

static const char *sysfs = "/sys";

void engram__numa_set_sysfs(const char *root)
{
    sysfs = root ? root : "/sys";
}

/* Parses a node list ("0-1,3", numactl's syntax without its keywords) into
 * *mask.  A node beyond ENGRAM_NUMA_MAX_NODES is an error, or, with `clamp`
 * (the kernel's own lists), left out.  0, or -EINVAL with the reason
 * (`what` names the list). */
static int parse_nodes(const char *s, const char *what, int clamp, uint64_t *mask)
{
    const char *p = s;
    *mask = 0;
    while (*p) {
        unsigned long a, b;
        char *end;
        if (*p < '0' || *p > '9')
            goto bad;
        a = strtoul(p, &end, 10);
        b = a;
        p = end;
        if (*p == '-') {
            p++;
            if (*p < '0' || *p > '9')
                goto bad;
            b = strtoul(p, &end, 10);
            p = end;
        }
        if (b < a)
            goto bad;
        if (b >= ENGRAM_NUMA_MAX_NODES && !clamp)
            return engram__err(-EINVAL, "%s '%s': node %lu is beyond the %d nodes engram places "
                                        "on (0 .. %d)",
                               what, s, b, ENGRAM_NUMA_MAX_NODES, ENGRAM_NUMA_MAX_NODES - 1);
        for (unsigned long n = a; n <= b && n < ENGRAM_NUMA_MAX_NODES; n++)
            *mask |= UINT64_C(1) << n;
        if (*p == ',' && p[1])
            p++;
        else if (*p)
            goto bad;
    }
    if (*mask == 0 && !clamp)
        goto bad;
    return 0;
bad:
    return engram__err(-EINVAL, "%s '%s' is not a node list such as \"0\", \"0-1\" or \"0,2-3\"",
                       what, s);
}

/* Formats the nodes of `mask` as a list ("0-1,3"). */
static void format_nodes(uint64_t mask, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int n = 0; n < ENGRAM_NUMA_MAX_NODES && len < cap; n++) {
        int e = n;
        if (!(mask >> n & 1))
            continue;
        while (e + 1 < ENGRAM_NUMA_MAX_NODES && (mask >> (e + 1) & 1))
            e++;
        len += (size_t)snprintf(buf + len, cap - len, e > n ? "%s%d-%d" : "%s%d",
                                len ? "," : "", n, e);
        n = e;
    }
}

/* Reads a small sysfs file (a list, a number) into buf without its
 * newline.  0, or a negative errno (no message). */
static int read_sysfs(const char *rel, char *buf, size_t cap)
{
    char path[512];
    ssize_t n;
    int fd;
    snprintf(path, sizeof path, "%s/%s", sysfs, rel);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -errno;
    n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -EIO;
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    return 0;
}

/* The nodes of /sys/devices/system/node/<which> ("online", "has_memory"),
 * of those below ENGRAM_NUMA_MAX_NODES.  0, or -ENOTSUP with the reason. */
static int node_state(const char *which, uint64_t *mask)
{
    char rel[64], buf[1024], what[96];
    *mask = 0;
    snprintf(rel, sizeof rel, "devices/system/node/%s", which);
    if (read_sysfs(rel, buf, sizeof buf) != 0)
        return engram__err(-ENOTSUP, "NUMA placement: %s/%s cannot be read (a kernel without "
                                     "NUMA support, or no sysfs)",
                           sysfs, rel);
    snprintf(what, sizeof what, "%s/%s", sysfs, rel);
    return parse_nodes(buf, what, 1, mask);
}

/* The nodes this process may allocate on (its cpuset's mems), below
 * ENGRAM_NUMA_MAX_NODES.  0, or -ENOTSUP with the reason. */
static int mems_allowed(uint64_t *mask)
{
    /* get_mempolicy() wants room for every node the kernel may have. */
    unsigned long m[4096 / (8 * sizeof(unsigned long))];
    memset(m, 0, sizeof m);
    if (get_mempolicy(NULL, m, 4096, NULL, MPOL_F_MEMS_ALLOWED) != 0)
        return engram__errno(errno == EPERM || errno == ENOSYS ? ENOTSUP : errno,
                             "NUMA placement: get_mempolicy() fails (%s: a kernel without "
                             "NUMA support, or a seccomp profile that forbids NUMA calls)",
                             strerror(errno));
    *mask = 0;
    for (int n = 0; n < ENGRAM_NUMA_MAX_NODES; n++)
        if (m[n / (8 * sizeof(unsigned long))] >> (n % (8 * sizeof(unsigned long))) & 1)
            *mask |= UINT64_C(1) << n;
    return 0;
}

/* Checks that every node of `want` can take pages: online, with memory,
 * allowed to this process.  `what` says where the nodes came from. */
static int check_nodes(uint64_t want, const char *what)
{
    uint64_t online, memory, allowed;
    char have[256];
    int err;
    if ((err = node_state("online", &online)) != 0 ||
        (err = node_state("has_memory", &memory)) != 0 || (err = mems_allowed(&allowed)) != 0)
        return err;
    for (int n = 0; n < ENGRAM_NUMA_MAX_NODES; n++) {
        if (!(want >> n & 1))
            continue;
        if (!(online >> n & 1)) {
            format_nodes(online, have, sizeof have);
            return engram__err(-EINVAL, "%s: node %d is not an online NUMA node of this machine "
                                        "(online nodes: %s)",
                               what, n, have[0] ? have : "none");
        }
        if (!(memory >> n & 1)) {
            format_nodes(memory, have, sizeof have);
            return engram__err(-EINVAL, "%s: node %d has no memory (a memoryless node: CPUs "
                                        "or devices only; nodes with memory: %s)",
                               what, n, have[0] ? have : "none");
        }
        if (!(allowed >> n & 1)) {
            format_nodes(allowed, have, sizeof have);
            return engram__err(-EINVAL, "%s: node %d is outside this process's cpuset "
                                        "(Mems_allowed: %s)",
                               what, n, have[0] ? have : "none");
        }
    }
    return 0;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* Reads `n` hex digits of s into *v; the number of digits read (at most
 * max), so callers check the count. */
static int hex_field(const char *s, int max, unsigned long *v)
{
    int i;
    *v = 0;
    for (i = 0; i < max && hexval((unsigned char)s[i]) >= 0; i++)
        *v = *v * 16 + (unsigned long)hexval((unsigned char)s[i]);
    return i;
}

/* Canonical "dddd:bb:dd.f" of a PCI bus id given as [domain:]bus:dev.fn
 * in hex, any case, the domain with up to 8 digits ("00000000:3B:00.0"
 * from nvidia-smi).  0, or -EINVAL with the reason. */
static int pci_canonical(const char *id, char *out, size_t cap)
{
    unsigned long dom = 0, bus, dev, fn;
    const char *p = id;
    int n;
    const char *colon2 = strchr(id, ':') ? strchr(strchr(id, ':') + 1, ':') : NULL;
    if (colon2) {
        if ((n = hex_field(p, 8, &dom)) < 1 || p[n] != ':')
            goto bad;
        p += n + 1;
    }
    if ((n = hex_field(p, 2, &bus)) < 1 || p[n] != ':')
        goto bad;
    p += n + 1;
    if ((n = hex_field(p, 2, &dev)) < 1 || p[n] != '.' || dev > 0x1f)
        goto bad;
    p += n + 1;
    if ((n = hex_field(p, 1, &fn)) != 1 || p[n] != '\0' || fn > 7)
        goto bad;
    if (dom > 0xffff)
        snprintf(out, cap, "%08lx:%02lx:%02lx.%lx", dom, bus, dev, fn);
    else
        snprintf(out, cap, "%04lx:%02lx:%02lx.%lx", dom, bus, dev, fn);
    return 0;
bad:
    return engram__err(-EINVAL, "numa_gpu '%s' is not a PCI bus id such as \"0000:3b:00.0\" "
                                "([domain:]bus:device.function, in hex)",
                       id);
}

/* The node of PCI device `id` into *node.  0, or -EINVAL / -ENODEV with
 * the reason. */
static int pci_node(const char *id, int *node, char *canon, size_t cap)
{
    char rel[128], buf[32], *end;
    long v;
    int err;
    if ((err = pci_canonical(id, canon, cap)) != 0)
        return err;
    snprintf(rel, sizeof rel, "bus/pci/devices/%s/numa_node", canon);
    if ((err = read_sysfs(rel, buf, sizeof buf)) != 0)
        return engram__err(-ENODEV, "numa_gpu %s: no such PCI device (%s/bus/pci/devices/%s: "
                                    "%s)",
                           canon, sysfs, canon, strerror(-err));
    v = strtol(buf, &end, 10);
    if (end == buf || *end || v < -1 || v >= ENGRAM_NUMA_MAX_NODES)
        return engram__err(-ENODEV, "numa_gpu %s: %s/%s holds '%s', not a node", canon, sysfs,
                           rel, buf);
    if (v == -1) {
        /* The device reports no affinity: on a machine with one node of
         * memory that node is the answer; elsewhere we cannot tell. */
        uint64_t memory;
        if ((err = node_state("has_memory", &memory)) != 0)
            return err;
        if (memory && !(memory & (memory - 1))) {
            *node = __builtin_ctzll(memory);
            return 0;
        }
        return engram__err(-ENODEV, "numa_gpu %s: the device reports no NUMA node "
                                    "(numa_node = -1) on a machine of several nodes: give "
                                    "numa_node instead",
                           canon);
    }
    *node = (int)v;
    return 0;
}

int engram__numa_resolve(const engram_store_options *opts, engram__numa *out)
{
    char list[200];
    int err;
    memset(out, 0, sizeof *out);
    if (opts->numa_policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    switch (opts->numa_policy) {
    case ENGRAM_NUMA_NODE: {
        int node = opts->numa_node;
        char canon[32] = "", what[96];
        if (node < -1)
            return engram__err(-EINVAL, "numa_node is %d (a node >= 0, or -1 with numa_gpu)",
                               node);
        if (node == -1 && !opts->numa_gpu)
            return engram__err(-EINVAL, "numa_node -1 takes the node of numa_gpu, which is "
                                        "NULL");
        if (node >= 0 && opts->numa_gpu)
            return engram__err(-EINVAL, "numa_node %d and numa_gpu '%s': give one (numa_node "
                                        "-1 with numa_gpu)",
                               node, opts->numa_gpu);
        if (node >= ENGRAM_NUMA_MAX_NODES)
            return engram__err(-EINVAL, "numa_node %d is beyond the %d nodes engram places on "
                                        "(0 .. %d)",
                               node, ENGRAM_NUMA_MAX_NODES, ENGRAM_NUMA_MAX_NODES - 1);
        if (node == -1 && (err = pci_node(opts->numa_gpu, &node, canon, sizeof canon)) != 0)
            return err;
        if (canon[0])
            snprintf(what, sizeof what, "numa_gpu %s (node %d)", canon, node);
        else
            snprintf(what, sizeof what, "numa_node %d", node);
        if ((err = check_nodes(UINT64_C(1) << node, what)) != 0)
            return err;
        out->policy = ENGRAM_NUMA_NODE;
        out->mask = UINT64_C(1) << node;
        if (canon[0])
            snprintf(out->desc, sizeof out->desc, "node %d (of PCI device %s)", node, canon);
        else
            snprintf(out->desc, sizeof out->desc, "node %d", node);
        return 0;
    }
    case ENGRAM_NUMA_INTERLEAVE: {
        uint64_t mask, memory, allowed;
        if (opts->numa_gpu)
            return engram__err(-EINVAL, "numa_gpu is for ENGRAM_NUMA_NODE, not interleave");
        if (opts->numa_nodes && opts->numa_nodes[0]) {
            if ((err = parse_nodes(opts->numa_nodes, "numa_nodes", 0, &mask)) != 0 ||
                (err = check_nodes(mask, "numa_nodes")) != 0)
                return err;
        } else {
            /* Every node with memory that this process may use. */
            if ((err = node_state("has_memory", &memory)) != 0 ||
                (err = mems_allowed(&allowed)) != 0)
                return err;
            if (!(mask = memory & allowed))
                return engram__err(-EINVAL, "interleave: no node with memory is allowed to "
                                            "this process");
        }
        out->policy = ENGRAM_NUMA_INTERLEAVE;
        out->mask = mask;
        format_nodes(mask, list, sizeof list);
        snprintf(out->desc, sizeof out->desc, "interleave %s", list);
        return 0;
    }
    default:
        return engram__err(-EINVAL, "numa_policy is %u (ENGRAM_NUMA_DEFAULT, _NODE or "
                                    "_INTERLEAVE)",
                           opts->numa_policy);
    }
}

int engram__numa_apply(void *addr, size_t len, const engram__numa *pl, const char *what)
{
    unsigned long mask = (unsigned long)pl->mask;
    int mode;
    _Static_assert(sizeof(unsigned long) * 8 >= ENGRAM_NUMA_MAX_NODES,
                   "one unsigned long holds the node mask");
    if (pl->policy == ENGRAM_NUMA_DEFAULT || len == 0)
        return 0;
    /* Preferred, not bound: a full node spills to others (the placement
     * query shows it) instead of failing the write or waking the OOM
     * killer. */
    mode = pl->policy == ENGRAM_NUMA_NODE ? MPOL_PREFERRED : MPOL_INTERLEAVE;
    /* maxnode counts one more than the bits the kernel reads (mbind(2)). */
    if (mbind(addr, len, mode, &mask, ENGRAM_NUMA_MAX_NODES + 1, 0) != 0)
        return engram__errno(errno, "place %s on %s (mbind)", what, pl->desc);
    return 0;
}

#define QUERY_BATCH 1024

int engram__numa_query(const void *addr, size_t len, int touch, engram_table_placement *p)
{
    long psz = sysconf(_SC_PAGESIZE);
    uintptr_t first = (uintptr_t)addr & ~(uintptr_t)(psz - 1);
    uint64_t pages = len ? ((uintptr_t)addr + len - first + (uintptr_t)psz - 1) / (uint64_t)psz
                         : 0;
    uint64_t sampled = pages < ENGRAM_PLACEMENT_SAMPLE ? pages : ENGRAM_PLACEMENT_SAMPLE;
    void *where[QUERY_BATCH];
    int status[QUERY_BATCH];

    p->page_size = (uint32_t)psz;
    p->pages = pages;
    p->sampled = sampled;
    p->absent = p->other_nodes = 0;
    p->max_node = -1;
    memset(p->node_pages, 0, sizeof p->node_pages);
    for (uint64_t i = 0; i < sampled; i += QUERY_BATCH) {
        size_t n = sampled - i < QUERY_BATCH ? (size_t)(sampled - i) : QUERY_BATCH;
        for (size_t j = 0; j < n; j++) {
            /* Evenly spaced over the table: page k * pages / sampled. */
            uint64_t k = sampled == pages ? i + j
                                          : (uint64_t)((unsigned __int128)(i + j) * pages /
                                                       sampled);
            where[j] = (void *)(first + k * (uint64_t)psz);
            if (touch) {
                unsigned char in = 0;
                /* Only pages already in memory are read: a shared file
                 * mapping gets its page table entry, nothing comes from
                 * disk. */
                if (mincore(where[j], (size_t)psz, &in) == 0 && (in & 1))
                    (void)*(volatile const unsigned char *)where[j];
            }
        }
        if (move_pages(0, (unsigned long)n, where, NULL, status, 0) != 0) {
            int e = errno;
            /* Refused outright (no NUMA in the kernel, or a seccomp
             * profile): there is no placement to tell. */
            return engram__errno(e == EPERM || e == ENOSYS ? ENOTSUP : e,
                                 "query the NUMA nodes of %zu pages (move_pages: %s)", n,
                                 strerror(e));
        }
        for (size_t j = 0; j < n; j++) {
            if (status[j] < 0)
                p->absent++;
            else if (status[j] >= ENGRAM_NUMA_MAX_NODES)
                p->other_nodes++;
            else
                p->node_pages[status[j]]++;
            if (status[j] > p->max_node)
                p->max_node = status[j];
        }
    }
    return 0;
}

#endif /* ENGRAM_HAVE_NUMA */
