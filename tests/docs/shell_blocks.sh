#!/bin/sh
# Every shell block (```sh, and ```bash, ```shell or ```console should one
# appear) of README.md and docs/*.md is run by a test, or says why not.
# The line right above each block's fence is one of
#
#   <!-- run by tests/docs/shell_blocks.sh -->   this script runs it, below
#   <!-- run by tests/PATH -->                   that script runs it; it must
#                                                exist, name the document
#                                                and be registered in a
#                                                CMakeLists.txt or
#                                                cmake/*.cmake of the build
#   <!-- not run by the tests: REASON -->
#
# and a block with none of them fails the test, so a new block cannot go
# untested silently; so does a block marked as run here that no runner
# below claims.
#
# The blocks run here run with `sh -e`, each in a scratch directory of its
# own, as written but for these changes, all mechanical:
#  - the scratch directory has links bench/ and scripts/ to the source
#    tree and build/release to the build under test, so the block's
#    relative paths run as written;
#  - ENGRAM_ROOT is a scratch root, BENCH_GATHER the build's bench_gather
#    and BENCH_OUT a scratch directory (docs/performance.md names both);
#  - `engram` on PATH is the build's CLI, and build/venv/bin (of the
#    source tree) comes next on PATH; pip runs with PIP_NO_INDEX=1:
#    `pip install P` downloads nothing and succeeds only where P is
#    installed there already (scripts/test.sh installs numpy and
#    Mooncake's wheel into it before its builds); a block that needs a
#    package the venv lacks is skipped, and says so;
#  - the port numbers of `--port N`, `--*_port=N` and `127.0.0.1:N` are
#    replaced by free ones;
#  - a benchmark whose document names a --quick smoke run gets --quick.
# A block that starts servers in the background runs in a session of its
# own (setsid), and that process group is killed at exit however the
# script ends.  Each runner checks the block's exit status and the lines
# it prints (or, for servers, that they serve).
#
# Exit: 0, 1 on any failure, 77 when nothing failed but a block was
# skipped (Mooncake's wheel missing is a failure with
# ENGRAM_REQUIRE_MOONCAKE=1).
# Env: ENGRAM_SRC (source dir), ENGRAM_BUILD (the build dir under test),
# ENGRAM_BIN (its engram), ENGRAM_VENV (default $ENGRAM_SRC/build/venv).
set -u
: "${ENGRAM_SRC:?}" "${ENGRAM_BUILD:?}" "${ENGRAM_BIN:?}"
VENV=${ENGRAM_VENV:-$ENGRAM_SRC/build/venv}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/engram-shell-blocks.XXXXXX") || exit 2
TEST_NAME=docs_shell_blocks
SELF=tests/docs/shell_blocks.sh
# The free-port picker of the Redis tests (no Redis server is started here).
# shellcheck source=../redis_cluster.sh
. "$ENGRAM_SRC/tests/redis_cluster.sh"

FAIL=0
PASSED=0
SKIPPED=""
GROUPS_STARTED=""
# Stops every process group a block's servers ran in, by its id (dash's
# kill takes no "--": the signal first, then the negative id).
stop_groups() {
    for g in $GROUPS_STARTED; do
        kill -TERM "-$g" 2>/dev/null
    done
    [ -n "$GROUPS_STARTED" ] && sleep 0.5
    for g in $GROUPS_STARTED; do
        kill -KILL "-$g" 2>/dev/null
    done
    GROUPS_STARTED=""
}
trap 'rc=$?; stop_groups; if [ $rc = 0 ] || [ $rc = 77 ]; then rm -rf "$SCRATCH"; else echo "$TEST_NAME: its files are kept in $SCRATCH" >&2; fi' EXIT
trap 'exit 130' INT TERM

fail() {
    echo "$TEST_NAME: FAIL: $*"
    FAIL=1
}
skip() {
    echo "$TEST_NAME: SKIP: $*"
    SKIPPED="$SKIPPED x"
}

