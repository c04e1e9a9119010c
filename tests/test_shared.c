/*
 * test_shared.c - ranks that share tables without a leader:
 * engram_populate_shared() and engram_table_open_wait().
 *
 *  - 8 processes started on their own (this binary run again through
 *    posix_spawn, each in its own process group, no shared state but the
 *    directory) wait for a "go" table, then all populate the same 4
 *    tables: each table is written by exactly one of them and reused by
 *    the 7 others, and all wait for a table the parent publishes last;
 *  - a published table with another spec or other rows: ENGRAM_EMISMATCH;
 *  - a writer that dies mid-table: a process waiting on it writes the
 *    table itself;
 *  - a writer that hangs (stopped): its waiters give up at their
 *    deadline, naming its pid and how long it has held the name;
 *  - waits: the timeout, no wait, a publication by another process waking
 *    the waiter, the namespace removed under it.
 */
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>

#include "testutil.h"

#define NPROC 8
#define NTAB 4
#define ROWS 20000
#define RB 264

extern char **environ;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static engram_store *open_ns(const char *root, const char *ns)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    o.flags = ENGRAM_OPEN_CREATE;
    o.threads = 1;
    ASSERT_OK(engram_store_open(root, ns, &o, &st));
    return st;
}

/* One rank (a process of its own): waits for "go", populates every table,
 * waits for "late", checks everything, and prints which tables it wrote
 * as a bit mask. */
static int rank_main(const char *root, const char *ns)
{
    engram_store *st = open_ns(root, ns);
    engram_table_id id;
    unsigned mask = 0;
    unsigned char *rows[NTAB];
    tu_current_case = "rank";
    ASSERT_OK(engram_table_open_wait(st, "go", 30000, &id));
    for (int t = 0; t < NTAB; t++) {
        engram_table_spec spec = {ROWS, RB, 0};
        char name[16];
        int written = -1;
        rows[t] = tu_make_rows(10 + (uint32_t)t, ROWS, RB, RB, 0);
        snprintf(name, sizeof name, "t%d", t);
        ASSERT_OK(engram_populate_shared(st, name, &spec, rows[t], 0, &written));
        ASSERT(written == 0 || written == 1);
        mask |= (unsigned)written << t;
    }
    ASSERT_OK(engram_table_open_wait(st, "late", 30000, &id));
    tu_check_table(st, id, 99, 100, RB);
    for (int t = 0; t < NTAB; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        tu_check_named(st, name, 10 + (uint32_t)t, ROWS, RB);
        free(rows[t]);
    }
    engram_store_close(st);
    printf("%u\n", mask);
    return 0;
}

static void test_ranks(const char *self)
{
    pid_t pids[NPROC];
    int pipes[NPROC][2], writers[NTAB] = {0};
    engram_store *st;
    tu_current_case = "8 independent processes share 4 tables";
    st = tu_open("ranks", 0, 1);
    for (int i = 0; i < NPROC; i++) {
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t at;
        char prog[512], rank[] = "rank", root[512], ns[] = "ranks";
        char *argv[] = {prog, rank, root, ns, NULL};
        snprintf(prog, sizeof prog, "%s", self);
        snprintf(root, sizeof root, "%s", tu_scratch_root());
        ASSERT_EQ(pipe(pipes[i]), 0);
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, pipes[i][1], 1);
        posix_spawn_file_actions_addclose(&fa, pipes[i][0]);
        posix_spawnattr_init(&at);
        /* Each in a process group of its own: nothing in common but the
         * directory. */
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&at, 0);
        ASSERT_EQ(posix_spawn(&pids[i], self, &fa, &at, argv, environ), 0);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&at);
        close(pipes[i][1]);
    }
    /* They all wait on "go", then race on the tables. */
    usleep(200000);
    tu_populate(st, "go", 1, 1, 8, 0);
    usleep(200000);
    tu_populate(st, "late", 99, 100, RB, 0);
    for (int i = 0; i < NPROC; i++) {
        char buf[32] = "";
        int status;
        ssize_t n = read(pipes[i][0], buf, sizeof buf - 1);
        close(pipes[i][0]);
        ASSERT_EQ(waitpid(pids[i], &status, 0), pids[i]);
        ASSERT(WIFEXITED(status));
        ASSERT_EQ(WEXITSTATUS(status), 0);
        ASSERT(n > 0);
        for (int t = 0; t < NTAB; t++)
            writers[t] += (atoi(buf) >> t) & 1;
    }
    /* Exactly one writer per table, whoever it was. */
    for (int t = 0; t < NTAB; t++)
        ASSERT_EQ(writers[t], 1);
    {
        char names[8][256];
        ASSERT_EQ(tu_strays("ranks", st, names, 8), 0); /* no temp file left */
    }
    engram_store_close(st);
}

