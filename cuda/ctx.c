/*
 * ctx.c - CUDA contexts: device selection, table registration (in place or
 * as a pinned copy), the bad-id report and stats.
 *
 * Registration is process-wide state in the CUDA driver: a range can be
 * registered once, and cudaHostRegister() refuses ranges that overlap a
 * registered one.  Several contexts (of one store or of several stores
 * that bound the same memory) may need the same table memory, so the
 * registrations made here are kept in one process-wide list with a
 * reference count: a context whose range lies inside a registered one
 * shares it, and the last user unregisters it.  A range that overlaps a
 * registration it does not lie inside (or one made by someone else) gets
 * a pinned copy instead.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ctx.h"

#define HUGE_SZ ((size_t)2 << 20)

struct engram__cuda_reg {
    uintptr_t addr;
    size_t len;
    unsigned refs;
    engram__cuda_reg *next;
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static engram__cuda_reg *regs; /* under reg_lock */

int engram__cuda_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    code = engram_internal_v1()->verr(code, fmt, ap);
    va_end(ap);
    return code;
}

int engram__cuda_err(cudaError_t e, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    int code;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* Clears the error if it is not sticky, so it does not resurface in an
     * unrelated later call. */
    (void)cudaGetLastError();
    switch (e) {
    case cudaErrorMemoryAllocation:
        code = -ENOMEM;
        break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
        code = -ENODEV;
        break;
    default:
        code = -EIO;
        break;
    }
    return engram__cuda_fail(code, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int engram__cuda_enter(const engram_cuda_ctx *c, engram__cuda_scope *s)
{
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t e = cudaGetDevice(&s->device);
    s->entered = 0;
    if (e != cudaSuccess)
        return engram__cuda_err(e, "cudaGetDevice");
    if (s->device != c->device && (e = cudaSetDevice(c->device)) != cudaSuccess)
        return engram__cuda_err(e, "cudaSetDevice(%d)", c->device);
    /* Relaxed capture mode for the calls in between: allocation,
     * registration and syncs of the context's own stream would otherwise
     * invalidate a capture in progress on another stream (a torch graph
     * being recorded), as they would from the caller's thread in global
     * mode.  PyTorch's allocator does the same around its cudaMalloc. */
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    s->mode = (int)mode;
    s->entered = 1;
    return 0;
}

void engram__cuda_leave(const engram_cuda_ctx *c, const engram__cuda_scope *s)
{
    enum cudaStreamCaptureMode mode;
    if (!s->entered)
        return;
    mode = (enum cudaStreamCaptureMode)s->mode;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (s->device != c->device)
        (void)cudaSetDevice(s->device);
}

int engram__cuda_host_error(void *ud, int code, const char *msg)
{
    engram_cuda_ctx *c = ud;
    pthread_mutex_lock(&c->err_lock);
    if (!c->host_err) {
        c->host_err = code;
        snprintf(c->host_msg, sizeof c->host_msg, "%s", msg);
    }
    pthread_mutex_unlock(&c->err_lock);
    return code;
}

int engram_cuda_warmup(engram_cuda_ctx *c)
{
    engram__cuda_scope prev;
    int err;
    cudaError_t e;
    if (!c)
        return engram__cuda_fail(-EINVAL, "engram_cuda_warmup: ctx is NULL");
    if (atomic_load_explicit(&c->warm, memory_order_acquire))
        return 0; /* loaded kernels stay loaded */
    if ((err = engram__cuda_enter(c, &prev)) != 0)
        return err;
    if ((e = engram__cuda_preload(c->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->stream)) != cudaSuccess)
        err = engram__cuda_err(e, "loading the engram kernels on device %d", c->device);
    else
        atomic_store_explicit(&c->warm, 1, memory_order_release);
    engram__cuda_leave(c, &prev);
    return err;
}

int engram_cuda_open(engram_store *st, const engram_cuda_options *opts, engram_cuda_ctx **out)
{
    engram_cuda_options o = ENGRAM_CUDA_OPTIONS_INIT;
    engram_cuda_ctx *c = NULL;
    engram__cuda_scope prev;
    int n = 0, cur = -1, err, threads = 0;
    cudaError_t e;

    if (!st || !out)
        return engram__cuda_fail(-EINVAL, "engram_cuda_open: store and out are required");
    *out = NULL;
    /* Every later call reaches libengram through this table (its error
     * function is in every version of it: fields are only appended). */
    if (!engram__internal_ok(engram_internal_v1()))
        return engram__cuda_fail(-ENOTSUP, "this libengram_cuda needs libengram's internal "
                                           "interface of %zu bytes, but the libengram loaded has "
                                           "%u: use the two libraries of one build",
                                 sizeof(engram__internal), engram_internal_v1()->size);
    if (opts) {
        if (opts->size != sizeof o)
            return engram__cuda_fail(-EINVAL, "engram_cuda_options.size is %u, expected %zu",
                                     opts->size, sizeof o);
        o = *opts;
    }
    if ((e = cudaGetDeviceCount(&n)) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return engram__cuda_fail(-ENODEV, "no CUDA device: %s",
                                 e != cudaSuccess ? cudaGetErrorString(e)
                                                  : "the driver reports none");
    }
    if (o.device < -1)
        return engram__cuda_fail(
            -EINVAL, "engram_cuda_options.device is %d (-1 = the current device)", o.device);
    if (o.device >= n)
        return engram__cuda_fail(-ENODEV, "CUDA device %d does not exist (%d devices)", o.device,
                                 n);
    if (!(c = calloc(1, sizeof *c)))
        return engram__cuda_fail(-ENOMEM, "out of memory");
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->err_lock, NULL);
    pthread_mutex_init(&c->check_lock, NULL);
    engram__cuda_plancache_init(&c->plancache);
    c->st = st;
    c->flags = o.flags;
    if ((e = cudaGetDevice(&cur)) != cudaSuccess) {
        err = engram__cuda_err(e, "cudaGetDevice");
        goto fail_early;
    }
    c->device = o.device < 0 ? cur : o.device;
    if ((err = engram__cuda_enter(c, &prev)) != 0)
        goto fail_early;
    if ((e = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, c->device)) != 0 ||
        (e = cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor,
                                    c->device)) != 0) {
        err = engram__cuda_err(e, "querying device %d", c->device);
        goto fail;
    }
    c->max_blocks = (unsigned)c->sms * (unsigned)(threads >= 256 ? threads / 256 : 1);
    c->background_sms = o.background_sms > 0 ? (unsigned)o.background_sms
                                             : (unsigned)(c->sms >= 4 ? c->sms / 4 : 1);
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        err = engram__cuda_err(e, "cudaStreamCreateWithFlags");
        goto fail;
    }
    if ((e = cudaMalloc((void **)&c->bad, 2 * sizeof *c->bad)) != cudaSuccess) {
        err = engram__cuda_err(e, "cudaMalloc of the bad-id report");
        goto fail;
    }
    c->bad_snap = c->bad + 1;
    if ((e = engram__cuda_preload(c->stream)) != cudaSuccess) {
        err = engram__cuda_err(e, "loading the engram kernels on device %d", c->device);
        goto fail;
    }
    if ((e = engram__cuda_launch_init_bad(c->bad, c->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
        err = engram__cuda_err(e, "initialising the bad-id report");
        goto fail;
    }
    atomic_store_explicit(&c->warm, 1, memory_order_release);
    engram__cuda_leave(c, &prev);
    *out = c;
    return 0;
fail:
    engram__cuda_leave(c, &prev);
    engram_cuda_close(c);
    return err;
fail_early:
    engram__cuda_plancache_fini(&c->plancache);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->err_lock);
    pthread_mutex_destroy(&c->check_lock);
    free(c);
    return err;
}

