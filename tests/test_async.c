/*
 * test_async.c - lookups ahead of time (engram_lookup_submit, _wait,
 * _cancel, _done) and tokens to rows in one call (engram_ngram_lookup and
 * its submit), through the public API:
 *
 *  - submitted lookups give the rows engram_lookup() gives, waited for in
 *    any order; a bad id fails at the wait with engram_lookup()'s message
 *    and bad-id record, the output untouched;
 *  - cancel: a lookup queued behind one that is busy (a source that blocks
 *    until the test lets it go) is cancelled and never writes; a running
 *    one is waited for;
 *  - close with lookups queued and running: the queued ones fail with
 *    ENGRAM_ESTATE, the running one finishes, both can be waited for after
 *    the close;
 *  - fork: a child submits on threads of its own;
 *  - tokens to rows: the rows of the ids engram_ngram_hash() gives, from a
 *    layer's one table (global ids) and from a table per column (local
 *    ids), synchronously and submitted; bad tokens and bad arguments.
 * No assertion depends on timing: waits are for states the test makes.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>

enum { R = 24 };

/* ------------------------------------------------------------------------
 * A source that can be held: read_rows blocks while `hold` is set.
 */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int hold;
    int entered; /* read_rows calls that started */
    uint32_t seed;
} gate;

static int gate_read(void *ctx, engram_source_req *reqs, size_t n)
{
    gate *g = ctx;
    pthread_mutex_lock(&g->mu);
    g->entered++;
    pthread_cond_broadcast(&g->cv);
    while (g->hold)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < R; j++)
            ((unsigned char *)reqs[i].dst)[j] = tu_byte(g->seed, reqs[i].row, j);
    return 0;
}

