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
 *
 * Processes whose maps cannot be read: a process that is not dumpable
 * (prctl(PR_SET_DUMPABLE, 0)) may be read only with CAP_SYS_PTRACE, so
 * that case runs as an unprivileged user (uid and gid 65534 when the test
 * runs as root, itself otherwise), where such a process's maps cannot be
 * read.  With it mapping none of them, a table nobody maps and tables
 * that readable processes (the measuring one among them) map, all of or
 * half, are shown to be none of its business (unreadable_may_map 0); a
 * table it maps a 64th of is flagged (1), until it exits.
 */
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
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
    /* Whatever this process may not read here (a container's PID 1) maps
     * none of the table. */
    ASSERT_EQ(u.unreadable_may_map, 0);
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
    ASSERT_EQ(u.unreadable_may_map, 0);
    ASSERT_GE(u.rss_bytes, 1000 * RB);
    ASSERT_EQ_U64(u.pss_bytes, u.total_pss_bytes);
    engram_store_close(mem);
    engram_store_close(st);
}

/* Maps table file `name` of namespace "unread" and reads its first
 * `pages` pages (0: all of them), as any process may without the library;
 * the mapping stays until the process exits. */
static void map_pages(const char *name, size_t pages)
{
    char path[600];
    struct stat sb;
    volatile unsigned char sink = 0;
    unsigned char *m;
    size_t len, pg = (size_t)sysconf(_SC_PAGESIZE);
    int fd;
    snprintf(path, sizeof path, "%s/unread/%s", tu_scratch_root(), name);
    ASSERT((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0);
    ASSERT_EQ(fstat(fd, &sb), 0);
    len = (size_t)sb.st_size;
    m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT(m != MAP_FAILED);
    close(fd);
    if (pages == 0 || pages * pg > len)
        pages = (len + pg - 1) / pg;
    for (size_t p = 0; p < pages; p++)
        sink ^= m[p * pg];
}

/* What a mapper maps: the first `pages` pages (0: all) of table `name`. */
struct map_req {
    const char *name;
    size_t pages;
};

/* Forks a process that maps maps[] (up to one without a name), is not
 * dumpable if `hidden`, writes a byte to `ready` and exits on a byte from
 * `quit`, or when its parent dies (a failed assertion there). */
static pid_t mapper(const struct map_req *maps, int hidden, int ready, int quit)
{
    pid_t parent = getpid(), pid = fork();
    char c;
    ASSERT(pid >= 0);
    if (pid > 0)
        return pid;
    ASSERT_EQ(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), 0);
    if (getppid() != parent)
        _exit(1);
    if (hidden)
        ASSERT_EQ(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), 0);
    for (; maps->name; maps++)
        map_pages(maps->name, maps->pages);
    ASSERT_EQ(write(ready, "r", 1), 1);
    ASSERT_EQ(read(quit, &c, 1), 1);
    _exit(0);
}

static engram_table_usage usage_of(engram_store *st, const char *name)
{
    engram_table_usage u = ENGRAM_TABLE_USAGE_INIT;
    ASSERT_OK(engram_get_table_usage(st, name, &u));
    printf("  %-6s: %u processes, %u unreadable, unreadable_may_map %u\n", name, u.processes,
           u.unreadable, u.unreadable_may_map);
    return u;
}

/* test_unreadable in a process of its own (see the top of the file):
 * exits 0, 1 (a failure) or TU_SKIP_CODE with the reason written to
 * `why`. */
