/*
 * usage.c - who holds a table file's memory: the processes that map it,
 * their resident and proportional (PSS) shares, and the memory cgroup its
 * pages are charged to.
 *
 * The processes come from /proc/<pid>/maps (entries of the file's device
 * and inode), their shares from the matching entries of
 * /proc/<pid>/smaps.  Processes whose maps this one may not read (other
 * users without privilege, and some a container keeps from its own root,
 * such as its PID 1) are counted apart, and a second pass tells whether
 * they may map any of the file (unreadable_may_map(): the PSS check).
 *
 * The cgroup: the kernel charges a tmpfs (or page cache) page to the
 * memory cgroup of the process that first brought it in, and keeps it
 * there.  A sample of the file's resident pages is mapped here, their
 * page frames read from /proc/self/pagemap and their cgroups from
 * /proc/kpagecgroup (both need CAP_SYS_ADMIN; without it the cgroup is
 * left unknown), and the cgroup's inode is found in the cgroup file
 * system.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "capacity.h"
#include "common.h"
#include "fsutil.h"
#include "store.h"

#define SAMPLE_PAGES 256

/* What a process's smaps say of one file: the sums over its entries of the
 * file, and the Rss of one of them, [lo, hi), if it is asked for. */
typedef struct file_share {
    uint64_t rss, pss;  /* bytes, over the entries of the file */
    unsigned entries;   /* the entries of the file */
    uintptr_t lo, hi;   /* the entry to report apart (0, 0: none) */
    int found;          /* 1 if an entry of the file is exactly [lo, hi) */
    uint64_t entry_rss; /* its Rss */
} file_share;

/* Adds the entries of `pid`'s smaps that map dev:ino to *s. */
static int smaps_share(const char *pid, unsigned maj, unsigned min, unsigned long ino,
                       file_share *s)
{
    char path[300], line[512];
    int inside = 0, apart = 0;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%s/smaps", pid);
    if (!(f = fopen(path, "re")))
        return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b, i;
        unsigned ma, mi;
        unsigned long long kb;
        if (sscanf(line, "%lx-%lx %*s %*s %x:%x %lu", &a, &b, &ma, &mi, &i) == 5) {
            inside = ma == maj && mi == min && i == ino;
            apart = inside && s->hi && a == s->lo && b == s->hi;
            s->entries += (unsigned)inside;
            s->found |= apart;
            continue;
        }
        if (!inside)
            continue;
        if (sscanf(line, "Rss: %llu kB", &kb) == 1) {
            s->rss += kb * 1024;
            if (apart)
                s->entry_rss = kb * 1024;
        } else if (sscanf(line, "Pss: %llu kB", &kb) == 1) {
            s->pss += kb * 1024;
        }
    }
    fclose(f);
    return 0;
}

/* 1 if `pid`'s maps hold dev:ino, 0 if not, -1 if they cannot be read. */
static int maps_file(const char *pid, unsigned maj, unsigned min, unsigned long ino)
{
    char path[300], line[512];
    int found = 0;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%s/maps", pid);
    if (!(f = fopen(path, "re")))
        return -1;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long i;
        unsigned ma, mi;
        found = sscanf(line, "%*x-%*x %*s %*s %x:%x %lu", &ma, &mi, &i) == 3 && ma == maj &&
                mi == min && i == ino;
    }
    /* A process that exited meanwhile, or maps we may not read, read as
     * empty: an error only if nothing could be read at all. */
    if (ferror(f)) {
        fclose(f);
        return -1;
    }
    fclose(f);
    return found;
}

/* The processes the first pass found mapping the file, for the PSS check. */
typedef struct mapper_list {
    pid_t *pids;
    size_t n, cap;
    int lost;         /* 1 if one could not be recorded (no memory) */
    unsigned entries; /* their smaps entries of the file */
} mapper_list;

static void mapper_list_add(mapper_list *l, pid_t pid)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        pid_t *p = realloc(l->pids, cap * sizeof *p);
        if (!p) {
            l->lost = 1;
            return;
        }
        l->pids = p;
        l->cap = cap;
    }
    l->pids[l->n++] = pid;
}

/* 1 if /proc/<pid> is still there: a process whose maps or smaps could
 * not be read is one this process may not read, unless it just exited. */
static int still_there(const char *pid)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%s", pid);
    return access(path, F_OK) == 0;
}

