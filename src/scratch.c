/*
 * scratch.c - per-thread scratch buffers of the lookup path.
 *
 * A lookup needs room proportional to its batch (its plan, the rows it
 * hands to row sources, their deduplication).  Allocating it per call
 * would put malloc on the hot path; instead each thread keeps one buffer
 * per use, grown the first time a batch needs more and kept for the
 * thread's later lookups.  A thread-exit destructor frees them.
 */
#include <pthread.h>
#include <stdlib.h>

#include "common.h"

static pthread_key_t keys[ENGRAM__SCRATCH_KINDS];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
static _Thread_local void *bufs[ENGRAM__SCRATCH_KINDS];
static _Thread_local size_t sizes[ENGRAM__SCRATCH_KINDS];

/* At thread exit: frees the thread's buffers and forgets them, for a
 * lookup that a later key destructor of the same thread might still make
 * (it then allocates again, and that buffer is freed at the next round
 * of destructors). */
static void scratch_free(void *p)
{
    for (int i = 0; i < ENGRAM__SCRATCH_KINDS; i++) {
        if (bufs[i] == p) {
            bufs[i] = NULL;
            sizes[i] = 0;
        }
    }
    free(p);
}

static void keys_init(void)
{
    for (int i = 0; i < ENGRAM__SCRATCH_KINDS; i++)
        (void)pthread_key_create(&keys[i], scratch_free);
}

void *engram__scratch(int which, size_t size)
{
    if (size > sizes[which]) {
        void *v;
        pthread_once(&keys_once, keys_init);
        /* Not realloc: the old contents are not wanted, and a copy of a
         * large buffer would cost more than the call that grows it. */
        free(bufs[which]);
        bufs[which] = NULL;
        sizes[which] = 0;
        pthread_setspecific(keys[which], NULL);
        if (!(v = malloc(size)))
            return NULL;
        bufs[which] = v;
        sizes[which] = size;
        pthread_setspecific(keys[which], v);
    }
    return bufs[which];
}
