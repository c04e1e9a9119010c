/*
 * outlayout.h - where a lookup writes its rows: the one resolver of the
 * output layout (internal).
 *
 * A lookup of T tokens by K columns writes row (t, k), R bytes, at
 * out + t * ost + k * osk (byte strides, either sign).  Both strides 0
 * means the dense token-major layout: osk = R, ost = K * R.  A layout is
 * taken when its rows never overlap and the whole output fits in the
 * address space; anything else is refused with ENGRAM_ELAYOUT and the
 * reason.
 *
 * The CPU lookup (gather.c) and the GPU lookup (cuda/plan.c, through
 * the internal interface of internal.h) both resolve their layout here,
 * so they take the same layouts, apply the same defaults and refuse the
 * others in the same words.  R is the bytes one output row takes: a
 * table's row_bytes for a gather, the BF16 row for the GPU's dequant.
 */
#ifndef ENGRAM_OUTLAYOUT_H
#define ENGRAM_OUTLAYOUT_H

#include <stddef.h>

/* A resolved output layout. */
typedef struct engram__out_layout {
    ptrdiff_t ost; /* bytes from token t to token t + 1 */
    ptrdiff_t osk; /* bytes from column k to column k + 1 */
} engram__out_layout;

/* Resolves the layout of T x K output rows of R bytes at the caller's
 * byte strides (ost, osk) into *res: the defaults applied, then checked
 * (the inner dimension's stride covers a row, the outer one the whole
 * inner extent, and the extent fits in a ptrdiff_t).  0, or
 * ENGRAM_ELAYOUT with the reason (*res is then meaningless). */
int engram__out_layout_resolve(size_t R, size_t T, size_t K, ptrdiff_t ost, ptrdiff_t osk,
                               engram__out_layout *res);

#endif
