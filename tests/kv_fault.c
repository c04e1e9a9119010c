/*
 * kv_fault.c - the fault decorator of kv_fault.h.
 *
 * Every operation asks decide() what to do with it, under the mutex:
 * the kill first, then the first armed fault not yet fired.  The
 * operation itself is forwarded without the mutex, so that operations of
 * several threads run at once as they would on the store.  A deferred
 * operation is a copy of its arguments, forwarded by kvf_release().
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kv_fault.h"

#define KVF_MAX_FAULTS 8

enum { ACT_FORWARD, ACT_FAIL, ACT_LOST, ACT_DEFER, ACT_KILLED };

static const char *const op_names[KVF_OPS] = {
    "any", "rec_get", "rec_cas", "rec_list", "now_ms", "sync",
    "piece_put", "piece_expire", "piece_del", "get_ranges",
};

typedef struct fault {
    int act; /* ACT_FAIL, ACT_LOST or ACT_DEFER */
    kvf_match m;
    char *prefix; /* m.prefix, copied */
} fault;

/* A deferred write, with copies of its arguments. */
typedef struct deferred {
    struct deferred *next;
    int op;
    char *name; /* the record's, or the pieces' */
    /* rec_cas */
    char *expect, *val;
    size_t elen, vlen;
    /* pieces */
    uint64_t epoch;
    int layout;
    uint64_t index, n;
    unsigned char *data;
    size_t len;
    uint32_t ttl_ms;
} deferred;

typedef struct wpiece {
    char *name;
    uint64_t epoch;
    int layout;
    uint64_t index;
} wpiece;

struct kvf {
    const engram__kv_vt *vt; /* the wrapped implementation */
    void *kv;
    pthread_mutex_t mu;
    fault faults[KVF_MAX_FAULTS];
    unsigned nfaults, next; /* faults[next .. nfaults) are armed */
    unsigned fired;
    int killing;
    unsigned kill_left, killed;
    unsigned long count[KVF_OPS];
    deferred *dhead, *dtail;
    size_t ndeferred;
    wpiece *pieces;
    size_t npieces, cappieces;
    kvf_event *trace;
    size_t ntrace, captrace;
};

static void die(const char *what)
{
    fprintf(stderr, "FAIL: kv_fault: %s\n", what);
    fflush(stderr);
    exit(1);
}

/* ---- deciding ---- */

static int matches(const fault *fa, int op, const char *val, size_t vlen)
{
    if (fa->m.op != KVF_ANY && fa->m.op != op)
        return 0;
    if (fa->m.del && (op != KVF_REC_CAS || val != NULL))
        return 0;
    if (fa->prefix) {
        size_t n = strlen(fa->prefix);
        if (op != KVF_REC_CAS || !val || vlen < n || memcmp(val, fa->prefix, n) != 0)
            return 0;
    }
    return 1;
}

/* What to do with an operation of kind op (rec_cas: its new value). */
static int decide(kvf *f, int op, const char *val, size_t vlen)
{
    int act = ACT_FORWARD;
    pthread_mutex_lock(&f->mu);
    if (f->killing && f->kill_left == 0) {
        f->killed++;
        pthread_mutex_unlock(&f->mu);
        return ACT_KILLED;
    }
    if (f->killing)
        f->kill_left--;
    if (f->next < f->nfaults && matches(&f->faults[f->next], op, val, vlen)) {
        fault *fa = &f->faults[f->next];
        if (fa->m.skip > 0) {
            fa->m.skip--;
        } else {
            act = fa->act;
            f->next++;
            f->fired++;
            if (fa->m.then_kill) {
                f->killing = 1;
                f->kill_left = 0;
                f->killed = 0;
            }
        }
    }
    if (act == ACT_FORWARD || act == ACT_LOST) {
        f->count[op]++;
        f->count[KVF_ANY]++;
    }
    pthread_mutex_unlock(&f->mu);
    return act;
}

