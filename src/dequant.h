/*
 * dequant.h - FP8 E4M3 x E8M0 -> BF16, one value at a time (internal).
 *
 * This is the single definition of the conversion: the CPU reference
 * (dequant.c, engram_dequant_fp8_e4m3_e8m0_ref) and the CUDA kernel
 * (cuda/kernels.cu) both include it, so the GPU result matches the
 * reference bit for bit by construction; the tests check it anyway.
 *
 * The arithmetic is integer-only.  An E4M3 value is sig * 2^exp with a
 * significand of at most 4 bits, and an E8M0 scale is a power of two, so
 * the exact product is sig * 2^(exp + e - 127): BF16 (8 significant bits)
 * holds it exactly unless it lies beyond the BF16 range (inf) or below its
 * normal range (a subnormal that may need rounding, to nearest even).  No
 * floating-point unit takes part, so flush-to-zero modes, fast-math flags
 * and compiler contraction cannot change a bit.
 */
#ifndef ENGRAM_DEQUANT_H
#define ENGRAM_DEQUANT_H

#include <stdint.h>

#if defined(__CUDACC__)
#define ENGRAM__HD static __host__ __device__ __forceinline__
#else
#define ENGRAM__HD static inline
#endif

#define ENGRAM__BF16_NAN 0x7fc0u
#define ENGRAM__FP8_BLOCK 32 /* values per E8M0 scale */

/* The BF16 bits of E4M3 value `v` times E8M0 scale `s`. */
ENGRAM__HD uint16_t engram__fp8_e8m0_to_bf16(uint8_t v, uint8_t s)
{
    unsigned sign = (unsigned)(v & 0x80u) << 8;
    unsigned e = (v >> 3) & 0xfu, m = v & 7u, sig, q, rem, half;
    int x, p, be, sh;

    if ((v & 0x7fu) == 0x7fu || s == 0xffu)
        return (uint16_t)ENGRAM__BF16_NAN;
    if (e == 0) { /* zero or subnormal: m * 2^-9 */
        if (m == 0)
            return (uint16_t)sign;
        sig = m;
        x = -9;
    } else { /* (8 + m) * 2^(e - 7 - 3) */
        sig = 8u | m;
        x = (int)e - 10;
    }
    x += (int)s - 127;
    p = sig >= 8 ? 3 : sig >= 4 ? 2 : sig >= 2 ? 1 : 0; /* top bit of sig */
    be = x + p + 127;                                      /* biased BF16 exponent */
    if (be >= 255)
        return (uint16_t)(sign | 0x7f80u);
    if (be >= 1)
        return (uint16_t)(sign | ((unsigned)be << 7) | ((sig << (7 - p)) & 0x7fu));
    /* Subnormal BF16: the field is the value in units of 2^-133. */
    sh = x + 133;
    if (sh >= 0)
        return (uint16_t)(sign | (sig << sh));
    sh = -sh;
    if (sh > 4) /* sig < 2^4, so the value is below half a unit */
        return (uint16_t)sign;
    q = sig >> sh;
    rem = sig & ((1u << sh) - 1u);
    half = 1u << (sh - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++; /* may carry into the smallest normal: still the right bits */
    return (uint16_t)(sign | q);
}

#endif
