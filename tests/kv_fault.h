/*
 * kv_fault.h - a decorator of any kv.h implementation that forwards
 * every operation to it, except where a test armed a fault: the
 * failures a network and a killed process cause, made to order, so
 * that the publication protocol (publish.c) can be driven through each
 * of them deterministically (tests/test_publish.c).
 *
 * Faults (each fires once, on the first operation it matches; several
 * armed fire one after another, in the order armed: only the first not
 * yet fired is matched, so "defer the publication, then lose the next
 * swap" means the swap after the publication):
 *  - fail:  the operation fails before it is forwarded (-ETIMEDOUT):
 *           nothing happened;
 *  - lost:  it is forwarded, then its result is replaced by -ETIMEDOUT:
 *           it happened, and its reply was lost;
 *  - defer: it is saved, not forwarded, and fails with -ETIMEDOUT; the
 *           test lands it later with kvf_release(): a copy of a command
 *           still in flight (a stalled server) that runs late.  Only
 *           writes can be deferred.
 * and kvf_kill_after(n): the next n operations are forwarded, every one
 * after them fails (-ECONNRESET) until kvf_revive(): a writer killed at
 * its step n.  A fault armed with then_kill kills the same way once it
 * fired.  Sessions (sess_get/sess_put) are always forwarded and count as
 * no operation.
 *
 * The decorator records every piece any operation wrote (forwarded or
 * released), so that a test can ask the wrapped implementation itself,
 * afterwards, which of them still exist; and keeps a trace of the
 * operations that reached the store, in the order they were sent, so
 * that a test can check the order of a protocol's steps (a sync between
 * two of them: what no store without replicas can show otherwise).  A failed operation's *res is
 * set to a value no store answers, so that a caller that reads it after a
 * failure is caught.  Thread-safe.
 */
#ifndef ENGRAM_TEST_KV_FAULT_H
#define ENGRAM_TEST_KV_FAULT_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"
#include "kv.h"
#include "publish.h"

/* What *res holds after a rec_cas() that failed. */
#define KVF_NO_ANSWER 0x7e57

/* The operations, as faults match them. */
enum kvf_op {
    KVF_ANY,
    KVF_REC_GET,
    KVF_REC_CAS,
    KVF_REC_LIST,
    KVF_NOW_MS,
    KVF_SYNC,
    KVF_PIECE_PUT,
    KVF_PIECE_EXPIRE,
    KVF_PIECE_DEL,
    KVF_GET_RANGES,
    KVF_OPS
};

typedef struct kvf_match {
    int op;             /* enum kvf_op */
    const char *prefix; /* rec_cas only: its new value starts with these bytes (NULL: any) */
    int del;            /* rec_cas only: 1: only a compare-and-delete (no new value) */
    unsigned skip;      /* let this many matching operations through first */
    int then_kill;      /* once fired, every later operation fails until kvf_revive() */
} kvf_match;

/* One operation that reached the store (forwarded, or lost after). */
typedef struct kvf_event {
    int op;            /* enum kvf_op */
    void *s;           /* the session */
    char name[ENGRAM_NAME_MAX + 1]; /* the record's, or the pieces' */
    uint64_t epoch;    /* pieces: theirs */
    uint64_t index;    /* piece_put, piece_expire: the piece; piece_del: n */
    uint32_t ttl_ms;   /* piece_put, piece_expire */
    int del;           /* rec_cas: a compare-and-delete */
    char head[40];     /* rec_cas: the first bytes of its new value, NUL-terminated */
} kvf_event;

typedef struct kvf kvf;

/* A decorator of the implementation of `inner` (its vt and kv, which
 * must outlive it), and *out: a copy of *inner whose vt and kv are the
 * decorator's.  NULL when out of memory. */
kvf *kvf_new(const engram__pub *inner, engram__pub *out);
/* Frees it; operations still deferred are dropped, never forwarded. */
void kvf_free(kvf *f);

void kvf_fail(kvf *f, kvf_match m);
void kvf_lost(kvf *f, kvf_match m);
void kvf_defer(kvf *f, kvf_match m);
void kvf_kill_after(kvf *f, unsigned n);
/* Ends a kill; forgets the faults armed and not fired. */
void kvf_revive(kvf *f);

/* Faults fired since kvf_new(). */
unsigned kvf_fired(kvf *f);
/* Armed faults not fired yet. */
unsigned kvf_armed(kvf *f);
/* Operations a kill refused since the last kvf_kill_after() (or the
 * last fault with then_kill that fired). */
unsigned kvf_killed(kvf *f);
/* Operations forwarded of kind op (KVF_ANY: all) since kvf_new(). */
unsigned long kvf_count(kvf *f, int op);
/* Deferred operations not released yet. */
size_t kvf_deferred(kvf *f);
/* Forwards the oldest deferred operation to the wrapped implementation
 * now, on a session of the calling thread: its result (*res: rec_cas's
 * answer, else ENGRAM__KV_DONE), or -ENOENT if none is deferred. */
int kvf_release(kvf *f, int *res);

/* The operations that reached the store since the last
 * kvf_trace_clear() (or kvf_new()): *n of them, in a copy the caller
 * frees. */
kvf_event *kvf_trace(kvf *f, size_t *n);
void kvf_trace_clear(kvf *f);

/* How many of the pieces of table `name` ever written through the
 * decorator, of any epoch but keep_epoch (0: of every epoch), are still
 * there, asked of the wrapped implementation (a 1-byte read of each):
 * the count, or the failure of a read that says nothing. */
long kvf_pieces_left(kvf *f, const char *name, uint64_t keep_epoch);
/* How many of the pieces ever written through the decorator are still
 * there, of those keep(ud, name, epoch) does not claim (returns 0 for):
 * the count, or the failure of a read. */
long kvf_pieces_left_unless(kvf *f, int (*keep)(void *ud, const char *name, uint64_t epoch),
                            void *ud);

#endif
