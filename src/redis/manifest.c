/*
 * manifest.c - the manifest of a Redis table: its parser and its encoder
 * (see manifest.h).
 *
 * The parser walks the bytes once with a cursor, field by field in the
 * fixed order; every number is checked for its form and bounds before it
 * is used in any arithmetic, and the one allocation (the chunk sums) is
 * sized from a chunk count already checked against the rows.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "manifest.h"

typedef struct cursor {
    const char *p, *end;
    const char *what;
    const char *kind; /* "manifest" or "pending record" */
} cursor;

__attribute__((format(printf, 2, 3))) static int bad(const cursor *c, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return engram__err(ENGRAM_ECORRUPT, "%s of %s is corrupt: %s", c->kind, c->what, tmp);
}

/* Takes "<key> " and returns the value up to the end of its line in
 * [*v, *v + *n), moving past the newline. */
static int field(cursor *c, const char *key, const char **v, size_t *n)
{
    size_t kl = strlen(key);
    const char *nl;
    *v = NULL; /* set on every path: bad() returns nonzero, which the */
    *n = 0;    /* compiler cannot see at -O3 */
    if ((size_t)(c->end - c->p) < kl + 1 || memcmp(c->p, key, kl) != 0 || c->p[kl] != ' ')
        return bad(c, "expected field '%s'", key);
    c->p += kl + 1;
    if (!(nl = memchr(c->p, '\n', (size_t)(c->end - c->p))))
        return bad(c, "field '%s' has no end of line", key);
    *v = c->p;
    *n = (size_t)(nl - c->p);
    c->p = nl + 1;
    return 0;
}

/* A decimal number of at most 20 digits, without sign or leading zero,
 * that fits uint64_t. */
static int number(cursor *c, const char *key, uint64_t *out)
{
    const char *v;
    size_t n;
    uint64_t x = 0;
    int err;
    if ((err = field(c, key, &v, &n)) != 0)
        return err;
    if (n == 0 || n > 20 || (n > 1 && v[0] == '0'))
        return bad(c, "field '%s' is not a decimal number", key);
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9' || engram__mul_u64(x, 10, &x) ||
            engram__add_u64(x, (uint64_t)(v[i] - '0'), &x))
            return bad(c, "field '%s' is not a decimal number below 2^64", key);
    }
    *out = x;
    return 0;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* Exactly 16 lower-case hex digits. */
static int hex64(const char *v, uint64_t *out)
{
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        int d = hexval(v[i]);
        if (d < 0)
            return -1;
        x = x << 4 | (uint64_t)d;
    }
    *out = x;
    return 0;
}

static int hexfield(cursor *c, const char *key, uint64_t *out)
{
    const char *v;
    size_t n;
    int err;
    if ((err = field(c, key, &v, &n)) != 0)
        return err;
    if (n != 16 || hex64(v, out) != 0)
        return bad(c, "field '%s' is not 16 lower-case hex digits", key);
    return 0;
}

/* The table name, a valid name, into name[ENGRAM_NAME_MAX + 1]. */
static int name_field(cursor *c, char *name)
{
    const char *v;
    size_t n;
    int err;
    if ((err = field(c, "name", &v, &n)) != 0)
        return err;
    if (n == 0 || n > ENGRAM_NAME_MAX)
        return bad(c, "%s", "the table name has a bad length");
    memcpy(name, v, n);
    name[n] = '\0';
    if (!engram__name_valid(name) || strlen(name) != n)
        return bad(c, "%s", "the table name is not a valid name");
    return 0;
}

static int layout_field(cursor *c, int *tagged)
{
    const char *v;
    size_t n;
    int err;
    if ((err = field(c, "layout", &v, &n)) != 0)
        return err;
    if (n == 6 && memcmp(v, "spread", 6) == 0)
        *tagged = 0;
    else if (n == 6 && memcmp(v, "tagged", 6) == 0)
        *tagged = 1;
    else
        return bad(c, "%s", "layout is neither 'spread' nor 'tagged'");
    return 0;
}

