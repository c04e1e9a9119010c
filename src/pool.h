/*
 * pool.h - the small persistent thread pool that splits big lookups
 * (internal; see pool.c).
 */
#ifndef ENGRAM_POOL_H
#define ENGRAM_POOL_H

#include <stddef.h>

typedef struct engram__pool engram__pool;

/* Runs fn(arg, part, nparts) for part < nparts, the caller running part
 * 0.  Returns -EBUSY at once if another lookup holds the pool, or while
 * the pool refuses jobs after one where workers made the caller wait (the
 * caller then does the whole job itself). */
typedef void (*engram__job_fn)(void *arg, size_t part, size_t nparts);
int engram__pool_create(int workers, engram__pool **out);
void engram__pool_destroy(engram__pool *p);
int engram__pool_run(engram__pool *p, engram__job_fn fn, void *arg, size_t nparts);

#endif
