/*
 * bench_filecache.c - cold and warm lookups of a table file through the
 * row cache (ENGRAM_OPEN_FILE_CACHE), each against baselines measured in
 * the same run on the same file.
 *
 *   bench_filecache [--dir DIR] [--size-mib N] [--cache-mib N] [--qd N]
 *                   [--reps N] [--cold-rows N] [--slow-rows N] [--k N]
 *                   [--pread-threads LIST] [--quick]
 *
 * A table of 264-byte rows (--size-mib, default 2048) is written under
 * DIR (default /var/tmp, which should be a disk file system) and removed
 * at the end.  Cold: before every measurement the file's pages are
 * dropped (posix_fadvise DONTNEED; also /proc/sys/vm/drop_caches when run
 * as root), and each measurement reads fresh uniform random rows:
 *   cache    engram_lookup() of K ids per call on a fresh store with
 *            ENGRAM_OPEN_FILE_CACHE (--cache-mib budget, --qd reads in
 *            flight): every row a miss
 *   uring    a bare io_uring reader at the same queue depth: O_DIRECT
 *            reads of the aligned blocks around each row, the queue kept
 *            full (the ceiling for the cache)
 *   pread    one pread() of the row per id, buffered, one thread
 *            (--slow-rows ids)
 *   pread xT T threads (each count of --pread-threads, default 16 and
 *            the queue depth) started before the clock, each doing a
 *            buffered pread() per row of its share of every K-id lookup,
 *            the lookups one after another (a barrier between them, as
 *            synchronous lookups are): what a user would write to keep T
 *            reads in flight without io_uring
 *   mmap     a read-only mapping with MADV_RANDOM, one row copy per id
 *            (--slow-rows ids)
 * Each repetition runs the variants in turn, starting one variant further
 * on than the last, so that none always goes first.
 * Warm: a working set of rows that fits the cache is read once, then
 * lookups of K random ids from it (all hits) are timed against the same
 * lookups on a store that maps the table (ENGRAM_OPEN_PREFAULT), the two
 * taking turns going first.
 * Every figure is the median of --reps repetitions, printed with the
 * minimum and maximum; ratios are taken between medians of this run.  The
 * load average is printed at the start, with each repetition and at the
 * end.  Rows returned by the cache and by the threaded pread are checked
 * against the mapped table.
 *
 * --quick: a 64 MiB table (in --dir), 8 MiB of cache, 2 repetitions of
 * 8192 cold rows and 1000 slow ones, 4 and 16 pread threads: the CTest
 * smoke run.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

#include "engram.h"
#include "bench_util.h"

#define R 264
#define MAXREP 31
#define MAXPT 8 /* thread counts of --pread-threads */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_filecache: %s: %s\n", what, engram_errmsg());
    exit(1);
}

static char path[4096], root[2048];
static uint64_t data_off, nrows;

static void drop_cache(void)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (geteuid() == 0) {
        int d = open("/proc/sys/vm/drop_caches", O_WRONLY);
        sync();
        if (d >= 0) {
            if (write(d, "1", 1) != 1)
                fprintf(stderr, "bench_filecache: drop_caches: %s\n", strerror(errno));
            close(d);
        }
    }
}

/* The table's directory goes at any exit, a failed check's included. */
static void remove_table(void)
{
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_filecache: could not remove %s\n", root);
}

static void rand_ids(int64_t *ids, size_t n, uint64_t seed, uint64_t range)
{
    for (size_t i = 0; i < n; i++)
        ids[i] = (int64_t)(rng(&seed) % range);
}

