/*
 * mem.c - how a table file's rows get into memory, and what we got.
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

#include <xxhash.h>

#include "store.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define HUGE_SZ ((size_t)2 << 20)
#define IO_CHUNK ((size_t)8 << 20)

static int read_full(int fd, void *buf, size_t len, uint64_t off, const char *what)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return engram__errno(errno, "read %s", what);
        }
        if (n == 0)
            return engram__err(ENGRAM_ECORRUPT, "%s: unexpected end of file at %llu", what,
                               (unsigned long long)(off + got));
        got += (size_t)n;
    }
    return 0;
}

int engram__checksum_fd(int fd, const engram__header *h, const char *what,
                        engram_progress_fn progress, void *ud, uint64_t *sum)
{
    XXH3_state_t *xs = XXH3_createState();
    unsigned char *buf = malloc(IO_CHUNK);
    int err = 0;
    if (!xs || !buf) {
        err = engram__err(-ENOMEM, "out of memory for checksum of %s", what);
        goto out;
    }
    XXH3_64bits_reset(xs);
    for (uint64_t done = 0; done < h->data_size;) {
        size_t n = h->data_size - done < IO_CHUNK ? (size_t)(h->data_size - done) : IO_CHUNK;
        if ((err = read_full(fd, buf, n, h->data_offset + done, what)) != 0)
            goto out;
        XXH3_64bits_update(xs, buf, n);
        done += n;
        if (progress && progress(ud, done, h->data_size)) {
            err = engram__err(-ECANCELED, "checksum of %s cancelled", what);
            goto out;
        }
    }
    *sum = XXH3_64bits_digest(xs);
out:
    free(buf);
    XXH3_freeState(xs);
    return err;
}

/* A private copy in anonymous memory, 2 MiB aligned, asked to be backed by
 * huge pages before the first touch (the copy is the touch), then collapsed
 * where the kernel left small pages. */
static int map_private_huge(engram__table *t, int fd)
{
    size_t len = (size_t)engram__align_up(t->data_size, HUGE_SZ);
    size_t span = len + HUGE_SZ;
    unsigned char *raw, *p;
    int err;

    raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return engram__errno(errno, "mmap %zu bytes for a private copy of '%s'", span, t->name);
    p = (unsigned char *)engram__align_up((uintptr_t)raw, HUGE_SZ);
    /* Trim the unaligned head and tail so the mapping is exactly [p, p+len). */
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + span > p + len)
        munmap(p + len, (size_t)(raw + span - (p + len)));
    (void)madvise(p, len, MADV_HUGEPAGE);
    if ((err = read_full(fd, p, (size_t)t->data_size, t->hdr.data_offset, t->name)) != 0) {
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
        err = engram__errno(errno, "mprotect the copy of '%s'", t->name);
        munmap(p, len);
        return err;
    }
    t->map_addr = p;
    t->map_len = len;
    t->private_copy = 1;
    return 0;
}

int engram__map_file_table(engram_store *st, engram__table *t, int fd)
{
    struct rusage r0, r1;
    uint32_t fl = st->opts.flags;
    int err;

    getrusage(RUSAGE_THREAD, &r0);
    if (fl & ENGRAM_OPEN_PRIVATE_HUGE) {
        if ((err = map_private_huge(t, fd)) != 0)
            return err;
    } else {
        void *p = mmap(NULL, (size_t)t->data_size, PROT_READ,
                       MAP_SHARED | ((fl & ENGRAM_OPEN_PREFAULT) ? MAP_POPULATE : 0), fd,
                       (off_t)t->hdr.data_offset);
        if (p == MAP_FAILED)
            return engram__errno(errno, "mmap table '%s' (%llu bytes)", t->name,
                                 (unsigned long long)t->data_size);
        t->map_addr = p;
        t->map_len = (size_t)t->data_size;
    }
    if ((fl & ENGRAM_OPEN_RANDOM) && madvise(t->map_addr, t->map_len, MADV_RANDOM) != 0) {
        err = engram__errno(errno, "madvise(MADV_RANDOM) on '%s'", t->name);
        goto fail;
    }
    if ((fl & ENGRAM_OPEN_MLOCK) && mlock(t->map_addr, t->map_len) != 0) {
        err = engram__errno(errno, "mlock %zu bytes of '%s' (see RLIMIT_MEMLOCK)", t->map_len,
                            t->name);
        goto fail;
    }
    getrusage(RUSAGE_THREAD, &r1);
    t->minor_faults = (uint64_t)(r1.ru_minflt - r0.ru_minflt);
    t->major_faults = (uint64_t)(r1.ru_majflt - r0.ru_majflt);
    if (fl & ENGRAM_OPEN_VERIFY) {
        uint64_t sum = XXH3_64bits(t->map_addr, (size_t)t->data_size);
        if (sum != t->hdr.data_checksum) {
            err = engram__err(ENGRAM_ECHECKSUM,
                              "table '%s': data checksum %016llx != %016llx in the header",
                              t->name, (unsigned long long)sum,
                              (unsigned long long)t->hdr.data_checksum);
            goto fail;
        }
    }
    t->base = t->map_addr;
    return 0;
fail:
    munmap(t->map_addr, t->map_len);
    t->map_addr = NULL;
    return err;
}

void engram__unmap_table(engram__table *t)
{
    if (t->map_addr)
        munmap(t->map_addr, t->map_len);
    t->map_addr = NULL;
    t->base = NULL;
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
