/*
 * cli_tables.c - the commands that manage and read the tables of a
 * namespace: create, ls, info, verify, rm and lookup.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engram.h"
#include "cli.h"

/* ------------------------------------------------------------------------
 * Helpers of these commands.
 */

/* Maps table `name` first when `map` is set, then reads its info into *t
 * (t->size must be set).  0, or the exit status of the failure, reported
 * for command `what`. */
static int open_info(engram_store *st, const char *what, const char *name, int map,
                     engram_table_id *id, engram_table_info *t)
{
    int rc;
    if (map && (rc = engram_table_open(st, name, id)) != 0)
        return cli_table_fail(st, rc, what, name);
    if ((rc = engram_get_table_info(st, name, t)) != 0)
        return cli_table_fail(st, rc, what, name);
    return 0;
}

/* Strict signed decimal: an optional '-' then digits.  Returns 0, -1 if
 * s is not such a number, or -2 if it is one outside the int64 range. */
static int parse_i64(const char *s, int64_t *out)
{
    char *end;
    long long v;
    const char *p = s;

    if (!s)
        return -1;
    if (*p == '-')
        p++;
    if (!isdigit((unsigned char)*p))
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (*end != '\0')
        return -1;
    if (errno == ERANGE)
        return -2;
    if (errno != 0)
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* The usage error for `what` ("id" or "--offset:") whose text `s` did not
 * parse as an int64 (parse_i64 returned rc). */
static int i64_usage_error(const struct cli *cli, const char *what, const char *s, int rc)
{
    if (rc == -2)
        return cli_usage_error(cli, "%s '%s' is out of range (%" PRId64 " .. %" PRId64 ")", what,
                               s, INT64_MIN, INT64_MAX);
    return cli_usage_error(cli, "%s '%s' is not a decimal integer", what, s);
}

/* ------------------------------------------------------------------------
 * create
 */
static int check_spec(const struct cli *cli, const engram_table_spec *spec)
{
    int rc = engram_spec_check(spec);
    if (rc != 0)
        return cli_usage_error(cli, "invalid table shape: %s", cli_lib_detail(rc));
    return 0;
}

int cli_cmd_create(struct cli *cli)
{
    const char *name = cli->args[0];
    engram_table_spec spec = {0, 0, 0};
    struct synth_source src = {FILL_PATTERN, 0, 0};
    uint64_t v;
    engram_store *st = NULL;
    int status, made;

    if ((status = cli_check_name(cli, name)) != 0)
        return status;
    if (!cli->opt[OPT_ROWS] || !cli->opt[OPT_ROW_BYTES])
        return cli_usage_error(cli, "--rows and --row-bytes are required");
    v = 0;
    if ((status = cli_opt_u64(cli, OPT_ROWS, 1, UINT64_MAX, &v)) != 0)
        return status;
    spec.num_rows = v;
    if ((status = cli_opt_u64(cli, OPT_ROW_BYTES, 1, ENGRAM_ROW_BYTES_MAX, &v)) != 0)
        return status;
    spec.row_bytes = (uint32_t)v;
    if ((status = cli_read_pitch(cli, &spec)) != 0)
        return status;
    if (cli->opt[OPT_FILL]) {
        const char *f = cli->opt[OPT_FILL];
        if (strcmp(f, "zero") == 0)
            src.fill = FILL_ZERO;
        else if (strcmp(f, "pattern") == 0)
            src.fill = FILL_PATTERN;
        else if (strcmp(f, "random") == 0)
            src.fill = FILL_RANDOM;
        else
            return cli_usage_error(cli, "--fill: '%s' is not one of zero, pattern, random", f);
    }
    if ((status = cli_opt_u64(cli, OPT_SEED, 0, UINT64_MAX, &src.seed)) != 0)
        return status;
    if ((status = check_spec(cli, &spec)) != 0)
        return status;
    src.row_bytes = spec.row_bytes;

    if (cli_open_for_write(cli, &st, &made, &status) != 0)
        return status;
    status = cli_write_table(st, "create", name, &spec, cli_synth_rows, &src);
    if (status == 0) {
        char sz[32];
        uint64_t size = spec.num_rows * (spec.row_pitch ? spec.row_pitch : spec.row_bytes);
        printf("created %s: %" PRIu64 " rows of %" PRIu32 " bytes (%s)\n", name, spec.num_rows,
               spec.row_bytes, cli_fmt_bytes(size, sz, sizeof sz));
    }
    cli_close_written(cli, st, made, status);
    return status;
}

/* ------------------------------------------------------------------------
 * ls, info
 */
static const char *kind_name(uint32_t kind)
{
    return kind == ENGRAM_TABLE_FILE    ? "file"
           : kind == ENGRAM_TABLE_BOUND ? "bound"
           : kind == ENGRAM_TABLE_REDIS ? "redis"
                                        : "unknown";
}

/* An entry of the namespace that ls could not read as a table. */
struct skipped {
    const char *name;
    char *reason;
};

int cli_cmd_ls(struct cli *cli)
{
    int json = cli->opt[OPT_JSON] != NULL;
    engram_store *st = NULL;
    char **names = NULL;
    size_t count = 0, width = 4, nskipped = 0;
    engram_table_info *infos = NULL;
    struct skipped *skipped = NULL;
    int status = 0, rc;
    char sz[32];

    /* A namespace that does not exist is a mistyped name or root far more
     * often than a namespace not made yet: an error naming the path. */
    if (cli_open_store(cli, 0, 1, &st, 0, &status) != 0)
        return status;
    rc = engram_list(st, &names, &count);
    if (rc != 0) {
        status = cli_lib_fail(rc, "list namespace '%s'", cli->ns);
        goto out;
    }
    /* A cluster's namespace is its tables: one with none does not exist,
     * as a missing directory does not. */
    if (count == 0 && cli->opt[OPT_REDIS]) {
        status = cli_redis_ns_missing(cli, "ls");
        goto out;
    }
    cli_sort_names(names, count);
    infos = calloc(count ? count : 1, sizeof(*infos));
    skipped = calloc(count ? count : 1, sizeof(*skipped));
    if (!infos || !skipped) {
        status = cli_fail("ls: out of memory");
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        engram_table_info init = ENGRAM_TABLE_INFO_INIT;
        infos[i] = init;
        rc = engram_get_table_info(st, names[i], &infos[i]);
        if (rc != 0) {
            /* A table removed between list and info is simply gone; an
             * entry that is not a readable table (a stray file, a corrupt
             * or foreign one) is reported but hides nothing else. */
            infos[i].size = 0;
            if (rc == -ENOENT)
                continue;
            skipped[nskipped].name = names[i];
            if (!(skipped[nskipped].reason = strdup(cli_lib_detail(rc)))) {
                status = cli_fail("ls: out of memory");
                goto out;
            }
            nskipped++;
            continue;
        }
        if (strlen(names[i]) > width)
            width = strlen(names[i]);
    }
    if (json) {
        int first = 1;
        printf("{\n  \"schema\": %d,\n  \"root\": ", CLI_JSON_SCHEMA);
        cli_json_str(stdout, cli_root(cli));
        printf(",\n  \"namespace\": ");
        cli_json_str(stdout, cli->ns);
        printf(",\n  \"tables\": [");
        for (size_t i = 0; i < count; i++) {
            const engram_table_info *t = &infos[i];
            if (t->size == 0)
                continue;
            printf("%s\n    {\"name\": ", first ? "" : ",");
            cli_json_str(stdout, names[i]);
            printf(", \"kind\": \"%s\", \"num_rows\": %" PRIu64 ", \"row_bytes\": %" PRIu32
                   ", \"row_pitch\": %" PRIu32 ", \"data_size\": %" PRIu64 "}",
                   kind_name(t->kind), t->spec.num_rows, t->spec.row_bytes, t->spec.row_pitch,
                   t->data_size);
            first = 0;
        }
        printf("%s],\n  \"skipped\": [", first ? "" : "\n  ");
        for (size_t i = 0; i < nskipped; i++) {
            printf("%s\n    {\"name\": ", i ? "," : "");
            cli_json_str(stdout, skipped[i].name);
            printf(", \"reason\": ");
            cli_json_str(stdout, skipped[i].reason);
            putchar('}');
        }
        printf("%s]\n}\n", nskipped ? "\n  " : "");
    } else {
        printf("%-*s  %12s  %9s  %9s  %s\n", (int)width, "NAME", "ROWS", "ROW_BYTES", "PITCH",
               "SIZE");
        for (size_t i = 0; i < count; i++) {
            const engram_table_info *t = &infos[i];
            if (t->size == 0)
                continue;
            printf("%-*s  %12" PRIu64 "  %9" PRIu32 "  %9" PRIu32 "  %s\n", (int)width,
                   names[i], t->spec.num_rows, t->spec.row_bytes, t->spec.row_pitch,
                   cli_fmt_bytes(t->data_size, sz, sizeof(sz)));
        }
    }
    /* After the listing, so that they are the last thing on a terminal. */
    fflush(stdout);
    for (size_t i = 0; i < nskipped; i++)
        cli_warn("skipped '%s' in %s/%s: %s", skipped[i].name, cli_root(cli), cli->ns,
                 skipped[i].reason);
    if (nskipped && cli->opt[OPT_STRICT])
        status = EXIT_FAIL;
out:
    for (size_t i = 0; skipped && i < nskipped; i++)
        free(skipped[i].reason);
    free(skipped);
    free(infos);
    engram_free(names);
    engram_store_close(st);
    return status;
}

/* Prints where a table's pages are, as info shows it: JSON (an object, or
 * null when the table is not memory) or one text line. */
static void print_placement(int rc, const engram_table_placement *p, int json)
{
    if (json) {
        int first = 1;
        if (rc != 0) {
            printf("null");
            return;
        }
        printf("{\"page_size\": %" PRIu32 ", \"pages\": %" PRIu64 ", \"sampled\": %" PRIu64
               ", \"absent\": %" PRIu64 ", \"other_nodes\": %" PRIu64
               ", \"private_copy\": %s, \"nodes\": {",
               p->page_size, p->pages, p->sampled, p->absent, p->other_nodes,
               p->private_copy ? "true" : "false");
        for (int n = 0; n <= p->max_node && n < ENGRAM_NUMA_MAX_NODES; n++) {
            if (!p->node_pages[n])
                continue;
            printf("%s\"%d\": %" PRIu64, first ? "" : ", ", n, p->node_pages[n]);
            first = 0;
        }
        printf("}}");
        return;
    }
    if (rc != 0) {
        printf("- (%s)\n", engram_errmsg());
        return;
    }
    for (int n = 0; n <= p->max_node && n < ENGRAM_NUMA_MAX_NODES; n++)
        if (p->node_pages[n])
            printf("node %d: %" PRIu64 " pages (%.1f%%), ", n, p->node_pages[n],
                   100.0 * (double)p->node_pages[n] / (double)p->sampled);
    if (p->other_nodes)
        printf("nodes >= %d: %" PRIu64 " pages, ", ENGRAM_NUMA_MAX_NODES, p->other_nodes);
    if (p->absent)
        printf("not in memory: %" PRIu64 " pages, ", p->absent);
    if (p->sampled == p->pages)
        printf("all %" PRIu64 " pages counted%s\n", p->pages,
               p->private_copy ? " (this process's private copy)" : "");
    else
        printf("%" PRIu64 " of %" PRIu64 " pages sampled%s\n", p->sampled, p->pages,
               p->private_copy ? " (this process's private copy)" : "");
}

static const char *origin_kind_name(uint32_t kind)
{
    return kind == ENGRAM_ORIGIN_REDIS ? "redis" : kind == ENGRAM_ORIGIN_MOONCAKE ? "mooncake"
                                                                                  : "?";
}

int cli_cmd_info(struct cli *cli)
{
    const char *name = cli->args[0];
    engram_table_info t = ENGRAM_TABLE_INFO_INIT;
    engram_table_placement pl = ENGRAM_TABLE_PLACEMENT_INIT;
    engram_store *st = NULL;
    engram_table_id id;
    char path[PATH_MAX * 2], created[64] = "", sz[32];
    int status = 0, prc, remote;
    time_t secs;
    struct tm tm;

    if ((status = cli_check_name(cli, name)) != 0)
        return status;
    if (cli_open_store(cli, 0, 1, &st, 0, &status) != 0)
        return status;
    if ((status = open_info(st, "info", name, cli->opt[OPT_MAP] != 0, &id, &t)) != 0)
        goto out;
    /* No placement (not memory, no libnuma, the query refused) is shown
     * with its reason; the rest of the info stands. */
    prc = engram_get_table_placement(st, name, &pl);
    remote = t.kind == ENGRAM_TABLE_REDIS;
    if (cli->opt[OPT_REDIS])
        snprintf(path, sizeof(path), "redis://%s/%s/%s", cli->opt[OPT_REDIS], cli->ns, name);
    else
        snprintf(path, sizeof(path), "%s/%s/%s", cli_root(cli), cli->ns, name);
    secs = (time_t)(t.created_ns / 1000000000u);
    if ((t.kind == ENGRAM_TABLE_FILE || t.kind == ENGRAM_TABLE_REDIS) && gmtime_r(&secs, &tm))
        strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &tm);

    if (cli->opt[OPT_JSON]) {
        printf("{\n  \"schema\": %d,\n  \"name\": ", CLI_JSON_SCHEMA);
        cli_json_str(stdout, name);
        printf(",\n  \"path\": ");
        cli_json_str(stdout, path);
        printf(",\n  \"kind\": \"%s\",\n", kind_name(t.kind));
        printf("  \"num_rows\": %" PRIu64 ",\n", t.spec.num_rows);
        printf("  \"row_bytes\": %" PRIu32 ",\n", t.spec.row_bytes);
        printf("  \"row_pitch\": %" PRIu32 ",\n", t.spec.row_pitch);
        /* The global row range the table holds (0, 0: none recorded). */
        printf("  \"row_start\": %" PRIu64 ",\n", t.row_start);
        printf("  \"total_rows\": %" PRIu64 ",\n", t.total_rows);
        printf("  \"data_offset\": %" PRIu64 ",\n", t.data_offset);
        printf("  \"data_size\": %" PRIu64 ",\n", t.data_size);
        /* A string: 64-bit values do not survive JSON readers that use
         * doubles. */
        printf("  \"checksum\": \"%016" PRIx64 "\",\n", t.checksum);
        printf("  \"created_ns\": %" PRIu64 ",\n", t.created_ns);
        printf("  \"created\": \"%s\",\n", created);
        /* Where the rows were published (a pulled table, a cluster's
         * table), or null. */
        printf("  \"origin\": ");
        if (t.origin.kind == ENGRAM_ORIGIN_NONE) {
            printf("null,\n");
        } else {
            printf("{\"store\": \"%s\", \"namespace\": ", origin_kind_name(t.origin.kind));
            cli_json_str(stdout, t.origin.ns);
            printf(", \"epoch\": \"%016" PRIx64 "\", \"where\": ", t.origin.epoch);
            cli_json_str(stdout, t.origin.where);
            printf("},\n");
        }
        if (remote) {
            /* A cluster's table is never mapped here: no value, not 0. */
            printf("  \"mapped\": null,\n  \"private_copy\": null,\n"
                   "  \"resident_bytes\": null,\n  \"huge_bytes\": null,\n"
                   "  \"map_minor_faults\": null,\n  \"map_major_faults\": null,\n");
        } else {
            printf("  \"mapped\": %s,\n", t.mapped ? "true" : "false");
            printf("  \"private_copy\": %s,\n", t.private_copy ? "true" : "false");
            printf("  \"resident_bytes\": %" PRIu64 ",\n", t.resident_bytes);
            printf("  \"huge_bytes\": %" PRIu64 ",\n", t.huge_bytes);
            printf("  \"map_minor_faults\": %" PRIu64 ",\n", t.map_minor_faults);
            printf("  \"map_major_faults\": %" PRIu64 ",\n", t.map_major_faults);
        }
        printf("  \"lookups\": %" PRIu64 ",\n", t.lookups);
        printf("  \"rows\": %" PRIu64 ",\n", t.rows);
        printf("  \"bytes\": %" PRIu64 ",\n", t.bytes);
        /* Pages per NUMA node (move_pages), or null: docs/cli.md. */
        printf("  \"placement\": ");
        print_placement(prc, &pl, 1);
        printf("\n}\n");
    } else {
        printf("name              %s\n", name);
        printf("path              %s\n", path);
        printf("kind              %s\n", kind_name(t.kind));
        printf("num_rows          %" PRIu64 "\n", t.spec.num_rows);
        printf("row_bytes         %" PRIu32 "\n", t.spec.row_bytes);
        printf("row_pitch         %" PRIu32 "\n", t.spec.row_pitch);
        if (t.total_rows)
            printf("row_range         rows %" PRIu64 "..%" PRIu64 " of %" PRIu64
                   " (global id = row + %" PRIu64 ": look up with --offset %" PRIu64 ")\n",
                   t.row_start, t.row_start + t.spec.num_rows - 1, t.total_rows, t.row_start,
                   t.row_start);
        else
            printf("row_range         - (none recorded)\n");
        printf("data_offset       %" PRIu64 "\n", t.data_offset);
        printf("data_size         %" PRIu64 " (%s)\n", t.data_size,
               cli_fmt_bytes(t.data_size, sz, sizeof(sz)));
        printf("checksum          xxh3-64:%016" PRIx64 "\n", t.checksum);
        printf("created           %s (%" PRIu64 " ns)\n", created[0] ? created : "-",
               t.created_ns);
        if (t.origin.kind != ENGRAM_ORIGIN_NONE)
            printf("origin            %s namespace '%s' at %s, epoch %016" PRIx64 "\n",
                   origin_kind_name(t.origin.kind), t.origin.ns,
                   t.origin.where[0] ? t.origin.where : "-", t.origin.epoch);
        else
            printf("origin            - (not pulled from a remote namespace)\n");
        /* What this process's mapping holds, and where its pages are,
         * mean nothing for a table read from a cluster: left out. */
        if (!remote) {
            printf("mapped            %s\n", t.mapped ? "yes" : "no");
            printf("private_copy      %s\n", t.private_copy ? "yes" : "no");
            printf("resident_bytes    %" PRIu64 " (%s)\n", t.resident_bytes,
                   cli_fmt_bytes(t.resident_bytes, sz, sizeof(sz)));
            printf("huge_bytes        %" PRIu64 " (%s)\n", t.huge_bytes,
                   cli_fmt_bytes(t.huge_bytes, sz, sizeof(sz)));
            printf("map_minor_faults  %" PRIu64 "\n", t.map_minor_faults);
            printf("map_major_faults  %" PRIu64 "\n", t.map_major_faults);
        }
        printf("lookups           %" PRIu64 "\n", t.lookups);
        printf("rows              %" PRIu64 "\n", t.rows);
        printf("bytes             %" PRIu64 "\n", t.bytes);
        if (!remote) {
            printf("numa_placement    ");
            print_placement(prc, &pl, 0);
        }
    }
out:
    engram_store_close(st);
    return status;
}

