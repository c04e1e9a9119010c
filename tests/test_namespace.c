/*
 * test_namespace.c - engram_namespace_list() and engram_namespace_remove()
 * through the public API: what is listed and what is left out, and what
 * stops a removal (tables without the flag, a running writer, a file that
 * is not a table, a link) before anything is removed.  Also the default
 * root's environment variable, ENGRAM_ROOT.
 */
#include <fcntl.h>
#include <sys/wait.h>

#include "testutil.h"

static int ns_exists(const char *ns)
{
    char p[512];
    struct stat sb;
    tu_path(p, sizeof p, ns);
    return lstat(p, &sb) == 0;
}

/* Lists the scratch root's namespaces into one comma-separated string. */
static void list_str(const char *root, char *buf, size_t cap)
{
    char **names = NULL;
    size_t count = 99;
    ASSERT_OK(engram_namespace_list(root, &names, &count));
    buf[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s", i ? "," : "", names[i]);
    }
    ASSERT(names[count] == NULL);
    engram_free(names);
}

static void test_list(void)
{
    char buf[512], p[512], target[512];
    char **names = NULL;
    size_t count = 7;
    engram_store *st;

    /* A root with nothing in it yet. */
    list_str(tu_scratch_root(), buf, sizeof buf);
    ASSERT_STR_EQ(buf, "");

    st = tu_open("zeta", 0, 1);
    tu_populate(st, "t", 1, 4, 8, 0);
    engram_store_close(st);
    engram_store_close(tu_open("alpha", 0, 1));
    engram_store_close(tu_open("m:1", 0, 1));
    /* Left out: a file, a link to a namespace, a directory whose name is
     * not a valid namespace name. */
    tu_path(p, sizeof p, "file-not-ns");
    close(open(p, O_WRONLY | O_CREAT, 0600));
    tu_path(p, sizeof p, "link-to-alpha");
    tu_path(target, sizeof target, "alpha");
    ASSERT(symlink(target, p) == 0);
    tu_path(p, sizeof p, ".hidden");
    ASSERT(mkdir(p, 0700) == 0);
    list_str(tu_scratch_root(), buf, sizeof buf);
    ASSERT_STR_EQ(buf, "alpha,m:1,zeta");

    /* A missing root, a root that is a file or a link. */
    tu_path(p, sizeof p, "no-such-root");
    ASSERT_ERR(engram_namespace_list(p, &names, &count), -ENOENT);
    ASSERT_CONTAINS(engram_errmsg(), "no-such-root");
    ASSERT(names == NULL && count == 0);
    tu_path(p, sizeof p, "file-not-ns");
    ASSERT_ERR(engram_namespace_list(p, &names, &count), ENGRAM_EUNSAFE);
    tu_path(p, sizeof p, "link-to-alpha");
    ASSERT_ERR(engram_namespace_list(p, &names, &count), ENGRAM_EUNSAFE);
    ASSERT_ERR(engram_namespace_list(tu_scratch_root(), NULL, &count), -EINVAL);
    ASSERT_ERR(engram_namespace_list(tu_scratch_root(), &names, NULL), -EINVAL);

    tu_path(p, sizeof p, "file-not-ns");
    unlink(p);
    tu_path(p, sizeof p, "link-to-alpha");
    unlink(p);
    tu_path(p, sizeof p, ".hidden");
    rmdir(p);
}

static void test_remove(void)
{
    const char *root = tu_scratch_root();
    char buf[512];
    engram_store *st;
    engram_table_id id;

    /* An empty namespace goes without the flag. */
    engram_store_close(tu_open("empty", 0, 1));
    ASSERT_OK(engram_namespace_remove(root, "empty", 0));
    ASSERT(!ns_exists("empty"));
    ASSERT_ERR(engram_namespace_remove(root, "empty", 0), -ENOENT);

    /* Tables: refused without the flag, naming them, and nothing removed. */
    st = tu_open("full", 0, 1);
    tu_populate(st, "a", 1, 4, 8, 0);
    tu_populate(st, "b", 2, 4, 8, 0);
    tu_populate(st, "c", 3, 4, 8, 0);
    tu_populate(st, "d", 4, 4, 8, 0);
    ASSERT_OK(engram_table_open(st, "a", &id));
    ASSERT_ERR(engram_namespace_remove(root, "full", 0), -ENOTEMPTY);
    ASSERT_CONTAINS(engram_errmsg(), "4 tables");
    ASSERT_CONTAINS(engram_errmsg(), "'a', 'b', 'c', ...");
    tu_check_named(st, "d", 4, 4, 8);

    /* With the flag: tables and directory go.  The store that mapped 'a'
     * keeps serving what it mapped (as after engram_remove()), and cannot
     * write in the removed namespace. */
    ASSERT_OK(engram_namespace_remove(root, "full", ENGRAM_NS_REMOVE_TABLES));
    ASSERT(!ns_exists("full"));
    tu_check_table(st, id, 1, 4, 8);
    {
        engram_table_spec spec = {1, 8, 0};
        unsigned char row[8] = {0};
        int rc;
        ASSERT_FAILS(engram_populate(st, "e", &spec, row, 0), rc);
    }
    engram_store_close(st);
    list_str(root, buf, sizeof buf);
    ASSERT(strstr(buf, "full") == NULL);

    /* Bad arguments. */
    ASSERT_ERR(engram_namespace_remove(root, "../x", 0), ENGRAM_ESPEC);
    ASSERT_ERR(engram_namespace_remove(root, "x", 0x80), -EINVAL);
    ASSERT_ERR(engram_namespace_remove(root, "never-made", 0), -ENOENT);
}

