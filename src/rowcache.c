/*
 * rowcache.c - the row cache and its budget (see rowcache.h).
 *
 * A set is ENGRAM_CACHE_WAYS tags, a lock and the CLOCK state in one cache
 * line.  Tags are row + 1 (0 = empty) and atomics only because the
 * prefetch step peeks at them without the lock; every decision is taken
 * again under the lock.  A hit copies the slot under the set's lock; an
 * insertion writes the slot and then its tag under the same lock, so no
 * reader ever sees a slot before all its bytes are there: the cache is
 * exact.
 *
 * Admission.  A set with a free way takes every row read.  A full set
 * evicts a row only for one asked for at least ADMIT times lately: each
 * missed row is counted in a count-min sketch of 4-bit counters (four
 * counters of one 64-byte block per row, the lowest of them its estimate),
 * and the sketch decays, each block halved once per AGE_MISSES misses a
 * slot.  Under Engram's Zipf-like ids most rows of the long tail are asked
 * for once in a while; without the filter each such read evicts a row that
 * is asked for again.  With it, a cache of 5% of a Zipf(1.0) table reads
 * about a tenth fewer rows (docs/performance.md, section 10).  Only
 * the miss path touches the sketch (a row read from a source costs far
 * more), so hits cost what they did.  Counters are relaxed atomics: a lost
 * increment or halving between two threads only blurs an estimate.
 *
 * Sets and slots are charged to the budget as allocated: small caches
 * come from the heap (no page rounding to hide), large ones from mmap with
 * a huge-page hint (random hits then cost no TLB miss each), rounded to
 * whole pages, and charged with the rounding.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "rowcache.h"

#define WAYS ENGRAM_CACHE_WAYS
#define MMAP_MIN ((size_t)2 << 20) /* caches from this size up are mapped */
#define PAGE 4096u
#define ADMIT 2u      /* asks that admit a row into a full set */
#define AGE_MISSES 4u /* misses per slot between two halvings of a counter */
#define BLOCK_WORDS 8u /* sketch words per block: one cache line */

_Static_assert(WAYS <= 8, "the CLOCK reference bits are one byte");

struct engram__cbudget {
    pthread_mutex_t lock;
    uint64_t total;    /* cache_bytes */
    uint64_t assigned; /* bytes of sets and slots of live caches (under lock) */
    uint64_t extra;    /* the share rule: data bytes of checkpoint tables so far (under lock) */
    _Atomic uint64_t staging; /* reserved for the reader (written under lock) */
};

typedef struct rc_set {
    atomic_uint lock;
    unsigned char ref;  /* CLOCK reference bit per way (under lock) */
    unsigned char hand; /* next way the CLOCK hand looks at (under lock) */
    _Atomic uint64_t tag[WAYS];
} __attribute__((aligned(ENGRAM__CACHELINE))) rc_set;

_Static_assert(sizeof(rc_set) == ENGRAM__CACHELINE, "a set is one cache line");

struct engram__rcache {
    engram__cbudget *b;
    uint32_t row_bytes, slot_bytes;
    uint64_t nsets;
    rc_set *sets;
    unsigned char *data; /* nsets * WAYS slots of slot_bytes */
    size_t len;          /* bytes of the one allocation holding sets, slots and sketch */
    int mapped;          /* 1: mmap, 0: heap */
    uint64_t charged;    /* bytes charged to the budget */
    uint64_t extra;      /* what this cache added to b->extra */
    _Atomic uint64_t *sketch; /* sketch_words words of 16 4-bit counters (admission) */
    uint64_t sketch_words;    /* a multiple of BLOCK_WORDS, at least one block */
    uint64_t age_period;      /* misses between two halvings of a word */
    _Atomic uint64_t asks;    /* misses counted so far (ages the sketch) */
};

int engram__cbudget_create(uint64_t budget, engram__cbudget **out)
{
    engram__cbudget *b = calloc(1, sizeof *b);
    if (!b)
        return engram__err(-ENOMEM, "out of memory for the row cache budget");
    pthread_mutex_init(&b->lock, NULL);
    b->total = budget ? budget : ENGRAM__CACHE_DEFAULT_BUDGET;
    *out = b;
    return 0;
}

