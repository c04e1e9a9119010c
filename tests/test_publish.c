/*
 * test_publish.c - the conformance suite of the publication protocol
 * (src/publish.c), run against every implementation of kv.h: kv_mem
 * (tests/kv_mem.c: always) and a Redis Cluster of the test's own (3
 * masters, src/redis/kv.c: in a build with hiredis).  What a store
 * must give the protocol is kv.h; what the protocol must make of it,
 * whatever fails, is checked here the same way on each.
 *
 * Every case drives the protocol through publish.h only, on a namespace
 * of its own, through the fault decorator (tests/kv_fault.c), which
 * fails, loses or holds back (to land later) the operation a case aims
 * at, kills a writer at any step, and records every piece ever written so
 * that what is left can be asked of the store itself:
 *
 *  - push_read: a push reads back exact; list, manifest; -EEXIST for a
 *    second push; an open push is neither listed nor readable; abort;
 *  - racing_pushes: 4 threads push one name: one wins, the rest get
 *    -EEXIST, nothing of theirs is left;
 *  - remove_race: a removal and a push of the name again, at once, over
 *    and over, while a reader reads: every table read is whole and exact;
 *  - killed_writer / killed_remover: a push (a removal) killed at each
 *    of its steps in turn: nothing half shows, and a gc leaves nothing;
 *  - lost_publish, deferred_publish, in_doubt: the publication's reply
 *    lost, the publication held back and landing late, and the asking
 *    after it failing or lost too (ENGRAM_EINDOUBT);
 *  - remove_lost: a removal's reply lost, and a removal held back that
 *    lands after the name was pushed again;
 *  - gc_live: gc keeps a live push and settles a dead and a stalled one;
 *  - sync_order: each step that must be on a store's replicas before the
 *    next is followed by a sync (what no store without replicas shows).
 *
 * and first, what the cases rest on: kv_contract checks the store
 * against kv.h directly, fault_harness the decorator against the store.
 *
 * After each case, a gc leaves no pending record and no piece but those
 * of the tables listed (kv_mem also counts everything it holds).  No
 * assertion rests on timing: waits for what must happen are bounded by
 * a minute.
 *
 * Usage: test_publish [mem | redis | CASE | -mem | -redis | -CASE]...
 * (no implementation named: every one built; no case named: all).
 * Without redis-server the Redis runner is skipped, unless
 * ENGRAM_REQUIRE_REDIS=1.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "xxh.h"

#include "testutil.h"

#include "common.h"
#include "kv_fault.h"
#include "kv_mem.h"
#include "publish.h"

#if defined(ENGRAM_TEST_REDIS)
#include "redis_util.h"
#endif

enum {
    RB = 24,           /* row bytes */
    CHUNK_ROWS = 4,    /* rows per chunk: chunk_bytes = CHUNK_ROWS * RB */
    NROWS = 14,        /* a table: 4 chunks, the last one short */
    NCHUNKS = 4,
    WAIT_MS = 60000,   /* the longest wait for what must happen */
};

/* The manifest's and a closed pending record's first bytes (manifest.h). */
#define MANIFEST_HEAD ENGRAM__RM_MAGIC "\n"
#define PENDING_HEAD ENGRAM__RP_MAGIC "\n"
#define CLOSED_HEAD ENGRAM__RP_MAGIC "\nstate closed\n"

/* A case's namespace: the implementation under test, and the same
 * through the fault decorator, which the case uses. */
typedef struct ctx {
    engram__pub raw;
    engram__pub p;
    kvf *f;
    void *h; /* the implementation's handle */
} ctx;

static uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------
 * Pushing and reading.
 */

static unsigned char *rows_of(uint32_t seed, uint64_t nrows)
{
    return tu_make_rows(seed, nrows, RB, RB, 0);
}

/* Appends rows [from, to) of `rows`, three at a time (so that chunks
 * are filled across appends); on a failure the writer is aborted. */
static int append_rows(void *w, const unsigned char *rows, uint64_t from, uint64_t to)
{
    for (uint64_t i = from; i < to; i += 3) {
        uint64_t n = to - i < 3 ? to - i : 3;
        int err = engram__pub_writer_append(w, rows + i * RB, n, RB);
        if (err) {
            engram__pub_writer_abort(w);
            return err;
        }
    }
    return 0;
}

/* Pushes table `name` of nrows rows of pattern `seed`: 0, or the
 * failure of begin, of an append (then aborted), or of commit. */
static int push(const engram__pub *p, const char *name, uint32_t seed, uint64_t nrows)
{
    engram_table_spec spec = {nrows, RB, 0};
    unsigned char *rows = rows_of(seed, nrows);
    void *w;
    int err = engram__pub_writer_begin(p, name, &spec, &w);
    if (!err && (err = append_rows(w, rows, 0, nrows)) == 0)
        err = engram__pub_writer_commit(w);
    free(rows);
    return err;
}

/* A sink (remote.h) that copies a table, checking the order of calls. */
typedef struct copy_sink {
    engram_table_spec spec;
    uint64_t checksum;
    unsigned char *buf;
    uint64_t rows;
    int begun;
    int in_place; /* read into buf by read_all itself (the sink's region()) */
} copy_sink;

static int cs_begin(void *ud, const engram_table_spec *spec, uint64_t checksum)
{
    copy_sink *k = ud;
    ASSERT(!k->begun);
    ASSERT_EQ(spec->row_pitch, 0);
    k->begun = 1;
    k->spec = *spec;
    k->checksum = checksum;
    k->buf = tu_xmalloc((size_t)(spec->num_rows * spec->row_bytes));
    return 0;
}

static int cs_rows(void *ud, const void *rows, uint64_t n)
{
    copy_sink *k = ud;
    ASSERT(k->begun);
    ASSERT_LE(k->rows + n, k->spec.num_rows);
    if (k->in_place) /* the next rows, where they already are */
        ASSERT(rows == k->buf + k->rows * k->spec.row_bytes);
    else
        memcpy(k->buf + k->rows * k->spec.row_bytes, rows, (size_t)(n * k->spec.row_bytes));
    k->rows += n;
    return 0;
}

static unsigned char *cs_region(void *ud)
{
    copy_sink *k = ud;
    ASSERT(k->begun);
    return k->in_place ? k->buf : NULL;
}

/* Reads table `name` whole into *k (free k->buf): read_all's result;
 * on 0, every row came, and the rows are those of the checksum.  Every
 * other read is made in place (into the sink's memory). */
static int read_table(const engram__pub *p, const char *name, copy_sink *k)
{
    static atomic_uint reads;
    engram__remote_sink sink = {cs_begin, cs_rows, NULL, k, cs_region};
    int err;
    memset(k, 0, sizeof *k);
    k->in_place = atomic_fetch_add(&reads, 1) & 1;
    err = engram__pub_read_all(p, name, &sink);
    if (err == 0) {
        ASSERT(k->begun);
        ASSERT_EQ_U64(k->rows, k->spec.num_rows);
        ASSERT_EQ_U64(XXH3_64bits(k->buf, (size_t)(k->rows * k->spec.row_bytes)), k->checksum);
    }
    return err;
}

static int manifest_of(const engram__pub *p, const char *name, engram__rmanifest *m)
{
    void *s;
    int err;
    ASSERT_OK(p->vt->sess_get(p->kv, &s));
    err = engram__pub_manifest(p, s, name, m, NULL, NULL);
    p->vt->sess_put(p->kv, s);
    return err;
}

typedef struct list_seen {
    const char *name;
    int hits, all;
} list_seen;

static int list_add(void *ud, const char *name)
{
    list_seen *l = ud;
    l->hits += strcmp(name, l->name) == 0;
    l->all++;
    return 0;
}

/* How many times the list names table `name` (0 or 1). */
static int listed(const engram__pub *p, const char *name)
{
    list_seen l = {name, 0, 0};
    ASSERT_OK(engram__pub_list(p, list_add, &l));
    ASSERT_LE(l.hits, 1);
    return l.hits;
}

/* Table `name` is published, exactly nrows rows of pattern `seed` as
 * pushed through p, listed once and described by its manifest: returns
 * its epoch. */
static uint64_t check_table(const engram__pub *p, const char *name, uint32_t seed,
                            uint64_t nrows)
{
    unsigned char *want = rows_of(seed, nrows);
    engram__rmanifest m;
    copy_sink k;
    uint64_t epoch;
    ASSERT_OK(read_table(p, name, &k));
    ASSERT_EQ_U64(k.spec.num_rows, nrows);
    ASSERT_EQ(k.spec.row_bytes, RB);
    for (uint64_t i = 0; i < nrows; i++)
        ASSERT_ROW(k.buf + i * RB, seed, i, RB);
    ASSERT_EQ_U64(k.checksum, XXH3_64bits(want, (size_t)(nrows * RB)));
    free(k.buf);
    ASSERT_OK(manifest_of(p, name, &m));
    ASSERT_STR_EQ(m.name, name);
    ASSERT_EQ_U64(m.num_rows, nrows);
    ASSERT_EQ(m.row_bytes, RB);
    /* Whole rows per chunk, no more than chunk_bytes holds. */
    ASSERT_GE(m.chunk_rows, 1);
    ASSERT_LE(m.chunk_rows * RB, p->chunk_bytes);
    ASSERT_EQ_U64(m.nchunks, engram__rm_nchunks(nrows, m.chunk_rows));
    ASSERT_EQ(m.tagged, p->layout);
    ASSERT_EQ_U64(m.checksum, k.checksum);
    ASSERT_NE(m.epoch, 0);
    epoch = m.epoch;
    engram__rmanifest_free(&m);
    ASSERT_EQ(listed(p, name), 1);
    free(want);
    return epoch;
}

