/*
 * nsops.c - the namespace operations of a store on a Redis Cluster: info
 * and list (the manifests), read_all (a whole table, checked chunk by
 * chunk: what verify and pull are made of), remove (compare-and-delete)
 * and gc (the pending records that dead pushes and removals left).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common.h"
#include "rstore.h"

/* ------------------------------------------------------------------------
 * Info, list, verify, remove.
 */

int redis_info(void *state, const char *name, engram_table_info *info)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    int err;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    err = manifest_get(rs, s, name, engram__rcl_deadline(rs->cl), &m, NULL);
    engram__rcl_sess_put(s);
    if (err)
        return err;
    manifest_info(rs, &m, info);
    engram__rmanifest_free(&m);
    return 0;
}

int redis_list(void *state, int (*add)(void *ud, const char *name), void *ud)
{
    rstore *rs = state;
    const char *argv[2] = {"HKEYS", rs->mkey};
    engram__rsess *s;
    redisReply *r;
    int err;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    err = key_cmd(rs, s, 0, 2, argv, NULL, REDIS_REPLY_ARRAY, engram__rcl_deadline(rs->cl),
                  "list the tables", &r);
    engram__rcl_sess_put(s);
    if (err)
        return err;
    for (size_t i = 0; i < r->elements && !err; i++) {
        const redisReply *e = r->element[i];
        /* Only names this library could have written. */
        if (e->type == REDIS_REPLY_STRING && strlen(e->str) == e->len &&
            engram__name_valid(e->str))
            err = add(ud, e->str);
    }
    freeReplyObject(r);
    return err;
}

/* Whole chunks read in one pipelined batch by redis_read_all(): about
 * 32 MiB, so every master has many in flight at once, and at most 4096
 * chunks (tables of tiny chunks: bounded requests).  A batch of larger
 * chunks (one chunk of up to 512 MiB) gets a deadline as much longer. */
#define STREAM_BATCH_BYTES ((uint64_t)32 << 20)
#define STREAM_BATCH_CHUNKS 4096u

/* redis_read_all()'s two buffers: while the reader fills one from the
 * cluster, a thread of its own checks the other's chunks and hands them
 * to the sink (which may write them to a file), so the network and the
 * disk (or memory) work at once.  Everything below `mu` guards. */