static int epoch_field(cursor *c, uint64_t *epoch)
{
    int err;
    if ((err = hexfield(c, "epoch", epoch)) != 0)
        return err;
    return *epoch == 0 ? bad(c, "%s", "epoch is 0") : 0;
}

int engram__rmanifest_parse(const char *buf, size_t len, const char *name, const char *what,
                            engram__rmanifest *m)
{
    cursor c = {buf, buf + len, what, "manifest"};
    const char *v;
    size_t n;
    uint64_t x, bytes;
    int err;

    memset(m, 0, sizeof *m);
    if (!buf || len > ENGRAM__RM_MAX_BYTES)
        return bad(&c, "%s", len > ENGRAM__RM_MAX_BYTES ? "longer than any manifest" : "empty");
    if ((size_t)(c.end - c.p) < sizeof ENGRAM__RM_MAGIC ||
        memcmp(c.p, ENGRAM__RM_MAGIC "\n", sizeof ENGRAM__RM_MAGIC) != 0)
        return bad(&c, "%s", "not an engram Redis manifest of version 1");
    c.p += sizeof ENGRAM__RM_MAGIC;
    if ((err = name_field(&c, m->name)) != 0)
        return err;
    if (name && strcmp(name, m->name) != 0)
        return bad(&c, "it describes table '%s'", m->name);
    if ((err = number(&c, "rows", &m->num_rows)) != 0)
        return err;
    if (m->num_rows == 0)
        return bad(&c, "%s", "rows is 0");
    if ((err = number(&c, "row_bytes", &x)) != 0)
        return err;
    if (x == 0 || x > ENGRAM_ROW_BYTES_MAX)
        return bad(&c, "%s", "row_bytes is 0 or above 16 MiB");
    m->row_bytes = (uint32_t)x;
    if (engram_spec_check(&(engram_table_spec){m->num_rows, m->row_bytes, 0}) != 0)
        return bad(&c, "%s", "rows x row_bytes exceeds the largest table");
    if ((err = number(&c, "chunk_rows", &m->chunk_rows)) != 0)
        return err;
    if (m->chunk_rows == 0 || engram__mul_u64(m->chunk_rows, m->row_bytes, &bytes) ||
        bytes > ENGRAM__RM_CHUNK_MAX)
        return bad(&c, "%s", "chunk_rows is 0 or makes chunks above 512 MiB");
    if ((err = number(&c, "chunks", &m->nchunks)) != 0)
        return err;
    if (m->nchunks != engram__rm_nchunks(m->num_rows, m->chunk_rows) ||
        m->nchunks > ENGRAM__RM_CHUNKS_MAX)
        return bad(&c, "%s", "chunks does not match rows and chunk_rows, or is above 2^22");
    if ((err = layout_field(&c, &m->tagged)) != 0 || (err = epoch_field(&c, &m->epoch)) != 0)
        return err;
    if ((err = number(&c, "created_ns", &m->created_ns)) != 0 ||
        (err = hexfield(&c, "checksum", &m->checksum)) != 0 ||
        (err = field(&c, "chunk_xxh3", &v, &n)) != 0)
        return err;
    if (n != m->nchunks * 16)
        return bad(&c, "%s", "chunk_xxh3 does not hold 16 hex digits per chunk");
    if (c.p != c.end)
        return bad(&c, "%s", "bytes after the last field");
    if (!(m->chunk_sums = malloc(m->nchunks * sizeof *m->chunk_sums)))
        return engram__err(-ENOMEM, "out of memory for the manifest of %s", what);
    for (uint64_t i = 0; i < m->nchunks; i++) {
        if (hex64(v + 16 * i, &m->chunk_sums[i]) != 0) {
            engram__rmanifest_free(m);
            return bad(&c, "%s", "chunk_xxh3 holds a character that is not a lower-case hex digit");
        }
    }
    return 0;
}

