/*
 * outlayout.c - the resolver of a lookup's output layout (outlayout.h):
 * stride defaults, the overlap check and the bounds, for the CPU and the
 * GPU lookups alike.
 */
#include <stdint.h>

#include "common.h"
#include "outlayout.h"

/* The extent check's message, shared by the default strides (K rows of
 * R bytes that overflow) and the caller's. */
static int too_large(size_t T, size_t K)
{
    return engram__err(ENGRAM_ELAYOUT,
                       "an output of %zu x %zu rows at these strides does not fit in memory", T,
                       K);
}

int engram__out_layout_resolve(size_t R, size_t T, size_t K, ptrdiff_t ost, ptrdiff_t osk,
                               engram__out_layout *res)
{
    uint64_t n[2], s[2], span;
    int d = 0;

    if (ost == 0 && osk == 0) {
        uint64_t kr;
        if (engram__mul_u64(K, R, &kr) || kr > (uint64_t)PTRDIFF_MAX)
            return too_large(T, K);
        osk = (ptrdiff_t)R;
        ost = (ptrdiff_t)kr;
    }
    res->ost = ost;
    res->osk = osk;

    /* The dimensions of more than one row, outer first. */
    if (T > 1) {
        n[d] = T;
        s[d++] = ost < 0 ? -(uint64_t)ost : (uint64_t)ost;
    }
    if (K > 1) {
        n[d] = K;
        s[d++] = osk < 0 ? -(uint64_t)osk : (uint64_t)osk;
    }
    if (d == 2 && s[0] < s[1]) {
        uint64_t tn = n[0], ts = s[0];
        n[0] = n[1];
        s[0] = s[1];
        n[1] = tn;
        s[1] = ts;
    }
    /* Now dimension d-1 is the inner one. */
    if (d >= 1 && s[d - 1] < R)
        return engram__err(ENGRAM_ELAYOUT,
                           "output rows overlap: stride %llu bytes is smaller than a row (%zu)",
                           (unsigned long long)s[d - 1], R);
    if (d == 2 && (engram__mul_u64(s[1], n[1] - 1, &span) || engram__add_u64(span, R, &span) ||
                   s[0] < span))
        return engram__err(ENGRAM_ELAYOUT,
                           "output rows overlap or interleave: outer stride %llu bytes is smaller "
                           "than the inner extent (%llu x %llu + %zu)",
                           (unsigned long long)s[0], (unsigned long long)n[1] - 1,
                           (unsigned long long)s[1], R);
    /* The whole output must fit in the address space: a batch of 2^61
     * tokens over broadcast ids would otherwise pass, and its extent wrap. */
    span = R;
    for (int i = 0; i < d; i++) {
        uint64_t part;
        if (engram__mul_u64(s[i], n[i] - 1, &part) || engram__add_u64(span, part, &span) ||
            span > (uint64_t)PTRDIFF_MAX)
            return too_large(T, K);
    }
    return 0;
}
