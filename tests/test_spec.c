/*
 * test_spec.c - specs, names, error codes, messages and versions.
 *
 * These are the library's pure functions: they need no store, so every
 * boundary of the documented ranges is probed here exactly (one below, at,
 * one above), along with the error-reporting contract (fixed texts from
 * ENGRAM_ERRNO_MAP, thread-local detail messages that start empty).
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#include "testutil.h"

/* Asserts that a spec is rejected with ENGRAM_ESPEC and that the detail
 * message mentions `word` (the offending field). */
static void expect_bad_spec(uint64_t num_rows, uint32_t row_bytes, uint32_t row_pitch,
                            const char *word)
{
    engram_table_spec s = {num_rows, row_bytes, row_pitch};
    int rc = engram_spec_check(&s);
    if (rc != ENGRAM_ESPEC) {
        fprintf(stderr, "FAIL [%s]: spec {%llu, %u, %u} gave %d (%s), expected ENGRAM_ESPEC\n",
                tu_current_case, (unsigned long long)num_rows, row_bytes, row_pitch, rc,
                engram_strerror(rc));
        tu_fail_exit();
    }
    ASSERT(engram_errmsg()[0] != '\0');
    if (word != NULL)
        ASSERT_CONTAINS(engram_errmsg(), word);
}

static void expect_good_spec(uint64_t num_rows, uint32_t row_bytes, uint32_t row_pitch)
{
    engram_table_spec s = {num_rows, row_bytes, row_pitch};
    int rc = engram_spec_check(&s);
    if (rc != 0) {
        fprintf(stderr, "FAIL [%s]: spec {%llu, %u, %u} rejected: %d (%s): %s\n",
                tu_current_case, (unsigned long long)num_rows, row_bytes, row_pitch, rc,
                engram_strerror(rc), engram_errmsg());
        tu_fail_exit();
    }
}

static void test_spec_ranges(void)
{
    /* The smallest and the typical specs are accepted. */
    expect_good_spec(1, 1, 0);
    expect_good_spec(1, 1, 1);
    expect_good_spec(17, 264, 0);
    expect_good_spec(17, 264, 264);
    expect_good_spec(17, 264, 272);
    expect_good_spec(384000000ull, 264, 272); /* a DeepSeek-sized layer: ~97 GiB */
    expect_good_spec(1, ENGRAM_ROW_BYTES_MAX, 0);
    expect_good_spec(1, ENGRAM_ROW_BYTES_MAX, ENGRAM_ROW_BYTES_MAX);
    expect_good_spec(3, 1, ENGRAM_ROW_BYTES_MAX);

    /* Each field's lower and upper bound. */
    expect_bad_spec(0, 8, 0, "num_rows");
    expect_bad_spec(1, 0, 0, "row_bytes");
    expect_bad_spec(1, 0, 8, "row_bytes");
    expect_bad_spec(1, ENGRAM_ROW_BYTES_MAX + 1u, 0, "row_bytes");
    expect_bad_spec(1, 8, 7, "row_pitch");
    expect_bad_spec(1, 264, 263, "row_pitch");
    expect_bad_spec(1, 8, ENGRAM_ROW_BYTES_MAX + 1u, "row_pitch");
    expect_bad_spec(1, ENGRAM_ROW_BYTES_MAX, ENGRAM_ROW_BYTES_MAX + 1u, "row_pitch");

    /* num_rows * row_pitch must fit: products that wrap a 64-bit size, and
     * ones that exceed what a size_t/ptrdiff_t can address, are refused. */
    expect_bad_spec(UINT64_MAX, 8, 0, NULL);
    expect_bad_spec(UINT64_MAX / 8 + 1, 8, 0, NULL);
    expect_bad_spec(UINT64_MAX / 264 + 1, 264, 0, NULL);
    expect_bad_spec((UINT64_MAX / 272) + 1, 264, 272, NULL); /* pitch, not row_bytes, counts */
    expect_bad_spec((uint64_t)1 << 63, 2, 0, NULL);
    expect_bad_spec(((uint64_t)SIZE_MAX / ENGRAM_ROW_BYTES_MAX) + 1, ENGRAM_ROW_BYTES_MAX, 0,
                    NULL);

    /* A NULL spec is an error, not a crash. */
    int rc;
    ASSERT_FAILS(engram_spec_check(NULL), rc);
}

static void expect_bad_name(const char *name)
{
    int rc = engram_name_check(name);
    if (rc != ENGRAM_ESPEC) {
        fprintf(stderr, "FAIL [%s]: name \"%s\" gave %d (%s), expected ENGRAM_ESPEC\n",
                tu_current_case, name, rc, engram_strerror(rc));
        tu_fail_exit();
    }
    ASSERT(engram_errmsg()[0] != '\0');
}

