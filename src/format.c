/*
 * format.c - encoding and validation of the table file header.
 *
 * Byte layout (little-endian; docs/format.md has the prose):
 *   0  magic "ENGRAMTB"          8
 *   8  u32 format version        12  u32 header size (512)
 *  16  u64 num_rows              24  u32 row_bytes     28  u32 row_pitch
 *  32  u64 data_offset           40  u64 data_size     48  u64 data checksum
 *  56  u32 checksum algorithm    60  u32 flags         64  u64 created (ns)
 *  72  name, NUL-padded to 136 bytes
 * 208  u64 row_start            216  u64 total_rows  (version 2, with
 *      ENGRAM__FLAG_ROW_RANGE; else zero like the rest of the reserved bytes)
 * 224  u32 origin kind          228  u32 zero         232  u64 origin epoch
 * 240  origin namespace, NUL-padded to 136 bytes
 * 376  origin address, NUL-padded to 128 bytes  (version 3, with
 *      ENGRAM__FLAG_ORIGIN; else zero)
 * 504  u64 XXH3-64 of bytes [0, 504)
 */
#include <stdio.h>
#include <string.h>

#include "xxh.h"

#include "common.h"
#include "format.h"

#define OFF_MAGIC 0
#define OFF_VERSION 8
#define OFF_HSIZE 12
#define OFF_ROWS 16
#define OFF_RBYTES 24
#define OFF_PITCH 28
#define OFF_DOFF 32
#define OFF_DSIZE 40
#define OFF_DSUM 48
#define OFF_ALGO 56
#define OFF_FLAGS 60
#define OFF_CREATED 64
#define OFF_NAME 72
#define NAME_FIELD 136
#define OFF_ROW_START (OFF_NAME + NAME_FIELD)
#define OFF_TOTAL_ROWS (OFF_ROW_START + 8)
#define OFF_ORIGIN (OFF_TOTAL_ROWS + 8) /* the origin fields, zero without the flag */
#define OFF_ORIGIN_KIND OFF_ORIGIN
#define OFF_ORIGIN_PAD (OFF_ORIGIN + 4)
#define OFF_ORIGIN_EPOCH (OFF_ORIGIN + 8)
#define OFF_ORIGIN_NS (OFF_ORIGIN + 16)
#define OFF_ORIGIN_WHERE (OFF_ORIGIN_NS + NAME_FIELD)
#define WHERE_FIELD (ENGRAM_ORIGIN_WHERE_MAX + 1)
#define OFF_HSUM 504

_Static_assert(OFF_ORIGIN_WHERE + WHERE_FIELD == OFF_HSUM, "the origin fills the header");

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* A NUL-terminated string field of `size` bytes, zero after its NUL, into
 * out[outsize] (outsize <= size).  0; 1 (no NUL within outsize bytes);
 * 2 (a byte after the NUL is not zero). */
