#!/usr/bin/env bash
# Builds engram (optimised) and runs the demo: a namespace of synthetic
# tables shaped like one DeepSeek Engram layer, decode-shaped lookups, and
# their throughput and latency against a naive baseline in the same run.
# Extra arguments go to `engram demo` (e.g. --small).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build/release -DENGRAM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/release -j"$(nproc 2>/dev/null || echo 2)" --target engram_cli >/dev/null
exec build/release/engram demo "$@"
