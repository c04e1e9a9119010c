/*
 * test_store.c - stores, tables and writers through the public API.
 *
 * Covers the life of a table in a directory namespace (populate, open,
 * look up, reopen, info, list, verify, remove and reuse of the name), the
 * create-only rules between populate, streaming writers and bind, memory
 * stores, row pitch padding, every memory option and the stats counters.
 * Every check compares exact bytes against the deterministic row pattern
 * of testutil.h.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>

#include "testutil.h"

#define MiB (1024ull * 1024ull)

/* Returns 1 if `name` is in the store's list. */
static int listed(engram_store *st, const char *name)
{
    char **names = NULL;
    size_t count = 0;
    int found = 0;
    ASSERT_OK(engram_list(st, &names, &count));
    for (size_t i = 0; i < count; i++)
        if (strcmp(names[i], name) == 0)
            found = 1;
    engram_free(names);
    return found;
}

/* Asserts that table `name` is invisible in every way a reader can look. */
static void assert_invisible(engram_store *st, const char *name)
{
    engram_table_id tid;
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    ASSERT_EQ(listed(st, name), 0);
    ASSERT_ERR(engram_table_open(st, name, &tid), -ENOENT);
    ASSERT_ERR(engram_get_table_info(st, name, &info), -ENOENT);
}

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */

static void test_open_create(void)
{
    engram_store *st = NULL;
    char p[512];
    struct stat sb;

    /* Without CREATE a missing namespace is -ENOENT and nothing appears. */
    ASSERT_ERR(engram_store_open(tu_scratch_root(), "missing", NULL, &st), -ENOENT);
    ASSERT(st == NULL);
    tu_path(p, sizeof p, "missing");
    ASSERT(lstat(p, &sb) != 0);

    /* A missing root is -ENOENT too without CREATE ... */
    tu_path(p, sizeof p, "newroot");
    ASSERT_ERR(engram_store_open(p, "ns", NULL, &st), -ENOENT);
    ASSERT(st == NULL);

    /* ... and both are created with it, mode 0700. */
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    o.flags = ENGRAM_OPEN_CREATE;
    ASSERT_OK(engram_store_open(p, "ns", &o, &st));
    ASSERT(st != NULL);
    tu_path(p, sizeof p, "newroot/ns");
    ASSERT_EQ(lstat(p, &sb), 0);
    ASSERT(S_ISDIR(sb.st_mode));
    ASSERT_EQ(sb.st_mode & 07777, 0700);
    ASSERT_EQ(sb.st_uid, geteuid());

    /* Published table files are read-only to their owner. */
    tu_populate(st, "t", 1, 10, 16, 0);
    tu_path(p, sizeof p, "newroot/ns/t");
    ASSERT_EQ(lstat(p, &sb), 0);
    ASSERT(S_ISREG(sb.st_mode));
    ASSERT_EQ(sb.st_mode & 07777, 0400);
    engram_store_close(st);

    /* An existing namespace opens without CREATE, and NULL options are the
     * defaults. */
    st = NULL;
    tu_path(p, sizeof p, "newroot");
    ASSERT_OK(engram_store_open(p, "ns", NULL, &st));
    tu_check_named(st, "t", 1, 10, 16);
    engram_store_close(st);

    /* ENGRAM_OPEN_GROUP: directory 0750, files 0440. */
    o.flags = ENGRAM_OPEN_CREATE | ENGRAM_OPEN_GROUP;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "grp", &o, &st));
    tu_populate(st, "g", 2, 3, 8, 0);
    tu_path(p, sizeof p, "grp");
    ASSERT_EQ(lstat(p, &sb), 0);
    ASSERT_EQ(sb.st_mode & 07777, 0750);
    tu_path(p, sizeof p, "grp/g");
    ASSERT_EQ(lstat(p, &sb), 0);
    ASSERT_EQ(sb.st_mode & 07777, 0440);
    tu_check_named(st, "g", 2, 3, 8);
    engram_store_close(st);
}

static void test_roundtrip_persistence(void)
{
    const uint64_t n = 1000;
    const uint32_t rb = 264;
    engram_store *st = tu_open("rt", 0, 1);
    tu_populate(st, "engram:l1:h0", 11, n, rb, 0);
    tu_populate(st, "engram:l1:h1", 12, 7, rb, 0);

    engram_table_id a, a2, b;
    ASSERT_OK(engram_table_open(st, "engram:l1:h0", &a));
    ASSERT_OK(engram_table_open(st, "engram:l1:h0", &a2));
    ASSERT_EQ(a, a2); /* same name, same id */
    ASSERT_OK(engram_table_open(st, "engram:l1:h1", &b));
    ASSERT_NE(a, b);
    tu_check_table(st, a, 11, n, rb);
    tu_check_table(st, b, 12, 7, rb);
    ASSERT_ERR(engram_table_open(st, "engram:l1:h2", &b), -ENOENT);
    engram_store_close(st);

    /* A fresh store (as after a restart) reads the same bytes. */
    st = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "rt", NULL, &st));
    tu_check_named(st, "engram:l1:h0", 11, n, rb);
    tu_check_named(st, "engram:l1:h1", 12, 7, rb);
    engram_store_close(st);
}

