/*
 * emu_runtime.cpp - the part of the CUDA runtime API that libengram_cuda
 * and tests/test_cuda.cu use, emulated on the host for test_cuda_emu.
 *
 * The point is to run the real host code (cuda/ctx.c, plan.c, hostpath.c),
 * the real kernels (cuda/kernels.cu, see emu_device.h) and the real GPU
 * test on machines without a GPU, under ASan, and to be less forgiving
 * than a GPU where ordering is concerned:
 *
 *  - Work is deferred.  Each stream is a queue that runs only when
 *    something waits for it (cudaStreamSynchronize, an event wait, a
 *    synchronous call), so a missing wait shows as stale data, however
 *    fast a real GPU would have been.  Synchronous calls (cudaMemcpy,
 *    cudaMemset) order with the legacy stream and the blocking streams
 *    only, as on a GPU: a stream created cudaStreamNonBlocking is not
 *    waited for.  cudaMemset, and cudaMemcpy from pageable host memory
 *    to the device, return before their bytes land, as documented.
 *  - Stream capture records work into a graph instead of queueing it.  The
 *    calls a capture forbids (allocation, registration, synchronous copies
 *    and syncs, pageable async copies) fail with
 *    cudaErrorStreamCaptureUnsupported where the capture modes say so
 *    (global, thread-local or relaxed, per capture and per thread), and
 *    invalidate the capture: cudaStreamEndCapture then fails with
 *    cudaErrorStreamCaptureInvalidated.
 *  - A host function (cudaLaunchHostFunc) must not call the runtime: any
 *    call made from one aborts.
 *  - Any call that can fail on a GPU can be made to fail on demand
 *    (emu_fail_nth_call(), emu_fail_host_register()), so that every error
 *    path of the library runs; emu_live_objects() counts what is alive.
 *  - Copies and kernel loads must use device-visible memory: cudaMalloc,
 *    cudaHostAlloc/cudaMallocHost, or a cudaHostRegister'ed range; a bad
 *    pointer aborts with a message.  cudaHostRegister refuses ranges that
 *    overlap a registered one, like the driver.
 *
 * The device pointer of host memory is the host pointer (UVA).  There is
 * one device with 4 SMs of 2048 threads, so grids stay small, or
 * ENGRAM_EMU_DEVICES of them: each thread has a current device, memory
 * from cudaMalloc belongs to the device current then, and a kernel that
 * loads another device's memory aborts (on a GPU without peer access, a
 * fault that poisons the context).  Threads of a kernel run one after
 * another, so nothing here finds a data race.
 */
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

typedef std::function<void()> op;

struct CUgraph_st {
    std::vector<op> ops;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal; /* while capturing */
    std::thread::id owner;                                    /* the capturing thread */
    bool invalidated = false;
};
struct CUgraphExec_st {
    std::vector<op> ops;
};
struct CUstream_st {
    std::deque<op> q;
    size_t done = 0, queued = 0; /* ops run / ever queued */
    bool blocking = true;        /* orders with the legacy stream */
    CUgraph_st *capture = nullptr;
};
struct CUevent_st {
    CUstream_st *s = nullptr;
    size_t at = 0;              /* s->queued when recorded */
    std::shared_ptr<double> ms; /* host clock when the record ran, or < 0 */
};

