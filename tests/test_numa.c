/*
 * test_numa.c - NUMA placement of tables, where their pages are, and
 * per-node copies, through the public API.
 *
 *  - placement on a node and interleaved: the table file gets the memory
 *    policy asked for (read back from the file's mapping with
 *    get_mempolicy(MPOL_F_ADDR), which reports a tmpfs file's own policy),
 *    so does a private copy made at open, and the placement query finds
 *    every page on the node that holds them;
 *  - the placement query: a table not open, open, a private copy, bound
 *    memory touched and untouched, sampling of a large table;
 *  - bad requests refused at open with the reason: nodes out of range,
 *    offline, memoryless, outside the cpuset (the last two on a fake sysfs
 *    tree), bad node lists, a PCI device that does not exist or has no
 *    node, a placement on a memory store, a write to a namespace that is
 *    not a tmpfs;
 *  - node copies: engram_numa_copy() writes NAME.numaN once (the others
 *    reuse it), keeps the rows and the row range, and a store opened with
 *    ENGRAM_OPEN_NUMA_LOCAL serves NAME from it.
 * The machine this was written on has one NUMA node: every page is on
 * node 0, and what crossing nodes costs is not measured here.  Built
 * without libnuma, the test checks that placement requests fail with
 * -ENOTSUP naming libnuma, and that NUMA_LOCAL still resolves copies.
 * The namespace that is not a tmpfs is made in /var/tmp; where that is a
 * tmpfs the case is skipped, and it is a CTest entry of its own
 * (test_numa.not_tmpfs) so that CTest reports the skip.
 */
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/vfs.h>

#include "numa.h"
#include "testutil.h"

#ifndef ENGRAM_TEST_NUMA
#define ENGRAM_TEST_NUMA 0 /* CMake defines it to 1 where the library has libnuma */
#endif
#if ENGRAM_TEST_NUMA
#include <numaif.h>
#endif

#define ROWS 1000u
#define RB 264u
#define PITCH 272u

static engram_table_spec spec = {ROWS, RB, PITCH};

/* The node of this thread's CPU (the copy NUMA_LOCAL should pick). */
static int my_node(void)
{
    return engram__numa_current_node();
}

static engram_store *open_placed(const char *ns, uint32_t flags, uint32_t policy, int node,
                                 const char *gpu, const char *nodes, int *rc)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    o.flags = flags | ENGRAM_OPEN_CREATE;
    o.threads = 1;
    o.numa_policy = policy;
    o.numa_node = node;
    o.numa_gpu = gpu;
    o.numa_nodes = nodes;
    *rc = engram_store_open(tu_scratch_root(), ns, &o, &st);
    return st;
}

#if ENGRAM_TEST_NUMA
static void populate(engram_store *st, const char *name, uint32_t seed)
{
    tu_populate(st, name, seed, ROWS, RB, PITCH);
}

/* Looks every row of `name` up and checks it against the pattern. */
static void check_rows(engram_store *st, const char *name, uint32_t seed)
{
    tu_check_named(st, name, seed, ROWS, RB);
}

static uint64_t table_pages(void);
static void expect_all_on(engram_store *st, const char *name, int node, uint32_t private_copy);
#define expect_all_on0(st, name, priv) expect_all_on((st), (name), 0, (priv))

static uint64_t table_pages(void)
{
    long psz = sysconf(_SC_PAGESIZE);
    return ((uint64_t)ROWS * PITCH + (uint64_t)psz - 1) / (uint64_t)psz;
}

/* Every page of the table, counted whole, on `node`. */
static void expect_all_on(engram_store *st, const char *name, int node, uint32_t private_copy)
{
    engram_table_placement p = ENGRAM_TABLE_PLACEMENT_INIT;
    ASSERT_OK(engram_get_table_placement(st, name, &p));
    ASSERT_EQ(p.page_size, sysconf(_SC_PAGESIZE));
    ASSERT_EQ_U64(p.pages, table_pages());
    ASSERT_EQ_U64(p.sampled, p.pages);
    ASSERT_EQ_U64(p.absent, 0);
    ASSERT_EQ_U64(p.other_nodes, 0);
    ASSERT_EQ_U64(p.node_pages[node], p.pages);
    ASSERT_EQ(p.max_node, node);
    ASSERT_EQ(p.private_copy, private_copy);
}

