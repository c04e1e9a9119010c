/*
 * test_usage.c - engram_get_table_usage(): who maps a table file, their
 * shares, and the memory cgroup its pages are charged to.
 *
 * A table is written by a child placed in a memory cgroup of its own
 * (where this process may make one: root, cgroup v1 or a v2 subtree; the
 * cgroup check is skipped with the reason otherwise), then mapped and
 * touched by 4 processes: the usage counts the 4, their PSS adds up to the
 * table's size and each has a quarter of it (within 5%), and the pages are
 * charged to the writer's cgroup, not to the processes that map them.
 */
#include <fcntl.h>
#include <sys/wait.h>

#include "capacity.h"
#include "testutil.h"

#define ROWS 32768
#define RB 256 /* 8 MiB */

static char cg_dir[4200];

static pid_t cg_owner;

static void cgroup_remove(void)
{
    if (cg_owner == getpid())
        rmdir(cg_dir);
}

/* Makes a memory cgroup below this process's, removed at exit; 0, or -1
 * (skipped). */
static int cgroup_make(void)
{
    char parent[4096];
    int v2;
    if (engram__memcg_dir(parent, sizeof parent, &v2) != 0) {
        tu_skip_part("no memory cgroup found: the writer's cgroup is not checked");
        return -1;
    }
    snprintf(cg_dir, sizeof cg_dir, "%s/engram-usage-%d", parent, (int)getpid());
    if (mkdir(cg_dir, 0755) != 0) {
        tu_skip_part("cannot create a cgroup under %s (%s): the writer's cgroup is not checked",
                     parent, strerror(errno));
        return -1;
    }
    cg_owner = getpid();
    atexit(cgroup_remove);
    return 0;
}

static void cgroup_join(void)
{
    char file[4300], pid[32];
    int fd;
    snprintf(file, sizeof file, "%s/cgroup.procs", cg_dir);
    snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    fd = open(file, O_WRONLY);
    ASSERT(fd >= 0);
    ASSERT(write(fd, pid, strlen(pid)) == (ssize_t)strlen(pid));
    close(fd);
}

static engram_store *open_ns(void)
{
    engram_store *st = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "usage", NULL, &st));
    return st;
}

