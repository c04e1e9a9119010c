/*
 * store.c - stores: namespaces, the table registry, bind, sources, open,
 * info, list, remove, verify and stats.
 *
 * Everything here runs off the lookup path.  store->lock is held only for
 * the registry and namespace bookkeeping, never across slow work: a table
 * is opened, mapped, prefaulted and checked first, and only its
 * publication in the registry takes the lock.  The one contract with
 * gather.c is the registry layout of store.h: tables are appended and
 * published with release stores, and freed only at close.
 */
#include <dirent.h>
#include <inttypes.h>
#include <errno.h>
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
#include "pool.h"
#include "reader.h"
#include "async.h"
#include "remote.h"
#include "rsec.h"
#include "rowcache.h"
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

static int store_alloc(const engram_store_options *opts, engram_store **out)
{
    engram_store *st;
    long ncpu;
    *out = NULL;
    if (opts && opts->size != sizeof(engram_store_options))
        return engram__err(-EINVAL, "engram_store_options.size is %u, expected %zu",
                           opts->size, sizeof(engram_store_options));
    if (opts && opts->threads < 0)
        return engram__err(-EINVAL, "threads is %d (must be >= 0)", opts->threads);
    if (opts && (opts->flags & ENGRAM_OPEN_FILE_CACHE) && (opts->flags & ENGRAM_OPEN_PRIVATE_HUGE))
        return engram__err(-EINVAL, "ENGRAM_OPEN_FILE_CACHE reads rows on demand and "
                                    "ENGRAM_OPEN_PRIVATE_HUGE copies whole tables into memory: "
                                    "choose one");
    st = calloc(1, sizeof *st);
    if (!st)
        return engram__err(-ENOMEM, "out of memory for a store");
    st->dirfd = -1;
    atomic_init(&st->lease_fd, -1);
    st->uid = geteuid();
    {
        static _Atomic uint64_t serials;
        st->serial = atomic_fetch_add_explicit(&serials, 1, memory_order_relaxed) + 1;
    }
    if (opts)
        memcpy(&st->opts, opts, opts->size);
    /* The placement is checked now, once; its strings are the caller's and
     * are not kept. */
    {
        int err = engram__numa_resolve(&st->opts, &st->numa);
        st->opts.numa_gpu = st->opts.numa_nodes = NULL;
        if (err) {
            free(st);
            return err;
        }
    }
    st->opts.size = sizeof st->opts;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->opened_cv, NULL);
    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    st->threads = st->opts.threads ? st->opts.threads : (int)(ncpu < 1 ? 1 : ncpu > 8 ? 8 : ncpu);
    /* The default threshold: below it, waking a sleeping worker (tens of
     * microseconds on a VM) costs more than the rows it would copy.  See
     * docs/performance.md for the measurement behind it. */
    st->parallel_min_rows = st->opts.parallel_min_rows ? st->opts.parallel_min_rows : 4096;
    if (st->opts.cache_log_ms) {
        st->log_ns = (uint64_t)st->opts.cache_log_ms * 1000000u;
    } else {
        const char *env = getenv("ENGRAM_CACHE_LOG_MS");
        if (env && atol(env) > 0)
            st->log_ns = (uint64_t)atol(env) * 1000000u;
    }
    atomic_init(&st->next_log_ns, engram__now_ns() + st->log_ns);
    if (st->threads > 1) {
        int err = engram__pool_create(st->threads - 1, &st->pool);
        if (err) {
            pthread_mutex_destroy(&st->lock);
            pthread_cond_destroy(&st->opened_cv);
            free(st);
            return err;
        }
    }
    *out = st;
    return 0;
}

/* A placement is for memory the store writes or copies; a store that has
 * none (a memory store, a Redis Cluster's) refuses it rather than ignore
 * it.  On refusal *st is closed and NULL. */
static int no_placement(engram_store **st, const char *what)
{
    if ((*st)->numa.policy == ENGRAM_NUMA_DEFAULT)
        return 0;
    engram_store_close(*st);
    *st = NULL;
    return engram__err(-EINVAL, "NUMA placement: %s writes no table files and makes no private "
                                "copies; place the memory you bind yourself",
                       what);
}

