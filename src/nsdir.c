/*
 * nsdir.c - a namespace that is a directory: engram_store_open(), and
 * the namespace interface of remote.h for it (a table is a file).
 *
 * The store (store.c) keeps the registry and the store's life; writer.c
 * writes tables; what either does in a directory namespace is here: open
 * the directory under the trust rules, make a table file's source (mapped,
 * or read on demand behind the row cache), describe, list, verify and
 * remove table files, wait for one to be published (inotify), say where
 * a file's pages are, write a table file (create-only and atomic: the
 * steps of writer.c's top comment) and copy one for a NUMA node, and
 * clean up what dead processes left (engram__clean_temps(): the
 * temporary-file and lease protocol is lease.c's).  The state of the
 * namespace is the store itself: its directory descriptor (dirfd), its
 * owner (uid), its path and options.
 */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "xxh.h"

#include "capacity.h"
#include "filesrc.h"
#include "format.h"
#include "fsutil.h"
#include "lease.h"
#include "mapfile.h"
#include "nsdir.h"
#include "numa.h"
#include "remote.h"
#include "store.h"
#include "writer.h"

const char *engram_default_root(void)
{
    const char *env = getenv("ENGRAM_ROOT");
    struct stat sb;
    /* The environment's choice first, so that every program on the node
     * (CLI, Python, an engine) agrees on the root without a flag each. */
    if (env && env[0])
        return env;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode))
        return "/dev/shm/engram";
    return "/tmp/engram";
}

/* 1 if gid is our effective group or one of our supplementary groups. */
static int in_our_groups(gid_t gid)
{
    gid_t *list;
    int n, found = 0;
    if (gid == getegid())
        return 1;
    if ((n = getgroups(0, NULL)) <= 0 || !(list = malloc((size_t)n * sizeof *list)))
        return 0;
    n = getgroups(n, list);
    for (int i = 0; i < n && !found; i++)
        found = list[i] == gid;
    free(list);
    return found;
}

/* Who may change a directory: nobody but its owner, or, for the root, also
 * anyone if it is sticky (like /dev/shm: then only an entry's owner, the
 * root's owner and root can rename or remove the entry). */
static int check_dir_mode(const struct stat *sb, const char *what, int is_root)
{
    if ((sb->st_mode & (S_IWGRP | S_IWOTH)) && !(is_root && (sb->st_mode & S_ISVTX)))
        return engram__err(ENGRAM_EUNSAFE, "%s is writable by group or others (mode %04o)",
                           what, (unsigned)(sb->st_mode & 07777));
    return 0;
}

/* The trust rule for a namespace directory `ns` (fstat nsb) under the
 * root `root` (fstat rsb): its owner is the only uid whose files the
 * store will read, so who may own, replace or change either directory
 * decides whose tables we read.
 *  - The namespace is ours, or, with ENGRAM_OPEN_GROUP, another user's
 *    who shares it with us: its group is one of our groups (only the
 *    group's members and root can give a directory their group, so a
 *    stranger's directory never passes), and not writable by group or
 *    others.
 *  - The root is ours or root's, or, with ENGRAM_OPEN_GROUP, the
 *    namespace owner's (whom we trust already): anyone else owning it
 *    could rename the namespace away and put their own in its place,
 *    sticky bit or not.  Others may write it only if it is sticky.
 * Both are checked on the open descriptors the store keeps using, so the
 * directories cannot be swapped between the checks and their use. */
static int check_trust(const struct stat *rsb, const char *root, const struct stat *nsb,
                       const char *ns, int group)
{
    uid_t me = geteuid();
    int err;
    if ((err = check_dir_mode(nsb, ns, 0)) != 0)
        return err;
    if (nsb->st_uid != me && !group)
        return engram__err(ENGRAM_EUNSAFE, "%s is owned by uid %u, not by us (uid %u)", ns,
                           (unsigned)nsb->st_uid, (unsigned)me);
    if (nsb->st_uid != me && !in_our_groups(nsb->st_gid))
        return engram__err(ENGRAM_EUNSAFE,
                           "%s is owned by uid %u with group %u, which is not one of our "
                           "groups: with ENGRAM_OPEN_GROUP another user's namespace is trusted "
                           "only when it is shared with a group we are in",
                           ns, (unsigned)nsb->st_uid, (unsigned)nsb->st_gid);
    if (rsb->st_uid != me && rsb->st_uid != 0 && rsb->st_uid != nsb->st_uid)
        return engram__err(ENGRAM_EUNSAFE,
                           "%s is owned by uid %u, who is neither us (uid %u), root nor the "
                           "owner of namespace %s (uid %u): that user could replace the "
                           "namespace",
                           root, (unsigned)rsb->st_uid, (unsigned)me, ns,
                           (unsigned)nsb->st_uid);
    return 0;
}

int engram_store_open(const char *root, const char *ns, const engram_store_options *opts,
                      engram_store **out)
{
    return engram__store_open_dir(root, ns, opts, 1, out);
}

