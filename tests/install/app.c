/* An application of an installed engram: tests/install/run.sh builds it
 * with pkg-config and with find_package(engram), against the shared and
 * the static library, and runs it.  It opens a store in the directory
 * argv[1], creates a table, looks rows up and checks them, so compiling,
 * linking and loading the installed library are all exercised.  Prints
 * "app: engram VERSION ok" and exits 0, or says what failed and exits 1. */
#include <engram.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#define ROWS 5
#define ROW_BYTES 16

static int fail(const char *what, int rc)
{
    fprintf(stderr, "app: %s: %s (%d): %s\n", what, engram_strerror(rc), rc, engram_errmsg());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: app STORE_DIR\n");
        return 2;
    }
    /* The header and the library loaded are the same release. */
    if (engram_version_number() != ENGRAM_VERSION_NUMBER) {
        fprintf(stderr, "app: engram.h is %d but the library is %u (%s)\n", ENGRAM_VERSION_NUMBER,
                engram_version_number(), engram_version_string());
        return 1;
    }

    engram_store_options opts = ENGRAM_STORE_OPTIONS_INIT;
    opts.flags = ENGRAM_OPEN_CREATE;
    engram_store *st;
    int rc = engram_store_open(argv[1], "install-test", &opts, &st);
    if (rc != 0)
        return fail("engram_store_open", rc);

    unsigned char rows[ROWS][ROW_BYTES];
    for (int r = 0; r < ROWS; r++)
        memset(rows[r], 3 * r + 1, ROW_BYTES);
    engram_table_spec spec = {ROWS, ROW_BYTES, 0};
    rc = engram_populate(st, "t", &spec, rows, 0);
    if (rc != 0 && rc != -EEXIST) /* EEXIST: the same table from an earlier run */
        return fail("engram_populate", rc);
    engram_table_id table;
    rc = engram_table_open(st, "t", &table);
    if (rc != 0)
        return fail("engram_table_open", rc);

    int64_t ids[3] = {4, 0, 2};
    unsigned char out[3][ROW_BYTES];
    memset(out, 0xEE, sizeof out);
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.num_tokens = 3;
    a.num_cols = 1;
    a.tables = &table;
    a.ids = ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = out;
    rc = engram_lookup(st, &a);
    if (rc != 0)
        return fail("engram_lookup", rc);
    for (int t = 0; t < 3; t++)
        for (int b = 0; b < ROW_BYTES; b++)
            if (out[t][b] != 3 * ids[t] + 1) {
                fprintf(stderr, "app: out[%d][%d] = %d, expected %d\n", t, b, out[t][b],
                        (int)(3 * ids[t] + 1));
                return 1;
            }

    ids[1] = ROWS; /* outside the table: refused, the output untouched */
    rc = engram_lookup(st, &a);
    if (rc != ENGRAM_EBADID) {
        fprintf(stderr, "app: a lookup of id %d in a table of %d rows returned %d\n", ROWS, ROWS,
                rc);
        return 1;
    }

    engram_store_close(st);
    printf("app: engram %s ok\n", engram_version_string());
    return 0;
}
