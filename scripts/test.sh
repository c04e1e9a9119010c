#!/usr/bin/env bash
# Builds engram and runs every test: first the virtual environment
# build/venv of the Python tests (numpy, pytest, Mooncake's wheel; the
# release build's docs_shell_blocks uses it too), then a release build
# with warnings as errors (the Python extension included), then an
# ASan+UBSan build, then a ThreadSanitizer build of the threaded tests,
# each ending with CTest's summary line; then the Python tests, first against the extension of the
# ASan+UBSan build (and its GPU tests against that extension over the
# emulated CUDA runtime), then against the package installed with
# `pip install .` into the virtual environment build/venv (with Mooncake's
# wheel, for the Store-backed tests on a Mooncake Store started on
# 127.0.0.1), then against the manylinux wheel of scripts/wheel.sh
# installed into a fresh one (build/wheel-test-venv); pytest's summary
# line ends the run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)

# setup.sh installed redis-server and redis-cli: a Redis test that cannot
# start its cluster is a failure here, not a skip.  The Python tests write
# the PID of every redis-server they start to ENGRAM_REDIS_PIDFILE (the C
# and CLI tests stop theirs by PID too, and their servers die with them).
export ENGRAM_REQUIRE_REDIS=1
mkdir -p build
export ENGRAM_REDIS_PIDFILE="$PWD/build/redis-servers.pid"
: > "$ENGRAM_REDIS_PIDFILE"

run_build() { # name, cmake options..., then -- ctest options...
  local name=$1; shift
  local copts=() topts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do copts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  topts=("$@")
  echo "== $name build"
  cmake -S . -B "build/$name" -DENGRAM_WERROR=ON -DENGRAM_REDIS=ON "${copts[@]}" >/dev/null
  cmake --build "build/$name" -j"$jobs" >/dev/null
  (cd "build/$name" && ctest --output-on-failure -j"$jobs" "${topts[@]}")
}

# The virtual environment of the Python tests, made before the builds: the
# release build's docs_shell_blocks runs the documents' blocks that use
# numpy and Mooncake's wheel from it.
echo "== python environment"
[ -x build/venv/bin/python ] || python3 -m venv build/venv
# mypy: tests/python/test_typing.py checks the package and the README's and
# docs' examples with it.  tokenizers: engramstore.build_token_map() (its
# test builds a small tokenizer).
build/venv/bin/python -m pip install -q --disable-pip-version-check numpy pytest mypy tokenizers
# Mooncake's Store (its Python client, master and metadata server) for the
# Store-backed tests (tests/python/test_mooncake.py start and stop the servers
# on 127.0.0.1 themselves).  Where the wheel cannot be installed at all (no
# build for this platform) those tests skip and say so; once it is installed,
# ENGRAM_REQUIRE_MOONCAKE=1 makes a Store that does not come up a failure.
if build/venv/bin/python -m pip install -q --disable-pip-version-check \
     mooncake-transfer-engine-non-cuda; then
  export ENGRAM_REQUIRE_MOONCAKE=1
  export ENGRAM_MOONCAKE_PIDFILE="$PWD/build/mooncake-servers.pid"
  : > "$ENGRAM_MOONCAKE_PIDFILE"
else
  echo "test.sh: mooncake-transfer-engine-non-cuda could not be installed: the Store-backed tests will skip"
fi

run_build release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENGRAM_PYTHON=ON
run_build asan -DENGRAM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DENGRAM_PYTHON=ON
run_build tsan -DENGRAM_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -- -R 'test_(lookup|concurrency|filesrc|source|pool|reclaim|shared|log|redis|publish|async|ngram)'

echo "== python package"

