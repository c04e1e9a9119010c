#!/usr/bin/env python3
"""bench_numpy.py - the numpy baseline for bench_gather, and the ratio table.

Measures np.take(table, ids, axis=0, out=out) on a table of the same shape
as bench_gather's (a size of S bytes holds S // R rows of R bytes), with the
same batch sizes and uniform random int64 ids drawn from a 4 Mi-id pool, and
reports the median rows/s of N repeats as JSON lines.

numpy's take is single-threaded but releases the GIL, so for --threads 2 the
ids of every batch are split across 2 Python threads that synchronise only
at the start and end of each timed repeat (as bench_gather's baselines do).

The table is one anonymous numpy allocation per size (numpy asks for
transparent huge pages on large allocations: the coverage obtained is read
from /proc/self/smaps and printed), filled once, and viewed as [S // R, R]
for each row size, so the 8 GiB table is filled once, not once per R.

    bench_numpy.py [--sizes 256M,8G] [--rows 64,264,1024] [--k 1,64,4096,262144]
                   [--threads 1,2] [--repeats N] [--min-time S] [--quick] [--json FILE]
    bench_numpy.py --combine GATHER.jsonl NUMPY.jsonl

Options bench_gather takes and this script does not need (--variants) are
accepted and ignored, so bench/run.sh can pass one argument list to both.
The --combine form needs no numpy: it joins the two JSON-lines files and
prints library/numpy ratios and the verdict of the numpy target.
"""
import argparse
import json
import statistics
import sys
import threading
import time

POOL_IDS = 1 << 22
WARM_K = 4096
SEED = 0x2545F4914F6CDD1D
GIB = 1 << 30
MIB = 1 << 20


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().rstrip("B").rstrip("i")
    if s and s[-1].upper() in mult:
        return int(s[:-1]) * mult[s[-1].upper()]
    return int(s)


