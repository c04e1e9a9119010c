/*
 * ngram.c - tokens to rows: the Engram n-gram layout and hash (the
 * contract is in include/engram.h, "Tokens to rows"; docs/ngram.md has the
 * algorithm with an engine's loop around it).
 *
 * The layout is computed once: primes by a deterministic Miller-Rabin
 * search above vocab_size - 1 that skips every prime already handed out
 * (a small hash set), multipliers from numpy's stream (nprandom.c).
 *
 * The hash is the hot part.  A position's effective n-gram values do not
 * depend on the layer (a DEAD token or the request's start blocks every
 * longer n-gram the same way), so they are worked out once per position;
 * each layer then does N multiply-xors and one reduction per column.  The
 * reductions use Barrett's method with a reciprocal per column computed
 * when the hasher is made: one 64x64->128 multiply, one multiply and one
 * conditional subtraction instead of a hardware division.  Where the CPU
 * has AVX-512 (F and DQ) and every prime is at least 2^12, the heads of an
 * order are reduced 8 at a time instead: they share one rolling value, so
 * a double-precision quotient estimate of it by each prime (off by at most
 * one for such primes, see reduce8()) corrected in exact 64-bit integer
 * arithmetic.  ENGRAM_NGRAM_SCALAR=1 in the environment (read when a hasher
 * is made) keeps the scalar path, which the tests compare with.  Every
 * token is validated before the first id is written, so a bad token leaves
 * the output untouched.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "async.h"
#include "common.h"
#include "nprandom.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX512_PATH 1
#else
#define HAVE_AVX512_PATH 0
#endif

/* Primes at least this large let the double quotient be off by one at
 * most (see reduce8()). */
#define SIMD_MIN_PRIME ((uint64_t)1 << 12)

#define SEED_MULT 10007 /* the models' multiplier seed: 10007 * layer_id */
_Static_assert((ENGRAM_NGRAM_MAX_N & (ENGRAM_NGRAM_MAX_N - 1)) == 0,
               "the hash's window of ids is a ring of ENGRAM_NGRAM_MAX_N");
#define NUM_MAX ((uint64_t)1 << 62)

struct engram_ngram_layout {
    engram_ngram_layout_info info;
    int64_t *layer_ids;
    uint64_t *primes;
    int64_t *offsets;
    int64_t *mults;
    uint64_t *rows;
};

struct engram_ngram_hasher {
    uint32_t L, N, H, C;
    uint64_t cv;
    int64_t pad;
    int64_t *mults;   /* [L * N] */
    uint64_t *primes; /* [L * C] */
    uint64_t *minv;   /* [L * C]: floor((2^64 - 1) / prime), Barrett's reciprocal */
    double *inv;      /* [L * C]: 1.0 / prime, for the vector path */
    int simd;         /* use the AVX-512 path */
    int64_t *offsets; /* [L * C] */
    uint64_t *rows;   /* [L] */
    uint64_t *pmax;   /* [L]: the layer's largest prime */
    int64_t *map;     /* [map_len] or NULL */
    uint64_t map_len;
};

/* ------------------------------------------------------------------------
 * Primes.
 */

static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m)
{
    return (uint64_t)((unsigned __int128)a * b % m);
}

static uint64_t powmod(uint64_t b, uint64_t e, uint64_t m)
{
    uint64_t r = 1 % m;
    b %= m;
    while (e) {
        if (e & 1)
            r = mulmod(r, b, m);
        b = mulmod(b, b, m);
        e >>= 1;
    }
    return r;
}

/* Deterministic for every n below 2^64: Miller-Rabin with the first 12
 * primes as bases. */
static int is_prime(uint64_t n)
{
    static const uint64_t bases[12] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
    uint64_t d = n - 1;
    unsigned r = 0;
    if (n < 2)
        return 0;
    for (size_t i = 0; i < 12; i++) {
        if (n == bases[i])
            return 1;
        if (n % bases[i] == 0)
            return 0;
    }
    while ((d & 1) == 0) {
        d >>= 1;
        r++;
    }
    for (size_t i = 0; i < 12; i++) {
        uint64_t x = powmod(bases[i], d, n);
        unsigned k;
        if (x == 1 || x == n - 1)
            continue;
        for (k = 1; k < r; k++) {
            x = mulmod(x, x, n);
            if (x == n - 1)
                break;
        }
        if (k == r)
            return 0;
    }
    return 1;
}

/* The primes handed out so far: an open-addressing set (0 = empty). */
typedef struct pset {
    uint64_t *slot;
    size_t mask;
} pset;

static size_t pset_home(const pset *s, uint64_t v)
{
    return (size_t)((v * 0x9E3779B97F4A7C15ull) >> 17) & s->mask;
}

