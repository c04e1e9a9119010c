/*
 * cli_util.c - the helpers every part of the `engram` CLI uses: error
 * reports, strict number parsing, sizes and durations for humans, JSON
 * strings, the id generator, the deterministic row fills, the progress
 * display and opening the command's store.  See cli.h for the map of the
 * CLI.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engram.h"
#include "cli.h"

/* ------------------------------------------------------------------------
 * Interruption and errors.
 */

/* Set by SIGINT/SIGTERM while the demo runs, so that it can still remove
 * the gigabyte of tables it created before exiting. */
volatile sig_atomic_t cli_interrupted;

/* The detail of a library failure: the thread's detailed message when the
 * library left one, else the fixed text of the code. */
const char *cli_lib_detail(int rc)
{
    const char *m = engram_errmsg();
    return (m && m[0]) ? m : engram_strerror(rc);
}

/* Reports a failed library call as "engram: <what>: <detail>" and returns
 * the exit status for it. */
int cli_lib_fail(int rc, const char *fmt, ...)
{
    va_list ap;
    fputs("engram: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, ": %s\n", cli_lib_detail(rc));
    return EXIT_FAIL;
}

/* Reports a failure that is not a library call (a file, a parse). */
int cli_fail(const char *fmt, ...)
{
    va_list ap;
    fputs("engram: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return EXIT_FAIL;
}

/* Reports something skipped that does not fail the command. */
void cli_warn(const char *fmt, ...)
{
    va_list ap;
    fputs("engram: warning: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ------------------------------------------------------------------------
 * Numbers, sizes, text.
 */

/* Strict unsigned decimal: digits only, no sign, no junk, no overflow.
 * Returns 0, -1 if s is not such a number, or -2 if it is one above
 * UINT64_MAX. */
int cli_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (!s || !isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (*end != '\0')
        return -1;
    if (errno == ERANGE)
        return -2;
    if (errno != 0)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* Parses "a,b,c" of integers >= min into v (at most cap), *n of them.
 * 0, -1 (not such a list) or -2 (too many). */
int cli_parse_list(const char *s, uint64_t min, uint64_t *v, size_t cap, size_t *n)
{
    char item[32];
    *n = 0;
    for (;;) {
        size_t len = strcspn(s, ",");
        if (len == 0 || len >= sizeof item)
            return -1;
        if (*n == cap)
            return -2;
        memcpy(item, s, len);
        item[len] = '\0';
        if (cli_parse_u64(item, &v[*n]) != 0 || v[*n] < min)
            return -1;
        (*n)++;
        if (s[len] == '\0')
            return 0;
        s += len + 1;
    }
}

/* Multiplies with an overflow check; the one place size products are
 * formed. */
int cli_mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

/* Formats a byte count for humans ("1.00 GiB") into buf. */
const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)n;
    unsigned u = 0;

    if (n < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", n);
        return buf;
    }
    while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

/* Formats a duration given in nanoseconds with a unit that keeps three
 * significant digits or so. */
const char *cli_fmt_ns(double ns, char *buf, size_t len)
{
    if (ns < 1e3)
        snprintf(buf, len, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, len, "%.1f us", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, len, "%.2f ms", ns / 1e6);
    else
        snprintf(buf, len, "%.2f s", ns / 1e9);
    return buf;
}

/* Writes s as a JSON string literal.  Table names are restricted to a safe
 * alphabet, but paths are not. */
void cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* A small, fast generator for ids (xorshift64*); the modulo bias is below
 * 2^-40 for any table size the ids are drawn from. */
uint64_t cli_rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* ------------------------------------------------------------------------
 * Deterministic row contents.
 *
 * The pattern fill makes every byte of every table predictable from
 * (seed, row, byte index), so lookups can be checked without keeping a copy:
 *   bytes 0..7 of row i hold i as a little-endian uint64 (truncated when the
 *   row is shorter), so a human reading `lookup` output sees the row;
 *   the 8 bytes from offset 8*w (w >= 1) hold, little-endian,
 *   mix64(S * 0xD6E8FEB86659FD93 ^ i * 0x9E3779B97F4A7C15 ^ w * 0xC2B2AE3D27D4EB4F)
 *   where mix64 is the splitmix64 finaliser and S the seed.
 * The random fill uses the same counter-based hash (with different
 * constants) for every word, so it is reproducible from --seed and can be
 * produced in any chunking.
 */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t pattern_word(uint64_t seed, uint64_t row, uint64_t w)
{
    return mix64((seed * 0xD6E8FEB86659FD93ull) ^ (row * 0x9E3779B97F4A7C15ull) ^
                 (w * 0xC2B2AE3D27D4EB4Full));
}

static uint64_t random_word(uint64_t seed, uint64_t row, uint64_t w)
{
    return mix64((seed * 0xA0761D6478BD642Full) ^ (row * 0xE7037ED1A0B428DBull) ^
                 (w * 0x8EBC6AF09C88C6E3ull) ^ 0x589965CC75374CC3ull);
}

/* Writes the first n bytes of word v, little-endian. */
static void put_le(unsigned char *dst, uint64_t v, uint32_t n)
{
    for (uint32_t b = 0; b < n; b++)
        dst[b] = (unsigned char)(v >> (8 * b));
}

/* Produces row `row` of a synthetic table into dst (row_bytes bytes). */
void cli_fill_row(unsigned char *dst, enum fill fill, uint64_t seed, uint64_t row,
                  uint32_t row_bytes)
{
    if (fill == FILL_ZERO) {
        memset(dst, 0, row_bytes);
        return;
    }
    for (uint32_t j = 0; j < row_bytes; j += 8) {
        uint32_t n = row_bytes - j < 8 ? row_bytes - j : 8;
        uint64_t w;
        if (fill == FILL_PATTERN)
            w = j == 0 ? row : pattern_word(seed, row, j / 8);
        else
            w = random_word(seed, row, j / 8);
        put_le(dst + j, w, n);
    }
}

/* ------------------------------------------------------------------------
 * Progress.
 *
 * A terminal gets one line, redrawn in place at most every 100 ms and
 * erased at the end (what the command then prints on stdout says how it
 * ended).  Anything else (a log file, a CI job) gets plain lines, which
 * only an operation that lasts is worth: the first after one interval,
 * then one per interval, and once any was printed, a last one saying how
 * it ended.
 */
#define PROGRESS_TTY_NS 100000000ull         /* terminal redraws at most this often */
#define PROGRESS_DEFAULT_SECS 10.0           /* plain lines: ENGRAM_PROGRESS_SECS's default */

/* Seconds between plain lines: ENGRAM_PROGRESS_SECS (a non-negative
 * decimal number; 0 = every step), else the default.  A bad value is
 * said once and the default used. */
static uint64_t progress_interval_ns(void)
{
    static int warned;
    const char *env = getenv("ENGRAM_PROGRESS_SECS");
    char *end;
    double secs;

    if (!env || !env[0])
        return (uint64_t)(PROGRESS_DEFAULT_SECS * 1e9);
    errno = 0;
    secs = strtod(env, &end);
    if (errno != 0 || *end != '\0' || !(secs >= 0.0) || secs > 1e6 || !isdigit((unsigned char)env[0])) {
        if (!warned)
            cli_warn("ENGRAM_PROGRESS_SECS='%s' is not a number of seconds (0 .. 1000000); "
                     "using %.0f", env, PROGRESS_DEFAULT_SECS);
        warned = 1;
        return (uint64_t)(PROGRESS_DEFAULT_SECS * 1e9);
    }
    return (uint64_t)(secs * 1e9);
}

/* A duration for humans: "0.4s", "42s", "3m05s", "2h07m". */
static const char *fmt_secs(double s, char *buf, size_t len)
{
    uint64_t t = s < 0 ? 0 : (uint64_t)(s + 0.5);
    if (s < 9.95)
        snprintf(buf, len, "%.1fs", s < 0 ? 0.0 : s);
    else if (t < 60)
        snprintf(buf, len, "%" PRIu64 "s", t);
    else if (t < 3600)
        snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", t / 60, t % 60);
    else
        snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", t / 3600, t / 60 % 60);
    return buf;
}

void cli_progress_init(struct progress *p, const char *label)
{
    memset(p, 0, sizeof *p);
    p->label = label;
    p->tty = isatty(STDERR_FILENO);
    p->start_ns = cli_now_ns();
    p->interval_ns = p->tty ? PROGRESS_TTY_NS : progress_interval_ns();
}

/* "45%  1.20 GiB / 2.66 GiB  310.5 MiB/s  ETA 5s" (sep between the
 * parts), for p's current state at `now`. */
static void progress_text(const struct progress *p, uint64_t now, const char *sep, char *buf,
                          size_t len)
{
    double secs = (double)(now - p->start_ns) / 1e9;
    double rate = secs > 0 ? (double)p->done / secs : 0.0;
    int pct = p->total ? (int)((double)p->done * 100.0 / (double)p->total) : 100;
    char d[32], t[32], r[32], e[32];

    if (pct > 100)
        pct = 100;
    cli_fmt_bytes(p->done, d, sizeof d);
    cli_fmt_bytes(p->total, t, sizeof t);
    cli_fmt_bytes((uint64_t)rate, r, sizeof r);
    if (rate > 0 && p->done < p->total)
        fmt_secs((double)(p->total - p->done) / rate, e, sizeof e);
    else
        snprintf(e, sizeof e, "-");
    snprintf(buf, len, "%3d%%%s%s / %s%s%s/s%sETA %s", pct, sep, d, t, sep, r, sep, e);
}

int cli_progress_cb(void *ud, uint64_t done, uint64_t total)
{
    static const char bar[] = "##############################";
    static const char dots[] = "..............................";
    struct progress *p = ud;
    const int width = 20;
    uint64_t now;
    char text[160];

    if (cli_interrupted)
        return 1; /* cancels the library operation (-ECANCELED) */
    p->done = done;
    p->total = total;
    now = cli_now_ns();
    if (p->tty) {
        int filled;
        /* The last step is always drawn, so the line ends at 100%. */
        if (p->shown && done < total && now - p->last_ns < p->interval_ns)
            return 0;
        filled = total ? (int)((double)done * width / (double)total) : width;
        if (filled > width)
            filled = width;
        progress_text(p, now, "  ", text, sizeof text);
        fprintf(stderr, "\r%s [%.*s%.*s] %s\033[K", p->label, filled, bar, width - filled, dots,
                text);
    } else {
        /* The first line one interval after the start, then one per
         * interval. */
        if (now - (p->shown ? p->last_ns : p->start_ns) < p->interval_ns)
            return 0;
        progress_text(p, now, ", ", text, sizeof text);
        fprintf(stderr, "%s: %s\n", p->label, text);
    }
    fflush(stderr);
    p->shown = 1;
    p->last_ns = now;
    return 0;
}

void cli_progress_end(struct progress *p)
{
    if (p->shown && p->tty) {
        fputs("\r\033[K", stderr);
    } else if (p->shown) {
        double secs = (double)(cli_now_ns() - p->start_ns) / 1e9;
        char d[32], r[32], e[32];
        cli_fmt_bytes(p->done, d, sizeof d);
        if (p->done >= p->total)
            fprintf(stderr, "%s: done, %s in %s (%s/s)\n", p->label, d,
                    fmt_secs(secs, e, sizeof e),
                    cli_fmt_bytes(secs > 0 ? (uint64_t)((double)p->done / secs) : 0, r,
                                  sizeof r));
        else
            fprintf(stderr, "%s: stopped at %d%% (%s of %s)\n", p->label,
                    (int)((double)p->done * 100.0 / (double)p->total), d,
                    cli_fmt_bytes(p->total, r, sizeof r));
    }
    fflush(stderr);
    p->shown = 0;
}

/* ------------------------------------------------------------------------
 * The store of a command.
 */

const char *cli_root(const struct cli *cli)
{
    return cli->root ? cli->root : engram_default_root();
}

/* Opens namespace `ns` of the Redis Cluster of --redis, with the password
 * and ACL user of ENGRAM_REDIS_PASSWORD and ENGRAM_REDIS_USER; on failure
 * reports it and returns nonzero with the exit status in *status. */
int cli_open_redis(const struct cli *cli, const char *ns, uint32_t flags, engram_store **st,
                   int *status)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_redis_options ro = ENGRAM_REDIS_OPTIONS_INIT;
    const char *pw = getenv("ENGRAM_REDIS_PASSWORD"), *user = getenv("ENGRAM_REDIS_USER");
    int rc;

    o.flags = flags & ~ENGRAM_OPEN_CREATE;
    o.threads = 1;
    ro.password = pw && pw[0] ? pw : NULL;
    ro.user = user && user[0] ? user : NULL;
    if (cli->opt[OPT_TAGGED])
        ro.flags |= ENGRAM_REDIS_TAGGED;
    rc = engram_store_open_redis(cli->opt[OPT_REDIS], ns, &o, &ro, st);
    if (rc == 0)
        return 0;
    *st = NULL;
    *status = cli_lib_fail(rc, "open namespace '%s' of the Redis Cluster at '%s'", ns,
                           cli->opt[OPT_REDIS]);
    return rc;
}

/* The edit distance of a and b (insertions, deletions, substitutions
 * and swaps of neighbours, each 1), for "did you mean"; names are
 * compared by their first 255 bytes. */
size_t cli_edit_distance(const char *a, const char *b)
{
    size_t n = strnlen(a, 255), m = strnlen(b, 255);
    size_t rows[3][256], *prev2 = rows[0], *prev = rows[1], *cur = rows[2];

    for (size_t j = 0; j <= m; j++)
        prev[j] = j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t best = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                prev2[j - 2] + 1 < best)
                best = prev2[j - 2] + 1;
            cur[j] = best;
        }
        {
            size_t *t = prev2;
            prev2 = prev;
            prev = cur;
            cur = t;
        }
    }
    return prev[m];
}

