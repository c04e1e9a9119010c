/*
 * engram.h - the public C API of libengram.
 *
 * libengram stores Engram embedding tables (static tables of fixed-size,
 * opaque rows) and gathers their rows into caller-owned memory.  A *store*
 * is a namespace of named tables held by one backend: a directory of table
 * files (typically under /dev/shm, mapped shared by every process of the
 * node) or caller memory bound without copying.  The caller computes row
 * ids; the library validates them and copies the rows.
 *
 * Conventions (the same for every function below):
 *  - Functions that can fail return int: 0 on success, a negative errno
 *    (-ENOENT, -EEXIST, -ENOMEM, ...) or one of the ENGRAM_E* codes defined
 *    by ENGRAM_ERRNO_MAP on failure.  engram_strerror() gives a fixed text
 *    for a code; engram_errmsg() gives the detailed message of the last
 *    failure on the calling thread ("ids[3][1] = 912 is outside table ...").
 *  - Handles are opaque.  Every open or begin function has one matching
 *    close, commit or abort function, and those accept NULL.
 *  - Structs that may grow start with a `size` field that the caller sets to
 *    sizeof(the struct) (the *_INIT macros do it).
 *  - Thread safety is stated per function.  In short: lookups may run
 *    concurrently from any number of threads; everything else on a store
 *    is serialised internally; engram_remove() may run while lookups of
 *    the table run (they finish or fail with ENGRAM_EREMOVED), but
 *    engram_store_close() must not race with anything using the store.
 */
#ifndef ENGRAM_H
#define ENGRAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Version.  The build reads these three lines; keep their form.
 */
#define ENGRAM_VERSION_MAJOR 0
#define ENGRAM_VERSION_MINOR 1
#define ENGRAM_VERSION_PATCH 0
#define ENGRAM_VERSION_NUMBER \
    (ENGRAM_VERSION_MAJOR * 10000 + ENGRAM_VERSION_MINOR * 100 + ENGRAM_VERSION_PATCH)

#if defined(_WIN32)
#define ENGRAM_API
#elif defined(ENGRAM_BUILDING) && defined(__GNUC__)
#define ENGRAM_API __attribute__((visibility("default")))
#else
#define ENGRAM_API
#endif

/*! engram_version_string() :
 * @return : the library's version as "MAJOR.MINOR.PATCH"; a static string. */
ENGRAM_API const char *engram_version_string(void);

/*! engram_version_number() :
 * @return : ENGRAM_VERSION_NUMBER of the library actually linked. */
ENGRAM_API unsigned engram_version_number(void);

/* ------------------------------------------------------------------------
 * Errors.  Library-specific codes live in [-4099, -4000]; all other
 * negative values are negated errno values.
 */
#define ENGRAM_ERRNO_MAP(XX)                                                          \
    XX(EBADID, -4001, "row id outside its table")                                     \
    XX(ESPEC, -4002, "invalid table spec or name")                                    \
    XX(EMISMATCH, -4003, "table spec does not match the stored table")                \
    XX(ELAYOUT, -4004, "invalid array layout (shape, strides, dtype or overlap)")     \
    XX(ECORRUPT, -4005, "table file is truncated, corrupt or not an engram table")    \
    XX(ECHECKSUM, -4006, "table data does not match its checksum")                    \
    XX(EVERSION, -4007, "table file format version is not supported")                 \
    XX(EUNSAFE, -4008, "refused an entry that is a link, foreign-owned or writable by others") \
    XX(EBOUND, -4009, "operation not allowed on a table bound to caller memory")      \
    XX(EREMOVED, -4010, "table was removed")                                          \
    XX(ESTATE, -4011, "operation not allowed in the object's current state")          \
    XX(EINDOUBT, -4012, "the outcome of a remote write is in doubt (the message says how to check)")

enum {
#define ENGRAM__ERR_ENUM(name, value, text) ENGRAM_##name = (value),
    ENGRAM_ERRNO_MAP(ENGRAM__ERR_ENUM)
#undef ENGRAM__ERR_ENUM
    ENGRAM__ERR_LAST = -4000
};

/*! engram_strerror() :
 * @return : a fixed, static description of error code `err` (a negative
 *           errno or an ENGRAM_E* code).  Thread-safe. */
ENGRAM_API const char *engram_strerror(int err);

/*! engram_errmsg() :
 * @return : the detailed message of the most recent failing engram call on
 *           the calling thread (thread-local storage, valid until the next
 *           failing call on this thread); "" if none failed yet. */
ENGRAM_API const char *engram_errmsg(void);

/* ------------------------------------------------------------------------
 * Log messages.
 *
 * Failures are returned, never logged.  What the library has to say
 * besides goes to one process-wide log sink, as one line per message
 * (no newline) with a level:
 *  - ENGRAM_LOG_INFO: the periodic row cache stats line of a store that
 *    asked for one (engram_store_options.cache_log_ms, or the environment
 *    variable ENGRAM_CACHE_LOG_MS), "cache ROOT/NS: hit rate ...";
 *    a temporary file of a writer that died, removed by an open.
 *  - ENGRAM_LOG_WARN: io_uring could not be set up, so rows behind the row
 *    cache are read one pread at a time (said once per process).
 * By default no function is set and the sink is off: nothing is written,
 * except the cache stats line, which a store that asked for it writes to
 * stderr as "engram: cache ...".  engram_set_log() hands every message to
 * a function of yours instead (an engine's own logger).
 */
#define ENGRAM_LOG_OFF 0   /* no messages */
#define ENGRAM_LOG_ERROR 1 /* something failed that no call returns */
#define ENGRAM_LOG_WARN 2  /* a fallback that costs speed or memory */
#define ENGRAM_LOG_INFO 3  /* what the library did: stats lines, cleanups */
#define ENGRAM_LOG_DEBUG 4 /* details for whoever debugs the library */

/* Receives one message: `level` is one of ENGRAM_LOG_ERROR .. DEBUG, `msg`
 * one line without a newline, valid only during the call. */
typedef void (*engram_log_fn)(void *ud, int level, const char *msg);

/*! engram_set_log() :
 * Sends the library's log messages of `level` and more severe levels
 * (ERROR < WARN < INFO < DEBUG; ENGRAM_LOG_OFF: none at all, not even the
 * stats line a store asked for) to fn(ud, level, msg), for the whole
 * process.  fn NULL restores the default (see above); ud is then not
 * used (level is still checked).  fn is called from whichever thread
 * raised the message (a lookup's, for the stats line, once that lookup is
 * done), never from two threads at once.  It should return quickly; it may
 * call the library (a lookup, say: messages raised on its thread meanwhile
 * are dropped) but not engram_set_log() (ENGRAM_ESTATE).  Once
 * engram_set_log() has returned, the function it replaced is no longer
 * called.  Thread-safe.
 * @return : 0, -EINVAL (level outside ENGRAM_LOG_OFF .. ENGRAM_LOG_DEBUG),
 *           or ENGRAM_ESTATE (called from the log function). */
ENGRAM_API int engram_set_log(engram_log_fn fn, void *ud, int level);

/* ------------------------------------------------------------------------
 * Table specs and names.
 *
 * A table is `num_rows` rows of `row_bytes` opaque bytes.  Rows are stored
 * `row_pitch` bytes apart (row_pitch >= row_bytes; 0 means row_bytes), e.g.
 * 264-byte rows at a 272-byte pitch so every row starts 16-byte aligned.
 *
 * Names are 1..ENGRAM_NAME_MAX bytes of [A-Za-z0-9._:-], not starting with
 * '.' ("engram:l1:h0" is a valid name).  Namespace names follow the same
 * rule.
 */
#define ENGRAM_NAME_MAX 128
#define ENGRAM_ROW_BYTES_MAX (1u << 24) /* 16 MiB */

typedef struct engram_table_spec {
    uint64_t num_rows;  /* >= 1 */
    uint32_t row_bytes; /* 1 .. ENGRAM_ROW_BYTES_MAX */
    uint32_t row_pitch; /* 0 (= row_bytes) or row_bytes .. ENGRAM_ROW_BYTES_MAX */
} engram_table_spec;

/*! engram_spec_check() :
 * Validates a spec (ranges, and that num_rows * row_pitch fits in memory
 * sizes).  Thread-safe.
 * @return : 0, or ENGRAM_ESPEC with the reason in engram_errmsg(). */
ENGRAM_API int engram_spec_check(const engram_table_spec *spec);

/*! engram_name_check() :
 * @return : 0 if `name` is a valid table or namespace name, else
 *           ENGRAM_ESPEC with the reason in engram_errmsg().  Thread-safe. */
ENGRAM_API int engram_name_check(const char *name);

/* ------------------------------------------------------------------------
 * Stores.
 */
typedef struct engram_store engram_store;

/* engram_store_options.flags */
#define ENGRAM_OPEN_CREATE 0x0001u        /* create the namespace directory if missing */
#define ENGRAM_OPEN_PREFAULT 0x0002u      /* map tables with MAP_POPULATE: no first-touch faults */
#define ENGRAM_OPEN_RANDOM 0x0004u        /* madvise(MADV_RANDOM) on table mappings */
#define ENGRAM_OPEN_PRIVATE_HUGE 0x0008u  /* serve a private huge-page copy of each table
                                           * (MADV_HUGEPAGE + touch + MADV_COLLAPSE) instead of
                                           * the shared mapping */
#define ENGRAM_OPEN_MLOCK 0x0010u         /* mlock table memory (fails if RLIMIT_MEMLOCK is low) */
#define ENGRAM_OPEN_VERIFY 0x0020u        /* verify each table's checksum when it is first mapped */
#define ENGRAM_OPEN_TIMING 0x0040u        /* measure lookup time for stats (costs two clock reads
                                           * per lookup, ~60 ns here) */
#define ENGRAM_OPEN_GROUP 0x0080u         /* share the namespace with the owner's group: directory
                                           * 0750 and files 0440 instead of 0700 / 0400; a
                                           * reader accepts another user's namespace shared
                                           * with one of its groups (engram_store_open()) */
#define ENGRAM_OPEN_FILE_CACHE 0x0100u    /* serve table files without mapping them: rows are read
                                           * on demand with io_uring (O_DIRECT where the file
                                           * system allows it) through a bounded row cache; see
                                           * cache_bytes and engram_get_cache_stats() */
#define ENGRAM_OPEN_NUMA_LOCAL 0x0200u    /* engram_table_open() of NAME serves NAME.numaN, the
                                           * copy on the calling thread's NUMA node N, where the
                                           * namespace has one (engram_numa_copy()) */
#define ENGRAM_OPEN_CACHE_KEEP_ALL 0x0400u /* the row cache keeps every row read, evicting by
                                           * CLOCK alone, without its admission filter (see
                                           * ENGRAM_OPEN_FILE_CACHE below): for hot sets that
                                           * change all at once */

/* engram_store_options.numa_policy: where table pages go (see "NUMA
 * placement" below). */
#define ENGRAM_NUMA_DEFAULT 0    /* the kernel's choice: the node of whoever touches a page first */
#define ENGRAM_NUMA_NODE 1       /* prefer one node: numa_node, or the node of PCI device numa_gpu */
#define ENGRAM_NUMA_INTERLEAVE 2 /* interleave pages over the nodes of numa_nodes */

typedef struct engram_store_options {
    uint32_t size;     /* sizeof(engram_store_options) */
    uint32_t flags;    /* ENGRAM_OPEN_* */
    int threads;       /* gather threads including the caller: 0 = one per CPU (at most 8),
                        * 1 = the calling thread only */
    size_t parallel_min_rows; /* split a lookup across threads from this many rows up;
                               * 0 = the measured default */
    /* The row cache. */
    uint64_t cache_bytes;  /* memory budget of the whole store's row cache (its slots and
                            * its reads' staging: file-cache, safetensors and source
                            * tables): 0 = 256 MiB.  See engram_get_cache_stats(). */
    uint32_t queue_depth;  /* io_uring reads in flight per lookup: 0 = 64
                            * (1 .. ENGRAM_QUEUE_DEPTH_MAX) */
    uint32_t cache_log_ms; /* log a cache stats line at most every this many ms of
                            * lookups (to stderr, or to the function of engram_set_log());
                            * 0 = the ENGRAM_CACHE_LOG_MS environment variable, or never */
    /* NUMA placement: of the table files this store writes in a tmpfs
     * namespace and of the private copies it makes at open
     * (ENGRAM_OPEN_PRIVATE_HUGE); see "NUMA placement" below. */
    uint32_t numa_policy;   /* ENGRAM_NUMA_*; ENGRAM_NUMA_DEFAULT = no placement */
    int32_t numa_node;      /* ENGRAM_NUMA_NODE: the node, or -1 to take numa_gpu's */
    const char *numa_gpu;   /* ENGRAM_NUMA_NODE with numa_node -1: the PCI bus id of a
                             * device ("0000:3b:00.0", as cudaDeviceGetPCIBusId() and
                             * nvidia-smi give it) whose node the pages go to; read at open */
    const char *numa_nodes; /* ENGRAM_NUMA_INTERLEAVE: the nodes, "0-1,3" (numactl's list
                             * syntax); NULL or "" = every node with memory; read at open */
} engram_store_options;

#define ENGRAM_QUEUE_DEPTH_MAX 4096u /* engram_store_options.queue_depth at most */

#define ENGRAM_STORE_OPTIONS_INIT {sizeof(engram_store_options), 0u, 0, 0, 0, 0, 0, 0u, 0, NULL, NULL}

/*! engram_default_root() :
 * The root directory used where none is given (engram_store_open() and
 * engram_namespace_list() with root NULL; the CLI without --root; the
 * Python package without local_dir).  Thread-safe while nothing changes
 * the environment.
 * @return : the value of the environment variable ENGRAM_ROOT when it is
 *           set and not empty (the environment's own string: valid until
 *           the environment changes), else "/dev/shm/engram" when /dev/shm
 *           exists, else "/tmp/engram" (static strings). */
