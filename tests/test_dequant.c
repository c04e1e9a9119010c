/*
 * test_dequant.c - the CPU reference of FP8 E4M3 x E8M0 -> BF16
 * (engram_dequant_fp8_e4m3_e8m0_ref), which the CUDA dequant kernel must
 * match bit for bit.
 *
 * Known values first (each written out by hand from the format
 * definitions), then all 256 x 256 (value, scale) pairs against an
 * independent computation: decode both to double with ldexp(), multiply
 * (exact in double), and round to BF16 through float with the usual
 * round-to-nearest-even bit trick.  The two share no code.
 */
#include <math.h>

#include "testutil.h"

/* One value times one scale through the public function. */
static uint16_t dq(uint8_t v, uint8_t s)
{
    uint8_t vals[32], scales[1] = {s};
    uint16_t out[32];
    memset(vals, 0, sizeof vals);
    vals[5] = v;
    ASSERT_OK(engram_dequant_fp8_e4m3_e8m0_ref(vals, scales, 32, out));
    return out[5];
}

/* The independent reference: E4M3fn and E8M0 decoded with ldexp. */
static double e4m3_to_double(uint8_t v)
{
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    double x;
    if ((v & 0x7f) == 0x7f)
        return NAN;
    x = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -x : x;
}

static uint16_t double_to_bf16(double d)
{
    float f = (float)d; /* exact here: at most 4 significant bits, >= 2^-136 */
    uint32_t u;
    if (isnan(d))
        return 0x7fc0;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) /* inf: no rounding */
        return (uint16_t)(u >> 16);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t independent(uint8_t v, uint8_t s)
{
    if (s == 255)
        return 0x7fc0;
    return double_to_bf16(e4m3_to_double(v) * ldexp(1.0, s - 127));
}

static void test_known_values(void)
{
    tu_current_case = "known values";
    ASSERT_EQ(dq(0x38, 127), 0x3f80); /* 1.0 x 1 */
    ASSERT_EQ(dq(0xb8, 127), 0xbf80); /* -1.0 */
    ASSERT_EQ(dq(0x38, 128), 0x4000); /* 1.0 x 2 = 2.0 */
    ASSERT_EQ(dq(0x38, 126), 0x3f00); /* 1.0 x 0.5 */
    ASSERT_EQ(dq(0x7e, 127), 0x43e0); /* 448, the largest E4M3fn */
    ASSERT_EQ(dq(0xfe, 127), 0xc3e0); /* -448 */
    ASSERT_EQ(dq(0x40, 127), 0x4000); /* 2.0 */
    ASSERT_EQ(dq(0x3c, 127), 0x3fc0); /* 1.5 */
    ASSERT_EQ(dq(0x00, 127), 0x0000); /* +0 */
    ASSERT_EQ(dq(0x80, 127), 0x8000); /* -0 keeps its sign */
    ASSERT_EQ(dq(0x00, 255), 0x7fc0); /* NaN scale wins even over zero */
    ASSERT_EQ(dq(0x01, 127), 0x3b00); /* smallest subnormal 2^-9 */
    ASSERT_EQ(dq(0x07, 127), 0x3c60); /* largest subnormal 7 * 2^-9 = 1.75 * 2^-7 */
    ASSERT_EQ(dq(0x08, 127), 0x3c80); /* smallest normal 2^-6 */
    ASSERT_EQ(dq(0x7f, 127), 0x7fc0); /* NaN */
    ASSERT_EQ(dq(0xff, 127), 0x7fc0); /* -NaN is the same canonical NaN */
    ASSERT_EQ(dq(0x38, 255), 0x7fc0); /* E8M0 255 is NaN */
    ASSERT_EQ(dq(0x38, 254), 0x7f00); /* 2^127 */
    ASSERT_EQ(dq(0x40, 254), 0x7f80); /* 2^128 overflows BF16: inf */
    ASSERT_EQ(dq(0xc0, 254), 0xff80); /* -inf */
    ASSERT_EQ(dq(0x7e, 254), 0x7f80); /* 448 * 2^127: inf */
    ASSERT_EQ(dq(0x38, 0), 0x0040);   /* byte 0 is 2^-127 (a BF16 subnormal), not 0 */
    ASSERT_EQ(dq(0x38, 1), 0x0080);   /* 2^-126: smallest normal */
    /* Subnormal BF16 results that need rounding: units of 2^-133. */
    ASSERT_EQ(dq(0x01, 0), 0x0000);   /* 2^-136 = 1/8 unit: down to +0 */
    ASSERT_EQ(dq(0x81, 0), 0x8000);   /* ... to -0 */
    ASSERT_EQ(dq(0x04, 0), 0x0000);   /* 2^-134 = 1/2 unit: tie to even (0) */
    ASSERT_EQ(dq(0x06, 0), 0x0001);   /* 3/4 unit: up */
    ASSERT_EQ(dq(0x0c, 0), 0x0002);   /* 1.5 * 2^-6 * 2^-127 = 1.5 units: tie to even (2) */
    ASSERT_EQ(dq(0x14, 0), 0x0003);   /* 1.5 * 2^-5 * 2^-127 = 3 units: exact */
    ASSERT_EQ(dq(0x0a, 0), 0x0001);   /* 1.25 units: down */
    ASSERT_EQ(dq(0x0e, 0), 0x0002);   /* 1.75 units: up */
}

static void test_all_pairs(void)
{
    tu_current_case = "all 65536 (value, scale) pairs vs an independent reference";
    for (int s = 0; s < 256; s++) {
        for (int v = 0; v < 256; v++) {
            uint16_t got = dq((uint8_t)v, (uint8_t)s), exp = independent((uint8_t)v, (uint8_t)s);
            if (got != exp) {
                fprintf(stderr, "FAIL: value 0x%02x scale %d: got 0x%04x, expected 0x%04x\n", v,
                        s, got, exp);
                tu_fail_exit();
            }
        }
    }
}

static void test_packed_row(void)
{
    /* A 264-byte packed row: 256 values, then 8 scales, one per 32. */
    uint8_t row[264];
    uint16_t out[256];
    tu_current_case = "packed 264-byte row: each block uses its own scale";
    for (int i = 0; i < 256; i++)
        row[i] = (uint8_t)(i * 37 + 11);
    for (int b = 0; b < 8; b++)
        row[256 + b] = (uint8_t)(120 + b);
    ASSERT_OK(engram_dequant_fp8_e4m3_e8m0_ref(row, row + 256, 256, out));
    for (int i = 0; i < 256; i++)
        ASSERT_EQ(out[i], independent(row[i], row[256 + i / 32]));
}

static void test_errors(void)
{
    uint8_t v[64] = {0}, s[2] = {127, 127};
    uint16_t out[64];
    tu_current_case = "bad arguments";
    ASSERT_EQ(engram_dequant_fp8_e4m3_e8m0_ref(v, s, 33, out), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "multiple of 32");
    ASSERT_EQ(engram_dequant_fp8_e4m3_e8m0_ref(NULL, s, 32, out), -EINVAL);
    ASSERT_EQ(engram_dequant_fp8_e4m3_e8m0_ref(v, s, 32, NULL), -EINVAL);
    ASSERT_OK(engram_dequant_fp8_e4m3_e8m0_ref(NULL, NULL, 0, NULL)); /* nothing to do */
}

int main(void)
{
    test_known_values();
    test_all_pairs();
    test_packed_row();
    test_errors();
    printf("test_dequant: ok\n");
    return 0;
}
