/*
 * replay.c - runs a fuzz target over stored inputs, without libFuzzer.
 *
 * Usage: fuzz_<target>_replay PATH...
 * Each PATH is a file (run once) or a directory whose regular files are
 * each run once (one level, in name order so a failure reproduces in the
 * same order; names starting with '.' are skipped).  Prints
 * "replayed N inputs" and exits 0; exits 1 if a path is missing, a
 * directory holds no input or a file cannot be read, because a corpus that
 * silently vanished would otherwise turn the CI test into one that cannot
 * fail.  A broken invariant aborts inside the target.
 *
 * Each input is copied into a heap block of exactly its size, so that a
 * sanitizer build catches a parser reading one byte past the end, as
 * libFuzzer's own driver would.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Inputs are small by construction; anything larger is a mistake in the
 * corpus, not something to load into memory. */
#define REPLAY_MAX_INPUT ((size_t)64 << 20)

/* Reads `path` and runs the target on its bytes.  Returns 0 or -1. */
static int run_file(const char *path)
{
    FILE *f = NULL;
    unsigned char *buf = NULL;
    struct stat st;
    size_t size;
    int rc = -1;

    f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
        goto out;
    }
    if (fstat(fileno(f), &st) != 0) {
        fprintf(stderr, "replay: cannot stat %s: %s\n", path, strerror(errno));
        goto out;
    }
    if (st.st_size < 0 || (unsigned long long)st.st_size > REPLAY_MAX_INPUT) {
        fprintf(stderr, "replay: %s is larger than %zu bytes\n", path, REPLAY_MAX_INPUT);
        goto out;
    }
    size = (size_t)st.st_size;
    /* malloc(0) may return NULL; the target is always given a real pointer. */
    buf = malloc(size ? size : 1);
    if (!buf) {
        fprintf(stderr, "replay: out of memory for %s\n", path);
        goto out;
    }
    if (size && fread(buf, 1, size, f) != size) {
        fprintf(stderr, "replay: short read on %s\n", path);
        goto out;
    }
    LLVMFuzzerTestOneInput(buf, size);
    rc = 0;
out:
    free(buf);
    if (f)
        fclose(f);
    return rc;
}

/* Only regular files that are not dot-files are inputs. */
static int is_input(const struct dirent *e)
{
    return e->d_name[0] != '.';
}

/* Runs every input of directory `dir`.  Returns the number run, or -1. */
static long run_dir(const char *dir)
{
    struct dirent **names = NULL;
    long count = 0;
    int n, i;

    n = scandir(dir, &names, is_input, alphasort);
    if (n < 0) {
        fprintf(stderr, "replay: cannot read directory %s: %s\n", dir, strerror(errno));
        return -1;
    }
    for (i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        int len = snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (len < 0 || (size_t)len >= sizeof path) {
            fprintf(stderr, "replay: path too long in %s\n", dir);
            count = -1;
            break;
        }
        /* Subdirectories and other non-files are not inputs (one level). */
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (run_file(path) != 0) {
            count = -1;
            break;
        }
        count++;
    }
    for (i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (count == 0) {
        fprintf(stderr, "replay: directory %s holds no input\n", dir);
        return -1;
    }
    return count;
}

int main(int argc, char **argv)
{
    unsigned long long total = 0;
    int i;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIRECTORY...\n", argv[0]);
        return 2;
    }
    for (i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (S_ISDIR(st.st_mode)) {
            long n = run_dir(argv[i]);
            if (n < 0)
                return 1;
            total += (unsigned long long)n;
        } else {
            if (run_file(argv[i]) != 0)
                return 1;
            total++;
        }
    }
    printf("replayed %llu inputs\n", total);
    return 0;
}
