/*
 * cli_ns.c - `engram ns`: the namespaces of a root.
 *
 * ns ls lists them (engram_namespace_list()) with what each holds, opening
 * each as any command would; ns rm removes them with
 * engram_namespace_remove(), which applies the library's own rules (trust,
 * create-only tables removed as engram_remove() does, a running writer or a
 * foreign entry stops it).  The CLI only adds its wording: --force for the
 * tables, and "did you mean" for a namespace that does not exist.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram.h"
#include "cli.h"

/* What ns ls reports of one namespace. */
struct ns_entry {
    const char *name;
    int skipped;  /* could not be opened or listed */
    char *reason; /* why (NULL: no memory to say it) */
    uint64_t tables, data_size;
};

/* Opens namespace `ns` of `root` and counts its tables and their bytes
 * into *e; if it cannot, sets e->skipped and e->reason (allocated). */
static void ns_measure(const char *root, const char *ns, struct ns_entry *e)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    char **names = NULL;
    size_t count = 0;
    int rc;

    e->name = ns;
    o.threads = 1;
    rc = engram_store_open(root, ns, &o, &st);
    if (rc == 0)
        rc = engram_list(st, &names, &count);
    if (rc != 0) {
        e->skipped = 1;
        e->reason = strdup(cli_lib_detail(rc));
        engram_store_close(st);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        engram_table_info t = ENGRAM_TABLE_INFO_INIT;
        /* Entries that are not tables are ls's to report, not counted. */
        if (engram_get_table_info(st, names[i], &t) == 0) {
            e->tables++;
            e->data_size += t.data_size;
        }
    }
    engram_free(names);
    engram_store_close(st);
}

static int ns_ls(struct cli *cli)
{
    const char *root = cli_root(cli);
    char **names = NULL;
    size_t count = 0, width = 9, nskipped = 0;
    struct ns_entry *e = NULL;
    int status = 0, rc, first = 1;
    char sz[32];

    if (cli->opt[OPT_FORCE])
        return cli_usage_error(cli, "--force goes with 'ns rm'");
    if (cli->nargs > 1)
        return cli_usage_error(cli, "unexpected argument '%s'", cli->args[1]);
    rc = engram_namespace_list(cli->root, &names, &count);
    if (rc == -ENOENT)
        return cli_fail("ns ls: the root directory %s does not exist (set --root or "
                        "ENGRAM_ROOT; 'engram create' makes it)", root);
    if (rc != 0)
        return cli_lib_fail(rc, "ns ls: list %s", root);
    if (!(e = calloc(count ? count : 1, sizeof *e))) {
        status = cli_fail("ns ls: out of memory");
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        ns_measure(cli->root, names[i], &e[i]);
        if (e[i].skipped)
            nskipped++;
        else if (strlen(names[i]) > width)
            width = strlen(names[i]);
    }
    if (cli->opt[OPT_JSON]) {
        printf("{\n  \"schema\": %d,\n  \"root\": ", CLI_JSON_SCHEMA);
        cli_json_str(stdout, root);
        printf(",\n  \"namespaces\": [");
        for (size_t i = 0; i < count; i++) {
            if (e[i].skipped)
                continue;
            printf("%s\n    {\"name\": ", first ? "" : ",");
            cli_json_str(stdout, e[i].name);
            printf(", \"tables\": %" PRIu64 ", \"data_size\": %" PRIu64 "}", e[i].tables,
                   e[i].data_size);
            first = 0;
        }
        printf("%s],\n  \"skipped\": [", first ? "" : "\n  ");
        first = 1;
        for (size_t i = 0; i < count; i++) {
            if (!e[i].skipped)
                continue;
            printf("%s\n    {\"name\": ", first ? "" : ",");
            cli_json_str(stdout, e[i].name);
            printf(", \"reason\": ");
            cli_json_str(stdout, e[i].reason ? e[i].reason : "out of memory");
            putchar('}');
            first = 0;
        }
        printf("%s]\n}\n", first ? "" : "\n  ");
    } else {
        printf("%-*s  %8s  %s\n", (int)width, "NAMESPACE", "TABLES", "SIZE");
        for (size_t i = 0; i < count; i++)
            if (!e[i].skipped)
                printf("%-*s  %8" PRIu64 "  %s\n", (int)width, e[i].name, e[i].tables,
                       cli_fmt_bytes(e[i].data_size, sz, sizeof sz));
    }
    fflush(stdout);
    for (size_t i = 0; i < count; i++)
        if (e[i].skipped)
            cli_warn("skipped namespace '%s' in %s: %s", e[i].name, root,
                     e[i].reason ? e[i].reason : "out of memory");
    if (nskipped && cli->opt[OPT_STRICT])
        status = EXIT_FAIL;
out:
    for (size_t i = 0; e && i < count; i++)
        free(e[i].reason);
    free(e);
    engram_free(names);
    return status;
}

static int ns_rm(struct cli *cli)
{
    const char *root = cli_root(cli);
    int force = cli->opt[OPT_FORCE] != NULL, status = 0;

    if (cli->opt[OPT_JSON] || cli->opt[OPT_STRICT])
        return cli_usage_error(cli, "--%s goes with 'ns ls'", cli->opt[OPT_JSON] ? "json" : "strict");
    if (cli->nargs < 2)
        return cli_usage_error(cli, "ns rm: give the namespaces to remove");
    for (int i = 1; i < cli->nargs; i++) {
        int rc = engram_name_check(cli->args[i]);
        if (rc != 0)
            return cli_usage_error(cli, "invalid namespace name '%s': %s", cli->args[i],
                                   cli_lib_detail(rc));
    }
    for (int i = 1; i < cli->nargs; i++) {
        const char *ns = cli->args[i];
        struct ns_entry e = {0};
        int rc;

        /* Counted first, for the refusal without --force (in the CLI's
         * words) and for the line that says what went. */
        ns_measure(cli->root, ns, &e);
        free(e.reason);
        if (!force && e.tables > 0) {
            status = cli_fail("ns rm: namespace %s/%s holds %" PRIu64 " table%s; not removed "
                              "(--force removes the tables with it)", root, ns, e.tables,
                              e.tables == 1 ? "" : "s");
            continue;
        }
        rc = engram_namespace_remove(cli->root, ns, force ? ENGRAM_NS_REMOVE_TABLES : 0);
        if (rc == -ENOENT)
            status = cli_ns_missing(root, ns, "ns rm");
        else if (rc != 0)
            status = cli_lib_fail(rc, "ns rm '%s'", ns);
        else
            printf("removed namespace %s (%" PRIu64 " table%s)\n", ns, e.tables,
                   e.tables == 1 ? "" : "s");
        fflush(stdout);
    }
    return status;
}

int cli_cmd_ns(struct cli *cli)
{
    const char *sub = cli->args[0];

    /* The namespaces are the arguments here: a --ns would be ignored. */
    if (cli->opt[OPT_NS])
        return cli_usage_error(cli, "--ns does not apply to 'ns' (name the namespaces as "
                                    "arguments)");
    if (strcmp(sub, "ls") == 0)
        return ns_ls(cli);
    if (strcmp(sub, "rm") == 0)
        return ns_rm(cli);
    return cli_usage_error(cli, "unknown subcommand '%s' (ls or rm)", sub);
}