void engram__cbudget_destroy(engram__cbudget *b)
{
    if (!b)
        return;
    pthread_mutex_destroy(&b->lock);
    free(b);
}

uint64_t engram__cbudget_total(const engram__cbudget *b)
{
    return b->total;
}

uint64_t engram__cbudget_staging(const engram__cbudget *b)
{
    return atomic_load_explicit(&b->staging, memory_order_relaxed);
}

int engram__cbudget_reserve(engram__cbudget *b, uint64_t want, uint64_t need, const char *what,
                            uint64_t *got)
{
    int err = 0;
    pthread_mutex_lock(&b->lock);
    uint64_t have = atomic_load_explicit(&b->staging, memory_order_relaxed);
    uint64_t room = b->total - b->assigned; /* staging is part of what is not assigned */
    if (want <= have) {
        *got = have;
    } else if (want <= room) {
        atomic_store_explicit(&b->staging, want, memory_order_relaxed);
        *got = want;
    } else if (need <= have) {
        *got = have;
    } else if (need <= room) {
        atomic_store_explicit(&b->staging, need, memory_order_relaxed);
        *got = need;
    } else {
        err = engram__err(-ENOBUFS,
                          "%s: reading one row takes %" PRIu64 " bytes of staging, more than "
                          "the %" PRIu64 " of the row cache budget (cache_bytes %" PRIu64
                          ") that the tables opened before left",
                          what, need, room, b->total);
    }
    pthread_mutex_unlock(&b->lock);
    return err;
}

/* Bytes left for slots (under lock).  An eighth of the budget stays the
 * reader's whether it reserved it yet or not: a cache made before the
 * first file table must not leave that table no room to read. */
static uint64_t left_locked(const engram__cbudget *b)
{
    uint64_t staging = atomic_load_explicit(&b->staging, memory_order_relaxed);
    uint64_t used = b->assigned + (staging > b->total / 8 ? staging : b->total / 8);
    return b->total > used ? b->total - used : 0;
}

/* Words of the admission sketch of a cache of nsets sets: 16 counters
 * (a word) per slot, rounded up to whole blocks (one at least); none
 * without the filter (ENGRAM_OPEN_CACHE_KEEP_ALL).  nsets is at most a
 * share over 176 bytes, so nsets * WAYS cannot wrap. */
static uint64_t sketch_words(uint64_t nsets, int keep_all)
{
    if (keep_all)
        return 0;
    return nsets ? engram__align_up(nsets * WAYS, BLOCK_WORDS) : BLOCK_WORDS;
}

/* Bytes a cache of nsets sets of slot_bytes slots takes, with its sketch
 * and rounding; UINT64_MAX, which no share reaches, where that passes
 * 2^64: a budget near 2^64 has room for as many sets as that, and the
 * sketch comes on top of them. */
static uint64_t cache_len(uint64_t nsets, uint32_t slot_bytes, int keep_all, int *mapped)
{
    uint64_t len, sketch;
    *mapped = 1;
    if (engram__mul_u64(nsets, sizeof(rc_set) + (uint64_t)WAYS * slot_bytes, &len) ||
        engram__mul_u64(sketch_words(nsets, keep_all), sizeof(uint64_t), &sketch) ||
        engram__add_u64(len, sketch, &len) || len > UINT64_MAX - PAGE)
        return UINT64_MAX;
    *mapped = len >= MMAP_MIN;
    return *mapped ? engram__align_up(len, PAGE) : len;
}