/* Rows/s of cold lookups through a fresh cache store. */
static double run_cache(const char *store_root, uint64_t cache_mib, unsigned qd,
                        const int64_t *ids, size_t n, size_t k, unsigned char *out,
                        engram_cache_stats *cs)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st;
    engram_table_id tid;
    uint64_t t0;
    /* PREFAULT: the cache's memory is touched at open, so the timed
     * lookups measure reads, not first-touch faults of fresh memory. */
    o.flags = ENGRAM_OPEN_FILE_CACHE | ENGRAM_OPEN_PREFAULT;
    o.cache_bytes = cache_mib << 20;
    o.queue_depth = qd;
    o.threads = 1;
    if (engram_store_open(store_root, "bench", &o, &st) != 0 ||
        engram_table_open(st, "t", &tid) != 0)
        die("open cache store");
    t0 = now_ns();
    for (size_t i = 0; i < n; i += k) {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        a.num_tokens = n - i < k ? n - i : k;
        a.num_cols = 1;
        a.tables = &tid;
        a.ids = ids + i;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out + i * R;
        if (engram_lookup(st, &a) != 0)
            die("lookup");
    }
    t0 = now_ns() - t0;
    *cs = (engram_cache_stats)ENGRAM_CACHE_STATS_INIT;
    engram_get_cache_stats(st, NULL, cs);
    engram_store_close(st);
    return (double)n * 1e9 / (double)t0;
}

/* Rows/s of a bare io_uring O_DIRECT reader, queue kept at qd. */
static double run_uring(unsigned qd, const int64_t *ids, size_t n, unsigned align)
{
    struct io_uring ring;
    unsigned char *buf;
    size_t slot = ((R + align - 1) / align + 1) * align, next = 0, done = 0;
    unsigned inflight = 0;
    uint64_t t0;
    int fd = open(path, O_RDONLY | O_DIRECT), err = 0;
    if (fd < 0 || (err = io_uring_queue_init(qd, &ring, 0)) != 0 ||
        posix_memalign((void **)&buf, 4096, slot * qd) != 0) {
        if (err == -ENOSYS || err == -EPERM) {
            /* A sandbox that refuses io_uring: nothing to compare. */
            fprintf(stderr, "bench_filecache: skipped: io_uring refused (%s)\n", strerror(-err));
            exit(77);
        }
        fprintf(stderr, "bench_filecache: io_uring O_DIRECT reader: %s\n",
                strerror(err ? -err : errno));
        exit(1);
    }
    /* Completions arrive in any order: free buffer slots are a stack. */
    unsigned *free_slots = malloc(qd * sizeof *free_slots), nfree = qd;
    for (unsigned s = 0; s < qd; s++)
        free_slots[s] = s;
    t0 = now_ns();
    while (done < n) {
        struct io_uring_cqe *cqe;
        while (next < n && nfree > 0) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            uint64_t off = data_off + (uint64_t)ids[next] * R, a = off & ~(uint64_t)(align - 1);
            unsigned s = free_slots[--nfree];
            io_uring_prep_read(sqe, fd, buf + (size_t)s * slot,
                               (unsigned)((off + R - a + align - 1) / align * align), a);
            sqe->user_data = s;
            next++;
            inflight++;
        }
        (void)io_uring_submit_and_wait(&ring, 1);
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
            if (cqe->res < 0) {
                fprintf(stderr, "bench_filecache: read: %s\n", strerror(-cqe->res));
                exit(1);
            }
            free_slots[nfree++] = (unsigned)cqe->user_data;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            done++;
        }
    }
    t0 = now_ns() - t0;
    io_uring_queue_exit(&ring);
    free(free_slots);
    free(buf);
    close(fd);
    return (double)n * 1e9 / (double)t0;
}

static double run_pread(const int64_t *ids, size_t n, unsigned char *out)
{
    int fd = open(path, O_RDONLY);
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < n; i++)
        if (pread(fd, out + i * R, R, (off_t)(data_off + (uint64_t)ids[i] * R)) != R) {
            fprintf(stderr, "bench_filecache: pread: %s\n", strerror(errno));
            exit(1);
        }
    t0 = now_ns() - t0;
    close(fd);
    return (double)n * 1e9 / (double)t0;
}

/* The threaded pread: T workers, each its share of every K-id lookup,
 * a barrier after each lookup. */
typedef struct pread_job {
    pthread_t th;
    pthread_barrier_t *start, *step;
    int fd;
    unsigned w, nw;
    const int64_t *ids;
    size_t n, k;
    unsigned char *out;
} pread_job;

