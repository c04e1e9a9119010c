/*
 * npy.h - the CLI's parser of .npy file headers.
 *
 * `engram import` accepts numpy's .npy files of an array of any plain dtype
 * in C order, whose rows (the entries of the first dimension) it takes as
 * bytes.  Their header is bytes from outside: a magic string, a format
 * version, a little-endian header length and a Python dict literal.  The
 * parser works on a memory buffer, so that the CLI only reads the file and
 * the fuzz target (fuzz/fuzz_npy.c) drives exactly the code the CLI runs.
 *
 * This is CLI code, not part of libengram: nothing here is exported, and
 * the names use the plain npy_ / NPY_ prefix rather than the library's
 * engram_ one.
 */
#ifndef ENGRAM_CLI_NPY_H
#define ENGRAM_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>

/* The largest .npy header this tool accepts.  Real headers of plain
 * arrays are under 128 bytes; the bound keeps a hostile length from making
 * us allocate or read much. */
#define NPY_HEADER_MAX 65536u

/* The most bytes npy_parse() can need: the longest preamble (magic 6,
 * version 2, length 4) plus the largest header.  A caller that passes
 * min(file size, NPY_PARSE_MAX) leading bytes never sees "cannot read". */
#define NPY_PARSE_MAX (12u + NPY_HEADER_MAX)

#define NPY_MAX_DIMS 8

/* What an accepted header describes: rows x cols bytes, starting
 * data_offset bytes into the file.  rows is shape[0]; cols, the bytes of
 * one row, is itemsize times the product of the other dimensions
 * (itemsize alone for a 1-D array).  Unused dims and descr bytes are 0. */
struct npy_info {
    uint64_t rows, cols;
    uint64_t data_offset;
    uint64_t itemsize;         /* bytes of one element of the dtype */
    uint32_t ndim;             /* 1 .. NPY_MAX_DIMS */
    uint64_t dims[NPY_MAX_DIMS];
    char descr[32];            /* the dtype as the header spells it: "<f4", "|u1", ... */
};

/* Parses the preamble and header of an .npy file of file_size bytes whose
 * first len bytes are buf (len may be less than file_size; bytes past
 * file_size are ignored), and checks that the file holds exactly the
 * array's data after the header.  Accepts format 1.0, 2.0 and 3.0, the
 * keys 'descr', 'fortran_order' and 'shape' each exactly once, a plain
 * dtype (an optional byte order of '<', '>', '|' or '=', then b1, i/u of
 * 1, 2, 4 or 8 bytes, f of 2, 4, 8, 12 or 16, c of 8, 16, 24 or 32,
 * S<n> and V<n> of n bytes, U<n> of 4n bytes, m8 and M8 with an optional
 * [unit] of numpy's; never object or structured dtypes), C order, and a shape of 1
 * to NPY_MAX_DIMS dimensions, none zero, whose byte size fits in 64 bits.
 *
 * Returns 0 and fills *info, or -1 and writes a one-line message of
 * printable ASCII into err (errlen must be at least 1; the message is
 * truncated to fit and always NUL-terminated), leaving *info untouched.
 * The message says "cannot read the .npy header" when buf is shorter than
 * the header it announces.  Reentrant; allocates nothing. */
int npy_parse(const unsigned char *buf, size_t len, uint64_t file_size, struct npy_info *info,
              char *err, size_t errlen);

#endif