static void test_table_info(void)
{
    const uint64_t n = 333;
    const uint32_t rb = 100;
    engram_store *st = tu_open("info", 0, 1);
    uint64_t t0 = wall_ns();
    tu_populate(st, "t", 5, n, rb, 0);
    uint64_t t1 = wall_ns();

    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st, "t", &info));
    ASSERT_EQ(info.size, sizeof info);
    ASSERT_EQ(info.kind, ENGRAM_TABLE_FILE);
    ASSERT_EQ_U64(info.spec.num_rows, n);
    ASSERT_EQ(info.spec.row_bytes, rb);
    ASSERT_EQ(info.spec.row_pitch, rb); /* defaulted, never 0 */
    ASSERT_EQ_U64(info.data_size, n * rb);
    ASSERT(info.data_offset >= 512);
    ASSERT_EQ_U64(info.data_offset % (2 * MiB), 0);
    ASSERT_NE(info.checksum, 0);
    ASSERT(info.created_ns >= t0 - 1000000000ull && info.created_ns <= t1 + 1000000000ull);
    ASSERT_EQ(info.mapped, 0); /* not opened in this store yet */
    ASSERT_EQ_U64(info.lookups, 0);

    /* The file is exactly header + padding + data. */
    char p[512];
    struct stat sb;
    tu_path(p, sizeof p, "info/t");
    ASSERT_EQ(stat(p, &sb), 0);
    ASSERT_EQ_U64((uint64_t)sb.st_size, info.data_offset + info.data_size);

    /* Opening maps it; the spec and checksum do not change. */
    engram_table_id tid;
    ASSERT_OK(engram_table_open(st, "t", &tid));
    engram_table_info info2 = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st, "t", &info2));
    ASSERT_EQ(info2.mapped, 1);
    ASSERT_EQ(info2.private_copy, 0);
    ASSERT_EQ_U64(info2.checksum, info.checksum);
    ASSERT_EQ_U64(info2.created_ns, info.created_ns);
    ASSERT_EQ_U64(info2.data_offset, info.data_offset);

    /* Another table with the same rows has the same checksum; different
     * rows give a different one. */
    tu_populate(st, "same", 5, n, rb, 0);
    tu_populate(st, "other", 6, n, rb, 0);
    engram_table_info is = ENGRAM_TABLE_INFO_INIT, io = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st, "same", &is));
    ASSERT_OK(engram_get_table_info(st, "other", &io));
    ASSERT_EQ_U64(is.checksum, info.checksum);
    ASSERT_NE(io.checksum, info.checksum);

    /* Missing tables and a wrong size field. */
    ASSERT_ERR(engram_get_table_info(st, "nope", &is), -ENOENT);
    engram_table_info bad = ENGRAM_TABLE_INFO_INIT;
    bad.size = 0;
    ASSERT_ERR(engram_get_table_info(st, "t", &bad), -EINVAL);
    engram_store_close(st);
}

static void test_list_sorted(void)
{
    engram_store *st = tu_open("list", 0, 1);
    char **names = NULL;
    size_t count = 99;
    ASSERT_OK(engram_list(st, &names, &count));
    ASSERT_EQ(count, 0);
    engram_free(names);

    tu_populate(st, "b", 1, 2, 8, 0);
    tu_populate(st, "a", 2, 2, 8, 0);
    tu_populate(st, "c:1", 3, 2, 8, 0);
    tu_populate(st, "B", 4, 2, 8, 0);
    static unsigned char mem[16];
    engram_table_spec spec = {2, 8, 0};
    ASSERT_OK(engram_bind(st, "ab", &spec, mem));

    ASSERT_OK(engram_list(st, &names, &count));
    const char *want[] = {"B", "a", "ab", "b", "c:1"};
    ASSERT_EQ(count, 5);
    for (size_t i = 0; i < count; i++)
        ASSERT_STR_EQ(names[i], want[i]);
    engram_free(names);

    /* Another store on the same namespace sees the stored tables (not the
     * other store's bound one). */
    engram_store *st2 = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "list", NULL, &st2));
    ASSERT_OK(engram_list(st2, &names, &count));
    ASSERT_EQ(count, 4);
    ASSERT_STR_EQ(names[0], "B");
    ASSERT_STR_EQ(names[1], "a");
    ASSERT_STR_EQ(names[2], "b");
    ASSERT_STR_EQ(names[3], "c:1");
    engram_free(names);
    engram_store_close(st2);
    engram_store_close(st);
}