static void *pread_worker(void *p)
{
    pread_job *j = p;
    pthread_barrier_wait(j->start);
    for (size_t lo = 0; lo < j->n; lo += j->k) {
        size_t len = j->n - lo < j->k ? j->n - lo : j->k;
        size_t a = lo + len * j->w / j->nw, b = lo + len * (j->w + 1) / j->nw;
        for (size_t i = a; i < b; i++)
            if (pread(j->fd, j->out + i * R, R, (off_t)(data_off + (uint64_t)j->ids[i] * R)) != R) {
                fprintf(stderr, "bench_filecache: pread: %s\n", strerror(errno));
                exit(1);
            }
        /* The next lookup starts when every share of this one is in. */
        pthread_barrier_wait(j->step);
    }
    return NULL;
}

static double run_pread_mt(unsigned nt, const int64_t *ids, size_t n, size_t k, unsigned char *out)
{
    pthread_barrier_t start, step;
    pread_job *j = calloc(nt, sizeof *j);
    int fd = open(path, O_RDONLY);
    uint64_t t0;
    if (!j || fd < 0 || pthread_barrier_init(&start, NULL, nt + 1) != 0 ||
        pthread_barrier_init(&step, NULL, nt) != 0) {
        fprintf(stderr, "bench_filecache: threaded pread: %s\n", strerror(errno));
        exit(1);
    }
    for (unsigned w = 0; w < nt; w++) {
        j[w] = (pread_job){.start = &start, .step = &step, .fd = fd, .w = w, .nw = nt,
                           .ids = ids, .n = n, .k = k, .out = out};
        if (pthread_create(&j[w].th, NULL, pread_worker, &j[w]) != 0) {
            fprintf(stderr, "bench_filecache: pthread_create failed\n");
            exit(1);
        }
    }
    /* The clock starts when every worker is up and waiting. */
    pthread_barrier_wait(&start);
    t0 = now_ns();
    for (unsigned w = 0; w < nt; w++)
        pthread_join(j[w].th, NULL);
    t0 = now_ns() - t0;
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&step);
    close(fd);
    free(j);
    return (double)n * 1e9 / (double)t0;
}

static double run_mmap(const int64_t *ids, size_t n, unsigned char *out, uint64_t file_size)
{
    int fd = open(path, O_RDONLY);
    unsigned char *m = mmap(NULL, file_size, PROT_READ, MAP_SHARED, fd, 0);
    uint64_t t0;
    if (m == MAP_FAILED) {
        fprintf(stderr, "bench_filecache: mmap: %s\n", strerror(errno));
        exit(1);
    }
    madvise(m, file_size, MADV_RANDOM);
    t0 = now_ns();
    for (size_t i = 0; i < n; i++)
        memcpy(out + i * R, m + data_off + (uint64_t)ids[i] * R, R);
    t0 = now_ns() - t0;
    munmap(m, file_size);
    close(fd);
    return (double)n * 1e9 / (double)t0;
}

/* ns per row of `iters` lookups of K ids from the ring of id batches. */
static double time_lookups(engram_store *st, engram_table_id tid, const int64_t *ids, size_t nids,
                           size_t k, int iters, unsigned char *out)
{
    uint64_t t0 = now_ns();
    for (int it = 0; it < iters; it++) {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        a.num_tokens = k;
        a.num_cols = 1;
        a.tables = &tid;
        a.ids = ids + ((size_t)it * k) % (nids - k + 1);
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        if (engram_lookup(st, &a) != 0)
            die("lookup");
    }
    return (double)(now_ns() - t0) / ((double)iters * (double)k);
}

