/*
 * cli_util.c - the helpers every part of the `engram` CLI uses: error
 * reports, strict number parsing, sizes and durations for humans, JSON
 * strings, the id generator, the deterministic row fills, the progress bar
 * and opening the command's store.  See cli.h for the map of the CLI.
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
 * Progress bar, drawn on stderr only when it is a terminal.
 */
void cli_progress_init(struct progress *p, const char *label)
{
    p->label = label;
    p->enabled = isatty(STDERR_FILENO);
    p->last = -1;
}

int cli_progress_cb(void *ud, uint64_t done, uint64_t total)
{
    static const char bar[] = "##############################";
    static const char dots[] = "..............................";
    struct progress *p = ud;
    const int width = 30;
    int permille, filled;

    if (cli_interrupted)
        return 1; /* cancels the library operation (-ECANCELED) */
    if (!p->enabled)
        return 0;
    /* Double arithmetic: done * 1000 could overflow for huge tables. */
    permille = total ? (int)((double)done * 1000.0 / (double)total) : 1000;
    if (permille > 1000)
        permille = 1000;
    if (permille == p->last)
        return 0;
    p->last = permille;
    filled = permille * width / 1000;
    fprintf(stderr, "\r%s [%.*s%.*s] %3d%%", p->label, filled, bar, width - filled, dots,
            permille / 10);
    return 0;
}

void cli_progress_end(struct progress *p)
{
    if (p->enabled && p->last >= 0)
        fputs("\r\033[K", stderr);
    p->last = -1;
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

/* Opens the command's store; on failure reports it and returns nonzero
 * with the exit status in *status (so callers can special-case ENOENT). */
int cli_open_store(const struct cli *cli, uint32_t flags, int threads, engram_store **st,
                   int quiet_enoent, int *status)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    int rc;

    o.flags = flags;
    o.threads = threads;
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
    *status = cli_lib_fail(rc, "open namespace '%s' under '%s'", cli->ns, cli_root(cli));
    return rc;
}
