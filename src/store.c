/*
 * store.c - stores: namespaces, the table registry, bind, open, info,
 * list, remove, verify and stats.
 *
 * Everything here runs off the lookup path and may take store->lock.  The
 * one contract with gather.c is the registry layout of store.h: tables are
 * appended and published with release stores, and freed only at close.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store.h"

static const engram__backend_ops file_ops = {ENGRAM__BACKEND_VERSION, "file", NULL,
                                             engram__unmap_table};
static const engram__backend_ops bound_ops = {ENGRAM__BACKEND_VERSION, "bound", NULL, NULL};

const char *engram_default_root(void)
{
    struct stat sb;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode))
        return "/dev/shm/engram";
    return "/tmp/engram";
}

unsigned engram__shard(int *exclusive)
{
    static _Atomic unsigned next;
    /* initial-exec: a plain %fs-relative load even in the shared library,
     * instead of a __tls_get_addr call on every lookup. */
    static _Thread_local int mine __attribute__((tls_model("initial-exec"))) = -1;
    if (ENGRAM__UNLIKELY(mine < 0))
        mine = (int)atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
    if (mine < ENGRAM__SHARDS - 1) {
        *exclusive = 1;
        return (unsigned)mine;
    }
    *exclusive = 0;
    return ENGRAM__SHARDS - 1;
}

/* Opens directory `name` relative to `at`, refusing links, and checks who
 * may change it.  A namespace must be closed to writers other than its
 * owner, who must be us, or with ENGRAM_OPEN_GROUP anyone (a group member
 * reading the owner's tables).  The root may also belong to root (e.g.
 * /dev/shm itself) and be world-writable if sticky.  *owner receives the
 * directory's owner: the only uid whose files the store will trust. */
static int open_dir_checked(int at, const char *name, const char *what, int is_root,
                            int any_owner, uid_t *owner)
{
    struct stat sb;
    uid_t me = geteuid();
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), err;
    if (fd < 0) {
        err = errno;
        if (err == ELOOP || err == ENOTDIR)
            return engram__err(ENGRAM_EUNSAFE, "%s is a link or not a directory", what);
        if (err == ENOENT)
            return engram__err(-ENOENT, "%s does not exist", what);
        return engram__errno(err, "open %s", what);
    }
    if (fstat(fd, &sb) != 0) {
        err = engram__errno(errno, "fstat %s", what);
        goto fail;
    }
    if (sb.st_uid != me && !any_owner && !(is_root && sb.st_uid == 0)) {
        err = engram__err(ENGRAM_EUNSAFE, "%s is owned by uid %u, not by us (uid %u)", what,
                          (unsigned)sb.st_uid, (unsigned)me);
        goto fail;
    }
    if ((sb.st_mode & (S_IWGRP | S_IWOTH)) && !(is_root && (sb.st_mode & S_ISVTX))) {
        err = engram__err(ENGRAM_EUNSAFE, "%s is writable by group or others (mode %04o)", what,
                          (unsigned)(sb.st_mode & 07777));
        goto fail;
    }
    *owner = sb.st_uid;
    return fd;
fail:
    close(fd);
    return err;
}