ENGRAM_API const char *engram_default_root(void);

/*! engram_store_open() :
 * Opens the namespace `ns` under directory `root` (NULL: the default root).
 * With ENGRAM_OPEN_CREATE, a missing root and namespace directory are
 * created (mode 0700, or 0750 with ENGRAM_OPEN_GROUP).  Existing tables are
 * found on demand; nothing is mapped until a table is first used.  Stale
 * temporary files left by killed writers are removed (put off to a later
 * open while another process holds a flock() on the namespace directory:
 * no open waits for one).
 *
 * Security: the root and the namespace must be real directories (never a
 * link), owned by the caller (the root may also be owned by root, and be
 * writable by others if it is sticky), and the namespace must not be
 * writable by group or others.  With ENGRAM_OPEN_GROUP the namespace may
 * be another user's if its group is one of the caller's groups (the owner
 * shared it with us), and the root may then also be owned by that same
 * user; a namespace is never created in a root of another user.  Only
 * files owned by the namespace's owner are read.  Violations give
 * ENGRAM_EUNSAFE with the path and the owner in engram_errmsg().
 *
 * `opts` may be NULL (defaults).  On success *out owns the store; close it
 * with engram_store_close().
 * @return : 0, -ENOENT (no such namespace and no CREATE), ENGRAM_EUNSAFE,
 *           ENGRAM_ESPEC (bad namespace name), or another negative errno. */
ENGRAM_API int engram_store_open(const char *root, const char *ns,
                                 const engram_store_options *opts, engram_store **out);

/*! engram_store_open_memory() :
 * Opens a store with no directory: it only serves tables bound with
 * engram_bind().  `opts` may be NULL.
 * @return : 0 or -ENOMEM / -EINVAL. */
ENGRAM_API int engram_store_open_memory(const engram_store_options *opts, engram_store **out);

/*! engram_store_close() :
 * Unmaps every table, stops the gather threads and frees the store.
 * Accepts NULL.  Must not race with any other call on the same store. */
ENGRAM_API void engram_store_close(engram_store *st);

/* ------------------------------------------------------------------------
 * Writing tables: create-only and atomic.
 *
 * A table is written to a temporary file in the namespace, synced, then
 * published under its name with link(2), which fails if the name exists:
 * of several writers (threads or processes) of one name exactly one wins;
 * the others get -EEXIST.  Readers never see a partial table.  A writer
 * killed mid-way leaves only its temporary file, which the next
 * engram_store_open() of the namespace removes.
 */
typedef struct engram_writer engram_writer;

/*! engram_writer_begin() :
 * Starts writing table `name` with `spec` (streaming: the rows may arrive
 * in any number of engram_writer_append() calls).  Before anything is
 * written, the table is checked against the namespace's capacity (see
 * engram_check_capacity(): -ENOSPC, for the file system or the memory
 * cgroup of a tmpfs writer, with the figures and the fix in
 * engram_errmsg()), and space for the whole table is then reserved, so a
 * full disk fails here rather than half-way.  Fails at once with -EEXIST
 * if the name is already published or bound.  Thread-safe.
 * @return : 0 and *out, or a negative code. */
ENGRAM_API int engram_writer_begin(engram_store *st, const char *name,
                                   const engram_table_spec *spec, engram_writer **out);

/*! engram_writer_set_range() :
 * Records in the table being written that it holds rows [row_start,
 * row_start + num_rows) of a tensor of total_rows rows (a TP rank's
 * shard, or one head of a layer whose heads are concatenated), so that
 * readers can find the offset of its global ids in
 * engram_table_info.row_start / total_rows instead of having to be told.
 * May be called any time before engram_writer_commit(); a later call
 * replaces an earlier one.  A table with a range is written in format
 * version 2 (docs/format.md), which libraries older than this call refuse
 * (ENGRAM_EVERSION); a table without one stays version 1.
 * @return : 0, ENGRAM_ESPEC (total_rows 0 or above 2^62, or the rows not
 *           within it), -EINVAL (w NULL), ENGRAM_ESTATE (a failed writer). */
ENGRAM_API int engram_writer_set_range(engram_writer *w, uint64_t row_start, uint64_t total_rows);

/* engram_origin.kind */
#define ENGRAM_ORIGIN_NONE 0     /* not pulled from a remote namespace */
#define ENGRAM_ORIGIN_REDIS 1    /* a namespace of a Redis Cluster */
#define ENGRAM_ORIGIN_MOONCAKE 2 /* a namespace of a Mooncake Store (the Python tier) */
#define ENGRAM_ORIGIN_WHERE_MAX 127 /* bytes of engram_origin.where at most */

/* Where a table's rows were published: the remote store, its namespace
 * and the publication.  Recorded in a table file by engram_pull() (and
 * engram_writer_set_origin()), and reported for a table of a remote
 * namespace as its own, so that the two compare (engram_check_origin()). */
typedef struct engram_origin {
    uint32_t kind;   /* ENGRAM_ORIGIN_*; the rest is zero for ENGRAM_ORIGIN_NONE */
    /* The publication in its namespace, never 0: a Redis Cluster
     * manifest's epoch; for a Mooncake Store a 64-bit digest of the
     * publication's rows key, which every populate makes new. */
    uint64_t epoch;
    char ns[ENGRAM_NAME_MAX + 1]; /* the remote namespace */
    /* How the store was reached, printable without spaces, "" if unknown:
     * for a Redis Cluster the nodes given (host:port[,host:port...], as
     * many whole ones as fit, less any with a space or an unprintable
     * byte); "" for a Mooncake Store (its client is given to every call
     * that reads it). */
    char where[ENGRAM_ORIGIN_WHERE_MAX + 1];
} engram_origin;

/*! engram_writer_set_origin() :
 * Records in the table being written where its rows were published
 * (engram_origin: kind, epoch, namespace, address), reported in
 * engram_table_info.origin and compared by engram_check_origin().
 * engram_pull() sets it; a caller that copies a remote table by other
 * means (the Python package's Mooncake pull) sets it here.  A table with
 * an origin is written in format version 3 (docs/format.md), which older
 * libraries refuse (ENGRAM_EVERSION).  May be called any time before
 * engram_writer_commit(); a later call replaces an earlier one.  A writer
 * of a Redis Cluster's namespace checks the origin and keeps none: the
 * cluster's tables report their own namespace as their origin.
 * @return : 0, ENGRAM_ESPEC (a kind other than ENGRAM_ORIGIN_REDIS or
 *           _MOONCAKE, epoch 0, a namespace that is not a valid name, an
 *           address longer than ENGRAM_ORIGIN_WHERE_MAX or with a byte
 *           that is not printable or is a space), -EINVAL (w or o NULL),
 *           ENGRAM_ESTATE (a failed writer). */
ENGRAM_API int engram_writer_set_origin(engram_writer *w, const engram_origin *o);

/*! engram_writer_append() :
 * Appends `nrows` rows read from `rows`, `src_stride` bytes apart
 * (0 = row_bytes; only the first row_bytes of each are used).  Appending
 * beyond num_rows is an error.  A failed append leaves the writer usable
 * only for engram_writer_abort().
 * @return : 0, -ENOSPC, -EIO, ENGRAM_ESTATE, ... */
ENGRAM_API int engram_writer_append(engram_writer *w, const void *rows, uint64_t nrows,
                                    size_t src_stride);

/*! engram_writer_commit() :
 * Checks that all num_rows rows were appended, writes the header with the
 * data checksum, syncs and publishes the table.  Always frees `w`; on
 * failure the temporary file is removed and nothing is published.
 * @return : 0, -EEXIST (another writer won), ENGRAM_ESTATE (rows missing),
 *           or another negative code. */
ENGRAM_API int engram_writer_commit(engram_writer *w);

/*! engram_writer_abort() :
 * Discards the temporary file and frees `w`.  Accepts NULL. */
ENGRAM_API void engram_writer_abort(engram_writer *w);

/* How long engram_populate_shared() waits, at most, for another process
 * that is writing the same table: 10 minutes.  A live writer writes at
 * the speed of memory or of its disk, so even a table of 100 GB takes it
 * a minute or two; a writer that hangs (stopped, or blocked for good)
 * holds the name until it ends, and its waiters must not wait with it
 * for ever. */
#define ENGRAM_SHARED_WAIT_MS 600000

/*! engram_populate_shared() :
 * The populate that every process of a node can call with the same rows,
 * with no leader and no barrier between them: exactly one writes the
 * table, and the others reuse it.  If the table is already published, it
 * is compared with `rows` (spec, and the data checksum computed from
 * `rows`); if another live process is writing it (the lock of its
 * temporary file is held), this waits for that writer to finish, for at
 * most ENGRAM_SHARED_WAIT_MS (engram_populate_shared_wait() takes the
 * limit), and then compares; if that writer dies instead, this one writes
 * the table.
 * Processes need only see the same namespace directory (no shared process
 * group, PID namespace or launcher).  In a namespace of a Redis Cluster
 * there is no writer's lock to wait on: racing processes may each upload
 * the table, the cluster publishes one (create-only) and the others
 * compare with it (the checksum of the rows packed, without a pitch).
 * *written (may be NULL) is set to 1
 * when this call wrote the table, 0 when it reused it.  Comparing reads
 * all of `rows` once (XXH3, several GB/s).  Thread-safe.
 * @return : 0; ENGRAM_EMISMATCH if the name is published with another
 *           spec or other rows; -EEXIST if it is bound in this store;
 *           -ETIMEDOUT if another process still writes the table when the
 *           time is up (engram_errmsg() names its pid, as its PID
 *           namespace numbers it, and how long it has held the name);
 *           or as engram_populate(). */
ENGRAM_API int engram_populate_shared(engram_store *st, const char *name,
                                      const engram_table_spec *spec, const void *rows,
                                      size_t src_stride, int *written);

/*! engram_populate_shared_wait() :
 * engram_populate_shared() with its own limit on the wait for another
 * process that writes the table: timeout_ms milliseconds in all, counted
 * from when the wait starts (< 0: no limit; 0: no wait, -ETIMEDOUT at
 * once if another process is writing it).  The wait looks at the
 * writer's lock every 50 ms at most (without a limit, it sleeps on the
 * lock).  Thread-safe.
 * @return : as engram_populate_shared(). */
ENGRAM_API int engram_populate_shared_wait(engram_store *st, const char *name,
                                           const engram_table_spec *spec, const void *rows,
                                           size_t src_stride, int timeout_ms, int *written);

/*! engram_check_capacity() :
 * Answers up front whether `n` tables of `specs` fit in directory `dir`
 * (a namespace, or the root it will be made in): the free space of its
 * file system (statvfs), and, where `dir` is on a tmpfs (/dev/shm), the
 * room left under the memory cgroup limits of the calling process, to
 * which the kernel charges the tmpfs pages it writes (the tightest of its
 * cgroup and their ancestors, v2 or v1, counting page cache it could give
 * back).  Every writer makes the same check for its own table.  The
 * figures are of one moment: others may write meanwhile.  Thread-safe.
 * @return : 0 if they fit; -ENOSPC (the file system or the cgroup) with
 *           the bytes needed, the bytes available and the fix in
 *           engram_errmsg(); ENGRAM_ESPEC; -EINVAL; or the error of
 *           opening `dir`. */
ENGRAM_API int engram_check_capacity(const char *dir, const engram_table_spec *specs, size_t n);

/*! engram_populate() :
 * Writes a whole table in one call: begin + append(all rows) + commit.
 * `rows` holds spec->num_rows rows `src_stride` bytes apart (0 = row_bytes).
 * Thread-safe.
 * @return : as engram_writer_begin()/engram_writer_commit(). */
ENGRAM_API int engram_populate(engram_store *st, const char *name, const engram_table_spec *spec,
                               const void *rows, size_t src_stride);

/*! engram_bind() :
 * Serves caller-owned memory as table `name` without copying: row i is at
 * (const char *)mem + i * row_pitch.  The memory must stay valid and
 * unchanged until the store is closed (bound tables cannot be removed).
 * Binding a name that is bound or stored in the namespace is rejected with
 * -EEXIST.  Thread-safe.
 * @return : 0, -EEXIST, ENGRAM_ESPEC, -EINVAL (mem NULL). */
ENGRAM_API int engram_bind(engram_store *st, const char *name, const engram_table_spec *spec,
                           const void *mem);

/* ------------------------------------------------------------------------
 * Tables in a store.
 */
typedef uint32_t engram_table_id;

/*! engram_table_open() :
 * Resolves `name` to a table id for engram_lookup(), mapping the table file
 * on first use with the store's memory options (prefault, huge pages, ...),
 * or, with ENGRAM_OPEN_FILE_CACHE, putting it behind the row cache.
 * The id stays valid until the store is closed (a removed table's id then
 * gives ENGRAM_EREMOVED).  Opening the same name twice gives the same id.
 * Thread-safe.
 * @return : 0, -ENOENT, ENGRAM_ECORRUPT, ENGRAM_EVERSION, ENGRAM_EUNSAFE,
 *           ENGRAM_ECHECKSUM (with ENGRAM_OPEN_VERIFY), or -errno. */
ENGRAM_API int engram_table_open(engram_store *st, const char *name, engram_table_id *id);

