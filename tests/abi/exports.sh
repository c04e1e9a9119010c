#!/bin/sh
# abi_exports: each shared object exports its interface and nothing else.
#  1. libengram.so: its dynamic symbols are exactly the functions that
#     include/engram.h declares (ENGRAM_API) and engram_internal_v1, the
#     one internal interface (src/internal.h, for libengram_cuda).
#  2. libengram_cuda.so, where it is built: exactly the functions of
#     include/engram_cuda.h; and of libengram it imports
#     engram_internal_v1 alone (so the Python package's GPU module, which
#     defines only that one, can link its code without libengram).
#  3. The modules of the Python package, where built: each exports its
#     PyInit_ function alone and imports no engram symbol (each carries
#     the library it needs, hidden).
# Env: NM (nm), ENGRAM_SRC (source dir), ENGRAM_LIB (libengram.so),
# ENGRAM_CUDA_LIB (libengram_cuda.so, or empty), ENGRAM_PY_MODULES
# (space-separated paths, or empty).
set -eu
NM=${NM:-nm}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() {
    echo "abi_exports: $*" >&2
    failed=$((failed + 1))
}

# The functions HEADER declares with ENGRAM_API, sorted.
declared() {
    sed -n 's/^ENGRAM_API[^(]*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)(.*/\1/p' "$1" | sort -u
}
# The dynamic symbols FILE defines, and those it takes from elsewhere.
exported() {
    "$NM" -D --defined-only "$1" | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u
}
imported() {
    "$NM" -D --undefined-only "$1" | awk '{print $NF}' | sed 's/@.*//' | sort -u
}

# check_lib LIB HEADER [EXTRA...]: LIB exports HEADER's functions and the
# EXTRA names, no more and no fewer.
check_lib() {
    lib=$1 hdr=$2
    shift 2
    [ -f "$lib" ] || { fail "$lib: not found"; return; }
    { declared "$hdr"; for x in "$@"; do echo "$x"; done; } | sort -u >"$tmp/want"
    exported "$lib" >"$tmp/have"
    if [ "$(wc -l <"$tmp/want")" -le "$#" ]; then
        fail "$hdr: no ENGRAM_API declaration found"
        return
    fi
    extra=$(comm -13 "$tmp/want" "$tmp/have")
    missing=$(comm -23 "$tmp/want" "$tmp/have")
    [ -z "$extra" ] ||
        fail "$(basename "$lib") exports what is neither declared in $(basename "$hdr")" \
             "${1:+nor $* }(internals?):" $extra
    [ -z "$missing" ] ||
        fail "$(basename "$lib") does not export:" $missing
    [ -n "$extra$missing" ] ||
        echo "abi_exports: $(basename "$lib"): $(wc -l <"$tmp/have") symbols, those of $(basename "$hdr")${1:+ and $*}"
}

check_lib "$ENGRAM_LIB" "$ENGRAM_SRC/include/engram.h" engram_internal_v1

if [ -n "${ENGRAM_CUDA_LIB:-}" ]; then
    check_lib "$ENGRAM_CUDA_LIB" "$ENGRAM_SRC/include/engram_cuda.h"
    core=$(imported "$ENGRAM_CUDA_LIB" | grep '^engram' | grep -v '^engram_internal_v1$' || true)
    [ -z "$core" ] ||
        fail "$(basename "$ENGRAM_CUDA_LIB") calls libengram other than through" \
             "engram_internal_v1:" $core
fi

for m in ${ENGRAM_PY_MODULES:-}; do
    name=$(basename "$m")
    name=${name%%.*}
    have=$(exported "$m")
    [ "$have" = "PyInit_$name" ] ||
        fail "$(basename "$m") exports more than PyInit_$name:" $(echo "$have" | grep -v "^PyInit_$name\$")
    core=$(imported "$m" | grep '^engram' || true)
    [ -z "$core" ] || fail "$(basename "$m") imports engram symbols:" $core
    [ -n "$core" ] || [ "$have" != "PyInit_$name" ] || echo "abi_exports: $(basename "$m"): PyInit_$name alone"
done

if [ "$failed" -ne 0 ]; then
    echo "abi_exports: $failed failed" >&2
    exit 1
fi