/* Nothing of table `name` can be read. */
static void check_absent(const engram__pub *p, const char *name)
{
    engram__rmanifest m;
    copy_sink k;
    ASSERT_ERR(manifest_of(p, name, &m), -ENOENT);
    ASSERT_ERR(read_table(p, name, &k), -ENOENT);
    ASSERT(!k.begun);
    ASSERT_EQ(listed(p, name), 0);
}

/* The epoch of published table `name`, or 0 if it is not. */
static uint64_t epoch_of(const engram__pub *p, const char *name)
{
    engram__rmanifest m;
    uint64_t e;
    int err = manifest_of(p, name, &m);
    if (err == -ENOENT)
        return 0;
    ASSERT_OK(err);
    e = m.epoch;
    engram__rmanifest_free(&m);
    return e;
}

/* ------------------------------------------------------------------------
 * What is left: records (asked of the store itself) and pieces (the
 * decorator's record of what was written, asked of the store).
 */

typedef struct recs_seen {
    const char *name; /* NULL: every record */
    int manifests;    /* of `name` */
    int others;       /* pending records (anything but a manifest) */
} recs_seen;

/* 1 if record `rname` of val[len] is table `name`'s: under its name, or
 * a record that names it (a pending record kept under another name). */
static int rec_is_of(const char *rname, const char *val, size_t len, const char *name)
{
    char line[ENGRAM_NAME_MAX + 16];
    int n = snprintf(line, sizeof line, "\nname %s\n", name);
    return strcmp(rname, name) == 0 || memmem(val, len, line, (size_t)n) != NULL;
}

static int recs_each(void *ud, const char *rname, const char *val, size_t len)
{
    recs_seen *r = ud;
    size_t mh = strlen(MANIFEST_HEAD);
    if (r->name && !rec_is_of(rname, val, len, r->name))
        return 0;
    if (len >= mh && memcmp(val, MANIFEST_HEAD, mh) == 0)
        r->manifests++;
    else
        r->others++;
    return 0;
}

static recs_seen records_of(const ctx *c, const char *name)
{
    recs_seen r = {name, 0, 0};
    void *s;
    ASSERT_OK(c->raw.vt->sess_get(c->raw.kv, &s));
    ASSERT_OK(c->raw.vt->rec_list(c->raw.kv, s, recs_each, &r));
    c->raw.vt->sess_put(c->raw.kv, s);
    return r;
}

static long pieces_left(const ctx *c, const char *name, uint64_t keep_epoch)
{
    long n = kvf_pieces_left(c->f, name, keep_epoch);
    if (n < 0) {
        TU_FAIL_HEAD(__FILE__, __LINE__);
        fprintf(stderr, "pieces of '%s': %s\n", name, engram_errmsg());
        tu_fail_exit();
    }
    return n;
}

/* Nothing of `name` is left but, if keep_epoch, its table of that epoch
 * (its manifest, and no piece of another epoch). */
static int settled(const ctx *c, const char *name, uint64_t keep_epoch)
{
    recs_seen r = records_of(c, name);
    return r.others == 0 && r.manifests == (keep_epoch != 0) &&
           pieces_left(c, name, keep_epoch) == 0;
}

typedef struct gc_notes {
    int failed;
    char last[ENGRAM__ERRMSG_MAX + ENGRAM_NAME_MAX + 8];
} gc_notes;

static void gc_note(void *ud, const char *name, int code, const char *detail)
{
    gc_notes *g = ud;
    if (code < 0) {
        g->failed++;
        snprintf(g->last, sizeof g->last, "%s: %s", name, detail);
    }
}

/* Runs gc (idle 0) until `name` is settled (settled() above): it must
 * be within a minute. */
static void gc_settle(const ctx *c, const char *name, uint64_t keep_epoch)
{
    uint64_t t0 = ms_now();
    gc_notes g = {0, ""};
    for (;;) {
        ASSERT_OK(engram__pub_gc(&c->p, 0, 0, gc_note, &g));
        if (settled(c, name, keep_epoch))
            break;
        if (ms_now() - t0 > WAIT_MS) {
            recs_seen r = records_of(c, name);
            TU_FAIL_HEAD(__FILE__, __LINE__);
            fprintf(stderr, "'%s' is not settled after %d s of gc: %d manifests, %d pending "
                            "records, %ld pieces of other epochs than %016" PRIx64
                            " (gc failures: %d, the last: %s)\n",
                    name, WAIT_MS / 1000, r.manifests, r.others,
                    pieces_left(c, name, keep_epoch), keep_epoch, g.failed, g.last);
            tu_fail_exit();
        }
        sleep_ms(20);
    }
}

/* ------------------------------------------------------------------------
 * The end of every case: a gc settles everything, and what is left is
 * the tables listed, whole.
 */

/* One table listed, for the end check. */
typedef struct table_at {
    char name[ENGRAM_NAME_MAX + 1];
    uint64_t epoch, nchunks;
} table_at;

typedef struct tables {
    table_at v[256];
    size_t n;
    uint64_t chunks;
} tables;

static int tables_add(void *ud, const engram__rmanifest *m)
{
    tables *t = ud;
    ASSERT_LT(t->n, sizeof t->v / sizeof *t->v);
    snprintf(t->v[t->n].name, sizeof t->v[t->n].name, "%s", m->name);
    t->v[t->n].epoch = m->epoch;
    t->v[t->n].nchunks = m->nchunks;
    t->chunks += m->nchunks;
    t->n++;
    return 0;
}

/* A piece is kept if it is of a table listed, of its epoch. */
static int piece_listed(void *ud, const char *name, uint64_t epoch)
{
    const tables *t = ud;
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].epoch == epoch && strcmp(t->v[i].name, name) == 0)
            return 1;
    return 0;
}

/* What kv_mem holds in all, where the implementation is kv_mem, and a
 * listing of its pieces (on stderr) for a failure to show. */
static void (*census)(void *h, size_t *records, size_t *pieces);
static void (*census_dump)(void *h);

static void end_check(ctx *c)
{
    uint64_t t0 = ms_now();
    tables t;
    recs_seen r;
    long stray;
    void *s;
    for (;;) {
        memset(&t, 0, sizeof t);
        ASSERT_OK(engram__pub_gc(&c->p, 0, 0, NULL, NULL));
        ASSERT_OK(c->p.vt->sess_get(c->p.kv, &s));
        ASSERT_OK(engram__pub_manifests(&c->p, s, tables_add, &t));
        c->p.vt->sess_put(c->p.kv, s);
        r = records_of(c, NULL);
        /* Pieces written after a gc settled their push (a stalled
         * writer's) expire: they may take their TTL. */
        if ((stray = kvf_pieces_left_unless(c->f, piece_listed, &t)) < 0) {
            TU_FAIL_HEAD(__FILE__, __LINE__);
            fprintf(stderr, "pieces: %s\n", engram_errmsg());
            tu_fail_exit();
        }
        if (r.others == 0 && stray == 0)
            break;
        if (ms_now() - t0 > WAIT_MS) {
            TU_FAIL_HEAD(__FILE__, __LINE__);
            fprintf(stderr, "after %d s of gc: %d pending records, %ld pieces of no table "
                            "listed\n",
                    WAIT_MS / 1000, r.others, stray);
            tu_fail_exit();
        }
        sleep_ms(20);
    }
    ASSERT_EQ(r.manifests, t.n);
    /* Every table listed is whole (check_table() read each in its case;
     * here each of its pieces is there). */
    for (size_t i = 0; i < t.n; i++)
        ASSERT_EQ(pieces_left(c, t.v[i].name, 0), t.v[i].nchunks);
    if (census) {
        size_t records, pieces;
        census(c->h, &records, &pieces);
        if (records != t.n || pieces != t.chunks)
            census_dump(c->h);
        ASSERT_EQ(records, t.n);
        ASSERT_EQ(pieces, t.chunks);
    }
}

/* ------------------------------------------------------------------------
 * The cases.
 */

/* A push reads back exact, once listed and described; a second push of
 * the name fails; a push under way is invisible; an abort leaves
 * nothing. */
