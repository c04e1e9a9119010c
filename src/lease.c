/*
 * lease.c - who is alive in a namespace directory: the leases of the
 * stores that use it, the temporary files of the writers that write in
 * it, and the cleanup of what the dead left there.
 *
 * The protocol, all of it here (docs/format.md, section 5, tells it for
 * people):
 *
 * Names.  A namespace directory holds three kinds of entries:
 *     <table>                       a published table file (format.h)
 *     .tmp.<table>.<pid>.<nonce>    a writer's temporary file for <table>
 *     .lease.<pid>.<nonce>          a store's lease
 *   <pid> is the maker's pid in its own PID namespace, in decimal; <nonce>
 *   a per-process counter mixed with the clock, in hex.  No table name
 *   begins with '.', so the three never collide.  engram__temp_parse() is
 *   the one parser of a temporary file's name (from the end: a table name
 *   may hold dots and digits).
 *
 * Who creates what.
 *   - A writer (writer.c, through engram__temp_create()) creates its
 *     temporary file with O_EXCL, mode 0600, takes an exclusive flock on
 *     it, and checks that the name still is the file it locked (a cleanup
 *     may have taken it for a dead writer's in between: then it tries a
 *     new name).  While it creates and locks, it holds the directory's
 *     flock shared, if it can have it without waiting.  Its commit links
 *     the file to <table> (create-only: link(2) fails if the name exists)
 *     and unlinks the temporary name; its abort unlinks it.  The lock is
 *     held until then.
 *   - A store (engram__lease_take(), at its first table open or wait)
 *     creates its lease, holding "pid P start T command C" for people,
 *     locked exclusively before anyone can see it (an O_TMPFILE linked in
 *     once locked; else a named file, under a new name if a cleanup came
 *     first), and keeps it locked until engram_store_close(), which
 *     removes it unless children forked with the store open still share
 *     the lock (the one place a holder takes its own file's lock).
 *
 * How liveness is judged.  By the lock, and only by it (probe(), the one
 *   check): the kernel drops a flock however its holder ends, and a lock
 *   means the same in every PID namespace that shares the directory,
 *   where a pid does not.  An entry is live if its lock is held, dead if
 *   it can be had; an entry that is not a regular file of the namespace's
 *   owner is nobody's (stray), whatever its name and its lock.  Lookers
 *   take the lock shared and drop it at once (two lookers never take each
 *   other for a holder); a cleanup takes it exclusively.
 *
 * What a reader trusts.  Only <table> names, and of them only regular
 *   files of the namespace's owner (fsutil.c): a temporary file is never
 *   read as a table, and a table's name appears only by link(2), with the
 *   complete, synced file behind it.  A waiter for a table
 *   (engram_table_open_wait(), engram_populate_shared(), engram_pull())
 *   takes a live temporary file of that table for "being written" and
 *   waits for its lock; the pid in its name and its birth time are for
 *   messages only.  `engram ns ls` counts live leases as users.
 *
 * What gc removes.  engram__clean_temps() (at every store open, and
 *   engram_store_gc() of a directory) removes dead writers' temporary
 *   files and stale leases: it holds the directory's flock exclusively
 *   (so no writer is between creating its file and locking it; a cleanup
 *   that cannot have it is skipped, and the next open runs it), takes
 *   each one's lock exclusively, checks that the name still is the file
 *   it locked, and unlinks it, leaving the directory's modification time
 *   (the last use gc goes by) as it was.  engram_namespace_gc()
 *   (namespace.c) removes a whole namespace that has no live lease and
 *   was last used (the latest of the directory's and its leases'
 *   modification times) long enough ago, never one that holds a live
 *   writer's temporary file or an entry that is not engram's.
 *
 * Nobody waits for the directory's lock: anyone who can read the
 * directory (a member of a group namespace's group) can flock it and keep
 * it; the name check after the lock covers a writer that went on without.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "lease.h"
#include "store.h"

/* The one liveness check, of a lease or a temporary file: entry `ent`
 * of the directory open at `dirfd` is opened without following a link
 * or blocking on a FIFO; it is ENGRAM__TEMP_GONE if it is not there,
 * ENGRAM__TEMP_STRAY if it is not a regular file of `uid` (nobody's,
 * whatever its lock says); else the lock decides: ENGRAM__TEMP_LIVE if
 * flock(op | LOCK_NB) finds it held, ENGRAM__TEMP_DEAD if not.  `op` is
 * LOCK_SH to look (lookers never conflict with each other), LOCK_EX to
 * remove (then *locked, may be NULL, says whether the lock is now ours).
 * *sbp (may be NULL) gets the file's stat, *fdp its descriptor (-1 for
 * GONE and STRAY), which the caller closes. */
