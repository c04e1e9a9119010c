/*
 * kernels.cu - the gather and dequant kernels of libengram_cuda.
 *
 * Rows are read from host memory over UVA: every load is a PCIe (or C2C)
 * read with microseconds of latency, so throughput comes from many rows in
 * flight and wide loads.  A row is handled by `lanes` threads of one warp
 * (a power of two covering the row's chunks, 32 at most), so one warp
 * moves 1 to 32 rows at once and its loads of one row are contiguous:
 * each 16-byte (or narrower) lane load combines with its neighbours' into
 * full PCIe read requests, and the stores coalesce the same way.
 *
 * The load width is the widest power of two (up to 16) that divides every
 * column's base address and pitch; the store width the widest that also
 * divides the output address and strides.  Both are template parameters,
 * so each variant is straight-line code; the host picks the variant (see
 * plan.c).  A row's bytes beyond the last full chunk (the tail, e.g. 8 of
 * 264 with 16-byte chunks) are copied by one lane with narrower moves.
 * Exactly row_bytes bytes are written per row: never the pitch padding.
 *
 * Bad ids cannot raise from a kernel: the row is skipped, counted, and the
 * smallest (token, column) kept with its value in the context's report
 * (report_bad()).
 *
 * The grid is bounded (a grid-stride loop) by max_blocks: resident blocks
 * of the whole device normally, one block per SM of the background share
 * in background mode.
 */
#ifdef ENGRAM_CUDA_EMU
#include "emu_device.h" /* test_cuda_emu: the kernels run on the host (tests/cuda_emu) */
#else
#include <cuda_runtime.h>
#endif

#include <string.h>

#include "cuda_internal.h"
#include "dequant.h"
#include "ids.h"

