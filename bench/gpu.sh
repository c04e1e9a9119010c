#!/usr/bin/env bash
# The GPU checks of libengram_cuda, from a bare checkout on a machine with
# an NVIDIA GPU and the CUDA toolkit (nvcc): builds a release with CUDA
# required, runs the tests (the GPU tests must really run: a skip is a
# failure here), then the CUDA benchmark.  About 3-5 minutes on an H200.
# Results: stdout, and $OUT/bench_cuda.txt, $OUT/gpu_tests.txt and
# $OUT/ctest.txt when OUT is set (else under build/gpu/).
set -euo pipefail
cd "$(dirname "$0")/.."
# The GPU machine may have no network: a failed install of something the
# C build does not need (python3-venv, python3-dev) must not stop the run;
# a missing build dependency still fails the build below, with its error.
scripts/setup.sh || echo "gpu.sh: scripts/setup.sh failed (no network?): building with what is installed"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
command -v nvcc >/dev/null 2>&1 || { echo "gpu.sh: nvcc not found (install the CUDA toolkit)"; exit 1; }
out=${OUT:-build/gpu}
mkdir -p "$out"
jobs=$(nproc 2>/dev/null || echo 4)
t0=$(date +%s)

# The Python package's GPU tests run where python3 has numpy and pytest
# (the machine may have no network to install them).
py=OFF
# CMake asks for Python >= 3.10 (ENGRAM_PYTHON): an older python3 means no
# Python tests, not a failed configure.
if python3 -c 'import sys, numpy, pytest, os, sysconfig; raise SystemExit(sys.version_info < (3, 10) or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
  py=ON
fi

echo "== build (release, ENGRAM_CUDA=ON, warnings as errors, Python extension: $py)"
cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENGRAM_CUDA=ON -DENGRAM_WERROR=ON \
  -DENGRAM_PYTHON=$py >/dev/null
cmake --build build/gpu -j"$jobs" >/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== GPU tests"
{
  for t in test_cuda test_cuda_hostpath test_dequant test_table_memory; do
    set +e
    CUDA_MODULE_LOADING=LAZY timeout 300 "build/gpu/$t"
    rc=$?
    set -e
    if [ $rc -ne 0 ]; then
      echo "gpu.sh: $t exited $rc (77 = skipped: no usable CUDA device)"
      exit 1
    fi
  done
} 2>&1 | tee "$out/gpu_tests.txt"

if [ "$py" = ON ]; then
  echo "== Python GPU tests"
  rm -rf build/gpu/pkg && mkdir -p build/gpu/pkg/engramstore
  cp python/engramstore/*.py python/engramstore/*.pyi build/gpu/_engram*.so build/gpu/pkg/engramstore/
  (cd tests/python && PYTHONPATH="$PWD/../../build/gpu/pkg" python3 -m pytest -q -p no:cacheprovider \
     -rs test_cuda_gpu.py test_arrays.py) 2>&1 | tee -a "$out/gpu_tests.txt"
else
  echo "gpu.sh: python3 with numpy, pytest and headers not found: Python GPU tests not run" |
    tee -a "$out/gpu_tests.txt"
fi

echo "== the whole test suite of this build"
(cd build/gpu && ctest --output-on-failure -j"$jobs" -E 'test_cuda$') 2>&1 | tee "$out/ctest.txt"

echo "== benchmark"
build/gpu/bench_cuda --out "$out/bench_cuda.txt"
echo "gpu.sh: done in $(( $(date +%s) - t0 )) s; results in $out/"
