/*
 * usage.c - who holds a table file's memory: the processes that map it,
 * their resident and proportional (PSS) shares, and the memory cgroup its
 * pages are charged to.
 *
 * The processes come from /proc/<pid>/maps (entries of the file's device
 * and inode), their shares from the matching entries of
 * /proc/<pid>/smaps.  Processes whose maps this one may not read (other
 * users, without privilege) are counted apart.
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

/* The Pss and Rss of the entries of `pid`'s smaps that map dev:ino. */
static int smaps_share(const char *pid, unsigned maj, unsigned min, unsigned long ino,
                       uint64_t *rss, uint64_t *pss)
{
    char path[300], line[512];
    int inside = 0;
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
            continue;
        }
        if (!inside)
            continue;
        if (sscanf(line, "Rss: %llu kB", &kb) == 1)
            *rss += kb * 1024;
        else if (sscanf(line, "Pss: %llu kB", &kb) == 1)
            *pss += kb * 1024;
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

static void processes(const struct stat *sb, engram_table_usage *u)
{
    unsigned maj = major(sb->st_dev), min = minor(sb->st_dev);
    char self[32];
    struct dirent *de;
    DIR *d = opendir("/proc");
    snprintf(self, sizeof self, "%ld", (long)getpid());
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        uint64_t rss = 0, pss = 0;
        int r;
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        r = maps_file(de->d_name, maj, min, (unsigned long)sb->st_ino);
        if (r < 0) {
            /* Gone, or not ours to read: only the latter counts. */
            char path[300];
            snprintf(path, sizeof path, "/proc/%s", de->d_name);
            if (access(path, F_OK) == 0)
                u->unreadable++;
            continue;
        }
        if (r == 0 || smaps_share(de->d_name, maj, min, (unsigned long)sb->st_ino, &rss, &pss))
            continue;
        u->processes++;
        u->total_pss_bytes += pss;
        if (strcmp(de->d_name, self) == 0) {
            u->rss_bytes = rss;
            u->pss_bytes = pss;
        }
    }
    closedir(d);
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
    processes(&sb, u);
    charged_cgroup(fd, &sb, u);
    close(fd);
    return 0;
}
