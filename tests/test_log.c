/*
 * test_log.c - the log sink of engram_set_log() through the public API:
 * the cache stats line a store asks for reaches the caller's function (and
 * not stderr), levels filter, ENGRAM_LOG_OFF silences even the asked-for
 * line, the default writes only that line to stderr (from cache_log_ms or
 * ENGRAM_CACHE_LOG_MS), other messages (a dead writer's file cleaned up)
 * reach only a function, and a log function that calls the library
 * neither deadlocks nor recurses.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>

#include "testutil.h"

#define R 16
#define NROWS 200

struct sink {
    pthread_mutex_t lock;
    int calls, info, warn, other, inside, overlap;
    char last[1024];
    engram_store *st; /* if set: the function looks up in it (must not recurse) */
    engram_table_id tid;
    int set_rc;       /* what engram_set_log() returned from inside the function */
};

static void sink_fn(void *ud, int level, const char *msg)
{
    struct sink *s = ud;
    /* Calls are serialised by the library: a second one while this one is
     * inside would be an overlap. */
    if (__atomic_exchange_n(&s->inside, 1, __ATOMIC_ACQ_REL))
        __atomic_store_n(&s->overlap, 1, __ATOMIC_RELAXED);
    usleep(200);
    pthread_mutex_lock(&s->lock);
    s->calls++;
    if (level == ENGRAM_LOG_INFO)
        s->info++;
    else if (level == ENGRAM_LOG_WARN)
        s->warn++;
    else
        s->other++;
    snprintf(s->last, sizeof s->last, "%s", msg);
    pthread_mutex_unlock(&s->lock);
    if (s->st) {
        int64_t ids[4] = {1, 2, 3, 4};
        unsigned char out[4 * R];
        /* A lookup from inside: its own stats line is dropped, not a
         * deadlock on the sink's lock. */
        (void)tu_lookup1(s->st, s->tid, ids, 4, out, 0);
        s->set_rc = engram_set_log(NULL, NULL, 0);
    }
    __atomic_store_n(&s->inside, 0, __ATOMIC_RELEASE);
}

/* Redirects fd 2 to a file until stderr_end(), which returns what was
 * written. */
static int saved_fd = -1;
static char errpath[512];

static void stderr_begin(void)
{
    int fd;
    tu_path(errpath, sizeof errpath, "stderr.txt");
    fflush(stderr);
    saved_fd = dup(2);
    fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT(saved_fd >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
}

static void stderr_end(char *buf, size_t cap)
{
    int fd;
    ssize_t n;
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    fd = open(errpath, O_RDONLY);
    ASSERT(fd >= 0);
    n = read(fd, buf, cap - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
}

/* A store that reads table "t" through the row cache, with a stats line
 * every `log_ms` (0: none of its own). */
static engram_store *cache_store(uint32_t log_ms, engram_table_id *tid)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    o.flags = ENGRAM_OPEN_FILE_CACHE;
    o.threads = 1;
    o.cache_log_ms = log_ms;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "log", &o, &st));
    ASSERT_OK(engram_table_open(st, "t", tid));
    return st;
}

/* Lookups spread over about 20 ms: a 1 ms interval passes several
 * times. */
static void look_a_while(engram_store *st, engram_table_id tid)
{
    int64_t ids[8];
    unsigned char out[8 * R];
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < 8; i++)
            ids[i] = (round * 31 + i * 7) % NROWS;
        ASSERT_OK(tu_lookup1(st, tid, ids, 8, out, 0));
        for (int i = 0; i < 8; i++)
            ASSERT_ROW(out + i * R, 3, (uint64_t)ids[i], R);
        usleep(2000);
    }
}

static void test_setup(void)
{
    engram_store *st = tu_open("log", 0, 1);
    tu_populate(st, "t", 3, NROWS, R, 0);
    engram_store_close(st);
}

static void test_function_gets_the_stats_line(void)
{
    struct sink s = {.lock = PTHREAD_MUTEX_INITIALIZER};
    char err[4096];
    engram_table_id tid;
    engram_store *st;

    ASSERT_OK(engram_set_log(sink_fn, &s, ENGRAM_LOG_INFO));
    st = cache_store(1, &tid);
    stderr_begin();
    look_a_while(st, tid);
    stderr_end(err, sizeof err);
    engram_store_close(st);
    ASSERT_GE(s.info, 1);
    ASSERT_EQ(s.other, 0);
    ASSERT(strncmp(s.last, "cache ", 6) == 0);
    ASSERT_CONTAINS(s.last, "/log: hit rate ");
    ASSERT_CONTAINS(s.last, "slots (7 ways)");
    ASSERT(strchr(s.last, '\n') == NULL);
    /* With a function, nothing reaches stderr. */
    ASSERT_STR_EQ(err, "");

    /* WARN and more severe only: the INFO line is filtered out. */
    s.calls = s.info = 0;
    ASSERT_OK(engram_set_log(sink_fn, &s, ENGRAM_LOG_WARN));
    st = cache_store(1, &tid);
    stderr_begin();
    look_a_while(st, tid);
    stderr_end(err, sizeof err);
    engram_store_close(st);
    ASSERT_EQ(s.calls, 0);
    ASSERT_STR_EQ(err, "");

    /* OFF silences even the line the store asked for. */
    ASSERT_OK(engram_set_log(sink_fn, &s, ENGRAM_LOG_OFF));
    st = cache_store(1, &tid);
    stderr_begin();
    look_a_while(st, tid);
    stderr_end(err, sizeof err);
    engram_store_close(st);
    ASSERT_EQ(s.calls, 0);
    ASSERT_STR_EQ(err, "");

    /* Bad levels are refused and change nothing. */
    ASSERT_ERR(engram_set_log(sink_fn, &s, ENGRAM_LOG_DEBUG + 1), -EINVAL);
    ASSERT_ERR(engram_set_log(sink_fn, &s, -1), -EINVAL);
    ASSERT_OK(engram_set_log(NULL, NULL, 0));
}