static void case_push_read(ctx *c)
{
    engram_table_spec spec = {NROWS, RB, 0};
    unsigned char *rows = rows_of(2, NROWS);
    engram__rmanifest m;
    copy_sink k;
    void *w, *w2;
    uint64_t e;

    ASSERT_OK(push(&c->p, "t", 1, NROWS));
    e = check_table(&c->p, "t", 1, NROWS);
    ASSERT_OK(manifest_of(&c->p, "t", &m));
    ASSERT_EQ_U64(m.nchunks, NCHUNKS);
    ASSERT_EQ_U64(m.chunk_rows, CHUNK_ROWS);
    engram__rmanifest_free(&m);
    ASSERT_EQ(pieces_left(c, "t", 0), NCHUNKS);
    /* Create-only, whatever the rows. */
    ASSERT_ERR(engram__pub_writer_begin(&c->p, "t", &spec, &w), -EEXIST);
    ASSERT_ERR(push(&c->p, "t", 1, NROWS), -EEXIST);
    ASSERT_EQ_U64(epoch_of(&c->p, "t"), e);

    /* A push under way: neither listed nor readable, and the name is
     * taken. */
    ASSERT_OK(engram__pub_writer_begin(&c->p, "u", &spec, &w));
    ASSERT_OK(append_rows(w, rows, 0, 9));
    check_absent(&c->p, "u");
    ASSERT_ERR(engram__pub_writer_begin(&c->p, "u", &spec, &w2), -EEXIST);
    ASSERT_OK(append_rows(w, rows, 9, NROWS));
    check_absent(&c->p, "u");
    ASSERT_OK(engram__pub_writer_commit(w));
    check_table(&c->p, "u", 2, NROWS);

    /* An abort leaves nothing, at once, and frees the name. */
    ASSERT_OK(engram__pub_writer_begin(&c->p, "v", &spec, &w));
    ASSERT_OK(append_rows(w, rows, 0, 10));
    engram__pub_writer_abort(w);
    check_absent(&c->p, "v");
    ASSERT(settled(c, "v", 0));
    ASSERT_OK(push(&c->p, "v", 3, 5)); /* one chunk, short */
    check_table(&c->p, "v", 3, 5);

    /* Missing rows: nothing published, nothing left. */
    ASSERT_OK(engram__pub_writer_begin(&c->p, "x", &spec, &w));
    ASSERT_OK(append_rows(w, rows, 0, NROWS - 1));
    ASSERT_ERR(engram__pub_writer_commit(w), ENGRAM_ESTATE);
    check_absent(&c->p, "x");
    ASSERT(settled(c, "x", 0));

    ASSERT_ERR(read_table(&c->p, "nope", &k), -ENOENT);
    free(rows);
}

typedef struct racer {
    const engram__pub *p;
    const char *name;
    uint32_t seed;
    pthread_barrier_t *go;
    int rc;
} racer;

static void *race_push(void *arg)
{
    racer *r = arg;
    pthread_barrier_wait(r->go);
    r->rc = push(r->p, r->name, r->seed, NROWS);
    return NULL;
}

/* Racing pushes of one name: exactly one wins; the others fail with
 * -EEXIST; the table is the winner's, and nothing of the losers stays. */
static void case_racing_pushes(ctx *c)
{
    enum { THREADS = 4, ROUNDS = 6 };
    for (int round = 0; round < ROUNDS; round++) {
        pthread_t th[THREADS];
        racer r[THREADS];
        pthread_barrier_t go;
        char name[16];
        int winner = -1;
        snprintf(name, sizeof name, "r%d", round);
        pthread_barrier_init(&go, NULL, THREADS);
        for (int i = 0; i < THREADS; i++) {
            r[i] = (racer){&c->p, name, (uint32_t)(100 * round + i + 1), &go, 0};
            ASSERT_EQ(pthread_create(&th[i], NULL, race_push, &r[i]), 0);
        }
        for (int i = 0; i < THREADS; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&go);
        for (int i = 0; i < THREADS; i++) {
            if (r[i].rc == 0) {
                ASSERT_EQ(winner, -1);
                winner = i;
            } else {
                ASSERT_ERR(r[i].rc, -EEXIST);
            }
        }
        ASSERT_GE(winner, 0);
        gc_settle(c, name, check_table(&c->p, name, r[winner].seed, NROWS));
    }
}

/* ---- remove racing push ---- */

enum { RACE_SEED0 = 1000, RACE_ROUNDS = 16 };

static _Thread_local uint64_t jitter_rng;

/* At the protocol's steps on "x": a pause of 0 to 2 ms, so that the
 * removal's and the push's steps interleave otherwise each round. */
static void jitter_hook(const char *step, const char *name)
{
    (void)step;
    if (strcmp(name, "x") != 0)
        return;
    if (!jitter_rng)
        jitter_rng = (uint64_t)(uintptr_t)&jitter_rng ^ ms_now();
    if (tu_rand_below(&jitter_rng, 3))
        usleep((useconds_t)tu_rand_below(&jitter_rng, 2000));
}

typedef struct reader {
    const engram__pub *p;
    atomic_int stop;
    unsigned long reads, gone;
} reader;

/* The seed of the pattern `buf` (nrows rows) is, of those the race
 * used, or -1. */
static int seed_of(const unsigned char *buf, uint64_t nrows)
{
    for (uint32_t s = RACE_SEED0; s <= RACE_SEED0 + RACE_ROUNDS; s++) {
        uint64_t i = 0;
        while (i < nrows && tu_row_mismatch(buf + i * RB, s, i, RB) < 0)
            i++;
        if (i == nrows)
            return (int)s;
    }
    return -1;
}

/* Reads table "x" over and over while it is removed and pushed again:
 * every read is a whole table of the race, or fails as a table that is
 * gone does; a table that fails with its data missing is no longer the
 * one listed. */
static void *read_loop(void *arg)
{
    reader *rd = arg;
    while (!atomic_load(&rd->stop)) {
        uint64_t before = epoch_of(rd->p, "x"), after;
        copy_sink k;
        int err;
        if (!before) {
            usleep(200); /* removed: leave the CPU to the others */
            continue;
        }
        err = read_table(rd->p, "x", &k);
        rd->reads++;
        if (err == 0) {
            ASSERT_EQ_U64(k.spec.num_rows, NROWS);
            ASSERT_GE(seed_of(k.buf, NROWS), RACE_SEED0);
        } else if (err == -ENODATA) {
            /* Its pieces go only after it is unpublished: the epoch read
             * before can no longer be the table's. */
            after = epoch_of(rd->p, "x");
            ASSERT(after != before);
            rd->gone++;
        } else {
            ASSERT_ERR(err, -ENOENT);
            rd->gone++;
        }
        free(k.buf);
    }
    return NULL;
}

typedef struct remover {
    const engram__pub *p;
    pthread_barrier_t *go;
    int rc, unpublished;
} remover;

static void *race_remove(void *arg)
{
    remover *m = arg;
    pthread_barrier_wait(m->go);
    m->rc = engram__pub_remove(m->p, "x", &m->unpublished);
    return NULL;
}

/* A removal of "x" and a push of "x" again, at once, round after round,
 * with a reader reading it all along: the removal always removes the
 * table it read; the push either wins after it (the table listed is
 * then exactly the push's) or fails with -EEXIST (nothing listed). */
static void case_remove_race(ctx *c)
{
    pthread_t rt;
    reader rd;
    memset(&rd, 0, sizeof rd);
    rd.p = &c->p;
    ASSERT_OK(push(&c->p, "x", RACE_SEED0, NROWS));
    engram__pub_hook = jitter_hook;
    ASSERT_EQ(pthread_create(&rt, NULL, read_loop, &rd), 0);
    for (int round = 1; round <= RACE_ROUNDS; round++) {
        uint32_t seed = (uint32_t)(RACE_SEED0 + round);
        pthread_barrier_t go;
        pthread_t th[2];
        remover m = {&c->p, &go, 0, 0};
        racer r = {&c->p, "x", seed, &go, 0};
        if (!epoch_of(&c->p, "x"))
            ASSERT_OK(push(&c->p, "x", seed - 1, NROWS));
        pthread_barrier_init(&go, NULL, 2);
        ASSERT_EQ(pthread_create(&th[0], NULL, race_remove, &m), 0);
        ASSERT_EQ(pthread_create(&th[1], NULL, race_push, &r), 0);
        pthread_join(th[0], NULL);
        pthread_join(th[1], NULL);
        pthread_barrier_destroy(&go);
        /* Nobody else removes: the removal takes the table it read. */
        ASSERT_OK(m.rc);
        ASSERT_EQ(m.unpublished, 1);
        if (r.rc == 0) {
            gc_settle(c, "x", check_table(&c->p, "x", seed, NROWS));
        } else {
            ASSERT_ERR(r.rc, -EEXIST);
            check_absent(&c->p, "x");
            gc_settle(c, "x", 0);
        }
    }
    atomic_store(&rd.stop, 1);
    pthread_join(rt, NULL);
    engram__pub_hook = NULL;
    printf("   %lu reads, %lu of a table removed meanwhile\n", rd.reads, rd.gone);
}

/* ---- killed writers ---- */

/* The TTL of pushes that are to die, and be settled by a gc once it
 * passed.  Short, but long enough that a live one is not taken for dead
 * (its pieces expiring) on a busy machine: it shows life every half. */
enum { KILL_TTL_MS = 3000, KILL_MAX = 200 };

/* A push killed at its step n, for n = 0, 1, ... until one ends before
 * its kill: the killed push's abort cannot clean up either.  A table
 * that shows is whole, and shows only where commit said 0 (or that it
 * could not tell); after the TTL, gc leaves nothing of the others, and
 * their names can be pushed again. */
