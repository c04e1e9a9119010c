/*
 * plancache.h - the plan cache: the state a context keeps for
 * engram_cuda_lookup_tables() and engram_cuda_order_after() (plancache.c),
 * embedded in the context (ctx.h) (internal, C only).
 *
 * Locking: `lock` guards the entry table only.  It is held to find an
 * entry and read its plan, and to insert an entry or replace its plan;
 * never while a plan is created (allocations, uploads, syncs: milliseconds)
 * and never across a launch.  That is safe because a plan of the plan cache is
 * never destroyed before the context closes: a plan read under the lock
 * stays valid after it is released, even if another thread replaces it in
 * its entry meanwhile (the replaced plan is retired: it stays in the
 * context's plan list, freed by engram_cuda_close()).  `wait_lock` makes
 * an event record and the wait for it one step, so that two threads'
 * orderings do not wait for each other's records.  Neither lock is held
 * while the other or the context's own locks are taken.
 */
#ifndef ENGRAM_CUDA_PLANCACHE_H
#define ENGRAM_CUDA_PLANCACHE_H

#include <pthread.h>

#include <cuda_runtime_api.h>

typedef struct engram__cuda_entry engram__cuda_entry;

typedef struct engram__cuda_plancache {
    pthread_mutex_t lock;
    engram__cuda_entry **entries; /* [n], under lock; entries never move or go before close */
    size_t n, cap;
    size_t last; /* the entry of the last hit, tried first */
    pthread_mutex_t wait_lock;
    cudaEvent_t wait_ev; /* engram_cuda_order_after()'s, made on first use; under wait_lock */
} engram__cuda_plancache;

struct engram_cuda_ctx;

/* Sets up an empty plan cache; frees it (entries and event: with the context's
 * device current, before the plans are destroyed). */
void engram__cuda_plancache_init(engram__cuda_plancache *k);
void engram__cuda_plancache_fini(engram__cuda_plancache *k);

#endif
