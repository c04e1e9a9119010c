/*
 * dequant.c - the CPU reference of the fused FP8 -> BF16 dequantisation.
 *
 * The conversion itself is in dequant.h, shared with the CUDA kernel; this
 * file only walks the values and their block scales.
 */
#include <errno.h>

#include "common.h"
#include "dequant.h"

int engram_dequant_fp8_e4m3_e8m0_ref(const void *values, const void *scales, size_t n,
                                     uint16_t *out)
{
    const uint8_t *v = values, *s = scales;
    if (n % ENGRAM__FP8_BLOCK != 0)
        return engram__err(-EINVAL, "dequant: %zu values is not a multiple of %d", n,
                           ENGRAM__FP8_BLOCK);
    if (n > 0 && (!values || !scales || !out))
        return engram__err(-EINVAL, "dequant: values, scales and out are required");
    for (size_t i = 0; i < n; i++)
        out[i] = engram__fp8_e8m0_to_bf16(v[i], s[i / ENGRAM__FP8_BLOCK]);
    return 0;
}
