/*
 * safetensors.h - the safetensors header parser (internal;
 * safetensors_parse.c).  Its input is untrusted.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes
 * of JSON (an object: tensor name -> {"dtype", "shape", "data_offsets":
 * [begin, end]}, plus an optional "__metadata__" object of strings), then
 * the data; offsets are relative to the start of the data.
 *
 * engram__st_parse() is the only reader of these bytes, which come from
 * whoever wrote the checkpoint: it parses the JSON with cJSON and checks
 * everything before anything is used (fuzz/fuzz_safetensors.c drives it):
 * the header length (2 .. ENGRAM__ST_HEADER_MAX, within the file), at most
 * ENGRAM__ST_VALUES_MAX JSON values (before cJSON sees them), that the JSON ends with nothing but spaces after it, each tensor's dtype
 * (known), shape (integers, at most ENGRAM_TENSOR_MAX_DIMS dims) and
 * offsets (integers, begin <= end, end - begin = elements x dtype size
 * without overflow), unique names, and that the tensors tile the data
 * region exactly: sorted by offset they start at 0, leave no hole, do not
 * overlap, and end at the end of the file.
 */
#ifndef ENGRAM_SAFETENSORS_H
#define ENGRAM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "engram.h"

#define ENGRAM__ST_HEADER_MAX ((uint64_t)100 << 20) /* the format's own limit */
/* The most JSON values a header or index may hold (counted before parsing,
 * see engram__json_values_bound()): cJSON allocates an item and a key copy
 * per value, about 100 bytes, so this bounds a parse to a few hundred MB.
 * A tensor entry is 8 values; the largest checkpoints have ~100k tensors. */
#define ENGRAM__ST_VALUES_MAX ((size_t)2 << 20)

typedef struct engram__st_tensor {
    const char *name;  /* points into the header's name storage */
    char dtype[16];
    uint32_t elem_size;
    uint32_t ndim;
    uint64_t shape[ENGRAM_TENSOR_MAX_DIMS];
    uint64_t begin, end; /* relative to data_start */
} engram__st_tensor;

typedef struct engram__st_header {
    uint64_t header_len; /* N */
    uint64_t data_start; /* 8 + N */
    uint64_t data_size;  /* file_size - data_start */
    size_t n;            /* tensors */
    engram__st_tensor *t; /* sorted by begin */
    char *names;         /* one block for all names */
} engram__st_header;

/* Parses the first `len` bytes of a safetensors file of `file_size` bytes
 * (len must cover the 8 + N header bytes; more is ignored).  Returns 0 and
 * fills *h (free with engram__st_free), or ENGRAM_ECORRUPT / -ENOMEM with
 * the reason, naming `what`, in engram_errmsg(). */
int engram__st_parse(const unsigned char *buf, size_t len, uint64_t file_size, const char *what,
                     engram__st_header *h);

/* Reads the header of the open file fd and parses it. */
int engram__st_read(int fd, uint64_t file_size, const char *what, engram__st_header *h);

/* The tensor called `name`, or NULL. */
const engram__st_tensor *engram__st_find(const engram__st_header *h, const char *name);

void engram__st_free(engram__st_header *h);

/* An upper bound of the number of JSON values in s[0, n): one, plus one
 * per ',', '[' and '{' outside strings. */
size_t engram__json_values_bound(const char *s, size_t n);

/* cJSON_ParseWithLengthOpts() of s[0, n), one thread at a time (cJSON
 * writes a process-wide error position on every parse).  The index files
 * of safetensors.c are parsed here too. */
struct cJSON *engram__json_parse(const char *s, size_t n, const char **end);

/* Reads exactly len bytes at off (0 or -errno; -ENODATA at end of file). */
int engram__st_read_at(int fd, void *buf, size_t len, uint64_t off);

#endif