/* ------------------------------------------------------------------------
 * verify, rm
 */

/* verify --origin: compares local table `name` with the remote namespace
 * it records as its origin.  0 (OK, printed), or nonzero after saying
 * why. */
static int compare_origin(const struct cli *cli, engram_store *st, const char *name)
{
    engram_table_info li = ENGRAM_TABLE_INFO_INIT;
    struct cli at = *cli;
    engram_store *remote = NULL;
    int rc, state = 0, status;

    if ((rc = engram_get_table_info(st, name, &li)) != 0)
        return cli_lib_fail(rc, "verify '%s': read its origin", name);
    if (li.origin.kind == ENGRAM_ORIGIN_NONE)
        return cli_fail("verify '%s': the table records no origin (it was not pulled from a "
                        "remote namespace)",
                        name);
    if (li.origin.kind != ENGRAM_ORIGIN_REDIS)
        return cli_fail("verify '%s': it was pulled from namespace '%s' of a Mooncake Store "
                        "(%s); compare it from Python: EngramStore.check_origin()",
                        name, li.origin.ns, li.origin.where[0] ? li.origin.where : "-");
    if (!at.opt[OPT_REDIS]) {
        if (!li.origin.where[0])
            return cli_fail("verify '%s': its origin records no nodes; give --redis NODES", name);
        at.opt[OPT_REDIS] = li.origin.where;
    }
    if (cli_open_redis(&at, li.origin.ns, 0, &remote, &status) != 0)
        return status;
    rc = engram_check_origin(st, name, remote, &state);
    engram_store_close(remote);
    if (rc != 0)
        return cli_lib_fail(rc, "verify '%s': compare with namespace '%s' of %s", name,
                            li.origin.ns, at.opt[OPT_REDIS]);
    switch (state) {
    case ENGRAM_ORIGIN_CURRENT:
        printf("%s: OK, as namespace '%s' of %s publishes it (epoch %016" PRIx64 ")\n", name,
               li.origin.ns, at.opt[OPT_REDIS], li.origin.epoch);
        return 0;
    case ENGRAM_ORIGIN_REPUBLISHED:
        printf("%s: OK, namespace '%s' of %s published it again with the same rows\n", name,
               li.origin.ns, at.opt[OPT_REDIS]);
        return 0;
    case ENGRAM_ORIGIN_CHANGED:
        return cli_fail("verify '%s': namespace '%s' of %s now holds other rows under this "
                        "name; remove the local table and pull it again",
                        name, li.origin.ns, at.opt[OPT_REDIS]);
    default:
        return cli_fail("verify '%s': namespace '%s' of %s no longer has this table", name,
                        li.origin.ns, at.opt[OPT_REDIS]);
    }
}

