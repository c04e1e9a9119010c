/*
 * capacity.c - whether new table files fit, asked before the first byte
 * is written.
 *
 * Two limits stop a populate half way, and both are found late without
 * this check: the file system of the namespace (a container's 64 MiB
 * /dev/shm), and, for a tmpfs namespace, the memory cgroup of the writing
 * process: tmpfs pages are charged to the cgroup of the process that first
 * touches them, so populating 100 GiB of tables from a process limited to
 * 64 GiB gets it killed by the kernel, with nothing written to say why.
 *
 * The file system's free space comes from fstatvfs on the namespace's own
 * descriptor.  The cgroup's room is its limit less its usage, plus the
 * page cache it could give back (file pages that are not tmpfs), for the
 * process's memory cgroup and each ancestor with a limit (cgroup v2, or
 * v1's memory controller), found through /proc/self/cgroup and
 * /proc/self/mountinfo.  Both are estimates taken at one moment: the
 * writer still reserves its file's blocks at begin (fallocate), which is
 * the last word on the file system.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "capacity.h"
#include "common.h"
#include "fsutil.h"

#define TMPFS_MAGIC_ 0x01021994
/* cgroup v1 writes "no limit" as a huge page-rounded number. */
#define NO_LIMIT (UINT64_C(1) << 62)

static void fmt_bytes(char *buf, size_t cap, uint64_t b)
{
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%" PRIu64 " bytes", b);
    else
        snprintf(buf, cap, "%.1f %s", v, unit[u]);
}

uint64_t engram__table_file_bytes(const engram_table_spec *spec, uint64_t block)
{
    uint64_t data = 0;
    if (block == 0)
        block = 4096;
    if (engram__spec_size(spec, &data) != 0)
        return UINT64_MAX;
    /* The header's block, and the data region (the padding between them
     * stays a hole). */
    if (data > UINT64_MAX - block)
        return UINT64_MAX;
    return block + engram__align_up(data, block);
}

/* Reads up to cap - 1 bytes of file `path` into buf (NUL-ended): 0 or
 * -1. */
static int read_small(const char *path, char *buf, size_t cap)
{
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return 0;
}

static int read_u64(const char *path, uint64_t *v)
{
    char buf[64], *end;
    if (read_small(path, buf, sizeof buf) != 0)
        return -1;
    if (strncmp(buf, "max", 3) == 0) {
        *v = UINT64_MAX;
        return 0;
    }
    errno = 0;
    *v = strtoull(buf, &end, 10);
    return errno || end == buf ? -1 : 0;
}

/* Value of `key` in a memory.stat file ("key value" lines); 0 if absent. */
static uint64_t stat_value(const char *stat, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = stat; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, key, kl) == 0 && p[kl] == ' ')
            return strtoull(p + kl + 1, NULL, 10);
    return 0;
}

/* The memory cgroup of this process: the directory its files are in
 * (mount point + path below the mount's root), and whether it is v2. */
typedef struct memcg {
    char dir[PATH_MAX];
    size_t top; /* length of the mount point: the walk up stops there */
    int v2;
} memcg;

/* Finds the process's memory cgroup: 0 and *cg, or -1 (none, or not
 * readable: the check is then skipped). */
