#!/bin/sh
# Compiles and runs the C example of README.md against the built library
# and checks what it prints, so the README cannot drift from the API.
# Env: ENGRAM_SRC (source dir), ENGRAM_LIB (static library), ENGRAM_LIB_DEPS (more
# libraries it needs, e.g. -lnuma), CC (optional).
set -eu
scratch=$(mktemp -d)
trap 'chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"' EXIT
# The first ```c block of the README, with its root moved into the scratch dir.
awk '/^```c$/{on=1; next} /^```$/{if(on) exit} on' "$ENGRAM_SRC/README.md" |
  sed "s|/tmp/engram-readme|$scratch/root|" > "$scratch/example.c"
[ -s "$scratch/example.c" ] || { echo "no C example found in README.md"; exit 1; }
${CC:-cc} -std=c11 ${EXTRA_CFLAGS:-} -Wall -Wextra -Werror -I"$ENGRAM_SRC/include" "$scratch/example.c" \
  "$ENGRAM_LIB" ${ENGRAM_LIB_DEPS:-} -lxxhash -luring -lcjson -lpthread -o "$scratch/example"
expected="18 16 238 0
ids[1][0] = 17 is outside table 'engram:l1:h0' (0 <= id < 17)
token 1 column 0"
for run in first second; do   # the second run finds the tables already stored
  got=$("$scratch/example")
  if [ "$got" != "$expected" ]; then
    printf 'README example (%s run) printed:\n%s\nexpected:\n%s\n' "$run" "$got" "$expected"
    exit 1
  fi
done
echo "readme: 1 passed, 0 failed"