namespace {

CUstream_st legacy;
std::set<CUstream_st *> streams = {&legacy};
std::recursive_mutex mu; /* one runtime call at a time */
int capturing;           /* streams in capture */
thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;
int in_host_fn;
cudaError_t last_error;
std::map<uintptr_t, size_t> dev_mem, pinned_mem, registered;
std::map<uintptr_t, int> dev_mem_device; /* the device of each dev_mem block */
thread_local int current_device;
int running_device = -1; /* the device of the kernel being run, or -1 */
int fail_register;       /* emu_fail_host_register() */
long fail_countdown;     /* emu_fail_nth_call(): > 0 counts failable calls down */
int fail_happened;
long live_events;

/* A call that can fail on a GPU: it fails with `err` when it is the one
 * emu_fail_nth_call() armed. */
#define FAILABLE(err)                                                                  \
    do {                                                                               \
        if (fail_countdown > 0 && --fail_countdown == 0) {                             \
            fail_happened = 1;                                                         \
            return fail(err);                                                          \
        }                                                                              \
    } while (0)

int devices()
{
    static int n = getenv("ENGRAM_EMU_DEVICES") ? atoi(getenv("ENGRAM_EMU_DEVICES")) : 1;
    return n > 0 ? n : 1;
}


/* Every entry point takes the lock and refuses calls from host functions. */
struct api_call {
    std::lock_guard<std::recursive_mutex> g;
    explicit api_call(const char *name) : g(mu)
    {
        if (in_host_fn) {
            fprintf(stderr, "emu: %s called from a host function (cudaLaunchHostFunc)\n", name);
            abort();
        }
    }
};
#define API(name) api_call api_call_(name)

cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

CUstream_st *S(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return &legacy;
    CUstream_st *st = reinterpret_cast<CUstream_st *>(s);
    if (!streams.count(st)) {
        fprintf(stderr, "emu: unknown stream %p\n", static_cast<void *>(s));
        abort();
    }
    return st;
}

/* Runs s's queued work until `upto` ops of it have run. */
void drain(CUstream_st *s, size_t upto)
{
    while (s->done < upto && !s->q.empty()) {
        op f = std::move(s->q.front());
        s->q.pop_front();
        s->done++;
        f();
    }
}

/* What a synchronous call waits for: the legacy stream, which itself
 * waits for every blocking stream. */
void drain_sync()
{
    for (CUstream_st *s : streams)
        if (s->blocking)
            drain(s, SIZE_MAX);
}

void drain_device()
{
    bool more = true;
    while (more) { /* event waits may queue nothing new, but be thorough */
        more = false;
        for (CUstream_st *s : streams) {
            if (!s->q.empty())
                more = true;
            drain(s, SIZE_MAX);
        }
    }
}

/* The rule of cudaThreadExchangeStreamCaptureMode(): in global mode a
 * thread may not make potentially unsafe calls while it captures (unless
 * that capture began relaxed) or while any thread captures in global
 * mode; in thread-local mode only its own captures count; in relaxed mode
 * nothing does.  A prohibited call fails and invalidates those captures
 * (cudaStreamEndCapture then fails), as on a GPU. */
cudaError_t capture_forbidden(const char *what)
{
    bool hit = false;
    if (!capturing || thread_mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    for (CUstream_st *st : streams) {
        CUgraph_st *g = st->capture;
        if (!g || g->mode == cudaStreamCaptureModeRelaxed)
            continue;
        if (g->owner == std::this_thread::get_id() ||
            (g->mode == cudaStreamCaptureModeGlobal && thread_mode == cudaStreamCaptureModeGlobal)) {
            g->invalidated = true;
            hit = true;
        }
    }
    if (!hit)
        return cudaSuccess;
    fprintf(stderr, "emu: %s during stream capture\n", what);
    return fail(cudaErrorStreamCaptureUnsupported);
}

/* 1 if a blocking stream is being captured: the legacy stream, which
 * waits for blocking streams, cannot be used then. */
bool blocking_capture()
{
    bool hit = false;
    for (CUstream_st *st : streams)
        if (st->capture && st->blocking) {
            st->capture->invalidated = true;
            hit = true;
        }
    return hit;
}

cudaError_t enqueue(cudaStream_t s, op f)
{
    CUstream_st *st = S(s);
    if (st->capture) {
        st->capture->ops.push_back(std::move(f));
        return cudaSuccess;
    }
    if (st == &legacy && blocking_capture())
        return fail(cudaErrorStreamCaptureImplicit);
    st->q.push_back(std::move(f));
    st->queued++;
    return cudaSuccess;
}

bool within(const std::map<uintptr_t, size_t> &m, const void *p, size_t n)
{
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = m.upper_bound(a);
    if (it == m.begin())
        return false;
    --it;
    return a >= it->first && n <= it->second && a - it->first <= it->second - n;
}

bool host_visible(const void *p, size_t n)
{
    return within(pinned_mem, p, n) || within(registered, p, n);
}

bool visible(const void *p, size_t n)
{
    return within(dev_mem, p, n) || host_visible(p, n);
}

/* The device of the cudaMalloc block holding p, or -1. */
int device_of(const void *p)
{
    auto it = dev_mem_device.upper_bound(reinterpret_cast<uintptr_t>(p));
    if (it == dev_mem_device.begin() || !within(dev_mem, p, 1))
        return -1;
    return (--it)->second;
}

void need_visible(const void *p, size_t n, const char *what)
{
    if (n && !visible(p, n)) {
        fprintf(stderr, "emu: %s [%p, +%zu) is not device-visible memory\n", what, p, n);
        abort();
    }
}

/* Checks a copy's pointers; returns the error a capture gives it. */
cudaError_t copy_check(void *d, const void *s, size_t n, cudaMemcpyKind k, bool async,
                       cudaStream_t st = nullptr)
{
    bool dev_dst = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    bool dev_src = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if (k == cudaMemcpyDefault || k == cudaMemcpyHostToHost) {
        fprintf(stderr, "emu: copy kind %d not emulated\n", (int)k);
        abort();
    }
    if (dev_dst)
        need_visible(d, n, "copy destination");
    if (dev_src)
        need_visible(s, n, "copy source");
    if (async && capturing) {
        const void *h = !dev_src ? s : !dev_dst ? d : nullptr;
        if (h && !host_visible(h, n)) {
            /* Pageable copies may synchronise: not in a capture, and
             * unsafe while one is going on. */
            if (CUgraph_st *g = S(st)->capture) {
                fprintf(stderr, "emu: captured copy with pageable host memory\n");
                g->invalidated = true;
                return fail(cudaErrorStreamCaptureUnsupported);
            }
            return capture_forbidden("a pageable cudaMemcpyAsync");
        }
    }
    return cudaSuccess;
}

void *exact_alloc(size_t n, size_t align)
{
    void *p = nullptr;
    if (posix_memalign(&p, align, n ? n : 1) != 0)
        return nullptr;
    return p;
}

/* A step in [1, n) coprime with n (1 for n < 3): i * step mod n then
 * visits every value once. */
unsigned coprime_step(unsigned n, uint64_t r)
{
    if (n < 3)
        return 1;
    for (unsigned s = 1 + (unsigned)(r % (n - 1));; s = s % (n - 1) + 1) {
        unsigned a = n, b = s;
        while (b) {
            unsigned t = a % b;
            a = b;
            b = t;
        }
        if (a == 1)
            return s;
    }
}

} // namespace

bool emu_device_visible(const void *p, size_t n)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    int d;
    if (!visible(p, n))
        return false;
    if (running_device >= 0 && (d = device_of(p)) >= 0 && d != running_device) {
        fprintf(stderr, "emu: a kernel on device %d loads memory of device %d\n", running_device,
                d);
        abort();
    }
    return true;
}

