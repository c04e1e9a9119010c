/*
 * kv_mem.h - kv.h's interface kept in the memory of the test process:
 * the reference implementation the publication protocol (publish.c) is
 * tested against besides a Redis Cluster (tests/test_publish.c).
 *
 * Records and pieces live in two sorted arrays behind one mutex, so
 * every operation is atomic, as kv.h requires of a store.  A piece has
 * an expiry on CLOCK_REALTIME (the clock now_ms() gives, as a store's
 * clock is the same for every party); an expired piece is absent to
 * every operation, and is dropped the first time one meets it.  There
 * are no replicas: sync() returns 0 at once.  Every failure sets its
 * message (engram__err(), naming "kv_mem").
 *
 * Tests may look inside: the records and live pieces it holds, in all.
 */
#ifndef ENGRAM_TEST_KV_MEM_H
#define ENGRAM_TEST_KV_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"
#include "kv.h"

typedef struct kvm kvm;

/* The operations; their `kv` is a kvm. */
extern const engram__kv_vt kvm_vt;

/* An empty store, or NULL when out of memory. */
kvm *kvm_new(void);
void kvm_free(kvm *m);

/* One live piece, as kvm_list_pieces() reports it. */
typedef struct kvm_piece_info {
    char name[ENGRAM_NAME_MAX + 1];
    uint64_t epoch;
    int layout;
    uint64_t index;
    size_t len;
    uint64_t expires_ms; /* 0: never */
} kvm_piece_info;

/* The number of records. */
size_t kvm_records(kvm *m);
/* The number of live (unexpired) pieces. */
size_t kvm_pieces(kvm *m);
/* Copies up to cap live pieces into out (in name, epoch, layout, index
 * order) and returns how many there are in all. */
size_t kvm_list_pieces(kvm *m, kvm_piece_info *out, size_t cap);

#endif
