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
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fsutil.h"

/* The prefix of writers' temporary files (writer.c). */
#define TMP_PREFIX ".tmp."

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

/* The table a writer's temporary file ".tmp.NAME.PID.NONCE" is for, into
 * buf. */
static const char *temp_table(const char *entry, char *buf, size_t cap)
{
    const char *name = entry + strlen(TMP_PREFIX), *end = name + strlen(name);
    for (int dots = 0; end > name && dots < 2; end--)
        if (end[-1] == '.')
            dots++;
    snprintf(buf, cap, "%.*s", (int)(end - name), name);
    return buf;
}

/* What stops the removal of a namespace in entry `name` of it (`path`):
 * 0 for a table (counted in *tables), or the failure naming the entry. */
static int classify(engram_store *st, const char *path, const char *name, size_t *tables)
{
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    char table[ENGRAM_NAME_MAX + 1];
    int err;

    if (strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0)
        return engram__err(-EBUSY, "namespace %s: table '%s' is being written (temporary file "
                                   "%s; the open before this removal would have removed it if "
                                   "its writer had died)",
                           path, temp_table(name, table, sizeof table), name);
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

int engram_namespace_remove(const char *root, const char *ns, uint32_t flags)
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

    if (flags & ~ENGRAM_NS_REMOVE_TABLES)
        return engram__err(-EINVAL, "unknown flags 0x%x", (unsigned)flags);
    if (!root)
        root = engram_default_root();
    if ((err = engram_name_check(ns)) != 0)
        return engram__err(err, "namespace: %s", engram_errmsg());
    o.threads = 1;
    if ((err = engram_store_open(root, ns, &o, &st)) != 0)
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
        if ((err = classify(st, path, de->d_name, &tables)) != 0)
            goto out;
    }
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
     * one published since the look stops step 3). */
    for (size_t i = 0; i < count; i++)
        if ((err = engram_remove(st, names[i])) != 0 && err != -ENOENT)
            goto out;
    err = 0;
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
