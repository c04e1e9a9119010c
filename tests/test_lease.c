/*
 * test_lease.c - namespace leases, engram_namespace_usage() and
 * engram_namespace_gc() through the public API.
 *
 * A store holds a lease on its namespace from its first table open until
 * it is closed; another process sees it as a user, a removal stops on it,
 * and gc keeps the namespace.  A process killed with its store open
 * leaves a stale lease: counted as such, removed by the next store open,
 * and no obstacle to gc.  gc removes only namespaces idle for long enough
 * (their last use is set back with utimensat() here), reports every one,
 * removes nothing with ENGRAM_GC_DRY_RUN, and keeps what it may not
 * remove (a file that is not a table, a running writer, named with its
 * process; an entry named like a writer's temporary file that is none).
 */
#include <fcntl.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>

#include "testutil.h"

static int ns_exists(const char *ns)
{
    char p[512];
    struct stat sb;
    tu_path(p, sizeof p, ns);
    return lstat(p, &sb) == 0;
}

/* The number of entries of namespace `ns` whose names start with
 * `prefix`. */
static int entries_with(const char *ns, const char *prefix)
{
    char p[512];
    int n = 0;
    struct dirent *de;
    DIR *d;
    tu_path(p, sizeof p, ns);
    d = opendir(p);
    ASSERT(d != NULL);
    while ((de = readdir(d)) != NULL)
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* The number of lease files in namespace `ns`. */
static int lease_files(const char *ns)
{
    return entries_with(ns, ".lease.");
}

/* Sets the modification time of namespace `ns` and of everything in it
 * `age_s` seconds back. */
static void age_ns(const char *ns, long age_s)
{
    char p[512], f[1024];
    struct timespec ts[2];
    struct dirent *de;
    DIR *d;
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= age_s;
    ts[1] = ts[0];
    tu_path(p, sizeof p, ns);
    d = opendir(p);
    ASSERT(d != NULL);
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, "..")))
            continue;
        snprintf(f, sizeof f, "%s/%s", p, de->d_name);
        ASSERT(utimensat(AT_FDCWD, f, ts, AT_SYMLINK_NOFOLLOW) == 0);
    }
    closedir(d);
    ASSERT(utimensat(AT_FDCWD, p, ts, 0) == 0);
}

static void usage_of(const char *ns, engram_namespace_use *u)
{
    engram_namespace_use init = ENGRAM_NAMESPACE_USE_INIT;
    *u = init;
    ASSERT_OK(engram_namespace_usage(tu_scratch_root(), ns, u));
}

/* A child that opens table t of `ns` and waits, holding its lease, until
 * it is killed.  Returns its pid once the table is open. */
static pid_t spawn_user(const char *ns)
{
    int p[2];
    char c;
    pid_t pid;
    ASSERT(pipe(p) == 0);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        engram_store *st = tu_open(ns, 0, 1);
        engram_table_id tb;
        close(p[0]);
        ASSERT_OK(engram_table_open(st, "t", &tb));
        ASSERT(write(p[1], "x", 1) == 1);
        for (;;)
            pause();
    }
    close(p[1]);
    ASSERT(read(p[0], &c, 1) == 1);
    close(p[0]);
    return pid;
}

static void kill_user(pid_t pid)
{
    int status;
    ASSERT(kill(pid, SIGKILL) == 0);
    ASSERT(waitpid(pid, &status, 0) == pid);
}

/* What gc reported, one line per namespace: "ns:code:detail;". */
struct report {
    char text[4096];
};

static void record(void *ud, const char *ns, int code, const char *detail)
{
    struct report *r = ud;
    size_t len = strlen(r->text);
    snprintf(r->text + len, sizeof r->text - len, "%s:%d:%s;", ns, code, detail);
}