/* The failure an injected fault `act` makes of operation op on `what`. */
static int injected(int act, int op, const char *what)
{
    switch (act) {
    case ACT_FAIL:
        return engram__err(-ETIMEDOUT, "kv_fault: %s of '%s' timed out (injected: it did not run)",
                           op_names[op], what);
    case ACT_LOST:
        return engram__err(-ETIMEDOUT, "kv_fault: %s of '%s' timed out (injected: it ran, its "
                                       "reply was lost)",
                           op_names[op], what);
    case ACT_DEFER:
        return engram__err(-ETIMEDOUT, "kv_fault: %s of '%s' timed out (injected: it is still in "
                                       "flight, and lands later)",
                           op_names[op], what);
    default:
        return engram__err(-ECONNRESET, "kv_fault: %s of '%s': connection reset (injected: the "
                                        "writer was killed)",
                           op_names[op], what);
    }
}

/* ---- records of what was written ---- */

static void note_piece(kvf *f, const char *name, uint64_t epoch, int layout, uint64_t index)
{
    wpiece *v;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->npieces; i++) {
        const wpiece *w = &f->pieces[i];
        if (w->epoch == epoch && w->layout == layout && w->index == index &&
            strcmp(w->name, name) == 0) {
            pthread_mutex_unlock(&f->mu);
            return;
        }
    }
    if (f->npieces == f->cappieces) {
        size_t cap = f->cappieces ? 2 * f->cappieces : 64;
        if (!(v = realloc(f->pieces, cap * sizeof *v)))
            die("out of memory");
        f->pieces = v;
        f->cappieces = cap;
    }
    f->pieces[f->npieces] = (wpiece){strdup(name), epoch, layout, index};
    if (!f->pieces[f->npieces].name)
        die("out of memory");
    f->npieces++;
    pthread_mutex_unlock(&f->mu);
}

/* Adds an operation that reached the store to the trace. */
static void trace(kvf *f, int op, void *s, const char *name, const engram__kv_piece *pc,
                  uint64_t index, uint32_t ttl_ms, const char *val, size_t vlen, int del)
{
    kvf_event *e;
    pthread_mutex_lock(&f->mu);
    if (f->ntrace == f->captrace) {
        size_t cap = f->captrace ? 2 * f->captrace : 256;
        if (!(e = realloc(f->trace, cap * sizeof *e)))
            die("out of memory");
        f->trace = e;
        f->captrace = cap;
    }
    e = &f->trace[f->ntrace++];
    memset(e, 0, sizeof *e);
    e->op = op;
    e->s = s;
    snprintf(e->name, sizeof e->name, "%s", pc ? pc->name : name ? name : "");
    e->epoch = pc ? pc->epoch : 0;
    e->index = index;
    e->ttl_ms = ttl_ms;
    e->del = del;
    if (val)
        memcpy(e->head, val, vlen < sizeof e->head - 1 ? vlen : sizeof e->head - 1);
    pthread_mutex_unlock(&f->mu);
}

static char *dup_or_null(const void *v, size_t n)
{
    char *d;
    if (!v)
        return NULL;
    if (!(d = malloc(n ? n : 1)))
        die("out of memory");
    memcpy(d, v, n);
    return d;
}

static deferred *defer_new(kvf *f, int op, const char *name)
{
    deferred *d = calloc(1, sizeof *d);
    (void)f;
    if (!d || !(d->name = strdup(name)))
        die("out of memory");
    d->op = op;
    return d;
}

static void defer_push(kvf *f, deferred *d)
{
    pthread_mutex_lock(&f->mu);
    if (f->dtail)
        f->dtail->next = d;
    else
        f->dhead = d;
    f->dtail = d;
    f->ndeferred++;
    pthread_mutex_unlock(&f->mu);
}

static void defer_free(deferred *d)
{
    free(d->name);
    free(d->expect);
    free(d->val);
    free(d->data);
    free(d);
}

static void defer_piece(kvf *f, int op, const engram__kv_piece *pc, uint64_t index,
                        const void *data, size_t len, uint32_t ttl_ms, uint64_t n)
{
    deferred *d = defer_new(f, op, pc->name);
    d->epoch = pc->epoch;
    d->layout = pc->layout;
    d->index = index;
    d->data = (unsigned char *)dup_or_null(data, len);
    d->len = len;
    d->ttl_ms = ttl_ms;
    d->n = n;
    defer_push(f, d);
}

/* ---- the operations ---- */

static int f_sess_get(void *kv, void **s)
{
    kvf *f = kv;
    return f->vt->sess_get(f->kv, s);
}

static void f_sess_put(void *kv, void *s)
{
    kvf *f = kv;
    f->vt->sess_put(f->kv, s);
}

