/*
 * bench_pull.c - engram_pull() of a table from a Redis Cluster into a
 * namespace on /dev/shm, against a bare hiredis client reading the same
 * bytes in one bulk pipelined call, in one run.
 *
 *   bench_pull [--mib N] [--reps N] [--quick]
 *
 * It starts its own cluster: 3 redis-server processes (masters, no
 * replicas) on free loopback ports of 127.0.0.1, stopped by PID at exit.
 * It pushes one table of --mib MiB (1024) of 264-byte rows in 1 MiB chunk
 * keys spread over the masters, then times, alternating which runs
 * first:
 *
 *   bare    a hiredis client written here: one connection per master,
 *           every chunk's GET appended to its master's connection, all
 *           masters' commands written before any reply is read, then the
 *           replies read master by master and copied into one buffer of
 *           the table's size.  No checks, nothing written anywhere: the
 *           floor of reading the bytes over the network.
 *   pull    engram_pull() into a fresh namespace on /dev/shm: the same
 *           bytes read in pipelined batches from every master at once,
 *           each chunk checked (XXH3) as it comes, written to a table
 *           file (capacity check, space reserved, synced, checksummed)
 *           and published; the table is removed after each timing.
 *
 * It prints the median, min and max of --reps (5) repetitions of each,
 * their rates, the ratio of the medians (bare's time / pull's: the goal
 * is at least 0.8) and the load average.  The pulled table's rows are
 * checked once against the pushed ones (its checksum), and bare's bytes
 * once against the table's.  --quick: 32 MiB, 3 repetitions.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include "xxh.h"

#include "engram.h"
#include "bench_util.h"
#include "redis/cluster.h"
#include "redis_util.h"

enum { ROW = 264, MASTERS = 3 };

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Reads every chunk of the table with GET, all masters' commands out
 * before any reply is read, into buf. */
static void bare_read(tr_cluster *cl, redisContext **c, const char *kpre, uint64_t nchunks,
                      uint64_t chunk_bytes, uint64_t total, unsigned char *buf)
{
    uint64_t *order = malloc(nchunks * sizeof *order);
    uint64_t cnt[MASTERS + 1] = {0}, pos[MASTERS];
    int *node = malloc(nchunks * sizeof *node);
    if (!order || !node)
        bench_die("bench_pull", "out of memory");
    for (uint64_t i = 0; i < nchunks; i++) {
        char key[256];
        const char *argv[2] = {"GET", key};
        size_t lens[2] = {3, (size_t)snprintf(key, sizeof key, "%s%" PRIu64, kpre, i)};
        node[i] = tr_slot_owner(cl, 0, engram__rcl_keyslot(key, lens[1]));
        if (node[i] < 0 || node[i] >= MASTERS)
            bench_die("bench_pull", "slot map");
        redisAppendCommandArgv(c[node[i]], 2, argv, lens);
        cnt[node[i] + 1]++;
    }
    for (int k = 0; k < MASTERS; k++) {
        cnt[k + 1] += cnt[k];
        pos[k] = cnt[k];
    }
    for (uint64_t i = 0; i < nchunks; i++)
        order[pos[node[i]]++] = i;
    for (int k = 0; k < MASTERS; k++) {
        int done = 0;
        while (!done)
            if (redisBufferWrite(c[k], &done) != REDIS_OK)
                bench_die("bench_pull", "write");
    }
    for (int k = 0; k < MASTERS; k++)
        for (uint64_t j = cnt[k]; j < cnt[k + 1]; j++) {
            uint64_t i = order[j], len = i + 1 < nchunks ? chunk_bytes : total - i * chunk_bytes;
            redisReply *r;
            if (redisGetReply(c[k], (void **)&r) != REDIS_OK || r->type != REDIS_REPLY_STRING ||
                r->len != len)
                bench_die("bench_pull", "a GET failed");
            memcpy(buf + i * chunk_bytes, r->str, len);
            freeReplyObject(r);
        }
    free(order);
    free(node);
}

static void report(const char *what, double *t, int n, double mib)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    printf("%-6s median %8.1f ms (%7.1f to %7.1f)  %7.0f MiB/s\n", what, t[n / 2] * 1e3,
           t[0] * 1e3, t[n - 1] * 1e3, mib / t[n / 2]);
}