namespace {

#ifndef ENGRAM_CUDA_EMU
/* Launches f with its arguments in args (pointers to each).  Every launch
 * goes through cudaLaunchKernel(), not <<<>>> and cudaGetLastError(): the
 * latter would also return (and clear) an earlier error of an unrelated
 * call on this thread and fail the lookup for it. */
template <class... P>
cudaError_t launch_kernel(void (*f)(P...), dim3 grid, dim3 block, void **args, cudaStream_t s)
{
    return cudaLaunchKernel(reinterpret_cast<const void *>(f), grid, block, args, 0, s);
}
#endif

/* Every plain store and load of a kernel goes through put() or seen():
 * on the GPU they are the bare access; on the host emulation they check
 * that the memory is device-visible and on the kernel's device. */
#ifdef ENGRAM_CUDA_EMU
#define DEVICE_ACCESS(p, n) emu_device_access(p, n)
#else
#define DEVICE_ACCESS(p, n) ((void)0)
#endif

template <class T> __device__ __forceinline__ void put(void *d, T v)
{
    DEVICE_ACCESS(d, sizeof(T));
    *reinterpret_cast<T *>(d) = v;
}

template <class T> __device__ __forceinline__ const T *seen(const T *p)
{
    DEVICE_ACCESS(p, sizeof(T));
    return p;
}

template <int W> struct vec;
template <> struct vec<16> { typedef uint4 t; };
template <> struct vec<8> { typedef uint2 t; };
template <> struct vec<4> { typedef unsigned int t; };
template <> struct vec<2> { typedef unsigned short t; };
template <> struct vec<1> { typedef unsigned char t; };

/* Loads W bytes through the read-only path: the tables never change while
 * a lookup runs. */
template <int W> __device__ __forceinline__ typename vec<W>::t load(const unsigned char *s)
{
    return __ldg(reinterpret_cast<const typename vec<W>::t *>(s));
}

/* Moves LW bytes: one LW-wide load, LW / SW stores of SW bytes. */
template <int LW, int SW> __device__ __forceinline__ void move(unsigned char *d,
                                                               const unsigned char *s)
{
    typedef typename vec<LW>::t L;
    typedef typename vec<SW>::t S;
    L v = load<LW>(s);
    if (SW == LW) {
        put(d, v);
    } else {
        const S *p = reinterpret_cast<const S *>(&v);
#pragma unroll
        for (int i = 0; i < LW / SW; i++)
            put(d + i * SW, p[i]);
    }
}

/* Copies n < 16 tail bytes with moves no wider than SW (the destination's
 * alignment); the source is at least as aligned at this point. */
template <int SW> __device__ __forceinline__ void copy_tail(unsigned char *d,
                                                           const unsigned char *s, unsigned n)
{
    unsigned o = 0;
    if (SW >= 8)
        for (; n - o >= 8; o += 8)
            move<8, 8>(d + o, s + o);
    if (SW >= 4)
        for (; n - o >= 4; o += 4)
            move<4, 4>(d + o, s + o);
    if (SW >= 2)
        for (; n - o >= 2; o += 2)
            move<2, 2>(d + o, s + o);
    for (; o < n; o++)
        put(d + o, __ldg(s + o));
}

template <int SW> __device__ __forceinline__ void zero_row(unsigned char *d, unsigned R,
                                                           unsigned sub, unsigned lanes)
{
    typedef typename vec<SW>::t S;
    unsigned n = R / SW;
    for (unsigned j = sub; j < n; j += lanes)
        put(d + j * SW, S());
    if (sub == lanes - 1)
        for (unsigned o = n * SW; o < R; o++)
            put(d + o, (unsigned char)0);
}

__device__ __forceinline__ long long load_id(const engram__cuda_launch &L, uint64_t t, uint32_t k)
{
    ptrdiff_t e = (ptrdiff_t)t * L.ist + (ptrdiff_t)k * L.isk;
    if (L.id64)
        return __ldg(static_cast<const long long *>(L.ids) + e);
    return __ldg(static_cast<const int *>(L.ids) + e);
}

/* Records bad id `raw` at (t, k).  Bad ids are rare, so a lock is fine.
 * The key (token, column) is compared and replaced together with its value
 * and table under the lock, so the three always belong together and the
 * smallest key wins whatever the order of arrival; take_bad_kernel reads
 * them under the same lock.  The unlocked read first filters out the
 * common case of a later bad id once an earlier one is known. */
__device__ void report_bad(engram__cuda_bad *b, uint64_t t, uint32_t k, long long raw,
                           uint32_t table)
{
    unsigned long long key = ((unsigned long long)t << ENGRAM__CUDA_COL_BITS) | k;
    atomicAdd(&b->count, 1ull);
    if (key >= *(volatile unsigned long long *)&b->key)
        return;
    while (atomicCAS(&b->lock, 0, 1) != 0)
        ;
    __threadfence(); /* acquire: see the last holder's writes */
    if (key < *(volatile unsigned long long *)&b->key) {
        *(volatile unsigned long long *)&b->key = key;
        *(volatile long long *)&b->value = raw;
        *(volatile unsigned int *)&b->table = table;
    }
    __threadfence(); /* release: our writes before the unlock */
    atomicExch(&b->lock, 0);
}

/* Resolves (t, k) to the source row, or NULL for a dead or bad id (after
 * zero-filling or reporting it).  The same on every lane of the row. */
template <int SW> __device__ __forceinline__ const engram__cuda_col *
resolve(const engram__cuda_launch &L, uint64_t t, uint32_t k, unsigned char *dst, unsigned sub,
        unsigned out_bytes, uint64_t *row)
{
    const engram__cuda_col *c = seen(&L.cols[k]);
    long long raw = load_id(L, t, k);
    if (raw == -1) { /* ENGRAM_DEAD_ID, decided before the offset */
        if (L.zero_dead)
            zero_row<SW>(dst, out_bytes, sub, L.lanes);
        return nullptr;
    }
    if (!engram__id_row(raw, c->off, c->span, row)) {
        if (sub == 0)
            report_bad(L.bad, t, k, raw, c->table);
        return nullptr;
    }
    if (c->by_token)
        *row = t;
    return c;
}

/* Row g of the flattened [T, K] batch: its token *t, column *k and output
 * row.  Rows are spread over the grid `lanes` threads each, grid-stride. */
__device__ __forceinline__ unsigned char *locate(const engram__cuda_launch &L, uint64_t g,
                                                 uint64_t *t, uint32_t *k)
{
    *t = g / L.K;
    *k = (uint32_t)(g - *t * L.K);
    return L.out + (ptrdiff_t)*t * L.ost + (ptrdiff_t)*k * L.osk;
}

template <int LW, int SW> __global__ void __launch_bounds__(1024)
    gather_kernel(const engram__cuda_launch L)
{
    const unsigned lanes = L.lanes, sub = threadIdx.x & (lanes - 1);
    const unsigned nchunks = L.R / LW, tail = L.R - nchunks * LW;
    const unsigned tail_lane = nchunks % lanes;
    const uint64_t per_block = blockDim.x / lanes, rows = L.T * L.K;
    const uint64_t step = (uint64_t)gridDim.x * per_block;

    for (uint64_t g = blockIdx.x * per_block + threadIdx.x / lanes; g < rows; g += step) {
        uint64_t t, row;
        uint32_t k;
        unsigned char *dst = locate(L, g, &t, &k);
        const engram__cuda_col *c = resolve<SW>(L, t, k, dst, sub, L.R, &row);
        if (!c)
            continue;
        const unsigned char *src = c->base + row * c->pitch;
        for (unsigned j = sub; j < nchunks; j += lanes)
            move<LW, SW>(dst + j * LW, src + j * LW);
        if (tail && sub == tail_lane)
            copy_tail<(SW < 8 ? SW : 8)>(dst + nchunks * LW, src + nchunks * LW, tail);
    }
}

/* Dequantises 8 values (one lane's share) into 8 BF16. */
__device__ __forceinline__ void dequant8(uint16_t *o, const uint8_t *v, uint8_t s)
{
#pragma unroll
    for (int i = 0; i < 8; i++)
        o[i] = engram__fp8_e8m0_to_bf16(v[i], s);
}

/* One row of N FP8 values -> N BF16; each lane takes groups of 8 values
 * (all in one 32-value scale block).  VEC: 8-byte loads, 16-byte stores. */
template <bool VEC> __global__ void __launch_bounds__(1024)
    dequant_kernel(const engram__cuda_launch L)
{
    const unsigned lanes = L.lanes, sub = threadIdx.x & (lanes - 1);
    const unsigned N = L.R, groups = N / 8;
    const uint64_t per_block = blockDim.x / lanes, rows = L.T * L.K;
    const uint64_t step = (uint64_t)gridDim.x * per_block;

    for (uint64_t g = blockIdx.x * per_block + threadIdx.x / lanes; g < rows; g += step) {
        uint64_t t, row;
        uint32_t k;
        unsigned char *dst = locate(L, g, &t, &k);
        const engram__cuda_col *c = resolve<2>(L, t, k, dst, sub, 2 * N, &row);
        if (!c)
            continue;
        const unsigned char *src = c->base + row * c->pitch;
        const unsigned char *sc = L.planar ? c->sbase + row * c->spitch : src + N;
        for (unsigned j = sub; j < groups; j += lanes) {
            uint8_t s = __ldg(sc + j * 8 / ENGRAM__FP8_BLOCK);
            if (VEC) {
                union {
                    uint16_t h[8];
                    uint4 u;
                } o;
                union {
                    uint2 u;
                    uint8_t b[8];
                } v;
                v.u = load<8>(src + j * 8);
                dequant8(o.h, v.b, s);
                put(dst + j * 16, o.u);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    put(dst + j * 16 + 2 * i,
                        (uint16_t)engram__fp8_e8m0_to_bf16(__ldg(src + j * 8 + i), s));
            }
        }
    }
}

__global__ void pack_ids_kernel(const void *ids, int id64, ptrdiff_t ist, ptrdiff_t isk,
                                uint64_t T, const uint32_t *cols, uint32_t ncols, int64_t *dst)
{
    uint64_t n = T * ncols;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t t = i / ncols;
        uint32_t j = (uint32_t)(i - t * ncols);
        ptrdiff_t e = (ptrdiff_t)t * ist + (ptrdiff_t)__ldg(cols + j) * isk;
        put(dst + i, (int64_t)(id64 ? __ldg(static_cast<const long long *>(ids) + e)
                                    : __ldg(static_cast<const int *>(ids) + e)));
    }
}

