/*
 * make_corpus.c - writes the seed corpus of the header fuzz target.
 *
 * Usage: make_corpus OUTDIR [FILE...]
 * Writes every seed into OUTDIR, each named by the XXH3-128 of its bytes
 * (so re-running adds nothing twice), then copies each FILE in under the
 * same naming (use it to add minimised libFuzzer findings).
 *
 * A seed is what fuzz_header.c reads: an 8-byte little-endian file size,
 * then the first bytes of a table file.  Valid headers are built with the
 * library's own engram__header_encode(), so they are right by
 * construction; the broken ones poke single fields of an encoded header
 * and, unless the checksum itself is the point, reseal it, so that each
 * reaches the check it is meant for.  Every seed is parsed before it is
 * written and must give the expected result, so a change of the layout
 * fails here instead of leaving a corpus of dead seeds.
 *
 * Not built by CMake (it runs rarely, by hand):
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc fuzz/make_corpus.c \
 *      build/libengram.a -lxxhash -lpthread -o build/make_corpus
 *   build/make_corpus fuzz/corpus/header
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "corpus_store.h"
#include "common.h"
#include "format.h"

/* Field offsets that the mutations poke directly; they mirror the layout
 * comment of src/format.c.  The self-check of every seed catches drift. */
#define OFF_MAGIC 0
#define OFF_VERSION 8
#define OFF_HSIZE 12
#define OFF_NAME 72
#define NAME_FIELD 136
#define OFF_ROW_START (OFF_NAME + NAME_FIELD)
#define OFF_RESERVED_V2 (OFF_ROW_START + 16) /* reserved when a row range is set */
#define OFF_RESERVED OFF_ROW_START
#define OFF_ORIGIN OFF_RESERVED_V2 /* the origin fields (version 3) */
#define OFF_HSUM (ENGRAM__HEADER_SIZE - 8)

#define MIB ((uint64_t)1 << 20)
#define SEED_MAX (8 + 4096)


static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A valid header for `rows` x `row_bytes` at `pitch`, data at `offset`. */
static engram__header base(uint64_t rows, uint32_t row_bytes, uint32_t pitch, uint64_t offset,
                           const char *name)
{
    engram__header h;
    memset(&h, 0, sizeof h);
    h.version = 1;
    h.checksum_algo = ENGRAM__CHECKSUM_XXH3_64;
    h.num_rows = rows;
    h.row_bytes = row_bytes;
    h.row_pitch = pitch;
    h.data_offset = offset;
    h.data_size = rows * pitch;
    h.data_checksum = 0x0123456789abcdefull ^ rows;
    h.created_ns = 1764400000000000000ull;
    snprintf(h.name, sizeof h.name, "%s", name);
    return h;
}

/* Version 2 with a row range: the rows are [row_start, row_start +
 * num_rows) of total_rows. */
static engram__header ranged(engram__header h, uint64_t row_start, uint64_t total_rows)
{
    h.version = 2;
    h.flags = ENGRAM__FLAG_ROW_RANGE;
    h.row_start = row_start;
    h.total_rows = total_rows;
    return h;
}

/* Version 3 with an origin (and the range flags of h kept). */
static engram__header origin(engram__header h, uint32_t kind, uint64_t epoch, const char *ns,
                             const char *where)
{
    h.version = 3;
    h.flags |= ENGRAM__FLAG_ORIGIN;
    memset(&h.origin, 0, sizeof h.origin);
    h.origin.kind = kind;
    h.origin.epoch = epoch;
    snprintf(h.origin.ns, sizeof h.origin.ns, "%s", ns);
    snprintf(h.origin.where, sizeof h.origin.where, "%s", where);
    return h;
}

/* One seed under construction: file size prefix + header bytes. */
typedef struct seed {
    unsigned char b[SEED_MAX];
    size_t len; /* bytes of the file (after the prefix) */
} seed;

static void seed_from(seed *s, const engram__header *h)
{
    memset(s, 0, sizeof *s);
    put_le(s->b, h->data_offset + h->data_size, 8);
    engram__header_encode(h, s->b + 8);
    s->len = ENGRAM__HEADER_SIZE;
}

static void reseal(seed *s)
{
    unsigned char *hd = s->b + 8;
    put_le(hd + OFF_HSUM, XXH3_64bits(hd, OFF_HSUM), 8);
}

/* Checks that the seed parses as `expect` (0 or an ENGRAM_E* code) with
 * its own file size, then stores it.  `what` names it in failures. */
