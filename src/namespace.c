/*
 * namespace.c - the namespaces of a root: listing them and removing one.
 *
 * Both work through what the rest of the library offers rather than
 * beside it: a namespace is opened with engram_store_open() (its trust
 * rules, the cleanup of dead writers' temporary files), its tables are
 * read with engram_get_table_info() and removed with engram_remove().  The
 * directory goes last, with rmdir(2), which removes only an empty
 * directory: whatever appears in it meanwhile (a table another process
 * published) stops the removal instead of being lost with it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fsutil.h"
#include "lease.h"
#include "nsdir.h"
#include "store.h"

#define TMP_PREFIX ENGRAM__TMP_PREFIX

int engram_namespace_list(const char *root, char ***names, size_t *count)
{
    engram__namelist l = {0};
    struct stat sb;
    struct dirent *de;
    DIR *d;
    int fd, err = 0;

    if (!names || !count)
        return engram__err(-EINVAL, "names and count are required");
    *names = NULL;
    *count = 0;
    if (!root)
        root = engram_default_root();
    if ((fd = engram__open_dir(AT_FDCWD, root, root, &sb)) < 0)
        return fd;
    if (!(d = fdopendir(fd))) {
        err = engram__errno(errno, "read directory %s", root);
        close(fd);
        return err;
    }
    while (!err && (de = readdir(d)) != NULL) {
        struct stat esb;
        /* Directories only, never through a link. */
        if (engram__name_valid(de->d_name) &&
            fstatat(dirfd(d), de->d_name, &esb, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISDIR(esb.st_mode))
            err = engram__namelist_add(&l, de->d_name);
    }
    closedir(d);
    if (err == -ENOMEM)
        err = engram__err(-ENOMEM, "out of memory listing %s", root);
    if (!err)
        err = engram__namelist_pack(&l, root, names, count);
    engram__namelist_free(&l);
    return err;
}

/* The table a writer's temporary file is for, into buf (the part after
 * the prefix, for a name that is not one a writer makes). */
static const char *temp_table(const char *entry, char *buf, size_t cap)
{
    if (!engram__temp_parse(entry, buf, cap, NULL))
        snprintf(buf, cap, "%s", entry + strlen(TMP_PREFIX));
    return buf;
}

