/*
 * fuzz_redis_manifest.c - fuzz target for the manifest of a Redis table
 * (src/redis/manifest.c).
 *
 * A manifest is read from a Redis Cluster that anyone with write access
 * to it controls, so engram__rmanifest_parse() must reject every
 * malformed one cleanly and never accept one that breaks what the reads
 * rely on: a valid table name, 1 .. 2^62 bytes of rows of 1 .. 16 MiB,
 * chunks of at least one row and at most 512 MiB, a chunk count that the
 * rows and chunk size imply, a sum per chunk, a non-zero epoch.
 *
 * Each input is parsed twice: without an expected name, and expecting
 * table "a" (accepted only if it is "a").  It is also parsed as a pending
 * record (manifest.h), the other text of the same hash: an accepted
 * record must have a valid name, a non-zero epoch and TTL, 1 .. 2^22
 * chunks, and be exactly its body (engram__rpending_body()) followed by
 * its stamp line.  An accepted manifest must
 * satisfy the invariants, encode to exactly the input bytes (the format
 * has one spelling of each value), and parse back equal.  Every error
 * message must name the input (WHAT) once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fuzz.h"
#include "redis/manifest.h"

#define WHAT "fuzz-input-0123456789"

static void fail(const char *why)
{
    fprintf(stderr, "fuzz_redis_manifest: invariant broken: %s\n", why);
    abort();
}

static void check_accepted(const engram__rmanifest *m, const uint8_t *data, size_t size)
{
    engram__rmanifest back;
    uint64_t bytes;
    char *text = NULL;
    size_t len = 0;
    if (!engram__name_valid(m->name))
        fail("invalid name accepted");
    if (m->num_rows == 0 || m->row_bytes == 0 || m->row_bytes > ENGRAM_ROW_BYTES_MAX)
        fail("bad rows or row_bytes accepted");
    if (engram_spec_check(&(engram_table_spec){m->num_rows, m->row_bytes, 0}) != 0)
        fail("a spec engram_spec_check refuses accepted");
    if (m->chunk_rows == 0 || engram__mul_u64(m->chunk_rows, m->row_bytes, &bytes) ||
        bytes > ENGRAM__RM_CHUNK_MAX)
        fail("bad chunk_rows accepted");
    if (m->nchunks != engram__rm_nchunks(m->num_rows, m->chunk_rows) ||
        m->nchunks > ENGRAM__RM_CHUNKS_MAX || !m->chunk_sums)
        fail("bad chunk count accepted");
    if (m->epoch == 0)
        fail("epoch 0 accepted");
    if (engram__rmanifest_encode(m, &text, &len) != 0)
        return; /* out of memory */
    if (len != size || memcmp(text, data, size) != 0)
        fail("an accepted manifest does not encode to its own bytes");
    if (engram__rmanifest_parse(text, len, m->name, WHAT, &back) != 0)
        fail("an encoded manifest does not parse");
    if (strcmp(back.name, m->name) != 0 || back.num_rows != m->num_rows ||
        back.row_bytes != m->row_bytes || back.chunk_rows != m->chunk_rows ||
        back.nchunks != m->nchunks || back.tagged != m->tagged || back.epoch != m->epoch ||
        back.created_ns != m->created_ns || back.checksum != m->checksum ||
        memcmp(back.chunk_sums, m->chunk_sums, m->nchunks * sizeof *m->chunk_sums) != 0)
        fail("the round trip changed the manifest");
    engram__rmanifest_free(&back);
    free(text);
}

static void check_pending(const uint8_t *data, size_t size)
{
    engram__rpending p;
    char text[1200];
    size_t n;
    int rc = engram__rpending_parse((const char *)data, size, WHAT, &p);
    if (rc != 0) {
        if (rc != ENGRAM_ECORRUPT)
            fail("a pending record refused with an error other than ENGRAM_ECORRUPT");
        if (strstr(engram_errmsg(), WHAT) == NULL)
            fail("a message that does not name the input");
        return;
    }
    if (!engram__name_valid(p.name) || p.epoch == 0 || p.ttl_ms == 0 || p.nchunks == 0 ||
        p.nchunks > ENGRAM__RM_CHUNKS_MAX)
        fail("a bad pending record accepted");
    n = engram__rpending_body(&p, text, 512);
    n += (size_t)snprintf(text + n, sizeof text - n, "stamp %llu\n",
                          (unsigned long long)p.stamp_ms);
    if (n != size || memcmp(text, data, size) != 0)
        fail("an accepted pending record is not its body and stamp");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_pending(data, size);
    static const char *const names[2] = {NULL, "a"};
    for (int i = 0; i < 2; i++) {
        engram__rmanifest m;
        int rc = engram__rmanifest_parse((const char *)data, size, names[i], WHAT, &m);
        if (rc == 0) {
            if (names[i] && strcmp(m.name, names[i]) != 0)
                fail("a manifest of another table accepted");
            check_accepted(&m, data, size);
            engram__rmanifest_free(&m);
        } else {
            const char *msg = engram_errmsg();
            if (rc != ENGRAM_ECORRUPT && rc != -ENOMEM)
                fail("an error other than ENGRAM_ECORRUPT or -ENOMEM");
            if (rc == ENGRAM_ECORRUPT && strstr(msg, WHAT) == NULL)
                fail("a message that does not name the input");
            if (m.chunk_sums != NULL)
                fail("a failed parse left memory behind");
        }
    }
    return 0;
}
