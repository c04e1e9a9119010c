#!/bin/sh
# Compiles and runs the C example of a document (docs/sources.md by
# default) against the built library, and checks that it prints the
# ```text block that follows it in the document, so the docs cannot
# drift from the API.
# Env: ENGRAM_SRC (source dir), ENGRAM_LIB (static library), ENGRAM_LIB_DEPS (more
# libraries it needs), CC (optional),
# EXTRA_CFLAGS (the sanitizer flags of the build).  Argument: the document.
set -eu
doc=${1:-$ENGRAM_SRC/docs/sources.md}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
awk '/^```c$/{on=1; next} /^```$/{if(on) exit} on' "$doc" > "$scratch/example.c"
awk '/^```c$/{c=1} /^```text$/{if(c) {on=1; next}} /^```$/{if(on) exit} on' "$doc" > "$scratch/expected"
[ -s "$scratch/example.c" ] || { echo "no C example in $doc"; exit 1; }
[ -s "$scratch/expected" ] || { echo "no expected output after the C example in $doc"; exit 1; }
${CC:-cc} -std=c11 ${EXTRA_CFLAGS:-} -Wall -Wextra -Werror -I"$ENGRAM_SRC/include" "$scratch/example.c" \
  "$ENGRAM_LIB" ${ENGRAM_LIB_DEPS:-} -lxxhash -luring -lcjson -lpthread -o "$scratch/example"
"$scratch/example" > "$scratch/got"
if ! cmp -s "$scratch/got" "$scratch/expected"; then
  printf '%s example printed:\n' "$doc"; cat "$scratch/got"
  printf 'expected:\n'; cat "$scratch/expected"
  exit 1
fi
echo "docs example $(basename "$doc"): 1 passed, 0 failed"
