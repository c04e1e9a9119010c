/*
 * test_shard.c - shard plans against hand-computed ranges and refusals,
 * the balanced plan against a brute force over every set of cuts, and
 * the row-wise plan (more shards than heads) and its routing of ids
 * against a walk over every row.
 */
#include "testutil.h"

static void expect(const engram_shard *s, uint32_t n, const uint32_t *first, const uint32_t *heads)
{
    for (uint32_t i = 0; i < n; i++) {
        ASSERT_EQ(s[i].first_head, first[i]);
        ASSERT_EQ(s[i].num_heads, heads[i]);
    }
}

static void test_head_wise(void)
{
    engram_shard s[32];
    tu_current_case = "head-wise plans of 24 heads";
    /* TP 4 x DP 2, one shard per rank: 8 shards of 3 heads, TP-major. */
    ASSERT_EQ(engram_shard_count(4, 2, 0), 8);
    ASSERT_OK(engram_shard_plan(24, NULL, 4, 2, 0, s));
    for (uint32_t i = 0; i < 8; i++) {
        ASSERT_EQ(s[i].first_head, 3 * i);
        ASSERT_EQ(s[i].num_heads, 3);
        ASSERT_EQ_U64(s[i].reads, 0);
    }
    ASSERT_EQ(engram_shard_slot(0, 0, 4, 2, 0), 0);
    ASSERT_EQ(engram_shard_slot(0, 1, 4, 2, 0), 1);
    ASSERT_EQ(engram_shard_slot(1, 0, 4, 2, 0), 2);
    ASSERT_EQ(engram_shard_slot(3, 1, 4, 2, 0), 7);
    /* One copy per TP rank: DP peers share it. */
    ASSERT_EQ(engram_shard_count(4, 2, ENGRAM_SHARD_PER_TP), 4);
    ASSERT_OK(engram_shard_plan(24, NULL, 4, 2, ENGRAM_SHARD_PER_TP, s));
    {
        static const uint32_t f[] = {0, 6, 12, 18}, h[] = {6, 6, 6, 6};
        expect(s, 4, f, h);
    }
    ASSERT_EQ(engram_shard_slot(2, 0, 4, 2, ENGRAM_SHARD_PER_TP), 2);
    ASSERT_EQ(engram_shard_slot(2, 1, 4, 2, ENGRAM_SHARD_PER_TP), 2);
    /* 5 shards: ceil(24 / 5) = 5 each, the last 4. */
    ASSERT_OK(engram_shard_plan(24, NULL, 5, 1, 0, s));
    {
        static const uint32_t f[] = {0, 5, 10, 15, 20}, h[] = {5, 5, 5, 5, 4};
        expect(s, 5, f, h);
    }
    /* With reads, the head-wise plan reports each shard's. */
    {
        uint64_t reads[24];
        for (int i = 0; i < 24; i++)
            reads[i] = (uint64_t)i + 1;
        ASSERT_OK(engram_shard_plan(24, reads, 2, 1, 0, s));
        ASSERT_EQ_U64(s[0].reads, 78);  /* 1 + ... + 12 */
        ASSERT_EQ_U64(s[1].reads, 222); /* 13 + ... + 24 */
    }
}

