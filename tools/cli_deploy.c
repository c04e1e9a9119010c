/*
 * cli_deploy.c - deploying tables to the ranks of a node: plan (which
 * heads each rank of a TP x DP topology holds), wait (block until tables
 * another process populates are published), mem (who maps each table and
 * which memory cgroup pays for it).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define PLAN_HEADS_MAX 4096
#define PLAN_LAYERS_MAX 256

/* engram plan --by-rows: the row-wise plan (engram_shard_plan_rows). */
static int plan_rows(const struct cli *cli, const uint64_t *vocab, size_t heads, uint64_t tp,
                     uint64_t dp, uint32_t flags, const uint64_t *layers, size_t nlayers)
{
    uint32_t count = engram_shard_count((uint32_t)tp, (uint32_t)dp, flags);
    engram_row_shard *sh = calloc(count ? count : 1, sizeof *sh);
    uint64_t total = 0;
    int rc;
    if (!sh)
        return cli_fail("out of memory");
    if ((rc = engram_shard_plan_rows(vocab, (uint32_t)heads, (uint32_t)tp, (uint32_t)dp, flags,
                                     sh)) != 0) {
        free(sh);
        return cli_lib_fail(rc, "plan --by-rows");
    }
    for (size_t h = 0; h < heads; h++)
        total += vocab[h];
    if (cli->opt[OPT_JSON]) {
        printf("{\n  \"schema\": %d,\n  \"tp\": %" PRIu64 ",\n  \"dp\": %" PRIu64 ",\n",
               CLI_JSON_SCHEMA, tp, dp);
        printf("  \"mode\": \"%s\",\n  \"plan\": \"row_wise\",\n  \"heads\": %zu,\n"
               "  \"rows\": %" PRIu64 ",\n  \"shards\": [",
               flags & ENGRAM_SHARD_PER_TP ? "per_tp" : "per_rank", heads, total);
        for (uint32_t s = 0; s < count; s++)
            printf("%s\n    {\"shard\": %" PRIu32 ", \"row_start\": %" PRIu64
                   ", \"row_end\": %" PRIu64 ", \"first_head\": %" PRIu32
                   ", \"last_head\": %" PRIu32 "}",
                   s ? "," : "", s, sh[s].row_start, sh[s].row_end, sh[s].first_head,
                   sh[s].last_head);
        printf("\n  ],\n  \"ranks\": [");
        for (uint64_t t = 0, first = 1; t < tp; t++)
            for (uint64_t d = 0; d < dp; d++, first = 0) {
                int s = engram_shard_slot((uint32_t)t, (uint32_t)d, (uint32_t)tp, (uint32_t)dp,
                                          flags);
                printf("%s\n    {\"tp_rank\": %" PRIu64 ", \"dp_rank\": %" PRIu64
                       ", \"shard\": %d, \"layers\": [",
                       first ? "" : ",", t, d, s);
                for (size_t l = 0; l < nlayers; l++)
                    printf("%s%" PRIu64, l ? ", " : "", layers[l]);
                printf("], \"row_start\": %" PRIu64 ", \"row_end\": %" PRIu64 "}",
                       sh[s].row_start, sh[s].row_end);
            }
        printf("\n  ]\n}\n");
    } else {
        printf("row-wise plan of %zu heads (%" PRIu64 " rows) for TP %" PRIu64 " x DP %" PRIu64
               " (%s): %" PRIu32 " shards\n",
               heads, total, tp, dp,
               flags & ENGRAM_SHARD_PER_TP ? "one copy per TP rank" : "one shard per rank",
               count);
        for (uint64_t t = 0; t < tp; t++)
            for (uint64_t d = 0; d < dp; d++) {
                int s = engram_shard_slot((uint32_t)t, (uint32_t)d, (uint32_t)tp, (uint32_t)dp,
                                          flags);
                printf("tp %-3" PRIu64 " dp %-3" PRIu64 " shard %-3d rows [%" PRIu64 ", %" PRIu64
                       ")  heads %" PRIu32 "-%" PRIu32 "\n",
                       t, d, s, sh[s].row_start, sh[s].row_end, sh[s].first_head,
                       sh[s].last_head);
            }
        printf("each rank holds its rows of a layer as one table, looked up with offset "
               "row_start; engramstore.shard_route() tells which rank holds an id\n");
    }
    free(sh);
    return 0;
}