def size_label(v):
    if v % GIB == 0:
        return "%dG" % (v // GIB)
    if v % MIB == 0:
        return "%dM" % (v // MIB)
    return str(v)


def int_list(s):
    return [int(x) for x in s.split(",") if x]


def smaps_huge(addr, length):
    """Rss and AnonHugePages bytes of the mappings overlapping [addr, addr+length)."""
    rss = huge = 0
    inside = False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and ":" not in head:
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo < addr + length and hi > addr
                elif inside and line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif inside and line.startswith("AnonHugePages:"):
                    huge += int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, huge


class Point:
    """One (table view, K, threads) measurement: np.take over fresh id batches."""

    def __init__(self, np, table, pool, out, K, threads):
        self.np = np
        self.table = table
        self.K = K
        self.threads = threads
        self.nbatches = max(1, len(pool) // K)
        self.batches = pool[: self.nbatches * K].reshape(self.nbatches, K)
        self.out = out[: K * table.shape[1]].reshape(K, table.shape[1])
        self.next_call = 0

    def _run_part(self, first, ncalls, lo, hi):
        take = self.np.take
        table, batches, out, nb = self.table, self.batches, self.out[lo:hi], self.nbatches
        for c in range(first, first + ncalls):
            take(table, batches[c % nb, lo:hi], axis=0, out=out)

    def time(self, ncalls):
        first = self.next_call
        self.next_call += ncalls
        if self.threads == 1:
            t0 = time.perf_counter()
            self._run_part(first, ncalls, 0, self.K)
            return time.perf_counter() - t0
        bar = threading.Barrier(self.threads)
        parts = [(self.K * p // self.threads, self.K * (p + 1) // self.threads)
                 for p in range(self.threads)]

        def worker(lo, hi):
            bar.wait()
            self._run_part(first, ncalls, lo, hi)

        ths = [threading.Thread(target=worker, args=parts[p]) for p in range(1, self.threads)]
        for t in ths:
            t.start()
        bar.wait()
        t0 = time.perf_counter()
        self._run_part(first, ncalls, *parts[0])
        for t in ths:
            t.join()
        return time.perf_counter() - t0

    def calibrate(self, min_time):
        n = 1
        while True:
            t = self.time(n)
            if t >= min_time:
                return n
            want = int(min_time / t * n * 1.15) + 1 if t > 0 else n * 100
            n = max(n * 2, min(want, n * 100))

    def measure(self, repeats, min_time):
        n = self.calibrate(min_time)
        return statistics.median(self.time(n) / n for _ in range(repeats))


def warm_up(pt, round_s, born, settle_s, max_s):
    """Rounds of np.take until two agree within 10% and the table is at
    least settle_s old (a fresh multi-GiB allocation is steadily slow here
    for 20-30 s, and two slow rounds agree too), or max_s passes."""
    start = time.perf_counter()
    prev, rounds = None, 0
    while True:
        t0 = time.perf_counter()
        calls = 0
        while time.perf_counter() - t0 < round_s:
            pt.time(16)
            calls += 16
        cur = calls * pt.K / (time.perf_counter() - t0)
        rounds += 1
        if prev and abs(cur - prev) <= 0.10 * max(cur, prev) \
                and time.perf_counter() - born >= settle_s:
            break
        if time.perf_counter() - start > max_s:
            print("  warm-up: no two rounds agreed within 10%% after %.0f s; going on" % max_s)
            break
        prev = cur
    print("  warm-up: %d rounds, %.1f s, %.2f M rows/s (K=%d, 1 thread)"
          % (rounds, time.perf_counter() - start, cur / 1e6, pt.K))


def run(args):
    import numpy as np

    sizes = [parse_size(s) for s in (args.sizes or ("256M" if args.quick else "256M,8G")).split(",")]
    rows = int_list(args.rows)
    ks = int_list(args.k)
    threads = int_list(args.threads)
    repeats = args.repeats or (3 if args.quick else 7)
    min_time = args.min_time or (0.01 if args.quick else 0.04)
    js = open(args.json, "w") if args.json else None
    max_out = max(ks) * max(rows)
    out = np.empty(max_out, dtype=np.uint8)
    out[:] = 0  # fault the output in before timing
    print("bench_numpy: numpy %s; np.take(table, ids, axis=0, out=out); median of %d repeats"
          " of >= %.3f s; rates in M rows/s" % (np.__version__, repeats, min_time))
    for size in sizes:
        sl = size_label(size)
        print("\n== numpy, size %s" % sl)
        t0 = time.perf_counter()
        buf = np.empty(size, dtype=np.uint8)
        words = buf.view(np.uint64)
        step = 8 * MIB
        mul = np.uint64(0x9E3779B97F4A7C15)
        for i in range(0, len(words), step):
            j = min(i + step, len(words))
            words[i:j] = np.arange(i + 1, j + 1, dtype=np.uint64) * mul
        rss, huge = smaps_huge(buf.ctypes.data, size)
        huge_pct = 100.0 * huge / rss if rss else 0.0
        print("  filled %.2f GiB in %.1f s; AnonHugePages %.2f GiB of %.2f GiB resident (%.1f%%)"
              % (size / GIB, time.perf_counter() - t0, huge / GIB, rss / GIB, huge_pct))
        for ri, R in enumerate(rows):
            n = size // R
            table = buf[: n * R].reshape(n, R)
            pool = np.random.default_rng(SEED).integers(0, n, size=POOL_IDS, dtype=np.int64)
            print(" -- %s R=%d: %d rows" % (sl, R, n))
            settle = 25.0 if size >= GIB and not args.quick and ri == 0 else 0.0
            warm_up(Point(np, table, pool, out, WARM_K, 1), 1.0 if size >= GIB else 0.2,
                    t0, settle, 10 if args.quick else 90)
            print("  %3s %7s %11s %12s" % ("thr", "K", "take Mr/s", "ns/call"))
            for T in threads:
                for K in ks:
                    if K == 1 and T > 1:
                        continue
                    pt = Point(np, table, pool, out, K, T)
                    t = pt.measure(repeats, min_time)
                    print("  %3d %7d %11.2f %12.1f" % (T, K, K / t / 1e6, t * 1e9), flush=True)
                    if js:
                        js.write(json.dumps({"bench": "numpy", "size": size, "size_label": sl,
                                             "R": R, "K": K, "threads": T,
                                             "rows_s": K / t, "ns_call": t * 1e9,
                                             "huge_pct": round(huge_pct, 1)}) + "\n")
                        js.flush()
        del table, words, buf
    if js:
        js.close()


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def combine(gather_path, numpy_path):
    g = load(gather_path)
    n = {(r["size"], r["R"], r["K"], r["threads"]): r for r in load(numpy_path)}
    print("\n== library / numpy np.take (same size, R and K; np1 = numpy on 1 thread,"
          " npT = numpy on the same thread count)")
    print("  %-5s %-12s %5s %7s %3s %10s %10s %8s %10s %8s"
          % ("size", "variant", "R", "K", "thr", "lib Mr/s", "np1 Mr/s", "lib/np1",
             "npT Mr/s", "lib/npT"))
    for r in g:
        key1 = (r["size"], r["R"], r["K"], 1)
        keyT = (r["size"], r["R"], r["K"], r["threads"])
        lib = r.get("lib_rows_s")
        if not lib or key1 not in n:
            continue
        np1 = n[key1]["rows_s"]
        npT = n[keyT]["rows_s"] if keyT in n else None
        print("  %-5s %-12s %5d %7d %3d %10.2f %10.2f %7.2fx %10s %8s"
              % (r["size_label"], r["variant"], r["R"], r["K"], r["threads"], lib / 1e6,
                 np1 / 1e6, lib / np1, "%.2f" % (npT / 1e6) if npT else "-",
                 "%.2fx" % (lib / npT) if npT else "-"))
    k1 = [r for r in g if r["K"] == 1 and r.get("lib_ns_call")]
    if k1:
        print("\n  K=1 ns/call: library vs np.take")
        for r in k1:
            key = (r["size"], r["R"], 1, 1)
            if key in n:
                print("    %-5s %-12s R=%-5d lib %8.1f ns, np.take %8.1f ns"
                      % (r["size_label"], r["variant"], r["R"], r["lib_ns_call"],
                         n[key]["ns_call"]))
    # Target: 8 GiB huge-page table, K=4096, R=264, 2 threads: >= 3.0x numpy.
    big = max((r["size"] for r in g), default=0)
    tgt = [r for r in g if r["size"] == big and r["variant"] == "private-huge" and r["R"] == 264
           and r["K"] == 4096 and r["threads"] == 2]
    print()
    if not tgt or (big, 264, 4096, 1) not in n:
        print("[1b] lib/numpy at %s private-huge R=264 K=4096 threads=2: not measured in this run"
              % size_label(big))
        return
    r = tgt[0]
    np1 = n[(big, 264, 4096, 1)]["rows_s"]
    ratio = r["lib_rows_s"] / np1
    print("[1b] %s private-huge R=264 K=4096 threads=2: lib %.2f M rows/s, numpy take (1 thread)"
          " %.2f M rows/s -> %.2fx (target >= 3.0x): %s%s"
          % (r["size_label"], r["lib_rows_s"] / 1e6, np1 / 1e6, ratio,
             "MET" if ratio >= 3.0 else "MISSED",
             "" if big == 8 * GIB else " [table is not the 8 GiB of the target]"))
    if (big, 264, 4096, 2) in n:
        np2 = n[(big, 264, 4096, 2)]["rows_s"]
        print("     (numpy on 2 threads: %.2f M rows/s -> lib/numpy2 %.2fx)"
              % (np2 / 1e6, r["lib_rows_s"] / np2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes")
    ap.add_argument("--rows", default="64,264,1024")
    ap.add_argument("--k", default="1,64,4096,262144")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=0)
    ap.add_argument("--min-time", type=float, default=0.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--combine", nargs=2, metavar=("GATHER_JSONL", "NUMPY_JSONL"))
    args, unknown = ap.parse_known_args()
    # Only bench_gather's own options may be passed through.
    i = 0
    while i < len(unknown):
        if unknown[i] != "--variants":
            ap.error("unknown argument %r" % unknown[i])
        i += 2
    if args.combine:
        combine(*args.combine)
    else:
        run(args)


if __name__ == "__main__":
    main()
