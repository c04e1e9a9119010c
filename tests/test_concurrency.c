/*
 * test_concurrency.c - processes and threads sharing a namespace or store.
 *
 * Covers the publication promises (of several concurrent writers of one
 * name exactly one wins, readers never see a partial table, a killed
 * writer leaves only a temporary file that the next open removes, a live
 * writer's temporary file is left alone), lookups from many threads at
 * once on a contended gather pool, concurrent table opens, and several
 * processes reading one table through shared mappings.
 *
 * Children are forked before the parent opens any store (a store owns
 * threads, which fork does not copy) and report through exit codes and
 * pipes; a failed assertion in a child exits 1 and its message is printed
 * by the child itself.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <sys/wait.h>

#include "testutil.h"

#define RB 264
#define SENTINEL_BYTE 0x77

/* Reads exactly n bytes or fails. */
static void read_full(int fd, void *buf, size_t n)
{
    unsigned char *p = (unsigned char *)buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            fprintf(stderr, "FAIL [%s]: short read from pipe (%zd): %s\n", tu_current_case, r,
                    strerror(errno));
            tu_fail_exit();
        }
        p += r;
        n -= (size_t)r;
    }
}

static void write_full(int fd, const void *buf, size_t n)
{
    const unsigned char *p = (const unsigned char *)buf;
    while (n > 0) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            fprintf(stderr, "FAIL [%s]: write to pipe: %s\n", tu_current_case, strerror(errno));
            tu_fail_exit();
        }
        p += r;
        n -= (size_t)r;
    }
}

/* Blocks until the other end of `fd` is closed (a barrier release). */
static void wait_eof(int fd)
{
    char c;
    for (;;) {
        ssize_t r = read(fd, &c, 1);
        if (r > 0 || (r < 0 && errno == EINTR))
            continue;
        break;
    }
}

/* Waits for `pid` and returns its exit status, failing on a signal. */
static int wait_exit(pid_t pid)
{
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "FAIL [%s]: waitpid: %s\n", tu_current_case, strerror(errno));
            tu_fail_exit();
        }
    }
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "FAIL [%s]: child %d killed by signal %d\n", tu_current_case, (int)pid,
                WTERMSIG(status));
        tu_fail_exit();
    }
    return WEXITSTATUS(status);
}

static pid_t xfork(void)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "FAIL [%s]: fork: %s\n", tu_current_case, strerror(errno));
        tu_fail_exit();
    }
    return pid;
}

static engram_store *open_existing(const char *ns, int threads)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    o.threads = threads;
    engram_store *st = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), ns, &o, &st));
    return st;
}

/* ------------------------------------------------------------------------
 * N processes populate one name at once.
 */
enum { NPROC = 6, RACE_ROWS = 3000 };

static void race_child(const char *name, int idx, int go_fd, int res_fd, int go2_fd)
{
    engram_store *st = open_existing("race", 1);
    engram_table_spec spec = {RACE_ROWS, RB, 0};
    unsigned char *rows = tu_make_rows(1000 + (uint32_t)idx, RACE_ROWS, RB, 0, 0);
    wait_eof(go_fd);
    int rc = engram_populate(st, name, &spec, rows, 0);
    unsigned char res = rc == 0 ? 0 : rc == -EEXIST ? 1 : 2;
    if (res == 2)
        fprintf(stderr, "child %d: populate %s: %d (%s): %s\n", idx, name, rc,
                engram_strerror(rc), engram_errmsg());
    write_full(res_fd, &res, 1);
    free(rows);
    wait_eof(go2_fd);

    /* Every child reads the winner's table in full. */
    engram_table_id tid;
    ASSERT_OK(engram_table_open(st, name, &tid));
    unsigned char row0[RB];
    int64_t zero = 0;
    ASSERT_OK(tu_lookup1(st, tid, &zero, 1, row0, 0));
    uint32_t winner = 0;
    for (int i = 0; i < NPROC; i++)
        if (tu_row_mismatch(row0, 1000 + (uint32_t)i, 0, RB) < 0)
            winner = 1000 + (uint32_t)i;
    ASSERT_NE(winner, 0);
    tu_check_named(st, name, winner, RACE_ROWS, RB);
    engram_store_close(st);
    exit(0);
}