/*! engram_table_open_wait() :
 * As engram_table_open(), but a table that is not published yet is waited
 * for, up to timeout_ms milliseconds (< 0: no limit; 0: no wait), until
 * another thread or process publishes it in the namespace: ranks can
 * block on a table another process is populating instead of meeting at a
 * barrier.  The wait sleeps on inotify events of the namespace directory
 * the store holds (where inotify is unavailable, it looks again every
 * 50 ms), and checks once a second that the directory still exists.  In
 * a namespace of a Redis Cluster it looks again every 10 ms, doubling to
 * 200 ms.  A memory store does not wait.  Thread-safe.
 * @return : as engram_table_open(); -ETIMEDOUT when the time is up (naming
 *           the process that is writing the table, if one is); -ENOENT
 *           if the namespace directory is removed meanwhile. */
ENGRAM_API int engram_table_open_wait(engram_store *st, const char *name, int timeout_ms,
                                      engram_table_id *id);

/* engram_table_info.kind */
#define ENGRAM_TABLE_FILE 1  /* a table file of the namespace */
#define ENGRAM_TABLE_BOUND 2 /* caller memory (engram_bind) */
#define ENGRAM_TABLE_SAFETENSORS 3 /* tensors of a safetensors checkpoint
                                    * (engram_open_safetensors) */
#define ENGRAM_TABLE_SOURCE 4 /* rows served by the caller's code (engram_add_source) */

typedef struct engram_table_info {
    uint32_t size; /* sizeof(engram_table_info) */
    uint32_t kind; /* ENGRAM_TABLE_* */
    engram_table_spec spec; /* row_pitch is never 0 here */
    uint64_t data_offset;   /* byte offset of row 0 in the file (FILE only) */
    uint64_t data_size;     /* num_rows * row_pitch */
    uint64_t checksum;      /* XXH3-64 of the data as recorded in the header (FILE only) */
    uint64_t created_ns;    /* creation time, ns since the Unix epoch (FILE only) */
    /* The following are 0 until the table is opened in this store. */
    int mapped;             /* 1 once mapped (or bound) in this process */
    int private_copy;       /* 1 if served from a private (huge-page) copy */
    uint64_t resident_bytes; /* bytes of the table memory resident, from /proc/self/smaps */
    uint64_t huge_bytes;     /* of which backed by huge pages */
    uint64_t map_minor_faults, map_major_faults; /* page faults taken while mapping/prefaulting */
    uint64_t lookups;        /* lookup columns that read this table (a table named by
                              * k columns of one lookup counts k) */
    uint64_t rows;           /* rows copied from this table (dead ids excluded) */
    uint64_t bytes;          /* bytes copied from this table */
    /* Row ranges.  A table that holds a range of a larger tensor (a TP
     * rank's shard of a checkpoint tensor, one head of a layer's
     * concatenated heads) says so here: its row i is global row
     * row_start + i of a tensor of total_rows rows.  Look it up with offsets[k] = row_start to use
     * global ids.  total_rows is 0 when no range is known (the table was
     * written without one; row_start is then 0 too).  Recorded in the file
     * by engram_writer_set_range(); set for safetensors tables from their
     * [row_start, row_end) and the tensor's N. */
    uint64_t row_start;      /* global row of the table's row 0 */
    uint64_t total_rows;     /* rows of the full tensor; 0 = no range known */
    /* Came with origins.  A table pulled from a remote namespace
     * (engram_pull()) records where from: its store, namespace and the
     * publication's epoch.  A table of a remote namespace reports its
     * own, so the two compare (engram_check_origin()).  Kind
     * ENGRAM_ORIGIN_NONE otherwise. */
    engram_origin origin;
} engram_table_info;

#define ENGRAM_TABLE_INFO_INIT {sizeof(engram_table_info), 0u, {0, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, {0u, 0u, {0}, {0}}}

/*! engram_get_table_info() :
 * Fills *info about table `name` (stored or bound) without mapping it.
 * info->size must be sizeof(engram_table_info).  Thread-safe.
 * @return : 0, -ENOENT, ENGRAM_ECORRUPT, ... */
ENGRAM_API int engram_get_table_info(engram_store *st, const char *name, engram_table_info *info);

/* Who holds a table file's memory (engram_get_table_usage()). */
typedef struct engram_table_usage {
    uint32_t size;            /* sizeof(engram_table_usage) */
    uint32_t processes;       /* processes that map the file, this one included */
    uint32_t unreadable;      /* processes whose maps this one may not read (not counted) */
    uint32_t sampled_pages;   /* resident pages sampled for the cgroup (0: unknown) */
    uint32_t cgroup_pages;    /* of which charged to `cgroup` */
    uint32_t unreadable_may_map; /* 1: the `unreadable` processes may map resident pages of
                                  * the file (their shares are missing from the PSS below);
                                  * 0: there are none, or they were shown to map none */
    uint64_t file_bytes;      /* bytes the file holds in its file system (its blocks) */
    uint64_t rss_bytes;       /* this process: bytes of the file resident in its mappings */
    uint64_t pss_bytes;       /* this process: its proportional share of them (PSS) */
    uint64_t total_pss_bytes; /* the PSS of all the processes counted: the resident bytes
                               * they map between them, each page once */
    char cgroup[256];         /* the memory cgroup most sampled pages are charged to
                               * (a directory of the cgroup file system), or "" */
} engram_table_usage;

#define ENGRAM_TABLE_USAGE_INIT {sizeof(engram_table_usage), 0, 0, 0, 0, 0, 0, 0, 0, 0, ""}

/*! engram_get_table_usage() :
 * Fills *u with who holds the memory of table file `name` (it need not
 * be open): the processes that map it and their shares (from
 * /proc/<pid>/maps and smaps; other users' processes are counted in
 * `unreadable` unless this process may read them, and so are some a
 * container keeps from its own root, such as its PID 1), and the memory
 * cgroup its pages are charged to.  When some process could not be read,
 * a second pass tells whether it may map the file (`unreadable_may_map`).
 * PSS splits each resident page among the mappings that map it, so when
 * the readable processes' PSS adds up to the file's resident bytes
 * (mincore(); within smaps' rounding, a kB per mapping) the unreadable
 * ones map none of them: `unreadable_may_map` is 0.  Failing that, this
 * process maps the file's resident pages for a moment (only those; none
 * is faulted in), so that each is mapped by someone, and reads the PSS
 * of that mapping and of the readable processes' again: if they add up
 * to the resident bytes, 0.  It is 1 when they fall short, and when the
 * check cannot tell (a process mapped the file or read new pages of it
 * meanwhile; a tmpfs with huge pages).  A process that maps the file
 * without having read any of it holds none of its memory and is not told
 * apart.  The pass costs a mincore() over the file (some 20-40 ms a GiB)
 * and, when that is not enough, a page-table entry per resident page
 * here and a walk of each mapper's mapping (some 0.2-0.3 s a GiB); none
 * when every process could be read.  The kernel charges a tmpfs page to the
 * cgroup of the process that first wrote or read it, for as long as the
 * file exists, whoever maps it later; the cgroup is found from a sample
 * of resident pages (/proc/self/pagemap and /proc/kpagecgroup, which need
 * CAP_SYS_ADMIN: without it, or when no page is resident, `cgroup` is ""
 * and sampled_pages 0).  Walks /proc: milliseconds (plus the pass above),
 * not for a hot path.  u->size must be set.  Thread-safe.
 * @return : 0, -ENOENT, -EINVAL, ENGRAM_EUNSAFE, ... */
ENGRAM_API int engram_get_table_usage(engram_store *st, const char *name,
                                      engram_table_usage *u);

/*! engram_list() :
 * Lists the names of the store's tables (stored and bound), sorted.
 * *names is one allocation (the array and the strings) to release with
 * engram_free(); *count is its length.  Thread-safe.
 * @return : 0 or a negative code. */
ENGRAM_API int engram_list(engram_store *st, char ***names, size_t *count);

/*! engram_free() : releases memory returned by the library.  Accepts NULL. */
ENGRAM_API void engram_free(void *p);

/*! engram_remove() :
 * Unpublishes table `name`: its file is unlinked (the name is free again at
 * once) and later lookups of its id fail with ENGRAM_EREMOVED.  The store's
 * own mapping, file and row cache are released as soon as no lookup that
 * was running can still read them: at once when none runs, else after
 * waiting up to 50 ms for them, else by a later engram_remove(),
 * engram_table_open() or engram_store_stats() (stats count what is still
 * held).  A table whose memory engram_table_memory() gave out stays
 * mapped until engram_store_close().  Other processes keep their
 * mappings.  Thread-safe, also while lookups of the table run.
 * @return : 0, -ENOENT, ENGRAM_EBOUND (bound tables cannot be removed). */
ENGRAM_API int engram_remove(engram_store *st, const char *name);

/*! Progress callback for long operations: `done` of `total` bytes. Return
 * nonzero to cancel (the operation then fails with -ECANCELED). */
typedef int (*engram_progress_fn)(void *ud, uint64_t done, uint64_t total);

/*! engram_verify() :
 * Re-reads table `name`'s file and checks its header and data checksum
 * (a table of a Redis Cluster: its chunks against the manifest's
 * checksums, read in pipelined batches).  `progress` may be NULL; it is
 * called on the calling thread.  Thread-safe.
 * @return : 0, ENGRAM_ECHECKSUM, ENGRAM_ECORRUPT, -ENOENT, ... */
ENGRAM_API int engram_verify(engram_store *st, const char *name, engram_progress_fn progress,
                             void *ud);

/*! engram_pull() :
 * Copies table `name` of `from`, a store opened on a remote namespace
 * (engram_store_open_redis()), into the namespace of `to`, a store
 * opened on a directory (engram_store_open()), as a table of the same
 * name, to be served from local memory or disk from then on.  The rows
 * are read whole in large pipelined batches (every server at once), each
 * chunk checked against the remote's checksums as it arrives and all of
 * them before publication; the table is written as any table is: its
 * capacity checked before the first byte, create-only and atomic, so a
 * reader never sees a half-pulled table and a killed pull leaves nothing
 * visible (run it again).  The ranks of a node may all pull the same
 * table without a leader: one reads the remote's rows, the others wait
 * for it (for as long as its temporary file is being written, giving up
 * with -ETIMEDOUT after ENGRAM_SHARED_WAIT_MS without a write) and reuse
 * its table, and a table already there with the remote's spec and
 * checksum is reused without reading the remote's rows.  `progress` (may
 * be NULL) gets the bytes read and the table's bytes, on the calling
 * thread; nonzero cancels.
 * *written (may be NULL) is 1 when this call wrote the table, 0 when it
 * reused it.  Thread-safe.
 * @return : 0; ENGRAM_EMISMATCH (`to` holds another table of that name);
 *           ENGRAM_ECHECKSUM or -ENODATA (the remote's data is damaged:
 *           nothing is published); -ENOENT (no such remote table);
 *           ENGRAM_ESPEC (a bad name); -ENOSPC; -ETIMEDOUT; -ECANCELED;
 *           -EINVAL (`from` is not a remote store or `to` has no
 *           directory); or as the remote's reads and engram_writer_begin()
 *           fail. */
ENGRAM_API int engram_pull(engram_store *to, engram_store *from, const char *name,
                           engram_progress_fn progress, void *ud, int *written);

/* engram_check_origin()'s *state */
#define ENGRAM_ORIGIN_CURRENT 0     /* the remote still publishes the same publication */
#define ENGRAM_ORIGIN_REPUBLISHED 1 /* published again since, with the same rows */
#define ENGRAM_ORIGIN_CHANGED 2     /* published again since, with other rows */
#define ENGRAM_ORIGIN_GONE 3        /* no longer in the remote namespace */

/*! engram_check_origin() :
 * Compares table `name` of `local` (a table pulled from a remote
 * namespace, which records its origin) with the table of that name in
 * `remote`, a store opened on the namespace it came from, and sets
 * *state to one of ENGRAM_ORIGIN_CURRENT, _REPUBLISHED, _CHANGED or
 * _GONE.  The origin records the namespace's name, not the cluster nor
 * the key prefix (engram_redis_options.prefix): open `remote` on the
 * cluster, and with the prefix, the table was pulled from; another
 * namespace of the same name is compared as if it were that one.  It
 * reads the remote's manifest only, not its rows, and does not check the
 * local rows either: engram_verify() does that.  (A local table
 * with a row pitch, which a copy made by other means may have, is read
 * once to hash its rows packed, as the remote's checksum is.)  Thread-safe.
 * @return : 0 and *state; -EINVAL (a NULL argument, `remote` not a store
 *           of a remote namespace, or not the kind and namespace the
 *           table came from, or the local table records no origin);
 *           -ENOENT (no local table `name`); ENGRAM_ESPEC (a bad name); or
 *           as the remote's reads fail. */
ENGRAM_API int engram_check_origin(engram_store *local, const char *name, engram_store *remote,
                                   int *state);

/*! engram_pull_rows() :
 * engram_pull() from a store engram has no module for: the caller's code
 * reads the rows (engramstore pulls a Mooncake Store's tables with it).
 * Table `name` of `spec` (packed: row_pitch 0 or row_bytes) is written
 * into the namespace of `to` exactly as engram_pull() writes it, with the
 * same meeting of the ranks of a node: if the name is published there,
 * ops->same(ud, rows, spec) is asked whether it holds the source's rows
 * (`rows`: its spec->num_rows rows, mapped read-only for the call only):
 * 1 keeps it, 0 fails with ENGRAM_EMISMATCH; if another process is
 * writing it, it is waited for and then compared; otherwise a writer is
 * begun (capacity checked before the first byte) and ops->fill(ud, w)
 * appends every row with engram_writer_append(w, ...) (never committing
 * or aborting w), checking them against the source's own checks before
 * it returns 0; any other answer aborts the writer and is returned, with
 * nothing published.  `from` (may be NULL) names the source in messages.
 * Both functions run on the calling thread.  *written as engram_pull().
 * @return : 0; ENGRAM_EMISMATCH; ENGRAM_ESPEC; -EINVAL (no directory
 *           namespace, or a NULL function); the answer of fill or same;
 *           or as engram_writer_begin()/engram_writer_commit() fail. */