static int pset_has(const pset *s, uint64_t v)
{
    for (size_t i = pset_home(s, v);; i = (i + 1) & s->mask) {
        if (s->slot[i] == v)
            return 1;
        if (s->slot[i] == 0)
            return 0;
    }
}

static void pset_add(pset *s, uint64_t v)
{
    size_t i = pset_home(s, v);
    while (s->slot[i] != 0)
        i = (i + 1) & s->mask;
    s->slot[i] = v;
}

/* The smallest prime above `after` not in the set, or 0 past NUM_MAX. */
static uint64_t next_prime(const pset *s, uint64_t after)
{
    for (uint64_t c = after + 1; c <= NUM_MAX; c++)
        if (is_prime(c) && !pset_has(s, c))
            return c;
    return 0;
}

/* ------------------------------------------------------------------------
 * The layout.
 */

void engram_ngram_layout_destroy(engram_ngram_layout *lay)
{
    if (!lay)
        return;
    free(lay->layer_ids);
    free(lay->primes);
    free(lay->offsets);
    free(lay->mults);
    free(lay->rows);
    free(lay);
}

/* The multipliers' bound: every product of a compressed id and a
 * multiplier stays below 2^63. */
static uint64_t mult_max(uint64_t cv)
{
    return cv > 1 ? (uint64_t)INT64_MAX / (cv - 1) : (uint64_t)INT64_MAX;
}

static int check_config(const engram_ngram_config *c)
{
    if (c->size != sizeof *c)
        return engram__err(-EINVAL, "engram_ngram_config.size is %u, expected %zu", c->size,
                           sizeof *c);
    if (c->num_layers < 1 || c->num_layers > ENGRAM_NGRAM_MAX_LAYERS || !c->layer_ids)
        return engram__err(ENGRAM_ESPEC, "num_layers %u is not in 1..%d (with layer_ids)",
                           c->num_layers, ENGRAM_NGRAM_MAX_LAYERS);
    for (uint32_t l = 0; l < c->num_layers; l++)
        if (c->layer_ids[l] < 0 || (uint64_t)c->layer_ids[l] > UINT64_MAX / SEED_MULT)
            return engram__err(ENGRAM_ESPEC, "layer_ids[%u] = %" PRId64 " is negative or too "
                                             "large",
                               l, c->layer_ids[l]);
    if (c->max_ngram < 2 || c->max_ngram > ENGRAM_NGRAM_MAX_N)
        return engram__err(ENGRAM_ESPEC, "max_ngram %u is not in 2..%d", c->max_ngram,
                           ENGRAM_NGRAM_MAX_N);
    if (c->heads < 1 || (uint64_t)(c->max_ngram - 1) * c->heads > ENGRAM_NGRAM_MAX_COLS)
        return engram__err(ENGRAM_ESPEC, "heads %u: (max_ngram - 1) * heads must be in 1..%d",
                           c->heads, ENGRAM_NGRAM_MAX_COLS);
    if (c->compressed_vocab < 1 || c->compressed_vocab > NUM_MAX)
        return engram__err(ENGRAM_ESPEC, "compressed_vocab %" PRIu64 " is not in 1..2^62",
                           c->compressed_vocab);
    if (c->pad_id < 0 || (uint64_t)c->pad_id >= c->compressed_vocab)
        return engram__err(ENGRAM_ESPEC, "pad_id %" PRId64 " is not a compressed id (0 <= "
                                         "pad_id < compressed_vocab %" PRIu64 ")",
                           c->pad_id, c->compressed_vocab);
    if (!c->primes && (c->vocab_size < 2 || c->vocab_size > NUM_MAX / 2))
        return engram__err(ENGRAM_ESPEC, "vocab_size %" PRIu64 " is not in 2..2^61",
                           c->vocab_size);
    return 0;
}