/* What an entry that is not a table is, for a message: "a FIFO", ... */
static const char *entry_kind(engram_store *st, const char *name)
{
    struct stat sb;
    if (fstatat(st->dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return "an entry";
    if (S_ISLNK(sb.st_mode))
        return "a symbolic link";
    if (S_ISDIR(sb.st_mode))
        return "a directory";
    if (S_ISFIFO(sb.st_mode))
        return "a FIFO";
    if (S_ISSOCK(sb.st_mode))
        return "a socket";
    if (S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode))
        return "a device";
    if (sb.st_uid != st->uid)
        return "a file of another user";
    return "a file";
}

/* What stops the removal of a namespace in entry `name` of it (`path`):
 * 0 for a table (counted in *tables), or the failure naming the entry. */
static int classify(engram_store *st, const char *path, const char *name, uint32_t flags,
                    int dry, size_t *tables)
{
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    char table[ENGRAM_NAME_MAX + 1];
    int err;

    if (strncmp(name, ENGRAM__LEASE_PREFIX, strlen(ENGRAM__LEASE_PREFIX)) == 0) {
        char who[200] = "";
        int live = engram__lease_state(st->dirfd, st->uid, name, who, sizeof who, NULL);
        if (live == 1 && !(flags & ENGRAM_NS_REMOVE_IN_USE))
            return engram__err(-EBUSY, "namespace %s is in use: a process holds lease %s "
                                       "(%s); stop it, or pass ENGRAM_NS_REMOVE_IN_USE (its "
                                       "open tables stay readable)",
                               path, name, who);
        if (live >= 0)
            return 0; /* stale, this process's or allowed: removed with the tables */
    }
    if (strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0) {
        char who[160];
        switch (engram__temp_state(st->dirfd, st->uid, name, who, sizeof who, NULL)) {
        case ENGRAM__TEMP_GONE:
            return 0; /* committed or removed meanwhile */
        case ENGRAM__TEMP_LIVE:
            return engram__err(-EBUSY, "namespace %s: table '%s' is being written %s "
                                       "(temporary file %s)",
                               path, temp_table(name, table, sizeof table), who, name);
        case ENGRAM__TEMP_DEAD:
            if (dry)
                return 0; /* the removal's open would remove it */
            return engram__err(-EBUSY, "namespace %s: temporary file %s of a writer that died "
                                       "is still there (another process held the namespace's "
                                       "lock when this removal opened it, and the cleanup was "
                                       "put off); try again",
                               path, name);
        default:
            /* Not a writer's, whatever its name: a stray entry, like the
             * foreign entries below. */
            return engram__err(-ENOTEMPTY, "namespace %s holds '%s', which is not an engram "
                                           "table (%s, not a writer's temporary file); not "
                                           "removing it",
                               path, name, entry_kind(st, name));
        }
    }
    if (!engram__name_valid(name))
        return engram__err(-ENOTEMPTY, "namespace %s holds '%s', which is not an engram table; "
                                       "not removing it",
                           path, name);
    err = engram_get_table_info(st, name, &info);
    if (err == -ENOENT)
        return 0; /* removed meanwhile */
    if (err != 0)
        return engram__err(-ENOTEMPTY, "namespace %s holds '%s', which is not an engram table "
                                       "(%s); not removing it",
                           path, name, engram_errmsg());
    (*tables)++;
    return 0;
}

/* engram_namespace_remove(); with `dry` (and ENGRAM_NS_REMOVE_TABLES),
 * only step 1 on a store opened without its cleanup: whether the removal
 * would go ahead, removing nothing (the dead's files a removal would
 * remove do not stop it). */
static int ns_remove(const char *root, const char *ns, uint32_t flags, int dry)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    char **names = NULL, first[3 * (ENGRAM_NAME_MAX + 4) + 1] = "";
    size_t count = 0, tables = 0;
    struct stat sb;
    struct dirent *de;
    DIR *d = NULL;
    char *path = NULL;
    int rootfd = -1, fd, err;

    if (flags & ~(ENGRAM_NS_REMOVE_TABLES | ENGRAM_NS_REMOVE_IN_USE))
        return engram__err(-EINVAL, "unknown flags 0x%x", (unsigned)flags);
    if (!root)
        root = engram_default_root();
    if ((err = engram_name_check(ns)) != 0)
        return engram__err(err, "namespace: %s", engram_errmsg());
    o.threads = 1;
    if ((err = engram__store_open_dir(root, ns, &o, !dry, &st)) != 0)
        return err;
    if (!(path = malloc(strlen(root) + strlen(ns) + 2))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto out;
    }
    sprintf(path, "%s/%s", root, ns);
    /* 1. Look at every entry before removing anything. */
    if ((rootfd = engram__open_dir(AT_FDCWD, root, root, &sb)) < 0) {
        err = rootfd;
        rootfd = -1;
        goto out;
    }
    if ((fd = engram__open_dir(rootfd, ns, path, &sb)) < 0) {
        err = fd;
        goto out;
    }
    if (!(d = fdopendir(fd))) {
        err = engram__errno(errno, "read directory %s", path);
        close(fd);
        goto out;
    }
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if ((err = classify(st, path, de->d_name, flags, dry, &tables)) != 0)
            goto out;
    }
    /* A dry run (gc's, always with ENGRAM_NS_REMOVE_TABLES, so the tables
     * stop nothing) ends with the look. */
    if (dry)
        goto out;
    if (tables > 0 && (err = engram_list(st, &names, &count)) != 0)
        goto out;
    if (tables > 0 && !(flags & ENGRAM_NS_REMOVE_TABLES)) {
        for (size_t i = 0; i < count && i < 3; i++) {
            size_t len = strlen(first);
            snprintf(first + len, sizeof first - len, "%s'%s'", i ? ", " : "", names[i]);
        }
        err = engram__err(-ENOTEMPTY, "namespace %s holds %zu table%s (%s%s); remove them first "
                                      "or pass ENGRAM_NS_REMOVE_TABLES",
                          path, tables, tables == 1 ? "" : "s", first, count > 3 ? ", ..." : "");
        goto out;
    }
    /* 2. The tables, as engram_remove() removes them (those listed now:
     * one published since the look stops step 3), and the leases step 1
     * let pass (a lease taken since is live and stops step 3). */
    for (size_t i = 0; i < count; i++)
        if ((err = engram_remove(st, names[i])) != 0 && err != -ENOENT)
            goto out;
    err = 0;
    rewinddir(d);
    while ((de = readdir(d)) != NULL) {
        int live = engram__lease_state(st->dirfd, st->uid, de->d_name, NULL, 0, NULL);
        if (live == 0 || live == 2 || (live == 1 && (flags & ENGRAM_NS_REMOVE_IN_USE)))
            unlinkat(st->dirfd, de->d_name, 0);
    }
    /* 3. The directory, if it is empty now. */
    if (unlinkat(rootfd, ns, AT_REMOVEDIR) != 0) {
        if (errno != ENOTEMPTY && errno != EEXIST) {
            err = engram__errno(errno, "remove %s", path);
            goto out;
        }
        /* Something arrived since the look: say what. */
        closedir(d);
        d = NULL;
        if ((fd = engram__open_dir(rootfd, ns, path, &sb)) >= 0 && !(d = fdopendir(fd)))
            close(fd);
        err = 0;
        while (!err && d && (de = readdir(d)) != NULL)
            if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                err = engram__err(-ENOTEMPTY, "namespace %s: '%s' appeared while it was being "
                                              "removed; not removing it",
                                  path, de->d_name);
        if (!err)
            err = engram__err(-ENOTEMPTY, "namespace %s is not empty", path);
        goto out;
    }
    /* The removal lasts a crash, as a table's publication does. */
    if (fsync(rootfd) != 0)
        err = engram__errno(errno, "fsync %s", root);
