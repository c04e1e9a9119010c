/*
 * fuzz_npy.c - fuzz target for the CLI's .npy header parser (tools/npy.c).
 *
 * `engram import` hands npy_parse() the first bytes of any file a user
 * names, so it must reject every malformed preamble or header with a
 * message, and never accept one that breaks what the import relies on:
 * an array of a plain dtype in C order whose rows * row_bytes bytes
 * (row_bytes = the item size times the product of the dimensions after
 * the first) start right after the header and end exactly at the end of
 * the file.
 *
 * One input drives two parses:
 *  1. the whole input as the file, with its own length as the file size
 *     (small complete files, including their data);
 *  2. the first 8 input bytes as the file size (little-endian) and the rest
 *     as the file's first bytes, which lets seeds describe arrays of any
 *     size, and files longer or shorter than the bytes given.
 * Every parse runs twice, with a full-size and with a tiny message buffer.
 * Any broken invariant aborts.
 *
 * The npy format asks writers to pad the header so that the data starts
 * at a multiple of 64 bytes (16 before numpy 1.14), but readers, numpy's
 * included, do not require it and neither does npy_parse(); so the
 * alignment is asserted only for the canonical header this target writes
 * itself (the round trip below), not for accepted inputs.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "npy.h"

/* Messages are one line; this is what the CLI gives them. */
#define ERR_CAP 512
/* Bytes past errlen that the parser must leave alone. */
#define ERR_CANARY 16
#define FILL 0xa5

static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

static void fail(const char *why, const struct npy_info *info)
{
    fprintf(stderr, "fuzz_npy: invariant broken: %s\n", why);
    if (info)
        fprintf(stderr, "  rows %" PRIu64 " cols %" PRIu64 " data_offset %" PRIu64 "\n",
                info->rows, info->cols, info->data_offset);
    abort();
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Whether the n bytes at p contain the NUL-terminated string s. */
static int contains(const unsigned char *p, size_t n, const char *s)
{
    size_t k = strlen(s);
    for (size_t i = 0; k <= n && i <= n - k; i++)
        if (memcmp(p + i, s, k) == 0)
            return 1;
    return 0;
}

/* Whether the n bytes at p contain the decimal digits of v. */
static int contains_u64(const unsigned char *p, size_t n, uint64_t v)
{
    char dec[32];
    snprintf(dec, sizeof dec, "%" PRIu64, v);
    return contains(p, n, dec);
}

/* Writes numpy's own v1.0 header for the array *info describes (its
 * descr and dims) into out (which holds at least 512 bytes); returns its
 * length, preamble included, padded with spaces and a newline to a
 * multiple of 64. */
static size_t canonical_header(const struct npy_info *info, unsigned char *out)
{
    char dict[400];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     info->descr);
    size_t total, hlen;

    for (uint32_t d = 0; d < info->ndim && n > 0 && (size_t)n < sizeof dict; d++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%" PRIu64 "%s", info->dims[d],
                      info->ndim == 1 ? "," : d + 1 < info->ndim ? ", " : "");
    if (n > 0 && (size_t)n < sizeof dict)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    if (n < 0 || (size_t)n >= sizeof dict)
        fail("canonical dict does not fit", NULL);
    total = (10 + (size_t)n + 1 + 63) / 64 * 64;
    hlen = total - 10;
    memcpy(out, magic, sizeof magic);
    out[6] = 1;
    out[7] = 0;
    out[8] = (unsigned char)(hlen & 0xff);
    out[9] = (unsigned char)(hlen >> 8);
    memcpy(out + 10, dict, (size_t)n);
    memset(out + 10 + n, ' ', hlen - (size_t)n - 1);
    out[total - 1] = '\n';
    return total;
}

/* Checks what an accepted header promises to `engram import`, recomputing
 * each fact from the input bytes rather than trusting the parser. */