/* The name of names[0..n) closest to `want` by cli_edit_distance(), if
 * it is close enough to be what was meant: at most a third of want's
 * length away, and at least 1.  NULL when none is (or want is longer than
 * any name can be).  The one rule behind every "did you mean". */
const char *cli_closest(const char *want, const char *const *names, size_t n)
{
    size_t len = strlen(want), best = SIZE_MAX, best_i = 0;

    if (len > ENGRAM_NAME_MAX)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        size_t dist = cli_edit_distance(want, names[i]);
        if (dist < best) {
            best = dist;
            best_i = i;
        }
    }
    return n > 0 && best <= (len / 3 > 1 ? len / 3 : 1) ? names[best_i] : NULL;
}

/* Compares a and b as people order names: runs of digits as numbers
 * (engram:l2:h0 before engram:l14:h0), the rest byte by byte; names that
 * differ only in leading zeros by strcmp, so the order is total. */
int cli_natural_cmp(const char *a, const char *b)
{
    const char *p = a, *q = b;

    while (*p && *q) {
        if (isdigit((unsigned char)*p) && isdigit((unsigned char)*q)) {
            const char *ps, *qs;
            size_t pl, ql;
            while (*p == '0')
                p++;
            while (*q == '0')
                q++;
            for (ps = p; isdigit((unsigned char)*p); p++)
                ;
            for (qs = q; isdigit((unsigned char)*q); q++)
                ;
            pl = (size_t)(p - ps);
            ql = (size_t)(q - qs);
            if (pl != ql)
                return pl < ql ? -1 : 1;
            {
                int c = memcmp(ps, qs, pl);
                if (c != 0)
                    return c;
            }
            continue;
        }
        if (*p != *q)
            return (unsigned char)*p < (unsigned char)*q ? -1 : 1;
        p++;
        q++;
    }
    if (*p || *q)
        return *p ? 1 : -1;
    return strcmp(a, b);
}

