#!/usr/bin/env bash
# all.sh - runs every CPU-side benchmark of bench/ in a short mode, one
# after another, and prints one table: per tier, engram's figure, the
# baseline measured in the same run, their ratio, the load average while
# it ran, the command, the commit and the date.  The lead table of
# docs/performance.md is this script's output.
#
#   bench/all.sh [--only NAME,...] [--list] [--help]
#
# It builds what it needs first, as bench/run.sh does: scripts/setup.sh,
# the release build's benchmarks, CLI and Python extension (build/release,
# warnings as errors), the package laid out in build/release/pkg as
# scripts/test.sh lays it out, and the virtual environment build/venv
# (numpy; Mooncake's wheel where it installs: without it the Mooncake row
# says why it was skipped).  Then the benchmarks, never two at once:
#
#   gather     bench/run.sh (bench_gather and bench/bench_numpy.py): a 1 GiB
#              table, 264-byte rows, K = 1 and 4096, 1 and 2 threads
#   filecache  bench_filecache: a 2 GiB table file on /var/tmp, 64 MiB cache,
#              qd 128, against io_uring and 1, 16 and 128 pread threads
#   source     bench_source: Zipf ids, a store of 20 us + 100 ns a row
#   decode     bench_decode: 1 GiB of huge-page tables, T = 1 to 256, 1 thread
#   callcost   bench_callcost under callgrind (where valgrind is installed)
#   python     bench/bench_python.py and bench/bench_pycall.py
#   ngram      bench_ngram (1 GiB) and bench/bench_ngram.py (16 Ki, 1 Mi tokens)
#   prefetch   bench_prefetch: the file and Redis tiers, 50 steps
#   redis      bench_redis: 1 GiB in a 3-master loopback cluster that this
#              script starts (tests/redis_cluster.sh) and stops by PID
#   pull       bench_pull: 1 GiB (it starts its own cluster)
#   mooncake   bench/bench_mooncake.py: 24 heads of 20,000 rows, a loopback
#              Mooncake master and metadata server (it starts them)
#
# --only runs the named ones (in this order); --list prints the names.
# Every benchmark's output goes to $BENCH_OUT/NAME.txt (BENCH_OUT: default
# a new directory under /tmp), its JSON where it writes some to
# $BENCH_OUT/NAME*.json[l], the load average sampled every 5 s to
# $BENCH_OUT/load.txt and each run's status to $BENCH_OUT/runs.jsonl; then
# bench/report.py --all $BENCH_OUT prints the table and writes its rows to
# $BENCH_OUT/summary.jsonl.  A benchmark that fails does not stop the
# others; the script then exits 1 after the table, naming it.  About 12
# minutes on a 2-vCPU VM, once built.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
ALL="gather filecache source decode callcost python ngram prefetch redis pull mooncake"

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

only=""
while [ $# -gt 0 ]; do
    case $1 in
    --help | -h) usage; exit 0 ;;
    --list) echo "$ALL"; exit 0 ;;
    --only)
        [ $# -ge 2 ] || { echo "all.sh: --only needs a list of names ($ALL)" >&2; exit 2; }
        only=$2; shift 2 ;;
    *) echo "all.sh: unknown argument '$1' (see bench/all.sh --help)" >&2; exit 2 ;;
    esac
done
selected=""
if [ -n "$only" ]; then
    for n in ${only//,/ }; do
        case " $ALL " in
        *" $n "*) ;;
        *) echo "all.sh: no benchmark named '$n' (there are: $ALL)" >&2; exit 2 ;;
        esac
    done
    for n in $ALL; do
        case ",$only," in *",$n,"*) selected="$selected $n" ;; esac
    done
else
    selected=$ALL
fi
wanted() { case " $selected " in *" $1 "*) return 0 ;; esac; return 1; }

