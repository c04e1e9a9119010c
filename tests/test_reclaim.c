/*
 * test_reclaim.c - what engram_remove() gives back, and when.
 *
 * A long-running store that removes and re-creates tables must not keep
 * the removed ones mapped (their tmpfs pages allocated, one mapping each
 * towards vm.max_map_count) or their files and row caches open.  A removed
 * table's source is released once no lookup that was running can still
 * read it; a table whose memory engram_table_memory() lent out stays
 * mapped until close; engram_store_stats() counts what is still held.
 *
 *  - cycles: remove and re-create 3000 times (mapped and file-cache
 *    stores): the process's mappings and descriptors do not grow.
 *  - lent memory: stays readable after the removal, counted in the stats.
 *  - removal under lookups: threads look up a table that the main thread
 *    removes and re-creates; every lookup returns the right rows of the
 *    table it named or ENGRAM_EREMOVED with its output untouched.
 *  - a lookup still running (blocked in a source's read_rows): the
 *    removal returns, the release waits for that lookup, and happens at
 *    the next stats call after it; a removal from inside read_rows does
 *    not deadlock.
 *  - fork while another thread is inside a lookup: the child's removals
 *    are released at once (the forked-away thread is not waited for).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>

#include "readsection.h"
#include "testutil.h"

#define RB 64 /* row bytes of every table here */

/* Lines of /proc/self/maps: the process's mappings. */
static long count_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    long n = 0;
    int c;
    ASSERT(f != NULL);
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* Mappings of table file `name` of namespace `ns` (its path, deleted or
 * not, in /proc/self/maps): what a release of the table must unmap, apart
 * from whatever else the allocator or the sanitizer maps meanwhile. */
static long count_maps_of(const char *ns, const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096], want[300];
    long n = 0;
    ASSERT(f != NULL);
    snprintf(want, sizeof want, "/%s/%s", ns, name);
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, want);
        if (p && (p[strlen(want)] == '\n' || p[strlen(want)] == ' '))
            n++;
    }
    fclose(f);
    return n;
}

/* Open descriptors of the process. */
static long count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    long n = 0;
    ASSERT(d != NULL);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static engram_stats stats_of(engram_store *st)
{
    engram_stats s = ENGRAM_STATS_INIT;
    ASSERT_OK(engram_store_stats(st, &s));
    return s;
}

static void test_cycles(uint32_t flags, const char *ns)
{
    engram_store *st = tu_open(ns, flags, 1);
    long maps0 = 0, fds0 = 0;
    for (int i = 0; i < 3000; i++) {
        engram_table_id id;
        engram_stats s;
        tu_populate(st, "t", (uint32_t)i + 1, 64, RB, 0);
        ASSERT_OK(engram_table_open(st, "t", &id));
        tu_check_table(st, id, (uint32_t)i + 1, 64, RB);
        ASSERT_OK(engram_remove(st, "t"));
        s = stats_of(st);
        /* No lookup ran: released at once. */
        ASSERT_EQ_U64(s.removed_tables, 0);
        ASSERT_EQ_U64(s.removed_bytes, 0);
        ASSERT_EQ_U64(s.tables_open, 0);
        if (i == 10) { /* after the first tables made the reader, budget, ... */
            maps0 = count_maps();
            fds0 = count_fds();
        }
    }
    /* One mapping or descriptor per removed table would be 2990 more. */
    ASSERT_LE(count_maps(), maps0 + 8);
    ASSERT_LE(count_fds(), fds0 + 2);
    engram_store_close(st);
}

static void test_cycles_mapped(void)
{
    tu_current_case = "3000 removals of a mapped table keep no mapping";
    test_cycles(0, "cyc_map");
}

static void test_cycles_file_cache(void)
{
    tu_current_case = "3000 removals of a file-cache table keep no file or cache";
    test_cycles(ENGRAM_OPEN_FILE_CACHE, "cyc_fc");
}