static void test_four_mappers(void)
{
    int have_cg, ready[2], go[2], res[2], quit[2];
    pid_t writer, pids[4];
    engram_store *st;
    engram_table_usage u = ENGRAM_TABLE_USAGE_INIT;
    uint64_t size = (uint64_t)ROWS * RB;
    tu_current_case = "4 processes map a table written from another cgroup";
    st = tu_open("usage", 0, 1);
    have_cg = cgroup_make() == 0;
    writer = fork();
    ASSERT(writer >= 0);
    if (writer == 0) {
        engram_store *ws = open_ns();
        if (have_cg)
            cgroup_join();
        tu_populate(ws, "t", 7, ROWS, RB, 0);
        engram_store_close(ws);
        _exit(0);
    }
    {
        int status;
        ASSERT_EQ(waitpid(writer, &status, 0), writer);
        ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    ASSERT_EQ(pipe(ready), 0);
    ASSERT_EQ(pipe(go), 0);
    ASSERT_EQ(pipe(res), 0);
    ASSERT_EQ(pipe(quit), 0);
    for (int i = 0; i < 4; i++) {
        pids[i] = fork();
        ASSERT(pids[i] >= 0);
        if (pids[i] == 0) {
            engram_store *cs = open_ns();
            engram_table_usage cu = ENGRAM_TABLE_USAGE_INIT;
            char c;
            tu_check_named(cs, "t", 7, ROWS, RB); /* maps it and touches every row */
            ASSERT_EQ(write(ready[1], "r", 1), 1);
            ASSERT_EQ(read(go[0], &c, 1), 1);
            ASSERT_OK(engram_get_table_usage(cs, "t", &cu));
            ASSERT_EQ(write(res[1], &cu, sizeof cu), (ssize_t)sizeof cu);
            ASSERT_EQ(read(quit[0], &c, 1), 1); /* all have measured */
            engram_store_close(cs);
            _exit(0);
        }
    }
    for (int i = 0; i < 4; i++) {
        char c;
        ASSERT_EQ(read(ready[0], &c, 1), 1);
    }
    /* This process does not map it. */
    ASSERT_OK(engram_get_table_usage(st, "t", &u));
    printf("  %u processes, total PSS %llu of %llu bytes, file %llu bytes, cgroup '%s' "
           "(%u of %u sampled pages)\n",
           u.processes, (unsigned long long)u.total_pss_bytes, (unsigned long long)size,
           (unsigned long long)u.file_bytes, u.cgroup, u.cgroup_pages, u.sampled_pages);
    ASSERT_EQ(u.processes, 4);
    ASSERT_EQ_U64(u.rss_bytes, 0);
    ASSERT_EQ_U64(u.pss_bytes, 0);
    ASSERT_GE(u.total_pss_bytes, size * 95 / 100);
    ASSERT_LE(u.total_pss_bytes, size * 105 / 100);
    ASSERT_GE(u.file_bytes, size);
    if (u.sampled_pages) {
        ASSERT_GE(u.cgroup_pages * 10, u.sampled_pages * 9);
        if (have_cg)
            ASSERT_STR_EQ(u.cgroup, cg_dir); /* the writer's, not the mappers' */
    } else {
        tu_skip_part("no page frames readable here: the pages' cgroup is not checked");
        ASSERT_STR_EQ(u.cgroup, "");
    }
    /* Each mapper: a quarter of the table's PSS, all of it resident.  One
     * at a time: a measuring process maps a sample of the pages for the
     * cgroup, which takes from the others' shares while it does. */
    for (int i = 0; i < 4; i++) {
        engram_table_usage cu;
        ASSERT_EQ(write(go[1], "g", 1), 1);
        ASSERT_EQ(read(res[0], &cu, sizeof cu), (ssize_t)sizeof cu);
        ASSERT_EQ(cu.processes, 4);
        ASSERT_GE(cu.rss_bytes, size * 95 / 100);
        ASSERT_GE(cu.pss_bytes, size / 4 * 95 / 100);
        ASSERT_LE(cu.pss_bytes, size / 4 * 105 / 100);
    }
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(write(quit[1], "q", 1), 1);
    for (int i = 0; i < 4; i++) {
        int status;
        ASSERT_EQ(waitpid(pids[i], &status, 0), pids[i]);
        ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    for (int i = 0; i < 2; i++) {
        close(ready[i]);
        close(go[i]);
        close(res[i]);
        close(quit[i]);
    }
    ASSERT_OK(engram_remove(st, "t"));
    engram_store_close(st);
}

static void test_bad_args(void)
{
    engram_store *st = tu_open("usage-args", 0, 1), *mem;
    engram_table_usage u = ENGRAM_TABLE_USAGE_INIT;
    tu_current_case = "engram_get_table_usage: bad arguments";
    ASSERT_ERR(engram_get_table_usage(st, "missing", &u), -ENOENT);
    ASSERT_ERR(engram_get_table_usage(st, "../x", &u), ENGRAM_ESPEC);
    ASSERT_ERR(engram_get_table_usage(NULL, "t", &u), -EINVAL);
    ASSERT_ERR(engram_get_table_usage(st, "t", NULL), -EINVAL);
    u.size = 8;
    ASSERT_ERR(engram_get_table_usage(st, "t", &u), -EINVAL);
    ASSERT_OK(engram_store_open_memory(NULL, &mem));
    u.size = sizeof u;
    ASSERT_ERR(engram_get_table_usage(mem, "t", &u), -ENOENT);
    /* This process maps it: counted, with all its bytes. */
    tu_populate(st, "t", 3, 1000, RB, 0);
    tu_check_named(st, "t", 3, 1000, RB);
    ASSERT_OK(engram_get_table_usage(st, "t", &u));
    ASSERT_EQ(u.processes, 1);
    ASSERT_GE(u.rss_bytes, 1000 * RB);
    ASSERT_EQ_U64(u.pss_bytes, u.total_pss_bytes);
    engram_store_close(mem);
    engram_store_close(st);
}

int main(void)
{
    tu_watchdog(120);
    RUN_TEST(test_four_mappers);
    RUN_TEST(test_bad_args);
    return tu_done("test_usage");
}
