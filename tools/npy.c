/*
 * npy.c - strict parser of .npy file headers for `engram import`.
 *
 * The preamble and header of an .npy file are bytes from outside, so this
 * parser trusts no length before checking it against both the file size
 * and the bytes it was given, and accepts only what numpy itself writes
 * for an array of a plain dtype in C order (see npy.h).  It reads nothing but the
 * buffer it is handed: the CLI does the file I/O, and fuzz/fuzz_npy.c
 * drives this very code with arbitrary bytes.
 */
#include "npy.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Multiplies with an overflow check; the one place the data size is
 * formed. */
static int mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

__attribute__((format(printf, 3, 4))) static int set_error(char *err, size_t errlen,
                                                          const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

struct lexer {
    const char *p, *end;
    char *err;
    size_t errlen;
};

__attribute__((format(printf, 2, 3))) static int lex_error(struct lexer *lx, const char *fmt,
                                                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lx->err, lx->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static void lex_ws(struct lexer *lx)
{
    while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r'))
        lx->p++;
}

static int lex_peek(struct lexer *lx)
{
    lex_ws(lx);
    return lx->p < lx->end ? (unsigned char)*lx->p : -1;
}

static int lex_expect(struct lexer *lx, char c, const char *where)
{
    if (lex_peek(lx) != (unsigned char)c)
        return lex_error(lx, "malformed .npy header: expected '%c' %s", c, where);
    lx->p++;
    return 0;
}

/* A Python string literal of printable characters without escapes (the
 * only kind numpy writes for keys and dtype strings), at most cap-1 long.
 * Refusing every other byte also keeps the strings that error messages
 * quote free of terminal control bytes. */
static int lex_string(struct lexer *lx, char *out, size_t cap)
{
    char q;
    size_t n = 0;
    int c = lex_peek(lx);

    if (c != '\'' && c != '"')
        return lex_error(lx, "malformed .npy header: expected a quoted string");
    q = (char)c;
    lx->p++;
    while (lx->p < lx->end && *lx->p != q) {
        unsigned char ch = (unsigned char)*lx->p;
        if (ch < 0x20 || ch >= 0x7f || ch == '\\')
            return lex_error(lx, "malformed .npy header: unexpected byte 0x%02x in a string", ch);
        if (n + 1 >= cap)
            return lex_error(lx, "malformed .npy header: string longer than %zu bytes", cap - 1);
        out[n++] = (char)ch;
        lx->p++;
    }
    if (lx->p >= lx->end)
        return lex_error(lx, "malformed .npy header: unterminated string");
    lx->p++;
    out[n] = '\0';
    return 0;
}

static int lex_word(struct lexer *lx, const char *w)
{
    size_t n = strlen(w);
    lex_ws(lx);
    if ((size_t)(lx->end - lx->p) >= n && memcmp(lx->p, w, n) == 0) {
        lx->p += n;
        return 1;
    }
    return 0;
}

/* A shape tuple of non-negative decimal integers: "()", "(5,)", "(3, 4)". */
static int lex_shape(struct lexer *lx, uint64_t *dims, int *ndim)
{
    *ndim = 0;
    if (lex_expect(lx, '(', "to open the shape") != 0)
        return -1;
    for (;;) {
        int c = lex_peek(lx);
        uint64_t v = 0;
        if (c == ')')
            break;
        if (c < 0 || !isdigit(c))
            return lex_error(lx, "malformed .npy header: expected a dimension in the shape");
        while (lx->p < lx->end && isdigit((unsigned char)*lx->p)) {
            unsigned d = (unsigned)(*lx->p - '0');
            if (v > (UINT64_MAX - d) / 10 || v * 10 + d > (uint64_t)INT64_MAX)
                return lex_error(lx, "malformed .npy header: dimension too large");
            v = v * 10 + d;
            lx->p++;
        }
        if (*ndim == NPY_MAX_DIMS)
            return lex_error(lx, "unsupported .npy shape: more than %d dimensions", NPY_MAX_DIMS);
        dims[(*ndim)++] = v;
        c = lex_peek(lx);
        if (c == ',') {
            lx->p++;
            continue;
        }
        if (c != ')')
            return lex_error(lx, "malformed .npy header: expected ',' or ')' in the shape");
    }
    lx->p++;
    return 0;
}

/* Formats dims as Python would print the tuple. */
static void fmt_shape(const uint64_t *dims, int ndim, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "(");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, i ? ", " : "", dims[i]);
    if (o < len)
        snprintf(buf + o, len - o, ndim == 1 ? ",)" : ")");
}