static void test_remove(void)
{
    engram_store *st = tu_open("rm", 0, 1);
    tu_populate(st, "t", 1, 50, 32, 0);
    tu_populate(st, "keep", 2, 5, 32, 0);
    engram_table_id old_id, keep_id;
    ASSERT_OK(engram_table_open(st, "t", &old_id));
    ASSERT_OK(engram_table_open(st, "keep", &keep_id));
    tu_check_table(st, old_id, 1, 50, 32);

    ASSERT_OK(engram_remove(st, "t"));
    ASSERT_ERR(engram_remove(st, "t"), -ENOENT);
    ASSERT_ERR(engram_remove(st, "never"), -ENOENT);
    assert_invisible(st, "t");
    ASSERT_EQ(listed(st, "keep"), 1);
    char p[512];
    struct stat sb;
    tu_path(p, sizeof p, "rm/t");
    ASSERT(lstat(p, &sb) != 0); /* the file is unlinked */

    /* The old id now fails, and the output is untouched. */
    unsigned char out[32];
    memset(out, 0xA5, sizeof out);
    int64_t id = 3;
    ASSERT_ERR(tu_lookup1(st, old_id, &id, 1, out, 0), ENGRAM_EREMOVED);
    ASSERT_ALL_BYTES(out, 0xA5, sizeof out);
    ASSERT(engram_errmsg()[0] != '\0');
    /* The other table is unaffected. */
    tu_check_table(st, keep_id, 2, 5, 32);

    /* The name is free again: a new table with other contents and size. */
    tu_populate(st, "t", 9, 20, 32, 0);
    engram_table_id new_id;
    ASSERT_OK(engram_table_open(st, "t", &new_id));
    ASSERT_NE(new_id, old_id);
    tu_check_table(st, new_id, 9, 20, 32);
    ASSERT_ERR(tu_lookup1(st, old_id, &id, 1, out, 0), ENGRAM_EREMOVED);
    ASSERT_ALL_BYTES(out, 0xA5, sizeof out);

    /* Another store sees the new table too. */
    engram_store *st2 = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "rm", NULL, &st2));
    tu_check_named(st2, "t", 9, 20, 32);
    /* Removing through the other store unlinks the file; this store's
     * mapping stays readable ("other processes keep their mappings"). */
    ASSERT_OK(engram_remove(st2, "t"));
    engram_store_close(st2);
    tu_check_table(st, new_id, 9, 20, 32);
    engram_store_close(st);

    st = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "rm", NULL, &st));
    assert_invisible(st, "t");
    tu_check_named(st, "keep", 2, 5, 32);
    engram_store_close(st);
}

static void test_populate_twice(void)
{
    engram_store *st = tu_open("twice", 0, 1);
    tu_populate(st, "t", 1, 64, 24, 0);
    engram_table_info before = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st, "t", &before));

    engram_table_spec spec = {64, 24, 0};
    unsigned char *rows = tu_make_rows(2, 64, 24, 0, 0);
    ASSERT_ERR(engram_populate(st, "t", &spec, rows, 0), -EEXIST);
    /* A different spec under the same name is refused the same way. */
    engram_table_spec spec2 = {10, 24, 0};
    ASSERT_ERR(engram_populate(st, "t", &spec2, rows, 0), -EEXIST);
    engram_writer *w = NULL;
    ASSERT_ERR(engram_writer_begin(st, "t", &spec, &w), -EEXIST);
    ASSERT(w == NULL);
    free(rows);

    engram_table_info after = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st, "t", &after));
    ASSERT_EQ_U64(after.checksum, before.checksum);
    ASSERT_EQ_U64(after.created_ns, before.created_ns);
    tu_check_named(st, "t", 1, 64, 24);
    ASSERT_EQ(tu_strays("twice", st, NULL, 0), 0);
    engram_store_close(st);
}