static int get_field(const unsigned char *p, size_t size, char *out, size_t outsize)
{
    size_t n = strnlen((const char *)p, size);
    if (n >= outsize)
        return 1;
    for (size_t i = n; i < size; i++)
        if (p[i] != 0)
            return 2;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

int engram__origin_check(const engram_origin *o)
{
    size_t n;
    if (o->kind != ENGRAM_ORIGIN_REDIS && o->kind != ENGRAM_ORIGIN_MOONCAKE)
        return engram__err(ENGRAM_ESPEC, "origin kind %u is not ENGRAM_ORIGIN_REDIS (%d) or "
                                         "ENGRAM_ORIGIN_MOONCAKE (%d)",
                           o->kind, ENGRAM_ORIGIN_REDIS, ENGRAM_ORIGIN_MOONCAKE);
    if (o->epoch == 0)
        return engram__err(ENGRAM_ESPEC, "origin epoch is 0 (a publication's epoch is never 0)");
    if (memchr(o->ns, '\0', sizeof o->ns) == NULL || engram_name_check(o->ns) != 0)
        return engram__err(ENGRAM_ESPEC, "origin namespace: %s",
                           memchr(o->ns, '\0', sizeof o->ns) ? engram_errmsg()
                                                             : "not NUL-terminated");
    n = strnlen(o->where, sizeof o->where);
    if (n == sizeof o->where)
        return engram__err(ENGRAM_ESPEC, "origin address is longer than %d bytes",
                           ENGRAM_ORIGIN_WHERE_MAX);
    for (size_t i = 0; i < n; i++)
        if (o->where[i] < 0x21 || o->where[i] > 0x7e)
            return engram__err(ENGRAM_ESPEC, "origin address: byte %zu (0x%02x) is not a "
                                             "printable character other than a space",
                               i, (unsigned char)o->where[i]);
    return 0;
}

void engram__header_encode(const engram__header *h, unsigned char buf[ENGRAM__HEADER_SIZE])
{
    memset(buf, 0, ENGRAM__HEADER_SIZE);
    memcpy(buf + OFF_MAGIC, ENGRAM__MAGIC, 8);
    put32(buf + OFF_VERSION, h->version);
    put32(buf + OFF_HSIZE, ENGRAM__HEADER_SIZE);
    put64(buf + OFF_ROWS, h->num_rows);
    put32(buf + OFF_RBYTES, h->row_bytes);
    put32(buf + OFF_PITCH, h->row_pitch);
    put64(buf + OFF_DOFF, h->data_offset);
    put64(buf + OFF_DSIZE, h->data_size);
    put64(buf + OFF_DSUM, h->data_checksum);
    put32(buf + OFF_ALGO, h->checksum_algo);
    put32(buf + OFF_FLAGS, h->flags);
    put64(buf + OFF_CREATED, h->created_ns);
    memcpy(buf + OFF_NAME, h->name, strnlen(h->name, ENGRAM_NAME_MAX));
    if (h->flags & ENGRAM__FLAG_ROW_RANGE) {
        put64(buf + OFF_ROW_START, h->row_start);
        put64(buf + OFF_TOTAL_ROWS, h->total_rows);
    }
    if (h->flags & ENGRAM__FLAG_ORIGIN) {
        put32(buf + OFF_ORIGIN_KIND, h->origin.kind);
        put64(buf + OFF_ORIGIN_EPOCH, h->origin.epoch);
        memcpy(buf + OFF_ORIGIN_NS, h->origin.ns, strnlen(h->origin.ns, ENGRAM_NAME_MAX));
        memcpy(buf + OFF_ORIGIN_WHERE, h->origin.where,
               strnlen(h->origin.where, ENGRAM_ORIGIN_WHERE_MAX));
    }
    put64(buf + OFF_HSUM, XXH3_64bits(buf, OFF_HSUM));
}

int engram__header_parse(const unsigned char *buf, size_t len, uint64_t file_size,
                         const char *what, engram__header *h)
{
    engram_table_spec spec;
    uint64_t size, end;

    if (len < ENGRAM__HEADER_SIZE || file_size < ENGRAM__HEADER_SIZE)
        return engram__err(ENGRAM_ECORRUPT, "%s: file is shorter than the %u-byte header", what,
                           ENGRAM__HEADER_SIZE);
    if (memcmp(buf + OFF_MAGIC, ENGRAM__MAGIC, 8) != 0)
        return engram__err(ENGRAM_ECORRUPT, "%s: not an engram table (bad magic)", what);
    memset(h, 0, sizeof *h);
    h->version = get32(buf + OFF_VERSION);
    /* Versions count up from 1: 0 or an absurd number is damage, not a
     * file from a newer library. */
    if (h->version == 0 || h->version > 1000)
        return engram__err(ENGRAM_ECORRUPT, "%s: implausible format version %u (header is "
                                            "corrupt)",
                           what, h->version);
    if (h->version > ENGRAM__FORMAT_VERSION)
        return engram__err(ENGRAM_EVERSION, "%s: format version %u (this library reads 1 to %u)",
                           what, h->version, ENGRAM__FORMAT_VERSION);
    if (get32(buf + OFF_HSIZE) != ENGRAM__HEADER_SIZE)
        return engram__err(ENGRAM_ECORRUPT, "%s: header size %u (expected %u)", what,
                           get32(buf + OFF_HSIZE), ENGRAM__HEADER_SIZE);
    if (get64(buf + OFF_HSUM) != XXH3_64bits(buf, OFF_HSUM))
        return engram__err(ENGRAM_ECORRUPT, "%s: header checksum mismatch (header is corrupt)",
                           what);
    h->flags = get32(buf + OFF_FLAGS);
    /* The range and origin fields are reserved bytes unless their flags
     * say otherwise (the flags themselves are checked below, with the
     * version); the origin's own padding is checked with its fields. */
    for (size_t i = OFF_ROW_START; i < OFF_HSUM; i++) {
        if ((h->flags & ENGRAM__FLAG_ROW_RANGE) && i < OFF_ORIGIN)
            continue;
        if ((h->flags & ENGRAM__FLAG_ORIGIN) && i >= OFF_ORIGIN)
            break;
        if (buf[i] != 0)
            return engram__err(ENGRAM_ECORRUPT, "%s: reserved header byte %zu is not zero", what, i);
    }

    h->num_rows = get64(buf + OFF_ROWS);
    h->row_bytes = get32(buf + OFF_RBYTES);
    h->row_pitch = get32(buf + OFF_PITCH);
    h->data_offset = get64(buf + OFF_DOFF);
    h->data_size = get64(buf + OFF_DSIZE);
    h->data_checksum = get64(buf + OFF_DSUM);
    h->checksum_algo = get32(buf + OFF_ALGO);
    h->created_ns = get64(buf + OFF_CREATED);

    if (h->checksum_algo != ENGRAM__CHECKSUM_XXH3_64)
        return engram__err(ENGRAM_EVERSION, "%s: unknown checksum algorithm %u", what,
                           h->checksum_algo);
    /* Version 1 defines no flag; version 2 the row range; 3 the origin. */
    if (h->flags & ~((h->version >= 2 ? ENGRAM__FLAG_ROW_RANGE : 0u) |
                     (h->version >= 3 ? ENGRAM__FLAG_ORIGIN : 0u)))
        return engram__err(ENGRAM_EVERSION, "%s: unknown header flags 0x%x for format version %u",
                           what, h->flags, h->version);
    if (h->row_pitch == 0)
        return engram__err(ENGRAM_ECORRUPT, "%s: row_pitch is 0", what);
    spec.num_rows = h->num_rows;
    spec.row_bytes = h->row_bytes;
    spec.row_pitch = h->row_pitch;
    if (engram__spec_size(&spec, &size) != 0)
        return engram__err(ENGRAM_ECORRUPT, "%s: invalid spec in header: %s", what,
                           engram_errmsg());
    if (size != h->data_size)
        return engram__err(ENGRAM_ECORRUPT, "%s: data size %llu != num_rows x row_pitch %llu",
                           what, (unsigned long long)h->data_size, (unsigned long long)size);
    if (h->data_offset < ENGRAM__HEADER_SIZE || h->data_offset % ENGRAM__DATA_ALIGN != 0)
        return engram__err(ENGRAM_ECORRUPT,
                           "%s: data offset %llu is not a nonzero multiple of %u", what,
                           (unsigned long long)h->data_offset, ENGRAM__DATA_ALIGN);
    if (engram__add_u64(h->data_offset, h->data_size, &end))
        return engram__err(ENGRAM_ECORRUPT, "%s: data offset + size overflows", what);
    if (end != file_size)
        return engram__err(ENGRAM_ECORRUPT,
                           "%s: file is %llu bytes but the header describes %llu (truncated or "
                           "extended)",
                           what, (unsigned long long)file_size, (unsigned long long)end);
    if (h->flags & ENGRAM__FLAG_ROW_RANGE) {
        h->row_start = get64(buf + OFF_ROW_START);
        h->total_rows = get64(buf + OFF_TOTAL_ROWS);
        if (engram__range_check(h->row_start, h->num_rows, h->total_rows) != 0)
            return engram__err(ENGRAM_ECORRUPT, "%s: invalid row range in header: %s", what,
                               engram_errmsg());
    }
    if (h->flags & ENGRAM__FLAG_ORIGIN) {
        h->origin.kind = get32(buf + OFF_ORIGIN_KIND);
        h->origin.epoch = get64(buf + OFF_ORIGIN_EPOCH);
        if (get32(buf + OFF_ORIGIN_PAD) != 0)
            return engram__err(ENGRAM_ECORRUPT, "%s: origin padding is not zero", what);
        if (get_field(buf + OFF_ORIGIN_NS, NAME_FIELD, h->origin.ns, sizeof h->origin.ns) != 0)
            return engram__err(ENGRAM_ECORRUPT, "%s: origin namespace is not terminated or not "
                                                "zero-padded",
                               what);
        if (get_field(buf + OFF_ORIGIN_WHERE, WHERE_FIELD, h->origin.where,
                      sizeof h->origin.where) != 0)
            return engram__err(ENGRAM_ECORRUPT, "%s: origin address is not terminated or not "
                                                "zero-padded",
                               what);
        if (engram__origin_check(&h->origin) != 0)
            return engram__err(ENGRAM_ECORRUPT, "%s: invalid origin in header: %s", what,
                               engram_errmsg());
    }
    switch (get_field(buf + OFF_NAME, NAME_FIELD, h->name, sizeof h->name)) {
    case 1:
        return engram__err(ENGRAM_ECORRUPT, "%s: table name in header is not terminated", what);
    case 2:
        return engram__err(ENGRAM_ECORRUPT, "%s: name padding is not zero", what);
    }
    if (engram_name_check(h->name) != 0)
        return engram__err(ENGRAM_ECORRUPT, "%s: invalid table name in header: %s", what,
                           engram_errmsg());
    return 0;
}