static int natural_qsort_cmp(const void *a, const void *b)
{
    return cli_natural_cmp(*(char *const *)a, *(char *const *)b);
}

/* Sorts names[0..n) in cli_natural_cmp()'s order. */
void cli_sort_names(char **names, size_t n)
{
    if (n > 1)
        qsort(names, n, sizeof(*names), natural_qsort_cmp);
}

/* Reports a failed library call on table `name` as "engram: WHAT 'NAME':
 * <detail>", and for a table that is not there (-ENOENT) adds the
 * closest name the store has, if one is close ("did you mean").
 * Returns the exit status. */
int cli_table_fail(engram_store *st, int rc, const char *what, const char *name)
{
    char detail[1024];
    const char *hint = NULL;
    char **names = NULL;
    size_t count = 0;

    /* The detail first: listing the store replaces the thread's message. */
    snprintf(detail, sizeof detail, "%s", cli_lib_detail(rc));
    if (rc == -ENOENT && st && engram_list(st, &names, &count) == 0)
        hint = cli_closest(name, (const char *const *)names, count);
    if (hint)
        cli_fail("%s '%s': %s; did you mean '%s'?", what, name, detail, hint);
    else
        cli_fail("%s '%s': %s", what, name, detail);
    engram_free(names);
    return EXIT_FAIL;
}

