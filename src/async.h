/*
 * async.h - the store's lookup threads for engram_lookup_submit() and
 * engram_ngram_lookup_submit() (internal; see async.c).
 *
 * What it does not own: the lookup itself (gather.c), the hash (ngram.c).
 */
#ifndef ENGRAM_ASYNC_H
#define ENGRAM_ASYNC_H

#include "engram.h"

struct engram__async;

/* At engram_store_close(): cancels the submitted lookups no thread took
 * (ENGRAM_ESTATE at their wait), waits for the running ones, and stops
 * the threads.  Nothing if none were started (in this process). */
void engram__async_stop(engram_store *st);

/* The columns of a hasher's layers (ngram.c). */
size_t engram__ngram_cols(const engram_ngram_hasher *h);

#endif
