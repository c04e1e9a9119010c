/*
 * shard.c - shard plans: which heads of an Engram layer each rank of a
 * TP x DP topology holds.
 *
 * The head-wise plan is the one engines use: a layer's H heads (hash
 * columns, one table each) are cut into ceil(H / S) heads per shard, in
 * order, for S shards; a topology that leaves a shard without a head is
 * refused.  A shard is one rank's (S = tp * dp, slot tp_rank * dp +
 * dp_rank: TP-major), or one TP rank's shared by its DP peers (S = tp).
 *
 * The row-wise plan is for topologies with more shards than heads (which
 * the head-wise plan refuses): the layer's rows, heads laid end to end,
 * cut into equal contiguous ranges; a head may be split between shards,
 * and engram_shard_route() tells which shard holds a global id.
 *
 * The balanced plan keeps shards contiguous ranges of heads (so each
 * rank's rows stay one [vocab_start, vocab_end) range) but chooses the
 * cuts from the heads' read counts to make the busiest shard's reads as
 * small as possible: the exact optimum of the linear partition, by dynamic
 * programming over (shards, heads), O(S * H^2) for H heads (a few dozen).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define KNOWN_FLAGS (ENGRAM_SHARD_PER_TP | ENGRAM_SHARD_BALANCED)

uint32_t engram_shard_count(uint32_t tp, uint32_t dp, uint32_t flags)
{
    if (tp == 0 || dp == 0 || (flags & ~(uint32_t)KNOWN_FLAGS))
        return 0;
    if (flags & ENGRAM_SHARD_PER_TP)
        return tp;
    return (uint64_t)tp * dp > UINT32_MAX ? 0 : tp * dp;
}

int engram_shard_slot(uint32_t tp_rank, uint32_t dp_rank, uint32_t tp, uint32_t dp,
                      uint32_t flags)
{
    if (!engram_shard_count(tp, dp, flags) || tp_rank >= tp || dp_rank >= dp)
        return engram__err(-EINVAL, "rank (tp %u, dp %u) is not a rank of TP %u x DP %u "
                                    "(flags 0x%x)",
                           tp_rank, dp_rank, tp, dp, flags);
    return (int)(flags & ENGRAM_SHARD_PER_TP ? tp_rank : tp_rank * dp + dp_rank);
}

static const char *mode_name(uint32_t flags)
{
    return flags & ENGRAM_SHARD_PER_TP ? "one copy per TP rank" : "one shard per rank";
}

/* The balanced cuts: shards[s] = heads [cut[s], cut[s + 1]). */
static int balance(uint32_t H, uint32_t S, const uint64_t *reads, engram_shard *shards)
{
    /* best[s * (H + 1) + i]: the smallest busiest-shard reads for the first
     * i heads in s + 1 shards; from[...]: where the last of them starts. */
    uint64_t *pre = calloc((size_t)H + 1, sizeof *pre);
    uint64_t *best = calloc((size_t)S * (H + 1), sizeof *best);
    uint32_t *from = calloc((size_t)S * (H + 1), sizeof *from);
    int err = 0;
    if (!pre || !best || !from) {
        err = engram__err(-ENOMEM, "out of memory for a plan of %u heads", H);
        goto out;
    }
    for (uint32_t i = 0; i < H; i++)
        pre[i + 1] = pre[i] + reads[i] < pre[i] ? UINT64_MAX : pre[i] + reads[i];
    for (uint32_t i = 1; i <= H; i++) {
        best[i] = pre[i];
        from[i] = 0;
    }
    for (uint32_t s = 1; s < S; s++)
        for (uint32_t i = s + 1; i <= H; i++) {
            uint64_t b = UINT64_MAX;
            uint32_t f = s;
            /* The last shard is heads [j, i), at least one head; the
             * others hold the first j heads, at least one each. */
            for (uint32_t j = s; j < i; j++) {
                uint64_t last = pre[i] - pre[j], prev = best[(size_t)(s - 1) * (H + 1) + j];
                uint64_t m = last > prev ? last : prev;
                if (m < b) {
                    b = m;
                    f = j;
                }
            }
            best[(size_t)s * (H + 1) + i] = b;
            from[(size_t)s * (H + 1) + i] = f;
        }
    for (uint32_t s = S, i = H; s-- > 0;) {
        uint32_t j = from[(size_t)s * (H + 1) + i];
        shards[s].first_head = j;
        shards[s].num_heads = i - j;
        i = j;
    }
out:
    free(pre);
    free(best);
    free(from);
    return err;
}

