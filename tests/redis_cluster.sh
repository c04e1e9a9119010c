# tests/redis_cluster.sh - sourced by the shell tests that need a Redis
# Cluster of their own (tests/cli/redis.sh, tests/docs/redis.sh).  POSIX sh.
#
# Needs $SCRATCH (a scratch directory) and a name in $TEST_NAME.
# redis_cluster_start starts three masters (no replicas) on free loopback
# ports of 127.0.0.1, joins them and waits for cluster_state:ok; on success
# $NODES is "127.0.0.1:p,127.0.0.1:q,..." and the servers' PIDs are in
# $REDIS_PIDS.  The caller's EXIT trap must call `redis_exit $?`, which
# kills every server by its PID and removes $SCRATCH, unless the test
# failed or the cluster did not come up: then it keeps it (the servers'
# logs are in $SCRATCH/redis) and says so.  redis_skip exits 77 (skipped)
# with the reason, or 1 with ENGRAM_REQUIRE_REDIS=1.
#
# Ports: a server binds its port p and its cluster bus port p + 10000.
# Both are picked below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range), where the client side of the
# other tests' connections and their TIME_WAIT sockets never are, and
# only if no TCP socket has them (/proc/net/tcp, tcp6: a probe with
# redis-cli would not see a client's socket).  A port another process
# takes meanwhile makes the server exit with "Address already in use" in
# its log: the cluster is then started again at once with new ports.
# The node timeout is 15 s (no replicas, so no failover to wait for): a
# server descheduled on a busy machine is not failed by the others.

REDIS_PIDS=""
REDIS_TAKEN=""
REDIS_WHY=""
REDIS_KEEP=0

redis_skip() {
    REDIS_KEEP=1
    if [ "${ENGRAM_REQUIRE_REDIS:-0}" = 1 ]; then
        echo "$TEST_NAME: FAIL: $1 (ENGRAM_REQUIRE_REDIS=1)" >&2
        [ -f "$SCRATCH/redis/create.log" ] && tail -5 "$SCRATCH/redis/create.log" >&2
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

# For the caller's EXIT trap, with the script's exit status.
redis_exit() {
    redis_cluster_stop
    if [ "$REDIS_KEEP" = 1 ] || { [ "$1" != 0 ] && [ "$1" != 77 ]; }; then
        echo "$TEST_NAME: its files and the Redis servers' logs are kept in $SCRATCH" >&2
    else
        rm -rf "$SCRATCH"
    fi
}

# Whether a TCP socket of any state has local port $1.
redis_port_used() {
    awk -v h=":$(printf '%04X' "$1")" \
        'FNR > 1 && substr($2, length($2) - 4) == h { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# A port p, p + 10000 both free and below the ephemeral range, neither in
# $REDIS_TAKEN nor a bus port of one there.
redis_pick_port() {
    # (Read whole: a sysctl file read a byte at a time, as sh's read does,
    # ends after its first byte.)
    eph=$(cat /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
    eph=${eph%%[!0-9]*}
    [ -n "$eph" ] || eph=32768
    lo=11000
    hi=$((eph - 10001))
    if [ "$hi" -lt $((lo + 64)) ]; then
        # No room below the range: anywhere, with the checks and retries.
        lo=20000
        hi=44999
    fi
    n=0
    while [ $n -lt 4000 ]; do
        n=$((n + 1))
        r=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
        p=$((lo + r % (hi - lo + 1)))
        case " $REDIS_TAKEN " in
        *" $p "* | *" $((p + 10000)) "* | *" $((p - 10000)) "*) continue ;;
        esac
        if ! redis_port_used "$p" && ! redis_port_used $((p + 10000)); then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# One try: 0 when the cluster is up, 2 when a server could not bind its
# ports (try again at once), 1 otherwise ($REDIS_WHY says).
redis_cluster_try() {
    NODES=""
    REDIS_TAKEN=""
    addrs=""
    hosts=""
    mkdir -p "$SCRATCH/redis"
    for _ in 1 2 3; do
        port=$(redis_pick_port) || { REDIS_WHY="no free loopback port"; return 1; }
        REDIS_TAKEN="$REDIS_TAKEN $port"
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 15000 \
            --dir "$SCRATCH/redis" --save "" --appendonly no \
            --logfile "$SCRATCH/redis/server-$port.log" --daemonize no >/dev/null 2>&1 &
        REDIS_PIDS="$REDIS_PIDS $!"
        addrs="$addrs $!@127.0.0.1:$port"
        hosts="$hosts 127.0.0.1:$port"
        NODES="${NODES:+$NODES,}127.0.0.1:$port"
    done
    for a in $addrs; do
        pid=${a%@*}
        port=${a##*:}
        n=0
        until redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; do
            if ! kill -0 "$pid" 2>/dev/null; then
                log=$SCRATCH/redis/server-$port.log
                if grep -q 'Address already in use' "$log" 2>/dev/null; then
                    REDIS_WHY="redis-server on port $port could not bind its ports: Address already in use (its log: $log)"
                    return 2
                fi
                REDIS_WHY="redis-server on port $port exited (its log: $log)"
                return 1
            fi
            n=$((n + 1))
            if [ $n -gt 300 ]; then
                REDIS_WHY="redis-server on port $port did not answer within 30 s"
                return 1
            fi
            sleep 0.1
        done
    done
    # shellcheck disable=SC2086
    if ! redis-cli --cluster create $hosts \
        --cluster-replicas 0 --cluster-yes >>"$SCRATCH/redis/create.log" 2>&1; then
        REDIS_WHY="redis-cli --cluster create failed (see $SCRATCH/redis/create.log)"
        return 1
    fi
    for a in $addrs; do
        port=${a##*:}
        n=0
        until redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null |
            grep -q 'cluster_state:ok'; do
            n=$((n + 1))
            if [ $n -gt 1200 ]; then
                REDIS_WHY="the node on port $port did not reach cluster_state:ok within 120 s"
                return 1
            fi
            sleep 0.1
        done
    done
    return 0
}

# redis_cluster_up: starts the cluster, trying again on new ports; 0 when
# it is up ($NODES), else 1 with the reason in $REDIS_WHY (no exit: a
# caller that has other work, a benchmark run, goes on without it).
redis_cluster_up() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        REDIS_WHY="redis-server or redis-cli not found (scripts/setup.sh installs them)"
        return 1
    fi
    tries=0
    rebinds=0
    while :; do
        redis_cluster_try
        rc=$?
        [ $rc = 0 ] && return 0
        redis_cluster_stop
        if [ $rc = 2 ] && [ $rebinds -lt 20 ]; then
            # A port taken since it was found free: new ones, at once.
            rebinds=$((rebinds + 1))
            continue
        fi
        tries=$((tries + 1))
        if [ $tries -ge 3 ]; then
            REDIS_WHY="the cluster did not come up: $REDIS_WHY (logs kept in $SCRATCH/redis)"
            return 1
        fi
    done
}

# redis_cluster_start: redis_cluster_up, or the test skips with the reason.
redis_cluster_start() {
    redis_cluster_up || redis_skip "$REDIS_WHY"
}