static void test_own_lease(void)
{
    engram_namespace_use u;
    engram_store *st = tu_open("own", 0, 1);
    engram_table_id a, b;
    char me[64];
    tu_populate(st, "t", 1, 16, 8, 0);
    tu_populate(st, "u", 2, 16, 8, 0);
    /* Writing takes no lease; opening a table does, one per store. */
    usage_of("own", &u);
    ASSERT_EQ(u.users, 0);
    ASSERT_EQ(lease_files("own"), 0);
    ASSERT_OK(engram_table_open(st, "t", &a));
    ASSERT_OK(engram_table_open(st, "u", &b));
    usage_of("own", &u);
    ASSERT_EQ(u.users, 1);
    ASSERT_EQ(u.stale_leases, 0);
    snprintf(me, sizeof me, "pid %d ", (int)getpid());
    ASSERT_CONTAINS(u.first_user, me);
    ASSERT_CONTAINS(u.first_user, "command test_lease");
    ASSERT_EQ(lease_files("own"), 1);
    ASSERT(u.last_used_ns > 0);
    /* A forked child that closes its copy leaves the parent's lease. */
    {
        pid_t pid = fork();
        int status;
        ASSERT(pid >= 0);
        if (pid == 0) {
            engram_store_close(st);
            _exit(0);
        }
        ASSERT(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
    }
    usage_of("own", &u);
    ASSERT_EQ(u.users, 1);
    engram_store_close(st);
    usage_of("own", &u);
    ASSERT_EQ(u.users, 0);
    ASSERT_EQ(lease_files("own"), 0);

    /* A child forked with the store open keeps the lease alive after its
     * parent closes the store; it is stale once the child is gone. */
    st = tu_open("own", 0, 1);
    ASSERT_OK(engram_table_open(st, "t", &a));
    {
        int p[2];
        char c;
        pid_t pid;
        ASSERT(pipe(p) == 0);
        pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            close(p[1]);
            /* Until the parent says, using the inherited store. */
            ASSERT(read(p[0], &c, 1) >= 0);
            tu_check_table(st, a, 1, 16, 8);
            _exit(0);
        }
        close(p[0]);
        engram_store_close(st);
        usage_of("own", &u);
        ASSERT_EQ(u.users, 1);
        ASSERT_EQ(lease_files("own"), 1);
        ASSERT(write(p[1], "x", 1) == 1);
        close(p[1]);
        {
            int status;
            ASSERT(waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
                   WEXITSTATUS(status) == 0);
        }
        usage_of("own", &u);
        ASSERT_EQ(u.users, 0);
        ASSERT_EQ(u.stale_leases, 1);
        engram_store_close(tu_open("own", 0, 1));
        ASSERT_EQ(lease_files("own"), 0);
    }
}

static void test_other_process(void)
{
    engram_namespace_use u;
    struct report r = {""};
    char want[64];
    engram_store *st = tu_open("busy", 0, 1);
    pid_t pid;
    tu_populate(st, "t", 3, 16, 8, 0);
    engram_store_close(st);

    pid = spawn_user("busy");
    usage_of("busy", &u);
    ASSERT_EQ(u.users, 1);
    snprintf(want, sizeof want, "pid %d ", (int)pid);
    ASSERT_CONTAINS(u.first_user, want);
    /* A removal stops on it, naming the process; gc keeps it, even when
     * old. */
    ASSERT_ERR(engram_namespace_remove(tu_scratch_root(), "busy", ENGRAM_NS_REMOVE_TABLES),
               -EBUSY);
    ASSERT_CONTAINS(engram_errmsg(), want);
    ASSERT(ns_exists("busy/t"));
    age_ns("busy", 7200);
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 0, 0, record, &r));
    ASSERT_CONTAINS(r.text, "busy:1:in use (1 live lease:");
    ASSERT(ns_exists("busy/t"));

    /* Killed: its lease is stale, and no obstacle. */
    kill_user(pid);
    usage_of("busy", &u);
    ASSERT_EQ(u.users, 0);
    ASSERT_EQ(u.stale_leases, 1);
    r.text[0] = '\0';
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 3600, 0, record, &r));
    ASSERT_CONTAINS(r.text, "busy:0:no live lease, last used 7");
    ASSERT(!ns_exists("busy"));

    /* Removed while in use, when asked to: the user keeps running. */
    st = tu_open("busy", 0, 1);
    tu_populate(st, "t", 3, 16, 8, 0);
    engram_store_close(st);
    pid = spawn_user("busy");
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "busy",
                                      ENGRAM_NS_REMOVE_TABLES | ENGRAM_NS_REMOVE_IN_USE));
    ASSERT(!ns_exists("busy"));
    ASSERT(kill(pid, 0) == 0);
    kill_user(pid);
}