static int store_alloc(const engram_store_options *opts, engram_store **out)
{
    engram_store *st;
    long ncpu;
    *out = NULL;
    /* The options grew at their end: a caller built against the older,
     * shorter struct passes its size and gets the new fields' defaults. */
    if (opts && opts->size != sizeof(engram_store_options) &&
        opts->size != ENGRAM__STORE_OPTIONS_V1_SIZE)
        return engram__err(-EINVAL, "engram_store_options.size is %u, expected %zu (or %zu)",
                           opts->size, sizeof(engram_store_options),
                           (size_t)ENGRAM__STORE_OPTIONS_V1_SIZE);
    if (opts && opts->threads < 0)
        return engram__err(-EINVAL, "threads is %d (must be >= 0)", opts->threads);
    st = calloc(1, sizeof *st);
    if (!st)
        return engram__err(-ENOMEM, "out of memory for a store");
    st->dirfd = -1;
    st->uid = geteuid();
    if (opts)
        memcpy(&st->opts, opts, opts->size);
    st->opts.size = sizeof st->opts;
    pthread_mutex_init(&st->lock, NULL);
    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    st->threads = st->opts.threads ? st->opts.threads : (int)(ncpu < 1 ? 1 : ncpu > 8 ? 8 : ncpu);
    /* The default threshold: below it, waking a sleeping worker (tens of
     * microseconds on a VM) costs more than the rows it would copy.  See
     * docs/performance.md for the measurement behind it. */
    st->parallel_min_rows = st->opts.parallel_min_rows ? st->opts.parallel_min_rows : 4096;
    if (st->threads > 1) {
        int err = engram__pool_create(st->threads - 1, &st->pool);
        if (err) {
            pthread_mutex_destroy(&st->lock);
            free(st);
            return err;
        }
    }
    *out = st;
    return 0;
}

int engram_store_open_memory(const engram_store_options *opts, engram_store **out)
{
    int err;
    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    if ((err = store_alloc(opts, out)) != 0)
        return err;
    (*out)->path = strdup("(memory)");
    if (!(*out)->path) {
        engram_store_close(*out);
        *out = NULL;
        return engram__err(-ENOMEM, "out of memory");
    }
    return 0;
}

int engram_store_open(const char *root, const char *ns, const engram_store_options *opts,
                      engram_store **out)
{
    engram_store *st = NULL;
    int rootfd = -1, err, group;
    uid_t owner;
    size_t plen;
    mode_t mode;

    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    *out = NULL;
    if (!root)
        root = engram_default_root();
    if (engram_name_check(ns) != 0)
        return engram__err(ENGRAM_ESPEC, "namespace: %s", engram_errmsg());
    if ((err = store_alloc(opts, &st)) != 0)
        return err;
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
    if ((rootfd = open_dir_checked(AT_FDCWD, root, root, 1, group, &owner)) < 0) {
        err = rootfd;
        goto fail;
    }
    if ((st->opts.flags & ENGRAM_OPEN_CREATE) && mkdirat(rootfd, ns, mode) != 0 &&
        errno != EEXIST) {
        err = engram__errno(errno, "create namespace directory %s", st->path);
        goto fail;
    }
    if ((st->dirfd = open_dir_checked(rootfd, ns, st->path, 0, group, &st->uid)) < 0) {
        err = st->dirfd;
        st->dirfd = -1;
        if (err == -ENOENT)
            engram__err(err, "namespace %s does not exist (open with ENGRAM_OPEN_CREATE)",
                        st->path);
        goto fail;
    }
    close(rootfd);
    engram__clean_temps(st);
    *out = st;
    return 0;
fail:
    if (rootfd >= 0)
        close(rootfd);
    engram_store_close(st);
    return err;
}

void engram_store_close(engram_store *st)
{
    if (!st)
        return;
    engram__pool_destroy(st->pool);
    for (uint32_t i = 0; i < st->ntables; i++) {
        engram__table *t = engram__table_get(st, i);
        if (t && t->ops && t->ops->release)
            t->ops->release(t);
        free(t);
    }
    engram__fcache_destroy(st->fcache);
    for (int c = 0; c < ENGRAM__MAX_CHUNKS; c++)
        /* The chunk's elements are atomic, the allocation is not. */
        free((void *)(uintptr_t)atomic_load_explicit(&st->chunks[c], memory_order_relaxed));
    if (st->dirfd >= 0)
        close(st->dirfd);
    free(st->path);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

engram__table *engram__find_locked(engram_store *st, const char *name, engram_table_id *id)
{
    for (uint32_t i = 0; i < st->ntables; i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_relaxed) &&
            strcmp(t->name, name) == 0) {
            if (id)
                *id = i;
            return t;
        }
    }
    return NULL;
}