static void unreadable_runner(int why)
{
    /* "part" first: forked from this process, the mapper is likely to map
     * it where this process maps its probe (the same size, the same next
     * hole), which the check must not take for the probe. */
    const struct map_req seen_maps[] = {
        {"part", 1024}, {"alone", 0}, {"shared", 0}, {NULL, 0}};
    const struct map_req hidden_maps[] = {{"shared", 32}, {NULL, 0}};
    int ready[2], quit[2], status;
    pid_t seen, hidden;
    engram_store *st;
    engram_table_usage u;
    char path[64], c;
    FILE *f;
    if (geteuid() == 0 && (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 ||
                           setresuid(65534, 65534, 65534) != 0)) {
        dprintf(why, "cannot become uid 65534 (%s)", strerror(errno));
        _exit(TU_SKIP_CODE);
    }
    /* A change of uid leaves a process not dumpable; this one's children
     * other than the hidden one must be readable. */
    ASSERT_EQ(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), 0);
    tu_scratch_path[0] = '\0'; /* a scratch root of this user's */
    st = tu_open("unread", 0, 1);
    tu_populate(st, "idle", 1, ROWS, RB, 0);
    tu_populate(st, "alone", 2, ROWS, RB, 0);
    tu_populate(st, "part", 3, ROWS, RB, 0);
    tu_populate(st, "shared", 4, ROWS, RB, 0);
    tu_check_named(st, "alone", 2, ROWS, RB); /* this process maps it too */
    ASSERT_EQ(pipe(ready), 0);
    ASSERT_EQ(pipe(quit), 0);
    /* "alone": the readable processes' PSS is every resident page (the
     * check's first step); "part": they map half of them (the probe);
     * "shared": the readable one maps all of it, the hidden one 32 pages,
     * a 64th. */
    seen = mapper(seen_maps, 0, ready[1], quit[0]);
    hidden = mapper(hidden_maps, 1, ready[1], quit[0]);
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    snprintf(path, sizeof path, "/proc/%ld/maps", (long)hidden);
    if ((f = fopen(path, "re")) != NULL) {
        fclose(f);
        dprintf(why, "this process reads the maps of a process that is not dumpable "
                     "(CAP_SYS_PTRACE?)");
        _exit(TU_SKIP_CODE);
    }
    u = usage_of(st, "idle");
    ASSERT_EQ(u.processes, 0);
    ASSERT_GE(u.unreadable, 1);
    ASSERT_EQ(u.unreadable_may_map, 0);
    u = usage_of(st, "alone");
    ASSERT_EQ(u.processes, 2);
    ASSERT_GE(u.unreadable, 1);
    ASSERT_EQ(u.unreadable_may_map, 0);
    u = usage_of(st, "part");
    ASSERT_EQ(u.processes, 1);
    ASSERT_GE(u.unreadable, 1);
    ASSERT_EQ(u.unreadable_may_map, 0);
    u = usage_of(st, "shared");
    ASSERT_EQ(u.processes, 1);
    ASSERT_GE(u.unreadable, 1);
    ASSERT_EQ(u.unreadable_may_map, 1);
    /* The hidden process gone, nobody unread maps "shared". */
    ASSERT_EQ(write(quit[1], "qq", 2), 2);
    ASSERT_EQ(waitpid(hidden, &status, 0), hidden);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_EQ(waitpid(seen, &status, 0), seen);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    u = usage_of(st, "shared");
    ASSERT_EQ(u.processes, 0);
    ASSERT_EQ(u.unreadable_may_map, 0);
    engram_store_close(st);
    exit(0); /* removes this user's scratch root */
}

static void test_unreadable(void)
{
    int why[2], status;
    char reason[256] = "";
    ssize_t n;
    pid_t runner;
    tu_current_case = "processes whose maps cannot be read, mapping a table or not";
    ASSERT_EQ(pipe(why), 0);
    fflush(stdout);
    runner = fork();
    ASSERT(runner >= 0);
    if (runner == 0) {
        close(why[0]);
        unreadable_runner(why[1]);
    }
    close(why[1]);
    ASSERT_EQ(waitpid(runner, &status, 0), runner);
    /* Read once the runner is gone (the reason, if any, is written): its
     * mappers may outlive it by a moment, holding the pipe open. */
    ASSERT_EQ(fcntl(why[0], F_SETFL, O_NONBLOCK), 0);
    n = read(why[0], reason, sizeof reason - 1);
    close(why[0]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == TU_SKIP_CODE) {
        reason[n > 0 ? n : 0] = '\0';
        tu_skip_case("%s", reason);
        return;
    }
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    tu_watchdog(120);
    RUN_TEST(test_four_mappers);
    RUN_TEST(test_bad_args);
    RUN_TEST(test_unreadable);
    return tu_done("test_usage");
}