int main(int argc, char **argv)
{
    const char *dir = "/var/tmp";
    uint64_t size_mib = 2048, cache_mib = 64;
    unsigned qd = 128;
    int reps = 5;
    size_t cold = 20000, slow = 4000, k = 4096;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *wst, *mst, *cst;
    engram_table_id mt;
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    engram_table_spec spec;
    engram_writer *w;
    engram_cache_stats cs = ENGRAM_CACHE_STATS_INIT;
    unsigned char *buf, *out, *out2;
    int64_t *ids;
    /* The cold variants: cache, uring, pread, then one per pread thread
     * count, then mmap. */
    enum { V_CACHE, V_URING, V_PREAD, V_PTHR, NV_MAX = V_PTHR + MAXPT + 1 };
    double vr[NV_MAX][MAXREP], v_hit[MAXREP], v_mem[MAXREP];
    char vname[NV_MAX][32];
    unsigned pthreads[MAXPT] = {16, 0}; /* 0: the queue depth */
    int npt = 2, nv, v_mmap, quick = 0;
    unsigned align = 512;
    struct stat sb;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            quick = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "usage: see the comment at the top of bench/bench_filecache.c\n");
            return 2;
        }
        if (!strcmp(a, "--dir"))
            dir = v;
        else if (!strcmp(a, "--size-mib"))
            size_mib = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--cache-mib"))
            cache_mib = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--qd"))
            qd = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--cold-rows"))
            cold = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--slow-rows"))
            slow = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--k"))
            k = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--pread-threads")) {
            npt = 0;
            for (const char *c = v; *c && npt < MAXPT; c = strchr(c, ',') ? strchr(c, ',') + 1 : "")
                pthreads[npt++] = (unsigned)strtoul(c, NULL, 10);
        } else {
            fprintf(stderr, "bench_filecache: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (quick) {
        size_mib = 64;
        cache_mib = 8;
        reps = 2;
        cold = 8192;
        slow = 1000;
        npt = 2;
        pthreads[0] = 4;
        pthreads[1] = 16;
    }
    for (int i = 0; i < npt; i++) {
        if (pthreads[i] == 0)
            pthreads[i] = qd;
        if (pthreads[i] > 1024)
            npt = 0;
    }
    if (reps < 1 || reps > MAXREP || k < 1 || cold < k || size_mib < 1 || qd < 1 || npt < 1) {
        fprintf(stderr, "bench_filecache: bad parameters\n");
        return 2;
    }
    nv = V_PTHR + npt + 1;
    v_mmap = nv - 1;
    snprintf(vname[V_CACHE], sizeof vname[0], "cache");
    snprintf(vname[V_URING], sizeof vname[0], "uring");
    snprintf(vname[V_PREAD], sizeof vname[0], "pread");
    for (int i = 0; i < npt; i++)
        snprintf(vname[V_PTHR + i], sizeof vname[0], "pread x%u", pthreads[i]);
    snprintf(vname[v_mmap], sizeof vname[0], "mmap");

    /* The table, streamed in 8 MiB chunks of pattern rows. */
    snprintf(root, sizeof root, "%s/engram-bench-fc.%d", dir, (int)getpid());
    o.flags = ENGRAM_OPEN_CREATE;
    atexit(remove_table);
    if (engram_store_open(root, "bench", &o, &wst) != 0)
        die("open store");
    spec.num_rows = (size_mib << 20) / R;
    spec.row_bytes = R;
    spec.row_pitch = R;
    nrows = spec.num_rows;
    buf = malloc((size_t)8 << 20);
    if (engram_writer_begin(wst, "t", &spec, &w) != 0)
        die("writer");
    for (uint64_t r = 0; r < nrows;) {
        uint64_t n = ((size_t)8 << 20) / R;
        if (n > nrows - r)
            n = nrows - r;
        for (uint64_t i = 0; i < n; i++)
            for (int j = 0; j < R; j += 8) {
                uint64_t x = (r + i) * 0x9E3779B97F4A7C15ull ^ (uint64_t)j;
                memcpy(buf + i * R + j, &x, 8);
            }
        if (engram_writer_append(w, buf, n, 0) != 0)
            die("append");
        r += n;
    }
    if (engram_writer_commit(w) != 0 || engram_get_table_info(wst, "t", &info) != 0)
        die("commit");
    engram_store_close(wst);
    data_off = info.data_offset;
    snprintf(path, sizeof path, "%s/bench/t", root);
    stat(path, &sb);
#ifdef STATX_DIOALIGN
    {
        struct statx sx;
        if (statx(AT_FDCWD, path, 0, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
            sx.stx_dio_offset_align)
            align = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align
                                                                  : sx.stx_dio_mem_align;
    }
#endif
    printf("table %s: %" PRIu64 " rows of %d bytes (%.0f MiB), cache %" PRIu64
           " MiB (%.1fx smaller), qd %u, K %zu, %d reps, %s\n",
           path, nrows, R, (double)sb.st_size / 1048576.0, cache_mib,
           (double)sb.st_size / (double)(cache_mib << 20), qd, k, reps,
           geteuid() == 0 ? "page cache dropped (fadvise + drop_caches)"
                          : "page cache dropped (fadvise only: not root)");
    printf("load average at start: %s (%ld CPUs online)\n", bench_loadavg_text(),
           sysconf(_SC_NPROCESSORS_ONLN));

    ids = malloc(sizeof *ids * (cold > 65536 ? cold : 65536));
    out = malloc(R * (cold > 65536 ? cold : 65536));
    out2 = malloc(R * (cold > 65536 ? cold : 65536));
    o = (engram_store_options)ENGRAM_STORE_OPTIONS_INIT;
    o.threads = 1;
    if (engram_store_open(root, "bench", &o, &mst) != 0)
        die("open mapped store");

    /* Rep -1 is a warm-up, not counted: the first cold reads after the
     * file was written run slower here, whichever reader goes first.  Each
     * repetition starts one variant further on, so that none always goes
     * first; every variant reads fresh ids with the page cache dropped. */
    if (engram_table_open(mst, "t", &mt) != 0)
        die("open");
    for (int rep = -1; rep < reps; rep++) {
        uint64_t seed = 1000 + (uint64_t)(rep + 1) * 7;
        double got[NV_MAX];
        for (int j = 0; j < nv; j++) {
            int x = (j + rep + 1) % nv;
            size_t n = x == V_PREAD || x == v_mmap ? slow : cold;
            drop_cache();
            rand_ids(ids, n, seed + (uint64_t)x, nrows);
            if (x == V_CACHE)
                got[x] = run_cache(root, cache_mib, qd, ids, n, k, out, &cs);
            else if (x == V_URING)
                got[x] = run_uring(qd, ids, n, align);
            else if (x == V_PREAD)
                got[x] = run_pread(ids, n, out);
            else if (x == v_mmap)
                got[x] = run_mmap(ids, n, out, (uint64_t)sb.st_size);
            else
                got[x] = run_pread_mt(pthreads[x - V_PTHR], ids, n, k, out);
            /* Check the rows of the cache and of the threaded pread
             * against the file through the mapping. */
            if (x == V_CACHE || (x >= V_PTHR && x < v_mmap)) {
                engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
                a.num_tokens = n < 2000 ? n : 2000;
                a.num_cols = 1;
                a.tables = &mt;
                a.ids = ids;
                a.id_type = ENGRAM_ID_INT64;
                a.out = out2;
                if (engram_lookup(mst, &a) != 0 || memcmp(out, out2, a.num_tokens * R) != 0) {
                    fprintf(stderr, "bench_filecache: %s returned wrong rows\n", vname[x]);
                    return 1;
                }
            }
        }
        if (rep < 0)
            printf("  warm-up (not counted):");
        else
            printf("  cold rep %d:", rep);
        for (int x = 0; x < nv; x++) {
            printf(" %s %.0f", vname[x], got[x]);
            if (rep >= 0)
                vr[x][rep] = got[x];
        }
        printf(" rows/s (first: %s; cache: %" PRIu64 " misses, %" PRIu64
               " reads, O_DIRECT %s; load %s)\n",
               vname[(rep + 1) % nv], cs.misses, cs.reads, cs.direct_tables ? "on" : "off",
               bench_loadavg_text());
        fflush(stdout);
    }
    engram_store_close(mst);

    /* Warm: a working set of half the cache's slots, all hits. */
    {
        uint64_t ws = ((cache_mib << 20) / 272) / 2;
        engram_table_id ct;
        int iters;
        o = (engram_store_options)ENGRAM_STORE_OPTIONS_INIT;
        o.flags = ENGRAM_OPEN_FILE_CACHE | ENGRAM_OPEN_PREFAULT;
        o.cache_bytes = cache_mib << 20;
        o.queue_depth = qd;
        o.threads = 1;
        if (engram_store_open(root, "bench", &o, &cst) != 0 || engram_table_open(cst, "t", &ct))
            die("open cache store");
        o.flags = ENGRAM_OPEN_PREFAULT;
        if (engram_store_open(root, "bench", &o, &mst) != 0 || engram_table_open(mst, "t", &mt))
            die("open mapped store");
        /* The working set: ws rows spread over the table. */
        for (size_t i = 0; i < 65536; i++) {
            uint64_t s = 77 + i;
            ids[i] = (int64_t)((rng(&s) % ws) * (nrows / ws));
        }
        for (int pass = 0; pass < 3; pass++) /* read all of it into the cache */
            time_lookups(cst, ct, ids, 65536, k, (int)(65536 / k), out);
        engram_get_cache_stats(cst, NULL, &cs);
        iters = (int)(2000000 / k) + 1;
        for (int rep = 0; rep < reps; rep++) {
            engram_cache_stats c0 = ENGRAM_CACHE_STATS_INIT, c1 = ENGRAM_CACHE_STATS_INIT;
            if (rep % 2)
                v_mem[rep] = time_lookups(mst, mt, ids, 65536, k, iters, out2);
            engram_get_cache_stats(cst, NULL, &c0);
            v_hit[rep] = time_lookups(cst, ct, ids, 65536, k, iters, out);
            engram_get_cache_stats(cst, NULL, &c1);
            if (rep % 2 == 0)
                v_mem[rep] = time_lookups(mst, mt, ids, 65536, k, iters, out2);
            printf("  warm rep %d: cache %.1f ns/row (hit rate %.4f)  mapped %.1f ns/row\n", rep,
                   v_hit[rep],
                   (double)(c1.hits - c0.hits) /
                       (double)(c1.hits - c0.hits + c1.misses - c0.misses),
                   v_mem[rep]);
        }
        if (memcmp(out, out2, k * R) != 0) {
            fprintf(stderr, "bench_filecache: warm rows differ from the mapped table\n");
            return 1;
        }
        engram_store_close(cst);
        engram_store_close(mst);
    }

    {
        double med[NV_MAX], lo[NV_MAX], hi[NV_MAX], h, mm;
        for (int x = 0; x < nv; x++) {
            med[x] = median(vr[x], reps); /* sorts vr[x] */
            lo[x] = vr[x][0];
            hi[x] = vr[x][reps - 1];
        }
        printf("\ncold random rows (rows/s, median [min, max] of %d; load %s):\n", reps,
               bench_loadavg_text());
        for (int x = 0; x < nv; x++) {
            printf("  %-11s %8.0f [%.0f, %.0f]", vname[x], med[x], lo[x], hi[x]);
            if (x != V_CACHE)
                printf("  cache/%s %.2fx", vname[x], med[V_CACHE] / med[x]);
            if (x == V_URING)
                printf(" (target >= 0.9x)");
            if (x == V_PREAD)
                printf(" (target >= 4x)");
            printf("\n");
        }
        h = median(v_hit, reps); /* sorts v_hit, so [0] is the least */
        mm = median(v_mem, reps);
        printf("warm all-hit lookups, K=%zu (ns/row, median [min, max]): cache %.1f [%.1f, %.1f]  "
               "mapped %.1f [%.1f, %.1f] -> %.2fx the mapped time (target <= 1.5x)\n",
               k, h, v_hit[0], v_hit[reps - 1], mm, v_mem[0], v_mem[reps - 1], h / mm);
        printf("load average at end: %s\n", bench_loadavg_text());
    }
    free(buf);
    free(ids);
    free(out);
    free(out2);
    return 0;
}