/* Reports that namespace `ns` does not exist under `root`, for `what`
 * ("open", "ns rm"): the root missing, or the namespace, with the closest
 * existing name ("did you mean") or the names there are.  Returns the
 * exit status. */
int cli_ns_missing(const char *root, const char *ns, const char *what)
{
    char **names = NULL;
    size_t count = 0;
    int rc = engram_namespace_list(root, &names, &count);
    const char *hint;

    if (rc == -ENOENT) {
        cli_fail("%s: namespace '%s': the root directory %s does not exist (set --root or "
                 "ENGRAM_ROOT; 'engram create' makes it)", what, ns, root);
        return EXIT_FAIL;
    }
    hint = rc == 0 ? cli_closest(ns, (const char *const *)names, count) : NULL;
    if (hint) {
        cli_fail("%s: namespace '%s' does not exist in %s; did you mean '%s'?", what, ns, root,
                 hint);
    } else if (rc == 0 && count > 0) {
        fprintf(stderr, "engram: %s: namespace '%s' does not exist in %s (namespaces there:", what,
                ns, root);
        for (size_t i = 0; i < count && i < 8; i++)
            fprintf(stderr, "%s '%s'", i ? "," : "", names[i]);
        fprintf(stderr, "%s)\n", count > 8 ? ", ..." : "");
    } else {
        cli_fail("%s: namespace '%s' does not exist in %s (no namespaces there yet)", what, ns,
                 root);
    }
    engram_free(names);
    return EXIT_FAIL;
}

