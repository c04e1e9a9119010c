#!/usr/bin/env python3
"""The Python binding's own cost per call, against the C call, in one process.

One decode-step lookup (K = 24 tables of 264-byte rows, 2000 rows each,
bound memory, so the rows stay in the caches; T tokens of int64 ids) is
made three ways, interleaved in rounds of --calls calls each:

  C           engram_lookup() on the arguments Store.lookup() would pass
              it, called and timed in C by the extension's benchmark hook
              Store._bench_lookup() (the arrays checked once, the GIL
              held, each call timed with CLOCK_MONOTONIC on its own);
  lookup      Store.lookup(names, ids [T, 24], out [T, 24, 264]) from a
              Python loop, each call timed with time.perf_counter_ns()
              (the same clock);
  lookup_into the layer API's LayerStore.lookup_into(layer_id, row_ids
              [T, 1, 24], output [T, 1, 24, 264]) likewise.

Same store, tables, ids and output memory for all three.  Each timed region
also holds the timer's own cost, measured the same way with nothing inside
(the floor, one for C and one for Python): the cost of a call is its
median less its floor, and "extra" is that of a Python call less that of
the C call.  The target is extra <= 300 ns.

Then two checks of what the extra is made of, Python calls only:
  after T     a one-token Store.lookup() made right after a C lookup of T
              tokens (one _bench_lookup() call): the rows a big lookup
              copies evict the interpreter's and the binding's working set,
              which the next Python call then reads back;
  layers      lookup_into of a second layer (other tables, same sizes)
              alternating with the first, against the first alone.

Against an engramstore without the hook (an older build, to compare the
code before a change), the Python calls only are timed.

Usage: bench/bench_pycall.py [--tokens 1,4,16,64,256] [--rounds R]
       [--calls N] [--json FILE]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import numpy as np

import engramstore

K, R, ROWS = 24, 264, 2000


def timed(f, a, b, c, n: int) -> list[int]:
    """n calls f(a, b, c), each timed alone."""
    clock = time.perf_counter_ns
    s = [0] * n
    for i in range(n):
        t0 = clock()
        f(a, b, c)
        s[i] = clock() - t0
    return s


def timed_empty(n: int) -> list[int]:
    """n empty regions timed as timed() times a call: the timer's cost."""
    clock = time.perf_counter_ns
    s = [0] * n
    for i in range(n):
        t0 = clock()
        s[i] = clock() - t0
    return s


def timed_alternating(f, b, c, n: int) -> list[int]:
    """n calls f(layer, b, c), layer 0, 1, 0, ..., each timed alone."""
    clock = time.perf_counter_ns
    s = [0] * n
    for i in range(n):
        layer = i & 1
        t0 = clock()
        f(layer, b, c)
        s[i] = clock() - t0
    return s