/* ------------------------------------------------------------------------
 * Registration.
 */

/* Takes a reference on a registration covering [p, p + n), registering
 * the page-rounded range when none does. */
static cudaError_t reg_acquire(const void *p, size_t n, engram__cuda_reg **out)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    engram__cuda_reg *r;
    cudaError_t e;

    pthread_mutex_lock(&reg_lock);
    for (r = regs; r; r = r->next) {
        if (r->addr <= a && end <= r->addr + r->len) {
            r->refs++;
            *out = r;
            pthread_mutex_unlock(&reg_lock);
            return cudaSuccess;
        }
    }
    /* Table mappings are read-only: pinning them needs the read-only
     * flag.  Without driver support for it, writable memory (bound caller
     * memory) can still be registered plainly. */
    e = cudaHostRegister((void *)a, end - a,
                         cudaHostRegisterMapped | cudaHostRegisterPortable |
                             cudaHostRegisterReadOnly);
    if (e != cudaSuccess && e != cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        if (cudaHostRegister((void *)a, end - a,
                             cudaHostRegisterMapped | cudaHostRegisterPortable) == cudaSuccess)
            e = cudaSuccess;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        pthread_mutex_unlock(&reg_lock);
        return e;
    }
    if (!(r = malloc(sizeof *r))) {
        (void)cudaHostUnregister((void *)a);
        pthread_mutex_unlock(&reg_lock);
        return cudaErrorMemoryAllocation;
    }
    r->addr = a;
    r->len = end - a;
    r->refs = 1;
    r->next = regs;
    regs = r;
    *out = r;
    pthread_mutex_unlock(&reg_lock);
    return cudaSuccess;
}

