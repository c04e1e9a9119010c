#!/usr/bin/env python3
"""Python-binding benchmark: engramstore's lookup against numpy and against
the C library, in one run.

1. Per-call overhead: st.lookup() of T=1 token x K columns (K = 1 and 64)
   against np.take(table, ids, axis=0, out=...) on the same rows, each timed
   as the median over repetitions of a loop of calls.
2. Throughput: 4096 uniform random rows per call (a ring of 8 fresh id
   batches, as `engram bench` does) through st.lookup() against the C
   benchmark `engram bench NAME --ids 4096` on the same table, run
   alternately so both see the same machine state; both report the median
   time of single calls.

Usage: bench/bench_python.py [--rows N] [--reps R] [--engram PATH] [--json FILE]
(bench/run.sh --python runs it after building everything.)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import engramstore


def per_call_ns(fn, calls: int, reps: int) -> float:
    """Median over `reps` of the mean time of `calls` back-to-back calls."""
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls)
    return statistics.median(samples)


def ring_median_ns(fn_of_i, calls: int) -> float:
    """Median time of single calls (each timed alone), as `engram bench`
    reports it."""
    samples = []
    clock = time.perf_counter_ns
    for i in range(calls):
        t0 = clock()
        fn_of_i(i & 7)
        samples.append(clock() - t0)
    return statistics.median(samples)


def c_bench(engram: str, root: str, ns: str, name: str, ids: int, iters: int) -> float:
    r = subprocess.run([engram, "--root", root, "--ns", ns, "bench", name, "--ids", str(ids),
                        "--iters", str(iters), "--json"], check=True, capture_output=True,
                       text=True)
    return float(json.loads(r.stdout)["results"]["engram"]["median_ns"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1 << 20, help="table rows (264 bytes each)")
    ap.add_argument("--reps", type=int, default=9, help="repetitions per measurement")
    ap.add_argument("--engram", default=os.path.join("build", "release", "engram"),
                    help="the engram CLI, for the C baseline")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    R = 264
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    root = tempfile.mkdtemp(prefix="engram-pybench-", dir=base)
    res: dict = {"rows": a.rows, "row_bytes": R, "reps": a.reps}
    try:
        rng = np.random.default_rng(1)
        table = rng.integers(0, 256, size=(a.rows, R), dtype=np.uint8)
        st = engramstore.EngramStore(tables={"t": {"num_rows": a.rows, "row_bytes": R}},
                                     namespace="bench", local_dir=root, prefault=True)
        st.populate("t", table)

        # 1. per-call overhead
        for K in (1, 64):
            ids = rng.integers(0, a.rows, size=(1, K), dtype=np.int64)
            out = np.empty((1, K, R), np.uint8)
            ref = np.empty((1, K, R), np.uint8)
            names = ["t"] * K
            st.lookup(names, ids, out)
            np.take(table, ids, axis=0, out=ref)
            assert np.array_equal(out, ref)
            calls = 20000 if K == 1 else 5000
            lk = per_call_ns(lambda: st.lookup(names, ids, out), calls, a.reps)
            tk = per_call_ns(lambda: np.take(table, ids, axis=0, out=ref), calls, a.reps)
            res[f"K{K}"] = {"engramstore_ns": lk, "np_take_ns": tk, "ratio_take_vs_lookup": tk / lk}

        # 2. throughput at 4096 rows per call against the C benchmark
        T = 4096
        batches = [rng.integers(0, a.rows, size=(T, 1), dtype=np.int64) for _ in range(8)]
        out = np.empty((T, 1, R), np.uint8)
        st.lookup(["t"], batches[0], out)
        assert np.array_equal(out[:, 0], table[batches[0][:, 0]])
        py, cc = [], []
        for _ in range(a.reps):
            cc.append(c_bench(a.engram, root, "bench", "t", T, 400))
            py.append(ring_median_ns(lambda i: st.lookup(["t"], batches[i], out), 400))
        res["T4096"] = {"engramstore_ns": statistics.median(py), "c_ns": statistics.median(cc),
                        "ratio_python_vs_c": statistics.median(cc) / statistics.median(py),
                        "engramstore_rows_per_s": T * 1e9 / statistics.median(py),
                        "c_rows_per_s": T * 1e9 / statistics.median(cc)}
        st.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"table: {a.rows} rows x {R} B; medians of {a.reps} repetitions")
    print("| call | engramstore.lookup | baseline | baseline / engramstore |")
    print("|---|---|---|---|")
    for K in (1, 64):
        r = res[f"K{K}"]
        print(f"| 1 token x {K} col | {r['engramstore_ns'] / 1e3:.2f} us | np.take {r['np_take_ns'] / 1e3:.2f} us "
              f"| {r['ratio_take_vs_lookup']:.2f}x |")
    r = res["T4096"]
    print(f"| 4096 random rows | {r['engramstore_ns'] / 1e3:.1f} us ({r['engramstore_rows_per_s'] / 1e6:.1f} M rows/s) "
          f"| C engram bench {r['c_ns'] / 1e3:.1f} us ({r['c_rows_per_s'] / 1e6:.1f} M rows/s) "
          f"| {r['ratio_python_vs_c']:.2f}x |")
    print(f"targets: K=1 call <= 1.0 us: {'met' if res['K1']['engramstore_ns'] <= 1000 else 'MISSED'}; "
          f"4096 rows within 10% of C: {'met' if r['ratio_python_vs_c'] >= 0.9 else 'MISSED'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
