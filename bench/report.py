#!/usr/bin/env python3
"""Turns the output of bench/run.sh into the markdown tables of
docs/performance.md: one row per (size, variant, R, threads, K) with the
library, naive, ceiling and numpy rates and their ratios.

    bench/run.sh > run.txt; bench/report.py run.txt
"""
import re
import sys


def main(path):
    points = {}  # (size, variant, R, thr, K) -> dict
    size = variant = rb = None
    for line in open(path, encoding="utf-8"):
        # " -- 8G private-huge R=264: ..." and " -- 8G shm R=264 threads=2: ..."
        # name the memory of the rows that follow; " -- 8G R=264: ..." (the
        # shm file being written) names none.
        m = re.match(r"^ -- (\S+) (?:(\S+) )?R=(\d+)[: ]", line)
        if m:
            size, variant, rb = m.group(1), m.group(2), int(m.group(3))
            continue
        m = re.match(r"^\s+([12])\s+(\d+)\s+([\d.]+)\s+([\d.]+|-)\s+([\d.]+|-)\s", line)
        if m and size and variant and rb:
            thr, k = int(m.group(1)), int(m.group(2))
            p = points.setdefault((size, variant, rb, thr, k), {})
            p["lib"] = float(m.group(3))
            p["naive"] = None if m.group(4) == "-" else float(m.group(4))
            p["ceil"] = None if m.group(5) == "-" else float(m.group(5))
            continue
        m = re.match(r"^\s+(\S+)\s+(private-huge|private-4k|shm|shm-phuge)\s+(\d+)\s+(\d+)\s+([12])"
                     r"\s+([\d.]+)\s+([\d.]+)\s+[\d.]+x\s+([\d.]+)", line)
        if m:
            key = (m.group(1), m.group(2), int(m.group(3)), int(m.group(5)), int(m.group(4)))
            points.setdefault(key, {})["np1"] = float(m.group(7))
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.2f}x"
    for sz in ("256M", "8G"):
        rows = sorted(k for k in points if k[0] == sz)
        if not rows:
            continue
        print(f"#### {sz} table\n")
        print("| variant | R | thr | K | lib | naive | ceiling | numpy take (1 thr) "
              "| lib/naive | lib/ceiling | lib/numpy |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        order = {"private-huge": 0, "private-4k": 1, "shm": 2, "shm-phuge": 3}
        for key in sorted(rows, key=lambda k: (order[k[1]], k[2], k[3], k[4])):
            p = points[key]
            if "lib" not in p:
                continue
            print(f"| {key[1]} | {key[2]} | {key[3]} | {key[4]} | {fmt(p['lib'])} "
                  f"| {fmt(p.get('naive'))} | {fmt(p.get('ceil'))} | {fmt(p.get('np1'))} "
                  f"| {ratio(p['lib'], p.get('naive'))} | {ratio(p['lib'], p.get('ceil'))} "
                  f"| {ratio(p['lib'], p.get('np1'))} |")
        print()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench/report.py RUN_OUTPUT")
    main(sys.argv[1])