static void expect_good_name(const char *name)
{
    int rc = engram_name_check(name);
    if (rc != 0) {
        fprintf(stderr, "FAIL [%s]: name \"%s\" rejected: %d (%s): %s\n", tu_current_case, name,
                rc, engram_strerror(rc), engram_errmsg());
        tu_fail_exit();
    }
}

static void test_names(void)
{
    char buf[ENGRAM_NAME_MAX + 8];

    expect_good_name("a");
    expect_good_name("engram:l1:h0");
    expect_good_name("engram:l14:h23");
    expect_good_name("ABCxyz0123456789._:-");
    expect_good_name("a.");
    expect_good_name("a..b");
    expect_good_name("_x");
    expect_good_name("0");
    expect_good_name("-a"); /* only a leading '.' is excluded by the documented rule */

    /* Exactly ENGRAM_NAME_MAX bytes is fine; one more is not. */
    memset(buf, 'n', ENGRAM_NAME_MAX);
    buf[ENGRAM_NAME_MAX] = '\0';
    expect_good_name(buf);
    buf[ENGRAM_NAME_MAX] = 'n';
    buf[ENGRAM_NAME_MAX + 1] = '\0';
    expect_bad_name(buf);

    expect_bad_name("");
    expect_bad_name(".");
    expect_bad_name("..");
    expect_bad_name(".hidden");
    expect_bad_name("a/b");
    expect_bad_name("/abs");
    expect_bad_name("../up");
    expect_bad_name("a b");
    expect_bad_name("tab\there");
    expect_bad_name("new\nline");
    expect_bad_name("star*");
    expect_bad_name("q?");
    expect_bad_name("back\\slash");
    expect_bad_name("caf\xc3\xa9"); /* UTF-8: bytes >= 0x80 are outside the set */
    expect_bad_name("\x7f");

    /* The message of a name failure says it is about a name. */
    ASSERT_ERR(engram_name_check("a/b"), ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "name");

    int rc;
    ASSERT_FAILS(engram_name_check(NULL), rc);
}

/* Each ENGRAM_E* code maps to exactly the text its X-macro line gives. */
static void test_strerror(void)
{
    struct {
        int code;
        const char *text;
    } codes[] = {
#define TU_ERR_ROW(name, value, text) {ENGRAM_##name, text},
        ENGRAM_ERRNO_MAP(TU_ERR_ROW)
#undef TU_ERR_ROW
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        ASSERT(codes[i].code <= -4000 && codes[i].code >= -4099);
        ASSERT_STR_EQ(engram_strerror(codes[i].code), codes[i].text);
        for (size_t j = 0; j < i; j++)
            ASSERT_NE(codes[i].code, codes[j].code);
    }
    ASSERT_EQ(ENGRAM_EBADID, -4001);
    ASSERT_EQ(ENGRAM_ESTATE, -4011);

    /* Negated errno values get a nonempty text that is not one of ours. */
    int errnos[] = {ENOENT, EEXIST, EINVAL, ENOMEM, ENOSPC, EIO, ECANCELED, ELOOP, EACCES};
    for (size_t i = 0; i < sizeof errnos / sizeof errnos[0]; i++) {
        const char *s = engram_strerror(-errnos[i]);
        ASSERT(s != NULL);
        ASSERT(s[0] != '\0');
        for (size_t j = 0; j < n; j++)
            ASSERT(strcmp(s, codes[j].text) != 0);
    }
    /* -ENOENT and -EEXIST must read differently. */
    ASSERT(strcmp(engram_strerror(-ENOENT), engram_strerror(-EEXIST)) != 0);

    /* Unknown codes in our range, positive values and 0 still give a
     * string, never NULL. */
    int odd[] = {-4000, -4012, -4099, -4100, 0, 1, 12345, -1000000, INT32_MIN};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        const char *s = engram_strerror(odd[i]);
        ASSERT(s != NULL);
    }
}

static void test_version(void)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", ENGRAM_VERSION_MAJOR, ENGRAM_VERSION_MINOR,
             ENGRAM_VERSION_PATCH);
    ASSERT_STR_EQ(engram_version_string(), want);
    ASSERT_EQ(engram_version_number(), ENGRAM_VERSION_NUMBER);
    ASSERT_EQ(ENGRAM_VERSION_NUMBER,
              ENGRAM_VERSION_MAJOR * 10000 + ENGRAM_VERSION_MINOR * 100 + ENGRAM_VERSION_PATCH);
}

static void test_default_root(void)
{
    struct stat sb;
    const char *want = (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode)) ? "/dev/shm/engram"
                                                                          : "/tmp/engram";
    /* Without ENGRAM_ROOT (test_namespace covers it). */
    ASSERT(unsetenv("ENGRAM_ROOT") == 0);
    ASSERT_STR_EQ(engram_default_root(), want);
}