int engram_shard_plan(uint32_t num_heads, const uint64_t *reads, uint32_t tp, uint32_t dp,
                      uint32_t flags, engram_shard *shards)
{
    uint32_t S = engram_shard_count(tp, dp, flags);
    int err;
    if (!shards)
        return engram__err(-EINVAL, "shards is NULL");
    if (S == 0)
        return engram__err(-EINVAL, "TP %u x DP %u with flags 0x%x is not a topology (tp >= 1, "
                                    "dp >= 1, flags of ENGRAM_SHARD_*)",
                           tp, dp, flags);
    if ((flags & ENGRAM_SHARD_BALANCED) && !reads)
        return engram__err(-EINVAL, "the balanced plan needs the heads' read counts");
    if (num_heads == 0)
        return engram__err(ENGRAM_ESPEC, "a layer of 0 heads has nothing to shard");
    if (num_heads < S)
        return engram__err(ENGRAM_ESPEC, "TP %u x DP %u (%s) needs %u shards, but a layer has "
                                         "only %u heads: %u of them would hold no head; use "
                                         "fewer shards (one copy per TP rank, or a smaller TP)",
                           tp, dp, mode_name(flags), S, num_heads, S - num_heads);
    memset(shards, 0, (size_t)S * sizeof *shards);
    if (!(flags & ENGRAM_SHARD_BALANCED)) {
        uint32_t part = num_heads / S + (num_heads % S != 0);
        if ((uint64_t)(S - 1) * part >= num_heads)
            return engram__err(ENGRAM_ESPEC,
                               "the head-wise plan gives each of the %u shards of TP %u x DP %u "
                               "(%s) ceil(%u / %u) = %u heads, which leaves shard %u without a "
                               "head; choose a shard count that leaves none empty, or the "
                               "balanced plan (read counts), which gives every shard a head",
                               S, tp, dp, mode_name(flags), num_heads, S, part,
                               (num_heads + part - 1) / part);
        for (uint32_t s = 0; s < S; s++) {
            shards[s].first_head = s * part;
            shards[s].num_heads = num_heads - s * part < part ? num_heads - s * part : part;
        }
    } else if ((err = balance(num_heads, S, reads, shards)) != 0) {
        return err;
    }
    if (reads)
        for (uint32_t s = 0; s < S; s++)
            for (uint32_t h = 0; h < shards[s].num_heads; h++) {
                uint64_t r = reads[shards[s].first_head + h];
                shards[s].reads = shards[s].reads + r < r ? UINT64_MAX : shards[s].reads + r;
            }
    return 0;
}

int engram_shard_plan_rows(const uint64_t *head_rows, uint32_t num_heads, uint32_t tp,
                           uint32_t dp, uint32_t flags, engram_row_shard *shards)
{
    uint32_t S = engram_shard_count(tp, dp, flags);
    uint64_t total = 0, start = 0;
    uint32_t h = 0;
    if (!shards || !head_rows)
        return engram__err(-EINVAL, "head_rows and shards are required");
    if (S == 0 || (flags & ENGRAM_SHARD_BALANCED))
        return engram__err(-EINVAL, "TP %u x DP %u with flags 0x%x is not a topology of the "
                                    "row-wise plan (tp >= 1, dp >= 1, ENGRAM_SHARD_PER_TP or "
                                    "not; never ENGRAM_SHARD_BALANCED)",
                           tp, dp, flags);
    if (num_heads == 0)
        return engram__err(ENGRAM_ESPEC, "a layer of 0 heads has nothing to shard");
    for (uint32_t i = 0; i < num_heads; i++) {
        if (head_rows[i] == 0)
            return engram__err(ENGRAM_ESPEC, "head %u has 0 rows", i);
        if (engram__add_u64(total, head_rows[i], &total) || total > (uint64_t)INT64_MAX)
            return engram__err(ENGRAM_ESPEC, "the layer's rows add up past 2^63");
    }
    if (total < S)
        return engram__err(ENGRAM_ESPEC, "TP %u x DP %u (%s) needs %u shards, but the layer has "
                                         "only %" PRIu64 " rows",
                           tp, dp, mode_name(flags), S, total);
    {
        uint64_t head_end = head_rows[0]; /* the end of head h's rows */
        for (uint32_t s = 0; s < S; s++) {
            uint64_t len = total / S + (s < total % S);
            shards[s].row_start = start;
            shards[s].row_end = start + len;
            while (head_end <= start) /* the head of the shard's first row */
                head_end += head_rows[++h];
            shards[s].first_head = h;
            while (head_end < start + len) /* the head of its last row */
                head_end += head_rows[++h];
            shards[s].last_head = h;
            start += len;
        }
    }
    return 0;
}

int engram_shard_route(const engram_row_shard *shards, uint32_t count, const int64_t *ids,
                       size_t n, int32_t *shard_of)
{
    uint64_t end;
    if (!shards || !count || (n && (!ids || !shard_of)))
        return engram__err(-EINVAL, "shards, their count, ids and shard_of are required");
    if (count > (uint32_t)INT32_MAX)
        return engram__err(-EINVAL, "%u shards is too many", count);
    for (uint32_t s = 0; s < count; s++)
        if (shards[s].row_start != (s ? shards[s - 1].row_end : 0) ||
            shards[s].row_end <= shards[s].row_start)
            return engram__err(-EINVAL, "shards[%u] does not follow the shard before it (a "
                                        "plan's shards are contiguous from row 0)",
                               s);
    end = shards[count - 1].row_end;
    /* Every id first: nothing is written for a batch with a bad one. */
    for (size_t i = 0; i < n; i++)
        if (ids[i] != ENGRAM_DEAD_ID && (ids[i] < 0 || (uint64_t)ids[i] >= end)) {
            engram_bad_id bad = ENGRAM_BAD_ID_INIT;
            bad.token = i;
            bad.id = ids[i];
            bad.num_rows = end;
            engram__err(ENGRAM_EBADID, "ids[%zu] = %" PRId64 " is outside the plan's rows (0 "
                                       "<= id < %" PRIu64 ")",
                        i, ids[i], end);
            engram__set_bad_id(&bad);
            return ENGRAM_EBADID;
        }
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = 0, hi = count - 1;
        if (ids[i] == ENGRAM_DEAD_ID) {
            shard_of[i] = -1;
            continue;
        }
        /* The last shard starting at or before the id. */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo + 1) / 2;
            if (shards[mid].row_start <= (uint64_t)ids[i])
                lo = mid;
            else
                hi = mid - 1;
        }
        shard_of[i] = (int32_t)lo;
    }
    return 0;
}