static void case_killed_writer(ctx *c)
{
    engram__pub p = c->p;
    int rc[KILL_MAX], n;
    char name[16];
    p.ttl_ms = KILL_TTL_MS; /* a dead push is settled after this */
    for (n = 0;; n++) {
        unsigned killed;
        ASSERT_LT(n, KILL_MAX);
        snprintf(name, sizeof name, "k%d", n);
        kvf_kill_after(c->f, (unsigned)n);
        rc[n] = push(&p, name, (uint32_t)n + 1, NROWS);
        killed = kvf_killed(c->f);
        kvf_revive(c->f);
        if (rc[n] == 0 || epoch_of(&p, name)) {
            /* Published: whole, and said so. */
            if (rc[n] != 0)
                ASSERT_ERR(rc[n], ENGRAM_EINDOUBT);
            check_table(&p, name, (uint32_t)n + 1, NROWS);
        } else {
            check_absent(&p, name);
        }
        if (killed == 0) {
            ASSERT_OK(rc[n]);
            break;
        }
    }
    printf("   a push took %d steps\n", n);
    sleep_ms(KILL_TTL_MS);
    for (int i = 0; i <= n; i++) {
        uint64_t e;
        snprintf(name, sizeof name, "k%d", i);
        gc_settle(c, name, e = epoch_of(&p, name));
        if (e) {
            check_table(&p, name, (uint32_t)i + 1, NROWS);
            continue;
        }
        ASSERT_NE(rc[i], 0);
        ASSERT_OK(push(&p, name, (uint32_t)i + 100, NROWS));
        check_table(&p, name, (uint32_t)i + 100, NROWS);
    }
}

/* A removal killed at its step n, for n = 0, 1, ... until one ends
 * before its kill: the table is either still listed and whole (the
 * removal failed) or gone, and gc leaves nothing of it. */
static void case_killed_remover(ctx *c)
{
    int n;
    char name[16];
    for (n = 0;; n++) {
        unsigned killed;
        int rc, unpublished = -1;
        ASSERT_LT(n, KILL_MAX);
        snprintf(name, sizeof name, "m%d", n);
        ASSERT_OK(push(&c->p, name, (uint32_t)n + 1, NROWS));
        kvf_kill_after(c->f, (unsigned)n);
        rc = engram__pub_remove(&c->p, name, &unpublished);
        killed = kvf_killed(c->f);
        kvf_revive(c->f);
        if (epoch_of(&c->p, name)) {
            ASSERT_NE(rc, 0);
            ASSERT_EQ(unpublished, 0);
            gc_settle(c, name, check_table(&c->p, name, (uint32_t)n + 1, NROWS));
            ASSERT_OK(engram__pub_remove(&c->p, name, &unpublished));
            ASSERT_EQ(unpublished, 1);
        } else if (rc != ENGRAM_EINDOUBT) {
            /* Gone, and said so (its pieces may be left to gc). */
            ASSERT_EQ(unpublished, 1);
        }
        check_absent(&c->p, name);
        gc_settle(c, name, 0);
        if (killed == 0) {
            ASSERT_OK(rc);
            break;
        }
    }
    printf("   a removal took %d steps\n", n);
}

/* ---- lost and late publications ---- */

static const kvf_match publication = {KVF_REC_CAS, MANIFEST_HEAD, 0, 0, 0};

/* The publication ran and its reply was lost: the push finds out that
 * it was published, and says 0. */
static void case_lost_publish(ctx *c)
{
    uint64_t e;
    kvf_lost(c->f, publication);
    ASSERT_OK(push(&c->p, "t", 1, NROWS));
    ASSERT_EQ(kvf_fired(c->f), 1);
    e = check_table(&c->p, "t", 1, NROWS);
    gc_settle(c, "t", e);
}

/* Lands the publication held back: it must change nothing. */
static void release_stale(ctx *c)
{
    int res = -99;
    ASSERT_EQ(kvf_deferred(c->f), 1);
    ASSERT_OK(kvf_release(c->f, &res));
    ASSERT_NE(res, ENGRAM__KV_DONE);
}

/* The publication held back (still in flight) when the push asks what
 * became of it: the push settles it as not published and fails; the
 * publication landing afterwards must not show the table, whether the
 * name is free then or was pushed again. */
static void case_deferred_publish(ctx *c)
{
    uint64_t e;
    int rc;
    kvf_defer(c->f, publication);
    ASSERT_FAILS(push(&c->p, "t", 1, NROWS), rc);
    ASSERT_NE(rc, ENGRAM_EINDOUBT);
    check_absent(&c->p, "t");
    release_stale(c);
    check_absent(&c->p, "t");
    gc_settle(c, "t", 0);
    ASSERT_OK(push(&c->p, "t", 2, NROWS));
    gc_settle(c, "t", check_table(&c->p, "t", 2, NROWS));

    /* Landing after the name was pushed again. */
    kvf_defer(c->f, publication);
    ASSERT_FAILS(push(&c->p, "u", 1, NROWS), rc);
    check_absent(&c->p, "u");
    ASSERT_OK(push(&c->p, "u", 2, NROWS));
    e = check_table(&c->p, "u", 2, NROWS);
    release_stale(c);
    ASSERT_EQ_U64(check_table(&c->p, "u", 2, NROWS), e);
    gc_settle(c, "u", e);
}

/* Pushes `name` with its publication held back and the asking after it
 * failing (`lost` 0: it did not run; 1: it ran, its reply lost), and
 * everything after that failing too: the push cannot tell, and says
 * ENGRAM_EINDOUBT, keeping everything. */
static void push_in_doubt(ctx *c, const engram__pub *p, const char *name, int lost)
{
    kvf_match resolve = {KVF_REC_CAS, NULL, 0, 0, 1};
    kvf_defer(c->f, publication);
    if (lost)
        kvf_lost(c->f, resolve);
    else
        kvf_fail(c->f, resolve);
    ASSERT_ERR(push(p, name, 1, NROWS), ENGRAM_EINDOUBT);
    ASSERT_EQ(kvf_armed(c->f), 0);
    kvf_revive(c->f);
    check_absent(p, name);
    ASSERT_EQ(pieces_left(c, name, 0), NCHUNKS); /* kept */
}

static void case_in_doubt(ctx *c)
{
    engram__pub p = c->p;
    uint64_t e;
    int res = -99;
    p.ttl_ms = KILL_TTL_MS;

    /* The publication lands after all: the table is whole, and a gc
     * keeps it. */
    push_in_doubt(c, &p, "a", 0);
    ASSERT_OK(kvf_release(c->f, &res));
    ASSERT_EQ(res, ENGRAM__KV_DONE);
    e = check_table(&p, "a", 1, NROWS);
    gc_settle(c, "a", e);
    check_table(&p, "a", 1, NROWS);

    /* It never lands before a gc settles the push: then it must not
     * publish, and nothing is left. */
    push_in_doubt(c, &p, "b", 0);
    sleep_ms(p.ttl_ms);
    gc_settle(c, "b", 0);
    release_stale(c);
    check_absent(&p, "b");
    ASSERT(settled(c, "b", 0));
    ASSERT_OK(push(&p, "b", 2, NROWS));
    gc_settle(c, "b", check_table(&p, "b", 2, NROWS));

    /* The asking ran and only its reply was lost: it closed the push,
     * so the publication landing late must not publish. */
    push_in_doubt(c, &p, "d", 1);
    release_stale(c);
    check_absent(&p, "d");
    gc_settle(c, "d", 0);
    ASSERT_OK(push(&p, "d", 2, NROWS));
    gc_settle(c, "d", check_table(&p, "d", 2, NROWS));

    /* The publication ran, its reply lost, and nothing after it gets an
     * answer: in doubt, and the table is whole. */
    {
        kvf_match pub_then_kill = publication;
        pub_then_kill.then_kill = 1;
        kvf_lost(c->f, pub_then_kill);
        ASSERT_ERR(push(&p, "e", 1, NROWS), ENGRAM_EINDOUBT);
        kvf_revive(c->f);
        gc_settle(c, "e", check_table(&p, "e", 1, NROWS));
    }
}

/* ---- lost and late removals ---- */

static const kvf_match removal = {KVF_REC_CAS, CLOSED_HEAD, 0, 0, 0};

/* A removal whose reply is lost: the table ends up removed, and a gc
 * leaves nothing of it.  A removal held back, landing after the name was
 * pushed again, must not remove the new table. */
static void case_remove_lost(ctx *c)
{
    uint64_t e;
    int rc, unpublished = -1;

    ASSERT_OK(push(&c->p, "t", 1, NROWS));
    kvf_lost(c->f, removal);
    rc = engram__pub_remove(&c->p, "t", &unpublished);
    ASSERT_EQ(kvf_fired(c->f), 1);
    if (rc != 0)
        ASSERT_ERR(rc, ENGRAM_EINDOUBT);
    check_absent(&c->p, "t");
    gc_settle(c, "t", 0);
    ASSERT_OK(push(&c->p, "t", 2, NROWS));
    check_table(&c->p, "t", 2, NROWS);

    /* Lost, and nothing after it answers either. */
    {
        kvf_match then_kill = removal;
        then_kill.then_kill = 1;
        kvf_lost(c->f, then_kill);
        rc = engram__pub_remove(&c->p, "t", &unpublished);
        kvf_revive(c->f);
        ASSERT_NE(rc, 0);
        check_absent(&c->p, "t");
        gc_settle(c, "t", 0);
    }

    /* Held back. */
    ASSERT_OK(push(&c->p, "u", 1, NROWS));
    kvf_defer(c->f, removal);
    rc = engram__pub_remove(&c->p, "u", &unpublished);
    ASSERT_EQ(kvf_deferred(c->f), 1);
    if (epoch_of(&c->p, "u")) {
        /* The removal gave up without it: once more. */
        ASSERT_NE(rc, 0);
        ASSERT_OK(engram__pub_remove(&c->p, "u", &unpublished));
    }
    ASSERT_EQ(unpublished, 1);
    check_absent(&c->p, "u");
    ASSERT_OK(push(&c->p, "u", 2, NROWS));
    e = check_table(&c->p, "u", 2, NROWS);
    release_stale(c);
    ASSERT_EQ_U64(check_table(&c->p, "u", 2, NROWS), e);
    gc_settle(c, "u", e);
}