static int f_rec_get(void *kv, void *s, const char *name, char **val, size_t *len)
{
    kvf *f = kv;
    int act = decide(f, KVF_REC_GET, NULL, 0), err;
    if (act != ACT_FORWARD && act != ACT_LOST)
        return injected(act, KVF_REC_GET, name);
    trace(f, KVF_REC_GET, s, name, NULL, 0, 0, NULL, 0, 0);
    err = f->vt->rec_get(f->kv, s, name, val, len);
    if (act == ACT_LOST) {
        if (err == 0) {
            free(*val);
            *val = NULL;
        }
        return injected(act, KVF_REC_GET, name);
    }
    return err;
}

static int f_rec_cas(void *kv, void *s, const char *name, const char *expect, size_t elen,
                     const char *val, size_t vlen, int *res)
{
    kvf *f = kv;
    int act = decide(f, KVF_REC_CAS, val, vlen), err;
    if (act == ACT_DEFER) {
        deferred *d = defer_new(f, KVF_REC_CAS, name);
        d->expect = dup_or_null(expect, elen);
        d->elen = elen;
        d->val = dup_or_null(val, vlen);
        d->vlen = vlen;
        defer_push(f, d);
    }
    if (act != ACT_FORWARD && act != ACT_LOST) {
        *res = KVF_NO_ANSWER;
        return injected(act, KVF_REC_CAS, name);
    }
    trace(f, KVF_REC_CAS, s, name, NULL, 0, 0, val, vlen, val == NULL);
    err = f->vt->rec_cas(f->kv, s, name, expect, elen, val, vlen, res);
    if (act == ACT_LOST) {
        *res = KVF_NO_ANSWER;
        return injected(act, KVF_REC_CAS, name);
    }
    return err;
}

/* A listing of the records (the wrapped store's pending listing, with
 * `pending`, where it has one), with rec_list's faults. */
static int f_list(void *kv, void *s, int pending,
                  int (*each)(void *ud, const char *name, const char *val, size_t len),
                  void *ud)
{
    kvf *f = kv;
    int act = decide(f, KVF_REC_LIST, NULL, 0), err;
    if (act != ACT_FORWARD && act != ACT_LOST)
        return injected(act, KVF_REC_LIST, "the records");
    trace(f, KVF_REC_LIST, s, NULL, NULL, 0, 0, NULL, 0, 0);
    err = (pending && f->vt->rec_list_pending ? f->vt->rec_list_pending
                                              : f->vt->rec_list)(f->kv, s, each, ud);
    return act == ACT_LOST ? injected(act, KVF_REC_LIST, "the records") : err;
}

static int f_rec_list(void *kv, void *s,
                      int (*each)(void *ud, const char *name, const char *val, size_t len),
                      void *ud)
{
    return f_list(kv, s, 0, each, ud);
}

static int f_rec_list_pending(void *kv, void *s,
                              int (*each)(void *ud, const char *name, const char *val,
                                          size_t len),
                              void *ud)
{
    return f_list(kv, s, 1, each, ud);
}

static int f_now_ms(void *kv, void *s, uint64_t *ms)
{
    kvf *f = kv;
    int act = decide(f, KVF_NOW_MS, NULL, 0), err;
    if (act != ACT_FORWARD && act != ACT_LOST)
        return injected(act, KVF_NOW_MS, "the clock");
    trace(f, KVF_NOW_MS, s, NULL, NULL, 0, 0, NULL, 0, 0);
    err = f->vt->now_ms(f->kv, s, ms);
    return act == ACT_LOST ? injected(act, KVF_NOW_MS, "the clock") : err;
}

static int f_sync(void *kv, void *s)
{
    kvf *f = kv;
    int act = decide(f, KVF_SYNC, NULL, 0), err;
    if (act != ACT_FORWARD && act != ACT_LOST)
        return injected(act, KVF_SYNC, "the session's writes");
    trace(f, KVF_SYNC, s, NULL, NULL, 0, 0, NULL, 0, 0);
    err = f->vt->sync(f->kv, s);
    return act == ACT_LOST ? injected(act, KVF_SYNC, "the session's writes") : err;
}

