#!/bin/sh
# Compiles the C example of docs/redis.md against the built library, runs
# it (its pull into a root in the scratch directory) on a Redis Cluster of
# three masters this script starts on loopback
# ports (tests/redis_cluster.sh; every server stopped by its PID at exit,
# the servers' logs kept when the script fails),
# and checks that it prints the ```text block that follows it.  Skips
# (77) without redis-server, unless ENGRAM_REQUIRE_REDIS=1.
# Env: ENGRAM_SRC (source dir), ENGRAM_LIB (static library), ENGRAM_LIB_DEPS (more
# libraries it needs), CC (optional),
# EXTRA_CFLAGS (the sanitizer flags of the build).
set -u
doc=$ENGRAM_SRC/docs/redis.md
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/engram-docs-redis.XXXXXX") || exit 2
TEST_NAME=docs_redis
# shellcheck source=../redis_cluster.sh
. "$ENGRAM_SRC/tests/redis_cluster.sh"
trap 'redis_exit $?' EXIT
trap 'exit 130' INT TERM
awk '/^```c$/{on=1; next} /^```$/{if(on) exit} on' "$doc" > "$SCRATCH/example.c"
awk '/^```c$/{c=1} /^```text$/{if(c) {on=1; next}} /^```$/{if(on) exit} on' "$doc" > "$SCRATCH/expected"
[ -s "$SCRATCH/example.c" ] || { echo "no C example in $doc"; exit 1; }
[ -s "$SCRATCH/expected" ] || { echo "no expected output after the C example in $doc"; exit 1; }
# shellcheck disable=SC2086
${CC:-cc} -std=c11 ${EXTRA_CFLAGS:-} -Wall -Wextra -Werror -I"$ENGRAM_SRC/include" \
  "$SCRATCH/example.c" "$ENGRAM_LIB" ${ENGRAM_LIB_DEPS:-} -lhiredis -lxxhash -luring -lcjson -lpthread -lm \
  -o "$SCRATCH/example" || exit 1
redis_cluster_start
mkdir -p "$SCRATCH/root"
"$SCRATCH/example" "$NODES" "$SCRATCH/root" > "$SCRATCH/got" || { echo "the example failed"; exit 1; }
if ! cmp -s "$SCRATCH/got" "$SCRATCH/expected"; then
  printf '%s example printed:\n' "$doc"; cat "$SCRATCH/got"
  printf 'expected:\n'; cat "$SCRATCH/expected"
  exit 1
fi
echo "docs example redis.md: 1 passed, 0 failed"
