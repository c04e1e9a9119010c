/*
 * bench_filecache.c - cold and warm lookups of a table file through the
 * row cache (ENGRAM_OPEN_FILE_CACHE), each against baselines measured in
 * the same run on the same file.
 *
 *   bench_filecache [--dir DIR] [--size-mib N] [--cache-mib N] [--qd N]
 *                   [--reps N] [--cold-rows N] [--slow-rows N] [--k N]
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
 *   pread    one pread() of the row per id, buffered
 *   mmap     a read-only mapping with MADV_RANDOM, one row copy per id
 * Warm: a working set of rows that fits the cache is read once, then
 * lookups of K random ids from it (all hits) are timed against the same
 * lookups on a store that maps the table (ENGRAM_OPEN_PREFAULT).
 * Every figure is the median of --reps repetitions; ratios are taken
 * between medians of this run.  Rows returned by the cache are checked
 * against the mapped table.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

#include "engram.h"

#define R 264
#define MAXREP 31

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

static char path[4096];
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

static void rand_ids(int64_t *ids, size_t n, uint64_t seed, uint64_t range)
{
    for (size_t i = 0; i < n; i++)
        ids[i] = (int64_t)(rng(&seed) % range);
}

/* Rows/s of cold lookups through a fresh cache store. */
static double run_cache(const char *root, uint64_t cache_mib, unsigned qd, const int64_t *ids,
                        size_t n, size_t k, unsigned char *out, engram_cache_stats *cs)
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
    if (engram_store_open(root, "bench", &o, &st) != 0 || engram_table_open(st, "t", &tid) != 0)
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
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0 || io_uring_queue_init(qd, &ring, 0) != 0 ||
        posix_memalign((void **)&buf, 4096, slot * qd) != 0) {
        fprintf(stderr, "bench_filecache: io_uring O_DIRECT reader: %s\n", strerror(errno));
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
    char root[2048];
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *wst, *mst, *cst;
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    engram_table_spec spec;
    engram_writer *w;
    engram_cache_stats cs = ENGRAM_CACHE_STATS_INIT;
    unsigned char *buf, *out, *out2;
    int64_t *ids;
    double v_cache[MAXREP], v_uring[MAXREP], v_pread[MAXREP], v_mmap[MAXREP];
    double v_hit[MAXREP], v_mem[MAXREP];
    unsigned align = 512;
    struct stat sb;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
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
        else {
            fprintf(stderr, "bench_filecache: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (reps < 1 || reps > MAXREP || k < 1 || cold < k || size_mib < 1 || qd < 1) {
        fprintf(stderr, "bench_filecache: bad parameters\n");
        return 2;
    }

    /* The table, streamed in 8 MiB chunks of pattern rows. */
    snprintf(root, sizeof root, "%s/engram-bench-fc.%d", dir, (int)getpid());
    o.flags = ENGRAM_OPEN_CREATE;
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

    ids = malloc(sizeof *ids * (cold > 65536 ? cold : 65536));
    out = malloc(R * (cold > 65536 ? cold : 65536));
    out2 = malloc(R * (cold > 65536 ? cold : 65536));
    o = (engram_store_options)ENGRAM_STORE_OPTIONS_INIT;
    o.threads = 1;
    if (engram_store_open(root, "bench", &o, &mst) != 0)
        die("open mapped store");

    /* Rep -1 is a warm-up, not counted: the first cold reads after the
     * file was written run slower here, whichever reader goes first.  The
     * cache and the bare reader then take turns going first. */
    for (int rep = -1; rep < reps; rep++) {
        uint64_t seed = 1000 + (uint64_t)(rep + 1) * 7;
        engram_table_id mt;
        double vc, vu = 0;
        if (rep % 2 != 0) {
            drop_cache();
            rand_ids(ids, cold, seed + 1, nrows);
            vu = run_uring(qd, ids, cold, align);
        }
        drop_cache();
        rand_ids(ids, cold, seed, nrows);
        vc = run_cache(root, cache_mib, qd, ids, cold, k, out, &cs);
        /* Check the cache's rows against the file through the mapping. */
        if (engram_table_open(mst, "t", &mt) != 0)
            die("open");
        {
            engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
            a.num_tokens = 2000;
            a.num_cols = 1;
            a.tables = &mt;
            a.ids = ids;
            a.id_type = ENGRAM_ID_INT64;
            a.out = out2;
            if (engram_lookup(mst, &a) != 0 || memcmp(out, out2, 2000 * R) != 0) {
                fprintf(stderr, "bench_filecache: the cache returned wrong rows\n");
                return 1;
            }
        }
        if (rep % 2 == 0) {
            drop_cache();
            rand_ids(ids, cold, seed + 1, nrows);
            vu = run_uring(qd, ids, cold, align);
        }
        if (rep < 0) {
            printf("  warm-up: cache %.0f  uring %.0f rows/s (not counted)\n", vc, vu);
            continue;
        }
        v_cache[rep] = vc;
        v_uring[rep] = vu;
        drop_cache();
        rand_ids(ids, slow, seed + 2, nrows);
        v_pread[rep] = run_pread(ids, slow, out);
        drop_cache();
        rand_ids(ids, slow, seed + 3, nrows);
        v_mmap[rep] = run_mmap(ids, slow, out, (uint64_t)sb.st_size);
        printf("  cold rep %d: cache %.0f  uring %.0f  pread %.0f  mmap %.0f rows/s"
               " (cache: %" PRIu64 " misses, %" PRIu64 " reads, O_DIRECT %s)\n",
               rep, v_cache[rep], v_uring[rep], v_pread[rep], v_mmap[rep], cs.misses, cs.reads,
               cs.direct_tables ? "on" : "off");
        fflush(stdout);
    }
    engram_store_close(mst);

    /* Warm: a working set of half the cache's slots, all hits. */
    {
        uint64_t ws = ((cache_mib << 20) / 272) / 2;
        engram_table_id ct, mt;
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
            engram_get_cache_stats(cst, NULL, &c0);
            v_hit[rep] = time_lookups(cst, ct, ids, 65536, k, iters, out);
            engram_get_cache_stats(cst, NULL, &c1);
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
        double c = median(v_cache, reps), u = median(v_uring, reps), p = median(v_pread, reps),
               m = median(v_mmap, reps), h = median(v_hit, reps), mm = median(v_mem, reps);
        printf("\ncold random rows (medians of %d, rows/s):\n", reps);
        printf("  cache %.0f  io_uring O_DIRECT %.0f  pread %.0f  mmap+MADV_RANDOM %.0f\n", c, u,
               p, m);
        printf("  cache/io_uring %.2fx (target >= 0.9x)  cache/pread %.2fx (target >= 4x)  "
               "cache/mmap %.2fx\n",
               c / u, c / p, c / m);
        printf("warm all-hit lookups, K=%zu (medians, ns/row): cache %.1f  mapped %.1f  "
               "-> %.2fx the mapped time (target <= 1.5x)\n",
               k, h, mm, h / mm);
    }
    {
        char cmd[8300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_filecache: could not remove %s\n", root);
    }
    free(buf);
    free(ids);
    free(out);
    free(out2);
    return 0;
}
