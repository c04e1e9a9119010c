/*
 * gather.c - the lookup: validate the whole batch into a plan, then copy.
 *
 * A lookup is done in two passes.  The first resolves each column's table
 * and checks every id, recording each row's source address: the plan.  An
 * error there leaves the output untouched.  The second copies the planned
 * rows, prefetching each source a few rows before copying it, which keeps
 * several independent cache misses in flight (random rows of a large
 * table are bound by memory latency, not bandwidth).  The copy loop only
 * reads addresses, so it stays short: the fewer instructions per row, the
 * more rows the core's out-of-order window holds and the more misses
 * overlap.
 *
 * The copy loop is one generic routine, inlined with the row size as a
 * compile-time constant for the common row sizes, so the compiler emits
 * fixed-size vector moves instead of memcpy calls (32-byte ones where the
 * CPU has AVX2), and without the prefetches where the lookup's tables fit
 * in the caches.
 *
 * A decode step asks for the same tables every time, so what resolving
 * them costs (the registry, the removed flag, the specs, the counters to
 * update) is kept per thread and reused while the store stays the same:
 * a lookup of 24 tables and one token then costs little more than the
 * copies themselves.
 *
 * Rows of tables without a base address (row sources: files read on
 * demand, checkpoints, the caller's sources) are planned the same way,
 * their validated row numbers recorded once, and then handed all
 * together to fetch.c after the memory rows are copied.  No id is read
 * twice: what was validated is what is served.
 *
 * Large batches are split across the store's thread pool.  Nothing here
 * allocates or locks, except the per-thread plan scratch, which grows the
 * first time a thread plans more than STACK_ROWS rows or STACK_COLS
 * columns and is kept for the thread's next lookups (8 bytes per row, 16
 * with row sources), and the per-thread scratch of the rows handed to
 * fetch.c (24 bytes each, and fetch.c's own).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fetch.h"
#include "ids.h"
#include "outlayout.h"
#include "pool.h"
#include "readsection.h"
#include "store.h"

#define STACK_COLS 64
#define STACK_ROWS 256
#define AHEAD 8 /* rows prefetched ahead of the copy (4, 8 and 16 measured alike) */
/* Prefetch hint: the row is copied once, soon, and not read again, so it
 * need not displace anything from the outer caches. */
#define PREFETCH_LOCALITY 0
#define PART_ROWS 256 /* rows per part of a split lookup */

typedef struct col {
    const unsigned char *base; /* NULL: rows come from the table's row source */
    uint64_t span; /* the ids the column accepts, from off on: engram__id_span() */
    int64_t off;   /* offsets[k] */
    size_t pitch;
    engram__table *t;
} col;

/* The columns a thread resolved for its last few sets of tables and
 * offsets, for its next lookups of the same ones (an engine asks for the
 * same 24 tables of each Engram layer every decode step, layer after
 * layer): resolving K tables through the registry, checking them and
 * filling their descriptors is most of a small lookup's own cost.  An
 * entry is valid while the store is the same one (serial: a new store may
 * reuse a closed one's address) and no table of it was removed since
 * (gen); the tables, their specs and base addresses never change
 * otherwise.  MEMO_SLOTS entries, replaced in turn. */
#define MEMO_COLS 64
#define MEMO_SLOTS 4
typedef struct colmemo {
    uint64_t serial; /* the store's; 0 = empty */
    uint64_t gen;    /* the store's removal generation when made */
    size_t K;
    int has_offsets, indirect;
    engram_table_id tables[MEMO_COLS];
    int64_t offsets[MEMO_COLS];
    col cols[MEMO_COLS];
    /* This thread's stats slot of each column's table (the thread's
     * slot never changes) and whether it has it alone. */
    engram__table_counters *ctr[MEMO_COLS];
    int excl;
    int hot; /* the distinct tables of the columns fit in half the last-level cache */
} colmemo;

typedef struct memoset {
    colmemo e[MEMO_SLOTS];
    unsigned last; /* the entry of the last lookup, tried first */
    unsigned next; /* the entry a new set of columns replaces */
} memoset;

typedef struct plan {
    const col *cols;
    size_t T, K, R;
    const unsigned char *ids;
    int id64;
    ptrdiff_t ist, isk; /* id strides in elements */
    unsigned char *out;
    ptrdiff_t ost, osk; /* output strides in bytes */
    int zero_dead;
    int indirect; /* some column has no base address */
    int hot;      /* the lookup's tables fit in the caches: copy without prefetching */
    const unsigned char **src; /* [T * K] row sources: NULL skips, ZERO_ROW zero-fills */
    uint64_t *rows; /* [T * K] with `indirect`: the validated row of each position of a
                     * column without base address, or DEAD_ROW */
} plan;