cudaError_t emu_enqueue_kernel(cudaStream_t s, unsigned grid, unsigned block,
                               void (*body)(void *), void *arg, void (*del)(void *))
{
    API("a kernel launch");
    std::shared_ptr<void> keep(arg, del); /* owned from here, launched or not */
    FAILABLE(cudaErrorLaunchOutOfResources);
    int dev = current_device;
    return enqueue(s, [=]() {
        /* A GPU runs blocks in no set order: take them, and the threads
         * of each, in a pseudo-random order (xorshift, fixed seed). */
        static uint64_t rng = 0x9E3779B97F4A7C15ull;
        unsigned b0 = (unsigned)(rng % grid), bstep = coprime_step(grid, rng >> 20);
        unsigned t0 = (unsigned)((rng >> 8) % block), tstep = coprime_step(block, rng >> 40);
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        gridDim = dim3(grid);
        blockDim = dim3(block);
        running_device = dev;
        for (unsigned i = 0; i < grid; i++)
            for (unsigned j = 0; j < block; j++) {
                blockIdx = uint3{(unsigned)((b0 + (uint64_t)i * bstep) % grid), 0, 0};
                threadIdx = uint3{(unsigned)((t0 + (uint64_t)j * tstep) % block), 0, 0};
                body(keep.get());
            }
        running_device = -1;
    });
}

