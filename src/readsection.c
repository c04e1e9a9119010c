/*
 * readsection.c - read sections (see readsection.h).
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "readsection.h"

#if defined(__SANITIZE_THREAD__)
#define RSEC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RSEC_TSAN 1
#endif
#endif

_Thread_local engram__rsec *engram__rsec_self __attribute__((tls_model("initial-exec")));
int engram__rsec_fence = 1;

static engram__rsec *_Atomic head;
static _Atomic unsigned fence_word;
static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static long membarrier(int cmd)
{
    return syscall(__NR_membarrier, cmd, 0, 0);
}

/* At thread exit: the record goes back to the list's free records. */
static void rsec_release(void *p)
{
    engram__rsec *r = p;
    engram__rsec_self = NULL;
    if (r->depth) { /* left by pthread_exit() from inside a section */
        r->depth = 0;
        atomic_store_explicit(&r->seq, atomic_load_explicit(&r->seq, memory_order_relaxed) + 1,
                              memory_order_release);
    }
    atomic_store_explicit(&r->used, 0, memory_order_release);
}

/* In a forked child only the forking thread lives: every other record is
 * closed (a thread forked away mid-lookup would otherwise hold every
 * later removal) and free for the child's new threads. */
static void rsec_atfork_child(void)
{
    engram__rsec *self = engram__rsec_self;
    for (engram__rsec *r = atomic_load_explicit(&head, memory_order_acquire); r;
         r = atomic_load_explicit(&r->next, memory_order_acquire)) {
        if (r == self)
            continue;
        if (atomic_load_explicit(&r->seq, memory_order_relaxed) & 1)
            atomic_store_explicit(&r->seq, atomic_load_explicit(&r->seq, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
        r->depth = 0;
        atomic_store_explicit(&r->used, 0, memory_order_relaxed);
    }
}

static void rsec_init(void)
{
    long cmds;
    (void)pthread_key_create(&key, rsec_release);
    (void)pthread_atfork(NULL, NULL, rsec_atfork_child);
#ifndef RSEC_TSAN
    /* The light entry needs the expedited private membarrier (Linux 4.14);
     * registering it here, before any section is entered, makes the choice
     * once for the whole process. */
    cmds = membarrier(MEMBARRIER_CMD_QUERY);
    if (cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
        membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0)
        engram__rsec_fence = 0;
#else
    (void)cmds;
#endif
}

engram__rsec *engram__rsec_make(void)
{
    engram__rsec *r, *h;
    pthread_once(&once, rsec_init);
    /* A record a finished thread left, else a new one. */
    for (r = atomic_load_explicit(&head, memory_order_acquire); r;
         r = atomic_load_explicit(&r->next, memory_order_acquire)) {
        int free_rec = 0;
        if (atomic_load_explicit(&r->used, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong_explicit(&r->used, &free_rec, 1, memory_order_acquire,
                                                    memory_order_relaxed))
            break;
    }
    if (!r) {
        if (!(r = aligned_alloc(ENGRAM__CACHELINE, sizeof *r)))
            return NULL;
        atomic_init(&r->seq, 0);
        r->depth = 0;
        atomic_init(&r->used, 1);
        h = atomic_load_explicit(&head, memory_order_relaxed);
        do
            atomic_store_explicit(&r->next, h, memory_order_relaxed);
        /* Sequentially consistent: the record is in the list before its
         * owner's first section can begin. */
        while (!atomic_compare_exchange_weak_explicit(&head, &h, r, memory_order_seq_cst,
                                                      memory_order_relaxed));
    }
    if (pthread_setspecific(key, r) != 0) {
        atomic_store_explicit(&r->used, 0, memory_order_release);
        return NULL;
    }
    engram__rsec_self = r;
    return r;
}

/* Makes every thread's section entries so far visible to this one. */
static int barrier_all(void)
{
    if (engram__rsec_fence) {
        /* Pairs with the entry's locked exchange (a read-modify-write
         * rather than a fence, as there). */
        atomic_fetch_add_explicit(&fence_word, 1, memory_order_seq_cst);
        return 0;
    }
    if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
        return 0;
    /* A forked child may need its own registration. */
    if (errno == EPERM && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
        membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
        return 0;
    return membarrier(MEMBARRIER_CMD_GLOBAL) == 0 ? 0 : -ENOSYS;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int engram__rsec_sync(uint64_t timeout_ns)
{
    engram__rsec *self = engram__rsec_self;
    uint64_t deadline;
    if (self && self->depth)
        return -EDEADLK;
    pthread_once(&once, rsec_init);
    if (barrier_all() != 0)
        return -ENOSYS;
    deadline = now_ns() + timeout_ns;
    for (engram__rsec *r = atomic_load_explicit(&head, memory_order_acquire); r;
         r = atomic_load_explicit(&r->next, memory_order_acquire)) {
        /* Acquire pairs with the release store of a leaving section. */
        uint64_t seq = atomic_load_explicit(&r->seq, memory_order_acquire);
        unsigned spins = 0;
        long sleep_ns = 20000;
        if (!(seq & 1))
            continue;
        while (atomic_load_explicit(&r->seq, memory_order_acquire) == seq) {
            if (now_ns() >= deadline)
                return -ETIMEDOUT;
            if (spins < 64) {
                spins++;
                engram__cpu_relax();
            } else if (spins < 80) {
                spins++;
                sched_yield();
            } else {
                struct timespec ts = {0, sleep_ns};
                nanosleep(&ts, NULL);
                if (sleep_ns < 1000000)
                    sleep_ns *= 2;
            }
        }
    }
    return 0;
}
