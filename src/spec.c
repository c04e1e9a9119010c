/*
 * spec.c - validation of table specs and names.
 *
 * Names become file names inside the namespace directory, so the allowed
 * alphabet excludes '/' and a leading '.', which keeps every name a plain
 * entry of that directory and leaves the dot-names free for temp files.
 */
#include <string.h>

#include <stdint.h>

#include "common.h"

/* The largest table: row ids must fit int64 and byte offsets must fit
 * ptrdiff_t with room to spare, so 2^62 bytes. */
#define ENGRAM__MAX_DATA ((uint64_t)1 << 62)

int engram__name_valid(const char *name)
{
    size_t n = name ? strnlen(name, ENGRAM_NAME_MAX + 1) : 0;
    if (n == 0 || n > ENGRAM_NAME_MAX || name[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

int engram_name_check(const char *name)
{
    size_t n;
    if (!name)
        return engram__err(ENGRAM_ESPEC, "name is NULL");
    n = strnlen(name, ENGRAM_NAME_MAX + 1);
    if (n == 0)
        return engram__err(ENGRAM_ESPEC, "name is empty");
    if (n > ENGRAM_NAME_MAX)
        return engram__err(ENGRAM_ESPEC, "name is longer than %d bytes", ENGRAM_NAME_MAX);
    if (name[0] == '.')
        return engram__err(ENGRAM_ESPEC, "name '%s' starts with '.'", name);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok)
            return engram__err(ENGRAM_ESPEC,
                               "name '%.*s' has byte 0x%02x at %zu (allowed: A-Z a-z 0-9 . _ : -)",
                               (int)n, name, c, i);
    }
    return 0;
}

int engram__spec_size(const engram_table_spec *spec, uint64_t *data_size)
{
    uint64_t size, pitch;
    if (!spec)
        return engram__err(ENGRAM_ESPEC, "spec is NULL");
    if (spec->num_rows == 0)
        return engram__err(ENGRAM_ESPEC, "num_rows is 0 (a table has at least one row)");
    if (spec->row_bytes == 0)
        return engram__err(ENGRAM_ESPEC, "row_bytes is 0");
    if (spec->row_bytes > ENGRAM_ROW_BYTES_MAX)
        return engram__err(ENGRAM_ESPEC, "row_bytes %u is above the maximum %u", spec->row_bytes,
                           ENGRAM_ROW_BYTES_MAX);
    if (spec->row_pitch != 0 && spec->row_pitch < spec->row_bytes)
        return engram__err(ENGRAM_ESPEC, "row_pitch %u is smaller than row_bytes %u",
                           spec->row_pitch, spec->row_bytes);
    if (spec->row_pitch > ENGRAM_ROW_BYTES_MAX)
        return engram__err(ENGRAM_ESPEC, "row_pitch %u is above the maximum %u", spec->row_pitch,
                           ENGRAM_ROW_BYTES_MAX);
    pitch = engram__spec_pitch(spec);
    if (engram__mul_u64(spec->num_rows, pitch, &size) || size > ENGRAM__MAX_DATA)
        return engram__err(ENGRAM_ESPEC, "num_rows %llu x row_pitch %llu exceeds 2^62 bytes",
                           (unsigned long long)spec->num_rows, (unsigned long long)pitch);
    if (data_size)
        *data_size = size;
    return 0;
}

int engram_spec_check(const engram_table_spec *spec)
{
    return engram__spec_size(spec, NULL);
}

int engram__range_check(uint64_t row_start, uint64_t num_rows, uint64_t total_rows)
{
    uint64_t end;
    if (total_rows == 0 || total_rows > ENGRAM__MAX_DATA)
        return engram__err(ENGRAM_ESPEC, "total_rows %llu is outside [1, 2^62]",
                           (unsigned long long)total_rows);
    if (engram__add_u64(row_start, num_rows, &end))
        return engram__err(ENGRAM_ESPEC, "row_start %llu + num_rows %llu overflows",
                           (unsigned long long)row_start, (unsigned long long)num_rows);
    if (end > total_rows)
        return engram__err(ENGRAM_ESPEC,
                           "rows [%llu, %llu) are not within the %llu rows of the full tensor",
                           (unsigned long long)row_start, (unsigned long long)end,
                           (unsigned long long)total_rows);
    return 0;
}
