# tests/redis_cluster.sh - sourced by the shell tests that need a Redis
# Cluster of their own (tests/cli/redis.sh, tests/docs/redis.sh).  POSIX sh.
#
# Needs $SCRATCH (a scratch directory the caller removes) and a name in
# $TEST_NAME.  redis_cluster_start starts three masters (no replicas) on
# free loopback ports of 127.0.0.1, joins them and waits for
# cluster_state:ok; on success $NODES is "127.0.0.1:p,127.0.0.1:q,..." and
# the servers' PIDs are in $REDIS_PIDS.  The caller's EXIT trap must call
# redis_cluster_stop, which kills every server by its PID.  redis_skip
# exits 77 (skipped) with the reason, or 1 with ENGRAM_REQUIRE_REDIS=1.

REDIS_PIDS=""

redis_skip() {
    if [ "${ENGRAM_REQUIRE_REDIS:-0}" = 1 ]; then
        echo "$TEST_NAME: FAIL: $1 (ENGRAM_REQUIRE_REDIS=1)" >&2
        [ -f "$SCRATCH/create.log" ] && tail -5 "$SCRATCH/create.log" >&2
        exit 1
    fi
    echo "$TEST_NAME: SKIP: $1"
    exit 77
}

redis_cluster_stop() {
    for p in $REDIS_PIDS; do
        kill -9 "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    REDIS_PIDS=""
}

# A port p whose cluster bus port p + 10000 is free too: nothing answers on
# either (random in 20000..44999).
redis_pick_port() {
    while :; do
        r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
        p=$((20000 + r % 25000))
        if ! redis-cli -h 127.0.0.1 -p "$p" ping >/dev/null 2>&1 &&
            ! redis-cli -h 127.0.0.1 -p $((p + 10000)) ping >/dev/null 2>&1; then
            echo "$p"
            return
        fi
    done
}

redis_cluster_try() {
    NODES=""
    addrs=""
    for i in 1 2 3; do
        port=$(redis_pick_port)
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 2000 \
            --dir "$SCRATCH" --save "" --appendonly no --logfile "$SCRATCH/server-$port.log" \
            --daemonize no >/dev/null 2>&1 &
        REDIS_PIDS="$REDIS_PIDS $!"
        addrs="$addrs 127.0.0.1:$port"
        NODES="${NODES:+$NODES,}127.0.0.1:$port"
    done
    for a in $addrs; do
        n=0
        until redis-cli -h 127.0.0.1 -p "${a#*:}" ping >/dev/null 2>&1; do
            n=$((n + 1))
            [ $n -gt 100 ] && return 1
            sleep 0.1
        done
    done
    # shellcheck disable=SC2086
    redis-cli --cluster create $addrs --cluster-replicas 0 --cluster-yes \
        >"$SCRATCH/create.log" 2>&1 || return 1
    for a in $addrs; do
        n=0
        until redis-cli -h 127.0.0.1 -p "${a#*:}" cluster info 2>/dev/null |
            grep -q 'cluster_state:ok'; do
            n=$((n + 1))
            [ $n -gt 200 ] && return 1
            sleep 0.1
        done
    done
    return 0
}

redis_cluster_start() {
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 ||
        redis_skip "redis-server or redis-cli not found (scripts/setup.sh installs them)"
    tries=0
    until redis_cluster_try; do
        redis_cluster_stop
        tries=$((tries + 1))
        [ $tries -ge 3 ] && redis_skip "the cluster did not come up (logs in $SCRATCH)"
    done
}