static int probe(int dirfd, uid_t uid, const char *ent, int op, struct stat *sbp, int *fdp,
                 int *locked)
{
    struct stat sb;
    int fd;
    *fdp = -1;
    if (locked)
        *locked = 0;
    fd = openat(dirfd, ent, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? ENGRAM__TEMP_GONE : ENGRAM__TEMP_STRAY;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != uid) {
        close(fd);
        return ENGRAM__TEMP_STRAY;
    }
    if (sbp)
        *sbp = sb;
    *fdp = fd;
    if (flock(fd, op | LOCK_NB) == 0) {
        if (locked)
            *locked = 1;
        return ENGRAM__TEMP_DEAD;
    }
    return errno == EWOULDBLOCK ? ENGRAM__TEMP_LIVE : ENGRAM__TEMP_DEAD;
}

/* ------------------------------------------------------------------------
 * Leases.
 */

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
    int fd, state;
    if (strncmp(name, ENGRAM__LEASE_PREFIX, strlen(ENGRAM__LEASE_PREFIX)) != 0)
        return -1;
    state = probe(dirfd, uid, name, LOCK_SH, &sb, &fd, NULL);
    if (state == ENGRAM__TEMP_GONE || state == ENGRAM__TEMP_STRAY)
        return -1;
    if (mtime_ns)
        *mtime_ns = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
    if (state == ENGRAM__TEMP_LIVE) {
        char text[256];
        ssize_t n = pread(fd, text, sizeof text - 1, 0);
        text[n > 0 ? n : 0] = '\0';
        text[strcspn(text, "\n")] = '\0';
        if (who && cap)
            snprintf(who, cap, "%s", text);
        /* Ours: one of the files this process locked (what it says
         * proves nothing: another PID namespace's process may have our
         * pid and start time). */
        if (held_has(&sb))
            state = 2;
    }
    close(fd); /* its holder is gone: closing drops our lock */
    return state;
}

/* ------------------------------------------------------------------------
 * Writers' temporary files.
 */

/* lease.h */
int engram__temp_parse(const char *ent, char *table, size_t cap, long *pid)
{
    size_t pl = strlen(ENGRAM__TMP_PREFIX);
    const char *nonce, *digits, *p;
    long v = 0;
    /* From the end: a table name may hold dots and digits, a nonce and a
     * pid hold no dot. */
    if (strncmp(ent, ENGRAM__TMP_PREFIX, pl) != 0 || !(nonce = strrchr(ent, '.')) ||
        nonce < ent + pl || !nonce[1])
        return 0;
    for (p = nonce + 1; *p; p++)
        if (!strchr("0123456789abcdef", *p))
            return 0;
    for (digits = nonce; digits > ent + pl && digits[-1] >= '0' && digits[-1] <= '9'; digits--)
        ;
    /* At least one digit, after a dot that ends a name of at least one
     * byte. */
    if (digits == nonce || digits - 1 <= ent + pl || digits[-1] != '.')
        return 0;
    for (p = digits; p < nonce && p < digits + 9; p++)
        v = v * 10 + (*p - '0');
    if (table && cap)
        snprintf(table, cap, "%.*s", (int)(digits - 1 - (ent + pl)), ent + pl);
    if (pid)
        *pid = nonce - digits > 9 ? -1 : v;
    return 1;
}

/* 1 if directory entry `ent` is a temporary file of table `name`. */
static int temp_of(const char *ent, const char *name)
{
    char table[ENGRAM_NAME_MAX + 2];
    return engram__temp_parse(ent, table, sizeof table, NULL) && strcmp(table, name) == 0;
}

/* A new descriptor of the namespace directory (flock() locks belong to
 * the open file description, so each user needs its own), locked with
 * `op` if that can be had without waiting.  Returns the descriptor,
 * -EWOULDBLOCK (no message) when another open file description holds a
 * conflicting lock, or another negative code with the reason. */