typedef struct engram_pull_ops {
    int (*fill)(void *ud, engram_writer *w);
    int (*same)(void *ud, const void *rows, const engram_table_spec *spec);
} engram_pull_ops;
ENGRAM_API int engram_pull_rows(engram_store *to, const char *name, const engram_table_spec *spec,
                                const char *from, const engram_pull_ops *ops, void *ud,
                                int *written);

/* ------------------------------------------------------------------------
 * Lookup.
 *
 * Gathers rows for a [T, K] batch of ids: column k reads table
 * tables[k] (ids may repeat), row id = ids[t][k] - offsets[k], and the
 * row_bytes bytes of that row go to out + t * out_stride_t + k * out_stride_k.
 * Every table of one lookup must have the same row_bytes.  An id equal to
 * ENGRAM_DEAD_ID (-1, before the offset is applied) leaves its output row
 * untouched, or zero-fills it with ENGRAM_LOOKUP_ZERO_DEAD.  Any other id
 * outside [0, num_rows) after the offset is an error.  The difference
 * ids[t][k] - offsets[k] is exact for every int64 id and offset, never
 * taken modulo 2^64: id INT64_MIN with offset INT64_MAX is 2^64 - 1 below
 * the table, not its row 1.
 *
 * Everything is validated before the first byte is written: on any
 * validation error the output is untouched and engram_errmsg() names the
 * position and value.  Only a table behind the row cache can fail after
 * that, when a read fails (see "the row cache" below): rows already copied
 * then hold their correct bytes, and the failed rows are untouched.
 * The output rows must not overlap each other (checked), nor the ids or a
 * table (not checked).  T == 0 or K == 0 is a no-op.
 */
#define ENGRAM_DEAD_ID (-1)

#define ENGRAM_ID_INT32 1
#define ENGRAM_ID_INT64 2

#define ENGRAM_LOOKUP_ZERO_DEAD 0x0001u /* zero-fill rows whose id is ENGRAM_DEAD_ID */

typedef struct engram_lookup_args {
    uint32_t size;                 /* sizeof(engram_lookup_args) */
    uint32_t flags;                /* ENGRAM_LOOKUP_*; any other bit is -EINVAL */
    size_t num_tokens;             /* T */
    size_t num_cols;               /* K */
    const engram_table_id *tables; /* [K] ids from engram_table_open() */
    const int64_t *offsets;        /* [K] or NULL (all 0) */
    const void *ids;               /* T x K ids of id_type */
    int id_type;                   /* ENGRAM_ID_INT32 or ENGRAM_ID_INT64 */
    ptrdiff_t id_stride_t;         /* in elements; 0 with id_stride_k 0 = contiguous [T,K] */
    ptrdiff_t id_stride_k;         /* in elements */
    void *out;                     /* output base */
    ptrdiff_t out_stride_t;        /* in bytes; 0 with out_stride_k 0 = contiguous [T,K,R] */
    ptrdiff_t out_stride_k;        /* in bytes */
    size_t row_bytes;              /* bytes per output row as the caller sized it: a table
                                    * whose row_bytes differs is ENGRAM_ELAYOUT; 0 = take
                                    * the tables' row_bytes unchecked */
} engram_lookup_args;

#define ENGRAM_LOOKUP_ARGS_INIT {sizeof(engram_lookup_args), 0u, 0, 0, NULL, NULL, NULL, 0, 0, 0, NULL, 0, 0, 0}

/*! engram_lookup() :
 * Performs one lookup (see above).  Thread-safe: any number of threads may
 * look up on one store at once.  Lookups of memory-resident tables take
 * no lock (tables behind the row cache take a short lock per cache set
 * and, for their misses, one of the store's read rings, and the periodic
 * cache stats line takes the store's lock once per interval); batches
 * from the parallel threshold up are split across the store's gather
 * threads when they are free.  Allocates nothing up to 256 rows; above that the plan (8 bytes a
 * row) lives in a per-thread buffer that grows once and is kept for the
 * thread's later lookups (-ENOMEM if it cannot grow).
 * @return : 0, ENGRAM_EBADID, ENGRAM_ELAYOUT, ENGRAM_EREMOVED, -EINVAL,
 *           -ENOMEM; for row cache tables also -EIO (or another -errno of
 *           a read) and ENGRAM_ECORRUPT (a file truncated under us). */
ENGRAM_API int engram_lookup(engram_store *st, const engram_lookup_args *args);

/* The first bad id of a lookup that failed with ENGRAM_EBADID, as numbers
 * (the id engram_errmsg() names in words). */
typedef struct engram_bad_id {
    uint32_t size;         /* sizeof(engram_bad_id) */
    engram_table_id table; /* tables[k] */
    uint64_t token;        /* t */
    uint64_t col;          /* k */
    int64_t id;            /* ids[t][k] as passed */
    int64_t offset;        /* offsets[k] (0 without offsets) */
    uint64_t num_rows;     /* rows of the table */
} engram_bad_id;

#define ENGRAM_BAD_ID_INIT {sizeof(engram_bad_id), 0u, 0, 0, 0, 0, 0}

/*! engram_last_bad_id() :
 * After engram_lookup() returned ENGRAM_EBADID on this thread, fills *bad
 * with that lookup's first bad id (thread-local, like engram_errmsg(): any
 * later failing call on the thread replaces it).  Lets a caller point at
 * the id without parsing the message.
 * @return : 0, -ENOENT if the thread's last failure was not a bad id, or
 *           -EINVAL if bad is NULL or bad->size is not sizeof *bad. */
ENGRAM_API int engram_last_bad_id(engram_bad_id *bad);

/* ------------------------------------------------------------------------
 * Lookups ahead of time.
 *
 * An engine knows its ids before it needs the rows (every Engram layer's
 * ids at the start of a forward pass): it submits each lookup at once and
 * waits for it where the rows are needed, so that reading (from files, a
 * Redis Cluster, a caller's source) overlaps the model's work.  Submitted
 * lookups run on the store's lookup threads (as many as its gather
 * threads, at least one; started with the first submit), in the order
 * they were submitted.
 */
typedef struct engram_pending engram_pending;

/*! engram_lookup_submit() :
 * Starts lookup `args` (as engram_lookup() would run it) and returns at
 * once with *out, the pending lookup, which the caller must hand to
 * engram_lookup_wait() or engram_lookup_cancel() exactly once.  args and
 * its tables and offsets arrays are copied; the ids and the output it
 * points to must stay valid, and the output untouched by the caller, until
 * then.  Thread-safe.  engram_store_close() cancels the lookups no thread
 * has started (their wait returns ENGRAM_ESTATE) and waits for the running
 * ones; a pending lookup may be waited for after its store is closed.
 * After fork() a child submits on its own threads; lookups its parent
 * submitted are the parent's (in the child, waiting for or cancelling one
 * fails at once with ENGRAM_ESTATE).
 * @return : 0, -EINVAL (bad arguments), -EAGAIN (no thread could be
 *           started), -ENOMEM.  The lookup's own errors come at the wait. */
ENGRAM_API int engram_lookup_submit(engram_store *st, const engram_lookup_args *args,
                                    engram_pending **out);

/*! engram_lookup_wait() :
 * Waits for pending lookup `p` to finish and frees it.  Its failure
 * becomes this thread's: engram_errmsg() and engram_last_bad_id() say
 * what engram_lookup() would have said.  Thread-safe (one call per p).
 * @return : the lookup's result (0, or what engram_lookup() returns), or
 *           ENGRAM_ESTATE (its store was closed before it ran, or another
 *           process submitted it: a parent, before fork()), -EINVAL. */
ENGRAM_API int engram_lookup_wait(engram_pending *p);

/*! engram_lookup_cancel() :
 * Cancels pending lookup `p` if no thread has started it (the output is
 * then untouched), else waits for it, and frees it.
 * @return : -ECANCELED (cancelled before it ran), else as
 *           engram_lookup_wait(). */
ENGRAM_API int engram_lookup_cancel(engram_pending *p);

/*! engram_lookup_done() :
 * @return : 1 if a wait on `p` would not block, 0 if it would, -EINVAL.
 *           Never blocks, frees nothing. */
ENGRAM_API int engram_lookup_done(const engram_pending *p);

/* ------------------------------------------------------------------------
 * Tables larger than memory: the row cache.
 *
 * With ENGRAM_OPEN_FILE_CACHE, a store serves its table files without
 * mapping them, and engram_open_safetensors() serves tensors of a
 * checkpoint the same way.  A lookup first looks each row up in the
 * store's row cache; the rows it misses are read from the file with
 * io_uring, up to queue_depth reads in flight, each distinct row of the
 * lookup once (of each ENGRAM_SOURCE_MAX_REQS positions: a longer lookup
 * is served that many positions at a time, and a row asked for again in a
 * later part is read again unless the cache kept it).  Rows read are
 * copied to the output and offered to the
 * cache, which keeps them while it has room.  Once full, it keeps a row
 * only if it was asked for at least twice lately (in this lookup or
 * earlier ones: a count of the misses of each row that decays over time),
 * and then evicts one by CLOCK within the row's set.  Rows asked for once
 * in a while, the long tail of Engram's Zipf-like ids, thus stop evicting
 * the rows asked for again; a row read but not kept counts in not_kept.
 *
 * The cache is exact: a row is visible in it only once all its bytes have
 * been read and checked, so a lookup never returns stale or partial bytes.
 * It is set-associative (ENGRAM_CACHE_WAYS rows per set, CLOCK replacement
 * within a set, a short lock per set, no global lock).  The counts of
 * missed rows take 8 bytes a slot (a word a slot, rounded up to a
 * 64-byte block), within the table's share.
 *
 * The budget, cache_bytes, bounds all the memory the row cache and its
 * reads hold.  The reader's staging (each read in flight lands in a
 * staging slot first, so a failed read never touches the output) has an
 * eighth of it, and at least the slots of one row's reads: the store then
 * reads with fewer rings or fewer reads in flight rather than exceed it.
 * The rest is shared by the tables with a cache: each file or
 * safetensors table gets a share proportional to its size among the
 * namespace's table files and the safetensors tables opened so far, a
 * source table (engram_add_source) the cache_bytes it asked for, each
 * capped by what the tables opened before it left.  A share smaller than
 * one set (ENGRAM_CACHE_WAYS rows) gives no slots: that table's rows are
 * read every time.  A table one of whose rows cannot be staged within the
 * budget is refused with -ENOBUFS.
 *
 * Reads use O_DIRECT where the file system reports direct I/O alignment
 * (statx STATX_DIOALIGN; ext4, xfs, ...) and a probe read succeeds;
 * elsewhere (tmpfs and ramfs, which have no device to bypass, or a probe
 * that fails) plain buffered reads.  Which one a table got is in
 * engram_get_cache_stats().direct_tables.  Where io_uring cannot be set
 * up (disabled by sysctl or seccomp, a small RLIMIT_MEMLOCK on older
 * kernels, ...), the same reads run one pread at a time.  With
 * ENGRAM_OPEN_PREFAULT the cache memory is touched when a table is opened.
 *
 * Validation, ids, offsets, strides and errors are those of every lookup.
 * A short read is completed by a read of the rest, and a read failing with
 * -EAGAIN, -EINTR or -ECANCELED (io_uring's answers to a signal that
 * interrupted the reading thread) is retried, 16 times at most.  A read
 * that fails otherwise, or reaches the end of the file before the row's
 * end (a file truncated under us), fails the lookup with -EIO (or the
 * error) or ENGRAM_ECORRUPT; such a row is neither written to the output
 * nor cached.  Rows of the lookup that were
 * copied before the failure hold their correct bytes.
 */
#define ENGRAM_CACHE_WAYS 7

typedef struct engram_cache_stats {
    uint32_t size;          /* sizeof(engram_cache_stats) */
    uint32_t ways;          /* rows per set (ENGRAM_CACHE_WAYS) */
    uint64_t tables;        /* tables read through a source open (files, safetensors,
                             * engram_add_source), with or without slots */
    uint64_t direct_tables; /* of which read with O_DIRECT (all their files) */
    uint64_t hits;          /* rows found in the cache */
    uint64_t misses;        /* rows not found: each is read, or shares the read of a
                             * duplicate id of the same lookup */
    uint64_t dedup;         /* of the misses, rows served by another row's read */
    uint64_t reads;         /* read requests issued (one per distinct missed row and
                             * file region: two for a weight + scale row; more
                             * where a read is retried or completed) */
    uint64_t bytes_read;    /* bytes transferred by those reads (O_DIRECT reads whole
                             * aligned blocks) */
    uint64_t read_errors;   /* reads that failed or came back short */
    uint64_t cache_bytes;   /* bytes of row slots allocated (plus their set tags and
                             * the admission filter's counts) */
    uint64_t slots;         /* row slots (sets x ways) */
    uint64_t budget_bytes;  /* the store's cache_bytes */
    uint32_t queue_depth;   /* reads in flight per lookup at most */
    uint32_t reserved;      /* 0 */
    uint64_t staging_bytes; /* the reader's staging reserved from budget_bytes (store-wide:
                             * the same for every table) */
    uint64_t not_kept;      /* rows read but not kept: their set was full and they had
                             * not been asked for often enough lately to evict a row */
} engram_cache_stats;

#define ENGRAM_CACHE_STATS_INIT {sizeof(engram_cache_stats), 0u, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0u, 0u, 0, 0}

