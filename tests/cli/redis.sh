#!/bin/sh
# tests/cli/redis.sh - the `engram` tool on a Redis Cluster: push, and
# create, ls, info, lookup, verify and rm with --redis, compared with the
# same commands on the local namespace the tables came from.
#
# Starts its own cluster of three masters (no replicas) on free loopback
# ports of 127.0.0.1 (tests/redis_cluster.sh), in a scratch directory, and
# stops every server by the PID it started at exit, however the script
# ends (trap); the scratch directory, with the servers' logs, is kept when
# the script fails.  Skips (exit
# 77) without redis-server and redis-cli, unless ENGRAM_REQUIRE_REDIS=1.
# Prints one line per failure and ends with "cli_redis: N passed, M
# failed"; exits 0 only when nothing failed.  POSIX sh only.

set -u

if [ -z "${ENGRAM_BIN:-}" ] || [ ! -x "$ENGRAM_BIN" ]; then
    echo "cli_redis: set ENGRAM_BIN to the engram binary" >&2
    exit 2
fi
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/engram-cli-redis.XXXXXX") || exit 2
TEST_NAME=cli_redis
# shellcheck source=../redis_cluster.sh
. "$(dirname "$0")/../redis_cluster.sh"
trap 'redis_exit $?' EXIT
trap 'exit 130' INT TERM
CLI_TESTS=$(cd "$(dirname "$0")" && pwd)
cd "$SCRATCH" || exit 2
ROOT=$SCRATCH/root
redis_cluster_start

# shellcheck source=lib.sh
. "$CLI_TESTS/lib.sh"
ok() { [ "$rc" -eq 0 ]; }
status_is() { [ "$rc" -eq "$1" ]; }

# The local namespace "m": a 264-byte table and a padded 16-byte one.
run --ns m create a --rows 100 --row-bytes 264 --seed 7
check "create a" ok
run --ns m create b --rows 50 --row-bytes 16 --pitch 32 --fill random --seed 3
check "create b" ok

run push m --redis "$NODES"
check "push m" ok
check "push m: a pushed" out_has "^a: pushed 100 rows of 264 bytes"
check "push m: b pushed" out_has "^b: pushed 50 rows of 16 bytes"
run push m --redis "$NODES"
check "push m again" ok
check "push m again: skipped" out_has "^a: already in the cluster with the same rows, skipped"

run --redis "$NODES" --ns m ls
check "ls" ok
check "ls: a" out_has "^a  *100  *264  *264 "
check "ls: b, packed" out_has "^b  *50  *16  *16 "
run --redis "$NODES" --ns m ls --json
check "ls --json: kind redis" out_has '"kind": "redis"'

# A namespace the cluster does not have is an error, as a missing
# directory is, not an empty listing.
run --redis "$NODES" --ns missing ls
check "ls of a missing namespace -> 1" eval 'fails_with 1 "ls: namespace .missing. does not exist in the Redis Cluster at $NODES (no tables there)" && [ ! -s out ]'
run --redis "$NODES" --ns missing verify --all
check "verify --all of a missing namespace -> 1" eval 'fails_with 1 "verify: namespace .missing. does not exist in the Redis Cluster"'

# info of a cluster's table: no fields of a mapping in this process (it has none).
run --redis "$NODES" --ns m info a
check "info (text)" eval 'ok && out_has "^num_rows  *100$" && out_has "^lookups "'
check "info (text): no mapping or residency" \
    eval '! grep -q -e "^mapped" -e "^private_copy" -e "^resident_bytes" -e "^huge_bytes" -e "^map_m" -e "^numa_placement" out'
run --redis "$NODES" --ns m info a --json
check "info --json: mapping fields null" \
    eval 'ok && out_has "\"mapped\": null" && out_has "\"resident_bytes\": null" && out_has "\"map_minor_faults\": null" && out_has "\"placement\": null"'

run --ns m info a --json
local_sum=$(grep '"checksum"' out)
run --redis "$NODES" --ns m info a --json
check "info" ok
check "info: kind" out_has '"kind": "redis"'
check "info: path" out_has "\"path\": \"redis://$NODES/m/a\""
check "info: the local table's checksum" out_has "$local_sum"

for t in "a 0 99 -1 50 50" "b 49 0 17"; do
    # shellcheck disable=SC2086
    run --ns m lookup $t
    cp out local.out
    # shellcheck disable=SC2086
    run --redis "$NODES" --ns m lookup $t
    check "lookup $t" ok
    check "lookup $t: the local rows" cmp -s out local.out
done

run --redis "$NODES" --ns m lookup a 100
check "lookup: a bad id" status_is 1
check "lookup: a bad id named" err_has "100"

run --redis "$NODES" --ns m verify --all
check "verify --all" ok
check "verify: a OK" out_has "^a: OK"