static void test_bind(void)
{
    const uint64_t n = 40;
    const uint32_t rb = 264;
    engram_store *st = tu_open("bind", 0, 1);
    unsigned char *mem = tu_make_rows(3, n, rb, 0, 0);
    engram_table_spec spec = {n, rb, 0};
    ASSERT_OK(engram_bind(st, "m", &spec, mem));

    engram_table_id tid;
    ASSERT_OK(engram_table_open(st, "m", &tid));
    tu_check_table(st, tid, 3, n, rb);

    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st, "m", &info));
    ASSERT_EQ(info.kind, ENGRAM_TABLE_BOUND);
    ASSERT_EQ_U64(info.spec.num_rows, n);
    ASSERT_EQ(info.spec.row_bytes, rb);
    ASSERT_EQ(info.spec.row_pitch, rb);
    ASSERT_EQ_U64(info.data_size, n * rb);
    ASSERT_EQ(info.mapped, 1);

    /* No copy: the lookup reads the caller's memory itself.  (Changing
     * bound memory breaks the documented contract; this test does it once,
     * with no lookup in flight, only to observe that nothing was copied.) */
    int64_t id = 7;
    unsigned char out[264];
    mem[7 * rb + 5] ^= 0xFF;
    ASSERT_OK(tu_lookup1(st, tid, &id, 1, out, 0));
    ASSERT_EQ(out[5], mem[7 * rb + 5]);
    mem[7 * rb + 5] ^= 0xFF;

    /* Name conflicts in every direction. */
    ASSERT_ERR(engram_bind(st, "m", &spec, mem), -EEXIST);
    tu_populate(st, "stored", 4, 4, rb, 0);
    ASSERT_ERR(engram_bind(st, "stored", &spec, mem), -EEXIST);
    ASSERT_ERR(engram_populate(st, "m", &spec, mem, 0), -EEXIST);
    engram_writer *w = NULL;
    ASSERT_ERR(engram_writer_begin(st, "m", &spec, &w), -EEXIST);
    ASSERT(w == NULL);
    ASSERT_ERR(engram_remove(st, "m"), ENGRAM_EBOUND);
    tu_check_table(st, tid, 3, n, rb); /* still served after the refusals */
    tu_check_named(st, "stored", 4, 4, rb);

    /* Bad arguments. */
    ASSERT_ERR(engram_bind(st, "nullmem", &spec, NULL), -EINVAL);
    engram_table_spec bad = {0, rb, 0};
    ASSERT_ERR(engram_bind(st, "badspec", &bad, mem), ENGRAM_ESPEC);
    ASSERT_EQ(listed(st, "nullmem"), 0);
    ASSERT_EQ(listed(st, "badspec"), 0);

    /* Bound tables never reach the directory. */
    ASSERT_EQ(listed(st, "m"), 1);
    char p[512];
    struct stat sb;
    tu_path(p, sizeof p, "bind/m");
    ASSERT(lstat(p, &sb) != 0);

    /* A bound table with a row pitch: row i at mem + i * pitch. */
    const uint32_t pitch = 272;
    unsigned char *pm = tu_make_rows(5, n, rb, pitch, 0xEE);
    engram_table_spec ps = {n, rb, pitch};
    ASSERT_OK(engram_bind(st, "pitched", &ps, pm));
    engram_table_id ptid;
    ASSERT_OK(engram_table_open(st, "pitched", &ptid));
    tu_check_table(st, ptid, 5, n, rb);
    ASSERT_OK(engram_get_table_info(st, "pitched", &info));
    ASSERT_EQ(info.spec.row_pitch, pitch);
    ASSERT_EQ_U64(info.data_size, n * pitch);

    engram_store_close(st);
    free(mem);
    free(pm);
}

static void test_memory_store(void)
{
    engram_store *st = NULL;
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT(st != NULL);

    const uint64_t n = 100;
    const uint32_t rb = 64;
    unsigned char *mem = tu_make_rows(8, n, rb, 0, 0);
    engram_table_spec spec = {n, rb, 0};
    ASSERT_OK(engram_bind(st, "a", &spec, mem));
    ASSERT_OK(engram_bind(st, "engram:l0:h0", &spec, mem));
    ASSERT_ERR(engram_bind(st, "a", &spec, mem), -EEXIST);
    tu_check_named(st, "a", 8, n, rb);
    tu_check_named(st, "engram:l0:h0", 8, n, rb);

    /* It only serves bound tables: writing one is refused cleanly. */
    int rc;
    ASSERT_FAILS(engram_populate(st, "p", &spec, mem, 0), rc);
    printf("   populate on a memory store: %d (%s): %s\n", rc, engram_strerror(rc),
           engram_errmsg());
    engram_writer *w = NULL;
    ASSERT_FAILS(engram_writer_begin(st, "p", &spec, &w), rc);
    ASSERT(w == NULL);
    ASSERT_EQ(listed(st, "p"), 0);

    char **names = NULL;
    size_t count = 0;
    ASSERT_OK(engram_list(st, &names, &count));
    ASSERT_EQ(count, 2);
    ASSERT_STR_EQ(names[0], "a");
    ASSERT_STR_EQ(names[1], "engram:l0:h0");
    engram_free(names);

    engram_table_id tid;
    ASSERT_ERR(engram_table_open(st, "missing", &tid), -ENOENT);
    ASSERT_ERR(engram_remove(st, "a"), ENGRAM_EBOUND);
    ASSERT_ERR(engram_remove(st, "missing"), -ENOENT);

    engram_stats s = ENGRAM_STATS_INIT;
    ASSERT_OK(engram_store_stats(st, &s));
    ASSERT_EQ_U64(s.tables_open, 2);
    ASSERT_EQ_U64(s.mapped_bytes, 2 * n * rb);
    engram_store_close(st);
    free(mem);

    /* With options too. */
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    o.threads = 2;
    st = NULL;
    ASSERT_OK(engram_store_open_memory(&o, &st));
    ASSERT_OK(engram_store_stats(st, &s));
    ASSERT_EQ(s.threads, 2);
    engram_store_close(st);
}

/* row_bytes 264 at pitch 272, written from a source with a 300-byte
 * stride whose gaps hold junk: the junk never reaches the file, the file's
 * padding is zero, and lookups never write beyond row_bytes. */
