/*
 * format.h - the on-disk table file header (internal).
 *
 * A table file is a 512-byte header at offset 0, zero padding, then the
 * rows from data_offset (a multiple of ENGRAM__DATA_ALIGN, 2 MiB, so the
 * data can be mapped with huge pages), num_rows rows row_pitch bytes apart
 * (the bytes between row_bytes and row_pitch are zero).  The file ends
 * exactly at data_offset + data_size.  All integers are little-endian.
 * docs/format.md describes the layout field by field.
 *
 * engram__header_parse() is the only reader of these bytes, which may come
 * from anyone who could write the file: it checks every field and never
 * trusts a size before checking it (fuzz/fuzz_header.c drives it).
 *
 * Versions: 1 has no flags.  2 adds the flag ENGRAM__FLAG_ROW_RANGE, with
 * which the table's rows are a range of a larger tensor (a TP shard, a
 * head of a layer): its first global row and the tensor's total rows are
 * in the first 16 bytes of what version 1 reserves.  A writer writes the
 * lowest version that holds its table (engram__header_version()), so a
 * table without a range is the same bytes as before version 2 existed,
 * and one with a range is refused by a version-1 reader as a later
 * format (ENGRAM_EVERSION), never misread.  3 adds ENGRAM__FLAG_ORIGIN:
 * the table was pulled from a remote namespace, whose kind, publication
 * epoch, namespace and address fill the last 280 bytes version 2 reserves
 * (engram_origin); the same rule keeps a table without an origin in the
 * lower versions.
 */
#ifndef ENGRAM_FORMAT_H
#define ENGRAM_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define ENGRAM__MAGIC "ENGRAMTB"     /* 8 bytes, no NUL */
#define ENGRAM__FORMAT_VERSION 3u     /* the newest version read and written */
#define ENGRAM__HEADER_SIZE 512u     /* bytes covered by the header checksum (+8) */
#define ENGRAM__DATA_ALIGN (2u << 20) /* 2 MiB */
#define ENGRAM__CHECKSUM_XXH3_64 1u
#define ENGRAM__FLAG_ROW_RANGE 0x1u  /* (version 2) row_start and total_rows are set */
#define ENGRAM__FLAG_ORIGIN 0x2u     /* (version 3) the origin fields are set */

typedef struct engram__header {
    uint32_t version;
    uint32_t checksum_algo;
    uint64_t num_rows;
    uint32_t row_bytes;
    uint32_t row_pitch;
    uint64_t data_offset;
    uint64_t data_size;
    uint64_t data_checksum;
    uint64_t created_ns;
    uint32_t flags;
    uint64_t row_start;  /* with ENGRAM__FLAG_ROW_RANGE: the first row's global row */
    uint64_t total_rows; /* with ENGRAM__FLAG_ROW_RANGE: rows of the full tensor; else 0 */
    char name[ENGRAM_NAME_MAX + 1];
    engram_origin origin; /* with ENGRAM__FLAG_ORIGIN; else zero */
} engram__header;

/* The lowest format version that can hold a header with `flags`: 1 without
 * flags, so tables without a row range or origin stay readable by every
 * reader. */
static inline uint32_t engram__header_version(uint32_t flags)
{
    return (flags & ENGRAM__FLAG_ORIGIN) ? 3u : flags ? 2u : 1u;
}

/* Checks an origin as engram_writer_set_origin() takes it and the header
 * parser reads it: a known kind, a nonzero epoch, a valid namespace name
 * and an address of at most ENGRAM_ORIGIN_WHERE_MAX printable bytes
 * without spaces.  0, or ENGRAM_ESPEC naming the field. */
int engram__origin_check(const engram_origin *o);

/* Serialises `h` into exactly ENGRAM__HEADER_SIZE bytes (with the header
 * checksum in its last 8 bytes). */
void engram__header_encode(const engram__header *h, unsigned char buf[ENGRAM__HEADER_SIZE]);

/* Parses and validates `len` bytes read from the start of a table file
 * whose size is `file_size`.  Returns 0 and fills *h, or ENGRAM_ECORRUPT /
 * ENGRAM_EVERSION with the reason in engram_errmsg().  `what` names the
 * file in messages. */
int engram__header_parse(const unsigned char *buf, size_t len, uint64_t file_size,
                         const char *what, engram__header *h);

/* Copies the header's facts into a table's info (spec, data offset and
 * size, checksum, creation time, row range). */
static inline void engram__header_info(const engram__header *h, engram_table_info *info)
{
    info->spec.num_rows = h->num_rows;
    info->spec.row_bytes = h->row_bytes;
    info->spec.row_pitch = h->row_pitch;
    info->data_offset = h->data_offset;
    info->data_size = h->data_size;
    info->checksum = h->data_checksum;
    info->created_ns = h->created_ns;
    if (h->flags & ENGRAM__FLAG_ROW_RANGE) {
        info->row_start = h->row_start;
        info->total_rows = h->total_rows;
    }
    if (h->flags & ENGRAM__FLAG_ORIGIN)
        info->origin = h->origin;
}

#endif