static void test_lent(void)
{
    engram_store *st = tu_open("lent", 0, 1);
    engram_table_id lent, plain;
    engram_table_spec sp;
    const void *base = NULL;
    engram_stats s;
    tu_current_case = "memory lent by engram_table_memory stays until close";
    tu_populate(st, "lent", 4, 300, RB, 0);
    tu_populate(st, "plain", 5, 300, RB, 0);
    ASSERT_OK(engram_table_open(st, "lent", &lent));
    ASSERT_OK(engram_table_open(st, "plain", &plain));
    /* Asking only for the spec lends nothing. */
    ASSERT_OK(engram_table_memory(st, plain, NULL, &sp));
    ASSERT_OK(engram_table_memory(st, lent, &base, &sp));
    ASSERT_OK(engram_remove(st, "lent"));
    ASSERT_OK(engram_remove(st, "plain"));
    s = stats_of(st);
    ASSERT_EQ_U64(s.removed_tables, 1);
    ASSERT_EQ_U64(s.removed_bytes, 300 * RB);
    ASSERT_EQ_U64(s.tables_open, 0);
    /* Still the table's rows, still readable. */
    for (uint64_t i = 0; i < 300; i++)
        ASSERT_ROW((const unsigned char *)base + i * sp.row_pitch, 4, i, RB);
    ASSERT_ERR(engram_table_memory(st, lent, &base, NULL), ENGRAM_EREMOVED);
    {
        /* Only the current size is taken (the one before removed_tables
         * was never released): any other is refused, nothing written. */
        unsigned char buf[sizeof(engram_stats)];
        engram_stats *old = (engram_stats *)(void *)buf;
        memset(buf, 0xEE, sizeof buf);
        old->size = (uint32_t)offsetof(engram_stats, removed_tables);
        ASSERT_ERR(engram_store_stats(st, old), -EINVAL);
        ASSERT_ALL_BYTES(buf + sizeof old->size, 0xEE, sizeof buf - sizeof old->size);
        old->size = (uint32_t)offsetof(engram_stats, removed_tables) + 4;
        ASSERT_ERR(engram_store_stats(st, old), -EINVAL);
    }
    engram_store_close(st);
}

/* ------------------------------------------------------------------------
 * Removal while other threads look the table up.
 */

#define CHURN_THREADS 3
#define CHURN_ROWS 256

typedef struct churn {
    engram_store *st;
    engram_table_id keep;
    _Atomic uint32_t seed_of[1u << 16]; /* table id -> its pattern, 0 until known */
    atomic_int stop;
    _Atomic long ok, removed;
} churn;

static void *churn_thread(void *arg)
{
    churn *c = arg;
    uint64_t rng = (uint64_t)(uintptr_t)&rng;
    int64_t ids[32 * 2];
    unsigned char out[32 * 2 * RB];
    while (!atomic_load(&c->stop)) {
        engram_table_id tabs[2], id;
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        uint32_t seed;
        int rc = engram_table_open(c->st, "t", &id);
        if (rc == -ENOENT)
            continue; /* between a removal and the next populate */
        ASSERT_OK(rc);
        while ((seed = atomic_load(&c->seed_of[id])) == 0 && !atomic_load(&c->stop))
            sched_yield();
        tabs[0] = c->keep;
        tabs[1] = id;
        for (int t = 0; t < 32; t++) {
            ids[2 * t] = (int64_t)tu_rand_below(&rng, CHURN_ROWS);
            ids[2 * t + 1] = (int64_t)tu_rand_below(&rng, CHURN_ROWS);
        }
        memset(out, 0xA5, sizeof out);
        a.num_tokens = 32;
        a.num_cols = 2;
        a.tables = tabs;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        rc = engram_lookup(c->st, &a);
        if (rc == ENGRAM_EREMOVED) {
            ASSERT_ALL_BYTES(out, 0xA5, sizeof out);
            atomic_fetch_add(&c->removed, 1);
            continue;
        }
        ASSERT_OK(rc);
        for (int t = 0; t < 32; t++) {
            ASSERT_ROW(out + (2 * t) * RB, 1, (uint64_t)ids[2 * t], RB);
            ASSERT_ROW(out + (2 * t + 1) * RB, seed, (uint64_t)ids[2 * t + 1], RB);
        }
        atomic_fetch_add(&c->ok, 1);
    }
    return NULL;
}

