/*
 * push.c - the writer of a Redis table: a push, in the numbered steps
 * that redis.c's opening comment lists (begin, append, commit, publish),
 * each with its failure path, and the resolution of a publication whose
 * answer was lost.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <xxhash.h>

#include "common.h"
#include "rstore.h"

/* ------------------------------------------------------------------------
 * The writer.
 */

typedef struct rwriter {
    rstore *rs;
    engram__rsess *s;
    engram__rmanifest m;
    char kpre[KEY_MAX];
    uint32_t kpre_len;
    unsigned char *buf; /* one chunk */
    uint64_t fill;      /* rows in buf */
    uint64_t rows_done;
    uint64_t chunks_done;
    uint64_t renew_ns;  /* when the chunks' TTLs and the record are renewed next */
    XXH3_state_t *xs;
    char pfield[32];    /* this push's pending record */
    char popen[512];    /* its text while open, and once closed (without the stamp) */
    char pclosed[512];
    int failed;         /* a step failed: abort adds what it could not clean up */
} rwriter;

/* The next renewal is due in half a TTL. */
static void renew_later(rwriter *w)
{
    w->renew_ns = engram__now_ns() + (uint64_t)w->rs->ttl_ms * 1000000u / 2;
}

/* Stamps this push's record again, and schedules the next stamp: 0, or
 * -ECANCELED if a resolver closed it (the push can never publish). */
static int touch(rwriter *w, uint64_t deadline)
{
    const char *args[2] = {w->pfield, w->popen};
    long long v;
    int err;
    if ((err = script(w->rs, w->s, S_TOUCH, 2, args, NULL, deadline, "stamp a pending record",
                      &v)) != 0)
        return err;
    if (v != 1)
        return engram__err(-ECANCELED, "push of '%s' to %s was abandoned: its pending record "
                                       "'%s' was closed by a gc (engram_store_gc()), which "
                                       "takes a push that shows no life for its chunk TTL "
                                       "(%u ms) for dead",
                           w->m.name, w->rs->where, w->pfield, w->rs->ttl_ms);
    renew_later(w);
    return 0;
}

/* Sets the TTL of every chunk written so far again, and stamps the
 * record (step 2). */
static int renew_ttls(rwriter *w)
{
    char ms[24];
    uint64_t deadline = engram__rcl_deadline(w->rs->cl);
    int err;
    if ((err = touch(w, deadline)) != 0)
        return err;
    snprintf(ms, sizeof ms, "%u", w->rs->ttl_ms);
    for (uint64_t i = 0; i < w->chunks_done; i++) {
        char key[KEY_MAX + 24];
        const char *argv[3] = {"PEXPIRE", key, ms};
        redisReply *r;
        chunk_key(w->kpre, w->kpre_len, i, key);
        if ((err = key_cmd(w->rs, w->s, ENGRAM__RCL_WRITE, 3, argv, NULL, REDIS_REPLY_INTEGER,
                           deadline, "renew a chunk's TTL", &r)) != 0)
            return err;
        err = r->integer == 1 ? 0
                              : engram__err(-ENODATA, "push of '%s' to %s: chunk '%s' expired "
                                                      "before the push ended",
                                            w->m.name, w->rs->where, key);
        freeReplyObject(r);
        if (err)
            return err;
    }
    renew_later(w);
    return 0;
}

/* Writes chunk w->chunks_done from `rows` rows at `data` (step 2). */
static int put_chunk(rwriter *w, const unsigned char *data, uint64_t rows)
{
    char key[KEY_MAX + 24], ms[24];
    const char *argv[5] = {"SET", key, (const char *)data, "PX", ms};
    size_t lens[5];
    size_t len = (size_t)(rows * w->m.row_bytes);
    redisReply *r;
    int err;
    lens[1] = chunk_key(w->kpre, w->kpre_len, w->chunks_done, key);
    snprintf(ms, sizeof ms, "%u", w->rs->ttl_ms);
    lens[0] = 3;
    lens[2] = len;
    lens[3] = 2;
    lens[4] = strlen(ms);
    /* Counted before it is sent: a chunk whose reply is lost may exist. */
    w->chunks_done++;
    if ((err = key_cmd(w->rs, w->s, ENGRAM__RCL_WRITE, 5, argv, lens, REDIS_REPLY_STATUS,
                       engram__rcl_deadline(w->rs->cl), "write a chunk", &r)) != 0)
        return err;
    freeReplyObject(r);
    w->m.chunk_sums[w->chunks_done - 1] = XXH3_64bits(data, len);
    XXH3_64bits_update(w->xs, data, len);
    if (engram__now_ns() >= w->renew_ns)
        return renew_ttls(w);
    return 0;
}