/* The memory policy of the page at `addr` (for a tmpfs file mapping: the
 * file's own) and its node mask. */
static int policy_at(const void *addr, unsigned long *mask)
{
    unsigned long m[4096 / (8 * sizeof(unsigned long))];
    int mode = -1;
    memset(m, 0, sizeof m);
    ASSERT_EQ(get_mempolicy(&mode, m, 4096, (void *)(uintptr_t)addr, MPOL_F_ADDR), 0);
    *mask = m[0];
    return mode;
}

/* The policy of table file `name` of namespace `ns`, from a mapping of
 * its data (row 0 is 2 MiB into the file). */
static int file_policy(const char *ns, const char *name, unsigned long *mask)
{
    char rel[256], path[512];
    int fd, mode;
    void *p;
    snprintf(rel, sizeof rel, "%s/%s", ns, name);
    tu_path(path, sizeof path, rel);
    fd = open(path, O_RDONLY);
    ASSERT(fd >= 0);
    p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 2 << 20);
    ASSERT(p != MAP_FAILED);
    mode = policy_at(p, mask);
    munmap(p, 4096);
    close(fd);
    return mode;
}

static void test_node_placement(void)
{
    unsigned long mask;
    int rc;
    engram_store *st = open_placed("node", 0, ENGRAM_NUMA_NODE, 0, NULL, NULL, &rc);
    ASSERT_OK(rc);
    populate(st, "t", 1);
    ASSERT_EQ(file_policy("node", "t", &mask), MPOL_PREFERRED);
    ASSERT_EQ_U64(mask, 1);
    /* Not open in this store: the file's pages, from a mapping made for
     * the query. */
    expect_all_on0(st, "t", 0);
    check_rows(st, "t", 1);
    /* Open (mapped without prefault): the same answer. */
    expect_all_on0(st, "t", 0);
    engram_store_close(st);

    /* A store without a placement writes files without a policy. */
    st = tu_open("node", 0, 1);
    populate(st, "plain", 2);
    ASSERT_EQ(file_policy("node", "plain", &mask), MPOL_DEFAULT);
    expect_all_on(st, "plain", my_node(), 0);
    engram_store_close(st);
}

static void test_interleave(void)
{
    unsigned long mask;
    int rc;
    /* Every node with memory (here: node 0), then an explicit list. */
    engram_store *st = open_placed("il", 0, ENGRAM_NUMA_INTERLEAVE, 0, NULL, NULL, &rc);
    ASSERT_OK(rc);
    populate(st, "all", 3);
    ASSERT_EQ(file_policy("il", "all", &mask), MPOL_INTERLEAVE);
    ASSERT_EQ_U64(mask, 1);
    expect_all_on0(st, "all", 0);
    check_rows(st, "all", 3);
    engram_store_close(st);
    st = open_placed("il", 0, ENGRAM_NUMA_INTERLEAVE, 0, NULL, "0", &rc);
    ASSERT_OK(rc);
    populate(st, "list", 4);
    ASSERT_EQ(file_policy("il", "list", &mask), MPOL_INTERLEAVE);
    ASSERT_EQ_U64(mask, 1);
    expect_all_on0(st, "list", 0);
    engram_store_close(st);
}