typedef struct stream {
    const rstore *rs;
    const char *name;
    const engram__rmanifest *m;
    const engram__remote_sink *k;
    const char *kpre;
    uint32_t kpre_len;
    unsigned char *buf[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t c0[2], n[2], rows[2]; /* the batch a full buffer holds */
    int full[2];
    int done; /* no more batches */
    int err;  /* the consumer's failure, with its message */
    char msg[ENGRAM__ERRMSG_MAX];
} stream;

/* Checks batch `b`'s chunks against the manifest and hands them on: 0,
 * or the failure (its message in this thread's errmsg). */
static int stream_consume(stream *x, int b)
{
    const engram__rmanifest *m = x->m;
    const unsigned char *p = x->buf[b];
    for (uint64_t i = 0; i < x->n[b]; i++) {
        uint64_t c = x->c0[b] + i;
        uint64_t len = (c + 1 < m->nchunks ? m->chunk_rows : m->num_rows - c * m->chunk_rows) *
                       m->row_bytes;
        uint64_t sum = XXH3_64bits(p, len);
        if (sum != m->chunk_sums[c]) {
            char key[KEY_MAX + 24];
            chunk_key(x->kpre, x->kpre_len, c, key);
            return engram__err(ENGRAM_ECHECKSUM,
                               "table '%s' in %s: chunk %" PRIu64 " ('%s') has checksum "
                               "%016" PRIx64 ", the manifest says %016" PRIx64,
                               x->name, x->rs->where, c, key, sum, m->chunk_sums[c]);
        }
        p += len;
    }
    return x->k->rows(x->k->ud, x->buf[b], x->rows[b]);
}

static void *stream_main(void *arg)
{
    stream *x = arg;
    for (int b = 0;; b ^= 1) {
        int err;
        pthread_mutex_lock(&x->mu);
        while (!x->full[b] && !x->done)
            pthread_cond_wait(&x->cv, &x->mu);
        if (!x->full[b]) { /* done, and nothing left */
            pthread_mutex_unlock(&x->mu);
            return NULL;
        }
        pthread_mutex_unlock(&x->mu);
        err = stream_consume(x, b);
        pthread_mutex_lock(&x->mu);
        x->full[b] = 0;
        if (err) {
            x->err = err;
            snprintf(x->msg, sizeof x->msg, "%s", engram_errmsg());
        }
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        if (err)
            return NULL;
    }
}

/* Reads table `name` whole, in order: chunks in pipelined batches of
 * GETRANGE to every master at once, each chunk checked against the
 * manifest's checksum before its rows go to the sink (remote.h). */
int redis_read_all(void *state, const char *name, const engram__remote_sink *k)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    stream x;
    pthread_t th;
    char kpre[KEY_MAX];
    uint64_t chunk_bytes, per;
    int err, started = 0;

    memset(&x, 0, sizeof x);
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    if ((err = manifest_get(rs, s, name, engram__rcl_deadline(rs->cl), &m, NULL)) != 0)
        goto out;
    {
        engram_table_spec spec = {m.num_rows, m.row_bytes, 0};
        if (k->begin && (err = k->begin(k->ud, &spec, m.checksum)) != 0)
            goto out;
    }
    chunk_bytes = m.chunk_rows * m.row_bytes;
    per = STREAM_BATCH_BYTES / chunk_bytes ? STREAM_BATCH_BYTES / chunk_bytes : 1;
    if (per > STREAM_BATCH_CHUNKS)
        per = STREAM_BATCH_CHUNKS;
    if (per > m.nchunks)
        per = m.nchunks ? m.nchunks : 1;
    x.rs = rs;
    x.name = name;
    x.m = &m;
    x.k = k;
    x.kpre = kpre;
    x.kpre_len = chunk_prefix(rs, name, m.epoch, m.tagged, kpre);
    if (!(x.buf[0] = malloc(per * chunk_bytes)) ||
        !(x.buf[1] = m.nchunks > per ? malloc(per * chunk_bytes) : x.buf[0])) {
        err = engram__err(-ENOMEM, "out of memory for 2 x %" PRIu64 " chunks of %" PRIu64
                                   " bytes",
                          per, chunk_bytes);
        goto out;
    }
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    if ((err = pthread_create(&th, NULL, stream_main, &x)) != 0) {
        err = engram__err(-err, "read table '%s': cannot start a thread", name);
        goto out_sync;
    }
    started = 1;
    for (uint64_t c0 = 0, b = 0; c0 < m.nchunks; c0 += per, b ^= 1) {
        uint64_t n = m.nchunks - c0 < per ? m.nchunks - c0 : per, rows = 0;
        engram__rcl_get *g;
        /* Wait for this buffer to be handed on (or for a failure there). */
        pthread_mutex_lock(&x.mu);
        while (x.full[b] && !x.err)
            pthread_cond_wait(&x.cv, &x.mu);
        /* The consumer's message is in its own thread's errmsg: copied
         * here, as after the join below. */
        err = x.err ? engram__err(x.err, "%s", x.msg) : 0;
        pthread_mutex_unlock(&x.mu);
        if (err)
            break;
        if (!(g = engram__rcl_gets(s, n))) {
            err = engram__err(-ENOMEM, "out of memory for %" PRIu64 " reads", n);
            break;
        }
        for (uint64_t i = 0; i < n; i++) {
            uint64_t c = c0 + i;
            uint64_t r = c + 1 < m.nchunks ? m.chunk_rows : m.num_rows - c * m.chunk_rows;
            g[i] = (engram__rcl_get){.kpre = kpre,
                                     .ksuf = c,
                                     .start = 0,
                                     .dst = x.buf[b] + rows * m.row_bytes,
                                     .kpre_len = x.kpre_len,
                                     .len = (uint32_t)(r * m.row_bytes),
                                     .slot = chunk_slot(kpre, x.kpre_len, c),
                                     .whole = 1};
            rows += r;
        }
        {
            /* One operation's time per 32 MiB of the batch. */
            uint64_t now = engram__now_ns(), dl = engram__rcl_deadline(rs->cl);
            uint64_t scale = (rows * m.row_bytes + STREAM_BATCH_BYTES - 1) / STREAM_BATCH_BYTES;
            if (scale > 1)
                dl += (dl - now) * (scale - 1);
            err = engram__rcl_read(s, g, n, dl);
        }
        if (err != 0) {
            /* A chunk missing or of the wrong length (-ENODATA) is data
             * lost; anything else (the network, rights) says nothing of
             * the data. */
            if (err == -ENODATA)
                err = engram__err(-ENODATA, "table '%s' in %s is listed, but its data is not "
                                            "whole: a chunk is missing or has the wrong length "
                                            "(%s); remove the table and push it again",
                                  name, rs->where, engram_errmsg());
            break;
        }
        pthread_mutex_lock(&x.mu);
        x.c0[b] = c0;
        x.n[b] = n;
        x.rows[b] = rows;
        x.full[b] = 1;
        pthread_cond_broadcast(&x.cv);
        pthread_mutex_unlock(&x.mu);
        /* Progress (and a cancel) on the caller's thread. */
        if (k->read && (err = k->read(k->ud, rows)) != 0)
            break;
    }
    /* The consumer hands on what is full, then ends; a failure of the
     * reader's own stops it after the batch it holds. */
    pthread_mutex_lock(&x.mu);
    x.done = 1;
    if (err)
        x.full[0] = x.full[1] = 0;
    pthread_cond_broadcast(&x.cv);
    pthread_mutex_unlock(&x.mu);
    if (started)
        pthread_join(th, NULL);
    if (!err && x.err)
        err = engram__err(x.err, "%s", x.msg);
out_sync:
    pthread_cond_destroy(&x.cv);
    pthread_mutex_destroy(&x.mu);
out:
    if (x.buf[1] != x.buf[0])
        free(x.buf[1]);
    free(x.buf[0]);
    engram__rmanifest_free(&m);
    engram__rcl_sess_put(s);
    return err;
}