static void test_stale_removed_by_open(void)
{
    engram_namespace_use u;
    engram_store *st = tu_open("stale", 0, 1);
    pid_t pid;
    tu_populate(st, "t", 4, 16, 8, 0);
    engram_store_close(st);
    pid = spawn_user("stale");
    kill_user(pid);
    ASSERT_EQ(lease_files("stale"), 1);
    age_ns("stale", 7200);
    st = tu_open("stale", 0, 1);
    ASSERT_EQ(lease_files("stale"), 0);
    usage_of("stale", &u);
    ASSERT_EQ(u.stale_leases, 0);
    /* Removing what the dead left is no use: the last use stays. */
    {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        ASSERT_GT((uint64_t)now.tv_sec - u.last_used_ns / 1000000000u, 7000);
    }
    engram_store_close(st);
    /* A stale lease does not stop a removal either. */
    pid = spawn_user("stale");
    kill_user(pid);
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "stale", ENGRAM_NS_REMOVE_TABLES));
    ASSERT(!ns_exists("stale"));
}

static void test_gc_age_and_dry_run(void)
{
    struct report r = {""};
    engram_store *st;
    st = tu_open("old", 0, 1);
    tu_populate(st, "t", 5, 16, 8, 0);
    engram_store_close(st);
    st = tu_open("new", 0, 1);
    tu_populate(st, "t", 6, 16, 8, 0);
    engram_store_close(st);
    engram_store_close(tu_open("empty-old", 0, 1));
    age_ns("old", 7200);
    age_ns("empty-old", 7200);

    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 3600, ENGRAM_GC_DRY_RUN, record, &r));
    ASSERT_CONTAINS(r.text, "old:0:no live lease, last used 7");
    ASSERT_CONTAINS(r.text, "empty-old:0:");
    ASSERT_CONTAINS(r.text, "new:1:used 0 s ago;");
    ASSERT(ns_exists("old/t") && ns_exists("empty-old") && ns_exists("new/t"));

    r.text[0] = '\0';
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 3600, 0, NULL, NULL));
    ASSERT(!ns_exists("old") && !ns_exists("empty-old"));
    ASSERT(ns_exists("new/t"));
    /* Reading a table is a use: an old namespace opened now is new. */
    age_ns("new", 7200);
    st = tu_open("new", 0, 1);
    {
        engram_table_id t;
        ASSERT_OK(engram_table_open(st, "t", &t));
    }
    engram_store_close(st);
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 3600, 0, record, &r));
    ASSERT(ns_exists("new/t"));
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "new", ENGRAM_NS_REMOVE_TABLES));
}

/* The number of a dead writer's temporary files in namespace `ns`. */
static int temp_files(const char *ns)
{
    return entries_with(ns, ".tmp.");
}

/* A dry run removes nothing: not the namespace, and not what dead
 * processes left in it either (a stale lease, a killed writer's temporary
 * file), which a real run would remove along with it. */
static void test_gc_dry_run_touches_nothing(void)
{
    struct report r = {""};
    engram_namespace_use u;
    engram_store *st = tu_open("dead", 0, 1);
    pid_t pid;
    int status;
    tu_populate(st, "t", 9, 16, 8, 0);
    engram_store_close(st);
    /* One process leaves both (the next one's open would remove the
     * first's). */
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        engram_table_spec spec = {16, 8, 0};
        engram_writer *w;
        engram_table_id t;
        st = tu_open("dead", 0, 1);
        ASSERT_OK(engram_table_open(st, "t", &t));
        ASSERT_OK(engram_writer_begin(st, "u", &spec, &w));
        raise(SIGKILL);
    }
    ASSERT(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
    ASSERT_EQ(lease_files("dead"), 1);
    ASSERT_EQ(temp_files("dead"), 1);
    age_ns("dead", 7200);

    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 3600, ENGRAM_GC_DRY_RUN, record, &r));
    ASSERT_CONTAINS(r.text, "dead:0:no live lease, last used 7");
    ASSERT_EQ(lease_files("dead"), 1);
    ASSERT_EQ(temp_files("dead"), 1);
    usage_of("dead", &u);
    ASSERT_EQ(u.stale_leases, 1);
    ASSERT(ns_exists("dead/t"));

    /* The real run removes all of it. */
    r.text[0] = '\0';
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 3600, 0, record, &r));
    ASSERT_CONTAINS(r.text, "dead:0:no live lease, last used 7");
    ASSERT(!ns_exists("dead"));
}