static void test_populate_race_processes(void)
{
    engram_store *setup = tu_open("race", 0, 1);
    engram_store_close(setup);

    for (int round = 0; round < 3; round++) {
        char name[32];
        snprintf(name, sizeof name, "engram:l%d:h0", round);
        int go[2], res[2], go2[2];
        ASSERT_EQ(pipe(go), 0);
        ASSERT_EQ(pipe(res), 0);
        ASSERT_EQ(pipe(go2), 0);
        pid_t pids[NPROC];
        for (int i = 0; i < NPROC; i++) {
            pids[i] = xfork();
            if (pids[i] == 0) {
                close(go[1]);
                close(res[0]);
                close(go2[1]);
                race_child(name, i, go[0], res[1], go2[0]);
            }
        }
        close(go[0]);
        close(res[1]);
        close(go2[0]);
        /* Give every child time to open its store and reach the barrier,
         * then release them together. */
        usleep(100000);
        close(go[1]);
        int wins = 0, exists = 0;
        for (int i = 0; i < NPROC; i++) {
            unsigned char r;
            read_full(res[0], &r, 1);
            wins += r == 0;
            exists += r == 1;
        }
        close(res[0]);
        close(go2[1]);
        for (int i = 0; i < NPROC; i++)
            ASSERT_EQ(wait_exit(pids[i]), 0);
        printf("   round %d: %d winner, %d -EEXIST\n", round, wins, exists);
        ASSERT_EQ(wins, 1);
        ASSERT_EQ(exists, NPROC - 1);
    }

    /* No temporary files of the losers are left behind. */
    engram_store *st = open_existing("race", 1);
    char names[8][256];
    int n = tu_strays("race", st, names, 8);
    for (int i = 0; i < n && i < 8; i++)
        fprintf(stderr, "   stray: %s\n", names[i]);
    ASSERT_EQ(n, 0);
    char **list = NULL;
    size_t count = 0;
    ASSERT_OK(engram_list(st, &list, &count));
    ASSERT_EQ(count, 3);
    engram_free(list);
    engram_store_close(st);
}

/* ------------------------------------------------------------------------
 * Writers that die, and writers that are alive.
 */
static void live_writer_child(int ready_fd, int go_fd, int res_fd)
{
    engram_store *st = open_existing("kw", 1);
    engram_table_spec spec = {2000, RB, 0};
    unsigned char *rows = tu_make_rows(77, 2000, RB, 0, 0);
    engram_writer *w = NULL;
    ASSERT_OK(engram_writer_begin(st, "live", &spec, &w));
    ASSERT_OK(engram_writer_append(w, rows, 1000, 0));
    unsigned char b = 1;
    write_full(ready_fd, &b, 1);
    wait_eof(go_fd);
    int rc = engram_writer_append(w, rows + 1000 * RB, 1000, 0);
    if (rc == 0)
        rc = engram_writer_commit(w);
    else
        engram_writer_abort(w);
    if (rc != 0)
        fprintf(stderr, "live writer: %d (%s): %s\n", rc, engram_strerror(rc), engram_errmsg());
    b = rc == 0 ? 0 : 1;
    write_full(res_fd, &b, 1);
    free(rows);
    engram_store_close(st);
    exit(0);
}

static void doomed_writer_child(int ready_fd)
{
    engram_store *st = open_existing("kw", 1);
    engram_table_spec spec = {2000, RB, 0};
    unsigned char *rows = tu_make_rows(78, 2000, RB, 0, 0);
    engram_writer *w = NULL;
    ASSERT_OK(engram_writer_begin(st, "dead", &spec, &w));
    ASSERT_OK(engram_writer_append(w, rows, 700, 0));
    unsigned char b = 1;
    write_full(ready_fd, &b, 1);
    for (;;)
        pause();
}