static void test_private_copy(void)
{
    engram_table_id id;
    const void *base;
    unsigned long mask;
    int rc;
    engram_store *st = tu_open("priv", 0, 1);
    populate(st, "t", 5);
    engram_store_close(st);
    st = open_placed("priv", ENGRAM_OPEN_PRIVATE_HUGE, ENGRAM_NUMA_NODE, 0, NULL, NULL, &rc);
    ASSERT_OK(rc);
    check_rows(st, "t", 5);
    ASSERT_OK(engram_table_open(st, "t", &id));
    ASSERT_OK(engram_table_memory(st, id, &base, NULL));
    /* The copy's anonymous memory carries the placement. */
    ASSERT_EQ(policy_at(base, &mask), MPOL_PREFERRED);
    ASSERT_EQ_U64(mask, 1);
    {
        engram_table_placement p = ENGRAM_TABLE_PLACEMENT_INIT;
        long psz = sysconf(_SC_PAGESIZE);
        ASSERT_OK(engram_get_table_placement(st, "t", &p));
        ASSERT_EQ(p.private_copy, 1);
        /* The copy is rounded up to whole 2 MiB pages; all of it is there. */
        ASSERT_GE(p.pages, table_pages());
        ASSERT_EQ_U64(p.sampled, p.pages);
        ASSERT_EQ_U64(p.node_pages[0] + p.absent, p.pages);
        ASSERT_GE(p.node_pages[0], table_pages());
        (void)psz;
    }
    engram_store_close(st);
}

/* A namespace on a file system that is not a tmpfs refuses placed
 * writes (its page cache pages are placed by their readers). */
static void test_not_tmpfs(void)
{
    char root[] = "/var/tmp/engram-numa-XXXXXX";
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st;
    struct statfs fs;
    unsigned char *rows = tu_make_rows(6, ROWS, RB, 0, 0);
    int rc;
    ASSERT(mkdtemp(root) != NULL);
    ASSERT_EQ(statfs(root, &fs), 0);
    if (fs.f_type == 0x01021994) {
        tu_skip_case("%s is a tmpfs here", root);
        goto out;
    }
    o.flags = ENGRAM_OPEN_CREATE;
    o.numa_policy = ENGRAM_NUMA_NODE;
    o.numa_node = 0;
    ASSERT_OK(engram_store_open(root, "disk", &o, &st));
    rc = engram_populate(st, "t", &spec, rows, 0);
    ASSERT_EQ(rc, -ENOTSUP);
    ASSERT_CONTAINS(engram_errmsg(), "needs a tmpfs namespace");
    {
        engram_table_info info = ENGRAM_TABLE_INFO_INIT;
        ASSERT_ERR(engram_get_table_info(st, "t", &info), -ENOENT); /* nothing left behind */
    }
    engram_store_close(st);
    /* Without a placement the same namespace takes the table. */
    o.numa_policy = ENGRAM_NUMA_DEFAULT;
    ASSERT_OK(engram_store_open(root, "disk", &o, &st));
    ASSERT_OK(engram_populate(st, "t", &spec, rows, 0));
    expect_all_on(st, "t", my_node(), 0); /* just written: in the page cache */
    ASSERT_ERR(engram_numa_copy(st, "t", 0, NULL), -ENOTSUP);
    engram_store_close(st);
out:
    tu_rm_rf(root);
    free(rows);
}
#endif /* ENGRAM_TEST_NUMA */

/* Placement of memory the caller bound: untouched pages are absent;
 * a large region is sampled. */
