/*
 * cli_push.c - push: copies tables of a local namespace to the same
 * namespace of a Redis Cluster; pull, the other way (engram_pull()).
 *
 * The local tables are mapped and streamed to the cluster through the
 * store API (cli_write_table() over a store opened with
 * engram_store_open_redis()), so the cluster side is exactly what a C
 * program pushing with engram_populate() gets.  The library's publication
 * is create-only; push adds one convenience on top: a table already in
 * the cluster with the same spec and the same rows (XXH3-64 of the packed
 * rows, which the cluster's manifest records) and whose chunks are all
 * there with their checksums is skipped, so that a push interrupted
 * half-way can simply be run again; one listed but not whole is an error.
 *
 * It also holds `engram --redis NODES --ns NS gc`, engram_store_gc() of
 * a cluster's namespace.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "engram.h"
#include "cli.h"

/* The row_source_fn of a mapped local table. */
struct mapped_source {
    const unsigned char *base;
    uint32_t pitch, row_bytes;
};

static int mapped_rows(void *ctx, unsigned char *buf, uint64_t first, uint64_t n)
{
    const struct mapped_source *m = ctx;
    for (uint64_t i = 0; i < n; i++)
        memcpy(buf + i * m->row_bytes, m->base + (first + i) * m->pitch, m->row_bytes);
    return 0;
}

/* XXH3-64 of the rows packed at row_bytes (what a cluster's manifest
 * records), from the local table's checksum when its rows are packed. */
static uint64_t packed_checksum(const struct mapped_source *m, uint64_t rows,
                                const engram_table_info *local)
{
    XXH3_state_t *xs;
    uint64_t sum;
    if (m->pitch == m->row_bytes)
        return local->checksum;
    if (!(xs = XXH3_createState()))
        return ~local->checksum; /* out of memory: counts as different */
    XXH3_64bits_reset(xs);
    for (uint64_t i = 0; i < rows; i++)
        XXH3_64bits_update(xs, m->base + i * m->pitch, m->row_bytes);
    sum = XXH3_64bits_digest(xs);
    XXH3_freeState(xs);
    return sum;
}

/* Pushes one table; returns 0 or an exit status after reporting. */
static int push_one(const struct cli *cli, engram_store *local, engram_store *remote,
                    const char *ns, const char *name)
{
    engram_table_info li = ENGRAM_TABLE_INFO_INIT, ri = ENGRAM_TABLE_INFO_INIT;
    engram_table_spec spec;
    struct mapped_source src;
    engram_table_id id;
    const void *base;
    char sz[32];
    int rc, status;

    if ((rc = engram_table_open(local, name, &id)) != 0)
        return cli_lib_fail(rc, "open '%s' in namespace '%s'", name, ns);
    if ((rc = engram_get_table_info(local, name, &li)) != 0)
        return cli_lib_fail(rc, "info '%s'", name);
    if ((rc = engram_table_memory(local, id, &base, &spec)) != 0)
        return cli_lib_fail(rc, "map '%s'", name);
    src.base = base;
    src.pitch = spec.row_pitch;
    src.row_bytes = spec.row_bytes;
    rc = engram_get_table_info(remote, name, &ri);
    if (rc == 0) {
        if (ri.spec.num_rows == spec.num_rows && ri.spec.row_bytes == spec.row_bytes &&
            ri.checksum == packed_checksum(&src, spec.num_rows, &li)) {
            /* Listed with our checksum is not enough: its chunks must all
             * be there, with their checksums, before it counts as pushed.
             * Only a missing or wrong chunk says it is not whole: a check
             * that failed otherwise (the network, rights) says nothing of
             * the data, and removing a whole table is no remedy. */
            rc = engram_verify(remote, name, NULL, NULL);
            if (rc == -ENODATA || rc == ENGRAM_ECHECKSUM)
                return cli_lib_fail(rc, "push '%s': the cluster lists it with the same rows, "
                                        "but it is not whole; remove it with 'engram --redis "
                                        "%s --ns %s rm %s' and push again",
                                    name, cli->opt[OPT_REDIS], ns, name);
            if (rc != 0)
                return cli_lib_fail(rc, "push '%s': the cluster lists it with the same rows, "
                                        "but checking that all its chunks are there failed",
                                    name);
            printf("%s: already in the cluster with the same rows, skipped\n", name);
            return 0;
        }
        return cli_fail("push '%s': the cluster holds another table of that name (%" PRIu64
                        " rows of %" PRIu32 " bytes, checksum %016" PRIx64
                        "); remove it first with 'engram --redis %s --ns %s rm %s'",
                        name, ri.spec.num_rows, ri.spec.row_bytes, ri.checksum,
                        cli->opt[OPT_REDIS], ns, name);
    }
    if (rc != -ENOENT)
        return cli_lib_fail(rc, "look for '%s' in the cluster", name);
    /* The cluster keeps rows packed: the pitch stays local. */
    spec.row_pitch = 0;
    if ((status = cli_write_table(remote, "push", name, &spec, mapped_rows, &src)) != 0)
        return status;
    printf("%s: pushed %" PRIu64 " rows of %" PRIu32 " bytes (%s)\n", name, spec.num_rows,
           spec.row_bytes, cli_fmt_bytes(spec.num_rows * spec.row_bytes, sz, sizeof sz));
    return 0;
}