static int f_piece_put(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                       const void *data, size_t len, uint32_t ttl_ms)
{
    kvf *f = kv;
    int act = decide(f, KVF_PIECE_PUT, NULL, 0), err;
    if (act == ACT_DEFER)
        defer_piece(f, KVF_PIECE_PUT, pc, index, data, len, ttl_ms, 0);
    if (act != ACT_FORWARD && act != ACT_LOST)
        return injected(act, KVF_PIECE_PUT, pc->name);
    /* Noted before it is sent: a put that fails may have landed. */
    note_piece(f, pc->name, pc->epoch, pc->layout, index);
    trace(f, KVF_PIECE_PUT, s, NULL, pc, index, ttl_ms, NULL, 0, 0);
    err = f->vt->piece_put(f->kv, s, pc, index, data, len, ttl_ms);
    return act == ACT_LOST ? injected(act, KVF_PIECE_PUT, pc->name) : err;
}

static int f_piece_expire(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                          uint32_t ttl_ms)
{
    kvf *f = kv;
    int act = decide(f, KVF_PIECE_EXPIRE, NULL, 0), err;
    if (act == ACT_DEFER)
        defer_piece(f, KVF_PIECE_EXPIRE, pc, index, NULL, 0, ttl_ms, 0);
    if (act != ACT_FORWARD && act != ACT_LOST)
        return injected(act, KVF_PIECE_EXPIRE, pc->name);
    trace(f, KVF_PIECE_EXPIRE, s, NULL, pc, index, ttl_ms, NULL, 0, 0);
    err = f->vt->piece_expire(f->kv, s, pc, index, ttl_ms);
    return act == ACT_LOST ? injected(act, KVF_PIECE_EXPIRE, pc->name) : err;
}

static int f_piece_del(void *kv, void *s, const engram__kv_piece *pc, uint64_t n)
{
    kvf *f = kv;
    int act = decide(f, KVF_PIECE_DEL, NULL, 0), err;
    if (act == ACT_DEFER)
        defer_piece(f, KVF_PIECE_DEL, pc, 0, NULL, 0, 0, n);
    if (act != ACT_FORWARD && act != ACT_LOST)
        return injected(act, KVF_PIECE_DEL, pc->name);
    trace(f, KVF_PIECE_DEL, s, NULL, pc, n, 0, NULL, 0, 0);
    err = f->vt->piece_del(f->kv, s, pc, n);
    return act == ACT_LOST ? injected(act, KVF_PIECE_DEL, pc->name) : err;
}

static int f_get_ranges(void *kv, void *s, const engram__kv_piece *pc, const engram__kv_range *r,
                        size_t n, uint64_t bytes)
{
    kvf *f = kv;
    int act = decide(f, KVF_GET_RANGES, NULL, 0), err;
    if (act != ACT_FORWARD && act != ACT_LOST)
        return injected(act, KVF_GET_RANGES, pc->name);
    trace(f, KVF_GET_RANGES, s, NULL, pc, n, 0, NULL, 0, 0);
    err = f->vt->get_ranges(f->kv, s, pc, r, n, bytes);
    return act == ACT_LOST ? injected(act, KVF_GET_RANGES, pc->name) : err;
}

static const engram__kv_vt kvf_vt = {
    f_sess_get, f_sess_put, f_rec_get, f_rec_cas, f_rec_list, f_now_ms, f_sync,
    f_piece_put, f_piece_expire, f_piece_del, f_get_ranges, f_rec_list_pending,
};

/* ---- the test's side ---- */

kvf *kvf_new(const engram__pub *inner, engram__pub *out)
{
    kvf *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->vt = inner->vt;
    f->kv = inner->kv;
    pthread_mutex_init(&f->mu, NULL);
    *out = *inner;
    out->vt = &kvf_vt;
    out->kv = f;
    return f;
}

static void forget_faults(kvf *f)
{
    for (unsigned i = 0; i < f->nfaults; i++)
        free(f->faults[i].prefix);
    f->nfaults = f->next = 0;
}

