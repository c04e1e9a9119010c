/*
 * make_corpus_safetensors.c - writes the seed corpus of the safetensors
 * fuzz target.
 *
 * Usage: make_corpus_safetensors OUTDIR [FILE...]
 * Writes every seed into OUTDIR, each named by the XXH3-128 of its bytes
 * (so re-running adds nothing twice), then copies each FILE in under the
 * same naming (use it to add minimised libFuzzer findings).
 *
 * A seed is what fuzz_safetensors.c reads: an 8-byte little-endian file
 * size, then the first bytes of a safetensors file (8-byte header length,
 * JSON, data).  Every seed is parsed before it is written and must give
 * the expected result (accepted, or rejected with a message containing a
 * given phrase), so a change of the parser fails here instead of leaving
 * a corpus of dead seeds.
 *
 * Not built by CMake (it runs rarely, by hand):
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc fuzz/make_corpus_safetensors.c \
 *      build/release/libengram.a -lxxhash -luring -lcjson -lm -lpthread \
 *      -o build/make_corpus_safetensors
 *   build/make_corpus_safetensors fuzz/corpus/safetensors
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "corpus_store.h"
#include "safetensors.h"


/* A seed: header `json` (padded with `pad` spaces), `data` bytes of data
 * (at most 64 are stored; file_size says the rest exist), header length
 * field `hl` (0: the real one).  `expect` is NULL for "accepted", else a
 * phrase of the expected message. */
static void seed(const char *json, unsigned pad, uint64_t data, uint64_t hl, const char *expect)
{
    size_t jl = strlen(json), stored = data < 64 ? (size_t)data : 64;
    size_t len = 8 + 8 + jl + pad + stored;
    unsigned char *b = calloc(1, len);
    uint64_t file_size = 8 + jl + pad + data;
    engram__st_header h;
    int rc;
    if (!hl)
        hl = jl + pad;
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(file_size >> (8 * i));
        b[8 + i] = (unsigned char)(hl >> (8 * i));
    }
    memcpy(b + 16, json, jl);
    memset(b + 16 + jl, ' ', pad);
    for (size_t i = 0; i < stored; i++)
        b[16 + jl + pad + i] = (unsigned char)(i * 7);
    rc = engram__st_parse(b + 8, len - 8, file_size, "seed", &h);
    if ((expect == NULL) != (rc == 0) || (expect && !strstr(engram_errmsg(), expect))) {
        fprintf(stderr, "make_corpus_safetensors: seed %s: rc %d (%s), expected %s\n", json, rc,
                engram_errmsg(), expect ? expect : "success");
        exit(1);
    }
    engram__st_free(&h);
    corpus_store(b, len);
    free(b);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUTDIR [FILE...]\n", argv[0]);
        return 2;
    }
    corpus_prog = "make_corpus_safetensors";
    corpus_open(argv[1]);
    /* Accepted. */
    seed("{}", 0, 0, 0, NULL);
    seed("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,256],\"data_offsets\":[0,1024]},"
         "\"s\":{\"dtype\":\"F8_E8M0\",\"shape\":[4,8],\"data_offsets\":[1024,1056]}}",
         6, 1056, 0, NULL);
    seed("{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
         "\"data_offsets\":[0,12]}}",
         0, 12, 0, NULL);
    seed("{\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]},"
         "\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"z\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[8,8]}}",
         0, 8, 0, NULL);
    seed("{\"big\":{\"dtype\":\"F8_E4M3\",\"shape\":[384000000,256],\"data_offsets\":[0,"
         "98304000000]}}",
         0, 98304000000ull, 0, NULL);
    /* Rejected, one check each. */
    seed("{}", 0, 0, 1, "outside [2,");
    seed("{}", 0, 0, (uint64_t)200 << 20, "outside [2,");
    seed("{}", 0, 0, 1000, "past the end");
    seed("{\"w\":", 0, 0, 0, "not valid JSON");
    seed("{} x", 0, 0, 0, "after the header");
    seed("[1,2]", 0, 0, 0, "not a JSON object");
    seed("{\"w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1, 0,
         "unknown dtype");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 0, 1, 0,
         "not an integer");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 0, 1, 0,
         "not an integer");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 0, 1,
         0, "dimensions");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],"
         "\"data_offsets\":[0,1]}}",
         0, 1, 0, "overflows");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,0]}}", 0, 2, 0,
         "begin <= end");
    seed("{\"w\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,2]}}", 0, 2, 0,
         "need 2 x 2");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 0, 1, 0,
         "past the 1 data bytes");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"v\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
         0, 3, 0, "overlap");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 0, 3, 0,
         "belong to no tensor");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 0, 5, 0,
         "tensors cover 2");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
         0, 2, 0, "defined twice");
    seed("{\"__metadata__\":{\"a\":1}}", 0, 0, 0, "not a string");
    seed("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 0, 1, 0, "needs a string");
    seed("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1, 0,
         "empty name");
    for (int i = 2; i < argc; i++)
        corpus_import(argv[i]);
    corpus_report();
    return 0;
}