int cli_cmd_verify(struct cli *cli)
{
    engram_store *st = NULL;
    char **names = NULL, **list;
    size_t count;
    int status = 0, failed = 0, rc;

    if (cli->opt[OPT_ALL] && cli->nargs > 0)
        return cli_usage_error(cli, "give table names or --all, not both");
    if (!cli->opt[OPT_ALL] && cli->nargs == 0)
        return cli_usage_error(cli, "give table names or --all");
    for (int i = 0; i < cli->nargs; i++)
        if ((status = cli_check_name(cli, cli->args[i])) != 0)
            return status;
    if (cli->opt[OPT_ORIGIN]) {
        /* The tables are local; --redis names where their origin is. */
        struct cli here = *cli;
        here.opt[OPT_REDIS] = NULL;
        if (cli_open_store(&here, 0, 1, &st, 0, &status) != 0)
            return status;
    } else if (cli_open_store(cli, 0, 1, &st, 0, &status) != 0) {
        return status;
    }
    if (cli->opt[OPT_ALL]) {
        rc = engram_list(st, &names, &count);
        if (rc != 0) {
            status = cli_lib_fail(rc, "list namespace '%s'", cli->ns);
            goto out;
        }
        if (count == 0 && cli->opt[OPT_REDIS]) {
            status = cli_redis_ns_missing(cli, "verify");
            goto out;
        }
        cli_sort_names(names, count);
        list = names;
    } else {
        list = cli->args;
        count = (size_t)cli->nargs;
    }
    for (size_t i = 0; i < count; i++) {
        struct progress pr;
        char label[ENGRAM_NAME_MAX + 16];
        snprintf(label, sizeof label, "verify %s", list[i]);
        cli_progress_init(&pr, label);
        rc = engram_verify(st, list[i], cli_progress_cb, &pr);
        cli_progress_end(&pr);
        if (rc == 0 && cli->opt[OPT_ORIGIN]) {
            if (compare_origin(cli, st, list[i]) != 0) {
                printf("%s: FAILED\n", list[i]);
                failed++;
            }
        } else if (rc == 0) {
            printf("%s: OK\n", list[i]);
        } else {
            printf("%s: FAILED\n", list[i]);
            fflush(stdout);
            cli_table_fail(st, rc, "verify", list[i]);
            failed++;
        }
    }
    status = failed ? EXIT_FAIL : 0;
out:
    engram_free(names);
    engram_store_close(st);
    return status;
}