cd "$top" || exit 2
out=${BENCH_OUT:-$(mktemp -d /tmp/engram-bench-all.XXXXXX)}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
: >"$out/runs.jsonl"
# The commit whose code runs, "+dirty" where tracked files differ from it.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit+dirty"
echo "$commit" >"$out/commit"

# ---- build -----------------------------------------------------------------
echo "== build (scripts/setup.sh, build/release, build/venv)"
build_log=$out/build.log
{
    scripts/setup.sh &&
    cmake -S . -B build/release -DENGRAM_WERROR=ON -DENGRAM_REDIS=ON \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENGRAM_PYTHON=ON &&
    cmake --build build/release -j2 --target bench_gather bench_filecache bench_source \
        bench_decode bench_callcost bench_ngram bench_prefetch bench_redis bench_pull \
        engram_cli engramstore_ext
} >"$build_log" 2>&1 || { tail -30 "$build_log"; echo "all.sh: the build failed (log: $build_log)" >&2; exit 1; }
pkg=build/release/pkg
rm -rf "$pkg" && mkdir -p "$pkg/engramstore" &&
    cp python/engramstore/*.py python/engramstore/*.pyi python/engramstore/py.typed \
        build/release/_engram*.so "$pkg/engramstore/" ||
    { echo "all.sh: could not lay out the package in $pkg" >&2; exit 1; }
py=build/venv/bin/python
{
    [ -x "$py" ] || python3 -m venv build/venv
    "$py" -c 'import numpy' 2>/dev/null ||
        "$py" -m pip install -q --disable-pip-version-check numpy
} >>"$build_log" 2>&1 || { tail -20 "$build_log"; echo "all.sh: build/venv with numpy could not be made (log: $build_log)" >&2; exit 1; }
mooncake_why=""
if wanted mooncake && ! "$py" -c 'import mooncake.store' 2>/dev/null; then
    # As scripts/test.sh does; where the wheel does not install, the row
    # says so.
    if ! "$py" -m pip install -q --disable-pip-version-check \
        mooncake-transfer-engine-non-cuda >>"$build_log" 2>&1 ||
        ! "$py" -c 'import mooncake.store' 2>>"$build_log"; then
        mooncake_why="Mooncake's wheel (mooncake-transfer-engine-non-cuda) is not importable from build/venv: $(tail -1 "$build_log")"
    fi
fi
export PATH="$top/build/venv/bin:$PATH"
export PYTHONPATH="$top/$pkg"
B=build/release

# ---- what runs alongside: the load sampler, the Redis Cluster ---------------
sampler=""
REDIS_PIDS=""
REDIS_WHY=""
cleanup() {
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
    sampler=""
    [ -n "$REDIS_PIDS" ] && redis_cluster_stop
}
trap 'cleanup' EXIT
trap 'exit 130' INT TERM
(while :; do
    echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"
    sleep 5
done) >"$out/load.txt" 2>/dev/null &
sampler=$!

# run NAME COMMAND...: runs it with its output in $out/NAME.txt and
# records its status, seconds and the load around it in runs.jsonl.
failed=""
json_str() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
run() {
    local name=$1 t0 t1 rc
    shift
    echo "== $name: $*"
    t0=$(date +%s.%N)
    printf '{"bench":"%s","phase":"start","t":%s,"loadavg":"%s"}\n' "$name" "$t0" \
        "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/runs.jsonl"
    "$@" >"$out/$name.txt" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    printf '{"bench":"%s","phase":"end","t":%s,"loadavg":"%s","rc":%d,"command":"%s"}\n' \
        "$name" "$t1" "$(cut -d' ' -f1-3 /proc/loadavg)" "$rc" "$(json_str "${show:-$*}")" >>"$out/runs.jsonl"
    if [ "$rc" != 0 ]; then
        echo "all.sh: $name failed (exit $rc); the end of its output ($out/$name.txt):" >&2
        tail -15 "$out/$name.txt" >&2
        failed="$failed $name"
    fi
    return 0
}
skipped() { # NAME REASON
    echo "== $1: skipped: $2"
    printf '{"bench":"%s","phase":"skipped","reason":"%s"}\n' "$1" "$(json_str "$2")" >>"$out/runs.jsonl"
}

start=$(date +%s)

# ---- the benchmarks ---------------------------------------------------------
if wanted gather; then
    mkdir -p "$out/gather"
    run gather env BENCH_GATHER="$B/bench_gather" BENCH_OUT="$out/gather" bench/run.sh \
        --sizes 1G --rows 264 --k 1,4096 --threads 1,2 --variants private-huge --repeats 7
fi
wanted filecache &&
    run filecache "$B/bench_filecache" --size-mib 2048 --cache-mib 64 --qd 128 --reps 5 \
        --pread-threads 16,128
wanted source && run source "$B/bench_source" --reps 7
wanted decode &&
    run decode "$B/bench_decode" --sizes 1G --variants thp --threads 1 --load idle \
        --tokens 1,4,16,64,256 --calls 2000
if wanted callcost; then
    if command -v valgrind >/dev/null 2>&1; then
        cc() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$B/bench_callcost" "$@"; }
        callcost() {
            for side in engram naive; do
                echo "-- $side 0 calls"; cc "$side" 1 0 || return 1
                echo "-- $side 20000 calls"; cc "$side" 1 20000 || return 1
            done
        }
        show="valgrind --tool=callgrind $B/bench_callcost {engram,naive} 1 {0,20000}" run callcost callcost
    else
        skipped callcost "valgrind is not installed (it counts the instructions)"
    fi
fi
if wanted python; then
    run python "$py" bench/bench_python.py --reps 9 --json "$out/python.json"
    run pycall "$py" bench/bench_pycall.py --tokens 1,16,64 --rounds 100 --json "$out/pycall.json"
fi
if wanted ngram; then
    run ngram "$B/bench_ngram" --tokens 1,4,64
    run ngram_py_16k "$py" bench/bench_ngram.py --tokens 16384 --repeats 7 --json "$out/ngram_py_16k.json"
    run ngram_py_1m "$py" bench/bench_ngram.py --tokens 1048576 --repeats 5 --json "$out/ngram_py_1m.json"
fi
wanted prefetch && run prefetch "$B/bench_prefetch" --steps 50
if wanted redis; then
    # The cluster as the shell tests start theirs (tests/redis_cluster.sh:
    # three masters on free loopback ports), its servers stopped by PID
    # after the run and by the EXIT trap on any way out.
    SCRATCH=$out/redis-cluster
    # shellcheck source=../tests/redis_cluster.sh
    . tests/redis_cluster.sh
    if redis_cluster_up; then
        run redis "$B/bench_redis" --nodes "$NODES" --mib 1024 --reps 5
    else
        echo "all.sh: redis: $REDIS_WHY" >&2
        printf '{"bench":"redis","phase":"end","rc":1,"error":"%s"}\n' \
            "$(json_str "$REDIS_WHY")" >>"$out/runs.jsonl"
        failed="$failed redis"
    fi
    redis_cluster_stop
fi
wanted pull && run pull "$B/bench_pull" --mib 1024 --reps 5
if wanted mooncake; then
    if [ -n "$mooncake_why" ]; then
        skipped mooncake "$mooncake_why"
    else
        run mooncake "$py" bench/bench_mooncake.py --rows 20000 --repeats 5 --read-calls auto \
            --warmup 1000 --json "$out/mooncake.json"
    fi
fi

end=$(date +%s)
cleanup
echo
"$py" bench/report.py --all "$out" --seconds $((end - start))
rc=$?
echo
echo "all.sh: JSON lines in $out (summary.jsonl: the table's rows)"
if [ -n "$failed" ]; then
    echo "all.sh: FAILED:$failed (their output: $out/NAME.txt)" >&2
    exit 1
fi
[ "$rc" = 0 ] || { echo "all.sh: bench/report.py could not read every result" >&2; exit 1; }
exit 0
