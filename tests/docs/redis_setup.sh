#!/bin/sh
# Runs the shell blocks of docs/redis.md that a reader runs as written:
# the cluster setup of "Setup" (six servers, three masters with a replica
# each), the CLI block of "From the CLI and Python", and the pull blocks
# of "Pulling a namespace to local memory" (pull, verify --origin and the
# nearest tier), on free
# loopback ports of 127.0.0.1 instead of 7000-7005 (the ports are the only
# change, with the setup's data directory moved into a scratch directory
# and the CLI given a scratch --root), and checks what they print.  The
# pull blocks run on a second root, another node's, after the CLI block's
# namespace is pushed again (its block ends by removing the table from the
# cluster).
# Every server the block starts is stopped by the PID in its pidfile at
# exit, however the script ends; the scratch directory, with the servers'
# logs, is kept when the script fails.  Skips (77) without redis-server,
# unless ENGRAM_REQUIRE_REDIS=1.
# Env: ENGRAM_SRC (source dir), ENGRAM_BIN (the engram binary).
set -u
doc=$ENGRAM_SRC/docs/redis.md
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/engram-docs-redis-setup.XXXXXX") || exit 2
TEST_NAME=docs_redis_setup
# shellcheck source=../redis_cluster.sh
. "$ENGRAM_SRC/tests/redis_cluster.sh"
DATA=$SCRATCH/data
# The servers daemonize: they are not children of this script, so they
# are stopped by the PIDs they wrote.
stop_servers() {
    for f in "$DATA"/*/redis.pid; do
        [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
    done
}
trap 'rc=$?; stop_servers; redis_exit $rc' EXIT
trap 'exit 130' INT TERM
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 ||
    redis_skip "redis-server or redis-cli not found (scripts/setup.sh installs them)"

# The ```sh block of the section, the first one with $2 in it.
block() {
    awk -v sec="$1" -v want="$2" '
        $0 == sec { s = 1; next }
        s && /^## / { exit }
        s && /^```sh$/ { on = 1; b = ""; next }
        on && /^```$/ { on = 0; if (index(b, want)) { printf "%s", b; exit } next }
        on { b = b $0 "\n" }' "$doc"
}
block "## Setup" "redis-server --port" >"$SCRATCH/setup.sh"
block "## From the CLI and Python" "engram push" >"$SCRATCH/cli.sh"
block "## Pulling a namespace to local memory" "engram pull model-x t " >"$SCRATCH/pull.sh"
block "## Pulling a namespace to local memory" "copies to /dev/shm" >"$SCRATCH/tier.sh"
block "## Pulling a namespace to local memory" "verify --all --origin" >"$SCRATCH/origin.sh"
[ -s "$SCRATCH/setup.sh" ] || { echo "no cluster setup block in $doc"; exit 1; }
[ -s "$SCRATCH/cli.sh" ] || { echo "no CLI block in $doc"; exit 1; }
[ -s "$SCRATCH/pull.sh" ] || { echo "no pull block in $doc"; exit 1; }
[ -s "$SCRATCH/tier.sh" ] || { echo "no pull block of the nearest tier in $doc"; exit 1; }
[ -s "$SCRATCH/origin.sh" ] || { echo "no verify --origin block in $doc"; exit 1; }

# Six free ports (each with its bus port + 10000 free), for 7000..7005.
ports=""
map=""
i=0
for old in 7000 7001 7002 7003 7004 7005; do
    p=$(redis_pick_port) || redis_skip "no free loopback port"
    REDIS_TAKEN="$REDIS_TAKEN $p"
    ports="$ports $p"
    map="$map -e s/$old/$p/g"
    i=$((i + 1))
done
first=${ports# }
first=${first%% *}
# shellcheck disable=SC2086
sed $map -e "s|^dir=.*|dir=$DATA|" \
    -e "s|--daemonize yes|--daemonize yes --pidfile $DATA/\$p/redis.pid --logfile $DATA/\$p/server.log|" \
    "$SCRATCH/setup.sh" >"$SCRATCH/setup.run.sh"
grep -q "pidfile" "$SCRATCH/setup.run.sh" || { echo "the setup block starts no daemonized server"; exit 1; }
if ! (cd "$SCRATCH" && sh -e setup.run.sh) >"$SCRATCH/setup.log" 2>&1; then
    REDIS_KEEP=1
    cat "$SCRATCH/setup.log"
    echo "docs/redis.md's cluster setup failed as written (run: $SCRATCH/setup.run.sh)"
    exit 1
fi
for p in $ports; do
    n=0
    until redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; do
        n=$((n + 1))
        if [ $n -gt 1200 ]; then
            echo "the node on port $p did not reach cluster_state:ok within 120 s"
            exit 1
        fi
        sleep 0.1
    done
done

# shellcheck disable=SC2086
sed $map -e "s|^engram |\"$ENGRAM_BIN\" --root $SCRATCH/root |" "$SCRATCH/cli.sh" >"$SCRATCH/cli.run.sh"
if ! (cd "$SCRATCH" && sh -e cli.run.sh) >"$SCRATCH/cli.out" 2>&1; then
    cat "$SCRATCH/cli.out"
    echo "docs/redis.md's CLI block failed as written (run: $SCRATCH/cli.run.sh)"
    exit 1
fi
fail=0
for want in "^created t: 1000 rows of 264 bytes" "^t: pushed 1000 rows of 264 bytes" \
    "^t  *1000  *264 " "^999: " "^-1: dead$" "^t: OK$" "^removed t$"; do
    if ! grep -q -e "$want" "$SCRATCH/cli.out"; then
        echo "docs/redis.md's CLI block: no line matching '$want' in its output:"
        cat "$SCRATCH/cli.out"
        fail=1
    fi
done
[ $fail = 0 ] || exit 1

# The pull blocks, on the root of another node: the namespace pushed
# again from the CLI block's root first.
if ! "$ENGRAM_BIN" --root "$SCRATCH/root" push model-x --redis "127.0.0.1:$first" >"$SCRATCH/push.out" 2>&1; then
    cat "$SCRATCH/push.out"
    echo "pushing model-x again for the pull blocks failed"
    exit 1
fi
# run_pull NAME: runs $SCRATCH/NAME.sh with the ports and the root of the
# second node, its output in $SCRATCH/NAME.out.
run_pull() {
    # shellcheck disable=SC2086
    sed $map -e "s|^engram |\"$ENGRAM_BIN\" --root $SCRATCH/node2 |" "$SCRATCH/$1.sh" >"$SCRATCH/$1.run.sh"
    if ! (cd "$SCRATCH" && sh -e "$1.run.sh") >"$SCRATCH/$1.out" 2>&1; then
        cat "$SCRATCH/$1.out"
        echo "docs/redis.md's $1 block failed as written (run: $SCRATCH/$1.run.sh)"
        exit 1
    fi
}
# expect NAME PATTERN...: every pattern matches a line of $SCRATCH/NAME.out.
expect() {
    name=$1
    shift
    for want in "$@"; do
        if ! grep -q -e "$want" "$SCRATCH/$name.out"; then
            echo "docs/redis.md's $name block: no line matching '$want' in its output:"
            cat "$SCRATCH/$name.out"
            fail=1
        fi
    done
}
run_pull pull
expect pull "^t: pulled (" "^t: already here with the same rows (" "^0: " "^999: "
run_pull origin
expect origin "^t: OK, as namespace 'model-x' of 127.0.0.1:$first publishes it"
run_pull tier
expect tier "^t: already here with the same rows ("
[ $fail = 0 ] || exit 1
echo "docs redis.md setup, CLI and pull blocks: 5 passed, 0 failed"
