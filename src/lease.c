/*
 * lease.c - a namespace's users: one lease file per store that opened a
 * table in it.
 *
 * A lease is a file ".lease.<pid>.<nonce>" in the namespace, holding its
 * process's pid, start time and command (for people reading `engram ns
 * ls`), and locked with flock(LOCK_EX) for as long as the store is open.
 * Liveness is the lock, not the pid: the kernel drops it however the
 * process ends, and it works across PID namespaces (containers sharing a
 * /dev/shm), where a pid means nothing.  A lease whose lock can be taken
 * is stale: its process died without closing the store; the next store
 * open removes it, as it removes dead writers' temporary files.
 *
 * `engram gc` removes namespaces that have no live lease and were last
 * used (the latest of the directory's and the leases' modification times)
 * long enough ago, so that a crashed job never leaks its tables for good.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "lease.h"
#include "store.h"

/* This process's start time (clock ticks since boot, field 22 of
 * /proc/self/stat), 0 if unknown. */
static unsigned long long start_ticks(void)
{
    char buf[1024], *p;
    unsigned long long v = 0;
    FILE *f = fopen("/proc/self/stat", "re");
    if (!f)
        return 0;
    if (fgets(buf, sizeof buf, f) && (p = strrchr(buf, ')')) != NULL)
        /* After the command: state, then fields 4..21, then starttime. */
        if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                          "%*d %*d %llu",
                   &v) != 1)
            v = 0;
    fclose(f);
    return v;
}

void engram__lease_take(engram_store *st)
{
    static _Atomic unsigned nonce;
    char line[256], comm[64] = "?";
    int fd = -1, retries = 0;
    if (st->dirfd < 0 || atomic_load_explicit(&st->lease_fd, memory_order_acquire) >= 0)
        return;
    pthread_mutex_lock(&st->lock);
    if (atomic_load_explicit(&st->lease_fd, memory_order_relaxed) >= 0)
        goto out;
again:
    for (int tries = 0; tries < 4 && fd < 0; tries++) {
        snprintf(st->lease_name, sizeof st->lease_name, ENGRAM__LEASE_PREFIX "%ld.%x",
                 (long)getpid(), atomic_fetch_add(&nonce, 1) ^ (unsigned)engram__now_ns());
        fd = openat(st->dirfd, st->lease_name,
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    (st->opts.flags & ENGRAM_OPEN_GROUP) ? 0640 : 0600);
        if (fd < 0 && errno != EEXIST)
            break; /* a namespace we may not write: no lease */
    }
    if (fd < 0)
        goto out;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        unlinkat(st->dirfd, st->lease_name, 0);
        close(fd);
        goto out;
    }
    {
        /* Between the create and the lock, another store's cleanup may
         * have taken the file for a stale lease and removed it: a lease
         * nobody can see is no lease, so check the name is still ours. */
        struct stat a, b;
        if (fstat(fd, &a) != 0 ||
            fstatat(st->dirfd, st->lease_name, &b, AT_SYMLINK_NOFOLLOW) != 0 ||
            a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd);
            fd = -1;
            if (++retries < 4)
                goto again;
            goto out;
        }
    }
    {
        FILE *f = fopen("/proc/self/comm", "re");
        if (f) {
            if (fgets(comm, sizeof comm, f))
                comm[strcspn(comm, "\n")] = '\0';
            fclose(f);
        }
    }
    snprintf(line, sizeof line, "pid %ld start %llu command %s\n", (long)getpid(), start_ticks(),
             comm);
    if (write(fd, line, strlen(line)) < 0) {
        /* The lock is what counts; the text is for people. */
    }
    st->lease_pid = getpid();
    atomic_store_explicit(&st->lease_fd, fd, memory_order_release);
out:
    pthread_mutex_unlock(&st->lock);
}

void engram__lease_drop(engram_store *st)
{
    int fd = atomic_load_explicit(&st->lease_fd, memory_order_relaxed), fd2;
    if (fd < 0)
        return;
    close(fd);
    atomic_store_explicit(&st->lease_fd, -1, memory_order_relaxed);
    if (st->lease_pid != getpid())
        return; /* a forked child's copy: the file is its parent's */
    /* Children forked with the store open share the lock (one open file
     * description) and may still use the store: the lease stays theirs
     * while one of them holds it.  Otherwise the lock is ours to take, and
     * the file to remove. */
    fd2 = openat(st->dirfd, st->lease_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd2 < 0)
        return;
    if (flock(fd2, LOCK_EX | LOCK_NB) == 0)
        unlinkat(st->dirfd, st->lease_name, 0);
    close(fd2);
}

int engram__lease_state(int dirfd, uid_t uid, const char *name, char *who, size_t cap,
                        uint64_t *mtime_ns)
{
    struct stat sb;
    int fd, live;
    if (strncmp(name, ENGRAM__LEASE_PREFIX, strlen(ENGRAM__LEASE_PREFIX)) != 0)
        return -1;
    fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != uid) {
        close(fd);
        return -1;
    }
    if (mtime_ns)
        *mtime_ns = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
        live = 0; /* its holder is gone (closing drops our lock) */
    } else {
        char text[256];
        ssize_t n;
        long pid;
        unsigned long long start;
        live = errno == EWOULDBLOCK;
        if (live) {
            n = pread(fd, text, sizeof text - 1, 0);
            text[n > 0 ? n : 0] = '\0';
            text[strcspn(text, "\n")] = '\0';
            if (who && cap)
                snprintf(who, cap, "%s", text);
            /* Ours: the same pid and start time (a pid alone could be
             * another PID namespace's). */
            if (sscanf(text, "pid %ld start %llu", &pid, &start) == 2 && pid == (long)getpid() &&
                start == start_ticks())
                live = 2;
        }
    }
    close(fd);
    return live;
}
