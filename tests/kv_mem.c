/*
 * kv_mem.c - kv.h in the memory of the process (kv_mem.h).
 *
 * Records are a sorted array of (name, bytes); pieces a sorted array
 * keyed by (name, epoch, layout, index).  One mutex guards both, and is
 * held for the whole of each operation, so each one is atomic as kv.h
 * asks (rec_list() copies the records first and calls back without it:
 * a callback may use the store).  The arrays are searched by bisection
 * and grow by doubling: a test's namespace holds a few hundred values.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "kv_mem.h"

typedef struct mrec {
    char *name;
    char *val;
    size_t len;
} mrec;

typedef struct mpiece {
    char *name;
    uint64_t epoch;
    int layout;
    uint64_t index;
    unsigned char *data;
    size_t len;
    uint64_t expires_ms; /* 0: never */
} mpiece;

struct kvm {
    pthread_mutex_t mu;
    mrec *recs;
    size_t nrecs, caprecs;
    mpiece *pcs;
    size_t npcs, cappcs;
};

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t expiry(uint32_t ttl_ms)
{
    return ttl_ms ? wall_ms() + ttl_ms : 0;
}

kvm *kvm_new(void)
{
    kvm *m = calloc(1, sizeof *m);
    if (m)
        pthread_mutex_init(&m->mu, NULL);
    return m;
}

void kvm_free(kvm *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nrecs; i++) {
        free(m->recs[i].name);
        free(m->recs[i].val);
    }
    for (size_t i = 0; i < m->npcs; i++) {
        free(m->pcs[i].name);
        free(m->pcs[i].data);
    }
    free(m->recs);
    free(m->pcs);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* Array v (n used of *cap elements of `size` bytes) with room for one
 * more: v itself, a new one, or NULL when out of memory (v is kept). */
static void *grow(void *v, size_t n, size_t *cap, size_t size)
{
    void *nv;
    size_t ncap;
    if (n < *cap)
        return v;
    ncap = *cap ? 2 * *cap : 16;
    if ((nv = realloc(v, ncap * size)) != NULL)
        *cap = ncap;
    return nv;
}

/* ---- records ---- */

/* The index of record `name`, or where it would go (*found 0). */
static size_t rec_find(const kvm *m, const char *name, int *found)
{
    size_t lo = 0, hi = m->nrecs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->recs[mid].name, name);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = 0;
    return lo;
}

static char *dup_bytes(const char *v, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, v, n);
        d[n] = '\0';
    }
    return d;
}

static int sess_get(void *kv, void **s)
{
    /* One mutex serves every thread: a session is the store itself. */
    *s = kv;
    return 0;
}

static void sess_put(void *kv, void *s)
{
    (void)kv;
    (void)s;
}

static int rec_get(void *kv, void *s, const char *name, char **val, size_t *len)
{
    kvm *m = kv;
    int found, err = 0;
    size_t i;
    (void)s;
    pthread_mutex_lock(&m->mu);
    i = rec_find(m, name, &found);
    if (!found)
        err = engram__err(-ENOENT, "kv_mem: no record '%s'", name);
    else if (!(*val = dup_bytes(m->recs[i].val, m->recs[i].len)))
        err = engram__err(-ENOMEM, "kv_mem: out of memory for record '%s'", name);
    else
        *len = m->recs[i].len;
    pthread_mutex_unlock(&m->mu);
    return err;
}

/* rec_cas() with the mutex held. */
static int cas_locked(kvm *m, const char *name, const char *expect, size_t elen, const char *val,
                      size_t vlen, int *res)
{
    int found;
    size_t i = rec_find(m, name, &found);
    char *nv, *nn;
    mrec *nr;
    if (expect && !found) {
        *res = ENGRAM__KV_ABSENT;
        return 0;
    }
    if (!expect && found) {
        *res = ENGRAM__KV_PRESENT;
        return 0;
    }
    if (expect && (m->recs[i].len != elen || memcmp(m->recs[i].val, expect, elen) != 0)) {
        *res = ENGRAM__KV_DIFFERS;
        return 0;
    }
    *res = ENGRAM__KV_DONE;
    if (!val) { /* compare-and-delete */
        if (found) {
            free(m->recs[i].name);
            free(m->recs[i].val);
            memmove(m->recs + i, m->recs + i + 1, (m->nrecs - i - 1) * sizeof *m->recs);
            m->nrecs--;
        }
        return 0;
    }
    if (!(nv = dup_bytes(val, vlen)))
        return engram__err(-ENOMEM, "kv_mem: out of memory for record '%s'", name);
    if (found) {
        free(m->recs[i].val);
        m->recs[i].val = nv;
        m->recs[i].len = vlen;
        return 0;
    }
    if ((nr = grow(m->recs, m->nrecs, &m->caprecs, sizeof *m->recs)) != NULL)
        m->recs = nr;
    if (!nr || !(nn = strdup(name))) {
        free(nv);
        return engram__err(-ENOMEM, "kv_mem: out of memory for record '%s'", name);
    }
    memmove(m->recs + i + 1, m->recs + i, (m->nrecs - i) * sizeof *m->recs);
    m->recs[i] = (mrec){nn, nv, vlen};
    m->nrecs++;
    return 0;
}

