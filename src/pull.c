/*
 * pull.c - tables of a remote namespace read whole: engram_verify() of a
 * remote table, and engram_pull(), which copies one into a directory
 * namespace; engram_pull_rows(), the same copy from rows the caller's code
 * reads (a store engram has no module for: engramstore's Mooncake Store);
 * engram_check_origin(), a pulled table against the namespace it came from.
 *
 * Both read through the remote's read_all() (remote.h), which checks
 * every piece against the remote's checksums as it comes; the whole is
 * checked here at the end (verify hashes the rows; a pull takes the
 * writer's checksum of what it wrote, so the file itself is what is
 * compared).  A pull writes what it reads through engram_writer_*, so the
 * local table is made as any other is (capacity first, create-only,
 * atomic), and publishes only after the remote's whole checksum held.
 * Ranks of a node pulling the same table meet as engram_populate_shared()'s
 * writers do: the one whose temporary file exists is waited for, and a
 * published table with the remote's spec and checksum is reused.
 * pull_loop() is that meeting, for both: what differs is only how the
 * rows are read and checked (fill) and how a published table is compared
 * with the source's (same).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "xxh.h"

#include "format.h"
#include "fsutil.h"
#include "lease.h"
#include "nsdir.h"
#include "remote.h"
#include "store.h"
#include "writer.h"

/* Progress over a read_all(): bytes so far of the table's. */
typedef struct reading {
    const char *name;
    const char *verb; /* "verify", "pull" */
    engram_progress_fn progress;
    void *ud;
    uint64_t done, total;
    uint32_t row_bytes;
    uint64_t sum;   /* the remote's checksum of the rows */
    XXH3_state_t *xs; /* verify: the rows' XXH3 so far */
    /* pull only */
    engram_writer *w;
    engram_table_spec want; /* the remote's table as described before the read */
    uint64_t want_sum;
} reading;

static int reading_begin(reading *r, const engram_table_spec *spec, uint64_t sum)
{
    r->total = spec->num_rows * spec->row_bytes;
    r->row_bytes = spec->row_bytes;
    r->sum = sum;
    return 0;
}

/* The rows read were whole: their checksum is the remote's. */
static int reading_whole(const reading *r, const char *where, uint64_t got)
{
    if (got != r->sum)
        return engram__err(ENGRAM_ECHECKSUM, "table '%s' in %s: the rows' checksum %016" PRIx64
                                             " differs from the remote's %016" PRIx64,
                           r->name, where, got, r->sum);
    return 0;
}

/* The sinks' read(): progress, on the caller's thread. */
static int reading_read(void *ud, uint64_t n)
{
    reading *r = ud;
    r->done += n * r->row_bytes;
    if (r->progress && r->progress(r->ud, r->done, r->total) != 0)
        return engram__err(-ECANCELED, "%s of table '%s' cancelled", r->verb, r->name);
    return 0;
}

static int verify_begin(void *ud, const engram_table_spec *spec, uint64_t sum)
{
    return reading_begin(ud, spec, sum);
}

static int verify_rows(void *ud, const void *rows, uint64_t n)
{
    reading *r = ud;
    XXH3_64bits_update(r->xs, rows, n * r->row_bytes);
    return 0;
}

int engram__remote_verify(engram_store *st, const char *name, engram_progress_fn progress,
                          void *ud)
{
    reading r = {.name = name, .verb = "verify", .progress = progress, .ud = ud};
    engram__remote_sink k = {verify_begin, verify_rows, reading_read, &r, NULL};
    int err;
    if (!(r.xs = XXH3_createState()))
        return engram__err(-ENOMEM, "out of memory");
    XXH3_64bits_reset(r.xs);
    err = st->ns->read_all(st->ns_state, name, &k);
    if (err == 0)
        err = reading_whole(&r, st->path, XXH3_64bits_digest(r.xs));
    XXH3_freeState(r.xs);
    return err;
}

