/*
 * fuzz_header.c - fuzz target for the table file header parser.
 *
 * engram__header_parse() is the one reader of bytes that anyone able to
 * write a table file controls, so it must reject every malformed header
 * cleanly and never accept one that breaks the invariants the mapping and
 * gather code rely on (sizes that fit, data that ends exactly at the end
 * of the file, a name that is a valid table name).
 *
 * One input drives three parses, because a table header only parses when
 * the file size agrees with it and its checksum matches:
 *  1. the whole input as the file's first bytes, with its own length as
 *     the file size (the "short or non-table file" paths);
 *  2. the first 8 input bytes as the file size (little-endian) and the rest
 *     as the file's first bytes, which lets seeds describe multi-GiB tables;
 *  3. as 2, but with the header checksum (the last 8 of the 512 header
 *     bytes) recomputed first, so that mutations of the fields behind the
 *     checksum reach the field checks instead of all failing on the
 *     checksum.
 * Every accepted header must satisfy the invariants below and survive an
 * encode/parse round trip unchanged; any violation aborts.  Version-2
 * headers with a row range (ENGRAM__FLAG_ROW_RANGE) must describe rows
 * within the full tensor's total_rows; version-3 headers with an origin
 * (ENGRAM__FLAG_ORIGIN) a valid one, and no header without the flag any.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common.h"
#include "format.h"
#include "fuzz.h"

/* The name passed to the parser for the file; every error message must
 * mention it exactly once.  It is longer than any table name, so the
 * header's own name, which messages may quote, can never contain it. */
#define WHAT                                                                  \
    "fuzz-input/abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz" \
    "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz"
_Static_assert(sizeof WHAT - 1 > ENGRAM_NAME_MAX, "WHAT must be longer than any name");