static int memcg_find(memcg *cg)
{
    char line[4096], path[PATH_MAX] = "", v1path[PATH_MAX] = "";
    int have_v2 = 0, have_v1 = 0;
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        char *ctrl = strchr(line, ':'), *p;
        if (!ctrl || !(p = strchr(ctrl + 1, ':')))
            continue;
        *p++ = '\0';
        p[strcspn(p, "\n")] = '\0';
        ctrl++;
        if (strcmp(line, "0") == 0 && *ctrl == '\0') {
            snprintf(path, sizeof path, "%s", p);
            have_v2 = 1;
        } else {
            /* v1: the hierarchy whose controllers include memory. */
            for (char *c = ctrl, *save = NULL, *tok; (tok = strtok_r(c, ",", &save)); c = NULL)
                if (strcmp(tok, "memory") == 0) {
                    snprintf(v1path, sizeof v1path, "%s", p);
                    have_v1 = 1;
                }
        }
    }
    fclose(f);
    if (!have_v1 && !have_v2)
        return -1;
    /* The mount of that hierarchy: mountinfo's 4th field is the path of
     * the hierarchy mounted there, the 5th the mount point, and after
     * " - " the file system type and its options. */
    if (!(f = fopen("/proc/self/mountinfo", "re")))
        return -1;
    while (fgets(line, sizeof line, f)) {
        char root[PATH_MAX], mnt[PATH_MAX], type[64], opts[1024];
        const char *want, *dash = strstr(line, " - ");
        size_t rl;
        int v2;
        if (!dash || sscanf(line, "%*s %*s %*s %4095s %4095s", root, mnt) != 2 ||
            sscanf(dash + 3, "%63s %*s %1023s", type, opts) != 2)
            continue;
        /* v1's memory controller where there is one (a hybrid system's
         * v2 hierarchy has no memory controller), else v2. */
        v2 = strcmp(type, "cgroup2") == 0;
        if (v2 && (!have_v2 || have_v1))
            continue;
        if (!v2 && (strcmp(type, "cgroup") != 0 || !have_v1 || !strstr(opts, "memory")))
            continue;
        want = v2 ? path : v1path;
        /* The cgroup's path below the mounted root. */
        rl = strcmp(root, "/") == 0 ? 0 : strlen(root);
        if (rl && strncmp(want, root, rl) != 0)
            continue;
        if ((size_t)snprintf(cg->dir, sizeof cg->dir, "%s%s", mnt, want + rl) >= sizeof cg->dir)
            continue;
        cg->top = strlen(mnt);
        cg->v2 = v2;
        while (strlen(cg->dir) > cg->top + 1 && cg->dir[strlen(cg->dir) - 1] == '/')
            cg->dir[strlen(cg->dir) - 1] = '\0';
        fclose(f);
        return 0;
    }
    fclose(f);
    return -1;
}

int engram__memcg_dir(char *dir, size_t cap, int *v2)
{
    memcg cg;
    if (memcg_find(&cg) != 0 || (size_t)snprintf(dir, cap, "%s", cg.dir) >= cap)
        return -1;
    *v2 = cg.v2;
    return 0;
}

/* The room of the tightest limit from the process's memory cgroup up:
 * 0 with *room, *limit and the limiting cgroup's directory in `where`,
 * or -1 (no cgroup, or no limit anywhere). */
static int memcg_room(uint64_t *room, uint64_t *limit, char *where, size_t cap)
{
    memcg cg;
    int found = 0;
    if (memcg_find(&cg) != 0)
        return -1;
    for (;;) {
        char file[PATH_MAX + 32], stat[8192];
        uint64_t max, cur, back = 0;
        snprintf(file, sizeof file, "%s/%s", cg.dir, cg.v2 ? "memory.max" : "memory.limit_in_bytes");
        if (read_u64(file, &max) == 0 && max < NO_LIMIT) {
            snprintf(file, sizeof file, "%s/%s", cg.dir,
                     cg.v2 ? "memory.current" : "memory.usage_in_bytes");
            if (read_u64(file, &cur) == 0) {
                snprintf(file, sizeof file, "%s/memory.stat", cg.dir);
                if (read_small(file, stat, sizeof stat) == 0) {
                    /* Page cache it can drop: file pages less tmpfs. */
                    uint64_t fl = stat_value(stat, cg.v2 ? "file" : "cache");
                    uint64_t sh = stat_value(stat, "shmem");
                    back = fl > sh ? fl - sh : 0;
                }
                {
                    uint64_t r = max > cur ? max - cur : 0;
                    r = r > UINT64_MAX - back ? UINT64_MAX : r + back;
                    if (r > max)
                        r = max;
                    if (!found || r < *room) {
                        *room = r;
                        *limit = max;
                        snprintf(where, cap, "%s", cg.dir);
                        found = 1;
                    }
                }
            }
        }
        /* Up one level, not above the mount point. */
        {
            char *slash = strrchr(cg.dir, '/');
            if (!slash || (size_t)(slash - cg.dir) < cg.top || strlen(cg.dir) <= cg.top)
                break;
            *slash = '\0';
        }
    }
    return found ? 0 : -1;
}