int engram_ngram_layout_create(const engram_ngram_config *cfg, engram_ngram_layout **out)
{
    engram_ngram_layout *lay = NULL;
    uint32_t L, N, H, C;
    pset seen = {NULL, 0};
    int err;

    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    *out = NULL;
    if (!cfg)
        return engram__err(-EINVAL, "config is NULL");
    if ((err = check_config(cfg)) != 0)
        return err;
    L = cfg->num_layers;
    N = cfg->max_ngram;
    H = cfg->heads;
    C = (N - 1) * H;
    if (!(lay = calloc(1, sizeof *lay)) || !(lay->layer_ids = malloc(L * sizeof(int64_t))) ||
        !(lay->primes = malloc((size_t)L * C * sizeof(uint64_t))) ||
        !(lay->offsets = malloc((size_t)L * C * sizeof(int64_t))) ||
        !(lay->mults = malloc((size_t)L * N * sizeof(int64_t))) ||
        !(lay->rows = malloc(L * sizeof(uint64_t)))) {
        err = engram__err(-ENOMEM, "out of memory for an n-gram layout");
        goto fail;
    }
    memcpy(lay->layer_ids, cfg->layer_ids, L * sizeof(int64_t));
    if (cfg->primes) {
        for (size_t i = 0; i < (size_t)L * C; i++) {
            if (cfg->primes[i] < 1 || cfg->primes[i] > NUM_MAX) {
                err = engram__err(ENGRAM_ESPEC, "primes[%zu] = %" PRIu64 " is not in 1..2^62",
                                  i, cfg->primes[i]);
                goto fail;
            }
            lay->primes[i] = cfg->primes[i];
        }
    } else {
        /* Primes handed out: the table size as a power of two, at most
         * half full. */
        size_t cap = 64;
        while (cap < (size_t)L * C * 2)
            cap *= 2;
        if (!(seen.slot = calloc(cap, sizeof *seen.slot))) {
            err = engram__err(-ENOMEM, "out of memory for an n-gram layout");
            goto fail;
        }
        seen.mask = cap - 1;
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t n = 0; n + 1 < N; n++) {
                uint64_t p = cfg->vocab_size - 1;
                for (uint32_t h = 0; h < H; h++) {
                    if ((p = next_prime(&seen, p)) == 0) {
                        err = engram__err(ENGRAM_ESPEC, "no prime left below 2^62 above "
                                                        "vocab_size");
                        goto fail;
                    }
                    pset_add(&seen, p);
                    lay->primes[((size_t)l * (N - 1) + n) * H + h] = p;
                }
            }
    }
    for (uint32_t l = 0; l < L; l++) {
        uint64_t sum = 0;
        for (uint32_t c = 0; c < C; c++) {
            lay->offsets[(size_t)l * C + c] = (int64_t)sum;
            if (engram__add_u64(sum, lay->primes[(size_t)l * C + c], &sum) || sum > NUM_MAX) {
                err = engram__err(ENGRAM_ESPEC, "layer %u: its columns' rows add up past 2^62",
                                  l);
                goto fail;
            }
        }
        lay->rows[l] = sum;
    }
    if (cfg->multipliers) {
        for (size_t i = 0; i < (size_t)L * N; i++) {
            if (cfg->multipliers[i] < 1 ||
                (uint64_t)cfg->multipliers[i] > mult_max(cfg->compressed_vocab)) {
                err = engram__err(ENGRAM_ESPEC, "multipliers[%zu] = %" PRId64 " is not in 1..%"
                                                PRIu64 " (INT64_MAX / (compressed_vocab - 1): "
                                                "larger ones overflow)",
                                  i, cfg->multipliers[i], mult_max(cfg->compressed_vocab));
                goto fail;
            }
            lay->mults[i] = cfg->multipliers[i];
        }
    } else {
        int64_t bound = (int64_t)(((uint64_t)INT64_MAX / cfg->compressed_vocab) / 2);
        if (bound < 1)
            bound = 1;
        for (uint32_t l = 0; l < L; l++) {
            engram__pcg64 g;
            engram__pcg64_seed(&g, (uint64_t)SEED_MULT * (uint64_t)cfg->layer_ids[l]);
            engram__np_integers(&g, 0, bound, lay->mults + (size_t)l * N, N);
            for (uint32_t s = 0; s < N; s++)
                lay->mults[(size_t)l * N + s] = lay->mults[(size_t)l * N + s] * 2 + 1;
        }
    }
    free(seen.slot);
    lay->info = (engram_ngram_layout_info)ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    lay->info.num_layers = L;
    lay->info.max_ngram = N;
    lay->info.heads = H;
    lay->info.num_cols = C;
    lay->info.vocab_size = cfg->vocab_size;
    lay->info.compressed_vocab = cfg->compressed_vocab;
    lay->info.pad_id = cfg->pad_id;
    lay->info.layer_ids = lay->layer_ids;
    lay->info.primes = lay->primes;
    lay->info.offsets = lay->offsets;
    lay->info.multipliers = lay->mults;
    lay->info.num_rows = lay->rows;
    *out = lay;
    return 0;
fail:
    free(seen.slot);
    engram_ngram_layout_destroy(lay);
    return err;
}

int engram_get_ngram_layout_info(const engram_ngram_layout *lay, engram_ngram_layout_info *info)
{
    if (!lay || !info || info->size != sizeof *info)
        return engram__err(-EINVAL, "a layout and info with size = sizeof(engram_ngram_layout_"
                                    "info) are required");
    *info = lay->info;
    return 0;
}

/* ------------------------------------------------------------------------
 * The hasher.
 */

