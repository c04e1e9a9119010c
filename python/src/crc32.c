/*
 * crc32.c - _engram._crc32(buf, crc): zlib's CRC-32 of the 16-byte blocks
 * of a buffer, folded with carry-less multiplication (PCLMULQDQ), for the
 * Mooncake pull, which checks every byte it copies against the manifest's
 * CRC-32: zlib's table-driven crc32 (about 1 GB/s a core) took as long as
 * a third of the transfer itself, on the same CPUs.  The algorithm and its
 * constants are those of Intel's "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction" for the bit-reflected CRC-32
 * (polynomial 0x04C11DB7), as zlib's x86 builds use them.
 *
 * It does only the part of a buffer that is whole 16-byte blocks, at least
 * 64 bytes of them; the caller finishes the tail with zlib.crc32 (it gets
 * back how many bytes were done).  Where the CPU lacks PCLMULQDQ or SSE4.1,
 * or on other architectures, it does nothing (0 bytes) and zlib does all.
 */
#include "ext.h"

#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define CRC_TARGET __attribute__((target("pclmul,sse4.1")))

/* crc: the running CRC without zlib's final inversion (~ of zlib's);
 * len: a multiple of 16, at least 64. */
CRC_TARGET static uint32_t crc32_fold(const unsigned char *buf, size_t len, uint32_t crc)
{
    static const uint64_t __attribute__((aligned(16))) k1k2[] = {0x0154442bd4, 0x01c6e41596};
    static const uint64_t __attribute__((aligned(16))) k3k4[] = {0x01751997d0, 0x00ccaa009e};
    static const uint64_t __attribute__((aligned(16))) k5k0[] = {0x0163cd6124, 0x0000000000};
    static const uint64_t __attribute__((aligned(16))) poly[] = {0x01db710641, 0x01f7011641};
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = _mm_load_si128((const __m128i *)(const void *)k1k2);
    buf += 64;
    len -= 64;
    /* Four blocks folded at once. */
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(const void *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }
    /* The four into one. */
    x0 = _mm_load_si128((const __m128i *)(const void *)k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    /* The remaining blocks, one at a time. */
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)(const void *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 bits to 64. */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64((const __m128i *)(const void *)k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits. */
    x0 = _mm_load_si128((const __m128i *)(const void *)poly);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

static int have_fold(void)
{
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}
#else
static uint32_t crc32_fold(const unsigned char *buf, size_t len, uint32_t crc)
{
    (void)buf;
    (void)len;
    return crc;
}

static int have_fold(void)
{
    return 0;
}
#endif

const char ext_crc32_doc[] = PyDoc_STR(
"_crc32($module, buf, crc, /)\n--\n\n"
"(crc, done): zlib.crc32 of the first `done` bytes of buf (a contiguous\n"
"buffer) continuing from `crc`, folded with PCLMULQDQ: the whole 16-byte\n"
"blocks of at least 64 bytes, or none (done 0: too short, or a CPU\n"
"without it).  The caller goes on with zlib.crc32(buf[done:], crc).  The\n"
"GIL is released.");

PyObject *ext_crc32(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    unsigned long crc;
    size_t len = 0;
    uint32_t out;
    (void)mod;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "_crc32: expected 2 arguments, got %zd", nargs);
        return NULL;
    }
    crc = PyLong_AsUnsignedLong(args[1]);
    if (crc == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (crc > 0xffffffffUL) {
        PyErr_Format(PyExc_ValueError, "crc: %lu is not a CRC-32", crc);
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    out = (uint32_t)crc;
    if (view.len >= 64 && have_fold()) {
        len = (size_t)view.len & ~(size_t)15;
        Py_BEGIN_ALLOW_THREADS
        out = ~crc32_fold((const unsigned char *)view.buf, len, ~(uint32_t)crc);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(kn)", (unsigned long)out, (Py_ssize_t)len);
}