static void test_mismatch(void)
{
    engram_store *st = tu_open("mismatch", 0, 1);
    engram_table_spec spec = {100, RB, 0}, other = {101, RB, 0}, pitched = {100, RB, 272};
    unsigned char *rows = tu_make_rows(5, 101, RB, RB, 0);
    int written = -1;
    tu_current_case = "published with another spec or other rows";
    ASSERT_OK(engram_populate_shared(st, "t", &spec, rows, 0, &written));
    ASSERT_EQ(written, 1);
    ASSERT_OK(engram_populate_shared(st, "t", &spec, rows, 0, &written));
    ASSERT_EQ(written, 0);
    ASSERT_OK(engram_populate_shared(st, "t", &spec, rows, 0, NULL));
    ASSERT_ERR(engram_populate_shared(st, "t", &other, rows, 0, &written), ENGRAM_EMISMATCH);
    ASSERT_CONTAINS(engram_errmsg(), "num_rows=100");
    ASSERT_ERR(engram_populate_shared(st, "t", &pitched, rows, 0, &written), ENGRAM_EMISMATCH);
    ASSERT_CONTAINS(engram_errmsg(), "row_pitch=272");
    rows[7] ^= 1;
    ASSERT_ERR(engram_populate_shared(st, "t", &spec, rows, 0, &written), ENGRAM_EMISMATCH);
    ASSERT_CONTAINS(engram_errmsg(), "other rows");
    ASSERT_EQ(written, 0);
    rows[7] ^= 1;
    /* A pitched table, rows given with a stride: the same checksum as the
     * file's. */
    {
        unsigned char *wide = tu_make_rows(5, 101, RB, 300, 0xEE);
        ASSERT_OK(engram_populate_shared(st, "p", &pitched, wide, 300, &written));
        ASSERT_EQ(written, 1);
        ASSERT_OK(engram_populate_shared(st, "p", &pitched, wide, 300, &written));
        ASSERT_EQ(written, 0);
        free(wide);
    }
    /* Bad arguments. */
    ASSERT_ERR(engram_populate_shared(NULL, "t", &spec, rows, 0, NULL), -EINVAL);
    ASSERT_ERR(engram_populate_shared(st, "t", NULL, rows, 0, NULL), -EINVAL);
    ASSERT_ERR(engram_populate_shared(st, "t", &spec, NULL, 0, NULL), -EINVAL);
    ASSERT_ERR(engram_populate_shared(st, "../t", &spec, rows, 0, NULL), ENGRAM_ESPEC);
    ASSERT_ERR(engram_populate_shared(st, "t", &spec, rows, 8, NULL), -EINVAL);
    {
        engram_table_spec bad = {0, RB, 0};
        ASSERT_ERR(engram_populate_shared(st, "t", &bad, rows, 0, NULL), ENGRAM_ESPEC);
    }
    free(rows);
    engram_store_close(st);
    {
        engram_store *mem;
        ASSERT_OK(engram_store_open_memory(NULL, &mem));
        rows = tu_make_rows(5, 100, RB, RB, 0);
        ASSERT_ERR(engram_populate_shared(mem, "t", &spec, rows, 0, NULL), ENGRAM_ESTATE);
        ASSERT_OK(engram_bind(mem, "b", &spec, rows));
        engram_store_close(mem);
        free(rows);
    }
}

typedef struct bg {
    engram_store *st;
    const char *name;
    int timeout_ms;
    int rc, written;
    double took;
    atomic_int done;
    unsigned char *rows;
} bg;

static void *bg_populate(void *arg)
{
    bg *b = arg;
    engram_table_spec spec = {ROWS, RB, 0};
    b->rc = engram_populate_shared(b->st, b->name, &spec, b->rows, 0, &b->written);
    atomic_store(&b->done, 1);
    return NULL;
}