/*! engram_get_cache_stats() :
 * Fills *stats (stats->size must be set) with the row cache counters of
 * table `name`, or of all the store's tables read through a source (files
 * with ENGRAM_OPEN_FILE_CACHE, safetensors, engram_add_source) when name
 * is NULL.  A store without any gives zeros (and budget_bytes,
 * queue_depth, staging_bytes).  Counters are summed without stopping
 * lookups and without taking the store's lock.  Thread-safe.
 * @return : 0, -EINVAL, or -ENOENT / ENGRAM_ESPEC for a name that is not
 *           an open table read through a source. */
ENGRAM_API int engram_get_cache_stats(engram_store *st, const char *name,
                                      engram_cache_stats *stats);

/* ------------------------------------------------------------------------
 * Tables served by your own code: sources.
 *
 * A source serves a table whose rows the library cannot address: a
 * distributed key-value store, a custom file format, a remote service.
 * engram_add_source() adds such a table to a store.  Lookups validate its
 * ids like any other (nothing reaches the source before every id of the
 * lookup is checked), then hand the source the rows they need:
 *
 *     int read_rows(void *ctx, engram_source_req *reqs, size_t n);
 *
 *  - One call per lookup carries every row the lookup needs from tables
 *    added with the same read_rows function and the same ctx, whatever
 *    their columns (a source serving several tables gets them together);
 *    reqs[i].table and reqs[i].table_ud say which table a row is of.  A
 *    lookup with more than ENGRAM_SOURCE_MAX_REQS positions of row-source
 *    tables is served that many positions at a time, with a call each.
 *  - Deduplicated: a (table, row) pair appears once per call, however
 *    often the lookup asks for it; the library copies it to the other
 *    positions.  Rows found in the table's row cache are not asked for.
 *  - reqs[i].row is < the table's num_rows; reqs[i].dst is one of the
 *    lookup's output rows, with room for row_bytes bytes.  The source may
 *    serve the requests in any order.
 *  - It returns 0 once it wrote every row, or a negative code (a negated
 *    errno such as -EIO, or an ENGRAM_E* code) that fails the lookup with
 *    that code; engram_source_error() attaches a message.  On failure, the
 *    source sets reqs[i].done = 1 for each row it did write in full with
 *    its correct bytes (done is 0 on entry): those rows are used (copied
 *    to their other positions and cached).  Every other row counts as not
 *    read: its output rows are untouched and nothing of it is cached, so a
 *    source must write a row's dst only with the row's final bytes.
 *  - It is called from every thread that looks up, concurrently, and from
 *    libengram_cuda's host-function thread: it must be thread-safe.  It
 *    must not look up in, remove from or close any engram store from
 *    inside the call (a lookup there fails with ENGRAM_ESTATE).
 *
 * With cache_bytes > 0 the table gets a row cache of that many bytes, taken
 * from the store's cache_bytes budget (less if less is left): bounded,
 * exact (a row is cached only once read_rows wrote it), set-associative,
 * as described above ("Tables larger than memory").  engram_get_cache_stats()
 * counts source tables, cached or not: hits, misses and dedup as for files,
 * reads = rows handed to read_rows, bytes_read = the bytes of those it
 * wrote, read_errors = rows a failed call left unwritten.
 */
#define ENGRAM_SOURCE_MAX_REQS 65536

typedef struct engram_source_req {
    uint64_t row;          /* in: the row of the table (validated: < num_rows) */
    void *dst;             /* in: where its row_bytes bytes go */
    void *table_ud;        /* in: the table's table_ud from engram_add_source() */
    engram_table_id table; /* in: the table */
    int done;              /* out, read only after a failed call: 1 = dst holds the row */
} engram_source_req;

typedef struct engram_source_ops {
    uint32_t size;  /* sizeof(engram_source_ops) */
    uint32_t flags; /* 0 (reserved) */
    void *ctx;      /* passed to every call: what the source's tables share */
    /* Reads rows (see above).  Required. */
    int (*read_rows)(void *ctx, engram_source_req *reqs, size_t n);
    /* Called once per table at engram_store_close(), when no lookup can
     * reach it any more: the table's table_ud is no longer used.  May be
     * NULL. */
    void (*release)(void *ctx, void *table_ud);
} engram_source_ops;

#define ENGRAM_SOURCE_OPS_INIT {sizeof(engram_source_ops), 0u, NULL, NULL, NULL}

/*! engram_add_source() :
 * Adds table `name` with `spec` to store `st`, served by `ops` (copied:
 * the struct need not outlive the call; ctx and table_ud must stay valid
 * until release).  `table_ud` is handed back with each of the table's
 * requests.  `cache_bytes` > 0 puts a row cache of up to that many bytes
 * in front of the source (see above); 0 reads every row from the source.
 * The name must be free in the store and its namespace (-EEXIST
 * otherwise).  The table is not stored anywhere: it lives until the store
 * is closed (engram_remove() refuses it with ENGRAM_EBOUND).  On failure
 * nothing is kept and release is not called.  Thread-safe.
 * @return : 0 and *id (id may be NULL), -EEXIST, ENGRAM_ESPEC, -EINVAL (ops
 *           NULL or without read_rows, ops->size or flags wrong; with a
 *           cache, a store queue_depth above 4096), -ENOMEM, -ENOSPC (the
 *           store holds 65536 tables), or with a cache and
 *           ENGRAM_OPEN_MLOCK the error of mlock. */
ENGRAM_API int engram_add_source(engram_store *st, const char *name,
                                 const engram_table_spec *spec, const engram_source_ops *ops,
                                 void *table_ud, uint64_t cache_bytes, engram_table_id *id);

/*! engram_source_error() :
 * For read_rows: records `fmt` as the detail of failure `code` on the
 * calling thread, which the failed lookup's engram_errmsg() then reports
 * after the table's name.  Returns `code`, so a source can
 * `return engram_source_error(-EIO, "node %s timed out", host);`. */
