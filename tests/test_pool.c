/*
 * test_pool.c - the gather pool (src/pool.h): every part runs exactly once,
 * and splitting stops where it does not pay.
 *
 * A job whose part sleeps when the worker runs it (a worker descheduled
 * in the middle of a part, as on a machine whose other CPU is busy) makes
 * the caller wait at its end; the pool must then refuse the next jobs
 * (the caller runs them alone), for 128 jobs the first time and twice as
 * many each time it happens again, 4096 at most, and halve that after
 * eight jobs in a row that paid.
 *
 * Whether a job paid is the pool's judgement of wall-clock times, which
 * the scheduler can sway: a caller descheduled in its own parts for longer
 * than the worker's stall makes the stall look paid.  So the test does not
 * assume every slowed job is judged a stall: it replays the pool's rule on
 * what it observes.  Each job it gets was preceded either by no refusal
 * (the one before it paid) or by exactly the next backoff's number of
 * refusals (it did not), and nothing else; the backoff must reach its cap
 * and stay there, and jobs that pay must bring it down.  The worker's stall is made long enough that
 * scheduling rarely sways the judgement: it lasts until the caller has run
 * every other part, then four times as long as the job had taken.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "pool.h"

enum { PARTS = 64 };

#define BACKOFF_MIN 128
#define BACKOFF_MAX 4096

typedef struct job {
    pthread_t caller;
    int slow_workers;
    uint64_t t0_us; /* when the caller posted it (at most: just before) */
    _Atomic int ran[PARTS];
    _Atomic int started;
    _Atomic int by_worker;
} job;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void part_fn(void *arg, size_t part, size_t nparts)
{
    job *j = arg;
    ASSERT_EQ(nparts, PARTS);
    atomic_fetch_add(&j->ran[part], 1);
    atomic_fetch_add(&j->started, 1);
    if (!pthread_equal(pthread_self(), j->caller)) {
        if (atomic_fetch_add(&j->by_worker, 1) == 0 && j->slow_workers) {
            /* Descheduled mid-part: the caller runs every other part
             * meanwhile, then waits for this one, longer than the job had
             * taken so far (which a descheduled caller stretches). */
            uint64_t t;
            while (atomic_load(&j->started) < PARTS)
                usleep(100);
            t = now_us() - j->t0_us;
            usleep((useconds_t)(20000 + 4 * t));
        }
    } else if (!atomic_load(&j->by_worker)) {
        /* Leave the worker time to take a part; once it has one, the
         * caller's own parts are instant. */
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
    j.t0_us = now_us();
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

/* The pool's rule, replayed on what the test sees. */
typedef struct model {
    int backoff, paid;
    int stalls, halvings, at_cap;
} model;

/* Takes the next job (its worker stalling if `slow`), and checks the jobs
 * refused before it against the rule applied to the job before it: none
 * if that one was judged to pay (eight of those in a row halve the
 * backoff), else exactly the backoff doubled (128 the first time, 4096 at
 * most). */
static void next_job(engram__pool *p, int slow, model *m)
{
    int refused = 0;
    while (!run(p, slow, NULL)) {
        refused++;
        ASSERT_LE(refused, BACKOFF_MAX); /* never more than the cap */
    }
    if (refused == 0) {
        if (++m->paid == 8) {
            m->backoff /= 2;
            m->paid = 0;
            m->halvings++;
        }
        return;
    }
    m->backoff = m->backoff ? (m->backoff < BACKOFF_MAX ? m->backoff * 2 : BACKOFF_MAX)
                            : BACKOFF_MIN;
    m->paid = 0;
    m->stalls++;
    m->at_cap += m->backoff == BACKOFF_MAX;
    ASSERT_EQ(refused, m->backoff);
}

static void test_backoff(void)
{
    engram__pool *p;
    model m = {0};
    int jobs;
    ASSERT_OK(engram__pool_create(1, &p));
    /* A new pool takes its first job. */
    ASSERT(run(p, 1, NULL));
    /* Jobs whose worker stalls, until the backoff has reached its cap and
     * held it once more. */
    for (jobs = 0; jobs < 400 && m.at_cap < 2; jobs++)
        next_job(p, 1, &m);
    printf("   %d slowed jobs: %d judged stalls, the rest judged paid\n", jobs, m.stalls);
    if (m.at_cap < 2) {
        /* Each refusal count matched the rule; the cap was just never
         * reached: a machine so busy that stalls kept looking paid. */
        engram__pool_destroy(p);
        tu_skip_case("the backoff did not reach its cap of %d in %d slowed jobs (a busy machine)",
                     BACKOFF_MAX, jobs);
        return;
    }
    /* Then jobs whose worker does not stall: each that pays counts, and
     * sixteen in a row halve the backoff twice (a worker that starts late
     * on a busy machine is judged a stall instead, which the rule covers
     * too).  A slowed job after that must back off from the halved value:
     * 4096 / 4 * 2, not the cap again. */
    for (jobs = 0; jobs < 2000 && m.halvings < 2; jobs++)
        next_job(p, 0, &m);
    printf("   %d jobs that need not stall: %d halvings\n", jobs, m.halvings);
    if (m.halvings >= 2) {
        next_job(p, 1, &m); /* a slowed job... */
        next_job(p, 1, &m); /* ...and the refusals after it */
    }
    engram__pool_destroy(p);
}

int main(void)
{
    tu_watchdog(120);
    RUN_TEST(test_backoff);
    return tu_done("test_pool");
}