static void fail(const char *why, const engram__header *h)
{
    fprintf(stderr, "fuzz_header: invariant broken: %s\n", why);
    if (h)
        fprintf(stderr,
                "  version %u algo %u num_rows %llu row_bytes %u row_pitch %u\n"
                "  data_offset %llu data_size %llu flags 0x%x row_start %llu total_rows %llu\n"
                "  name '%.*s'\n",
                h->version, h->checksum_algo, (unsigned long long)h->num_rows, h->row_bytes,
                h->row_pitch, (unsigned long long)h->data_offset,
                (unsigned long long)h->data_size, h->flags, (unsigned long long)h->row_start,
                (unsigned long long)h->total_rows, ENGRAM_NAME_MAX, h->name);
    abort();
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Counts the occurrences of `needle` in `s`. */
static int count_occurrences(const char *s, const char *needle)
{
    int n = 0;
    size_t len = strlen(needle);
    for (const char *p = strstr(s, needle); p; p = strstr(p + len, needle))
        n++;
    return n;
}

/* Field-by-field comparison: a memcmp of the structs would also compare
 * padding and the bytes after the name's NUL, which carry no meaning. */
static int header_equal(const engram__header *a, const engram__header *b)
{
    return a->version == b->version && a->checksum_algo == b->checksum_algo &&
           a->num_rows == b->num_rows && a->row_bytes == b->row_bytes &&
           a->row_pitch == b->row_pitch && a->data_offset == b->data_offset &&
           a->data_size == b->data_size && a->data_checksum == b->data_checksum &&
           a->created_ns == b->created_ns && a->flags == b->flags &&
           a->row_start == b->row_start && a->total_rows == b->total_rows &&
           strcmp(a->name, b->name) == 0;
}

/* Checks what an accepted header promises to the rest of the library. */
static void check_accepted(const uint8_t *buf, size_t len, uint64_t file_size,
                           const engram__header *h)
{
    unsigned char enc[ENGRAM__HEADER_SIZE], enc2[ENGRAM__HEADER_SIZE];
    engram__header h2;
    uint64_t size, end;
    engram_table_spec spec;
    int rc;

    if (len < ENGRAM__HEADER_SIZE)
        fail("accepted fewer bytes than a header", h);
    if (h->version < 1 || h->version > ENGRAM__FORMAT_VERSION)
        fail("accepted an unsupported version", h);
    if (h->flags & ~(uint32_t)(ENGRAM__FLAG_ROW_RANGE | ENGRAM__FLAG_ORIGIN))
        fail("accepted an unknown flag", h);
    if (h->flags && h->version < 2)
        fail("accepted a flag in a version-1 header", h);
    if ((h->flags & ENGRAM__FLAG_ORIGIN) && h->version < 3)
        fail("accepted an origin in a version-2 header", h);
    if (h->flags & ENGRAM__FLAG_ORIGIN) {
        if (h->origin.kind != ENGRAM_ORIGIN_REDIS && h->origin.kind != ENGRAM_ORIGIN_MOONCAKE)
            fail("accepted an unknown origin kind", h);
        if (h->origin.epoch == 0)
            fail("accepted origin epoch 0", h);
        if (memchr(h->origin.ns, '\0', sizeof h->origin.ns) == NULL ||
            engram_name_check(h->origin.ns) != 0)
            fail("accepted an invalid origin namespace", h);
        if (memchr(h->origin.where, '\0', sizeof h->origin.where) == NULL)
            fail("origin address is not NUL-terminated", h);
        for (const char *c = h->origin.where; *c; c++)
            if (*c < 0x21 || *c > 0x7e)
                fail("accepted a blank or unprintable origin address byte", h);
    } else {
        engram_origin z;
        memset(&z, 0, sizeof z);
        if (memcmp(&h->origin, &z, sizeof z) != 0)
            fail("origin fields set without the flag", h);
    }
    if (h->flags & ENGRAM__FLAG_ROW_RANGE) {
        /* Every global id of the table is an int64 below total_rows. */
        if (h->total_rows < 1 || h->total_rows > ((uint64_t)1 << 62))
            fail("accepted total_rows outside [1, 2^62]", h);
        if (engram__add_u64(h->row_start, h->num_rows, &end) || end > h->total_rows)
            fail("accepted a row range beyond total_rows", h);
    } else if (h->row_start != 0 || h->total_rows != 0) {
        fail("range fields set without the flag", h);
    }
    if (h->checksum_algo != ENGRAM__CHECKSUM_XXH3_64)
        fail("accepted an unknown checksum algorithm", h);
    if (h->num_rows < 1)
        fail("accepted num_rows 0", h);
    if (h->row_bytes < 1 || h->row_bytes > ENGRAM_ROW_BYTES_MAX)
        fail("row_bytes out of range", h);
    if (h->row_pitch < h->row_bytes || h->row_pitch > ENGRAM_ROW_BYTES_MAX)
        fail("row_pitch out of range", h);
    if (h->data_offset < ENGRAM__HEADER_SIZE || h->data_offset % ENGRAM__DATA_ALIGN != 0)
        fail("data_offset not a multiple of 2 MiB at or after the header", h);
    if (engram__mul_u64(h->num_rows, h->row_pitch, &size) || size != h->data_size)
        fail("data_size != num_rows * row_pitch (or it overflows)", h);
    if (engram__add_u64(h->data_offset, h->data_size, &end) || end != file_size)
        fail("data does not end exactly at the end of the file", h);
    spec.num_rows = h->num_rows;
    spec.row_bytes = h->row_bytes;
    spec.row_pitch = h->row_pitch;
    if (engram_spec_check(&spec) != 0)
        fail("accepted a spec that engram_spec_check() rejects", h);
    if (memchr(h->name, '\0', sizeof h->name) == NULL)
        fail("name is not NUL-terminated", h);
    if (engram_name_check(h->name) != 0)
        fail("accepted an invalid table name", h);

    /* The parser rejects every byte that is not canonical (reserved bytes,
     * name padding, header size), so an accepted header re-encodes to the
     * very bytes it was read from.  If the format ever tolerates unknown
     * bytes, this check must become field-wise only. */
    engram__header_encode(h, enc);
    if (memcmp(enc, buf, ENGRAM__HEADER_SIZE) != 0)
        fail("re-encoding an accepted header gives different bytes", h);
    rc = engram__header_parse(enc, sizeof enc, file_size, WHAT, &h2);
    if (rc != 0)
        fail("re-encoded header does not parse", h);
    if (!header_equal(h, &h2))
        fail("round trip changed a field", &h2);
    engram__header_encode(&h2, enc2);
    if (memcmp(enc, enc2, sizeof enc) != 0)
        fail("encoding is not deterministic", &h2);
}

/* Parses one buffer and checks the result, whichever it is. */
static void parse_one(const uint8_t *buf, size_t len, uint64_t file_size)
{
    engram__header h;
    int rc;

    /* Clear the thread's message so that a failure which forgets to set
     * one is seen. */
    engram__err(0, "%s", "");
    rc = engram__header_parse(buf, len, file_size, WHAT, &h);
    if (rc == 0) {
        check_accepted(buf, len, file_size, &h);
        return;
    }
    if (rc != ENGRAM_ECORRUPT && rc != ENGRAM_EVERSION)
        fail("parse returned a code other than ECORRUPT/EVERSION", NULL);
    /* The message is built from user-controlled bytes: it must still name
     * the file once, and not be garbled (e.g. by formatting the thread's
     * message buffer into itself). */
    if (count_occurrences(engram_errmsg(), WHAT) != 1) {
        fprintf(stderr, "fuzz_header: message: %s\n", engram_errmsg());
        fail("error message does not name the file exactly once", NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;
    uint64_t file_size;

    parse_one(data, size, size);
    if (size < 8)
        return 0;
    file_size = get_le64(data);
    parse_one(data + 8, size - 8, file_size);
    if (size - 8 < ENGRAM__HEADER_SIZE)
        return 0;
    /* An exact-size copy keeps reads past the end visible to ASan. */
    copy = malloc(size - 8);
    if (!copy)
        return 0;
    memcpy(copy, data + 8, size - 8);
    {
        uint64_t sum = XXH3_64bits(copy, ENGRAM__HEADER_SIZE - 8);
        for (int i = 0; i < 8; i++)
            copy[ENGRAM__HEADER_SIZE - 8 + i] = (uint8_t)(sum >> (8 * i));
    }
    parse_one(copy, size - 8, file_size);
    free(copy);
    return 0;
}