/* Reads a plain numpy dtype string (see npy.h) into *itemsize: 0, or -1
 * with the reason in the lexer's message. */
static int parse_descr(struct lexer *lx, const char *d, uint64_t *itemsize)
{
    const char *p = d, *num;
    char kind;
    uint64_t n = 0;
    int bad = 0;

    if (*p == '<' || *p == '>' || *p == '|' || *p == '=')
        p++;
    kind = *p ? *p++ : '\0';
    if (kind == 'O')
        return lex_error(lx, "unsupported .npy dtype '%s': object arrays hold pointers, not "
                             "row bytes",
                         d);
    for (num = p; *p >= '0' && *p <= '9' && p - num < 10; p++)
        n = n * 10 + (uint64_t)(*p - '0');
    /* One to nine digits, without a leading zero. */
    bad = p == num || p - num > 9 || (p - num > 1 && num[0] == '0');
    if ((kind == 'm' || kind == 'M') && *p == '[') {
        /* numpy's units, with an optional multiplier: "[ns]", "[10ms]". */
        static const char *const units[] = {"Y", "M", "W", "D", "h", "m", "s",
                                            "ms", "us", "ns", "ps", "fs", "as"};
        size_t len;
        int known = 0;
        for (p++; *p >= '0' && *p <= '9'; p++)
            ;
        len = strcspn(p, "]");
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            known |= strlen(units[i]) == len && strncmp(p, units[i], len) == 0;
        bad |= !known || p[len] != ']';
        p += p[len] == ']' ? len + 1 : len;
    }
    if (bad || *p != '\0')
        kind = '\0';
    switch (kind) {
    case 'b': if (n != 1) kind = '\0'; break;
    case 'i':
    case 'u': if (n != 1 && n != 2 && n != 4 && n != 8) kind = '\0'; break;
    case 'f': if (n != 2 && n != 4 && n != 8 && n != 12 && n != 16) kind = '\0'; break;
    case 'c': if (n != 8 && n != 16 && n != 24 && n != 32) kind = '\0'; break;
    case 'S':
    case 'V': if (n == 0) kind = '\0'; break;
    case 'U': if (n == 0) kind = '\0'; n *= 4; break; /* UCS-4 */
    case 'm':
    case 'M': if (n != 8) kind = '\0'; break;
    default: kind = '\0'; break;
    }
    if (kind == '\0')
        return lex_error(lx, "unsupported .npy dtype '%s' (need a plain dtype such as '|u1', "
                             "'<f4', '<f2' or '|V2')",
                         d);
    *itemsize = n;
    return 0;
}

/* Parses the dictionary of an .npy header: exactly the keys 'descr',
 * 'fortran_order' and 'shape', each once, as numpy itself requires. */
static int npy_parse_dict(const char *h, size_t len, struct npy_info *info, char *err,
                          size_t errlen)
{
    struct lexer lx = {h, h + len, err, errlen};
    char key[32], descr[sizeof info->descr];
    int have_descr = 0, have_fortran = 0, have_shape = 0, fortran = 0, ndim = 0;
    uint64_t dims[NPY_MAX_DIMS], itemsize = 0, cols;
    char shape[256];

    if (lex_expect(&lx, '{', "at the start of the header") != 0)
        return -1;
    while (lex_peek(&lx) != '}') {
        if (lex_string(&lx, key, sizeof(key)) != 0)
            return -1;
        if (lex_expect(&lx, ':', "after a key") != 0)
            return -1;
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (lex_peek(&lx) == '[')
                return lex_error(&lx, "unsupported .npy dtype: a structured dtype (save "
                                      "a.view(np.uint8) instead)");
            if (lex_string(&lx, descr, sizeof(descr)) != 0)
                return -1;
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
            if (lex_word(&lx, "True"))
                fortran = 1;
            else if (lex_word(&lx, "False"))
                fortran = 0;
            else
                return lex_error(&lx, "malformed .npy header: fortran_order is not True or "
                                      "False");
            have_fortran = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (lex_shape(&lx, dims, &ndim) != 0)
                return -1;
            have_shape = 1;
        } else {
            return lex_error(&lx, "malformed .npy header: unexpected or repeated key '%s'", key);
        }
        if (lex_peek(&lx) == ',')
            lx.p++;
        else if (lex_peek(&lx) != '}')
            return lex_error(&lx, "malformed .npy header: expected ',' or '}' after a value");
    }
    lx.p++;
    if (lex_peek(&lx) != -1)
        return lex_error(&lx, "malformed .npy header: bytes after the closing '}'");
    if (!have_descr || !have_fortran || !have_shape)
        return lex_error(&lx, "malformed .npy header: missing key '%s'",
                         !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");

    /* The bytes are taken as stored, whatever the dtype: a row is the
     * bytes of one entry of the first dimension. */
    if (parse_descr(&lx, descr, &itemsize) != 0)
        return -1;
    if (fortran)
        return lex_error(&lx, "unsupported .npy layout: fortran_order is True (need C order; "
                              "save np.ascontiguousarray(a))");
    fmt_shape(dims, ndim, shape, sizeof(shape));
    if (ndim == 0)
        return lex_error(&lx, "unsupported .npy shape %s: a scalar has no rows", shape);
    cols = itemsize;
    for (int d = 0; d < ndim; d++) {
        if (dims[d] == 0)
            return lex_error(&lx, "unsupported .npy shape %s: the table would be empty", shape);
        if (d > 0 && !mul_ok(cols, dims[d], &cols))
            return lex_error(&lx, "unsupported .npy shape %s of '%s': rows too large", shape,
                             descr);
    }
    memset(info, 0, sizeof *info);
    info->rows = dims[0];
    info->cols = cols;
    info->itemsize = itemsize;
    info->ndim = (uint32_t)ndim;
    memcpy(info->dims, dims, (size_t)ndim * sizeof dims[0]);
    memcpy(info->descr, descr, strlen(descr) + 1);
    return 0;
}

