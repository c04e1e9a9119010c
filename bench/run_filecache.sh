#!/bin/sh
# run_filecache.sh - builds bench_filecache (optimised, in build/release of
# this checkout, unless BENCH_FILECACHE names a binary) and runs it:
# cold random rows through the row cache against a bare io_uring O_DIRECT
# reader, pread (one thread, and threads keeping as many reads in flight)
# and mmap, then all-hit lookups against the mapped table.
#
#   bench/run_filecache.sh [bench_filecache options, e.g. --size-mib 2048
#                           --cache-mib 64 --qd 128 --reps 7 --dir /var/tmp]
#
# The table (2 GiB by default) is written under --dir (default /var/tmp:
# use a disk file system, not tmpfs) and removed at the end.  Run as root
# to drop the page cache with /proc/sys/vm/drop_caches as well.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
bin=${BENCH_FILECACHE:-}
if [ -z "$bin" ]; then
    "$top/scripts/setup.sh"
    cmake -S "$top" -B "$top/build/release" -DENGRAM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$top/build/release" -j2 --target bench_filecache >/dev/null
    bin=$top/build/release/bench_filecache
fi
exec "$bin" "$@"
