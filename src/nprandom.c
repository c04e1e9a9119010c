/*
 * nprandom.c - numpy's SeedSequence, PCG64 and Generator.integers for
 * int64, bit for bit (see nprandom.h).  Every constant and step below is
 * numpy's; all SeedSequence arithmetic is modulo 2^32, as numpy does it.
 */
#include "nprandom.h"

#define POOL_SIZE 4
#define INIT_A 0x43b0d7e5u
#define MULT_A 0x931e8875u
#define INIT_B 0x8b51f9ddu
#define MULT_B 0x58f38dedu
#define MIX_MULT_L 0xca01f9ddu
#define MIX_MULT_R 0x4973f715u
#define XSHIFT 16

static uint32_t hashmix(uint32_t value, uint32_t *hash_const)
{
    value ^= *hash_const;
    *hash_const *= MULT_A;
    value *= *hash_const;
    value ^= value >> XSHIFT;
    return value;
}

static uint32_t mix(uint32_t x, uint32_t y)
{
    uint32_t r = MIX_MULT_L * x - MIX_MULT_R * y;
    return r ^ (r >> XSHIFT);
}

/* SeedSequence(seed).generate_state(4, uint64) into words[4]. */
static void seed_sequence(uint64_t seed, uint64_t words[4])
{
    uint32_t entropy[2], pool[POOL_SIZE], hash_const = INIT_A, out[8];
    size_t n = 0;
    /* The seed as 32-bit words, least significant first; 0 is one word. */
    do {
        entropy[n++] = (uint32_t)seed;
        seed >>= 32;
    } while (seed != 0);
    for (size_t i = 0; i < POOL_SIZE; i++)
        pool[i] = hashmix(i < n ? entropy[i] : 0, &hash_const);
    for (size_t src = 0; src < POOL_SIZE; src++)
        for (size_t dst = 0; dst < POOL_SIZE; dst++)
            if (src != dst)
                pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
    /* At most 2 words of entropy: none beyond the pool's 4. */
    hash_const = INIT_B;
    for (size_t i = 0; i < 8; i++) {
        uint32_t v = pool[i % POOL_SIZE];
        v ^= hash_const;
        hash_const *= MULT_B;
        v *= hash_const;
        v ^= v >> XSHIFT;
        out[i] = v;
    }
    for (size_t i = 0; i < 4; i++)
        words[i] = (uint64_t)out[2 * i] | (uint64_t)out[2 * i + 1] << 32;
}

#define PCG_MULT (((unsigned __int128)2549297995355413924ull << 64) | 4865540595714422341ull)

static void pcg_step(engram__pcg64 *g)
{
    g->state = g->state * PCG_MULT + g->inc;
}

void engram__pcg64_seed(engram__pcg64 *g, uint64_t seed)
{
    uint64_t w[4];
    seed_sequence(seed, w);
    g->state = 0;
    g->inc = ((unsigned __int128)w[2] << 64 | w[3]) << 1 | 1;
    pcg_step(g);
    g->state += (unsigned __int128)w[0] << 64 | w[1];
    pcg_step(g);
    g->half = 0;
    g->has_half = 0;
}

uint64_t engram__pcg64_next64(engram__pcg64 *g)
{
    uint64_t x;
    unsigned rot;
    pcg_step(g);
    /* XSL-RR: the halves xored, rotated by the top 6 bits. */
    x = (uint64_t)(g->state >> 64) ^ (uint64_t)g->state;
    rot = (unsigned)(g->state >> 122);
    return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t engram__pcg64_next32(engram__pcg64 *g)
{
    uint64_t x;
    if (g->has_half) {
        g->has_half = 0;
        return g->half;
    }
    x = engram__pcg64_next64(g);
    g->has_half = 1;
    g->half = (uint32_t)(x >> 32);
    return (uint32_t)x;
}

/* A draw in [0, rng] (rng < 2^32 - 1): Lemire's method on 32-bit draws. */
static uint64_t lemire32(engram__pcg64 *g, uint32_t rng)
{
    uint32_t excl = rng + 1, leftover;
    uint64_t m = (uint64_t)engram__pcg64_next32(g) * excl;
    leftover = (uint32_t)m;
    if (leftover < excl) {
        uint32_t threshold = (UINT32_MAX - rng) % excl;
        while (leftover < threshold) {
            m = (uint64_t)engram__pcg64_next32(g) * excl;
            leftover = (uint32_t)m;
        }
    }
    return m >> 32;
}

/* A draw in [0, rng] (rng < 2^64 - 1): the same on 64-bit draws. */
static uint64_t lemire64(engram__pcg64 *g, uint64_t rng)
{
    uint64_t excl = rng + 1, leftover;
    unsigned __int128 m = (unsigned __int128)engram__pcg64_next64(g) * excl;
    leftover = (uint64_t)m;
    if (leftover < excl) {
        uint64_t threshold = (UINT64_MAX - rng) % excl;
        while (leftover < threshold) {
            m = (unsigned __int128)engram__pcg64_next64(g) * excl;
            leftover = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

void engram__np_integers(engram__pcg64 *g, int64_t low, int64_t high, int64_t *out, size_t n)
{
    /* The inclusive range, as numpy computes it in unsigned arithmetic. */
    uint64_t rng = (uint64_t)high - 1u - (uint64_t)low, off = (uint64_t)low;
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        if (rng == 0)
            v = 0;
        else if (rng == UINT32_MAX)
            v = engram__pcg64_next32(g);
        else if (rng < UINT32_MAX)
            v = lemire32(g, (uint32_t)rng);
        else if (rng == UINT64_MAX)
            v = engram__pcg64_next64(g);
        else
            v = lemire64(g, rng);
        out[i] = (int64_t)(off + v);
    }
}