/* ---- gc and live pushes ---- */

/* gc settles a push that died and one that stalled past its TTL, and
 * never takes a push that is alive: that one publishes afterwards. */
static void case_gc_live(ctx *c)
{
    engram_table_spec spec = {NROWS, RB, 0};
    engram__pub live = c->p, dead = c->p;
    unsigned char *rows = rows_of(5, NROWS);
    uint64_t t0;
    void *wl, *wd;
    int rc;
    live.ttl_ms = 60000; /* alive: it showed life well within this */
    dead.ttl_ms = 300; /* for pushes that die: taken for dead soon */

    ASSERT_OK(engram__pub_writer_begin(&live, "live", &spec, &wl));
    ASSERT_OK(append_rows(wl, rows, 0, 2 * CHUNK_ROWS));
    /* A push killed after two chunks. */
    ASSERT_OK(engram__pub_writer_begin(&dead, "dead", &spec, &wd));
    ASSERT_OK(append_rows(wd, rows, 0, 2 * CHUNK_ROWS));
    kvf_kill_after(c->f, 0);
    engram__pub_writer_abort(wd);
    kvf_revive(c->f);
    ASSERT_EQ(records_of(c, "dead").others, 1);
    sleep_ms(dead.ttl_ms);
    t0 = ms_now();
    for (;;) {
        ASSERT_OK(engram__pub_gc(&c->p, 0, 0, NULL, NULL));
        /* The live push keeps its record and its pieces. */
        ASSERT_EQ(records_of(c, "live").others, 1);
        ASSERT_EQ(pieces_left(c, "live", 0), 2);
        if (settled(c, "dead", 0))
            break;
        ASSERT_LT(ms_now() - t0, WAIT_MS);
        sleep_ms(20);
    }
    check_absent(&c->p, "dead");
    ASSERT_OK(push(&live, "dead", 6, NROWS));
    check_table(&live, "dead", 6, NROWS);

    /* A push that stalls for longer than its TTL is taken for dead, and
     * finds out at a later step: it publishes nothing. */
    ASSERT_OK(engram__pub_writer_begin(&dead, "stall", &spec, &wd));
    ASSERT_OK(append_rows(wd, rows, 0, CHUNK_ROWS));
    sleep_ms(2 * dead.ttl_ms);
    gc_settle(c, "stall", 0);
    if ((rc = append_rows(wd, rows, CHUNK_ROWS, NROWS)) == 0)
        rc = engram__pub_writer_commit(wd);
    ASSERT_NE(rc, 0);
    check_absent(&c->p, "stall");
    gc_settle(c, "stall", 0);
    ASSERT_OK(push(&live, "stall", 7, NROWS));
    check_table(&live, "stall", 7, NROWS);

    /* The live push ends well. */
    ASSERT_OK(append_rows(wl, rows, 2 * CHUNK_ROWS, NROWS));
    ASSERT_OK(engram__pub_writer_commit(wl));
    gc_settle(c, "live", check_table(&live, "live", 5, NROWS));
    free(rows);
}

/* ---- the order of the steps ---- */

/* The index of the first event in [from, n) of kind op on `name` whose
 * value (rec_cas) starts with `head` (NULL: any), or n. */
static size_t ev_find(const kvf_event *ev, size_t n, size_t from, int op, const char *name,
                      const char *head)
{
    for (size_t k = from; k < n; k++)
        if (ev[k].op == op && strcmp(ev[k].name, name) == 0 &&
            (!head || strncmp(ev[k].head, head, strlen(head)) == 0))
            return k;
    return n;
}

/* 1 if session s synced between events a and b (excluded). */
static int synced_between(const kvf_event *ev, size_t a, size_t b, const void *s)
{
    for (size_t k = a + 1; k < b; k++)
        if (ev[k].op == KVF_SYNC && ev[k].s == s)
            return 1;
    return 0;
}

/* Pieces go only once the record that freed them is on the replicas:
 * after a sync, on the session that wrote it, that follows its last
 * write (a record found closed is written again first, for the sync to
 * cover it). */
static void check_synced_before_delete(ctx *c, const char *name)
{
    size_t n, del, w = 0;
    kvf_event *ev = kvf_trace(c->f, &n);
    del = ev_find(ev, n, 0, KVF_PIECE_DEL, name, NULL);
    ASSERT_LT(del, n);
    for (size_t k = 0; k < del; k++)
        if (ev[k].op == KVF_REC_CAS && strcmp(ev[k].name, name) == 0)
            w = k + 1;
    ASSERT_GT(w, 0);
    ASSERT(synced_between(ev, w - 1, del, ev[w - 1].s));
    free(ev);
}

/* What no store without replicas can show: each step that must be on
 * the replicas before the next is followed by a sync of its session.  A
 * push makes every piece permanent, and syncs, before its manifest names
 * them, and syncs the manifest before it says 0; a removal, a gc of a
 * dead push and a gc of a removal that died delete pieces only after
 * syncing the record that freed them. */
static void case_sync_order(ctx *c)
{
    engram_table_spec spec = {NROWS, RB, 0};
    engram__pub dead = c->p;
    unsigned char *rows = rows_of(3, NROWS);
    kvf_match sync_fails = {KVF_SYNC, NULL, 0, 0, 1};
    kvf_event *ev;
    size_t n, pub;
    void *w;
    int unpublished;

    kvf_trace_clear(c->f);
    ASSERT_OK(push(&c->p, "t", 1, NROWS));
    ev = kvf_trace(c->f, &n);
    pub = ev_find(ev, n, 0, KVF_REC_CAS, "t", MANIFEST_HEAD);
    ASSERT_LT(pub, n);
    for (uint64_t i = 0; i < NCHUNKS; i++) {
        size_t last = n;
        for (size_t k = 0; k < pub; k++)
            if ((ev[k].op == KVF_PIECE_PUT || ev[k].op == KVF_PIECE_EXPIRE) &&
                ev[k].index == i && strcmp(ev[k].name, "t") == 0)
                last = k;
        ASSERT_LT(last, pub);
        ASSERT_EQ(ev[last].ttl_ms, 0); /* permanent */
        ASSERT(synced_between(ev, last, pub, ev[last].s));
    }
    ASSERT(synced_between(ev, pub, n, ev[pub].s));
    free(ev);

    kvf_trace_clear(c->f);
    ASSERT_OK(engram__pub_remove(&c->p, "t", &unpublished));
    check_synced_before_delete(c, "t");

    /* A dead push, settled by gc. */
    dead.ttl_ms = 300;
    ASSERT_OK(engram__pub_writer_begin(&dead, "d", &spec, &w));
    ASSERT_OK(append_rows(w, rows, 0, 2 * CHUNK_ROWS));
    kvf_kill_after(c->f, 0);
    engram__pub_writer_abort(w);
    kvf_revive(c->f);
    sleep_ms(dead.ttl_ms);
    kvf_trace_clear(c->f);
    gc_settle(c, "d", 0);
    check_synced_before_delete(c, "d");

    /* A removal that died once it unpublished (its sync failed), settled
     * by gc. */
    ASSERT_OK(push(&c->p, "r", 1, NROWS));
    kvf_fail(c->f, sync_fails);
    ASSERT_NE(engram__pub_remove(&c->p, "r", &unpublished), 0);
    kvf_revive(c->f);
    ASSERT_EQ(unpublished, 1);
    check_absent(&c->p, "r");
    kvf_trace_clear(c->f);
    gc_settle(c, "r", 0);
    check_synced_before_delete(c, "r");
    free(rows);
}

/* ---- kv.h itself, and the decorator ---- */

/* Record `name` holds exactly val[len]. */
static void check_rec(const engram__pub *p, void *s, const char *name, const char *val,
                      size_t len)
{
    char *v = NULL;
    size_t n = 0;
    ASSERT_OK(p->vt->rec_get(p->kv, s, name, &v, &n));
    ASSERT_EQ(n, len);
    ASSERT_MEM_EQ(v, val, len);
    ASSERT_EQ(v[n], '\0');
    free(v);
}

static int cas(const engram__pub *p, void *s, const char *name, const char *expect,
               const char *val)
{
    int res = -99;
    ASSERT_OK(p->vt->rec_cas(p->kv, s, name, expect, expect ? strlen(expect) : 0, val,
                             val ? strlen(val) : 0, &res));
    return res;
}

typedef struct rec_count {
    int n;
    char last[32];
} rec_count;

static int count_each(void *ud, const char *name, const char *val, size_t len)
{
    rec_count *r = ud;
    (void)val;
    (void)len;
    r->n++;
    snprintf(r->last, sizeof r->last, "%s", name);
    return 0;
}

/* Reads n ranges of one piece each: get_ranges's result. */
static int ranges(const engram__pub *p, void *s, const engram__kv_piece *pc,
                  const engram__kv_range *r, size_t n)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += r[i].len;
    return p->vt->get_ranges(p->kv, s, pc, r, n, bytes);
}