static void rwriter_free(rwriter *w)
{
    if (!w)
        return;
    engram__rcl_sess_put(w->s);
    engram__rmanifest_free(&w->m);
    XXH3_freeState(w->xs);
    free(w->buf);
    free(w);
}

/* Deletes this push's chunks, then its record: only for a push that can
 * no longer publish (it never sent S_PUBLISH, or its record is closed).
 * 0, or the cleanup's failure (what is left is a gc's). */
static int discard(rwriter *w)
{
    engram__rpending p;
    pending_of(w->rs, &w->m, w->chunks_done, 0, &p);
    return pending_finish(w->rs, w->s, &p, w->pfield, engram__rcl_deadline(w->rs->cl));
}

/* Frees a writer after its push failed with `err` (message in
 * engram_errmsg()) and cannot publish any more: deletes what it wrote.
 * Returns err, with what could not be cleaned up added to the message. */
static int fail_discard(rwriter *w, int err)
{
    char msg[ENGRAM__ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", engram_errmsg());
    if (discard(w) != 0)
        engram__err(err, "%s (and cleaning up after it: %s; engram_store_gc() deletes them, or "
                         "they expire within %u ms if not yet published)",
                    msg, engram_errmsg(), w->rs->ttl_ms);
    else
        engram__err(err, "%s", msg);
    rwriter_free(w);
    return err;
}

void redis_writer_abort(void *wp)
{
    rwriter *w = wp;
    char msg[ENGRAM__ERRMSG_MAX];
    if (!w)
        return;
    if (w->failed) {
        /* After a failure of its own: the failure's message stays, with
         * what the cleanup could not do added. */
        fail_discard(w, 0);
        return;
    }
    /* Aborted by the caller: the cleanup's failure is nobody's return
     * value, so it goes to the log. */
    snprintf(msg, sizeof msg, "%s", engram_errmsg());
    if (discard(w) != 0)
        engram__log(ENGRAM_LOG_ERROR, 0, "abort of the push of '%s' to %s: %s", w->m.name,
                    w->rs->where, engram_errmsg());
    engram__err(0, "%s", msg);
    rwriter_free(w);
}

int redis_writer_begin(void *state, const char *name, const engram_table_spec *spec,
                       void **out)
{
    rstore *rs = state;
    rwriter *w;
    engram__rpending p;
    uint64_t chunk_rows, max_rows;
    long long v;
    int err;

    if ((err = engram_spec_check(spec)) != 0)
        return err;
    chunk_rows = rs->chunk_bytes / spec->row_bytes;
    max_rows = ENGRAM__RM_CHUNK_MAX / spec->row_bytes;
    if (chunk_rows == 0)
        chunk_rows = 1;
    if (chunk_rows > max_rows)
        chunk_rows = max_rows;
    if (chunk_rows > spec->num_rows)
        chunk_rows = spec->num_rows;
    if (engram__rm_nchunks(spec->num_rows, chunk_rows) > ENGRAM__RM_CHUNKS_MAX)
        return engram__err(ENGRAM_ESPEC,
                           "table '%s' of %" PRIu64 " rows would need %" PRIu64
                           " chunks of %" PRIu64 " rows, above %" PRIu64 ": raise chunk_bytes",
                           name, spec->num_rows, engram__rm_nchunks(spec->num_rows, chunk_rows),
                           chunk_rows, ENGRAM__RM_CHUNKS_MAX);
    if (!(w = calloc(1, sizeof *w)))
        return engram__err(-ENOMEM, "out of memory");
    w->rs = rs;
    snprintf(w->m.name, sizeof w->m.name, "%s", name);
    w->m.num_rows = spec->num_rows;
    w->m.row_bytes = spec->row_bytes;
    w->m.chunk_rows = chunk_rows;
    w->m.nchunks = engram__rm_nchunks(spec->num_rows, chunk_rows);
    w->m.tagged = rs->tagged;
    if (getrandom(&w->m.epoch, sizeof w->m.epoch, 0) != (ssize_t)sizeof w->m.epoch)
        w->m.epoch = engram__wall_ns() ^ ((uint64_t)getpid() << 32);
    if (w->m.epoch == 0)
        w->m.epoch = 1;
    w->kpre_len = chunk_prefix(rs, name, w->m.epoch, w->m.tagged, w->kpre);
    pending_of(rs, &w->m, w->m.nchunks, 0, &p);
    engram__rpending_body(&p, w->popen, sizeof w->popen);
    p.closed = 1;
    engram__rpending_body(&p, w->pclosed, sizeof w->pclosed);
    pending_field(w->m.epoch, w->pfield);
    if (!(w->m.chunk_sums = malloc(w->m.nchunks * sizeof *w->m.chunk_sums)) ||
        !(w->buf = malloc((size_t)(chunk_rows * spec->row_bytes))) ||
        !(w->xs = XXH3_createState())) {
        err = engram__err(-ENOMEM, "out of memory for a push of '%s'", name);
        goto fail;
    }
    XXH3_64bits_reset(w->xs);
    renew_later(w);
    if ((err = engram__rcl_sess_get(rs->cl, &w->s)) != 0)
        goto fail;
    /* What dead pushes and removals left behind goes first (best effort:
     * it is only housekeeping, and a failure here says nothing of ours). */
    {
        char msg[ENGRAM__ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", engram_errmsg());
        (void)gc_pass(rs, w->s, 0, 0, NULL, NULL);
        engram__err(0, "%s", msg);
    }
    /* Step 1: a published name fails at once, not after the upload; else
     * the open record makes the chunks to come findable by a gc, should
     * this push die. */
    {
        const char *args[3] = {name, w->pfield, w->popen};
        if ((err = script(rs, w->s, S_BEGIN, 3, args, NULL, engram__rcl_deadline(rs->cl),
                          "begin a push", &v)) != 0)
            goto fail;
    }
    if (v != 1) {
        err = engram__err(-EEXIST, "table '%s' already exists in %s", name, rs->where);
        goto fail;
    }
    *out = w;
    return 0;
fail:
    rwriter_free(w);
    return err;
}

int redis_writer_append(void *wp, const void *rows, uint64_t nrows, size_t src_stride)
{
    rwriter *w = wp;
    const unsigned char *src = rows;
    size_t rb = w->m.row_bytes;
    int err;
    if (nrows == 0)
        return 0;
    if (!src_stride)
        src_stride = rb;
    if (!rows || src_stride < rb)
        return engram__err(-EINVAL, "append to '%s': rows NULL or stride %zu < row_bytes %zu",
                           w->m.name, src_stride, rb);
    if (nrows > w->m.num_rows - w->rows_done)
        return engram__err(ENGRAM_ESTATE, "append of %" PRIu64 " rows to '%s' goes beyond its %"
                                          PRIu64 " rows",
                           nrows, w->m.name, w->m.num_rows);
    while (nrows > 0) {
        uint64_t chunk_left = w->m.chunk_rows, n;
        /* The last chunk holds what is left. */
        if (w->chunks_done * w->m.chunk_rows + chunk_left > w->m.num_rows)
            chunk_left = w->m.num_rows - w->chunks_done * w->m.chunk_rows;
        chunk_left -= w->fill;
        if (w->fill == 0 && src_stride == rb && nrows >= chunk_left) {
            /* A whole chunk, packed in the caller's memory: sent from there. */
            if ((err = put_chunk(w, src, chunk_left)) != 0)
                goto fail;
            n = chunk_left;
        } else {
            n = nrows < chunk_left ? nrows : chunk_left;
            for (uint64_t i = 0; i < n; i++)
                memcpy(w->buf + (w->fill + i) * rb, src + i * src_stride, rb);
            w->fill += n;
            if (n == chunk_left) {
                if ((err = put_chunk(w, w->buf, w->fill)) != 0)
                    goto fail;
                w->fill = 0;
            }
        }
        w->rows_done += n;
        nrows -= n;
        src += n * src_stride;
    }
    return 0;
fail:
    w->failed = 1;
    return err;
}

/* Sends this push's publication (S_PUBLISH) of manifest `text`: 0 and
 * *v, its answer, or the failure (`what` names the step in its message),
 * after which whether it ran is unknown. */
static int publish(rwriter *w, const char *text, size_t tlen, const char *what, long long *v)
{
    const char *args[4] = {w->pfield, w->m.name, text, w->pclosed};
    size_t lens[4] = {strlen(w->pfield), strlen(w->m.name), tlen, strlen(w->pclosed)};
    return script(w->rs, w->s, S_PUBLISH, 4, args, lens, engram__rcl_deadline(w->rs->cl), what,
                  v);
}

/* The publication's reply was lost (`err`, message in engram_errmsg()):
 * resolves what happened by closing this push's record, which no copy of
 * the publication still in flight can get past.  0 if the push turned
 * out published; else frees w and returns the failure, saying what it
 * left. */
static int resolve(rwriter *w, int err, const char *text, size_t tlen)
{
    rstore *rs = w->rs;
    char first[ENGRAM__ERRMSG_MAX];
    const char *args[2] = {w->pfield, "0"};
    long long state, v;
    int rerr;

    snprintf(first, sizeof first, "%s", engram_errmsg());
    at_step("resolve", w->m.name);
    if ((rerr = script(rs, w->s, S_CLOSE, 2, args, NULL, engram__rcl_deadline(rs->cl),
                       "close the push's pending record", &state)) != 0 ||
        (state != 0 && state != 1)) {
        if (!rerr)
            engram__err(-EIO, "its pending record '%s' is not one this library wrote", w->pfield);
        err = engram__err(ENGRAM_EINDOUBT,
                          "push of '%s' to %s: the outcome is in doubt: the publication got no "
                          "answer (%s), and asking afterwards failed too (%s).  Its chunks are "
                          "kept: if the table is listed later, it is published and whole; if "
                          "not, engram_store_gc() (engram gc --redis) deletes them once the "
                          "push has shown no life for its chunk TTL (%u ms)",
                          w->m.name, rs->where, first, engram_errmsg(), rs->ttl_ms);
        rwriter_free(w);
        return err;
    }
    if (state == 1) {
        /* Closed by us (or a gc): nothing can publish it now. */
        engram__err(err, "push of '%s' failed, not published: %s", w->m.name, first);
        return fail_discard(w, err);
    }
    /* Gone: published by the lost publication (or by a copy of it), or
     * resolved by another process.  The publication again tells which
     * (with the record gone it can publish nothing), and if the manifest
     * is ours it writes it again on this connection, so that the WAIT
     * after it covers the publication, as for one answered. */
    if ((rerr = publish(w, text, tlen, "read the manifest back", &v)) != 0) {
        err = engram__err(ENGRAM_EINDOUBT,
                          "push of '%s' to %s: the outcome is in doubt: the publication got "
                          "no answer (%s), its pending record is gone, and the manifest "
                          "could not be read (%s): list the namespace to see whether it "
                          "is published",
                          w->m.name, rs->where, first, engram_errmsg());
        rwriter_free(w);
        return err;
    }
    if (v == 1)
        return 0;
    if (v != 0 && v != -1) {
        err = engram__err(ENGRAM_EINDOUBT,
                          "push of '%s' to %s: the outcome is in doubt: the publication got "
                          "no answer (%s), and reading it back answered %lld: list the "
                          "namespace to see whether it is published",
                          w->m.name, rs->where, first, v);
        rwriter_free(w);
        return err;
    }
    err = engram__err(err, "push of '%s' failed, not published (its pending record was resolved "
                           "by another process, which deletes its chunks): %s",
                      w->m.name, first);
    rwriter_free(w);
    return err;
}

int redis_writer_commit(void *wp)
{
    rwriter *w = wp;
    rstore *rs = w->rs;
    char *text = NULL;
    size_t tlen;
    redisReply *r;
    long long v;
    int err;

    if (w->rows_done != w->m.num_rows) {
        err = engram__err(ENGRAM_ESTATE, "table '%s': only %" PRIu64 " of %" PRIu64
                                         " rows were written",
                          w->m.name, w->rows_done, w->m.num_rows);
        goto fail;
    }
    /* Step 3: the chunks become permanent, with the record stamped now
     * and then, so that no gc takes a long commit for a dead one ... */
    if ((err = touch(w, engram__rcl_deadline(rs->cl))) != 0)
        goto fail;
    for (uint64_t i = 0; i < w->chunks_done; i++) {
        char key[KEY_MAX + 24];
        const char *argv[2] = {"PERSIST", key};
        if (engram__now_ns() >= w->renew_ns &&
            (err = touch(w, engram__rcl_deadline(rs->cl))) != 0)
            goto fail;
        chunk_key(w->kpre, w->kpre_len, i, key);
        if ((err = key_cmd(rs, w->s, ENGRAM__RCL_WRITE, 2, argv, NULL, REDIS_REPLY_INTEGER,
                           engram__rcl_deadline(rs->cl), "keep a chunk", &r)) != 0)
            goto fail;
        err = r->integer == 1 ? 0
                              : engram__err(-ENODATA, "push of '%s' to %s: chunk '%s' is gone "
                                                      "(expired or removed) before publication",
                                            w->m.name, rs->where, key);
        freeReplyObject(r);
        if (err)
            goto fail;
    }
    /* ... and on the replicas, before the manifest makes them a table. */
    if ((err = engram__rcl_sync(w->s, engram__rcl_deadline(rs->cl))) != 0) {
        err = engram__err(err, "push of '%s' to %s: %s", w->m.name, rs->where, engram_errmsg());
        goto fail;
    }
    w->m.checksum = XXH3_64bits_digest(w->xs);
    w->m.created_ns = engram__wall_ns();
    if ((err = engram__rmanifest_encode(&w->m, &text, &tlen)) != 0)
        goto fail;
    /* Step 4: publication, one atomic step that needs the record open. */
    at_step("publish", w->m.name);
    if ((err = publish(w, text, tlen, "publish a table", &v)) == 0 && v != 1 && v != 0 &&
        v != -1)
        /* Not an answer this script gives: take nothing for granted. */
        err = engram__err(-EIO, "publish '%s' in %s: the script answered %lld", w->m.name,
                          rs->where, v);
    if (err) {
        /* Whether it ran is unknown: find out before anything is
         * deleted. */
        if ((err = resolve(w, err, text, tlen)) != 0) {
            free(text);
            return err;
        }
    } else if (v != 1) {
        err = v == 0 ? engram__err(-EEXIST, "table '%s' already exists in %s (another push won)",
                                   w->m.name, rs->where)
                     : engram__err(-ECANCELED,
                                   "push of '%s' to %s was abandoned: its pending record '%s' "
                                   "was closed by a gc (engram_store_gc()) before it could "
                                   "publish",
                                   w->m.name, rs->where, w->pfield);
        goto fail;
    }
    pthread_mutex_lock(&rs->lock);
    rs->have_ns_bytes = 0;
    pthread_mutex_unlock(&rs->lock);
    /* The table is published; a manifest not yet on the replicas may be
     * lost in a failover, which the caller should hear of. */
    if ((err = engram__rcl_sync(w->s, engram__rcl_deadline(rs->cl))) != 0)
        err = engram__err(err, "table '%s' is published in %s, but: %s", w->m.name, rs->where,
                          engram_errmsg());
    free(text);
    rwriter_free(w);
    return err;
fail:
    free(text);
    return fail_discard(w, err);
}