int main(int argc, char **argv)
{
    double mib = 1024, *tb, *tp, load[1] = {0};
    int reps = 5;
    tr_cluster cl;
    engram_redis_options ro = ENGRAM_REDIS_OPTIONS_INIT;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    engram_store *remote, *local;
    redisContext *c[MASTERS];
    redisReply *r;
    unsigned char *rows, *buf;
    uint64_t nrows, total, chunk_rows, chunk_bytes, nchunks, sum;
    char root[] = "/dev/shm/engram-bench-pull.XXXXXX", kpre[256], epoch[17] = "";
    int rc;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            mib = 32;
            reps = 3;
        } else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
            mib = atof(argv[++i]);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_pull [--mib N] [--reps N] [--quick]\n");
            return 2;
        }
    }
    if (mib < 1 || reps < 1 || reps > 100) {
        fprintf(stderr, "bench_pull: --mib is at least 1, --reps 1..100\n");
        return 2;
    }
    if ((rc = tr_start(&cl, MASTERS, 0, NULL, NULL)) != 0)
        return rc;
    nrows = (uint64_t)(mib * 1048576.0 / ROW);
    total = nrows * ROW;
    if (!(rows = malloc(total)) || !(buf = malloc(total)) ||
        !(tb = calloc((size_t)reps, sizeof *tb)) || !(tp = calloc((size_t)reps, sizeof *tp)))
        bench_die("bench_pull", "out of memory");
    {
        uint64_t s = 42;
        for (uint64_t i = 0; i < total / 8; i++)
            ((uint64_t *)rows)[i] = bench_rng(&s);
    }
    if (engram_store_open_redis(cl.nodes, "bench", NULL, &ro, &remote) != 0 ||
        engram_populate(remote, "pull", &(engram_table_spec){nrows, ROW, 0}, rows, 0) != 0 ||
        engram_get_table_info(remote, "pull", &info) != 0)
        bench_die("bench_pull", "push");
    sum = info.checksum;
    /* The chunks' keys, from the manifest. */
    r = tr_must(&cl, tr_slot_owner(&cl, 0, engram__rcl_keyslot("engram/bench/.manifests", 23)),
                "HGET engram/bench/.manifests pull");
    {
        const char *e = r->type == REDIS_REPLY_STRING ? strstr(r->str, "\nepoch ") : NULL;
        const char *cr = r->type == REDIS_REPLY_STRING ? strstr(r->str, "\nchunk_rows ") : NULL;
        if (!e || !cr)
            bench_die("bench_pull", "manifest");
        memcpy(epoch, e + 7, 16);
        chunk_rows = strtoull(cr + 12, NULL, 10);
    }
    freeReplyObject(r);
    snprintf(kpre, sizeof kpre, "engram/bench/pull/%s/", epoch);
    chunk_bytes = chunk_rows * ROW;
    nchunks = (nrows + chunk_rows - 1) / chunk_rows;
    for (int k = 0; k < MASTERS; k++)
        if (!(c[k] = tr_connect(&cl, k)))
            bench_die("bench_pull", "connect");
    if (!mkdtemp(root))
        bench_die("bench_pull", "mkdtemp");
    o.flags = ENGRAM_OPEN_CREATE;
    o.threads = 1;
    if (engram_store_open(root, "bench", &o, &local) != 0)
        bench_die("bench_pull", "local namespace");
    printf("bench_pull: libengram %s; %s; one table of %" PRIu64 " rows of %d bytes (%.0f MiB) "
           "in %" PRIu64 " chunks of %" PRIu64 " KiB; pulled into %s; %d reps\n",
           engram_version_string(), cl.nodes, nrows, ROW, (double)total / 1048576.0, nchunks,
           chunk_bytes >> 10, root, reps);

    for (int rep = 0; rep < reps; rep++)
        for (int j = 0; j < 2; j++) {
            int which = (rep + j) % 2; /* 0: bare, 1: pull; who goes first alternates */
            uint64_t t0 = bench_now_ns();
            if (which == 0) {
                bare_read(&cl, c, kpre, nchunks, chunk_bytes, total, buf);
                tb[rep] = (double)(bench_now_ns() - t0) / 1e9;
                if (rep == 0 && XXH3_64bits(buf, total) != sum)
                    bench_die("bench_pull", "bare's bytes differ from the table's");
            } else {
                int written = 0;
                if (engram_pull(local, remote, "pull", NULL, NULL, &written) != 0 || !written)
                    bench_die("bench_pull", "engram_pull");
                tp[rep] = (double)(bench_now_ns() - t0) / 1e9;
                if (rep == 0) {
                    engram_table_info li = ENGRAM_TABLE_INFO_INIT;
                    if (engram_get_table_info(local, "pull", &li) != 0 || li.checksum != sum)
                        bench_die("bench_pull", "the pulled table differs");
                }
                if (engram_remove(local, "pull") != 0)
                    bench_die("bench_pull", "remove");
            }
        }
    getloadavg(load, 1);
    report("bare", tb, reps, (double)total / 1048576.0);
    report("pull", tp, reps, (double)total / 1048576.0);
    printf("pull / bare (bare's median time / pull's): %.2fx (goal: >= 0.8x); load average "
           "%.2f\n",
           tb[reps / 2] / tp[reps / 2], load[0]);

    engram_store_close(local);
    engram_namespace_remove(root, "bench", 0);
    rmdir(root);
    for (int k = 0; k < MASTERS; k++)
        redisFree(c[k]);
    engram_remove(remote, "pull");
    engram_store_close(remote);
    tr_stop(&cl);
    free(rows);
    free(buf);
    free(tb);
    free(tp);
    return 0;
}
