/*
 * test_capacity.c - tables that do not fit are refused before the first
 * byte, with the figures and the fix.
 *
 *  - a small tmpfs (an 8 MiB tmpfs mounted in a private mount namespace of
 *    a child process): engram_check_capacity and engram_populate refuse a
 *    16 MiB table with -ENOSPC naming the bytes needed and free and the
 *    fix, leave nothing in the namespace, and accept a 4 MiB one;
 *  - a memory cgroup limit (a child cgroup of this process's, 48 MiB, with
 *    a child process moved into it): a 64 MiB table on /dev/shm is refused
 *    with -ENOSPC naming the cgroup and its limit; an 8 MiB one is written;
 *  - bad arguments.
 * The first two need root (mount, cgroup creation): each skips with the
 * reason where that is not possible, and each is a CTest entry of its own
 * (test_capacity.small_tmpfs, test_capacity.cgroup_limit) so that CTest
 * reports the skip.
 */
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>

#include "capacity.h"
#include "testutil.h"

#define MiB (1024u * 1024u)

/* Runs fn in a child; returns its exit status (77: skipped), or 128 +
 * the signal that killed it.  Asserts nothing: callers clean up first. */
static int in_child(void (*fn)(void))
{
    int status;
    pid_t pid;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        fn();
        fflush(stdout);
        _exit(0);
    }
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void count_entries(const char *dir, int *n)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    ASSERT(d != NULL);
    *n = 0;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            (*n)++;
    closedir(d);
}

static void small_tmpfs_child(void)
{
    char dir[512], ns[600];
    engram_table_spec big = {16 * MiB / 256, 256, 0}, small = {4 * MiB / 256, 256, 0};
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    unsigned char *rows;
    int n, rc;
    tu_path(dir, sizeof dir, "small");
    ASSERT(mkdir(dir, 0700) == 0);
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", dir, "tmpfs", 0, "size=8m,mode=0700") != 0) {
        printf("   cannot mount a small tmpfs here: %s\n", strerror(errno));
        _exit(TU_SKIP_CODE);
    }
    /* Up front. */
    ASSERT_ERR(engram_check_capacity(dir, &big, 1), -ENOSPC);
    ASSERT_CONTAINS(engram_errmsg(), "needs 16.0 MiB");
    ASSERT_CONTAINS(engram_errmsg(), "free (of 8.0 MiB)");
    ASSERT_CONTAINS(engram_errmsg(), "--shm-size");
    ASSERT_CONTAINS(engram_errmsg(), "ENGRAM_OPEN_FILE_CACHE");
    ASSERT_OK(engram_check_capacity(dir, &small, 1));
    {
        engram_table_spec two[2] = {small, small};
        ASSERT_OK(engram_check_capacity(dir, two, 1));
        ASSERT_ERR(engram_check_capacity(dir, two, 2), -ENOSPC); /* 2 x 4 MiB + headers */
        ASSERT_CONTAINS(engram_errmsg(), "2 tables need 8.0 MiB");
    }
    /* And at begin: nothing written, nothing left. */
    o.flags = ENGRAM_OPEN_CREATE;
    ASSERT_OK(engram_store_open(dir, "ns", &o, &st));
    rows = tu_make_rows(1, big.num_rows, 256, 256, 0);
    ASSERT_FAILS(engram_populate(st, "big", &big, rows, 0), rc);
    ASSERT_EQ(rc, -ENOSPC);
    ASSERT_CONTAINS(engram_errmsg(), "table 'big' needs 16.0 MiB");
    snprintf(ns, sizeof ns, "%s/ns", dir);
    count_entries(ns, &n);
    ASSERT_EQ(n, 0);
    ASSERT_OK(engram_populate(st, "small", &small, rows, 0));
    tu_check_named(st, "small", 1, small.num_rows, 256);
    free(rows);
    engram_store_close(st);
    umount(dir);
}

static void test_small_tmpfs(void)
{
    int rc;
    tu_current_case = "an 8 MiB tmpfs refuses a 16 MiB table up front";
    rc = in_child(small_tmpfs_child);
    if (rc == TU_SKIP_CODE) {
        tu_skip_case("mounting a tmpfs in a mount namespace of its own needs root "
                     "(the child's reason is above)");
        return;
    }
    ASSERT_EQ(rc, 0);
}

static char cg_dir[4200];

