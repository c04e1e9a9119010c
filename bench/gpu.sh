#!/usr/bin/env bash
# The GPU checks of libengram_cuda, from a bare checkout on a machine with
# an NVIDIA GPU and the CUDA toolkit (nvcc): builds a release with CUDA
# required, runs the tests (the GPU tests must really run: a skip is a
# failure here), then the CUDA benchmark.  About 3-5 minutes on an H200.
# Results: stdout, and $OUT/bench_cuda.txt + $OUT/gpu_tests.txt when OUT
# is set (else under build/gpu/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
command -v nvcc >/dev/null 2>&1 || { echo "gpu.sh: nvcc not found (install the CUDA toolkit)"; exit 1; }
out=${OUT:-build/gpu}
mkdir -p "$out"
jobs=$(nproc 2>/dev/null || echo 4)
t0=$(date +%s)

echo "== build (release, ENGRAM_CUDA=ON, warnings as errors)"
cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENGRAM_CUDA=ON -DENGRAM_WERROR=ON >/dev/null
cmake --build build/gpu -j"$jobs" >/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== GPU tests"
{
  for t in test_cuda test_cuda_hostpath test_dequant test_table_memory; do
    set +e
    timeout 300 "build/gpu/$t"
    rc=$?
    set -e
    if [ $rc -ne 0 ]; then
      echo "gpu.sh: $t exited $rc (77 = skipped: no usable CUDA device)"
      exit 1
    fi
  done
} 2>&1 | tee "$out/gpu_tests.txt"

echo "== the whole test suite of this build"
(cd build/gpu && ctest --output-on-failure -j"$jobs" -E 'test_cuda$')

echo "== benchmark"
build/gpu/bench_cuda --out "$out/bench_cuda.txt"
echo "gpu.sh: done in $(( $(date +%s) - t0 )) s; results in $out/"