/* The arguments push and pull share: --redis, the namespace as the first
 * argument (not --ns), table names after it.  0, or the exit status
 * after reporting. */
static int sync_args(const struct cli *cli, const char *verb)
{
    const char *ns = cli->args[0];
    int rc, status;
    if (!cli->opt[OPT_REDIS])
        return cli_usage_error(cli, "--redis HOST:PORT[,...] is required");
    if (cli->opt[OPT_NS])
        return cli_usage_error(cli, "the namespace is %s's first argument, not --ns", verb);
    if ((rc = engram_name_check(ns)) != 0)
        return cli_usage_error(cli, "invalid namespace name '%s': %s", ns, cli_lib_detail(rc));
    for (int i = 1; i < cli->nargs; i++)
        if ((status = cli_check_name(cli, cli->args[i])) != 0)
            return status;
    return 0;
}

int cli_cmd_push(struct cli *cli)
{
    const char *ns = cli->args[0];
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *local = NULL, *remote = NULL;
    char **names = NULL, **list;
    size_t count;
    int status = 0, failed = 0, rc;

    if ((status = sync_args(cli, "push")) != 0)
        return status;
    o.threads = 1;
    if ((rc = engram_store_open(cli->root, ns, &o, &local)) != 0)
        return cli_lib_fail(rc, "open namespace '%s' under '%s'", ns, cli_root(cli));
    if (cli_open_redis(cli, ns, 0, &remote, &status) != 0)
        goto out;
    if (cli->nargs > 1) {
        list = cli->args + 1;
        count = (size_t)cli->nargs - 1;
    } else {
        if ((rc = engram_list(local, &names, &count)) != 0) {
            status = cli_lib_fail(rc, "list namespace '%s'", ns);
            goto out;
        }
        list = names;
    }
    for (size_t i = 0; i < count && !cli_interrupted; i++)
        if (push_one(cli, local, remote, ns, list[i]) != 0)
            failed++;
    status = failed ? EXIT_FAIL : 0;
out:
    engram_free(names);
    engram_store_close(remote);
    engram_store_close(local);
    return status;
}

/* engram --redis NODES --ns NS gc: one line per pending record. */
struct rgc_out {
    int json, dry_run, first;
    unsigned deleted, kept, failed;
};

static void rgc_report(void *ud, const char *name, int code, const char *detail)
{
    struct rgc_out *g = ud;
    const char *what = code == 0 ? (g->dry_run ? "would_delete" : "deleted")
                       : code == ENGRAM_GC_KEPT ? "kept"
                                                : "failed";
    g->deleted += code == 0;
    g->kept += code == ENGRAM_GC_KEPT;
    g->failed += code < 0;
    if (g->json) {
        printf("%s\n    {\"name\": ", g->first ? "" : ",");
        cli_json_str(stdout, name);
        printf(", \"action\": \"%s\", \"reason\": ", what);
        cli_json_str(stdout, detail);
        putchar('}');
        g->first = 0;
    } else if (code < 0) {
        cli_warn("gc: '%s' left as it is: %s", name, detail);
    } else {
        printf("%s %s: %s\n", code == 0 && g->dry_run ? "would delete" : what, name, detail);
    }
}