out:
    if (d)
        closedir(d);
    if (rootfd >= 0)
        close(rootfd);
    engram_free(names);
    engram_store_close(st);
    free(path);
    return err;
}

int engram_namespace_remove(const char *root, const char *ns, uint32_t flags)
{
    return ns_remove(root, ns, flags, 0);
}

/* ------------------------------------------------------------------------
 * Users and garbage collection (leases: lease.c).
 */

/* The live leases of the namespace open at `fd` (owned by `uid`) and the
 * time it was last used: the latest of its own and its leases'
 * modification times. */
static void users_of(int fd, uid_t uid, engram_namespace_use *u)
{
    struct stat sb;
    struct dirent *de;
    DIR *d;
    int dfd = dup(fd);
    if (fstat(fd, &sb) == 0)
        u->last_used_ns = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
    if (dfd < 0 || !(d = fdopendir(dfd))) {
        if (dfd >= 0)
            close(dfd);
        return;
    }
    while ((de = readdir(d)) != NULL) {
        uint64_t mt = 0;
        char who[sizeof u->first_user] = "";
        int live = engram__lease_state(fd, uid, de->d_name, who, sizeof who, &mt);
        if (live < 0)
            continue;
        if (mt > u->last_used_ns)
            u->last_used_ns = mt;
        if (live) {
            if (u->users++ == 0)
                snprintf(u->first_user, sizeof u->first_user, "%s", who);
        } else {
            u->stale_leases++;
        }
    }
    closedir(d);
}