static void test_bound_and_sampling(void)
{
    long psz = sysconf(_SC_PAGESIZE);
    size_t len = (size_t)300 << 20; /* 76800 pages of 4 KiB: more than the sample */
    engram_table_placement p = ENGRAM_TABLE_PLACEMENT_INIT;
    engram_table_spec big = {len / 4096, 4096, 0};
    engram_store *st;
    unsigned char *mem;
    uint64_t pages = len / (size_t)psz;
    int rc;

    ASSERT_OK(engram_store_open_memory(NULL, &st));
    mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT(mem != MAP_FAILED);
    ASSERT_OK(engram_bind(st, "big", &big, mem));
    rc = engram_get_table_placement(st, "big", &p);
#if ENGRAM_TEST_NUMA
    ASSERT_OK(rc);
    ASSERT_EQ_U64(p.pages, pages);
    ASSERT_EQ_U64(p.sampled, ENGRAM_PLACEMENT_SAMPLE);
    ASSERT_EQ_U64(p.absent, p.sampled); /* never touched, and the query does not touch */
    ASSERT_EQ(p.max_node, -1);
    /* Touch the first half: about half the sample is then on node 0. */
    memset(mem, 1, len / 2);
    ASSERT_OK(engram_get_table_placement(st, "big", &p));
    ASSERT_EQ_U64(p.node_pages[0] + p.absent, p.sampled);
    ASSERT_GE(p.node_pages[0], p.sampled / 2 - 1);
    ASSERT_LE(p.node_pages[0], p.sampled / 2 + 1);
    ASSERT_EQ(p.max_node, 0);
#else
    ASSERT_EQ(rc, -ENOTSUP);
    ASSERT_CONTAINS(engram_errmsg(), "libnuma");
    (void)pages;
#endif
    /* Bad arguments. */
    p.size = 8;
    ASSERT_ERR(engram_get_table_placement(st, "big", &p), -EINVAL);
    p.size = sizeof p;
    ASSERT_ERR(engram_get_table_placement(NULL, "big", &p), -EINVAL);
    ASSERT_ERR(engram_get_table_placement(st, "no such", &p), ENGRAM_ESPEC);
    ASSERT_ERR(engram_get_table_placement(st, "missing", &p), -ENOENT);
    engram_store_close(st);
    munmap(mem, len);
}

/* A source table's rows are not memory: no placement. */
static int zero_rows(void *ctx, engram_source_req *reqs, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        memset(reqs[i].dst, 0, RB);
    return 0;
}

static void test_source_not_memory(void)
{
    engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
    engram_table_placement p = ENGRAM_TABLE_PLACEMENT_INIT;
    engram_store *st;
    ops.read_rows = zero_rows;
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_OK(engram_add_source(st, "src", &(engram_table_spec){10, RB, 0}, &ops, NULL, 0, NULL));
    ASSERT_ERR(engram_get_table_placement(st, "src", &p), -ENOTSUP);
    ASSERT_CONTAINS(engram_errmsg(), "read on demand");
    engram_store_close(st);
}

#if !ENGRAM_TEST_NUMA
/* Without libnuma copies cannot be placed, but a copy written by name is
 * still found by NUMA_LOCAL, and engram_numa_copy() says why it fails. */
static void test_local_without_libnuma(void)
{
    engram_store *st = tu_open("local", 0, 1), *local;
    unsigned char *rows = tu_make_rows(11, ROWS, RB, 0, 0);
    engram_table_id id_copy, id_local;
    char copy[64];
    snprintf(copy, sizeof copy, "t.numa%d", my_node());
    ASSERT_OK(engram_populate(st, "t", &spec, rows, 0));
    ASSERT_OK(engram_populate(st, copy, &spec, rows, 0));
    ASSERT_ERR(engram_numa_copy(st, "t", 0, NULL), -ENOTSUP);
    ASSERT_CONTAINS(engram_errmsg(), "libnuma");
    local = tu_open("local", ENGRAM_OPEN_NUMA_LOCAL, 1);
    ASSERT_OK(engram_table_open(local, copy, &id_copy));
    ASSERT_OK(engram_table_open(local, "t", &id_local));
    ASSERT_EQ(id_local, id_copy);
    engram_store_close(local);
    engram_store_close(st);
    free(rows);
}
#endif

/* Requests refused at open, each with its reason. */
static void expect_refused(uint32_t policy, int node, const char *gpu, const char *nodes,
                           int code, const char *why)
{
    int rc;
    engram_store *st = open_placed("refused", 0, policy, node, gpu, nodes, &rc);
    if (rc != code || st != NULL) {
        fprintf(stderr, "FAIL [%s]: policy %u node %d gpu %s nodes %s: open = %d (%s), want %d; "
                        "errmsg: %s\n",
                tu_current_case, policy, node, gpu ? gpu : "NULL", nodes ? nodes : "NULL", rc,
                engram_strerror(rc), code, engram_errmsg());
        tu_fail_exit();
    }
    ASSERT_CONTAINS(engram_errmsg(), why);
}

