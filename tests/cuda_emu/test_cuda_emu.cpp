/* tests/test_cuda.cu, unchanged, against the emulated runtime
 * (emu_runtime.cpp) and the emulated kernels (kernels_emu.cpp). */
#include "test_cuda.cu"
