#!/bin/sh
# Installs a build tree as a user would (cmake --install BUILD --prefix P,
# P a scratch directory) and builds applications against the result:
#  1. the prefix holds bin/, include/ and the libdir's top directory, and
#     nothing else (no stray package directory);
#  2. with pkg-config, in place: app.c against the shared library, and
#     against the static one with the libraries of `pkg-config --static`;
#     app_cuda.c the same ways with engram_cuda.pc where the CUDA library
#     is built;
#  3. the prefix moved elsewhere: no installed file names the old prefix,
#     and (2) again;
#  4. a CMake project (tests/install/CMakeLists.txt) with
#     find_package(engram VERSION REQUIRED [COMPONENTS cuda]) against the
#     moved prefix, linking engram::engram and engram::engram_static (and
#     engram::engram_cuda, engram::engram_cuda_static);
#     then the README's pkg-config and find_package recipes as written;
#  5. find_package calls that must fail, each with its message: an unknown
#     component, versions of another minor or major release, and the cuda
#     component of a build without the CUDA library, or without the CUDA
#     toolkit (where plain find_package(engram) must still succeed).
# Every app is run: it opens a store, creates a table and looks rows up
# (app_cuda.c looks them up on the GPU where there is one, and otherwise
# prints the library's "no CUDA device" error).
# Env: ENGRAM_SRC (source dir), ENGRAM_BUILD (build dir), CMAKE (cmake),
# CC, ENGRAM_LIBDIR (CMAKE_INSTALL_LIBDIR, relative), ENGRAM_VERSION,
# ENGRAM_HAVE_CUDA (ON or OFF), PKG_CONFIG (optional).
set -eu
scratch=$(mktemp -d)
trap 'chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"' EXIT
here=$ENGRAM_SRC/tests/install
pkgconfig=${PKG_CONFIG:-pkg-config}
libdir=$ENGRAM_LIBDIR
cuda=$ENGRAM_HAVE_CUDA
passed=0

fail() {
    echo "install: $*" >&2
    echo "install: $passed passed, 1 failed" >&2
    exit 1
}
ok() { passed=$((passed + 1)); }

# run_app NAME BINARY [LIBDIR]: runs an app (with LIBDIR in
# LD_LIBRARY_PATH) on a fresh store directory and checks its output line;
# app_cuda may print either of its two outcomes.
run_app() {
    rm -rf "$scratch/store"
    out=$(env LD_LIBRARY_PATH="${3:-}" "$2" "$scratch/store" 2>&1) || fail "$1 failed: $out"
    case $1:$out in
        *cuda*:"app_cuda: GPU lookup ok") ;;
        *cuda*:"app_cuda: -ENODEV: no CUDA device"*) ;;
        *cuda*:*) fail "$1 printed: $out" ;;
        *:"app: engram $ENGRAM_VERSION ok") ;;
        *) fail "$1 printed: $out (expected: app: engram $ENGRAM_VERSION ok)" ;;
    esac
    echo "install: $1: $out"
    ok
}

# static_libs PKG: the libraries of `pkg-config --static --libs PKG`, with
# engram's own libraries named by their archives so that the linker cannot
# take the shared ones.
static_libs() {
    for w in $("$pkgconfig" --static --libs "$1"); do
        case $w in
            -lengram) printf '%s ' -l:libengram.a ;;
            -lengram_cuda) printf '%s ' -l:libengram_cuda.a ;;
            *) printf '%s ' "$w" ;;
        esac
    done
}

# not_dynamic NAME BINARY: the static builds load no libengram*.so.
not_dynamic() {
    if readelf -d "$2" | grep -q 'NEEDED.*libengram'; then
        fail "$1 links a shared libengram: $(readelf -d "$2" | grep NEEDED)"
    fi
}