/* What the protocol takes of a store, asked of the store directly:
 * rec_cas's four answers (put-if-absent, swap, rewrite, delete) on
 * binary values; ranged reads, whole or not, and -ENODATA for what is
 * missing or of another length; expiry, made permanent, and deletion. */
static void case_kv_contract(ctx *c)
{
    const engram__pub *p = &c->raw;
    engram__kv_piece pc = {"p", 0x0123456789abcdefull, p->layout};
    engram__kv_piece other = {"p", 0x0123456789abcdeeull, p->layout};
    static const char bin[] = "x\0y\nz";
    unsigned char buf[16];
    rec_count rc = {0, ""};
    uint64_t now, t0;
    char *v = NULL;
    size_t n;
    void *s;
    int res = -99;

    ASSERT_OK(p->vt->sess_get(p->kv, &s));
    ASSERT_ERR(p->vt->rec_get(p->kv, s, "a", &v, &n), -ENOENT);
    ASSERT_EQ(cas(p, s, "a", NULL, "v1"), ENGRAM__KV_DONE);
    ASSERT_EQ(cas(p, s, "a", NULL, "v9"), ENGRAM__KV_PRESENT);
    check_rec(p, s, "a", "v1", 2);
    ASSERT_EQ(cas(p, s, "a", "v", "v2"), ENGRAM__KV_DIFFERS);
    ASSERT_EQ(cas(p, s, "a", "v1x", "v2"), ENGRAM__KV_DIFFERS);
    ASSERT_EQ(cas(p, s, "a", "v1", "v2"), ENGRAM__KV_DONE);
    ASSERT_EQ(cas(p, s, "a", "v2", "v2"), ENGRAM__KV_DONE); /* written again */
    check_rec(p, s, "a", "v2", 2);
    ASSERT_EQ(cas(p, s, "b", "v2", "v3"), ENGRAM__KV_ABSENT);
    ASSERT_EQ(cas(p, s, "b", "v2", NULL), ENGRAM__KV_ABSENT);
    /* Values are bytes: a NUL or a newline inside is kept. */
    ASSERT_OK(p->vt->rec_cas(p->kv, s, "b", NULL, 0, bin, sizeof bin - 1, &res));
    ASSERT_EQ(res, ENGRAM__KV_DONE);
    check_rec(p, s, "b", bin, sizeof bin - 1);
    ASSERT_OK(p->vt->rec_cas(p->kv, s, "b", "x", 1, "q", 1, &res));
    ASSERT_EQ(res, ENGRAM__KV_DIFFERS);
    ASSERT_OK(p->vt->rec_cas(p->kv, s, "b", bin, sizeof bin - 1, NULL, 0, &res));
    ASSERT_EQ(res, ENGRAM__KV_DONE);
    ASSERT_OK(p->vt->rec_list(p->kv, s, count_each, &rc));
    ASSERT_EQ(rc.n, 1);
    ASSERT_STR_EQ(rc.last, "a");
    ASSERT_EQ(cas(p, s, "a", "v1", NULL), ENGRAM__KV_DIFFERS);
    ASSERT_EQ(cas(p, s, "a", "v2", NULL), ENGRAM__KV_DONE);
    ASSERT_ERR(p->vt->rec_get(p->kv, s, "a", &v, &n), -ENOENT);
    /* The store's clock is the Unix epoch's (loosely: another host's). */
    ASSERT_OK(p->vt->now_ms(p->kv, s, &now));
    ASSERT_LT(llabs((long long)(now - engram__wall_ns() / 1000000u)), 600000);
    ASSERT_OK(p->vt->sync(p->kv, s));

    /* (kv.h gives a put's ttl_ms no meaning of 0: a put always expires.) */
    ASSERT_OK(p->vt->piece_put(p->kv, s, &pc, 0, "hello", 5, 60000));
    ASSERT_OK(p->vt->piece_put(p->kv, s, &pc, 1, "abc", 3, 60000));
    {
        engram__kv_range r[2] = {{0, 0, buf, 5, 1}, {1, 1, buf + 5, 2, 1}};
        memset(buf, 0, sizeof buf);
        ASSERT_OK(ranges(p, s, &pc, r, 2));
        ASSERT_MEM_EQ(buf, "hellobc", 7);
    }
    {
        engram__kv_range part = {0, 1, buf, 3, 0}, shorter = {0, 0, buf, 4, 1};
        engram__kv_range past = {0, 3, buf, 4, 0}, missing = {2, 0, buf, 1, 0};
        engram__kv_range pair[2] = {{0, 0, buf, 5, 1}, {2, 0, buf + 5, 1, 0}};
        ASSERT_OK(ranges(p, s, &pc, &part, 1));
        ASSERT_MEM_EQ(buf, "ell", 3);
        ASSERT_ERR(ranges(p, s, &pc, &shorter, 1), -ENODATA); /* the piece is longer */
        ASSERT_ERR(ranges(p, s, &pc, &past, 1), -ENODATA);
        ASSERT_ERR(ranges(p, s, &pc, &missing, 1), -ENODATA);
        ASSERT_ERR(ranges(p, s, &pc, pair, 2), -ENODATA);
        ASSERT_ERR(ranges(p, s, &other, &part, 1), -ENODATA); /* another epoch's */
    }
    ASSERT_ERR(p->vt->piece_expire(p->kv, s, &pc, 2, 0), -ENODATA);
    ASSERT_OK(p->vt->piece_expire(p->kv, s, &pc, 1, 0));   /* permanent */
    ASSERT_OK(p->vt->piece_expire(p->kv, s, &pc, 0, 200)); /* expires */
    ASSERT_OK(p->vt->piece_put(p->kv, s, &pc, 3, "q", 1, 200));
    t0 = ms_now();
    for (;;) {
        engram__kv_range r0 = {0, 0, buf, 1, 0}, r3 = {3, 0, buf, 1, 0};
        int e0 = ranges(p, s, &pc, &r0, 1), e3 = ranges(p, s, &pc, &r3, 1);
        if (e0 == -ENODATA && e3 == -ENODATA)
            break;
        ASSERT(e0 == 0 || e0 == -ENODATA);
        ASSERT(e3 == 0 || e3 == -ENODATA);
        ASSERT_LT(ms_now() - t0, WAIT_MS);
        sleep_ms(50);
    }
    ASSERT_ERR(p->vt->piece_expire(p->kv, s, &pc, 3, 0), -ENODATA);
    {
        engram__kv_range r1 = {1, 0, buf, 3, 1};
        ASSERT_OK(ranges(p, s, &pc, &r1, 1)); /* the permanent one stays */
        ASSERT_MEM_EQ(buf, "abc", 3);
        ASSERT_OK(p->vt->piece_del(p->kv, s, &pc, 5)); /* missing ones are no failure */
        ASSERT_ERR(ranges(p, s, &pc, &r1, 1), -ENODATA);
    }
    p->vt->sess_put(p->kv, s);
}

/* The decorator does what each fault says, as the store shows it: a
 * failed write did not happen, a lost one did, a deferred one happens
 * when released; a kill lets n operations through; faults fire in the
 * order armed, matching their kind, prefix, delete and skip. */
static void case_fault_harness(ctx *c)
{
    const engram__pub *p = &c->p;
    kvf_match any_cas = {KVF_REC_CAS, NULL, 0, 0, 0}, del = {KVF_REC_CAS, NULL, 1, 0, 0};
    kvf_match pfx = {KVF_REC_CAS, "keep", 0, 1, 0}, put = {KVF_PIECE_PUT, NULL, 0, 0, 0};
    engram__kv_piece pc = {"p", 7, p->layout};
    uint64_t ms;
    void *s;
    int res;

    ASSERT_OK(p->vt->sess_get(p->kv, &s));
    kvf_fail(c->f, any_cas);
    ASSERT_ERR(p->vt->rec_cas(p->kv, s, "a", NULL, 0, "1", 1, &res), -ETIMEDOUT);
    ASSERT_EQ(res, KVF_NO_ANSWER);
    ASSERT_EQ(records_of(c, NULL).others, 0); /* did not happen */
    kvf_lost(c->f, any_cas);
    ASSERT_ERR(p->vt->rec_cas(p->kv, s, "a", NULL, 0, "1", 1, &res), -ETIMEDOUT);
    check_rec(&c->raw, s, "a", "1", 1); /* happened */
    kvf_defer(c->f, del);
    ASSERT_EQ(cas(p, s, "a", "1", "2"), ENGRAM__KV_DONE); /* not a delete */
    ASSERT_ERR(p->vt->rec_cas(p->kv, s, "a", "2", 1, NULL, 0, &res), -ETIMEDOUT);
    check_rec(&c->raw, s, "a", "2", 1); /* not yet */
    ASSERT_EQ(kvf_deferred(c->f), 1);
    ASSERT_OK(kvf_release(c->f, &res));
    ASSERT_EQ(res, ENGRAM__KV_DONE);
    ASSERT_EQ(records_of(c, NULL).others, 0);
    ASSERT_ERR(kvf_release(c->f, &res), -ENOENT);
    /* A prefix, after one skipped; then a piece put, in that order. */
    kvf_fail(c->f, pfx);
    kvf_fail(c->f, put);
    ASSERT_OK(p->vt->piece_put(p->kv, s, &pc, 0, "x", 1, 60000)); /* not its turn */
    ASSERT_EQ(cas(p, s, "k", NULL, "other"), ENGRAM__KV_DONE);
    ASSERT_EQ(cas(p, s, "k", "other", "keep1"), ENGRAM__KV_DONE); /* skipped */
    ASSERT_ERR(p->vt->rec_cas(p->kv, s, "k", "keep1", 5, "keep2", 5, &res), -ETIMEDOUT);
    ASSERT_ERR(p->vt->piece_put(p->kv, s, &pc, 1, "y", 1, 60000), -ETIMEDOUT);
    ASSERT_EQ(kvf_fired(c->f), 5);
    ASSERT_EQ(kvf_armed(c->f), 0);
    ASSERT_EQ(kvf_pieces_left(c->f, "p", 0), 1); /* piece 1 was never sent */
    ASSERT_EQ(kvf_pieces_left(c->f, "p", 7), 0);
    /* A kill after two operations, until revived. */
    kvf_kill_after(c->f, 2);
    ASSERT_OK(p->vt->now_ms(p->kv, s, &ms));
    ASSERT_OK(p->vt->sync(p->kv, s));
    ASSERT_ERR(p->vt->now_ms(p->kv, s, &ms), -ECONNRESET);
    ASSERT_ERR(p->vt->piece_del(p->kv, s, &pc, 2), -ECONNRESET);
    ASSERT_EQ(kvf_killed(c->f), 2);
    kvf_revive(c->f);
    ASSERT_OK(p->vt->piece_del(p->kv, s, &pc, 2));
    ASSERT_EQ(kvf_pieces_left(c->f, "p", 0), 0);
    ASSERT_EQ(cas(p, s, "k", "keep1", NULL), ENGRAM__KV_DONE);
    p->vt->sess_put(p->kv, s);
}


