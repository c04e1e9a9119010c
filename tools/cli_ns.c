/*
 * cli_ns.c - `engram ns` and `engram gc`: the namespaces of a root.
 *
 * ns ls lists them (engram_namespace_list()) with what each holds, opening
 * each as any command would, and who uses it (engram_namespace_usage());
 * ns rm removes them with engram_namespace_remove(), which applies the
 * library's own rules (trust, create-only tables removed as engram_remove()
 * does, a running writer, a live user or a foreign entry stops it).  gc
 * removes those nobody uses with engram_namespace_gc().  The CLI only adds
 * its wording: --force for the tables and the users, and "did you mean"
 * for a namespace that does not exist.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engram.h"
#include "cli.h"

/* What ns ls reports of one namespace. */
struct ns_entry {
    const char *name;
    int skipped;  /* could not be opened or listed */
    char *reason; /* why (NULL: no memory to say it) */
    uint64_t tables, data_size;
    engram_namespace_use use;
};

/* "3 s", "5 min", "2 h", "4 d": how long ago `ns` (ns since the epoch)
 * was, or "-" if unknown. */
static const char *fmt_ago(uint64_t t_ns, char *buf, size_t cap)
{
    struct timespec now;
    uint64_t s;
    if (t_ns == 0 || clock_gettime(CLOCK_REALTIME, &now) != 0)
        return "-";
    s = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    s = s > t_ns ? (s - t_ns) / 1000000000u : 0;
    if (s < 120)
        snprintf(buf, cap, "%" PRIu64 " s ago", s);
    else if (s < 7200)
        snprintf(buf, cap, "%" PRIu64 " min ago", s / 60);
    else if (s < 172800)
        snprintf(buf, cap, "%" PRIu64 " h ago", s / 3600);
    else
        snprintf(buf, cap, "%" PRIu64 " d ago", s / 86400);
    return buf;
}

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
    /* Before the open, which removes stale leases. */
    e->use.size = sizeof e->use;
    if (engram_namespace_usage(root, ns, &e->use) != 0) {
        memset(&e->use, 0, sizeof e->use);
        e->use.size = sizeof e->use;
    }
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
            printf(", \"tables\": %" PRIu64 ", \"data_size\": %" PRIu64 ", \"users\": %u, "
                   "\"stale_leases\": %u, \"last_used\": %.3f}",
                   e[i].tables, e[i].data_size, e[i].use.users, e[i].use.stale_leases,
                   (double)e[i].use.last_used_ns / 1e9);
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
        char ago[32];
        printf("%-*s  %8s  %10s  %5s  %s\n", (int)width, "NAMESPACE", "TABLES", "SIZE", "USERS",
               "LAST USED");
        for (size_t i = 0; i < count; i++)
            if (!e[i].skipped)
                printf("%-*s  %8" PRIu64 "  %10s  %5u  %s\n", (int)width, e[i].name,
                       e[i].tables, cli_fmt_bytes(e[i].data_size, sz, sizeof sz),
                       e[i].use.users, fmt_ago(e[i].use.last_used_ns, ago, sizeof ago));
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
        if (!force && e.use.users > 0) {
            status = cli_fail("ns rm: namespace %s/%s is in use by %u process%s (%s); not "
                              "removed (--force removes it anyway: they keep reading the "
                              "tables they opened)", root, ns, e.use.users,
                              e.use.users == 1 ? "" : "es", e.use.first_user);
            continue;
        }
        rc = engram_namespace_remove(cli->root, ns,
                                     force ? ENGRAM_NS_REMOVE_TABLES | ENGRAM_NS_REMOVE_IN_USE
                                           : 0);
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

/* engram gc: what engram_namespace_gc() reported, in the CLI's words. */
struct gc_out {
    int json, dry_run, first, failed;
    unsigned removed, kept;
};

