#!/usr/bin/env bash
# Installs what building and testing engram needs on a fresh Debian/Ubuntu
# machine: a C and C++ toolchain, CMake, pkg-config, libxxhash, liburing, cJSON,
# libnuma and numactl,
# hiredis with redis-server and redis-cli (Redis Cluster tables and their tests),
# Python 3 with venv and its headers (for the engramstore package;
# numpy for the system's python3, which the CLI tests use;
# scripts/test.sh installs numpy, pytest and Mooncake's wheel from PyPI into
# build/venv), and libibverbs1 (which Mooncake's libraries link).  Runs apt-get
# only when something is missing, so repeated runs are fast.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || need+=(make)
# C++: nvcc's host compiler, and test_cuda_emu where the CUDA headers are.
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -f /usr/include/xxhash.h ] || need+=(libxxhash-dev)
[ -f /usr/include/liburing.h ] || need+=(liburing-dev)
[ -f /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
# NUMA placement of tables (mbind, move_pages): libnuma; numactl shows the
# machine's nodes (numactl -H).
[ -f /usr/include/numaif.h ] || need+=(libnuma-dev)
command -v numactl >/dev/null 2>&1 || need+=(numactl)
# Redis Cluster tables: hiredis for the library (found with pkg-config),
# redis-server and redis-cli for the tests, which start their own cluster
# on loopback ports (on a host running systemd, installing redis-server
# also enables its default service on 127.0.0.1:6379; the tests never
# use it).
[ -f /usr/include/hiredis/hiredis.h ] || need+=(libhiredis-dev)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v python3 >/dev/null 2>&1 || need+=(python3)
# The Python package builds in a virtual environment against Python's headers.
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
  python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    || need+=(python3-dev)
else
  need+=(python3-venv python3-dev)
fi
# numpy for the system's python3: the CLI tests write .npy files with it and
# run the README's shell block, which makes one (tests/cli/run.sh).
dpkg-query -W -f='${Status}' python3-numpy 2>/dev/null | grep -q 'ok installed' || need+=(python3-numpy)
# libibverbs1: the libraries of Mooncake's wheel (mooncake-transfer-engine-non-cuda,
# which scripts/test.sh installs for the Store-backed tests) link it.
[ -e /usr/lib/x86_64-linux-gnu/libibverbs.so.1 ] || ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' \
  || need+=(libibverbs1)
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