# ---------------------------------------------------------------------------
# Every shell block of the documents: $SCRATCH/blocks/N.sh holds block N,
# and a line of $SCRATCH/blocks/list says "N DOC LINE MARK" (MARK: the
# line above the fence, or "-" when it is no marker).
mkdir "$SCRATCH/blocks"
n=0
for path in "$ENGRAM_SRC/README.md" "$ENGRAM_SRC"/docs/*.md; do
    [ -f "$path" ] || continue
    doc=${path#"$ENGRAM_SRC/"}
    n=$(awk -v doc="$doc" -v dir="$SCRATCH/blocks" -v n="$n" '
        /^```(sh|bash|shell|console)$/ && !on {
            n++; on = 1; f = dir "/" n ".sh"; printf "" > f
            mark = prev ~ /^<!-- .* -->$/ ? prev : "-"
            print n, doc, NR, mark >> (dir "/list")
            next
        }
        on && /^```$/ { on = 0; close(f); next }
        on { print > f }
        { prev = $0 }
        END { print n }' "$ENGRAM_SRC/$doc") || exit 2
done
[ "$n" -gt 0 ] || { echo "$TEST_NAME: no shell block found in README.md and docs/*.md"; exit 1; }

# The audit: every block is marked, and a block run elsewhere names a
# script that exists, names the document and is a registered test.
: >"$SCRATCH/blocks/here"
while read -r i doc line mark; do
    case $mark in
    "<!-- run by $SELF -->")
        echo "$i $doc $line" >>"$SCRATCH/blocks/here" ;;
    "<!-- run by tests/"*" -->")
        script=${mark#"<!-- run by "}
        script=${script%" -->"}
        if [ ! -f "$ENGRAM_SRC/$script" ]; then
            fail "$doc:$line: the block says it is run by $script, which does not exist"
        elif ! grep -qF "$doc" "$ENGRAM_SRC/$script"; then
            fail "$doc:$line: the block says it is run by $script, which does not name $doc"
        elif ! (cd "$ENGRAM_SRC" && find . -path './build*' -prune -o \( -name CMakeLists.txt \
                -o -path './cmake/*.cmake' \) -type f -print | xargs grep -lF "$script" |
                grep -q .); then
            fail "$doc:$line: the block says it is run by $script, which no CMakeLists.txt registers"
        fi ;;
    "<!-- not run by the tests: "?*" -->") ;;
    *)
        fail "$doc:$line: a shell block that no test runs and that does not say why;" \
            "run it (tests/docs/shell_blocks.sh) or mark it on the line above its fence with" \
            "'<!-- run by tests/SCRIPT -->' or '<!-- not run by the tests: REASON -->'" ;;
    esac
done <"$SCRATCH/blocks/list"

# ---------------------------------------------------------------------------
# The runners.  claim DOC TEXT: sets $i to the number of the one block of
# DOC marked as run here that has a line starting with TEXT, and takes it
# off the list of blocks left to run; fails (returns 1) when there is not
# exactly one.
claim() {
    found=""
    while read -r i doc line; do
        [ "$doc" = "$1" ] || continue
        if grep -q "^$2" "$SCRATCH/blocks/$i.sh"; then
            found="$found $i"
        fi
    done <"$SCRATCH/blocks/here"
    found=${found# }
    case $found in
    "") fail "$1: no shell block marked '<!-- run by $SELF -->' has a line starting with '$2'"
        return 1 ;;
    *" "*) fail "$1: more than one block has a line starting with '$2': blocks $found"
        return 1 ;;
    esac
    grep -v "^$found " "$SCRATCH/blocks/here" >"$SCRATCH/blocks/here.new"
    mv "$SCRATCH/blocks/here.new" "$SCRATCH/blocks/here"
    i=$found
}

# prepare N NAME: the scratch directory $SCRATCH/NAME for block N, with
# the links above; its block is NAME/block.sh.
prepare() {
    d=$SCRATCH/$2
    mkdir -p "$d/build" "$d/root" "$d/bench-out"
    ln -s "$ENGRAM_SRC/bench" "$d/bench"
    ln -s "$ENGRAM_SRC/scripts" "$d/scripts"
    ln -s "$ENGRAM_BUILD" "$d/build/release"
    mkdir -p "$d/bin"
    ln -s "$ENGRAM_BIN" "$d/bin/engram"
    cp "$SCRATCH/blocks/$1.sh" "$d/block.sh"
}

# in_block_env NAME CMD...: CMD in $SCRATCH/NAME, with the blocks'
# environment.
in_block_env() {
    d=$SCRATCH/$1
    shift
    (cd "$d" && env ENGRAM_ROOT="$d/root" BENCH_GATHER="$ENGRAM_BUILD/bench_gather" \
        BENCH_OUT="$d/bench-out" PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
        PATH="$d/bin:$VENV/bin:$PATH" "$@")
}

# run_block NAME DOC: runs $SCRATCH/NAME/block.sh with `sh -e` in its
# directory, its output in NAME/out; says what failed and returns 1.
run_block() {
    if ! in_block_env "$1" sh -e block.sh >"$SCRATCH/$1/out" 2>&1; then
        tail -40 "$SCRATCH/$1/out"
        fail "$2's block failed as written (run: $SCRATCH/$1/block.sh)"
        return 1
    fi
}

# expect NAME DOC PATTERN...: every PATTERN matches a line of NAME/out.
expect() {
    name=$1
    doc=$2
    shift 2
    ok=1
    for want in "$@"; do
        if ! grep -q -e "$want" "$SCRATCH/$name/out"; then
            ok=0
            fail "$doc's block: no line matching '$want' in its output ($SCRATCH/$name/out)"
        fi
    done
    [ $ok = 1 ] && PASSED=$((PASSED + 1))
}

# Whether build/venv's python imports every module named.
venv_has() {
    [ -x "$VENV/bin/python" ] || return 1
    for m in "$@"; do
        "$VENV/bin/python" -c "import $m" >/dev/null 2>&1 || return 1
    done
}

# docs/performance.md, "How to run it": the benchmark of the CPU lookup,
# with --quick, which the document names as its smoke check (under a
# minute instead of 13), then the report of its output.
if claim docs/performance.md "bench/run.sh "; then
    if ! venv_has numpy; then
        skip "docs/performance.md's 'How to run it' block: its 'pip install numpy' needs numpy in $VENV (scripts/test.sh installs it)"
    else
        prepare "$i" perf-run
        sed -i 's|^bench/run\.sh |bench/run.sh --quick |' "$SCRATCH/perf-run/block.sh"
        grep -q "^bench/run.sh --quick " "$SCRATCH/perf-run/block.sh" ||
            fail "docs/performance.md: no bench/run.sh line to run with --quick"
        run_block perf-run docs/performance.md &&
            expect perf-run docs/performance.md "^#### 256M table$" \
                "^| variant | R | thr | K | lib | naive | ceiling |" "^| private-huge | 264 | 1 | 4096 | "
    fi
fi

# docs/performance.md, section 9: bench_source as written (three runs of
# about 9 s each on two busy cores; it has no smoke run in the document).
if claim docs/performance.md "build/release/bench_source"; then
    prepare "$i" perf-source
    if run_block perf-source docs/performance.md; then
        runs=$(grep -c "^build/release/bench_source" "$SCRATCH/perf-source/block.sh")
        for row in direct source source+cache memory; do
            got=$(grep -c "^  $row  " "$SCRATCH/perf-source/out")
            [ "$got" = "$runs" ] ||
                fail "docs/performance.md's bench_source block: $got rows '$row' in the output of its $runs runs ($SCRATCH/perf-source/out)"
        done
        expect perf-source docs/performance.md "^  source vs direct: "
    fi
fi

# docs/mooncake.md, "Running a Mooncake Store": the metadata server and
# the master on free ports, in the background; they must then serve a
# client as the next paragraph says (setup, then an object put and read
# back).  A server that found its port taken meanwhile ("address already
# in use") makes the block run again with new ports, at most 3 times.
if claim docs/mooncake.md "pip install mooncake"; then
    if ! venv_has mooncake.store; then
        why="docs/mooncake.md's 'Running a Mooncake Store' block: Mooncake's wheel is not importable from $VENV (scripts/test.sh installs mooncake-transfer-engine-non-cuda and libibverbs1)"
        if [ "${ENGRAM_REQUIRE_MOONCAKE:-0}" = 1 ]; then
            fail "$why (ENGRAM_REQUIRE_MOONCAKE=1)"
        else
            skip "$why"
        fi
    else
        prepare "$i" mooncake
        try=0
        while :; do
            try=$((try + 1))
            # The block's ports, each number replaced by a free port.
            : >"$SCRATCH/mooncake/ports.sed"
            for old in $(grep -oE -e '--port[ =][0-9]+' -e '--[a-z_]*_port=[0-9]+' -e '127\.0\.0\.1:[0-9]+' \
                "$SCRATCH/blocks/$i.sh" | grep -oE '[0-9]+$' | sort -u); do
                p=$(redis_pick_port) || { fail "no free loopback port"; break 2; }
                REDIS_TAKEN="$REDIS_TAKEN $p"
                printf 's/([ =:])%s\\b/\\1%s/g\n' "$old" "$p" >>"$SCRATCH/mooncake/ports.sed"
                eval "port_$old=$p"
            done
            sed -E -f "$SCRATCH/mooncake/ports.sed" "$SCRATCH/blocks/$i.sh" >"$SCRATCH/mooncake/block.sh"
            # Never a server on a port of the document.
            if grep -qE '(--port[ =]|_port=|127\.0\.0\.1:)(8080|50051|9003)\b' "$SCRATCH/mooncake/block.sh"; then
                fail "docs/mooncake.md's block: its ports were not replaced ($SCRATCH/mooncake/block.sh)"
                break
            fi
            # The block backgrounds its servers and exits: it runs as the
            # leader of a session of its own, whose process group, its
            # servers included, stop_groups kills.
            rm -f "$SCRATCH/mooncake/pgid"
            # shellcheck disable=SC2016 # $$ is the inner shell's
            in_block_env mooncake setsid -w sh -c 'echo $$ >pgid; exec sh -e block.sh' >"$SCRATCH/mooncake/out" 2>&1
            rc=$?
            if [ -s "$SCRATCH/mooncake/pgid" ]; then
                g=$(cat "$SCRATCH/mooncake/pgid")
                GROUPS_STARTED="$GROUPS_STARTED $g"
                # scripts/test.sh checks at its end that no server the
                # tests started is still running.
                [ -n "${ENGRAM_MOONCAKE_PIDFILE:-}" ] && ps -o pid= -g "$g" >>"$ENGRAM_MOONCAKE_PIDFILE"
            fi
            if [ $rc != 0 ]; then
                tail -40 "$SCRATCH/mooncake/out"
                fail "docs/mooncake.md's block failed as written (run: $SCRATCH/mooncake/block.sh)"
                break
            fi
            # shellcheck disable=SC2154 # port_8080 and port_50051: set by eval above
            meta=${port_8080:-} rpc=${port_50051:-}
            if [ -z "$meta" ] || [ -z "$rpc" ]; then
                fail "docs/mooncake.md's block: no metadata server on port 8080 and master on 50051 to check"
                break
            fi
            if (cd "$SCRATCH/mooncake" && MC_TCP_BIND_ADDRESS=127.0.0.1 timeout 60 "$VENV/bin/python" - "$meta" "$rpc") \
                >"$SCRATCH/mooncake/client.out" 2>&1 <<'EOF'
import socket, sys, time
from mooncake.store import MooncakeDistributedStore
meta, rpc = sys.argv[1], int(sys.argv[2])
for port in (int(meta), rpc):
    end = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > end:
                sys.exit(f"nothing answers on port {port} within 30 s")
            time.sleep(0.05)
c = MooncakeDistributedStore()
rc = c.setup("127.0.0.1", f"http://127.0.0.1:{meta}/metadata", 16 << 20, 16 << 20, "tcp", "",
             f"127.0.0.1:{rpc}")
assert rc == 0, f"setup returned {rc}"
assert c.put("docs-block", b"engram") == 0
assert c.get("docs-block") == b"engram", c.get("docs-block")
c.close()
print("client: put and got an object")
EOF
            then
                PASSED=$((PASSED + 1))
                break
            fi
            stop_groups
            if [ $try -lt 3 ] && grep -qi "address already in use" "$SCRATCH/mooncake/out"; then
                continue
            fi
            tail -n 20 "$SCRATCH/mooncake/out" "$SCRATCH/mooncake/client.out"
            fail "docs/mooncake.md's block: the servers it started do not serve a client"
            break
        done
        stop_groups
    fi
fi

# Blocks marked as run here that no runner above claimed.
while read -r i doc line; do
    fail "$doc:$line: the block is marked '<!-- run by $SELF -->' but no runner of $SELF claims it"
done <"$SCRATCH/blocks/here"

total=$(wc -l <"$SCRATCH/blocks/list")
echo "docs shell blocks: $total blocks; $PASSED run here and passed"
[ $FAIL = 0 ] || exit 1
[ -z "$SKIPPED" ] || exit 77
exit 0
