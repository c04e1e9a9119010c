/*
 * nsdir.c - a namespace that is a directory: engram_store_open(), and
 * the namespace interface of remote.h for it (a table is a file).
 *
 * The store (store.c) keeps the registry and the store's life; writer.c
 * writes tables; what either does in a directory namespace is here: open
 * the directory under the trust rules, make a table file's source (mapped,
 * or read on demand behind the row cache), describe, list, verify and
 * remove table files, wait for one to be published (inotify), say where
 * a file's pages are, and clean up what dead processes left
 * (engram__clean_temps(): the temporary-file and lease protocol is
 * lease.c's).  The state of the namespace is the store itself: its
 * directory descriptor (dirfd), its owner (uid), its path and options.
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
#include <time.h>
#include <unistd.h>

#include "filesrc.h"
#include "fsutil.h"
#include "lease.h"
#include "mapfile.h"
#include "nsdir.h"
#include "remote.h"
#include "store.h"

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
};