/* ---- review: defects found in publish.c (branch review) ---- */

/* A store's answer to a swap that ran on a connection that broke, sent
 * again on a new one: the second copy answers "differs" (kv.h).  The
 * wrapper forwards the armed swap and, if it was done, answers DIFFERS,
 * as the resent copy would; the first copy's write is then on no
 * session's connection, and a sync covers it only after a later write of
 * this session that took effect (a Redis WAIT counts to the last write
 * of its connection that was propagated).  false_syncs counts the syncs
 * that succeeded while such a write was not covered. */
typedef struct dbl {
    const engram__kv_vt *vt;
    void *kv;
    const char *prefix;
    int armed, fired, uncovered, false_syncs;
} dbl;

static int dbl_sess_get(void *kv, void **s)
{
    dbl *d = kv;
    return d->vt->sess_get(d->kv, s);
}
static void dbl_sess_put(void *kv, void *s)
{
    dbl *d = kv;
    d->vt->sess_put(d->kv, s);
}
static int dbl_rec_get(void *kv, void *s, const char *name, char **val, size_t *len)
{
    dbl *d = kv;
    return d->vt->rec_get(d->kv, s, name, val, len);
}
static int dbl_rec_cas(void *kv, void *s, const char *name, const char *expect, size_t elen,
                       const char *val, size_t vlen, int *res)
{
    dbl *d = kv;
    int err = d->vt->rec_cas(d->kv, s, name, expect, elen, val, vlen, res);
    if (err)
        return err;
    if (d->armed && val && vlen >= strlen(d->prefix) &&
        memcmp(val, d->prefix, strlen(d->prefix)) == 0 && *res == ENGRAM__KV_DONE) {
        d->armed = 0;
        d->fired = 1;
        d->uncovered = 1;
        *res = ENGRAM__KV_DIFFERS;
        return 0;
    }
    if (*res == ENGRAM__KV_DONE)
        d->uncovered = 0;
    return 0;
}
static int dbl_rec_list(void *kv, void *s,
                        int (*each)(void *ud, const char *name, const char *val, size_t len),
                        void *ud)
{
    dbl *d = kv;
    return d->vt->rec_list(d->kv, s, each, ud);
}
static int dbl_now_ms(void *kv, void *s, uint64_t *ms)
{
    dbl *d = kv;
    return d->vt->now_ms(d->kv, s, ms);
}
static int dbl_sync(void *kv, void *s)
{
    dbl *d = kv;
    int err = d->vt->sync(d->kv, s);
    if (!err && d->uncovered)
        d->false_syncs++;
    return err;
}
static int dbl_piece_put(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                         const void *data, size_t len, uint32_t ttl_ms)
{
    dbl *d = kv;
    return d->vt->piece_put(d->kv, s, pc, index, data, len, ttl_ms);
}
static int dbl_piece_expire(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                            uint32_t ttl_ms)
{
    dbl *d = kv;
    return d->vt->piece_expire(d->kv, s, pc, index, ttl_ms);
}
static int dbl_piece_del(void *kv, void *s, const engram__kv_piece *pc, uint64_t n)
{
    dbl *d = kv;
    return d->vt->piece_del(d->kv, s, pc, n);
}
static int dbl_get_ranges(void *kv, void *s, const engram__kv_piece *pc,
                          const engram__kv_range *r, size_t n, uint64_t bytes)
{
    dbl *d = kv;
    return d->vt->get_ranges(d->kv, s, pc, r, n, bytes);
}
static const engram__kv_vt dbl_vt = {
    dbl_sess_get, dbl_sess_put, dbl_rec_get, dbl_rec_cas, dbl_rec_list, dbl_now_ms,
    dbl_sync, dbl_piece_put, dbl_piece_expire, dbl_piece_del, dbl_get_ranges,
    NULL, /* rec_list_pending: rec_list serves */
};

/* p over c->p through a dbl armed for swaps putting `prefix`. */
static engram__pub dbl_over(ctx *c, dbl *d, const char *prefix)
{
    engram__pub p = c->p;
    memset(d, 0, sizeof *d);
    d->vt = c->p.vt;
    d->kv = c->p.kv;
    d->prefix = prefix;
    d->armed = 1;
    p.vt = &dbl_vt;
    p.kv = d;
    return p;
}

/* rec_swap() takes a record read back holding the bytes it put as done,
 * but does not write them again (docs/format.md 8.2): the sync that
 * follows does not cover the first copy, and the removal deletes the
 * chunks while its closing may not be on the replicas. */
static void case_rv_swap_rewrite_remove(ctx *c)
{
    dbl d;
    engram__pub p = dbl_over(c, &d, CLOSED_HEAD);
    int unpublished = 0;
    ASSERT_OK(push(&c->p, "t", 1, NROWS));
    ASSERT_OK(engram__pub_remove(&p, "t", &unpublished));
    ASSERT_EQ(d.fired, 1);
    ASSERT_EQ(d.false_syncs, 0);
}

/* The same in gc: the closing of a dead push's record, answered
 * "differs" by a resent copy, is taken as done and its chunks deleted
 * after a sync that does not cover it. */
static void case_rv_swap_rewrite_gc(ctx *c)
{
    engram_table_spec spec = {NROWS, RB, 0};
    engram__pub dead = c->p, p;
    unsigned char *rows = rows_of(3, NROWS);
    dbl d;
    void *w;
    dead.ttl_ms = 300;
    ASSERT_OK(engram__pub_writer_begin(&dead, "d", &spec, &w));
    ASSERT_OK(append_rows(w, rows, 0, 2 * CHUNK_ROWS));
    kvf_kill_after(c->f, 0);
    engram__pub_writer_abort(w);
    kvf_revive(c->f);
    sleep_ms(2 * dead.ttl_ms);
    p = dbl_over(c, &d, CLOSED_HEAD);
    ASSERT_OK(engram__pub_gc(&p, 0, 0, NULL, NULL));
    ASSERT_EQ(d.fired, 1);
    ASSERT_EQ(d.false_syncs, 0);
    free(rows);
}

/* The same at the publication: commit says 0 (published, on the
 * replicas), though its sync did not cover the manifest. */
static void case_rv_swap_rewrite_publish(ctx *c)
{
    dbl d;
    engram__pub p = dbl_over(c, &d, MANIFEST_HEAD);
    int rc = push(&p, "t", 1, NROWS);
    ASSERT_EQ(d.fired, 1);
    check_table(&c->p, "t", 1, NROWS);
    ASSERT(rc == ENGRAM_EINDOUBT || d.false_syncs == 0);
}

/* The publication's reply lost; resolve() finds the manifest, and the
 * rewrite of it (for the sync) fails: v is freed twice. */
static void case_rv_resolve_rewrite_fails(ctx *c)
{
    int rc;
    kvf_lost(c->f, publication);
    kvf_fail(c->f, publication); /* the next swap putting a manifest: the rewrite */
    rc = push(&c->p, "t", 1, NROWS);
    ASSERT_EQ(kvf_fired(c->f), 2);
    ASSERT(rc == 0 || rc == ENGRAM_EINDOUBT);
    check_table(&c->p, "t", 1, NROWS);
}

/* The publication ran, its answer "differs" (a resent copy), and reading
 * the record back fails twice: commit says -ECANCELED ("abandoned ...
 * before it could publish") though the table is published. */
static ctx *rv_ctx;
static void rv_publish_hook(const char *step, const char *name)
{
    kvf_match get = {KVF_REC_GET, NULL, 0, 0, 0};
    (void)name;
    if (strcmp(step, "publish") == 0) {
        kvf_fail(rv_ctx->f, get);
        kvf_fail(rv_ctx->f, get);
    }
}

