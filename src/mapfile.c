/*
 * mapfile.c - memory sources of table files: how a table file's rows get
 * into memory, and what we got.
 *
 * The default is a read-only MAP_SHARED mapping of the data region: every
 * process of the node then shares the same physical pages (on tmpfs, the
 * file's own pages).  Options add MAP_POPULATE (no first-touch faults on
 * the lookup path), MADV_RANDOM (no readahead for files on disk), mlock,
 * or a private anonymous copy backed by transparent huge pages, for hosts
 * where the shared file cannot get huge pages (tmpfs with shmem_enabled
 * =never) and one TLB miss per row would dominate.
 *
 * Coverage is read back from /proc/self/smaps, because madvise() only
 * asks: the stats must report what the kernel actually gave.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "xxh.h"

#include "common.h"
#include "fsutil.h"
#include "mapfile.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define HUGE_SZ ((size_t)2 << 20)

/* A mapped table's state. */
typedef struct mapfile {
    engram__header hdr;
    void *addr;
    size_t len;
    int private_copy;
    uint64_t minor_faults, major_faults;
} mapfile;

/* A private copy in anonymous memory, 2 MiB aligned, asked to be backed by
 * huge pages before the first touch (the copy is the touch), then collapsed
 * where the kernel left small pages. */
static int map_private_huge(mapfile *m, int fd, const engram__numa *numa, const char *name)
{
    size_t size = (size_t)m->hdr.data_size;
    size_t len = (size_t)engram__align_up(size, HUGE_SZ);
    size_t span = len + HUGE_SZ;
    unsigned char *raw, *p;
    int err;

    raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return engram__errno(errno, "mmap %zu bytes for a private copy of '%s'", span, name);
    p = (unsigned char *)engram__align_up((uintptr_t)raw, HUGE_SZ);
    /* Trim the unaligned head and tail so the mapping is exactly [p, p+len). */
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + span > p + len)
        munmap(p + len, (size_t)(raw + span - (p + len)));
    (void)madvise(p, len, MADV_HUGEPAGE);
    /* Placed before the copy's first touch allocates a page. */
    {
        char what[ENGRAM_NAME_MAX + 32];
        snprintf(what, sizeof what, "the private copy of '%s'", name);
        if ((err = engram__numa_apply(p, len, numa, what)) != 0) {
            munmap(p, len);
            return err;
        }
    }
    if ((err = engram__read_full(fd, p, size, m->hdr.data_offset, name)) != 0) {
        munmap(p, len);
        return err;
    }
    /* MADV_COLLAPSE (Linux 6.1+) is best-effort: EINVAL on older kernels,
     * EAGAIN under memory pressure.  Coverage is reported either way. */
    for (size_t off = 0; off < len; off += HUGE_SZ * 64) {
        size_t n = len - off < HUGE_SZ * 64 ? len - off : HUGE_SZ * 64;
        if (madvise(p + off, n, MADV_COLLAPSE) != 0 && errno == EINVAL)
            break;
    }
    if (mprotect(p, len, PROT_READ) != 0) {
        err = engram__errno(errno, "mprotect the copy of '%s'", name);
        munmap(p, len);
        return err;
    }
    m->addr = p;
    m->len = len;
    m->private_copy = 1;
    return 0;
}

static void mapfile_release(void *state)
{
    mapfile *m = state;
    if (m->addr)
        munmap(m->addr, m->len);
    free(m);
}

static void mapfile_info(void *state, engram_table_info *info)
{
    const mapfile *m = state;
    engram__header_info(&m->hdr, info);
    info->private_copy = m->private_copy;
    info->map_minor_faults = m->minor_faults;
    info->map_major_faults = m->major_faults;
}

static const engram__source_vt mapfile_vt = {mapfile_release, mapfile_info, NULL};

int engram__mapfile_is_private(const engram__source *src)
{
    return src->vt == &mapfile_vt && ((const mapfile *)src->state)->private_copy;
}