ENGRAM_API int engram_source_error(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ------------------------------------------------------------------------
 * Safetensors checkpoints: their tensors as tables, and what they hold.
 */
/*! engram_open_safetensors() :
 * Serves rows of a safetensors checkpoint as table `name` of store `st`,
 * through the store's row cache, without copying the checkpoint.
 * `path` is a .safetensors file, or a model.safetensors.index.json whose
 * weight_map names the shard (in the same directory) holding each tensor.
 * `weight` names a 2-D tensor [N, A]; `scale`, if not NULL, a 2-D tensor
 * [N, B] with the same N (e.g. [N, 256] F8_E4M3 weights and [N, 8] F8_E8M0
 * block scales).  Row i of the table is row row_start + i of `weight`
 * followed by the same row of `scale`, packed: row_bytes = A * size +
 * B * size (264 for the example).  [row_start, row_end) selects a shard of
 * the rows (a TP rank's range); row_end 0 means N.  The table's info
 * reports the range (engram_table_info.row_start = row_start, total_rows =
 * N): look it up with offsets[k] = row_start to use global ids.
 *
 * Dtypes: any of BOOL U8 I8 F8_E4M3 F8_E5M2 F8_E8M0 U16 I16 F16 BF16 U32
 * I32 F32 U64 I64 F64; bytes are served as stored (little-endian).
 *
 * The header is parsed with a JSON parser and checked before use: its
 * length (at most 100 MiB and within the file), every tensor's dtype,
 * shape and data_offsets (size = product of the shape x dtype size, no
 * overlap, no hole, within the file), duplicate names.  The files are
 * opened read-only with O_NOFOLLOW (a link is refused) and must be regular
 * files.  The checkpoint must not change while served.  A tensor name that
 * is not found gets the closest name of the file or index suggested in
 * engram_errmsg() ("did you mean ...?") when one is within a few edits.
 * Thread-safe.
 * @return : 0 and *id (may be NULL), -ENOENT (file or tensor missing),
 *           ENGRAM_ECORRUPT (a bad header), ENGRAM_ESPEC (a bad name, shape,
 *           dtype or row range), -EEXIST, ENGRAM_EUNSAFE (a link), -errno. */
ENGRAM_API int engram_open_safetensors(engram_store *st, const char *name, const char *path,
                                       const char *weight, const char *scale, uint64_t row_start,
                                       uint64_t row_end, engram_table_id *id);

/* A tensor of a safetensors file, as described by its header. */
typedef struct engram_tensor_info {
    uint32_t size;      /* sizeof(engram_tensor_info) */
    uint32_t ndim;      /* 0 .. ENGRAM_TENSOR_MAX_DIMS */
    char dtype[16];     /* "F8_E4M3", "BF16", ... */
    uint32_t elem_size; /* bytes per element */
    uint32_t reserved;  /* 0 */
    uint64_t shape[8];  /* shape[0 .. ndim) */
    uint64_t offset;    /* byte offset of the tensor's data in the file */
    uint64_t nbytes;    /* bytes of data */
    char shard[256];    /* with an index file: the shard holding the tensor (a file name in
                         * the index's directory); else "" */
} engram_tensor_info;

#define ENGRAM_TENSOR_MAX_DIMS 8
#define ENGRAM_TENSOR_INFO_INIT {sizeof(engram_tensor_info), 0u, {0}, 0u, 0u, {0}, 0, 0, {0}}

/*! engram_safetensors_tensor() :
 * Reads and validates the header of safetensors file `path` (or, for a
 * model.safetensors.index.json, of the shard its weight_map names) and
 * describes tensor `tensor` in *info (info->size must be set); offset is
 * then within the shard.  Same checks as engram_open_safetensors().
 * Thread-safe.
 * @return : 0, -ENOENT (no such file or tensor), ENGRAM_ECORRUPT,
 *           ENGRAM_EUNSAFE, -errno. */
ENGRAM_API int engram_safetensors_tensor(const char *path, const char *tensor,
                                         engram_tensor_info *info);

/* Called by engram_safetensors_list() once per tensor: `name` and `info`
 * are valid only during the call.  A nonzero return stops the listing,
 * which then returns that value. */
typedef int (*engram_tensor_fn)(void *ud, const char *name, const engram_tensor_info *info);

/*! engram_safetensors_list() :
 * Lists the tensors of a checkpoint: calls fn(ud, name, info) for each
 * tensor of safetensors file `path` (in file order, info->shard ""), or,
 * for a model.safetensors.index.json, for each tensor of its weight_map,
 * described from its shard (shard by shard in name order, and by name
 * within a shard; info->shard names it, info->offset is within it).  Each
 * file's header is read once and gets the same checks as in
 * engram_open_safetensors(); a tensor the index puts in a shard that lacks
 * it is ENGRAM_ECORRUPT.  For tools that show a checkpoint or find the
 * tensors of every layer.  Thread-safe.
 * @return : 0, fn's nonzero value, -ENOENT (a file missing),
 *           ENGRAM_ECORRUPT, ENGRAM_EUNSAFE, -EINVAL (path or fn NULL),
 *           -errno. */
ENGRAM_API int engram_safetensors_list(const char *path, engram_tensor_fn fn, void *ud);

/*! engram_safetensors_tensor_fd() :
 * As engram_safetensors_tensor(), for the safetensors file (not an index)
 * open on descriptor `fd`: for a caller that reads the tensor's bytes
 * itself, from the very file whose header was checked.  Opening the path
 * again after engram_safetensors_tensor() could open another file (the
 * path swapped meanwhile); open it once instead, read-only with
 * O_NOFOLLOW | O_NONBLOCK (so that a link is refused and a FIFO cannot
 * block the open), and pass the descriptor here.  The file must be a
 * regular file that others cannot write (ENGRAM_EUNSAFE otherwise); its
 * header gets the same checks as engram_open_safetensors(); info->shard is
 * "".  The descriptor is read with pread (its offset does not move) and
 * stays open, the caller's.  `what` names the file in messages (NULL:
 * "descriptor N").  Thread-safe.
 * @return : 0, -ENOENT (no such tensor), ENGRAM_ECORRUPT, ENGRAM_EUNSAFE,
 *           -EINVAL, -errno. */
ENGRAM_API int engram_safetensors_tensor_fd(int fd, const char *what, const char *tensor,
                                            engram_tensor_info *info);

/* ------------------------------------------------------------------------
 * Tokens to rows: the Engram n-gram hash.
 *
 * An Engram layer reads, for each position of a request, one row per hash
 * column: the column's n-gram of compressed token ids, hashed into the
 * column's prime-sized range of the layer's table.  engram computes those
 * ids exactly as the released models do (DeepSeek-V4.1, vLLM's reference),
 * so an engine hands tokens and gets rows (docs/ngram.md):
 *
 *  - A layout (engram_ngram_layout_create) fixes, per layer, the columns'
 *    primes, their offsets (exclusive prefix sums: column c of the layer's
 *    one table starts at offsets[c]) and the multipliers.  C = (N-1) * H
 *    columns per layer: column c = (n-2) * H + h for n-gram order n =
 *    2..N and head h.  Primes: for each layer in order, for each order,
 *    starting at vocab_size - 1 again, each head takes the smallest prime
 *    above the previous one that no column of any layer has taken yet.
 *    Multipliers: numpy.random.default_rng(10007 * layer_id).integers(0,
 *    max(1, (INT64_MAX // compressed_vocab) // 2), N) * 2 + 1, reproduced
 *    bit for bit.  Either may be given instead.
 *  - A hasher (engram_ngram_hasher_create) adds an optional token map
 *    (raw token id -> compressed id, engramstore.build_token_map()).
 *  - For position p of a request (p counts from its first token; its ids
 *    c[], DEAD = -1 for a token that takes no part), for each layer:
 *        blocked = 0; rolling = 0
 *        for s in 0 .. N-1:
 *            blocked |= p - s < 0 or c[p - s] == DEAD
 *            rolling ^= (blocked ? pad_id : c[p - s]) * multipliers[s]
 *            if s >= 1: for h: id[(s-1) * H + h] = rolling % prime + offset
 *    No product overflows (the layout checks it), so this is exact.
 *  - A request arrives in chunks: hashing one needs the N-1 tokens before
 *    it (its history, oldest first; fewer at the start of a request).
 */
#define ENGRAM_NGRAM_MAX_N 16       /* largest max_ngram */
#define ENGRAM_NGRAM_MAX_COLS 1024  /* largest (max_ngram - 1) * heads */
#define ENGRAM_NGRAM_MAX_LAYERS 256 /* most layers in one layout */

typedef struct engram_ngram_layout engram_ngram_layout;
typedef struct engram_ngram_hasher engram_ngram_hasher;

typedef struct engram_ngram_config {
    uint32_t size;              /* sizeof(engram_ngram_config) */
    uint32_t num_layers;        /* L, 1 .. ENGRAM_NGRAM_MAX_LAYERS */
    const int64_t *layer_ids;   /* [L] the model's layer numbers, in its config's order (>= 0) */
    uint64_t vocab_size;        /* the base table size: primes are searched above it - 1 (>= 2) */
    uint32_t max_ngram;         /* N, 2 .. ENGRAM_NGRAM_MAX_N */
    uint32_t heads;             /* H per n-gram order: C = (N-1) * H <= ENGRAM_NGRAM_MAX_COLS */
    uint64_t compressed_vocab;  /* compressed token ids are below it (1 .. 2^62) */
    int64_t pad_id;             /* the compressed id hashed where a position is blocked,
                                 * in [0, compressed_vocab) */
    const uint64_t *primes;     /* NULL, or [L * C] given: each in 1 .. 2^62 */
    const int64_t *multipliers; /* NULL, or [L * N] given: each in 1 .. INT64_MAX /
                                 * (compressed_vocab - 1) */
} engram_ngram_config;

#define ENGRAM_NGRAM_CONFIG_INIT {sizeof(engram_ngram_config), 0u, NULL, 0, 0u, 0u, 0, 0, NULL, NULL}

/*! engram_ngram_layout_create() :
 * Computes the layout of `cfg` (see above): the primes (unless given),
 * offsets, multipliers (unless given) and each layer's rows.  The
 * arguments are copied.  V4.1's config (layers 1 and 14, vocab_size
 * 16,000,000, N 4, H 8, compressed_vocab 99,092) gives 384,006,168 and
 * 384,016,682 rows.  On success *out owns the layout (free it with
 * engram_ngram_layout_destroy()); it is immutable and thread-safe.
 * @return : 0, ENGRAM_ESPEC (a bad config: the message names the field),
 *           -EINVAL (NULL arguments, a bad size), -ENOMEM. */
ENGRAM_API int engram_ngram_layout_create(const engram_ngram_config *cfg,
                                          engram_ngram_layout **out);

/*! engram_ngram_layout_destroy() : frees a layout; accepts NULL.  Hashers
 * made from it keep working (they hold their own copy). */
ENGRAM_API void engram_ngram_layout_destroy(engram_ngram_layout *lay);

/* A layout's numbers.  The arrays belong to the layout and live as long
 * as it does. */
typedef struct engram_ngram_layout_info {
    uint32_t size;               /* sizeof(engram_ngram_layout_info) */
    uint32_t num_layers;         /* L */
    uint32_t max_ngram;          /* N */
    uint32_t heads;              /* H */
    uint32_t num_cols;           /* C = (N-1) * H */
    uint64_t vocab_size;
    uint64_t compressed_vocab;
    int64_t pad_id;
    const int64_t *layer_ids;    /* [L] */
    const uint64_t *primes;      /* [L * C] */
    const int64_t *offsets;      /* [L * C]: column c's first row in its layer's table */
    const int64_t *multipliers;  /* [L * N] */
    const uint64_t *num_rows;    /* [L]: rows of each layer's table (sum of its primes) */
} engram_ngram_layout_info;

#define ENGRAM_NGRAM_LAYOUT_INFO_INIT {sizeof(engram_ngram_layout_info), 0u, 0u, 0u, 0u, 0, 0, 0, NULL, NULL, NULL, NULL, NULL}

/*! engram_get_ngram_layout_info() : fills *info (info->size must be set).
 * @return : 0, -EINVAL. */
ENGRAM_API int engram_get_ngram_layout_info(const engram_ngram_layout *lay,
                                            engram_ngram_layout_info *info);

/*! engram_ngram_hasher_create() :
 * A hasher of layout `lay`, with a token map or without: token_map[t]
 * (map_len entries, copied) is the compressed id of raw token t, each in
 * [0, compressed_vocab); NULL: the tokens hashed are compressed ids
 * already.  The hasher keeps what it needs of the layout (which may be
 * destroyed after).  On success *out owns it; free it with
 * engram_ngram_hasher_destroy().  Immutable and thread-safe.
 * @return : 0, ENGRAM_ESPEC (a map entry out of range, named), -EINVAL,
 *           -ENOMEM. */
ENGRAM_API int engram_ngram_hasher_create(const engram_ngram_layout *lay, const int64_t *token_map,
                                          uint64_t map_len, engram_ngram_hasher **out);

/*! engram_ngram_hasher_destroy() : frees a hasher; accepts NULL. */
ENGRAM_API void engram_ngram_hasher_destroy(engram_ngram_hasher *h);

/* engram_ngram_hash_args.flags */
#define ENGRAM_NGRAM_LOCAL 0x0001u /* ids without the columns' offsets: each column's own row
                                    * (the layer API's per-head tables) */

typedef struct engram_ngram_hash_args {
    uint32_t size;                /* sizeof(engram_ngram_hash_args) */
    uint32_t flags;               /* ENGRAM_NGRAM_* */
    size_t num_tokens;            /* T: every request's tokens together */
    const void *tokens;           /* [T] of token_type: raw ids with a token map, else compressed
                                   * ids; -1 (DEAD) takes no part */
    int token_type;               /* ENGRAM_ID_INT32 or ENGRAM_ID_INT64 */
    size_t num_requests;          /* R: 0 or 1 = one request */
    const size_t *starts;         /* [R + 1] for R > 1: request r is tokens [starts[r],
                                   * starts[r+1]); starts[0] = 0, starts[R] = T, non-decreasing */
    const void *history;          /* the tokens before each request's chunk, oldest first, of
                                   * token_type; NULL: none (each chunk starts its request) */
    size_t history_len;           /* R <= 1: how many (at most N-1) */
    const size_t *history_starts; /* R > 1: [R + 1], request r's history is history[
                                   * history_starts[r] .. history_starts[r+1]), at most N-1 */
    int32_t layer;                /* -1: every layer, out [T, L, C]; else that layer's index in
                                   * the config's order, out [T, C] */
    void *out;                    /* the ids, contiguous, of out_type */
    int out_type;                 /* ENGRAM_ID_INT32 or ENGRAM_ID_INT64 */
    uint32_t threads;             /* 0: automatic (the calling thread alone below 32,768
                                   * tokens; above, a thread per 16,384 tokens, at most the
                                   * CPUs and 8); 1: the calling thread; N: N threads (at
                                   * most 8), made for the call */
} engram_ngram_hash_args;

#define ENGRAM_NGRAM_HASH_ARGS_INIT {sizeof(engram_ngram_hash_args), 0u, 0, NULL, 0, 0, NULL, NULL, 0, NULL, -1, NULL, 0, 0u}

/*! engram_ngram_hash() :
 * Hashes the requests' tokens into row ids (see above).  Every token (and
 * history token) is checked before anything is written: a raw token
 * outside the map, a token below -1, a compressed id at or above
 * compressed_vocab fails with ENGRAM_EBADID naming its position and
 * value, and out is not modified.  ids[t][l][c] (or [t][c]) is the row of
 * column c of layer l for token t: global (offsets added) unless
 * ENGRAM_NGRAM_LOCAL.  Allocates nothing; large batches are hashed by
 * threads started for the call (args->threads).  Thread-safe.
 * @return : 0, ENGRAM_EBADID, -EINVAL (bad arguments, named), -ERANGE
 *           (int32 output and ids of the layout that do not fit). */
ENGRAM_API int engram_ngram_hash(const engram_ngram_hasher *h, const engram_ngram_hash_args *args);

/*! engram_ngram_lookup() :
 * Tokens to rows in one call: hashes `hash`'s tokens (hash->layer, an
 * index of the layout, is the one layer read; hash->out is not used) and
 * looks the ids up on store `st` as `look` says (its out, strides,
 * row_bytes and flags; its tables, offsets, ids and num_cols must be left
 * unset: they come from the hash).  `tables` is either the layer's one
 * table (num_tables 1, global ids: rows of the whole layer) or one table
 * per column (num_tables = C, local ids: the layer API's per-head tables
 * engram:l{L}:h{c}).  The output is [T, C, row_bytes].  The ids go to a
 * per-thread buffer kept for the thread's next calls (8 bytes an id).  A
 * bad token fails before any id is looked up, a bad id (a table smaller
 * than the layout says) before any row is written.  Thread-safe.
 * @return : 0, or what engram_ngram_hash() or engram_lookup() return. */
ENGRAM_API int engram_ngram_lookup(engram_store *st, const engram_ngram_hasher *h,
                                   const engram_ngram_hash_args *hash,
                                   const engram_table_id *tables, size_t num_tables,
                                   const engram_lookup_args *look);

/*! engram_ngram_lookup_submit() :
 * engram_ngram_lookup() on the store's lookup threads (see
 * engram_lookup_submit()): the hash and the lookup both run there (the
 * ids in that thread's buffer).  The hasher, the tokens and histories
 * `hash` points to and the output must stay valid until the wait; tables
 * is copied.
 * @return : 0, -EINVAL, -EAGAIN, -ENOMEM; the rest at the wait. */
ENGRAM_API int engram_ngram_lookup_submit(engram_store *st, const engram_ngram_hasher *h,
                                          const engram_ngram_hash_args *hash,
                                          const engram_table_id *tables, size_t num_tables,
                                          const engram_lookup_args *look, engram_pending **out);

/* ------------------------------------------------------------------------
 * Shard plans: which heads of a layer each rank of a TP x DP topology
 * holds.  A layer's H heads (hash columns) are tables of their own; a
 * shard is a contiguous range of them, so a rank's rows form one global
 * range [row_start, row_end) of the layer's heads laid end to end, and
 * head h's lookup offset is its first global row.
 */
#define ENGRAM_SHARD_PER_TP 0x1u   /* one shard per TP rank, shared by its DP peers
                                    * (tp shards); default: one per rank (tp * dp
                                    * shards, slot tp_rank * dp + dp_rank) */
#define ENGRAM_SHARD_BALANCED 0x2u /* cuts chosen from read counts (below) */

typedef struct engram_shard {
    uint32_t first_head; /* the shard holds heads [first_head, first_head + num_heads) */
    uint32_t num_heads;  /* >= 1 */
    uint64_t reads;      /* the sum of its heads' read counts (0 without counts) */
} engram_shard;

/*! engram_shard_count() :
 * @return : the number of shards of TP `tp` x DP `dp` with `flags`, or 0
 *           for tp or dp 0 or unknown flags.  Thread-safe. */
ENGRAM_API uint32_t engram_shard_count(uint32_t tp, uint32_t dp, uint32_t flags);

/*! engram_shard_slot() :
 * @return : the shard of rank (tp_rank, dp_rank): tp_rank * dp + dp_rank
 *           (TP-major), or tp_rank with ENGRAM_SHARD_PER_TP; -EINVAL for a
 *           rank outside the topology.  Thread-safe. */
ENGRAM_API int engram_shard_slot(uint32_t tp_rank, uint32_t dp_rank, uint32_t tp, uint32_t dp,
                                 uint32_t flags);

/*! engram_shard_plan() :
 * Fills shards[engram_shard_count(tp, dp, flags)] for a layer of
 * `num_heads` heads.  The head-wise plan (the default, as engines shard
 * today) gives each shard ceil(num_heads / S) heads in order and refuses a
 * topology that leaves a shard without a head.  With ENGRAM_SHARD_BALANCED,
 * the cuts are chosen from reads[num_heads] (each head's reads, e.g. rows
 * looked up per table from the stats, summed over layers) so that the
 * busiest shard reads as little as possible, every shard keeping at least
 * one head (the exact optimum over contiguous ranges).  `reads` may be
 * given to the head-wise plan too, to fill shards[].reads.  Thread-safe.
 * @return : 0; ENGRAM_ESPEC with the reason (a shard without a head);
 *           -EINVAL (a bad topology, shards NULL, BALANCED without reads);
 *           -ENOMEM. */
ENGRAM_API int engram_shard_plan(uint32_t num_heads, const uint64_t *reads, uint32_t tp,
                                 uint32_t dp, uint32_t flags, engram_shard *shards);

/* A row shard: a contiguous range of a layer's global rows (its heads, or
 * an n-gram layout's columns, laid end to end): what a rank holds when the
 * topology has more shards than the layer has heads, so that heads are
 * split between ranks.  The rank keeps rows [row_start, row_end) as one
 * table and looks global ids up with offset row_start. */
typedef struct engram_row_shard {
    uint64_t row_start; /* the shard holds global rows [row_start, row_end) */
    uint64_t row_end;
    uint32_t first_head; /* the heads it has rows of: [first_head, last_head] */
    uint32_t last_head;
} engram_row_shard;

/*! engram_shard_plan_rows() :
 * Fills shards[engram_shard_count(tp, dp, flags)] for a layer of
 * `num_heads` heads of head_rows[h] rows each: the layer's rows cut into
 * equal contiguous ranges (the first total % S ranges one row longer), so
 * that any number of shards up to the layer's rows each gets its share,
 * heads split between shards where they must be.  ENGRAM_SHARD_BALANCED is
 * not taken (-EINVAL).  Thread-safe.
 * @return : 0; ENGRAM_ESPEC (a shard without a row, a head of 0 rows, the
 *           rows past 2^63); -EINVAL (a bad topology, NULL arguments). */
ENGRAM_API int engram_shard_plan_rows(const uint64_t *head_rows, uint32_t num_heads, uint32_t tp,
                                      uint32_t dp, uint32_t flags, engram_row_shard *shards);

/*! engram_shard_route() :
 * The shard holding each of the n global ids of a layer planned into
 * `count` row shards: shard_of[i] = s where shards[s].row_start <= ids[i]
 * < shards[s].row_end, -1 for ENGRAM_DEAD_ID (on no shard).  So a rank
 * can send each id to the rank holding its row (the ids engram_ngram_hash
 * gives are the layer's global rows).  Every id is checked first: one
 * outside the plan's rows fails with ENGRAM_EBADID naming it, and shard_of
 * is not written.  O(n log count).  Thread-safe.
 * @return : 0, ENGRAM_EBADID, -EINVAL (NULL arguments, shards that are not
 *           a plan's: not contiguous from 0). */
ENGRAM_API int engram_shard_route(const engram_row_shard *shards, uint32_t count,
                                  const int64_t *ids, size_t n, int32_t *shard_of);

/* ------------------------------------------------------------------------
 * NUMA placement.
 *
 * On a machine with several NUMA nodes (sockets), a row read from another
 * node's memory crosses the interconnect.  A store can place the memory of
 * its tables (engram_store_options.numa_policy):
 *  - ENGRAM_NUMA_NODE: on node numa_node, or on the node of the PCI device
 *    numa_gpu (a GPU's bus id; its node is read from
 *    /sys/bus/pci/devices/<id>/numa_node, no CUDA needed).  The node is
 *    preferred, not required: when it runs out of memory the kernel takes
 *    another (engram_get_table_placement() shows where pages went) rather
 *    than fail the write or call the OOM killer.
 *  - ENGRAM_NUMA_INTERLEAVE: pages spread round-robin over numa_nodes.
 * It applies to
 *  - the table files the store writes (engram_populate(), the writer,
 *    engram_populate_shared(), engram_numa_copy()) in a tmpfs namespace
 *    (/dev/shm): the policy is set on the file before its first page is
 *    allocated and stays with the file, so its pages are placed however
 *    many processes map it later.  In a namespace on another file system
 *    the pages are the page cache's, placed by whoever reads them back:
 *    writing there with a placement fails with -ENOTSUP;
 *  - the private copies the store makes at open (ENGRAM_OPEN_PRIVATE_HUGE).
 * The placement is checked at engram_store_open(): a node that does not
 * exist, is offline, has no memory or is outside this process's cpuset, a
 * device that does not exist or reports no node on a machine of several
 * nodes, or a bad node list, fails the open with -EINVAL or -ENODEV and
 * the reason.  Built without libnuma, or where the kernel refuses NUMA
 * calls (no NUMA support, or a seccomp profile that forbids mbind), a
 * placement fails the open with -ENOTSUP.
 *
 * Per-node copies: engram_numa_copy() writes NAME.numaN, a copy of table
 * NAME placed on node N, in the same namespace; a store opened with
 * ENGRAM_OPEN_NUMA_LOCAL then serves NAME from the copy on the node of
 * the thread that opens it (see engram_numa_copy()).
 */
#define ENGRAM_NUMA_MAX_NODES 64        /* nodes engram places on and counts: 0 .. 63 */
#define ENGRAM_PLACEMENT_SAMPLE 65536u  /* pages a placement query looks at, at most */

/* Where a table's pages are (engram_get_table_placement()). */
typedef struct engram_table_placement {
    uint32_t size;         /* sizeof(engram_table_placement) */
    uint32_t page_size;    /* bytes of a page as counted here (the base page size) */
    uint64_t pages;        /* pages of the table's data */
    uint64_t sampled;      /* pages looked at: all of them, or ENGRAM_PLACEMENT_SAMPLE
                            * evenly spaced ones for a larger table */
    uint64_t absent;       /* of those, not in memory (never touched, or swapped out) */
    uint64_t other_nodes;  /* of those, on a node >= ENGRAM_NUMA_MAX_NODES */
    int32_t max_node;      /* the highest node holding a sampled page; -1: none */
    uint32_t private_copy; /* 1: the pages of this process's private copy; 0: the table's
                            * shared memory (file pages, or memory bound by the caller) */
    uint64_t node_pages[ENGRAM_NUMA_MAX_NODES]; /* sampled pages on each node */
} engram_table_placement;

#define ENGRAM_TABLE_PLACEMENT_INIT {sizeof(engram_table_placement), 0u, 0, 0, 0, 0, -1, 0u, {0}}

/*! engram_get_table_placement() :
 * Fills *p with the NUMA nodes holding the pages of table `name`, as
 * move_pages(2) reports them: for a table file, its pages in memory (the
 * table need not be open: the file is mapped for the query, and a page is
 * read only when mincore() says it is in memory, so nothing is read from
 * disk); for a table this store serves from a private copy, that copy;
 * for a bound table, the caller's memory (pages never touched count as
 * absent).  Tables of up to ENGRAM_PLACEMENT_SAMPLE pages are counted
 * whole, larger ones by that many evenly spaced pages (multiply
 * node_pages by pages / sampled for an estimate).  A query costs about a
 * microsecond per page looked at.  p->size must be set.  Thread-safe.
 * @return : 0, -ENOENT, -ENOTSUP (a table whose rows are not memory:
 *           read on demand, from a source or a Redis Cluster; or built
 *           without libnuma), -EINVAL, or another negative errno. */
ENGRAM_API int engram_get_table_placement(engram_store *st, const char *name,
                                          engram_table_placement *p);

/*! engram_numa_copy() :
 * Makes NAME.numaN ("engram:l1:h0.numa1" for node 1), a copy of table
 * file `name` whose pages are placed on node `node` (ENGRAM_NUMA_NODE
 * semantics, whatever the store's own placement), in the store's
 * namespace, which must be on a tmpfs.  The copy has the table's spec,
 * rows and row range, not its origin (engram_writer_set_origin()): the
 * copy is no table of the remote namespace, whose tables have no such
 * name; engram_check_origin() of the table itself speaks for it.  Like
 * engram_populate_shared(), every process of a node can call it with no
 * leader: exactly one writes the copy and the
 * others reuse it (a copy with other rows is ENGRAM_EMISMATCH), waiting
 * for another process that writes it for at most ENGRAM_SHARED_WAIT_MS
 * (-ETIMEDOUT, naming that process).  *written
 * (may be NULL) is set to 1 when this call wrote it.  The node is checked
 * as a store's numa_node is.  Thread-safe.
 *
 * Reading: a store opened with ENGRAM_OPEN_NUMA_LOCAL resolves
 * engram_table_open(st, NAME) (and engram_table_open_wait()) to
 * NAME.numaN when that table exists, N being the node of the CPU the
 * opening thread runs on (getcpu(2)); otherwise to NAME.  The id is then
 * the copy's, for every later lookup, from whatever thread: open tables
 * from a thread bound to the node that will look them up (numactl
 * --cpunodebind, or the engine's CPU affinity).  Names that already end in
 * ".numa<digits>" are opened as they are.  Other calls
 * (engram_get_table_info(), engram_remove(), ...) take names literally.
 * @return : 0; -EINVAL (st or name NULL, a bad node: see "NUMA placement");
 *           ENGRAM_ESPEC (NAME.numaN longer than ENGRAM_NAME_MAX);
 *           -ENOENT (no table `name`); -ENOTSUP (not a tmpfs namespace, not
 *           a table file, or built without libnuma); ENGRAM_EMISMATCH;
 *           -ETIMEDOUT; or as engram_populate(). */
ENGRAM_API int engram_numa_copy(engram_store *st, const char *name, int node, int *written);

/* ------------------------------------------------------------------------
 * Tables in a Redis Cluster.
 *
 * engram_store_open_redis() opens a namespace kept in a Redis Cluster
 * instead of a directory.  The store's usual calls then work on the
 * cluster: engram_populate() and the engram_writer_* calls push a table,
 * engram_table_open() opens one for lookups (its rows read on demand
 * behind the store's row cache), engram_list(), engram_get_table_info(),
 * engram_verify() and engram_remove() list, describe, check and remove
 * the namespace's tables.  engram_bind(), engram_add_source() and
 * engram_open_safetensors() add tables to this store only, as in a memory
 * store (their names hide a cluster table of the same name here).
 * docs/redis.md has the whole story; in short:
 *
 *  - Layout: a table is cut into chunk keys of chunk_bytes (whole rows;
 *    the last chunk shorter) named "<prefix>/<ns>/<name>/<epoch>/<i>",
 *    spread over the cluster's slots, or with ENGRAM_REDIS_TAGGED
 *    "<prefix>/<ns>/{<name>/<epoch>}/<i>", all in one slot.  Its manifest
 *    (spec, chunk size, layout, a random publish epoch, XXH3-64 of every
 *    chunk and of the whole) is a field of the hash
 *    "<prefix>/<ns>/.manifests", written last, create-only, in one atomic
 *    step (a Lua script): a table is visible only once all its chunks
 *    are written, persisted and acknowledged by the replicas (WAIT).  A
 *    second push of a name fails with -EEXIST, whatever its rows.  Every
 *    push (and every removal's chunks) has a pending record in the same
 *    hash until it is published (or deleted), so that nothing a push or
 *    a removal leaves behind, even when it dies or loses an answer, is
 *    lost track of: engram_store_gc() settles it.
 *  - Lost answers: a publication whose answer is lost is resolved before
 *    anything is deleted, and if it cannot be, the push fails with
 *    ENGRAM_EINDOUBT and keeps its chunks (the table may still appear,
 *    whole).  Removal is compare-and-delete: it removes only the table
 *    it read, never one pushed again since.  A removal, like a gc,
 *    deletes chunks only once the replicas acknowledged the step that
 *    freed them (WAIT); if they do not in time, it fails after
 *    unpublishing the table and a later gc deletes them.  docs/redis.md,
 *    "The publication protocol", says what each party observes at each
 *    step.
 *  - Lookups: the rows a lookup misses in the row cache are read with
 *    GETRANGE, grouped per node, one pipelined batch per node, all nodes
 *    at once, on connections of the lookup's own (one per node per
 *    concurrent lookup).  Every reply must have exactly row_bytes bytes:
 *    a missing chunk (a master restarted empty, a table removed) reads as
 *    an empty string and fails the lookup with -ENODATA naming the table
 *    and the key; its rows are never served.
 *  - The cluster: slots are routed by CRC16 (hash tags included) over the
 *    map CLUSTER SLOTS gives; MOVED is followed (and the map reloaded),
 *    ASK is followed with ASKING; TRYAGAIN, CLUSTERDOWN, LOADING, a
 *    refused or broken connection are retried with a backoff until the
 *    operation's deadline (timeout_ms), then fail with -ETIMEDOUT naming
 *    the node and the last failure.  A failover (a replica promoted)
 *    therefore either finishes within the deadline or fails clearly.
 *  - Security: AUTH with a password, or an ACL user and password.  No
 *    TLS: the libhiredis this builds against (0.14) has none, so use it
 *    on a trusted network only.
 *
 * Built without hiredis (ENGRAM_REDIS=OFF, or AUTO without it), the
 * calls below exist and fail with -ENOTSUP.
 */
#define ENGRAM_TABLE_REDIS 5 /* engram_table_info.kind: a table of a Redis Cluster */

/* engram_redis_options.flags */
#define ENGRAM_REDIS_TAGGED 0x0001u /* tables written: all chunks of a table in one slot (one
                                     * node) instead of spread over the cluster */

typedef struct engram_redis_options {
    uint32_t size;               /* sizeof(engram_redis_options) */
    uint32_t flags;              /* ENGRAM_REDIS_* */
    const char *user;            /* ACL user; NULL: AUTH with the password alone */
    const char *password;        /* NULL: no AUTH */
    const char *prefix;          /* first part of every key, a valid name: NULL = "engram" */
    uint32_t timeout_ms;         /* deadline of one operation (a lookup's reads, a command),
                                  * its retries included: 0 = 5000 */
    uint32_t connect_timeout_ms; /* one connection attempt: 0 = 1000 */
    uint64_t chunk_bytes;        /* tables written: bytes per chunk key, rounded down to whole
                                  * rows (at least one row, at most 512 MiB): 0 = 1 MiB */
    uint32_t chunk_ttl_ms;       /* tables written: how long the chunks of an unfinished push
                                  * live (renewed while it runs): 0 = 1 hour */
    uint32_t reserved;           /* 0 */
    const char *local_root;      /* the nearest tier: a root whose namespace of the same name
                                  * holds local copies (engram_pull()).  engram_table_open()
                                  * serves a table from its copy, mapped, when the copy has the
                                  * cluster's spec and checksum, else from the cluster.  NULL:
                                  * none.  The namespace is made if missing. */
} engram_redis_options;

#define ENGRAM_REDIS_OPTIONS_INIT {sizeof(engram_redis_options), 0u, NULL, NULL, NULL, 0u, 0u, 0, 0u, 0u, NULL}

/*! engram_store_open_redis() :
 * Opens namespace `ns` of the Redis Cluster reached at `nodes`
 * ("host:port[,host:port...]"; IPv6 hosts in brackets): connects to the
 * first node that answers and loads the slot map.  `opts` (may be NULL)
 * are the store's options as for engram_store_open() (cache_bytes,
 * threads, flags: ENGRAM_OPEN_PREFAULT, ENGRAM_OPEN_MLOCK and
 * ENGRAM_OPEN_TIMING apply; ENGRAM_OPEN_CREATE is accepted and
 * needless: a namespace is a key prefix).  `ropts` (may be NULL) are the
 * cluster's.  The password is kept in memory for reconnections, and
 * wiped at close.  On success *out owns the store; close it with
 * engram_store_close().  Thread-safe.
 * @return : 0, ENGRAM_ESPEC (bad namespace or prefix), -EINVAL (bad node
 *           list or options), -EACCES (AUTH refused), -ECONNREFUSED /
 *           -ETIMEDOUT / -EHOSTUNREACH (no node answered), -EIO (not a
 *           cluster), -ENOMEM, -ENOTSUP (built without hiredis). */
ENGRAM_API int engram_store_open_redis(const char *nodes, const char *ns,
                                       const engram_store_options *opts,
                                       const engram_redis_options *ropts, engram_store **out);

typedef struct engram_redis_stats {
    uint32_t size;          /* sizeof(engram_redis_stats) */
    uint32_t nodes;         /* nodes known (given, or learnt from the slot map and redirections) */
    uint64_t batches;       /* pipelined read batches sent (one per node and round of a lookup) */
    uint64_t gets;          /* GETRANGE commands sent */
    uint64_t commands;      /* other commands (writes, manifests, WAIT) */
    uint64_t moved;         /* MOVED redirections followed */
    uint64_t ask;           /* ASK redirections followed */
    uint64_t retries;       /* rounds or commands retried after a passing failure */
    uint64_t connects;      /* connection attempts */
    uint64_t conn_errors;   /* connections refused, timed out or broken */
    uint64_t map_refreshes; /* slot map loads (CLUSTER SLOTS) */
    uint64_t timeouts;      /* operations that failed at their deadline */
    uint64_t local_tables;  /* tables opened from their local copy (local_root): the nearest
                             * tier; the others are read from the cluster */
} engram_redis_stats;

#define ENGRAM_REDIS_STATS_INIT {sizeof(engram_redis_stats), 0u, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/*! engram_get_redis_stats() :
 * Fills *stats (stats->size must be set) with the cluster client's
 * counters of store `st`, opened with engram_store_open_redis().
 * Thread-safe.
 * @return : 0, -EINVAL (not a Redis store, or a bad size), -ENOTSUP
 *           (built without hiredis). */
ENGRAM_API int engram_get_redis_stats(engram_store *st, engram_redis_stats *stats);

/* ------------------------------------------------------------------------
 * Statistics.
 */
typedef struct engram_stats {
    uint32_t size;        /* sizeof(engram_stats) */
    uint32_t threads;     /* gather threads including the caller */
    uint64_t lookups;     /* successful lookups */
    uint64_t failed;      /* lookups rejected by validation */
    uint64_t rows;        /* rows copied */
    uint64_t dead_rows;   /* rows with ENGRAM_DEAD_ID */
    uint64_t bytes;       /* bytes copied */
    uint64_t parallel;    /* lookups split across threads */
    uint64_t time_ns;     /* time inside successful lookups (ENGRAM_OPEN_TIMING only) */
    uint64_t tables_open; /* tables mapped or bound */
    uint64_t mapped_bytes; /* bytes of table memory mapped or bound */
    /* Removed tables whose memory is still held: lent out by
     * engram_table_memory() (held until close), or removed while lookups
     * that could still read them were running (released by a later
     * engram_remove(), engram_table_open() or engram_store_stats()). */
    uint64_t removed_tables;
    uint64_t removed_bytes;
} engram_stats;

#define ENGRAM_STATS_INIT {sizeof(engram_stats), 0u, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

/*! engram_store_stats() :
 * Fills *stats (stats->size must be sizeof(engram_stats)).  Counters
 * are summed from per-thread shards without stopping lookups, so a
 * snapshot taken during lookups may be slightly behind.  First releases
 * what removed tables hold where no running lookup can still read it.
 * Thread-safe.
 * @return : 0 or -EINVAL. */
ENGRAM_API int engram_store_stats(engram_store *st, engram_stats *stats);

/* ------------------------------------------------------------------------
 * For GPU and other accelerator paths (libengram_cuda, engram_cuda.h).
 */

/*! engram_table_memory() :
 * Gives the memory of table `id` for callers that read rows themselves
 * (the CUDA library registers it with the GPU): *base receives the address
 * of row 0 of a memory-resident table (a mapped table file, its private
 * huge-page copy, or memory bound with engram_bind()), and *spec its spec
 * with row_pitch resolved (never 0).  Row i is at base + i * row_pitch.
 * The memory is read-only and stays valid until the store is closed, even
 * after engram_remove().  Tables whose rows are not addressable memory
 * (backends that read rows on demand) have no base: the call then fills
 * *spec, sets *base to NULL and returns -ENOTSUP.  `base` or `spec` may be
 * NULL when not wanted.  Thread-safe.
 * @return : 0, -ENOTSUP (no base address), ENGRAM_EREMOVED, or -EINVAL (id
 *           not issued by this store). */
ENGRAM_API int engram_table_memory(engram_store *st, engram_table_id id, const void **base,
                                   engram_table_spec *spec);

/*! engram_dequant_fp8_e4m3_e8m0_ref() :
 * Reference dequantisation of `n` FP8 values with E8M0 block scales to
 * BF16, the exact definition the CUDA dequant kernel matches bit for bit.
 * values[i] is OCP FP8 E4M3 "fn" (bias 7, subnormals, no infinities;
 * 0x7f and 0xff are NaN); scales[i / 32] is E8M0: byte e means 2^(e-127),
 * so byte 0 is 2^-127 (not 0) and byte 255 is NaN.  out[i] receives the
 * BF16 bits of values[i] * scale rounded to nearest, ties to even (results
 * beyond the BF16 range become +-inf, tiny ones BF16 subnormals or +-0).
 * Every NaN result is 0x7fc0.  For a packed 264-byte row, values = row and
 * scales = row + 256 with n = 256.  Thread-safe; allocates nothing.
 * @return : 0, or -EINVAL if n is not a multiple of 32 or a pointer is NULL
 *           while n > 0. */
ENGRAM_API int engram_dequant_fp8_e4m3_e8m0_ref(const void *values, const void *scales, size_t n,
                                                uint16_t *out);

/* ------------------------------------------------------------------------
 * Namespaces of a root: listing and removing them, their users, and
 * removing the ones nobody uses (gc).
 */
/*! engram_namespace_list() :
 * Lists the namespaces under directory `root` (NULL: the default root):
 * its subdirectories with valid names (links and other entries are left
 * out), sorted, whoever owns them (engram_store_open() decides whether a
 * namespace is trusted).  *names is one allocation (the array, NULL
 * terminated, and the strings) to release with engram_free(); *count is
 * its length.  Thread-safe.
 * @return : 0, -ENOENT (no such root), ENGRAM_EUNSAFE (the root is a link
 *           or not a directory), -EINVAL (names or count NULL), -ENOMEM,
 *           or another negative errno. */
ENGRAM_API int engram_namespace_list(const char *root, char ***names, size_t *count);

/* engram_namespace_remove() flags */
#define ENGRAM_NS_REMOVE_TABLES 0x0001u /* remove the namespace's tables first */
#define ENGRAM_NS_REMOVE_IN_USE 0x0002u /* also while other processes hold leases on it */

/*! engram_namespace_remove() :
 * Removes namespace `ns` under `root` (NULL: the default root).  It is
 * opened as engram_store_open() opens it (the same trust rules; stale
 * temporary files of dead writers are removed), then every entry is
 * checked before anything is removed:
 *  - a table: without ENGRAM_NS_REMOVE_TABLES the namespace is not empty
 *    (-ENOTEMPTY, naming the tables); with it, each table is removed as
 *    engram_remove() removes it;
 *  - a temporary file of a writer that is still running: -EBUSY, naming
 *    the table being written, the writer's pid (as its PID namespace
 *    numbers it) and how long it has held the name;
 *  - a live lease of another process (it has tables of the namespace
 *    open, see engram_namespace_usage()): -EBUSY naming the process,
 *    unless ENGRAM_NS_REMOVE_IN_USE is given (that process keeps reading
 *    the tables it opened, as after engram_remove(), and can open no new
 *    one); leases of this process and stale ones are removed with the
 *    tables;
 *  - anything else (a file that is not an engram table, a link, a
 *    directory, also under a name like a temporary file's: writers make
 *    only regular files of the namespace's owner): -ENOTEMPTY naming it;
 *    the library removes only what it wrote, so remove such entries
 *    yourself.
 * The directory itself is then removed with rmdir(2), which succeeds only
 * if it is empty: a table published meanwhile by another process makes
 * the call fail with -ENOTEMPTY (the tables removed before stay removed)
 * rather than be lost.  Stores open on the namespace keep the tables they
 * mapped, as after engram_remove(); they can no longer write tables.
 * Thread-safe.
 * @return : 0, -ENOENT (no such namespace), -ENOTEMPTY, -EBUSY,
 *           ENGRAM_EUNSAFE, ENGRAM_ESPEC (bad name), -EINVAL (unknown
 *           flags), or another negative errno; engram_errmsg() says which
 *           entry stopped it. */
ENGRAM_API int engram_namespace_remove(const char *root, const char *ns, uint32_t flags);

/* Who uses a namespace (engram_namespace_usage()).  A store holds a lease
 * on its namespace from its first engram_table_open() (or
 * engram_table_open_wait() that waits) until it is closed:
 * a file ".lease.<pid>.<nonce>" locked with flock(), so a lease lives
 * exactly as long as its process (however that ends), across PID
 * namespaces.  Leases of dead processes are stale; the next store open
 * removes them.  A store that cannot write the namespace (a group
 * member's) holds none. */
typedef struct engram_namespace_use {
    uint32_t size;          /* sizeof(engram_namespace_use) */
    uint32_t users;         /* live leases */
    uint32_t stale_leases;  /* leases of processes that died */
    uint32_t reserved;
    uint64_t last_used_ns;  /* the latest of the directory's and its leases' modification
                             * times, ns since the Unix epoch */
    char first_user[200];   /* what a live lease's holder wrote: "pid P start S command C" */
} engram_namespace_use;

#define ENGRAM_NAMESPACE_USE_INIT {sizeof(engram_namespace_use), 0, 0, 0, 0, ""}

/*! engram_namespace_usage() :
 * Fills *u for namespace `ns` under `root` (NULL: the default root).
 * u->size must be set.  Thread-safe.
 * @return : 0, -ENOENT, ENGRAM_EUNSAFE, ENGRAM_ESPEC, -EINVAL, ... */
ENGRAM_API int engram_namespace_usage(const char *root, const char *ns, engram_namespace_use *u);

/* engram_namespace_gc() flags and report codes */
#define ENGRAM_GC_DRY_RUN 0x0001u /* decide and report, remove nothing (not even stale leases) */
#define ENGRAM_GC_KEPT 1          /* report code: kept (in use, or used recently) */

/*! A report of engram_namespace_gc() on namespace `ns`: code 0 removed
 * (or would be, with ENGRAM_GC_DRY_RUN), ENGRAM_GC_KEPT kept, or the
 * negative error that kept it (not ours to open, an entry that is not a
 * table, a table being written); `detail` says why. */
typedef void (*engram_gc_report_fn)(void *ud, const char *ns, int code, const char *detail);

/*! engram_namespace_gc() :
 * Removes, with their tables, the namespaces under `root` (NULL: the
 * default root) that no live process holds a lease on and that were last
 * used at least `idle_s` seconds ago (see engram_namespace_use), as
 * engram_namespace_remove() removes them: so a crashed job never leaks
 * its tables for good.  Only namespaces engram_store_open() accepts are
 * considered; each one is reported through `report` (may be NULL).
 * Thread-safe.
 * @return : 0 (per-namespace failures are reported, not returned),
 *           -EINVAL (unknown flags), or the error of listing `root`. */
ENGRAM_API int engram_namespace_gc(const char *root, uint64_t idle_s, uint32_t flags,
                                   engram_gc_report_fn report, void *ud);

/*! engram_store_gc() :
 * Deletes what unfinished writes left behind in the namespace of store
 * `st`, so that no crash, lost reply or killed process leaks storage for
 * good:
 *  - in a namespace of a Redis Cluster, the chunk keys that no manifest
 *    owns, each set recorded by a pending record (docs/redis.md, "The
 *    publication protocol"): those of pushes that died, failed, or
 *    ended with ENGRAM_EINDOUBT and never got published, and those of
 *    removals that died before their chunks were gone.  A push that may
 *    still be running is never taken: an open record goes only once its
 *    writer has shown no life for max(idle_s, its chunk TTL) (a running
 *    push shows life every half TTL, and one quiet for longer has lost
 *    its unpublished chunks anyway); a closed record once it is idle_s
 *    old.  A set's chunks go only once the replicas of the manifests'
 *    master acknowledged its record closed (else it is reported and
 *    kept for a later pass).  Each set is reported through `report`
 *    (may be NULL) with the table's name: code 0 deleted (or would be,
 *    with ENGRAM_GC_DRY_RUN), ENGRAM_GC_KEPT kept, or the negative error
 *    that stopped it.
 *    engram_populate() and engram_writer_begin() run the same pass with
 *    idle_s 0 before each push.
 *  - in a directory, the temporary files of writers that died, as
 *    engram_store_open() removes them (nothing is reported; a dry run
 *    does nothing);
 *  - in a memory store, nothing.
 * Thread-safe.
 * @return : 0 (per-set failures are reported), -EINVAL (NULL store or
 *           unknown flags), or the failure to list the records. */
ENGRAM_API int engram_store_gc(engram_store *st, uint64_t idle_s, uint32_t flags,
                               engram_gc_report_fn report, void *ud);

#ifdef __cplusplus
}
#endif

#endif /* ENGRAM_H */
