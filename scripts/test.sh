#!/usr/bin/env bash
# Builds engram and runs every test: a release build with warnings as
# errors, then an ASan+UBSan build, then a ThreadSanitizer build of the
# threaded tests.  Each ends with CTest's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)

run_build() { # name, cmake options..., then -- ctest options...
  local name=$1; shift
  local copts=() topts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do copts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  topts=("$@")
  echo "== $name build"
  cmake -S . -B "build/$name" -DENGRAM_WERROR=ON "${copts[@]}" >/dev/null
  cmake --build "build/$name" -j"$jobs" >/dev/null
  (cd "build/$name" && ctest --output-on-failure -j"$jobs" "${topts[@]}")
}

run_build release -DCMAKE_BUILD_TYPE=RelWithDebInfo
run_build asan -DENGRAM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
run_build tsan -DENGRAM_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -- -R 'test_(lookup|concurrency|filecache)'