static void gc_report(void *ud, const char *ns, int code, const char *detail)
{
    struct gc_out *g = ud;
    const char *what = code == 0 ? (g->dry_run ? "would remove" : "removed")
                       : code == ENGRAM_GC_KEPT ? "kept"
                                                : "failed";
    if (code == 0)
        g->removed++;
    else if (code == ENGRAM_GC_KEPT)
        g->kept++;
    else
        g->failed++;
    if (g->json) {
        printf("%s\n    {\"name\": ", g->first ? "" : ",");
        cli_json_str(stdout, ns);
        printf(", \"action\": \"%s\", \"reason\": ",
               code == 0 ? (g->dry_run ? "would_remove" : "removed") : what);
        cli_json_str(stdout, detail ? detail : "");
        putchar('}');
        g->first = 0;
    } else if (code < 0) {
        cli_warn("gc: namespace '%s' kept: %s", ns, detail ? detail : "");
    } else {
        printf("%s %s: %s\n", what, ns, detail ? detail : "");
    }
}

/* Parses a duration: a number of seconds, or with a suffix s, m, h or d. */
static int parse_duration(const char *s, uint64_t *out)
{
    char num[32];
    size_t n = strlen(s);
    uint64_t mult = 1, v;
    if (n == 0 || n >= sizeof num)
        return -1;
    memcpy(num, s, n + 1);
    switch (num[n - 1]) {
    case 's': mult = 1; num[--n] = '\0'; break;
    case 'm': mult = 60; num[--n] = '\0'; break;
    case 'h': mult = 3600; num[--n] = '\0'; break;
    case 'd': mult = 86400; num[--n] = '\0'; break;
    default: break;
    }
    if (cli_parse_u64(num, &v) != 0 || !cli_mul_ok(v, mult, out))
        return -1;
    return 0;
}

/* engram gc [--older-than DURATION] [--dry-run] [--json] */
int cli_cmd_gc(struct cli *cli)
{
    const char *root = cli_root(cli);
    struct gc_out g = {0};
    uint64_t idle = 86400;
    int rc;
    if (cli->opt[OPT_OLDER_THAN] && parse_duration(cli->opt[OPT_OLDER_THAN], &idle) != 0)
        return cli_usage_error(cli, "--older-than: '%s' is not a duration (seconds, or a "
                                    "number with s, m, h or d)", cli->opt[OPT_OLDER_THAN]);
    if (cli->opt[OPT_REDIS])
        return cli_redis_gc(cli, cli->opt[OPT_OLDER_THAN] ? idle : 0);
    if (cli->opt[OPT_NS])
        return cli_usage_error(cli, "--ns does not apply to 'gc' (it looks at every namespace "
                                    "of the root)");
    g.json = cli->opt[OPT_JSON] != NULL;
    g.dry_run = cli->opt[OPT_DRY_RUN] != NULL;
    g.first = 1;
    if (g.json) {
        printf("{\n  \"schema\": %d,\n  \"root\": ", CLI_JSON_SCHEMA);
        cli_json_str(stdout, root);
        printf(",\n  \"older_than\": %" PRIu64 ",\n  \"dry_run\": %s,\n  \"namespaces\": [",
               idle, g.dry_run ? "true" : "false");
    }
    rc = engram_namespace_gc(cli->root, idle, g.dry_run ? ENGRAM_GC_DRY_RUN : 0, gc_report, &g);
    if (g.json)
        printf("%s]\n}\n", g.first ? "" : "\n  ");
    else if (rc == 0 && g.failed)
        /* A namespace a warning names is kept too (gc removes only what
         * it could look at in full): counted with the others. */
        printf("%s %u namespace%s, kept %u (%u of them for what the warning%s above say%s)\n",
               g.dry_run ? "would remove" : "removed", g.removed, g.removed == 1 ? "" : "s",
               g.kept + g.failed, g.failed, g.failed == 1 ? "" : "s", g.failed == 1 ? "s" : "");
    else if (rc == 0)
        printf("%s %u namespace%s, kept %u\n", g.dry_run ? "would remove" : "removed",
               g.removed, g.removed == 1 ? "" : "s", g.kept);
    fflush(stdout);
    if (rc == -ENOENT)
        return cli_fail("gc: the root directory %s does not exist (set --root or ENGRAM_ROOT)",
                        root);
    if (rc != 0)
        return cli_lib_fail(rc, "gc %s", root);
    return g.failed && cli->opt[OPT_STRICT] ? EXIT_FAIL : 0;
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