int engram_store_open_memory(const engram_store_options *opts, engram_store **out)
{
    int err;
    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    if ((err = store_alloc(opts, out)) != 0)
        return err;
    if ((err = no_placement(out, "a memory store")) != 0)
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

int engram__store_open_remote(const engram_store_options *opts, const char *path,
                              const engram__remote_vt *vt, void *rs, engram_store **out)
{
    engram_store *st;
    int err;
    if ((err = store_alloc(opts, &st)) != 0 ||
        (err = no_placement(&st, "a store of a Redis Cluster")) != 0)
        return err;
    if (!(st->path = strdup(path))) {
        engram_store_close(st);
        return engram__err(-ENOMEM, "out of memory");
    }
    st->remote = vt;
    st->remote_state = rs;
    *out = st;
    return 0;
}

void *engram__store_remote(engram_store *st, const engram__remote_vt *vt)
{
    return st && st->remote == vt ? st->remote_state : NULL;
}

/* Releases what a source holds: the module's state, the caller's
 * table_ud (through its release) and the row cache. */
void engram__source_release(const engram__source *src)
{
    if (src->vt && src->vt->release)
        src->vt->release(src->state);
    if (src->ops.release)
        src->ops.release(src->ops.ctx, src->table_ud);
    engram__rcache_destroy(src->cache);
}

void engram_store_close(engram_store *st)
{
    if (!st)
        return;
    /* First: submitted lookups may still read the tables. */
    engram__async_stop(st);
    engram__lease_drop(st);
    engram__pool_destroy(st->pool);
    for (uint32_t i = 0; i < engram__table_count(st); i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->released, memory_order_relaxed))
            engram__source_release(&t->src);
        free(t);
    }
    /* After the tables: their sources may use the remote's state. */
    if (st->remote)
        st->remote->close(st->remote_state);
    engram__reader_destroy(atomic_load_explicit(&st->reader, memory_order_relaxed));
    engram__cbudget_destroy(atomic_load_explicit(&st->budget, memory_order_relaxed));
    for (int c = 0; c < ENGRAM__MAX_CHUNKS; c++)
        /* The chunk's elements are atomic, the allocation is not. */
        free((void *)(uintptr_t)atomic_load_explicit(&st->chunks[c], memory_order_relaxed));
    if (st->dirfd >= 0)
        close(st->dirfd);
    free(st->path);
    pthread_cond_destroy(&st->opened_cv);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

engram__table *engram__find_locked(engram_store *st, const char *name, engram_table_id *id)
{
    uint32_t n = atomic_load_explicit(&st->ntables, memory_order_relaxed);
    for (uint32_t i = 0; i < n; i++) {
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

/* Finds a live table by name without the lock: for readers of tables,
 * which stay valid until close whatever happens meanwhile. */
static engram__table *find_unlocked(engram_store *st, const char *name)
{
    uint32_t n = engram__table_count(st);
    for (uint32_t i = 0; i < n; i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_acquire) &&
            strcmp(t->name, name) == 0)
            return t;
    }
    return NULL;
}

/* Appends t to the registry (st->lock held). */
static int registry_append_locked(engram_store *st, engram__table *t, engram_table_id *id)
{
    uint32_t i = atomic_load_explicit(&st->ntables, memory_order_relaxed);
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
    t->id = i;
    /* Release: a lookup that loads this pointer sees the table complete. */
    atomic_store_explicit(&chunk[i & (ENGRAM__CHUNK - 1)], t, memory_order_release);
    /* Release: a walker that reads the new count sees the table's pointer. */
    atomic_store_explicit(&st->ntables, i + 1, memory_order_release);
    *id = i;
    return 0;
}

static engram__table *table_new(const char *name, const engram_table_spec *spec, uint64_t size,
                                const engram__source *src)
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
    t->src = *src;
    return t;
}

static int dir_has(engram_store *st, const char *name)
{
    struct stat sb;
    return st->dirfd >= 0 && fstatat(st->dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
}

int engram__name_taken_locked(engram_store *st, const char *name)
{
    return engram__find_locked(st, name, NULL) != NULL || dir_has(st, name);
}

struct engram__claim {
    struct engram__claim *next;
    char name[ENGRAM_NAME_MAX + 1];
};

static int claimed_locked(engram_store *st, const char *name)
{
    for (const struct engram__claim *c = st->claims; c; c = c->next)
        if (strcmp(c->name, name) == 0)
            return 1;
    return 0;
}

/* Waits (st->lock held) until no other thread opens `name`, then claims
 * it.  -ENOMEM with the message if the claim cannot be recorded. */
static int claim_locked(engram_store *st, const char *name)
{
    struct engram__claim *c;
    while (claimed_locked(st, name))
        pthread_cond_wait(&st->opened_cv, &st->lock);
    if (!(c = malloc(sizeof *c)))
        return engram__err(-ENOMEM, "out of memory");
    snprintf(c->name, sizeof c->name, "%s", name);
    c->next = st->claims;
    st->claims = c;
    return 0;
}

static void unclaim_locked(engram_store *st, const char *name)
{
    for (struct engram__claim **pp = &st->claims; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->name, name) == 0) {
            struct engram__claim *c = *pp;
            *pp = c->next;
            free(c);
            break;
        }
    }
    pthread_cond_broadcast(&st->opened_cv);
}

int engram__store_claim(engram_store *st, const char *name)
{
    int err;
    pthread_mutex_lock(&st->lock);
    if ((err = claim_locked(st, name)) == 0 && engram__name_taken_locked(st, name)) {
        unclaim_locked(st, name);
        err = engram__err(-EEXIST, "table '%s' already exists in %s", name, st->path);
    }
    pthread_mutex_unlock(&st->lock);
    return err;
}