static void *bg_wait(void *arg)
{
    bg *b = arg;
    engram_table_id id;
    double t0 = now_s();
    b->rc = engram_table_open_wait(b->st, b->name, b->timeout_ms, &id);
    b->took = now_s() - t0;
    atomic_store(&b->done, 1);
    return NULL;
}

static void test_dead_writer(void)
{
    engram_store *st = tu_open("dead", 0, 1);
    int go[2], ready[2];
    pthread_t th;
    bg b;
    pid_t pid;
    char c;
    tu_current_case = "a writer that dies mid-table is replaced by a waiting process";
    ASSERT_EQ(pipe(go), 0);
    ASSERT_EQ(pipe(ready), 0);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        /* Half a table, then wait to be killed. */
        engram_store *cs = open_ns(tu_scratch_root(), "dead");
        engram_table_spec spec = {ROWS, RB, 0};
        engram_writer *w;
        unsigned char *rows = tu_make_rows(3, ROWS, RB, RB, 0);
        ASSERT_OK(engram_writer_begin(cs, "t", &spec, &w));
        ASSERT_OK(engram_writer_append(w, rows, ROWS / 2, 0));
        ASSERT_EQ(write(ready[1], "r", 1), 1);
        (void)read(go[0], &c, 1);
        _exit(0);
    }
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    memset(&b, 0, sizeof b);
    b.st = st;
    b.name = "t";
    b.rows = tu_make_rows(3, ROWS, RB, RB, 0);
    ASSERT_EQ(pthread_create(&th, NULL, bg_populate, &b), 0);
    usleep(300000);
    ASSERT_EQ(atomic_load(&b.done), 0); /* waiting on the live writer */
    kill(pid, SIGKILL);
    ASSERT_EQ(waitpid(pid, NULL, 0), pid);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_OK(b.rc);
    ASSERT_EQ(b.written, 1);
    tu_check_named(st, "t", 3, ROWS, RB);
    free(b.rows);
    close(go[0]);
    close(go[1]);
    close(ready[0]);
    close(ready[1]);
    engram_store_close(st);
}

/* A writer that hangs (here: stopped with SIGSTOP, holding its lock until
 * it is killed) does not block its waiters for ever: they give up at
 * their deadline with -ETIMEDOUT naming its pid and how long it has held
 * the name, and once it is killed the next call writes the table. */
static void test_hung_writer(void)
{
    engram_store *st = tu_open("hung", 0, 1);
    engram_table_spec spec = {ROWS, RB, 0};
    unsigned char *rows = tu_make_rows(4, ROWS, RB, RB, 0);
    engram_table_id id;
    char want[64], ent[64];
    int ready[2], written = -1, status;
    double t0;
    pid_t parent = getpid(), pid;
    char c;
    tu_current_case = "a writer that hangs: waiters give up at their deadline, naming it";
    ASSERT_EQ(pipe(ready), 0);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        engram_store *cs;
        engram_writer *w;
        /* Killed with the test, however the test ends. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        cs = open_ns(tu_scratch_root(), "hung");
        ASSERT_OK(engram_writer_begin(cs, "h", &spec, &w));
        ASSERT_OK(engram_writer_append(w, rows, ROWS / 2, 0));
        ASSERT_EQ(write(ready[1], "r", 1), 1);
        /* Hangs, alive, with the name held, until the test kills it. */
        for (;;)
            raise(SIGSTOP);
    }
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    snprintf(want, sizeof want, "by pid %d, which has held it for ", (int)pid);
    snprintf(ent, sizeof ent, "temporary file .tmp.h.%d.", (int)pid);

    t0 = now_s();
    ASSERT_ERR(engram_populate_shared_wait(st, "h", &spec, rows, 0, 200, &written), -ETIMEDOUT);
    ASSERT(now_s() - t0 >= 0.19); /* a deadline never comes early */
    ASSERT_EQ(written, 0);
    ASSERT_CONTAINS(engram_errmsg(), "table 'h' is still being written");
    ASSERT_CONTAINS(engram_errmsg(), want);
    ASSERT_CONTAINS(engram_errmsg(), " s now");
    ASSERT_CONTAINS(engram_errmsg(), ent);
    ASSERT_CONTAINS(engram_errmsg(), "after 200 ms");
    /* No wait: at once. */
    ASSERT_ERR(engram_populate_shared_wait(st, "h", &spec, rows, 0, 0, &written), -ETIMEDOUT);
    ASSERT_CONTAINS(engram_errmsg(), want);
    /* A waiter for the publication says who holds the name too. */
    ASSERT_ERR(engram_table_open_wait(st, "h", 100, &id), -ETIMEDOUT);
    ASSERT_CONTAINS(engram_errmsg(), "within 100 ms: it is being written");
    ASSERT_CONTAINS(engram_errmsg(), want);
    /* Nothing was published or left behind by the waiters. */
    ASSERT_ERR(engram_table_open(st, "h", &id), -ENOENT);

    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ASSERT_OK(engram_populate_shared_wait(st, "h", &spec, rows, 0, 200, &written));
    ASSERT_EQ(written, 1);
    tu_check_named(st, "h", 4, ROWS, RB);
    free(rows);
    close(ready[0]);
    close(ready[1]);
    engram_store_close(st);
}