static void test_refusals(void)
{
#if ENGRAM_TEST_NUMA
    char online[64];
    FILE *f = fopen("/sys/devices/system/node/online", "r");
    int last = 0;
    ASSERT(f != NULL);
    ASSERT(fgets(online, sizeof online, f) != NULL);
    fclose(f);
    /* The first node past the online ones ("0" here, "0-1" on two). */
    for (const char *p = online; *p; p++)
        if (*p >= '0' && *p <= '9' && (p == online || p[-1] < '0' || p[-1] > '9'))
            last = atoi(p);
    if (last + 1 < ENGRAM_NUMA_MAX_NODES)
        expect_refused(ENGRAM_NUMA_NODE, last + 1, NULL, NULL, -EINVAL,
                       "is not an online NUMA node of this machine");
    expect_refused(ENGRAM_NUMA_NODE, 64, NULL, NULL, -EINVAL, "beyond the 64 nodes");
    expect_refused(ENGRAM_NUMA_NODE, -2, NULL, NULL, -EINVAL, "numa_node is -2");
    expect_refused(ENGRAM_NUMA_NODE, -1, NULL, NULL, -EINVAL, "numa_gpu, which is NULL");
    expect_refused(ENGRAM_NUMA_NODE, 0, "0000:00:00.0", NULL, -EINVAL, "give one");
    expect_refused(ENGRAM_NUMA_INTERLEAVE, 0, NULL, "0-", -EINVAL, "is not a node list");
    expect_refused(ENGRAM_NUMA_INTERLEAVE, 0, NULL, "x", -EINVAL, "is not a node list");
    expect_refused(ENGRAM_NUMA_INTERLEAVE, 0, NULL, "1-0", -EINVAL, "is not a node list");
    expect_refused(ENGRAM_NUMA_INTERLEAVE, 0, NULL, "0,99", -EINVAL, "node 99 is beyond");
    expect_refused(ENGRAM_NUMA_INTERLEAVE, 0, NULL, "0,63", -EINVAL,
                   "node 63 is not an online NUMA node");
    expect_refused(ENGRAM_NUMA_INTERLEAVE, 0, "0000:00:00.0", NULL, -EINVAL,
                   "numa_gpu is for ENGRAM_NUMA_NODE");
    expect_refused(7, 0, NULL, NULL, -EINVAL, "numa_policy is 7");
    /* GPUs by PCI bus id: malformed, and a device that does not exist. */
    expect_refused(ENGRAM_NUMA_NODE, -1, "zz", NULL, -EINVAL, "is not a PCI bus id");
    expect_refused(ENGRAM_NUMA_NODE, -1, "0000:3b:00.8", NULL, -EINVAL, "is not a PCI bus id");
    expect_refused(ENGRAM_NUMA_NODE, -1, "0000:3b:00.0x", NULL, -EINVAL, "is not a PCI bus id");
    expect_refused(ENGRAM_NUMA_NODE, -1, "00000000:FE:1F.7", NULL, -ENODEV,
                   "0000:fe:1f.7: no such PCI device");
#else
    expect_refused(ENGRAM_NUMA_NODE, 0, NULL, NULL, -ENOTSUP, "built without libnuma");
    expect_refused(ENGRAM_NUMA_INTERLEAVE, 0, NULL, NULL, -ENOTSUP, "built without libnuma");
    expect_refused(7, 0, NULL, NULL, -EINVAL, "numa_policy is 7");
#endif
    /* A memory store has nothing to place. */
    {
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        engram_store *st = NULL;
        int rc;
        o.numa_policy = ENGRAM_NUMA_NODE;
        rc = engram_store_open_memory(&o, &st);
        ASSERT(st == NULL);
#if ENGRAM_TEST_NUMA
        ASSERT_EQ(rc, -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "a memory store writes no table files");
#else
        ASSERT_EQ(rc, -ENOTSUP);
#endif
    }
    /* Only the current size of the options is taken: the shorter ones
     * before the NUMA and the row cache fields were never released, and
     * are refused before any field is read. */
    {
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        engram_store *st;
        o.flags = ENGRAM_OPEN_CREATE;
        o.numa_policy = 7; /* would be refused as a policy if it were read */
        o.size = (uint32_t)offsetof(engram_store_options, numa_policy);
        ASSERT_ERR(engram_store_open(tu_scratch_root(), "old", &o, &st), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "engram_store_options.size");
        o.size = (uint32_t)offsetof(engram_store_options, cache_bytes);
        ASSERT_ERR(engram_store_open(tu_scratch_root(), "old", &o, &st), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "engram_store_options.size");
        o.size = (uint32_t)offsetof(engram_store_options, numa_node);
        ASSERT_ERR(engram_store_open(tu_scratch_root(), "old", &o, &st), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "engram_store_options.size");
    }
}