void engram__store_unclaim(engram_store *st, const char *name)
{
    pthread_mutex_lock(&st->lock);
    unclaim_locked(st, name);
    pthread_mutex_unlock(&st->lock);
}

int engram__store_add_table(engram_store *st, const char *name, const engram_table_spec *spec,
                            const engram__source *src, engram_table_id *id)
{
    engram__table *t;
    uint64_t size;
    engram_table_id tmp;
    int err;

    if (!st || !src || (!src->base && !src->ops.read_rows))
        return engram__err(-EINVAL, "add table: a store and a source with rows are required");
    if ((err = engram_name_check(name)) != 0 || (err = engram__spec_size(spec, &size)) != 0)
        return err;
    if (!(t = table_new(name, spec, size, src)))
        return engram__err(-ENOMEM, "out of memory");
    pthread_mutex_lock(&st->lock);
    if (engram__name_taken_locked(st, name))
        err = engram__err(-EEXIST, "table '%s' already exists in %s", name, st->path);
    else
        err = registry_append_locked(st, t, id ? id : &tmp);
    pthread_mutex_unlock(&st->lock);
    if (err)
        free(t);
    return err;
}

/* Bytes of the namespace's table files (the cache budget rule's measure). */
static uint64_t namespace_bytes(engram_store *st)
{
    uint64_t sum = 0;
    struct dirent *de;
    DIR *d;
    int fd;
    if (st->dirfd < 0)
        return 0;
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

int engram__store_ctx_get(engram_store *st, engram__store_ctx *ctx)
{
    engram__cbudget *b;
    engram__reader *rd;
    int err = 0;
    pthread_mutex_lock(&st->lock);
    b = atomic_load_explicit(&st->budget, memory_order_relaxed);
    if (!b) {
        if ((err = engram__cbudget_create(st->opts.cache_bytes, &b)) != 0)
            goto out;
        /* Release: a reader of the pointer without the lock (the stats)
         * sees the budget made. */
        atomic_store_explicit(&st->budget, b, memory_order_release);
    }
    rd = atomic_load_explicit(&st->reader, memory_order_relaxed);
    if (!rd) {
        /* A ring per gather thread and a few more for lookups from other
         * threads; a lookup that reads waits only when all are busy. */
        if ((err = engram__reader_create(st->opts.queue_depth, (unsigned)st->threads + 2, b,
                                         &rd)) != 0)
            goto out;
        atomic_store_explicit(&st->reader, rd, memory_order_release);
    }
    ctx->budget = b;
    ctx->reader = rd;
    ctx->flags = st->opts.flags;
out:
    pthread_mutex_unlock(&st->lock);
    if (err == 0)
        ctx->namespace_bytes = namespace_bytes(st);
    return err;
}

int engram_bind(engram_store *st, const char *name, const engram_table_spec *spec,
                const void *mem)
{
    engram__source src;
    if (!mem)
        return engram__err(-EINVAL, "bind '%s': memory is NULL", name ? name : "?");
    memset(&src, 0, sizeof src);
    src.kind = ENGRAM_TABLE_BOUND;
    src.base = mem;
    return engram__store_add_table(st, name, spec, &src, NULL);
}

int engram_add_source(engram_store *st, const char *name, const engram_table_spec *spec,
                      const engram_source_ops *ops, void *table_ud, uint64_t cache_bytes,
                      engram_table_id *id)
{
    engram__source src;
    engram__store_ctx ctx;
    int err;

    if (!st || !ops)
        return engram__err(-EINVAL, "add source: store and ops are required");
    if (ops->size != sizeof(engram_source_ops) || ops->flags != 0 || !ops->read_rows)
        return engram__err(-EINVAL, "add source '%s': ops must have size = "
                                    "sizeof(engram_source_ops) (%zu, not %u), flags 0 and "
                                    "read_rows",
                           name ? name : "?", sizeof(engram_source_ops), ops->size);
    if ((err = engram_name_check(name)) != 0 || (err = engram_spec_check(spec)) != 0)
        return err;
    memset(&src, 0, sizeof src);
    src.kind = ENGRAM_TABLE_SOURCE;
    src.ops = *ops;
    src.table_ud = table_ud;
    if (cache_bytes > 0) {
        engram__cache_want want = {cache_bytes, 0, 0, 0};
        if ((err = engram__store_ctx_get(st, &ctx)) != 0 ||
            (err = engram__rcache_create(ctx.budget, &want, spec->row_bytes, spec->num_rows,
                                         ctx.flags, name, &src.cache)) != 0)
            return err;
    }
    /* Not engram__source_release(): the caller's release is for tables
     * the store took. */
    if ((err = engram__store_add_table(st, name, spec, &src, id)) != 0)
        engram__rcache_destroy(src.cache);
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

static void release_removed(engram_store *st, uint64_t wait_ns);

/* engram_table_open() of a table of the store's remote namespace, with
 * the claim on its name held (and given back here). */
static int remote_table_open(engram_store *st, const char *name, engram_table_id *id)
{
    engram__store_ctx ctx;
    engram__source src;
    engram_table_spec spec;
    engram__table *t = NULL;
    uint64_t size;
    int err;

    release_removed(st, 0);
    if ((err = engram__store_ctx_get(st, &ctx)) != 0 ||
        (err = st->remote->open(st->remote_state, &ctx, name, &spec, &size, &src)) != 0) {
        engram__store_unclaim(st, name);
        return err;
    }
    if (!(t = table_new(name, &spec, size, &src))) {
        engram__source_release(&src);
        engram__store_unclaim(st, name);
        return engram__err(-ENOMEM, "out of memory");
    }
    pthread_mutex_lock(&st->lock);
    /* Another table of the name (a bind while we read the manifest) is
     * the table; nobody else opened this one: they wait for our claim. */
    if (!engram__find_locked(st, name, id) && (err = registry_append_locked(st, t, id)) == 0)
        t = NULL;
    unclaim_locked(st, name);
    pthread_mutex_unlock(&st->lock);
    if (t) {
        engram__source_release(&src);
        free(t);
    }
    return err;
}

/* With ENGRAM_OPEN_NUMA_LOCAL: the name of the copy of `name` on the
 * calling thread's node, into buf, if the store or its namespace has that
 * table; else `name`. */
static const char *local_copy(engram_store *st, const char *name, char *buf, size_t cap)
{
    int node, have;
    if (!(st->opts.flags & ENGRAM_OPEN_NUMA_LOCAL) || engram__numa_is_copy_name(name) ||
        (node = engram__numa_current_node()) < 0 ||
        engram__numa_copy_name(buf, cap, name, node) >= cap ||
        !engram__name_valid(buf))
        return name;
    pthread_mutex_lock(&st->lock);
    have = engram__name_taken_locked(st, buf);
    pthread_mutex_unlock(&st->lock);
    return have ? buf : name;
}

int engram_table_open(engram_store *st, const char *name, engram_table_id *id)
{
    engram__table *t = NULL, *have;
    engram__header h;
    engram__source src;
    struct stat sb, now;
    char copy[ENGRAM_NAME_MAX + 1];
    int fd = -1, err = 0, made = 0, claimed = 1;

    if (!st || !id)
        return engram__err(-EINVAL, "store and id are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    name = local_copy(st, name, copy, sizeof copy);
    pthread_mutex_lock(&st->lock);
    if (!(have = engram__find_locked(st, name, id)) && (st->dirfd >= 0 || st->remote)) {
        /* A second opener of the name waits for the first and then finds
         * its table (or tries again if it failed). */
        err = claim_locked(st, name);
        if (err == 0 && (have = engram__find_locked(st, name, id)) != NULL)
            unclaim_locked(st, name);
    }
    pthread_mutex_unlock(&st->lock);
    if (have || err)
        return err;
    if (st->remote)
        return remote_table_open(st, name, id);
    if (st->dirfd < 0)
        return engram__err(-ENOENT, "table '%s' is not bound in this memory store", name);
    /* What removed tables hold goes first (a row cache's share of the
     * budget, a mapping), where no running lookup can still read it. */
    release_removed(st, 0);
    /* The slow part (reading the header, mapping, prefaulting, verifying)
     * runs without the store's lock: lookups and other opens go on. */
    if ((fd = engram__open_table_file(st->dirfd, st->path, st->uid, name, &sb, &h)) < 0) {
        engram__store_unclaim(st, name);
        return fd;
    }
    if ((err = file_source(st, fd, &h, name, &src)) != 0)
        goto out;
    made = 1;
    if (!(t = table_new(name, &(engram_table_spec){h.num_rows, h.row_bytes, h.row_pitch},
                        h.data_size, &src))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto out;
    }
    pthread_mutex_lock(&st->lock);
    if ((have = engram__find_locked(st, name, id)) != NULL) {
        /* Not another opener (they wait for our claim): a table of the
         * name appeared otherwise.  Theirs is the table. */
        err = 0;
    } else if (fstatat(st->dirfd, name, &now, AT_SYMLINK_NOFOLLOW) != 0 ||
               now.st_dev != sb.st_dev || now.st_ino != sb.st_ino) {
        /* Removed (or removed and written again) while we opened it: what
         * we read is no longer the table of that name. */
        err = engram__err(-ENOENT, "table '%s' was removed from %s while it was being opened",
                          name, st->path);
    } else if ((err = registry_append_locked(st, t, id)) == 0) {
        t = NULL;
        made = 0;
    }
    unclaim_locked(st, name);
    pthread_mutex_unlock(&st->lock);
    claimed = 0;
out:
    if (claimed)
        engram__store_unclaim(st, name);
    if (made)
        engram__source_release(&src);
    free(t);
    close(fd);
    /* A store that reads tables of the namespace holds its lease (gc
     * leaves the namespace alone while it lives). */
    if (err == 0)
        engram__lease_take(st);
    return err;
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

/* engram_table_open_wait() in a remote namespace: nothing to watch, so
 * it looks again, every 10 ms at first, doubling to 200 ms. */
static int remote_open_wait(engram_store *st, const char *name, int timeout_ms,
                            uint64_t deadline, engram_table_id *id)
{
    uint64_t pause = 10000000u;
    for (;;) {
        uint64_t now = engram__now_ns(), ns;
        struct timespec ts;
        int err;
        if (now >= deadline)
            return engram__err(-ETIMEDOUT, "table '%s' was not published in %s within %d ms",
                               name, st->path, timeout_ms);
        ns = deadline - now < pause ? deadline - now : pause;
        ts.tv_sec = (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        nanosleep(&ts, NULL);
        if (pause < 200000000u)
            pause *= 2;
        if ((err = engram_table_open(st, name, id)) != -ENOENT)
            return err;
    }
}

int engram_table_open_wait(engram_store *st, const char *name, int timeout_ms,
                           engram_table_id *id)
{
    char path[64];
    uint64_t deadline;
    int err, ifd;
    err = engram_table_open(st, name, id);
    if (err != -ENOENT || timeout_ms == 0 || (st->dirfd < 0 && !st->remote))
        return err;
    deadline = timeout_ms < 0 ? UINT64_MAX : engram__now_ns() + (uint64_t)timeout_ms * 1000000u;
    /* A store waiting on the namespace uses it (gc leaves it alone). */
    engram__lease_take(st);
    if (st->remote)
        return remote_open_wait(st, name, timeout_ms, deadline, id);
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

int engram_table_memory(engram_store *st, engram_table_id id, const void **base,
                        engram_table_spec *spec)
{
    engram__table *t;
    int err = 0;
    if (base)
        *base = NULL;
    if (!st || !(t = engram__table_get(st, id)))
        return engram__err(-EINVAL, "table id %u is not a table id of this store", (unsigned)id);
    /* In a read section: a removal that releases the table waits for it,
     * and then sees it lent. */
    if ((err = engram__rsec_enter()) != 0)
        return err;
    if (atomic_load_explicit(&t->removed, memory_order_acquire)) {
        err = engram__err(ENGRAM_EREMOVED, "table '%s' was removed", t->name);
    } else {
        if (spec)
            *spec = t->spec;
        if (!t->src.base) {
            err = engram__err(-ENOTSUP, "table '%s' has no base address: its rows are read on "
                                        "demand from its source",
                              t->name);
        } else if (base) {
            atomic_store_explicit(&t->lent, 1, memory_order_relaxed);
            *base = t->src.base;
        }
    }
    engram__rsec_exit();
    return err;
}

static void counters_sum(const engram__table *t, uint64_t *lookups, uint64_t *rows)
{
    *lookups = *rows = 0;
    for (int s = 0; s < ENGRAM__SHARDS; s++) {
        *lookups += atomic_load_explicit(&t->ctr[s].lookups, memory_order_relaxed);
        *rows += atomic_load_explicit(&t->ctr[s].rows, memory_order_relaxed);
    }
}

/* Fills *info (a whole current struct) about table `name`. */
static int table_info(engram_store *st, const char *name, engram_table_info *info)
{
    engram__table *t;
    engram__header h;
    struct stat sb;
    int fd, err = 0;

    /* No lock: a table found stays valid until close, and reading
     * /proc/self/smaps takes a while.  A read section keeps its source
     * from being released meanwhile (a removal then waits for it). */
    if ((err = engram__rsec_enter()) != 0)
        return err;
    if ((t = find_unlocked(st, name)) != NULL) {
        info->kind = t->src.kind;
        info->spec = t->spec;
        info->data_size = t->data_size;
        if (t->src.vt && t->src.vt->info)
            t->src.vt->info(t->src.state, info);
        info->mapped = t->src.base != NULL;
        counters_sum(t, &info->lookups, &info->rows);
        info->bytes = info->rows * t->spec.row_bytes;
        if (t->src.base)
            err = engram__smaps_coverage(t->src.base, (size_t)t->data_size,
                                         &info->resident_bytes, &info->huge_bytes);
        engram__rsec_exit();
        return err;
    }
    engram__rsec_exit();
    if (st->remote)
        return st->remote->info(st->remote_state, name, info);
    if (st->dirfd < 0)
        return engram__err(-ENOENT, "table '%s' is not bound in this memory store", name);
    if ((fd = engram__open_table_file(st->dirfd, st->path, st->uid, name, &sb, &h)) < 0)
        return fd;
    close(fd);
    info->kind = ENGRAM_TABLE_FILE;
    engram__header_info(&h, info);
    return 0;
}

int engram_get_table_info(engram_store *st, const char *name, engram_table_info *info)
{
    engram_table_info all;
    uint32_t size;
    int err;

    if (!st || !info || info->size != sizeof(engram_table_info))
        return engram__err(-EINVAL, "store and info (with size = sizeof(engram_table_info)) are "
                                    "required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    /* Filled whole here, copied out as far as the caller's struct goes. */
    size = info->size;
    memset(&all, 0, sizeof all);
    err = table_info(st, name, &all);
    all.size = size;
    memcpy(info, &all, size);
    return err;
}

/* The placement of a table file of the namespace, from a mapping of its
 * data made for the query. */
static int file_placement(engram_store *st, const char *name, engram_table_placement *p)
{
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

int engram_get_table_placement(engram_store *st, const char *name, engram_table_placement *p)
{
    engram__table *t;
    int err = 0, done = 0;

    if (!st || !p || p->size != sizeof *p)
        return engram__err(-EINVAL, "store and p (with size = sizeof(engram_table_placement)) "
                                    "are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    memset((char *)p + sizeof p->size, 0, sizeof *p - sizeof p->size);
    p->max_node = -1;
    /* A read section keeps an open table's memory mapped meanwhile. */
    if ((err = engram__rsec_enter()) != 0)
        return err;
    if ((t = find_unlocked(st, name)) != NULL) {
        done = 1;
        if (t->src.base) {
            /* This process's memory of the table: its private copy, the
             * caller's bound memory (not touched), or its shared mapping
             * of the file (pages in memory touched, to be found). */
            p->private_copy = (uint32_t)engram__mapfile_is_private(&t->src);
            err = engram__numa_query(t->src.base, (size_t)t->data_size,
                                     t->src.kind == ENGRAM_TABLE_FILE && !p->private_copy, p);
        } else if (t->src.kind == ENGRAM_TABLE_FILE && st->dirfd >= 0) {
            done = 0; /* read through the row cache: the file's pages are queried */
        } else {
            err = engram__err(-ENOTSUP, "table '%s' is not memory of this process: its rows "
                                        "are read on demand from its source",
                              name);
        }
    }
    engram__rsec_exit();
    if (done)
        return err;
    if (st->remote)
        return engram__err(-ENOTSUP, "table '%s' of %s is in a Redis Cluster, not in memory "
                                     "of this machine",
                           name, st->path);
    if (st->dirfd < 0)
        return engram__err(-ENOENT, "table '%s' is not bound in this memory store", name);
    return file_placement(st, name, p);
}

/* Adds a remote's table name to engram_list()'s list. */
static int namelist_add_cb(void *l, const char *name)
{
    return engram__namelist_add(l, name) == 0 ? 0 : engram__err(-ENOMEM, "out of memory");
}

int engram_list(engram_store *st, char ***names, size_t *count)
{
    engram__namelist l = {0};
    DIR *d = NULL;
    struct dirent *de;
    int err = 0, fd;

    if (!st || !names || !count)
        return engram__err(-EINVAL, "store, names and count are required");
    *names = NULL;
    *count = 0;
    /* Without the lock: the registry is walked as lookups walk it, and the
     * directory is read on a descriptor of our own. */
    for (uint32_t i = 0; i < engram__table_count(st) && !err; i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_acquire))
            err = engram__namelist_add(&l, t->name);
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
                err = engram__namelist_add(&l, de->d_name);
        if (d)
            closedir(d);
    }
    if (err == -ENOMEM)
        err = engram__err(-ENOMEM, "out of memory listing %s", st->path);
    /* The remote's own message stands (it may be a network failure). */
    if (!err && st->remote)
        err = st->remote->list(st->remote_state, namelist_add_cb, &l);
    if (!err)
        err = engram__namelist_pack(&l, st->path, names, count);
    engram__namelist_free(&l);
    return err;
}

void engram_free(void *p)
{
    free(p);
}

/* How long engram_remove() waits for the lookups that were running to
 * finish before it releases the table's source; a longer one (a source's
 * slow read_rows in another lookup) leaves the release to a later remove,
 * table open or stats call, or to the close. */
#define RELEASE_WAIT_NS 50000000u

/* Releases the sources of the removed tables once no read section can
 * reach them any more, waiting at most wait_ns for the open ones to
 * close.  A table whose memory engram_table_memory() lent out stays
 * mapped until close (its contract).  Not under st->lock: waiting for a
 * lookup under it could wait for a source that takes it. */
static void release_removed(engram_store *st, uint64_t wait_ns)
{
    engram__table *list, *t, *next, **tail;
    pthread_mutex_lock(&st->lock);
    list = st->retired;
    st->retired = NULL;
    pthread_mutex_unlock(&st->lock);
    if (!list)
        return;
    if (engram__rsec_sync(wait_ns) != 0) {
        /* Sections still open (or called from inside one): later. */
        pthread_mutex_lock(&st->lock);
        for (tail = &list; *tail; tail = &(*tail)->retired_next)
            ;
        *tail = st->retired;
        st->retired = list;
        pthread_mutex_unlock(&st->lock);
        return;
    }
    for (t = list; t; t = next) {
        next = t->retired_next;
        t->retired_next = NULL;
        if (atomic_load_explicit(&t->lent, memory_order_relaxed))
            continue;
        engram__source_release(&t->src);
        atomic_store_explicit(&t->released, 1, memory_order_relaxed);
    }
}

/* store.h */
const char *engram__bound_kind(uint32_t kind)
{
    switch (kind) {
    case ENGRAM_TABLE_SAFETENSORS:
        return "served from a checkpoint";
    case ENGRAM_TABLE_SOURCE:
        return "served by a source (engram_add_source)";
    case ENGRAM_TABLE_REDIS:
        return "a table of a Redis Cluster";
    default:
        return "bound to caller memory";
    }
}

/* Marks t removed and puts it on the list of tables whose source is
 * released once no lookup can read it (st->lock held). */
static void retire_locked(engram_store *st, engram__table *t)
{
    atomic_store_explicit(&t->removed, 1, memory_order_release);
    /* Release: a lookup that sees the new generation sees the table
     * removed, and resolves its columns again (gather.c's memo). */
    atomic_fetch_add_explicit(&st->gen, 1, memory_order_release);
    t->retired_next = st->retired;
    st->retired = t;
}

/* engram_remove() in a store of a remote namespace: the remote table is
 * unpublished first (without the lock: it is network I/O), then the
 * store's own copy is retired. */
static int remote_remove(engram_store *st, const char *name)
{
    engram__table *t;
    int err, unpublished = 0;
    pthread_mutex_lock(&st->lock);
    t = engram__find_locked(st, name, NULL);
    pthread_mutex_unlock(&st->lock);
    if (t && t->src.kind != st->remote->kind)
        return engram__err(ENGRAM_EBOUND, "table '%s' is %s, not a table of %s; close the "
                                          "store to release it",
                           name, engram__bound_kind(t->src.kind), st->path);
    err = st->remote->remove(st->remote_state, name, &unpublished);
    if (err == -ENOENT && t)
        err = 0; /* removed by someone else already: forget our copy too */
    else if (!unpublished)
        return err;
    pthread_mutex_lock(&st->lock);
    if ((t = engram__find_locked(st, name, NULL)) != NULL && t->src.kind == st->remote->kind)
        retire_locked(st, t);
    else
        t = NULL;
    pthread_mutex_unlock(&st->lock);
    if (t)
        release_removed(st, RELEASE_WAIT_NS);
    return err;
}

int engram_store_gc(engram_store *st, uint64_t idle_s, uint32_t flags,
                    engram_gc_report_fn report, void *ud)
{
    if (!st)
        return engram__err(-EINVAL, "store is NULL");
    if (flags & ~ENGRAM_GC_DRY_RUN)
        return engram__err(-EINVAL, "unknown flags 0x%x", flags & ~ENGRAM_GC_DRY_RUN);
    if (st->remote)
        return st->remote->gc(st->remote_state, idle_s > UINT64_MAX / 1000u ? UINT64_MAX
                                                                             : idle_s * 1000u,
                              flags, report, ud);
    /* A directory's leftovers are dead writers' temporary files, which
     * are always safe to remove (the dry run only looks). */
    if (st->dirfd >= 0 && !(flags & ENGRAM_GC_DRY_RUN))
        engram__clean_temps(st);
    return 0;
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
    if (st->remote)
        return remote_remove(st, name);
    pthread_mutex_lock(&st->lock);
    t = engram__find_locked(st, name, NULL);
    if (t && t->src.kind != ENGRAM_TABLE_FILE) {
        err = engram__err(ENGRAM_EBOUND, "table '%s' is %s, not a table file; close the store "
                                         "to release it",
                          name, engram__bound_kind(t->src.kind));
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
        retire_locked(st, t);
out:
    pthread_mutex_unlock(&st->lock);
    if (t && err == 0)
        release_removed(st, RELEASE_WAIT_NS);
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
    t = find_unlocked(st, name);
    if (st->remote && (!t || t->src.kind == st->remote->kind))
        return engram__remote_verify(st, name, progress, ud);
    if (t && t->src.kind != ENGRAM_TABLE_FILE)
        return engram__err(ENGRAM_EBOUND, "table '%s' is %s: no checksum to verify", name,
                           engram__bound_kind(t->src.kind));
    if (st->dirfd < 0)
        return engram__err(-ENOENT, "table '%s' not found in this memory store", name);
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

int engram_store_stats(engram_store *st, engram_stats *out)
{
    engram_stats all, *s = &all;
    uint32_t size;
    if (!st || !out || out->size != sizeof(engram_stats))
        return engram__err(-EINVAL, "store and stats (with size = sizeof(engram_stats)) are "
                                    "required");
    /* What removed tables still hold, released first where it can be
     * without waiting. */
    release_removed(st, 0);
    size = out->size;
    memset(s, 0, sizeof *s);
    s->size = size;
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
    for (uint32_t i = 0; i < engram__table_count(st); i++) {
        engram__table *t = engram__table_get(st, i);
        if (!atomic_load_explicit(&t->removed, memory_order_relaxed)) {
            if (t->src.base) {
                s->tables_open++;
                s->mapped_bytes += t->data_size;
            }
        } else if (!atomic_load_explicit(&t->released, memory_order_relaxed)) {
            s->removed_tables++;
            s->removed_bytes += t->data_size;
        }
    }
    memcpy(out, s, size);
    return 0;
}

/* ------------------------------------------------------------------------
 * Row cache stats: the counters of tables with a row source.
 */

static void add_cache_stats(const engram__table *t, engram_cache_stats *s)
{
    s->tables++;
    for (int i = 0; i < ENGRAM__SHARDS; i++) {
        const engram__table_counters *c = &t->ctr[i];
        s->hits += atomic_load_explicit(&c->hits, memory_order_relaxed);
        s->misses += atomic_load_explicit(&c->misses, memory_order_relaxed);
        s->dedup += atomic_load_explicit(&c->dedup, memory_order_relaxed);
        s->not_kept += atomic_load_explicit(&c->not_kept, memory_order_relaxed);
        s->reads += atomic_load_explicit(&c->reads, memory_order_relaxed);
        s->bytes_read += atomic_load_explicit(&c->bytes, memory_order_relaxed);
        s->read_errors += atomic_load_explicit(&c->errors, memory_order_relaxed);
    }
    if (t->src.vt && t->src.vt->cache_stats)
        t->src.vt->cache_stats(t->src.state, s);
    if (t->src.cache)
        engram__rcache_stats(t->src.cache, s);
}

int engram_get_cache_stats(engram_store *st, const char *name, engram_cache_stats *s)
{
    engram_cache_stats all;
    engram__cbudget *b;
    engram__reader *rd;
    uint32_t size;
    int err = 0;
    if (!st || !s || s->size != sizeof(engram_cache_stats))
        return engram__err(-EINVAL, "store and stats (with size = sizeof(engram_cache_stats)) "
                                    "are required");
    if (name && (err = engram_name_check(name)) != 0)
        return err;
    size = s->size;
    memset(&all, 0, sizeof all);
    all.size = size;
    all.ways = ENGRAM_CACHE_WAYS;
    /* A read section keeps the caches read here from being released. */
    if ((err = engram__rsec_enter()) != 0)
        return err;
    /* Acquire pairs with the release stores that published them. */
    b = atomic_load_explicit(&st->budget, memory_order_acquire);
    rd = atomic_load_explicit(&st->reader, memory_order_acquire);
    all.budget_bytes = b ? engram__cbudget_total(b)
                     : st->opts.cache_bytes ? st->opts.cache_bytes
                                            : ENGRAM__CACHE_DEFAULT_BUDGET;
    all.queue_depth = rd ? engram__reader_queue_depth(rd)
                      : st->opts.queue_depth ? st->opts.queue_depth
                                             : ENGRAM__RD_DEFAULT_QD;
    all.staging_bytes = b ? engram__cbudget_staging(b) : 0;
    if (name) {
        engram__table *t = find_unlocked(st, name);
        if (!t || !t->src.ops.read_rows)
            err = engram__err(-ENOENT, "table '%s' is not an open table read through a source",
                              name);
        else
            add_cache_stats(t, &all);
    } else {
        for (uint32_t i = 0; i < engram__table_count(st); i++) {
            engram__table *t = engram__table_get(st, i);
            if (t->src.ops.read_rows && !atomic_load_explicit(&t->removed, memory_order_relaxed))
                add_cache_stats(t, &all);
        }
    }
    engram__rsec_exit();
    memcpy(s, &all, size);
    return err;
}

void engram__store_maybe_log(engram_store *st)
{
    engram_cache_stats s = ENGRAM_CACHE_STATS_INIT;
    uint64_t now = engram__now_ns(), due;
    due = atomic_load_explicit(&st->next_log_ns, memory_order_relaxed);
    /* The CAS makes exactly one of the lookups that notice the interval
     * has passed print. */
    if (now < due || !atomic_compare_exchange_strong_explicit(&st->next_log_ns, &due,
                                                              now + st->log_ns,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed))
        return;
    if (engram_get_cache_stats(st, NULL, &s) != 0)
        return;
    /* Asked for by the store (its interval), so it reaches stderr even
     * without a log function. */
    engram__log(ENGRAM_LOG_INFO, ENGRAM__LOG_ASKED,
                "cache %s: hit rate %.1f%% (%" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
                " deduplicated, %" PRIu64 " not kept), %" PRIu64 " reads, %.1f MiB read, %" PRIu64 " errors, %.1f MiB in %"
                PRIu64 " slots (%u ways), %.1f MiB staging, %" PRIu64 "/%" PRIu64
                " tables O_DIRECT",
                st->path,
                s.hits + s.misses ? 100.0 * (double)s.hits / (double)(s.hits + s.misses) : 0.0,
                s.hits, s.misses, s.dedup, s.not_kept, s.reads, (double)s.bytes_read / 1048576.0,
                s.read_errors, (double)s.cache_bytes / 1048576.0, s.slots, s.ways,
                (double)s.staging_bytes / 1048576.0, s.direct_tables, s.tables);
}