__global__ void take_bad_kernel(engram__cuda_bad *b, engram__cuda_bad *snap)
{
    while (atomicCAS(&b->lock, 0, 1) != 0)
        ;
    __threadfence();
    snap->count = atomicExch(&b->count, 0ull);
    snap->key = *(volatile unsigned long long *)&b->key;
    *(volatile unsigned long long *)&b->key = ENGRAM__CUDA_NO_BAD;
    snap->value = *(volatile long long *)&b->value;
    snap->table = *(volatile unsigned int *)&b->table;
    snap->lock = 0;
    __threadfence();
    atomicExch(&b->lock, 0);
}

__global__ void init_bad_kernel(engram__cuda_bad *b)
{
    b->count = 0;
    b->key = ENGRAM__CUDA_NO_BAD;
    b->value = 0;
    b->table = 0;
    b->lock = 0;
}

typedef void (*kernel_fn)(engram__cuda_launch);

/* The gather variants, indexed by [log2 load width][log2 store width]. */
const kernel_fn gather_table[5][5] = {
    {gather_kernel<1, 1>, nullptr, nullptr, nullptr, nullptr},
    {gather_kernel<2, 1>, gather_kernel<2, 2>, nullptr, nullptr, nullptr},
    {gather_kernel<4, 1>, gather_kernel<4, 2>, gather_kernel<4, 4>, nullptr, nullptr},
    {gather_kernel<8, 1>, gather_kernel<8, 2>, gather_kernel<8, 4>, gather_kernel<8, 8>, nullptr},
    {gather_kernel<16, 1>, gather_kernel<16, 2>, gather_kernel<16, 4>, gather_kernel<16, 8>,
     gather_kernel<16, 16>},
};