static void test_gc_keeps_what_it_may_not_remove(void)
{
    struct report r = {""};
    char p[512];
    engram_store *st = tu_open("foreign", 0, 1);
    engram_writer *w;
    engram_table_spec spec = {16, 8, 0};
    tu_populate(st, "t", 7, 16, 8, 0);
    engram_store_close(st);
    tu_path(p, sizeof p, "foreign/notes.txt");
    close(open(p, O_WRONLY | O_CREAT, 0600));
    age_ns("foreign", 7200);

    st = tu_open("writing", 0, 1);
    ASSERT_OK(engram_writer_begin(st, "t", &spec, &w));
    age_ns("writing", 7200);

    /* A dry run says what the real run will do. */
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 60, ENGRAM_GC_DRY_RUN, record, &r));
    ASSERT_CONTAINS(r.text, "foreign:-39:"); /* -ENOTEMPTY */
    ASSERT_CONTAINS(r.text, "notes.txt");
    ASSERT_CONTAINS(r.text, "writing:-16:"); /* -EBUSY */
    r.text[0] = '\0';
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 60, 0, record, &r));
    ASSERT_CONTAINS(r.text, "foreign:-39:"); /* -ENOTEMPTY */
    ASSERT_CONTAINS(r.text, "notes.txt");
    ASSERT_CONTAINS(r.text, "writing:-16:"); /* -EBUSY */
    ASSERT(ns_exists("foreign/t") && ns_exists("writing"));
    engram_writer_abort(w);
    engram_store_close(st);
    unlink(p);
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 0, 0, NULL, NULL));
    ASSERT(!ns_exists("foreign") && !ns_exists("writing"));
}

/* Entries named like a writer's temporary file that are no writer's (a
 * FIFO, a directory, a link, a file of another user: nothing the library
 * writes) are stray entries, as a foreign file is: named, never taken
 * for a table being written (which would keep the namespace for ever
 * under a reason that is not true). */
static void test_gc_stray_temps(void)
{
    static const char *const kinds[] = {"fifo", "dir", "link"};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        struct report r = {""};
        char p[512];
        engram_store *st = tu_open("stray", 0, 1);
        tu_populate(st, "t", 8, 16, 8, 0);
        engram_store_close(st);
        tu_path(p, sizeof p, "stray/.tmp.t.4242.abc");
        if (k == 0)
            ASSERT(mkfifo(p, 0600) == 0);
        else if (k == 1)
            ASSERT(mkdir(p, 0700) == 0);
        else
            ASSERT(symlink("t", p) == 0);
        age_ns("stray", 7200);
        tu_current_case = kinds[k];
        ASSERT_ERR(engram_namespace_remove(tu_scratch_root(), "stray", ENGRAM_NS_REMOVE_TABLES),
                   -ENOTEMPTY);
        ASSERT_CONTAINS(engram_errmsg(), "'.tmp.t.4242.abc', which is not an engram table");
        ASSERT(strstr(engram_errmsg(), "being written") == NULL);
        ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 60, ENGRAM_GC_DRY_RUN, record, &r));
        ASSERT_CONTAINS(r.text, "stray:-39:"); /* -ENOTEMPTY */
        ASSERT_CONTAINS(r.text, "'.tmp.t.4242.abc', which is not an engram table");
        ASSERT(strstr(r.text, "being written") == NULL);
        r.text[0] = '\0';
        ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 60, 0, record, &r));
        ASSERT_CONTAINS(r.text, "stray:-39:");
        ASSERT(strstr(r.text, "being written") == NULL);
        ASSERT(ns_exists("stray/t") && ns_exists("stray/.tmp.t.4242.abc"));
        /* Removed by hand, as the message says: nothing else stops gc. */
        if (k == 1)
            ASSERT(rmdir(p) == 0);
        else
            ASSERT(unlink(p) == 0);
        ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 0, 0, NULL, NULL));
        ASSERT(!ns_exists("stray"));
    }
}

/* A running writer keeps its namespace; the report names its process and
 * how long it has held the name. */