/* rows[] of a dead id. */
#define DEAD_ROW UINT64_MAX

/* Marks a dead row that is to be zero-filled; NULL marks a row to skip (a
 * dead id kept as is, or a row copied by the backend pass). */
static const unsigned char zero_marker;
#define ZERO_ROW (&zero_marker)


static inline __attribute__((always_inline)) int64_t load_id(const plan *p, size_t t, size_t k,
                                                             const int id64)
{
    ptrdiff_t e = (ptrdiff_t)t * p->ist + (ptrdiff_t)k * p->isk;
    if (id64)
        return ((const int64_t *)(const void *)p->ids)[e];
    return ((const int32_t *)(const void *)p->ids)[e];
}

/* Copies one row.  With `pieces` (R is a compile-time constant) the copy
 * is a run of 16-byte moves (32-byte ones with `wide`, in the AVX2 build
 * of the copy: see copy_dispatch) plus one overlapping tail, which
 * compilers emit as plain vector loads and stores; a constant-size memcpy
 * of a few hundred bytes would
 * otherwise become `rep movs`, which is slower here and keeps the core
 * from overlapping the next rows' cache misses. */
/* One 32-byte move through a vector register: one load and one store
 * with AVX2, two each without (a plain 32-byte memcpy is split in 16-byte
 * pieces even with AVX2). */
typedef unsigned char engram__v32 __attribute__((vector_size(32), aligned(1)));

static inline __attribute__((always_inline)) void move32(unsigned char *d, const unsigned char *s)
{
    engram__v32 v;
    memcpy(&v, s, sizeof v);
    memcpy(d, &v, sizeof v);
}

static inline __attribute__((always_inline)) void copy_row(unsigned char *d,
                                                           const unsigned char *s,
                                                           const size_t R, const int pieces,
                                                           const int wide)
{
    size_t o = 0;
    if (!pieces || R < 16) {
        memcpy(d, s, R);
        return;
    }
    /* Fully unrolled: R is a constant here, and a counted loop around a
     * move doubles the instructions per row. */
    if (wide) {
#pragma GCC unroll 32
        for (; o + 32 <= R; o += 32)
            move32(d + o, s + o);
    }
#pragma GCC unroll 32
    for (; o + 16 <= R; o += 16)
        memcpy(d + o, s + o, 16);
    if (o < R)
        memcpy(d + R - 16, s + R - 16, 16);
}

/* Starts loading the cache lines of a planned row source. */
static inline __attribute__((always_inline)) void prefetch_row(const unsigned char *s,
                                                               const size_t R)
{
    if (!s || s == ZERO_ROW)
        return;
    for (size_t o = 0; o < R; o += 64)
        __builtin_prefetch(s + o, 0, PREFETCH_LOCALITY);
    __builtin_prefetch(s + R - 1, 0, PREFETCH_LOCALITY);
}

/* Copies the planned rows [begin, end) of the flattened [T, K] batch,
 * prefetching AHEAD rows further on: a rolling window keeps a steady
 * number of row misses in flight.  Everything the loop needs is in
 * locals: the copies store through unsigned char pointers, which may alias
 * anything reached through a pointer, so fields read through `plan *`
 * would be reloaded after every row.  R and pieces are constants at every
 * call site of the dispatcher below. */
static inline __attribute__((always_inline)) void copy_range(const plan *p, size_t begin,
                                                             size_t end, const size_t R,
                                                             const int pieces, const int wide,
                                                             const int pf)
{
    const unsigned char *const *const src = p->src;
    unsigned char *const out = p->out;
    const size_t K = p->K;
    const ptrdiff_t ost = p->ost, osk = p->osk;
    size_t k = begin % K;
    ptrdiff_t oe_t = (ptrdiff_t)(begin / K) * ost, oe = oe_t + (ptrdiff_t)k * osk;

    for (size_t n = begin; pf && n < end && n < begin + AHEAD; n++)
        prefetch_row(src[n], R);
    for (size_t i = begin; i < end; i++) {
        const unsigned char *s = src[i];
        if (pf && i + AHEAD < end)
            prefetch_row(src[i + AHEAD], R);
        if (s == ZERO_ROW)
            memset(out + oe, 0, R);
        else if (s)
            copy_row(out + oe, s, R, pieces, wide);
        oe += osk;
        if (++k == K) {
            k = 0;
            oe = oe_t += ost;
        }
    }
}