int engram_namespace_usage(const char *root, const char *ns, engram_namespace_use *u)
{
    struct stat sb;
    char *path;
    int rootfd, fd, err;
    if (!u || u->size != sizeof *u)
        return engram__err(-EINVAL, "use (with size = sizeof(engram_namespace_use)) is required");
    memset(u, 0, sizeof *u);
    u->size = sizeof *u;
    if (!root)
        root = engram_default_root();
    if ((err = engram_name_check(ns)) != 0)
        return engram__err(err, "namespace: %s", engram_errmsg());
    if (!(path = malloc(strlen(root) + strlen(ns) + 2)))
        return engram__err(-ENOMEM, "out of memory");
    sprintf(path, "%s/%s", root, ns);
    if ((rootfd = engram__open_dir(AT_FDCWD, root, root, &sb)) < 0) {
        free(path);
        return rootfd;
    }
    if ((fd = engram__open_dir(rootfd, ns, path, &sb)) < 0) {
        err = fd;
    } else {
        users_of(fd, sb.st_uid, u);
        close(fd);
        err = 0;
    }
    close(rootfd);
    free(path);
    return err;
}

int engram_namespace_gc(const char *root, uint64_t idle_s, uint32_t flags,
                        engram_gc_report_fn report, void *ud)
{
    char **names = NULL;
    size_t count = 0;
    uint64_t now = engram__wall_ns(), idle_ns;
    int err;
    if (flags & ~ENGRAM_GC_DRY_RUN)
        return engram__err(-EINVAL, "unknown flags 0x%x", (unsigned)flags);
    if (!root)
        root = engram_default_root();
    if ((err = engram_namespace_list(root, &names, &count)) != 0)
        return err;
    idle_ns = idle_s > UINT64_MAX / 1000000000u ? UINT64_MAX : idle_s * 1000000000u;
    for (size_t i = 0; i < count; i++) {
        engram_namespace_use u = ENGRAM_NAMESPACE_USE_INIT;
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        engram_store *st = NULL;
        char detail[512];
        int rc;
        /* The use first: opening a store removes stale leases, which
         * touches the directory. */
        if ((rc = engram_namespace_usage(root, names[i], &u)) != 0) {
            if (report)
                report(ud, names[i], rc, engram_errmsg());
            continue;
        }
        /* Only namespaces we may open as a store (ours): the trust rules
         * decide, not the directory listing.  A dry run's open leaves the
         * dead's files alone: it changes nothing. */
        o.threads = 1;
        if ((rc = engram__store_open_dir(root, names[i], &o, !(flags & ENGRAM_GC_DRY_RUN),
                                         &st)) != 0) {
            if (report)
                report(ud, names[i], rc, engram_errmsg());
            continue;
        }
        engram_store_close(st);
        if (u.users) {
            snprintf(detail, sizeof detail, "in use (%u live lease%s: %s)", u.users,
                     u.users == 1 ? "" : "s", u.first_user);
            if (report)
                report(ud, names[i], ENGRAM_GC_KEPT, detail);
            continue;
        }
        if (u.last_used_ns > now + 60 * 1000000000ull) {
            /* Not a use during this run: the clock was set back since.
             * Its age is unknown, so it is kept, and said so. */
            snprintf(detail, sizeof detail, "last used %llu s in the future (the clock was set "
                                            "back?); kept until then",
                     (unsigned long long)((u.last_used_ns - now) / 1000000000u));
            if (report)
                report(ud, names[i], ENGRAM_GC_KEPT, detail);
            continue;
        }
        if (now < u.last_used_ns || now - u.last_used_ns < idle_ns) {
            snprintf(detail, sizeof detail, "used %llu s ago",
                     (unsigned long long)((now > u.last_used_ns ? now - u.last_used_ns : 0) /
                                          1000000000u));
            if (report)
                report(ud, names[i], ENGRAM_GC_KEPT, detail);
            continue;
        }
        snprintf(detail, sizeof detail, "no live lease, last used %llu s ago",
                 (unsigned long long)((now - u.last_used_ns) / 1000000000u));
        /* A dry run checks what the removal would check (a running
         * writer, an entry that is not a table), removing nothing. */
        rc = ns_remove(root, names[i], ENGRAM_NS_REMOVE_TABLES, (flags & ENGRAM_GC_DRY_RUN) != 0);
        if (report)
            report(ud, names[i], rc, rc ? engram_errmsg() : detail);
    }
    engram_free(names);
    return 0;
}