int engram__capacity_check(int dirfd, const char *path, uint64_t bytes, const char *what,
                           int plural)
{
    const char *needs = plural ? "need" : "needs";
    struct statvfs vs;
    struct statfs fs;
    char need[32], have[32], total[32];
    uint64_t avail, size;
    int tmpfs;

    if (fstatvfs(dirfd, &vs) != 0)
        return 0; /* unknown: the reservation at begin decides */
    avail = (uint64_t)vs.f_bavail * vs.f_frsize;
    size = (uint64_t)vs.f_blocks * vs.f_frsize;
    tmpfs = fstatfs(dirfd, &fs) == 0 && (unsigned long)fs.f_type == TMPFS_MAGIC_;
    fmt_bytes(need, sizeof need, bytes);
    fmt_bytes(have, sizeof have, avail);
    fmt_bytes(total, sizeof total, size);
    if (bytes > avail) {
        if (tmpfs)
            return engram__err(-ENOSPC, "%s %s %s but the tmpfs of %s has %s free (of %s): "
                               "give it more room (a container's /dev/shm: docker run "
                               "--shm-size=SIZE; or mount -o remount,size=SIZE), or keep the "
                               "tables on a disk and open the namespace with the row cache "
                               "(ENGRAM_OPEN_FILE_CACHE; Python: file_cache=True)",
                               what, needs, need, path, have, total);
        return engram__err(-ENOSPC, "%s %s %s but the file system of %s has %s free (of %s)",
                           what, needs, need, path, have, total);
    }
    if (tmpfs) {
        char where[PATH_MAX], room_s[32], limit_s[32];
        uint64_t room = 0, limit = 0;
        if (memcg_room(&room, &limit, where, sizeof where) == 0 && bytes > room) {
            fmt_bytes(room_s, sizeof room_s, room);
            fmt_bytes(limit_s, sizeof limit_s, limit);
            return engram__err(-ENOSPC, "%s %s %s of tmpfs in %s, which is charged to the "
                               "memory cgroup of the process that writes it, and %s has %s left "
                               "of its %s limit: the kernel would kill this process part way. "
                               "Raise the limit, write the tables from a process with room "
                               "(processes that only map them later are not charged), or keep "
                               "them on a disk with the row cache (ENGRAM_OPEN_FILE_CACHE)",
                               what, needs, need, path, where, room_s, limit_s);
        }
    }
    return 0;
}

int engram_check_capacity(const char *dir, const engram_table_spec *specs, size_t n)
{
    struct statvfs vs;
    uint64_t sum = 0;
    char what[64];
    int fd, err;
    if (!dir || (n && !specs))
        return engram__err(-EINVAL, "a directory and the specs are required");
    if ((fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return engram__errno(errno, "open %s", dir);
    if (fstatvfs(fd, &vs) != 0)
        vs.f_frsize = 4096;
    for (size_t i = 0; i < n; i++) {
        uint64_t b;
        if ((err = engram_spec_check(&specs[i])) != 0) {
            close(fd);
            return err;
        }
        b = engram__table_file_bytes(&specs[i], vs.f_frsize);
        sum = sum > UINT64_MAX - b ? UINT64_MAX : sum + b;
    }
    if (n == 1)
        snprintf(what, sizeof what, "the table");
    else
        snprintf(what, sizeof what, "%zu tables", n);
    err = engram__capacity_check(fd, dir, sum, what, n != 1);
    close(fd);
    return err;
}