# pkgconfig_apps PREFIX TAG: step 2 against PREFIX.
pkgconfig_apps() {
    p=$1 tag=$2
    # Only this prefix's .pc files, never an engram installed elsewhere.
    PKG_CONFIG_LIBDIR=$p/$libdir/pkgconfig
    PKG_CONFIG_PATH=
    export PKG_CONFIG_LIBDIR PKG_CONFIG_PATH
    inc=$("$pkgconfig" --variable=includedir engram) || fail "pkg-config finds no engram.pc in $p"
    [ "$(cd "$inc" && pwd -P)" = "$(cd "$p/include" && pwd -P)" ] ||
        fail "engram.pc says includedir=$inc, not $p/include"
    lib=$("$pkgconfig" --variable=libdir engram)
    [ "$(cd "$lib" && pwd -P)" = "$(cd "$p/$libdir" && pwd -P)" ] ||
        fail "engram.pc says libdir=$lib, not $p/$libdir"
    [ "$("$pkgconfig" --modversion engram)" = "$ENGRAM_VERSION" ] ||
        fail "engram.pc says version $("$pkgconfig" --modversion engram), not $ENGRAM_VERSION"
    # shellcheck disable=SC2046 # pkg-config's output is a list of words
    $CC -std=c11 -Wall -Wextra -Werror $("$pkgconfig" --cflags engram) "$here/app.c" \
        $("$pkgconfig" --libs engram) -o "$scratch/app_pc" ||
        fail "building app.c with pkg-config ($tag) failed"
    run_app "pkg-config shared ($tag)" "$scratch/app_pc" "$p/$libdir"
    # shellcheck disable=SC2046
    $CC -std=c11 -Wall -Wextra -Werror $("$pkgconfig" --cflags engram) "$here/app.c" \
        $(static_libs engram) -o "$scratch/app_pc_static" ||
        fail "building app.c with pkg-config --static ($tag) failed"
    not_dynamic "pkg-config static ($tag)" "$scratch/app_pc_static"
    run_app "pkg-config static ($tag)" "$scratch/app_pc_static"
    [ "$cuda" = ON ] || return 0
    # The app's own CUDA calls take the toolkit's shared runtime, as an
    # engine's do; libengram_cuda.so carries its own.
    cudalib=$("$pkgconfig" --variable=cudalibdir engram_cuda) || fail "no engram_cuda.pc in $p"
    # shellcheck disable=SC2046
    $CC -std=c11 -Wall -Wextra -Werror $("$pkgconfig" --cflags engram_cuda) "$here/app_cuda.c" \
        $("$pkgconfig" --libs engram_cuda) -L"$cudalib" -lcudart -Wl,-rpath,"$cudalib" \
        -o "$scratch/app_cuda_pc" || fail "building app_cuda.c with pkg-config ($tag) failed"
    run_app "pkg-config cuda shared ($tag)" "$scratch/app_cuda_pc" "$p/$libdir"
    # shellcheck disable=SC2046
    $CC -std=c11 -Wall -Wextra -Werror $("$pkgconfig" --cflags engram_cuda) "$here/app_cuda.c" \
        $(static_libs engram_cuda) -o "$scratch/app_cuda_pc_static" ||
        fail "building app_cuda.c with pkg-config --static ($tag) failed"
    not_dynamic "pkg-config cuda static ($tag)" "$scratch/app_cuda_pc_static"
    run_app "pkg-config cuda static ($tag)" "$scratch/app_cuda_pc_static"
}

# configure DIR PREFIX FIND_ARGS [CMAKE_ARGS...]: configures the
# find_package project.
configure() {
    d=$1 p=$2 a=$3
    shift 3
    "$CMAKE" -S "$here" -B "$d" -DCMAKE_C_COMPILER="$CC" -DCMAKE_PREFIX_PATH="$p" \
        -DEXPECT_PREFIX="$p" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "-DENGRAM_FIND_ARGS=$a" \
        "$@" > "$d.log" 2>&1
}

# 1. Install; the top of the prefix.
stage=$scratch/stage
"$CMAKE" --install "$ENGRAM_BUILD" --prefix "$stage" > "$scratch/install.log" 2>&1 ||
    { cat "$scratch/install.log"; fail "cmake --install $ENGRAM_BUILD --prefix $stage failed"; }
# shellcheck disable=SC2012 # the names are ours, and ls -A shows dot files
got=$(cd "$stage" && ls -A | sort | tr '\n' ' ')
want=$(printf '%s\n' bin include "${libdir%%/*}" | sort -u | tr '\n' ' ')
[ "$got" = "$want" ] || fail "the top of the prefix holds: ${got}(expected: $want)"
files="bin/engram include/engram.h $libdir/libengram.so $libdir/libengram.a
       $libdir/pkgconfig/engram.pc $libdir/cmake/engram/engramConfig.cmake
       $libdir/cmake/engram/engramConfigVersion.cmake $libdir/cmake/engram/engramTargets.cmake"
[ "$cuda" = ON ] && files="$files include/engram_cuda.h $libdir/libengram_cuda.so
       $libdir/libengram_cuda.a $libdir/pkgconfig/engram_cuda.pc
       $libdir/cmake/engram/engramCudaTargets.cmake"
for f in $files; do
    [ -e "$stage/$f" ] || fail "cmake --install did not install $f"
done
[ "$cuda" = ON ] || [ ! -e "$stage/$libdir/pkgconfig/engram_cuda.pc" ] ||
    fail "engram_cuda.pc is installed, but the CUDA library is not built"
echo "install: the prefix holds $got"
ok

# 2. pkg-config, in place.
pkgconfig_apps "$stage" "in place"

# 3. The prefix moved.
moved=$scratch/moved
mv "$stage" "$moved"
if named=$(grep -rl "$stage" "$moved"); then
    fail "installed files name the prefix they were installed to: $named"
fi
ok
pkgconfig_apps "$moved" "moved"

