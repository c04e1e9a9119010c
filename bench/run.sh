#!/bin/sh
# run.sh - runs bench_gather and, when numpy is importable, bench_numpy.py
# with the same parameters, then prints the library/numpy ratio table.
#
#   bench/run.sh [bench_gather options, e.g. --quick or --sizes 256M,8G --k 4096]
#
# The two programs run one after the other, never together, so each has
# the machine (and its memory: an 8 GiB table each) to itself.  The JSON
# lines of both go to $BENCH_OUT (default: a new temporary directory),
# whose path is printed at the end.  bench_gather is taken from
# $BENCH_GATHER, else built in build/release of this checkout.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")

for a in "$@"; do
    if [ "$a" = "--json" ]; then
        echo "run.sh: --json is set by run.sh itself; use BENCH_OUT=DIR" >&2
        exit 2
    fi
done

bin=${BENCH_GATHER:-}
if [ -z "$bin" ]; then
    # The same optimised build as scripts/demo.sh.
    "$top/scripts/setup.sh"
    cmake -S "$top" -B "$top/build/release" -DENGRAM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$top/build/release" -j2 --target bench_gather >/dev/null
    bin=$top/build/release/bench_gather
fi
if [ ! -x "$bin" ]; then
    echo "run.sh: $bin is not an executable bench_gather" >&2
    exit 1
fi

out=${BENCH_OUT:-$(mktemp -d /tmp/engram-bench.XXXXXX)}
mkdir -p "$out"

"$bin" "$@" --json "$out/gather.jsonl"

if python3 -c 'import numpy' 2>/dev/null; then
    echo
    python3 "$here/bench_numpy.py" "$@" --json "$out/numpy.jsonl"
    python3 "$here/bench_numpy.py" --combine "$out/gather.jsonl" "$out/numpy.jsonl"
else
    echo
    echo "run.sh: numpy is not installed; no numpy baseline (python3 -m pip install numpy)"
fi
echo
echo "run.sh: JSON lines in $out"
