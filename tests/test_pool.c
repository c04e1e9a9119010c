/*
 * test_pool.c - the gather pool (src/pool.h): every part runs exactly once,
 * and splitting stops where it does not pay.
 *
 * A job whose parts sleep when a worker runs them (a worker descheduled
 * in the middle of a part, as on a machine whose other CPU is busy) makes
 * the caller wait at its end; the pool must then refuse the next jobs
 * (the caller runs them alone), for 128 jobs the first time and twice as
 * many each time it happens again, 4096 at most.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>

#include "pool.h"

enum { PARTS = 64 };

typedef struct job {
    pthread_t caller;
    int slow_workers;
    _Atomic int ran[PARTS];
    _Atomic int by_worker;
} job;

static void part_fn(void *arg, size_t part, size_t nparts)
{
    job *j = arg;
    ASSERT_EQ(nparts, PARTS);
    atomic_fetch_add(&j->ran[part], 1);
    if (!pthread_equal(pthread_self(), j->caller)) {
        atomic_fetch_add(&j->by_worker, 1);
        if (j->slow_workers)
            usleep(20000); /* descheduled mid-part */
    } else if (!atomic_load(&j->by_worker)) {
        /* Leave the worker time to take a part; once it has one, the
         * caller's own parts are instant, so the job's time is the
         * worker's stall whatever the machine's load (a caller slowed to
         * a millisecond a part would make the stall look paid for). */
        usleep(50);
    }
}

/* Runs one job; 1 if the pool took it (0: refused, nothing ran). */
static int run(engram__pool *p, int slow, int *workers)
{
    job j;
    memset(&j, 0, sizeof j);
    j.caller = pthread_self();
    j.slow_workers = slow;
    if (engram__pool_run(p, part_fn, &j, PARTS) != 0) {
        for (int i = 0; i < PARTS; i++)
            ASSERT_EQ(atomic_load(&j.ran[i]), 0);
        return 0;
    }
    for (int i = 0; i < PARTS; i++)
        ASSERT_EQ(atomic_load(&j.ran[i]), 1);
    if (workers)
        *workers = atomic_load(&j.by_worker);
    return 1;
}

static void test_backoff(void)
{
    engram__pool *p;
    int w = 0, stalled = 0, refused;
    ASSERT_OK(engram__pool_create(1, &p));
    /* A job in which a worker stalls (it must have taken a part: else the
     * caller waited for nothing). */
    for (int tries = 0; tries < 50 && !stalled; tries++) {
        if (!run(p, 1, &w))
            continue; /* refused after a late start: fine, try again */
        stalled = w > 0;
    }
    if (!stalled) {
        tu_skip_case("the worker never took a part of 50 jobs here (a busy machine)");
        engram__pool_destroy(p);
        return;
    }
    /* The next 128 jobs are refused; while the first job taken after the
     * refusals stalls again (or its worker starts late, or not at all in
     * a job of milliseconds: both mean a busy CPU), the refusals double,
     * up to 4096. */
    for (int expect = 128; expect <= 4096; expect *= 2) {
        refused = 0;
        while (!run(p, 1, &w))
            refused++;
        ASSERT_EQ(refused, expect);
    }
    refused = 0;
    while (!run(p, 1, &w))
        refused++;
    ASSERT_EQ(refused, 4096);
    engram__pool_destroy(p);
}

int main(void)
{
    tu_watchdog(120);
    RUN_TEST(test_backoff);
    return tu_done("test_pool");
}