static void test_pitch_padding(void)
{
    const uint64_t n = 257;
    const uint32_t rb = 264, pitch = 272;
    const size_t src_stride = 300;
    engram_store *st = tu_open("pitch", 0, 1);
    unsigned char *src = tu_make_rows(21, n, rb, src_stride, 0xEE);
    engram_table_spec spec = {n, rb, pitch};
    ASSERT_OK(engram_populate(st, "p", &spec, src, src_stride));
    free(src);

    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st, "p", &info));
    ASSERT_EQ(info.spec.row_pitch, pitch);
    ASSERT_EQ_U64(info.data_size, n * pitch);

    /* The file: rows at the pitch, zero padding after each row. */
    char p[512];
    tu_path(p, sizeof p, "pitch/p");
    int fd = open(p, O_RDONLY);
    ASSERT(fd >= 0);
    unsigned char *data = (unsigned char *)tu_xmalloc(n * pitch);
    ASSERT_EQ(pread(fd, data, n * pitch, (off_t)info.data_offset), (ssize_t)(n * pitch));
    close(fd);
    for (uint64_t i = 0; i < n; i++) {
        ASSERT_ROW(data + i * pitch, 21, i, rb);
        ASSERT_ALL_BYTES(data + i * pitch + rb, 0, pitch - rb);
    }
    free(data);

    /* Lookups into an output with 280-byte slots: bytes 264..279 of each
     * slot keep their sentinel. */
    engram_table_id tid;
    ASSERT_OK(engram_table_open(st, "p", &tid));
    const size_t T = n, slot = 280;
    int64_t *ids = (int64_t *)tu_xmalloc(T * sizeof *ids);
    for (size_t t = 0; t < T; t++)
        ids[t] = (int64_t)((t * 37) % n);
    unsigned char *out = (unsigned char *)tu_xmalloc(T * slot);
    memset(out, 0xAA, T * slot);
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.num_tokens = T;
    a.num_cols = 1;
    a.tables = &tid;
    a.ids = ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = out;
    a.out_stride_t = (ptrdiff_t)slot;
    a.out_stride_k = (ptrdiff_t)slot;
    ASSERT_OK(engram_lookup(st, &a));
    for (size_t t = 0; t < T; t++) {
        ASSERT_ROW(out + t * slot, 21, (uint64_t)ids[t], rb);
        ASSERT_ALL_BYTES(out + t * slot + rb, 0xAA, slot - rb);
    }
    free(ids);
    free(out);
    ASSERT_OK(engram_verify(st, "p", NULL, NULL));
    engram_store_close(st);
}