/* What a pull copies from, for pull_loop(): the source's table (its
 * spec, packed), how a table published in the namespace is compared with
 * it, and how its rows are read into a writer and checked. */
typedef struct pull_from pull_from;
struct pull_from {
    const char *desc;       /* the source, for messages */
    engram_table_spec want; /* the source's table as described before the read */
    /* Where the rows were published, recorded in the table
     * (engram_writer_set_origin()); kind ENGRAM_ORIGIN_NONE: not here. */
    engram_origin origin;
    /* Table file `name` of `to`, whose info li has want's spec: 0 if it
     * holds the source's rows, ENGRAM_EMISMATCH (with the message) if not,
     * or another error. */
    int (*same)(pull_from *pf, engram_store *to, const char *name, const engram_table_info *li);
    /* Appends every row of the source to w, checked: 0, or the error
     * (w is aborted by the caller). */
    int (*fill)(pull_from *pf, engram_writer *w);
};

/* Whether `to` holds `name` as the source describes it: 0 (reuse it),
 * -ENOENT (not there), ENGRAM_EMISMATCH, or another error. */
static int pulled_as(engram_store *to, const char *name, pull_from *pf)
{
    engram_table_info li = ENGRAM_TABLE_INFO_INIT;
    const engram_table_spec *want = &pf->want;
    int err;
    if ((err = engram_get_table_info(to, name, &li)) != 0)
        return err;
    /* Not a file of the namespace: no removal there makes room. */
    if (li.kind != ENGRAM_TABLE_FILE)
        return engram__err(ENGRAM_EMISMATCH,
                           "table '%s' is %s in %s, not a table of its namespace: it cannot be "
                           "pulled into this store",
                           name, engram__bound_kind(li.kind), to->path);
    if (li.spec.num_rows != want->num_rows || li.spec.row_bytes != want->row_bytes ||
        li.spec.row_pitch != want->row_bytes)
        return engram__err(ENGRAM_EMISMATCH,
                           "table '%s' of %s holds other rows than %s's (%" PRIu64 " rows of %"
                           PRIu32 " bytes, pitch %" PRIu32 "; the source's: %" PRIu64
                           " rows of %" PRIu32 " bytes); remove it first to pull",
                           name, to->path, pf->desc, li.spec.num_rows, li.spec.row_bytes,
                           li.spec.row_pitch, want->num_rows, want->row_bytes);
    return pf->same(pf, to, name, &li);
}

/* engram_pull()'s source: a remote namespace's table. */
typedef struct remote_from {
    pull_from pf;
    engram_store *from;
    const char *name;
    engram_progress_fn progress;
    void *ud;
    uint64_t want_sum; /* the remote's checksum, as described before the read */
    reading r;
} remote_from;

static int pull_begin(void *ud, const engram_table_spec *spec, uint64_t sum)
{
    reading *r = ud;
    /* Removed and pushed again since it was described: the comparison
     * with a local table was made with the other one. */
    if (spec->num_rows != r->want.num_rows || spec->row_bytes != r->want.row_bytes ||
        sum != r->want_sum)
        return engram__err(-EAGAIN, "pull '%s': the remote table changed while the pull began; "
                                    "pull it again",
                           r->name);
    return reading_begin(r, spec, sum);
}

static int pull_rows(void *ud, const void *rows, uint64_t n)
{
    reading *r = ud;
    return engram_writer_append(r->w, rows, n, 0);
}

/* The rows land in the table file itself where they can (a tmpfs): no
 * copy from a buffer into it. */
static unsigned char *pull_region(void *ud)
{
    reading *r = ud;
    return engram__writer_region(r->w, r->total);
}

static int remote_same(pull_from *pf, engram_store *to, const char *name,
                       const engram_table_info *li)
{
    const remote_from *rf = (const remote_from *)pf;
    if (li->checksum != rf->want_sum)
        return engram__err(ENGRAM_EMISMATCH,
                           "table '%s' of %s holds other rows than %s's (checksum %016" PRIx64
                           "; the remote's: %016" PRIx64 "); remove it first to pull",
                           name, to->path, pf->desc, li->checksum, rf->want_sum);
    return 0;
}