/* Removal is compare-and-delete: the manifest read is unpublished only
 * if it is still the one published (S_REMOVE), in the same step as a
 * closed record takes over its chunks; then the chunks go, then the
 * record. */
int redis_remove(void *state, const char *name, int *unpublished)
{
    rstore *rs = state;
    engram__rsess *s;
    engram__rmanifest m;
    engram__rpending p;
    uint64_t deadline = engram__rcl_deadline(rs->cl);
    redisReply *raw = NULL;
    char field[32] = "", closed[512] = "";
    long long v;
    int err, parsed;

    *unpublished = 0;
    memset(&m, 0, sizeof m);
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    /* The text read is kept: the removal compares it. */
    err = manifest_get(rs, s, name, deadline, &m, &raw);
    if (err != 0 && err != ENGRAM_ECORRUPT)
        goto out;
    /* A corrupt manifest is removed all the same; its chunks (whose keys
     * it would name) stay behind. */
    parsed = err == 0;
    if (parsed) {
        pending_of(rs, &m, m.nchunks, 1, &p);
        pending_field(m.epoch, field);
        engram__rpending_body(&p, closed, sizeof closed);
    }
    at_step("remove", name);
    {
        const char *args[4] = {name, raw->str, field, closed};
        size_t lens[4] = {strlen(name), raw->len, strlen(field), strlen(closed)};
        if ((err = script(rs, s, S_REMOVE, 4, args, lens, deadline, "unpublish a table", &v)) !=
            0) {
            /* A refusal of the user's rights is an answer: nothing ran. */
            if (err == -EACCES)
                goto out;
            err = engram__err(ENGRAM_EINDOUBT,
                              "remove of table '%s' from %s: the outcome is in doubt: %s.  If "
                              "it is no longer listed, it was removed, and engram_store_gc() "
                              "deletes what is left of its chunks",
                              name, rs->where, engram_errmsg());
            goto out;
        }
    }
    if (v != 1) {
        err = v == 0 ? engram__err(-ENOENT, "table '%s' not found in %s (removed meanwhile)", name,
                                   rs->where)
              : v == -1
                  ? engram__err(-ENOENT, "table '%s' in %s was removed and pushed again while "
                                         "this removal ran: the table pushed since is kept",
                                name, rs->where)
                  : engram__err(-EIO, "remove '%s' in %s: the script answered %lld", name,
                                rs->where, v);
        goto out;
    }
    *unpublished = 1;
    pthread_mutex_lock(&rs->lock);
    rs->have_ns_bytes = 0;
    pthread_mutex_unlock(&rs->lock);
    if (!parsed)
        goto out;
    /* The chunks go only once the replicas have the removal: a failover
     * that lost it would bring the table back, listed, without its
     * data. */
    if ((err = engram__rcl_sync(s, deadline)) != 0 ||
        (err = pending_finish(rs, s, &p, field, deadline)) != 0)
        err = engram__err(err, "table '%s' was unpublished from %s, but: %s (its pending record "
                               "'%s' stays, for engram_store_gc() to finish)",
                          name, rs->where, engram_errmsg(), field);
out:
    if (raw)
        freeReplyObject(raw);
    engram__rmanifest_free(&m);
    engram__rcl_sess_put(s);
    return err;
}