static void test_writer_streaming(void)
{
    const uint64_t n = 1000;
    const uint32_t rb = 264;
    engram_store *st = tu_open("wr", 0, 1);
    engram_table_spec spec = {n, rb, 0};
    unsigned char *rows = tu_make_rows(31, n, rb, 0, 0);

    /* Uneven chunks, including single rows. */
    engram_writer *w = NULL;
    ASSERT_OK(engram_writer_begin(st, "s", &spec, &w));
    ASSERT(w != NULL);
    uint64_t chunks[] = {1, 7, 100, 1, 391, 500};
    uint64_t done = 0;
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        ASSERT_OK(engram_writer_append(w, rows + done * rb, chunks[c], 0));
        done += chunks[c];
        /* Nothing is visible before commit. */
        if (c == 2)
            assert_invisible(st, "s");
    }
    ASSERT_EQ_U64(done, n);
    assert_invisible(st, "s");
    ASSERT_OK(engram_writer_commit(w));
    tu_check_named(st, "s", 31, n, rb);
    ASSERT_EQ(tu_strays("wr", st, NULL, 0), 0);

    /* src_stride larger than row_bytes, with an explicit stride equal to
     * row_bytes mixed in. */
    unsigned char *wide = tu_make_rows(32, n, rb, 512, 0xCD);
    unsigned char *packed = tu_make_rows(32, n, rb, 0, 0);
    ASSERT_OK(engram_writer_begin(st, "wide", &spec, &w));
    ASSERT_OK(engram_writer_append(w, wide, 300, 512));
    ASSERT_OK(engram_writer_append(w, packed + 300 * rb, 300, rb));
    ASSERT_OK(engram_writer_append(w, wide + 600 * 512, n - 600, 512));
    ASSERT_OK(engram_writer_commit(w));
    tu_check_named(st, "wide", 32, n, rb);
    free(wide);
    free(packed);

    /* engram_populate with a source stride as well. */
    unsigned char *wide2 = tu_make_rows(33, n, rb, 1000, 0x11);
    ASSERT_OK(engram_populate(st, "wide2", &spec, wide2, 1000));
    tu_check_named(st, "wide2", 33, n, rb);
    free(wide2);

    /* Commit with rows missing: ESTATE, nothing published, no debris. */
    ASSERT_OK(engram_writer_begin(st, "short", &spec, &w));
    ASSERT_OK(engram_writer_append(w, rows, n - 1, 0));
    ASSERT_ERR(engram_writer_commit(w), ENGRAM_ESTATE);
    assert_invisible(st, "short");
    ASSERT_EQ(tu_strays("wr", st, NULL, 0), 0);
    /* The name is still free. */
    tu_populate(st, "short", 34, 2, rb, 0);
    tu_check_named(st, "short", 34, 2, rb);

    /* Commit with no rows at all. */
    ASSERT_OK(engram_writer_begin(st, "empty", &spec, &w));
    ASSERT_ERR(engram_writer_commit(w), ENGRAM_ESTATE);
    assert_invisible(st, "empty");

    /* Appending beyond num_rows fails; the writer then only aborts. */
    int rc;
    ASSERT_OK(engram_writer_begin(st, "over", &spec, &w));
    ASSERT_OK(engram_writer_append(w, rows, n - 2, 0));
    ASSERT_FAILS(engram_writer_append(w, rows, 3, 0), rc);
    printf("   append beyond num_rows: %d (%s)\n", rc, engram_strerror(rc));
    engram_writer_abort(w);
    assert_invisible(st, "over");
    ASSERT_EQ(tu_strays("wr", st, NULL, 0), 0);

    /* Appending all rows plus one in a single call fails as well. */
    unsigned char *more = tu_make_rows(35, n + 1, rb, 0, 0);
    ASSERT_OK(engram_writer_begin(st, "over2", &spec, &w));
    ASSERT_FAILS(engram_writer_append(w, more, n + 1, 0), rc);
    engram_writer_abort(w);
    assert_invisible(st, "over2");
    free(more);

    /* A full table then one more row: the extra append fails. */
    ASSERT_OK(engram_writer_begin(st, "over3", &spec, &w));
    ASSERT_OK(engram_writer_append(w, rows, n, 0));
    ASSERT_FAILS(engram_writer_append(w, rows, 1, 0), rc);
    engram_writer_abort(w);
    assert_invisible(st, "over3");

    /* Abort discards everything. */
    ASSERT_OK(engram_writer_begin(st, "ab", &spec, &w));
    ASSERT_OK(engram_writer_append(w, rows, n, 0));
    engram_writer_abort(w);
    assert_invisible(st, "ab");
    ASSERT_EQ(tu_strays("wr", st, NULL, 0), 0);

    /* Two writers of one name: both begin, the first commit wins, the
     * second gets -EEXIST and the winner's bytes stay. */
    engram_writer *w1 = NULL, *w2 = NULL;
    unsigned char *rows2 = tu_make_rows(36, n, rb, 0, 0);
    ASSERT_OK(engram_writer_begin(st, "race", &spec, &w1));
    ASSERT_OK(engram_writer_begin(st, "race", &spec, &w2));
    ASSERT_OK(engram_writer_append(w1, rows, n, 0));
    ASSERT_OK(engram_writer_append(w2, rows2, n, 0));
    ASSERT_OK(engram_writer_commit(w2));
    ASSERT_ERR(engram_writer_commit(w1), -EEXIST);
    tu_check_named(st, "race", 36, n, rb);
    ASSERT_EQ(tu_strays("wr", st, NULL, 0), 0);
    free(rows2);

    /* The store's view and a fresh store's view agree. */
    engram_store_close(st);
    st = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "wr", NULL, &st));
    char **names = NULL;
    size_t count = 0;
    ASSERT_OK(engram_list(st, &names, &count));
    const char *want[] = {"race", "s", "short", "wide", "wide2"};
    ASSERT_EQ(count, 5);
    for (size_t i = 0; i < count; i++)
        ASSERT_STR_EQ(names[i], want[i]);
    engram_free(names);
    ASSERT_EQ(tu_strays("wr", st, NULL, 0), 0);
    engram_store_close(st);
    free(rows);
}

struct progress_log {
    uint64_t calls, last_done, total;
    int monotonic;
    int cancel_at; /* cancel on this call (1-based); 0 = never */
};

static int progress_cb(void *ud, uint64_t done, uint64_t total)
{
    struct progress_log *l = (struct progress_log *)ud;
    if (done < l->last_done || done > total)
        l->monotonic = 0;
    l->last_done = done;
    l->total = total;
    l->calls++;
    return l->cancel_at != 0 && l->calls >= (uint64_t)l->cancel_at;
}

static void test_verify(void)
{
    engram_store *st = tu_open("ver", 0, 1);
    /* Several MiB so progress is reported more than once. */
    const uint64_t n = 40000;
    const uint32_t rb = 264;
    tu_populate(st, "v", 41, n, rb, 0);
    ASSERT_OK(engram_verify(st, "v", NULL, NULL));

    struct progress_log l = {0, 0, 0, 1, 0};
    ASSERT_OK(engram_verify(st, "v", progress_cb, &l));
    ASSERT(l.calls >= 1);
    ASSERT_EQ(l.monotonic, 1);
    ASSERT_EQ_U64(l.total, n * rb);
    ASSERT_EQ_U64(l.last_done, n * rb);

    struct progress_log c = {0, 0, 0, 1, 1};
    ASSERT_ERR(engram_verify(st, "v", progress_cb, &c), -ECANCELED);
    ASSERT_EQ_U64(c.calls, 1);

    ASSERT_ERR(engram_verify(st, "none", NULL, NULL), -ENOENT);

    /* Verifying an opened table works as well. */
    engram_table_id tid;
    ASSERT_OK(engram_table_open(st, "v", &tid));
    ASSERT_OK(engram_verify(st, "v", NULL, NULL));
    engram_store_close(st);
}