int engram__rcache_create(engram__cbudget *b, const engram__cache_want *want, uint32_t row_bytes,
                          uint64_t num_rows, uint32_t flags, const char *what,
                          engram__rcache **out)
{
    int prefault = (flags & ENGRAM_OPEN_PREFAULT) != 0, lock = (flags & ENGRAM_OPEN_MLOCK) != 0;
    int keep_all = (flags & ENGRAM_OPEN_CACHE_KEEP_ALL) != 0;
    engram__rcache *c = NULL;
    uint64_t share, extra = 0, nsets, max_sets, per_set;
    uint32_t slot_bytes = (uint32_t)engram__align_up(row_bytes, 16);
    int mapped, err = 0;
    void *p;

    *out = NULL;
    /* A set and its slots; the sketch and page rounding come on top. */
    per_set = sizeof(rc_set) + (uint64_t)WAYS * slot_bytes;
    max_sets = (num_rows + WAYS - 1) / WAYS;
    pthread_mutex_lock(&b->lock);
    if (want->bytes) {
        share = want->bytes;
    } else {
        /* The share rule (engram.h): proportional to the table's size
         * among the namespace's files and the checkpoint tables so far. */
        uint64_t total;
        extra = want->in_namespace ? 0 : want->size_bytes;
        total = want->namespace_bytes + b->extra + extra;
        if (total < want->size_bytes)
            total = want->size_bytes;
        share = (uint64_t)(((unsigned __int128)b->total * want->size_bytes) / total);
    }
    if (share > left_locked(b))
        share = left_locked(b);
    nsets = share / per_set;
    if (nsets > max_sets)
        nsets = max_sets;
    /* The most sets whose sketch and page rounding fit the share too
     * (cache_len grows with nsets): a binary search below that bound. */
    if (nsets > 0 && cache_len(nsets, slot_bytes, keep_all, &mapped) > share) {
        uint64_t lo = 0, hi = nsets; /* cache_len(lo) fits, cache_len(hi) does not */
        while (hi - lo > 1) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (cache_len(mid, slot_bytes, keep_all, &mapped) <= share)
                lo = mid;
            else
                hi = mid;
        }
        nsets = lo;
    }
    if (nsets == 0) {
        /* Less than one set: no cache, every row is read.  The table
         * still counts for the share rule of the tables after it. */
        b->extra += extra;
        pthread_mutex_unlock(&b->lock);
        if (extra) {
            /* Keep the rule's bookkeeping with a cache of no sets, so
             * that destroying the table gives it back. */
            if (!(c = calloc(1, sizeof *c))) {
                pthread_mutex_lock(&b->lock);
                b->extra -= extra;
                pthread_mutex_unlock(&b->lock);
                return engram__err(-ENOMEM, "out of memory");
            }
            c->b = b;
            c->extra = extra;
            c->row_bytes = row_bytes;
            c->slot_bytes = slot_bytes;
            *out = c;
        }
        return 0;
    }
    /* Charged before the allocation, under the lock, so that tables
     * opened at the same time never overcommit the budget together. */
    b->assigned += cache_len(nsets, slot_bytes, keep_all, &mapped);
    b->extra += extra;
    pthread_mutex_unlock(&b->lock);

    if (!(c = calloc(1, sizeof *c))) {
        err = engram__err(-ENOMEM, "out of memory");
        goto fail;
    }
    c->b = b;
    c->row_bytes = row_bytes;
    c->slot_bytes = slot_bytes;
    c->nsets = nsets;
    c->extra = extra;
    c->charged = cache_len(nsets, slot_bytes, keep_all, &c->mapped);
    c->len = (size_t)c->charged;
    if (c->mapped) {
        p = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            err = engram__errno(errno, "%s: map %zu bytes of row cache", what, c->len);
            goto fail;
        }
        /* Only a hint, and it must come before the first touch. */
        (void)madvise(p, c->len, MADV_HUGEPAGE);
        if (prefault)
            for (size_t o = 0; o < c->len; o += PAGE)
                ((volatile unsigned char *)p)[o] = 0;
    } else {
        p = aligned_alloc(ENGRAM__CACHELINE, (size_t)engram__align_up(c->len, ENGRAM__CACHELINE));
        if (!p) {
            err = engram__err(-ENOMEM, "%s: out of memory for %zu bytes of row cache", what,
                              c->len);
            goto fail;
        }
        memset(p, 0, c->len);
    }
    /* Sets, sketch, slots: each a whole number of cache lines, so every
     * set and every sketch block is one line. */
    c->sets = p;
    c->sketch_words = sketch_words(nsets, keep_all);
    c->sketch = (_Atomic uint64_t *)(void *)((unsigned char *)p + nsets * sizeof(rc_set));
    c->data = (unsigned char *)p + nsets * sizeof(rc_set) + c->sketch_words * sizeof(uint64_t);
    c->age_period = AGE_MISSES * nsets * WAYS;
    if (lock && mlock(p, c->len) != 0) {
        err = engram__errno(errno, "%s: mlock %zu bytes of row cache (see RLIMIT_MEMLOCK)", what,
                            c->len);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    if (c && c->sets) {
        if (c->mapped)
            munmap(c->sets, c->len);
        else
            free(c->sets);
    }
    pthread_mutex_lock(&b->lock);
    b->assigned -= cache_len(nsets, slot_bytes, keep_all, &mapped);
    b->extra -= extra;
    pthread_mutex_unlock(&b->lock);
    free(c);
    return err;
}