/* The server's clock (TIME of the manifests' master), in ms. */
static int server_ms(rstore *rs, engram__rsess *s, uint64_t deadline, uint64_t *ms)
{
    const char *argv[1] = {"TIME"};
    redisReply *r;
    int err;
    if ((err = engram__rcl_cmd(s, rs->mslot, 0, 1, argv, NULL, deadline, &r)) != 0)
        return engram__err(err, "read the time of %s: %s", rs->where, engram_errmsg());
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return engram__err(-EIO, "TIME in %s: a reply of an unexpected type", rs->where);
    }
    *ms = strtoull(r->element[0]->str, NULL, 10) * 1000u +
          strtoull(r->element[1]->str, NULL, 10) / 1000u;
    freeReplyObject(r);
    return 0;
}

static void gc_say(engram_gc_report_fn report, void *ud, const char *name, int code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void gc_say(engram_gc_report_fn report, void *ud, const char *name, int code,
                   const char *fmt, ...)
{
    char detail[ENGRAM__ERRMSG_MAX];
    va_list ap;
    if (!report)
        return;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    report(ud, name, code, detail);
}

/* Settles one pending record `field` (see gc_pass()); `now` is the
 * server's clock. */
static void gc_one(rstore *rs, engram__rsess *s, const char *field, uint64_t idle_ms,
                   uint64_t now, uint32_t flags, engram_gc_report_fn report, void *ud)
{
    const char *argv[3] = {"HGET", rs->mkey, field};
    uint64_t deadline = engram__rcl_deadline(rs->cl), min_idle, idle;
    char what[64], min_text[24], expect[32];
    const char *whose;
    engram__rpending p;
    redisReply *r;
    long long state;
    int err;

    if ((err = key_cmd(rs, s, 0, 3, argv, NULL, REDIS_REPLY_STRING, deadline,
                       "read a pending record", &r)) != 0) {
        gc_say(report, ud, field, err, "%s", engram_errmsg());
        return;
    }
    if (r->type == REDIS_REPLY_NIL) { /* settled meanwhile */
        freeReplyObject(r);
        return;
    }
    snprintf(what, sizeof what, "'%s'", field);
    err = engram__rpending_parse(r->str, r->len, what, &p);
    freeReplyObject(r);
    if (err) {
        gc_say(report, ud, field, err, "%s; left as it is", engram_errmsg());
        return;
    }
    /* The chunk keys to delete come from the record: only one under its
     * own field is one this library wrote. */
    pending_field(p.epoch, expect);
    if (strcmp(expect, field) != 0) {
        gc_say(report, ud, p.name, ENGRAM_ECORRUPT,
               "pending record %s names epoch %016" PRIx64 ", not its field's: not a record "
               "this library wrote; left as it is, with the keys it names",
               what, p.epoch);
        return;
    }
    whose = p.closed ? "a removed table or a failed push" : "an abandoned push";
    /* A push still running stamps its record every half TTL: one quiet
     * for a whole TTL is dead, or stuck past the life of its chunks. */
    min_idle = p.closed || idle_ms > p.ttl_ms ? idle_ms : p.ttl_ms;
    idle = now > p.stamp_ms ? now - p.stamp_ms : 0;
    if (idle < min_idle) {
        gc_say(report, ud, p.name, ENGRAM_GC_KEPT,
               "%s (epoch %016" PRIx64 ") that showed life %.1f s ago: kept until it has been "
               "quiet for %.1f s",
               p.closed ? "chunks of a removed table or a failed push" : "a push", p.epoch,
               (double)idle / 1e3, (double)min_idle / 1e3);
        return;
    }
    if (flags & ENGRAM_GC_DRY_RUN) {
        gc_say(report, ud, p.name, 0,
               "would delete the %" PRIu64 " chunk keys of %s (epoch %016" PRIx64 ", quiet for "
               "%.1f s)",
               p.nchunks, whose, p.epoch, (double)idle / 1e3);
        return;
    }
    /* Closed first (an open one in one step that checks its age again:
     * the push may have shown life since it was read), and the closing
     * on the replicas before any chunk goes: a failover that lost it
     * would leave an open record that a live push could still publish,
     * or bring back the table a removal unpublished, without its data.
     * A record closed before is written again, so that the wait covers
     * whoever closed it. */
    {
        const char *args[2] = {field, min_text};
        snprintf(min_text, sizeof min_text, "%" PRIu64, min_idle);
        if ((err = script(rs, s, S_CLOSE, 2, args, NULL, deadline, "close a pending record",
                          &state)) != 0) {
            gc_say(report, ud, p.name, err, "%s", engram_errmsg());
            return;
        }
        if (state == 0)
            return;
        if (state == 2) {
            gc_say(report, ud, p.name, ENGRAM_GC_KEPT,
                   "a push (epoch %016" PRIx64 ") that showed life just now: kept", p.epoch);
            return;
        }
        if (state != 1) {
            gc_say(report, ud, p.name, ENGRAM_ECORRUPT, "pending record %s changed into one "
                   "this library did not write; left as it is", what);
            return;
        }
    }
    if ((err = engram__rcl_sync(s, deadline)) != 0) {
        gc_say(report, ud, p.name, err, "pending record %s is closed, but its chunks are kept "
               "until the replicas have it: %s", what, engram_errmsg());
        return;
    }
    if ((err = pending_finish(rs, s, &p, field, engram__rcl_deadline(rs->cl))) != 0) {
        gc_say(report, ud, p.name, err, "%s", engram_errmsg());
        return;
    }
    gc_say(report, ud, p.name, 0,
           "deleted the %" PRIu64 " chunk keys of %s (epoch %016" PRIx64 ", quiet for %.1f s)",
           p.nchunks, whose, p.epoch, (double)idle / 1e3);
}

/* One pass over the namespace's pending records: each one is settled
 * (closed if it is still open, its chunks deleted, then the record), or
 * kept if it is a push that may still be running: open, and stamped less
 * than max(idle_ms, its TTL) ago.  Closed records go once idle_ms passed.
 * 0, or the failure to list the records. */
int gc_pass(rstore *rs, engram__rsess *s, uint64_t idle_ms, uint32_t flags,
            engram_gc_report_fn report, void *ud)
{
    const char *argv[2] = {"HKEYS", rs->mkey};
    uint64_t deadline = engram__rcl_deadline(rs->cl), now = 0;
    redisReply *r;
    int err;
    if ((err = key_cmd(rs, s, 0, 2, argv, NULL, REDIS_REPLY_ARRAY, deadline,
                       "list the pending records", &r)) != 0)
        return err;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        size_t fl = sizeof ENGRAM__RP_FIELD - 1;
        if (e->type != REDIS_REPLY_STRING || e->len != fl + 16 || strlen(e->str) != e->len ||
            memcmp(e->str, ENGRAM__RP_FIELD, fl) != 0)
            continue;
        /* The ages are measured on the clock that stamped the records. */
        if (!now && (err = server_ms(rs, s, deadline, &now)) != 0)
            break;
        gc_one(rs, s, e->str, idle_ms, now, flags, report, ud);
    }
    freeReplyObject(r);
    return err;
}

int redis_gc(void *state, uint64_t idle_ms, uint32_t flags, engram_gc_report_fn report,
             void *ud)
{
    rstore *rs = state;
    engram__rsess *s;
    int err;
    if ((err = engram__rcl_sess_get(rs->cl, &s)) != 0)
        return err;
    err = gc_pass(rs, s, idle_ms, flags, report, ud);
    engram__rcl_sess_put(s);
    return err;
}