int engram__store_open_dir(const char *root, const char *ns, const engram_store_options *opts,
                           int clean, engram_store **out)
{
    engram_store *st = NULL;
    int rootfd = -1, err, group, foreign_root;
    struct stat rsb, nsb;
    size_t plen;
    mode_t mode;

    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    *out = NULL;
    if (!root)
        root = engram_default_root();
    if (engram_name_check(ns) != 0)
        return engram__err(ENGRAM_ESPEC, "namespace: %s", engram_errmsg());
    if ((err = engram__store_alloc(opts, &st)) != 0)
        return err;
    /* From here the store's close closes what the namespace holds. */
    st->ns = &engram__nsdir_vt;
    st->ns_state = st;
    plen = strlen(root) + strlen(ns) + 2;
    if (!(st->path = malloc(plen))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto fail;
    }
    snprintf(st->path, plen, "%s/%s", root, ns);
    mode = (st->opts.flags & ENGRAM_OPEN_GROUP) ? 0750 : 0700;
    if ((st->opts.flags & ENGRAM_OPEN_CREATE) && mkdir(root, mode) != 0 && errno != EEXIST) {
        err = engram__errno(errno, "create root directory %s", root);
        goto fail;
    }
    group = (st->opts.flags & ENGRAM_OPEN_GROUP) != 0;
    if ((rootfd = engram__open_dir(AT_FDCWD, root, root, &rsb)) < 0) {
        err = rootfd;
        goto fail;
    }
    if ((err = check_dir_mode(&rsb, root, 1)) != 0)
        goto fail;
    /* A root of another user: only with GROUP (if that user owns the
     * namespace too, checked below), and never to create a namespace in,
     * which that user could replace. */
    foreign_root = rsb.st_uid != geteuid() && rsb.st_uid != 0;
    if (foreign_root && !group) {
        err = engram__err(ENGRAM_EUNSAFE, "%s is owned by uid %u, not by us (uid %u) or root",
                          root, (unsigned)rsb.st_uid, (unsigned)geteuid());
        goto fail;
    }
    if ((st->opts.flags & ENGRAM_OPEN_CREATE) && !foreign_root && mkdirat(rootfd, ns, mode) != 0 &&
        errno != EEXIST) {
        err = engram__errno(errno, "create namespace directory %s", st->path);
        goto fail;
    }
    if ((st->dirfd = engram__open_dir(rootfd, ns, st->path, &nsb)) < 0) {
        err = st->dirfd;
        st->dirfd = -1;
        if (err == -ENOENT && foreign_root && (st->opts.flags & ENGRAM_OPEN_CREATE))
            err = engram__err(ENGRAM_EUNSAFE, "%s is owned by uid %u, not by us (uid %u) or "
                                              "root: namespace %s is not created in it",
                              root, (unsigned)rsb.st_uid, (unsigned)geteuid(), st->path);
        else if (err == -ENOENT)
            engram__err(err, "namespace %s does not exist (open with ENGRAM_OPEN_CREATE)",
                        st->path);
        goto fail;
    }
    if ((err = check_trust(&rsb, root, &nsb, st->path, group)) != 0)
        goto fail;
    st->uid = nsb.st_uid;
    close(rootfd);
    if (clean)
        engram__clean_temps(st);
    *out = st;
    return 0;
fail:
    if (rootfd >= 0)
        close(rootfd);
    engram_store_close(st);
    return err;
}

/* Makes the source of the open table file fd, per the store's flags:
 * mapped, or read on demand behind the row cache. */
static int file_source(engram_store *st, int fd, const engram__header *h, const char *name,
                       engram__source *src)
{
    engram__store_ctx ctx;
    engram__fseg seg;
    uint64_t sum;
    int err;
    if (!(st->opts.flags & ENGRAM_OPEN_FILE_CACHE)) {
        /* A mapped hole could cost a SIGBUS at lookup (see fsutil.h). */
        if ((err = engram__check_holes(fd, h, name)) != 0)
            return err;
        return engram__mapfile_make(fd, h, st->opts.flags, &st->numa, name, src);
    }
    if (st->opts.flags & ENGRAM_OPEN_VERIFY) {
        /* Rows are read on demand: verify the file now, once. */
        if ((err = engram__checksum_fd(fd, h, name, NULL, NULL, &sum)) != 0)
            return err;
        if (sum != h->data_checksum)
            return engram__err(ENGRAM_ECHECKSUM,
                               "table '%s': data checksum %016llx != %016llx in the header",
                               name, (unsigned long long)sum,
                               (unsigned long long)h->data_checksum);
    }
    if ((err = engram__store_ctx_get(st, &ctx)) != 0)
        return err;
    if ((seg.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
        return engram__errno(errno, "dup descriptor of table '%s'", name);
    seg.base = h->data_offset;
    seg.stride = h->row_pitch;
    seg.len = h->row_bytes;
    seg.file_size = h->data_offset + h->data_size;
    return engram__filesrc_make(&ctx, ENGRAM_TABLE_FILE, name, &seg, 1, h->num_rows,
                                seg.file_size, 1, h, src);
}

int engram__store_local_copy(engram_store *local, const char *name,
                             const engram_table_spec *want, uint64_t sum, uint32_t flags,
                             engram__source *src)
{
    engram__header h;
    struct stat sb;
    int fd, err;
    if ((fd = engram__open_table_file(local->dirfd, local->path, local->uid, name, &sb, &h)) < 0)
        return -ENOENT;
    if (h.num_rows != want->num_rows || h.row_bytes != want->row_bytes ||
        h.row_pitch != want->row_bytes || h.data_checksum != sum) {
        close(fd);
        return -ESTALE;
    }
    /* A mapped hole could cost a SIGBUS at lookup (see fsutil.h). */
    if ((err = engram__check_holes(fd, &h, name)) == 0)
        err = engram__mapfile_make(fd, &h, flags, &local->numa, name, src);
    close(fd);
    if (err)
        return -ENOENT;
    /* A store reading tables of the namespace holds its lease (gc leaves
     * the namespace alone while it lives). */
    engram__lease_take(local);
    return 0;
}

/* How often a wait re-checks where inotify cannot be had (no /proc, or
 * out of inotify instances). */
#define WAIT_POLL_MS 50
/* How often a wait checks that the namespace directory still exists: its
 * removal sends no event while the store holds it open. */
#define WAIT_ALIVE_MS 1000

/* Reads the inotify events that are there; 1 if one says the watched
 * directory itself went away (removed, or renamed elsewhere). */
static int drain_events(int ifd)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int gone = 0;
    for (;;) {
        ssize_t n = read(ifd, buf, sizeof buf);
        if (n <= 0)
            return gone;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
            gone |= (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) != 0;
            p += sizeof *ev + ev->len;
        }
    }
}