static void processes(const struct stat *sb, engram_table_usage *u, mapper_list *mappers)
{
    unsigned maj = major(sb->st_dev), min = minor(sb->st_dev);
    char self[32];
    struct dirent *de;
    DIR *d = opendir("/proc");
    snprintf(self, sizeof self, "%ld", (long)getpid());
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        file_share s = {0};
        int r;
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        r = maps_file(de->d_name, maj, min, (unsigned long)sb->st_ino);
        if (r < 0) {
            if (still_there(de->d_name))
                u->unreadable++;
            continue;
        }
        if (r == 0 || smaps_share(de->d_name, maj, min, (unsigned long)sb->st_ino, &s))
            continue;
        u->processes++;
        u->total_pss_bytes += s.pss;
        mappers->entries += s.entries;
        mapper_list_add(mappers, (pid_t)strtol(de->d_name, NULL, 10));
        if (strcmp(de->d_name, self) == 0) {
            u->rss_bytes = s.rss;
            u->pss_bytes = s.pss;
        }
    }
    closedir(d);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older kernels refuse it with EINVAL */
#endif

/* Counts the resident pages of [map, map + len) (a file mapping), and if
 * `populate`, maps them into this process, and only them: mincore() tells
 * which they are (of a shared file mapping, the file's pages in memory,
 * whoever maps them), a window of PROBE_WINDOW pages at a time, and each
 * run of them is mapped with MADV_POPULATE_READ (or read a byte a page
 * where the kernel lacks it).  A page that is not resident is never read:
 * in a tmpfs file that would allocate it.  The count, or -1. */
#define PROBE_WINDOW 65536

static int64_t resident_pages(unsigned char *map, size_t len, size_t pg, int populate)
{
    size_t npages = (len + pg - 1) / pg;
    unsigned char *vec = malloc(npages < PROBE_WINDOW ? npages : PROBE_WINDOW);
    int64_t resident = -1, count = 0;
    int madv = 1;
    if (!vec)
        return -1;
    for (size_t w = 0; w < npages; w += PROBE_WINDOW) {
        size_t n = npages - w < PROBE_WINDOW ? npages - w : PROBE_WINDOW;
        size_t bytes = w + n == npages ? len - w * pg : n * pg;
        if (mincore(map + w * pg, bytes, vec) != 0)
            goto out;
        for (size_t i = 0; i < n;) {
            size_t j = i;
            if (!(vec[i] & 1)) {
                i++;
                continue;
            }
            while (j < n && (vec[j] & 1))
                j++;
            if (populate && madv &&
                madvise(map + (w + i) * pg, (j - i) * pg, MADV_POPULATE_READ) != 0) {
                if (errno != EINVAL)
                    goto out;
                madv = 0;
            }
            if (populate && !madv) {
                volatile unsigned char sink = 0;
                for (size_t p = i; p < j; p++)
                    sink ^= map[(w + p) * pg];
                (void)sink;
            }
            count += (int64_t)(j - i);
            i = j;
        }
    }
    resident = count;
out:
    free(vec);
    return resident;
}

/* 1 if `pss`, summed over `entries` smaps entries that map some of
 * `resident` pages, is all of them: smaps rounds each entry's PSS down to
 * a kB, and the kernel each page's share down to 1/4096 byte. */
static int pss_is_all(uint64_t pss, unsigned entries, int64_t resident, size_t pg)
{
    uint64_t all = (uint64_t)resident * pg;
    uint64_t slack = (uint64_t)entries * (1024 + (uint64_t)resident / 4096 + 1);
    return pss <= all && all - pss <= slack;
}