/* engram plan --head-vocab N0,... --tp T [--dp D] [--per-tp]
 *              [--reads R0,... [--balanced] | --by-rows] [--layer-ids L,...] [--json] */
int cli_cmd_plan(struct cli *cli)
{
    uint64_t *vocab = NULL, *reads = NULL, *starts = NULL, layers[PLAN_LAYERS_MAX] = {0};
    uint64_t tp = 0, dp = 1;
    size_t heads = 0, nreads = 0, nlayers = 1;
    uint32_t flags = 0, count;
    engram_shard *shards = NULL, *other = NULL;
    int status = 0, rc, other_ok = 0;
    double imb = 0, imb_other = 0;

    if (!cli->opt[OPT_HEAD_VOCAB] || !cli->opt[OPT_TP])
        return cli_usage_error(cli, "--head-vocab and --tp are required");
    if ((status = cli_opt_u64(cli, OPT_TP, 1, 65536, &tp)) != 0 ||
        (status = cli_opt_u64(cli, OPT_DP, 1, 65536, &dp)) != 0)
        return status;
    if (!(vocab = calloc(PLAN_HEADS_MAX, sizeof *vocab)) ||
        !(reads = calloc(PLAN_HEADS_MAX, sizeof *reads)) ||
        !(starts = calloc(PLAN_HEADS_MAX + 1, sizeof *starts))) {
        status = cli_fail("out of memory");
        goto out;
    }
    rc = cli_parse_list(cli->opt[OPT_HEAD_VOCAB], 1, vocab, PLAN_HEADS_MAX, &heads);
    if (rc != 0) {
        status = cli_usage_error(cli, "--head-vocab: %s is not a list of row counts >= 1 (at "
                                      "most %d)",
                                 cli->opt[OPT_HEAD_VOCAB], PLAN_HEADS_MAX);
        goto out;
    }
    if (cli->opt[OPT_LAYER_IDS] &&
        cli_parse_list(cli->opt[OPT_LAYER_IDS], 0, layers, PLAN_LAYERS_MAX, &nlayers) != 0) {
        status = cli_usage_error(cli, "--layer-ids: %s is not a list of layer numbers",
                                 cli->opt[OPT_LAYER_IDS]);
        goto out;
    }
    if (cli->opt[OPT_READS]) {
        if (cli_parse_list(cli->opt[OPT_READS], 0, reads, PLAN_HEADS_MAX, &nreads) != 0 ||
            nreads != heads) {
            status = cli_usage_error(cli, "--reads: expected %zu read counts (one per head), "
                                          "got '%s'",
                                     heads, cli->opt[OPT_READS]);
            goto out;
        }
    } else if (cli->opt[OPT_BALANCED]) {
        status = cli_usage_error(cli, "--balanced needs --reads (each head's read counts)");
        goto out;
    }
    if (cli->opt[OPT_PER_TP])
        flags |= ENGRAM_SHARD_PER_TP;
    if (cli->opt[OPT_BY_ROWS]) {
        if (cli->opt[OPT_READS] || cli->opt[OPT_BALANCED]) {
            status = cli_usage_error(cli, "--by-rows cuts rows evenly: it takes no --reads or "
                                          "--balanced");
            goto out;
        }
        status = plan_rows(cli, vocab, heads, tp, dp, flags, layers, nlayers);
        goto out;
    }
    if (cli->opt[OPT_BALANCED])
        flags |= ENGRAM_SHARD_BALANCED;
    if ((count = engram_shard_count((uint32_t)tp, (uint32_t)dp, flags)) == 0) {
        status = cli_usage_error(cli, "TP %" PRIu64 " x DP %" PRIu64 " is too many ranks", tp,
                                 dp);
        goto out;
    }
    if (!(shards = calloc(count, sizeof *shards)) || !(other = calloc(count, sizeof *other))) {
        status = cli_fail("out of memory");
        goto out;
    }
    if ((rc = engram_shard_plan((uint32_t)heads, nreads ? reads : NULL, (uint32_t)tp,
                                (uint32_t)dp, flags, shards)) != 0) {
        status = cli_lib_fail(rc, "plan");
        goto out;
    }
    for (size_t h = 0; h < heads; h++)
        starts[h + 1] = starts[h] + vocab[h];
    if (nreads) {
        /* The other plan's imbalance, for comparison (the head-wise one
         * may be refused). */
        uint64_t sum = 0, max = 0, osum = 0, omax = 0;
        other_ok = engram_shard_plan((uint32_t)heads, reads, (uint32_t)tp, (uint32_t)dp,
                                     flags ^ ENGRAM_SHARD_BALANCED, other) == 0;
        for (uint32_t s = 0; s < count; s++) {
            sum += shards[s].reads;
            max = shards[s].reads > max ? shards[s].reads : max;
            osum += other[s].reads;
            omax = other[s].reads > omax ? other[s].reads : omax;
        }
        imb = sum ? (double)max * count / (double)sum : 1.0;
        imb_other = osum ? (double)omax * count / (double)osum : 1.0;
    }
    if (cli->opt[OPT_JSON]) {
        const char *plan = flags & ENGRAM_SHARD_BALANCED ? "balanced" : "head_wise";
        printf("{\n  \"schema\": %d,\n  \"tp\": %" PRIu64 ",\n  \"dp\": %" PRIu64 ",\n",
               CLI_JSON_SCHEMA, tp, dp);
        printf("  \"mode\": \"%s\",\n  \"plan\": \"%s\",\n  \"heads\": %zu,\n",
               flags & ENGRAM_SHARD_PER_TP ? "per_tp" : "per_rank", plan, heads);
        printf("  \"shards\": [");
        for (uint32_t s = 0; s < count; s++) {
            printf("%s\n    {\"shard\": %" PRIu32 ", \"heads\": [", s ? "," : "", s);
            for (uint32_t h = 0; h < shards[s].num_heads; h++)
                printf("%s%" PRIu32, h ? ", " : "", shards[s].first_head + h);
            printf("], \"reads\": %" PRIu64 "}", shards[s].reads);
        }
        printf("\n  ],\n");
        if (nreads) {
            printf("  \"imbalance\": {\"%s\": %.6g, \"%s\": ", plan, imb,
                   flags & ENGRAM_SHARD_BALANCED ? "head_wise" : "balanced");
            if (other_ok)
                printf("%.6g},\n", imb_other);
            else
                printf("null},\n");
        }
        printf("  \"ranks\": [");
        for (uint64_t t = 0, first = 1; t < tp; t++)
            for (uint64_t d = 0; d < dp; d++, first = 0) {
                int s = engram_shard_slot((uint32_t)t, (uint32_t)d, (uint32_t)tp, (uint32_t)dp,
                                          flags);
                const engram_shard *sh = &shards[s];
                printf("%s\n    {\"tp_rank\": %" PRIu64 ", \"dp_rank\": %" PRIu64
                       ", \"shard\": %d, \"layers\": {",
                       first ? "" : ",", t, d, s);
                for (size_t l = 0; l < nlayers; l++) {
                    printf("%s\"%" PRIu64 "\": {\"tables\": [", l ? ", " : "", layers[l]);
                    for (uint32_t h = 0; h < sh->num_heads; h++)
                        printf("%s\"engram:l%" PRIu64 ":h%" PRIu32 "\"", h ? ", " : "",
                               layers[l], sh->first_head + h);
                    printf("], \"offsets\": [");
                    for (uint32_t h = 0; h < sh->num_heads; h++)
                        printf("%s%" PRIu64, h ? ", " : "", starts[sh->first_head + h]);
                    printf("], \"row_start\": %" PRIu64 ", \"row_end\": %" PRIu64 "}",
                           starts[sh->first_head], starts[sh->first_head + sh->num_heads]);
                }
                printf("}}");
            }
        printf("\n  ]\n}\n");
    } else {
        printf("%s plan of %zu heads for TP %" PRIu64 " x DP %" PRIu64 " (%s): %" PRIu32
               " shards\n",
               flags & ENGRAM_SHARD_BALANCED ? "balanced" : "head-wise", heads, tp, dp,
               flags & ENGRAM_SHARD_PER_TP ? "one copy per TP rank" : "one shard per rank",
               count);
        for (uint64_t t = 0; t < tp; t++)
            for (uint64_t d = 0; d < dp; d++) {
                int s = engram_shard_slot((uint32_t)t, (uint32_t)d, (uint32_t)tp, (uint32_t)dp,
                                          flags);
                const engram_shard *sh = &shards[s];
                printf("tp %-3" PRIu64 " dp %-3" PRIu64 " shard %-3d heads %" PRIu32 "-%" PRIu32
                       "  rows [%" PRIu64 ", %" PRIu64 ")",
                       t, d, s, sh->first_head, sh->first_head + sh->num_heads - 1,
                       starts[sh->first_head], starts[sh->first_head + sh->num_heads]);
                if (nreads)
                    printf("  reads %" PRIu64, sh->reads);
                printf("\n");
            }
        if (nreads) {
            printf("imbalance (busiest / mean reads): %.3f", imb);
            if (other_ok)
                printf(", %s plan: %.3f\n",
                       flags & ENGRAM_SHARD_BALANCED ? "head-wise" : "balanced", imb_other);
            else
                printf(", head-wise plan: refused (a shard without a head)\n");
        }
        printf("tables: engram:l<L>:h<head>; offsets: each head's first row, %s\n",
               "rows laid out head after head");
    }
out:
    free(vocab);
    free(reads);
    free(starts);
    free(shards);
    free(other);
    return status;
}