int engram__mapfile_make(int fd, const engram__header *h, uint32_t fl, const engram__numa *numa,
                         const char *name, engram__source *src)
{
    struct rusage r0, r1;
    mapfile *m = calloc(1, sizeof *m);
    int err;

    if (!m)
        return engram__err(-ENOMEM, "out of memory");
    m->hdr = *h;
    getrusage(RUSAGE_THREAD, &r0);
    if (fl & ENGRAM_OPEN_PRIVATE_HUGE) {
        if ((err = map_private_huge(m, fd, numa, name)) != 0)
            goto fail;
    } else {
        void *p = mmap(NULL, (size_t)h->data_size, PROT_READ,
                       MAP_SHARED | ((fl & ENGRAM_OPEN_PREFAULT) ? MAP_POPULATE : 0), fd,
                       (off_t)h->data_offset);
        if (p == MAP_FAILED) {
            err = engram__errno(errno, "mmap table '%s' (%llu bytes)", name,
                                (unsigned long long)h->data_size);
            goto fail;
        }
        m->addr = p;
        m->len = (size_t)h->data_size;
    }
    if ((fl & ENGRAM_OPEN_RANDOM) && madvise(m->addr, m->len, MADV_RANDOM) != 0) {
        err = engram__errno(errno, "madvise(MADV_RANDOM) on '%s'", name);
        goto fail;
    }
    if ((fl & ENGRAM_OPEN_MLOCK) && mlock(m->addr, m->len) != 0) {
        err = engram__errno(errno, "mlock %zu bytes of '%s' (see RLIMIT_MEMLOCK)", m->len, name);
        goto fail;
    }
    getrusage(RUSAGE_THREAD, &r1);
    m->minor_faults = (uint64_t)(r1.ru_minflt - r0.ru_minflt);
    m->major_faults = (uint64_t)(r1.ru_majflt - r0.ru_majflt);
    if (fl & ENGRAM_OPEN_VERIFY) {
        uint64_t sum = XXH3_64bits(m->addr, (size_t)h->data_size);
        if (sum != h->data_checksum) {
            err = engram__err(ENGRAM_ECHECKSUM,
                              "table '%s': data checksum %016llx != %016llx in the header",
                              name, (unsigned long long)sum,
                              (unsigned long long)h->data_checksum);
            goto fail;
        }
    }
    memset(src, 0, sizeof *src);
    src->kind = ENGRAM_TABLE_FILE;
    src->base = m->addr;
    src->vt = &mapfile_vt;
    src->state = m;
    return 0;
fail:
    mapfile_release(m);
    return err;
}

/* Sums Rss and the huge-page lines of every smaps entry overlapping
 * [addr, addr+len).  Entries only partly inside count in proportion. */
int engram__smaps_coverage(const void *addr, size_t len, uint64_t *resident, uint64_t *huge)
{
    FILE *f = fopen("/proc/self/smaps", "re");
    char line[256];
    uintptr_t lo = (uintptr_t)addr, hi = lo + len, s = 0, e = 0;
    int inside = 0;
    uint64_t rss = 0, hp = 0;

    *resident = *huge = 0;
    if (!f)
        return engram__errno(errno, "open /proc/self/smaps");
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        unsigned long long kb;
        char key[64];
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            s = a;
            e = b;
            inside = e > lo && s < hi;
            continue;
        }
        if (!inside || sscanf(line, "%63[^:]: %llu kB", key, &kb) != 2)
            continue;
        /* Scale an entry that extends beyond the range by the overlap. */
        uintptr_t os = s > lo ? s : lo, oe = e < hi ? e : hi;
        double frac = (double)(oe - os) / (double)(e - s);
        uint64_t bytes = (uint64_t)((double)kb * 1024.0 * frac);
        if (strcmp(key, "Rss") == 0)
            rss += bytes;
        else if (strcmp(key, "AnonHugePages") == 0 || strcmp(key, "ShmemPmdMapped") == 0 ||
                 strcmp(key, "FilePmdMapped") == 0)
            hp += bytes;
    }
    fclose(f);
    *resident = rss;
    *huge = hp;
    return 0;
}