static void test_killed_and_live_writers(void)
{
    engram_store *setup = tu_open("kw", 0, 1);
    tu_populate(setup, "existing", 5, 10, RB, 0);
    engram_store_close(setup);

    /* A live writer in another process. */
    int ready[2], go[2], res[2];
    ASSERT_EQ(pipe(ready), 0);
    ASSERT_EQ(pipe(go), 0);
    ASSERT_EQ(pipe(res), 0);
    pid_t live = xfork();
    if (live == 0) {
        close(ready[0]);
        close(go[1]);
        close(res[0]);
        live_writer_child(ready[1], go[0], res[1]);
    }
    close(ready[1]);
    close(go[0]);
    close(res[1]);
    unsigned char b;
    read_full(ready[0], &b, 1);

    /* Its table is invisible while it writes, and its temporary file is
     * there. */
    engram_store *st = open_existing("kw", 1);
    char before[8][256], after[8][256];
    int nb = tu_strays("kw", st, before, 8);
    ASSERT_EQ(nb, 1);
    engram_table_id tid;
    ASSERT_ERR(engram_table_open(st, "live", &tid), -ENOENT);
    char **list = NULL;
    size_t count = 0;
    ASSERT_OK(engram_list(st, &list, &count));
    ASSERT_EQ(count, 1);
    ASSERT_STR_EQ(list[0], "existing");
    engram_free(list);

    /* Opening the namespace again (which cleans stale temps) must leave
     * the live writer's file alone. */
    engram_store *st2 = open_existing("kw", 1);
    int na = tu_strays("kw", st2, after, 8);
    ASSERT_EQ(na, 1);
    ASSERT_STR_EQ(after[0], before[0]);
    engram_store_close(st2);

    /* The writer finishes and publishes. */
    close(go[1]);
    read_full(res[0], &b, 1);
    ASSERT_EQ(b, 0);
    ASSERT_EQ(wait_exit(live), 0);
    close(ready[0]);
    close(res[0]);
    tu_check_named(st, "live", 77, 2000, RB);
    ASSERT_EQ(tu_strays("kw", st, after, 8), 0);
    engram_store_close(st);

    /* A writer killed mid-way. */
    ASSERT_EQ(pipe(ready), 0);
    pid_t doomed = xfork();
    if (doomed == 0) {
        close(ready[0]);
        doomed_writer_child(ready[1]);
    }
    close(ready[1]);
    read_full(ready[0], &b, 1);
    close(ready[0]);
    ASSERT_EQ(kill(doomed, SIGKILL), 0);
    int status;
    ASSERT_EQ(waitpid(doomed, &status, 0), doomed);
    ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    /* Its temp file is still there until somebody opens the namespace; the
     * table is not visible in any case. */
    st = NULL;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "kw", &o, &st));
    ASSERT_ERR(engram_table_open(st, "dead", &tid), -ENOENT);
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    ASSERT_ERR(engram_get_table_info(st, "dead", &info), -ENOENT);
    ASSERT_OK(engram_list(st, &list, &count));
    ASSERT_EQ(count, 2);
    ASSERT_STR_EQ(list[0], "existing");
    ASSERT_STR_EQ(list[1], "live");
    engram_free(list);
    /* The open above removed the stale temp file. */
    int n = tu_strays("kw", st, after, 8);
    for (int i = 0; i < n && i < 8; i++)
        fprintf(stderr, "   stray after reopen: %s\n", after[i]);
    ASSERT_EQ(n, 0);
    /* The name is free for a new writer. */
    engram_table_spec spec = {2000, RB, 0};
    unsigned char *rows = tu_make_rows(79, 2000, RB, 0, 0);
    ASSERT_OK(engram_populate(st, "dead", &spec, rows, 0));
    free(rows);
    tu_check_named(st, "dead", 79, 2000, RB);
    tu_check_named(st, "existing", 5, 10, RB);
    engram_store_close(st);
}

