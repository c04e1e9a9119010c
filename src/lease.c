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
#include <pthread.h>
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

/* The leases this process holds, by file: how a lease is known to be
 * ours.  Not by the pid and start time it holds: in another PID namespace
 * a process can have both. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static struct held {
    dev_t dev;
    ino_t ino;
} *held;
static size_t nheld, capheld;

static void held_add(int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return;
    pthread_mutex_lock(&held_lock);
    if (nheld == capheld) {
        size_t cap = capheld ? 2 * capheld : 8;
        struct held *h = realloc(held, cap * sizeof *h);
        if (h) {
            held = h;
            capheld = cap;
        }
    }
    /* Out of memory: the lease is then taken for another process's, which
     * only makes a removal by this process more careful. */
    if (nheld < capheld)
        held[nheld++] = (struct held){sb.st_dev, sb.st_ino};
    pthread_mutex_unlock(&held_lock);
}

static void held_remove(const struct stat *sb)
{
    pthread_mutex_lock(&held_lock);
    for (size_t i = 0; i < nheld; i++)
        if (held[i].dev == sb->st_dev && held[i].ino == sb->st_ino) {
            held[i] = held[--nheld];
            break;
        }
    pthread_mutex_unlock(&held_lock);
}

static int held_has(const struct stat *sb)
{
    int found = 0;
    pthread_mutex_lock(&held_lock);
    for (size_t i = 0; i < nheld && !found; i++)
        found = held[i].dev == sb->st_dev && held[i].ino == sb->st_ino;
    pthread_mutex_unlock(&held_lock);
    return found;
}

/* A fresh lease name for st, into st->lease_name. */
static void lease_name(engram_store *st)
{
    static _Atomic unsigned nonce;
    snprintf(st->lease_name, sizeof st->lease_name, ENGRAM__LEASE_PREFIX "%ld.%x",
             (long)getpid(), atomic_fetch_add(&nonce, 1) ^ (unsigned)engram__now_ns());
}

/* Makes st's lease file, holding `text` and locked, under a fresh name in
 * its namespace: its descriptor, or -1 where none can be made. */
static int lease_create(engram_store *st, mode_t mode, const char *text)
{
    struct stat a, b;
    char path[64];
    int fd, tries;

    /* 1. Where the file system has them, an unnamed file, locked and
     * filled before it gets its name: no other process ever sees a lease
     * that is not locked (which it would take for a dead process's and
     * remove), and a process killed midway leaves nothing. */
    fd = openat(st->dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, mode);
    if (fd >= 0) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            if (write(fd, text, strlen(text)) < 0) {
                /* The lock is what counts; the text is for people. */
            }
            snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
            for (tries = 0; tries < 8; tries++) {
                lease_name(st);
                if (linkat(AT_FDCWD, path, st->dirfd, st->lease_name, AT_SYMLINK_FOLLOW) == 0)
                    return fd;
                if (errno != EEXIST)
                    break; /* no /proc, say: a named file below */
            }
        }
        close(fd);
    } else if (errno == EACCES || errno == EPERM || errno == EROFS) {
        return -1; /* a namespace we may not write: no lease */
    }
    /* 2. Elsewhere, a named file locked once made.  Until it is locked,
     * another process may hold its lock for a moment: one that asks who
     * uses the namespace, or a cleanup that takes it for a dead process's
     * lease and removes it.  Either way, a new name: a lease nobody can
     * see, or one that looks dead, is no lease. */
    for (tries = 0; tries < 16; tries++) {
        lease_name(st);
        fd = openat(st->dirfd, st->lease_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    mode);
        if (fd < 0) {
            if (errno == EEXIST)
                continue;
            return -1; /* a namespace we may not write: no lease */
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            /* Still ours (nobody else makes this name): not left behind. */
            unlinkat(st->dirfd, st->lease_name, 0);
            close(fd);
            continue;
        }
        if (fstat(fd, &a) == 0 &&
            fstatat(st->dirfd, st->lease_name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            if (write(fd, text, strlen(text)) < 0) {
                /* The lock is what counts; the text is for people. */
            }
            return fd;
        }
        close(fd); /* removed by a cleanup before we locked it */
    }
    return -1;
}

void engram__lease_take(engram_store *st)
{
    char line[256], comm[64] = "?";
    int fd;
    if (st->dirfd < 0 || atomic_load_explicit(&st->lease_fd, memory_order_acquire) >= 0)
        return;
    pthread_mutex_lock(&st->lock);
    if (atomic_load_explicit(&st->lease_fd, memory_order_relaxed) >= 0)
        goto out;
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
    fd = lease_create(st, (st->opts.flags & ENGRAM_OPEN_GROUP) ? 0640 : 0600, line);
    if (fd < 0)
        goto out;
    held_add(fd);
    st->lease_pid = getpid();
    atomic_store_explicit(&st->lease_fd, fd, memory_order_release);
out:
    pthread_mutex_unlock(&st->lock);
}

void engram__lease_drop(engram_store *st)
{
    int fd = atomic_load_explicit(&st->lease_fd, memory_order_relaxed), fd2;
    struct stat sb;
    if (fd < 0)
        return;
    if (fstat(fd, &sb) == 0)
        held_remove(&sb);
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
        live = errno == EWOULDBLOCK;
        if (live) {
            n = pread(fd, text, sizeof text - 1, 0);
            text[n > 0 ? n : 0] = '\0';
            text[strcspn(text, "\n")] = '\0';
            if (who && cap)
                snprintf(who, cap, "%s", text);
            /* Ours: one of the files this process locked (what it says
             * proves nothing: another PID namespace's process may have
             * our pid and start time). */
            if (held_has(&sb))
                live = 2;
        }
    }
    close(fd);
    return live;
}
