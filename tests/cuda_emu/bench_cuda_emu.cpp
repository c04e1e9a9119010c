/* bench/bench_cuda.cu on the host emulation of the runtime, for a smoke run
 * in CTest (bench_cuda_emu): the benchmark works, and its output checks
 * pass, before a GPU runs it.  Its figures mean nothing. */
#include "bench_cuda.cu"