static void test_gc_names_the_writer(void)
{
    struct report r = {""};
    engram_store *st = tu_open("held", 0, 1);
    engram_writer *w;
    engram_table_spec spec = {16, 8, 0};
    char want[64];
    ASSERT_OK(engram_writer_begin(st, "t", &spec, &w));
    age_ns("held", 7200);
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 60, 0, record, &r));
    ASSERT_CONTAINS(r.text, "held:-16:"); /* -EBUSY */
    ASSERT_CONTAINS(r.text, "table 't' is being written");
    snprintf(want, sizeof want, "by pid %d, ", (int)getpid());
    ASSERT_CONTAINS(r.text, want);
    ASSERT_CONTAINS(r.text, " s now");
    ASSERT(ns_exists("held"));
    engram_writer_abort(w);
    engram_store_close(st);
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "held", 0));
}

/* Whether namespace `ns` holds a lease file of process `pid`. */
static int has_lease_of(const char *ns, pid_t pid)
{
    char pre[64];
    snprintf(pre, sizeof pre, ".lease.%d.", (int)pid);
    return entries_with(ns, pre) > 0;
}

/* Processes that open stores and tables of one namespace at once, while
 * another asks who uses it: every store that opened a table holds a
 * lease, whatever the others' cleanups and checks were doing at the
 * moment it took it (their locks on a lease being made must not cost the
 * store its lease). */
static void test_lease_under_contention(void)
{
    enum { PROCS = 4, ROUNDS = 300 };
    pid_t kids[PROCS + 1];
    int failed = 0;
    engram_store *st = tu_open("crowd", 0, 1);
    tu_populate(st, "t", 8, 16, 8, 0);
    engram_store_close(st);
    for (int k = 0; k <= PROCS; k++) {
        kids[k] = fork();
        ASSERT(kids[k] >= 0);
        if (kids[k] == 0) {
            for (int i = 0; i < ROUNDS; i++) {
                engram_table_id t;
                engram_namespace_use u = ENGRAM_NAMESPACE_USE_INIT;
                if (k == PROCS) {
                    /* The one that only looks. */
                    ASSERT_OK(engram_namespace_usage(tu_scratch_root(), "crowd", &u));
                    continue;
                }
                st = tu_open("crowd", 0, 1);
                ASSERT_OK(engram_table_open(st, "t", &t));
                if (!has_lease_of("crowd", getpid())) {
                    fprintf(stderr, "round %d: a store with a table open holds no lease\n", i);
                    _exit(1);
                }
                engram_store_close(st);
            }
            _exit(0);
        }
    }
    /* All of them first: the scratch root outlives every child. */
    for (int k = 0; k <= PROCS; k++) {
        int status;
        ASSERT(waitpid(kids[k], &status, 0) == kids[k]);
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    ASSERT_EQ(failed, 0);
    ASSERT_EQ(lease_files("crowd"), 0);
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "crowd", ENGRAM_NS_REMOVE_TABLES));
}

/* This process's start time in clock ticks (/proc/self/stat field 22). */
static unsigned long long my_start(void)
{
    char buf[1024], *p;
    unsigned long long v = 0;
    FILE *f = fopen("/proc/self/stat", "re");
    ASSERT(f != NULL);
    ASSERT(fgets(buf, sizeof buf, f) != NULL);
    fclose(f);
    p = strrchr(buf, ')');
    ASSERT(p != NULL);
    ASSERT(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                         "%*d %*d %llu", &v) == 1);
    return v;
}

/* In another PID namespace (a container sharing /dev/shm), a process may
 * have our pid and even our start tick: its live lease says "pid P start
 * S" with our P and S.  It is still another process's lease, and stops a
 * removal.  Here a child holds such a lease. */
static void test_lease_with_our_pid_is_not_ours(void)
{
    engram_namespace_use u;
    engram_store *st = tu_open("twin", 0, 1);
    unsigned long long start = my_start();
    pid_t me = getpid(), pid;
    int p[2];
    char c;
    tu_populate(st, "t", 10, 16, 8, 0);
    engram_store_close(st);
    ASSERT(pipe(p) == 0);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        char f[512], text[128];
        int fd;
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* not left behind if the test fails */
        tu_path(f, sizeof f, "twin/.lease.77.1");
        fd = open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        ASSERT(fd >= 0);
        ASSERT(flock(fd, LOCK_EX) == 0);
        snprintf(text, sizeof text, "pid %d start %llu command twin\n", (int)me, start);
        ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
        ASSERT(write(p[1], "x", 1) == 1);
        for (;;)
            pause();
    }
    close(p[1]);
    ASSERT(read(p[0], &c, 1) == 1);
    close(p[0]);
    usage_of("twin", &u);
    ASSERT_EQ(u.users, 1);
    ASSERT_ERR(engram_namespace_remove(tu_scratch_root(), "twin", ENGRAM_NS_REMOVE_TABLES),
               -EBUSY);
    ASSERT(ns_exists("twin/t") && ns_exists("twin/.lease.77.1"));
    kill_user(pid);
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "twin", ENGRAM_NS_REMOVE_TABLES));
}