static void check_accepted(const uint8_t *buf, size_t len, uint64_t file_size,
                           const struct npy_info *info)
{
    size_t avail = (uint64_t)len < file_size ? len : (size_t)file_size;
    uint64_t prefix, hlen, data, end;
    unsigned major;

    if (avail < 10 || memcmp(buf, magic, sizeof magic) != 0)
        fail("accepted bytes without the .npy magic", info);
    major = buf[6];
    if ((major != 1 && major != 2 && major != 3) || buf[7] != 0)
        fail("accepted an unknown format version", info);
    if (major == 1) {
        prefix = 10;
        hlen = (uint64_t)buf[8] | (uint64_t)buf[9] << 8;
    } else {
        if (avail < 12)
            fail("accepted a truncated v2/v3 preamble", info);
        prefix = 12;
        hlen = (uint64_t)buf[8] | (uint64_t)buf[9] << 8 | (uint64_t)buf[10] << 16 |
               (uint64_t)buf[11] << 24;
    }
    if (hlen > NPY_HEADER_MAX)
        fail("accepted a header longer than NPY_HEADER_MAX", info);
    if (info->data_offset != prefix + hlen)
        fail("data_offset is not the end of the header", info);
    if (info->data_offset > avail)
        fail("accepted a header that was not all in the buffer", info);
    if (info->rows == 0 || info->cols == 0)
        fail("accepted an empty shape", info);
    if (info->ndim < 1 || info->ndim > NPY_MAX_DIMS || info->rows != info->dims[0])
        fail("rows is not the first dimension", info);
    if (info->itemsize == 0 || memchr(info->descr, '\0', sizeof info->descr) == NULL)
        fail("accepted an empty or unterminated dtype", info);
    {
        uint64_t cols = info->itemsize;
        for (uint32_t d = 1; d < info->ndim; d++)
            if (info->dims[d] == 0 || __builtin_mul_overflow(cols, info->dims[d], &cols))
                fail("a dimension is 0, or the row size overflows", info);
        if (cols != info->cols)
            fail("cols is not itemsize x the dimensions after the first", info);
        for (uint32_t d = info->ndim; d < NPY_MAX_DIMS; d++)
            if (info->dims[d] != 0)
                fail("an unused dimension is not 0", info);
    }
    if (__builtin_mul_overflow(info->rows, info->cols, &data))
        fail("rows * cols overflows", info);
    if (__builtin_add_overflow(info->data_offset, data, &end) || end != file_size)
        fail("the data does not end exactly at the end of the file", info);

    /* An accepted header is a dict of the three keys, with its dtype, C
     * order and the dimensions in decimal, and nothing but printable ASCII
     * and whitespace. */
    {
        const unsigned char *h = buf + prefix;
        size_t n = (size_t)hlen;
        for (size_t i = 0; i < n; i++)
            if ((h[i] < 0x20 || h[i] > 0x7e) && h[i] != '\t' && h[i] != '\n' && h[i] != '\r')
                fail("accepted a header with a control or non-ASCII byte", info);
        if (!contains(h, n, "descr") || !contains(h, n, "fortran_order") ||
            !contains(h, n, "shape"))
            fail("accepted a header without one of the three keys", info);
        if (!contains(h, n, info->descr))
            fail("the dtype is not spelled in the header", info);
        if (info->descr[strspn(info->descr, "<>|=")] == 'O')
            fail("accepted an object dtype", info);
        if (!contains(h, n, "False"))
            fail("accepted a header without fortran_order False", info);
        for (uint32_t d = 0; d < info->ndim; d++)
            if (!contains_u64(h, n, info->dims[d]))
                fail("the shape is not spelled in the header", info);
    }

    /* The parser needs the header and nothing after it: the same file
     * with only its header bytes given parses the same.  The exact-size
     * copy keeps a read past the header visible to ASan. */
    {
        size_t hend = (size_t)info->data_offset;
        unsigned char *copy = malloc(hend);
        struct npy_info again;
        char err[ERR_CAP];
        if (!copy)
            return;
        memcpy(copy, buf, hend);
        if (npy_parse(copy, hend, file_size, &again, err, sizeof err) != 0 ||
            memcmp(&again, info, sizeof again) != 0) {
            free(copy);
            fail("the header alone does not parse the same", info);
        }
        free(copy);
    }

    /* What numpy would write for this array parses to the same shape,
     * with the data 64-byte aligned. */
    {
        unsigned char canon[512];
        size_t clen = canonical_header(info, canon);
        struct npy_info again;
        char err[ERR_CAP];
        uint64_t csize;
        if (__builtin_add_overflow((uint64_t)clen, data, &csize))
            return;
        if (npy_parse(canon, clen, csize, &again, err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_npy: message: %s\n", err);
            fail("the canonical header of an accepted shape does not parse", info);
        }
        if (again.rows != info->rows || again.cols != info->cols ||
            again.itemsize != info->itemsize || again.ndim != info->ndim ||
            memcmp(again.dims, info->dims, sizeof again.dims) != 0 ||
            strcmp(again.descr, info->descr) != 0 || again.data_offset != clen ||
            again.data_offset % 64 != 0)
            fail("the canonical header parses differently", &again);
    }
}

/* Checks a failure's message: NUL-terminated within errlen, nothing
 * written past it, and (when there is room) a nonempty line of printable
 * ASCII, since the CLI prints it to a terminal. */
static void check_message(const char *err, size_t errlen)
{
    const char *nul = memchr(err, '\0', errlen);
    if (!nul)
        fail("the message is not NUL-terminated within errlen", NULL);
    for (size_t i = errlen; i < errlen + ERR_CANARY; i++)
        if ((unsigned char)err[i] != FILL)
            fail("the parser wrote past errlen", NULL);
    if (errlen > 1 && nul == err)
        fail("a failure left an empty message", NULL);
    for (const char *p = err; p < nul; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) {
            fprintf(stderr, "fuzz_npy: message: %s\n", err);
            fail("the message holds a control or non-ASCII byte", NULL);
        }
}

/* Parses one buffer and checks the result, whichever it is. */
static void parse_one(const uint8_t *buf, size_t len, uint64_t file_size)
{
    char err[ERR_CAP + ERR_CANARY], small[8 + ERR_CANARY];
    struct npy_info info, untouched, info2;
    int rc, rc2;

    memset(&untouched, FILL, sizeof untouched);
    info = untouched;
    memset(err, FILL, sizeof err);
    rc = npy_parse(buf, len, file_size, &info, err, ERR_CAP);
    if (rc == 0) {
        check_accepted(buf, len, file_size, &info);
    } else {
        if (rc != -1)
            fail("npy_parse returned neither 0 nor -1", NULL);
        if (memcmp(&info, &untouched, sizeof info) != 0)
            fail("a failure changed *info", &info);
        check_message(err, ERR_CAP);
    }

    /* Same input, a message buffer too small for any message: same
     * verdict, and the message is the full one cut short. */
    info2 = untouched;
    memset(small, FILL, sizeof small);
    rc2 = npy_parse(buf, len, file_size, &info2, small, sizeof small - ERR_CANARY);
    if (rc2 != rc)
        fail("the verdict depends on the size of the message buffer", NULL);
    if (rc == 0) {
        if (memcmp(&info, &info2, sizeof info) != 0)
            fail("the result depends on the size of the message buffer", &info2);
        return;
    }
    check_message(small, sizeof small - ERR_CANARY);
    {
        size_t full = strlen(err), cut = sizeof small - ERR_CANARY - 1;
        if (strlen(small) != (full < cut ? full : cut) || memcmp(small, err, strlen(small)) != 0)
            fail("the short message is not the full one cut short", NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_one(data, size, size);
    if (size >= 8)
        parse_one(data + 8, size - 8, get_le64(data));
    return 0;
}