# A listed table that lost a chunk: verify says so, and push does not skip it.
rcli() { n=${NODES%%,*}; redis-cli -c -h 127.0.0.1 -p "${n#*:}" "$@"; }
lost=
for a in $(echo "$NODES" | tr , ' '); do
    lost=$(redis-cli -h 127.0.0.1 -p "${a#*:}" --scan --pattern 'engram/m/a/*' | head -n 1)
    if [ -n "$lost" ]; then
        redis-cli -h 127.0.0.1 -p "${a#*:}" del "$lost" >/dev/null
        break
    fi
done
check "a chunk of a deleted" [ -n "$lost" ]
run --redis "$NODES" --ns m verify a
check "verify: not whole" status_is 1
check "verify: not whole, said" err_has "is listed, but its data is not whole"
run push m a --redis "$NODES"
check "push of a listed table that is not whole" status_is 1
check "push: not whole, said" err_has "not whole"
check "push: how to mend" err_has "rm a' and push again"
run --redis "$NODES" --ns m rm a
run push m a --redis "$NODES"
check "push after mending" ok
run --redis "$NODES" --ns m verify a
check "verify after mending" ok

# A check of the chunks that fails for another reason (here a user who
# may read the table list but not the chunks) says nothing of the data:
# push must not call the table broken and tell to remove it.
for a in $(echo "$NODES" | tr , ' '); do
    redis-cli -h 127.0.0.1 -p "${a#*:}" acl setuser listonly on '>pw-list' \
        '~engram/m/.manifests' +@read +@connection '+cluster|slots' >/dev/null
done
ENGRAM_REDIS_USER=listonly ENGRAM_REDIS_PASSWORD=pw-list
export ENGRAM_REDIS_USER ENGRAM_REDIS_PASSWORD
run push m a --redis "$NODES"
unset ENGRAM_REDIS_USER ENGRAM_REDIS_PASSWORD
check "push, chunks not readable" status_is 1
check "push, chunks not readable: why" err_has "NOPERM"
check "push, chunks not readable: not called broken" sh -c '! grep -q "not whole" err'
check "push, chunks not readable: no removal advised" sh -c '! grep -q " rm a" err'

# gc of the cluster's namespace: what a dead removal left (a closed
# pending record naming two chunks of a tagged table) goes; a dry run
# only says so.
rec=$(printf 'engram-pending 1\nstate closed\nname zz\nepoch 00000000000000aa\nchunks 2\nlayout tagged\nttl_ms 1000\nstamp 1\n')
rcli hset engram/m/.manifests zz "$rec
" >/dev/null
rcli set 'engram/m/{zz/00000000000000aa}/0' x >/dev/null
rcli set 'engram/m/{zz/00000000000000aa}/1' y >/dev/null
run --redis "$NODES" --ns m gc --dry-run
check "gc --dry-run" ok
check "gc --dry-run: says" out_has "^would delete zz: would delete the 2 chunks"
check "gc --dry-run: summary" out_has "^would delete 1, kept 0, failed 0"
check "gc --dry-run: kept the chunks" [ "$(rcli exists 'engram/m/{zz/00000000000000aa}/1')" = 1 ]
run --redis "$NODES" --ns m gc --json
check "gc --json" ok
check "gc --json: deleted" out_has '"action": "deleted"'
check "gc: the chunks are gone" [ "$(rcli exists 'engram/m/{zz/00000000000000aa}/0' 'engram/m/{zz/00000000000000aa}/1')" = 0 ]
check "gc: the record is gone" [ "$(rcli hexists engram/m/.manifests zz)" = 0 ]
run --redis "$NODES" --ns m gc
check "gc: nothing left" out_has "^deleted 0, kept 0, failed 0"
run --redis "$NODES" gc
check "gc --redis without --ns" status_is 2
run --redis "$NODES" --ns m gc --older-than 1x
check "gc --redis: a bad duration" status_is 2

# Another table of the same name: refused; after rm, pushed.
run --ns m rm a
run --ns m create a --rows 100 --row-bytes 264 --seed 8
run push m a --redis "$NODES"
check "push of other rows" status_is 1
check "push of other rows: why" err_has "holds another table of that name"
run --redis "$NODES" --ns m rm a
check "rm" ok
run --redis "$NODES" --ns m ls
check "rm: gone" sh -c '! grep -q "^a " out'
run push m a --redis "$NODES"
check "push after rm" ok
run --ns m lookup a 3 4
cp out local.out
run --redis "$NODES" --ns m lookup a 3 4
check "push after rm: the new rows" cmp -s out local.out

# Tables written straight to the cluster.
run --redis "$NODES" --ns other create c --rows 10 --row-bytes 8
check "create on the cluster" ok
run --redis "$NODES" --ns other lookup c 3 -1
check "lookup of a created table" ok
check "lookup of a created table: its pattern" out_has "^3: 03 00 00 00 00 00 00 00$"
check "lookup of a created table: dead" out_has "^-1: dead$"
run --redis "$NODES" --ns other create c --rows 10 --row-bytes 8
check "create-only" status_is 1
check "create-only: why" err_has "already exists"