static int remote_fill(pull_from *pf, engram_writer *w)
{
    remote_from *rf = (remote_from *)pf;
    engram__remote_sink k = {pull_begin, pull_rows, reading_read, &rf->r, pull_region};
    int err;
    rf->r = (reading){.name = rf->name, .verb = "pull", .progress = rf->progress, .ud = rf->ud,
                      .w = w, .want = pf->want, .want_sum = rf->want_sum};
    err = rf->from->ns->read_all(rf->from->ns_state, rf->name, &k);
    /* The whole, as the file holds it (the writer's own checksum of
     * what it wrote), before anything is published. */
    if (err == 0)
        err = reading_whole(&rf->r, pf->desc, engram__writer_sum(w));
    return err;
}

/* Up to 20 ms, drawn at random: ranks that gave way to each other do
 * not start again at the same instant. */
static void pause_a_little(void)
{
    uint32_t r = 0;
    struct timespec ts;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        r = (uint32_t)engram__now_ns();
    ts.tv_sec = 0;
    ts.tv_nsec = (long)(r % 20000000u);
    nanosleep(&ts, NULL);
}

/* How long a rank waits for another's pull (or write) of the table that
 * shows no progress: its temporary file not written for this long.  A
 * pull that moves, however long it takes, is waited for. */
#define PULL_STALL_MS ENGRAM_SHARED_WAIT_MS

/* Waits until the writer whose temporary file `ent` is open at fd ends
 * (committed, aborted or dead), while it shows progress; closes fd.  0,
 * or -ETIMEDOUT naming it. */
static int wait_for_writer(engram_store *to, const char *name, int fd, const char *ent)
{
    struct timespec last = {0, 0};
    uint64_t moved = engram__now_ns();
    for (;;) {
        struct stat sb;
        uint64_t now;
        if (engram__wait_writer(fd, engram__now_ns() + 1000000000u) == 0)
            break;
        now = engram__now_ns();
        if (fstat(fd, &sb) == 0 && (sb.st_mtim.tv_sec != last.tv_sec ||
                                    sb.st_mtim.tv_nsec != last.tv_nsec)) {
            last = sb.st_mtim;
            moved = now;
        } else if (now - moved >= (uint64_t)PULL_STALL_MS * 1000000u) {
            char who[160];
            engram__temp_holder(fd, ent, who, sizeof who);
            close(fd);
            return engram__err(-ETIMEDOUT, "table '%s' is being written in %s %s (temporary "
                                           "file %s), which has written nothing for %d ms; gave "
                                           "up waiting for it",
                               name, to->path, who, ent, PULL_STALL_MS);
        }
    }
    close(fd);
    return 0;
}

/* The pull of table `name` into `to` from pf, with the ranks of a node
 * meeting at the namespace (see engram_pull()). */
