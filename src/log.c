/*
 * log.c - the library's log messages and where they go.
 *
 * The library returns its failures; what it has to say besides (a periodic
 * row cache stats line, a fallback it took, a dead writer's file it
 * cleaned up) goes through one process-wide sink: the caller's function,
 * set with engram_set_log(), or by default nowhere, except for a message
 * the caller asked for by other means (a store's cache stats interval),
 * which then goes to stderr as one line.
 *
 * Messages are rare (at most one per store and interval, or per event), so
 * one mutex serialises them: the caller's function is never called by two
 * threads at once, and once engram_set_log() has returned, the function it
 * replaced is not called again.  A message raised on a thread that is
 * inside the caller's function (which looked up, say) is dropped instead
 * of deadlocking on that mutex.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static engram_log_fn log_fn; /* under log_lock, with log_ud and log_level */
static void *log_ud;
static int log_level;
/* The most verbose level the sink takes (ENGRAM_LOG_OFF without a
 * function): lets engram__log() drop a message without the lock. */
static _Atomic int log_max;
static _Thread_local int in_log_fn;

int engram_set_log(engram_log_fn fn, void *ud, int level)
{
    if (level < ENGRAM_LOG_OFF || level > ENGRAM_LOG_DEBUG)
        return engram__err(-EINVAL, "log level %d is not one of ENGRAM_LOG_OFF (0) .. "
                                    "ENGRAM_LOG_DEBUG (4)", level);
    if (in_log_fn)
        return engram__err(ENGRAM_ESTATE, "engram_set_log() called from the log function");
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_ud = fn ? ud : NULL;
    log_level = fn ? level : ENGRAM_LOG_OFF;
    /* Relaxed: a message that reads a stale value takes the lock and
     * decides again under it. */
    atomic_store_explicit(&log_max, log_level, memory_order_relaxed);
    pthread_mutex_unlock(&log_lock);
    return 0;
}

void engram__log(int level, unsigned flags, const char *fmt, ...)
{
    char buf[1024], *msg = buf;
    va_list ap;
    int n;

    if (in_log_fn)
        return;
    /* Relaxed, as above: only a hint that spares the lock. */
    if (!(flags & ENGRAM__LOG_ASKED) && level > atomic_load_explicit(&log_max, memory_order_relaxed))
        return;
    pthread_mutex_lock(&log_lock);
    if (log_fn ? level > log_level : !(flags & ENGRAM__LOG_ASKED))
        goto out;
    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        goto out;
    /* Longer than the buffer (a long path): format again into one that
     * fits, or send the truncated text if there is no memory for it. */
    if ((size_t)n >= sizeof buf && (msg = malloc((size_t)n + 1)) != NULL) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    } else if (!msg) {
        msg = buf;
    }
    if (log_fn) {
        in_log_fn = 1;
        log_fn(log_ud, level, msg);
        in_log_fn = 0;
    } else {
        fprintf(stderr, "engram: %s\n", msg);
    }
    if (msg != buf)
        free(msg);
out:
    pthread_mutex_unlock(&log_lock);
}
