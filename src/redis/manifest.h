/*
 * manifest.h - the manifest of a table kept in a Redis Cluster
 * (internal).
 *
 * A Redis table is its rows cut into chunk keys of chunk_rows rows each
 * (the last one shorter), plus one manifest, written last, that says
 * what the chunks are: the spec, the chunk size, the key layout, the
 * publish epoch that every chunk key of this publication carries, and an
 * XXH3-64 per chunk and of all the rows.  The manifest is text, one field
 * per line in a fixed order (docs/redis.md shows one):
 *
 *     engram-redis 1
 *     name <table name>
 *     rows <num_rows>
 *     row_bytes <row_bytes>
 *     chunk_rows <rows per chunk>
 *     chunks <number of chunks>
 *     layout spread|tagged
 *     epoch <16 hex digits>
 *     created_ns <ns since the Unix epoch>
 *     checksum <16 hex digits>
 *     chunk_xxh3 <16 hex digits per chunk, no separator>
 *
 * engram__rmanifest_parse() is the one reader of these bytes, which
 * anyone who can write to the cluster controls: it checks every field
 * (decimal numbers without sign or leading zero, bounds, the chunk count
 * the rows and chunk size imply, the checksum list's length) and accepts
 * nothing else, in no other order, with no extra bytes.
 */
#ifndef ENGRAM_REDIS_MANIFEST_H
#define ENGRAM_REDIS_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define ENGRAM__RM_MAGIC "engram-redis 1"
/* A chunk is one Redis string: at most proto-max-bulk-len's default. */
#define ENGRAM__RM_CHUNK_MAX ((uint64_t)512 << 20)
/* Chunks of one table at most (a manifest of ~64 MiB). */
#define ENGRAM__RM_CHUNKS_MAX ((uint64_t)1 << 22)
/* Longest manifest accepted (its chunk sums and the fixed fields). */
#define ENGRAM__RM_MAX_BYTES (ENGRAM__RM_CHUNKS_MAX * 16 + 4096)

typedef struct engram__rmanifest {
    char name[ENGRAM_NAME_MAX + 1];
    uint64_t num_rows;
    uint32_t row_bytes;
    uint64_t chunk_rows;
    uint64_t nchunks;
    int tagged;          /* layout: 1 = tagged (one slot per table), 0 = spread */
    uint64_t epoch;      /* never 0 */
    uint64_t created_ns;
    uint64_t checksum;   /* XXH3-64 of all rows, packed */
    uint64_t *chunk_sums; /* [nchunks] XXH3-64 of each chunk's bytes (owned) */
} engram__rmanifest;

/* Parses `len` bytes.  `name`, if not NULL, is the table the manifest
 * must describe.  On success *m owns chunk_sums (engram__rmanifest_free).
 * ENGRAM_ECORRUPT with the reason (naming `what`) otherwise, -ENOMEM. */
int engram__rmanifest_parse(const char *buf, size_t len, const char *name, const char *what,
                            engram__rmanifest *m);

/* The text of *m (which must be valid) in a new allocation: *out, *len.
 * -ENOMEM. */
int engram__rmanifest_encode(const engram__rmanifest *m, char **out, size_t *len);

/* Frees what *m owns.  Accepts a zeroed manifest. */
void engram__rmanifest_free(engram__rmanifest *m);

/*
 * A pending record: what a table name's record holds while no manifest
 * does (docs/format.md, "The publication protocol"): a push that holds
 * the name (state open), or chunks to delete that nothing can publish
 * (state closed).  Text, one field per line in this order:
 *
 *     engram-pending 1
 *     state open|closed
 *     name <table name>
 *     epoch <16 hex digits>
 *     chunks <number of chunks>
 *     layout spread|tagged
 *     ttl_ms <the pushing store's chunk TTL>
 *     stamp <ms since the Unix epoch, the store's clock>
 *
 * The stamp is the store's clock (kv.h's now_ms) when the record was
 * written or its push last showed life, so every party measures a
 * record's age on one clock.
 */
#define ENGRAM__RP_MAGIC "engram-pending 1"

typedef struct engram__rpending {
    char name[ENGRAM_NAME_MAX + 1];
    int closed;
    uint64_t epoch;   /* never 0 */
    uint64_t nchunks; /* 1 .. ENGRAM__RM_CHUNKS_MAX */
    int tagged;
    uint32_t ttl_ms;  /* never 0 */
    uint64_t stamp_ms;
} engram__rpending;

/* Parses a pending record of `len` bytes; `what` names it in messages.
 * 0, or ENGRAM_ECORRUPT with the reason. */
int engram__rpending_parse(const char *buf, size_t len, const char *what, engram__rpending *p);

/* The text of *p without its stamp line (publish.c appends it), into
 * buf[cap]; returns its length (cap 512 is always enough). */
size_t engram__rpending_body(const engram__rpending *p, char *buf, size_t cap);

/* The chunk count of num_rows rows at chunk_rows per chunk. */
static inline uint64_t engram__rm_nchunks(uint64_t num_rows, uint64_t chunk_rows)
{
    return num_rows / chunk_rows + (num_rows % chunk_rows != 0);
}

#endif