static void case_rv_publish_readback_fails(ctx *c)
{
    dbl d;
    engram__pub p = dbl_over(c, &d, MANIFEST_HEAD);
    int rc;
    rv_ctx = c;
    engram__pub_hook = rv_publish_hook;
    rc = push(&p, "t", 1, NROWS);
    engram__pub_hook = NULL;
    printf("   commit: %d (%s); listed: %d\n", rc, engram_errmsg(), listed(&c->p, "t"));
    ASSERT(rc == 0 || rc == ENGRAM_EINDOUBT || !listed(&c->p, "t"));
}

/* Two removals of one table: the second, whose swap finds the first's
 * closed record, says the table "was removed and pushed again ... the
 * table pushed since is kept", though nothing was pushed. */
static int rv_nested;
static void rv_remove_hook(const char *step, const char *name)
{
    kvf_match del = {KVF_PIECE_DEL, NULL, 0, 0, 0};
    int unpublished;
    if (strcmp(step, "remove") != 0 || rv_nested)
        return;
    rv_nested = 1;
    kvf_fail(rv_ctx->f, del); /* the other removal stops before its record goes */
    sleep_ms(5);               /* its closed record stamped otherwise than this one's */
    (void)engram__pub_remove(&rv_ctx->p, name, &unpublished);
}

static void case_rv_remove_twice(ctx *c)
{
    int rc, unpublished;
    ASSERT_OK(push(&c->p, "t", 1, NROWS));
    rv_ctx = c;
    rv_nested = 0;
    engram__pub_hook = rv_remove_hook;
    rc = engram__pub_remove(&c->p, "t", &unpublished);
    engram__pub_hook = NULL;
    printf("   second removal: %d: %s\n", rc, engram_errmsg());
    ASSERT_ERR(rc, -ENOENT);
    ASSERT(strstr(engram_errmsg(), "pushed again") == NULL);
}

/* ------------------------------------------------------------------------
 * The implementations, and the runner.
 */

typedef struct impl {
    const char *name;
    /* 0, or TU_SKIP_CODE with the reason printed. */
    int (*start)(void);
    /* A namespace `ns` of the case's own: *raw is the protocol on it;
     * returns the handle close() takes. */
    void *(*open)(const char *ns, engram__pub *raw);
    void (*close)(void *h);
    void (*census)(void *h, size_t *records, size_t *pieces); /* NULL: none */
    void (*dump)(void *h);
} impl;

static int mem_start(void)
{
    return 0;
}

typedef struct mem_ns {
    kvm *m;
    char where[96];
} mem_ns;

static void *mem_open(const char *ns, engram__pub *raw)
{
    mem_ns *h = tu_xcalloc(sizeof *h);
    ASSERT((h->m = kvm_new()) != NULL);
    snprintf(h->where, sizeof h->where, "mem://%s", ns);
    memset(raw, 0, sizeof *raw);
    raw->vt = &kvm_vt;
    raw->kv = h->m;
    raw->where = h->where;
    return h;
}

static void mem_close(void *hp)
{
    mem_ns *h = hp;
    kvm_free(h->m);
    free(h);
}

static void mem_census(void *hp, size_t *records, size_t *pieces)
{
    mem_ns *h = hp;
    *records = kvm_records(h->m);
    *pieces = kvm_pieces(h->m);
}

static void mem_dump(void *hp)
{
    mem_ns *h = hp;
    kvm_piece_info v[64];
    size_t n = kvm_list_pieces(h->m, v, 64);
    fprintf(stderr, "%s holds %zu records and %zu live pieces:\n", h->where, kvm_records(h->m), n);
    for (size_t i = 0; i < n && i < 64; i++)
        fprintf(stderr, "  '%s' epoch %016" PRIx64 " layout %d piece %" PRIu64 ": %zu bytes, %s\n",
                v[i].name, v[i].epoch, v[i].layout, v[i].index, v[i].len,
                v[i].expires_ms ? "expiring" : "permanent");
}

#if defined(ENGRAM_TEST_REDIS)
static tr_cluster C; /* 3 masters, no replicas */

static int redis_start(void)
{
    int rc = tr_start(&C, 3, 0, NULL, NULL);
    if (rc == 0)
        printf("   cluster: %s\n", C.nodes);
    return rc;
}

static void *redis_open(const char *ns, engram__pub *raw)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st = NULL;
    const engram__pub *rp;
    o.threads = 1;
    o.cache_bytes = 1; /* below one set: no row cache */
    ASSERT_OK(engram_store_open_redis(C.nodes, ns, &o, NULL, &st));
    ASSERT((rp = engram__redis_pub(st)) != NULL);
    *raw = *rp;
    return st;
}

static void redis_close(void *h)
{
    engram_store_close(h);
}
#endif

static const impl impls[] = {
    {"mem", mem_start, mem_open, mem_close, mem_census, mem_dump},
#if defined(ENGRAM_TEST_REDIS)
    {"redis", redis_start, redis_open, redis_close, NULL, NULL},
#endif
};

static const struct {
    const char *name;
    void (*fn)(ctx *c);
} cases[] = {
    {"kv_contract", case_kv_contract},
    {"fault_harness", case_fault_harness},
    {"push_read", case_push_read},
    {"racing_pushes", case_racing_pushes},
    {"remove_race", case_remove_race},
    {"killed_writer", case_killed_writer},
    {"killed_remover", case_killed_remover},
    {"lost_publish", case_lost_publish},
    {"deferred_publish", case_deferred_publish},
    {"in_doubt", case_in_doubt},
    {"remove_lost", case_remove_lost},
    {"gc_live", case_gc_live},
    {"sync_order", case_sync_order},
    {"rv_swap_rewrite_remove", case_rv_swap_rewrite_remove},
    {"rv_swap_rewrite_publish", case_rv_swap_rewrite_publish},
    {"rv_swap_rewrite_gc", case_rv_swap_rewrite_gc},
    {"rv_resolve_rewrite_fails", case_rv_resolve_rewrite_fails},
    {"rv_publish_readback_fails", case_rv_publish_readback_fails},
    {"rv_remove_twice", case_rv_remove_twice},
};

#define NIMPLS (sizeof impls / sizeof *impls)
#define NCASES (sizeof cases / sizeof *cases)

/* The command line: implementations and cases, each named (only the
 * named run) or left out (-NAME).  Where none of a kind is named, all
 * of that kind run but those left out. */
static int impl_on[NIMPLS], case_on[NCASES];

static void select_args(int argc, char **argv)
{
    int any_impl = 0, any_case = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 1; i < argc; i++) {
            const char *a = argv[i] + (argv[i][0] == '-');
            int inc = argv[i][0] != '-', found = 0;
            for (size_t k = 0; k < NIMPLS; k++)
                if (strcmp(a, impls[k].name) == 0) {
                    found = 1;
                    any_impl |= inc;
                    if (pass)
                        impl_on[k] = inc;
                }
            for (size_t k = 0; k < NCASES; k++)
                if (strcmp(a, cases[k].name) == 0) {
                    found = 1;
                    any_case |= inc;
                    if (pass)
                        case_on[k] = inc;
                }
            /* "redis" in a build without it: nothing to run. */
            if (!found && strcmp(a, "redis") != 0) {
                fprintf(stderr, "FAIL: test_publish has no implementation or case '%s'\n", a);
                exit(2);
            }
        }
        if (!pass) {
            for (size_t k = 0; k < NIMPLS; k++)
                impl_on[k] = !any_impl;
            for (size_t k = 0; k < NCASES; k++)
                case_on[k] = !any_case;
        }
    }
}

static void run_case(const impl *im, size_t k)
{
    static char label[64];
    char ns[64];
    ctx c;
    snprintf(label, sizeof label, "%s/%s", im->name, cases[k].name);
    snprintf(ns, sizeof ns, "pub_%s", cases[k].name);
    tu_current_case = label;
    printf("-- %s\n", label);
    fflush(stdout);
    memset(&c, 0, sizeof c);
    c.h = im->open(ns, &c.raw);
    /* Small chunks: a table is several pieces.  A TTL long enough that no
     * live push is taken for dead on a busy machine, where a case does
     * not ask for less. */
    c.raw.chunk_bytes = CHUNK_ROWS * RB;
    c.raw.ttl_ms = 30000;
    ASSERT((c.f = kvf_new(&c.raw, &c.p)) != NULL);
    census = im->census;
    census_dump = im->dump;
    cases[k].fn(&c);
    end_check(&c);
    kvf_free(c.f);
    im->close(c.h);
    tu_cs.ran++;
    tu_current_case = "(between cases)";
}

int main(int argc, char **argv)
{
    tu_watchdog(280);
    select_args(argc, argv);
    for (size_t i = 0; i < NIMPLS; i++) {
        int rc;
        if (!impl_on[i])
            continue;
        tu_current_case = impls[i].name;
        printf("== %s\n", impls[i].name);
        if ((rc = impls[i].start()) != 0) {
            tu_skip_case("the %s implementation cannot run here (see above)", impls[i].name);
            tu_cs.ran++;
            tu_cs.skipped++;
            continue;
        }
        for (size_t k = 0; k < NCASES; k++)
            if (case_on[k])
                run_case(&impls[i], k);
    }
    return tu_done("test_publish");
}