static void emit(const seed *s, int expect, const char *what)
{
    engram__header h;
    uint64_t file_size = 0;
    int rc;
    for (int i = 7; i >= 0; i--)
        file_size = (file_size << 8) | s->b[i];
    rc = engram__header_parse(s->b + 8, s->len, file_size, what, &h);
    if (rc != expect) {
        fprintf(stderr, "make_corpus: seed '%s' parses as %d, expected %d (%s)\n", what, rc,
                expect, rc ? engram_errmsg() : "accepted");
        exit(1);
    }
    corpus_store(s->b, 8 + s->len);
}

static void valid_seeds(void)
{
    static const struct {
        uint64_t rows;
        uint32_t row_bytes, pitch;
        uint64_t offset;
        const char *name;
    } v[] = {
        {1, 1, 1, 2 * MIB, "a"},
        {17, 264, 264, 2 * MIB, "engram:l1:h0"},
        {1000, 264, 272, 2 * MIB, "engram:l14:h23"},
        {383999993, 264, 272, 2 * MIB, "deepseek.l1_h7-order3"},
        {3, 4096, 4096, 4 * MIB, "page-rows"},
        {1, ENGRAM_ROW_BYTES_MAX, ENGRAM_ROW_BYTES_MAX, 2 * MIB, "max.row"},
        {2, 1, ENGRAM_ROW_BYTES_MAX, 2 * MIB, "max.pitch"},
        /* num_rows * pitch exactly at the 2^62-byte limit. */
        {(uint64_t)1 << 54, 200, 256, 2 * MIB, "largest"},
        {(uint64_t)1 << 62, 1, 1, 2 * MIB, "largest.rows"},
        /* The data ending at the top of the 64-bit range. */
        {1, 1, 1, UINT64_MAX - 2 * MIB + 1, "far.offset"},
    };
    seed s;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        engram__header h = base(v[i].rows, v[i].row_bytes, v[i].pitch, v[i].offset, v[i].name);
        seed_from(&s, &h);
        emit(&s, 0, v[i].name);
    }

    /* The longest name, and every character of the alphabet. */
    {
        char name[ENGRAM_NAME_MAX + 1];
        memset(name, 'n', ENGRAM_NAME_MAX);
        name[ENGRAM_NAME_MAX] = '\0';
        engram__header h = base(5, 8, 8, 2 * MIB, name);
        seed_from(&s, &h);
        emit(&s, 0, "long name");
        h = base(5, 8, 8, 2 * MIB,
                 "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-");
        seed_from(&s, &h);
        emit(&s, 0, "alphabet");
    }
    /* Row ranges (version 2): a shard in the middle, the first and the
     * last shard, the whole tensor, the largest tensor, the version-2
     * form without a range. */
    {
        engram__header g = base(1000, 264, 272, 2 * MIB, "engram:l1:h3");
        engram__header h = ranged(g, 5000, 9000);
        seed_from(&s, &h);
        emit(&s, 0, "range middle");
        h = ranged(g, 0, 4000);
        seed_from(&s, &h);
        emit(&s, 0, "range first");
        h = ranged(g, 3000, 4000);
        seed_from(&s, &h);
        emit(&s, 0, "range last");
        h = ranged(g, 0, 1000);
        seed_from(&s, &h);
        emit(&s, 0, "range whole");
        h = ranged(g, ((uint64_t)1 << 62) - 1000, (uint64_t)1 << 62);
        seed_from(&s, &h);
        emit(&s, 0, "range at 2^62");
        h = g;
        h.version = 2;
        seed_from(&s, &h);
        emit(&s, 0, "version 2 without a range");
        /* Origins (version 3): with a range and without, either kind, the
         * longest address, the version-3 form without flags. */
        h = origin(ranged(g, 5000, 9000), ENGRAM_ORIGIN_REDIS, 0x1122334455667788ull, "prod",
                   "10.0.0.1:7000,10.0.0.2:7000");
        seed_from(&s, &h);
        emit(&s, 0, "origin redis with a range");
        h = origin(g, ENGRAM_ORIGIN_MOONCAKE, 1, "mc", "");
        seed_from(&s, &h);
        emit(&s, 0, "origin mooncake without an address");
        {
            char where[ENGRAM_ORIGIN_WHERE_MAX + 1];
            memset(where, '~', ENGRAM_ORIGIN_WHERE_MAX);
            where[ENGRAM_ORIGIN_WHERE_MAX] = '\0';
            h = origin(g, ENGRAM_ORIGIN_REDIS, UINT64_MAX, "n", where);
            seed_from(&s, &h);
            emit(&s, 0, "origin with the longest address");
        }
        h = g;
        h.version = 3;
        seed_from(&s, &h);
        emit(&s, 0, "version 3 without flags");
    }
    /* A valid header followed by the rest of a 4 KiB read. */
    {
        engram__header h = base(9, 16, 16, 2 * MIB, "with.tail");
        seed_from(&s, &h);
        s.len = 4096;
        emit(&s, 0, "4 KiB read");
    }
}