static void test_refusals(void)
{
    engram_shard s[64];
    uint64_t reads[24] = {0};
    tu_current_case = "topologies that leave a shard without a head";
    /* 7 shards: ceil(24 / 7) = 4 heads each fills 6 shards, the 7th has none. */
    ASSERT_ERR(engram_shard_plan(24, NULL, 7, 1, 0, s), ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "ceil(24 / 7) = 4 heads");
    ASSERT_CONTAINS(engram_errmsg(), "leaves shard 6 without a head");
    ASSERT_CONTAINS(engram_errmsg(), "balanced plan");
    /* More shards than heads: no plan gives each a head. */
    ASSERT_ERR(engram_shard_plan(24, NULL, 4, 8, 0, s), ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "needs 32 shards");
    ASSERT_CONTAINS(engram_errmsg(), "8 of them would hold no head");
    ASSERT_ERR(engram_shard_plan(24, reads, 4, 8, ENGRAM_SHARD_BALANCED, s), ENGRAM_ESPEC);
    ASSERT_OK(engram_shard_plan(24, NULL, 4, 8, ENGRAM_SHARD_PER_TP, s));
    /* Bad arguments. */
    ASSERT_ERR(engram_shard_plan(0, NULL, 1, 1, 0, s), ENGRAM_ESPEC);
    ASSERT_ERR(engram_shard_plan(24, NULL, 0, 1, 0, s), -EINVAL);
    ASSERT_ERR(engram_shard_plan(24, NULL, 1, 0, 0, s), -EINVAL);
    ASSERT_ERR(engram_shard_plan(24, NULL, 1, 1, 0x80, s), -EINVAL);
    ASSERT_ERR(engram_shard_plan(24, NULL, 1, 1, 0, NULL), -EINVAL);
    ASSERT_ERR(engram_shard_plan(24, NULL, 2, 1, ENGRAM_SHARD_BALANCED, s), -EINVAL);
    ASSERT_EQ(engram_shard_count(0, 1, 0), 0);
    ASSERT_EQ(engram_shard_count(1, 1, 0x80), 0);
    ASSERT_EQ(engram_shard_count(65536, 65536, 0), 0); /* overflows uint32 */
    ASSERT_ERR(engram_shard_slot(4, 0, 4, 2, 0), -EINVAL);
    ASSERT_ERR(engram_shard_slot(0, 2, 4, 2, 0), -EINVAL);
}

/* The smallest busiest-shard reads over every way to cut H heads into S
 * non-empty contiguous shards (brute force). */
static uint64_t brute(const uint64_t *r, uint32_t H, uint32_t S, uint32_t start)
{
    uint64_t best = UINT64_MAX, sum = 0;
    if (S == 1) {
        for (uint32_t i = start; i < H; i++)
            sum += r[i];
        return sum;
    }
    for (uint32_t end = start + 1; end + (S - 1) <= H; end++) {
        uint64_t rest, m;
        sum += r[end - 1];
        rest = brute(r, H, S - 1, end);
        m = sum > rest ? sum : rest;
        if (m < best)
            best = m;
    }
    return best;
}

static void test_balanced(void)
{
    engram_shard s[8];
    uint64_t rng = 12345;
    tu_current_case = "balanced plans";
    /* Two hot heads at the ends: 5 1 1 1 1 5 in 3 shards.  Head-wise: 6 2 6;
     * balanced: [5] [1 1 1 1] [5], at most 5. */
    {
        static const uint64_t r[] = {5, 1, 1, 1, 1, 5};
        static const uint32_t f[] = {0, 1, 5}, h[] = {1, 4, 1};
        ASSERT_OK(engram_shard_plan(6, r, 3, 1, 0, s));
        ASSERT_EQ_U64(s[0].reads, 6);
        ASSERT_OK(engram_shard_plan(6, r, 3, 1, ENGRAM_SHARD_BALANCED, s));
        expect(s, 3, f, h);
        ASSERT_EQ_U64(s[0].reads, 5);
        ASSERT_EQ_U64(s[1].reads, 4);
        ASSERT_EQ_U64(s[2].reads, 5);
    }
    /* 24 equal heads in 7 shards (refused head-wise): every shard has a
     * head, none more than 4. */
    {
        uint64_t r[24];
        for (int i = 0; i < 24; i++)
            r[i] = 100;
        ASSERT_OK(engram_shard_plan(24, r, 7, 1, ENGRAM_SHARD_BALANCED, s));
        for (int i = 0; i < 7; i++) {
            ASSERT_GE(s[i].num_heads, 1);
            ASSERT_LE(s[i].num_heads, 4);
        }
        ASSERT_EQ(s[6].first_head + s[6].num_heads, 24);
    }
    /* Random read counts: the optimum of the brute force, contiguous and
     * covering every head once. */
    for (int round = 0; round < 300; round++) {
        uint32_t H = 1 + (uint32_t)tu_rand_below(&rng, 11), S = 1 + (uint32_t)tu_rand_below(&rng, 4);
        uint64_t r[12], worst = 0;
        if (S > H)
            S = H;
        for (uint32_t i = 0; i < H; i++)
            r[i] = tu_rand_below(&rng, 4) == 0 ? tu_rand_below(&rng, 100000) : tu_rand_below(&rng, 100);
        ASSERT_OK(engram_shard_plan(H, r, S, 1, ENGRAM_SHARD_BALANCED, s));
        for (uint32_t i = 0, next = 0; i < S; i++) {
            ASSERT_EQ(s[i].first_head, next);
            ASSERT_GE(s[i].num_heads, 1);
            next += s[i].num_heads;
            if (i == S - 1)
                ASSERT_EQ(next, H);
            if (s[i].reads > worst)
                worst = s[i].reads;
        }
        ASSERT_EQ_U64(worst, brute(r, H, S, 0));
    }
}

