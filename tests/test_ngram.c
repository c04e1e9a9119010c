/*
 * test_ngram.c - tokens to rows (engram_ngram_*) through the public API:
 *
 *  - numpy's stream: draws of Generator.integers made by numpy itself
 *    (held below), through the internal generator and through the
 *    multipliers of layouts;
 *  - the DeepSeek-V4.1 layout: its released row counts, primes and
 *    multipliers;
 *  - the hash against a plain reference written here from the algorithm
 *    (with % and no tricks), on random streams with DEAD tokens, with and
 *    without a token map, for several N, H and vocabularies; every
 *    chunking of a request with its history gives the whole request's
 *    ids; a ragged batch gives each request's own ids; one layer, local
 *    ids, int32 and int64 tokens and ids; with the vector path (AVX-512,
 *    where the CPU has it) and the scalar one;
 *  - bad configs, maps, tokens and arguments: clear errors, output
 *    untouched.
 * tests/python/test_ngram.py compares with numpy and a Python reference.
 */
#include "testutil.h"

#include "nprandom.h"

/* ------------------------------------------------------------------------
 * The reference: the algorithm as written in include/engram.h.
 */

typedef struct ref_layout {
    uint32_t L, N, H, C;
    int64_t pad;
    const uint64_t *primes;
    const int64_t *offsets, *mults;
} ref_layout;

/* ids [T][L][C] of one request: c[] compressed ids (DEAD allowed), the
 * first `skip` of which are history (not output). */
static void ref_hash(const ref_layout *r, const int64_t *c, size_t n, size_t skip, int local,
                     int64_t *out)
{
    for (size_t p = skip; p < n; p++)
        for (uint32_t l = 0; l < r->L; l++) {
            int blocked = 0;
            int64_t rolling = 0;
            for (uint32_t s = 0; s < r->N; s++) {
                int64_t v;
                blocked |= (int64_t)p - (int64_t)s < 0 || c[p - s] == ENGRAM_DEAD_ID;
                v = blocked ? r->pad : c[p - s];
                rolling ^= v * r->mults[l * r->N + s];
                if (s >= 1)
                    for (uint32_t h = 0; h < r->H; h++) {
                        uint32_t col = (s - 1) * r->H + h;
                        out[((p - skip) * r->L + l) * r->C + col] =
                            rolling % (int64_t)r->primes[l * r->C + col] +
                            (local ? 0 : r->offsets[l * r->C + col]);
                    }
            }
        }
}

static ref_layout ref_of(const engram_ngram_layout_info *li)
{
    ref_layout r = {li->num_layers, li->max_ngram, li->heads, li->num_cols, li->pad_id,
                    li->primes, li->offsets, li->multipliers};
    return r;
}

static engram_ngram_layout *make_layout(uint32_t L, const int64_t *ids, uint64_t vocab,
                                        uint32_t N, uint32_t H, uint64_t cv, int64_t pad)
{
    engram_ngram_config c = ENGRAM_NGRAM_CONFIG_INIT;
    engram_ngram_layout *lay = NULL;
    c.num_layers = L;
    c.layer_ids = ids;
    c.vocab_size = vocab;
    c.max_ngram = N;
    c.heads = H;
    c.compressed_vocab = cv;
    c.pad_id = pad;
    ASSERT_OK(engram_ngram_layout_create(&c, &lay));
    return lay;
}

/* ------------------------------------------------------------------------ */

/* Generator.integers(0, high, size=6, dtype=int64) of default_rng(seed),
 * as numpy 2.4 prints them (the stream is the same in every numpy since
 * 1.17). */