/* Every memory option serves the same bytes. */
static void test_memory_options(void)
{
    const uint64_t n = 5000;
    const uint32_t rb = 264;
    engram_store *st = tu_open("opts", 0, 1);
    tu_populate(st, "t", 51, n, rb, 0);
    tu_populate(st, "u", 52, 100, rb, 272);
    engram_store_close(st);

    const size_t T = 512;
    int64_t ids[512][2];
    uint64_t rng = 77;
    for (size_t t = 0; t < T; t++) {
        ids[t][0] = (int64_t)tu_rand_below(&rng, n);
        ids[t][1] = (int64_t)tu_rand_below(&rng, 100);
    }
    unsigned char *out = (unsigned char *)tu_xmalloc(T * 2 * rb);

    uint32_t flagsets[] = {
        0,
        ENGRAM_OPEN_PREFAULT,
        ENGRAM_OPEN_RANDOM,
        ENGRAM_OPEN_PRIVATE_HUGE,
        ENGRAM_OPEN_VERIFY,
        ENGRAM_OPEN_TIMING,
        ENGRAM_OPEN_MLOCK,
        ENGRAM_OPEN_PREFAULT | ENGRAM_OPEN_RANDOM | ENGRAM_OPEN_VERIFY | ENGRAM_OPEN_TIMING,
        ENGRAM_OPEN_PRIVATE_HUGE | ENGRAM_OPEN_PREFAULT | ENGRAM_OPEN_VERIFY,
    };
    for (size_t f = 0; f < sizeof flagsets / sizeof flagsets[0]; f++) {
        uint32_t flags = flagsets[f];
        printf("   flags 0x%x\n", flags);
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        o.flags = flags;
        o.threads = 1;
        st = NULL;
        ASSERT_OK(engram_store_open(tu_scratch_root(), "opts", &o, &st));
        engram_table_id tids[2];
        int rc = engram_table_open(st, "t", &tids[0]);
        /* mlock may be refused by RLIMIT_MEMLOCK (containers often lack
         * CAP_IPC_LOCK even as root); the header documents that failure. */
        if (rc != 0 && (flags & ENGRAM_OPEN_MLOCK) &&
            (rc == -ENOMEM || rc == -EPERM || rc == -EAGAIN)) {
            tu_skip_part("flags 0x%x: MLOCK refused (%d: %s)", flags, rc, engram_errmsg());
            engram_store_close(st);
            continue;
        }
        ASSERT_OK(rc);
        ASSERT_OK(engram_table_open(st, "u", &tids[1]));

        memset(out, 0x3C, T * 2 * rb);
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        a.num_tokens = T;
        a.num_cols = 2;
        a.tables = tids;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        ASSERT_OK(engram_lookup(st, &a));
        ASSERT_OK(engram_lookup(st, &a));
        for (size_t t = 0; t < T; t++) {
            ASSERT_ROW(out + (t * 2) * rb, 51, (uint64_t)ids[t][0], rb);
            ASSERT_ROW(out + (t * 2 + 1) * rb, 52, (uint64_t)ids[t][1], rb);
        }

        engram_table_info info = ENGRAM_TABLE_INFO_INIT;
        ASSERT_OK(engram_get_table_info(st, "t", &info));
        ASSERT_EQ(info.mapped, 1);
        ASSERT_EQ(info.private_copy, (flags & ENGRAM_OPEN_PRIVATE_HUGE) ? 1 : 0);
        ASSERT_EQ_U64(info.lookups, 2);
        ASSERT_EQ_U64(info.rows, 2 * T);
        ASSERT_EQ_U64(info.bytes, 2 * T * rb);
        /* Prefaulted tables are fully resident.  (MLOCK alone is not
         * checked: ASan's mlock interceptor is a no-op.) */
        if (flags & (ENGRAM_OPEN_PREFAULT | ENGRAM_OPEN_PRIVATE_HUGE))
            ASSERT(info.resident_bytes >= info.data_size);
        ASSERT(info.huge_bytes <= info.resident_bytes);

        engram_stats s = ENGRAM_STATS_INIT;
        ASSERT_OK(engram_store_stats(st, &s));
        ASSERT_EQ_U64(s.lookups, 2);
        ASSERT_EQ_U64(s.rows, 2 * T * 2);
        ASSERT_EQ_U64(s.tables_open, 2);
        if (flags & ENGRAM_OPEN_TIMING)
            ASSERT(s.time_ns > 0);
        else
            ASSERT_EQ_U64(s.time_ns, 0);
        engram_store_close(st);
    }
    free(out);
}