/* The head of global row r, by a walk. */
static uint32_t head_of(const uint64_t *rows, uint32_t H, uint64_t r)
{
    for (uint32_t h = 0; h < H; h++) {
        if (r < rows[h])
            return h;
        r -= rows[h];
    }
    return H;
}

static void check_rows_plan(const uint64_t *rows, uint32_t H, uint32_t tp, uint32_t dp,
                            uint32_t flags)
{
    uint32_t S = engram_shard_count(tp, dp, flags);
    engram_row_shard *sh = tu_xmalloc(S * sizeof *sh);
    uint64_t total = 0, small = UINT64_MAX, big = 0;
    for (uint32_t h = 0; h < H; h++)
        total += rows[h];
    ASSERT_OK(engram_shard_plan_rows(rows, H, tp, dp, flags, sh));
    for (uint32_t s = 0; s < S; s++) {
        uint64_t len = sh[s].row_end - sh[s].row_start;
        ASSERT_EQ_U64(sh[s].row_start, s ? sh[s - 1].row_end : 0);
        ASSERT(len > 0);
        small = len < small ? len : small;
        big = len > big ? len : big;
        ASSERT_EQ(sh[s].first_head, head_of(rows, H, sh[s].row_start));
        ASSERT_EQ(sh[s].last_head, head_of(rows, H, sh[s].row_end - 1));
    }
    ASSERT_EQ_U64(sh[S - 1].row_end, total);
    ASSERT(big - small <= 1);
    /* Routing: random ids, every shard's first and last row, DEAD. */
    {
        enum { N = 2000 };
        int64_t ids[N];
        int32_t of[N];
        uint64_t r = 99;
        for (int i = 0; i < N; i++)
            ids[i] = i % 97 == 0 ? ENGRAM_DEAD_ID : (int64_t)tu_rand_below(&r, total);
        for (uint32_t s = 0; s < S && 2 * s + 1 < N; s++) {
            ids[2 * s] = (int64_t)sh[s].row_start;
            ids[2 * s + 1] = (int64_t)sh[s].row_end - 1;
        }
        ASSERT_OK(engram_shard_route(sh, S, ids, N, of));
        for (int i = 0; i < N; i++) {
            if (ids[i] == ENGRAM_DEAD_ID) {
                ASSERT_EQ(of[i], -1);
                continue;
            }
            ASSERT(of[i] >= 0 && (uint32_t)of[i] < S);
            ASSERT((uint64_t)ids[i] >= sh[of[i]].row_start &&
                   (uint64_t)ids[i] < sh[of[i]].row_end);
        }
    }
    free(sh);
}

static void test_row_wise(void)
{
    /* V4.1's layer 1: 24 primes above 16,000,000, on 32 and 64 ranks. */
    static const uint64_t v41[24] = {
        16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183,
        16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321,
        16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463};
    static const uint64_t small[3] = {5, 1, 3};
    engram_row_shard sh[9];
    check_rows_plan(v41, 24, 8, 4, 0);
    check_rows_plan(v41, 24, 16, 4, 0);
    check_rows_plan(v41, 24, 32, 2, ENGRAM_SHARD_PER_TP);
    check_rows_plan(v41, 24, 3, 1, 0); /* fewer shards than heads works too */
    check_rows_plan(small, 3, 9, 1, 0); /* a shard a row */
    check_rows_plan(small, 3, 4, 1, 0);
    /* 9 rows in 4 shards: 3, 2, 2, 2; the 1-row head 1 inside shard 1. */
    ASSERT_OK(engram_shard_plan_rows(small, 3, 4, 1, 0, sh));
    ASSERT_EQ_U64(sh[0].row_end, 3);
    ASSERT_EQ_U64(sh[1].row_end, 5);
    ASSERT_EQ(sh[1].first_head, 0);
    ASSERT_EQ(sh[1].last_head, 0);
    ASSERT_EQ(sh[2].first_head, 1);
    ASSERT_EQ(sh[2].last_head, 2);
}