static void test_remove_under_lookups(uint32_t flags, const char *ns)
{
    static churn c;
    pthread_t th[CHURN_THREADS];
    struct timespec t0, t1;
    int rounds = 0;
    engram_stats s;
    memset(&c, 0, sizeof c);
    c.st = tu_open(ns, flags, 2);
    tu_populate(c.st, "keep", 1, CHURN_ROWS, RB, 0);
    ASSERT_OK(engram_table_open(c.st, "keep", &c.keep));
    for (int i = 0; i < CHURN_THREADS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, churn_thread, &c), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        engram_table_id id;
        uint32_t seed = 100 + (uint32_t)rounds;
        tu_populate(c.st, "t", seed, CHURN_ROWS, RB, 0);
        ASSERT_OK(engram_table_open(c.st, "t", &id));
        atomic_store(&c.seed_of[id], seed);
        {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        ASSERT_OK(engram_remove(c.st, "t"));
        rounds++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
    } while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 1500000000L ||
             atomic_load(&c.ok) < 100);
    atomic_store(&c.stop, 1);
    for (int i = 0; i < CHURN_THREADS; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    printf("  %d removals under %ld lookups (%ld of a removed table)\n", rounds,
           atomic_load(&c.ok) + atomic_load(&c.removed), atomic_load(&c.removed));
    /* No lookup runs now: whatever a removal had to leave is released. */
    s = stats_of(c.st);
    ASSERT_EQ_U64(s.removed_tables, 0);
    ASSERT_EQ_U64(s.tables_open, flags & ENGRAM_OPEN_FILE_CACHE ? 0 : 1);
    engram_store_close(c.st);
}

static void test_remove_under_lookups_mapped(void)
{
    tu_current_case = "removal while threads look the table up (mapped)";
    test_remove_under_lookups(0, "churn_map");
}

static void test_remove_under_lookups_file_cache(void)
{
    tu_current_case = "removal while threads look the table up (file cache)";
    test_remove_under_lookups(ENGRAM_OPEN_FILE_CACHE, "churn_fc");
}

/* ------------------------------------------------------------------------
 * A lookup held inside a source's read_rows.
 */

typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, open;
    engram_store *st;          /* for the removal from inside read_rows */
    const char *remove_inside; /* that table's name, or NULL */
    int remove_rc;
} gate;

static gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, NULL, NULL, 0};

static int gated_read(void *ctx, engram_source_req *reqs, size_t n)
{
    (void)ctx;
    if (g.remove_inside)
        g.remove_rc = engram_remove(g.st, g.remove_inside);
    pthread_mutex_lock(&g.mu);
    g.entered = 1;
    pthread_cond_broadcast(&g.cv);
    while (!g.open)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    for (size_t i = 0; i < n; i++)
        tu_fill_row(reqs[i].dst, 7, reqs[i].row, RB);
    return 0;
}

typedef struct held {
    engram_store *st;
    engram_table_id tabs[2];
    int64_t ids[2 * 4];
    unsigned char out[2 * 4 * RB];
    int rc;
} held;

static void *held_lookup(void *arg)
{
    held *h = arg;
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.num_tokens = 4;
    a.num_cols = 2;
    a.tables = h->tabs;
    a.ids = h->ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = h->out;
    h->rc = engram_lookup(h->st, &a);
    return NULL;
}

static void gate_reset(void)
{
    g.entered = g.open = 0;
    g.remove_inside = NULL;
    g.remove_rc = 1;
}

static void gate_wait_entered(void)
{
    pthread_mutex_lock(&g.mu);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
}