static void gate_set(gate *g, int hold)
{
    pthread_mutex_lock(&g->mu);
    g->hold = hold;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_wait_entered(gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->entered < n)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* A memory store (one lookup thread) with table "m" (bound rows, seed 1)
 * and table "s" (the gate's source, seed 2), 100 rows each. */
typedef struct fixture {
    engram_store *st;
    engram_table_id m, s;
    unsigned char *rows;
    gate g;
} fixture;

static void fx_open(fixture *f)
{
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_source_ops ops = ENGRAM_SOURCE_OPS_INIT;
    engram_table_spec spec = {100, R, 0};
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->g.mu, NULL);
    pthread_cond_init(&f->g.cv, NULL);
    f->g.seed = 2;
    o.threads = 1;
    ASSERT_OK(engram_store_open_memory(&o, &f->st));
    f->rows = tu_make_rows(1, 100, R, 0, 0);
    ASSERT_OK(engram_bind(f->st, "m", &spec, f->rows));
    ASSERT_OK(engram_table_open(f->st, "m", &f->m));
    ops.ctx = &f->g;
    ops.read_rows = gate_read;
    ASSERT_OK(engram_add_source(f->st, "s", &spec, &ops, NULL, 0, &f->s));
}

static void fx_close(fixture *f)
{
    engram_store_close(f->st);
    free(f->rows);
    pthread_cond_destroy(&f->g.cv);
    pthread_mutex_destroy(&f->g.mu);
}

static engram_lookup_args args1(engram_table_id *t, const int64_t *ids, size_t n, void *out)
{
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    a.num_tokens = n;
    a.num_cols = 1;
    a.tables = t;
    a.ids = ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = out;
    return a;
}

static void check(const unsigned char *out, const int64_t *ids, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        ASSERT_ROW(out + i * R, seed, (uint64_t)ids[i], R);
}

/* ------------------------------------------------------------------------ */

static void test_submit_wait(void)
{
    fixture f;
    enum { N = 16, T = 50 };
    engram_pending *p[N];
    int64_t ids[N][T];
    unsigned char *out = tu_xmalloc((size_t)N * T * R);
    uint64_t rng = 5;
    fx_open(&f);
    for (int k = 0; k < N; k++) {
        /* Tables copied: the caller's array may go at once. */
        engram_table_id t = k % 2 ? f.s : f.m;
        engram_lookup_args a;
        for (int i = 0; i < T; i++)
            ids[k][i] = (int64_t)tu_rand_below(&rng, 100);
        a = args1(&t, ids[k], T, out + (size_t)k * T * R);
        ASSERT_OK(engram_lookup_submit(f.st, &a, &p[k]));
    }
    /* In any order. */
    for (int k = N - 1; k >= 0; k--) {
        ASSERT_OK(engram_lookup_wait(p[k]));
        check(out + (size_t)k * T * R, ids[k], T, k % 2 ? 2 : 1);
    }
    fx_close(&f);
    free(out);
}

static void test_bad_id_at_wait(void)
{
    fixture f;
    engram_pending *p;
    engram_bad_id bad = ENGRAM_BAD_ID_INIT;
    int64_t ids[3] = {4, 100, 5};
    unsigned char out[3 * R];
    engram_lookup_args a;
    int rc;
    fx_open(&f);
    a = args1(&f.m, ids, 3, out);
    memset(out, 0x5a, sizeof out);
    ASSERT_OK(engram_lookup_submit(f.st, &a, &p));
    ASSERT_FAILS(engram_lookup_wait(p), rc);
    ASSERT_EQ(rc, ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "100");
    ASSERT_OK(engram_last_bad_id(&bad));
    ASSERT_EQ(bad.token, 1);
    ASSERT_EQ(bad.id, 100);
    ASSERT_ALL_BYTES(out, 0x5a, sizeof out);
    /* Bad arguments fail at the submit. */
    a.size = 4;
    ASSERT_ERR(engram_lookup_submit(f.st, &a, &p), -EINVAL);
    ASSERT_ERR(engram_lookup_submit(NULL, &a, &p), -EINVAL);
    ASSERT_ERR(engram_lookup_wait(NULL), -EINVAL);
    ASSERT_ERR(engram_lookup_cancel(NULL), -EINVAL);
    ASSERT_ERR(engram_lookup_done(NULL), -EINVAL);
    a.size = sizeof a;
    ASSERT_ERR(engram_lookup_submit(f.st, NULL, &p), -EINVAL);
    ASSERT_ERR(engram_lookup_submit(f.st, &a, NULL), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "out is NULL");
    /* What engram_lookup() checks comes at the wait, as it would have
     * come from it (no output, an unknown id type); no columns is an empty
     * lookup there too. */
    {
        engram_lookup_args b = a;
        b.out = NULL;
        ASSERT_OK(engram_lookup_submit(f.st, &b, &p));
        ASSERT_ERR(engram_lookup_wait(p), -EINVAL);
        ASSERT_CONTAINS(engram_errmsg(), "out are required");
        b = a;
        b.num_cols = 0;
        b.tables = NULL;
        ASSERT_OK(engram_lookup(f.st, &b));
        ASSERT_OK(engram_lookup_submit(f.st, &b, &p));
        ASSERT_OK(engram_lookup_wait(p));
        b = a;
        b.id_type = 99;
        ASSERT_OK(engram_lookup_submit(f.st, &b, &p));
        ASSERT_ERR(engram_lookup_wait(p), ENGRAM_ELAYOUT);
        ASSERT_CONTAINS(engram_errmsg(), "id_type 99");
        ASSERT_ALL_BYTES(out, 0x5a, sizeof out);
    }
    /* Cancel after it is done: too late to cancel, so its result, a bad
     * id here, with the message and the bad id of a wait. */
    ASSERT_OK(engram_lookup_submit(f.st, &a, &p));
    while (engram_lookup_done(p) != 1)
        sched_yield();
    ASSERT_ERR(engram_lookup_cancel(p), ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "100");
    ASSERT_OK(engram_last_bad_id(&bad));
    ASSERT_EQ(bad.token, 1);
    ids[1] = 6;
    ASSERT_OK(engram_lookup_submit(f.st, &a, &p));
    while (engram_lookup_done(p) != 1)
        sched_yield();
    ASSERT_OK(engram_lookup_cancel(p));
    check(out, ids, 3, 1);
    /* No ids at all: nothing to wait for but the queue. */
    a.num_tokens = 0;
    ASSERT_OK(engram_lookup_submit(f.st, &a, &p));
    ASSERT_OK(engram_lookup_wait(p));
    fx_close(&f);
}

static void test_cancel(void)
{
    fixture f;
    engram_pending *busy, *queued, *again;
    int64_t ids[2] = {7, 9};
    unsigned char out1[2 * R], out2[2 * R], out3[2 * R];
    engram_lookup_args a;
    fx_open(&f);
    gate_set(&f.g, 1);
    a = args1(&f.s, ids, 2, out1);
    ASSERT_OK(engram_lookup_submit(f.st, &a, &busy));
    gate_wait_entered(&f.g, 1); /* the one thread is in read_rows */
    memset(out2, 0x33, sizeof out2);
    a = args1(&f.m, ids, 2, out2);
    ASSERT_OK(engram_lookup_submit(f.st, &a, &queued));
    ASSERT_EQ(engram_lookup_done(queued), 0);
    ASSERT_EQ(engram_lookup_done(busy), 0);
    ASSERT_ERR(engram_lookup_cancel(queued), -ECANCELED);
    ASSERT_CONTAINS(engram_errmsg(), "cancelled");
    /* Another one behind the busy one, waited for normally. */
    a = args1(&f.m, ids, 2, out3);
    ASSERT_OK(engram_lookup_submit(f.st, &a, &again));
    gate_set(&f.g, 0);
    /* A running (or finished) lookup is waited for by cancel. */
    ASSERT_OK(engram_lookup_cancel(busy));
    check(out1, ids, 2, 2);
    ASSERT_OK(engram_lookup_wait(again));
    check(out3, ids, 2, 1);
    ASSERT_ALL_BYTES(out2, 0x33, sizeof out2); /* the cancelled one never wrote */
    fx_close(&f);
}

typedef struct closer {
    engram_store *st;
} closer;

static void *close_thread(void *p)
{
    engram_store_close(((closer *)p)->st);
    return NULL;
}

static void test_close_with_pending(void)
{
    fixture f;
    engram_pending *running, *queued[3];
    int64_t ids[2] = {1, 2};
    unsigned char out[4][2 * R];
    engram_lookup_args a;
    pthread_t th;
    closer c;
    fx_open(&f);
    gate_set(&f.g, 1);
    a = args1(&f.s, ids, 2, out[0]);
    ASSERT_OK(engram_lookup_submit(f.st, &a, &running));
    gate_wait_entered(&f.g, 1);
    for (int k = 0; k < 3; k++) {
        memset(out[k + 1], 0x44, sizeof out[k + 1]);
        a = args1(&f.m, ids, 2, out[k + 1]);
        ASSERT_OK(engram_lookup_submit(f.st, &a, &queued[k]));
    }
    c.st = f.st;
    ASSERT_EQ(pthread_create(&th, NULL, close_thread, &c), 0);
    /* The close cancels what did not start, then waits for the running
     * lookup, which the gate holds until those are settled. */
    for (int k = 0; k < 3; k++)
        while (engram_lookup_done(queued[k]) != 1)
            sched_yield();
    ASSERT_EQ(engram_lookup_done(running), 0);
    gate_set(&f.g, 0);
    ASSERT_EQ(pthread_join(th, NULL), 0);
    /* Waited for after the close. */
    ASSERT_OK(engram_lookup_wait(running));
    check(out[0], ids, 2, 2);
    for (int k = 0; k < 3; k++) {
        ASSERT_ERR(engram_lookup_wait(queued[k]), ENGRAM_ESTATE);
        ASSERT_CONTAINS(engram_errmsg(), "closed before the lookup ran");
        ASSERT_ALL_BYTES(out[k + 1], 0x44, sizeof out[k + 1]);
    }
    free(f.rows);
    pthread_cond_destroy(&f.g.cv);
    pthread_mutex_destroy(&f.g.mu);
}

static void test_fork(void)
{
    fixture f;
    engram_pending *p;
    int64_t ids[3] = {3, 1, 4};
    unsigned char out[3 * R];
    engram_lookup_args a;
    pid_t pid;
    int status;
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer cannot start threads in the child of a process that
     * has threads (it dies there), which is what this case checks. */
    tu_skip_case("ThreadSanitizer does not support threads started after a fork of a "
                 "threaded process");
    return;
#endif
    fx_open(&f);
    a = args1(&f.m, ids, 3, out);
    ASSERT_OK(engram_lookup_submit(f.st, &a, &p)); /* the parent's threads start */
    ASSERT_OK(engram_lookup_wait(p));
    fflush(stdout);
    fflush(stderr);
    if ((pid = fork()) == 0) {
        unsigned char cout[3 * R];
        engram_pending *q;
        a = args1(&f.m, ids, 3, cout);
        if (engram_lookup_submit(f.st, &a, &q) != 0 || engram_lookup_wait(q) != 0)
            _exit(2);
        for (int i = 0; i < 3; i++)
            if (tu_row_mismatch(cout + i * R, 1, (uint64_t)ids[i], R) >= 0)
                _exit(3);
        _exit(0);
    }
    ASSERT(pid > 0);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    /* The parent's threads still serve it. */
    a = args1(&f.m, ids, 3, out);
    ASSERT_OK(engram_lookup_submit(f.st, &a, &p));
    ASSERT_OK(engram_lookup_wait(p));
    check(out, ids, 3, 1);

    /* Lookups of the parent's, running and queued at the fork: a child
     * that waits for one or cancels it is told so at once (it has no
     * thread that would ever finish them), and they are still the
     * parent's. */
    {
        engram_pending *running, *queued;
        unsigned char out2[3 * R];
        gate_set(&f.g, 1);
        a = args1(&f.s, ids, 3, out);
        ASSERT_OK(engram_lookup_submit(f.st, &a, &running));
        gate_wait_entered(&f.g, 1);
        memset(out2, 0x77, sizeof out2);
        a = args1(&f.m, ids, 3, out2);
        ASSERT_OK(engram_lookup_submit(f.st, &a, &queued));
        fflush(stdout);
        fflush(stderr);
        if ((pid = fork()) == 0) {
            alarm(60); /* a wait that blocks fails the case, not the run */
            if (engram_lookup_done(running) != 1 || engram_lookup_done(queued) != 1)
                _exit(2);
            if (engram_lookup_wait(running) != ENGRAM_ESTATE ||
                !strstr(engram_errmsg(), "before a fork"))
                _exit(3);
            if (engram_lookup_cancel(queued) != ENGRAM_ESTATE)
                _exit(4);
            if (engram_lookup_wait(queued) != ENGRAM_ESTATE)
                _exit(5);
            _exit(0);
        }
        ASSERT(pid > 0);
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT(WIFEXITED(status));
        ASSERT_EQ(WEXITSTATUS(status), 0);
        ASSERT_EQ(engram_lookup_done(queued), 0);
        gate_set(&f.g, 0);
        ASSERT_OK(engram_lookup_wait(running));
        check(out, ids, 3, 2);
        ASSERT_OK(engram_lookup_wait(queued));
        check(out2, ids, 3, 1);
    }
    fx_close(&f);
}

/* ------------------------------------------------------------------------
 * Tokens to rows.
 */

static void test_ngram_lookup(void)
{
    static const int64_t lids[2] = {3, 8};
    engram_ngram_config cfg = ENGRAM_NGRAM_CONFIG_INIT;
    engram_ngram_layout_info li = ENGRAM_NGRAM_LAYOUT_INFO_INIT;
    engram_ngram_hash_args h = ENGRAM_NGRAM_HASH_ARGS_INIT, hb;
    engram_lookup_args look = ENGRAM_LOOKUP_ARGS_INIT, lb;
    engram_ngram_layout *lay;
    engram_ngram_hasher *hs;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_store *st;
    engram_table_id whole, cols[6];
    engram_pending *p;
    enum { T = 20 };
    int64_t toks[T], ids[T * 2 * 6];
    unsigned char *rows[7], *out, *out2;
    uint64_t rng = 9;
    int rc;

    cfg.num_layers = 2;
    cfg.layer_ids = lids;
    cfg.vocab_size = 40;
    cfg.max_ngram = 3;
    cfg.heads = 3;
    cfg.compressed_vocab = 30;
    cfg.pad_id = 1;
    ASSERT_OK(engram_ngram_layout_create(&cfg, &lay));
    ASSERT_OK(engram_get_ngram_layout_info(lay, &li));
    ASSERT_OK(engram_ngram_hasher_create(lay, NULL, 0, &hs));
    o.threads = 2;
    ASSERT_OK(engram_store_open_memory(&o, &st));
    /* Layer 1 (index 1): one table of all its rows (seed 10), and a table
     * per column (seeds 20 + c). */
    {
        engram_table_spec spec = {li.num_rows[1], R, 0};
        char name[32];
        rows[6] = tu_make_rows(10, li.num_rows[1], R, 0, 0);
        ASSERT_OK(engram_bind(st, "layer", &spec, rows[6]));
        ASSERT_OK(engram_table_open(st, "layer", &whole));
        for (uint32_t c = 0; c < 6; c++) {
            engram_table_spec cs = {li.primes[6 + c], R, 0};
            snprintf(name, sizeof name, "engram:l8:h%u", c);
            rows[c] = tu_make_rows(20 + c, li.primes[6 + c], R, 0, 0);
            ASSERT_OK(engram_bind(st, name, &cs, rows[c]));
            ASSERT_OK(engram_table_open(st, name, &cols[c]));
        }
    }
    for (int i = 0; i < T; i++)
        toks[i] = tu_rand_below(&rng, 7) == 0 ? -1 : (int64_t)tu_rand_below(&rng, 30);
    out = tu_xmalloc(T * 6 * R);
    out2 = tu_xmalloc(T * 6 * R);
    h.num_tokens = T;
    h.tokens = toks;
    h.token_type = ENGRAM_ID_INT64;
    h.layer = 1;

    /* Global ids into the layer's table. */
    {
        engram_ngram_hash_args g = h;
        g.out = ids;
        g.out_type = ENGRAM_ID_INT64;
        ASSERT_OK(engram_ngram_hash(hs, &g));
    }
    look.out = out;
    ASSERT_OK(engram_ngram_lookup(st, hs, &h, &whole, 1, &look));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < 6; c++)
            ASSERT_ROW(out + ((size_t)t * 6 + c) * R, 10, (uint64_t)ids[t * 6 + c], R);
    /* The same, submitted. */
    look.out = out2;
    ASSERT_OK(engram_ngram_lookup_submit(st, hs, &h, &whole, 1, &look, &p));
    ASSERT_OK(engram_lookup_wait(p));
    ASSERT(memcmp(out, out2, T * 6 * R) == 0);

    /* Local ids into a table per column. */
    {
        engram_ngram_hash_args g = h;
        g.flags = ENGRAM_NGRAM_LOCAL;
        g.out = ids;
        g.out_type = ENGRAM_ID_INT64;
        ASSERT_OK(engram_ngram_hash(hs, &g));
    }
    look.out = out;
    ASSERT_OK(engram_ngram_lookup(st, hs, &h, cols, 6, &look));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < 6; c++)
            ASSERT_ROW(out + ((size_t)t * 6 + c) * R, 20 + (uint32_t)c, (uint64_t)ids[t * 6 + c],
                       R);
    look.out = out2;
    memset(out2, 0, T * 6 * R);
    ASSERT_OK(engram_ngram_lookup_submit(st, hs, &h, cols, 6, &look, &p));
    ASSERT_OK(engram_lookup_wait(p));
    ASSERT(memcmp(out, out2, T * 6 * R) == 0);

    /* A bad token: at the call, or at the wait; nothing written. */
    toks[5] = 30;
    memset(out, 0x66, T * 6 * R);
    look.out = out;
    ASSERT_FAILS(engram_ngram_lookup(st, hs, &h, &whole, 1, &look), rc);
    ASSERT_EQ(rc, ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "tokens[5] = 30");
    ASSERT_OK(engram_ngram_lookup_submit(st, hs, &h, &whole, 1, &look, &p));
    ASSERT_ERR(engram_lookup_wait(p), ENGRAM_EBADID);
    ASSERT_CONTAINS(engram_errmsg(), "tokens[5] = 30");
    ASSERT_ALL_BYTES(out, 0x66, T * 6 * R);
    toks[5] = 2;
    /* A table smaller than the layer: its ids are bad ids. */
    ASSERT_ERR(engram_ngram_lookup(st, hs, &h, &cols[0], 1, &look), ENGRAM_EBADID);
    ASSERT_ALL_BYTES(out, 0x66, T * 6 * R);

    /* Bad arguments. */
    hb = h;
    hb.layer = -1;
    ASSERT_ERR(engram_ngram_lookup(st, hs, &hb, &whole, 1, &look), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "one layer");
    ASSERT_ERR(engram_ngram_lookup(st, hs, &h, cols, 5, &look), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "num_tables 5");
    lb = look;
    lb.tables = &whole;
    ASSERT_ERR(engram_ngram_lookup(st, hs, &h, &whole, 1, &lb), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &h, &whole, 1, &lb, &p), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup(st, NULL, &h, &whole, 1, &look), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup(NULL, hs, &h, &whole, 1, &look), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &h, &whole, 1, &look, NULL), -EINVAL);
    p = (engram_pending *)1;
    ASSERT_ERR(engram_ngram_lookup_submit(NULL, hs, &h, &whole, 1, &look, &p), -EINVAL);
    ASSERT(p == NULL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, NULL, &h, &whole, 1, &look, &p), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, NULL, &whole, 1, &look, &p), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &h, NULL, 1, &look, &p), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &h, &whole, 1, NULL, &p), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &h, cols, 0, &look, &p), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "num_tables 0");
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &hb, &whole, 1, &look, &p), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "one layer");
    ASSERT_ERR(engram_ngram_lookup(st, hs, NULL, &whole, 1, &look), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup(st, hs, &h, NULL, 1, &look), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup(st, hs, &h, &whole, 1, NULL), -EINVAL);
    lb = look;
    lb.size = 4;
    ASSERT_ERR(engram_ngram_lookup(st, hs, &h, &whole, 1, &lb), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &h, &whole, 1, &lb, &p), -EINVAL);
    hb = h;
    hb.size = 4;
    ASSERT_ERR(engram_ngram_lookup(st, hs, &hb, &whole, 1, &look), -EINVAL);
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &hb, &whole, 1, &look, &p), -EINVAL);
    /* A layer index past the layout's, at the call or at the wait. */
    hb = h;
    hb.layer = 2;
    ASSERT_ERR(engram_ngram_lookup(st, hs, &hb, &whole, 1, &look), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "layer 2");
    ASSERT_OK(engram_ngram_lookup_submit(st, hs, &hb, &whole, 1, &look, &p));
    ASSERT_ERR(engram_lookup_wait(p), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "layer 2");
    /* As many tokens as no buffer of ids can hold: refused, not wrapped. */
    hb = h;
    hb.num_tokens = SIZE_MAX / 4;
    ASSERT_ERR(engram_ngram_lookup(st, hs, &hb, &whole, 1, &look), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "too large");
    ASSERT_ERR(engram_ngram_lookup_submit(st, hs, &hb, &whole, 1, &look, &p), -EINVAL);
    ASSERT_CONTAINS(engram_errmsg(), "too large");
    /* No output: at the call, or at the wait. */
    lb = look;
    lb.out = NULL;
    ASSERT_ERR(engram_ngram_lookup(st, hs, &h, &whole, 1, &lb), -EINVAL);
    ASSERT_OK(engram_ngram_lookup_submit(st, hs, &h, &whole, 1, &lb, &p));
    ASSERT_ERR(engram_lookup_wait(p), -EINVAL);
    /* No tokens: nothing written, nothing wrong. */
    hb = h;
    hb.num_tokens = 0;
    ASSERT_OK(engram_ngram_lookup(st, hs, &hb, &whole, 1, &look));
    ASSERT_OK(engram_ngram_lookup_submit(st, hs, &hb, cols, 6, &look, &p));
    ASSERT_OK(engram_lookup_wait(p));
    ASSERT_ALL_BYTES(out, 0x66, T * 6 * R);

    engram_store_close(st);
    engram_ngram_hasher_destroy(hs);
    engram_ngram_layout_destroy(lay);
    for (int c = 0; c < 7; c++)
        free(rows[c]);
    free(out);
    free(out2);
}

int main(void)
{
    tu_watchdog(120);
    RUN_TEST(test_submit_wait);
    RUN_TEST(test_bad_id_at_wait);
    RUN_TEST(test_cancel);
    RUN_TEST(test_close_with_pending);
    RUN_TEST(test_fork);
    RUN_TEST(test_ngram_lookup);
    return tu_done("test_async");
}
