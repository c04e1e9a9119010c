/*
 * bench_util.h - what the C benchmarks share: a monotonic clock in ns, a
 * small reproducible generator (xorshift64*), a comparison for qsort of
 * timings, the load average as text, and the exit on a library failure.
 * Header-only, for the benchmark programs (not part of libengram).
 */
#ifndef ENGRAM_BENCH_UTIL_H
#define ENGRAM_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engram.h"

static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* xorshift64* of state *s (never 0). */
static inline uint64_t bench_rng(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static inline int bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Prints "PROG: WHAT: the library's message" and exits 1. */
static inline void bench_die(const char *prog, const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", prog, what, engram_errmsg());
    exit(1);
}

/* The 1, 5 and 15-minute load averages, as text (a static buffer). */
static inline const char *bench_loadavg_text(void)
{
    static char b[64];
    double l[3];
    if (getloadavg(l, 3) != 3)
        return "unknown";
    snprintf(b, sizeof b, "%.2f %.2f %.2f", l[0], l[1], l[2]);
    return b;
}

#endif
