/*
 * test_shard.c - shard plans against hand-computed ranges and refusals,
 * and the balanced plan against a brute force over every set of cuts.
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

int main(void)
{
    tu_watchdog(60);
    RUN_TEST(test_head_wise);
    RUN_TEST(test_refusals);
    RUN_TEST(test_balanced);
    printf("test_shard: ok\n");
    return 0;
}