static void reg_release(engram__cuda_reg *r)
{
    engram__cuda_reg **pp;
    pthread_mutex_lock(&reg_lock);
    if (--r->refs == 0) {
        for (pp = &regs; *pp != r; pp = &(*pp)->next)
            ;
        *pp = r->next;
        (void)cudaHostUnregister((void *)r->addr);
        free(r);
    }
    pthread_mutex_unlock(&reg_lock);
}

/* MemAvailable of /proc/meminfo in bytes, or 0 if it cannot be read. */
static uint64_t mem_available(void)
{
    char line[128];
    unsigned long long kb = 0;
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* A pinned copy of the table's rows: anonymous memory, 2 MiB aligned and
 * advised for huge pages before the copy touches it (random rows over UVA
 * pay host TLB misses like the CPU does), then registered; cudaHostAlloc
 * where that fails.  `why` is why the table was not registered in place
 * (cudaErrorNotSupported under ENGRAM_CUDA_COPY_TABLES).  A copy that
 * would take more than half of the memory available is refused: a table
 * too big to register (most often for a low memlock limit) is too big to
 * pin twice, and trying would push the host into swap or the OOM killer. */
static int make_copy(engram__cuda_table *t, engram_table_id id, cudaError_t why)
{
    size_t len = (t->bytes + HUGE_SZ - 1) & ~(HUGE_SZ - 1), span = len + HUGE_SZ;
    uint64_t avail = mem_available();
    unsigned char *raw, *p;
    cudaError_t e;

    if (avail && t->bytes > avail / 2)
        return engram__cuda_fail(
            -ENOMEM,
            "table %u: registering its %zu bytes in place failed (%s; is the "
            "memlock limit too low? see ulimit -l), and a pinned copy would take "
            "more than half of the %llu bytes available: refused",
            (unsigned)id, t->bytes, cudaGetErrorName(why), (unsigned long long)avail);

    raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw != MAP_FAILED) {
        p = (unsigned char *)(((uintptr_t)raw + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
        if (p > raw)
            munmap(raw, (size_t)(p - raw));
        if (raw + span > p + len)
            munmap(p + len, (size_t)(raw + span - (p + len)));
        (void)madvise(p, len, MADV_HUGEPAGE);
        memcpy(p, t->host, t->bytes);
        if (cudaHostRegister(p, len, cudaHostRegisterMapped | cudaHostRegisterPortable) ==
            cudaSuccess) {
            t->copy = p;
            t->copy_len = len;
            t->copy_huge = 1;
            return 0;
        }
        (void)cudaGetLastError();
        munmap(p, len);
    }
    if ((e = cudaHostAlloc((void **)&p, t->bytes, cudaHostAllocMapped | cudaHostAllocPortable)) !=
        cudaSuccess)
        return engram__cuda_err(e, "table %u: registering its %zu bytes failed (%s) and so did a "
                                   "pinned copy (cudaHostAlloc)",
                                (unsigned)id, t->bytes, cudaGetErrorName(why));
    memcpy(p, t->host, t->bytes);
    t->copy = p;
    t->copy_len = t->bytes;
    t->copy_huge = 0;
    return 0;
}

static void table_release(engram__cuda_table *t)
{
    if (t->reg)
        reg_release(t->reg);
    if (t->copy) {
        if (t->copy_huge) {
            (void)cudaHostUnregister(t->copy);
            munmap(t->copy, t->copy_len);
        } else {
            (void)cudaFreeHost(t->copy);
        }
    }
    memset(t, 0, sizeof *t);
}

int engram__cuda_register_locked(engram_cuda_ctx *c, engram_table_id id, engram__cuda_table **out)
{
    engram__cuda_table *t;
    const void *base = NULL;
    engram_table_spec spec;
    cudaError_t e = cudaErrorNotSupported;
    int err;

    /* Ask the store first: an id it never issued must not grow the array. */
    err = engram_internal_v1()->table_memory(c->st, id, &base, &spec);
    if (err && err != -ENOTSUP)
        return err;
    if (id >= c->ntables) {
        size_t n = c->ntables ? c->ntables : 16;
        engram__cuda_table *v;
        while (n <= id)
            n *= 2;
        if (!(v = realloc(c->tables, n * sizeof *v)))
            return engram__cuda_fail(-ENOMEM, "out of memory");
        memset(v + c->ntables, 0, (n - c->ntables) * sizeof *v);
        c->tables = v;
        c->ntables = n;
    }
    t = &c->tables[id];
    if (out)
        *out = t;
    if (t->mode != ENGRAM_CUDA_TABLE_NONE)
        return 0;
    if (err == -ENOTSUP) {
        t->spec = spec;
        t->mode = ENGRAM_CUDA_TABLE_HOST;
        return 0;
    }
    t->spec = spec;
    t->host = base;
    t->bytes = (size_t)(spec.num_rows - 1) * spec.row_pitch + spec.row_bytes;
    if (!(c->flags & ENGRAM_CUDA_COPY_TABLES)) {
        e = reg_acquire(base, t->bytes, &t->reg);
        if (e == cudaSuccess) {
            void *d;
            if ((e = cudaHostGetDevicePointer(&d, (void *)(uintptr_t)base, 0)) == cudaSuccess) {
                t->dev = d;
                t->mode = ENGRAM_CUDA_TABLE_MAPPED;
                return 0;
            }
            (void)cudaGetLastError();
            reg_release(t->reg);
            t->reg = NULL;
        }
    }
    if ((err = make_copy(t, id, e)) != 0) {
        memset(t, 0, sizeof *t);
        return err;
    }
    {
        void *d;
        if ((e = cudaHostGetDevicePointer(&d, t->copy, 0)) != cudaSuccess) {
            err = engram__cuda_err(e, "table %u: device address of its pinned copy", (unsigned)id);
            table_release(t);
            return err;
        }
        t->dev = d;
    }
    t->mode = ENGRAM_CUDA_TABLE_COPY;
    return 0;
}

int engram_cuda_register(engram_cuda_ctx *c, engram_table_id id)
{
    engram__cuda_scope prev;
    int err;
    if (!c)
        return engram__cuda_fail(-EINVAL, "engram_cuda_register: ctx is NULL");
    if ((err = engram__cuda_enter(c, &prev)) != 0)
        return err;
    pthread_mutex_lock(&c->lock);
    err = engram__cuda_register_locked(c, id, NULL);
    pthread_mutex_unlock(&c->lock);
    engram__cuda_leave(c, &prev);
    return err;
}

int engram_cuda_unregister(engram_cuda_ctx *c, engram_table_id id)
{
    engram__cuda_scope prev;
    int err = 0;
    engram__cuda_table *t;
    if (!c)
        return engram__cuda_fail(-EINVAL, "engram_cuda_unregister: ctx is NULL");
    if ((err = engram__cuda_enter(c, &prev)) != 0)
        return err;
    pthread_mutex_lock(&c->lock);
    t = id < c->ntables ? &c->tables[id] : NULL;
    if (!t || t->mode == ENGRAM_CUDA_TABLE_NONE)
        err = engram__cuda_fail(-ENOENT, "table %u is not registered with this CUDA context",
                                (unsigned)id);
    else if (t->plans)
        err = engram__cuda_fail(ENGRAM_ESTATE, "table %u is read by %u plan column(s): destroy the "
                                               "plans first", (unsigned)id, t->plans);
    else
        table_release(t);
    pthread_mutex_unlock(&c->lock);
    engram__cuda_leave(c, &prev);
    return err;
}

int engram_cuda_table_mode(engram_cuda_ctx *c, engram_table_id id)
{
    int mode;
    if (!c)
        return engram__cuda_fail(-EINVAL, "engram_cuda_table_mode: ctx is NULL");
    pthread_mutex_lock(&c->lock);
    mode = id < c->ntables ? c->tables[id].mode : ENGRAM_CUDA_TABLE_NONE;
    pthread_mutex_unlock(&c->lock);
    return mode;
}

void engram_cuda_close(engram_cuda_ctx *c)
{
    engram__cuda_scope prev;
    if (!c)
        return;
    (void)engram__cuda_enter(c, &prev); /* close anyway: frees still free */
    engram__cuda_plancache_fini(&c->plancache); /* its plans are in c->plans, freed below */
    pthread_mutex_lock(&c->lock);
    while (c->plans)
        engram__cuda_plan_free_locked(c->plans);
    for (size_t i = 0; i < c->ntables; i++)
        table_release(&c->tables[i]);
    pthread_mutex_unlock(&c->lock);
    free(c->tables);
    if (c->bad)
        (void)cudaFree(c->bad);
    if (c->stream)
        (void)cudaStreamDestroy(c->stream);
    engram__cuda_leave(c, &prev);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->err_lock);
    pthread_mutex_destroy(&c->check_lock);
    free(c);
}

/* ------------------------------------------------------------------------
 * Reports and stats.
 */

int engram_cuda_check(engram_cuda_ctx *c, engram_cuda_report *r)
{
    engram__cuda_bad snap;
    cudaError_t e;
    engram__cuda_scope prev;
    int err, host_err;
    char host_msg[sizeof c->host_msg];

    if (!c || (r && r->size != sizeof *r))
        return engram__cuda_fail(-EINVAL, "engram_cuda_check: ctx (and report->size = "
                                          "sizeof(engram_cuda_report)) required");
    if ((err = engram__cuda_enter(c, &prev)) != 0)
        return err;
    /* One check at a time: the take and the copy of bad_snap must not
     * interleave with another thread's (see check_lock). */
    pthread_mutex_lock(&c->check_lock);
    if ((e = engram__cuda_launch_take_bad(c->bad, c->bad_snap, c->stream)) != cudaSuccess ||
        (e = cudaMemcpyAsync(&snap, c->bad_snap, sizeof snap, cudaMemcpyDeviceToHost,
                             c->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
        pthread_mutex_unlock(&c->check_lock);
        err = engram__cuda_err(e, "reading the bad-id report");
        engram__cuda_leave(c, &prev);
        return err;
    }
    pthread_mutex_unlock(&c->check_lock);
    engram__cuda_leave(c, &prev);
    pthread_mutex_lock(&c->err_lock);
    host_err = c->host_err;
    memcpy(host_msg, c->host_msg, sizeof host_msg);
    c->host_err = 0;
    c->host_msg[0] = 0;
    pthread_mutex_unlock(&c->err_lock);

    if (r) {
        uint32_t size = r->size;
        memset(r, 0, sizeof *r);
        r->size = size;
        r->bad_ids = snap.count;
        r->host_error = host_err;
        if (snap.key != ENGRAM__CUDA_NO_BAD) {
            r->first_token = snap.key >> ENGRAM__CUDA_COL_BITS;
            r->first_col = (uint32_t)(snap.key & ((1u << ENGRAM__CUDA_COL_BITS) - 1));
            r->first_id = snap.value;
            r->first_table = snap.table;
        }
    }
    /* A check racing with a lookup may take a count whose key lands in the
     * next check, or the reverse: either is reported. */
    if (snap.count && snap.key == ENGRAM__CUDA_NO_BAD) {
        if (r)
            r->first_col = ENGRAM_CUDA_NO_FIRST;
        return engram__cuda_fail(ENGRAM_EBADID, "%llu bad id(s) skipped by GPU lookups (the first "
                                                "is reported by the next check)", snap.count);
    }
    if (snap.key != ENGRAM__CUDA_NO_BAD) {
        unsigned long long nrows = 0;
        pthread_mutex_lock(&c->lock);
        if (snap.table < c->ntables)
            nrows = (unsigned long long)c->tables[snap.table].spec.num_rows;
        pthread_mutex_unlock(&c->lock);
        return engram__cuda_fail(
            ENGRAM_EBADID,
            "%llu bad id(s) skipped by GPU lookups; the first: ids[%llu][%u] = %lld "
            "is outside table %u (%llu rows) after its column's offset",
            snap.count, snap.key >> ENGRAM__CUDA_COL_BITS,
            (unsigned)(snap.key & ((1u << ENGRAM__CUDA_COL_BITS) - 1)), snap.value, snap.table,
            nrows);
    }
    if (host_err)
        return engram__cuda_fail(host_err, "a host-path gather failed: %s", host_msg);
    return 0;
}

int engram_cuda_get_stats(engram_cuda_ctx *c, engram_cuda_stats *s)
{
    if (!c || !s || s->size != sizeof *s)
        return engram__cuda_fail(-EINVAL, "engram_cuda_get_stats: ctx and stats (with size = "
                                          "sizeof(engram_cuda_stats)) are required");
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    s->device = c->device;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->ntables; i++) {
        const engram__cuda_table *t = &c->tables[i];
        if (t->mode == ENGRAM_CUDA_TABLE_MAPPED) {
            s->tables_mapped++;
            s->mapped_bytes += t->bytes;
        } else if (t->mode == ENGRAM_CUDA_TABLE_COPY) {
            s->tables_copied++;
            s->copied_bytes += t->bytes;
            s->copy_huge += (uint64_t)t->copy_huge;
        } else if (t->mode == ENGRAM_CUDA_TABLE_HOST) {
            s->tables_host++;
        }
    }
    s->plans = c->nplans;
    pthread_mutex_unlock(&c->lock);
    s->lookups = atomic_load_explicit(&c->lookups, memory_order_relaxed);
    s->host_gathers = atomic_load_explicit(&c->host_gathers, memory_order_relaxed);
    return 0;
}
