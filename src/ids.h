/*
 * ids.h - which ids a lookup column accepts (internal; C, C++ and CUDA).
 *
 * A column of table T with offset `off` takes id as row id - off when
 * 0 <= id - off < num_rows, the difference taken as an exact integer;
 * ENGRAM_DEAD_ID is decided on the raw id before this, by the caller.
 * Every lookup path checks ids through these two functions: the CPU
 * lookup (gather.c, which the CLI and the Python binding call), the GPU
 * kernels (cuda/kernels.cu, also compiled as host C++ for the emulated
 * runtime of the tests) and the CPU half of the GPU host path
 * (cuda/hostpath.c).
 *
 * The exact difference of two int64 values needs 65 bits; taken modulo
 * 2^64 it wraps where it is below -2^63 (id INT64_MIN, offset INT64_MAX:
 * -2^64 + 1 wraps to 1).  The check stays one subtraction and one compare
 * per id all the same: the ids a column accepts are the interval
 * [off, off + span - 1] of int64, span = min(num_rows, INT64_MAX - off + 1)
 * (the rows past INT64_MAX have no id).  Subtracting off modulo 2^64 maps
 * the 2^64 int64 values one to one onto [0, 2^64) and that interval onto
 * [0, span), so (uint64_t)id - off < span holds for exactly its ids, and
 * is then the exact row.  span is computed once per column.
 */
#ifndef ENGRAM_IDS_H
#define ENGRAM_IDS_H

#include <stdint.h>

#if defined(__CUDACC__)
#define ENGRAM__IDS_FN static inline __host__ __device__
#else
#define ENGRAM__IDS_FN static inline
#endif

/* How many int64 ids a column of num_rows rows with offset `off` accepts:
 * min(num_rows, INT64_MAX - off + 1).  The second term is 1 to 2^64; in 64
 * bits 2^64 reads as 0 (off = INT64_MIN), where every row has an id. */
ENGRAM__IDS_FN uint64_t engram__id_span(uint64_t num_rows, int64_t off)
{
    uint64_t room = (uint64_t)INT64_MAX - (uint64_t)off + 1u;
    return room != 0 && room < num_rows ? room : num_rows;
}

/* 1 if `id` (not ENGRAM_DEAD_ID) is a row of the column of offset `off`
 * and span `span` (engram__id_span()), with the row in *row; 0 if not
 * (*row is then meaningless). */
ENGRAM__IDS_FN int engram__id_row(int64_t id, int64_t off, uint64_t span, uint64_t *row)
{
    *row = (uint64_t)id - (uint64_t)off;
    return *row < span;
}

#undef ENGRAM__IDS_FN

#endif
