/*
 * pool.c - the small persistent thread pool that splits big lookups.
 *
 * One job at a time: a lookup that finds the pool busy (another thread's
 * lookup holds it) does its whole copy itself instead of waiting, so the
 * pool never adds a lock wait to the lookup path.  Workers spin briefly
 * for the next job (decode steps come back to back) and then sleep on a
 * futex, so an idle store costs no CPU.
 */
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "store.h"

#define SPIN_ITERS 20000 /* ~20-50 us of polling before a worker sleeps */

struct engram__pool {
    atomic_flag busy;         /* held by the lookup that owns the current job */
    _Atomic uint32_t gen;     /* bumped to publish a job (futex word) */
    _Atomic uint32_t pending; /* parts not yet finished by workers */
    _Atomic int stop;
    engram__job_fn fn;
    void *arg;
    size_t nparts;
    int nworkers;
    pid_t pid; /* the process whose threads these are */
    pthread_t *threads;
};

typedef struct worker_arg {
    engram__pool *p;
    size_t index; /* 1..nworkers: the part this worker runs */
} worker_arg;

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *w, uint32_t v)
{
    syscall(SYS_futex, (void *)(uintptr_t)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (void *)(uintptr_t)w, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static void *worker_main(void *a)
{
    worker_arg wa = *(worker_arg *)a;
    engram__pool *p = wa.p;
    uint32_t seen = 0;
    free(a);
    for (;;) {
        uint32_t g;
        int spins = 0;
        /* Acquire pairs with the release increment in engram__pool_run: the
         * job fields written before it are visible after it. */
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS)
                cpu_relax();
            else
                futex_wait(&p->gen, seen);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        if (wa.index < p->nparts)
            p->fn(p->arg, wa.index, p->nparts);
        /* Release: the rows this part copied are visible to the caller once
         * it sees pending reach zero. */
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
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
        worker_arg *wa = malloc(sizeof *wa);
        int err;
        if (!wa) {
            engram__pool_destroy(p);
            return engram__err(-ENOMEM, "out of memory for the gather pool");
        }
        wa->p = p;
        wa->index = (size_t)i + 1;
        if ((err = pthread_create(&p->threads[i], NULL, worker_main, wa)) != 0) {
            free(wa);
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
    if (p->pid != getpid()) {
        /* A forked child: the workers exist only in the parent. */
        free(p->threads);
        free(p);
        return;
    }
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    futex_wake_all(&p->gen);
    for (int i = 0; i < p->nworkers; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}

int engram__pool_run(engram__pool *p, engram__job_fn fn, void *arg, size_t nparts)
{
    if (nparts > (size_t)p->nworkers + 1)
        nparts = (size_t)p->nworkers + 1;
    /* After fork() the child has no workers: it copies alone.  getpid()
     * costs a system call, paid only by batches big enough to split. */
    if (p->pid != getpid())
        return -EBUSY;
    if (atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire))
        return -EBUSY;
    p->fn = fn;
    p->arg = arg;
    p->nparts = nparts;
    atomic_store_explicit(&p->pending, (uint32_t)p->nworkers, memory_order_relaxed);
    /* Release: publishes fn/arg/nparts/pending to the workers. */
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    futex_wake_all(&p->gen);
    fn(arg, 0, nparts);
    /* Every worker acknowledges every job (idle ones at once), so the job
     * fields are not reused while a late worker still reads them. */
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        cpu_relax();
    atomic_flag_clear_explicit(&p->busy, memory_order_release);
    return 0;
}
