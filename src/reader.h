/*
 * reader.h - reading rows of files with io_uring (internal).
 *
 * The reader serves the row sources of file-backed tables (filesrc.c):
 * its read function is their engram_source_ops.read_rows, with the reader
 * as ctx and the table's engram__rfile as table_ud.  A row of a file
 * table is one or two *segments*: the concatenation of each segment's
 * `len` bytes at file offset base + row * stride of that segment's file.
 * A table file of the namespace is one segment (its data region at its
 * row pitch); a safetensors weight + scale pair is two (the two planes,
 * possibly in two files of a sharded checkpoint).
 *
 * Every read lands in a staging slot of one of the store's rings; a row
 * is copied to its destination only once all its segments' reads came
 * back whole, so a failed read never touches the output.  Staging is
 * charged to the store's row cache budget (rowcache.h): the reader asks
 * for it when a table is admitted, and uses fewer rings or fewer reads in
 * flight where the budget is small.
 *
 * Rings survive fork() only in the process that made them: a child that
 * reads makes rings of its own, and never touches the parent's.
 */
#ifndef ENGRAM_READER_H
#define ENGRAM_READER_H

#include <stdatomic.h>
#include <stdint.h>

#include "engram.h"
#include "table.h"

#define ENGRAM__RD_MAX_SEGS 2
#define ENGRAM__RD_DEFAULT_QD 64u
#define ENGRAM__RD_MAX_QD ENGRAM_QUEUE_DEPTH_MAX

typedef struct engram__reader engram__reader;
struct engram__cbudget;

/* One segment of a file table. */
typedef struct engram__rseg {
    int fd;             /* buffered reads (owned) */
    int dfd;            /* O_DIRECT descriptor of the same file, or -1 (owned) */
    atomic_int direct;  /* dfd in use (cleared for good by an EINVAL) */
    uint32_t align;     /* direct I/O alignment of offsets, lengths and memory */
    uint64_t base, stride, file_size;
    uint32_t len, dst_off; /* bytes of the row, and where they go in it */
} engram__rseg;

typedef struct engram__rfile_counters {
    _Atomic uint64_t reads, bytes, errors;
} __attribute__((aligned(ENGRAM__CACHELINE))) engram__rfile_counters;

/* A file table as the reader reads it: the table_ud of its source. */
typedef struct engram__rfile {
    unsigned nseg;
    engram__rseg seg[ENGRAM__RD_MAX_SEGS];
    uint32_t row_bytes;
    char name[ENGRAM_NAME_MAX + 1]; /* for messages and the test hook */
    engram__rfile_counters ctr[ENGRAM__STATS_SLOTS];
} engram__rfile;

/* Makes a reader with rings of `queue_depth` reads in flight (0: the
 * default), one ring per lookup thread that may read at once (`rings`),
 * whose staging is charged to `budget`. */
int engram__reader_create(uint32_t queue_depth, unsigned rings, struct engram__cbudget *budget,
                          engram__reader **out);
/* Accepts NULL.  No read may be running. */
void engram__reader_destroy(engram__reader *rd);
uint32_t engram__reader_queue_depth(const engram__reader *rd);

/* Sets up f's segments for reading: f->seg[g].fd, base, stride, len and
 * file_size must be filled; this decides O_DIRECT per segment (a second
 * descriptor and a probe read), fills dst_off and row_bytes, and
 * reserves the staging f's rows need.  On failure the descriptors are
 * closed (f's fds are -1).  -ENOBUFS where one row cannot be staged. */
int engram__reader_admit(engram__reader *rd, engram__rfile *f);

/* Closes f's descriptors.  Accepts NULL (does not free f). */
void engram__reader_file_close(engram__rfile *f);

/* The engram_source_ops.read_rows of file tables: ctx is the reader,
 * every table_ud an admitted engram__rfile. */
int engram__reader_read_rows(void *ctx, engram_source_req *reqs, size_t n);

/* Adds f's read counters and O_DIRECT state to *s. */
void engram__reader_file_stats(const engram__rfile *f, engram_cache_stats *s);

/* Test hook: called with each completed read before it is checked, with
 * the kernel's result `res` (bytes or -errno) and the bytes read; returns
 * the result to use instead (e.g. -EIO, or fewer bytes: the rest of the
 * row is then read, and the hook called again; 0 there is the end of the
 * file).  row is UINT64_MAX for the O_DIRECT probe read made when a table
 * is admitted (a negative result there makes the table use buffered
 * reads).  NULL removes the hook.  Not for production use; set it while
 * no lookup runs. */
typedef int (*engram__read_hook)(void *ud, const char *table, uint64_t row, unsigned seg,
                                 int res, unsigned char *data);
void engram__reader_set_hook(engram__read_hook fn, void *ud);

#endif
