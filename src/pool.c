/*
 * pool.c - the small persistent thread pool that splits big lookups.
 *
 * A job is a number of parts; the caller and the workers claim parts one
 * at a time from a shared counter until none are left.  The caller never
 * waits for a worker that has not started: if a worker is descheduled (a
 * busy 2-core VM, a model's own threads), the caller simply claims the
 * remaining parts itself and waits only for parts already being copied.
 *
 * It must wait, though, for a part a worker claimed and was then
 * descheduled in the middle of (its rows go to the caller's output): on a
 * machine whose other CPUs are busy that wait is a scheduler time slice,
 * milliseconds.  So a job after which the caller waited for workers for
 * more than a quarter of its time, or in which the workers started late
 * (their CPU was busy), makes the pool refuse the next jobs (the callers
 * run them alone), for a number of jobs that doubles while it keeps
 * happening (128 .. 4096) and halves with every eight jobs in a row that pay: splitting
 * goes on only where it pays.
 *
 * One job at a time: a lookup that finds the pool busy (another thread's
 * lookup holds it) does its whole copy itself instead of waiting, so the
 * pool never adds a lock wait to the lookup path.  Workers poll briefly
 * for the next job (decode steps come back to back) and then sleep on a
 * futex, so an idle store costs no CPU.
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "common.h"
#include "pool.h"

/* Polls (~30-60 us) before a worker sleeps.  Short on purpose: a spinning
 * worker on an SMT sibling slows the thread that does the real work. */
#define SPIN_ITERS 2000
/* A wait for workers shorter than this is a part finishing, not a worker
 * descheduled mid-part (a time slice is milliseconds): it never stops the
 * splitting. */
#define WAIT_MIN_NS 100000u
/* A worker that first claims a part this long after the job was posted is
 * late: spinning workers claim within a microsecond, sleeping ones within
 * tens to a few hundred microseconds of the futex wake on a VM; one whose
 * CPU another thread holds waits for a time slice, milliseconds. */
#define LATE_NS 1000000u
/* Jobs refused after the first job that did not pay: a few hundred, so
 * that on a machine whose other CPUs keep getting busy the stalls stay
 * well under one lookup in a hundred (two jobs a lookup). */
#define BACKOFF_MIN 128u
#define BACKOFF_MAX 4096u

/* The claim word: job number | nparts | next part.  Packing the part count
 * with the counter means a worker that claims from a finished job sees
 * that job's own part count, never a newer job's, and stops. */
#define PART_BITS 20
#define PART_MASK ((UINT64_C(1) << PART_BITS) - 1)
#define MAX_PARTS ((size_t)1 << (PART_BITS - 1))

struct engram__pool {
    atomic_flag busy;           /* held by the lookup that owns the current job */
    _Atomic uint32_t gen;       /* bumped to wake workers (futex word) */
    _Atomic uint64_t claim;     /* see above */
    _Atomic size_t done;        /* parts finished in the current job */
    _Atomic(engram__job_fn) fn; /* the current job */
    _Atomic(void *) arg;
    _Atomic int stop;
    _Atomic int sleepers;       /* workers in (or about to enter) futex_wait */
    uint64_t jobs;              /* job counter, owned by the busy holder */
    /* Splitting only where it pays (owned by the busy holder, read by
     * others racily: a stale value only shifts one decision): `skip` jobs
     * are refused (the caller runs them alone) after a job where the
     * workers made the caller wait; `backoff`, the next skip, doubles
     * while they keep doing so. */
    _Atomic uint32_t skip;
    uint32_t backoff;
    uint32_t paid;              /* jobs that paid since the last that did not */
    /* When a worker first claimed a part of the current job (0: none yet):
     * a worker that starts late is a CPU that other work holds. */
    _Atomic uint64_t first_claim_ns;
    int nworkers;
    pid_t pid;                  /* the process whose threads these are */
    pthread_t *threads;
};