void engram__rcache_destroy(engram__rcache *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->b->lock);
    c->b->assigned -= c->charged;
    c->b->extra -= c->extra;
    pthread_mutex_unlock(&c->b->lock);
    if (c->sets) {
        if (c->mapped)
            munmap(c->sets, c->len);
        else
            free(c->sets);
    }
    free(c);
}

/* Set of `row`: a multiplicative hash spreads strided ids over the sets,
 * and the high half of hash * nsets maps it onto any number of sets. */
static inline uint64_t set_of(const engram__rcache *c, uint64_t row)
{
    uint64_t h = row * 0x9E3779B97F4A7C15ull;
    return (uint64_t)(((unsigned __int128)h * c->nsets) >> 64);
}

static inline unsigned char *slot_of(const engram__rcache *c, uint64_t set, unsigned way)
{
    return c->data + (set * WAYS + way) * (size_t)c->slot_bytes;
}

static inline void set_lock(rc_set *s)
{
    /* Acquire: the slot bytes and tags written by the last holder are
     * visible once we own the lock. */
    while (atomic_exchange_explicit(&s->lock, 1u, memory_order_acquire)) {
        while (atomic_load_explicit(&s->lock, memory_order_relaxed))
            engram__cpu_relax();
    }
}

static inline void set_unlock(rc_set *s)
{
    /* Release: our slot writes are visible to the next holder. */
    atomic_store_explicit(&s->lock, 0u, memory_order_release);
}

int engram__rcache_get(engram__rcache *c, uint64_t row, void *dst)
{
    uint64_t si;
    rc_set *s;
    int hit = 0;
    if (c->nsets == 0)
        return 0;
    si = set_of(c, row);
    s = &c->sets[si];
    set_lock(s);
    for (unsigned w = 0; w < WAYS; w++) {
        if (atomic_load_explicit(&s->tag[w], memory_order_relaxed) == row + 1) {
            memcpy(dst, slot_of(c, si, w), c->row_bytes);
            s->ref |= (unsigned char)(1u << w);
            hit = 1;
            break;
        }
    }
    set_unlock(s);
    return hit;
}

void engram__rcache_prefetch_set(const engram__rcache *c, uint64_t row)
{
    if (c->nsets)
        __builtin_prefetch(&c->sets[set_of(c, row)], 1, 3);
}

void engram__rcache_prefetch_slot(const engram__rcache *c, uint64_t row)
{
    uint64_t si;
    const rc_set *s;
    if (c->nsets == 0)
        return;
    si = set_of(c, row);
    s = &c->sets[si];
    for (unsigned w = 0; w < WAYS; w++) {
        if (atomic_load_explicit(&s->tag[w], memory_order_relaxed) == row + 1) {
            const unsigned char *p = slot_of(c, si, w);
            for (uint32_t o = 0; o < c->row_bytes; o += 64)
                __builtin_prefetch(p + o, 0, 0);
            __builtin_prefetch(p + c->row_bytes - 1, 0, 0);
            return;
        }
    }
}

/* The sketch block of `row` and, in h, the bits that pick its counters. */
static inline _Atomic uint64_t *sketch_block(const engram__rcache *c, uint64_t row, uint64_t *h)
{
    /* Another multiplier than set_of(): rows of one set spread over the
     * blocks.  The counters take the low 28 bits of x; the block is its
     * high bits scaled to the number of blocks, so that every block is
     * used however large the sketch. */
    uint64_t x = (row + 1) * 0xC2B2AE3D27D4EB4Full;
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    *h = x;
    return c->sketch +
           (uint64_t)(((unsigned __int128)x * (c->sketch_words / BLOCK_WORDS)) >> 64) * BLOCK_WORDS;
}

/* Counter i (of 4) of a row: its word in the block and its shift. */
#define CTR_WORD(h, i) (((h) >> (3 * (i))) & (BLOCK_WORDS - 1))
#define CTR_SHIFT(h, i) ((((h) >> (12 + 4 * (i))) & 15) * 4)

