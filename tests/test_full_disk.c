/*
 * test_full_disk.c - a full file system: writing a table that does not fit
 * fails cleanly with -ENOSPC before any row is written, publishes nothing,
 * leaves no temporary file, and leaves the tables already there intact.
 *
 * Needs root to mount a small tmpfs (like Docker's 64 MiB /dev/shm, only
 * smaller); exits 77 (skipped) where that is not possible.
 */
#include <sys/mount.h>

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
    printf("test_full_disk: all passed\n");
    return 0;
}
