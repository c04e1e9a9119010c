/*
 * error.c - error codes, their fixed texts and the per-thread detail message.
 *
 * The detail message is thread-local rather than per store because lookups
 * on one store run concurrently from many threads: each thread must read
 * back the message of its own failure.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common.h"

static _Thread_local char errbuf[ENGRAM__ERRMSG_MAX];
/* The bad id of the thread's last failure, if it was one (see verr()). */
static _Thread_local engram_bad_id last_bad;
static _Thread_local int last_bad_valid;
/* Set by engram_source_error(): the source gave its failure a message. */
static _Thread_local int source_msg;

const char *engram_version_string(void)
{
#define ENGRAM__STR2(x) #x
#define ENGRAM__STR(x) ENGRAM__STR2(x)
    return ENGRAM__STR(ENGRAM_VERSION_MAJOR) "." ENGRAM__STR(ENGRAM_VERSION_MINOR) "." ENGRAM__STR(
        ENGRAM_VERSION_PATCH);
}

unsigned engram_version_number(void)
{
    return ENGRAM_VERSION_NUMBER;
}

const char *engram_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define ENGRAM__ERR_CASE(name, value, text) \
    case value:                             \
        return text;
        ENGRAM_ERRNO_MAP(ENGRAM__ERR_CASE)
#undef ENGRAM__ERR_CASE
    default:
        break;
    }
    if (err < 0 && err > -4000) {
        /* strerror() is not thread-safe in general, but glibc returns
         * static strings for known errno values. */
        return strerror(-err);
    }
    return "unknown error";
}

const char *engram_errmsg(void)
{
    return errbuf;
}

/* Formats through a local buffer, so a message may quote the previous one
 * (engram_errmsg() as an argument) without an overlapping copy. */
__attribute__((format(printf, 2, 0))) static int verr(int code, const char *fmt, va_list ap)
{
    char tmp[sizeof errbuf];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(errbuf, tmp, sizeof errbuf);
    last_bad_valid = 0; /* a new failure: the record is not its */
    return code;
}

void engram__set_bad_id(const engram_bad_id *bad)
{
    last_bad = *bad;
    last_bad_valid = 1;
}

int engram_last_bad_id(engram_bad_id *bad)
{
    if (!bad || bad->size != sizeof *bad)
        return -EINVAL;
    if (!last_bad_valid)
        return -ENOENT;
    *bad = last_bad;
    return 0;
}

int engram__verr(int code, const char *fmt, va_list ap)
{
    return verr(code, fmt, ap);
}

int engram__err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verr(code, fmt, ap);
    va_end(ap);
    return code;
}

int engram__errno(int errno_value, const char *fmt, ...)
{
    va_list ap;
    size_t n;
    va_start(ap, fmt);
    verr(0, fmt, ap);
    va_end(ap);
    n = strlen(errbuf);
    if (n < sizeof errbuf)
        snprintf(errbuf + n, sizeof errbuf - n, ": %s", strerror(errno_value));
    return -errno_value;
}

int engram_source_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verr(code, fmt, ap);
    va_end(ap);
    source_msg = 1;
    return code;
}

int engram__source_msg_take(void)
{
    int had = source_msg;
    source_msg = 0;
    return had;
}

uint64_t engram__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t engram__wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
