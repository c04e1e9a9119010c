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
 */
#ifndef ENGRAM_FORMAT_H
#define ENGRAM_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define ENGRAM__MAGIC "ENGRAMTB"     /* 8 bytes, no NUL */
#define ENGRAM__FORMAT_VERSION 1u
#define ENGRAM__HEADER_SIZE 512u     /* bytes covered by the header checksum (+8) */
#define ENGRAM__DATA_ALIGN (2u << 20) /* 2 MiB */
#define ENGRAM__CHECKSUM_XXH3_64 1u

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
    char name[ENGRAM_NAME_MAX + 1];
} engram__header;

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
 * size, checksum, creation time). */
static inline void engram__header_info(const engram__header *h, engram_table_info *info)
{
    info->spec.num_rows = h->num_rows;
    info->spec.row_bytes = h->row_bytes;
    info->spec.row_pitch = h->row_pitch;
    info->data_offset = h->data_offset;
    info->data_size = h->data_size;
    info->checksum = h->data_checksum;
    info->created_ns = h->created_ns;
}

#endif