/* Appends t to the registry (st->lock held). */
static int registry_append_locked(engram_store *st, engram__table *t, engram_table_id *id)
{
    uint32_t i = st->ntables;
    _Atomic(engram__table *) *chunk;
    if (i >= (uint32_t)ENGRAM__MAX_CHUNKS * ENGRAM__CHUNK)
        return engram__err(-ENOSPC, "a store holds at most %u tables",
                           (unsigned)ENGRAM__MAX_CHUNKS * ENGRAM__CHUNK);
    chunk = atomic_load_explicit(&st->chunks[i >> ENGRAM__CHUNK_BITS], memory_order_relaxed);
    if (!chunk) {
        chunk = calloc(ENGRAM__CHUNK, sizeof *chunk);
        if (!chunk)
            return engram__err(-ENOMEM, "out of memory for the table registry");
        /* Release: a lookup that sees the chunk sees it zeroed. */
        atomic_store_explicit(&st->chunks[i >> ENGRAM__CHUNK_BITS], chunk, memory_order_release);
    }
    /* Release: a lookup that loads this pointer sees the table complete. */
    atomic_store_explicit(&chunk[i & (ENGRAM__CHUNK - 1)], t, memory_order_release);
    st->ntables = i + 1;
    *id = i;
    return 0;
}

static engram__table *table_new(const char *name, const engram_table_spec *spec, uint64_t size)
{
    engram__table *t = aligned_alloc(ENGRAM__CACHELINE,
                                     engram__align_up(sizeof *t, ENGRAM__CACHELINE));
    if (!t)
        return NULL;
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->spec = *spec;
    t->spec.row_pitch = engram__spec_pitch(spec);
    t->data_size = size;
    return t;
}