int engram__rmanifest_encode(const engram__rmanifest *m, char **out, size_t *len)
{
    char head[512], *buf, *p;
    int hn = snprintf(head, sizeof head,
                      ENGRAM__RM_MAGIC "\nname %s\nrows %" PRIu64 "\nrow_bytes %u\nchunk_rows %" PRIu64
                      "\nchunks %" PRIu64 "\nlayout %s\nepoch %016" PRIx64 "\ncreated_ns %" PRIu64
                      "\nchecksum %016" PRIx64 "\nchunk_xxh3 ",
                      m->name, m->num_rows, m->row_bytes, m->chunk_rows, m->nchunks,
                      m->tagged ? "tagged" : "spread", m->epoch, m->created_ns, m->checksum);
    size_t total = (size_t)hn + (size_t)m->nchunks * 16 + 1;
    if (!(buf = malloc(total + 1)))
        return engram__err(-ENOMEM, "out of memory for the manifest of '%s'", m->name);
    memcpy(buf, head, (size_t)hn);
    p = buf + hn;
    for (uint64_t i = 0; i < m->nchunks; i++, p += 16) {
        char h[17];
        snprintf(h, sizeof h, "%016" PRIx64, m->chunk_sums[i]);
        memcpy(p, h, 16);
    }
    *p++ = '\n';
    *p = '\0';
    *out = buf;
    *len = total;
    return 0;
}

int engram__rpending_parse(const char *buf, size_t len, const char *what, engram__rpending *p)
{
    cursor c = {buf, buf + len, what, "pending record"};
    const char *v;
    size_t n;
    uint64_t x;
    int err;

    memset(p, 0, sizeof *p);
    if (!buf || len > 1024)
        return bad(&c, "%s", buf ? "longer than any pending record" : "empty");
    if ((size_t)(c.end - c.p) < sizeof ENGRAM__RP_MAGIC ||
        memcmp(c.p, ENGRAM__RP_MAGIC "\n", sizeof ENGRAM__RP_MAGIC) != 0)
        return bad(&c, "%s", "not an engram pending record of version 1");
    c.p += sizeof ENGRAM__RP_MAGIC;
    if ((err = field(&c, "state", &v, &n)) != 0)
        return err;
    if (n == 4 && memcmp(v, "open", 4) == 0)
        p->closed = 0;
    else if (n == 6 && memcmp(v, "closed", 6) == 0)
        p->closed = 1;
    else
        return bad(&c, "%s", "state is neither 'open' nor 'closed'");
    if ((err = name_field(&c, p->name)) != 0 || (err = epoch_field(&c, &p->epoch)) != 0 ||
        (err = number(&c, "chunks", &p->nchunks)) != 0)
        return err;
    if (p->nchunks == 0 || p->nchunks > ENGRAM__RM_CHUNKS_MAX)
        return bad(&c, "%s", "chunks is 0 or above 2^22");
    if ((err = layout_field(&c, &p->tagged)) != 0 || (err = number(&c, "ttl_ms", &x)) != 0)
        return err;
    if (x == 0 || x > UINT32_MAX)
        return bad(&c, "%s", "ttl_ms is 0 or above 2^32 - 1");
    p->ttl_ms = (uint32_t)x;
    if ((err = number(&c, "stamp", &p->stamp_ms)) != 0)
        return err;
    if (c.p != c.end)
        return bad(&c, "%s", "bytes after the last field");
    return 0;
}

size_t engram__rpending_body(const engram__rpending *p, char *buf, size_t cap)
{
    int n = snprintf(buf, cap,
                     ENGRAM__RP_MAGIC "\nstate %s\nname %s\nepoch %016" PRIx64 "\nchunks %" PRIu64
                     "\nlayout %s\nttl_ms %u\n",
                     p->closed ? "closed" : "open", p->name, p->epoch, p->nchunks,
                     p->tagged ? "tagged" : "spread", p->ttl_ms);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

void engram__rmanifest_free(engram__rmanifest *m)
{
    free(m->chunk_sums);
    m->chunk_sums = NULL;
}
