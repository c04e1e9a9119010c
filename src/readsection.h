/*
 * readsection.h - read sections: when nothing can still be reading a
 * removed table (internal).  Its functions go by engram__rsec_ (read
 * section); it has nothing to do with Redis.
 *
 * engram_remove() unpublishes a table at once, but a lookup that started
 * before may still be copying its rows, and the stats, info and
 * engram_table_memory() read its source without the store lock.  Each of
 * them runs inside a read section; engram__rsec_sync() waits until every
 * section open when it was called has closed.  After that no thread can
 * reach the removed table's source any more (every later reader sees it
 * removed first), and store.c releases it: the mapping, the file, the row
 * cache.
 *
 * The section is one counter per thread, odd while inside: entering is a
 * plain store of this thread's own counter and leaving a release store,
 * with no locked instruction and no shared cache line on the lookup path.
 * The store-then-load order that entering needs (the counter store must be
 * visible before the section reads the removed flags) is made by the
 * waiter instead: membarrier(2) makes every thread of the process pass a
 * full barrier, so a reader either shows up as inside or sees the removal
 * (the asymmetric fence of userspace RCU's membarrier flavour).  Where
 * membarrier is unavailable, and under ThreadSanitizer (which cannot see
 * it), entering pays a full fence instead.
 *
 * Records are never freed: a thread's record goes back to a free list at
 * its exit and is taken by the next new thread, so the waiter can walk the
 * list without a lock.  After fork() the child's other threads are gone:
 * their records are closed and freed.
 */
#ifndef ENGRAM_READSECTION_H
#define ENGRAM_READSECTION_H

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common.h"

typedef struct engram__rsec {
    _Atomic uint64_t seq;             /* odd while the owner is inside a section */
    unsigned depth;                   /* nesting; only the owner reads it */
    atomic_int used;                  /* owned by a live thread */
    struct engram__rsec *_Atomic next; /* the process's list, append-only */
} __attribute__((aligned(ENGRAM__CACHELINE))) engram__rsec;

extern _Thread_local engram__rsec *engram__rsec_self __attribute__((tls_model("initial-exec")));
/* 1 when entering needs a full fence (no membarrier, or ThreadSanitizer). */
extern int engram__rsec_fence;

/* This thread's record, made on first use; NULL without memory. */
engram__rsec *engram__rsec_make(void);

/* Enters a read section (sections nest): 0, or -ENOMEM (reported) when
 * this thread's record cannot be made. */
static inline int engram__rsec_enter(void)
{
    engram__rsec *r = engram__rsec_self;
    if (ENGRAM__UNLIKELY(!r) && !(r = engram__rsec_make()))
        return engram__err(-ENOMEM, "out of memory for this thread's read section");
    if (r->depth++ == 0) {
        uint64_t seq = atomic_load_explicit(&r->seq, memory_order_relaxed) + 1;
        if (ENGRAM__LIKELY(!engram__rsec_fence)) {
            atomic_store_explicit(&r->seq, seq, memory_order_relaxed);
            atomic_signal_fence(memory_order_seq_cst);
        } else {
            /* A locked exchange: the full fence (ThreadSanitizer models
             * read-modify-writes, not fences). */
            atomic_exchange_explicit(&r->seq, seq, memory_order_seq_cst);
        }
    }
    return 0;
}

/* Leaves the section entered last by this thread. */
static inline void engram__rsec_exit(void)
{
    engram__rsec *r = engram__rsec_self;
    if (--r->depth == 0)
        /* Release: the waiter that sees the new count sees every read of
         * the section done. */
        atomic_store_explicit(&r->seq, atomic_load_explicit(&r->seq, memory_order_relaxed) + 1,
                              memory_order_release);
}

/* Waits until every read section of the process that was open at the call
 * has closed, for at most timeout_ns.  Call it after making the removal
 * visible.  0; -ETIMEDOUT; -EDEADLK if the caller is inside a section
 * itself (from a source's read_rows); -ENOSYS if the process cannot make
 * the other threads' entries visible.  Reports nothing. */
int engram__rsec_sync(uint64_t timeout_ns);

#endif