# pull: the cluster's namespace "m" copied into local namespace "m" of a
# root of its own, then read there with the same rows; again, kept;
# another table of a name there, refused; a namespace without tables
# and a table the cluster lacks, refused before a namespace is made.
SRC_ROOT=$ROOT
ROOT=$SCRATCH/pulled
run pull pm --redis "$NODES"
check "pull of a namespace with no tables" status_is 1
check "pull of a namespace with no tables: why" err_has "no tables"
check "pull of a namespace with no tables: nothing made" [ ! -e "$SCRATCH/pulled/pm" ]
run pull m --redis "$NODES"
check "pull m" ok
check "pull m: a pulled" out_has "^a: pulled ("
check "pull m: b pulled" out_has "^b: pulled ("
run --ns m lookup a 3 4
check "pull m: a's rows" cmp -s out local.out
run --ns m verify --all
check "pull m: verify" ok
run --ns m info b --json
check "pull m: b packed" out_has '"row_pitch": 16'
check "pull m: b's origin" out_has '"origin": {"store": "redis", "namespace": "m", "epoch": "[0-9a-f]*", "where": "'"$NODES"'"}'
run --ns m info a
check "pull m: a's origin" out_has "^origin  *redis namespace 'm' at $NODES, epoch [0-9a-f]*$"
run --redis "$NODES" --ns m info a --json
check "the cluster's table: its origin" out_has '"origin": {"store": "redis", "namespace": "m"'
run --ns m verify a b --origin
check "verify --origin" ok
check "verify --origin: a current" out_has "^a: OK, as namespace 'm' of $NODES publishes it"
run --ns m verify --all --origin --redis "${NODES%%,*}"
check "verify --origin at other nodes" ok
check "verify --origin at other nodes: where" out_has "^b: OK, as namespace 'm' of ${NODES%%,*} "
run pull m --redis "$NODES"
check "pull m again" ok
check "pull m again: kept" out_has "^a: already here with the same rows ("
run --ns m rm b
run --ns m create b --rows 5 --row-bytes 16
run pull m b --redis "$NODES"
check "pull over other rows" status_is 1
check "pull over other rows: why" err_has "holds other rows"
run --ns m verify b --origin
check "verify --origin of a table not pulled" status_is 1
check "verify --origin of a table not pulled: FAILED" out_has "^b: FAILED$"
check "verify --origin of a table not pulled: why" err_has "records no origin"
# The cluster's copy of a pulled table removed, then pushed again with
# the same rows: gone, then republished (OK).
run --redis "$NODES" --ns m rm a
run --ns m verify a --origin
check "verify --origin, removed" status_is 1
check "verify --origin, removed: why" err_has "no longer has this table"
run push m a --redis "$NODES"
check "push it again" ok
run --ns m verify a --origin
check "verify --origin, republished" ok
check "verify --origin, republished: says so" out_has "^a: OK, namespace 'm' of .* published it again with the same rows$"
run pull other nosuch --redis "$NODES"
check "pull of a missing table" status_is 1
check "pull of a missing table: why" err_has "nosuch"
check "pull of a missing table: no namespace made" [ ! -e "$SCRATCH/pulled/other" ]
# A table of the cluster that lost a chunk: the pull fails, says why, and
# the namespace it made goes again.
run --redis "$NODES" --ns dmg create z --rows 20000 --row-bytes 264
check "create a table to damage" ok
for a in $(echo "$NODES" | tr , ' '); do
    k=$(redis-cli -h 127.0.0.1 -p "${a#*:}" --scan --pattern 'engram/dmg/z/*' | head -n 1)
    if [ -n "$k" ]; then
        redis-cli -h 127.0.0.1 -p "${a#*:}" del "$k" >/dev/null
        break
    fi
done
run pull dmg --redis "$NODES"
check "pull of a damaged table" status_is 1
check "pull of a damaged table: why" err_has "not whole"
check "pull of a damaged table: no namespace left" [ ! -e "$SCRATCH/pulled/dmg" ]
run pull m
check "pull without --redis" status_is 2
run --ns m pull m --redis "$NODES"
check "pull with --ns" status_is 2
run pull m ../x --redis "$NODES"
check "pull of a bad name" status_is 2

ROOT=$SRC_ROOT

# Usage and failures.
run push m
check "push without --redis" status_is 2
run --ns m push m --redis "$NODES"
check "push with --ns" status_is 2
run --redis "$NODES" demo --small
check "demo --redis" status_is 2
run --redis nohost ls
check "a bad node list" status_is 1
check "a bad node list: why" err_has "not host:port"
run --redis 127.0.0.1:1 ls
check "no cluster" status_is 1
check "no cluster: why" err_has "127.0.0.1:1"

summary cli_redis
[ "$FAIL" -eq 0 ]