static void test_row_wise_refusals(void)
{
    static const uint64_t rows[3] = {5, 1, 3}, zero[2] = {4, 0};
    static const uint64_t huge[2] = {(uint64_t)INT64_MAX, 1};
    engram_row_shard sh[16];
    int64_t ids[3] = {0, 9, 2};
    int32_t of[3] = {7, 7, 7};
    engram_bad_id bad = ENGRAM_BAD_ID_INIT;
    ASSERT_ERR(engram_shard_plan_rows(rows, 3, 10, 1, 0, sh), ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "only 9 rows");
    ASSERT_ERR(engram_shard_plan_rows(zero, 2, 1, 1, 0, sh), ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "head 1 has 0 rows");
    ASSERT_ERR(engram_shard_plan_rows(huge, 2, 1, 1, 0, sh), ENGRAM_ESPEC);
    ASSERT_ERR(engram_shard_plan_rows(rows, 0, 1, 1, 0, sh), ENGRAM_ESPEC);
    ASSERT_ERR(engram_shard_plan_rows(rows, 3, 2, 1, ENGRAM_SHARD_BALANCED, sh), -EINVAL);
    ASSERT_ERR(engram_shard_plan_rows(rows, 3, 0, 1, 0, sh), -EINVAL);
    ASSERT_ERR(engram_shard_plan_rows(NULL, 3, 1, 1, 0, sh), -EINVAL);
    ASSERT_ERR(engram_shard_plan_rows(rows, 3, 1, 1, 0, NULL), -EINVAL);
    /* Routing: an id past the rows, or below -1; nothing written. */
    ASSERT_OK(engram_shard_plan_rows(rows, 3, 3, 1, 0, sh));
    ASSERT_ERR(engram_shard_route(sh, 3, ids, 3, of), ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "ids[1] = 9");
    ASSERT_OK(engram_last_bad_id(&bad));
    ASSERT_EQ(bad.token, 1);
    ASSERT_EQ(bad.id, 9);
    ids[1] = -2;
    ASSERT_ERR(engram_shard_route(sh, 3, ids, 3, of), ENGRAM_EBADID);
    ASSERT(of[0] == 7 && of[1] == 7 && of[2] == 7);
    ids[1] = ENGRAM_DEAD_ID;
    ASSERT_OK(engram_shard_route(sh, 3, ids, 3, of));
    ASSERT(of[0] == 0 && of[1] == -1 && of[2] == 0);
    /* Shards that are not a plan's. */
    sh[1].row_start++;
    ASSERT_ERR(engram_shard_route(sh, 3, ids, 3, of), -EINVAL);
    ASSERT_ERR(engram_shard_route(NULL, 3, ids, 3, of), -EINVAL);
    ASSERT_ERR(engram_shard_route(sh, 0, ids, 3, of), -EINVAL);
    sh[1].row_start--;
    ASSERT_ERR(engram_shard_route(sh, 3, NULL, 3, of), -EINVAL);
    ASSERT_ERR(engram_shard_route(sh, 3, ids, 3, NULL), -EINVAL);
    ASSERT_OK(engram_shard_route(sh, 3, NULL, 0, NULL)); /* no ids: nothing to route */
    /* A shard of no rows, or one that does not start at row 0. */
    {
        engram_row_shard bad_sh[2] = {{0, 4, 0, 0}, {4, 4, 0, 0}};
        ASSERT_ERR(engram_shard_route(bad_sh, 2, ids, 3, of), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "shards[1]");
        bad_sh[0].row_start = 1;
        ASSERT_ERR(engram_shard_route(bad_sh, 1, ids, 3, of), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "shards[0]");
    }
    ASSERT(of[0] == 0 && of[1] == -1 && of[2] == 0); /* untouched since */
    /* Topologies the row-wise plan refuses. */
    ASSERT_ERR(engram_shard_plan_rows(rows, 3, 1, 0, 0, sh), -EINVAL);
    ASSERT_ERR(engram_shard_plan_rows(rows, 3, 1, 1, 0x80, sh), -EINVAL);
    ASSERT_ERR(engram_shard_plan_rows(rows, 3, 65536, 65536, 0, sh), -EINVAL); /* 2^32 shards */
}

int main(void)
{
    tu_watchdog(60);
    RUN_TEST(test_head_wise);
    RUN_TEST(test_refusals);
    RUN_TEST(test_balanced);
    RUN_TEST(test_row_wise);
    RUN_TEST(test_row_wise_refusals);
    return tu_done("test_shard");
}