/* Row sizes copied with inline moves.  Larger rows take the generic path:
 * glibc's memcpy vector loop beats inline moves from about 512 bytes up
 * (hot single-row lookups of 1 KiB rows: 90-106 ns inline, 63-72 ns with
 * memcpy), and a constant-size memcpy there would become rep movs. */
#define ENGRAM__ROW_SIZES(X) X(8) X(16) X(32) X(64) X(128) X(256) X(264) X(272)

static inline __attribute__((always_inline)) void copy_sized_pf(const plan *p, size_t begin,
                                                                size_t end, const int wide,
                                                                const int pf)
{
#define CASE(r)                                        \
    case r:                                            \
        copy_range(p, begin, end, r, 1, wide, pf);     \
        return;
    switch (p->R) {
        ENGRAM__ROW_SIZES(CASE)
    default:
        copy_range(p, begin, end, p->R, 0, wide, pf);
        return;
    }
#undef CASE
}

/* Without prefetching where the lookup's tables fit in the caches
 * (p->hot): the rows are there already, and the prefetches cost a third
 * of the instructions of a cached row's copy. */
static inline __attribute__((always_inline)) void copy_sized(const plan *p, size_t begin,
                                                             size_t end, const int wide)
{
    if (p->hot)
        copy_sized_pf(p, begin, end, wide, 0);
    else
        copy_sized_pf(p, begin, end, wide, 1);
}

/* The copy is built twice on x86-64: for any x86-64 CPU, and for AVX2
 * with 32-byte moves kept whole (tuned for Haswell: the generic tuning
 * splits unaligned 32-byte moves in two), and the one for this CPU is
 * taken.  A 264-byte row then costs 9 loads and 9 stores instead of 17
 * and 17, most of a small lookup's instructions when its rows are in the
 * caches. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ENGRAM__COPY_AVX2 1
__attribute__((target("avx2,tune=haswell"))) static void copy_avx2(const plan *p, size_t begin,
                                                                   size_t end)
{
    copy_sized(p, begin, end, 1);
}

static int have_avx2;
__attribute__((constructor)) static void copy_init(void)
{
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
}
#endif

static void copy_dispatch(const plan *p, size_t begin, size_t end)
{
#ifdef ENGRAM__COPY_AVX2
    if (have_avx2) {
        copy_avx2(p, begin, end);
        return;
    }
#endif
    copy_sized(p, begin, end, 0);
}

static void copy_part(void *arg, size_t part, size_t nparts)
{
    const plan *p = arg;
    size_t rows = p->T * p->K;
    copy_dispatch(p, rows * part / nparts, rows * (part + 1) / nparts);
}

/* Room for the requests of the rows of columns without a base address,
 * and fetch.c's scratch for them, taken before the first output row is
 * written: a lookup that fails for want of memory writes nothing.
 * *reqs gets the request array (`stack` when the batch is small). */
static int fetch_prepare(const plan *p, engram__fetch_req *stack, engram__fetch_req **reqs)
{
    uint64_t rows = (uint64_t)p->T * p->K, size;
    *reqs = stack;
    if (rows > STACK_ROWS &&
        (engram__mul_u64(rows, sizeof **reqs, &size) || size > SIZE_MAX ||
         !(*reqs = engram__scratch(ENGRAM__SCRATCH_ROWS, (size_t)size))))
        return engram__err(-ENOMEM, "out of memory for the source rows of %zu x %zu ids",
                           p->T, p->K);
    return engram__fetch_reserve((size_t)rows);
}

/* The rows of columns without a base address, as validated by the plan,
 * go to fetch.c all together: one call per lookup whatever their columns,
 * so the row sources see repeated rows together and keep their reads in
 * flight over all of them. */
static int fetch_pass(const plan *p, engram__fetch_req *reqs)
{
    size_t n = 0;
    for (size_t k = 0; k < p->K; k++) {
        const col *c = &p->cols[k];
        if (c->base)
            continue;
        for (size_t t = 0; t < p->T; t++) {
            uint64_t row = p->rows[t * p->K + k];
            if (row == DEAD_ROW)
                continue;
            reqs[n].t = c->t;
            reqs[n].row = row;
            reqs[n].dst = p->out + (ptrdiff_t)t * p->ost + (ptrdiff_t)k * p->osk;
            n++;
        }
    }
    return engram__fetch(reqs, n);
}

/* Plans rows [begin, end): checks each id and records the row's source.
 * Returns the index of the first bad id, or SIZE_MAX.  It records no
 * message, because it may run on a pool thread: the caller builds the
 * message with bad_id() on its own thread.  id64 is a constant at both
 * call sites in plan_dispatch(). */
