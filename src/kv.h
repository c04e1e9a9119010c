/*
 * kv.h - the key-value interface a remote store gives the publication
 * protocol (publish.c), and nothing more (internal).
 *
 * A namespace in a remote store is two kinds of values:
 *
 *  - records: one small value per table name, which holds either the
 *    table's manifest (published) or a pending record (a push under way,
 *    or pieces to delete).  Each record changes only by one atomic
 *    compare-and-swap, which also serves as put-if-absent (nothing
 *    expected) and as compare-and-delete (nothing put);
 *  - pieces: the chunks of a publication, named by (table name, epoch,
 *    index), written once, with an expiry while their push runs; read by
 *    ranges.
 *
 * Everything the protocol guarantees (docs/format.md, "The publication
 * protocol") follows from those two atomic operations on one record and
 * from pieces never being reused: a store that implements them can hold
 * tables.  An implementation (src/redis/kv.c for a Redis Cluster) sets
 * the message of every failure (engram__err) and names itself in it; a
 * failure of an operation that writes says nothing of whether it took
 * effect (its reply may have been lost), which is what the protocol is
 * built for; nor does an answer of a compare-and-swap other than "done"
 * (a client that sends a write again after a lost connection gets the
 * answer of the copy that ran second), which the protocol checks by
 * reading the record back.
 *
 * Every operation runs on a session (sess_get), a connection of the
 * calling thread; sync waits until what that session wrote since its last
 * sync is on the store's replicas (0 at once where it has none).
 */
#ifndef ENGRAM_KV_H
#define ENGRAM_KV_H

#include <stddef.h>
#include <stdint.h>

/* The pieces of one publication. */
typedef struct engram__kv_piece {
    const char *name; /* the table's */
    uint64_t epoch;   /* the publication's, never 0 */
    int layout;       /* the implementation's placement of them (a manifest field) */
} engram__kv_piece;

/* One ranged read of a piece: len bytes at start of piece `index`, into
 * dst.  With whole, the range must end the piece (a longer piece fails as
 * a shorter one does). */
typedef struct engram__kv_range {
    uint64_t index;
    uint64_t start;
    unsigned char *dst;
    uint32_t len;
    int whole;
} engram__kv_range;

/* The answers of rec_cas(). */
#define ENGRAM__KV_DONE 1     /* swapped (or put, or deleted) */
#define ENGRAM__KV_ABSENT 0   /* nothing there, though something was expected */
#define ENGRAM__KV_PRESENT 2  /* put-if-absent: something is there */
#define ENGRAM__KV_DIFFERS -1 /* the record holds other bytes than expected */

typedef struct engram__kv_vt {
    /* A session of the calling thread: 0 and *s, or the failure. */
    int (*sess_get)(void *kv, void **s);
    void (*sess_put)(void *kv, void *s);

    /* ---- records ---- */

    /* The record `name`: 0 and *val (malloc'd, NUL after its len bytes,
     * the caller frees it), -ENOENT, or the failure. */
    int (*rec_get)(void *kv, void *s, const char *name, char **val, size_t *len);
    /* One atomic step on record `name`: if it holds exactly `expect`
     * (elen bytes; expect NULL: if it does not exist), it then holds
     * `val` (vlen bytes; val NULL: it is deleted; not both NULL).  *res is one of the
     * answers above.  Expecting the very bytes it puts writes them again,
     * so that a sync covers them (whoever wrote them first). */
    int (*rec_cas)(void *kv, void *s, const char *name, const char *expect, size_t elen,
                   const char *val, size_t vlen, int *res);
    /* Calls each(ud, name, val, len) for every record, in no order; stops
     * at its first nonzero return, which it returns. */
    int (*rec_list)(void *kv, void *s,
                    int (*each)(void *ud, const char *name, const char *val, size_t len),
                    void *ud);
    /* The store's clock, in ms since the Unix epoch: every party stamps
     * records and measures their age on it. */
    int (*now_ms)(void *kv, void *s, uint64_t *ms);
    /* Waits until this session's writes are on the replicas. */
    int (*sync)(void *kv, void *s);

    /* ---- pieces ---- */

    /* Writes piece `index` (len bytes) to expire in ttl_ms (above 0). */
    int (*piece_put)(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                     const void *data, size_t len, uint32_t ttl_ms);
    /* Sets piece `index` to expire in ttl_ms (0: never): 0, -ENODATA if
     * it is gone (expired or deleted), or the failure. */
    int (*piece_expire)(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                        uint32_t ttl_ms);
    /* Deletes pieces [0, n) (missing ones are no failure): 0, or the
     * first failure (the rest are still tried). */
    int (*piece_del)(void *kv, void *s, const engram__kv_piece *pc, uint64_t n);
    /* Reads n ranges (of `bytes` bytes in all) at once: 0, -ENODATA if a
     * piece is missing or of another length, or the failure. */
    int (*get_ranges)(void *kv, void *s, const engram__kv_piece *pc, const engram__kv_range *r,
                      size_t n, uint64_t bytes);

    /* ---- optional (NULL: rec_list serves) ---- */

    /* rec_list() for a gc, which needs the values of pending records
     * only: the others may come cut to their first line (what says their
     * kind), so that a namespace's manifests do not cross the network. */
    int (*rec_list_pending)(void *kv, void *s,
                            int (*each)(void *ud, const char *name, const char *val, size_t len),
                            void *ud);
} engram__kv_vt;

#endif