extern "C" {

cudaError_t cudaGetDeviceCount(int *n)
{
    API("cudaGetDeviceCount");
    FAILABLE(cudaErrorInsufficientDriver);
    *n = devices();
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    API("cudaGetDevice");
    FAILABLE(cudaErrorInsufficientDriver);
    *d = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    API("cudaSetDevice");
    FAILABLE(cudaErrorInvalidDevice);
    if (d < 0 || d >= devices())
        return fail(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p)
{
    API("cudaPointerGetAttributes");
    memset(a, 0, sizeof *a);
    a->device = -1;
    if (within(dev_mem, p, 1)) {
        a->type = cudaMemoryTypeDevice;
        a->device = device_of(p);
        a->devicePointer = const_cast<void *>(p);
    } else if (host_visible(p, 1)) {
        a->type = cudaMemoryTypeHost;
        a->devicePointer = a->hostPointer = const_cast<void *>(p);
    } else {
        a->type = cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d)
{
    API("cudaDeviceGetAttribute");
    FAILABLE(cudaErrorInvalidDevice);
    if (d < 0 || d >= devices())
        return fail(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = 4; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
    default:
        fprintf(stderr, "emu: device attribute %d not emulated\n", (int)a);
        abort();
    }
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    API("cudaGetDeviceProperties");
    FAILABLE(cudaErrorInvalidDevice);
    if (d < 0 || d >= devices())
        return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation (tests/cuda_emu)");
    p->multiProcessorCount = 4;
    p->maxThreadsPerMultiProcessor = 2048;
    return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *fa, const void *f)
{
    API("cudaFuncGetAttributes");
    FAILABLE(cudaErrorInvalidDeviceFunction);
    memset(fa, 0, sizeof *fa);
    return f ? cudaSuccess : fail(cudaErrorInvalidDeviceFunction);
}

cudaError_t cudaGetLastError(void)
{
    API("cudaGetLastError");
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    API("cudaPeekAtLastError");
    return last_error;
}

const char *cudaGetErrorName(cudaError_t e)
{
    static thread_local char b[48];
    snprintf(b, sizeof b, "cudaError %d", (int)e);
    return e == cudaSuccess ? "cudaSuccess" : b;
}

const char *cudaGetErrorString(cudaError_t e)
{
    return cudaGetErrorName(e);
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    API("cudaMalloc");
    FAILABLE(cudaErrorMemoryAllocation);
    if (cudaError_t e = capture_forbidden("cudaMalloc"))
        return e;
    if (!(*p = exact_alloc(n, 256)))
        return fail(cudaErrorMemoryAllocation);
    memset(*p, 0xA5, n); /* device memory starts with garbage, not zeros */
    dev_mem[reinterpret_cast<uintptr_t>(*p)] = n;
    dev_mem_device[reinterpret_cast<uintptr_t>(*p)] = current_device;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    API("cudaFree");
    if (cudaError_t e = capture_forbidden("cudaFree"))
        return e;
    drain_device(); /* cudaFree synchronises the device */
    if (!p)
        return cudaSuccess;
    dev_mem_device.erase(reinterpret_cast<uintptr_t>(p));
    if (!dev_mem.erase(reinterpret_cast<uintptr_t>(p))) {
        fprintf(stderr, "emu: cudaFree(%p): not a cudaMalloc block\n", p);
        abort();
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    API("cudaHostAlloc");
    FAILABLE(cudaErrorMemoryAllocation);
    (void)flags;
    if (cudaError_t e = capture_forbidden("cudaHostAlloc"))
        return e;
    if (!(*p = exact_alloc(n, 4096)))
        return fail(cudaErrorMemoryAllocation);
    pinned_mem[reinterpret_cast<uintptr_t>(*p)] = n;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    return cudaHostAlloc(p, n, 0);
}

cudaError_t cudaFreeHost(void *p)
{
    API("cudaFreeHost");
    if (cudaError_t e = capture_forbidden("cudaFreeHost"))
        return e;
    drain_device();
    if (!p)
        return cudaSuccess;
    if (!pinned_mem.erase(reinterpret_cast<uintptr_t>(p))) {
        fprintf(stderr, "emu: cudaFreeHost(%p): not a cudaHostAlloc block\n", p);
        abort();
    }
    free(p);
    return cudaSuccess;
}

void emu_fail_nth_call(long n)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    fail_countdown = n;
    fail_happened = 0;
}

int emu_failed(void)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    return fail_happened;
}

long emu_live_objects(void)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    return (long)(dev_mem.size() + pinned_mem.size() + registered.size() + streams.size() - 1) +
           live_events;
}

void emu_fail_host_register(int on)
{
    std::lock_guard<std::recursive_mutex> g(mu);
    fail_register = on;
}

cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags)
{
    API("cudaHostRegister");
    FAILABLE(cudaErrorMemoryAllocation);
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    (void)flags;
    if (cudaError_t e = capture_forbidden("cudaHostRegister"))
        return e;
    if (fail_register)
        return fail(cudaErrorMemoryAllocation);
    if (n == 0)
        return fail(cudaErrorInvalidValue);
    for (auto &r : registered)
        if (a < r.first + r.second && r.first < a + n)
            return fail(cudaErrorHostMemoryAlreadyRegistered);
    registered[a] = n;
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p)
{
    API("cudaHostUnregister");
    if (cudaError_t e = capture_forbidden("cudaHostUnregister"))
        return e;
    drain_device();
    if (!registered.erase(reinterpret_cast<uintptr_t>(p)))
        return fail(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned flags)
{
    API("cudaHostGetDevicePointer");
    FAILABLE(cudaErrorInvalidValue);
    if (flags != 0 || !host_visible(h, 1))
        return fail(cudaErrorInvalidValue);
    *d = h;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    API("cudaStreamCreateWithFlags");
    FAILABLE(cudaErrorMemoryAllocation);
    CUstream_st *st = new CUstream_st;
    st->blocking = !(flags & cudaStreamNonBlocking);
    streams.insert(st);
    *s = reinterpret_cast<cudaStream_t>(st);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    API("cudaStreamDestroy");
    CUstream_st *st = S(s);
    if (st == &legacy || st->capture)
        return fail(cudaErrorInvalidResourceHandle);
    drain(st, SIZE_MAX); /* queued work still completes */
    streams.erase(st);
    delete st;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    API("cudaStreamSynchronize");
    FAILABLE(cudaErrorLaunchFailure);
    CUstream_st *st = S(s);
    if (st->capture) {
        st->capture->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (cudaError_t e = capture_forbidden("cudaStreamSynchronize"))
        return e;
    if (st == &legacy)
        drain_sync();
    else
        drain(st, SIZE_MAX);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    API("cudaDeviceSynchronize");
    FAILABLE(cudaErrorLaunchFailure);
    if (cudaError_t e = capture_forbidden("cudaDeviceSynchronize"))
        return e;
    drain_device();
    return cudaSuccess;
}

/* As documented ("API synchronization behavior"): a copy from pageable
 * host memory to the device waits for the legacy stream, stages the bytes
 * and returns before they land (here: when the legacy stream next runs);
 * one from pinned memory, or to the host, is complete on return; one
 * between device buffers does not synchronise with the host at all. */
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k)
{
    API("cudaMemcpy");
    FAILABLE(cudaErrorInvalidValue);
    if (cudaError_t e = capture_forbidden("cudaMemcpy"))
        return e;
    copy_check(d, s, n, k, false);
    if (k == cudaMemcpyDeviceToDevice)
        return enqueue(nullptr, [=]() { memcpy(d, s, n); });
    drain_sync();
    if (k == cudaMemcpyHostToDevice && !host_visible(s, n)) {
        std::shared_ptr<std::vector<char>> staged =
            std::make_shared<std::vector<char>>((const char *)s, (const char *)s + n);
        return enqueue(nullptr, [=]() { memcpy(d, staged->data(), n); });
    }
    memcpy(d, s, n);
    return cudaSuccess;
}

/* As documented: pageable host memory is staged at once on the way to
 * the device (the caller may reuse it on return), and a copy to pageable
 * host memory completes before the call returns; with pinned memory both
 * run in stream order. */
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st)
{
    API("cudaMemcpyAsync");
    FAILABLE(cudaErrorInvalidValue);
    if (cudaError_t e = copy_check(d, s, n, k, true, st))
        return e;
    if (k == cudaMemcpyHostToDevice && !host_visible(s, n)) {
        std::shared_ptr<std::vector<char>> staged =
            std::make_shared<std::vector<char>>((const char *)s, (const char *)s + n);
        return enqueue(st, [=]() { memcpy(d, staged->data(), n); });
    }
    if (k == cudaMemcpyDeviceToHost && !host_visible(d, n) && !S(st)->capture) {
        drain(S(st), SIZE_MAX);
        memcpy(d, s, n);
        return cudaSuccess;
    }
    return enqueue(st, [=]() { memcpy(d, s, n); });
}