/* ------------------------------------------------------------------------
 * Threads.
 */
enum { NTHREADS = 4, LOOKUPS_PER_THREAD = 250, NT = 4 };

typedef struct thr_ctx {
    engram_store *st;
    engram_table_id tids[NT];
    uint32_t seeds[NT];
    uint64_t nrows[NT];
    int index;
    uint64_t rows_copied, dead;
} thr_ctx;

static void *lookup_thread(void *arg)
{
    thr_ctx *c = (thr_ctx *)arg;
    uint64_t rng = 0xABCDEF + (uint64_t)c->index;
    enum { K = 4, TMAX = 1500 };
    int64_t *ids = (int64_t *)tu_xmalloc(TMAX * K * sizeof *ids);
    unsigned char *out = (unsigned char *)tu_xmalloc((size_t)TMAX * K * RB);
    for (int it = 0; it < LOOKUPS_PER_THREAD; it++) {
        size_t T = 1 + (size_t)tu_rand_below(&rng, it % 10 == 0 ? TMAX : 100);
        engram_table_id tids[K];
        size_t which[K];
        for (int k = 0; k < K; k++) {
            which[k] = (size_t)tu_rand_below(&rng, NT);
            tids[k] = c->tids[which[k]];
        }
        for (size_t t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                ids[t * K + (size_t)k] = tu_rand_below(&rng, 20) == 0
                                             ? -1
                                             : (int64_t)tu_rand_below(&rng, c->nrows[which[k]]);
        memset(out, SENTINEL_BYTE, T * K * RB);
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        a.num_tokens = T;
        a.num_cols = K;
        a.tables = tids;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        ASSERT_OK(engram_lookup(c->st, &a));
        for (size_t t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                int64_t id = ids[t * K + (size_t)k];
                unsigned char *row = out + (t * K + (size_t)k) * RB;
                if (id < 0) {
                    ASSERT_ALL_BYTES(row, SENTINEL_BYTE, RB);
                    c->dead++;
                } else {
                    ASSERT_ROW(row, c->seeds[which[k]], (uint64_t)id, RB);
                    c->rows_copied++;
                }
            }
    }
    free(ids);
    free(out);
    return NULL;
}

static void test_threads_lookup(void)
{
    engram_store *w = tu_open("thr", 0, 1);
    tu_populate(w, "t0", 500, 5000, RB, 0);
    tu_populate(w, "t1", 501, 77, RB, 0);
    tu_populate(w, "t2", 502, 1000, RB, 272);
    engram_store_close(w);

    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    o.threads = 2;
    o.parallel_min_rows = 64;
    engram_store *st = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "thr", &o, &st));
    unsigned char *bound = tu_make_rows(503, 300, RB, 0, 0);
    engram_table_spec bspec = {300, RB, 0};
    ASSERT_OK(engram_bind(st, "b3", &bspec, bound));

    thr_ctx ctx[NTHREADS];
    const char *names[NT] = {"t0", "t1", "t2", "b3"};
    uint32_t seeds[NT] = {500, 501, 502, 503};
    uint64_t nrows[NT] = {5000, 77, 1000, 300};
    engram_table_id tids[NT];
    for (int i = 0; i < NT; i++)
        ASSERT_OK(engram_table_open(st, names[i], &tids[i]));
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        memset(&ctx[i], 0, sizeof ctx[i]);
        ctx[i].st = st;
        ctx[i].index = i;
        memcpy(ctx[i].tids, tids, sizeof tids);
        memcpy(ctx[i].seeds, seeds, sizeof seeds);
        memcpy(ctx[i].nrows, nrows, sizeof nrows);
        ASSERT_EQ(pthread_create(&th[i], NULL, lookup_thread, &ctx[i]), 0);
    }
    uint64_t rows = 0, dead = 0;
    for (int i = 0; i < NTHREADS; i++) {
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
        rows += ctx[i].rows_copied;
        dead += ctx[i].dead;
    }
    engram_stats s = ENGRAM_STATS_INIT;
    ASSERT_OK(engram_store_stats(st, &s));
    printf("   %llu lookups, %llu split across threads\n", (unsigned long long)s.lookups,
           (unsigned long long)s.parallel);
    ASSERT_EQ_U64(s.lookups, (uint64_t)NTHREADS * LOOKUPS_PER_THREAD);
    ASSERT_EQ_U64(s.failed, 0);
    ASSERT_EQ_U64(s.rows, rows);
    ASSERT_EQ_U64(s.dead_rows, dead);
    ASSERT_EQ_U64(s.bytes, rows * RB);
    ASSERT_EQ(s.threads, 2);
    engram_store_close(st);
    free(bound);
}