def stats(samples: list[int] | np.ndarray) -> dict[str, float]:
    a = np.asarray(samples, dtype=np.float64)
    return {"median": float(np.median(a)), "p99": float(np.percentile(a, 99)),
            "n": int(a.size)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1,4,16,64,256", help="T values, comma-separated")
    ap.add_argument("--rounds", type=int, default=200, help="rounds of the three ways")
    ap.add_argument("--calls", type=int, default=100, help="calls per way per round")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]

    rng = np.random.default_rng(1)
    bufs = [rng.integers(0, 256, size=(ROWS, R), dtype=np.uint8) for _ in range(K)]
    layers = engramstore.EngramStore({l: engramstore.EngramStoreConfig([ROWS] * K, R)
                                      for l in (0, 1)}, store=None)
    layers.bind_local(0, bufs)
    layers.bind_local(1, [b[::-1].copy() for b in bufs])
    st = layers._store  # the memory-only table store that serves the bound arrays
    names = layers.get_store_keys(0)  # one list, kept: its names are memoized
    into = layers.lookup_into
    has_c = hasattr(st, "_bench_lookup")
    res: dict = {"K": K, "row_bytes": R, "rows": ROWS, "rounds": a.rounds, "calls": a.calls,
                 "python": sys.version.split()[0], "numpy": np.__version__, "T": {}}
    gc.disable()
    try:
        for T in tokens:
            row_ids = rng.integers(0, ROWS, size=(T, 1, K), dtype=np.int64)
            output = np.empty((T, 1, K, R), np.uint8)
            ids, out = row_ids.reshape(T, K), output.reshape(T, K, R)
            # Both ways give the rows of the tables.
            into(0, row_ids, output)
            want = np.stack([bufs[k][row_ids[:, 0, k]] for k in range(K)], axis=1)
            assert np.array_equal(output[:, 0], want)
            out.fill(0)
            st.lookup(names, ids, out)
            assert np.array_equal(out, want)
            c, cf, lk, into_s, pf = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [], [], []
            for _ in range(max(1, a.rounds // 20)):  # warm-up
                if has_c:
                    st._bench_lookup(names, ids, out, a.calls, False)
                timed(st.lookup, names, ids, out, a.calls)
                timed(into, 0, row_ids, output, a.calls)
            for _ in range(a.rounds):
                if has_c:
                    c.append(np.frombuffer(st._bench_lookup(names, ids, out, a.calls, False),
                                           np.int64))
                lk += timed(st.lookup, names, ids, out, a.calls)
                into_s += timed(into, 0, row_ids, output, a.calls)
                if has_c:
                    cf.append(np.frombuffer(st._bench_lookup(names, ids, out, a.calls, True),
                                            np.int64))
                pf += timed_empty(a.calls)
            r = {"lookup": stats(lk), "lookup_into": stats(into_s), "py_floor": stats(pf)}
            if has_c:
                r["c"] = stats(np.concatenate(c))
                r["c_floor"] = stats(np.concatenate(cf))
                c_cost = r["c"]["median"] - r["c_floor"]["median"]
                for way in ("lookup", "lookup_into"):
                    r[way]["extra"] = r[way]["median"] - r["py_floor"]["median"] - c_cost
            res["T"][T] = r
        # What the extra is made of (Python calls only).
        ids1 = rng.integers(0, ROWS, size=(1, 1, K), dtype=np.int64)
        out1 = np.empty((1, 1, K, R), np.uint8)
        after: dict[int, dict[str, float]] = {}
        for T in tokens if has_c else []:
            big_ids = rng.integers(0, ROWS, size=(T, K), dtype=np.int64)
            big_out = np.empty((T, K, R), np.uint8)
            s = []
            for _ in range(a.rounds):
                for _ in range(a.calls // 4):
                    st._bench_lookup(names, big_ids, big_out, 1, False)
                    s += timed(st.lookup, names, ids1.reshape(1, K), out1.reshape(1, K, R), 1)
            after[T] = stats(s)
        res["after_T"] = after
        same, alt = [], []
        for _ in range(a.rounds):
            same += timed(into, 0, ids1, out1, a.calls)
            alt += timed_alternating(into, ids1, out1, a.calls)
        res["layers"] = {"same": stats(same), "alternating": stats(alt)}
    finally:
        gc.enable()
        layers.close()

    def mp(x: dict | None) -> str:
        return f"{x['median']:.0f} / {x['p99']:.0f}" if x else "-"

    def ex(x: dict) -> str:
        return f"{x['extra']:+.0f}" if "extra" in x else "-"

    print(f"K = {K} tables x {ROWS} rows of {R} B (bound memory, in the caches); "
          f"{a.rounds} rounds x {a.calls} calls per way; ns per call, median / p99")
    if not has_c:
        print("(this engramstore has no Store._bench_lookup: Python calls only)")
    print("| T | C engram_lookup | Store.lookup | lookup_into | timer floor C / Python "
          "| extra: lookup | extra: lookup_into |")
    print("|---|---|---|---|---|---|---|")
    for T, r in res["T"].items():
        cfl = f"{r['c_floor']['median']:.0f}" if has_c else "-"
        print(f"| {T} | {mp(r.get('c'))} | {mp(r['lookup'])} | {mp(r['lookup_into'])} "
              f"| {cfl} / {r['py_floor']['median']:.0f} "
              f"| {ex(r['lookup'])} | {ex(r['lookup_into'])} |")
    if has_c:
        worst = max(max(r["lookup"]["extra"], r["lookup_into"]["extra"])
                    for r in res["T"].values())
        print(f"target: extra <= 300 ns at every T: {'met' if worst <= 300 else 'MISSED'} "
              f"(worst {worst:.0f} ns)")
        print("\nA one-token Store.lookup right after a C lookup of T tokens "
              "(ns, median / p99):")
        print("| T before | " + " | ".join(str(T) for T in res["after_T"]) + " |")
        print("|---|" + "---|" * len(res["after_T"]))
        print("| one-token call | " + " | ".join(mp(x) for x in res["after_T"].values()) + " |")
    ly = res["layers"]
    print(f"\nlookup_into of one token, one layer: {ly['same']['median']:.0f} / "
          f"{ly['same']['p99']:.0f} ns; two layers in turn: {ly['alternating']['median']:.0f} / "
          f"{ly['alternating']['p99']:.0f} ns (median / p99)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