static int rec_cas(void *kv, void *s, const char *name, const char *expect, size_t elen,
                   const char *val, size_t vlen, int *res)
{
    kvm *m = kv;
    int err;
    (void)s;
    pthread_mutex_lock(&m->mu);
    err = cas_locked(m, name, expect, elen, val, vlen, res);
    pthread_mutex_unlock(&m->mu);
    return err;
}

static void free_recs(mrec *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].name);
        free(v[i].val);
    }
    free(v);
}

static int rec_list(void *kv, void *s,
                    int (*each)(void *ud, const char *name, const char *val, size_t len),
                    void *ud)
{
    kvm *m = kv;
    mrec *copy;
    size_t n;
    int err = 0;
    (void)s;
    pthread_mutex_lock(&m->mu);
    n = m->nrecs;
    if ((copy = calloc(n ? n : 1, sizeof *copy)) != NULL) {
        for (size_t i = 0; i < n; i++) {
            copy[i].name = strdup(m->recs[i].name);
            copy[i].val = dup_bytes(m->recs[i].val, m->recs[i].len);
            copy[i].len = m->recs[i].len;
            if (!copy[i].name || !copy[i].val)
                err = -ENOMEM;
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (!copy || err) {
        free_recs(copy, copy ? n : 0);
        return engram__err(-ENOMEM, "kv_mem: out of memory listing %zu records", n);
    }
    for (size_t i = 0; i < n && !err; i++)
        err = each(ud, copy[i].name, copy[i].val, copy[i].len);
    free_recs(copy, n);
    return err;
}

static int now_ms(void *kv, void *s, uint64_t *ms)
{
    (void)kv;
    (void)s;
    *ms = wall_ms();
    return 0;
}

static int sync_writes(void *kv, void *s)
{
    (void)kv;
    (void)s;
    return 0; /* no replicas */
}

/* ---- pieces ---- */

static int piece_cmp(const mpiece *a, const engram__kv_piece *pc, uint64_t index)
{
    int c = strcmp(a->name, pc->name);
    if (c)
        return c;
    if (a->epoch != pc->epoch)
        return a->epoch < pc->epoch ? -1 : 1;
    if (a->layout != pc->layout)
        return a->layout < pc->layout ? -1 : 1;
    if (a->index != index)
        return a->index < index ? -1 : 1;
    return 0;
}

static void piece_drop(kvm *m, size_t i)
{
    free(m->pcs[i].name);
    free(m->pcs[i].data);
    memmove(m->pcs + i, m->pcs + i + 1, (m->npcs - i - 1) * sizeof *m->pcs);
    m->npcs--;
}

static int expired(const mpiece *q, uint64_t now)
{
    return q->expires_ms && now >= q->expires_ms;
}

/* The index of piece (pc, index), or where it would go (*found 0).  An
 * expired piece is dropped here, and not found. */
static size_t piece_find(kvm *m, const engram__kv_piece *pc, uint64_t index, int *found)
{
    size_t lo = 0, hi = m->npcs;
    *found = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = piece_cmp(&m->pcs[mid], pc, index);
        if (c == 0) {
            if (expired(&m->pcs[mid], wall_ms()))
                piece_drop(m, mid);
            else
                *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int piece_put(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                     const void *data, size_t len, uint32_t ttl_ms)
{
    kvm *m = kv;
    unsigned char *d = malloc(len ? len : 1);
    char *nn = NULL;
    mpiece *np = NULL;
    int found, err = 0;
    size_t i;
    (void)s;
    if (!d)
        return engram__err(-ENOMEM, "kv_mem: out of memory for a piece of %zu bytes", len);
    memcpy(d, data, len);
    pthread_mutex_lock(&m->mu);
    i = piece_find(m, pc, index, &found);
    if (!found && (np = grow(m->pcs, m->npcs, &m->cappcs, sizeof *m->pcs)) != NULL)
        m->pcs = np;
    if (found) {
        free(m->pcs[i].data);
    } else if (!np || !(nn = strdup(pc->name))) {
        err = engram__err(-ENOMEM, "kv_mem: out of memory for piece %" PRIu64 " of '%s'", index,
                          pc->name);
    } else {
        memmove(m->pcs + i + 1, m->pcs + i, (m->npcs - i) * sizeof *m->pcs);
        m->pcs[i] = (mpiece){nn, pc->epoch, pc->layout, index, NULL, 0, 0};
        m->npcs++;
    }
    if (!err) {
        m->pcs[i].data = d;
        m->pcs[i].len = len;
        m->pcs[i].expires_ms = expiry(ttl_ms);
    }
    pthread_mutex_unlock(&m->mu);
    if (err)
        free(d);
    return err;
}

static int piece_expire(void *kv, void *s, const engram__kv_piece *pc, uint64_t index,
                        uint32_t ttl_ms)
{
    kvm *m = kv;
    int found;
    size_t i;
    (void)s;
    pthread_mutex_lock(&m->mu);
    i = piece_find(m, pc, index, &found);
    if (found)
        m->pcs[i].expires_ms = expiry(ttl_ms);
    pthread_mutex_unlock(&m->mu);
    if (!found)
        return engram__err(-ENODATA, "kv_mem: piece %" PRIu64 " of '%s' (epoch %016" PRIx64
                                     ") is gone",
                           index, pc->name, pc->epoch);
    return 0;
}

static int piece_del(void *kv, void *s, const engram__kv_piece *pc, uint64_t n)
{
    kvm *m = kv;
    (void)s;
    pthread_mutex_lock(&m->mu);
    for (uint64_t k = 0; k < n; k++) {
        int found;
        size_t i = piece_find(m, pc, k, &found);
        if (found)
            piece_drop(m, i);
    }
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static int get_ranges(void *kv, void *s, const engram__kv_piece *pc, const engram__kv_range *r,
                      size_t n, uint64_t bytes)
{
    kvm *m = kv;
    uint64_t sum = 0;
    int err = 0;
    (void)s;
    for (size_t k = 0; k < n; k++)
        sum += r[k].len;
    /* The caller's total is part of the interface: a wrong one is its
     * bug, which a store reading into one buffer would pay for. */
    if (sum != bytes)
        return engram__err(-EINVAL, "kv_mem: %zu ranges of %" PRIu64 " bytes, said to be %" PRIu64,
                           n, sum, bytes);
    pthread_mutex_lock(&m->mu);
    for (size_t k = 0; k < n && !err; k++) {
        int found;
        size_t i = piece_find(m, pc, r[k].index, &found);
        const mpiece *q = found ? &m->pcs[i] : NULL;
        uint64_t end = r[k].start + r[k].len;
        if (!q)
            err = engram__err(-ENODATA, "kv_mem: piece %" PRIu64 " of '%s' (epoch %016" PRIx64
                                        ") is missing",
                              r[k].index, pc->name, pc->epoch);
        else if (end > q->len || (r[k].whole && end != q->len))
            err = engram__err(-ENODATA, "kv_mem: piece %" PRIu64 " of '%s' (epoch %016" PRIx64
                                        ") has %zu bytes, not the range [%" PRIu64 ", %" PRIu64
                                        ")%s",
                              r[k].index, pc->name, pc->epoch, q->len, r[k].start, end,
                              r[k].whole ? " to its end" : "");
        else
            memcpy(r[k].dst, q->data + r[k].start, r[k].len);
    }
    pthread_mutex_unlock(&m->mu);
    return err;
}

const engram__kv_vt kvm_vt = {
    sess_get, sess_put, rec_get, rec_cas, rec_list, now_ms, sync_writes,
    piece_put, piece_expire, piece_del, get_ranges,
    NULL, /* rec_list_pending: rec_list serves */
};

/* ---- what tests look at ---- */

size_t kvm_records(kvm *m)
{
    size_t n;
    pthread_mutex_lock(&m->mu);
    n = m->nrecs;
    pthread_mutex_unlock(&m->mu);
    return n;
}

size_t kvm_list_pieces(kvm *m, kvm_piece_info *out, size_t cap)
{
    uint64_t now = wall_ms();
    size_t n = 0;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->npcs; i++) {
        const mpiece *q = &m->pcs[i];
        if (expired(q, now))
            continue;
        if (n < cap) {
            kvm_piece_info *o = &out[n];
            memset(o, 0, sizeof *o);
            strncpy(o->name, q->name, sizeof o->name - 1);
            o->epoch = q->epoch;
            o->layout = q->layout;
            o->index = q->index;
            o->len = q->len;
            o->expires_ms = q->expires_ms;
        }
        n++;
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}

size_t kvm_pieces(kvm *m)
{
    return kvm_list_pieces(m, NULL, 0);
}