/* Several threads open the same names at once and must agree on ids;
 * several threads populate one name at once and exactly one wins. */
typedef struct open_ctx {
    engram_store *st;
    engram_table_id ids[5];
    int populate_rc;
    int index;
    pthread_barrier_t *bar;
} open_ctx;

static void *open_thread(void *arg)
{
    open_ctx *c = (open_ctx *)arg;
    static const char *const names[5] = {"o0", "o1", "o2", "o3", "o4"};
    pthread_barrier_wait(c->bar);
    /* Each thread opens the names in a different order, all at once. */
    for (int i = 0; i < 5; i++) {
        int j = (i + c->index) % 5;
        ASSERT_OK(engram_table_open(c->st, names[j], &c->ids[j]));
    }
    /* Opening again gives the same ids. */
    for (int i = 0; i < 5; i++) {
        engram_table_id again;
        ASSERT_OK(engram_table_open(c->st, names[i], &again));
        ASSERT_EQ(again, c->ids[i]);
    }
    engram_table_spec spec = {500, RB, 0};
    unsigned char *rows = tu_make_rows(600, 500, RB, 0, 0);
    pthread_barrier_wait(c->bar);
    c->populate_rc = engram_populate(c->st, "same", &spec, rows, 0);
    free(rows);
    return NULL;
}

static void test_threads_open_populate(void)
{
    engram_store *st = tu_open("topen", 0, 2);
    for (int i = 0; i < 5; i++) {
        char name[8];
        snprintf(name, sizeof name, "o%d", i);
        tu_populate(st, name, 700 + (uint32_t)i, 100, RB, 0);
    }
    engram_store_close(st);
    st = open_existing("topen", 2);

    pthread_barrier_t bar;
    ASSERT_EQ(pthread_barrier_init(&bar, NULL, NTHREADS), 0);
    open_ctx ctx[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        memset(&ctx[i], 0, sizeof ctx[i]);
        ctx[i].st = st;
        ctx[i].index = i;
        ctx[i].bar = &bar;
        ASSERT_EQ(pthread_create(&th[i], NULL, open_thread, &ctx[i]), 0);
    }
    int wins = 0, exists = 0;
    for (int i = 0; i < NTHREADS; i++) {
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
        for (int j = 0; j < 5; j++)
            ASSERT_EQ(ctx[i].ids[j], ctx[0].ids[j]);
        if (ctx[i].populate_rc == 0)
            wins++;
        else if (ctx[i].populate_rc == -EEXIST)
            exists++;
        else
            fprintf(stderr, "   populate in thread %d: %d (%s)\n", i, ctx[i].populate_rc,
                    engram_strerror(ctx[i].populate_rc));
    }
    pthread_barrier_destroy(&bar);
    ASSERT_EQ(wins, 1);
    ASSERT_EQ(exists, NTHREADS - 1);
    for (int j = 0; j < 5; j++) {
        char name[8];
        snprintf(name, sizeof name, "o%d", j);
        for (int k = 0; k < j; k++)
            ASSERT_NE(ctx[0].ids[j], ctx[0].ids[k]);
        tu_check_named(st, name, 700 + (uint32_t)j, 100, RB);
    }
    tu_check_named(st, "same", 600, 500, RB);
    char names[8][256];
    ASSERT_EQ(tu_strays("topen", st, names, 8), 0);
    engram_store_close(st);
}