#if ENGRAM_TEST_NUMA
static void write_file(const char *rel, const char *text)
{
    char path[512];
    FILE *f;
    tu_path(path, sizeof path, rel);
    f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* Node facts this machine cannot show (several nodes, memoryless ones,
 * GPUs), from a fake sysfs tree.  Stores are opened for real: what passes
 * the checks must be node 0, the one node that exists here. */
static void test_fake_sysfs(void)
{
    unsigned long allowed[4096 / (8 * sizeof(unsigned long))] = {0};
    char sys[512];
    engram_store *st;
    unsigned long mask;
    int rc;
    ASSERT_EQ(get_mempolicy(NULL, allowed, 4096, NULL, MPOL_F_MEMS_ALLOWED), 0);
    tu_path(sys, sizeof sys, "sys");
    {
        const char *dirs[] = {"sys", "sys/devices", "sys/devices/system", "sys/devices/system/node",
                              "sys/bus", "sys/bus/pci", "sys/bus/pci/devices",
                              "sys/bus/pci/devices/0000:3b:00.0",
                              "sys/bus/pci/devices/0000:5e:00.0",
                              "sys/bus/pci/devices/0000:86:00.0"};
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
            char path[512];
            tu_path(path, sizeof path, dirs[i]);
            ASSERT_EQ(mkdir(path, 0700), 0);
        }
    }
    write_file("sys/devices/system/node/online", "0-2\n");
    write_file("sys/devices/system/node/has_memory", "0,2\n");
    write_file("sys/bus/pci/devices/0000:3b:00.0/numa_node", "0\n");
    write_file("sys/bus/pci/devices/0000:5e:00.0/numa_node", "-1\n");
    write_file("sys/bus/pci/devices/0000:86:00.0/numa_node", "junk\n");
    engram__numa_set_sysfs(sys);

    expect_refused(ENGRAM_NUMA_NODE, 1, NULL, NULL, -EINVAL,
                   "node 1 has no memory (a memoryless node: CPUs or devices only; nodes with "
                   "memory: 0,2)");
    expect_refused(ENGRAM_NUMA_INTERLEAVE, 0, NULL, "0-1", -EINVAL, "node 1 has no memory");
    if (!(allowed[0] & 4))
        expect_refused(ENGRAM_NUMA_NODE, 2, NULL, NULL, -EINVAL,
                       "node 2 is outside this process's cpuset");
    /* A GPU on node 0: its tables go there; named the way nvidia-smi does. */
    st = open_placed("gpu", 0, ENGRAM_NUMA_NODE, -1, "00000000:3B:00.0", NULL, &rc);
    ASSERT_OK(rc);
    populate(st, "t", 7);
    ASSERT_EQ(file_policy("gpu", "t", &mask), MPOL_PREFERRED);
    ASSERT_EQ_U64(mask, 1);
    engram_store_close(st);
    /* A device without a node, on a machine of two nodes with memory. */
    expect_refused(ENGRAM_NUMA_NODE, -1, "5e:00.0", NULL, -ENODEV,
                   "numa_gpu 0000:5e:00.0: the device reports no NUMA node");
    expect_refused(ENGRAM_NUMA_NODE, -1, "0000:86:00.0", NULL, -ENODEV, "holds 'junk'");
    /* The same device where one node has memory: that node. */
    write_file("sys/devices/system/node/has_memory", "0\n");
    st = open_placed("gpu", 0, ENGRAM_NUMA_NODE, -1, "0000:5e:00.0", NULL, &rc);
    ASSERT_OK(rc);
    engram_store_close(st);
    /* Interleave over every node with memory takes the sysfs list too. */
    st = open_placed("gpu", 0, ENGRAM_NUMA_INTERLEAVE, 0, NULL, "", &rc);
    ASSERT_OK(rc);
    populate(st, "il", 8);
    ASSERT_EQ(file_policy("gpu", "il", &mask), MPOL_INTERLEAVE);
    ASSERT_EQ_U64(mask, 1);
    engram_store_close(st);
    /* No sysfs node directory: a kernel without NUMA. */
    {
        char path[512];
        tu_path(path, sizeof path, "sys/devices/system/node/online");
        ASSERT_EQ(unlink(path), 0);
    }
    expect_refused(ENGRAM_NUMA_NODE, 0, NULL, NULL, -ENOTSUP, "online cannot be read");
    engram__numa_set_sysfs(NULL);
}