int cli_cmd_rm(struct cli *cli)
{
    engram_store *st = NULL;
    int status = 0;

    for (int i = 0; i < cli->nargs; i++)
        if ((status = cli_check_name(cli, cli->args[i])) != 0)
            return status;
    if (cli_open_store(cli, 0, 1, &st, 0, &status) != 0)
        return status;
    for (int i = 0; i < cli->nargs; i++) {
        int rc = engram_remove(st, cli->args[i]);
        if (rc != 0)
            status = cli_table_fail(st, rc, "rm", cli->args[i]);
        else
            printf("removed %s\n", cli->args[i]);
        /* In the order they happened, when stdout and stderr are one. */
        fflush(stdout);
    }
    engram_store_close(st);
    return status;
}

/* ------------------------------------------------------------------------
 * lookup
 */
int cli_cmd_lookup(struct cli *cli)
{
    const char *name = cli->args[0];
    size_t n = (size_t)cli->nargs - 1;
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    engram_table_info t = ENGRAM_TABLE_INFO_INIT;
    engram_store *st = NULL;
    engram_table_id id;
    int64_t *ids = NULL, offset = 0;
    unsigned char *out = NULL;
    uint64_t out_bytes;
    int status = 0, rc;

    if ((status = cli_check_name(cli, name)) != 0)
        return status;
    if (cli->opt[OPT_OFFSET] && (rc = parse_i64(cli->opt[OPT_OFFSET], &offset)) != 0)
        return i64_usage_error(cli, "--offset:", cli->opt[OPT_OFFSET], rc);
    ids = malloc(n * sizeof(*ids));
    if (!ids)
        return cli_fail("lookup: out of memory");
    for (size_t i = 0; i < n; i++) {
        if ((rc = parse_i64(cli->args[i + 1], &ids[i])) != 0) {
            status = i64_usage_error(cli, "id", cli->args[i + 1], rc);
            goto out;
        }
    }
    if (cli_open_store(cli, 0, 1, &st, 0, &status) != 0)
        goto out;
    if ((status = open_info(st, "lookup", name, 1, &id, &t)) != 0)
        goto out;
    if (!cli_mul_ok(n, t.spec.row_bytes, &out_bytes) || out_bytes > SIZE_MAX ||
        !(out = malloc((size_t)out_bytes))) {
        status = cli_fail("lookup: out of memory for %zu rows of %" PRIu32 " bytes", n,
                          t.spec.row_bytes);
        goto out;
    }
    a.flags = cli->opt[OPT_ZERO_DEAD] ? ENGRAM_LOOKUP_ZERO_DEAD : 0;
    a.num_tokens = n;
    a.num_cols = 1;
    a.tables = &id;
    a.offsets = &offset;
    a.ids = ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = out;
    rc = engram_lookup(st, &a);
    if (rc != 0) {
        status = cli_lib_fail(rc, "lookup '%s'", name);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const unsigned char *row = out + i * t.spec.row_bytes;
        printf("%" PRId64 ":", ids[i]);
        if (ids[i] == ENGRAM_DEAD_ID && !cli->opt[OPT_ZERO_DEAD]) {
            puts(" dead");
            continue;
        }
        for (uint32_t j = 0; j < t.spec.row_bytes; j++)
            printf(" %02x", row[j]);
        putchar('\n');
    }
out:
    free(out);
    free(ids);
    engram_store_close(st);
    return status;
}