int engram__dir_has(engram_store *st, const char *name)
{
    struct stat sb;
    return st->dirfd >= 0 && fstatat(st->dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
}

int engram__store_add_table(engram_store *st, const char *name, const engram_table_spec *spec,
                            const unsigned char *base, const engram__backend_ops *ops,
                            void *state, engram_table_id *id)
{
    engram__table *t;
    uint64_t size;
    engram_table_id tmp;
    int err;

    if (!st || !ops || (!base && !ops->read_rows))
        return engram__err(-EINVAL, "add table: store, ops and base or read_rows are required");
    if (ops->version != ENGRAM__BACKEND_VERSION)
        return engram__err(-EINVAL, "backend '%s' has ops version %u (expected %u)",
                           ops->name ? ops->name : "?", ops->version, ENGRAM__BACKEND_VERSION);
    if ((err = engram_name_check(name)) != 0 || (err = engram__spec_size(spec, &size)) != 0)
        return err;
    if (!(t = table_new(name, spec, size)))
        return engram__err(-ENOMEM, "out of memory");
    t->kind = ENGRAM_TABLE_BOUND;
    t->base = base;
    t->ops = ops;
    t->state = state;
    pthread_mutex_lock(&st->lock);
    if (engram__find_locked(st, name, NULL) || engram__dir_has(st, name))
        err = engram__err(-EEXIST, "table '%s' already exists in %s", name, st->path);
    else
        err = registry_append_locked(st, t, id ? id : &tmp);
    pthread_mutex_unlock(&st->lock);
    if (err)
        free(t);
    return err;
}

int engram_bind(engram_store *st, const char *name, const engram_table_spec *spec,
                const void *mem)
{
    if (!mem)
        return engram__err(-EINVAL, "bind '%s': memory is NULL", name ? name : "?");
    return engram__store_add_table(st, name, spec, mem, &bound_ops, NULL, NULL);
}

int engram_table_open(engram_store *st, const char *name, engram_table_id *id)
{
    engram__table *t = NULL;
    struct stat sb;
    int fd = -1, err;

    if (!st || !id)
        return engram__err(-EINVAL, "store and id are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    pthread_mutex_lock(&st->lock);
    if (engram__find_locked(st, name, id)) {
        err = 0;
        goto out;
    }
    if (st->dirfd < 0) {
        err = engram__err(-ENOENT, "table '%s' is not bound in this memory store", name);
        goto out;
    }
    if ((fd = engram__open_entry(st, name, O_RDONLY, &sb)) < 0) {
        err = fd;
        goto out;
    }
    if (!(t = table_new(name, &(engram_table_spec){1, 1, 1}, 0))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto out;
    }
    if ((err = engram__read_header(fd, &sb, name, &t->hdr)) != 0)
        goto out;
    if (strcmp(t->hdr.name, name) != 0) {
        err = engram__err(ENGRAM_ECORRUPT, "file %s/%s holds table '%s' (renamed file?)", st->path,
                          name, t->hdr.name);
        goto out;
    }
    t->kind = ENGRAM_TABLE_FILE;
    t->ops = &file_ops;
    t->spec.num_rows = t->hdr.num_rows;
    t->spec.row_bytes = t->hdr.row_bytes;
    t->spec.row_pitch = t->hdr.row_pitch;
    t->data_size = t->hdr.data_size;
    if (st->opts.flags & ENGRAM_OPEN_FILE_CACHE)
        err = engram__fcache_attach_file(st, t, fd);
    else
        err = engram__map_file_table(st, t, fd);
    if (err != 0)
        goto out;
    if ((err = registry_append_locked(st, t, id)) != 0) {
        t->ops->release(t);
        goto out;
    }
    t = NULL;
out:
    pthread_mutex_unlock(&st->lock);
    if (fd >= 0)
        close(fd);
    free(t);
    return err;
}

int engram_table_memory(engram_store *st, engram_table_id id, const void **base,
                        engram_table_spec *spec)
{
    engram__table *t;
    if (base)
        *base = NULL;
    if (!st || !(t = engram__table_get(st, id)))
        return engram__err(-EINVAL, "table id %u is not a table id of this store", (unsigned)id);
    if (atomic_load_explicit(&t->removed, memory_order_acquire))
        return engram__err(ENGRAM_EREMOVED, "table '%s' was removed", t->name);
    if (spec)
        *spec = t->spec;
    if (!t->base)
        return engram__err(-ENOTSUP, "table '%s' (backend '%s') has no base address: its rows "
                                     "are read on demand", t->name, t->ops->name);
    if (base)
        *base = t->base;
    return 0;
}

static void counters_sum(const engram__table *t, uint64_t *lookups, uint64_t *rows)
{
    *lookups = *rows = 0;
    for (int s = 0; s < ENGRAM__SHARDS; s++) {
        *lookups += atomic_load_explicit(&t->ctr[s].lookups, memory_order_relaxed);
        *rows += atomic_load_explicit(&t->ctr[s].rows, memory_order_relaxed);
    }
}

static void info_from_header(engram_table_info *info, const engram__header *h)
{
    info->spec.num_rows = h->num_rows;
    info->spec.row_bytes = h->row_bytes;
    info->spec.row_pitch = h->row_pitch;
    info->data_offset = h->data_offset;
    info->data_size = h->data_size;
    info->checksum = h->data_checksum;
    info->created_ns = h->created_ns;
}

int engram_get_table_info(engram_store *st, const char *name, engram_table_info *info)
{
    engram__table *t;
    engram__header h;
    struct stat sb;
    int fd, err = 0;

    if (!st || !info || info->size != sizeof(engram_table_info))
        return engram__err(-EINVAL, "store and info (with size = sizeof(engram_table_info)) are "
                                    "required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    memset(info, 0, sizeof *info);
    info->size = sizeof *info;
    pthread_mutex_lock(&st->lock);
    if ((t = engram__find_locked(st, name, NULL)) != NULL) {
        info->kind = t->kind;
        info->spec = t->spec;
        info->data_size = t->data_size;
        if (t->kind == ENGRAM_TABLE_FILE)
            info_from_header(info, &t->hdr);
        info->mapped = t->base != NULL;
        info->private_copy = t->private_copy;
        info->map_minor_faults = t->minor_faults;
        info->map_major_faults = t->major_faults;
        counters_sum(t, &info->lookups, &info->rows);
        info->bytes = info->rows * t->spec.row_bytes;
        if (t->base)
            err = engram__smaps_coverage(t->base, (size_t)t->data_size, &info->resident_bytes,
                                         &info->huge_bytes);
        goto out;
    }
    if (st->dirfd < 0) {
        err = engram__err(-ENOENT, "table '%s' is not bound in this memory store", name);
        goto out;
    }
    if ((fd = engram__open_entry(st, name, O_RDONLY, &sb)) < 0) {
        err = fd;
        goto out;
    }
    err = engram__read_header(fd, &sb, name, &h);
    close(fd);
    if (err == 0 && strcmp(h.name, name) != 0)
        err = engram__err(ENGRAM_ECORRUPT, "file %s/%s holds table '%s' (renamed file?)",
                          st->path, name, h.name);
    if (err == 0) {
        info->kind = ENGRAM_TABLE_FILE;
        info_from_header(info, &h);
    }
out:
    pthread_mutex_unlock(&st->lock);
    return err;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A growable list of names for engram_list(). */
typedef struct namelist {
    char **v;
    size_t n, cap, bytes;
} namelist;

static int namelist_add(namelist *l, const char *name)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(name)))
        return -ENOMEM;
    l->bytes += strlen(name) + 1;
    l->n++;
    return 0;
}

int engram_list(engram_store *st, char ***names, size_t *count)
{
    namelist l = {0};
    DIR *d = NULL;
    struct dirent *de;
    char **outv = NULL, *s;
    size_t n = 0;
    int err = 0, fd;

    if (!st || !names || !count)
        return engram__err(-EINVAL, "store, names and count are required");
    *names = NULL;
    *count = 0;
    pthread_mutex_lock(&st->lock);
    for (uint32_t i = 0; i < st->ntables && !err; i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_relaxed))
            err = namelist_add(&l, t->name);
    }
    if (!err && st->dirfd >= 0) {
        /* A fresh descriptor: readdir moves the offset of the one it uses. */
        fd = openat(st->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || !(d = fdopendir(fd))) {
            err = engram__errno(errno, "read directory %s", st->path);
            if (fd >= 0)
                close(fd);
        }
        while (!err && d && (de = readdir(d)) != NULL)
            if ((de->d_type == DT_REG || de->d_type == DT_UNKNOWN) &&
                engram__name_valid(de->d_name))
                err = namelist_add(&l, de->d_name);
        if (d)
            closedir(d);
    }
    pthread_mutex_unlock(&st->lock);
    if (err == -ENOMEM)
        err = engram__err(-ENOMEM, "out of memory listing %s", st->path);
    if (err)
        goto out;
    if (l.n > 1)
        qsort(l.v, l.n, sizeof *l.v, cmp_names);
    /* One block: the pointer array, then the strings, freed by one free(). */
    outv = malloc((l.n + 1) * sizeof(char *) + l.bytes + 1);
    if (!outv) {
        err = engram__err(-ENOMEM, "out of memory listing %s", st->path);
        goto out;
    }
    s = (char *)(outv + l.n + 1);
    for (size_t i = 0; i < l.n; i++) {
        if (n > 0 && strcmp(outv[n - 1], l.v[i]) == 0)
            continue;
        size_t len = strlen(l.v[i]) + 1;
        memcpy(s, l.v[i], len);
        outv[n++] = s;
        s += len;
    }
    outv[n] = NULL;
    *names = outv;
    *count = n;