int npy_parse(const unsigned char *buf, size_t len, uint64_t file_size, struct npy_info *info,
              char *err, size_t errlen)
{
    static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    struct npy_info out;
    unsigned major, minor;
    uint64_t hlen, prefix, data;

    /* Bytes past the end of the file do not exist, whatever the caller
     * passed. */
    if (len > file_size)
        len = (size_t)file_size;
    if (memcmp(buf, magic, len < sizeof magic ? len : sizeof magic) != 0)
        return set_error(err, errlen, "not an .npy file (bad magic bytes)");
    /* The preamble checks test file_size first and then len: a file that
     * is too short is "truncated", a buffer shorter than a file that is
     * long enough means the caller could not read it. */
    if (file_size < 10 || len < 10)
        return set_error(err, errlen, "truncated .npy preamble");
    major = buf[6];
    minor = buf[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0)
        return set_error(err, errlen,
                         "unsupported .npy format version %u.%u (need 1.0, 2.0 or 3.0)", major,
                         minor);
    if (major == 1) {
        hlen = (uint64_t)buf[8] | (uint64_t)buf[9] << 8;
        prefix = 10;
    } else {
        if (file_size < 12 || len < 12)
            return set_error(err, errlen, "truncated .npy preamble");
        hlen = (uint64_t)buf[8] | (uint64_t)buf[9] << 8 | (uint64_t)buf[10] << 16 |
               (uint64_t)buf[11] << 24;
        prefix = 12;
    }
    if (hlen > NPY_HEADER_MAX)
        return set_error(err, errlen,
                         ".npy header length %" PRIu64 " exceeds the %u bytes accepted", hlen,
                         NPY_HEADER_MAX);
    if (prefix + hlen > file_size)
        return set_error(err, errlen,
                         "truncated .npy header (%" PRIu64 " bytes announced, file is %" PRIu64
                         " bytes)",
                         hlen, file_size);
    if (prefix + hlen > len)
        return set_error(err, errlen, "cannot read the .npy header");
    if (npy_parse_dict((const char *)buf + prefix, (size_t)hlen, &out, err, errlen) != 0)
        return -1;
    out.data_offset = prefix + hlen;
    if (!mul_ok(out.rows, out.cols, &data))
        return set_error(err, errlen,
                         "unsupported .npy array: %" PRIu64 " rows of %" PRIu64 " bytes is too "
                         "large", out.rows, out.cols);
    if (data > file_size - out.data_offset)
        return set_error(err, errlen,
                         "truncated .npy data: %" PRIu64 " rows of %" PRIu64 " bytes need %" PRIu64
                         " bytes but only %" PRIu64 " follow the header",
                         out.rows, out.cols, data, file_size - out.data_offset);
    if (data != file_size - out.data_offset)
        return set_error(err, errlen, "%" PRIu64 " unexpected bytes after the .npy array data",
                         file_size - out.data_offset - data);
    *info = out;
    return 0;
}