static void gate_open(void)
{
    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

/* A store with file table "f" (pattern 3) and source "s" (pattern 7),
 * and a lookup of both started in a thread and held in read_rows. */
static engram_store *held_start(const char *ns, held *h, pthread_t *th)
{
    engram_table_spec spec = {100, RB, 0};
    engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
    engram_store *st = tu_open(ns, 0, 1);
    memset(h, 0, sizeof *h);
    tu_populate(st, "f", 3, 100, RB, 0);
    ASSERT_OK(engram_table_open(st, "f", &h->tabs[0]));
    ops.read_rows = gated_read;
    ASSERT_OK(engram_add_source(st, "s", &spec, &ops, NULL, 0, &h->tabs[1]));
    for (int t = 0; t < 4; t++) {
        h->ids[2 * t] = 10 * t + 1;
        h->ids[2 * t + 1] = 20 * t + 2;
    }
    h->st = st;
    g.st = st;
    ASSERT_EQ(pthread_create(th, NULL, held_lookup, h), 0);
    gate_wait_entered();
    return st;
}

static void held_finish(held *h, pthread_t th)
{
    gate_open();
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_OK(h->rc);
    for (int t = 0; t < 4; t++) {
        ASSERT_ROW(h->out + (2 * t) * RB, 3, (uint64_t)h->ids[2 * t], RB);
        ASSERT_ROW(h->out + (2 * t + 1) * RB, 7, (uint64_t)h->ids[2 * t + 1], RB);
    }
}

static void test_running_lookup(void)
{
    held h;
    pthread_t th;
    engram_store *st;
    engram_stats s;
    long maps;
    tu_current_case = "a removal while a lookup of the table runs waits, then defers";
    gate_reset();
    st = held_start("held", &h, &th);
    maps = count_maps_of("held", "f");
    ASSERT_GT(maps, 0);
    ASSERT_OK(engram_remove(st, "f"));
    s = stats_of(st);
    ASSERT_EQ_U64(s.removed_tables, 1); /* the running lookup may still read it */
    ASSERT_EQ_U64(s.removed_bytes, 100 * RB);
    ASSERT_EQ(count_maps_of("held", "f"), maps);
    held_finish(&h, th);
    /* The lookup is over: the next stats call releases the table. */
    s = stats_of(st);
    ASSERT_EQ_U64(s.removed_tables, 0);
    ASSERT_EQ(count_maps_of("held", "f"), 0);
    engram_store_close(st);
}

static void test_remove_inside_read_rows(void)
{
    held h;
    pthread_t th;
    engram_store *st;
    engram_stats s;
    tu_current_case = "a removal from inside read_rows returns (no waiting on itself)";
    gate_reset();
    /* The held lookup's read_rows removes "g" before it waits. */
    {
        engram_store *pre = tu_open("inside", 0, 1);
        tu_populate(pre, "g", 9, 10, RB, 0);
        engram_store_close(pre);
    }
    g.remove_inside = "g";
    st = tu_open("inside", 0, 1);
    {
        engram_table_id gid;
        ASSERT_OK(engram_table_open(st, "g", &gid));
        tu_check_table(st, gid, 9, 10, RB);
    }
    {
        engram_table_spec spec = {100, RB, 0};
        engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
        memset(&h, 0, sizeof h);
        tu_populate(st, "f", 3, 100, RB, 0);
        ASSERT_OK(engram_table_open(st, "f", &h.tabs[0]));
        ops.read_rows = gated_read;
        ASSERT_OK(engram_add_source(st, "s", &spec, &ops, NULL, 0, &h.tabs[1]));
        for (int t = 0; t < 4; t++) {
            h.ids[2 * t] = t;
            h.ids[2 * t + 1] = t + 50;
        }
        h.st = st;
        g.st = st;
        ASSERT_EQ(pthread_create(&th, NULL, held_lookup, &h), 0);
        gate_wait_entered();
    }
    ASSERT_EQ(g.remove_rc, 0);
    s = stats_of(st);
    ASSERT_EQ_U64(s.removed_tables, 1);
    held_finish(&h, th);
    s = stats_of(st);
    ASSERT_EQ_U64(s.removed_tables, 0);
    engram_store_close(st);
}

static void test_fork_mid_lookup(void)
{
    held h;
    pthread_t th;
    engram_store *st;
    pid_t pid;
    int status;
    tu_current_case = "fork while another thread is inside a lookup";
    gate_reset();
    st = held_start("forked", &h, &th);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        /* The lookup's thread did not come along: nothing to wait for. */
        engram_stats s = ENGRAM_STATS_INIT;
        ASSERT_GT(count_maps_of("forked", "f"), 0);
        ASSERT_OK(engram_remove(st, "f"));
        ASSERT_OK(engram_store_stats(st, &s));
        ASSERT_EQ_U64(s.removed_tables, 0);
        ASSERT_EQ(count_maps_of("forked", "f"), 0);
        _exit(0);
    }
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    /* The parent's table is untouched by the child's removal of the
     * file: its lookup finishes with the right rows. */
    held_finish(&h, th);
    engram_store_close(st);
}

int main(void)
{
    tu_watchdog(240);
    RUN_TEST(test_cycles_mapped);
    /* Which entry the read sections use here (readsection.h). */
    printf("  read sections: %s\n", engram__rsec_fence ? "locked exchange on entry"
                                                        : "membarrier on removal");
    RUN_TEST(test_cycles_file_cache);
    RUN_TEST(test_lent);
    RUN_TEST(test_remove_under_lookups_mapped);
    RUN_TEST(test_remove_under_lookups_file_cache);
    RUN_TEST(test_running_lookup);
    RUN_TEST(test_remove_inside_read_rows);
    RUN_TEST(test_fork_mid_lookup);
    printf("test_reclaim: ok\n");
    return 0;
}