static int pull_loop(engram_store *to, const char *name, pull_from *pf, int *written)
{
    for (;;) {
        engram_writer *w;
        char ent[ENGRAM_NAME_MAX + 64];
        int fd, err;
        if ((err = pulled_as(to, name, pf)) != -ENOENT)
            return err;
        if ((fd = engram__live_writer(to, name, ent, sizeof ent)) >= 0) {
            /* Another rank pulls (or writes) it: look again when it ends. */
            if ((err = wait_for_writer(to, name, fd, ent)) != 0)
                return err;
            continue;
        }
        /* Our writer first (capacity checked, space reserved): from now on
         * the others see a writer of the name and wait for it.  One that
         * then finds another writer of the name gives way before reading
         * anything: whoever checked first saw no other, and ranks that
         * began at the same instant both give way, then start again after
         * a pause of their own (random), so one of them goes first. */
        if ((err = engram_writer_begin(to, name, &pf->want, &w)) == -EEXIST)
            continue; /* published meanwhile: compare with it */
        if (err)
            return err;
        if (pf->origin.kind != ENGRAM_ORIGIN_NONE &&
            (err = engram_writer_set_origin(w, &pf->origin)) != 0) {
            engram_writer_abort(w);
            return err;
        }
        if ((fd = engram__live_writer_other(to, name, engram__writer_temp(w), ent,
                                            sizeof ent)) >= 0) {
            engram_writer_abort(w);
            if ((err = wait_for_writer(to, name, fd, ent)) != 0)
                return err;
            pause_a_little();
            continue;
        }
        /* The writer that was there may have published just before our
         * look: then there is nothing to read. */
        if ((err = pulled_as(to, name, pf)) != -ENOENT) {
            engram_writer_abort(w);
            return err;
        }
        /* Every row read and checked before anything is published. */
        if ((err = pf->fill(pf, w)) == 0)
            err = engram_writer_commit(w); /* frees it */
        else
            engram_writer_abort(w);
        if (err != -EEXIST) {
            if (err == 0 && written)
                *written = 1;
            return err;
        }
        /* Published meanwhile by another rank: compare with it. */
    }
}