void engram_ngram_hasher_destroy(engram_ngram_hasher *h)
{
    if (!h)
        return;
    free(h->mults);
    free(h->primes);
    free(h->minv);
    free(h->inv);
    free(h->offsets);
    free(h->rows);
    free(h->pmax);
    free(h->map);
    free(h);
}

int engram_ngram_hasher_create(const engram_ngram_layout *lay, const int64_t *token_map,
                               uint64_t map_len, engram_ngram_hasher **out)
{
    const engram_ngram_layout_info *li;
    engram_ngram_hasher *h;
    size_t lc;
    int err;

    if (!out)
        return engram__err(-EINVAL, "out is NULL");
    *out = NULL;
    if (!lay)
        return engram__err(-EINVAL, "layout is NULL");
    if (!token_map != !map_len)
        return engram__err(-EINVAL, "token_map and map_len go together (NULL and 0: no map)");
    li = &lay->info;
    lc = (size_t)li->num_layers * li->num_cols;
    if (!(h = calloc(1, sizeof *h)))
        return engram__err(-ENOMEM, "out of memory for an n-gram hasher");
    h->L = li->num_layers;
    h->N = li->max_ngram;
    h->H = li->heads;
    h->C = li->num_cols;
    h->cv = li->compressed_vocab;
    h->pad = li->pad_id;
    if (!(h->mults = malloc((size_t)h->L * h->N * sizeof(int64_t))) ||
        !(h->primes = malloc(lc * sizeof(uint64_t))) || !(h->minv = malloc(lc * sizeof(uint64_t))) ||
        !(h->inv = malloc(lc * sizeof(double))) ||
        !(h->offsets = malloc(lc * sizeof(int64_t))) ||
        !(h->rows = malloc(h->L * sizeof(uint64_t))) ||
        !(h->pmax = calloc(h->L, sizeof(uint64_t))) ||
        (token_map && map_len > SIZE_MAX / sizeof(int64_t)) ||
        (token_map && !(h->map = malloc((size_t)map_len * sizeof(int64_t))))) {
        err = engram__err(-ENOMEM, "out of memory for an n-gram hasher");
        goto fail;
    }
    memcpy(h->mults, li->multipliers, (size_t)h->L * h->N * sizeof(int64_t));
    memcpy(h->primes, li->primes, lc * sizeof(uint64_t));
    memcpy(h->offsets, li->offsets, lc * sizeof(int64_t));
    memcpy(h->rows, li->num_rows, h->L * sizeof(uint64_t));
    h->simd = HAVE_AVX512_PATH;
#if HAVE_AVX512_PATH
    __builtin_cpu_init(); /* needed where no constructor ran it (a library loaded late) */
    h->simd = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
#endif
    {
        const char *e = getenv("ENGRAM_NGRAM_SCALAR");
        if (e && strcmp(e, "1") == 0)
            h->simd = 0;
    }
    for (size_t i = 0; i < lc; i++) {
        h->minv[i] = UINT64_MAX / h->primes[i];
        h->inv[i] = 1.0 / (double)h->primes[i];
        if (h->primes[i] < SIMD_MIN_PRIME)
            h->simd = 0;
        if (h->primes[i] > h->pmax[i / h->C])
            h->pmax[i / h->C] = h->primes[i];
    }
    for (uint64_t t = 0; t < map_len; t++) {
        if (token_map[t] < 0 || (uint64_t)token_map[t] >= h->cv) {
            err = engram__err(ENGRAM_ESPEC, "token_map[%" PRIu64 "] = %" PRId64 " is not a "
                                            "compressed id (0 <= id < %" PRIu64 ")",
                              t, token_map[t], h->cv);
            goto fail;
        }
        h->map[t] = token_map[t];
    }
    h->map_len = map_len;
    *out = h;
    return 0;
fail:
    engram_ngram_hasher_destroy(h);
    return err;
}

/* x mod p by Barrett's method (minv = floor((2^64 - 1) / p)): the
 * quotient estimate is low by at most one, for any x below 2^64. */
static inline uint64_t reduce(uint64_t x, uint64_t p, uint64_t minv)
{
    uint64_t q = (uint64_t)(((unsigned __int128)x * minv) >> 64);
    uint64_t r = x - q * p;
    return r >= p ? r - p : r;
}

static inline int64_t token_at(const void *base, int type, size_t i)
{
    return type == ENGRAM_ID_INT32 ? ((const int32_t *)base)[i] : ((const int64_t *)base)[i];
}

/* The compressed id of `raw` (DEAD stays DEAD), or -2 if it is not a
 * token this hasher takes. */
