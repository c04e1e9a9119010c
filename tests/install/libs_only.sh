#!/bin/sh
# Configures a scratch build with the README's command for "only the
# libraries and the CLI" (section "Build and install with CMake", its
# first cmake line, as written but for the build directory, and without
# CUDA to keep it short) and checks that the build it sets up holds the
# libraries and the CLI and nothing else: no test, benchmark or fuzz
# target, and no CTest entry.
# Env: ENGRAM_SRC (source dir), CMAKE (cmake).
set -eu
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
line=$(awk '/only the libraries and the CLI:/ { s = 1 } s && /^cmake -S / { print; exit }' \
    "$ENGRAM_SRC/README.md")
[ -n "$line" ] || { echo "libs_only: no 'cmake -S' line after 'only the libraries and the CLI:' in README.md"; exit 1; }
case $line in
*"-DBUILD_TESTING=OFF"*) ;;
*) echo "libs_only: the README's command does not leave the tests out: $line"; exit 1 ;;
esac
# The README's arguments after "cmake", with its build directory moved.
args=$(printf '%s\n' "${line#cmake }" | sed "s|build/release|$scratch/build|")
cd "$ENGRAM_SRC"
# shellcheck disable=SC2086
"${CMAKE:-cmake}" $args -DENGRAM_CUDA=OFF >"$scratch/configure.log" 2>&1 ||
    { cat "$scratch/configure.log"; echo "libs_only: configure failed"; exit 1; }
# Every target has its directory CMakeFiles/<target>.dir, whatever the
# generator, under the build directory of the part that defines it
# (src/, tools/, ...).
targets=$(cd "$scratch/build" && find . -path '*/CMakeFiles/*.dir' -prune -type d |
    sed 's|.*/||; s/\.dir$//' | sort | tr '\n' ' ')
if [ "$targets" != "engram engram_cli engram_static " ]; then
    echo "libs_only: the build has targets besides the libraries and the CLI: $targets"
    exit 1
fi
if find "$scratch/build" -name CTestTestfile.cmake -exec grep -l add_test {} + 2>/dev/null |
    grep -q .; then
    echo "libs_only: the build has CTest entries"
    exit 1
fi
echo "libs_only: 1 passed, 0 failed"
