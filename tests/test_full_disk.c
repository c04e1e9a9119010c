/*
 * test_full_disk.c - a full file system: writing a table that does not fit
 * fails cleanly with -ENOSPC before any row is written, publishes nothing,
 * leaves no temporary file, and leaves the tables already there intact.
 *
 * A table whose data fit the free space exactly but whose header does not
 * fails at begin too: the header is reserved with the data.
 *
 * Needs root to mount a small tmpfs (like Docker's 64 MiB /dev/shm, only
 * smaller); exits 77 (skipped) where that is not possible.
 */
#include <sys/mount.h>
#include <sys/statvfs.h>

#include "testutil.h"

static char mnt[512];

static void unmount(void)
{
    if (mnt[0])
        umount2(mnt, MNT_DETACH);
}

enum { RB = 1024 };

static engram_store *open_full(void)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    char root[600];
    o.flags = ENGRAM_OPEN_CREATE;
    o.threads = 1;
    snprintf(root, sizeof root, "%s/root", mnt);
    ASSERT_OK(engram_store_open(root, "full", &o, &st));
    return st;
}

static void test_full_disk(void)
{
    engram_store *st = open_full();
    engram_writer *w = NULL;
    engram_table_spec big = {8192, RB, 0}; /* 8 MiB on a 4 MiB file system */
    engram_table_spec two = {2048, RB, 0}; /* 2 MiB */
    char **names;
    size_t count;

    /* A table that fits is published. */
    tu_populate(st, "small", 5, 1024, RB, 0);

    /* One that does not fails at begin, before any row is accepted. */
    ASSERT_ERR(engram_writer_begin(st, "big", &big, &w), -ENOSPC);
    ASSERT(w == NULL);
    ASSERT_CONTAINS(engram_errmsg(), "big");
    unsigned char *rows = tu_make_rows(9, 8192, RB, RB, 0);
    ASSERT_ERR(engram_populate(st, "big", &big, rows, 0), -ENOSPC);
    /* 1 MiB is used: 2 MiB more still fits, a second 2 MiB then does not. */
    ASSERT_OK(engram_populate(st, "two", &two, rows, 0));
    ASSERT_ERR(engram_populate(st, "two-more", &two, rows, 0), -ENOSPC);
    free(rows);

    /* Nothing half-written is visible, no temporary file is left. */
    ASSERT_OK(engram_list(st, &names, &count));
    ASSERT_EQ(count, 2);
    ASSERT_STR_EQ(names[0], "small");
    ASSERT_STR_EQ(names[1], "two");
    engram_free(names);
    ASSERT_EQ(tu_strays("mnt/root/full", st, NULL, 0), 0);
    engram_store_close(st);

    /* After a reopen the stored tables are whole and verify. */
    st = open_full();
    ASSERT_OK(engram_verify(st, "small", NULL, NULL));
    ASSERT_OK(engram_verify(st, "two", NULL, NULL));
    tu_check_named(st, "small", 5, 1024, RB);
    ASSERT_ERR(engram_table_open(st, "big", &(engram_table_id){0}), -ENOENT);
    engram_store_close(st);
}

/* Bytes the file system has free. */
static uint64_t free_bytes(void)
{
    struct statvfs sv;
    ASSERT_EQ(statvfs(mnt, &sv), 0);
    return (uint64_t)sv.f_bavail * sv.f_frsize;
}

/* Exactly full: a table whose data region takes all the free space has no
 * room left for its header, and fails at begin; one a block smaller takes
 * the header's block too, fills the file system exactly, and commits. */
static void test_exact_fit(void)
{
    engram_store *st = open_full();
    engram_writer *w = NULL;
    uint64_t free0 = free_bytes(), block;
    struct statvfs sv;
    ASSERT_EQ(statvfs(mnt, &sv), 0);
    block = sv.f_frsize;
    printf("   %llu bytes free, %llu-byte blocks\n", (unsigned long long)free0,
           (unsigned long long)block);
    ASSERT_GT(free0, 2 * block);
    ASSERT_EQ(free0 % RB, 0);
    ASSERT_EQ(block % RB, 0);

    engram_table_spec data_only = {free0 / RB, RB, 0};
    ASSERT_ERR(engram_writer_begin(st, "data-fits", &data_only, &w), -ENOSPC);
    ASSERT(w == NULL);
    ASSERT_CONTAINS(engram_errmsg(), "data-fits");
    ASSERT_EQ(free_bytes(), free0); /* nothing kept */

    engram_table_spec exact = {(free0 - block) / RB, RB, 0};
    unsigned char *rows = tu_make_rows(13, exact.num_rows, RB, RB, 0);
    ASSERT_OK(engram_writer_begin(st, "exact", &exact, &w));
    ASSERT_EQ(free_bytes(), 0);
    ASSERT_OK(engram_writer_append(w, rows, exact.num_rows, 0));
    ASSERT_OK(engram_writer_commit(w));
    free(rows);
    ASSERT_EQ(free_bytes(), 0);
    ASSERT_OK(engram_verify(st, "exact", NULL, NULL));
    tu_check_named(st, "exact", 13, exact.num_rows, RB);
    ASSERT_EQ(tu_strays("mnt/root/full", st, NULL, 0), 0);
    engram_store_close(st);
}

int main(void)
{
    if (geteuid() != 0) {
        printf("test_full_disk: skipped: mounting a small tmpfs needs root\n");
        return TU_SKIP_CODE;
    }
    snprintf(mnt, sizeof mnt, "%s/mnt", tu_scratch_root());
    if (mkdir(mnt, 0700) != 0 || mount("tmpfs", mnt, "tmpfs", 0, "size=4m,mode=0700") != 0) {
        printf("test_full_disk: skipped: cannot mount a tmpfs at %s: %s\n", mnt, strerror(errno));
        mnt[0] = '\0';
        return TU_SKIP_CODE;
    }
    /* Registered after the scratch cleanup, so it runs before it. */
    atexit(unmount);
    RUN_TEST(test_full_disk);
    RUN_TEST(test_exact_fit);
    printf("test_full_disk: all passed\n");
    return 0;
}
