/*
 * emu_device.h - the device side of cuda/kernels.cu on the host, for
 * test_cuda_emu (kernels.cu includes it instead of <cuda_runtime.h> when
 * ENGRAM_CUDA_EMU is defined; see emu_runtime.cpp for the runtime side).
 *
 * A launch becomes a closure on its stream's queue; when the stream is
 * drained, every thread of the grid runs the kernel body to completion,
 * one after another.  That is exact for our kernels, which use neither
 * shared memory nor barriers nor warp operations, and it checks what the
 * host code hands them: every __ldg, and every plain store and load of
 * kernels.cu (put(), seen()), must touch memory the runtime knows as
 * device-visible (cudaMalloc, pinned, registered) and, for cudaMalloc
 * memory, on the kernel's device, or the test aborts, so a plan that
 * passes a plain host pointer to a kernel is caught; device
 * allocations are exact heap blocks, so ASan catches a byte read or
 * written past them.  It says nothing about speed, concurrency between
 * threads, or the memory model of a real GPU.
 */
#ifndef ENGRAM_EMU_DEVICE_H
#define ENGRAM_EMU_DEVICE_H

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <tuple>
#include <type_traits>
#include <utility>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)

/* The running thread's coordinates, set by the runtime before each body. */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

/* 1 when [p, p + n) lies in memory a kernel may read. */
bool emu_device_visible(const void *p, size_t n);
/* Queues body(arg) for every thread of a grid x block launch on s; the
 * runtime calls del(arg) when the launch (or the graph holding it) is gone. */
cudaError_t emu_enqueue_kernel(cudaStream_t s, unsigned grid, unsigned block,
                               void (*body)(void *), void *arg, void (*del)(void *));

/* Test hooks.  emu_fail_host_register: while on, cudaHostRegister fails
 * with cudaErrorMemoryAllocation, as it does past the memlock limit.
 * emu_fail_nth_call(n): the n-th call from now that can fail on a GPU
 * (allocations, registrations, copies, launches, syncs, queries; never a
 * free or destroy) fails with a plausible error; 0 disarms; emu_failed()
 * says whether it did.  emu_live_objects(): device, pinned and registered
 * blocks, streams and events alive, for leak checks. */
extern "C" void emu_fail_host_register(int on);
extern "C" void emu_fail_nth_call(long n);
extern "C" int emu_failed(void);
extern "C" long emu_live_objects(void);

/* kernels.cu's put() and seen(): a plain access of a kernel. */
static inline void emu_device_access(const void *p, size_t n)
{
    if (!emu_device_visible(p, n)) {
        fprintf(stderr, "emu: kernel access to %p (%zu bytes), which is not device-visible "
                        "memory\n", p, n);
        abort();
    }
}

template <class T> static inline T __ldg(const T *p)
{
    if (!emu_device_visible(p, sizeof(T))) {
        fprintf(stderr, "emu: kernel load from %p, which is not device-visible memory\n",
                static_cast<const void *>(p));
        abort();
    }
    return *p;
}

/* Threads run one at a time: plain read-modify-write is atomic here. */
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    unsigned long long o = *p;
    *p = o + v;
    return o;
}
static inline int atomicCAS(int *p, int cmp, int v)
{
    int o = *p;
    if (o == cmp)
        *p = v;
    return o;
}
template <class T> static inline T atomicExch(T *p, T v)
{
    T o = *p;
    *p = v;
    return o;
}
static inline void __threadfence(void) {}

/* kernels.cu's launch: the argument array is unpacked by the kernel's own
 * parameter types, as cudaLaunchKernel() does, and copied (a launch keeps
 * its arguments by value, also in a captured graph). */
template <class... P, size_t... I>
static std::tuple<P...> emu_unpack(void **args, std::index_sequence<I...>)
{
    return std::tuple<P...>(*static_cast<P *>(args[I])...);
}

template <class... P>
static cudaError_t launch_kernel(void (*f)(P...), dim3 grid, dim3 block, void **args,
                                 cudaStream_t s)
{
    struct closure {
        void (*f)(P...);
        std::tuple<std::decay_t<P>...> a;
    };
    if (grid.x == 0 || grid.y != 1 || grid.z != 1 || block.x == 0 || block.x > 1024 ||
        block.y != 1 || block.z != 1)
        return cudaErrorInvalidConfiguration;
    closure *c = new closure{f, emu_unpack<std::decay_t<P>...>(args, std::index_sequence_for<P...>{})};
    return emu_enqueue_kernel(
        s, grid.x, block.x, [](void *p) { std::apply(static_cast<closure *>(p)->f, static_cast<closure *>(p)->a); },
        c, [](void *p) { delete static_cast<closure *>(p); });
}

#endif