/* ------------------------------------------------------------------------
 * The namespace interface (remote.h).
 */

static void nsdir_close(void *rs)
{
    engram_store *st = rs;
    engram__lease_drop(st);
    if (st->dirfd >= 0)
        close(st->dirfd);
    st->dirfd = -1;
}

/* The slow part of a table's open (reading the header, mapping,
 * prefaulting, verifying): the store runs it without its lock. */
static int nsdir_open(void *rs, const engram__store_ctx *ctx, const char *name,
                      engram_table_spec *spec, uint64_t *data_size, engram__source *src)
{
    engram_store *st = rs;
    engram__header h;
    struct stat sb;
    int fd, err;
    (void)ctx; /* lazy_ctx: file_source() makes it where rows are read on demand */
    if ((fd = engram__open_table_file(st->dirfd, st->path, st->uid, name, &sb, &h)) < 0)
        return fd;
    err = file_source(st, fd, &h, name, src);
    close(fd);
    if (err)
        return err;
    spec->num_rows = h.num_rows;
    spec->row_bytes = h.row_bytes;
    spec->row_pitch = h.row_pitch;
    *data_size = h.data_size;
    src->ident[0] = (uint64_t)sb.st_dev;
    src->ident[1] = (uint64_t)sb.st_ino;
    return 0;
}

static int nsdir_current_locked(void *rs, const char *name, const engram__source *src)
{
    engram_store *st = rs;
    struct stat now;
    /* Removed (or removed and written again) while we opened it: what we
     * read is no longer the table of that name.  engram_remove() unlinks
     * under the store's lock, which is held here. */
    if (fstatat(st->dirfd, name, &now, AT_SYMLINK_NOFOLLOW) != 0 ||
        (uint64_t)now.st_dev != src->ident[0] || (uint64_t)now.st_ino != src->ident[1])
        return engram__err(-ENOENT, "table '%s' was removed from %s while it was being opened",
                           name, st->path);
    return 0;
}

static int nsdir_info(void *rs, const char *name, engram_table_info *info)
{
    engram_store *st = rs;
    engram__header h;
    struct stat sb;
    int fd;
    if ((fd = engram__open_table_file(st->dirfd, st->path, st->uid, name, &sb, &h)) < 0)
        return fd;
    close(fd);
    info->kind = ENGRAM_TABLE_FILE;
    engram__header_info(&h, info);
    return 0;
}

static int nsdir_list(void *rs, int (*add)(void *ud, const char *name), void *ud)
{
    engram_store *st = rs;
    struct dirent *de;
    DIR *d = NULL;
    int fd, err = 0;
    /* A fresh descriptor: readdir moves the offset of the one it uses. */
    fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || !(d = fdopendir(fd))) {
        err = engram__errno(errno, "read directory %s", st->path);
        if (fd >= 0)
            close(fd);
        return err;
    }
    while (!err && (de = readdir(d)) != NULL)
        if ((de->d_type == DT_REG || de->d_type == DT_UNKNOWN) && engram__name_valid(de->d_name))
            err = add(ud, de->d_name);
    closedir(d);
    return err;
}

/* Unlinks table file `name` (engram_remove(): the store retires its copy
 * after). */