# 4. find_package(engram).
args="$ENGRAM_VERSION;REQUIRED"
[ "$cuda" = ON ] && args="$args;COMPONENTS;cuda"
configure "$scratch/cm" "$moved" "$args" || { cat "$scratch/cm.log"; fail "find_package(engram $args) failed"; }
"$CMAKE" --build "$scratch/cm" > "$scratch/cm-build.log" 2>&1 ||
    { cat "$scratch/cm-build.log"; fail "building the find_package project failed"; }
run_app "find_package engram::engram" "$scratch/cm/app_shared"
not_dynamic "find_package engram::engram_static" "$scratch/cm/app_static"
run_app "find_package engram::engram_static" "$scratch/cm/app_static"
if [ "$cuda" = ON ]; then
    run_app "find_package engram::engram_cuda" "$scratch/cm/app_cuda"
    not_dynamic "find_package engram::engram_cuda_static" "$scratch/cm/app_cuda_static"
    run_app "find_package engram::engram_cuda_static" "$scratch/cm/app_cuda_static"
fi

# The README's recipes as written, its prefix /opt/engram replaced: the
# pkg-config lines, and the find_package project.
mkdir "$scratch/readme"
cp "$here/app.c" "$scratch/readme/app.c"
# shellcheck disable=SC2016 # build.sh expands $CC
awk '/^```sh$/ { on = 1; buf = ""; next }
     /^```$/ { if (on && buf ~ /pkg-config --cflags --libs engram/) { printf "%s", buf; exit }
               on = 0; next }
     on { buf = buf $0 "\n" }' "$ENGRAM_SRC/README.md" |
    sed -e "s|/opt/engram/lib|$moved/$libdir|g" -e "s|/opt/engram|$moved|g" \
        -e 's|^cc |"$CC" -std=c11 -Wall -Wextra -Werror |' > "$scratch/readme/build.sh"
grep -q pkg-config "$scratch/readme/build.sh" || fail "no pkg-config recipe in README.md"
(cd "$scratch/readme" && CC=$CC sh -eu build.sh) || fail "the README's pkg-config recipe failed"
run_app "README pkg-config recipe" "$scratch/readme/a.out"
awk '/^```cmake$/ { on = 1; next } /^```$/ { if (on) exit } on' "$ENGRAM_SRC/README.md" \
    > "$scratch/readme/CMakeLists.txt"
grep -q 'find_package(engram' "$scratch/readme/CMakeLists.txt" ||
    fail "no find_package(engram) project in README.md"
if ! { "$CMAKE" -S "$scratch/readme" -B "$scratch/readme/build" -DCMAKE_C_COMPILER="$CC" \
         -DCMAKE_PREFIX_PATH="$moved" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF &&
       "$CMAKE" --build "$scratch/readme/build"; } > "$scratch/readme.log" 2>&1; then
    cat "$scratch/readme.log"
    fail "the README's find_package project failed"
fi
run_app "README find_package project" "$scratch/readme/build/app"

# 5. find_package calls that must fail.
major=${ENGRAM_VERSION%%.*}
minor=${ENGRAM_VERSION#*.}
minor=${minor%%.*}
must_fail() { # FIND_ARGS, the message expected, [CMAKE_ARGS...]
    f=$1 m=$2
    shift 2
    rm -rf "$scratch/bad"
    if configure "$scratch/bad" "$moved" "$f" "$@"; then
        fail "find_package(engram $f) $* succeeded"
    fi
    grep -q "$m" "$scratch/bad.log" || { cat "$scratch/bad.log"; fail "find_package(engram $f) $* did not say: $m"; }
    echo "install: find_package(engram $f)${*:+ $*} fails: $m"
    ok
}
must_fail "$ENGRAM_VERSION;REQUIRED;COMPONENTS;nope" "engram has no component 'nope'"
must_fail "$major.$((minor + 1));REQUIRED" 'package "engram" that is compatible'
must_fail "$((major + 1)).0;REQUIRED" 'package "engram" that is compatible'
if [ "$cuda" != ON ]; then
    must_fail "REQUIRED;COMPONENTS;cuda" "built without its CUDA library"
else
    # Without the CUDA toolkit: the cuda component cannot be had, and a
    # CPU-only user still finds engram (the CUDA targets are not loaded).
    must_fail "REQUIRED;COMPONENTS;cuda" "CUDAToolkit" \
        -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
    rm -rf "$scratch/cpu"
    configure "$scratch/cpu" "$moved" "$ENGRAM_VERSION;REQUIRED" \
        -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON ||
        { cat "$scratch/cpu.log"; fail "find_package(engram) without the CUDA toolkit failed"; }
    grep -q "cuda: FALSE" "$scratch/cpu.log" ||
        { cat "$scratch/cpu.log"; fail "engram_cuda_FOUND is set without the CUDA toolkit"; }
    echo "install: find_package(engram $ENGRAM_VERSION REQUIRED) without the CUDA toolkit: found, cuda: FALSE"
    ok
fi

echo "install: $passed passed, 0 failed"