static inline __attribute__((always_inline)) size_t plan_range(const plan *p, size_t begin,
                                                               size_t end, const int id64,
                                                               uint64_t *dead)
{
    const void *const ids = p->ids;
    const col *const cols = p->cols;
    const size_t K = p->K;
    const ptrdiff_t ist = p->ist, isk = p->isk;
    const unsigned char *const zero = p->zero_dead ? ZERO_ROW : NULL;
    const unsigned char **const src = p->src;
    uint64_t *const rows = p->rows;
    uint64_t ndead = 0;
    size_t k = begin % K;
    ptrdiff_t ie_t = (ptrdiff_t)(begin / K) * ist, ie = ie_t + (ptrdiff_t)k * isk;

    /* One flat loop with a column cursor: a nested loop per token costs
     * more than the checks themselves when K is small. */
    for (size_t i = begin; i < end; i++) {
        int64_t raw = id64 ? ((const int64_t *)ids)[ie] : ((const int32_t *)ids)[ie];
        const col *c = &cols[k];
        uint64_t row;
        /* Dead is decided on the raw id, before the offset. */
        if (raw == ENGRAM_DEAD_ID) {
            ndead++;
            src[i] = zero;
            if (!c->base)
                rows[i] = DEAD_ROW;
        } else if (ENGRAM__LIKELY(engram__id_row(raw, c->off, c->span, &row))) {
            if (ENGRAM__LIKELY(c->base != NULL)) {
                src[i] = c->base + row * c->pitch;
            } else {
                src[i] = NULL;
                rows[i] = row;
            }
        } else {
            return i;
        }
        ie += isk;
        if (++k == K) {
            k = 0;
            ie = ie_t += ist;
        }
    }
    *dead = ndead;
    return SIZE_MAX;
}

static size_t plan_dispatch(const plan *p, size_t begin, size_t end, uint64_t *dead)
{
    return p->id64 ? plan_range(p, begin, end, 1, dead) : plan_range(p, begin, end, 0, dead);
}

/* Dead ids of column k of a planned lookup, counted from the plan (not
 * the ids: they are read once), for the table's row counter.  Called only
 * when the lookup had dead ids at all. */
static uint64_t col_dead(const plan *p, size_t k)
{
    uint64_t n = 0;
    for (size_t i = k; i < p->T * p->K; i += p->K) {
        if (p->cols[k].base)
            n += p->src[i] == NULL || p->src[i] == ZERO_ROW;
        else
            n += p->rows[i] == DEAD_ROW;
    }
    return n;
}

/* The error for bad id number i of the flattened batch of lookup `a`, in
 * words (engram_errmsg()) and numbers (engram_last_bad_id()). */
static int bad_id(const plan *p, const engram_lookup_args *a, size_t i)
{
    size_t t = i / p->K, k = i % p->K;
    const col *c = &p->cols[k];
    int64_t raw = p->id64 ? load_id(p, t, k, 1) : load_id(p, t, k, 0);
    engram_bad_id b = ENGRAM_BAD_ID_INIT;
    if (c->off)
        engram__err(ENGRAM_EBADID,
                    "ids[%zu][%zu] = %lld minus offset %lld is outside table '%s' "
                    "(0 <= id - offset < %llu)",
                    t, k, (long long)raw, (long long)c->off, c->t->name,
                    (unsigned long long)c->t->spec.num_rows);
    else
        engram__err(ENGRAM_EBADID, "ids[%zu][%zu] = %lld is outside table '%s' (0 <= id < %llu)",
                    t, k, (long long)raw, c->t->name,
                    (unsigned long long)c->t->spec.num_rows);
    b.col = k;
    b.token = t;
    b.id = raw;
    b.offset = c->off;
    b.num_rows = c->t->spec.num_rows;
    b.table = a->tables[k];
    engram__set_bad_id(&b);
    return ENGRAM_EBADID;
}

/* A split plan: each part plans its rows and lowers `first_bad` to the
 * index of its first bad id, so the error reported is the first in the
 * batch, as in an unsplit plan. */
typedef struct plan_job {
    const plan *p;
    _Atomic size_t first_bad;
    _Atomic uint64_t dead; /* dead ids of all parts: each adds its count once */
} plan_job;

