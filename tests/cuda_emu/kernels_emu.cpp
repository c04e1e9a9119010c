/* cuda/kernels.cu compiled as host C++ for test_cuda_emu (ENGRAM_CUDA_EMU:
 * the device builtins come from emu_device.h).  CMakeLists.txt compiles it
 * with -Wno-unknown-pragmas (`#pragma unroll` is for nvcc) and
 * -fno-strict-aliasing (the kernels split a vector register into narrower
 * stores through a pointer cast, as device code commonly does). */
#include "kernels.cu"