static inline int64_t compress(const engram_ngram_hasher *h, int64_t raw)
{
    if (raw == ENGRAM_DEAD_ID)
        return ENGRAM_DEAD_ID;
    if (h->map)
        return raw >= 0 && (uint64_t)raw < h->map_len ? h->map[raw] : -2;
    return raw >= 0 && (uint64_t)raw < h->cv ? raw : -2;
}

static int bad_token(const engram_ngram_hasher *h, const char *what, size_t i, size_t req,
                     size_t nreq, int64_t v)
{
    char where[48] = "";
    if (nreq > 1)
        snprintf(where, sizeof where, " (request %zu)", req);
    if (h->map)
        return engram__err(ENGRAM_EBADID, "%s[%zu] = %" PRId64 "%s is not a token of the map "
                                          "(0 <= token < %" PRIu64 ", or -1)",
                           what, i, v, where, h->map_len);
    return engram__err(ENGRAM_EBADID, "%s[%zu] = %" PRId64 "%s is not a compressed id (0 <= id "
                                      "< compressed_vocab %" PRIu64 ", or -1)",
                       what, i, v, where, h->cv);
}

/* The ids of one position for the hashed layers, from its effective
 * values e[0..N-1] (blocking applied). */
static inline __attribute__((always_inline)) void hash_position(const engram_ngram_hasher *h, const int64_t *e, uint32_t l0,
                                 uint32_t l1, int local, void *out, size_t base, int out32,
                                 uint32_t unused)
{
    (void)unused; /* the vector path's head count */
    const uint32_t N = h->N, H = h->H, C = h->C;
    for (uint32_t l = l0; l < l1; l++) {
        const int64_t *m = h->mults + (size_t)l * N;
        const uint64_t *p = h->primes + (size_t)l * C, *mi = h->minv + (size_t)l * C;
        const int64_t *off = h->offsets + (size_t)l * C;
        uint64_t rolling = (uint64_t)(e[0] * m[0]);
        size_t o = base + (size_t)(l - l0) * C;
        for (uint32_t s = 1; s < N; s++) {
            rolling ^= (uint64_t)(e[s] * m[s]);
            for (uint32_t k = 0; k < H; k++) {
                uint32_t c = (s - 1) * H + k;
                int64_t id = (int64_t)reduce(rolling, p[c], mi[c]) + (local ? 0 : off[c]);
                if (out32)
                    ((int32_t *)out)[o + c] = (int32_t)id;
                else
                    ((int64_t *)out)[o + c] = id;
            }
        }
    }
}

#if HAVE_AVX512_PATH
/* x mod p for the up to 8 primes of p[0..n) at once (x < 2^63, each prime
 * in [2^12, 2^62]): q = trunc(double(x) * (1 / p)) is within one of the
 * true quotient, because each of the three roundings (x, 1/p, the product)
 * errs by at most 2^-53 relative, about 3 * 2^-53 * x / p < 1 in all;
 * r = x - q * p, exact modulo 2^64, then lies in (-p, 2p) and one
 * correction each way brings it to [0, p). */
__attribute__((target("avx512f,avx512dq"))) static inline __m512i
reduce8(uint64_t x, const uint64_t *p, const double *inv, __mmask8 m)
{
    __m512i pv = _mm512_maskz_loadu_epi64(m, p), xv = _mm512_set1_epi64((long long)x);
    /* x to double in the vector unit: a scalar conversion would depend on
     * the old contents of its register and chain the orders' reductions
     * one after the other. */
    __m512d q = _mm512_mul_pd(_mm512_cvtepi64_pd(xv), _mm512_maskz_loadu_pd(m, inv));
    __m512i r = _mm512_sub_epi64(xv, _mm512_mullo_epi64(_mm512_cvttpd_epi64(q), pv));
    r = _mm512_mask_add_epi64(r, _mm512_cmplt_epi64_mask(r, _mm512_setzero_si512()), r, pv);
    return _mm512_mask_sub_epi64(r, _mm512_mask_cmpge_epi64_mask(m, r, pv), r, pv);
}