static void futex_wait(_Atomic uint32_t *w, uint32_t v)
{
    syscall(SYS_futex, (void *)(uintptr_t)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (void *)(uintptr_t)w, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* Claims and runs parts of the current job until none are left. */
static void run_parts(engram__pool *p)
{
    for (;;) {
        /* Acquire pairs with the caller's release store of the claim word:
         * a part claimed from a live job comes with that job's fn/arg. */
        uint64_t c = atomic_fetch_add_explicit(&p->claim, 1, memory_order_acquire);
        size_t i = (size_t)(c & PART_MASK), n = (size_t)((c >> PART_BITS) & PART_MASK);
        if (i >= n)
            return;
        if (i > 0 && atomic_load_explicit(&p->first_claim_ns, memory_order_relaxed) == 0) {
            /* Relaxed: a time stamp for the caller's policy, read after
             * the job's done count (acquire) orders it. */
            uint64_t zero = 0;
            atomic_compare_exchange_strong_explicit(&p->first_claim_ns, &zero, engram__now_ns(),
                                                    memory_order_relaxed, memory_order_relaxed);
        }
        /* The job cannot finish (nor fn/arg change) before this part is
         * counted done, so these loads see the job that part i belongs to. */
        engram__job_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        fn(atomic_load_explicit(&p->arg, memory_order_relaxed), i, n);
        /* Release: the rows this part copied are visible to the caller once
         * it sees the count. */
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker_main(void *arg)
{
    engram__pool *p = arg;
    /* Not a load of gen: a job or a stop may already have been posted
     * before this thread ran, and it must see that as new.  gen starts 0. */
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS) {
                engram__cpu_relax();
            } else {
                /* Counted before the futex re-checks gen: a poster that
                 * bumps gen and then reads sleepers == 0 is seen here
                 * (futex_wait returns at once); one that reads it later
                 * wakes us.  Both sides are seq_cst. */
                atomic_fetch_add(&p->sleepers, 1);
                futex_wait(&p->gen, seen);
                atomic_fetch_sub(&p->sleepers, 1);
            }
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        run_parts(p);
    }
}

int engram__pool_create(int workers, engram__pool **out)
{
    engram__pool *p = calloc(1, sizeof *p);
    *out = NULL;
    if (!p || !(p->threads = calloc((size_t)workers, sizeof *p->threads))) {
        free(p);
        return engram__err(-ENOMEM, "out of memory for the gather pool");
    }
    atomic_flag_clear(&p->busy);
    p->pid = getpid();
    for (int i = 0; i < workers; i++) {
        int err = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (err != 0) {
            engram__pool_destroy(p);
            return engram__errno(err, "start gather thread %d", i);
        }
        p->nworkers = i + 1;
    }
    *out = p;
    return 0;
}

void engram__pool_destroy(engram__pool *p)
{
    if (!p)
        return;
    if (p->pid == getpid()) {
        atomic_store_explicit(&p->stop, 1, memory_order_release);
        atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
        futex_wake_all(&p->gen);
        for (int i = 0; i < p->nworkers; i++)
            pthread_join(p->threads[i], NULL);
    } /* else: a forked child, whose workers exist only in the parent. */
    free(p->threads);
    free(p);
}

int engram__pool_run(engram__pool *p, engram__job_fn fn, void *arg, size_t nparts)
{
    uint64_t t0, t_mine, t_end;
    uint32_t skip;
    if (nparts > MAX_PARTS)
        nparts = MAX_PARTS;
    /* After fork() the child has no workers: it copies alone.  getpid()
     * costs a system call, paid only by batches big enough to split. */
    if (p->pid != getpid())
        return -EBUSY;
    if ((skip = atomic_load_explicit(&p->skip, memory_order_relaxed)) > 0) {
        /* Relaxed: a count of jobs to skip; concurrent lookups may both
         * take one, which costs nothing but one more job run alone. */
        atomic_store_explicit(&p->skip, skip - 1, memory_order_relaxed);
        return -EBUSY;
    }
    if (atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire))
        return -EBUSY;
    t0 = engram__now_ns();
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->first_claim_ns, 0, memory_order_relaxed);
    p->jobs++;
    /* Release: publishes fn/arg/done with the new claim word. */
    atomic_store_explicit(&p->claim, (p->jobs << (2 * PART_BITS)) | ((uint64_t)nparts << PART_BITS),
                          memory_order_release);
    atomic_fetch_add(&p->gen, 1);
    /* The system call only when a worker sleeps: spinning workers see the
     * new gen by themselves, and a wake costs a few microseconds. */
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all(&p->gen);
    run_parts(p);
    t_mine = engram__now_ns();
    /* Only parts that a worker claimed can still be running.  Their rows
     * go to the caller's output, so the caller must not return before
     * they are done, however long a descheduled worker takes. */
    while (atomic_load_explicit(&p->done, memory_order_acquire) != nparts)
        engram__cpu_relax();
    t_end = engram__now_ns();
    /* Splitting pays when the workers take parts without making the
     * caller wait for them.  A wait of more than a quarter of the job
     * (and more than WAIT_MIN_NS) means a worker was descheduled mid-part (a busy machine: another
     * process on the other CPU): then the next jobs run alone, for a
     * number of jobs that doubles (16 .. 4096) while splitting keeps not
     * paying, so that the pool adds no tail latency on a loaded machine
     * and comes back once it is quiet. */
    {
        uint64_t claim = atomic_load_explicit(&p->first_claim_ns, memory_order_relaxed);
        int stalled = t_end - t_mine > WAIT_MIN_NS && (t_end - t_mine) * 4 > t_end - t0;
        /* A worker that claimed its first part long after the job was
         * posted (or never did, in a job long enough for it to) shared its
         * CPU with other work: splitting then risks the stall above. */
        int late = claim ? claim - t0 > LATE_NS : t_mine - t0 > LATE_NS;
        if (stalled || late) {
            p->backoff = p->backoff ? (p->backoff < BACKOFF_MAX ? p->backoff * 2 : BACKOFF_MAX)
                                 : BACKOFF_MIN;
            p->paid = 0;
            atomic_store_explicit(&p->skip, p->backoff, memory_order_relaxed);
        } else if (++p->paid == 8) {
            /* Eight jobs in a row that paid: the next stall backs off
             * half as long.  The memory of a busy machine fades slowly,
             * since one job that happens to pay says little. */
            p->backoff /= 2;
            p->paid = 0;
        }
    }
    atomic_flag_clear_explicit(&p->busy, memory_order_release);
    return 0;
}