/* Reports that the namespace of the Redis Cluster at --redis has no table,
 * for `what`, in the words of cli_ns_missing(): a cluster's namespace is
 * its tables (keys under its prefix), so one with none does not exist.
 * Returns the exit status. */
int cli_redis_ns_missing(const struct cli *cli, const char *what)
{
    return cli_fail("%s: namespace '%s' does not exist in the Redis Cluster at %s (no tables "
                    "there)", what, cli->ns, cli->opt[OPT_REDIS]);
}

/* The NUMA placement options (--numa-node, --numa-gpu, --interleave)
 * into *o: 0, or the usage exit status. */
static int numa_opts(const struct cli *cli, engram_store_options *o)
{
    const char *gpu = cli->opt[OPT_NUMA_GPU], *il = cli->opt[OPT_INTERLEAVE];
    int given = (cli->opt[OPT_NUMA_NODE] != NULL) + (gpu != NULL) + (il != NULL);
    uint64_t node = 0;
    int status;
    if (given == 0)
        return 0;
    if (given > 1)
        return cli_usage_error(cli, "--numa-node, --numa-gpu and --interleave: give one");
    if (cli->opt[OPT_REDIS])
        return cli_usage_error(cli, "NUMA placement is for tables in this machine's memory, not "
                                    "a Redis Cluster's (--redis)");
    if (cli->opt[OPT_NUMA_NODE]) {
        if ((status = cli_opt_u64(cli, OPT_NUMA_NODE, 0, ENGRAM_NUMA_MAX_NODES - 1, &node)) != 0)
            return status;
        o->numa_policy = ENGRAM_NUMA_NODE;
        o->numa_node = (int32_t)node;
    } else if (gpu) {
        o->numa_policy = ENGRAM_NUMA_NODE;
        o->numa_node = -1;
        o->numa_gpu = gpu;
    } else {
        o->numa_policy = ENGRAM_NUMA_INTERLEAVE;
        o->numa_nodes = strcmp(il, "all") == 0 ? NULL : il;
    }
    return 0;
}