static void cgroup_child(void)
{
    char file[4300], pid[32];
    engram_table_spec big = {64 * MiB / 256, 256, 0}, small = {8 * MiB / 256, 256, 0};
    engram_store *st;
    unsigned char *rows;
    int fd, rc;
    snprintf(file, sizeof file, "%s/cgroup.procs", cg_dir);
    snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if ((fd = open(file, O_WRONLY)) < 0 || write(fd, pid, strlen(pid)) < 0) {
        printf("   cannot move a process into %s: %s\n", cg_dir, strerror(errno));
        _exit(TU_SKIP_CODE);
    }
    close(fd);
    ASSERT_ERR(engram_check_capacity(tu_scratch_root(), &big, 1), -ENOSPC);
    ASSERT_CONTAINS(engram_errmsg(), "memory cgroup");
    ASSERT_CONTAINS(engram_errmsg(), cg_dir);
    ASSERT_CONTAINS(engram_errmsg(), "of its 48.0 MiB limit");
    ASSERT_CONTAINS(engram_errmsg(), "needs 64.0 MiB");
    st = tu_open("cg", 0, 1);
    {
        /* (Through a writer: 64 MiB of rows in memory would be more than
         * this cgroup allows.) */
        engram_writer *w = NULL;
        ASSERT_FAILS(engram_writer_begin(st, "big", &big, &w), rc);
        ASSERT_EQ(rc, -ENOSPC);
        ASSERT(w == NULL);
        ASSERT_CONTAINS(engram_errmsg(), "table 'big' needs 64.0 MiB");
    }
    rows = tu_make_rows(2, small.num_rows, 256, 256, 0);
    ASSERT_OK(engram_populate(st, "small", &small, rows, 0));
    tu_check_named(st, "small", 2, small.num_rows, 256);
    free(rows);
    ASSERT_OK(engram_remove(st, "small"));
    engram_store_close(st);
}

static void test_cgroup_limit(void)
{
    char parent[4096], file[4300];
    const char *limit_file;
    int v2, fd, rc;
    tu_current_case = "a memory cgroup limit refuses a tmpfs table beyond it";
    if (engram__memcg_dir(parent, sizeof parent, &v2) != 0) {
        tu_skip_case("no memory cgroup found for this process");
        return;
    }
    snprintf(cg_dir, sizeof cg_dir, "%s/engram-test-%d", parent, (int)getpid());
    if (mkdir(cg_dir, 0755) != 0) {
        tu_skip_case("cannot create a memory cgroup under %s: %s", parent, strerror(errno));
        return;
    }
    limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
    snprintf(file, sizeof file, "%s/%s", cg_dir, limit_file);
    if ((fd = open(file, O_WRONLY)) < 0 || write(fd, "50331648", 8) != 8) {
        tu_skip_case("cannot set %s: %s", file, strerror(errno));
        if (fd >= 0)
            close(fd);
        rmdir(cg_dir);
        return;
    }
    close(fd);
    rc = in_child(cgroup_child);
    rmdir(cg_dir);
    if (rc == TU_SKIP_CODE) {
        tu_skip_case("cannot move a process into the cgroup (the child's reason is above)");
        return;
    }
    ASSERT_EQ(rc, 0);
}

static void test_bad_args(void)
{
    engram_table_spec ok = {10, 8, 0}, bad = {0, 8, 0};
    tu_current_case = "engram_check_capacity: bad arguments";
    ASSERT_ERR(engram_check_capacity(NULL, &ok, 1), -EINVAL);
    ASSERT_ERR(engram_check_capacity(tu_scratch_root(), NULL, 1), -EINVAL);
    ASSERT_ERR(engram_check_capacity(tu_scratch_root(), &bad, 1), ENGRAM_ESPEC);
    ASSERT_ERR(engram_check_capacity("/nonexistent/engram", &ok, 1), -ENOENT);
    ASSERT_OK(engram_check_capacity(tu_scratch_root(), NULL, 0));
    ASSERT_OK(engram_check_capacity(tu_scratch_root(), &ok, 1));
}

int main(int argc, char **argv)
{
    tu_cases(argc, argv);
    tu_watchdog(120);
    RUN_TEST(test_small_tmpfs);
    RUN_TEST(test_cgroup_limit);
    RUN_TEST(test_bad_args);
    return tu_done("test_capacity");
}
