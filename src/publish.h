/*
 * publish.h - the publication protocol of a remote namespace, written
 * once over the key-value interface of kv.h (internal).
 *
 * Every remote store's tables are published, read, removed and
 * collected by these functions; a store gives them its kv.h functions and
 * state in an engram__pub.  docs/format.md ("The publication protocol")
 * is the specification; publish.c's opening comment maps it to the code.
 */
#ifndef ENGRAM_PUBLISH_H
#define ENGRAM_PUBLISH_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"
#include "kv.h"
#include "redis/manifest.h"
#include "remote.h"

typedef struct engram__pub {
    const engram__kv_vt *vt;
    void *kv;
    const char *where;    /* the namespace, for messages ("redis://nodes/ns") */
    uint64_t chunk_bytes; /* a new push's chunk size (rows per chunk are rounded down) */
    uint32_t ttl_ms;      /* a running push's pieces expire this long after it shows life */
    int layout;           /* a new push's piece layout (kv.h) */
    /* May be NULL: called after a table was published or unpublished. */
    void (*changed)(void *ud);
    void *ud;
} engram__pub;

/* The manifest of table `name`: 0 and *m (engram__rmanifest_free()),
 * -ENOENT (also while it is being pushed), or the failure.  With raw, the
 * record's bytes are kept in *raw / *rawlen (the caller frees them) also
 * when they are corrupt. */
int engram__pub_manifest(const engram__pub *p, void *s, const char *name, engram__rmanifest *m,
                         char **raw, size_t *rawlen);
/* Calls add(ud, name) for every published table. */
int engram__pub_list(const engram__pub *p, int (*add)(void *ud, const char *name), void *ud);
/* Every published table's manifest, for each(ud, m) (the sizes of a
 * namespace); stops at its first nonzero return. */
int engram__pub_manifests(const engram__pub *p, void *s,
                          int (*each)(void *ud, const engram__rmanifest *m), void *ud);
/* Reads table `name` whole into the sink (remote.h), each chunk checked
 * against the manifest before it goes. */
int engram__pub_read_all(const engram__pub *p, const char *name, const engram__remote_sink *k);
/* Compare-and-delete of the manifest read, then its pieces. */
int engram__pub_remove(const engram__pub *p, const char *name, int *unpublished);
/* Settles what dead pushes and removals left (engram_store_gc()). */
int engram__pub_gc(const engram__pub *p, uint64_t idle_ms, uint32_t flags,
                   engram_gc_report_fn report, void *ud);

/* A push (remote.h's writer functions). */
int engram__pub_writer_begin(const engram__pub *p, const char *name,
                             const engram_table_spec *spec, void **w);
int engram__pub_writer_append(void *w, const void *rows, uint64_t nrows, size_t src_stride);
int engram__pub_writer_commit(void *w);
void engram__pub_writer_abort(void *w);

/* Tests only (they link the static library): called, if set, at the
 * named steps of a push ("begin", "chunk", "persist", "publish",
 * "resolve") and of a removal ("remove", "unpublished") of table `name`,
 * on the calling thread, so that a test can stall a store or inject a
 * fault there. */
extern void (*engram__pub_hook)(const char *step, const char *name);

/* Tests only: the protocol's view of a store opened with
 * engram_store_open_redis() (NULL for any other store, or in a build
 * without Redis), valid while the store is open. */
const engram__pub *engram__redis_pub(engram_store *st);

#endif