/* The pull's arguments both forms check: 0 or the error. */
static int pull_args(engram_store *to, const char *name, int *written)
{
    int err;
    if (written)
        *written = 0;
    if (!to)
        return engram__err(-EINVAL, "the store to pull to is required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    if (!engram__store_remote(to, &engram__nsdir_vt))
        return engram__err(-EINVAL, "pull '%s': the store to pull to is not a directory "
                                    "namespace (engram_store_open())",
                           name);
    return 0;
}

int engram_pull(engram_store *to, engram_store *from, const char *name,
                engram_progress_fn progress, void *ud, int *written)
{
    engram_table_info ri = ENGRAM_TABLE_INFO_INIT;
    remote_from rf;
    int err;

    if (written)
        *written = 0;
    if (!to || !from)
        return engram__err(-EINVAL, "the stores to pull to and from are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    if (!from->ns || !from->ns->read_all)
        return engram__err(-EINVAL, "pull '%s': the store to pull from (%s) is not a remote "
                                    "namespace (engram_store_open_redis())",
                           name, from->path ? from->path : "a memory store");
    if ((err = pull_args(to, name, written)) != 0)
        return err;
    if ((err = engram_get_table_info(from, name, &ri)) != 0)
        return err;
    if (ri.kind != from->ns->kind)
        return engram__err(-EINVAL, "pull '%s': it is bound or served in the store to pull "
                                    "from, not a table of its namespace",
                           name);
    /* A table open in `from` is described as it was when it was opened;
     * the local table is compared with the remote's as it is now (it may
     * have been removed and pushed again since). */
    if ((err = from->ns->info(from->ns_state, name, &ri)) != 0)
        return err;
    /* Where it comes from, as described: the publication whose spec and
     * checksum pull_begin() holds the read to. */
    rf = (remote_from){.pf = {.desc = from->path, .want = {ri.spec.num_rows, ri.spec.row_bytes, 0},
                              .origin = ri.origin, .same = remote_same, .fill = remote_fill},
                       .from = from, .name = name, .progress = progress, .ud = ud,
                       .want_sum = ri.checksum};
    return pull_loop(to, name, &rf.pf, written);
}

/* engram_pull_rows()'s source: the caller's functions. */
typedef struct ops_from {
    pull_from pf;
    const engram_pull_ops *ops;
    void *ud;
} ops_from;

/* The caller's same() over the published table file's rows, mapped
 * read-only for the call. */
static int ops_same(pull_from *pf, engram_store *to, const char *name,
                    const engram_table_info *li)
{
    const ops_from *of = (const ops_from *)pf;
    engram__header h;
    engram_table_spec spec;
    struct stat sb;
    void *rows;
    int fd, err;
    (void)li;
    if ((fd = engram__open_table_file(to->dirfd, to->path, to->uid, name, &sb, &h)) < 0)
        return fd;
    /* Replaced since its info was read: compared as it is now. */
    if (h.num_rows != pf->want.num_rows || h.row_bytes != pf->want.row_bytes ||
        h.row_pitch != pf->want.row_bytes) {
        close(fd);
        return engram__err(ENGRAM_EMISMATCH,
                           "table '%s' of %s holds other rows than %s's (%" PRIu64 " rows of %"
                           PRIu32 " bytes; the source's: %" PRIu64 " rows of %" PRIu32
                           " bytes); remove it first to pull",
                           name, to->path, pf->desc, h.num_rows, h.row_bytes,
                           pf->want.num_rows, pf->want.row_bytes);
    }
    /* Reading a hole of a mapping could cost a SIGBUS (see fsutil.h). */
    if ((err = engram__check_holes(fd, &h, name)) != 0) {
        close(fd);
        return err;
    }
    rows = mmap(NULL, (size_t)h.data_size, PROT_READ, MAP_SHARED, fd, (off_t)h.data_offset);
    close(fd);
    if (rows == MAP_FAILED)
        return engram__errno(errno, "map table '%s' of %s to compare it", name, to->path);
    spec = (engram_table_spec){h.num_rows, h.row_bytes, h.row_pitch};
    err = of->ops->same(of->ud, rows, &spec);
    munmap(rows, (size_t)h.data_size);
    if (err == 1)
        return 0;
    if (err == 0)
        return engram__err(ENGRAM_EMISMATCH,
                           "table '%s' of %s holds other rows than %s's (the same shape, "
                           "other bytes); remove it first to pull",
                           name, to->path, pf->desc);
    return err < 0 ? err : engram__err(-EINVAL, "pull '%s': same() answered %d, not 1, 0 or a "
                                                "negative code",
                                       name, err);
}

static int ops_fill(pull_from *pf, engram_writer *w)
{
    const ops_from *of = (const ops_from *)pf;
    int err = of->ops->fill(of->ud, w);
    if (err > 0)
        return engram__err(-EINVAL, "pull from %s: fill() answered %d, not 0 or a negative "
                                    "code",
                           pf->desc, err);
    return err;
}

int engram_pull_rows(engram_store *to, const char *name, const engram_table_spec *spec,
                     const char *from, const engram_pull_ops *ops, void *ud, int *written)
{
    ops_from of;
    int err;
    if ((err = pull_args(to, name, written)) != 0)
        return err;
    if (!spec || !ops || !ops->fill || !ops->same)
        return engram__err(-EINVAL, "pull '%s': the spec and the functions fill and same are "
                                    "required",
                           name);
    if ((err = engram_spec_check(spec)) != 0)
        return err;
    if (spec->row_pitch != 0 && spec->row_pitch != spec->row_bytes)
        return engram__err(ENGRAM_ESPEC, "pull '%s': the rows are pulled packed (row_pitch 0 "
                                         "or %" PRIu32 ", not %" PRIu32 ")",
                           name, spec->row_bytes, spec->row_pitch);
    of = (ops_from){.pf = {.desc = from && *from ? from : "the source",
                           .want = {spec->num_rows, spec->row_bytes, 0},
                           .same = ops_same, .fill = ops_fill},
                    .ops = ops, .ud = ud};
    return pull_loop(to, name, &of.pf, written);
}

/* The checksum of local table file `name`'s rows packed, as a remote
 * namespace keeps them (its data checksum covers a row pitch's padding
 * too): 0 with *sum and its spec in *spec, or the error. */
static int packed_sum(engram_store *local, const char *name, engram_table_spec *spec,
                      uint64_t *sum)
{
    engram__header h;
    struct stat sb;
    XXH3_state_t *xs;
    const unsigned char *rows;
    void *map;
    int fd, err;
    if ((fd = engram__open_table_file(local->dirfd, local->path, local->uid, name, &sb, &h)) < 0)
        return fd;
    /* Reading a hole of a mapping could cost a SIGBUS (see fsutil.h). */
    if ((err = engram__check_holes(fd, &h, name)) != 0) {
        close(fd);
        return err;
    }
    map = mmap(NULL, (size_t)h.data_size, PROT_READ, MAP_SHARED, fd, (off_t)h.data_offset);
    close(fd);
    if (map == MAP_FAILED)
        return engram__errno(errno, "map table '%s' of %s to compare it", name, local->path);
    if (!(xs = XXH3_createState())) {
        munmap(map, (size_t)h.data_size);
        return engram__err(-ENOMEM, "out of memory");
    }
    XXH3_64bits_reset(xs);
    rows = map;
    for (uint64_t i = 0; i < h.num_rows; i++)
        XXH3_64bits_update(xs, rows + i * h.row_pitch, h.row_bytes);
    *sum = XXH3_64bits_digest(xs);
    XXH3_freeState(xs);
    munmap(map, (size_t)h.data_size);
    *spec = (engram_table_spec){h.num_rows, h.row_bytes, h.row_pitch};
    return 0;
}

int engram_check_origin(engram_store *local, const char *name, engram_store *remote, int *state)
{
    engram_table_info li = ENGRAM_TABLE_INFO_INIT, ri = ENGRAM_TABLE_INFO_INIT;
    const engram_origin *o = &li.origin;
    engram_origin from;
    int err;

    if (!local || !remote || !state)
        return engram__err(-EINVAL, "the local store, the remote store and state are required");
    if ((err = engram_name_check(name)) != 0)
        return err;
    if (!remote->ns || !remote->ns->origin)
        return engram__err(-EINVAL, "check the origin of '%s': the remote store (%s) is not a "
                                    "remote namespace (engram_store_open_redis())",
                           name, remote->path ? remote->path : "a memory store");
    if ((err = engram_get_table_info(local, name, &li)) != 0)
        return err;
    if (o->kind == ENGRAM_ORIGIN_NONE)
        return engram__err(-EINVAL, "table '%s' of %s records no origin: it was not pulled from "
                                    "a remote namespace",
                           name, local->path ? local->path : "a memory store");
    remote->ns->origin(remote->ns_state, &from);
    if (o->kind != from.kind || strcmp(o->ns, from.ns) != 0)
        return engram__err(-EINVAL, "table '%s' of %s came from namespace '%s' of a %s (%s), "
                                    "not from %s",
                           name, local->path, o->ns,
                           o->kind == ENGRAM_ORIGIN_REDIS ? "Redis Cluster" : "Mooncake Store",
                           o->where[0] ? o->where : "address not recorded", remote->path);
    err = remote->ns->info(remote->ns_state, name, &ri);
    if (err == -ENOENT) {
        *state = ENGRAM_ORIGIN_GONE;
        return 0;
    }
    if (err)
        return err;
    /* The remote's checksum is of its rows packed; a local table file
     * with a pitch (a copy made by other means) is compared by its rows
     * packed, not by its own checksum, which covers the padding. */
    if (li.spec.row_pitch != li.spec.row_bytes && li.kind == ENGRAM_TABLE_FILE &&
        engram__store_remote(local, &engram__nsdir_vt) &&
        (err = packed_sum(local, name, &li.spec, &li.checksum)) != 0)
        return err;
    if (ri.spec.num_rows != li.spec.num_rows || ri.spec.row_bytes != li.spec.row_bytes ||
        ri.checksum != li.checksum)
        *state = ENGRAM_ORIGIN_CHANGED;
    else if (ri.origin.epoch != o->epoch)
        *state = ENGRAM_ORIGIN_REPUBLISHED;
    else
        *state = ENGRAM_ORIGIN_CURRENT;
    return 0;
}