/* ------------------------------------------------------------------------
 * Two processes, one table.
 */
enum { SHARE_ROWS = 4096, SHARE_T = 512 };

/* Checks that /proc/self/maps has a shared read-only mapping of the
 * namespace's file `name` (the design: every process maps the one file
 * MAP_SHARED, so they share physical pages). */
static int mapped_shared(const char *ns, const char *name)
{
    char want[600];
    snprintf(want, sizeof want, "%s/%s/%s", tu_scratch_root(), ns, name);
    FILE *f = fopen("/proc/self/maps", "r");
    ASSERT(f != NULL);
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        char *path = strchr(line, '/');
        if (path == NULL)
            continue;
        path[strcspn(path, "\n")] = '\0';
        if (strcmp(path, want) != 0)
            continue;
        char perms[8] = "";
        if (sscanf(line, "%*s %7s", perms) == 1 && perms[0] == 'r' && perms[1] == '-' &&
            perms[3] == 's')
            found = 1;
    }
    fclose(f);
    return found;
}

static void share_lookup(engram_store *st, unsigned char *out)
{
    engram_table_id tid;
    ASSERT_OK(engram_table_open(st, "t", &tid));
    int64_t ids[SHARE_T];
    for (int i = 0; i < SHARE_T; i++)
        ids[i] = (int64_t)(((uint64_t)i * 2654435761u) % SHARE_ROWS);
    ASSERT_OK(tu_lookup1(st, tid, ids, SHARE_T, out, 0));
}

static void test_two_processes(void)
{
    engram_store *w = tu_open("share", 0, 1);
    tu_populate(w, "t", 800, SHARE_ROWS, RB, 0);
    engram_store_close(w);

    int data[2], go[2];
    ASSERT_EQ(pipe(data), 0);
    ASSERT_EQ(pipe(go), 0);
    pid_t pid = xfork();
    if (pid == 0) {
        close(data[0]);
        close(go[1]);
        engram_store *st = open_existing("share", 1);
        unsigned char *out = (unsigned char *)tu_xmalloc((size_t)SHARE_T * RB);
        share_lookup(st, out);
        unsigned char shared = (unsigned char)mapped_shared("share", "t");
        write_full(data[1], &shared, 1);
        write_full(data[1], out, (size_t)SHARE_T * RB);
        /* The parent now removes the table; this process keeps reading
         * its mapping. */
        wait_eof(go[0]);
        unsigned char *again = (unsigned char *)tu_xmalloc((size_t)SHARE_T * RB);
        share_lookup(st, again);
        ASSERT_MEM_EQ(again, out, (size_t)SHARE_T * RB);
        write_full(data[1], again, (size_t)SHARE_T * RB);
        engram_store_close(st);
        exit(0);
    }
    close(data[1]);
    close(go[0]);
    engram_store *st = open_existing("share", 1);
    unsigned char *mine = (unsigned char *)tu_xmalloc((size_t)SHARE_T * RB);
    unsigned char *theirs = (unsigned char *)tu_xmalloc((size_t)SHARE_T * RB);
    share_lookup(st, mine);
    for (int i = 0; i < SHARE_T; i++)
        ASSERT_ROW(mine + (size_t)i * RB, 800, ((uint64_t)i * 2654435761u) % SHARE_ROWS, RB);
    unsigned char child_shared;
    read_full(data[0], &child_shared, 1);
    read_full(data[0], theirs, (size_t)SHARE_T * RB);
    ASSERT_MEM_EQ(theirs, mine, (size_t)SHARE_T * RB);
    ASSERT_EQ(mapped_shared("share", "t"), 1);
    ASSERT_EQ(child_shared, 1);

    /* Remove while the child has it mapped. */
    ASSERT_OK(engram_remove(st, "t"));
    close(go[1]);
    read_full(data[0], theirs, (size_t)SHARE_T * RB);
    ASSERT_MEM_EQ(theirs, mine, (size_t)SHARE_T * RB);
    ASSERT_EQ(wait_exit(pid), 0);
    close(data[0]);
    engram_store_close(st);
    free(mine);
    free(theirs);
}

