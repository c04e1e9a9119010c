/*
 * testutil.h - assertions, scratch directories and row patterns shared by
 * the C tests.
 *
 * Every test executable includes this header once.  Assertions print both
 * sides and file:line, and library failures print engram_strerror() and
 * engram_errmsg(), so a failing run explains itself without a debugger.
 * A failed assertion exits with status 1 (after flushing), which also works
 * inside forked children whose status the parent checks.
 *
 * Scratch roots are created per test under /dev/shm (or /tmp) and removed
 * recursively at exit by the process that created them (forked children
 * never remove their parent's scratch).  Set ENGRAM_TEST_KEEP=1 to keep
 * them for inspection.
 *
 * Row patterns: byte j of row i of a table with seed s is tu_byte(s, i, j),
 * a hash of all three, so a row copied from the wrong table, the wrong row
 * or at the wrong offset inside a row is detected.
 */
#ifndef ENGRAM_TESTUTIL_H
#define ENGRAM_TESTUTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "engram.h"

/* Sanitizer builds die through _exit() on a report, skipping atexit();
 * their death callback lets the scratch directory be removed anyway. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#include <sanitizer/common_interface_defs.h>
#define TU_HAVE_SANITIZER 1
#endif

/* ------------------------------------------------------------------------
 * Failure reporting.
 */

/* Name of the test case being run, printed with every failure. */
static const char *tu_current_case = "(setup)";

/* Set by a failure before the process exits: exit handlers keep what
 * explains it (the logs of the servers a test started). */
static int tu_failed;

static inline void tu_fail_exit(void)
{
    tu_failed = 1;
    fflush(stdout);
    fflush(stderr);
    exit(1);
}

#define TU_FAIL_HEAD(file, line) \
    fprintf(stderr, "FAIL %s:%d [%s]: ", (file), (line), tu_current_case)

