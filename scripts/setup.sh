#!/usr/bin/env bash
# Installs what building and testing engram needs on a fresh Debian/Ubuntu
# machine: a C toolchain, CMake, pkg-config, libxxhash, liburing and cJSON.
# Python and numpy are optional (the numpy baseline of the benchmark).  Runs apt-get
# only when something is missing, so repeated runs are fast.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || need+=(make)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -f /usr/include/xxhash.h ] || need+=(libxxhash-dev)
[ -f /usr/include/liburing.h ] || need+=(liburing-dev)
[ -f /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ "${ENGRAM_SETUP_CLANG:-0}" = 1 ]; then
  command -v clang >/dev/null 2>&1 || need+=(clang)
fi

if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