# Runs pytest in tests/python against an extension of the ASan+UBSan build,
# with the sanitizer runtimes preloaded into the interpreter: asan_pytest
# <extension directory> <package directory to make> [pytest arguments].
# Output is captured at the Python level only (--capture=sys), so that a
# sanitizer report, written to file descriptor 2 just before the process
# exits, reaches the log instead of pytest's capture file.
asan_pytest() {
  local ext=$1 pkg=$2; shift 2
  rm -rf "$pkg" && mkdir -p "$pkg/engramstore"
  cp python/engramstore/*.py "$ext"/_engram*.so "$pkg/engramstore/"
  (cd tests/python && PYTHONPATH="$PWD/../../$pkg" ASAN_OPTIONS=detect_leaks=0 \
     LD_PRELOAD="$(${CC:-cc} -print-file-name=libasan.so) $(${CC:-cc} -print-file-name=libubsan.so)" \
     ../../build/venv/bin/python -m pytest -q -p no:cacheprovider --capture=sys "$@")
}
# The extension of the ASan+UBSan build (no CUDA there).
asan_pytest build/asan build/asan/pkg .
# The GPU tests against the same extension over the emulated CUDA runtime
# (tests/cuda_emu), where that build has it (a C++ compiler and the CUDA
# headers): the GPU lookup path of the package without a GPU, with two
# emulated GPUs so that arrays on another GPU than the current one are met.
if ls build/asan/emu/_engram*.so >/dev/null 2>&1; then
  ENGRAM_EMU_DEVICES=2 ENGRAM_TEST_CUDA_EMU=1 asan_pytest build/asan/emu build/asan/pkg-emu test_cuda_gpu.py
fi

# Then the package as users get it: pip install . (with CUDA where nvcc is).
build/venv/bin/python -m pip install -q --disable-pip-version-check . -C cmake.define.ENGRAM_WERROR=ON
# Run from tests/python, where no engramstore is on the path, so `import
# engramstore` is the installed package (ENGRAM_REQUIRE_INSTALLED: or
# test_packaging.py fails).
(cd tests/python && ENGRAM_REQUIRE_INSTALLED=1 ../../build/venv/bin/python -m pytest -q \
   -p no:cacheprovider .)

# And the wheel a bare Python installs: scripts/wheel.sh builds the sdist,
# the wheel from it (no CUDA) and has auditwheel graft the libraries into
# it; it goes into a virtual environment made afresh, with nothing of this
# tree, the tests' own packages and Mooncake's wheel where build/venv has
# it.  pytest runs from a scratch directory outside the tree (the tests
# themselves stay in tests/python, which read files of the tree), and the
# checkpoint tests drive the `engram` console script of that environment.
echo "== python wheel"
wheel_t0=$SECONDS
scripts/wheel.sh -C cmake.define.ENGRAM_WERROR=ON >build/wheel.log 2>&1 \
  || { cat build/wheel.log; echo "test.sh: scripts/wheel.sh failed" >&2; exit 1; }
# auditwheel's verdict: the repaired wheel conforms to a manylinux policy.
shown=$(build/wheel-venv/bin/auditwheel show dist/engramstore-*.whl | tr '\n' ' ')
if ! grep -Eq 'platform tag: *"manylinux_[0-9]+_[0-9]+_[a-z0-9_]+"' <<<"$shown"; then
  echo "test.sh: auditwheel show reports no manylinux tag: $shown" >&2
  exit 1
fi
ls dist/engramstore-*
wvenv=build/wheel-test-venv
rm -rf "$wvenv" && python3 -m venv "$wvenv"
wpkgs=(numpy pytest mypy tokenizers)
[ "${ENGRAM_REQUIRE_MOONCAKE:-}" = 1 ] && wpkgs+=(mooncake-transfer-engine-non-cuda)
"$wvenv/bin/python" -m pip install -q --disable-pip-version-check dist/engramstore-*.whl "${wpkgs[@]}"
"$wvenv/bin/engram" --version
top=$PWD
wtmp=$(mktemp -d)
(cd "$wtmp" && ENGRAM_REQUIRE_INSTALLED=1 ENGRAM_BIN="$top/$wvenv/bin/engram" \
   "$top/$wvenv/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$wtmp" \
   "$top/tests/python")
rm -rf "$wtmp"
echo "test.sh: the wheel's build and tests took $((SECONDS - wheel_t0)) s"
# The tests stop the Mooncake servers they started (each one's PID is in
# $ENGRAM_MOONCAKE_PIDFILE): fail if one of them is still running.
left=""
[ -n "${ENGRAM_MOONCAKE_PIDFILE:-}" ] && while read -r pid; do
  if grep -qa mooncake "/proc/$pid/cmdline" 2>/dev/null; then left="$left $pid"; fi
done < "$ENGRAM_MOONCAKE_PIDFILE"
if [ -n "$left" ]; then
  echo "test.sh: Mooncake servers the tests started are still running:$left" >&2
  exit 1
fi
left=""
while read -r pid; do
  if grep -qa redis-server "/proc/$pid/cmdline" 2>/dev/null; then left="$left $pid"; fi
done < "$ENGRAM_REDIS_PIDFILE"
if [ -n "$left" ]; then
  echo "test.sh: Redis servers the tests started are still running:$left" >&2
  exit 1
fi