/* ------------------------------------------------------------------------
 * Somebody else holds flock() on the namespace directory.
 */

/* Anyone who can merely read the namespace directory (a member of a group
 * namespace's group) can flock() it and keep the lock.  Opening the store,
 * writing and reading tables must go on without waiting for it; only the
 * removal of stale temporary files is put off to a later open, which does
 * it once the lock is gone. */
static void test_locked_namespace(void)
{
    char dirp[512], stale[600];
    int ready[2], go[2];
    unsigned char b;
    engram_store *st = tu_open("lockedns", 0, 1);
    tu_populate(st, "t", 31, 100, RB, 0);
    engram_store_close(st);
    tu_path(dirp, sizeof dirp, "lockedns");
    snprintf(stale, sizeof stale, "%s/.tmp.dead.1.1", dirp); /* a dead writer's */
    int fd = open(stale, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT(fd >= 0);
    close(fd);
    if (geteuid() == 0) {
        /* The lock holder is another user, who can only read. */
        ASSERT_EQ(chmod(tu_scratch_root(), 0711), 0);
        ASSERT_EQ(chmod(dirp, 0755), 0);
    }

    ASSERT_EQ(pipe(ready), 0);
    ASSERT_EQ(pipe(go), 0);
    pid_t pid = xfork();
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        if (geteuid() == 0 && (setgid(12345) != 0 || setuid(12345) != 0))
            _exit(2);
        int d = open(dirp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d < 0 || flock(d, LOCK_EX) != 0) {
            perror("lock holder");
            _exit(3);
        }
        write_full(ready[1], "x", 1);
        wait_eof(go[0]);
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    read_full(ready[0], &b, 1);
    close(ready[0]);

    /* A hang fails here, within seconds, not at the global watchdog. */
    unsigned left = alarm(30);
    st = open_existing("lockedns", 1);
    tu_check_named(st, "t", 31, 100, RB);
    tu_populate(st, "u", 32, 100, RB, 0);
    tu_check_named(st, "u", 32, 100, RB);
    ASSERT_EQ(access(stale, F_OK), 0); /* the cleanup was put off */
    engram_store_close(st);

    /* The lock gone, the next open removes the dead writer's file. */
    close(go[1]);
    ASSERT_EQ(wait_exit(pid), 0);
    st = open_existing("lockedns", 1);
    ASSERT(access(stale, F_OK) != 0 && errno == ENOENT);
    ASSERT_EQ(tu_strays("lockedns", st, NULL, 0), 0);
    tu_check_named(st, "u", 32, 100, RB);
    engram_store_close(st);
    alarm(left);
    if (geteuid() == 0)
        ASSERT_EQ(chmod(tu_scratch_root(), 0700), 0);
}

int main(void)
{
    tu_watchdog(240);
    (void)tu_scratch_root(); /* created before any fork */
    RUN_TEST(test_populate_race_processes);
    RUN_TEST(test_killed_and_live_writers);
    RUN_TEST(test_threads_lookup);
    RUN_TEST(test_threads_open_populate);
    RUN_TEST(test_two_processes);
    RUN_TEST(test_locked_namespace);
    printf("test_concurrency: all passed\n");
    return 0;
}