int cli_redis_gc(struct cli *cli, uint64_t idle_s)
{
    struct rgc_out g = {0};
    engram_store *st = NULL;
    int status = 0, rc;
    if (!cli->opt[OPT_NS])
        return cli_usage_error(cli, "--redis gc needs --ns NS: the namespace of the cluster");
    if (cli_open_redis(cli, cli->opt[OPT_NS], 0, &st, &status) != 0)
        return status;
    g.json = cli->opt[OPT_JSON] != NULL;
    g.dry_run = cli->opt[OPT_DRY_RUN] != NULL;
    g.first = 1;
    if (g.json) {
        printf("{\n  \"schema\": %d,\n  \"redis\": ", CLI_JSON_SCHEMA);
        cli_json_str(stdout, cli->opt[OPT_REDIS]);
        printf(",\n  \"namespace\": ");
        cli_json_str(stdout, cli->opt[OPT_NS]);
        printf(",\n  \"older_than\": %" PRIu64 ",\n  \"dry_run\": %s,\n  \"pending\": [",
               idle_s, g.dry_run ? "true" : "false");
    }
    rc = engram_store_gc(st, idle_s, g.dry_run ? ENGRAM_GC_DRY_RUN : 0, rgc_report, &g);
    if (g.json)
        printf("%s]\n}\n", g.first ? "" : "\n  ");
    else if (rc == 0)
        printf("%s %u, kept %u, failed %u\n", g.dry_run ? "would delete" : "deleted",
               g.deleted, g.kept, g.failed);
    fflush(stdout);
    engram_store_close(st);
    if (rc != 0)
        return cli_lib_fail(rc, "gc of namespace '%s' in %s", cli->opt[OPT_NS],
                            cli->opt[OPT_REDIS]);
    return g.failed && cli->opt[OPT_STRICT] ? EXIT_FAIL : 0;
}

/* engram pull NS [NAME...] --redis NODES: the mirror of push. */
static int pull_one(const struct cli *cli, engram_store *local, engram_store *remote,
                    const char *ns, const char *name)
{
    struct progress pr;
    char label[ENGRAM_NAME_MAX + 8], sz[32];
    engram_table_info li = ENGRAM_TABLE_INFO_INIT;
    int written = 0, rc;
    snprintf(label, sizeof label, "pull %s", name);
    cli_progress_init(&pr, label);
    rc = engram_pull(local, remote, name, cli_progress_cb, &pr, &written);
    cli_progress_end(&pr);
    if (rc != 0)
        return cli_lib_fail(rc, "pull '%s' from namespace '%s' of %s", name, ns,
                            cli->opt[OPT_REDIS]);
    if (engram_get_table_info(local, name, &li) != 0)
        li.spec.num_rows = 0;
    printf("%s: %s (%s)\n", name, written ? "pulled" : "already here with the same rows",
           cli_fmt_bytes(li.spec.num_rows * li.spec.row_bytes, sz, sizeof sz));
    return 0;
}

int cli_cmd_pull(struct cli *cli)
{
    const char *ns = cli->args[0];
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *local = NULL, *remote = NULL;
    char **names = NULL, **list;
    size_t count;
    int status = 0, failed = 0, made = 0, rc;

    if ((status = sync_args(cli, "pull")) != 0)
        return status;
    /* The cluster's side first: nothing is made here for a pull that
     * cannot start. */
    if (cli_open_redis(cli, ns, 0, &remote, &status) != 0)
        return status;
    if (cli->nargs > 1) {
        list = cli->args + 1;
        count = (size_t)cli->nargs - 1;
        for (size_t i = 0; i < count; i++) {
            engram_table_info ri = ENGRAM_TABLE_INFO_INIT;
            if ((rc = engram_get_table_info(remote, list[i], &ri)) != 0) {
                status = cli_lib_fail(rc, "pull '%s'", list[i]);
                goto out;
            }
        }
    } else {
        if ((rc = engram_list(remote, &names, &count)) != 0) {
            status = cli_lib_fail(rc, "list namespace '%s' of %s", ns, cli->opt[OPT_REDIS]);
            goto out;
        }
        list = names;
        if (count == 0) {
            status = cli_fail("pull: namespace '%s' of %s has no tables", ns,
                              cli->opt[OPT_REDIS]);
            goto out;
        }
    }
    /* A probe without ENGRAM_OPEN_CREATE: whether the namespace is made
     * here (and so goes again if no table could be pulled into it). */
    o.threads = 1;
    if ((rc = engram_store_open(cli->root, ns, &o, &local)) == 0)
        engram_store_close(local);
    made = rc == -ENOENT;
    local = NULL;
    o.flags = ENGRAM_OPEN_CREATE;
    if ((rc = engram_store_open(cli->root, ns, &o, &local)) != 0) {
        status = cli_lib_fail(rc, "open namespace '%s' under '%s'", ns, cli_root(cli));
        goto out;
    }
    for (size_t i = 0; i < count && !cli_interrupted; i++)
        if (pull_one(cli, local, remote, ns, list[i]) != 0)
            failed++;
    status = failed || cli_interrupted ? EXIT_FAIL : 0;
out:
    engram_free(names);
    engram_store_close(local);
    engram_store_close(remote);
    /* Still empty (every pull failed): engram_namespace_remove() without
     * flags refuses a namespace with a table or another user. */
    if (made && status != 0)
        (void)engram_namespace_remove(cli->root, ns, 0);
    return status;
}