static void test_numpy_stream(void)
{
    static const struct {
        uint64_t seed;
        int64_t high;
        int64_t want[6];
    } cases[] = {
        {10007, 46530958018253, {38309066197010, 2419497093387, 17976559932191, 36986927862753,
                                 19974931338062, 35195285754113}},
        {0, 1000, {850, 636, 511, 269, 307, 40}},
        {5, 4294967296, {2881021352, 3457461230, 97294837, 3470079269, 2013703616, 2213306431}},
        {123456789, 3, {2, 0, 1, 2, 1, 2}},
        {18446744073709551615ull, 9223372036854775807, {6272139055050500934, 7796624836349661611,
                                                          68281375809169700, 8250934642460399319,
                                                          1189494337841920909, 2940766199871733711}},
        {4294967296ull, 1, {0, 0, 0, 0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        engram__pcg64 g;
        int64_t got[6];
        engram__pcg64_seed(&g, cases[i].seed);
        engram__np_integers(&g, 0, cases[i].high, got, 6);
        for (int k = 0; k < 6; k++)
            ASSERT_EQ(got[k], cases[i].want[k]);
    }
}

static void test_v41(void)
{
    static const int64_t ids[2] = {1, 14};
    static const int64_t mults[8] = {76632096046245, 4839876093313, 35959672319349,
                                     73987337458391, 67716810739261, 51510806800915,
                                     30921347202721, 82619226485591};
    engram_ngram_layout *lay = make_layout(2, ids, 16000000, 4, 8, 99092, 2);
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    ASSERT_OK(engram_get_ngram_layout_info(lay, &li));
    ASSERT_EQ(li.num_layers, 2);
    ASSERT_EQ(li.num_cols, 24);
    ASSERT_EQ_U64(li.num_rows[0], 384006168);
    ASSERT_EQ_U64(li.num_rows[1], 384016682);
    ASSERT_EQ_U64(li.primes[0], 16000057);  /* the first prime above 16,000,000 - 1 */
    ASSERT_EQ_U64(li.primes[8], 16000189);  /* order 3 starts over, past the 8 taken */
    ASSERT_EQ_U64(li.primes[23], 16000463);
    ASSERT_EQ(li.offsets[0], 0);
    ASSERT_EQ(li.offsets[1], 16000057);
    for (int i = 0; i < 8; i++)
        ASSERT_EQ(li.multipliers[i], mults[i]);
    /* 48 distinct primes over the two layers. */
    for (int i = 0; i < 48; i++)
        for (int j = 0; j < i; j++)
            ASSERT(li.primes[i] != li.primes[j]);
    engram_ngram_layout_destroy(lay);
    ASSERT_OK(engram_get_ngram_layout_info(lay = make_layout(1, ids, 16000000, 4, 8, 99092, 2),
                                           &li));
    /* One layer alone gets the same primes as the first of two. */
    ASSERT_EQ_U64(li.num_rows[0], 384006168);
    engram_ngram_layout_destroy(lay);
}

/* Random compressed streams with DEAD tokens; every chunking, ragged
 * batches, maps, local ids, one layer, int32. */
static void check_config(uint32_t L, uint32_t N, uint32_t H, uint64_t vocab, uint64_t cv,
                         uint64_t *rng)
{
    int64_t lids[4] = {3, 0, 41, 7};
    engram_ngram_layout *lay = make_layout(L, lids, vocab, N, H, cv, (int64_t)(cv / 2));
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    engram_ngram_hasher *h, *hm;
    engram_ngram_hash_args a = ENGRAM_NGRAM_HASH_ARGS_INIT;
    ref_layout ref;
    enum { T = 40 };
    int64_t c[T], raw[T], *want, *got, *map;
    int32_t c32[T], *got32;
    uint64_t map_len = cv < 2000 ? cv * 2 + 3 : 4003;
    size_t per;

    ASSERT_OK(engram_get_ngram_layout_info(lay, &li));
    ref = ref_of(&li);
    per = (size_t)L * li.num_cols;
    want = tu_xmalloc(T * per * sizeof *want);
    got = tu_xmalloc(T * per * sizeof *got);
    got32 = tu_xmalloc(T * per * sizeof *got32);
    map = tu_xmalloc(map_len * sizeof *map);
    for (uint64_t t = 0; t < map_len; t++)
        map[t] = (int64_t)tu_rand_below(rng, cv);
    for (size_t i = 0; i < T; i++) {
        raw[i] = tu_rand_below(rng, 6) == 0 ? ENGRAM_DEAD_ID : (int64_t)tu_rand_below(rng, map_len);
        c[i] = raw[i] == ENGRAM_DEAD_ID ? ENGRAM_DEAD_ID : map[raw[i]];
        c32[i] = (int32_t)c[i];
    }
    {
        /* The hashers come from a second layout of the same config,
         * destroyed at once: they keep their own copy. */
        engram_ngram_layout *lay2 = make_layout(L, lids, vocab, N, H, cv, (int64_t)(cv / 2));
        ASSERT_OK(engram_ngram_hasher_create(lay2, NULL, 0, &h));
        ASSERT_OK(engram_ngram_hasher_create(lay2, map, map_len, &hm));
        engram_ngram_layout_destroy(lay2);
    }
    ref_hash(&ref, c, T, 0, 0, want);

    /* The whole request, int64 tokens and ids, without and with the map. */
    a.num_tokens = T;
    a.tokens = c;
    a.token_type = ENGRAM_ID_INT64;
    a.out = got;
    a.out_type = ENGRAM_ID_INT64;
    ASSERT_OK(engram_ngram_hash(h, &a));
    ASSERT(memcmp(got, want, T * per * sizeof *got) == 0);
    memset(got, 0, T * per * sizeof *got);
    a.tokens = raw;
    ASSERT_OK(engram_ngram_hash(hm, &a));
    ASSERT(memcmp(got, want, T * per * sizeof *got) == 0);
    /* Cut into parts hashed by threads of their own: the same ids. */
    for (uint32_t th = 2; th <= 9; th += 3) {
        memset(got, 0, T * per * sizeof *got);
        a.threads = th;
        ASSERT_OK(engram_ngram_hash(hm, &a));
        ASSERT(memcmp(got, want, T * per * sizeof *got) == 0);
    }
    a.threads = 0;

    /* int32 tokens, int32 ids, where they hold them. */
    if (cv <= INT32_MAX && li.num_rows[L - 1] <= INT32_MAX && li.num_rows[0] <= INT32_MAX) {
        a.tokens = c32;
        a.token_type = ENGRAM_ID_INT32;
        a.out = got32;
        a.out_type = ENGRAM_ID_INT32;
        ASSERT_OK(engram_ngram_hash(h, &a));
        for (size_t i = 0; i < T * per; i++)
            ASSERT_EQ(got32[i], want[i]);
    }

    /* Every chunking point, with the N-1 (or fewer) tokens before it. */
    a.token_type = ENGRAM_ID_INT64;
    a.out = got;
    a.out_type = ENGRAM_ID_INT64;
    for (size_t cut = 0; cut <= T; cut++) {
        size_t hl = cut < N - 1 ? cut : N - 1;
        a.tokens = c + cut;
        a.num_tokens = T - cut;
        a.history = c + cut - hl;
        a.history_len = hl;
        memset(got, 0x5a, T * per * sizeof *got);
        ASSERT_OK(engram_ngram_hash(h, &a));
        ASSERT(memcmp(got, want + cut * per, (T - cut) * per * sizeof *got) == 0);
    }

    /* One layer at a time, local ids. */
    {
        int64_t *wl = tu_xmalloc(T * per * sizeof *wl);
        ref_hash(&ref, c, T, 0, 1, wl);
        a.tokens = c;
        a.num_tokens = T;
        a.history = NULL;
        a.history_len = 0;
        a.flags = ENGRAM_NGRAM_LOCAL;
        for (uint32_t l = 0; l < L; l++) {
            a.layer = (int32_t)l;
            ASSERT_OK(engram_ngram_hash(h, &a));
            for (size_t t = 0; t < T; t++)
                ASSERT(memcmp(got + t * li.num_cols, wl + (t * L + l) * li.num_cols,
                              li.num_cols * sizeof *got) == 0);
        }
        a.flags = 0;
        a.layer = -1;
        free(wl);
    }

    /* A ragged batch of three requests, with histories, equals each
     * request hashed alone: request 1 is the stream's chunk [10, 25)
     * after its 3 tokens before, request 2 a new request [0, 15), request
     * 0 a chunk [30, 40). */
    {
        size_t starts[4] = {0, 10, 25, 40}, hst[4];
        int64_t toks[40], hist[3 * ENGRAM_NGRAM_MAX_N];
        size_t hn = 0, k = 0;
        const size_t seg[3][2] = {{30, 40}, {10, 25}, {0, 15}};
        for (int r = 0; r < 3; r++) {
            size_t from = seg[r][0], hl = from < N - 1 ? from : N - 1;
            if (r == 1 && hl > 3)
                hl = 3;
            hst[r] = hn;
            for (size_t i = from - hl; i < from; i++)
                hist[hn++] = c[i];
            for (size_t i = seg[r][0]; i < seg[r][1]; i++)
                toks[k++] = c[i];
        }
        hst[3] = hn;
        a.num_tokens = 40;
        a.tokens = toks;
        a.num_requests = 3;
        a.starts = starts;
        a.history = hist;
        a.history_starts = hst;
        a.threads = 3; /* parts that cut requests */
        ASSERT_OK(engram_ngram_hash(h, &a));
        a.threads = 0;
        for (int r = 0; r < 3; r++) {
            size_t from = seg[r][0], hl = hst[r + 1] - hst[r];
            size_t n = seg[r][1] - from;
            int64_t *w = tu_xmalloc((n + 1) * per * sizeof *w);
            int64_t seq[ENGRAM_NGRAM_MAX_N + 40];
            memcpy(seq, hist + hst[r], hl * sizeof *seq);
            memcpy(seq + hl, c + from, n * sizeof *seq);
            ref_hash(&ref, seq, hl + n, hl, 0, w);
            ASSERT(memcmp(got + starts[r] * per, w, n * per * sizeof *w) == 0);
            free(w);
        }
        a.num_requests = 0;
        a.starts = NULL;
        a.history = NULL;
        a.history_starts = NULL;
    }
    engram_ngram_hasher_destroy(h);
    engram_ngram_hasher_destroy(hm);
    engram_ngram_layout_destroy(lay);
    free(want);
    free(got);
    free(got32);
    free(map);
}

static void test_against_reference(void)
{
    uint64_t rng = 20261202;
    check_config(2, 4, 8, 16000000, 99092, &rng); /* V4.1's shape */
    check_config(1, 2, 1, 10, 7, &rng);            /* the smallest */
    check_config(3, 3, 5, 1000, 50, &rng);
    check_config(4, 5, 2, 100000, 3, &rng);
    check_config(1, 6, 3, 2, 1u << 20, &rng);
    check_config(2, 3, 4, 1u << 20, (uint64_t)1 << 40, &rng); /* products near 2^63 */
    check_config(1, 4, 2, 50, 1, &rng);            /* one compressed id: pad everywhere */
    check_config(1, 3, 2, (uint64_t)1 << 59, 99092, &rng); /* primes near 2^59 */
    check_config(2, 2, 13, 4096, 1000, &rng);      /* the smallest primes of the vector path */
}

/* The same without the vector path (hashers made with
 * ENGRAM_NGRAM_SCALAR=1 keep the scalar one): both agree with the
 * reference. */
static void test_scalar_path(void)
{
    ASSERT_EQ(setenv("ENGRAM_NGRAM_SCALAR", "1", 1), 0);
    test_against_reference();
    ASSERT_EQ(unsetenv("ENGRAM_NGRAM_SCALAR"), 0);
}

/* Given primes and multipliers are used as they are. */
static void test_explicit(void)
{
    static const int64_t lid[1] = {9};
    static const uint64_t primes[2] = {7, 1};
    static const int64_t mults[3] = {1, 3, 5};
    engram_ngram_config cfg = ENGRAM_NGRAM_CONFIG_INIT;
    engram_ngram_layout *lay;
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    engram_ngram_hasher *h;
    engram_ngram_hash_args a = ENGRAM_NGRAM_HASH_ARGS_INIT;
    int64_t toks[3] = {4, -1, 2}, out[6];

    cfg.num_layers = 1;
    cfg.layer_ids = lid;
    cfg.max_ngram = 3;
    cfg.heads = 1;
    cfg.compressed_vocab = 10;
    cfg.pad_id = 0;
    cfg.primes = primes;
    cfg.multipliers = mults;
    ASSERT_OK(engram_ngram_layout_create(&cfg, &lay));
    ASSERT_OK(engram_get_ngram_layout_info(lay, &li));
    ASSERT_EQ_U64(li.num_rows[0], 8);
    ASSERT_EQ(li.offsets[1], 7);
    ASSERT_EQ(li.multipliers[2], 5);
    ASSERT_OK(engram_ngram_hasher_create(lay, NULL, 0, &h));
    a.num_tokens = 3;
    a.tokens = toks;
    a.token_type = ENGRAM_ID_INT64;
    a.out = out;
    a.out_type = ENGRAM_ID_INT64;
    ASSERT_OK(engram_ngram_hash(h, &a));
    /* p0: 4*1 ^ pad*3 = 4 -> 4 % 7 = 4; ^ pad*5 = 4 -> 4 % 1 + 7 = 7.
     * p1: DEAD blocks everything: 0 -> 0, 7.  p2: 2 ^ DEAD(->0)*3 = 2 -> 2; then 2 -> 7. */
    ASSERT_EQ(out[0], 4);
    ASSERT_EQ(out[1], 7);
    ASSERT_EQ(out[2], 0);
    ASSERT_EQ(out[3], 7);
    ASSERT_EQ(out[4], 2);
    ASSERT_EQ(out[5], 7);
    engram_ngram_hasher_destroy(h);
    engram_ngram_layout_destroy(lay);
}

static void test_bad_config(void)
{
    static const int64_t lid[2] = {1, 2}, neg[1] = {-1};
    engram_ngram_config c = ENGRAM_NGRAM_CONFIG_INIT, b;
    engram_ngram_layout *lay = (engram_ngram_layout *)1;
    uint64_t primes[8] = {5, 7, 11, 13, 0, 3, 3, 3};
    int64_t mults[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    c.num_layers = 2;
    c.layer_ids = lid;
    c.vocab_size = 100;
    c.max_ngram = 3;
    c.heads = 2;
    c.compressed_vocab = 50;
    c.pad_id = 1;
    ASSERT_ERR(engram_ngram_layout_create(NULL, &lay), -EINVAL);
    ASSERT(lay == NULL);
    ASSERT_ERR(engram_ngram_layout_create(&c, NULL), -EINVAL);
    /* The info of no layout, or with a wrong size. */
    {
        engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
        ASSERT_OK(engram_ngram_layout_create(&c, &lay));
        ASSERT_ERR(engram_get_ngram_layout_info(NULL, &li), -EINVAL);
        ASSERT_ERR(engram_get_ngram_layout_info(lay, NULL), -EINVAL);
        li.size = 4;
        ASSERT_ERR(engram_get_ngram_layout_info(lay, &li), -EINVAL);
        ASSERT(li.num_layers == 0 && li.primes == NULL); /* untouched */
        engram_ngram_layout_destroy(lay);
        lay = (engram_ngram_layout *)1;
    }
#define BAD(field, value, code, text)                                                            \
    do {                                                                                       \
        b = c;                                                                                 \
        b.field = value;                                                                       \
        ASSERT_ERR(engram_ngram_layout_create(&b, &lay), code);                                \
        ASSERT_CONTAINS(engram_errmsg(), text);                                                \
        ASSERT(lay == NULL);                                                                   \
    } while (0)
    BAD(size, 8, -EINVAL, "size");
    BAD(num_layers, 0, ENGRAM_ESPEC, "num_layers");
    BAD(num_layers, ENGRAM_NGRAM_MAX_LAYERS + 1, ENGRAM_ESPEC, "num_layers");
    BAD(layer_ids, NULL, ENGRAM_ESPEC, "num_layers");
    BAD(layer_ids, neg, ENGRAM_ESPEC, "layer_ids[0] = -1");
    BAD(max_ngram, 1, ENGRAM_ESPEC, "max_ngram 1");
    BAD(max_ngram, ENGRAM_NGRAM_MAX_N + 1, ENGRAM_ESPEC, "max_ngram");
    BAD(heads, 0, ENGRAM_ESPEC, "heads 0");
    BAD(heads, ENGRAM_NGRAM_MAX_COLS, ENGRAM_ESPEC, "heads");
    BAD(compressed_vocab, 0, ENGRAM_ESPEC, "compressed_vocab 0");
    BAD(pad_id, 50, ENGRAM_ESPEC, "pad_id 50");
    BAD(pad_id, -1, ENGRAM_ESPEC, "pad_id -1");
    BAD(vocab_size, 1, ENGRAM_ESPEC, "vocab_size 1");
    /* Sizes too large for the hash: refused, never wrapped. */
    BAD(vocab_size, ((uint64_t)1 << 61) + 1, ENGRAM_ESPEC, "vocab_size");
    BAD(vocab_size, UINT64_MAX, ENGRAM_ESPEC, "2..2^61");
    BAD(compressed_vocab, ((uint64_t)1 << 62) + 1, ENGRAM_ESPEC, "compressed_vocab");
    BAD(compressed_vocab, UINT64_MAX, ENGRAM_ESPEC, "1..2^62");
    BAD(pad_id, INT64_MAX, ENGRAM_ESPEC, "pad_id");
    {
        static const int64_t huge[2] = {1, INT64_MAX};
        BAD(layer_ids, huge, ENGRAM_ESPEC, "layer_ids[1]");
    }
    BAD(max_ngram, 0, ENGRAM_ESPEC, "max_ngram 0");
    BAD(max_ngram, UINT32_MAX, ENGRAM_ESPEC, "max_ngram");
    BAD(heads, UINT32_MAX, ENGRAM_ESPEC, "heads"); /* (N-1) * heads would wrap in 32 bits */
    BAD(num_layers, UINT32_MAX, ENGRAM_ESPEC, "num_layers");
    BAD(primes, primes, ENGRAM_ESPEC, "primes[4] = 0");
    mults[5] = 0;
    BAD(multipliers, mults, ENGRAM_ESPEC, "multipliers[5] = 0");
    mults[5] = INT64_MAX / 49 + 1;
    BAD(multipliers, mults, ENGRAM_ESPEC, "overflow");
    /* Primes whose sum passes 2^62. */
    {
        uint64_t big[8] = {(uint64_t)1 << 61, (uint64_t)1 << 61, 1, 1, 1, 1, 1, 1};
        BAD(primes, big, ENGRAM_ESPEC, "2^62");
    }
#undef BAD
}

static void test_bad_input(void)
{
    static const int64_t lid[1] = {5};
    engram_ngram_layout *lay = make_layout(1, lid, 1000, 3, 2, 20, 0);
    engram_ngram_hasher *h, *hm;
    engram_ngram_hash_args a = ENGRAM_NGRAM_HASH_ARGS_INIT, b;
    int64_t map[4] = {3, 19, 0, 7}, badmap[2] = {1, 20};
    int64_t toks[5] = {1, 2, -1, 3, 4}, out[20], hist[3] = {1, 2, 3};
    int32_t out32[20];
    size_t starts[3] = {0, 2, 5}, bad_starts[3] = {0, 4, 3};

    ASSERT_OK(engram_ngram_hasher_create(lay, NULL, 0, &h));
    ASSERT_ERR(engram_ngram_hasher_create(lay, badmap, 2, &hm), ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "token_map[1] = 20");
    ASSERT_ERR(engram_ngram_hasher_create(lay, map, 0, &hm), -EINVAL);
    ASSERT_ERR(engram_ngram_hasher_create(NULL, NULL, 0, &hm), -EINVAL);
    ASSERT(hm == NULL);
    ASSERT_ERR(engram_ngram_hasher_create(lay, NULL, 0, NULL), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "out is NULL");
    ASSERT_ERR(engram_ngram_hasher_create(lay, NULL, 4, &hm), -EINVAL); /* a length, no map */
    ASSERT_CONTAINS(engram_errmsg(), "go together");
    ASSERT_OK(engram_ngram_hasher_create(lay, map, 4, &hm));
    a.num_tokens = 5;
    a.tokens = toks;
    a.token_type = ENGRAM_ID_INT64;
    a.out = out;
    a.out_type = ENGRAM_ID_INT64;
    memset(out, 0x11, sizeof out);

#define BADH(hh, field, value, code, text)                                                      \
    do {                                                                                       \
        b = a;                                                                                 \
        b.field = value;                                                                       \
        ASSERT_ERR(engram_ngram_hash(hh, &b), code);                                           \
        ASSERT_CONTAINS(engram_errmsg(), text);                                                \
        ASSERT_ALL_BYTES(out, 0x11, sizeof out);                                               \
    } while (0)
    BADH(h, size, 4, -EINVAL, "size");
    BADH(h, flags, 0x80, -EINVAL, "flags");
    BADH(h, token_type, 3, -EINVAL, "token_type");
    BADH(h, out_type, 0, -EINVAL, "out_type");
    BADH(h, layer, 1, -EINVAL, "layer 1");
    BADH(h, layer, -2, -EINVAL, "layer -2");
    BADH(h, tokens, NULL, -EINVAL, "tokens");
    BADH(h, history_len, 3, -EINVAL, "history_len 3");
    BADH(h, history_len, 1, -EINVAL, "history");
    BADH(h, num_requests, 2, -EINVAL, "starts");
    BADH(h, out, NULL, -EINVAL, "out are required");
    BADH(h, history_len, SIZE_MAX, -EINVAL, "history_len");
    ASSERT_ERR(engram_ngram_hash(h, NULL), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "args are required");
    /* starts that end before or after the tokens. */
    {
        size_t short_starts[3] = {0, 2, 4}, long_starts[3] = {0, 2, 6}, late[3] = {1, 2, 5};
        b = a;
        b.num_requests = 2;
        b.starts = short_starts;
        ASSERT_ERR(engram_ngram_hash(h, &b), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "num_tokens 5");
        b.starts = long_starts;
        ASSERT_ERR(engram_ngram_hash(h, &b), -EINVAL);
        b.starts = late;
        ASSERT_ERR(engram_ngram_hash(h, &b), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "starts[0] = 0");
        /* A history of a batch without history_starts, or not from 0. */
        b.starts = starts;
        b.history = hist;
        b.history_starts = NULL;
        ASSERT_ERR(engram_ngram_hash(h, &b), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "history_starts");
        b.history_starts = late;
        ASSERT_ERR(engram_ngram_hash(h, &b), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "history_starts");
        ASSERT_ALL_BYTES(out, 0x11, sizeof out);
    }
    b = a;
    b.num_requests = 2;
    b.starts = bad_starts;
    ASSERT_ERR(engram_ngram_hash(h, &b), -EINVAL);
    b.starts = starts;
    b.history = hist;
    b.history_starts = bad_starts; /* lengths 4 and -1 */
    ASSERT_ERR(engram_ngram_hash(h, &b), -EINVAL);
    ASSERT_ALL_BYTES(out, 0x11, sizeof out);

    /* Bad tokens, named by position; nothing written. */
    toks[3] = 20;
    ASSERT_ERR(engram_ngram_hash(h, &a), ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "tokens[3] = 20");
    ASSERT_CONTAINS(engram_errmsg(), "compressed_vocab 20");
    toks[3] = -2;
    ASSERT_ERR(engram_ngram_hash(h, &a), ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "tokens[3] = -2");
    toks[3] = 3;
    ASSERT_ERR(engram_ngram_hash(hm, &a), ENGRAM_EBADID); /* 4 is outside the map */
    ASSERT_CONTAINS(engram_errmsg(), "tokens[4] = 4");
    ASSERT_CONTAINS(engram_errmsg(), "map");
    b = a;
    b.history = hist;
    b.history_len = 2;
    hist[0] = 99;
    ASSERT_ERR(engram_ngram_hash(h, &b), ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "history[0] = 99");
    b = a;
    b.num_requests = 2;
    b.starts = starts;
    toks[4] = 77;
    ASSERT_ERR(engram_ngram_hash(h, &b), ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "tokens[4] = 77 (request 1)");
    ASSERT_ALL_BYTES(out, 0x11, sizeof out);
    toks[4] = 4;
    ASSERT_OK(engram_ngram_hash(h, &a));
    /* Empty input is fine. */
    b = a;
    b.num_tokens = 0;
    b.tokens = NULL;
    b.out = NULL;
    ASSERT_OK(engram_ngram_hash(h, &b));
    ASSERT_ERR(engram_ngram_hash(NULL, &a), -EINVAL);
    engram_ngram_hasher_destroy(h);
    engram_ngram_hasher_destroy(hm);
    engram_ngram_layout_destroy(lay);

    /* int32 ids that cannot hold the layout's rows: -ERANGE, unless
     * local ids fit. */
    {
        static const uint64_t big[2] = {(uint64_t)1 << 31, 5};
        engram_ngram_config c = ENGRAM_NGRAM_CONFIG_INIT;
        c.num_layers = 1;
        c.layer_ids = lid;
        c.max_ngram = 2;
        c.heads = 2;
        c.compressed_vocab = 20;
        c.primes = big;
        ASSERT_OK(engram_ngram_layout_create(&c, &lay));
        ASSERT_OK(engram_ngram_hasher_create(lay, NULL, 0, &h));
        a.out = out32;
        a.out_type = ENGRAM_ID_INT32;
        ASSERT_ERR(engram_ngram_hash(h, &a), -ERANGE);
        ASSERT_CONTAINS(engram_errmsg(), "int32");
        /* Local ids stop at 2^31 - 1: they fit. */
        a.flags = ENGRAM_NGRAM_LOCAL;
        ASSERT_OK(engram_ngram_hash(h, &a));
        a.flags = 0;
        c.primes = (const uint64_t[2]){(uint64_t)1 << 30, 5};
        engram_ngram_hasher_destroy(h);
        engram_ngram_layout_destroy(lay);
        ASSERT_OK(engram_ngram_layout_create(&c, &lay));
        ASSERT_OK(engram_ngram_hasher_create(lay, NULL, 0, &h));
        ASSERT_OK(engram_ngram_hash(h, &a));
        engram_ngram_hasher_destroy(h);
        engram_ngram_layout_destroy(lay);
    }
    engram_ngram_layout_destroy(NULL);
    engram_ngram_hasher_destroy(NULL);
#undef BADH
}

int main(void)
{
    tu_watchdog(120);
    RUN_TEST(test_numpy_stream);
    RUN_TEST(test_v41);
    RUN_TEST(test_against_reference);
    RUN_TEST(test_scalar_path);
    RUN_TEST(test_explicit);
    RUN_TEST(test_bad_config);
    RUN_TEST(test_bad_input);
    return tu_done("test_ngram");
}