int log2w(uint32_t w)
{
    return w == 16 ? 4 : w == 8 ? 3 : w == 4 ? 2 : w == 2 ? 1 : w == 1 ? 0 : -1;
}

unsigned grid_for(const engram__cuda_launch *L)
{
    uint64_t per_block = L->block / L->lanes, rows = L->T * L->K;
    uint64_t need = (rows + per_block - 1) / per_block;
    return (unsigned)(need < L->max_blocks ? need : L->max_blocks);
}

int launch(kernel_fn fn, const engram__cuda_launch *L, cudaStream_t s)
{
    void *args[] = {const_cast<engram__cuda_launch *>(L)};
    unsigned grid = grid_for(L);
    if (grid == 0)
        return cudaSuccess;
    return launch_kernel(fn, dim3(grid), dim3(L->block), args, s);
}

} // namespace

extern "C" int engram__cuda_launch_gather(const engram__cuda_launch *L, cudaStream_t s)
{
    int lw = log2w(L->load_w), sw = log2w(L->store_w);
    if (lw < 0 || sw < 0 || sw > lw)
        return cudaErrorInvalidValue;
    return launch(gather_table[lw][sw], L, s);
}

extern "C" int engram__cuda_launch_dequant(const engram__cuda_launch *L, cudaStream_t s)
{
    return launch(L->load_w == 8 && L->store_w == 16 ? dequant_kernel<true> : dequant_kernel<false>,
                  L, s);
}

extern "C" int engram__cuda_launch_pack_ids(const void *ids, int id64, ptrdiff_t ist,
                                            ptrdiff_t isk, uint64_t T, const uint32_t *cols,
                                            uint32_t ncols, int64_t *dst, cudaStream_t s)
{
    uint64_t n = T * ncols, blocks = (n + 255) / 256;
    void *args[] = {&ids, &id64, &ist, &isk, &T, &cols, &ncols, &dst};
    if (n == 0)
        return cudaSuccess;
    return launch_kernel(pack_ids_kernel, dim3((unsigned)(blocks < 1024 ? blocks : 1024)), dim3(256),
                         args, s);
}

extern "C" int engram__cuda_launch_take_bad(engram__cuda_bad *bad, engram__cuda_bad *snap,
                                            cudaStream_t s)
{
    void *args[] = {&bad, &snap};
    return launch_kernel(take_bad_kernel, dim3(1), dim3(1), args, s);
}

extern "C" int engram__cuda_launch_init_bad(engram__cuda_bad *bad, cudaStream_t s)
{
    void *args[] = {&bad};
    return launch_kernel(init_bad_kernel, dim3(1), dim3(1), args, s);
}

extern "C" int engram__cuda_preload(cudaStream_t s)
{
    /* Under lazy loading (CUDA_MODULE_LOADING=LAZY, the default since
     * CUDA 12.2) a kernel is loaded when first used, and a launch is the
     * use that certainly loads it: launch every variant once with no
     * rows (its grid-stride loops do not run; nothing is read or
     * written).  The report kernels, which write, are launched for real
     * at open (init) and by engram_cuda_check (take), outside captures. */
    engram__cuda_launch L;
    const void *ids = nullptr;
    int id64 = 0;
    ptrdiff_t ist = 0, isk = 0;
    uint64_t T = 0;
    const uint32_t *cols = nullptr;
    uint32_t ncols = 0;
    int64_t *dst = nullptr;
    void *largs[] = {&L};
    void *pargs[] = {&ids, &id64, &ist, &isk, &T, &cols, &ncols, &dst};
    cudaFuncAttributes fa;
    cudaError_t e;
    memset(&L, 0, sizeof L);
    L.K = 1;
    L.lanes = 1;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j <= i; j++)
            if ((e = launch_kernel(gather_table[i][j], dim3(1), dim3(32), largs, s)) != cudaSuccess)
                return e;
    if ((e = launch_kernel(dequant_kernel<true>, dim3(1), dim3(32), largs, s)) != cudaSuccess ||
        (e = launch_kernel(dequant_kernel<false>, dim3(1), dim3(32), largs, s)) != cudaSuccess ||
        (e = launch_kernel(pack_ids_kernel, dim3(1), dim3(32), pargs, s)) != cudaSuccess ||
        (e = cudaFuncGetAttributes(&fa, reinterpret_cast<const void *>(take_bad_kernel))) !=
            cudaSuccess ||
        (e = cudaFuncGetAttributes(&fa, reinterpret_cast<const void *>(init_bad_kernel))) !=
            cudaSuccess)
        return e;
    return cudaSuccess;
}