static void test_waits(void)
{
    engram_store *st = tu_open("waits", 0, 1);
    engram_table_id id;
    pthread_t th;
    bg b;
    double t0;
    pid_t pid;
    tu_current_case = "engram_table_open_wait: timeout, no wait, wake-up";
    t0 = now_s();
    ASSERT_ERR(engram_table_open_wait(st, "never", 150, &id), -ETIMEDOUT);
    ASSERT(now_s() - t0 >= 0.14);
    ASSERT_CONTAINS(engram_errmsg(), "was not published");
    ASSERT_CONTAINS(engram_errmsg(), "within 150 ms");
    ASSERT_ERR(engram_table_open_wait(st, "never", 0, &id), -ENOENT);
    ASSERT_ERR(engram_table_open_wait(NULL, "never", 10, &id), -EINVAL);
    ASSERT_ERR(engram_table_open_wait(st, "../x", 10, &id), ENGRAM_ESPEC);
    tu_populate(st, "here", 4, 10, RB, 0);
    ASSERT_OK(engram_table_open_wait(st, "here", 0, &id));
    tu_check_table(st, id, 4, 10, RB);

    /* Another process publishes while this one waits (no time limit). */
    memset(&b, 0, sizeof b);
    b.st = st;
    b.name = "soon";
    b.timeout_ms = -1;
    ASSERT_EQ(pthread_create(&th, NULL, bg_wait, &b), 0);
    usleep(100000);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        engram_store *cs = open_ns(tu_scratch_root(), "waits");
        usleep(100000);
        tu_populate(cs, "soon", 6, 10, RB, 0);
        _exit(0);
    }
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_EQ(waitpid(pid, NULL, 0), pid);
    ASSERT_OK(b.rc);
    ASSERT(b.took < 10.0);
    tu_check_named(st, "soon", 6, 10, RB);

    /* A memory store does not wait. */
    {
        engram_store *mem;
        ASSERT_OK(engram_store_open_memory(NULL, &mem));
        t0 = now_s();
        ASSERT_ERR(engram_table_open_wait(mem, "x", 5000, &id), -ENOENT);
        ASSERT(now_s() - t0 < 1.0);
        engram_store_close(mem);
    }
    engram_store_close(st);

    tu_current_case = "engram_table_open_wait: the namespace removed while waiting";
    st = tu_open("gone", 0, 1);
    memset(&b, 0, sizeof b);
    b.st = st;
    b.name = "t";
    b.timeout_ms = 20000;
    ASSERT_EQ(pthread_create(&th, NULL, bg_wait, &b), 0);
    usleep(100000);
    /* The waiting store holds a lease on the namespace (this process's:
     * no obstacle to the removal). */
    ASSERT_OK(engram_namespace_remove(tu_scratch_root(), "gone", 0));
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_EQ(b.rc, -ENOENT);
    ASSERT(b.took < 10.0);
    engram_store_close(st);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "rank") == 0)
        return rank_main(argv[2], argv[3]);
    tu_watchdog(240);
    RUN_TEST(test_mismatch);
    RUN_TEST(test_waits);
    RUN_TEST(test_dead_writer);
    RUN_TEST(test_hung_writer);
    test_ranks(argv[0][0] == '/' ? argv[0] : "/proc/self/exe");
    printf("test_shared: ok\n");
    return 0;
}
