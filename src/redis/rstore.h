/*
 * rstore.h - the inside of a store on a Redis Cluster, shared by the
 * files of src/redis/ that make it (internal): redis.c opens the store,
 * source.c its tables' row source, kv.c the key-value store that the
 * publication protocol (publish.c) writes, reads, removes and collects
 * tables through, over keys.c (keys and small commands).
 */
#ifndef ENGRAM_REDIS_RSTORE_H
#define ENGRAM_REDIS_RSTORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "engram.h"
#include "manifest.h"
#include "publish.h"
#include "remote.h"

#define KEY_MAX 600

typedef struct rstore {
    engram__rcl *cl;
    char ns[ENGRAM_NAME_MAX + 1];
    char prefix[ENGRAM_NAME_MAX + 1];
    char mkey[2 * ENGRAM_NAME_MAX + 16]; /* the manifests' hash */
    size_t mkey_len;
    uint16_t mslot; /* its slot */
    char *where; /* "redis://nodes/ns", for messages */
    uint64_t chunk_bytes;
    uint32_t ttl_ms;
    int tagged;
    pthread_mutex_t lock;
    int have_ns_bytes; /* ns_bytes known (lock) */
    uint64_t ns_bytes; /* bytes of the namespace's tables, for the cache's share rule */
    engram_store *near;    /* the local copies' namespace (local_root), or NULL */
    uint64_t local_tables; /* tables opened from their copy there (lock) */
    engram_origin origin;  /* what its tables report as their origin, less the epoch */
    engram__pub pub;       /* the publication protocol over this store (kv.c) */
} rstore;

/* A table open for lookups: the table_ud of its requests. */
typedef struct rtable {
    rstore *rs;
    engram__rmanifest m;
    char kpre[KEY_MAX];
    uint32_t kpre_len;
    uint16_t *slots; /* [nchunks] (spread) or [1] (tagged) */
} rtable;

/* The functions these files share go by their short names here; the
 * linker sees them prefixed, so that nothing the static library holds can
 * collide with a program's own names. */
#define chunk_prefix engram__redis_chunk_prefix
#define chunk_key engram__redis_chunk_key
#define chunk_slot engram__redis_chunk_slot
#define key_cmd engram__redis_key_cmd
#define delete_chunks engram__redis_delete_chunks
#define manifest_info engram__redis_manifest_info
#define redis_open engram__redis_open
#define redis_info engram__redis_info
#define redis_list engram__redis_list
#define redis_read_all engram__redis_read_all
#define redis_remove engram__redis_remove
#define redis_gc engram__redis_gc
#define redis_writer_begin engram__redis_writer_begin

/* ---- keys.c ---- */

/* The chunk keys' common prefix of a table, into buf[KEY_MAX]: the
 * chunk's index follows.  Returns its length. */
uint32_t chunk_prefix(const rstore *rs, const char *name, uint64_t epoch, int tagged,
                      char *buf);
/* The key of chunk i: the prefix, then i in decimal.  Returns its length. */
size_t chunk_key(const char *kpre, uint32_t kpre_len, uint64_t i, char key[KEY_MAX + 24]);
/* The slot of chunk i's key. */
uint16_t chunk_slot(const char *kpre, uint32_t kpre_len, uint64_t i);
/* Runs a command on the key argv[1] (its slot), expecting a reply of
 * `type`: 0 and *reply, or a negative code with a message naming `what`. */
int key_cmd(rstore *rs, engram__rsess *s, unsigned flags, int argc, const char **argv,
            const size_t *lens, int type, uint64_t deadline, const char *what,
            redisReply **reply);
/* Deletes chunks [0, n) of a table: 0, or the first failure. */
int delete_chunks(rstore *rs, engram__rsess *s, const char *kpre, uint32_t kpre_len, uint64_t n,
                  uint64_t deadline);

/* ---- source.c ---- */

/* A table's info from its manifest. */
void manifest_info(const rstore *rs, const engram__rmanifest *m, engram_table_info *info);
int redis_open(void *state, const engram__store_ctx *ctx, const char *name,
               engram_table_spec *spec, uint64_t *data_size, engram__source *src);

/* ---- kv.c ---- */

extern const engram__kv_vt engram__redis_kv_vt;
int redis_info(void *state, const char *name, engram_table_info *info);
int redis_list(void *state, int (*add)(void *ud, const char *name), void *ud);
int redis_read_all(void *state, const char *name, const engram__remote_sink *k);
int redis_remove(void *state, const char *name, int *unpublished);
int redis_gc(void *state, uint64_t idle_ms, uint32_t flags, engram_gc_report_fn report,
             void *ud);
int redis_writer_begin(void *state, const char *name, const engram_table_spec *spec,
                       void **out);

#endif