/* engram wait NAME... [--timeout SECS] */
int cli_cmd_wait(struct cli *cli)
{
    engram_store *st = NULL;
    uint64_t secs = UINT64_MAX;
    int status = 0;
    if ((status = cli_opt_u64(cli, OPT_TIMEOUT, 0, 86400u * 365, &secs)) != 0)
        return status;
    for (int i = 0; i < cli->nargs; i++)
        if ((status = cli_check_name(cli, cli->args[i])) != 0)
            return status;
    if (cli_open_store(cli, 0, 1, &st, 0, &status) != 0)
        return status;
    for (int i = 0; i < cli->nargs && !status; i++) {
        engram_table_id id;
        int ms = secs == UINT64_MAX ? -1 : secs * 1000 > INT32_MAX ? INT32_MAX : (int)(secs * 1000);
        int rc = engram_table_open_wait(st, cli->args[i], ms, &id);
        if (rc != 0)
            status = cli_lib_fail(rc, "wait %s", cli->args[i]);
        else
            printf("%s: published\n", cli->args[i]);
    }
    engram_store_close(st);
    return status;
}

/* engram mem [NAME...] [--json] */
int cli_cmd_mem(struct cli *cli)
{
    engram_store *st = NULL;
    char **names = NULL, **list = NULL;
    size_t n = 0;
    int status = 0, first = 1;
    if (cli_open_store(cli, 0, 1, &st, 0, &status) != 0)
        return status;
    if (cli->nargs) {
        list = cli->args;
        n = (size_t)cli->nargs;
    } else {
        int rc = engram_list(st, &names, &n);
        if (rc != 0) {
            status = cli_lib_fail(rc, "list %s", cli->ns);
            goto out;
        }
        cli_sort_names(names, n);
        list = names;
    }
    if (cli->opt[OPT_JSON])
        printf("{\n  \"schema\": %d,\n  \"tables\": [", CLI_JSON_SCHEMA);
    else
        printf("%-28s %10s %6s %10s  %s\n", "NAME", "FILE", "PROCS", "PSS(ALL)",
               "CHARGED TO (memory cgroup)");
    for (size_t i = 0; i < n; i++) {
        engram_table_usage u = ENGRAM_TABLE_USAGE_INIT;
        char a[32], b[32];
        int rc = engram_get_table_usage(st, list[i], &u);
        if (rc != 0) {
            status = cli_table_fail(st, rc, "mem", list[i]);
            continue;
        }
        if (cli->opt[OPT_JSON]) {
            printf("%s\n    {\"name\": ", first ? "" : ",");
            cli_json_str(stdout, list[i]);
            printf(", \"file_bytes\": %" PRIu64 ", \"processes\": %" PRIu32
                   ", \"unreadable\": %" PRIu32 ", \"unreadable_may_map\": %s"
                   ", \"total_pss_bytes\": %" PRIu64 ", \"cgroup\": ",
                   u.file_bytes, u.processes, u.unreadable,
                   u.unreadable_may_map ? "true" : "false", u.total_pss_bytes);
            if (u.cgroup[0])
                cli_json_str(stdout, u.cgroup);
            else
                printf("null");
            printf(", \"cgroup_pages\": %" PRIu32 ", \"sampled_pages\": %" PRIu32 "}",
                   u.cgroup_pages, u.sampled_pages);
            first = 0;
        } else {
            printf("%-28s %10s %6" PRIu32 " %10s  %s\n", list[i],
                   cli_fmt_bytes(u.file_bytes, a, sizeof a), u.processes,
                   cli_fmt_bytes(u.total_pss_bytes, b, sizeof b),
                   u.cgroup[0] ? u.cgroup : "unknown (needs CAP_SYS_ADMIN, or no page resident)");
            /* Processes that could not be read but were shown to map none
             * of the table (a container's PID 1, other users' unrelated
             * processes) change none of its figures: no warning. */
            if (u.unreadable_may_map)
                cli_warn("mem %s: %" PRIu32 " processes could not be read (other users) and "
                         "may map it: their shares are not counted", list[i], u.unreadable);
        }
    }
    if (cli->opt[OPT_JSON])
        printf("\n  ]\n}\n");
out:
    engram_free(names);
    engram_store_close(st);
    return status;
}