static int nsdir_remove(void *rs, const char *name, int *unpublished)
{
    engram_store *st = rs;
    struct stat sb;
    /* Only what open would accept is ours to remove: a link or a
     * directory planted under a table name is refused, not unlinked. */
    if (fstatat(st->dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(sb.st_mode))
        return engram__err(ENGRAM_EUNSAFE, "%s/%s is not a regular file; not removing it",
                           st->path, name);
    if (unlinkat(st->dirfd, name, 0) != 0)
        return errno == ENOENT
                   ? engram__err(-ENOENT, "table '%s' not found in %s", name, st->path)
                   : engram__errno(errno, "remove %s/%s", st->path, name);
    *unpublished = 1;
    if (fsync(st->dirfd) != 0)
        return engram__errno(errno, "fsync %s", st->path);
    return 0;
}

/* A directory's leftovers are dead writers' temporary files and stale
 * leases, which are always safe to remove (the dry run only looks). */
static int nsdir_gc(void *rs, uint64_t idle_ms, uint32_t flags, engram_gc_report_fn report,
                    void *ud)
{
    (void)idle_ms;
    (void)report;
    (void)ud;
    if (!(flags & ENGRAM_GC_DRY_RUN))
        engram__clean_temps(rs);
    return 0;
}

static int nsdir_has(void *rs, const char *name)
{
    engram_store *st = rs;
    struct stat sb;
    return fstatat(st->dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
}

/* A store reading tables of the namespace holds its lease (gc leaves the
 * namespace alone while it lives). */
static void nsdir_use(void *rs)
{
    engram__lease_take(rs);
}

/* Bytes of the namespace's table files (the cache budget rule's measure). */
static uint64_t nsdir_bytes(void *rs)
{
    engram_store *st = rs;
    uint64_t sum = 0;
    struct dirent *de;
    DIR *d;
    int fd;
    if ((fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return 0;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return 0;
    }
    while ((de = readdir(d)) != NULL) {
        struct stat sb;
        if (engram__name_valid(de->d_name) &&
            fstatat(st->dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode))
            sum += (uint64_t)sb.st_size;
    }
    closedir(d);
    return sum;
}

/* engram_table_open_wait() in a directory: woken by inotify when an entry
 * appears, and gives up when the directory is removed. */
static int nsdir_wait(void *rs, const char *name, int timeout_ms, uint64_t deadline,
                      engram_table_id *id)
{
    engram_store *st = rs;
    char path[64];
    int err, ifd;
    /* The watch is on the directory the store holds (through its
     * descriptor), whatever its path names now; set before the next try,
     * so that a publication between the two is not missed. */
    snprintf(path, sizeof path, "/proc/self/fd/%d", st->dirfd);
    if ((ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) >= 0 &&
        inotify_add_watch(ifd, path, IN_CREATE | IN_MOVED_TO | IN_ONLYDIR | IN_DELETE_SELF |
                                         IN_MOVE_SELF) < 0) {
        close(ifd);
        ifd = -1;
    }
    for (;;) {
        struct pollfd pfd;
        struct stat sb;
        uint64_t now, left;
        int ms;
        if ((err = engram_table_open(st, name, id)) != -ENOENT)
            break;
        if (fstat(st->dirfd, &sb) == 0 && sb.st_nlink == 0) {
            err = engram__err(-ENOENT, "namespace %s was removed while waiting for table '%s'",
                              st->path, name);
            break;
        }
        now = engram__now_ns();
        if (now >= deadline) {
            char ent[ENGRAM_NAME_MAX + 64], who[160];
            int wfd = engram__live_writer(st, name, ent, sizeof ent);
            if (wfd < 0) {
                err = engram__err(-ETIMEDOUT, "table '%s' was not published in %s within %d ms",
                                  name, st->path, timeout_ms);
                break;
            }
            /* A writer holds the name: say which, it may be the one that
             * hangs. */
            engram__temp_holder(wfd, ent, who, sizeof who);
            close(wfd);
            err = engram__err(-ETIMEDOUT, "table '%s' was not published in %s within %d ms: "
                                          "it is being written %s (temporary file %s)",
                              name, st->path, timeout_ms, who, ent);
            break;
        }
        left = (deadline - now + 999999u) / 1000000u;
        ms = left > INT_MAX ? INT_MAX : (int)left;
        if (ifd < 0) {
            struct timespec ts = {0, (long)(ms < WAIT_POLL_MS ? ms : WAIT_POLL_MS) * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        pfd.fd = ifd;
        pfd.events = POLLIN;
        if (poll(&pfd, 1, ms < WAIT_ALIVE_MS ? ms : WAIT_ALIVE_MS) > 0 && drain_events(ifd)) {
            err = engram__err(-ENOENT, "namespace %s was removed while waiting for table '%s'",
                              st->path, name);
            break;
        }
    }
    if (ifd >= 0)
        close(ifd);
    return err;
}

/* The placement of a table file of the namespace, from a mapping of its
 * data made for the query. */
static int nsdir_placement(void *rs, const char *name, engram_table_placement *p)
{
    engram_store *st = rs;
    engram__header h;
    struct stat sb;
    void *addr;
    int fd, err;
    if ((fd = engram__open_table_file(st->dirfd, st->path, st->uid, name, &sb, &h)) < 0)
        return fd;
    addr = mmap(NULL, (size_t)h.data_size, PROT_READ, MAP_SHARED, fd, (off_t)h.data_offset);
    if (addr == MAP_FAILED) {
        err = engram__errno(errno, "mmap table '%s' to query its placement", name);
        goto out;
    }
    err = engram__numa_query(addr, (size_t)h.data_size, 1, p);
    munmap(addr, (size_t)h.data_size);
out:
    close(fd);
    return err;
}

static int nsdir_verify(engram_store *st, const char *name, engram_progress_fn progress,
                        void *ud)
{
    engram__header h;
    struct stat sb;
    uint64_t sum;
    int fd, err;

    if ((fd = engram__open_table_file(st->dirfd, st->path, st->uid, name, &sb, &h)) < 0)
        return fd;
    if ((err = engram__checksum_fd(fd, &h, name, progress, ud, &sum)) != 0)
        goto out;
    if (sum != h.data_checksum)
        err = engram__err(ENGRAM_ECHECKSUM, "table '%s': data checksum %016llx != %016llx in the "
                                            "header (data corrupt)",
                          name, (unsigned long long)sum, (unsigned long long)h.data_checksum);
out:
    close(fd);
    return err;
}

/* ------------------------------------------------------------------------
 * Writing a table file (writer.c's steps, docs/format.md section 5): the
 * namespace interface's writer of a directory.  writer.c checks the name
 * against the store and keeps the writer's failure.
 */

#define BUF_SIZE ((size_t)4 << 20)

typedef struct fwriter {
    engram_store *st;
    int fd;
    char name[ENGRAM_NAME_MAX + 1];
    char tmp[ENGRAM_NAME_MAX + 64];
    engram__header h;
    uint64_t rows_done;
    XXH3_state_t *xs;
    unsigned char *buf; /* rows formatted at their pitch, BUF_SIZE bytes */
    int in_place_ok;    /* the data region may be written in place (below) */
    unsigned char *map; /* the data region mapped writable, or NULL */
} fwriter;

static int write_full(int fd, const void *buf, size_t len, uint64_t off, const char *what)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return engram__errno(errno, "write %s", what);
        }
        done += (size_t)n;
    }
    return 0;
}

static void fw_free(fwriter *w)
{
    if (w->map)
        munmap(w->map, (size_t)w->h.data_size);
    if (w->fd >= 0) {
        unlinkat(w->st->dirfd, w->tmp, 0);
        close(w->fd);
    }
    XXH3_freeState(w->xs);
    free(w->buf);
    free(w);
}

/* Allocates bytes [off, off + len) of w's file (*reserved: 1 if it did).
 * File systems without fallocate (EOPNOTSUPP, EINVAL) are tolerated: they
 * get no reservation. */
static int reserve(fwriter *w, uint64_t off, uint64_t len, int *reserved)
{
    int err = posix_fallocate(w->fd, (off_t)off, (off_t)len);
    if (reserved)
        *reserved = err == 0;
    if (err == 0 || err == EOPNOTSUPP || err == EINVAL)
        return 0;
    return engram__errno(err, "reserve %llu bytes at offset %llu of table '%s' in %s",
                         (unsigned long long)len, (unsigned long long)off, w->name, w->st->path);
}

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

/* Refuses a placement in a namespace whose pages a policy on the file
 * would not place (anything but a tmpfs). */
static int placement_fits(engram_store *st, const engram__numa *pl, const char *name)
{
    struct statfs fs;
    if (pl->policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    if (fstatfs(st->dirfd, &fs) != 0)
        return engram__errno(errno, "statfs %s", st->path);
    if (fs.f_type != TMPFS_MAGIC)
        return engram__err(-ENOTSUP, "table '%s': NUMA placement (%s) of a written table needs "
                                     "a tmpfs namespace (/dev/shm); %s is on another file "
                                     "system, whose cached pages go wherever the process that "
                                     "reads them runs (place private copies at open instead)",
                           name, pl->desc, st->path);
    return 0;
}

/* Gives w's file the placement `pl` (step 2): a policy set with mbind() on
 * a shared mapping of a tmpfs file is the file's own (the inode's), and
 * every page allocated for the range afterwards follows it, by whatever
 * call (fallocate, write, a fault) and whoever makes it.  The mapping is
 * only the handle; it goes at once. */
static int place_file(fwriter *w, const engram__numa *pl)
{
    char what[ENGRAM_NAME_MAX + 16];
    void *addr;
    int err;
    if (pl->policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    addr = mmap(NULL, (size_t)w->h.data_size, PROT_READ, MAP_SHARED, w->fd,
                (off_t)w->h.data_offset);
    if (addr == MAP_FAILED)
        return engram__errno(errno, "map table '%s' to place it", w->name);
    snprintf(what, sizeof what, "table '%s'", w->name);
    err = engram__numa_apply(addr, (size_t)w->h.data_size, pl, what);
    munmap(addr, (size_t)w->h.data_size);
    return err;
}

/* A writer of table `name` with placement `pl` (the store's, or a node
 * copy's): steps 1 and 2. */
static int nsdir_writer_begin_placed(void *rs, const char *name, const engram_table_spec *spec,
                                     const engram__numa *pl, void **out)
{
    engram_store *st = rs;
    fwriter *w = NULL;
    int err;

    if ((err = placement_fits(st, pl, name)) != 0)
        return err;
    if (!(w = calloc(1, sizeof *w)))
        return engram__err(-ENOMEM, "out of memory");
    w->st = st;
    w->fd = -1;
    if ((err = engram__spec_size(spec, &w->h.data_size)) != 0)
        goto fail;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->h.version = engram__header_version(0); /* until a range is set */
    w->h.checksum_algo = ENGRAM__CHECKSUM_XXH3_64;
    w->h.num_rows = spec->num_rows;
    w->h.row_bytes = spec->row_bytes;
    w->h.row_pitch = engram__spec_pitch(spec);
    w->h.data_offset = engram__align_up(ENGRAM__HEADER_SIZE, ENGRAM__DATA_ALIGN);
    snprintf(w->h.name, sizeof w->h.name, "%s", name);
    if (!(w->xs = XXH3_createState()) || !(w->buf = malloc(BUF_SIZE))) {
        err = engram__err(-ENOMEM, "out of memory for a writer");
        goto fail;
    }
    XXH3_64bits_reset(w->xs);
    {
        /* Room for the file (and, on a tmpfs, under this process's memory
         * cgroup), before anything is written: a clear refusal instead of
         * a kill or a full disk part way. */
        char what[ENGRAM_NAME_MAX + 16];
        snprintf(what, sizeof what, "table '%s'", name);
        if ((err = engram__capacity_check(st->dirfd, st->path,
                                          engram__table_file_bytes(spec, 0), what, 0)) != 0)
            goto fail;
    }
    if ((err = engram__temp_create(st, name, w->tmp, sizeof w->tmp, &w->fd)) != 0 ||
        (err = place_file(w, pl)) != 0)
        goto fail;
    /* Reserve the header and the data region now: a full disk (or a 64 MiB
     * /dev/shm in a container) fails here, before any row is written, and
     * not at commit, whose header write would otherwise be the first to
     * need a new block where the data fit exactly.  The padding between
     * the header and the data offset stays a hole. */
    if ((err = reserve(w, 0, ENGRAM__HEADER_SIZE, NULL)) != 0 ||
        (err = reserve(w, w->h.data_offset, w->h.data_size, &w->in_place_ok)) != 0)
        goto fail;
    /* Rows written in place (engram__writer_region()) go only to a tmpfs
     * whose pages fallocate made: writing there cannot fault for want of
     * space.  On a disk, a store through a mapping that finds no block
     * (or an I/O error) is a SIGBUS, not an error: rows go by write(2). */
    {
        struct statfs fs;
        w->in_place_ok = w->in_place_ok && w->h.row_pitch == w->h.row_bytes &&
                         fstatfs(w->fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC;
    }
    if (ftruncate(w->fd, (off_t)(w->h.data_offset + w->h.data_size)) != 0) {
        err = engram__errno(errno, "size table '%s' in %s", name, st->path);
        goto fail;
    }
    *out = w;
    return 0;
fail:
    fw_free(w);
    return err;
}

static int nsdir_writer_begin(void *rs, const char *name, const engram_table_spec *spec,
                              void **out)
{
    engram_store *st = rs;
    return nsdir_writer_begin_placed(st, name, spec, &st->numa, out);
}


static int nsdir_writer_range(void *fw, uint64_t row_start, uint64_t total_rows)
{
    fwriter *w = fw;
    int err;
    /* A bad range is the caller's argument, not a failure of the writer:
     * it stays usable. */
    if ((err = engram__range_check(row_start, w->h.num_rows, total_rows)) != 0)
        return engram__err(err, "table '%s': %s", w->name, engram_errmsg());
    w->h.flags |= ENGRAM__FLAG_ROW_RANGE;
    w->h.version = engram__header_version(w->h.flags);
    w->h.row_start = row_start;
    w->h.total_rows = total_rows;
    return 0;
}

static int nsdir_writer_origin(void *fw, const engram_origin *o)
{
    fwriter *w = fw;
    w->h.flags |= ENGRAM__FLAG_ORIGIN;
    w->h.version = engram__header_version(w->h.flags);
    /* Copied field by field: the bytes after each string's NUL stay zero,
     * as the header's encoding wants. */
    memset(&w->h.origin, 0, sizeof w->h.origin);
    w->h.origin.kind = o->kind;
    w->h.origin.epoch = o->epoch;
    memcpy(w->h.origin.ns, o->ns, strlen(o->ns));
    memcpy(w->h.origin.where, o->where, strlen(o->where));
    return 0;
}

/* Step 3.  An error fails the writer (writer.c keeps that). */
static int nsdir_writer_append(void *fw, const void *rows, uint64_t nrows, size_t src_stride)
{
    fwriter *w = fw;
    const unsigned char *src = rows;
    size_t rb, pitch, per_buf;
    int err;

    if (nrows == 0)
        return 0;
    rb = w->h.row_bytes;
    pitch = w->h.row_pitch;
    if (!src_stride)
        src_stride = rb;
    if (!rows || src_stride < rb)
        return engram__err(-EINVAL, "append to '%s': rows NULL or stride %zu < row_bytes %zu",
                           w->name, src_stride, rb);
    if (nrows > w->h.num_rows - w->rows_done)
        return engram__err(ENGRAM_ESTATE, "append of %llu rows to '%s' goes beyond its %llu rows",
                           (unsigned long long)nrows, w->name,
                           (unsigned long long)w->h.num_rows);
    if (w->map && src == w->map + w->rows_done * rb && src_stride == rb) {
        /* Rows at their own place in the region (engram__writer_region()):
         * taken where they are.  A store through a mapping of a tmpfs file
         * leaves its times alone: ranks waiting for this pull see it move
         * (wait_for_writer()). */
        XXH3_64bits_update(w->xs, src, (size_t)(nrows * rb));
        w->rows_done += nrows;
        (void)futimens(w->fd, NULL);
        return 0;
    }
    per_buf = BUF_SIZE / pitch;
    if (per_buf == 0)
        per_buf = 1;
    while (nrows > 0) {
        uint64_t off = w->h.data_offset + w->rows_done * pitch;
        size_t n = nrows < per_buf ? (size_t)nrows : per_buf, len = n * pitch;
        const unsigned char *out;
        if (pitch == rb && src_stride == rb) {
            out = src; /* already in file layout: write straight from the caller */
        } else if (len <= BUF_SIZE) {
            unsigned char *b = w->buf;
            for (size_t i = 0; i < n; i++) {
                memcpy(b + i * pitch, src + i * src_stride, rb);
                memset(b + i * pitch + rb, 0, pitch - rb);
            }
            out = b;
        } else {
            /* One row larger than the buffer (huge pitch): write it in two. */
            static const unsigned char zeros[4096];
            if ((err = write_full(w->fd, src, rb, off, w->tmp)) != 0)
                goto fail;
            XXH3_64bits_update(w->xs, src, rb);
            for (size_t z = rb; z < pitch; z += sizeof zeros) {
                size_t zn = pitch - z < sizeof zeros ? pitch - z : sizeof zeros;
                if ((err = write_full(w->fd, zeros, zn, off + z, w->tmp)) != 0)
                    goto fail;
                XXH3_64bits_update(w->xs, zeros, zn);
            }
            goto next;
        }
        if ((err = write_full(w->fd, out, len, off, w->tmp)) != 0)
            goto fail;
        XXH3_64bits_update(w->xs, out, len);
    next:
        w->rows_done += n;
        nrows -= n;
        src += n * src_stride;
    }
    return 0;
fail:
    return err;
}

/* Step 4, and the writer freed, whatever happens. */
static int nsdir_writer_commit(void *fw)
{
    unsigned char hdr[ENGRAM__HEADER_SIZE];
    fwriter *w = fw;
    engram_store *st = w->st;
    int err;

    if (w->rows_done != w->h.num_rows) {
        err = engram__err(ENGRAM_ESTATE, "table '%s': only %llu of %llu rows were written",
                          w->name, (unsigned long long)w->rows_done,
                          (unsigned long long)w->h.num_rows);
        goto out;
    }
    if (w->map) { /* written in place: the file holds the rows */
        munmap(w->map, (size_t)w->h.data_size);
        w->map = NULL;
    }
    w->h.data_checksum = XXH3_64bits_digest(w->xs);
    w->h.created_ns = engram__wall_ns();
    engram__header_encode(&w->h, hdr);
    if ((err = write_full(w->fd, hdr, sizeof hdr, 0, w->tmp)) != 0)
        goto out;
    if (fsync(w->fd) != 0) {
        err = engram__errno(errno, "fsync %s/%s", st->path, w->tmp);
        goto out;
    }
    if (fchmod(w->fd, (st->opts.flags & ENGRAM_OPEN_GROUP) ? 0440 : 0400) != 0) {
        err = engram__errno(errno, "chmod %s/%s", st->path, w->tmp);
        goto out;
    }
    /* Publication and the bound-name check happen under the store lock so
     * a concurrent engram_bind() of the same name cannot also succeed. */
    pthread_mutex_lock(&st->lock);
    if (engram__find_locked(st, w->name, NULL))
        err = engram__err(-EEXIST, "table '%s' already exists in %s", w->name, st->path);
    else if (linkat(st->dirfd, w->tmp, st->dirfd, w->name, 0) != 0)
        err = errno == EEXIST
                  ? engram__err(-EEXIST, "table '%s' already exists in %s", w->name, st->path)
                  : engram__errno(errno, "publish %s/%s", st->path, w->name);
    pthread_mutex_unlock(&st->lock);
    if (err)
        goto out;
    unlinkat(st->dirfd, w->tmp, 0);
    close(w->fd);
    w->fd = -1;
    if (fsync(st->dirfd) != 0)
        err = engram__errno(errno, "fsync %s (table '%s' is published but may not survive a "
                                   "crash)",
                            st->path, w->name);
out:
    fw_free(w);
    return err;
}

/* writer.h: engram__writer_region() of a directory's writer. */
static unsigned char *nsdir_writer_region(void *fw, uint64_t bytes)
{
    fwriter *f = fw;
    void *addr;
    if (!f->in_place_ok || f->rows_done != 0 || f->h.data_size == 0 || bytes != f->h.data_size)
        return NULL;
    if (f->map)
        return f->map;
    addr = mmap(NULL, (size_t)f->h.data_size, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd,
                (off_t)f->h.data_offset);
    if (addr == MAP_FAILED)
        return NULL;
    return f->map = addr;
}

static void nsdir_writer_abort(void *fw)
{
    fw_free(fw);
}

/* nsdir.h */
const char *engram__writer_temp(const engram_writer *w)
{
    return ((const fwriter *)engram__writer_impl(w))->tmp;
}

uint64_t engram__writer_sum(const engram_writer *w)
{
    return XXH3_64bits_digest(((const fwriter *)engram__writer_impl(w))->xs);
}

/* engram_populate_shared(): waits for a running writer of `name` (1:
 * it ended, look again), or says there is none (0), or that it still
 * writes at the deadline (-ETIMEDOUT, naming it: one that hangs holds the
 * name until it ends). */
static int nsdir_writer_wait(void *rs, const char *name, int timeout_ms, uint64_t *deadline)
{
    engram_store *st = rs;
    char ent[ENGRAM_NAME_MAX + 64];
    int fd;
    if ((fd = engram__live_writer(st, name, ent, sizeof ent)) < 0)
        return 0;
    /* Its lock goes when it commits, aborts or dies. */
    if (!*deadline)
        *deadline = timeout_ms < 0 ? UINT64_MAX
                                   : engram__now_ns() + (uint64_t)timeout_ms * 1000000u;
    if (engram__wait_writer(fd, *deadline) != 0) {
        char who[160];
        engram__temp_holder(fd, ent, who, sizeof who);
        close(fd);
        return engram__err(-ETIMEDOUT, "table '%s' is still being written in %s %s "
                                       "(temporary file %s); gave up waiting for it "
                                       "after %d ms (a writer that hangs holds the "
                                       "name until it ends)",
                           name, st->path, who, ent, timeout_ms);
    }
    close(fd);
    return 1;
}


int engram_numa_copy(engram_store *st, const char *name, int node, int *written)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram__numa pl;
    engram__header h;
    engram_table_spec spec;
    char copy[ENGRAM_NAME_MAX + 32];
    struct stat sb;
    void *rows = MAP_FAILED;
    int fd = -1, err;

    if (written)
        *written = 0;
    if (!st || !name)
        return engram__err(-EINVAL, "store and name are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    if (node < 0)
        return engram__err(-EINVAL, "node copy of '%s': node %d is not a node", name, node);
    engram__numa_copy_name(copy, sizeof copy, name, node);
    if (strlen(copy) > ENGRAM_NAME_MAX)
        return engram__err(ENGRAM_ESPEC, "node copy of '%s': its name '%s' is longer than %d "
                                         "bytes",
                           name, copy, ENGRAM_NAME_MAX);
    if (!engram__store_remote(st, &engram__nsdir_vt))
        return engram__err(-ENOTSUP, "node copy of '%s': %s is not a namespace directory", name,
                           st->path);
    /* The node is checked as a store's numa_node is. */
    o.numa_policy = ENGRAM_NUMA_NODE;
    o.numa_node = node;
    if ((err = engram__numa_resolve(&o, &pl)) != 0 || (err = placement_fits(st, &pl, copy)) != 0)
        return err;
    /* The rows come from a read-only mapping of the table's file. */
    if ((fd = engram__open_table_file(st->dirfd, st->path, st->uid, name, &sb, &h)) < 0)
        return fd;
    if ((err = engram__check_holes(fd, &h, name)) != 0)
        goto out;
    rows = mmap(NULL, (size_t)h.data_size, PROT_READ, MAP_SHARED, fd, (off_t)h.data_offset);
    if (rows == MAP_FAILED) {
        err = engram__errno(errno, "map table '%s' to copy it", name);
        goto out;
    }
    spec.num_rows = h.num_rows;
    spec.row_bytes = h.row_bytes;
    spec.row_pitch = h.row_pitch;
    err = engram__populate_shared(st, copy, &spec, rows, h.row_pitch,
                                  (h.flags & ENGRAM__FLAG_ROW_RANGE) ? h.row_start : 0,
                                  (h.flags & ENGRAM__FLAG_ROW_RANGE) ? h.total_rows : 0, &pl,
                                  ENGRAM_SHARED_WAIT_MS, written);
out:
    if (rows != MAP_FAILED)
        munmap(rows, (size_t)h.data_size);
    close(fd);
    return err;
}

const engram__remote_vt engram__nsdir_vt = {
    .kind = ENGRAM_TABLE_FILE,
    .close = nsdir_close,
    .open = nsdir_open,
    .info = nsdir_info,
    .list = nsdir_list,
    .remove = nsdir_remove,
    .gc = nsdir_gc,
    .verify = nsdir_verify,
    .lazy_ctx = 1,
    .current_locked = nsdir_current_locked,
    .has = nsdir_has,
    .bytes = nsdir_bytes,
    .use = nsdir_use,
    .wait = nsdir_wait,
    .placement = nsdir_placement,
    .writer_begin = nsdir_writer_begin,
    .writer_append = nsdir_writer_append,
    .writer_commit = nsdir_writer_commit,
    .writer_abort = nsdir_writer_abort,
    .writer_begin_placed = nsdir_writer_begin_placed,
    .writer_range = nsdir_writer_range,
    .writer_origin = nsdir_writer_origin,
    .writer_wait = nsdir_writer_wait,
    .writer_region = nsdir_writer_region,
};