static void test_stats(void)
{
    const uint32_t rb = 48;
    engram_store *st = tu_open("stats", 0, 1);
    tu_populate(st, "a", 61, 100, rb, 0);
    tu_populate(st, "b", 62, 10, rb, 64);

    engram_stats s = ENGRAM_STATS_INIT;
    ASSERT_OK(engram_store_stats(st, &s));
    ASSERT_EQ(s.size, sizeof s);
    ASSERT_EQ(s.threads, 1);
    ASSERT_EQ_U64(s.lookups, 0);
    ASSERT_EQ_U64(s.tables_open, 0);
    ASSERT_EQ_U64(s.mapped_bytes, 0);

    engram_table_id tids[2];
    ASSERT_OK(engram_table_open(st, "a", &tids[0]));
    ASSERT_OK(engram_table_open(st, "b", &tids[1]));
    ASSERT_OK(engram_store_stats(st, &s));
    ASSERT_EQ_U64(s.tables_open, 2);
    ASSERT(s.mapped_bytes >= 100 * rb + 10 * 64);

    unsigned char out[4 * 2 * 48];
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.num_tokens = 4;
    a.num_cols = 2;
    a.tables = tids;
    a.id_type = ENGRAM_ID_INT32;
    a.out = out;

    /* 8 rows. */
    int32_t ids1[4][2] = {{0, 0}, {1, 1}, {99, 9}, {50, 5}};
    a.ids = ids1;
    ASSERT_OK(engram_lookup(st, &a));
    /* 5 rows, 3 dead (all in column 1). */
    int32_t ids2[4][2] = {{3, -1}, {4, -1}, {5, 2}, {6, -1}};
    a.ids = ids2;
    ASSERT_OK(engram_lookup(st, &a));
    /* Rejected: nothing counts but `failed`. */
    int32_t ids3[4][2] = {{3, 1}, {4, 1}, {5, 10}, {6, 1}};
    a.ids = ids3;
    ASSERT_ERR(engram_lookup(st, &a), ENGRAM_EBADID);

    ASSERT_OK(engram_store_stats(st, &s));
    ASSERT_EQ_U64(s.lookups, 2);
    ASSERT_EQ_U64(s.failed, 1);
    ASSERT_EQ_U64(s.rows, 13);
    ASSERT_EQ_U64(s.dead_rows, 3);
    ASSERT_EQ_U64(s.bytes, 13 * rb);
    ASSERT_EQ_U64(s.parallel, 0);
    ASSERT_EQ_U64(s.time_ns, 0);

    engram_table_info ia = ENGRAM_TABLE_INFO_INIT, ib = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st, "a", &ia));
    ASSERT_OK(engram_get_table_info(st, "b", &ib));
    ASSERT_EQ_U64(ia.lookups, 2);
    ASSERT_EQ_U64(ia.rows, 8);
    ASSERT_EQ_U64(ia.bytes, 8 * rb);
    ASSERT_EQ_U64(ib.lookups, 2);
    ASSERT_EQ_U64(ib.rows, 5);
    ASSERT_EQ_U64(ib.bytes, 5 * rb);

    /* A lookup that reads table a in both columns counts two lookup
     * columns of a (engram.h: "a table named by k columns of one lookup
     * counts k") and copies 8 of its rows. */
    engram_table_id aa[2] = {tids[0], tids[0]};
    a.tables = aa;
    a.ids = ids1;
    ASSERT_OK(engram_lookup(st, &a));
    ASSERT_OK(engram_get_table_info(st, "a", &ia));
    ASSERT_EQ_U64(ia.rows, 16);
    ASSERT_EQ_U64(ia.bytes, 16 * rb);
    ASSERT_EQ_U64(ia.lookups, 4);
    ASSERT_OK(engram_store_stats(st, &s));
    ASSERT_EQ_U64(s.lookups, 3);
    ASSERT_EQ_U64(s.rows, 21);

    /* Stats of another store on the namespace are its own. */
    engram_store *st2 = NULL;
    ASSERT_OK(engram_store_open(tu_scratch_root(), "stats", NULL, &st2));
    engram_stats s2 = ENGRAM_STATS_INIT;
    ASSERT_OK(engram_store_stats(st2, &s2));
    ASSERT_EQ_U64(s2.lookups, 0);
    ASSERT_EQ_U64(s2.tables_open, 0);
    engram_table_info ia2 = ENGRAM_TABLE_INFO_INIT;
    ASSERT_OK(engram_get_table_info(st2, "a", &ia2));
    ASSERT_EQ(ia2.mapped, 0);
    ASSERT_EQ_U64(ia2.lookups, 0);
    engram_store_close(st2);

    /* A wrong size field. */
    engram_stats bad = ENGRAM_STATS_INIT;
    bad.size = 8;
    ASSERT_ERR(engram_store_stats(st, &bad), -EINVAL);
    bad.size = 0;
    ASSERT_ERR(engram_store_stats(st, &bad), -EINVAL);
    engram_store_close(st);
}

int main(void)
{
    tu_watchdog(240);
    RUN_TEST(test_open_create);
    RUN_TEST(test_roundtrip_persistence);
    RUN_TEST(test_table_info);
    RUN_TEST(test_list_sorted);
    RUN_TEST(test_remove);
    RUN_TEST(test_populate_twice);
    RUN_TEST(test_bind);
    RUN_TEST(test_memory_store);
    RUN_TEST(test_pitch_padding);
    RUN_TEST(test_writer_streaming);
    RUN_TEST(test_verify);
    RUN_TEST(test_memory_options);
    RUN_TEST(test_stats);
    return tu_done("test_store");
}