/* engram numa-copy NAME... --numa-node N */
int cli_cmd_numa_copy(struct cli *cli)
{
    engram_store *st = NULL;
    uint64_t node = UINT64_MAX;
    int status = 0;
    if ((status = cli_opt_u64(cli, OPT_NUMA_NODE, 0, ENGRAM_NUMA_MAX_NODES - 1, &node)) != 0)
        return status;
    if (node == UINT64_MAX)
        return cli_usage_error(cli, "--numa-node N is required");
    for (int i = 0; i < cli->nargs; i++)
        if ((status = cli_check_name(cli, cli->args[i])) != 0)
            return status;
    /* The store is opened with the node as its placement: a bad node is
     * refused here, before any copy. */
    if (cli_open_store(cli, 0, 1, &st, 0, &status) != 0)
        return status;
    for (int i = 0; i < cli->nargs && !status; i++) {
        int written = 0, rc = engram_numa_copy(st, cli->args[i], (int)node, &written);
        if (rc != 0)
            status = cli_lib_fail(rc, "copy %s to node %" PRIu64, cli->args[i], node);
        else if (written)
            printf("%s.numa%" PRIu64 ": written on node %" PRIu64 "\n", cli->args[i], node, node);
        else
            printf("%s.numa%" PRIu64 ": already there\n", cli->args[i], node);
    }
    engram_store_close(st);
    return status;
}
