#!/usr/bin/env python3
"""bench_ngram.py - the n-gram hash (engramstore.NgramHasher) against a
vectorized numpy implementation of the same algorithm, in the same run.

The layout is DeepSeek-V4.1's (layers 1 and 14, vocab_size 16,000,000,
max_ngram 4, 8 heads, compressed_vocab 99,092, pad_id 2): each token gives
2 x 24 row ids.  Tokens are uniform compressed ids with 1% DEAD (-1).  Both
sides hash the same T tokens of one request into int64 [T, 2, 24] on one
thread (the library's hash is single-threaded; numpy's integer ops are too),
alternating which runs first, and their outputs are compared.  Reports the
median tokens/s of N repeats of each, min and max, their ratio, and the load
average around the run.

    PYTHONPATH=build/release/pkg python bench/bench_ngram.py [--tokens N] [--repeats R]
                                                             [--quick] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import engramstore as es

V41 = dict(layer_ids=[1, 14], vocab_size=16_000_000, max_ngram=4, heads=8,
           compressed_vocab=99_092, pad_id=2)


def numpy_hash(c, primes, offsets, mults, max_ngram, heads, pad):
    """The algorithm of docs/ngram.md, vectorized over positions."""
    t = len(c)
    n_layers, cols = primes.shape
    out = np.empty((t, n_layers, cols), np.int64)
    blocked = np.zeros(t, bool)
    eff = []
    for s in range(max_ngram):
        shifted = np.empty(t, np.int64)
        shifted[:s] = -2  # before the request: blocked
        shifted[s:] = c[:t - s]
        blocked |= shifted < 0
        eff.append(np.where(blocked, pad, shifted))
    for lay in range(n_layers):
        rolling = np.zeros(t, np.int64)
        for s in range(max_ngram):
            rolling ^= eff[s] * mults[lay, s]
            if s >= 1:
                for h in range(heads):
                    col = (s - 1) * heads + h
                    np.remainder(rolling, primes[lay, col], out=out[:, lay, col])
                    out[:, lay, col] += offsets[lay, col]
    return out


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="64 Ki tokens, 3 repeats")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.quick:
        a.tokens, a.repeats = 1 << 16, 3
    lay = es.NgramLayout(**V41)
    h = es.NgramHasher(lay)
    rng = np.random.default_rng(1)
    c = rng.integers(0, V41["compressed_vocab"], size=a.tokens, dtype=np.int64)
    c[rng.random(a.tokens) < 0.01] = -1
    out = np.empty((a.tokens, 2, lay.num_cols), np.int64)
    args = (np.asarray(lay.primes), np.asarray(lay.offsets), np.asarray(lay.multipliers),
            V41["max_ngram"], V41["heads"], V41["pad_id"])
    # Warm-up, and the check that both compute the same ids.
    h.hash(c, out=out, threads=1)
    want = numpy_hash(c, *args)
    if not np.array_equal(out, want):
        sys.exit("bench_ngram: the library's ids differ from numpy's")
    load0 = os.getloadavg()
    lib, ref = [], []
    for r in range(a.repeats):
        order = [("lib", lambda: h.hash(c, out=out, threads=1)),
                 ("numpy", lambda: numpy_hash(c, *args))]
        if r % 2:
            order.reverse()
        for name, fn in order:
            (lib if name == "lib" else ref).append(a.tokens / timed(fn))
    load1 = os.getloadavg()
    res = {
        "tokens": a.tokens, "repeats": a.repeats, "layers": 2, "cols": lay.num_cols,
        "engram_tokens_per_s": {"median": statistics.median(lib), "min": min(lib), "max": max(lib)},
        "numpy_tokens_per_s": {"median": statistics.median(ref), "min": min(ref), "max": max(ref)},
        "ratio_median": statistics.median(lib) / statistics.median(ref),
        "loadavg_before": load0[0], "loadavg_after": load1[0],
    }
    print(f"n-gram hash, V4.1 layout (2 layers x 24 columns), {a.tokens} tokens, "
          f"{a.repeats} repeats, load {load0[0]:.2f} -> {load1[0]:.2f}")
    for name, v in (("engram", res["engram_tokens_per_s"]), ("numpy", res["numpy_tokens_per_s"])):
        print(f"  {name:7s} median {v['median'] / 1e6:8.2f} M tokens/s "
              f"(min {v['min'] / 1e6:.2f}, max {v['max'] / 1e6:.2f})")
    print(f"  engram / numpy: {res['ratio_median']:.1f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