/* A namespace whose last use is in the future (the clock was set back
 * since) is kept, and the report says so rather than "used 0 s ago". */
static void test_gc_last_use_in_the_future(void)
{
    struct report r = {""};
    engram_store_close(tu_open("ahead", 0, 1));
    age_ns("ahead", -86400);
    ASSERT_OK(engram_namespace_gc(tu_scratch_root(), 60, 0, record, &r));
    ASSERT_CONTAINS(r.text, "ahead:1:last used 86");
    ASSERT_CONTAINS(r.text, "s in the future");
    ASSERT(ns_exists("ahead"));
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "ahead", 0));
}

static void test_bad_inputs(void)
{
    engram_namespace_use u = ENGRAM_NAMESPACE_USE_INIT;
    char p[512];
    engram_store_close(tu_open("here", 0, 1));
    u.size = 8;
    ASSERT_ERR(engram_namespace_usage(tu_scratch_root(), "here", &u), -EINVAL);
    ASSERT_ERR(engram_namespace_usage(tu_scratch_root(), "here", NULL), -EINVAL);
    u.size = sizeof u;
    ASSERT_ERR(engram_namespace_usage(tu_scratch_root(), "missing", &u), -ENOENT);
    ASSERT_ERR(engram_namespace_usage(tu_scratch_root(), "../x", &u), ENGRAM_ESPEC);
    ASSERT_ERR(engram_namespace_gc(tu_scratch_root(), 0, 0x80, NULL, NULL), -EINVAL);
    tu_path(p, sizeof p, "no-such-root");
    ASSERT_ERR(engram_namespace_gc(p, 0, 0, NULL, NULL), -ENOENT);
    /* A lease file made by hand that is a link is not a lease. */
    {
        char l[512];
        engram_namespace_use v = ENGRAM_NAMESPACE_USE_INIT;
        tu_path(l, sizeof l, "here/.lease.1.1");
        ASSERT(symlink("/etc/passwd", l) == 0);
        ASSERT_OK(engram_namespace_usage(tu_scratch_root(), "here", &v));
        ASSERT_EQ(v.users + v.stale_leases, 0);
        unlink(l);
    }
    /* Nor is a FIFO: asking about it does not block on it, a store's
     * cleanup leaves it, and a removal stops on it as on any entry that
     * is not a table. */
    {
        char l[512];
        engram_namespace_use v = ENGRAM_NAMESPACE_USE_INIT;
        tu_path(l, sizeof l, "here/.lease.3.3");
        ASSERT(mkfifo(l, 0600) == 0);
        ASSERT_OK(engram_namespace_usage(tu_scratch_root(), "here", &v));
        ASSERT_EQ(v.users + v.stale_leases, 0);
        engram_store_close(tu_open("here", 0, 1));
        ASSERT_EQ(lease_files("here"), 1);
        ASSERT_ERR(engram_namespace_remove(tu_scratch_root(), "here", 0), -ENOTEMPTY);
        ASSERT_CONTAINS(engram_errmsg(), ".lease.3.3");
        unlink(l);
    }
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "here", 0));
}

int main(void)
{
    tu_watchdog(120);
    RUN_TEST(test_own_lease);
    RUN_TEST(test_other_process);
    RUN_TEST(test_stale_removed_by_open);
    RUN_TEST(test_gc_age_and_dry_run);
    RUN_TEST(test_gc_dry_run_touches_nothing);
    RUN_TEST(test_gc_keeps_what_it_may_not_remove);
    RUN_TEST(test_gc_stray_temps);
    RUN_TEST(test_gc_names_the_writer);
    RUN_TEST(test_lease_under_contention);
    RUN_TEST(test_lease_with_our_pid_is_not_ours);
    RUN_TEST(test_gc_last_use_in_the_future);
    RUN_TEST(test_bad_inputs);
    printf("test_lease: all passed\n");
    return 0;
}
