/*
 * corpus_store.h - what the seed-corpus writers (make_corpus*.c) share:
 * storing a seed in the corpus directory under the XXH3-128 of its bytes
 * (so re-running adds nothing twice), and copying extra inputs in the same
 * way.  A header of static functions: each writer is one translation unit
 * built by hand.  The writer sets corpus_prog and corpus_dir first.
 */
#ifndef ENGRAM_CORPUS_STORE_H
#define ENGRAM_CORPUS_STORE_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

static const char *corpus_prog = "make_corpus"; /* for messages */
static const char *corpus_dir;                   /* the corpus directory */
static unsigned corpus_written, corpus_skipped;

/* Creates the corpus directory if missing; exits on failure. */
static void corpus_open(const char *dir)
{
    corpus_dir = dir;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: cannot create %s: %s\n", corpus_prog, dir, strerror(errno));
        exit(1);
    }
}

/* Stores `len` bytes under their content name; exits on a write error. */
static void corpus_store(const unsigned char *buf, size_t len)
{
    XXH128_hash_t hash = XXH3_128bits(buf, len);
    char path[4096];
    int fd;

    snprintf(path, sizeof path, "%s/%016llx%016llx", corpus_dir,
             (unsigned long long)hash.high64, (unsigned long long)hash.low64);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0 && errno == EEXIST) {
        corpus_skipped++;
        return;
    }
    if (fd < 0 || write(fd, buf, len) != (ssize_t)len || close(fd) != 0) {
        fprintf(stderr, "%s: cannot write %s: %s\n", corpus_prog, path, strerror(errno));
        exit(1);
    }
    corpus_written++;
}

/* Copies an extra input (at most 1 MiB, e.g. a minimised libFuzzer
 * finding) in under its content name; exits if it cannot be read. */
static void corpus_import(const char *path)
{
    unsigned char *buf;
    struct stat st;
    FILE *f = fopen(path, "rb");
    if (!f || fstat(fileno(f), &st) != 0 || st.st_size > (1 << 20)) {
        fprintf(stderr, "%s: cannot use %s\n", corpus_prog, path);
        exit(1);
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        fprintf(stderr, "%s: cannot read %s\n", corpus_prog, path);
        exit(1);
    }
    fclose(f);
    corpus_store(buf, (size_t)st.st_size);
    free(buf);
}

/* The closing line of a writer. */
static void corpus_report(void)
{
    printf("%s: %u written, %u already present\n", corpus_prog, corpus_written, corpus_skipped);
}

#endif