/*
 * The PSS check: whether the processes this one could not read may map
 * any of the file's resident pages (1), or are shown to map none (0).
 *
 * The kernel splits each resident page among the mappings that map it
 * (1/n of it to each of n) in their PSS, so the PSS of all the mappings
 * of the file, in every process, adds up to the pages some mapping maps,
 * no more than the file's resident pages.  So:
 *  1. If the PSS of the readable processes (the first pass's) is all the
 *     resident pages, nothing is left for the others.  Only mincore() is
 *     needed: the usual case of ranks that have read the whole table.
 *  2. Else a probe mapping here maps every resident page, so that some
 *     mapping maps each of them, and the readable processes' PSS is read
 *     again with it in place (this process's mappings, the probe's
 *     included): it falls short of all the resident pages by the share of
 *     the processes that could not be read.
 * "All" is within smaps' rounding (pss_is_all()).  A mapping that changed
 * in between (a process that maps the file after the first pass, pages
 * faulted in after mincore()) makes the sums disagree the other way or
 * beyond the rounding: the answer is then 1, as it is whenever the check
 * cannot be made.  The first pass's figures in *u are left as they were:
 * the probe takes a share of every page only while the check runs.
 *
 * Cost: step 1, mincore() over the file; step 2, a page-table entry per
 * resident page (MADV_POPULATE_READ over each run of them: no page is
 * copied or allocated), then a read of the smaps of this process and of
 * each process that maps the file, which the kernel computes by walking
 * the page tables of the mapping (docs/operations.md has figures).
 */
static int unreadable_may_map(int fd, const struct stat *sb, const engram_table_usage *u,
                              const mapper_list *mappers)
{
    unsigned maj = major(sb->st_dev), min = minor(sb->st_dev);
    unsigned long ino = (unsigned long)sb->st_ino;
    long pgl = sysconf(_SC_PAGESIZE);
    size_t len = (size_t)sb->st_size, pg, span;
    file_share s = {0};
    unsigned char *map;
    int64_t resident;
    char self[32];
    int may = 1;
    if (len == 0)
        return 0; /* no page: nothing to map */
    if (mappers->lost || pgl <= 0)
        return 1;
    pg = (size_t)pgl;
    span = (len + pg - 1) / pg * pg;
    map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return 1;
    /* 1. */
    if ((resident = resident_pages(map, len, pg, 0)) < 0)
        goto out;
    if (pss_is_all(u->total_pss_bytes, mappers->entries, resident, pg)) {
        may = 0;
        goto out;
    }
    /* 2. */
    if ((resident = resident_pages(map, len, pg, 1)) < 0)
        goto out;
    s.lo = (uintptr_t)map;
    s.hi = (uintptr_t)map + span;
    snprintf(self, sizeof self, "%ld", (long)getpid());
    if (smaps_share(self, maj, min, ino, &s) != 0 || !s.found)
        goto out; /* the probe merged with a neighbouring entry: no Rss of its own */
    /* The others' entries are summed without [lo, hi): a process forked
     * from this one may well have mapped the file at the probe's address. */
    for (size_t i = 0; i < mappers->n; i++) {
        file_share o = {0};
        char pid[32];
        if (mappers->pids[i] == getpid())
            continue;
        snprintf(pid, sizeof pid, "%ld", (long)mappers->pids[i]);
        /* One that exited since maps nothing now: its pages' shares went
         * to the others. */
        if (smaps_share(pid, maj, min, ino, &o) != 0) {
            if (still_there(pid))
                goto out;
            continue;
        }
        s.pss += o.pss;
        s.entries += o.entries;
    }
    /* The probe maps every page counted: its Rss is them all. */
    if (s.entry_rss == (uint64_t)resident * pg)
        may = !pss_is_all(s.pss, s.entries, resident, pg);
out:
    munmap(map, len);
    return may;
}

/* The cgroup directory whose inode is `ino` under `top`, found by a walk. */
static unsigned long find_ino;
static char found_path[PATH_MAX];

static int find_cb(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type == FTW_D && (unsigned long)sb->st_ino == find_ino) {
        snprintf(found_path, sizeof found_path, "%s", path);
        return 1;
    }
    return 0;
}

static pthread_mutex_t find_lock = PTHREAD_MUTEX_INITIALIZER;

static int cgroup_path(unsigned long ino, char *out, size_t cap)
{
    char dir[PATH_MAX];
    int v2, r;
    if (engram__memcg_dir(dir, sizeof dir, &v2) != 0)
        return -1;
    /* The walk starts at the top of the hierarchy: the mount point. */
    {
        char probe[PATH_MAX];
        snprintf(probe, sizeof probe, "%s", dir);
        for (;;) {
            char *slash = strrchr(probe, '/');
            char file[PATH_MAX + 32];
            struct stat sb;
            if (!slash || slash == probe)
                break;
            *slash = '\0';
            snprintf(file, sizeof file, "%s/%s", probe,
                     v2 ? "cgroup.controllers" : "memory.limit_in_bytes");
            if (stat(file, &sb) != 0) {
                *slash = '/';
                break;
            }
            snprintf(dir, sizeof dir, "%s", probe);
        }
    }
    pthread_mutex_lock(&find_lock);
    find_ino = ino;
    found_path[0] = '\0';
    r = nftw(dir, find_cb, 16, FTW_PHYS | FTW_MOUNT);
    if (r == 1)
        snprintf(out, cap, "%s", found_path);
    pthread_mutex_unlock(&find_lock);
    return r == 1 ? 0 : -1;
}