static int dir_trylock(engram_store *st, int op)
{
    int fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return engram__errno(errno, "open %s", st->path);
    while (flock(fd, op | LOCK_NB) != 0) {
        int e = errno;
        if (e == EINTR)
            continue;
        close(fd);
        return e == EWOULDBLOCK ? -EWOULDBLOCK : engram__errno(e, "lock %s", st->path);
    }
    return fd;
}

/* Attempts at a temporary file that a cleanup keeps taking away. */
#define TMP_TRIES 8

/* lease.h */
int engram__temp_create(engram_store *st, const char *table, char *tmp, size_t cap, int *fdp)
{
    static _Atomic unsigned nonce;
    int lockfd, err = 0, fd = -1;

    /* Held, the directory's shared lock keeps cleanups out until our file
     * is locked; not to be had, it is not waited for (see the top). */
    if ((lockfd = dir_trylock(st, LOCK_SH)) < 0 && lockfd != -EWOULDBLOCK)
        return lockfd;
    for (int tries = 1;; tries++) {
        struct stat a, b;
        int locked;
        snprintf(tmp, cap, ENGRAM__TMP_PREFIX "%s.%ld.%x", table, (long)getpid(),
                 atomic_fetch_add(&nonce, 1) ^ (unsigned)engram__now_ns());
        fd = openat(st->dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) {
            err = engram__errno(errno, "create %s/%s", st->path, tmp);
            break;
        }
        /* The file is ours and 0600: only a cleanup that took it for a
         * dead writer's may hold its lock, and only to remove it. */
        locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
        if (!locked && errno != EWOULDBLOCK) {
            err = engram__errno(errno, "lock %s/%s", st->path, tmp);
            break;
        }
        /* Locked, and still under its name: no cleanup can remove it now
         * (one removes only what it locked, after checking the name). */
        if (locked && fstat(fd, &a) == 0 &&
            fstatat(st->dirfd, tmp, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev)
            break;
        unlinkat(st->dirfd, tmp, 0);
        close(fd);
        fd = -1;
        if (tries == TMP_TRIES) {
            err = engram__err(-EAGAIN, "create a temporary file in %s: a cleanup of stale "
                                       "temporary files removed it %d times in a row",
                              st->path, TMP_TRIES);
            break;
        }
    }
    if (lockfd >= 0)
        close(lockfd);
    if (err && fd >= 0) {
        unlinkat(st->dirfd, tmp, 0);
        close(fd);
        fd = -1;
    }
    *fdp = fd;
    return err;
}

void engram__temp_holder(int fd, const char *ent, char *who, size_t cap)
{
    struct statx sx;
    struct stat sb;
    uint64_t now = engram__wall_ns(), since = now;
    long pid = -1;
    char by[64];
    int exact = 0;
    engram__temp_parse(ent, NULL, 0, &pid);
    /* How long it has held the name: since its file was made (its birth
     * time, where the file system keeps one; else its last change, which
     * is later, so the time is then a lower bound). */
    if (statx(fd, "", AT_EMPTY_PATH, STATX_BTIME, &sx) == 0 && (sx.stx_mask & STATX_BTIME)) {
        since = (uint64_t)sx.stx_btime.tv_sec * 1000000000u + sx.stx_btime.tv_nsec;
        exact = 1;
    } else if (fstat(fd, &sb) == 0) {
        since = (uint64_t)sb.st_ctim.tv_sec * 1000000000u + (uint64_t)sb.st_ctim.tv_nsec;
    }
    if (pid > 0)
        snprintf(by, sizeof by, "pid %ld", pid);
    else
        snprintf(by, sizeof by, "a process (its file's name gives no pid)");
    snprintf(who, cap, "by %s, which has held it for %s%llu s now", by, exact ? "" : "at least ",
             (unsigned long long)((now > since ? now - since : 0) / 1000000000u));
}

int engram__temp_state(int dirfd, uid_t uid, const char *ent, char *who, size_t cap, int *fdp)
{
    int fd, state;
    if (fdp)
        *fdp = -1;
    state = probe(dirfd, uid, ent, LOCK_SH, NULL, &fd, NULL);
    if (state != ENGRAM__TEMP_LIVE) {
        if (fd >= 0)
            close(fd); /* a dead writer's (closing drops our lock) */
        return state;
    }
    if (who && cap)
        engram__temp_holder(fd, ent, who, cap);
    if (fdp)
        *fdp = fd;
    else
        close(fd);
    return ENGRAM__TEMP_LIVE;
}

int engram__live_writer(engram_store *st, const char *name, char *ent, size_t cap)
{
    return engram__live_writer_other(st, name, NULL, ent, cap);
}

int engram__live_writer_other(engram_store *st, const char *name, const char *mine, char *ent,
                              size_t cap)
{
    struct dirent *de;
    DIR *d;
    int fd, live = -1;
    if ((fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -1;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -1;
    }
    while (live < 0 && (de = readdir(d)) != NULL) {
        if (!temp_of(de->d_name, name) || (mine && strcmp(de->d_name, mine) == 0) ||
            engram__temp_state(st->dirfd, st->uid, de->d_name, NULL, 0, &live) !=
                ENGRAM__TEMP_LIVE)
            continue;
        snprintf(ent, cap, "%s", de->d_name);
    }
    closedir(d);
    return live;
}

/* How often, at most, a wait with a time limit looks at a writer's lock
 * (flock() has no timeout): from 1 ms, doubling. */
#define WRITER_POLL_MAX_NS 50000000u

/* writer.h */
int engram__wait_writer(int fd, uint64_t deadline)
{
    uint64_t pause = 1000000u;
    if (deadline == UINT64_MAX) {
        while (flock(fd, LOCK_SH) != 0 && errno == EINTR)
            ;
        return 0;
    }
    for (;;) {
        uint64_t now, ns;
        struct timespec ts;
        if (flock(fd, LOCK_SH | LOCK_NB) == 0 || (errno != EWOULDBLOCK && errno != EINTR))
            return 0;
        if ((now = engram__now_ns()) >= deadline)
            return -ETIMEDOUT;
        ns = deadline - now < pause ? deadline - now : pause;
        ts.tv_sec = (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        nanosleep(&ts, NULL);
        if (pause < WRITER_POLL_MAX_NS)
            pause = pause * 2 < WRITER_POLL_MAX_NS ? pause * 2 : WRITER_POLL_MAX_NS;
    }
}

/* ------------------------------------------------------------------------
 * Cleanup.
 */

/* lease.h */
void engram__clean_temps(engram_store *st)
{
    struct stat before;
    int lockfd, fd, removed = 0, have_before;
    DIR *d;
    struct dirent *de;

    /* Held by another process: a cleanup running now, or someone who
     * merely can read the directory.  Stale files wait for a later open. */
    if ((lockfd = dir_trylock(st, LOCK_EX)) < 0)
        return;
    have_before = fstat(st->dirfd, &before) == 0;
    fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || !(d = fdopendir(fd))) {
        if (fd >= 0)
            close(fd);
        close(lockfd);
        return;
    }
    while ((de = readdir(d)) != NULL) {
        struct stat a, b;
        int tfd, locked, lease = strncmp(de->d_name, ENGRAM__LEASE_PREFIX,
                                         strlen(ENGRAM__LEASE_PREFIX)) == 0;
        if (!lease && strncmp(de->d_name, ENGRAM__TMP_PREFIX, strlen(ENGRAM__TMP_PREFIX)) != 0)
            continue;
        /* Only our own regular files; the lock, taken exclusively, tells
         * that the holder is gone; the inode check makes sure we unlink
         * what we locked. */
        if (probe(st->dirfd, st->uid, de->d_name, LOCK_EX, &a, &tfd, &locked) ==
                ENGRAM__TEMP_DEAD &&
            locked && fstatat(st->dirfd, de->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev &&
            unlinkat(st->dirfd, de->d_name, 0) == 0) {
            engram__log(ENGRAM_LOG_INFO, 0, "removed %s/%s, the %s that died", st->path,
                        de->d_name,
                        lease ? "namespace lease of a process" : "temporary file of a writer");
            removed = 1;
        }
        if (tfd >= 0)
            close(tfd);
    }
    closedir(d);
    /* Removing what the dead left is no use of the namespace: its
     * modification time (the last use engram gc goes by) stays. */
    if (removed && have_before) {
        struct timespec ts[2] = {{0, UTIME_OMIT}, before.st_mtim};
        utimensat(st->dirfd, ".", ts, 0);
    }
    close(lockfd);
}