/* hash_position() with reduce8(): the heads of one order, 8 at a time. */
__attribute__((target("avx512f,avx512dq"), always_inline)) static inline void
hash_position8(const engram_ngram_hasher *h, const int64_t *e, uint32_t l0, uint32_t l1,
               int local, void *out, size_t base, int out32, uint32_t H8)
{
    /* H8: 8 when the layout has 8 heads (the models' count), for a loop of
     * one full vector the compiler sees; 0 otherwise. */
    const uint32_t N = h->N, H = H8 ? H8 : h->H, C = h->C;
    for (uint32_t l = l0; l < l1; l++) {
        const int64_t *m = h->mults + (size_t)l * N;
        const uint64_t *p = h->primes + (size_t)l * C;
        const double *inv = h->inv + (size_t)l * C;
        const int64_t *off = h->offsets + (size_t)l * C;
        uint64_t rolling = (uint64_t)(e[0] * m[0]);
        size_t o = base + (size_t)(l - l0) * C;
        for (uint32_t s = 1; s < N; s++) {
            rolling ^= (uint64_t)(e[s] * m[s]);
            for (uint32_t k = 0; k < H; k += 8) {
                uint32_t c = (s - 1) * H + k;
                __mmask8 msk = (__mmask8)(H - k >= 8 ? 0xff : (1u << (H - k)) - 1);
                __m512i id = reduce8(rolling, p + c, inv + c, msk);
                if (!local)
                    id = _mm512_add_epi64(id, _mm512_maskz_loadu_epi64(msk, off + c));
                if (out32)
                    _mm512_mask_cvtepi64_storeu_epi32((int32_t *)out + o + c, msk, id);
                else
                    _mm512_mask_storeu_epi64((int64_t *)out + o + c, msk, id);
            }
        }
    }
}
#endif

/* The body of hash_request() with `POSITION` as the per-position hash:
 * written once, compiled for the scalar and the vector path. */
#define HASH_REQUEST_BODY(POSITION, H8)                                                         \
    const uint32_t N = h->N;                                                                    \
    int64_t win[ENGRAM_NGRAM_MAX_N] = {0}, e[ENGRAM_NGRAM_MAX_N];                               \
    size_t nl = l1 - l0, known = 0;                                                             \
    /* A ring of the last N ids: the id at p - s is win[(known - 1 - s) % MAX_N];               \
     * `known` of them exist (MAX_N is a power of two). */                                      \
    for (size_t i = h0; i < h1; i++)                                                            \
        win[known++ & (ENGRAM_NGRAM_MAX_N - 1)] =                                               \
            compress(h, token_at(a->history, a->token_type, i));                                \
    /* A part of a request split between threads starts with the tokens                         \
     * before it, [t0, ts), whose ids are not its to write. */                                  \
    for (size_t t = t0; t < ts; t++)                                                            \
        win[known++ & (ENGRAM_NGRAM_MAX_N - 1)] = compress(h, token_at(a->tokens, a->token_type, t)); \
    for (size_t t = ts; t < t1; t++) {                                                          \
        int blocked = 0;                                                                        \
        win[known++ & (ENGRAM_NGRAM_MAX_N - 1)] = compress(h, token_at(a->tokens, a->token_type, t)); \
        for (uint32_t s = 0; s < N; s++) {                                                      \
            int64_t v = s < known ? win[(known - 1 - s) & (ENGRAM_NGRAM_MAX_N - 1)] : 0;         \
            blocked |= s >= known || v == ENGRAM_DEAD_ID;                                       \
            e[s] = blocked ? h->pad : v;                                                        \
        }                                                                                       \
        POSITION(h, e, l0, l1, local, a->out, t * nl * h->C, out32, H8);                        \
    }

/* Hashes request r's chunk [t0, t1) with its history: inlined with
 * constant flags below, so the inner loop has no branch on them. */
static inline __attribute__((always_inline)) void hash_request(const engram_ngram_hasher *h, const engram_ngram_hash_args *a,
                                size_t t0, size_t ts, size_t t1, size_t h0, size_t h1,
                                uint32_t l0, uint32_t l1, int local, int out32)
{
    HASH_REQUEST_BODY(hash_position, 0)
}

static void hash_request_any(const engram_ngram_hasher *h, const engram_ngram_hash_args *a,
                             size_t t0, size_t ts, size_t t1, size_t h0, size_t h1, uint32_t l0,
                             uint32_t l1, int local, int out32)
{
    if (out32)
        local ? hash_request(h, a, t0, ts, t1, h0, h1, l0, l1, 1, 1)
              : hash_request(h, a, t0, ts, t1, h0, h1, l0, l1, 0, 1);
    else
        local ? hash_request(h, a, t0, ts, t1, h0, h1, l0, l1, 1, 0)
              : hash_request(h, a, t0, ts, t1, h0, h1, l0, l1, 0, 0);
}

#if HAVE_AVX512_PATH
__attribute__((target("avx512f,avx512dq"), always_inline)) static inline void
hash_request8(const engram_ngram_hasher *h, const engram_ngram_hash_args *a, size_t t0, size_t ts,
              size_t t1, size_t h0, size_t h1, uint32_t l0, uint32_t l1, int local, int out32,
              uint32_t H8)
{
    HASH_REQUEST_BODY(hash_position8, H8)
}