static void test_default_is_stderr_when_asked(void)
{
    char err[4096];
    engram_table_id tid;
    engram_store *st;

    /* No interval: nothing at all. */
    ASSERT(unsetenv("ENGRAM_CACHE_LOG_MS") == 0);
    st = cache_store(0, &tid);
    stderr_begin();
    look_a_while(st, tid);
    stderr_end(err, sizeof err);
    engram_store_close(st);
    ASSERT_STR_EQ(err, "");

    /* cache_log_ms: the line on stderr, as "engram: cache ...". */
    st = cache_store(1, &tid);
    stderr_begin();
    look_a_while(st, tid);
    stderr_end(err, sizeof err);
    engram_store_close(st);
    ASSERT(strncmp(err, "engram: cache ", 14) == 0);
    ASSERT_CONTAINS(err, "hit rate");
    ASSERT(err[strlen(err) - 1] == '\n');

    /* The environment variable turns it on the same way. */
    ASSERT(setenv("ENGRAM_CACHE_LOG_MS", "1", 1) == 0);
    st = cache_store(0, &tid);
    stderr_begin();
    look_a_while(st, tid);
    stderr_end(err, sizeof err);
    engram_store_close(st);
    ASSERT(unsetenv("ENGRAM_CACHE_LOG_MS") == 0);
    ASSERT(strncmp(err, "engram: cache ", 14) == 0);
}

/* A writer killed mid-way leaves a temporary file; the next open removes
 * it and says so at INFO, to a function only. */
static void kill_a_writer(void)
{
    pid_t pid = fork();
    int status;
    ASSERT(pid >= 0);
    if (pid == 0) {
        engram_store *st = NULL;
        engram_writer *w;
        engram_table_spec spec = {4, R, 0};
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        o.threads = 1;
        if (engram_store_open(tu_scratch_root(), "log", &o, &st) != 0 ||
            engram_writer_begin(st, "dying", &spec, &w) != 0)
            _exit(1);
        _exit(0);
    }
    ASSERT(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_cleanup_message(void)
{
    struct sink s = {.lock = PTHREAD_MUTEX_INITIALIZER};
    char err[4096];
    engram_store *st;

    /* Default: nobody asked, nothing is written. */
    kill_a_writer();
    stderr_begin();
    st = tu_open("log", 0, 1);
    stderr_end(err, sizeof err);
    engram_store_close(st);
    ASSERT_STR_EQ(err, "");

    kill_a_writer();
    ASSERT_OK(engram_set_log(sink_fn, &s, ENGRAM_LOG_DEBUG));
    st = tu_open("log", 0, 1);
    engram_store_close(st);
    ASSERT_OK(engram_set_log(NULL, NULL, 0));
    ASSERT_EQ(s.info, 1);
    ASSERT_CONTAINS(s.last, "removed ");
    ASSERT_CONTAINS(s.last, "/log/.tmp.dying.");
    ASSERT_CONTAINS(s.last, "writer that died");
}

/* Lookups of several threads raise lines at once: the function is never
 * entered twice at a time.  A function that looks up and calls
 * engram_set_log() from inside neither deadlocks nor recurses. */
struct looker {
    engram_store *st;
    engram_table_id tid;
};

static void *looker_main(void *arg)
{
    struct looker *l = arg;
    look_a_while(l->st, l->tid);
    return NULL;
}

static void test_serialised_and_reentrant(void)
{
    struct sink s = {.lock = PTHREAD_MUTEX_INITIALIZER};
    struct looker l;
    pthread_t th[4];
    engram_store *st[4];

    ASSERT_OK(engram_set_log(sink_fn, &s, ENGRAM_LOG_INFO));
    for (int i = 0; i < 4; i++)
        st[i] = cache_store(1, &l.tid);
    for (int i = 0; i < 4; i++) {
        static struct looker ls[4];
        ls[i].st = st[i];
        ls[i].tid = l.tid;
        ASSERT(pthread_create(&th[i], NULL, looker_main, &ls[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    ASSERT_GE(s.calls, 4);
    ASSERT_EQ(s.overlap, 0);

    /* From inside: a lookup (whose own line is dropped) and a call to
     * engram_set_log(), which is refused. */
    s.calls = 0;
    s.st = st[0];
    s.tid = l.tid;
    s.set_rc = 1;
    look_a_while(st[0], l.tid);
    ASSERT_GE(s.calls, 1);
    ASSERT_EQ(s.set_rc, ENGRAM_ESTATE);
    ASSERT_OK(engram_set_log(NULL, NULL, 0));
    for (int i = 0; i < 4; i++)
        engram_store_close(st[i]);
}

int main(void)
{
    tu_watchdog(120);
    unsetenv("ENGRAM_CACHE_LOG_MS");
    RUN_TEST(test_setup);
    RUN_TEST(test_function_gets_the_stats_line);
    RUN_TEST(test_default_is_stderr_when_asked);
    RUN_TEST(test_cleanup_message);
    RUN_TEST(test_serialised_and_reentrant);
    printf("test_log: all passed\n");
    return 0;
}