/* The memory cgroup most of a sample of the file's resident pages is
 * charged to (u->cgroup, u->cgroup_pages of u->sampled_pages). */
static void charged_cgroup(int fd, const struct stat *sb, engram_table_usage *u)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t len = (size_t)sb->st_size, npages, step;
    unsigned char *vec = NULL;
    unsigned long inos[SAMPLE_PAGES];
    unsigned counts[SAMPLE_PAGES];
    int nino = 0, pm = -1, kc = -1;
    volatile unsigned char sink = 0;
    unsigned char *map;
    if (len == 0 || pg <= 0)
        return;
    map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return;
    npages = (len + (size_t)pg - 1) / (size_t)pg;
    step = npages / SAMPLE_PAGES ? npages / SAMPLE_PAGES : 1;
    if (!(vec = malloc(npages)) || mincore(map, len, vec) != 0)
        goto out;
    if ((pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC)) < 0 ||
        (kc = open("/proc/kpagecgroup", O_RDONLY | O_CLOEXEC)) < 0)
        goto out;
    for (size_t p = 0; p < npages && u->sampled_pages < SAMPLE_PAGES; p += step) {
        uint64_t ent, cg;
        if (!(vec[p] & 1))
            continue; /* not resident: never charged (a hole) or swapped */
        sink ^= map[p * (size_t)pg]; /* map the resident page here */
        if (pread(pm, &ent, sizeof ent, (off_t)(p * sizeof ent + ((uintptr_t)map / (uintptr_t)pg) * sizeof ent)) != sizeof ent ||
            !(ent >> 63) || (ent & ((UINT64_C(1) << 55) - 1)) == 0)
            goto out; /* no page frame numbers without CAP_SYS_ADMIN */
        if (pread(kc, &cg, sizeof cg, (off_t)((ent & ((UINT64_C(1) << 55) - 1)) * 8)) != sizeof cg)
            goto out;
        u->sampled_pages++;
        {
            int i;
            for (i = 0; i < nino && inos[i] != (unsigned long)cg; i++)
                ;
            if (i == nino) {
                inos[nino] = (unsigned long)cg;
                counts[nino++] = 0;
            }
            counts[i]++;
        }
    }
    if (nino) {
        int best = 0;
        for (int i = 1; i < nino; i++)
            if (counts[i] > counts[best])
                best = i;
        u->cgroup_pages = counts[best];
        if (inos[best] == 0 || cgroup_path(inos[best], u->cgroup, sizeof u->cgroup) != 0)
            snprintf(u->cgroup, sizeof u->cgroup, "(cgroup inode %lu)", inos[best]);
    }
out:
    (void)sink;
    if (pm >= 0)
        close(pm);
    if (kc >= 0)
        close(kc);
    free(vec);
    munmap(map, len);
}

int engram_get_table_usage(engram_store *st, const char *name, engram_table_usage *u)
{
    mapper_list mappers = {0};
    struct stat sb;
    int fd, err;
    if (!st || !u || u->size != sizeof(engram_table_usage))
        return engram__err(-EINVAL, "store and usage (with size = sizeof(engram_table_usage)) "
                                    "are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    memset(u, 0, sizeof *u);
    u->size = sizeof *u;
    if (st->dirfd < 0)
        return engram__err(-ENOENT, "table '%s': a memory store has no table files", name);
    if ((fd = engram__open_entry(st->dirfd, st->path, st->uid, name, O_RDONLY, &sb)) < 0)
        return fd;
    u->file_bytes = (uint64_t)sb.st_blocks * 512u;
    processes(&sb, u, &mappers);
    if (u->unreadable)
        u->unreadable_may_map = (uint32_t)unreadable_may_map(fd, &sb, u, &mappers);
    charged_cgroup(fd, &sb, u);
    free(mappers.pids);
    close(fd);
    return 0;
}