#define ASSERT(cond)                                                    \
    do {                                                                \
        if (!(cond)) {                                                  \
            TU_FAIL_HEAD(__FILE__, __LINE__);                           \
            fprintf(stderr, "assertion failed: %s\n", #cond);           \
            tu_fail_exit();                                             \
        }                                                               \
    } while (0)

/* Signed comparison; both sides are widened to long long. */
#define ASSERT_CMP_(a, op, b)                                                         \
    do {                                                                              \
        long long tu_a_ = (long long)(a), tu_b_ = (long long)(b);                     \
        if (!(tu_a_ op tu_b_)) {                                                      \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "expected %s %s %s, got %lld vs %lld\n", #a, #op, #b,     \
                    tu_a_, tu_b_);                                                    \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

#define ASSERT_EQ(a, b) ASSERT_CMP_(a, ==, b)
#define ASSERT_NE(a, b) ASSERT_CMP_(a, !=, b)
#define ASSERT_LT(a, b) ASSERT_CMP_(a, <, b)
#define ASSERT_LE(a, b) ASSERT_CMP_(a, <=, b)
#define ASSERT_GT(a, b) ASSERT_CMP_(a, >, b)
#define ASSERT_GE(a, b) ASSERT_CMP_(a, >=, b)

/* Unsigned 64-bit comparison, for sizes and counters that may exceed
 * LLONG_MAX. */
#define ASSERT_EQ_U64(a, b)                                                           \
    do {                                                                              \
        unsigned long long tu_a_ = (unsigned long long)(a);                           \
        unsigned long long tu_b_ = (unsigned long long)(b);                           \
        if (tu_a_ != tu_b_) {                                                         \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "expected %s == %s, got %llu (0x%llx) vs %llu (0x%llx)\n", \
                    #a, #b, tu_a_, tu_a_, tu_b_, tu_b_);                              \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

#define ASSERT_PTR_NE(a, b)                                                           \
    do {                                                                              \
        if ((const void *)(a) == (const void *)(b)) {                                 \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "expected %s != %s, both %p\n", #a, #b, (const void *)(a)); \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                           \
    do {                                                                              \
        const char *tu_a_ = (a), *tu_b_ = (b);                                        \
        if (tu_a_ == NULL || tu_b_ == NULL || strcmp(tu_a_, tu_b_) != 0) {            \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "expected %s == %s, got \"%s\" vs \"%s\"\n", #a, #b,      \
                    tu_a_ ? tu_a_ : "(null)", tu_b_ ? tu_b_ : "(null)");              \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

/* Checks that string `hay` contains `needle`. */
#define ASSERT_CONTAINS(hay, needle)                                                  \
    do {                                                                              \
        const char *tu_h_ = (hay), *tu_n_ = (needle);                                 \
        if (tu_h_ == NULL || strstr(tu_h_, tu_n_) == NULL) {                          \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "expected %s to contain \"%s\", got \"%s\"\n", #hay,      \
                    tu_n_, tu_h_ ? tu_h_ : "(null)");                                 \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

/* Compares `n` bytes and reports the first difference with both bytes. */
#define ASSERT_MEM_EQ(a, b, n)                                                        \
    do {                                                                              \
        const unsigned char *tu_a_ = (const unsigned char *)(a);                      \
        const unsigned char *tu_b_ = (const unsigned char *)(b);                      \
        size_t tu_n_ = (size_t)(n);                                                   \
        if (memcmp(tu_a_, tu_b_, tu_n_) != 0) {                                       \
            size_t tu_i_ = 0;                                                         \
            while (tu_a_[tu_i_] == tu_b_[tu_i_])                                      \
                tu_i_++;                                                              \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr,                                                           \
                    "memory %s != %s (%zu bytes): first difference at byte %zu: "     \
                    "0x%02x vs 0x%02x\n",                                             \
                    #a, #b, tu_n_, tu_i_, tu_a_[tu_i_], tu_b_[tu_i_]);                \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

/* Runs a library call that must succeed; on failure prints the code, its
 * fixed text and the thread's detailed message. */
#define ASSERT_OK(call)                                                               \
    do {                                                                              \
        int tu_rc_ = (call);                                                          \
        if (tu_rc_ != 0) {                                                            \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "%s failed: %d (%s): %s\n", #call, tu_rc_,                \
                    engram_strerror(tu_rc_), engram_errmsg());                        \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

/* Runs a library call that must fail with exactly `code`. */
#define ASSERT_ERR(call, code)                                                        \
    do {                                                                              \
        int tu_rc_ = (call);                                                          \
        int tu_want_ = (code);                                                        \
        if (tu_rc_ != tu_want_) {                                                     \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "%s returned %d (%s), expected %s = %d (%s); errmsg: %s\n", \
                    #call, tu_rc_, tu_rc_ ? engram_strerror(tu_rc_) : "success",      \
                    #code, tu_want_, engram_strerror(tu_want_), engram_errmsg());     \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

/* Runs a library call that must fail with some negative code (used where
 * the header leaves the exact code open); yields the code. */
#define ASSERT_FAILS(call, rcvar)                                                     \
    do {                                                                              \
        (rcvar) = (call);                                                             \
        if ((rcvar) >= 0) {                                                           \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "%s returned %d, expected a negative error code\n",       \
                    #call, (rcvar));                                                  \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

/* Exit status CTest treats as "skipped". */
#define TU_SKIP_CODE 77

/* ------------------------------------------------------------------------
 * Cases and skips.
 *
 * RUN_TEST runs one case.  A case that cannot run here (it needs root, or
 * something this machine lacks) calls tu_skip_case() with the reason and
 * returns; a case that ran but had to leave a part out calls
 * tu_skip_part().  main ends with `return tu_done("test_x")`, which lists
 * every skip with its reason and returns TU_SKIP_CODE when every case
 * that ran was skipped, so that CTest reports the test as skipped rather
 * than passed.
 *
 * A case that may be skipped on its own is a CTest entry of its own
 * (CMakeLists.txt, ENGRAM_TEST_CASES_test_x): tu_cases(argc, argv) reads
 * the case names given on the command line (a case's function name
 * without "test_"): with NAME arguments only those cases run, and -NAME
 * leaves that case out, so the entry test_x.NAME runs the case alone and
 * its skip is CTest's, while the entry test_x runs the others.  A name
 * that matches no case fails the test.
 */
#define TU_MAX_NAMED 16

static struct tu_cases_state {
    const char *named[TU_MAX_NAMED]; /* names from the command line */
    int include[TU_MAX_NAMED];       /* 1: NAME (run only the named), 0: -NAME */
    int seen[TU_MAX_NAMED];
    int nnamed, any_include;
    int ran, skipped;  /* cases run, and of them skipped */
    int case_skipped;  /* the running case called tu_skip_case() */
    int parts;         /* tu_skip_part() calls */
    char log[4096];    /* one line per skip */
    size_t len;
} tu_cs;

static inline void tu_cases(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int inc = a[0] != '-';
        if (!inc)
            a++;
        if (tu_cs.nnamed == TU_MAX_NAMED || !*a) {
            fprintf(stderr, "usage: %s [CASE | -CASE]...\n", argv[0]);
            exit(2);
        }
        tu_cs.named[tu_cs.nnamed] = a;
        tu_cs.include[tu_cs.nnamed++] = inc;
        tu_cs.any_include |= inc;
    }
}

/* 1 if the case of function `fn` is to run. */
static inline int tu_case_selected(const char *fn)
{
    const char *n = strncmp(fn, "test_", 5) == 0 ? fn + 5 : fn;
    int run = !tu_cs.any_include;
    for (int i = 0; i < tu_cs.nnamed; i++) {
        if (strcmp(tu_cs.named[i], n) == 0) {
            tu_cs.seen[i] = 1;
            run = tu_cs.include[i];
        }
    }
    return run;
}

/* Prints a skip of the running case (kind "") or of a part of it, and
 * adds it to the log that tu_done() prints. */
static inline void tu_skip_note(const char *kind, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static inline void tu_skip_note(const char *kind, const char *fmt, va_list ap)
{
    char why[512];
    size_t room = sizeof tu_cs.log - tu_cs.len; /* >= 1: len stays below the size */
    int n;
    vsnprintf(why, sizeof why, fmt, ap);
    printf("   SKIPPED%s: %s\n", kind, why);
    fflush(stdout);
    n = snprintf(tu_cs.log + tu_cs.len, room, "  %s%s: %s\n", tu_current_case, kind, why);
    if (n > 0)
        tu_cs.len += (size_t)n < room ? (size_t)n : room - 1;
}

/* The running case cannot run here, for the reason given (a printf
 * format); the caller returns from the case. */
static inline void tu_skip_case(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void tu_skip_case(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tu_skip_note("", fmt, ap);
    va_end(ap);
    tu_cs.case_skipped = 1;
}

/* A part of the running case cannot run here, for the reason given; the
 * rest of the case runs. */
static inline void tu_skip_part(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void tu_skip_part(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tu_skip_note(" (part)", fmt, ap);
    va_end(ap);
    tu_cs.parts++;
}

/* Runs one test case function (if selected: tu_cases()), naming it in
 * failures and in the log. */
#define RUN_TEST(fn)                                                                  \
    do {                                                                              \
        if (tu_case_selected(#fn)) {                                                  \
            tu_current_case = #fn;                                                    \
            tu_cs.case_skipped = 0;                                                   \
            printf("-- %s\n", #fn);                                                   \
            fflush(stdout);                                                           \
            fn();                                                                     \
            tu_cs.ran++;                                                              \
            tu_cs.skipped += tu_cs.case_skipped;                                      \
            tu_cs.case_skipped = 0;                                                   \
            tu_current_case = "(between cases)";                                      \
        }                                                                             \
    } while (0)

/* The end of a test's main: its summary line, the skips with their
 * reasons, and its exit status (TU_SKIP_CODE if every case that ran was
 * skipped, 0 otherwise). */
static inline int tu_done(const char *test)
{
    for (int i = 0; i < tu_cs.nnamed; i++) {
        if (!tu_cs.seen[i]) {
            fprintf(stderr, "FAIL: %s has no case named '%s'\n", test, tu_cs.named[i]);
            tu_fail_exit();
        }
    }
    if (tu_cs.any_include && tu_cs.ran == 0) {
        fprintf(stderr, "FAIL: %s: no case ran\n", test);
        tu_fail_exit();
    }
    if (tu_cs.ran > 0 && tu_cs.skipped == tu_cs.ran) {
        printf("%s: skipped:\n%s", test, tu_cs.log);
        return TU_SKIP_CODE;
    }
    if (tu_cs.skipped || tu_cs.parts)
        printf("%s: passed, with %d of %d cases and %d parts skipped here:\n%s", test,
               tu_cs.skipped, tu_cs.ran, tu_cs.parts, tu_cs.log);
    else
        printf("%s: all passed\n", test);
    return 0;
}

/* ------------------------------------------------------------------------
 * Memory helpers: allocation failures in a test are fatal, not errors to
 * handle.
 */
static inline void *tu_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "FAIL: out of memory allocating %zu bytes\n", n);
        tu_fail_exit();
    }
    return p;
}

static inline void *tu_xcalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "FAIL: out of memory allocating %zu bytes\n", n);
        tu_fail_exit();
    }
    return p;
}

/* ------------------------------------------------------------------------
 * Scratch directories.
 */
static char tu_scratch_path[256];
static pid_t tu_scratch_owner;

/* Makes every directory under the scratch root searchable and writable by
 * its owner again, so tests may chmod directories freely (a test of
 * unsafe modes, a read-only namespace) and cleanup still works without
 * root. */
static inline int tu_rm_fix_mode(const char *path, const struct stat *sb, int type,
                                 struct FTW *ftw)
{
    (void)ftw;
    if (type == FTW_D || type == FTW_DNR)
        chmod(path, (sb->st_mode & 07777) | S_IRWXU);
    return 0;
}

static inline int tu_rm_entry(const char *path, const struct stat *sb, int type,
                              struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if (type == FTW_DP || type == FTW_D || type == FTW_DNR)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

/* Removes `path` and everything below it, never following links. */
static inline void tu_rm_rf(const char *path)
{
    nftw(path, tu_rm_fix_mode, 16, FTW_PHYS);
    nftw(path, tu_rm_entry, 16, FTW_PHYS | FTW_DEPTH);
}

static inline void tu_scratch_cleanup(void)
{
    const char *keep = getenv("ENGRAM_TEST_KEEP");
    if (tu_scratch_path[0] == '\0' || getpid() != tu_scratch_owner)
        return;
    if (keep != NULL && keep[0] != '\0' && strcmp(keep, "0") != 0) {
        fprintf(stderr, "keeping scratch directory %s\n", tu_scratch_path);
        return;
    }
    tu_rm_rf(tu_scratch_path);
}

/* Removes scratch roots "engram-test-<pid>-*" under `base` whose process
 * is gone: a test that died without running its exit handlers (a signal,
 * a UBSan abort, whose runtime ignores our death callback) leaves one. */
static inline void tu_reap_stale_scratch(const char *base)
{
    DIR *d = opendir(base);
    struct dirent *e;
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        long pid;
        char path[512];
        if (sscanf(e->d_name, "engram-test-%ld-", &pid) != 1 || pid <= 0)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        snprintf(path, sizeof path, "%s/%s", base, e->d_name);
        tu_rm_rf(path);
    }
    closedir(d);
}

/* Returns the test's scratch root (created once per process, mode 0700,
 * under /dev/shm when it exists, else /tmp), removed at exit. */
static inline const char *tu_scratch_root(void)
{
    if (tu_scratch_path[0] != '\0')
        return tu_scratch_path;
    struct stat sb;
    const char *base = (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode)) ? "/dev/shm" : "/tmp";
    tu_reap_stale_scratch(base);
    snprintf(tu_scratch_path, sizeof tu_scratch_path, "%s/engram-test-%ld-XXXXXX", base,
             (long)getpid());
    if (mkdtemp(tu_scratch_path) == NULL) {
        fprintf(stderr, "FAIL: mkdtemp(%s): %s\n", tu_scratch_path, strerror(errno));
        tu_fail_exit();
    }
    tu_scratch_owner = getpid();
    atexit(tu_scratch_cleanup);
#ifdef TU_HAVE_SANITIZER
    __sanitizer_set_death_callback(tu_scratch_cleanup);
#endif
    return tu_scratch_path;
}

/* A hung test (a deadlock, a FIFO opened without O_NONBLOCK) fails after
 * `seconds` with a message instead of blocking ctest, and still removes
 * its scratch directory.  (The cleanup is not async-signal-safe; the
 * process is about to exit and is single-purpose, which makes it fine in
 * a test.)
 *
 * `seconds` is time in which the test could run: on a busy machine its
 * threads wait for a CPU, and a test that needs a minute of CPU under a
 * sanitizer can take several of wall time.  So when the time is up, the
 * time its threads spent runnable but waiting for a CPU meanwhile (their
 * run delay, /proc/self/task/TID/schedstat) is given again, up to four
 * times `seconds` in all.  A hung test's threads are blocked, not
 * waiting for a CPU: it still fails after `seconds`. */
static unsigned tu_watchdog_base, tu_watchdog_given;
static unsigned long long tu_watchdog_delay_ns;

/* The run delays of the process's live threads, summed (ns), or 0 where
 * the kernel does not count them.  Async-signal-safe: open, read, close
 * and getdents64 only. */
static inline unsigned long long tu_run_delay_ns(void)
{
    struct tu_dirent64 {
        uint64_t d_ino;
        int64_t d_off;
        unsigned short d_reclen;
        unsigned char d_type;
        char d_name[1];
    };
    char dents[2048], path[64], stat[256];
    unsigned long long sum = 0;
    int dfd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    for (;;) {
        long n = syscall(SYS_getdents64, dfd, dents, sizeof dents);
        if (n <= 0)
            break;
        for (long off = 0; off < n;) {
            const struct tu_dirent64 *d = (const struct tu_dirent64 *)(const void *)(dents + off);
            const char *pre = "/proc/self/task/", *post = "/schedstat";
            size_t len = 0, i;
            ssize_t got;
            int fd;
            off += d->d_reclen;
            if (d->d_name[0] < '0' || d->d_name[0] > '9')
                continue;
            for (i = 0; pre[i]; i++)
                path[len++] = pre[i];
            for (i = 0; d->d_name[i] && len < 40; i++)
                path[len++] = d->d_name[i];
            for (i = 0; post[i]; i++)
                path[len++] = post[i];
            path[len] = '\0';
            if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
                continue;
            got = read(fd, stat, sizeof stat - 1);
            close(fd);
            if (got > 0) {
                /* "<on-CPU ns> <waiting ns> <slices>" */
                const char *p = stat, *end = stat + got;
                unsigned long long v = 0;
                while (p < end && *p != ' ')
                    p++;
                while (p < end && *p == ' ')
                    p++;
                while (p < end && *p >= '0' && *p <= '9')
                    v = v * 10 + (unsigned long long)(*p++ - '0');
                sum += v;
            }
        }
    }
    close(dfd);
    return sum;
}

static inline void tu_watchdog_fire(int sig)
{
    static const char msg[] = "FAIL: watchdog: the test took too long (hang?)\n";
    unsigned long long delay = tu_run_delay_ns();
    (void)sig;
    if (delay > tu_watchdog_delay_ns + 100000000ull &&
        tu_watchdog_given < 4 * tu_watchdog_base) {
        /* Held back by a busy machine: that time again (whole seconds). */
        unsigned long long more = (delay - tu_watchdog_delay_ns + 999999999ull) / 1000000000ull;
        if (more > 4 * tu_watchdog_base - tu_watchdog_given)
            more = 4 * tu_watchdog_base - tu_watchdog_given;
        tu_watchdog_delay_ns = delay;
        tu_watchdog_given += (unsigned)more;
        alarm((unsigned)more);
        return;
    }
    {
        ssize_t n = write(2, msg, sizeof msg - 1);
        (void)n;
    }
    tu_failed = 1;
    tu_scratch_cleanup();
    _exit(1);
}

static inline void tu_watchdog(unsigned seconds)
{
    tu_watchdog_base = tu_watchdog_given = seconds;
    tu_watchdog_delay_ns = tu_run_delay_ns();
    signal(SIGALRM, tu_watchdog_fire);
    alarm(seconds);
}

/* Formats "<scratch>/<rel>" into a static-free caller buffer. */
static inline void tu_path(char *buf, size_t cap, const char *rel)
{
    int n = snprintf(buf, cap, "%s/%s", tu_scratch_root(), rel);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "FAIL: path too long: %s/%s\n", tu_scratch_root(), rel);
        tu_fail_exit();
    }
}

/* Opens namespace `ns` in the scratch root with `flags` | CREATE and
 * `threads` gather threads (0: library default). */
static inline engram_store *tu_open(const char *ns, uint32_t flags, int threads)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    o.flags = flags | ENGRAM_OPEN_CREATE;
    o.threads = threads;
    int rc = engram_store_open(tu_scratch_root(), ns, &o, &st);
    if (rc != 0 || st == NULL) {
        fprintf(stderr, "FAIL [%s]: engram_store_open(%s, %s) = %d (%s): %s\n",
                tu_current_case, tu_scratch_root(), ns, rc, engram_strerror(rc),
                engram_errmsg());
        tu_fail_exit();
    }
    return st;
}

/* ------------------------------------------------------------------------
 * Deterministic row patterns.
 */

/* Byte `j` of row `i` of the table with pattern seed `seed`. */
static inline unsigned char tu_byte(uint32_t seed, uint64_t i, uint32_t j)
{
    uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xC2B2AE3D27D4EB4Full ^
                 ((uint64_t)j + 1) * 0x165667B19E3779F9ull;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 29;
    return (unsigned char)(x >> 24);
}

/* Fills one row of `row_bytes` pattern bytes. */
static inline void tu_fill_row(void *dst, uint32_t seed, uint64_t i, uint32_t row_bytes)
{
    unsigned char *d = (unsigned char *)dst;
    for (uint32_t j = 0; j < row_bytes; j++)
        d[j] = tu_byte(seed, i, j);
}

/* Returns a malloc'ed buffer of `nrows` pattern rows `stride` bytes apart;
 * the bytes between row_bytes and stride are set to `pad` so a library
 * that copied them would be caught. */
static inline unsigned char *tu_make_rows(uint32_t seed, uint64_t nrows, uint32_t row_bytes,
                                          size_t stride, unsigned char pad)
{
    if (stride == 0)
        stride = row_bytes;
    unsigned char *buf = (unsigned char *)tu_xmalloc((size_t)nrows * stride);
    memset(buf, pad, (size_t)nrows * stride);
    for (uint64_t i = 0; i < nrows; i++)
        tu_fill_row(buf + i * stride, seed, i, row_bytes);
    return buf;
}

/* Returns -1 if `p` holds row `i` of pattern `seed` exactly, else the
 * offset of the first wrong byte. */
static inline long tu_row_mismatch(const void *p, uint32_t seed, uint64_t i, uint32_t row_bytes)
{
    const unsigned char *s = (const unsigned char *)p;
    for (uint32_t j = 0; j < row_bytes; j++)
        if (s[j] != tu_byte(seed, i, j))
            return (long)j;
    return -1;
}

/* Asserts that `p` holds row `i` of pattern `seed`. */
#define ASSERT_ROW(p, seed, i, row_bytes)                                             \
    do {                                                                              \
        long tu_m_ = tu_row_mismatch((p), (seed), (i), (row_bytes));                  \
        if (tu_m_ >= 0) {                                                             \
            TU_FAIL_HEAD(__FILE__, __LINE__);                                         \
            fprintf(stderr, "row %llu of pattern %u differs at byte %ld: got 0x%02x, " \
                    "expected 0x%02x\n", (unsigned long long)(i), (unsigned)(seed),   \
                    tu_m_, ((const unsigned char *)(p))[tu_m_],                       \
                    tu_byte((seed), (i), (uint32_t)tu_m_));                           \
            tu_fail_exit();                                                           \
        }                                                                             \
    } while (0)

/* Asserts that all `n` bytes at `p` equal `v`. */
#define ASSERT_ALL_BYTES(p, v, n)                                                     \
    do {                                                                              \
        const unsigned char *tu_p_ = (const unsigned char *)(p);                      \
        size_t tu_n_ = (size_t)(n);                                                   \
        for (size_t tu_i_ = 0; tu_i_ < tu_n_; tu_i_++) {                              \
            if (tu_p_[tu_i_] != (unsigned char)(v)) {                                 \
                TU_FAIL_HEAD(__FILE__, __LINE__);                                     \
                fprintf(stderr, "byte %zu of %s is 0x%02x, expected 0x%02x\n", tu_i_, \
                        #p, tu_p_[tu_i_], (unsigned)(unsigned char)(v));              \
                tu_fail_exit();                                                       \
            }                                                                         \
        }                                                                             \
    } while (0)

/* Populates table `name` of `nrows` rows of pattern `seed`. */
static inline void tu_populate(engram_store *st, const char *name, uint32_t seed,
                               uint64_t nrows, uint32_t row_bytes, uint32_t row_pitch)
{
    engram_table_spec spec = {nrows, row_bytes, row_pitch};
    unsigned char *rows = tu_make_rows(seed, nrows, row_bytes, row_bytes, 0);
    int rc = engram_populate(st, name, &spec, rows, 0);
    free(rows);
    if (rc != 0) {
        fprintf(stderr, "FAIL [%s]: engram_populate(%s) = %d (%s): %s\n", tu_current_case,
                name, rc, engram_strerror(rc), engram_errmsg());
        tu_fail_exit();
    }
}

/* Small deterministic PRNG (splitmix64) for randomized tests, so a failure
 * reproduces from the printed seed. */
static inline uint64_t tu_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static inline uint64_t tu_rand_below(uint64_t *state, uint64_t n)
{
    return n ? tu_rand(state) % n : 0;
}


/* Looks up rows ids[0..n) of one table (T = n, K = 1, int64 ids) into
 * `out` packed at row_bytes; returns the lookup's code. */
static inline int tu_lookup1(engram_store *st, engram_table_id tid, const int64_t *ids,
                             size_t n, void *out, uint32_t flags)
{
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.flags = flags;
    a.num_tokens = n;
    a.num_cols = 1;
    a.tables = &tid;
    a.ids = ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = out;
    return engram_lookup(st, &a);
}

/* Reads every row of table `tid` in one lookup (in reverse order, to
 * exercise random access) and checks it against pattern `seed`. */
static inline void tu_check_table(engram_store *st, engram_table_id tid, uint32_t seed,
                                  uint64_t nrows, uint32_t row_bytes)
{
    int64_t *ids = (int64_t *)tu_xmalloc(nrows * sizeof *ids);
    unsigned char *out = (unsigned char *)tu_xmalloc(nrows * row_bytes);
    for (uint64_t i = 0; i < nrows; i++)
        ids[i] = (int64_t)(nrows - 1 - i);
    ASSERT_OK(tu_lookup1(st, tid, ids, nrows, out, 0));
    for (uint64_t i = 0; i < nrows; i++)
        ASSERT_ROW(out + i * row_bytes, seed, nrows - 1 - i, row_bytes);
    free(ids);
    free(out);
}

/* Opens table `name` and checks all its rows against pattern `seed`. */
static inline void tu_check_named(engram_store *st, const char *name, uint32_t seed,
                                  uint64_t nrows, uint32_t row_bytes)
{
    engram_table_id tid;
    ASSERT_OK(engram_table_open(st, name, &tid));
    tu_check_table(st, tid, seed, nrows, row_bytes);
}

/* Counts the entries of namespace `ns` (other than . and ..) that are not
 * in `st`'s table list (temporary files, debris), prints them, and copies
 * up to `cap` of their names into names[]; returns how many there are. */
static inline int tu_strays(const char *ns, engram_store *st, char names[][256], int cap)
{
    char dirp[512];
    tu_path(dirp, sizeof dirp, ns);
    DIR *d = opendir(dirp);
    ASSERT(d != NULL);
    char **tabs = NULL;
    size_t count = 0;
    ASSERT_OK(engram_list(st, &tabs, &count));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        /* A store with open tables holds a lease on its namespace: the
         * library's own entry, not a stray. */
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            strncmp(e->d_name, ".lease.", 7) == 0)
            continue;
        int known = 0;
        for (size_t i = 0; i < count; i++)
            if (strcmp(tabs[i], e->d_name) == 0)
                known = 1;
        if (!known) {
            fprintf(stderr, "   stray entry in %s: %s\n", dirp, e->d_name);
            if (n < cap)
                snprintf(names[n], 256, "%s", e->d_name);
            n++;
        }
    }
    closedir(d);
    engram_free(tabs);
    return n;
}


#endif /* ENGRAM_TESTUTIL_H */