__attribute__((target("avx512f,avx512dq"))) static void
hash_request8_any(const engram_ngram_hasher *h, const engram_ngram_hash_args *a, size_t t0,
                  size_t ts, size_t t1, size_t h0, size_t h1, uint32_t l0, uint32_t l1, int local,
                  int out32)
{
    if (h->H != 8) {
        hash_request8(h, a, t0, ts, t1, h0, h1, l0, l1, local, out32, 0);
        return;
    }
    if (out32)
        local ? hash_request8(h, a, t0, ts, t1, h0, h1, l0, l1, 1, 1, 8)
              : hash_request8(h, a, t0, ts, t1, h0, h1, l0, l1, 0, 1, 8);
    else
        local ? hash_request8(h, a, t0, ts, t1, h0, h1, l0, l1, 1, 0, 8)
              : hash_request8(h, a, t0, ts, t1, h0, h1, l0, l1, 0, 0, 8);
}
#endif

/* Large batches are cut into parts of consecutive tokens hashed by
 * threads of their own (made for the call: the batches worth it take
 * milliseconds).  A part that starts inside a request begins with the
 * tokens before it, so each position sees the same n-grams whoever hashes
 * it. */
#define MAX_THREADS 8
#define PART_MIN_TOKENS 16384

typedef struct hash_part {
    const engram_ngram_hasher *h;
    const engram_ngram_hash_args *a;
    size_t R, T;
    uint32_t l0, l1;
    int local, out32;
    uint32_t part, nparts;
} hash_part;

/* Request r's tokens [*t0, *t1) and history [*h0, *h1) in a batch of R
 * requests of T tokens in all. */
static void request_bounds(const engram_ngram_hash_args *a, size_t R, size_t T, size_t r,
                           size_t *t0, size_t *t1, size_t *h0, size_t *h1)
{
    *t0 = R > 1 ? a->starts[r] : 0;
    *t1 = R > 1 ? a->starts[r + 1] : T;
    *h0 = 0;
    *h1 = R > 1 ? 0 : a->history_len;
    if (R > 1 && a->history) {
        *h0 = a->history_starts[r];
        *h1 = a->history_starts[r + 1];
    }
}

static void hash_part_run(const hash_part *p)
{
    const engram_ngram_hash_args *a = p->a;
    size_t p0 = p->T * p->part / p->nparts, p1 = p->T * (p->part + 1) / p->nparts;
    for (size_t r = 0; r < p->R; r++) {
        size_t t0, t1, h0, h1, ts, te, w0;
        request_bounds(a, p->R, p->T, r, &t0, &t1, &h0, &h1);
        if (t1 <= p0 || t0 >= p1 || t0 == t1)
            continue;
        ts = t0 > p0 ? t0 : p0;
        te = t1 < p1 ? t1 : p1;
        /* The N-1 tokens before the part (fewer near the request's start,
         * where its history comes first). */
        w0 = ts - t0 > p->h->N - 1 ? ts - (p->h->N - 1) : t0;
#if HAVE_AVX512_PATH
        if (p->h->simd) {
            hash_request8_any(p->h, a, w0, ts, te, h0, h1, p->l0, p->l1, p->local, p->out32);
            continue;
        }
#endif
        hash_request_any(p->h, a, w0, ts, te, h0, h1, p->l0, p->l1, p->local, p->out32);
    }
}

static void *hash_part_main(void *arg)
{
    hash_part_run(arg);
    return NULL;
}

/* The parts of a batch of T tokens: `threads` (at most MAX_THREADS), or
 * with 0 one per PART_MIN_TOKENS tokens, at most the CPUs and MAX_THREADS. */
static uint32_t parts_of(uint32_t threads, size_t T)
{
    long cpus;
    size_t n;
    if (threads == 1 || T < 2)
        return 1;
    if (threads > 1)
        return threads > MAX_THREADS ? MAX_THREADS : threads;
    if (T < 2 * PART_MIN_TOKENS)
        return 1;
    cpus = sysconf(_SC_NPROCESSORS_ONLN);
    n = T / PART_MIN_TOKENS;
    if (cpus > 0 && n > (size_t)cpus)
        n = (size_t)cpus;
    return n > MAX_THREADS ? MAX_THREADS : (uint32_t)n;
}