static void broken_seeds(void)
{
    engram__header good = base(1000, 264, 272, 2 * MIB, "engram:l1:h3"), h;
    unsigned char *hd;
    seed s;

    /* Truncated reads and files. */
    static const size_t cut[] = {0, 1, 8, 16, 72, 256, 504, 511};
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        seed_from(&s, &good);
        s.len = cut[i];
        emit(&s, ENGRAM_ECORRUPT, "truncated read");
    }
    seed_from(&s, &good);
    put_le(s.b, 511, 8);
    emit(&s, ENGRAM_ECORRUPT, "file shorter than a header");
    seed_from(&s, &good);
    put_le(s.b, good.data_offset + good.data_size - 1, 8);
    emit(&s, ENGRAM_ECORRUPT, "data truncated by one byte");
    seed_from(&s, &good);
    put_le(s.b, good.data_offset + good.data_size + 1, 8);
    emit(&s, ENGRAM_ECORRUPT, "file one byte too long");
    seed_from(&s, &good);
    put_le(s.b, ENGRAM__HEADER_SIZE, 8);
    emit(&s, ENGRAM_ECORRUPT, "header only");

    /* Magic, version, header size. */
    seed_from(&s, &good);
    memcpy(s.b + 8 + OFF_MAGIC, "ENGRAMTA", 8);
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "bad magic");
    seed_from(&s, &good);
    memset(s.b + 8, 0, 8);
    emit(&s, ENGRAM_ECORRUPT, "zero magic");
    h = good;
    h.version = ENGRAM__FORMAT_VERSION + 1;
    seed_from(&s, &h);
    emit(&s, ENGRAM_EVERSION, "future version");
    h.version = 0;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "version 0"); /* no table was ever written as version 0 */
    h.version = UINT32_MAX;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "version max"); /* beyond any plausible version */
    seed_from(&s, &good);
    put_le(s.b + 8 + OFF_HSIZE, 1024, 4);
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "header size 1024");

    /* Header checksum. */
    seed_from(&s, &good);
    s.b[8 + OFF_HSUM] ^= 1;
    emit(&s, ENGRAM_ECORRUPT, "bad header checksum");
    seed_from(&s, &good);
    s.b[8 + 100] ^= 0x80;
    emit(&s, ENGRAM_ECORRUPT, "name bit flip under checksum");
    seed_from(&s, &good);
    memset(s.b + 8 + OFF_HSUM, 0, 8);
    emit(&s, ENGRAM_ECORRUPT, "zero header checksum");

    /* Checksum algorithm and flags. */
    h = good;
    h.checksum_algo = 2;
    seed_from(&s, &h);
    emit(&s, ENGRAM_EVERSION, "checksum algorithm 2");
    h = good;
    h.checksum_algo = 0;
    seed_from(&s, &h);
    emit(&s, ENGRAM_EVERSION, "checksum algorithm 0");
    h = good;
    h.flags = 1;
    seed_from(&s, &h);
    emit(&s, ENGRAM_EVERSION, "flag in version 1");
    h = ranged(good, 0, 1000);
    h.flags |= 2;
    seed_from(&s, &h);
    emit(&s, ENGRAM_EVERSION, "unknown flag in version 2");
    h = ranged(good, 0, 1000);
    h.flags = 0x80000000u;
    seed_from(&s, &h);
    emit(&s, ENGRAM_EVERSION, "high flag in version 2");

    /* Row ranges. */
    h = ranged(good, 1, 1000);
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "range one row beyond total");
    h = ranged(good, 0, 999);
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "total below num_rows");
    h = ranged(good, 0, 0);
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "total 0");
    h = ranged(good, UINT64_MAX - 10, UINT64_MAX);
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "range end wraps");
    h = ranged(good, 0, ((uint64_t)1 << 62) + 1);
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "total above 2^62");
    h = good;
    h.version = 2;
    seed_from(&s, &h);
    s.b[8 + OFF_ROW_START] = 7;
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "range bytes without the flag");
    h = good;
    seed_from(&s, &h);
    s.b[8 + OFF_ROW_START + 8] = 1;
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "range bytes in version 1");
    h = ranged(good, 0, 1000);
    seed_from(&s, &h);
    s.b[8 + OFF_RESERVED_V2] = 1;
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "reserved byte after the range");

    /* Origins. */
    h = origin(good, ENGRAM_ORIGIN_REDIS, 5, "ns", "h:1");
    h.version = 2;
    seed_from(&s, &h);
    emit(&s, ENGRAM_EVERSION, "origin in version 2");
    h = origin(good, 3, 5, "ns", "h:1");
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "unknown origin kind");
    h = origin(good, ENGRAM_ORIGIN_REDIS, 0, "ns", "h:1");
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "origin epoch 0");
    h = origin(good, ENGRAM_ORIGIN_REDIS, 5, ".ns", "h:1");
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "origin namespace not a name");
    h = origin(good, ENGRAM_ORIGIN_REDIS, 5, "ns", "h:1 h:2");
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "origin address with a space");
    h = origin(good, ENGRAM_ORIGIN_REDIS, 5, "ns", "h:1");
    seed_from(&s, &h);
    s.b[8 + OFF_ORIGIN + 4] = 1;
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "origin padding");
    h = origin(good, ENGRAM_ORIGIN_REDIS, 5, "ns", "h:1");
    seed_from(&s, &h);
    s.b[8 + OFF_ORIGIN + 16 + 5] = 'x';
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "origin namespace padding");
    h = good;
    h.version = 3;
    seed_from(&s, &h);
    s.b[8 + OFF_ORIGIN + 8] = 1;
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "origin bytes without the flag");

    /* Spec fields. */
    h = good;
    h.num_rows = 0;
    h.data_size = 0;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "no rows");
    h = good;
    h.num_rows = (uint64_t)1 << 63;
    h.data_size = h.num_rows * h.row_pitch; /* wraps to 0 */
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "huge num_rows (product wraps)");
    h = good;
    h.num_rows = UINT64_MAX;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "num_rows max");
    h = good;
    h.num_rows = ((uint64_t)1 << 62) / 272 + 1;
    h.data_size = h.num_rows * 272;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "just above 2^62 bytes");
    h = good;
    h.row_pitch = 263;
    h.data_size = h.num_rows * h.row_pitch;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "pitch < row_bytes");
    h = good;
    h.row_pitch = 0;
    h.data_size = 0;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "pitch 0");
    h = good;
    h.row_bytes = 0;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "row_bytes 0");
    h = good;
    h.row_bytes = ENGRAM_ROW_BYTES_MAX + 1;
    h.row_pitch = ENGRAM_ROW_BYTES_MAX + 1;
    h.data_size = h.num_rows * h.row_pitch;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "row_bytes above max");
    h = good;
    h.row_pitch = UINT32_MAX;
    h.data_size = h.num_rows * h.row_pitch;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "pitch max");
    h = good;
    h.data_size += 272;
    seed_from(&s, &h);
    emit(&s, ENGRAM_ECORRUPT, "data_size one row too many");

    /* Data offset. */
    static const uint64_t offs[] = {0, 512, 4096, 2 * MIB + 4096, 2 * MIB - 1, 3 * MIB};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        h = good;
        h.data_offset = offs[i];
        seed_from(&s, &h);
        emit(&s, ENGRAM_ECORRUPT, "unaligned data offset");
    }
    h = good;
    h.num_rows = 10000; /* data_size 2720000 > 2 MiB, so the end wraps */
    h.data_size = h.num_rows * h.row_pitch;
    h.data_offset = UINT64_MAX - 2 * MIB + 1; /* aligned */
    seed_from(&s, &h);
    put_le(s.b, h.data_offset + h.data_size, 8);
    emit(&s, ENGRAM_ECORRUPT, "data end wraps");

    /* Names. */
    seed_from(&s, &good);
    hd = s.b + 8;
    memset(hd + OFF_NAME, 'x', NAME_FIELD);
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "name without NUL");
    seed_from(&s, &good);
    memset(hd + OFF_NAME, 'x', ENGRAM_NAME_MAX + 1);
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "name of 129 bytes");
    seed_from(&s, &good);
    memset(hd + OFF_NAME, 0, NAME_FIELD);
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "empty name");
    seed_from(&s, &good);
    hd[OFF_NAME + 20] = 'z';
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "bytes after the name's NUL");
    static const char *bad_names[] = {".hidden", "a/b", "..", "sp ace", "tab\t", "\xff\xfe",
                                      "%s%n%x"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        seed_from(&s, &good);
        memset(hd + OFF_NAME, 0, NAME_FIELD);
        memcpy(hd + OFF_NAME, bad_names[i], strlen(bad_names[i]));
        reseal(&s);
        emit(&s, ENGRAM_ECORRUPT, "invalid name");
    }

    /* Reserved bytes. */
    seed_from(&s, &good);
    hd[OFF_RESERVED] = 1;
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "first reserved byte set");
    seed_from(&s, &good);
    hd[OFF_HSUM - 1] = 0x80;
    reseal(&s);
    emit(&s, ENGRAM_ECORRUPT, "last reserved byte set");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUTDIR [FILE...]\n", argv[0]);
        return 2;
    }
    corpus_open(argv[1]);
    valid_seeds();
    broken_seeds();
    for (int i = 2; i < argc; i++)
        corpus_import(argv[i]);
    corpus_report();
    return 0;
}