/* Halves every counter of the blocks from asks `from` to `to` (a share
 * of the sketch proportional to the misses counted): each block is halved
 * once per age_period misses, all four counters of a row together. */
static void sketch_age(engram__rcache *c, uint64_t from, uint64_t to)
{
    uint64_t nblocks = c->sketch_words / BLOCK_WORDS;
    uint64_t a = (uint64_t)(((unsigned __int128)from * nblocks) / c->age_period);
    uint64_t b = (uint64_t)(((unsigned __int128)to * nblocks) / c->age_period);
    for (; a < b; a++) {
        _Atomic uint64_t *blk = &c->sketch[(a % nblocks) * BLOCK_WORDS];
        for (unsigned i = 0; i < BLOCK_WORDS; i++) {
            uint64_t v = atomic_load_explicit(&blk[i], memory_order_relaxed);
            atomic_store_explicit(&blk[i], (v >> 1) & 0x7777777777777777ull,
                                  memory_order_relaxed);
        }
    }
}

void engram__rcache_prefetch_count(const engram__rcache *c, uint64_t row)
{
    uint64_t h;
    if (c->sketch_words)
        __builtin_prefetch(sketch_block(c, row, &h), 1, 3);
}

unsigned engram__rcache_count(engram__rcache *c, uint64_t row, uint32_t asks)
{
    uint64_t h;
    _Atomic uint64_t *blk;
    unsigned est = 15;
    if (!c->sketch_words)
        return ADMIT; /* keep all (or no slots: never asked) */
    blk = sketch_block(c, row, &h);
    if (asks > 15)
        asks = 15;
    for (unsigned i = 0; i < 4; i++) {
        _Atomic uint64_t *w = &blk[CTR_WORD(h, i)];
        unsigned sh = (unsigned)CTR_SHIFT(h, i);
        uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
        unsigned ctr = (unsigned)(v >> sh) & 15u;
        unsigned add = ctr + asks > 15 ? 15 - ctr : asks;
        if (add)
            atomic_store_explicit(w, v + ((uint64_t)add << sh), memory_order_relaxed);
        if (ctr + add < est)
            est = ctr + add;
    }
    return est;
}

void engram__rcache_age(engram__rcache *c, uint64_t asks)
{
    uint64_t n;
    if (!c->sketch_words || !asks)
        return;
    n = atomic_fetch_add_explicit(&c->asks, asks, memory_order_relaxed);
    sketch_age(c, n, n + asks);
}

int engram__rcache_put(engram__rcache *c, uint64_t row, const void *src, unsigned est)
{
    uint64_t si;
    rc_set *s;
    unsigned w, victim = WAYS;
    if (c->nsets == 0)
        return 0; /* no slots: nothing is kept, nothing declined */
    si = set_of(c, row);
    s = &c->sets[si];
    set_lock(s);
    for (w = 0; w < WAYS; w++) {
        uint64_t tag = atomic_load_explicit(&s->tag[w], memory_order_relaxed);
        if (tag == row + 1) {
            /* Another lookup read the same row meanwhile. */
            set_unlock(s);
            return 0;
        }
        if (tag == 0 && victim == WAYS)
            victim = w;
    }
    if (victim == WAYS && est < ADMIT) {
        /* Full, and the row is not asked for often enough to evict one. */
        set_unlock(s);
        return 1;
    }
    /* CLOCK: pass over ways whose reference bit is set, clearing it. */
    while (victim == WAYS) {
        unsigned h = s->hand;
        s->hand = (unsigned char)((h + 1) % WAYS);
        if (s->ref & (1u << h))
            s->ref &= (unsigned char)~(1u << h);
        else
            victim = h;
    }
    memcpy(slot_of(c, si, victim), src, c->row_bytes);
    s->ref &= (unsigned char)~(1u << victim);
    atomic_store_explicit(&s->tag[victim], row + 1, memory_order_relaxed);
    set_unlock(s);
    return 0;
}

void engram__rcache_stats(const engram__rcache *c, engram_cache_stats *s)
{
    s->cache_bytes += c->charged;
    s->slots += c->nsets * WAYS;
}