/* Runs in a fresh thread: no failure has happened there yet, so the
 * message must be empty; then a failure there must not leak into the
 * main thread's message. */
static void *errmsg_thread(void *arg)
{
    int *ok = (int *)arg;
    const char *m = engram_errmsg();
    ok[0] = (m != NULL && m[0] == '\0');
    engram_table_spec s = {0, 8, 0};
    ok[1] = (engram_spec_check(&s) == ENGRAM_ESPEC) && engram_errmsg()[0] != '\0' &&
            strstr(engram_errmsg(), "num_rows") != NULL;
    return NULL;
}

static void test_errmsg_thread_local(void)
{
    /* Fail on the main thread with a recognisable message first. */
    engram_table_spec s = {1, 0, 0};
    ASSERT_ERR(engram_spec_check(&s), ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "row_bytes");

    int ok[2] = {0, 0};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, errmsg_thread, ok), 0);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    ASSERT_EQ(ok[0], 1); /* a fresh thread starts with "" */
    ASSERT_EQ(ok[1], 1); /* and gets its own message */

    /* The other thread's failure did not overwrite this thread's message. */
    ASSERT_CONTAINS(engram_errmsg(), "row_bytes");

    /* Successful calls do not clear the message ("valid until the next
     * failing call"). */
    engram_table_spec good = {1, 8, 0};
    ASSERT_OK(engram_spec_check(&good));
    ASSERT_OK(engram_name_check("fine"));
    ASSERT_CONTAINS(engram_errmsg(), "row_bytes");
}

/* Store-level name checks: a namespace name is checked like a table name,
 * so no path can escape the root. */
static void test_namespace_names(void)
{
    const char *bad[] = {"", ".", "..", "../x", "a/b", ".hidden", "a b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        o.flags = ENGRAM_OPEN_CREATE;
        engram_store *st = NULL;
        int rc = engram_store_open(tu_scratch_root(), bad[i], &o, &st);
        if (rc != ENGRAM_ESPEC) {
            fprintf(stderr, "FAIL [%s]: namespace \"%s\" gave %d (%s), expected ESPEC\n",
                    tu_current_case, bad[i], rc, engram_strerror(rc));
            tu_fail_exit();
        }
        ASSERT(st == NULL);
    }
    /* Nothing was created in the root by the refused opens. */
    char p[512];
    struct stat sb;
    tu_path(p, sizeof p, "x");
    ASSERT(lstat(p, &sb) != 0);

    /* Table names given to store functions are checked too. */
    engram_store *st = tu_open("names", 0, 1);
    engram_table_spec spec = {4, 8, 0};
    unsigned char rows[32] = {0};
    engram_table_id id = 0;
    engram_writer *w = NULL;
    ASSERT_ERR(engram_populate(st, "../escape", &spec, rows, 0), ENGRAM_ESPEC);
    ASSERT_ERR(engram_populate(st, ".x", &spec, rows, 0), ENGRAM_ESPEC);
    ASSERT_ERR(engram_writer_begin(st, "a/b", &spec, &w), ENGRAM_ESPEC);
    ASSERT(w == NULL);
    ASSERT_ERR(engram_bind(st, "", &spec, rows), ENGRAM_ESPEC);
    ASSERT_ERR(engram_table_open(st, "..", &id), ENGRAM_ESPEC);
    tu_path(p, sizeof p, "escape");
    ASSERT(lstat(p, &sb) != 0);

    /* Bad specs are refused by the store functions with ESPEC too. */
    engram_table_spec bad_spec = {0, 8, 0};
    ASSERT_ERR(engram_populate(st, "zero", &bad_spec, rows, 0), ENGRAM_ESPEC);
    ASSERT_ERR(engram_bind(st, "zero", &bad_spec, rows), ENGRAM_ESPEC);
    ASSERT_ERR(engram_writer_begin(st, "zero", &bad_spec, &w), ENGRAM_ESPEC);
    ASSERT(w == NULL);
    engram_store_close(st);
}

/* The documented NULL-accepting release functions. */
static void test_null_release(void)
{
    engram_free(NULL);
    engram_store_close(NULL);
    engram_writer_abort(NULL);
}

int main(void)
{
    tu_watchdog(120);
    /* No engram call has failed on this thread yet. */
    ASSERT(engram_errmsg() != NULL);
    ASSERT_STR_EQ(engram_errmsg(), "");
    RUN_TEST(test_errmsg_thread_local);
    RUN_TEST(test_spec_ranges);
    RUN_TEST(test_names);
    RUN_TEST(test_strerror);
    RUN_TEST(test_version);
    RUN_TEST(test_default_root);
    RUN_TEST(test_namespace_names);
    RUN_TEST(test_null_release);
    printf("test_spec: all passed\n");
    return 0;
}