int engram_ngram_hash(const engram_ngram_hasher *h, const engram_ngram_hash_args *a)
{
    size_t R, T;
    uint32_t l0, l1;
    uint64_t maxid = 0;
    int local, out32;

    if (!h || !a)
        return engram__err(-EINVAL, "hasher and args are required");
    if (a->size != sizeof *a)
        return engram__err(-EINVAL, "engram_ngram_hash_args.size is %u, expected %zu", a->size,
                           sizeof *a);
    if (a->flags & ~ENGRAM_NGRAM_LOCAL)
        return engram__err(-EINVAL, "unknown flags 0x%x", a->flags & ~ENGRAM_NGRAM_LOCAL);
    if (a->token_type != ENGRAM_ID_INT32 && a->token_type != ENGRAM_ID_INT64)
        return engram__err(-EINVAL, "token_type %d is neither ENGRAM_ID_INT32 nor _INT64",
                           a->token_type);
    if (a->out_type != ENGRAM_ID_INT32 && a->out_type != ENGRAM_ID_INT64)
        return engram__err(-EINVAL, "out_type %d is neither ENGRAM_ID_INT32 nor _INT64",
                           a->out_type);
    if (a->layer < -1 || a->layer >= (int32_t)h->L)
        return engram__err(-EINVAL, "layer %d is not -1 (all) nor a layer index below %u",
                           a->layer, h->L);
    T = a->num_tokens;
    R = a->num_requests ? a->num_requests : 1;
    if (T && (!a->tokens || !a->out))
        return engram__err(-EINVAL, "tokens and out are required for %zu tokens", T);
    if (R > 1) {
        if (!a->starts || a->starts[0] != 0 || a->starts[R] != T)
            return engram__err(-EINVAL, "%zu requests need starts[%zu] with starts[0] = 0 and "
                                        "starts[%zu] = num_tokens %zu",
                               R, R + 1, R, T);
        for (size_t r = 0; r < R; r++)
            if (a->starts[r + 1] < a->starts[r])
                return engram__err(-EINVAL, "starts[%zu] = %zu is below starts[%zu] = %zu", r + 1,
                                   a->starts[r + 1], r, a->starts[r]);
        if (a->history) {
            if (!a->history_starts || a->history_starts[0] != 0)
                return engram__err(-EINVAL, "a history of %zu requests needs history_starts[%zu] "
                                            "from 0",
                                   R, R + 1);
            for (size_t r = 0; r < R; r++)
                if (a->history_starts[r + 1] < a->history_starts[r] ||
                    a->history_starts[r + 1] - a->history_starts[r] > h->N - 1)
                    return engram__err(-EINVAL, "history of request %zu: history_starts[%zu] "
                                                "and [%zu] give a length outside 0..%u (N-1)",
                                       r, r, r + 1, h->N - 1);
        }
    } else if (a->history_len > h->N - 1 || (a->history_len && !a->history)) {
        return engram__err(-EINVAL, "history_len %zu is above N-1 = %u, or has no history",
                           a->history_len, h->N - 1);
    }
    l0 = a->layer < 0 ? 0 : (uint32_t)a->layer;
    l1 = a->layer < 0 ? h->L : l0 + 1;
    local = (a->flags & ENGRAM_NGRAM_LOCAL) != 0;
    out32 = a->out_type == ENGRAM_ID_INT32;
    for (uint32_t l = l0; l < l1; l++) {
        uint64_t top = local ? h->pmax[l] - 1 : h->rows[l] - 1;
        if (top > maxid)
            maxid = top;
    }
    if (out32 && maxid > (uint64_t)INT32_MAX)
        return engram__err(-ERANGE, "ids up to %" PRIu64 " do not fit int32 output: use int64",
                           maxid);

    /* Every token first: nothing is written for a batch with a bad one. */
    for (size_t r = 0; r < R; r++) {
        size_t t0, t1, h0, h1;
        request_bounds(a, R, T, r, &t0, &t1, &h0, &h1);
        for (size_t i = h0; i < h1; i++)
            if (compress(h, token_at(a->history, a->token_type, i)) == -2)
                return bad_token(h, "history", i, r, R, token_at(a->history, a->token_type, i));
        for (size_t t = t0; t < t1; t++)
            if (compress(h, token_at(a->tokens, a->token_type, t)) == -2)
                return bad_token(h, "tokens", t, r, R, token_at(a->tokens, a->token_type, t));
    }
    {
        hash_part job = {h, a, R, T, l0, l1, local, out32, 0, 1};
        uint32_t P = parts_of(a->threads, T);
        pthread_t th[MAX_THREADS];
        hash_part parts[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        for (uint32_t k = 1; k < P; k++) {
            parts[k] = job;
            parts[k].part = k;
            parts[k].nparts = P;
            started[k] = pthread_create(&th[k], NULL, hash_part_main, &parts[k]) == 0;
        }
        job.nparts = P;
        hash_part_run(&job);
        for (uint32_t k = 1; k < P; k++) {
            if (started[k])
                pthread_join(th[k], NULL);
            else
                hash_part_run(&parts[k]); /* no thread: done here */
        }
    }
    return 0;
}

size_t engram__ngram_cols(const engram_ngram_hasher *h)
{
    return h->C;
}