cudaError_t cudaMemset(void *d, int v, size_t n)
{
    API("cudaMemset");
    FAILABLE(cudaErrorInvalidValue);
    if (cudaError_t e = capture_forbidden("cudaMemset"))
        return e;
    need_visible(d, n, "cudaMemset destination");
    return enqueue(nullptr, [=]() { memset(d, v, n); });
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *ud)
{
    API("cudaLaunchHostFunc");
    FAILABLE(cudaErrorInvalidValue);
    return enqueue(s, [=]() {
        in_host_fn++;
        fn(ud);
        in_host_fn--;
    });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    API("cudaEventCreateWithFlags");
    FAILABLE(cudaErrorMemoryAllocation);
    (void)flags;
    *e = reinterpret_cast<cudaEvent_t>(new CUevent_st);
    live_events++;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    API("cudaEventDestroy");
    delete reinterpret_cast<CUevent_st *>(e);
    live_events--;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    API("cudaEventRecord");
    FAILABLE(cudaErrorInvalidValue);
    CUevent_st *ev = reinterpret_cast<CUevent_st *>(e);
    CUstream_st *st = S(s);
    if (st->capture) {
        fprintf(stderr, "emu: event record under capture not emulated\n");
        abort();
    }
    /* The record is an op of the stream: it stamps the time it runs at
     * (for cudaEventElapsedTime), and waiting for the event means running
     * the stream up to and including it. */
    std::shared_ptr<double> ms = std::make_shared<double>(-1.0);
    if (cudaError_t err = enqueue(s, [ms]() {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            *ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
        }))
        return err;
    ev->s = st;
    ev->at = st->queued;
    ev->ms = ms;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    API("cudaEventSynchronize");
    CUevent_st *ev = reinterpret_cast<CUevent_st *>(e);
    if (cudaError_t err = capture_forbidden("cudaEventSynchronize"))
        return err;
    if (ev->s)
        drain(ev->s, ev->at);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    API("cudaEventElapsedTime");
    CUevent_st *x = reinterpret_cast<CUevent_st *>(a), *y = reinterpret_cast<CUevent_st *>(b);
    if (!x->ms || !y->ms)
        return fail(cudaErrorInvalidResourceHandle);
    if (*x->ms < 0 || *y->ms < 0)
        return fail(cudaErrorNotReady);
    *ms = (float)(*y->ms - *x->ms);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    API("cudaStreamWaitEvent");
    FAILABLE(cudaErrorInvalidValue);
    CUevent_st *ev = reinterpret_cast<CUevent_st *>(e);
    CUstream_st *w = ev->s;
    size_t at = ev->at;
    (void)flags;
    if (!w)
        return cudaSuccess; /* never recorded: nothing to wait for */
    return enqueue(s, [=]() { drain(w, at); });
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status)
{
    API("cudaStreamIsCapturing");
    CUstream_st *st = S(s);
    if (st == &legacy) /* answers, but does not invalidate (as documented) */
        for (CUstream_st *b : streams)
            if (b->capture && b->blocking)
                return fail(cudaErrorStreamCaptureImplicit);
    *status = st->capture ? (st->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                                      : cudaStreamCaptureStatusActive)
                          : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    API("cudaStreamBeginCapture");
    CUstream_st *st = S(s);
    if (st == &legacy || st->capture)
        return fail(cudaErrorInvalidValue);
    st->capture = new CUgraph_st;
    st->capture->mode = mode;
    st->capture->owner = std::this_thread::get_id();
    capturing++;
    return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode)
{
    API("cudaThreadExchangeStreamCaptureMode");
    cudaStreamCaptureMode old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    API("cudaStreamEndCapture");
    CUstream_st *st = S(s);
    if (!st->capture)
        return fail(cudaErrorIllegalState);
    CUgraph_st *graph = st->capture;
    st->capture = nullptr;
    capturing--;
    if (graph->invalidated) {
        delete graph;
        *g = nullptr;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *g = reinterpret_cast<cudaGraph_t>(graph);
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *ge, cudaGraph_t g, unsigned long long flags)
{
    API("cudaGraphInstantiate");
    (void)flags;
    CUgraphExec_st *x = new CUgraphExec_st;
    x->ops = reinterpret_cast<CUgraph_st *>(g)->ops;
    *ge = reinterpret_cast<cudaGraphExec_t>(x);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t ge, cudaStream_t s)
{
    API("cudaGraphLaunch");
    for (const op &f : reinterpret_cast<CUgraphExec_st *>(ge)->ops)
        if (cudaError_t e = enqueue(s, f))
            return e;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t ge)
{
    API("cudaGraphExecDestroy");
    delete reinterpret_cast<CUgraphExec_st *>(ge);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    API("cudaGraphDestroy");
    delete reinterpret_cast<CUgraph_st *>(g);
    return cudaSuccess;
}

} /* extern "C" */

/* Registrations or allocations left at exit are leaks of the library. */
namespace {
struct exit_check {
    ~exit_check()
    {
        if (!registered.empty() || !dev_mem.empty() || !pinned_mem.empty()) {
            fprintf(stderr, "emu: left at exit: %zu registrations, %zu device and %zu pinned blocks\n",
                    registered.size(), dev_mem.size(), pinned_mem.size());
            _Exit(1);
        }
    }
} at_exit;
} // namespace