static void plan_part(void *arg, size_t part, size_t nparts)
{
    plan_job *j = arg;
    size_t rows = j->p->T * j->p->K;
    uint64_t dead = 0;
    size_t bad = plan_dispatch(j->p, rows * part / nparts, rows * (part + 1) / nparts, &dead);
    size_t cur = atomic_load_explicit(&j->first_bad, memory_order_relaxed);
    if (bad == SIZE_MAX)
        atomic_fetch_add_explicit(&j->dead, dead, memory_order_relaxed);
    while (bad < cur &&
           !atomic_compare_exchange_weak_explicit(&j->first_bad, &cur, bad, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* Resolves the tables and offsets of lookup `a` into cols[K] (pass one,
 * first half); *indirect is set if a column has no base address.
 * Nothing is written to the output here. */
static int resolve_cols(engram_store *st, const engram_lookup_args *a, col *cols, int *indirect)
{
    *indirect = 0;
    for (size_t k = 0; k < a->num_cols; k++) {
        engram__table *t = engram__table_get(st, a->tables[k]);
        if (ENGRAM__UNLIKELY(!t))
            return engram__err(-EINVAL, "tables[%zu] = %u is not a table id of this store", k,
                               (unsigned)a->tables[k]);
        if (ENGRAM__UNLIKELY(atomic_load_explicit(&t->removed, memory_order_acquire)))
            return engram__err(ENGRAM_EREMOVED, "tables[%zu]: table '%s' was removed", k,
                               t->name);
        if (ENGRAM__UNLIKELY(k > 0 && t->spec.row_bytes != cols[0].t->spec.row_bytes))
            return engram__err(ENGRAM_ELAYOUT,
                               "tables[%zu] = '%s' has row_bytes %u but tables[0] = '%s' has %u", k,
                               t->name, t->spec.row_bytes, cols[0].t->name,
                               cols[0].t->spec.row_bytes);
        cols[k].base = t->src.base;
        cols[k].off = a->offsets ? a->offsets[k] : 0;
        cols[k].span = engram__id_span(t->spec.num_rows, cols[k].off);
        cols[k].pitch = t->spec.row_pitch;
        cols[k].t = t;
        *indirect |= t->src.base == NULL;
    }
    return 0;
}

/* This thread's column memo (allocated on first use, freed at thread
 * exit), or NULL without memory: lookups then resolve every time.  The
 * pointer is initial-exec TLS (a plain %fs load), the memo itself is on
 * the heap, since the static TLS left for a dlopen()ed module is small. */
static _Thread_local memoset *memo_tls __attribute__((tls_model("initial-exec")));
static pthread_key_t memo_key;
static pthread_once_t memo_once = PTHREAD_ONCE_INIT;

/* At thread exit; clears the pointer too, for a lookup that a later key
 * destructor of the same thread might still make. */
static void memo_free(void *m)
{
    memo_tls = NULL;
    free(m);
}

static void memo_key_init(void)
{
    (void)pthread_key_create(&memo_key, memo_free);
}

static memoset *memo_get(void)
{
    memoset *m = memo_tls;
    if (ENGRAM__UNLIKELY(!m)) {
        pthread_once(&memo_once, memo_key_init);
        if (!(m = calloc(1, sizeof *m)))
            return NULL;
        pthread_setspecific(memo_key, m);
        memo_tls = m;
    }
    return m;
}

/* Bytes of the last-level cache, 0 if unknown: the kernel's word (sysfs)
 * first, since glibc's sysconf() reads CPUID, which some hypervisors fill
 * with figures ten times too large (320 MiB for a 32 MiB L3 here). */
static uint64_t llc_bytes;
static pthread_once_t llc_once = PTHREAD_ONCE_INIT;

static void llc_init(void)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "re");
    unsigned long v = 0;
    char unit = 0;
    if (f) {
        if (fscanf(f, "%lu%c", &v, &unit) >= 1)
            v <<= unit == 'M' ? 20 : unit == 'K' ? 10 : 0;
        fclose(f);
    }
    if (v == 0) {
        long c = sysconf(_SC_LEVEL3_CACHE_SIZE);
        v = c > 0 ? (unsigned long)c : 0;
    }
    llc_bytes = v;
}

/* 1 if the distinct tables of cols[K] together fit in half the
 * last-level cache: their rows are in the caches after the first lookups,
 * and prefetching them only costs instructions. */
static int cols_fit_cache(const col *cols, size_t K)
{
    uint64_t sum = 0;
    pthread_once(&llc_once, llc_init);
    for (size_t k = 0; k < K; k++) {
        size_t j = 0;
        while (j < k && cols[j].t != cols[k].t)
            j++;
        if (j == k)
            sum += cols[k].t->data_size;
    }
    return llc_bytes > 0 && sum <= llc_bytes / 2;
}

/* The resolved columns of lookup `a`: the thread's memo when it holds
 * them, else resolved now (into the memo when K fits, else into `cols`). */
static int get_cols(engram_store *st, const engram_lookup_args *a, col *cols, const col **out,
                    int *indirect, colmemo **memo)
{
    size_t K = a->num_cols;
    memoset *ms = K <= MEMO_COLS ? memo_get() : NULL;
    /* Acquire pairs with the release increment in engram_remove(): a
     * removal before this load is seen as a new generation. */
    uint64_t gen = atomic_load_explicit(&st->gen, memory_order_acquire);
    int err;
    if (ENGRAM__LIKELY(ms != NULL)) {
        colmemo *m;
        for (unsigned i = 0; i < MEMO_SLOTS; i++) {
            unsigned j = (ms->last + i) % MEMO_SLOTS;
            m = &ms->e[j];
            if (ENGRAM__LIKELY(m->serial == st->serial && m->gen == gen && m->K == K &&
                               m->has_offsets == (a->offsets != NULL) &&
                               memcmp(m->tables, a->tables, K * sizeof *a->tables) == 0 &&
                               (!a->offsets ||
                                memcmp(m->offsets, a->offsets, K * sizeof *a->offsets) == 0))) {
                ms->last = j;
                *out = m->cols;
                *indirect = m->indirect;
                *memo = m;
                return 0;
            }
        }
        ms->last = ms->next;
        ms->next = (ms->next + 1) % MEMO_SLOTS;
        m = &ms->e[ms->last];
        m->serial = 0;
        if ((err = resolve_cols(st, a, m->cols, &m->indirect)) != 0)
            return err;
        {
            unsigned stats_slot = engram__stats_slot(&m->excl);
            for (size_t k = 0; k < K; k++)
                m->ctr[k] = &m->cols[k].t->ctr[stats_slot];
        }
        m->hot = cols_fit_cache(m->cols, K);
        memcpy(m->tables, a->tables, K * sizeof *a->tables);
        if (a->offsets)
            memcpy(m->offsets, a->offsets, K * sizeof *a->offsets);
        m->has_offsets = a->offsets != NULL;
        m->K = K;
        m->gen = gen;
        m->serial = st->serial;
        *out = m->cols;
        *indirect = m->indirect;
        *memo = m;
        return 0;
    }
    if ((err = resolve_cols(st, a, cols, indirect)) != 0)
        return err;
    *out = cols;
    *memo = NULL;
    return 0;
}

/* Fills the plan's layout from lookup `a` and checks it (pass one, second
 * half). */
static int plan_layout(const engram_lookup_args *a, plan *p)
{
    size_t T = a->num_tokens, K = a->num_cols;
    engram__out_layout ol;
    int err;
    if (ENGRAM__UNLIKELY(a->row_bytes && a->row_bytes != p->cols[0].t->spec.row_bytes))
        return engram__err(ENGRAM_ELAYOUT, "output rows are %zu bytes but table '%s' has "
                           "row_bytes %u", a->row_bytes, p->cols[0].t->name,
                           p->cols[0].t->spec.row_bytes);
    p->T = T;
    p->K = K;
    p->R = p->cols[0].t->spec.row_bytes;
    p->ids = a->ids;
    p->id64 = a->id_type == ENGRAM_ID_INT64;
    p->ist = a->id_stride_t;
    p->isk = a->id_stride_k;
    if (p->ist == 0 && p->isk == 0) {
        p->ist = (ptrdiff_t)K;
        p->isk = 1;
    }
    p->out = a->out;
    p->zero_dead = (a->flags & ENGRAM_LOOKUP_ZERO_DEAD) != 0;
    if ((err = engram__out_layout_resolve(p->R, T, K, a->out_stride_t, a->out_stride_k, &ol)) != 0)
        return err;
    p->ost = ol.ost;
    p->osk = ol.osk;
    return 0;
}

/* ------------------------------------------------------------------------
 * engram_lookup() in its three steps: validate the arguments, plan (resolve
 * the tables and the layout, check every id), run (copy the memory rows,
 * then fetch the rest); then the counters.  Each is called once, so the
 * compiler keeps them in the one function a lookup runs.
 */

/* The caller's storage for a lookup that fits on the stack. */
typedef struct lookup_stack {
    col cols[STACK_COLS];
    const unsigned char *src[STACK_ROWS];
    uint64_t rows[STACK_ROWS];
    engram__fetch_req reqs[STACK_ROWS];
} lookup_stack;

/* What the plan leaves for the run and the counters. */
typedef struct lookup_state {
    plan p;
    colmemo *memo;  /* the thread's memo entry of the columns, or NULL */
    size_t rows;    /* T x K */
    uint64_t dead;  /* dead ids */
    size_t parts;   /* parts of a split lookup; 0: on this thread */
} lookup_state;

/* The checks of `a` that need no table: 0, or the error. */
static int lookup_validate(const engram_lookup_args *a)
{
    if (ENGRAM__UNLIKELY(!a->tables || !a->ids || !a->out))
        return engram__err(-EINVAL, "tables, ids and out are required for a %zu x %zu lookup",
                           a->num_tokens, a->num_cols);
    if (ENGRAM__UNLIKELY(a->id_type != ENGRAM_ID_INT32 && a->id_type != ENGRAM_ID_INT64))
        return engram__err(ENGRAM_ELAYOUT,
                           "id_type %d is neither ENGRAM_ID_INT32 nor ENGRAM_ID_INT64",
                           a->id_type);
    if (ENGRAM__UNLIKELY(engram__mul_u64(a->num_tokens, a->num_cols, &(uint64_t){0})))
        return engram__err(ENGRAM_ELAYOUT, "%zu x %zu ids overflow", a->num_tokens, a->num_cols);
    return 0;
}

/* Plans lookup `a` into *ls (pass one): resolves its columns and its
 * layout, takes the plan's memory and checks every id, recording each
 * row's source.  Nothing is written to the output.  Runs inside the
 * caller's read section. */
static int lookup_plan(engram_store *st, const engram_lookup_args *a, lookup_stack *stk,
                       lookup_state *ls)
{
    plan *p = &ls->p;
    col *cols;
    int err;

    ls->rows = a->num_tokens * a->num_cols;
    ls->dead = 0;
    ls->parts = 0;
    if (ENGRAM__LIKELY(a->num_cols <= STACK_COLS)) {
        cols = stk->cols;
    } else if (engram__mul_u64(a->num_cols, sizeof(col), &(uint64_t){0}) ||
               !(cols = engram__scratch(ENGRAM__SCRATCH_COLS, a->num_cols * sizeof(col)))) {
        return engram__err(-ENOMEM, "out of memory for the plan of %zu columns", a->num_cols);
    }
    if ((err = get_cols(st, a, cols, &p->cols, &p->indirect, &ls->memo)) != 0 ||
        (err = plan_layout(a, p)) != 0)
        return err;
    p->hot = ls->memo ? ls->memo->hot : 0;
    if (ENGRAM__LIKELY(ls->rows <= STACK_ROWS)) {
        p->src = stk->src;
        p->rows = stk->rows;
    } else {
        /* The row sources, then (with row sources) the rows.  Ids may be
         * broadcast (stride 0), so T x K is not bounded by memory: the
         * size is checked like any other. */
        uint64_t per = sizeof *p->src + (p->indirect ? sizeof *p->rows : 0), size;
        if (ENGRAM__UNLIKELY(engram__mul_u64(ls->rows, per, &size) || size > SIZE_MAX))
            return engram__err(ENGRAM_ELAYOUT, "a plan of %zu x %zu rows does not fit in memory",
                               a->num_tokens, a->num_cols);
        if (ENGRAM__UNLIKELY(!(p->src = engram__scratch(ENGRAM__SCRATCH_PLAN, (size_t)size))))
            return engram__err(-ENOMEM, "out of memory for the plan of %zu x %zu rows",
                               a->num_tokens, a->num_cols);
        p->rows = (uint64_t *)(void *)(p->src + ls->rows);
    }

    if (st->pool && ls->rows >= st->parallel_min_rows) {
        /* Parts of ~PART_ROWS rows: small enough that the caller can take
         * over the share of a worker that is late, large enough that the
         * claim per part is noise.  Planning and copying are two jobs: no
         * row is copied before every id has been checked. */
        plan_job pj = {p, SIZE_MAX, 0};
        ls->parts = ls->rows / PART_ROWS < 2 ? 2 : ls->rows / PART_ROWS;
        if (engram__pool_run(st->pool, plan_part, &pj, ls->parts) != 0)
            plan_part(&pj, 0, 1); /* pool busy: plan on this thread */
        if (ENGRAM__UNLIKELY(atomic_load_explicit(&pj.first_bad, memory_order_relaxed) !=
                             SIZE_MAX))
            return bad_id(p, a, atomic_load_explicit(&pj.first_bad, memory_order_relaxed));
        ls->dead = atomic_load_explicit(&pj.dead, memory_order_relaxed);
    } else {
        size_t bad = plan_dispatch(p, 0, ls->rows, &ls->dead);
        if (ENGRAM__UNLIKELY(bad != SIZE_MAX))
            return bad_id(p, a, bad);
    }
    return 0;
}

/* Runs a planned lookup (pass two): the memory rows are copied (split
 * across the pool where the plan was), then the rows of row sources are
 * fetched.  *par is set if the copy ran on the pool. */
static int lookup_run(engram_store *st, lookup_state *ls, lookup_stack *stk, int *par)
{
    plan *p = &ls->p;
    engram__fetch_req *reqs = NULL;
    int err;

    *par = 0;
    if (p->indirect && (err = fetch_prepare(p, stk->reqs, &reqs)) != 0)
        return err;
    if (ls->parts)
        *par = engram__pool_run(st->pool, copy_part, p, ls->parts) == 0;
    if (!*par)
        copy_dispatch(p, 0, ls->rows);
    if (p->indirect)
        return fetch_pass(p, reqs);
    return 0;
}

/* The counters of a lookup that succeeded: its tables' (each column's
 * lookups and live rows) and the store's (with its time from t0 where the
 * store counts time). */
static void lookup_count(engram_store *st, const lookup_state *ls, unsigned stats_slot, int excl,
                         int par, int timing, uint64_t t0)
{
    const plan *p = &ls->p;
    const colmemo *memo = ls->memo;
    uint64_t dead = ls->dead, live = ls->rows - dead;
    if (ENGRAM__LIKELY(memo && memo->excl && !dead)) {
        /* The common case in one loop of plain adds: the thread's own
         * slots, known from the memo, and every row live. */
        for (size_t k = 0; k < p->K; k++) {
            engram__table_counters *tc = memo->ctr[k];
            atomic_store_explicit(&tc->lookups,
                                  atomic_load_explicit(&tc->lookups, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            atomic_store_explicit(&tc->rows,
                                  atomic_load_explicit(&tc->rows, memory_order_relaxed) + p->T,
                                  memory_order_relaxed);
        }
    } else {
        for (size_t k = 0; k < p->K; k++) {
            engram__table_counters *tc = &p->cols[k].t->ctr[stats_slot];
            engram__ctr_add(&tc->lookups, 1, excl);
            engram__ctr_add(&tc->rows, p->T - (dead ? col_dead(p, k) : 0), excl);
        }
    }
    {
        engram__store_counters *c = &st->ctr[stats_slot];
        engram__ctr_add(&c->lookups, 1, excl);
        engram__ctr_add(&c->rows, live, excl);
        engram__ctr_add(&c->dead, dead, excl);
        engram__ctr_add(&c->bytes, live * p->R, excl);
        if (par)
            engram__ctr_add(&c->parallel, 1, excl);
        if (timing)
            engram__ctr_add(&c->time_ns, engram__now_ns() - t0, excl);
    }
}

int engram_lookup(engram_store *st, const engram_lookup_args *a)
{
    lookup_stack stk;
    lookup_state ls;
    uint64_t t0 = 0;
    unsigned stats_slot;
    int excl, err, timing, par = 0;

    if (ENGRAM__UNLIKELY(!st || !a || a->size != sizeof(engram_lookup_args)))
        return engram__err(-EINVAL, "store and args (with size = sizeof(engram_lookup_args)) are "
                                    "required");
    if (ENGRAM__UNLIKELY(a->flags & ~(uint32_t)ENGRAM_LOOKUP_ZERO_DEAD))
        return engram__err(-EINVAL, "unknown lookup flags 0x%x", a->flags);
    if (ENGRAM__UNLIKELY(engram__fetch_in_source()))
        /* The plan scratch of the lookup that called the source is in use. */
        return engram__err(ENGRAM_ESTATE, "engram_lookup() called from inside a source's "
                                          "read_rows");
    if (a->num_tokens == 0 || a->num_cols == 0)
        return 0;
    timing = (st->opts.flags & ENGRAM_OPEN_TIMING) != 0;
    if (timing)
        t0 = engram__now_ns();
    stats_slot = engram__stats_slot(&excl);
    if ((err = lookup_validate(a)) != 0)
        goto fail;
    /* From resolving the tables to the last copy: a table removed
     * meanwhile keeps its source until the section ends (readsection.h). */
    if ((err = engram__rsec_enter()) != 0)
        goto fail;
    err = lookup_plan(st, a, &stk, &ls);
    if (err == 0)
        err = lookup_run(st, &ls, &stk, &par);
    engram__rsec_exit();
    if (err)
        goto fail;
    lookup_count(st, &ls, stats_slot, excl, par, timing, t0);
    /* Last, once this lookup is done with the thread's plan and memo: the
     * log function it may call can look up on this thread itself. */
    if (ls.p.indirect && st->log_ns)
        engram__store_maybe_log(st);
    return 0;
fail:
    engram__ctr_add(&st->ctr[stats_slot].failed, 1, excl);
    return err;
}