out:
    for (size_t i = 0; i < l.n; i++)
        free(l.v[i]);
    free(l.v);
    return err;
}

void engram_free(void *p)
{
    free(p);
}

int engram_remove(engram_store *st, const char *name)
{
    engram__table *t;
    struct stat sb;
    int err = 0;
    if (!st)
        return engram__err(-EINVAL, "store is NULL");
    if ((err = engram_name_check(name)) != 0)
        return err;
    pthread_mutex_lock(&st->lock);
    t = engram__find_locked(st, name, NULL);
    if (t && t->kind != ENGRAM_TABLE_FILE) {
        err = engram__err(ENGRAM_EBOUND, "table '%s' is %s, not a table file; close the store "
                                         "to release it", name,
                          t->kind == ENGRAM_TABLE_SAFETENSORS ? "served from a checkpoint"
                                                              : "bound to caller memory");
        goto out;
    }
    if (st->dirfd < 0) {
        err = engram__err(-ENOENT, "table '%s' not found in this memory store", name);
        goto out;
    }
    /* Only what open would accept is ours to remove: a link or a
     * directory planted under a table name is refused, not unlinked. */
    if (fstatat(st->dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(sb.st_mode)) {
        err = engram__err(ENGRAM_EUNSAFE, "%s/%s is not a regular file; not removing it",
                          st->path, name);
        goto out;
    }
    if (unlinkat(st->dirfd, name, 0) != 0) {
        if (errno != ENOENT || !t) {
            err = errno == ENOENT ? engram__err(-ENOENT, "table '%s' not found in %s", name,
                                                st->path)
                                  : engram__errno(errno, "remove %s/%s", st->path, name);
            goto out;
        }
        /* Another process removed the file already; forget our copy too. */
    } else if (fsync(st->dirfd) != 0) {
        err = engram__errno(errno, "fsync %s", st->path);
    }
    if (t)
        atomic_store_explicit(&t->removed, 1, memory_order_release);
out:
    pthread_mutex_unlock(&st->lock);
    return err;
}

int engram_verify(engram_store *st, const char *name, engram_progress_fn progress, void *ud)
{
    engram__table *t;
    engram__header h;
    struct stat sb;
    uint64_t sum;
    int fd, err;

    if (!st)
        return engram__err(-EINVAL, "store is NULL");
    if ((err = engram_name_check(name)) != 0)
        return err;
    pthread_mutex_lock(&st->lock);
    t = engram__find_locked(st, name, NULL);
    if (t && t->kind != ENGRAM_TABLE_FILE)
        err = engram__err(ENGRAM_EBOUND, "table '%s' is bound memory: no checksum to verify",
                          name);
    pthread_mutex_unlock(&st->lock);
    if (err)
        return err;
    if (st->dirfd < 0)
        return engram__err(-ENOENT, "table '%s' not found in this memory store", name);
    if ((fd = engram__open_entry(st, name, O_RDONLY, &sb)) < 0)
        return fd;
    if ((err = engram__read_header(fd, &sb, name, &h)) != 0)
        goto out;
    if (strcmp(h.name, name) != 0) {
        err = engram__err(ENGRAM_ECORRUPT, "file %s/%s holds table '%s' (renamed file?)", st->path,
                          name, h.name);
        goto out;
    }
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

int engram_store_stats(engram_store *st, engram_stats *s)
{
    if (!st || !s || s->size != sizeof(engram_stats))
        return engram__err(-EINVAL, "store and stats (with size = sizeof(engram_stats)) are "
                                    "required");
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    s->threads = (uint32_t)st->threads;
    for (int i = 0; i < ENGRAM__SHARDS; i++) {
        const engram__store_counters *c = &st->ctr[i];
        s->lookups += atomic_load_explicit(&c->lookups, memory_order_relaxed);
        s->failed += atomic_load_explicit(&c->failed, memory_order_relaxed);
        s->rows += atomic_load_explicit(&c->rows, memory_order_relaxed);
        s->dead_rows += atomic_load_explicit(&c->dead, memory_order_relaxed);
        s->bytes += atomic_load_explicit(&c->bytes, memory_order_relaxed);
        s->parallel += atomic_load_explicit(&c->parallel, memory_order_relaxed);
        s->time_ns += atomic_load_explicit(&c->time_ns, memory_order_relaxed);
    }
    pthread_mutex_lock(&st->lock);
    for (uint32_t i = 0; i < st->ntables; i++) {
        engram__table *t = engram__table_get(st, i);
        if (t->base && !atomic_load_explicit(&t->removed, memory_order_relaxed)) {
            s->tables_open++;
            s->mapped_bytes += t->data_size;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return 0;
}
