/*
 * fuzz_safetensors.c - fuzz target for the safetensors header parser
 * (src/safetensors_parse.c).
 *
 * engram__st_parse() reads bytes that whoever wrote a checkpoint controls,
 * so it must reject every malformed header cleanly, with a message that
 * names the file, and never accept one that breaks what the row cache
 * relies on.  One input drives two parses:
 *  1. the whole input as a file of its own length;
 *  2. the first 8 bytes as the file size (little-endian) and the rest as
 *     the file's first bytes, so small seeds can describe large tensors.
 * Every accepted header must satisfy the invariants below; any violation
 * aborts.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fuzz.h"
#include "safetensors.h"

#define WHAT "fuzz-input/a-name-no-header-can-produce/0123456789"

static void fail(const char *why)
{
    fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", why);
    abort();
}

static void check_accepted(const engram__st_header *h, size_t len, uint64_t file_size)
{
    uint64_t at = 0;
    if (h->header_len < 2 || h->header_len > ENGRAM__ST_HEADER_MAX)
        fail("header length out of bounds");
    if (h->data_start != 8 + h->header_len || h->data_start > file_size ||
        h->data_size != file_size - h->data_start || h->data_start > len)
        fail("data region inconsistent with the file");
    for (size_t i = 0; i < h->n; i++) {
        const engram__st_tensor *t = &h->t[i];
        uint64_t count = 1, bytes;
        if (t->begin != at || t->end < t->begin || t->end > h->data_size)
            fail("tensors do not tile the data region");
        at = t->end;
        if (!t->name || !t->name[0])
            fail("empty tensor name");
        if (t->ndim > ENGRAM_TENSOR_MAX_DIMS)
            fail("too many dims");
        if (t->elem_size != 1 && t->elem_size != 2 && t->elem_size != 4 && t->elem_size != 8)
            fail("bad element size");
        for (uint32_t d = 0; d < t->ndim; d++)
            if (engram__mul_u64(count, t->shape[d], &count))
                fail("element count overflow accepted");
        if (engram__mul_u64(count, t->elem_size, &bytes) || bytes != t->end - t->begin)
            fail("size does not match shape x dtype");
        if (engram__st_find(h, t->name) == NULL)
            fail("find() misses a tensor");
        for (size_t j = 0; j < i; j++)
            if (strcmp(h->t[j].name, t->name) == 0)
                fail("duplicate names accepted");
    }
    if (at != h->data_size)
        fail("tensors do not cover the data region");
}

static void parse_one(const uint8_t *buf, size_t len, uint64_t file_size)
{
    engram__st_header h;
    int rc;
    engram__err(0, "%s", "");
    rc = engram__st_parse(buf, len, file_size, WHAT, &h);
    if (rc == 0) {
        check_accepted(&h, len, file_size);
        engram__st_free(&h);
        return;
    }
    if (rc != ENGRAM_ECORRUPT && rc != -ENOMEM)
        fail("parse returned a code other than ECORRUPT/ENOMEM");
    if (strstr(engram_errmsg(), WHAT) == NULL) {
        fprintf(stderr, "message: %s\n", engram_errmsg());
        fail("error message does not name the file");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t file_size = 0;
    parse_one(data, size, size);
    if (size < 8)
        return 0;
    for (int i = 7; i >= 0; i--)
        file_size = (file_size << 8) | data[i];
    parse_one(data + 8, size - 8, file_size);
    return 0;
}