/* Node copies: written once, rows and range kept, served by NUMA_LOCAL. */
static void test_node_copies(void)
{
    engram_store *st = tu_open("copies", 0, 1), *local;
    engram_table_info a = ENGRAM_TABLE_INFO_INIT, b = ENGRAM_TABLE_INFO_INIT;
    engram_writer *w;
    unsigned char *rows = tu_make_rows(9, ROWS, RB, 0, 0);
    engram_table_id id_base, id_copy, id_local;
    unsigned long mask;
    char longname[ENGRAM_NAME_MAX + 1];
    int written = -1, node = my_node(), rc;
    char copy[64];

    ASSERT_GE(node, 0);
    snprintf(copy, sizeof copy, "t.numa%d", node);
    ASSERT_OK(engram_writer_begin(st, "t", &spec, &w));
    ASSERT_OK(engram_writer_set_range(w, 5000, 100000));
    {
        engram_origin o = {ENGRAM_ORIGIN_REDIS, 42, "remote", "127.0.0.1:7000"};
        ASSERT_OK(engram_writer_set_origin(w, &o));
    }
    ASSERT_OK(engram_writer_append(w, rows, ROWS, 0));
    ASSERT_OK(engram_writer_commit(w));
    ASSERT_OK(engram_numa_copy(st, "t", node, &written));
    ASSERT_EQ(written, 1);
    ASSERT_OK(engram_numa_copy(st, "t", node, &written)); /* a second caller reuses it */
    ASSERT_EQ(written, 0);
    ASSERT_OK(engram_get_table_info(st, "t", &a));
    ASSERT_OK(engram_get_table_info(st, copy, &b));
    ASSERT_EQ_U64(b.checksum, a.checksum);
    ASSERT_EQ_U64(b.spec.num_rows, ROWS);
    ASSERT_EQ(b.spec.row_pitch, PITCH);
    ASSERT_EQ_U64(b.row_start, 5000);
    ASSERT_EQ_U64(b.total_rows, 100000);
    /* Not the origin: the copy is no table of the remote namespace (its
     * name is not the remote's), and engram_check_origin() of the
     * original speaks for it. */
    ASSERT_EQ(a.origin.kind, ENGRAM_ORIGIN_REDIS);
    ASSERT_EQ(b.origin.kind, ENGRAM_ORIGIN_NONE);
    ASSERT_EQ(file_policy("copies", copy, &mask), MPOL_PREFERRED);
    ASSERT_EQ_U64(mask, UINT64_C(1) << node);
    expect_all_on(st, copy, node, 0);
    check_rows(st, copy, 9);

    /* Refusals. */
    ASSERT_ERR(engram_numa_copy(st, "missing", node, NULL), -ENOENT);
    ASSERT_ERR(engram_numa_copy(st, "t", -1, NULL), -EINVAL);
    ASSERT_ERR(engram_numa_copy(st, "t", 64, NULL), -EINVAL);
    ASSERT_ERR(engram_numa_copy(NULL, "t", 0, NULL), -EINVAL);
    memset(longname, 'x', ENGRAM_NAME_MAX - 3);
    longname[ENGRAM_NAME_MAX - 3] = '\0';
    ASSERT_ERR(engram_numa_copy(st, longname, 0, NULL), ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "is longer than 128 bytes");
    /* A link where the table's file is expected, and a file under
     * another table's name: no copy is made of either. */
    {
        char p[512], q[512], lcopy[64];
        struct stat sb;
        tu_path(p, sizeof p, "copies/s");
        ASSERT(symlink("t", p) == 0);
        written = -1;
        ASSERT_ERR(engram_numa_copy(st, "s", node, &written), ENGRAM_EUNSAFE);
        ASSERT_CONTAINS(engram_errmsg(), "is a symbolic link");
        ASSERT_EQ(written, 0);
        snprintf(lcopy, sizeof lcopy, "copies/s.numa%d", node);
        tu_path(q, sizeof q, lcopy);
        ASSERT(lstat(q, &sb) != 0 && errno == ENOENT);
        ASSERT(unlink(p) == 0);
        tu_path(q, sizeof q, "copies/t");
        tu_path(p, sizeof p, "copies/r");
        ASSERT(link(q, p) == 0);
        ASSERT_ERR(engram_numa_copy(st, "r", node, &written), ENGRAM_ECORRUPT);
        ASSERT_CONTAINS(engram_errmsg(), "holds table 't'");
        ASSERT_EQ(written, 0);
        snprintf(lcopy, sizeof lcopy, "copies/r.numa%d", node);
        tu_path(q, sizeof q, lcopy);
        ASSERT(lstat(q, &sb) != 0 && errno == ENOENT);
        ASSERT(unlink(p) == 0);
    }
    /* A copy name already holding other rows. */
    {
        unsigned char *other = tu_make_rows(10, ROWS, RB, 0, 0);
        char ucopy[64];
        ASSERT_OK(engram_populate(st, "u", &spec, rows, 0));
        snprintf(ucopy, sizeof ucopy, "u.numa%d", node);
        ASSERT_OK(engram_populate(st, ucopy, &spec, other, 0));
        ASSERT_ERR(engram_numa_copy(st, "u", node, &written), ENGRAM_EMISMATCH);
        ASSERT_EQ(written, 0);
        free(other);
    }

    /* NUMA_LOCAL: "t" is served from the copy of this thread's node;
     * "v" has no copy and is itself; a copy's name opens literally. */
    ASSERT_OK(engram_populate(st, "v", &spec, rows, 0));
    local = tu_open("copies", ENGRAM_OPEN_NUMA_LOCAL, 1);
    ASSERT_OK(engram_table_open(local, copy, &id_copy));
    ASSERT_OK(engram_table_open(local, "t", &id_local));
    ASSERT_EQ(id_local, id_copy);
    ASSERT_OK(engram_table_open_wait(local, "t", 0, &id_local));
    ASSERT_EQ(id_local, id_copy);
    ASSERT_OK(engram_table_open(local, "v", &id_local));
    ASSERT_NE(id_local, id_copy);
    check_rows(local, "t", 9);
    check_rows(local, "v", 9);
    engram_store_close(local);
    /* Without the flag "t" is the table itself. */
    ASSERT_OK(engram_table_open(st, "t", &id_base));
    ASSERT_OK(engram_table_open(st, copy, &id_copy));
    ASSERT_NE(id_base, id_copy);
    (void)rc;
    engram_store_close(st);
    free(rows);
}
#endif

int main(int argc, char **argv)
{
    tu_cases(argc, argv);
    tu_watchdog(120);
#if ENGRAM_TEST_NUMA
    RUN_TEST(test_node_placement);
    RUN_TEST(test_interleave);
    RUN_TEST(test_private_copy);
    RUN_TEST(test_not_tmpfs);
    RUN_TEST(test_fake_sysfs);
    RUN_TEST(test_node_copies);
#else
    RUN_TEST(test_local_without_libnuma);
#endif
    RUN_TEST(test_bound_and_sampling);
    RUN_TEST(test_source_not_memory);
    RUN_TEST(test_refusals);
    return tu_done("test_numa");
}