/* Opens the command's store; on failure reports it and returns nonzero
 * with the exit status in *status (so callers can special-case ENOENT:
 * with quiet_enoent, a missing namespace is left to the caller, *status
 * 0). */
int cli_open_store(const struct cli *cli, uint32_t flags, int threads, engram_store **st,
                   int quiet_enoent, int *status)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    int rc;

    o.flags = flags;
    o.threads = threads;
    *st = NULL;
    if ((*status = numa_opts(cli, &o)) != 0)
        return -EINVAL;
    if (cli->opt[OPT_REDIS])
        return cli_open_redis(cli, cli->ns, flags, st, status);
    rc = engram_store_open(cli->root, cli->ns, &o, st);
    if (rc == 0)
        return 0;
    *st = NULL;
    if (rc == -ENOENT && quiet_enoent) {
        *status = 0;
        return rc;
    }
    if (rc == -ENOENT && !(flags & ENGRAM_OPEN_CREATE)) {
        *status = cli_ns_missing(cli_root(cli), cli->ns, cli->cmd ? cli->cmd->name : "open");
        return rc;
    }
    *status = cli_lib_fail(rc, "open namespace '%s' under '%s'", cli->ns, cli_root(cli));
    return rc;
}

/* Opens the store of a command that writes tables (create, import),
 * creating the namespace when it is missing; *made says whether this
 * call made it, for cli_close_written().  0, or nonzero with the exit
 * status in *status after reporting. */
int cli_open_for_write(const struct cli *cli, engram_store **st, int *made, int *status)
{
    *made = 0;
    if (!cli->opt[OPT_REDIS]) {
        /* A probe without ENGRAM_OPEN_CREATE tells whether the namespace
         * was there before this command. */
        if (cli_open_store(cli, 0, 1, st, 1, status) == 0) {
            engram_store_close(*st);
            *st = NULL;
        } else if (*status != 0) {
            return -1;
        } else {
            *made = 1;
        }
    }
    return cli_open_store(cli, ENGRAM_OPEN_CREATE, 1, st, 0, status);
}

/* Closes the store of cli_open_for_write().  When the command failed
 * (status != 0) and made the namespace, removes it again if it is still
 * empty, so that a refused create or import leaves nothing behind; a
 * namespace that holds a table, or that another process uses by now, is
 * left (engram_namespace_remove() without flags refuses both). */
void cli_close_written(const struct cli *cli, engram_store *st, int made, int status)
{
    engram_store_close(st);
    if (made && status != 0)
        (void)engram_namespace_remove(cli->root, cli->ns, 0);
}
