/*
 * common.h - helpers shared by every module of libengram (internal).
 *
 * Error reporting: a failing function returns a negative code and records a
 * detailed, thread-local message with engram__err() (the message buffer is
 * read back through engram_errmsg()).  Size arithmetic goes through the
 * overflow-checked helpers below, never by hand.
 */
#ifndef ENGRAM_COMMON_H
#define ENGRAM_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define ENGRAM__LIKELY(x) __builtin_expect(!!(x), 1)
#define ENGRAM__UNLIKELY(x) __builtin_expect(!!(x), 0)
#define ENGRAM__CACHELINE 64

#if defined(ENGRAM_DEBUG) && ENGRAM_DEBUG
#include <assert.h>
#define ENGRAM__ASSERT(x) assert(x)
#else
#define ENGRAM__ASSERT(x) ((void)0)
#endif

/* Records a formatted detail message for `code` on this thread and returns
 * `code`, so a failure site reads `return engram__err(ENGRAM_ESPEC, ...)`.
 * libengram_cuda reports through the same per-thread message with
 * engram__verr(), which it reaches through internal.h. */
int engram__err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int engram__verr(int code, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* The longest message engram_errmsg() holds, its terminating NUL
 * included: a buffer of this size keeps a message whole. */
#define ENGRAM__ERRMSG_MAX 1024

/* Records errno-style failure `-errno_value` of `what` (e.g. "open 'x'"). */
int engram__errno(int errno_value, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Sends a log message (one line, no newline) of `level` (ENGRAM_LOG_*)
 * to the caller's log function (engram_set_log()) if it takes that level.
 * Without a function the message is dropped, unless `flags` holds
 * ENGRAM__LOG_ASKED (the caller asked for this message by other means,
 * such as a store's cache_log_ms): it is then written to stderr as
 * "engram: <message>".  Thread-safe; see log.c. */
#define ENGRAM__LOG_ASKED 0x1u
void engram__log(int level, unsigned flags, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the bad id of the failure just reported with engram__err(), for
 * engram_last_bad_id(). */
void engram__set_bad_id(const engram_bad_id *bad);

/* 1 if engram_source_error() recorded a message since the last call,
 * which clears the mark. */
int engram__source_msg_take(void);

/* This thread's scratch buffer `which` (ENGRAM__SCRATCH_*) of at least
 * `size` bytes, kept for its next lookups and freed when it exits; NULL
 * when out of memory.  The contents of a grown buffer are not kept. */
enum {
    ENGRAM__SCRATCH_COLS,  /* a plan's columns */
    ENGRAM__SCRATCH_PLAN,  /* a plan's row sources and rows */
    ENGRAM__SCRATCH_ROWS,  /* the rows a lookup hands to fetch.c */
    ENGRAM__SCRATCH_FETCH, /* fetch.c's deduplication */
    ENGRAM__SCRATCH_NGRAM, /* the ids of engram_ngram_lookup() */
    ENGRAM__SCRATCH_KINDS
};
void *engram__scratch(int which, size_t size);

/* Overflow-checked size arithmetic: return 0 on success, -1 on overflow. */
/* A spin-wait hint (x86 pause); nothing elsewhere. */
static inline void engram__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline int engram__mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int engram__add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}
static inline uint64_t engram__align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) & ~(a - 1);
}

/* The row pitch a spec means (0 = row_bytes). */
static inline uint32_t engram__spec_pitch(const engram_table_spec *s)
{
    return s->row_pitch ? s->row_pitch : s->row_bytes;
}

/* Like engram_spec_check(), and on success stores num_rows * pitch. */
int engram__spec_size(const engram_table_spec *spec, uint64_t *data_size);
/* Checks a table's global row range: its num_rows rows are rows
 * [row_start, row_start + num_rows) of a tensor of total_rows rows, with
 * 1 <= total_rows <= 2^62 (so every global id is an int64).  0, or
 * ENGRAM_ESPEC with the reason. */
int engram__range_check(uint64_t row_start, uint64_t num_rows, uint64_t total_rows);

/* 1 if `name` is a valid table name, else 0; records no message (for
 * filtering directory entries). */
int engram__name_valid(const char *name);

/* Nanoseconds of CLOCK_MONOTONIC / CLOCK_REALTIME. */
uint64_t engram__now_ns(void);
uint64_t engram__wall_ns(void);

#endif