/* Entries the library did not write stop the removal, flag or not, and
 * nothing is removed. */
static void test_remove_refuses_foreign_entries(void)
{
    const char *root = tu_scratch_root();
    const char *what[] = {"notes.txt", "sub", "link", ".keep"};
    char p[512];

    for (int k = 0; k < 4; k++) {
        engram_store *st = tu_open("mixed", 0, 1);
        tu_populate(st, "t", 5, 4, 8, 0);
        tu_path(p, sizeof p, "mixed/");
        strcat(p, what[k]);
        if (k == 0) {
            int fd = open(p, O_WRONLY | O_CREAT, 0600);
            ASSERT(fd >= 0 && write(fd, "hello\n", 6) == 6);
            close(fd);
        } else if (k == 1) {
            ASSERT(mkdir(p, 0700) == 0);
        } else if (k == 2) {
            ASSERT(symlink("t", p) == 0);
        } else {
            close(open(p, O_WRONLY | O_CREAT, 0600));
        }
        ASSERT_ERR(engram_namespace_remove(root, "mixed", ENGRAM_NS_REMOVE_TABLES), -ENOTEMPTY);
        ASSERT_CONTAINS(engram_errmsg(), what[k]);
        ASSERT_CONTAINS(engram_errmsg(), "not removing it");
        tu_check_named(st, "t", 5, 4, 8);
        engram_store_close(st);
        if (k == 1)
            rmdir(p);
        else
            unlink(p);
        /* Once it is gone, the removal goes through. */
        ASSERT_OK(engram_namespace_remove(root, "mixed", ENGRAM_NS_REMOVE_TABLES));
        ASSERT(!ns_exists("mixed"));
    }
}

/* A writer that is still writing: -EBUSY naming its table, and its table
 * can still be published.  A writer that died left a temporary file that
 * the removal's open cleans up. */
static void test_remove_with_writers(void)
{
    const char *root = tu_scratch_root();
    engram_table_spec spec = {4, 8, 0};
    unsigned char rows[32] = {0};
    engram_writer *w;
    engram_store *st = tu_open("busy", 0, 1);
    pid_t pid;
    int status;

    ASSERT_OK(engram_writer_begin(st, "in.flight", &spec, &w));
    ASSERT_ERR(engram_namespace_remove(root, "busy", ENGRAM_NS_REMOVE_TABLES), -EBUSY);
    ASSERT_CONTAINS(engram_errmsg(), "table 'in.flight' is being written");
    ASSERT_OK(engram_writer_append(w, rows, 4, 0));
    ASSERT_OK(engram_writer_commit(w));
    {
        engram_table_info info = ENGRAM_TABLE_INFO_INIT;
        ASSERT_OK(engram_get_table_info(st, "in.flight", &info));
        ASSERT_EQ_U64(info.spec.num_rows, 4);
    }
    engram_store_close(st);

    /* A writer killed mid-way. */
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        engram_store *cst = NULL;
        engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
        o.threads = 1;
        if (engram_store_open(root, "busy", &o, &cst) != 0 ||
            engram_writer_begin(cst, "dead", &spec, &w) != 0)
            _exit(1);
        _exit(0); /* no abort: the temporary file stays */
    }
    ASSERT(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ASSERT_OK(engram_namespace_remove(root, "busy", ENGRAM_NS_REMOVE_TABLES));
    ASSERT(!ns_exists("busy"));
}

/* ENGRAM_ROOT names the default root; an empty one is ignored. */
static void test_env_root(void)
{
    struct stat sb;
    const char *builtin = (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode)) ? "/dev/shm/engram"
                                                                             : "/tmp/engram";
    char buf[512];
    engram_store *st = NULL;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;

    ASSERT(setenv("ENGRAM_ROOT", tu_scratch_root(), 1) == 0);
    ASSERT_STR_EQ(engram_default_root(), tu_scratch_root());
    /* Every function that takes root NULL uses it. */
    o.flags = ENGRAM_OPEN_CREATE;
    o.threads = 1;
    ASSERT_OK(engram_store_open(NULL, "via-env", &o, &st));
    tu_populate(st, "t", 9, 3, 8, 0);
    engram_store_close(st);
    ASSERT(ns_exists("via-env/t"));
    list_str(NULL, buf, sizeof buf);
    ASSERT(strstr(buf, "via-env") != NULL);
    ASSERT_ERR(engram_namespace_remove(NULL, "via-env", 0), -ENOTEMPTY);
    ASSERT_OK(engram_namespace_remove(NULL, "via-env", ENGRAM_NS_REMOVE_TABLES));
    ASSERT(!ns_exists("via-env"));

    ASSERT(setenv("ENGRAM_ROOT", "", 1) == 0);
    ASSERT_STR_EQ(engram_default_root(), builtin);
    ASSERT(unsetenv("ENGRAM_ROOT") == 0);
    ASSERT_STR_EQ(engram_default_root(), builtin);
}

int main(void)
{
    tu_watchdog(120);
    /* This test decides the variable itself. */
    unsetenv("ENGRAM_ROOT");
    RUN_TEST(test_list);
    RUN_TEST(test_remove);
    RUN_TEST(test_remove_refuses_foreign_entries);
    RUN_TEST(test_remove_with_writers);
    RUN_TEST(test_env_root);
    printf("test_namespace: all passed\n");
    return 0;
}