void kvf_free(kvf *f)
{
    if (!f)
        return;
    while (f->dhead) {
        deferred *d = f->dhead;
        f->dhead = d->next;
        defer_free(d);
    }
    for (size_t i = 0; i < f->npieces; i++)
        free(f->pieces[i].name);
    free(f->pieces);
    free(f->trace);
    forget_faults(f);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static void arm(kvf *f, int act, kvf_match m)
{
    fault *fa;
    if (m.op < 0 || m.op >= KVF_OPS)
        die("no such operation");
    if ((m.prefix || m.del) && m.op != KVF_REC_CAS)
        die("a prefix or a delete is matched on rec_cas only");
    /* A read that lands late changes nothing: only writes are in flight. */
    if (act == ACT_DEFER && m.op != KVF_REC_CAS && m.op != KVF_PIECE_PUT &&
        m.op != KVF_PIECE_EXPIRE && m.op != KVF_PIECE_DEL)
        die("only a write can be deferred");
    pthread_mutex_lock(&f->mu);
    if (f->nfaults == KVF_MAX_FAULTS) {
        /* The fired ones make room. */
        for (unsigned i = 0; i < f->next; i++)
            free(f->faults[i].prefix);
        memmove(f->faults, f->faults + f->next, (f->nfaults - f->next) * sizeof *f->faults);
        f->nfaults -= f->next;
        f->next = 0;
        if (f->nfaults == KVF_MAX_FAULTS)
            die("too many faults armed");
    }
    fa = &f->faults[f->nfaults++];
    fa->act = act;
    fa->m = m;
    fa->prefix = m.prefix ? strdup(m.prefix) : NULL;
    if (m.prefix && !fa->prefix)
        die("out of memory");
    pthread_mutex_unlock(&f->mu);
}

void kvf_fail(kvf *f, kvf_match m)
{
    arm(f, ACT_FAIL, m);
}

void kvf_lost(kvf *f, kvf_match m)
{
    arm(f, ACT_LOST, m);
}

void kvf_defer(kvf *f, kvf_match m)
{
    arm(f, ACT_DEFER, m);
}

void kvf_kill_after(kvf *f, unsigned n)
{
    pthread_mutex_lock(&f->mu);
    f->killing = 1;
    f->kill_left = n;
    f->killed = 0;
    pthread_mutex_unlock(&f->mu);
}

void kvf_revive(kvf *f)
{
    pthread_mutex_lock(&f->mu);
    f->killing = 0;
    forget_faults(f);
    pthread_mutex_unlock(&f->mu);
}

unsigned kvf_fired(kvf *f)
{
    unsigned n;
    pthread_mutex_lock(&f->mu);
    n = f->fired;
    pthread_mutex_unlock(&f->mu);
    return n;
}

unsigned kvf_armed(kvf *f)
{
    unsigned n;
    pthread_mutex_lock(&f->mu);
    n = f->nfaults - f->next;
    pthread_mutex_unlock(&f->mu);
    return n;
}

unsigned kvf_killed(kvf *f)
{
    unsigned n;
    pthread_mutex_lock(&f->mu);
    n = f->killed;
    pthread_mutex_unlock(&f->mu);
    return n;
}

unsigned long kvf_count(kvf *f, int op)
{
    unsigned long n;
    if (op < 0 || op >= KVF_OPS)
        die("no such operation");
    pthread_mutex_lock(&f->mu);
    n = f->count[op];
    pthread_mutex_unlock(&f->mu);
    return n;
}

size_t kvf_deferred(kvf *f)
{
    size_t n;
    pthread_mutex_lock(&f->mu);
    n = f->ndeferred;
    pthread_mutex_unlock(&f->mu);
    return n;
}

kvf_event *kvf_trace(kvf *f, size_t *n)
{
    kvf_event *v;
    pthread_mutex_lock(&f->mu);
    if (!(v = malloc((f->ntrace ? f->ntrace : 1) * sizeof *v)))
        die("out of memory");
    if (f->ntrace)
        memcpy(v, f->trace, f->ntrace * sizeof *v);
    *n = f->ntrace;
    pthread_mutex_unlock(&f->mu);
    return v;
}

void kvf_trace_clear(kvf *f)
{
    pthread_mutex_lock(&f->mu);
    f->ntrace = 0;
    pthread_mutex_unlock(&f->mu);
}

int kvf_release(kvf *f, int *res)
{
    deferred *d;
    engram__kv_piece pc;
    void *s;
    int err;
    pthread_mutex_lock(&f->mu);
    if ((d = f->dhead) != NULL) {
        f->dhead = d->next;
        if (!f->dhead)
            f->dtail = NULL;
        f->ndeferred--;
    }
    pthread_mutex_unlock(&f->mu);
    if (!d)
        return engram__err(-ENOENT, "kv_fault: nothing is deferred");
    if ((err = f->vt->sess_get(f->kv, &s)) != 0) {
        defer_free(d);
        return err;
    }
    pc = (engram__kv_piece){d->name, d->epoch, d->layout};
    *res = ENGRAM__KV_DONE;
    switch (d->op) {
    case KVF_REC_CAS:
        trace(f, KVF_REC_CAS, s, d->name, NULL, 0, 0, d->val, d->vlen, d->val == NULL);
        err = f->vt->rec_cas(f->kv, s, d->name, d->expect, d->elen, d->val, d->vlen, res);
        break;
    case KVF_PIECE_PUT:
        note_piece(f, d->name, d->epoch, d->layout, d->index);
        trace(f, KVF_PIECE_PUT, s, NULL, &pc, d->index, d->ttl_ms, NULL, 0, 0);
        err = f->vt->piece_put(f->kv, s, &pc, d->index, d->data, d->len, d->ttl_ms);
        break;
    case KVF_PIECE_EXPIRE:
        trace(f, KVF_PIECE_EXPIRE, s, NULL, &pc, d->index, d->ttl_ms, NULL, 0, 0);
        err = f->vt->piece_expire(f->kv, s, &pc, d->index, d->ttl_ms);
        break;
    default:
        trace(f, KVF_PIECE_DEL, s, NULL, &pc, d->n, 0, NULL, 0, 0);
        err = f->vt->piece_del(f->kv, s, &pc, d->n);
        break;
    }
    f->vt->sess_put(f->kv, s);
    defer_free(d);
    return err;
}

/* The pieces written that keep() does not claim: a copy (*n of them;
 * free it with free_pieces()). */
static wpiece *pieces_unless(kvf *f, int (*keep)(void *ud, const char *name, uint64_t epoch),
                             void *ud, size_t *n)
{
    wpiece *v;
    pthread_mutex_lock(&f->mu);
    if (!(v = calloc(f->npieces ? f->npieces : 1, sizeof *v)))
        die("out of memory");
    *n = 0;
    for (size_t i = 0; i < f->npieces; i++) {
        const wpiece *w = &f->pieces[i];
        if (keep(ud, w->name, w->epoch))
            continue;
        v[*n] = *w;
        if (!(v[*n].name = strdup(w->name)))
            die("out of memory");
        (*n)++;
    }
    pthread_mutex_unlock(&f->mu);
    return v;
}

static void free_pieces(wpiece *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

long kvf_pieces_left_unless(kvf *f, int (*keep)(void *ud, const char *name, uint64_t epoch),
                            void *ud)
{
    size_t n;
    wpiece *v = pieces_unless(f, keep, ud, &n);
    long left = 0;
    void *s;
    int err;
    if ((err = f->vt->sess_get(f->kv, &s)) != 0) {
        free_pieces(v, n);
        return err;
    }
    for (size_t i = 0; i < n && err == 0; i++) {
        engram__kv_piece pc = {v[i].name, v[i].epoch, v[i].layout};
        unsigned char b;
        engram__kv_range r = {v[i].index, 0, &b, 1, 0};
        err = f->vt->get_ranges(f->kv, s, &pc, &r, 1, 1);
        if (err == 0)
            left++;
        else if (err == -ENODATA)
            err = 0;
        else
            err = engram__err(err, "kv_fault: read piece %" PRIu64 " of '%s' (epoch %016" PRIx64
                                   "): %s",
                              v[i].index, v[i].name, v[i].epoch, engram_errmsg());
    }
    f->vt->sess_put(f->kv, s);
    free_pieces(v, n);
    return err ? err : left;
}

/* kvf_pieces_left()'s claim: the pieces of other tables, and of its
 * epoch keep_epoch. */
typedef struct name_keep {
    const char *name;
    uint64_t epoch;
} name_keep;

static int keep_but_name(void *ud, const char *name, uint64_t epoch)
{
    const name_keep *k = ud;
    return strcmp(name, k->name) != 0 || (k->epoch && epoch == k->epoch);
}

long kvf_pieces_left(kvf *f, const char *name, uint64_t keep_epoch)
{
    name_keep k = {name, keep_epoch};
    return kvf_pieces_left_unless(f, keep_but_name, &k);
}
