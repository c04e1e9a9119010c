/*
 * nprandom.h - numpy's default random stream, bit for bit (internal).
 *
 * The Engram hash of a released model draws its multipliers with
 * numpy.random.default_rng(seed).integers(0, bound, size=n, dtype=int64),
 * so the library reproduces exactly that stream: numpy's SeedSequence
 * (the entropy pool of 4 words, its hash mixing, generate_state), the
 * PCG64 generator (XSL-RR 128/64, seeded from four 64-bit words of the
 * seed sequence) and Generator.integers' bounded method for int64 (Lemire's
 * multiply-shift with rejection: 32-bit draws, served from the halves of
 * one 64-bit output, when the range fits 32 bits; 64-bit draws above).
 * tests/test_ngram.c holds draws made by numpy, and the Python tests
 * compare against numpy itself for many seeds and bounds.
 *
 * What it does not own: any other numpy distribution, seeds that are not
 * one non-negative integer below 2^64, or Generator state after the draw.
 */
#ifndef ENGRAM_NPRANDOM_H
#define ENGRAM_NPRANDOM_H

#include <stddef.h>
#include <stdint.h>

typedef struct engram__pcg64 {
    unsigned __int128 state, inc;
    uint32_t half;     /* the upper half of the last 64-bit output, while has_half */
    int has_half;
} engram__pcg64;

/* Seeds g as numpy.random.default_rng(seed) (PCG64 over SeedSequence(seed)). */
void engram__pcg64_seed(engram__pcg64 *g, uint64_t seed);

uint64_t engram__pcg64_next64(engram__pcg64 *g);
uint32_t engram__pcg64_next32(engram__pcg64 *g);

/* out[i] for i < n as Generator.integers(low, high, size=n, dtype=int64)
 * draws them (high exclusive; low < high). */
void engram__np_integers(engram__pcg64 *g, int64_t low, int64_t high, int64_t *out, size_t n);

#endif
